"""`perfmodel calibrate ...`: run microbenchmarks, import nccl-tests logs and GEMM sweeps, report.

Loaded lazily by perfmodel's CLI through the `perfmodel.commands` entry point. Nothing here imports
torch at module level: import-nccl-tests, import-gemm and report start without it.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from perfmodel.errors import DataError, PerfmodelError

STAGES = ("gemm", "memory", "collectives", "framework", "host", "overlap", "layers")


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A user error becomes one line on stderr and the error's exit code; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PerfmodelError as exc:
            if _debug():
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:  # e.g. the output directory is not writable
            if _debug():
                raise
            where = f" {exc.filename}" if exc.filename else ""
            click.echo(f"error: cannot write or read{where}: {exc.strerror or exc}", err=True)
            sys.exit(PerfmodelError.exit_code)

    return wrapper


def _debug() -> bool:
    """`perfmodel --debug calibrate ...`: let the error through, for its traceback."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("debug"))


def _check_profile_output(out: str, inputs: Sequence[tuple[Path | str | None, str]] = ()
                          ) -> None:
    """Refuse now (OutputError, exit 7) a profile path its write would refuse, as predict's
    outputs are: a name ending in '/' (click's Path would drop the slash and replace the file),
    a missing directory (none is made for it), a directory, device or FIFO in its place; and the
    same for the measurements CSV written beside it; and either where it is an input the
    command reads (a log replaced by the profile fitted to it)."""
    from perfmodel.files import check_distinct, check_output

    check_output(out, what="profile")
    target = Path(os.path.realpath(out)) if Path(out).is_symlink() else Path(out)
    beside = target.with_name(f"{target.stem}.measurements.csv")
    check_output(beside, what="profile measurements")
    check_distinct([(out, "profile"), (beside, "profile measurements")], inputs)


@click.group(name="calibrate")
def calibrate() -> None:
    """Measure this machine, or import nccl-tests logs / GEMM sweeps, into a hardware profile."""


@calibrate.command("run")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(),  # a str: 'real.json/' keeps its '/' for check_output to refuse
    help="Profile JSON to write (the raw CSV goes beside it).",
)
@click.option(
    "--nprocs",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks to launch (default: GPUs, or 2 on CPU). Ignored under torchrun/srun.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nccl", "gloo"]),
    default="auto",
    show_default=True,
    help="Process-group backend; auto: NCCL where CUDA is available, gloo otherwise.",
)
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats (under 2 minutes on CPU).")
@click.option(
    "--max-bytes",
    type=click.IntRange(min=8),
    default=None,
    hidden=True,
    help="Largest collective message (for tests).",
)
@click.option(
    "--stages",
    default=",".join(STAGES),
    hidden=True,
    help="Comma-separated subset of gemm,memory,collectives,framework,host,overlap,layers "
    "(for tests).",
)
@_errors
def run_cmd(
    out: str, nprocs: int | None, backend: str, quick: bool, max_bytes: int | None, stages: str
) -> None:
    """Run GEMM, memory-bandwidth, collective, framework, host (time per framework op) and
    whole-layer microbenchmarks and fit a profile."""
    chosen = tuple(s.strip() for s in stages.split(",") if s.strip())
    bad = [s for s in chosen if s not in STAGES]
    if bad or not chosen:
        raise click.BadParameter(f"stages must be among {', '.join(STAGES)}", param_hint="--stages")
    from perfmodel.extras import require_torch

    require_torch("calibrate run")  # first: a missing extra leaves no directory behind
    _check_profile_output(out)  # before the run, not after it
    from calibration.run import run  # imports torch: after the checks
    console = Console(stderr=True)
    path = run(
        Path(out),
        nprocs=nprocs,
        backend=backend,
        quick=quick,
        max_bytes=max_bytes,
        stages=chosen,
        console=console,
    )
    if path is not None:
        from perfmodel.specs.profile import load_profile

        profile = load_profile(path)
        missing = ", ".join(profile.missing_stages or ()) or "none"
        state = (
            "complete"
            if profile.complete
            else f"INCOMPLETE (interrupted; missing stages: {missing})"
        )
        click.echo(
            f"wrote {path} ({state}, {len(profile.fits)} fits, "
            f"{profile.provenance.get('wall_time_s')} s)"
        )
        if not profile.collective_fits():  # one rank: no link was measured
            click.echo(
                "note: one rank measured no collective: the profile has no links of its own; "
                "give it beside --hardware (predict --hardware PRESET --profile "
                f"{path}), whose links price the collectives"
            )
        if Path(path) != Path(out):
            click.echo(
                f"interrupted: {out} holds a complete profile and is kept; the partial one is "
                f"{path}",
                err=True,
            )
        if not profile.complete:
            sys.exit(130)  # what a shell reports for Ctrl-C; the profile is kept


@calibrate.command("import-nccl-tests")
@click.argument("logs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(),  # a str: 'real.json/' keeps its '/' for check_output to refuse
    help="Profile JSON to write (the raw CSV goes beside it).",
)
@click.option("--base", default=None, help="Hardware preset the profile builds on (e.g. dgx-h100).")
@click.option(
    "--algorithm",
    type=click.Choice(["ring", "tree", "recursive"]),
    default=None,
    help="Alpha-beta form to fit (default: the log's NCCL_ALGO, else ring).",
)
@click.option(
    "--op",
    type=click.Choice(
        [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "reduce",
            "all_to_all",
            "send_recv",
        ]
    ),
    default=None,
    help="The collective, for logs that do not name it.",
)
@click.option(
    "--allow-truncated",
    is_flag=True,
    help="Keep the complete rows of a log cut short (no '# Avg bus bandwidth' line, or its last "
    "row cut mid-line) instead of refusing it.",
)
@_errors
def import_nccl_tests_cmd(
    logs: tuple[Path, ...],
    out: str,
    base: str | None,
    algorithm: str | None,
    op: str | None,
    allow_truncated: bool,
) -> None:
    """Fit alpha-beta models to nccl-tests logs (all_reduce_perf, all_gather_perf, ...).

    A log is what a test prints (also under mpirun --tag-output or srun --label, with NCCL_DEBUG
    lines, CRLF line ends) or the JSON file of its -J option.
    """
    _check_profile_output(out, [(log, "nccl-tests log") for log in logs] +
                          [(base, "hardware spec")])  # before the logs are read and fitted
    from calibration.importers import import_nccl_tests, save

    result = import_nccl_tests(logs, algorithm=algorithm, op=op, allow_truncated=allow_truncated)
    _refuse_mixed_gpus(result.per_source)
    if base is not None:  # --base '': refused as a preset name (not left out)
        from perfmodel.specs.hardware import load_hardware
        from perfmodel.specs.profile import gpu_difference

        base_gpu = load_hardware(base).gpu_name  # fail now on a wrong name, not at predict time
        logs_gpu = result.hardware.get("gpu_name")
        if logs_gpu and gpu_difference(base_gpu, logs_gpu):
            raise DataError(f"--base {base} is {base_gpu}, the logs ran on {logs_gpu}: the "
                            "profile would price these links beside another GPU's compute; give "
                            "--base a spec of the logs' GPU")
    else:
        base = _preset_for(result.hardware.get("gpu_name"), result.hardware.get("gpus_per_node"))
        if base:
            result.notes.append(
                f"base preset '{base}' chosen by the logs' device name and GPUs "
                "per node (override with --base)"
            )
    table = Table("log", "fit", "ranks", "median err", "worst err", "points")
    for s in result.per_source:
        table.add_row(
            s["source"],
            s["fit"],
            str(s["ranks"]),
            f"{s['median_rel_error']:.1%}",
            f"{s['worst_rel_error']:.1%}",
            str(s["n_points"]),
        )
        if s["median_rel_error"] > 0.10:
            result.notes.append(
                f"{s['source']} is not reproduced within 10% (median "
                f"{s['median_rel_error']:.0%}): logs of different systems "
                "share one fit? import them separately"
            )
    path = save(  # after every note: the profile's provenance holds them all
        result,
        out,
        base=base,
        device=result.hardware.get("gpu_name"),
        device_count=max(s["ranks"] for s in result.per_source),
        nodes=max(s["nodes"] for s in result.per_source),
        measured_on=sorted({h for s in result.per_source for h in s["hosts"]}),
        nccl_version=", ".join(result.nccl_versions) or None,
        sources=[str(p) for p in logs],
    )
    console = Console()
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    click.echo(f"wrote {path}")


def _refuse_mixed_gpus(per_source: list[dict[str, Any]]) -> None:
    """Logs of two GPUs (A100 and H100, H100 SXM and PCIe) in one import: refused, one fit of
    their links would be neither's."""
    from perfmodel.specs.profile import gpu_difference

    seen: dict[str, str] = {}  # a GPU name -> the first log that names it
    for s in per_source:
        for name in filter(None, (n.strip() for n in str(s.get("device") or "").split(" / "))):
            seen.setdefault(name, s["source"])
    names = list(seen)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if gpu_difference(a, b):
                raise DataError(f"{seen[a]} ran on {a}, {seen[b]} on {b}: one profile holds one "
                                "GPU's links; import each GPU's logs separately")


def _preset_for(device: str | None, per_node: int | None) -> str | None:
    """The one hardware preset whose GPU name and GPUs per node match the logs, if any."""
    if not device:
        return None
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.presets import HARDWARE_DIR, preset_names

    matches = []
    for name in preset_names(HARDWARE_DIR):
        spec = load_hardware(name)
        if spec.gpu_name == device and (per_node is None or spec.gpus_per_node == per_node):
            matches.append((name, len(spec.levels) > 2))
    if len(matches) > 1:
        # a log measures a node and the network between nodes: a preset that only adds fabric
        # levels above them (dgx-h100-superpod beside dgx-h100) is not a second candidate
        matches = [m for m in matches if not m[1]]
    return matches[0][0] if len(matches) == 1 else None


@calibrate.command("import-gemm")
@click.argument("tables", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(),  # a str: 'real.json/' keeps its '/' for check_output to refuse
    help="Profile JSON to write (the raw CSV goes beside it).",
)
@click.option("--base", default=None, help="Hardware preset the profile builds on.")
@click.option("--device", default=None, help="Keep one device of the tables (e.g. sm_90).")
@click.option(
    "--folds",
    type=click.IntRange(min=2),
    default=5,
    show_default=True,
    help="Cross-validation folds for the hold-out error.",
)
@_errors
def import_gemm_cmd(
    tables: tuple[Path, ...], out: str, base: str | None, device: str | None, folds: int
) -> None:
    """Fit the GEMM efficiency model to published sweeps (CSV of shape, dtype, FLOP/s)."""
    _check_profile_output(out, [(table, "GEMM table") for table in tables] +
                          [(base, "hardware spec")])  # before the fit: it takes seconds
    from calibration.gemm_tables import device_gpus, device_info, read_gemm_table
    from calibration.importers import import_gemm, save

    peaks = None
    base_spec = None
    if base is not None:  # --base '': refused as a preset name (not left out)
        from perfmodel.specs.hardware import load_hardware
        from perfmodel.specs.profile import gpu_models

        base_spec = load_hardware(base)  # fail now on a wrong name, not at predict time
        peaks = _scaled_peaks(base_spec)
        ours = gpu_models(base_spec.gpu_name)
        for dev in sorted({str(d) for p in tables for d in read_gemm_table(p)["device"]}):
            theirs = set(device_gpus(dev))
            if (device is None or dev == device) and theirs and ours and not theirs & ours:
                raise DataError(  # before the fit: it takes seconds
                    f"--base {base} is {base_spec.gpu_name}, the tables' device {dev} is "
                    f"{' or '.join(sorted(theirs))}: the profile would hold its GEMMs as "
                    "fractions of another GPU's peaks; give --base a spec of the tables' GPU"
                )
    result = import_gemm(tables, device=device, folds=folds, peaks=peaks)
    devices = sorted({str(d) for d in result.measurements["device"].unique()})
    _drop_unscaled_efficiency(result, base, base_spec)
    if len(devices) == 1 and device_info(devices[0]) is not None:
        result.hardware["gpu_name"] = _gemm_gpu_name(devices[0], base_spec)
    path = save(
        result,
        out,
        base=base,
        device=", ".join(sorted({f["device"] for f in result.fits.values()})),
        device_count=1,
        sources=[str(p) for p in tables],
    )
    table = Table("fit", "shapes", "fit median", "hold-out median", "worst (fit)")
    for s in result.per_source:
        table.add_row(
            s["source"],
            str(s["n_points"]),
            f"{s['median_rel_error']:.1%}",
            f"{s['holdout_median_rel_error']:.1%}",
            f"{s['worst_rel_error']:.1%}",
        )
    console = Console()
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    click.echo(f"wrote {path}")


def _scaled_peaks(spec: Any) -> dict[str, float]:
    """Each dtype's peak [FLOP/s] as predict scales it on `spec` (tf32 at fp32's where the GPU
    has no TF32: HardwareSpec.peak), the peaks a --base's fits are fitted against."""
    from perfmodel.errors import PlanError
    from perfmodel.specs.hardware import DTYPES

    peaks = {}
    for dtype in DTYPES:
        try:
            peaks[dtype] = spec.peak(dtype)
        except PlanError:  # the GPU does not run it
            continue
    return peaks


def _drop_unscaled_efficiency(result: Any, base: str | None, base_spec: Any) -> None:
    """Keep a dtype's efficiency only where its fits' fractions are of the peak predict scales
    for that dtype: --base's, else the preset of the tables' GPU (gfx950's f32 rows are fitted
    against the bf16 peak, mi355x prices tf32 at its fp32 rate); a note says what is dropped."""
    import math

    from calibration.gemm_tables import device_preset
    from perfmodel.specs.hardware import load_hardware

    eff = result.hardware.get("gemm_efficiency")
    if not eff:
        return
    for canon in list(eff):
        fits = [f for f in result.fits.values() if f.get("perfmodel_dtype") == canon]
        dev = fits[0]["device"] if fits else None
        name = base or (device_preset(dev) if dev else None)
        if not fits or name is None:  # a GPU without a preset: its datasheet peak stands
            continue
        spec = base_spec if base else load_hardware(name)
        target = _scaled_peaks(spec).get(canon)
        fitted = float(fits[0]["peak_flops_per_s"])
        if target is not None and math.isclose(fitted, target, rel_tol=1e-3):
            continue
        del eff[canon]
        scaled = (f"has no {canon} peak" if target is None else
                  f"scales a {canon} plan by {target:.4g} FLOP/s"
                  + ("" if canon in spec.peak_flops_per_s else " (its fp32 peak)"))
        result.notes.append(
            f"{canon}: the fits' fractions are of {fitted:.4g} FLOP/s "
            f"({fits[0].get('peak_source')}), but {name} {scaled}: not written to the "
            "hardware section"
        )
    if not eff:
        del result.hardware["gemm_efficiency"]


def _gemm_gpu_name(device: str, base_spec: Any) -> str:
    """The GPU a table's device names: --base's (checked to be one of them), else the name of
    the preset its datasheet peaks are from, else the datasheet's."""
    from calibration.gemm_tables import device_info, device_preset
    from perfmodel.specs.hardware import load_hardware

    if base_spec is not None:
        return str(base_spec.gpu_name)
    preset = device_preset(device)
    if preset is not None:
        return str(load_hardware(preset).gpu_name)
    return str((device_info(device) or {})["gpu"])


@calibrate.command("report")
@click.argument("profile", type=click.Path(path_type=Path))
@click.option(
    "--plot",
    type=click.Path(),  # a str: 'fits.png/' keeps its '/' for check_output to refuse
    default=None,
    help="Draw measured against fitted (log-log), one panel per fit, to this PNG (or .svg, .pdf).",
)
@_errors
def report_cmd(profile: Path, plot: str | None) -> None:
    """Print a profile's fits, residuals and size ranges; optionally plot them."""
    from perfmodel.files import check_distinct, check_output

    check_output(plot, what="plot", figure=True)  # before the profile is read and drawn
    check_distinct([(plot, "plot")], [(profile, "profile")])
    from calibration.report import print_report
    from perfmodel.plot import calibration_plot
    from perfmodel.specs.profile import load_profile

    loaded = load_profile(profile)
    if loaded.measurements is not None:  # the plot reads it: never drawn over it (a link to it)
        check_distinct([(plot, "plot")], [(loaded.measurements, "profile's measurements")])
    print_report(loaded)
    if plot is not None:
        click.echo(f"wrote {calibration_plot(loaded, plot)}")


def main() -> None:  # python -m calibration.cli: as `perfmodel calibrate` (SIGTERM as Ctrl-C)
    from perfmodel.cli import main as perfmodel_main

    perfmodel_main(["calibrate", *sys.argv[1:]])


if __name__ == "__main__":
    main()
