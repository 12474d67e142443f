"""Predict, run, measure, compare: the loop for one plan; emit and collect for clusters."""

from __future__ import annotations

import datetime
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmodel.errors import PerfmodelError, PlanError
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation import report as rep
from validation.launch import JOB_FILE, launch

BASELINE_RSS_BYTES = 400 * 2**20  # a Python process with torch imported, before the model


class JobFailed(PerfmodelError):
    """The training job failed, hung or was stopped; the report says which rank and why."""

    exit_code = 6


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    nprocs: int
    backend: str = "gloo"
    steps: int = 3
    warmup: int = 1
    timeout_s: float = 300.0
    master_addr: str = "127.0.0.1"
    port: int | None = None
    fault: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def plan_label(plan: Plan) -> str:
    parts = [
        f"dp{plan.dp}",
        f"tp{plan.tp}",
        f"pp{plan.pp}",
        f"mb{plan.micro_batch}",
        f"gb{plan.global_batch}",
    ]
    if plan.pp > 1:
        parts.append(
            plan.schedule.value + (f"v{plan.virtual_stages}" if plan.virtual_stages > 1 else "")
        )
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.zero:
        parts.append(f"zero{plan.zero}")
    if plan.recompute.value != "none":
        parts.append(f"rc-{plan.recompute.value}")
    return "-".join(parts)


def local_dtype(plan: Plan, backend: str) -> tuple[Plan, str]:
    """The plan the local job really runs: bf16/fp16 become fp32 on a CPU (no fast path there)."""
    if backend == "gloo" and plan.dtype.value in ("bf16", "fp16"):
        note = (
            f"{plan.dtype.value} has no fast path on this CPU (60-200x slower than fp32): "
            "the run and the prediction both use fp32"
        )
        return plan.replace(dtype="fp32"), note
    return plan, ""


def as_run(model: TransformerSpec, plan: Plan, backend: str) -> tuple[TransformerSpec, Plan, str]:
    """The model and plan the job really runs, so that the prediction describes the same job.

    The job unties the embeddings and learns positions; it attends with fused SDPA (no s^2
    activations: flash_attention); it syncs gradients after backward (no overlap); bf16/fp16
    become fp32 on a CPU. Returns the notes the user should read.
    """
    plan, note = local_dtype(plan, backend)
    notes = [note] if note else []
    model = model.replace(tied_embeddings=False, position_embedding="learned")
    if plan.overlap_grad_sync:
        notes.append("the job syncs gradients after backward: predicted without overlap")
    plan = plan.replace(flash_attention=True, overlap_grad_sync=False)
    return model, plan, "; ".join(notes)


def job_config(model: TransformerSpec, plan: Plan, settings: RunSettings) -> dict[str, Any]:
    """The job's JSON config (see validation/job.py)."""
    return {
        "model": {
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "seq_len": model.seq_len,
            "vocab": model.vocab,
            "ffn_hidden": model.ffn_hidden,
            "kv_heads": model.kv_heads,
            "gated_mlp": model.gated_mlp,
            "bias": model.bias,
            "norm": model.norm,
        },
        "plan": plan.to_dict(),
        "backend": settings.backend,
        "steps": settings.steps,
        "warmup": settings.warmup,
        "timeout_s": settings.timeout_s,
        "fault": settings.fault,
        **settings.extra,
    }


def predict_dict(model: TransformerSpec, hardware: Any, plan: Plan) -> dict[str, Any] | None:
    if hardware is None:
        return None
    from perfmodel import predict

    return predict(model, hardware, plan).to_dict()


def check_fits(prediction: dict[str, Any] | None, settings: RunSettings) -> None:
    """Refuse a local CPU run whose ranks together need more memory than the machine has free."""
    if prediction is None or settings.backend != "gloo":
        return
    breakdown = prediction.get("memory_breakdown_bytes") or {}
    per_rank = sum(v for k, v in breakdown.items() if k != "reserved") + BASELINE_RSS_BYTES
    need = per_rank * settings.nprocs
    available = _available_memory_bytes()
    if available and need > 0.9 * available:
        raise PlanError(
            f"the machine cannot hold this plan: {settings.nprocs} ranks x "
            f"{per_rank / 2**30:.1f} GiB predicted = {need / 2**30:.1f} GiB, but only "
            f"{available / 2**30:.1f} GiB is available "
            "(scale the model down: --layers, --hidden, ...)"
        )


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
        "plan": plan.to_dict(),
        "plan_label": plan_label(plan),
        "ranks": settings.nprocs,
        "backend": settings.backend,
        "warmup": settings.warmup,
        "dtype_used": plan.dtype.value,
        "dtype_note": note,
    }


def validate(
    model: TransformerSpec, hardware: Any, plan: Plan, settings: RunSettings, run_dir: Path
) -> dict[str, Any]:
    """Predict, run the job, measure and compare. Returns the report (also when the job failed)."""
    if plan.gpus != settings.nprocs:
        raise PlanError(
            f"the plan needs dp x tp x pp = {plan.gpus} ranks, but --nprocs is {settings.nprocs}"
        )
    check_devices(settings)
    model, plan, note = as_run(model, plan, settings.backend)
    prediction = predict_dict(model, hardware, plan)
    check_fits(prediction, settings)
    load_before = os.getloadavg()[0]
    result = launch(
        job_config(model, plan, settings),
        run_dir,
        settings.nprocs,
        timeout_s=settings.timeout_s + 60,
        master_addr=settings.master_addr,
        port=settings.port,
    )
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
    meta = meta_of(model, hardware, plan, settings, note)
    report = rep.build_report(
        meta=meta, prediction=prediction, launch=launch_info, records=result.rank_records
    )
    report["collectives_vs_ledger"] = ledger_check(model, plan, report["collectives_rank0"])
    return report


def ledger_check(
    model: TransformerSpec, plan: Plan, collectives: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Rank 0's collectives in the probe step (pipeline p2p included) against the model's ledger."""
    if not collectives:
        return None
    from validation.dryrun import compare, model_ledger

    ledger = model_ledger(model.replace(tied_embeddings=False), plan)
    if ledger is None:
        return None
    rows = compare(collectives, ledger)
    return {"agree": all(r["agree"] for r in rows), "rows": rows}


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


def emit(
    model: TransformerSpec,
    hardware: Any,
    plan: Plan,
    settings: RunSettings,
    out: Path,
    nodes: int,
    gpus_per_node: int,
) -> list[Path]:
    """Write the job, its config, a torchrun command and a Slurm batch script to out."""
    if nodes * gpus_per_node != plan.gpus:
        raise PlanError(
            f"nodes x gpus per node ({nodes} x {gpus_per_node}) must equal the plan's "
            f"gpus ({plan.gpus})"
        )
    model, plan, note = as_run(model, plan, settings.backend)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**job_config(model, plan, settings), "output_dir": "results"}
    meta = {
        **meta_of(model, hardware, plan, settings, note),
        "prediction": predict_dict(model, hardware, plan),
    }
    written = []
    rep.write_atomic(out / "job.py", JOB_FILE.read_bytes())
    written.append(out / "job.py")
    for name, data in (("config.json", cfg), ("meta.json", meta)):
        rep.write_atomic(out / name, json.dumps(data, indent=1))
        written.append(out / name)
    env = "\n".join(f"export {k}={v}" for k, v in NCCL_ENV.items())
    torchrun = (
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} "
        f'--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" '
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
        'set -euo pipefail\ncd "$SLURM_SUBMIT_DIR"\n'
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"{env}\nsrun {torchrun}\n"
        "# then, where perfmodel is installed: perfmodel validate collect <this directory>\n"
    )
    for name, text in (("run.sh", run_sh), ("job.sbatch", sbatch)):
        rep.write_atomic(out / name, text)
        os.chmod(out / name, 0o755)
        written.append(out / name)
    return written


def collect(directory: Path) -> dict[str, Any]:
    """Read an emitted directory's results back into the same report as a local run."""
    from perfmodel.errors import DataError
    from perfmodel.files import read_text_bounded  # regular files of at most 16 MiB

    def read(path: Path) -> str:
        return read_text_bounded(path, "", error=DataError)

    try:
        meta = json.loads(read(directory / "meta.json"))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"{directory}: no readable meta.json (was it written by --emit?): {exc}"
        ) from None
    results_dir = directory / "results"
    records = []
    for path in sorted(results_dir.glob("rank*.json")):
        try:
            records.append(json.loads(read(path)))
        except (OSError, ValueError):
            continue
    merged = results_dir / "results.json"
    if merged.exists():
        try:
            records = json.loads(read(merged))["ranks"]
        except (OSError, ValueError, KeyError):
            pass
    if not records:
        raise DataError(f"{results_dir}: no results yet (rank*.json / results.json)")
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
    return rep.build_report(meta=meta, prediction=prediction, launch=launch_info, records=records)


def torchrun_command(nprocs: int, config: Path) -> str:
    return shlex.join(["torchrun", "--nproc-per-node", str(nprocs), str(JOB_FILE), str(config)])
