"""Published peak memories per GPU against the prediction (issue 16 item 6: within 10%).

What a framework reports is what PyTorch's caching allocator saw: max_memory_allocated (the
tensors: the prediction less its "reserved" terms) or max_memory_reserved (also the allocator's
fragmentation: the prediction less the CUDA context and the NCCL buffers, which are allocated
outside it). The cases live in benchmarks/bench_accuracy.py (MEMORY), with their sources.
"""

from __future__ import annotations

import pytest

from benchmarks import bench_accuracy as bench
from perfmodel import TransformerSpec, predict


@pytest.mark.parametrize("case", bench.MEMORY, ids=[c.label for c in bench.MEMORY])
def test_published_peak_memory_within_10_percent(case):
    r = predict(TransformerSpec(**case.model), case.hardware, case.plan)
    predicted = bench.allocator_view(r, case.measured_by)
    assert predicted == pytest.approx(case.published_bytes, rel=0.10), (
        f"{case.label}: predicted {predicted / 2**30:.1f} GiB, published "
        f"{case.published_bytes / 2**30:.1f} GiB ({case.measured_by})")
