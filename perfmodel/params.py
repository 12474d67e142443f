"""Parameter counts of a transformer spec: total, and active per token (mixtures of experts).

Pure Python integers, no sympy: the counts of what a model IS, whatever the plan. For a dense
model they equal the step model's `parameters` (perfmodel.step.parameters: every layer, the
embeddings, the final norm, an untied output layer), term for term:

    layer  = attention + MLP + 2 norms
    attention (h hidden, a heads of d, kv key/value heads)
           = (a d + 2 kv d) h + a d h + qkv_bias (a d + 2 kv d) + bias h
    MLP (f wide) = (1 + gated) f h + f h + bias ((1 + gated) f + h)
    norms  = 2 (1 + layernorm) h
    model  = sum of the layers + V h (embedding) + learned s h + (1 + layernorm) h
             + (1 - tied) V h (output layer)

Narayanan et al. SC21, Eq. 2: 12 h^2 + 13 h per GPT layer (kv = a, f = 4h, biases, LayerNorm).

A mixture-of-experts layer replaces its MLP by `experts` routed MLPs (expert_ffn_hidden wide),
`shared_experts` shared ones (one MLP shared_experts x shared_expert_ffn_hidden wide, as the
stacks build them) and a router (h x experts, with a bias when `bias`). Multi-head latent
attention (DeepSeek-V2, Sec. 2.1) replaces the q, k, v projections:

    q      = h r_q + r_q + r_q a (d_nope + d_rope)      (compressed, with its RMSNorm; r_q = 0:
                                                         h a (d_nope + d_rope))
    kv     = h (r_kv + d_rope) + r_kv + r_kv a (d_nope + d_v)
    output = a d_v h + bias h

Active parameters per token: the model less the routed experts a token is not sent to,
(experts - top_k) expert MLPs in each MoE layer (`active`); reported (`reported`: `perfmodel
presets`, `active_parameters` in --json) as the model's card counts them (TransformerSpec.
active_count): all of them (Mistral AI and Qwen: Mixtral 8x7B's 12.9B, Qwen1.5-MoE-A2.7B's
2.7B), less the input embedding table (OpenAI's gpt-oss card, DeepSeek-V3's 36.7B), or less it
and an untied output layer (Zhipu AI's GLM-4.5: 32B).

Not counted (no published count resolves them): Qwen3's per-head q/k RMSNorm weights
(2 head_dim per layer), Qwen2-MoE's shared-expert gate (h per layer), DeepSeek-V3's router
score-correction bias (experts per layer): under 1e-5 of each model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfmodel.specs.model import TransformerSpec

# an MTP module's norms: of the previous depth's hidden state and of the embedding, and its own
# final norm before the shared output layer (Megatron-Core's MultiTokenPredictionLayer: enorm,
# hnorm, final_layernorm; DeepSeek-V3's weights: enorm, hnorm, shared_head.norm)
MTP_NORMS = 3


@dataclass(frozen=True, kw_only=True)
class ParameterCounts:
    """total: the model's parameters (DeepSeek-V3's multi-token-prediction modules apart);
    active: those one token's forward pass uses (total for a dense model); embedding: the input
    embedding table and learned positions; mtp: the multi-token-prediction modules' own
    parameters (their embedding and output layer are the model's); output: an untied output
    layer's; reported: active as the model's card counts it."""

    total: int
    active: int
    embedding: int
    mtp: int = 0
    output: int = 0  # an untied output layer's (0 when tied to the embedding)
    active_count: str = "all"  # TransformerSpec.active_count: what `reported` leaves out

    @property
    def sparse(self) -> bool:
        return self.active != self.total

    @property
    def reported(self) -> int:
        """The active count as the model's card counts it (active_count): all, less the
        embedding table (no_embedding), or less it and an untied output layer (no_embeddings);
        `total` for a dense model."""
        if not self.sparse:
            return self.total
        left_out = {"all": 0, "no_embedding": self.embedding,
                    "no_embeddings": self.embedding + self.output}[self.active_count]
        return self.active - left_out

    def describe(self) -> str:
        """'46.70B parameters, 12.88B active' (the active count only where it differs, as
        `reported`; '5.13B active without the embedding' where the card leaves it out)."""
        text = f"{fmt_count(self.total)} parameters"
        if not self.sparse:
            return text
        how = {"all": "", "no_embedding": " without the embedding",
               "no_embeddings": " without the embedding and output layer"}[self.active_count]
        return text + f", {fmt_count(self.reported)} active{how}"


def fmt_count(n: float) -> str:
    """A parameter count: 8.03B, 596.0M, 65,536."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,.0f}"


def mlp_parameters(hidden: int, width: int, *, gated: bool, bias: bool) -> int:
    """One MLP (or expert): up (and gate) and down projections, with their biases.
    (1 + gated) f h + f h + bias ((1 + gated) f + h)."""
    up = (1 + gated) * width
    return up * hidden + width * hidden + bias * (up + hidden)


def attention_parameters(m: TransformerSpec) -> int:
    """One layer's attention: projections, biases, sinks (see the module's formulas)."""
    h, a = m.hidden, m.heads
    if m.kv_lora_rank is not None:  # multi-head latent attention
        nope, rope, v = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        assert nope is not None and rope is not None and v is not None  # checked by the spec
        rq, rkv = m.q_lora_rank, m.kv_lora_rank
        q = h * a * (nope + rope) if rq is None else h * rq + rq + rq * a * (nope + rope)
        kv = h * (rkv + rope) + rkv + rkv * a * (nope + v)
        return q + kv + a * v * h + m.bias * h + m.attention_sinks * a
    d, kv_heads = m.head_dim, m.kv_heads
    assert d is not None and kv_heads is not None and m.qkv_bias is not None
    qkv_out = a * d + 2 * kv_heads * d
    return (qkv_out * h + a * d * h + m.qkv_bias * qkv_out + m.bias * h
            + m.attention_sinks * a)


def expert_parameters(m: TransformerSpec) -> int:
    """One routed expert's MLP."""
    return mlp_parameters(m.hidden, m.expert_ffn_hidden or 0, gated=m.gated_mlp, bias=m.bias)


def moe_ffn_parameters(m: TransformerSpec) -> int:
    """A mixture-of-experts layer's MLP part: routed experts, shared experts, router."""
    # the shared experts are one MLP as wide as all of them, as the stacks build them
    # (Megatron-Core's SharedExpertMLP, Hugging Face's DeepseekV2/V3 MoE: n x their width), one
    # down-projection bias for all of them (the step model's f_sh; before 2026-12-07 one each)
    shared = mlp_parameters(m.hidden, m.shared_experts * (m.shared_expert_ffn_hidden or 0),
                            gated=m.gated_mlp, bias=m.bias) if m.shared_experts else 0
    router = m.hidden * m.experts + m.bias * m.experts
    return m.experts * expert_parameters(m) + shared + router


def layer_parameters(m: TransformerSpec, moe: bool) -> int:
    """One layer: attention, its MLP (dense, or the experts'), two norms."""
    norms = 2 * (1 + (m.norm == "layernorm")) * m.hidden
    ffn = moe_ffn_parameters(m) if moe else mlp_parameters(
        m.hidden, m.ffn_hidden or 0, gated=m.gated_mlp, bias=m.bias)
    return attention_parameters(m) + ffn + norms


def parameter_counts(m: TransformerSpec) -> ParameterCounts:
    """Total, active and embedding parameters of a transformer spec (and its MTP modules')."""
    moe = m.moe_layer_count
    layers = moe * layer_parameters(m, True) + (m.layers - moe) * layer_parameters(m, False)
    embedding = m.vocab * m.hidden + (m.position_embedding == "learned") * m.seq_len * m.hidden
    final_norm = (1 + (m.norm == "layernorm")) * m.hidden
    output = (not m.tied_embeddings) * m.vocab * m.hidden
    total = layers + embedding + final_norm + output
    unused = moe * (m.experts - (m.top_k or 0)) * expert_parameters(m)
    # an MTP module (DeepSeek-V3 Sec. 2.2): a layer like the last, the 2h x h projection of the
    # concatenated hidden state and embedding, the two RMSNorms before it and its own final
    # norm before the shared output layer (DeepSeek-V3's shared_head.norm, Megatron-Core's
    # MultiTokenPredictionLayer.final_layernorm; left out before 2026-12-07)
    last_moe = bool(moe) and (m.layers - 1) in m.moe_layers
    mtp = m.mtp_layers * (layer_parameters(m, last_moe) + 2 * m.hidden * m.hidden
                          + MTP_NORMS * final_norm)
    return ParameterCounts(total=total, active=total - unused, embedding=embedding, mtp=mtp,
                           output=output, active_count=m.active_count)
