"""The distributed training job for one parallel plan: python -m workload.job CONFIG.json.

Launched on this machine by workload.launcher; on a cluster by torchrun (or any launcher that sets
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), from the directory `perfmodel validate
--emit` writes (this package's job modules, standard library and torch only, and an entry job.py):

    torchrun --nproc-per-node 4 job.py config.json

It trains the model of workload.model on synthetic tokens under the plan (workload.parallelize,
workload.trainer): ``warmup`` untimed steps, then ``steps`` timed steps, then ``probe_steps`` steps
in which every collective is timed (workload.timers), then on a CPU one step under the profiler for
the peak of tensor allocations. bf16/fp16 run as fp32 on a CPU (no fast path there).
Each rank's record keeps the events of its last timed step (``trace``: workload.trainer's
Trainer.events). Every rank writes ``rank<R>.json`` after each step (so a crash keeps what was
measured); rank 0 writes the merged results file at the end. Files are written atomically (temp
file + os.replace): write_json is the job's own writer, as the job runs where perfmodel is not
installed.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from workload.model import DTYPES
from workload.parallelize import make_mesh
from workload.process import keep_freed_memory, loopback_rendezvous, watch_parent
from workload.timers import (
    CollectiveCounter,
    current_rss_bytes,
    peak_memory_bytes,
    tensor_peak_bytes,
)
from workload.trainer import Trainer


def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:  # a signal's exception mid-write: no partial file left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def choose_dtype(name: str, device: torch.device) -> tuple[torch.dtype, str, str]:
    """The plan's dtype where the device has a fast path for it; fp32 otherwise (and why)."""
    if device.type == "cpu" and name in ("bf16", "fp16"):
        return (
            torch.float32,
            "fp32",
            f"{name} has no fast path on this CPU (60-200x slower): ran fp32",
        )
    return DTYPES[name], name, ""



def _inject_fault(cfg: dict[str, Any], rank: int, step: int) -> None:
    fault = cfg.get("fault") or {}
    if fault.get("rank") != rank or fault.get("step", 0) != step:
        return
    if fault.get("kind") == "crash":
        raise RuntimeError(f"injected crash on rank {rank} at step {step}")
    if fault.get("kind") == "hang":
        time.sleep(10**6)


def run(cfg: dict[str, Any]) -> None:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out_dir = cfg["output_dir"]
    os.makedirs(out_dir, exist_ok=True)
    rank_file = os.path.join(out_dir, f"rank{rank}.json")
    backend = cfg.get("backend", "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        keep_freed_memory()
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    dtype, dtype_used, dtype_note = choose_dtype(cfg["plan"].get("dtype", "fp32"), device)
    record: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "host": os.uname().nodename,
        "device": str(device),
        "dtype": dtype_used,
        "dtype_note": dtype_note,
        "steps": [],
        "status": "running",
        "baseline_memory_bytes": current_rss_bytes() if device.type == "cpu" else 0,
    }
    write_json(rank_file, record)
    timeout = datetime.timedelta(seconds=float(cfg.get("timeout_s", 300)))
    dist.init_process_group(
        backend,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
        **loopback_rendezvous(rank, world, timeout),
    )
    try:
        mesh = make_mesh(cfg["plan"], device.type)
        record["coords"] = {n: mesh.get_local_rank(n) for n in mesh.mesh_dim_names}
        torch.manual_seed(0)
        trainer = Trainer(cfg, mesh, device, dtype)
        record["parameters_local"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in trainer.params
        )
        warmup, steps = int(cfg.get("warmup", 1)), int(cfg.get("steps", 3))
        for i in range(warmup + steps):
            _inject_fault(cfg, rank, i)
            times = trainer.step()
            if i >= warmup:
                record["steps"].append(times)
                record["trace"] = trainer.events  # the last timed step's events
            record.setdefault("losses", []).append(trainer.last_loss)
            record["peak_memory_bytes"] = peak_memory_bytes(device)
            write_json(rank_file, record)
        probes = int(cfg.get("probe_steps", 2))
        if probes > 0:
            # Collectives timed one by one in probe steps; the median over them per axis and phase.
            counters: list[CollectiveCounter] = []
            probe_times: list[dict[str, float]] = []
            for _ in range(probes):
                counter = CollectiveCounter(trainer.axis_names(), timed=True)
                trainer.counter = counter
                with counter:
                    probe_times.append(trainer.step())
                trainer.counter = None
                counters.append(counter)
            keys = sorted({k for c in counters for k in c.seconds})
            record["probe"] = {
                "steps": probes,
                "times": probe_times,
                "comm_seconds": [
                    {
                        "axis": a,
                        "phase": p,
                        "seconds": statistics.median(c.seconds.get((a, p), 0.0) for c in counters),
                    }
                    for a, p in keys
                ],
                "collectives": counters[0].table(),
            }
        if device.type == "cpu" and cfg.get("tensor_memory", True):
            try:
                record["tensor_peak_memory_bytes"] = tensor_peak_bytes(trainer)
            except Exception as exc:  # the profiler's interface is torch's to change
                record["tensor_memory_note"] = f"tensor peak not measured: {exc}"
        record["status"] = "ok"
        write_json(rank_file, record)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(record, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            write_json(
                os.path.join(out_dir, "results.json"),
                {
                    "config": cfg,
                    "ranks": gathered,
                    "torch": torch.__version__,
                    "backend": backend,
                    "world_size": world,
                },
            )
    except BaseException as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=8)
        write_json(rank_file, record)
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: job.py CONFIG.json", file=sys.stderr)
        return 2
    watch_parent()
    with open(argv[0]) as f:
        cfg = json.load(f)
    run(cfg)
    # Everything is written (atomically) and the process group destroyed. torch's gloo threads
    # can still abort the interpreter's teardown afterwards ("terminate called without an active
    # exception", SIGABRT: 3 of 20 runs with torch 2.13), which would report a finished rank as
    # failed: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
