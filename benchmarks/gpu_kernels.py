"""Where a validation job's GPU step goes, kernel by kernel: the evidence behind its errors.

Run on the GPU machine, over run directories that `perfmodel validate` (or
benchmarks/gpu_evidence.py) wrote, each holding the job's config.json:

    python benchmarks/gpu_kernels.py RUN_DIR [RUN_DIR ...] --out FILE.json

For each, one rank of the job's model and optimizer is built from the config (workload.job's
path: the same Trainer), warmed up, and three steps run under torch.profiler. Per step: the wall
time as the job's clock reads it, the GPU's busy time, the kernels launched, and their device
time in groups by kernel name (GEMMs, attention, the loss, norms, the optimizer, the other
element-wise and reduction kernels, copies); the fifteen costliest kernels beside. The step is
also timed with no profiler and with one device sync at its end only (the trainer's clock
swapped for one that does not wait for the device), so that the cost of the job's per-phase
syncs shows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

GROUPS = [  # first match wins: attention kernels carry cutlass/xmma names too
    ("attention", r"flash|fmha|attention|attn|cudnn|sdpa"),
    ("gemm", r"gemm|xmma|nvjet|cutlass|cublas|sm90_|sm80_|wgmma|matmul|splitk"),
    ("loss", r"log_softmax|softmax_backward|nll_loss|cross_entropy"),
    ("norm", r"layer_norm|layernorm|rms_norm|rmsnorm"),
    ("optimizer", r"multi_tensor|foreach|adam|lerp|sqrt|addcdiv|addcmul"),
    ("copy", r"memcpy|memset|copy_|CatArrayBatched|cat_"),
    ("elementwise", r"."),
]


def group_of(name: str) -> str:
    low = name.lower()
    return next(g for g, pattern in GROUPS if re.search(pattern, low))


def profile_run(run_dir: Path, steps: int = 3) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workload.job import choose_dtype
    from workload.parallelize import make_mesh
    from workload.trainer import Trainer

    cfg = json.loads((run_dir / "config.json").read_text())
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # cpu: a smoke test
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype, _, _ = choose_dtype(cfg["plan"].get("dtype", "fp32"), device)
    torch.manual_seed(0)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    mesh = make_mesh(cfg["plan"], device.type)
    trainer = Trainer(cfg, mesh, device, dtype)
    for _ in range(3):
        trainer.step()
    synced = [trainer.step()["step"] for _ in range(5)]
    free = []
    synced_clock = trainer.clock
    trainer.clock = type("Unsynced", (), {"now": staticmethod(time.perf_counter)})()
    for _ in range(5):  # one sync at the end: the host runs ahead of the device across phases
        sync()
        t0 = time.perf_counter()
        trainer.step()
        sync()
        free.append(time.perf_counter() - t0)
    trainer.clock = synced_clock
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            trainer.step()
        sync()
    kernels: dict[str, list[float]] = {}
    cpu_ops = 0
    for ev in prof.events():
        # a record_function range (torch.optim's "Optimizer.step#AdamW.step") shows on the GPU's
        # timeline too, spanning kernels counted on their own: left out
        annotation = getattr(ev, "is_user_annotation", False) or "#" in ev.name
        if ev.device_type == torch.autograd.DeviceType.CUDA and not annotation:
            kernels.setdefault(ev.name, []).append(ev.device_time_total * 1e-6)
        elif ev.device_type == torch.autograd.DeviceType.CPU and ev.name.startswith("aten::"):
            cpu_ops += 1
    groups: dict[str, float] = {}
    for name, times in kernels.items():
        g = group_of(name)
        groups[g] = groups.get(g, 0.0) + sum(times) / steps
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {
        "run": run_dir.name,
        "plan": {k: cfg["plan"].get(k) for k in ("micro_batch", "recompute", "flash_attention")},
        "model": {k: cfg["model"].get(k) for k in ("layers", "hidden", "heads", "vocab",
                                                   "seq_len", "experts", "top_k")},
        "step_synced_s": statistics.median(synced),
        "step_one_sync_s": statistics.median(free),
        "device_busy_s": sum(groups.values()),
        "kernels_per_step": sum(len(t) for t in kernels.values()) / steps,
        "aten_ops_per_step": cpu_ops / steps,
        "groups_s": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "top_kernels": [{"name": n[:160], "group": group_of(n), "calls": len(t) / steps,
                         "s_per_step": sum(t) / steps} for n, t in top],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    from perfmodel.files import write_atomic
    from workload.process import loopback_rendezvous

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    timeout = datetime.timedelta(seconds=120)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, timeout=timeout, **loopback_rendezvous(0, 1, timeout))
    results = []
    for run_dir in args.runs:
        try:
            results.append(profile_run(run_dir))
        except Exception as exc:  # one run's failure leaves the others measured
            results.append({"run": run_dir.name, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(results[-1], indent=1)[:3000], flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        write_atomic(args.out, json.dumps(results, indent=1), what="kernel groups")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
