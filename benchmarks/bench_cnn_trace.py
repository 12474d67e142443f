"""Speed of tracing a torchvision CNN into a layer graph (validation.cnn_graph.trace_builtin), the
step behind `perfmodel sweep` and `predict` of a builtin CNN graph: ResNet-50 built on the meta
device and traced in a new process, target < 1 s (its median over the runs; the import of torch
and a warm-up trace of AlexNet are not counted).

Run: python benchmarks/bench_cnn_trace.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
CODE = ("import time\nfrom validation import cnn_graph\n"
        "cnn_graph.trace_builtin('alexnet', (1, 3, 64, 64))\n"  # the import paths warmed up
        "t = time.perf_counter()\ncnn_graph.trace_builtin('resnet50')\n"
        "print(time.perf_counter() - t)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times = [float(subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout)
             for _ in range(args.repeats)]
    median = statistics.median(times)
    print(f"resnet50 trace: median {median:.3f} s over {args.repeats} runs "
          f"(min {min(times):.3f}, max {max(times):.3f}); target < {TARGET_S:g} s: "
          f"{'met' if median < TARGET_S else 'missed'}")


if __name__ == "__main__":
    main()
