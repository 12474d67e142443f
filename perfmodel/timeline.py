"""The predicted step as a timeline: `predict --trace FILE` (Chrome / Perfetto trace JSON) and
`--timeline FILE` (a Gantt chart, perfmodel.plot.timeline_figure).

What is drawn is the step model's own composition (perfmodel.step), laid out in time:
- one process per pipeline stage, one track per stream: `schedule` (the passes and the bubbles),
  `compute` (device time), `host` (dispatch: kernel launches, the framework's fixed costs,
  collective launches), `TP comm`, `PP p2p` and `DP comm`;
- each micro-batch's forward (F), recompute (R), backward (B) and, for zero-bubble schedules, its
  weight gradient (W) per chunk, in the order the schedule runs them (perfmodel.schedule); inside
  a pass its parts follow each other (host, compute, TP comm, p2p), as the model adds them;
- the pipeline's span, then the step's phases: the data-parallel gradient sync (the part hidden
  behind the backward drawn before the pipeline's end on the DP track, the exposed part after
  it), the tensor-parallel norm gradients, the optimizer step.

Pass times per micro-batch come from the phases of the built model (perfmodel.step.compose's rule:
device + the host's exposed share + exposed comm, by term), by the phase's name (its forward,
backward or recompute; the training loop's ops with the forward); a pipeline's sends and receives
are split half to the forward (the activation) and half to the backward (its gradient), the
stage's collective launches to the passes that issue them. Each stage runs at its own pace (the
first holds the embedding, the last the output layer and the loss): the slowest sets the steady
state and the others' times the fill and drain, as the model composes the step (m t_mb +
T_bubble, T_bubble the other stages' time), so the timeline's span is the predicted step time
where the schedule's order gives the model's closed-form bubble (perfmodel.schedule: all but
zbv); where it does not, `notes` says by how much. Zero-bubble schedules' W is the
weight-gradient time the model fills the bubble with (W_fill / (2 + zbv), the smallest stage's);
the rest of the backward stays in B.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfmodel.errors import DataError, InternalError, PlanError
from perfmodel.schedule import BACKWARD, FORWARD, WEIGHT, Pass, Timed, orders, simulate

STREAMS = ("schedule", "compute", "host", "TP comm", "CP comm", "EP comm", "PP p2p",
           "FP8 amax", "DP comm")
# a pass's parts, in the order drawn
PASS_STREAMS = ("host", "compute", "TP comm", "CP comm", "EP comm", "PP p2p", "FP8 amax")
ROLES = ("forward", "recompute", "backward")
_COMM_STREAM = {"comm/tp": "TP comm", "pipeline/p2p": "PP p2p", "comm/dp": "DP comm",
                "comm/tp_grads": "TP comm", "comm/cp": "CP comm", "comm/ep": "EP comm",
                "comm/fp8_amax": "FP8 amax"}
_STEP_LABEL = {"data_parallel/sync": "gradient sync", "tensor_parallel/norm_grads":
               "TP norm gradients", "optimizer/step": "optimizer step",
               "fp8/weight_cast": "FP8 weight casts"}
_STAGES = ("first", "last", "middle")  # the stage positions the step model composes
TOLERANCE = 1e-9  # relative: the span against the predicted step, overlaps within a track
_NO_CALLS = 1e-30  # a stage that launches no collective divides its (zero) launch time by this


@dataclass(frozen=True, kw_only=True)
class Span:
    """One event: what ran on one track of one process, from start_s for duration_s [s]."""

    process: str
    thread: str
    name: str
    category: str
    start_s: float
    duration_s: float
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.duration_s)):
            raise ValueError(f"span {self.name}: start_s and duration_s must be finite")
        if self.duration_s < 0:
            raise ValueError(f"span {self.name}: duration_s must be >= 0, got {self.duration_s}")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """A step as spans on tracks: processes in display order; step_time_s is where it ends."""

    title: str
    processes: tuple[str, ...]
    spans: tuple[Span, ...]
    step_time_s: float
    predicted_step_time_s: float | None = None
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted({s.process for s in self.spans} - set(self.processes))
        if unknown:
            raise ValueError(f"timeline {self.title}: spans on unlisted processes {unknown}")

    def threads(self, process: str) -> list[str]:
        """The tracks a process uses, in STREAMS order (others after, by name)."""
        used = {s.thread for s in self.spans if s.process == process}
        return [t for t in STREAMS if t in used] + sorted(used - set(STREAMS))


# --- the model's pass times ----------------------------------------------------------------------


def _pass_roles(phase_name: str, term: str) -> tuple[tuple[str, float], ...]:
    """The pass(es) a phase's term belongs to, with the share of it: the layers', embedding's and
    output layer's phases by their name; the p2p phase half forward, half backward (an activation
    forward, its gradient backward); the training loop's ops (the batch, the loss) with the
    forward; a phase of hooks by its term (compute/forward/...)."""
    if phase_name == "pipeline/p2p":
        return (("forward", 0.5), ("backward", 0.5))
    if phase_name == "training_loop":  # the batch's copies and the loss: around the forward
        return (("forward", 1.0),)
    for role in ROLES:
        if phase_name.endswith(f"/{role}") or term.startswith(f"compute/{role}"):
            return ((role, 1.0),)
    raise InternalError(f"the timeline does not know in which pass phase {phase_name} "
                        f"({term}) runs; please report it")


def _launch_roles(phase: str) -> tuple[tuple[str, float], ...]:
    return {"fwd": (("forward", 1.0),), "bwd": (("backward", 1.0),),
            "fwd+bwd": (("forward", 0.5), ("backward", 0.5))}[phase]


def _outputs(built: Any) -> dict[str, Any]:
    """The expressions the timeline needs, by name (see the module doc): per stage position, pass
    and stream the seconds of one micro-batch; per step phase its compute, host, exposed and
    whole communication; m, W_fill, the bubble and the step time."""
    import sympy as sp

    from perfmodel.costs.lattice import times
    from perfmodel.step import compose as CO
    from perfmodel.step.collective import issued_launches
    from perfmodel.step.context import Context

    zero = sp.Integer(0)
    head_first = Context.of(built.family).head_first  # zbv's first rank holds the output layer
    out: dict[str, Any] = {}
    collectives = {id(x): x for phases in built.phases.values() for ph in phases for x in ph.comms}
    for st in _STAGES:
        parts: dict[str, list[Any]] = {f"{st}|{r}|{s}": [] for r in ROLES for s in PASS_STREAMS}
        # the host's share the device does not hide (1 on synchronous ranks): what the stage's
        # terms charge of each host second, so that the passes add up to the stage's time
        composed = built.stages[st]
        shown = composed.host_share[1] if composed.host_share is not None else sp.Integer(1)
        for ph in built.phases[st]:
            terms = CO.phase_terms(ph)
            pieces = [("compute", term, t) for term, t in terms.device.items()]
            pieces += [("host", term, times(shown, t)) for term, t in terms.host.items()]
            pieces += [(_COMM_STREAM[term], term, t) for term, t in terms.comm.items()]
            for stream, term, seconds in pieces:
                for role, share in _pass_roles(ph.name, term):
                    parts[f"{st}|{role}|{stream}"].append(times(share, seconds))
        # the collectives' launches: the stage's launch term, split by the passes that issue them
        issued = issued_launches(collectives.values(), st, head_first)
        calls = sp.Add(*(launches for _, launches in issued))
        for x, launches in issued:
            if launches is sp.S.Zero:  # (0 x the stage's launch term: sympy would ask it whether
                continue  # it is infinite, a walk of all of it)
            for role, share in _launch_roles(x.phase):
                parts[f"{st}|{role}|host"].append(
                    share * launches / sp.Max(calls, _NO_CALLS, evaluate=False)
                    * built.stage_terms[st]["overhead/collectives"])
        out.update({name: sp.Add(*terms) for name, terms in parts.items()})
        out[f"stage_time|{st}"] = built.stage_time[st]
    m = built.quantities["micro_batches"]
    for ph in built.phases["step"]:
        full = sp.Add(*(x.time_per_step_s(m) for x in ph.comms))
        terms = CO.phase_terms(ph, m)
        out[f"step|{ph.name}|compute"] = sp.Add(*terms.device.values())
        out[f"step|{ph.name}|host"] = sp.Add(*terms.host.values())
        out[f"step|{ph.name}|comm_full"] = ph.present * ph.comm_scale * full
        out[f"step|{ph.name}|comm"] = sp.Add(*terms.comm.values())
    out["step|launches"] = built.time_terms["optimizer/step"] - sp.Add(
        *(sp.Add(*CO.phase_terms(ph, m).device.values(), *CO.phase_terms(ph, m).host.values())
          for ph in built.phases["step"] if ph.name == "optimizer/step")) \
        if any(x.per_step for x in collectives.values()) else zero
    out["m"] = m
    out["w_fill"] = built.term_values[CO.W_FILL]
    out["bubble"] = built.time_terms["pipeline/bubble"]
    out["step_time"] = built.step_time
    return out


def _step_meta(built: Any) -> dict[str, Any]:
    """The step phases' names, in order, and their streams (kept with the compiled outputs)."""
    return {"step_phases": [ph.name for ph in built.phases["step"]],
            "step_streams": _step_streams(built)}


def _step_streams(built: Any) -> dict[str, str]:
    """The stream of each step phase's communication (its collectives' term)."""
    return {ph.name: _COMM_STREAM[ph.comms[0].term] if ph.comms else "DP comm"
            for ph in built.phases["step"]}


@dataclass(frozen=True, kw_only=True)
class PassTimes:
    """One plan's pass and step-phase times from the model [s] (see _outputs)."""

    values: Mapping[str, float]
    step_phases: tuple[str, ...]
    step_streams: Mapping[str, str]

    def stage(self, st: str) -> dict[str, dict[str, float]]:
        """role -> stream -> seconds of one micro-batch on stage position st."""
        return {r: {s: self.values[f"{st}|{r}|{s}"] for s in PASS_STREAMS} for r in ROLES}


def pass_times(model: Any, hardware: Any, plan: Any) -> PassTimes:
    """Evaluate the timeline's expressions for one plan (compiled once per family, cached on disk
    like predict's: perfmodel.evaluate.compile_outputs)."""
    from perfmodel.evaluate import compile_outputs, family_of, values_of

    family = family_of(model, hardware, plan)
    compiled = compile_outputs(family, "timeline", _outputs, _step_meta)
    values = {k: float(v) for k, v in compiled(values_of(model, hardware, plan)).items()}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise InternalError(f"timeline: {', '.join(bad[:3])} not finite; please report it")
    return PassTimes(values=values, step_phases=tuple(compiled.meta["step_phases"]),
                     step_streams=dict(compiled.meta["step_streams"]))


# --- laying the step out -------------------------------------------------------------------------


def _label(kind: str, micro_batch: int, chunk: int, chunks: int) -> str:
    return f"{kind}{micro_batch}" + (f"/c{chunk}" if chunks > 1 else "")


def _parts(process: str, name: str, category: str, start: float, end: float,
           parts: Sequence[tuple[str, float]], args: Mapping[str, Any]) -> list[Span]:
    """Spans of a pass's parts one after another from start; the last ends at `end` exactly."""
    out, t = [], start
    shown = [(stream, d) for stream, d in parts if d > 0]
    for i, (stream, d) in enumerate(shown):
        stop = end if i == len(shown) - 1 else min(t + d, end)
        out.append(Span(process=process, thread=stream, name=name, category=category,
                        start_s=t, duration_s=max(0.0, stop - t), args=args))
        t = stop
    return out


def _pass_spans(process: str, timed: Timed, chunks: int, pace: Mapping[str, Mapping[str, float]],
                weight_s: float) -> list[Span]:
    """The spans of one timed pass: its schedule event(s) and its parts on the streams."""
    p = timed.step
    args = {"micro_batch": p.micro_batch, "chunk": p.chunk}
    per = 1.0 / chunks
    if p.kind == WEIGHT:
        name = _label("W", p.micro_batch, p.chunk, chunks)
        span = [("compute", weight_s * per)]
        return [Span(process=process, thread="schedule", name=name, category="weight",
                     start_s=timed.start_s, duration_s=timed.end_s - timed.start_s, args=args),
                *_parts(process, name, "weight", timed.start_s, timed.end_s, span, args)]
    if p.kind == FORWARD:
        name = _label("F", p.micro_batch, p.chunk, chunks)
        parts = [(s, pace["forward"][s] * per) for s in PASS_STREAMS]
        return [Span(process=process, thread="schedule", name=name, category="forward",
                     start_s=timed.start_s, duration_s=timed.end_s - timed.start_s, args=args),
                *_parts(process, name, "forward", timed.start_s, timed.end_s, parts, args)]
    out: list[Span] = []
    recompute = sum(pace["recompute"].values()) * per
    start = timed.start_s
    if recompute > 0:
        name = _label("R", p.micro_batch, p.chunk, chunks)
        mid = min(start + recompute, timed.end_s)
        out.append(Span(process=process, thread="schedule", name=name, category="recompute",
                        start_s=start, duration_s=mid - start, args=args))
        out += _parts(process, name, "recompute", start, mid,
                      [(s, pace["recompute"][s] * per) for s in PASS_STREAMS], args)
        start = mid
    name = _label("B", p.micro_batch, p.chunk, chunks)
    out.append(Span(process=process, thread="schedule", name=name, category="backward",
                    start_s=start, duration_s=timed.end_s - start, args=args))
    out += _parts(process, name, "backward", start, timed.end_s,
                  [(s, pace["backward"][s] * per) for s in PASS_STREAMS], args)
    return out


def _bubbles(process: str, passes: Sequence[Timed], span_s: float) -> list[Span]:
    """The idle gaps of a stage between 0 and the pipeline's end, as explicit events."""
    out, t = [], 0.0
    for timed in [*passes, None]:
        start = span_s if timed is None else timed.start_s
        if start - t > TOLERANCE * max(span_s, 1e-30):
            out.append(Span(process=process, thread="schedule", name="bubble", category="bubble",
                            start_s=t, duration_s=start - t))
        if timed is not None:
            t = timed.end_s
    return out


def stage_names(pp: int) -> tuple[str, ...]:
    if pp == 1:
        return ("stage 0",)
    return tuple(f"stage {s} ({'first' if s == 0 else 'last' if s == pp - 1 else 'middle'})"
                 for s in range(pp))


def predicted_timeline(model: Any, hardware: Any, plan: Any) -> Timeline:
    """The predicted step of one plan laid out in time (see the module doc). A plan on hardware
    whose ranks time-share a device (ranks_per_device > 1) with pp > 1 is refused: the model's
    bubble there is a rate, not an order of passes."""
    from perfmodel.predict import resolve_inputs

    model, hardware, plan = resolve_inputs(model, hardware, plan)
    if plan.pp > 1 and hardware.ranks_per_device != 1:
        raise PlanError(f"--trace/--timeline: hardware '{hardware.name}' has ranks_per_device "
                        f"{hardware.ranks_per_device:g} (ranks time-sharing a device): the "
                        "model's pipeline bubble there is a rate, not a schedule to draw; use "
                        "pp = 1 or hardware with ranks_per_device 1")
    times = pass_times(model, hardware, plan)
    v, pp, sched = plan.virtual_stages, plan.pp, plan.schedule.value
    m = plan.num_micro_batches
    present = _STAGES if pp > 2 else _STAGES[:2]
    slowest = max(present, key=lambda st: times.values[f"stage_time|{st}"])
    # each stage runs at its own pace (the first holds the embedding, the last the output layer
    # and the loss); with one stage, the slower of its two compositions (as the model takes it)
    positions = [slowest] if pp == 1 else [
        "first" if s == 0 else "last" if s == pp - 1 else "middle" for s in range(pp)]
    zero_bubble = sched in ("zb", "zbv") and pp > 1
    weight_s = times.values["w_fill"] / (2 + (sched == "zbv")) if zero_bubble else 0.0
    paces, durations = [], []
    for position in positions:
        pace = times.stage(position)
        # the weight gradients' pass as the model times it (perfmodel.step.pipeline.
        # weight_gradient_fill: on a host-bound stage as long as the host issuing them takes):
        # out of the backward's compute and host time, in their proportion
        issued = pace["backward"]["compute"] + pace["backward"]["host"]
        if weight_s > issued * (1 + TOLERANCE):
            raise InternalError(f"timeline: the weight gradient ({weight_s:g} s) exceeds the "
                                "backward's compute and host time; please report it")
        kept = max(0.0, 1 - weight_s / issued) if issued else 1.0
        pace["backward"]["compute"] *= kept
        pace["backward"]["host"] *= kept
        paces.append(pace)
        durations.append({FORWARD: sum(pace["forward"].values()) / v,
                          BACKWARD: (sum(pace["backward"].values())
                                     + sum(pace["recompute"].values())) / v,
                          WEIGHT: weight_s / v})
    schedule = sched if pp > 1 else "1f1b"
    # a step of several pipeline schedules (Plan.pipeline_micro_batches: torchtitan's gradient
    # accumulation) runs them one after the other, each with its fill and drain
    flushes = plan.pipeline_flushes if pp > 1 else 1
    per = m // flushes  # the micro-batches of one schedule
    one = orders(schedule, pp, per, v if pp > 1 else 1)
    stage_orders = [[Pass(kind=q.kind, micro_batch=q.micro_batch + k * per, chunk=q.chunk)
                     for k in range(flushes) for q in passes] for passes in one]
    timed = simulate(schedule, stage_orders, pp, v if pp > 1 else 1, durations)
    pipeline_s = max(t.end_s for stage in timed for t in stage)
    names = stage_names(pp)
    spans: list[Span] = []
    for s, passes in enumerate(timed):
        spans += _bubbles(names[s], passes, pipeline_s)
        for t in passes:
            spans += _pass_spans(names[s], t, v if pp > 1 else 1, paces[s], weight_s)
    end_s = pipeline_s
    for name in names:
        end_s = _step_tail(spans, name, times, pipeline_s)
    predicted = times.values["step_time"]
    closed = m * times.values[f"stage_time|{slowest}"] + times.values["bubble"]
    notes = []
    if abs(pipeline_s - closed) > TOLERANCE * closed:
        notes.append(f"the {sched} schedule laid out with the model's pass times takes "
                     f"{pipeline_s:.6g} s for the pipeline, the model's closed form "
                     f"{closed:.6g} s ({pipeline_s / closed - 1:+.2%}); the timeline shows the "
                     f"schedule, so it ends at {end_s:.6g} s against the predicted "
                     f"{predicted:.6g} s")
    degrees = f"dp={plan.dp} tp={plan.tp} pp={plan.pp}" \
        + (f" cp={plan.cp}" if plan.cp > 1 else "") + (f" ep={plan.ep}" if plan.ep > 1 else "") \
        + (f" etp={plan.etp}" if plan.etp > 1 else "")
    title = (f"{model.name} on {hardware.name}: {degrees} "
             f"{sched}{f' v={v}' if v > 1 else ''}, {m} micro-batches of {plan.micro_batch}")
    meta = {"model": model.name, "hardware": hardware.name, "plan": plan.to_dict(),
            "paced_by": slowest, "micro_batches": m,
            "stage_time_s": {st: times.values[f"stage_time|{st}"] for st in present}}
    return Timeline(title=title, processes=names, spans=tuple(spans), step_time_s=end_s,
                    predicted_step_time_s=predicted, notes=tuple(notes), meta=meta)


def _step_tail(spans: list[Span], process: str, times: PassTimes, start_s: float) -> float:
    """The step's phases after the pipeline on one stage: each phase's exposed communication (its
    hidden part drawn before start_s on the same track), host time, then device time."""
    t = start_s
    v = times.values
    for phase in times.step_phases:
        comm, full = v[f"step|{phase}|comm"], v[f"step|{phase}|comm_full"]
        host = v[f"step|{phase}|host"] + (v["step|launches"] if phase == "optimizer/step" else 0)
        device = v[f"step|{phase}|compute"]
        label = _STEP_LABEL.get(phase, phase)
        begin = t
        if full > 0:
            hidden = max(0.0, full - comm)
            spans.append(Span(process=process, thread=times.step_streams[phase], name=label,
                              category="sync", start_s=t - hidden, duration_s=hidden + comm,
                              args={"hidden_s": hidden, "exposed_s": comm}))
            t += comm
        for stream, seconds in (("host", host), ("compute", device)):
            if seconds > 0:
                spans.append(Span(process=process, thread=stream, name=label, category="step",
                                  start_s=t, duration_s=seconds))
                t += seconds
        if t > begin:
            spans.append(Span(process=process, thread="schedule", name=label, category="step",
                              start_s=begin, duration_s=t - begin))
    return t


# --- Chrome / Perfetto trace ----------------------------------------------------------------------

US_PER_S = 1e6


def trace_document(timelines: Sequence[Timeline]) -> dict[str, Any]:
    """The Trace Event Format (JSON object form) of one or more timelines: complete events
    (ph "X", ts and dur in microseconds), one process per timeline's process (named
    "TITLE: PROCESS" when there are several timelines), one thread per track, metadata events
    naming them and fixing their order; otherData holds each timeline's step time and notes."""
    events: list[dict[str, Any]] = []
    pid = 0
    several = len(timelines) > 1
    for tl in timelines:
        for proc in tl.processes:
            pid += 1
            label = f"{tl.title}: {proc}" if several else proc
            events += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": label}},
                       {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                        "args": {"sort_index": pid}}]
            threads = tl.threads(proc)
            for tid, thread in enumerate(threads, start=1):
                events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": thread}},
                           {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}}]
            tids = {thread: tid for tid, thread in enumerate(threads, start=1)}
            mine = sorted((s for s in tl.spans if s.process == proc),
                          key=lambda s: (tids[s.thread], s.start_s))
            events += [{"ph": "X", "name": s.name, "cat": s.category, "pid": pid,
                        "tid": tids[s.thread], "ts": s.start_s * US_PER_S,
                        "dur": s.duration_s * US_PER_S, "args": dict(s.args)} for s in mine]
    other = [{"title": tl.title, "step_time_s": tl.step_time_s,
              "predicted_step_time_s": tl.predicted_step_time_s, "notes": list(tl.notes),
              **dict(tl.meta)} for tl in timelines]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"timelines": other}}


def check_trace(doc: Any) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """A trace document's complete events by (pid, tid), after checking what Perfetto and
    chrome://tracing need: a traceEvents list; every event with ph, pid, tid and name; complete
    events with finite ts >= its track's previous end (no overlap, beyond float rounding) and
    dur >= 0; every track named by a thread_name event. DataError names the first problem."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise DataError("trace: expected an object with a 'traceEvents' list")
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    named: set[tuple[int, int]] = set()
    for i, e in enumerate(doc["traceEvents"]):
        missing = [k for k in ("ph", "pid", "tid", "name") if k not in e]
        if missing:
            raise DataError(f"trace: event {i} has no '{missing[0]}'")
        if e["ph"] == "M" and e["name"] == "thread_name":
            named.add((e["pid"], e["tid"]))
        elif e["ph"] == "X":
            for key in ("ts", "dur"):
                value = e.get(key)
                if not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise DataError(f"trace: event {i} ({e['name']}) has {key} {value!r}")
            if e["dur"] < 0:
                raise DataError(f"trace: event {i} ({e['name']}) has a negative duration")
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, evs in tracks.items():
        if track not in named:
            raise DataError(f"trace: track pid {track[0]} tid {track[1]} has no thread_name")
        end = -math.inf
        for e in evs:
            if e["ts"] < end - TOLERANCE * max(abs(end), 1.0):
                raise DataError(f"trace: pid {track[0]} tid {track[1]}: '{e['name']}' at "
                                f"{e['ts']} us starts before the previous event ends ({end} us)")
            end = max(end, e["ts"] + e["dur"])
    return tracks


def write_trace(path: Any, timelines: Sequence[Timeline]) -> None:
    """Write the trace document of the timelines (checked first) atomically."""
    from perfmodel.files import write_atomic
    from perfmodel.output import json_text

    doc = trace_document(timelines)
    try:
        check_trace(doc)
    except DataError as exc:
        raise InternalError(f"the timeline is not a valid trace ({exc}); please report it") \
            from None
    write_atomic(path, json_text(doc, indent=None), what="trace")
