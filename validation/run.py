"""Predict, run, measure, compare: the loop for one plan; emit and collect for clusters."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

from perfmodel.configs.job import EXPANDABLE_ENV
from perfmodel.errors import DataError, PerfmodelError, PlanError
from perfmodel.files import check_output, read_text_bounded, write_atomic
from perfmodel.output import json_text
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation import report as rep
from validation.jobspec import RunSettings, as_run, job_config
from validation.ledger import compare, ledger_check, rank0_ledger
from workload.launcher import LaunchResult, launch

BASELINE_RSS_BYTES = 400 * 2**20  # a Python process with torch imported, before the model


class JobFailed(PerfmodelError):
    """The training job failed, hung or was stopped; the report says which rank and why."""

    exit_code = 6


def plan_label(plan: Plan) -> str:
    parts = [
        f"dp{plan.dp}",
        f"tp{plan.tp}",
        f"pp{plan.pp}",
        f"mb{plan.micro_batch}",
        f"gb{plan.global_batch}",
    ]
    # the degrees a plan has beyond dp x tp x pp (two runs differing in them are two runs)
    parts[3:3] = [f"{axis}{getattr(plan, axis)}" for axis in ("cp", "ep", "etp")
                  if getattr(plan, axis) > 1]
    if plan.cp > 1:
        parts.append(f"cp-{plan.cp_comm.value}")
    if plan.pp > 1:
        parts.append(
            plan.schedule.value + (f"v{plan.virtual_stages}" if plan.virtual_stages > 1 else "")
        )
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.recompute.value != "none":
        parts.append(f"rc-{plan.recompute.value}"
                     + (f"{plan.recompute_every}" if plan.recompute_every > 1 else "")
                     + (f"-{plan.recompute_method.value}{plan.recompute_num_layers}"
                        if plan.recompute_method.value != "uniform"
                        or plan.recompute_num_layers > 1 else ""))
    return "-".join(parts)


def predict_dict(model: TransformerSpec, hardware: Any, plan: Plan) -> dict[str, Any] | None:
    if hardware is None:
        return None
    from perfmodel import predict

    return predict(model, hardware, plan, refuse_idle=False).to_dict()


def collective_launches(model: TransformerSpec, plan: Plan,
                        prediction: dict[str, Any] | None) -> dict[str, float] | None:
    """The model's collectives issued in every micro-batch (not once per step), calls per step
    per mesh axis on a rank of the stage the prediction's terms are of (its bottleneck_stage):
    how the report splits the predicted overhead/collectives, one fixed launch cost per call,
    over the rows that time those calls (validation.report.launch_split). None without a
    prediction or a ledger."""
    if prediction is None:
        return None
    from validation.jobspec import job_model
    from validation.ledger import model_ledger

    stage = prediction.get("bottleneck_stage") if plan.pp > 1 else "first"
    ledger = model_ledger(job_model(model, plan.tp), plan,
                          stage if stage in ("first", "middle", "last") else "first")
    if ledger is None:
        return None
    out: dict[str, float] = {}
    for op in ledger:
        if op["phase"] != "step":
            out[op["axis"]] = out.get(op["axis"], 0.0) + float(op["count"])
    return out


def extrapolations(model: TransformerSpec, hardware: Any, plan: Plan) -> list[str]:
    """What predict notes beside its result of this plan (perfmodel.cli.profile_extrapolations:
    the collectives, GEMMs and framework costs whose sizes lie outside what the profile's fits
    measured, a flash kernel taken at a head size it was not measured at), for validate to say
    too. The profile is the one the hardware was calibrated from (its source, "calibrated:
    PATH", perfmodel.specs.profile.apply_profile); none where it cannot be read again."""
    if hardware is None:
        return []
    from perfmodel.cli import profile_extrapolations

    # apply_profile appends "calibrated: PATH" to the base's source ("dgx-h100 ...; calibrated: ")
    source = str(getattr(hardware, "source", "") or "")
    profile = None
    _, found, path = source.rpartition("calibrated: ")
    if found and path:
        profile = path.removesuffix(" (incomplete run)")
    try:
        return profile_extrapolations(profile, model, hardware, plan)
    except (PerfmodelError, OSError):
        return []


def check_fits(prediction: dict[str, Any] | None, settings: RunSettings) -> None:
    """Refuse a local CPU run whose ranks together need more memory than the machine has free."""
    if prediction is None or settings.backend != "gloo":
        return
    breakdown = prediction.get("memory_breakdown_bytes") or {}
    per_rank = sum(v for k, v in breakdown.items() if not k.startswith("reserved")) \
        + BASELINE_RSS_BYTES
    need = per_rank * settings.nprocs
    available = _available_memory_bytes()
    if available and need > 0.9 * available:
        raise PlanError(
            f"the machine cannot hold this plan: {settings.nprocs} ranks x "
            f"{per_rank / 2**30:.1f} GiB predicted = {need / 2**30:.1f} GiB, but only "
            f"{available / 2**30:.1f} GiB is available "
            "(scale the model down: --layers, --hidden, ...)"
        )


def is_cpu_hardware(hardware: Any) -> bool:
    """True for a CPU's hardware: `calibrate run` on a CPU names its device "CPU <model> (N cores)"
    (calibration.bench); the presets and nccl-tests imports are GPUs."""
    return str(getattr(hardware, "gpu_name", "")).startswith("CPU ")


def target_backend(hardware: Any) -> str:
    """The backend of the machines the hardware describes: gloo for a CPU, NCCL for GPUs."""
    return "gloo" if is_cpu_hardware(hardware) else "nccl"


def caveats(hardware: Any, settings: RunSettings) -> list[str]:
    """Why the local run and the prediction do not describe the same machine, most important first
    (the report prints them before anything else): a CPU run against GPU hardware (or the
    reverse), or a CPU profile measured with another number of ranks than the run uses (its rates
    are per rank with that many ranks sharing the cores; perfmodel does not rescale them)."""
    if hardware is None:
        return []
    run_cpu = settings.backend == "gloo"
    name = getattr(hardware, "name", "?")
    if run_cpu and not is_cpu_hardware(hardware):
        return [
            f"CPU run, GPU prediction: this compares {settings.nprocs} CPU ranks (gloo) with "
            f"{name} ({hardware.gpu_name}), so the error is the gap between the machines, not "
            "the model's; calibrate this machine (perfmodel calibrate run --out P --nprocs "
            f"{settings.nprocs}) and predict with P (validate --profile P, recommend "
            "--validate-profile P) to compare like with like"
        ]
    if not run_cpu and is_cpu_hardware(hardware):
        return [
            f"GPU run, CPU prediction: this compares GPU ranks (nccl) with {name} "
            f"({hardware.gpu_name}), so the error is the gap between the machines; give this "
            "machine's GPU hardware"
        ]
    measured = int(hardware.gpus_per_node)
    if run_cpu and measured != settings.nprocs:
        return [
            f"profile of {measured} ranks, run of {settings.nprocs}: {name} was measured with "
            f"{measured} ranks sharing this machine's CPUs (ranks_per_device "
            f"{hardware.ranks_per_device:g}) and its rates are not rescaled to {settings.nprocs}, "
            f"so the error mostly measures that; calibrate with --nprocs {settings.nprocs} to "
            "compare like with like"
        ]
    return []


def check_devices(settings: RunSettings) -> None:
    """NCCL needs one CUDA device per local rank."""
    if settings.backend != "nccl":
        return
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < settings.nprocs:
        raise PlanError(
            f"--backend nccl needs {settings.nprocs} CUDA devices on this machine, found {found} "
            "(use --backend gloo, or --emit for a cluster)"
        )


def _available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def meta_of(
    model: TransformerSpec, hardware: Any, plan: Plan, settings: RunSettings, note: str
) -> dict[str, Any]:
    return {
        "model": model.name,
        "model_spec": model.to_dict(),
        "hardware": getattr(hardware, "name", None),
        # the AdamW kernels the job stepped, written even where fused (Plan.to_dict leaves the
        # default out): a report without them predates 81c5a51, whose jobs stepped foreach
        "plan": {**plan.to_dict(), "optimizer_kernels": plan.optimizer_kernels.value},
        "plan_label": plan_label(plan),
        "ranks": settings.nprocs,
        "backend": settings.backend,
        "warmup": settings.warmup,
        "dtype_used": plan.dtype.value,
        "dtype_note": note,
        "hardware_device": getattr(hardware, "gpu_name", None),
    }


def validate(
    model: TransformerSpec, hardware: Any, plan: Plan, settings: RunSettings, run_dir: Path
) -> dict[str, Any]:
    """Predict, run the job, measure and compare. Returns the report (also when the job failed)."""
    if plan.gpus != settings.nprocs:
        raise PlanError(
            f"the plan needs dp x cp x tp x pp = {plan.gpus} ranks, but --nprocs is "
            f"{settings.nprocs}"
        )
    check_devices(settings)
    model, plan, note = as_run(model, plan, settings.backend)
    prediction = predict_dict(model, hardware, plan)
    check_fits(prediction, settings)
    # what predict says beside this prediction, and how its launch cost of collectives splits
    notes = extrapolations(model, hardware, plan)
    launches = collective_launches(model, plan, prediction)
    load_before = os.getloadavg()[0]
    result, records = run_job(job_config(model, plan, settings), run_dir, settings)
    failure = result.failed_rank()
    launch_info = {
        "status": "ok" if result.ok else "interrupted" if result.interrupted else "failed",
        "elapsed_s": result.elapsed_s,
        "port": result.port,
        # Other processes on the machine slow the job down; the model cannot know about them.
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "reason": result.reason,
        "notes": result.notes,
        "run_dir": str(run_dir),
        "rank_status": [
            {"rank": r.rank, "state": r.state, "exit_code": r.exit_code, "error": r.error}
            for r in result.ranks
        ],
        "failure": None
        if result.ok or result.interrupted or failure is None
        else {
            "rank": failure.rank,
            "state": failure.state,
            "exit_code": failure.exit_code,
            "error": failure.error,
            "log_tail": failure.log,
        },
    }
    meta = {**meta_of(model, hardware, plan, settings, note), "collective_launches": launches}
    report = rep.build_report(
        meta=meta, prediction=prediction, launch=launch_info, records=records
    )
    check = ledger_check(model, plan, report["collectives_rank0"])
    report["collectives_vs_ledger"] = check
    report["caveats"] = caveats(hardware, settings)
    report["extrapolations"] = notes  # as predict --json names them
    if check is not None and not check["agree"]:
        differ = sum(1 for r in check["rows"] if not r["agree"])
        report["caveats"].append(
            f"the job's collectives differ from perfmodel's ledger for this plan ({differ} of "
            f"{len(check['rows'])} kinds): its communication terms are not the model's"
        )
    return report


JOB_MODULE = "workload.job"  # each rank runs python -P -m workload.job CONFIG.json


def allocator_env(plan: dict[str, Any]) -> dict[str, str]:
    """The environment the job's ranks need for the plan's allocator (its plan keys; the
    emitted launch scripts' EXPANDABLE_ENV)."""
    return dict(EXPANDABLE_ENV) if plan.get("expandable_segments") else {}


def run_job(
    config: dict[str, Any], run_dir: Path, settings: RunSettings
) -> tuple[LaunchResult, list[dict[str, Any]]]:
    """Run the job on settings.nprocs local ranks (workload.launcher); returns what happened and
    the ranks' records (rank<R>.json, also what they measured before a failure or Ctrl-C).

    result.ok also needs rank 0's merged results.json; a rank's own error, from its record, is
    the one reported for it.
    """

    def prepare() -> None:  # under the run directory's lock, before each start
        # a reused run directory: the last run's records, and its report and chart (which a
        # report written elsewhere, --out, would leave beside this run's records)
        for stale in [*run_dir.glob("rank*.json"), run_dir / "results.json",
                      run_dir / "report.json", run_dir / "report.png"]:
            stale.unlink(missing_ok=True)
        write_atomic(run_dir / "config.json",
                     json.dumps({**config, "output_dir": str(run_dir)}, indent=1),
                     what="job config")

    result = launch(JOB_MODULE, [str(run_dir / "config.json")], settings.nprocs, run_dir,
                    timeout_s=settings.timeout_s + 60, master_addr=settings.master_addr,
                    port=settings.port, prepare=prepare,
                    env=allocator_env(config.get("plan", {})))
    # every rank has ended: a record a rank was writing when it was killed (its temporary file,
    # workload.job.write_json's NAME.tmpPID) is removed, the whole records kept (a loaded
    # machine's SIGTERM grace ran out mid-write and left rank0.json.tmpPID beside the report)
    for partial in run_dir.glob("*.json.tmp*"):
        partial.unlink(missing_ok=True)
    records = []
    for status in result.ranks:
        record = _record(run_dir / f"rank{status.rank}.json")
        if record is not None:
            records.append(record)
            if record.get("error"):
                status.error = record["error"]
    result.ok = result.ok and _record(run_dir / "results.json") is not None
    return result, records


def _record(path: Path) -> dict[str, Any] | None:
    """A file the job wrote (whole: it writes atomically), or None while there is none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def default_run_dir(plan: Plan) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("validation-runs") / f"{stamp}-{plan_label(plan)}"


# --- clusters ------------------------------------------------------------------------------------

NCCL_ENV = {
    "NCCL_DEBUG": "WARN",  # INFO once to check the transport (NET/IB vs socket) and the ring/tree
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # a failed collective stops the job instead of hanging
    "NCCL_IB_TIMEOUT": "22",
    "NCCL_SOCKET_IFNAME": "${NCCL_SOCKET_IFNAME:-^lo,docker}",  # the inter-node interface
    "OMP_NUM_THREADS": "1",
}


# The emitted entry point: `python job.py config.json` finds the workload package beside it.
JOB_ENTRY = '''"""The training job perfmodel validate --emit wrote: torchrun ... job.py config.json.

The job is the package workload/ beside this file (the standard library and torch only).
"""

import sys

from workload.job import main

if __name__ == "__main__":
    sys.exit(main())
'''


def job_files() -> dict[str, bytes]:
    """The emitted job's files by relative path: job.py (JOB_ENTRY), and workload/job.py with
    every workload module it imports, transitively (read from their import statements)."""
    import workload

    root = Path(workload.__file__).resolve().parent
    files = {"workload/__init__.py": (root / "__init__.py").read_bytes()}
    todo = ["job"]
    while todo:
        name = todo.pop()
        if f"workload/{name}.py" in files:
            continue
        source = (root / f"{name}.py").read_bytes()
        files[f"workload/{name}.py"] = source
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                if parts[0] == "workload" and len(parts) == 2:
                    todo.append(parts[1])
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                todo += [node.module] if node.module else [a.name for a in node.names]
    return {"job.py": JOB_ENTRY.encode(), **dict(sorted(files.items()))}


def emit(
    model: TransformerSpec,
    hardware: Any,
    plan: Plan,
    settings: RunSettings,
    out: Path,
    nodes: int,
    gpus_per_node: int,
) -> list[Path]:
    """Write the job (job_files), its config, a torchrun command and a Slurm batch script to out."""
    if nodes * gpus_per_node != plan.gpus:
        raise PlanError(
            f"nodes x gpus per node ({nodes} x {gpus_per_node}) must equal the plan's "
            f"gpus ({plan.gpus})"
        )
    model, plan, note = as_run(model, plan, settings.backend)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**job_config(model, plan, settings), "output_dir": "results"}
    prediction = predict_dict(model, hardware, plan)
    meta = {
        **meta_of(model, hardware, plan, settings, note),
        "prediction": prediction,
        # how collect's report splits the predicted launch cost of collectives over its rows
        "collective_launches": collective_launches(model, plan, prediction),
        "extrapolations": extrapolations(model, hardware, plan),
        # what collect's report says first, as a local run's does: a CPU profile measured with
        # another number of ranks than the job's
        "caveats": caveats(hardware, dataclasses.replace(settings, nprocs=plan.gpus)),
        # rank 0's collectives as the model counts them: collect compares the job's with them,
        # as a local run does (validation.ledger.ledger_check)
        "ledger": rank0_ledger(model, plan),
    }
    files: list[tuple[str, str | bytes, str]] = [
        (name, data, "job") for name, data in job_files().items()]
    files += [(name, json_text(doc, indent=1), name)
              for name, doc in (("config.json", cfg), ("meta.json", meta))]
    env = "\n".join(f"export {k}={v}" for k, v in {**NCCL_ENV,
                                                   **allocator_env(plan.to_dict())}.items())
    torchrun = (
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} "
        f'--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{settings.port or 29500}" '
        f'--rdzv-id "${{SLURM_JOB_ID:-perfmodel}}" job.py config.json'
    )
    run_sh = (
        "#!/bin/bash\n# One node: run as is. Several: run on every node with MASTER_ADDR set to "
        'the first node.\nset -euo pipefail\ncd "$(dirname "$0")"\n'
        "export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}\n"
        "# without a cluster address, the ranks talk over loopback only\n"
        'case "$MASTER_ADDR" in 127.*|localhost|::1) export NCCL_SOCKET_IFNAME='
        "${NCCL_SOCKET_IFNAME:-lo} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo};; esac\n"
        f"{env}\n{torchrun}\n"
    )
    sbatch = (
        "#!/bin/bash\n"
        f"#SBATCH --job-name=perfmodel-{plan_label(plan)}\n"
        f"#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={gpus_per_node}\n#SBATCH --exclusive\n"
        f"#SBATCH --time=00:{max(5, int(settings.timeout_s // 60) + 5):02d}:00\n"
        "# sbatch runs a copy of this script from its spool directory: the job's files are found\n"
        "# in the directory it is submitted from: cd <this directory> && sbatch job.sbatch\n"
        'set -euo pipefail\ncd "$SLURM_SUBMIT_DIR"\n'
        '[ -f job.py ] && [ -f config.json ] || { echo "job.sbatch: no job.py and config.json in '
        '$PWD: submit from their directory (cd <dir> && sbatch job.sbatch)" >&2; exit 2; }\n'
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"{env}\nsrun {torchrun}\n"
        "# then, where perfmodel is installed: perfmodel validate collect <this directory>\n"
    )
    files += [("run.sh", run_sh, "run.sh"), ("job.sbatch", sbatch, "job.sbatch")]
    for name, _, what in files:  # every file refused before any is written: never half a job
        check_output(out / name, what=what, make_parents=True)
    # a directory emitted into before: the last job's results and report would be collected as
    # this job's (another plan's measurements against this prediction)
    for stale in [*(out / "results").glob("rank*.json"), out / "results" / "results.json",
                  out / "report.json", out / "report.png"]:
        stale.unlink(missing_ok=True)
    written = []
    for name, data, what in files:
        write_atomic(out / name, data, what=what, make_parents=True)
        if name in ("run.sh", "job.sbatch"):
            os.chmod(out / name, 0o755)
        written.append(out / name)
    return written


def collect(directory: Path) -> dict[str, Any]:
    """Read an emitted directory's results back into the same report as a local run.

    meta.json and the results are checked first: a malformed file, a NaN or Infinity, or a step
    time that is not a positive number is a DataError naming the file and field (one line).
    """
    meta_path = directory / "meta.json"
    if not meta_path.exists():
        raise DataError(f"{directory}: no readable meta.json (was it written by --emit?)")
    meta = _read_json(meta_path)
    _check_meta(meta, str(meta_path))
    results_dir = directory / "results"
    merged = results_dir / "results.json"
    if merged.exists():
        doc = _read_json(merged)
        if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
            raise DataError(f"{merged}: field 'ranks' must be a list of the ranks' records")
        sources = [(f"{merged}: ranks[{i}]", r) for i, r in enumerate(doc["ranks"])]
        emitted = directory / "config.json"
        ran = doc.get("config")
        if isinstance(ran, dict) and emitted.exists() and \
                _read_json(emitted).get("plan") != ran.get("plan"):
            raise DataError(f"{merged}: these results are of another job than {emitted} "
                            "(its plan differs): run the emitted job again")
    else:
        sources = [(str(p), _read_json(p)) for p in sorted(results_dir.glob("rank*.json"))]
    if not sources:
        raise DataError(f"{results_dir}: no results yet (rank*.json / results.json)")
    seen: dict[int, str] = {}
    for where, record in sources:
        _check_record(record, where, meta["ranks"])
        if record["rank"] in seen:
            raise DataError(f"{where}: rank {record['rank']} is also in {seen[record['rank']]}")
        seen[record["rank"]] = where
    records = [r for _, r in sources]
    failed = [r for r in records if r.get("status") != "ok"]
    launch_info = {
        "status": "failed" if failed or len(records) < meta["ranks"] else "ok",
        "notes": [f"collected from {directory}"]
        + (
            [f"only {len(records)} of {meta['ranks']} ranks reported"]
            if len(records) < meta["ranks"]
            else []
        ),
        "failure": None
        if not failed
        else {"rank": failed[0]["rank"], "error": failed[0].get("error", failed[0].get("status"))},
    }
    prediction = meta.pop("prediction", None)
    emitted_caveats = meta.pop("caveats", None) or []
    ledger = meta.pop("ledger", None)
    report = rep.build_report(meta=meta, prediction=prediction, launch=launch_info, records=records)
    report["caveats"] = list(emitted_caveats)
    rows = compare(report["collectives_rank0"], ledger) \
        if ledger is not None and report["collectives_rank0"] else None
    report["collectives_vs_ledger"] = None if rows is None else {
        "agree": all(r["agree"] for r in rows), "rows": rows}
    if rows is not None and not all(r["agree"] for r in rows):
        differ = sum(1 for r in rows if not r["agree"])
        report["caveats"].append(
            f"the job's collectives differ from perfmodel's ledger for this plan ({differ} of "
            f"{len(rows)} kinds): its communication terms are not the model's"
        )
    device = str(records[0].get("device", ""))
    target = meta.get("hardware_device")
    if target and device and device.startswith("cpu") != target.startswith("CPU "):
        report["caveats"].append(
            f"the job ran on {device} but was predicted for {meta.get('hardware')} ({target}): "
            "the error is the gap between the machines"
        )
    return report


def _read_json(path: Path) -> Any:
    """A collected file as strict JSON (NaN and Infinity refused), or a DataError naming it."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a number")

    text = read_text_bounded(path, "", error=DataError)  # its own one-line refusals
    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None


def _number(value: Any, where: str, *, positive: bool = False, signed: bool = False) -> None:
    """A finite number (> 0 when positive, >= 0 unless signed), else a DataError naming it."""

    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and positive:
        ok = value > 0
    elif ok and not signed:
        ok = value >= 0
    if not ok:
        what = "a positive number" if positive else "a finite number" if signed else \
            "a number >= 0"
        raise DataError(f"{where} is {value!r}: it must be {what}")


def _check_meta(meta: Any, where: str) -> None:
    """The fields of an emitted meta.json that collect reads."""

    if not isinstance(meta, dict):
        raise DataError(f"{where}: must be a JSON object (as --emit writes it)")
    for key, kind, what in (("model", str, "a name"), ("plan", dict, "an object"),
                            ("backend", str, "a backend name")):
        if not isinstance(meta.get(key), kind):
            raise DataError(f"{where}: field '{key}' must be {what}, got {meta.get(key)!r}")
    ranks = meta.get("ranks")
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise DataError(f"{where}: field 'ranks' must be a whole number >= 1, got {ranks!r}")
    launches = meta.get("collective_launches")
    if launches is not None:  # the report splits the predicted launch cost by them
        if not isinstance(launches, dict) or not all(isinstance(k, str) for k in launches):
            raise DataError(f"{where}: field 'collective_launches' must be an object of calls "
                            "per mesh axis, or null")
        for axis, calls in launches.items():
            _number(calls, f"{where}: collective_launches.{axis}")
    notes = meta.get("extrapolations")
    if notes is not None and (not isinstance(notes, list)
                              or not all(isinstance(n, str) for n in notes)):
        raise DataError(f"{where}: field 'extrapolations' must be a list of notes, or null")
    said = meta.get("caveats")
    if said is not None and (not isinstance(said, list)
                             or not all(isinstance(n, str) for n in said)):
        raise DataError(f"{where}: field 'caveats' must be a list of warnings, or null")
    ledger = meta.get("ledger")
    if ledger is not None:
        if not isinstance(ledger, list):
            raise DataError(f"{where}: field 'ledger' must be a list of collectives, or null")
        for i, op in enumerate(ledger):
            if not isinstance(op, dict) or not all(
                    isinstance(op.get(k), str) for k in ("axis", "op", "phase")):
                raise DataError(f"{where}: ledger[{i}] must be an object with axis, op, phase")
            _number(op.get("count"), f"{where}: ledger[{i}].count")
            _number(op.get("bytes"), f"{where}: ledger[{i}].bytes")
    prediction = meta.get("prediction")
    if prediction is None:
        return
    if not isinstance(prediction, dict):
        raise DataError(f"{where}: field 'prediction' must be an object or null")
    _number(prediction.get("step_time_s"), f"{where}: prediction.step_time_s", positive=True)
    _number(prediction.get("memory_per_gpu_bytes"), f"{where}: prediction.memory_per_gpu_bytes")
    for key in ("breakdown_s", "memory_breakdown_bytes"):
        values = prediction.get(key, {})
        if not isinstance(values, dict):
            raise DataError(f"{where}: prediction.{key} must be an object of numbers")
        for name, value in values.items():
            # a time term may be negative: compute/*/framework is (scale - 1) x the roofline plus
            # a fixed cost, below 0 where the measured kernels beat the roofline (scale < 1)
            _number(value, f"{where}: prediction.{key}.{name}", signed=key == "breakdown_s")


# the times a step records (workload.trainer.Trainer.step); pipeline_wait may dip below 0
_STEP_TIMES = ("forward", "backward", "grad_sync", "optimizer", "step")


def _check_record(record: Any, where: str, ranks: int) -> None:
    """One rank's results: its rank, status and every measured step time."""

    if not isinstance(record, dict):
        raise DataError(f"{where}: a rank's results must be a JSON object")
    rank = record.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < ranks:
        raise DataError(f"{where}: field 'rank' must be a whole number from 0 to {ranks - 1}, "
                        f"got {rank!r}")
    if not isinstance(record.get("status"), str):
        raise DataError(f"{where}: field 'status' must be a string, got {record.get('status')!r}")
    steps = record.get("steps", [])
    if not isinstance(steps, list):
        raise DataError(f"{where}: field 'steps' must be a list of measured steps")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or "step" not in step:
            raise DataError(f"{where}: steps[{i}] must be an object with the step time 'step'")
        for key, value in step.items():
            if key == "step":
                _number(value, f"{where}: steps[{i}].step", positive=True)
            else:
                _number(value, f"{where}: steps[{i}].{key}", signed=key not in _STEP_TIMES)
    for key in ("peak_memory_bytes", "tensor_peak_memory_bytes", "baseline_memory_bytes"):
        if record.get(key) is not None:
            _number(record[key], f"{where}: {key}")
    coords = record.get("coords")
    if coords is not None:  # the rank's place on the mesh: the report picks a stage's ranks by it
        if not isinstance(coords, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in coords.items()):
            raise DataError(f"{where}: field 'coords' must map mesh axes to whole numbers "
                            f"from 0, got {coords!r}")

