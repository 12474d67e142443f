"""The micro-batches each pipeline rank holds at its peak (perfmodel.costs.memory
.inflight_micro_batches) against the schedules laid out pass by pass (perfmodel.schedule.orders:
GPipe, 1F1B, Megatron's interleaved 1F1B, zb with its backwards split, and torch's
ScheduleZBVZeroBubble order): a chunk's forward adds 1 / v of the rank's layers' activations,
its backward (a zero-bubble schedule's input gradient) frees them."""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model
from perfmodel.costs.memory import inflight_micro_batches
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.schedule import BACKWARD, FORWARD, WEIGHT, orders, zb_rounds
from perfmodel.strategy import Plan

HW = load_hardware("dgx-h100")

CASES = [(sched, pp, m, v) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 6, 8, 10, 16, 17)
         for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4),
                          ("zb", 1), ("zb", 2), ("zbv", 2))
         # torch's interleaved schedules refuse m in unequal rounds, and so do plans
         if sched not in ("zb", "interleaved") or m % zb_rounds(pp, m) == 0]


def _peaks(schedule, pp, m, v):
    """Each rank's most chunk activations held at once, in units of the rank's layers."""
    out = []
    for passes in orders(schedule, pp, m, v):
        held = peak = 0
        for p in passes:
            # torch's zero-bubble input gradient (stage_backward_input, retain_graph=True)
            # keeps the chunk's saved activations until its weight gradient W frees them
            frees = WEIGHT if schedule == "zb" else BACKWARD
            held += 1 if p.kind == FORWARD else -1 if p.kind == frees else 0
            peak = max(peak, held)
        out.append(peak / v)
    return out


@pytest.mark.parametrize(("schedule", "pp", "m", "v"), CASES)
def test_each_rank_holds_what_its_schedule_keeps(schedule, pp, m, v):
    for rank, peak in enumerate(_peaks(schedule, pp, m, v)):
        held = inflight_micro_batches(schedule == "gpipe", schedule == "interleaved", pp, m, v,
                                      zb=schedule == "zb", zbv=schedule == "zbv", rank=rank)
        assert float(held) == pytest.approx(peak, rel=1e-12), (rank, peak)


def _stages(plan):
    model = load_model("llama3-8b")
    out = compile_family(family_of(model, HW, plan))(values_of(model, HW, plan))
    return {st: float(out[f"memory:{st}:activations/layers"])
            for st in ("first", "middle", "last")}


def test_gpipe_keeps_every_micro_batch_on_every_stage():
    """GPipe runs all m forwards before the first backward, on the last stage too."""
    one = _stages(Plan(gpus=4, pp=4, global_batch=8))  # 1F1B: the last stage holds one
    gpipe = _stages(Plan(gpus=4, pp=4, global_batch=8, schedule="gpipe"))
    for st in ("first", "middle", "last"):
        assert gpipe[st] == pytest.approx(8 * one["last"], rel=1e-12), st


def test_v_shape_balances_the_stages():
    """ZB-V: every rank holds pp micro-batches of its layers (two half-stage chunks); with
    fewer than 2 pp - 1 micro-batches the later ranks hold more (3.5 on rank 2 and 4 on rank 3
    of pp 4 at m = 4, rank 0 2.5): the fullest rank between is the one before the last."""
    one = _stages(Plan(gpus=4, pp=4, global_batch=16))
    zbv = _stages(Plan(gpus=4, pp=4, global_batch=16, schedule="zbv", virtual_stages=2))
    for st in ("first", "middle", "last"):
        assert zbv[st] == pytest.approx(4 * one["last"], rel=1e-12), st
    few = _stages(Plan(gpus=4, pp=4, global_batch=4, schedule="zbv", virtual_stages=2))
    peaks = _peaks("zbv", 4, 4, 2)
    assert peaks == [2.5, 3.0, 3.5, 4.0]
    for st, peak in (("first", peaks[0]), ("middle", max(peaks[1:-1])), ("last", peaks[-1])):
        assert few[st] == pytest.approx(peak * one["last"], rel=1e-12), st


def test_one_stage_accumulates_one_micro_batch_at_a_time():
    """Without a pipeline the trainer runs each micro-batch's forward and backward in turn
    (workload.trainer has no schedule at pp = 1), whatever schedule the plan names."""
    one = _stages(Plan(gpus=1, global_batch=8))
    gpipe = _stages(Plan(gpus=1, global_batch=8, schedule="gpipe"))
    assert gpipe["first"] == pytest.approx(one["first"], rel=1e-12)
    assert one["first"] == pytest.approx(_stages(Plan(gpus=1, global_batch=1))["first"],
                                         rel=1e-12)


def test_zero_bubble_in_unequal_rounds_is_refused():
    """torch's ScheduleInterleavedZeroBubble runs m in max(1, m // pp) rounds of equal size and
    refuses other m: so do the schedule's order and a plan, in one line."""
    from perfmodel.errors import PlanError

    with pytest.raises(ValueError, match="2 rounds of equal size"):
        orders("zb", 4, 9, 2)
    with pytest.raises(PlanError, match="9 is not a multiple of 2 rounds"):
        Plan(gpus=4, pp=4, global_batch=9, schedule="zb", virtual_stages=2)


LAYOUTS = [("Et|(tt|)*6tL", 4), ("Et*1|(t*2|)*62t*1L", 8), ("Et*2|(t*3|)*30t*2L", 8),
           ("Ett|t|t|t|tt|t|t|tL", 4), ("Et|tt|ttt|tt|tt|t|tt|tL", 4)]


@pytest.mark.parametrize(("text", "pp"), LAYOUTS)
@pytest.mark.parametrize("schedule", ["interleaved", "zb"])
def test_a_layouts_unequal_chunks_are_held_as_the_order_holds_them(text, pp, schedule):
    """A pipeline layout's chunks differ (Megatron's --pipeline-model-parallel-layout; the
    embedding's and the loss's chunks a layer short): a rank's warm-up holds whole rounds of its
    chunks and, beyond them, its first chunk's layers (or, short of them, its last chunk's). The
    first rank's peak is that exactly; the others' steady state can hold up to a few chunks'
    difference more (a small last chunk freed while larger ones run forward), which the closed
    form leaves out: it is always nearer the order than 1/v of the rank's layers per chunk."""
    import sympy as sp

    from perfmodel.pipeline_layout import PipelineLayout

    layout = PipelineLayout.parse(text, pp)
    v = layout.virtual_stages
    for m in (pp, 2 * pp, 4 * pp):
        for rank, passes in enumerate(orders(schedule, pp, m, v)):
            held = peak = 0
            for p in passes:
                layers = layout.chunk_layers(p.chunk * pp + rank)
                held += {FORWARD: layers, BACKWARD: -layers}.get(p.kind, 0)
                peak = max(peak, held)
            n = layout.decoder_layers[rank]
            shares = (sp.Rational(layout.chunk_layers(rank), n),
                      sp.Rational(layout.chunk_layers((v - 1) * pp + rank), n))
            kw = dict(zb=schedule == "zb", rank=rank)
            chunked = n * float(inflight_micro_batches(0, schedule == "interleaved", pp, m, v,
                                                       chunks=shares, **kw))
            even = n * float(inflight_micro_batches(0, schedule == "interleaved", pp, m, v, **kw))
            if rank == 0:
                assert chunked == pytest.approx(peak, rel=1e-12), (m, rank)
            assert abs(chunked - peak) <= abs(even - peak), (m, rank, peak, chunked, even)
