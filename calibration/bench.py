"""Microbenchmarks under torch.distributed: GEMM, memory bandwidth and collectives.

The same code runs on CUDA + NCCL and on CPU + gloo; only the device and backend differ. Every
measurement (calibration.measure): warm-up, then `repeats` timed repetitions (each of `inner`
calls, chosen so one repetition lasts long enough for the timer), a barrier before each, CUDA
events on GPU and perf_counter on CPU. A record holds the median over repetitions (for
collectives the slowest rank's median, as a job waits for it) and the spread (p90 - p10) / median.
Compute benchmarks run on every rank at once, so shared cores and memory bandwidth are measured
as a job sees them. torch is imported only here, inside the functions.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calibration.framework import (
    CHAIN_LENGTHS,
    EVICT_MAX_BYTES,
    OPTIMIZER_HIDDEN,
    OPTIMIZER_HIDDEN_GPU,
    bench_collective_dispatch,
    bench_kernel_chains,
    bench_optimizer,
    chain_count,
    dispatch_count,
    optimizer_count,
)
from calibration.host import HOST_BLOCKS, bench_host, host_count
from calibration.layers import LayerSize, bench_layers, layer_count, layer_sizes
from calibration.measure import (
    Context,
    Recorder,
    cpu_last_level_cache_bytes,
    make_timer,
    measure,
)
from calibration.overlap import bench_overlap, overlap_count, overlap_points

# the stages of `calibrate run`, in the order they run
STAGES = ("gemm", "memory", "collectives", "framework", "host", "overlap", "layers")


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What to measure; `quick` trims sizes and repeats to stay within ~2 minutes on 2 cores."""

    gemm_shapes: tuple[tuple[int, int, int, int], ...]  # (b, m, n, k)
    memory_bytes: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    ops: tuple[str, ...] = (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "send_recv",
    )
    stages: tuple[str, ...] = STAGES
    repeats: int = 7
    warmup: int = 2
    min_rep_s: float = 2e-3  # one repetition lasts at least this long (several inner calls)
    subgroups: bool = True
    chain_lengths: tuple[int, ...] = CHAIN_LENGTHS  # framework stage: ops per kernel chain
    optimizer_hidden: tuple[int, ...] = OPTIMIZER_HIDDEN  # framework stage: optimizer sizes
    # framework stage: the most bytes a rank writes to push the optimizer's states out of the
    # last-level cache before each timed step (calibration.framework.bench_optimizer)
    evict_max_bytes: int = EVICT_MAX_BYTES
    host_blocks: tuple[int, ...] = HOST_BLOCKS  # host stage: tiny blocks per step
    layer_sizes: tuple[LayerSize, ...] = ()  # layers stage: widths and token counts
    # overlap stage: (GEMM size, all-reduce bytes) run alone and at once
    overlap_points: tuple[tuple[int, int], ...] = ()
    # gemm stage on a GPU: (sequence length, head dim) of the causal flash attention timed
    attention_points: tuple[tuple[int, int], ...] = ()
    # gemm stage: seconds the sweep's largest square GEMM runs back to back (0: not measured)
    sustained_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def sweep_for(
    device: str, quick: bool, max_bytes: int | None = None, stages: tuple[str, ...] | None = None
) -> Sweep:
    """Sizes: bytes to hundreds of MB on GPU, to tens of MB on CPU (fewer with quick)."""
    gpu = device == "cuda"
    square = [64, 128, 256, 512, 1024] + ([2048, 4096, 8192] if gpu else [])
    if quick:
        square = square[:4] if not gpu else [256, 1024, 4096, 8192]
    hidden = 4096 if gpu else 512
    tokens = [hidden // 4, hidden] if quick else [hidden // 8, hidden // 2, hidden * 2]
    shapes = [(1, s, s, s) for s in square]
    for t in tokens:  # a transformer layer: QKV, attention output, MLP up and down
        shapes += [
            (1, t, 3 * hidden, hidden),
            (1, t, hidden, hidden),
            (1, t, 4 * hidden, hidden),
            (1, t, hidden, 4 * hidden),
        ]
    skinny = [
        (1, 16, hidden, hidden),
        (1, hidden, 16, hidden),
        (1, hidden, hidden, 16),
        (4, hidden // 4, hidden // 4, hidden // 4),
    ]
    shapes += skinny[:2] if quick else skinny
    top = max_bytes or ((1 << 28) if gpu else (1 << 23 if quick else 1 << 25))
    coll = [1 << p for p in range(3, 40, 2 if quick else 1) if (1 << p) <= top]
    mem_top = (1 << 30) if gpu else (1 << 26 if quick else 1 << 27)
    if max_bytes is not None:  # tests: a tiny sweep
        mem_top = max(1 << 21, max_bytes)
        shapes = [s for s in shapes if s[0] * s[1] * s[2] * s[3] <= 1 << 27]
    mem = [1 << p for p in range(15, 40, 2 if quick else 1) if (1 << p) <= mem_top]
    tiny = max_bytes is not None  # tests: two chain lengths, two optimizer sizes, small layers
    sizes = layer_sizes(device, quick)
    if tiny:
        sizes = tuple(s for s in sizes if s.hidden == sizes[0].hidden)[:2]
    return Sweep(
        layer_sizes=sizes,
        chain_lengths=(4, 16) if tiny else CHAIN_LENGTHS,
        optimizer_hidden=(64, 128) if tiny else OPTIMIZER_HIDDEN_GPU if gpu else OPTIMIZER_HIDDEN,
        evict_max_bytes=(1 << 22) if tiny else EVICT_MAX_BYTES,
        gemm_shapes=tuple(shapes),
        memory_bytes=tuple(mem),
        collective_bytes=tuple(coll),
        repeats=5 if quick else 9,
        warmup=1 if quick else 2,
        min_rep_s=5e-3 if quick else 1e-2,
        subgroups=True,
        stages=stages or STAGES,
        overlap_points=overlap_points(device)[:1] if tiny else overlap_points(device),
        attention_points=attention_points(device, quick),
        sustained_s=sustained_seconds(device, quick, tiny),
    )


# a GPU settles at its power cap within a few seconds of back-to-back GEMMs (NVIDIA CUTLASS's
# measurement guidelines: "the GPC clocks were observed to oscillate for around the first 3
# seconds of runtime before settling"): a sustained point shorter than SETTLE_S measures no cap
# (calibration.run writes none from it). The point runs 10 s (quick: 6 s) and keeps the last
# half. A CPU has no such cap to reach: a short run, for the record.
SETTLE_S = 3.0
SUSTAINED_S = {"cuda": (10.0, 6.0), "cpu": (1.0, 0.5)}
SUSTAINED_CHUNK_S = 0.05  # one timed chunk of back-to-back GEMMs


def sustained_seconds(device: str, quick: bool, tiny: bool = False) -> float:
    """How long the gemm stage's sustained point runs on this device."""
    full, short = SUSTAINED_S["cuda" if device == "cuda" else "cpu"]
    return min(short, 0.2) if tiny else (short if quick else full)


# the flash-attention benchmark's shape (FlashAttention-2's and -3's papers): 16k tokens a batch,
# hidden 2048 (heads = 2048 / head dim), bf16, causal
ATTENTION_TOKENS, ATTENTION_HIDDEN = 16384, 2048


def attention_points(device: str, quick: bool) -> tuple[tuple[int, int], ...]:
    """(sequence length, head dim) of the causal attention the gemm stage times on a GPU (none
    on a CPU: no flash kernel there)."""
    if device != "cuda":
        return ()
    seqs = (1024, 4096, 16384) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    dims = (128,) if quick else (64, 128)
    return tuple((s, d) for d in dims for s in seqs)


def sweep_to_dict(sweep: Sweep) -> dict[str, Any]:
    """The sweep as JSON data, for the ranks' config (sweep_from_dict reads it back)."""
    return asdict(sweep)


def sweep_from_dict(data: dict[str, Any]) -> Sweep:
    """The Sweep sweep_to_dict wrote (JSON lists back into tuples)."""
    fields = dict(data)
    fields["gemm_shapes"] = tuple(tuple(shape) for shape in fields["gemm_shapes"])
    fields["layer_sizes"] = tuple(LayerSize(**size) for size in fields["layer_sizes"])
    fields["overlap_points"] = tuple(tuple(point) for point in fields["overlap_points"])
    fields["attention_points"] = tuple(tuple(point)
                                       for point in fields.get("attention_points", ()))
    for name in ("memory_bytes", "collective_bytes", "ops", "stages", "chain_lengths",
                 "optimizer_hidden", "host_blocks"):
        fields[name] = tuple(fields[name])
    return Sweep(**fields)


def bench_gemm(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    torch = ctx.torch
    dtypes = ["fp32"] if ctx.device.type == "cpu" else ["bf16", "fp32"]
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for dtype in dtypes:
        for b, m, n, k in sweep.gemm_shapes:
            a = torch.randn(b, m, k, device=ctx.device, dtype=tdt[dtype])
            w = torch.randn(b, k, n, device=ctx.device, dtype=tdt[dtype])
            med, spread = measure(functools.partial(torch.bmm, a, w), sweep, ctx)
            rec.add(
                {
                    "kind": "gemm",
                    "dtype": dtype,
                    "b": b,
                    "m": m,
                    "n": n,
                    "k": k,
                    "time_s": ctx.slowest(med),
                    "spread": spread,
                    "ranks": ctx.world,
                }
            )
            yield
    yield from bench_gemm_sustained(ctx, sweep, rec)
    if ctx.device.type == "cuda":
        yield from bench_attention(ctx, sweep, rec)
    if ctx.device.type == "cpu":  # bf16 matmul on CPU is 60-200x slower: one point to show it
        s = 128
        a = torch.randn(s, s, dtype=torch.bfloat16)
        med, spread = measure(lambda: a @ a, sweep, ctx)
        rec.add(
            {
                "kind": "gemm",
                "dtype": "bf16",
                "b": 1,
                "m": s,
                "n": s,
                "k": s,
                "time_s": ctx.slowest(med),
                "spread": spread,
                "ranks": ctx.world,
                "note": "bf16 on CPU: one point only",
            }
        )
        yield


def sustained_shape(sweep: Sweep) -> tuple[int, int, int, int] | None:
    """The GEMM the sustained point runs: the sweep's largest square one."""
    squares = [s for s in sweep.gemm_shapes if s[0] == 1 and s[1] == s[2] == s[3]]
    return max(squares, key=lambda s: s[1]) if squares and sweep.sustained_s > 0 else None


def bench_gemm_sustained(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    """The gemm stage's sustained point: the sweep's largest square GEMM (bf16 on a GPU, fp32
    on a CPU) back to back on every rank for `sustained_s` seconds, timed in chunks of about
    SUSTAINED_CHUNK_S (each synchronised at its end); the median of the chunks of the last half
    is the time it sustains once the device settles (a GPU at its power cap). The sweep times
    each shape for milliseconds between barriers; the profile's sustained_clock_fraction is the
    sweep's time of this shape over this one (calibration.run._fit_gemm_sustained)."""
    shape = sustained_shape(sweep)
    if shape is None:
        return
    torch = ctx.torch
    b, m, n, k = shape
    cuda = ctx.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(b, m, k, device=ctx.device, dtype=dtype)
    w = torch.randn(b, k, n, device=ctx.device, dtype=dtype)
    fn = functools.partial(torch.bmm, a, w)
    fn()
    ctx.sync()
    inner = max(1, math.ceil(SUSTAINED_CHUNK_S / max(ctx.timer(fn, 1), 1e-9)))
    chunks: list[float] = []
    start = ctx.now()
    while not chunks or ctx.now() - start < sweep.sustained_s:
        chunks.append(ctx.timer(fn, inner))
    duration = ctx.now() - start
    settled = statistics.median(chunks[len(chunks) // 2:])
    rec.add({"kind": "gemm_sustained", "dtype": "bf16" if cuda else "fp32", "b": b, "m": m,
             "n": n, "k": k, "time_s": ctx.slowest(settled), "duration_s": duration,
             "chunks": len(chunks), "ranks": ctx.world})
    yield


def bench_attention(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    """Causal flash attention as PyTorch's scaled_dot_product_attention runs it here (the kernel
    its backends pick), bf16, at the attention points: the forward alone, and forward and
    backward (the backward is their difference)."""
    torch = ctx.torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for seq, head_dim in sweep.attention_points:
        batch, heads = max(1, ATTENTION_TOKENS // seq), max(1, ATTENTION_HIDDEN // head_dim)
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device=ctx.device,
                               dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(batch, heads, seq, head_dim, device=ctx.device, dtype=torch.bfloat16)

        def forward(q: Any = q, k: Any = k, v: Any = v) -> None:
            with torch.no_grad():
                sdpa(q, k, v, is_causal=True)

        def both(q: Any = q, k: Any = k, v: Any = v, grad: Any = grad) -> None:
            sdpa(q, k, v, is_causal=True).backward(grad)

        fwd, spread = measure(forward, sweep, ctx)
        total, spread_both = measure(both, sweep, ctx)
        fwd, total = ctx.slowest(fwd), ctx.slowest(total)
        rec.add({"kind": "attention", "dtype": "bf16", "seq": seq, "head_dim": head_dim,
                 "batch": batch, "heads": heads, "forward_s": fwd,
                 "backward_s": max(total - fwd, 0.0), "spread": max(spread, spread_both),
                 "ranks": ctx.world})
        yield


def bench_memory(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    torch = ctx.torch
    for nbytes in sweep.memory_bytes:
        n = max(1, nbytes // 4)
        x, y, z = (torch.rand(n, device=ctx.device) for _ in range(3))
        kernels = {
            "copy": (functools.partial(y.copy_, x), 2 * 4 * n),  # read x, write y
            "triad": (functools.partial(torch.add, y, z, alpha=0.5, out=x), 3 * 4 * n),
        }
        for kernel, (fn, moved) in kernels.items():
            med, spread = measure(fn, sweep, ctx)
            rec.add(
                {
                    "kind": "memory",
                    "kernel": kernel,
                    "nbytes": moved,
                    "time_s": ctx.slowest(med),
                    "spread": spread,
                    "ranks": ctx.world,
                }
            )
            yield
    if ctx.device.type == "cuda":
        yield from bench_host_link(ctx, sweep, rec)
    # per-kernel launch overhead: the smallest op the framework runs
    one = torch.zeros(1, device=ctx.device)
    med, spread = measure(lambda: one.add_(1), sweep, ctx)
    rec.add({"kind": "overhead", "time_s": ctx.slowest(med), "spread": spread})
    yield


def host_link_sizes(sweep: Sweep) -> tuple[int, ...]:
    """The copies between a GPU and pinned host memory that the host link stage times: the
    memory stage's two largest sizes."""
    return tuple(sorted(sweep.memory_bytes)[-2:])


def bench_host_link(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    """The GPU's link to host memory, each direction, every local rank copying at once (as
    activation offloading copies: GPUs that share a host's memory, GB200's two per Grace, share
    its bandwidth): GPU -> pinned host (d2h) and back (h2d), on the compute stream."""
    torch = ctx.torch
    for nbytes in host_link_sizes(sweep):
        n = max(1, nbytes // 4)
        gpu = torch.rand(n, device=ctx.device)
        host = torch.empty(n, pin_memory=True)
        for direction, fn in (("d2h", functools.partial(host.copy_, gpu, non_blocking=True)),
                              ("h2d", functools.partial(gpu.copy_, host, non_blocking=True))):
            med, spread = measure(fn, sweep, ctx)
            rec.add({"kind": "host_link", "direction": direction, "nbytes": 4 * n,
                     "time_s": ctx.slowest(med), "spread": spread, "ranks": ctx.world})
            yield


def groups_for(world: int, local_world: int) -> list[tuple[str, str, list[list[int]]]]:
    """(label, scope, partition of ranks into groups) for the world and a plan's sub-groups.

    Rows and columns of a 2 x world/2 grid, the three axes of a 2 x 2 x world/4 grid, and with
    several nodes the intra-node and inter-node groups. A family is 'intra' when each of its
    groups lies inside one node, else 'inter'.
    """
    nodes = max(1, world // local_world)
    families: list[tuple[str, list[list[int]]]] = [("world", [list(range(world))])]
    if nodes > 1:
        per = local_world
        families.append(("intra-node", [list(range(i * per, (i + 1) * per)) for i in range(nodes)]))
        families.append(("inter-node", [list(range(j, world, per)) for j in range(per)]))
    if world >= 4 and world % 2 == 0:
        cols = world // 2
        families.append(("grid2d-rows", [list(range(r * cols, (r + 1) * cols)) for r in range(2)]))
        families.append(("grid2d-cols", [list(range(c, world, cols)) for c in range(cols)]))
    if world >= 8 and world % 8 == 0:
        for axis, stride in enumerate((1, 2, 4)):
            parts = [[b, b + stride] for b in range(world) if (b // stride) % 2 == 0]
            families.append((f"grid3d-axis{axis}", parts))

    def scope(parts: list[list[int]]) -> str:
        one_node = all(len({r // local_world for r in part}) == 1 for part in parts)
        return "intra" if one_node else "inter"

    return [(label, scope(parts), parts) for label, parts in families]


def _collective(
    ctx: Context, op: str, nbytes: int, group: Any, n: int, rank_in_group: int, peers: list[int]
) -> tuple[Callable[[], None], str]:
    """A callable doing one collective of nccl-tests size nbytes, and how ('native' or the
    composition used when the backend lacks the op)."""
    torch, dist = ctx.torch, ctx.dist
    count = max(n, nbytes // 4 // n * n)  # float32 elements, divisible by n
    x = torch.ones(count, device=ctx.device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group), "native"
    if op == "broadcast":
        return lambda: dist.broadcast(x, src=peers[0], group=group), "native"
    if op == "reduce":
        return lambda: dist.reduce(x, dst=peers[0], group=group), "native"
    if op == "all_gather":  # nbytes = gathered output
        part, out = x[: count // n].clone(), torch.empty(count, device=ctx.device)
        return lambda: dist.all_gather_into_tensor(out, part, group=group), "native"
    if op == "reduce_scatter":  # nbytes = full input
        out = torch.empty(count // n, device=ctx.device)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group), "native"
    if op == "all_to_all":  # nbytes = one rank's send buffer
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group), "native"
    if op == "send_recv":  # ring: send to the next rank of the group, receive from the previous
        out = torch.empty_like(x)
        nxt, prv = peers[(rank_in_group + 1) % n], peers[(rank_in_group - 1) % n]

        def sendrecv() -> None:
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, x, nxt, group=group),
                    dist.P2POp(dist.irecv, out, prv, group=group),
                ]
            )
            for r in reqs:
                r.wait()

        return sendrecv, "native"
    raise ValueError(op)


def _fallback(
    ctx: Context, op: str, nbytes: int, group: Any, n: int, rank_in_group: int, peers: list[int]
) -> tuple[Callable[[], None], str]:
    """What a job does when the backend lacks a collective."""
    torch, dist = ctx.torch, ctx.dist
    count = max(n, nbytes // 4 // n * n)
    x = torch.ones(count, device=ctx.device)
    if op == "reduce_scatter":
        return (lambda: dist.all_reduce(x, group=group)), "fallback: all_reduce, keep own shard"
    if op == "all_gather":
        parts = [torch.empty(count // n, device=ctx.device) for _ in range(n)]
        return (
            lambda: dist.all_gather(parts, x[: count // n].clone(), group=group),
            "fallback: all_gather of a tensor list",
        )
    if op == "all_to_all":
        out = torch.empty_like(x)
        chunk = count // n

        def pairwise() -> None:
            ops = []
            for i, peer in enumerate(peers):
                if peer != peers[rank_in_group]:
                    ops += [
                        dist.P2POp(dist.isend, x[i * chunk : (i + 1) * chunk], peer, group=group),
                        dist.P2POp(dist.irecv, out[i * chunk : (i + 1) * chunk], peer, group=group),
                    ]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

        return pairwise, "fallback: pairwise send/recv"
    if op == "reduce":
        return (lambda: dist.all_reduce(x, group=group)), "fallback: all_reduce"
    raise NotImplementedError(op)


def bench_collectives(
    ctx: Context, sweep: Sweep, rec: Recorder, support: dict[str, str]
) -> Iterator[None]:
    dist = ctx.dist
    partitions = groups_for(ctx.world, ctx.local_world)
    if not sweep.subgroups:
        partitions = partitions[:1]
    for label, scope, parts in partitions:
        handles = []
        for members in parts:  # every rank creates every group, in the same order
            handles.append(None if label == "world" else dist.new_group(members))
        mine = next(i for i, members in enumerate(parts) if ctx.rank in members)
        members, group = parts[mine], handles[mine]
        n = len(members)
        if n < 2:
            continue
        for op in sweep.ops:
            for nbytes in sweep.collective_bytes:
                if nbytes < 4 * n:
                    continue
                try:
                    fn, how = _collective(
                        ctx, op, nbytes, group, n, members.index(ctx.rank), members
                    )
                    med, spread = measure(fn, sweep, ctx, group)
                except (RuntimeError, NotImplementedError):
                    fn, how = _fallback(ctx, op, nbytes, group, n, members.index(ctx.rank), members)
                    med, spread = measure(fn, sweep, ctx, group)
                support.setdefault(op, how)
                slowest = ctx.slowest(med)  # over all concurrent groups
                rec.add(
                    {
                        "kind": "collective",
                        "op": op,
                        "group": label,
                        "scope": scope,
                        "ranks": n,
                        "groups": len(parts),
                        "nbytes": max(4 * n, nbytes // 4 // n * n * 4),
                        "time_s": slowest,
                        "spread": spread,
                        "implementation": how,
                    }
                )
                yield


def count_measurements(sweep: Sweep, world: int, local_world: int, device: str) -> int:
    total = 0
    if "gemm" in sweep.stages:
        total += len(sweep.gemm_shapes) * (1 if device == "cpu" else 2) + (device == "cpu")
        total += sustained_shape(sweep) is not None
        total += len(sweep.attention_points) if device == "cuda" else 0
    if "memory" in sweep.stages:
        total += 2 * len(sweep.memory_bytes) + 1
        total += 2 * len(host_link_sizes(sweep)) if device == "cuda" else 0
    if "collectives" in sweep.stages:
        parts = groups_for(world, local_world)[: None if sweep.subgroups else 1]
        for _, _, groups in parts:
            n = len(groups[0])
            if n >= 2:
                total += len(sweep.ops) * sum(1 for b in sweep.collective_bytes if b >= 4 * n)
    if "framework" in sweep.stages:
        total += chain_count(sweep, world) + dispatch_count(world) + optimizer_count(sweep)
    if "host" in sweep.stages:
        total += host_count(sweep)
    if "overlap" in sweep.stages:
        total += overlap_count(sweep)
    if "layers" in sweep.stages:
        total += layer_count(sweep, world, local_world)
    return total


def run_worker(
    rank: int,
    world: int,
    local_rank: int,
    local_world: int,
    backend: str,
    sweep: Sweep,
    records_path: Path | None,
    *,
    launched: bool = False,
    on_record: Callable[[dict[str, Any], int, int | None], None] | None = None,
) -> None:
    """One rank: init the process group, run the stages, write records (rank 0).

    launched: started by `calibrate run` through workload.launcher (main), which handles Ctrl-C
    and which the rank must not outlive; else a rank of torchrun or srun (env:// rendezvous).
    """
    import datetime
    import signal
    import warnings

    import torch
    import torch.distributed as dist

    from workload.process import keep_freed_memory, loopback_rendezvous, watch_parent

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch")

    if launched:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        watch_parent()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        keep_freed_memory()  # the job's allocator settings, measured alike
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    # launched here: a store bound to loopback (TCPStore's default timeout)
    store = loopback_rendezvous(rank, world, datetime.timedelta(seconds=300)) if launched else {}
    if store:
        dist.init_process_group(backend, **store)
    else:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    ctx = Context(
        torch=torch,
        dist=dist,
        device=device,
        rank=rank,
        world=world,
        local_world=local_world,
        timer=make_timer(torch, device),
    )
    rec = Recorder(records_path, rank, on_record)
    rec.plan(count_measurements(sweep, world, local_world, device.type))
    rec._write({"kind": "info", **_info(torch, dist, device, backend, world, local_world)})
    support: dict[str, str] = {}
    stages = {
        "gemm": lambda: bench_gemm(ctx, sweep, rec),
        "memory": lambda: bench_memory(ctx, sweep, rec),
        "collectives": lambda: bench_collectives(ctx, sweep, rec, support),
        "framework": lambda: _framework(ctx, sweep, rec),
        "host": lambda: bench_host(ctx, sweep, rec),
        "overlap": lambda: bench_overlap(ctx, sweep, rec),
        "layers": lambda: bench_layers(ctx, sweep, rec),
    }
    for stage in sweep.stages:
        for _ in stages[stage]():
            pass
        rec._write({"kind": "stage_done", "stage": stage})  # a profile cut short names the rest
    rec._write({"kind": "support", "ops": support})
    rec._write({"kind": "done"})
    dist.barrier()
    dist.destroy_process_group()


def _framework(ctx: Context, sweep: Sweep, rec: Recorder) -> Iterator[None]:
    """Fixed costs per kernel and per collective call, the optimizer step (see framework.py)."""
    yield from bench_kernel_chains(ctx, sweep, rec)
    yield from bench_collective_dispatch(ctx, sweep, rec)
    yield from bench_optimizer(ctx, sweep, rec)


def _info(
    torch: Any, dist: Any, device: Any, backend: str, world: int, local_world: int
) -> dict[str, Any]:
    import platform

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        memory = torch.cuda.get_device_properties(device).total_memory
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                name = next((ln.split(":", 1)[1].strip() for ln in fh if "model name" in ln), name)
        except OSError:
            pass
        name = f"CPU {name} ({os.cpu_count()} cores)"
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // local_world
        nccl = None
    return {
        "device": name,
        "device_type": device.type,
        "memory_bytes": int(memory),
        "last_level_cache_bytes": cpu_last_level_cache_bytes() if device.type == "cpu" else None,
        "torch_version": torch.__version__,
        "nccl_version": nccl,
        "gloo": backend == "gloo",
        "backend": backend,
        "world": world,
        "local_world": local_world,
        "nodes": max(1, world // local_world),
        "threads_per_rank": torch.get_num_threads(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    """A rank of `calibrate run` (calibration.run through workload.launcher):
    python -m calibration.bench CONFIG.json, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT set. CONFIG: the backend, the sweep (sweep_to_dict) and the
    records file rank 0 appends to."""
    import sys

    from perfmodel.errors import DataError
    from perfmodel.files import read_text_bounded

    argv = sys.argv[1:] if argv is None else argv
    config = json.loads(read_text_bounded(argv[0], "calibration ranks' config", error=DataError))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    run_worker(rank, world, int(os.environ.get("LOCAL_RANK", rank)),
               int(os.environ.get("LOCAL_WORLD_SIZE", world)), config["backend"],
               sweep_from_dict(config["sweep"]), Path(config["records"]) if rank == 0 else None,
               launched=True)
    # As the job does (workload.job.main): leave without the interpreter's teardown, which gloo's
    # threads can abort after everything is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
