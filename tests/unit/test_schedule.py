"""perfmodel.schedule: the pipeline schedules' orders, and their simulated span against the step
model's closed forms (perfmodel.step.pipeline.bubble_s with rho = 1).

Closed forms, per micro-batch times F (forward), B (input gradient), W (weight gradient) of one
stage, v chunks per stage, pp stages, m micro-batches (Narayanan et al. SC21, Sec. 2.2; Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3.1 and 6):
    gpipe, 1f1b      m (F + B) + (pp - 1)(F + B)                B includes W
    interleaved      m (F + B) + (pp - 1)(F + B) / v
    zb (ZB-H1)       m (F + B + W) + (pp - 1)(F + B + W - 2W) / v
    zbv (ZB-V)       m (F + B + W) + (pp - 1)(F + B + W - 3W) / 2
"""

from __future__ import annotations

import pytest

from perfmodel.schedule import BACKWARD, FORWARD, WEIGHT, orders, simulate, virtual_stage

TIMES = [(1.0, 2.0, 0.0), (1.2, 2.0, 0.8), (1.0, 1.3, 0.4), (2.0, 3.0, 1.0)]


def span(schedule: str, pp: int, m: int, v: int, f: float, b: float, w: float) -> float:
    """The simulated pipeline span with per-micro-batch times f, b, w (split over v chunks)."""
    timed = simulate(schedule, orders(schedule, pp, m, v), pp, v,
                     {FORWARD: f / v, BACKWARD: b / v, WEIGHT: w / v})
    return max(t.end_s for stage in timed for t in stage)


def closed_form(schedule: str, pp: int, m: int, v: int, f: float, b: float, w: float) -> float:
    t_mb = f + b + w
    fill = {"zb": 2 * w, "zbv": 3 * w}.get(schedule, 0.0)
    return m * t_mb + (pp - 1) / v * (t_mb - fill)


@pytest.mark.parametrize("f, b, w", TIMES)
@pytest.mark.parametrize("schedule, pp, m, v", [
    ("gpipe", 2, 4, 1), ("gpipe", 4, 8, 1), ("gpipe", 3, 7, 1),
    ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 4, 1), ("1f1b", 3, 7, 1),
    ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 4),
    ("interleaved", 2, 6, 3), ("interleaved", 4, 12, 3),
    ("zb", 2, 4, 1), ("zb", 4, 8, 1), ("zb", 4, 4, 1), ("zb", 3, 6, 1), ("zb", 2, 4, 2),
    ("zb", 4, 8, 2), ("zb", 4, 8, 4), ("zb", 2, 6, 3), ("zb", 4, 12, 3),
    # rounds of m / (m // pp) micro-batches where pp does not divide m (torch's)
    ("zb", 4, 6, 2), ("zb", 4, 10, 2), ("zb", 2, 3, 2),
])
def test_the_order_takes_the_closed_form(schedule, pp, m, v, f, b, w):
    if schedule != "zb":  # the backward holds the weight gradient
        b, w = b + w, 0.0
    assert span(schedule, pp, m, v, f, b, w) == pytest.approx(
        closed_form(schedule, pp, m, v, f, b, w), rel=1e-12)


def test_zero_bubble_fills_what_1f1b_leaves_idle():
    # the same passes: 1f1b waits (pp - 1)(F + B + W), zb (pp - 1)(F + B - W)
    f, b, w, pp, m = 1.0, 1.2, 0.9, 4, 8
    assert span("1f1b", pp, m, 1, f, b + w, 0) - span("zb", pp, m, 1, f, b, w) == pytest.approx(
        (pp - 1) * 2 * w)


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (2, 3), (4, 4)])
def test_zbv_takes_longer_than_its_closed_form(pp, m):
    # the last stage cannot start before one forward chunk has crossed the others: at least
    # the first stage's first chunk (f / 2) is idle time the closed form does not have
    f, b, w = 1.0, 1.0, 1.0
    assert span("zbv", pp, m, 2, f, b, w) >= closed_form("zbv", pp, m, 2, f, b, w) + f / 2


@pytest.mark.parametrize("schedule, pp, m, v", [
    ("gpipe", 3, 5, 1), ("1f1b", 4, 6, 1), ("interleaved", 2, 4, 3), ("zb", 3, 5, 2),
    ("zbv", 3, 4, 2), ("zbv", 3, 7, 2)])
def test_every_pass_runs_once_on_the_stage_that_holds_its_chunk(schedule, pp, m, v):
    stage_orders = orders(schedule, pp, m, v)
    kinds = (FORWARD, BACKWARD, WEIGHT) if schedule in ("zb", "zbv") else (FORWARD, BACKWARD)
    seen = [(p.kind, p.micro_batch, virtual_stage(schedule, pp, s, p.chunk))
            for s, order in enumerate(stage_orders) for p in order]
    assert sorted(seen) == sorted((k, mb, vs) for k in kinds for mb in range(m)
                                  for vs in range(pp * v))


def test_1f1b_warms_up_with_pp_minus_stage_minus_one_forwards():
    first = orders("1f1b", 4, 8)[0]
    assert [p.kind for p in first[:4]] == [FORWARD, FORWARD, FORWARD, FORWARD]
    assert first[4].kind == BACKWARD
    last = orders("1f1b", 4, 8)[3]
    assert [p.kind for p in last[:3]] == [FORWARD, BACKWARD, FORWARD]


def test_passes_on_a_stage_never_overlap_and_follow_their_inputs():
    timed = simulate("interleaved", orders("interleaved", 4, 8, 2), 4, 2,
                     {FORWARD: 1.0, BACKWARD: 2.0, WEIGHT: 0.0})
    for stage in timed:
        for a, b in zip(stage, stage[1:], strict=False):
            assert b.start_s >= a.end_s
    ends = {(t.step.kind, t.step.micro_batch, virtual_stage("interleaved", 4, t.stage,
                                                            t.step.chunk)): t
            for stage in timed for t in stage}
    for (kind, mb, vs), t in ends.items():
        if kind == FORWARD and vs > 0:
            assert t.start_s >= ends[(FORWARD, mb, vs - 1)].end_s


@pytest.mark.parametrize("args, message", [
    (("pipedream", 2, 4, 1), "schedule must be one of"),
    (("zb", 3, 7, 1), "2 rounds of equal size"),
    (("1f1b", 2, 4, 2), "one chunk per stage"),
    (("zbv", 2, 4, 1), "two chunks per stage"),
    (("1f1b", 0, 4, 1), "must be >= 1"),
])
def test_bad_arguments_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        orders(*args)


def chunk_of(schedule: str, pp: int, rank: int, stage_index: int) -> int:
    """The rank's chunk that holds virtual stage stage_index (virtual_stage's inverse)."""
    return next(c for c in range(2 if schedule == "zbv" else stage_index // pp + 1)
                if virtual_stage(schedule, pp, rank, c) == stage_index)


@pytest.mark.parametrize("schedule, pp, m, v", [
    ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 4),
    ("interleaved", 4, 12, 3), ("zb", 2, 4, 1), ("zb", 4, 8, 1), ("zb", 2, 4, 2),
    ("zb", 4, 8, 2), ("zb", 4, 8, 4), ("zb", 4, 12, 3), ("zb", 8, 16, 2), ("zb", 4, 6, 2),
    ("zb", 4, 10, 2), ("zb", 4, 5, 2), ("zb", 2, 3, 2), ("zbv", 2, 4, 2), ("zbv", 4, 8, 2),
    ("zbv", 4, 5, 2), ("zbv", 3, 9, 2)])
def test_the_orders_are_torchs(schedule, pp, m, v):
    """Each rank's passes in the order torch.distributed.pipelining runs them (the validation
    job's schedules: ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble), from their own _calculate_single_rank_operations (its idle slots
    dropped, and with zbv the passes of the micro-batches it pads m with; I, the input gradient,
    is B)."""
    pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
    from types import SimpleNamespace

    cls = {"interleaved": pipelining.ScheduleInterleaved1F1B,
           "zb": pipelining.ScheduleInterleavedZeroBubble,
           "zbv": pipelining.ScheduleZBVZeroBubble}[schedule]
    rounds = max(1, m // pp)
    kinds = {"F": FORWARD, "I": BACKWARD, "B": BACKWARD, "W": WEIGHT}
    ours = orders(schedule, pp, m, v)
    for rank in range(pp):
        state = SimpleNamespace(n_local_stages=v, pp_group_size=pp, _n_microbatches=m,
                                microbatches_per_round=m // rounds, num_stages=pp * v)
        theirs = [(kinds[a.computation_type.value], a.microbatch_index,
                   chunk_of(schedule, pp, rank, a.stage_index))
                  for a in cls._calculate_single_rank_operations(state, rank)
                  if a is not None and a.microbatch_index < m]
        assert [(p.kind, p.micro_batch, p.chunk) for p in ours[rank]] == theirs, rank
