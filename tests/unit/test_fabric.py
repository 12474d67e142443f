"""A fabric of more than two levels (HardwareSpec.levels): each axis's group beyond its node is
priced on the slowest level its ranks cross; a two-level spec means what it meant.

The expectations are computed by hand from the ring all-reduce of Thakur, Rabenseifner and Gropp
(2005): T = 2 (n - 1) alpha + 2 (n - 1) / n x S / beta, beta the bandwidth one rank reaches (a
GPU's share of the level its ring crosses).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import sympy as sp

from perfmodel import symbols as S
from perfmodel.encode import axis_levels, fabric_of, plan_arrays
from perfmodel.errors import SpecError
from perfmodel.evaluate import family_of, values_of
from perfmodel.predict import predict
from perfmodel.specs.hardware import hardware_from_dict, load_hardware, load_hardware_dict
from perfmodel.specs.model import load_model
from perfmodel.step.collective import group_time
from perfmodel.strategy import Plan

MODEL = load_model("llama3-8b")
NBYTES = 1e9  # one all-reduce of 1 GB

# A toy fabric whose numbers make the hand computation short: a node of 8 GPUs (100 GB/s each,
# 1 us per step), a leaf over 4 nodes (32 GPUs; 10 GB/s per GPU, 2 us), a spine above with 2:1
# oversubscription (10 GB/s / 2 = 5 GB/s per GPU, 5 us). The generic library with the ring fixed:
# one algorithm, no protocols, no call start-up.
NODE = {"name": "node", "gpus": 8, "bandwidth_bytes_per_s": 100e9, "latency_s": 1e-6}
LEAF = {"name": "leaf", "gpus": 32, "bandwidth_bytes_per_s": 10e9, "latency_s": 2e-6}
SPINE = {"name": "spine", "bandwidth_bytes_per_s": 10e9, "latency_s": 5e-6,
         "oversubscription": 2}


def _toy(levels: list[dict]) -> dict:
    data = load_hardware_dict("dgx-h100")
    for key in ("intra_node", "inter_node", "gpus_per_node", "nccl_buffer_bytes"):
        data.pop(key)
    data.update(collective_library="generic", collective_algorithm="ring",
                levels=copy.deepcopy(levels), name="toy")
    return data


def _ring_all_reduce_s(n: int, alpha: float, beta: float) -> float:
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * NBYTES / beta


def _all_reduce_s(hardware, plan: Plan, axis: str) -> float:
    """One all-reduce of NBYTES over the plan's group of `axis`, as the step model prices it."""
    fam = family_of(MODEL, hardware, plan, specialise=True)
    expr = group_time("all_reduce", sp.Float(NBYTES), axis, fam)
    vals = values_of(MODEL, hardware, plan)
    return float(expr.subs({sym: vals[name] for name, (sym, _) in S.table().items()
                            if name in vals}))


def _plan(tp: int, dp: int) -> Plan:
    return Plan(gpus=tp * dp, tp=tp, dp=dp, global_batch=dp)


TOY = hardware_from_dict(_toy([NODE, LEAF, SPINE]), "toy")


def test_a_tp_group_inside_the_node_is_priced_on_nvlink():
    got = _all_reduce_s(TOY, _plan(8, 4), "tp")
    assert got == pytest.approx(_ring_all_reduce_s(8, 1e-6, 100e9), rel=1e-12)


def test_a_dp_group_inside_one_leaf_domain_is_priced_on_the_leaf():
    # tp 8 fills each node; dp 4 takes one rank of 4 nodes: 32 GPUs, one leaf domain
    got = _all_reduce_s(TOY, _plan(8, 4), "dp")
    assert got == pytest.approx(_ring_all_reduce_s(4, 2e-6, 10e9), rel=1e-12)


def test_a_dp_group_across_leaf_domains_is_priced_on_the_oversubscribed_spine():
    # dp 8 x tp 8 = 64 GPUs: two leaf domains; the spine gives a GPU 10 GB/s / 2
    got = _all_reduce_s(TOY, _plan(8, 8), "dp")
    assert got == pytest.approx(_ring_all_reduce_s(8, 5e-6, 5e9), rel=1e-12)


def test_the_level_each_axis_reaches_follows_the_placement_order():
    fabric = fabric_of(TOY)
    assert fabric.sizes == (8, 32) and fabric.slowest == (1, 2)
    for placement, tp_level, dp_level in ((("tp", "dp", "pp"), 0, 2),
                                          (("dp", "tp", "pp"), 2, 0)):
        plan = Plan(gpus=64, tp=8, dp=8, global_batch=8, placement=placement)
        levels = axis_levels(plan_arrays(plan), fabric)
        assert int(levels["tp"][0][0]) == tp_level and int(levels["dp"][0][0]) == dp_level


def test_the_slowest_level_crossed_prices_a_group_not_the_outermost():
    """A leaf slower than its spine (2.5 GB/s against 5 GB/s per GPU): a group across leaf
    domains still crosses the leaf, whose share is the smaller, and the spine, whose latency
    (5 us against 2) is the longer: each sets its own part (the leaf's alone, before
    2026-12-07)."""
    slow_leaf = {**LEAF, "bandwidth_bytes_per_s": 2.5e9}
    hw = hardware_from_dict(_toy([NODE, slow_leaf, SPINE]), "toy")
    got = _all_reduce_s(hw, _plan(8, 8), "dp")
    assert got == pytest.approx(_ring_all_reduce_s(8, 5e-6, 2.5e9), rel=1e-12)


def test_the_search_sees_the_boundary_between_leaf_and_spine():
    """The same plan shape with dp inside one leaf domain and across two costs more across."""
    inside = predict(MODEL, TOY, Plan(gpus=32, tp=8, dp=4, global_batch=32)).breakdown_s
    across = predict(MODEL, TOY, Plan(gpus=64, tp=8, dp=8, global_batch=64)).breakdown_s
    assert across["comm/dp"] > inside["comm/dp"] > 0


def _two_level_spelling(name: str) -> tuple[dict, dict]:
    """A preset's two-level spec, and the same fabric spelt as levels: the node, then the
    network per GPU (inter_node's per-node bandwidth / gpus_per_node)."""
    data = load_hardware_dict(name)
    spelt = copy.deepcopy(data)
    node, inter, gpus = spelt.pop("intra_node"), spelt.pop("inter_node"), spelt.pop("gpus_per_node")
    per_gpu = {**inter, "bandwidth_bytes_per_s": float(inter["bandwidth_bytes_per_s"]) / gpus}
    spelt["levels"] = [{**node, "name": "node", "gpus": gpus}, {**per_gpu, "name": "network"}]
    return data, spelt


PLANS = [Plan(gpus=64, tp=8, dp=8, global_batch=64),
         Plan(gpus=64, tp=4, dp=8, pp=2, micro_batch=1, global_batch=64, zero=1),
         Plan(gpus=64, tp=2, dp=32, global_batch=64, placement=("dp", "tp", "pp"))]


@pytest.mark.parametrize("plan", PLANS, ids=["tp8", "tp4pp2", "dp-inner"])
def test_a_two_level_spec_equals_its_levels_spelling(plan):
    data, spelt = _two_level_spelling("dgx-h100")
    two = hardware_from_dict(data, "dgx-h100")
    as_levels = hardware_from_dict(spelt, "dgx-h100")
    assert as_levels.inter_node.bandwidth_bytes_per_s == two.inter_node.bandwidth_bytes_per_s
    a = predict(MODEL, two, plan)
    b = predict(MODEL, as_levels, plan)
    assert b.step_time_s == a.step_time_s


@pytest.mark.parametrize("plan", PLANS, ids=["tp8", "tp4pp2", "dp-inner"])
def test_a_middle_level_like_the_top_changes_nothing(plan):
    """Three levels whose leaf is the network itself (a leaf domain of 16 nodes, the spine the
    same links): the per-axis path prices every group as the two-level spec does."""
    data, spelt = _two_level_spelling("dgx-h100")
    network = spelt["levels"][1]
    spelt["levels"] = [spelt["levels"][0], {**network, "name": "leaf", "gpus": 128},
                       {**network, "name": "spine"}]
    three = hardware_from_dict(spelt, "three")
    assert family_of(MODEL, three, plan).fabric_levels == 3
    a = predict(MODEL, hardware_from_dict(data, "dgx-h100"), plan)
    b = predict(MODEL, three, plan)
    assert math.isclose(b.step_time_s, a.step_time_s, rel_tol=1e-12)
    for term, value in a.breakdown_s.items():
        assert math.isclose(b.breakdown_s[term], value, rel_tol=1e-12, abs_tol=1e-15), term


def test_gb200_nvl72_has_three_levels_and_its_node_links_from_them():
    hw = load_hardware("gb200-nvl72")
    assert [lv.name for lv in hw.levels] == ["nvlink", "leaf", "spine"]
    assert hw.gpus_per_node == 72 and hw.levels[1].gpus == 576  # one SU: 8 racks
    assert hw.intra_node.bandwidth_bytes_per_s == 900e9  # NVLink5 1.8 TB/s both directions
    assert hw.inter_node.bandwidth_bytes_per_s == 72 * 50e9  # 400 Gb/s per GPU


def test_a_hardware_spec_round_trips_its_levels_through_its_mapping():
    hw = load_hardware("gb200-nvl72")
    data = hw.to_dict()
    assert hardware_from_dict(data, "again") == hw


@pytest.mark.parametrize("change,needle", [
    (lambda lv: lv.__delitem__(slice(1, None)), r"levels must list at least two levels"),
    (lambda lv: lv[1].update(gpus=100), r"levels\[1\].gpus \(100\) must be a multiple of "
                                        r"levels\[0\].gpus \(8\)"),
    (lambda lv: lv[2].update(gpus=64), r"levels\[2\].gpus: the top level \(spine\) spans"),
    (lambda lv: lv[1].pop("gpus"), r"levels\[1\].gpus is required"),
    (lambda lv: lv[1].update(name="node"), r"levels: name 'node' is given twice"),
    (lambda lv: lv[1].update(nvls_bandwidth_fraction=0.5),
     r"levels\[1\].nvls_bandwidth_fraction must be 0"),
    (lambda lv: lv[0].update(oversubscription=2), r"levels\[0\].oversubscription must be 1"),
    (lambda lv: lv[2].update(oversubscription=0.5),
     r"levels\[2\].oversubscription must be >= 1"),
    (lambda lv: lv[1].update(bandwidth=1e9), r"levels\[1\]: unknown field 'bandwidth'"),
    (lambda lv: lv[1].pop("latency_s"), r"levels\[1\] is missing field 'latency_s'"),
])
def test_a_bad_fabric_is_refused_in_one_line_naming_the_field(change, needle):
    data = _toy([NODE, LEAF, SPINE])
    change(data["levels"])
    with pytest.raises(SpecError, match=needle) as err:
        hardware_from_dict(data, "toy")
    assert "\n" not in str(err.value)


def test_node_links_that_disagree_with_the_levels_are_refused():
    data = TOY.to_dict()
    data["inter_node"]["bandwidth_bytes_per_s"] *= 2  # e.g. --what-if inter_node...=2x
    with pytest.raises(SpecError, match=r"inter_node must agree with levels"):
        hardware_from_dict(data, "toy")


def test_an_inter_fit_on_a_fabric_of_three_levels_is_refused():
    data = _toy([NODE, LEAF, SPINE])
    data["collectives"] = [{"op": "all_reduce", "scope": "inter", "algorithm": "ring",
                            "alpha_s": 1e-5, "bus_bandwidth_bytes_per_s": 4e10}]
    with pytest.raises(SpecError, match=r"a fit of scope 'inter' is one network"):
        hardware_from_dict(data, "toy")


def test_the_search_prices_every_plan_on_the_levels_as_predict_does():
    """The search (the universal family, staged over the plans' distinct topologies) gives the
    plans over 64 GPUs of the toy fabric the step time predict gives them: plans whose dp group
    stays in one leaf domain and plans whose dp crosses the oversubscribed spine alike. Every
    k-th of the ~34,000 plans it evaluates, about 800 (predict takes ~4 ms a plan: all of them
    took 2-3 minutes of CI); the search's order mixes the layouts, so the sample spans the
    three levels (asserted)."""
    import numpy as np

    from perfmodel.search import Scored, SearchRequest, search

    req = SearchRequest(gpus=(64,), global_batch=64, max_micro_batch=2, cp=1)
    chunks: list = []
    result = search(MODEL, TOY, req, top=10**6, on_chunk=chunks.append)
    every = Scored.concat(chunks)
    done = np.flatnonzero(every.evaluated)
    assert len(done) > 50
    levels = set()
    for i in done[::max(1, len(done) // 800)]:
        plan = result.plan(every, int(i))
        levels.add(int(axis_levels(plan_arrays(plan), fabric_of(TOY))["dp"][0][0]))
        assert every.step_time_s[i] == pytest.approx(predict(MODEL, TOY, plan).step_time_s,
                                                     rel=1e-9)
    assert {0, 1, 2} <= levels  # dp inside a node, inside a leaf domain and across the spine


def test_what_if_changes_a_level_by_index_and_refuses_the_derived_links():
    from perfmodel.errors import PlanError
    from perfmodel.recommend import apply_what_if

    blocking = apply_what_if(TOY, "levels.2.oversubscription=4")
    assert [lv.oversubscription for lv in blocking.levels] == [1, 1, 4]
    plan = _plan(8, 8)
    assert _all_reduce_s(blocking, plan, "dp") == pytest.approx(
        _ring_all_reduce_s(8, 5e-6, 10e9 / 4), rel=1e-12)
    with pytest.raises(PlanError, match=r"takes inter_node from its levels"):
        apply_what_if(TOY, "inter_node.bandwidth_bytes_per_s=2x")


# --- perfmodel collective on a fabric of more than two levels ---------------------------------


def test_collective_prices_a_group_on_the_slowest_level_it_reaches():
    """`perfmodel collective` over 8 nodes, one rank each, reaches the spine (64 GPUs > the
    leaf's 32): a ring on the spine's share, 10 GB/s / 2, and its latency, by hand; over 4 nodes
    it stays under one leaf (10 GB/s, 2 us)."""
    from perfmodel.collective import predict_collective

    toy = hardware_from_dict(_toy([NODE, LEAF, SPINE]), "toy")
    spine = predict_collective("all_reduce", NBYTES, 8, toy, ranks_per_node=1, algorithm="ring")
    assert (spine["fabric_level"], spine["priced_on"]) == ("spine", "spine")
    assert spine["time_s"] == pytest.approx(_ring_all_reduce_s(8, 5e-6, 5e9), rel=1e-9)
    leaf = predict_collective("all_reduce", NBYTES, 4, toy, ranks_per_node=1, algorithm="ring")
    assert (leaf["fabric_level"], leaf["priced_on"]) == ("leaf", "leaf")
    assert leaf["time_s"] == pytest.approx(_ring_all_reduce_s(4, 2e-6, 10e9), rel=1e-9)


def test_collective_on_levels_equals_the_two_level_spec_of_the_level_it_is_priced_on():
    """Several ranks per node (a mixed group): the same time as the two-level fabric whose
    network is the level that prices the group; a slower leaf under a faster spine prices a
    group that reaches the spine at the leaf's bandwidth (the slowest crossed) and the spine's
    latency (the longest)."""
    from perfmodel.collective import predict_collective

    three = hardware_from_dict(_toy([NODE, LEAF, SPINE]), "toy")
    two = hardware_from_dict(_toy([NODE, SPINE]), "toy")
    got = predict_collective("all_reduce", NBYTES, 64, three, ranks_per_node=8)
    want = predict_collective("all_reduce", NBYTES, 64, two, ranks_per_node=8)
    assert got["time_s"] == pytest.approx(want["time_s"], rel=1e-12)
    fast_spine = dict(SPINE, bandwidth_bytes_per_s=40e9, oversubscription=1)
    slow_leaf = hardware_from_dict(_toy([NODE, LEAF, fast_spine]), "toy")
    res = predict_collective("all_reduce", NBYTES, 64, slow_leaf, ranks_per_node=8)
    assert (res["fabric_level"], res["priced_on"]) == ("spine", "leaf")
    # the top level spans the cluster; its steps at the spine's latency
    top_leaf = {**{k: v for k, v in LEAF.items() if k != "gpus"}, "latency_s": SPINE["latency_s"]}
    leaf_only = predict_collective("all_reduce", NBYTES, 64,
                                   hardware_from_dict(_toy([NODE, top_leaf]), "toy"),
                                   ranks_per_node=8)
    assert res["time_s"] == pytest.approx(leaf_only["time_s"], rel=1e-12)


def test_collective_inside_a_node_ignores_the_outer_levels():
    from perfmodel.collective import predict_collective

    res = predict_collective("all_reduce", NBYTES, 8, TOY)
    assert (res["scope"], res["fabric_level"], res["priced_on"]) == ("intra", "node", "node")


# --- groups that do not tile the nodes, and a job's share of a multi-host NVLink domain -------

@pytest.mark.parametrize(("gpus", "taken"), [
    (256, 64), (128, 64), (64, 64), (72, 72), (144, 72), (512, 64), (8, 8), (12, 12),
    (6, 72),  # not whole trays: whole racks, as before
])
def test_a_job_takes_the_same_whole_trays_of_each_nvl72_rack(gpus, taken):
    """Megatron-Bridge's GB200 launcher sets Slurm's --segment to the largest divisor of the
    job's trays (4 GPUs) up to a rack's 18 (scripts/performance/utils/executors.py): 256 GPUs
    take 16 trays, 64 GPUs, of each rack."""
    from perfmodel.encode import job_domain

    assert int(job_domain(np.array([gpus]), 72, 4)[0]) == taken


def test_an_expert_group_of_a_256_gpu_job_on_nvl72_stays_in_its_rack():
    from perfmodel.encode import axis_per_node

    hw = load_hardware("gb200-nvl72")
    plan = Plan(gpus=256, dp=128, tp=2, ep=64, sequence_parallel=True, zero=2,
                global_batch=1024)
    scopes = axis_per_node(plan, hw)
    assert scopes["ep"] == (64, "intra")  # 64 of each rack's 72: the groups tile the racks
    assert scopes["dp"] == (32, "mixed")


def test_a_group_that_straddles_a_node_boundary_is_costed_as_the_straddling_one():
    """144 GPUs fill two racks (72 each); an ep group of 16 consecutive ranks lies in one rack
    for most groups, but ranks 64-79 are 8 in one and 8 in the next: the group is costed so.
    A 6-GPU node and tp 4 likewise: ranks 4-7 are 2 and 2."""
    from perfmodel.encode import axis_per_node

    plan = Plan(gpus=144, dp=144, tp=1, ep=16, global_batch=144)
    assert axis_per_node(plan, load_hardware("gb200-nvl72"))["ep"] == (8, "mixed")
    six = load_hardware_dict("dgx-h100")
    six.update(name="six", gpus_per_node=6)
    hw = hardware_from_dict(six, "six")
    assert axis_per_node(Plan(gpus=12, dp=3, tp=4, global_batch=12), hw)["tp"] == (2, "mixed")
    # a single node holds every group whole: none straddles
    assert axis_per_node(Plan(gpus=6, dp=2, tp=3, global_batch=6), hw)["tp"] == (3, "intra")


def test_a_group_of_several_axes_is_not_cut_by_its_parts():
    """dp x cp of 24 consecutive ranks on 8-GPU nodes holds 8 in each node, whatever its cp
    part of 3 (which straddles alone): the composite group takes the tiling rule of its parts
    (6 a node, as before the straddling rule), not the straddle of each."""
    from perfmodel.encode import axis_per_node

    per_node = axis_per_node(Plan(gpus=24, dp=8, cp=3, global_batch=8), 8)
    assert per_node["cp"] == (1, "inter") and per_node["dp_cp"] == (6, "mixed")
