"""DeepSpeed: a config JSON (ds_config.json) beside a Hugging Face model, read as a plan, and a plan
written as one with the launch arguments of the Hugging Face Trainer.

Keys and defaults are DeepSpeed's (deepspeed/runtime/config.py, constants.py and
zero/config.py; the config-json documentation):
  - train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-
    parallel ranks (any two give the third); "auto" is filled in by the Hugging Face Trainer from
    its own arguments, which perfmodel does not see (give --micro-batch, --global-batch);
  - zero_optimization.stage 0-3 is ZeRO's stage; overlap_comm defaults to true at stage 3 and
    false below; offload_optimizer / offload_param (the host or NVMe) are not modelled;
  - bf16.enabled / fp16.enabled choose the 16-bit type, neither: fp32.
The config holds no model (give --model, a Hugging Face config.json or a preset) and no activation
checkpointing of a Hugging Face model (the Trainer's gradient_checkpointing: give --recompute
full); the model's attention is the Hugging Face default, SDPA (fused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfmodel.configs.job import (
    Framework,
    JobConfig,
    not_a_flag,
    refuse_plan,
    refuse_spec,
    typo,
    whole,
)
from perfmodel.errors import PlanError, SpecError

_IGNORED = {
    "an optimizer or schedule hyperparameter": (
        "scheduler", "gradient_clipping", "prescale_gradients", "gradient_predivide_factor",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "sparse_gradients"),
    "logging or monitoring": (
        "steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
        "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler",
        "timers", "checkpoint", "aio", "data_efficiency", "curriculum_learning",
        "train_micro_batch_size_per_gpu_comment"),
}
_READ = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
         "zero_optimization", "bf16", "bfloat16", "fp16", "optimizer", "activation_checkpointing",
         "communication_data_type", "data_types", "amp", "pipeline", "tensor_parallel",
         "sequence_parallel_size", "elasticity", "compression_training", "autotuning",
         "sparse_attention", "zero_optimization_comment")
_ZERO_READ = ("stage", "overlap_comm", "offload_optimizer", "offload_param", "cpu_offload",
              "cpu_offload_params")
# ZeRO 3's prefetch bucket (its names before and after DeepSpeed's config models took aliases)
_PREFETCH = ("stage3_prefetch_bucket_size", "prefetch_bucket_size")
# ZeRO++ (Wang et al. 2023: qwZ, qgZ, hpZ) and MiCS: refused where on (hpZ and MiCS: a group
# size above 1; zero_hpz_partition_size 1 is DeepSpeed's default, MiCS's -1 off)
_ZERO_PLUS_PLUS = ("zero_quantized_weights", "zero_quantized_nontrainable_weights",
                   "zero_quantized_gradients", "zero_hpz_partition_size", "mics_shard_size")
_ZERO_IGNORED = ("allgather_partitions", "allgather_bucket_size", "reduce_scatter",
                 "reduce_bucket_size", "contiguous_gradients", "round_robin_gradients",
                 "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                 "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                 "stage3_gather_16bit_weights_on_model_save",
                 "stage3_gather_fp16_weights_on_model_save", "elastic_checkpoint",
                 "load_from_fp32_weights", "ignore_unused_parameters", "legacy_stage1",
                 "memory_efficient_linear", "model_persistence_threshold", "max_live_parameters",
                 "max_reuse_distance", "prefetch_bucket_size", "param_persistence_threshold",
                 "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings")


# a bf16 or fp16 section's keys that keep ZeRO's states in 16 bits (DeepSpeed PR #7700's
# bf16_master_weights_and_grads and bf16_optimizer_states; fp16_master_weights_and_grads)
_LOW_STATES = ("bf16_master_weights_and_grads", "bf16_optimizer_states",
               "fp16_master_weights_and_grads")


def _zero_plus_plus_on(key: str, value: Any, where: str) -> bool:
    """Whether a ZeRO++ or MiCS key turns it on: a quantization flag true, hpZ's partition
    above 1 rank (its default 1), MiCS's shard above 0 ranks (its default -1)."""
    if key.startswith("zero_quantized"):
        return _flag(value, f"zero_optimization.{key}", where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: zero_optimization.{key} must be a number of ranks, got "
                        f"{value!r}")
    return value > (1 if key == "zero_hpz_partition_size" else 0)


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


# the words DeepSpeed's config models (pydantic, lax: deepspeed/runtime/config_utils.py
# DeepSpeedConfigModel) read as a bool, besides true and false and the numbers 1 and 0
_TRUE_WORDS = ("true", "1", "yes", "y", "on", "t")
_FALSE_WORDS = ("false", "0", "no", "n", "off", "f")


def _flag(value: Any, key: str, where: str) -> bool:
    """A yes-or-no setting as DeepSpeed's config model reads it: true or false, 1 or 0, or a
    word pydantic takes for one ("false" is false: never Python's truth of a non-empty
    string); anything else refused, naming the key."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise not_a_flag(where, key, value)


def read_deepspeed(data: dict[str, Any], path: Path) -> JobConfig:
    """A DeepSpeed config, read."""
    where = str(path)
    job = JobConfig(path=where, framework=Framework.DEEPSPEED)
    job.needs_model = "a DeepSpeed config holds no model (give --model: a Hugging Face " \
                      "directory or config.json, or a preset)"
    ignored = {k: reason for reason, keys in _IGNORED.items() for k in keys}
    for key, value in data.items():
        if key == "_comment":  # JSON's stand-in for a comment
            continue
        if key in ignored:
            job.skipped(key, _short(value), ignored[key])
        elif key not in _READ:
            close = typo(key, (*_READ, *ignored))
            if close:
                raise SpecError(f"{where}: unknown DeepSpeed key '{key}'{close}")
            job.strange(key, _short(value))
    for key, why in (("pipeline", "DeepSpeed's pipeline engine"),
                     ("tensor_parallel", "DeepSpeed's automatic tensor parallelism"),
                     ("sparse_attention", "sparse attention"),
                     ("compression_training", "compression training"),
                     ("amp", "Apex AMP")):
        section = data.get(key)
        if section and not (isinstance(section, dict) and "enabled" in section
                            and not _flag(section["enabled"], f"{key}.enabled", where)):
            raise refuse_plan(where, key, "(a section)", f"{why} is not modelled")
    _zero(data, job, where)
    _precision(data, job, where)
    # the gradients' dtypes follow the model's (in finish where the dtype is the Trainer's 'auto')
    gradients = (data.get("communication_data_type"),
                 _object(data, "data_types", where).get("grad_accum_dtype"))
    if job.plan.get("_dtype_auto"):
        job.plan["_gradients"] = gradients
    else:
        _gradients(job, where, *gradients)
    _batch(data, job, where)
    optimizer = data.get("optimizer")
    if isinstance(optimizer, dict):
        kind = str(optimizer.get("type", "Adam"))
        if kind.lower() not in ("adam", "adamw", "fusedadam"):
            raise refuse_plan(where, "optimizer.type", kind,
                              "perfmodel models Adam's states (2 fp32 moments)")
        job.took("optimizer.type", kind, "Adam")
    checkpointing = _object(data, "activation_checkpointing", where)
    for key in ("partition_activations", "cpu_checkpointing"):
        if key in checkpointing and _flag(checkpointing[key],
                                          f"activation_checkpointing.{key}", where):
            raise refuse_plan(where, f"activation_checkpointing.{key}", True,
                              "partitioned or host-offloaded checkpoints are not modelled")
    if checkpointing:
        job.skipped("activation_checkpointing", _short(checkpointing),
                    "configures deepspeed.checkpointing for models that call it; a Hugging Face "
                    "model's recompute is the Trainer's gradient_checkpointing (give --recompute)")
    for key in ("sequence_parallel_size",):
        if data.get(key) not in (None, 1):
            raise refuse_plan(where, key, data[key], "Ulysses sequence parallelism is not "
                                                     "modelled")
    if isinstance(data.get("elasticity"), dict) and "enabled" in data["elasticity"] \
            and _flag(data["elasticity"]["enabled"], "elasticity.enabled", where):
        raise refuse_plan(where, "elasticity.enabled", True, "an elastic batch is not modelled")
    # a Hugging Face model under DeepSpeed's engine: data parallel (ZeRO) alone; its experts are
    # plain modules ZeRO shards over dp (no expert groups: those are deepspeed.moe.layer.MoE's,
    # which a Hugging Face MoE block is not), and no context parallelism
    for key in ("tp", "pp", "cp", "ep", "etp"):
        job.fix(key, 1)
    job.fix("virtual_stages", 1)
    job.fix("schedule", "1f1b")
    job.fix("sequence_parallel", False)
    job.fix("tp_layout", "1d")
    job.fix("placement", "tp,dp,pp")
    job.fix("flash_attention", True)
    job.notes.append("attention: the Hugging Face model's default, SDPA (fused: "
                     "flash_attention)")
    job.notes.append("recompute: the Trainer's gradient_checkpointing is not in the DeepSpeed "
                     "config; none unless --recompute full is given")
    return job


def _object(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """The section at key ({} where absent, null or empty), or SpecError naming it."""
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise SpecError(f"{where}: {key} must be an object")
    return section


def _short(value: Any) -> Any:
    return json.dumps(value, sort_keys=True)[:60] if isinstance(value, (dict, list)) else value


# ZeRO 3's release rule: a parameter used again within stage3_max_reuse_distance elements of
# fetches stays gathered (DeepSpeed's default 1e9, as stage3_max_live_parameters)
_ZERO_KEPT = ("stage3_max_live_parameters", "stage3_max_reuse_distance", "max_live_parameters",
              "max_reuse_distance")


def _zero(data: dict[str, Any], job: JobConfig, where: str) -> None:
    zero = _object(data, "zero_optimization", where)
    for key, value in zero.items():
        if key == "reduce_scatter" and not _flag(value, "zero_optimization.reduce_scatter",
                                                 where) and zero.get("stage", 0) in (1, 2):
            # DeepSpeed ZeRO 1-2 then all-reduce each gradient bucket (stage_1_and_2.py,
            # average_tensor: gradient_reduction_w_predivide), twice a reduce-scatter's traffic
            raise refuse_plan(where, "zero_optimization.reduce_scatter", False,
                              "ZeRO 1-2 all-reducing the gradients instead of reduce-scattering "
                              "them is not modelled: give true (DeepSpeed's default)")
        if key == "reduce_bucket_size" and zero.get("stage", 0) in (1, 2):
            continue  # read with overlap_comm (_buckets)
        if key in _PREFETCH and zero.get("stage", 0) == 3:
            continue  # read with the stage (_prefetch)
        if key in _ZERO_PLUS_PLUS and _zero_plus_plus_on(key, value, where):
            # ZeRO++ (quantized weights and gradients, hierarchical partitions) and MiCS
            # change the gathers' and reductions' bytes and groups
            raise refuse_plan(where, f"zero_optimization.{key}", value,
                              "ZeRO++ and MiCS (quantized or hierarchical gathers and "
                              "reductions) are not modelled")
        if key in _ZERO_KEPT:
            job.skipped(f"zero_optimization.{key}", value, "how many gathered parameters ZeRO 3 "
                        "keeps (see the note on the release rule)")
        elif key in _ZERO_IGNORED:
            job.skipped(f"zero_optimization.{key}", value, "a bucket size, threshold or saving "
                                                           "option (the same communication)")
        elif key not in _ZERO_READ:
            close = typo(key, (*_ZERO_READ, *_ZERO_IGNORED))
            if close:
                raise SpecError(f"{where}: unknown DeepSpeed key zero_optimization.{key}{close}")
            job.strange(f"zero_optimization.{key}", value)
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key)
        device = section.get("device", "none") if isinstance(section, dict) else section
        if section and str(device).lower() not in ("none", "false"):
            raise refuse_plan(where, f"zero_optimization.{key}.device", device,
                              "offloading optimizer states or weights to the host or NVMe is not "
                              "modelled (perfmodel keeps every state in GPU memory)")
    for key in ("cpu_offload", "cpu_offload_params"):
        if key in zero and _flag(zero[key], f"zero_optimization.{key}", where):
            raise refuse_plan(where, f"zero_optimization.{key}", True,
                              "offloading to the host is not modelled")
    stage = zero.get("stage", 0)
    if _auto(stage) or isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise SpecError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    job.fix("zero", stage)
    job.took("zero_optimization.stage", stage, f"zero {stage}")
    if stage == 3:
        job.notes.append("ZeRO 3 keeps a parameter gathered where it is used again within "
                         "stage3_max_reuse_distance elements of fetches (default 1e9): the last "
                         "layers from the forward into the backward, a model that small whole; "
                         "perfmodel gathers every layer again for the backward (not modelled: "
                         "it counts those gathers, and not the layers kept)")
    overlap = zero.get("overlap_comm")
    if overlap is None or _auto(overlap):
        overlap = stage == 3
        job.notes.append(f"zero_optimization.overlap_comm not given: DeepSpeed's default for "
                         f"stage {stage}, {str(overlap).lower()}")
    else:
        overlap = _flag(overlap, "zero_optimization.overlap_comm", where)
        job.took("zero_optimization.overlap_comm", zero["overlap_comm"],
                 f"overlap_grad_sync {str(overlap).lower()}")
    job.fix("overlap_grad_sync", overlap)
    if stage in (1, 2):
        _buckets(zero, overlap, job, where)
    # ZeRO 3 prefetches the next modules' parameters (stage3_prefetch_bucket_size, on by
    # default); ZeRO 1-2 gather the updated parameters inside the optimizer step
    job.fix("overlap_param_gather", stage == 3 and _prefetch(zero, job, where), pin=False)


def _prefetch(zero: dict[str, Any], job: JobConfig, where: str) -> bool:
    """Whether ZeRO 3 prefetches the next modules' parameters: unless its prefetch bucket is 0
    (deepspeed/runtime/zero/partitioned_param_coordinator.py, fetch_sub_module prefetches only
    where the bucket is above 0: each module's gather then waits in its pass)."""
    for key in _PREFETCH:
        if key in zero and not _auto(zero[key]):
            value = zero[key]
            try:  # a number, or its text as DeepSpeed's lax config models read one ("5e8")
                size = float(value) if not isinstance(value, bool) else -1.0
            except (TypeError, ValueError):
                size = -1.0
            if not 0 <= size < float("inf"):
                raise SpecError(f"{where}: zero_optimization.{key} must be a number of "
                                f"elements (0: no prefetch), got {value!r}")
            on = size > 0
            job.took(f"zero_optimization.{key}", value, "overlap_param_gather "
                     + ("true (the next modules prefetched)" if on else
                        "false (no prefetch: each module's gather waits)"))
            return on
    return True


# DeepSpeed's default zero_optimization.reduce_bucket_size (deepspeed/runtime/zero/config.py)
DEEPSPEED_BUCKET = 500_000_000


def _buckets(zero: dict[str, Any], overlap: bool, job: JobConfig, where: str) -> None:
    """ZeRO 1-2 with overlap_comm reduce the gradients bucket by bucket as the backward fills
    them, reduce_bucket_size elements a bucket over every parameter (stage_1_and_2.py's
    ipg buckets; default 5e8): the plan's dp_bucket_size, dp_bucketing all. Without overlap the
    reduction after the backward is costed as one sync."""
    stated = zero.get("reduce_bucket_size")
    key = "zero_optimization.reduce_bucket_size"
    if not overlap:
        if stated is not None:
            job.skipped(key, stated, "the buckets of an overlapped reduction (overlap_comm): "
                                     "no effect here")
        return
    if stated is not None and _auto(stated):
        # the Hugging Face Trainer fills it in with the model's hidden size squared
        # (transformers' integrations/deepspeed.py, HfTrainerDeepSpeedConfig.
        # trainer_config_finalize), once the model is known
        def from_model(model: Any) -> None:
            size = model.hidden * model.hidden
            job.notes.append(f"{key} auto: the Hugging Face Trainer's hidden x hidden, "
                             f"{model.hidden} x {model.hidden} = {size:,} elements "
                             "(dp_bucket_size)")
            job.fix("dp_bucket_size", size, pin=False)

        job.with_model.append(from_model)
        job.fix("dp_bucketing", "all", pin=False)
        return
    if stated is None:
        size = DEEPSPEED_BUCKET
        job.notes.append(f"{key} not given: DeepSpeed's default, {size:,} elements "
                         "(dp_bucket_size)")
    else:
        if isinstance(stated, bool) or not isinstance(stated, (int, float)) \
                or not 1 <= stated <= 10**13 or stated != int(stated):
            raise SpecError(f"{where}: {key} must be a whole number of elements (1 to 1e13), "
                            f"got {stated!r}")
        size = int(stated)
        job.took(key, stated, f"dp_bucket_size {size:,} (a bucket of the reduction)")
    job.fix("dp_bucket_size", size, pin=False)
    job.fix("dp_bucketing", "all", pin=False)


def _precision(data: dict[str, Any], job: JobConfig, where: str) -> None:
    found = {}
    for key in ("bf16", "bfloat16", "fp16"):
        section = data.get(key)
        if section is not None and not isinstance(section, dict):  # DeepSpeed cannot read it
            raise refuse_spec(where, key, section, 'must be an object, such as {"enabled": '
                                                   'true}')
        if isinstance(section, dict) and "enabled" in section:
            enabled = section["enabled"]
            found[key] = enabled if _auto(enabled) else _flag(enabled, f"{key}.enabled", where)
            job.took(f"{key}.enabled", enabled, "the dtype" if _auto(enabled)
                     else f"{key} {'on' if found[key] else 'off'}")
            for k, v in section.items():
                if k in _LOW_STATES and v not in (None, False):
                    # DeepSpeedBF16Config / DeepSpeedFP16Config: ZeRO's master weights,
                    # gradients or Adam moments in 16 bits, not modelled under DeepSpeed
                    raise refuse_plan(where, f"{key}.{k}", v,
                                      "ZeRO's master weights, gradients or optimizer states "
                                      "in 16 bits are not modelled under DeepSpeed")
                if k != "enabled":
                    job.skipped(f"{key}.{k}", v, "loss scaling (the same step)")
    if any(_auto(v) for v in found.values()):
        job.plan["_dtype_auto"] = True
        return
    on = [k for k, v in found.items() if v is True]
    if len(on) > 1:
        raise SpecError(f"{where}: {' and '.join(on)} are both enabled; DeepSpeed takes one")
    dtype = "fp16" if on == ["fp16"] else "bf16" if on else "fp32"
    job.fix("dtype", dtype)
    if not on:
        job.notes.append("neither bf16 nor fp16 enabled: DeepSpeed trains fp32")


def _batch(data: dict[str, Any], job: JobConfig, where: str) -> None:
    values = {}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps"):
        if key in data:
            value = data[key]
            if _auto(value):
                job.took(key, value, "filled in by the Hugging Face Trainer: give it to "
                                     "perfmodel (--micro-batch, --global-batch)")
                job.plan.setdefault("_auto", []).append(key)
                continue
            values[key] = whole(value, key, where)
            job.took(key, value, {"train_batch_size": "global_batch",
                                  "train_micro_batch_size_per_gpu": "micro_batch",
                                  "gradient_accumulation_steps": "micro-batches per step"}[key])
    micro = values.get("train_micro_batch_size_per_gpu")
    accum = values.get("gradient_accumulation_steps")
    batch = values.get("train_batch_size")
    if micro is not None:
        job.fix("micro_batch", micro)
    if batch is not None:
        job.fix("global_batch", batch)
    if micro is not None and accum is not None and batch is not None:
        if batch % (micro * accum):
            raise SpecError(f"{where}: train_batch_size {batch} is not train_micro_batch_size_"
                            f"per_gpu {micro} x gradient_accumulation_steps {accum} x the GPUs "
                            "(DeepSpeed refuses it)")
        job.gpus = batch // (micro * accum)
        job.gpus_from = "train_batch_size / (micro-batch x gradient accumulation)"
    job.plan["_accumulation"] = accum  # finish() completes the batch as DeepSpeed does


# DeepSpeed's dtype names (deepspeed/runtime/config_utils.py DtypeEnum)
_DTYPE_NAMES = {"fp32": ("fp32", "float32", "float", "torch.float32"),
                "fp16": ("fp16", "float16", "half", "torch.float16"),
                "bf16": ("bf16", "bfloat16", "torch.bfloat16")}


def _dtype_of(value: Any, key: str, where: str) -> str | None:
    if value is None:
        return None
    for name, spellings in _DTYPE_NAMES.items():
        if isinstance(value, str) and value.strip().lower() in spellings:
            return name
    raise refuse_spec(where, key, value, "DeepSpeed takes fp32, fp16 or bf16")


def _gradients(job: JobConfig, where: str, comm_value: Any, accum_value: Any) -> None:
    """The gradients' dtypes and DeepSpeed's optimizer wrapper for the model's dtype
    (deepspeed/runtime/engine.py at edaa72212, v0.18: get_data_types, communication_data_type,
    _do_optimizer_sanity_check): the gradients are reduced in communication_data_type, by
    default the model's dtype, and accumulated in data_types.grad_accum_dtype, by default the
    model's dtype under ZeRO."""
    dtype = job.plan.get("dtype", "fp32")
    zero = int(job.plan.get("zero", 0))
    comm = _dtype_of(comm_value, "communication_data_type", where)
    accum = _dtype_of(accum_value, "data_types.grad_accum_dtype", where)
    if dtype == "bf16" and zero == 0:
        raise refuse_plan(
            where, "zero_optimization.stage", 0,
            "with bf16, DeepSpeed before v0.17.6 runs its BF16_Optimizer (write stage 1 with "
            "data_types.grad_accum_dtype fp32, which every version since v0.8.1 runs so), and "
            "from v0.17.6 an unsharded FP16_Optimizer in bf16, not modelled "
            "(engine._do_optimizer_sanity_check)")
    if dtype == "bf16" and zero == 1 and accum == "fp32":
        # BF16_Optimizer (since v0.8.1; no offload, which is refused here): its fp32 master
        # weights and states sharded over dp, each micro-batch's bf16 gradients added into fp32
        # ones, all-reduced in fp32 after the backward, neither overlapped
        if comm not in (None, "fp32"):
            raise refuse_plan(where, "communication_data_type", comm_value,
                              "DeepSpeed's BF16_Optimizer (stage 1 with fp32 gradient "
                              "accumulation) is modelled reducing its fp32 gradients")
        job.fix("zero", 1)
        job.fix("bf16_optimizer", True)
        job.fix("overlap_grad_sync", False)
        job.fix("overlap_param_gather", False)
        job.notes.append("bf16 at ZeRO stage 1 with fp32 gradient accumulation: DeepSpeed's "
                         "BF16_Optimizer, zero 1 with bf16_optimizer (each micro-batch's bf16 "
                         "gradients added into fp32 ones, all-reduced in fp32 after the "
                         "backward)")
        return
    reduce = comm or dtype
    if dtype != "bf16":
        for key, value, got in (("communication_data_type", comm_value, comm),
                                ("data_types.grad_accum_dtype", accum_value, accum)):
            if got not in (None, dtype):
                raise refuse_plan(where, key, value, f"a {dtype} model's gradients are modelled "
                                                     f"kept and reduced in {dtype}")
        return
    if reduce == "fp16":
        raise refuse_plan(where, "communication_data_type", comm_value,
                          "a bf16 model's gradients reduced in fp16 are not modelled")
    if accum not in (None, reduce):
        raise refuse_plan(where, "data_types.grad_accum_dtype", accum_value,
                          f"gradients accumulated in {accum} and reduced in {reduce}: "
                          "perfmodel keeps and reduces them in one dtype")
    if reduce == "bf16":
        job.fix("grad_dtype", "bf16")
        if comm is None:
            job.notes.append("communication_data_type unset: DeepSpeed keeps and reduces the "
                             "gradients in the model's dtype, bf16 (grad_dtype bf16)")
    else:
        job.notes.append("communication_data_type fp32: gradients reduced in fp32, counted as "
                         "fp32 main gradients (DeepSpeed accumulates them in bf16 under ZeRO: "
                         "2 bytes a parameter fewer than counted, before ZeRO 2's sharding)")


def finish(job: JobConfig, gpus: int) -> None:
    """The batch fields that follow from the world size, by DeepSpeed's rule
    (DeepSpeedConfig._set_batch_related_parameters and _batch_assertion in
    deepspeed/runtime/config.py): of train_batch_size, train_micro_batch_size_per_gpu and
    gradient_accumulation_steps, two give the third over the data-parallel ranks; the batch
    alone or the micro-batch alone take one micro-batch a step; neither is refused. --micro-batch
    and --global-batch stand in for what the config leaves out or to the Trainer ('auto')."""
    if job.plan.pop("_dtype_auto", False) and "dtype" not in job.plan:
        raise PlanError(f"{job.path}: bf16/fp16 enabled 'auto' (the Hugging Face Trainer fills "
                        "it in from its own arguments): give --dtype")
    if "_gradients" in job.plan:
        _gradients(job, job.path, *job.plan.pop("_gradients"))
    for key, field_name, flag in (("train_micro_batch_size_per_gpu", "micro_batch",
                                   "--micro-batch"),
                                  ("train_batch_size", "global_batch", "--global-batch")):
        if key in job.plan.pop("_auto", ()) and field_name not in job.plan:
            raise PlanError(f"{job.path}: {key} 'auto' (the Hugging Face Trainer fills it in "
                            f"from its own arguments): give {flag}")
    accum: Any = job.plan.pop("_accumulation", None)
    batch: Any = job.plan.get("global_batch")
    micro: Any = job.plan.get("micro_batch")
    model_parallel = (int(job.plan.get("tp", 1)) * int(job.plan.get("pp", 1))
                      * int(job.plan.get("cp", 1)))
    dp = max(gpus // model_parallel, 1)
    if batch is None and micro is None:
        raise PlanError(f"{job.path}: neither train_batch_size nor train_micro_batch_size_per_gpu "
                        + (f"(only gradient_accumulation_steps {accum}) " if accum else "")
                        + "is given, and DeepSpeed needs one: give --micro-batch or "
                        "--global-batch")
    if batch is None:  # the micro-batch, and the accumulation or one
        accum = accum or 1
        batch = micro * accum * dp
    elif micro is None:  # the batch, and the accumulation or one
        accum = accum or 1
        micro = batch // dp // accum
    elif accum is None:
        accum = batch // micro // dp
    if micro < 1 or accum < 1 or batch != micro * accum * dp:
        raise SpecError(f"{job.path}: train_batch_size {batch} is not train_micro_batch_size_"
                        "per_gpu x gradient_accumulation_steps x the data-parallel ranks "
                        f"({micro} x {accum} x {dp} = {micro * accum * dp}; DeepSpeed refuses "
                        "it)")
    job.fix("micro_batch", micro)
    job.fix("global_batch", batch)


def ds_config(plan: Any) -> dict[str, Any]:
    """The DeepSpeed config of a plan; PlanError for what DeepSpeed with a Hugging Face model
    cannot run."""
    from perfmodel.configs.job import refuse_emit

    if plan.tp > 1 or plan.pp > 1:
        raise refuse_emit("deepspeed", f"tp {plan.tp}, pp {plan.pp}",
                          "DeepSpeed with a Hugging Face model is data parallel (ZeRO) only: "
                          "pin --tp 1 --pp 1, or emit megatron")
    if plan.cpu_offload_layers:
        raise refuse_emit("deepspeed", f"cpu_offload_layers {plan.cpu_offload_layers}",
                          "the Trainer's job offloads no activations")
    if plan.recompute_method.value != "uniform" or plan.recompute_num_layers > 1:
        raise refuse_emit("deepspeed", f"recompute_method {plan.recompute_method.value} "
                          f"recompute_num_layers {plan.recompute_num_layers}",
                          "the Trainer's gradient_checkpointing recomputes every layer whole")
    if plan.recompute.value in ("selective", "op") or plan.recompute_every > 1:
        raise refuse_emit("deepspeed", f"recompute {plan.recompute.value}"
                                       + (f" on one layer in {plan.recompute_every}"
                                          if plan.recompute_every > 1 else ""),
                          "the Trainer's gradient_checkpointing recomputes every layer whole")
    if plan.master_weights not in (None, "fp32"):
        raise refuse_emit("deepspeed", f"master_weights {plan.master_weights}",
                          "written configs keep DeepSpeed's fp32 master weights")
    if plan.optimizer_dtype not in (None, "fp32"):
        raise refuse_emit("deepspeed", "bf16 optimizer states",
                          "written configs keep DeepSpeed's fp32 optimizer states")
    if plan.dtype.value == "bf16" and plan.zero == 0:
        raise refuse_emit("deepspeed", "zero 0 with bf16", "DeepSpeed's optimizer without ZeRO "
                          "in bf16 differs by version; its BF16_Optimizer is the plan's "
                          "bf16_optimizer, zero 1")
    if plan.dtype.value not in ("bf16", "fp16", "fp32"):
        raise refuse_emit("deepspeed", f"dtype {plan.dtype.value}", "DeepSpeed trains bf16, "
                                                                     "fp16 or fp32")
    if plan.flash_attention is False:
        raise refuse_emit("deepspeed", "flash_attention false",
                          "a Hugging Face model runs SDPA (fused) by default")
    if plan.overlap_param_gather and plan.zero in (1, 2):
        raise refuse_emit("deepspeed", f"overlap_param_gather with zero {plan.zero}",
                          "ZeRO 1-2 gather the updated parameters in the optimizer step "
                          "(pin --no-overlap-param-gather)")
    if plan.zero == 3 and plan.dp > 1 and not plan.overlap_param_gather:
        raise refuse_emit("deepspeed", "overlap_param_gather false with zero 3",
                          "ZeRO 3 prefetches the parameters")
    if plan.tp_comm_overlap or plan.stack.value != "eager":
        raise refuse_emit("deepspeed", "tp_comm_overlap or a compiled stack",
                          "a Hugging Face model under DeepSpeed runs eagerly, data parallel")
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_micro_batches,
        "bf16": {"enabled": plan.dtype.value == "bf16"},
        "fp16": {"enabled": plan.dtype.value == "fp16"},
        "zero_optimization": {"stage": plan.zero, "overlap_comm": plan.overlap_grad_sync},
        "gradient_clipping": 1.0, "steps_per_print": 100, "wall_clock_breakdown": False}
    if plan.zero in (1, 2) and plan.overlap_grad_sync:
        # the buckets the plan was costed with (DeepSpeed's own default, 5e8, is not the
        # search's: a config without it read back 13% slower, gpt2-small on 8 H100 PCIe)
        config["zero_optimization"]["reduce_bucket_size"] = plan.bucket_params
    if plan.bf16_optimizer:
        # DeepSpeed's BF16_Optimizer in every version since v0.8.1: stage 1 with fp32 gradient
        # accumulation (stage 0 runs it only before v0.17.6)
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    elif plan.dtype.value == "bf16" and plan.grad_dtype in (None, "fp32"):
        config["communication_data_type"] = "fp32"  # (by default the model's dtype)
    return config
