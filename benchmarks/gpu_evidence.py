"""GPU evidence: calibrate one GPU and validate single-GPU GPT plans on it, then tabulate.

Run on a machine with one CUDA GPU (an H100 or H200; issue 16 item 9):

    python benchmarks/gpu_evidence.py run --out DIR [--hardware hgx-h200] [--budget-s 330]

`run` times `perfmodel calibrate run` (GEMMs, memory bandwidth, flash attention, framework and
host cost per op, whole layers) into DIR/profile.json, then `perfmodel validate` of each plan of
PLANS in turn (GPT 125M, 350M and 1.3B; micro-batch 1-8; recompute none, selective, full;
flash and unfused attention; a small mixture of experts) against --hardware's preset, each
report in DIR/runs/NAME/report.json, until --budget-s seconds of validation have passed (the
plans are ordered so that a cut list still spans the sizes and options). Anywhere, afterwards:

    python benchmarks/gpu_evidence.py table DIR [--markdown FILE]

prints each run's measured step time and peak memory beside this checkout's predictions of its
plan, by the preset and by the preset under DIR/profile.json (the calibrated fields), with the
signed errors (predicted - measured) / measured and their medians, then the measured and
calibrated phases.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# GPT-3's sizes (Brown et al. 2020, Table 2.1): 350M is 24 x 1024 (16 heads), 1.3B 24 x 2048
# (16 heads of 128, as Megatron-LM's and nanoGPT's configs of it run); 125M is GPT-2 small.
SIZES = {
    "125m": ["--model", "gpt2-small"],
    "350m": ["--model", "gpt2-small", "--layers", "24", "--hidden", "1024", "--heads", "16",
             "--ffn-hidden", "4096", "--seq-len", "2048"],
    "1.3b": ["--model", "gpt2-small", "--layers", "24", "--hidden", "2048", "--heads", "16",
             "--ffn-hidden", "8192", "--seq-len", "2048"],
    # Qwen3-30B-A3B's layer (128 experts, top 8) cut to 4 layers: a mixture of experts on one GPU
    "moe-4l": ["--model", "qwen3-30b-a3b", "--layers", "4"],
}

# (name, size, micro-batch, recompute, attention), most telling first
PLANS: list[tuple[str, str, int, str, str]] = [
    ("125m-mb1", "125m", 1, "none", "flash"),
    ("1.3b-mb4", "1.3b", 4, "none", "flash"),
    ("350m-mb4", "350m", 4, "none", "flash"),
    ("125m-mb8", "125m", 8, "none", "flash"),
    ("1.3b-mb4-selective", "1.3b", 4, "selective", "flash"),
    ("1.3b-mb4-full", "1.3b", 4, "full", "flash"),
    ("125m-mb4-unfused", "125m", 4, "none", "unfused"),
    ("1.3b-mb2-unfused", "1.3b", 2, "none", "unfused"),
    ("moe-4l-mb2", "moe-4l", 2, "none", "flash"),
    ("350m-mb1", "350m", 1, "none", "flash"),
    ("1.3b-mb1", "1.3b", 1, "none", "flash"),
    ("125m-mb8-full", "125m", 8, "full", "flash"),
    ("350m-mb8-selective", "350m", 8, "selective", "flash"),
    ("1.3b-mb8", "1.3b", 8, "none", "flash"),
    ("125m-mb2", "125m", 2, "none", "flash"),
    ("350m-mb4-unfused", "350m", 4, "none", "unfused"),
]


def _perfmodel(*args: str) -> list[str]:
    return [sys.executable, "-m", "perfmodel", "--debug", *args]


def _run(cmd: list[str], log: Path, timeout_s: float) -> int:
    """Run cmd with its output appended to log; its exit code (124 when it ran past timeout_s)."""
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            fh.write(f"(stopped after {timeout_s:.0f} s)\n")
            return 124


def run(out: Path, hardware: str, budget_s: float, calibrate: bool,
        names: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    if calibrate:
        started = time.monotonic()
        code = _run(_perfmodel("calibrate", "run", "--out", str(out / "profile.json")), log, 300)
        print(f"calibrate run: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
    started = time.monotonic()
    for name, size, mb, recompute, attention in PLANS:
        if names and name not in names:
            continue
        left = budget_s - (time.monotonic() - started)
        if left < 20:
            print(f"budget spent: {name} and the rest not run", flush=True)
            break
        run_dir = out / "runs" / name
        cmd = _perfmodel("validate", *SIZES[size], "--hardware", hardware, "--nprocs", "1",
                         "--micro-batch", str(mb), "--recompute", recompute,
                         "--attention", attention, "--kernels", "eager",
                         "--steps", "8", "--warmup", "3", "--run-dir", str(run_dir),
                         "--out", str(run_dir / "report.json"),
                         "--history", str(out / "history.csv"))
        t0 = time.monotonic()
        code = _run(cmd, log, min(left, 120))
        print(f"{name}: exit {code} in {time.monotonic() - t0:.0f} s", flush=True)


def _signed(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def _predict(model: Any, hardware: str, profile: Path | None, plan: Any) -> Any:
    from perfmodel import predict
    from perfmodel.specs.resolve import resolve_hardware

    hw = resolve_hardware(hardware, str(profile) if profile else None, None)
    return predict(model, hw, plan, refuse_idle=False)


def table(out: Path, markdown: Path | None) -> None:
    """Each report's measurements beside this checkout's predictions of its plan: the job's plan
    as validation.jobspec.as_run describes it now (the report's own prediction may be older)."""
    from perfmodel.specs.model import model_from_dict
    from perfmodel.strategy import plan_from_dict
    from validation.jobspec import local_dtype

    profile = out / "profile.json"
    rows, errs = [], {"preset": [], "calibrated": [], "memory": []}
    terms: list[str] = []
    for name, *_ in PLANS:
        path = out / "runs" / name / "report.json"
        if not path.exists():
            continue
        rep = json.loads(path.read_text())
        model = model_from_dict(rep["model_spec"], where=str(path))
        # the AdamW kernels the job stepped: its report says since 81c5a51 (2026-12-04), whose
        # jobs step fused on a GPU; every job before stepped foreach (validation.run.meta_of)
        plan, _ = local_dtype(plan_from_dict({"optimizer_kernels": "foreach", **rep["plan"]}),
                              rep["backend"])
        measured = rep["measured_step_time_s"]
        preset = _predict(model, rep["hardware"], None, plan)
        calibrated = _predict(model, rep["hardware"], profile, plan) if profile.exists() else None
        reserved = sum(v for k, v in preset.memory_breakdown_bytes.items()
                       if k.startswith("reserved"))
        m_peak = rep["memory"]["measured_peak_per_rank_bytes"]
        p_peak = preset.memory_per_gpu_bytes - reserved  # tensors, as max_memory_allocated
        errs["preset"].append(_signed(preset.step_time_s, measured))
        errs["memory"].append(_signed(p_peak, m_peak))
        if calibrated is not None:
            errs["calibrated"].append(_signed(calibrated.step_time_s, measured))
            by_term = {t["name"]: t for t in rep["terms"]}
            fwd, bwd, opt = (by_term[k]["measured_s"] for k in ("forward", "backward",
                                                                 "optimizer"))
            b = calibrated.breakdown_s
            pf = sum(v for k, v in b.items() if k.startswith("compute/forward"))
            pb = sum(v for k, v in b.items() if k.startswith("compute/backward")
                     or k.startswith("compute/recompute"))
            terms.append(f"| {name} | {fwd * 1e3:.1f} / {pf * 1e3:.1f} | "
                         f"{bwd * 1e3:.1f} / {pb * 1e3:.1f} | "
                         f"{opt * 1e3:.1f} / {b.get('optimizer/step', 0) * 1e3:.1f} | "
                         f"{sum(v for k, v in b.items() if k.startswith('overhead')) * 1e3:.1f} |")
        rows.append([
            name, f"{preset.parameters / 1e6:,.0f}M", str(plan.micro_batch),
            plan.recompute.value, "flash" if plan.flash_attention else "unfused",
            f"{measured * 1e3:.1f}", f"{preset.step_time_s * 1e3:.1f}",
            f"{_signed(preset.step_time_s, measured):+.1%}",
            f"{calibrated.step_time_s * 1e3:.1f}" if calibrated else "-",
            f"{_signed(calibrated.step_time_s, measured):+.1%}" if calibrated else "-",
            f"{m_peak / 2**30:.2f}", f"{p_peak / 2**30:.2f}", f"{_signed(p_peak, m_peak):+.1%}",
        ])
    head = ["run", "params", "mb", "recompute", "attention", "measured ms", "preset ms",
            "error", "calibrated ms", "error", "peak GiB", "predicted GiB", "error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    for key, values in errs.items():
        if values:
            mape = statistics.mean(abs(v) for v in values)
            lines.append(f"- {key}: median {statistics.median(values):+.1%}, mean absolute "
                         f"{mape:.1%} over {len(values)} runs")
    if terms:
        lines += ["", "Measured / calibrated prediction, ms (the job's clock syncs the device "
                  "at each phase; overhead: the prediction's host terms)", "",
                  "| run | forward | backward | optimizer | overhead |", "|---|---|---|---|---|",
                  *terms]
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown is not None:
        from perfmodel.files import write_atomic

        write_atomic(markdown, text, what="evidence table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--hardware", default="hgx-h200")
    r.add_argument("--budget-s", type=float, default=330.0)
    r.add_argument("--no-calibrate", action="store_true")
    r.add_argument("--plans", help="comma-separated names of PLANS to run (default: all)")
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    t.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.command == "run":
        names = [n for n in (args.plans or "").split(",") if n]
        unknown = sorted(set(names) - {p[0] for p in PLANS})
        if unknown:
            known = ", ".join(p[0] for p in PLANS)
            parser.error(f"--plans: {', '.join(unknown)} not among {known}")
        run(args.out, args.hardware, args.budget_s, not args.no_calibrate, names)
    else:
        table(args.out, args.markdown)


if __name__ == "__main__":
    main()
