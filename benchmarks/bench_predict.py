"""Speed of `perfmodel predict` as a user sees it (issue 15 item 7 targets), in new processes:
- warm: the compiled formulas in the disk cache (the usual case): <= 0.25 s wall, and none of
  sympy, pandas, matplotlib or torch imported;
- cold: an empty cache (the first run after an install or upgrade): <= 2 s wall;
- the API call in a warm process: < 5 ms.

`--against REV` measures the code of git revision REV the same way in the same run, in turns with
this tree's (one process of one tree, then of the other), so that the load of a shared machine
slows both alike; the table puts the medians side by side.

Run: python benchmarks/bench_predict.py [--repeats N] [--against REV]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["predict", "--model", "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "64",
        "--tp", "8", "--pp", "8", "--global-batch", "64", "--schedule", "interleaved",
        "--virtual-stages", "3", "--json"]
HEAVY = ("sympy", "pandas", "matplotlib", "torch", "scipy")
TARGETS = {"warm": 0.25, "cold": 2.0, "api": 0.005}  # seconds
# the CLI in a new process, then the heavy modules it imported (on stderr)
RUN_CLI = ("import sys\nfrom perfmodel.cli import main\ntry:\n    main(sys.argv[1:])\nfinally:\n"
           "    print('HEAVY', *[m for m in {heavy!r} if m in sys.modules], file=sys.stderr)\n")


def _run(tree: Path, cache: str) -> tuple[float, list[str]]:
    """Wall seconds of one `perfmodel predict` process of tree, and the heavy modules it loaded."""
    env = dict(os.environ, PERFMODEL_CACHE_DIR=cache, PYTHONPATH=str(tree))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", RUN_CLI.format(heavy=HEAVY), *ARGS], env=env,
                         cwd=tree, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    heavy = next(x for x in out.stderr.splitlines() if x.startswith("HEAVY")).split()[1:]
    return wall, heavy


def _api(tree: Path, repeats: int) -> float:
    """Median seconds of predict() through the API in a warm process of tree."""
    code = ("import statistics, time, perfmodel\n"
            "m = perfmodel.load_model('gpt3-175b')\n"
            "hw = perfmodel.load_hardware('dgx-a100-80gb')\n"
            "plan = perfmodel.Plan(gpus=64, tp=8, pp=8, global_batch=64, schedule='interleaved', "
            "virtual_stages=3)\nperfmodel.predict(m, hw, plan)\ntimes = []\n"
            f"for _ in range({repeats}):\n    t = time.perf_counter()\n"
            "    perfmodel.predict(m, hw, plan)\n    times.append(time.perf_counter() - t)\n"
            "print(statistics.median(times))\n")
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True,
                         text=True, check=True)
    return float(out.stdout)


def _tree_of(rev: str, where: Path) -> Path:
    """The perfmodel package of git revision rev, in the directory `where`."""
    archive = subprocess.run(["git", "archive", rev, "perfmodel"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def measure(trees: dict[str, Path], repeats: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """{what: {tree: [seconds]}}, the trees in turns; also prints the heavy modules imported."""
    rows: dict[str, dict[str, list[float]]] = {"warm": {}, "cold": {}, "api": {}}
    caches = {name: str(tmp / f"warm-{i}") for i, name in enumerate(trees)}
    heavy: dict[str, list[str]] = {}
    for name, tree in trees.items():  # fill each tree's cache
        _run(tree, caches[name])
    for i in range(repeats):
        for name, tree in trees.items():
            wall, heavy[name] = _run(tree, caches[name])
            rows["warm"].setdefault(name, []).append(wall)
            cold = tmp / f"cold-{name.replace('/', '_')}-{i}"
            rows["cold"].setdefault(name, []).append(_run(tree, str(cold))[0])
    for name, tree in trees.items():
        rows["api"].setdefault(name, []).append(_api(tree, 1000))
    for name, modules in heavy.items():
        print(f"heavy modules a warm predict imports ({name}): {', '.join(modules) or 'none'}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--against", metavar="REV", default=None,
                        help="also measure git revision REV, in turns with this tree")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        if args.against:
            (Path(tmp) / "rev").mkdir()
            trees[args.against] = _tree_of(args.against, Path(tmp) / "rev")
        rows = measure(trees, args.repeats, Path(tmp))
    labels = {"warm": "predict, new process, formulas cached [s]",
              "cold": "predict, new process, empty cache [s]",
              "api": "predict() through the API, warm process [ms]"}
    print(f"{'':<48}" + "".join(f"{n:>14}" for n in trees))
    for what, by_tree in rows.items():
        scale = 1e3 if what == "api" else 1
        cells = "".join(f"{statistics.median(by_tree[n]) * scale:>14.3f}" for n in trees)
        mine = statistics.median(by_tree["this tree"])
        verdict = "OK" if mine <= TARGETS[what] else f"ABOVE {TARGETS[what] * scale:g}"
        print(f"{labels[what]:<48}{cells}   target: {verdict}")


if __name__ == "__main__":
    main()
