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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.timeline import Span, Timeline, predicted_timeline, write_trace

_KINDS = {"F": ("F", "forward"), "B": ("B", "backward"), "W": ("W", "weight")}
_STEP_EVENTS = {"loss": ("loss", "forward"), "sync": ("gradient sync", "sync"),
                "optimizer": ("optimizer step", "step")}


def _process(rank: int, coords: Mapping[str, Any]) -> str:
    where = " ".join(f"{axis} {coords[axis]}" for axis in ("pp", "dp", "tp") if axis in coords)
    return f"rank {rank}" + (f" ({where})" if where else "")


def measured_timeline(report: Mapping[str, Any]) -> Timeline | None:
    """The measured step of a validation report (None when the job recorded no events)."""
    ranks = [r for r in report.get("measured_trace") or [] if r.get("events")]
    if not ranks:
        return None
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
