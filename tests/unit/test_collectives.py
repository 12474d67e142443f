"""Collective formulas checked against hand computations and against each other."""

import math

import pytest
import sympy as sp

from perfmodel import load_hardware
from perfmodel.collective import parse_bytes, predict_collective
from perfmodel.costs.collectives import bus_factor, collective_time, hierarchical_time
from perfmodel.errors import PlanError, UsageError

ALPHA, BETA = 5e-6, 100e9  # 5 us per step, 100 GB/s


def t(op, nbytes, n, alg):
    return float(collective_time(op, nbytes, n, ALPHA, BETA, alg))


def test_ring_all_reduce_by_hand():
    # 8 ranks, 1 GB: 2 * 7 steps of latency, 2 * 7/8 GB over the link
    assert t("all_reduce", 1e9, 8, "ring") == pytest.approx(14 * 5e-6 + 1.75e9 / 100e9)


def test_ring_all_gather_and_reduce_scatter_by_hand():
    # 4 ranks, 400 MB output: 3 steps, 3/4 of 400 MB
    assert t("all_gather", 4e8, 4, "ring") == pytest.approx(3 * 5e-6 + 3e8 / 100e9)
    assert t("reduce_scatter", 4e8, 4, "ring") == pytest.approx(3 * 5e-6 + 3e8 / 100e9)


def test_tree_and_recursive_latency_is_logarithmic():
    assert t("all_reduce", 8, 1024, "tree") == pytest.approx(2 * 10 * 5e-6 + 2 * 8 / 100e9)
    assert t("all_reduce", 8, 1024, "recursive") == pytest.approx(
        2 * 10 * 5e-6 + 2 * 1023 / 1024 * 8 / 100e9)


def test_rabenseifner_equals_reduce_scatter_plus_all_gather_bandwidth():
    # recursive halving + doubling moves the same bytes as a ring, in log2(n) steps each way
    n, nbytes = 16, 1e9
    ring_bw = t("all_reduce", nbytes, n, "ring") - 2 * (n - 1) * ALPHA
    rec_bw = t("all_reduce", nbytes, n, "recursive") - 2 * math.log2(n) * ALPHA
    assert rec_bw == pytest.approx(ring_bw)


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == sp.Rational(7, 4)
    assert bus_factor("all_gather", 8) == sp.Rational(7, 8)
    assert bus_factor("all_to_all", 8) == sp.Rational(7, 8)
    assert bus_factor("broadcast", 8) == 1
    assert bus_factor("send_recv", 2) == 1


def test_one_rank_costs_nothing():
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"):
        assert collective_time(op, 1e9, 1, ALPHA, BETA, "ring") == 0


def test_hierarchical_all_reduce_by_hand():
    # 2 nodes x 8: intra reduce-scatter of 1 GB (7 steps, 7/8 GB), inter all-reduce of 1/8 GB over
    # 2 nodes (2 steps, 1/8 GB), intra all-gather of 1 GB (7 steps, 7/8 GB)
    got = float(hierarchical_time("all_reduce", 1e9, 16, 8, ALPHA, BETA, 10e-6, 25e9))
    expected = 7 * ALPHA + 0.875e9 / BETA + 2 * 10e-6 + 0.125e9 / 25e9 + 7 * ALPHA + 0.875e9 / BETA
    assert got == pytest.approx(expected)


def test_time_grows_with_bytes_and_small_messages_pick_a_latency_algorithm():
    hw = load_hardware("dgx-a100-80gb")
    small = predict_collective("all_reduce", 1024, 64, hw)
    large = predict_collective("all_reduce", 1e9, 64, hw)
    assert large["time_s"] > small["time_s"]
    assert small["algorithm"] in ("tree", "recursive")
    assert large["busbw_bytes_per_s"] == pytest.approx(
        large["algbw_bytes_per_s"] * 2 * 63 / 64)


def test_intra_node_busbw_approaches_the_link_for_large_messages():
    hw = load_hardware("dgx-a100-80gb")
    r = predict_collective("all_reduce", 8e9, 8, hw)
    assert r["scope"] == "intra"
    assert r["busbw_bytes_per_s"] == pytest.approx(hw.intra_node.effective_bandwidth_bytes_per_s,
                                                   rel=0.01)


def test_parse_bytes():
    assert parse_bytes("1e9") == 1e9
    assert parse_bytes("256MiB") == 256 * 2**20
    assert parse_bytes("64KB") == 64e3
    assert parse_bytes("8G") == 8 * 2**30
    with pytest.raises(UsageError, match="reads as bits"):  # 1Gb was read as 10^9 bytes
        parse_bytes("1Gb")
    # not a size at all: the option's form (usage, exit 2); a size out of range: the plan's (4)
    for bad in ("", "12XB", "abc", "nan", "-inf", "1.5"):
        with pytest.raises(UsageError):
            parse_bytes(bad)
    for bad in ("-5", "0", "-1MiB", "2EiB"):
        with pytest.raises(PlanError):
            parse_bytes(bad)


def test_calibrated_two_regime_fit_is_used_on_both_sides_of_its_breakpoint():
    from perfmodel.specs.hardware import CollectiveFit
    from perfmodel.specs.profile import fitted_collective_time

    fit = CollectiveFit(op="all_reduce", scope="intra", algorithm="ring", alpha_s=2e-5,
                        bus_bandwidth_bytes_per_s=3e11, breakpoint_bytes=1e6, alpha_s_small=4e-6,
                        bus_bandwidth_bytes_per_s_small=5e10)
    hw = load_hardware("dgx-h100").replace(collectives=(fit,))
    for nbytes in (1e3, 5e5, 1e6, 1e9):
        got = predict_collective("all_reduce", nbytes, 8, hw)["time_s"]
        assert got == pytest.approx(float(fitted_collective_time(fit, "all_reduce", nbytes, 8)))
    small = predict_collective("all_reduce", 1e3, 8, hw)["time_s"]
    assert small == pytest.approx(14 * 4e-6 + 1.75 * 1e3 / 5e10)
