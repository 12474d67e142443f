"""NeMo AutoModel: a recipe YAML (its benchmark and llm recipes) read as a model and a plan.

Field names, defaults and rules are NeMo AutoModel's (NVIDIA-NeMo/Automodel at 36044ad, 2026-08:
examples/llm_benchmark/*/*.yaml; nemo_automodel/components/distributed, moe/parallelizer.py;
the older benchmark configs' `distributed._target_ ...FSDP2Manager`, `autopipeline` and
`parallelizer` sections too):
  - distributed.strategy fsdp2 (the default; older: an FSDP2Manager target) is FSDP2 over every
    data-parallel rank (ZeRO stage 3), its reduce-scatters overlapped with the backward and the
    next unit's all-gather prefetched; ddp is DDP (ZeRO 0); dp_replicate_size > 1 (HSDP) and
    megatron_fsdp are refused;
  - tp_size, cp_size, pp_size, ep_size are the degrees (ep over the data-parallel ranks, the
    experts FSDP-sharded over the rest); data parallelism takes the other ranks; with pp_size > 1
    the pipeline's pp_schedule (1f1b, gpipe, interleaved1f1b), pp_microbatch_size (the
    micro-batch) and AutoModel's split of the layers (layers_per_stage, rounded to a multiple of
    pp when asked; the first stages one layer more), as a pipeline layout;
  - step_scheduler.global_batch_size and local_batch_size (samples per data-parallel rank per
    gradient-accumulation step: the micro-batch);
  - activation_checkpointing true wraps every block in a checkpoint (recompute full);
    "selective" is torchtitan's per-op policy (recompute op);
  - the model is built in its config's torch_dtype (bf16 for the models AutoModel benchmarks)
    unless model.torch_dtype says otherwise, and FSDP2 computes in bf16: with bf16 parameters
    torch.optim.Adam keeps its states in bf16 and no fp32 master exists (optimizer_dtype bf16,
    the sharded gradients bf16: grad_dtype bf16); with float32 parameters they are the master;
  - every value as AutoModel's loader reads it (components/config/loader.py translate_value):
    `none`/`None` is None (dp_size none: inferred), `true`/`false` booleans, a quoted number a
    number; model.torch_dtype auto is the model config's;
  - the implementation AutoModel builds (_transformers/model_init.py, registry.py): its own
    class for the model's architecture where it has one, else (or with model.force_hf)
    Hugging Face's. Hugging Face's attends by model.attn_implementation (eager: unfused; sdpa,
    flash_attention_2/3 or absent: fused; cp_size > 1: sdpa) with Liger's kernels patched in
    (use_liger_kernel, default true, off with tp or cp > 1: kernels fused); AutoModel's llama,
    qwen2 and qwen3 classes attend through the same interface with torch's nn.Linear (their
    RMSNorm model.backend's, qwen3's Hugging Face's); its MoE classes (qwen3_moe, deepseek_v3,
    gpt_oss, glm4_moe) build all from model.backend;
  - model.backend (BackendConfig's defaults with Transformer Engine installed, as in AutoModel's
    container: attn te, linear te, rms_norm torch_fp32): attention te, sdpa, flex or cudnn (fused
    kernels: flash_attention; eager: unfused); TE's or QuACK's norms and linears (kernels fused),
    torch's (kernels eager) unless compiled; with ep_size > 1 the DeepEP/HybridEP dispatchers as
    ep_dispatcher deepep (as the Megatron reader takes --moe-token-dispatcher-type flex;
    AutoModel's torch all-gather dispatcher, UCCL-EP and Mixture-of-Kittens refused, and an
    unnamed one, which AutoModel picks by what is installed); the experts' grouped GEMMs (te,
    gmm, torch_mm; torchao's MXFP8 refused); Transformer Engine's FP8 (te_fp8) refused;
    fake_balanced_gate (without noise) routes token t to experts t k .. t k + k - 1 (routing
    round_robin, routing_imbalance 1);
  - loss_fn MaskedCrossEntropy or TEParallelCrossEntropy, any other refused, as is a recipe
    without one (AutoModel has no default loss);
  - the sequence length from each dataset class's own argument (seq_len, seq_length) where it
    fixes one; else --seq-len;
  - every other key named as read, skipped or not read.
The model: `pretrained_model_name_or_path` names a Hugging Face model; the ones perfmodel has a
preset of (HF_PRESETS: the preset's source is that model's config.json) are taken, any other
needs --model (a local copy of its config.json).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

from perfmodel.configs.job import (
    Framework,
    JobConfig,
    refuse_plan,
    refuse_spec,
    section,
    whole,
    yes_or_no,
)
from perfmodel.errors import PlanError, SpecError

# the Hugging Face models perfmodel has a preset of (each preset's source names the config.json
# it was read from); an -Instruct model has its base model's architecture
HF_PRESETS: dict[str, str] = {
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen/Qwen3-32B": "qwen3-32b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "meta-llama/Llama-3.1-8B": "llama3.1-8b", "meta-llama/Llama-3.1-70B": "llama3.1-70b",
    "meta-llama/Llama-3.1-405B": "llama3.1-405b", "meta-llama/Meta-Llama-3-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b", "meta-llama/Llama-2-7b-hf": "llama2-7b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b", "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b", "mistralai/Mixtral-8x22B-v0.1": "mixtral-8x22b",
}
# sections that describe the run around the step (data, checkpoints, logging, its launcher)
_AROUND = {"recipe", "seed", "benchmark", "checkpoint", "dataloader", "validation_dataset",
           "validation_dataloader", "wandb", "mlflow", "ci", "dist_env", "lr_scheduler",
           "clip_grad_norm", "rng", "tokenizer", "logging"}
_KNOWN = _AROUND | {"step_scheduler", "distributed", "autopipeline", "parallelizer", "model",
                    "loss_fn", "dataset", "optimizer", "compile", "peft", "packed_sequence",
                    "fp8", "quantization"}
_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved"}


@functools.cache
def _preset(name: str) -> Any:
    """The preset's TransformerSpec (read once: the MTP check and the pipeline split both ask)."""
    from perfmodel.specs.model import load_model

    return load_model(name)


def is_automodel(data: dict[str, Any]) -> bool:
    """An AutoModel recipe: its step scheduler beside its distributed (or older FSDP2Manager)
    section."""
    return "step_scheduler" in data and ("distributed" in data or "dist_env" in data)


def read_automodel(data: dict[str, Any], path: Path) -> JobConfig:
    """A NeMo AutoModel recipe YAML, read (its values as AutoModel's loader reads them:
    _translated)."""
    where = str(path)
    data = _translated(data)
    job = JobConfig(path=where, framework=Framework.AUTOMODEL)
    for key in data:
        if key in _AROUND:
            job.skipped(key, "...", "the run around the step (data, checkpoints, logging)")
        elif key not in _KNOWN:
            job.strange(key, "...")
    if data.get("peft"):
        raise refuse_plan(where, "peft", "...", "LoRA/PEFT fine-tuning is not modelled (every "
                                                "parameter trains here)")
    for key in ("fp8", "quantization"):
        if data.get(key):
            raise refuse_plan(where, key, "...", "FP8 through torchao is not read (give "
                                                 "--dtype fp8 with the plan's flags)")
    _packed(data, job, where)
    _model(data, job, where)
    _dataset(data, job, where)
    _loss(data, job, where)
    _batch(data, job, where)
    _parallelism(data, job, where)
    _optimizer(data, job, where)
    return job


# AutoModel's reading of a YAML string (components/config/loader.py at 36044ad3d,
# translate_value): these exact spellings, else a Python literal where one parses
_SPECIAL = {"none": None, "None": None, "true": True, "True": True, "false": False,
            "False": False}


def _translated(value: Any, key: str = "") -> Any:
    """The recipe as AutoModel's ConfigNode reads it (loader.py at 36044ad3d, ConfigNode._wrap
    and translate_value): every string but a `_target_`'s or an `*_fn`'s (import paths) is
    translated, "none"/"None" to None (so `dp_size: none` is AutoModel's inferred dp),
    "true"/"True" and "false"/"False" to booleans, else ast.literal_eval's literal where it
    parses (a quoted "8" is 8, "1e-8" a float), else kept; a string over 1000 characters is
    kept, and one naming an environment variable ($VAR, ${VAR,default}, which AutoModel
    resolves first) is kept as written."""
    if isinstance(value, dict):
        return {k: _translated(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_translated(v) for v in value]
    if not isinstance(value, str) or key == "_target_" or key.endswith("_fn") \
            or "$" in value or len(value) > 1000:
        return value
    if value in _SPECIAL:
        return _SPECIAL[value]
    try:
        return ast.literal_eval(value)
    except Exception:  # noqa: BLE001 (translate_value's own fallback: the string)
        return value


def _packed(data: dict[str, Any], job: JobConfig, where: str) -> None:
    """packed_sequence: a packed_sequence_size > 0 packs the samples into rows of that many
    tokens (recipes/llm/train_ft.py at 36044ad3d), refused (attention within documents is not
    modelled); 0, its default, packs nothing, and its other settings then do nothing."""
    packed = section(data, "packed_sequence", where)
    size = packed.get("packed_sequence_size")
    if whole(size or 0, "packed_sequence.packed_sequence_size", where, minimum=0):
        raise refuse_plan(where, "packed_sequence.packed_sequence_size", size,
                          "packed sequences attend within documents, not modelled")
    for key, value in packed.items():
        if key == "packed_sequence_size":
            job.took("packed_sequence.packed_sequence_size", value,
                     "no packing: each sample its own row")
        else:
            job.skipped(f"packed_sequence.{key}", value, "no effect without packing "
                                                         "(packed_sequence_size 0)")


def _flag(data: dict[str, Any], key: str, where: str) -> bool:
    """distributed.<key>, a switch (false where not given)."""
    return yes_or_no(section(data, "distributed", where).get(key, False), f"distributed.{key}",
                     where)


def _layer_compile(data: dict[str, Any], where: str) -> tuple[bool, str]:
    """Whether AutoModel torch.compiles each decoder layer, and why (not): FSDP2Manager.
    maybe_compile (nemo_automodel/components/distributed/fsdp2.py at 36044ad3d; since 2013a4dd6,
    2026-04-10) compiles them in place with distributed.enable_compile, or with
    enable_async_tensor_parallel at tp_size > 1 (Inductor's micro-pipelined TP needs it);
    _transformers/infrastructure.py calls it for FSDP2 without a pipeline only (a pipeline's
    stages are built by AutoPipeline, which compiles nothing). The embedding, the output layer and
    the loss stay eager, as perfmodel's compiled stack counts them."""
    dist = section(data, "distributed", where)
    asked = _flag(data, "enable_compile", where) or (
        _flag(data, "enable_async_tensor_parallel", where) and _degree(data, "tp", where) > 1)
    if not asked:
        return False, ""
    target = str(dist.get("_target_", ""))
    strategy = str(dist.get("strategy", "ddp" if target.endswith("DDPManager") else "fsdp2"))
    if strategy != "fsdp2":
        return False, f"no effect with strategy {strategy} (FSDP2Manager's per-layer compile)"
    if _degree(data, "pp", where) > 1:
        return False, ("no effect with pp_size > 1: AutoModel compiles the layers on its "
                       "path without a pipeline only (infrastructure.py)")
    return True, "each decoder layer torch.compiled (FSDP2Manager.maybe_compile): stack compiled"


def _torch_dtype(data: dict[str, Any], where: str) -> Any:
    """model.torch_dtype as AutoModel takes it: "auto" (from_pretrained's and from_config's
    default, nemo_automodel/_transformers/auto_model.py at 36044ad3d) is the model config's
    torch_dtype, as a section without it; None for either."""
    dtype = section(data, "model", where).get("torch_dtype")
    return None if dtype is None or str(dtype) == "auto" else dtype


def _fp32_parameters(data: dict[str, Any], where: str) -> bool:
    """Whether the model is built in float32 (model.torch_dtype; else, or "auto", bfloat16, the
    config's torch_dtype of the models AutoModel benchmarks)."""
    dtype = str(_torch_dtype(data, where) or "bfloat16").removeprefix("torch.")
    if dtype not in ("bfloat16", "bf16", "float32", "fp32"):
        raise refuse_plan(where, "model.torch_dtype", dtype, "AutoModel trains bfloat16 or "
                                                             "float32 parameters (or auto: the "
                                                             "model config's)")
    return dtype in ("float32", "fp32")


# How AutoModel builds each Hugging Face model_type perfmodel reads, without force_hf
# (nemo_automodel/_transformers/model_init.py at 36044ad3d, get_is_hf_model and
# _resolve_custom_model_cls_for_config: its own class where registry.py MODEL_ARCH_MAPPING has
# the config's architectures[0], the type's <Family>ForCausalLM; Hugging Face's otherwise):
# "backend", its own class builds the attention, linears and norms from model.backend
# (components/models/{qwen3_moe,deepseek_v3,gpt_oss,glm4_moe}: initialize_attn_module_and_func,
# initialize_linear_module, initialize_rms_norm_module); "hf-attention", its own class keeps
# Hugging Face's attention interface (config._attn_implementation: model.attn_implementation)
# for unpacked batches, backend.attn only for packed ones, and torch's nn.Linear
# (components/models/{llama,qwen2,qwen3}/model.py). Any other type (mistral, mixtral, gemma,
# qwen2_moe, deepseek_v2, olmoe, gpt2, ...) is Hugging Face's.
_OWN = {"qwen3_moe": "backend", "deepseek_v3": "backend", "gpt_oss": "backend",
        "glm4_moe": "backend", "llama": "hf-attention", "qwen2": "hf-attention",
        "qwen3": "hf-attention"}
# the "hf-attention" classes whose RMSNorm is model.backend.rms_norm's (initialize_rms_norm_
# module); qwen3's is Hugging Face's Qwen3RMSNorm
_OWN_NORMS = {"llama", "qwen2"}
# the model_type of each preset of HF_PRESETS (its source config.json's)
_PRESET_TYPES = {"deepseek-v3": "deepseek_v3", "qwen3-30b-a3b": "qwen3_moe",
                 "qwen3-235b-a22b": "qwen3_moe", "qwen3-32b": "qwen3", "gpt-oss-120b": "gpt_oss",
                 "llama3.1-8b": "llama", "llama3.1-70b": "llama", "llama3.1-405b": "llama",
                 "llama3-8b": "llama", "llama3-70b": "llama", "llama2-7b": "llama",
                 "llama2-70b": "llama", "mistral-7b": "mistral", "mixtral-8x7b": "mixtral",
                 "mixtral-8x22b": "mixtral"}
# Hugging Face's attn_implementation values perfmodel reads (eager: unfused; the others fused
# kernels); absent, AutoModel's DEFAULT_ATTN_IMPLEMENTATION (_transformers/kernel_patches.py at
# 36044ad3d: flash_attention_2 with flash-attn installed, else sdpa), fused either way
_HF_ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
# the model types Liger patches in place (liger_kernel/transformers/monkey_patch.py
# MODEL_TYPE_TO_APPLY_LIGER_FN at linkedin/Liger-Kernel 1f1a4b8d6, AutoModel's pin), of those
# perfmodel reads: its RMSNorm, RoPE and SwiGLU Triton kernels
_LIGER_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma"}
_CAUSAL_LM = ("NeMoAutoModelForCausalLM.from_pretrained", "NeMoAutoModelForCausalLM.from_config")
_OWN_PREFIX = "nemo_automodel.components.models."
# model's keys read below, or said why not
_MODEL_READ = {"_target_", "pretrained_model_name_or_path", "config", "torch_dtype", "backend",
               "attn_implementation", "force_hf", "use_liger_kernel", "use_sdpa_patching",
               "sdpa_method"}
_MODEL_SKIPPED = {
    "trust_remote_code": "loading the model's own code",
    "output_hidden_states": "every layer's output returned beside the logits: tensors the "
                            "backward keeps anyway",
    "load_base_model": "whether the checkpoint's weights are loaded",
}
_CONFIG_SKIPPED = {
    "_target_": "the config's loader",
    "pretrained_model_name_or_path": "",
    "name_or_path": "the config's name",
    "trust_remote_code": "loading the model's own code",
}


def _model(data: dict[str, Any], job: JobConfig, where: str) -> None:
    model = section(data, "model", where)
    config = section(model, "config", where)
    hf = config.get("pretrained_model_name_or_path") or model.get("pretrained_model_name_or_path")
    preset = None if hf is None else (HF_PRESETS.get(str(hf))
                                      or HF_PRESETS.get(str(hf).removesuffix("-Instruct")))
    if hf is None:
        job.needs_model = "model: no pretrained_model_name_or_path"
    elif preset is not None:
        job.preset = preset
        job.took("model.pretrained_model_name_or_path", hf, f"preset {preset}")
        if _preset(preset).mtp_layers:  # its DeepSeek-V3 has no MTP module
            job.model["mtp_layers"] = 0
            job.took("model", "...", "no multi-token-prediction module (AutoModel builds none: "
                                     "components/models/deepseek_v3)")
    else:
        job.needs_model = (f"model {hf}: a Hugging Face model perfmodel has no preset of (give "
                           "--model: a local copy of its config.json)")
        job.took("model.pretrained_model_name_or_path", hf, "give --model")
    for key, value in model.items():
        if key in _MODEL_SKIPPED:
            job.skipped(f"model.{key}", value, _MODEL_SKIPPED[key])
        elif key not in _MODEL_READ:
            job.strange(f"model.{key}", value)
    for key, value in config.items():
        if key not in _CONFIG_SKIPPED:  # an override of the Hugging Face config's field
            job.strange(f"model.config.{key}", value, "overrides the Hugging Face config: the "
                                                      "model is the preset's or --model's as "
                                                      "they are")
        elif _CONFIG_SKIPPED[key]:
            job.skipped(f"model.config.{key}", value, _CONFIG_SKIPPED[key])
    dtype = _torch_dtype(data, where)
    master = _fp32_parameters(data, where)
    job.fix("dtype", "bf16")
    if not master:  # Adam over bf16 parameters: bf16 states, no fp32 copy; bf16 shards
        job.fix("optimizer_dtype", "bf16")
        job.fix("grad_dtype", "bf16")
    job.took("model.torch_dtype", str(dtype or model.get("torch_dtype", "bfloat16")).removeprefix(
        "torch."), "fp32 master parameters (FSDP2 computes in bf16)"
             if master else "bf16 parameters: torch's Adam keeps its states in bf16 and no "
                            "fp32 master (Transformer Engine's FusedAdam: its own, below)"
             + ("" if dtype is not None else " (the model config's torch_dtype"
                + (": auto, from_pretrained's default)" if "torch_dtype" in model else ")")))
    backend = section(model, "backend", where)
    compiled = _compile(data, job, where) or _layer_compile(data, where)[0]
    job.fix("stack", "compiled" if compiled else "eager")
    if compiled:
        job.fix("kernels", "compiled")
    own = _own_type(model, where)
    job.took("model._target_", model["_target_"], f"AutoModel's own {own} class" if own else
             "AutoModel's own class where its registry has the model's architecture, else "
             "Hugging Face's (below)")
    mtype = own or (_PRESET_TYPES.get(preset) if preset else None)
    if mtype is None:  # the model comes with --model: its type decides once it is known
        job.with_model.append(lambda spec: _implementation(data, job, where,
                                                           _type_of(spec, where), True))
    else:
        _implementation(data, job, where, mtype, False)
    _backend_rest(backend, data, job, where)
    if backend.get("fake_balanced_gate"):
        noise = backend.get("fake_gate_noise", 0.0)
        if noise not in (0, 0.0, None):  # random experts, a random popularity bias
            raise refuse_plan(where, "model.backend.fake_gate_noise", noise,
                              "the noisy fake gate's imbalance is not modelled (give 0: "
                              "round-robin experts, or the learned gate)")
        job.model["routing_imbalance"] = 1.0
        job.model["routing"] = "round_robin"
        job.took("model.backend.fake_balanced_gate", True,
                 "token t's experts t k .. t k + k - 1: every expert the same tokens "
                 "(routing_imbalance 1), routing round_robin")


def _compile(data: dict[str, Any], job: JobConfig, where: str) -> bool:
    """compile: CompileConfig (components/utils/compile_utils.py at 36044ad3d) torch.compiles
    the model with enabled true; Inductor's default mode read as the compiled stack, the CUDA
    graphs of reduce-overhead and max-autotune refused; its other settings named."""
    settings = section(data, "compile", where)
    enabled = yes_or_no(settings.get("enabled", False), "compile.enabled", where)
    mode = settings.get("mode") or "default"
    if enabled and mode not in ("default", "max-autotune-no-cudagraphs"):
        raise refuse_plan(where, "compile.mode", mode, "torch.compile's CUDA graphs "
                                                       "(reduce-overhead, max-autotune) are not "
                                                       "read: give default")
    for key, value in settings.items():
        if key == "enabled":
            job.took("compile.enabled", value, "the model torch.compiled: stack compiled"
                     if value else "off")
        else:
            job.skipped(f"compile.{key}", value, "how Inductor compiles (its kernels costed as "
                                                 "Inductor's)" if enabled else "compile off")
    return enabled


def _own_type(model: dict[str, Any], where: str) -> str | None:
    """The model_type of AutoModel's own class where model._target_ names one
    (nemo_automodel.components.models.<type>...: "backend" or "hf-attention" above), None for
    NeMoAutoModelForCausalLM (its registry decides by the model); any other target refused (a
    build function, another task's auto class, transformers' own)."""
    target = str(model.get("_target_", "(not given)"))
    if target.startswith(_OWN_PREFIX) and target.split(".")[3] in _OWN:
        return target.split(".")[3]
    if not target.endswith(_CAUSAL_LM):
        raise refuse_plan(where, "model._target_", target,
                          "perfmodel reads NeMoAutoModelForCausalLM's from_pretrained and "
                          f"from_config and AutoModel's own classes ({_OWN_PREFIX}<type>: "
                          f"{', '.join(_OWN)})")
    return None


def _type_of(spec: Any, where: str) -> str:
    """The Hugging Face model_type of a model given by --model: a Hugging Face config.json's
    (TransformerSpec.source), or a preset's; a spec file does not say which implementation
    AutoModel would build."""
    source = str(getattr(spec, "source", ""))
    if source.startswith("Hugging Face config (") and source.endswith(")"):
        return source.removeprefix("Hugging Face config (").removesuffix(")")
    if spec.name in _PRESET_TYPES:
        return _PRESET_TYPES[spec.name]
    raise refuse_plan(where, "model", spec.name,
                      "AutoModel builds its own implementation or Hugging Face's by the model's "
                      "config.json (architectures: _transformers/registry.py): give --model as "
                      "a Hugging Face config.json or a preset of one")


def _settle(job: JobConfig, key: str, value: Any, later: bool) -> None:
    """Fix a plan field the model decides: once the model is known (later), resolve_plan has
    put the command line's value in already; one that differs is refused, as resolve_plan
    refuses a contradiction of the config."""
    given = job.plan.get(key)
    if later and key in job.plan and given != value and str(given) != str(value):
        flag = (f"--attention {'flash' if given else 'unfused'}" if key == "flash_attention"
                else f"--{key.replace('_', '-')} {given}")
        raise PlanError(f"{flag} contradicts the config's {key} {value} ({job.path}); drop one")
    job.fix(key, value)


def _implementation(data: dict[str, Any], job: JobConfig, where: str, mtype: str,
                    later: bool) -> None:
    """The attention, the element-wise kernels and the context-parallel exchange of the
    implementation AutoModel builds for a model_type: its own class ("backend" or
    "hf-attention", _OWN) or, with model.force_hf true or a type its registry lacks, Hugging
    Face's (auto_model.py at 36044ad3d, _build_model): attention by model.attn_implementation
    (with cp_size > 1 sdpa, _apply_preload_overrides), Liger's kernels patched in with
    use_liger_kernel (default true) and tp_size = cp_size = 1."""
    model = section(data, "model", where)
    backend = section(model, "backend", where)
    force = yes_or_no(model.get("force_hf", False), "model.force_hf", where)
    own = str(model.get("_target_", "")).startswith(_OWN_PREFIX)
    kind = _OWN.get(mtype, "hf") if own or not force else "hf"
    if "force_hf" in model:
        job.took("model.force_hf", force, "no effect: the target is AutoModel's own class"
                 if own else "Hugging Face's implementation (model_init.py: force_hf)" if force
                 else f"AutoModel's own {mtype} class" if kind != "hf"
                 else f"Hugging Face's implementation (AutoModel has no {mtype} class)")
    tp, cp = _degree(data, "tp", where), _degree(data, "cp", where)
    if kind == "backend":
        attn = _backend_attention(backend, model, mtype, job, where)
        flash = attn != "eager"
    else:
        attn = "hf"
        flash = _hf_attention(model, backend, mtype, kind, cp, job, where)
    _settle(job, "flash_attention", flash, later)
    if cp > 1:  # TE's attention rotates K/V around the ring; torch's SDPA gathers
        _settle(job, "cp_comm", "p2p" if attn == "te" else "allgather", later)
    fused, why = _element_wise(model, backend, mtype, kind, tp, cp, job, where)
    if job.plan.get("stack") != "compiled":
        _settle(job, "kernels", "fused" if fused else "eager", later)
    kernels = job.plan["kernels"]
    if kind == "hf":
        if backend:
            job.skipped("model.backend", "...", "not applied to Hugging Face's implementation "
                                                "(model_init.py _init_model: AutoModel's own "
                                                "classes only)")
        job.took("model", mtype, f"Hugging Face's implementation: {why}: kernels {kernels}")
    else:
        job.took("model.backend", " ".join(f"{k}={backend[k]}" for k in
                                           ("attn", "linear", "rms_norm") if k in backend)
                 or "attn, linear, rms_norm not given", f"AutoModel's own {mtype} class: "
                 f"{why}: stack "
                 f"{job.plan['stack']}, kernels {kernels}")
    if kind != "hf" and "use_liger_kernel" in model:
        job.skipped("model.use_liger_kernel", model["use_liger_kernel"],
                    "no effect: AutoModel patches Liger into Hugging Face's classes only "
                    "(auto_model.py: not is_custom_model)")
    for key in ("use_sdpa_patching", "sdpa_method"):
        if key in model:  # _patch_attention: torch's sdpa_kernel over the model's forward
            job.skipped(f"model.{key}", model[key], "which of SDPA's fused kernels torch "
                                                    "takes (cuDNN, flash, efficient): the "
                                                    "attention is costed as the fused one")


def _backend_attention(backend: dict[str, Any], model: dict[str, Any], mtype: str,
                       job: JobConfig, where: str) -> str:
    """model.backend.attn of a "backend" class: BackendConfig's default te (with Transformer
    Engine installed and CUDA available, as in AutoModel's container; components/models/common/
    utils.py at 36044ad3d); te, sdpa, flex, cudnn fused, eager unfused, the rest refused.
    model.attn_implementation does not reach it."""
    attn = str(backend.get("attn", "te"))
    if attn not in ("te", "sdpa", "flex", "cudnn", "eager"):
        raise refuse_plan(where, "model.backend.attn", attn,
                          "perfmodel reads AutoModel's te, sdpa, flex, cudnn (fused) and eager "
                          "(unfused); tilelang's and DeepSeek V4's torch are not modelled")
    job.took("model.backend.attn", attn if "attn" in backend else "te (not given)",
             ("unfused attention (flash_attention false)" if attn == "eager"
              else "fused attention (flash_attention)")
             + ("" if "attn" in backend else ": BackendConfig's default with Transformer "
                                             "Engine installed, as in AutoModel's container"))
    if "attn_implementation" in model:
        job.skipped("model.attn_implementation", model["attn_implementation"],
                    f"no effect: AutoModel's own {mtype} class attends with model.backend.attn")
    return attn


def _hf_attention(model: dict[str, Any], backend: dict[str, Any], mtype: str, kind: str,
                  cp: int, job: JobConfig, where: str) -> bool:
    """Whether Hugging Face's attention interface runs fused: model.attn_implementation (eager
    unfused; sdpa, flash_attention_2 and _3 fused; absent, AutoModel's default, fused), sdpa
    for Hugging Face's implementation with cp_size > 1 (_apply_preload_overrides)."""
    impl = model.get("attn_implementation")
    if impl is not None and impl not in _HF_ATTENTION:
        raise refuse_plan(where, "model.attn_implementation", impl,
                          f"perfmodel reads {', '.join(_HF_ATTENTION)} (Hugging Face's "
                          "attention interface)")
    forced = kind == "hf" and cp > 1
    flash = forced or impl != "eager"
    job.took("model.attn_implementation", "flash_attention_2 or sdpa (not given)"
             if impl is None else impl,
             ("fused attention (flash_attention)" if flash else "unfused attention "
              "(flash_attention false)")
             + (f": cp_size {cp} takes sdpa (_apply_preload_overrides)" if forced and impl
                not in (None, "sdpa") else ": AutoModel's DEFAULT_ATTN_IMPLEMENTATION"
                if impl is None else ""))
    if "attn" in backend:
        job.skipped("model.backend.attn", backend["attn"],
                    f"only packed sequences' attention in AutoModel's own {mtype} class "
                    "(unpacked: Hugging Face's interface, model.attn_implementation)"
                    if kind == "hf-attention" else "not applied to Hugging Face's "
                                                   "implementation")
    return flash


def _element_wise(model: dict[str, Any], backend: dict[str, Any], mtype: str, kind: str,
                  tp: int, cp: int, job: JobConfig, where: str) -> tuple[bool, str]:
    """Whether the norms and linears run fused kernels, and why: a "backend" class's
    model.backend.rms_norm and linear (BackendConfig's defaults torch_fp32 and te with Transformer
    Engine installed; TE's or QuACK's fused); an "hf-attention" class's torch nn.Linear (QuACK's
    swapped in where model.backend names it, model_init.py _apply_backend_module_overrides)
    and llama's and qwen2's model.backend.rms_norm; Hugging Face's, Liger's kernels."""
    norm = str(backend.get("rms_norm", "torch_fp32"))
    linear = str(backend.get("linear", "te"))
    if kind == "backend":
        fused = bool({"te", "quack"} & {norm, linear})
        said = ", ".join(f"{k} {v}" + ("" if k in backend else " (default)")
                         for k, v in (("rms_norm", norm), ("linear", linear)))
        return fused, ("TE's or QuACK's norms or linears" if fused else "torch's norms and "
                       "linears") + f" ({said}" + (
            "; the defaults BackendConfig's with Transformer Engine installed, as in "
            "AutoModel's container)" if "(default)" in said else ")")
    if kind == "hf-attention":
        own_norm = mtype in _OWN_NORMS
        fused = linear == "quack" or own_norm and norm in ("te", "quack")
        for key, applies in (("linear", linear == "quack"), ("rms_norm", own_norm)):
            if key in backend and not applies:
                job.skipped(f"model.backend.{key}", backend[key],
                            f"not applied: AutoModel's own {mtype} class keeps "
                            + ("torch's nn.Linear (QuACK's alone swapped in)" if key == "linear"
                               else "Hugging Face's Qwen3RMSNorm"))
        return fused, ", ".join((f"rms_norm {norm}" + ("" if "rms_norm" in backend else
                                                        " (BackendConfig's default)")
                                 if own_norm else "Hugging Face's RMSNorm",
                                 "QuACK's linears" if linear == "quack"
                                 else "torch's nn.Linear"))
    liger = yes_or_no(model.get("use_liger_kernel", True), "model.use_liger_kernel", where)
    fused = liger and tp == 1 and cp == 1 and mtype in _LIGER_TYPES
    why = ("Liger's RMSNorm, RoPE and gated-MLP kernels (use_liger_kernel, its default true; "
           "AutoModel's container installs liger-kernel on x86_64)" if fused
           else "Liger off (use_liger_kernel false)" if not liger
           else f"Liger off with tp_size {tp}, cp_size {cp} (_apply_preload_overrides)"
           if tp > 1 or cp > 1 else f"no Liger kernels for {mtype}")
    if "use_liger_kernel" in model:
        job.took("model.use_liger_kernel", liger, why)
    if fused:
        job.notes.append("model.use_liger_kernel: AutoModel's container has liger-kernel on "
                         "x86_64 hosts only (its pyproject.toml): on an aarch64 one (GB200) "
                         "Hugging Face's norms, RoPE and gated MLP run op by op; give "
                         "use_liger_kernel false for that run")
    return fused, why


# the losses perfmodel models (components/loss at 36044ad3d), by class, and their keys that do
# not change the cost
_LOSSES = ("MaskedCrossEntropy", "TEParallelCrossEntropy")
_LOSS_SKIPPED = {"ignore_index": "the label that masks a token (the same work)",
                 "reduction": "how the token losses are summed (the same work)",
                 "tp_group": "the group the loss reduces over (a runtime argument)"}


def _loss(data: dict[str, Any], job: JobConfig, where: str) -> None:
    """loss_fn: AutoModel builds the recipe's loss from it and has no default
    (recipes/llm/train_ft.py at 36044ad3d, setup: self.cfg.loss_fn.build(), and
    RecipeConfig.loss_fn is None without the section: the recipe fails), so a recipe without
    one is refused; MaskedCrossEntropy and TEParallelCrossEntropy are read, any other target
    (FusedLinearCrossEntropy, Apple's cut cross entropy over the hidden states, the logits
    never whole; ChunkedCrossEntropy; distillation losses) refused."""
    loss = section(data, "loss_fn", where)
    target = str(loss.get("_target_", "(not given)"))
    name = target.rsplit(".", 1)[-1]
    if name not in _LOSSES:
        raise refuse_plan(where, "loss_fn._target_", target,
                          "perfmodel reads AutoModel's nemo_automodel.components.loss."
                          "masked_ce.MaskedCrossEntropy and te_parallel_ce."
                          "TEParallelCrossEntropy (a recipe without loss_fn does not run: "
                          "train_ft.py builds it, with no default)")
    for key, value in loss.items():
        if key in _LOSS_SKIPPED:
            job.skipped(f"loss_fn.{key}", value, _LOSS_SKIPPED[key])
        elif key not in ("_target_", "fp32_upcast", "chunk_size"):
            job.strange(f"loss_fn.{key}", value)
    if name == "TEParallelCrossEntropy":
        # nemo_automodel/components/loss/te_parallel_ce.py: Transformer Engine's parallel cross
        # entropy kernel (the logits' gradient in place in them)
        job.fix("cross_entropy", "te")
        job.took("loss_fn._target_", target, "cross_entropy te (Transformer Engine's fused "
                                             "cross entropy)")
        if "fp32_upcast" in loss:
            job.skipped("loss_fn.fp32_upcast", loss["fp32_upcast"],
                        "the loss's own buffers (perfmodel counts fp32 logits)")
        return
    if loss.get("chunk_size") is not None:
        # components/loss/masked_ce.py: _ChunkedMaskedCESum, one fp32 chunk at a time and the
        # bf16 logits kept (their gradient in place with inplace_grad)
        raise refuse_plan(where, "loss_fn.chunk_size", loss["chunk_size"],
                          "MaskedCrossEntropy's chunked loss (one fp32 chunk at a time) is not "
                          "modelled: leave chunk_size out")
    tp = _degree(data, "tp", where)
    if tp > 1:
        job.notes.append(f"loss_fn MaskedCrossEntropy with tp_size {tp}: AutoModel gathers the "
                         "whole vocabulary's logits on every rank for its loss (full_tensor); "
                         f"perfmodel counts the loss's buffers over tp ({tp} x too few) and no "
                         "gather of them")
    if "fp32_upcast" in loss:
        # components/loss/masked_ce.py: logits.float() only with fp32_upcast (its default, True)
        job.took("loss_fn._target_", target, "MaskedCrossEntropy (its fp32_upcast below)")
        upcast = yes_or_no(loss["fp32_upcast"], "loss_fn.fp32_upcast", where)
        job.fix("cross_entropy", "torch" if upcast else "no-upcast")
        job.took("loss_fn.fp32_upcast", upcast,
                 "cross_entropy torch (F.cross_entropy on fp32 copies of the logits)" if upcast
                 else "cross_entropy no-upcast (F.cross_entropy on the bf16 logits, no fp32 "
                      "copy)")
    else:  # fp32_upcast's default, True
        job.fix("cross_entropy", "torch")
        job.took("loss_fn._target_", target, "cross_entropy torch (F.cross_entropy on fp32 "
                                             "copies of the logits: fp32_upcast's default)")


# Each dataset class's sequence-length argument (nemo_automodel/components/datasets/llm at
# 36044ad3d): every sample exactly that long for the mock, nanoGPT and Megatron pretraining
# datasets (MegatronPretraining's default 2048, the mock's 1024); the instruction and chat
# datasets pad to it only with padding max_length and cut to it only with truncation
# (formatting_utils._package_tokenized_example), else each sample is its own length
_SEQ_KEYS = {"MockIterableDataset": "seq_len", "NanogptDataset": "seq_len",
             "MegatronPretraining": "seq_length", "ChatDataset": "seq_length",
             "ColumnMappedTextInstructionDataset": "seq_length", "make_squad_dataset":
             "seq_length", "make_xlam_dataset": "seq_length"}
_FIXED_LENGTH = {"MockIterableDataset", "NanogptDataset", "MegatronPretraining"}
# (mock_iterable_dataset.py: MockIterableDataset(seq_len=1024); NanogptDataset has no default)
_SEQ_DEFAULTS = {"MegatronPretraining": 2048, "MockIterableDataset": 1024}


def _dataset(data: dict[str, Any], job: JobConfig, where: str) -> None:
    """The dataset's sequence length where its class fixes one (_SEQ_KEYS), else --seq-len;
    its other keys (its source, split, tokenizer ...) named as not changing the step."""
    dataset = section(data, "dataset", where)
    target = str(dataset.get("_target_", ""))
    name = target.rsplit(".", 1)[-1]
    key = _SEQ_KEYS.get(name, None if target else "seq_len")
    value = dataset.get(key, _SEQ_DEFAULTS.get(name)) if key else None
    padding, cut = dataset.get("padding"), dataset.get("truncation")
    fixed = name in _FIXED_LENGTH or not target or (
        padding == "max_length" and cut not in (None, False, "do_not_truncate"))
    sets = bool(key) and value is not None and fixed
    if target:
        job.took("dataset._target_", target, f"its {key} the sequence length" if sets
                 else f"its {key} a bound only" if key and value is not None
                 else "its samples' lengths the sequence length (give --seq-len)")
    if sets:
        job.model["seq_len"] = whole(value, f"dataset.{key}", where)
        job.took(f"dataset.{key}", value, f"seq_len {value}" + (
            "" if key in dataset else f" ({name}'s default)") + (
            f" (padding max_length, truncation {cut}: every sample that long)"
            if name not in _FIXED_LENGTH and target else ""))
    elif key and value is not None:
        job.needs_seq_len = (f"dataset.{key} {value} is a bound, not the length (padding "
                             f"{padding or 'do_not_pad'}, truncation {cut or 'off'}: each "
                             "sample its own length)")
        job.skipped(f"dataset.{key}", value, "a bound: the samples' own lengths (give "
                                             "--seq-len)")
    else:
        job.needs_seq_len = (f"dataset.{key or 'seq_len'} is not given (the dataset's samples "
                             "set it)")
    local = section(data, "step_scheduler", where).get("local_batch_size", 1)
    # the benchmark recipe sets the mock dataset's batch_size to local_batch_size
    # (recipes/llm/benchmark.py at 36044ad3d); the others take it as given
    bench = str(data.get("recipe", "")) == "BenchmarkingRecipeForNextTokenPrediction"
    for other, given in dataset.items():
        if other in ("_target_", key):
            continue
        if other == "batch_size" and name == "MockIterableDataset" and not bench \
                and given != local:
            raise refuse_plan(where, "dataset.batch_size", given,
                              "MockIterableDataset yields batches of batch_size samples: give "
                              f"step_scheduler.local_batch_size ({local}) the same")
        if other == "batch_size" and name == "MockIterableDataset":
            job.skipped("dataset.batch_size", given, "set to local_batch_size by the benchmark "
                                                     "recipe" if bench else "local_batch_size's")
        elif other in ("padding", "truncation") and key and target:
            if sets:
                job.took(f"dataset.{other}", given, f"with dataset.{key}: every sample that long")
            else:
                job.skipped(f"dataset.{other}", given, f"dataset.{key} a bound only: each "
                                                       "sample its own length")
        elif other in ("seq_len", "seq_length"):
            job.strange(f"dataset.{other}", given, f"not {name or 'the dataset'}'s sequence "
                                                   "length argument")
        else:
            job.skipped(f"dataset.{other}", given, "the data (its source, split, tokens): not "
                                                   "the step's shape")


def _batch(data: dict[str, Any], job: JobConfig, where: str) -> None:
    steps = section(data, "step_scheduler", where)
    gbs = whole(steps.get("global_batch_size", 32), "step_scheduler.global_batch_size", where)
    lbs = whole(steps.get("local_batch_size", 1), "step_scheduler.local_batch_size", where)
    job.fix("global_batch", gbs)
    job.plan["_local_batch"] = lbs
    job.took("step_scheduler.global_batch_size", gbs, f"global_batch {gbs}")
    job.took("step_scheduler.local_batch_size", lbs, "samples per data-parallel rank per "
                                                     "gradient-accumulation step")
    for key, value in steps.items():
        if key in ("ckpt_every_steps", "val_every_steps", "num_epochs", "max_steps",
                   "gc_every_steps"):
            job.skipped(f"step_scheduler.{key}", value, "the run's length")
        elif key in ("save_checkpoint_every_epoch", "log_remote_every_steps",
                     "loss_average_window_steps"):
            job.skipped(f"step_scheduler.{key}", value, "the run's checkpoints and logging")
        elif key not in ("global_batch_size", "local_batch_size"):
            job.strange(f"step_scheduler.{key}", value)


def _degree(data: dict[str, Any], key: str, where: str) -> int:
    """distributed.<key>_size as a whole number (1 where not given)."""
    value = section(data, "distributed", where).get(f"{key}_size")
    return 1 if value is None else whole(value, f"distributed.{key}_size", where)


def _data_parallel(value: Any, degrees: dict[str, int], job: JobConfig, where: str) -> None:
    """distributed.dp_size: AutoModel's FSDP2 mesh is pp x dp x cp x tp ranks, dp as given where
    it is > 0, else the world over tp x cp x pp (nemo_automodel/components/distributed/
    mesh_utils.py at 36044ad, _infer_dp_size and _create_fsdp2_device_mesh); so a given dp
    fixes the world, which --gpus must then agree with (perfmodel.configs.resolve_plan); none
    (AutoModel's loader reads it as None, _translated) or null: inferred as for <= 0."""
    if value is None:
        job.took("distributed.dp_size", "none", "dp inferred: the world over tp x cp x pp "
                                                "(_infer_dp_size)")
        return
    dp = whole(value, "distributed.dp_size", where, minimum=-(10**10))
    if dp <= 0:
        job.skipped("distributed.dp_size", value, "<= 0: the world over tp x cp x pp")
        return
    world = dp * degrees["tp"] * degrees["cp"] * degrees["pp"]
    if job.gpus is not None and job.gpus != world:
        raise refuse_plan(where, "distributed.dp_size", dp,
                          f"pp {degrees['pp']} x dp {dp} x cp {degrees['cp']} x tp "
                          f"{degrees['tp']} = {world} ranks, not the world's {job.gpus} "
                          f"({job.gpus_from})")
    job.gpus = world
    job.gpus_from = (f"distributed.dp_size {dp} x tp {degrees['tp']} x cp {degrees['cp']} x pp "
                     f"{degrees['pp']} (AutoModel's mesh)")
    job.took("distributed.dp_size", dp, f"dp {dp}: the world is {world} GPUs")


def _parallelism(data: dict[str, Any], job: JobConfig, where: str) -> None:
    dist = dict(section(data, "distributed", where))
    target = str(dist.pop("_target_", ""))
    strategy = str(dist.pop("strategy", "ddp" if target.endswith("DDPManager") else "fsdp2"))
    if strategy not in ("fsdp2", "ddp"):
        raise refuse_plan(where, "distributed.strategy", strategy,
                          "perfmodel reads AutoModel's fsdp2 and ddp (megatron_fsdp is not "
                          "modelled)")
    job.took("distributed.strategy", strategy, "FSDP2 (zero 3)" if strategy == "fsdp2"
             else "DDP (zero 0)")
    degrees = {key: _degree(data, key, where) for key in ("tp", "cp", "pp", "ep", "dp_replicate")}
    for key in degrees:
        dist.pop(f"{key}_size", None)
    if "dp_size" in dist:
        _data_parallel(dist.pop("dp_size"), degrees, job, where)
    if degrees["dp_replicate"] > 1:
        raise refuse_plan(where, "distributed.dp_replicate_size", degrees["dp_replicate"],
                          "HSDP (replicated FSDP shards) is not modelled")
    if "dp_replicate_size" in section(data, "distributed", where):
        job.took("distributed.dp_replicate_size", section(data, "distributed", where)[
            "dp_replicate_size"] or "none", "one replica: FSDP over every data-parallel rank "
                                           "(no HSDP)")
    pipeline = section(dist, "pipeline", where) or section(data, "autopipeline", where)
    dist.pop("pipeline", None)
    job.fix("pp", degrees["pp"])
    if "pp_size" in section(data, "distributed", where):
        job.took("distributed.pp_size", degrees["pp"], f"pp {degrees['pp']}")
    if degrees["pp"] > 1:
        _pipeline(pipeline, job, where, degrees["pp"])
    for key in ("tp", "cp", "ep"):
        job.fix(key, degrees[key])
        job.took(f"distributed.{key}_size", degrees[key], f"{key} {degrees[key]}")
    given_sp = "sequence_parallel" in dist
    sp = yes_or_no(dist.pop("sequence_parallel", False), "distributed.sequence_parallel", where)
    job.fix("sequence_parallel", sp and degrees["tp"] > 1)
    if sp and degrees["tp"] > 1:
        job.took("distributed.sequence_parallel", True, "sequence_parallel (the norms' and "
                                                        "residuals' activations split over tp)")
    elif given_sp:
        job.skipped("distributed.sequence_parallel", sp, "no effect with tp_size 1" if sp
                    else "off")
    old = section(data, "parallelizer", where)
    moe = section(dist, "moe", where)
    dist.pop("moe", None)
    ac = dist.pop("activation_checkpointing", old.get("activation_checkpointing", False))
    if not isinstance(ac, bool) and str(ac).lower() != "selective":
        raise refuse_spec(where, "distributed.activation_checkpointing", ac,
                          "must be true, false or selective")
    mode = "op" if str(ac).lower() == "selective" else "full" if ac else "none"
    job.fix("recompute", mode)
    job.took("distributed.activation_checkpointing", ac, f"recompute {mode}")
    fsdp = strategy == "fsdp2"
    job.plan["_fsdp"] = fsdp
    # FSDP2Config.defer_fsdp_grad_sync (default true, nemo_automodel/components/distributed/
    # config.py): set_requires_gradient_sync on the last micro-batch only (get_sync_ctx); a
    # pipeline's schedule defers anyway, DDP has no FSDP reduction
    given = "defer_fsdp_grad_sync" in dist
    defer = yes_or_no(dist.pop("defer_fsdp_grad_sync", True),
                      "distributed.defer_fsdp_grad_sync", where)
    backend = section(section(data, "model", where), "backend", where)
    # components/moe/fsdp_mixin.py, prepare_for_grad_accumulation (training/utils.py calls it
    # without a pipeline only; a pipeline's schedule keeps the stage's units gathered anyway):
    # no FSDP unit reduces or reshards until the last micro-batch's backward
    optimized = yes_or_no(backend.get("enable_fsdp_optimizations", False),
                          "model.backend.enable_fsdp_optimizations", where)
    alone = fsdp and degrees["pp"] == 1  # FSDP runs the micro-batches itself
    # The MoE parallelizer shards a mixture of experts with ep_size > 1 (infrastructure.py,
    # instantiate_infrastructure; _dist_utils drops distributed.moe otherwise, and FSDP2Manager
    # shards the root model); the older recipes name it in their parallelizer section
    if old and moe:
        job.skipped("parallelizer", "...", "the older recipes' section, which distributed.moe "
                                           "replaces")
    if moe and degrees["ep"] == 1:
        job.skipped("distributed.moe", "...", "ep_size 1: FSDP2Manager shards the model, not "
                                              "the MoE parallelizer")
    legacy = bool(old) and not moe
    # FSDP2Config.reshard_after_forward, when given, overrides the MoE parallelizer's (8a83fdcee)
    raf = dist.pop("reshard_after_forward", None)
    if raf is not None:
        yes_or_no(raf, "distributed.reshard_after_forward", where)
    settings: tuple[bool, bool] = (True, True)  # (wrap_outer_model, kept), the defaults
    if legacy or moe and degrees["ep"] > 1:
        settings = _moe_parallelizer(old if legacy else moe, "parallelizer" if legacy
                                     else "distributed.moe", job, where, legacy)
    if raf is not None:
        job.took("distributed.reshard_after_forward", raf,
                 "FSDP's weights gathered again for the backward" if raf else
                 "FSDP's weights kept gathered from forward to backward")
    stated = raf is not None or "reshard_after_forward" in (old if legacy else moe)
    prefix = "distributed" if raf is not None else "parallelizer" if legacy \
        else "distributed.moe"
    if "enable_fsdp_optimizations" in backend and not (optimized and alone):
        job.took("model.backend.enable_fsdp_optimizations", optimized,
                 "moot: a pipeline's schedule keeps the stage's units gathered" if optimized
                 and fsdp else "moot: no FSDP (ddp)" if optimized else "off")

    def decide(model: Any) -> None:
        """Once the model is known: whether the MoE parallelizer shards it (a mixture of
        experts with ep_size > 1, or the older recipes' section), and so whether its settings
        and default (units kept gathered from forward to backward) hold; and whether
        enable_fsdp_optimizations acts (MoEFSDPSyncMixin, components/moe/fsdp_mixin.py, which
        AutoModel's mixtures of experts carry and training/utils.py calls through hasattr:
        on FSDP's root with either parallelizer, the settings recursing to every unit; a dense
        model has none, the flag does nothing)."""
        is_moe = bool(getattr(model, "experts", 0))
        parallelizer = legacy or degrees["ep"] > 1 and (bool(moe) or is_moe)
        wrapped, kept = settings if parallelizer else (True, False)
        keep = kept if raf is None else raf is False
        acts = optimized and alone and is_moe
        mode = "step" if acts else "backward" if keep and alone else "forward"
        if optimized and alone:
            job.took("model.backend.enable_fsdp_optimizations", True,
                     "fsdp_reshard step: every unit kept gathered and its reduction deferred "
                     "until the last micro-batch's backward" if acts else
                     "moot: AutoModel's dense models carry no MoEFSDPSyncMixin")
        if keep and mode == "backward" and not stated:
            job.took(f"{prefix}.reshard_after_forward", "false (the MoE parallelizer's default)",
                     "each unit's weights kept gathered from its forward to its backward")
        # finish() applies them once the ZeRO stage is known; with the units gathered again for
        # each backward and kept after it (the optimizations beside reshard_after_forward true)
        # the recipe is refused there
        key = f"{prefix}.reshard_after_forward" if parallelizer or raf is not None \
            else "distributed.reshard_after_forward (FSDP2Manager's default)"
        job.plan["_reshard"] = (mode, acts and not keep, key)
        job.plan["_defer"] = (defer, given, wrapped)

    job.with_model.append(decide)
    _switches(data, dist, degrees, sp, job, where)
    job.fix("overlap_grad_sync", True)
    job.fix("overlap_param_gather", fsdp, pin=False)
    job.fix("tp_layout", "1d")
    job.fix("placement", "tp,cp,dp,pp" if degrees["cp"] > 1 else "tp,dp,pp")
    if pipeline and degrees["pp"] == 1:
        job.skipped("distributed.pipeline", "...", "pipeline settings (pp_size 1: none)")
    for key, value in dist.items():
        job.strange(f"distributed.{key}", value)


def _switches(data: dict[str, Any], dist: dict[str, Any], degrees: dict[str, int], sp: bool,
              job: JobConfig, where: str) -> None:
    """FSDP2Config's compile, async-TP, prefetch and patch switches (nemo_automodel/components/
    distributed/config.py at 36044ad3d, FSDP2Manager.parallelize and maybe_compile, parallelizer.py
    fsdp2_strategy_parallelize and apply_fsdp2_sharding_recursively): each read or said why not,
    popped from dist."""
    compiled, why = _layer_compile(data, where)
    tp = degrees["tp"]
    compile_on = _flag(data, "enable_compile", where)
    async_tp = _flag(data, "enable_async_tensor_parallel", where)
    dist.pop("enable_compile", None)
    dist.pop("enable_async_tensor_parallel", None)
    if compile_on:
        job.took("distributed.enable_compile", True, why)
    elif "enable_compile" in section(data, "distributed", where):
        job.skipped("distributed.enable_compile", False, "off")
    if async_tp and tp > 1:
        if not sp:  # fsdp2_strategy_parallelize raises it
            raise refuse_plan(where, "distributed.enable_async_tensor_parallel", True,
                              "AutoModel raises 'enable_async_tensor_parallel=True requires "
                              "sequence_parallel=True': give distributed.sequence_parallel true")
        if compiled:  # Inductor's micro-pipelined TP: the matmuls overlap their collectives
            job.fix("tp_comm_overlap", True)
            job.took("distributed.enable_async_tensor_parallel", True,
                     "tp_comm_overlap (Inductor's micro-pipelined TP: the matmuls overlap their "
                     "all-gathers and reduce-scatters), the layers compiled")
        else:
            job.skipped("distributed.enable_async_tensor_parallel", True,
                        f"{why}: Inductor's micro-pipelined TP needs the compiled layers")
    elif "enable_async_tensor_parallel" in section(data, "distributed", where):
        job.skipped("distributed.enable_async_tensor_parallel", async_tp,
                    "no effect with tp_size 1" if async_tp else "off")
    patch = dist.pop("patch_is_packed_sequence", None)
    if patch is not None:
        job.skipped("distributed.patch_is_packed_sequence", patch,
                    "transformers' packed-sequence check patched out: no host-device sync per "
                    "attention layer, as perfmodel's host model has none" if patch is True
                    else "off")
    prefetch = dist.pop("enable_fsdp2_prefetch", None)
    depth = dist.pop("fsdp2_backward_prefetch_depth", 2)
    forward = dist.pop("fsdp2_forward_prefetch_depth", 1)
    for key, value in (("fsdp2_backward_prefetch_depth", depth),
                       ("fsdp2_forward_prefetch_depth", forward)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise refuse_plan(where, f"distributed.{key}", value, "a whole number >= 0")
    if prefetch is None:
        return
    yes_or_no(prefetch, "distributed.enable_fsdp2_prefetch", where)

    def decide(model: Any) -> None:
        """Once the FSDP units' resharding is known (_reshard: kept gathered from forward to
        backward, nothing to prefetch): apply_fsdp2_sharding_recursively chains each unit's
        forward prefetch of the next fsdp2_forward_prefetch_depth units (default 1, FSDP2's own
        prefetch) and its backward prefetch of the previous fsdp2_backward_prefetch_depth
        (default 2), with FSDP2 and no pipeline, where the units reshard after forward."""
        mode = job.plan.get("_reshard", ("forward",))[0]
        acts = prefetch and job.plan.get("_fsdp", True) and degrees["pp"] == 1 \
            and mode == "forward"
        if not prefetch:
            job.skipped("distributed.enable_fsdp2_prefetch", False,
                        "off: FSDP2's own prefetch of the next unit (overlap_param_gather)")
        elif not acts:
            job.skipped("distributed.enable_fsdp2_prefetch", True,
                        "no effect: no FSDP2 resharding after forward to prefetch (ddp, a "
                        "pipeline, or the units kept gathered)")
        else:
            job.took("distributed.enable_fsdp2_prefetch", True,
                     f"explicit prefetch chains (forward {forward}, backward {depth} units "
                     "ahead): overlap_param_gather")
            if depth > 1 or forward > 1:
                job.notes.append(
                    f"distributed.enable_fsdp2_prefetch: FSDP2 gathers up to "
                    f"{max(depth, forward)} units ahead (fsdp2_backward_prefetch_depth {depth}, "
                    f"fsdp2_forward_prefetch_depth {forward}); perfmodel holds two units' "
                    "gathered weights (the computing and the next): the others' are not counted "
                    "in memory")

    job.with_model.append(decide)


# The MoE parallelizer's settings (components/moe/parallelizer.py, parallelize_model): at 36044ad
# MoEParallelizerConfig's, in distributed.moe; the older recipes' parallelizer section also names
# its target and the checkpointing
_MOE_PARALLELIZER = {"reshard_after_forward", "wrap_outer_model", "ignore_router_for_ac",
                     "lm_head_precision"}
_LEGACY_PARALLELIZER = _MOE_PARALLELIZER | {"_target_", "activation_checkpointing"}


def _moe_parallelizer(settings: dict[str, Any], prefix: str, job: JobConfig, where: str,
                      legacy: bool) -> tuple[bool, bool]:
    """Read the MoE parallelizer's settings: whether the outer model is an FSDP unit
    (wrap_outer_model, default true) and whether each unit's weights stay gathered from its
    forward to its backward (reshard_after_forward false: the default of MoEParallelizerConfig
    and, from 2c236e081 to the 2026-02 refactor, of parallelize_model).

    wrap_outer_model false leaves the outer model (the CausalLM, model_parts[0]) unwrapped, so
    that utils.get_sync_ctx, which calls set_requires_gradient_sync only on an FSDPModule, does
    nothing: FSDP reduces every micro-batch whatever defer_fsdp_grad_sync says (the code before
    8134b0c03, 2025-11-10, never wrapped it)."""
    known = _LEGACY_PARALLELIZER if legacy else _MOE_PARALLELIZER
    for key, value in settings.items():
        if key not in known:
            job.strange(f"{prefix}.{key}", value)
    if "_target_" in settings and legacy:
        job.took(f"{prefix}._target_", settings["_target_"], "the parallelizer (its settings "
                                                              "below)")
    for key in ("wrap_outer_model", "reshard_after_forward", "ignore_router_for_ac"):
        if key in settings:
            yes_or_no(settings[key], f"{prefix}.{key}", where)
    precision = settings.get("lm_head_precision")
    # parallelize_model gives float32 its own policy; any other value takes the model's (bf16)
    if str(precision).lower().removeprefix("torch.") in ("float32", "fp32", "float"):
        raise refuse_plan(where, f"{prefix}.lm_head_precision", precision,
                          "an fp32 output layer is not modelled (leave it out: bf16)")
    if precision is not None:
        job.took(f"{prefix}.lm_head_precision", precision, "the output layer in bf16, as the "
                                                           "model")
    if "ignore_router_for_ac" in settings:
        job.skipped(f"{prefix}.ignore_router_for_ac", settings["ignore_router_for_ac"],
                    "the router's small GEMM kept or recomputed: not counted apart")
    wrapped = settings.get("wrap_outer_model", True)
    if "wrap_outer_model" in settings:
        job.took(f"{prefix}.wrap_outer_model", wrapped,
                 "the outer model an FSDP unit (defer_fsdp_grad_sync takes effect)" if wrapped
                 else "the outer model not an FSDP unit: defer_fsdp_grad_sync has no effect")
    keep = settings.get("reshard_after_forward", False) is False
    if "reshard_after_forward" in settings:
        job.took(f"{prefix}.reshard_after_forward", settings["reshard_after_forward"],
                 "FSDP's weights kept gathered from forward to backward" if keep
                 else "FSDP's weights gathered again for the backward")
    return bool(wrapped), keep


# BackendConfig's other fields (components/models/common/utils.py at 36044ad), each read below or
# left out with its reason: none is dropped without a word
_BACKEND_READ = {"attn", "linear", "rms_norm", "fake_balanced_gate", "fake_gate_noise",
                 "enable_fsdp_optimizations", "dispatcher", "enable_deepep", "experts", "te_fp8",
                 "mok"}
_BACKEND_SKIPPED = {
    "_target_": "the backend's class",
    "rope": "RoPE's kernel: not counted apart from the element-wise ops",
    "compile_attn": "the attention's small ops compiled: not counted apart",
    "gate_precision": "the router's small GEMM in another dtype: not counted apart",
    "dispatcher_num_sms": "DeepEP's SMs: its kernels' cost is the model's",
    "dispatcher_share_token_dispatcher": "one dispatcher object for every layer",
    "dispatcher_async_dispatch": "DeepEP's outputs on its own stream",
    "enable_hf_state_dict_adapter": "the checkpoint's format",
    "cuda_graph": "partial CUDA graphs: the host's dispatch is costed as the eager stack's",
}


def _backend_rest(backend: dict[str, Any], data: dict[str, Any], job: JobConfig,
                  where: str) -> None:
    """The backend's experts, dispatcher and FP8 settings, and every other key named: the
    experts' kernels (te, gmm, torch_mm, and torch beside DeepEP, which runs TE's: grouped GEMMs,
    costed at the GEMM efficiency of their shapes; torchao's MXFP8 ones refused), the tokens'
    dispatcher (deepep, hybridep: DeepEP's kernels, ep_dispatcher deepep; torch, AutoModel's
    all-gather of every token and all-reduce of the outputs (moe/experts.py), uccl_ep and mok
    refused; with ep_size > 1 a recipe must name it, as AutoModel picks by what is installed),
    and Transformer Engine's FP8 (te_fp8: refused, its autocast's reach is the model's own)."""
    # AutoModel's expert activations are torch.compile'd kernels (components/moe/experts.py
    # at 36044ad3d: quick_geglu_deepep and its kin, the clamp inside), not Megatron-Core's eager
    # clamps before a fused kernel (TransformerSpec.clamped_glu: a run's, as mtp_layers is)
    job.model["clamped_glu"] = False
    job.took("model.backend", "...", "clamped_glu false: a clamped GLU's clamp (GPT-OSS's) runs "
                                     "inside AutoModel's compiled activation kernel")
    for key, value in backend.items():
        if key == "rope_fusion":
            # BackendConfig.__post_init__ at 36044ad3d forces TE's fused RoPE off whatever the
            # recipe says (components/models/common/utils.py: "temporarily force-disabled
            # globally", AutoModel issue #3027): RoPE op by op, beside TE's norms and linears
            # a few element-wise passes not modelled (said, as Megatron's --no-rope-fusion is)
            forced = "" if value in (False, "false", "False") else \
                " (forced off by AutoModel's BackendConfig, issue #3027)"
            job.skipped("model.backend.rope_fusion", value,
                        f"RoPE op by op{forced}"
                        + (" beside fused norms and linears: its extra element-wise passes "
                           "are not modelled (costed as the fused RoPE kernel)"
                           if job.plan.get("kernels") == "fused" else ", with the rest"))
            continue
        if key in _BACKEND_SKIPPED:
            job.skipped(f"model.backend.{key}", value, _BACKEND_SKIPPED[key])
        elif key not in _BACKEND_READ:
            job.strange(f"model.backend.{key}", value)
    if backend.get("te_fp8") is not None:
        fp8 = backend["te_fp8"]
        raise refuse_plan(where, "model.backend.te_fp8",
                          fp8.get("recipe", "...") if isinstance(fp8, dict) else fp8,
                          "AutoModel's Transformer Engine FP8 (its autocast over the model's TE "
                          "modules, the experts' grouped GEMMs among them) is not read: give "
                          "--dtype fp8 and --fp8-recipe with the plan's flags")
    experts = backend.get("experts")
    if experts is not None and experts not in ("te", "gmm", "torch_mm", "torch",
                                               "torch_mm_mxfp8"):
        raise refuse_plan(where, "model.backend.experts", experts,
                          "AutoModel's values: te, gmm, torch_mm, torch, torch_mm_mxfp8")
    if experts is not None:
        # (a dense model has no experts to run: decided once the model is known)
        deep = backend.get("dispatcher") in ("deepep", "hybridep")
        job.with_model.append(lambda model: _experts_backend(model, experts, deep, job, where))
    dispatcher = backend.get("dispatcher")
    if "mok" in backend and dispatcher != "mok":
        job.skipped("model.backend.mok", "...", "Mixture-of-Kittens' settings: its dispatcher "
                                                "is not the one named")
    ep = _degree(data, "ep", where)
    if ep == 1:  # no tokens leave the rank (a dense model too)
        for key in ("dispatcher", "enable_deepep"):
            if key in backend:
                job.skipped(f"model.backend.{key}", backend[key],
                            "ep_size 1: no token leaves its rank")
        return
    if dispatcher in ("deepep", "hybridep") or dispatcher is None and backend.get("enable_deepep"):
        job.fix("ep_dispatcher", "deepep")
        job.took("model.backend.dispatcher" if dispatcher else "model.backend.enable_deepep",
                 dispatcher or True, "the tokens' exchange by DeepEP's (HybridEP's) kernels: "
                 "ep_dispatcher deepep" + ("" if dispatcher else " (the switch of the recipes "
                                           "before 50a12b7c7, 2026-06-19; AutoModel ignores it "
                                           "since)"))
    elif dispatcher is not None:
        raise refuse_plan(where, "model.backend.dispatcher", dispatcher,
                          "perfmodel reads deepep and hybridep: AutoModel's torch dispatcher "
                          "(an all-gather of every token, an all-reduce of the outputs), "
                          "uccl_ep and mok are not modelled")
    else:
        raise refuse_plan(where, "model.backend.dispatcher", "(not given)",
                          "with ep_size > 1 name it: AutoModel takes DeepEP, UCCL-EP or its "
                          "all-gather by what is installed (deepep or hybridep are modelled)")


def _experts_backend(model: Any, experts: Any, deep: bool, job: JobConfig, where: str) -> None:
    """model.backend.experts once the model is known: a mixture of experts' grouped GEMMs (te,
    gmm, torch_mm; torch beside DeepEP runs TE's), costed at the GEMM efficiency of their
    shapes; torchao's MXFP8 ones and torch's loop otherwise refused; moot for a dense model."""
    if not getattr(model, "experts", 0):
        job.skipped("model.backend.experts", experts, "a dense model: no experts")
        return
    if experts == "torch_mm_mxfp8" or experts == "torch" and not deep:
        raise refuse_plan(where, "model.backend.experts", experts,
                          "torchao's MXFP8 grouped GEMMs and, without DeepEP or HybridEP, a loop "
                          "over the experts are not modelled: te, gmm or torch_mm")
    # (torch, a loop over the experts, but with DeepEP or HybridEP AutoModel takes TE's grouped
    # GEMMs for it, moe/layers.py)
    job.took("model.backend.experts", experts,
             "the experts' grouped GEMMs, at the GEMM efficiency of their shapes"
             + (" (TE's, as AutoModel runs them beside DeepEP)" if experts == "torch"
                else ""))


def stage_layers(layers: int, pp: int, per_stage: int | None, single: bool,
                 round_to: str | None, where: str) -> list[int]:
    """The decoder layers of each pipeline stage as AutoModel splits them (components/distributed/
    pipelining/functional.py: calculate_virtual_stages, generate_hf_model_fqn_per_model_part):
    ceil(layers / layers_per_stage) stages, rounded up or down to a multiple of pp when asked
    (else refused), one per rank for a single-stage schedule and at least two otherwise; without
    layers_per_stage 1 or 2 stages a rank. The first layers % stages stages take one layer more;
    the embedding rides with the first stage, the final norm and output layer with the last."""
    if per_stage is None:
        stages = pp * (1 if single else 2)
    else:
        stages = -(-layers // per_stage)
        if stages % pp and round_to in ("up", "down"):
            stages += (pp - stages % pp) if round_to == "up" else -(stages % pp)
        if stages % pp or stages < pp:
            raise refuse_plan(where, "pipeline.layers_per_stage", per_stage,
                              f"{stages} stages of {layers} layers do not divide over pp {pp} "
                              "(AutoModel refuses it; round_virtual_stages_to_pp_multiple rounds)")
        if (stages // pp != 1) if single else (stages // pp < 2):
            raise refuse_plan(where, "pipeline.layers_per_stage", per_stage,
                              f"{stages // pp} stages a rank: AutoModel's "
                              + ("single-stage schedule takes one" if single else
                                 "multi-stage schedules take two or more"))
    if stages > layers:
        raise refuse_plan(where, "distributed.pp_size", pp,
                          f"{stages} stages for {layers} layers (AutoModel refuses it)")
    base, extra = divmod(layers, stages)
    return [base + (i < extra) for i in range(stages)]


# PipelineConfig's fields (components/distributed/pipelining/config.py at 36044ad3d, and the
# older AutoPipeline section's target), each read, refused or said why not
_PIPELINE_READ = {"pp_schedule", "pp_schedule_csv", "pp_microbatch_size", "layers_per_stage",
                  "round_virtual_stages_to_pp_multiple", "module_fqns_per_model_part"}
_PIPELINE_SKIPPED = {
    "_target_": "the pipeline's class",
    "pp_batch_size": "set from step_scheduler.local_batch_size (recipes/llm/train_ft.py)",
    "scale_grads_in_schedule": "where the gradients are divided (the same work)",
    "patch_inner_model": "how the stages wrap the model's forward",
    "patch_causal_lm_model": "how the stages wrap the model's forward",
    "pp_seq_len": "the stages' buffer shapes (the sequence length above)",
}


def _pipeline(pipeline: dict[str, Any], job: JobConfig, where: str, pp: int) -> None:
    """pp > 1: the schedule, the micro-batch and AutoModel's split of the preset's layers, written
    as the Megatron-style layout perfmodel models (perfmodel.pipeline_layout)."""
    name = str(pipeline.get("pp_schedule", "1f1b")).lower().replace("_", "")
    if name not in _SCHEDULES or pipeline.get("pp_schedule_csv"):
        raise refuse_plan(where, "pipeline.pp_schedule", pipeline.get("pp_schedule"),
                          f"perfmodel models AutoModel's {', '.join(_SCHEDULES)} (no CSV "
                          "schedule)")
    if pipeline.get("module_fqns_per_model_part"):
        raise refuse_plan(where, "pipeline.module_fqns_per_model_part", "...",
                          "a hand-made split of the modules is not read: give layers_per_stage")
    for key, value in pipeline.items():
        if key in _PIPELINE_SKIPPED:
            job.skipped(f"pipeline.{key}", value, _PIPELINE_SKIPPED[key])
        elif key not in _PIPELINE_READ:
            job.strange(f"pipeline.{key}", value)
    if job.preset is None:  # the model comes with --model: split its layers once it is known
        job.with_model.append(lambda model: _split(pipeline, job, where, pp, name, model.layers))
    else:
        _split(pipeline, job, where, pp, name, _preset(job.preset).layers)


def _split(pipeline: dict[str, Any], job: JobConfig, where: str, pp: int, name: str,
           layers: int) -> None:
    """AutoModel's split of the model's layers over pp x stages a rank, as a pipeline layout."""
    per = pipeline.get("layers_per_stage")
    split = stage_layers(layers, pp, None if per is None else whole(
        per, "pipeline.layers_per_stage", where), name != "interleaved1f1b",
        pipeline.get("round_virtual_stages_to_pp_multiple"), where)
    chunks = ["t" * n for n in split]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    v = len(split) // pp
    job.fix("schedule", _SCHEDULES[name])
    job.fix("virtual_stages", v)
    job.fix("pipeline_layout", "|".join(chunks))
    micro = whole(pipeline.get("pp_microbatch_size", 1), "pipeline.pp_microbatch_size", where)
    job.plan["_pp_micro_batch"] = micro
    job.took("pipeline.pp_schedule", pipeline.get("pp_schedule", "1f1b"),
             f"schedule {_SCHEDULES[name]}, {v} stage{'s' if v > 1 else ''} a rank")
    job.took("pipeline.layers_per_stage", per, f"{len(split)} stages of "
             f"{'/'.join(str(n) for n in sorted(set(split), reverse=True))} layers: layout "
             f"{job.plan['pipeline_layout']}")
    if "round_virtual_stages_to_pp_multiple" in pipeline:
        job.took("pipeline.round_virtual_stages_to_pp_multiple",
                 pipeline["round_virtual_stages_to_pp_multiple"], "the stages' count (above)")
    job.took("pipeline.pp_microbatch_size", micro if "pp_microbatch_size" in pipeline
             else "1 (not given)", f"micro_batch {micro} (local_batch_size / it: the "
                                   "pipeline's micro-batches)")


# Transformer Engine's FusedAdam, as AutoModel's YAML names it (the factory escape hatch:
# nemo_automodel/components/optim/optimizer.py build_optimizer_config at 36044ad3d wraps a
# `_target_` callable in OptimizerFromFactoryConfig, which calls it with the section's kwargs
# alone, so TE's own defaults hold; AutoModel's typed FusedAdamConfig, `name: fused_adam`, sets
# master_weights True instead)
_TE_FUSED_ADAM = ("transformer_engine.pytorch.optimizers.FusedAdam",
                  "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam")
# its keyword arguments that set the states (the others are hyperparameters or kernels' modes)
_TE_ADAM_STATES = ("master_weights", "master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                   "store_param_remainders")
_TORCH_DTYPES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "bfloat16": "bf16",
                 "bf16": "bf16"}


def _optimizer(data: dict[str, Any], job: JobConfig, where: str) -> None:
    section_ = section(data, "optimizer", where)
    target = str(section_.get("_target_", "torch.optim.Adam"))
    if target in _TE_FUSED_ADAM:
        _te_fused_adam(section_, target, _fp32_parameters(data, where), job, where)
        return
    if target.rsplit(".", 1)[-1] not in ("Adam", "AdamW"):
        raise refuse_plan(where, "optimizer._target_", target,
                          "perfmodel models Adam's states: torch's Adam and AdamW (in the "
                          "parameters' dtype) and Transformer Engine's FusedAdam "
                          f"({_TE_FUSED_ADAM[0]})")
    if section_.get("amsgrad") is True:  # torch.optim.Adam keeps max_exp_avg_sq beside them
        raise refuse_plan(where, "optimizer.amsgrad", True, "AMSGrad's third state is not "
                                                            "modelled (Adam's two)")
    job.took("optimizer._target_", target, "Adam's states")
    _torch_adam_kernels(section_, job, where)
    for key, value in section_.items():
        if key not in ("_target_", "fused", "foreach"):
            job.skipped(f"optimizer.{key}", value, "a hyperparameter or the kernel's mode "
                                                   "(Adam's states whatever its rates)")


def _torch_adam_kernels(kwargs: dict[str, Any], job: JobConfig, where: str) -> None:
    """How torch's Adam and AdamW run their step: `fused` true, one fused kernel; otherwise
    torch's foreach passes, its default for CUDA tensors and DTensors where neither is given
    (torch/optim/optimizer.py, _default_to_fused_or_foreach); `foreach` false, a for-loop of
    the same passes a tensor at a time (its per-tensor dispatch not counted), as torchtitan's
    reader takes it."""
    fused = kwargs.get("fused")
    foreach = kwargs.get("foreach")
    for key, value in (("fused", fused), ("foreach", foreach)):
        if value is not None and not isinstance(value, bool):
            raise SpecError(f"{where}: optimizer.{key} must be true, false or null, got "
                            f"{value!r}")
    if fused and foreach:  # torch raises "`fused` and `foreach` cannot be `True` together."
        raise refuse_spec(where, "optimizer.fused", True, "torch's Adam refuses fused and "
                                                           "foreach both true")
    kind = "fused" if fused else "foreach"
    job.fix("optimizer_kernels", kind, pin="fused" in kwargs or "foreach" in kwargs)
    for key, value in (("fused", fused), ("foreach", foreach)):
        if key in kwargs:
            job.took(f"optimizer.{key}", value, f"optimizer_kernels {kind}"
                     + (" (a for-loop of foreach's passes, one tensor at a time)"
                        if key == "foreach" and value is False and not fused else ""))
    if "fused" not in kwargs and "foreach" not in kwargs:
        job.notes.append("optimizer: neither fused nor foreach given: torch's default for CUDA "
                         "tensors, foreach (optimizer_kernels foreach)")


def _dtype(value: Any, key: str, where: str) -> str:
    """A torch dtype as AutoModel's YAML writes it (torch.bfloat16, bfloat16, ...): fp32 or bf16;
    TE's fp16 and uint8 (FP8) states are refused."""
    text = str(value).strip().removeprefix("torch.")
    if text not in _TORCH_DTYPES:
        raise refuse_plan(where, key, value, "perfmodel models float32 and bfloat16 optimizer "
                                             "states (fp16 and FP8 ones are not modelled)")
    return _TORCH_DTYPES[text]


def _te_fused_adam(kwargs: dict[str, Any], target: str, fp32_params: bool, job: JobConfig,
                   where: str) -> None:
    """Transformer Engine's FusedAdam with the YAML's keyword arguments over its defaults
    (transformer_engine/pytorch/optimizers/fused_adam.py at NVIDIA/TransformerEngine d0067d0da,
    the same since v1.13's 05c0fb024; before it, from TE's port of Apex's in e8a17d1e8, the
    moments were fp32 and no master copy was kept unless given): exp_avg_dtype and
    exp_avg_sq_dtype torch.float32 (Plan.optimizer_dtype; perfmodel's one dtype for both),
    master_weights False (no fp32 copy of bf16 parameters: Plan.master_weights none; with it
    an fp32 copy, master_weight_dtype fp32; fp16 refused), store_param_remainders False (with
    fp32 master weights of bf16 parameters, their 16-bit remainders: refused here, not modelled
    beside AutoModel's FSDP2). Over float32 parameters FusedAdam keeps no master copy (the
    parameters are it), only the moments' dtype applies."""
    moments = {key: _dtype(kwargs.get(key, "float32"), f"optimizer.{key}", where)
               for key in ("exp_avg_dtype", "exp_avg_sq_dtype")}
    if moments["exp_avg_dtype"] != moments["exp_avg_sq_dtype"]:
        raise refuse_plan(where, "optimizer.exp_avg_dtype", kwargs.get("exp_avg_dtype",
                                                                       "float32"),
                          f"beside exp_avg_sq_dtype {kwargs.get('exp_avg_sq_dtype', 'float32')}"
                          ": perfmodel's optimizer states take one dtype (give both the same)")
    states = moments["exp_avg_dtype"]
    master = yes_or_no(kwargs.get("master_weights", False), "optimizer.master_weights", where)
    if master and _dtype(kwargs.get("master_weight_dtype", "float32"),
                         "optimizer.master_weight_dtype", where) != "fp32":
        raise refuse_plan(where, "optimizer.master_weight_dtype", kwargs["master_weight_dtype"],
                          "perfmodel models fp32 master weights")
    if master and not fp32_params and kwargs.get("store_param_remainders") is True:
        raise refuse_plan(where, "optimizer.store_param_remainders", True,
                          "FusedAdam's 16-bit remainders of the master weights are not modelled "
                          "under AutoModel (give it false: the fp32 copy whole)")
    if fp32_params:  # the parameters are the fp32 master; FusedAdam keeps no other copy
        if states == "bf16":
            job.fix("optimizer_dtype", "bf16")
            job.fix("master_weights", "fp32")
        read = f"optimizer_dtype {states} (the moments), the float32 parameters their master"
    else:
        job.fix("optimizer_dtype", states)
        job.fix("master_weights", "fp32" if master else "none")
        read = (f"optimizer_dtype {states} (the moments), master_weights "
                + ("fp32 (an fp32 copy of the bf16 parameters)" if master
                   else "none (the bf16 parameters updated in place)"))
    job.took("optimizer._target_", target, f"Transformer Engine's FusedAdam: {read}"
             + ("" if any(k in kwargs for k in _TE_ADAM_STATES) else " (its defaults)"))
    for key in _TE_ADAM_STATES:
        if key in kwargs:
            job.took(f"optimizer.{key}", kwargs[key], "the optimizer's states (above)")
    for key, value in kwargs.items():
        if key not in (*_TE_ADAM_STATES, "_target_"):
            job.skipped(f"optimizer.{key}", value, "a hyperparameter or the kernel's mode "
                                                   "(Adam's states whatever its rates)")


def finish(job: JobConfig, gpus: int) -> None:
    """The fields that follow from the world size: data parallelism takes the ranks the other
    degrees leave; FSDP2 over them is ZeRO 3 (DDP, or one rank: 0)."""
    fsdp = job.plan.pop("_fsdp", True)
    local = job.plan.pop("_local_batch", 1)
    micro = job.plan.pop("_pp_micro_batch", local)
    tp, cp, pp = job.plan.get("tp", 1), job.plan.get("cp", 1), job.plan.get("pp", 1)
    dp, left = divmod(gpus, tp * cp * pp)
    if left or dp < 1:
        raise refuse_plan(job.path, "distributed", f"tp {tp} x cp {cp} x pp {pp}",
                          f"{gpus} GPUs do not divide by tp x cp x pp = {tp * cp * pp}")
    job.fix("zero", 3 if fsdp and dp * cp > 1 else 0)
    defer, given, wrapped = job.plan.pop("_defer", (False, False, True))
    applies = fsdp and dp * cp > 1 and pp == 1  # FSDP runs the micro-batches itself
    reshard, conflict, key = job.plan.pop("_reshard", ("forward", False, ""))
    if applies and conflict:
        raise refuse_plan(job.path, "model.backend.enable_fsdp_optimizations", True,
                          f"with {key} true the units are gathered again for each backward yet "
                          "kept after it: not modelled (give it false)")
    if applies and reshard != "forward":
        job.fix("fsdp_reshard", reshard)
    # one micro-batch a step (global batch = local_batch_size x dp): nothing to defer
    single = job.plan.get("global_batch") == local * dp and local == micro
    job.fix("defer_grad_sync", bool(defer and applies and wrapped and not single))
    if defer or given:
        job.took("distributed.defer_fsdp_grad_sync", f"{defer}{'' if given else ' (default)'}",
                 "moot (a pipeline's schedule defers the reduction; DDP or one rank none)"
                 if not applies else "moot: one micro-batch a step" if single
                 else "moot: enable_fsdp_optimizations defers the reduction "
                 "(fsdp_reshard step)" if reshard == "step" else "no effect: FSDP's reduction "
                 "in every micro-batch (the outer model is not an FSDP unit: wrap_outer_model "
                 "false)" if defer and not wrapped else "defer_grad_sync (FSDP's reduction in "
                 "the last micro-batch only)" if defer else "FSDP's reduction in every "
                 "micro-batch")
    if local % micro:
        raise refuse_plan(job.path, "pipeline.pp_microbatch_size", micro,
                          f"must divide local_batch_size ({local})")
    if pp > 1 and local // micro < pp:  # recipes/llm/train_ft.py at 36044ad3d asserts it
        raise refuse_plan(job.path, "pipeline.pp_microbatch_size", micro,
                          f"local_batch_size {local} / it must be >= pp_size {pp} (AutoModel "
                          "asserts it)")
    job.fix("micro_batch", micro)
    if job.plan["global_batch"] % (local * dp):
        raise refuse_plan(job.path, "step_scheduler.global_batch_size", job.plan["global_batch"],
                          f"must be a multiple of local_batch_size x dp ({local} x {dp})")
    accumulation = job.plan["global_batch"] // (local * dp)
    if pp > 1 and accumulation > 1:  # one pipeline schedule per gradient-accumulation step
        job.fix("pipeline_micro_batches", local // micro)
        job.notes.append(f"{accumulation} gradient-accumulation steps, each one pipeline schedule "
                         f"of {local // micro} micro-batches with its fill and drain")
