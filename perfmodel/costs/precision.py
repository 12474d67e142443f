"""Bytes per parameter by training precision (plain numbers: no sympy, cheap to import)."""

from __future__ import annotations


def model_state_bytes_per_param(precision: str) -> dict[str, int]:
    """Bytes per parameter of weights, gradients and Adam states, as Megatron-LM keeps them.

    bf16: 2 (weights) + 4 (fp32 main gradients: Megatron-LM accumulates and reduces gradients in
    fp32 with --bf16) + 12 (fp32 master weights, momentum, variance) = 18.
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
    (read 4, write 2); fp16 first copies 16-bit gradients to fp32 (read 2, write 4) and unscales
    them with an inf/nan check (read 4, write 4), as Megatron-LM's
    Float16OptimizerWithFloat16Params does.
    bf16: 28 + 4 + 4 + 6 = 42; fp16: 28 + 4 + 2 + 6 + 6 + 8 = 54; fp32: 28 + 4 + 4 = 36.
    """
    return {"bf16": 42, "fp16": 54}.get(precision, 36)
