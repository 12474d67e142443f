"""Memory per GPU: parameters, model states (weights, gradients, optimizer), activations.

Sources: Narayanan et al. SC21 (Eq. 2, parameter count); Rajbhandari et al. 2020 ("ZeRO", Sec. 3:
2 + 2 + K bytes per parameter with K = 12 for mixed-precision Adam); Korthikanti et al. 2022
("Reducing Activation Recomputation", Table 2 and Sec. 4.3) for activations.
"""

from __future__ import annotations

import sympy as sp


def layer_params(h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr, *, gated: bool, bias: bool,
                 qkv_bias: bool, layernorm: bool) -> dict[str, sp.Expr]:
    """Parameters of one layer, split into those tensor parallelism shards and those it replicates.

    GPT (kv = a, f = 4h, biases, LayerNorm): 12 h^2 + 13 h  (Narayanan et al. 2021, Eq. 2).
    """
    d = h / a
    qkv_out = h + 2 * kv * d
    up = (2 if gated else 1) * f
    sharded = qkv_out * h + h * h + up * h + f * h
    if qkv_bias:
        sharded += qkv_out
    if bias:
        sharded += up
    replicated = 2 * (2 * h if layernorm else h)
    if bias:
        replicated += 2 * h  # row-parallel output biases (attention output, MLP down)
    return {"sharded": sharded, "replicated": replicated}


def embedding_params(h: sp.Expr, V: sp.Expr, s: sp.Expr, *, learned_positions: bool) -> dict[str, sp.Expr]:
    """Word embedding (vocabulary split over tp) and learned positions (replicated)."""
    return {"sharded": V * h, "replicated": s * h if learned_positions else sp.Integer(0)}


def model_state_bytes_per_param(precision: str) -> dict[str, int]:
    """Bytes per parameter of weights, gradients and Adam states, as Megatron-LM keeps them.

    bf16: 2 (weights) + 4 (fp32 main gradients: Megatron-LM accumulates and reduces gradients in fp32
    with --bf16) + 12 (fp32 master weights, momentum, variance) = 18.
    fp16: 2 + 2 + 12 = 16 (ZeRO, Rajbhandari et al. 2020, Sec. 3.1). fp32/tf32: 4 + 4 + 8 = 16.
    """
    if precision == "bf16":
        return {"weights": 2, "gradients": 4, "optimizer_states": 12}
    if precision == "fp16":
        return {"weights": 2, "gradients": 2, "optimizer_states": 12}
    return {"weights": 4, "gradients": 4, "optimizer_states": 8}


def optimizer_step_bytes_per_param(precision: str) -> int:
    """Bytes the optimizer step reads and writes per local parameter (memory-bound kernels).

    Adam: read master weights, gradient, momentum, variance (4 x 4), write weights, momentum,
    variance (3 x 4) = 28; gradient-norm clipping reads the gradients (4); zeroing the gradient
    buffer writes them (4 or 2). Mixed precision also copies master weights to the 16-bit weights
    (read 4, write 2); fp16 first copies 16-bit gradients to fp32 (read 2, write 4) and unscales them
    with an inf/nan check (read 4, write 4), as Megatron-LM's Float16OptimizerWithFloat16Params does.
    bf16: 28 + 4 + 4 + 6 = 42; fp16: 28 + 4 + 2 + 6 + 6 + 8 = 54; fp32: 28 + 4 + 4 = 36.
    """
    return {"bf16": 42, "fp16": 54}.get(precision, 36)


def zero_divisors(zero: int, dp: sp.Expr) -> dict[str, sp.Expr]:
    """ZeRO stage 1 shards optimizer states over dp, stage 2 also gradients, stage 3 also weights."""
    one = sp.Integer(1)
    return {
        "weights": dp if zero >= 3 else one,
        "gradients": dp if zero >= 2 else one,
        "optimizer_states": dp if zero >= 1 else one,
    }


def layer_activation_bytes(b: sp.Expr, s: sp.Expr, h: sp.Expr, a: sp.Expr, kv: sp.Expr,
                           f: sp.Expr, tp: sp.Expr, e: sp.Expr, *, sequence_parallel: bool,
                           recompute: str, flash: bool, gated: bool) -> sp.Expr:
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
    across tp unless sequence parallel); Q, K e T (h + kv d), V e T kv d, output-projection input
    e T h, activation input e T f (2x for SwiGLU), MLP-down input e T f (sharded); softmax output,
    dropout mask and dropout output (2e + 1) a b s^2 (sharded; dropped by selective recompute; with
    flash attention replaced by the fp32 log-sum-exp, 4 a b s).
    """
    T = b * s
    rep = tp if sequence_parallel else sp.Integer(1)
    if recompute == "full":
        return e * T * h / rep
    d = h / a
    replicated = (4 * e + 2) * T * h
    sharded = e * T * (h + kv * d) + e * T * kv * d + e * T * h + (3 if gated else 2) * e * T * f
    if flash:
        quadratic = 4 * a * b * s
    elif recompute == "selective":
        quadratic = sp.Integer(0)
    else:
        quadratic = (2 * e + 1) * a * b * s**2
    return replicated / rep + (sharded + quadratic) / tp


def inflight_micro_batches(schedule: str, pp: sp.Expr, m: sp.Expr, v: sp.Expr) -> sp.Expr:
    """Micro-batches whose activations the first stage holds at its peak, in units of the stage's layers.

    GPipe: all m. 1F1B: min(pp, m). Interleaved 1F1B: pp (1 + (pp - 1)/(pp v)) (Korthikanti et al.
    2022, Sec. 4.2.3), also capped by m.
    """
    if schedule == "gpipe":
        return m
    if schedule == "interleaved":
        return sp.Min(m, pp * (1 + (pp - 1) / (pp * v)))
    return sp.Min(pp, m)
