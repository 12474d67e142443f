"""The tensor-parallel collectives: each declared once (perfmodel.step.collective).

Megatron 1D (Shoeybi et al. 2019, Sec. 3): per layer, forward, an all-reduce after the attention
and one after the MLP (the f and g operators of their Fig. 3); with sequence parallelism each
becomes an all-gather before and a reduce-scatter after (Korthikanti et al. 2022, Sec. 4.2.2).
The backward issues the same collectives again (their adjoints), recompute repeats the forward's.
All carry a full activation, e T h bytes; an fp8 plan's forward all-gathers (and recompute's) carry
the QKV and MLP-up inputs in FP8, e_8 T h: Transformer Engine casts the shard, then gathers it
(TE docs, the te.Linear walkthrough: "quantize locally first, then all-gather the quantized data";
TE 1.x's LayerNormLinear gathers the norm's FP8 output likewise). The backward's all-gathers (of
grad outputs) and every reduce-scatter and all-reduce (GEMM outputs, bf16) stay e T h.
2d / 2.5d / 3d grids: the collectives of each linear layer and norm (perfmodel.costs.layouts).
Embedding (vocabulary-parallel): its output all-reduced forward; with sequence parallelism the
sequence is then split (its backward all-gathers), and without learned positions the all-reduce
and split fuse into a reduce-scatter (Megatron-LM). Output layer: its input gathered (SP) forward
and reduced backward; cross entropy all-reduces max, sum and target logits over T fp32 values.
Sequence parallelism leaves the norms' weight gradients partial: one all-reduce per step of every
norm vector (Megatron-LM allreduce_layernorm_grads).
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import layouts as LY
from perfmodel.costs import mla as MLA
from perfmodel.costs.compute import FP32_BYTES
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context

ONE = sp.Integer(1)
COLLECTIVES_PER_LAYER = 2  # Megatron 1D, per layer and direction: after attention, after MLP
CROSS_ENTROPY_ALL_REDUCES = 3  # the logits' max, the sum of their exponentials, the target logit
NORMS_PER_LAYER = 2  # before the attention and before the MLP


def _tp(c: Context, name: str, op: str, nbytes: sp.Expr, calls: sp.Expr, phase: str,
        in_phase: str, axis: str = "tp", stage: str = "every") -> Collective:
    return Collective(name=name, op=op, axis=axis, nbytes=nbytes, calls=calls, phase=phase,
                      in_phase=in_phase, term="comm/tp", fam=c.fam, stage=stage)


def megatron_collectives(c: Context, count: sp.Expr, prefix: str = "layers",
                         stage: str = "every", share: sp.Expr = ONE,
                         recomputed: bool = True) -> list[Collective]:
    """Megatron 1D's collectives of `count` sub-layers (an attention or an MLP each) per
    micro-batch, issued in the phases <prefix>/forward, /backward, /recompute on `stage` (its
    ledger calls x share)."""
    sp_ = c.seq_parallel
    act_bytes = S.e * c.T * S.h
    fp8_gather = S.e8 * c.T * S.h if c.fam.fp8 else act_bytes  # the GEMM inputs, cast first
    out = []
    # recompute repeats the forward's (full), or all but the reduce-scatters, whose outputs
    # torchtitan's per-op recompute keeps (op)
    recompute = {"all_gather": c.full + c.op, "reduce_scatter": c.full,
                 "all_reduce": c.full + c.op}
    where = prefix if stage == "every" else f"{prefix}@{stage}"
    directions: list[tuple[str, str, dict[str, sp.Expr] | None]] = [
        (f"{where}/forward", "fwd", None), (f"{where}/backward", "bwd", None)]
    if recomputed:
        directions.append((f"{where}/recompute", "bwd", recompute))
    for in_phase, phase, repeat in directions:
        for op, part in (("all_gather", sp_), ("reduce_scatter", sp_), ("all_reduce", 1 - sp_)):
            times = 1 if repeat is None else repeat[op]
            calls = c.megatron * times * part * count
            forward_gather = op == "all_gather" and not in_phase.endswith("/backward")
            nbytes = fp8_gather if forward_gather else act_bytes
            out.append(Collective(name=f"tp/layer/{op}", op=op, axis="tp", nbytes=nbytes,
                                  calls=calls, phase=phase, in_phase=in_phase, term="comm/tp",
                                  fam=c.fam, stage=stage, ledger_share=share))
    return out


def mla_collectives(c: Context, count: sp.Expr, prefix: str = "layers", stage: str = "every",
                    recomputed: bool = True) -> list[Collective]:
    """Multi-head latent attention's tensor-parallel collectives of `count` layers per micro-batch
    (perfmodel.costs.mla): with sequence parallelism, forward an all-gather of each latent (e T
    w, w = r_q (or h), r_kv, d_rope) and a reduce-scatter of the output (e T h), backward their
    adjoints (reduce-scatters of the latents' gradients, an all-gather of the output's);
    without it, an all-reduce of the output forward and of each latent's gradient backward.
    Full recompute repeats the forward's."""
    sp_, e, T = c.seq_parallel, S.e, c.T
    latents = MLA.latent_widths(S.r_q, S.r_kv, S.d_rope, S.h, q_lora=c.fam.mla_q_lora)
    where = prefix if stage == "every" else f"{prefix}@{stage}"
    out: list[Collective] = []

    def add(op: str, width: sp.Expr, calls: sp.Expr, phase: str, pass_: str) -> None:
        out.append(Collective(name=f"tp/mla/{op}", op=op, axis="tp", nbytes=e * T * width,
                              calls=c.megatron * calls * count, phase=phase,
                              in_phase=f"{where}/{pass_}", term="comm/tp", fam=c.fam,
                              stage=stage))

    repeats = [("forward", "fwd", sp.Integer(1))]
    if recomputed:
        repeats.append(("recompute", "bwd", c.full))
    for pass_, phase, times in repeats:
        for w in latents:
            add("all_gather", w, times * sp_, phase, pass_)
        add("reduce_scatter", S.h, times * sp_, phase, pass_)
        add("all_reduce", S.h, times * (1 - sp_), phase, pass_)
    for w in latents:
        add("reduce_scatter", w, sp_, "bwd", "backward")
        add("all_reduce", w, 1 - sp_, "bwd", "backward")
    add("all_gather", S.h, sp_, "bwd", "backward")
    return out


def layer_collectives(c: Context) -> list[Collective]:
    """The collectives of the stage's L/pp layers per micro-batch: Megatron 1D, then the grids'.
    A mixture of experts whose MoE layers have no shared experts issues none for their MLP (the
    experts are whole on each rank, which routes its own tokens): the attention's of every
    layer, the MLP's of each stage's dense layers."""
    n = c.layers_per_stage
    if c.fam.mla:  # the attention's own (mla_collectives), the MLPs' as a dense layer's
        out = mla_collectives(c, n)
        if not c.fam.moe or c.fam.moe_shared:
            return out + megatron_collectives(c, n)
        from perfmodel.step.moe import moe_layers

        moe = moe_layers(c)
        for st, share in (("first", sp.Integer(1)), ("last", c.multi)):
            out += megatron_collectives(c, n - moe[st], stage=st, share=share)
        return out
    if c.fam.moe and not c.fam.moe_shared:
        from perfmodel.step.moe import moe_layers

        moe = moe_layers(c)
        out = megatron_collectives(c, n)
        for st, share in (("first", sp.Integer(1)), ("last", c.multi)):
            out += megatron_collectives(c, n - moe[st], stage=st, share=share)
        return out
    out = megatron_collectives(c, COLLECTIVES_PER_LAYER * n)
    if c.fam.tp_layout != "1d":  # 2d / 2.5d / 3d grids: see perfmodel.costs.layouts
        out += _grid_collectives(c)
    return out


def _grid_collectives(c: Context) -> list[Collective]:
    h, a, kv, f, e, qa, qc, T = S.h, S.a, S.kv, S.f, S.e, S.q_a, S.q_c, c.T
    linears = LY.linear_shapes(h, a, kv, f, c.gated, c.d)
    vectors = 1 + c.layernorm  # weight and bias, or RMSNorm's weight
    grid2, grid3 = c.grid2, c.grid3
    ops = [(grid2, op) for _, K_, M_ in linears for op in LY.summa_comm(T, K_, M_, e, qa, qc)]
    ops += [(grid3, op) for name, K_, M_ in linears
            for op in LY.cube_comm(T, K_, M_, e, qa,
                                   swapped=name in ("attention_output", "mlp_down"))]
    ops += [(grid2, op) for op in LY.norm_comm(T, qa * qc, "tpa")]
    ops += [(grid3, op) for op in LY.norm_comm(T, qa * qa, "tpb")]
    ops += [(grid2, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors, ("tpb",))]
    ops += [(grid3, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors, ("tpa", "tpc"))]
    out = []
    for weight, op in ops:
        issued = [(op.phase, "layers/forward" if op.phase == "fwd" else "layers/backward", 1)]
        if op.phase == "fwd":  # recomputed with the forward
            issued.append(("bwd", "layers/recompute", c.full + c.op))
        for phase, in_phase, repeat in issued:
            calls = weight * repeat * op.count * c.layers_per_stage
            out.append(_tp(c, f"{op.axis}/layer/{op.op}", op.op, op.nbytes, calls, phase,
                           in_phase, axis=op.axis))
    return out


def embedding_collectives(c: Context) -> list[Collective]:
    """The embedding's, per micro-batch on the first stage."""
    act_bytes = S.e * c.T * S.h
    fused = c.seq_parallel * (1 - c.learned_positions)  # 1: reduce-scatter instead of all-reduce
    return [_tp(c, f"tp/embedding/{op}", op, act_bytes, calls, phase, f"embedding/{direction}",
                stage="first")
            for op, calls, phase, direction in (
                ("reduce_scatter", fused, "fwd", "forward"),
                ("all_reduce", 1 - fused, "fwd", "forward"),
                ("all_gather", c.seq_parallel, "bwd", "backward"))]


def output_collectives(c: Context) -> list[Collective]:
    """The output layer's and the loss's, per micro-batch on the last stage."""
    act_bytes, sp_ = S.e * c.T * S.h, c.seq_parallel
    return [
        _tp(c, "tp/output/all_gather", "all_gather", act_bytes, sp_, "fwd", "output/forward",
            stage="last"),
        _tp(c, "tp/output/reduce_scatter", "reduce_scatter", act_bytes, sp_, "bwd",
            "output/backward", stage="last"),
        _tp(c, "tp/output/all_reduce", "all_reduce", act_bytes, 1 - sp_, "bwd", "output/backward",
            stage="last"),
        _tp(c, "tp/cross_entropy/all_reduce", "all_reduce", FP32_BYTES * c.T,
            sp.Integer(CROSS_ENTROPY_ALL_REDUCES), "fwd", "output/forward", stage="last"),
    ]


def norm_grad_collectives(c: Context) -> list[Collective]:
    """Per step, with sequence parallelism: one all-reduce of every norm vector of the stage (two
    per layer and the final norm; LayerNorm has a weight and a bias, RMSNorm a weight), and of
    an MoE layer's router (Megatron-Core all-reduces the routers' gradients over tp with the
    norms')."""
    vectors = (1 + c.layernorm) * S.h * (NORMS_PER_LAYER * c.layers_per_stage + 1)
    if c.fam.moe:  # the routers, whole on every tp rank, each rank's over its own tokens
        from perfmodel.costs.moe import router_params
        from perfmodel.step.moe import moe_layers

        vectors += moe_layers(c)["first"] * router_params(S.h, S.E, bias=c.bias)
    if c.fam.mla:  # the down projections and the latents' norms, whole on every tp rank, each
        # over its own tokens with sequence parallelism
        down = MLA.mla_params(S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v,
                              q_lora=c.fam.mla_q_lora, bias=0)["replicated"]
        vectors += c.layers_per_stage * down
    return [Collective(name="tp/norm_grads/all_reduce", op="all_reduce", axis="tp",
                       nbytes=S.wbytes * vectors, calls=c.seq_parallel, phase="step",
                       in_phase="tensor_parallel/norm_grads", term="comm/tp_grads", fam=c.fam)]


def norm_grad_phase(issued: Mapping[str, tuple[Collective, ...]]) -> Phase:
    name = "tensor_parallel/norm_grads"
    return Phase(name=name, comms=issued.get(name, ()), per_step=True)
