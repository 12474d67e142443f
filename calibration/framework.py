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
- optimizer: `torch.optim.AdamW` steps over tensors shaped like transformer layers, for several
  parameter counts (foreach on a CPU, fused on a GPU: how the validation job runs it,
  workload.settings.adamw_kernels; on a GPU up to 805M parameters, OPTIMIZER_HIDDEN_GPU: an H200's
  steps over 0.2M-7M parameters all took 0.86 ms, launch-bound, and left the bandwidth unfitted,
  2026-12-04); the fit t = c + bytes / bandwidth with perfmodel's own byte count
  per parameter (perfmodel.costs.precision.optimizer_step_bytes_per_param) gives the bandwidth the
  optimizer achieves. Each timed step starts with the last-level cache filled with other data
  (calibration.measure.measure_cold), as a job's step starts after forward and backward: steps
  timed back to back found their states in the cache (a 2-core VM with a 480 MiB L3, 2026-12-02:
  a 3.2M-parameter step 10.3 ms back to back, 12.0 ms after a 256 MB pass; 12.2 and 15.3 ms with
  two processes at once; the validation job's 2-rank dp plans measured their optimizer step
  40% above the back-to-back fit's prediction).
torch is imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from calibration.measure import last_level_cache_bytes, measure, measure_cold
from workload.settings import adamw_kernels, adamw_kind

CHAIN_KINDS = ("linear", "layernorm", "gelu", "add", "softmax")
CHAIN_LENGTHS = (4, 8, 16, 32)
CHAIN_SHAPE = (8, 16)  # tokens x features: roofline time ~1e-8 s per op
OPTIMIZER_HIDDEN = (64, 128, 256, 384)  # tensors of 4 layers (12 h^2 + 13 h parameters each)
OPTIMIZER_HIDDEN_GPU = (256, 1024, 2048, 4096)  # 3.2M to 805M parameters: to bandwidth-bound
EVICT_MAX_BYTES = 1 << 30  # at most this much written per rank to empty the cache


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


def _evictor(ctx: Any, sweep: Any) -> tuple[Callable[[], None], int]:
    """A pass over 1.5x the last-level cache (a CPU's is shared: the ranks on the node write their
    share of it at once; a GPU's L2 is its own), at most sweep.evict_max_bytes a rank (that much
    where the cache is unknown), and its bytes: what leaves the next call's operands out of the
    cache."""
    torch = ctx.torch
    llc = last_level_cache_bytes(ctx)
    sharers = ctx.local_world if ctx.device.type == "cpu" else 1
    nbytes = (int(min(1.5 * llc / sharers, sweep.evict_max_bytes)) if llc
              else sweep.evict_max_bytes)
    buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    return (lambda: buffer.add_(1.0)), buffer.numel() * 4


def bench_optimizer(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """AdamW steps (foreach on a CPU, fused on a GPU) over the tensors of 4 transformer layers
    of several widths, each timed after a pass over other data (module doc)."""
    torch = ctx.torch
    evict, evict_bytes = _evictor(ctx, sweep)
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
        opt = torch.optim.AdamW(params, lr=1e-4, **adamw_kernels(ctx.device.type))  # the job's
        med, spread = measure_cold(opt.step, evict, sweep, ctx)
        rec.add(
            {
                "kind": "optimizer",
                "optimizer": f"adamw_{adamw_kind(ctx.device.type)}",  # adamw_fused, _foreach
                "params": sum(p.numel() for p in params),
                "tensors": len(params),
                "evicted_bytes": evict_bytes,
                "time_s": ctx.slowest(med),
                "spread": spread,
                "ranks": ctx.world,
            }
        )
        del opt, params  # the largest GPU size holds 13 GB of states
        yield
