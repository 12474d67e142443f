"""Model specs: what is trained. A transformer is described by its shape; CNNs come later as layer graphs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.specs.loading import check_fields, number, read_mapping, suggest

NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """A decoder-only transformer (GPT / Llama families).

    layers, hidden, heads, seq_len, vocab: as in Megatron-LM (l, h, a, s, V).
    ffn_hidden: width of the MLP (default 4 * hidden); kv_heads: key/value heads (grouped-query
    attention; default heads); gated_mlp: SwiGLU (three MLP matrices instead of two).
    """

    name: str = "transformer"
    kind: str = "transformer"
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int = 0
    kv_heads: int = 0
    gated_mlp: bool = False
    tied_embeddings: bool = True
    bias: bool = True
    qkv_bias: bool | None = None
    norm: str = "layernorm"
    position_embedding: str = "learned"
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind != "transformer":
            raise SpecError(f"model kind must be 'transformer' or 'layers', got '{self.kind}'")
        limits = {"layers": 1e5, "hidden": 1e6, "heads": 1e5, "seq_len": 1e8, "vocab": 1e8}
        for key, limit in limits.items():
            number(getattr(self, key), key, integer=True, maximum=limit)
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", self.bias)
        number(self.ffn_hidden, "ffn_hidden", integer=True, maximum=1e10)
        number(self.kv_heads, "kv_heads", integer=True, maximum=1e9)
        approx = 12 * self.layers * self.hidden * max(self.hidden, self.ffn_hidden // 4) + \
            2 * self.vocab * self.hidden
        if approx > 1e16:
            raise SpecError(f"the model would have about {approx:.1e} parameters; more than 1e16 is "
                            f"refused as absurd (check layers, hidden, ffn_hidden, vocab)")
        if self.hidden % self.heads:
            raise SpecError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise SpecError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        for key in ("gated_mlp", "tied_embeddings", "bias", "qkv_bias"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.norm not in NORMS:
            raise SpecError(f"norm must be one of {', '.join(NORMS)}, got '{self.norm}'")
        if self.position_embedding not in POSITIONS:
            raise SpecError(
                f"position_embedding must be one of {', '.join(POSITIONS)}, got '{self.position_embedding}'"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def replace(self, **changes: Any) -> TransformerSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


MODEL_FIELDS = [f.name for f in dataclasses.fields(TransformerSpec)]
_INT_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "kv_heads")


def model_from_dict(data: Mapping[str, Any], where: str) -> TransformerSpec:
    check_fields(data, [*MODEL_FIELDS, "base"], where)
    fields = {k: v for k, v in data.items() if k != "base"}
    for key in ("layers", "hidden", "heads", "seq_len", "vocab"):
        if key not in fields:
            raise SpecError(f"{where}: missing required field '{key}'")
    try:
        for key in _INT_FIELDS:
            if key in fields:
                fields[key] = number(fields[key], key, integer=True, maximum=1e10)
        return TransformerSpec(**fields)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None


# --- Hugging Face config.json ---------------------------------------------------------------
# Each family maps its own names onto ours; read from a local file only (never the network).
_HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "mixtral_dense")


def model_from_hf_config(cfg: Mapping[str, Any], where: str) -> TransformerSpec:
    mtype = str(cfg.get("model_type", ""))

    def need(key: str) -> int:
        if key not in cfg:
            raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}'")
        return count(key)

    def count(key: str, default: int | None = None) -> int:
        """A whole number of the config (a float like 32.7, true or Infinity is refused)."""
        value = cfg.get(key)
        if value is None and default is not None:
            return default
        return int(number(value, f"{where}: {key}", integer=True, maximum=1e10))

    def flag(key: str, default: bool) -> bool:
        value = cfg.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(f"{where}: {key} must be true or false, got {value!r}")
        return value

    name = str(cfg.get("_name_or_path") or mtype)
    if mtype in ("llama", "mistral", "qwen2", "qwen3"):
        heads = need("num_attention_heads")
        return TransformerSpec(
            name=name, layers=need("num_hidden_layers"), hidden=need("hidden_size"),
            heads=heads, kv_heads=count("num_key_value_heads", heads),
            ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"),
            seq_len=need("max_position_embeddings"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", False), bias=False,
            qkv_bias=mtype == "qwen2" or flag("attention_bias", False),
            norm="rmsnorm", position_embedding="rotary", source=f"Hugging Face config ({mtype})",
        )
    if mtype == "gpt2":
        hidden = need("n_embd")
        return TransformerSpec(
            name=name, layers=need("n_layer"), hidden=hidden, heads=need("n_head"),
            ffn_hidden=count("n_inner", 4 * hidden), vocab=need("vocab_size"),
            seq_len=count("n_positions") if cfg.get("n_positions") is not None else need("n_ctx"),
            tied_embeddings=True,
            source="Hugging Face config (gpt2)",
        )
    if mtype == "gpt_neox":
        return TransformerSpec(
            name=name, layers=need("num_hidden_layers"), hidden=need("hidden_size"),
            heads=need("num_attention_heads"), ffn_hidden=need("intermediate_size"),
            vocab=need("vocab_size"), seq_len=need("max_position_embeddings"),
            tied_embeddings=flag("tie_word_embeddings", False),
            position_embedding="rotary", source="Hugging Face config (gpt_neox)",
        )
    raise SpecError(
        f"{where}: Hugging Face model_type '{mtype}' is not supported{suggest(mtype, _HF_FAMILIES)}; "
        f"supported: llama, mistral, qwen2, qwen3, gpt2, gpt_neox"
    )


def load_model(name_or_path: str | Path | TransformerSpec, **overrides: Any) -> Any:
    """A model spec from a preset, a YAML/JSON spec file, or a Hugging Face config.json.

    Transformers give a TransformerSpec; layer graphs (the CNN presets alexnet, vgg16, resnet50,
    mlp, or a file with `kind: layers`) a perfmodel.specs.layers.LayerGraphSpec.
    """
    from perfmodel.specs.cnn import BUILDERS
    from perfmodel.specs.layers import LayerGraphSpec, layer_graph_from_dict
    from perfmodel.specs.presets import MODELS_DIR, resolve

    if isinstance(name_or_path, LayerGraphSpec):
        return name_or_path
    if isinstance(name_or_path, str) and name_or_path in BUILDERS:
        return BUILDERS[name_or_path]()
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
        if data.get("kind") == "layers":
            return layer_graph_from_dict(data, where)
        if "model_type" in data and "kind" not in data:
            try:
                spec = model_from_hf_config(data, where)
            except (TypeError, ValueError) as exc:
                if isinstance(exc, SpecError):
                    raise
                raise SpecError(f"{where}: bad value in Hugging Face config: {exc}") from None
        else:
            if "base" in data:
                base_name = data.pop("base")
                if not isinstance(base_name, str):
                    raise SpecError(f"{where}: base must be a preset name or a path, got "
                                    f"{type(base_name).__name__}")
                base = load_model(base_name)
                data = {**base.to_dict(), **data}
            data.setdefault("name", Path(path).stem if path.parent == MODELS_DIR else str(name_or_path))
            spec = model_from_dict(data, where)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides:
        spec = model_from_dict({**spec.to_dict(), **overrides}, f"model '{spec.name}'")
    return spec


def dumps(spec: TransformerSpec) -> str:
    return json.dumps(spec.to_dict(), indent=2)
