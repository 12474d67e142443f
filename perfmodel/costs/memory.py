"""Memory per GPU: parameters, model states (weights, gradients, optimizer), activations.

Sources: Narayanan et al. SC21 (Eq. 2, parameter count); Rajbhandari et al. 2020 ("ZeRO", Sec. 3:
2 + 2 + K bytes per parameter with K = 12 for mixed-precision Adam); Korthikanti et al. 2022
("Reducing Activation Recomputation", Table 2 and Sec. 4.3) for activations.
"""

from __future__ import annotations

import sympy as sp

from perfmodel.costs.compute import Flag, as_flag
from perfmodel.costs.lattice import applied, times
from perfmodel.costs.precision import (  # noqa: F401  (re-exported)
    model_state_bytes_per_param,
    optimizer_step_bytes_per_param,
)

# an MTP module projects [hidden; embedding] (2h) to h (DeepSeek-V3 Sec. 2.2)
MTP_PROJECTION = 2


def layer_params(h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr, *, gated: Flag, bias: Flag,
                 qkv_bias: Flag, layernorm: Flag, d: sp.Expr | None = None,
                 sinks: Flag = 0) -> dict[str, sp.Expr]:
    """Parameters of one layer, split into those tensor parallelism shards and those it replicates.

    GPT (kv = a, f = 4h, biases, LayerNorm): 12 h^2 + 13 h  (Narayanan et al. 2021, Eq. 2).
    d: head size (default h/a); the queries and the attention output are a*d wide.
    sinks: GPT-OSS's attention sinks, a learned logit per head (a per layer, split with the heads).
    """
    gated, bias, qkv_bias, layernorm = map(as_flag, (gated, bias, qkv_bias, layernorm))
    d = h / a if d is None else d
    qkv_out = a * d + 2 * kv * d
    up = (1 + gated) * f
    sharded = qkv_out * h + a * d * h + up * h + f * h + qkv_bias * qkv_out + bias * up \
        + as_flag(sinks) * a
    # two norms (LayerNorm: weight and bias; RMSNorm: weight), row-parallel output biases
    replicated = 2 * (1 + layernorm) * h + bias * 2 * h
    return {"sharded": sharded, "replicated": replicated}


def linear_weights(h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr, *, gated: Flag,
                   d: sp.Expr | None = None) -> sp.Expr:
    """The weight matrices of one layer's linear layers (QKV, attention output, MLP up (and gate),
    MLP down), without biases or norms: what an fp8 plan casts to FP8 (perfmodel.costs.fp8).

        (a d + 2 kv d) h + a d h + (1 + gated) f h + f h     (GPT: 12 h^2)"""
    d = h / a if d is None else d
    return (a * d + 2 * kv * d) * h + a * d * h + (1 + as_flag(gated)) * f * h + f * h


def embedding_params(h: sp.Expr, V: sp.Expr, s: sp.Expr, *,
                     learned_positions: Flag) -> dict[str, sp.Expr]:
    """Word embedding (vocabulary split over tp) and learned positions (replicated)."""
    return {"sharded": V * h, "replicated": as_flag(learned_positions) * s * h}


def zero_divisors(zero1: Flag, zero2: Flag, zero3: Flag, dp: sp.Expr) -> dict[str, sp.Expr]:
    """ZeRO stage 1 shards optimizer states over dp, stage 2 also gradients, stage 3 also weights.

    zeroK is the flag "stage >= K"."""
    zero1, zero2, zero3 = map(as_flag, (zero1, zero2, zero3))
    return {
        "weights": 1 + zero3 * (dp - 1),
        "gradients": 1 + zero2 * (dp - 1),
        "optimizer_states": 1 + zero1 * (dp - 1),
    }


def layer_activation_bytes(b: sp.Expr, s: sp.Expr, h: sp.Expr, a: sp.Expr, kv: sp.Expr,
                           f: sp.Expr, tp: sp.Expr, e: sp.Expr, *, sequence_parallel: Flag,
                           full: Flag, selective: Flag, flash: Flag, gated: Flag,
                           op: Flag = 0, d: sp.Expr | None = None, fp8: Flag = 0,
                           fp8_saved: sp.Expr | int = 1,
                           attention: dict[str, sp.Expr] | None = None,
                           mlp: sp.Expr | None = None,
                           fp8_attention: dict[str, sp.Expr] | None = None,
                           fp8_mlp: dict[str, sp.Expr] | None = None,
                           per_op: sp.Expr | None = None, dropout: Flag = 1,
                           attention_dropout: Flag = 1,
                           full_inputs: sp.Expr | int = 1) -> sp.Expr:
    """Activation bytes one layer keeps for the backward pass, per micro-batch, on one GPU.

    With e = 2 (16-bit), 1-byte dropout masks, kv = a, f = 4h, no gating (Korthikanti et al. 2022,
    Table 2):
      no parallelism                 s b h (34 + 5 a s / h)
      tensor parallel                s b h (10 + 24/t + 5 a s / (h t))
      tensor + sequence parallel     s b h / t (34 + 5 a s / h)
      tensor + selective recompute   s b h (10 + 24/t)
      tensor + sequence + selective  s b h 34 / t
      full recompute                 2 s b h   (2 s b h / t with sequence parallelism)
    Terms: layer-norm inputs 2x e T h, QKV and MLP inputs 2x e T h, dropout masks 2x T h (replicated
    across tp unless sequence parallel); Q, K e T (a d + kv d), V e T kv d, output-projection
    input e T a d (a d = h unless the model gives its head size d), activation input e T f (2x for
    SwiGLU), MLP-down input e T f (sharded); softmax output,
    dropout mask and dropout output (2e + 1) a b s^2 (sharded; with flash attention replaced by the
    fp32 log-sum-exp, 4 a b s). Without dropout (dropout = 0: the model's hidden rate is 0,
    and PyTorch's dropout returns its input without a mask) the two masks 2 T h go; without
    attention dropout (attention_dropout = 0) the unfused core keeps its softmax output alone,
    e a b s^2 (Korthikanti's 5 a s / h is its three: softmax output, mask, dropped output).
    Full recompute keeps its layer's input, or full_inputs of it where layers are checkpointed
    in groups (Megatron's uniform method: a group's input for its k layers). Selective
    recompute drops either: it checkpoints the core attention,
    keeping only its inputs (Q, K, V), so what the attention kernel stores for its backward is
    recomputed with it.
    Per-op recompute (`op`, torchtitan's op-level selective AC, torchtitan/distributed/
    activation_checkpoint.py: the outputs of every other matmul (the 1st, 3rd, ... of the layer,
    counted per layer: Q, V, MLP up (w1) and, SwiGLU, MLP down (w2)), of the flash attention kernel
    and of the reduce-scatters are saved, the rest recomputed) keeps per layer: its input e T h
    (/tp with sequence parallelism), e T (a d + kv d + f) / tp (the column-parallel outputs),
    SwiGLU's MLP-down output e T h (a row-parallel output: partial sums, whole on each rank), the
    attention output e T a d / tp and its fp32 log-sum-exp 4 a b s / tp (flash; an unfused core's
    batched products are not in the save list and are recomputed), and with sequence parallelism
    the two reduce-scatter outputs 2 e T h / tp. `per_op`: another layer's per-op count (MLA, a
    mixture of experts: perfmodel.step.op_recompute.kept_bytes).
    `full`, `selective` and `op` are the shares of the layers under each policy (0/1 flags, or a
    fraction with Plan.recompute_every); the rest keep everything.
    FP8 (fp8 = 1; perfmodel.costs.fp8): Transformer Engine saves an FP8 GEMM's input for the
    weight gradient as its columnwise FP8 copy, fp8_saved bytes per element (1; MXFP8 1 + 1/32)
    instead of e (TE docs: "one byte per element (FP8 columnwise) instead of two"): the QKV and
    MLP-up inputs (the norms' outputs) and the MLP-down input; the attention output is kept in
    bf16 by a flash kernel for its own backward, so the attention-output projection's FP8 copy
    comes on top of it (TE docs, performance considerations: "if it is the attention output which
    is saved anyway"); unfused, the copy replaces it. Per-op recompute (torchtitan, no TE) as bf16.
    Other attentions and MLPs give what their FP8 copies add instead: `fp8_attention` {"input":
    bytes split as the layer's input, "whole": whole on each tp rank, "sharded": split over tp}
    (perfmodel.costs.mla.mla_fp8_saved_bytes), `fp8_mlp` {"input": as the layer's input, "rank":
    on one rank} (an MoE layer's, perfmodel.costs.moe.moe_fp8_saved_bytes); by default a
    standard attention's {"input": (s_8 - e) T h, "sharded": (s_8 - (1 - flash) e) T a d} and a
    dense MLP's {"input": (s_8 - e) T h, "rank": (s_8 - e) T f / tp}.
    Context parallelism: s is a cp rank's s / cp tokens of each sequence (Korthikanti's formulas
    with s / cp: every activation is the rank's tokens'; the flash kernel's log-sum-exp is per
    query). Other attentions and MLPs replace their terms: `attention` ({"sharded": bytes split
    over tp, "replicated": whole on each tp rank}) the Q, K, V and output-projection inputs
    (perfmodel.costs.mla), `mlp` the MLP's (2 + gated) e T f / tp with the bytes one rank keeps
    (perfmodel.costs.moe).
    """
    sequence_parallel, full, selective, flash, gated, op, dropout, attention_dropout = map(
        as_flag, (sequence_parallel, full, selective, flash, gated, op, dropout,
                  attention_dropout))
    T = b * s
    rep = 1 + sequence_parallel * (tp - 1)
    d = h / a if d is None else d
    replicated = (4 * e + 2 * dropout) * T * h
    sharded = e * T * (a * d + kv * d) + e * T * kv * d + e * T * a * d
    if attention is not None:
        sharded, replicated = attention["sharded"], replicated + attention["replicated"] * rep
    mlp_rank = (2 + gated) * e * T * f / tp if mlp is None else mlp
    quadratic = flash * 4 * a * b * s \
        + (1 - flash) * (e + attention_dropout * (e + 1)) * a * b * s**2
    fp8 = as_flag(fp8)
    if fp8 != 0:  # the FP8 copies of the GEMM inputs saved for the weight gradients
        if fp8_attention is None:  # QKV's input; the output projection's input
            fp8_attention = {"input": (fp8_saved - e) * T * h,
                             "sharded": (fp8_saved - (1 - flash) * e) * T * a * d}
        if fp8_mlp is None:  # MLP up's input, MLP down's
            fp8_mlp = {"input": (fp8_saved - e) * T * h, "rank": (fp8_saved - e) * T * f / tp}
        replicated += fp8 * (fp8_attention.get("input", 0) + rep * fp8_attention.get("whole", 0)
                             + fp8_mlp.get("input", 0))
        sharded += fp8 * fp8_attention.get("sharded", 0)
        mlp_rank += fp8 * fp8_mlp.get("rank", 0)
    everything = replicated / rep + (sharded + quadratic) / tp + mlp_rank
    attention_core_recomputed = replicated / rep + sharded / tp + mlp_rank
    layer_input = e * T * h / rep
    if per_op is None:
        per_op = layer_input + e * T * (a * d + kv * d + f) / tp + gated * e * T * h \
            + flash * (e * T * a * d + 4 * a * b * s) / tp + sequence_parallel * 2 * e * T * h / tp
    return times(full * full_inputs, layer_input) + times(selective, attention_core_recomputed) \
        + times(op, per_op) + times(1 - full - selective - op, everything)


def inflight_micro_batches(gpipe: Flag, interleaved: Flag, pp: sp.Expr, m: sp.Expr,
                           v: sp.Expr, *, zb: Flag = 0, zbv: Flag = 0,
                           rank: sp.Expr | int = 0,
                           chunks: tuple[sp.Expr, sp.Expr] | None = None) -> sp.Expr:
    """Micro-batches whose activations pipeline rank `rank` (0 the first stage) holds at its
    peak, in units of the rank's layers (its v chunks' together), with pp > 1 stages, m the
    micro-batches of one pipeline schedule (a step of F schedules, Plan.pipeline_micro_batches,
    drains each before the next fills: m / F of the step's; the step's where it runs one):

        GPipe               m: every forward runs before the first backward (Huang et al. 2019)
        1F1B                min(m, pp - r): rank r runs pp - r - 1 warm-up forwards and one
                            more before its first backward (Narayanan et al. SC21, Sec. 2.2)
        interleaved 1F1B    min(m, pp + (pp - 1 - 2 r) / v): 2 (pp - r - 1) + (v - 1) pp warm-up
                            chunk forwards and one more (Megatron-Core's schedules.py,
                            forward_backward_pipelining_with_interleaving); at r = 0 Korthikanti
                            et al.'s pp (1 + (pp - 1) / (pp v)) (2022, Sec. 4.2.3); in torch's
                            rounds of g (ScheduleInterleaved1F1B, m not a multiple of pp),
                            min(m, g + (2 pp - 1 - 2 r - g) / v)
        zero bubble (zb)    min(m, ((v - 1) g + pp) / v) on every rank: (v - 1) g + pp - r - 1
                            warm-up chunk forwards and one more, in rounds of g = m / max(1,
                            floor(m / pp)) micro-batches (torch's ScheduleInterleavedZeroBubble;
                            g = pp where pp divides m: pp), and r weight gradients pending, each
                            keeping its chunk's activations (stage_backward_input's
                            retain_graph: W frees them)
        V-shape zero bubble (min(m, 2 pp - r - 1) + min(m, r + 1)) / 2: forwards of its first
                            chunk and of its second before the first backward, half a stage
                            each (torch.distributed.pipelining.ScheduleZBVZeroBubble, which
                            drops the passes of micro-batches beyond m); with m >= 2 pp - 1, pp
                            on every rank (Qi et al. 2024, Sec. 6: each worker's peak is pp
                            micro-batches')

    The chunked schedules hold whole rounds of the rank's chunks and x = 2 pp - 1 - 2 r - g
    (interleaved) or pp - g (zb) chunk forwards more, or |x| fewer: 1/v of its layers each
    where its chunks are equal, else (chunks: the first and the last chunk's share of the rank's
    layers, a pipeline layout's) the first chunk's for each more and the last chunk's for each
    fewer.

    Activations count as freed at a micro-batch's backward (a zero-bubble schedule's weight
    gradient). With one stage there is no schedule: gradient accumulation holds one."""
    gpipe, interleaved, zb, zbv = map(as_flag, (gpipe, interleaved, zb, zbv))
    # numbers evaluated; a symbolic count left as it is (sympy's comparisons cost, elsewhere)
    now = all(sp.sympify(x).is_number for x in (pp, m, v, rank))

    def lo(a: sp.Expr, b: sp.Expr) -> sp.Expr:
        return sp.Min(a, b, evaluate=now)

    def hi(a: sp.Expr, b: sp.Expr) -> sp.Expr:
        return sp.Max(a, b, evaluate=now)
    one_f_one_b = lo(m, pp - rank)
    rounds = hi(1, applied(sp.floor, m / pp))

    def beyond(x: sp.Expr) -> sp.Expr:  # chunk forwards beyond whole rounds, in the rank's units
        if chunks is None:
            return x / v
        first, last = chunks
        return hi(0, x) * first + lo(0, x) * last
    group = m / rounds  # micro-batches a round: pp where pp divides m (torch's rounds else)
    # interleaved 1F1B: (v - 1) g + 2 (pp - r - 1) warm-up chunk forwards and one more
    # (Megatron-Core's with g = pp; torch's ScheduleInterleaved1F1B's g = m / rounds)
    chunked = lo(m, group + beyond(2 * pp - 1 - 2 * rank - group))
    # zero bubble: (v - 1) g + pp - r - 1 warm-up chunk forwards and one more, and r weight
    # gradients pending, whose input gradient (torch's stage_backward_input, retain_graph=True)
    # keeps the chunk's whole autograd graph, its saved activations, until W: rank 0's count on
    # every rank
    zero_bubble = lo(m, group + beyond(pp - group))
    v_shape = (lo(m, 2 * pp - rank - 1) + lo(m, rank + 1)) / 2
    return gpipe * m + zbv * v_shape + zb * zero_bubble \
        + (1 - gpipe - zbv - zb) * (interleaved * chunked + (1 - interleaved) * one_f_one_b)


def fsdp_padded(tensors: list[tuple[sp.Expr, sp.Expr]], dp: sp.Expr) -> sp.Expr:
    """Elements FSDP2 gathers for a unit: each tensor is split along its first dimension over the dp
    ranks, padded to a multiple of dp rows (torch.distributed.fsdp.fully_shard).

    tensors: (rows, elements per row) of each parameter as the rank holds it (after tensor
    parallelism)."""
    return sum((applied(sp.ceiling, rows / dp) * dp * cols for rows, cols in tensors),
               sp.Integer(0))


def layer_tensors(h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr | None, tp: sp.Expr, *,
                  gated: Flag, bias: Flag, qkv_bias: Flag, layernorm: Flag,
                  d: sp.Expr | None = None, sinks: Flag = 0) -> list[tuple[sp.Expr, sp.Expr]]:
    """(rows, columns) of one layer's parameters on a rank with Megatron 1D tensor parallelism:
    q, k, v and MLP-up (and gate) split by rows (column parallel), attention output and MLP-down
    split by columns (row parallel), their biases and the norms replicated. Sums to
    layer_params sharded / tp + replicated. f None: no MLP (an MoE layer's routed part apart)."""
    bias, qkv_bias, layernorm = map(as_flag, (bias, qkv_bias, layernorm))
    d = h / a if d is None else d
    out = [(a * d / tp, h), (kv * d / tp, h), (kv * d / tp, h),  # wq, wk, wv
           (qkv_bias * a * d / tp, 1), (qkv_bias * kv * d / tp, 1), (qkv_bias * kv * d / tp, 1),
           (h, a * d / tp), (bias * h, 1)]  # wo and its bias
    if f is not None:
        out += mlp_tensors(h, f, tp, gated=gated, bias=bias)
    out += norm_tensors(h, layernorm)
    if as_flag(sinks) != 0:  # attention sinks: a logit per head, split with the heads
        out.append((as_flag(sinks) * a / tp, 1))
    return out


def mlp_tensors(h: sp.Expr, width: sp.Expr, tp: sp.Expr, *, gated: Flag,
                bias: Flag) -> list[tuple[sp.Expr, sp.Expr]]:
    """(rows, columns) of a tensor-parallel MLP `width` wide on one rank: up (and gate) split by
    rows, down by columns, the up biases split, the down bias whole."""
    gated, bias = as_flag(gated), as_flag(bias)
    return [(width / tp, h), (gated * width / tp, h), (bias * width / tp, 1),
            (bias * gated * width / tp, 1), (h, width / tp), (bias * h, 1)]  # MLP down, bias


def norm_tensors(h: sp.Expr, layernorm: Flag) -> list[tuple[sp.Expr, sp.Expr]]:
    """A layer's two norms (weight, and bias for LayerNorm: each its own tensor, which FSDP2
    pads apart), whole on every rank."""
    return final_norm_tensors(h, layernorm) * 2


def final_norm_tensors(h: sp.Expr, layernorm: Flag,
                       held: Flag = 1) -> list[tuple[sp.Expr, sp.Expr]]:
    """One norm's weight and (LayerNorm) bias, each its own tensor (FSDP2 pads each to a
    multiple of dp rows: as one tensor of 2 h rows they were padded once, 1 element a rank short
    where dp does not divide h; a fuzz of --dry-run, 2026-12-07); `held`: 0 where the stage
    holds none."""
    held, layernorm = as_flag(held), as_flag(layernorm)
    return [(held * h, 1), (held * layernorm * h, 1)]


def root_tensors(h: sp.Expr, V: sp.Expr, s: sp.Expr, tp: sp.Expr, *, learned_positions: Flag,
                 layernorm: Flag, output: Flag,
                 final_norm: Flag = 1) -> list[tuple[sp.Expr, sp.Expr]]:
    """The parameters outside the layers: vocabulary-parallel embedding, learned positions, final
    norm (when `final_norm`: the stage holds it), and (when `output`) the output layer."""
    learned_positions, layernorm, output, final_norm = map(
        as_flag, (learned_positions, layernorm, output, final_norm))
    return [(V / tp, h), (learned_positions * s, h), *final_norm_tensors(h, layernorm, final_norm),
            (output * V / tp, h)]
