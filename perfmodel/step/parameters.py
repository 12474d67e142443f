"""The parameters: of the model, and of each stage on one GPU (perfmodel.costs.memory).

On one GPU a layer holds its matrices / tp (Megatron 1D and the 3d cube), / (q_a q_b) (a 2d or
2.5d grid, copied over the depth), and its norms' vectors / q_a on a grid (whole in 1D). The first
stage also holds the embedding (vocabulary / tp) and learned positions; the last the final norm
and the output layer (V h / tp), unless tied with one stage (a tied output layer on a separate
last stage keeps its own copy, as Megatron-LM does).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import memory as M
from perfmodel.step.context import Context


@dataclass(frozen=True)
class Parameters:
    layer: dict[str, sp.Expr]  # one layer's, "sharded" by tensor parallelism and "replicated"
    layer_per_gpu: sp.Expr
    embedding: dict[str, sp.Expr]  # "sharded" (the word embedding), "replicated" (positions)
    final_norm: sp.Expr
    per_stage: dict[str, sp.Expr]  # first, last, middle: on one GPU of the stage
    per_gpu: sp.Expr  # the largest stage's
    total: sp.Expr  # the model's


def parameters(c: Context) -> Parameters:
    h, V, L, tp, qa, qb = S.h, S.V, S.L, S.tp, S.q_a, S.q_b
    n, single, tied = c.stage_layers, c.single, c.tied
    lp = M.layer_params(h, S.a, S.kv, S.f, gated=c.gated, bias=c.bias, qkv_bias=c.qkv_bias,
                        layernorm=c.layernorm, d=c.d, sinks=int(c.fam.attention_sinks))
    layer_gpu = lp["sharded"] / (c.megatron * tp + c.grid2 * qa * qb + c.grid3 * tp) \
        + lp["replicated"] / (c.megatron + (1 - c.megatron) * qa)
    emb = M.embedding_params(h, V, S.s, learned_positions=c.learned_positions)
    final_norm = (1 + c.layernorm) * h
    output_gpu = V * h / tp
    per_stage = {
        "first": n["first"] * layer_gpu + emb["sharded"] / tp + emb["replicated"]
        + single * (final_norm + (1 - tied) * output_gpu),
        "last": n["last"] * layer_gpu + final_norm + output_gpu * (1 - tied * single)
        + single * (emb["sharded"] / tp + emb["replicated"]),
        "middle": n["middle"] * layer_gpu,
    }
    total = L * (lp["sharded"] + lp["replicated"]) + emb["sharded"] + emb["replicated"] \
        + final_norm + (1 - tied) * V * h
    return Parameters(lp, layer_gpu, emb, final_norm, per_stage,
                      sp.Max(*per_stage.values(), evaluate=False), total)
