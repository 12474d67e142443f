"""One transformer layer on one rank: its forward's device time, and its three phases in a
micro-batch (forward, backward, recompute).

Forward of one layer, one micro-batch [s] (perfmodel.costs.compute; Megatron-LM's layer):
    t_gemm      = the four linear layers' GEMMs (QKV, attention output, MLP up (and gate), down);
                  on a 2d / 2.5d / 3d grid their blocks (perfmodel.costs.layouts)
    t_attention = the scores and context GEMMs + softmax and dropout bytes / W (0 bytes with
                  flash attention, which fuses them)
    t_elementwise = norms, activation, dropout-adds bytes / W
Backward = 2 x forward: a GEMM's input gradient and its weight gradient each cost one forward
(Narayanan et al. SC21, appendix on FLOPs). Recompute repeats the forward (full) or the attention
core (selective) before the backward (Korthikanti et al. 2022, Sec. 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import layouts as LY
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context
from perfmodel.step.framework import BACKWARD_PER_FORWARD, PartCost

ZERO = sp.Integer(0)


@dataclass(frozen=True)
class LayerWork:
    """Device time of one layer's forward on one rank, per micro-batch [s]."""

    gemm_s: sp.Expr
    attention_s: sp.Expr
    elementwise_s: sp.Expr
    gemms: dict[str, sp.Expr] = field(default_factory=dict)  # each GEMM's, by name

    @property
    def total_s(self) -> sp.Expr:
        return self.gemm_s + self.attention_s + self.elementwise_s

    def by_term(self, direction: str, factor: sp.Expr) -> dict[str, sp.Expr]:
        """factor x each part, named compute/<direction>/<part>."""
        return {f"compute/{direction}/gemm": factor * self.gemm_s,
                f"compute/{direction}/attention": factor * self.attention_s,
                f"compute/{direction}/elementwise": factor * self.elementwise_s}


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
    return LayerWork(
        gemm_s=sum((t for n, t in gemm_t.items() if n not in K.ATTENTION_CORE), ZERO),
        attention_s=sum((gemm_t[n] for n in K.ATTENTION_CORE), ZERO)
        + K.memory_time(ew["softmax"] + ew["attention_dropout"], c.dev),
        elementwise_s=K.memory_time(ew["layernorm"] + ew["activation"] + ew["dropout_add"], c.dev),
        gemms=gemm_t,
    )


def layer_phases(c: Context, work: LayerWork, cost: PartCost,
                 issued: Mapping[str, tuple[Collective, ...]], stage: str = "first",
                 overlap: Mapping[str, tuple[Overlap, ...]] | None = None,
                 overlap_device: Mapping[str, sp.Expr] | None = None
                 ) -> tuple[Phase, Phase, Phase]:
    """The stage's n layers in one micro-batch (n: c.stage_layers[stage]): forward, backward,
    recompute.

    device: n x work (x 2 backward); where calibrated, (s - 1) x that (the framework's scale)
    host:   n x c_fwd (c_bwd); n x ops x t_op (framework.PartCost) where not calibrated
    recompute: full x forward + selective x attention, device and host (charged to
    compute/recompute), and full x the forward's collectives.
    overlap, overlap_device: by phase, the Overlaps of its tensor-parallel collectives and what
    the overlapped GEMMs lose (perfmodel.step.tensor_parallel.layer_overlaps).
    """
    n, back = c.stage_layers[stage], BACKWARD_PER_FORWARD
    scale = n / c.layers_per_stage  # the collectives are declared for the first stage's layers
    overlap, extra = overlap or {}, overlap_device or {}
    kernels = n * cost.kernel_s * cost.forward_ops
    back_kernels = n * cost.kernel_s * cost.backward_ops
    slower = cost.scale - 1  # what the framework's scale adds to the rooflines
    recomputed = c.full * work.total_s + c.selective * work.attention_s
    def lost(name: str) -> dict[str, sp.Expr]:
        return {"compute/tp_overlap": extra[name]} if name in extra else {}

    forward = Phase(
        name="layers/forward",
        device={**work.by_term("forward", n),
                "compute/forward/framework": n * slower * work.total_s,
                **lost("layers/forward")},
        host={"compute/forward/framework": n * cost.forward_s, "overhead/kernels": kernels},
        comms=issued.get("layers/forward", ()), overlaps=overlap.get("layers/forward", ()),
        comm_scale=scale)
    backward = Phase(
        name="layers/backward",
        device={**work.by_term("backward", back * n),
                "compute/backward/framework": n * slower * back * work.total_s,
                **lost("layers/backward")},
        host={"compute/backward/framework": n * cost.backward_s,
              "overhead/kernels": back_kernels},
        comms=issued.get("layers/backward", ()), overlaps=overlap.get("layers/backward", ()),
        comm_scale=scale)
    recompute = Phase(
        name="layers/recompute",
        device={"compute/recompute": n * (recomputed + slower * recomputed),
                **lost("layers/recompute")},
        host={"compute/recompute": n * c.full * cost.forward_s,
              "overhead/kernels": c.full * kernels},
        comms=issued.get("layers/recompute", ()), overlaps=overlap.get("layers/recompute", ()),
        comm_scale=scale)
    return forward, backward, recompute
