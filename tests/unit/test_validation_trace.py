"""validation.trace: the job's recorded events as a timeline beside the predicted one."""

from __future__ import annotations

from perfmodel.timeline import check_trace, trace_document
from validation.trace import measured_timeline, side_by_side


def event(kind, start, end, mb=None, chunk=None, thread="schedule"):
    return {"kind": kind, "micro_batch": mb, "chunk": chunk, "thread": thread,
            "start_s": start, "end_s": end}


REPORT = {
    "plan_label": "dp1-tp1-pp2-mb1-gb2-zbv", "ranks": 2, "backend": "gloo",
    "measured_step_time_s": 0.01,
    "measured_trace": [
        # listed last-stage first: the timeline orders processes by pipeline stage
        {"rank": 1, "coords": {"pp": 1, "dp": 0, "tp": 0}, "events": [
            event("F", 0.001, 0.002, 0, 1), event("F", 0.002, 0.003, 0, 2),
            event("B", 0.003, 0.004, 0, 2), event("W", 0.004, 0.005, 0, 2),
            event("sync", 0.006, 0.007, thread="DP comm"),
            event("optimizer", 0.007, 0.008, thread="compute")]},
        {"rank": 0, "coords": {"pp": 0, "dp": 0, "tp": 0}, "events": [
            event("F", 0.0, 0.001, 0, 0), event("loss", 0.004, 0.0045),
            event("mystery", 0.0046, 0.0047),
            event("optimizer", 0.007, 0.0085, thread="compute")]},
    ],
}


def test_the_events_become_spans_named_as_the_prediction_names_them():
    tl = measured_timeline(REPORT)
    assert tl is not None
    assert tl.processes == ("rank 0 (pp 0 dp 0 tp 0)", "rank 1 (pp 1 dp 0 tp 0)")
    rank1 = [s.name for s in tl.spans if s.process == tl.processes[1] and s.thread == "schedule"]
    # rank 1 holds model chunks 1 and 2 (the V shape): its first and second chunk
    assert rank1 == ["F0/c0", "F0/c1", "B0/c1", "W0/c1", "gradient sync", "optimizer step"]
    rank0 = [s.name for s in tl.spans if s.process == tl.processes[0]]
    assert "mystery" not in " ".join(rank0) and "loss" in rank0
    assert tl.step_time_s == 0.0085
    check_trace(trace_document([tl]))


def test_no_events_no_timeline():
    assert measured_timeline({"measured_trace": []}) is None
    assert measured_timeline({}) is None


def test_side_by_side_says_what_is_missing():
    timelines, notes = side_by_side({}, "tiny-gpt", "dgx-a100-80gb",
                                    {"gpus": 1, "dtype": "fp32"})
    assert len(timelines) == 1 and timelines[0].title.startswith("predicted: ")
    assert notes == ["no measured timeline: the job recorded no events"]


def test_a_malformed_event_is_refused_in_one_line():
    import pytest

    from perfmodel.errors import DataError

    bad = {"measured_trace": [{"rank": 0, "events": [event("F", 0.2, 0.1, 0, 0)]}]}
    with pytest.raises(DataError, match="rank 0: event 0 must have a kind and finite start_s"):
        measured_timeline(bad)
    with pytest.raises(DataError, match="'events' must be a list"):
        measured_timeline({"measured_trace": [{"rank": 1, "events": "F0"}]})


def test_collect_draws_an_emitted_job_beside_its_prediction(tmp_path):
    import json

    from perfmodel.timeline import check_trace
    from tests.unit.test_bad_input import run_main
    from tests.unit.test_validation_emit import GOOD, _emitted

    out = _emitted(tmp_path, [GOOD])
    for rank in range(2):
        path = out / "results" / f"rank{rank}.json"
        record = json.loads(path.read_text())
        record["coords"] = {"dp": rank, "tp": 0, "pp": 0}
        record["trace"] = [event("F", 0.0, 0.1, 0, 0), event("B", 0.1, 0.3, 0, 0),
                           event("sync", 0.3, 0.4, thread="DP comm")]
        path.write_text(json.dumps(record))
    trace = tmp_path / "t.json"
    code, _, err = run_main(["validate", "collect", str(out), "--history",
                             str(tmp_path / "h.csv"), "--trace", str(trace)])
    assert code == 0, err
    doc = json.loads(trace.read_text())
    check_trace(doc)
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    # predicted on the report's hardware (dgx-h100, a preset): dp 2, one stage
    assert len(names) == 3
    assert names[0].startswith("predicted: tiny-gpt on dgx-h100: dp=2") and names[0].endswith(
        ": stage 0")
    assert names[1].startswith("measured: ") and names[1].endswith(": rank 0 (pp 0 dp 0 tp 0)")
    assert names[2].endswith(": rank 1 (pp 0 dp 1 tp 0)")
