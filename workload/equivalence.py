"""The job against one process: python -m workload.equivalence CONFIG.json OUT_PREFIX.

Run on every rank of a plan (by workload.launcher, or torchrun), pp = 1. Each rank runs one step of
the job (workload.trainer: forward, backward, gradient sync; no optimizer step), counting its
collectives (with zero 1 and 2, the distributed optimizer's reduced shards are then all-gathered
back onto the parameters, uncounted, to be compared, and its step, AdamW on each rank's shard and
the all-gather of the parameters, is compared with AdamW on the whole parameters with the same
gradients: step:<name>), and, in the same process, the reference: the whole model on one process (dp
= tp = cp = ep = 1) from the same initial weights (seed 0), on every data-parallel replica's batch
in turn (the job's tokens, seeded by replica), micro-batch by micro-batch, the gradients averaged
over the replicas. Compared (fp32, rtol 1e-4, atol 1e-5): the loss (the job's, averaged over the dp
x cp ranks) and the gradient of every parameter the rank holds (tensor-parallel ones gathered; a
routed expert with the reference's expert of the same global index, its etp slice with the same
slice of it). Writes OUT_PREFIX.rank<R>.json.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from typing import Any

import torch
import torch.distributed as dist

from workload.job import write_json
from workload.model import build_chunk, loss_fn
from workload.parallelize import apply_ep, make_mesh
from workload.process import loopback_rendezvous, watch_parent
from workload.timers import CollectiveCounter
from workload.trainer import Trainer

RTOL, ATOL = 1e-4, 1e-5


def reference(cfg: dict[str, Any]) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and gradients of the whole model on one process over every replica's batch."""
    m, plan = cfg["model"], cfg["plan"]
    one = {**plan, "dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "etp": 1, "virtual_stages": 1,
           "sequence_parallel": False, "zero": 0}
    torch.manual_seed(0)
    model = build_chunk(m, one, 0)
    if m.get("experts"):  # routed as the job routes (its balanced routing too)
        apply_ep(model, {}, plan.get("moe_routing", "learned"))
    dp, mb = plan["dp"], plan["micro_batch"]
    n_mb = plan["global_batch"] // (dp * mb)
    total = 0.0
    for r in range(dp):  # the job's tokens of replica r (workload.trainer)
        g = torch.Generator().manual_seed(1234 + r)
        shape = (n_mb * mb, m["seq_len"])
        tokens = torch.randint(0, m["vocab"], shape, generator=g)
        targets = torch.randint(0, m["vocab"], shape, generator=g)
        for i in range(n_mb):
            sl = slice(i * mb, (i + 1) * mb)
            loss = loss_fn(model(tokens[sl]), targets[sl]) / (n_mb * dp)
            loss.backward()
            total += float(loss.detach())
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


def _global_name(name: str, mod: torch.nn.Module) -> str:
    """A routed expert's parameter under its global index (experts.<i> of the rank's slice)."""
    match = re.match(r"(.*\.feed_forward)\.experts\.(\d+)\.(.*)", name)
    if not match:
        return name
    first = int(getattr(mod.get_submodule(match.group(1)), "first_expert", 0))
    return f"{match.group(1)}.experts.{first + int(match.group(2))}.{match.group(3)}"


def _compare(name: str, got: torch.Tensor | None, want: torch.Tensor | None) -> dict[str, Any]:
    if got is None or want is None:
        return {"name": name, "ok": False, "error": "missing gradient"}
    if got.shape != want.shape:
        return {"name": name, "ok": False,
                "error": f"shape {tuple(got.shape)} != {tuple(want.shape)}"}
    err = float((got - want).abs().max()) if got.numel() else 0.0
    return {"name": name, "ok": bool(torch.allclose(got, want, rtol=RTOL, atol=ATOL)),
            "max_abs_err": err}


def _sharded_step(trainer: Trainer) -> list[dict[str, Any]]:
    """The distributed optimizer's step (AdamW on each rank's shard of the flat buffer, then the
    all-gather of the updated parameters) against AdamW on the whole parameters with the same
    (reduced) gradients, on this rank: every parameter after the step, named step:<name>."""
    mod = trainer.chunks[0]

    def local(t: Any) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    names = list(dict(mod.named_parameters()))
    whole = [local(p).detach().clone().requires_grad_(True) for p in mod.parameters()]
    for w, p in zip(whole, mod.parameters(), strict=True):
        w.grad = local(p.grad).detach().clone()
    adamw = torch.optim.AdamW(whole, **trainer.optimizer.adamw)
    adamw.step()
    trainer.optimizer.step()
    return [_compare(f"step:{n}", local(p).detach(), w.detach())
            for n, p, w in zip(names, mod.parameters(), whole, strict=True)]


def check(cfg: dict[str, Any]) -> dict[str, Any]:
    """This rank's step against the reference (inside an initialised process group)."""
    plan = cfg["plan"]
    if plan.get("pp", 1) > 1:
        raise ValueError("the equivalence check runs pp = 1 plans")
    mesh = make_mesh(plan, "cpu")
    torch.manual_seed(0)
    trainer = Trainer(cfg, mesh, torch.device("cpu"), torch.float32, pipeline=False)
    counter = CollectiveCounter(trainer.axis_names())
    trainer.counter = counter
    with counter:
        trainer.gradients()
    trainer.counter = None
    stepped = []
    if trainer.distopt:  # zero 1, 2: each rank holds its shard of the reduced gradients
        trainer.optimizer.gathered_gradients()
        stepped = _sharded_step(trainer)
    # the job's loss: each rank's over its tokens, averaged over the dp x cp ranks
    replicas = trainer.dp * trainer.cp
    loss = torch.tensor([trainer.last_loss or 0.0])
    if replicas > 1:
        group = trainer.groups["dp_cp"][0] if trainer.cp > 1 else mesh.get_group("dp")
        dist.all_reduce(loss, group=group)
    ref_loss, ref_grads = reference(cfg)
    results = [_compare("loss", loss / replicas, torch.tensor([ref_loss]))]
    mod = trainer.chunks[0]
    for name, p in mod.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()  # every rank, in the same order
        full = _global_name(name, mod)
        want = ref_grads.get(full)
        if want is not None and hasattr(p, "etp_slice"):  # this etp rank's slice of an expert
            dim, part, parts = p.etp_slice
            want = want.chunk(parts, dim)[part]
        results.append(_compare(full, g, want))
    results += stepped
    return {
        "rank": dist.get_rank(),
        "coords": {n: mesh.get_local_rank(n) for n in mesh.mesh_dim_names},
        "ok": all(r["ok"] for r in results),
        "loss": float(loss / replicas),
        "reference_loss": ref_loss,
        "results": results,
        "collectives": counter.table(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m workload.equivalence CONFIG.json OUT_PREFIX", file=sys.stderr)
        return 2
    watch_parent()
    with open(argv[0]) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=float(cfg.get("timeout_s", 300)))
    dist.init_process_group("gloo", timeout=timeout, **loopback_rendezvous(rank, world, timeout))
    try:
        out = check(cfg)
    finally:
        dist.destroy_process_group()
    write_json(f"{argv[1]}.rank{rank}.json", out)  # the job's own atomic writer
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as workload.job: gloo's threads can abort the interpreter's teardown


if __name__ == "__main__":
    sys.exit(main())
