"""The optimizer step is timed as a job runs it: after other data has filled the cache.

calibration.measure.measure_cold evicts before each timed call and times one call a repetition;
calibration.framework._evictor sizes the pass over the last-level cache (a CPU's shared by the
node's ranks, a GPU's L2 its own), capped by the sweep.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from calibration import framework
from calibration.measure import Context, measure_cold


def _context(events: list[str], device: str = "cpu", local_world: int = 1) -> Context:
    def timer(fn, inner):
        events.append(f"timed x{inner}")
        fn()
        return 1e-3 * len([e for e in events if e == "step"])

    dist = SimpleNamespace(barrier=lambda group=None: events.append("barrier"))
    return Context(torch=None, dist=dist, device=SimpleNamespace(type=device), rank=0,
                   world=local_world, local_world=local_world, timer=timer)


def test_each_timed_step_follows_an_eviction_and_is_one_call():
    events: list[str] = []
    ctx = _context(events)
    sweep = SimpleNamespace(warmup=2, repeats=3)
    med, spread = measure_cold(lambda: events.append("step"), lambda: events.append("evict"),
                               sweep, ctx)
    assert events == ["step", "step"] + ["evict", "barrier", "timed x1", "step"] * 3
    assert med == pytest.approx(4e-3)  # the 2nd of the timed calls' 3, 4, 5 ms
    assert spread == pytest.approx((5e-3 - 3e-3) / 4e-3)


def test_the_eviction_covers_the_cache_its_ranks_share(monkeypatch):
    torch = pytest.importorskip("torch")
    sweep = SimpleNamespace(evict_max_bytes=1 << 30)
    monkeypatch.setattr(framework, "last_level_cache_bytes", lambda ctx: 64 << 20)
    ctx = Context(torch=torch, dist=None, device=torch.device("cpu"), rank=0, world=2,
                  local_world=2, timer=lambda fn, inner: 0.0)
    evict, nbytes = framework._evictor(ctx, sweep)
    assert nbytes == 48 << 20  # 1.5 x 64 MiB over the node's 2 ranks
    evict()
    # capped by the sweep; an unknown cache takes the cap
    assert framework._evictor(ctx, SimpleNamespace(evict_max_bytes=1 << 22))[1] == 1 << 22
    monkeypatch.setattr(framework, "last_level_cache_bytes", lambda ctx: None)
    assert framework._evictor(ctx, SimpleNamespace(evict_max_bytes=1 << 21))[1] == 1 << 21
