"""The measured step beside the predicted one: `perfmodel validate --trace FILE --timeline FILE`.

The job records, per rank, the events of its last timed step (workload.trainer.Trainer.events:
each micro-batch's forward, backward and weight-gradient pass per model chunk, the loss, the
gradient sync, the optimizer step, in seconds from the step's start after a barrier; the report
keeps them as measured_trace). measured_timeline makes them a perfmodel.timeline.Timeline: one
process per rank (ordered by pipeline stage), its passes on the `schedule` track named as the
prediction names them (F3, B3, W3; /c1 for a rank's second chunk), the sync on `DP comm` and the
optimizer on `compute` (both also on `schedule`, as the prediction draws them). Tensor-parallel
communication and recompute run inside the passes and are not separated (workload.timers says
why). The trace file holds both timelines as separate processes ("predicted: stage 0",
"measured: rank 0 ..."), the Gantt chart draws them on one time axis, predicted above measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfmodel.errors import DataError, PlanError
from perfmodel.timeline import Span, Timeline, predicted_timeline, write_trace

_KINDS = {"F": ("F", "forward"), "B": ("B", "backward"), "W": ("W", "weight")}
_STEP_EVENTS = {"loss": ("loss", "forward"), "sync": ("gradient sync", "sync"),
                "optimizer": ("optimizer step", "step")}


def _process(rank: int, coords: Mapping[str, Any]) -> str:
    where = " ".join(f"{axis} {coords[axis]}" for axis in ("pp", "dp", "tp") if axis in coords)
    return f"rank {rank}" + (f" ({where})" if where else "")


def _check_events(rank: Any, events: Any) -> None:
    """A rank's recorded events as the job writes them (a collected file may hold anything):
    a list of objects with a kind and finite start_s <= end_s; else a DataError naming it."""
    if not isinstance(events, list):
        raise DataError(f"measured trace of rank {rank}: 'events' must be a list")
    for i, e in enumerate(events):
        ok = isinstance(e, dict) and isinstance(e.get("kind"), str) and all(
            isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)
            and math.isfinite(e[k]) for k in ("start_s", "end_s"))
        if not ok or e["end_s"] < e["start_s"]:
            raise DataError(f"measured trace of rank {rank}: event {i} must have a kind and "
                            f"finite start_s <= end_s, got {e!r}"[:300])


def measured_timeline(report: Mapping[str, Any]) -> Timeline | None:
    """The measured step of a validation report (None when the job recorded no events)."""
    ranks = [r for r in report.get("measured_trace") or [] if r.get("events")]
    if not ranks:
        return None
    for r in ranks:
        _check_events(r.get("rank"), r["events"])
    ranks.sort(key=lambda r: ((r.get("coords") or {}).get("pp", 0), r.get("rank", 0)))
    spans: list[Span] = []
    processes = []
    for r in ranks:
        name = _process(int(r.get("rank", 0)), r.get("coords") or {})
        processes.append(name)
        held = sorted({e["chunk"] for e in r["events"] if e.get("chunk") is not None})
        for e in r["events"]:
            kind = e.get("kind")
            if kind in _KINDS:
                letter, category = _KINDS[kind]
                label = f"{letter}{e.get('micro_batch')}"
                if len(held) > 1 and e.get("chunk") in held:
                    label += f"/c{held.index(e['chunk'])}"
            elif kind in _STEP_EVENTS:
                label, category = _STEP_EVENTS[kind]
            else:
                continue
            start, end = float(e["start_s"]), float(e["end_s"])
            thread = str(e.get("thread", "schedule"))
            # the sync and the optimizer on their stream, and on the schedule track as predicted
            for track in dict.fromkeys(("schedule", thread) if kind in ("sync", "optimizer")
                                       else (thread,)):
                spans.append(Span(process=name, thread=track, name=label, category=category,
                                  start_s=start, duration_s=max(0.0, end - start),
                                  args={"micro_batch": e.get("micro_batch"),
                                        "model_chunk": e.get("chunk")}))
    end_s = max((s.end_s for s in spans), default=0.0)
    title = (f"measured: {report.get('plan_label', '')} on {report.get('ranks')} "
             f"{report.get('backend')} ranks (last timed step)")
    return Timeline(title=title, processes=tuple(processes), spans=tuple(spans), step_time_s=end_s,
                    predicted_step_time_s=None,
                    meta={"measured_step_time_s": report.get("measured_step_time_s")})


def side_by_side(report: Mapping[str, Any], model: Any, hardware: Any,
                 plan: Any) -> tuple[list[Timeline], list[str]]:
    """The predicted timeline of the plan the job ran (model and plan as validation.jobspec.as_run
    gives them) and the measured one; notes say what is missing or differs."""
    timelines, notes = [], []
    try:
        predicted = predicted_timeline(model, hardware, plan)
        timelines.append(dataclasses.replace(predicted, title=f"predicted: {predicted.title}"))
        notes += list(predicted.notes)
    except PlanError as exc:
        notes.append(f"no predicted timeline: {exc}")
    measured = measured_timeline(report)
    if measured is None:
        notes.append("no measured timeline: the job recorded no events")
    else:
        timelines.append(measured)
    return timelines, notes


def write(report: Mapping[str, Any], model: Any, hardware: Any, plan: Any,
          trace_path: Path | None, timeline_path: Path | None) -> list[str]:
    """Write the side-by-side trace and/or Gantt chart; returns the notes."""
    timelines, notes = side_by_side(report, model, hardware, plan)
    if not timelines:
        return notes
    if trace_path is not None:
        write_trace(trace_path, timelines)
    if timeline_path is not None:
        from perfmodel.plot import timeline_plot

        timeline_plot(timelines, timeline_path)
    return notes


def write_collected(report: Mapping[str, Any], hardware: Any, trace_path: Path | None,
                    timeline_path: Path | None) -> list[str]:
    """`validate collect --trace/--timeline`: the emitted job's model and plan from its report
    (model_spec, plan), predicted on `hardware` (given, or the report's hardware as a preset);
    without a hardware that loads, the measured side alone and a note."""
    from perfmodel.errors import SpecError
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import model_from_dict
    from perfmodel.strategy import plan_from_dict

    model = model_from_dict(report["model_spec"], "the report's model_spec")
    plan = plan_from_dict(dict(report["plan"]))
    notes = []
    if hardware is None:
        try:
            hardware = load_hardware(str(report.get("hardware")))
        except SpecError:
            notes.append(f"no predicted timeline: the report's hardware "
                         f"'{report.get('hardware')}' is not a preset (give --hardware or "
                         "--profile)")
    if hardware is None:
        measured = measured_timeline(report)
        if measured is None:
            return [*notes, "no measured timeline: the job recorded no events"]
        if trace_path is not None:
            write_trace(trace_path, [measured])
        if timeline_path is not None:
            from perfmodel.plot import timeline_plot

            timeline_plot([measured], timeline_path)
        return notes
    return notes + write(report, model, hardware, plan, trace_path, timeline_path)
