"""NeMo 1 (NVIDIA/NeMo before 2.0; the NeMo Framework Launcher and NVIDIA's DGX Cloud recipes of
2024): a megatron_gpt config YAML (`trainer`, a flat `model` with `optim` and `data`), read as
Megatron settings (perfmodel.configs.megatron maps those onto a model and a plan).

Names and defaults are NeMo 1's (examples/nlp/language_modeling/conf/megatron_gpt_config.yaml and
nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py, NeMo 1.23 / 24.07; the
recipes of NVIDIA/dgxc-benchmarking v24.11.1, nemotron/nemotron4-15b-synth.yaml):
  - trainer.devices x trainer.num_nodes is the world; trainer.precision bf16 / bf16-mixed, 16 /
    16-mixed or 32;
  - model.data.seq_length is the sequence (the samples NeMo builds; else encoder_seq_length, the
    model's length, noted where the two differ); activation swiglu /
    fast-swiglu / geglu / reglu gate the MLP, squared-relu is Nemotron's; normalization
    layernorm1p is LayerNorm with a zero-centred weight (the same cost); bias false drops every
    linear bias; share_embeddings_and_output_weights ties the output layer;
  - activations_checkpoint_granularity / _method / _num_layers are Megatron's
    --recompute-granularity / --recompute-method / --recompute-num-layers;
  - optim.name distributed_fused_adam (or mcore_distributed_optim) is the distributed optimizer
    (ZeRO 1) with its overlap_grad_sync / overlap_param_sync (Megatron-Core's:
    overlap_param_gather), grad_sync_dtype bf16 its bf16 gradient reduce, dtype bf16 Apex's bf16
    states (Megatron-Core's take no dtype from NeMo); Apex's distributed_fused_adam beside
    megatron_amp_O2's bf16 weights (no
    fp8_params) keeps the master weights as their remainders (megatron_base_model.py,
    setup_optimization: store_param_remainders); fused_adam / adam the plain one;
  - fp8 true with fp8_hybrid (or fp8_e4m3) is Transformer Engine's delayed scaling, fp8_params
    the weights in FP8; ub_tp_comm_overlap is TP communication behind the GEMMs;
  - moe_expert_capacity_factor with moe_pad_expert_input_to_capacity is the model's
    capacity_factor (capacity());
  - mcore_gpt and transformer_engine (NeMo's default false for both): Transformer Engine's
    layers, or without it Megatron-Core's local ones (unfused attention; no FP8, no
    ub_tp_comm_overlap);
Refused: torch FSDP (model.fsdp), partial activation checkpoints (a count > 0 under a checkpoint
granularity; 0 and null are none), a block type other than pre_ln,
positions other than learned_absolute and rope, the legacy (non-mcore) model without Transformer
Engine.
"""

from __future__ import annotations

from typing import Any

from perfmodel.configs.job import (
    CAPACITY,
    WINDOW,
    JobConfig,
    Setting,
    capacity,
    deferred_wgrad_note,
    refuse_plan,
    refuse_spec,
    trainer_world,
    whole,
    window,
    yes_or_no,
)
from perfmodel.configs.megatron import Settings
from perfmodel.errors import SpecError
from perfmodel.specs.loading import number

# model keys that are Megatron's dests under the same name
SAME = ("hidden_dropout", "attention_dropout",
        "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
        "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
        "expert_tensor_parallel_size", "num_layers", "hidden_size", "ffn_hidden_size",
        "num_attention_heads", "num_query_groups", "kv_channels", "max_position_embeddings",
        "make_vocab_size_divisible_by", "sequence_parallel", "moe_router_topk",
        "moe_ffn_hidden_size", "moe_token_dispatcher_type", "moe_grouped_gemm",
        "moe_shared_expert_intermediate_size", "cross_entropy_loss_fusion",
        "use_tp_pp_dp_mapping", "cpu_offloading", "cpu_offloading_num_layers",
        "cpu_offloading_activations", "cpu_offloading_weights", "apply_rope_fusion",
        "bias_activation_fusion", "masked_softmax_fusion", "gradient_accumulation_fusion",
        "fp32_residual_connection", "fp8_wgrad", "overlap_p2p_comm")
RENAMED = {"virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank",
           "num_moe_experts": "num_experts",
           "activations_checkpoint_granularity": "recompute_granularity",
           "activations_checkpoint_method": "recompute_method",
           "activations_checkpoint_num_layers": "recompute_num_layers",
           "ub_tp_comm_overlap": "tp_comm_overlap", "fp8_params": "fp8_param_gather",
           "rampup_batch_size": "rampup_batch_size", "rotary_percentage": "rotary_percent",
           "bias_dropout_add_fusion": "bias_dropout_fusion"}
# moe_grouped_gemm false: the experts one GEMM each (Megatron-Core's SequentialMLP), which
# perfmodel costs at its grouped GEMM's efficiency all the same (docs/moe.md)
GROUPED_OFF = "off: the experts' GEMMs one by one, costed as perfmodel's grouped GEMM all the same"
# Megatron-Core's expert capacity (TransformerConfig), read by capacity()
# model keys read by _model, _optimizer and settings_of themselves
READ_HERE = frozenset((
    "tokenizer", "data", "optim", "encoder_seq_length", "activation", "normalization", "bias",
    "position_embedding_type", "qkv_bias", "override_vocab_size", *CAPACITY,
    "share_embeddings_and_output_weights", "fp8", "fp8_hybrid", "fp8_e4m3", "mcore_gpt", "fsdp",
    *WINDOW,
    "transformer_block_type", "transformer_engine", "use_flash_attention", "name",
    "num_micro_batches_with_partial_activation_checkpoints",
    "activations_checkpoint_layers_per_pipeline"))
# model keys with the same cost whatever their value (numerics, initialization, fusions of the
# same work, logging)
HARMLESS = frozenset((
    "init_method_std", "use_scaled_init_method",
    "ffn_dropout", "apply_query_key_layer_scaling", "layernorm_zero_centered_gamma",
    "layernorm_epsilon", "do_layer_norm_weight_decay", "pre_process", "post_process",
    "persist_layer_norm", "headscale", "openai_gelu", "normalize_attention_scores",
    "rotary_base", "attention_type",
    "native_amp_init_scale", "native_amp_growth_interval", "hysteresis",
    "fp16_lm_cross_entropy", "megatron_amp_O2",  # refused off under 16 bits (settings_of)
    "grad_allreduce_chunk_size_mb", "grad_div_ar_fusion", "seed",
    "resume_from_checkpoint", "use_cpu_initialization", "onnx_safe",
    "apex_transformer_log_level", "gradient_as_bucket_view", "sync_batch_comm",
    "batch_p2p_comm", "sharp", "nsys_profile", "fp8_margin",
    "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo",
    "gc_interval", "defer_embedding_wgrad_compute", "fsdp_sharding_strategy",
    "fsdp_grad_reduce_dtype", "fsdp_sharded_checkpoint", "precision",
    "seq_len_interpolation_factor",
    "tp_comm_overlap_cfg", "ub_tp_comm_overlap_cfg", "rotary_interleaved", "moe_aux_loss_coeff",
    "moe_z_loss_coeff", "moe_router_load_balancing_type", "moe_input_jitter_eps",
    "moe_per_layer_logging", "moe_router_pre_softmax",
    "moe_router_score_function", "moe_permute_fusion", "moe_router_dtype", "layernorm1p",
    "batch_size", "nemo_path", "restore_from_path", "peft", "virtual_prompt_style",
    "dist_ckpt_format", "dist_ckpt_load_on_device", "dist_ckpt_parallel_save",
    "dist_ckpt_parallel_save_within_dp", "dist_ckpt_parallel_load",
    "dist_ckpt_torch_dist_multiproc",
    "dist_ckpt_assume_constant_structure", "dist_ckpt_parallel_dist_opt",
    "dist_ckpt_load_strictness", "mock_dataset", "shape_file",
    "use_te_rng_tracker", "target", "enable_megatron_core_optim",
    "tp_comm_bootstrap_backend"))
# the gated MLPs (NeMo 1's activation values): Megatron's --swiglu (three matrices)
GATED = ("swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu")
UNGATED = ("gelu", "fast-gelu", "openai-gelu", "relu", "squared-relu")
FUSION_DP = "_nemo1_fusion_dp"  # finish(): the fusion off where the world gives dp > 1
AFTER = "_nemo1_after"  # plan fields after_settings fixes once the Megatron settings are applied
PRECISIONS = {"bf16": "bf16", "bf16-mixed": "bf16", "16": "fp16", "16-mixed": "fp16",
              "32": "fp32", "32-true": "fp32", "fp16": "fp16", "fp32": "fp32"}


def is_nemo1(data: dict[str, Any]) -> bool:
    """A NeMo 1 megatron_gpt config: a trainer and a flat model section (its sizes or degrees
    at the top, no NeMo 2 `config`)."""
    model = data.get("model")
    return isinstance(data.get("trainer"), dict) and isinstance(model, dict) and \
        "config" not in model and any(k in model for k in (
            "num_layers", "tensor_model_parallel_size", "encoder_seq_length"))


# Lightning's trainer.devices that take every GPU of the node (lightning/fabric/utilities/
# device_parser.py, parse_gpu_ids: -1 and "-1" all of them; pytorch/trainer/connectors/
# accelerator_connector.py: "auto" the accelerator's auto_device_count): the launcher's count
ALL_DEVICES = (-1, "-1", "auto")


def world(trainer: dict[str, Any], job: JobConfig, where: str) -> None:
    """The world size of a NeMo trainer section (NeMo 1 and 2): devices x num_nodes, or none
    where devices takes every GPU of a node (-1, auto: the launcher's count; --gpus gives it)."""
    devices = trainer.get("devices", 1)
    if devices not in ALL_DEVICES:
        trainer_world(trainer, job, where)
        return
    nodes = whole(trainer.get("num_nodes", 1), "trainer.num_nodes", where)
    job.took("trainer.devices", devices, "every GPU of a node (Lightning's): the world is "
                                         "--gpus")
    job.took("trainer.num_nodes", nodes, "nodes (the world from --gpus)")


def settings_of(data: dict[str, Any], job: JobConfig, where: str) -> Settings:
    """The config's Megatron settings (its world size and the notes set on job)."""
    settings: Settings = {}
    trainer = data["trainer"]
    world(trainer, job, where)
    precision = str(trainer.get("precision", "32")).lower()
    if precision not in PRECISIONS:
        raise refuse_plan(where, "trainer.precision", precision,
                          f"NeMo 1's values: {', '.join(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    # one setting for the one dtype (None: neither, fp32), shown with the precision's value
    settings["fp16" if dtype == "fp16" else "bf16"] = (f"trainer.precision {precision}",
                                                       True if dtype != "fp32" else None)
    for name, value in trainer.items():
        if name not in ("devices", "num_nodes", "precision"):
            job.skipped(f"trainer.{name}", value, "not the step's (run length, logging)")
    model = data["model"]
    o2 = model.get("megatron_amp_O2")
    if isinstance(o2, str):
        # NeMo 1 tests it as Python does (megatron_base_model.py at 8cfedd7: self.megatron_amp_O2
        # = cfg.get('megatron_amp_O2', False), then `if self.megatron_amp_O2`; OmegaConf keeps a
        # quoted YAML value a string): any non-empty text, "false" too, is on
        raise refuse_plan(where, "model.megatron_amp_O2", repr(o2),
                          "a string, which NeMo 1 reads as on whatever it says; allowed: true "
                          "or false (unquoted)")
    if dtype in ("bf16", "fp16") and not o2:
        # megatron_base_model.py (8cfedd7): without megatron_amp_O2 the weights are fp32
        # (params_dtype) and the layers run under torch.autocast (enable_autocast)
        raise refuse_plan(where, "model.megatron_amp_O2", model.get("megatron_amp_O2", False),
                          f"fp32 weights under {dtype} autocast (NeMo 1's default) are not "
                          "modelled (megatron_amp_O2 true's 16-bit weights are)")
    _model(model, settings, job, where)
    optim = model.get("optim") or {}
    if not isinstance(optim, dict):
        raise SpecError(f"{where}: model.optim must be a mapping of settings, got '{optim}'")
    _optimizer(optim, settings, job, where, dtype == "bf16" and bool(model.get("megatron_amp_O2"))
               and not model.get("fp8_params"))
    _grad_fusion(model, str(optim.get("name", "fused_adam")), settings, job, where)
    data_section = model.get("data") or {}
    if not isinstance(data_section, dict):
        raise SpecError(f"{where}: model.data must be a mapping of settings, got "
                        f"'{data_section}'")
    _sequence(model, data_section, settings, job)
    for name, value in data_section.items():
        if name != "seq_length":
            job.skipped(f"model.data.{name}", value, "the data, not the step")
    tokenizer = model.get("tokenizer") or {}
    if isinstance(tokenizer, dict):
        # Megatron's GPT-2 BPE (library megatron, type GPT2BPETokenizer) is a vocabulary
        # perfmodel knows; the others' files give it (--model)
        megatron = tokenizer.get("library") == "megatron"
        kind = tokenizer.get("type") if megatron else tokenizer.get("library")
        if kind:  # named by its own key (the refusal that asks for --model says which)
            settings["tokenizer_type"] = ("model.tokenizer.type" if megatron
                                          else "model.tokenizer.library", str(kind))
    if "seq_length" not in settings:
        raise SpecError(f"{where}: no model.encoder_seq_length or model.data.seq_length: the "
                        "training sequence length is not given")
    for name, value in data.items():
        if name not in ("trainer", "model"):
            job.skipped(f"{name}.*", "(a section)" if isinstance(value, dict) else value,
                        "the launcher's, logging or checkpointing")
    return settings


def _grad_fusion(model: dict[str, Any], optimizer: str, settings: Settings, job: JobConfig,
                 where: str) -> None:
    """gradient_accumulation_fusion as NeMo 1 runs it (megatron_base_model.py, v1.23.0 to
    v2.0.0): a key the model config lacks takes ModelParallelConfig's default, false
    (build_model_parallel_config; Megatron-Core's model_parallel_config.py); given true,
    _validate_and_override_config turns it off with data parallelism beside pp 1 and an optimizer
    other than the distributed ones (distributed_fused_adam, mcore_distributed_optim), and
    without megatron_amp_O2. The data-parallel degree is the world over tp x pp x cp (NeMo's
    AppState); where the world comes from --gpus, finish() decides."""
    def degree(name: str) -> int:
        return whole(model.get(name) or 1, f"model.{name}", where)

    key = "model.gradient_accumulation_fusion"
    if "gradient_accumulation_fusion" not in model:
        settings["gradient_accumulation_fusion"] = (f"{key} (not given: NeMo's default, false)",
                                                    False)
        return
    if not _truth(model["gradient_accumulation_fusion"]):
        return
    why = ""
    if not model.get("megatron_amp_O2", False):  # a bool or number (settings_of refuses text)
        why = "without megatron_amp_O2"
    elif degree("pipeline_model_parallel_size") == 1 \
            and optimizer not in ("distributed_fused_adam", "mcore_distributed_optim"):
        parallel = degree("tensor_model_parallel_size") * degree("context_parallel_size")
        if job.gpus is None:  # the world from --gpus: finish() decides
            job.plan[FUSION_DP] = parallel
            return
        if job.gpus // parallel > 1:
            why = (f"with dp {job.gpus // parallel}, pp 1 and optim.name {optimizer} (not a "
                   "distributed optimizer)")
    if why:
        settings["gradient_accumulation_fusion"] = (
            f"{key} true, off in NeMo {why} (_validate_and_override_config):", False)


def finish(job: JobConfig, gpus: int) -> None:
    """What follows from the world size given by --gpus: NeMo's gradient_accumulation_fusion
    off with dp > 1 (_grad_fusion)."""
    parallel = job.plan.pop(FUSION_DP, None)
    if parallel is None or gpus // parallel <= 1:
        return
    job.fix("grad_accumulation_fusion", False)
    renote(job, "model.gradient_accumulation_fusion",
           f"off: NeMo turns it off with dp {gpus // parallel}, pp 1 and a non-distributed "
           "optimizer (_validate_and_override_config): grad_accumulation_fusion false, each "
           "micro-batch's weight gradients added into the main gradients apart")


def after_settings(data: dict[str, Any], job: JobConfig) -> None:
    """What the config decides over the Megatron settings once they are applied: the plan
    fields NeMo sets apart from Megatron's (AFTER), override_vocab_size's vocabulary, which
    NeMo's model takes as given (no padding), and the local layers' attention said in NeMo's
    words."""
    for field_name, value in job.plan.pop(AFTER, {}).items():
        job.fix(field_name, value)
    activation = str(data["model"].get("activation", "gelu")).lower()
    if activation in GATED and "swiglu" not in activation:
        kind = activation.removeprefix("fast-")
        renote(job, f"model.activation {activation}",
               f"gated_mlp ({kind}: three matrices, costed as SwiGLU's)")
    if not _truth(data["model"].get("transformer_engine", False)):
        renote(job, "model.transformer_engine", "Megatron-Core's local layers "
               "(get_gpt_layer_local_spec): DotProductAttention, unfused: flash_attention false",
               value=data["model"].get("transformer_engine", False))
    if data["model"].get("override_vocab_size") is not None:
        job.vocab_multiple = 0
        renote(job, "model.override_vocab_size", f"vocab {job.model.get('vocab')} (NeMo's model "
                                                 "takes it as given: no padding)")


def renote(job: JobConfig, key: str, note: str, **value: Any) -> None:
    """The note of a setting read (by the Megatron reader, in Megatron's words) told in the
    config's (value: the value shown, where the Megatron setting's is not the config's)."""
    job.read = [Setting(key=s.key, value=value.get("value", s.value), note=note)
                if s.key == key else s for s in job.read]


def _sequence(model: dict[str, Any], data: dict[str, Any], settings: Settings,
              job: JobConfig) -> None:
    """The training sequence: NeMo builds its samples data.seq_length long (megatron_gpt_model.py
    build_train_valid_test_datasets: "sequence_length": self.cfg.data.seq_length, NeMo v1.23.0
    to v2.0.0), the length each step trains on; encoder_seq_length sizes the model (its
    max_sequence_length) and the pipeline's sends (fwd_bwd_step's seq_length). Without
    data.seq_length, encoder_seq_length."""
    encoder, given = model.get("encoder_seq_length"), data.get("seq_length")
    if given is None:
        if encoder is not None:
            settings["seq_length"] = ("model.encoder_seq_length", encoder)
        if "seq_length" in data:
            job.skipped("model.data.seq_length", given, "unset: encoder_seq_length")
        return
    if encoder is None or str(encoder) == str(given):
        key = "model.encoder_seq_length" if encoder is not None else "model.data.seq_length"
        settings["seq_length"] = (key, encoder if encoder is not None else given)
        if encoder is not None:
            job.skipped("model.data.seq_length", given, "the same as encoder_seq_length")
        return
    settings["seq_length"] = ("model.data.seq_length", given)
    job.skipped("model.encoder_seq_length", encoder, "the model's length (its position reach); "
                                                     "the samples are data.seq_length's")
    pipeline = model.get("pipeline_model_parallel_size") or 1
    job.notes.append(
        f"model.encoder_seq_length {encoder} differs from model.data.seq_length {given}: NeMo "
        f"builds its samples from data.seq_length (megatron_gpt_model.py), the sequence each "
        f"step trains on: seq_len {given}"
        + (f"; with pp {pipeline} NeMo sizes the pipeline's sends by encoder_seq_length "
           "(fwd_bwd_step), which these samples do not match: the run as written exchanges "
           "tensors of another shape than its stages compute" if str(pipeline) != "1" else ""))


def _model(model: dict[str, Any], settings: Settings, job: JobConfig, where: str) -> None:
    for name, value in model.items():
        key = f"model.{name}"
        dest = RENAMED.get(name, name if name in SAME else None)
        if dest is not None:
            if dest == "moe_grouped_gemm" and not _truth(value):
                job.skipped(key, value, GROUPED_OFF)
            elif value is not None:
                settings[dest] = (key, value)
            else:
                job.skipped(key, value, "unset: the default")
        elif name == "deterministic_mode" and value:  # Megatron-LM's --deterministic-mode
            job.notes.append(f"{key}: deterministic algorithms (Transformer Engine's "
                             "deterministic attention backward, one NCCL algorithm): their "
                             "slowdown is not modelled")
        elif name == "deterministic_mode":
            job.skipped(key, value, "off")
        elif name == "defer_embedding_wgrad_compute" and value not in (None, False, 0):
            job.notes.append(deferred_wgrad_note(key))
        elif name in HARMLESS:
            job.skipped(key, value, "the same cost (numerics, fusion, initialization, logging)")
        elif name in READ_HERE:
            pass
        elif value in (None, False, 0, [], "", {}):
            job.skipped(key, value, "off")
        else:
            job.strange(key, value)
    if model.get("fsdp"):
        raise refuse_plan(where, "model.fsdp", True, "NeMo 1's torch FSDP is not modelled "
                          "(the distributed optimizer is: optim.name distributed_fused_adam)")
    _partial_checkpoints(model, job, where)
    block = str(model.get("transformer_block_type", "pre_ln"))
    if block != "pre_ln":
        raise refuse_spec(where, "model.transformer_block_type", block,
                          "perfmodel models pre-LayerNorm blocks (pre_ln)")
    local = _layers(model, settings, job, where)
    capacity(model, "model", job, where)
    # TransformerConfig's fields NeMo 1 copies from the model config by name
    # (megatron_base_model.py build_transformer_config at v1.23.0 and v2.0.0: `elif field.name in
    # cfg`), window_size among them: read as the NeMo 2 / Megatron-Bridge reader reads them
    window(model, "model", job, where)
    activation = str(model.get("activation", "gelu")).lower()
    if activation not in GATED + UNGATED:
        raise refuse_spec(where, "model.activation", activation,
                          f"perfmodel models {', '.join(GATED + UNGATED)}")
    if activation in GATED:
        settings["swiglu"] = (f"model.activation {activation}", True)
    elif activation == "squared-relu":
        settings["squared_relu"] = ("model.activation squared-relu", True)
    else:
        job.took("model.activation", activation, "gated_mlp false (two matrices)")
    norm = str(model.get("normalization", "layernorm")).lower()
    norms = {"layernorm": "LayerNorm", "layernorm1p": "LayerNorm", "rmsnorm": "RMSNorm"}
    if norm not in norms:
        raise refuse_spec(where, "model.normalization", norm, "perfmodel models layernorm, "
                          "layernorm1p (zero-centred weight, the same cost) and rmsnorm")
    settings["normalization"] = ("model.normalization", norms[norm])
    positions = str(model.get("position_embedding_type", "learned_absolute"))
    if positions not in ("learned_absolute", "rope"):
        raise refuse_spec(where, "model.position_embedding_type", positions,
                          "perfmodel models learned_absolute and rope")
    settings["position_embedding_type"] = ("model.position_embedding_type", positions)
    if positions == "rope" and "apply_rope_fusion" not in model:
        # megatron_base_model.py build_transformer_config: cfg.get('apply_rope_fusion', True) at
        # v1.23.0, False at v2.0.0
        job.notes.append("model.apply_rope_fusion not given: NeMo's default is on at v1.23, off "
                         "from v2.0 (RoPE op by op); costed as the fused kernel either way (its "
                         "extra element-wise passes are not modelled)")
    if model.get("bias", True) is False:
        settings["disable_bias_linear"] = ("model.bias", True)
    if "qkv_bias" in model:  # megatron_base_model.py: add_qkv_bias = cfg.get('qkv_bias', False)
        settings["add_qkv_bias"] = ("model.qkv_bias", bool(model["qkv_bias"]))
    if model.get("override_vocab_size") is not None:
        # megatron_gpt_model.py model_provider_func: vocab_size=cfg.get('override_vocab_size',
        # padded_vocab_size), the vocabulary as given, without Megatron's padding
        settings["vocab_size"] = ("model.override_vocab_size", model["override_vocab_size"])
        if "make_vocab_size_divisible_by" in settings:
            job.skipped(*settings.pop("make_vocab_size_divisible_by"),
                        "no effect beside override_vocab_size (the vocabulary unpadded)")
    elif "override_vocab_size" in model:
        job.skipped("model.override_vocab_size", None, "unset: the tokenizer's, padded")
    if "share_embeddings_and_output_weights" in model:
        settings["untie_embeddings_and_output_weights"] = (
            "model.share_embeddings_and_output_weights",
            not model["share_embeddings_and_output_weights"])
    if model.get("fp8"):
        fmt = "hybrid" if model.get("fp8_hybrid", True) else "e4m3"
        settings["fp8_format"] = ("model.fp8", fmt)
        settings["fp8_recipe"] = ("model.fp8", "delayed")  # NeMo 1: TE's DelayedScaling
    for name, said in (("fp8", "off: 16-bit GEMMs"), ("fp8_hybrid", "with fp8: its format"),
                       ("fp8_e4m3", "with fp8: its format"), ("fsdp", "off"),
                       ("transformer_block_type", "pre_ln, the block modelled")):
        if name in model and not (name == "fp8" and model["fp8"]):
            job.skipped(f"model.{name}", model[name], said)
    if "use_flash_attention" in model:
        # NeMo passes it to its legacy model's own layers only (megatron_gpt_model.py
        # model_provider_func; "this config does nothing when transformer_engine=True",
        # megatron_gpt_config.yaml), which are refused here (_layers)
        job.skipped("model.use_flash_attention", model["use_flash_attention"],
                    "no effect on Megatron-Core's local layers: their attention is unfused"
                    if local else "no effect on Transformer Engine's layers: Transformer Engine "
                                  "picks the attention (its NVTE_FLASH_ATTN and NVTE_FUSED_ATTN)")


# model.name, the layer spec Megatron-Core's model is built with (megatron_gpt_model.py
# get_specs, NeMo 8cfedd72; "" is te_gpt with transformer_engine, else the local spec): the
# specs of a GPT layer as modelled, and the others refused, with what they build instead
SPECS_READ = {
    "te_gpt": "Transformer Engine's GPT layer spec",
    "decoder_block_gpt": "the decoder block spec: the same layers as te_gpt (or local ones)",
    "megatron_gpt_full_te_layer_autocast": "Transformer Engine's TransformerLayer: the same "
                                           "GEMMs and fused kernels as te_gpt",
}
SPECS_REFUSED = {
    "te_gpt_hyena": "Hyena's long convolutions in place of attention (StripedHyena) are not "
                    "modelled",
    "megatron_falcon_gpt": "Falcon's parallel attention and MLP layer is not modelled",
    "megatron_gemma2": "Gemma 2's layer (sliding-window attention every other layer, logit "
                       "soft-capping, extra norms) is not modelled",
    "modelopt": "ModelOpt's quantization layer spec is not modelled",
}


def _spec_name(model: dict[str, Any], job: JobConfig, where: str) -> bool:
    """model.name, read as NeMo builds its layers (SPECS_READ, SPECS_REFUSED; only Megatron-Core's
    model reads it: mcore_gpt true). Returns whether it names a spec NeMo builds with Transformer
    Engine's layers whatever transformer_engine says (te_gpt, the full TE layer)."""
    if "name" not in model:
        return False
    name = "" if model["name"] is None else str(model["name"])
    if not _truth(model.get("mcore_gpt", False)):
        job.skipped("model.name", name, "NeMo's legacy model builds no layer spec")
        return False
    if name in SPECS_REFUSED:
        raise refuse_plan(where, "model.name", name, SPECS_REFUSED[name])
    if name and name not in SPECS_READ:
        raise refuse_plan(where, "model.name", name,
                          "not a layer spec NeMo builds (get_specs: "
                          + ", ".join(sorted([*SPECS_READ, *SPECS_REFUSED])) + ")")
    job.took("model.name", name or "''", SPECS_READ.get(name, "te_gpt with transformer_engine, "
                                                            "the local spec without"))
    return name in ("te_gpt", "megatron_gpt_full_te_layer_autocast")


def _truth(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1")


def _layers(model: dict[str, Any], settings: Settings, job: JobConfig, where: str) -> bool:
    """The layers NeMo builds (megatron_gpt_model.py model_provider_func and get_specs, NeMo
    v1.23.0 to v2.0.0, where mcore_gpt and transformer_engine both default to false):
    Megatron-Core's model with Transformer Engine's layers (the te_gpt spec), or, with
    transformer_engine false, with Megatron-Core's local ones (get_gpt_layer_local_spec: Apex's
    fused LayerNorm, ColumnParallelLinear and RowParallelLinear, Megatron-Core's
    DotProductAttention, which is unfused: its scores' GEMM, fused softmax and the values' GEMM;
    fused bias-GeLU and bias-dropout-add as Transformer Engine's layers have them). NeMo's
    legacy model (mcore_gpt false) with Transformer Engine's layers costs the same; without
    them it is refused. Returns whether the layers are the local ones."""
    mcore = _truth(model.get("mcore_gpt", False))
    te_spec = _spec_name(model, job, where)  # read (and refused where it must be) either way
    te = _truth(model.get("transformer_engine", False)) or te_spec
    for name in ("mcore_gpt", "transformer_engine"):
        if name not in model:
            job.notes.append(f"model.{name} not given: NeMo's default, false "
                             "(megatron_gpt_model.py)")
    if not mcore and not te:
        raise refuse_plan(where, "model.mcore_gpt", False, "NeMo 1's legacy model without "
                          "Transformer Engine is not modelled")
    if "mcore_gpt" in model:
        settings["use_mcore_models"] = ("model.mcore_gpt", mcore)
    if te:
        job.took("model.transformer_engine", model.get("transformer_engine", False),
                 "Transformer Engine's layers, as modelled")
        return False
    for name in ("fp8", "ub_tp_comm_overlap"):
        if _truth(model.get(name)):
            raise refuse_plan(where, f"model.{name}", True,
                              "Transformer Engine's, and with transformer_engine false NeMo "
                              "builds Megatron-Core's local layers, which have none")
    settings["attention_backend"] = ("model.transformer_engine", "unfused")
    return True


PARTIAL = ("num_micro_batches_with_partial_activation_checkpoints",
           "activations_checkpoint_layers_per_pipeline")


def _partial_checkpoints(model: dict[str, Any], job: JobConfig, where: str) -> None:
    """Partial activation checkpoints: NeMo passes num_micro_batches_with_partial_activation_
    checkpoints k to Megatron-Core's pipeline schedules (megatron_base_model.py,
    build_model_parallel_config), which checkpoint the first k of each round of in-flight
    micro-batches partly (the block method's layer count) and the others whole;
    activations_checkpoint_layers_per_pipeline n checkpoints n fewer
    layers at each later pipeline stage (the block method's, transformer.py). Neither is
    modelled where it acts; 0 and null, the launcher's stock values, leave every micro-batch and
    stage checkpointed as the granularity says, and without a granularity nothing is
    checkpointed whatever they say (the launcher's llama yamls give 0 beside granularity null)."""
    granularity = model.get("activations_checkpoint_granularity")
    for name in PARTIAL:
        if name not in model:
            continue
        value = model[name]
        if granularity in (None, "null", "None"):
            job.skipped(f"model.{name}", value, "no effect without a checkpoint granularity")
        elif value in (None, 0, "0", "null", "None"):
            job.skipped(f"model.{name}", value, "none partial: every micro-batch and stage "
                                                "checkpointed as the granularity says")
        else:
            raise refuse_plan(where, f"model.{name}", value,
                              "partial activation checkpoints are not modelled (0 or null: "
                              "none)")


def _mcore_param_gather(optim: dict[str, Any], job: JobConfig, where: str) -> None:
    """Megatron-Core's distributed optimizer gathers the weights behind the forward
    (DistributedDataParallelConfig.overlap_param_gather) from optim.overlap_param_sync, the Apex
    optimizer's name of the switch, as NeMo reads it from v2.1.0 (megatron_gpt_model.py
    setup_mcore_distributed_parallel: `overlap_param_gather=self.cfg.optim.get(
    'overlap_param_sync', False)`, NVIDIA/NeMo bd618ccb29, 2024-10-02, "fix the naming to match
    apex.dist"); v2.0.0 alone read optim.overlap_param_gather there, which v2.1.0 on ignores: set
    beside it, listed as ignored, with a note where the two differ (the run under v2.0.0 is the
    other way). From v2.1.0 NeMo raises 'Must use overlap_param_sync together with
    overlap_grad_sync' (MegatronGPTModel.__init__): refused the same."""
    sync = _truth(optim.get("overlap_param_sync", False))
    if sync and not _truth(optim.get("overlap_grad_sync", False)):
        raise refuse_plan(where, "model.optim.overlap_param_sync", True,
                          "NeMo (from v2.1.0) raises 'Must use overlap_param_sync together with "
                          "overlap_grad_sync': give overlap_grad_sync true")
    if "overlap_param_gather" not in optim:
        return
    given = _truth(optim["overlap_param_gather"])
    job.skipped("model.optim.overlap_param_gather", optim["overlap_param_gather"],
                "NeMo v2.0.0's name of the switch, ignored from v2.1.0 (overlap_param_sync "
                "read)" + (": the same value" if given == sync else ""))
    if given != sync:
        job.notes.append(
            f"model.optim.overlap_param_gather {optim['overlap_param_gather']} beside "
            f"overlap_param_sync {optim.get('overlap_param_sync', False)}: costed as NeMo from "
            f"v2.1.0 runs Megatron-Core's distributed optimizer (overlap_param_gather "
            f"{str(sync).lower()}, from overlap_param_sync); NeMo v2.0.0 read "
            "overlap_param_gather instead, so under it the weight gather is "
            + ("overlapped" if given else "not overlapped"))


APEX_BUCKET_MIB = 100.0  # DistributedFusedAdam's default bucket_cap_mb


def apex_bucket_params(mib: float, grad_sync_bytes: int) -> int:
    """Parameters in one of Apex's buckets: bucket_cap_mb MiB of the gradient-sync dtype
    (apex/contrib/optimizers/distributed_fused_adam.py: 1024 * 1024 * bucket_cap_mb /
    dtype_size)."""
    return max(1, int(mib * 2**20 // grad_sync_bytes))


def _apex_buckets(optim: dict[str, Any], name: str, bf16_sync: bool, job: JobConfig,
                  where: str) -> None:
    """Apex's distributed_fused_adam overlapping its gradient sync buckets every parameter,
    bucket_cap_mb MiB (default 100) of its grad_sync_dtype a bucket (apex/contrib/optimizers/
    distributed_fused_adam.py: bucket_size = 1024 * 1024 * bucket_cap_mb / dtype_size): the
    plan's dp_bucket_size in parameters, dp_bucketing all. Megatron-Core's optimizer
    (mcore_distributed_optim) keeps Megatron-Core's default buckets; without overlap_grad_sync
    there is nothing to bucket."""
    stated = optim.get("bucket_cap_mb")
    if name != "distributed_fused_adam" or not _truth(optim.get("overlap_grad_sync", False)):
        if stated is not None:
            job.skipped("model.optim.bucket_cap_mb", stated,
                        "Apex's distributed_fused_adam's buckets of an overlapped gradient sync: "
                        "no effect here")
        return
    mib = APEX_BUCKET_MIB if stated is None else number(
        stated, f"{where}: model.optim.bucket_cap_mb", strict=True, maximum=2.0**40)
    params = apex_bucket_params(mib, 2 if bf16_sync else 4)
    job.plan.setdefault(AFTER, {}).update(dp_bucket_size=params, dp_bucketing="all")
    what = (f"dp_bucket_size {params:,}, dp_bucketing all (Apex's buckets over every parameter, "
            f"{mib:g} MiB of {'bf16' if bf16_sync else 'fp32'} gradients)")
    if stated is None:
        job.notes.append(f"model.optim.bucket_cap_mb not given: Apex's default, {what}")
    else:
        job.took("model.optim.bucket_cap_mb", stated, what)


def _optimizer(optim: dict[str, Any], settings: Settings, job: JobConfig, where: str,
               bf16_weights: bool) -> None:
    """The optimizer; bf16_weights: the model's weights bf16 (megatron_amp_O2 under bf16
    precision) and not FP8 (fp8_params). Apex's distributed_fused_adam takes NeMo's dtype,
    overlap_grad_sync and overlap_param_sync (megatron_base_model.py setup_optimization);
    Megatron-Core's (mcore_distributed_optim) its DistributedDataParallelConfig from
    overlap_grad_sync, grad_sync_dtype and overlap_param_sync (megatron_gpt_model.py
    setup_mcore_distributed_parallel from v2.1.0; _mcore_param_gather) and an OptimizerConfig
    without a dtype (modelPT.py setup_megatron_optimization): fp32 states and master
    weights."""
    name = str(optim.get("name", "fused_adam"))
    if name not in ("distributed_fused_adam", "mcore_distributed_optim", "fused_adam", "adam",
                    "adamw"):
        raise refuse_plan(where, "model.optim.name", name, "perfmodel models Adam: "
                          "distributed_fused_adam, mcore_distributed_optim, fused_adam, adam")
    mcore = name == "mcore_distributed_optim"
    read = {"name", "overlap_grad_sync", "grad_sync_dtype", "dtype", "overlap_param_sync",
            "overlap_param_gather", "bucket_cap_mb"}
    if name not in ("distributed_fused_adam", "mcore_distributed_optim"):
        job.took("model.optim.name", name, "zero 0 (Adam's states whole on every data-parallel "
                                           "rank)")
        for key in sorted(read - {"name"}):
            if key in optim:
                job.skipped(f"model.optim.{key}", optim[key],
                            "a distributed optimizer's (distributed_fused_adam, "
                            "mcore_distributed_optim): no effect here")
    else:
        settings["use_distributed_optimizer"] = (f"model.optim.name {name}", True)
        for key, dest in (("overlap_grad_sync", "overlap_grad_reduce"),
                          ("overlap_param_sync", "overlap_param_gather")):
            if key in optim:
                settings[dest] = (f"model.optim.{key}", _truth(optim[key]))
        if mcore:
            _mcore_param_gather(optim, job, where)
        elif "overlap_param_gather" in optim:
            job.skipped("model.optim.overlap_param_gather", optim["overlap_param_gather"],
                        "not Apex's distributed_fused_adam's switch (its overlap_param_sync is)")
        bf16_sync = str(optim.get("grad_sync_dtype", "fp32")).lower() in ("bf16", "bfloat16")
        if bf16_sync:
            settings["grad_reduce_in_bf16"] = ("model.optim.grad_sync_dtype", True)
        _apex_buckets(optim, name, bf16_sync, job, where)
        bf16_states = str(optim.get("dtype", "fp32")).lower() in ("bf16", "bfloat16")
        if bf16_states and mcore:
            job.skipped("model.optim.dtype", optim["dtype"], "no effect on Megatron-Core's "
                                                             "distributed optimizer")
            job.notes.append(f"model.optim.dtype {optim['dtype']} with mcore_distributed_optim: "
                             "NeMo passes no dtype to Megatron-Core's OptimizerConfig "
                             "(modelPT.py setup_megatron_optimization; only Apex's "
                             "distributed_fused_adam takes it): fp32 states and master weights")
        elif bf16_states:
            # Apex's DistributedFusedAdam with dtype bf16: the moments in bf16 (NeMo then keeps
            # no fp32 master weights: megatron_base_model.py), as the development set's
            # nemotron4-340b row reads it (benchmarks/bench_accuracy.py STACK_OPTIONS); fixed
            # after the Megatron settings (AFTER)
            job.plan.setdefault(AFTER, {})["optimizer_dtype"] = "bf16"
            job.took("model.optim.dtype", optim["dtype"], "optimizer_dtype bf16")
        elif name == "distributed_fused_adam" and bf16_weights:
            # Apex's DistributedFusedAdam with fp32 states beside bf16 weights keeps the master
            # weights as their 16-bit remainders (NeMo's setup_optimization: store_params False,
            # store_param_remainders True; with fp8_params it stores them whole)
            job.plan.setdefault(AFTER, {})["master_weights"] = "remainders"
            job.took("model.optim.name", name, "master_weights remainders (Apex's "
                     "store_param_remainders beside megatron_amp_O2's bf16 weights)")
    for key in ("distribute_within_nodes", "disable_distributed_parameters"):
        if key in optim and name == "distributed_fused_adam" \
                and yes_or_no(optim[key], f"model.optim.{key}", where):
            # NeMo's MegatronDistributedFusedAdam (nemo/core/optim/distributed_adam.py): the
            # states sharded over a node's data-parallel ranks only, or the parameters not
            # sharded at all: more of them a GPU than perfmodel's ZeRO over every dp rank
            raise refuse_plan(where, f"model.optim.{key}", True,
                              "the distributed optimizer sharded within a node, or its "
                              "parameters unsharded, is not modelled (perfmodel shards over "
                              "every data-parallel rank)")
    for key, value in optim.items():
        if key not in read:
            job.skipped(f"model.optim.{key}", value, "an optimizer hyperparameter or buffer "
                                                     "layout (Adam's states whatever its rates)")
