"""One transformer layer on one rank: its forward's device time, and its three phases in a
micro-batch (forward, backward, recompute).

Forward of one layer, one micro-batch [s] (perfmodel.costs.compute; Megatron-LM's layer):
    t_gemm      = the four linear layers' GEMMs (QKV, attention output, MLP up (and gate), down);
                  on a 2d / 2.5d / 3d grid their blocks (perfmodel.costs.layouts)
    t_attention = unfused: the scores and context GEMMs (all s^2 of them) + the softmax and
                  dropout bytes / W;
                  flash: one compute-bound kernel doing the causal half of those FLOPs at the
                  hardware's measured flash efficiency (perfmodel.costs.compute.flash_attention_s),
                  no s^2 bytes; where the hardware has no measured kernel, those FLOPs as GEMMs
    t_elementwise = norms, activation, dropout-adds bytes / W
Backward = 2 x forward: a GEMM's input gradient and its weight gradient each cost one forward
(Narayanan et al. SC21, appendix on FLOPs); a flash kernel's backward 2.5 x its forward's FLOPs
(it recomputes the scores; FlashAttention-2, Sec. 4.1) at its backward efficiency. Recompute
repeats the forward (full) or the attention core (selective) before the backward (Korthikanti et
al. 2022, Sec. 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import layouts as LY
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.framework import BACKWARD_PER_FORWARD, PartCost

ZERO = sp.Integer(0)


@dataclass(frozen=True)
class LayerWork:
    """Device time of one layer's forward on one rank, per micro-batch [s], and of its
    attention's backward (the rest of the backward is BACKWARD_PER_FORWARD x the forward)."""

    gemm_s: sp.Expr
    attention_s: sp.Expr
    elementwise_s: sp.Expr
    attention_backward_s: sp.Expr

    @property
    def total_s(self) -> sp.Expr:
        return self.gemm_s + self.attention_s + self.elementwise_s

    @property
    def backward_s(self) -> sp.Expr:
        return BACKWARD_PER_FORWARD * (self.gemm_s + self.elementwise_s) \
            + self.attention_backward_s

    def forward_terms(self, n: sp.Expr) -> dict[str, sp.Expr]:
        """n layers' forward, by term compute/forward/<part>."""
        return {"compute/forward/gemm": n * self.gemm_s,
                "compute/forward/attention": n * self.attention_s,
                "compute/forward/elementwise": n * self.elementwise_s}

    def backward_terms(self, n: sp.Expr) -> dict[str, sp.Expr]:
        """n layers' backward, by term compute/backward/<part>."""
        return {"compute/backward/gemm": BACKWARD_PER_FORWARD * n * self.gemm_s,
                "compute/backward/attention": n * self.attention_backward_s,
                "compute/backward/elementwise": BACKWARD_PER_FORWARD * n * self.elementwise_s}


def layer_work(c: Context) -> LayerWork:
    """One layer's forward: GEMMs (Megatron 1D, or a grid's blocks), attention, element-wise."""
    h, a, kv, f, s, b, tp, e = S.h, S.a, S.kv, S.f, S.s, S.b, S.tp, S.e
    gemm_t = {g.name: K.gemm_time(g, e, c.dev)
              for g in K.layer_gemms(c.T, b, s, h, a, kv, f, tp, c.gated, c.d)}
    if c.fam.tp_layout != "1d":  # the grid layouts replace the four linear layers' GEMMs
        for name, K_, M_ in LY.linear_shapes(h, a, kv, f, c.gated, c.d):
            grid = LY.grid_gemms(name, c.T, K_, M_, S.q_a, S.q_c)
            grid_t = c.grid2 * K.gemm_time(grid["2d"], e, c.dev) \
                + c.grid3 * K.gemm_time(grid["3d"], e, c.dev)
            gemm_t[name] = c.megatron * gemm_t[name] + grid_t
    ew = K.elementwise_bytes(c.T, b, s, h, a, f, tp, e, sequence_parallel=c.split,
                             flash=c.flash, gated=c.gated)
    core_gemms_s = sum((gemm_t[n] for n in K.ATTENTION_CORE), ZERO)
    unfused_s = core_gemms_s + K.memory_time(ew["softmax"] + ew["attention_dropout"], c.dev)
    fused_s, fused_backward_s = flash_attention(c, core_gemms_s)
    return LayerWork(
        gemm_s=sum((t for n, t in gemm_t.items() if n not in K.ATTENTION_CORE), ZERO),
        attention_s=c.flash * fused_s + (1 - c.flash) * unfused_s,
        elementwise_s=K.memory_time(ew["layernorm"] + ew["activation"] + ew["dropout_add"], c.dev),
        attention_backward_s=c.flash * fused_backward_s
        + (1 - c.flash) * BACKWARD_PER_FORWARD * unfused_s,
    )


def flash_attention(c: Context, core_gemms_s: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) of one layer's fused causal attention on one rank [s].

    Measured kernel (I_fa = 1): the causal half of the core's FLOPs (forward) and 2.5 x that
    (backward) at the hardware's flash efficiencies (perfmodel.costs.compute.flash_attention_s).
    Not measured (I_fa = 0: a calibrated CPU, a GPU without flash benchmarks): the same FLOPs at
    the GEMM efficiency of the scores and context products (core_gemms_s, all s^2 of them)."""
    flops = K.attention_core_flops(S.b, S.s, S.a, c.d, S.tp)
    measured = K.flash_attention_s(flops, S.F, S.E_fa_fwd, S.s_fa_fwd, S.s)
    measured_bwd = K.flash_attention_s(K.FLASH_BACKWARD_PER_FORWARD * flops, S.F, S.E_fa_bwd,
                                       S.s_fa_bwd, S.s)
    as_gemms = K.CAUSAL_FRACTION * core_gemms_s
    return (S.I_fa * measured + (1 - S.I_fa) * as_gemms,
            S.I_fa * measured_bwd + (1 - S.I_fa) * K.FLASH_BACKWARD_PER_FORWARD * as_gemms)


def op_recomputed_gemm_share(c: Context) -> sp.Expr:
    """The share of a layer's linear-layer FLOPs that torchtitan's per-op recompute repeats: of
    the matmuls Q, K, V, attention output, MLP up (w1), [gate (w3),] down (w2) it keeps every
    other output (the 1st, 3rd, ...) and recomputes K, the attention output and w3 (SwiGLU) or
    w2 (GeLU): (kv d + a d + f) h of (a d + 2 kv d + a d + (2 + gated) f) h."""
    d, a, kv, f = c.d, S.a, S.kv, S.f
    return (kv * d + a * d + f) / (2 * a * d + 2 * kv * d + (2 + c.gated) * f)


def op_recompute_s(c: Context, work: LayerWork) -> sp.Expr:
    """What per-op recompute repeats of one layer's forward [s]: its recomputed matmuls (their
    share of the linear FLOPs, at the layer's GEMM time per FLOP), every element-wise operation,
    and an unfused attention core (its batched products and softmax are not kept; a flash
    kernel's output is)."""
    return op_recomputed_gemm_share(c) * work.gemm_s + work.elementwise_s \
        + (1 - c.flash) * work.attention_s


def layer_phases(c: Context, work: LayerWork, cost: PartCost,
                 issued: Mapping[str, tuple[Collective, ...]]) -> tuple[Phase, Phase, Phase]:
    """The stage's L/pp layers in one micro-batch: forward, backward, recompute.

    device: n x work (x 2 backward); where calibrated, (s - 1) x that (the framework's scale)
    host:   n x c_fwd (c_bwd); n x kernels x t_kernel (x 2 backward) where not calibrated
    recompute: full x forward + selective x attention + op x what per-op recompute repeats
    (op_recompute_s), device and host (charged to compute/recompute), and the forward's
    collectives (full; op: all but the reduce-scatters, whose outputs it keeps). full, selective
    and op are the shares of the stage's layers under each policy (Context).
    """
    n, back = c.layers_per_stage, BACKWARD_PER_FORWARD
    kernels = n * cost.kernel_s * K.kernels_per_layer_forward(sequence_parallel=c.seq_parallel,
                                                              flash=c.flash)
    slower = cost.scale - 1  # what the framework's scale adds to the rooflines
    recomputed = c.full * work.total_s + c.selective * work.attention_s \
        + c.op * op_recompute_s(c, work)
    forward = Phase(
        name="layers/forward",
        device={**work.forward_terms(n),
                "compute/forward/framework": n * slower * work.total_s},
        host={"compute/forward/framework": n * cost.forward_s, "overhead/kernels": kernels},
        comms=issued.get("layers/forward", ()))
    backward = Phase(
        name="layers/backward",
        device={**work.backward_terms(n),
                "compute/backward/framework": n * slower * work.backward_s},
        host={"compute/backward/framework": n * cost.backward_s,
              "overhead/kernels": back * kernels},
        comms=issued.get("layers/backward", ()))
    recompute = Phase(
        name="layers/recompute",
        device={"compute/recompute": n * (recomputed + slower * recomputed)},
        host={"compute/recompute": n * (c.full + c.op) * cost.forward_s,
              "overhead/kernels": (c.full + c.op) * kernels},
        comms=issued.get("layers/recompute", ()))
    return forward, backward, recompute
