"""A mixture of experts in the step model: which of a stage's layers are MoE, an MoE layer's MLP
on one rank, and its expert-parallel collectives.

An MoE layer's MLP on one rank, per micro-batch (perfmodel.costs.moe for T_r, m, A_r):
    router    GEMM T_r x h @ h x E
    experts   the rank's E / ep experts as one grouped GEMM (Megatron-Core's GroupedMLP): each
              expert's up (and gate) and down GEMMs at its own token count, at the GEMM
              efficiency of that shape (perfmodel.costs.gemm_efficiency), the kernel floor once:
                dropless: (E/ep - 1) t(m (E - rho) / (E - 1)) + t(rho m)  (the busiest expert on
                          the slowest rank, the E - 1 others sharing the rest)
                capacity: E/ep t(etp ep C)                (padded buffers)
              with expert tensor parallelism each expert's slice f_E / etp wide (up column-,
              down row-parallel) over the rows of its etp ranks, m = etp ep T_r k / E
    shared    the shared experts, a tensor-parallel MLP f_sh wide over T tokens
    element-wise: the router's softmax and top-k, the permutation to the experts and back, the
              experts' activation (perfmodel.costs.moe.moe_elementwise_bytes); the shared
              experts' activation
Communication over the ep group (Megatron-Core's all-to-all token dispatcher; the validation
job's workload.moe), per MoE layer and micro-batch:
    dropless: an all-gather of the tokens per expert (ep E int64), then dispatch and combine by
              all-to-all, T_r k rows of h each (what a rank sends; the time of the busiest rank's,
              which receives A_r rows: x A_r / (T_r k));
    capacity: dispatch and combine of E C rows each;
both back in the backward, the forward's again when full recompute repeats the layer.
With expert tensor parallelism (etp > 1; Megatron-Core's MoEAlltoAllTokenDispatcher,
megatron/core/transformer/moe/token_dispatcher.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553):
after the dispatch the rows a rank received are all-gathered over its etp group
(dispatch_postprocess: gather_from_sequence_parallel_region over expt_tp), the experts' outputs
reduce-scattered back before the combine (combine_preprocess:
reduce_scatter_to_sequence_parallel_region), etp A_r rows of h each (nccl-tests' size: the
gathered buffer); the backward runs them the other way (a reduce-scatter and an all-gather); the
dropless token counts are all-gathered over the etp x ep ranks (preprocess: over tp_ep), etp ep E
int64. Where the experts' activation is weighted (Plan.expert_weighting activation, Megatron-Core
from 0.13; perfmodel.costs.moe.moe_activation_bytes) the routing probabilities travel with the
tokens: one all-to-all of the rows' fp32 probabilities after the tokens' (token_dispatch), its
gradient's back in the backward, and with etp > 1 their all-gather over etp (reduce-scatter
backward); DeepEP sends them inside its dispatch. Weighted at the outputs (expert_weighting output:
torchtitan, the validation job), they stay on the source rank and none is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import moe as MOE
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.costs.lattice import applied
from perfmodel.step import pipeline as PP
from perfmodel.step.collective import PHASE_STAGE, Collective, dispatch_time, group_time
from perfmodel.step.compose import Overlap, Phase, Synced
from perfmodel.step.context import Context, active, flag, linear_gemm_time, per_context
from perfmodel.step.framework import BACKWARD_PER_FORWARD, PartCost

if TYPE_CHECKING:
    from perfmodel.step.layer import LayerWork

ZERO = sp.Integer(0)
# Kernels an MoE layer's MLP launches beyond a dense MLP's, where not measured, counted from the
# layer as modelled here: the router's GEMM, its softmax and top-k, the permutation and its
# inverse; the dropless count exchange's all-gather (the dispatch's all-to-alls are counted with
# the collectives); the shared experts' two GEMMs and activation
MOE_EXTRA_KERNELS = 5
SHARED_EXPERT_KERNELS = 3
# Host ops of an MoE layer beyond a dense layer's on an asynchronous device (perfmodel.step.host's
# framework ops), counted as host.py counts a dense layer's: the validation job's MoE block
# (workload.moe.MoE: gated, bias-free experts, top-2, dropless, learned routing) under torch's
# dispatcher (every aten op, views included; torch 2.13, CPU, one micro-batch after a warm-up;
# tests/unit/test_moe_host_ops.py counts them again): beyond the dense block's 56 forward and 121
# backward ops, 9 + 8 n_local + 11 [ep > 1] forward and 3 + 26 n_local + 8 [ep > 1] backward, for
# n_local = E / ep experts on the rank: the router, its softmax and top-k, the grouping of the
# rows by expert and back, the count exchange; each local expert's MLP (three linears, the
# activation and the product: 8 forward, 26 backward, one launch or more each, as Transformer
# Engine's grouped GEMM issues a GEMM and its casts per expert); with ep > 1 the counts'
# all-gather, the all-to-alls and the regrouping. A shared expert adds one expert's ops.
MOE_HOST_OPS = (9, 3)
EXPERT_HOST_OPS = (8, 26)
EXCHANGE_HOST_OPS = (11, 8)
A2A_PER_LAYER = 2  # dispatch and combine, each direction


def moe_layers(c: Context) -> dict[str, sp.Expr]:
    """The MoE layers of the first, the last and a middle stage's rank: the stage's layers
    (perfmodel.step.context.stage_layers) but the model's dense layers among them.

    A dense layer i lies on the first or the last stage by its position in the model's chunks:
      - pp v chunks (1f1b, interleaved, zb): round r = floor(i v / L) of v, offset
        o = i - r L / v in it; each round gives rank 0 its first n_first / v layers and the last
        rank its last n_last / v (Megatron-Core's layer offsets, an uneven split's first and last
        stages' layers divided evenly over their chunks): first [o < n_first / v], last
        [o >= (L - n_last) / v]; with an even split, chunk floor(i pp v / L) mod pp = 0 or pp - 1;
      - zbv: 2 pp chunks of L / (2 pp) layers, rank 0 holds chunks 0 and 2 pp - 1, the last rank
        pp - 1 and pp (chunk floor(2 pp i / L));
    with one stage both are all of them; a pipeline layout (Plan.pipeline_layout) places each
    on the rank whose stage lists it (Family.stage_dense). A middle stage (pp >= 3: the pp - 2
    ranks between) takes the dense layers that fall on neither end, averaged over those ranks
    (its count enters the pipeline's fill and drain as (pp - 2) t_middle, which the average
    makes exact; the slowest middle rank may hold more of them). With pp <= 2 there is no middle
    stage: its layers are those of the stage whose count it repeats
    (perfmodel.step.context.stage_layers: the first unless the first's layers are given, then
    the last, none when both are given)."""
    n, (dense, _) = c.stage_layers, _dense_layers(c)
    return {st: n[st] - dense[st] for st in ("first", "last", "middle")}


def moe_recomputed(c: Context) -> dict[str, sp.Expr]:
    """The MoE layers full recompute repeats on the first, the last and a middle stage's rank,
    whole layers as the job and Megatron-Core pick them (0 under the other policies):
        n_rc,moe = full_layers(n) - (the stage's dense layers it recomputes)
    (Context.full_layers; _dense_layers places each dense layer and says whether its stage
    recomputes it). Not full x n_moe, the share of all the stage's layers times its MoE layers:
    a stage that mixes dense and MoE layers would issue a fraction of a layer's exchanges (4
    layers, layer 0 dense, one in 2 recomputed: layers 1 and 3, both MoE, 2 and not 1.5). Where a
    pipeline layout places the dense layers (Family.stage_dense: counts, not positions) their
    share is taken, full x n_moe (exact where every layer or none of a stage recomputes; a
    layout with recompute_every > 1 may differ by a layer)."""
    n = c.stage_layers
    if c.fam.stage_dense is not None:
        return {st: c.full * m for st, m in moe_layers(c).items()}
    _, recomputed = _dense_layers(c)
    return {st: c.full_layers(n[st]) - c.full_on * recomputed[st]
            for st in ("first", "last", "middle")}


def _equal(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    """[x = y] for whole numbers."""
    return 1 - sp.Min(1, applied(sp.Abs, x - y), evaluate=False)


def _below(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    """[x < y] for whole numbers."""
    return sp.Min(1, sp.Max(0, y - x, evaluate=False), evaluate=False)


def _mod(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    """x mod y for whole numbers, x - y floor(x / y) (floor prints as numpy's; Mod would not,
    perfmodel.codegen)."""
    return x - y * applied(sp.floor, x / y)


def _full_recomputes(c: Context, position: sp.Expr, offset: sp.Expr) -> sp.Expr:
    """[full recompute repeats a layer] (its flag not included) from the layer's 1-based position
    among the layers its rank builds (its chunks in order) and its 0-based offset in its chunk
    (workload.model.build_chunk): torchtitan's one in N, [position mod N = 0]; Megatron's block,
    [offset < N_rl]; uniform, every layer (N is 1 with Megatron's methods)."""
    every = _equal(_mod(position, S.N_rc), 0)
    if not c.fam.megatron_recompute:
        return every
    return S.I_block * _below(offset, S.N_rl) + (1 - S.I_block) * every


@per_context  # its dicts are only read (moe_layers and moe_recomputed build their own)
def _dense_layers(c: Context) -> tuple[dict[str, sp.Expr], dict[str, sp.Expr]]:
    """(the dense layers, those of them full recompute repeats) of the first, the last and a
    middle stage's rank (moe_layers' placement; the recompute flag not included). A dense layer's
    position on its rank (_full_recomputes): pp v chunks, 1 + r n_st / v + its offset among the
    stage's layers of round r (a middle rank's: (o - n_first / v) mod (n_middle / v)); zbv, 1 +
    its offset o_c in its chunk, + L / (2 pp) in the rank's second chunk (chunk >= pp). A
    layout's (Family.stage_dense) recomputed ones are not placed (moe_recomputed): 0."""
    n = c.stage_layers
    pp, v, L = S.pp, S.v, S.L
    stages = ("first", "last", "between")
    dense: dict[str, sp.Expr] = dict.fromkeys(stages, ZERO)
    recomputed: dict[str, sp.Expr] = dict.fromkeys(stages, ZERO)
    if c.fam.stage_dense is not None:  # where a pipeline layout places them
        dense = dict(zip(stages, map(sp.Integer, c.fam.stage_dense), strict=True))
    for i in c.fam.moe_dense_layers if c.fam.stage_dense is None else ():
        chunk = applied(sp.floor, 2 * pp * i / L)
        v_shape = {"first": _equal(chunk, 0) + _equal(chunk, 2 * pp - 1),
                   "last": _equal(chunk, pp - 1) + _equal(chunk, pp)}
        v_shape["between"] = 1 - v_shape["first"] - v_shape["last"]
        in_chunk = i - chunk * L / (2 * pp)
        v_rc = _full_recomputes(c, 1 + in_chunk + L / (2 * pp) * _below(pp - 1, chunk), in_chunk)
        r = applied(sp.floor, i * v / L)
        offset = i - r * L / v
        plain = {"first": _below(offset, n["first"] / v),
                 "last": 1 - _below(offset, (L - n["last"]) / v)}
        plain["between"] = 1 - plain["first"] - plain["last"]
        # the layer's offset among its stage's layers of round r, on each stage
        at_stage = {"first": offset, "last": offset - (L - n["last"]) / v,
                    "between": _mod(offset - n["first"] / v,
                                    sp.Max(1, n["middle"] / v, evaluate=False))}
        width = {"first": n["first"], "last": n["last"], "between": n["middle"]}
        for st in stages:
            plain_rc = _full_recomputes(c, 1 + r * width[st] / v + at_stage[st], at_stage[st])
            dense[st] += c.zbv * v_shape[st] + (1 - c.zbv) * plain[st]
            recomputed[st] += c.zbv * v_shape[st] * v_rc + (1 - c.zbv) * plain[st] * plain_rc
    return _to_stages(c, dense), _to_stages(c, recomputed)


def _to_stages(c: Context, per: dict[str, sp.Expr]) -> dict[str, sp.Expr]:
    """first, last, between -> first, last, middle: a middle stage (pp >= 3) takes those between
    averaged over its pp - 2 ranks, else repeats the stage whose count it repeats (moe_layers)."""
    pp = S.pp
    middle_exists = sp.Max(0, sp.Min(1, pp - 2, evaluate=False), evaluate=False)
    uneven = c.fam.uneven_stages is not False  # given (True) or open (None)
    given_first = sp.Min(1, S.L_first, evaluate=False) if uneven else ZERO
    given_last = sp.Min(1, S.L_last, evaluate=False) if uneven else ZERO
    repeated = (1 - given_first) * per["first"] + given_first * (1 - given_last) * per["last"]
    middle = middle_exists * per["between"] / sp.Max(1, pp - 2, evaluate=False) \
        + (1 - middle_exists) * repeated
    return {"first": per["first"], "last": per["last"], "middle": middle}


def moe_layers_total(c: Context) -> sp.Expr:
    """The model's MoE layers."""
    return S.L - len(c.fam.moe_dense_layers)


def routed_tokens(c: Context) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]:
    """(T_r, m, m_busy, A_r) of one MoE layer on one rank (perfmodel.costs.moe): T_r = b s /
    (cp tp) with sequence parallelism (an MoE plan with tp > 1 has it), b s / cp without tp."""
    T_r = c.T / c.act_ranks
    m, m_busy, A_r = MOE.expert_tokens(
        T_r, S.k_E, S.E, S.ep, S.rho_E,
        capacity_factor=S.c_E if c.fam.moe_capacity else None, etp=S.etp)
    return T_r, m, m_busy, A_r


@per_context
def _expert_s(c: Context, m: sp.Expr) -> sp.Expr:
    """One expert's up and down GEMMs over m tokens, without the kernel floor [s], each of its
    etp slices f_E / etp wide (expert tensor parallelism; the whole expert with etp 1); an fp8
    plan's on the FP8 device with e_8-byte operands and bf16 outputs, as the other linear
    layers' (perfmodel.step.context.linear_gemm_time)."""
    dev = c.linear
    params = {k: v for k, v in dev.gemm_params.items() if k != "min_time_s"}
    operand = S.e8 if c.fam.fp8 else S.e
    return sum((gemm_time_s(g.m, g.n, g.k, g.batch, operand, dev.peak_flops_per_s,
                            dev.memory_bandwidth_bytes_per_s, output_bytes_per_element=S.e,
                            **params)
                for g in MOE.expert_gemms(m, S.h, S.f_E / S.etp, c.gated)), ZERO)


@per_context
def routed_experts_s(c: Context) -> sp.Expr:
    """The rank's routed experts' GEMMs in one MoE layer's forward [s] (module doc: dropless,
    the busiest expert at rho m; with a capacity, padded buffers), the kernel floor once."""
    _, m, m_busy, _ = routed_tokens(c)
    local = S.E / S.ep
    floor = c.dev.gemm_params.get("min_time_s", ZERO) * len(MOE.expert_gemms(m, S.h, S.f_E, 0))
    if c.fam.moe_capacity:
        return local * _expert_s(c, m) + floor
    rest = MOE.rest_share(S.E, S.rho_E)
    return (local - 1) * _expert_s(c, m * rest) + _expert_s(c, m_busy) + floor


@per_context
def routed_forward_s(c: Context) -> sp.Expr:
    """Device time of one MoE layer's routed section in its forward on one rank [s], what runs
    between the host's sync and the combine (perfmodel.step.compose.Synced): the routed
    experts' GEMMs, the memory-bound kernels after the sync (moe_elementwise_bytes' un-
    permutation, 2 e A_r h, and the experts' activation; the router's softmax and top-k and the
    permutation run before it, with the rest A; Megatron-Core's experts' extra passes,
    expert_extra_bytes), an fp8 plan's casts of the experts' inputs
    (A_r (etp h + f_E) elements, perfmodel.step.layer.moe_fp8_cast_elements' routed share). Its
    exchanges are the stage's comm/ep (the dropless count exchange's all-gather, ep E int64
    before the sync, with them)."""
    _, _, _, A_r = routed_tokens(c)
    # the un-permutation and the experts' activation: moe_elementwise_bytes less the router's
    # softmax and top-k and the permutation, which run before the sync (A)
    bytes_ = 2 * S.e * A_r * S.h + (2 + c.gated) * S.e * A_r * S.f_E \
        + expert_extra_bytes(c)[0]
    casts = S.q8 * A_r * (S.etp * S.h + S.f_E) if c.fam.fp8 else ZERO
    return routed_experts_s(c) + K.memory_time(bytes_ + casts, c.dev)


def synced(c: Context, stage: str, cost: PartCost, moe_layer_s: sp.Expr,
           recomputed: bool = True) -> Synced | None:
    """The stage's MoE layers' forward sections between the host's syncs, per micro-batch
    (perfmodel.step.compose.Synced; module doc there), on an asynchronous device; None
    without MoE layers, on synchronous ranks, or with a capacity factor (padded buffers: no
    sync, token_dispatcher.py's drop_and_pad). The host reads the token counts in every MoE
    layer's forward where the exchange needs split sizes (ep > 1: Megatron-Core's dispatchers,
    DeepEP, torchtitan) and, with ep 1, where Transformer Engine's grouped GEMM takes its
    per-expert row counts as a host list (Megatron-Core, fused kernels; torchtitan's grouped_mm
    takes device offsets and does not sync):
        on  = [ep > 1] + [ep = 1] [kernels fused]
        n'  = n_moe + n_rc,moe    (full recompute repeats the forward, its syncs with it:
                                   moe_recomputed)
        H_R = on n' t_op (EXPERT_HOST_OPS_fwd E / ep + EXCHANGE_HOST_OPS_fwd [ep > 1])
        D_R = on n' s routed_forward_s  (+ the forward's and recompute's exposed comm/ep)
        H_A = on n' (c_fwd + t_op (ops_fwd + MOE_HOST_OPS_fwd + EXPERT_HOST_OPS_fwd n_shared))
        D_A = on n' s (t_moe_layer - routed_forward_s)
    s: the framework's measured scale (1 where not measured); moe_layer_s: one MoE layer's
    forward on the device (perfmodel.step.layer.LayerWork.total_s). recomputed False: the
    forward's sections alone (n_rc = 0, its exchanges alone: perfmodel.step.compose.forward_s)."""
    if not c.fam.moe or not c.asynchronous or c.fam.moe_capacity:
        # (padded to a capacity, the counts are known on the host: Megatron-Core's drop-and-pad
        # path leaves cuda_sync_point "no_sync", HybridEP takes a static row count)
        return None
    ep_on = active(S.ep)
    on = ep_on + (1 - ep_on) * c.fused_kernels
    n = on * (moe_layers(c)[stage] + (moe_recomputed(c)[stage] if recomputed else 0))
    shared = 1 if c.fam.moe_shared else 0
    routed = routed_forward_s(c)
    return Synced(
        host_r=n * cost.kernel_s * (EXPERT_HOST_OPS[0] * S.E / S.ep + EXCHANGE_HOST_OPS[0] * ep_on),
        device_r=n * cost.scale * routed,
        host_a=n * (cost.forward_s + cost.kernel_s * (cost.forward_ops + MOE_HOST_OPS[0]
                                                      + EXPERT_HOST_OPS[0] * shared)),
        device_a=n * cost.scale * (moe_layer_s - routed),
        comm_phases=(f"layers@{stage}/forward",) + ((f"layers@{stage}/recompute",)
                                                    if recomputed else ()), on=on)


def moe_mlp_work(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(GEMM seconds, element-wise bytes) of one MoE layer's MLP forward on one rank (module
    doc)."""
    T_r, m, m_busy, A_r = routed_tokens(c)
    experts = routed_experts_s(c)
    gemm = K.gemm_time(MOE.router_gemm(T_r, S.h, S.E), S.e, c.dev) + experts
    elementwise = MOE.moe_elementwise_bytes(T_r, A_r, S.h, S.E, S.f_E, S.e, gated=c.gated)
    if c.fam.moe_shared:
        gemm += sum((linear_gemm_time(c, g)
                     for g in MOE.shared_gemms(c.T, S.h, S.f_sh, S.tp, c.gated)), ZERO)
        elementwise += (2 + c.gated) * S.e * c.T * S.f_sh / S.tp
    return gemm, elementwise


def moe_act_s(c: Context) -> sp.Expr:
    """The routed experts' activation in one MoE layer's forward on one rank [s]: its bytes,
    (2 + gated) e A_r f_E (moe_elementwise_bytes' share), and a clamped GLU's eager clamps
    (expert_extra_bytes), over W: what selective recompute's moe_act repeats."""
    _, _, _, A_r = routed_tokens(c)
    return K.memory_time((2 + c.gated) * S.e * A_r * S.f_E + clamp_bytes(c)[0], c.dev)


# Megatron-Core's TEGroupedMLP beyond its fused activation kernel, bytes per element (module doc
# of expert_extra_bytes): a clamped GLU's eager clamps and concatenation, per element of one
# half of the up projection's output (forward, backward)
CLAMP_BYTES = (8, 10)


def clamp_bytes(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes of a clamped GLU's eager passes in one MoE layer on one rank
    (expert_extra_bytes), 0 without them."""
    if not (c.fam.moe and c.fam.clamped_glu):
        return ZERO, ZERO
    _, _, _, A_r = routed_tokens(c)
    half = c.fused_kernels * c.gated * S.e * A_r * S.f_E  # one half: A_r rows of f_E / etp
    return CLAMP_BYTES[0] * half, CLAMP_BYTES[1] * half


def expert_extra_bytes(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes Megatron-Core's routed experts (TEGroupedMLP, fused kernels:
    the Megatron-Core / Transformer Engine stack) move beyond their GEMMs and fused activation
    kernel, per MoE layer and micro-batch on one rank (megatron/core/transformer/moe/experts.py
    and fusions/fused_bias_geglu.py at d7288711, Megatron-Bridge v0.4.0's, and d98e8a64dd):
      - a clamped GLU (TransformerSpec.clamped_glu: GPT-OSS): weighted_bias_quick_geglu_impl
        clamps the up projection's two halves and concatenates them in eager PyTorch before its
        fused kernel: forward two clamps (read and write a half each, x = e A_r f_E bytes) and
        the concatenation (2 x read and write), 8 x; backward the clamps' (read the gradient and
        the input, write: 3 x each) and the gradients' concatenation for the chunk (4 x), 10 x;
      - the down projection's biases (bias, experts): _apply_bias adds each expert's bias times
        its rows' routing weights over its rows, p the weights' bytes (4 where the dispatcher
        takes them in fp32, DeepEP / HybridEP: token_dispatcher.py upcasts them; else the
        router's, the activations' e), the sum of p-byte products cast back to e:
        forward  b p (write p), t + b p (read e + p, write p), the concatenation (read and
                 write p), the cast (read p, write e where p differs from e):
                 5 p + e + [p != e] (p + e) bytes an element of the rows' etp A_r x h;
        backward the cast's (read e, write p), the sum's cast back to t (read p, write e), the
                 bias's and the weights' gradients (each a product and its reduction, 3 p):
                 6 p + 2 [p != e] (p + e).
    The fc1 bias rides its GEMM's epilogue (no pass). NeMo AutoModel's experts (fused kernels
    too: components/moe/experts.py at 36044ad3d) add the down projection's biases likewise, the
    bias expanded over the rows times the fp32 weights (_apply_bias), and clamp inside their
    compiled activation (its reader sets clamped_glu false). 0 under eager or compiled kernels
    (their experts' passes are counted as the fused stack's: a limitation) and without the
    parts."""
    if not c.fam.moe:
        return ZERO, ZERO
    fwd, bwd = clamp_bytes(c)
    _, _, _, A_r = routed_tokens(c)
    if c.fam.ep_dispatcher == "deepep":
        p = sp.Integer(4)
        cast = sp.Min(1, sp.Max(0, p - S.e, evaluate=False), evaluate=False)
    else:
        p, cast = S.e, ZERO
    rows = c.fused_kernels * c.bias * S.etp * A_r * S.h
    return (fwd + rows * (5 * p + S.e + cast * (p + S.e)),
            bwd + rows * (6 * p + 2 * cast * (p + S.e)))


def shared_experts_s(c: Context) -> sp.Expr:
    """The shared experts of one MoE layer, forward on one rank [s]: their GEMMs and their
    activation's bytes (moe_mlp_work's share): what selective recompute's shared_experts
    repeats."""
    gemm = sum((linear_gemm_time(c, g)
                for g in MOE.shared_gemms(c.T, S.h, S.f_sh, S.tp, c.gated)), ZERO)
    return gemm + K.memory_time((2 + c.gated) * S.e * c.T * S.f_sh / S.tp, c.dev)


def extra_kernels(c: Context, stage: str) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) ops a stage's MoE layers issue beyond dense layers', per micro-batch:
    on synchronous ranks the kernels they launch (MOE_EXTRA_KERNELS forward, twice that
    backward); on an asynchronous device the framework ops the host issues (MOE_HOST_OPS,
    EXPERT_HOST_OPS per local expert E / ep and per shared expert, EXCHANGE_HOST_OPS with
    ep > 1)."""
    if not c.fam.moe:
        return ZERO, ZERO
    n = moe_layers(c)[stage]
    shared = 1 if c.fam.moe_shared else 0
    if not c.asynchronous:
        per_layer = MOE_EXTRA_KERNELS + shared * SHARED_EXPERT_KERNELS
        return per_layer * n, BACKWARD_PER_FORWARD * per_layer * n
    experts, exchange = S.E / S.ep + shared, active(S.ep)
    forward, backward = (n * (MOE_HOST_OPS[i] + EXPERT_HOST_OPS[i] * experts
                              + EXCHANGE_HOST_OPS[i] * exchange) for i in (0, 1))
    return forward, backward


def ep_collectives(c: Context, layers: dict[str, sp.Expr] | None = None, prefix: str = "layers",
                   recomputed: bool = True) -> list[Collective]:
    """The expert-parallel collectives of each stage's MoE layers (module doc; layers: stage ->
    MoE layers, default moe_layers, of which full recompute repeats moe_recomputed's, or the
    share full of those given): declared per stage (their MoE layers differ); the last
    and the middle stage's enter the ledger only with several stages (with one, the first's are
    its) unless the first has none declared here. Their phases: <prefix>@<stage>/forward, /backward,
    /recompute. A stage "output" (the multi-token-prediction modules') is the output layer's:
    declared for it (LEDGER_STAGES), its phases named @last."""
    if not c.fam.moe:
        return []
    T_r, _, _, A_r = routed_tokens(c)
    h, e, E = S.h, S.e, S.E
    if c.fam.moe_capacity:
        rows = E * MOE.capacity(T_r, S.k_E, E, S.c_E)
        sent = busiest = rows
    else:
        sent, busiest = T_r * S.k_E, A_r
    # the expert-tensor-parallel exchanges: the received rows gathered over etp and the
    # outputs reduce-scattered back (forward), the other way in the backward; a group of one
    # rank issues none (their ledger calls and time are 0 with etp 1)
    gathered, gathered_busiest = e * S.etp * sent * h, e * S.etp * busiest * h
    etp_ops = {"forward": ("all_gather", "reduce_scatter"),
               "backward": ("reduce_scatter", "all_gather"),
               "recompute": ("all_gather", "reduce_scatter")}
    counts_etp = active(S.etp)  # the counts' gather runs over etp x ep with etp > 1
    a2a_time = dispatcher_time(c, busiest)
    # the routing probabilities' exchanges (module doc): weighted in the experts' activation,
    # NCCL's dispatcher
    probs = c.weighted_activation * (1 - deepep(c))
    probs_etp_ops = {"forward": "all_gather", "backward": "reduce_scatter",
                     "recompute": "all_gather"}
    out = []
    if layers is None:
        layers, repeated = moe_layers(c), moe_recomputed(c)
    else:
        repeated = {st: c.full * n for st, n in layers.items()}
    for declared, n in layers.items():
        st = PHASE_STAGE.get(declared, declared)
        share = c.multi if st != "first" and "first" in layers else sp.Integer(1)
        directions = [("forward", "fwd", n), ("backward", "bwd", n)]
        if recomputed:  # full recompute repeats an MoE layer's forward, its exchanges with it
            directions.append(("recompute", "bwd", repeated[declared]))
        for direction, phase, layers_n in directions:
            in_phase = f"{prefix}@{st}/{direction}"
            out.append(Collective(
                name="ep/dispatch_combine/all_to_all", op="all_to_all", axis="ep",
                nbytes=e * sent * h, time_nbytes=e * busiest * h,
                calls=A2A_PER_LAYER * layers_n, phase=phase, in_phase=in_phase,
                term="comm/ep", fam=c.fam, stage=declared, ledger_share=share, call_time=a2a_time))
            out.append(Collective(
                name="ep/probs/all_to_all", op="all_to_all", axis="ep",
                nbytes=MOE.ROUTER_PROB_BYTES * sent, time_nbytes=MOE.ROUTER_PROB_BYTES * busiest,
                calls=probs * layers_n, phase=phase, in_phase=in_phase, term="comm/ep",
                fam=c.fam, stage=declared, ledger_share=share))
            out.append(Collective(
                name=f"etp/probs/{probs_etp_ops[direction]}", op=probs_etp_ops[direction],
                axis="etp", nbytes=MOE.ROUTER_PROB_BYTES * S.etp * sent,
                time_nbytes=MOE.ROUTER_PROB_BYTES * S.etp * busiest, calls=probs * layers_n,
                phase=phase, in_phase=in_phase, term="comm/ep", fam=c.fam, stage=declared,
                ledger_share=share))
            for op in etp_ops[direction]:
                out.append(Collective(
                    name=f"etp/expert_tokens/{op}", op=op, axis="etp", nbytes=gathered,
                    time_nbytes=gathered_busiest, calls=layers_n, phase=phase,
                    in_phase=in_phase, term="comm/ep", fam=c.fam, stage=declared,
                    ledger_share=share))
            if not c.fam.moe_capacity and direction != "backward":
                out.append(Collective(
                    name="ep/token_counts/all_gather", op="all_gather", axis="ep",
                    nbytes=S.ep * E * MOE.COUNT_BYTES, calls=(1 - counts_etp) * layers_n,
                    phase=phase, in_phase=in_phase, term="comm/ep", fam=c.fam, stage=declared,
                    ledger_share=share))
                out.append(Collective(
                    name="etp_ep/token_counts/all_gather", op="all_gather", axis="etp_ep",
                    nbytes=S.etp * S.ep * E * MOE.COUNT_BYTES, calls=counts_etp * layers_n,
                    phase=phase, in_phase=in_phase, term="comm/ep", fam=c.fam, stage=declared,
                    ledger_share=share))
    return out


def deepep(c: Context) -> sp.Expr:
    """1 where the plan's dispatcher is DeepEP's (Plan.ep_dispatcher), 0 for NCCL's all-to-all,
    its indicator where open."""
    return flag(None if c.fam.ep_dispatcher is None else c.fam.ep_dispatcher == "deepep",
                "ep_deepep")


def dispatcher_time(c: Context, busiest: sp.Expr) -> sp.Expr | None:
    """One dispatch or combine of the busiest rank's `busiest` rows as the plan's dispatcher
    runs it [s] (Plan.ep_dispatcher), or None for NCCL's all-to-all (Collective's group_time of
    every top-k copy): DeepEP's kernels send each of the rank's busiest / k tokens once per node
    and once per rank that holds one of its experts (perfmodel.step.collective.dispatch_time),
    the copies spread as the router routes (perfmodel.costs.moe.spread); dropless only (the
    plan rules refuse a capacity factor with deepep)."""
    on = deepep(c)
    if on == 0 or c.fam.moe_capacity:
        return None

    def copies(bins: sp.Expr) -> sp.Expr:
        return MOE.spread(bins, S.k_E, S.E, round_robin=c.fam.moe_round_robin,
                          groups=S.g_E, group_topk=S.M_E)

    deep = dispatch_time(S.e * busiest / S.k_E * S.h, copies, "ep", c.fam)
    if on == 1:
        return deep
    nccl = group_time("all_to_all", S.e * busiest * S.h, "ep", c.fam)
    return on * deep + (1 - on) * nccl


def ep_overlaps(c: Context, stage: str, work: LayerWork) -> dict[str, tuple[Overlap, ...]]:
    """Megatron-Core's combined 1F1B (Plan.ep_comm_overlap, --overlap-moe-expert-parallel-
    comm): one micro-batch's forward runs beside another's backward, each's dispatch and combine
    all-to-alls behind the other's computation. On a stage, per micro-batch:
        the forward's all-to-alls behind the paired backward's compute  (window: its layers'
                                                                         backward)
        the backward's behind the paired forward's                       (window: their forward)
    the compute slowed by the contention (perfmodel.step.compose: s_ovl), and never hidden in
    the micro-batches the schedule leaves unpaired, its warm-up forwards and cool-down
    backwards: of the m v chunk passes of the first rank, 1 + (pp - 1) 2 + (v - 1) pp (Megatron's
    interleaved warm-up, one more for the pairing; 1 of m with one stage):
        floor = min(1, (1 + 2 (pp - 1) + (v - 1) pp) / (m v)).
    work: the stage's layers (perfmodel.step.layer.stage_work)."""
    if not c.fam.moe or c.fam.ep_comm_overlap is False:
        return {}
    pp, v = S.pp, S.v
    # on where the plan asks for it and Megatron runs it (perfmodel.strategy.ep_overlap_runs;
    # the plan rules refuse the rest; a search sets it on for every plan with ep > 1)
    full = flag(None if c.fam.recompute is None else c.fam.recompute == "full",
                "recompute_full")
    on = flag(c.fam.ep_comm_overlap, "ep_comm_overlap") * (1 - full) \
        * (c.single + c.multi * c.interleaved)
    per = c.m / PP.flushes(c)  # the micro-batches of one pipeline schedule
    floor = sp.Min(1, (1 + 2 * (pp - 1) + (v - 1) * pp) / (per * v), evaluate=False)
    of = ("ep/dispatch_combine/all_to_all",)
    return {f"layers@{stage}/forward": (Overlap("the paired micro-batch's backward",
                                                work.backward_s, on, floor=floor, of=of),),
            f"layers@{stage}/backward": (Overlap("the paired micro-batch's forward",
                                                 work.total_s, on, floor=floor, of=of),)}


def stage_phases(stage: str, issued: Mapping[str, tuple[Collective, ...]],
                 prefix: str = "layers", overlaps: Mapping[str, tuple[Overlap, ...]] | None = None,
                 lost: Mapping[str, sp.Expr] | None = None) -> tuple[Phase, ...]:
    """The phases that hold one stage's own collectives (its MoE layers' exchanges, and the
    tensor-parallel collectives of its dense layers' MLPs where they differ by stage): no device
    time of their own but what overlapping the MLPs' tensor-parallel collectives costs their
    GEMMs (lost, compute/tp_overlap); only those collectives overlapped (overlaps,
    perfmodel.step.tensor_parallel.layer_overlaps), not the expert-parallel exchanges."""
    overlaps, lost = overlaps or {}, lost or {}
    out = []
    for direction in ("forward", "backward", "recompute"):
        name = f"{prefix}@{stage}/{direction}"
        out.append(Phase(name=name, comms=issued.get(name, ()), overlaps=overlaps.get(name, ()),
                         device={"compute/tp_overlap": lost[name]} if name in lost else {}))
    return tuple(out)
