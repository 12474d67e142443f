"""Data parallelism: the gradient sync (DDP, the distributed optimizer, FSDP) and its memory passes.

ZeRO 0 (DDP, Megatron): all-reduce the gradients once per step. ZeRO 1-2 (distributed optimizer):
reduce-scatter the gradients, all-gather the updated weights. ZeRO 3 (FSDP2): one unit per layer and
one for the rest (embedding, final norm, output layer); each unit's weights are gathered for the
forward and again for the backward in every micro-batch, its gradients reduce-scattered after
every micro-batch's backward and accumulated sharded, as the stacks run FSDP2 and ZeRO-3 without a
pipeline: torchtitan's trainer loops over its gradient-accumulation steps without turning the
sync off (torchtitan/trainer.py at b5bcd76c6, train_step; only its chunked loss's lm_head defers),
Megatron-LM's TorchFullyShardedDataParallel inherits a no_sync that does nothing
(megatron/core/distributed/data_parallel_base.py at d98e8a64dd) and Megatron FSDP's "in grads
shard mode" syncs always (megatron_fsdp.py, MegatronFSDP.no_sync), DeepSpeed's ZeRO-3 reduces in
every backward's hooks (and refuses no_sync); sizes padded as FSDP2 pads them (each parameter's
rows to a multiple of dp); the gathers and reductions are timed with the sync, where their overlap
applies (their launches with the micro-batches that issue them). Sizes: the stage with the most
parameters. A loop that defers the reduction to the last micro-batch (FSDP2's
set_requires_gradient_sync(False) before the others: NeMo AutoModel's defer_fsdp_grad_sync, on by
default; Plan.defer_grad_sync) reduce-scatters once, in the last micro-batch's backward, and holds
the gradients unsharded (fp32, FSDP2's to_accumulated_grad_if_needed) until then (perfmodel.step.
memory); the validation job's FSDP2 runs either. When the units' gathered weights are freed
(Plan.fsdp_reshard; `kept`): after each forward, gathered again for the backward (FSDP2's
reshard_after_forward true, the default: two gathers a micro-batch); after each backward
(reshard_after_forward false: NeMo AutoModel's MoE parallelizer's default, torchtitan's "never":
one); or after the step's last backward (NeMo AutoModel's enable_fsdp_optimizations, components/
moe/fsdp_mixin.py: set_reshard_after_backward and set_requires_gradient_sync off until the last
micro-batch): one gather a step, hidden as a pipeline's are behind the first forward, and the
reduction deferred. The validation job runs each (its dry run counts them as the ledger does).

What hides, and behind what (each: exposed = I max(f C, C - W) + (1 - I) C, perfmodel.step.compose):
  - the gradient reduction (all-reduce, reduce-scatter), with overlap_grad_sync: Megatron's DDP
    accumulates the gradients of every micro-batch but the last without communicating (no_sync)
    and reduces each bucket as soon as the LAST micro-batch's backward has produced it; NeMo
    chunks it by transformer layer and "exposes only one DP communication chunk" (NeMo docs,
    Communication Overlap). W = one micro-batch's backward on the last stage, f = one layer's
    share (1 / its layers).
  - FSDP's reduce-scatters (ZeRO 3 without a pipeline), with overlap_grad_sync: each unit's as
    soon as its backward has produced its gradients, in every micro-batch (the workload's FSDP2
    too): W = every micro-batch's backward, f = one unit's reduction of one micro-batch
    (1 / (m (layers + 1))): the last micro-batch's last unit has nothing left to hide behind;
    deferred (Plan.defer_grad_sync), W = the last micro-batch's backward, f = one unit's.
  - the distributed optimizer's parameter all-gather (ZeRO 1-2), with overlap_param_gather
    (Megatron --overlap-param-gather): gathered bucket by bucket during the next step's first
    forward, each layer waiting for its own: W = one micro-batch's forward on the first stage,
    f = one layer's share. Without it the gather follows the optimizer step, exposed.
  - FSDP's gathers (ZeRO 3), with overlap_param_gather (FSDP2's prefetch: the next unit's gather
    is issued while the current unit computes, forward and backward): W = every micro-batch's
    forward and backward on the stage, f = one unit's gather per micro-batch
    (1 / (2 (layers + 1))).
ZeRO 3 under a pipeline (pp > 1: FSDP2 under torch.distributed.pipelining, as torchtitan runs it;
`stage_resident`): the stage's units stay gathered from the first micro-batch's forward to the
step's end, and its gradients accumulate unsharded until the stage's last backward. torchtitan's
default reshard_after_forward is off with pp > 1 (torchtitan/distributed/fsdp.py,
get_fsdp_reshard_after_forward_policy: "do not reshard after forward to avoid per-microbatch
all-gathers"), and the schedule's backward neither reshards nor reduces (torch 2.13
torch/distributed/pipelining/stage.py: backward_maybe_with_nosync sets reshard_after_backward and
requires_gradient_sync off; perform_reduce_grad, after the stage's last backward, turns them on and
runs the post-backward). So each unit is gathered once per step, hidden behind the first
micro-batch's forward with overlap_param_gather (f = one unit's), and reduce-scattered after the
stage's last backward, with nothing left to hide behind; with several pipeline schedules a step
(Plan.pipeline_micro_batches: torchtitan's and NeMo AutoModel's gradient accumulation) once per
schedule, each ending in its reduction. A rank with more than 3 stages (virtual_stages v > 3,
the schedules torch lowers for its runtime: interleaved 1F1B and interleaved zero bubble) keeps at
most 3 of them gathered: before each action the next 3 stages the rank will compute are gathered
and the others resharded (torch 2.13 torch/distributed/pipelining/schedules.py,
_add_unshard_reshard, max_active_stages=3; the unshard issued async_op, ahead of its stage), so
each forward sweep over the rank's v stages and each backward sweep gathers v - 3 of them again.
Counted on torch's own action lists (tests/unit/test_fsdp_pipeline.py runs them for pp 2-16, v
1-12 and up to 12 rounds): a rank gathers its stages U times per schedule, U = v for v <= 3, else
U = 2 (v - 3) R + 3 + 2 [R > 1] (1 + [interleaved 1F1B]) with R = max(1, floor(m_s / pp)) rounds
of m_s micro-batches (torch's number_of_rounds; the +2 of interleaved 1F1B is its first pp / 2
ranks', rank 0's: the ledger's and the larger). The U - v gathers again (`regathers`) are issued
ahead of the compute that needs them and hide behind every micro-batch's forward and backward
with overlap_param_gather; memory holds 3 of the v stages gathered. Memory: perfmodel.step.memory.
The sync's memory passes run on the compute stream and never hide: DDP copies the gradients into its
flat buckets, scales them and copies them back (PyTorch DDP's default, without
gradient_as_bucket_view); FSDP2 copies a unit's shard into the all-gather buffer and the gathered
unit out of it, and the gradients into the reduce-scatter buffer and the reduced shard out.
FSDP2's hooks per unit (unshard, reshard, post-backward) cost what `calibrate run` measured.
Context parallelism: a replica's gradients are partial over its dp x cp ranks (each cp rank's over
its s / cp tokens), so every sync and ZeRO shard spans the dp x cp group (axis dp_cp, Megatron's
data-parallel group with context parallelism; the ledger names it dp when cp = 1). A mixture of
experts: the routed experts' gradients are reduced (and ZeRO-sharded) over the ranks holding the
same expert shards, the expert-data-parallel group (axis edp, tp dp cp / (etp ep) ranks:
Megatron-Core's expert mesh etp x ep x edp = tp x cp x dp, megatron/core/parallel_state.py at
d98e8a64ddf34856e74b24714e3bedb2f5a39553), in a sync of their own where that group differs from
dp x cp (ep > 1 or tp / etp > 1: Megatron-Core's expert data parallelism; the validation job's),
with the others otherwise. With FP8 weights (fp8_params) the distributed optimizer all-gathers the
FP8 weights at e_8 bytes, the routed experts' over edp (stage_weight_bytes); under ZeRO 3 each unit
is all-gathered with its FP8 weights at e_8 bytes (FsdpUnit.fp8: Megatron FSDP's
--fp8-param-gather). ZeRO 3 with experts
(FSDP2 beside expert parallelism, as torchtitan and NeMo AutoModel shard them): an MoE layer's
attention, norms, router and shared experts one unit over dp x cp and its routed experts another
over edp (fsdp_units; the validation job's workload.parallelize.apply_fsdp).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import memory as M
from perfmodel.costs import mla as MLA
from perfmodel.costs.lattice import applied, lmax, lmin, times
from perfmodel.step import fp8 as FP8
from perfmodel.step import pipeline as PP
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context, active
from perfmodel.step.parameters import Parameters
from perfmodel.strategy import BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK

FSDP_GATHERS_PER_MICRO_BATCH = 2  # a unit's weights, gathered for its forward and its backward
MAX_GATHERED_STAGES = 3  # torch.distributed.pipelining's max_active_stages under FSDP (module doc)
DDP_GRADIENT_PASSES = 6  # into the bucket, scaled, back: 3 reads and 3 writes of the gradients
FP32_GRAD = 4  # FSDP2's unsharded gradients accumulate in fp32, its reduce dtype (step.memory)
SYNC = "data_parallel/sync"
ZERO = sp.Integer(0)


def stage_resident(c: Context) -> sp.Expr:
    """1 where ZeRO 3's units stay gathered and its gradients unsharded through the step: ZeRO 3
    under a pipeline (pp > 1; module doc), else 0."""
    return c.zero3 * active(S.pp)


def kept(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(1 where ZeRO 3 without a pipeline keeps each unit gathered from its forward to its
    backward, 1 where it keeps them gathered through the step's micro-batches), else 0 each
    (Plan.fsdp_reshard backward, step; module doc)."""
    alone = c.zero3 * (1 - active(S.pp))
    mode = c.fam.fsdp_reshard
    return (alone if mode == "backward" else ZERO, alone if mode == "step" else ZERO)


def micro_batch_gathers(c: Context) -> sp.Expr:
    """Gathers of each ZeRO 3 unit per micro-batch: 2, for its forward and again for its
    backward; 1 kept from forward to backward; none under a pipeline or kept through the step
    (gathered once: unit_syncs)."""
    backward, step = kept(c)
    return FSDP_GATHERS_PER_MICRO_BATCH * (1 - stage_resident(c) - step) - backward


def fp8_weight_casts(c: Context) -> sp.Expr:
    """How often a step makes its weights' FP8 copies (perfmodel.step.fp8.weight_cast_phase):
    once (Transformer Engine caches them from the first micro-batch; with FP8 weights the
    distributed optimizer's gathered weights keep their transposes), but under ZeRO 3 with FP8
    weights once per gather for the backward: Megatron FSDP drops a gathered FP8 weight's
    transpose with the weight (keep_fp8_transpose_cache off, its default: megatron_fsdp.py's
    post-backward release), so every micro-batch's backward transposes it again; under a
    pipeline every schedule's (the stage gathered once a schedule: stage_resident), kept
    gathered through the step once (kept). (Regathers of a rank's stages beyond the 3 torch
    keeps are not counted.)"""
    if not c.fam.fp8_params:
        return sp.Integer(1)
    resident, step = stage_resident(c), kept(c)[1]
    gathers = (1 - resident - step) * c.m + resident * PP.flushes(c) + step
    return 1 + c.zero3 * (gathers - 1)


def bf16_optimizer(c: Context) -> int:
    """1 where DeepSpeed's BF16_Optimizer (Plan.bf16_optimizer) all-reduces its whole fp32
    gradients (the pipeline engine's _bf16_reduce_grads) where ZeRO 1 would reduce-scatter
    them, else 0."""
    return 1 if c.fam.bf16_optimizer else 0


def deferred(c: Context) -> sp.Expr:
    """1 where ZeRO 3 without a pipeline defers its reduction to the last of several
    micro-batches (Plan.defer_grad_sync, or the units kept gathered through the step:
    Plan.fsdp_reshard step; module doc), holding the gradients unsharded until then, else 0."""
    if not (c.fam.defer_grad_sync or c.fam.fsdp_reshard == "step"):
        return ZERO
    return c.zero3 * (1 - active(S.pp)) * active(c.m)


def reductions_per_step(c: Context) -> sp.Expr:
    """FSDP's reductions of each unit per step without a pipeline: one per micro-batch, or one
    where deferred (ZeRO 1-2: one, their hooks', fsdp_hooked_units)."""
    zero3 = c.zero3 * (1 - deferred(c))
    return zero3 * c.m + 1 - zero3


def more_stages_than_kept() -> sp.Expr:
    """[v > 3]: 1 where a rank has more stages than torch keeps gathered under FSDP."""
    return lmin(1, lmax(0, S.v - MAX_GATHERED_STAGES))


def _rounds(c: Context) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """([v > 3], R, [R > 1]): whether a rank has more stages than torch keeps gathered, and the
    rounds of a pipeline schedule, R = max(1, floor(m_s / pp)) (module doc)."""
    over = more_stages_than_kept()
    rounds = lmax(1, applied(sp.floor, c.m / (PP.flushes(c) * S.pp)))
    return over, rounds, lmin(1, lmax(0, rounds - 1))


def schedule_gathers(c: Context) -> sp.Expr:
    """Gathers of a rank's stages per pipeline schedule under torch's pipelining with FSDP, U
    (module doc): v for v <= 3 stages a rank, else 2 (v - 3) R + 3 + 2 [R > 1] (1 +
    [interleaved 1F1B]), rank 0's."""
    over, rounds, more = _rounds(c)
    again = 2 * (S.v - MAX_GATHERED_STAGES) * rounds + 3 + 2 * more * (2 - c.zero_bubble)
    return over * again + (1 - over) * S.v


def first_stage_gathers(c: Context) -> sp.Expr:
    """Gathers per pipeline schedule of rank 0's first stage (the one holding the embedding, the
    root unit's), counted on torch's action lists as schedule_gathers: 1 for v <= 3, else 2 +
    [R > 1] R (interleaved zero bubble at v = 4: 2 + [R > 1])."""
    over, rounds, more = _rounds(c)
    four = c.zero_bubble * (over - lmin(1, lmax(0, S.v - MAX_GATHERED_STAGES - 1)))  # zb, v = 4
    return over * (2 + more * (rounds - four * (rounds - 1))) + 1 - over


def root_chunk(c: Context, st: str) -> tuple[sp.Expr, sp.Expr]:
    """(layers, dense layers) of the stage (virtual chunk) of st's rank that holds its root
    unit: rank 0's first (the embedding's), the last rank's last (the output layer's), a middle
    rank's any (n / v layers, no dense one). An end's layers: a pipeline layout's
    (Family.end_chunks), else the rank's over v; a mixture of experts' dense layers i among them
    where i falls in it (the first chunk's i < its layers, the last's i >= L less them;
    Family.moe_dense_layers), every layer without experts."""
    n = c.stage_layers[st]
    ends = dict(zip(("first", "middle", "last"), c.fam.end_chunks or (), strict=False))
    chunk: sp.Expr = n / S.v
    if st in ("first", "last") and st in ends and ends[st][2]:
        chunk = sp.Integer(ends[st][0] if st == "first" else ends[st][1])
    if not c.fam.moe:
        return chunk, chunk
    if st == "first":
        dense = sum((lmin(1, lmax(0, chunk - i)) for i in c.fam.moe_dense_layers), ZERO)
    elif st == "last":
        dense = sum((lmin(1, lmax(0, i + 1 - (S.L - chunk))) for i in c.fam.moe_dense_layers),
                    ZERO)
    else:
        dense = ZERO
    return chunk, dense


def _again(c: Context, units: sp.Expr, in_root_chunk: sp.Expr, root_gathers: sp.Expr
           ) -> sp.Expr:
    """Gathers again per schedule of `units` units of one kind on a rank, `in_root_chunk` of
    them in the stage that holds its root (gathered root_gathers times a schedule), the others
    over its v - 1 other stages, which share the rest of schedule_gathers (module doc)."""
    over = _rounds(c)[0]
    others = (schedule_gathers(c) - root_gathers) / lmax(1, S.v - 1)
    return times(over, times(in_root_chunk, root_gathers - 1)
                 + times(units - in_root_chunk, others - 1))


def regathers(c: Context, u: FsdpUnit, time: bool = False) -> sp.Expr:
    """Gathers of the unit kind u on a rank per step beyond each unit's first in each pipeline
    schedule: with more than 3 stages a rank, torch gathers them again within the schedule
    (module doc), else none. Rank 0's (the ledger's: its first stage, the embedding's, gathered
    first_stage_gathers times), or for the time the stage with the most units of the kind (the
    root's: the larger of rank 0's first stage's and the last rank's last stage's, which is
    gathered R times)."""
    resident = stage_resident(c) * PP.flushes(c)
    if u.name == "root":  # one a stage
        gathers = first_stage_gathers(c)
        if time:
            over, rounds, _ = _rounds(c)
            gathers = lmax(gathers, over * rounds + 1 - over)
        return resident * (gathers - 1) * (u.most if time else u.count)
    layers, dense = root_chunk(c, "first")
    in_chunk = {"layer": dense, "moe_layer": layers - dense,
                "experts": (layers - dense) * expert_sync_apart(c) if c.fam.moe else ZERO,
                "mtp": ZERO}[u.name]
    units = u.most if time else u.count
    return resident * _again(c, units, in_chunk, first_stage_gathers(c))


def unit_syncs(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """(gathers, reductions) of each ZeRO 3 unit per step beyond the micro-batches' own gathers:
    under a pipeline one each per pipeline schedule (stage_resident), else one gather where the
    units stay gathered through the step (kept, else none) and one reduction per micro-batch,
    or one where deferred (module doc)."""
    resident, schedules = stage_resident(c), PP.flushes(c)
    return resident * schedules + kept(c)[1], \
        resident * schedules + (1 - resident) * reductions_per_step(c)


def replicas(c: Context) -> sp.Expr:
    """The ranks a replica's (non-expert) gradients are reduced and sharded over: dp x cp."""
    return S.dp * S.cp




def bucket_size(c: Context) -> sp.Expr:
    """Parameters per data-parallel bucket: the plan's (N_bkt, Plan.dp_bucket_size), else (N_bkt
    0) Megatron-Core's default over the dp x cp group, max(4e7, 1e6 dp cp) (perfmodel.strategy.
    BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK; Plan.bucket_params). Megatron-Core takes
    the same size for its expert buffers."""
    default = 1 - lmin(1, S.N_bkt)
    return lmax(S.N_bkt, default * lmax(BUCKET_MIN_PARAMS,
                                         BUCKET_PARAMS_PER_RANK * replicas(c)))


def sync_buckets(c: Context, params: sp.Expr) -> sp.Expr:
    """Collectives one sync of `params` parameters a GPU issues (each of the reduction and the
    gather): with overlap_grad_sync, one per bucket, as each bucket's layers' backward has
    produced it; without, one (Megatron-Core sets no bucket size then: one bucket a buffer; the
    validation job's distributed optimizer). Buckets of bucket_size parameters over the first
    model chunk, each of the v - 1 later chunks of an interleaved pipeline one bucket
    (Megatron-Core: I_bkt 0), or over every parameter (Apex's DistributedFusedAdam, PyTorch DDP:
    I_bkt 1): ceil(P / (v B)) + v - 1, or ceil(P / B). A sync that is one bucket takes one call's
    latency; split in n it takes n (NCCL's per-call start-up and its ring's steps each time) for
    the same bytes: what grows with the ranks of the group (perfmodel.costs.collectives)."""
    size = bucket_size(c)
    chunked = applied(sp.ceiling, params / (S.v * size)) + S.v - 1
    flat = applied(sp.ceiling, params / size)
    count = lmax(1, S.I_bkt * flat + (1 - S.I_bkt) * chunked)
    return c.overlap_grad_sync * count + (1 - c.overlap_grad_sync)


def last_bucket_share(c: Context, params: sp.Expr, layers: sp.Expr) -> sp.Expr:
    """The share of a stage's sync that cannot hide behind the compute it overlaps: one layer's
    (NeMo: "exposes only one DP communication chunk"), or one bucket's where a bucket holds more
    than a layer's parameters (Megatron-Core's default at a large dp: its last bucket is reduced
    after the backward that fills it)."""
    return lmax(1 / layers, lmin(1, bucket_size(c) / lmax(1, params)))


def expert_replicas(c: Context) -> sp.Expr:
    """The ranks holding the same routed expert shards: tp dp cp / (ep etp) (the axis edp)."""
    return S.tp * S.dp * S.cp / (S.ep * S.etp)


def expert_sync_apart(c: Context) -> sp.Expr:
    """1 where the experts' gradients sync apart from the others' (ep > 1 or tp / etp > 1: the
    expert-data-parallel group is then not the dp x cp group)."""
    return sp.Max(active(S.ep), active(S.tp / S.etp), evaluate=False)


@dataclass(frozen=True)
class FsdpUnit:
    """One kind of FSDP unit of a stage under ZeRO 3: gathered for each micro-batch's forward and
    backward, its gradients reduce-scattered in each micro-batch's backward (under a pipeline
    gathered and reduce-scattered once per pipeline schedule: stage_resident), over `axis`
    (dp_cp; a mixture of experts' routed experts over edp where they sync apart)."""

    name: str  # layer, moe_layer, experts, mtp, root
    axis: str
    ranks: sp.Expr  # the group's ranks: dp x cp, or edp's
    on: dict[str, sp.Expr]  # units of this kind on each stage (first, middle, last)
    elements: sp.Expr  # one unit's elements on one GPU, padded as FSDP2 pads them
    # where rank 0's unit differs (the root: the first stage's, where `elements` is the larger
    # stage's): the ledger's bytes, rank 0's
    first_elements: sp.Expr | None = None
    # an fp8_params plan's FP8 weights among them (gathered at g_8 bytes, not wbytes), and rank
    # 0's where its unit differs
    fp8: sp.Expr = sp.Integer(0)
    first_fp8: sp.Expr | None = None

    @property
    def ledger_elements(self) -> sp.Expr:
        """One unit's elements on rank 0 (the ledger's bytes)."""
        return self.elements if self.first_elements is None else self.first_elements

    def gathered_bytes(self, ledger: bool = False) -> sp.Expr:
        """The bytes one all-gather of the unit moves to a GPU: wbytes an element, g_8 an FP8
        weight (fp8_params: Megatron FSDP's --fp8-param-gather gathers them in FP8); rank 0's
        unit with `ledger`."""
        elements = self.ledger_elements if ledger else self.elements
        fp8 = self.first_fp8 if ledger and self.first_fp8 is not None else self.fp8
        return S.wbytes * elements - (S.wbytes - S.g8) * fp8

    @property
    def count(self) -> sp.Expr:
        """Units on rank 0's stage (the first): the ledger's calls."""
        return self.on["first"]

    @property
    def most(self) -> sp.Expr:
        """Units on the stage that holds the most of them: the time's."""
        return lmax(*self.on.values())


def _layer_tensors(c: Context, mlp: sp.Expr | None) -> list[tuple[sp.Expr, sp.Expr]]:
    """(rows, columns) of a layer's parameters on one GPU: its attention (standard, or MLA's),
    norms and a dense MLP `mlp` wide (None: none, an MoE layer's routed part apart)."""
    h, tp = S.h, S.tp
    if not c.fam.mla:
        return M.layer_tensors(h, S.a, S.kv, mlp, tp, d=c.d, gated=c.gated, bias=c.bias,
                               qkv_bias=c.qkv_bias, layernorm=c.layernorm,
                               sinks=int(c.fam.attention_sinks))
    out = MLA.mla_tensors(h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v, tp,
                          q_lora=c.fam.mla_q_lora, bias=c.bias) + M.norm_tensors(h, c.layernorm)
    if mlp is not None:
        out += M.mlp_tensors(h, mlp, tp, gated=c.gated, bias=c.bias)
    return out


def fsdp_units(c: Context) -> tuple[FsdpUnit, ...]:
    """The units of a stage under ZeRO 3: its layers, and one root unit (the first stage's
    embedding and positions, and, with one stage or zbv's V (Context.head_first), the final norm
    and an untied output layer; a last stage alone holds the final norm and the output layer). A
    mixture of experts (torchtitan's and NeMo AutoModel's FSDP2 with expert parallelism: the
    routed experts a unit of their own, sharded over the expert-data-parallel group): its dense
    layers; its MoE layers' attention, norms, router and shared experts; their routed experts
    (E / ep each, over edp where they sync apart, else in the MoE layer's unit); the
    multi-token-prediction modules' projection and norms beside the output layer, their layer
    with the others. The first unit is a layer's (perfmodel.timeline)."""
    h, V, tp, dp = S.h, S.V, S.tp, replicas(c)
    dense = M.fsdp_padded(_layer_tensors(c, S.f), dp)
    # an fp8_params plan's FP8 weights in each unit (perfmodel.step.fp8): a layer's linear
    # weights, an MoE layer's attention and shared experts' (and its routed experts' where they
    # gather with it), the MTP modules' projections, the output layer's in FP8 in the root
    fp8 = c.fam.fp8_params
    lin8 = FP8.linear_weights_per_gpu(c) if fp8 else ZERO
    out8 = FP8.output_weights_per_gpu(c) if fp8 else ZERO
    root_first8 = (c.single + c.head_first) * (1 - c.tied) * out8
    # (the final norm and the output layer on the first stage only where it holds the head)
    root_first = M.fsdp_padded(M.root_tensors(
        h, V, S.s, tp, learned_positions=c.learned_positions, layernorm=c.layernorm,
        output=(c.single + c.head_first) * (1 - c.tied), final_norm=c.single + c.head_first), dp)
    last = [*M.final_norm_tensors(h, c.layernorm), (V / tp, h)]
    if c.fam.mtp:  # the modules' copy of the embedding where it is not (several stages)
        last.append((c.multi * V / tp, h))
    root_last = M.fsdp_padded(last, dp)
    root = c.single * root_first + c.multi * sp.Max(root_first, root_last, evaluate=False)
    one = {st: sp.Integer(1) for st in c.stage_layers}
    root_unit = FsdpUnit("root", "dp_cp", dp, one, root, root_first,
                         fp8=c.single * root_first8 + c.multi * out8, first_fp8=root_first8)
    if not c.fam.moe and not c.fam.mtp:  # (every stage counted as the one with the most)
        layers = {st: c.max_stage_layers for st in c.stage_layers}
        return (FsdpUnit("layer", "dp_cp", dp, layers, dense, fp8=lin8), root_unit)
    from perfmodel.step.moe import moe_layers
    from perfmodel.step.pipeline import holds

    moe = moe_layers(c) if c.fam.moe else {st: ZERO for st in c.stage_layers}
    mtp = {st: S.D_mtp * holds(c, st)[1] if c.fam.mtp else ZERO for st in c.stage_layers}
    mtp_moe = c.fam.mtp_last_moe
    dense_n = {st: n - moe[st] + (0 if mtp_moe else mtp[st]) for st, n in c.stage_layers.items()}
    moe_n = {st: moe[st] + (mtp[st] if mtp_moe else 0) for st in c.stage_layers}
    units = [FsdpUnit("layer", "dp_cp", dp, dense_n, dense, fp8=lin8)]
    if c.fam.moe:
        apart = expert_sync_apart(c)
        router = [(S.E, h), (c.bias * S.E, 1)]  # whole on every tp rank
        shared = M.mlp_tensors(h, S.f_sh, tp, gated=c.gated, bias=c.bias) \
            if c.fam.moe_shared else []
        # one routed expert's up (and gate) and down projections on a rank, each its own
        # tensor (the validation job's; FSDP2 pads each)
        expert = M.mlp_tensors(h, S.f_E, S.etp, gated=c.gated, bias=c.bias)
        experts = S.E / S.ep * M.fsdp_padded(expert, expert_replicas(c))
        moe_layer = M.fsdp_padded(_layer_tensors(c, None) + router + shared, dp)
        rest8, experts8 = FP8.moe_weights_per_gpu(c) if fp8 else (ZERO, ZERO)
        units.append(FsdpUnit("moe_layer", "dp_cp", dp, moe_n,
                              moe_layer + times(1 - apart, experts),
                              fp8=rest8 + times(1 - apart, experts8)))
        units.append(FsdpUnit("experts", "edp", expert_replicas(c),
                              {st: apart * n for st, n in moe_n.items()}, experts, fp8=experts8))
    if c.fam.mtp:  # each module's projection (2h -> h, split as a column-parallel layer) and
        # its two norms
        module = M.fsdp_padded([(M.MTP_PROJECTION * h / tp, h),
                                *M.final_norm_tensors(h, c.layernorm) * 2], dp)
        units.append(FsdpUnit("mtp", "dp_cp", dp, mtp, module,
                              fp8=M.MTP_PROJECTION * h * h / tp if fp8 else ZERO))
    units.append(root_unit)
    return tuple(units)


def fsdp_unit_count(units: tuple[FsdpUnit, ...]) -> sp.Expr:
    """The units of the stage with the most (each kind's largest count)."""
    return sum((u.most for u in units), ZERO)


def sync_collectives(c: Context, params: Parameters,
                     units: tuple[FsdpUnit, ...]) -> list[Collective]:
    """The gradient sync of one step: the stage's gradients (gbytes each) and weights (wbytes;
    an fp8 plan's FP8 weights, fp8_params, at e_8), over dp x cp; a mixture of experts' routed
    experts over edp where they sync apart."""
    # 1 where the routed experts sync apart over edp (none without experts)
    apart = expert_sync_apart(c) if c.fam.moe else sp.Integer(0)
    stage8 = stage_weight_bytes(c, params) if c.fam.fp8_params else None  # (dense, experts)
    synced = params.per_gpu  # the largest stage's parameters in the dp x cp sync
    grad_bytes, weight_bytes = S.gbytes * synced, gathered_weight_bytes(c, params)
    if c.fam.moe:  # the experts with the others where they do not sync apart
        synced = params.dense_per_gpu + (1 - apart) * params.experts_per_gpu
        grad_bytes, weight_bytes = S.gbytes * synced, S.wbytes * synced
        if stage8 is not None:  # each part's FP8 weights at e_8
            weight_bytes = lmax(*stage8[0].values()) + (1 - apart) * lmax(*stage8[1].values())
    z1, z3 = c.zero1, c.zero3

    # the ledger's bytes rank 0's (the first stage's parameters), the time the largest stage's
    # (every stage syncs at once), as the experts' below; each sync one collective per bucket
    # (sync_buckets), the bytes split among them
    first = params.per_stage["first"] - apart * params.experts["first"]
    buckets = (sync_buckets(c, first), sync_buckets(c, synced))

    def dp(name: str, op: str, nbytes: sp.Expr, calls: sp.Expr, phase: str = "step",
           axis: str = "dp_cp", time_nbytes: sp.Expr | None = None) -> Collective:
        split, most = buckets
        return Collective(name=name, op=op, axis=axis, nbytes=nbytes / split,
                          time_nbytes=(nbytes if time_nbytes is None else time_nbytes) / most,
                          calls=times(calls, split), transfers=times(calls, most),
                          phase=phase, in_phase=SYNC, term="comm/dp", fam=c.fam)

    # the distributed optimizer's buffers padded to whole shards (padded); an FP8 gather
    # (fp8_params) mixes buffers of two dtypes and is counted unpadded, the largest stage's
    pad = padded(replicas(c))
    if stage8 is not None:
        dp_gathered = (stage8[0]["first"] + (1 - apart) * stage8[1]["first"], weight_bytes)
    else:
        dp_gathered = (pad(S.wbytes * first, S.wbytes), pad(weight_bytes, S.wbytes))
    # DeepSpeed's BF16_Optimizer all-reduces its whole fp32 gradients (the pipeline engine's
    # _bf16_reduce_grads, buffered_allreduce_fallback), then gathers the updated shards
    allreduced = bf16_optimizer(c)
    out = [dp("dp/all_reduce", "all_reduce", S.gbytes * first, 1 - z1 + allreduced * z1,
              time_nbytes=grad_bytes),
           dp("dp/reduce_scatter", "reduce_scatter", pad(S.gbytes * first, S.gbytes),
              (z1 - z3) * (1 - allreduced), time_nbytes=pad(grad_bytes, S.gbytes)),
           dp("dp/all_gather", "all_gather", dp_gathered[0], z1 - z3,
              time_nbytes=dp_gathered[1])]
    if c.fam.moe:  # the ledger's bytes rank 0's (the first stage's experts), the time the larger
        # stage's (every stage syncs at once); with fp8_params the weights gathered in FP8
        e_first, e_most = params.experts["first"], params.experts_per_gpu
        # 1 where the stage holds routed experts (a parameter count, 0 or at least 1): a stage
        # of dense layers only issues no edp sync (Megatron-LM's expert buffers are empty there,
        # as the validation job's); the ledger's calls rank 0's, the time's the stage's with the
        # most
        held_first, held_most = lmin(1, e_first), lmin(1, e_most)
        pad_e = padded(expert_replicas(c))
        split, most = sync_buckets(c, e_first), sync_buckets(c, e_most)
        if stage8 is not None:
            gather_first, gather_most = stage8[1]["first"], lmax(*stage8[1].values())
        else:
            gather_first = pad_e(S.wbytes * e_first, S.wbytes)
            gather_most = pad_e(S.wbytes * e_most, S.wbytes)
        for name, op, nbytes, time_nbytes, calls in (
                ("edp/all_reduce", "all_reduce", S.gbytes * e_first, S.gbytes * e_most,
                 apart * (1 - z1 + allreduced * z1)),
                ("edp/reduce_scatter", "reduce_scatter", pad_e(S.gbytes * e_first, S.gbytes),
                 pad_e(S.gbytes * e_most, S.gbytes), apart * (z1 - z3) * (1 - allreduced)),
                ("edp/all_gather", "all_gather", gather_first, gather_most,
                 apart * (z1 - z3))):
            out.append(Collective(name=name, op=op, axis="edp", nbytes=nbytes / split,
                                  time_nbytes=time_nbytes / most,
                                  calls=times(held_first, calls) * split,
                                  transfers=times(held_most, calls) * most,
                                  phase="step", in_phase=SYNC, term="comm/dp", fam=c.fam))
    gathered, reduced = unit_syncs(c)
    for u in units:  # the ledger's calls rank 0's, the time the stage's with the most
        prefix = "edp" if u.axis == "edp" else "dp"
        # (under a pipeline each unit gathered and reduced once per pipeline schedule:
        # stage_resident; gathered again with more than 3 stages a rank: regathers)
        gather = (u.gathered_bytes(ledger=True), u.gathered_bytes())
        grads = (S.gbytes * u.ledger_elements, S.gbytes * u.elements)
        for op, name, (nbytes, time_nbytes), per_micro_batch, phase in (
                ("all_gather", "all_gather", gather, micro_batch_gathers(c), "fwd+bwd"),
                ("all_gather", "all_gather_once", gather, gathered, "step"),
                ("reduce_scatter", "reduce_scatter", grads, reduced, "step")):
            out.append(Collective(
                name=f"{prefix}/fsdp_{u.name}/{name}", op=op, axis=u.axis,
                nbytes=nbytes, time_nbytes=time_nbytes,
                calls=z3 * per_micro_batch * u.count,
                transfers=None if u.most == u.count else z3 * per_micro_batch * u.most,
                phase=phase, in_phase=SYNC, term="comm/dp", fam=c.fam))
        # gathered again with more than 3 stages a rank (regathers: its calls rank 0's, its
        # time the stage's with the most)
        out.append(Collective(
            name=f"{prefix}/fsdp_{u.name}/all_gather_again", op="all_gather", axis=u.axis,
            nbytes=gather[0], time_nbytes=gather[1],
            calls=z3 * regathers(c, u), transfers=z3 * regathers(c, u, time=True),
            phase="step", in_phase=SYNC, term="comm/dp", fam=c.fam))
    return out


def padded(ranks: sp.Expr) -> Callable[[sp.Expr, sp.Expr], sp.Expr]:
    """pad(nbytes, per_element): a distributed-optimizer buffer of nbytes (elements of
    per_element bytes) padded to a whole number of elements per rank, ceil(n / ranks) ranks
    elements. Megatron-LM pads each bucket's end so that its shards are equal (megatron/core/
    distributed/param_and_grad_buffer.py, _pad_end_of_bucket_if_needed: to lcm(dp, 128)
    elements); the validation job (workload.distopt), which the ledger is checked against, to
    the group's ranks."""
    def pad(nbytes: sp.Expr, per_element: sp.Expr) -> sp.Expr:
        # unevaluated: sympy would search the parameter count for whole terms (0.13 s of a cold
        # build) and find none; numpy takes the ceiling all the same
        return sp.ceiling(nbytes / (per_element * ranks), evaluate=False) * ranks * per_element
    return pad


def gathered_weight_bytes(c: Context, params: Parameters) -> sp.Expr:
    """The bytes of the weights the distributed optimizer all-gathers (ZeRO 1-2): wbytes each, or
    for an fp8 plan with FP8 weights (fp8_params) e_8 for its FP8 weights (Megatron-LM
    --fp8-param-gather: "perform the param all-gather in fp8"), of the stage with the most (as
    params.per_gpu; a mixture of experts' routed experts with them)."""
    if not c.fam.fp8_params:
        return S.wbytes * params.per_gpu
    dense, experts = stage_weight_bytes(c, params)
    return lmax(*(dense[st] + experts[st] for st in dense))


def stage_weight_bytes(c: Context, params: Parameters) -> tuple[dict[str, sp.Expr],
                                                                 dict[str, sp.Expr]]:
    """An fp8_params plan's weights on one GPU of each stage as the distributed optimizer
    all-gathers them [B]: (all but the routed experts', the routed experts'), wbytes per
    parameter but g_8 per FP8 weight (1; MXFP8 2, perfmodel.costs.fp8.Fp8Bytes.gather;
    perfmodel.step.fp8.stage_fp8_weights; the output layer's at wbytes)."""
    dense, experts = {}, {}
    for st, total in params.per_stage.items():
        dense8, experts8 = FP8.stage_fp8_weights(c, st, sp.Integer(0))
        dense[st] = S.wbytes * (total - params.experts[st]) - (S.wbytes - S.g8) * dense8
        experts[st] = S.wbytes * params.experts[st] - (S.wbytes - S.g8) * experts8
    return dense, experts


def fsdp_copy_passes(c: Context, ranks: sp.Expr | None = None) -> sp.Expr:
    """FSDP2's copies of a unit sharded over `ranks` (default dp x cp): a read and a write of
    (1 + 1/ranks) of it (the shard and the gathered unit), each way."""
    return 2 * (1 + 1 / (replicas(c) if ranks is None else ranks))


def sync_phase(c: Context, params: Parameters, units: tuple[FsdpUnit, ...],
               issued: Mapping[str, tuple[Collective, ...]], backward_s: sp.Expr,
               forward_s: sp.Expr) -> Phase:
    """The step's gradient sync and parameter gathers: its collectives (with what hides them, see
    the module doc: backward_s, one micro-batch's backward on the last stage; forward_s, one
    micro-batch's forward on the first), its memory passes and FSDP's reduction hooks
    (comm/dp_framework)."""
    grad_bytes, weight_bytes = S.gbytes * params.per_gpu, gathered_weight_bytes(c, params)
    z1, z3, m, copies = c.zero1, c.zero3, c.m, fsdp_copy_passes(c)
    resident, schedules, (gathered, reduced) = stage_resident(c), PP.flushes(c), unit_syncs(c)
    kept_back = kept(c)[0]
    reducing = reductions_per_step(c)  # micro-batches whose backward reduces (ZeRO 3, pp 1)
    # (the copies of the experts' sync, over their replicas, as the others')
    # FSDP2's accumulation of the unsharded gradients where it does not reduce every
    # micro-batch (under a pipeline, or deferred): each schedule's first backward casts them to
    # its fp32 reduce dtype (e + 4 bytes an element), every later one adds into them (e + 8);
    # torch 2.13 _fsdp_param.py to_accumulated_grad_if_needed, accumulate_unsharded_grad_if_needed
    cast, add = S.e + FP32_GRAD, S.e + 2 * FP32_GRAD
    accumulated = resident * (schedules * cast + (m - schedules) * add) \
        + deferred(c) * (cast + (m - 1) * add)
    # (DeepSpeed's BF16_Optimizer all-reduces its fp32 gradients as DDP does, and gathers the
    # updated shards in place)
    allreduced = bf16_optimizer(c)
    copy_bytes = (1 - z1 + allreduced * z1) * DDP_GRADIENT_PASSES * grad_bytes \
        + (z1 - z3) * (1 - allreduced) * copies * (grad_bytes + weight_bytes) \
        + times(z3, sum((u.most
                         * (fsdp_copy_passes(c, u.ranks)
                            * ((micro_batch_gathers(c) * m + gathered) * u.gathered_bytes()
                               + reduced * S.gbytes * u.elements)
                            + active(u.ranks) * accumulated * u.elements)
                         + u.gathered_bytes() * fsdp_copy_passes(c, u.ranks)
                         * regathers(c, u, time=True)
                         for u in units), ZERO))
    layers = c.max_stage_layers
    n_units = fsdp_unit_count(units)
    # (a mixture of experts' own sync over edp with the others', behind the same compute)
    grads = ("dp/all_reduce", "dp/reduce_scatter") \
        + (("edp/all_reduce", "edp/reduce_scatter") if c.fam.moe else ())
    fsdp = [f"{'edp' if u.axis == 'edp' else 'dp'}/fsdp_{u.name}" for u in units]
    fsdp_grads = tuple(f"{name}/reduce_scatter" for name in fsdp)
    param_gathers = ("dp/all_gather",) + (("edp/all_gather",) if c.fam.moe else ())
    # (the gathers of each micro-batch without a pipeline; with one, the stages gathered again,
    # issued ahead of the compute that needs them: regathers)
    gathers = tuple(f"{name}/{op}" for name in fsdp for op in ("all_gather", "all_gather_again"))
    gathered_once = tuple(f"{name}/all_gather_once" for name in fsdp)
    last = last_bucket_share(c, params.per_gpu, layers)  # a layer's, or a bucket's
    # FSDP's reductions and its gathers share the backwards (one network for both): together
    # they hide behind no more than the compute their windows span, the forwards and the
    # backwards that either takes (compose's pool)
    gather_backwards = m * (1 - kept_back)
    spanned = m * forward_s + lmax(reducing, gather_backwards) * backward_s
    overlaps = (
        Overlap("the last micro-batch's backward", backward_s, c.overlap_grad_sync,
                floor=last, of=grads),
        # every micro-batch's reductions behind the backwards (deferred: the last one's);
        # under a pipeline FSDP reduces after the stage's last backward (module doc)
        Overlap("each reducing micro-batch's backward", reducing * backward_s,
                c.overlap_grad_sync * (1 - resident), floor=1 / (reducing * n_units),
                of=fsdp_grads, pool="fsdp", pool_s=spanned),
        Overlap("each pipeline schedule's first forward", schedules * forward_s,
                c.overlap_param_gather, floor=1 / n_units, of=gathered_once),
        Overlap("the next step's first forward", forward_s, c.overlap_param_gather,
                floor=last, of=param_gathers),
        # (kept from forward to backward, a unit's one gather a micro-batch is in the forward)
        Overlap("every micro-batch's forward and backward", m * (forward_s + (1 - kept_back)
                                                                 * backward_s),
                c.overlap_param_gather,
                floor=1 / ((FSDP_GATHERS_PER_MICRO_BATCH - kept_back) * n_units), of=gathers,
                pool="fsdp", pool_s=spanned))
    return Phase(name=SYNC, per_step=True, comms=issued.get(SYNC, ()),
                 device={"comm/dp_framework": active(replicas(c))
                         * K.memory_time(copy_bytes, c.dev)},
                 host={"comm/dp_framework": fsdp_hooked_units(c, layers, units) * S.t_fsdp_r
                       * reduced},  # each reduction's hooks
                 overlaps=overlaps)


def fsdp_hooked_units(c: Context, layers: sp.Expr, units: tuple[FsdpUnit, ...] = (),
                      stage: str | None = None) -> sp.Expr:
    """Units whose FSDP2 hooks run (ZeRO 1-3 with dp x cp > 1): a stage's layers and its root;
    under ZeRO 3 also the routed experts' units where they are apart (a mixture of experts:
    units, on `stage` or, None, the stage with the most)."""
    out = c.zero1 * active(replicas(c)) * (layers + 1)
    for u in units:
        if u.name == "experts":
            out += c.zero3 * active(u.ranks) * (u.most if stage is None else u.on[stage])
    return out


def fsdp_hook_phase(c: Context, stage: str, units: tuple[FsdpUnit, ...] = ()) -> Phase:
    """FSDP2's hooks of every unit in a micro-batch: measured fixed costs, forward and backward."""
    units_n = fsdp_hooked_units(c, c.stage_layers[stage], units, stage)
    return Phase(name="data_parallel/fsdp_hooks",
                 host={"compute/forward/framework": units_n * S.t_fsdp_f,
                       "compute/backward/framework": units_n * S.t_fsdp_b})
