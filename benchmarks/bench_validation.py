"""Accuracy of the whole loop on this machine: predict, run, measure, for a suite of plans.

    perfmodel calibrate run --out profile.json          # once, on this machine
    python benchmarks/bench_validation.py --profile profile.json [--rounds 3] [--out results.csv]
    perfmodel calibrate run --out cpu4.json --nprocs 4  # 4-rank plans: measured with 4 ranks
    python benchmarks/bench_validation.py --profile profile.json --rank-profile 4=cpu4.json

Runs each plan of the suite as a real gloo job (validation.run.validate), `--rounds` times in
interleaved rounds (plan 1..N, then again), and compares the median of a plan's measured step
times with its prediction: a shared machine's speed drifts by 10-20 % within seconds, so one run
is not a measurement. Prints the table and the median and worst relative error
(|measured - predicted| / predicted). Target on the 2-core reference machine: median <= 15 %,
worst <= 30 %. With --calibrate the profile is made first (perfmodel calibrate run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# (name, plan fields): pure data, pure tensor, pure pipeline, mixed; several micro-batch sizes.
SUITE: list[tuple[str, dict[str, object]]] = [
    ("dp2-mb1", dict(gpus=2, dp=2, micro_batch=1, global_batch=4)),
    ("dp2-mb4", dict(gpus=2, dp=2, micro_batch=4, global_batch=8)),
    ("tp2-mb1", dict(gpus=2, tp=2, micro_batch=1, global_batch=2)),
    ("tp2-mb4", dict(gpus=2, tp=2, micro_batch=4, global_batch=4)),
    ("tp2-sp-mb2", dict(gpus=2, tp=2, micro_batch=2, global_batch=4, sequence_parallel=True)),
    ("pp2-gpipe-mb1", dict(gpus=2, pp=2, micro_batch=1, global_batch=4, schedule="gpipe")),
    ("pp2-1f1b-mb2", dict(gpus=2, pp=2, micro_batch=2, global_batch=8, schedule="1f1b")),
    ("dp2-zero3-mb2", dict(gpus=2, dp=2, micro_batch=2, global_batch=4, zero=3)),
    ("dp2-tp2-mb1", dict(gpus=4, dp=2, tp=2, micro_batch=1, global_batch=4)),
    ("dp2-pp2-mb1", dict(gpus=4, dp=2, pp=2, micro_batch=1, global_batch=4, schedule="1f1b")),
]


def parse_plan(text: str) -> tuple[str, dict[str, object]]:
    """NAME:FIELD=VALUE,... -> (name, fields); whole numbers and true/false are converted."""
    name, sep, body = text.partition(":")
    if not sep or not name or not body:
        raise ValueError(f"expected NAME:FIELD=VALUE,..., got {text!r}")
    fields: dict[str, object] = {}
    for item in body.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"expected FIELD=VALUE in {text!r}, got {item!r}")
        low = value.strip().lower()
        fields[key.strip()] = (int(low) if low.isdigit() else
                               low == "true" if low in ("true", "false") else value.strip())
    return name, fields


def cpu_busy_fraction(window_s: float = 2.0) -> float:
    """Fraction of the machine's CPU time spent busy over a short window (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    idle0, total0 = sample()
    time.sleep(window_s)
    idle1, total1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_until_quiet(max_busy: float, max_wait_s: float) -> float:
    """Other processes slow the job down and the model cannot know: wait for a quiet machine."""
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_fraction()
    while busy > max_busy and time.monotonic() < deadline:
        busy = cpu_busy_fraction()
    return busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=Path("profile.json"))
    parser.add_argument(
        "--rank-profile",
        action="append",
        default=[],
        metavar="N=PATH",
        help="Plans on N ranks use this profile (measured by calibrate run --nprocs N); "
        "repeatable. Other plans use --profile.",
    )
    parser.add_argument("--hardware", default=None, help="Preset under the profile (optional).")
    parser.add_argument("--model", default="tiny-gpt")
    for dim in ("layers", "hidden", "heads", "seq-len"):
        parser.add_argument(f"--{dim}", type=int, default=None, help=f"Override the model's {dim}.")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--rounds", type=int, default=3, help="Runs of every plan (interleaved); median measured."
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--only", default=None, help="Comma-separated plan names of the suite.")
    parser.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="NAME:FIELD=VALUE,...",
        help="A plan to run instead of the suite, e.g. tp4:gpus=4,tp=4,micro_batch=1,"
        "global_batch=2 (fields of perfmodel.Plan); repeatable.",
    )
    parser.add_argument(
        "--calibrate", action="store_true", help="Run perfmodel calibrate run first."
    )
    parser.add_argument(
        "--max-busy",
        type=float,
        default=0.2,
        help="Wait until the CPUs are at most this busy before each plan.",
    )
    parser.add_argument("--max-wait", type=float, default=180.0, help="... for at most [s].")
    parser.add_argument("--out", type=Path, default=Path("validation-runs/bench_validation.csv"))
    args = parser.parse_args(argv)

    if args.calibrate:
        subprocess.run(
            [sys.executable, "-m", "perfmodel", "calibrate", "run", "--out", str(args.profile)],
            check=True,
        )
    from perfmodel import Plan, load_hardware, load_model
    from perfmodel.files import write_atomic
    from perfmodel.specs.profile import apply_profile, load_profile
    from validation import report as rep
    from validation import run

    if not args.profile.exists():
        print(
            f"no profile at {args.profile}: run `perfmodel calibrate run --out {args.profile}` "
            "(or pass --calibrate)",
            file=sys.stderr,
        )
        return 2
    base = load_hardware(args.hardware) if args.hardware else None
    hardware = apply_profile(base, load_profile(args.profile))
    by_ranks = {}
    for item in args.rank_profile:
        ranks, _, path = item.partition("=")
        if not ranks.isdigit() or not path:
            print(f"--rank-profile {item!r}: expected N=PATH, e.g. 4=cpu4.json", file=sys.stderr)
            return 2
        by_ranks[int(ranks)] = apply_profile(base, load_profile(Path(path)))
    overrides = {
        "layers": args.layers,
        "hidden": args.hidden,
        "heads": args.heads,
        "seq_len": args.seq_len,
    }
    # the MLP width, key/value grouping and attention width keep the preset's proportions
    model = load_model(args.model).scaled(**{k: v for k, v in overrides.items() if v})
    wanted = set(args.only.split(",")) if args.only else None
    suite = [(name, fields) for name, fields in SUITE if not wanted or name in wanted]
    if args.plan:
        try:
            suite = [parse_plan(text) for text in args.plan]
        except ValueError as exc:
            print(f"--plan: {exc}", file=sys.stderr)
            return 2
    from perfmodel.errors import PerfmodelError

    plans = {}
    for name, fields in suite:  # every plan checked before anything runs
        try:
            plans[name] = Plan(**{"dtype": "fp32", **fields}).check(model)
        except (TypeError, PerfmodelError) as exc:
            print(f"plan {name}: {exc}", file=sys.stderr)
            return 2
    runs = []
    for rnd in range(max(1, args.rounds)):
        for name, _ in suite:
            plan = plans[name]
            settings = run.RunSettings(
                nprocs=plan.gpus, steps=args.steps, warmup=args.warmup, timeout_s=600
            )
            busy = wait_until_quiet(args.max_busy, args.max_wait)
            start = time.monotonic()
            out_dir = Path("validation-runs") / f"bench-{name}-r{rnd}"
            report = run.validate(model, by_ranks.get(plan.gpus, hardware), plan, settings, out_dir)
            rep.save(report, out_dir / "report.json")
            rep.append_history(report, Path("validation-runs/history.csv"))
            err = report["relative_error"]
            runs.append(
                {
                    "plan": name,
                    "round": rnd,
                    "ranks": plan.gpus,
                    "status": report["status"],
                    "predicted_ms": (report["predicted_step_time_s"] or 0) * 1e3,
                    "measured_ms": (report["measured_step_time_s"] or 0) * 1e3,
                    "error": err,
                    "wall_s": time.monotonic() - start,
                    "cpu_busy_before": busy,
                    "load_avg_1min": os.getloadavg()[0],
                    "profile": str(args.profile)
                    if plan.gpus not in by_ranks
                    else f"{plan.gpus} ranks",
                }
            )
            r = runs[-1]
            print(
                f"round {rnd} {name:16s} ranks {plan.gpus}  predicted {r['predicted_ms']:8.1f} ms"
                f"  measured {r['measured_ms']:8.1f} ms  error "
                f"{'-' if err is None else f'{err * 100:+.1f}%'}  ({r['wall_s']:.0f} s, "
                f"CPU {busy * 100:.0f}% busy before, load {r['load_avg_1min']:.2f})",
                flush=True,
            )
    rows = []
    for name, _ in suite:
        ok = [r for r in runs if r["plan"] == name and r["status"] == "ok" and r["measured_ms"]]
        if not ok:
            continue
        measured = [r["measured_ms"] for r in ok]
        predicted = ok[0]["predicted_ms"]
        med = statistics.median(measured)
        rows.append(
            {
                "plan": name,
                "ranks": ok[0]["ranks"],
                "predicted_ms": predicted,
                "measured_ms": med,
                "measured_min_ms": min(measured),
                "measured_max_ms": max(measured),
                "runs": len(ok),
                "error": (med - predicted) / predicted if predicted > 0 else None,
            }
        )
    print(
        f"\n{'plan':16s} {'ranks':>5s} {'predicted':>10s} {'measured':>10s} "
        f"{'runs (min-max)':>22s} {'error':>8s}"
    )
    for r in rows:
        err = "-" if r["error"] is None else f"{r['error'] * 100:+.1f}%"
        print(
            f"{r['plan']:16s} {r['ranks']:5d} {r['predicted_ms']:8.1f} ms "
            f"{r['measured_ms']:8.1f} ms {r['runs']:3d} "
            f"({r['measured_min_ms']:6.1f}-{r['measured_max_ms']:6.1f}) {err:>8s}"
        )
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    if errors:
        print(
            f"\n{len(errors)} plans: median |error| {statistics.median(errors) * 100:.1f}%, "
            f"worst {max(errors) * 100:.1f}% (target: median <= 15%, worst <= 30%)"
        )
    import pandas as pd

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, pd.DataFrame(rows).to_csv(index=False))
    runs_path = args.out.with_name(args.out.stem + "-runs.csv")
    write_atomic(runs_path, pd.DataFrame(runs).to_csv(index=False))
    print(f"table: {args.out} (every run: {runs_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
