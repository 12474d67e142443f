"""Microbenchmarks of the framework's fixed costs: per kernel, per collective call, optimizer step.

What a training step pays beyond the rooflines of its kernels and the alpha-beta of its
collectives, measured with every rank running (as a job runs), on CUDA + NCCL and CPU + gloo alike:

- kernel chains: N tiny modules of one kind (Linear, LayerNorm, GELU, residual add, softmax)
  applied in sequence through autograd, forward then backward, as a training step calls them.
  The shapes are tiny (8 tokens x 16 features), so the roofline time is nanoseconds and what the
  slope over N measures is the fixed cost of one op forward and backward (Python module call,
  dispatcher, autograd node, kernel launch). perfmodel charges `kernel_overhead_s` three times per
  forward kernel (forward + backward), so the fit is t = c + 3 * N * kernel_overhead_s.
  With several ranks the same chain also runs on DTensors (Replicate over all ranks): the extra
  cost of DTensor dispatch per op is recorded (perfmodel has no term for it yet).
- tiny collectives: a 16-byte all-reduce by `dist.all_reduce` (the fitted alpha carries it), and
  the same all-reduce as a DTensor redistribute Partial -> Replicate (what tensor-parallel layers
  issue); the difference is the dispatch cost per collective call beyond alpha.
- optimizer: `torch.optim.AdamW(foreach=True)` steps over tensors shaped like transformer layers,
  for several parameter counts; the fit t = c + bytes / bandwidth with perfmodel's own byte count
  per parameter (perfmodel.costs.precision.optimizer_step_bytes_per_param) gives the bandwidth the
  optimizer achieves.
torch is imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from calibration.measure import measure

CHAIN_KINDS = ("linear", "layernorm", "gelu", "add", "softmax")
CHAIN_LENGTHS = (4, 8, 16, 32)
CHAIN_SHAPE = (8, 16)  # tokens x features: roofline time ~1e-8 s per op
OPTIMIZER_HIDDEN = (64, 128, 256, 384)  # tensors of 4 layers (12 h^2 + 13 h parameters each)


def _chain(torch: Any, kind: str, length: int) -> Any:
    """nn.Sequential of `length` modules of one kind on CHAIN_SHAPE inputs."""
    nn = torch.nn
    width = CHAIN_SHAPE[1]

    # nn is torch.nn, passed in (Any here): mypy takes no variable as a base class
    class Add(nn.Module):  # type: ignore[name-defined]  # residual add: x + f(x) with f the identity keeps one op per module
        def forward(self, x: Any) -> Any:
            return x + x

    class Softmax(nn.Module):  # type: ignore[name-defined]
        def forward(self, x: Any) -> Any:
            return torch.softmax(x, dim=-1)

    make: dict[str, Callable[[], Any]] = {
        "linear": lambda: nn.Linear(width, width, bias=False),
        "layernorm": lambda: nn.LayerNorm(width),
        "gelu": lambda: nn.GELU(),
        "add": Add,
        "softmax": Softmax,
    }
    return nn.Sequential(*(make[kind]() for _ in range(length)))


def chain_count(sweep: Any, world: int) -> int:
    return len(CHAIN_KINDS) * len(sweep.chain_lengths) * (2 if world > 1 else 1)


def bench_kernel_chains(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """Forward + backward of chains of tiny ops; with several ranks also on DTensors."""
    torch = ctx.torch
    variants = ["plain"]
    mesh = None
    if ctx.world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
        variants.append("dtensor")
    for variant in variants:
        for kind in CHAIN_KINDS:
            for length in sweep.chain_lengths:
                mod = _chain(torch, kind, length).to(ctx.device)
                x = torch.randn(*CHAIN_SHAPE, device=ctx.device, requires_grad=True)
                if variant == "dtensor":
                    from torch.distributed.tensor import (
                        Replicate,
                        distribute_module,
                        distribute_tensor,
                    )

                    mod = distribute_module(mod, mesh)  # parameters replicated DTensors
                    x = distribute_tensor(x.detach(), mesh, [Replicate()]).requires_grad_()

                def step(mod: Any = mod, x: Any = x) -> None:
                    mod(x).sum().backward()

                med, spread = measure(step, sweep, ctx)
                rec.add(
                    {
                        "kind": "kernel_chain",
                        "op": kind,
                        "variant": variant,
                        "length": length,
                        "time_s": ctx.slowest(med),
                        "spread": spread,
                        "ranks": ctx.world,
                    }
                )
                yield


DISPATCH_ROUNDS = 5  # tiny collectives are noisy on shared cores: alternate, several rounds


def dispatch_count(world: int) -> int:
    return 2 * DISPATCH_ROUNDS if world > 1 else 0


def bench_collective_dispatch(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """A 16-byte all-reduce over all ranks: by dist.all_reduce and as a DTensor redistribute."""
    if ctx.world < 2:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    torch, dist = ctx.torch, ctx.dist
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    x = torch.ones(4, device=ctx.device)

    def plain() -> None:
        dist.all_reduce(x)

    def dtensor() -> None:
        d = DTensor.from_local(x, mesh, [Partial()], run_check=False)
        d.redistribute(mesh, [Replicate()]).to_local().sum()  # .sum() waits on the result

    for _ in range(DISPATCH_ROUNDS):
        for how, fn in (("dist.all_reduce", plain), ("dtensor.redistribute", dtensor)):
            med, spread = measure(fn, sweep, ctx)
            rec.add(
                {
                    "kind": "collective_dispatch",
                    "op": "all_reduce",
                    "implementation": how,
                    "nbytes": 16,
                    "time_s": ctx.slowest(med),
                    "spread": spread,
                    "ranks": ctx.world,
                }
            )
            yield


def optimizer_count(sweep: Any) -> int:
    return len(sweep.optimizer_hidden)


def bench_optimizer(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """AdamW (foreach) steps over the tensors of 4 transformer layers of several widths."""
    torch = ctx.torch
    for h in sweep.optimizer_hidden:
        shapes = [(3 * h, h), (3 * h,), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,)]
        shapes += [(h,)] * 4  # two layer norms
        params = [
            torch.nn.Parameter(torch.randn(*s, device=ctx.device) * 0.02)
            for _ in range(4)
            for s in shapes
        ]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        med, spread = measure(opt.step, sweep, ctx)
        rec.add(
            {
                "kind": "optimizer",
                "optimizer": "adamw_foreach",
                "params": sum(p.numel() for p in params),
                "tensors": len(params),
                "time_s": ctx.slowest(med),
                "spread": spread,
                "ranks": ctx.world,
            }
        )
        yield
