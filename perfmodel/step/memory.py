"""Memory per GPU, per stage [bytes] (perfmodel.costs.memory).

    model states   = params_stage x (e_w, e_g, e_o) / their ZeRO divisors; ZeRO 3 (FSDP2) keeps
                     the fp32 master as the shard: (e_w3, e_g, e_o3), bf16 4 + 4 + 8
                     (perfmodel.costs.precision.sharded_state_bytes_per_param)
    activations    = a layer's kept activations x the stage's layers x the micro-batches in flight
                     of one pipeline schedule (m / F where a step runs F schedules:
                     perfmodel.step.pipeline.schedule_micro_batches) (+ one layer's full
                     activations to recompute into, with full recompute; what per-op recompute
                     does not keep of one layer, with it)
    embedding, output: the embedding's dropout mask per in-flight micro-batch; the final norm's
                     input and the fp32 logits on the last stage
    fp8/...        = an fp8 plan's FP8 weight copies and scaling state (perfmodel.step.fp8); its
                     activations keep FP8 copies of the GEMM inputs (perfmodel.costs.memory; an
                     MoE layer's experts', perfmodel.costs.moe, MLA's projections',
                     perfmodel.costs.mla); with FP8 weights (fp8_params) their bf16 copies leave
                     `weights` (the routed experts' by the experts' ZeRO divisor)
    ZeRO 3 buffer  = two gathered layers (the one computing and the next, prefetched), and the
                     root unit (embedding, final norm, output layer) gathered through the forward
                     to the loss, where memory peaks (torchtitan apply_fsdp: fully_shard(model),
                     the root, reshard_after_forward only after the forward); under a pipeline
                     (pp > 1) the stage's whole parameters, gathered through the step (with
                     more than 3 stages a rank the 3 torch keeps gathered: the root's stage and
                     two others, gathered_stages, data_parallel.regathers), and its
                     gradients unsharded (perfmodel.step.data_parallel, stage_resident: FSDP2
                     under torch.distributed.pipelining as torchtitan runs it); without a
                     pipeline, where FSDP defers its reduction to the last micro-batch
                     (Plan.defer_grad_sync), the gradients unsharded too
    reserved/...   = what the GPU holds beyond tensors: each NCCL communicator's buffers (one for
                     each of the tp (a grid layout: each of its sub-axes), dp and pp groups the
                     rank is in; HardwareSpec.
                     nccl_buffer_bytes), and the caching allocator's fragmentation: the
                     tensors allocated and freed every step (activations, gathered buffers) x
                     f / (1 - f) (HardwareSpec.memory_fragmentation; the model states sit in
                     buffers allocated once, which do not fragment). The CUDA context
                     (memory_reserved_bytes) is added by the prediction ("reserved").
A stage keeps no copy of what it sent on: the layers' activations are their inputs (Korthikanti),
and Megatron-LM frees the data of a stage's sent output tensor (megatron/core/pipeline_parallel/
schedules.py deallocate_output_tensor; NeMo deallocate_pipeline_outputs).
Context parallelism: activations are a cp rank's s / cp tokens' (Korthikanti's formulas with s /
cp); ZeRO shards over the dp x cp ranks. A mixture of experts: an MoE layer keeps its routed part's
activations (perfmodel.costs.moe) in place of the dense MLP's; the routed experts' gradients and
optimizer states are ZeRO-sharded over the expert-data-parallel group (tp dp cp / (ep etp) ranks).
Multi-token prediction: the last stage keeps its modules' layers' activations and logits.
The 3D cube (tp_layout 3d): each linear keeps the input and the weight block it gathered for its
forward, for the backward's weight and input gradients (Colossal-AI's _Linear3D saves both,
colossalai/legacy/nn/layer/parallel_3d/_operation.py at b5f9e37c7; the validation job's
workload.layouts.cube3d likewise): q times the input's local block (cube_kept).
Sources: Rajbhandari et al. 2020 (ZeRO, Sec. 3); Korthikanti et al. 2022 (Table 2, Sec. 4.2.3).
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import layouts as LY
from perfmodel.costs import memory as M
from perfmodel.costs import mla as MLA
from perfmodel.costs import moe as CM
from perfmodel.costs.compute import FP32_BYTES
from perfmodel.costs.lattice import either, lmax, lmin, times
from perfmodel.step import data_parallel as DP
from perfmodel.step import fp8 as FP8
from perfmodel.step import moe as MOE
from perfmodel.step import op_recompute as OP
from perfmodel.step import pipeline as PP
from perfmodel.step.context import Context, active
from perfmodel.step.parameters import Parameters
from perfmodel.step.pipeline import STAGES, holds

ZERO3_GATHERED_LAYERS = 2  # the layer computing and the next, prefetched
MASK_BYTES = 1  # a dropout mask keeps one byte per element
# Megatron's vocabulary-parallel cross entropy (Plan.cross_entropy unfused; Megatron-Core's native
# fusion, whose compiled steps mutate the same buffer, alike) holds one fp32 copy of the logits
# and one in their own dtype: it upcasts them and shifts, exponentiates and normalises that copy
# in place, saving it for the backward (megatron/core/tensor_parallel/cross_entropy.py since
# 9634c0e4a3, 2024-06-13, "in-place subtraction reduces memory pressure"; megatron/mpu/
# cross_entropy.py likewise from 57064fd6f2, 2020, to 55817ec9b9, 2022-09: between, the shift
# out of place peaked at two fp32 copies beside the logits), beside the logits while it runs,
# then, at the backward's start, beside their gradient, a new tensor in the logits' dtype cast
# from the fp32 one; logits already in fp32 are that copy (tests/unit/test_loss_memory.py runs
# its ops on torch's dispatch)
LOSS_LOGITS = 1  # fp32 copies
LOSS_LOGITS_OWN = 1  # copies in the logits' dtype, where it is not fp32
# PyTorch's eager loss (torchtitan, the validation job: F.cross_entropy(logits.float(), labels),
# the bf16 logits deleted before the backward) holds three at the backward's start: its
# log_softmax output (saved), nll_loss's gradient and log_softmax's input gradient (counted op
# by op on torch's dispatch in tests/unit/test_loss_memory.py)
LOSS_LOGITS_EAGER = 3
# Transformer Engine's fused cross entropy (Plan.cross_entropy te; transformer_engine/pytorch/
# cross_entropy.py at 02965d2: CrossEntropyFunction saves its bf16 input and its backward writes
# the gradient into it): one copy of the logits in the plan's dtype, no fp32 one
LOSS_LOGITS_TE = 1
# flash-attn's fused cross entropy (Plan.cross_entropy flash-attn; flash_attn/ops/triton/
# cross_entropy.py at 058ad35a: CrossEntropyLoss saves the logits, its backward writes their
# gradient into torch.empty_like(logits), inplace_backward false by default, as llm-foundry
# calls it): the logits and their gradient in the plan's dtype at the backward's start
LOSS_LOGITS_FLASH = 2


def gathered_stages(c: Context, params: Parameters, st: str, root: sp.Expr,
                    whole: sp.Expr) -> sp.Expr:
    """The parameters on one GPU of st's rank that FSDP holds gathered under torch's pipelining
    (or kept gathered without one, Plan.fsdp_reshard): all of its stages up to 3 a rank, else
    the 3 it keeps (_add_unshard_reshard): the stage with its root (the root, its layers:
    DP.root_chunk, and the multi-token-prediction modules beside the output layer) and two of
    the others, each the average of the rest (exact for equal stages: 3 / v of the layers).
    whole: 1 where the routed experts are no FSDP unit (an expert-data-parallel group of one
    rank: they stay whole, never gathered), their share of the kept stages left out."""
    return _kept_stages(c, st, layer=params.layer_per_gpu, moe_layer=params.moe_layer_per_gpu,
                        moe_experts=params.moe_layer_experts_per_gpu, mtp=params.mtp[st],
                        stage=params.per_stage[st], experts=params.experts[st], root=root,
                        whole=whole)


def _kept_stages(c: Context, st: str, *, layer: sp.Expr, moe_layer: sp.Expr,
                 moe_experts: sp.Expr, mtp: sp.Expr, stage: sp.Expr, experts: sp.Expr,
                 root: sp.Expr, whole: sp.Expr) -> sp.Expr:
    """gathered_stages' count of what st's rank holds gathered, of any per-layer quantity (its
    parameters, or an fp8 plan's FP8 weights among them: fp8_zero3_terms): a dense layer's
    `layer`, an MoE layer's `moe_layer` (of which `moe_experts` its routed experts'), the MTP
    modules' `mtp`, the stage's `stage` (of which `experts` the routed experts'), the root's
    `root`."""
    layers, dense = DP.root_chunk(c, st)
    heavy = layers * layer
    if c.fam.moe:
        heavy = dense * layer + (layers - dense) * moe_layer
    heavy += mtp  # (the multi-token-prediction modules beside the output layer)
    over = DP.more_stages_than_kept()
    rest = stage - root - heavy
    kept = root + heavy + (DP.MAX_GATHERED_STAGES - 1) * rest / lmax(1, S.v - 1)
    # (whole routed experts: the root's chunk's MoE layers' and 2 / (v - 1) of the others')
    ours = (layers - dense) * moe_experts if c.fam.moe else sp.Integer(0)
    kept -= whole * (ours + (DP.MAX_GATHERED_STAGES - 1) * (experts - ours)
                     / lmax(1, S.v - 1))
    return over * kept + (1 - over) * (stage - whole * experts)


def fp8_zero3_terms(c: Context, st: str, has_embed: sp.Expr, has_head: sp.Expr, whole: sp.Expr,
                    held: sp.Expr, div_weights: sp.Expr, div_experts: sp.Expr
                    ) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """ZeRO 3 with FP8 weights (Plan.fp8_params; Megatron FSDP's --fp8-param-gather, per-tensor
    recipes): (the FP8 copies a GPU of st's rank keeps [B], the FP8 weights among the parameters
    it holds gathered).

    Megatron FSDP shards the FP8 weights as it shards the others ("keep the compute param in
    fp8 ... and perform the param all-gather in fp8"): a rank keeps its shard, e_8 bytes per FP8
    weight over the ZeRO divisor (the routed experts' over edp), beside the fp32 master the
    weights term holds; no whole copy (Transformer Engine's per-module workspaces cache a cast of
    the gathered bf16 weights, which FP8 weights do not need), and no kept transposes
    (keep_fp8_transpose_cache, off by default: Megatron-LM megatron/core/distributed/fsdp/src/
    README.md at core_v0.15.0, "(number of parameter x 1 Byte) of memory overhead" when on, not
    modelled). A gathered FP8 weight takes c_w8 bytes (its rowwise copy, and on Hopper the
    transpose its backward makes) where a bf16 one takes wbytes: the gathered layers' (two, and
    the root) or, held gathered (under a pipeline, or kept), the stage's, as gathered_stages
    counts them; and the transposes (Hopper) a backward makes of routed experts held whole
    (no FSDP unit: an expert-data-parallel group of one rank), the gathered layers' worth [B]."""
    dense8, experts8 = FP8.stage_fp8_weights(c, st, has_head)
    copies = S.e8 * (dense8 / div_weights + experts8 / div_experts)
    lin8 = FP8.linear_weights_per_gpu(c)
    # (an output layer tied to the embedding held with it is the bf16 embedding's weight)
    root8 = has_head * (1 - c.tied * has_embed) * FP8.output_weights_per_gpu(c)
    layer8: sp.Expr = lin8
    moe_rest8 = moe_experts8 = sp.Integer(0)
    if c.fam.moe:
        moe_rest8, moe_experts8 = FP8.moe_weights_per_gpu(c)
        layer8 = lmax(lin8, moe_rest8 + (1 - whole) * moe_experts8)
    # (the MTP modules beside the output layer: stage_fp8_weights' share)
    mtp8 = has_head * sum(FP8.mtp_weights_per_gpu(c), sp.Integer(0)) if c.fam.mtp \
        else sp.Integer(0)
    stages8 = _kept_stages(c, st, layer=lin8, moe_layer=moe_rest8 + moe_experts8,
                           moe_experts=moe_experts8, mtp=mtp8, stage=dense8 + experts8,
                           experts=experts8, root=root8, whole=whole)
    gathered8 = (1 - held) * (ZERO3_GATHERED_LAYERS * layer8 + root8) + held * stages8
    whole_transposes = whole * (S.cw8 - S.e8) * ZERO3_GATHERED_LAYERS * moe_experts8
    return copies, gathered8, whole_transposes


def memory_terms(c: Context, params: Parameters,
                 offloaded: dict[str, sp.Expr] | None = None) -> dict[str, dict[str, sp.Expr]]:
    """stage -> term -> bytes on one GPU of that stage. With activation offloading
    (Family.cpu_offload) `offloaded`, where given, receives each stage's bytes per micro-batch
    that go to host memory (perfmodel.step.offload)."""
    b, h, a, kv, f, tp, e, T, V = S.b, S.h, S.a, S.kv, S.f, S.tp, S.e, c.T, S.V
    s = S.s / S.cp  # a cp rank's tokens of each sequence
    # ZeRO 3 (FSDP2): the fp32 master is the sharded parameter (no 16-bit copy of the shard).
    # Under a pipeline it accumulates the gradients unsharded (perfmodel.step.data_parallel:
    # stage_resident) in its reduce dtype, fp32 for every FSDP2 perfmodel reads or runs
    # (torchtitan's mixed_precision_reduce, the only value its reader takes; NeMo AutoModel's
    # MixedPrecisionPolicy default; the validation job's): torch's to_accumulated_grad_if_needed
    # Deferred to the last micro-batch without a pipeline (Plan.defer_grad_sync) likewise: the
    # step's sharded gradients appear as its last backward reduces (and frees) the unsharded.
    resident, deferred = DP.stage_resident(c), DP.deferred(c)
    unsharded = resident + deferred
    per_param = {"weights": S.wbytes + c.zero3 * (S.wbytes3 - S.wbytes),
                 "gradients": S.gbytes + unsharded * (FP32_BYTES - S.gbytes),
                 "optimizer_states": S.obytes + c.zero3 * (S.obytes3 - S.obytes)}
    # routed experts that sync apart over an expert-data-parallel group of one rank are no FSDP
    # unit (the workload's ignored_params; AutoModel without ep sharding): their gradients stay
    # in the gradient dtype, whatever FSDP accumulates for the others
    per_param_experts = dict(per_param)
    whole: sp.Expr = sp.Integer(0)
    if c.fam.moe:
        whole = DP.expert_sync_apart(c) * (1 - active(DP.expert_replicas(c)))
        per_param_experts["gradients"] = S.gbytes \
            + unsharded * (1 - whole) * (FP32_BYTES - S.gbytes)
    # the gradients sharded as ZeRO 2 shards them, but whole under a pipeline's ZeRO 3 and where
    # FSDP defers its reduction
    sharded_grads = c.zero2 - unsharded
    div = M.zero_divisors(c.zero1, sharded_grads, c.zero3, DP.replicas(c))
    div_experts = M.zero_divisors(c.zero1, sharded_grads, c.zero3, DP.expert_replicas(c))
    act_kw: dict[str, Any] = dict(sequence_parallel=c.split, flash=c.flash, gated=c.gated, d=c.d,
                                  fp8=c.fp8, fp8_saved=S.s8 if c.fam.fp8 else sp.Integer(1),
                                  dropout=c.dropout, attention_dropout=c.attention_dropout,
                                  full_inputs=c.full_inputs)
    if c.fam.mla:
        act_kw["attention"] = MLA.mla_activation_bytes(T, a, S.r_q, S.r_kv, S.d_nope, S.d_rope,
                                                       S.d_v, e, q_lora=c.fam.mla_q_lora)
        if c.fam.fp8:  # its projections' FP8 copies
            act_kw["fp8_attention"] = MLA.mla_fp8_saved_bytes(
                T, h, a, S.r_q, S.r_kv, S.d_v, e, S.s8, c.flash, q_lora=c.fam.mla_q_lora)

    def activations(**kw: Any) -> sp.Expr:
        """One layer's kept bytes under the given policy shares: a dense layer's, and with
        experts (kw moe=True) an MoE layer's."""
        mlp = fp8_mlp = None
        if kw.pop("moe", False):
            T_r, _, _, A_r = MOE.routed_tokens(c)
            # where the routing weights multiply (Plan.expert_weighting) decides whether the
            # experts' outputs are kept (perfmodel.costs.moe.moe_activation_bytes)
            mlp = CM.moe_activation_bytes(T_r, A_r, h, S.E, S.f_E, e, gated=c.gated,
                                          etp=S.etp, weighted_activation=c.weighted_activation)
            if c.fam.moe_shared:
                mlp += (2 + c.gated) * e * T * S.f_sh / tp
            if c.fam.fp8:  # the routed experts' FP8 copies; the router keeps its bf16 input,
                # the shared experts an FP8 copy of it and of their down projection's input
                shared = 1 if c.fam.moe_shared else 0
                fp8_mlp = {"input": shared * S.s8 * T * h,
                           "rank": CM.moe_fp8_saved_bytes(A_r, h, S.f_E, e, S.s8, etp=S.etp)
                           + shared * (S.s8 - e) * T * S.f_sh / tp}
        if (c.fam.moe or c.fam.mla) and kw.get("op", 0) != 0:  # per-op recompute as
            # torchtitan's modules run (where the policy has it: 0 x the count is no term)
            kw["per_op"] = OP.kept_bytes(c, mlp is not None, s)
        return M.layer_activation_bytes(b, s, h, a, kv, f, tp, e, mlp=mlp, fp8_mlp=fp8_mlp,
                                        **{**act_kw, **kw})

    # selective recompute: the attention core where the plan names it (its default), and what
    # its other modules drop (module_drops); the shares of a stage's layers, 0 under the others
    policy = dict(full=c.full, selective=c.core, op=c.op)
    cube = cube_kept(c)  # what the cube's linears keep beyond a split layer's count
    act_layer = activations(**policy) - module_drops(c, moe=False) + times(1 - c.full, cube)
    full_layer = activations(full=0, selective=0) + cube
    # a checkpoint's input, which its rebuilt layers hold again as the first norm's input (the
    # same storage: Megatron's CheckpointFunction and TE's checkpoint re-run the forward on it
    # detached, detach_variable), counted once, with the layers' kept activations
    checkpoint_input = activations(full=1, selective=0, full_inputs=1)
    op_layer = activations(full=0, selective=0, op=1) + cube
    moe_count = MOE.moe_layers(c) if c.fam.moe else {st: 0 for st in STAGES}
    if c.fam.moe:
        act_moe = activations(**policy, moe=True) - module_drops(c, moe=True)
        # the recompute buffer: the larger of a dense and an MoE layer's
        op_gap = lmax(full_layer - op_layer, activations(full=0, selective=0, moe=True)
                      - activations(full=0, selective=0, op=1, moe=True))
        full_layer = lmax(full_layer, activations(full=0, selective=0, moe=True))
    else:
        op_gap = full_layer - op_layer
    # selective recompute rebuilds one layer's attention core at a time in the backward (its
    # scores and softmax without flash attention: Megatron's checkpointed core_attention), held
    # for that layer's backward: what the core's checkpoint drops from a layer
    core_gap = activations(full=0, selective=0) - activations(full=0, selective=1)
    if c.fam.moe:
        core_gap = lmax(core_gap, activations(full=0, selective=0, moe=True)
                        - activations(full=0, selective=1, moe=True))
    core_gap = lmax(0, core_gap)
    # what per-op recompute rebuilds is never less than nothing: its kept tensors include some
    # whole on every tp rank (the layer's input without sequence parallelism, SwiGLU's MLP-down
    # partial sums) and bf16 ones under FP8 (torchtitan's count, no Transformer Engine), so at
    # a high tp they can exceed the whole layer's count, and the difference fell below 0
    op_gap = lmax(0, op_gap)
    # the micro-batches in flight on the first rank, the fullest of those between (the second;
    # with zbv, whose counts grow with the rank where a schedule's micro-batches are fewer than
    # 2 pp - 1, the one before the last) and the last
    # (a layout's unequal chunks: each rank's first and last chunk's share of its layers)
    between = 1 + c.zbv * (S.pp - 3)
    ends = dict(zip(("first", "middle", "last"), c.fam.end_chunks or (), strict=False))

    def shares(st: str) -> tuple[sp.Expr, sp.Expr] | None:
        first, last, n = ends.get(st, (0, 0, 0))
        return (sp.Rational(first, n), sp.Rational(last, n)) if n else None
    # counted on one pipeline schedule's micro-batches (Plan.pipeline_micro_batches: a step of F
    # schedules runs each to its last backward before the next fills, so a stage never holds
    # more than one schedule's: GPipe m / F, 1F1B min(m / F, pp - r), ...), the step's m where
    # it runs one
    inflight = {st: c.single + c.multi * M.inflight_micro_batches(
        c.gpipe, c.interleaved, S.pp, PP.schedule_micro_batches(c), S.v,
        zb=c.zero_bubble - c.zbv, zbv=c.zbv, rank=rank, chunks=shares(st))
        for st, rank in (("first", 0), ("middle", between), ("last", S.pp - 1))}
    # the largest layer FSDP gathers whole: a dense one, or an MoE layer with its E / ep
    # routed experts (their unit and the layer's, gathered for the same computation; not them
    # where they stay whole: an expert-data-parallel group of one rank)
    gathered_layer = params.layer_per_gpu
    if c.fam.moe:
        gathered_layer = lmax(gathered_layer, params.moe_layer_per_gpu
                              - whole * params.moe_layer_experts_per_gpu)
    out: dict[str, dict[str, sp.Expr]] = {}
    for st in STAGES:
        has_embed, has_head = holds(c, st)
        experts = params.experts[st]
        mem = {name: per_param[name] * params.per_stage[st] / div[name] for name in per_param}
        if c.fam.moe:
            mem = {name: per_param[name] * (params.per_stage[st] - experts) / div[name]
                   + per_param_experts[name] * experts / div_experts[name]
                   for name in per_param}
        # under a pipeline with several schedules a step each schedule's reduction leaves the
        # sharded gradients (the shard's dtype) beside the next schedule's unsharded ones
        mem["gradients"] += resident * active(PP.flushes(c)) * S.gbytes \
            * ((params.per_stage[st] - experts) / DP.replicas(c)
               + experts / DP.expert_replicas(c))
        if c.fam.bf16_optimizer:  # DeepSpeed's BF16_Optimizer: the backward's bf16 gradients
            # (lp grads, cleared at the next backward's start) beside its whole fp32 ones
            mem["gradients"] += S.e * params.per_stage[st]
        if c.fam.fp8_params:  # the linear weights are the FP8 copies (fp8/weight_copies); the
            # routed experts' sharded as their weights are (over edp). Under ZeRO 3 the weights
            # are the fp32 shard (the master, as FSDP keeps it) and no 16-bit copy is held: the
            # FP8 shard comes beside it (fp8_zero3_terms)
            dense8, experts8 = FP8.stage_fp8_weights(c, st, has_head)
            mem["weights"] -= (1 - c.zero3) * S.wbytes * (dense8 / div["weights"]
                                                          + experts8 / div_experts["weights"])
        stage_inflight = inflight[st]
        n = c.stage_layers[st]
        layers = times(act_layer, n)
        if c.fam.moe:
            layers = times(act_layer, n - moe_count[st]) + times(act_moe, moe_count[st])
        if c.fam.cpu_offload:
            # Transformer Engine's offload keeps at most (layers - N_off) layers' activations on
            # the GPU (get_cpu_offload_context: "(num_layers - num_offloaded_layers) * T"): the
            # first N_off layers' go to the host (pp 1: one micro-batch in flight); a mixture of
            # experts' dense layers among them, [i < N_off] for each dense layer i
            moved = act_layer * S.N_off
            if c.fam.moe:
                dense = sp.Add(*(lmin(1, lmax(0, S.N_off - i)) for i in c.fam.moe_dense_layers))
                moved = act_layer * dense + act_moe * (S.N_off - dense)
            layers -= moved
            if offloaded is not None:
                offloaded[st] = moved
        if c.fam.mtp:  # the modules' layers, as the last's, on the stage with the output layer
            layers += times(has_head * S.D_mtp, act_moe if c.fam.mtp_last_moe else act_layer)
        mem["activations/layers"] = layers * stage_inflight
        # one layer's activations rebuilt at a time, a group's with Megatron's uniform method,
        # but the group's input, the checkpoint the layers above keep; a layer's attention core
        # under selective recompute
        mem["activations/recompute_buffer"] = \
            c.full_any * (c.full_group * full_layer - checkpoint_input) + c.op_any * op_gap \
            + times(lmin(1, c.core * c.layers_per_stage), core_gap)
        # the embedding's dropout mask per in-flight micro-batch (with a hidden dropout rate
        # above 0: perfmodel.costs.memory.layer_activation_bytes); the final norm's input (two
        # copies, as the first step model counted them, 88e7cc9) and the loss's logits:
        # Megatron's one fp32 copy beside one in their dtype (LOSS_LOGITS, LOSS_LOGITS_OWN), with
        # eager kernels PyTorch's three fp32 ones (LOSS_LOGITS_EAGER), or with Transformer
        # Engine's fused cross entropy the bf16 logits alone (they hold their gradient:
        # LOSS_LOGITS_TE) (PyTorch's F.cross_entropy named as such: its three copies whatever
        # the other kernels, fp32 ones (torch) or in the logits' own dtype (no-upcast))
        megatron = LOSS_LOGITS * FP32_BYTES + LOSS_LOGITS_OWN * e * lmin(1, FP32_BYTES - e)
        eager = LOSS_LOGITS_EAGER * FP32_BYTES
        upcast = either(c.loss_torch, eager, either(
            c.loss_native, megatron, megatron + (eager - megatron) * c.eager_kernels))
        fp32_loss = either(c.loss_no_upcast, LOSS_LOGITS_EAGER * e, upcast) * T * V / tp
        loss = either(c.loss_flash, LOSS_LOGITS_FLASH * e * T * V / tp,
                      either(c.te_loss, LOSS_LOGITS_TE * e * T * V / tp, fp32_loss))
        mem["activations/embedding_output"] = \
            times(has_embed * c.dropout * MASK_BYTES * T * h / c.act_ranks, stage_inflight) \
            + times(has_head, 2 * e * T * h / c.act_ranks + loss) \
            * (1 + (S.D_mtp if c.fam.mtp else 0))
        root = has_embed * (params.embedding["sharded"] / tp + params.embedding["replicated"]) \
            + has_head * (params.final_norm + (1 - c.tied * has_embed) * V * h / tp)
        # (under a pipeline the stage's units stay gathered through the step, at most 3 of a
        # rank's v stages at a time: the one with its root and two others; stage_resident,
        # regathers; without one, kept from forward to backward or through the step
        # (Plan.fsdp_reshard), every unit at the forward's end)
        held = resident + sum(DP.kept(c), sp.Integer(0))
        mem["buffers/zero3_gather"] = c.zero3 * S.wbytes * (
            (1 - held) * (ZERO3_GATHERED_LAYERS * gathered_layer + root)
            + held * gathered_stages(c, params, st, root, whole))
        if c.fam.fp8:  # allocated once and kept: not in the allocator's churn below
            mem.update(FP8.memory_terms(c, st, has_head))
        if c.fam.fp8_params:  # ZeRO 3 with FP8 weights (fp8_zero3_terms)
            copies, gathered8, transposes = fp8_zero3_terms(
                c, st, has_embed, has_head, whole, held, div["weights"], div_experts["weights"])
            mem["fp8/weight_copies"] += c.zero3 * (copies - mem["fp8/weight_copies"])
            mem["buffers/zero3_gather"] += c.zero3 * (transposes
                                                      - (S.wbytes - S.cw8) * gathered8)
        # the tensors allocated and freed every step (the model states sit in buffers allocated
        # once: Megatron's contiguous parameter and gradient buffers, FSDP's shards; under a
        # pipeline, or deferred, FSDP's unsharded gradients are allocated and freed every step,
        # as its gathered weights are)
        transient = sp.Add(*(x for k, x in mem.items() if k.startswith(("activations/",
                                                                         "buffers/")))) \
            + unsharded * mem["gradients"]
        # a grid layout's rank is in one communicator of each sub-axis (2D: its row and column,
        # 2.5D and 3D: a third, the depth's), Megatron's 1D in the tp group's
        tp_groups = c.megatron * active(S.tp) \
            + (1 - c.megatron) * (active(S.q_a) + active(S.q_b) + active(S.q_c))
        groups = tp_groups + active(S.dp) + active(S.pp)
        if c.fam.moe:  # the expert-parallel group, and the experts' own where they sync apart;
            # with etp > 1 the expert-tensor group and the etp x ep group (Megatron-Core's
            # expt_tp and tp_ep communicators)
            groups += active(S.ep) + DP.expert_sync_apart(c) * active(DP.expert_replicas(c)) \
                + active(S.etp) * (1 + active(S.ep))
        # with context parallelism the cp group and the dp x cp group
        mem["reserved/nccl_buffers"] = S.M_nccl * (groups + 2 * active(S.cp))
        mem["reserved/fragmentation"] = transient * S.f_frag / (1 - S.f_frag)
        out[st] = {k: sp.sympify(x) for k, x in mem.items()}
    return out


def cube_kept(c: Context) -> sp.Expr:
    """Bytes one layer's linears keep under the 3D cube (tp_layout 3d; 0 otherwise) beyond the
    layer's activations split over its q^3 ranks (perfmodel.costs.memory, sequence_parallel 1),
    per micro-batch on one rank. Each linear Y = X W (X: T x K, W: K x M; perfmodel.costs.layouts
    .cube_comm) gathers its input block (T K / q^2 elements, q times its local block) and its
    weight block (K M / q^2) for the forward and keeps both for the backward (module doc):
        (q - 1) e T (h + a d + h + f) / q^3 + e sum(K M) / q^2
    the inputs of the QKV, attention-output, MLP-up and MLP-down projections beyond the local
    blocks the layer's count already holds, and the four gathered weight blocks. A layer under
    full recompute keeps neither (its rebuilt forward holds them again: the recompute buffer)."""
    q, e, T = S.q_a, S.e, c.T
    linears = LY.linear_shapes(S.h, S.a, S.kv, S.f, c.gated, c.d)
    inputs = sum((K for _, K, _ in linears), sp.Integer(0))
    weights = sum((K * M for _, K, M in linears), sp.Integer(0))
    return c.grid3 * ((q - 1) * e * T * inputs / q**3 + e * weights / q**2)


def module_drops(c: Context, *, moe: bool) -> sp.Expr:
    """Bytes one layer no longer keeps under selective recompute's modules beyond the attention
    core (perfmodel.strategy.RECOMPUTE_MODULES, Megatron-Core's recompute_modules), each times
    the share of the layers it applies to (Context.recomputes), per micro-batch on one rank:
        mla_up_proj     MLA's up projections' outputs, Q and K (e T a d_qk each) and V
                        (e T a d_v), over tp (their inputs, the latents, are kept: the outputs
                        are freed once the attention has read them and recomputed before its
                        backward; an fp8 plan's FP8 copies of the latents stay)
        mlp             a dense layer's MLP run under a checkpoint: its activations
                        (2 + gated) e T f / tp and an fp8 plan's FP8 copies of its inputs,
                        (s_8 - e) (T h / r + T f / tp); its input, the norm's output, is kept
        moe_act         the routed experts' activation output, the down projections' input,
                        e A_r f_E (a bf16 plan's; an fp8 plan's down projections keep their FP8
                        copy of it, and nothing is dropped)
        shared_experts  the shared experts under a checkpoint: (2 + gated) e T f_sh / tp, and an
                        fp8 plan's FP8 copies of their inputs, (s_8 - e) T f_sh / tp + s_8 T h
        layernorm       an MoE layer's pre-MLP norm output, e T h / r (the router's input, kept
                        in bf16 by every plan: Megatron-Core frees it after the forward and
                        recomputes the norm before the backward; a dense layer's norms are fused
                        into Transformer Engine's linears, MLA's input norm is not counted)
    r: the ranks an activation is split over (tp with sequence parallelism, else 1)."""
    if not set(c.fam.recompute_modules) - {"core_attn"}:
        return sp.Integer(0)
    e, T, tp, h, a = S.e, c.T, S.tp, S.h, S.a
    fp8 = 1 if c.fam.fp8 else 0
    s8 = S.s8 if c.fam.fp8 else e
    out = sp.Integer(0)
    if c.fam.mla:
        out += c.recomputes("mla_up_proj") * e * T * a * (2 * (S.d_nope + S.d_rope) + S.d_v) / tp
    if not moe:
        out += c.recomputes("mlp") * ((2 + c.gated) * e * T * S.f / tp
                                      + fp8 * (s8 - e) * (T * h / c.act_ranks + T * S.f / tp))
        return out
    _, _, _, A_r = MOE.routed_tokens(c)
    out += c.recomputes("moe_act") * (1 - fp8) * e * A_r * S.f_E
    out += c.recomputes("layernorm") * e * T * h / c.act_ranks
    if c.fam.moe_shared:
        out += c.recomputes("shared_experts") * ((2 + c.gated) * e * T * S.f_sh / tp
                                                 + fp8 * ((s8 - e) * T * S.f_sh / tp
                                                          + s8 * T * h / c.act_ranks))
    return out

