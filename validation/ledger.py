"""The job's collectives against perfmodel's communication ledger for the same plan: call by
call, keyed by (axis, op, bytes per call). The dry run (validation.dryrun) counts them on a fake
process group; a real run (validation.run) counts rank 0's in its probe step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation.jobspec import job_model


def model_ledger(
    model: TransformerSpec, plan: Plan, stage: str = "first"
) -> list[dict[str, Any]] | None:
    """perfmodel's ledger for the plan: axis, op, phase, count per step per rank, bytes per call.

    With pp > 1, only the ops of one pipeline stage: "first" (rank 0's), "last" or "middle".
    """
    try:  # the ledger the step model builds, evaluated for this plan
        from perfmodel.evaluate import compile_family, family_of, values_of
        from perfmodel.predict import ledger_axis
        from perfmodel.specs.hardware import load_hardware
        from perfmodel.step import build
        from perfmodel.step.collective import issued_share
    except ImportError:
        return None
    hardware = load_hardware("dgx-a100-80gb")  # counts and bytes do not depend on the hardware
    plan = plan.replace(attention_kernel=None)  # nor on the attention kernel, which A100 may lack
    family = family_of(model, hardware, plan)
    out = compile_family(family)(values_of(model, hardware, plan))
    # zbv's V shape puts the output layer on the first rank
    head_first = int(plan.pp > 1 and plan.schedule.value == "zbv")
    ledger = []
    for i, op in enumerate(build(family).ledger):
        count = float(out[f"ledger:{i}:calls"])
        on_stage = getattr(op, "stage", "every")
        if plan.pp > 1 and not issued_share(on_stage, stage, head_first):
            continue
        if count:
            ledger.append(
                {
                    "name": op.name,
                    "axis": ledger_axis(op.axis, plan),
                    "op": op.op,
                    "phase": op.phase,
                    "count": count,
                    "bytes": float(out[f"ledger:{i}:nbytes"]),
                }
            )
    return ledger


def compare(measured: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows keyed by (axis, op, bytes per call): count per step on each side. Phases are shown, not
    compared (the ledger's phase names are coarser)."""
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for side, recs in (("job", measured), ("model", ledger)):
        for r in recs:
            key = (r["axis"], r["op"], int(round(r["bytes"])))
            row = rows.setdefault(
                key,
                {
                    "axis": key[0],
                    "op": key[1],
                    "bytes": key[2],
                    "job_count": 0.0,
                    "model_count": 0.0,
                    "job_phases": set(),
                    "model_phases": set(),
                },
            )
            row[f"{side}_count"] += r["count"]
            row[f"{side}_phases"].add(r["phase"])
    out = []
    for key in sorted(rows):
        row = rows[key]
        row["job_phases"] = ",".join(sorted(row["job_phases"]))
        row["model_phases"] = ",".join(sorted(row["model_phases"]))
        row["agree"] = abs(row["job_count"] - row["model_count"]) < 1e-9
        out.append(row)
    return out


def totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (axis, op): calls and bytes per step on each side."""
    acc: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        t = acc[(r["axis"], r["op"])]
        t["job_count"] += r["job_count"]
        t["model_count"] += r["model_count"]
        t["job_bytes"] += r["job_count"] * r["bytes"]
        t["model_bytes"] += r["model_count"] * r["bytes"]
    return [{"axis": a, "op": o, **dict(v)} for (a, o), v in sorted(acc.items())]


def rank0_ledger(model: TransformerSpec, plan: Plan) -> list[dict[str, Any]] | None:
    """The model's ledger of rank 0's collectives for the job's model (what ledger_check compares
    a run's with; --emit writes it into meta.json for collect)."""
    return model_ledger(job_model(model, plan.tp), plan)


def ledger_check(
    model: TransformerSpec, plan: Plan, collectives: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Rank 0's collectives in the probe step (pipeline p2p included) against the model's ledger."""
    if not collectives:
        return None
    ledger = rank0_ledger(model, plan)
    if ledger is None:
        return None
    rows = compare(collectives, ledger)
    return {"agree": all(r["agree"] for r in rows), "rows": rows}
