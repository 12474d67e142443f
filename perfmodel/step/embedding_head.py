"""The parts outside the layers: the embedding (on the first stage) and the output layer with its
loss (on the last stage); with one stage, both. Their forward's device time and their phases.

    t_embedding = 2 e T h / r / W          the lookup reads the rows and writes the output
    t_output    = GEMM(T x h @ h x V/tp) + b_loss T V/tp / W     logits, the loss's bytes
                  (a vocabulary not a multiple of 8 in bf16, on hardware that measured such
                  GEMMs: max(GEMM, 2 T h V/tp / (F eta_unaligned)), cuBLAS's fallback kernels)
    t_output'   = 2 GEMM(...) + b'_loss T V/tp / W                its backward
                  (b_loss, b'_loss: the loss implementation's bytes per logit, forward and
                  backward, perfmodel.costs.compute: Megatron's unfused 38 and 14 for bf16
                  logits, its native fusion 22 and 10, Transformer Engine's 3e and 2e,
                  PyTorch's 12 and 24)
                  (an fp8 plan's logits GEMM in bf16, or in FP8 with its casts: fp8_output_layer)
r: the ranks an activation is split over (tp with sequence parallelism or a grid, else 1).
Where the stack gathers the output layer's sequence-parallel input again for its weight gradient
(perfmodel.step.tensor_parallel), the gather hides behind the input-gradient GEMM.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.step import tensor_parallel as TP
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context
from perfmodel.step.framework import BACKWARD_PER_FORWARD, PartCost

ONE = sp.Integer(1)
LOOKUP_PASSES = 2  # the embedding reads its rows and writes the output: 2 passes of e T h / r


def embedding_forward_s(c: Context) -> sp.Expr:
    """The embedding's forward on one rank [s] (memory-bound)."""
    return K.memory_time(LOOKUP_PASSES * S.e * c.T * S.h / c.act_ranks, c.dev)


def output_gemm_s(c: Context) -> sp.Expr:
    """The output layer's logits GEMM on one rank [s] (bf16; in FP8 with
    Plan.fp8_output_layer); its input gradient's takes as long."""
    logits = K.logits_gemm(c.T, S.h, S.V, S.tp)
    if c.fam.fp8 and c.fam.fp8_output_layer:
        return K.gemm_time(logits, S.e8, c.linear, output_bytes_per_element=S.e)
    aligned = K.gemm_time(logits, S.e, c.dev)
    if not c.fam.unaligned_logits:
        return aligned
    # unaligned rows (the vocabulary not a multiple of 8 in bf16): the fallback kernels' rate
    unaligned = logits.flops / (c.dev.peak_flops_per_s * c.dev.gemm_params["unaligned_fraction"])
    return sp.Max(aligned, unaligned, evaluate=False)


def loss_kernel(c: Context) -> K.LossKernel:
    """The plan's loss implementation (Plan.cross_entropy): the unfused loss with eager kernels
    is PyTorch's F.cross_entropy (the validation job's, torchtitan's), with fused or compiled ones
    Megatron's vocab_parallel_cross_entropy."""
    unfused = 1 - c.te_loss - c.loss_native - c.loss_no_upcast - c.loss_torch - c.loss_flash
    return K.LossKernel(te=c.te_loss, native=c.loss_native, no_upcast=c.loss_no_upcast,
                        torch=c.loss_torch + unfused * c.eager_kernels, flash=c.loss_flash)


def loss_s(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """The loss's forward and backward on one rank [s] (memory-bound: costs.compute's bytes)."""
    forward, backward = K.cross_entropy_bytes(c.T, S.V, S.tp, loss_kernel(c), S.e)
    return K.memory_time(forward, c.dev), K.memory_time(backward, c.dev)


def output_forward_s(c: Context) -> sp.Expr:
    """The output layer's forward on one rank [s]: the logits GEMM (output_gemm_s) and cross
    entropy."""
    return output_gemm_s(c) + loss_s(c)[0]


def output_backward_s(c: Context) -> sp.Expr:
    """The output layer's backward on one rank [s]: the logits GEMM's two (input and weight
    gradients) and the loss's backward."""
    return BACKWARD_PER_FORWARD * output_gemm_s(c) + loss_s(c)[1]


def output_fp8_casts(c: Context) -> tuple[sp.Expr, sp.Expr] | None:
    """The output layer's casts to FP8 when its GEMM runs in FP8 [s]: its input q_8 T h / r
    (forward) and the logits' gradient q_8 T V / tp (backward); None otherwise."""
    if not (c.fam.fp8 and c.fam.fp8_output_layer):
        return None
    return (K.memory_time(S.q8 * c.T * S.h / c.act_ranks, c.dev),
            K.memory_time(S.q8 * c.T * S.V / S.tp, c.dev))


def end_phases(part: str, forward_s: sp.Expr, cost: PartCost,
               issued: Mapping[str, tuple[Collective, ...]],
               present: sp.Expr,
               fp8_casts: tuple[sp.Expr, sp.Expr] | None = None,
               backward_overlaps: tuple[Overlap, ...] = (),
               backward_s: sp.Expr | None = None) -> tuple[Phase, Phase]:
    """The forward and backward of the embedding or the output layer (part), on a stage that
    holds it (present = 1) or not (0):
        device: C (B backward: 2C unless given) + (s - 1) C (B): compute/<dir>/embedding_logits
                and framework
        host:   c_fwd (c_bwd) + ops x t_op (t_op^bwd: framework.PartCost) where not measured
    """
    phases = []
    for i, (direction, device_s, fixed, ops, per_op) in enumerate((
            ("forward", forward_s, cost.forward_s, cost.forward_ops, cost.kernel_s),
            ("backward", BACKWARD_PER_FORWARD * forward_s if backward_s is None else backward_s,
             cost.backward_s, cost.backward_ops, cost.backward_kernel_s))):
        name = f"{part}/{direction}"
        device = {f"compute/{direction}/embedding_logits": device_s,
                  f"compute/{direction}/framework": (cost.scale - 1) * device_s}
        if fp8_casts is not None:
            device[f"compute/{direction}/fp8_cast"] = fp8_casts[i]
        phases.append(Phase(
            name=name, present=present,
            device=device,
            host={f"compute/{direction}/framework": fixed,
                  "overhead/kernels": ops * per_op},
            comms=issued.get(name, ()), overlaps=backward_overlaps if i else ()))
    return phases[0], phases[1]


def embedding_phases(c: Context, cost: PartCost, issued: Mapping[str, tuple[Collective, ...]],
                     present: sp.Expr) -> tuple[Phase, Phase]:
    return end_phases("embedding", embedding_forward_s(c), cost, issued, present)


def output_phases(c: Context, cost: PartCost, issued: Mapping[str, tuple[Collective, ...]],
                  present: sp.Expr) -> tuple[Phase, Phase]:
    # the input gathered again for the weight gradient (perfmodel.step.tensor_parallel: Megatron-
    # Core's ColumnParallelLinear), behind the input-gradient GEMM as Megatron issues it
    regather = Overlap("the output layer's input-gradient GEMM", output_gemm_s(c), ONE,
                       of=(TP.OUTPUT_REGATHER,))
    return end_phases("output", output_forward_s(c), cost, issued, present, output_fp8_casts(c),
                      (regather,), output_backward_s(c))
