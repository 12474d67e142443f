"""python -m workload.layouts: time a layout, or run the equivalence suite, on every rank.

Under torchrun (or workload.layouts.harness.launch, through workload.launcher):
    torchrun --nproc-per-node 4 -m workload.layouts --layout 2d \
        --dims '{"batch": 4, "seq": 64, "hidden": 256, "heads": 8, "ffn": 1024}' --json out.json
    torchrun --nproc-per-node 4 -m workload.layouts --layout prpc --plan '{"pr": 2, "pc": 2}' \
        --dims '{"model": "mlp", "batch": 64, "widths": [512, 1024, 1024, 10]}' --json out.json
    torchrun --nproc-per-node 4 -m workload.layouts --check --json checks.json
Without RANK in the environment, `--nprocs N` starts the N ranks itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from perfmodel.errors import PerfmodelError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workload.layouts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--layout", choices=("2d", "3d", "prpc"))
    p.add_argument("--check", action="store_true", help="run the equivalence suite (4 or 8 ranks)")
    p.add_argument("--dims", default="", help="model dims as JSON (default: the test dims)")
    p.add_argument("--plan", default="{}", help='e.g. {"pr": 2, "pc": 2} or {"q": 2}')
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", required=True, help="output path (rank 0 writes it, atomically)")
    p.add_argument("--nprocs", type=int, default=0, help="start this many local ranks")
    a = p.parse_args(argv)
    if not a.check and not a.layout:
        p.error("give --layout or --check")
    try:
        if "RANK" not in os.environ:
            return _local(a, argv if argv is not None else sys.argv[1:])
        return _rank(a)
    except (PerfmodelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)


def _local(a: argparse.Namespace, argv: list[str]) -> int:
    from .harness import SUITES, LaunchError, launch, mesh_shape

    if a.nprocs < 1:
        print("error: not under torchrun: give --nprocs N to start N local ranks", file=sys.stderr)
        return 2
    if a.check and a.nprocs not in SUITES:
        print(f"error: the equivalence suite runs on {sorted(SUITES)} ranks", file=sys.stderr)
        return 2
    if a.layout:  # a bad grid fails here, before any process starts
        mesh_shape(a.layout, json.loads(a.plan), a.nprocs)
    rest, skip = [], False
    for k, tok in enumerate(argv):  # the same arguments, minus --nprocs
        if skip:
            skip = False
            continue
        if tok == "--nprocs":
            skip = True
            continue
        if not tok.startswith("--nprocs="):
            rest.append(tok)
        del k
    log_dir = Path(tempfile.mkdtemp(prefix="layouts-"))
    try:
        wall = launch(rest, a.nprocs, log_dir)
    except LaunchError as e:
        print(f"error: {e} (logs: {log_dir})", file=sys.stderr)
        return 1
    shutil.rmtree(log_dir, ignore_errors=True)
    print(f"{a.nprocs} ranks, {wall:.1f} s: {a.json}")
    return 0


def _rank(a: argparse.Namespace) -> int:
    import torch.distributed as dist

    from . import harness

    if a.check:  # refused before the process group forms: a rank that left it early would
        # break a peer still joining or tearing it down (a traceback in that rank's log)
        harness.check_world(int(os.environ["WORLD_SIZE"]))
    harness.init_from_env()
    try:
        if a.check:
            data = harness.check_suite()
            out = Path(a.json)
            harness.write_json(out.with_name(f"{out.stem}.rank{dist.get_rank()}{out.suffix}"), data)
            dist.barrier()
            if dist.get_rank() == 0:
                harness.write_json(out, {"ok": True, "world_size": dist.get_world_size()})
            return 0
        dims = (
            json.loads(a.dims)
            if a.dims
            else dict(harness.MLP_DIMS if a.layout == "prpc" else harness.BLOCK_DIMS)
        )
        plan = json.loads(a.plan)
        if a.layout != "prpc" and not plan:
            plan = {}
        result = harness.time_layout(a.layout, dims, plan, a.steps, a.warmup)
        if dist.get_rank() == 0:
            harness.write_json(a.json, result)
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
