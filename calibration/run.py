"""`calibrate run`: launch the ranks (or join torchrun/srun), follow progress, fit, write.

Launched here: N ranks on this machine by workload.launcher (python -m calibration.bench, loopback
rendezvous, the ranks' logs in a temporary directory named when a rank fails); rank 0 appends each
measurement to a JSON-lines file that this process follows for the progress bar. Ctrl-C (or
SIGTERM) stops the ranks and keeps what was measured (the profile says "complete": false and names
the stages it lacks). An interrupted run never replaces a complete profile: when --out P already
holds one, the partial profile goes beside it (P.partial.json, see partial_path).
Under torchrun or srun (RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS set) this process is one
rank; rank 0 writes the profile.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from calibration.bench import SETTLE_S, Sweep, run_worker, sweep_for, sweep_to_dict
from calibration.fit import (
    UNRESOLVED_BANDWIDTH_RATIO,
    BandwidthModel,
    CollectiveModel,
    GemmModel,
    KernelOverheadModel,
    OptimizerModel,
)
from calibration.profile_io import provenance, write_profile
from perfmodel.costs.collectives import ALGORITHMS, Op
from perfmodel.errors import DataError, PerfmodelError
from perfmodel.output import fmt_bytes
from perfmodel.specs.loading import FRACTION_FLOOR
from perfmodel.specs.profile import FIT_KINDS

MEASURED = (  # record kinds that are measurements
    "gemm",
    "gemm_sustained",
    "attention",
    "memory",
    "host_link",
    "collective",
    "overhead",
    "kernel_chain",
    "collective_dispatch",
    "optimizer",
    "layer",
    "fsdp_unit",
    "host_ops",
    "overlap",
)


def launched_env() -> dict[str, int] | None:
    """Rank layout when started by torchrun or srun, else None."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return {
            "rank": int(env["RANK"]),
            "world": world,
            "local_rank": int(env.get("LOCAL_RANK", 0)),
            "local_world": int(env.get("LOCAL_WORLD_SIZE", world)),
        }
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise PerfmodelError(
                "under srun, set MASTER_ADDR and MASTER_PORT (e.g. the first "
                "host of SLURM_JOB_NODELIST and a free port)"
            )
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES", 1))
        return {
            "rank": int(env["SLURM_PROCID"]),
            "world": world,
            "local_rank": int(env.get("SLURM_LOCALID", 0)),
            "local_world": world // nodes,
        }
    return None


def choose_backend(backend: str) -> str:
    import torch

    if backend == "auto":
        return (
            "nccl"
            if torch.cuda.is_available() and torch.distributed.is_nccl_available()
            else "gloo"
        )
    if backend == "nccl" and not torch.cuda.is_available():
        raise PerfmodelError("--backend nccl needs CUDA GPUs; none is visible (use gloo)")
    return backend


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by Ctrl-C
            break
    return out


def run(
    out: Path,
    *,
    nprocs: int | None,
    backend: str,
    quick: bool,
    max_bytes: int | None = None,
    stages: tuple[str, ...] | None = None,
    console: Console | None = None,
) -> Path | None:
    """Measure, fit and write the profile; returns its path (None on ranks other than 0).

    One run at a time writes a profile: a second `calibrate run --out` of the same file is
    refused while the first runs (a lock beside it, released however the first one ends).
    """
    from perfmodel.files import file_lock

    console = console or Console(stderr=True)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = launched_env()
    if env is not None and env["rank"] != 0:  # only rank 0 writes
        return _run(out, nprocs, backend, quick, max_bytes, stages, console)
    with file_lock(out, wait_s=0, what=f"profile {out} (another calibrate run writes it)"):
        return _run(out, nprocs, backend, quick, max_bytes, stages, console)


def _run(
    out: Path,
    nprocs: int | None,
    backend: str,
    quick: bool,
    max_bytes: int | None,
    stages: tuple[str, ...] | None,
    console: Console,
) -> Path | None:
    records_path = out.parent / f".{out.name}.records.jsonl"
    env = launched_env()
    backend = choose_backend(backend)
    device = "cuda" if backend == "nccl" else "cpu"
    sweep = sweep_for(device, quick, max_bytes, stages)
    complete = True
    started = time.monotonic()
    if env is not None:
        if env["rank"] == 0:
            records_path.unlink(missing_ok=True)
        progress = _progress(console) if env["rank"] == 0 else None
        task = (
            progress.add_task(f"calibrating ({env['world']} ranks, {backend})")
            if progress
            else None
        )

        def show(record: dict[str, Any], done: int, total: int | None) -> None:
            label = record.get("op") or record.get("kernel") or record.get("kind")
            if progress is None or task is None:  # show is given only with a progress bar
                return
            progress.update(task, completed=done, total=total, description=f"calibrating: {label}")

        if progress is not None:
            progress.start()
        try:
            run_worker(
                env["rank"],
                env["world"],
                env["local_rank"],
                env["local_world"],
                backend,
                sweep,
                records_path if env["rank"] == 0 else None,
                on_record=show if progress is not None else None,
            )
        except KeyboardInterrupt:  # torchrun forwards Ctrl-C to every rank: keep what rank 0 has
            complete = False
            if env["rank"] == 0:
                console.print("interrupted: keeping what was measured (profile marked incomplete)")
        finally:
            if progress is not None:
                progress.stop()
        if env["rank"] != 0:
            return None
    else:
        if nprocs is None:
            import torch

            nprocs = torch.cuda.device_count() if device == "cuda" else 2
        if nprocs < 1:
            raise PerfmodelError("--nprocs must be at least 1")
        records_path.unlink(missing_ok=True)
        complete = _launch(nprocs, backend, sweep, records_path, console)
    records = read_records(records_path)
    elapsed = time.monotonic() - started
    path = build_profile(
        out, records, complete=complete, elapsed_s=elapsed, quick=quick, stages=sweep.stages
    )
    records_path.unlink(missing_ok=True)
    return path


def _launch(nprocs: int, backend: str, sweep: Sweep, records: Path, console: Console) -> bool:
    """Run the sweep on nprocs local ranks; False when Ctrl-C or SIGTERM stopped them."""
    from perfmodel.files import write_atomic
    from perfmodel.output import json_text
    from workload.launcher import launch

    run_dir = Path(tempfile.mkdtemp(prefix="calibrate-"))  # the ranks' config and logs
    config = run_dir / "config.json"
    write_atomic(config, json_text({"backend": backend, "sweep": sweep_to_dict(sweep),
                                    "records": str(records.resolve())}), what="ranks' config")
    with _progress(console) as progress:
        task = progress.add_task(f"calibrating ({nprocs} ranks, {backend})", total=None)
        last = [0.0]

        def follow() -> None:  # the progress bar, from the records rank 0 appends
            if time.monotonic() - last[0] < 0.25:
                return
            last[0] = time.monotonic()
            recs = read_records(records)
            plan = next((r["plan"] for r in recs if "plan" in r), None)
            done = sum(1 for r in recs if r.get("kind") in MEASURED)
            latest: dict[str, Any] = next((r for r in reversed(recs) if "kind" in r), {})
            label = latest.get("op") or latest.get("kernel") or latest.get("kind") or "starting"
            progress.update(task, total=plan, completed=done, description=f"calibrating: {label}")

        result = launch("calibration.bench", [str(config)], nprocs, run_dir, timeout_s=None,
                        on_poll=follow)
    if result.interrupted:
        shutil.rmtree(run_dir, ignore_errors=True)
        console.print("interrupted: keeping what was measured (profile marked incomplete)")
        return False
    if not result.ok:
        codes = [r.exit_code for r in result.ranks]
        failed = result.failed_rank()
        why = f": rank {failed.rank}: {failed.error}" if failed is not None else ""
        raise PerfmodelError(
            f"a calibration rank failed (exit codes {codes}){why}; measured so far is discarded "
            f"(the ranks' logs: {run_dir})"
        )
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _progress(console: Console) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console, transient=False)


def partial_path(out: Path) -> Path:
    """Where an interrupted run writes when `out` holds a complete profile: P.partial.json."""
    return out.with_name(f"{out.stem if out.suffix else out.name}.partial{out.suffix or '.json'}")


def _holds_complete_profile(path: Path) -> bool:
    """True when path is a readable profile that says it is complete."""
    from perfmodel.errors import SpecError
    from perfmodel.specs.profile import load_profile

    if not path.is_file():
        return False
    try:
        return load_profile(path).complete
    except SpecError:
        return False


def build_profile(
    out: Path,
    records: list[dict[str, Any]],
    *,
    complete: bool,
    elapsed_s: float,
    quick: bool,
    stages: tuple[str, ...] | None = None,
) -> Path:
    """Fit the measured records and write the profile (standalone: every required field).

    Returns the path written: `out`, or partial_path(out) for an incomplete run when `out`
    already holds a complete profile (which is kept).
    """
    info = next((r for r in records if r.get("kind") == "info"), None)
    if info is None:
        raise DataError("calibration stopped before any measurement; no profile written")
    support: dict[str, Any] = next((r["ops"] for r in records if r.get("kind") == "support"), {})
    complete = complete and any(r.get("kind") == "done" for r in records)
    finished = {r.get("stage") for r in records if r.get("kind") == "stage_done"}
    missing = [] if complete or stages is None else [s for s in stages if s not in finished]
    df = pd.DataFrame([r for r in records if r.get("kind") in MEASURED])
    fits: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    hardware: dict[str, Any] = {
        "name": f"calibrated-{socket.gethostname()}",
        "gpu_name": info["device"],
        "gpus_per_node": info["local_world"],
        "memory_bytes": info["memory_bytes"],
    }
    if df.empty:
        raise DataError("calibration stopped before any measurement; no profile written")
    # a GPU's host queues kernels and goes on; CPU ranks run them (perfmodel.step.compose)
    hardware["asynchronous_device"] = info.get("device_type") != "cpu"
    cpus = info.get("cpu_count")
    if info.get("device_type") == "cpu" and cpus:
        shared = info["local_world"] * info.get("threads_per_rank", 1) / cpus
        if shared > 1:  # ranks time-share the cores: the rates below are with all of them busy
            hardware["ranks_per_device"] = shared
            notes.append(f"{info['local_world']} ranks on {cpus} CPUs: ranks_per_device {shared:g}")
    _fit_gemm(df, info, fits, hardware, notes)
    _fit_gemm_sustained(df, info, fits, hardware, notes)
    _fit_attention(df, info, fits, hardware, notes)
    _fit_memory(df, info, fits, hardware, notes)
    _fit_collectives(df, info, fits, hardware, notes, support)
    _fit_framework(df, fits, hardware, notes)
    _fit_host(df, fits, hardware, notes)
    _fit_overlap(df, fits, hardware, notes)
    _fit_layers(df, fits, hardware, notes)
    # fit kinds this perfmodel's profile reader does not know yet go to the provenance
    framework_fits = {k: fits.pop(k) for k in list(fits) if fits[k]["kind"] not in FIT_KINDS}
    if not complete:
        notes.append(
            "incomplete run (interrupted): fits use what was measured"
            + (f"; missing stages: {', '.join(missing)}" if missing else "")
        )
    prov = provenance(
        device=info["device"],
        device_count=info["world"],
        nodes=info["nodes"],
        torch_version=info["torch_version"],
        nccl_version=info["nccl_version"],
        gloo=info["gloo"],
        backend=info["backend"],
        quick=quick,
        **({} if stages is None else {"stages": list(stages)}),
        threads_per_rank=info["threads_per_rank"],
        wall_time_s=round(elapsed_s, 1),
        collective_support=support,
        **({"framework_fits": framework_fits} if framework_fits else {}),
    )
    df = df.drop(columns=[c for c in ("note",) if c in df])
    if not complete and _holds_complete_profile(out):
        out = partial_path(out)
    return write_profile(
        out,
        hardware=hardware,
        fits=fits,
        measurements=df,
        provenance=prov,
        complete=complete,
        notes=notes,
        missing_stages=None if stages is None else missing,
    )


def _fit_gemm(df: pd.DataFrame, info: dict, fits: dict, hardware: dict, notes: list[str]) -> None:
    gemm = df[df["kind"] == "gemm"]
    if gemm.empty:
        return
    peaks, effs = {}, {}
    dtype: Any  # a group's key: pandas types it Hashable, it is the column's value
    for dtype, rows in gemm.groupby("dtype"):
        rows = rows.assign(time_s=rows["time_s"].astype(float))
        best = float((2 * rows.b * rows.m * rows.n * rows.k / rows.time_s).max())
        if len(rows) < GemmModel.MIN_POINTS:
            peaks[dtype] = best
            notes.append(
                f"gemm {dtype}: {len(rows)} point(s) only; peak_flops_per_s.{dtype} = "
                f"the measured {best / 1e9:.3g} GFLOP/s, no efficiency fit"
            )
            continue
        bpe = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}.get(dtype, 4.0)
        model = GemmModel(best, math.inf, bpe).fit(rows)
        params, top = model.params_, model.peak_fraction_
        # measured device: the peak is the fitted asymptote (of the faster kernel), max_fraction
        # 1 (same model)
        peaks[dtype] = best * top
        effs[dtype] = {**params, "max_fraction": params["max_fraction"] / top,
                       "large_max_fraction": params["large_max_fraction"] / top, "half_dim": 0.0}
        summary = model.summary()
        summary["params"] = dict(effs[dtype])
        summary.update(
            dtype=dtype,
            peak_flops_per_s=peaks[dtype],
            peak_source="fitted asymptote of the measured sweep",
        )
        fits[f"gemm/{info['device_type']}/{dtype}"] = summary
    if peaks:
        hardware["peak_flops_per_s"] = peaks
    if effs:
        first = "fp32" if "fp32" in effs else next(iter(effs))
        hardware["gemm_efficiency"] = {**effs, "default": effs[first]}
        if info.get("device_type") != "cuda":
            # CPU ranks: the ceilings as the sweep measured them, whatever a preset under the
            # profile says (its fraction is against its own source); on a GPU
            # _fit_gemm_sustained measures this sweep's
            hardware["sustained_clock_fraction"] = 1.0


def _fit_gemm_sustained(df: pd.DataFrame, info: dict, fits: dict, hardware: dict,
                        notes: list[str]) -> None:
    """sustained_clock_fraction from the gemm stage's sustained point (calibration.bench,
    bench_gemm_sustained): the sweep's time of the same shape over its time back to back once
    the device settled. Written on a GPU, where the sweep's ceilings are what gemm_efficiency
    holds and a power cap can slow the GEMMs a training step runs back to back; capped at 1
    (noise can make the settled run faster). On CPU ranks it is reported, not written: the sweep
    runs its GEMMs back to back already, and the rates are as noisy as the difference. On a GPU
    whose point is missing (an interrupted run) or ran shorter than SETTLE_S (a test's tiny
    sweep; calibration.bench.SETTLE_S), nothing is written either, and a note says that the
    preset's fraction, if the profile is laid over one, applies to this sweep's ceilings."""
    gpu = info.get("device_type") == "cuda"
    unmeasured = ("sustained_clock_fraction not measured: a preset the profile is laid over "
                  "keeps its own, applied to this sweep's ceilings")
    if "kind" not in df or not (df["kind"] == "gemm_sustained").any():
        if gpu and "kind" in df and (df["kind"] == "gemm").any():
            notes.append(f"gemm sustained point not run; {unmeasured}")
        return
    point = df[df["kind"] == "gemm_sustained"].iloc[-1]
    shape = tuple(int(point[c]) for c in ("b", "m", "n", "k"))
    gemm = df[(df["kind"] == "gemm") & (df["dtype"] == point["dtype"])]
    same = gemm[(gemm.b == shape[0]) & (gemm.m == shape[1]) & (gemm.n == shape[2])
                & (gemm.k == shape[3])]
    if same.empty:
        notes.append(f"gemm sustained point {point['dtype']} {shape}: the sweep has no time of "
                     f"that shape; {unmeasured}")
        return
    swept, settled = float(same["time_s"].iloc[-1]), float(point["time_s"])
    ratio, duration = swept / settled, float(point["duration_s"])
    settled_long = duration >= SETTLE_S
    written = min(1.0, ratio) if gpu and settled_long else None
    fits[f"gemm_sustained/{info.get('device_type')}/{point['dtype']}"] = {
        "kind": "gemm_sustained", "dtype": point["dtype"], "shape": list(shape),
        "sweep_time_s": swept, "sustained_time_s": settled, "ratio": ratio,
        "duration_s": duration, "written": written}
    if gpu and not settled_long:
        notes.append(f"gemm sustained point ran {duration:.1f} s, under the {SETTLE_S:g} s a GPU "
                     f"takes to settle at its power cap; {unmeasured}")
    elif gpu:
        hardware["sustained_clock_fraction"] = written
        if ratio > 1:
            notes.append(f"gemm sustained: {ratio:.3f} of the sweep's rate back to back (above "
                         "1: noise); sustained_clock_fraction 1")
    else:
        notes.append(f"gemm sustained (CPU ranks, reported, not written): the {shape[1]}^3 GEMM "
                     f"back to back for {duration:.1f} s at {ratio:.3f} of "
                     "the sweep's rate")


def _fit_attention(df: pd.DataFrame, info: dict, fits: dict, hardware: dict,
                   notes: list[str]) -> None:
    """The flash kernel PyTorch's SDPA ran (calibration.bench.bench_attention) in the presets'
    form, per head dim: achieved FLOP/s = peak x f x s / (s + s_half), forward and backward,
    by log least squares (FLOPs as FlashAttention-2 counts them: the forward's causal half of
    4 s^2 d per head, the backward 2.5 x); the profile's default flash kernel, named sdpa."""
    from scipy.optimize import least_squares

    rows = df[df["kind"] == "attention"] if "kind" in df else df.iloc[0:0]
    if rows.empty:
        return
    peak = (hardware.get("peak_flops_per_s") or {}).get("bf16")
    if not peak:
        notes.append("attention: measured, but no bf16 GEMM peak to scale it by (the gemm "
                      "stage's bf16 fit): not fitted")
        return
    points, summary = [], {}
    key: Any  # a group's key: pandas types it Hashable, it is the column's value
    for key, group in rows.groupby("head_dim"):
        head_dim = int(key)
        if group["seq"].nunique() < 3:
            notes.append(f"attention/d{head_dim}: fewer than 3 sequence lengths; not fitted")
            continue
        s = group["seq"].to_numpy(float)
        flops = 2.0 * s * s * float(head_dim) * group["heads"].to_numpy(float) \
            * group["batch"].to_numpy(float)
        fitted = {}
        for direction, factor in (("forward", 1.0), ("backward", 2.5)):
            rate = factor * flops / group[f"{direction}_s"].to_numpy(float)

            def residual(p: np.ndarray, s: np.ndarray = s, rate: np.ndarray = rate) -> np.ndarray:
                return np.log(peak * p[0] * s / (s + p[1])) - np.log(rate)

            # the fraction no lower than a spec may hold (perfmodel.specs.loading.FRACTION_FLOOR)
            sol = least_squares(residual, [0.5, 500.0],
                                bounds=([FRACTION_FLOOR, 0.0], [1.0, 1e6]))
            fraction, half = (float(x) for x in sol.x)
            errors = np.abs(peak * fraction * s / (s + half) / rate - 1)
            fitted[direction] = (fraction, half, float(errors.max()))
        points.append({"head_dim": int(head_dim),
                       "forward_max_fraction": fitted["forward"][0],
                       "forward_half_seq": fitted["forward"][1],
                       "backward_max_fraction": fitted["backward"][0],
                       "backward_half_seq": fitted["backward"][1]})
        summary[f"d{head_dim}"] = {"forward_max_error": fitted["forward"][2],
                                   "backward_max_error": fitted["backward"][2],
                                   "seq_range": [float(s.min()), float(s.max())]}
    if not points:
        return
    hardware["flash_attention"] = {
        "name": "sdpa",
        "kernel": f"PyTorch SDPA as calibrate run measured it (torch {info['torch_version']}, "
                  "causal, bf16)",
        "dtypes": ["bf16"], "by_head_dim": points}
    fits["attention/bf16"] = {"kind": "flash_attention", "peak_flops_per_s": peak,
                              "head_dims": summary, "n_points": len(rows)}


def _fit_memory(df: pd.DataFrame, info: dict, fits: dict, hardware: dict, notes: list[str]) -> None:
    """Bandwidth beyond the last-level cache: sizes whose bytes over all ranks exceed 2x LLC."""
    mem = df[df["kind"] == "memory"]
    measured_beyond: list[float] = []  # the kernels' rates measured beyond the cache
    in_cached: list[float] = []  # and those of kernels whose sizes all ran in it
    if mem.empty:
        mem = pd.DataFrame(columns=["kernel", "nbytes", "time_s"])
    llc = info.get("last_level_cache_bytes")
    kernel: Any  # a group's key: pandas types it Hashable, it is the column's value
    for kernel, rows in mem.groupby("kernel"):
        sizes = np.sort(rows["nbytes"].unique())
        if len(sizes) < 2:
            continue
        beyond = sizes[sizes * info["local_world"] > 2 * llc] if llc else sizes[-3:]
        if len(beyond) == 1:
            # one size beyond the cache: its rate is the memory's; a line through it and a
            # cache-resident size would price the cache's (and held at alpha 0 it averages the
            # two): the rate of that size alone, no fixed cost fitted
            top = rows[rows["nbytes"] == beyond[0]]
            rate = float(beyond[0] / top["time_s"].median())
            fits[f"memory/{kernel}"] = {
                "kind": "memory_bandwidth", "kernel": kernel,
                "params": {"alpha_s": 0.0, "bandwidth_bytes_per_s": rate},
                "median_rel_error": 0.0, "worst_rel_error": 0.0,
                "size_range": [float(beyond[0]), float(beyond[0])], "n_points": len(top),
            }
            notes.append(
                f"memory/{kernel}: one size beyond the cache ({beyond[0]:.0f} B): its rate "
                f"{rate:.3g} B/s taken, no fixed cost fitted (the smaller sizes ran in the cache)"
            )
            measured_beyond.append(rate)
            continue
        in_cache = len(beyond) < 2
        if in_cache:
            beyond = sizes[-2:]
            notes.append(
                f"memory/{kernel}: no size beyond the cache; fitted on the 2 largest, which ran "
                "in it: the bandwidth is the cache's, above the memory's"
            )
        model = BandwidthModel(kernel, tail=1.0).fit(rows[rows["nbytes"] >= beyond[0]])
        fits[f"memory/{kernel}"] = model.summary()
        if model.alpha_pinned_:
            notes.append(
                f"memory/{kernel}: the fixed cost is held at 0 (the times grow faster than the "
                f"bytes), the fit misses by {model.residuals_['median_rel_error']:.0%} (median): "
                "sizes in and beyond a cache?"
            )
        (in_cached if in_cache else measured_beyond).append(model.bandwidth_bytes_per_s_)
    # the memory's rate: the best of the kernels measured beyond the cache; a cache's only where
    # no kernel reached beyond it (said in its note)
    rates = measured_beyond or in_cached
    best = max(rates) if rates else None
    if best is not None:
        hardware["memory_bandwidth_bytes_per_s"] = best
        hardware["memory_bandwidth_efficiency"] = 1.0  # the measured rate is the achieved one
    # the link to host memory (a GPU's; calibration.bench.bench_host_link): the slower direction
    link = df[df["kind"] == "host_link"]
    rates = []
    for direction, rows in link.groupby("direction") if not link.empty else ():
        if rows["nbytes"].nunique() < 2:
            notes.append(f"host_link/{direction}: fewer than 2 sizes; not fitted")
            continue
        model = BandwidthModel(f"host_link_{direction}", tail=1.0).fit(rows)
        fits[f"host_link/{direction}"] = model.summary()
        rates.append(model.bandwidth_bytes_per_s_)
    if rates:
        hardware["host_link_bytes_per_s"] = min(rates)
    over = df[df["kind"] == "overhead"]
    if not over.empty:  # superseded by the kernel chains of the framework stage when it ran
        hardware["kernel_overhead_s"] = float(over["time_s"].median())


def _fit_framework(df: pd.DataFrame, fits: dict, hardware: dict, notes: list[str]) -> None:
    """kernel_overhead_s from the kernel chains, collective_overhead_s from the tiny collectives,
    optimizer_bandwidth_efficiency from the optimizer steps (see calibration.framework)."""
    from perfmodel.costs.precision import optimizer_step_bytes_per_param

    def rows_of(kind: str, columns: tuple[str, ...]) -> pd.DataFrame:
        """Records of one kind; none when the stage did not run (or was interrupted before)."""
        if "kind" not in df or any(c not in df for c in columns):
            return pd.DataFrame(columns=["kind", *columns])
        return df[df["kind"] == kind]

    chains = rows_of("kernel_chain", ("op", "variant", "length", "time_s", "ranks"))
    for variant, rows in chains.groupby("variant"):
        try:
            model = KernelOverheadModel().fit(rows)
        except DataError as exc:
            notes.append(f"kernel overhead ({variant}): {exc}")
            continue
        summary = model.summary()
        summary["variant"] = variant
        summary["ranks"] = int(rows["ranks"].max())
        fits[f"kernel_overhead/{variant}"] = summary
        if variant == "plain":
            hardware["kernel_overhead_s"] = model.kernel_overhead_s_
        else:  # ops on DTensors, as tensor-parallel layers run them
            hardware["kernel_overhead_tp_s"] = model.kernel_overhead_s_
    if "kernel_overhead/dtensor" in fits and "kernel_overhead/plain" in fits:
        ratio = (
            fits["kernel_overhead/dtensor"]["params"]["kernel_overhead_s"]
            / fits["kernel_overhead/plain"]["params"]["kernel_overhead_s"]
        )
        fits["kernel_overhead/dtensor"]["ratio_to_plain"] = ratio
        notes.append(
            f"ops on DTensors cost {ratio:.1f}x the plain per-op overhead "
            "(kernel_overhead_tp_s, charged to the kernels of tensor-parallel layers)"
        )
    disp = rows_of("collective_dispatch", ("implementation", "nbytes", "time_s", "ranks"))
    if not disp.empty:
        by = disp.groupby("implementation")["time_s"].median()
        plain, dtensor = by.get("dist.all_reduce"), by.get("dtensor.redistribute")
        if plain is not None and dtensor is not None:
            extra = max(0.0, float(dtensor - plain))
            hardware["collective_overhead_s"] = extra
            fits["collective_dispatch"] = {
                "kind": "collective_dispatch",
                "params": {"collective_overhead_s": extra},
                "plain_all_reduce_s": float(plain),
                "dtensor_redistribute_s": float(dtensor),
                "nbytes": int(disp["nbytes"].max()),
                "ranks": int(disp["ranks"].max()),
                "note": "plain collectives' fixed cost is in the fitted alpha; "
                "collective_overhead_s is what a DTensor redistribute adds to it (medians over "
                "alternating rounds); the errors are the rounds' spread around the medians",
                **_spread(disp, by),
                "n_points": len(disp),
            }
    opt = rows_of("optimizer", ("params", "time_s"))
    if not opt.empty and opt["params"].nunique() >= 2:
        kernel = str(opt["optimizer"].iloc[0]) if "optimizer" in opt else "adamw_foreach"
        optimizer = OptimizerModel(optimizer_step_bytes_per_param("fp32"), kernel).fit(opt)
        summary = optimizer.summary()
        bw = hardware.get("memory_bandwidth_bytes_per_s")
        largest = optimizer.size_range_[1]
        bytes_share = largest * optimizer.bytes_per_param / optimizer.bandwidth_bytes_per_s_ \
            / float(optimizer.predict([largest])[0])
        if bw and bytes_share < UNRESOLVED_SHARE:
            # the steps did not grow with their bytes beyond their fixed cost (launch-bound
            # sizes): no rate was measured
            notes.append(
                f"optimizer: steps of {optimizer.size_range_[0]:,.0f}-{largest:,.0f} parameters "
                f"did not grow with their bytes ({bytes_share:.2g} of the largest step's time; "
                f"fitted rate {optimizer.bandwidth_bytes_per_s_:.3g} B/s, the copy's "
                f"{bw:.3g}): optimizer_bandwidth_efficiency not set (memory_bandwidth_efficiency "
                "stands in)")
        elif bw:
            # (above 1 where the states stayed in a CPU's cache: read as a copy's rate)
            eff = min(1.0, optimizer.bandwidth_bytes_per_s_ / bw)
            hardware["optimizer_bandwidth_efficiency"] = eff
            summary["optimizer_bandwidth_efficiency"] = eff
            summary["copy_bandwidth_bytes_per_s"] = bw
            # the kernels that rate is of (HardwareSpec.optimizer_kernels: adamw_foreach, _fused)
            hardware["optimizer_kernels"] = kernel.removeprefix("adamw_")
        fits[f"memory/{kernel}"] = summary
        hardware["optimizer_overhead_s"] = optimizer.alpha_s_  # the step's fixed part


# The share of the largest optimizer step's time its bytes must take for the fit to have measured
# a rate: below it the time did not grow with the bytes beyond the timings' few percent of noise
UNRESOLVED_SHARE = 0.01


def _fit_host(df: pd.DataFrame, fits: dict, hardware: dict, notes: list[str]) -> None:
    """host_op_overhead_s from the host stage (see calibration.host)."""
    from calibration.host import HostOpModel

    if "kind" not in df or not (df["kind"] == "host_ops").any():
        return
    try:
        model = HostOpModel().fit(df[df["kind"] == "host_ops"])
    except DataError as exc:
        notes.append(str(exc))
        return
    fits["host_ops"] = model.summary()
    hardware.update(model.hardware())
    if model.split_note_:
        notes.append(model.split_note_)


def _fit_overlap(df: pd.DataFrame, fits: dict, hardware: dict, notes: list[str]) -> None:
    """overlap_compute_slowdown from the overlap stage (see calibration.overlap)."""
    from calibration.overlap import OverlapModel

    if "kind" not in df or not (df["kind"] == "overlap").any():
        return
    try:
        model = OverlapModel().fit(df[df["kind"] == "overlap"])
    except DataError as exc:
        notes.append(str(exc))
        return
    fits["overlap"] = model.summary()
    hardware["overlap_compute_slowdown"] = model.overlap_compute_slowdown_
    if model.dropped_:
        notes.append(f"overlap: {model.dropped_} point(s) whose GEMM chain outlasted the "
                     "collective were left out")
    if model.clipped_:
        notes.append(f"overlap: measured slowdown {model.measured_slowdown_:.3g} is above the "
                     f"field's range; overlap_compute_slowdown = "
                     f"{model.overlap_compute_slowdown_:g}")


def _fit_layers(df: pd.DataFrame, fits: dict, hardware: dict, notes: list[str]) -> None:
    """layer_costs from the layers stage, against perfmodel's predictions with the hardware
    fitted so far (see calibration.layers)."""
    from calibration.layers import fit_fsdp_costs, fit_layer_costs
    from perfmodel.errors import SpecError
    from perfmodel.specs.hardware import hardware_from_dict

    if "kind" not in df or not (df["kind"] == "layer").any():
        return
    try:
        spec = hardware_from_dict(dict(hardware), "calibrated hardware")
    except SpecError as exc:
        notes.append(
            "layer costs not fitted: perfmodel cannot predict a layer without the gemm, memory "
            f"and collectives stages ({exc})"
        )
        return
    hardware.update(fit_fsdp_costs(df, spec, fits, notes))
    costs = fit_layer_costs(df, spec, fits, notes)
    if costs:
        hardware["layer_costs"] = costs


def _spread(disp: pd.DataFrame, medians: pd.Series) -> dict[str, float]:
    """Relative deviation of each round from its implementation's median (median, worst)."""
    err = (disp["time_s"] / disp["implementation"].map(medians) - 1).abs()
    return {"median_rel_error": float(err.median()), "worst_rel_error": float(err.max())}




def _link_bandwidth(model: CollectiveModel, scope: str, notes: list[str]) -> float:
    """The link bandwidth a fitted all-reduce gives: its bus bandwidth where the sweep resolved
    it, else the best it measured (a lower bound), with a note (under load a latency-bound
    sweep fitted 3e17-7e21 B/s, which the profile's own reader then refused)."""
    fitted, seen = model.bus_bandwidth_bytes_per_s_, model.measured_bus_bandwidth_bytes_per_s_
    if fitted <= UNRESOLVED_BANDWIDTH_RATIO * seen:
        return fitted
    notes.append(f"all_reduce ({scope}): the sizes measured (up to "
                 f"{fmt_bytes(model.size_range_[1])}) are latency-bound; the link bandwidth is "
                 f"the best measured, {seen / 1e9:.3g} GB/s, "
                 "a lower bound (measure larger sizes: --max-bytes)")
    return seen


# a collective fit that misses its own measurements by more than this (median) is said in a note
# (the 10% that import-nccl-tests notes a log by)
COLLECTIVE_NOT_REPRODUCED = 0.10


def _fit_collectives(
    df: pd.DataFrame, info: dict, fits: dict, hardware: dict, notes: list[str], support: dict
) -> None:
    coll = df[df["kind"] == "collective"]
    collectives, links = [], {}
    if coll.empty:
        notes.append("no collective measured: no link or collective fits")
        return
    op: Any  # a group's keys: pandas types them Hashable, they are the columns' values
    scope: Any
    for (op, scope), rows in coll.groupby(["op", "scope"]):
        if rows["nbytes"].nunique() < 2:
            continue
        # the algorithm whose step count explains the group sizes best (with one group size
        # measured they all fit alike, and ring, the first, is kept)
        tried = {
            alg.value: CollectiveModel(op, scope, alg.value).fit(rows) for alg in ALGORITHMS[Op(op)]
        }
        best = min(
            tried, key=lambda a: tried[a].residuals_["median_rel_error"] - 1e-9 * (a == "ring")
        )
        model = tried[best]
        summary = model.summary()
        summary["median_rel_error_per_algorithm"] = {
            a: m.residuals_["median_rel_error"] for a, m in tried.items()
        }
        summary["groups"] = sorted(set(rows["group"]))
        summary["implementation"] = support.get(op, "native")
        per_group = {}
        for group, g in rows.groupby("group"):
            err = np.abs(model.predict(g["nbytes"], g["ranks"]) / g["time_s"] - 1)
            per_group[group] = float(np.median(err))
        summary["median_rel_error_per_group"] = per_group
        fits[f"collective/{op}/{scope}/{best}"] = summary
        if model.residuals_["median_rel_error"] > COLLECTIVE_NOT_REPRODUCED:
            # as import-nccl-tests says of a log its fit does not reproduce
            spread = (f"; the repeats' spread, (p90 - p10) / median, up to "
                      f"{float(rows['spread'].max()):.3g}"
                      if "spread" in rows and rows["spread"].notna().any() else "")
            notes.append(
                f"collective/{op}/{scope}/{best}: the fit misses its measurements by "
                f"{model.residuals_['median_rel_error']:.0%} (median, worst "
                f"{model.residuals_['worst_rel_error']:.0%}{spread}): noisy timings, as on a "
                "loaded machine; re-run `perfmodel calibrate run` on a quiet machine"
            )
        collectives.append(dict(model.to_fit().__dict__))
        if op == "all_reduce":
            links[scope] = {
                "bandwidth_bytes_per_s": _link_bandwidth(model, scope, notes),  # large messages
                "latency_s": model.alpha_s_small_ or model.alpha_s_,  # small messages
                "efficiency": 1.0,
            }
    if collectives:
        hardware["collectives"] = collectives
    if "intra" in links:
        hardware["intra_node"] = links["intra"]
        if "inter" not in links:
            links["inter"] = dict(links["intra"])
            notes.append("single node: no inter-node measurement; inter_node copies intra_node")
    if "inter" in links:
        hardware["inter_node"] = links["inter"]
        hardware.setdefault("intra_node", dict(links["inter"]))
    unsupported = {op: how for op, how in support.items() if how != "native"}
    if unsupported:
        notes.append("backend lacks: " + "; ".join(f"{k} ({v})" for k, v in unsupported.items()))
