"""Host time on an asynchronous device: the framework ops a part issues, what each costs the host
under the plan's software stack, and the training loop's own ops (perfmodel.step.compose
overlaps it with the device's time; on synchronous CPU ranks the step model keeps its cost per
kernel launch, perfmodel.step.framework).

    host(part) = ops(part, stack) x t_op(stack)                                              [s]
    (a backward's ops at t_op^bwd, HardwareSpec.host_op_backward_overhead_s: autograd's engine
    issues them from C++, the forward's come through Python modules; t_op where not measured)
    t_op(eager) = t_op(compiled) = t_op (HardwareSpec.host_op_overhead_s, measured by
                  `calibrate run`'s host stage; kernel_overhead_s where not measured),
    t_op(cuda-graphs) = 0 for the layers: a graph replays its kernels with one launch.

Op counts: the validation job's own transformer layer (workload.model.Block), counted under
torch's dispatcher (a TorchDispatchMode counting every aten op, views included, since each is a
dispatch the host pays for; torch 2.13, CPU, one micro-batch after a warm-up, gradients
accumulating) for every combination of biases, gated MLP and norm; the counts add up exactly as
the constants below. Compiled: the same layer under torch.compile (Inductor, the FX graph cache
off), the generated wrapper's fused kernels plus its extern calls (GEMMs, attention), forward and
backward graph; the norm's kind makes no difference there (fused either way). The embedding and
the output layer with its loss stay eager under every stack (torchtitan compiles, and Megatron
graphs, the transformer blocks only).
"""

from __future__ import annotations

import sympy as sp

from perfmodel import symbols as S
from perfmodel.step.context import Context

# Eager: aten ops of one layer's forward and backward. Base: LayerNorm, biases, GELU MLP (39, 77
# without the biases' backward); RMSNorm is composite in eager (pow, mean, add, rsqrt, mul per
# norm: +12 forward, +30 backward); a gated MLP adds its third linear and the product (+5, +12,
# +3 more for its bias's gradient); biases add their gradients' reductions and copies (+18).
EAGER_FORWARD_OPS = 39
EAGER_FORWARD_RMSNORM = 12
EAGER_FORWARD_GATED = 5
EAGER_BACKWARD_OPS = 77
EAGER_BACKWARD_BIAS = 18
EAGER_BACKWARD_RMSNORM = 30
EAGER_BACKWARD_GATED = 12
EAGER_BACKWARD_GATED_BIAS = 3
# What the validation job's layer does not have (learned positions; SDPA's enable_gqa): rotary
# embeddings and grouped-query K and V. Eager kernels: torchtitan's apply_rotary_emb on q and k and
# repeat_kv on K and V (pytorch/torchtitan 015ccb237, torchtitan/models/llama/model.py), their
# dispatches counted likewise (bf16, views included): RoPE 16 forward (2 casts to fp32, the
# complex views, the two products, 2 casts back), 18 backward; repeat_kv 10 forward (unsqueeze,
# expand, the copy, its view, the transpose; for K and V), 8 backward. Fused kernels:
# Megatron-Core's fused RoPE, one Transformer Engine call on q and one on k, each way.
EAGER_FORWARD_ROPE, EAGER_BACKWARD_ROPE = 16, 18
# A RoPE that rotates part of each head, op by op (transformers' glm4_moe and gpt_neox
# apply_rotary_pos_emb, Megatron-Core's unfused _apply_rotary_pos_emb_bshd: slice, rotate the
# slice, concatenate; perfmodel.costs.compute.rope_split_bytes), counted likewise around
# torchtitan's ops on the slice: 2 slices and the cat forward, on q and on k (6); backward the
# cat's gradient sliced in two, the two slice_backward and the sum of q's (and k's) gradients (10)
EAGER_FORWARD_ROPE_SPLIT, EAGER_BACKWARD_ROPE_SPLIT = 6, 10
EAGER_FORWARD_REPEAT_KV, EAGER_BACKWARD_REPEAT_KV = 10, 8
# The validation job's unfused attention core (workload.model.unfused_attention) beyond SDPA's
# one call, counted likewise on its layer (multi-head; bf16, views included): the scaling,
# the batched products' expands, views and copies, the causal mask, masked_fill_ and the
# softmax, 21 forward; their gradients, 21 backward
EAGER_FORWARD_UNFUSED, EAGER_BACKWARD_UNFUSED = 21, 21
FUSED_ROPE_OPS = 2
# Compiled (Inductor): forward 4 fused kernels + 6 GEMMs + attention (+1 GEMM gated); backward
# 4 fused kernels + 12 GEMMs + attention's backward (+1 fused kernel with biases, +2 GEMMs gated).
COMPILED_FORWARD_KERNELS = 11
COMPILED_FORWARD_GATED = 1
COMPILED_BACKWARD_KERNELS = 17
COMPILED_BACKWARD_BIAS = 1
COMPILED_BACKWARD_GATED = 2
# The embedding (token and learned position lookups, their sum) and the output layer with its
# loss (final norm, logits GEMM, log-softmax and NLL), eager, counted likewise.
EMBEDDING_FORWARD_OPS, EMBEDDING_BACKWARD_OPS = 4, 6
OUTPUT_FORWARD_OPS, OUTPUT_BACKWARD_OPS = 10, 18
# The training loop's ops per micro-batch, counted in Megatron-LM's pretrain_gpt.py (at
# 000ab9d): get_batch's host-to-device copies of tokens, labels, loss mask, attention mask and
# positions (5, on the first stage); loss_func's views, casts, masked sum, token count and
# report (15), the NaN and Inf checks of the loss (check_for_nan_in_loss_and_grad, 4) and the
# schedule's scaling of the loss by the micro-batches and the loss scale (3), on the last stage.
LOOP_DATA_OPS = 5
LOOP_LOSS_OPS = 22


def layer_ops(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) framework ops of one layer under the plan's stack (0 under CUDA
    graphs: see op_s); eager, with a rotary model's RoPE and a grouped-query model's repeat_kv
    as the plan's kernels run them (op by op, with a partial rotation's split and
    concatenation, or fused RoPE: one call on q and one on k however much of them it rotates),
    and an unfused attention core op by op as the validation job runs it."""
    rms, gated, bias = 1 - c.layernorm, c.gated, c.bias
    by_op, rope, split = c.eager_kernels, c.rotary, int(c.fam.partial_rotary)
    unfused = by_op * (1 - c.flash)  # the job's unfused core op by op
    eager = (EAGER_FORWARD_OPS + EAGER_FORWARD_RMSNORM * rms + EAGER_FORWARD_GATED * gated
             + rope * (by_op * (EAGER_FORWARD_ROPE + split * EAGER_FORWARD_ROPE_SPLIT)
                       + (1 - by_op) * FUSED_ROPE_OPS)
             + by_op * c.gqa * EAGER_FORWARD_REPEAT_KV + unfused * EAGER_FORWARD_UNFUSED,
             EAGER_BACKWARD_OPS + EAGER_BACKWARD_BIAS * bias + EAGER_BACKWARD_RMSNORM * rms
             + EAGER_BACKWARD_GATED * gated + EAGER_BACKWARD_GATED_BIAS * gated * bias
             + rope * (by_op * (EAGER_BACKWARD_ROPE + split * EAGER_BACKWARD_ROPE_SPLIT)
                       + (1 - by_op) * FUSED_ROPE_OPS)
             + by_op * c.gqa * EAGER_BACKWARD_REPEAT_KV + unfused * EAGER_BACKWARD_UNFUSED)
    compiled = (COMPILED_FORWARD_KERNELS + COMPILED_FORWARD_GATED * gated,
                COMPILED_BACKWARD_KERNELS + COMPILED_BACKWARD_BIAS * bias
                + COMPILED_BACKWARD_GATED * gated)
    fused = c.compiled + c.graphs  # CUDA graphs replay the compiled kernels
    return ((1 - fused) * eager[0] + fused * compiled[0],
            (1 - fused) * eager[1] + fused * compiled[1])


def op_s(c: Context, layers: bool, backward: bool = False) -> sp.Expr:
    """Host time of one framework op [s]: t_op, t_op^bwd for the backward's (autograd's engine
    issues them; t_op where not measured apart, perfmodel.encode), none for the layers under CUDA
    graphs."""
    per_op = S.t_opb if backward else S.t_op
    return per_op * (1 - c.graphs) if layers else per_op


def launch_s(c: Context) -> sp.Expr:
    """Host time of one collective launch [s]: its dispatch as an op (none when captured in a
    CUDA graph) and the measured cost beyond (t_coll)."""
    return S.t_coll + S.t_op * (1 - c.graphs)


def loop_s(c: Context, has_embedding: sp.Expr, has_output: sp.Expr) -> sp.Expr:
    """The training loop's host time per micro-batch on a stage [s]: the data on the stage that
    holds the embedding, the loss on the one that holds the output layer."""
    return S.t_op * (LOOP_DATA_OPS * has_embedding + LOOP_LOSS_OPS * has_output)
