"""Predicted against measured: the report, its table, its bar chart and the validation history.

Measured terms come from the job's per-rank records (see workload/job.py). Aggregation:
the step time of one step is the slowest rank's (max over ranks); a term of one step is the mean
over the ranks of the pipeline stage the prediction's terms are of (its bottleneck_stage: pp rank
0 for "first", pp - 1 for "last", the others for "middle"; every rank without pipelining), so
that a stage that holds the embedding or the output layer is compared with its own prediction,
not with the mean of unequal stages; both are then the median over the timed steps.
Tensor-, context- and expert-parallel communication (and FSDP's gathers and reduce-scatters, the
gradient sync of zero 3) run inside forward and backward: each is timed per mesh axis in the probe
step and taken out of forward and backward into its own row (tp_comm, cp_comm, ep_comm, grad_sync),
so the terms add up to the step time the way the model's terms do. The prediction's host cost of
launching the micro-batches' collectives (overhead/collectives, one fixed cost per call) is where
the job measures it: inside each collective's probe time, so it is split over those rows by the
model's own launches per axis (the ledger of the stage the terms are of; without one, in
proportion to the rows' predicted communication).

Memory: the peak of tensor memory per rank (max over ranks) against the prediction's memory per GPU
less what it reserves outside tensors (the "reserved" terms: the CUDA context, NCCL buffers and the
allocator's fragmentation). On GPUs
the job reads torch.cuda.max_memory_allocated; on CPUs it measures the same quantity with torch's
profiler (workload.timers.tensor_peak_bytes). The process's peak resident set is shown beside it on
CPUs: it also holds the torch runtime (the baseline measured before the model), gloo's buffers and
what the C allocator keeps, none of which perfmodel predicts.
"""

from __future__ import annotations

import csv
import datetime
import io
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfmodel.files import write_atomic
from perfmodel.output import fmt_bytes, json_text, schema_id

# Each measured term and the prefixes of the prediction's breakdown_s names it is compared with.
# Names of the breakdown that match no prefix go to "other" (e.g. overhead/kernels), but for
# LAUNCHES, split over the rows that measure it (group_predicted).
TERMS: list[tuple[str, tuple[str, ...]]] = [
    ("forward", ("compute/forward", "compute/fwd")),
    ("backward", ("compute/backward", "compute/bwd", "compute/recompute")),
    ("tp_comm", ("comm/tp",)),
    ("cp_comm", ("comm/cp",)),
    ("ep_comm", ("comm/ep",)),
    ("pipeline", ("pipeline/",)),
    # comm/tp_grads: the norms' (and router's) gradients all-reduced over tp after the backward,
    # which the job runs in its gradient sync (workload.trainer.Trainer._grad_sync), not in
    # forward or backward: compared in grad_sync, not with tp_comm (see row_of)
    ("grad_sync", ("comm/dp", "comm/tp_grads")),
    ("optimizer", ("optimizer/",)),
    ("other", ()),
]
# the host's fixed cost of launching the collectives of each micro-batch (perfmodel.step.compose)
LAUNCHES = "overhead/collectives"
# the row that measures a mesh axis' collectives inside forward and backward (the job's probe
# names the axis of each call: workload.timers.CollectiveCounter); the expert-parallel
# groups all in ep_comm (the model's comm/ep), FSDP's in grad_sync, pipeline p2p in pipeline
ROW_OF_AXIS = {"tp": "tp_comm", "cp": "cp_comm", "ep": "ep_comm", "etp": "ep_comm",
               "etp_ep": "ep_comm", "dp": "grad_sync", "dp_cp": "grad_sync", "edp": "grad_sync",
               "pp": "pipeline"}
# the rows whose communication runs inside forward and backward (taken out of them)
COMM_ROWS = ("tp_comm", "cp_comm", "ep_comm", "grad_sync")


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    """(measured - predicted) / predicted: positive when the job is slower than predicted."""
    if measured is None or predicted is None or predicted <= 0:
        return None
    return (measured - predicted) / predicted


def launch_split(breakdown_s: dict[str, float],
                 launches: dict[str, float] | None = None) -> dict[str, float]:
    """The predicted overhead/collectives [s] by report row: in proportion to the model's
    launches per mesh axis in the micro-batches (`launches`: axis -> calls per step; every call
    costs the model the same), else to the rows' predicted communication inside forward and
    backward (tp, cp, ep; FSDP's, in grad_sync, where they have none), else "other"."""
    total = float(breakdown_s.get(LAUNCHES, 0.0) or 0.0)
    if not total:
        return {}
    weights: dict[str, float] = {}
    for axis, calls in (launches or {}).items():
        row = ROW_OF_AXIS.get(axis, "other")
        weights[row] = weights.get(row, 0.0) + max(float(calls), 0.0)
    if not sum(weights.values()):
        grouped = group_predicted(breakdown_s, split=False)
        weights = {row: max(grouped[row], 0.0) for row in ("tp_comm", "cp_comm", "ep_comm")}
        if not sum(weights.values()):
            weights = {"grad_sync": max(grouped["grad_sync"], 0.0)}
    whole = sum(weights.values())
    if not whole:
        return {"other": total}
    return {row: total * w / whole for row, w in weights.items() if w}


def group_predicted(breakdown_s: dict[str, float], launches: dict[str, float] | None = None,
                    split: bool = True) -> dict[str, float]:
    """The prediction's breakdown by report row (TERMS); overhead/collectives split over the
    rows that measure it (launch_split), unless split is False (then in "other")."""
    out = {name: 0.0 for name, _ in TERMS}
    for key, value in breakdown_s.items():
        if split and key == LAUNCHES:
            continue
        out[row_of(key)] += float(value)
    if split:
        for row, value in launch_split(breakdown_s, launches).items():
            out[row] += value
    return out


def row_of(key: str) -> str:
    """The report row of one term of the prediction's breakdown: the row whose prefix matches
    it longest (comm/tp_grads is grad_sync's, not tp_comm's comm/tp), "other" where none does."""
    best, length = "other", 0
    for name, prefixes in TERMS:
        for p in prefixes:
            if key.startswith(p) and len(p) > length:
                best, length = name, len(p)
    return best


def _median_steps(step_times: list[float]) -> list[int]:
    """The indices of the median step(s) by step time: the middle one, or the two middle ones of
    an even count (their mean is statistics.median's)."""
    order = sorted(range(len(step_times)), key=step_times.__getitem__)
    n = len(order)
    return order[(n - 1) // 2: n // 2 + 1]


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _comm_seconds(record: dict[str, Any], axis: str, phase: str) -> float:
    """Seconds of the probe step's collectives on one mesh axis within one phase (fwd, bwd)."""
    probe = record.get("probe") or {}
    return sum(
        c["seconds"]
        for c in probe.get("comm_seconds", [])
        if c["axis"] == axis and c["phase"] == phase
    )


def _comm_parts(record: dict[str, Any], phase: str, key: str, total: float) -> dict[str, float]:
    """The communication inside one timed forward (or backward) of `total` seconds, by the row
    that measures it (COMM_ROWS: each mesh axis' calls, ROW_OF_AXIS).

    The probe steps time each collective, but run slower than the timed steps (a dispatch mode
    sees every op, and a rank waits longer for its peers), so their share of the probe's own
    forward (backward) is applied to the timed one; without probe times, the seconds themselves
    (at most the whole phase, in COMM_ROWS' order).
    """
    parts = {row: 0.0 for row in COMM_ROWS}
    for axis, row in ROW_OF_AXIS.items():
        if row in parts:
            parts[row] += _comm_seconds(record, axis, phase)
    times = (record.get("probe") or {}).get("times")
    if isinstance(times, dict):
        times = [times]
    base = statistics.median(t.get(key, 0.0) for t in times) if times else 0.0
    if base > 0:
        scale = total / max(base, sum(parts.values()))  # shares of at most the whole phase
        return {row: v * scale for row, v in parts.items()}
    left = total
    for row, v in parts.items():
        parts[row] = min(v, max(left, 0.0))
        left -= parts[row]
    return parts


def stage_ranks(records: list[dict[str, Any]], stage: str | None,
                pp: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """The records of the pipeline stage `stage` (first, last, middle: perfmodel's
    bottleneck_stage) by each rank's pp coordinate, and the stage they are ("all" where they
    are every record: for "all" or None, without pipelining, where a record has no pp
    coordinate, or where the stage has no rank among the records). pp: the plan's pipeline
    degree (else the largest coordinate seen + 1)."""
    coords = [r.get("coords") for r in records]
    given = [c.get("pp") if isinstance(c, dict) else None for c in coords]
    if stage not in ("first", "last", "middle") or not records or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in given):
        return records, "all"
    pp_of = [int(c) for c in given if c is not None]  # every one (checked above), typed
    last = (pp if pp else max(pp_of) + 1) - 1
    want = {"first": lambda c: c == 0, "last": lambda c: c == last,
            "middle": lambda c: 0 < c < last}[stage]
    out = [r for r, c in zip(records, pp_of, strict=True) if want(c)]
    return (out, stage) if out and last > 0 else (records, "all")


def measured_terms(
    records: list[dict[str, Any]], stage: str | None = None, pp: int | None = None,
) -> tuple[float | None, dict[str, float | None], int]:
    """Step time (the slowest rank's) and terms (the mean over the ranks of `stage`, see
    stage_ranks) from the per-rank records; also the number of steps all ranks timed.

    Both are of the median step (by step time; the mean of the two middle ones for an even
    count), so that the terms add up to the step time: the median of each term apart would not.
    Where no rank of the stage ran its probe steps (a run stopped or failed before them), the
    communication inside forward and backward cannot be taken out of them: tp_comm, cp_comm and
    ep_comm are then None (unmeasured), not 0, and forward and backward keep it."""
    records = [r for r in records if r.get("steps")]
    if not records:
        return None, {name: None for name, _ in TERMS}, 0
    n = min(len(r["steps"]) for r in records)
    of_stage = {id(r) for r in stage_ranks(records, stage, pp)[0]}
    probed = any(isinstance(r.get("probe"), dict) for r in records if id(r) in of_stage)
    step_times: list[float] = []
    per_term: dict[str, list[float]] = {name: [] for name, _ in TERMS}
    for i in range(n):
        steps = [r["steps"][i] for r in records]
        step_times.append(max(s["step"] for s in steps))
        sums: dict[str, float] = {name: 0.0 for name, _ in TERMS}
        for r, s in zip(records, steps, strict=True):
            if id(r) not in of_stage:
                continue
            fwd, bwd = s.get("forward", 0.0), s.get("backward", 0.0)
            # Communication inside forward and backward, timed in the probe steps: tensor,
            # context and expert parallelism, and FSDP's gathers and reduce-scatters (its
            # gradient sync).
            f = _comm_parts(r, "fwd", "forward", fwd)
            b = _comm_parts(r, "bwd", "backward", bwd)
            sums["forward"] += fwd - sum(f.values())
            sums["backward"] += bwd - sum(b.values())
            for row in COMM_ROWS:
                sums[row] += f[row] + b[row]
            sums["pipeline"] += max(s.get("pipeline_wait", 0.0), 0.0)
            sums["grad_sync"] += s.get("grad_sync", 0.0)
            sums["optimizer"] += s.get("optimizer", 0.0)
        for name in sums:
            if name != "other":
                per_term[name].append(sums[name] / len(of_stage))
        per_term["other"].append(
            step_times[-1] - sum(per_term[k][-1] for k in sums if k != "other")
        )
    middle = _median_steps(step_times)
    terms: dict[str, float | None] = {
        k: sum(v[i] for i in middle) / len(middle) for k, v in per_term.items()}
    if not probed:
        for row in ("tp_comm", "cp_comm", "ep_comm"):
            terms[row] = None
    return sum(step_times[i] for i in middle) / len(middle), terms, n


def build_report(
    *,
    meta: dict[str, Any],
    prediction: dict[str, Any] | None,
    launch: dict[str, Any],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    """The report: meta (model, plan, backend...), prediction, measurement, per-term comparison."""
    plan = meta.get("plan")
    pp = plan.get("pp") if isinstance(plan, dict) and isinstance(plan.get("pp"), int) else None
    ranks, stage = stage_ranks([r for r in records if r.get("steps")],
                               prediction.get("bottleneck_stage") if prediction else None, pp)
    step, terms, steps = measured_terms(records, stage, pp)
    of_stage = sorted(r.get("rank", 0) for r in ranks)
    predicted_step = prediction["step_time_s"] if prediction else None
    launches = meta.get("collective_launches")
    predicted = group_predicted(prediction["breakdown_s"], launches) if prediction else {}
    split = launch_split(prediction["breakdown_s"], launches) if prediction else {}
    rows = []
    for name, _ in TERMS:
        p, m = predicted.get(name), terms.get(name)
        rows.append(
            {
                "name": name,
                "predicted_s": p,
                "measured_s": m,
                "relative_error": relative_error(m, p) if p and p > 1e-9 else None,
            }
        )
    rank0 = next((r for r in records if r.get("rank") == 0), records[0] if records else {})
    report = {
        "schema": schema_id("validate"),
        **meta,
        "status": launch.get("status", "ok" if step is not None else "failed"),
        "predicted_step_time_s": predicted_step,
        "measured_step_time_s": step,
        "relative_error": relative_error(step, predicted_step),
        "steps": steps,
        "terms": rows,
        # the predicted launch cost of collectives (overhead/collectives) by the row it is in
        "launch_overhead": {"predicted_s": sum(split.values()), "rows": split,
                            "by": "launches per axis" if launches else "communication time"}
        if split else None,
        # the ranks whose mean the measured terms are: those of the predicted slowest stage
        "terms_stage": stage,
        "terms_ranks": of_stage,
        "memory": memory_comparison(prediction, records),
        "dtype_used": rank0.get("dtype", meta.get("dtype_used")),
        "dtype_note": rank0.get("dtype_note") or meta.get("dtype_note", ""),
        "collectives_rank0": (rank0.get("probe") or {}).get("collectives", []),
        # each rank's events of its last timed step (validation.trace draws them)
        "measured_trace": [
            {"rank": r.get("rank"), "coords": r.get("coords") or {}, "events": r["trace"]}
            for r in sorted(records, key=lambda r: r.get("rank", 0))
            if isinstance(r.get("trace"), list)
        ],
        "launch": launch,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if step is not None and any(terms.get(row) is None for row in ("tp_comm", "cp_comm",
                                                                   "ep_comm")):
        report["terms_note"] = (
            "no probe step ran (the run stopped before it): forward and backward include their "
            "tensor-, context- and expert-parallel communication, not measured apart (-)")
    if prediction:
        report["prediction"] = prediction
    return report


def memory_comparison(
    prediction: dict[str, Any] | None, records: list[dict[str, Any]]
) -> dict[str, Any]:
    """Predicted against measured peak tensor memory per rank (see the module's docstring)."""
    on_gpu = any(str(r.get("device", "")).startswith("cuda") for r in records)
    peaks = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes")]
    base = [r.get("baseline_memory_bytes", 0) for r in records if r.get("peak_memory_bytes")]
    tensor = peaks if on_gpu else [
        r["tensor_peak_memory_bytes"] for r in records if r.get("tensor_peak_memory_bytes")
    ]
    breakdown = (prediction or {}).get("memory_breakdown_bytes") or {}
    predicted = prediction["memory_per_gpu_bytes"] if prediction else None
    # without what the GPU holds beyond tensors: the context, NCCL buffers, fragmentation
    outside = sum(float(v) for k, v in breakdown.items() if k.startswith("reserved"))
    tensors = None if predicted is None else predicted - outside
    measured = max(tensor) if tensor else None
    notes = [
        r["tensor_memory_note"] for r in records[:1] if r.get("tensor_memory_note")
    ]
    return {
        "predicted_per_rank_bytes": predicted,
        "predicted_tensor_per_rank_bytes": tensors,
        "predicted_breakdown_bytes": breakdown or None,
        "measured_peak_per_rank_bytes": measured,
        "measured_by": "torch.cuda.max_memory_allocated" if on_gpu
        else "tensor allocations of one step (torch.profiler) + tensors kept across steps",
        "relative_error": relative_error(measured, tensors),
        "measured_process_peak_per_rank_bytes": None if on_gpu or not peaks else max(peaks),
        "measured_baseline_per_rank_bytes": max(base) if base and not on_gpu else None,
        "notes": notes,
    }


def render(report: dict[str, Any], console: Any = None) -> None:
    from rich.table import Table

    from perfmodel.render import console as terminal

    console = console or terminal()
    for caveat in report.get("caveats") or []:  # first: what makes the comparison unfair
        console.print(f"[bold red]warning[/]: {caveat}", soft_wrap=True)  # one line each
    for note in report.get("extrapolations") or []:  # what predict notes beside its result
        console.print(f"note: {note}", soft_wrap=True, markup=False, highlight=False)

    def fmt_s(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.2f} ms"

    def fmt_e(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:+.1f}%"

    title = (
        f"validate {report.get('model')} plan {report.get('plan_label', '')} "
        f"on {report.get('ranks')} {report.get('backend')} ranks"
    )
    stage = report.get("terms_stage", "all")
    caption = None if stage == "all" else (
        f"terms: the mean of the {stage} pipeline stage's ranks "
        f"({', '.join(str(r) for r in report.get('terms_ranks') or [])}), the stage the "
        "prediction's terms are of (its slowest); step: the slowest rank's")
    table = Table(title=title, caption=caption)
    for col in ("term", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if col == "term" else "right")
    for row in report["terms"]:
        table.add_row(
            row["name"],
            fmt_s(row["predicted_s"]),
            fmt_s(row["measured_s"]),
            fmt_e(row["relative_error"]),
        )
    table.add_row(
        "[bold]step[/bold]",
        fmt_s(report["predicted_step_time_s"]),
        fmt_s(report["measured_step_time_s"]),
        fmt_e(report["relative_error"]),
    )
    mem = report.get("memory") or {}

    def fmt_b(v: float | None) -> str:
        return "-" if v is None else fmt_bytes(v)

    table.add_section()
    table.add_row(
        "peak memory / rank",
        fmt_b(mem.get("predicted_tensor_per_rank_bytes", mem.get("predicted_per_rank_bytes"))),
        fmt_b(mem.get("measured_peak_per_rank_bytes")),
        fmt_e(mem.get("relative_error")),
    )
    console.print(table)
    if report.get("terms_note"):
        console.print(f"note: {report['terms_note']}", soft_wrap=True)
    if mem.get("measured_peak_per_rank_bytes") and mem.get("measured_by"):
        console.print(f"memory measured as {mem['measured_by']}")
    if mem.get("measured_process_peak_per_rank_bytes"):
        base = mem.get("measured_baseline_per_rank_bytes") or 0
        console.print(
            f"process peak (RSS) per rank: {fmt_b(mem['measured_process_peak_per_rank_bytes'])}, "
            f"{fmt_b(base)} of it before the model (the torch runtime); not predicted"
        )
    reserved = (mem.get("predicted_per_rank_bytes") or 0) - (
        mem.get("predicted_tensor_per_rank_bytes") or mem.get("predicted_per_rank_bytes") or 0
    )
    if reserved > 0:
        console.print(
            f"compared without the {fmt_b(reserved)} the prediction reserves outside tensors"
        )
    for note in mem.get("notes") or []:
        console.print(f"note: {note}")
    launch = report.get("launch_overhead")
    if launch and launch.get("rows"):
        rows = ", ".join(f"{row} {fmt_s(v)}" for row, v in launch["rows"].items())
        by = ("by the model's launches per axis" if launch.get("by") == "launches per axis"
              else "in proportion to their communication")
        console.print(f"note: the predicted launch cost of collectives (overhead/collectives, "
                      f"{fmt_s(launch['predicted_s'])}) is in the rows that time the calls, {by}: "
                      f"{rows}", soft_wrap=True)
    check = report.get("collectives_vs_ledger")
    if check:
        differ = [r for r in check["rows"] if not r["agree"]]
        console.print(
            "collectives of rank 0 against the model's ledger: "
            + ("agree" if not differ else f"{len(differ)} of {len(check['rows'])} kinds differ")
        )
        for r in differ:
            console.print(
                f"  {r['axis']} {r['op']} {fmt_bytes(r['bytes'])}: job {r['job_count']:g}, "
                f"model {r['model_count']:g} per step"
            )
    if report.get("dtype_note"):
        console.print(f"note: {report['dtype_note']}")
    for note in report.get("launch", {}).get("notes", []):
        console.print(f"note: {note}")
    failure = report.get("launch", {}).get("failure")
    if failure:
        console.print(f"[red]failed[/red]: rank {failure['rank']}: {failure['error']}")


def plot(report: dict[str, Any], path: Path) -> None:
    """A bar chart of predicted and measured time per term (perfmodel.plot.validation_axes),
    written atomically."""
    from perfmodel.plot import validation_plot

    validation_plot(report, path)


HISTORY_FIELDS = [
    "created",
    "model",
    "plan",
    "hardware",
    "backend",
    "ranks",
    "steps",
    "dtype_used",
    "status",
    "predicted_step_time_s",
    "measured_step_time_s",
    "relative_error",
]


def append_history(report: dict[str, Any], path: Path) -> None:
    """Append one row to the history CSV (rewritten atomically with the new row).

    Runs in several processes append to one history: the read and the rewrite happen under a
    lock (perfmodel.files.file_lock), so no row is lost.
    """
    from perfmodel.errors import DataError
    from perfmodel.files import file_lock, read_text_bounded

    header, line = io.StringIO(), io.StringIO()
    csv.DictWriter(header, fieldnames=HISTORY_FIELDS).writeheader()
    row = {**report, "plan": report.get("plan_label", "")}
    csv.DictWriter(line, fieldnames=HISTORY_FIELDS, extrasaction="ignore").writerow(
        {k: ("" if row.get(k) is None else row.get(k)) for k in HISTORY_FIELDS}
    )
    with file_lock(path, what=f"validation history {path}"):
        old = read_text_bounded(path, "validation history", error=DataError) \
            if path.exists() else ""
        if old and old.splitlines()[0].strip() != header.getvalue().strip():
            raise DataError(f"validation history {path} is not a history of this perfmodel "
                            f"(its first line is not {','.join(HISTORY_FIELDS)}): give another "
                            "--history")
        if old and not old.endswith("\n"):
            old += "\n"
        write_atomic(path, (old or header.getvalue()) + line.getvalue(), what="validation history",
                     make_parents=True)


def save(report: dict[str, Any], path: Path) -> None:
    write_atomic(path, json_text(report, indent=1, default=str), what="validation report",
                 make_parents=True)
