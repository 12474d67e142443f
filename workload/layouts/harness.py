"""Run the layouts: equivalence checks against a single-process reference, timing, and their
start on this machine through workload.launcher (:func:`launch`, :func:`run_layout`).

Every function here except :func:`launch` and :func:`run_layout` runs inside an initialised
torch.distributed process group (gloo on CPU), on every rank.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from perfmodel.errors import PlanError
from perfmodel.files import write_atomic

from . import cube3d, grid_prpc, summa2d
from .block import BlockDims, RefBlock
from .comm import CommLog, Grid

LAYOUTS = ("2d", "3d", "prpc")
RTOL, ATOL = 1e-4, 1e-5
ROOT = Path(__file__).resolve().parents[2]


# --- building a layout ---------------------------------------------------------------------


def mesh_shape(layout: str, plan: dict[str, Any], world: int) -> tuple[tuple[int, ...], tuple]:
    """The mesh shape and axes of a plan; PlanError if it does not fit `world` ranks."""
    if layout == "prpc":
        if "pr" not in plan or "pc" not in plan:
            raise PlanError(f'prpc needs a plan {{"pr": ., "pc": .}} with pr * pc = {world} ranks')
        pr, pc = int(plan["pr"]), int(plan["pc"])
        if pr < 1 or pc < 1 or pr * pc != world:
            raise PlanError(
                f"prpc needs pr * pc = {world} ranks (pr, pc >= 1), got pr={pr} pc={pc}"
            )
        return (pr, pc), grid_prpc.AXES
    if layout not in ("2d", "3d"):
        raise PlanError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    k = 2 if layout == "2d" else 3
    q = round(world ** (1 / k))
    if q**k != world:
        raise PlanError(f"{layout} needs q^{k} ranks (4, 9, 16 / 8, 27, 64, ...), got {world}")
    if "q" in plan and int(plan["q"]) != q:
        raise PlanError(
            f"{layout} with q = {plan['q']} needs {int(plan['q']) ** k} ranks, got {world}"
        )
    return (q,) * k, summa2d.AXES if k == 2 else cube3d.AXES


def build(
    layout: str, dims: dict[str, Any], plan: dict[str, Any], log: CommLog, seed: int = 0
) -> tuple[Any, nn.Module, Any]:
    """(distributed model, reference model, input maker); the input maker turns a full tensor into
    this rank's piece. The distributed model (GridModel, Block2D or Block3D) has shard_pairs."""
    shape, axes = mesh_shape(layout, plan, dist.get_world_size())
    grid = Grid.build(shape, axes, log)
    if layout == "prpc":
        kind = dims.get("model", "mlp")
        if kind == "mlp":
            ref = grid_prpc.reference_mlp(tuple(dims["widths"]), seed)
        elif kind == "cnn":
            ref = grid_prpc.reference_cnn(
                dims.get("channels", 3),
                dims.get("image", 8),
                tuple(dims.get("widths", (8, 16))),
                dims.get("classes", 8),
                seed,
            )
        else:
            raise PlanError(f"prpc model must be mlp or cnn, got {kind!r}")
        model = grid_prpc.GridModel(grid, ref, str(plan.get("contributors", "standard")))
        rows = model.batch_slice(int(dims["batch"]))
        return model, ref, lambda t: t[rows].contiguous()
    bd = BlockDims(**{k: int(dims[k]) for k in ("batch", "seq", "hidden", "heads", "ffn")})
    block = RefBlock(bd, seed)
    grid_block = summa2d.Block2D(grid, block) if layout == "2d" else cube3d.Block3D(grid, block)
    return grid_block, block, grid_block.shard_input


def input_shape(layout: str, dims: dict[str, Any]) -> tuple[int, ...]:
    if layout != "prpc":
        return (int(dims["batch"]), int(dims["seq"]), int(dims["hidden"]))
    if dims.get("model", "mlp") == "mlp":
        return (int(dims["batch"]), int(dims["widths"][0]))
    return (int(dims["batch"]), dims.get("channels", 3), dims.get("image", 8), dims.get("image", 8))


# --- equivalence ---------------------------------------------------------------------


def _compare(name: str, got: torch.Tensor | None, want: torch.Tensor | None) -> dict[str, Any]:
    if got is None or want is None:
        return {"name": name, "ok": False, "error": "missing gradient"}
    if got.shape != want.shape:
        return {
            "name": name,
            "ok": False,
            "error": f"shape {tuple(got.shape)} != {tuple(want.shape)}",
        }
    err = (got - want).abs()
    ok = bool(torch.allclose(got, want, rtol=RTOL, atol=ATOL))
    return {"name": name, "ok": ok, "max_abs_err": float(err.max()) if err.numel() else 0.0}


def check(layout: str, dims: dict[str, Any], plan: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Forward and backward once, distributed and single-process, on the same weights and input;
    compare the output, the input gradient and every parameter's gradient: each rank its pieces
    with the same pieces of the reference, and all pieces gathered back into full tensors
    ("<name>.full") with the reference's full tensors."""
    log = CommLog()
    model, ref, piece = build(layout, dims, plan, log, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(input_shape(layout, dims), generator=gen)
    x_ref = x.clone().requires_grad_(True)
    y_ref = ref(x_ref)
    g = torch.randn(y_ref.shape, generator=gen)
    y_ref.backward(g)

    x_loc = piece(x).requires_grad_(True)
    y_loc = model(x_loc)
    y_loc.backward(piece(g))
    results = [
        _compare("output", y_loc.detach(), piece(y_ref.detach())),
        _compare("input.grad", x_loc.grad, piece(x_ref.grad)),
    ]
    # (name, this rank's piece, which elements of the full tensor it is, the full reference)
    pieces = [
        ("output", y_loc.detach(), piece(_index(y_ref)), y_ref.detach()),
        ("input.grad", x_loc.grad, piece(_index(x_ref)), x_ref.grad),
    ]
    for name, mine, theirs, to_local in model.shard_pairs(ref):
        results.append(_compare(f"{name}.value", mine.detach(), to_local(theirs.detach())))
        results.append(_compare(f"{name}.grad", mine.grad, to_local(theirs.grad)))
        pieces.append((f"{name}.grad", mine.grad, to_local(_index(theirs)), theirs.grad))
    results += _compare_gathered(pieces)
    return {
        "layout": layout,
        "plan": plan,
        "dims": dims,
        "rank": dist.get_rank(),
        "ok": all(r["ok"] for r in results),
        "results": results,
        "collectives": log.counts(),
    }


def _index(t: torch.Tensor) -> torch.Tensor:
    """The flat index of every element, shaped like t: a layout's slicing of it says which
    elements of the full tensor a piece holds."""
    return torch.arange(t.numel()).view(t.shape)


def _compare_gathered(pieces: list[tuple[str, Any, torch.Tensor, torch.Tensor]]) -> list[dict]:
    """Every rank's pieces gathered and written back into full tensors, which are compared with
    the reference's; a "<name>.full" result fails too if some element is held by no rank."""
    mine = [(n, None if p is None else p.detach(), idx) for n, p, idx, _ in pieces]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out = []
    for k, (name, _, _, want) in enumerate(pieces):
        full = torch.full((want.numel(),), float("nan"), dtype=want.dtype)
        for rank_pieces in everyone:
            _, got, idx = rank_pieces[k]
            if got is not None:
                full[idx.reshape(-1)] = got.reshape(-1)
        r = _compare(f"{name}.full", full.view(want.shape), want)
        if torch.isnan(full).any():
            r.update(ok=False, error="elements held by no rank")
        out.append(r)
    return out


# The checks of the CI tests: one 4-rank run for 2D and every Pr x Pc grid, one 8-rank run for 3D.
BLOCK_DIMS = {"batch": 4, "seq": 8, "hidden": 16, "heads": 4, "ffn": 32}
MLP_DIMS = {"model": "mlp", "batch": 8, "widths": [12, 16, 16, 8]}
CNN_DIMS = {"model": "cnn", "batch": 8, "channels": 3, "image": 8, "widths": [8, 16], "classes": 8}
# layers narrower than pr (2 features on pr = 4, 1 on pr = 2, 2 classes on pr = 4): c contributors
NARROW_MLP_DIMS = {"model": "mlp", "batch": 8, "widths": [12, 16, 2, 8]}
NARROW_MLP1_DIMS = {"model": "mlp", "batch": 8, "widths": [12, 16, 1, 8]}
NARROW_CNN_DIMS = {**CNN_DIMS, "classes": 2}
SUITES: dict[int, list[tuple[str, dict[str, Any], dict[str, Any]]]] = {
    4: [("2d", BLOCK_DIMS, {"q": 2})]
    + [
        ("prpc", d, {"pr": pr, "pc": pc})
        for d in (MLP_DIMS, CNN_DIMS)
        for pr, pc in ((2, 2), (1, 4), (4, 1))
    ]
    + [
        ("prpc", d, {"pr": pr, "pc": pc, "contributors": how})
        for d, pr, pc in (
            (NARROW_MLP_DIMS, 4, 1),
            (NARROW_MLP1_DIMS, 2, 2),
            (NARROW_CNN_DIMS, 4, 1),
        )
        for how in ("standard", "specialised")
    ],
    8: [("3d", BLOCK_DIMS, {"q": 2})],
}


def check_world(world: int) -> None:
    """PlanError unless the equivalence suite has layouts for `world` ranks."""
    if world not in SUITES:
        raise PlanError(f"the equivalence suite runs on {sorted(SUITES)} ranks, got {world}")


def check_suite() -> list[dict[str, Any]]:
    world = dist.get_world_size()
    check_world(world)
    return [check(layout, dims, plan) for layout, dims, plan in SUITES[world]]


# --- timing ---------------------------------------------------------------------


def time_layout(
    layout: str,
    model_dims: dict[str, Any],
    plan: dict[str, Any],
    steps: int = 5,
    warmup: int = 2,
    probe_steps: int = 2,
) -> dict[str, Any]:
    """Train `steps` timed steps (after `warmup`) of forward, backward and an SGD step; then
    `probe_steps` steps in which every collective is barrier-synchronised and timed. Returns the
    medians (the maximum over ranks) of forward, backward, optimizer and communication time per
    step, and rank 0's collectives of one step with their bytes and (probe) wall times.
    model_dims: batch, seq, hidden, heads, ffn for 2d/3d; for prpc {"model": "mlp", "batch",
    "widths": [d_in, ..., d_out]} or {"model": "cnn", "batch", "channels", "image", "widths":
    [c1, c2], "classes"}. plan: {"q": q} (optional) for 2d/3d, {"pr": ., "pc": .} for prpc."""
    if steps < 1 or warmup < 0 or probe_steps < 1:
        raise PlanError("steps and probe_steps must be >= 1, warmup >= 0")
    log = CommLog()
    model, ref, piece = build(layout, model_dims, plan, log)
    del ref
    gen = torch.Generator().manual_seed(1)
    x = piece(torch.randn(input_shape(layout, model_dims), generator=gen))
    # a transformer block sits inside a network: its input needs a gradient (the first layer of
    # the Pr x Pc models is the network's first layer: its input needs none)
    x.requires_grad_(layout != "prpc")
    with torch.no_grad():
        g = torch.randn(model(x).shape, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)  # as perfmodel.layerwise
    times: dict[str, list[float]] = {"forward_s": [], "backward_s": [], "optimizer_s": []}
    comm: list[float] = []
    counts: list[dict[str, Any]] = []
    for k in range(warmup + steps + probe_steps):
        probing = k >= warmup + steps
        log.clear()
        log.timed = probing
        dist.barrier()
        t0 = time.perf_counter()
        y = model(x)
        t1 = time.perf_counter()
        y.backward(g)
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if probing:
            comm.append(log.total_seconds())
            counts = log.counts()  # the last probe step's collectives, each with its wall time
        elif k >= warmup:
            times["forward_s"].append(t1 - t0)
            times["backward_s"].append(t2 - t1)
            times["optimizer_s"].append(t3 - t2)
    med = {name: statistics.median(v) for name, v in times.items()}
    med["comm_s"] = statistics.median(comm)
    vec = torch.tensor([med[n] for n in sorted(med)], dtype=torch.float64)
    dist.all_reduce(vec, op=dist.ReduceOp.MAX)
    out = {n: float(v) for n, v in zip(sorted(med), vec.tolist(), strict=True)}
    out["step_s"] = out["forward_s"] + out["backward_s"] + out["optimizer_s"]
    return {
        "layout": layout,
        "plan": plan,
        "model_dims": model_dims,
        "world_size": dist.get_world_size(),
        "steps": steps,
        "warmup": warmup,
        "torch": torch.__version__,
        **out,
        "params_per_rank": sum(p.numel() for p in model.parameters()),
        "collectives": counts,
    }



# --- process group and launcher -----------------------------------------------------


def init_from_env() -> None:
    """Join the process group described by the environment (gloo, CPU, 1 thread): under
    workload.launcher (which this rank must not outlive) on a store bound to loopback, under
    torchrun as torchrun set it up."""
    from workload.process import loopback_rendezvous, watch_parent

    watch_parent()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=float(os.environ.get("LAYOUTS_TIMEOUT_S", 120)))
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", timeout=timeout,
                                **loopback_rendezvous(rank, world, timeout))


def write_json(path: str | Path, data: Any) -> None:
    """A rank's or the launcher's JSON file, through perfmodel's one atomic writer."""
    write_atomic(path, json.dumps(data, indent=1), what="results", make_parents=True)


class LaunchError(RuntimeError):
    """A rank failed or the run timed out; the message names the rank and its last log lines."""


def launch(
    args: list[str],
    nprocs: int,
    log_dir: Path,
    timeout_s: float = 120.0,
    world_size: int | None = None,
) -> float:
    """Run `python -m workload.layouts ARGS` on nprocs local ranks (workload.launcher, gloo on
    127.0.0.1). The ranks are forked from one process that imported torch once (importing torch
    costs ~3 s of CPU per process, which 8 ranks on 2 cores would pay 8 times). Rank R logs to
    log_dir/rankR.log. Returns the wall time; raises LaunchError naming the failed rank, and
    KeyboardInterrupt after Ctrl-C (every rank stopped). (world_size larger than nprocs only
    serves the test of a hung rendezvous.)"""
    from workload.launcher import launch as launch_ranks

    result = launch_ranks(
        "workload.layouts",
        args,
        nprocs,
        log_dir,
        timeout_s=timeout_s,
        threads=1,
        env={"LAYOUTS_TIMEOUT_S": str(int(timeout_s))},
        world_size=world_size,
        fork=True,
        preload=("workload.layouts.harness",),
    )
    if result.interrupted:
        raise KeyboardInterrupt
    if result.ok:
        return result.elapsed_s
    if result.reason.startswith("timeout"):
        raise LaunchError(f"timed out after {timeout_s:.0f} s: " + _tail(result.ranks[0].log))
    failed = result.failed_rank() or result.ranks[0]
    raise LaunchError(f"rank {failed.rank} failed: " + _tail(failed.log))


def _tail(log: str, lines: int = 8) -> str:
    return "\n".join(log.splitlines()[-lines:])


def run_layout(
    layout: str,
    model_dims: dict[str, Any],
    plan: dict[str, Any],
    nprocs: int,
    out_dir: Path,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """time_layout on nprocs local ranks (for `perfmodel validate`); returns rank 0's JSON."""
    mesh_shape(layout, plan, nprocs)  # a bad grid fails here, before any process starts
    out = Path(out_dir) / "layout.json"
    args = [
        "--layout",
        layout,
        "--dims",
        json.dumps(model_dims),
        "--plan",
        json.dumps(plan),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--json",
        str(out),
    ]
    launch(args, nprocs, Path(out_dir), timeout_s)
    return json.loads(out.read_text())
