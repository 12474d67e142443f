"""validate's report, probed 2026-12-07 (no job runs here):

1. the measured terms are those of the median step, so that they add up to the measured step
   (the median of each term apart did not: 159.91 ms of terms against a 159.51 ms step, dp 2,
   3 steps);
2. comm/tp_grads (the norms' gradients all-reduced over tp after the backward) is compared in
   grad_sync, where the job times it, not in tp_comm (tp 2 with sequence parallelism read
   grad_sync 0.00 ms predicted against 6.94 ms measured);
3. a run stopped before its probe steps (Ctrl-C, a crashed rank) cannot take its tensor-parallel
   communication out of forward and backward: tp_comm is unmeasured (-), not 0.00 ms (-100.0%);
4. `validate collect` says what a local run says: the caveat of a CPU profile of another rank
   count, and rank 0's collectives against the ledger.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_bad_input import run_main
from validation import report as rep
from validation import run as vrun


def _step(step, fwd, bwd, sync=0.0, opt=0.0):
    return {"step": step, "forward": fwd, "backward": bwd, "grad_sync": sync, "optimizer": opt,
            "pipeline_wait": 0.0}


def _rank(rank, steps, probe=True):
    r = {"rank": rank, "steps": steps}
    if probe:
        r["probe"] = {"comm_seconds": [{"axis": "tp", "phase": "fwd", "seconds": 0.0}]}
    return r


@pytest.mark.parametrize("n", [3, 4, 5])
def test_the_terms_add_up_to_the_step_time_whatever_the_number_of_steps(n):
    # steps whose terms peak in different steps: each term's own median is of another step
    shapes = [(1.0, 0.5, 0.2, 0.2), (1.2, 0.3, 0.6, 0.2), (0.9, 0.3, 0.2, 0.3),
              (1.5, 0.6, 0.6, 0.1), (1.1, 0.2, 0.3, 0.5)][:n]
    r0 = _rank(0, [_step(s, f, b, sync=g) for s, f, b, g in shapes])
    r1 = _rank(1, [_step(s - 0.05, f, b, sync=g) for s, f, b, g in shapes])
    step, terms, count = rep.measured_terms([r0, r1])
    assert count == n
    assert step == pytest.approx(sorted(s for s, *_ in shapes)[(n - 1) // 2] if n % 2 else
                                 sum(sorted(s for s, *_ in shapes)[n // 2 - 1: n // 2 + 1]) / 2)
    assert sum(v for v in terms.values() if v is not None) == pytest.approx(step)
    assert terms["other"] >= 0


def test_tp_grads_are_compared_in_grad_sync_where_the_job_times_them():
    breakdown = {"compute/forward/gemm": 1.0, "comm/tp": 0.3, "comm/tp_grads": 0.01,
                 "comm/dp": 0.2, "overhead/kernels": 0.1}
    grouped = rep.group_predicted(breakdown)
    assert grouped["tp_comm"] == pytest.approx(0.3)
    assert grouped["grad_sync"] == pytest.approx(0.21)
    assert sum(grouped.values()) == pytest.approx(sum(breakdown.values()))
    assert rep.row_of("comm/tp") == "tp_comm" and rep.row_of("comm/tp_grads") == "grad_sync"
    assert rep.row_of("overhead/loop") == "other"


def test_a_run_stopped_before_its_probe_steps_leaves_tp_comm_unmeasured():
    records = [_rank(r, [_step(1.0, 0.4, 0.4, opt=0.1)], probe=False) for r in (0, 1)]
    report = rep.build_report(meta={}, prediction={
        "step_time_s": 0.5, "breakdown_s": {"compute/forward/gemm": 0.1, "comm/tp": 0.2},
        "memory_per_gpu_bytes": 1.0}, launch={"status": "interrupted"}, records=records)
    rows = {t["name"]: t for t in report["terms"]}
    assert rows["tp_comm"]["measured_s"] is None and rows["tp_comm"]["relative_error"] is None
    assert rows["forward"]["measured_s"] == pytest.approx(0.4)  # the communication still in it
    assert rows["other"]["measured_s"] == pytest.approx(0.1)
    assert "no probe step ran" in report["terms_note"]
    # with its probe steps the row is measured (0 where the axis has no collective)
    probed = rep.build_report(meta={}, prediction=None, launch={},
                              records=[_rank(0, [_step(1.0, 0.4, 0.4)])])
    assert {t["name"]: t for t in probed["terms"]}["tp_comm"]["measured_s"] == 0.0
    assert "terms_note" not in probed


def _emit_cpu(tmp_path: Path, profile_ranks: int) -> Path:
    """An emitted 2-rank dp job for a CPU profile of profile_ranks ranks, with results whose
    rank 0 issued `collectives`."""
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model
    from perfmodel.strategy import Plan

    cpu = load_hardware("dgx-h100").replace(gpu_name="CPU Test (2 cores)",
                                            gpus_per_node=profile_ranks, ranks_per_device=1.0,
                                            name="calibrated-test")
    plan = Plan(gpus=2, dp=2, global_batch=2, dtype="fp32").check(load_model("tiny-gpt"))
    out = tmp_path / "emit"
    vrun.emit(load_model("tiny-gpt"), cpu, plan, vrun.RunSettings(nprocs=2, backend="gloo"),
              out, 1, 2)
    return out


def _results(out: Path, collectives: list[dict]) -> None:
    (out / "results").mkdir(exist_ok=True)
    for rank in range(2):
        rec = {"rank": rank, "status": "ok", "device": "cpu", "steps": [_step(0.5, 0.1, 0.2)],
               "probe": {"comm_seconds": [], "collectives": collectives}}
        (out / "results" / f"rank{rank}.json").write_text(json.dumps(rec))


def test_collect_says_what_a_local_run_says(tmp_path):
    out = _emit_cpu(tmp_path, profile_ranks=4)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["caveats"][0].startswith("profile of 4 ranks, run of 2")
    (grad,) = meta["ledger"]
    _results(out, [{"axis": "dp", "op": "all_reduce", "phase": "grad",
                    "bytes": grad["bytes"], "count": 1.0}])
    report = vrun.collect(out)
    assert report["caveats"][0].startswith("profile of 4 ranks, run of 2")
    assert report["collectives_vs_ledger"]["agree"] is True
    # a job whose collectives the model does not count is said too, as a local run says it
    _results(out, [{"axis": "dp", "op": "all_reduce", "phase": "grad",
                    "bytes": grad["bytes"] + 4, "count": 1.0}])
    report = vrun.collect(out)
    assert report["collectives_vs_ledger"]["agree"] is False
    assert "differ from perfmodel's ledger" in report["caveats"][-1]
    assert "ledger" not in report  # meta's expected rows are not a report field


def test_collect_reads_a_meta_json_written_before_the_ledger_and_caveats(tmp_path):
    out = _emit_cpu(tmp_path, profile_ranks=2)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["caveats"] == []
    for key in ("ledger", "caveats"):
        meta.pop(key)
    (out / "meta.json").write_text(json.dumps(meta))
    _results(out, [])
    report = vrun.collect(out)
    assert report["caveats"] == [] and report["collectives_vs_ledger"] is None


@pytest.mark.parametrize("change, message", [
    ({"ledger": {"dp": 1}}, "field 'ledger' must be a list"),
    ({"ledger": [{"axis": "dp", "op": "all_reduce", "phase": "grad", "count": -1, "bytes": 4}]},
     "ledger[0].count is -1"),
    ({"caveats": "unfair"}, "field 'caveats' must be a list of warnings"),
])
def test_collect_refuses_a_malformed_ledger_or_caveats_in_one_line(tmp_path, change, message):
    out = _emit_cpu(tmp_path, profile_ranks=2)
    meta = out / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), **change}))
    _results(out, [])
    code, _, err = run_main(["validate", "collect", str(out), "--history", str(tmp_path / "h")])
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_a_reused_run_directory_loses_the_last_runs_report(tmp_path, monkeypatch):
    """prepare() (under the run directory's lock) removes the last run's records, report and
    chart: a report written elsewhere (--out) leaves none of another plan beside this run's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("rank0.json", "results.json", "report.json", "report.png"):
        (run_dir / name).write_text("{}")
    seen = {}

    def fake_launch(module, args, nprocs, directory, **kw):
        kw["prepare"]()
        seen["left"] = sorted(p.name for p in directory.iterdir())
        from workload.launcher import LaunchResult
        return LaunchResult(ok=False, interrupted=True, ranks=[], elapsed_s=0.0, port=0,
                            reason="test", notes=[])

    monkeypatch.setattr(vrun, "launch", fake_launch)
    vrun.run_job({"plan": {}}, run_dir, vrun.RunSettings(nprocs=2))
    assert seen["left"] == ["config.json"]


def test_emitting_again_into_a_directory_drops_the_last_jobs_results(tmp_path):
    out = _emit_cpu(tmp_path, profile_ranks=2)
    _results(out, [])
    (out / "report.json").write_text("{}")
    _emit_cpu(tmp_path, profile_ranks=2)  # the same directory again
    assert sorted(p.name for p in (out / "results").iterdir()) == []
    assert not (out / "report.json").exists()


def test_collect_refuses_results_of_another_plan_than_the_emitted_one(tmp_path):
    out = _emit_cpu(tmp_path, profile_ranks=2)
    config = json.loads((out / "config.json").read_text())
    ranks = [{"rank": r, "status": "ok", "device": "cpu", "steps": [_step(0.5, 0.1, 0.2)]}
             for r in range(2)]
    (out / "results").mkdir()
    merged = out / "results" / "results.json"
    merged.write_text(json.dumps({"config": config, "ranks": ranks}))
    assert vrun.collect(out)["status"] == "ok"
    other = {**config, "plan": {**config["plan"], "tp": 2, "dp": 1}}
    merged.write_text(json.dumps({"config": other, "ranks": ranks}))
    code, _, err = run_main(["validate", "collect", str(out), "--history", str(tmp_path / "h")])
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert "these results are of another job" in err
