"""Bytes per parameter by training precision (plain numbers: no sympy, cheap to import)."""

from __future__ import annotations

# The dtypes of the main gradients and of the optimizer states that mixed precision can keep
STATE_DTYPES = ("fp32", "bf16")
_BYTES = {"fp32": 4, "bf16": 2}
# How bf16 mixed precision keeps the master weights beside the bf16 ones (Plan.master_weights):
# fp32, a copy; remainders, the 16 low bits of each fp32 master that the bf16 weight lacks
# (Megatron-Core's precision-aware optimizer with store_param_remainders, its default: Transformer
# Engine's FusedAdam keeps them as int16 and rebuilds the fp32 value from the pair); none, the
# bf16 weights updated in place (Apex DistributedFusedAdam with bf16 states, NeMo)
MASTER_WEIGHTS = ("fp32", "remainders", "none")
MASTER_BYTES = 4  # an fp32 master copy of a 16-bit parameter
_MASTER_BYTES = {"fp32": MASTER_BYTES, "remainders": 2, "none": 0}


def default_master(optimizer_dtype: str | None) -> str:
    """The master weights of a plan that names none: an fp32 optimizer keeps an fp32 copy, one
    with bf16 states none (the bf16 weights updated in place, as NeMo's Apex optimizer does)."""
    return "fp32" if (optimizer_dtype or "fp32") == "fp32" else "none"


def megatron_master_weights(store_param_remainders: bool, fp8_recipe: str | None,
                            fp8_params: bool) -> str:
    """The master weights of Megatron-Core's precision-aware optimizer (--use-precision-aware-
    optimizer, fp32 main params): Transformer Engine's FusedAdam holds them, as their remainders
    with store_param_remainders, where OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_
    ds_fp8 holds, that is bf16 training or FP8 with delayed scaling (megatron/core/optimizer/
    optimizer_config.py __post_init__); under another FP8 recipe the distributed optimizer keeps
    its own fp32 shards and FusedAdam only the moments' dtype. Beside FP8 weights they are
    counted whole: the remainders complete bf16 weights."""
    delayed_or_bf16 = fp8_recipe in (None, "delayed")
    return "remainders" if store_param_remainders and delayed_or_bf16 and not fp8_params \
        else "fp32"


def model_state_bytes_per_param(precision: str, grad_dtype: str | None = None,
                                optimizer_dtype: str | None = None,
                                master_weights: str | None = None) -> dict[str, int]:
    """Bytes per parameter of weights, gradients and optimizer states, as Megatron-LM keeps them
    (docs/user-guide/features/dist_optimizer.md, bytes per parameter, d data-parallel ranks:
    bf16 parameters and fp32 gradients 18, distributed 6 + 12/d; fp16 20, 4 + 16/d; fp32 16,
    8 + 8/d; the distributed optimizer shards the optimizer states, here "optimizer_states").

    bf16: 2 (weights) + 4 (fp32 main gradients: --accumulate-allreduce-grads-in-fp32, Megatron's
    default with --bf16) + 12 (fp32 master weights, momentum, variance) = 18.
      grad_dtype "bf16": main gradients kept and reduced in bf16 (NeMo 2's performance recipes:
      grad_reduce_in_fp32 False; Apex DistributedFusedAdam grad_sync_dtype bf16;
      Megatron-Core's precision-aware optimizer with --main-grads-dtype bf16): 2.
      optimizer_dtype "bf16": momentum and variance in bf16 (2 + 2).
      master_weights (MASTER_WEIGHTS; default_master: fp32 with fp32 states, none with bf16
      ones): an fp32 copy 4, its remainders 2 (Megatron-Core's --use-precision-aware-optimizer:
      OptimizerConfig.store_param_remainders, on by default, "store the 16-bit FP32 parameter
      remainders ... excluding the 16 bits shared with the BF16 parameters"), none 0.
      So NeMo's Apex optimizer with bf16 states 4; Megatron's precision-aware optimizer 10, and
      6 with bf16 moments (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16).
    fp16: 2 + 2 + 16 (fp32 master weights, momentum, variance and an fp32 copy of the gradients
    for the step) = 20. fp32/tf32: 4 + 4 + 8 = 16.
    Not modelled: Apex's separate gradient shard (grad_sync_dtype / d).
    """
    if precision != "bf16" and (grad_dtype or optimizer_dtype or master_weights):
        raise ValueError(f"grad_dtype, optimizer_dtype and master_weights apply to bf16 mixed "
                         f"precision, not {precision}")
    if precision == "bf16":
        grads = _BYTES[grad_dtype or "fp32"]
        master = _MASTER_BYTES[master_weights or default_master(optimizer_dtype)]
        states = master + 2 * _BYTES[optimizer_dtype or "fp32"]
        return {"weights": 2, "gradients": grads, "optimizer_states": states}
    if precision == "fp16":
        return {"weights": 2, "gradients": 2, "optimizer_states": 16}
    return {"weights": 4, "gradients": 4, "optimizer_states": 8}


def sharded_state_bytes_per_param(precision: str, grad_dtype: str | None = None,
                                  optimizer_dtype: str | None = None,
                                  master_weights: str | None = None) -> dict[str, int]:
    """Bytes per parameter under ZeRO 3 (FSDP), where the parameter itself is the shard: FSDP2
    with a mixed-precision policy keeps the fp32 master as the sharded parameter and gathers it
    cast to 16 bits (torch.distributed.fsdp MixedPrecisionPolicy param_dtype; torchtitan
    creates the model in fp32), so no 16-bit copy of the shard is kept: weights 4 (the fp32
    shard), optimizer states the rest (momentum and variance: 8), gradients as the plan keeps
    them (fp32: FSDP2's reduce_dtype, the shard's dtype). bf16: 4 + 4 + 8 = 16, against the 18
    of Megatron's (bf16 weights beside an fp32 master); DeepSpeed's ZeRO 3 keeps 16 as well
    (2 + 2 + 12, Rajbhandari et al. 2020, Sec. 3). Without an fp32 master (fp32 training, bf16
    states updating the bf16 parameter, or the master's remainders beside it) as
    model_state_bytes_per_param.
    """
    state = model_state_bytes_per_param(precision, grad_dtype, optimizer_dtype, master_weights)
    master = master_weights or default_master(optimizer_dtype)
    if precision == "fp16" or (precision == "bf16" and master == "fp32"):
        return dict(state, weights=MASTER_BYTES,
                    optimizer_states=state["optimizer_states"] - MASTER_BYTES)
    return state


# How the AdamW step runs (perfmodel.strategy.OptimizerKernels' values, and a hardware spec's
# optimizer_kernels: the kernels its optimizer efficiency was measured on)
OPTIMIZER_KERNELS = ("fused", "foreach")
# torch's foreach AdamW (torch/optim/adam.py, _multi_tensor_adam, torch 2.13, not capturable, no
# amsgrad) passes over the stepped weights w, gradients g and states o (momentum m, variance v, and
# a temporary t of their dtype) once per operation: mul_(w) 2w, lerp_(m, g) 2o + g, mul_(v) 2o,
# addcmul_(v, g, g) 2o + g, t = sqrt(v) 2o, div_(t) 2o, add_(t) 2o, addcdiv_(w, m, t) 2w + 2o:
# 4w + 2g + 14o, against the fused kernel's 2w + g + 4o (read w, g, m, v; write w, m, v).
FOREACH_EXTRA = (2, 1, 10)  # the foreach passes beyond the fused kernel's, per byte of w, g, o


def optimizer_step_bytes_per_param(precision: str, grad_dtype: str | None = None,
                                   optimizer_dtype: str | None = None,
                                   master_weights: str | None = None,
                                   kernels: str = "fused") -> int:
    """Bytes the optimizer step reads and writes per local parameter (memory-bound kernels).

    Adam: read master weights, gradient, momentum, variance (4 x 4), write weights, momentum,
    variance (3 x 4) = 28; gradient-norm clipping reads the gradients (4); zeroing the gradient
    buffer writes them (4 or 2). Mixed precision also copies master weights to the 16-bit weights
    (read 4, write 2); fp16 first copies 16-bit gradients to fp32 (read 2, write 4) and unscales
    them with an inf/nan check (read 4, write 4), as Megatron-LM's
    Float16OptimizerWithFloat16Params does.
    bf16: 28 + 4 + 4 + 6 = 42; fp16: 28 + 4 + 2 + 6 + 6 + 8 = 54; fp32: 28 + 4 + 4 = 36.
    bf16 with other state dtypes, likewise: gradients g and states o bytes, master m (0 or 4):
    read m or 2, g, 2 o; write m or 2, 2 o; clip g; zero g; copy (m + 2 if m). The master's
    remainders: FusedAdam reads and writes the bf16 weight and its remainder (2 + 2 each way)
    and needs no copy.
    kernels (perfmodel.strategy.OptimizerKernels): fused, the Adam step one kernel as counted
    above; foreach, torch's multi-tensor passes, 2 w + g + 10 o more (FOREACH_EXTRA, w the
    stepped weights' bytes): bf16 94, fp16 106, fp32 88.
    """
    if precision == "bf16" and (grad_dtype or optimizer_dtype or master_weights):
        g = _BYTES[grad_dtype or "fp32"]
        o = _BYTES[optimizer_dtype or "fp32"]
        master = master_weights or default_master(optimizer_dtype)
        copied = master == "fp32"  # the fp32 master, copied into the bf16 weights after
        weights = MASTER_BYTES if copied else 2 + _MASTER_BYTES[master]  # read, then written
        fused = 2 * weights + 3 * g + 4 * o + (MASTER_BYTES + 2 if copied else 0)
    else:
        # the stepped weights, the gradients and the states are fp32 in each (fp16's gradients
        # copied to fp32 first)
        weights = g = o = 4
        fused = {"bf16": 42, "fp16": 54}.get(precision, 36)
    if kernels == "foreach":
        return fused + sum(n * b for n, b in zip(FOREACH_EXTRA, (weights, g, o), strict=True))
    return fused
