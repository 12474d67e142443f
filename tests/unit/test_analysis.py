"""perfmodel.analysis: the thresholds of the cost formulas, against numbers worked by hand."""

import pytest
import sympy as sp

from perfmodel import PlanError
from perfmodel.analysis import (
    algorithm_crossover_bytes,
    bubble_fraction,
    gemm_intensity,
    latency_bandwidth_bytes,
    ridge_intensity,
    ridge_square_dim,
)
from perfmodel.costs.collectives import collective_time


def test_gemm_intensity_by_hand():
    # 1024^3 in bf16: 2 x 1024^3 FLOPs over 2 x 3 x 1024^2 bytes = 341.3 FLOP/B
    assert float(gemm_intensity(1024, 1024, 1024, 2)) == pytest.approx(2 * 1024 / 6)
    # a vector-matrix product (m = 1) is memory-bound on any GPU: ~1 FLOP/B in bf16
    assert float(gemm_intensity(1, 8192, 8192, 2)) == pytest.approx(1.0, rel=1e-3)


def test_ridge_point_of_an_h100():
    # H100 SXM datasheet: 989.4 TFLOP/s dense bf16, 3.35 TB/s
    ridge = float(ridge_intensity(989.4e12, 3.35e12))
    assert ridge == pytest.approx(295.3, rel=1e-3)
    d = float(ridge_square_dim(989.4e12, 3.35e12, 2))
    assert d == pytest.approx(3 * 2 * ridge / 2)  # d* = 3 e I* / 2 = 886
    assert float(gemm_intensity(d, d, d, 2)) == pytest.approx(ridge)
    symbolic = ridge_square_dim(*sp.symbols("F W e", positive=True))
    assert sp.simplify(symbolic - sp.Rational(3, 2) * sp.Symbol("e", positive=True)
                       * sp.Symbol("F", positive=True) / sp.Symbol("W", positive=True)) == 0


def test_latency_bandwidth_crossover_of_a_ring_all_reduce():
    # 2 (n-1) alpha = 2 (n-1)/n S / beta  =>  S = n alpha beta: 8 x 10 us x 100 GB/s = 8 MB
    s = float(latency_bandwidth_bytes("all_reduce", 8, "ring", 10e-6, 100e9))
    assert s == pytest.approx(8e6)
    t_alpha = 14 * 10e-6
    assert float(collective_time("all_reduce", s, 8, 10e-6, 100e9, "ring")) == pytest.approx(
        2 * t_alpha)


def test_ring_against_tree_crossover_by_hand():
    # ring 2(n-1) alpha + 2(n-1)/n S/beta; tree 2 log2(n) alpha + 2 S/beta; equal at
    # S = n (n - 1 - log2 n) alpha beta: n = 8 -> 32 alpha beta
    alpha, beta = 5e-6, 50e9
    s = float(algorithm_crossover_bytes("all_reduce", 8, "ring", "tree", alpha, beta))
    assert s == pytest.approx(32 * alpha * beta)
    ring = collective_time("all_reduce", s, 8, alpha, beta, "ring")
    tree = collective_time("all_reduce", s, 8, alpha, beta, "tree")
    assert float(ring) == pytest.approx(float(tree))
    # below it the tree (fewer steps) wins, above it the ring (less traffic)
    assert float(collective_time("all_reduce", s / 10, 8, alpha, beta, "tree")) < float(
        collective_time("all_reduce", s / 10, 8, alpha, beta, "ring"))
    # ring and recursive halving/doubling move the same bytes: no crossover
    assert algorithm_crossover_bytes("all_reduce", 8, "ring", "recursive", alpha, beta) is None


def test_unknown_collectives_and_algorithms_are_named():
    with pytest.raises(PlanError, match="unknown collective 'allreduce'"):
        latency_bandwidth_bytes("allreduce", 8, "ring", 1e-6, 1e9)
    with pytest.raises(PlanError, match="all_gather has no tree algorithm"):
        algorithm_crossover_bytes("all_gather", 8, "ring", "tree", 1e-6, 1e9)
    with pytest.raises(PlanError, match="unknown algorithm 'rings'"):
        latency_bandwidth_bytes("all_reduce", 8, "rings", 1e-6, 1e9)


def test_bubble_fraction_by_hand():
    # pp = 4, m = 8: 3 idle micro-batch times of 11 -> 27%; interleaved v = 3: 1 of 9
    assert float(bubble_fraction(4, 8)) == pytest.approx(3 / 11)
    assert float(bubble_fraction(4, 8, 3)) == pytest.approx(1 / 9)
    assert bubble_fraction(1, 8) == 0
    with pytest.raises(PlanError, match="micro_batches must be >= 1"):
        bubble_fraction(4, 0)
