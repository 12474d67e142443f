"""Search every plan: enumerate -> keep what the plan rules allow -> prune by a cheap bound ->
evaluate vectorised -> rank.

Plans are columns of numpy arrays. They are enumerated and evaluated in chunks of at most
CHUNK_PLANS rows, so that a search holds a bounded number of plans whatever the GPU count and
batch: each chunk passes the plan rules (perfmodel.strategy.RULES, the ones Plan.check applies),
is evaluated (the universal expression of the hardware, see perfmodel.family, compiled once), and
leaves behind only what the answer needs: the best plans, the Pareto front of step time against
memory, a uniform random sample of the evaluated plans, and what explains a failure.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfmodel import encode, strategy
from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.evaluate import family_of
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.loading import keyword_fields, plain
from perfmodel.specs.model import TransformerSpec
from perfmodel.staged import GroupValues, compile_staged, output_groups, run
from perfmodel.strategy import (
    COLUMNS,
    DEFAULT_MEMORY_MARGIN,
    GPU_HOUR_PRICE,
    TOKEN_BUDGET,
    CPComm,
    CrossEntropy,
    DpBucketing,
    Dtype,
    EPDispatcher,
    ExpertWeighting,
    Fp8Recipe,
    Kernels,
    Objective,
    OptimizerKernels,
    Placement,
    Plan,
    PlanColumns,
    Recompute,
    RecomputeMethod,
    Schedule,
    Stack,
    TpBackward,
    TPLayout,
    allowed,
    parse_option,
)

__all__ = ["COLUMNS", "Objective", "Plans", "SearchRequest", "SearchResult", "search"]

# the options' names by code (a plan column holds the code: its position in its enum)
SCHEDULES = tuple(s.value for s in strategy.SCHEDULES)
LAYOUTS = tuple(s.value for s in strategy.LAYOUTS)
RECOMPUTES = tuple(s.value for s in strategy.RECOMPUTES)
CP_COMMS = tuple(s.value for s in strategy.CP_COMMS)
PLACEMENT_NAMES = tuple(p.value for p in strategy.PLACEMENTS)
# the placements the search tries unless one is pinned: the tensor-parallel group innermost, then
# data or pipeline parallelism; or data parallelism innermost (cp right outside tp); with context
# parallelism also cp outside the data- or the pipeline-parallel ranks (across nodes)
PLACEMENTS = tuple(p.value for p in (Placement.TP_DP_PP, Placement.TP_PP_DP, Placement.DP_TP_PP))
CP_PLACEMENTS = tuple(p.value for p in (Placement.TP_DP_CP_PP, Placement.TP_PP_CP_DP))

CHUNK_PLANS = 1 << 18  # plans enumerated and evaluated at once: ~100 MB of columns and terms
# With a step-time bound (search(prune=True)): the plans of a chunk with the lowest lower bounds,
# evaluated first so that the best of them cut the rest (StepBound)
PROBE_PLANS = 2048
PRUNE_PLANS = 2 * CHUNK_PLANS  # fewer candidate plans are all evaluated: bounding costs more
PROBE_ROUNDS = 8  # probes of PROBE_PLANS while fewer than the best `top` fit
TIGHTEN_PLANS = 16384  # then batches of the plans left, each batch's best cutting the next
BOUND_SLACK = 1e-9  # relative: a lower bound and a step time of the same plan agree to rounding
SAMPLE_PLANS = 20_000  # evaluated plans kept at random (the plot's scatter, the tests' sample)
DEFAULT_TOP = 100  # best plans kept (the CLI's --top allows up to 100)


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """What to search. Pins (a value) fix an option; None leaves it free."""

    gpus: tuple[int, ...]
    global_batch: int
    dtype: Dtype = Dtype.BF16
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    cp_comm: CPComm | None = None
    micro_batch: int | None = None
    schedule: Schedule | None = None
    virtual_stages: int | None = None
    recompute: Recompute | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    # what a framework can run (recommend --emit-config): the ZeRO stages and schedules searched
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    schedules: tuple[Schedule, ...] | None = None  # None: every schedule
    recomputes: tuple[Recompute, ...] | None = None  # None: every policy
    # the ZeRO stages whose parameter gather the search overlaps where unpinned (DeepSpeed's
    # ZeRO 1-2 gather in the optimizer step: 3 only)
    param_gather_stages: tuple[int, ...] = (1, 2, 3)
    # ZeRO 0 (replicas) with dp > 1 only without tensor or pipeline parallelism (torchtitan's
    # DDP raises "DDP has not supported > 1D parallelism")
    ddp_alone: bool = False
    placement: Placement | None = None  # any order; unpinned, the search tries PLACEMENTS
    tp_layout: TPLayout | None = None
    tp_depth: int | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_cp: int | None = None
    # pipeline degrees that do not divide the layers, split unevenly (strategy.stage_split);
    # a pinned pp is split so whatever this says
    uneven_stages: bool = False
    max_micro_batch: int | None = None
    flash_attention: bool | None = None  # None: where the hardware has a flash kernel (search())
    # every plan's flash kernel by name (Plan.attention_kernel); None: the hardware's default
    attention_kernel: str | None = None
    # the overlaps: pinned, or None: searched where the plan allows them (the data-parallel ones
    # cost nothing in the model and never lose: on wherever dp > 1, the parameter gather with
    # ZeRO >= 1; tensor-parallel overlap costs SMs: both, with sequence parallelism)
    overlap_grad_sync: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    # Megatron-Core's combined 1F1B (Plan.ep_comm_overlap): None, on for every plan with ep > 1
    # where Megatron runs it (without full recompute; with pp > 1 interleaved): in the model it
    # never loses (what it hides exceeds the contention it costs); True: pinned on, only such
    # plans searched; False: off
    ep_comm_overlap: bool | None = None
    # every plan's experts' dispatcher (Plan.ep_dispatcher): the stack's, not searched
    ep_dispatcher: EPDispatcher = EPDispatcher.ALLTOALL
    # every plan's loss kernel (Plan.cross_entropy): the stack's, not searched
    cross_entropy: CrossEntropy = CrossEntropy.UNFUSED
    # every plan's AdamW kernels (Plan.optimizer_kernels): the job's, not searched
    optimizer_kernels: OptimizerKernels = OptimizerKernels.FUSED
    # every plan's experts' weighting (Plan.expert_weighting): the stack's, not searched
    expert_weighting: ExpertWeighting = ExpertWeighting.ACTIVATION
    stack: Stack = Stack.EAGER
    # every plan's element-wise kernels (Plan.kernels); None: the stack's (compiled under a
    # compiled stack, else fused)
    kernels: Kernels | None = None
    # every plan's: the recompute policy on one layer in N; bf16's gradient and optimizer dtypes
    recompute_every: int = 1
    # every plan's full recompute as Megatron-LM's --recompute-method / --recompute-num-layers
    # (a method or count beyond uniform 1: only full recompute is searched)
    recompute_method: RecomputeMethod = RecomputeMethod.UNIFORM
    recompute_num_layers: int = 1
    # every plan's activation offloading (Plan.cpu_offload_layers): with k > 0 only pp 1 and no
    # recompute are searched (Megatron-Core's rules)
    cpu_offload_layers: int = 0
    # every plan's data-parallel bucket (Plan.dp_bucket_size; None: Megatron-Core's default
    # rule); given, zero 0-2 only (the search leaves ZeRO 3 out: FSDP syncs per unit)
    dp_bucket_size: int | None = None
    dp_bucketing: DpBucketing = DpBucketing.MEGATRON
    grad_dtype: str | None = None
    optimizer_dtype: str | None = None
    master_weights: str | None = None  # remainders: zero 0-2 only (the search leaves 3 out)
    # every plan's, with dtype fp8: Transformer Engine's recipe (None: the hardware's default) and
    # the output layer in FP8
    fp8_recipe: Fp8Recipe | None = None
    fp8_output_layer: bool = False
    fp8_params: bool = False  # under MXFP8 with zero 0-2 only (the search leaves ZeRO 3 out)
    # every plan's Megatron-Core gradient accumulation fusion (Plan.grad_accumulation_fusion):
    # false, zero 0-2 only (the search leaves ZeRO 3 out: FSDP has no main gradient)
    grad_accumulation_fusion: bool = True
    # every plan's tensor-parallel backward (Plan.tp_backward; None: the kernels' stack)
    tp_backward: TpBackward | None = None
    # every plan's allocator (Plan.expandable_segments): the job's, not searched
    expandable_segments: bool = False
    memory_margin: float = DEFAULT_MEMORY_MARGIN
    objective: Objective = Objective.STEP_TIME
    tokens: float | None = None
    gpu_hour_price: float | None = None

    @property
    def megatron_full_only(self) -> bool:
        """Whether the request's full recompute takes a Megatron method beyond uniform 1, so that
        only full recompute is searched (the methods apply to it alone)."""
        return (self.recompute_method is not RecomputeMethod.UNIFORM
                or self.recompute_num_layers > 1)

    def shared_plan(self) -> Plan:
        """A one-GPU plan with the options every plan of the request shares (checked as a plan
        checks them; the encoder's fixed values and family are taken from it)."""
        return Plan(gpus=1, dtype=self.dtype, recompute_every=self.recompute_every,
                    recompute_method=self.recompute_method,
                    recompute_num_layers=self.recompute_num_layers,
                    cpu_offload_layers=self.cpu_offload_layers,
                    dp_bucket_size=self.dp_bucket_size, dp_bucketing=self.dp_bucketing,
                    attention_kernel=self.attention_kernel,
                    ep_dispatcher=self.ep_dispatcher, cross_entropy=self.cross_entropy,
                    optimizer_kernels=self.optimizer_kernels,
                    expert_weighting=self.expert_weighting,
                    recompute=self.recompute or (Recompute.NONE if self.cpu_offload_layers
                                                 else Recompute.FULL),
                    grad_dtype=self.grad_dtype,
                    optimizer_dtype=self.optimizer_dtype, master_weights=self.master_weights,
                    fp8_recipe=self.fp8_recipe,
                    fp8_output_layer=self.fp8_output_layer, fp8_params=self.fp8_params,
                    grad_accumulation_fusion=self.grad_accumulation_fusion,
                    tp_backward=self.tp_backward,
                    expandable_segments=self.expandable_segments)

    def shared(self) -> dict[str, Any]:
        """The Plan fields every plan of the request shares beyond dtype, attention and overlap
        (Plans.plan's keywords)."""
        return dict(kernels=self.kernels, recompute_every=self.recompute_every,
                    recompute_method=self.recompute_method,
                    recompute_num_layers=self.recompute_num_layers,
                    cpu_offload_layers=self.cpu_offload_layers,
                    dp_bucket_size=self.dp_bucket_size, dp_bucketing=self.dp_bucketing,
                    attention_kernel=self.attention_kernel,
                    ep_dispatcher=self.ep_dispatcher, cross_entropy=self.cross_entropy,
                    optimizer_kernels=self.optimizer_kernels,
                    expert_weighting=self.expert_weighting, grad_dtype=self.grad_dtype,
                    master_weights=self.master_weights,
                    optimizer_dtype=self.optimizer_dtype, fp8_recipe=self.fp8_recipe,
                    fp8_output_layer=self.fp8_output_layer, fp8_params=self.fp8_params,
                    grad_accumulation_fusion=self.grad_accumulation_fusion,
                    tp_backward=self.tp_backward,
                    expandable_segments=self.expandable_segments)

    def __post_init__(self) -> None:
        gpus = self.gpus
        if isinstance(gpus, (int, np.integer)) and not isinstance(gpus, bool):
            gpus = (int(gpus),)  # one count, as predict's Plan takes it
        if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Iterable) or not all(
                isinstance(g, (int, np.integer)) and not isinstance(g, bool) for g in gpus):
            raise PlanError(f"gpus must be one or more positive whole numbers (a count or a "
                            f"tuple of counts), got {self.gpus!r}")
        object.__setattr__(self, "gpus", tuple(int(g) for g in gpus))
        for each in dataclasses.fields(self):  # global_batch, the pins and limits: as Plan's
            value = getattr(self, each.name)
            if each.type in ("int", "int | None") and value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise PlanError(f"{each.name} must be a whole number, got {value!r}")
                object.__setattr__(self, each.name, int(value))
            elif each.type in ("bool", "bool | None") and value is not None \
                    and not isinstance(value, (bool, np.bool_)):
                raise PlanError(f"{each.name} must be true or false, got {value!r}")
        if not self.gpus or any(g < 1 for g in self.gpus):
            raise PlanError("gpus must be one or more positive whole numbers")
        # a count given twice (--gpus 8,8) is one count: searched once, its plans ranked once
        object.__setattr__(self, "gpus", tuple(dict.fromkeys(self.gpus)))
        if self.global_batch < 1:
            raise PlanError(f"global_batch must be >= 1, got {self.global_batch}")
        for key in ("memory_margin", "tokens", "gpu_hour_price"):  # numbers, numpy's as Python's
            value = plain(getattr(self, key))
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
                raise PlanError(f"{key} must be a number, got {value!r}")
            object.__setattr__(self, key, value)
        if not 0 <= self.memory_margin < 1:
            raise PlanError(f"memory_margin must be in [0, 1), got {self.memory_margin}")
        for key, enum in (("objective", Objective), ("dtype", Dtype), ("schedule", Schedule),
                          ("recompute", Recompute), ("placement", Placement),
                          ("tp_layout", TPLayout), ("stack", Stack), ("cp_comm", CPComm),
                          ("kernels", Kernels), ("ep_dispatcher", EPDispatcher),
                          ("cross_entropy", CrossEntropy),
                          ("optimizer_kernels", OptimizerKernels),
                          ("expert_weighting", ExpertWeighting)):
            if getattr(self, key) is not None or key == "objective":
                object.__setattr__(self, key, parse_option(enum, getattr(self, key), key))
        kernels = self.kernels or strategy.default_kernels(self.stack)
        object.__setattr__(self, "kernels", kernels)
        conflict = strategy.kernels_stack_conflict(kernels, self.stack)
        if conflict is not None:
            raise PlanError(conflict)
        if not self.zero_stages or any(z not in (0, 1, 2, 3) for z in self.zero_stages):
            raise PlanError(f"zero_stages must be some of 0, 1, 2, 3, got {self.zero_stages}")
        if self.recomputes is not None:
            object.__setattr__(self, "recomputes", tuple(
                parse_option(Recompute, r, "recomputes") for r in self.recomputes))
        if self.schedules is not None:
            object.__setattr__(self, "schedules", tuple(
                parse_option(Schedule, s, "schedules") for s in self.schedules))
        method = parse_option(RecomputeMethod, self.recompute_method, "recompute_method")
        if self.cpu_offload_layers and (method is not RecomputeMethod.UNIFORM
                                        or self.recompute_num_layers != 1
                                        or self.recompute_every != 1):
            raise PlanError(f"cpu_offload_layers {self.cpu_offload_layers} with a recompute "
                            "option (--recompute-every, --recompute-method, "
                            "--recompute-num-layers): Megatron-Core does not offload activations "
                            "beside recomputation; leave them out")
        if self.cpu_offload_layers and (self.pp or 1) > 1:
            raise PlanError(f"cpu_offload_layers {self.cpu_offload_layers} with pp {self.pp}: "
                            "Megatron-Core offloads activations without pipeline parallelism "
                            "only; give pp 1")
        # the options every plan shares, checked as a plan checks them
        shared = self.shared_plan()
        for key in ("recompute_every", "recompute_method", "recompute_num_layers",
                    "cpu_offload_layers", "dp_bucket_size", "dp_bucketing", "attention_kernel",
                    "grad_dtype",
                    "optimizer_dtype", "master_weights",
                    "fp8_recipe", "fp8_output_layer", "fp8_params", "grad_accumulation_fusion",
                    "tp_backward"):
            object.__setattr__(self, key, getattr(shared, key))
        if not self.grad_accumulation_fusion:  # the main gradients of ZeRO 0-2 only
            if self.zero == 3:
                raise PlanError("grad_accumulation_fusion false with zero 3: FSDP reduce-scatters "
                                "the backward's own gradients, no main gradient to add into "
                                "(give zero 0-2)")
            object.__setattr__(self, "zero_stages", tuple(z for z in self.zero_stages if z < 3))
        if self.master_weights == "remainders":  # beside bf16 weights that are not FSDP's
            if self.zero == 3:
                raise PlanError("master_weights remainders with zero 3: FSDP2 keeps the fp32 "
                                "shard as the parameter (give master_weights fp32, or zero 0-2)")
            object.__setattr__(self, "zero_stages", tuple(z for z in self.zero_stages if z < 3))
        if self.dp_bucket_size is not None or self.dp_bucketing is DpBucketing.ALL:
            # buckets of ZeRO 0-2's overlapped sync only
            if self.zero == 3:
                raise PlanError("dp_bucket_size and dp_bucketing with zero 3: FSDP syncs one "
                                "unit a layer, no buckets (give zero 0-2)")
            object.__setattr__(self, "zero_stages", tuple(z for z in self.zero_stages if z < 3))
        for key, option, (low, high) in (("tokens", "--tokens", TOKEN_BUDGET),
                                         ("gpu_hour_price", "--gpu-hour-price", GPU_HOUR_PRICE)):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not low <= value <= high):
                raise PlanError(f"{key} ({option}) must be between {low:g} and {high:g}, the "
                                "range in which a plan's time to train and cost are finite and "
                                f"nonzero, got {value!r}")
        if self.objective is Objective.TIME_TO_TRAIN and not self.tokens:
            raise PlanError("objective time_to_train needs --tokens (the token budget)")
        if self.objective is Objective.COST and not self.gpu_hour_price:
            raise PlanError("objective cost needs --gpu-hour-price")



# an unknown field, a missing one or a positional argument: a PlanError naming it, as Plan's
keyword_fields(SearchRequest, PlanError, "search request")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def idle_options(cols: dict[str, np.ndarray], experts: bool) -> dict[str, np.ndarray]:
    """Which plans (columns of them) have no use for an option every plan of a search shares
    (perfmodel.idle's rules, where predict refuses it as changing nothing): `tp_backward`
    without 1D tensor parallelism, `ep_dispatcher` without expert parallelism, `overlap` (of
    the gradient sync and the parameter gather) without a data-parallel sync (strategy.
    sync_ranks 1), `dp_bucketing` (and the bucket size) without an overlapped sync.
    experts: the model is a mixture of experts (its experts' sync over tp dp cp / (ep etp))."""
    ranks = cols["dp"] * cols["cp"]
    if experts:
        ranks = np.maximum(ranks, cols["tp"] * ranks // (cols["ep"] * cols["etp"]))
    one_d = np.asarray([lay.value == "1d" for lay in strategy.LAYOUTS])[cols["tp_layout"]]
    no_sync = ranks == 1
    return {"tp_backward": ~((cols["tp"] > 1) & one_d), "ep_dispatcher": cols["ep"] == 1,
            "overlap": no_sync, "dp_bucketing": no_sync | ~cols["overlap_grad_sync"].astype(bool)}


@dataclass
class Plans:
    """Columns of plans (numpy arrays of equal length; options as codes, see COLUMNS)."""

    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def take(self, index: np.ndarray | slice) -> Plans:
        return Plans({k: v[index] for k, v in self.cols.items()})

    @staticmethod
    def concat(parts: list[Plans]) -> Plans:
        if len(parts) == 1:
            return parts[0]
        return Plans({k: np.concatenate([p.cols[k] for p in parts]) for k in COLUMNS})

    @staticmethod
    def empty() -> Plans:
        return Plans({k: np.zeros(0, dtype=np.int64) for k in COLUMNS})

    def plan(self, i: int, dtype: Dtype, flash: bool | None, stack: Stack = Stack.EAGER,
             experts: bool = False, **shared: Any) -> Plan:
        """Row i as a Plan; shared: the request's options every plan has (recompute_every,
        grad_dtype, optimizer_dtype), less those the row has no use for (idle_options: a
        tensor-parallel backward without 1D tensor parallelism, an experts' dispatcher without
        expert parallelism, overlaps and buckets of a sync the plan has not; the same step
        either way: predict refuses them as flags that change nothing, perfmodel.idle).
        experts: the model is a mixture of experts."""
        c = self.cols
        one = {k: v[i:i + 1] for k, v in c.items()}
        idle = {k: bool(v[0]) for k, v in idle_options(one, experts).items()}
        if idle["tp_backward"]:
            shared = {**shared, "tp_backward": None}
        if idle["ep_dispatcher"] and "ep_dispatcher" in shared:
            shared = {**shared, "ep_dispatcher": EPDispatcher.ALLTOALL}
        if idle["dp_bucketing"] and "dp_bucketing" in shared:
            shared = {**shared, "dp_bucket_size": None, "dp_bucketing": DpBucketing.MEGATRON}
        return Plan(gpus=int(c["gpus"][i]), dp=int(c["dp"][i]), tp=int(c["tp"][i]),
                    pp=int(c["pp"][i]), cp=int(c["cp"][i]), ep=int(c["ep"][i]),
                    etp=int(c["etp"][i]),
                    cp_comm=strategy.CP_COMMS[int(c["cp_comm"][i])],
                    micro_batch=int(c["micro_batch"][i]),
                    global_batch=int(c["global_batch"][i]),
                    schedule=strategy.SCHEDULES[int(c["schedule"][i])],
                    virtual_stages=int(c["virtual_stages"][i]),
                    sequence_parallel=bool(c["sequence_parallel"][i]),
                    recompute=strategy.RECOMPUTES[int(c["recompute"][i])], zero=int(c["zero"][i]),
                    dtype=dtype, flash_attention=flash, stack=stack,
                    overlap_grad_sync=bool(c["overlap_grad_sync"][i]) and not idle["overlap"],
                    overlap_param_gather=bool(c["overlap_param_gather"][i])
                    and not idle["overlap"],
                    tp_comm_overlap=bool(c["tp_comm_overlap"][i]),
                    # as it runs, where it pairs any chunks (the same time either way)
                    ep_comm_overlap=bool(c["ep_comm_overlap"][i]) and strategy.ep_overlap_runs(
                        strategy.RECOMPUTES[int(c["recompute"][i])],
                        strategy.SCHEDULES[int(c["schedule"][i])], int(c["pp"][i]))
                    and strategy.ep_overlap_pairs(
                        int(c["pp"][i]), int(c["virtual_stages"][i]),
                        strategy.SCHEDULES[int(c["schedule"][i])] is Schedule.INTERLEAVED,
                        int(c["global_batch"][i]) // (int(c["micro_batch"][i])
                                                      * int(c["dp"][i]))),
                    first_stage_layers=int(c["first_stage_layers"][i]),
                    last_stage_layers=int(c["last_stage_layers"][i]),
                    placement=strategy.PLACEMENTS[int(c["placement"][i])].axes,
                    tp_layout=strategy.LAYOUTS[int(c["tp_layout"][i])],
                    tp_depth=int(c["tp_depth"][i]), **shared)


# --- enumeration ----------------------------------------------------------------------------
# The candidates of each option are pre-filtered by the plan rules that read only the columns
# known at that point (strategy.allowed with partial=True), and by necessary conditions of the
# others (pp divides the layers unless split unevenly, dp the batch, the grid's rows the
# micro-batch); the mask of every rule over whole plans comes last (_blocks). Beyond the rules,
# the search leaves out plans
# that repeat another: gpipe with pp = 1 (the schedules coincide: 1f1b is kept), ZeRO with dp = 1,
# placements that differ only in an axis of degree 1, and grids of side 1.


class _Candidates:
    """The allowed values of the options that depend on one or two degrees, worked out once per
    search (memoised by degree)."""

    def __init__(self, model: TransformerSpec, req: SearchRequest) -> None:
        self.model, self.req = model, req
        self._layouts: dict[int, list[tuple[int, int, int]]] = {}
        self._schedules: dict[int, list[tuple[int, int]]] = {}
        self._sps: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def layouts(self, tp: int) -> list[tuple[int, int, int]]:
        """(layout code, depth, ranks a micro-batch's samples are split over) allowed with tp."""
        if tp not in self._layouts:
            req = self.req
            rows = [(code, depth) for code, layout in enumerate(LAYOUTS)
                    for depth in ([d for d in divisors(tp) if d >= 2] if layout == "2.5d" else [1])
                    if req.tp_layout in (None, layout) and req.tp_depth in (None, depth)]
            out = []
            if rows:
                codes, depths = (np.array(x) for x in zip(*rows, strict=True))
                c = PlanColumns({"tp": np.full(len(rows), tp), "tp_layout": codes,
                                 "tp_depth": depths})
                keep = allowed(c, self.model, partial=True) & ((codes == 0) | (c.grid_q > 1))
                rows_of = c.grid_rows
                out = [(int(a), int(b), int(r))
                       for a, b, r in zip(codes[keep], depths[keep], rows_of[keep], strict=True)]
            self._layouts[tp] = out
        return self._layouts[tp]

    def schedules(self, pp: int) -> list[tuple[int, int]]:
        """(schedule code, virtual stages) allowed with pp (the rules on the number of
        micro-batches come with the micro-batch)."""
        if pp not in self._schedules:
            req = self.req
            rows = []
            for code, name in enumerate(strategy.SCHEDULES):
                if req.schedule not in (None, name) or name is Schedule.GPIPE and pp == 1 \
                        or req.schedules is not None and name not in req.schedules:
                    continue
                stages = (divisors(chunk_layers(self.model.layers, pp))
                          if name in (Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE)
                          else [2] if name is Schedule.ZBV else [1])
                rows += [(code, v) for v in stages if req.virtual_stages in (None, v)]
            out = []
            if rows:
                code_col, stage_col = (np.array(x) for x in zip(*rows, strict=True))
                c = PlanColumns({"pp": np.full(len(rows), pp), "schedule": code_col,
                                 "virtual_stages": stage_col})
                keep = allowed(c, self.model, partial=True)
                out = [(int(a), int(b))
                       for a, b in zip(code_col[keep], stage_col[keep], strict=True)]
            self._schedules[pp] = out
        return self._schedules[pp]

    def sequence_parallel(self, tp: int, layout: int) -> list[tuple[int, int]]:
        """(sequence parallelism, tensor-parallel overlap) allowed with tp and the layout."""
        key = (tp, layout)
        if key not in self._sps:
            rows = [(s, o) for s in (0, 1) for o in (0, 1)
                    if self.req.sequence_parallel in (None, bool(s))
                    and self.req.tp_comm_overlap in (None, bool(o))]
            out = []
            if rows:
                sps, overlaps = (np.array(x, dtype=np.int64) for x in zip(*rows, strict=True))
                n = len(rows)
                c = PlanColumns({"tp": np.full(n, tp), "tp_layout": np.full(n, layout),
                                 "sequence_parallel": sps, "tp_comm_overlap": overlaps})
                keep = allowed(c, self.model, partial=True)
                out = [(int(a), int(b)) for a, b in zip(sps[keep], overlaps[keep], strict=True)]
            self._sps[key] = out
        return self._sps[key]

    def data_parallel(self, dp: int) -> list[tuple[int, int, int]]:
        """(ZeRO stage, gradient sync overlapped, parameter gather overlapped) with dp replicas
        (dp x cp: the ranks that sync): the overlaps on where the plan has them unless pinned
        (they never lose in the model), ZeRO only with dp > 1 (else it repeats ZeRO 0)."""
        req = self.req
        zeros = [z for z in ((0, 1, 2, 3) if dp > 1 else (0,))
                 if req.zero in (None, z) and (z in req.zero_stages or dp == 1)]
        grad = [int(req.overlap_grad_sync)] if req.overlap_grad_sync is not None else [int(dp > 1)]
        return [(z, g, int(req.overlap_param_gather) if req.overlap_param_gather is not None
                 else int(dp > 1 and z in req.param_gather_stages)) for z in zeros for g in grad]


def uneven_pp(model: TransformerSpec, req: SearchRequest, pp: int) -> bool:
    """Whether the search splits the layers unevenly over pp stages that do not divide them
    (strategy.stage_split): with --uneven-stages, or pp pinned; never where the split leaves the
    last stage no layer."""
    if req.megatron_full_only:  # Megatron's methods work on each chunk: equal stages only
        return False
    return (req.uneven_stages or req.pp == pp) and strategy.stage_split(model.layers, pp)[0] > 0


def chunk_layers(layers: int, pp: int) -> int:
    """What every stage's layers divide, so that the virtual stages divide it too: L / pp, or
    with an uneven split the greatest common divisor of the first's, the last's and (pp > 2) a
    middle stage's."""
    first, last = strategy.stage_split(layers, pp)
    if not first:
        return layers // pp
    return math.gcd(first, last, -(-layers // pp)) if pp > 2 else math.gcd(first, last)


def _context_degrees(model: TransformerSpec, req: SearchRequest, rest: int) -> list[int]:
    """The context-parallel degrees dividing `rest` GPUs: 1, and where the plans attend with a
    fused kernel (ring attention needs one), those that cut the sequence into 2 cp chunks."""
    if req.cp is not None:  # pinned, and within --max-cp as a pinned tp or pp is within theirs
        return [req.cp] if rest % req.cp == 0 and (req.max_cp is None
                                                   or req.cp <= req.max_cp) else []
    out = [1]
    if req.flash_attention:
        out += [cp for cp in divisors(rest) if cp > 1 and model.seq_len % (2 * cp) == 0
                and (req.max_cp is None or cp <= req.max_cp)]
    return out


def searches_cp(model: TransformerSpec, req: SearchRequest) -> bool:
    """Whether the request's search takes context-parallel degrees above 1 (left open, a fused
    kernel, a sequence they cut into 2 cp chunks) on some GPU count it asks for."""
    return req.cp is None and any(len(_context_degrees(model, req, g)) > 1 for g in req.gpus)


def expert_degrees(model: TransformerSpec, req: SearchRequest, dp: int, cp: int,
                   tp: int = 1, etp: int = 1) -> list[int]:
    """The expert-parallel degrees of a mixture of experts on a stage's tp x cp x dp ranks with
    expert tensor parallelism etp: those dividing the experts and tp / etp x dp x cp whose group
    is whole sub-axes of the tp ranks beyond etp's, then cp, then dp (ep and tp / etp divide one
    another; beyond tp / etp, ep / (tp / etp) and cp: the plan rule "ep etp tp cp"); 1 without
    experts."""
    if not model.experts:
        return [1] if req.ep in (None, 1) else []
    rest = tp // etp  # the tp ranks beyond one expert-tensor group

    def fits(ep: int) -> bool:
        beyond = ep // rest
        return ((rest % ep == 0 or ep % rest == 0)
                and (beyond <= 1 or cp % beyond == 0 or beyond % cp == 0))

    out = [ep for ep in divisors(rest * dp * cp) if model.experts % ep == 0 and fits(ep)]
    return [ep for ep in out if req.ep in (None, ep)]


def expert_tensor_degrees(model: TransformerSpec, req: SearchRequest, tp: int) -> list[int]:
    """The expert-tensor-parallel degrees of a mixture of experts with tp tensor ranks: those
    dividing tp and the experts' FFN width (1 without experts, and with the deepep dispatcher:
    Plan's rule)."""
    if not model.experts or req.ep_dispatcher is EPDispatcher.DEEPEP:
        return [1] if req.etp in (None, 1) else []
    width = model.expert_ffn_hidden or model.ffn_hidden
    return [etp for etp in divisors(tp) if width % etp == 0 and req.etp in (None, etp)]


def _degree_triples(model: TransformerSpec, req: SearchRequest,
                    candidates: _Candidates) -> Iterator[tuple[int, int, int, int, int]]:
    """(gpus, dp, tp, pp, cp) that multiply out, with a tensor layout, pp dividing the layers and
    dp the batch (necessary for the rules on layers / (pp v) and batch / (dp micro_batch))."""
    for gpus in req.gpus:
        for tp in divisors(gpus):
            if req.tp is not None and tp != req.tp or req.max_tp is not None and tp > req.max_tp:
                continue
            if not candidates.layouts(tp):
                continue
            for pp in divisors(gpus // tp):
                if (req.pp is not None and pp != req.pp
                        or req.max_pp is not None and pp > req.max_pp
                        or req.cpu_offload_layers and pp > 1):  # Megatron-Core's rule
                    continue
                if model.layers % pp and not uneven_pp(model, req, pp):
                    continue
                for cp in _context_degrees(model, req, gpus // (tp * pp)):
                    dp = gpus // (tp * pp * cp)
                    if req.dp is not None and dp != req.dp or req.global_batch % dp:
                        continue
                    yield gpus, dp, tp, pp, cp


@dataclass
class _Grid:
    """Plans as a grid: every combination of the axes' rows (the first axis slowest), each with
    the fixed columns."""

    fixed: dict[str, int]
    axes: tuple[dict[str, np.ndarray], ...]

    def __post_init__(self) -> None:
        self.shape = tuple(len(next(iter(a.values()))) for a in self.axes)
        # the axes whose columns some plan rule reads (strategy.RULE_COLUMNS)
        self.ruled = [i for i, a in enumerate(self.axes)
                      if strategy.RULE_COLUMNS.intersection(a)]
        self.ruled_size = math.prod(self.shape[i] for i in self.ruled)

    def ruled_plans(self) -> _Block:
        """Every combination of the ruled axes' rows, with the fixed columns (flat)."""
        shape = [self.shape[i] for i in self.ruled]
        index = np.unravel_index(np.arange(math.prod(shape)), shape)
        cols: dict[str, np.ndarray] = {}
        for i, at in zip(self.ruled, index, strict=True):
            cols.update({name: values[at] for name, values in self.axes[i].items()})
        return _Block(self.fixed, cols, math.prod(shape))

    def spread(self, mask: np.ndarray, axes: tuple[int, ...],
               onto: tuple[int, ...]) -> np.ndarray:
        """A mask over the combinations of `axes` (flat or shaped, C order) as a mask over
        those of `onto` (axes a subset of onto, both ascending), shaped."""
        shaped = mask.reshape([self.shape[i] for i in axes])
        expanded = shaped.reshape([self.shape[i] if i in axes else 1 for i in onto])
        return np.broadcast_to(expanded, [self.shape[i] for i in onto])

    def block(self, axes: tuple[int, ...], mask: np.ndarray, first: bool = False
              ) -> _Block | None:
        """The plans whose rows of `axes` (ascending) the mask over their combinations allows,
        every row of the other axes (or, with `first`, their first row only); None if none."""
        shape = [self.shape[i] if (i in axes or not first) else 1
                 for i in range(len(self.shape))]
        if mask.size and mask.all():  # every combination (a skeleton): repeated and tiled
            return self._product(shape)
        expanded = np.reshape(mask, [self.shape[i] if i in axes else 1
                                     for i in range(len(self.shape))])
        keep = np.flatnonzero(np.broadcast_to(expanded, shape))
        if not len(keep):
            return None
        index = np.unravel_index(keep, shape)
        cols: dict[str, np.ndarray] = {}
        for at, axis in zip(index, self.axes, strict=True):
            cols.update({name: values[at] for name, values in axis.items()})
        return _Block(self.fixed, cols, len(keep))

    def _product(self, shape: list[int]) -> _Block:
        """Every combination of the first shape[i] rows of each axis, in C order (the first axis
        slowest), as block() would give them: an axis's column repeated for the combinations of
        the axes after it, then tiled for those before it."""
        n = math.prod(shape)
        cols: dict[str, np.ndarray] = {}
        before, after = 1, n
        for size, axis in zip(shape, self.axes, strict=True):
            after //= size
            for name, values in axis.items():
                cols[name] = np.tile(np.repeat(values[:size], after), before)
            before *= size
        return _Block(self.fixed, cols, n)

    def plans(self, ruled_mask: np.ndarray) -> _Block | None:
        """The plans whose combination of the ruled axes' rows ruled_mask allows (flat, as
        ruled_plans orders them); None if none."""
        return self.block(tuple(self.ruled), ruled_mask)


@dataclass
class _Block:
    """Plans of one grid: the columns it fixes (one value for all of them) and the others."""

    fixed: dict[str, int]
    cols: dict[str, np.ndarray]
    n: int


def _columns(blocks: list[_Block], names: Iterable[str]) -> dict[str, np.ndarray]:
    """The blocks' plans as whole columns, block after block: a column every block fixes is its
    values repeated (one numpy call, not a filled array per block joined after), the others
    joined."""
    counts = [b.n for b in blocks]
    out = {}
    for k in names:
        if all(k in b.fixed for b in blocks):
            out[k] = np.repeat(np.array([b.fixed[k] for b in blocks]), counts)
        else:
            out[k] = np.concatenate([np.full(b.n, b.fixed[k]) if k in b.fixed else b.cols[k]
                                     for b in blocks])
    return out


def _grids(model: TransformerSpec, req: SearchRequest, size: int) -> Iterator[_Grid]:
    """The candidate plans, in grids of at most `size` plans (one degree triple and tensor
    layout, some micro-batches): every micro-batch, schedule, recompute, sp, ZeRO stage and
    placement."""
    candidates = _Candidates(model, req)
    recs = [i for i, r in enumerate(RECOMPUTES) if req.recompute in (None, r)
            and (req.recomputes is None or r in req.recomputes)
            and not (req.recompute_every > 1 and r == Recompute.NONE.value)
            and (req.megatron_full_only is False or r == Recompute.FULL.value)
            and not (req.cpu_offload_layers and r != Recompute.NONE.value)
            # combined 1F1B pinned on: only where Megatron runs it (strategy.ep_overlap_runs)
            and not (req.ep_comm_overlap and r == Recompute.FULL.value)]
    for gpus, dp, tp, pp, cp in _degree_triples(model, req, candidates):
        zeros = candidates.data_parallel(dp * cp)
        if req.ddp_alone and dp > 1 and (tp > 1 or pp > 1):
            zeros = [z for z in zeros if z[0] == 3]
        places = _placements(req, dp, tp, pp, cp)
        first, last = strategy.stage_split(model.layers, pp)
        if req.recompute_every > strategy.first_stage_holds(model.layers, pp, first, last):
            continue  # no layer of a stage would recompute (Plan.check refuses it)
        scheds = candidates.schedules(pp)
        if req.ep_comm_overlap and pp > 1:  # pinned on: interleaved only (ep_overlap_runs)
            scheds = [(code, v) for code, v in scheds
                      if strategy.SCHEDULES[code] is Schedule.INTERLEAVED]
        per_replica = req.global_batch // dp
        comms = [0] if cp == 1 else [i for i, name in enumerate(CP_COMMS)
                                     if req.cp_comm in (None, name)]
        experts = sorted((ep, etp) for etp in expert_tensor_degrees(model, req, tp)
                         for ep in expert_degrees(model, req, dp, cp, tp, etp)
                         if ep > 1 or not req.ep_comm_overlap)  # pinned on: ep > 1 only
        for layout, depth, split in candidates.layouts(tp):
            if cp > 1 and layout != 0:
                continue
            mbs = [b for b in divisors(per_replica)
                   if req.micro_batch in (None, b) and b % split == 0
                   and (req.max_micro_batch is None or b <= req.max_micro_batch)]
            sps = candidates.sequence_parallel(tp, layout)
            if not (mbs and scheds and recs and sps and zeros and places and comms and experts):
                continue
            for ep, etp in experts:
                fixed = {"gpus": gpus, "dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep,
                         "etp": etp,
                         "global_batch": req.global_batch, "tp_layout": layout,
                         "tp_depth": depth, "first_stage_layers": first,
                         "last_stage_layers": last,
                         "ep_comm_overlap": int(ep > 1 and req.ep_comm_overlap is not False)}
                per_mb = len(scheds) * len(recs) * len(sps) * len(zeros) * len(places) \
                    * len(comms)
                step = max(1, size // per_mb)
                for i in range(0, len(mbs), step):
                    yield _Grid(fixed, (
                        {"micro_batch": np.array(mbs[i:i + step])},
                        {"schedule": np.array([c for c, _ in scheds]),
                         "virtual_stages": np.array([v for _, v in scheds])},
                        {"recompute": np.array(recs)},
                        {"sequence_parallel": np.array([a for a, _ in sps]),
                         "tp_comm_overlap": np.array([b for _, b in sps])},
                        {"zero": np.array([z for z, _, _ in zeros]),
                         "overlap_grad_sync": np.array([g for _, g, _ in zeros]),
                         "overlap_param_gather": np.array([o for _, _, o in zeros])},
                        {"placement": np.array(places)}, {"cp_comm": np.array(comms)}))


RULE_BATCH = 8192  # combinations of ruled axes checked by one call of the plan rules


def _blocks(model: TransformerSpec, req: SearchRequest, size: int) -> Iterator[_Block]:
    """The plans that obey every plan rule, in blocks of at most `size` rows.

    The rules run over the grids' combinations of the axes they read (the fixed columns
    included), many grids at once; the mask is then broadcast along the axes no rule reads
    (recompute, ZeRO stage, placement): every rule on every plan, at the cost of the small
    grids."""
    for grid, ok in _ruled(_grids(model, req, size), model):
        block = grid.plans(ok)
        if block is not None:
            yield block


def _ruled(grids: Iterable[_Grid], model: TransformerSpec) -> Iterator[tuple[_Grid, np.ndarray]]:
    """Each grid with which combinations of its ruled axes obey the plan rules (flat, as
    ruled_plans orders them), the rules checked over a batch of grids at once (_rule_batches)."""
    for batch in _rule_batches(grids):
        parts = [g.ruled_plans() for _, g in batch]
        mask = allowed(PlanColumns(_columns(parts, [*parts[0].fixed, *parts[0].cols])), model)
        start = 0
        for (_, grid), part in zip(batch, parts, strict=True):
            yield grid, mask[start:start + part.n]
            start += part.n


def _rule_batches(grids: Iterable[_Grid]) -> Iterator[list[tuple[int, _Grid]]]:
    """The grids (with their positions) in batches of about RULE_BATCH ruled combinations: the
    plan rules are checked over a batch at once."""
    pending: list[tuple[int, _Grid]] = []
    rows = 0
    for i, grid in enumerate(grids):
        pending.append((i, grid))
        rows += grid.ruled_size
        if rows >= RULE_BATCH:
            yield pending
            pending, rows = [], 0
    if pending:
        yield pending


def _placements(req: SearchRequest, dp: int, tp: int, pp: int, cp: int = 1) -> list[int]:
    """The placements to search: orders that differ only in an axis of degree 1 are the same."""
    if req.placement is not None:
        return [PLACEMENT_NAMES.index(req.placement)]
    places = [PLACEMENT_NAMES.index(p) for p in PLACEMENTS + (CP_PLACEMENTS if cp > 1 else ())]
    seen, unique = set(), []
    for i in places:
        key = tuple(a for a in strategy.PLACEMENTS[i].order
                    if {"tp": tp, "dp": dp, "pp": pp, "cp": cp}[a] > 1)
        if key not in seen:
            seen.add(key)
            unique.append(i)
    return unique


def plan_chunks(model: TransformerSpec, req: SearchRequest,
                size: int | None = None) -> Iterator[Plans]:
    """Every plan of the request that the plan rules allow, in chunks of at most `size` plans
    (default CHUNK_PLANS, read when called), in a fixed order (ties in the ranking go to the
    earlier plan)."""
    size = size or CHUNK_PLANS
    return _chunked(_blocks(model, req, size), size)


def _chunked(blocks: Iterable[_Block], size: int) -> Iterator[Plans]:
    """The blocks' plans in chunks of at most `size` (a larger block alone), in order."""
    pending: list[_Block] = []
    rows = 0
    for block in blocks:
        if rows + block.n > size and pending:
            yield Plans(_columns(pending, COLUMNS))
            pending, rows = [], 0
        pending.append(block)
        rows += block.n
    if pending:
        yield Plans(_columns(pending, COLUMNS))


class _Pruner:
    """The search's branch and bound (search(prune=True)): a plan whose step time's lower bound
    (perfmodel.evaluate.BOUNDS_UNREAD) cannot rank among the best is never evaluated in full,
    and a part of a grid whose every plan is such is never enumerated.

    A grid's bound (step_time_lb_grid) reads the degrees, the micro-batch and some options (the
    schedule, recompute, sequence parallelism, the cp exchange, the placement: what
    perfmodel.staged says its terms read), not ZeRO or the overlaps: the grid's skeleton, its
    rows of the axes the bound reads with the others at their first row, gives the bound of every
    plan at a fraction of the cost of the plans. Before the search the skeleton rows of the lowest
    bounds are evaluated in full (their grids' plans, about PROBE_PLANS of them, counted again
    when the search meets them): the best of them is what the others must beat from the start.
    Each grid is then enumerated without the plans of the rows that cannot beat what the search
    has found so far (they count as skipped), and each chunk's plans are held to the tighter
    per-plan bound (step_time_lb) before the full model."""

    def __init__(self, model: TransformerSpec, req: SearchRequest, evaluator: Evaluator,
                 capacity: float, keeper: _Keeper, grids: list[_Grid],
                 count_unfit: bool = True) -> None:
        self.model, self.req, self.evaluator, self.grids = model, req, evaluator, grids
        self.count_unfit = count_unfit
        self.capacity, self.keeper = capacity, keeper
        # the probe's best plans that fit (up to `top`): objectives and plans (their columns)
        self.probe = np.zeros(0)
        self.probe_keys: list[tuple[int, ...]] = []
        self.skipped = 0  # plans that obey the rules, never enumerated (not yet counted)
        self.bound = StepBound(lambda step, gpus: objective_of(req, model, step, gpus),
                               self.reach, self.probed, self.faster)

    def probed(self, plans: Plans, rows: np.ndarray) -> np.ndarray:
        """Which of plans' `rows` are among the probe's best (reach counts them while the
        keeper does not hold them)."""
        if not self.probe_keys:
            return np.zeros(len(rows), dtype=bool)
        keys = set(self.probe_keys)
        return np.fromiter((key in keys for key in zip(
            *(plans.cols[k][rows] for k in COLUMNS), strict=True)), dtype=bool, count=len(rows))

    def reach(self, more: np.ndarray | None = None) -> float:
        """The objective a plan must reach: what the keeper's best, the probe's best that the
        keeper does not hold (the search meets the probe's plans again: a plan counted twice
        would make the top-th best look better than it is) and `more` (plans the keeper does
        not hold yet) leave."""
        if not len(self.probe):
            return self.keeper.reach(more)
        held = set(zip(*(self.keeper.best.plans.cols[k] for k in COLUMNS), strict=True)) \
            if len(self.keeper.best) else set()
        fresh = self.probe[[key not in held for key in self.probe_keys]]
        return self.keeper.reach(fresh if more is None else np.concatenate([fresh, more]))

    def faster(self, more: np.ndarray | None = None) -> float:
        """The step time a plan that does not fit must beat to be faster than the best plan at
        the end of the search: the lowest objective of the plans found to fit (the keeper's, the
        probe's, `more`) over the smallest objective per second of step time (the objective is
        the step time times a factor of the GPU count), with BOUND_SLACK; inf while none fits;
        -inf where the search does not count them (search's count_unfit)."""
        if not self.count_unfit:
            return -math.inf
        found = [a for a in (self.keeper.best.objective, self.probe, more)
                 if a is not None and len(a)]
        if not found:
            return math.inf
        lowest = min(float(np.min(a)) for a in found)
        return lowest / self.keeper.min_factor * (1 + BOUND_SLACK)

    def chunks(self) -> Iterable[Plans]:
        """The request's plans in plan_chunks' order, but those of the grids' skeleton rows whose
        bound cannot rank (counted in `skipped` as they are passed), in chunks of at most
        CHUNK_PLANS."""
        grids = self.grids
        axes = [self._skeleton_axes(g) for g in grids]
        lowest = self._lowest(grids, axes)
        self._probe(grids, axes, lowest)
        return _chunked(self._blocks(grids, axes, lowest), CHUNK_PLANS)

    def _skeleton_axes(self, grid: _Grid) -> tuple[int, ...]:
        """The grid's axes that hold a column of a group its bound reads (the micro-batch's
        always: the first)."""
        groups = self.evaluator.bound_groups(grid.fixed["tp_layout"])
        columns = {c for g in encode.GROUPS if g.name in groups for c in g.columns}
        return tuple(i for i, a in enumerate(grid.axes) if i == 0 or columns.intersection(a))

    def _lowest(self, grids: list[_Grid], axes: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Each grid's bound on its skeleton (shaped by its skeleton axes; -inf where not a
        number, so that it never prunes)."""
        out: list[np.ndarray] = []
        pending: list[tuple[_Block, tuple[int, ...]]] = []
        rows = 0

        def flush() -> None:
            plans = Plans(_columns([b for b, _ in pending], COLUMNS))
            bound = self.evaluator.lower_bounds(plans)
            bound = np.where(np.isnan(bound), -np.inf, bound)
            start = 0
            for block, shape in pending:
                out.append(bound[start:start + block.n].reshape(shape))
                start += block.n
            pending.clear()

        for grid, at in zip(grids, axes, strict=True):
            block = grid.block(at, np.ones([grid.shape[i] for i in at], dtype=bool), first=True)
            assert block is not None
            pending.append((block, tuple(grid.shape[i] for i in at)))
            rows += block.n
            if rows >= CHUNK_PLANS:
                flush()
                rows = 0
        if pending:
            flush()
        return out

    def _objective(self, grid: _Grid, bound: np.ndarray) -> np.ndarray:
        gpus = np.full(bound.shape, grid.fixed["gpus"])
        return self.bound.objective(bound.ravel(), gpus.ravel()).reshape(bound.shape)

    def _probe(self, grids: list[_Grid], axes: list[tuple[int, ...]],
               lowest: list[np.ndarray]) -> None:
        """Evaluate in full the plans of the skeleton rows of the lowest bounds, about
        PROBE_PLANS of them."""
        objectives = [self._objective(g, b) for g, b in zip(grids, lowest, strict=True)]
        flat = np.concatenate([o.ravel() for o in objectives])
        owner = np.repeat(np.arange(len(grids)), [o.size for o in objectives])
        offset = np.concatenate(([0], np.cumsum([o.size for o in objectives])))
        # the skeleton rows of the lowest bounds, as many as the probes can take (each row is
        # at least a plan), in order
        limit = PROBE_ROUNDS * PROBE_PLANS
        few = np.argpartition(flat, limit - 1)[:limit] if len(flat) > limit \
            else np.arange(len(flat))
        ranked = iter(few[np.lexsort((few, flat[few]))])
        for _ in range(PROBE_ROUNDS):  # until the best `top` fit
            chosen: dict[int, np.ndarray] = {}
            size = 0
            for k in ranked:
                i = int(owner[k])
                mask = chosen.setdefault(i, np.zeros(objectives[i].shape, dtype=bool))
                mask.flat[k - offset[i]] = True
                size += math.prod(grids[i].shape) // objectives[i].size
                if size >= PROBE_PLANS:
                    break
            if not chosen:
                return
            order = sorted(chosen)
            blocks = [b for b, _ in self._allowed([grids[i] for i in order],
                                                  [axes[i] for i in order],
                                                  [chosen[i] for i in order]) if b is not None]
            if blocks:
                plans = Plans(_columns(blocks, COLUMNS))
                # only the plans that fit are evaluated in full: the probe's best is of them
                # (the others are met again, and evaluated where they may count, in the search)
                step, memory, _, _, _ = self.evaluator.evaluate(plans, self.capacity,
                                                                fitting_only=True)
                fits = np.isfinite(step) & (memory <= self.capacity)
                self._keep_probe(plans.take(np.flatnonzero(fits)),
                                 self.bound.objective(step[fits], plans.cols["gpus"][fits]))
            if math.isfinite(self.reach()):
                return

    def _keep_probe(self, plans: Plans, objectives: np.ndarray) -> None:
        """Add plans that fit to the probe's best (only the `top` best can set what to reach)."""
        keys = list(zip(*(plans.cols[k] for k in COLUMNS), strict=True))
        objectives = np.concatenate([self.probe, objectives])
        keys = self.probe_keys + keys
        order = np.argsort(objectives, kind="stable")[:self.keeper.top]
        self.probe, self.probe_keys = objectives[order], [keys[i] for i in order]

    def _allowed(self, grids: list[_Grid], axes: list[tuple[int, ...]],
                 keeps: list[np.ndarray]) -> Iterator[tuple[_Block | None, int]]:
        """Each grid's plans that obey the plan rules (_ruled) and that its mask `keep` (over
        its skeleton axes) allows, and how many plans that obey the rules it leaves out."""
        for (grid, ok), at, keep in zip(_ruled(grids, self.model), axes, keeps, strict=True):
            both = tuple(sorted(set(grid.ruled) | set(at)))
            rules = grid.spread(ok, tuple(grid.ruled), both)
            kept = rules & grid.spread(keep, at, both)
            rest = math.prod(grid.shape) // math.prod(grid.shape[i] for i in both)
            yield grid.block(both, kept), int((rules & ~kept).sum()) * rest

    def _blocks(self, grids: list[_Grid], axes: list[tuple[int, ...]],
                lowest: list[np.ndarray]) -> Iterator[_Block]:
        """The plans of the grids that obey the rules and whose skeleton row's bound can rank
        (RULE_BATCH ruled combinations checked at a time, each batch against the reach of the
        moment)."""
        for batch in _rule_batches(grids):
            pending = [i for i, _ in batch]
            reach = self.reach()
            keeps = [self._objective(grids[i], lowest[i]) <= reach for i in pending]
            for block, left_out in self._allowed([grids[i] for i in pending],
                                                 [axes[i] for i in pending], keeps):
                self.skipped += left_out
                if block is not None:
                    yield block


def enumerate_plans(model: TransformerSpec, req: SearchRequest) -> Plans:
    """Every plan of the request that the plan rules allow, as columns, all at once (for tests
    and benchmarks: search() holds one chunk at a time)."""
    parts = list(plan_chunks(model, req))
    return Plans.concat(parts) if parts else Plans.empty()


def count_plans(model: TransformerSpec, req: SearchRequest) -> int:
    """How many plans the request has, counted chunk by chunk."""
    return sum(len(p) for p in plan_chunks(model, req))


# The plan columns that vary in a search, in groups, with the symbols each group sets (the plan
# encoder's groups, perfmodel.encode.GROUPS): the step model is evaluated once per distinct value
# of the groups each of its terms depends on (see perfmodel.staged).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple((g.name, g.symbols) for g in encode.GROUPS)
_GROUP = {g.name: g for g in encode.GROUPS}


def _runs(columns: list[np.ndarray]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Each row's code among the distinct rows of some integer columns, and those rows (sorted,
    first column first), by column index. Plans come in long runs of one value of a group: the
    runs are found with a comparison per row, and only their first rows are sorted."""
    n = len(columns[0])
    change = np.empty(n, dtype=bool)
    change[0] = True
    np.not_equal(columns[0][1:], columns[0][:-1], out=change[1:])
    for column in columns[1:]:
        change[1:] |= column[1:] != column[:-1]
    starts = np.flatnonzero(change)
    key, width = np.zeros(len(starts), dtype=np.intp), 1
    values = []
    for column in columns:  # one integer per distinct row, in the order of the columns
        distinct, codes = np.unique(column[starts], return_inverse=True)
        key = key * len(distinct) + codes.reshape(-1)
        width *= len(distinct)
        values.append(distinct)
    keys, inverse = np.unique(key, return_inverse=True)
    rows = {}
    for i in range(len(columns) - 1, -1, -1):
        keys, digit = np.divmod(keys, len(values[i]))
        rows[i] = values[i][digit]
    return np.repeat(inverse.reshape(-1), np.diff(starts, append=n)), rows


def _distinct(group: str, plans: Plans) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
    """Each plan's code among the distinct rows of a group's columns, their number, and the rows."""
    names = _GROUP[group].columns
    columns = [np.asarray(plans.cols[k], dtype=np.intp) for k in names]
    if group in ("recompute", "sequence_parallel", "zero", "cp_comm"):  # small codes already
        card = int(columns[0].max()) + 1
        return columns[0], card, {names[0]: np.arange(card)}
    if group != "topology":
        codes, distinct = _runs(columns)
        return codes, len(distinct[0]), {k: distinct[i] for i, k in enumerate(names)}
    # the placement changes at every plan: runs of the other columns, then with the placement
    others = [i for i, k in enumerate(names) if k != "placement"]
    codes, distinct = _runs([columns[i] for i in others])
    places = columns[names.index("placement")]
    width = int(places.max()) + 1
    combined = codes * width + places
    seen = np.zeros(len(distinct[0]) * width, dtype=bool)
    seen[combined] = True
    keys = np.flatnonzero(seen)
    row, place = np.divmod(keys, width)
    rows = {names[i]: distinct[j][row] for j, i in enumerate(others)}
    rows["placement"] = place
    return np.take(np.cumsum(seen) - 1, combined), len(keys), rows


def group_values(hardware: HardwareSpec, plans: Plans) -> dict[str, GroupValues]:
    """The distinct values of each group of columns, their symbols, and each plan's row of them.

    The topology's rows are sorted by tensor layout first: the plans of one layout family have the
    rows of one range."""
    out = {}
    fabric = encode.fabric_of(hardware)
    for group, _ in GROUPS:
        codes, card, rows = _distinct(group, plans)
        args = encode.encode_group(_GROUP[group], rows, fabric)
        out[group] = GroupValues(codes, card, args, rows)
    return out


def scalar_values(model: TransformerSpec, hardware: HardwareSpec,
                  req: SearchRequest) -> dict[str, Any]:
    """The symbols that are one number for every plan of a request: model, hardware, dtype and
    the options every plan shares (the encoder's fixed values)."""
    flash = encode.resolve_flash(req.flash_attention, model, hardware, req.dtype,
                                 req.attention_kernel)
    return encode.fixed_values(model, hardware, req.dtype, flash_attention=flash,
                               stack=req.stack,
                               kernels=req.kernels or strategy.default_kernels(req.stack),
                               recompute_every=req.recompute_every,
                               recompute_method=req.recompute_method.value,
                               recompute_num_layers=req.recompute_num_layers,
                               cpu_offload_layers=req.cpu_offload_layers,
                               dp_bucket_size=req.dp_bucket_size,
                               dp_bucketing=req.dp_bucketing.value,
                               attention_kernel=req.attention_kernel,
                               grad_dtype=req.grad_dtype, optimizer_dtype=req.optimizer_dtype,
                               master_weights=req.master_weights,
                               fp8_recipe=None if req.fp8_recipe is None
                               else req.fp8_recipe.value, fp8_params=req.fp8_params,
                               ep_dispatcher=req.ep_dispatcher,
                               cross_entropy=req.cross_entropy,
                               expert_weighting=req.expert_weighting,
                               expandable_segments=req.expandable_segments,
                               optimizer_kernels=req.optimizer_kernels)


# --- evaluation -----------------------------------------------------------------------------


class Evaluator:
    """The compiled step model of a request, evaluated over chunks of plans."""

    def __init__(self, model: TransformerSpec, hardware: HardwareSpec, req: SearchRequest) -> None:
        self.model, self.hardware, self.req = model, hardware, req
        self.universal = family_of(model, hardware, req.shared_plan())
        self.scalars = scalar_values(model, hardware, req)
        self._bound_groups: dict[str, frozenset[str]] = {}

    def __call__(self, plans: Plans,
                 capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step time, memory per GPU (reserved memory not included) and model FLOPs of every
        plan, and which passed the memory bound; one family per tensor layout: Megatron 1D (most
        plans, the smallest expression), the 2d/2.5d grids, the 3d cube."""
        step, memory, flops, keep, _ = self.evaluate(plans, capacity)
        return step, memory, flops, keep

    def evaluate(self, plans: Plans, capacity: float, bound: StepBound | None = None,
                 fitting_only: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """As __call__, and which plans were evaluated in full: those that pass the memory bound
        and, with a `bound`, whose step time's lower bound can still rank them among the best
        (StepBound) and that fit in memory or may be faster than the best plan (StepBound.faster:
        the count of the faster plans that do not fit is kept); with `fitting_only`, those that
        fit in memory. The others keep an infinite step time."""
        n = len(plans)
        step, memory, flops = np.full(n, np.inf), np.zeros(n), np.zeros(n)
        keep, done = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        if n == 0:
            return step, memory, flops, keep, done
        groups = group_values(self.hardware, plans)
        gpus = plans.cols["gpus"]
        for family, rows, part in self._by_layout(groups):
            held = None if bound is None else _held(bound, plans, np.arange(n)[rows])
            result = self._family(part, family, capacity, bound, gpus[rows], held, fitting_only)
            for target, values in zip((step, memory, flops, keep, done), result, strict=True):
                target[rows] = values
        return step, memory, flops, keep, done

    def _family(self, groups: dict[str, GroupValues], family: Any, capacity: float,
                bound: StepBound | None = None, gpus: np.ndarray | None = None,
                held: Callable[[np.ndarray], np.ndarray] | None = None,
                fitting_only: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The bounds first (model states alone must fit; with `bound`, the step time's lower
        bound must reach the best plans), then the full model on the plans that pass them; each
        evaluated term by term (see perfmodel.staged). With a bound, the plans with the lowest
        lower bounds go first (PROBE_PLANS of them), so that the best plans they find cut the
        rest; held(rows) says which of them the bound counts already (the search's probe: a plan
        counted twice would make the top-th best look better than it is)."""
        n = len(groups["topology"].codes)
        bounds = run(compile_staged(family, "bounds", GROUPS), self.scalars, groups, n)
        memory = _largest(bounds, "states:")
        keep = memory <= capacity  # model states alone must fit: a lower bound on memory
        step = np.full(n, np.inf)
        flops = np.zeros(n)
        done = np.zeros(n, dtype=bool)
        todo = np.flatnonzero(keep)
        if fitting_only:
            todo = todo[self._fit(groups, family, todo, capacity)]
        if bound is not None and len(todo):
            assert gpus is not None
            lower = run(compile_staged(family, "lower", GROUPS), self.scalars, groups, n)
            least = lower["step_time_lb"]
            lowest = bound.objective(least, gpus)
            reach, probes = bound.reach(None), 0
            todo = todo[lowest[todo] <= reach]
            todo = todo[np.argsort(lowest[todo], kind="stable")]
            found = np.zeros(0)  # objectives of the plans evaluated here that fit (not held)
            # lowest bounds first: probes of PROBE_PLANS until the best can cut (PROBE_ROUNDS at
            # most), then batches of TIGHTEN_PLANS, each batch's best cutting the next (the last
            # batch the plans left: all of them after PROBE_ROUNDS probes that found none)
            while len(todo):
                size = TIGHTEN_PLANS if math.isfinite(reach) else PROBE_PLANS
                if len(todo) <= 2 * size or not (math.isfinite(reach) or probes < PROBE_ROUNDS):
                    batch, todo = todo, todo[:0]
                else:
                    batch, todo = todo[:size], todo[size:]
                    probes += not math.isfinite(reach)
                # a plan that does not fit in memory is evaluated in full only where it may be
                # faster than the best plan (its step time counts among the faster ones that
                # do not fit), its memory first (a module of its own, a fraction of the cost)
                fit = self._fit(groups, family, batch, capacity)
                batch = batch[fit | (least[batch] < bound.faster(found))]
                self._full(groups, family, batch, step, memory, flops, done)
                fits = batch[np.isfinite(step[batch]) & (memory[batch] <= capacity)]
                if held is not None and len(fits):
                    fits = fits[~held(fits)]
                found = np.concatenate([found, bound.objective(step[fits], gpus[fits])])
                reach = bound.reach(found)
                todo = todo[lowest[todo] <= reach]
            return step, memory, flops, keep, done
        self._full(groups, family, todo, step, memory, flops, done)
        return step, memory, flops, keep, done

    def _fit(self, groups: dict[str, GroupValues], family: Any, at: np.ndarray,
             capacity: float) -> np.ndarray:
        """Which of the plans at positions `at` may fit in memory (the memory module alone: its
        numbers are the full model's to rounding, so that a plan it puts above the capacity by
        more than BOUND_SLACK does not fit)."""
        if not len(at):
            return np.zeros(0, dtype=bool)
        part = {g: values.take(at) for g, values in groups.items()}
        out = run(compile_staged(family, "memory", GROUPS), self.scalars, part, len(at))
        return _largest(out, "memory:") <= capacity * (1 + BOUND_SLACK)

    def lower_bounds(self, plans: Plans) -> np.ndarray:
        """The step time's lower bound of every plan that a grid's skeleton gives
        (perfmodel.evaluate.BOUNDS_UNREAD, "step_time_lb_grid")."""
        n = len(plans)
        out = np.full(n, -np.inf)
        if n == 0:
            return out
        groups = group_values(self.hardware, plans)
        for family, rows, part in self._by_layout(groups):
            size = len(part["topology"].codes)
            out[rows] = run(compile_staged(family, "lower_grid", GROUPS), self.scalars, part,
                            size)["step_time_lb_grid"]
        return out

    def bound_groups(self, layout: int) -> frozenset[str]:
        """The plan groups the grid's lower bound of a tensor layout's family reads."""
        name = next(f for f, codes in encode.LAYOUT_FAMILIES.items() if layout in codes)
        cached = self._bound_groups.get(name)
        if cached is None:
            family = dataclasses.replace(self.universal, tp_layout=name)
            cached = frozenset(output_groups(compile_staged(family, "lower_grid", GROUPS),
                                             "step_time_lb_grid"))
            self._bound_groups[name] = cached
        return cached

    def _by_layout(self, groups: dict[str, GroupValues]
                   ) -> Iterator[tuple[Any, slice | np.ndarray, dict[str, GroupValues]]]:
        """(family, the rows of its plans, their groups) for each tensor layout present."""
        topology = groups["topology"]
        layouts = topology.rows["tp_layout"]  # sorted
        for family_layout, codes in encode.LAYOUT_FAMILIES.items():
            lo = int(np.searchsorted(layouts, codes[0]))
            hi = int(np.searchsorted(layouts, codes[-1], side="right"))
            if lo == hi:
                continue
            rows: slice | np.ndarray
            index: np.ndarray | None
            if lo == 0 and hi == topology.card:
                rows, index = slice(None), None
            else:
                rows = index = np.flatnonzero((topology.codes >= lo) & (topology.codes < hi))
            part = {g: (values.restrict(index, lo, hi) if g == "topology" else
                        values if index is None else values.take(index))
                    for g, values in groups.items()}
            yield dataclasses.replace(self.universal, tp_layout=family_layout), rows, part

    def _full(self, groups: dict[str, GroupValues], family: Any, at: np.ndarray,
              step: np.ndarray, memory: np.ndarray, flops: np.ndarray, done: np.ndarray) -> None:
        """The full model of the plans at positions `at`, written into step, memory and flops."""
        if not len(at):
            return
        n = len(groups["topology"].codes)
        rows: slice | np.ndarray = slice(None)  # every plan: the groups as they are
        part = groups
        if len(at) < n:
            rows = at
            part = {g: values.take(at) for g, values in groups.items()}
        out = run(compile_staged(family, "search", GROUPS), self.scalars, part, len(at))
        step[rows] = out["step_time"]
        memory[rows] = _largest(out, "memory:")
        flops[rows] = out["q:model_flops_per_step"]
        done[rows] = True


def _held(bound: StepBound, plans: Plans, rows: np.ndarray
          ) -> Callable[[np.ndarray], np.ndarray]:
    """held(i): which of plans' rows[i] the bound counts already (StepBound.probed)."""
    return lambda i: bound.probed(plans, rows[i])


@dataclass(frozen=True)
class StepBound:
    """What a plan's step time must reach to rank among a search's best (perfmodel.evaluate.
    step_lower_bound): objective(step times, GPU counts) gives the plans' objectives, and
    reach(objectives of plans that fit, or None) the objective that the `top`-th best of the
    search so far and those plans leaves to beat (inf while fewer fit), with a margin of
    BOUND_SLACK for rounding: a plan whose lower bound's objective is above it cannot rank."""

    objective: Callable[[np.ndarray, np.ndarray], np.ndarray]
    reach: Callable[[np.ndarray | None], float]
    # probed(plans, rows): which of those plans reach() counts already, whatever `more` it is
    # given (so that a caller leaves them out of it)
    probed: Callable[[Plans, np.ndarray], np.ndarray]
    # faster(objectives of other plans that fit, or None): a step time at least the best plan's
    # at the end of the search (inf while none fits): a plan that does not fit counts among the
    # faster ones that do not fit (SearchResult.unfit_faster) only below it
    faster: Callable[[np.ndarray | None], float] = lambda more: math.inf


def _largest(out: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """The largest of every stage's (first, middle, last) numbers named prefix + stage: the
    GPU that needs the most, as predict reports it (a middle stage holds the most where an
    uneven split shortens the ends)."""
    return functools.reduce(np.maximum, [v for k, v in out.items() if k.startswith(prefix)])


def evaluate_all(model: TransformerSpec, hardware: HardwareSpec, plans: Plans, req: SearchRequest,
                 capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step time, memory per GPU, model FLOPs of every plan, and which passed the memory bound
    (see Evaluator)."""
    return Evaluator(model, hardware, req)(plans, capacity)


def objective_of(req: SearchRequest, model: TransformerSpec, step: np.ndarray,
                 gpus: np.ndarray) -> np.ndarray:
    """Seconds per step, seconds to train the token budget, or the price of that (or of a step)."""
    if req.objective is Objective.STEP_TIME:
        return step
    tokens_per_step = req.global_batch * model.seq_len
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # whole steps: the budget's last tokens take a step of their own
        seconds = step * math.ceil(req.tokens / tokens_per_step) if req.tokens else step
        out: np.ndarray = seconds if req.objective is Objective.TIME_TO_TRAIN else \
            seconds / 3600 * gpus * req.gpu_hour_price
    # SearchRequest's ranges keep it finite and nonzero; a number that is not is refused naming
    # the options, never ranked (an infinite cost in the CSV, a zero the explanation divides by)
    evaluated = np.isfinite(step)
    if np.any(evaluated & ~(np.isfinite(out) & (out > 0))):
        what = "time to train" if req.objective is Objective.TIME_TO_TRAIN else "cost"
        given = ", ".join(f"{option} {value:g}" for option, value in (
            ("--tokens", req.tokens), ("--gpu-hour-price", req.gpu_hour_price)) if value)
        raise PerfmodelError(f"{given}: a plan's {what} is not a finite nonzero number; give "
                             f"--tokens within {TOKEN_BUDGET[0]:g}-{TOKEN_BUDGET[1]:g} and "
                             f"--gpu-hour-price within {GPU_HOUR_PRICE[0]:g}-"
                             f"{GPU_HOUR_PRICE[1]:g} whose product keeps it so")
    return out


# --- what a search keeps ----------------------------------------------------------------------


@dataclass
class Scored:
    """Plans of a search with their numbers (columns of equal length)."""

    plans: Plans
    index: np.ndarray  # the plan's position in the enumeration (ties rank by it)
    step_time_s: np.ndarray  # inf where not evaluated: its model states alone exceed the memory
    memory_bytes: np.ndarray  # per GPU with reserved memory; the model states' if not evaluated
    model_flops: np.ndarray
    objective: np.ndarray  # inf where not evaluated
    fits: np.ndarray  # memory within the request's limit

    def __len__(self) -> int:
        return len(self.index)

    @property
    def evaluated(self) -> np.ndarray:
        finite: np.ndarray = np.isfinite(self.step_time_s)
        return finite

    def take(self, index: np.ndarray) -> Scored:
        return Scored(self.plans.take(index), *(getattr(self, f.name)[index]
                                                for f in dataclasses.fields(self)[1:]))

    @staticmethod
    def concat(parts: list[Scored]) -> Scored:
        parts = [p for p in parts if len(p)]
        if len(parts) <= 1:
            return parts[0] if parts else Scored.empty()
        return Scored(Plans.concat([p.plans for p in parts]),
                      *(np.concatenate([getattr(p, f.name) for p in parts])
                        for f in dataclasses.fields(Scored)[1:]))

    @staticmethod
    def empty() -> Scored:
        nothing = np.zeros(0)
        return Scored(Plans.empty(), np.zeros(0, dtype=np.int64), nothing, nothing, nothing,
                      nothing, np.zeros(0, dtype=bool))

    def frame(self, experts: bool = False) -> Any:
        """The plans as a pandas DataFrame, options by name; the step time and objective of a
        plan that was not evaluated are empty (NaN). experts: the model is a mixture of experts
        (idle_options)."""
        import pandas as pd

        c = self.plans.cols
        df = pd.DataFrame({k: c[k] for k in COLUMNS})
        for key, names in (("schedule", SCHEDULES), ("recompute", RECOMPUTES),
                           ("placement", PLACEMENT_NAMES), ("tp_layout", LAYOUTS),
                           ("cp_comm", CP_COMMS)):
            df[key] = np.asarray(names, dtype=object)[c[key]]
        for key in ("sequence_parallel", "tp_comm_overlap", "overlap_grad_sync",
                    "overlap_param_gather", "ep_comm_overlap"):
            df[key] = c[key].astype(bool)
        # (an overlap of a sync the plan has not: off, as Plans.plan writes it)
        no_sync = idle_options(c, experts)["overlap"]
        df["overlap_grad_sync"] &= ~no_sync
        df["overlap_param_gather"] &= ~no_sync
        # combined 1F1B as it runs: the column asks for it, Megatron runs it (ep_overlap_runs)
        df["ep_comm_overlap"] &= (df["recompute"] != Recompute.FULL.value) & (
            (c["pp"] == 1) | (df["schedule"] == Schedule.INTERLEAVED.value))
        # ... where the schedule pairs any chunks
        df["ep_comm_overlap"] &= strategy.ep_overlap_pairs(
            c["pp"], c["virtual_stages"], (df["schedule"] == Schedule.INTERLEAVED.value).to_numpy(),
            c["global_batch"] // (c["micro_batch"] * c["dp"]))
        evaluated = self.evaluated
        df["evaluated"] = evaluated
        df["step_time_s"] = np.where(evaluated, self.step_time_s, np.nan)
        df["memory_per_gpu_bytes"] = self.memory_bytes
        df["fits_in_memory"] = self.fits
        df["objective"] = np.where(evaluated, self.objective, np.nan)
        return df


def _first(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the values at most the k-th smallest (ties at the k-th included)."""
    if len(values) <= k:
        return np.arange(len(values))
    return np.flatnonzero(values <= np.partition(values, k - 1)[k - 1])


def _ranked(rows: Scored, k: int) -> Scored:
    """The k first of rows by objective, then memory, then enumeration order."""
    rows = rows.take(_first(rows.objective, k))
    return rows.take(np.lexsort((rows.index, rows.memory_bytes, rows.objective))[:k])


def _front(rows: Scored) -> Scored:
    """The plans no other beats in both step time and memory, fastest first (as
    perfmodel.plot.pareto_front: of equal points, the earlier)."""
    order = np.lexsort((rows.index, rows.memory_bytes, rows.step_time_s))
    memory = rows.memory_bytes[order]
    lowest_before = np.minimum.accumulate(np.concatenate(([np.inf], memory[:-1])))
    return rows.take(order[memory < lowest_before])


def _beaten(rows: Scored, at: np.ndarray, front: Scored) -> np.ndarray:
    """Which of the rows at positions `at` a point of a front (fastest first, memory falling)
    beats: no slower and no larger, and earlier if equal (so that _front keeps the earlier)."""
    if not len(front):
        return np.zeros(len(at), dtype=bool)
    step, memory, index = rows.step_time_s[at], rows.memory_bytes[at], rows.index[at]
    j = np.maximum(np.searchsorted(front.step_time_s, step, side="right") - 1, 0)
    f_step, f_memory = front.step_time_s[j], front.memory_bytes[j]
    beats: np.ndarray = (f_step <= step) & ((f_memory < memory) | (f_memory == memory)
                                & ((f_step < step) | (front.index[j] < index)))
    return beats


def _leanest(rows: Scored, label: tuple[str, ...], k: int = 3,
             at: np.ndarray | None = None) -> Scored:
    """The leanest plan of each of the k leanest distinct labels (the columns `label`), by
    memory then enumeration order, among the rows at positions `at` (default: all)."""
    at = np.arange(len(rows)) if at is None else at
    few = at[_first(rows.memory_bytes[at], 4 * 1024)]
    if len(few) < len(at):  # the k leanest labels are usually among the leanest plans
        picked = _leanest(rows, label, k, few)
        if len(picked) == k:
            return picked
    if not len(at):
        return rows.take(at)
    some = rows.take(at)
    order = np.lexsort((some.index, some.memory_bytes))
    keys = np.stack([some.plans.cols[c][order] for c in label], axis=1)
    _, first = np.unique(keys, axis=0, return_index=True)
    return some.take(order[np.sort(first)[:k]])


NEAREST_LABEL = ("dp", "tp", "pp", "cp", "ep", "etp", "cp_comm", "micro_batch", "schedule",
                 "virtual_stages", "recompute", "sequence_parallel", "zero", "tp_layout",
                 "tp_depth", "tp_comm_overlap", "overlap_grad_sync",
                 "overlap_param_gather", "ep_comm_overlap")  # a plan but its placement
BOUND_LABEL = ("dp", "tp", "pp", "cp", "ep", "etp", "tp_layout", "zero")  # the model states' bound
UNFIT_KEPT = 1_000_000  # step times of plans that do not fit, kept to count the faster ones


@dataclass
class SearchResult:
    """What a search leaves: counts, the best plans, the Pareto front, a sample, and what explains
    the answer. Memory is per GPU with the hardware's reserved memory."""

    request: SearchRequest
    best: Scored  # the plans that fit, best first (up to the search's `top`)
    front: Scored  # every evaluated plan's Pareto front, step time against memory, fastest first
    sample: Scored  # evaluated plans drawn uniformly at random (up to SAMPLE_PLANS), in order
    fastest_unfit: Scored  # the fastest evaluated plan that does not fit (none or one)
    unfit_faster: int  # evaluated plans that do not fit and are faster than the best
    unfit_faster_at_least: bool  # unfit_faster is a lower bound (more than UNFIT_KEPT)
    nearest: Scored  # when nothing fits: the leanest plans of the three leanest labels
    enumerated: int
    evaluated: int
    feasible: int
    search_time_s: float
    capacity_bytes: float
    # plans not evaluated because their step time's lower bound ranks them below the best, or
    # because they do not fit in memory and that bound says they are not faster than the best
    # (search(prune=True); some would not have passed the memory bound either): the front and
    # the sample lack them
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    experts: bool = False  # the model is a mixture of experts (its experts' own sync: sync_ranks)

    def plan(self, rows: Scored, i: int) -> Plan:
        """Row i of some of this search's plans (best, front, sample, ...) as a Plan."""
        r = self.request
        return rows.plans.plan(int(i), r.dtype, r.flash_attention, r.stack,
                               experts=self.experts, **r.shared())

    def best_plans(self) -> list[Plan]:
        return [self.plan(self.best, i) for i in range(len(self.best))]


def _reach(objectives: np.ndarray, top: int) -> float:
    """The top-th smallest of the objectives of distinct plans that fit, with BOUND_SLACK: a plan
    whose objective is above it cannot rank among the `top` best; inf while fewer fit."""
    if len(objectives) < top:
        return math.inf
    return float(np.partition(objectives, top - 1)[top - 1]) * (1 + BOUND_SLACK)


class _Keeper:
    """Takes a search's chunks one by one and keeps what SearchResult holds."""

    def __init__(self, model: TransformerSpec, req: SearchRequest, top: int) -> None:
        self.top = top
        self.best = self.front = self.sample = self.fastest_unfit = Scored.empty()
        self.nearest = self.bound_nearest = Scored.empty()
        self.sample_keys = np.zeros(0)
        self.rng = np.random.default_rng(0)  # a fixed seed: the same search, the same sample
        self.unfit_steps = np.zeros(0)
        self.unfit_cut = False
        # objective / step time is at least this (the objective grows with the step time and the
        # GPU count): bounds the best plan's step time by the best objective so far
        self.min_factor = float(objective_of(req, model, np.ones(1), np.array([min(req.gpus)]))[0])
        self.enumerated = self.evaluated = self.feasible = self.skipped = 0

    def reach(self, more: np.ndarray | None = None) -> float:
        """The objective a plan must reach to rank among the `top` best: _reach of the best so
        far and `more` (objectives of other plans that fit, none of them among the best)."""
        objectives = self.best.objective if more is None or not len(more) else \
            np.concatenate([self.best.objective, more])
        return _reach(objectives, self.top)

    def add(self, rows: Scored, skipped: int = 0) -> None:
        """Keep what the chunk `rows` adds (`skipped` of its plans passed the memory bound but
        not the step-time bound); only the few rows kept are copied."""
        self.enumerated += len(rows)
        self.skipped += skipped
        done = np.flatnonzero(rows.evaluated)
        if not self.evaluated and not len(done):  # only bounds so far: the leanest states
            self.bound_nearest = _leanest(
                Scored.concat([self.bound_nearest, _leanest(rows, BOUND_LABEL)]), BOUND_LABEL)
        self.evaluated += len(done)
        if not len(done):
            return
        fits = np.flatnonzero(rows.fits)
        self.feasible += len(fits)
        if self.feasible == 0:
            self.nearest = _leanest(
                Scored.concat([self.nearest, _leanest(rows, NEAREST_LABEL, at=done)]),
                NEAREST_LABEL)
        if len(fits):
            if len(self.best) == self.top:
                fits = fits[rows.objective[fits] <= self.best.objective[-1]]
            fits = fits[_first(rows.objective[fits], self.top)]
            self.best = _ranked(Scored.concat([self.best, rows.take(fits)]), self.top)
        self._unfit(rows, np.flatnonzero(rows.evaluated & ~rows.fits))
        self._front(rows, done)
        self._sample(rows, done)

    def _front(self, rows: Scored, done: np.ndarray) -> None:
        new = done[~_beaten(rows, done, self.front)]
        if len(new) > 8192:  # a first front of the fastest and the leanest beats most of them
            seed = np.concatenate([new[_first(rows.step_time_s[new], 4096)],
                                   new[_first(rows.memory_bytes[new], 4096)]])
            seed_front = _front(rows.take(np.unique(seed)))
            new = new[~_beaten(rows, new, seed_front)]
        if len(new):
            self.front = _front(Scored.concat([self.front, rows.take(new)]))

    def _unfit(self, rows: Scored, unfit: np.ndarray) -> None:
        if not len(unfit):
            return
        steps = rows.step_time_s[unfit]
        fastest = unfit[np.argmin(steps)]  # the first of equals: positions follow the index
        if (not len(self.fastest_unfit)
                or rows.step_time_s[fastest] < self.fastest_unfit.step_time_s[0]):
            self.fastest_unfit = rows.take(np.array([fastest]))
        bound = (self.best.objective[0] / self.min_factor * (1 + 1e-9) if len(self.best)
                 else np.inf)
        steps = np.concatenate([self.unfit_steps, steps[steps < bound]])
        if len(steps) > UNFIT_KEPT:
            steps = np.partition(steps, UNFIT_KEPT - 1)[:UNFIT_KEPT]
            self.unfit_cut = True
        self.unfit_steps = steps

    def _sample(self, rows: Scored, done: np.ndarray) -> None:
        """Bottom-k sampling: each plan draws a random key; the SAMPLE_PLANS smallest stay."""
        keys = self.rng.random(len(done))
        # the SAMPLE_PLANS smallest keys of the sample and the chunk lie below `cut` if that many
        # do: the sample's largest key once it is full, else about twice the keys it lacks
        cut = (self.sample_keys.max() if len(self.sample) == SAMPLE_PLANS
               else min(1.0, 2 * SAMPLE_PLANS / max(len(done), 1)))
        low = np.flatnonzero(keys < cut)
        if len(low) + int((self.sample_keys < cut).sum()) >= SAMPLE_PLANS:
            done, keys = done[low], keys[low]
        merged = Scored.concat([self.sample, rows.take(done)])
        keys = np.concatenate([self.sample_keys, keys])
        if len(merged) > SAMPLE_PLANS:
            keep = np.argpartition(keys, SAMPLE_PLANS - 1)[:SAMPLE_PLANS]
            merged, keys = merged.take(keep), keys[keep]
        self.sample, self.sample_keys = merged, keys

    def result(self, req: SearchRequest, start: float, capacity: float,
               experts: bool = False) -> SearchResult:
        faster, at_least = 0, False
        if len(self.best):  # (1 - 1e-9): the search and predict agree to that
            faster = int((self.unfit_steps < self.best.step_time_s[0] * (1 - 1e-9)).sum())
            at_least = self.unfit_cut and faster == len(self.unfit_steps)
        nearest = self.nearest if self.evaluated else self.bound_nearest
        order = np.argsort(self.sample.index)
        return SearchResult(req, self.best, self.front, self.sample.take(order),
                            self.fastest_unfit, faster, at_least, nearest, self.enumerated,
                            self.evaluated, self.feasible, time.perf_counter() - start, capacity,
                            self.skipped, experts=experts)


def resolved_request(model: TransformerSpec, hardware: HardwareSpec,
                     req: SearchRequest) -> SearchRequest:
    """The request as the search runs it (SearchResult.request), its rules checked: flash
    attention's default decided for the hardware and model, ZeRO 3 left out where MXFP8 weights
    may not be sharded (Plan's rule, encode.check_fp8_params). Resolving a resolved request
    changes nothing."""
    if req.cpu_offload_layers >= model.layers:  # Plan.check's rule, for every plan
        Plan(gpus=1, cpu_offload_layers=req.cpu_offload_layers).check(model)
    encode.check_stack(hardware, req.stack)
    encode.check_dispatcher(hardware, req.ep_dispatcher)
    for gpus in req.gpus:
        encode.check_whole_nodes(hardware, gpus)
    flash = encode.resolve_flash(req.flash_attention, model, hardware, req.dtype,
                                 req.attention_kernel)
    if flash != req.flash_attention:  # the default decided for this hardware and model
        req = dataclasses.replace(req, flash_attention=flash)
    if req.cp_comm is not None and req.cp is None and (not flash or req.max_cp == 1):
        # a pin no searched plan takes (context parallelism needs a fused kernel), as predict
        # refuses --cp-comm beside cp 1
        why = ("max_cp 1 leaves every plan at cp 1" if flash else "the attention has no fused "
               "kernel for this hardware and dtype, which context parallelism needs")
        raise PlanError(f"cp_comm {req.cp_comm.value} applies to context parallelism (cp > 1), "
                        f"and no plan searched has it: {why}; leave --cp-comm out")
    if encode.fp8_params_zero3_refused(hardware, req.dtype, req.fp8_recipe, req.fp8_params):
        # MXFP8 weights under FSDP (Plan's rule, encode.check_fp8_params): ZeRO 0-2 searched
        if req.zero == 3:
            encode.check_fp8_params(hardware, req.dtype, req.fp8_recipe, req.fp8_params, 3)
        req = dataclasses.replace(req, zero_stages=tuple(z for z in req.zero_stages if z < 3))
    return req


def search(model: TransformerSpec, hardware: HardwareSpec, req: SearchRequest, *,
           top: int = DEFAULT_TOP,
           on_chunk: Callable[[Scored], None] | None = None,
           prune: bool = False, count_unfit: bool = True) -> SearchResult:
    """Enumerate, prune, evaluate and rank every plan of the request, a chunk at a time.

    top: how many of the best plans to keep. on_chunk: called with every chunk of plans (all
    of them, evaluated or not) and its numbers, in order (e.g. to write them out). prune: skip
    the plans whose step time's lower bound (perfmodel.evaluate.BOUNDS_UNREAD) cannot rank
    among the `top` best (_Pruner): the best plans, the count of faster plans that do not fit
    and the fastest of them are the same, the Pareto front, the sample and on_chunk's chunks
    are of the plans evaluated (SearchResult.skipped says how many were not). Not for a price
    over several GPU counts, nor for fewer than PRUNE_PLANS candidate plans (all evaluated).
    count_unfit=False: a plan that does not fit in memory is never evaluated in full (its memory
    is, alone), so that the faster plans that do not fit are not counted (unfit_faster 0, no
    fastest_unfit) and the front and the sample are of plans that fit: for a search whose best
    plan alone is wanted (recommend's alternatives).
    """
    start = time.perf_counter()
    req = resolved_request(model, hardware, req)
    reserved = hardware.memory_reserved_bytes
    capacity = hardware.memory_bytes * (1 - req.memory_margin) - reserved
    keeper = _Keeper(model, req, top)
    pruner = None
    # the bound ranks by the objective and keeps the count of faster plans that do not fit (by
    # step time) exact where the objective is the step time times one factor for every plan:
    # not the price of several GPU counts
    proportional = req.objective is not Objective.COST or len(req.gpus) == 1
    grids = list(_grids(model, req, CHUNK_PLANS)) if prune and proportional else []
    if sum(math.prod(g.shape) for g in grids) > PRUNE_PLANS:
        pruner = _Pruner(model, req, Evaluator(model, hardware, req), capacity, keeper, grids,
                         count_unfit)
    evaluate = pruner.evaluator if pruner else None
    for plans in (pruner.chunks() if pruner else plan_chunks(model, req)):
        evaluate = evaluate or Evaluator(model, hardware, req)
        step, memory, flops, keep, done = evaluate.evaluate(
            plans, capacity, pruner.bound if pruner else None,
            fitting_only=not (pruner or count_unfit))
        n = len(plans)
        rows = Scored(plans, np.arange(keeper.enumerated, keeper.enumerated + n), step,
                      memory + reserved, flops, objective_of(req, model, step, plans.cols["gpus"]),
                      np.isfinite(step) & (memory <= capacity))
        left_out = 0
        if pruner:
            left_out, pruner.skipped = pruner.skipped, 0
        keeper.add(rows, int((keep & ~done).sum()) + left_out)
        keeper.enumerated += left_out
        if on_chunk is not None:
            on_chunk(rows)
    return keeper.result(req, start, capacity + reserved, experts=bool(model.experts))
