"""torchtitan's per-op selective recompute (Plan.recompute op) of a layer with multi-head latent
attention or a mixture of experts: which of its matmuls it keeps, what it keeps, what it repeats.

torchtitan's op policy (torchtitan/distributed/activation_checkpoint.py, SelectiveAC at
b5bcd76c6): inside each wrapped block every aten.mm / aten.linear is counted in call order and
the even-numbered ones (the 2nd, 4th, ...) are recomputed, the odd ones saved; the outputs of the
other compute-intensive ops (flash / cuDNN attention), of topk, and of the communication ops
(reduce-scatter, all-to-all, DeepEP's and HybridEP's dispatch and combine) are saved; everything
else is recomputed: the norms, the activations, the rotary embedding, the routers' scores, the
permutations, and the routed experts' grouped GEMMs (torch._grouped_mm is in neither list).
The matmuls in the order torchtitan's modules call them (torchtitan/models):
    attention   standard: wq, wk, wv, wo; MLA (deepseek_v3): wq_a, wq_b (or wq), wkv_a, wkv_b, wo
    dense MLP   w1, w3 (SwiGLU), w2
    MoE         the router's gate, the routed experts (grouped: not counted), then the shared
                experts' w1, w3, w2 (torchtitan/models/common/moe.py, MoE.forward)
The counting runs across the block: a dense MLP after MLA's five matmuls has w3 saved, after a
standard attention's four w1 and w2. A dense model's layer keeps the same as
perfmodel.costs.memory.layer_activation_bytes' per-op count (tested).

Kept by one layer on one rank, per micro-batch (kept_bytes):
    its input e T h / rep, the saved matmuls' outputs (a column-parallel one split over tp, a
    row-parallel one's partial sums whole), a flash kernel's output and fp32 log-sum-exp
    e T a d_v / tp + 4 a b s / tp, with sequence parallelism the reduce-scatters' outputs
    e T h / tp each (the attention's, and the MLP's or the shared experts'), and in an MoE layer
    topk's scores and indices (4 + 8) T_r k bytes and, with ep > 1, the exchanges' outputs: the
    all-to-all's dispatched rows e A_r h and combined rows e T_r k h; DeepEP's received rows
    e h A_r D_ep / k (one per token and rank, perfmodel.costs.moe.spread) and combined tokens
    e T_r h.
Repeated per layer in the backward (recompute_s): the recomputed matmuls, the routed experts'
GEMMs, every element-wise op, and an unfused attention core; no collective (their outputs are
kept).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import mla as MLA
from perfmodel.costs import moe as CM
from perfmodel.step.context import Context, active, linear_gemm_time

ZERO = sp.Integer(0)
TOPK_BYTES = 4 + 8  # topk's fp32 score and int64 index per token and expert


def _by_gate(c: Context, count: Callable[[bool], sp.Expr]) -> sp.Expr:
    """count(gated) for the family's kind of MLP (gated: with w3), or, where the family leaves
    it open, each kind's weighted by the gated indicator: the call order's parity, and so what
    is kept and repeated, differs with w3."""
    if c.fam.gated is None:
        return c.gated * count(True) + (1 - c.gated) * count(False)
    return count(bool(c.fam.gated))


def matmuls(c: Context, moe: bool, T: sp.Expr, T_r: sp.Expr, tp: sp.Expr,
            gated: bool) -> list[K.Gemm]:
    """One layer's matmuls in torchtitan's call order over T tokens on one rank (T_r: what its
    router sees, tp: the ranks a layer is split over; gated: its MLPs with w3; module doc)."""
    h, a, kv, d = S.h, S.a, S.kv, c.d
    if c.fam.mla:
        out = MLA.mla_gemms(T, h, a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v, tp,
                            q_lora=c.fam.mla_q_lora, T_down=T_r)
    else:
        out = [K.Gemm("q", T, a * d / tp, h), K.Gemm("k", T, kv * d / tp, h),
               K.Gemm("v", T, kv * d / tp, h), K.Gemm("attention_output", T, h, a * d / tp)]

    def mlp(prefix: str, width: sp.Expr) -> list[K.Gemm]:
        up = [K.Gemm(f"{prefix}w1", T, width / tp, h)]
        if gated:
            up.append(K.Gemm(f"{prefix}w3", T, width / tp, h))
        return [*up, K.Gemm(f"{prefix}w2", T, h, width / tp)]

    if not moe:
        return [*out, *mlp("", S.f)]
    out.append(CM.router_gemm(T_r, h, S.E))
    if c.fam.moe_shared:
        out += mlp("shared_", S.f_sh)
    return out


def _split(c: Context, moe: bool, gated: bool) -> tuple[list[K.Gemm], list[K.Gemm]]:
    """(saved, recomputed) matmuls of one layer on one rank: the odd-numbered and the
    even-numbered in call order."""
    from perfmodel.step.moe import routed_tokens

    T_r = routed_tokens(c)[0]
    every = matmuls(c, moe, c.T, T_r, S.tp, gated)
    return every[0::2], every[1::2]


def _time(c: Context, g: K.Gemm) -> sp.Expr:
    """One matmul's forward [s], as the layer's own GEMMs are costed (the router in the
    activation dtype, the others as linear layers)."""
    if g.name == "router":
        return K.gemm_time(g, S.e, c.dev)
    return linear_gemm_time(c, g)


def kept_bytes(c: Context, moe: bool, s: sp.Expr) -> sp.Expr:
    """What per-op recompute keeps of one layer on one rank, per micro-batch [bytes] (module
    doc); s: a cp rank's tokens of each sequence. Built once per family and kind."""
    key = (c.fam, moe, s)
    if key not in _KEPT:
        _KEPT[key] = _by_gate(c, lambda gated: _kept_bytes(c, moe, s, gated))
    return _KEPT[key]


_KEPT: dict[tuple[Any, bool, sp.Expr], sp.Expr] = {}


def _kept_bytes(c: Context, moe: bool, s: sp.Expr, gated: bool) -> sp.Expr:
    e, T, tp, h = S.e, c.T, S.tp, S.h
    rep = c.act_ranks
    saved, _ = _split(c, moe, gated)
    out = e * T * h / rep + sum((e * g.m * g.n * g.batch for g in saved), ZERO)
    out += c.flash * (e * T * S.a * c.d_v / tp + 4 * S.a * S.b * s / tp)
    reduce_scatters = 1 + (1 if not moe or c.fam.moe_shared else 0)
    out += c.split * reduce_scatters * e * T * h / tp
    if moe:
        from perfmodel.step.moe import deepep as deepep_of
        from perfmodel.step.moe import routed_tokens

        T_r, _, _, A_r = routed_tokens(c)
        out += TOPK_BYTES * T_r * S.k_E
        deepep = deepep_of(c)
        exchanged = ZERO
        if deepep != 1:  # NCCL's all-to-all: every top-k copy, each way
            exchanged += (1 - deepep) * e * (A_r + T_r * S.k_E) * h
        if deepep != 0:  # DeepEP: one row per token and rank, the tokens combined
            ranks = CM.spread(S.ep, S.k_E, S.E, round_robin=c.fam.moe_round_robin,
                              groups=S.g_E, group_topk=S.M_E)
            exchanged += deepep * e * (A_r * ranks / S.k_E + T_r) * h
        out += active(S.ep) * exchanged
    return out


def recompute_s(c: Context, moe: bool, elementwise_s: sp.Expr, attention_s: sp.Expr,
                experts_s: sp.Expr) -> sp.Expr:
    """What per-op recompute repeats of one layer's forward [s]: its recomputed matmuls, the
    routed experts' GEMMs (experts_s), its element-wise ops (elementwise_s) and, unfused, the
    attention core (attention_s)."""
    gemms = _by_gate(c, lambda gated: sum((_time(c, g) for g in _split(c, moe, gated)[1]), ZERO))
    return gemms + (experts_s if moe else ZERO) + elementwise_s + (1 - c.flash) * attention_s


def recomputed_flops(c: Context, moe: bool, T: sp.Expr) -> sp.Expr:
    """The linear FLOPs per-op recompute repeats of one layer over T tokens of a replica (every
    tp rank's together), the routed experts' excluded."""
    return _by_gate(c, lambda gated: sum(
        (g.flops for g in matmuls(c, moe, T, T, sp.Integer(1), gated)[1::2]), ZERO))
