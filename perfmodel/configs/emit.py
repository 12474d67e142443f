"""A plan written as a framework's config, to launch: `recommend --emit-config FORMAT DIR`.

megatron: megatron_args.txt (pretrain_gpt.py's arguments, one option a line) and launch.sh
(torchrun on every node); torchtitan: job.toml; deepspeed: ds_config.json and launch.sh (the
deepspeed launcher running the Hugging Face Trainer's run_clm.py with the model-side arguments).
Every file is written atomically (perfmodel.files.write_atomic); DIR is created if missing. Each
file starts with what perfmodel assumed: the plan, its predicted step, and the options it chose.
A plan the framework cannot run, or with an option its config cannot carry so that predict
--from-config reads the plan back, is refused in one line naming the field (PlanError, exit 4).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from perfmodel.configs.job import allocator_export, refuse_emit
from perfmodel.errors import OutputError, PlanError
from perfmodel.files import check_distinct, check_output


class EmitFormat(StrEnum):
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"


def header(model: Any, hardware: Any, plan: Any, step_time_s: float) -> list[str]:
    """The lines every emitted file starts with: what it is and what perfmodel assumed."""
    flash = {True: "flash (fused) attention", False: "unfused attention",
             None: "attention as the hardware allows"}[plan.flash_attention]
    hidden = [what for what, on in (
        ("the gradient reduction behind the backward", plan.overlap_grad_sync),
        ("the parameter gather behind the forward", plan.overlap_param_gather),
        ("tensor-parallel communication behind the GEMMs", plan.tp_comm_overlap)) if on]
    overlap = "overlapped: " + ", ".join(hidden) if hidden else "no communication overlapped"
    stack = plan.stack.value
    overlap += f", {'an' if stack[0] in 'aeiou' else 'a'} {stack} stack"
    return [f"Written by perfmodel recommend: {model.name} on {plan.gpus} x {hardware.name}, "
            f"predicted step {step_time_s:.6g} s.",
            f"Plan: dp {plan.dp}, tp {plan.tp}, pp {plan.pp}"
            + "".join(f", {name} {degree}" for name, degree in (
                ("cp", plan.cp), ("ep", plan.ep), ("etp", plan.etp)) if degree > 1)
            + f", micro-batch {plan.micro_batch}, "
            f"global batch {plan.global_batch}, schedule {plan.schedule.value}, virtual stages "
            f"{plan.virtual_stages}, sequence parallel {str(plan.sequence_parallel).lower()}, "
            f"ZeRO {plan.zero}, {plan.dtype.value}.",
            f"Assumed: recompute {plan.recompute.value}, {flash}, {overlap}, ranks ordered "
            f"{','.join(plan.placement)} from the innermost."]


def emit_best(fmt: str, directory: str | Path, model: Any, hardware: Any,
              ranked: list[Any]) -> tuple[int, list[Path]]:
    """Write the best of the ranked predictions that `fmt` can run; (its rank from 1, the paths).
    PlanError with the best plan's reason when none can be written."""
    reasons: list[str] = []
    for rank, prediction in enumerate(ranked, 1):
        try:
            return rank, emit(fmt, directory, model, hardware, prediction.plan,
                              prediction.step_time_s)
        except PlanError as exc:
            reasons.append(str(exc))
    others = len(reasons) - 1
    if not others:
        raise PlanError(reasons[0])
    if len(set(reasons)) == 1:  # the model's, not a plan's: no other plan would do
        raise PlanError(f"{reasons[0]} (and so is each of the {others} runner"
                        f"{'s' if others > 1 else ''}-up)")
    raise PlanError(f"{reasons[0]} (nor can the {others} runner{'s' if others > 1 else ''}-up: "
                    "pin what the framework runs, or raise --top)")


# the files each format writes into the directory, and what each is
EMITTED = {"megatron": (("megatron_args.txt", "Megatron-LM arguments"),
                        ("launch.sh", "Megatron-LM launch script")),
           "torchtitan": (("job.toml", "torchtitan job config"),
                          ("launch.sh", "torchtitan launch script")),
           "deepspeed": (("ds_config.json", "DeepSpeed config"),
                         ("launch.sh", "DeepSpeed launch script"))}


def check_emitted(fmt: str, directory: str | Path,
                  inputs: Sequence[tuple[str | None, str]] = ()) -> None:
    """Refuse now (OutputError) any file `fmt` would write into directory that its write would
    refuse (a directory, a FIFO, a device in its place), or that is one of the command's inputs:
    checked together, before any is written, so that a refusal leaves no half-written job (new
    arguments beside an old launch script)."""
    out = Path(directory)
    if not str(directory).strip():
        raise OutputError(f"--emit-config {fmt}: the directory name is empty (give a directory; "
                          "'.' for the current one)")
    targets = [(out / name, what) for name, what in EMITTED[fmt]]
    for path, what in targets:
        check_output(path, what=what, make_parents=True)
    check_distinct(targets, inputs)


def emit(fmt: str, directory: str | Path, model: Any, hardware: Any, plan: Any,
         step_time_s: float) -> list[Path]:
    """Write the plan as `fmt`'s config into directory (which must exist); the paths written."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--emit-config: {out} is not a directory")
    lines = header(model, hardware, plan, step_time_s)
    fmt = EmitFormat(fmt)
    check_emitted(fmt.value, out)
    if plan.pp_scatter_gather:
        raise refuse_emit(fmt.value, "pp_scatter_gather", "Megatron-LM's 2021 scatter-gather "
                          "of pipeline sends is in none of today's frameworks")
    if plan.bf16_optimizer and fmt is not EmitFormat.DEEPSPEED:
        raise refuse_emit(fmt.value, "bf16_optimizer", "DeepSpeed's BF16_Optimizer runs under "
                          "DeepSpeed only (emit deepspeed, or leave bf16_optimizer off)")
    if not plan.grad_accumulation_fusion and fmt is not EmitFormat.MEGATRON:
        raise refuse_emit(fmt.value, "grad_accumulation_fusion false", "the weight gradients "
                          "added into Megatron-Core's main gradients apart are Megatron-LM's "
                          "(emit megatron, or leave grad_accumulation_fusion at true)")
    # losses no format written here runs: Megatron-Core's vocab-parallel loss and torchtitan's
    # F.cross_entropy(pred.float()) both upcast, and neither is flash-attn's kernel
    why = {"no-upcast": "its loss upcasts the logits to fp32 (NeMo AutoModel's "
                        "MaskedCrossEntropy fp32_upcast false does not)",
           "flash-attn": "its loss is not flash-attn's fused cross entropy (llm-foundry's is)"}
    if plan.cross_entropy.value in why:
        raise refuse_emit(fmt.value, f"cross_entropy {plan.cross_entropy.value}",
                          why[plan.cross_entropy.value])
    if plan.cross_entropy.value == "torch" and fmt is EmitFormat.MEGATRON:
        raise refuse_emit(fmt.value, "cross_entropy torch", "Megatron-Core's loss is its own "
                          "vocabulary-parallel cross entropy, not PyTorch's (give unfused)")
    refuse_unwritten(fmt, plan, hardware)
    if fmt is EmitFormat.MEGATRON:
        from perfmodel.configs.megatron import write_megatron

        refuse_megatron(plan)
        return write_megatron(out, model, plan, hardware, lines)
    from perfmodel.files import write_atomic

    if plan.cross_entropy.value in ("te", "native"):  # torchtitan's and HF Trainer's loss
        # is PyTorch's
        kernel = plan.cross_entropy.value
        what = "Transformer Engine's fused cross entropy" if kernel == "te" else \
            "the native fused cross entropy"
        raise refuse_emit(fmt.value, f"cross_entropy {kernel}",
                          f"{what} is a loss Megatron-Core runs (--cross-entropy-fusion-impl "
                          f"{kernel}), not {fmt.value}, whose loss is PyTorch's")
    if fmt is EmitFormat.TORCHTITAN:
        from perfmodel.configs.torchtitan import torchtitan_toml

        mesh = torchtitan_mesh(plan)
        if plan.tp_layout.value != "1d":
            raise refuse_emit("torchtitan", f"tp_layout {plan.tp_layout.value}",
                              "torchtitan's tensor parallelism is 1d")
        if ",".join(plan.placement) != mesh:
            raise refuse_emit("torchtitan", f"placement {','.join(plan.placement)}",
                              f"torchtitan's mesh orders the ranks {mesh} from the innermost "
                              f"(pin --placement {mesh})")
        lines += read_back(fmt, plan)
        text = "".join(f"# {line}\n" for line in lines) + torchtitan_extras(
            torchtitan_toml(model, plan), plan)
        if plan.gpus % min(hardware.host_gpus, plan.gpus):
            raise refuse_emit("torchtitan", f"gpus {plan.gpus}", "not whole hosts")
        path = write_atomic(out / "job.toml", text, what="torchtitan job config", make_parents=True)
        per_node = min(hardware.host_gpus, plan.gpus)
        script = ("#!/bin/bash\n" + "".join(f"# {line}\n" for line in lines) +
                  "set -euo pipefail\n" + allocator_export(plan) +
                  f"torchrun --nnodes {plan.gpus // per_node} --nproc-per-node {per_node} "
                  "--rdzv-backend c10d --rdzv-endpoint \"${MASTER_ADDR:-localhost}:29500\" \\\n"
                  "    -m torchtitan.train --job.config_file job.toml\n")
        return [path, write_atomic(out / "launch.sh", script, what="torchtitan launch script",
                                         make_parents=True)]
    from perfmodel.configs.deepspeed import ds_config

    config = ds_config(plan)
    refuse_deepspeed(model, plan)
    lines += read_back(fmt, plan)
    per_node = min(hardware.host_gpus, plan.gpus)
    if plan.gpus % per_node:
        raise refuse_emit("deepspeed", f"gpus {plan.gpus}", "not whole hosts")
    path = write_atomic(out / "ds_config.json", json.dumps(config, indent=2) + "\n",
                        what="DeepSpeed config", make_parents=True)
    origin = (model.origin or "").split(" (")[0]
    source = str(Path(origin).parent) if "Hugging Face" in (model.origin or "") else "MODEL_DIR"
    args = ["--deepspeed", "ds_config.json", "--model_name_or_path", source,
            "--per_device_train_batch_size", str(plan.micro_batch),
            "--gradient_accumulation_steps", str(plan.num_micro_batches),
            "--block_size", str(model.seq_len), "--do_train", "--output_dir", "out"]
    if plan.dtype.value in ("bf16", "fp16"):
        args.append(f"--{plan.dtype.value}")
    if plan.recompute.value == "full":
        args.append("--gradient_checkpointing")
    script = ("#!/bin/bash\n" + "".join(f"# {line}\n" for line in lines) +
              "# run_clm.py: transformers' examples/pytorch/language-modeling (give your data "
              f"with --dataset_name or --train_file); MODEL_DIR: a Hugging Face directory of "
              f"{model.name}\nset -euo pipefail\n" + allocator_export(plan) +
              f"deepspeed --num_nodes {plan.gpus // per_node} --num_gpus {per_node} run_clm.py "
              + " ".join(shlex.quote(a) for a in args) + "\n")
    return [path, write_atomic(out / "launch.sh", script, what="DeepSpeed launch script",
                                   make_parents=True)]


FRAMEWORKS = {EmitFormat.MEGATRON: "Megatron-LM", EmitFormat.TORCHTITAN: "torchtitan",
              EmitFormat.DEEPSPEED: "DeepSpeed"}
# the tensor-parallel backward each framework runs, as its reader reads it back (by the kernels
# it reads: strategy.tp_backward_of), and whose it is
TP_BACKWARDS = {EmitFormat.MEGATRON: ("megatron", "Megatron-Core's linear layers"),
                EmitFormat.TORCHTITAN: ("dtensor", "torch DTensor's")}


def refuse_unwritten(fmt: EmitFormat, plan: Any, hardware: Any) -> None:
    """PlanError (refuse_emit) for a plan option no written config of `fmt` carries, so that
    predict --from-config would read the config back as another plan: a flash kernel other than
    the hardware's default, a tensor-parallel backward the framework does not run, FSDP's
    reduction deferred or its weights kept gathered (torchtitan writes fsdp_reshard backward)."""
    default = hardware.flash_attention.name if hardware.flash_attention else None
    if plan.attention_kernel not in (None, default):
        raise refuse_emit(fmt.value, f"attention_kernel {plan.attention_kernel}",
                          "the config names no flash kernel: read back, the attention is "
                          f"costed with {hardware.name}'s default"
                          + (f", {default}" if default else " (none)")
                          + " (leave --attention-kernel out)")
    own, whose = TP_BACKWARDS.get(fmt, (None, ""))
    given = plan.tp_backward.value if plan.tp_backward is not None else None
    if own and plan.tp > 1 and given not in (None, own):  # None: the kernels', refused apart
        raise refuse_emit(fmt.value, f"tp_backward {given}",
                          f"{FRAMEWORKS[fmt]} runs tensor parallelism's backward as {whose} "
                          f"(tp_backward {own}; leave --tp-backward out)")
    if plan.defer_grad_sync:
        raise refuse_emit(fmt.value, "defer_grad_sync", f"{FRAMEWORKS[fmt]}'s ZeRO 3 "
                          "reduce-scatters the gradients in every micro-batch's backward (NeMo "
                          "AutoModel's deferred reduction is not written)")
    reshard = plan.fsdp_reshard.value
    if reshard == "step":
        raise refuse_emit(fmt.value, "fsdp_reshard step", f"{FRAMEWORKS[fmt]}'s ZeRO 3 as "
                          "written frees a unit's gathered weights by its backward, not after "
                          "the step's last one")
    if reshard == "backward" and fmt is not EmitFormat.TORCHTITAN:
        raise refuse_emit(fmt.value, "fsdp_reshard backward", f"{FRAMEWORKS[fmt]}'s ZeRO 3 as "
                          "written gathers each unit again for the backward (torchtitan's "
                          "fsdp_reshard_after_forward never keeps the forward's: emit "
                          "torchtitan)")


def refuse_megatron(plan: Any) -> None:
    """PlanError for what pretrain_gpt.py's arguments cannot carry beyond what
    perfmodel.configs.megatron refuses: the distributed optimizer's gather overlapped without
    the gradient reduction overlapped (Megatron-LM asserts --overlap-grad-reduce beside
    --overlap-param-gather), several pipeline schedules a step."""
    if plan.zero == 1 and plan.overlap_param_gather and not plan.overlap_grad_sync:
        raise refuse_emit("megatron", "overlap_param_gather without overlap_grad_sync",
                          "Megatron-LM asserts --overlap-grad-reduce beside "
                          "--overlap-param-gather (pin --no-overlap-param-gather, or leave "
                          "--no-overlap-grad-sync out)")
    if plan.pipeline_micro_batches:
        raise refuse_emit("megatron", f"pipeline_micro_batches {plan.pipeline_micro_batches}",
                          "Megatron-LM runs one pipeline schedule of the step's micro-batches")


def refuse_deepspeed(model: Any, plan: Any) -> None:
    """PlanError for what ds_config.json and the Trainer's arguments leave to the Hugging Face
    model, which the DeepSpeed reader reads back as its own defaults: Megatron-Core's fused
    element-wise kernels, the unfused loss on fp32 logits, the experts weighted in their
    activation (perfmodel.configs.deepspeed)."""
    for field, value, read in (("kernels", plan.kernels.value, "fused"),
                               ("cross_entropy", plan.cross_entropy.value, "unfused"),
                               ("expert_weighting", plan.expert_weighting.value
                                if model.experts else "activation", "activation")):
        if value != read:
            raise refuse_emit("deepspeed", f"{field} {value}", f"the config holds no "
                              f"{field}, and the DeepSpeed reader reads it back as {read} "
                              f"(pin --{field.replace('_', '-')} {read})")


def read_back(fmt: EmitFormat, plan: Any) -> list[str]:
    """The header line of a torchtitan or DeepSpeed plan whose config file leaves an option to
    launch.sh (the allocator's environment, the Trainer's --gradient_checkpointing): the flags
    predict --from-config takes with the file to read the plan back (docs/configs.md)."""
    needs = {"--expandable-segments": (plan.expandable_segments,
                                       "launch.sh exports PYTORCH_CUDA_ALLOC_CONF"),
             "--recompute full": (fmt is EmitFormat.DEEPSPEED and plan.recompute.value == "full",
                                  "launch.sh passes the Trainer's --gradient_checkpointing")}
    flags = {flag: why for flag, (needed, why) in needs.items() if needed}
    if not flags:
        return []
    return [f"Read back with predict --from-config ... {' '.join(flags)}: "
            f"{'; '.join(flags.values())}, which the config does not hold."]


def torchtitan_mesh(plan: Any) -> str:
    """torchtitan's rank order from the innermost (its mesh pp, dp_replicate, dp_shard, cp, tp
    from the outermost): tp,cp,dp,pp, or tp,dp,pp without context parallelism."""
    return "tp,cp,dp,pp" if plan.cp > 1 else "tp,dp,pp"


def torchtitan_extras(text: str, plan: Any) -> str:
    """torchtitan_toml's job config with what it leaves at torchtitan's defaults and the plan
    does not: a pipeline's schedule of pipeline_micro_batches micro-batches (a local batch of
    that many, the rest gradient accumulation) and FSDP's weights kept gathered from the forward
    to the backward (fsdp_reshard backward: fsdp_reshard_after_forward never)."""
    changes = []  # (the field, torchtitan_toml's line, the line that says it)
    if plan.pipeline_micro_batches:
        local = plan.pipeline_micro_batches * plan.micro_batch
        changes.append(("pipeline_micro_batches",
                        f"local_batch_size = {plan.global_batch // plan.dp}\n",
                        f"local_batch_size = {local}\n"))
    if plan.fsdp_reshard.value == "backward":
        changes.append(("fsdp_reshard backward", "[parallelism]\n",
                        '[parallelism]\nfsdp_reshard_after_forward = "never"\n'))
    for field, line, written in changes:
        if line not in text:  # never a config that reads back as another plan
            raise refuse_emit("torchtitan", field, f"its job config has no '{line.strip()}'")
        text = text.replace(line, written, 1)
    return text
