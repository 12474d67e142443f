"""The parameters: of the model, and of each stage on one GPU (perfmodel.costs.memory).

On one GPU a layer holds its matrices / tp (Megatron 1D and the 3d cube), / (q_a q_b) (a 2d or
2.5d grid, copied over the depth), and its norms' vectors / q_a on a grid (whole in 1D). The first
stage also holds the embedding (vocabulary / tp) and learned positions; the last the final norm
and the output layer (V h / tp), unless tied with one stage (a tied output layer on a separate
last stage keeps its own copy, as Megatron-LM does).

A mixture of experts: an MoE layer holds its attention, norms, router (whole on every tp rank)
and shared experts (split over tp, as a dense MLP) like a dense layer, and E / ep routed experts,
each whole or, with expert tensor parallelism, a 1 / etp slice of it (perfmodel.costs.moe.
expert_params): `experts` per stage, whose gradients and optimizer states the
expert-data-parallel group shards (perfmodel.step.memory). Multi-head latent attention:
perfmodel.costs.mla.mla_params. The multi-token-prediction modules (DeepSeek-V3, Sec. 2.2) sit on
the last stage: each a layer like the model's last, a 2h x h projection and two norms, and, with
several stages, a copy of the embedding they share with the first (not in `total`, as
perfmodel.params counts them apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import memory as M
from perfmodel.costs import mla as MLA
from perfmodel.costs import moe as MOE
from perfmodel.costs.lattice import lmax
from perfmodel.params import MTP_NORMS
from perfmodel.step.context import Context

ZERO = sp.Integer(0)
MTP_PROJECTION = M.MTP_PROJECTION


def _layer_params(c: Context) -> dict[str, sp.Expr]:
    """A dense layer's parameters, "sharded" over tp and "replicated" (perfmodel.costs.memory.
    layer_params; MLA's attention from perfmodel.costs.mla)."""
    h, a, f = S.h, S.a, S.f
    sinks = int(c.fam.attention_sinks)
    lp = M.layer_params(h, a, S.kv, f, gated=c.gated, bias=c.bias, qkv_bias=c.qkv_bias,
                        layernorm=c.layernorm, d=c.d, sinks=sinks)
    if not c.fam.mla:
        return lp
    standard = M.layer_params(h, a, S.kv, f, gated=c.gated, bias=c.bias, qkv_bias=0,
                              layernorm=c.layernorm, d=c.d, sinks=sinks)
    attention = (a * c.d + 2 * S.kv * c.d) * h + a * c.d * h  # the standard q, k, v, o
    mla = MLA.mla_params(h, a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v,
                         q_lora=c.fam.mla_q_lora, bias=0)
    return {"sharded": standard["sharded"] - attention + mla["sharded"],
            "replicated": standard["replicated"] + mla["replicated"]}


def _mlp_params(c: Context, width: sp.Expr) -> dict[str, sp.Expr]:
    """A tensor-parallel MLP `width` wide: up (and gate) and down with their biases (the down
    projection's bias whole on every rank)."""
    up = (1 + c.gated) * width
    return {"sharded": up * S.h + width * S.h + c.bias * up, "replicated": c.bias * S.h}


@dataclass(frozen=True)
class Parameters:
    layer: dict[str, sp.Expr]  # one layer's, "sharded" by tensor parallelism and "replicated"
    layer_per_gpu: sp.Expr
    embedding: dict[str, sp.Expr]  # "sharded" (the word embedding), "replicated" (positions)
    final_norm: sp.Expr
    per_stage: dict[str, sp.Expr]  # first, last, middle: on one GPU of the stage (experts too)
    per_gpu: sp.Expr  # the largest stage's
    total: sp.Expr  # the model's
    # the routed experts' on one GPU of each stage (0 without experts), and the larger's
    experts: dict[str, sp.Expr] = field(
        default_factory=lambda: {"first": ZERO, "last": ZERO, "middle": ZERO})
    experts_per_gpu: sp.Expr = sp.Integer(0)
    # an MoE layer's on one GPU, its E / ep routed experts with it (0 without experts)
    moe_layer_per_gpu: sp.Expr = sp.Integer(0)
    # the multi-token-prediction modules' on one GPU of each stage (beside the output layer,
    # with their copy of the embedding; 0 without them), part of per_stage
    mtp: dict[str, sp.Expr] = field(
        default_factory=lambda: {"first": ZERO, "last": ZERO, "middle": ZERO})
    # one MoE layer's E / ep routed experts on one GPU, part of moe_layer_per_gpu
    moe_layer_experts_per_gpu: sp.Expr = sp.Integer(0)

    @property
    def dense_per_gpu(self) -> sp.Expr:
        """What the data-parallel (dp x cp) group syncs: the larger stage's parameters but its
        routed experts (all of them without experts)."""
        if self.experts_per_gpu == 0:
            return self.per_gpu
        return lmax(*(self.per_stage[st] - self.experts[st] for st in self.per_stage))


def parameters(c: Context) -> Parameters:
    h, V, L, tp, qa, qb = S.h, S.V, S.L, S.tp, S.q_a, S.q_b
    n, single, tied = c.stage_layers, c.single, c.tied
    lp = _layer_params(c)

    def on_gpu(part: dict[str, sp.Expr]) -> sp.Expr:
        return part["sharded"] / (c.megatron * tp + c.grid2 * qa * qb + c.grid3 * tp) \
            + part["replicated"] / (c.megatron + (1 - c.megatron) * qa)

    layer_gpu = on_gpu(lp)
    emb = M.embedding_params(h, V, S.s, learned_positions=c.learned_positions)
    final_norm = (1 + c.layernorm) * h
    output_gpu = V * h / tp
    layers = {st: n[st] * layer_gpu for st in n}
    experts = {st: ZERO for st in n}
    total_layers = L * (lp["sharded"] + lp["replicated"])
    expert = MOE.expert_params(h, S.f_E, gated=c.gated, bias=c.bias)
    expert_gpu = MOE.expert_params(h, S.f_E, gated=c.gated, bias=c.bias, etp=S.etp)
    moe_layer_gpu = ZERO
    if c.fam.moe:  # an MoE layer: the dense layer less its MLP, with the router, shared experts
        from perfmodel.step.moe import moe_layers, moe_layers_total

        mlp = _mlp_params(c, S.f)
        shared = _mlp_params(c, S.f_sh) if c.fam.moe_shared else {"sharded": 0, "replicated": 0}
        router = MOE.router_params(h, S.E, bias=c.bias)
        moe = {"sharded": lp["sharded"] - mlp["sharded"] + shared["sharded"],
               "replicated": lp["replicated"] - mlp["replicated"] + shared["replicated"]
               + router}
        count = moe_layers(c)
        moe_layer_gpu = on_gpu(moe) + S.E / S.ep * expert_gpu
        for st in layers:
            experts[st] = count[st] * S.E / S.ep * expert_gpu
            layers[st] = (n[st] - count[st]) * layer_gpu + count[st] * on_gpu(moe) + experts[st]
        L_moe = moe_layers_total(c)
        total_layers = (L - L_moe) * (lp["sharded"] + lp["replicated"]) \
            + L_moe * (moe["sharded"] + moe["replicated"] + S.E * expert)
    # the output layer's stage: the last, or zbv's first (Context.head_first)
    head = {"first": c.head_first, "last": 1 - c.head_first}
    mtp = {st: ZERO for st in n}
    if c.fam.mtp:  # beside the output layer: D modules, with the embedding where it is not
        last_moe = c.fam.moe and (c.fam.mtp_last_moe)
        module = MTP_PROJECTION * h * h / tp + MTP_NORMS * final_norm
        if last_moe:
            module += on_gpu(moe) + S.E / S.ep * expert_gpu
        else:
            module += layer_gpu
        for st, on in head.items():
            if last_moe:
                experts[st] += on * S.D_mtp * S.E / S.ep * expert_gpu
            mtp[st] = on * (S.D_mtp * module + (c.multi - c.head_first) * emb["sharded"] / tp)
            layers[st] += mtp[st]
    per_stage = {
        "first": layers["first"] + emb["sharded"] / tp + emb["replicated"]
        + (single + c.head_first) * (final_norm + (1 - tied) * output_gpu),
        "last": layers["last"] + head["last"] * (final_norm + output_gpu * (1 - tied * single))
        + single * (emb["sharded"] / tp + emb["replicated"]),
        "middle": layers["middle"],
    }
    total = total_layers + emb["sharded"] + emb["replicated"] \
        + final_norm + (1 - tied) * V * h
    return Parameters(lp, layer_gpu, emb, final_norm, per_stage,
                      lmax(*per_stage.values()), total,
                      experts, lmax(*experts.values()) if c.fam.moe else ZERO, moe_layer_gpu,
                      mtp, S.E / S.ep * expert_gpu if c.fam.moe else ZERO)
