"""The weight gradients added into the main gradients apart, where Megatron-Core's gradient
accumulation fusion is off (Plan.grad_accumulation_fusion false: --no-gradient-accumulation-fusion,
NeMo's and Megatron-Bridge's gradient_accumulation_fusion false).

With the fusion (Megatron-Core's default) each linear layer's weight-gradient GEMM accumulates
straight into the parameter's main gradient, the gradient buffer's view (megatron/core/
tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward at d98e8a64:
fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32, or _fp16 for 16-bit main gradients, then
weight.grad_added_to_main_grad = True; Transformer Engine's linears likewise, their
fuse_wgrad_accumulation set from the config's gradient_accumulation_fusion). Without it the GEMM
writes the weight gradient in the parameter's dtype and DDP's backward post-hook adds it into the
main gradient (megatron/core/distributed/distributed_data_parallel.py _make_backward_post_hook:
param.main_grad.add_(param.grad.data)): one more element-wise pass over the stage's linear
weights every micro-batch, reading the gradient (e_w bytes a parameter: the parameter's dtype)
and the main gradient and writing it (2 e_g: fp32, or 16 bits with grad_dtype bf16 or fp16):
    P_lin,stage = the stage's linear weights on one GPU: its layers' (their attention, MLP and
                  routed experts', the MTP modules' on the last stage) as perfmodel.step.fp8.
                  stage_fp8_weights counts them, and the output layer's V h / tp where the stage
                  holds it
    T_gacc      = (1 - f_gacc) (e_w + 2 e_g) P_lin,stage / W            [s per micro-batch]
f_gacc: 1 with the fusion (0 added). The embedding table is no linear: its gradient goes through
the hook either way; an output layer tied to the embedding held with it is that table, its GEMM's
gradient summed into the table's (not counted apart). The GEMM writing the gradient instead of
accumulating into it is taken as the same GEMM time, and the hook's add kernels (one a weight)
as dispatched behind the device's work (no host term).
"""

from __future__ import annotations

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.step import fp8 as FP8
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context

TERM = "compute/backward/grad_accumulation"
# the pass over a weight gradient: read it (e_w) and the main gradient (e_g), write it (e_g)
MAIN_GRAD_PASSES = 2


def stage_linear_weights(c: Context, stage: str, has_embedding: sp.Expr,
                         has_output: sp.Expr) -> sp.Expr:
    """P_lin,stage: the linear layers' weights on one GPU of a stage (module doc)."""
    dense, experts = FP8.stage_fp8_weights(c, stage, has_output,
                                           output=1 - c.tied * has_embedding)
    return dense + experts


def grad_accumulation_phases(c: Context, stage: str, has_embedding: sp.Expr,
                             has_output: sp.Expr) -> tuple[Phase, ...]:
    """The hook's pass, T_gacc (module doc), in each micro-batch's backward; none with the
    fusion."""
    if c.fam.grad_accumulation_fusion:
        return ()
    nbytes = (S.wbytes + MAIN_GRAD_PASSES * S.gbytes) * stage_linear_weights(
        c, stage, has_embedding, has_output)
    return (Phase(name="grad_accumulation", device={TERM: K.memory_time(nbytes, c.dev)}),)
