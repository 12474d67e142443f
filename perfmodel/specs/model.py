"""Model specs: what is trained. A transformer is described by its shape; CNNs come later as layer
graphs."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.specs.loading import (
    boolean,
    check_fields,
    keyword_fields,
    label,
    number,
    plain,
    read_mapping,
    suggest,
)

NORMS = ("layernorm", "rmsnorm")
# How a model's card counts its active parameters (perfmodel.params.ParameterCounts.reported):
# every parameter a token's forward pass uses; less the input embedding table (a lookup, no
# arithmetic: OpenAI's gpt-oss card, DeepSeek's V2 and V3 READMEs); less the embedding table and
# an untied output layer (Zhipu AI's GLM-4.5, Moonshot AI's Moonlight paper)
ACTIVE_COUNTS = ("all", "no_embedding", "no_embeddings")
# learned: a position table (s x h parameters) added to the embedding; rotary: RoPE on q and k;
# alibi: a per-head linear bias added to the attention scores (Press et al. 2022; BLOOM): no
# parameters, no kernel of its own (Megatron-DeepSpeed adds it as baddbmm's input, FlashAttention-2
# takes its slopes)
POSITIONS = ("learned", "rotary", "alibi")
# the fields that follow others unless given: what each derives from, and how
DERIVED = {"ffn_hidden": "4 x hidden", "kv_heads": "heads", "head_dim": "hidden / heads",
           "qkv_bias": "bias", "expert_ffn_hidden": "ffn_hidden (with experts)",
           "shared_expert_ffn_hidden": "expert_ffn_hidden (with shared experts)"}
# the fields of a mixture of experts and of multi-head latent attention (MLA), which mean nothing
# without experts, or without kv_lora_rank
MOE_FIELDS = ("top_k", "expert_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden",
              "moe_first_dense", "moe_dense_layers", "capacity_factor", "routing_imbalance",
              "expert_groups", "group_topk", "routing")
# how a router spreads a token's experts (perfmodel.costs.moe.spread): learned (a trained
# router: the k experts spread as k drawn at random), round_robin (token t's experts t k ..
# t k + k - 1 mod experts: NeMo AutoModel's fake balanced gate)
ROUTINGS = ("learned", "round_robin")
MLA_FIELDS = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """A decoder-only transformer (GPT / Llama families, and their mixture-of-experts, MLA and
    sliding-window kin).

    layers, hidden, heads, seq_len, vocab: as in Megatron-LM (l, h, a, s, V).
    ffn_hidden: width of the MLP (default 4 * hidden); kv_heads: key/value heads (grouped-query
    attention; default heads); head_dim: size of one attention head (default hidden / heads; the
    attention is heads x head_dim wide, which may differ from hidden as in Qwen3 or Mistral-NeMo);
    gated_mlp: SwiGLU (three MLP matrices instead of two).
    fused_qkv: the model's own code projects queries, keys and values in one linear layer
    (GPT-2's c_attn, GPT-NeoX's and BLOOM's query_key_value, MPT's Wqkv); false: three (Llama's
    q_proj, k_proj, v_proj, torchtitan's wq, wk, wv). Only a layer run op by op (plan kernels
    eager) differs: three projections each return a gradient of the attention's input, which
    autograd adds up (perfmodel.costs.compute.eager_elementwise_bytes, input sums), and with
    qkv_bias each reduces its own bias gradient; one projection's split concatenates the three
    gradients of its output instead (qkv split) and reduces one bias gradient. Megatron-Core
    and Transformer Engine fuse them whatever the model (kernels fused).

    Mixture of experts (Shazeer et al. 2017; GShard; Mixtral, DeepSeekMoE): `experts` routed
    experts per MoE layer (0: a dense model), each token sent to `top_k` of them; each expert an
    MLP `expert_ffn_hidden` wide (default ffn_hidden, as Mixtral), gated and with biases as the
    dense MLP; `shared_experts` experts every token passes through (DeepSeekMoE, Qwen2-MoE), each
    `shared_expert_ffn_hidden` wide (default expert_ffn_hidden); a router (hidden x experts, with
    a bias when `bias`). Layers 0 .. moe_first_dense-1 and those listed in moe_dense_layers keep
    the dense MLP (ffn_hidden wide); every other layer is MoE. capacity_factor: the tokens an
    expert takes at most, as a multiple of its even share (GShard; None: dropless, as Mixtral,
    DeepSeek-V3 and Megatron-Core's default); routing_imbalance: the busiest expert's tokens over
    the mean (>= 1; 1: an even routing). Node-limited routing (DeepSeek-V3, Sec. 2.1.2): the
    experts in `expert_groups` groups of consecutive experts, a token's top_k taken from its best
    `group_topk` groups (Hugging Face n_group / topk_group; Megatron-Core
    --moe-router-num-groups / --moe-router-group-topk; 0: no limit). routing: learned (a trained
    router, its k experts as spread as k drawn at random) or round_robin (token t's experts
    t k .. t k + k - 1: NeMo AutoModel's fake balanced gate): where a token's copies go, which
    DeepEP's dispatch sends once per node (perfmodel.step.moe).

    Multi-head latent attention (DeepSeek-V2, Sec. 2.1; V3): given by kv_lora_rank. Queries are
    compressed to q_lora_rank (None: not compressed, as DeepSeek-V2-Lite), keys and values to
    kv_lora_rank plus a shared rotary key of qk_rope_head_dim; each head has qk_nope_head_dim +
    qk_rope_head_dim for queries and keys and v_head_dim for values.

    sliding_window: tokens a windowed layer attends back over (None: every layer attends over the
    whole sequence; a window as long as the sequence is full attention); full_attention_every k:
    layers k-1, 2k-1, ... (every k-th, counted from 1) attend fully and the others over the
    window (GPT-OSS and Gemma-2: 2; Gemma-3: 6), 0: every layer is windowed (Mistral 7B).
    attention_sinks: a learned logit per head in each softmax's denominator (GPT-OSS).
    clamped_glu: the gated MLP clamps its two halves before the activation (GPT-OSS: the gate
    at most, the linear half within, swiglu_limit 7) in passes of their own, as Megatron-Core's
    experts clamp and concatenate them eagerly before their fused kernel (perfmodel.step.moe;
    work only). A run whose stack clamps inside its activation kernel sets it false, as NeMo
    AutoModel's reader does (like mtp_layers, the run's).
    rotary_fraction: the share of each head's dimensions RoPE rotates (position_embedding
    rotary; 1: all of them; GPT-NeoX's rotary_pct, 0.25 in Pythia; GLM-4.5's
    partial_rotary_factor, 0.5): the first rotary_fraction x head_dim dimensions of each query and
    key head are rotated, the rest pass through (perfmodel.costs.compute.eager_rope_bytes says
    what that costs each kernel path).
    hidden_dropout, attention_dropout: the training's dropout rates (default 0.1 each,
    Megatron-Core's TransformerConfig and the GPT-3 runs of Korthikanti et al. 2022). Only
    whether a rate is 0 matters to the model: with 0, PyTorch's dropout returns its input (ATen
    Dropout.cpp, `p == 0`), so no mask is kept or written: the embedding's and the two
    bias-dropout-adds' masks (hidden), an unfused attention core's mask and dropped
    probabilities (attention) leave the activations and the element-wise traffic. Llama, Qwen,
    Mistral, DeepSeek and GPT-OSS train without dropout (their presets and Hugging Face configs
    say 0).
    mtp_layers: DeepSeek-V3's multi-token-prediction modules, trained beside the model (each a
    layer like the last, a 2 hidden x hidden projection and two norms, sharing the embedding and
    the output layer); perfmodel.params counts them apart from the model's parameters.
    active_count: which parameters a mixture of experts' reported active count holds, as its
    model card counts them (ACTIVE_COUNTS; perfmodel.params): all (Mistral AI, Qwen, AllenAI),
    no_embedding (OpenAI, DeepSeek), no_embeddings (Zhipu AI). A report only: the step model's
    work and memory are the same whichever it is.

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
    fused_qkv: bool = False
    tied_embeddings: bool = True
    bias: bool = True
    qkv_bias: bool | None = None
    norm: str = "layernorm"
    position_embedding: str = "learned"
    rotary_fraction: float = 1.0
    experts: int = 0
    top_k: int | None = None
    expert_ffn_hidden: int | None = None
    shared_experts: int = 0
    shared_expert_ffn_hidden: int | None = None
    moe_first_dense: int = 0
    moe_dense_layers: tuple[int, ...] = ()
    capacity_factor: float | None = None
    routing_imbalance: float = 1.0
    expert_groups: int = 0
    group_topk: int = 0
    routing: str = "learned"
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    sliding_window: int | None = None
    full_attention_every: int = 0
    attention_sinks: bool = False
    clamped_glu: bool = False
    mtp_layers: int = 0
    active_count: str = "all"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    source: str = ""
    # where the spec was read and where its seq_len came from (shown by predict and recommend;
    # not part of the model: the same model compares equal wherever it was read)
    origin: str = field(default="", compare=False, repr=False)
    seq_len_from: str = field(default="", compare=False, repr=False)
    explicit: frozenset[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # numpy's scalars as Python's (np.int64, np.bool_)
            if f.init:
                object.__setattr__(self, f.name, plain(getattr(self, f.name)))
        if isinstance(self.moe_dense_layers, (list, np.ndarray)):  # as YAML gives it: hashable
            object.__setattr__(self, "moe_dense_layers",
                               tuple(plain(i) for i in self.moe_dense_layers))
        label(self.name, "name")
        label(self.source, "source", empty=True)
        options = {"kind": ("transformer",), "norm": NORMS, "position_embedding": POSITIONS,
                   "routing": ROUTINGS, "active_count": ACTIVE_COUNTS}
        for key, names in options.items():  # an option is one of its names (never a list)
            if not isinstance(getattr(self, key), str):
                raise SpecError(f"{key} must be one of {', '.join(names)}, got "
                                f"{getattr(self, key)!r}")
        if self.kind == "layers":
            raise SpecError("kind 'layers' is a layer graph's (a CNN or MLP: "
                            "perfmodel.specs.layers.LayerGraphSpec, which load_model reads from "
                            "a spec file with kind: layers); a TransformerSpec's kind is "
                            "'transformer' (leave it out)")
        if self.kind != "transformer":
            raise SpecError(f"model kind must be 'transformer' or 'layers', got {self.kind!r}")
        for key in ("gated_mlp", "fused_qkv", "tied_embeddings", "bias", "attention_sinks",
                    "clamped_glu"):
            object.__setattr__(self, key, boolean(getattr(self, key), key))
        if self.qkv_bias is not None:
            object.__setattr__(self, "qkv_bias", boolean(self.qkv_bias, "qkv_bias"))
        limits = {"layers": 1e5, "hidden": 1e6, "heads": 1e5, "seq_len": 1e8, "vocab": 1e8}
        for key, limit in limits.items():  # a digit string ("2", from an API call) as its number
            object.__setattr__(self, key, number(getattr(self, key), key, integer=True,
                                                 maximum=limit))
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
        for key, limit in (("ffn_hidden", 1e10), ("kv_heads", 1e9), ("head_dim", 1e6)):
            object.__setattr__(self, key, number(getattr(self, key), key, integer=True,
                                                 maximum=limit))
        self._check_experts(given)
        self._check_mla(given)
        self._check_window()
        approx = 12 * self.layers * self.hidden * max(self.hidden, self.ffn_hidden // 4,
                                                      self.attention_width) \
            + 2 * self.vocab * self.hidden \
            + 3 * self.layers * self.hidden * self.experts * (self.expert_ffn_hidden or 0)
        if approx > 1e16:
            raise SpecError(f"the model would have about {approx:.1e} parameters; more than 1e16 "
                            "is refused as absurd (check layers, hidden, ffn_hidden, head_dim, "
                            "experts, expert_ffn_hidden, vocab)")
        if self.heads % self.kv_heads:
            raise SpecError(f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.clamped_glu and not self.gated_mlp:
            raise SpecError("clamped_glu clamps a gated MLP's two halves: give gated_mlp true, "
                            "or clamped_glu false")
        if self.norm not in NORMS:
            raise SpecError(f"norm must be one of {', '.join(NORMS)}, got '{self.norm}'")
        if self.active_count not in ACTIVE_COUNTS:
            raise SpecError(f"active_count must be one of {', '.join(ACTIVE_COUNTS)}, got "
                            f"{self.active_count!r}")
        if self.position_embedding not in POSITIONS:
            raise SpecError(
                f"position_embedding must be one of {', '.join(POSITIONS)}, "
                f"got '{self.position_embedding}'"
            )
        self._check_rotary()
        self._store("mtp_layers", integer=True, strict=False, maximum=100)
        for key in ("hidden_dropout", "attention_dropout"):
            object.__setattr__(self, key, float(number(getattr(self, key), key, strict=False,
                                                       maximum=1,
                                                       reason="a dropout rate: 0 for none")))

    def _store(self, key: str, **bounds: Any) -> None:
        """Check a numeric field (loading.number's bounds) and store it as checked: a numeric
        string as its number, as the sizes are (and as a spec file's are read)."""
        object.__setattr__(self, key, number(getattr(self, key), key, **bounds))

    def _check_experts(self, given: set[str]) -> None:
        """The mixture-of-experts fields: in range, and only with experts."""
        self._store("experts", integer=True, strict=False, maximum=1e5)
        if not self.experts:
            moe = {"top_k": None, "expert_ffn_hidden": None, "shared_experts": 0,
                   "shared_expert_ffn_hidden": None, "moe_first_dense": 0, "moe_dense_layers": (),
                   "capacity_factor": None, "routing_imbalance": 1.0, "expert_groups": 0,
                   "group_topk": 0, "routing": "learned", "active_count": "all"}
            for key, default in moe.items():
                value = getattr(self, key)
                differs = isinstance(value, np.ndarray) or value != default
                if differs and not (key in DERIVED and key not in given):
                    raise SpecError(f"{key} applies to a mixture-of-experts model: give experts "
                                    "(routed experts per layer, > 0) or leave it out")
            return
        if self.top_k is None:
            raise SpecError(f"top_k must be given with experts ({self.experts}): the routed "
                            "experts each token is sent to")
        self._store("top_k", integer=True, maximum=self.experts,
                    reason=f"at most the {self.experts} experts")
        if "expert_ffn_hidden" not in given:
            object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
        self._store("expert_ffn_hidden", integer=True, maximum=1e10)
        self._store("shared_experts", integer=True, strict=False, maximum=1e5)
        if self.shared_experts and "shared_expert_ffn_hidden" not in given:
            object.__setattr__(self, "shared_expert_ffn_hidden", self.expert_ffn_hidden)
        if self.shared_experts:
            self._store("shared_expert_ffn_hidden", integer=True, maximum=1e10)
        elif "shared_expert_ffn_hidden" in given:
            raise SpecError("shared_expert_ffn_hidden applies to shared experts: give "
                            "shared_experts (> 0) or leave it out")
        self._store("moe_first_dense", integer=True, strict=False, maximum=self.layers - 1,
                    reason=f"a mixture-of-experts model keeps at least one of its {self.layers} "
                           "layers MoE")
        dense = self.moe_dense_layers
        if not isinstance(dense, (list, tuple)):
            raise SpecError("moe_dense_layers must be a list of layer indices (from 0), got "
                            f"{type(dense).__name__}")
        dense = tuple(sorted(int(number(index, "moe_dense_layers", integer=True, strict=False,
                                        maximum=self.layers - 1,
                                        reason=f"layer indices of the {self.layers} layers, "
                                               "from 0"))
                             for index in dense))
        if len(set(dense)) != len(dense):
            raise SpecError(f"moe_dense_layers lists a layer twice: {list(dense)}")
        object.__setattr__(self, "moe_dense_layers", dense)
        if self.moe_layer_count == 0:
            raise SpecError("moe_first_dense and moe_dense_layers leave no mixture-of-experts "
                            f"layer of the {self.layers} layers")
        if self.capacity_factor is not None:
            self._store("capacity_factor", maximum=self.experts / self.top_k,
                        reason="an expert takes at most every token: experts / top_k times its "
                               "share")
        self._store("routing_imbalance", minimum=1.0, strict=False,
                    maximum=self.experts / self.top_k,
                    reason="the busiest expert over the mean: 1 (even) to experts / top_k (every "
                           "token to it)")
        self._check_groups()
        if self.routing not in ROUTINGS:
            raise SpecError(f"routing must be one of {', '.join(ROUTINGS)}, got "
                            f"'{self.routing}'")
        if self.routing == "round_robin" and float(self.routing_imbalance) != 1:
            # token t's experts t k .. t k + k - 1: every expert the same tokens
            raise SpecError(f"routing round_robin gives every expert the same tokens "
                            f"(routing_imbalance 1), got routing_imbalance "
                            f"{float(self.routing_imbalance):g}: give 1, or routing learned")

    def _check_groups(self) -> None:
        """Node-limited routing: expert_groups dividing the experts and group_topk of them
        holding the top_k, both or neither."""
        self._store("expert_groups", integer=True, strict=False, maximum=self.experts,
                    reason=f"at most the {self.experts} experts")
        self._store("group_topk", integer=True, strict=False, maximum=self.expert_groups or 0,
                    reason=f"at most the {self.expert_groups} expert_groups")
        if bool(self.expert_groups) != bool(self.group_topk):
            raise SpecError("expert_groups and group_topk go together (node-limited routing: "
                            "top_k experts from the best group_topk of expert_groups groups): "
                            "give both or neither")
        if self.expert_groups and self.experts % self.expert_groups:
            raise SpecError(f"expert_groups ({self.expert_groups}) must divide experts "
                            f"({self.experts}): each group holds experts / expert_groups")
        held = self.group_topk * self.experts // (self.expert_groups or 1)
        if self.group_topk and (self.top_k or 0) > held:
            raise SpecError(f"group_topk ({self.group_topk}) groups of "
                            f"{self.experts // self.expert_groups} experts cannot hold top_k "
                            f"({self.top_k}) experts")

    def _check_mla(self, given: set[str]) -> None:
        """Multi-head latent attention: its dimensions together, and none without it."""
        if self.kv_lora_rank is None:
            for key in MLA_FIELDS:
                if getattr(self, key) is not None:
                    raise SpecError(f"{key} applies to multi-head latent attention (MLA): give "
                                    "kv_lora_rank or leave it out")
            return
        self._store("kv_lora_rank", integer=True, maximum=1e6)
        if self.q_lora_rank is not None:
            self._store("q_lora_rank", integer=True, maximum=1e6)
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, key) is None:
                raise SpecError(f"{key} must be given with kv_lora_rank (multi-head latent "
                                "attention)")
            self._store(key, integer=True, strict=key != "qk_rope_head_dim", maximum=1e5)
        if self.qk_nope_head_dim + self.qk_rope_head_dim <= 0:  # type: ignore[operator]
            raise SpecError("qk_nope_head_dim + qk_rope_head_dim must be > 0")
        for key in ("kv_heads", "head_dim"):
            if key in given and getattr(self, key) != (self.heads if key == "kv_heads"
                                                       else self.hidden // self.heads):
                raise SpecError(f"{key} does not apply to multi-head latent attention (its heads "
                                "are qk_nope_head_dim + qk_rope_head_dim wide for queries and "
                                "keys, v_head_dim for values): leave it out")
        if self.qkv_bias:
            raise SpecError("qkv_bias with multi-head latent attention is not modelled (its "
                            "projections have no biases in DeepSeek-V2/V3)")
        if self.fused_qkv:
            raise SpecError("fused_qkv with multi-head latent attention: its queries and keys "
                            "are projected through their own low-rank layers (give fused_qkv "
                            "false)")

    def _check_rotary(self) -> None:
        """rotary_fraction: in (0, 1], and below 1 only with rotary positions outside MLA."""
        object.__setattr__(self, "rotary_fraction", float(number(
            self.rotary_fraction, "rotary_fraction", maximum=1,
            reason="the share of each head's dimensions RoPE rotates")))
        if self.rotary_fraction == 1:
            return
        if self.position_embedding != "rotary":
            raise SpecError(f"rotary_fraction applies to rotary position embeddings "
                            f"(position_embedding rotary, not {self.position_embedding}): give 1 "
                            "or leave it out")
        if self.kv_lora_rank is not None:
            raise SpecError("rotary_fraction does not apply to multi-head latent attention (its "
                            "rotary part is qk_rope_head_dim): leave it out")

    def _check_window(self) -> None:
        if self.sliding_window is not None:
            self._store("sliding_window", integer=True, maximum=1e8)
        self._store("full_attention_every", integer=True, strict=False, maximum=1e5)
        if self.full_attention_every and self.sliding_window is None:
            raise SpecError("full_attention_every applies to sliding-window attention: give "
                            "sliding_window or leave it out")
        if self.full_attention_every == 1:
            raise SpecError("full_attention_every 1 makes every layer full attention: leave "
                            "sliding_window and full_attention_every out")

    @property
    def attention_width(self) -> int:
        """Width of the queries and of the attention output: heads x head_dim (hidden, unless
        head_dim is given otherwise)."""
        return self.heads * self.head_dim

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The mixture-of-experts layers (from 0); () for a dense model."""
        if not self.experts:
            return ()
        dense = set(self.moe_dense_layers)
        return tuple(i for i in range(self.moe_first_dense, self.layers) if i not in dense)

    @property
    def moe_layer_count(self) -> int:
        return len(self.moe_layers)

    @property
    def windowed_layers(self) -> tuple[int, ...]:
        """The layers that attend over sliding_window tokens only (from 0)."""
        if self.sliding_window is None:
            return ()
        k = self.full_attention_every
        return tuple(i for i in range(self.layers) if not k or (i + 1) % k)

    @property
    def windowed_share(self) -> float:
        """The share of the layers that attend over a sliding window shorter than the sequence
        (0: none; a window at least as long as the sequence is full attention)."""
        if self.sliding_window is None or self.sliding_window >= self.seq_len:
            return 0.0
        return len(self.windowed_layers) / self.layers

    def uncosted(self) -> list[str]:
        """What this model has that perfmodel's step model does not cost yet (empty: all of it
        is costed). Costed since issue 17: sliding-window attention (the pairs each windowed
        layer attends, perfmodel.costs.compute.attended_share), attention sinks (a logit per
        head: no FLOPs worth counting, their parameters counted), mixtures of experts, MLA and
        MTP modules (perfmodel.step.moe, perfmodel.costs.mla, perfmodel.step.mtp)."""
        out: list[str] = []
        return out

    @property
    def attention_head_dim(self) -> int:
        """The largest head size the attention kernel runs: head_dim, or MLA's query/key
        (qk_nope_head_dim + qk_rope_head_dim) or value head (v_head_dim)."""
        if self.kv_lora_rank is None:
            return self.head_dim
        nope, rope, v = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        assert nope is not None and rope is not None and v is not None  # checked with the rank
        return max(nope + rope, v)

    def require_costed(self) -> TransformerSpec:
        """self, or a SpecError (one line) naming what the step model does not cost yet: never an
        answer as if the model were a dense one. Returns self so calls chain."""
        missing = self.uncosted()
        if missing:
            from perfmodel.params import parameter_counts

            raise SpecError(f"model '{self.name}' ({parameter_counts(self).describe()}) has "
                            f"{'; '.join(missing)}: the step model does not cost these yet "
                            "(its parameter counts do: perfmodel presets --json, "
                            "perfmodel.params.parameter_counts)")
        return self

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
        the new values anyway. Likewise the experts' widths keep theirs to hidden, MLA's ranks to
        hidden and its head sizes to hidden / heads, and with fewer layers the dense layers of a
        mixture of experts keep their places in proportion (at least one layer stays MoE)."""
        hidden = changes.get("hidden", self.hidden)
        heads = changes.get("heads", self.heads)
        layers = changes.get("layers", self.layers)
        scaled: dict[str, Any] = {}

        def keep(key: str, ratio: float) -> None:
            value = getattr(self, key)
            if value and ratio != 1 and key not in changes:
                scaled[key] = max(1, round(value * ratio))

        if "ffn_hidden" in self.explicit and hidden != self.hidden:
            scaled["ffn_hidden"] = max(1, round(self.ffn_hidden * hidden / self.hidden))
        if "kv_heads" in self.explicit and heads != self.heads:
            group = self.heads // self.kv_heads
            want = max(1, heads // group)
            scaled["kv_heads"] = max(k for k in range(1, want + 1) if heads % k == 0)
        if "head_dim" in self.explicit and (hidden, heads) != (self.hidden, self.heads):
            width_ratio = self.attention_width / self.hidden
            scaled["head_dim"] = max(1, round(width_ratio * hidden / heads))
        for key in ("expert_ffn_hidden", "shared_expert_ffn_hidden"):
            if key in self.explicit:
                keep(key, hidden / self.hidden)
        for key in ("q_lora_rank", "kv_lora_rank"):
            keep(key, hidden / self.hidden)
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            keep(key, (hidden / heads) / (self.hidden / self.heads))
        if self.experts and layers != self.layers:
            first = min(round(self.moe_first_dense * layers / self.layers), layers - 1)
            dense = sorted({i * layers // self.layers for i in self.moe_dense_layers} - set(
                range(first)))
            if len(dense) + first >= layers:
                dense = dense[:layers - first - 1]
            scaled.setdefault("moe_first_dense", first)
            scaled.setdefault("moe_dense_layers", tuple(dense))
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
    """A derived field left to derive: None, or for a size 0 where the Python API gives it
    (TransformerSpec(ffn_hidden=0), load_model's overrides); a file's 0 is refused
    (model_from_dict)."""
    return value is None or (key != "qkv_bias" and type(value) is int and value == 0)


keyword_fields(TransformerSpec, SpecError, "model")
MODEL_FIELDS = [f.name for f in dataclasses.fields(TransformerSpec) if f.init and f.compare]
_INT_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "kv_heads",
               "head_dim", "experts", "top_k", "expert_ffn_hidden", "shared_experts",
               "shared_expert_ffn_hidden", "moe_first_dense", "q_lora_rank", "kv_lora_rank",
               "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window",
               "full_attention_every", "mtp_layers")


def model_from_dict(data: Mapping[str, Any], where: str, *,
                    zero_derives: bool = False) -> TransformerSpec:
    """A model from a spec's fields. A derived size (DERIVED: ffn_hidden, kv_heads, head_dim,
    expert_ffn_hidden, shared_expert_ffn_hidden) of 0 is refused, as every zero size is: leave
    it out (or null) to derive it; zero_derives: 0 derives it, as the Python API's overrides
    (load_model(..., kv_heads=0)) take it."""
    check_fields(data, [*MODEL_FIELDS, "base"], where)
    fields = {k: v for k, v in data.items() if k != "base"}
    for key in ("layers", "hidden", "heads", "seq_len", "vocab"):
        if key not in fields:
            raise SpecError(f"{where}: missing required field '{key}'")
    try:
        for key in _INT_FIELDS:  # whole numbers here; their ranges are TransformerSpec's own
            # (a range here named 1e10 and > 0 for layers' 1e5, mtp_layers' >= 0, ...)
            # an int is whole already, and TransformerSpec states its range (10**400 included)
            if key in fields and not _unset(fields[key]) and type(fields[key]) is not int:
                fields[key] = number(fields[key], key, integer=True, minimum=-math.inf,
                                     strict=False)
            if not zero_derives and key in DERIVED and type(fields.get(key)) is int \
                    and fields[key] == 0:  # 0 and 0.0 (a whole number by now)
                raise SpecError(f"{key} must be > 0, got 0 (leave it out, or null, to derive it: "
                                f"{DERIVED[key]})")
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
_DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "bloom", "gemma")
_MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "glm4_moe",
                 "gpt_oss", "olmoe")
_HF_FAMILIES = _DENSE_FAMILIES + _MOE_FAMILIES
# A hardware spec's fields that no model spec has: a hardware file given as a model (or as a
# model's base) is named as what it is
_HARDWARE_KEYS = frozenset({"gpu_name", "gpus_per_node", "peak_flops_per_s", "memory_bytes",
                            "memory_bandwidth_bytes_per_s", "intra_node", "inter_node", "levels"})
# A Hugging Face config's shape keys, none of them a perfmodel spec field: two of them in a file
# without model_type name what it is
_HF_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "vocab_size", "architectures")
# How each family's publisher counts a token's active parameters on its model card
# (TransformerSpec.active_count; the others count every one: Mistral AI's Mixtral 12.9B, Qwen's
# Qwen1.5-MoE-A2.7B 2.7B, AllenAI's OLMoE 1.3B). OpenAI's gpt-oss card, Table 1 (5.13B of
# gpt-oss-120b: attention, 4 experts, router and unembedding) and DeepSeek's (DeepSeek-V3
# README_WEIGHTS.md: 36.7B activated, the count without the 0.9B input table, though its text
# says both tables are in: with it, 37.55B) leave the input embedding out; Zhipu AI's GLM-4.5
# (32B active of 355B; GLM-4.5-Air 12B of 106B) both vocabulary tables. A family is counted one
# way: Moonshot AI's Moonlight (a deepseek_v3 config) is counted as DeepSeek counts, though its
# paper's 2.24B leaves out both tables
_HF_ACTIVE_COUNT = {"gpt_oss": "no_embedding", "deepseek_v2": "no_embedding",
                    "deepseek_v3": "no_embedding", "glm4_moe": "no_embeddings"}
# model_types whose config is another family's, read as that family: (family, the architecture
# its config names). kimi_k2: Moonshot AI's Kimi-K2 deployment guide: K2 reuses DeepSeek-V3's
# architecture (DeepseekV3ForCausalLM); model_type kimi_k2 only tells inference engines apart
_ALIASES = {"kimi_k2": ("deepseek_v3", "DeepseekV3ForCausalLM")}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
             "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size")
_MOE = "a mixture-of-experts model of a family perfmodel does not read"
# DeepSeek's sparse attention (DeepSeek-V3.2, GLM-5: a lightning indexer picks index_topk tokens
# for each query): configs of those models carry these keys, whatever their model_type
_SPARSE_ATTENTION_KEYS = frozenset({"index_topk", "index_n_heads", "index_head_dim"})
# What a config.json's architectures names: the class transformers builds. perfmodel costs a
# causal language model (its vocabulary-wide output layer and loss); a reward, classification or
# embedding model's head (LlamaForSequenceClassification, Qwen2ForRewardModel, MistralModel) is
# another computation and other parameters
_LM_HEADS = ("ForCausalLM", "LMHeadModel")
_UNMODELLED_TYPES = {
    **dict.fromkeys(("dbrx", "jamba", "jetmoe", "arctic", "grok-1", "minimax", "llama4"), _MOE),
    # mixtures of experts whose parameters perfmodel's fields could express but whose work they
    # do not all: phimoe (Phi-3.5-MoE) biases the attention output, LayerNorms and output layer
    # but not its experts; granitemoe scales the logits (logits_scaling: a vocab-wide
    # element-wise pass), the residuals and the embedding
    "phimoe": "a mixture of experts with attention-output and output-layer biases but "
              "bias-free experts (attention_bias, lm_head_bias; perfmodel's bias covers the "
              "attention output and the MLP together)",
    "granitemoe": "a mixture of experts that scales its logits, residuals and embedding "
                  "(logits_scaling, residual_multiplier, embedding_multiplier: element-wise "
                  "work perfmodel does not cost)",
    **dict.fromkeys(("gemma2", "gemma3", "gemma3_text", "cohere2"),
                    "a model that alternates sliding-window and global attention layers with "
                    "logit soft-capping or norms perfmodel does not read"),
    **dict.fromkeys(("mamba", "mamba2", "rwkv", "falcon_mamba", "recurrent_gemma"),
                    "a state-space or recurrent model, not a transformer"),
    **dict.fromkeys(("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper",
                     "encoder-decoder"), "an encoder-decoder model"),
}


# Keys that a family's configuration class fills in when a config.json leaves them out, with a
# value perfmodel would not derive (transformers 5's <Family>Config; for DeepSeek also DeepSeek's
# own configuration_deepseek.py, which its configs' auto_map names, where the two differ): what
# the class would take. A config without one is refused naming it, never read with perfmodel's
# fallback (kv heads = heads, head_dim = hidden / heads, no shared expert, no compression ...).
_HF_UNSAID = {
    "num_key_value_heads": {"mistral": "8", "mixtral": "8", "qwen2": "32", "qwen2_moe": "16",
                            "qwen3": "32", "qwen3_moe": "4", "gpt_oss": "8", "glm4_moe": "8",
                            "gemma": "16"},
    "head_dim": {"qwen3": "128", "glm4_moe": "128", "gemma": "256"},
    "shared_expert_intermediate_size": {"qwen2_moe": "5632"},
    "q_lora_rank": dict.fromkeys(("deepseek_v2", "deepseek_v3"), "1536"),
    "qk_rope_head_dim": dict.fromkeys(("deepseek_v2", "deepseek_v3"), "64"),
    "n_routed_experts": {"deepseek_v2": "64 (transformers) or none, a dense model (DeepSeek's)",
                         "deepseek_v3": "256 (transformers) or none, a dense model (DeepSeek's)",
                         "glm4_moe": "128"},
    "num_nextn_predict_layers": {"glm4_moe": "1"},
}
# ... and those that matter only with routed experts
_HF_UNSAID_MOE = {
    "n_shared_experts": {"deepseek_v2": "2 (transformers) or none (DeepSeek's)",
                         "deepseek_v3": "1 (transformers) or none (DeepSeek's)", "glm4_moe": "1"},
    "first_k_dense_replace": {"deepseek_v3": "3 (transformers) or 0 (DeepSeek's)",
                              "glm4_moe": "1"},
    # the router's groups (transformers' DeepseekV3Config: n_group 8, topk_group 4)
    "n_group": {"deepseek_v3": "8 (transformers)"},
    "topk_group": {"deepseek_v3": "4 (transformers)"},
}


def _hf_unsaid(cfg: Mapping[str, Any], mtype: str, where: str) -> None:
    """Refuse a config that leaves out a key its family's configuration class would fill in with
    a value of its own (_HF_UNSAID); the message names the key and that value."""
    tables = [_HF_UNSAID]
    if cfg.get("n_routed_experts") is not None:
        tables.append(_HF_UNSAID_MOE)
    for table in tables:
        for key, families in table.items():
            if mtype in families and key not in cfg:
                raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}', which "
                                f"its configuration class sets to {families[mtype]}: give it")


def _hf_refusal(cfg: Mapping[str, Any], mtype: str) -> str | None:
    """Why a config describes a model perfmodel cannot model, or None."""
    indexer = sorted(k for k in cfg if k in _SPARSE_ATTENTION_KEYS)
    if indexer:  # checked first: a sparse-attention MoE is refused for its attention
        return (f"model with a sparse-attention indexer ({', '.join(indexer)}: each query "
                f"attends to the tokens the indexer selects, not to every earlier token)")
    experts = [k for k in _MOE_KEYS if cfg.get(k) not in (None, 0, False)]
    what = f" ({experts[0]}: {cfg[experts[0]]})" if experts else ""
    if mtype in _UNMODELLED_TYPES:
        return f"model_type '{mtype}' is {_UNMODELLED_TYPES[mtype]}{what}"
    if mtype not in _MOE_FAMILIES and (experts or "moe" in mtype):
        return f"model_type '{mtype}' is {_MOE}{what}"
    if cfg.get("is_encoder_decoder") is True:
        return f"model_type '{mtype}' is an encoder-decoder model"
    return None


def _json_number(value: Any, field: str) -> Any:
    """A config.json number as written: a quoted one ("128", "12_8") is refused."""
    if isinstance(value, str):
        raise SpecError(f"{field} must be a JSON number, got the string {value!r}")
    return value


def _hf_name(where: str) -> str:
    """A Hugging Face config's name where it gives no _name_or_path (the Hub's config.json files
    seldom do): its directory's ('Mixtral-8x7B-v0.1/config.json'), or the file's own
    ('mixtral.json'); '' for neither (the model_type names it then, as it did for every config
    until 2026-12-07: two Mixtrals were both 'mixtral'). where: the loader's "model 'PATH'"."""
    quoted = where.removeprefix("model '")
    path = Path(quoted.removesuffix("'") if quoted != where else where)
    if path.name == "config.json":
        path = path.parent
    elif path.suffix == ".json":
        return path.stem
    return path.name if path.name not in ("", ".", "..") else ""


def model_from_hf_config(cfg: Mapping[str, Any], where: str,
                         seq_len: int | None = None) -> TransformerSpec:
    """A TransformerSpec from a Hugging Face config.json and the training sequence length."""
    mtype = str(cfg.get("model_type", ""))
    if mtype in _ALIASES:  # a model_type that names another family's modelling code
        family, architecture = _ALIASES[mtype]
        named = cfg.get("architectures") or [architecture]
        if architecture not in named:
            raise SpecError(f"{where}: Hugging Face model_type '{mtype}' with architectures "
                            f"{named}: perfmodel reads it as {family} ({architecture}) only")
        mtype = family
    refusal = _hf_refusal(cfg, mtype)
    if refusal:
        raise SpecError(f"{where}: Hugging Face {refusal}, which perfmodel does not model "
                        f"(it reads: {', '.join(_HF_FAMILIES)})")
    if mtype not in _HF_FAMILIES:
        raise SpecError(
            f"{where}: Hugging Face model_type '{mtype}' is not supported"
            f"{suggest(mtype, _HF_FAMILIES)}; supported: {', '.join(_HF_FAMILIES)}"
        )
    heads = cfg.get("architectures")
    if heads is not None:
        if not isinstance(heads, list) or not all(isinstance(a, str) for a in heads):
            raise SpecError(f"{where}: architectures must be a list of class names, got {heads!r}")
        other = [a for a in heads if not a.endswith(_LM_HEADS)]
        if other:
            raise SpecError(f"{where}: Hugging Face architectures {other[0]} is not a causal "
                            f"language model, which perfmodel does not model (it models "
                            f"<Family>ForCausalLM and GPT2LMHeadModel: their output layer "
                            f"and loss)")
    _hf_unsaid(cfg, mtype, where)

    def need(key: str) -> int:
        if cfg.get(key) is None:
            raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}'")
        return count(key)

    def count(key: str, default: int | None = None) -> int:
        """A whole number of the config (a float like 32.7, true, Infinity or a quoted number,
        which transformers would not build a layer from, is refused)."""
        value = cfg.get(key)
        if value is None and default is not None:
            return default
        return int(number(_json_number(value, f"{where}: {key}"), f"{where}: {key}",
                          integer=True, strict=default != 0, maximum=1e10))

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
    fields.update(_hf_dropout(cfg, mtype, where))
    if mtype in _MOE_FAMILIES:
        fields.update(_hf_experts(cfg, mtype, where, fields["layers"], need, count))
    fields.update(_hf_window(cfg, mtype, where, fields["layers"], count))
    fields.update(_hf_rotary(cfg, mtype, where))
    if fields.get("experts"):  # a dense model's active parameters are all of them
        fields["active_count"] = _HF_ACTIVE_COUNT.get(mtype, "all")
    if seq_len is None:
        reach = f" (its {positions_key} is {positions})" if positions is not None else ""
        raise SpecError(f"{where} (Hugging Face config) has no training sequence length: give "
                        f"--seq-len{reach}")
    seq_len = int(number(seq_len, "seq_len", integer=True, maximum=1e8))
    if mtype == "gpt2" and positions is not None and seq_len > int(number(
            positions, f"{where}: {positions_key}", integer=True, maximum=1e10)):
        raise SpecError(f"{where}: seq_len ({seq_len}) is longer than the learned position "
                        f"table ({positions_key} {positions})")
    name = str(cfg.get("_name_or_path") or _hf_name(where) or mtype)
    try:
        return TransformerSpec(name=name, seq_len=seq_len,
                               source=f"Hugging Face config ({mtype})", **fields)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}{_hf_keys_of(str(exc), cfg)}") from None


# perfmodel's model fields a refusal may name, and the config keys they were read from (the
# first of them the config gives): a refusal names both, the user having written only the keys
_HF_KEYS = {"top_k": ("num_experts_per_tok", "experts_per_token"),
            "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
            "expert_groups": ("n_group",), "group_topk": ("topk_group",),
            "moe_first_dense": ("first_k_dense_replace",),
            "moe_dense_layers": ("mlp_only_layers", "decoder_sparse_step"),
            "kv_heads": ("num_key_value_heads",), "heads": ("num_attention_heads",),
            "expert_ffn_hidden": ("moe_intermediate_size", "intermediate_size"),
            "shared_expert_ffn_hidden": ("shared_expert_intermediate_size",
                                         "moe_intermediate_size"),
            "mtp_layers": ("num_nextn_predict_layers",)}


def _hf_keys_of(message: str, cfg: Mapping[str, Any]) -> str:
    """' (the config's keys: FIELD: KEY; ...)' for the model fields a refusal names, or ''."""
    import re

    named = []
    for field_name, keys in _HF_KEYS.items():
        if re.search(rf"(?<![\w-]){field_name}(?![\w-])", message):
            given = [k for k in keys if k in cfg]
            if given:
                named.append(f"{field_name}: {' / '.join(given)}")
    return f" (the config's keys: {'; '.join(named)})" if named else ""


def _hf_fields(cfg: Mapping[str, Any], mtype: str, where: str, need: Any, count: Any,
               flag: Any) -> dict[str, Any]:
    """The dense TransformerSpec fields (all but name, seq_len, source, the experts and the
    window) of a supported family."""
    if mtype in ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                 "olmoe"):
        heads = need("num_attention_heads")
        # biases: qwen2 (and qwen2_moe) have them on q, k and v only (their modelling code;
        # qwen2_moe's with qkv_bias, true unless a config says otherwise); llama on q, k, v and o
        # with attention_bias and on the MLP with mlp_bias; mistral and mixtral none; qwen3,
        # qwen3_moe and olmoe on q, k, v and o with attention_bias, their MLPs and experts none
        # (their modelling code does not read mlp_bias)
        if mtype in ("qwen2", "qwen2_moe"):
            bias, qkv_bias = False, mtype == "qwen2" or flag("qkv_bias", True)
        elif mtype in ("mistral", "mixtral"):
            bias, qkv_bias = False, False
        elif mtype in ("olmoe", "qwen3", "qwen3_moe"):
            bias, qkv_bias = _hf_biases(flag("attention_bias", False), False, where)
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
    if mtype in ("deepseek_v2", "deepseek_v3"):
        # multi-head latent attention: q_a/kv_a/o take attention_bias, q_b/kv_b none
        # (transformers' modeling_deepseek_v3); perfmodel models MLA without biases
        if flag("attention_bias", False):
            raise SpecError(f"{where}: attention_bias true with multi-head latent attention is "
                            "not modelled")
        # transformers' DeepseekV2MLP puts biases on the dense and shared MLPs with mlp_bias (not
        # on the routed experts), DeepSeek's modeling_deepseek.py on none: not modelled
        if mtype == "deepseek_v2" and flag("mlp_bias", False):
            raise SpecError(f"{where}: mlp_bias true in a deepseek_v2 config is not modelled "
                            "(transformers biases its dense and shared MLPs, DeepSeek's code none)")
        rank = cfg.get("q_lora_rank")
        return dict(
            layers=need("num_hidden_layers"), hidden=need("hidden_size"),
            heads=need("num_attention_heads"), ffn_hidden=need("intermediate_size"),
            vocab=need("vocab_size"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", False), bias=False, qkv_bias=False,
            norm="rmsnorm", position_embedding="rotary",
            q_lora_rank=None if rank is None else count("q_lora_rank"),
            kv_lora_rank=need("kv_lora_rank"), qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=count("qk_rope_head_dim", 0), v_head_dim=need("v_head_dim"),
            mtp_layers=count("num_nextn_predict_layers", 0),
        )
    if mtype == "glm4_moe":
        # transformers 5's modeling_glm4_moe (GLM-4.5, GLM-4.5-Air): grouped-query attention
        # heads x head_dim wide with q, k and v biased by attention_bias and o_proj never;
        # RMSNorm; SwiGLU dense MLPs (intermediate_size), shared and routed experts, none biased;
        # RoPE on partial_rotary_factor of each head (_hf_rotary). use_qk_norm adds an RMSNorm of
        # head_dim on each query and key head (GLM-4.5: 2 x 128 weights a layer, 23,552 of its
        # 352.8 billion): not counted, and its kernel not costed, as Qwen3's.
        # num_nextn_predict_layers: the multi-token-prediction layers (layers num_hidden_layers ..,
        # each a decoder layer, eh_proj 2 hidden -> hidden, enorm and hnorm), counted apart from
        # the model as DeepSeek-V3's; transformers builds none (Glm4MoePreTrainedModel skips
        # their weights on loading). routed_scaling_factor and norm_topk_prob scale the routing
        # weights (no parameters, k products a token): not read
        heads = need("num_attention_heads")
        return dict(
            layers=need("num_hidden_layers"), hidden=need("hidden_size"), heads=heads,
            kv_heads=count("num_key_value_heads"),
            head_dim=count("head_dim") if cfg.get("head_dim") is not None else None,
            ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", False), bias=False,
            qkv_bias=flag("attention_bias", False), norm="rmsnorm", position_embedding="rotary",
            mtp_layers=count("num_nextn_predict_layers", 0),
        )
    if mtype == "gpt_oss":
        # transformers' modeling_gpt_oss: q, k, v and o biases with attention_bias; the experts'
        # (gate_up, down) and the router's biases always; a learned sink per head
        bias, qkv_bias = _hf_biases(flag("attention_bias", True), True, where)
        heads = need("num_attention_heads")
        return dict(
            layers=need("num_hidden_layers"), hidden=need("hidden_size"), heads=heads,
            kv_heads=count("num_key_value_heads", heads), head_dim=need("head_dim"),
            ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", False), bias=bias, qkv_bias=qkv_bias,
            norm="rmsnorm", position_embedding="rotary", attention_sinks=True,
            # the experts' SwiGLU clamps at swiglu_limit (GptOssConfig's default 7.0 where the
            # config leaves it out; transformers' GptOssExperts clamps always)
            clamped_glu=True,
        )
    if mtype == "gpt2":
        if flag("add_cross_attention", False):
            raise SpecError(f"{where}: add_cross_attention is true: a decoder with cross-attention "
                            "is not modelled")
        hidden = need("n_embd")
        return dict(
            layers=need("n_layer"), hidden=hidden, heads=need("n_head"),
            ffn_hidden=count("n_inner", 4 * hidden), vocab=need("vocab_size"),
            tied_embeddings=flag("tie_word_embeddings", True), fused_qkv=True,  # c_attn
        )
    if mtype == "gemma":
        # transformers' modeling_gemma (Gemma 1): a gated GeLU MLP (GeGLU: SwiGLU's three
        # matrices and cost), RMSNorm (its 1 + weight is the same cost), rotary, no biases unless
        # attention_bias, head_dim 256 given, the output tied unless tie_word_embeddings is false;
        # the embedding's scaling by sqrt(hidden) is one element-wise op (not costed)
        heads = need("num_attention_heads")
        bias, qkv_bias = _hf_biases(flag("attention_bias", False), False, where)
        return dict(
            layers=need("num_hidden_layers"), hidden=need("hidden_size"), heads=heads,
            kv_heads=count("num_key_value_heads", heads), head_dim=count("head_dim", 256),
            ffn_hidden=need("intermediate_size"), vocab=need("vocab_size"), gated_mlp=True,
            tied_embeddings=flag("tie_word_embeddings", True), bias=bias, qkv_bias=qkv_bias,
            norm="rmsnorm", position_embedding="rotary")
    if mtype == "bloom":
        # transformers' modeling_bloom (BloomConfig maps n_layer, n_head; hidden_size was n_embed
        # in early configs): LayerNorms, biases everywhere, a GeLU MLP 4 hidden wide (n_inner is
        # not read), ALiBi, the output tied to the embedding unless tie_word_embeddings is false.
        # Its word_embeddings_layernorm (2 hidden parameters: 28,672 of BLOOM-176B's 176.2
        # billion) is not counted, and its kernel (one norm of the 2 layers + 1 of a step) not
        # costed
        hidden = count("n_embed") if cfg.get("n_embed") is not None else need("hidden_size")
        layers = count("n_layer") if cfg.get("n_layer") is not None else need("num_hidden_layers")
        heads = count("n_head") if cfg.get("n_head") is not None else need("num_attention_heads")
        return dict(layers=layers, hidden=hidden, heads=heads, ffn_hidden=4 * hidden,
                    vocab=need("vocab_size"), tied_embeddings=flag("tie_word_embeddings", True),
                    bias=True, qkv_bias=True, position_embedding="alibi",
                    fused_qkv=True)  # query_key_value
    # gpt_neox: biases on the MLP always, on query_key_value and dense with attention_bias; RoPE
    # on rotary_pct of each head (_hf_rotary)
    bias, qkv_bias = _hf_biases(flag("attention_bias", True), True, where)
    return dict(
        layers=need("num_hidden_layers"), hidden=need("hidden_size"),
        heads=need("num_attention_heads"), ffn_hidden=need("intermediate_size"),
        vocab=need("vocab_size"), tied_embeddings=flag("tie_word_embeddings", False),
        bias=bias, qkv_bias=qkv_bias, position_embedding="rotary",
        fused_qkv=True,  # query_key_value
    )


# The config keys of a family's dropout rates (transformers' modelling code; its config class's
# default where the key is absent): (hidden, attention). None: the modelling code has no hidden
# dropout (the residual branches add without one).
_HF_DROPOUT = {"gpt2": (("resid_pdrop", 0.1), ("attn_pdrop", 0.1)),
               "bloom": (("hidden_dropout", 0.0), ("attention_dropout", 0.0)),
               "gpt_neox": (("hidden_dropout", 0.0), ("attention_dropout", 0.0))}


def _hf_dropout(cfg: Mapping[str, Any], mtype: str, where: str) -> dict[str, float]:
    """The dropout rates of a config: GPT-2's resid_pdrop and attn_pdrop (its embedding's
    embd_pdrop is taken as the hidden rate's), BLOOM's and GPT-NeoX's hidden_dropout and
    attention_dropout; the Llama-style families (Llama, Mistral, Mixtral, Qwen, OLMoE, DeepSeek,
    GPT-OSS, Gemma) have an attention_dropout (0 in their configs) and no hidden dropout."""
    hidden, attention = _HF_DROPOUT.get(mtype, (None, ("attention_dropout", 0.0)))
    out = {}
    for field_name, entry in (("hidden_dropout", hidden), ("attention_dropout", attention)):
        if entry is None:
            out[field_name] = 0.0
            continue
        key, default = entry
        value = cfg.get(key, default)
        out[field_name] = number(_json_number(default if value is None else value,
                                              f"{where}: {key}"), f"{where}: {key}",
                                 strict=False, maximum=1, reason="a dropout rate")
    return out


def _hf_experts(cfg: Mapping[str, Any], mtype: str, where: str, layers: int, need: Any,
                count: Any) -> dict[str, Any]:
    """The mixture-of-experts fields of a family, as its modelling code (transformers) builds
    them: which layers are MoE, the experts' and the shared experts' widths."""
    if mtype == "olmoe":
        # OlmoeDecoderLayer: every layer MoE, num_experts SwiGLU experts intermediate_size wide,
        # no shared expert (its QK-norms' 2 hidden weights per layer are not counted: 65,536 of
        # OLMoE-1B-7B's 6.9 billion)
        return dict(experts=need("num_experts"), top_k=need("num_experts_per_tok"))
    if mtype in ("mixtral", "gpt_oss"):  # every layer MoE, experts as wide as intermediate_size
        # gpt_oss configs carry both num_experts_per_tok and (the original) experts_per_token
        key = ("experts_per_token" if cfg.get("num_experts_per_tok") is None
               and cfg.get("experts_per_token") is not None else "num_experts_per_tok")
        return dict(experts=need("num_local_experts"), top_k=need(key))
    if mtype in ("qwen2_moe", "qwen3_moe"):
        # Qwen2MoeDecoderLayer: layer i is sparse when i is not in mlp_only_layers and
        # (i + 1) % decoder_sparse_step == 0; Qwen2-MoE adds one shared expert
        # (shared_expert_intermediate_size wide, with a hidden x 1 sigmoid gate whose
        # 1 x hidden weights per layer perfmodel does not count: 49,152 of Qwen1.5-MoE-A2.7B's
        # 14.3 billion); Qwen3-MoE none (Qwen3MoeSparseMoeBlock does not read
        # shared_expert_intermediate_size, which Qwen3-Coder's config carries as 0)
        step = count("decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list):
            raise SpecError(f"{where}: mlp_only_layers must be a list of layer indices")
        dense = sorted({int(number(_json_number(i, f"{where}: mlp_only_layers"),
                                   f"{where}: mlp_only_layers", integer=True, strict=False,
                                   maximum=layers - 1)) for i in only}
                       | {i for i in range(layers) if (i + 1) % step})
        out = dict(experts=need("num_experts"), top_k=need("num_experts_per_tok"),
                   expert_ffn_hidden=need("moe_intermediate_size"),
                   moe_dense_layers=tuple(dense))
        shared = count("shared_expert_intermediate_size", 0) if mtype == "qwen2_moe" else 0
        if shared:
            out.update(shared_experts=1, shared_expert_ffn_hidden=shared)
        return out
    if mtype == "glm4_moe":
        # Glm4MoeDecoderLayer: layer i is MoE from first_k_dense_replace on; Glm4MoeMoE: routed
        # experts moe_intermediate_size wide and one shared MLP n_shared_experts x as wide (the
        # same parameters as n_shared_experts experts); Glm4MoeTopkRouter takes a token's top k
        # from its best topk_group of n_group groups (no topk_method is read; one group limits
        # nothing), its score-correction bias a buffer, not a parameter
        out = dict(experts=need("n_routed_experts"), top_k=need("num_experts_per_tok"),
                   expert_ffn_hidden=need("moe_intermediate_size"),
                   shared_experts=count("n_shared_experts", 0),
                   moe_first_dense=count("first_k_dense_replace", 0))
        groups = count("n_group", 1)
        if groups > 1:
            out.update(expert_groups=groups, group_topk=need("topk_group"))
        return out
    # deepseek_v2 / v3 (DeepseekV2/V3DecoderLayer): layer i is MoE when n_routed_experts is
    # set and i >= first_k_dense_replace; n_shared_experts experts moe_intermediate_size wide (one
    # MLP n_shared_experts x as wide: the same parameters). moe_layer_freq (1 in every published
    # config) is read two ways: DeepSeek's modeling_deepseek.py (and vLLM, SGLang) keep layer i
    # dense unless i % moe_layer_freq == 0, transformers' classes ignore it: refused unless 1
    if cfg.get("n_routed_experts") is None:
        return {}
    first = count("first_k_dense_replace", 0)
    if cfg.get("moe_layer_freq", 1) != 1:
        raise SpecError(f"{where}: moe_layer_freq {cfg['moe_layer_freq']!r} is not modelled "
                        "(DeepSeek's modelling code makes every moe_layer_freq-th layer MoE, "
                        "transformers' every layer from first_k_dense_replace)")
    out = dict(experts=need("n_routed_experts"), top_k=need("num_experts_per_tok"),
               expert_ffn_hidden=need("moe_intermediate_size"),
               shared_experts=count("n_shared_experts", 0), moe_first_dense=first)
    # node-limited routing (MoEGate: topk_method group_limited_greedy or noaux_tc takes the top
    # k from the best topk_group of n_group groups; greedy, or one group, limits nothing). A
    # config without topk_method takes its class's: greedy for deepseek_v2 (DeepseekV2Config),
    # grouped for deepseek_v3 (transformers' DeepseekV3TopkRouter always groups by n_group;
    # DeepSeek's own V3 configs say noaux_tc)
    groups = count("n_group", 1)
    method = cfg.get("topk_method") or ("noaux_tc" if mtype == "deepseek_v3" else "greedy")
    if groups > 1 and method != "greedy":
        out.update(expert_groups=groups, group_topk=need("topk_group"))
    return out


# The share of each head RoPE rotates, in the families whose modelling code reads it
# (transformers 5: GPTNeoXRotaryEmbedding's frequencies and GPTNeoXAttention's rotary_ndims,
# int(head_dim x partial_rotary_factor), the slice apply_rotary_pos_emb rotates; Glm4Moe's the
# same, with gpt_neox's apply_rotary_pos_emb): the config key and what the configuration class
# sets where a config leaves it out (GPTNeoXConfig: rotary_pct 0.25; Glm4MoeConfig: 0.5). A saved
# transformers 5 config carries it in rope_parameters, which the classes read first. The other
# families rotate whole heads (their apply_rotary_pos_emb multiplies q by a cos as wide as the
# head, their default RoPE parameters take the head's width): a partial_rotary_factor in their
# config is not read.
_HF_ROTARY = {"gpt_neox": ("rotary_pct", "0.25"), "glm4_moe": ("partial_rotary_factor", "0.5")}


def _hf_rotary(cfg: Mapping[str, Any], mtype: str, where: str) -> dict[str, float]:
    """rotary_fraction from a config of a family that rotates part of each head (_HF_ROTARY);
    a config that does not say is refused naming the key and its class's value."""
    if mtype not in _HF_ROTARY:
        return {}
    key, default = _HF_ROTARY[mtype]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    value = rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None
    name = "rope_parameters' partial_rotary_factor"
    if value is None:
        value, name = cfg.get(key), key
    if value is None:
        raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}', which its "
                        f"configuration class sets to {default}: give it")
    return {"rotary_fraction": number(_json_number(value, f"{where}: {name}"),
                                      f"{where}: {name}", maximum=1,
                                      reason="the share of each head's dimensions RoPE rotates")}


_ATTENTION_TYPES = ("full_attention", "sliding_attention")


def _hf_window(cfg: Mapping[str, Any], mtype: str, where: str, layers: int,
               count: Any) -> dict[str, Any]:
    """sliding_window and full_attention_every from a config: its layer_types where it has them,
    else the family's rule (mistral, mixtral: every layer windowed; qwen families: only with
    use_sliding_window, the layers from max_window_layers on; gpt_oss: every other layer, from
    the first). A pattern perfmodel cannot express is refused with its reason. The families
    whose modelling code has no window (transformers 5: GPT-2, GPT-NeoX, BLOOM, Llama, Gemma,
    OLMoE, DeepSeek, GLM-4.5) ignore a sliding_window key, as transformers does."""
    if mtype in ("gpt2", "gpt_neox", "deepseek_v2", "deepseek_v3", "glm4_moe", "llama", "gemma",
                 "olmoe", "bloom"):
        types = cfg.get("layer_types")
        if types and any(t != "full_attention" for t in types):
            raise SpecError(f"{where}: layer_types other than full_attention in a {mtype} "
                            "config are not modelled")
        return {}
    window = cfg.get("sliding_window")
    qwen = mtype.startswith("qwen")
    if qwen and cfg.get("use_sliding_window") is not True:
        # their configs carry a window that only use_sliding_window turns on; a layer of another
        # kind (Qwen3-Next's linear_attention) is refused all the same
        unknown = sorted({str(t) for t in cfg.get("layer_types") or []}
                         - set(_ATTENTION_TYPES))
        if unknown:
            raise SpecError(f"{where}: layer_types {', '.join(unknown)} is not modelled "
                            f"(perfmodel models {', '.join(_ATTENTION_TYPES)})")
        return {}
    # what the configuration class fills in where the window's keys are left out (transformers
    # 5: MistralConfig's and GptOssConfig's sliding_window, the Qwen classes' sliding_window and
    # max_window_layers): refused, never read as no window or every layer windowed
    unsaid = {"mistral": {"sliding_window": "4096 (null: no window)"},
              "gpt_oss": {"sliding_window": "128"}}.get(
        mtype, {"sliding_window": "4096", "max_window_layers": "28"} if qwen else {})
    for key, default in unsaid.items():
        if key not in cfg and not (key == "max_window_layers" and "layer_types" in cfg):
            raise SpecError(f"{where}: Hugging Face config ({mtype}) is missing '{key}', which "
                            f"its configuration class sets to {default}: give it")
    if window is None:
        types = cfg.get("layer_types") or []
        if any(t != "full_attention" for t in types):
            raise SpecError(f"{where}: layer_types has sliding_attention layers but "
                            "sliding_window is not given")
        return {}
    width = int(number(_json_number(window, f"{where}: sliding_window"),
                       f"{where}: sliding_window", integer=True, maximum=1e10))
    types = cfg.get("layer_types")
    if types is None:
        if qwen:
            first = count("max_window_layers", 0)
            types = ["sliding_attention" if i >= first else "full_attention"
                     for i in range(layers)]
        elif mtype == "gpt_oss":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                     for i in range(layers)]
        else:
            types = ["sliding_attention"] * layers
    if not isinstance(types, list) or len(types) != layers:
        raise SpecError(f"{where}: layer_types must list the {layers} layers' attention")
    unknown = sorted({str(t) for t in types} - set(_ATTENTION_TYPES))
    if unknown:
        raise SpecError(f"{where}: layer_types {', '.join(unknown)} is not modelled (perfmodel "
                        f"models {', '.join(_ATTENTION_TYPES)})")
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(full) == layers:
        return {}
    every = full[0] + 1 if full else 0
    if every == 1 or (every and full != [i for i in range(layers) if (i + 1) % every == 0]):
        raise SpecError(f"{where}: layer_types puts full attention in layers {full[:6]}"
                        f"{' ...' if len(full) > 6 else ''}: perfmodel models every layer "
                        "windowed or every k-th (layers k-1, 2k-1, ...) full")
    return dict(sliding_window=width, full_attention_every=every)


def _hf_biases(attention: bool, mlp: bool, where: str) -> tuple[bool, bool]:
    """(bias, qkv_bias) of a config's attention_bias (q, k, v and output projections) and
    mlp_bias; perfmodel's `bias` covers the attention output and the MLP together."""
    if attention != mlp:
        raise SpecError(f"{where}: attention_bias {str(attention).lower()} with mlp_bias "
                        f"{str(mlp).lower()} is not modelled (perfmodel's bias covers the "
                        "attention output and the MLP together)")
    return mlp, attention


def load_model(name_or_path: str | Path | TransformerSpec, **overrides: Any) -> Any:
    """A model spec from a preset, a YAML/JSON spec file, or a Hugging Face config.json.

    Transformers give a TransformerSpec; layer graphs (the CNN presets alexnet, vgg16, resnet50,
    mlp, or a file with `kind: layers`) a perfmodel.specs.layers.LayerGraphSpec. `overrides`
    replace fields (None: keep); the fields derived from others follow the final values unless
    the spec or the overrides give them. A Hugging Face config needs seq_len among them. A spec's
    `base` path is read from the spec file's folder (_within: the files whose bases lead here,
    a cycle refused); the spec's name is its own, else its file's, not its base's.
    """
    return _load_model(name_or_path, (), overrides)


def _load_model(name_or_path: str | Path | TransformerSpec, _within: tuple[Path, ...],
                overrides: dict[str, Any]) -> Any:
    """load_model, _within the spec files whose bases lead here."""
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
        if "kind" in data and data["kind"] != "transformer":
            raise SpecError(f"{where}: kind must be 'transformer' (the default) or 'layers' (a "
                            f"CNN or MLP layer graph), got {data['kind']!r}")
        hf_keys = [k for k in _HF_SHAPE_KEYS if k in data]
        hardware_keys = sorted(_HARDWARE_KEYS & set(data))
        if hardware_keys and not {"layers", "hidden", "heads"} & set(data):
            raise SpecError(f"{where}: a hardware spec ({', '.join(hardware_keys[:3])}), not a "
                            "model: give it as --hardware")
        if "model_type" in data and "kind" not in data and not hf_keys \
                and {"layers", "hidden", "heads"} & set(data):
            raise SpecError(f"{where}: unknown field 'model_type' in a perfmodel model spec "
                            "(a Hugging Face config.json gives hidden_size, num_hidden_layers, "
                            "...; a spec gives layers, hidden, heads)")
        if "model_type" not in data and "kind" not in data and len(hf_keys) >= 2:
            raise SpecError(f"{where}: a Hugging Face config.json ({', '.join(hf_keys)}) without "
                            f"model_type: give its model_type (one of {', '.join(_HF_FAMILIES)})")
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
                if base_name in BUILDERS:
                    raise SpecError(f"{where}: base '{base_name}' is a layer graph (CNN/MLP) "
                                    "preset: a transformer spec builds on a transformer's")
                base_path = resolve(base_name, MODELS_DIR, "model", relative_to=path.parent)
                if base_path.resolve() in (*_within, path.resolve()):
                    raise SpecError(f"{where}: base '{base_name}' forms a cycle")
                base = _load_model(base_name if base_path.parent == MODELS_DIR else base_path,
                                   (*_within, path.resolve()), {"seq_len": data.get("seq_len")})
                if not isinstance(base, TransformerSpec):
                    raise SpecError(f"{where}: base '{base_name}' is a layer graph, not a "
                                    "transformer")
                origin = f"{origin} (base: {base.origin})"
                if "seq_len" not in data:
                    seq_len_from = base.seq_len_from
                data = {**{k: v for k, v in base.given().items() if k != "name"}, **data}
            data.setdefault("name", Path(path).stem if preset else str(name_or_path))
            spec = model_from_dict(data, where).noted(origin=origin, seq_len_from=seq_len_from)
    if overrides:
        changed = model_from_dict({**spec.given(), **overrides}, f"model '{spec.name}'",
                                  zero_derives=True)
        spec = changed.noted(origin=spec.origin,
                             seq_len_from="the seq_len argument" if "seq_len" in overrides
                             else spec.seq_len_from)
    return spec


def dumps(spec: TransformerSpec) -> str:
    return json.dumps(spec.to_dict(), indent=2)
