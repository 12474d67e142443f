"""Pipeline schedules as orders of passes, and the times they give (for `predict --trace`).

The step model (perfmodel.step.pipeline) charges a pipeline a closed form: m micro-batch times and
a bubble of (pp - 1)/v of one, less what zero-bubble schedules fill with weight gradients. This
module lays the same schedules out pass by pass so that the step can be drawn:

    orders(schedule, pp, m, v)   each stage's passes in the order the schedule runs them
    simulate(orders, ...)        each pass starts when its stage is free and its inputs are ready
                                 (the previous chunk's forward, the next chunk's backward)

Orders (per stage s of pp; a chunk c of stage s is the virtual stage c pp + s, or in the V shape
of zbv, s for chunk 0 and 2 pp - 1 - s for chunk 1):
    gpipe        every forward, then every backward (Huang et al. 2019)
    1f1b         pp - s - 1 forwards, then one forward and one backward, then the rest of the
                 backwards (Narayanan et al. SC21, Sec. 2.2; PipeDream-Flush)
    interleaved  Megatron-LM's interleaved 1F1B: forwards in groups of pp micro-batches per chunk,
                 2 (pp - s - 1) + (v - 1) pp warm-up forwards (Narayanan et al. SC21, Sec. 2.2)
    zb           the 1f1b / interleaved order with each backward split into its input gradient (B)
                 and its weight gradient (W); stage s keeps s weight gradients pending and runs
                 them where the 1f1b order would wait (ZB-H1, Qi et al., ICLR 2024, Sec. 3.1);
                 with v > 1 chunks, (v - 1) g + pp - s - 1 warm-up forwards in groups of
                 g = m / max(1, m // pp) micro-batches (pp where pp divides m), as
                 torch.distributed.pipelining.ScheduleInterleavedZeroBubble runs it
                 (_get_warmup_ops with multiply_factor 1, microbatches_per_round; torch 2.13)
    zbv          the V-shape order of torch.distributed.pipelining.ScheduleZBVZeroBubble
                 (Qi et al., Sec. 6; the same order as the paper's ZB-V)

With every stage's passes equally long, the simulated span is the model's m t_mb + T_bubble
exactly for gpipe, 1f1b and interleaved (m a multiple of pp), and for zb with W the
weight-gradient time the model fills with: (pp - 1)(F + B - W) per chunk
(tests/unit/test_schedule.py checks these against the closed forms). With each stage at its own
pace (simulate takes one duration per stage) the slowest stage sets the steady state and the
others the fill and drain: the model's T_bubble = (pp - 1)/v x the other stages' mean time, exact
where the last stage is the slowest in its forward and its backward alike (tests/unit/
test_timeline.py lays the step out so); where an earlier stage k is the slowest, 1F1B's warm-up
hides part of the later stages' fill and the closed form exceeds the order by about
(pp - 1 - k)(t_k - t_other) (docs/timeline.md). zbv's closed form is its order's chains
(perfmodel.step.pipeline.zbv_terms) on the other stages' pace: the timeline shows the order's
time with each stage's own and says where it differs from the prediction (perfmodel.timeline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv")


@dataclass(frozen=True, kw_only=True)
class Pass:
    """One pass of one micro-batch through one chunk of a stage: F (forward), B (backward: input
    gradient, and weight gradient unless the schedule splits it off), W (weight gradient)."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in (FORWARD, BACKWARD, WEIGHT):
            raise ValueError(f"Pass.kind must be F, B or W, got '{self.kind}'")
        if self.micro_batch < 0 or self.chunk < 0:
            raise ValueError("Pass.micro_batch and Pass.chunk must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Timed:
    """A pass with its start and end on its stage [s]."""

    stage: int
    step: Pass
    start_s: float
    end_s: float


def _check(schedule: str, pp: int, m: int, v: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got '{schedule}'")
    if pp < 1 or m < 1 or v < 1:
        raise ValueError(f"pp, m and v must be >= 1, got pp={pp} m={m} v={v}")
    if schedule in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"schedule {schedule} runs one chunk per stage, got v={v}")
    if schedule == "zbv" and v != 2:
        raise ValueError(f"schedule zbv runs two chunks per stage, got v={v}")
    if schedule in ("zb", "interleaved") and m % zb_rounds(pp, m):
        raise ValueError(f"schedule {schedule} runs m in {zb_rounds(pp, m)} rounds of equal "
                         f"size, got m={m} (torch's ScheduleInterleaved1F1B and "
                         "ScheduleInterleavedZeroBubble refuse it)")


def zb_rounds(pp: int, m: int) -> int:
    """The rounds torch's ScheduleInterleavedZeroBubble splits m micro-batches into,
    max(1, m // pp), each of m / rounds (its microbatches_per_round; pp where pp divides m)."""
    return max(1, m // pp)


def _forward_sequence(group: int, m: int, v: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of the interleaved forwards: groups of `group` micro-batches (the
    last group smaller when group does not divide m) through chunk 0, then chunk 1, ..."""
    out = []
    for first in range(0, m, group):
        members = range(first, min(first + group, m))
        out += [(mb, c) for c in range(v) for mb in members]
    return out


def _one_f_one_b(s: int, pp: int, m: int, v: int, split: bool) -> list[Pass]:
    """1F1B (v = 1) or interleaved 1F1B (v > 1) on stage s; split: ZB-H1's deferred W (and
    torch's zero-bubble warm-up, one forward a stage where interleaved 1F1B runs two, over its
    rounds of m / zb_rounds micro-batches)."""
    # micro-batches per round: pp wherever pp divides m (Megatron's, which refuses other m);
    # torch's ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble alike run m in
    # max(1, m // pp) rounds of m / rounds (microbatches_per_round), which pipeline_micro_batches
    # plans reach with m not a multiple of pp
    group = m // zb_rounds(pp, m)
    forwards = _forward_sequence(group, m, v)
    backwards = [(mb, v - 1 - c) for mb, c in forwards]
    total = m * v
    per_stage = 1 if split else 2
    warmup = min(pp - s - 1 if v == 1 else per_stage * (pp - s - 1) + (v - 1) * group, total)
    out: list[Pass] = []
    pending: list[tuple[int, int]] = []

    def backward(i: int) -> None:
        mb, c = backwards[i]
        out.append(Pass(kind=BACKWARD, micro_batch=mb, chunk=c))
        if split:
            pending.append((mb, c))
            if len(pending) > s:
                mb_w, c_w = pending.pop(0)
                out.append(Pass(kind=WEIGHT, micro_batch=mb_w, chunk=c_w))

    out += [Pass(kind=FORWARD, micro_batch=mb, chunk=c) for mb, c in forwards[:warmup]]
    for i in range(total - warmup):
        mb, c = forwards[warmup + i]
        out.append(Pass(kind=FORWARD, micro_batch=mb, chunk=c))
        backward(i)
    for i in range(total - warmup, total):
        backward(i)
    out += [Pass(kind=WEIGHT, micro_batch=mb, chunk=c) for mb, c in pending]
    return out


def _zbv(rank: int, pp: int, m: int) -> list[Pass]:
    """torch.distributed.pipelining.ScheduleZBVZeroBubble's order on one rank (torch 2.13,
    _calculate_single_rank_operations): passes of micro-batches beyond m are dropped."""
    n = max(2 * pp - 1, m)
    f0 = f1 = b0 = b1 = 0
    ops: list[tuple[str, int, int]] = []
    for _ in range(2 * (pp - rank) - 1):
        ops.append((FORWARD, f0, 0))
        f0 += 1
    for _ in range(rank):
        ops += [(FORWARD, f1, 1), (FORWARD, f0, 0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - rank):
        ops += [(FORWARD, f1, 1), (BACKWARD, b1, 1), (WEIGHT, b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append((FORWARD, f0, 0))
            f0 += 1
        ops += [(BACKWARD, b0, 0), (WEIGHT, b0, 0), (FORWARD, f1, 1), (BACKWARD, b1, 1),
                (WEIGHT, b1, 1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [(BACKWARD, b0, 0), (BACKWARD, b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - rank):
        ops += [(BACKWARD, b0, 0), (WEIGHT, w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [(WEIGHT, w, 1) for w in range(w1, b1)] + [(WEIGHT, w, 0) for w in range(w0, b0)]
    return [Pass(kind=k, micro_batch=mb, chunk=c) for k, mb, c in ops if mb < m]


def orders(schedule: str, pp: int, m: int, v: int = 1) -> list[list[Pass]]:
    """Each stage's passes in the order `schedule` runs them (see the module doc)."""
    _check(schedule, pp, m, v)
    if schedule == "gpipe":
        return [[Pass(kind=FORWARD, micro_batch=i) for i in range(m)]
                + [Pass(kind=BACKWARD, micro_batch=i) for i in range(m)] for _ in range(pp)]
    if schedule == "zbv":
        return [_zbv(s, pp, m) for s in range(pp)]
    return [_one_f_one_b(s, pp, m, v, split=schedule == "zb") for s in range(pp)]


def virtual_stage(schedule: str, pp: int, stage: int, chunk: int) -> int:
    """The position in the model of a stage's chunk: c pp + s, or the V shape for zbv."""
    if schedule == "zbv":
        return stage if chunk == 0 else 2 * pp - 1 - stage
    return chunk * pp + stage


def simulate(schedule: str, stage_orders: Sequence[Sequence[Pass]], pp: int, v: int,
             duration_s: Mapping[str, float] | Sequence[Mapping[str, float]]
             ) -> list[list[Timed]]:
    """Start every pass as soon as its stage is free and its inputs are ready: a forward after the
    forward of the chunk before it (on whichever stage), a backward after its own forward and the
    backward of the chunk after it, a weight gradient after its backward. duration_s: seconds of
    one pass by kind (F, B, W), the same on every stage, or one such mapping per stage."""
    per_stage = [duration_s] * pp if isinstance(duration_s, Mapping) else list(duration_s)
    if len(per_stage) != pp:
        raise ValueError(f"duration_s: {len(per_stage)} stages' durations for pp {pp}")
    last = pp * v - 1
    where = {virtual_stage(schedule, pp, s, c): s for s in range(pp) for c in range(v)}
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * pp
    nxt = [0] * pp
    out: list[list[Timed]] = [[] for _ in range(pp)]
    left = sum(len(o) for o in stage_orders)
    while left:
        moved = False
        for s in range(pp):
            while nxt[s] < len(stage_orders[s]):
                p = stage_orders[s][nxt[s]]
                vs = virtual_stage(schedule, pp, s, p.chunk)
                if where.get(vs) != s:
                    raise ValueError(f"stage {s} holds no chunk {p.chunk}")
                needs = {FORWARD: [(FORWARD, p.micro_batch, vs - 1)] if vs > 0 else [],
                         BACKWARD: [(FORWARD, p.micro_batch, vs)]
                         + ([(BACKWARD, p.micro_batch, vs + 1)] if vs < last else []),
                         WEIGHT: [(BACKWARD, p.micro_batch, vs)]}[p.kind]
                if any(n not in done for n in needs):
                    break
                start = max([free[s], *(done[n] for n in needs)])
                end = start + per_stage[s][p.kind]
                done[(p.kind, p.micro_batch, vs)] = free[s] = end
                out[s].append(Timed(stage=s, step=p, start_s=start, end_s=end))
                nxt[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError(f"schedule {schedule}: the orders wait on each other (deadlock)")
    return out
