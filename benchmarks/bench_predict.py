"""Speed of `perfmodel predict` (issue 2 targets): cold start < 2 s wall, warm API call < 5 ms.

Run: python benchmarks/bench_predict.py [--repeats N]
Cold start is measured as a user sees it: a new `perfmodel predict` process, (a) with the compiled
formulas already in the disk cache (the usual case) and (b) with an empty cache (the first run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARGS = ["predict", "--model", "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "64", "--tp", "8",
        "--pp", "8", "--global-batch", "64", "--schedule", "interleaved", "--virtual-stages", "3",
        "--json"]


def cold(repeats: int, cache: str, clear: bool) -> list[float]:
    times = []
    for _ in range(repeats):
        if clear:
            for name in os.listdir(cache):
                os.unlink(os.path.join(cache, name))
        env = dict(os.environ, PERFMODEL_CACHE_DIR=cache)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "perfmodel", *ARGS], env=env, check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def warm(repeats: int) -> list[float]:
    import perfmodel

    model = perfmodel.load_model("gpt3-175b")
    hw = perfmodel.load_hardware("dgx-a100-80gb")
    plan = perfmodel.Plan(gpus=64, tp=8, pp=8, global_batch=64, schedule="interleaved",
                          virtual_stages=3)
    perfmodel.predict(model, hw, plan)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        perfmodel.predict(model, hw, plan)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        first = cold(max(3, args.repeats // 2), cache, clear=True)
        cached = cold(args.repeats, cache, clear=False)
    api = warm(1000)
    rows = [
        ("perfmodel predict, cold process, formulas cached", statistics.median(cached), 2.0),
        ("perfmodel predict, cold process, empty cache", statistics.median(first), None),
        ("predict() through the API, warm", statistics.median(api), 0.005),
    ]
    for name, seconds, target in rows:
        verdict = "" if target is None else ("  OK" if seconds < target else f"  SLOWER than {target} s")
        print(f"{name:52s} median {seconds * 1e3:9.2f} ms{verdict}")


if __name__ == "__main__":
    main()
