"""torchtitan: a job config (its TOML, or the JSON it dumps) read as a model and a plan, and a
plan written as one.

Field names, defaults and rules are torchtitan's (pytorch/torchtitan torchtitan/config/
job_config.py and torchtitan/distributed/pipeline_parallel.py at commit 9810191bb~1, 2026-02, the
last with TOML job configs):
  - data_parallel_shard_degree -1 takes the ranks left after the other degrees; shard > 1 is
    FSDP2 (ZeRO stage 3), replicate > 1 alone DDP (torchtitan runs it with no tp, pp or cp),
    both HSDP (not modelled);
  - training.seq_len is a multiple of tp x 2 cp (torchtitan asserts it, since 2025-07);
  - mixed precision (mixed_precision_param, bf16) applies under FSDP, and by autocast under DDP or
    on one device; with TP or PP and no FSDP the model trains in training.dtype (float32);
  - tensor parallelism shards the norms' activations along the sequence (sequence parallel);
  - global_batch_size -1 is local_batch_size x data-parallel degree; with PP each local batch is
    split into pipeline_parallel_microbatch_size micro-batches;
  - single-stage schedules (GPipe, 1F1B) hold one stage per rank, multi-stage ones two unless
    pipeline_parallel_layers_per_stage says otherwise; the first and last stages get
    pipeline_parallel_first/last_stage_less_layers (default 1) fewer layers (first_stage_layers
    / last_stage_layers; with one stage per rank only); ZBVZeroBubble's V, two stages a rank,
    is modelled where they split the layers evenly;
  - compile.enable compiles each transformer block (stack compiled, kernels compiled: Inductor
    fuses the element-wise ops); without it the layer's element-wise ops run op by op (kernels
    eager: RMSNorm in fp32, RoPE through complex views, repeat_kv's copies; the published A100
    runs' llama3_8b.toml at 015ccb237: compile = false, norm_type = "rmsnorm"); async TP
    (enable_async_tensor_parallel, which needs it) is tp_comm_overlap (no effect at tp 1);
  - activation_checkpoint mode defaults to selective with selective_ac_option "2" (every second
    layer checkpointed whole); "op" is the per-op policy;
  - the model's attention is PyTorch SDPA (fused kernels, no s^2 scores kept); FSDP2 and DDP
    overlap their communication with the backward, and FSDP2 prefetches the next unit's
    parameters (overlap_param_gather).
Older configs (2024-04 to 2025-04: training.* and experimental.* names, a count of pipeline
micro-batches) are read under today's names (RENAMED, _legacy).
The llama3 flavors (torchtitan/models/llama3/__init__.py, llama3_args) map to TransformerModelArgs:
FFN width 4 dim, x 2/3, x ffn_dim_multiplier, rounded up to multiple_of; vocabulary 128256;
untied output; no biases; RMSNorm; rotary positions. The qwen3 flavors (models/qwen3, qwen3_args)
map to Qwen3ModelArgs (head_dim 128, QK-norm, SDPA causal); the MoE ones with expert parallelism
(expert_parallel_degree, expert_tensor_parallel_degree 1 or tp: distributed/parallel_dims.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from perfmodel.configs.job import (
    Framework,
    JobConfig,
    fix_split,
    refuse_plan,
    refuse_spec,
    typo,
    whole,
    whole_or,
    yes_or_no,
)
from perfmodel.errors import PlanError, SpecError

# torchtitan's JobConfig sections and fields (job_config.py at 9810191bb~1; older names last)
SECTIONS: dict[str, tuple[str, ...]] = {
    "job": ("config_file", "dump_folder", "description", "print_config", "save_config_file",
            "custom_config_module", "use_for_integration_test"),
    "profiling": ("enable_profiling", "save_traces_folder", "profile_freq", "profiler_active",
                  "profiler_warmup", "enable_memory_snapshot", "save_memory_snapshot_folder"),
    "metrics": ("log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder",
                "save_for_all_ranks", "enable_wandb", "rank_0_only"),
    "model": ("name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
              "print_after_conversion", "norm_type"),
    "optimizer": ("name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
                  "early_step_in_backward"),
    "lr_scheduler": ("warmup_steps", "total_steps", "decay_ratio", "decay_type",
                     "min_lr_factor", "lr_min"),
    "training": ("dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug", "dataloader", "batch_size",
                 "compile", "seed", "deterministic", "warmup_steps", "gradient_accumulation_steps"),
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree",
                    "expert_parallel_comm_backend", "pipeline_parallel_split_points",
                    "enable_compiled_autograd"),
    "checkpoint": ("enable", "enable_checkpoint", "enable_ft_dataloader_checkpoints", "folder",
                   "interval", "initial_load_path", "initial_load_model_only",
                   "initial_load_in_hf", "initial_load_in_hf_quantized", "last_save_model_only",
                   "last_save_in_hf", "export_dtype", "async_mode", "keep_latest_k",
                   "load_step", "exclude_from_loading", "enable_first_step_checkpoint",
                   "create_seed_checkpoint", "load_only", "model_weights_only",
                   "interval_type"),
    "activation_checkpoint": ("mode", "selective_ac_option",
                              "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
                              "memory_budget", "visualize_memory_budget_pareto",
                              "preserve_rng_state", "determinism_check", "debug"),
    "compile": ("enable", "components", "backend"),
    "quantize": ("linear", "grouped_mm"),
    "float8": ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
               "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate",
               "moe_fqns_prototype"),
    "mx": ("mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"),
    "comm": ("init_timeout_seconds", "train_timeout_seconds", "trace_buf_size",
             "save_traces_folder", "save_traces_file_prefix", "mode"),
    "memory_estimation": ("enable", "disable_fake_mode"),
    "fault_tolerance": ("enable", "process_group", "process_group_timeout_ms", "replica_id",
                        "group_size", "min_replica_size", "semi_sync_method"),
    "experimental": ("custom_import", "custom_args_module"),
    "validation": ("enable", "enabled", "dataset", "dataset_path", "local_batch_size", "seq_len",
                   "freq", "steps", "dataloader"),
    "debug": ("seed", "deterministic", "deterministic_warn_only", "moe_force_load_balance"),
}
_NOT_STEP = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm",
             "memory_estimation", "experimental", "validation", "debug", "float8", "mx",
             "quantize"}
SCHEDULES = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved",
             "interleavedzerobubble": "zb", "zbvzerobubble": "zbv"}
SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                  "zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble"}
_SINGLE_STAGE = {"gpipe", "1f1b"}

# torchtitan/models/llama3/__init__.py llama3_args (9810191bb~1): TransformerModelArgs fields
FLAVORS: dict[str, dict[str, Any]] = {
    "8B": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3,
               multiple_of=1024),
    "70B": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3,
                multiple_of=4096),
    "405B": dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2,
                 multiple_of=4096),
    "debugmodel": dict(dim=256, n_layers=6, n_heads=16, vocab_size=2048),
}
LLAMA3_VOCAB = 128256  # TransformerModelArgs.vocab_size's default

# torchtitan/models/qwen3/__init__.py qwen3_args (9810191bb~1): Qwen3ModelArgs fields (head_dim
# 128, vocab 151936, SwiGLU, RMSNorm with QK-norm, rotary, no biases, SDPA with a causal mask;
# enable_weight_tying on the small ones); the MoE flavors' MoEArgs: no shared expert, top 8
QWEN3_FLAVORS: dict[str, dict[str, Any]] = {
    "0.6B": dict(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, hidden_dim=3072, tied=True),
    "1.7B": dict(dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, hidden_dim=6144, tied=True),
    "4B": dict(dim=2560, n_layers=36, n_heads=32, n_kv_heads=8, hidden_dim=9728, tied=True),
    "8B": dict(dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, hidden_dim=12288),
    "14B": dict(dim=5120, n_layers=40, n_heads=40, n_kv_heads=8, hidden_dim=17408),
    "32B": dict(dim=5120, n_layers=64, n_heads=64, n_kv_heads=8, hidden_dim=25600),
    "30B-A3B": dict(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, hidden_dim=6144,
                    num_experts=128, top_k=8, moe_inter_dim=768),
    "235B-A22B": dict(dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, hidden_dim=12288,
                      num_experts=128, top_k=8, moe_inter_dim=1536),
}
QWEN3_VOCAB, QWEN3_HEAD_DIM = 151936, 128
# the flavors that are a perfmodel preset's model (the same Hugging Face config): its name and
# source come with it
QWEN3_PRESETS = {"32B": "qwen3-32b", "30B-A3B": "qwen3-30b-a3b", "235B-A22B": "qwen3-235b-a22b"}


def ffn_width(dim: int, multiplier: float | None, multiple_of: int) -> int:
    """torchtitan's FeedForward hidden width (models/llama3/model/model.py):
    h = int(2 (4 dim) / 3); h = int(multiplier h) when given; rounded up to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def flavor_model(flavor: str) -> dict[str, Any]:
    """The TransformerSpec fields of a llama3 flavor."""
    args = {"n_kv_heads": None, "vocab_size": LLAMA3_VOCAB, "multiple_of": 256,
            "ffn_dim_multiplier": None, **FLAVORS[flavor]}
    return dict(layers=args["n_layers"], hidden=args["dim"], heads=args["n_heads"],
                kv_heads=args["n_kv_heads"] or args["n_heads"], vocab=args["vocab_size"],
                ffn_hidden=ffn_width(args["dim"], args["ffn_dim_multiplier"],
                                     args["multiple_of"]),
                gated_mlp=True, tied_embeddings=False, bias=False, qkv_bias=False,
                norm="rmsnorm", position_embedding="rotary",
                # torchtitan's Llama has no dropout (torchtitan/models/llama3/model.py)
                hidden_dropout=0.0, attention_dropout=0.0)


def _get(data: dict[str, Any], section: str, key: str, default: Any) -> Any:
    part = data.get(section)
    return part.get(key, default) if isinstance(part, dict) else default


def _check_keys(data: dict[str, Any], job: JobConfig, where: str) -> None:
    for section, fields in data.items():
        if section == "_comment":  # JSON's stand-in for a comment (perfmodel's test data)
            continue
        if section not in SECTIONS:
            close = typo(section, SECTIONS)
            if close:
                raise SpecError(f"{where}: unknown torchtitan section [{section}]{close}")
            job.strange(f"[{section}]", "(a section)")
            continue
        if not isinstance(fields, dict):
            raise SpecError(f"{where}: [{section}] must be a table of fields")
        for key, value in fields.items():
            if key not in SECTIONS[section]:
                close = typo(key, SECTIONS[section])
                if close:
                    raise SpecError(f"{where}: unknown torchtitan field {section}.{key}{close}")
                job.strange(f"{section}.{key}", value)
            elif (section, key) == ("optimizer", "implementation"):
                _optimizer_kernels(f"{section}.{key}", value, str(value).strip().lower(), job,
                                   where)
            elif (section, key) == ("optimizer", "early_step_in_backward") and _truth(value):
                raise refuse_plan(where, f"{section}.{key}", value,
                                  "the optimizer's step in the backward, each gradient freed "
                                  "as it is applied, is not modelled")
            elif (section, key) == ("debug", "deterministic"):
                _deterministic(fields, "debug", job, where)
            elif section in _NOT_STEP:
                job.skipped(f"{section}.{key}", value, _why(section))


def _deterministic(section: dict[str, Any], name: str, job: JobConfig, where: str) -> None:
    """training.deterministic (older torchtitan) or debug.deterministic: set_determinism turns
    on torch.use_deterministic_algorithms, cuDNN's deterministic kernels without benchmarking,
    and cuBLAS's fixed workspace, and torchtitan warns of the slowdown; perfmodel costs the
    default kernels: said in a note where it is on, as Megatron-LM's --deterministic-mode."""
    if "deterministic" not in section:
        return
    value = section["deterministic"]
    if yes_or_no(value, f"{name}.deterministic", where):
        job.notes.append(f"{name}.deterministic: deterministic algorithms (torchtitan warns "
                         "of the slowdown) are not modelled: costed with the default kernels")
    else:
        job.took(f"{name}.deterministic", value, "the default kernels")


def _truth(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


# torchtitan's loss, F.cross_entropy(pred.flatten(0, 1).float(), labels), compiled with the blocks
# or not: under compile.enable, with "loss" among compile.components (08b8b244f, 2025-08-20, on).
# Under the older training.compile, compiled from e10cb9494 (2024-10-22, "Move output .float() to
# loss fn and compile it if compiling") to e8977b007 (2024-12-18, "turning off compile on loss
# function": it caused CUDA errors) and again from bbb1b616e (2025-04-02, build_cross_entropy_loss);
# eager before and between (before e10cb9494 the model upcast its own output, eager too). The
# runs of torchtitan's 2024-12 H100 tables ran between (benchmarks/llama3_h100_202412_torchtitan.md
# at 820504e: "end of 2024", the latest torchtitan). An eager loss keeps PyTorch's three fp32
# copies of the logits (Plan.cross_entropy torch); a compiled one as the compiled stack counts it.
LOSS_COMPILED_FROM = "2025-04-02 (bbb1b616e) or 2024-10-22 to 2024-12-18 (e10cb9494 to e8977b007)"


def _compiled_loss(training: dict[str, Any], components: Any, job: JobConfig) -> None:
    """The loss of a compiled torchtitan model: compiled with "loss" among compile.components,
    eager without it; under training.compile taken eager, as most of that field's torchtitan
    versions ran it, the others named in a note (LOSS_COMPILED_FROM)."""
    if not training.get("compile", False) and "loss" in components:
        return  # the compiled stack's loss (Plan.cross_entropy unfused)
    if training.get("compile", False):  # taken where --cross-entropy does not say (resolve_plan
        # applies the command line's first)
        job.with_model.append(lambda model: job.plan.setdefault("cross_entropy", "torch"))
        job.notes.append(
            "training.compile: the loss taken eager (cross_entropy torch: PyTorch's three fp32 "
            "copies of the logits), as torchtitan ran it before 2024-10-22 and from 2024-12-18 "
            f"to 2025-04-02; a torchtitan that compiled it (from {LOSS_COMPILED_FROM}): "
            "--cross-entropy unfused")
    else:
        job.fix("cross_entropy", "torch")
        job.took("compile.components", components,
                 "the loss eager: cross_entropy torch (PyTorch's three fp32 copies of the logits)")


def _loss_parallel(key: str, value: Any, disabled: bool, tp: Any, job: JobConfig,
                   where: str) -> None:
    """Loss parallelism off (parallelism.disable_loss_parallel true; before 2024-06
    training.enable_loss_parallel false): with tp > 1 torchtitan's output layer all-gathers the
    logits to every tp rank (ColwiseParallel output_layouts Replicate, parallelize_llama), each
    rank holding and reducing the whole vocabulary's, which perfmodel does not model (the
    logits sharded over tp, the vocabulary-parallel cross entropy, are)."""
    if disabled and str(tp) not in ("1", "None"):
        raise refuse_plan(where, key, value, f"with tp {tp} the logits all-gathered to every tp "
                                             "rank are not modelled (loss parallelism is)")
    job.skipped(key, value, "no tensor parallelism: the loss where it is either way"
                if disabled else "loss parallelism (the logits sharded over tp), as modelled")


# torch.optim's AdamW kernels (optimizer.implementation, torchtitan's default fused since
# 2025-02-24, 6e4988550; before it optimizer.fused, default false: foreach): the plan's
# optimizer_kernels. for-loop steps each tensor on its own: foreach's passes, one tensor at a time
def _optimizer_kernels(key: str, value: Any, kind: str, job: JobConfig, where: str) -> None:
    if kind in ("fused", "foreach"):
        job.fix("optimizer_kernels", kind)
        job.took(key, value, f"optimizer_kernels {kind}")
    elif kind == "for-loop":
        job.fix("optimizer_kernels", "foreach")
        job.took(key, value, "optimizer_kernels foreach: the for-loop makes foreach's passes, "
                             "one tensor at a time (its per-tensor dispatch not counted)")
    else:
        raise refuse_plan(where, key, value, "torch.optim's AdamW runs fused, foreach or "
                                             "for-loop")


def _why(section: str) -> str:
    if section in ("float8", "mx", "quantize"):
        return "applies when model.converters names it"
    if section == "optimizer":
        return "an optimizer hyperparameter (AdamW's states whatever its rates)"
    return "logging, checkpointing, validation or debugging"


def qwen3_model(flavor: str) -> dict[str, Any]:
    """The TransformerSpec fields of a qwen3 flavor (Qwen3ModelArgs; an MoE flavor's routed
    experts every layer, Qwen3MoE's decoder_sparse_step 1)."""
    args = QWEN3_FLAVORS[flavor]
    fields: dict[str, Any] = dict(
        layers=args["n_layers"], hidden=args["dim"], heads=args["n_heads"],
        kv_heads=args["n_kv_heads"], head_dim=QWEN3_HEAD_DIM, ffn_hidden=args["hidden_dim"],
        vocab=QWEN3_VOCAB, gated_mlp=True, tied_embeddings=bool(args.get("tied")), bias=False,
        qkv_bias=False, norm="rmsnorm", position_embedding="rotary")
    if "num_experts" in args:
        fields.update(experts=args["num_experts"], top_k=args["top_k"],
                      expert_ffn_hidden=args["moe_inter_dim"], shared_experts=0)
    return fields


def read_torchtitan(data: dict[str, Any], path: Path) -> JobConfig:
    """A torchtitan job config (TOML or its JSON dump), read; an older config's fields under
    today's names (see _legacy), a refusal naming the field as the config writes it."""
    where = str(path)
    job = JobConfig(path=where, framework=Framework.TORCHTITAN)
    data, renamed = _legacy(data, job, where)
    try:
        _check_keys(data, job, where)
        _model(data, job, where)
        _training(data, job, where)
        _parallelism(data, job, where)
        _checkpointing(data, job, where)
    except (SpecError, PlanError) as exc:
        text = str(exc)
        for new, old in renamed.items():
            text = text.replace(f": {new}", f": {old}")
        if text == str(exc):
            raise
        raise type(exc)(text) from None
    return job


# --- older configs ------------------------------------------------------------------------------
# torchtitan's older field names (torchtitan/config_manager.py of pytorch/torchtitan from 2024-04
# to 2025-04: training.* and experimental.* until 2025-03-14, parallelism.* after), each read as
# the field of today's name and meaning
RENAMED: dict[str, str] = {
    **{f"training.{key}": f"parallelism.{key}" for key in (
        "tensor_parallel_degree", "pipeline_parallel_degree", "data_parallel_replicate_degree",
        "data_parallel_shard_degree", "disable_loss_parallel", "fsdp_reshard_after_forward")},
    **{f"experimental.{key}": f"parallelism.{key}" for key in (
        "pipeline_parallel_degree", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_split_points",
        "context_parallel_degree", "context_parallel_rotate_method",
        "enable_async_tensor_parallel", "enable_compiled_autograd")},
}
# older fields that do not change the step, by why
LEGACY_SKIPPED: dict[str, str] = {
    "training.enable_loss_parallel": "read by _loss_parallel",
    "experimental.pipeline_parallel_split_mode": "how the stages are built (traced or by hand: "
                                                 "the same stages)",
    "optimizer.fused": "read by _optimizer_kernels",
    **dict.fromkeys(("job.print_args", "metrics.enable_color_printing", "estimate.memory",
                     "estimate.mode", "memory_estimation.enabled",
                     "experimental.custom_model_path"),
                    "logging, checkpointing, validation or debugging"),
    **dict.fromkeys(("training.enable_fsdp_fp8_all_gather",
                     "training.enable_fsdp_float8_all_gather",
                     "training.precompute_float8_dynamic_scale_for_fsdp",
                     "training.float8_scaling_type_input", "training.float8_scaling_type_weight",
                     "training.float8_scaling_type_grad_output", "float8.scaling_type_input",
                     "float8.scaling_type_weight", "float8.scaling_type_grad_output"),
                    "applies with float8 linear layers"),
}
# older switches of float8 linear layers (torchao), as model.converters ["float8"] is today
FLOAT8_SWITCHES = ("training.fp8_linear", "training.enable_fp8_linear",
                   "training.enable_float8_linear", "float8.enable_float8_linear")
# the data-parallel degree before 2024-09 (training.data_parallel_degree, -1: the rest), FSDP or
# DDP by training.data_parallel_type (from 2024-07; FSDP before and by default)
DP_TYPES = {"fsdp": "data_parallel_shard_degree", "ddp": "data_parallel_replicate_degree"}


def _legacy(data: dict[str, Any], job: JobConfig, where: str) -> tuple[dict[str, Any],
                                                                         dict[str, str]]:
    """The config with an older torchtitan's fields under today's names, and {today's name: the
    config's}. Also read here: the data-parallel degree and type before 2024-09, the number of
    pipeline micro-batches before 2025-04 (pipeline_parallel_microbatches: how many, where
    today's field gives their size), FlexAttention, and float8 switches (refused, as
    model.converters is). An older config's pipeline with no split points takes that version's
    default split (see _split)."""
    out = {section: dict(fields) if isinstance(fields, dict) else fields
           for section, fields in data.items()}
    renamed: dict[str, str] = {}

    def pop(key: str) -> tuple[bool, Any]:
        section, name = key.split(".", 1)
        fields = out.get(section)
        if isinstance(fields, dict) and name in fields:
            return True, fields.pop(name)
        return False, None

    def put(old: str, new: str, value: Any) -> None:
        section, name = new.split(".", 1)
        fields = out.setdefault(section, {})
        if not isinstance(fields, dict):
            raise SpecError(f"{where}: [{section}] must be a table of fields")
        if name in fields and fields[name] != value:
            raise refuse_plan(where, old, value, f"disagrees with {new} {fields[name]} (the "
                                                 "same field under its later name)")
        fields[name] = value
        renamed[new] = old
        job.took(old, value, f"torchtitan's older name of {new}")

    for old, new in RENAMED.items():
        found, value = pop(old)
        if found:
            put(old, new, value)
    for key, why in LEGACY_SKIPPED.items():
        found, value = pop(key)
        if found and key == "training.enable_loss_parallel":
            par = out.get("parallelism")
            tp = par.get("tensor_parallel_degree", 1) if isinstance(par, dict) else 1
            _loss_parallel(key, value, not _truth(value), tp, job, where)
        elif found and key == "optimizer.fused":
            _optimizer_kernels(key, value, "fused" if _truth(value) else "foreach", job, where)
        elif found:
            job.skipped(key, value, why)
    for section in ("estimate",):  # a section of 2024-06 (memory estimation), now empty
        if out.get(section) == {}:
            del out[section]
    for key in FLOAT8_SWITCHES:
        found, value = pop(key)
        if found and value not in (False, "", None, "none"):
            raise refuse_plan(where, key, value, "float8 and MX training are not modelled")
        if found:
            job.skipped(key, value, "float8 linear layers off")
    found, flex = pop("model.use_flex_attn")
    if found and flex:
        raise refuse_spec(where, "model.use_flex_attn", flex,
                          "FlexAttention is not modelled (perfmodel costs SDPA's fused kernels)")
    if found:
        job.skipped("model.use_flex_attn", flex, "SDPA's attention, as modelled")
    found, mask = pop("model.attn_mask_type")
    if found and str(mask) != "causal":
        raise refuse_spec(where, "model.attn_mask_type", mask,
                          "perfmodel's attention is causal over the sequence")
    if found:
        job.skipped("model.attn_mask_type", mask, "causal attention, as modelled")
    found_type, kind = pop("training.data_parallel_type")
    found, degree = pop("training.data_parallel_degree")
    kind = str(kind if found_type else "fsdp")
    if kind not in DP_TYPES:
        raise refuse_plan(where, "training.data_parallel_type", kind,
                          "torchtitan's values: fsdp, ddp")
    if found_type:
        job.took("training.data_parallel_type", kind, "FSDP2 (ZeRO stage 3)" if kind == "fsdp"
                 else "DDP (replicated)")
    if found:
        if kind == "ddp" and degree == -1:
            raise refuse_plan(where, "training.data_parallel_degree", degree,
                              "with data_parallel_type ddp give the degree (perfmodel reads "
                              "-1 as the FSDP ranks left)")
        put("training.data_parallel_degree", f"parallelism.{DP_TYPES[kind]}", degree)
        if kind == "ddp":
            out["parallelism"].setdefault("data_parallel_shard_degree", 1)
    for key in ("experimental.pipeline_parallel_microbatches",
                "parallelism.pipeline_parallel_microbatches"):
        found, count = pop(key)
        if found:
            job.plan["_pp_microbatches"] = (key, count)
            job.took(key, count, "micro-batches per local batch (torchtitan before 2025-04)")
    if renamed or job.plan.get("_pp_microbatches") or found_type:
        job.plan["_legacy"] = True
    return out, renamed


def _model(data: dict[str, Any], job: JobConfig, where: str) -> None:
    name = str(_get(data, "model", "name", "llama3"))
    flavor = str(_get(data, "model", "flavor", "debugmodel"))
    converters = _get(data, "model", "converters", [])
    if converters and not isinstance(converters, (str, list)):
        raise SpecError(f"{where}: model.converters must be a list of converter names, got "
                        f"'{converters}'")
    converters = [converters] if isinstance(converters, str) else list(converters or [])
    if converters:
        raise refuse_plan(where, "model.converters", converters,
                          "float8 and MX training are not modelled")
    for key in ("hf_assets_path", "tokenizer_path", "print_after_conversion"):
        if key in data.get("model", {}):
            job.skipped(f"model.{key}", data["model"][key], "the tokenizer's files")
    if name == "qwen3":
        _qwen3(data, job, where, flavor)
        return
    if name == "deepseek_v3" and flavor in DEEPSEEK_PRESETS:
        # torchtitan/models/deepseek_v3/__init__.py (_671b at b5bcd76c6): the config's sizes,
        # routing (8 groups, 4 limited) and no multi-token-prediction module (num_mtp_layers 0)
        job.preset = DEEPSEEK_PRESETS[flavor]
        job.model["mtp_layers"] = 0
        job.plan["_moe"] = True
        job.took("model.name", name, "torchtitan's DeepSeek-V3")
        job.took("model.flavor", flavor, f"preset {job.preset}, without its MTP module "
                                         "(torchtitan builds none by default)")
        job.notes.append(f"model.flavor {flavor}: torchtitan's deepseek_v3 flavors attend "
                         "within documents (FlexAttention, block-causal masks); perfmodel "
                         "costs causal attention over the whole sequence, an upper bound")
        return
    if name != "llama3":
        job.needs_model = (f"model.name {name}" + (f" flavor {flavor}" if name == "deepseek_v3"
                                                   else "")
                           + ": perfmodel maps torchtitan's llama3 and qwen3 flavors and "
                             f"deepseek_v3 {', '.join(DEEPSEEK_PRESETS)} only")
        job.took("model.name", name, "give --model")
        if name == "deepseek_v3" and flavor not in ("debugmodel",):
            # deepseekv3_args at 9810191bb~1: 16B, 236B, 671B set attn_type "flex" and
            # attn_mask_type "block_causal"
            job.notes.append(f"model.flavor {flavor}: torchtitan's deepseek_v3 flavors attend "
                             "within documents (FlexAttention, block-causal masks); perfmodel "
                             "costs causal attention over the whole sequence, an upper bound")
        return
    if flavor not in FLAVORS:
        if flavor.endswith(("_flex", "_varlen", "_flex_attn", "_varlen_attn")):
            raise refuse_spec(where, "model.flavor", flavor,
                              "flex and varlen attention with block-causal masks are not "
                              "modelled (perfmodel's attention is causal over the sequence)")
        raise refuse_spec(where, "model.flavor", flavor,
                          f"perfmodel maps torchtitan's llama3 flavors "
                          f"{', '.join(FLAVORS)} (torchtitan/models/llama3/__init__.py)")
    job.model.update(flavor_model(flavor))
    job.plan["_moe"] = False
    if "norm_type" in data.get("model", {}):  # older torchtitan (2024): model.norm_type
        norm = str(data["model"]["norm_type"]).lower()
        if norm != "rmsnorm":
            raise refuse_spec(where, "model.norm_type", norm,
                              "perfmodel models torchtitan's RMSNorm (rmsnorm); the Triton "
                              "fused_rmsnorm and the LayerNorms are not modelled")
        job.took("model.norm_type", norm, "RMSNorm (torchtitan/models/norms.py)")
    job.took("model.name", name, "torchtitan's Llama 3")
    job.took("model.flavor", flavor, f"{job.model['layers']} layers, hidden "
                                     f"{job.model['hidden']}, ffn {job.model['ffn_hidden']}")


# torchtitan's deepseek_v3 flavors that are a perfmodel preset's model
DEEPSEEK_PRESETS = {"671B": "deepseek-v3"}


def _qwen3(data: dict[str, Any], job: JobConfig, where: str, flavor: str) -> None:
    """A qwen3 flavor: its fields (the preset of the same model where perfmodel has one)."""
    if flavor not in QWEN3_FLAVORS:
        raise refuse_spec(where, "model.flavor", flavor,
                          f"perfmodel maps torchtitan's qwen3 flavors "
                          f"{', '.join(QWEN3_FLAVORS)} (torchtitan/models/qwen3/__init__.py)")
    job.model.update(qwen3_model(flavor))
    job.preset = QWEN3_PRESETS.get(flavor)
    job.plan["_moe"] = "experts" in job.model
    job.took("model.name", "qwen3", "torchtitan's Qwen3 (SDPA, causal)")
    what = f"{job.model['layers']} layers, hidden {job.model['hidden']}, ffn " \
           f"{job.model['ffn_hidden']}"
    if "experts" in job.model:
        what += f", {job.model['experts']} experts of {job.model['expert_ffn_hidden']}, top " \
                f"{job.model['top_k']}"
    job.took("model.flavor", flavor, what + (f" (preset {job.preset})" if job.preset else ""))


def _training(data: dict[str, Any], job: JobConfig, where: str) -> None:
    training = data.get("training", {})
    for key in ("dataset", "dataset_path", "max_norm", "steps", "gc_freq", "gc_debug",
                "dataloader", "seed", "warmup_steps"):
        if key in training:
            job.skipped(f"training.{key}", training[key], "the run's data, length or "
                                                          "numerics")
    _deterministic(training, "training", job, where)
    seq = training.get("seq_len", 2048)
    job.model["seq_len"] = whole(seq, "training.seq_len", where)
    job.took("training.seq_len", seq, f"seq_len {seq}" + (
        "" if "seq_len" in training else " (torchtitan's default)"))
    if training.get("enable_cpu_offload"):
        raise refuse_plan(where, "training.enable_cpu_offload", True,
                          "offloading FSDP's states to the host is not modelled")
    for field, value in (("training.compile", training.get("compile", False)),
                         ("compile.enable", _get(data, "compile", "enable", False))):
        yes_or_no(value, field, where)
    components = _get(data, "compile", "components", ["model", "loss"])  # torchtitan's default
    # (what compile.components names matters only where compile.enable is on)
    if _get(data, "compile", "enable", False) and not (
            isinstance(components, list)
            and all(isinstance(c, str) and c in ("model", "loss") for c in components)):
        raise refuse_plan(where, "compile.components", components,
                          'a list of "model" and "loss"')
    # torchtitan compiles the model's blocks only with "model" among compile.components
    # (config_registry: compile.enable and "model" in compile.components); the loss alone
    # compiled leaves the layers eager. The older training.compile compiled the model.
    compiled = training.get("compile", False) or (
        _get(data, "compile", "enable", False) and "model" in components)
    backend = _get(data, "compile", "backend", "inductor")
    if compiled and str(backend).strip().lower() != "inductor":
        # torch.compile(block, backend=compile.backend) (apply_compile): only Inductor fuses
        # the blocks' kernels (aot_eager and eager run them op by op, through the compiler's
        # graphs): neither perfmodel's compiled stack nor its eager one
        raise refuse_plan(where, "compile.backend", backend,
                          "perfmodel models torch.compile with Inductor (backend inductor, "
                          "torchtitan's default) or the blocks eager (compile off)")
    if not _get(data, "compile", "enable", False) and "components" in (
            data["compile"] if isinstance(data.get("compile"), dict) else {}):
        job.skipped("compile.components", components,
                    "training.compile compiles the model whatever the components"
                    if training.get("compile", False) else "compile.enable is off")
    # torchtitan compiles each transformer block (apply_compile); the embedding, the output layer
    # and the loss stay eager, as the compiled stack of perfmodel.step.host counts them
    job.fix("stack", "compiled" if compiled else "eager")
    job.fix("kernels", "compiled" if compiled else "eager")
    if compiled:
        _compiled_loss(training, components, job)
    elif _get(data, "compile", "enable", False) and "loss" in components:
        # the loss alone compiled (build_cross_entropy_loss under compile.enable with "loss" in
        # components): perfmodel's loss options are an eager stack's or a compiled stack's, none
        # a compiled loss beside eager blocks
        job.notes.append(f"compile.components {' '.join(components)}: torchtitan compiles the "
                         "loss alone, the blocks eager; a compiled loss beside eager blocks is "
                         "not modelled: costed as the eager loss (PyTorch's F.cross_entropy on "
                         "fp32 copies of the logits), which the compiled one's fused kernels "
                         "may undercut in time and memory")
    # its MoE weights the experts' outputs at the combine (models/common/token_dispatcher.py:
    # routed outputs x topk_scores, then scatter_add); a dense model has none to weight
    job.fix("expert_weighting", "output")
    if "compile" in training:
        job.took("training.compile", training["compile"],
                 f"stack {job.plan['stack']}, kernels {job.plan['kernels']}")
    if "compile" in data:
        for key, value in data["compile"].items():
            if not any(s.key == f"compile.{key}" for s in job.ignored):  # said once
                job.took(f"compile.{key}", value, f"stack {job.plan['stack']}")
    if "gradient_accumulation_steps" in training:
        raise SpecError(f"{where}: training.gradient_accumulation_steps is an old torchtitan "
                        "field: give global_batch_size")
    local_key = "local_batch_size" if "local_batch_size" in training else "batch_size"
    local = whole(training.get(local_key, 8), f"training.{local_key}", where)
    job.took(f"training.{local_key}", local, "samples per data-parallel rank per micro-batch "
                                             "(or per local batch with PP)")
    job.plan["_local_batch"] = local
    batch = whole_or(training.get("global_batch_size"), -1, "training.global_batch_size",
                     where)
    if batch != -1:
        job.fix("global_batch", whole(batch, "training.global_batch_size", where))
        job.took("training.global_batch_size", batch, f"global_batch {batch}")
    dtype = str(training.get("dtype", "float32"))
    param = str(training.get("mixed_precision_param", "bfloat16"))
    reduce = str(training.get("mixed_precision_reduce", "float32"))
    for key, value, allowed in (("dtype", dtype, ("bfloat16", "float32")),
                                ("mixed_precision_param", param, ("bfloat16", "float32")),
                                ("mixed_precision_reduce", reduce, ("float32",))):
        if value not in allowed:
            raise refuse_plan(where, f"training.{key}", value,
                              f"torchtitan's values: {', '.join(allowed)}")
    if dtype == "bfloat16":
        raise refuse_plan(where, "training.dtype", dtype,
                          "pure bf16 training (bf16 weights and optimizer states, no fp32 copy) "
                          "is not modelled")
    job.plan["_dtypes"] = (param, dtype)
    for key in ("dtype", "mixed_precision_param", "mixed_precision_reduce"):
        if key in training:
            job.took(f"training.{key}", training[key], "the dtype (with the parallelism)")


def _reshard_after_forward(job: JobConfig, policy: str, stated: bool, pp: int,
                           fsdp: bool) -> None:
    """parallelism.fsdp_reshard_after_forward as torchtitan resolves it (torchtitan/distributed/
    fsdp.py, get_fsdp_reshard_after_forward_policy: "default" is on without a pipeline, off with
    one), once the world size says whether FSDP runs (finish): without a pipeline "always"
    gathers each unit for every forward and again for its backward, "never" keeps the forward's
    gather for the backward (fsdp_reshard backward); with one the stage's units stay gathered
    through the step (perfmodel.step.data_parallel, stage_resident), and "always" is refused.
    Without FSDP (dp_shard x cp = 1) it is moot."""
    key = "parallelism.fsdp_reshard_after_forward"
    if not fsdp:
        if stated:
            job.skipped(key, policy, "no FSDP (data_parallel_shard_degree x cp = 1)")
        return
    if pp > 1 and policy == "always":
        raise refuse_plan(job.path, key, policy,
                          "with a pipeline perfmodel's FSDP keeps the stage's weights gathered "
                          "through the step (torchtitan's default, never); gathering them again "
                          "for every micro-batch is not modelled")
    if pp == 1 and policy == "never":
        job.fix("fsdp_reshard", "backward")
    if policy == "always":  # a search keeps one stage: with more it would cost "never"
        job.fix("pp", 1)
    if stated:
        job.took(key, policy, "FSDP's weights kept gathered through the step (pp > 1)"
                 if pp > 1 else "FSDP's weights kept from forward to backward (fsdp_reshard "
                 "backward)" if policy == "never" else "FSDP's weights gathered again for the "
                 "backward" + (" (pp kept at 1)" if policy == "always" else ""))


def _parallelism(data: dict[str, Any], job: JobConfig, where: str) -> None:
    par = data.get("parallelism", {})
    cp = _context_parallel(par, job, where)
    tp = whole(par.get("tensor_parallel_degree", 1), "parallelism.tensor_parallel_degree", where)
    _async_tp(par, job, where, tp)
    if par.get("pipeline_parallel_schedule_csv"):
        raise refuse_plan(where, "parallelism.pipeline_parallel_schedule_csv",
                          par["pipeline_parallel_schedule_csv"],
                          "a hand-made pipeline schedule is not modelled")
    replicate = whole(par.get("data_parallel_replicate_degree", 1),
                      "parallelism.data_parallel_replicate_degree", where)
    shard = par.get("data_parallel_shard_degree")
    if shard is None or (not isinstance(shard, bool) and shard == -1):
        shard = -1
    else:  # torchtitan's rule: -1 (the ranks the other degrees leave) or a degree >= 1
        try:
            shard = whole(shard, "parallelism.data_parallel_shard_degree", where)
        except SpecError:
            raise SpecError(f"{where}: parallelism.data_parallel_shard_degree must be -1 (the "
                            f"ranks the other degrees leave) or a whole number from 1 to 1e10, "
                            f"got {shard!r}") from None
    pp = whole(par.get("pipeline_parallel_degree", 1), "parallelism.pipeline_parallel_degree",
               where)
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                "tensor_parallel_degree", "pipeline_parallel_degree"):
        if key in par:
            job.took(f"parallelism.{key}", par[key], {
                "data_parallel_shard_degree": "FSDP ranks (-1: the rest)",
                "data_parallel_replicate_degree": "DDP ranks",
                "tensor_parallel_degree": f"tp {tp}",
                "pipeline_parallel_degree": f"pp {pp}"}[key])
    if replicate > 1 and shard not in (1, -1):  # -1: finish() once the world says what it is
        raise refuse_plan(where, "parallelism.data_parallel_replicate_degree", replicate,
                          "with data_parallel_shard_degree "
                          f"{shard} this is HSDP (replicated shards), not modelled")
    if shard == 1:  # -1: finish() once the world says what it is
        _ddp_alone(where, replicate, shard * cp, tp, pp)
    if not job.plan.get("_legacy"):
        _seq_len_divisor(data, job, where, tp, cp)
    job.fix("tp", tp, pin="tensor_parallel_degree" in par)
    job.fix("pp", pp, pin="pipeline_parallel_degree" in par)
    policy = par.get("fsdp_reshard_after_forward", "default")
    if policy not in ("default", "always", "never"):
        raise refuse_plan(where, "parallelism.fsdp_reshard_after_forward", policy,
                          "torchtitan takes default, always or never")
    job.plan["_reshard"] = (policy, "fsdp_reshard_after_forward" in par)  # finish() applies it
    _experts(par, job, where, tp)
    if pp > 1 and data.get("model", {}).get("name") == "qwen3":
        raise refuse_plan(where, "parallelism.pipeline_parallel_degree", pp,
                          "torchtitan's qwen3 has no pipeline parallelism (its TrainSpec gives "
                          "no pipelining_fn)")
    job.fix("sequence_parallel", tp > 1, pin="tensor_parallel_degree" in par)
    job.fix("tp_layout", "1d")
    # torchtitan's mesh, outermost first: pp, dp_replicate, dp_shard, cp, tp
    job.fix("placement", "tp,cp,dp,pp" if cp > 1 else "tp,dp,pp")
    job.fix("flash_attention", True)
    name = str(_get(data, "model", "name", "llama3"))
    job.notes.append(f"attention: torchtitan's {name} runs PyTorch SDPA (fused, "
                     "flash_attention), cuDNN's kernel first since torchtitan #1776 (2025-10), "
                     "as the hardware's default kernel costs it; SDPA's flash backend before "
                     "that is FlashAttention-2 (--attention-kernel fa2 where measured)"
                     if name in ("llama3", "qwen3") else
                     "attention: a fused kernel (flash_attention), as torchtitan's models run it")
    job.fix("overlap_grad_sync", True)
    # FSDP2 prefetches the next unit's all-gather (its default); without FSDP nothing is
    # gathered (finish() turns it off)
    job.fix("overlap_param_gather", True, pin=False)
    if shard != -1:
        job.gpus = replicate * shard * tp * pp * cp
        job.gpus_from = ("the parallel degrees (replicate x shard x tp x pp"
                         + (" x cp)" if cp > 1 else ")"))
    job.plan["_dp_degrees"] = (replicate, shard)
    if "disable_loss_parallel" in par:
        _loss_parallel("parallelism.disable_loss_parallel", par["disable_loss_parallel"],
                       _truth(par["disable_loss_parallel"]), tp, job, where)
    if "enable_compiled_autograd" in par:
        job.skipped("parallelism.enable_compiled_autograd", par["enable_compiled_autograd"],
                    "how autograd is traced (the backward's kernels are the same)")
    _pipeline(par, job, where, pp)


def _async_tp(par: dict[str, Any], job: JobConfig, where: str, tp: int) -> None:
    """parallelism.enable_async_tensor_parallel: tp_comm_overlap, which torchtitan refuses
    without the model compiled; at tp 1 it has no effect. torchtitan reads it only under `if
    parallel_dims.tp_enabled:` (models/llama3/infra/parallelize.py, maybe_enable_async_tp, and
    qwen3's and deepseek_v3's alike, at 238fa99 and 9810191bb~1; parallelisms/
    parallelize_llama.py at eef8bb2b1, 2024-09, for experimental.enable_async_tensor_parallel),
    so at tp 1 neither async TP nor its compile check applies."""
    key = "parallelism.enable_async_tensor_parallel"
    async_tp = bool(par.get("enable_async_tensor_parallel"))
    if tp == 1 and async_tp:
        job.fix("tp_comm_overlap", False, pin="tensor_parallel_degree" in par)
        job.skipped(key, par["enable_async_tensor_parallel"],
                    "no effect with tensor_parallel_degree 1 (torchtitan applies async TP "
                    "under tp > 1 only)")
        return
    if async_tp and job.plan.get("stack") != "compiled":
        raise refuse_plan(where, key, True,
                          "torchtitan's async TP needs torch.compile (compile.enable true)")
    job.fix("tp_comm_overlap", async_tp)
    if "enable_async_tensor_parallel" in par:
        job.took(key, async_tp,
                 "tp_comm_overlap (the matmuls overlap their all-gathers and reduce-scatters)"
                 if async_tp else "tp_comm_overlap false")


def _ddp_alone(where: str, replicate: int, sharded: int, tp: int, pp: int) -> None:
    """torchtitan's DDP (data_parallel_replicate_degree > 1, no FSDP: dp_shard x cp = 1) runs
    on no other parallelism: parallelize_llama raises RuntimeError("DDP has not supported > 1D
    parallelism") where the world is more than the dp_replicate mesh, i.e. tp or pp > 1 (cp > 1
    is FSDP over dp_shard x cp, HSDP with replicas: refused as such) (models/llama3/infra/
    parallelize.py lines 147-151 at 238fa99, and 9810191bb~1; qwen3's and deepseek_v3's alike;
    since its DDP, 2f989b9f3)."""
    if replicate > 1 and sharded == 1 and (tp > 1 or pp > 1):
        raise refuse_plan(where, "parallelism.data_parallel_replicate_degree", replicate,
                          f"torchtitan's DDP runs alone (with tp {tp}, pp {pp} it raises \"DDP "
                          "has not supported > 1D parallelism\"): give tensor_parallel_degree "
                          "and pipeline_parallel_degree 1, or shard (data_parallel_shard_degree)")


# the models whose parallelize function asserts the sequence's divisor (their infra/
# parallelize.py at 238fa99 and 9810191bb~1)
_SEQ_DIVISOR_MODELS = ("llama3", "qwen3", "deepseek_v3", "llama4", "gpt_oss")


def _seq_len_divisor(data: dict[str, Any], job: JobConfig, where: str, tp: int,
                     cp: int) -> None:
    """training.seq_len must be a multiple of tp x 2 cp: the models' parallelize functions
    assert `seq_len % parallel_dims.seq_len_divisor == 0` whatever the degrees
    (models/llama3/infra/parallelize.py lines 66-73 and distributed/parallel_dims.py
    seq_len_divisor, tp * (cp * 2), at 238fa99 and 9810191bb~1; since 6204cdff9, 2025-07; an
    older config's names, before 2025-04, ran no such assert: not checked for them)."""
    if str(_get(data, "model", "name", "llama3")) not in _SEQ_DIVISOR_MODELS:
        return
    seq, divisor = job.model["seq_len"], tp * cp * 2
    if seq % divisor:
        raise refuse_plan(where, "training.seq_len", seq,
                          f"must be a multiple of tp x 2 x cp = {tp} x 2 x {cp} = {divisor} "
                          "(torchtitan asserts it: parallel_dims.seq_len_divisor)")


def _experts(par: dict[str, Any], job: JobConfig, where: str, tp: int) -> None:
    """Expert parallelism (MoE flavors, or --model with experts): ep, and etp 1 or tp
    (torchtitan/distributed/parallel_dims.py: "Currently we only support ETP=TP or ETP=1"); the
    ep group after etp over the tp, cp, then dp_shard ranks (its sparse mesh: efsdp, ep, etp,
    etp innermost), as Megatron-Core's expert ranks; the all-to-alls NCCL's (the standard
    backend). Without expert parallelism (ep 1) and with tp > 1 torchtitan shards every expert
    over the tp ranks whatever expert_tensor_parallel_degree says (models/llama4/infra/
    parallelize.py apply_moe_ep_tp, ep_mesh None: experts_mesh tp_mesh, TensorParallel, at
    238fa99 and 9810191bb~1, deepseek_v3, qwen3 and gpt_oss alike; experiments/llama4's
    apply_moe_tp before expert parallelism, 01f4e5022~1): etp = tp, decided once the model is
    known to have experts."""
    ep = whole(par.get("expert_parallel_degree", 1), "parallelism.expert_parallel_degree", where)
    etp = whole(par.get("expert_tensor_parallel_degree", 1),
                "parallelism.expert_tensor_parallel_degree", where)
    if ep > 1 and job.plan.get("_moe") is False:
        raise refuse_plan(where, "parallelism.expert_parallel_degree", ep,
                          "this flavor has no experts")
    if ep > 1 and etp not in (1, tp):
        raise refuse_plan(where, "parallelism.expert_tensor_parallel_degree", etp,
                          f"torchtitan takes 1 or the tensor-parallel degree ({tp})")
    backend = str(par.get("expert_parallel_comm_backend", "standard"))
    if backend not in ("standard", "deepep", "hybridep"):
        raise refuse_plan(where, "parallelism.expert_parallel_comm_backend", backend,
                          "torchtitan's values: standard, deepep, hybridep")
    if par.get("pipeline_parallel_expert_parallel_overlap") and ep > 1:
        raise refuse_plan(where, "parallelism.pipeline_parallel_expert_parallel_overlap", True,
                          "the DualPipeV overlap of the experts' all-to-alls is not modelled")
    if ep > 1:
        job.fix("ep", ep)
        job.fix("etp", etp)
        if backend in ("deepep", "hybridep"):  # HybridEP sends as DeepEP does
            job.fix("ep_dispatcher", "deepep")
    elif tp > 1 and job.plan.get("_moe") is not False:
        job.with_model.append(lambda model: _experts_over_tp(job, model, tp))
    what = f"ep {ep}, etp {etp}" if ep > 1 else \
        f"ep 1: the experts tensor-parallel over tp (etp {tp} with experts)" if tp > 1 else \
        "ep 1, etp 1"
    for key, value in (("expert_parallel_degree", ep), ("expert_tensor_parallel_degree", etp),
                       ("pipeline_parallel_expert_parallel_overlap",
                        par.get("pipeline_parallel_expert_parallel_overlap"))):
        if key in par:
            job.took(f"parallelism.{key}", value, what)
    if "expert_parallel_comm_backend" in par:  # as the Megatron reader takes --moe-token-
        # dispatcher-type flex
        job.took("parallelism.expert_parallel_comm_backend", backend,
                 "the tokens' all-to-all" + (f" by {backend}'s kernels: ep_dispatcher deepep"
                                             if backend != "standard" else ""))


def _experts_over_tp(job: JobConfig, model: Any, tp: int) -> None:
    """etp = tp where the model has experts and ep is 1 (see _experts), unless the command line
    gives etp."""
    if getattr(model, "experts", 0) and "etp" not in job.plan:
        job.fix("etp", tp)
        job.notes.append(f"expert_parallel_degree 1 with tp {tp}: torchtitan shards each expert "
                         f"over the tp ranks (apply_moe_ep_tp's TensorParallel): etp {tp}")


# torchtitan's rotate methods (torch.distributed.tensor.experimental's context parallel): the
# K/V shards all-gathered before the attention, or passed around the ring step by step
ROTATE_METHODS = {"allgather": "allgather", "alltoall": "p2p"}


def _context_parallel(par: dict[str, Any], job: JobConfig, where: str) -> int:
    """context_parallel_degree, its rotate method (cp_comm: allgather, or alltoall's ring as
    p2p) and load balancer (head-tail, the default: the 2 cp load-balanced chunks perfmodel
    models, as Megatron-Core's). Returns cp."""
    cp = whole(par.get("context_parallel_degree", 1), "parallelism.context_parallel_degree",
               where)
    job.fix("cp", cp, pin="context_parallel_degree" in par)
    if "context_parallel_degree" in par:
        job.took("parallelism.context_parallel_degree", cp, f"cp {cp}")
    rotate = str(par.get("context_parallel_rotate_method", "allgather"))
    if rotate not in ROTATE_METHODS:
        raise refuse_plan(where, "parallelism.context_parallel_rotate_method", rotate,
                          f"torchtitan's values: {', '.join(ROTATE_METHODS)}")
    balancer = par.get("context_parallel_load_balancer", "headtail")
    if cp > 1 and str(balancer).lower() != "headtail":
        raise refuse_plan(where, "parallelism.context_parallel_load_balancer", balancer,
                          "perfmodel models the head-tail balance (each rank two of 2 cp "
                          "chunks)")
    if cp > 1:
        job.fix("cp_comm", ROTATE_METHODS[rotate])
    for key, said in (("context_parallel_rotate_method", f"cp_comm {ROTATE_METHODS[rotate]}"),
                      ("context_parallel_load_balancer", "two load-balanced chunks a rank")):
        if key in par:
            job.took(f"parallelism.{key}", par[key], said if cp > 1 else "cp 1: none")
    return cp


def _pipeline(par: dict[str, Any], job: JobConfig, where: str, pp: int) -> None:
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    schedule = SCHEDULES.get(name.lower())
    if schedule is None:
        raise refuse_plan(where, "parallelism.pipeline_parallel_schedule", name,
                          f"perfmodel models {', '.join(SCHEDULE_NAMES.values())}")
    micro = whole(par.get("pipeline_parallel_microbatch_size", 1),
                  "parallelism.pipeline_parallel_microbatch_size", where)
    counted = job.plan.pop("_pp_microbatches", None)  # (key, how many): torchtitan before 2025-04
    legacy = job.plan.pop("_legacy", False)
    for key in ("pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                "pipeline_parallel_layers_per_stage",
                "pipeline_parallel_first_stage_less_layers",
                "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_split_points",
                "module_fqns_per_model_part"):
        if key in par:
            job.took(f"parallelism.{key}", par[key], "the pipeline" if pp > 1 else
                     "no effect with pipeline_parallel_degree 1")
    if pp == 1:
        job.fix("schedule", "1f1b", pin=False)
        job.fix("virtual_stages", 1, pin=False)
        job.fix("micro_batch", job.plan["_local_batch"])
        return
    points = _split_points(par, where)
    if counted is not None or legacy:
        # before 2025-04 a local batch was cut into pipeline_parallel_microbatches micro-batches
        # (distributed/pipeline.py build_pipeline_schedule); unset, pp of them until 2024-12,
        # pp x stages a rank after: the same for single-stage schedules
        key, count = counted or ("experimental.pipeline_parallel_microbatches", None)
        if count is None and schedule not in _SINGLE_STAGE:
            raise refuse_plan(where, key, "unset", f"with {name} its default changed within "
                              "the versions of this config's names (pp, then pp x stages a "
                              "rank): give it")
        count = pp if count is None else whole(count, key, where)
        if job.plan["_local_batch"] % count:
            raise refuse_plan(where, key, count, f"must divide the local batch "
                              f"({job.plan['_local_batch']}; torchtitan refuses it)")
        micro = job.plan["_local_batch"] // count
    first = whole(par.get("pipeline_parallel_first_stage_less_layers", 1),
                  "parallelism.pipeline_parallel_first_stage_less_layers", where, minimum=0)
    last = whole(par.get("pipeline_parallel_last_stage_less_layers", 1),
                 "parallelism.pipeline_parallel_last_stage_less_layers", where, minimum=0)
    per_stage = par.get("pipeline_parallel_layers_per_stage")
    if per_stage is not None:
        per_stage = whole(per_stage, "parallelism.pipeline_parallel_layers_per_stage", where)
    if job.plan["_local_batch"] % micro:
        raise refuse_plan(where, "parallelism.pipeline_parallel_microbatch_size", micro,
                          f"must divide training.local_batch_size "
                          f"({job.plan['_local_batch']})")
    job.fix("micro_batch", micro)
    job.fix("schedule", schedule)
    layers = job.model.get("layers")
    if layers is None and job.preset is not None:
        from perfmodel.specs.model import load_model

        layers = load_model(job.preset).layers
    split = (where, pp, schedule, name, per_stage, first, last, points, legacy)
    points_key = "parallelism." + ("module_fqns_per_model_part"
                                   if par.get("module_fqns_per_model_part")
                                   else "pipeline_parallel_split_points")
    if layers is None:  # a flavor given by --model: split its layers once it is known
        job.with_model.append(lambda model: _split(job, *split, model.layers, points_key))
    else:
        _split(job, *split, layers, points_key)


def stage_split(layers: int, stages: int, first: int, last: int, where: str) -> list[int]:
    """torchtitan's split of the layers over the stages (distributed/pipeline_parallel.py,
    generate_llm_fqn_per_model_part): the first and the last stage count first and last layers
    more (the embedding's and the output's weights), effective = layers + first + last over the
    stages, the first effective % stages stages one more; torchtitan's refusals."""
    effective = layers + first + last
    per, extra = divmod(effective, stages)
    if stages > effective or per == 0:
        raise refuse_plan(where, "parallelism.pipeline_parallel_degree", stages,
                          f"{stages} stages for {layers} layers (+ {first} + {last}): "
                          "torchtitan refuses empty stages")
    if max(first, last) > per:
        raise refuse_plan(where, "parallelism.pipeline_parallel_first_stage_less_layers",
                          max(first, last), f"exceeds the {per} layers a stage holds "
                          "(torchtitan refuses it)")
    out = [per + (i < extra) for i in range(stages)]
    out[0] -= first
    out[-1] -= last
    if stages > 1 and min(out[0], out[-1]) < 1:
        raise refuse_plan(where, "parallelism.pipeline_parallel_first_stage_less_layers",
                          max(first, last), "leaves the first or the last stage without a "
                          "decoder layer")
    return out


def _split_points(par: dict[str, Any], where: str) -> list[int] | None:
    """The layer each stage after the first starts at, as the config gives them: split points
    ("layers.N": a stage starts at layer N) or the modules of each stage
    (module_fqns_per_model_part: the embedding in the first, the norm and the output in the
    last); None where it gives neither."""
    key = "parallelism.pipeline_parallel_split_points"
    given = par.get("pipeline_parallel_split_points")
    parts = par.get("module_fqns_per_model_part")
    if parts:
        key = "parallelism.module_fqns_per_model_part"
        if not isinstance(parts, list) or not all(isinstance(p, list) and p for p in parts):
            raise refuse_plan(where, key, parts, "a list of the stages' module lists")
        ends = ({"tok_embeddings"}, {"norm", "output"})
        if not ends[0] <= set(parts[0]) or not ends[1] <= set(parts[-1]) or any(
                name in ends[0] | ends[1] for part in parts[1:-1] for name in part):
            raise refuse_plan(where, key, parts, "perfmodel models the embedding on the first "
                              "stage and the norm and the output on the last")
        starts = [[_layer_index(n, key, where) for n in part if n not in ends[0] | ends[1]]
                  for part in parts]
        if any(not s for s in starts) or any(
                s != list(range(s[0], s[0] + len(s))) for s in starts) or any(
                b[0] != a[-1] + 1 for a, b in zip(starts, starts[1:], strict=False)) or \
                starts[0][0] != 0:
            raise refuse_plan(where, key, parts, "each stage must hold a run of layers "
                              "following the previous stage's")
        return [s[0] for s in starts[1:]]
    if not given:
        return None
    if not isinstance(given, list):
        raise refuse_plan(where, key, given, "a list of layer names (\"layers.4\")")
    points = [_layer_index(str(n), key, where) for n in given]
    if points != sorted(set(points)) or points[0] < 1:
        raise refuse_plan(where, key, given, "the stages' first layers in increasing order")
    return points


def _digits(text: str) -> bool:
    """Whether int() reads text as a whole number of at most 9 digits (ASCII: '²' is a digit to
    str.isdigit, not to int)."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def _layer_index(name: str, key: str, where: str) -> int:
    prefix, _, index = name.partition(".")
    if prefix != "layers" or not _digits(index):
        raise refuse_plan(where, key, name, "a stage boundary names a layer, as \"layers.4\"")
    return int(index)


def _legacy_split(layers: int, stages: int) -> list[int]:
    """torchtitan's split of an older config without split points (generate_split_points in
    torchtitan/parallelisms/pipelining_utils.py, later distributed/pipeline.py, 2024-08 to
    2025-04): layers // stages each, the first stage that many, the remainder one more each to
    the stages after it, the last stage what is left."""
    base, extra = divmod(layers, stages)
    out = []
    for i in range(stages - 1):
        more = i > 0 and extra > 0
        extra -= more
        out.append(base + more)
    return out + [layers - sum(out)]


def _split(job: JobConfig, where: str, pp: int, schedule: str, name: str,
           per_stage: int | None, first: int, last: int, points: list[int] | None,
           legacy: bool, layers: int,
           points_key: str = "parallelism.pipeline_parallel_split_points") -> None:
    """The stages per rank (from pipeline_parallel_layers_per_stage, else torchtitan's default: 1
    for single-stage schedules, 2 for the others) and torchtitan's split of the layers over them:
    one stage a rank, first/last_stage_layers where the ranks between hold as many each, else a
    pipeline layout (perfmodel.pipeline_layout), as for several stages a rank. Split points
    (points) give the stages themselves; an older config without them takes its version's split
    (_legacy_split)."""
    if points is not None:
        if points[-1] >= layers:
            raise refuse_plan(where, "parallelism.pipeline_parallel_split_points",
                              f"layers.{points[-1]}", f"the model has {layers} layers")
        bounds = [0, *points, layers]
        split = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        if len(split) % pp:
            raise refuse_plan(where, "parallelism.pipeline_parallel_split_points",
                              f"{len(points)} points", f"{len(split)} stages do not divide over "
                              f"pp {pp} (torchtitan refuses)")
        _place(job, where, pp, schedule, name, len(split) // pp, split, first=0, last=0,
               given=(points_key, f"{len(points)} points"))
        return
    if per_stage is not None:
        stages = math.ceil((layers + first + last) / per_stage)
        if stages % pp:
            raise refuse_plan(where, "parallelism.pipeline_parallel_layers_per_stage", per_stage,
                              f"{stages} stages do not divide over pp {pp} (torchtitan refuses)")
        chunks = stages // pp
    else:
        chunks = 1 if schedule in _SINGLE_STAGE else 2
    if legacy:
        if pp * chunks > layers:
            raise refuse_plan(where, "parallelism.pipeline_parallel_degree", pp,
                              f"{pp * chunks} stages for {layers} layers (torchtitan refuses)")
        split = _legacy_split(layers, pp * chunks)
        first = last = 0
    else:
        split = stage_split(layers, pp * chunks, first, last, where)
    given = ("parallelism.pipeline_parallel_split_points", "unset") if legacy else \
        ("parallelism.pipeline_parallel_layers_per_stage", per_stage) if per_stage is not None \
        else None
    _place(job, where, pp, schedule, name, chunks, split, first, last, given=given)


def _place(job: JobConfig, where: str, pp: int, schedule: str, name: str, chunks: int,
           split: list[int], first: int, last: int,
           given: tuple[str, Any] | None = None) -> None:
    """The plan of a split of the layers over pp x chunks stages (stage s on rank s mod pp;
    ZBVZeroBubble's V: stages r and 2 pp - 1 - r on rank r). `given`: the config key and value
    that set the stages (split points, layers per stage; None: torchtitan's default)."""
    if (schedule in _SINGLE_STAGE) != (chunks == 1):
        raise refuse_plan(where, "parallelism.pipeline_parallel_schedule", name,
                          f"with {chunks} stages per rank (torchtitan refuses)")
    if schedule == "zbv":
        _v_split(where, pp, name, chunks, split, first, last, given)
    job.fix("virtual_stages", chunks)
    fix_split(job, split, chunks, (first > 0, last > 0))
    job.notes.append(f"torchtitan's stages ({pp} x {chunks}): "
                     f"{'/'.join(str(n) for n in split)} layers")


def _v_split(where: str, pp: int, name: str, chunks: int, split: list[int], first: int,
             last: int, given: tuple[str, Any] | None) -> None:
    """A V schedule's stages as perfmodel's schedule zbv models them: two a rank, every one
    holding the same layers. torchtitan splits the layers over the 2 pp stages as for a looped
    schedule (generate_llm_fqn_per_model_part: the first and last stages first/last_stage_less
    _layers fewer, default 1) and then places stages r and 2 pp - 1 - r on rank r, asserting "v
    schedules assume 2 stages per rank" (pipeline_module_split, distributed/pipeline_parallel.py
    at 238fa99 and 9810191bb~1); an uneven split (its defaults' shorter ends) is refused, not
    read as a pipeline layout perfmodel's zbv has none of."""
    if chunks != 2:
        key, value = given or ("parallelism.pipeline_parallel_schedule", name)
        raise refuse_plan(where, key, value, f"gives {chunks} stages a rank, and torchtitan's "
                          f"{name} holds 2 a rank (pipeline_module_split asserts it)")
    if len(set(split)) == 1:
        return
    stages, layers = len(split), sum(split)
    text = (f"with {name} torchtitan splits the {layers} layers over {stages} stages as "
            f"{'/'.join(str(n) for n in split)}, and perfmodel models its V with stages of "
            "equal layers")
    if given is not None and given[0] != "parallelism.pipeline_parallel_layers_per_stage":
        raise refuse_plan(where, given[0], given[1], text + ": give stages of equal layers")
    even = (f"set pipeline_parallel_first_stage_less_layers and last_stage_less_layers to 0 "
            f"({layers // stages} layers a stage)" if layers % stages == 0 else
            f"{layers} layers do not split evenly over {stages} stages")
    raise refuse_plan(where, "parallelism.pipeline_parallel_first_stage_less_layers", first,
                      f"(last_stage_less_layers {last}) {text}: {even}")


def _checkpointing(data: dict[str, Any], job: JobConfig, where: str) -> None:
    ac = data.get("activation_checkpoint", {})
    mode = str(ac.get("mode", "selective"))
    option = str(ac.get("selective_ac_option", "2"))
    for key in ("mode", "selective_ac_option"):
        if key in ac:
            job.took(f"activation_checkpoint.{key}", ac[key], "recompute")
    for key in ("per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
                "preserve_rng_state", "determinism_check", "debug", "memory_budget",
                "visualize_memory_budget_pareto"):
        if key in ac:
            job.skipped(f"activation_checkpoint.{key}", ac[key], "the same recompute's cost")
    if mode == "none":
        job.fix("recompute", "none", pin="mode" in ac)
    elif mode == "full" or (mode == "selective" and option == "1"):
        job.fix("recompute", "full", pin="mode" in ac)
    elif mode == "selective" and option == "op":  # torchtitan's per-op save list
        job.fix("recompute", "op", pin="mode" in ac)
    elif mode == "selective" and _digits(option) and int(option) > 1:
        # selective layer AC: every option-th block wrapped whole (torchtitan
        # torchtitan/distributed/activation_checkpoint.py, _apply_layer_sac)
        job.fix("recompute", "full", pin="mode" in ac)
        job.fix("recompute_every", int(option), pin="mode" in ac)
    elif mode == "selective":  # an option none of the above reads
        shown = option if len(option) <= 24 else f"{option[:12]}... ({len(option)} characters)"
        raise refuse_plan(where, "activation_checkpoint.selective_ac_option", shown,
                          "selective layer AC wraps every N-th block, N a whole number >= 1 "
                          "(or op: per-op selective AC)")
    else:
        raise refuse_plan(where, "activation_checkpoint.mode", mode,
                          "perfmodel models none, full, and selective with option op or a "
                          "whole number >= 1")


def finish(job: JobConfig, gpus: int) -> None:
    """The plan fields that follow from the world size: the data-parallel degree that
    data_parallel_shard_degree -1 takes, FSDP or DDP, the dtype, the global batch."""
    replicate, shard = job.plan.pop("_dp_degrees", (1, -1))
    param, dtype = job.plan.pop("_dtypes", ("bfloat16", "float32"))
    local = job.plan.pop("_local_batch", 1)
    tp, pp, cp = job.plan.get("tp", 1), job.plan.get("pp", 1), job.plan.get("cp", 1)
    if shard == -1:
        rest, left = divmod(gpus, replicate * tp * pp * cp)
        if left or rest < 1:
            raise refuse_plan(job.path, "parallelism.data_parallel_shard_degree", -1,
                              f"{gpus} GPUs do not divide by replicate x tp x pp x cp = "
                              f"{replicate * tp * pp * cp}")
        shard = rest
        if replicate > 1 and shard > 1:
            raise refuse_plan(job.path, "parallelism.data_parallel_replicate_degree", replicate,
                              f"with {shard} shard ranks this is HSDP, not modelled")
        _ddp_alone(job.path, replicate, shard * cp, tp, pp)
    dp = replicate * shard
    fsdp = shard * cp > 1  # FSDP2 over dp_shard x cp (torchtitan's dp_shard_cp mesh)
    if fsdp and replicate > 1:
        raise refuse_plan(job.path, "parallelism.data_parallel_replicate_degree", replicate,
                          f"with cp {cp} this is HSDP, not modelled")
    if job.plan.get("ep", 1) > 1 and not fsdp:
        raise refuse_plan(job.path, "parallelism.expert_parallel_degree", job.plan["ep"],
                          "without FSDP (data_parallel_shard_degree x cp = 1) torchtitan still "
                          "wraps the experts in FSDP for mixed precision: not modelled")
    job.plan.pop("_moe", None)
    job.fix("zero", 3 if fsdp else 0, pin=True)
    if not fsdp:
        job.fix("overlap_param_gather", False, pin=False)
    policy, stated = job.plan.pop("_reshard", ("default", False))
    _reshard_after_forward(job, policy, stated, pp, fsdp)
    mixed = fsdp or (tp == 1 and pp == 1)
    chosen = param if mixed else dtype
    job.fix("dtype", "bf16" if chosen == "bfloat16" else "fp32")
    if not mixed:
        job.notes.append("TP or PP without FSDP: torchtitan trains in training.dtype "
                         f"({dtype}), its mixed precision applies under FSDP only")
    if "global_batch" not in job.plan:
        job.fix("global_batch", local * dp, pin=False)
    if pp > 1 and job.plan["global_batch"] % (dp * local):
        raise refuse_plan(job.path, "training.global_batch_size", job.plan["global_batch"],
                          f"must be a multiple of local_batch_size x dp ({local} x {dp})")
    accumulation = job.plan["global_batch"] // (dp * local)
    if pp > 1 and accumulation > 1:  # train.py runs the schedule once per accumulation step
        job.fix("pipeline_micro_batches", local // job.plan["micro_batch"])
        job.notes.append(f"{accumulation} gradient-accumulation steps, each one pipeline schedule "
                         f"of {local // job.plan['micro_batch']} micro-batches with its fill and "
                         "drain")


def torchtitan_toml(model: Any, plan: Any) -> str:
    """The torchtitan job config of a plan (TOML); PlanError for what torchtitan cannot run."""
    from perfmodel.configs.job import refuse_emit

    dropouts = ("hidden_dropout", "attention_dropout")
    flavor = next((f for f in ("8B", "70B", "405B") if all(
        getattr(model, k) == v for k, v in flavor_model(f).items() if k not in dropouts)), None)
    if flavor is None:
        raise refuse_emit("torchtitan", f"model {model.name}",
                          "not one of torchtitan's llama3 flavors 8B, 70B, 405B")
    if model.hidden_dropout or model.attention_dropout:
        raise refuse_emit("torchtitan", f"model {model.name}'s dropout (hidden "
                          f"{model.hidden_dropout:g}, attention {model.attention_dropout:g})",
                          "torchtitan's Llama trains without dropout")
    mesh = "tp,cp,dp,pp" if plan.cp > 1 else "tp,dp,pp"
    if plan.tp_layout.value != "1d" or ",".join(plan.placement) != mesh:
        raise refuse_emit("torchtitan", "the layout", "torchtitan's mesh is tp innermost, then "
                                                      "cp, dp, pp (1d tensor parallelism)")
    rotate = {ours: theirs for theirs, ours in ROTATE_METHODS.items()}
    if plan.cp > 1 and plan.cp_comm.value not in rotate:
        raise refuse_emit("torchtitan", f"cp_comm {plan.cp_comm.value}",
                          "torchtitan's context parallelism all-gathers K and V or passes "
                          "them around the ring (allgather, p2p)")
    if plan.cp > 1 and plan.zero != 3:
        raise refuse_emit("torchtitan", f"zero {plan.zero} with cp {plan.cp}",
                          "torchtitan shards with FSDP2 over dp x cp (pin --zero 3)")
    if plan.zero not in (0, 3):
        raise refuse_emit("torchtitan", f"zero {plan.zero}", "torchtitan shards with FSDP2 "
                                                            "(zero 3) or replicates (DDP, zero 0)")
    if plan.dtype.value not in ("bf16", "fp32"):
        raise refuse_emit("torchtitan", f"dtype {plan.dtype.value}",
                          "torchtitan trains bf16 (mixed) or fp32")
    fsdp = plan.zero == 3 and plan.dp * plan.cp > 1
    if not fsdp and plan.dp > 1 and (plan.tp > 1 or plan.pp > 1):  # see _ddp_alone
        raise refuse_emit("torchtitan", f"zero {plan.zero} with dp {plan.dp}, tp {plan.tp}, "
                          f"pp {plan.pp}", "torchtitan's DDP runs alone (\"DDP has not "
                          "supported > 1D parallelism\"; pin --zero 3)")
    if model.seq_len % (plan.tp * plan.cp * 2):  # see _seq_len_divisor
        raise refuse_emit("torchtitan", f"seq_len {model.seq_len}", f"torchtitan asserts a "
                          f"multiple of tp x 2 x cp ({plan.tp * plan.cp * 2})")
    mixed = fsdp or (plan.tp == 1 and plan.pp == 1)
    if plan.dtype.value == "bf16" and not mixed:
        raise refuse_emit("torchtitan", "dtype bf16 with tp or pp and no FSDP",
                          "torchtitan's mixed precision needs FSDP there (pin --zero 3)")
    if plan.zero == 3 and plan.dp * plan.cp == 1:
        raise refuse_emit("torchtitan", "zero 3 with dp 1", "torchtitan shards over dp x cp "
                                                            "ranks")
    if plan.recompute.value == "selective":
        raise refuse_emit("torchtitan", "recompute selective",
                          "torchtitan has no attention-core recompute (pin --recompute)")
    if plan.cpu_offload_layers:
        raise refuse_emit("torchtitan", f"cpu_offload_layers {plan.cpu_offload_layers}",
                          "torchtitan has no activation offloading")
    if plan.recompute_method.value != "uniform" or plan.recompute_num_layers > 1:
        raise refuse_emit("torchtitan", f"recompute_method {plan.recompute_method.value} "
                          f"recompute_num_layers {plan.recompute_num_layers}",
                          "torchtitan checkpoints layer by layer (Megatron-LM's methods; give "
                          "--recompute-every for its selective layer AC)")
    if plan.recompute.value == "op" and plan.recompute_every > 1:
        raise refuse_emit("torchtitan", f"recompute op on one layer in {plan.recompute_every}",
                          "torchtitan's per-op policy applies to every layer")
    if plan.master_weights not in (None, "fp32"):
        raise refuse_emit("torchtitan", f"master_weights {plan.master_weights}",
                          "torchtitan's FSDP2 keeps the fp32 parameters as the master")
    if plan.grad_dtype not in (None, "fp32") or plan.optimizer_dtype not in (None, "fp32"):
        raise refuse_emit("torchtitan", "bf16 gradient or optimizer dtypes",
                          "torchtitan's FSDP2 keeps fp32 parameters, gradients and states")
    if plan.sequence_parallel != (plan.tp > 1):
        raise refuse_emit("torchtitan", f"sequence_parallel {plan.sequence_parallel}",
                          "torchtitan's tensor parallelism is always sequence parallel")
    if plan.flash_attention is False:
        raise refuse_emit("torchtitan", "flash_attention false", "torchtitan runs SDPA")
    if not plan.overlap_grad_sync and plan.dp > 1:
        raise refuse_emit("torchtitan", "overlap_grad_sync false",
                          "FSDP2 and DDP overlap the sync with the backward")
    if fsdp and not plan.overlap_param_gather:
        raise refuse_emit("torchtitan", "overlap_param_gather false",
                          "FSDP2 prefetches the next unit's parameters")
    if plan.kernels.value == "fused":
        raise refuse_emit("torchtitan", "kernels fused", "torchtitan's layer runs its modules' "
                          "ops, eager or compiled (pin --kernels eager, or --stack compiled)")
    if plan.stack.value == "cuda-graphs":
        raise refuse_emit("torchtitan", "stack cuda-graphs", "torchtitan compiles without CUDA "
                                                             "graphs (pin --stack compiled)")
    if plan.tp_comm_overlap and plan.stack.value != "compiled":
        raise refuse_emit("torchtitan", "tp_comm_overlap with stack eager",
                          "torchtitan's async TP needs torch.compile (pin --stack compiled)")
    lines = ["[job]", 'description = "perfmodel recommend"', "", "[model]",
             'name = "llama3"', f'flavor = "{flavor}"', "", "[training]"]
    param = "bfloat16" if plan.dtype.value == "bf16" else "float32"
    if plan.pp > 1:
        local = plan.global_batch // plan.dp
    else:
        local = plan.micro_batch
    lines += [f"local_batch_size = {local}", f"global_batch_size = {plan.global_batch}",
              f"seq_len = {model.seq_len}",
              f'mixed_precision_param = "{param}"',
              'dtype = "float32"', "", "[parallelism]",
              f"data_parallel_replicate_degree = {1 if fsdp else plan.dp}",
              f"data_parallel_shard_degree = {plan.dp if fsdp else 1}",
              f"tensor_parallel_degree = {plan.tp}",
              f"pipeline_parallel_degree = {plan.pp}", f"context_parallel_degree = {plan.cp}"]
    if plan.cp > 1:
        lines += [f'context_parallel_rotate_method = "{rotate[plan.cp_comm.value]}"',
                  'context_parallel_load_balancer = "headtail"']
    if plan.tp_comm_overlap:
        lines.append("enable_async_tensor_parallel = true")
    if plan.pp > 1:
        lines += _pipeline_lines(model, plan)
    if plan.recompute.value == "op":  # the per-op save list
        checkpoint = ['mode = "selective"', 'selective_ac_option = "op"']
    elif plan.recompute.value == "full" and plan.recompute_every > 1:  # selective layer AC
        checkpoint = ['mode = "selective"', f'selective_ac_option = "{plan.recompute_every}"']
    else:
        checkpoint = [f'mode = "{plan.recompute.value}"']
    compiled = "true" if plan.stack.value == "compiled" else "false"
    # the loss compiled with the blocks but where the plan has the eager one (_compiled_loss)
    components = '["model"]' if plan.cross_entropy.value == "torch" else '["model", "loss"]'
    lines += ["", "[activation_checkpoint]", *checkpoint, "", "[compile]",
              f"enable = {compiled}"] + ([f"components = {components}"] if compiled == "true"
                                         else [])
    lines.append("")
    return "\n".join(lines)


def _pipeline_lines(model: Any, plan: Any) -> list[str]:
    """The [parallelism] pipeline keys: the schedule, the micro-batch, the layers per stage and
    how many fewer the first and the last stage hold (an uneven plan: one stage per rank)."""
    from perfmodel.configs.job import refuse_emit

    if plan.pipeline_layout:
        raise refuse_emit("torchtitan", f"pipeline_layout {plan.pipeline_layout}",
                          "torchtitan splits the layers evenly, the first and last stage "
                          "shortened by a number of layers")
    if (plan.schedule.value in _SINGLE_STAGE) == (plan.virtual_stages > 1):
        raise refuse_emit("torchtitan", f"schedule {plan.schedule.value} with virtual_stages "
                          f"{plan.virtual_stages}", "torchtitan runs its interleaved schedules "
                          "with several stages a rank, its others with one")
    first, last = plan.first_stage_layers, plan.last_stage_layers
    given = (first > 0) + (last > 0)
    per_stage = (model.layers - first - last) // max(1, plan.pp - given) if given else \
        model.layers // (plan.pp * plan.virtual_stages)
    if given and (plan.virtual_stages != 1 or plan.pp == given or first > per_stage
                  or last > per_stage):
        raise refuse_emit("torchtitan", f"first_stage_layers {first}, last_stage_layers {last}",
                          "torchtitan shortens the first and last stage of one stage per rank, "
                          "never lengthens them")
    return [f'pipeline_parallel_schedule = "{SCHEDULE_NAMES[plan.schedule.value]}"',
            f"pipeline_parallel_microbatch_size = {plan.micro_batch}",
            f"pipeline_parallel_layers_per_stage = {per_stage}",
            f"pipeline_parallel_first_stage_less_layers = {per_stage - first if first else 0}",
            f"pipeline_parallel_last_stage_less_layers = {per_stage - last if last else 0}"]
