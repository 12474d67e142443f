"""Model specs: what is trained. A transformer is described by its shape; CNNs come later as layer
graphs."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.specs.loading import check_fields, number, read_mapping, suggest

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")
# the fields that follow others unless given: what each derives from, and how
DERIVED = {"ffn_hidden": "4 x hidden", "kv_heads": "heads", "head_dim": "hidden / heads",
           "qkv_bias": "bias"}


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """A decoder-only transformer (GPT / Llama families).

    layers, hidden, heads, seq_len, vocab: as in Megatron-LM (l, h, a, s, V).
    ffn_hidden: width of the MLP (default 4 * hidden); kv_heads: key/value heads (grouped-query
    attention; default heads); head_dim: size of one attention head (default hidden / heads; the
    attention is heads x head_dim wide, which may differ from hidden as in Qwen3 or Mistral-NeMo);
    gated_mlp: SwiGLU (three MLP matrices instead of two).

    The derived fields (DERIVED) hold their resolved values; which of them were given explicitly is
    kept (`explicit`), so that a model built on this one (`replace`, a file's `base:`, overrides)
    derives the others again from its own final values: a base plus overrides equals the same
    model written out whole.
    """

    name: str = "transformer"
    kind: str = "transformer"
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    # None: derived in __post_init__ (DERIVED); an int once the spec exists
    ffn_hidden: int = None  # type: ignore[assignment]
    kv_heads: int = None  # type: ignore[assignment]
    head_dim: int = None  # type: ignore[assignment]
    gated_mlp: bool = False
    tied_embeddings: bool = True
    bias: bool = True
    qkv_bias: bool | None = None
    norm: str = "layernorm"
    position_embedding: str = "learned"
    source: str = ""
    # where the spec was read and where its seq_len came from (shown by predict and recommend;
    # not part of the model: the same model compares equal wherever it was read)
    origin: str = field(default="", compare=False, repr=False)
    seq_len_from: str = field(default="", compare=False, repr=False)
    explicit: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind != "transformer":
            raise SpecError(f"model kind must be 'transformer' or 'layers', got '{self.kind}'")
        limits = {"layers": 1e5, "hidden": 1e6, "heads": 1e5, "seq_len": 1e8, "vocab": 1e8}
        for key, limit in limits.items():
            number(getattr(self, key), key, integer=True, maximum=limit)
        given = {key for key in DERIVED if not _unset(getattr(self, key), key)}
        object.__setattr__(self, "explicit", frozenset(given))
        if "head_dim" not in given and self.hidden % self.heads:
            raise SpecError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) "
                            "(or give head_dim)")
        derived = {"ffn_hidden": 4 * self.hidden, "kv_heads": self.heads,
                   "head_dim": self.hidden // self.heads, "qkv_bias": self.bias}
        for key, value in derived.items():
            if key not in given:
                object.__setattr__(self, key, value)
        number(self.ffn_hidden, "ffn_hidden", integer=True, maximum=1e10)
        number(self.kv_heads, "kv_heads", integer=True, maximum=1e9)
        number(self.head_dim, "head_dim", integer=True, maximum=1e6)
        approx = 12 * self.layers * self.hidden * max(self.hidden, self.ffn_hidden // 4,
                                                      self.attention_width) \
            + 2 * self.vocab * self.hidden
        if approx > 1e16:
            raise SpecError(f"the model would have about {approx:.1e} parameters; more than 1e16 "
                            "is refused as absurd (check layers, hidden, ffn_hidden, head_dim, "
                            "vocab)")
        if self.heads % self.kv_heads:
            raise SpecError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        for key in ("gated_mlp", "tied_embeddings", "bias", "qkv_bias"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.norm not in NORMS:
            raise SpecError(f"norm must be one of {', '.join(NORMS)}, got '{self.norm}'")
        if self.position_embedding not in POSITIONS:
            raise SpecError(
                f"position_embedding must be one of {', '.join(POSITIONS)}, "
                f"got '{self.position_embedding}'"
            )

    @property
    def attention_width(self) -> int:
        """Width of the queries and of the attention output: heads x head_dim (hidden, unless
        head_dim is given otherwise)."""
        return self.heads * self.head_dim

    def given(self) -> dict[str, Any]:
        """The spec's fields as they were given: a derived field (DERIVED) that was not given
        explicitly is left out, so that a model built from these follows its own values."""
        return {k: v for k, v in self.to_dict().items()
                if k not in DERIVED or k in self.explicit}

    def replace(self, **changes: Any) -> TransformerSpec:
        """This model with some fields changed; the derived fields not given explicitly (here or in
        `changes`) are derived again from the final values (a field set to None is derived)."""
        changes = dict(changes)
        origin = changes.pop("origin", self.origin)
        seq_len_from = changes.pop("seq_len_from",
                                   "" if "seq_len" in changes else self.seq_len_from)
        spec = TransformerSpec(**{**self.given(), **changes})
        return spec.noted(origin=origin, seq_len_from=seq_len_from)

    def scaled(self, **changes: Any) -> TransformerSpec:
        """A model of the same shape at other sizes (a scaled-down copy to run on a small
        machine): where this model gives ffn_hidden, kv_heads or head_dim explicitly and
        `changes` does not, they keep their proportions to the changed fields: ffn_hidden /
        hidden, heads / kv_heads (the grouping) and heads x head_dim / hidden (the attention
        width), rounded to whole numbers (kv_heads to a divisor of heads). Derived fields follow
        the new values anyway."""
        hidden = changes.get("hidden", self.hidden)
        heads = changes.get("heads", self.heads)
        scaled: dict[str, Any] = {}
        if "ffn_hidden" in self.explicit and hidden != self.hidden:
            scaled["ffn_hidden"] = max(1, round(self.ffn_hidden * hidden / self.hidden))
        if "kv_heads" in self.explicit and heads != self.heads:
            group = self.heads // self.kv_heads
            want = max(1, heads // group)
            scaled["kv_heads"] = max(k for k in range(1, want + 1) if heads % k == 0)
        if "head_dim" in self.explicit and (hidden, heads) != (self.hidden, self.heads):
            width_ratio = self.attention_width / self.hidden
            scaled["head_dim"] = max(1, round(width_ratio * hidden / heads))
        return self.replace(**{**scaled, **changes})

    def noted(self, *, origin: str | None = None,
              seq_len_from: str | None = None) -> TransformerSpec:
        """The same model with where it was read, and where its seq_len came from, noted."""
        out = copy.copy(self)
        if origin is not None:
            object.__setattr__(out, "origin", origin)
        if seq_len_from is not None:
            object.__setattr__(out, "seq_len_from", seq_len_from)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The model's fields, resolved (derived fields hold their values)."""
        return {k: getattr(self, k) for k in MODEL_FIELDS}


def _unset(value: Any, key: str = "") -> bool:
    """A derived field left to derive: None, or for a size 0 (as older spec files write it)."""
    return value is None or (key != "qkv_bias" and type(value) is int and value == 0)


MODEL_FIELDS = [f.name for f in dataclasses.fields(TransformerSpec) if f.init and f.compare]
_INT_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "kv_heads",
               "head_dim")


def model_from_dict(data: Mapping[str, Any], where: str) -> TransformerSpec:
    check_fields(data, [*MODEL_FIELDS, "base"], where)
    fields = {k: v for k, v in data.items() if k != "base"}
    for key in ("layers", "hidden", "heads", "seq_len", "vocab"):
        if key not in fields:
            raise SpecError(f"{where}: missing required field '{key}'")
    try:
        for key in _INT_FIELDS:
            if key in fields and not _unset(fields[key]):
                fields[key] = number(fields[key], key, integer=True, maximum=1e10)
        return TransformerSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


# --- Hugging Face config.json ---------------------------------------------------------------
# Each family maps its own names onto ours; read from a local file only (never the network).
# A config describes the architecture, not a training run: it has no training sequence length
# (max_position_embeddings is how far the positions reach, 131072 for Llama 3.1), so seq_len
# must be given (--seq-len). What the families' modelling code (transformers) builds from the
# fields read below is what perfmodel models; a field that would change the math and that
# perfmodel cannot model is refused with its reason, never answered for the nearest family.
_HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
             "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size")
_MOE = "a mixture-of-experts model"
_SLIDING = "a model with sliding-window attention layers"
_UNMODELLED_TYPES = {
    **dict.fromkeys(("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx",
                     "olmoe", "jamba", "granitemoe", "jetmoe", "phimoe", "arctic", "grok-1",
                     "minimax", "llama4"), _MOE),
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text", "cohere2"),
                    "a model that alternates sliding-window and global attention layers"),
    **dict.fromkeys(("mamba", "mamba2", "rwkv", "falcon_mamba", "recurrent_gemma"),
                    "a state-space or recurrent model, not a transformer"),
    **dict.fromkeys(("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper",
                     "encoder-decoder"), "an encoder-decoder model"),
}


def _hf_refusal(cfg: Mapping[str, Any], mtype: str) -> str | None:
    """Why a config describes a model perfmodel cannot model, or None."""
    experts = [k for k in _MOE_KEYS if cfg.get(k) not in (None, 0, False)]
    what = f" ({experts[0]}: {cfg[experts[0]]})" if experts else ""
    if mtype in _UNMODELLED_TYPES:
        return f"model_type '{mtype}' is {_UNMODELLED_TYPES[mtype]}{what}"
    if experts or "moe" in mtype:
        return f"model_type '{mtype}' is {_MOE}{what}"
    if cfg.get("is_encoder_decoder") is True:
        return f"model_type '{mtype}' is an encoder-decoder model"
    return None


def model_from_hf_config(cfg: Mapping[str, Any], where: str,
                         seq_len: int | None = None) -> TransformerSpec:
    """A TransformerSpec from a Hugging Face config.json and the training sequence length."""
    mtype = str(cfg.get("model_type", ""))
    refusal = _hf_refusal(cfg, mtype)
    if refusal:
        raise SpecError(f"{where}: Hugging Face {refusal}, which perfmodel does not model "
                        f"(it models dense decoder-only transformers: {', '.join(_HF_FAMILIES)})")
    if mtype not in _HF_FAMILIES:
        raise SpecError(
            f"{where}: Hugging Face model_type '{mtype}' is not supported"
            f"{suggest(mtype, _HF_FAMILIES)}; supported: {', '.join(_HF_FAMILIES)}"
        )

    def need(key: str) -> int:
        if cfg.get(key) is None:
            raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}'")
        return count(key)

    def count(key: str, default: int | None = None) -> int:
        """A whole number of the config (a float like 32.7, true or Infinity is refused)."""
        value = cfg.get(key)
        if value is None and default is not None:
            return default
        return int(number(value, f"{where}: {key}", integer=True, maximum=1e10))

    def flag(key: str, default: bool) -> bool:
        value = cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise SpecError(f"{where}: {key} must be true or false, got {value!r}")
        return value

    positions_key = {"gpt2": "n_positions"}.get(mtype, "max_position_embeddings")
    positions = cfg.get(positions_key, cfg.get("n_ctx") if mtype == "gpt2" else None)
    fields = _hf_fields(cfg, mtype, where, need, count, flag)
    if seq_len is None:
        reach = f" (its {positions_key} is {positions})" if positions is not None else ""
        raise SpecError(f"{where} (Hugging Face config) has no training sequence length: give "
                        f"--seq-len{reach}")
    seq_len = int(number(seq_len, "seq_len", integer=True, maximum=1e8))
    _check_window(cfg, mtype, where, seq_len)
    if mtype == "gpt2" and positions is not None and seq_len > int(number(
            positions, f"{where}: {positions_key}", integer=True, maximum=1e10)):
        raise SpecError(f"{where}: seq_len ({seq_len}) is longer than the learned position "
                        f"table ({positions_key} {positions})")
    name = str(cfg.get("_name_or_path") or mtype)
    return TransformerSpec(name=name, seq_len=seq_len, source=f"Hugging Face config ({mtype})",
                           **fields)


def _hf_fields(cfg: Mapping[str, Any], mtype: str, where: str, need: Any, count: Any,
               flag: Any) -> dict[str, Any]:
    """The TransformerSpec fields (all but name, seq_len and source) of a supported family."""
    if mtype in ("llama", "mistral", "qwen2", "qwen3"):
        heads = need("num_attention_heads")
        # biases: qwen2 has them on q, k and v only (its modelling code); llama and qwen3 on
        # q, k, v and o with attention_bias and on the MLP with mlp_bias; mistral none
        if mtype == "qwen2":
            bias, qkv_bias = False, True
        else:
            bias, qkv_bias = _hf_biases(flag("attention_bias", False), flag("mlp_bias", False),
                                        where)
        return dict(
            layers=need("num_hidden_layers"), hidden=need("hidden_size"),
            heads=heads, kv_heads=count("num_key_value_heads", heads),
            head_dim=count("head_dim") if cfg.get("head_dim") is not None else None,
            ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", False), bias=bias, qkv_bias=qkv_bias,
            norm="rmsnorm", position_embedding="rotary",
        )
    if mtype == "gpt2":
        if flag("add_cross_attention", False):
            raise SpecError(f"{where}: add_cross_attention is true: a decoder with cross-attention "
                            "is not modelled")
        hidden = need("n_embd")
        return dict(
            layers=need("n_layer"), hidden=hidden, heads=need("n_head"),
            ffn_hidden=count("n_inner", 4 * hidden), vocab=need("vocab_size"),
            tied_embeddings=flag("tie_word_embeddings", True),
        )
    # gpt_neox: biases on the MLP always, on query_key_value and dense with attention_bias
    bias, qkv_bias = _hf_biases(flag("attention_bias", True), True, where)
    return dict(
        layers=need("num_hidden_layers"), hidden=need("hidden_size"),
        heads=need("num_attention_heads"), ffn_hidden=need("intermediate_size"),
        vocab=need("vocab_size"), tied_embeddings=flag("tie_word_embeddings", False),
        bias=bias, qkv_bias=qkv_bias, position_embedding="rotary",
    )


def _hf_biases(attention: bool, mlp: bool, where: str) -> tuple[bool, bool]:
    """(bias, qkv_bias) of a config's attention_bias (q, k, v and output projections) and
    mlp_bias; perfmodel's `bias` covers the attention output and the MLP together."""
    if attention != mlp:
        raise SpecError(f"{where}: attention_bias {str(attention).lower()} with mlp_bias "
                        f"{str(mlp).lower()} is not modelled (perfmodel's bias covers the "
                        "attention output and the MLP together)")
    return mlp, attention


def _check_window(cfg: Mapping[str, Any], mtype: str, where: str, seq_len: int) -> None:
    """Refuse sliding-window attention that reaches less than the sequence (a window as long as
    the sequence is full causal attention)."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types") or []
    if mtype in ("qwen2", "qwen3") and cfg.get("use_sliding_window") is not True:
        window = None  # their configs carry a window that only use_sliding_window turns on
    sliding = isinstance(types, list) and any(t != "full_attention" for t in types)
    if window is not None:
        width = int(number(window, f"{where}: sliding_window", integer=True, maximum=1e10))
        if width < seq_len:
            raise SpecError(f"{where}: Hugging Face model_type '{mtype}' is {_SLIDING} "
                            f"(sliding_window {width} < seq_len {seq_len}), which perfmodel does "
                            "not model; a seq_len up to the window is full attention")
    elif sliding:
        raise SpecError(f"{where}: Hugging Face model_type '{mtype}' is {_SLIDING} (layer_types), "
                        "which perfmodel does not model")


def load_model(name_or_path: str | Path | TransformerSpec, **overrides: Any) -> Any:
    """A model spec from a preset, a YAML/JSON spec file, or a Hugging Face config.json.

    Transformers give a TransformerSpec; layer graphs (the CNN presets alexnet, vgg16, resnet50,
    mlp, or a file with `kind: layers`) a perfmodel.specs.layers.LayerGraphSpec. `overrides`
    replace fields (None: keep); the fields derived from others follow the final values unless
    the spec or the overrides give them. A Hugging Face config needs seq_len among them.
    """
    from perfmodel.specs.cnn import BUILDERS
    from perfmodel.specs.layers import LayerGraphSpec, layer_graph_from_dict
    from perfmodel.specs.presets import MODELS_DIR, resolve

    overrides = {k: v for k, v in overrides.items() if v is not None}

    def graph(spec: LayerGraphSpec) -> LayerGraphSpec:
        if overrides:  # a transformer's fields (seq_len, hidden ...) mean nothing to a layer graph
            raise SpecError(f"model '{spec.name}' is a layer graph (CNN/MLP): "
                            f"{', '.join(sorted(overrides))} does not apply to it")
        return spec

    if isinstance(name_or_path, LayerGraphSpec):
        return graph(name_or_path)
    if isinstance(name_or_path, str) and name_or_path in BUILDERS:
        return graph(BUILDERS[name_or_path]())
    if isinstance(name_or_path, TransformerSpec):
        spec = name_or_path
    else:
        path = resolve(name_or_path, MODELS_DIR, "model")
        if path.is_dir() and path.suffix.lower() not in (".yaml", ".yml", ".json", ".toml"):
            if not (path / "config.json").is_file():
                raise SpecError(f"model directory {path} holds no config.json (a Hugging Face "
                                "model directory does; or give a spec file)")
            path = path / "config.json"
        data = read_mapping(path, "model")
        where = f"model '{name_or_path}'"
        preset = path.parent == MODELS_DIR
        origin = f"preset {path.stem}" if preset else str(path)
        if data.get("kind") == "layers":
            return graph(layer_graph_from_dict(data, where))
        if "model_type" in data and "kind" not in data:
            try:
                spec = model_from_hf_config(data, where, overrides.pop("seq_len", None))
            except (TypeError, ValueError) as exc:
                if isinstance(exc, SpecError):
                    raise
                raise SpecError(f"{where}: bad value in Hugging Face config: {exc}") from None
            spec = spec.noted(origin=f"{path} (Hugging Face config)",
                              seq_len_from="the seq_len argument")
        else:
            seq_len_from = origin if preset else f"spec file {path}"
            if "base" in data:
                base_name = data.pop("base")
                if not isinstance(base_name, str):
                    raise SpecError(f"{where}: base must be a preset name or a path, got "
                                    f"{type(base_name).__name__}")
                base = load_model(base_name, seq_len=data.get("seq_len"))
                if not isinstance(base, TransformerSpec):
                    raise SpecError(f"{where}: base '{base_name}' is a layer graph, not a "
                                    "transformer")
                origin = f"{origin} (base: {base.origin})"
                if "seq_len" not in data:
                    seq_len_from = base.seq_len_from
                data = {**base.given(), **data}
            data.setdefault("name", Path(path).stem if preset else str(name_or_path))
            spec = model_from_dict(data, where).noted(origin=origin, seq_len_from=seq_len_from)
    if overrides:
        changed = model_from_dict({**spec.given(), **overrides}, f"model '{spec.name}'")
        spec = changed.noted(origin=spec.origin,
                             seq_len_from="the seq_len argument" if "seq_len" in overrides
                             else spec.seq_len_from)
    return spec


def dumps(spec: TransformerSpec) -> str:
    return json.dumps(spec.to_dict(), indent=2)
