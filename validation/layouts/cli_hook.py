"""`perfmodel validate` for the layouts this package runs: a transformer plan with --tp-layout 2d or
3d (one block timed on tp local ranks, collectives checked against the model's ledger) and a
layer-graph MLP with --pr/--pc (timed against perfmodel.layerwise.predict_grid).

    perfmodel validate --model tiny-gpt --hidden 64 --heads 4 --tp 4 --tp-layout 2d \
        --micro-batch 2 --dtype fp32 --hardware dgx-a100-80gb
    perfmodel validate --model mlp-spec.yaml --pr 2 --pc 2 --global-batch 32 --hardware H

validation/cli.py calls :func:`wants_layout` and, when it is true, :func:`run_from_cli` with its
keyword arguments; everything else stays on the existing path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from perfmodel.errors import PlanError
from perfmodel.files import check_output, write_atomic
from perfmodel.output import json_text
from validation.jobspec import model_overrides
from validation.layouts.compare import render, render_grid, validate_grid, validate_layout


def wants_layout(kw: dict[str, Any]) -> bool:
    """True for a real run (not --dry-run or --emit) of a 2D/3D plan or a --pr/--pc grid."""
    if kw.get("dry_run") or kw.get("emit_dir") is not None:
        return False
    layout = str(kw.get("tp_layout") or "1d")
    return layout in ("2d", "3d") or bool(kw.get("pr") or kw.get("pc"))


def run_from_cli(kw: dict[str, Any]) -> dict[str, Any]:
    """Run, save the report (--out, default <run dir>/report.json) and print it."""
    from perfmodel.cli import build_inputs, layer_graph_inputs

    kw = dict(kw)
    if kw.get("profile") is None and kw.get("hardware") is None:
        raise click.UsageError("give --hardware (a preset or file) or --profile")
    kw["dtype"] = kw.get("dtype") or "fp32"
    graph = layer_graph_inputs(kw)
    args = (kw["steps"], kw["warmup"], kw["timeout_s"])
    check_output(kw.get("out"), what="layout report", make_parents=True)  # before the run
    if graph is not None:
        model, hardware, plan = graph
        ranks, label = plan.pr * plan.pc, f"prpc-{plan.pr}x{plan.pc}"
        _check_nprocs(kw, ranks)
        run_dir = _run_dir(kw, label)
        report = validate_grid(model, hardware, plan, run_dir, *args)
        lines = render_grid(report)
    else:
        model, hardware, plan = build_inputs(kw)
        model = model_overrides(model, kw)
        plan.check(model)
        _check_nprocs(kw, plan.tp)
        run_dir = _run_dir(kw, f"{kw['tp_layout']}-tp{plan.tp}")
        report = validate_layout(model, hardware, plan, run_dir, *args)
        lines = render(report)
    out = Path(kw.get("out") or run_dir / "report.json")
    write_atomic(out, json_text(report, indent=1, default=str), what="layout report",
                 make_parents=True)
    if kw.get("as_json"):
        click.echo(json_text(report, indent=1, default=str))
    else:
        for line in lines:
            click.echo(line)
        click.echo(f"report: {out}")
    return report


def _check_nprocs(kw: dict[str, Any], ranks: int) -> None:
    if kw.get("nprocs") and kw["nprocs"] != ranks:
        raise PlanError(f"this layout runs on {ranks} ranks, got --nprocs {kw['nprocs']}")


def _run_dir(kw: dict[str, Any], label: str) -> Path:
    if kw.get("run_dir"):
        return Path(kw["run_dir"])
    return Path("validation-runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
