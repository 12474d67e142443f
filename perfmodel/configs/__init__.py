"""A job's own config in, a launchable config out.

`read_config(path)` reads a Megatron-LM argument list or launch script, a Megatron-Bridge / NeMo 2
YAML, a torchtitan job config (TOML or its JSON dump), a DeepSpeed JSON or a NeMo AutoModel
recipe YAML into a JobConfig;
`resolve_model` and `resolve_plan` turn it and the command line into a TransformerSpec and the
Plan fields; perfmodel.configs.emit writes a plan back as a framework's config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.configs.job import Framework, JobConfig, Setting
from perfmodel.errors import PlanError, SpecError

__all__ = ["Framework", "JobConfig", "Setting", "read_config", "resolve_model", "resolve_plan"]

_DEEPSPEED_KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                   "gradient_accumulation_steps")
_TORCHTITAN_KEYS = ("parallelism", "training", "activation_checkpoint", "job", "model")


def detect(path: Path, text: str) -> tuple[Framework, Any]:
    """The framework a config file is written for, and its parsed content (a mapping; the text
    for an argument list or script): TOML is torchtitan's; JSON DeepSpeed's (its batch or ZeRO
    keys) or torchtitan's dump (its sections); YAML NeMo AutoModel's (a step_scheduler beside a
    distributed section), else Megatron-Bridge's or NeMo 2's; anything else
    Megatron-LM arguments."""
    from perfmodel.specs.loading import read_mapping

    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml"):
        return Framework.MEGATRON, text
    data = read_mapping(path, "job config")
    if suffix == ".toml":
        if not data:  # torchtitan would train its debug model: a config left empty by mistake
            raise SpecError(f"job config {path} is empty (torchtitan would train its default "
                            "debug model): give the job's sections")
        return Framework.TORCHTITAN, data
    if suffix == ".json":
        if any(k in data for k in _DEEPSPEED_KEYS):
            return Framework.DEEPSPEED, data
        if sum(k in data for k in _TORCHTITAN_KEYS) >= 2:
            return Framework.TORCHTITAN, data
        raise SpecError(f"job config {path}: a JSON file perfmodel reads is a DeepSpeed config "
                        f"(with one of {', '.join(_DEEPSPEED_KEYS)}) or a torchtitan job config "
                        f"dump (with sections {', '.join(_TORCHTITAN_KEYS)})")
    from perfmodel.configs.automodel import is_automodel

    return (Framework.AUTOMODEL if is_automodel(data) else Framework.NEMO), data


def read_config(path: str | Path) -> JobConfig:
    """The job config at path, read (SpecError/PlanError in one line for what cannot be)."""
    from perfmodel.files import read_text_bounded

    path = Path(path)
    text = read_text_bounded(path, "job config", error=SpecError)
    framework, data = detect(path, text)
    if framework is Framework.MEGATRON:
        from perfmodel.configs.megatron import read_megatron

        return read_megatron(text, path)
    if framework is Framework.NEMO:
        from perfmodel.configs.nemo import read_nemo

        return read_nemo(data, path)
    if framework is Framework.TORCHTITAN:
        from perfmodel.configs.torchtitan import read_torchtitan

        return read_torchtitan(data, path)
    if framework is Framework.AUTOMODEL:
        from perfmodel.configs.automodel import read_automodel

        return read_automodel(data, path)
    from perfmodel.configs.deepspeed import read_deepspeed

    return read_deepspeed(data, path)


def resolve_model(job: JobConfig, model: str | None, seq_len: int | None) -> Any:
    """The TransformerSpec of a config: its fields, over --model (a preset, spec file or Hugging
    Face config) or the preset it names. A field the config and --model both give must agree
    (SpecError naming it); the vocabulary is padded per Megatron-LM later (resolve_plan)."""
    from perfmodel.specs.model import TransformerSpec, load_model, model_from_dict

    fields = dict(job.model)
    if seq_len is None and "seq_len" not in fields and job.needs_seq_len:
        raise SpecError(f"{job.path}: {job.needs_seq_len}: give --seq-len")
    if seq_len is not None:
        if "seq_len" in fields and fields["seq_len"] != seq_len:
            raise SpecError(f"--seq-len {seq_len} contradicts the config's sequence length "
                            f"{fields['seq_len']} ({job.path}); drop one")
        fields["seq_len"] = seq_len
    base = None
    if model:
        base = load_model(model, seq_len=fields.get("seq_len"))
        if not isinstance(base, TransformerSpec):
            raise SpecError(f"model '{model}' is a layer graph: a job config trains a transformer")
        for key, value in fields.items():
            # the sequence, the router's routing, whether the run builds the MTP modules
            # (torchtitan and AutoModel build none), its dropout rates, the experts' capacity
            # factor (Megatron-Core's moe_expert_capacity_factor, a run's setting) and whether
            # it clamps a GLU in eager passes (AutoModel compiles the clamp) are the run's, not
            # the model's identity
            if key not in ("seq_len", "routing", "routing_imbalance", "mtp_layers",
                           "hidden_dropout", "attention_dropout", "capacity_factor",
                           "clamped_glu") and \
                    getattr(base, key) != value:
                hint = (f" (its window_size [{value - 1}, 0]: the left {value - 1} tokens and "
                        "itself, Transformer Engine's window; a model spec with sliding_window "
                        f"{value} is the config's)" if key == "sliding_window"
                        and isinstance(value, int) else "")
                raise SpecError(f"{job.path}: the config's {key} ({value}) differs from model "
                                f"'{model}' ({getattr(base, key)}){hint}; the config's model is "
                                "another: give the matching --model, or none")
    elif job.preset:
        base = load_model(job.preset, seq_len=fields.get("seq_len"))
    elif job.needs_model:
        raise SpecError(f"{job.path}: {job.needs_model}: give --model")
    if base is not None:
        spec = base.replace(**fields) if fields else base
        origin = f"{base.origin}, with {job.framework.value} config {job.path}"
    else:
        spec = model_from_dict({"name": Path(job.path).stem, **fields},
                               f"{job.framework.value} config {job.path}")
        origin = f"{job.framework.value} config {job.path}"
    return spec.noted(origin=origin, seq_len_from=f"{job.framework.value} config {job.path}"
                      if "seq_len" in job.model else spec.seq_len_from or "--seq-len")


def resolve_plan(job: JobConfig, model: Any, given: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(model, Plan fields) of a config with the command line's plan options (`given`: only
    those given explicitly). A given option the config also fixes must agree (PlanError); the
    world size is the config's or --gpus. The model comes back with Megatron's vocabulary
    padding at the plan's tp."""
    gpus = job.gpus
    if given.get("gpus") is not None:
        if gpus is not None and gpus != given["gpus"] and not job.gpus_default:
            raise PlanError(f"--gpus {given['gpus']} contradicts the config's world size {gpus} "
                            f"({job.gpus_from}); drop one")
        if gpus is not None and gpus != given["gpus"]:  # the config's is a default only
            if given["gpus"] % job.gpus_multiple:
                raise PlanError(f"--gpus {given['gpus']} is not a multiple of the "
                                f"{job.gpus_multiple} GPUs a node the config states "
                                f"({job.gpus_from})")
            job.notes.append(f"--gpus {given['gpus']} sets the world size: the config's "
                             f"{gpus} ({job.gpus_from}) is not stated by it, {job.gpus_default}")
        gpus = given["gpus"]
    elif job.gpus_default:
        job.notes.append(f"world size {gpus} ({job.gpus_from}): {job.gpus_default}; give "
                         "--gpus for the run's own")
    if gpus is None:
        raise PlanError(f"{job.path}: the config does not give the world size (the launcher "
                        "does): give --gpus")
    for key, value in given.items():
        if key == "gpus" or value is None:
            continue
        if key in job.plan and job.plan[key] != value and str(job.plan[key]) != str(value):
            flag = (f"--attention {'flash' if value else 'unfused'}"  # the flag given
                    if key == "flash_attention" else f"--{key.replace('_', '-')} {value}")
            raise PlanError(f"{flag} contradicts the config's {key} {job.plan[key]} "
                            f"({job.path}); drop one")
        job.plan[key] = value
    for decide in job.with_model:
        decide(model)
    job.with_model.clear()
    finish = _finisher(job)
    if finish is not None:
        finish(job, gpus)
    plan = {k: v for k, v in job.plan.items() if not k.startswith("_")}
    tp, pp, cp = int(plan.get("tp", 1)), int(plan.get("pp", 1)), int(plan.get("cp", 1))
    if gpus % (tp * pp * cp):
        raise PlanError(f"{job.path}: {gpus} GPUs do not divide into tp {tp} x pp {pp}"
                        + (f" x cp {cp}" if cp > 1 else ""))
    plan["gpus"] = gpus
    plan.setdefault("dp", gpus // (tp * pp * cp))
    plan.setdefault("micro_batch", 1)
    plan.setdefault("global_batch", plan["dp"] * plan["micro_batch"])
    return pad_vocab(job, model, tp), plan


def pad_vocab(job: JobConfig, model: Any, tp: int) -> Any:
    """The model with Megatron-LM's padded vocabulary (a multiple of
    make_vocab_size_divisible_by x tp), noted in the job; the model as it is otherwise."""
    if not job.vocab_multiple:
        return model
    from perfmodel.configs.megatron import padded_vocab

    vocab = padded_vocab(model.vocab, job.vocab_multiple, tp)
    if vocab == model.vocab:
        return model
    job.notes.append(f"vocab {model.vocab} padded to {vocab}: Megatron-LM's multiple of "
                     f"make-vocab-size-divisible-by {job.vocab_multiple} x tp {tp}")
    return model.replace(vocab=vocab).noted(origin=model.origin, seq_len_from=model.seq_len_from)


def _finisher(job: JobConfig) -> Any:
    if job.framework is Framework.TORCHTITAN:
        from perfmodel.configs.torchtitan import finish

        return finish
    if job.framework is Framework.DEEPSPEED:
        from perfmodel.configs.deepspeed import finish as ds_finish

        return ds_finish
    if job.framework is Framework.NEMO:
        from perfmodel.configs.nemo1 import finish as nemo1_finish

        return nemo1_finish
    if job.framework is Framework.AUTOMODEL:
        from perfmodel.configs.automodel import finish as am_finish

        return am_finish
    return None
