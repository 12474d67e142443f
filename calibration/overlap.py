"""The overlap stage of `calibrate run`: how much slower compute runs beside a collective.

On every rank at once, for each (GEMM size n, collective bytes) of the sweep:
    C       an all-reduce of `nbytes` alone;
    G       a chain of r n x n x n GEMMs alone, r chosen so that G is about OVERLAP_WINDOW_RATIO x
            C (the collective runs for the whole chain);
    during  the same chain with the all-reduce beside it: the all-reduce issued asynchronously
            (async_op=True; on CUDA on a side stream, as a framework issues its hidden
            collectives), then the GEMMs, timed from the issue to the GEMMs' end (perf_counter on
            CPU, where the GEMMs run synchronously; CUDA events on the GEMMs' stream), then the
            work handle waited on (`both`: from the issue to the end of the wait);
each the median over the sweep's repeats (a barrier before each), the slowest rank's. The
definition of HardwareSpec.overlap_compute_slowdown, k: compute beside a collective takes 1 + k
as long; so per point
    k = during / G - 1                                                                    [-]
(0 where the noise makes it negative), and the profile's k is the median over the points. A point
whose chain alone outlasts the collective alone (G > C: part of the chain ran without it, which
would read too little slowdown) is measured again with a chain half as long, down to one GEMM,
and dropped with a note if it still does. On gloo (CPU ranks) the collective runs on
gloo's threads beside the GEMM's on the same cores; on NCCL its kernels share the SMs, the memory
bandwidth and the power with the GEMMs'.
torch is imported only inside the functions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from calibration.measure import measure
from perfmodel.errors import DataError
from perfmodel.specs.hardware import BOUNDS

# (GEMM size n, all-reduce bytes): GEMMs of ~0.1-10 ms, collectives of a few of them
OVERLAP_POINTS_CPU = ((128, 1 << 21), (192, 1 << 22))
OVERLAP_POINTS_GPU = ((4096, 1 << 27), (8192, 1 << 28))
OVERLAP_WINDOW_RATIO = 0.5  # the GEMM chain's time alone over the collective's
MAX_CHAIN = 256  # GEMMs in one chain at most
_MAX_SLOWDOWN = BOUNDS["overlap_compute_slowdown"].maximum


def overlap_points(device: str) -> tuple[tuple[int, int], ...]:
    return OVERLAP_POINTS_GPU if device == "cuda" else OVERLAP_POINTS_CPU


def overlap_count(sweep: Any) -> int:
    return len(sweep.overlap_points)


def bench_overlap(ctx: Any, sweep: Any, rec: Any) -> Iterator[None]:
    """For each point: the all-reduce alone, the GEMM chain alone, the chain beside the
    all-reduce (see the module doc)."""
    torch, dist = ctx.torch, ctx.dist
    cuda = ctx.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    for n, nbytes in sweep.overlap_points:
        a = torch.randn(n, n, device=ctx.device, dtype=dtype)
        b = torch.randn(n, n, device=ctx.device, dtype=dtype)
        out = torch.empty(n, n, device=ctx.device, dtype=dtype)
        x = torch.ones(max(1, nbytes // 4), device=ctx.device)

        def collective(x: Any = x) -> None:
            dist.all_reduce(x)

        def gemm(a: Any = a, b: Any = b, out: Any = out) -> None:
            torch.mm(a, b, out=out)

        t_coll = ctx.slowest(measure(collective, sweep, ctx)[0])
        t_one = ctx.slowest(measure(gemm, sweep, ctx)[0])
        chain = max(1, min(MAX_CHAIN, math.floor(OVERLAP_WINDOW_RATIO * t_coll / t_one)))
        while True:
            def gemms(chain: int = chain, gemm: Any = gemm) -> None:
                for _ in range(chain):
                    gemm()

            alone, during, both, spread = _alternating(ctx, sweep, x, gemms)
            # a chain that outlasted the collective (a loaded machine slowed it past the single
            # GEMM's estimate) is measured again at half its length, so that the point is kept;
            # every rank takes the same branch (slowest: the maximum over the ranks)
            if chain == 1 or ctx.slowest(alone) <= t_coll:
                break
            chain //= 2
        rec.add({"kind": "overlap", "op": "all_reduce", "n": n, "chain": chain,
                 "nbytes": int(x.numel() * 4), "ranks": ctx.world,
                 "collective_s": t_coll, "gemm_s": ctx.slowest(alone),
                 "during_s": ctx.slowest(during), "both_s": ctx.slowest(both),
                 "time_s": ctx.slowest(during), "spread": spread})
        yield


def _alternating(ctx: Any, sweep: Any, x: Any, gemms: Any) -> tuple[float, float, float, float]:
    """The medians over the sweep's repeats of: gemms() alone; from issuing an async all-reduce
    of x to the end of gemms(); to the end of its wait [s]; and the spread (p90 - p10) / median
    of the second. Alone and beside alternate within each repeat (a barrier before each), so
    that a machine's drifting load weighs on both alike."""
    torch, dist = ctx.torch, ctx.dist
    cuda = ctx.device.type == "cuda"
    side = torch.cuda.Stream(device=ctx.device) if cuda else None

    def alone() -> float:
        if side is None:
            t0 = ctx.now()
            gemms()
            return ctx.now() - t0
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        gemms()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    def beside() -> tuple[float, float]:
        if side is None:
            t0 = ctx.now()
            work = dist.all_reduce(x, async_op=True)
            gemms()
            t1 = ctx.now()
            work.wait()
            return t1 - t0, ctx.now() - t0
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        side.wait_stream(torch.cuda.current_stream(ctx.device))
        with torch.cuda.stream(side):
            work = dist.all_reduce(x, async_op=True)
        gemms()
        mid.record()
        work.wait()  # the current stream waits for the collective
        end.record()
        end.synchronize()
        return float(start.elapsed_time(mid)) / 1e3, float(start.elapsed_time(end)) / 1e3

    for _ in range(sweep.warmup):
        alone()
        beside()
    solo, during, both = [], [], []
    for _ in range(sweep.repeats):
        dist.barrier()
        solo.append(alone())
        dist.barrier()
        t, t_both = beside()
        during.append(t)
        both.append(t_both)
    during.sort()
    mid = statistics.median(during)
    p10, p90 = during[int(0.1 * (len(during) - 1))], during[math.ceil(0.9 * (len(during) - 1))]
    return (statistics.median(solo), mid, statistics.median(both),
            (p90 - p10) / mid if mid > 0 else 0.0)


class OverlapModel:
    """k = during / G - 1, the median over the overlap stage's records (see the module doc);
    fitted value overlap_compute_slowdown_."""

    def fit(self, records: pd.DataFrame) -> OverlapModel:
        rows = records[(records["gemm_s"] > 0) & (records["during_s"] > 0)]
        if rows.empty:
            raise DataError("overlap stage: no measurement to fit")
        covered = (rows["gemm_s"] <= rows["collective_s"]).to_numpy()
        self.dropped_ = int((~covered).sum())
        if not covered.any():
            raise DataError("overlap stage: every GEMM chain outlasted its collective (the "
                            "chain ran partly alone): nothing to fit")
        rows = rows[covered]
        k = np.clip(rows["during_s"].to_numpy(float) / rows["gemm_s"].to_numpy(float) - 1,
                    0.0, None)
        self.per_point_ = [float(v) for v in k]
        slowdown = float(np.median(k))
        self.clipped_ = slowdown > _MAX_SLOWDOWN
        self.overlap_compute_slowdown_ = min(slowdown, _MAX_SLOWDOWN)
        self.measured_slowdown_ = slowdown
        self.n_points_ = len(rows)
        return self

    def summary(self) -> dict[str, Any]:
        return {"kind": "overlap",
                "params": {"overlap_compute_slowdown": self.overlap_compute_slowdown_},
                "per_point": self.per_point_, "measured": self.measured_slowdown_,
                "dropped": self.dropped_, "n_points": self.n_points_,
                "note": "a GEMM chain alone (G) and beside an async all-reduce that outlasts it "
                        "(during: from the issue to the GEMMs' end): k = during / G - 1, the "
                        "median over the points"}
