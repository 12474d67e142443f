"""What the training framework adds to each part's kernels: measured where `calibrate run` measured
it (perfmodel.costs.framework), else a generic cost per op.

A part (one layer, the embedding, the output layer with its loss) costs per micro-batch
    forward  = s C + c_fwd          backward = s 2C + c_bwd                                [s]
with C its roofline compute, s its measured compute scale, c_fwd and c_bwd its measured fixed
costs, interpolated in the plan's tensor-parallel style and degree. Where a part is not measured
(s = 1, c = 0) each op it issues costs the host a fixed time:
  - synchronous ranks (CPU): each kernel it launches costs t_kernel (t_kernel_tp in a
    tensor-parallel layer where measured): kernels x t_kernel forward and 2 x that backward;
  - an asynchronous device (GPU): its framework ops under the plan's stack x t_op
    (perfmodel.step.host), host time that the device's work may hide (perfmodel.step.compose).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import framework as FW
from perfmodel.step import host as H
from perfmodel.step.context import Context, active

# A backward costs two forwards: a GEMM's input gradient and its weight gradient each take one
# forward's FLOPs (Narayanan et al. SC21, appendix on floating-point operations), and the backward
# launches twice the forward's kernels (calibration.framework fits kernel_overhead_s so).
BACKWARD_PER_FORWARD = 2

# Kernels the embedding's and the output layer's forwards launch, where not measured. Unsourced
# estimates, kept from the first step model (88e7cc9), which charged 3 = 1 x (1 + 2) for the
# embedding and 12 = 4 x (1 + 2) for the output layer, forward and backward: the embedding is one
# gather kernel; the output layer four (its norm, the logits GEMM and the loss's kernels).
# `calibrate run` replaces both with measured costs (layer_costs, parts "embedding", "output").
EMBEDDING_FORWARD_KERNELS = 1
OUTPUT_FORWARD_KERNELS = 4

PARTS = ("layer", "embedding", "output")


@dataclass(frozen=True)
class PartCost:
    """What the framework adds to one part, per micro-batch on one rank."""

    scale: sp.Expr  # s: measured compute time over the roofline (1 where not measured)
    forward_s: sp.Expr  # c_fwd [s]
    backward_s: sp.Expr  # c_bwd [s]
    calibrated: sp.Expr  # the share of the plan whose style was measured (0 or 1, or indicators)
    kernel_s: sp.Expr  # the generic host cost of one op (kernel) where not measured [s]
    forward_ops: sp.Expr  # ops (kernels) of its forward, each costing kernel_s
    backward_ops: sp.Expr  # and of its backward, each costing backward_kernel_s
    backward_kernel_s: sp.Expr  # kernel_s for a backward's op (on a GPU: autograd's engine's)


def part_costs(c: Context) -> dict[str, PartCost]:
    """Each part's costs. The plan's style: plain (no tensor parallelism, or a grid), tp (Megatron
    1D), tp_sp (with sequence parallelism). A tensor-parallel layer's kernels cost t_kernel_tp
    each where measured: t_kernel + active(tp) max(0, t_kernel_tp - t_kernel)."""
    tp_on = active(S.tp)
    styles = {"plain": 1 - c.megatron * tp_on, "tp": c.megatron * tp_on * (1 - c.seq_parallel),
              "tp_sp": c.megatron * tp_on * c.seq_parallel}
    measured: dict[str, dict[str, list[Any]]] = {}
    for part, style, degree in sorted(c.fam.layer_costs):
        measured.setdefault(part, {}).setdefault(style, []).append(
            (degree, S.layer_cost_symbols(part, style, degree)))
    layer_kernel_s = S.t_k + tp_on * sp.Max(0, S.t_ktp - S.t_k, evaluate=False)
    out = {}
    for part in PARTS:
        scale, fwd, bwd, calibrated = FW.part_costs(measured.get(part, {}), styles, S.tp)
        if c.asynchronous:
            per_op = H.op_s(c, layers=part == "layer")
            per_op_b = H.op_s(c, layers=part == "layer", backward=True)
            ops = {"layer": H.layer_ops(c),
                   "embedding": (H.EMBEDDING_FORWARD_OPS, H.EMBEDDING_BACKWARD_OPS),
                   "output": (H.OUTPUT_FORWARD_OPS, H.OUTPUT_BACKWARD_OPS)}[part]
        else:
            per_op = per_op_b = layer_kernel_s if part == "layer" else S.t_k
            kernels = {"layer": K.kernels_per_layer_forward(
                sequence_parallel=c.seq_parallel, flash=c.flash,
                attention_dropout=c.attention_dropout),
                       "embedding": EMBEDDING_FORWARD_KERNELS,
                       "output": OUTPUT_FORWARD_KERNELS}[part]
            ops = (kernels, BACKWARD_PER_FORWARD * kernels)
            if part == "layer":  # eager kernels: the element-wise ones counted op by op
                ops = eager_layer_kernels(c, ops)
        out[part] = PartCost(scale, fwd, bwd, calibrated, (1 - calibrated) * per_op,
                             sp.sympify(ops[0]), sp.sympify(ops[1]),
                             (1 - calibrated) * per_op_b)
    return out


def qkv_elements(c: Context) -> sp.Expr:
    """Elements of the queries', keys' and values' projections' outputs on one rank:
    T (a d_qk + kv (d_qk + d_v)) / tp."""
    return c.T * (S.a * c.d_qk + c.kv_heads * (c.d_qk + c.d_v)) / S.tp


def eager_bias_grads(c: Context, moe: bool = False) -> tuple[sp.Expr, sp.Expr]:
    """(elements, kernels) of the bias gradients one rank reduces in a layer's backward run op by
    op (perfmodel.costs.compute.eager_elementwise_bytes: each biased linear's output gradient
    summed over the tokens), as torchtitan's modules hold the projections (wq, wk, wv, wo, w1,
    w3, w2, one kernel each; one for q, k and v where the model fuses them: fused_qkv): the
    queries, keys and values (qkv_bias), the attention output
    and, in a dense layer, the MLP's up (and gate) and down projections (bias). A
    row-parallel output's gradient is the activation's (T h / r, r = tp with sequence
    parallelism, else the whole T h on every rank); an MoE layer's experts are moe.py's."""
    T, tp, dense = c.T, S.tp, 0 if moe else 1
    out = T * S.h / c.act_ranks
    mlp = dense * (T * (1 + c.gated) * S.f / tp + T * S.h / c.act_ranks)
    return (c.qkv_bias * qkv_elements(c) + c.bias * (out + mlp),
            (1 if c.fam.fused_qkv else 3) * c.qkv_bias + c.bias * (1 + dense * (2 + c.gated)))


def eager_input_sums(c: Context, moe: bool = False) -> sp.Expr:
    """Gradient sums of one layer's backward run op by op (perfmodel.costs.compute.
    eager_elementwise_bytes, input sums), as torchtitan's modules consume their inputs: the
    attention's input feeds wq, wk and wv (two; MLA's wq or wq_a and wkv_a, one; none where
    the model's code projects them in one layer: fused_qkv, MPT's Wqkv) and a dense gated
    MLP's feeds w1 and w3 (one). An MoE layer's MLP input is moe.py's."""
    dense = 0 if moe else 1
    attention = 0 if c.fam.fused_qkv else 1 if c.fam.mla else 2
    return sp.Integer(attention) + dense * c.gated


def eager_qkv_split(c: Context) -> sp.Expr:
    """Elements of a fused QKV projection's output on one rank, whose three gradients split's
    backward concatenates in a layer run op by op (fused_qkv; perfmodel.costs.compute.
    eager_elementwise_bytes, qkv split); 0 where the model projects them apart."""
    return qkv_elements(c) if c.fam.fused_qkv else sp.Integer(0)


def eager_layer_kernels(c: Context, fused: tuple[sp.Expr, sp.Expr]) -> tuple[sp.Expr, sp.Expr]:
    """A layer's (forward, backward) kernels with its element-wise ops as the plan's kernels run
    them: fused, kernels_per_layer_forward's (x 2 backward); eager, its element-wise kernels
    replaced by those of perfmodel.costs.compute.eager_elementwise_kernels (the ops whose bytes
    eager_elementwise_bytes counts) and an unfused attention core's
    (eager_unfused_attention_kernels)."""
    fused_elementwise = K.LAYER_ELEMENTWISE_KERNELS - K.FLASH_FUSED_ELEMENTWISE * c.flash
    forward, backward = K.eager_elementwise_kernels(
        layernorm=c.layernorm, gated=c.gated, gqa=c.gqa, flash=c.flash, rotary=c.rotary,
        narrow=K.narrow_flag(S.e), partial=int(c.fam.partial_rotary),
        bias_kernels=eager_bias_grads(c)[1], norm_weight_pass=int(c.asynchronous),
        input_sums=eager_input_sums(c), split=int(c.fam.fused_qkv))
    core = K.eager_unfused_attention_kernels(c.gqa)  # an unfused core's, op by op
    unfused, eager = 1 - c.flash, c.eager_kernels
    return (fused[0] + eager * (forward + unfused * core[0] - fused_elementwise),
            fused[1] + eager * (backward + unfused * core[1]
                                - BACKWARD_PER_FORWARD * fused_elementwise))
