"""validate --trace / --timeline: a real 2-rank gloo pipeline, its measured step beside the
predicted one in one trace file and one Gantt chart.

One launch (a few seconds of tiny-gpt); the predicted side uses the calibrated CPU profile of the
docs (docs/examples/cpu.json: 2 ranks on this kind of machine, ranks_per_device 1).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from perfmodel.schedule import orders  # noqa: E402
from perfmodel.timeline import check_trace  # noqa: E402
from validation.cli import validate  # noqa: E402

pytestmark = pytest.mark.distributed

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cpu.json"
M = 4  # micro-batches: global batch 4 of micro-batch 1 on one replica


def test_a_two_stage_pipeline_measured_beside_its_prediction(tmp_path):
    trace, gantt = tmp_path / "step.json", tmp_path / "step.png"
    result = CliRunner().invoke(validate, [
        "--model", "tiny-gpt", "--profile", str(PROFILE), "--pp", "2", "--global-batch", str(M),
        "--schedule", "1f1b", "--steps", "1", "--warmup", "1", "--backend", "gloo",
        "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "report.json"),
        "--history", str(tmp_path / "history.csv"), "--trace", str(trace),
        "--timeline", str(gantt), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(trace.read_text())
    tracks = check_trace(doc)  # valid, monotone and non-overlapping per track
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    predicted = sorted(n for n in names.values() if n.startswith("predicted: "))
    measured = sorted(n for n in names.values() if n.startswith("measured: "))
    assert len(predicted) == 2 and len(measured) == 2
    assert measured[0].endswith("rank 0 (pp 0 dp 0 tp 0)")
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
              if e["name"] == "thread_name"}
    for stage, process in enumerate(measured):
        pid = next(p for p, n in names.items() if n == process)
        schedule = [e["name"] for (p, t), events in tracks.items()
                    if p == pid and thread[(p, t)] == "schedule" for e in events]
        passes = [n for n in schedule if n[0] in "FBW" and n[1:].isdigit()]
        # the job ran the order perfmodel.schedule models for 1f1b (torch's Schedule1F1B)
        assert passes == [f"{p.kind}{p.micro_batch}" for p in orders("1f1b", 2, M)[stage]]
        assert "optimizer step" in schedule
    # the predicted side ends at the report's predicted step time
    report = json.loads(result.stdout)
    ends = [e["ts"] + e["dur"] for e in doc["traceEvents"]
            if e["ph"] == "X" and names[e["pid"]].startswith("predicted: ")]
    assert max(ends) / 1e6 == pytest.approx(report["predicted_step_time_s"], rel=1e-9)
    assert len(report["measured_trace"]) == 2
    import matplotlib.image as mpimg

    assert mpimg.imread(gantt).std() > 0.01
