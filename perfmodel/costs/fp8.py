"""FP8 training as Transformer Engine (TE) runs it: which GEMMs run in FP8, what the casts move,
what memory the FP8 copies and the scaling state take. Plain numbers: no sympy.

What runs in FP8: the linear layers' GEMMs (QKV, attention output, MLP up (and gate), down), in
the forward (input x weight) and in both backward GEMMs (grad output x weight, input x grad
output), at the GPU's FP8 peak and FP8 GEMM efficiency (HardwareSpec.gemm("fp8")). What stays
bf16: the attention core (TE's fp8_dot_product_attention is off by default), softmax, norms,
activations, the embedding and the output layer (Megatron-LM's output layer is a bf16
ColumnParallelLinear outside TE's autocast; Plan.fp8_output_layer puts it in FP8). The weights,
gradients and optimizer states are bf16 mixed precision's (perfmodel.costs.precision).

Each FP8 operand has two usages: rowwise (the forward GEMM) and columnwise (the backward GEMMs)
[TE-perf]. On Hopper (and, as TE's ROCm port keeps the same path, on AMD CDNA) a columnwise FP8
operand is a physical transpose: a second 1-byte copy; on Blackwell one per-tensor FP8 copy
serves both usages (HardwareSpec.fp8_transpose). MXFP8 scales blocks of 32 values along the
row or the column, so its two usages are two copies, each with one E8M0 byte per 32 values
[TE-mxfp8].

A cast ("quantize") reads the bf16 tensor and writes its FP8 copies; delayed scaling takes the
scale from the amax history of earlier steps (one read), current scaling first reduces the
tensor's amax (a second read) [TE-delayed, TE-current]. Each GEMM input activation is cast per
micro-batch in the forward, each grad output in the backward, each weight once per step: TE
caches the FP8 weight (both usages) from the first micro-batch for the others [TE-linear]. With the
weights held in FP8 (fp8_params: TE's fp8_model_init, Megatron-LM --fp8-param-gather, NeMo
fp8_params) the optimizer writes them from its fp32 master weights, no bf16 copy is kept, the
distributed optimizer all-gathers them in FP8, and a step only transposes them (Hopper) [TE-perf:
"model weights are stored directly in low precision, and master weights in optimizer are in
FP32"].

Sources:
  [TE-delayed]  TE docs, features/low_precision_training/fp8_delayed_scaling: "FP8 Current
                Scaling requires two tensor reads per quantization: one to compute amax, one to
                cast. FP8 Delayed Scaling eliminates the first read"; DelayedScaling's
                amax_history_len default 1024 (TE Common API).
  [TE-current]  TE docs, fp8_current_scaling: one FP32 scale per tensor, from the tensor.
  [TE-mxfp8]    TE docs, mxfp8: one E8M0 (1-byte) scale per 32 consecutive values, Blackwell
                (SM 10.0+).
  [TE-perf]     TE docs, performance_considerations: rowwise and columnwise usages; "Hopper:
                cannot efficiently access elements in columnwise fashion, so columnwise tensors
                need to be physically transposed"; "Blackwell: supports columnwise access
                natively, so no transpose is needed"; activations saved for backward in FP8.
  [MB-mxfp8]    Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge 0465189,
                src/megatron/bridge/training/mixed_precision.py): bf16_with_mxfp8_mixed sets
                fp8_param_gather with reuse_grad_buf_for_mxfp8_param_ag, which MXFP8 weights
                require: Megatron-Core all-gathers the bf16 weights into the gradient buffer,
                casts them to the model's MXFP8 weights and zeroes the buffer for the gradients
                (megatron/core/distributed/param_and_grad_buffer.py); no bf16 weight buffer is
                kept.
  [TE-sp]       Transformer Engine (NVIDIA/TransformerEngine d0067d0),
                transformer_engine/pytorch/module/layernorm_linear.py: with sequence
                parallelism the input quantizer is set rowwise-only where
                supports_only_rowwise_all_gather() (Float8Quantizer and
                Float8CurrentScalingQuantizer: true; MXFP8: false), and the backward calls
                ln_out_total.update_usage(columnwise_usage=True) on the gathered input and
                grad_output.update_usage(columnwise_usage=True) on the gathered grad output
                (linear.py likewise); TE 1.x's LayerNormLinear ran tex.fp8_transpose on the
                gathered input for the weight gradient.
  [TE-linear]   TE developer docs, the te.Linear walkthrough: the weight quantized on the first
                micro-batch and cached; the input quantized locally and its rowwise copy
                all-gathered in FP8 with sequence parallelism; the columnwise input saved for the
                weight gradient, "one byte per element (FP8 columnwise) instead of two (BF16)".
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_BYTES = 1  # an E4M3 / E5M2 element
MXFP8_BLOCK = 32  # values per E8M0 scale [TE-mxfp8]
E8M0_BYTES = 1
FP32_BYTES = 4
# DelayedScaling(amax_history_len=1024) [TE-delayed]; NeMo's fp8_amax_history_len 1024
DELAYED_AMAX_HISTORY = 1024
# the tensors of one GEMM with scaling state in TE's per-tensor recipes: forward input, weight
# and output, backward grad output and grad input (TE 1.x FP8FwdTensors GEMM1_INPUT, _WEIGHT,
# _OUTPUT and FP8BwdTensors GRAD_OUTPUT1, GRAD_INPUT1)
SCALED_TENSORS_PER_GEMM = 5
RECIPES = ("delayed", "current", "mxfp8")


@dataclass(frozen=True, kw_only=True)
class Fp8Bytes:
    """Bytes per element of one recipe on one GPU (what perfmodel.encode gives the symbols).

    operand:    an FP8 GEMM operand as the GEMM reads it: 1, MXFP8 1 + 1/32
    quantize:   a cast: reads e bytes (current scaling: 2 e, the amax pass first), writes its
                rowwise and columnwise copies
    weight_copy: the FP8 weight copies kept for the step, per parameter
    saved:      a GEMM input saved for the weight gradient: its columnwise copy (per-tensor on
                Blackwell: the one copy)
    scaling_state: per GEMM, the scaling state of its tensors (delayed: amax history, scale and
                inverse scale of each; current: amax, scale, inverse scale; MXFP8: none apart
                from the block scales, which are in the copies)
    weight_cast: per parameter and step, making the weights' FP8 copies: a cast (quantize), or
                with FP8 weights (fp8_params: the optimizer writes them) the columnwise copy
                from the rowwise one, a transpose (read 1, write 1) where it is a separate copy
                (Hopper), nothing where one copy serves both (Blackwell); MXFP8 weights a cast
                all the same, of the bf16 weights the distributed optimizer gathered
    gathered_transpose: per element of an activation (or grad output) that sequence
                parallelism all-gathers in FP8, the columnwise copy made from the gathered
                rowwise one: per-tensor recipes gather the rowwise copy only, so the rank casts
                its shard without a columnwise copy and, in the backward, transposes the whole
                gathered tensor for the weight gradient (read 1, write 1: 2 where the columnwise
                usage is a separate copy, Hopper) [TE-sp]; 0 where one copy serves both
                (per-tensor on Blackwell) or where the shard's columnwise copy is cast and
                gathered with it (MXFP8). The shard's cast then writes gathered_transpose / 2
                bytes an element fewer (no columnwise copy) than `quantize` counts.
    gather:     per FP8 weight, what the distributed optimizer all-gathers with FP8 weights
                (fp8_params): the FP8 copy, 1 (per-tensor recipes: Megatron-LM
                --fp8-param-gather, "perform the param all-gather in fp8"); MXFP8 the bf16
                weights (source_bytes), gathered into the gradient buffer and cast there
                [MB-mxfp8]
    """

    operand: float
    quantize: float
    weight_copy: float
    saved: float
    scaling_state: float
    weight_cast: float
    gather: float
    gathered_transpose: float


def usage_bytes(recipe: str, transpose: bool) -> tuple[float, float]:
    """(rowwise, columnwise) bytes per element of an FP8 tensor's copies [TE-perf, TE-mxfp8]:
    per-tensor scaling (1, 1) where the columnwise usage is a transpose (Hopper), (1, 0) where
    one copy serves both (Blackwell); MXFP8 (1 + 1/32, 1 + 1/32), each with its block scales."""
    if recipe not in RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(RECIPES)}, got '{recipe}'")
    if recipe == "mxfp8":
        copy = FP8_BYTES + E8M0_BYTES / MXFP8_BLOCK
        return copy, copy
    return float(FP8_BYTES), float(FP8_BYTES if transpose else 0)


def quantize_bytes(recipe: str, transpose: bool, source_bytes: float) -> float:
    """Bytes one cast moves per element [TE-delayed, TE-current]:

        q = r e + rowwise + columnwise,   r = 2 for current scaling (amax pass, then cast), else 1

    e: bytes of the source element (2 for bf16). Hopper, delayed: 2 + 1 + 1 = 4; current: 6;
    Blackwell per-tensor, delayed: 3; MXFP8: 2 + 2 x 33/32 = 4.0625."""
    rowwise, columnwise = usage_bytes(recipe, transpose)
    reads = 2 if recipe == "current" else 1
    return reads * source_bytes + rowwise + columnwise


def scaling_state_bytes(recipe: str) -> float:
    """Scaling state of one FP8 GEMM [B]: delayed, 5 tensors x (1024-entry fp32 amax history +
    fp32 scale + fp32 inverse scale) = 20,520; current, 5 x (amax, scale, inverse scale) = 60;
    MXFP8 0 (its E8M0 scales are counted with the copies)."""
    if recipe == "delayed":
        return SCALED_TENSORS_PER_GEMM * FP32_BYTES * (DELAYED_AMAX_HISTORY + 2)
    if recipe == "current":
        return SCALED_TENSORS_PER_GEMM * FP32_BYTES * 3
    return 0.0


def fp8_bytes(recipe: str, transpose: bool, source_bytes: float,
              fp8_params: bool = False) -> Fp8Bytes:
    """The bytes per element of one recipe on one GPU (see Fp8Bytes); fp8_params: the weights
    are held in FP8 (MXFP8: as Megatron-Bridge's bf16_with_mxfp8_mixed holds them,
    [MB-mxfp8])."""
    rowwise, columnwise = usage_bytes(recipe, transpose)
    quantize = quantize_bytes(recipe, transpose, source_bytes)
    mx = recipe == "mxfp8"
    weight_cast = (rowwise + columnwise if columnwise else 0.0) if fp8_params and not mx \
        else quantize
    return Fp8Bytes(operand=rowwise, quantize=quantize, weight_copy=rowwise + columnwise,
                    saved=columnwise or rowwise, scaling_state=scaling_state_bytes(recipe),
                    weight_cast=weight_cast,
                    gather=float(source_bytes) if mx else float(FP8_BYTES),
                    gathered_transpose=0.0 if mx else 2.0 * columnwise)
