"""Multi-token prediction (DeepSeek-V3, Sec. 2.2): D sequential modules on the last pipeline stage,
each predicting one token further. A module embeds the shifted tokens with the shared embedding,
normalises the previous depth's hidden state and that embedding (two RMSNorms), projects their
concatenation 2h -> h, runs one transformer layer like the model's last (MoE where it is) and the
shared output layer with its loss. Per micro-batch, on the last stage's rank:

    t_fwd = D (t_layer + t_projection + t_norms + t_output + t_embedding)
    t_bwd = D (2 (t_gemm + t_elementwise) + t_attention_bwd + 2 (t_projection + t_norms
               + t_output + t_embedding))

with the layer's communication (tensor, context and expert parallel) as a layer's, issued in the
modules' phases. Megatron-Core places them so (mtp_num_layers, on the last stage) and counts
their FLOPs in num_floating_point_operations; the modules are not recomputed here. An fp8 plan
runs the projection in FP8 with its casts (a TE linear under the FP8 autocast; its weights and
scaling state: perfmodel.step.fp8).
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.params import MTP_NORMS
from perfmodel.step import context_parallel as CP
from perfmodel.step import embedding_head as EH
from perfmodel.step import tensor_parallel as TP
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context, linear_gemm_time
from perfmodel.step.framework import BACKWARD_PER_FORWARD, PartCost
from perfmodel.step.layer import LayerWork, layer_work

PREFIX = "mtp"
NORMS = MTP_NORMS  # of the hidden state and the embedding, and the module's final norm
PROJECTION_IN = 2  # [hidden; embedding]: 2h -> h


def module_work(c: Context) -> LayerWork:
    """One module's layer on one rank (as the model's last layer), per micro-batch forward."""
    return layer_work(c, moe=c.fam.mtp_last_moe)


def projection_s(c: Context) -> sp.Expr:
    """The 2h -> h projection and the two norms of one module [s]; an fp8 plan's projection on
    the FP8 device (Megatron-Core's eh_proj is a TE column-parallel linear, run under the FP8
    autocast: MultiTokenPredictionLayer._proj_and_transformer_layer)."""
    gemm = linear_gemm_time(c, K.Gemm("mtp_projection", c.T, S.h / S.tp, PROJECTION_IN * S.h))
    return gemm + K.memory_time(NORMS * 2 * S.e * c.T * S.h / c.act_ranks, c.dev)


def projection_fp8_cast_s(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """An fp8 plan's casts of one module's projection [s], forward and backward
    (perfmodel.step.fp8's counting): its input 2 T h / r (cast on the shard, then gathered) and
    its grad output T h / tp, q_8 bytes each."""
    forward = PROJECTION_IN * c.T * S.h / c.act_ranks
    backward = c.T * S.h / S.tp
    return (K.memory_time(S.q8 * forward, c.dev), K.memory_time(S.q8 * backward, c.dev))


def mtp_collectives(c: Context) -> list[Collective]:
    """The modules' layers' collectives, on the stage with the output layer (every plan's ledger:
    with one stage the last is rank 0's)."""
    if not c.fam.mtp:
        return []
    from perfmodel.step.moe import ep_collectives

    d = S.D_mtp
    mlp = 0 if c.fam.mtp_last_moe and not c.fam.moe_shared else 1  # an MLP's tp collectives
    if c.fam.mla:
        out = TP.mla_collectives(c, d, prefix=PREFIX, stage="output", recomputed=False)
        out += TP.megatron_collectives(c, mlp * d, prefix=PREFIX, stage="output",
                                       recomputed=False)
    else:
        out = TP.megatron_collectives(c, (1 + mlp) * d, prefix=PREFIX, stage="output",
                                      recomputed=False)
    out += CP.cp_collectives(c, d, prefix=f"{PREFIX}/cp", stage="output", recomputed=False)
    if c.fam.mtp_last_moe:
        out += ep_collectives(c, {"output": d}, prefix=PREFIX, recomputed=False)
    return out


def mtp_phases(c: Context, costs: Mapping[str, PartCost],
               issued: Mapping[str, tuple[Collective, ...]],
               present: sp.Expr) -> tuple[Phase, ...]:
    """The modules' forward and backward (module doc) on a stage that holds the output layer
    (present), with their collectives (the tensor-parallel ones behind their GEMMs where the plan
    overlaps them, as a layer's: perfmodel.step.tensor_parallel.layer_overlaps). Host: each
    module's layer and output layer as the model's (framework.PartCost: their ops x the cost of
    one; on synchronous ranks the layer's kernels and the output layer's, each at the layer's
    kernel cost)."""
    if not c.fam.mtp:
        return ()
    d, work = S.D_mtp, module_work(c)
    # the projection and the embedding: twice their forward backward; the output layer its own
    # (its loss's backward is not twice its forward)
    inner = projection_s(c) + EH.embedding_forward_s(c)
    ends = inner + EH.output_forward_s(c)
    back_ends = BACKWARD_PER_FORWARD * inner + EH.output_backward_s(c)
    layer, output = costs["layer"], costs["output"]
    per_output_op = output.kernel_s if c.asynchronous else layer.kernel_s
    per_output_op_b = output.backward_kernel_s if c.asynchronous else layer.backward_kernel_s
    kernels = d * (layer.kernel_s * layer.forward_ops + per_output_op * output.forward_ops)
    back_kernels = d * (layer.backward_kernel_s * layer.backward_ops
                        + per_output_op_b * output.backward_ops)
    moe = c.fam.mtp_last_moe
    attention = not c.fam.mla
    mlps = ((d, S.f_sh),) if moe and c.fam.moe_shared else () if moe else ((d, S.f),)
    overlaps, lost = TP.layer_overlaps(c, d, attention, mlps, prefix=f"{PREFIX}@last") \
        if attention or mlps else ({}, {})
    if c.fam.mla:  # the latents gathered again (perfmodel.step.tensor_parallel)
        key = f"{PREFIX}@last/backward"
        overlaps = {**overlaps, key: overlaps.get(key, ()) + (TP.mla_regather_overlap(c, d),)}

    def extra(name: str) -> dict[str, sp.Expr]:
        return {"compute/tp_overlap": lost[name]} if name in lost else {}

    forward_terms = {k: d * v for k, v in work.forward_terms().items()}
    backward_terms = {k: d * v for k, v in work.backward_terms().items()}
    if c.fam.fp8:  # the projections' casts with the layers'
        cast, cast_backward = projection_fp8_cast_s(c)
        forward_terms["compute/forward/fp8_cast"] += d * cast
        backward_terms["compute/backward/fp8_cast"] += d * cast_backward
    name = f"{PREFIX}@last/forward"
    forward = Phase(
        name=name, present=present,
        device={**forward_terms,
                "compute/forward/embedding_logits": d * ends, **extra(name)},
        host={"overhead/kernels": kernels}, comms=issued.get(name, ()),
        overlaps=overlaps.get(name, ()))
    name = f"{PREFIX}@last/backward"
    backward = Phase(
        name=name, present=present,
        device={**backward_terms,
                "compute/backward/embedding_logits": d * back_ends,
                **extra(name)},
        host={"overhead/kernels": back_kernels}, comms=issued.get(name, ()),
        overlaps=overlaps.get(name, ()))
    cp = CP.cp_phases(c, work.times(d), issued, prefix=f"{PREFIX}/cp", recomputed=False,
                      present=present)
    return (forward, backward, *cp)


def mtp_flops(c: Context, layer_flops: sp.Expr, logits_flops: sp.Expr) -> sp.Expr:
    """The modules' forward FLOPs per micro-batch of one replica: D (the layer's, the
    projection's 2 T 2h h, the output layer's)."""
    projection = 2 * c.tokens * PROJECTION_IN * S.h * S.h
    return S.D_mtp * (layer_flops + projection + logits_flops)
