"""Activation offloading to host memory (Plan.cpu_offload_layers; Family.cpu_offload).

Megatron-Core's --cpu-offloading-num-layers k runs each transformer layer's forward inside
Transformer Engine's offload context (get_cpu_offload_context, default scheduling;
transformer_engine/pytorch/cpu_offload.py and its docs, features/other_optimizations/
cpu_offloading): the tensors the model's first k layers save for their backward are copied to
pinned host memory on a side stream as they are saved, and copied back during the backward before
the layer needs them. At most L - k layers' activations are on the GPU at once (the memory,
perfmodel.step.memory), so compute waits where a copy has not finished in time. Megatron-Core
allows it with pp 1 and no recompute only (Plan).

Per micro-batch, with L layers (pp 1: the stage's), m = L - k of them allowed on the GPU, F and
B one layer's forward and backward device time and X = A / W_host one layer's copy (A its
offloaded bytes, W_host one direction of the GPU's host link), as Transformer Engine schedules
them:
    forward:  a layer's copy starts with its layer (tensors go as they are saved) and ends no
              sooner than the layer, after the copy before it; layer j starts once layer j - m's
              copy has ended;
    backward: the reloads run from layer k down, each once the copy before it has and layer
              i + m's backward has freed its set; layer i's backward starts once its reload has.
The longest path through these gives what the copies add beyond the layers' own time:
    t_offload = max(0, k max(X, F) + F - L F)
              + max(0, k max(X, B) + min(X, B) + B - L B, [m = 1] k X)     [s per micro-batch]
0 while each copy is shorter than a layer and m >= 2 (Transformer Engine's docs: "for full
overlap, use model_layers - 2 or less"); with m = 1 the backward's reloads overlap nothing.
tests/unit/test_cpu_offload.py holds it against a simulation of those rules. What the copies take
from the HBM bandwidth of the kernels beside them is not modelled (the docs: unlikely to slow
GEMMs, noticeable on memory-bound kernels).
"""

from __future__ import annotations

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import lmax, lmin
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.layer import LayerWork

TERM = "comm/offload"  # the copies' exposed time, a stage's optional term (compose)


def forward_exposed_s(k: sp.Expr, layers: sp.Expr, layer_s: sp.Expr,
                      copy_s: sp.Expr) -> sp.Expr:
    """What k layers' offloads add to a forward over `layers` layers of layer_s each [s]."""
    return lmax(0, k * lmax(copy_s, layer_s) + layer_s - layers * layer_s)


def backward_exposed_s(k: sp.Expr, layers: sp.Expr, layer_s: sp.Expr,
                       copy_s: sp.Expr) -> sp.Expr:
    """What k layers' reloads add to a backward over `layers` layers of layer_s each [s]."""
    one_left = lmax(0, 2 - layers + k)  # 1 where a single set stays on the GPU (k = L - 1)
    return lmax(0, k * lmax(copy_s, layer_s) + lmin(copy_s, layer_s) + layer_s
                - layers * layer_s, one_left * k * copy_s)


def offload_phases(c: Context, work: LayerWork, stage: str,
                   moved_bytes: sp.Expr) -> tuple[Phase, Phase]:
    """The copies of a stage's offloaded activations per micro-batch, what they add to its
    forward and to its backward (work: the stage's layers, stage_work; moved_bytes: what they
    offload, perfmodel.step.memory)."""
    n = c.stage_layers[stage]
    copy_s = moved_bytes / S.N_off / S.W_host  # one layer's, on average
    forward = forward_exposed_s(S.N_off, n, work.total_s / n, copy_s)
    backward = backward_exposed_s(S.N_off, n, work.backward_s / n, copy_s)
    return (Phase(name="layers/offload/forward", device={TERM: forward}),
            Phase(name="layers/offload/backward", device={TERM: backward}))
