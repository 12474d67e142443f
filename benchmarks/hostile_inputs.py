"""Hostile inputs (issue 14): each must be refused in one line, with its class's exit code, in
well under a second and with bounded memory.

Run: python benchmarks/hostile_inputs.py [--repo DIR]   (DIR: the checkout to measure; default
this one). Each case runs as `python -m perfmodel ...` in a new process, under a 30 s timeout and a
6 GiB address-space limit (ulimit -v: an older checkout that reads /dev/zero to the end fails with
MemoryError instead of taking the machine down); the table gives its exit code, wall time and peak
resident memory (os.wait4). A plain prediction is the baseline: most of each time is starting
Python and importing perfmodel.
Exits 1 when a case is not refused with its exit code, or takes over 1 s or 200 MiB more than the
baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S, LIMIT_MIB = 1.0, 200.0  # over the baseline
TINY = "kind: transformer\nlayers: 4\nhidden: 256\nheads: 8\nseq_len: 128\nvocab: 1024\n"


def alias_bomb(head: str) -> str:
    """'Billion laughs': 9 aliases of 9 aliases, 9 levels deep: 9^9 values from 10 lines."""
    anchors = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        anchors.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return head + "source: [" + ",\n  ".join(anchors) + "]\n"


def inputs(d: Path) -> list[tuple[str, list[str], int]]:
    """(label, perfmodel arguments, expected exit code) of each case; files written under d."""
    with open(d / "big-model.yaml", "w") as fh:  # in 1 MiB pieces: this process stays small
        fh.write(TINY + 'source: "')
        for _ in range(64):
            fh.write("x" * 2**20)
        fh.write('"\n')
    with open(d / "big-plans.csv", "w") as fh:
        fh.write("gpus,dp\n")
        for _ in range(64):
            fh.write("8,8\n" * 2**18)
    (d / "bomb.yaml").write_text(alias_bomb(TINY))
    (d / "hw-bomb.yaml").write_text(alias_bomb("base: dgx-h100\n"))
    (d / "cell-zero.csv").write_text("model,gpus,dp\n/dev/zero,8,8\n")
    (d / "cell-bomb.csv").write_text(f"model,gpus,dp\n{d}/bomb.yaml,8,8\n")
    (d / "hw-1e-300.yaml").write_text("base: dgx-h100\ninter_node:\n"
                                      "  bandwidth_bytes_per_s: 1.0e-300\n")
    os.mkfifo(d / "fifo.yaml")
    (d / "run" / "results").mkdir(parents=True)
    os.mkfifo(d / "run" / "meta.json")
    h = ["--hardware", "dgx-h100"]
    return [
        ("baseline: predict tiny-gpt", ["predict", "--model", "tiny-gpt", *h], 0),
        ("model /dev/zero", ["predict", "--model", "/dev/zero", *h], 3),
        ("model FIFO", ["predict", "--model", f"{d}/fifo.yaml", *h], 3),
        ("model 64 MiB", ["predict", "--model", f"{d}/big-model.yaml", *h], 3),
        ("model billion laughs", ["predict", "--model", f"{d}/bomb.yaml", *h], 3),
        ("hardware billion laughs", ["predict", "--model", "tiny-gpt", "--hardware",
                                     f"{d}/hw-bomb.yaml"], 3),
        ("hardware /dev/zero", ["predict", "--model", "tiny-gpt", "--hardware", "/dev/zero"], 3),
        ("profile /dev/zero", ["predict", "--model", "tiny-gpt", "--profile", "/dev/zero"], 3),
        ("--batch /dev/zero", ["predict", "--model", "tiny-gpt", *h, "--batch", "/dev/zero"], 5),
        ("--batch 64 MiB", ["predict", "--model", "tiny-gpt", *h, "--batch",
                            f"{d}/big-plans.csv", "--out", f"{d}/out.csv"], 5),
        ("--batch cell /dev/zero", ["predict", *h, "--batch", f"{d}/cell-zero.csv"], 5),
        ("--batch cell billion laughs", ["predict", *h, "--batch", f"{d}/cell-bomb.csv"], 5),
        ("nccl-tests log /dev/zero", ["calibrate", "import-nccl-tests", "/dev/zero", "--out",
                                      f"{d}/p.json"], 5),
        ("GEMM table /dev/zero", ["calibrate", "import-gemm", "/dev/zero", "--out",
                                  f"{d}/p.json"], 5),
        ("report /dev/zero", ["calibrate", "report", "/dev/zero"], 3),
        ("collect: meta.json a FIFO", ["validate", "collect", f"{d}/run"], 5),
        ("bandwidth 1e-300 B/s", ["predict", "--model", "tiny-gpt", "--hardware",
                                  f"{d}/hw-1e-300.yaml", "--dp", "16", "--gpus", "16"], 3),
    ]


def run(repo: Path, args: list[str]) -> tuple[int, float, float, str]:
    """(exit code, wall s, peak RSS MiB, last line of stderr) of `python -m perfmodel ARGS`,
    started by a shell that limits its address space (no fork of this process: its memory would
    count in the child's peak)."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    limit = 'ulimit -v 6291456; exec "$0" "$@"'  # KiB: 6 GiB
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(["sh", "-c", limit, sys.executable, "-m", "perfmodel", *args],
                                cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(30, proc.kill)  # a FIFO that blocks forever, say
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak memory
        timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    return code, wall, usage.ru_maxrss / 1024, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=ROOT)
    repo = parser.parse_args().repo.resolve()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = inputs(Path(tmp))
        print(f"{'case':30} {'exit':>4} {'wall s':>7} {'peak MiB':>9}  stderr")
        base_s = base_mib = 0.0
        for label, args, expected in cases:
            code, wall, rss, line = run(repo, args)
            if expected == 0:
                base_s, base_mib = wall, rss
            bad = code != expected or wall > base_s + LIMIT_S or rss > base_mib + LIMIT_MIB
            failed += bad
            print(f"{label:30} {code:>4} {wall:>7.2f} {rss:>9.0f}  {'FAIL ' if bad else ''}"
                  f"{line[:110]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
