"""The CPU tensor peak's check for a gloo temporary freed out of the profiler's view
(workload.timers._lost_collective_frees): a CI run read one buffer high (2026-12-03)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from workload.timers import _lost_collective_frees  # noqa: E402


def _mem(t, ptr, size):
    return SimpleNamespace(name="[memory]", start_time_ns=t, children=[],
                           extra_fields=SimpleNamespace(ptr=ptr, alloc_size=size))


def _op(name, t, *children):
    return SimpleNamespace(name=name, start_time_ns=t, children=list(children), extra_fields=None)


def _prof(*roots):
    results = SimpleNamespace(experimental_event_tree=lambda: list(roots))
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=results))


def test_a_collectives_copy_freed_in_view_is_not_lost():
    clone = _op("c10d::_reduce_scatter_base_", 1, _op("aten::clone", 2, _mem(3, 0xA, 64)))
    assert not _lost_collective_frees(_prof(clone, _mem(9, 0xA, -64)))


def test_a_collectives_copy_never_freed_is_lost():
    clone = _op("c10d::_reduce_scatter_base_", 1, _op("aten::clone", 2, _mem(3, 0xA, 64)))
    assert _lost_collective_frees(_prof(clone))


def test_a_collectives_copy_whose_address_is_taken_again_was_lost():
    # freed on gloo's worker thread, then reused by the optimizer and freed in view
    clone = _op("c10d::_reduce_scatter_base_", 1, _mem(3, 0xA, 64))
    sqrt = _op("aten::sqrt", 5, _mem(6, 0xA, 32))
    assert _lost_collective_frees(_prof(clone, sqrt, _mem(9, 0xA, -32)))


def test_what_the_step_keeps_outside_a_collective_is_not_a_lost_free():
    # a gradient the step keeps; a functional collective's output (no trailing underscore)
    kept = _op("aten::zeros", 1, _mem(2, 0xB, 64))
    out = _op("_c10d_functional::all_gather_into_tensor", 3, _mem(4, 0xC, 64))
    assert not _lost_collective_frees(_prof(out, kept))
