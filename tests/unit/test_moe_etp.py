"""Expert tensor parallelism (etp) in the step model, each number computed here by hand.

Sources (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553):
megatron/core/parallel_state.py (initialize_model_parallel: the expert mesh etp x ep x edp of
the world / pp ranks, expert_data_parallel_size = world / (etp ep pp)),
megatron/core/transformer/moe/experts.py (TEGroupedMLP: fc1 column-, fc2 row-parallel over the
expert-tensor group, moe_ffn_hidden_size / etp wide on a rank),
megatron/core/transformer/moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher: the token counts
all-gathered over tp_ep, the tokens after the all-to-all all-gathered over expt_tp in
dispatch_postprocess and the experts' outputs reduce-scattered in combine_preprocess).
"""

from __future__ import annotations

import pytest

from perfmodel import PlanError, load_hardware, predict
from perfmodel.collective import predict_collective
from perfmodel.encode import axis_ranks_per_node, plan_arrays
from perfmodel.evaluate import family_of, values_of
from perfmodel.predict import comm_ledger
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan

HW = "dgx-h100"
BF16 = 2
# 4 MoE layers of 16 experts (top 2, 2048 wide, gated), hidden 1024, 2048 tokens a sequence
L, H, E, K, F, S = 4, 1024, 16, 2, 2048, 2048


def _moe(**kw: object) -> TransformerSpec:
    return TransformerSpec(**{**dict(name="moe", layers=L, hidden=H, heads=8, seq_len=S,
                                     vocab=32000, gated_mlp=True, bias=False, norm="rmsnorm",
                                     position_embedding="rotary", tied_embeddings=False,
                                     experts=E, top_k=K, expert_ffn_hidden=F), **kw})


def _plan(**kw: object) -> Plan:
    # the tokens' exchanges (the routing probabilities' travel beside them where the experts'
    # activation is weighted: tests/unit/test_moe.py)
    kw.setdefault("expert_weighting", "output")
    kw.setdefault("gpus", int(kw.get("dp", 1)) * int(kw.get("cp", 1)) * int(kw.get("tp", 1))
                  * int(kw.get("pp", 1)))
    kw.setdefault("sequence_parallel", int(kw.get("tp", 1)) > 1)
    return Plan(**kw)


def _t(op: str, nbytes: float, ranks: int) -> float:
    """One collective inside a DGX H100 node, as `perfmodel collective` costs it."""
    return float(predict_collective(op, nbytes, ranks, load_hardware(HW))["time_s"])


def test_etp_gathers_the_received_rows_and_scatters_the_outputs_over_its_group():
    """dp 4 x tp 2, ep 4, etp 2, one node, 2 micro-batches of 1 sequence: each rank routes its
    T_r = 2048 / 2 = 1024 tokens; per MoE layer and micro-batch, dispatch and combine move
    T_r k h bf16 = 4 MiB by all-to-all over ep (forward and backward, as with etp 1); the
    received rows are all-gathered over etp (2 x 4 MiB = 8 MiB gathered) and the outputs
    reduce-scattered (8 MiB) forward, the other way backward; the token counts are all-gathered
    over the etp x ep = 8 ranks, 2 x 4 x 16 int64 = 1 KiB."""
    model = _moe()
    T_r = S // 2
    a2a = BF16 * T_r * K * H
    assert a2a == 4 * 2**20
    etp2 = _plan(dp=4, tp=2, ep=4, etp=2, global_batch=8, zero=1)
    moe = {(r["name"], r["phase"]): (r["calls"], r["nbytes"]) for r in comm_ledger(model, etp2, HW)
           if r["axis"] in ("ep", "etp", "etp_ep")}
    mb = 2
    assert moe == {
        ("ep/dispatch_combine/all_to_all", "fwd"): (2 * L * mb, a2a),
        ("ep/dispatch_combine/all_to_all", "bwd"): (2 * L * mb, a2a),
        ("etp/expert_tokens/all_gather", "fwd"): (L * mb, 2 * a2a),
        ("etp/expert_tokens/reduce_scatter", "fwd"): (L * mb, 2 * a2a),
        ("etp/expert_tokens/all_gather", "bwd"): (L * mb, 2 * a2a),
        ("etp/expert_tokens/reduce_scatter", "bwd"): (L * mb, 2 * a2a),
        ("etp_ep/token_counts/all_gather", "fwd"): (L * mb, 2 * 4 * E * 8),
    }
    # their time: every one exposed (comm/ep), each group inside the node
    expected = mb * L * (4 * _t("all_to_all", a2a, 4) + 2 * _t("all_gather", 2 * a2a, 2)
                         + 2 * _t("reduce_scatter", 2 * a2a, 2)
                         + _t("all_gather", 2 * 4 * E * 8, 8))
    assert predict(model, HW, etp2).breakdown_s["comm/ep"] == pytest.approx(expected, rel=1e-12)
    # etp 1: no expert-tensor exchanges, the counts over ep (4 x 16 int64)
    etp1 = {(r["name"], r["phase"]): r["nbytes"]
            for r in comm_ledger(model, etp2.replace(etp=1), HW)
            if r["axis"] in ("ep", "etp", "etp_ep")}
    assert etp1 == {("ep/dispatch_combine/all_to_all", "fwd"): a2a,
                    ("ep/dispatch_combine/all_to_all", "bwd"): a2a,
                    ("ep/token_counts/all_gather", "fwd"): 4 * E * 8}


def test_full_recompute_repeats_the_forward_gather_and_scatter():
    model = _moe()
    plan = _plan(dp=4, tp=2, ep=4, etp=2, global_batch=4, zero=1, recompute="full")
    calls: dict[str, float] = {}
    for r in comm_ledger(model, plan, HW):
        if r["axis"] == "etp":
            calls[f"{r['op']}/{r['phase']}"] = calls.get(f"{r['op']}/{r['phase']}", 0) \
                + r["calls"]
    # forward 1, backward 1 and the recomputed forward 1 of each, per layer (1 micro-batch)
    assert calls == {"all_gather/fwd": L, "reduce_scatter/fwd": L, "all_gather/bwd": 2 * L,
                     "reduce_scatter/bwd": 2 * L}


def test_expert_gemms_are_split_by_etp_over_the_rows_of_its_group():
    """Each rank's E/ep experts as one grouped GEMM of f / etp wide slices over m = etp ep T_r k
    / E rows each: up (gate) m x 2 f / etp x h, down m x h x f / etp; the router over the rank's
    own T_r tokens."""
    import sympy as sp

    from perfmodel import symbols as sym
    from perfmodel.costs.gemm_efficiency import gemm_time_s
    from perfmodel.step.context import Context
    from perfmodel.step.moe import moe_mlp_work

    model, hw = _moe(), load_hardware(HW)
    plan = _plan(dp=4, tp=2, ep=4, etp=2, global_batch=4)
    values = values_of(model, hw, plan)
    subs = {s: values[name] for name, (s, _) in sym.table().items() if name in values}
    gemm, _ = moe_mlp_work(Context.of(family_of(model, hw, plan)))
    g = hw.training_gemm("bf16").__dict__.copy()
    floor = g["min_time_s"]
    if not g["large_flops"]:
        g.pop("large_flops")
    peak, bw = hw.peak("bf16"), hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency

    def t(m: float, n: float, k: float, with_floor: bool = True) -> float:
        return float(gemm_time_s(m, n, k, 1, BF16, peak, bw,
                                 **{**g, "min_time_s": floor if with_floor else 0.0}))

    T_r, ep, etp = S // 2, 4, 2
    m = etp * ep * T_r * K / E
    assert m == 1024
    expert = t(m, 2 * F / etp, H, False) + t(m, H, F / etp, False)
    expected = t(T_r, E, H) + E / ep * expert + 2 * floor
    assert float(sp.sympify(gemm).xreplace(subs)) == pytest.approx(expected, rel=1e-12)


def test_expert_weights_shard_over_ep_x_etp_and_their_states_over_edp():
    """dp 8 x tp 2, ep 4: the experts' weights and gradients on a rank halve from etp 1 to etp 2
    (E/ep experts, each 3 h f / etp), the expert-data-parallel group halves (tp dp / (ep etp) = 4
    -> 2), so ZeRO-1's optimizer states of the experts stay (12 x E/ep x 3 h f / (etp edp));
    the experts' gradient reduce-scatter over edp carries the slice."""
    model, hw = _moe(), load_hardware(HW)
    one = _plan(dp=8, tp=2, ep=4, zero=1, global_batch=8)
    two = one.replace(etp=2)
    p1, p2 = predict(model, hw, one), predict(model, hw, two)
    experts = L * E / 4 * 3 * H * F  # one rank's experts, whole
    for term, per_param in (("weights", BF16), ("gradients", 4)):
        assert p1.memory_breakdown_bytes[term] - p2.memory_breakdown_bytes[term] \
            == pytest.approx(per_param * experts / 2, rel=1e-12)
    assert p1.memory_breakdown_bytes["optimizer_states"] == pytest.approx(
        p2.memory_breakdown_bytes["optimizer_states"], rel=1e-12)
    groups = axis_ranks_per_node(plan_arrays(two), hw.gpus_per_node)
    # degree, and ranks in one node: etp the 2 tp ranks; edp every 4th of the dp ranks (8 apart:
    # one per node)
    assert {a: (int(groups[a][0][0]), int(groups[a][1][0])) for a in ("etp", "etp_ep", "edp")} \
        == {"etp": (2, 2), "etp_ep": (8, 8), "edp": (2, 1)}
    syncs = {r["name"]: r["nbytes"] for r in comm_ledger(model, two, hw) if r["axis"] == "edp"}
    assert syncs == {"edp/reduce_scatter": pytest.approx(4 * experts / 2),
                     "edp/all_gather": pytest.approx(BF16 * experts / 2)}


def test_etp_equal_to_tp_with_ep_1_syncs_the_experts_with_the_rest():
    """ep 1, etp = tp: the ranks holding the same expert slice are the dp ranks, as for every
    other tensor-parallel weight: one sync over dp, nothing over edp."""
    model = _moe()
    axes = {r["axis"] for r in comm_ledger(model, _plan(dp=4, tp=2, etp=2, global_batch=4),
                                           HW) if r["phase"] == "step"}
    assert "edp" not in axes and "dp" in axes


@pytest.mark.parametrize(("model", "kw", "needle"), [
    (_moe(), dict(dp=4, tp=2, ep=4, etp=4), r"etp \(4\) must divide tp \(2\)"),
    (_moe(), dict(dp=4, ep=4, etp=2), r"etp \(2\) must divide tp \(1\)"),
    (_moe(experts=0, top_k=None, expert_ffn_hidden=None), dict(dp=2, tp=2, etp=2),
     r"etp \(2\) applies to a mixture-of-experts model"),
    (_moe(expert_ffn_hidden=1026), dict(dp=2, tp=4, ep=2, etp=4),
     r"expert_ffn_hidden \(1026\) must be divisible by etp \(4\)"),
    # Megatron-Core's TransformerConfig: 'Bias in Moe is only supported when ETP==1'
    (_moe(bias=True), dict(dp=4, tp=2, ep=4, etp=2),
     r"etp \(2\) with a model with biases \(bias true\) is not supported"),
])
def test_etp_plans_that_break_a_rule_are_refused_in_one_line(model, kw, needle):
    with pytest.raises(PlanError, match=needle) as err:
        predict(model, HW, _plan(global_batch=int(kw["dp"]), **kw))
    assert "\n" not in str(err.value)


def test_the_cli_takes_etp_and_refuses_one_that_does_not_divide_tp(run_cli):
    import json

    base = ("predict", "--model", "mixtral-8x7b", "--hardware", HW, "--seq-len", "4096",
            "--dp", "4", "--tp", "2", "--ep", "4", "--pp", "4", "--global-batch", "64",
            "--zero", "1", "--sequence-parallel", "--json")
    ok = run_cli(*base, "--etp", "2")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["plan"]["etp"] == 2
    bad = run_cli(*base, "--etp", "4")
    assert bad.returncode == 4 and "etp (4) must divide tp (2)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_the_search_enumerates_etp_and_agrees_with_predict():
    import numpy as np

    from perfmodel.search import Scored, SearchRequest, search

    model, hw = _moe(), load_hardware(HW)
    req = SearchRequest(gpus=(8,), global_batch=8, max_micro_batch=1, pp=1, cp=1,
                        recompute="full", flash_attention=True)
    chunks: list = []
    result = search(model, hw, req, top=10**6, on_chunk=chunks.append)
    every = Scored.concat(chunks)
    tp, etp = every.plans.cols["tp"], every.plans.cols["etp"]
    assert set(etp.tolist()) == {1, 2, 4, 8} and bool(np.all(tp % etp == 0))
    assert {(int(a), int(b)) for a, b in zip(tp, etp, strict=True)} >= {(8, 8), (8, 2), (4, 1)}
    rng = np.random.default_rng(17)
    picked = [i for i in rng.permutation(len(every)) if every.evaluated[i] and etp[i] > 1][:20]
    assert picked
    for i in picked:
        expected = predict(model, hw, result.plan(every, int(i)))
        assert expected.plan.etp == etp[i]
        assert every.step_time_s[i] == pytest.approx(expected.step_time_s, rel=1e-9)
        assert every.memory_bytes[i] == pytest.approx(expected.memory_per_gpu_bytes, rel=1e-9)


def test_the_validation_job_runs_etp_and_refuses_what_megatron_refuses_in_one_line():
    """The torch job (workload) splits its experts over etp (tests/distributed/
    test_parallel_equivalence.py checks it against one process, tests/unit/test_parallel_ledger.py
    its collectives against this ledger); it refuses, naming the field, an etp that does not
    divide tp or the experts' width, and biases with etp > 1 (Megatron-Core's TransformerConfig:
    'Bias in Moe is only supported when ETP==1')."""
    from workload.settings import check_parallel

    m = {"experts": 16, "seq_len": S, "heads": 8, "kv_heads": 8, "expert_ffn_hidden": F}
    plan = {"dp": 4, "tp": 2, "ep": 4, "etp": 2, "sequence_parallel": True}
    assert check_parallel(m, plan) is None
    assert check_parallel(m, {"dp": 4, "ep": 4, "etp": 1}) is None
    for bad, needle in (({**plan, "etp": 4}, "etp (4) must divide tp (2)"),
                        ({**plan, "tp": 4, "etp": 4, "dp": 2},
                         "ep x etp (4 x 4 = 16) must divide tp x dp x cp (8)")):
        why = check_parallel(m, bad)
        assert why is not None and needle in why and "\n" not in why
    why = check_parallel({**m, "expert_ffn_hidden": 6}, {**plan, "tp": 4, "etp": 4, "dp": 4})
    assert why is not None and "etp (4) must divide expert_ffn_hidden (6)" in why
    why = check_parallel({**m, "bias": True}, plan)
    assert why is not None and "etp (2) with a model with biases" in why and "\n" not in why


# Where the expert groups lie. Megatron-Core (megatron/core/parallel_state.py at d98e8a64dd,
# initialize_model_parallel) builds the dense groups with RankGenerator(tp, cp, dp, pp, order
# "tp-cp-ep-dp-pp", ep 1) and the expert groups with a second RankGenerator over the same world:
# tp = expert_tensor_parallel_size, ep, dp = expert_data_parallel_size = world / (etp ep pp), cp 1,
# same order. A RankGenerator numbers ranks mixed-radix over its order, the first name fastest
# (generate_masked_orthogonal_rank_groups: rank = tp_rank + tp (ep_rank + ep (dp_rank + ...))),
# so in one pipeline stage (pp 1 here) rank 0's groups are:
def _megatron_rank0_groups(tp: int, cp: int, dp: int, etp: int, ep: int) -> dict[str, list[int]]:
    edp = tp * cp * dp // (etp * ep)
    return {"etp": list(range(etp)), "ep": [etp * e for e in range(ep)],
            "etp_ep": list(range(etp * ep)), "edp": [etp * ep * d for d in range(edp)]}


def _in_a_node(ranks: list[int], gpus_per_node: int) -> int:
    """The most ranks of a group one node holds (ranks numbered node by node)."""
    nodes = [r // gpus_per_node for r in ranks]
    return max(nodes.count(n) for n in set(nodes))


def _perfmodel_groups(plan: Plan, gpus_per_node: int) -> dict[str, tuple[int, int]]:
    groups = axis_ranks_per_node(plan_arrays(plan), gpus_per_node)
    return {a: (int(groups[a][0][0]), int(groups[a][1][0])) for a in ("etp", "ep", "etp_ep", "edp")}


def _placements() -> list[tuple[int, int, int, int, int]]:
    """(tp, cp, dp, etp, ep) of one stage that the plan rules accept (default placement tp,dp,pp:
    cp right outside tp, Megatron's dense order tp-cp-dp-pp)."""
    out = []
    for tp in (1, 2, 4, 8):
        for cp in (1, 2, 4):
            for dp in (1, 2, 4, 8):
                for etp in (e for e in (1, 2, 4, 8) if tp % e == 0):
                    for ep in (1, 2, 4, 8, 16):
                        try:
                            _plan(tp=tp, cp=cp, dp=dp, etp=etp, ep=ep, global_batch=dp)
                        except PlanError:
                            continue
                        out.append((tp, cp, dp, etp, ep))
    return out


def test_the_expert_groups_lie_where_megatron_cores_rank_generator_puts_them():
    cases = _placements()
    assert len(cases) > 100 and {c[3] for c in cases} == {1, 2, 4, 8}
    for tp, cp, dp, etp, ep in cases:
        plan = _plan(tp=tp, cp=cp, dp=dp, etp=etp, ep=ep, global_batch=dp)
        for g in (4, 8):
            megatron = {a: (len(r), _in_a_node(r, g))
                        for a, r in _megatron_rank0_groups(tp, cp, dp, etp, ep).items()}
            assert _perfmodel_groups(plan, g) == megatron, (tp, cp, dp, etp, ep, g)


def test_etp_1_is_the_tp_first_placement_and_etp_tp_puts_ep_on_dp_x_cp():
    # etp 1 (the placement of the validation job, 7c2473c): an ep group is ep consecutive ranks
    # of a stage's tp x cp x dp ranks flattened tp inner, then cp; the ranks holding the same
    # experts every ep-th. etp = tp (17's first etp version, Megatron's default): ep consecutive
    # of the dp x cp ranks flattened cp inner, each tp ranks apart; edp every tp ep-th rank.
    seen = set()
    for tp, cp, dp, etp, ep in _placements():
        world = tp * cp * dp
        if etp == 1:
            ep_g, edp_g = list(range(ep)), list(range(0, world, ep))
        elif etp == tp:
            ep_g, edp_g = [tp * k for k in range(ep)], list(range(0, world, tp * ep))
        else:
            continue
        seen.add(etp == 1)
        plan = _plan(tp=tp, cp=cp, dp=dp, etp=etp, ep=ep, global_batch=dp)
        for g in (4, 8):
            got = _perfmodel_groups(plan, g)
            assert got["ep"] == (ep, _in_a_node(ep_g, g)), (tp, cp, dp, etp, ep, g)
            assert got["edp"] == (len(edp_g), _in_a_node(edp_g, g)), (tp, cp, dp, etp, ep, g)
    assert seen == {True, False}


def test_tp_4_etp_2_ep_4_by_hand_from_megatrons_rank_generator():
    """dp 4 x tp 4, etp 2, ep 4 on 16 ranks, two 8-GPU nodes. Dense RankGenerator (tp 4, cp 1, dp
    4): tp groups [0..3], [4..7], ...; dp groups [0, 4, 8, 12], .... Expert RankGenerator (tp 2,
    ep 4, dp 16 / (2 x 4) = 2, order tp-ep-dp): rank = t + 2 (e + 4 d), so the etp groups are
    [0, 1], [2, 3], ...; the ep group of rank 0 [0, 2, 4, 6] (tp ranks 0 and 2 of dp ranks 0 and
    1); tp_ep [0..7]; edp [0, 8]. On 8-GPU nodes: etp 2, ep 4 and etp_ep 8 ranks in one node, edp
    one rank per node; on 4-GPU nodes the ep group [0, 2 | 4, 6] has 2 in a node."""
    plan = _plan(dp=4, tp=4, etp=2, ep=4, global_batch=4)
    plan.check(_moe())
    assert _perfmodel_groups(plan, 8) == {"etp": (2, 2), "ep": (4, 4), "etp_ep": (8, 8),
                                          "edp": (2, 1)}
    assert _perfmodel_groups(plan, 4) == {"etp": (2, 2), "ep": (4, 2), "etp_ep": (8, 4),
                                          "edp": (2, 1)}
    # its experts' gradients are reduced over the 2 edp ranks, across the nodes
    syncs = {r["axis"] for r in comm_ledger(_moe(), plan.replace(zero=1), HW)
             if r["phase"] == "step"}
    assert "edp" in syncs


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(dp=3, tp=8, etp=2, ep=6),
     r"ep \(6\) must divide or be divisible by tp / etp \(8 / 2 = 4\)"),
    (dict(dp=2, tp=4, etp=2, ep=8), r"ep x etp \(8 x 2 = 16\) must divide tp x dp x cp"),
    (dict(dp=4, cp=3, tp=4, etp=2, ep=4),
     r"ep \(4\) must divide or be divisible by tp / etp \(4 / 2 = 2\), and beyond it "
     r"ep / \(tp / etp\) and cp \(3\)"),
])
def test_an_ep_group_that_cuts_an_axis_unevenly_after_etp_is_refused(kw, needle):
    model = _moe(experts=48, hidden=1536, heads=24)
    with pytest.raises(PlanError, match=needle) as err:
        _plan(global_batch=int(kw["dp"]), **kw).check(model)
    assert "\n" not in str(err.value)


def test_the_search_enumerates_exactly_the_ep_etp_pairs_the_rules_allow():
    from perfmodel.search import SearchRequest, expert_degrees, expert_tensor_degrees

    # a length every tp x cp below divides (sequence parallelism splits each cp rank's tokens
    # over tp) and 2 cp chunks cut
    model = _moe(experts=48, hidden=1536, heads=24, seq_len=2 * 9 * 4 * 128)
    req = SearchRequest(gpus=(1,), global_batch=1)
    for tp in (1, 2, 4, 6, 12):
        for cp in (1, 2, 3, 4):
            for dp in (1, 2, 3, 4, 8):
                searched = {(ep, etp) for etp in expert_tensor_degrees(model, req, tp)
                            for ep in expert_degrees(model, req, dp, cp, tp, etp)}
                allowed = set()
                for etp in range(1, tp + 1):
                    for ep in range(1, 49):
                        try:
                            _plan(tp=tp, cp=cp, dp=dp, etp=etp, ep=ep,
                                  global_batch=dp).check(model)
                        except PlanError:
                            continue
                        allowed.add((ep, etp))
                assert searched == allowed, (tp, cp, dp)
