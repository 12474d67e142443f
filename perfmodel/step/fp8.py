"""What FP8 training adds beyond the layers' casts (perfmodel.step.layer) and GEMMs: the weights'
casts once per step, the FP8 weight copies and the scaling state in memory (perfmodel.costs.fp8).

    P_lin        = the linear layers' weight matrices of one layer on one GPU
                   ((a d + 2 kv d) h + a d h + (1 + gated) f h + f h) / tp     (no biases, norms)
    T_fp8_wc     = q_w8 (L P_lin + o V h / tp) / W                                   [s per step]
    fp8/weight_copies   = c_w8 (n P_lin + o V h / tp)                                 [B]
    fp8/scaling_state   = M_scale8 (4 n + o)                                          [B]
o: 1 for the output layer in FP8 (on the last stage), n = L / pp layers of the stage.
Transformer Engine casts a weight on the first micro-batch of a step and caches both usages for
the others [TE-linear]: once per step (q_w8 = q_8). With the weights held in FP8 (fp8_params) the
copies are the weights (the `weights` term leaves them out: no bf16 copy), the optimizer writes
them, and a step only transposes them on Hopper (q_w8 = 2; 0 on Blackwell); the distributed
optimizer all-gathers them at e_8 bytes (perfmodel.step.data_parallel).
The casts lie on the pipeline's fill: the first micro-batch's forward crosses every stage, each
casting its weights before its first GEMM, so a step pays the casts of all L layers' weights (the
stages' shares, one after the other): L P_lin. The copies stay allocated (TE's per-module weight
workspaces), in every stage's memory.
"""

from __future__ import annotations

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import memory as M
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context

FP8_GEMMS_PER_LAYER = 4  # QKV, attention output, MLP up (with its gate, one GEMM), MLP down


def linear_weights_per_gpu(c: Context) -> sp.Expr:
    """P_lin: one layer's linear weight matrices on one GPU (Megatron 1D and the 3d cube: / tp;
    a 2d or 2.5d grid: / (q_a q_b), copied over its depth), as perfmodel.step.parameters splits
    them."""
    lin = M.linear_weights(S.h, S.a, S.kv, S.f, gated=c.gated, d=c.d)
    return lin / (c.megatron * S.tp + c.grid2 * S.q_a * S.q_b + c.grid3 * S.tp)


def output_weights_per_gpu(c: Context) -> sp.Expr:
    """o V h / tp: the output layer's weight when it runs in FP8 (Plan.fp8_output_layer)."""
    return c.fp8_output * S.V * S.h / S.tp


def weight_cast_phase(c: Context) -> Phase:
    """The step's casts of the FP8 GEMMs' weights (module doc), memory-bound."""
    weights = S.L * linear_weights_per_gpu(c) + output_weights_per_gpu(c)
    return Phase(name="fp8/weight_cast", per_step=True,
                 device={"compute/fp8_weight_cast": K.memory_time(S.qw8 * weights, c.dev)})


def fp8_weights_per_gpu(c: Context, has_output: sp.Expr) -> sp.Expr:
    """The FP8 weights of a stage on one GPU: its layers' linear weights and, on the last stage
    with Plan.fp8_output_layer, the output layer's."""
    return c.layers_per_stage * linear_weights_per_gpu(c) + has_output * output_weights_per_gpu(c)


def memory_terms(c: Context, has_output: sp.Expr) -> dict[str, sp.Expr]:
    """The FP8 weight copies and the scaling state on one GPU of a stage [B] (module doc)."""
    n = c.layers_per_stage
    return {"fp8/weight_copies": S.cw8 * fp8_weights_per_gpu(c, has_output),
            "fp8/scaling_state": S.M_scale8 * (FP8_GEMMS_PER_LAYER * n + has_output * c.fp8_output)}
