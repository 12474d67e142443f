"""`perfmodel validate`: predict, run a real distributed job, measure, compare.

perfmodel validate --model tiny-gpt --profile P --dp 2 --nprocs 2 --steps 5 --out report.json
perfmodel validate --model tiny-gpt --profile P --pp 2 --global-batch 8 --trace t.json \
    --timeline t.png
perfmodel validate --model gpt3-175b --hardware dgx-a100-80gb --tp 8 --dp 64 --dry-run
perfmodel validate --model M --hardware H --tp 8 --pp 4 --dp 2 --emit DIR --nodes 8
perfmodel validate collect DIR
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import click

from perfmodel.cli import (
    FiniteFloat,
    build_inputs,
    check_output_directory,
    input_files,
    plan_options,
    release_held,
    spec_whole,
    whole,
)
from perfmodel.errors import PlanError
from perfmodel.files import check_distinct, check_output
from perfmodel.output import json_text


def _fault(spec: str | None) -> dict[str, Any] | None:
    if not spec:
        return None
    try:
        kind, rank, step = spec.split(":")
        if kind not in ("crash", "hang"):
            raise ValueError
        return {"kind": kind, "rank": int(rank), "step": int(step)}
    except ValueError:
        raise click.BadParameter(
            "use crash:RANK:STEP or hang:RANK:STEP", param_hint="--inject-fault"
        ) from None


def _finish(
    report: dict[str, Any], out: Path, plot_path: Path | None, history: Path | None, as_json: bool
) -> None:
    from validation import report as rep

    rep.save(report, out)
    if plot_path is not None:
        rep.plot(report, plot_path)
    if history is not None:
        rep.append_history(report, history)
    if as_json:
        for caveat in report.get("caveats") or []:
            click.echo(f"warning: {caveat}", err=True)
        click.echo(json_text(report, indent=1, default=str))
    else:
        rep.render(report)
        click.echo(f"report: {out}" + (f"  chart: {plot_path}" if plot_path else ""))
    if report.get("status") == "interrupted":
        click.echo(
            f"interrupted: every rank was stopped; {report.get('steps') or 0} timed steps measured "
            f"before the stop are kept (report: {out})",
            err=True,
        )
        sys.exit(130)  # what a shell reports for Ctrl-C
    if report.get("status") != "ok":
        from validation.run import JobFailed

        failure = (report.get("launch") or {}).get("failure") or {}
        raise JobFailed(
            f"the job failed: rank {failure.get('rank', '?')}: {failure.get('error', 'unknown')} "
            f"(report: {out})"
        )


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@plan_options
@click.option("--layers", type=spec_whole(), default=None, help="Override the model's layer count.")
@click.option("--hidden", type=spec_whole(), default=None, help="Override the model's hidden size.")
@click.option("--heads", type=spec_whole(), default=None,
              help="Override the model's attention heads.")
@click.option("--vocab", type=spec_whole(), default=None, help="Override the model's vocabulary.")
@click.option("--ffn-hidden", type=spec_whole(), default=None,
              help="Override the model's MLP width.")
@click.option(
    "--nprocs", type=whole(), default=None, help="Ranks to launch (default dp x tp x pp)."
)
@click.option(
    "--backend",
    type=click.Choice(["gloo", "nccl"]),
    default=None,
    help="Default: nccl where CUDA exists, gloo otherwise.",
)
@click.option(
    "--steps", type=click.IntRange(1, 10_000), default=5, show_default=True, help="Timed steps."
)
@click.option(
    "--warmup", type=click.IntRange(0, 1000), default=2, show_default=True, help="Untimed steps."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=FiniteFloat(1, 86_400),
    default=300,
    show_default=True,
    help="Seconds before a hung job (or a hung collective) is stopped.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65_535),
    default=None,
    help="Rendezvous port (a free one if omitted or busy).",
)
@click.option(
    "--out",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Report JSON (default: <run dir>/report.json).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Bar chart PNG (default: beside the report).",
)
@click.option(
    "--history",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=Path("validation-runs/history.csv"),
    show_default=True,
    help="CSV to which one row per run is appended.",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),  # not a directory: an output error (check_output_directory)
    default=None,
    help="Where the job's config, logs and results go.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Count the job's collectives on a fake process group of the full world size and "
    "check them against the model's communication ledger (no job is run).",
)
@click.option(
    "--emit",
    "emit_dir",
    type=click.Path(path_type=Path),  # not a directory: an output error (check_output_directory)
    default=None,
    help="Write the job, a torchrun command and a Slurm script here instead of running.",
)
@click.option("--nodes", type=whole(), default=None, help="With --emit: nodes (default gpus / 8).")
@click.option(
    "--gpus-per-node", type=whole(), default=None, help="With --emit: GPUs per node (default 8)."
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Write the predicted and the measured step as one Chrome/Perfetto trace (JSON).",
)
@click.option(
    "--timeline",
    "timeline_path",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Draw the predicted and the measured step as Gantt charts on one time axis (PNG).",
)
@click.option("--inject-fault", default=None, hidden=True, help="crash:RANK:STEP or hang:RANK:STEP")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def validate(ctx: click.Context, /, **kw: Any) -> None:
    """Run the plan as a real torch.distributed job and compare measured with predicted."""
    if ctx.invoked_subcommand is not None:
        return
    if kw["dry_run"] and kw["emit_dir"] is not None:  # as --trace, --plot, --port are with it
        raise click.UsageError("--emit beside --dry-run: a dry run counts the job's collectives "
                               "and writes no job (--emit writes one to run elsewhere); give one "
                               "of them")
    if kw["emit_dir"] is None:  # a local run or a dry run: torch here; --emit writes files only
        from perfmodel.extras import require_torch

        require_torch("validate")
    else:  # refused before the plan is built, as every output path is
        check_output_directory(kw["emit_dir"], "--emit")
    from validation.layouts.cli_hook import run_from_cli, wants_layout

    if kw.get("cpu_offload_layers") and not kw["dry_run"]:  # what as_run refuses, for every job
        raise click.UsageError("--cpu-offload-layers: the validation job offloads no activations "
                               "to the host (Transformer Engine's offload is Megatron-Core's); "
                               "validate the plan without it, or count its collectives with "
                               "--dry-run")
    if wants_layout(kw):  # --tp-layout 2d/3d and --pr/--pc grids: workload.layouts runs them
        run_from_cli(kw)
        return
    from validation import jobspec, run

    _refuse_idle_options(ctx, kw)
    if kw.get("profile") is None and kw.get("hardware") is None and not kw["dry_run"]:
        raise click.UsageError(
            "give --hardware (a preset or file) or --profile (perfmodel calibrate run)"
        )
    if kw["dry_run"] and kw.get("hardware") is None and kw.get("profile") is None:
        kw["hardware"] = "dgx-a100-80gb"  # the ledger does not depend on the hardware
    model_parallel = kw["tp"] * kw["pp"] * (kw.get("cp") or 1)
    source = click.get_current_context().get_parameter_source("dp")
    dp_given = source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
    if kw.get("nprocs") and not dp_given and kw.get("gpus") is None \
            and kw["nprocs"] % model_parallel == 0:
        # --nprocs N without --dp: data parallelism over what tp x pp x cp leaves
        kw["dp"] = kw["nprocs"] // model_parallel
    # the plan checked against the model as scaled down (--layers, --hidden ...), not the preset
    model, hardware, plan = build_inputs(kw, adjust=lambda m: jobspec.model_overrides(m, kw))
    if plan.flash_attention is False:  # --attention unfused: as predict refuses it with cp
        from perfmodel.predict import require_fused_for_cp

        require_fused_for_cp(plan)
    if (kw["trace_path"] or kw["timeline_path"]) and (kw["dry_run"] or kw["emit_dir"]):
        raise click.UsageError("--trace and --timeline draw a local run (not --dry-run or --emit)")
    if kw["dry_run"]:
        from validation import dryrun

        if kw.get("nprocs") and kw["nprocs"] != plan.gpus:  # as the run refuses it (run.validate)
            raise PlanError(f"the plan needs dp x cp x tp x pp = {plan.gpus} ranks, but --nprocs "
                            f"is {kw['nprocs']}: give --nprocs {plan.gpus} or leave it out (the "
                            "dry run counts the plan's ranks)")
        check_output(kw.get("out"), what="dry-run report", make_parents=True)  # before it

        result = dryrun.dry_run(model, plan)
        from perfmodel.encode import resolve_flash

        if plan.cp > 1 and plan.flash_attention is None and \
                not resolve_flash(None, model, hardware, plan.dtype):  # as predict refuses it
            result["notes"].append(
                f"cp {plan.cp}: {hardware.name} has no flash kernel measured for "
                f"{plan.dtype.value}, so predict refuses this plan there; the dry run counts "
                "the job's collectives (it attends with torch's fused SDPA whatever the "
                "hardware)")
        elif (refused := predict_refusal(model, hardware, plan)) is not None:
            result["notes"].append(
                f"predict refuses this plan on {hardware.name} ({refused}); the dry run counts "
                "the job's collectives, which it issues whatever the hardware")
        release_held()
        dryrun.render(result, as_json=kw["as_json"])
        if kw.get("out"):
            from validation.report import save

            save(result, Path(kw["out"]))
        if result["agree"] is False:
            raise PlanError(
                "dry-run: the job's collectives differ from the model's ledger (see above)"
            )
        return
    if kw["emit_dir"] is not None:  # the job runs on the machines the hardware describes
        backend = _emit_backend(hardware, kw["backend"])
    else:
        backend = kw["backend"] or _default_backend()
    nprocs = kw["nprocs"] or plan.gpus
    settings = jobspec.RunSettings(
        nprocs=nprocs,
        backend=backend,
        steps=kw["steps"],
        warmup=kw["warmup"],
        timeout_s=kw["timeout_s"],
        port=kw["port"],
        fault=_fault(kw["inject_fault"]),
    )
    if kw["emit_dir"] is not None:
        gpn = kw["gpus_per_node"] or min(8, plan.gpus)
        nodes = kw["nodes"] or max(1, plan.gpus // gpn)
        written = run.emit(model, hardware, plan, settings, kw["emit_dir"], nodes, gpn)
        release_held()
        for path in written:
            click.echo(f"wrote {path}")
        where = shlex.quote(str(kw["emit_dir"]))
        dtype = jobspec.local_dtype(plan, backend)[0].dtype.value
        click.echo(f"the job: {backend}, {dtype}, {nodes} x {gpn} ranks")
        click.echo(
            f"submit: cd {where} && sbatch job.sbatch; then: perfmodel validate collect {where}"
        )
        return
    if kw["run_dir"] is not None:  # as --emit's: a file in its place is an output error
        check_output_directory(kw["run_dir"], "--run-dir")
    run_dir = kw["run_dir"] or run.default_run_dir(plan)
    _check_outputs(kw["out"] or run_dir / "report.json", kw["plot_path"], kw["history"],
                   kw["trace_path"], kw["timeline_path"])  # before the run, not after it
    out = Path(kw["out"] or run_dir / "report.json")
    trace_path, timeline_path = _as_path(kw["trace_path"]), _as_path(kw["timeline_path"])
    release_held()  # before the run (minutes), as its own lines are
    report = run.validate(model, hardware, plan, settings, run_dir)
    if (trace_path or timeline_path) and report.get("status") == "ok":
        from validation import trace

        ran_model, ran_plan, _ = jobspec.as_run(model, plan, backend)  # what was predicted
        for note in trace.write(report, ran_model, hardware, ran_plan, trace_path,
                                timeline_path):
            click.echo(f"note: {note}", err=True)
    _finish(report, out, _as_path(kw["plot_path"]) or out.with_suffix(".png"),
            _as_path(kw["history"]), kw["as_json"])


# what each way of validating reads (a dry run counts collectives on a fake process group; --emit
# writes the job, which runs elsewhere and is collected by `validate collect`)
_RUN_ONLY = ("nprocs", "steps", "warmup", "timeout_s", "port", "plot_path", "history", "run_dir",
             "inject_fault", "backend")
_NOT_EMITTED = ("plot_path", "history", "run_dir", "inject_fault", "nprocs")
_EMIT_ONLY = ("nodes", "gpus_per_node")


def _refuse_idle_options(ctx: click.Context, kw: dict[str, Any]) -> None:
    """An option the chosen way of validating does not read would change nothing: refused
    (exit 2), naming it, as predict refuses its idle flags. --nprocs beside --dry-run is checked
    against the plan's ranks below (its refusal names the count)."""
    def given(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    def flags(names: tuple[str, ...]) -> str:
        return ", ".join("--" + ctx.command.params[[p.name for p in ctx.command.params]
                                                   .index(n)].opts[0].lstrip("-") for n in names)

    if kw["dry_run"]:
        idle = tuple(n for n in (*_RUN_ONLY, *_EMIT_ONLY) if n != "nprocs" and given(n))
        if idle:
            raise click.UsageError(f"{flags(idle)}: a dry run counts the job's collectives and "
                                   "runs no job; leave them out")
    elif kw["emit_dir"] is not None:
        idle = tuple(n for n in (*_NOT_EMITTED, "out") if given(n))
        if idle:
            raise click.UsageError(f"{flags(idle)}: --emit writes the job to run elsewhere; the "
                                   "report is `perfmodel validate collect DIR`'s (its --out, "
                                   "--history); leave them out")
    else:
        idle = tuple(n for n in _EMIT_ONLY if given(n))
        if idle:
            raise click.UsageError(f"{flags(idle)}: with --emit only (a local run launches "
                                   "--nprocs ranks here)")


def _check_outputs(out: str | Path, plot: str | Path | None, history: str | Path | None,
                   trace: str | Path | None = None, timeline: str | Path | None = None) -> None:
    """Refuse now (OutputError, exit 7) an output path the run's end would refuse (a directory,
    a device, a FIFO, a name ending in '/'): a refused path costs no run, and nothing is created
    for it. The paths are the options as given (str: Path() would drop a trailing '/', and
    'real.json/' would replace the file real.json)."""
    # the report and the history are written with their directories made, the others not (a
    # plot not given goes beside the report, after it: plot None)
    check_output(out, what="validation report", make_parents=True)
    outputs = ((Path(out).with_suffix(".png") if plot is None else plot, "plot", plot is None),
               (history, "validation history", True), (trace, "trace", False),
               (timeline, "timeline", False))
    for path, what, parents in outputs:
        check_output(path, what=what, make_parents=parents, figure=what in ("plot", "timeline"))
    check_distinct([(out, "validation report")] + [(path, what) for path, what, _ in outputs],
                   input_files())


def _as_path(value: str | Path | None) -> Path | None:
    """An output option, checked by _check_outputs, as a Path (None: not given)."""
    return None if value is None else Path(value)


@validate.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Report JSON (default: DIRECTORY/report.json; the chart beside it).",
)
@click.option(
    "--history",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=Path("validation-runs/history.csv"),
    show_default=True,
    help="CSV to which one row per run is appended.",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Write the predicted and the measured step as one Chrome/Perfetto trace (JSON).",
)
@click.option(
    "--timeline",
    "timeline_path",
    type=click.Path(),  # a str: a trailing '/' stays for check_output
    default=None,
    help="Draw the predicted and the measured step as Gantt charts on one time axis (PNG).",
)
@click.option("--hardware", default=None, help="With --trace/--timeline: the hardware to predict "
              "with (default: the report's, when it is a preset).")
@click.option("--profile", default=None, type=click.Path(),
              help="With --trace/--timeline: a calibrated profile to predict with.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def collect(directory: Path, out: str | None, history: str, trace_path: str | None,
            timeline_path: str | None, hardware: str | None, profile: str | None,
            as_json: bool) -> None:
    """Read the results of an emitted job (--emit DIR) back into a report."""
    from validation import run

    if (hardware or profile) and not (trace_path or timeline_path):
        raise click.UsageError("--hardware and --profile give the predicted step of --trace and "
                               "--timeline (the report's prediction is the emitted job's): give "
                               "one of those, or leave them out")
    _check_outputs(out or directory / "report.json", None, history, trace_path, timeline_path)
    report_path = Path(out or directory / "report.json")
    report = run.collect(directory)
    if trace_path or timeline_path:
        from perfmodel.cli import resolve_hardware
        from validation import trace

        hw = resolve_hardware(hardware, profile) if hardware or profile else None
        for note in trace.write_collected(report, hw, _as_path(trace_path),
                                          _as_path(timeline_path)):
            click.echo(f"note: {note}", err=True)
    _finish(report, report_path, report_path.with_suffix(".png"), Path(history), as_json)


def _emit_backend(hardware: Any, asked: str | None) -> str:
    """An emitted job's backend: the hardware's (NCCL for GPUs, gloo for a CPU profile),
    whatever machine writes it; an --backend that contradicts the hardware is refused."""
    from validation.run import target_backend

    backend = target_backend(hardware)
    if asked is not None and asked != backend:
        kind = "a CPU" if backend == "gloo" else "GPUs"
        raise click.BadParameter(
            f"'{asked}' does not run on {getattr(hardware, 'name', 'the hardware')} ({kind}): "
            f"the emitted job uses {backend}; leave --backend out",
            param_hint="--backend",
        )
    return backend


def _default_backend() -> str:
    try:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    except ImportError:
        return "gloo"


def predict_refusal(model: Any, hardware: Any, plan: Any) -> str | None:
    """Why `perfmodel predict` refuses the plan on the hardware, by the checks it makes of its
    inputs (the FP8 recipe the GPU runs, FP8 weights under ZeRO 3, a fused kernel for cp, the
    stack, the dispatcher: perfmodel.predict.resolve_inputs, encode.check_fp8_params), or None:
    a dry run counts the job's collectives whatever the hardware, and says so."""
    from perfmodel.encode import check_fp8_params
    from perfmodel.errors import PerfmodelError
    from perfmodel.predict import resolve_inputs

    try:
        _, _, resolved = resolve_inputs(model, hardware, plan)
        check_fp8_params(hardware, resolved.dtype, resolved.fp8_recipe, resolved.fp8_params,
                         resolved.zero)
    except PerfmodelError as exc:
        return str(exc)
    return None
