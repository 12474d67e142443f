"""Multi-head latent attention (DeepSeek-V2, Sec. 2.1; DeepSeek-V3, Sec. 2.1): its projections,
parameters and the activations it keeps, on one rank.

Queries are compressed to r_q (when q_lora_rank is given) and expanded per head; keys and values
are compressed together to r_kv, beside one rotary key of d_rope shared by the heads:
    q      = W_uq (norm(W_dq x))            h -> r_q -> a (d_nope + d_rope)   (or h -> a d_qk)
    kv     = W_ukv (norm(c_kv)), c_kv = W_dkv x   h -> r_kv + d_rope, r_kv -> a (d_nope + d_v)
    output = W_o (attention)                a d_v -> h
The attention core then has a heads of d_qk = d_nope + d_rope (scores) and d_v (context). In
training the key/value cache plays no part: the latents are expanded for every token. Megatron-Core
(MLASelfAttention) and the DeepSeek reference code build it so.

Tensor parallelism (Megatron-Core's MLASelfAttention): the down projections and the latents' norms
are whole on every tp rank ("duplicated"), the up projections column-parallel and the output
row-parallel, split by heads. With sequence parallelism the down projections run on the rank's
s / tp tokens and the latents (q: r_q, kv: r_kv, the rotary key: d_rope) are all-gathered over tp
before the up projections, their gradients reduce-scattered back; without it every rank computes
the down projections over all tokens and the latents' gradients are all-reduced (the up
projections' input gradients). The output is reduced as any attention's.
"""

from __future__ import annotations

import sympy as sp

from perfmodel.costs.compute import Flag, Gemm, as_flag


def mla_gemms(T: sp.Expr, h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr, d_nope: sp.Expr,
              d_rope: sp.Expr, d_v: sp.Expr, tp: sp.Expr, *, q_lora: bool,
              T_down: sp.Expr | None = None) -> list[Gemm]:
    """The projections' forward GEMMs over T tokens; the up projections and the output split
    by heads over tp, the down projections whole, over T_down tokens (the rank's s / tp of them
    with sequence parallelism; default T)."""
    d_qk = d_nope + d_rope
    T_down = T if T_down is None else T_down
    q = [Gemm("q_down", T_down, r_q, h), Gemm("q_up", T, a * d_qk / tp, r_q)] if q_lora \
        else [Gemm("q", T, a * d_qk / tp, h)]
    return [*q, Gemm("kv_down", T_down, r_kv + d_rope, h),
            Gemm("kv_up", T, a * (d_nope + d_v) / tp, r_kv),
            Gemm("attention_output", T, h, a * d_v / tp)]


def mla_params(h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr, d_nope: sp.Expr,
               d_rope: sp.Expr, d_v: sp.Expr, *, q_lora: bool, bias: Flag) -> dict[str, sp.Expr]:
    """One layer's attention, split as the step model splits a layer (perfmodel.costs.memory.
    layer_params): "sharded" over tp (the up projections and the output, by heads) and
    "replicated" (the down projections, the latents' RMSNorms, the output bias):
        q  = h r_q + r_q + r_q a d_qk    (or h a d_qk)
        kv = h (r_kv + d_rope) + r_kv + r_kv a (d_nope + d_v)
        o  = a d_v h + bias h                         (perfmodel.params.attention_parameters)"""
    d_qk = d_nope + d_rope
    sharded = (r_q if q_lora else h) * a * d_qk + r_kv * a * (d_nope + d_v) + a * d_v * h
    replicated = (h * r_q + r_q if q_lora else 0) + h * (r_kv + d_rope) + r_kv \
        + as_flag(bias) * h
    return {"sharded": sharded, "replicated": replicated}


def mla_tensors(h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr, d_nope: sp.Expr,
                d_rope: sp.Expr, d_v: sp.Expr, tp: sp.Expr, *, q_lora: bool,
                bias: Flag) -> list[tuple[sp.Expr, sp.Expr]]:
    """(rows, columns) of one layer's MLA parameters on a rank with tp tensor ranks (for FSDP's
    padding, perfmodel.costs.memory.fsdp_padded): the down projections and the latents' norms
    whole, the up projections split by rows (heads), the output by columns; sums to mla_params'
    sharded / tp + replicated."""
    d_qk = d_nope + d_rope
    if q_lora:
        query = [(r_q, h), (r_q, 1), (a * d_qk / tp, r_q)]  # down, its norm, up
    else:
        query = [(a * d_qk / tp, h)]
    return query + [(r_kv + d_rope, h), (r_kv, 1), (a * (d_nope + d_v) / tp, r_kv),
                    (h, a * d_v / tp), (as_flag(bias) * h, 1)]


def latent_widths(r_q: sp.Expr, r_kv: sp.Expr, d_rope: sp.Expr, h: sp.Expr, *,
                  q_lora: bool) -> list[sp.Expr]:
    """The widths of what crosses the tp ranks between the down and the up projections: the
    query latent (r_q; the hidden state itself, h, when the queries are not compressed), the
    key/value latent (r_kv) and the shared rotary key (d_rope)."""
    return [r_q if q_lora else h, r_kv, d_rope]


def mla_activation_bytes(T: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr, d_nope: sp.Expr,
                         d_rope: sp.Expr, d_v: sp.Expr, e: sp.Expr, *,
                         q_lora: bool) -> dict[str, sp.Expr]:
    """Bytes the attention keeps for the backward per micro-batch on one rank, beyond the
    layer's input and norms (counted with the layer), as Korthikanti et al. 2022 (Sec. 4.1)
    count a standard attention's:
        "sharded" (split by heads over tp): Q and K e T a d_qk each, V and the output
                  projection's input e T a d_v each;
        "replicated": the latents the up projections read, e T (r_q + r_kv), and their norms'
                  inputs, e T (r_q + r_kv + d_rope) (the compressed key/value with its rotary
                  key)."""
    d_qk = d_nope + d_rope
    latents = (r_q if q_lora else 0) + r_kv
    return {"sharded": 2 * e * T * a * d_qk + 2 * e * T * a * d_v,
            "replicated": e * T * latents + e * T * (latents + d_rope)}


def mla_linear_weights(h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr, d_nope: sp.Expr,
                       d_rope: sp.Expr, d_v: sp.Expr, *, q_lora: bool) -> dict[str, sp.Expr]:
    """The weight matrices of the projections, without norms or biases: what an fp8 plan casts
    to FP8 (each projection is a Transformer Engine linear in Megatron-Core's MLASelfAttention:
    linear_q_down_proj and linear_kv_down_proj TELinear "duplicated", linear_q_up_proj (or
    linear_q_proj), linear_kv_up_proj column-parallel, linear_proj row-parallel):
        "sharded" over tp:  (r_q or h) a d_qk + r_kv a (d_nope + d_v) + a d_v h
        "replicated":       h r_q (with q_lora) + h (r_kv + d_rope)"""
    d_qk = d_nope + d_rope
    sharded = (r_q if q_lora else h) * a * d_qk + r_kv * a * (d_nope + d_v) + a * d_v * h
    replicated = (h * r_q if q_lora else 0) + h * (r_kv + d_rope)
    return {"sharded": sharded, "replicated": replicated}


def mla_fp8_cast_elements(T: sp.Expr, h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr,
                          d_nope: sp.Expr, d_rope: sp.Expr, d_v: sp.Expr, tp: sp.Expr,
                          ranks: sp.Expr, *, q_lora: bool) -> tuple[sp.Expr, sp.Expr]:
    """Elements one rank casts to FP8 in the attention of one layer, forward and backward, per
    micro-batch (perfmodel.costs.compute.fp8_cast_elements' counting: each FP8 GEMM's input in
    the forward, its grad output in the backward):

        forward  = 2 T h / r + T (r_q + r_kv) / r + T a d_v / tp
                   (the layer's normed input, once for each down projection (or the query
                   projection without q_lora: cast on the shard, then gathered); the latents
                   the up projections read, cast on the shard before the sequence-parallel
                   all-gather (r_q only with q_lora); the output projection's input)
        backward = T h / r + T a (d_qk + d_nope + d_v) / tp + T (r_q + r_kv + d_rope) / r
                   (the grad outputs of the output projection, of the up projections (the
                   query projection's a d_qk) and of the down projections, on the rank's
                   tokens)

    r: the ranks an activation is split over (tp with sequence parallelism, else 1)."""
    d_qk = d_nope + d_rope
    q_latent = r_q if q_lora else 0
    forward = 2 * T * h / ranks + T * (q_latent + r_kv) / ranks + T * a * d_v / tp
    backward = T * h / ranks + T * a * (d_qk + d_nope + d_v) / tp \
        + T * (q_latent + r_kv + d_rope) / ranks
    return forward, backward


def mla_fp8_saved_bytes(T: sp.Expr, h: sp.Expr, a: sp.Expr, r_q: sp.Expr, r_kv: sp.Expr,
                        d_v: sp.Expr, e: sp.Expr, saved: sp.Expr, flash: sp.Expr, *,
                        q_lora: bool) -> dict[str, sp.Expr]:
    """What an fp8 plan's attention keeps beyond a bf16 plan's, per micro-batch on one rank
    (perfmodel.costs.memory.layer_activation_bytes' fp8_attention; Transformer Engine saves an
    FP8 GEMM's input for its weight gradient as its columnwise FP8 copy, `saved` bytes per
    element):
        "input" (split as the layer's input):  (2 saved - e) T h: the normed input, kept once
                 in bf16 for both down projections, becomes one FP8 copy for each;
        "whole" (as mla_activation_bytes' "replicated"): (saved - e) T (r_q + r_kv), the
                 latents the up projections read (r_q with q_lora);
        "sharded" over tp: (saved - (1 - flash) e) T a d_v, the output projection's input (a
                 flash kernel keeps its bf16 output for its own backward)."""
    q_latent = r_q if q_lora else 0
    return {"input": (2 * saved - e) * T * h, "whole": (saved - e) * T * (q_latent + r_kv),
            "sharded": (saved - (1 - flash) * e) * T * a * d_v}
