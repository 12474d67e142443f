"""The vectorised search against plain Python over predict, and its explanations."""

import json

import numpy as np
import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.recommend import apply_what_if, recommend, sensitivities
from perfmodel.search import SearchRequest, enumerate_plans, evaluate_all, search

MODEL = "llama2-7b"
HW = "dgx-h100"


@pytest.fixture(scope="module")
def small():
    model, hw = load_model(MODEL), load_hardware(HW)
    req = SearchRequest(gpus=(16,), global_batch=32, max_micro_batch=4)
    return model, hw, req, search(model, hw, req)


def test_vectorised_search_agrees_with_brute_force_predict(small):
    model, hw, req, result = small
    assert result.enumerated > 300
    brute_time, brute_mem = [], []
    for i in range(result.enumerated):
        p = predict(model, hw, result.plan(i))
        brute_time.append(p.step_time_s)
        brute_mem.append(p.memory_per_gpu_bytes)
    brute_time, brute_mem = np.array(brute_time), np.array(brute_mem)
    evaluated = np.isfinite(result.step_time_s)
    np.testing.assert_allclose(result.step_time_s[evaluated], brute_time[evaluated], rtol=1e-9)
    np.testing.assert_allclose(result.memory_bytes[evaluated], brute_mem[evaluated], rtol=1e-9)
    # the plans the memory bound pruned really do not fit
    assert (brute_mem[~evaluated] > hw.memory_bytes).all()
    fits = brute_mem <= hw.memory_bytes
    np.testing.assert_array_equal(fits, result.feasible)
    brute_order = np.flatnonzero(fits)[np.lexsort((brute_mem[fits], brute_time[fits]))]
    np.testing.assert_array_equal(brute_order, result.order)


def test_grid_search_agrees_with_predict_when_a_grid_axis_spans_nodes():
    # Regression: the search put 2.5D plans whose grid axis c spans two nodes 0.4-0.8% off predict.
    # A scope left open adds 1e30 (1 - I_mixed) to the hierarchical option of a Min; summed in
    # another order, 1e30 + t - 1e30 lost t.
    model, hw = load_model(MODEL), load_hardware(HW)
    result = search(model, hw, SearchRequest(gpus=(16,), global_batch=16, tp=16, tp_layout="2.5d"))
    evaluated = np.flatnonzero(np.isfinite(result.step_time_s))
    assert len(evaluated) >= 4
    brute = [predict(model, hw, result.plan(i)).step_time_s for i in evaluated]
    np.testing.assert_allclose(result.step_time_s[evaluated], brute, rtol=1e-9)


def test_shared_terms_give_each_plan_what_it_gets_alone():
    # A large search works out each term once per distinct value of the columns it depends on
    # (perfmodel.staged); a plan evaluated alone computes every term for itself.
    model, hw = load_model("gpt3-175b"), load_hardware("dgx-a100-80gb")
    req = SearchRequest(gpus=(1024,), global_batch=1536)
    plans = enumerate_plans(model, req)
    together = evaluate_all(model, hw, plans, req, np.inf)
    rng = np.random.default_rng(6)
    for layout in range(4):
        rows = np.flatnonzero(plans.cols["tp_layout"] == layout)
        for i in rng.choice(rows, 10, replace=False):
            alone = evaluate_all(model, hw, plans.take(np.array([i])), req, np.inf)
            np.testing.assert_allclose([x[0] for x in alone[:3]], [x[i] for x in together[:3]],
                                       rtol=1e-12)


def test_every_enumerated_plan_is_valid_and_distinct(small):
    model, _, req, result = small
    seen = set()
    for i in range(result.enumerated):
        plan = result.plan(i).check(model)
        key = tuple(sorted(plan.to_dict().items()))
        assert key not in seen
        seen.add(key)
        assert plan.gpus == 16 and plan.global_batch == 32 and plan.micro_batch <= 4


def test_pins_are_respected():
    model = load_model(MODEL)
    plans = enumerate_plans(model, SearchRequest(gpus=(64,), global_batch=64, tp=8, zero=1,
                                                 recompute="selective"))
    assert len(plans) > 0
    assert (plans.cols["tp"] == 8).all() and (plans.cols["recompute"] == 1).all()
    assert set(plans.cols["zero"]) == {1}


def test_contradicting_pins_explain_the_rule():
    model, hw = load_model(MODEL), load_hardware(HW)
    rec = recommend(model, hw, SearchRequest(gpus=(24,), global_batch=24, tp=16))
    assert rec.top == []
    info = rec.explanation["infeasible"]
    assert info["binding"] == "pins" and "without the pins" in info["reason"]


def test_nothing_fits_names_memory_and_the_nearest_plans():
    model, hw = load_model("llama3-405b"), load_hardware(HW)
    rec = recommend(model, hw, SearchRequest(gpus=(8,), global_batch=8))
    info = rec.explanation["infeasible"]
    assert info["binding"] == "memory" and len(info["nearest"]) == 3
    assert info["nearest"][0]["memory_per_gpu_bytes"] > hw.memory_bytes


def test_explanation_of_the_best(small):
    model, hw, req, _ = small
    rec = recommend(model, hw, req, top=3)
    best = rec.top[0]
    assert best.step_time_s <= rec.top[1].step_time_s <= rec.top[2].step_time_s
    assert any(line.startswith("compute efficiency") for line in rec.explanation["binding"])
    curve = rec.explanation["micro_batch_curve"]
    assert [row["micro_batch"] for row in curve] == sorted(row["micro_batch"] for row in curve)
    assert rec.explanation["runner_up"]["slower_by_s"] >= 0


def test_objectives_rank_by_time_to_train_and_cost():
    model, hw = load_model(MODEL), load_hardware(HW)
    req = SearchRequest(gpus=(8, 16), global_batch=32, objective="cost", gpu_hour_price=2.0,
                        tokens=1e9, max_micro_batch=2)
    result = search(model, hw, req)
    best = result.order[0]
    tokens_per_step = 32 * model.seq_len
    expected = result.step_time_s[best] * 1e9 / tokens_per_step / 3600 * result.plans.cols["gpus"][best] * 2.0
    assert result.objective[best] == pytest.approx(expected)


def test_what_if_and_sensitivities():
    hw = load_hardware(HW)
    faster = apply_what_if(hw, "inter_node.bandwidth_bytes_per_s=2x")
    assert faster.inter_node.bandwidth_bytes_per_s == 2 * hw.inter_node.bandwidth_bytes_per_s
    assert apply_what_if(hw, "peak_flops_per_s=2x").peak("bf16") == 2 * hw.peak("bf16")
    with pytest.raises(PlanError, match="unknown"):
        apply_what_if(hw, "inter_node.speed=2x")
    with pytest.raises(PlanError, match="FIELD=VALUE"):
        apply_what_if(hw, "nonsense")
    from perfmodel import Plan

    plan = Plan(gpus=16, dp=2, tp=8, global_batch=16)
    sens = sensitivities(load_model(MODEL), hw, plan)
    # the step time falls with more FLOP/s or bandwidth, rises with latency; never below -1
    assert -1 <= sens["peak_flops_per_s"] < 0
    assert sens["intra_latency_s"] >= 0 and sens["inter_bandwidth"] <= 0
    # the derivative agrees with a 1% finite difference
    t1 = predict(MODEL, hw, plan).step_time_s
    t2 = predict(MODEL, apply_what_if(hw, "peak_flops_per_s=1.01x"), plan).step_time_s
    assert (t2 / t1 - 1) / 0.01 == pytest.approx(sens["peak_flops_per_s"], rel=0.05)


def test_recommend_cli(run_cli, tmp_path):
    out = run_cli("recommend", "--model", MODEL, "--hardware", HW, "--gpus", "16", "--global-batch",
                  "32", "--json", "--csv", tmp_path / "all.csv", "--plot", tmp_path / "front.png",
                  "--top", "3")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"plans", "evaluated", "feasible", "search_time_s"} <= set(data)
    assert len(data["plans"]) == 3 and "plan" in data["plans"][0] and "mfu" in data["plans"][0]
    assert (tmp_path / "front.png").stat().st_size > 1000
    assert len((tmp_path / "all.csv").read_text().splitlines()) == data["enumerated"] + 1
    table = run_cli("recommend", "--model", MODEL, "--hardware", HW, "--gpus", "16", "--global-batch",
                    "32", "--what-if", "intra_node.bandwidth_bytes_per_s=0.5x")
    assert table.returncode == 0 and "what binds it" in table.stdout and "what if" in table.stdout
    none = run_cli("recommend", "--model", "llama3-405b", "--hardware", HW, "--gpus", "8",
                   "--global-batch", "8")
    assert none.returncode == 4 and "no plan fits in memory" in none.stdout
