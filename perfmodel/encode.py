"""The plan encoder, written once: a plan's columns -> the values of the step model's symbols.

`predict` encodes one plan (values_of), the search arrays of plans (perfmodel.search encodes the
distinct rows of each group of columns). A plan's columns (perfmodel.strategy.COLUMNS: degrees,
micro-batch, schedule, recompute, sequence parallelism, ZeRO stage, placement, tensor layout;
options as codes) fall into GROUPS; each group sets its own symbols, vectorised over numpy arrays.
The rest is one number for every plan of a request (fixed_values): the model, the hardware, the
dtype and the options every plan shares (fused attention, the software stack).

Every symbol a compiled family reads gets a value here; evaluate.Compiled and perfmodel.staged
refuse one that has none (an internal error naming it), never default it. Kept free of sympy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel import names as N
from perfmodel.costs.fp8 import fp8_bytes
from perfmodel.costs.precision import (
    model_state_bytes_per_param,
    optimizer_step_bytes_per_param,
    sharded_state_bytes_per_param,
)
from perfmodel.errors import PlanError
from perfmodel.specs.hardware import (
    FLASH_MAX_HEAD_DIM,
    LINK_PROTOCOLS,
    FlashAttention,
    GemmEfficiency,
    HardwareSpec,
)
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import (
    BYTES_PER_ELEMENT,
    CP_COMMS,
    LAYOUTS,
    PLACEMENTS,
    RECOMPUTES,
    SCHEDULES,
    CPComm,
    CrossEntropy,
    DpBucketing,
    Dtype,
    EPDispatcher,
    ExpertWeighting,
    Kernels,
    OptimizerKernels,
    Plan,
    PlanColumns,
    Recompute,
    RecomputeMethod,
    Schedule,
    Stack,
    TPLayout,
)

Columns = Mapping[str, np.ndarray]

GRID_AXES = ("tpa", "tpb", "tpc")  # the tensor-parallel grid's sub-axes, a innermost


def _code(options: tuple[Any, ...], option: Any) -> int:
    return options.index(option)


_1D, _3D = _code(LAYOUTS, TPLayout.ONE_D), _code(LAYOUTS, TPLayout.THREE_D)
_GRID_2D = (_code(LAYOUTS, TPLayout.TWO_D), _code(LAYOUTS, TPLayout.TWO_HALF_D))
# The step model's tensor layouts (perfmodel.family.Family.tp_layout) and the plans' layout codes
# each covers, in code order: 2.5d is the 2d grid with depth, the same formulas.
LAYOUT_FAMILIES: dict[str, tuple[int, ...]] = {"1d": (_1D,), "2d": _GRID_2D, "3d": (_3D,)}


def layout_family(layout: TPLayout) -> str:
    """The step model's tensor layout of a plan's (Family.tp_layout)."""
    code = _code(LAYOUTS, layout)
    return next(name for name, codes in LAYOUT_FAMILIES.items() if code in codes)


def grid_sides(c: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sub-axes (a, b, c) of the tensor-parallel grid: (q, q, 1) for 2d, (q, q, d) for 2.5d,
    (q, q, q) for 3d, (1, 1, 1) for 1d; q is PlanColumns.grid_q, d the depth."""
    layout = c["tp_layout"]
    q = np.where(layout == _1D, 1, PlanColumns(c).grid_q)
    third = np.where(layout == _1D, 1, np.where(layout == _3D, q, c["tp_depth"]))
    return q, q, third


def _ranks_per_node(n: np.ndarray, stride: np.ndarray, gpus_per_node: int | np.ndarray,
                    total: np.ndarray | None = None) -> np.ndarray:
    """Ranks of one group inside one node: a group of n ranks `stride` apart (ranks numbered
    node by node, G to a node) has min(n, G / stride) of them in a node, 1 once stride >= G.
    A group that fits in a node but whose span (n stride ranks) does not divide G, in a job of
    more than one node (`total` GPUs), lies in one node for some groups and straddles two for
    others (on 72-GPU NVLink domains, ranks 64-127: 8 in one, 56 in the next): it is costed as
    the straddling one, its ranks in two nodes, as evenly as a count dividing n allows (n / p,
    p the smallest prime factor of n)."""
    s = np.maximum(stride, 1)
    k = np.where(s >= gpus_per_node, 1, gpus_per_node // s)
    ranks: np.ndarray = np.maximum(1, np.minimum(n, k))
    if total is None:
        return ranks
    return _straddling(ranks, n, n * s, gpus_per_node, total)


def _straddling(ranks: np.ndarray, size: np.ndarray, span: np.ndarray,
                gpus_per_node: int | np.ndarray, total: np.ndarray) -> np.ndarray:
    """The ranks in a node of groups of `size` ranks that tile blocks of `span` (a one-axis
    group: n stride; one of several axes': its outermost part's degree x stride): where a block
    fits a node but does not divide it, in a job of more than one node, some groups straddle two
    nodes, costed with n / p of them in each (p the smallest prime factor of the size)."""
    g = gpus_per_node
    cross = (span <= g) & (g % np.maximum(span, 1) != 0) & (total > g) & (size > 1)
    if not cross.any():
        return ranks
    halves = np.vectorize(_largest_proper_divisor, otypes=[np.int64])(np.maximum(size, 2))
    return np.where(cross, np.maximum(1, np.minimum(ranks, halves)), ranks)


def _largest_proper_divisor(n: int) -> int:
    factor = next((f for f in range(2, math.isqrt(n) + 1) if n % f == 0), n)
    return n // factor


def job_domain(gpus: np.ndarray, gpus_per_node: int, gpus_per_host: int) -> np.ndarray:
    """The GPUs a job takes in each node (NVLink domain) where a domain spans several hosts
    (GB200 NVL72: 18 trays of 4): the same number in each, the largest multiple of the host's
    that divides the job and fits a domain (Megatron-Bridge's GB200 launcher sets Slurm's
    --segment to the largest divisor of the job's trays up to 18: 256 GPUs take 64 of each
    rack's 72, scripts/performance/utils/executors.py); a whole node where a host is one, or
    where no such multiple divides the job."""
    gpus = np.asarray(gpus)
    if gpus_per_host >= gpus_per_node:
        return np.full(gpus.shape, gpus_per_node)
    hosts = gpus // gpus_per_host
    out = np.full(gpus.shape, gpus_per_node)
    found = (gpus % gpus_per_host != 0)  # not whole hosts: whole nodes
    for count in range(gpus_per_node // gpus_per_host, 0, -1):
        take = ~found & (hosts % count == 0)
        out = np.where(take, count * gpus_per_host, out)
        found |= take
    return out


def check_whole_nodes(hardware: HardwareSpec, gpus: int) -> None:
    """A job over several nodes takes the same GPUs in each (job_domain): one whose last node is
    partly filled (12 GPUs on 8-GPU nodes) is refused, for its last node's links are shared by
    fewer GPUs than the others' and which ranks it holds is the launcher's choice."""
    node = hardware.gpus_per_node
    host = hardware.gpus_per_host or node
    taken = int(job_domain(np.asarray([gpus]), node, host)[0])
    if gpus <= taken or gpus % taken == 0:
        return
    unit, what = (host, f"hosts of {host} GPUs ({hardware.name}'s gpus_per_host)") \
        if host < node else (node, f"nodes of {node} GPUs ({hardware.name}'s gpus_per_node)")
    field = "levels[0].gpus" if hardware.levels else "gpus_per_node"  # (levels: it follows)
    raise PlanError(f"gpus {gpus} is not whole {what}: a job of several nodes is modelled with "
                    f"the same GPUs in each; give a multiple of {unit}, or a hardware spec "
                    f"(base: {hardware.name}) whose {field} is the GPUs the job takes in a "
                    "node")


def _column(c: Columns, name: str) -> np.ndarray:
    """A plan column, or ones where the columns lack it (cp and ep: a plan of issue 16)."""
    if name in c:
        return np.asarray(c[name])
    return np.ones(len(c["tp"]), dtype=np.int64)


def axis_ranks_per_node(c: Columns, gpus_per_node: int | np.ndarray
                        ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each axis (perfmodel.names.AXES): its degree and the ranks of one of its groups inside
    one node (gpus_per_node: the GPUs the job takes in one, job_domain, a number or one a plan).

    Ranks are numbered with the first axis of the placement varying fastest (cp right outside tp
    where the placement does not name it); a group of an axis holds ranks `stride` apart, stride =
    product of the degrees of the axes inside it. The tensor-parallel group is laid out as its
    grid's sub-axes a, b, c (a fastest). A group made of several axes' ranks (its sub-axes, each
    `stride_i` apart) has the product of theirs in a node:
        dp_cp  the dp x cp ranks of a replica (cp and dp);
        tp_dp_cp every rank of a pipeline stage (tp, cp and dp);
        etp    the ranks one expert's FFN is split over (expert tensor parallelism): etp
               consecutive ranks of the tp axis (etp divides tp);
        ep     the next ep ranks of a stage's tp x cp x dp ranks flattened tp inner, then cp,
               then dp: e_tp = min(ep, tp / etp) of the tp axis (etp strides apart), then
               e_cp = min(ep / e_tp, cp) of the cp axis, then e_dp = ep / (e_tp e_cp) of the dp
               axis (the plan rules make each share a whole sub-axis);
        etp_ep the etp x ep ranks (Megatron-Core's tp_ep group);
        edp    the ranks holding the same expert shards, the rest of each axis: tp / (etp e_tp)
               of the tp axis (etp e_tp strides apart), cp / e_cp of the cp axis (e_cp strides
               apart) and dp / e_dp of the dp axis (e_dp strides apart).
    This is Megatron-Core's expert rank order (megatron/core/parallel_state.py,
    initialize_model_parallel, NVIDIA/Megatron-LM d98e8a64dd: the expert RankGenerator has
    tp = expert_tensor_parallel_size, ep, dp = expert_data_parallel_size = world / (etp ep pp),
    cp = 1 and the order tp-cp-ep-dp-pp, over the same ranks as the dense RankGenerator's
    tp-cp-dp-pp). With etp 1 an ep group takes the attention's tp ranks first; with etp = tp it
    lies on the dp x cp ranks, cp inner.
    """
    sides = dict(zip(GRID_AXES, grid_sides(c), strict=True))
    cp, ep, etp = _column(c, "cp"), _column(c, "ep"), _column(c, "etp")
    degree = {"tp": c["tp"], "dp": c["dp"], "pp": c["pp"], "cp": cp, **sides}
    n = len(c["tp"])
    total = c["dp"] * c["tp"] * c["pp"] * cp  # the job's GPUs
    per_node = {axis: np.ones(n, dtype=np.int64) for axis in degree}
    # each axis's ranks a node by the tiling rule alone, for the groups made of several axes'
    # ranks (their parts straddle no boundary of their own: the group does, as a whole)
    plain = {axis: np.ones(n, dtype=np.int64) for axis in degree}
    stride = {axis: np.ones(n, dtype=np.int64) for axis in degree}
    placement = c["placement"]
    for code in sorted(set(placement.tolist())):  # (np.unique would import numpy.ma: 5 ms)
        rows = placement == code
        inner = np.ones(n, dtype=np.int64)
        for axis in PLACEMENTS[int(code)].order:
            per_node[axis] = np.where(
                rows, _ranks_per_node(degree[axis], inner, gpus_per_node, total), per_node[axis])
            plain[axis] = np.where(rows, _ranks_per_node(degree[axis], inner, gpus_per_node),
                                   plain[axis])
            stride[axis] = np.where(rows, inner, stride[axis])
            if axis == "tp":
                sub = inner
                for name in GRID_AXES:
                    per_node[name] = np.where(
                        rows, _ranks_per_node(degree[name], sub, gpus_per_node, total),
                        per_node[name])
                    sub = sub * degree[name]
            inner = inner * degree[axis]
    g = gpus_per_node

    def straddling(ranks: np.ndarray, size: np.ndarray, span: np.ndarray) -> np.ndarray:
        # a group of several axes' ranks straddles node boundaries as a one-axis group does (on
        # 72-GPU domains an ep group of 16 consecutive ranks, 64-79: 8 in each)
        return _straddling(ranks, size, span, g, total)

    def span_of(parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        # the block a group of (degree, stride) parts tiles: its widest part's degree x stride
        widest: np.ndarray = np.max([np.where(d > 1, d * st, 1) for d, st in parts], axis=0)
        return widest

    def joined(axes: tuple[str, ...]) -> np.ndarray:
        # a group of several axes' ranks: the tiling rule's product of theirs, straddling a node
        # boundary where its block does not divide a node (dp_cp with cp 1 is dp's group)
        product: np.ndarray = np.prod([plain[a] for a in axes], axis=0)
        size: np.ndarray = np.prod([degree[a] for a in axes], axis=0)
        return straddling(product, size, span_of([(degree[a], stride[a]) for a in axes]))

    degree["dp_cp"] = c["dp"] * cp
    per_node["dp_cp"] = joined(("cp", "dp"))
    degree["tp_dp_cp"] = c["tp"] * c["dp"] * cp
    per_node["tp_dp_cp"] = joined(("tp", "cp", "dp"))
    one = np.ones(n, dtype=np.int64)
    etp = np.maximum(one, etp)
    tp_rest = np.maximum(one, c["tp"] // etp)  # the tp ranks beyond one expert-tensor group
    e_tp = np.maximum(one, np.minimum(ep, tp_rest))
    e_cp = np.maximum(one, np.minimum(ep // e_tp, cp))
    e_dp = np.maximum(one, ep // (e_tp * e_cp))
    degree["etp"] = etp
    per_node["etp"] = _ranks_per_node(etp, stride["tp"], g, total)
    degree["ep"] = ep
    degree["etp_ep"] = etp * ep
    degree["edp"] = c["tp"] * c["dp"] * cp // np.maximum(ep * etp, 1)
    per_node["ep"] = one
    per_node["edp"] = one
    within = {"tp": etp, "cp": one, "dp": one}  # each axis's ranks inside the ep share
    shares = {"tp": e_tp, "cp": e_cp, "dp": e_dp}
    ep_parts, edp_parts = [], []
    for axis, share in shares.items():
        rest = np.maximum(one, degree[axis] // (within[axis] * share))
        step = stride[axis] * within[axis]
        per_node["ep"] = per_node["ep"] * _ranks_per_node(share, step, g)
        per_node["edp"] = per_node["edp"] * _ranks_per_node(rest, step * share, g)
        ep_parts.append((share, step))
        edp_parts.append((rest, step * share))
    # each group as a whole straddles node boundaries where its block does not divide a node
    per_node["ep"] = straddling(per_node["ep"], ep, span_of(ep_parts))
    per_node["edp"] = straddling(per_node["edp"], degree["edp"], span_of(edp_parts))
    per_node["etp_ep"] = straddling(per_node["etp"] * per_node["ep"], etp * ep,
                                    span_of([(etp, stride["tp"]), *ep_parts]))
    return {axis: (degree[axis], per_node[axis]) for axis in N.AXES}


@dataclass(frozen=True)
class Fabric:
    """What the plan encoder needs of the hardware's fabric (HardwareSpec.levels).

    sizes: the GPUs of one domain of each level but the top, innermost first (sizes[0]: the
    node, gpus_per_node). outer: for a fabric of more than two levels, outer[J - 1] the link
    values that price a group whose ranks reach level J, crossing levels 1..J
    (perfmodel.specs.hardware.crossed_link), as (suffix, value) pairs of outer_link_names;
    slowest[J - 1]: the level (1..J) whose bandwidth prices it, the slowest.
    Empty for two levels: the step model reads inter_node's symbols, one for every axis."""

    sizes: tuple[int, ...]
    outer: tuple[tuple[tuple[str, float], ...], ...] = ()
    slowest: tuple[int, ...] = ()
    host: int = 0  # GPUs one host drives where a node spans several (job_domain); 0: a node

    def domains(self, c: Columns) -> list[np.ndarray]:
        """The GPUs a plan takes in one domain of each level but the top (job_domain: a
        level's domains hold the same number of nodes, each as many of the job's GPUs)."""
        node = self.sizes[0]
        if not self.host or self.host >= node:
            return [np.full(len(c["tp"]), size) for size in self.sizes]
        gpus = c["dp"] * c["tp"] * c["pp"] * _column(c, "cp")
        taken = job_domain(gpus, node, self.host)
        return [taken * (size // node) for size in self.sizes]


OUTER_SUFFIXES = ("latency_s", "bandwidth", "call_latency_s",
                  *(f"{p}_{part}" for p in LINK_PROTOCOLS
                    for part in ("call_latency_s", "latency_s", "bandwidth_fraction")))


def fabric_of(hardware: HardwareSpec | int) -> Fabric:
    """The encoder's view of a hardware's fabric (an int: gpus_per_node of a two-level one)."""
    if isinstance(hardware, int):
        return Fabric((hardware,))
    host = hardware.gpus_per_host or 0
    levels = hardware.levels
    if len(levels) <= 2:
        return Fabric((hardware.gpus_per_node,), host=host)
    from perfmodel.specs.hardware import crossed_link

    node = hardware.gpus_per_node
    share = [lv.gpu_share_bytes_per_s for lv in levels[1:]]
    # the slowest of levels 1..J: the lowest share, the outermost on a tie
    slowest = tuple(1 + min(range(j), key=lambda i: (share[i], -i))
                    for j in range(1, len(share) + 1))
    outer = []
    for j in range(1, len(levels)):  # a group that reaches level j crosses levels 1..j
        link = crossed_link(levels[1:j + 1], node)
        vals = {"latency_s": link.latency_s,
                # per node, as inter_bandwidth: the slowest GPU's share times a node's GPUs
                "bandwidth": share[slowest[j - 1] - 1] * node,
                "call_latency_s": link.call_latency_s}
        for name in LINK_PROTOCOLS:
            proto = link.protocol(name)
            vals[f"{name}_call_latency_s"] = proto.call_latency_s if proto else link.call_latency_s
            vals[f"{name}_latency_s"] = proto.latency_s if proto else link.latency_s
            vals[f"{name}_bandwidth_fraction"] = proto.bandwidth_fraction if proto else 1.0
        outer.append(tuple((k, float(vals[k])) for k in OUTER_SUFFIXES))
    sizes = tuple(int(lv.gpus or 0) for lv in levels[:-1])
    return Fabric(sizes, tuple(outer), slowest, host)


def axis_levels(c: Columns, fabric: Fabric) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each axis: the fabric level its group reaches (0: inside a node; J: the smallest
    level one of whose domains holds the group, the top if none) and the level whose link
    prices it beyond the node (the slowest of 1..J; 1 for a group inside a node)."""
    domains = fabric.domains(c)
    degrees = axis_ranks_per_node(c, domains[0])
    reach = {axis: np.where(per_node >= degree, 0, len(fabric.sizes))
             for axis, (degree, per_node) in degrees.items()}
    for j in range(len(fabric.sizes) - 1, 0, -1):  # outermost first: the smallest level wins
        for axis, (degree, per_level) in axis_ranks_per_node(c, domains[j]).items():
            reach[axis] = np.where((reach[axis] > 0) & (per_level >= degree), j, reach[axis])
    slowest = np.array((1, *fabric.slowest)) if fabric.slowest else np.array((1, 1))
    return {axis: (level, slowest[level]) for axis, level in reach.items()}


def outer_link_values(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    """The link symbols of each axis's group beyond its node (a fabric of more than two levels):
    the values of the levels its ranks cross, the slowest one's bandwidth and the most latency
    (perfmodel.names: {axis}_outer_*; a group inside its node reads none of them)."""
    if not fabric.outer:
        return {}
    table = np.array([[v for _, v in level] for level in fabric.outer])  # (levels, suffixes)
    out = {}
    for axis, (reach, _) in axis_levels(c, fabric).items():
        rows = table[np.maximum(reach, 1) - 1]
        out.update({f"{axis}_outer_{suffix}": rows[:, i]
                    for i, suffix in enumerate(OUTER_SUFFIXES)})
    return out


def scope_of(degree: np.ndarray, per_node: np.ndarray) -> dict[str, np.ndarray]:
    """Where a group's ranks lie, as one boolean per scope: intra (all in one node), inter (one
    per node), mixed (several nodes, several ranks in each)."""
    intra = per_node >= degree
    inter = (per_node == 1) & ~intra
    return {"intra": intra, "inter": inter, "mixed": ~intra & ~inter}


# --- the groups of plan columns and the symbols each sets -------------------------------------


def _topology(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    """Degrees, batch, the grid's sub-axes and layout, each axis's ranks per node and scope, and
    (a fabric of more than two levels) the link its group crosses beyond the node."""
    gpus_per_node = fabric.domains(c)[0]
    out = {k: c[k] for k in ("dp", "tp", "pp", "global_batch")}
    out.update(cp=_column(c, "cp"), ep=_column(c, "ep"), etp=_column(c, "etp"))
    out.update(zip(GRID_AXES, grid_sides(c), strict=True))
    out["is_tp2d"] = np.isin(c["tp_layout"], _GRID_2D)
    out["is_tp3d"] = c["tp_layout"] == _3D
    for axis, (degree, per_node) in axis_ranks_per_node(c, gpus_per_node).items():
        out[f"{axis}_per_node"] = per_node
        out.update({f"is_{axis}_{scope}": flag
                    for scope, flag in scope_of(degree, per_node).items()})
    out.update(outer_link_values(c, fabric))
    return out


def _cp_comm(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    code = c["cp_comm"]
    return {f"is_cp_{comm.value}": code == _code(CP_COMMS, comm) for comm in CPComm}


def _micro_batch(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    return {"micro_batch": c["micro_batch"]}


def _schedule(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    code = c["schedule"]
    return {"virtual_stages": c["virtual_stages"],
            "is_gpipe": code == _code(SCHEDULES, Schedule.GPIPE),
            "is_interleaved": code == _code(SCHEDULES, Schedule.INTERLEAVED),
            "is_zero_bubble": np.isin(code, [_code(SCHEDULES, Schedule.ZERO_BUBBLE),
                                             _code(SCHEDULES, Schedule.ZBV)]),
            "is_zbv": code == _code(SCHEDULES, Schedule.ZBV)}


def _recompute(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    code = c["recompute"]
    return {"is_recompute_full": code == _code(RECOMPUTES, Recompute.FULL),
            "is_recompute_selective": code == _code(RECOMPUTES, Recompute.SELECTIVE),
            "is_recompute_op": code == _code(RECOMPUTES, Recompute.OP)}


def _sequence_parallel(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    return {"is_sequence_parallel": c["sequence_parallel"]}


def _zero(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    return {f"is_zero{stage}": c["zero"] >= stage for stage in (1, 2, 3)}


def _overlap(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    return {f"is_{k}": c[k] for k in ("tp_comm_overlap", "overlap_grad_sync",
                                      "overlap_param_gather", "ep_comm_overlap")}


def _stage_layers(c: Columns, fabric: Fabric) -> dict[str, np.ndarray]:
    return {k: c[k] for k in ("first_stage_layers", "last_stage_layers")}


@dataclass(frozen=True)
class Group:
    """Plan columns that vary together in a search, and the symbols they set (`encode`, over the
    columns' arrays and the hardware's fabric)."""

    name: str
    columns: tuple[str, ...]
    symbols: tuple[str, ...]
    encode: Callable[[Columns, Fabric], dict[str, np.ndarray]]
    # symbols it sets only for some hardware (a fabric of more than two levels)
    optional: tuple[str, ...] = ()


_TOPOLOGY_SYMBOLS = ("dp", "tp", "pp", "cp", "ep", "etp", "global_batch", *GRID_AXES, "is_tp2d",
                     "is_tp3d",
                     *(f"{axis}_per_node" for axis in N.AXES),
                     *(f"is_{axis}_{scope}" for axis in N.AXES for scope in N.SCOPES))
_OUTER_SYMBOLS = tuple(f"{axis}_outer_{suffix}" for axis in N.AXES for suffix in OUTER_SUFFIXES)
# The topology comes first: its values are the most numerous (perfmodel.staged's axis order).
GROUPS: tuple[Group, ...] = (
    Group("topology", ("tp_layout", "tp_depth", "dp", "tp", "pp", "cp", "ep", "etp", "placement",
                       "global_batch"), (*_TOPOLOGY_SYMBOLS, *_OUTER_SYMBOLS), _topology,
          optional=_OUTER_SYMBOLS),
    Group("micro_batch", ("micro_batch",), ("micro_batch",), _micro_batch),
    Group("schedule", ("schedule", "virtual_stages"),
          ("virtual_stages", "is_gpipe", "is_interleaved", "is_zero_bubble", "is_zbv"), _schedule),
    Group("recompute", ("recompute",),
          ("is_recompute_full", "is_recompute_selective", "is_recompute_op"), _recompute),
    Group("sequence_parallel", ("sequence_parallel",), ("is_sequence_parallel",),
          _sequence_parallel),
    Group("zero", ("zero",), ("is_zero1", "is_zero2", "is_zero3"), _zero),
    Group("overlap", ("tp_comm_overlap", "overlap_grad_sync", "overlap_param_gather",
                      "ep_comm_overlap"),
          ("is_tp_comm_overlap", "is_overlap_grad_sync", "is_overlap_param_gather",
           "is_ep_comm_overlap"), _overlap),
    Group("stage_layers", ("first_stage_layers", "last_stage_layers"),
          ("first_stage_layers", "last_stage_layers"), _stage_layers),
    Group("cp_comm", ("cp_comm",), tuple(f"is_cp_{comm.value}" for comm in CPComm), _cp_comm),
)
PLAN_SYMBOLS = frozenset(name for group in GROUPS for name in group.symbols)


def encode_group(group: Group, columns: Columns,
                 fabric: Fabric | HardwareSpec | int) -> dict[str, np.ndarray]:
    """The symbols one group sets, as float arrays, from arrays of its columns, on a hardware's
    fabric (fabric_of: an int is the gpus_per_node of a two-level one)."""
    if not isinstance(fabric, Fabric):
        fabric = fabric_of(fabric)
    out = group.encode({k: np.asarray(columns[k]) for k in group.columns}, fabric)
    if not set(group.symbols) - set(group.optional) <= out.keys() <= set(group.symbols):
        raise AssertionError(f"group {group.name} sets {sorted(out)}, declares "
                             f"{sorted(group.symbols)}")
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def encode_plans(columns: Columns,
                 fabric: Fabric | HardwareSpec | int) -> dict[str, np.ndarray]:
    """Every plan symbol of arrays of plans (columns of perfmodel.strategy.COLUMNS)."""
    if not isinstance(fabric, Fabric):
        fabric = fabric_of(fabric)
    out: dict[str, np.ndarray] = {}
    for group in GROUPS:
        out.update(encode_group(group, columns, fabric))
    return out


def plan_arrays(plan: Plan) -> dict[str, np.ndarray]:
    """One plan's columns as arrays of one row."""
    return {k: np.array([v]) for k, v in plan.columns().columns.items()}


def axis_per_node(plan: Plan, hardware: HardwareSpec | int) -> dict[str, tuple[int, str]]:
    """For each axis of one plan: ranks of one group inside one node, and the scope (intra,
    inter, mixed); see axis_ranks_per_node (the node the job's share of one: job_domain)."""
    out = {}
    arrays = plan_arrays(plan)
    taken = fabric_of(hardware).domains(arrays)[0]
    for axis, (degree, per_node) in axis_ranks_per_node(arrays, taken).items():
        scope = next(s for s, flag in scope_of(degree, per_node).items() if flag[0])
        out[axis] = (int(per_node[0]), scope)
    return out


def grid_degrees(plan: Plan) -> tuple[int, int, int]:
    """The sub-axes (a, b, c) of one plan's tensor-parallel grid (see grid_sides)."""
    a, b, c = grid_sides(plan_arrays(plan))
    return int(a[0]), int(b[0]), int(c[0])


# --- what every plan of a request shares --------------------------------------------------------


def precision_of(dtype: Dtype) -> str:
    """The precision of the model states: bf16 and fp16 mixed precision (fp8 training keeps bf16
    mixed precision's: Transformer Engine casts the bf16 weights to FP8 for its GEMMs), else
    fp32."""
    if dtype is Dtype.FP8:
        return "bf16"
    return dtype.value if dtype in (Dtype.BF16, Dtype.FP16) else "fp32"


def compute_dtype(dtype: Dtype | str) -> str:
    """The dtype of the kernels that do not run in FP8: an fp8 plan's attention, norms,
    element-wise kernels, embedding and output layer run in bf16 (its mixed precision,
    perfmodel.costs.fp8); any other plan runs everything in its dtype."""
    dtype = Dtype(dtype)
    return "bf16" if dtype is Dtype.FP8 else dtype.value


def link_features(hardware: HardwareSpec) -> frozenset[str]:
    """The parts of the hardware's link model the step model's expressions hold (Family):
    "intra:call" (a call start-up), "intra:ll" / "intra:ll128" (a low-latency protocol),
    "intra:nvls" (NVLink SHARP all-reduce), "intra:host_link" (the node's link is the GPU's host
    link, which its NIC traffic crosses too: all-to-all over nodes shares it), and "inter:..."
    likewise."""
    out = set()
    outer = hardware.levels[1:] or (hardware.inter_node,)  # a fabric's levels above the node
    for link, spec in (("intra", hardware.intra_node), *(("inter", lv) for lv in outer)):
        if spec.call_latency_s > 0:
            out.add(f"{link}:call")
        out.update(f"{link}:{p.name}" for p in spec.protocols)
        if spec.has_nvls:
            out.add(f"{link}:nvls")
        if spec.shares_host_link:  # intra_node only (HardwareSpec refuses it elsewhere)
            out.add(f"{link}:host_link")
    return frozenset(out)


def link_values(hardware: HardwareSpec) -> dict[str, float]:
    """The link model's symbols by name (perfmodel.names): latency per step, effective
    bandwidth and call start-up of each link, and of each low-latency protocol its call, step and
    bandwidth fraction (a protocol a link lacks takes the Simple protocol's values: the same
    option twice), and NVLS's latency and fraction (1 where the link has none: never used)."""
    vals: dict[str, float] = {}
    for link, spec in (("intra", hardware.intra_node), ("inter", hardware.inter_node)):
        vals[f"{link}_latency_s"] = spec.latency_s
        vals[f"{link}_bandwidth"] = spec.effective_bandwidth_bytes_per_s
        vals[f"{link}_call_latency_s"] = spec.call_latency_s
        for name in LINK_PROTOCOLS:
            proto = spec.protocol(name)
            vals[f"{link}_{name}_call_latency_s"] = (proto.call_latency_s if proto
                                                     else spec.call_latency_s)
            vals[f"{link}_{name}_latency_s"] = proto.latency_s if proto else spec.latency_s
            vals[f"{link}_{name}_bandwidth_fraction"] = proto.bandwidth_fraction if proto else 1.0
    nvls = hardware.intra_node
    vals["intra_nvls_latency_s"] = nvls.nvls_latency_s
    vals["intra_nvls_bandwidth_fraction"] = nvls.nvls_bandwidth_fraction if nvls.has_nvls else 1.0
    return vals


def resolve_flash(flash_attention: bool | None, model: TransformerSpec, hardware: HardwareSpec,
                  dtype: Dtype | str, kernel: str | None = None) -> bool:
    """Whether a plan attends with a fused (flash) kernel.

    None (the default): yes where the hardware has a measured flash kernel for the dtype
    (HardwareSpec.flash_attention: FlashAttention-2 on A100, cuDNN on H100/H200) and the model's
    head size is one flash kernels run (<= 256); else the unfused path. True on hardware that has
    no flash kernel (its spec lists no dtypes: V100), or with a larger head size than its
    kernel runs, is refused; True where no kernel is measured for the dtype (a CPU, MI300X, fp32
    on an H100) costs the fused kernel's FLOPs at the GEMM efficiency, which predict's notes
    say
    (perfmodel.step.layer.flash_attention). A named kernel (Plan.attention_kernel: one of
    HardwareSpec.flash_attention_names) is flash attention by that kernel: refused where the
    hardware has none so named, it does not run the dtype, or the plan attends unfused."""
    dtype = compute_dtype(dtype)
    if kernel:
        if flash_attention is False:
            raise PlanError(f"attention_kernel {kernel} names a flash kernel, and the plan "
                            "attends unfused: leave one of them out")
        named = hardware.named_flash_kernel(kernel)
        if not named.runs(dtype):
            raise PlanError(f"attention_kernel {kernel}: {hardware.name}'s {named.kernel} is "
                            f"measured for {', '.join(named.dtypes)}, not {dtype}")
        # the kernel's own limit (FlashAttention.max_head_dim: flash-attn's Triton kernel stops
        # at 128, the others at FLASH_MAX_HEAD_DIM), refused as a head size above 256 is
        if model.attention_head_dim > named.max_head_dim:
            raise PlanError(f"attention_kernel {kernel}: head_dim {model.attention_head_dim} is "
                            f"above {_head_limit(named, hardware)}; "
                            + ("name another kernel (`perfmodel presets` lists them) or "
                               if named.max_head_dim < FLASH_MAX_HEAD_DIM else "")
                            + "leave the kernel out and use --attention unfused")
        return True
    fa = hardware.flash_attention
    measured = hardware.flash_kernel(dtype)
    if flash_attention is None:
        return measured is not None and model.attention_head_dim <= measured.max_head_dim
    if flash_attention and fa is not None and not fa.dtypes:
        raise PlanError(f"flash_attention: hardware '{hardware.name}' has no flash-attention "
                        f"kernel ({fa.kernel}); use --attention unfused")
    # a measured kernel's limit; where none is measured (PyTorch's SDPA on a CPU, which the
    # local validation job runs, or its memory-efficient kernel in fp32) no limit is known
    if flash_attention and measured is not None \
            and model.attention_head_dim > measured.max_head_dim:
        raise PlanError(f"flash_attention: head_dim {model.attention_head_dim} is above "
                        f"{_head_limit(measured, hardware)}; use --attention unfused")
    return bool(flash_attention)


def _head_limit(kernel: FlashAttention, hardware: HardwareSpec) -> str:
    """The largest head size `kernel` runs, in words: 'the 256 flash kernels run' (every kernel's
    limit, FLASH_MAX_HEAD_DIM), else the kernel's own (FlashAttention.max_head_dim) naming it."""
    if kernel.max_head_dim >= FLASH_MAX_HEAD_DIM:
        return f"the {FLASH_MAX_HEAD_DIM} flash kernels run"
    return (f"{kernel.max_head_dim}, the largest head size {hardware.name}'s {kernel.kernel} "
            "runs (its max_head_dim)")


def flash_values(model: TransformerSpec, hardware: HardwareSpec, dtype: str,
                 name: str | None = None) -> dict[str, float]:
    """The flash kernel's symbols at the model's head size (HardwareSpec.flash_attention.at, or
    the kernel called `name`), its max fractions times the kernel's sustained_fraction (what it
    sustains back to back at the power cap; 1 where not measured); where no kernel is measured
    for the dtype, flash_measured 0 (and 1 for its unused parameters, so that no 0 divides)."""
    kernel = hardware.flash_kernel(dtype, name)
    if kernel is None:
        point = dict(flash_measured=0.0, flash_forward_max_fraction=1.0,
                     flash_forward_half_seq=1.0, flash_backward_max_fraction=1.0,
                     flash_backward_half_seq=1.0)
        return point
    at = kernel.at(model.attention_head_dim)
    sustained = kernel.sustained_fraction  # its rate back to back at the power cap
    return {"flash_measured": 1.0,
            "flash_forward_max_fraction": at.forward_max_fraction * sustained,
            "flash_forward_half_seq": at.forward_half_seq,
            "flash_backward_max_fraction": at.backward_max_fraction * sustained,
            "flash_backward_half_seq": at.backward_half_seq}


def gemm_values(gemm: GemmEfficiency, names: Mapping[str, str]) -> dict[str, float]:
    """The symbols of one GEMM efficiency fit (names: perfmodel.names.GEMM or FP8_GEMM); the
    callers pass HardwareSpec.training_gemm, the ceilings at the throughput the part sustains in
    training (sustained_clock_fraction: the GEMMs', not the other kernels')."""
    vals = {names[fld.name]: float(getattr(gemm, fld.name)) for fld in dataclasses.fields(gemm)}
    # no large-tile kernel: a threshold no GEMM reaches (perfmodel.costs.gemm_efficiency.at_least);
    # no split-K: any chunk (k / chunk is computed, then multiplied by 0), but not 0
    vals[names["large_flops"]] = gemm.large_flops or math.inf
    if not gemm.splits_k:
        vals[names["split_k_chunk"]] = 1.0
    return vals


def fp8_values(hardware: HardwareSpec, recipe: str | None,
               fp8_params: bool = False) -> dict[str, float]:
    """The symbols of FP8 training (perfmodel.costs.fp8) on this hardware with this recipe (None:
    the hardware's default): the FP8 peak and GEMM fit, and the bytes of the recipe's operands,
    casts, weight copies (and their casts each step), saved inputs and scaling state."""
    recipe = hardware.fp8_recipe(recipe)
    b = fp8_bytes(recipe, hardware.fp8_transpose, BYTES_PER_ELEMENT[Dtype.FP8], fp8_params)
    return {"fp8_peak_flops_per_s": hardware.peak("fp8"),
            "fp8_operand_bytes": b.operand,
            "fp8_quantize_bytes": b.quantize, "fp8_weight_copy_bytes": b.weight_copy,
            "fp8_weight_cast_bytes": b.weight_cast,
            "fp8_saved_bytes": b.saved, "fp8_scaling_state_bytes": b.scaling_state,
            "fp8_gather_bytes": b.gather, "fp8_gathered_transpose_bytes": b.gathered_transpose,
            **gemm_values(hardware.training_gemm("fp8"), N.FP8_GEMM)}


def window_values(model: TransformerSpec) -> dict[str, float]:
    """The sliding window's symbols (perfmodel.costs.compute.windowed_pairs): the window and the
    share of the layers it applies to; none for a model without one shorter than its sequence."""
    if not model.windowed_share:
        return {}
    return {"window": float(model.sliding_window or 0), "windowed_share": model.windowed_share}


def rotary_values(model: TransformerSpec) -> dict[str, float]:
    """The share of each head RoPE rotates (perfmodel.costs.compute.eager_rope_bytes); none for
    a model whose RoPE rotates whole heads, or that has no RoPE."""
    if model.rotary_fraction >= 1:
        return {}
    return {"rotary_fraction": model.rotary_fraction}


def optimizer_step_bytes(hardware: HardwareSpec, precision: str, grad_dtype: str | None,
                         optimizer_dtype: str | None, master_weights: str | None,
                         kernels: OptimizerKernels) -> float:
    """The optimizer step's bytes per parameter at the hardware's optimizer rate: the fused
    kernel's count (perfmodel.costs.precision.optimizer_step_bytes_per_param) times what the
    plan's kernels move over what the kernels the rate was measured on move
    (HardwareSpec.optimizer_kernels; a rate not measured is one fused pass's):
        e_step = bytes_fused x bytes_plan / bytes_measured
    so that a foreach step on a preset costs its passes, and a profile that measured foreach
    steps (calibrate run on CPU ranks) prices a foreach plan as measured."""
    measured = hardware.optimizer_kernels if hardware.optimizer_bandwidth_efficiency \
        else OptimizerKernels.FUSED.value

    def count(k: str) -> int:
        return optimizer_step_bytes_per_param(precision, grad_dtype, optimizer_dtype,
                                              master_weights, kernels=k)

    return count("fused") * count(kernels.value) / count(measured)


def fixed_values(model: TransformerSpec, hardware: HardwareSpec, dtype: Dtype | str, *,
                 flash_attention: bool, stack: Stack | str = Stack.EAGER,
                 kernels: Kernels | str = Kernels.FUSED,
                 recompute_every: int = 1, recompute_method: str = "uniform",
                 recompute_num_layers: int = 1, cpu_offload_layers: int = 0,
                 dp_bucket_size: int | None = None, dp_bucketing: str = "megatron",
                 attention_kernel: str | None = None, grad_dtype: str | None = None,
                 optimizer_dtype: str | None = None, master_weights: str | None = None,
                 fp8_recipe: str | None = None, fp8_params: bool = False,
                 ep_dispatcher: EPDispatcher | str = EPDispatcher.ALLTOALL,
                 cross_entropy: CrossEntropy | str = CrossEntropy.UNFUSED,
                 expert_weighting: ExpertWeighting | str = ExpertWeighting.ACTIVATION,
                 expandable_segments: bool = False,
                 optimizer_kernels: OptimizerKernels | str = OptimizerKernels.FUSED
                 ) -> dict[str, float]:
    """The symbols that are one number for every plan of a request: the model, the hardware,
    the dtype, and the options every plan shares (fused attention, the software stack, ...). An
    fp8 plan's peak and GEMM fit are bf16's (what does not run in FP8) and its FP8 GEMMs have
    their own (fp8_values)."""
    dtype, stack, kernels = Dtype(dtype), Stack(stack), Kernels(kernels)
    if cpu_offload_layers and not hardware.host_link_bytes_per_s:
        raise PlanError(f"cpu_offload_layers {cpu_offload_layers}: hardware '{hardware.name}' "
                        "gives no host_link_bytes_per_s (the GPU's link to host memory the "
                        "activations are copied over); add it to the hardware spec")
    fp8 = fp8_values(hardware, fp8_recipe, fp8_params) if dtype is Dtype.FP8 else {}  # first
    gemm = hardware.training_gemm(compute_dtype(dtype))
    precision = precision_of(dtype)
    state = model_state_bytes_per_param(precision, grad_dtype, optimizer_dtype, master_weights)
    sharded = sharded_state_bytes_per_param(precision, grad_dtype, optimizer_dtype,
                                            master_weights)
    vals: dict[str, float] = {
        "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
        "kv_heads": model.kv_heads, "ffn_hidden": model.ffn_hidden, "head_dim": model.head_dim,
        "seq_len": model.seq_len, "vocab": model.vocab,
        **architecture_values(model),
        "bytes_per_element": BYTES_PER_ELEMENT[dtype],
        "weight_bytes_per_param": state["weights"],
        "grad_bytes_per_param": state["gradients"],
        "optimizer_bytes_per_param": state["optimizer_states"],
        "sharded_weight_bytes_per_param": sharded["weights"],
        "sharded_optimizer_bytes_per_param": sharded["optimizer_states"],
        "optimizer_step_bytes_per_param": optimizer_step_bytes(
            hardware, precision, grad_dtype, optimizer_dtype, master_weights,
            OptimizerKernels(optimizer_kernels)),
        # the datasheet's peak (bf16's for what an fp8 plan does not run in FP8); the GEMMs'
        # ceilings carry the throughput the part sustains (gemm_values)
        "peak_flops_per_s": hardware.peak(compute_dtype(dtype)),
        "memory_bandwidth_bytes_per_s": hardware.memory_bandwidth_bytes_per_s
        * hardware.memory_bandwidth_efficiency,
        "optimizer_bandwidth_bytes_per_s": hardware.memory_bandwidth_bytes_per_s
        * (hardware.optimizer_bandwidth_efficiency or hardware.memory_bandwidth_efficiency),
        "kernel_overhead_s": hardware.kernel_overhead_s,
        "collective_overhead_s": hardware.collective_overhead_s,
        "host_op_overhead_s": hardware.host_op_overhead_s or hardware.kernel_overhead_s,
        "host_op_backward_overhead_s": hardware.host_op_backward_overhead_s
        or hardware.host_op_overhead_s or hardware.kernel_overhead_s,
        "kernel_overhead_tp_s": hardware.kernel_overhead_tp_s,
        "optimizer_overhead_s": hardware.optimizer_overhead_s,
        "gpus_per_node": hardware.gpus_per_node,
        "ranks_per_device": hardware.ranks_per_device,
        "overlap_compute_slowdown": hardware.overlap_compute_slowdown,
        "fsdp_forward_overhead_s": hardware.fsdp_forward_overhead_s,
        "fsdp_backward_overhead_s": hardware.fsdp_backward_overhead_s,
        "fsdp_reduce_overhead_s": hardware.fsdp_reduce_overhead_s,
        **link_values(hardware),
        "nccl_buffer_bytes": hardware.nccl_buffer_bytes,
        # expandable segments leave no fragmentation to count (Plan.expandable_segments)
        "memory_fragmentation": 0.0 if expandable_segments else hardware.memory_fragmentation,
        **flash_values(model, hardware, compute_dtype(dtype), attention_kernel),
        "recompute_every": recompute_every,
        "recompute_num_layers": recompute_num_layers,
        "recompute_block": float(RecomputeMethod(recompute_method) is RecomputeMethod.BLOCK),
        "cpu_offload_layers": cpu_offload_layers,
        # 0: Megatron-Core's default rule (perfmodel.step.data_parallel.bucket_size)
        "dp_bucket_size": dp_bucket_size or 0,
        "dp_bucket_all": float(DpBucketing(dp_bucketing) is DpBucketing.ALL),
        # 1 where not given: a family without offloading never divides by it
        "host_link_bytes_per_s": hardware.host_link_bytes_per_s or 1.0,
        "pipeline_flushes": 1.0,  # one schedule a step (a plan with more: values_of)
        **window_values(model),
        **rotary_values(model),
    }
    vals.update(fp8)
    flags = {
        "flash": flash_attention, "stack_compiled": stack is Stack.COMPILED,
        "stack_graphs": stack is Stack.CUDA_GRAPHS,
        "ep_deepep": EPDispatcher(ep_dispatcher) is EPDispatcher.DEEPEP,
        "cross_entropy_te": CrossEntropy(cross_entropy) is CrossEntropy.TE,
        "cross_entropy_no_upcast": CrossEntropy(cross_entropy) is CrossEntropy.NO_UPCAST,
        "cross_entropy_torch": CrossEntropy(cross_entropy) is CrossEntropy.TORCH,
        "cross_entropy_native": CrossEntropy(cross_entropy) is CrossEntropy.NATIVE,
        "cross_entropy_flash": CrossEntropy(cross_entropy) is CrossEntropy.FLASH_ATTN,
        "moe_weighted_activation":
            ExpertWeighting(expert_weighting) is ExpertWeighting.ACTIVATION,
        "kernels_eager": kernels is Kernels.EAGER, "kernels_compiled": kernels is Kernels.COMPILED,
        "gated": model.gated_mlp, "bias": model.bias, "qkv_bias": bool(model.qkv_bias),
        "layernorm": model.norm == "layernorm", "tied": model.tied_embeddings,
        "learned_positions": model.position_embedding == "learned",
        "rotary_positions": model.position_embedding == "rotary",
    }
    vals.update({N.FLAGS[option]: float(value) for option, value in flags.items()})
    vals.update(gemm_values(gemm, N.GEMM))
    for cost in hardware.layer_costs:
        vals.update(zip(N.layer_cost_names(cost.part, cost.style, cost.tp),
                        (getattr(cost, name) for name in N.LAYER_COST_FIELDS), strict=True))
    vals.update(fit_values(hardware))
    return vals


def fit_values(hardware: HardwareSpec) -> dict[str, float]:
    """The symbols of the hardware's calibrated collective fits, by name."""
    vals: dict[str, float] = {}
    for fit in hardware.collectives:
        alpha, busbw, alpha_small, busbw_small, breakpoint = (
            name for name, _, _ in N.fit_names(fit.op, fit.scope))
        two = fit.breakpoint_bytes > 0  # one regime: the small messages' values are the same
        vals.update({
            alpha: fit.alpha_s, busbw: fit.bus_bandwidth_bytes_per_s,
            alpha_small: fit.alpha_s_small if two else fit.alpha_s,
            busbw_small: fit.bus_bandwidth_bytes_per_s_small if two
            else fit.bus_bandwidth_bytes_per_s,
            breakpoint: fit.breakpoint_bytes,
        })
    return vals


def architecture_values(model: TransformerSpec) -> dict[str, float]:
    """The symbols of a mixture of experts, of multi-head latent attention and of the
    multi-token-prediction modules (perfmodel.step.moe, .mla); a model without them gives
    placeholders its family never reads (perfmodel.evaluate.family_of leaves their terms out)."""
    shared = model.shared_experts * (model.shared_expert_ffn_hidden or 0)
    return {
        "experts": float(model.experts or 1), "top_k": float(model.top_k or 1),
        "expert_ffn_hidden": float(model.expert_ffn_hidden or 1),
        "shared_ffn_hidden": float(shared or 1),
        "capacity_factor": float(model.capacity_factor or 1.0),
        "routing_imbalance": float(model.routing_imbalance),
        "expert_groups": float(model.expert_groups or 1),
        "group_topk": float(model.group_topk or 1),
        "mtp_layers": float(model.mtp_layers or 1),
        **{key: 1.0 if getattr(model, key) is None else float(getattr(model, key))
           for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                       "v_head_dim")},
    }


def check_stack(hardware: HardwareSpec, stack: Any) -> None:
    """CUDA graphs replay a GPU's kernels: refused (PlanError) on hardware whose ranks run
    synchronously on their host (a CPU profile: asynchronous_device false), where the step model
    has no graph to replay and would cost the plan as eager without a word."""
    if str(getattr(stack, "value", stack)) == "cuda-graphs" and not hardware.asynchronous_device:
        raise PlanError(f"stack cuda-graphs (--stack, or a job config's CUDA graphs): CUDA "
                        f"graphs replay kernels on a GPU; hardware '{hardware.name}' runs its "
                        "ranks synchronously on the host (asynchronous_device false): predict "
                        "the plan on a GPU's hardware, or without the graphs (--stack eager or "
                        "compiled; the config's graphs off)")


def check_dispatcher(hardware: HardwareSpec, dispatcher: Any) -> None:
    """DeepEP (and HybridEP, which exchanges as it does) needs NVLink between the GPUs of a node
    (deepseek-ai/DeepEP README, requirements: "NVLink for intranode communication"): refused
    (PlanError) where the node's GPUs reach each other over their host links (PCIe:
    intra_node.shares_host_link), where its kernels do not run."""
    if str(getattr(dispatcher, "value", dispatcher)) == "deepep" \
            and hardware.intra_node.shares_host_link:
        raise PlanError(f"ep_dispatcher deepep: DeepEP exchanges inside a node over NVLink, and "
                        f"{hardware.name}'s GPUs reach each other over PCIe "
                        "(intra_node.shares_host_link): give ep_dispatcher alltoall")


def fp8_params_zero3_refused(hardware: HardwareSpec, dtype: Dtype | str, recipe: Any,
                             fp8_params: bool) -> bool:
    """Whether FP8 weights (fp8_params) cannot go with ZeRO 3 on this hardware: under MXFP8 (the
    recipe given, or the hardware's default), whose weights Megatron-Core gathers in bf16 into
    the gradient buffer (perfmodel.costs.fp8, [MB-mxfp8]), a buffer FSDP does not keep."""
    if not fp8_params or Dtype(dtype) is not Dtype.FP8:
        return False
    name = None if recipe is None else getattr(recipe, "value", recipe)
    return bool(hardware.fp8_recipe(name) == "mxfp8")


def check_fp8_params(hardware: HardwareSpec, dtype: Dtype | str, recipe: Any, fp8_params: bool,
                     zero: int) -> None:
    """FP8 weights under ZeRO 3 are modelled as Megatron FSDP's --fp8-param-gather runs them,
    per-tensor recipes only (fp8_params_zero3_refused): else a PlanError naming the fields."""
    if zero >= 3 and fp8_params_zero3_refused(hardware, dtype, recipe, fp8_params):
        raise PlanError("fp8_params with zero 3 is modelled for the per-tensor FP8 recipes "
                        "(delayed, current: Megatron FSDP's --fp8-param-gather), not mxfp8 "
                        f"(the recipe on '{hardware.name}'): give zero 0-2, or fp8_recipe "
                        "delayed or current")


def values_of(model: TransformerSpec, hardware: HardwareSpec, plan: Plan) -> dict[str, float]:
    """The numeric value of every symbol of one plan, by symbol name (see perfmodel.names)."""
    check_fp8_params(hardware, plan.dtype, plan.fp8_recipe, plan.fp8_params, plan.zero)
    flash = resolve_flash(plan.flash_attention, model, hardware, plan.dtype, plan.attention_kernel)
    vals = fixed_values(model, hardware, plan.dtype, flash_attention=flash,
                        stack=plan.stack, kernels=plan.kernels,
                        recompute_every=plan.recompute_every,
                        recompute_method=plan.recompute_method.value,
                        recompute_num_layers=plan.recompute_num_layers,
                        cpu_offload_layers=plan.cpu_offload_layers,
                        dp_bucket_size=plan.dp_bucket_size,
                        dp_bucketing=plan.dp_bucketing.value,
                        attention_kernel=plan.attention_kernel,
                        grad_dtype=plan.grad_dtype,
                        optimizer_dtype=plan.optimizer_dtype,
                        master_weights=plan.master_weights,
                        fp8_recipe=None if plan.fp8_recipe is None else plan.fp8_recipe.value,
                        fp8_params=plan.fp8_params, ep_dispatcher=plan.ep_dispatcher,
                        cross_entropy=plan.cross_entropy,
                        expert_weighting=plan.expert_weighting,
                        expandable_segments=plan.expandable_segments,
                        optimizer_kernels=plan.optimizer_kernels)
    for name, value in encode_plans(plan_arrays(plan), hardware).items():
        vals[name] = float(value[0])
    vals["pipeline_flushes"] = float(plan.pipeline_flushes)
    return vals
