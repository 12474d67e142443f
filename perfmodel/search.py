"""Search every plan: enumerate -> prune by a cheap bound -> evaluate vectorised -> rank.

All plans of a request are columns of numpy arrays; the universal expression (one per hardware, see
perfmodel.family) is compiled once and evaluated over all of them in one call.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from perfmodel.errors import PlanError
from perfmodel.evaluate import family_of
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import TransformerSpec
from perfmodel.staged import GroupValues, compile_staged, run
from perfmodel.strategy import Plan

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv")
LAYOUTS = ("1d", "2d", "2.5d", "3d")
RECOMPUTES = ("none", "selective", "full")
PLACEMENTS = ("tp,dp,pp", "tp,pp,dp", "dp,tp,pp")


class Objective(StrEnum):
    STEP_TIME = "step_time"
    TIME_TO_TRAIN = "time_to_train"
    COST = "cost"


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """What to search. Pins (a value) fix an option; None leaves it free."""

    gpus: tuple[int, ...]
    global_batch: int
    dtype: str = "bf16"
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    micro_batch: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    placement: str | None = None
    tp_layout: str | None = None
    tp_depth: int | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_micro_batch: int | None = None
    flash_attention: bool = False
    overlap_grad_sync: bool = False
    memory_margin: float = 0.0
    objective: Objective = Objective.STEP_TIME
    tokens: float | None = None
    gpu_hour_price: float | None = None

    def __post_init__(self) -> None:
        if not self.gpus or any(g < 1 for g in self.gpus):
            raise PlanError("gpus must be one or more positive whole numbers")
        if self.global_batch < 1:
            raise PlanError(f"global_batch must be >= 1, got {self.global_batch}")
        if not 0 <= self.memory_margin < 1:
            raise PlanError(f"memory_margin must be in [0, 1), got {self.memory_margin}")
        objective = Objective(self.objective)
        object.__setattr__(self, "objective", objective)
        if objective is Objective.TIME_TO_TRAIN and not self.tokens:
            raise PlanError("objective time_to_train needs --tokens (the token budget)")
        if objective is Objective.COST and not self.gpu_hour_price:
            raise PlanError("objective cost needs --gpu-hour-price")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise PlanError(f"schedule must be one of {', '.join(SCHEDULES)}, got '{self.schedule}'")
        if self.recompute is not None and self.recompute not in RECOMPUTES:
            raise PlanError(f"recompute must be one of {', '.join(RECOMPUTES)}, got '{self.recompute}'")
        if self.tp_layout is not None and self.tp_layout not in LAYOUTS:
            raise PlanError(f"tp_layout must be one of {', '.join(LAYOUTS)}, got '{self.tp_layout}'")
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise PlanError(f"placement must be one of {', '.join(PLACEMENTS)}, got '{self.placement}'")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass
class Plans:
    """Columns of plans (numpy arrays of equal length)."""

    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def take(self, index: np.ndarray | slice) -> Plans:
        return Plans({k: v[index] for k, v in self.cols.items()})

    def plan(self, i: int, dtype: str, flash: bool, overlap: bool) -> Plan:
        c = self.cols
        return Plan(gpus=int(c["gpus"][i]), dp=int(c["dp"][i]), tp=int(c["tp"][i]),
                    pp=int(c["pp"][i]), micro_batch=int(c["micro_batch"][i]),
                    global_batch=int(c["global_batch"][i]),
                    schedule=SCHEDULES[int(c["schedule"][i])],
                    virtual_stages=int(c["virtual_stages"][i]),
                    sequence_parallel=bool(c["sequence_parallel"][i]),
                    recompute=RECOMPUTES[int(c["recompute"][i])], zero=int(c["zero"][i]),
                    dtype=dtype, flash_attention=flash, overlap_grad_sync=overlap,
                    placement=PLACEMENTS[int(c["placement"][i])],
                    tp_layout=LAYOUTS[int(c["tp_layout"][i])], tp_depth=int(c["tp_depth"][i]))


def _layouts(model: TransformerSpec, req: SearchRequest, tp: int) -> list[tuple[int, int, int]]:
    """(layout code, depth, samples a micro-batch is split over) of every tensor layout tp allows."""
    from perfmodel.strategy import integer_root

    out = []

    def grid_ok(q: int) -> bool:
        return all(x % q == 0 for x in (model.heads, model.hidden, model.ffn_hidden, model.kv_heads))

    for code, layout in enumerate(LAYOUTS):
        if req.tp_layout is not None and layout != req.tp_layout:
            continue
        if layout == "1d":
            if req.tp_depth in (None, 1) and not (
                    model.heads % tp or model.ffn_hidden % tp
                    or (model.kv_heads % tp and tp % model.kv_heads)):
                out.append((code, 1, 1))
        elif layout == "2d":
            q = integer_root(tp, 2)
            if tp > 1 and q and grid_ok(q) and req.tp_depth in (None, 1):
                out.append((code, 1, q))
        elif layout == "2.5d":
            for d in divisors(tp):
                q = integer_root(tp // d, 2)
                if d >= 2 and q and q > 1 and grid_ok(q) and req.tp_depth in (None, d):
                    out.append((code, d, q * d))
        else:
            q = integer_root(tp, 3)
            if tp > 1 and q and grid_ok(q) and req.tp_depth in (None, 1):
                out.append((code, 1, q * q))
    return out


def _degree_triples(model: TransformerSpec, req: SearchRequest) -> list[tuple[int, int, int, int]]:
    """(gpus, dp, tp, pp) that multiply out and divide the model and the batch."""
    out = []
    for gpus in req.gpus:
        for tp in divisors(gpus):
            if req.tp is not None and tp != req.tp or req.max_tp is not None and tp > req.max_tp:
                continue
            if not _layouts(model, req, tp):
                continue
            for pp in divisors(gpus // tp):
                if req.pp is not None and pp != req.pp or req.max_pp is not None and pp > req.max_pp:
                    continue
                if model.layers % pp:
                    continue
                dp = gpus // (tp * pp)
                if req.dp is not None and dp != req.dp or req.global_batch % dp:
                    continue
                out.append((gpus, dp, tp, pp))
    return out


def enumerate_plans(model: TransformerSpec, req: SearchRequest) -> Plans:
    """Every valid plan of the request, as columns."""
    rows: list[dict[str, np.ndarray]] = []
    for gpus, dp, tp, pp in _degree_triples(model, req):
        for layout, depth, split in _layouts(model, req, tp):
            rows.extend(_plans_of(model, req, gpus, dp, tp, pp, layout, depth, split))
    if not rows:
        return Plans({})
    return Plans({k: np.concatenate([r[k] for r in rows]) for k in rows[0]})


def _plans_of(model: TransformerSpec, req: SearchRequest, gpus: int, dp: int, tp: int, pp: int,
              layout: int, depth: int, split: int) -> list[dict[str, np.ndarray]]:
    """The plans of one (degrees, tensor layout): micro-batches, schedules, options, placements."""
    per_replica = req.global_batch // dp
    mbs = [b for b in divisors(per_replica)
           if (req.micro_batch is None or b == req.micro_batch)
           and (req.max_micro_batch is None or b <= req.max_micro_batch) and b % split == 0]
    scheds: list[tuple[int, int]] = []
    for code, name in enumerate(SCHEDULES):
        if req.schedule is not None and name != req.schedule:
            continue
        if name in ("interleaved", "zb"):
            if pp < 2:
                continue
            for v in divisors(model.layers // pp):
                if (v >= 2 or name == "zb") and req.virtual_stages in (None, v):
                    scheds.append((code, v))
        elif name == "zbv":
            if pp >= 2 and (model.layers // pp) % 2 == 0 and req.virtual_stages in (None, 2):
                scheds.append((code, 2))
        elif req.virtual_stages in (None, 1) and (name == "1f1b" or pp > 1):
            scheds.append((code, 1))  # with pp = 1 the schedules coincide: keep 1f1b
    recs = [i for i, r in enumerate(RECOMPUTES) if req.recompute in (None, r)]
    sps = [s for s in ((0, 1) if tp > 1 and layout == 0 else (0,))
           if req.sequence_parallel in (None, bool(s))]
    zeros = [z for z in ((0, 1, 2, 3) if dp > 1 else (0,)) if req.zero in (None, z)]
    places = [i for i, p in enumerate(PLACEMENTS) if req.placement in (None, p)]
    if req.placement is None:  # orders that differ only in an axis of degree 1 are the same
        seen, unique = set(), []
        for i in places:
            key = tuple(a for a in PLACEMENTS[i].split(",") if {"tp": tp, "dp": dp, "pp": pp}[a] > 1)
            if key not in seen:
                seen.add(key)
                unique.append(i)
        places = unique
    if not (mbs and scheds and recs and sps and zeros and places):
        return []
    grid = np.meshgrid(np.array(mbs), np.arange(len(scheds)), np.array(recs), np.array(sps),
                       np.array(zeros), np.array(places), indexing="ij")
    b, si, rc, spar, z, pl = (g.ravel() for g in grid)
    sched = np.array(scheds)[si]
    m = req.global_batch // (dp * b)
    ok = ((sched[:, 0] != 2) | (m % pp == 0)) & ((sched[:, 0] < 3) | (m >= pp))  # schedule rules
    n = int(ok.sum())
    return [{
        "gpus": np.full(n, gpus), "dp": np.full(n, dp), "tp": np.full(n, tp),
        "pp": np.full(n, pp), "micro_batch": b[ok], "global_batch": np.full(n, req.global_batch),
        "schedule": sched[ok, 0], "virtual_stages": sched[ok, 1], "recompute": rc[ok],
        "sequence_parallel": spar[ok], "zero": z[ok], "placement": pl[ok],
        "tp_layout": np.full(n, layout), "tp_depth": np.full(n, depth),
    }]


_TOPOLOGY_KEYS = ("tp", "dp", "pp", "tp_layout", "tp_depth", "placement")


def _topology(c: dict[str, np.ndarray], gpn: int) -> dict[str, np.ndarray]:
    """Grid sub-axes, ranks per node and link scope of every axis (rows of _TOPOLOGY_KEYS)."""
    vals: dict[str, np.ndarray] = {}
    layout = c["tp_layout"]
    tp = c["tp"]
    depth = c["tp_depth"]
    q_cube = np.rint(np.cbrt(tp)).astype(np.int64)
    q_square = np.rint(np.sqrt(tp // depth)).astype(np.int64)
    qa = np.where(layout == 0, 1, np.where(layout == 3, q_cube, q_square))
    qc = np.where(layout == 0, 1, np.where(layout == 3, q_cube, depth))
    vals.update({"tpa": qa, "tpb": qa, "tpc": qc,
                 "is_tp2d": ((layout == 1) | (layout == 2)).astype(float),
                 "is_tp3d": (layout == 3).astype(float)})
    degree = {"tp": tp, "dp": c["dp"], "pp": c["pp"], "tpa": qa, "tpb": qa, "tpc": qc}
    k_out = {a: np.ones(len(c["tp"]), dtype=np.int64) for a in degree}

    def per_node(n: np.ndarray, stride: np.ndarray) -> np.ndarray:
        k = np.where(stride >= gpn, 1, np.clip(gpn // np.maximum(stride, 1), 1, None))
        return np.minimum(k, n)

    for code, order in enumerate(PLACEMENTS):
        rows = c["placement"] == code
        stride = np.ones(len(c["tp"]), dtype=np.int64)
        for axis in order.split(","):
            n = degree[axis]
            k_out[axis] = np.where(rows, per_node(n, stride), k_out[axis])
            if axis == "tp":
                sub = stride.copy()
                for name in ("tpa", "tpb", "tpc"):
                    k_out[name] = np.where(rows, per_node(degree[name], sub), k_out[name])
                    sub = sub * degree[name]
            stride = stride * n
    for axis in ("tpa", "tpb", "tpc"):
        vals[f"{axis}_per_node"] = k_out[axis]
    for axis, n in degree.items():
        k = k_out[axis]
        vals[f"{axis}_per_node"] = k
        intra = k >= n
        inter = (k == 1) & ~intra
        vals[f"is_{axis}_intra"] = intra.astype(float)
        vals[f"is_{axis}_inter"] = inter.astype(float)
        vals[f"is_{axis}_mixed"] = (~intra & ~inter).astype(float)
    return vals


_AXES = ("tp", "dp", "pp", "tpa", "tpb", "tpc")
# The plan columns that vary in a search, in groups, with the symbols each group sets: the step
# model is evaluated once per distinct value of the groups each of its terms depends on (see
# perfmodel.staged); the topology comes first, as the axis whose values are the most numerous.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("topology", ("dp", "tp", "pp", "global_batch", "tpa", "tpb", "tpc", "is_tp2d", "is_tp3d",
                  *(f"{axis}_per_node" for axis in _AXES),
                  *(f"is_{axis}_{scope}" for axis in _AXES
                    for scope in ("intra", "inter", "mixed")))),
    ("micro_batch", ("micro_batch",)),
    ("schedule", ("virtual_stages", "is_gpipe", "is_interleaved", "is_zero_bubble", "is_zbv")),
    ("recompute", ("is_recompute_full", "is_recompute_selective")),
    ("sequence_parallel", ("is_sequence_parallel",)),
    ("zero", ("is_zero1", "is_zero2", "is_zero3")),
)
_GROUP_COLUMNS = {"topology": ("tp_layout", "tp_depth", "dp", "tp", "pp", "placement",
                               "global_batch"),  # sorted by layout first
                  "micro_batch": ("micro_batch",),
                  "schedule": ("schedule", "virtual_stages"), "recompute": ("recompute",),
                  "sequence_parallel": ("sequence_parallel",), "zero": ("zero",)}


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
    names = _GROUP_COLUMNS[group]
    columns = [np.asarray(plans.cols[k], dtype=np.intp) for k in names]
    if group in ("recompute", "sequence_parallel", "zero"):  # small codes already
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


def _group_args(group: str, c: dict[str, np.ndarray], gpus_per_node: int) -> dict[str, np.ndarray]:
    """The symbols a group of columns sets, from its distinct rows."""
    if group == "topology":
        args = {k: c[k] for k in ("dp", "tp", "pp", "global_batch")}
        args.update(_topology(c, gpus_per_node))
    elif group == "micro_batch":
        args = {"micro_batch": c["micro_batch"]}
    elif group == "schedule":
        sched = c["schedule"]
        args = {"virtual_stages": c["virtual_stages"], "is_gpipe": sched == 0,
                "is_interleaved": sched == 2, "is_zero_bubble": sched >= 3, "is_zbv": sched == 4}
    elif group == "recompute":
        args = {"is_recompute_full": c["recompute"] == 2,
                "is_recompute_selective": c["recompute"] == 1}
    elif group == "sequence_parallel":
        args = {"is_sequence_parallel": c["sequence_parallel"]}
    else:
        args = {f"is_zero{z}": c["zero"] >= z for z in (1, 2, 3)}
    return {k: np.asarray(v, dtype=float) for k, v in args.items()}


def group_values(hardware: HardwareSpec, plans: Plans) -> dict[str, GroupValues]:
    """The distinct values of each group of columns, their symbols, and each plan's row of them.

    The topology's rows are sorted by tensor layout first: the plans of one layout family have the
    rows of one range."""
    out = {}
    for group, _ in GROUPS:
        codes, card, rows = _distinct(group, plans)
        args = _group_args(group, rows, hardware.gpus_per_node)
        out[group] = GroupValues(codes, card, args, rows)
    return out


def scalar_values(model: TransformerSpec, hardware: HardwareSpec,
                  req: SearchRequest) -> dict[str, Any]:
    """The symbols that are one number for every plan of a request: model, hardware, dtype."""
    from perfmodel.evaluate import values_of

    probe = Plan(gpus=1, dtype=req.dtype, flash_attention=req.flash_attention,
                 overlap_grad_sync=req.overlap_grad_sync)
    return values_of(model, hardware, probe)


@dataclass
class SearchResult:
    request: SearchRequest
    plans: Plans
    step_time_s: np.ndarray
    memory_bytes: np.ndarray
    model_flops: np.ndarray
    feasible: np.ndarray
    objective: np.ndarray
    order: np.ndarray  # feasible plans, best first
    enumerated: int
    evaluated: int
    search_time_s: float
    capacity_bytes: float
    notes: list[str] = field(default_factory=list)

    def plan(self, i: int) -> Plan:
        r = self.request
        return self.plans.plan(int(i), r.dtype, r.flash_attention, r.overlap_grad_sync)

    def frame(self) -> Any:
        """Every evaluated plan as a pandas DataFrame."""
        import pandas as pd

        c = self.plans.cols
        df = pd.DataFrame({k: v for k, v in c.items()})
        df["schedule"] = [SCHEDULES[i] for i in c["schedule"]]
        df["recompute"] = [RECOMPUTES[i] for i in c["recompute"]]
        df["placement"] = [PLACEMENTS[i] for i in c["placement"]]
        df["sequence_parallel"] = c["sequence_parallel"].astype(bool)
        df["tp_layout"] = [LAYOUTS[i] for i in c["tp_layout"]]
        df["step_time_s"] = self.step_time_s
        df["memory_per_gpu_bytes"] = self.memory_bytes
        df["fits_in_memory"] = self.feasible
        df["objective"] = self.objective
        return df


def search(model: TransformerSpec, hardware: HardwareSpec, req: SearchRequest) -> SearchResult:
    """Enumerate, prune, evaluate and rank every plan of the request."""
    start = time.perf_counter()
    plans = enumerate_plans(model, req)
    enumerated = len(plans)
    capacity = hardware.memory_bytes * (1 - req.memory_margin) - hardware.memory_reserved_bytes
    notes: list[str] = []
    empty = np.zeros(0)
    if enumerated == 0:
        return SearchResult(req, plans, empty, empty, empty, empty.astype(bool), empty,
                            empty.astype(int), 0, 0, time.perf_counter() - start, capacity, notes)
    step, memory, flops, keep = evaluate_all(model, hardware, plans, req, capacity)
    evaluated = int(keep.sum())
    feasible = keep & (memory <= capacity)
    objective = _objective(req, model, step, plans)
    idx = np.flatnonzero(feasible)
    order = idx[np.lexsort((memory[idx], objective[idx]))]
    return SearchResult(req, plans, step, memory + hardware.memory_reserved_bytes, flops, feasible,
                        objective, order, enumerated, evaluated, time.perf_counter() - start,
                        capacity + hardware.memory_reserved_bytes, notes)


def evaluate_plans(model: TransformerSpec, hardware: HardwareSpec, groups: dict[str, GroupValues],
                   req: SearchRequest, family: Any,
                   capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Step time, memory per GPU, model FLOPs of every plan (as group_values gives them), and
    which passed the memory bound.

    The memory bound (model states alone must fit) first, then the full model on the plans that
    pass it; each evaluated term by term (see perfmodel.staged).
    """
    n = len(groups["topology"].codes)
    scalars = scalar_values(model, hardware, req)
    bounds = run(compile_staged(family, "bounds", GROUPS), scalars, groups, n)
    memory = np.maximum(bounds["states:first"], bounds["states:last"])
    keep = memory <= capacity  # model states alone must fit: a lower bound on memory
    step = np.full(n, np.inf)
    flops = np.zeros(n)
    idx = None if keep.all() else np.flatnonzero(keep)
    if idx is not None:
        if not len(idx):
            return step, memory, flops, keep
        groups = {g: values.take(idx) for g, values in groups.items()}
    m = n if idx is None else len(idx)
    out = run(compile_staged(family, "search", GROUPS), scalars, groups, m)
    rows = slice(None) if idx is None else idx
    step[rows] = out["step_time"]
    memory[rows] = np.maximum(out["memory:first"], out["memory:last"])
    flops[rows] = out["q:model_flops_per_step"]
    return step, memory, flops, keep


def evaluate_all(model: TransformerSpec, hardware: HardwareSpec, plans: Plans, req: SearchRequest,
                 capacity: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """evaluate_plans with one family per tensor layout: Megatron 1D (most plans, the smallest
    expression), the 2d/2.5d grids, the 3d cube."""
    n = len(plans)
    step, memory, flops = np.full(n, np.inf), np.zeros(n), np.zeros(n)
    keep = np.zeros(n, dtype=bool)
    if n == 0:
        return step, memory, flops, keep
    universal = family_of(model, hardware, Plan(gpus=1))
    groups = group_values(hardware, plans)
    topology = groups["topology"]
    layouts = topology.rows["tp_layout"]  # sorted
    for family_layout, codes in (("1d", (0,)), ("2d", (1, 2)), ("3d", (3,))):
        lo = int(np.searchsorted(layouts, codes[0]))
        hi = int(np.searchsorted(layouts, codes[-1], side="right"))
        if lo == hi:
            continue
        if lo == 0 and hi == topology.card:
            rows, index = slice(None), None
        else:
            rows = index = np.flatnonzero((topology.codes >= lo) & (topology.codes < hi))
        part = {g: (values.restrict(index, lo, hi) if g == "topology" else
                    values if index is None else values.take(index))
                for g, values in groups.items()}
        family = dataclasses.replace(universal, tp_layout=family_layout)
        result = evaluate_plans(model, hardware, part, req, family, capacity)
        for target, values in zip((step, memory, flops, keep), result, strict=True):
            target[rows] = values
    return step, memory, flops, keep


def _objective(req: SearchRequest, model: TransformerSpec, step: np.ndarray, plans: Plans) -> np.ndarray:
    """Seconds per step, seconds to train the token budget, or the price of that (or of a step)."""
    if req.objective is Objective.STEP_TIME:
        return step
    tokens_per_step = plans.cols["global_batch"] * model.seq_len
    seconds = step * (req.tokens / tokens_per_step) if req.tokens else step
    if req.objective is Objective.TIME_TO_TRAIN:
        return seconds
    return seconds / 3600 * plans.cols["gpus"] * req.gpu_hour_price
