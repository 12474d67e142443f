"""Speed of the search (issue 6 targets), on a quiet machine:
- at least 1,000,000 plan evaluations per second (the compiled step model over arrays of plans);
- `perfmodel recommend --model gpt3-175b --hardware dgx-a100-80gb --gpus 1024 --global-batch 1536`
  over the whole space in under 2 s wall, cold start (a new process) included.

Also printed: the rate for each tensor-layout family alone, and on the search space itself (its
331,896 distinct plans once, where the 1M rows above repeat them about three times; terms shared
between plans, see perfmodel.staged, are then shared less).

Run: python benchmarks/bench_recommend.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

CLI = ["recommend", "--model", "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "1024",
       "--global-batch", "1536", "--json"]


LAYOUT_FAMILIES = (("1D", (0,)), ("2D and 2.5D", (1, 2)), ("3D", (3,)))


def evaluations_per_second(n_plans: int = 1_000_000,
                           repeats: int = 5) -> tuple[float, int, dict[str, float]]:
    """Plans per second over n_plans rows of every layout; also by layout family and over the
    search space once (name -> plans per second)."""
    from perfmodel import load_hardware, load_model
    from perfmodel.search import Plans, SearchRequest, enumerate_plans, evaluate_all

    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100-80gb")
    req = SearchRequest(gpus=(1024,), global_batch=1536)
    plans = enumerate_plans(model, req)
    reps = -(-n_plans // len(plans))
    big = Plans({k: np.tile(v, reps)[:n_plans] for k, v in plans.cols.items()})
    capacity = np.inf  # no pruning: every plan is evaluated in full

    def rate(some: Plans) -> float:
        evaluate_all(model, hw, some, req, capacity)  # compiled formulas loaded
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            evaluate_all(model, hw, some, req, capacity)  # every layout, as search() does
            times.append(time.perf_counter() - start)
        return len(some) / statistics.median(times)

    every = rate(big)
    others = {f"{name} plans of the {n_plans:,}":
              rate(big.take(np.flatnonzero(np.isin(big.cols["tp_layout"], codes))))
              for name, codes in LAYOUT_FAMILIES}
    others[f"the search space once ({len(plans):,} distinct plans)"] = rate(plans)
    return every, len(plans), others


def cold_recommend(repeats: int) -> list[float]:
    subprocess.run([sys.executable, "-m", "perfmodel", *CLI], check=True, capture_output=True)  # cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "perfmodel", *CLI], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rate, space, others = evaluations_per_second(repeats=args.repeats)
    wall = statistics.median(cold_recommend(args.repeats))
    print(f"plan evaluations per second (1M plans of every layout, values built and evaluated): {rate:,.0f}"
          f"  {'OK' if rate >= 1e6 else 'BELOW 1,000,000'}")
    for name, other in others.items():
        print(f"  {name}: {other:,.0f}  {'OK' if other >= 1e6 else 'BELOW 1,000,000'}")
    print(f"gpt3-175b on 1024 x A100, {space:,} plans: perfmodel recommend, new process, median "
          f"{wall:.2f} s wall  {'OK' if wall < 2 else 'ABOVE 2 s'}")


if __name__ == "__main__":
    main()
