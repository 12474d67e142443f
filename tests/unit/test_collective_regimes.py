"""A two-regime collective fit (calibration.fit.CollectiveModel._split) at rank counts it did not
measure: the time stays continuous and never falls as the size grows (a collective probe,
2026-12-07: a fit of a 16-rank log fell 4.5x at 2 ranks one byte past its breakpoint, and
stepped up 1.9x at 64)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from calibration.importers import import_nccl_tests
from perfmodel.specs.hardware import CollectiveFit
from perfmodel.specs.profile import fit_values, fitted_collective_expr, fitted_collective_time

DATA = Path(__file__).parents[1] / "data" / "nccl-tests"
# a protocol switch: 16 ranks over 2 nodes of RoCE (the shared log's own fit)
LOG = DATA / "a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt"


@pytest.fixture(scope="module")
def switch() -> CollectiveFit:
    fit = import_nccl_tests([LOG]).hardware["collectives"][0]
    fit = CollectiveFit(**fit)
    assert fit.breakpoint_bytes > 0
    assert fit.bus_bandwidth_bytes_per_s > fit.bus_bandwidth_bytes_per_s_small  # a switch
    return fit


@pytest.mark.parametrize("ranks", [2, 4, 16, 64, 512])
def test_a_switch_is_continuous_and_never_falls_at_any_rank_count(switch, ranks):
    sizes = np.geomspace(1e3, 1e9, 4001)
    t = fitted_collective_time(switch, "all_reduce", sizes, ranks)
    assert np.all(np.diff(t) >= 0)
    bp = switch.breakpoint_bytes
    below, above = fitted_collective_time(switch, "all_reduce", np.array([bp - 25, bp + 25]),
                                          ranks)
    assert above / below == pytest.approx(1, abs=1e-3)
    # the faster protocol at each size: neither regime's line alone
    small = CollectiveFit(op="all_reduce", scope="inter", algorithm=switch.algorithm,
                          alpha_s=switch.alpha_s_small,
                          bus_bandwidth_bytes_per_s=switch.bus_bandwidth_bytes_per_s_small)
    large = CollectiveFit(op="all_reduce", scope="inter", algorithm=switch.algorithm,
                          alpha_s=switch.alpha_s,
                          bus_bandwidth_bytes_per_s=switch.bus_bandwidth_bytes_per_s)
    lines = [fitted_collective_time(f, "all_reduce", sizes, ranks) for f in (small, large)]
    assert np.allclose(t, np.minimum(*lines))


def test_at_the_measured_ranks_the_breakpoint_is_where_they_meet(switch):
    """At the 16 ranks the log measured the switch is at the breakpoint, as fitted."""
    bp = switch.breakpoint_bytes
    sizes = np.array([bp / 4, bp / 1.01, bp * 1.01, bp * 4])
    t = fitted_collective_time(switch, "all_reduce", sizes, 16)
    small = fitted_collective_time(
        CollectiveFit(op="all_reduce", scope="inter", algorithm=switch.algorithm,
                      alpha_s=switch.alpha_s_small,
                      bus_bandwidth_bytes_per_s=switch.bus_bandwidth_bytes_per_s_small),
        "all_reduce", sizes, 16)
    assert np.allclose(t[:2], small[:2]) and not np.allclose(t[2:], small[2:])


def test_a_slowdown_steps_up_at_its_breakpoint_at_any_rank_count():
    """A slowdown (no higher bandwidth beyond the breakpoint) holds its fixed cut in bytes."""
    fit = CollectiveFit(op="all_reduce", scope="inter", algorithm="ring", alpha_s=6e-6,
                        bus_bandwidth_bytes_per_s=2e10, breakpoint_bytes=1e6,
                        alpha_s_small=5e-6, bus_bandwidth_bytes_per_s_small=2.5e10)
    for ranks in (2, 16, 128):
        below, above = fitted_collective_time(fit, "all_reduce", np.array([1e6 - 1, 1e6]),
                                              ranks)
        assert above > below * 1.01


def test_the_symbolic_form_is_the_numeric_one(switch):
    names = ("nbytes", "n", "alpha_s", "bus_bandwidth_bytes_per_s", "breakpoint_bytes",
             "alpha_s_small", "bus_bandwidth_bytes_per_s_small")
    syms = sp.symbols(names, positive=True)
    expr = fitted_collective_expr("all_reduce", switch.algorithm, *syms)
    values = fit_values(switch)
    for ranks in (2, 64):
        for nbytes in (1e4, switch.breakpoint_bytes * 1.5, 1e8):
            got = float(expr.subs({**dict(zip(syms[2:], (values[k] for k in names[2:]),
                                              strict=True)), syms[0]: nbytes, syms[1]: ranks}))
            want = float(fitted_collective_time(switch, "all_reduce", nbytes, ranks))
            assert got == pytest.approx(want, rel=1e-9)
