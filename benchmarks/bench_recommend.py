"""Speed and memory of the search (issue 6, 14 and 15 targets), on a quiet machine:
- at least 1,000,000 plan evaluations per second (the compiled step model over arrays of plans);
- `recommend` for one GPU count in <= 0.5 s wall, a new process with the compiled formulas in the
  disk cache (llama3-8b on dgx-h100, 64 GPUs; gpt3-175b on dgx-a100-80gb, 1024 GPUs over the
  whole space);
- the first `recommend` after an install or upgrade (an empty cache: the formulas are built) in
  <= 2 s wall;
- issue 17: `recommend --model deepseek-v3 --hardware gb200-nvl72 --gpus 256` (a mixture of
  experts with MLA and an MTP module; the search over ep and, with fused attention, cp) within the
  same two limits, also with --attention flash (the same search since GB200's preset measures
  cuDNN's kernel, 2026-11-29; before, its default attention was unfused, under which no cp plan
  runs);
- `recommend` under 1 GB of memory (peak resident set) on any query: a 5040-GPU query with many
  divisors and a million-GPU one are measured.

Also printed: the rate for each tensor-layout family alone, and on the search space itself (its
331,896 distinct plans once, where the 1M rows above repeat them about three times; terms shared
between plans, see perfmodel.staged, are then shared less).

`--against REV` measures the code of git revision REV the same way in the same run, in turns with
this tree's (each measurement of one tree, then of the other), so that the load of a shared
machine slows both alike; the table puts them side by side.

Run: python benchmarks/bench_recommend.py [--repeats N] [--against REV]
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLI = ["recommend", "--model", "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "1024",
       "--global-batch", "1536", "--json"]
SINGLE_COUNT = {  # issue 15: <= 0.5 s warm, <= 2 s with an empty cache
    "llama3-8b, dgx-h100, 64 GPUs": ["recommend", "--model", "llama3-8b", "--hardware",
                                     "dgx-h100", "--gpus", "64", "--global-batch", "512",
                                     "--json"],
    "gpt3-175b, dgx-a100-80gb, 1024 GPUs": CLI,
    "deepseek-v3, gb200-nvl72, 256 GPUs": ["recommend", "--model", "deepseek-v3", "--hardware",
                                          "gb200-nvl72", "--gpus", "256", "--global-batch",
                                          "4096", "--seq-len", "4096", "--json"],
    "deepseek-v3, gb200-nvl72, 256 GPUs, flash": [
        "recommend", "--model", "deepseek-v3", "--hardware", "gb200-nvl72", "--gpus", "256",
        "--global-batch", "4096", "--seq-len", "4096", "--attention", "flash", "--json"],
}
WARM_LIMIT_S, COLD_LIMIT_S = 0.5, 2.0
MEMORY_QUERIES = {  # issue 14: bounded memory whatever the GPU count and batch
    "5040 GPUs, batch 5040": ["recommend", "--model", "gpt3-175b", "--hardware", "dgx-h100",
                              "--gpus", "5040", "--global-batch", "5040", "--json"],
    "5040 GPUs, batch 8648640": ["recommend", "--model", "gpt3-175b", "--hardware", "dgx-h100",
                                 "--gpus", "5040", "--global-batch", "8648640", "--json"],
    "1048576 GPUs, batch 2097152": ["recommend", "--model", "gpt3-175b", "--hardware", "dgx-h100",
                                    "--gpus", "1048576", "--global-batch", "2097152", "--json"],
}
MEMORY_LIMIT_BYTES = 2**30


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


def _run(tree: Path, args: list[str], cache: str | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak resident bytes and stdout of one command in a new process that
    imports perfmodel from `tree` (with the compiled-formula cache `cache`, default the user's)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if cache is not None:
        env["PERFMODEL_CACHE_DIR"] = cache
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.DEVNULL,
                                env=env, cwd=tree)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if proc.returncode not in (0, 4):
        raise RuntimeError(f"{' '.join(args)} in {tree} exited {proc.returncode}")
    return wall, usage.ru_maxrss * 1024, text


def _tree_of(rev: str, where: Path) -> Path:
    """The perfmodel package of git revision rev, in the directory `where`."""
    archive = subprocess.run(["git", "archive", rev, "perfmodel"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", metavar="REV", default=None,
                        help="also measure git revision REV, in turns with this tree")
    parser.add_argument("--rates", action="store_true", help=argparse.SUPPRESS)  # one tree's
    args = parser.parse_args()
    if args.rates:
        rate, space, others = evaluations_per_second(repeats=args.repeats)
        print(json.dumps({"rate": rate, "space": space, "others": others}))
        return
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory(prefix="bench-recommend-") as tmp:
        if args.against:
            trees[args.against] = _tree_of(args.against, Path(tmp))
        rows = measure(trees, args.repeats)
    report(rows, list(trees))


def measure(trees: dict[str, Path], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Every measurement of every tree, the trees in turns: {what: {tree: [values]}}."""
    rows: dict[str, dict[str, list[float]]] = {}

    def add(what: str, tree: str, value: float) -> None:
        rows.setdefault(what, {}).setdefault(tree, []).append(value)

    for _ in range(repeats):  # each tree in turn: the machine's load falls on both
        for name, tree in trees.items():
            _, _, text = _run(tree, [str(Path(__file__).resolve()), "--rates", "--repeats", "3"])
            data = json.loads(text)
            add("plan evaluations per second, 1M plans of every layout", name, data["rate"])
            for other, value in data["others"].items():
                add(f"  {other}", name, value)
    for tree in trees.values():  # compiled formulas in the disk cache
        for query in SINGLE_COUNT.values():
            _run(tree, ["-m", "perfmodel", *query])
    for _ in range(repeats):
        for name, tree in trees.items():
            for what, query in SINGLE_COUNT.items():
                add(f"recommend {what}, new process [s]", name,
                    _run(tree, ["-m", "perfmodel", *query])[0])
                with tempfile.TemporaryDirectory(prefix="bench-recommend-cache-") as empty:
                    add(f"recommend {what}, empty cache [s]", name,
                        _run(tree, ["-m", "perfmodel", *query], cache=empty)[0])
    for what, query in MEMORY_QUERIES.items():
        for name, tree in [t for _ in range(min(repeats, 3)) for t in trees.items()]:
            wall, peak, text = _run(tree, ["-m", "perfmodel", *query])
            add(f"recommend {what}: wall [s]", name, wall)
            add(f"recommend {what}: peak memory [MB]", name, peak / 1e6)
            add(f"recommend {what}: plans", name, json.loads(text)["enumerated"])
    return rows


def report(rows: dict[str, dict[str, list[float]]], names: list[str]) -> None:
    """The medians side by side, and this tree's against the targets."""
    print(f"{'':<62}" + "".join(f"{n:>16}" for n in names))
    for what, by_tree in rows.items():
        cells = []
        for n in names:
            value = statistics.median(by_tree[n])
            cells.append(f"{value:>16,.0f}" if value >= 1000 else f"{value:>16.2f}")
        print(f"{what:<62}" + "".join(cells))
    mine = {what: statistics.median(v["this tree"]) for what, v in rows.items()}
    rate = mine["plan evaluations per second, 1M plans of every layout"]
    warm = max(mine[f"recommend {what}, new process [s]"] for what in SINGLE_COUNT)
    cold = max(mine[f"recommend {what}, empty cache [s]"] for what in SINGLE_COUNT)
    peak = max(v for what, v in mine.items() if what.endswith("[MB]"))
    print(f"targets (this tree): >= 1,000,000 plans/s: {'OK' if rate >= 1e6 else 'BELOW'}; "
          f"recommend, formulas cached <= {WARM_LIMIT_S} s: "
          f"{'OK' if warm <= WARM_LIMIT_S else 'ABOVE'}; empty cache <= {COLD_LIMIT_S} s: "
          f"{'OK' if cold <= COLD_LIMIT_S else 'ABOVE'}; memory < 1 GB: "
          f"{'OK' if peak * 1e6 < MEMORY_LIMIT_BYTES else 'ABOVE'}")


if __name__ == "__main__":
    main()
