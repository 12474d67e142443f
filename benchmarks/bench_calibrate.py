"""Wall time and fit quality of `perfmodel calibrate run` on this machine (issue 3 targets).

    python benchmarks/bench_calibrate.py [--nprocs 4] [--mode quick|full|both] [--keep DIR]

Targets on the 2-core reference machine with 4 ranks: --quick under 2 minutes, a full run under 10.
Each run is a new `perfmodel calibrate run` process, timed from start to the profile on disk
(torch import, rank launch, measurements, fits, writing). The table lists the wall time, the number
of measurements and the median relative error of each fit family; the load average before and
after is printed because other work on the machine inflates both times and errors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = {"quick": 120.0, "full": 600.0}


def run(mode: str, nprocs: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "perfmodel",
        "calibrate",
        "run",
        "--out",
        str(out),
        "--nprocs",
        str(nprocs),
    ] + (["--quick"] if mode == "quick" else [])
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1]}")
    doc = json.loads(out.read_text())
    errors: dict[str, list[float]] = {}
    for fit in doc["fits"].values():
        errors.setdefault(fit["kind"], []).append(fit["median_rel_error"])
    points = sum(f["n_points"] for f in doc["fits"].values())
    return {
        "mode": mode,
        "wall_s": wall,
        "target_s": TARGET_S[mode],
        "points": points,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        **{f"median_err_{k}": statistics.median(v) for k, v in sorted(errors.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--mode", choices=["quick", "full", "both"], default="both")
    parser.add_argument("--keep", type=Path, default=None, help="Directory to keep the profiles.")
    args = parser.parse_args()
    modes = ["quick", "full"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        rows = [run(mode, args.nprocs, where / f"calibrate-{mode}.json") for mode in modes]
    print(f"perfmodel calibrate run, {args.nprocs} ranks, {os.cpu_count()} cores")
    for row in rows:
        verdict = "ok" if row["wall_s"] < row["target_s"] else "OVER TARGET"
        errs = ", ".join(
            f"{k.removeprefix('median_err_')} {v:.1%}"
            for k, v in row.items()
            if k.startswith("median_err_")
        )
        print(
            f"{row['mode']:>5}: {row['wall_s']:6.1f} s (target < {row['target_s']:.0f} s, "
            f"{verdict}); {row['points']} points; median fit error: {errs}; load "
            f"{row['load_before']:.1f} -> {row['load_after']:.1f}"
        )


if __name__ == "__main__":
    main()
