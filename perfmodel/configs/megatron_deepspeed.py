"""Megatron-DeepSpeed: a pretrain_gpt.py argument list with --deepspeed (bigscience-workshop/
Megatron-DeepSpeed at 8387ae17, microsoft/Megatron-DeepSpeed at f4157bea; DeepSpeed v0.6.5,
8164ea9e), read on top of Megatron-LM's options (perfmodel.configs.megatron).

What --deepspeed changes, from their code:
  - the model is GPTModelPipe, run by DeepSpeed's pipeline engine (bigscience always; microsoft
    unless --no-pipeline-parallel): its TrainSchedule is one-forward-one-backward (1f1b), no
    interleaving; with tp > 1 each stage sends its 1/tp slice and the receiver all-gathers it over
    tp (PipelineEngine is_pipe_partitioned / is_grad_partitioned: pp_scatter_gather), unless
    the config's pipeline.pipe_partitioned is false;
  - the stages are DeepSpeed's partition of GPTModelPipe's layer list (PipelineModule.
    _partition_layers, --pp-partition-method, default type:transformer): a balanced split of the
    layers whose class matches the regex (type:), or of every entry (uniform);
  - ZeRO is the DeepSpeed config's zero_optimization.stage (--deepspeed_config; else
    --zero-stage): the pipeline engine refuses stages 2 and 3; bf16 at stage 0 runs
    BF16_Optimizer, its own stage-1 equivalent (fp32 master weights and Adam states sharded over
    dp; each micro-batch's bf16 gradients added into whole fp32 ones, all-reduced in fp32:
    Plan.bf16_optimizer); the
    engine reduces the gradients after the last micro-batch (no overlap); without it
    (--no-pipeline-parallel) the config's overlap_comm (default: at stage 3) decides;
  - activations are recomputed as --checkpoint-activations says (DeepSpeed's checkpointing with
    --deepspeed-activation-checkpointing: the same layers); the attention is unfused unless
    --use-flash-attn (microsoft's fork: or -v1, -v2, -triton, -builder), ALiBi with
    --position-embedding-type alibi;
  - --pad-vocab-size-to gives the padded vocabulary itself;
  - microsoft's fork: --num-key-value-heads (grouped-query attention), --normalization layernorm
    or rmsnorm, --ds-sequence-parallel-size (DeepSpeed-Ulysses: cp with all-to-alls, _ulysses);
    its --num-experts (a list) above 1 is DeepSpeed's MoE layer, refused (experts).
Not modelled, said so: --embed-layernorm (one LayerNorm on the embedding, 2 h parameters),
--sync-tp-duplicated-parameters (small all-reduces over tp each forward); refused:
--partition-activations, --checkpoint-in-cpu, ZeRO 2 and 3 with the pipeline engine,
CPU offload in the DeepSpeed config.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from perfmodel.configs.job import JobConfig, fix_split, refuse_plan
from perfmodel.errors import SpecError

Settings = dict[str, tuple[str, Any]]

# the options --deepspeed brings: name -> number of values (0: a flag)
OPTIONS: dict[str, int] = {
    **dict.fromkeys(("deepspeed", "deepspeed-activation-checkpointing", "partition-activations",
                     "contigious-checkpointing", "checkpoint-in-cpu", "synchronize-each-layer",
                     "profile-backward", "no-pipeline-parallel", "embed-layernorm",
                     "sync-tp-duplicated-parameters", "use-flash-attn-v2", "use-flash-attn-v1",
                     "use-flash-attn-triton", "use-flash-attn-builder",
                     "force-ds-sequence-parallel", "ds-sequence-parallel-fpdt",
                     "ds-sequence-parallel-fpdt-offloading"), 0),
    **dict.fromkeys(("deepspeed_config", "zero-stage", "pp-partition-method",
                     "pad-vocab-size-to", "ds-sequence-parallel-size",
                     "ds-sequence-parallel-fpdt-chunk-size"), 1),
}
# its FlashAttention switches (microsoft/Megatron-DeepSpeed megatron/arguments.py at f4157bea:
# use_flash_attn = v1 (--use-flash-attn) or triton or v2 or builder)
FLASH = ("use_flash_attn", "use_flash_attn_v1", "use_flash_attn_v2", "use_flash_attn_triton",
         "use_flash_attn_builder")
# its mixture-of-experts options (microsoft/Megatron-DeepSpeed megatron/arguments.py at f4157bea)
MOE_OPTIONS: dict[str, int] = {
    **dict.fromkeys(("topk", "expert-interval", "moe-expert-parallel-size", "mlp-type",
                     "moe-train-capacity-factor", "moe-eval-capacity-factor", "moe-min-capacity",
                     "moe-loss-coeff", "num-experts-switch"), 1),
    **dict.fromkeys(("disable-moe-token-dropping", "create-moe-param-group",
                     "enable-expert-tensor-parallelism", "disable-moe-top2-2nd-expert-sampling",
                     "use-tutel"), 0),
}
IGNORED = ("abort-on-unmet-fused-kernel-constraints", "kill-switch-path", "codecarbon-dir",
           "tokenizer-name-or-path", "train-weighted-split-paths-path",
           "valid-weighted-split-paths-path", "valid-num-workers",
           "tensorboard-queue-size", "deepspeed_mpi")


def experts(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
            flag: Callable[[Settings, str, str], bool]) -> bool:
    """Megatron-DeepSpeed's --num-experts (one number, or one per MoE layer), where the arguments
    are its (--deepspeed, or one of its MoE options): True when read here. One expert everywhere
    is its dense MLP (its default, [1]); more is DeepSpeed's MoE layer, refused: every
    --expert-interval-th layer (default 2) routes its tokens top --topk (default 1) into
    capacity-sized slots, dispatched and combined by dense einsums over the experts x capacity
    slots (megatron/model/transformer.py: get_num_experts_per_layer and deepspeed.moe.layer.MoE;
    deepspeed/moe/sharded_moe.py, einsum("sec,sm->ecm")), GEMMs as large as the experts' own
    that perfmodel's MoE layer (Megatron-Core's permutation and grouped GEMMs) does not cost."""
    own = [d for d in (o.replace("-", "_") for o in MOE_OPTIONS) if d in settings]
    if not own and not flag(settings, "deepspeed", where):
        return False
    key, value = settings.get("num_experts", ("--num-experts", ["1"]))
    counts = value if isinstance(value, list) else [value]
    try:
        numbers = [int(str(c)) for c in counts]
    except ValueError:
        raise SpecError(f"{where}: {key} {' '.join(map(str, counts))}: whole numbers of experts "
                        "(Megatron-DeepSpeed: one, or one per MoE layer)") from None
    if any(n > 1 for n in numbers):
        raise refuse_plan(where, key, " ".join(map(str, counts)),
                          "Megatron-DeepSpeed's mixture of experts (DeepSpeed's MoE layer on "
                          "every --expert-interval-th layer, top --topk gating into capacity-sized "
                          "slots, its dispatch and combine dense einsums over experts x capacity) "
                          "is not modelled: perfmodel's MoE layer is Megatron-Core's")
    switch = settings.get("num_experts_switch", ("", None))
    if switch[1] not in (None, "None"):
        raise refuse_plan(where, switch[0], switch[1], "Megatron-DeepSpeed's SwitchMLP (its "
                          "Megatron-LM mixture of experts, every token to one expert computed "
                          "by a loop over the experts) is not modelled")
    take("num_experts", "no experts (Megatron-DeepSpeed's default, one: the dense MLP)")
    for dest in own:
        take(dest, "no effect without experts (--num-experts 1)")
    return True


def partition_balanced(weights: list[int], parts: int) -> list[int]:
    """DeepSpeed's deepspeed/runtime/utils.py partition_balanced (v0.6.5), ported as it is (no
    library offers it; DeepSpeed is not a dependency): the boundaries of `parts` contiguous
    parts of the items, the heaviest part as light as a bisection on its weight finds."""
    items = len(weights)
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    sums = list(accumulate(weights))

    def probe(bottleneck: float) -> tuple[list[int], bool]:
        out = [0] + [items] * parts
        target, chunk = bottleneck, items // parts
        step = chunk
        for p in range(1, parts):
            while step < items and sums[step] < target:
                step += chunk
            out[p] = bisect_left(sums, target, lo=step - chunk, hi=min(step, items))
            if out[p] == items:
                return out, sums[-1] - sums[out[p - 1]] < bottleneck
            target = sums[out[p] - 1] + bottleneck
        return out, target >= sums[-1]

    eps, lower, upper = 1e-3, sums[-1] / parts, float(sums[-1])
    while upper > lower + eps:
        mid = lower + (upper - lower) / 2
        if probe(mid)[1]:
            upper = mid
        else:
            lower = mid + eps
    bounds, ok = probe(upper)
    assert ok
    return bounds


def partition_uniform(items: int, parts: int) -> list[int]:
    """DeepSpeed's partition_uniform (v0.6.5): items // parts each, the last part the rest."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    chunk = items // parts
    return [min(chunk * p, items) for p in range(parts)] + [items]


def pipe_layers(layers: int, half: bool) -> list[str]:
    """GPTModelPipe's layer list (bigscience megatron/model/gpt_model.py): the cast to 16 bits,
    the embedding, a transpose, the layers, its undo, the final LayerNorm (MixedFusedLayerNorm),
    the tied embedding computing the logits, and (fp16/bf16) the cast back to fp32."""
    return (["_to_float16", "EmbeddingPipe", "<lambda>"] + ["ParallelTransformerLayerPipe"]
            * layers + ["undo", "MixedFusedLayerNorm", "EmbeddingPipe"]
            + (["float16_to_fp32"] if half else []))


def stage_split(method: str, layers: int, stages: int, half: bool, where: str,
                key: str) -> list[int]:
    """The transformer layers of each stage under DeepSpeed's partition method; refused where
    the embedding is not on the first stage or the logits not on the last."""
    names = pipe_layers(layers, half)
    lowered = method.lower()
    if lowered == "uniform":
        bounds = partition_uniform(len(names), stages)
    elif lowered.startswith("type:"):
        pattern = re.compile(method.split(":", 1)[1], re.IGNORECASE)
        weights = [1 if pattern.search(n) else 0 for n in names]
        if not any(weights):
            raise refuse_plan(where, key, method, "matches no layer of GPTModelPipe (DeepSpeed "
                              "refuses it)")
        bounds = partition_balanced(weights, stages)
    else:
        raise refuse_plan(where, key, method, "perfmodel models DeepSpeed's uniform and type: "
                          "partitions (parameters balances by parameter counts: not modelled)")
    ends = (names.index("EmbeddingPipe"), len(names) - 1 - names[::-1].index("EmbeddingPipe"))
    if not bounds[0] <= ends[0] < bounds[1] or not bounds[-2] <= ends[1] < bounds[-1]:
        raise refuse_plan(where, key, method, "puts the embedding off the first stage or the "
                          "logits off the last: not modelled")
    return [sum(n == "ParallelTransformerLayerPipe" for n in names[a:b])
            for a, b in zip(bounds, bounds[1:], strict=False)]


def _ds_config(settings: Settings, where: str, job: JobConfig) -> dict[str, Any] | None:
    """The DeepSpeed config --deepspeed_config names, where perfmodel can read it (beside the
    job's file, or as given), else None (said in a note)."""
    if "deepspeed_config" not in settings:
        return None
    name = str(settings["deepspeed_config"][1])
    for path in (Path(where).parent / name, Path(name)):
        try:
            found = "@@" not in name and path.is_file()
        except OSError:  # a name the file system refuses (too long): no file of that name
            found = False
        if found:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise SpecError(f"{where}: --deepspeed_config {name}: not a JSON file ({exc})"
                                ) from None
            if not isinstance(data, dict):
                raise SpecError(f"{where}: --deepspeed_config {name}: not a JSON object")
            return data
    job.notes.append(f"--deepspeed_config {name}: not readable here (written by the script at "
                     "run time?); the ZeRO stage is --zero-stage's and the precision the "
                     "arguments'")
    return None


def apply(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
          flag: Callable[[Settings, str, str], bool]) -> None:
    """The plan fields --deepspeed decides (module doc), over what the Megatron-LM options set."""
    if not flag(settings, "deepspeed", where):
        for dest in ("zero_stage", "deepspeed_config", "pp_partition_method",
                     "no_pipeline_parallel", "deepspeed_activation_checkpointing",
                     "ds_sequence_parallel_size"):
            if dest in settings:
                raise refuse_plan(where, settings[dest][0], settings[dest][1],
                                  "a Megatron-DeepSpeed option without --deepspeed")
        return
    take("deepspeed", "Megatron-DeepSpeed: DeepSpeed's engine")
    for dest, why in (("partition_activations", "the checkpointed inputs split over tp are not "
                                                "modelled"),
                      ("checkpoint_in_cpu", "checkpointed inputs on the host are not modelled")):
        if flag(settings, dest, where):
            raise refuse_plan(where, settings[dest][0], True, why)
    config = _ds_config(settings, where, job)
    pipe = not flag(settings, "no_pipeline_parallel", where)
    take("no_pipeline_parallel", "Megatron's GPTModel, no pipeline engine")
    pp, tp = job.plan.get("pp", 1), job.plan.get("tp", 1)
    if not pipe and pp > 1:
        raise refuse_plan(where, "--no-pipeline-parallel", True, f"with pp {pp}: Megatron-"
                          "DeepSpeed pipelines only through DeepSpeed's engine")
    _zero(settings, job, where, take, config, pipe)
    _precision(job, where, config)
    _ulysses(settings, job, where, take, flag)
    chunks = job.plan.get("virtual_stages", 1)
    if pipe and chunks > 1:
        raise refuse_plan(where, "--num-layers-per-virtual-pipeline-stage", chunks,
                          "DeepSpeed's pipeline engine does not interleave stages")
    if pipe:
        job.fix("schedule", "1f1b")
        partitioned = ((config or {}).get("pipeline") or {}).get("pipe_partitioned", True)
        sp = job.plan.get("sequence_parallel", False)
        if sp:
            raise refuse_plan(where, "--sequence-parallel", True, "with DeepSpeed's pipeline "
                              "engine not modelled")
        job.fix("pp_scatter_gather", bool(pp > 1 and tp > 1 and partitioned))
        take("no_scatter_gather_tensors_in_pipeline", "no effect: DeepSpeed's engine partitions "
                                                      "its sends itself")
        if pp > 1:
            job.notes.append("--deepspeed: DeepSpeed's pipeline engine, one forward one backward "
                             "(1f1b)" + (", its sends partitioned over tp and all-gathered: "
                                         "pp_scatter_gather" if job.plan["pp_scatter_gather"]
                                         else ""))
            _split(settings, job, where, take, pp)
    # the pipeline engine reduces after the last micro-batch; without it DeepSpeed's ZeRO
    # overlaps as its config says (overlap_comm: true at stage 3, false below; stage 3
    # prefetches the next parameters), as perfmodel.configs.deepspeed reads it
    zero_config = (config or {}).get("zero_optimization") or {}
    stage = job.plan.get("zero", 0)
    overlap = bool(zero_config.get("overlap_comm", stage == 3)) and not pipe
    job.fix("overlap_grad_sync", overlap)
    job.fix("overlap_param_gather", not pipe and stage == 3)
    flash = any(flag(settings, dest, where) for dest in FLASH)
    job.fix("flash_attention", flash)
    take("use_flash_attn_v2", "flash_attention (FlashAttention-2: --attention-kernel fa2 costs "
         "it where the hardware measures it, dgx-h100)")
    take("use_flash_attn_triton", "flash_attention (flash-attn's kernel in Triton: "
         "--attention-kernel triton costs it where the hardware measures it, the A100s)")
    for dest in ("use_flash_attn_v1", "use_flash_attn_builder"):
        take(dest, "flash_attention (costed with the hardware's flash kernel)")
    take("use_flash_attn", "flash_attention")
    if not flash:
        job.notes.append("--deepspeed: Megatron-DeepSpeed's attention is unfused (its fused "
                         "softmax) unless --use-flash-attn: flash_attention false")
    take("deepspeed_activation_checkpointing",
         "DeepSpeed's checkpointing of the layers --checkpoint-activations names"
         if job.plan.get("recompute") == "full" else
         "no effect without --checkpoint-activations (GPTModelPipe checkpoints nothing)")
    for dest in ("contigious_checkpointing", "synchronize_each_layer", "profile_backward"):
        take(dest, "how checkpoints are kept or timed (the same recompute)")
    take("embed_layernorm", "a LayerNorm on the embedding's output: its 2 h parameters and its "
                            "one norm a micro-batch are not modelled")
    take("sync_tp_duplicated_parameters", "its small all-reduces over tp (the norms' and "
                                          "biases' values, each forward) are not modelled")


def _ulysses(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
             flag: Callable[[Settings, str, str], bool]) -> None:
    """DeepSpeed-Ulysses (--ds-sequence-parallel-size N): each of N consecutive ranks holds 1/N
    of the sequence, and the attention all-to-alls its queries, keys and values to whole
    sequences of heads / N and back (DistributedAttention; megatron/model/transformer.py,
    megatron/core/parallel_state.py at f4157bea): context parallelism cp N by all-to-all
    (cp_comm a2a), the gradients reduced over dp x N. Megatron-DeepSpeed runs it with tp and pp
    1 and without Megatron's --sequence-parallel (parallel_state.py, initialize.py); FPDT (its
    chunked attention, offloading chunks to the host) is not modelled."""
    size = settings.get("ds_sequence_parallel_size")
    try:
        ranks = int(str(size[1])) if size else 1
    except ValueError:
        raise SpecError(f"{where}: --ds-sequence-parallel-size {size[1] if size else ''}: a "
                        "whole number of ranks") from None
    for dest in ("ds_sequence_parallel_fpdt", "ds_sequence_parallel_fpdt_offloading"):
        if flag(settings, dest, where):
            raise refuse_plan(where, settings[dest][0], True, "DeepSpeed's FPDT (the attention "
                              "in chunks, kept on the host) is not modelled")
    take("ds_sequence_parallel_fpdt_chunk_size", "no effect without --ds-sequence-parallel-fpdt")
    take("force_ds_sequence_parallel", "its all-to-alls over one rank: no effect"
         if ranks <= 1 else "no effect beside --ds-sequence-parallel-size")
    if ranks < 1:
        raise SpecError(f"{where}: --ds-sequence-parallel-size {ranks}: a whole number >= 1")
    take("ds_sequence_parallel_size", f"cp {ranks} (DeepSpeed-Ulysses: cp_comm a2a)"
         if ranks > 1 else "1: no sequence parallelism")
    if ranks == 1:
        return
    for key, name in (("tp", "--tensor-model-parallel-size"),
                      ("pp", "--pipeline-model-parallel-size")):
        if job.plan.get(key, 1) > 1:
            raise refuse_plan(where, "--ds-sequence-parallel-size", ranks,
                              f"with {key} {job.plan[key]}: Megatron-DeepSpeed runs "
                              f"DeepSpeed-Ulysses with {name} 1 (megatron/core/parallel_state.py)")
    if flag(settings, "sequence_parallel", where):
        raise SpecError(f"{where}: --ds-sequence-parallel-size {ranks} and --sequence-parallel: "
                        "Megatron-DeepSpeed refuses them together (initialize.py)")
    if job.plan.get("cp", 1) > 1:
        raise SpecError(f"{where}: --ds-sequence-parallel-size {ranks} and "
                        f"--context-parallel-size {job.plan['cp']}: give one")
    job.fix("cp", ranks)
    job.fix("cp_comm", "a2a")
    job.notes.append(f"--ds-sequence-parallel-size {ranks}: DeepSpeed-Ulysses, the sequence "
                     f"split over {ranks} ranks and all-to-alled to heads for the attention: cp "
                     f"{ranks}, cp_comm a2a")


def _zero(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
          config: dict[str, Any] | None, pipe: bool) -> None:
    zero_config = (config or {}).get("zero_optimization") or {}
    if zero_config.get("offload_optimizer") or zero_config.get("offload_param") or \
            zero_config.get("cpu_offload"):
        raise refuse_plan(where, "--deepspeed_config zero_optimization offload", True,
                          "offloading to the host is not modelled")
    given = settings.get("zero_stage")
    try:
        argument = int(float(given[1])) if given else 1  # --zero-stage: default 1.0
    except (ValueError, OverflowError):  # a word, NaN, or an infinity (1e400)
        raise SpecError(f"{where}: --zero-stage {given[1] if given else ''}: a stage 0-3"
                        ) from None
    stage = zero_config.get("stage", argument if config is None else 0)
    if config is not None and given and stage != argument:
        job.notes.append(f"--zero-stage {argument} and the DeepSpeed config's stage {stage}: "
                         "DeepSpeed runs the config's")
    if stage not in (0, 1, 2, 3):
        raise refuse_plan(where, "zero_optimization.stage", stage, "ZeRO's stages are 0-3")
    if pipe and stage >= 2:
        raise refuse_plan(where, "zero_optimization.stage", stage, "DeepSpeed's pipeline engine "
                          "refuses ZeRO stages 2 and 3")
    dtype = job.plan.get("dtype")
    zero = 1 if (stage == 0 and dtype == "bf16") else stage  # either engine's BF16_Optimizer
    job.fix("zero", zero)
    if zero == 1 and stage == 0:
        job.fix("bf16_optimizer", True)
        job.fix("overlap_grad_sync", False)  # reduced after the backward, with either engine
        job.fix("overlap_param_gather", False)
        job.notes.append("ZeRO stage 0 with bf16: DeepSpeed's BF16_Optimizer, its own stage 1 "
                         "(fp32 master weights and Adam states sharded over dp): zero 1 with "
                         "bf16_optimizer (each micro-batch's bf16 gradients added into fp32 "
                         "ones, all-reduced in fp32)")
    take("zero_stage", f"zero {zero}" + (" (the DeepSpeed config's stage rules)"
                                         if config is not None else ""))
    take("deepspeed_config", f"read: zero_optimization.stage {stage}" if config is not None
         else "not readable here")


def _precision(job: JobConfig, where: str, config: dict[str, Any] | None) -> None:
    if config is None:
        return
    for key, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        section = config.get(key) or {}
        enabled = bool(section.get("enabled")) if isinstance(section, dict) else False
        if enabled != (job.plan.get("dtype") == dtype):
            raise SpecError(f"{where}: the DeepSpeed config's {key}.enabled {enabled} disagrees "
                            f"with the arguments' dtype {job.plan.get('dtype')}")


def _split(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
           pp: int) -> None:
    key = settings["pp_partition_method"][0] if "pp_partition_method" in settings else \
        "--pp-partition-method"
    method = str(settings.get("pp_partition_method", ("", "type:transformer"))[1]).strip("'\"")
    half = job.plan.get("dtype") in ("bf16", "fp16")

    def place(layers: int) -> None:
        split = stage_split(method, layers, pp, half, where, key)
        if 0 in split:
            raise refuse_plan(where, key, method, f"leaves a stage without layers: {split}")
        fix_split(job, split, 1)
        job.notes.append(f"DeepSpeed's partition {method} over {pp} stages: "
                         f"{'/'.join(map(str, split))} layers")

    take("pp_partition_method", f"DeepSpeed's partition of the layers ({method})")
    layers = job.model.get("layers")
    if layers is None and job.preset is not None:
        from perfmodel.specs.model import load_model

        layers = load_model(job.preset).layers
    if layers is None:
        job.with_model.append(lambda model: place(model.layers))
    else:
        place(layers)
