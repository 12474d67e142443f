"""Regressions from the 2026-12-03 collective probe.

1. Recursive doubling/halving took log2(n) steps for any n: 3 ranks paid 3.17 steps' latency and
   cost less than 4. A group that is not a power of two folds its extra ranks into partners
   first and serves them last (Thakur, Rabenseifner, Gropp, "Optimization of Collective
   Communication Operations in MPICH", IJHPCA 2005, Sec. 4.2 and 4.4); a binary tree is
   ceil(log2 n) deep; NCCL's tree model counts floor(log2 nodes) (tuning.cc, log2i).
2. With the generic library, a pinned ring (tree, recursive) over nodes reported the two-level
   (hierarchical) time under the ring's name; only auto may take the two-level form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from perfmodel import load_hardware
from perfmodel.codegen import numpy_function
from perfmodel.collective import predict_collective
from perfmodel.costs import collectives as C
from perfmodel.specs.hardware import CollectiveFit, hardware_from_dict
from perfmodel.specs.profile import fitted_collective_time

# The probe's toy spec (simple.yaml): round link numbers, no call start-up, generic library.
INTRA_ALPHA, INTRA_BETA = 1.0e-5, 1.0e11  # per step [s], per GPU [B/s]
INTER_ALPHA, INTER_BETA = 1.0e-4, 8.0e10  # per step [s], per node [B/s]
GPUS_PER_NODE = 8
TOY = {
    "name": "simple", "gpu_name": "toy", "gpus_per_node": GPUS_PER_NODE,
    "peak_flops_per_s": {"fp32": 1.0e14, "bf16": 1.0e14, "fp16": 1.0e14},
    "memory_bytes": 85899345920, "memory_bandwidth_bytes_per_s": 1.0e12,
    "gemm_efficiency": {"max_fraction": 1.0},
    "intra_node": {"bandwidth_bytes_per_s": INTRA_BETA, "latency_s": INTRA_ALPHA,
                   "efficiency": 1.0, "call_latency_s": 0.0},
    "inter_node": {"bandwidth_bytes_per_s": INTER_BETA, "latency_s": INTER_ALPHA,
                   "efficiency": 1.0, "call_latency_s": 0.0},
    "collective_library": "generic",
}


@pytest.fixture(scope="module")
def toy():
    return hardware_from_dict(TOY, "simple.yaml")


def _time(hw, op, nbytes, ranks, algorithm="auto", per_node=None):
    return predict_collective(op, float(nbytes), ranks, hw, per_node, algorithm)


# --- 1. recursive algorithms and trees on any number of ranks --------------------------------


def thakur_recursive_s(op: str, nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Thakur, Rabenseifner, Gropp 2005, written out apart from the module: p' = 2^floor(lg p).
    p = p': all_reduce (Rabenseifner) 2 lg p alpha + 2 (p - 1)/p n beta; reduce_scatter
    (recursive halving) and all_gather (recursive doubling) lg p alpha + (p - 1)/p n beta.
    p > p': all_reduce folds (alpha + n beta), runs on p', unfolds (alpha + n beta);
    reduce_scatter (floor(lg p) + 2) alpha + 2 n beta (Sec. 4.2), all_gather its mirror."""
    pof2 = 1
    while pof2 * 2 <= p:
        pof2 *= 2
    lg = round(math.log2(pof2))
    if op == "all_reduce":
        core = 2 * lg * alpha + 2 * (pof2 - 1) / pof2 * nbytes / beta
        return core if pof2 == p else core + 2 * (alpha + nbytes / beta)
    if pof2 == p:
        return lg * alpha + (p - 1) / p * nbytes / beta
    return (lg + 2) * alpha + 2 * nbytes / beta


def test_three_ranks_never_cost_less_than_four_in_recursive_all_reduce(toy):
    # the probe: 1 byte over 3 ranks printed 3.17 steps' latency (31.7 us), below 4 ranks' 40 us
    times = {p: _time(toy, "all_reduce", 1, p, "recursive")["time_s"] for p in range(2, 9)}
    assert times[3] >= times[4]
    assert times[5] >= times[4] and times[7] >= times[4]
    assert times[3] == pytest.approx(4 * INTRA_ALPHA + 3 / INTRA_BETA, rel=1e-12)


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_six_ranks_cost_thakurs_formula(toy, op):
    nbytes = 6e8
    want = thakur_recursive_s(op, nbytes, 6, INTRA_ALPHA, INTRA_BETA)
    # all_reduce: (2*2 + 2) alpha + (2 * 3/4 + 2) n beta; the others 4 alpha + 2 n beta
    by_hand = {"all_reduce": 6 * INTRA_ALPHA + 3.5 * nbytes / INTRA_BETA,
               "reduce_scatter": 4 * INTRA_ALPHA + 2 * nbytes / INTRA_BETA,
               "all_gather": 4 * INTRA_ALPHA + 2 * nbytes / INTRA_BETA}[op]
    assert want == pytest.approx(by_hand, rel=1e-12)
    got = float(C.collective_time(op, nbytes, 6, INTRA_ALPHA, INTRA_BETA, "recursive"))
    assert got == pytest.approx(want, rel=1e-12)
    assert _time(toy, op, nbytes, 6, "recursive")["time_s"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7, 8, 12, 24, 1000, 1024])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_recursive_matches_the_paper_for_every_group_size(op, p):
    got = float(C.collective_time(op, 1e9, p, 3e-6, 5e10, "recursive"))
    assert got == pytest.approx(thakur_recursive_s(op, 1e9, p, 3e-6, 5e10), rel=1e-12)


def test_powers_of_two_keep_their_formulas_exactly():
    for k in range(1, 21):
        n = 2**k
        assert C.steps("all_reduce", n, "recursive") == 2 * k
        assert C.steps("reduce_scatter", n, "recursive") == k
        assert C.steps("all_gather", n, "recursive") == k
        assert C.steps("all_reduce", n, "tree") == 2 * k
        assert C.steps("broadcast", n, "tree") == k
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            assert C.volume_factor(op, n, "recursive") == C.bus_factor(op, n)


def test_every_step_count_is_a_whole_number():
    for n in range(2, 130):
        for op, alg in (("all_reduce", "recursive"), ("reduce_scatter", "recursive"),
                        ("all_gather", "recursive"), ("all_reduce", "tree"),
                        ("broadcast", "tree"), ("reduce", "tree")):
            assert C.steps(op, n, alg).is_Integer, (op, alg, n)


def test_a_binary_tree_is_ceil_log2_deep():
    # NCCL's btree (src/graph/trees.cc): 3 ranks 0 -> 2 -> 1, 5 ranks 0 -> 4 -> 2 -> 1
    assert C.steps("broadcast", 3, "tree") == 2
    assert C.steps("broadcast", 5, "tree") == 3
    assert C.steps("all_reduce", 6, "tree") == 6
    assert float(C.collective_time("all_reduce", 1, 3, 1.0, 1e30, "tree")) == pytest.approx(4.0)


def test_nccl_tree_counts_floor_log2_nodes_as_its_tuning_model():
    # tuning.cc: 2 ((nRanks/nNodes - 1) intraLat + log2i(nNodes) interLat); 24 ranks, 8 a node
    got = float(C.nccl_tree_all_reduce_time(1e6, 24, 8, 2e-6, 1e-6, 10e-6, 1e11))
    assert got == pytest.approx(2e-6 + 2 * (7 * 1e-6 + 1 * 10e-6) + 2e6 / 1e11, rel=1e-12)
    one_per_node = float(C.nccl_tree_all_reduce_time(1e6, 6, 1, 2e-6, 1e-6, 10e-6, 1e11))
    assert one_per_node == pytest.approx(2e-6 + 2 * 2 * 10e-6 + 2e6 / 1e11, rel=1e-12)


def test_nccl_tree_over_nodes_one_rank_each_is_the_same_model_as_with_several():
    hw = load_hardware("dgx-h100")
    for nodes in (3, 5, 6):
        one = _time(hw, "all_reduce", 1024, nodes, "tree", 1)["time_s"]
        many = _time(hw, "all_reduce", 1024, 8 * nodes, "tree", 8)["time_s"]
        assert many > one  # the chain through each node's 8 ranks adds latency
        # both count floor(log2 nodes) tree levels: 3 nodes as 2, 6 as 4, 5 as 4
        assert one == pytest.approx(_time(hw, "all_reduce", 1024, 2 ** int(math.log2(nodes)),
                                          "tree", 1)["time_s"], rel=1e-12)


def test_compiled_forms_evaluate_as_the_integers():
    n = sp.Symbol("n", positive=True)
    exprs = [f(op, n, alg) for f in (C.steps, C.volume_factor)
             for op, alg in (("all_reduce", "recursive"), ("reduce_scatter", "recursive"),
                             ("all_gather", "recursive"), ("all_reduce", "tree"))]
    sizes = np.array([*range(1, 70), 2**29 - 1, 2**29, 2**29 + 1], dtype=float)
    namespace = {"_np": np}
    exec(numpy_function("f", [(n, "n")], exprs), namespace)  # our own generated code
    printed = namespace["f"](sizes)
    lambdified = sp.lambdify([n], exprs, modules="numpy")(sizes)
    for i, expr in enumerate(exprs):
        want = np.array([float(expr.subs(n, int(v))) for v in sizes])
        assert np.allclose(printed[i], want, rtol=1e-15, atol=0), expr
        assert np.allclose(lambdified[i], want, rtol=1e-15, atol=0), expr


def test_a_fitted_recursive_collective_takes_the_whole_step_count():
    fit = CollectiveFit(op="all_reduce", scope="intra", algorithm="recursive", alpha_s=1e-5,
                        bus_bandwidth_bytes_per_s=1e11)
    got = fitted_collective_time(fit, "all_reduce", np.array([1.0, 1.0]), np.array([3.0, 4.0]))
    assert got[0] == pytest.approx(4 * 1e-5 + 4 / 3 / 1e11, rel=1e-12)
    assert got[1] == pytest.approx(4 * 1e-5 + 1.5 / 1e11, rel=1e-12)


def test_auto_no_longer_picks_recursive_for_six_ranks_of_256_mib_on_mi300x():
    hw = load_hardware("mi300x")
    r = _time(hw, "all_reduce", 256 * 2**20, 6)
    assert r["algorithm"] == "ring"
    assert r["by_algorithm_s"]["recursive"] > r["by_algorithm_s"]["ring"]
    link = hw.intra_node
    alpha, beta = link.latency_s, link.effective_bandwidth_bytes_per_s
    call = link.call_latency_s
    recursive = r["by_option_s"]["recursive/simple"]
    assert recursive == pytest.approx(
        call + thakur_recursive_s("all_reduce", 256 * 2**20, 6, alpha, beta), rel=1e-9)


# --- 2. a pinned flat algorithm over nodes costs that algorithm --------------------------------


def test_a_pinned_ring_over_nodes_costs_the_flat_ring(toy):
    # 6 ranks, 2 per node, 3 nodes: the ring crosses nodes in 2 (3 - 1) = 4 of its 10 steps; its
    # slowest hop is the group's NIC share, min(beta_intra, beta_inter k / G) = 20 GB/s
    r = _time(toy, "all_reduce", 1e9, 6, "ring", 2)
    share = min(INTRA_BETA, INTER_BETA * 2 / GPUS_PER_NODE)
    flat = 4 * INTER_ALPHA + 6 * INTRA_ALPHA + 2 * 5 / 6 * 1e9 / share
    assert r["algorithm"] == "ring"
    assert r["time_s"] == pytest.approx(flat, rel=1e-12)  # 83.79 ms; it printed 77.09 ms
    assert r["time_s"] == pytest.approx(83.79e-3, rel=1e-4)


def test_pinned_tree_and_recursive_over_nodes_cost_themselves(toy):
    share = min(INTRA_BETA, INTER_BETA * 2 / GPUS_PER_NODE)
    tree = _time(toy, "all_reduce", 1e9, 6, "tree", 2)
    assert tree["time_s"] == pytest.approx(6 * INTER_ALPHA + 2 * 1e9 / share, rel=1e-12)
    rec = _time(toy, "all_reduce", 1e9, 6, "recursive", 2)
    assert rec["time_s"] == pytest.approx(
        thakur_recursive_s("all_reduce", 1e9, 6, INTER_ALPHA, share), rel=1e-12)


def test_auto_over_nodes_takes_and_names_the_cheapest_including_two_level(toy):
    pinned = {alg: _time(toy, "all_reduce", 1e9, 6, alg, 2)["time_s"]
              for alg in ("ring", "tree", "recursive", "hierarchical")}
    auto = _time(toy, "all_reduce", 1e9, 6, "auto", 2)
    assert auto["algorithm"] == "hierarchical"
    assert auto["time_s"] == min(pinned.values()) == pinned["hierarchical"]
    assert auto["by_algorithm_s"] == pytest.approx(pinned, rel=1e-12)
    # the two-level form: reduce-scatter in the node, all-reduce of n/k across 3 nodes, all-gather
    hier = float(C.hierarchical_time("all_reduce", 1e9, 6, 2, INTRA_ALPHA, INTRA_BETA,
                                     INTER_ALPHA, INTER_BETA / GPUS_PER_NODE))
    assert pinned["hierarchical"] == pytest.approx(hier, rel=1e-12)  # 77.09 ms
    assert pinned["ring"] > pinned["hierarchical"]


def test_nccl_pinned_ring_over_nodes_stays_a_ring():
    hw = load_hardware("dgx-h100")
    r = _time(hw, "all_reduce", 1e9, 16, "ring", 8)
    auto = _time(hw, "all_reduce", 1e9, 16, "auto", 8)
    assert r["algorithm"] == "ring"
    assert r["time_s"] == pytest.approx(auto["by_algorithm_s"]["ring"], rel=1e-12)


def test_a_pinned_ring_whose_ranks_lie_in_one_node_runs_inside_it():
    # a layer graph's contributors (perfmodel.layerwise): 8 ranks of a group over nodes, all in
    # one node; the two-level form priced them as that node's ring, the pinned ring must too
    one_node = C.mixed_flat_time("all_gather", 8e6, 8, 1, 0, 1e-6, 10e-6, 2e9, "ring",
                                 intra_beta=1e11)
    assert float(one_node) == pytest.approx(7 * 1e-6 + 7 / 8 * 8e6 / 1e11, rel=1e-12)
    spans = C.mixed_flat_time("all_gather", 8e6, 24, 3, 0, 1e-6, 10e-6, 2e9, "ring",
                              intra_beta=1e11)
    assert float(spans) == pytest.approx(2 * 10e-6 + 21 * 1e-6 + 23 / 24 * 8e6 / 2e9, rel=1e-12)
