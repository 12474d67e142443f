"""FLOPs, bytes and roofline times of the operations of a transformer layer.

Every function takes sympy symbols (or numbers) and returns a sympy expression. Shapes follow
Megatron-LM (Shoeybi et al. 2019; Narayanan et al. SC21): tokens T = b*s per micro-batch, hidden h,
heads a, key/value heads kv, head size d (h/a unless a model gives it: the attention is a*d wide,
which Qwen3 and Mistral-NeMo make differ from h), MLP width f, vocabulary V, tensor-parallel
degree tp.
Times are per GPU and per micro-batch [s]; FLOPs count a multiply-add as 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TypeAlias

import sympy as sp

from perfmodel.costs.gemm_efficiency import gemm_time_s

# An option is a Flag: True/False, 0/1, or a 0/1 indicator symbol, so one expression can cover every
# option (evaluated over arrays of plans) or be specialised to one (printed by `perfmodel explain`).
Flag: TypeAlias = bool | int | sp.Expr


def as_flag(value: Flag) -> sp.Expr:
    """True/False or 0/1 as a sympy integer; an indicator symbol as it is."""
    return sp.Integer(int(value)) if isinstance(value, (bool, int)) else value


@dataclass(frozen=True)
class Gemm:
    """`batch` independent (m x k) @ (k x n) products."""

    name: str
    m: sp.Expr
    n: sp.Expr
    k: sp.Expr
    batch: sp.Expr = sp.Integer(1)

    @property
    def flops(self) -> sp.Expr:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class Device:
    """The symbols of one GPU that compute costs need."""

    peak_flops_per_s: sp.Expr
    memory_bandwidth_bytes_per_s: sp.Expr  # effective (datasheet x efficiency)
    kernel_overhead_s: sp.Expr
    gemm_params: dict[str, sp.Expr]


def layer_gemms(T: sp.Expr, b: sp.Expr, s: sp.Expr, h: sp.Expr, a: sp.Expr, kv: sp.Expr,
                f: sp.Expr, tp: sp.Expr, gated: Flag, d: sp.Expr | None = None) -> list[Gemm]:
    """The forward GEMMs of one transformer layer on one of tp tensor-parallel ranks (Megatron 1D).

    QKV (column-parallel), scores Q K^T and context A V (heads split over tp), output projection
    (row-parallel), MLP up (and gate) (column-parallel) and down (row-parallel).
    Sum of FLOPs with kv = a, ungated, f = 4h: (24 T h^2 + 4 T s h) / tp  (Narayanan et al. 2021,
    Eq. 3).
    The queries and the attention output are a*d wide (d: head size, default h/a).
    """
    d = h / a if d is None else d
    up = (1 + as_flag(gated)) * f
    return [
        Gemm("qkv", T, (a * d + 2 * kv * d) / tp, h),
        Gemm("attention_scores", s, s, d, batch=b * a / tp),
        Gemm("attention_context", s, d, s, batch=b * a / tp),
        Gemm("attention_output", T, h, a * d / tp),
        Gemm("mlp_up", T, up / tp, h),
        Gemm("mlp_down", T, h, f / tp),
    ]


ATTENTION_CORE = ("attention_scores", "attention_context")

# Causal (decoder) self-attention: a fused kernel skips the masked upper triangle of the scores, so
# it does half of the two s^2 products' FLOPs (FlashAttention-2, Dao 2023, Sec. 4.1: "with causal
# mask, we divide this number by 2"; Megatron-LM's num_floating_point_operations counts the core
# attention so since 8873b55, 2025-03: "only half of the attention matrix is non-zero"). Every
# model perfmodel predicts is a causal decoder.
CAUSAL_FRACTION = sp.Rational(1, 2)
# A flash kernel's backward does 2.5 x its forward's FLOPs: 5 matmuls against 2, because it
# recomputes the scores S = Q K^T and P instead of storing them (FlashAttention-2, Sec. 4.1).
FLASH_BACKWARD_PER_FORWARD = sp.Rational(5, 2)


def attention_core_flops(b: sp.Expr, s: sp.Expr, a: sp.Expr, d: sp.Expr, tp: sp.Expr, *,
                         causal: bool = True, share: sp.Expr | None = None) -> sp.Expr:
    """FLOPs of one layer's attention core forward on one GPU: scores Q K^T and context A V,
    2 x 2 b (a / tp) s^2 d, halved for a causal mask (CAUSAL_FRACTION), or `share` of it (the
    query-key pairs computed over s^2: attended_share)."""
    full = 4 * b * a * s**2 * d / tp
    if share is not None:
        return share * full
    return CAUSAL_FRACTION * full if causal else full


def windowed_pairs(s: sp.Expr, w: sp.Expr) -> sp.Expr:
    """Query-key pairs of one sequence in a causal layer with a sliding window of w <= s tokens:
    query i (from 0) attends min(i + 1, w) keys (itself and the w - 1 before it; Mistral 7B,
    Jiang et al. 2023, Sec. 2; GPT-OSS's and Gemma-2's alternating layers), so

        P(w) = sum_i min(i + 1, w) = w (w + 1) / 2 + (s - w) w = w s - w (w - 1) / 2   [pairs]

    exactly (w = s: s (s + 1) / 2; w = 1: s)."""
    return w * s - w * (w - 1) / 2


def attended_share(s: sp.Expr, w: sp.Expr | None = None,
                   windowed_share: sp.Expr = 0) -> sp.Expr:
    """The query-key pairs a layer's causal attention computes, over s^2, on average over the
    layers [dimensionless]:

        (1 - rho) / 2 + rho P(w) / s^2

    full-attention layers compute the causal half (CAUSAL_FRACTION, FlashAttention-2's and
    Megatron-LM's count), the share rho of windowed layers P(w) (windowed_pairs). A flash kernel
    with a window skips the blocks outside it (its FLOPs follow P(w)); an attention sink (GPT-OSS:
    a learned logit per head in each softmax's denominator) adds one exponential per query and
    head, a * s per layer: nothing next to the 4 a d s^2 / 2 of the products."""
    if w is None:
        return CAUSAL_FRACTION
    return (1 - windowed_share) * CAUSAL_FRACTION + windowed_share * windowed_pairs(s, w) / s**2


def flash_attention_s(flops: sp.Expr, peak_flops_per_s: sp.Expr, max_fraction: sp.Expr,
                      half_seq: sp.Expr, s: sp.Expr) -> sp.Expr:
    """Time of a fused (flash) attention kernel [s]: compute-bound, no s^2 bytes,

        t = FLOPs / (F_peak E) (1 + s_half / s)

    i.e. it reaches E (max_fraction) of the peak on long sequences and half of that at s_half
    tokens (a per-row cost: loading Q, rescaling, writing O and the log-sum-exp). E and s_half
    are fitted per hardware to the kernel's published benchmark (HardwareSpec.flash_attention)."""
    return flops / (peak_flops_per_s * max_fraction) * (1 + half_seq / s)


def logits_gemm(T: sp.Expr, h: sp.Expr, V: sp.Expr, tp: sp.Expr) -> Gemm:
    """The output layer (vocabulary split over tp): T x h @ h x V/tp."""
    return Gemm("logits", T, V / tp, h)


def gemm_time(g: Gemm, bytes_per_element: sp.Expr, dev: Device,
              output_bytes_per_element: sp.Expr | None = None) -> sp.Expr:
    """Roofline time of one GEMM [s] (see perfmodel.costs.gemm_efficiency); an FP8 GEMM reads
    1-byte operands and writes a bf16 output (output_bytes_per_element). Built once per shape
    and device (a layer's attention GEMMs are the same in its dense and MoE layers)."""
    return _gemm_time(g.m, g.n, g.k, g.batch, sp.sympify(bytes_per_element),
                      dev.peak_flops_per_s, dev.memory_bandwidth_bytes_per_s,
                      tuple(sorted(dev.gemm_params.items())), output_bytes_per_element)


@lru_cache(maxsize=4096)
def _gemm_time(m: sp.Expr, n: sp.Expr, k: sp.Expr, batch: sp.Expr, bytes_per_element: sp.Expr,
               peak: sp.Expr, bandwidth: sp.Expr, params: tuple[tuple[str, sp.Expr], ...],
               output_bytes_per_element: sp.Expr | None) -> sp.Expr:
    return gemm_time_s(m, n, k, batch, bytes_per_element, peak, bandwidth, **dict(params),
                       output_bytes_per_element=output_bytes_per_element)


def elementwise_bytes(T: sp.Expr, b: sp.Expr, s: sp.Expr, h: sp.Expr, a: sp.Expr, f: sp.Expr,
                      tp: sp.Expr, e: sp.Expr, *, sequence_parallel: Flag, flash: Flag,
                      gated: Flag) -> dict[str, sp.Expr]:
    """Bytes moved by the memory-bound operations of one layer's forward on one GPU.

    layer norms (2): read + write T*h; softmax (fused scale-mask-softmax): read + write a*b*s^2;
    attention dropout: read + write a*b*s^2 and a 1-byte mask; activation (GeLU, or SwiGLU reading
    two inputs): read + write T*f; bias-dropout-add (2): read input and residual, write output,
    1-byte mask.
    Without sequence parallelism the layer norms and dropout-adds are replicated on every tp rank;
    with it they act on T/tp tokens (Korthikanti et al. 2022, Sec. 4.2.2). Flash attention fuses the
    softmax and dropout into the attention kernel (no s^2 traffic).
    """
    sequence_parallel, flash, gated = map(as_flag, (sequence_parallel, flash, gated))
    rep = 1 + sequence_parallel * (tp - 1)  # tp with sequence parallelism, else 1
    return {
        "layernorm": 2 * 2 * T * h * e / rep,
        "activation": (2 + gated) * T * f * e / tp,
        "dropout_add": 2 * (3 * e + 1) * T * h / rep,
        "softmax": (1 - flash) * 2 * a * b * s**2 * e / tp,
        "attention_dropout": (1 - flash) * (2 * e + 1) * a * b * s**2 / tp,
    }


def fp8_cast_elements(T: sp.Expr, h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr,
                      tp: sp.Expr, ranks: sp.Expr, gated: Flag,
                      d: sp.Expr | None = None) -> tuple[sp.Expr, sp.Expr]:
    """Elements one rank casts to FP8 in one layer's forward and in its backward, per micro-batch
    (perfmodel.costs.fp8: each FP8 GEMM's activation operand in the forward, its grad output in
    the backward; the weights once per step, apart):

        forward  = 2 T h / r + T (a d + f) / tp
                   (QKV and MLP-up inputs, cast on the rank's shard before the sequence-parallel
                   all-gather; attention-output and MLP-down inputs)
        backward = 2 T h / r + T (a d + 2 kv d + (1 + gated) f) / tp
                   (the grad outputs of the attention output and MLP down, then of QKV and MLP up)

    r: the ranks an activation is split over (tp with sequence parallelism, else 1: every rank
    casts the whole replicated tensor). Grid layouts (2d, 3d) hold 1/tp of each: r = tp."""
    d = h / a if d is None else d
    gated = as_flag(gated)
    forward = 2 * T * h / ranks + T * (a * d + f) / tp
    backward = 2 * T * h / ranks + T * (a * d + 2 * kv * d + (1 + gated) * f) / tp
    return forward, backward


def memory_time(nbytes: sp.Expr, dev: Device) -> sp.Expr:
    """Time of a memory-bound operation: bytes / effective memory bandwidth [s]."""
    return nbytes / dev.memory_bandwidth_bytes_per_s


# Kernels one layer's forward launches, counted from the layer as this module models it (the
# GEMMs of layer_gemms, the passes of elementwise_bytes; Megatron-LM's unfused GPT layer):
LAYER_GEMM_KERNELS = 6  # QKV, scores, context, attention output, MLP up (with its gate), down
LAYER_ELEMENTWISE_KERNELS = 11  # 2 norms, activation, 2 dropout-adds, 4 bias adds, softmax, dropout
FLASH_FUSED_GEMMS = 1  # flash attention: scores and context in one kernel ...
FLASH_FUSED_ELEMENTWISE = 2  # ... with the softmax and the attention dropout
LAYER_COLLECTIVE_KERNELS = 2  # Megatron 1D: an all-reduce after the attention, one after the MLP
SEQUENCE_PARALLEL_COLLECTIVE_KERNELS = 4  # each all-reduce an all-gather + a reduce-scatter


def kernels_per_layer_forward(*, sequence_parallel: Flag, flash: Flag) -> sp.Expr:
    """Kernels launched by one layer's forward: 6 GEMMs (5 with fused attention), 11 element-wise
    (2 norms, activation, 2 dropout-adds, 4 bias adds, softmax and dropout unless fused), and 2
    all-reduces (4 all-gathers/reduce-scatters with sequence parallelism)."""
    sequence_parallel, flash = as_flag(sequence_parallel), as_flag(flash)
    gemms = LAYER_GEMM_KERNELS - FLASH_FUSED_GEMMS * flash
    elementwise = LAYER_ELEMENTWISE_KERNELS - FLASH_FUSED_ELEMENTWISE * flash
    comm = LAYER_COLLECTIVE_KERNELS + (SEQUENCE_PARALLEL_COLLECTIVE_KERNELS
                                       - LAYER_COLLECTIVE_KERNELS) * sequence_parallel
    return sp.sympify(gemms + elementwise + comm)


CROSS_ENTROPY_PASSES = 3  # read the logits, write the fp32 softmax, read it back
FP32_BYTES = 4


def cross_entropy_bytes(T: sp.Expr, V: sp.Expr, tp: sp.Expr) -> sp.Expr:
    """Vocabulary-parallel cross entropy reads the logits, writes fp32 softmax, reads it back: ~3
    passes over T*V/tp fp32 values."""
    return CROSS_ENTROPY_PASSES * FP32_BYTES * T * V / tp
