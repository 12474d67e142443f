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
from perfmodel.costs.lattice import either, lmin

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
                      gated: Flag, dropout: Flag = 1,
                      attention_dropout: Flag = 1) -> dict[str, sp.Expr]:
    """Bytes moved by the memory-bound operations of one layer's forward on one GPU.

    layer norms (2): read + write T*h; softmax (fused scale-mask-softmax): read + write a*b*s^2;
    attention dropout: read + write a*b*s^2 and a 1-byte mask; activation (GeLU, or SwiGLU reading
    two inputs): read + write T*f; bias-dropout-add (2): read input and residual, write output,
    1-byte mask.
    Without sequence parallelism the layer norms and dropout-adds are replicated on every tp rank;
    with it they act on T/tp tokens (Korthikanti et al. 2022, Sec. 4.2.2). Flash attention fuses the
    softmax and dropout into the attention kernel (no s^2 traffic). A rate of 0 (dropout,
    attention_dropout 0: the model's) writes no mask, and the attention's dropout runs no kernel
    (PyTorch's dropout returns its input); the bias-dropout-adds still add.
    """
    sequence_parallel, flash, gated, dropout, attention_dropout = map(
        as_flag, (sequence_parallel, flash, gated, dropout, attention_dropout))
    rep = 1 + sequence_parallel * (tp - 1)  # tp with sequence parallelism, else 1
    return {
        "layernorm": 2 * 2 * T * h * e / rep,
        "activation": (2 + gated) * T * f * e / tp,
        "dropout_add": 2 * (3 * e + dropout) * T * h / rep,
        "softmax": (1 - flash) * 2 * a * b * s**2 * e / tp,
        "attention_dropout": attention_dropout * (1 - flash) * (2 * e + 1) * a * b * s**2 / tp,
    }


# Element-wise traffic by how the ops run (perfmodel.strategy.Kernels). The eager formulas count
# each kernel's reads and writes as autograd runs torchtitan's Llama layer (pytorch/torchtitan at
# 015ccb237, 2024-06-03, the commit of the published A100 runs: torchtitan/models/llama/model.py
# (apply_rotary_emb, repeat_kv, Attention.forward, FeedForward.forward, TransformerBlock.forward)
# and torchtitan/models/norms.py (RMSNorm: self._norm(x.float()).type_as(x) * self.weight, _norm =
# x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))), checked against a TorchDispatchMode count of
# every non-view aten op's input and output bytes (bf16, torch 2.13) of those functions. Terms of
# O(T) (the per-token mean and rsqrt) and of O(s d) (the rotary table) are left out.
FP32_BYTES = 4


def narrow_flag(e: sp.Expr) -> sp.Expr:
    """1 where the activations are narrower than fp32 (bf16, fp16: e < 4 bytes), so that an
    op's x.float() and .type_as(x) are real casts; 0 in fp32, where both return x itself:
    min(1, 4 - e) for e in {1, 2, 4}."""
    gap = FP32_BYTES - sp.sympify(e)
    return sp.Min(1, gap) if gap.is_number else sp.Min(1, gap, evaluate=False)


def fused_rope_bytes(q_elements: sp.Expr, k_elements: sp.Expr, e: sp.Expr) -> sp.Expr:
    """Bytes of a fused rotary embedding on one rank, forward or backward alike [B]:

        2 e (N_q + N_k)

    one kernel reads q (N_q elements) and writes it rotated, and likewise k (Megatron-Core's
    apply_rope_fusion: Transformer Engine's fused_apply_rotary_pos_emb, called on q and on k;
    its backward rotates the gradients back, the same traffic); Inductor fuses torchtitan's
    complex-view RoPE into the kernel that writes q and k (stack compiled).

    A partial rotation (rotary_fraction r < 1) costs the same: Megatron-Core passes the whole of
    q and k to the fused kernel with freqs r d wide (NVIDIA/Megatron-LM
    megatron/core/models/common/embeddings/rope_utils.py at 00c51e13, apply_rotary_pos_emb:
    fused_apply_rotary_pos_emb(t, freqs)), whose forward and backward rotate the first r d
    dimensions of each head and copy the others from input to output in the same kernel
    (NVIDIA/TransformerEngine transformer_engine/common/fused_rope/fused_rope.cu at 01b5648e,
    fused_rope_block_forward and _backward: "copy the rest", into an output of the whole head);
    Inductor fuses the slices, the rotation and the concatenation into one kernel each way
    (checked with torch 2.13's Inductor on transformers' glm4_moe apply_rotary_pos_emb: one
    fused kernel forward and one backward, as for a whole rotation)."""
    return 2 * e * (q_elements + k_elements)


def eager_rope_bytes(elements: sp.Expr, e: sp.Expr, fraction: sp.Expr | int = 1) -> sp.Expr:
    """Bytes of torchtitan's apply_rotary_emb on one of q or k (N elements), forward or backward
    alike [B]:

        r N (8 + 2 c (e + 4)),  c = narrow_flag(e)

    xq.float() (read e, write 4), the complex product with freqs_cis (read 4, write 4: the
    complex views are free), .type_as(xq) (read 4, write e); the backward casts the gradient to
    fp32, multiplies by conj(freqs_cis), casts back (the same bytes). r (rotary_fraction, 1 for a
    whole rotation): a partial rotation runs these ops on the rotated r N elements only, a slice
    of each head; slicing it off and putting the head back together cost apart
    (rope_split_bytes)."""
    c = narrow_flag(e)
    return elements * fraction * (8 + 2 * c * (e + FP32_BYTES))


def rope_split_bytes(elements: sp.Expr, e: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes, beyond eager_rope_bytes, of rotating part of each head of one
    of q or k (N elements) op by op [B]:

        forward  = 2 e N    torch.cat of the rotated part and the pass-through part: reads N,
                            writes N
        backward = 7 e N    the gradient of each of the two slices (slice_backward: a zero fill
                            of N, then a copy of the slice into it; 4 e N for the two) and
                            autograd's sum of q's two gradients (reads 2 N, writes N)

    The op-by-op implementations of a partial rotation split each head and concatenate it back:
    transformers' apply_rotary_pos_emb for glm4_moe and gpt_neox (q[..., :rotary_dim],
    q[..., rotary_dim:], torch.cat([q_embed, q_pass], dim=-1); huggingface/transformers
    src/transformers/models/glm4_moe/modeling_glm4_moe.py at a0699c97) and Megatron-Core's
    unfused _apply_rotary_pos_emb_bshd (t[..., :rot_dim], t[..., rot_dim:], torch.cat((t, t_pass),
    dim=-1); rope_utils.py at 00c51e13); torchtitan's apply_rotary_emb rotates whole heads and
    has no partial form, so the rotation is costed as its ops on the slice (eager_rope_bytes).
    The concatenation's backward passes views of the gradient on (no copy). Checked by a
    TorchDispatchMode count (bf16, torch 2.13): the cat's forward 2 e N; the two slice_backward
    calls and the sum, 6 e N as dispatched ops, slice_backward's input and output, its two
    kernels moving e N more."""
    return 2 * e * elements, 7 * e * elements


def eager_rmsnorm_bytes(elements: sp.Expr, e: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes of torchtitan's RMSNorm over N = T h elements [B]:

        forward  = N (20 + 2 e + 2 c (e + 4))
        backward = N (68 + 6 e + 2 c (e + 4)),   c = narrow_flag(e)

    forward, 8 kernels in bf16: x.float() (e + 4), pow (8), mean (4), + eps and rsqrt (O(T)),
    x * rsqrt (8), .type_as(x) (4 + e), * weight (2 e). Backward, 16 kernels: the weight's
    product (g * w: 2 e; g * y: 3 e; its sum over tokens: e), the cast to fp32 (e + 4),
    g * rsqrt (8), g * x (12) and its row sum (4) for the rsqrt's gradient, the mean's
    expand-divide (4), pow's gradient x^1 (8), x 2 (8), x g (12), the sum of x's two gradients
    (12), the cast back (4 + e)."""
    c = narrow_flag(e)
    casts = 2 * c * (e + FP32_BYTES)
    return elements * (20 + 2 * e + casts), elements * (68 + 6 * e + casts)


def eager_elementwise_bytes(*, norm_elements: sp.Expr, q_elements: sp.Expr,
                            k_elements: sp.Expr, kv_elements: sp.Expr,
                            expanded_elements: sp.Expr, mlp_elements: sp.Expr,
                            attention_elements: sp.Expr, e: sp.Expr, layernorm: Flag,
                            gated: Flag, gqa: Flag, flash: Flag, rotary: Flag,
                            rotary_fraction: sp.Expr | int = 1,
                            partial: Flag = 0, bias_elements: sp.Expr | int = 0,
                            norm_weight_pass: Flag = 0, input_elements: sp.Expr | int = 0,
                            input_sums: sp.Expr | int = 0, split_elements: sp.Expr | int = 0
                            ) -> dict[str, tuple[sp.Expr, sp.Expr]]:
    """(forward, backward) bytes of one layer's element-wise ops on one rank, run op by op as
    torchtitan's eager Llama layer runs them (015ccb237, see above) [B]. N_h: elements of a norm's
    input (T h / r, r = tp with sequence parallelism), N_q, N_k: the rotated queries and keys,
    N_kv: K (or V) as projected, N_rep: K (or V) expanded to every query head, N_f: the MLP's
    hidden activation (T f / tp), N_o: the attention output (T a d / tp).

        norms (2):      RMSNorm, eager_rmsnorm_bytes; LayerNorm (nn.LayerNorm, one fused kernel
                        forward): forward 2 e N_h, backward 3 e N_h (read g and x, write dx),
                        and on a GPU (norm_weight_pass = 1) 2 e N_h more: CUDA's
                        native_layer_norm_backward computes the weight's and bias's gradients
                        in a second kernel that reads g and x again (PyTorch
                        aten/src/ATen/native/cuda/layer_norm_kernel.cu at 0005c538e4,
                        LayerNormBackwardKernelImplInternal: layer_norm_grad_input_kernel, then
                        GammaBetaBackwardCUDAKernel); the CPU kernel sums them row by row in
                        its one pass (aten/src/ATen/native/cpu/layer_norm_kernel.cpp)
        rope:           eager_rope_bytes of N_q and of N_k, forward and backward alike, of
                        their rotated share r (rotary_fraction); a partial rotation (partial =
                        1) adds the split and concatenation of each (rope_split_bytes)
        repeat_kv:      grouped-query attention (a > kv) only: expand + reshape copies K and V,
                        e (N_kv + N_rep) each; the backward sums the copies' gradients back,
                        the same bytes (with a = kv repeat_kv returns K and V as they are)
        activation:     SwiGLU, F.silu(w1 x) * w3 x: forward silu (2 e) + mul (3 e), backward
                        two muls (3 e each) + silu_backward (3 e); GeLU: 2 e, backward 3 e (x N_f)
        residual:       two adds (3 e N_h each); backward: the residual stream's two gradient
                        sums, where it feeds a norm and the next residual add (3 e N_h each)
        transpose:      output.transpose(1, 2).contiguous(): a copy (2 e N_o) after the unfused
                        attention's products; none with flash attention, whose kernel writes
                        (b, s, heads, d) and returns it transposed (PyTorch's
                        _scaled_dot_product_flash_attention: the transpose back is free); its
                        backward passes the strided gradient on (no copy)
        bias grads:     a linear layer's bias is added in its GEMM (cuBLASLt's bias epilogue:
                        no pass forward), but its gradient is autograd's sum over the tokens of
                        the output's gradient (addmm's broadcast bias reduced by sum_to): one
                        kernel reading e N_b backward, N_b the biased outputs' elements
                        (bias_elements)
        input sums:     a tensor that feeds several ops gets one gradient from each, which
                        autograd adds up (torch/csrc/autograd/input_buffer.cpp, InputBuffer::
                        accumulate: one add per gradient after the first, 3 e N each): the
                        attention's input feeding wq, wk and wv (two sums; MLA's wq and wkv_a,
                        one) and a gated MLP's feeding w1 and w3 (one), input_sums of them on
                        input_elements (N_in: the projections' input, T h gathered: under
                        sequence parallelism the gradients are summed before the
                        reduce-scatter); backward only
        qkv split:      a model whose code projects q, k and v in one layer and splits its
                        output (TransformerSpec.fused_qkv: MPT's Wqkv, GPT-2's c_attn) sums no
                        gradients of the attention's input; split's backward concatenates the
                        three gradients instead (torch's split_backward: one cat), reading and
                        writing e N_qkv, split_elements (the projection's output on the rank);
                        backward only
    """
    layernorm, gated, gqa, flash, rotary, partial, weight_pass = map(
        as_flag, (layernorm, gated, gqa, flash, rotary, partial, norm_weight_pass))
    rms_fwd, rms_bwd = eager_rmsnorm_bytes(norm_elements, e)
    norm_fwd = layernorm * 2 * e * norm_elements + (1 - layernorm) * rms_fwd
    norm_bwd = layernorm * (3 + 2 * weight_pass) * e * norm_elements + (1 - layernorm) * rms_bwd
    rope = rotary * (eager_rope_bytes(q_elements, e, rotary_fraction)
                     + eager_rope_bytes(k_elements, e, rotary_fraction))
    split_fwd, split_bwd = rope_split_bytes(q_elements + k_elements, e)
    repeat = gqa * 2 * e * (kv_elements + expanded_elements)
    return {
        "norms": (2 * norm_fwd, 2 * norm_bwd),
        "rope": (rope + rotary * partial * split_fwd, rope + rotary * partial * split_bwd),
        "repeat_kv": (repeat, repeat),
        "activation": ((2 + 3 * gated) * e * mlp_elements, (3 + 6 * gated) * e * mlp_elements),
        "residual": (2 * 3 * e * norm_elements, 2 * 3 * e * norm_elements),
        "transpose": ((1 - flash) * 2 * e * attention_elements, sp.Integer(0)),
        "bias_grads": (sp.Integer(0), e * sp.sympify(bias_elements)),
        "input_sums": (sp.Integer(0), 3 * e * sp.sympify(input_sums) * input_elements),
        "qkv_split": (sp.Integer(0), 2 * e * sp.sympify(split_elements)),
    }


# The validation job's unfused attention core (workload.model.unfused_attention) run op by op,
# per element of the scores (b a s^2 / tp on a rank): forward masked_fill_ in place (reads and
# writes the scores, 2 e; its s^2 bool mask, broadcast over the batch and the heads, once) and
# the softmax (2 e); backward the softmax's (the gradient and the output read, the input's
# gradient written: 3 e) and the masked_fill of the gradient, which ATen runs as a clone and an
# in-place masked_fill_ (aten/src/ATen/native/TensorAdvancedIndexing.cpp, masked_fill: 2 e +
# 2 e, the mask once). Megatron's fused scale-mask-softmax reads and writes them once (2 e, its
# backward twice that).
EAGER_SCORES_FORWARD_BYTES = 4  # x e per element of the scores
EAGER_SCORES_BACKWARD_BYTES = 7


def eager_unfused_attention_bytes(*, scores: sp.Expr, mask: sp.Expr, q_elements: sp.Expr,
                                  kv_elements: sp.Expr, e: sp.Expr,
                                  gqa: Flag) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes of the validation job's unfused attention core beyond its two
    batched products, op by op (workload.model.unfused_attention, counted on torch's dispatcher
    in bf16: tests/unit/test_elementwise_kernels.py) [B]. scores: b a s^2 / tp elements on the
    rank, mask: the s^2 causal mask's elements (a byte each: written by ones, read and written
    by triu_, read by each fill: 4 forward, 1 backward), q_elements, kv_elements: N_q = T a d /
    tp, N_kv = T kv d / tp.

        scores:  (4 e, 7 e) per element (EAGER_SCORES_FORWARD_BYTES, _BACKWARD_BYTES)
        scaling: q x d^-1/2 forward and its gradient backward, 2 e N_q each way
        clones:  the batched products reshape the heads' transposed views (b, heads, s, d) of
                 the projections into (b heads, s, d), which copies the queries, and K and V
                 unless a > kv, whose repeat_interleave wrote them contiguous (the eager
                 repeat_kv term): 2 e (N_q + (1 - gqa) 2 N_kv) forward; backward the output's
                 and the queries' gradients and the keys' and values' (after the group's sum),
                 2 e (2 N_q + 2 N_kv) (a rank holding one kv head skips the last two: a
                 view; counted all the same)
    The output's transpose before the output projection is the eager count's (transpose)."""
    g = as_flag(gqa)
    forward = EAGER_SCORES_FORWARD_BYTES * e * scores + 4 * mask + 2 * e * q_elements \
        + 2 * e * (q_elements + (1 - g) * 2 * kv_elements)
    backward = EAGER_SCORES_BACKWARD_BYTES * e * scores + mask + 2 * e * q_elements \
        + 2 * e * (2 * q_elements + 2 * kv_elements)
    return forward, backward


def eager_unfused_attention_kernels(gqa: Flag) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) element-wise kernels of the same ops (eager_unfused_attention_bytes):
    forward q's scaling, the clones of the queries (and of K and V unless a > kv), the causal
    mask's ones and triu_, masked_fill_ and the softmax (6 + 2 (1 - gqa)); backward the clones
    of the output's, the queries', the keys' and the values' gradients, the softmax's backward,
    the mask's clone and masked_fill_ and the scaling's (8)."""
    return 6 + 2 * (1 - as_flag(gqa)), sp.Integer(8)


def gqa_expand_bytes(expanded_elements: sp.Expr, e: sp.Expr, gqa: Flag) -> sp.Expr:
    """Bytes a compiled layer (Inductor) moves beyond the fused kernels' to hand grouped-query K
    and V to the attention kernel (an extern call it cannot fuse into), forward or backward
    alike [B]: 2 e N_rep where a > kv. Forward: the kernel that rotates k writes K expanded to
    every query head (N_rep, not N_kv), and V is read and written expanded; backward: the
    expanded gradients are read and summed back, the same bytes."""
    return as_flag(gqa) * 2 * e * expanded_elements


def eager_elementwise_kernels(*, layernorm: Flag, gated: Flag, gqa: Flag, flash: Flag,
                              rotary: Flag, narrow: sp.Expr, partial: Flag = 0,
                              bias_kernels: sp.Expr | int = 0,
                              norm_weight_pass: Flag = 0, input_sums: sp.Expr | int = 0,
                              split: Flag = 0) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) element-wise kernels of one layer run op by op, counted from the same
    ops as eager_elementwise_bytes (c = narrow: the casts):
    norms 2 x (6 + 2 c, 14 + 2 c) (LayerNorm 2 x (1, 1 + w), w = norm_weight_pass: the weight
    gradients' kernel on a GPU); the biases' gradients (0, bias_kernels); RoPE
    2 x (1 + 2 c, 3 + 2 c) (the backward's conj and clone of the rotary table), and with a
    partial rotation 2 x (1, 5) more
    (the concatenation; the two slices' zero fills and copies, the gradients' sum:
    rope_split_bytes); repeat_kv (2, 2); activation (1 + gated, 1 + 2 gated); residual (2, 2);
    transpose (1 - flash, 0); the gradients' sums of inputs that feed several projections
    (0, input_sums); a fused QKV projection's split (0, split: the gradients' cat)."""
    layernorm, gated, gqa, flash, rotary, partial, weight_pass = map(
        as_flag, (layernorm, gated, gqa, flash, rotary, partial, norm_weight_pass))
    norm = (layernorm + (1 - layernorm) * (6 + 2 * narrow),
            layernorm * (1 + weight_pass) + (1 - layernorm) * (14 + 2 * narrow))
    forward = 2 * norm[0] + rotary * 2 * (1 + 2 * narrow + partial) + 2 * gqa + 1 + gated + 2 \
        + (1 - flash)
    backward = 2 * norm[1] + rotary * 2 * (3 + 2 * narrow + 5 * partial) + 2 * gqa + 1 \
        + 2 * gated + 2 + bias_kernels + input_sums + as_flag(split)
    return forward, backward


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


def kernels_per_layer_forward(*, sequence_parallel: Flag, flash: Flag,
                              attention_dropout: Flag = 1) -> sp.Expr:
    """Kernels launched by one layer's forward: 6 GEMMs (5 with fused attention), 11 element-wise
    (2 norms, activation, 2 dropout-adds, 4 bias adds, softmax and dropout unless fused; no
    dropout kernel where the attention's rate is 0: PyTorch's dropout returns its input), and 2
    all-reduces (4 all-gathers/reduce-scatters with sequence parallelism)."""
    sequence_parallel, flash, attention_dropout = map(
        as_flag, (sequence_parallel, flash, attention_dropout))
    gemms = LAYER_GEMM_KERNELS - FLASH_FUSED_GEMMS * flash
    elementwise = LAYER_ELEMENTWISE_KERNELS - FLASH_FUSED_ELEMENTWISE * flash \
        - (1 - flash) * (1 - attention_dropout)
    comm = LAYER_COLLECTIVE_KERNELS + (SEQUENCE_PARALLEL_COLLECTIVE_KERNELS
                                       - LAYER_COLLECTIVE_KERNELS) * sequence_parallel
    return sp.sympify(gemms + elementwise + comm)


# The loss's bytes per element of the logits on one rank (T x V / tp), forward and backward, as
# each implementation's kernels move them (e: the logits' bytes; an upcast copies them only
# where they are not fp32 already):
# - PyTorch's F.cross_entropy (Plan.cross_entropy torch, or unfused with eager kernels) and on
#   the logits' own dtype (no-upcast): ~3 passes over the values forward (read the logits, write
#   the log-softmax, read it back), twice that backward; its kernels' passes depend on whether a
#   row of the shard fits in shared memory (not modelled)
CROSS_ENTROPY_PASSES = 3
# - Megatron's vocab_parallel_cross_entropy (unfused; megatron/core/tensor_parallel/
#   cross_entropy.py at core_r0.9.0 and d98e8a64dd, megatron/mpu/cross_entropy.py in 2022), op by
#   op: forward the upcast (e in, 4 out), max (reads 4), the in-place shift (4 + 4), exp into the
#   same buffer (4 + 4), its sum (4), the in-place normalisation (4 + 4); backward the in-place
#   scaling by the loss's gradient (4 + 4) and the upcast's backward (4 in, e out)
MEGATRON_LOSS_FORWARD_BYTES = 32  # beside the upcast's e + 4
MEGATRON_LOSS_BACKWARD_BYTES = 8  # beside the upcast's backward, 4 + e
# - Megatron-Core's native fusion (cross_entropy_loss_fusion, impl native: megatron/core/fusions/
#   fused_cross_entropy.py, each step under torch.compile): the upcast with the max in one kernel
#   (e in, 4 out), the shift, exp and sum in one (4 + 4), the normalisation (4 + 4); backward one
#   kernel reads the softmax, writes it back (the mutated input) and writes the gradient in bf16
#   (.to(torch.bfloat16) whatever the logits), which autograd casts to fp32 logits' dtype
NATIVE_LOSS_FORWARD_BYTES = 20  # beside the upcast's e where the logits are not fp32
NATIVE_LOSS_BACKWARD_BYTES = 8  # beside the bf16 gradient's 2 (and its cast, 2 + 4, in fp32)
BF16_BYTES = 2
# - Transformer Engine's fused cross entropy (te; transformer_engine/pytorch/triton/
#   cross_entropy.py, v2.4 to v2.17): an online-softmax kernel reads the logits, a second reads
#   them again and writes their gradient in place (3 e); the backward scales it in place
#   (element_mul_kernel, 2 e: Megatron's per-token loss gives a gradient other than 1.0). (From
#   v2.18 the gradient is fp32, written beside the logits: not modelled.)
TE_LOSS_FORWARD_PASSES = 3
TE_LOSS_BACKWARD_PASSES = 2
# - flash-attn's fused cross entropy (flash-attn; flash_attn/ops/triton/cross_entropy.py at
#   058ad35a: cross_entropy_fwd_kernel, an online softmax over each row's blocks, reads the
#   logits once and writes a float per row; cross_entropy_bwd_kernel reads them again and writes
#   their gradient, a new tensor (torch.empty_like) unless inplace_backward)
FLASH_LOSS_FORWARD_PASSES = 1
FLASH_LOSS_BACKWARD_PASSES = 2


@dataclass(frozen=True)
class LossKernel:
    """Which implementation runs the loss, as 0/1 indicators (or their symbols)."""

    te: sp.Expr | int = 0
    native: sp.Expr | int = 0
    no_upcast: sp.Expr | int = 0
    torch: sp.Expr | int = 0  # PyTorch's F.cross_entropy on fp32 copies (or unfused, eager)
    flash: sp.Expr | int = 0  # flash-attn's fused cross entropy


def cross_entropy_bytes(T: sp.Expr, V: sp.Expr, tp: sp.Expr, kernel: LossKernel,
                        e: sp.Expr | int = 2) -> tuple[sp.Expr, sp.Expr]:
    """The loss's forward and backward bytes on one rank: per element of the T x V / tp logits,
    the implementation's (module constants above)."""
    upcast = lmin(1, FP32_BYTES - e)  # 1 where the logits are not fp32 already (e < 4)
    megatron = (MEGATRON_LOSS_FORWARD_BYTES + (e + FP32_BYTES) * upcast,
                MEGATRON_LOSS_BACKWARD_BYTES + (FP32_BYTES + e) * upcast)
    native = (NATIVE_LOSS_FORWARD_BYTES + e * upcast,
              NATIVE_LOSS_BACKWARD_BYTES + BF16_BYTES + (BF16_BYTES + e) * (1 - upcast))
    pytorch = tuple(n * CROSS_ENTROPY_PASSES * either(kernel.no_upcast, e, FP32_BYTES)
                    for n in (1, 2))
    te = (TE_LOSS_FORWARD_PASSES * e, TE_LOSS_BACKWARD_PASSES * e)
    flash = (FLASH_LOSS_FORWARD_PASSES * e, FLASH_LOSS_BACKWARD_PASSES * e)
    elements = T * V / tp
    forward, backward = (
        either(kernel.flash, flash[i], either(kernel.te, te[i], either(
            kernel.native, native[i], either(kernel.no_upcast + kernel.torch, pytorch[i],
                                             megatron[i])))) * elements
        for i in (0, 1))
    return forward, backward
