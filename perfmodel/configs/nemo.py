"""Megatron-Bridge and NeMo 2 recipe YAML, read as Megatron settings (perfmodel.configs.megatron
maps those onto a model and a plan).

Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge, megatron/bridge/training/config.py): a
ConfigContainer dumped as YAML (`_target_: megatron.bridge.training.config.ConfigContainer`), or
an override file of its sections: `model` (a GPTModelProvider: Megatron-Core TransformerConfig's
fields, parallel sizes among them), `train` (micro_batch_size, global_batch_size), `ddp`
(use_distributed_optimizer, overlap_grad_reduce, overlap_param_gather), `optimizer`,
`mixed_precision` (a MixedPrecisionConfig or a recipe name such as bf16_mixed), `comm_overlap`,
`dataset` (sequence_length, which Bridge asserts equal to model.seq_length: refused where
they differ), `tokenizer`, `dist`; the older override names `model_config`,
`train_config`, `ddp_config`, `optimizer_config` and `dataset_config` too. It holds no world
size: give --gpus. An override file (no ConfigContainer or provider _target_) states only what it
overrides of its recipe's config: its model over --model's, the plan fields it does not state
left to the command line (is_override, _over_the_recipe).

NeMo 2 (NVIDIA/NeMo, nemo.collections.llm recipes serialized by nemo_run): `trainer` (devices,
num_nodes, strategy: MegatronStrategy's tensor/pipeline/virtual-pipeline/context/expert parallel
sizes, sequence_parallel, ddp; plugins: MegatronMixedPrecision's precision, fp8, fp8_recipe,
fp8_params and grad_reduce_in_fp32, over the model's and the DDP's), `data`
(micro_batch_size, global_batch_size, seq_length: the sequence NeMo 2 trains at, over
model.config.seq_length; _nemo2_sequence), `model.config` (a GPTConfig subclass named by
`_target_`, e.g. Llama3Config8B, with fields overriding its defaults), `optim.config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.configs import nemo1
from perfmodel.configs.job import (
    CAPACITY,
    WINDOW,
    Framework,
    JobConfig,
    Setting,
    capacity,
    deferred_wgrad_note,
    refuse_plan,
    refuse_spec,
    section,
    typo,
    whole,
    window,
)
from perfmodel.configs.megatron import Settings, _flag, apply_settings
from perfmodel.errors import SpecError

# TransformerConfig / provider fields -> Megatron argument dests (the same name unless listed)
_MODEL_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "seq_length", "vocab_size", "make_vocab_size_divisible_by",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "cp_comm_type", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "sequence_parallel",
    "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_token_dispatcher_type", "moe_grouped_gemm",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "distribute_saved_activations", "add_bias_linear", "add_qkv_bias", "normalization",
    "position_embedding_type", "attention_backend", "hidden_dropout", "attention_dropout",
    "bf16", "fp16", "tp_comm_overlap", "cpu_offloading", "cpu_offloading_num_layers",
    "cpu_offloading_activations", "cpu_offloading_weights", "multi_latent_attention",
    "pipeline_model_parallel_layout", "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split", "max_position_embeddings", "use_tp_pp_dp_mapping",
    "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "enable_cuda_graph",
    "external_cuda_graph", "cuda_graph_impl", "cuda_graph_scope", "cuda_graph_modules",
    # read by the Megatron reader: rotary_fraction, or refused where they change the cost
    # (perfmodel.configs.megatron._fusions)
    "rotary_percent", "apply_rope_fusion", "bias_activation_fusion", "bias_dropout_fusion",
    "masked_softmax_fusion", "gradient_accumulation_fusion", "qk_layernorm",
    "fp32_residual_connection", "fp8_wgrad", "fp8_dot_product_attention",
    "fp8_multi_head_attention", "deallocate_pipeline_outputs",
    # the interleaved schedule's sends overlapped with compute: said not modelled
    # (perfmodel.configs.megatron._p2p_overlap)
    "overlap_p2p_comm",
    # Transformer Engine's FP8 recipe (TransformerConfig.fp8_recipe, default delayed), read as
    # Megatron-LM's --fp8-recipe: tensorwise is current scaling, blockwise refused
    "fp8_recipe")
_RENAMED = {"num_moe_experts": "num_experts", "gated_linear_unit": "swiglu",
            "virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank",
            "fp8": "fp8_format", "fp4": "fp4_format", "seq_len": "seq_length",
            "sequence_length": "seq_length", "use_torch_fsdp2": "use_torch_fsdp2",
            "use_megatron_fsdp": "use_megatron_fsdp", "use_custom_fsdp": "use_custom_fsdp",
            "data_parallel_sharding_strategy": "data_parallel_sharding_strategy",
            "use_distributed_optimizer": "use_distributed_optimizer",
            "overlap_grad_reduce": "overlap_grad_reduce",
            "overlap_param_gather": "overlap_param_gather", "micro_batch_size": "micro_batch_size",
            "bucket_size": "ddp_bucket_size",
            "overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
            "reuse_grad_buf_for_mxfp8_param_ag": "reuse_grad_buf_for_mxfp8_param_ag",
            "global_batch_size": "global_batch_size", "optimizer": "optimizer",
            "grad_reduce_in_fp32": "grad_reduce_in_fp32",
            "optimizer_cpu_offload": "optimizer_cpu_offload",  # refused (Megatron's reader)
            **{name: name for name in ("use_precision_aware_optimizer", "main_grads_dtype",
                                       "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                                       "store_param_remainders")}}
# model fields that do not change the step's cost (numerics, initialization, fusions of the same
# work, inference, bookkeeping)
_HARMLESS = frozenset((
    "_target_", "activation_func", "layernorm_epsilon", "init_method_std", "init_method",
    "output_layer_init_method", "rotary_base", "rotary_interleaved",
    "rope_scaling", "rope_scaling_factor", "seq_len_interpolation_factor", "persist_layer_norm",
    "batch_p2p_comm", "batch_p2p_sync", "perform_initialization",
    "parallel_output", "hf_model_id", "clone_scatter_output_in_embedding",
    "scatter_embedding_sequence_parallel", "attention_softmax_in_fp32", "params_dtype",
    "pipeline_dtype", "autocast_dtype", "timers", "layernorm_zero_centered_gamma",
    "apply_query_key_layer_scaling", "apply_residual_connection_post_layernorm",
    "fp16_lm_cross_entropy", "share_embeddings_and_output_weights", "tp_comm_bootstrap_backend",
    "config_logger_dir", "memory_efficient_layer_norm", "embedding_init_method_std",
    "embedding_init_method", "barrier_with_L1_time", "test_mode", "make_vocab_size_divisible_by",
    "should_pad_vocab", "transformer_layer_spec", "generation_config", "vocab_size_from_tokenizer",
    "tp_comm_overlap_cfg", "defer_embedding_wgrad_compute", "wgrad_deferral_limit",
    "inference_rng_tracker", "flash_decode", "use_te_rng_tracker", "enable_autocast",
    "mscale", "mscale_all_dim", "beta_fast", "beta_slow", "rotary_scaling_factor",
    "original_max_position_embeddings", "rope_type", "fp8_margin",
    "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_interval", "fp4_recipe",
    "softmax_scale", "forward_step_fn", "data_step_fn", "moe_aux_loss_coeff",
    "moe_router_load_balancing_type", "moe_router_dtype", "moe_z_loss_coeff",
    "moe_router_pre_softmax", "moe_router_score_function", "moe_permute_fusion",
    "seq_length_from_data",
    # Transformer Engine's offload: double buffering is deprecated and unused
    # (transformer_engine/pytorch/cpu_offload.py, get_cpu_offload_context); retained pinned
    # buffers are host memory
    "cpu_offloading_double_buffering", "cpu_offloading_retain_pinned_cpu_buffers"))
_IGNORED_SECTIONS = {
    **dict.fromkeys(("checkpoint", "checkpoint_config", "logger", "logger_config", "log", "rng",
                     "rng_config", "profiling", "profiling_config", "ft", "straggler",
                     "nvrx_straggler", "inprocess_restart", "rerun_state_machine",
                     "tensor_inspect", "resume", "scheduler", "scheduler_config", "lr_scheduler",
                     "peft", "dist", "mixed_precision"), "logging, checkpointing, "
                                                         "scheduling or restarts"),
}
_PRESETS = {  # NeMo 2 config classes (nemo.collections.llm.gpt.model) -> perfmodel presets
    "Llama3Config8B": "llama3-8b", "Llama3Config70B": "llama3-70b",
    "Llama31Config8B": "llama3.1-8b", "Llama31Config70B": "llama3.1-70b",
    "Llama31Config405B": "llama3.1-405b", "Llama2Config7B": "llama2-7b",
    "Llama2Config70B": "llama2-70b", "GPTConfig175B": "gpt3-175b"}
# MegatronStrategy's parallel sizes where the strategy does not state them
# (nemo/lightning/pytorch/strategies/megatron_strategy.py, MegatronStrategy.__init__)
_STRATEGY_DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                      "virtual_pipeline_model_parallel_size": None, "context_parallel_size": 1,
                      "sequence_parallel": False, "expert_model_parallel_size": 1}
_PRECISIONS = {"bf16-mixed": "bf16", "bf16_mixed": "bf16", "bf16": "bf16", "16-mixed": "fp16",
               "fp16-mixed": "fp16", "fp16_mixed": "fp16", "16": "fp16", "32": "fp32",
               "32-true": "fp32", "fp32": "fp32"}


def _section(data: dict[str, Any], *names: str) -> tuple[str, dict[str, Any]]:
    for name in names:
        if isinstance(data.get(name), dict):
            return name, data[name]
    return "", {}


def read_nemo(data: dict[str, Any], path: Path) -> JobConfig:
    """A Megatron-Bridge or NeMo 2 YAML, read (its settings to Megatron's, then mapped)."""
    from perfmodel.configs.interpolation import resolved

    where = str(path)
    job = JobConfig(path=where, framework=Framework.NEMO)
    settings: Settings = {}
    try:
        data = resolved(data)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    nemo2 = isinstance(data.get("trainer"), dict)
    override = False
    if nemo1.is_nemo1(data):
        settings = nemo1.settings_of(data, job, where)
    elif nemo2:
        _nemo2(data, settings, job, where)
    else:
        _readable(data, where)
        override = is_override(data)
        _bridge(data, settings, job, where, override)
    for dest in ("grad_reduce_in_fp32",):
        if dest in settings:
            key, value = settings.pop(dest)
            if value is False or str(value).lower() == "false":
                settings["grad_reduce_in_bf16"] = (key + " false", True)
            else:
                job.took(key, value, "fp32 gradient reduction (perfmodel's)")
    if override:
        _over_the_recipe(settings, job, where)
    else:
        apply_settings(settings, job, where)
    if nemo1.is_nemo1(data):
        nemo1.after_settings(data, job)
    return job


# the sections of a ConfigContainer (or an override file of it) _bridge reads from
_BRIDGE_READ = frozenset(("_target_", "model", "model_config", "train", "train_config", "ddp",
                          "ddp_config", "optimizer", "optimizer_config", "comm_overlap",
                          "dataset", "dataset_config", "tokenizer", "tokenizer_config",
                          "mixed_precision", "dist"))


def _readable(data: dict[str, Any], where: str) -> None:
    """A YAML that is none of the formats read (no NeMo 1 or NeMo 2 trainer, no AutoModel step
    scheduler) and holds none of a ConfigContainer's sections perfmodel reads: nothing of it
    would be read, so it is refused rather than predicted at perfmodel's defaults. Megatron-
    Bridge's performance-matrix YAMLs (scripts/performance/configs/*/*_llm_pretrain.yaml at
    b171934fb: a ConfigContainer section of overrides beside perf_matrix, the parallel sizes by
    GPU type, GPU count and precision, which the performance scripts pick from) are named."""
    if set(data) & _BRIDGE_READ:
        return
    keys = ", ".join(str(k) for k in data) or "none"
    what = ("a Megatron-Bridge performance-matrix YAML (its ConfigContainer overrides beside "
            "perf_matrix's sizes by GPU type, count and precision: the performance scripts pick "
            "one; write that run's ConfigContainer or override file)"
            if "perf_matrix" in data else "a YAML none of whose top-level keys perfmodel reads")
    raise SpecError(f"{where}: {what} (top-level keys: {keys}): nothing would be read; perfmodel "
                    "reads a Megatron-Bridge ConfigContainer or override file (model, train, "
                    "ddp, optimizer, mixed_precision, ... at the top), a NeMo 2 recipe (trainer, "
                    "model.config), a NeMo 1 config (trainer, model) or a NeMo AutoModel recipe "
                    "(step_scheduler, distributed)")


def is_override(data: dict[str, Any]) -> bool:
    """A Megatron-Bridge override file (examples/recipes/*/conf/*_override_example.yaml): the
    sections of a ConfigContainer without its _target_, the model's without its provider's;
    the recipe script merges it over the recipe's config (OmegaConf.merge in
    examples/recipes/llama/pretrain_llama3_8b.py at 47f330e), so it states only what it
    overrides."""
    model = data.get("model", data.get("model_config"))
    return "_target_" not in data and not (isinstance(model, dict) and "_target_" in model)


# the plan fields the Megatron reader fixes from Megatron-LM's defaults where the settings do not
# state them, and the settings that state each
_STATED_BY = {
    "dtype": ("bf16", "fp16", "fp8_format"), "fp8_recipe": ("fp8_format",),
    "zero": ("use_distributed_optimizer", "use_torch_fsdp2"),
    "overlap_grad_sync": ("overlap_grad_reduce",),
    "overlap_param_gather": ("overlap_param_gather",), "tp_comm_overlap": ("tp_comm_overlap",),
    "flash_attention": ("attention_backend",),
    "stack": ("cuda_graph_impl", "enable_cuda_graph", "external_cuda_graph"),
    "tp": ("tensor_model_parallel_size",), "pp": ("pipeline_model_parallel_size",),
    "cp": ("context_parallel_size",), "cp_comm": ("cp_comm_type",),
    "ep": ("expert_model_parallel_size",), "etp": ("expert_tensor_parallel_size",),
    "sequence_parallel": ("sequence_parallel",),
    "virtual_stages": ("num_virtual_stages_per_pipeline_rank",),
    "schedule": ("num_virtual_stages_per_pipeline_rank",),
    "micro_batch": ("micro_batch_size",), "recompute": ("recompute_granularity",)}
RECIPE_MODEL = "the recipe's model"  # job.preset while an override's settings are applied


def _over_the_recipe(settings: Settings, job: JobConfig, where: str) -> None:
    """An override file's settings over the recipe's config, which perfmodel does not have:
    its model fields over --model's (the Megatron reader's preset path, which reads only the
    fields stated), its plan fields as stated, the others left to the command line and
    perfmodel's defaults rather than Megatron-LM's (the recipe's, not the file's); the
    precision, where the file states none, the recipes' bf16_mixed (Megatron-Bridge's llama,
    qwen, gpt-oss, deepseek and moonlight recipes at 47f330e), which perfmodel's default is."""
    stated = set(settings)
    if "cross_entropy_fusion_impl" in stated and "cross_entropy_loss_fusion" not in stated:
        # the recipe's model is a GPTModelProvider, whose cross_entropy_loss_fusion defaults to
        # True (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/gpt_provider.py at
        # 6292d347 and 067f987df; DeepSeek's and Mamba's providers likewise): the impl the file
        # states runs fused
        settings["cross_entropy_loss_fusion"] = (
            "model (the recipe's GPTModelProvider: its cross_entropy_loss_fusion default, True)",
            True)
    recipes = "mixed_precision (not in the file: the recipes' bf16_mixed)"
    if not stated & {"bf16", "fp16", "fp8_format"}:  # for the Megatron reader's bf16 rules
        settings["bf16"] = (recipes, True)
    job.preset = RECIPE_MODEL
    try:
        apply_settings(settings, job, where)
    finally:
        job.preset = None
    job.read = [Setting(key=s.key, value=s.value, note=s.note.replace(
        "(over the preset's)", "(over --model's)")) for s in job.read if s.key != recipes]
    if "attention_backend" not in stated:  # the Megatron reader's note of its default's
        job.notes = [n for n in job.notes if not n.startswith("--attention-backend auto")]
    job.needs_model = "a Megatron-Bridge override file states only what it overrides of its " \
                      "recipe's model, which --model gives"
    # FSDP2 prefetches whatever the recipe's DDP says (the Megatron reader's overlap_param_gather
    # under --use-torch-fsdp2): stated by the file's use_torch_fsdp2
    fsdp2 = "use_torch_fsdp2" in stated and _truth(settings["use_torch_fsdp2"][1])
    left = sorted(field for field, dests in _STATED_BY.items()
                  if field in job.plan and not stated & set(dests)
                  and not (field == "overlap_param_gather" and fsdp2))
    for field in left:
        del job.plan[field]
        job.pins.discard(field)
    if not stated & {"cross_entropy_loss_fusion", "cross_entropy_fusion_impl"}:
        left = sorted([*left, "cross_entropy"])  # never fixed by the reader: said all the same
    job.notes.append("a Megatron-Bridge override file: the recipe's settings it does not state "
                     f"({', '.join(left)}) are the command line's or perfmodel's defaults (dtype "
                     "bf16, the recipes' bf16_mixed), not Megatron-LM's: give them where the "
                     "recipe's differ")



def _put(settings: Settings, job: JobConfig, prefix: str, fields: dict[str, Any],
         model: bool = False) -> None:
    """The fields of a section as settings; the others recorded as ignored or unknown."""
    if model:  # Megatron-Core's expert capacity and windows, which the Megatron reader does not
        capacity(fields, prefix, job, job.path)  # read
        window(fields, prefix, job, job.path)
        fields = {k: v for k, v in fields.items() if k not in (*CAPACITY, *WINDOW)}
        _clamp(fields, prefix, settings, job)
        fields = {k: v for k, v in fields.items() if k != "activation_func_clamp_value"}
    for name, value in fields.items():
        key = f"{prefix}.{name}"
        if not isinstance(name, str):  # a YAML key of another type (null, a number)
            raise SpecError(f"{job.path}: {key}: a setting's name must be text, got "
                            f"{type(name).__name__}")
        dest = _RENAMED.get(name, name if name in _MODEL_FIELDS else None)
        if name == "moe_grouped_gemm" and not _truth(value):
            job.skipped(key, value, nemo1.GROUPED_OFF)
        elif name == "share_embeddings_and_output_weights":
            settings["untie_embeddings_and_output_weights"] = (key, not _truth(value))
        elif dest is not None:
            if isinstance(value, dict):
                value = value.get("_target_", value)
            if dest == "attention_backend" and isinstance(value, str):
                value = value.rsplit(".", 1)[-1]
            settings[dest] = (key, value)
        elif name == "defer_embedding_wgrad_compute" and _truth(value):
            job.notes.append(deferred_wgrad_note(key))
        elif name in _OVERLAP_NOT_READ and name.endswith(("wgrad_compute", "deferral_limit")):
            job.skipped(key, value, _OVERLAP_NOT_READ[name])
        elif name in _HARMLESS:
            job.skipped(key, value, "the same cost (numerics, fusion, initialization)")
        elif value not in (None, False, 0, [], "", {}) and name not in _NOT_TYPOS \
                and typo(name, _READ_NAMES):  # a near-miss of a key read, set: a misspelling
            raise SpecError(f"{job.path}: unknown key {key}{typo(name, _READ_NAMES)}")
        elif value in (None, False, 0, [], "", {}):
            job.skipped(key, value, "off")
        else:
            _not_read(job, key, name, value, model)


# MegatronStrategy's and the trainers' keys that are not the step's
_BOOKKEEPING = frozenset((
    "gradient_as_bucket_view", "save_ckpt_format", "replace_progress_bar", "progress_interval",
    "find_unused_parameters", "lazy_init", "init_model_parallel", "setup_optimizers",
    "restore_config", "pipeline_dtype", "use_te_rng_tracker", "data_sampler", "parallel_devices",
    "cluster_environment", "checkpoint_io", "eval_iters", "eval_interval", "iterations_to_skip",
    "check_weight_hash_across_dp_replicas_interval", "exit_signal_handler_for_dataloader",
    "manual_gc_eval", "timers", "config_logger_dir"))


def _not_read(job: JobConfig, key: str, name: str, value: Any, model: bool) -> None:
    """A set field _put does not read: said why where Megatron-LM's option of that name is one
    whose cost perfmodel leaves out (a note) or one that does not change the step (ignored, the
    Megatron reader's reason), or a trainer's bookkeeping; otherwise not read (unknown)."""
    from perfmodel.configs.megatron import UNMODELLED_COSTS, ignored_reason

    option = name.replace("_", "-")
    if option in UNMODELLED_COSTS:
        job.notes.append(f"{key} {value}: {UNMODELLED_COSTS[option]}")
        return
    reason = None if model else ignored_reason(option) or ignored_reason(f"ddp-{option}")
    if reason:
        job.skipped(key, value, reason)
    elif not model and name in _BOOKKEEPING:
        job.skipped(key, value, "the trainer's bookkeeping (not the step)")
    else:
        job.strange(key, value)


def _clamp(fields: dict[str, Any], prefix: str, settings: Settings, job: JobConfig) -> None:
    """TransformerConfig.activation_func_clamp_value: with the quick-GeGLU activation (GPT-OSS's
    providers) Megatron-Core's experts clamp the halves in eager PyTorch before the fused
    kernel (weighted_bias_quick_geglu_impl at d98e8a64dd): the model's clamped_glu; with SwiGLU
    the fused kernel clamps them itself (the Megatron reader's note)."""
    value = fields.get("activation_func_clamp_value")
    if value in (None, "None", "null"):
        return
    key = f"{prefix}.activation_func_clamp_value"
    activation = fields.get("activation_func")
    target = str(activation.get("_target_", "") if isinstance(activation, dict) else activation)
    if target.endswith("quick_gelu"):
        job.model["clamped_glu"] = True
        job.took(key, value, "clamped_glu (the quick-GeGLU's halves clamped in eager PyTorch "
                             "before Megatron-Core's fused kernel)")
    else:
        settings["activation_func_clamp_value"] = (key, value)


_READ_NAMES = frozenset((*_MODEL_FIELDS, *_RENAMED))  # the keys _put reads in any section
# Megatron-Core's and Megatron-Bridge's own fields a letter or two from one perfmodel reads: not
# misspellings (TransformerConfig, ModelParallelConfig, DistributedDataParallelConfig,
# OptimizerConfig and the Bridge's ConfigContainer sections at NVIDIA/Megatron-LM d98e8a64dd)
_NOT_TYPOS = frozenset(("comm_overlap", "eval_context_parallel_size",
                        "moe_shared_expert_glu_interleave_size", "tp_comm_overlap_ag",
                        "tp_comm_overlap_rs", "encoder_tensor_model_parallel_size",
                        "encoder_pipeline_model_parallel_size", "vision_tensor_model_parallel_size",
                        "vision_pipeline_model_parallel_size", "num_position_embeddings",
                        "swa_num_query_groups"))


def _truth(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1")


# the fields Megatron-Bridge turns on in both ddp and optimizer where either has them
# (_validate_and_sync_distributed_optimizer_settings in src/megatron/bridge/training/config.py at
# 067f987df; overlap_param_gather from 4bb633034, "Sync overlap_param_gather between DDP and
# optimizer (#4141)")
_BRIDGE_EITHER = {"use_distributed_optimizer": "the distributed optimizer",
                  "overlap_param_gather": "overlap_param_gather"}


def _bridge_repeated(settings: Settings, job: JobConfig, name: str, fields: dict[str, Any]
                     ) -> dict[str, Any]:
    """A section's fields that an earlier section (ddp's, the model's) gives too, as
    Megatron-Bridge resolves them: the distributed optimizer and overlap_param_gather are on in
    both where either says so (training/config.py
    _validate_and_sync_distributed_optimizer_settings at 067f987df, _BRIDGE_EITHER); the
    comm_overlap's set fields over the DDP's and the model's (CommOverlapConfig). The setting
    that loses is listed, never dropped; the fields left for _put are returned."""
    kept = {}
    for k, v in fields.items():
        dest = _RENAMED.get(k, k if k in _MODEL_FIELDS else None) if isinstance(k, str) else None
        if dest is None or dest not in settings:
            kept[k] = v
            continue
        old, stated = settings[dest]
        key = f"{name}.{k}"
        if dest in _BRIDGE_EITHER and _truth(stated) and not _truth(v):
            job.skipped(key, v, f"overridden by {old}: Megatron-Bridge turns "
                                f"{_BRIDGE_EITHER[dest]} on in both sections where either has it")
            continue
        job.skipped(old, stated, f"the same as {key}" if _truth(stated) == _truth(v)
                    and str(stated) == str(v) else f"overridden by {key}")
        kept[k] = v
    return kept


def _bridge(data: dict[str, Any], settings: Settings, job: JobConfig, where: str,
            override: bool) -> None:
    # what trains another step than the model's own: a ConfigContainer's peft (LoRA adapters
    # beside frozen weights: no weight gradients or optimizer states for them) and Bridge's
    # distillation (DistillationProvider: a teacher's forward each step, the KD loss)
    if data.get("peft"):
        raise refuse_plan(where, "peft", "...", "LoRA/PEFT fine-tuning is not modelled (every "
                                                "parameter trains here)")
    _, model_fields = _section(data, "model", "model_config")
    for key in ("teacher", "kd_config"):
        if model_fields.get(key):
            raise refuse_plan(where, f"model.{key}", "...", "knowledge distillation (a "
                              "teacher's forward every step, the distillation loss) is not "
                              "modelled")
    known = {"_target_"}
    for names, model in ((("model", "model_config"), True), (("train", "train_config"), False),
                         (("ddp", "ddp_config"), False),
                         (("optimizer", "optimizer_config"), False),
                         (("comm_overlap",), False), (("dataset", "dataset_config"), False),
                         (("tokenizer", "tokenizer_config"), False)):
        name, fields = _section(data, *names)
        known.update(names)
        if not name:
            continue
        if name.startswith("dataset"):
            fields = {k: v for k, v in fields.items() if k in ("sequence_length", "seq_length")}
            for k, v in data[name].items():
                if k not in fields:
                    job.skipped(f"{name}.{k}", v, "the data, not the step")
        if name.startswith("tokenizer"):
            # the model's vocab_size wins where given; the tokenizer's is taken (and padded)
            # where it is not (setup.py _validate_and_set_vocab_size at 47f330e)
            given = settings.get("vocab_size", (None, None))[1] not in (None, "None", "null")
            for k, v in data[name].items():
                if k != "vocab_size" or given:
                    job.skipped(f"{name}.{k}", v, "the model's vocab_size is given"
                                if k == "vocab_size" else "the tokenizer's files")
            fields = {k: v for k, v in fields.items() if k == "vocab_size" and not given}
        if name == "comm_overlap":  # its None fields defer to ddp's and the model's
            fields = {k: v for k, v in fields.items() if v is not None}
        if name in ("optimizer", "optimizer_config", "comm_overlap"):
            fields = _bridge_repeated(settings, job, name, fields)
        if name.startswith("dataset"):
            _bridge_sequence(settings, name, fields, job, where)
        _put(settings, job, name, fields, model=model)
    precision = data.get("mixed_precision")
    known.add("mixed_precision")
    if isinstance(precision, str):
        _bridge_preset(settings, job, precision, data, where)
    elif isinstance(precision, dict):  # a MixedPrecisionConfig's fields, over the model's and
        # the DDP's
        dests = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8_format", "fp4": "fp4_format",
                 "grad_reduce_in_fp32": "grad_reduce_in_fp32", "fp8_recipe": "fp8_recipe",
                 "fp8_param_gather": "fp8_param_gather", "fp8_params": "fp8_param_gather",
                 "reuse_grad_buf_for_mxfp8_param_ag": "reuse_grad_buf_for_mxfp8_param_ag",
                 **{name: name for name in _PLUGIN_FP8}}  # the Megatron reader's (_fusions)
        fp8 = precision.get("fp8") not in (None, "None", "null", False)
        for name, value in precision.items():
            key = f"mixed_precision.{name}"
            if name in dests:  # Transformer Engine's recipe, FP8 weights (docs/fp8.md)
                if dests[name] in settings and settings[dests[name]][0] != key:
                    job.skipped(*settings.pop(dests[name]), f"overridden by {key}")
                if name in ("bf16", "fp16") and not _truth(value):
                    job.skipped(key, value, "off")  # the other, or neither: fp32
                else:
                    settings[dests[name]] = (key, value)
            elif name in ("first_last_layers_bf16", "num_layers_at_start_in_bf16",
                          "num_layers_at_end_in_bf16") and value and fp8:
                raise refuse_plan(where, key, value, "FP8 layers kept in bf16 are not modelled "
                                  "(every layer's GEMMs are FP8 under dtype fp8)")
            elif name in ("fp32", "fp8_param"):
                job.skipped(key, value, "follows " + ("bf16 and fp16" if name == "fp32"
                                                      else "fp8_param_gather"))
            elif name in _PLUGIN_HARMLESS or name in ("loss_scale", "initial_loss_scale",
                                                      "min_loss_scale", "loss_scale_window",
                                                      "hysteresis"):
                job.skipped(key, value, "the same cost (numerics)")
            elif value in (None, False, 0, "", "None", "null") or name in (
                    "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                    "num_layers_at_end_in_bf16"):
                job.skipped(key, value, "off" if not value else "no effect without fp8")
            else:
                job.strange(key, value, "not a MixedPrecisionConfig field perfmodel reads")
        if not override:  # an override's unstated fields are its recipe's MixedPrecisionConfig's
            _precision_defaults(settings, job, precision,
                                {**dests, "fp8_param": "fp8_param_gather"})
    _, dist = _section(data, "dist")
    for name in _DIST_READ:
        if dist.get(name):
            settings[name] = (f"dist.{name}", dist[name])
        elif name in dist:
            job.skipped(f"dist.{name}", dist[name], "off")
    for name, value in data.items():
        if name in known:
            continue
        if name == "dist" and isinstance(value, dict):  # its fields read above said there
            value = {k: v for k, v in value.items() if k not in _DIST_READ}
            if not value:
                continue
        if name in _IGNORED_SECTIONS:
            # what costs every step though it logs or checks is said in a note, not ignored
            from perfmodel.configs.megatron import UNMODELLED_COSTS

            # (a key of another type, YAML's null or a number, names no such cost)
            said = [k for k, v in value.items() if isinstance(k, str)
                    and k.replace("_", "-") in UNMODELLED_COSTS and _truth(v)] \
                if isinstance(value, dict) else []
            for field_name in said:
                _not_read(job, f"{name}.{field_name}", field_name, value[field_name], False)
            count = len(value) - len(said) if isinstance(value, dict) else 1
            job.skipped(f"{name}.*", f"({count} settings)", _IGNORED_SECTIONS[name])
        else:
            job.strange(name, "(a section)" if isinstance(value, dict) else value)
    if "seq_length" not in settings and not override:  # an override's is the recipe's
        raise SpecError(f"{where}: no model.seq_length or dataset.sequence_length: the training "
                        "sequence length is not given")


# DistributedInitConfig's fields that are the plan's (the others: process groups, timeouts)
_DIST_READ = ("use_torch_fsdp2", "use_megatron_fsdp", "use_tp_pp_dp_mapping")


# MixedPrecisionConfig's defaults of the fields perfmodel reads (src/megatron/bridge/training/
# mixed_precision.py at 067f987df), which Bridge copies onto the model and the DDP, stated or not
# (runtime_config_update in training/config.py calls MixedPrecisionConfig.setup:
# update_config_with_precision_overrides sets every field the target config has)
_MIXED_PRECISION_DEFAULTS = {"bf16": False, "fp16": False, "fp8": None, "fp8_recipe": "tensorwise",
                             "fp8_param_gather": False, "grad_reduce_in_fp32": True, "fp4": None,
                             "reuse_grad_buf_for_mxfp8_param_ag": False, "fp8_wgrad": True,
                             "fp8_dot_product_attention": False,
                             "fp8_multi_head_attention": False}


def _precision_defaults(settings: Settings, job: JobConfig, precision: dict[str, Any],
                        dests: dict[str, str]) -> None:
    """A ConfigContainer's mixed_precision section is a whole MixedPrecisionConfig: the fields it
    does not state are its defaults (_MIXED_PRECISION_DEFAULTS), over the model's and the DDP's
    as the stated ones are. So a model's fp8 under a section without fp8 trains in 16 bits, and
    a section's fp8 without fp8_recipe is Bridge's tensorwise (current scaling), not
    Megatron-Core's delayed."""
    fp8 = precision.get("fp8") not in (None, "None", "null", False)
    for name, default in _MIXED_PRECISION_DEFAULTS.items():
        if any(n in precision for n, d in dests.items() if d == dests[name]):
            continue  # stated (fp8_param_gather under any of its names)
        dest = dests[name]
        key = f"mixed_precision (MixedPrecisionConfig's {name} default)"
        if dest in settings:
            job.skipped(*settings.pop(dest), f"overridden by {key[:-1]}, {default})")
        if name == "grad_reduce_in_fp32" or (name == "fp8_recipe" and fp8):
            settings[dest] = (key, default)


# Megatron-Bridge's precision presets by name (MIXED_PRECISION_RECIPES, src/megatron/bridge/
# training/mixed_precision.py at 067f987df; get_mixed_precision_config reads '-' as '_'): the
# fields perfmodel reads, the others MixedPrecisionConfig's defaults. dtype, fp8 (format),
# fp8_recipe, fp8_param_gather, reuse_grad_buf_for_mxfp8_param_ag, the layers at each end kept
# in 16 bits (first_last_layers_bf16), fp4 (format)
_BRIDGE_PRESETS: dict[str, tuple[str, str | None, str, bool, bool, tuple[int, int], str | None]] = {
    "bf16_mixed": ("bf16", None, "tensorwise", False, False, (0, 0), None),
    "fp16_mixed": ("fp16", None, "tensorwise", False, False, (0, 0), None),
    "bf16_with_fp8_delayed_scaling_mixed": ("bf16", "hybrid", "delayed", True, False, (0, 0),
                                            None),
    "fp16_with_fp8_delayed_scaling_mixed": ("fp16", "hybrid", "delayed", True, False, (0, 0),
                                            None),
    "bf16_with_mxfp8_mixed": ("bf16", "e4m3", "mxfp8", True, True, (0, 0), None),
    "fp16_with_mxfp8_mixed": ("fp16", "e4m3", "mxfp8", True, True, (0, 0), None),
    "bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "tensorwise", True, False, (1, 1),
                                            None),
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "tensorwise", True,
                                                       False, (2, 2), None),
    "nanov2_bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "blockwise", True, False,
                                                   (2, 2), None),
    "fp16_with_fp8_current_scaling_mixed": ("fp16", "hybrid", "tensorwise", True, False, (1, 1),
                                            None),
    "bf16_with_fp8_subchannel_scaling_mixed": ("bf16", "hybrid", "blockwise", False, False,
                                               (0, 0), None),
    "fp16_with_fp8_subchannel_scaling_mixed": ("fp16", "hybrid", "blockwise", False, False,
                                               (0, 0), None),
    "bf16_with_nvfp4_mixed": ("bf16", None, "tensorwise", False, False, (0, 0), "e2m1"),
    "nemotron_3_super_bf16_with_nvfp4_mixed": ("bf16", None, "tensorwise", False, False, (1, 14),
                                               "e2m1")}


def _bridge_preset(settings: Settings, job: JobConfig, preset: str, data: dict[str, Any],
                   where: str) -> None:
    """A Megatron-Bridge precision preset named by its string: the MixedPrecisionConfig it builds
    (_BRIDGE_PRESETS), every field over the model's and the DDP's as Bridge copies them
    (_precision_defaults): a model's fp8 under bf16_mixed trains in bf16."""
    name = preset.strip().replace("-", "_")
    if name not in _BRIDGE_PRESETS:
        raise SpecError(f"{where}: mixed_precision {preset}: not a Megatron-Bridge precision "
                        f"preset (get_mixed_precision_config refuses it); allowed: "
                        f"{', '.join(_BRIDGE_PRESETS)}")
    dtype, fmt, recipe, weights, reuse, layers, fp4 = _BRIDGE_PRESETS[name]
    key = f"mixed_precision {preset}"
    for dest in ("bf16", "fp16", "fp8_format", "fp8_recipe", "fp8_param_gather", "fp4_format",
                 "grad_reduce_in_fp32", "reuse_grad_buf_for_mxfp8_param_ag"):
        if dest in settings:
            job.skipped(*settings.pop(dest), f"overridden by {key}")
    settings[dtype] = (key, True)
    settings["grad_reduce_in_fp32"] = (f"{key} (the preset's grad_reduce_in_fp32)",
                                       dtype == "bf16")
    if fp4 is not None:
        settings["fp4_format"] = (f"{key} (the preset's fp4)", fp4)  # refused (Megatron's reader)
    if fmt is None:
        return
    settings["fp8_format"] = (f"{key} (the preset's fp8)", fmt)
    settings["fp8_recipe"] = (f"{key} (the preset's fp8_recipe)", recipe)
    if any(layers) and recipe != "blockwise":  # blockwise: refused (the Megatron reader)
        job.notes.append(f"{key}: its first {layers[0]} and last {layers[1]} layers in bf16 "
                         "(first_last_layers_bf16) are not modelled: every layer's GEMMs are "
                         "costed in FP8")
    if weights:
        _preset_weights(settings, job, preset, data, reuse)


def _preset_weights(settings: Settings, job: JobConfig, preset: str, data: dict[str, Any],
                    reuse: bool) -> None:
    """The FP8 weights a precision preset named by its string holds (its fp8_param_gather;
    reuse: MXFP8's reuse_grad_buf_for_mxfp8_param_ag), unless a sharded data parallelism (FSDP)
    holds the weights: there the preset's fp8_param_gather is left out, with a note
    (Megatron-LM turns it off beside torch FSDP2, which gathers bf16; Megatron FSDP, whose FP8
    gather perfmodel models as fp8_params with ZeRO 3, is refused by the Megatron reader as a
    whole)."""
    sections = [data[name] for name in ("dist", "ddp") if isinstance(data.get(name), dict)]
    if any(_truth(section.get(k)) for section in sections
           for k in ("use_torch_fsdp2", "use_megatron_fsdp", "use_custom_fsdp")):
        job.notes.append(f"mixed_precision {preset}: its fp8_param_gather under FSDP is not "
                         "modelled (Megatron-LM turns it off beside torch FSDP2, which gathers "
                         "bf16); the weights are counted in bf16 beside their FP8 copies")
        return
    key = f"mixed_precision {preset} (the preset's fp8_param_gather)"
    settings.setdefault("fp8_param_gather", (key, True))
    if reuse:
        settings.setdefault("reuse_grad_buf_for_mxfp8_param_ag",
                            (f"mixed_precision {preset} (the preset's "
                             "reuse_grad_buf_for_mxfp8_param_ag)", True))


def _precision(settings: Settings, job: JobConfig, key: str, value: Any, where: str) -> None:
    """A NeMo 2 plugin's precision (Lightning's bf16-mixed, 16-mixed, 32 ...) as Megatron's
    --bf16 / --fp16 (neither: fp32), over any the model's fields gave (a Megatron-Bridge preset's
    name is _bridge_preset's; NeMo 2's FP8 is the plugin's fp8, not its precision)."""
    text = str(value).lower()
    if text in _PRECISIONS:
        dtype = _PRECISIONS[text]
    else:
        raise SpecError(f"{where}: {key} {text}: perfmodel reads {', '.join(_PRECISIONS)}")
    for dest in ("bf16", "fp16"):
        if dest in settings:
            old, stated = settings.pop(dest)
            job.skipped(old, stated, f"overridden by {key}")
    # one setting for the one dtype (None: neither, fp32), shown with the precision's name
    settings["fp16" if dtype == "fp16" else "bf16"] = (f"{key} {text}",
                                                       True if dtype != "fp32" else None)


# MegatronMixedPrecision's arguments (nemo/lightning/pytorch/plugins/mixed_precision.py at
# 8cfedd7) with the same cost whatever their value: the weights' and the pipeline's dtypes under
# the precision, FP8's scaling details, FP16's loss scaling
_PLUGIN_HARMLESS = frozenset((
    "_target_", "params_dtype", "pipeline_dtype", "autocast_dtype", "autocast_enabled",
    "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp4_recipe",
    "fp16_loss_scale",
    "fp16_initial_loss_scale", "fp16_min_loss_scale", "fp16_loss_scale_window",
    "fp16_hysteresis"))

# MegatronMixedPrecision's FP8 switches that change the step's cost under FP8, over the model's
_PLUGIN_FP8 = ("fp8_wgrad", "fp8_dot_product_attention", "fp8_multi_head_attention")


def _plugin(plugin: dict[str, Any], settings: Settings, job: JobConfig, where: str) -> None:
    """NeMo 2's MegatronMixedPrecision: its DtypeConfig's fields override the model's and the
    DDP's of the same names (MegatronStrategy.connect), its defaults included: precision (bf16,
    fp16, fp32), fp8 (the format; none: no FP8, whatever the model config says) with fp8_recipe
    (default delayed: delayed, tensorwise, mxfp8, as Megatron-LM's --fp8-recipe), fp8_params or
    fp8_param_gather (the weights in FP8; default off), grad_reduce_in_fp32 (default on) and
    reuse_grad_buf_for_mxfp8_param_ag (default off)."""
    prefix = "trainer.plugins"
    if "precision" not in plugin:
        raise SpecError(f"{where}: {prefix}: MegatronMixedPrecision needs its precision")
    for dest in ("bf16", "fp16", "fp8_format", "fp8_recipe", "fp8_param_gather",
                 "grad_reduce_in_fp32", "grad_reduce_in_bf16",
                 "reuse_grad_buf_for_mxfp8_param_ag", "fp4_format", *_PLUGIN_FP8):
        if dest in settings:  # the model's or the DDP's, which the plugin's overrides
            key, value = settings.pop(dest)
            job.skipped(key, value, f"overridden by {prefix} (MegatronMixedPrecision)")
    _precision(settings, job, f"{prefix}.precision", plugin["precision"], where)

    def given(name: str, default: Any) -> tuple[str, Any]:
        return (f"{prefix}.{name}", plugin[name]) if name in plugin else \
            (f"{prefix} (MegatronMixedPrecision's {name} default)", default)

    fmt = plugin.get("fp8")
    fp8 = fmt not in (None, "None", "null", False)
    if fp8:
        settings["fp8_format"] = (f"{prefix}.fp8", fmt)
        settings["fp8_recipe"] = given("fp8_recipe", "delayed")
    elif "fp8_recipe" in plugin:
        job.skipped(f"{prefix}.fp8_recipe", plugin["fp8_recipe"], "no effect without fp8")
    if "fp8" in plugin and not fp8:
        job.skipped(f"{prefix}.fp8", fmt, "off: 16-bit GEMMs")
    weights = [n for n in ("fp8_params", "fp8_param_gather") if n in plugin]
    if len(weights) == 2 and bool(plugin["fp8_params"]) != bool(plugin["fp8_param_gather"]):
        raise SpecError(f"{where}: {prefix}.fp8_params and {prefix}.fp8_param_gather disagree "
                        "(MegatronMixedPrecision refuses it)")
    for i, weight in enumerate(weights):
        if not fp8:
            job.skipped(f"{prefix}.{weight}", plugin[weight], "no effect without fp8")
        elif i == 0:
            settings["fp8_param_gather"] = (f"{prefix}.{weight}", plugin[weight])
        else:
            job.skipped(f"{prefix}.{weight}", plugin[weight], f"the same as {weights[0]}")
    settings["grad_reduce_in_fp32"] = given("grad_reduce_in_fp32", True)
    if "reuse_grad_buf_for_mxfp8_param_ag" in plugin:
        settings["reuse_grad_buf_for_mxfp8_param_ag"] = (
            f"{prefix}.reuse_grad_buf_for_mxfp8_param_ag",
            plugin["reuse_grad_buf_for_mxfp8_param_ag"])
    if plugin.get("fp4") not in (None, "None", "null", False):
        settings["fp4_format"] = (f"{prefix}.fp4", plugin["fp4"])  # refused (Megatron's reader)
    bf16_layers = ("first_last_layers_bf16", "num_layers_at_start_in_bf16",
                   "num_layers_at_end_in_bf16")
    for name in (n for n in bf16_layers if n in plugin):
        if plugin[name] and fp8:
            raise refuse_plan(where, f"{prefix}.{name}", plugin[name],
                              "FP8 layers kept in bf16 are not modelled (every layer's GEMMs "
                              "are FP8 under dtype fp8)")
        job.skipped(f"{prefix}.{name}", plugin[name],
                    "off" if not plugin[name] else "no effect without fp8")
    for name in (n for n in _PLUGIN_FP8 if n in plugin):  # the Megatron reader's (_fusions)
        settings[name] = (f"{prefix}.{name}", plugin[name])
    read = {"precision", "fp8", "fp8_recipe", "fp8_params", "fp8_param_gather", "fp4",
            "grad_reduce_in_fp32", "reuse_grad_buf_for_mxfp8_param_ag", *bf16_layers,
            *_PLUGIN_FP8}
    for name, value in plugin.items():
        if name in read:
            continue
        if name in _PLUGIN_HARMLESS:
            job.skipped(f"{prefix}.{name}", value, "the same cost (numerics)")
        elif value in (None, False, 0, "", "None", "null"):
            job.skipped(f"{prefix}.{name}", value, "off")
        else:
            job.strange(f"{prefix}.{name}", value)


# NeMo 2's callbacks (nemo/lightning/pytorch/callbacks at 8cfedd7, Lightning's) that do not
# change the step: timing, logging, profiling, checkpoints, garbage collection between steps
_CALLBACKS_NOT_STEP = frozenset((
    "TimingCallback", "GarbageCollectionCallback", "NsysCallback", "PytorchProfilerCallback",
    "MemoryProfileCallback", "MemoryMonitor", "SpeedMonitor", "RuntimeEstimator",
    "OptimizerMonitor", "FLOPsMeasurementCallback", "MM_FLOPsMeasurementCallback",
    "PreemptionCallback", "ModelCheckpoint", "ProgressPrinter", "MegatronProgressBar",
    "LearningRateMonitor", "DdpParityChecker", "ParameterDebugger", "ModelTrainingStateCallback",
    "MegatronEnableExperimentalCallback"))
# MegatronCommOverlapCallback's fields the plan has no term for (their overlap is modelled as
# it is, or the same cost): TE's userbuffers layout, the pipeline's sends, DDP buckets
_OVERLAP_NOT_READ = {
    "tp_comm_overlap_cfg": "Transformer Engine's userbuffers layout (the same overlap)",
    "tp_comm_bootstrap_backend": "how the userbuffers start (not the step)",
    "batch_p2p_comm": "the pipeline's sends, as perfmodel models them",
    "overlap_param_gather_with_optimizer_step": "the same weight gather (not modelled apart)",
    "align_param_gather": "the same weight gather, aligned over the virtual stages",
    "defer_embedding_wgrad_compute": "off: the output layer's weight gradient in each backward",
    "wgrad_deferral_limit": "how many micro-batches defer_embedding_wgrad_compute keeps (see "
                            "its note where it is on)"}


def _callback(callback: Any, settings: Settings, job: JobConfig, where: str) -> None:
    """One of NeMo 2's trainer callbacks: MegatronCommOverlapCallback's overlaps read, those of
    timing, logging and profiling ignored, any other named as not read."""
    if callback is None:
        return
    target = str(callback.get("_target_", "")) if isinstance(callback, dict) else str(callback)
    name = target.rsplit(".", 1)[-1]
    key = f"trainer.callbacks {name}"
    if name in _CALLBACKS_NOT_STEP:
        job.skipped(key, None, "not the step's (timing, logging, profiling or checkpoints)")
    elif name == "MegatronCommOverlapCallback" and isinstance(callback, dict):
        _comm_overlap(callback, settings, job, where)
    else:
        job.strange(key, None, "a callback perfmodel does not read (it may change the model "
                               "or the plan)")


NEMO2_BUCKET_PARAMS = 128 * 1024 * 1024  # MegatronCommOverlapCallback's DDP bucket, dp > 1


def _comm_overlap(callback: dict[str, Any], settings: Settings, job: JobConfig,
                  where: str) -> None:
    """NeMo 2's MegatronCommOverlapCallback (nemo/lightning/pytorch/callbacks/
    megatron_comm_overlap.py at 8cfedd7), which sets the model's and the DDP's overlaps at
    setup, over theirs: tp_comm_overlap (default off; on only with tp > 1 and sequence
    parallelism, else it turns it off), overlap_p2p_comm (default on with pp > 1 and virtual
    stages: not modelled, said in a note), and with the distributed optimizer
    overlap_grad_reduce and overlap_param_gather (default on where dp > 1: off with dp 1, where
    there is nothing to overlap)."""
    prefix = "trainer.callbacks MegatronCommOverlapCallback"

    def degree(dest: str) -> int | None:
        value = settings.get(dest, (None, 1))[1]
        return 1 if value in (None, "None", "null") else whole(value, settings[dest][0], where)

    tp = degree("tensor_model_parallel_size") or 1
    sp = _truth(settings.get("sequence_parallel", (None, False))[1])
    for dest in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather"):
        if dest in settings:  # the model's or the DDP's, which the callback's overrides
            old, stated = settings.pop(dest)
            job.skipped(old, stated, f"overridden by {prefix}")
    wanted = callback.get("tp_comm_overlap")
    on = _truth(wanted) and tp > 1 and sp
    settings["tp_comm_overlap"] = (f"{prefix}.tp_comm_overlap", on) if wanted is not None \
        else (f"{prefix} (its tp_comm_overlap default)", False)
    if _truth(wanted) and not on:
        job.notes.append(f"{prefix}.tp_comm_overlap: the callback turns it off with "
                         + ("tp 1" if tp < 2 else "no sequence parallelism"))
    if _truth(settings.get("use_distributed_optimizer", (None, False))[1]):
        parallel = tp * (degree("pipeline_model_parallel_size") or 1) \
            * (degree("context_parallel_size") or 1)
        dp = job.gpus // parallel if job.gpus and job.gpus % parallel == 0 else None
        for dest in ("overlap_grad_reduce", "overlap_param_gather"):
            if callback.get(dest) is not None:
                settings[dest] = (f"{prefix}.{dest}", callback[dest])
            else:  # dp unknown (the world from --gpus): on, as with any dp > 1
                settings[dest] = (f"{prefix} (its {dest} default, dp "
                                  f"{dp if dp is not None else '> 1'})", dp != 1)
        # its DDP buckets: 128 x 1024 x 1024 parameters where dp > 1 (_get_optimizer_overlap_cfgs)
        if callback.get("bucket_size") is not None:
            settings["ddp_bucket_size"] = (f"{prefix}.bucket_size", callback["bucket_size"])
        elif dp != 1:
            if "ddp_bucket_size" in settings:  # the DDP's, which the callback's overrides
                old, stated = settings.pop("ddp_bucket_size")
                job.skipped(old, stated, f"overridden by {prefix}")
            settings["ddp_bucket_size"] = (f"{prefix} (its bucket_size default with dp "
                                           f"{dp if dp is not None else '> 1'})",
                                           NEMO2_BUCKET_PARAMS)
    else:
        for dest in ("overlap_grad_reduce", "overlap_param_gather"):
            if dest in callback:
                job.skipped(f"{prefix}.{dest}", callback[dest], "no effect without the "
                                                                "distributed optimizer")
    # the pipeline's sends: overlapped by default with pp > 1 and virtual stages (the callback's
    # _get_model_comm_overlap_cfgs), the stated value over it
    vp = degree("num_virtual_stages_per_pipeline_rank") or 1
    if callback.get("overlap_p2p_comm") is not None:
        settings["overlap_p2p_comm"] = (f"{prefix}.overlap_p2p_comm", callback["overlap_p2p_comm"])
    elif (degree("pipeline_model_parallel_size") or 1) > 1 and vp > 1:
        settings["overlap_p2p_comm"] = (f"{prefix} (its overlap_p2p_comm default with virtual "
                                        "stages)", True)
    for name, value in callback.items():
        if name == "defer_embedding_wgrad_compute" and _truth(value):
            job.notes.append(deferred_wgrad_note(f"{prefix}.{name}"))
        elif name in _OVERLAP_NOT_READ:
            job.skipped(f"{prefix}.{name}", value, _OVERLAP_NOT_READ[name])
        elif name not in ("_target_", "tp_comm_overlap", "overlap_grad_reduce",
                          "overlap_param_gather", "overlap_p2p_comm", "bucket_size"):
            job.strange(f"{prefix}.{name}", value)


def _unset(value: Any) -> bool:
    return value is None or str(value).strip() in ("", "None", "null")


def _bridge_sequence(settings: Settings, name: str, fields: dict[str, Any], job: JobConfig,
                     where: str) -> None:
    """Megatron-Bridge's sequence: the dataset's, which ConfigContainer.validate asserts equal to
    the model's (src/megatron/bridge/training/config.py at 067f987df: assert
    self.model.seq_length == self.dataset.seq_length for GPTDatasetConfig and the other
    canonical dataset configs), so a model.seq_length that differs is refused as Bridge refuses
    it, and one that agrees is listed as the same. Called before the dataset's fields are put."""
    stated = [(f"{name}.{k}", fields[k]) for k in ("sequence_length", "seq_length")
              if k in fields and not _unset(fields[k])]
    model = settings.get("seq_length")
    if model is not None and not _unset(model[1]):
        stated.insert(0, model)
    if len({str(value).strip() for _, value in stated}) > 1:
        (key, value), (other, given) = stated[0], next(
            (k, v) for k, v in stated[1:] if str(v).strip() != str(stated[0][1]).strip())
        raise refuse_spec(where, key, value,
                          f"differs from {other} {given}: Megatron-Bridge asserts them equal "
                          "(ConfigContainer.validate); give them equal")
    if model is not None and len(stated) > 1 and stated[0] is model:
        job.skipped(*settings.pop("seq_length"), f"the same as {stated[-1][0]}")


# the data modules' own sequence where data.seq_length is not stated (NeMo v2.0.0 to v2.4.0:
# MockDataModule, nemo/collections/llm/gpt/data/mock.py, and PreTrainingDataModule,
# pre_training.py: seq_length: int = 2048)
_DATA_MODULE_SEQUENCE = {"MockDataModule": 2048, "PreTrainingDataModule": 2048}
# position embeddings that size no table by model.config.seq_length (Megatron-Core's rotary
# length is the input's: RotaryEmbedding.get_rotary_seq_len)
_ROTARY = ("rope", "yarn")


def _positions(target: str, settings: Settings) -> Any:
    """The model's position_embedding_type: stated, else its config class's (LlamaConfig's
    rope, GPTConfig's learned; None for a class perfmodel has no preset of)."""
    positions = settings.get("position_embedding_type", (None, None))[1]
    if _unset(positions):
        positions = "rope" if target.startswith("Llama") else \
            "learned_absolute" if target in _PRESETS else None
    return positions


def _nemo2_sequence(data: dict[str, Any], target: str, settings: Settings, job: JobConfig,
                    where: str) -> None:
    """NeMo 2's training sequence: the data module's seq_length. The data module builds its
    samples at it (MockDataModule and PreTrainingDataModule, nemo/collections/llm/gpt/data/
    mock.py and pre_training.py at v2.2.0) and its MegatronDataSampler(seq_len=seq_length)
    gives it to the pipeline schedule (nemo/lightning/pytorch/plugins/data_sampler.py); the
    model's config.seq_length is only GPTModel's max_sequence_length (base.py configure_model),
    and nothing asserts the two equal (_validate_config in nemo/collections/llm/api.py at
    v2.2.0 checks each > 0 apart). With rope the model's is not the step's; with learned
    positions it sizes the position table (a longer data.seq_length indexes past it), which
    perfmodel sizes by the sequence: refused where they differ."""
    model = settings.pop("seq_length", None)  # model.config's, put by _put
    if model is not None and _unset(model[1]):
        job.skipped(*model, "unset: the data module's")
        model = None
    key, given = "data.seq_length", data.get("seq_length")
    if _unset(given):
        if "seq_length" in data:
            job.skipped(key, given, "unset: the data module's default")
        module = str(data.get("_target_", "")).rsplit(".", 1)[-1]
        if module in _DATA_MODULE_SEQUENCE:
            key, given = f"data ({module}'s seq_length default)", _DATA_MODULE_SEQUENCE[module]
        elif model is not None:  # a data module perfmodel does not know: the model's
            settings["seq_length"] = model
            return
        else:
            return
    settings["seq_length"] = (key, given)
    if model is None:
        # unset: the config class's own, which sizes a learned position table as a stated one
        # does (GPTConfig175B's 2048, its preset's)
        if target not in _PRESETS or str(_positions(target, settings)) in _ROTARY:
            return
        from perfmodel.specs.model import load_model

        model = (f"model.config ({target}'s seq_length)", load_model(_PRESETS[target]).seq_len)
    if str(model[1]).strip() == str(given).strip():
        job.skipped(*model, f"the same as {key}")
        return
    positions = _positions(target, settings)
    if str(positions) not in _ROTARY:
        table = f"{positions} position" if positions else "config class's position"
        raise refuse_spec(where, key, given, f"differs from {model[0]} {model[1]}, which sizes "
                          f"the {table} table (NeMo 2 trains at data.seq_length; "
                          "perfmodel's table is the sequence's): give them equal")
    job.skipped(*model, f"the model's max_sequence_length, not the step's with {positions} "
                        f"positions: NeMo 2 trains at {key}")
    job.notes.append(f"{model[0]} {model[1]} differs from {key} {given}: NeMo 2 builds the "
                     f"samples and sizes the pipeline's sends at the data module's, seq_len "
                     f"{given}")


def _nemo2_distributed_optimizer(settings: Settings, job: JobConfig, optim: dict[str, Any],
                                 ddp: tuple[str, Any] | None) -> None:
    """The distributed optimizer where NeMo 2's trainer.strategy.ddp and optim.config both can
    say it: the optimizer config's, stated or OptimizerConfig's default (False). MegatronStrategy
    .connect (nemo/lightning/pytorch/strategies/megatron_strategy.py at 8cfedd7) sets the DDP
    config's use_distributed_optimizer to the OptimizerConfig's wherever they differ ("Fixing
    mis-match between ddp-config & mcore-optimizer config"), and the optimizer is built from
    the OptimizerConfig (MegatronOptimizerModule, nemo/lightning/pytorch/optim/megatron.py):
    the DDP's value loses, listed. Only for an OptimizerConfig (connect checks isinstance): an
    optim.config of another class leaves the DDP's as stated."""
    target = str(optim.get("_target_", ""))
    if target and not target.rsplit(".", 1)[-1] == "OptimizerConfig":
        if ddp is not None:
            settings.setdefault("use_distributed_optimizer", ddp)
        return
    key = "optim.config.use_distributed_optimizer"
    if "use_distributed_optimizer" not in optim:  # OptimizerConfig's default
        key = "optim.config (OptimizerConfig's use_distributed_optimizer default, False)"
        settings["use_distributed_optimizer"] = (key, False)
    if ddp is None:
        return
    old, stated = ddp
    same = _flag({"d": ddp}, "d", job.path) == _flag(settings, "use_distributed_optimizer",
                                                      job.path)
    job.skipped(old, stated, f"the same as {key}" if same else
                f"overridden by {key}: NeMo's MegatronStrategy sets the DDP's to the "
                "optimizer config's")


def _nemo2_param_gather(settings: Settings, job: JobConfig) -> None:
    """The DDP's overlap_param_gather without the distributed optimizer (NeMo 2 has no
    Megatron-LM argument check): Megatron-Core's DDP registers its forward pre-hooks that
    gather the weights only with both (distributed_data_parallel.py use_forward_hook =
    use_distributed_optimizer and overlap_param_gather at core_v0.13.0 and core_v0.14.0, the
    NeMo 2 releases' Megatron-Core), and only the distributed optimizer gathers weights at
    all: listed as no effect, as NeMo runs it, rather than refused as Megatron-LM's flags are.
    Under FSDP (trainer.strategy.fsdp) it is the prefetch, read."""
    if any(_flag(settings, dest, job.path) for dest in (
            "use_distributed_optimizer", "use_torch_fsdp2", "use_megatron_fsdp",
            "use_custom_fsdp")):
        return
    if _flag(settings, "overlap_param_gather", job.path):
        job.skipped(*settings.pop("overlap_param_gather"),
                    "no effect without the distributed optimizer (Megatron-Core's DDP gathers "
                    "no weights then)")


_NEMO2_NOT_READ = {"data": "the data, not the step",
                   "model": "the model's module (its config gives the model)",
                   "optim": "the learning-rate schedule or the optimizer's module"}


def _nemo2(data: dict[str, Any], settings: Settings, job: JobConfig, where: str) -> None:
    trainer = data["trainer"]
    nemo1.world(trainer, job, where)
    strategy = trainer.get("strategy") or {}
    # MegatronStrategy's parallel sizes, stated and its defaults: put over the model's below
    from_strategy: Settings = {}
    defaults: Settings = {}
    if isinstance(strategy, dict):
        ddp = strategy.get("ddp")
        _put(from_strategy, job, "trainer.strategy",
             {k: v for k, v in strategy.items() if k not in ("ddp", "fsdp")})
        if isinstance(ddp, dict):
            _put(settings, job, "trainer.strategy.ddp", ddp)
        elif ddp is not None and str(ddp) != "megatron":  # MegatronStrategy's ddp literal
            raise refuse_plan(where, "trainer.strategy.ddp", ddp,
                              "PyTorch DDP under NeMo 2 is not modelled (MegatronStrategy "
                              "refuses it beside Megatron-Core's optimizer); allowed: megatron "
                              "or a DistributedDataParallelConfig")
        elif ddp is not None:
            job.took("trainer.strategy.ddp", ddp, "Megatron-Core's DDP with its defaults")
        fsdp = strategy.get("fsdp")
        if fsdp not in (None, "None", "null"):  # MegatronStrategy(fsdp=...): its DDP's FSDP
            dest = {"megatron": "use_megatron_fsdp", "pytorch": "use_torch_fsdp2"}.get(str(fsdp))
            if dest is None:
                raise refuse_plan(where, "trainer.strategy.fsdp", fsdp,
                                  "allowed: megatron, pytorch or null")
            settings[dest] = ("trainer.strategy.fsdp", True)
        # they replace the model config's, stated or not (set_model_parallel_attributes in
        # nemo/lightning/pytorch/strategies/utils.py copies every ParallelismConfig field the
        # config has)
        defaults = {_RENAMED.get(name, name): (f"trainer.strategy.{name} (MegatronStrategy's "
                                               "default)", default)
                    for name, default in _STRATEGY_DEFAULTS.items()}
    for name, value in trainer.items():
        if name not in ("devices", "num_nodes", "strategy", "plugins", "callbacks"):
            job.skipped(f"trainer.{name}", value, "not the step's (run length, logging)")
    data_section = section(data, "data", where)
    for name in ("micro_batch_size", "global_batch_size"):
        if name in data_section:
            settings[name] = (f"data.{name}", data_section[name])
    model = data.get("model") or {}
    config = model.get("config") if isinstance(model, dict) else None
    target = ""
    if isinstance(config, dict):
        target = str(config.get("_target_", "")).rsplit(".", 1)[-1]
        if target in _PRESETS:
            job.preset = _PRESETS[target]
            job.preset_source = f"NeMo 2's {target} (nemo.collections.llm.gpt.model)"
            job.took("model.config._target_", target, f"the model of preset {job.preset}")
        elif target:
            job.needs_model = f"model.config._target_ {target} is not a config class perfmodel " \
                              "maps to a preset"
        _put(settings, job, "model.config", {k: v for k, v in config.items()
                                             if k != "_target_"}, model=True)
        # nemo_run serializes the fields a recipe overrides: the loss's fusion, where not
        # stated, is GPTConfig's default, on (nemo/collections/llm/gpt/model/base.py at
        # v2.0.0 and v2.2.0; Megatron-LM's is off): Megatron-Core's native fusion
        settings.setdefault("cross_entropy_loss_fusion",
                            ("model.config (GPTConfig's cross_entropy_loss_fusion default)",
                             True))
    _nemo2_sequence(data_section, target, settings, job, where)
    # the strategy's parallel sizes over the model's: those it states, and its defaults where
    # the model states one
    for dest, (key, value) in {**defaults, **from_strategy}.items():
        if dest in settings and settings[dest][1] != value:
            job.skipped(*settings[dest], f"overridden by {key}")
        if dest in settings or dest in from_strategy:
            settings[dest] = (key, value)
    optim = (data.get("optim") or {}).get("config") if isinstance(data.get("optim"), dict) \
        else None
    if isinstance(optim, dict):  # Megatron-Core's OptimizerConfig
        ddp_setting = settings.pop("use_distributed_optimizer", None)  # the DDP's, put above
        _put(settings, job, "optim.config", optim)
        _nemo2_distributed_optimizer(settings, job, optim, ddp_setting)
    for name, value in data.items():  # what is left of the recipe: said why it is not read
        if name in ("trainer", "data", "model", "optim") and isinstance(value, dict):
            read = {"data": ("micro_batch_size", "global_batch_size", "seq_length"),
                    "model": ("config",), "optim": ("config",)}.get(name, tuple(value))
            for field_name, field in value.items():
                if field_name not in read:
                    job.skipped(f"{name}.{field_name}", field, _NEMO2_NOT_READ[name])
        elif name not in ("trainer", "data", "model", "optim"):
            job.skipped(f"{name}.*" if isinstance(value, dict) else name,
                        "(a section)" if isinstance(value, dict) else value,
                        "the recipe's entry point, logging, checkpointing or resuming")
    # the precision plugin last: MegatronStrategy.connect overrides the model's, the optimizer's
    # and the DDP's fields of its DtypeConfig's names with its own (update_config_with_dtype_
    # overrides, nemo/lightning/pytorch/strategies/megatron_strategy.py at 8cfedd7)
    plugins = trainer.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else [plugins]:
        target = str(plugin.get("_target_", "")) if isinstance(plugin, dict) else ""
        if isinstance(plugin, dict) and (target.endswith("MegatronMixedPrecision")
                                         or (not target and "precision" in plugin)):
            _plugin(plugin, settings, job, where)
        elif plugin is not None:
            job.strange("trainer.plugins", target or plugin, "a plugin perfmodel does not read")
    callbacks = trainer.get("callbacks")
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        _callback(callback, settings, job, where)
    _nemo2_param_gather(settings, job)
