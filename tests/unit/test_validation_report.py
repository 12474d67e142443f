"""Predicted against measured: aggregation, errors, history and chart, worked by hand."""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import wait_for
from validation import report as rep
from workload import launcher as launch


def _rank(rank: int, steps: list[dict[str, float]], tp_fwd: float = 0.0, tp_bwd: float = 0.0):
    return {
        "rank": rank,
        "steps": steps,
        "peak_memory_bytes": 1000 + rank,
        "baseline_memory_bytes": 100,
        "probe": {
            "comm_seconds": [
                {"axis": "tp", "phase": "fwd", "seconds": tp_fwd},
                {"axis": "tp", "phase": "bwd", "seconds": tp_bwd},
                {"axis": "dp", "phase": "grad", "seconds": 9.0},
            ]
        },
    }


def _step(step, fwd, bwd, sync=0.0, opt=0.0, wait=0.0):
    return {
        "step": step,
        "forward": fwd,
        "backward": bwd,
        "grad_sync": sync,
        "optimizer": opt,
        "pipeline_wait": wait,
    }


def test_step_time_is_the_median_of_the_slowest_rank():
    # Steps 1..3: slowest ranks take 1.0, 3.0, 2.0 s -> median 2.0 s.
    r0 = _rank(0, [_step(1.0, 0.3, 0.5), _step(1.0, 0.3, 0.5), _step(2.0, 0.3, 0.5)])
    r1 = _rank(1, [_step(0.5, 0.3, 0.5), _step(3.0, 0.3, 0.5), _step(1.0, 0.3, 0.5)])
    step, terms, n = rep.measured_terms([r0, r1])
    assert n == 3
    assert step == pytest.approx(2.0)


def test_tensor_parallel_time_is_taken_out_of_forward_and_backward():
    # forward 0.3 s of which 0.1 s tp comm; backward 0.5 s of which 0.2 s: compute 0.2 + 0.3.
    r0 = _rank(0, [_step(1.0, 0.3, 0.5, sync=0.05, opt=0.1)], tp_fwd=0.1, tp_bwd=0.2)
    step, terms, _ = rep.measured_terms([r0])
    assert terms["forward"] == pytest.approx(0.2)
    assert terms["backward"] == pytest.approx(0.3)
    assert terms["tp_comm"] == pytest.approx(0.3)
    assert terms["grad_sync"] == pytest.approx(0.05)
    # The terms add up to the step time: other = 1.0 - (0.2 + 0.3 + 0.3 + 0.05 + 0.1).
    assert terms["other"] == pytest.approx(0.05)
    assert sum(terms.values()) == pytest.approx(step)


def test_terms_are_the_predicted_slowest_stage_s_ranks():
    # pp 2 x dp 2: ranks 0, 1 hold the first stage (forward 0.2 s), 2, 3 the last (forward
    # 0.6 s: the output layer). A prediction whose slowest stage is the last compares its terms
    # with ranks 2 and 3 alone, not with the mean of both stages (0.4 s); the step time stays
    # the slowest rank's.
    records = []
    for rank, fwd in ((0, 0.2), (1, 0.2), (2, 0.6), (3, 0.6)):
        r = _rank(rank, [_step(1.0 + rank / 10, fwd, 0.3)])
        r["coords"] = {"pp": rank // 2, "dp": rank % 2}
        records.append(r)
    step, terms, _ = rep.measured_terms(records, "last")
    assert terms["forward"] == pytest.approx(0.6) and step == pytest.approx(1.3)
    assert rep.measured_terms(records, "first")[1]["forward"] == pytest.approx(0.2)
    assert rep.measured_terms(records)[1]["forward"] == pytest.approx(0.4)
    # a stage with no rank among the records (pp 2 has no middle; the last stage's ranks
    # missing) takes every rank and says so ("all"), never another stage's under its name
    assert rep.stage_ranks(records, "middle")[1] == "all"
    assert rep.stage_ranks(records[:2], "last", pp=2) == (records[:2], "all")
    assert rep.stage_ranks(records[:3], "last", pp=4)[1] == "all"  # pp 4: rank 3 is not here
    assert rep.stage_ranks([{**records[0], "coords": ["pp"]}, *records[1:]], "last")[1] == "all"
    report = rep.build_report(meta={}, prediction={
        "step_time_s": 1.0, "breakdown_s": {"compute/forward/gemm": 0.5},
        "bottleneck_stage": "last", "memory_per_gpu_bytes": 2000.0}, launch={}, records=records)
    assert report["terms_stage"] == "last" and report["terms_ranks"] == [2, 3]
    assert report["terms"][0]["measured_s"] == pytest.approx(0.6)


def test_ranks_with_fewer_steps_limit_the_steps_compared():
    r0 = _rank(0, [_step(1.0, 0.3, 0.5)] * 3)
    r1 = _rank(1, [_step(1.0, 0.3, 0.5)])  # crashed after one timed step
    _, _, n = rep.measured_terms([r0, r1])
    assert n == 1


def test_predicted_terms_are_grouped_by_prefix_and_nothing_is_lost():
    breakdown = {
        "compute/forward/gemm": 1.0,
        "compute/forward/attention": 0.5,
        "compute/backward/gemm": 2.0,
        "compute/recompute": 0.25,
        "comm/tp": 0.1,
        "pipeline/bubble": 0.3,
        "pipeline/p2p": 0.02,
        "comm/dp": 0.4,
        "optimizer/step": 0.05,
        "overhead/kernels": 0.07,
    }
    grouped = rep.group_predicted(breakdown)
    assert grouped["forward"] == pytest.approx(1.5)
    assert grouped["backward"] == pytest.approx(2.25)
    assert grouped["pipeline"] == pytest.approx(0.32)
    assert grouped["other"] == pytest.approx(0.07)
    assert sum(grouped.values()) == pytest.approx(sum(breakdown.values()))


def test_relative_error_is_signed_measured_against_predicted():
    assert rep.relative_error(1.2, 1.0) == pytest.approx(0.2)  # slower than predicted: positive
    assert rep.relative_error(0.8, 1.0) == pytest.approx(-0.2)
    assert rep.relative_error(None, 1.0) is None
    assert rep.relative_error(1.0, 0.0) is None


def test_report_history_and_chart(tmp_path):
    records = [_rank(0, [_step(1.0, 0.3, 0.5)])]
    prediction = {
        "step_time_s": 0.8,
        "breakdown_s": {"compute/forward": 0.3, "compute/backward": 0.5},
        "memory_per_gpu_bytes": 500.0,
        "memory_breakdown_bytes": {"weights": 500.0},
    }
    report = rep.build_report(
        meta={"model": "m", "plan_label": "dp1", "ranks": 1, "backend": "gloo"},
        prediction=prediction,
        launch={"status": "ok"},
        records=records,
    )
    assert report["measured_step_time_s"] == pytest.approx(1.0)
    assert report["relative_error"] == pytest.approx(0.25)
    assert {r["name"] for r in report["terms"]} >= {"forward", "backward", "tp_comm", "grad_sync"}
    history = tmp_path / "h.csv"
    rep.append_history(report, history)
    rep.append_history(report, history)
    rows = list(csv.DictReader(history.open()))
    assert len(rows) == 2 and float(rows[1]["relative_error"]) == pytest.approx(0.25)
    png = tmp_path / "r.png"
    rep.plot(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # atomic writes leave no temp


def test_a_busy_port_is_detected_and_a_free_one_found():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not launch.port_is_free(busy)
        assert launch.free_port() != busy


def test_descendants_are_found_through_proc():
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; time.sleep(3600)'])",  # killed below
        ]
    )
    try:
        kids = wait_for(lambda: launch.descendants(p.pid), "the grandchild starts", proc=p,
                        poll_s=0.05)
        assert all(os.path.exists(f"/proc/{k}") for k in kids)
    finally:
        for k in launch.descendants(p.pid):
            os.kill(k, 9)
        p.kill()
        p.wait()


def test_fsdp_collectives_inside_backward_count_as_gradient_sync():
    # FSDP reduce-scatters inside backward: 0.1 s of the 0.5 s backward is gradient sync.
    r0 = _rank(0, [_step(1.0, 0.3, 0.5)])
    r0["probe"]["comm_seconds"].append({"axis": "dp", "phase": "bwd", "seconds": 0.1})
    step, terms, _ = rep.measured_terms([r0])
    assert terms["backward"] == pytest.approx(0.4)
    assert terms["grad_sync"] == pytest.approx(0.1)
    assert sum(terms.values()) == pytest.approx(step)


def test_probe_shares_apply_to_the_timed_steps():
    # The probe's forward took 0.6 s, 0.3 s of it in tp collectives: half of a timed 0.4 s forward.
    r0 = _rank(0, [_step(1.0, 0.4, 0.5)])
    r0["probe"]["comm_seconds"] = [{"axis": "tp", "phase": "fwd", "seconds": 0.3}]
    r0["probe"]["times"] = [{"forward": 0.6, "backward": 0.8}]
    step, terms, _ = rep.measured_terms([r0])
    assert terms["tp_comm"] == pytest.approx(0.2)
    assert terms["forward"] == pytest.approx(0.2)
    assert terms["backward"] == pytest.approx(0.5)
    assert sum(terms.values()) == pytest.approx(step)


def test_a_run_is_named_by_every_degree_it_has():
    # two runs that differ only in cp, ep or etp (or cp's exchange) are two runs: their
    # directories and report titles must not collide
    from perfmodel.strategy import Plan
    from validation.run import plan_label

    assert plan_label(Plan(gpus=4, dp=4, global_batch=8)) == "dp4-tp1-pp1-mb1-gb8"
    assert plan_label(Plan(gpus=4, dp=4, ep=2, zero=3, global_batch=8)) \
        == "dp4-tp1-pp1-ep2-mb1-gb8-zero3"
    assert plan_label(Plan(gpus=8, dp=2, tp=2, cp=2, ep=2, etp=2, cp_comm="a2a",
                           sequence_parallel=True, global_batch=8)) \
        == "dp2-tp2-pp1-cp2-ep2-etp2-mb1-gb8-cp-a2a-sp"
