"""How every microbenchmark is timed and recorded, on every rank (calibration.bench, .framework,
.layers): warm-up, then `repeats` timed repetitions (each of `inner` calls, chosen so that one
repetition lasts long enough for the timer), a barrier before each, CUDA events on GPU and
perf_counter on CPU; rank 0 appends each record to a JSON-lines file as it is measured.
torch comes in through the Context (this module does not import it).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Context:
    torch: Any
    dist: Any
    device: Any
    rank: int
    world: int
    local_world: int
    timer: Callable[[Callable[[], None], int], float]

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    @staticmethod
    def now() -> float:
        """Wall clock [s]; call sync() first on a GPU."""
        return time.perf_counter()

    def slowest(self, value: float, group: Any = None) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=group)
        return float(t.item())


def make_timer(torch: Any, device: Any) -> Callable[[Callable[[], None], int], float]:
    if device.type == "cuda":

        def run(fn: Callable[[], None], inner: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
    else:

        def run(fn: Callable[[], None], inner: int) -> float:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            return (time.perf_counter() - t0) / inner

    return run


def measure(
    fn: Callable[[], None], sweep: Any, ctx: Context, group: Any = None
) -> tuple[float, float]:
    """(median seconds per call over repeats, spread) on this rank; sweep: a
    calibration.bench.Sweep (its warmup, repeats and min_rep_s)."""
    dist = ctx.dist
    for _ in range(sweep.warmup):
        fn()
    ctx.sync()
    t_one = ctx.timer(fn, 1)
    inner = max(1, min(64, math.ceil(sweep.min_rep_s / max(t_one, 1e-9))))
    if group is not None or ctx.world > 1:  # every rank of the group agrees on inner
        t = ctx.torch.tensor([inner], dtype=ctx.torch.int64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        inner = int(t.item())
    times = []
    for _ in range(sweep.repeats):
        dist.barrier(group=group) if group is not None else dist.barrier()
        times.append(ctx.timer(fn, inner))
    return _median_spread(times)


def _median_spread(times: list[float]) -> tuple[float, float]:
    """(median, (p90 - p10) / median) of the repetitions' times."""
    times = sorted(times)
    med = statistics.median(times)
    p10, p90 = times[int(0.1 * (len(times) - 1))], times[math.ceil(0.9 * (len(times) - 1))]
    return med, (p90 - p10) / med if med > 0 else 0.0


def measure_cold(
    fn: Callable[[], None], evict: Callable[[], None], sweep: Any, ctx: Context
) -> tuple[float, float]:
    """measure() of a call that a job makes once between passes over other data (the optimizer
    step, after forward and backward): before each timed call evict() pushes its operands out of
    the cache (not timed), then one call per repetition. Timed back to back, the call finds its
    operands in the cache it left them in."""
    for _ in range(sweep.warmup):
        fn()
    times = []
    for _ in range(sweep.repeats):
        evict()
        ctx.sync()
        ctx.dist.barrier()
        times.append(ctx.timer(fn, 1))
    return _median_spread(times)


def cpu_last_level_cache_bytes() -> int | None:
    """Size of the CPU's last-level cache (Linux sysfs), or None."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in sorted(base.glob("index*")):
        try:
            text = (index / "size").read_text().strip()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):  # unreadable, or a size that is not a number
            continue
    return max(sizes) if sizes else None


def last_level_cache_bytes(ctx: Context) -> int | None:
    """The device's last-level cache: the GPU's L2, the CPU's largest cache; None if unknown."""
    if ctx.device.type == "cuda":
        size = getattr(ctx.torch.cuda.get_device_properties(ctx.device), "L2_cache_size", 0)
        return int(size) or None
    return cpu_last_level_cache_bytes()


class Recorder:
    """Rank 0 appends one JSON line per measurement and flushes it: Ctrl-C keeps them."""

    def __init__(
        self,
        path: Path | None,
        rank: int,
        on_record: Callable[[dict[str, Any], int, int | None], None] | None = None,
    ) -> None:
        self.path, self.rank, self.on_record = path, rank, on_record
        self.count = 0
        self.total: int | None = None

    def plan(self, total: int) -> None:
        self.total = total
        self._write({"plan": total})

    def add(self, record: dict[str, Any]) -> None:
        self.count += 1
        self._write(record)
        if self.on_record is not None and self.rank == 0:
            self.on_record(record, self.count, self.total)

    def _write(self, obj: dict[str, Any]) -> None:
        if self.rank != 0 or self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(obj) + "\n")
            fh.flush()
