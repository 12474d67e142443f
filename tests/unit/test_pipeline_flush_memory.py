"""Activation memory of a step run as several pipeline schedules (Plan.pipeline_micro_batches):
each schedule of n = m / F micro-batches fills, runs its last backward and drains before the next
fills (torchtitan and NeMo AutoModel call the schedule once per gradient-accumulation step), so a
stage holds in flight what one schedule of n holds, not what one of the step's m would: GPipe n,
1F1B min(n, pp - r) on rank r, the chunked schedules their rules on n
(perfmodel.costs.memory.inflight_micro_batches on perfmodel.step.pipeline.schedule_micro_batches).
The step's passes are laid out as perfmodel.timeline lays them: F orders of n one after another."""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model, predict
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.schedule import BACKWARD, FORWARD, WEIGHT, Pass, orders
from perfmodel.strategy import Plan

HW = load_hardware("dgx-h100")
MODEL = load_model("llama3-8b")
STAGES = ("first", "middle", "last")


def _stages(plan: Plan) -> dict[str, float]:
    """activations/layers of each costed stage [bytes]."""
    out = compile_family(family_of(MODEL, HW, plan))(values_of(MODEL, HW, plan))
    return {st: float(out[f"memory:{st}:activations/layers"]) for st in STAGES}


def _step_peaks(schedule: str, pp: int, m: int, v: int, per: int) -> list[float]:
    """Each rank's most activations held at once over a step of m micro-batches run as m / per
    schedules of `per` one after the other (perfmodel.timeline's order), in units of the rank's
    layers."""
    one = orders(schedule, pp, per, v)
    out = []
    for passes in one:
        held = peak = 0
        for k in range(m // per):
            for q in passes:
                p = Pass(kind=q.kind, micro_batch=q.micro_batch + k * per, chunk=q.chunk)
                # torch's zero-bubble input gradient keeps the chunk's activations until W
                frees = WEIGHT if schedule == "zb" else BACKWARD
                held += 1 if p.kind == FORWARD else -1 if p.kind == frees else 0
                peak = max(peak, held)
        assert held == 0  # every schedule drains
        out.append(peak / v)
    return out


# pp 4 (rank 1 the costed middle; zbv's the one before the last), 16 micro-batches a step
CASES = [(sched, v, n) for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                        ("interleaved", 4), ("zb", 2), ("zbv", 2))
         for n in (1, 2, 4, 8, 16)
         if sched not in ("zb", "zbv") or n >= 4]  # torch's zero bubble needs n >= pp


@pytest.mark.parametrize(("schedule", "v", "n"), CASES)
def test_each_stage_holds_one_schedules_micro_batches(schedule, v, n):
    pp, m = 4, 16
    kw = dict(gpus=4, pp=pp, global_batch=m, schedule=schedule)
    if v > 1:
        kw["virtual_stages"] = v
    # one micro-batch of a stage's layers: 1F1B's last stage holds one
    unit = _stages(Plan(gpus=4, pp=pp, global_batch=m))["last"]
    got = _stages(Plan(**kw, pipeline_micro_batches=n))
    peaks = _step_peaks(schedule, pp, m, v, n)
    middle = pp - 2 if schedule == "zbv" else 1
    for st, rank in zip(STAGES, (0, middle, pp - 1), strict=True):
        assert got[st] == pytest.approx(peaks[rank] * unit, rel=1e-12), (st, peaks)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2),
                                         ("zb", 2), ("zbv", 2)])
def test_one_schedule_a_step_keeps_todays_memory(schedule, v):
    """pipeline_micro_batches = m is one schedule a step, the default: the same memory."""
    kw = dict(gpus=4, pp=4, global_batch=16, schedule=schedule)
    if v > 1:
        kw["virtual_stages"] = v
    assert _stages(Plan(**kw, pipeline_micro_batches=16)) == pytest.approx(
        _stages(Plan(**kw)), rel=1e-12)


def test_1f1b_holds_min_of_the_schedule_and_pp_less_the_rank():
    pp, m = 4, 16
    unit = _stages(Plan(gpus=4, pp=pp, global_batch=m))["last"]
    for n in (1, 2, 4, 8):
        got = _stages(Plan(gpus=4, pp=pp, global_batch=m, pipeline_micro_batches=n))
        for st, rank in zip(STAGES, (0, 1, pp - 1), strict=True):
            assert got[st] == pytest.approx(min(n, pp - rank) * unit, rel=1e-12), (n, st)


def test_gpipe_holds_one_schedules_micro_batches_on_every_stage():
    pp, m = 4, 16
    unit = _stages(Plan(gpus=4, pp=pp, global_batch=m))["last"]
    for n in (1, 2, 4, 8, 16):
        got = _stages(Plan(gpus=4, pp=pp, global_batch=m, schedule="gpipe",
                           pipeline_micro_batches=n))
        assert got == pytest.approx({st: n * unit for st in STAGES}, rel=1e-12), n


def test_interleaved_applies_its_rule_to_the_schedules_micro_batches():
    """pp 4, v 2: rank r holds min(n, g + (2 pp - 1 - 2 r - g) / v) of one schedule's n, in
    torch's rounds of g = n / max(1, n // pp) micro-batches (ScheduleInterleaved1F1B's
    microbatches_per_round; pp where pp divides n: pp + (pp - 1 - 2 r) / v)."""
    pp, v, m = 4, 2, 16
    unit = _stages(Plan(gpus=4, pp=pp, global_batch=m))["last"]
    for n in (1, 2, 4, 8):
        got = _stages(Plan(gpus=4, pp=pp, global_batch=m, schedule="interleaved",
                           virtual_stages=v, pipeline_micro_batches=n))
        for st, rank in zip(STAGES, (0, 1, pp - 1), strict=True):
            g = n / max(1, n // pp)
            want = min(n, g + (2 * pp - 1 - 2 * rank - g) / v)
            assert got[st] == pytest.approx(want * unit, rel=1e-12), (n, st)


def test_the_reported_plan():
    """llama3-8b on 8 H100s, pp 2, 8 micro-batches a step: GPipe in schedules of one holds one
    micro-batch's activations (an eighth of one schedule of 8's), 1F1B in schedules of one
    likewise (2 where one schedule of 8 runs); the memory per GPU falls with them, the step
    time is the flushes' as before."""
    def run(schedule, n=0, **kw):
        plan = Plan(gpus=8, dp=4, pp=2, global_batch=32, schedule=schedule,
                    pipeline_micro_batches=n, **kw)
        return predict(MODEL, HW, plan)
    gpipe, gpipe1 = run("gpipe"), run("gpipe", 1)
    one = gpipe.memory_breakdown_bytes["activations/layers"] / 8
    assert gpipe1.memory_breakdown_bytes["activations/layers"] == pytest.approx(one, rel=1e-12)
    assert gpipe1.memory_per_gpu_bytes < gpipe.memory_per_gpu_bytes
    for n in (2, 4):
        assert run("gpipe", n).memory_breakdown_bytes["activations/layers"] == pytest.approx(
            n * one, rel=1e-12)
    assert run("gpipe", 8).memory_per_gpu_bytes == pytest.approx(gpipe.memory_per_gpu_bytes,
                                                                 rel=1e-12)
    f1b, f1b1 = run("1f1b"), run("1f1b", 1)
    assert f1b.memory_breakdown_bytes["activations/layers"] == pytest.approx(2 * one, rel=1e-12)
    assert f1b1.memory_breakdown_bytes["activations/layers"] == pytest.approx(one, rel=1e-12)
    assert f1b1.step_time_s > f1b.step_time_s  # eight fills and drains
    inter = run("interleaved", virtual_stages=2)
    assert run("interleaved", 8, virtual_stages=2).memory_per_gpu_bytes == pytest.approx(
        inter.memory_per_gpu_bytes, rel=1e-12)
    assert run("interleaved", 1, virtual_stages=2).memory_breakdown_bytes[
        "activations/layers"] == pytest.approx(one, rel=1e-12)
