"""What a job's own config says, in perfmodel's terms: the model fields, the plan fields and the
world size it fixes, and a record of every setting it holds (read, ignored with a reason, or not
known to perfmodel). The readers (megatron, nemo, torchtitan, deepspeed, automodel) build one;
`resolve` turns it and the command line into a model and a plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from perfmodel.errors import PlanError, SpecError


class Framework(StrEnum):
    MEGATRON = "megatron"  # a Megatron-LM pretrain_gpt.py argument list or launch script
    NEMO = "nemo"  # a Megatron-Bridge ConfigContainer or NeMo 2 recipe YAML
    TORCHTITAN = "torchtitan"  # a torchtitan job config (TOML, or the JSON it dumps)
    DEEPSPEED = "deepspeed"  # a DeepSpeed config JSON
    AUTOMODEL = "automodel"  # a NeMo AutoModel recipe YAML


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting of a config: its key as the config writes it, its value, and what perfmodel
    made of it (read: the model or plan field it became; ignored: why it does not change the
    step; unknown: not a setting perfmodel knows)."""

    key: str
    value: Any
    note: str = ""

    def line(self) -> str:
        value = "" if self.value is True or self.value is None else f" {_shown(self.value)}"
        return f"{self.key}{value}" + (f": {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        """The setting for --json: a NaN or an infinity (`lr = nan`, ignored) as its text, which
        strict JSON cannot hold as a number."""
        plain = isinstance(self.value, (bool, int, str)) or self.value is None or (
            isinstance(self.value, float) and math.isfinite(self.value))
        return {"key": self.key, "value": self.value if plain else _shown(self.value),
                "note": self.note}


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


@dataclass(kw_only=True)
class JobConfig:
    """A config, read. model: TransformerSpec fields the config gives (`preset`: a perfmodel
    preset it names, e.g. a torchtitan flavor, whose fields the given ones override); plan: Plan
    fields it fixes (perfmodel.strategy names), `pins`: the names among them the config states
    (recommend pins these and searches the rest); gpus: its world size, or None; vocab_multiple:
    Megatron pads the vocabulary to a multiple of this times tp (0: no padding)."""

    path: str
    framework: Framework
    model: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None
    preset_source: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    pins: set[str] = field(default_factory=set)
    gpus: int | None = None
    gpus_from: str = ""
    # where the world size is only a default the environment may override (a launch script's
    # `${SLURM_NNODES:-1}`): why, naming it ("" where the config states it); --gpus then sets
    # the world size, a multiple of gpus_multiple (the factor the config does state)
    gpus_default: str = ""
    gpus_multiple: int = 1
    vocab_multiple: int = 0
    needs_model: str = ""  # why the config alone does not give the model (--model needed)
    needs_seq_len: str = ""  # why it gives no sequence length (--seq-len needed)
    read: list[Setting] = field(default_factory=list)
    ignored: list[Setting] = field(default_factory=list)
    unknown: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # what the config decides once the model is known (resolve_plan calls each with it): NeMo
    # AutoModel's pipeline split of a model given by --model
    with_model: list[Callable[[Any], None]] = field(default_factory=list)

    def took(self, key: str, value: Any, note: str) -> None:
        self.read.append(Setting(key=key, value=value, note=note))

    def skipped(self, key: str, value: Any, reason: str) -> None:
        self.ignored.append(Setting(key=key, value=value, note=reason))

    def strange(self, key: str, value: Any, note: str = "") -> None:
        self.unknown.append(Setting(key=key, value=value, note=note))

    def fix(self, field_name: str, value: Any, *, pin: bool = True) -> None:
        """Set a plan field; pinned (recommend keeps it) when the config states it."""
        self.plan[field_name] = value
        if pin:
            self.pins.add(field_name)

    def report(self) -> list[str]:
        """The lines `predict --from-config` prints (standard error): what was read, ignored,
        not known, and assumed."""
        lines = [f"read {self.framework.value} config {self.path}:"]
        lines += [f"  {s.line()}" for s in self.read]
        if self.ignored:
            lines.append("ignored (does not change the predicted step):")
            lines += [f"  {s.line()}" for s in self.ignored]
        if self.unknown:
            lines.append("not read (unknown to perfmodel's reader; check it does not change the "
                         "step):")
            lines += [f"  {s.line()}" for s in self.unknown]
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "framework": self.framework.value,
                "read": [s.to_dict() for s in self.read],
                "ignored": [s.to_dict() for s in self.ignored],
                "unknown": [s.to_dict() for s in self.unknown],
                "notes": list(self.notes), "pins": sorted(self.pins)}


def trainer_world(trainer: dict[str, Any], job: JobConfig, where: str) -> None:
    """The world size of a NeMo trainer section (NeMo 1 and 2): devices x num_nodes."""
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    job.gpus = whole(devices, "trainer.devices", where) * whole(nodes, "trainer.num_nodes", where)
    job.gpus_from = f"trainer.devices {devices} x trainer.num_nodes {nodes}"
    job.took("trainer.devices", devices, "GPUs per node")
    job.took("trainer.num_nodes", nodes, "nodes")


def fix_split(job: JobConfig, split: list[int], chunks: int,
              short: tuple[bool, bool] = (False, False)) -> None:
    """The plan fields of the layers split over pp x chunks stages (split: each stage's layers,
    in stage order): with one stage a rank and equal ranks between, first_stage_layers and
    last_stage_layers where an end differs from them (or `short`: the config shortened it);
    else a pipeline layout, the embedding on the first stage and the loss on the last."""
    pp = len(split) // chunks
    if chunks > 1 and len(set(split)) == 1:
        return  # every stage alike: the plan's own even split (virtual_stages chunks a rank)
    if chunks == 1 and len(set(split[1:-1])) <= 1:
        middle = split[1] if pp > 2 else None
        for end, forced, n in (("first", short[0], split[0]), ("last", short[1], split[-1])):
            if forced or n != middle:
                job.fix(f"{end}_stage_layers", n)
    else:
        text = ["t" * n for n in split]
        text[0], text[-1] = "E" + text[0], text[-1] + "L"
        job.fix("pipeline_layout", "|".join(text))


def typo(name: str, known: Any, real: Any = ()) -> str:
    """' (did you mean X?)' when name is a near-miss of a known key (difflib ratio >= 0.85: a
    letter or two apart), else ''. A config key perfmodel does not know is named and skipped; one
    this close to a key it reads is refused as a likely misspelling, unless it is among `real`,
    the framework's own keys (a real option is no misspelling however close it is to another:
    Megatron-LM's --tp-comm-overlap-cfg beside --tp-comm-overlap)."""
    import difflib

    if name in real:
        return ""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
    return f" (did you mean '{close[0]}'?)" if close and close[0] != name else ""


def whole(value: Any, key: str, where: str, *, minimum: int = 1,
          error: type[Exception] = SpecError) -> int:
    """A whole number of a config (a string of digits too), or error naming the key."""
    if isinstance(value, bool):
        raise error(f"{where}: {key} must be a whole number, got {value}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise error(f"{where}: {key} must be a whole number, got '{value}'") from None
    if number != number or number in (float("inf"), -float("inf")) or number != int(number):
        raise error(f"{where}: {key} must be a whole number, got '{value}'")
    if number < minimum or number > 1e10:
        raise error(f"{where}: {key} must be >= {minimum} and <= 1e10, got {number:.6g}")
    return int(number)


def whole_or(value: Any, default: int, key: str, where: str) -> int:
    """A degree or batch whose `default` (-1: the framework fills it in) stands as given, else
    a whole number >= 0 (whole's error naming the key)."""
    if value is None or (not isinstance(value, bool) and value == default):
        return default
    return whole(value, key, where, minimum=0)


def section(data: Any, key: str, where: str) -> dict[str, Any]:
    """A config's mapping under key (empty where absent), or SpecError naming the key."""
    value = data.get(key) if isinstance(data, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: {key} must be a mapping of settings, got '{value}'")
    return value


def deferred_wgrad_note(key: str) -> str:
    """The note on Megatron-Core's defer_embedding_wgrad_compute where a config sets it: what
    it does and what perfmodel does not count of it."""
    return (f"{key}: Megatron-Core defers the output layer's weight-gradient GEMMs to the "
            "pipeline's flush (up to wgrad_deferral_limit micro-batches, 0: all), keeping their "
            "inputs and logits gradients on the last stage until then: not modelled (costed in "
            "each backward; the memory they hold not counted)")


def refuse_plan(where: str, key: str, value: Any, why: str) -> PlanError:
    """The one-line refusal of a setting perfmodel cannot model (a plan capability)."""
    shown = "" if value is True else f" {_shown(value)}"
    return PlanError(f"{where}: {key}{shown}: {why}")


def refuse_spec(where: str, key: str, value: Any, why: str) -> SpecError:
    shown = "" if value is True else f" {_shown(value)}"
    return SpecError(f"{where}: {key}{shown}: {why}")


def yes_or_no(value: Any, key: str, where: str) -> bool:
    """A config's true or false (YAML's, TOML's booleans), or SpecError naming the key: no
    other value is taken for one (a string "false" is truthy to the framework's Python)."""
    if not isinstance(value, bool):
        raise not_a_flag(where, key, value)
    return value


def not_a_flag(where: str, key: str, value: Any) -> SpecError:
    """The one-line refusal of a yes-or-no setting given as something else (a string "false"
    shown quoted: not the boolean it looks like)."""
    got = f"the string {value!r}" if isinstance(value, str) else _shown(value)
    return SpecError(f"{where}: {key} must be true or false, got {got}")


def refuse_emit(framework: str, field: str, why: str) -> PlanError:
    """--emit-config's one line for a plan the framework cannot run (here, not in emit.py, so that
    the writers, which emit.py imports, need not import emit.py)."""
    what = field if field.startswith("the ") else f"the plan's {field}"
    return PlanError(f"--emit-config {framework}: {what} cannot be written: {why}")


# the environment a plan with expandable segments runs its ranks in (Plan.expandable_segments:
# PyTorch reads PYTORCH_CUDA_ALLOC_CONF at start-up); the validation job's launch sets it too
EXPANDABLE_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def allocator_export(plan: Any) -> str:
    """An emitted launch script's lines that run the plan's allocator (EXPANDABLE_ENV), or
    nothing."""
    return "".join(f"export {k}={v}\n" for k, v in EXPANDABLE_ENV.items()) \
        if plan.expandable_segments else ""


# Megatron-Core's expert capacity settings (NeMo's model keys, Megatron-LM's dests)
CAPACITY = ("moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
            "moe_token_drop_policy")


# the load balancing an expert capacity works with (Megatron-Core's TransformerConfig
# __post_init__ at NVIDIA/Megatron-LM d98e8a64, whatever the factor's sign)
CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def capacity_balancing(factor_key: str, factor: Any, key: str, balancing: Any,
                       where: str) -> None:
    """A capacity factor beside a load balancing type (or a list of them, one per loss) that
    Megatron-Core raises on, sinkhorn or quantile_balancing: refused, naming both settings."""
    if balancing in (None, "None", "null"):
        return  # Megatron-Core's default, aux_loss
    if isinstance(balancing, str):
        balancing = balancing.strip("[]").replace(",", " ").split()
    types = [str(t).strip().strip("'\"") for t in balancing] \
        if isinstance(balancing, list | tuple) else [str(balancing)]
    if set(types) - set(CAPACITY_BALANCING):
        raise refuse_plan(where, factor_key, factor,
                          "Megatron-Core raises 'moe_expert_capacity_factor only works with "
                          "aux_loss, seq_aux_loss, global_aux_loss or none load balancing' "
                          f"({key} {' '.join(types)})")


def capacity(fields: dict[str, Any], prefix: str, job: JobConfig, where: str) -> None:
    """Megatron-Core's expert capacity (NeMo 1's model, NeMo 2's and Megatron-Bridge's
    TransformerConfig): moe_expert_capacity_factor c with moe_pad_expert_input_to_capacity
    takes at most C = ceil(c T k / E) of a rank's T tokens' assignments for each expert and
    pads every expert's input to C (megatron/core/transformer/moe/moe_utils.py,
    topk_softmax_with_capacity and get_capacity), the model's capacity_factor (docs/moe.md);
    without a factor the experts are dropless. A factor without the padding drops the tokens
    over C and sends the rest unpadded: not modelled. A factor beside a load balancing type
    Megatron-Core raises on (capacity_balancing) is refused. Which tokens drop
    (moe_token_drop_policy) does not change the cost."""
    factor = fields.get("moe_expert_capacity_factor")
    pad = _true(fields.get("moe_pad_expert_input_to_capacity", False))
    key = f"{prefix}.moe_expert_capacity_factor"
    if factor in (None, "None", "null"):
        for name in CAPACITY:
            if name in fields:
                job.skipped(f"{prefix}.{name}", fields[name],
                            "unset: dropless experts" if name == CAPACITY[0]
                            else "no effect without a capacity factor")
        return
    capacity_balancing(key, factor, f"{prefix}.moe_router_load_balancing_type",
                       fields.get("moe_router_load_balancing_type"), where)
    if not pad:
        raise refuse_plan(where, key, factor, "dropping the tokens over an expert's capacity "
                          "without padding (moe_pad_expert_input_to_capacity false) is not "
                          "modelled: perfmodel's experts are dropless or padded to their "
                          "capacity")
    try:
        job.model["capacity_factor"] = float(factor)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {key} must be a number, got '{factor}'") from None
    job.took(key, factor, f"capacity_factor {float(factor):g}: each expert's input padded to "
                          "ceil(c T k / E) rows")
    job.took(f"{prefix}.moe_pad_expert_input_to_capacity", True, "padded to the capacity")
    if "moe_token_drop_policy" in fields:
        job.skipped(f"{prefix}.moe_token_drop_policy", fields["moe_token_drop_policy"],
                    "which tokens drop (the same cost)")


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1")


WINDOW = ("window_size", "window_attn_skip_freq", "softmax_type")


def window(fields: dict[str, Any], prefix: str, job: JobConfig, where: str) -> None:
    """Megatron-Core's sliding-window attention (TransformerConfig.window_size (left, right):
    each query attends over its left previous tokens and itself, Transformer Engine's window;
    window_attn_skip_freq k: layers k, 2k, ... counted from 1 attend fully, the others over the
    window, megatron/core/transformer/utils.py is_layer_window_attention; a list of 1 (window)
    and 0 (full) per layer) as the model's sliding_window (left + 1 tokens, as Megatron-Bridge
    converts it to Hugging Face's: models/conversion/utils.py mcore_to_hf_window_size) and
    full_attention_every (k; 0: every layer windowed); softmax_type learnable as attention
    sinks (a learned logit per head in each softmax's denominator: GPT-OSS's)."""
    size = fields.get("window_size")
    if isinstance(size, str) and size.strip() not in ("", "None", "null"):
        size = [part for part in size.strip("()[] ").replace(",", " ").split() if part]
    key = f"{prefix}.window_size"
    if size in (None, "", "None", "null"):
        for name in WINDOW[:2]:
            if name in fields:
                job.skipped(f"{prefix}.{name}", fields[name], "no window: full attention"
                            if name == "window_size" else "no effect without a window")
    else:
        try:
            left, right = (int(v) for v in size)
        except (TypeError, ValueError):
            raise SpecError(f"{where}: {key} must be [left, right], got '{size}'") from None
        if right != 0:
            raise refuse_spec(where, key, size, "perfmodel's attention is causal: a window "
                                                "of later tokens (right > 0) is not modelled")
        if left < 0:  # -1: Transformer Engine's infinite window
            job.skipped(key, size, "an infinite window: full attention")
        else:
            job.model["sliding_window"] = left + 1
            job.took(key, size, f"sliding_window {left + 1} (the left {left} tokens and "
                                "itself)")
            job.model["full_attention_every"] = _full_every(fields, prefix, job, where)
    softmax = str(fields.get("softmax_type", "vanilla"))
    if softmax == "learnable":
        job.model["attention_sinks"] = True
        job.took(f"{prefix}.softmax_type", softmax, "attention_sinks (a learned logit per head "
                                                    "in each softmax's denominator)")
    elif softmax != "vanilla":
        raise refuse_spec(where, f"{prefix}.softmax_type", softmax,
                          "perfmodel models the vanilla softmax and learnable sinks")
    elif "softmax_type" in fields:
        job.skipped(f"{prefix}.softmax_type", softmax, "the plain softmax")


def _full_every(fields: dict[str, Any], prefix: str, job: JobConfig, where: str) -> int:
    """window_attn_skip_freq as full_attention_every: k, or a per-layer list that is k - 1
    windowed layers and one full over and over; None: 0, every layer windowed."""
    key = f"{prefix}.window_attn_skip_freq"
    freq = fields.get("window_attn_skip_freq")
    if freq in (None, "None", "null"):
        return 0
    if isinstance(freq, list) and 0 in freq and all(v in (0, 1) for v in freq):
        k = freq.index(0) + 1
        if freq == ([1] * (k - 1) + [0]) * (len(freq) // k) + [1] * (len(freq) % k):
            freq = k
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise refuse_spec(where, key, freq, "perfmodel models one full-attention layer every k "
                                            "(an integer k, or that pattern as a list)")
    job.took(key, fields["window_attn_skip_freq"], f"full_attention_every {freq}")
    return freq
