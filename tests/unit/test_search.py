"""The vectorised search against plain Python over predict, and its explanations."""

import dataclasses
import io
import json
import math

import numpy as np
import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.evaluate import family_of
from perfmodel.recommend import apply_what_if, recommend, sensitivities
from perfmodel.search import (
    SCHEDULES,
    Scored,
    SearchRequest,
    enumerate_plans,
    evaluate_all,
    search,
)
from perfmodel.strategy import Plan

MODEL = "llama2-7b"
HW = "dgx-h100"


@pytest.fixture(scope="module")
def small():
    """A small search, with every plan it enumerated (search hands them over chunk by chunk);
    without context parallelism (tests/unit/test_parallel_search.py searches cp and ep)."""
    model, hw = load_model(MODEL), load_hardware(HW)
    # 5,976 plans (16 GPUs: 13,760, 60 s of brute force): under SAMPLE_PLANS
    req = SearchRequest(gpus=(8,), global_batch=32, max_micro_batch=2, cp=1)
    chunks = []
    result = search(model, hw, req, top=10**6, on_chunk=chunks.append)
    return model, hw, req, result, Scored.concat(chunks)


def test_vectorised_search_agrees_with_brute_force_predict(small):
    model, hw, req, result, every = small
    assert result.enumerated == len(every) > 300
    brute_time, brute_mem = [], []
    for i in range(len(every)):
        p = predict(model, hw, result.plan(every, i))
        brute_time.append(p.step_time_s)
        brute_mem.append(p.memory_per_gpu_bytes)
    brute_time, brute_mem = np.array(brute_time), np.array(brute_mem)
    evaluated = every.evaluated
    assert result.evaluated == evaluated.sum()
    np.testing.assert_allclose(every.step_time_s[evaluated], brute_time[evaluated], rtol=1e-9)
    np.testing.assert_allclose(every.memory_bytes[evaluated], brute_mem[evaluated], rtol=1e-9)
    # the plans the memory bound pruned really do not fit
    capacity = result.capacity_bytes
    assert capacity == hw.memory_bytes * (1 - req.memory_margin)
    assert (brute_mem[~evaluated] > capacity).all()
    fits = brute_mem <= capacity
    np.testing.assert_array_equal(fits, every.fits)
    assert result.feasible == fits.sum()
    brute_order = np.flatnonzero(fits)[np.lexsort((brute_mem[fits], brute_time[fits]))]
    np.testing.assert_array_equal(brute_order, result.best.index)


def test_what_a_search_keeps_is_what_every_plan_gives(small):
    """The search keeps a running best list, Pareto front, sample and the fastest plan that does
    not fit: the same as those taken over every plan at once."""
    from perfmodel.plot import pareto_front

    _, _, _, result, every = small
    done = every.take(np.flatnonzero(every.evaluated))
    front = pareto_front(done.step_time_s, done.memory_bytes)
    np.testing.assert_array_equal(result.front.index, done.index[front])
    assert len(result.sample) == len(done)  # fewer than SAMPLE_PLANS: all of them
    np.testing.assert_array_equal(result.sample.index, done.index)
    unfit = done.take(np.flatnonzero(~done.fits))
    fastest = np.argmin(unfit.step_time_s)
    assert result.fastest_unfit.index[0] == unfit.index[fastest]
    best = result.best.step_time_s[0]
    assert result.unfit_faster == (unfit.step_time_s < best * (1 - 1e-9)).sum()


def test_chunks_give_the_same_answer_as_one_pass(monkeypatch):
    """Chunks of 1,000 plans: the same best plans, front and counts as one chunk."""
    import perfmodel.search as S

    model, hw = load_model(MODEL), load_hardware(HW)
    req = SearchRequest(gpus=(16,), global_batch=64)
    chunks = []
    whole = search(model, hw, req, top=50, on_chunk=chunks.append)
    every = Scored.concat(chunks)
    monkeypatch.setattr(S, "CHUNK_PLANS", 1000)
    monkeypatch.setattr(S, "SAMPLE_PLANS", 500)
    parts = search(model, hw, req, top=50)
    assert whole.enumerated > 10_000
    for field in ("enumerated", "evaluated", "feasible", "unfit_faster"):
        assert getattr(parts, field) == getattr(whole, field), field
    np.testing.assert_array_equal(parts.best.index, whole.best.index)
    np.testing.assert_array_equal(parts.front.index, whole.front.index)
    np.testing.assert_array_equal(parts.fastest_unfit.index, whole.fastest_unfit.index)
    # a sample of 500 distinct evaluated plans, in order, with the numbers of the one-pass search
    sample = parts.sample
    assert len(sample) == 500 and (np.diff(sample.index) > 0).all()
    np.testing.assert_array_equal(sample.step_time_s, every.step_time_s[sample.index])
    np.testing.assert_array_equal(sample.memory_bytes, every.memory_bytes[sample.index])
    assert np.isfinite(sample.step_time_s).all()


def test_grid_search_agrees_with_predict_when_a_grid_axis_spans_nodes():
    # Regression: the search put 2.5D plans whose grid axis c spans two nodes 0.4-0.8% off predict.
    # A scope left open adds 1e30 (1 - I_mixed) to the hierarchical option of a Min; summed in
    # another order, 1e30 + t - 1e30 lost t.
    model, hw = load_model(MODEL), load_hardware(HW)
    chunks = []
    result = search(model, hw, SearchRequest(gpus=(16,), global_batch=16, tp=16, tp_layout="2.5d"),
                    on_chunk=chunks.append)
    every = Scored.concat(chunks)
    evaluated = np.flatnonzero(every.evaluated)
    assert len(evaluated) >= 4
    brute = [predict(model, hw, result.plan(every, i)).step_time_s for i in evaluated]
    np.testing.assert_allclose(every.step_time_s[evaluated], brute, rtol=1e-9)


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
    model, _, req, result, every = small
    seen = set()
    for i in range(len(every)):
        plan = result.plan(every, i).check(model)
        key = tuple(sorted(plan.to_dict().items()))
        assert key not in seen
        seen.add(key)
        assert (plan.gpus, plan.global_batch) == (8, 32)
        assert plan.micro_batch <= req.max_micro_batch


def test_pins_are_respected():
    model = load_model(MODEL)
    plans = enumerate_plans(model, SearchRequest(gpus=(64,), global_batch=64, tp=8, zero=1,
                                                 recompute="selective"))
    assert len(plans) > 0
    assert (plans.cols["tp"] == 8).all() and (plans.cols["recompute"] == 1).all()
    assert set(plans.cols["zero"]) == {1}


def test_a_framework_s_stages_and_schedules_bound_the_search():
    """recommend --emit-config searches only what the framework runs (Megatron: ZeRO 0/1/3,
    1f1b and interleaved), so that the best plan it writes is the best one it can run."""
    model = load_model(MODEL)
    free = enumerate_plans(model, SearchRequest(gpus=(16,), global_batch=32, pp=2))
    bound = enumerate_plans(model, SearchRequest(gpus=(16,), global_batch=32, pp=2,
                                                 zero_stages=(0, 1, 3),
                                                 schedules=("1f1b", "interleaved")))
    assert 2 in set(free.cols["zero"]) and 2 not in set(bound.cols["zero"])
    names = SCHEDULES
    assert {names[c] for c in set(free.cols["schedule"])} > {"1f1b", "interleaved"}
    assert {names[c] for c in set(bound.cols["schedule"])} == {"1f1b", "interleaved"}
    with pytest.raises(PlanError, match="zero_stages"):
        SearchRequest(gpus=(16,), global_batch=32, zero_stages=(4,))


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
    model, hw, req, _, _ = small
    rec = recommend(model, hw, req, top=3)
    best = rec.top[0]
    assert best.step_time_s <= rec.top[1].step_time_s <= rec.top[2].step_time_s
    assert any(line.startswith("compute efficiency") for line in rec.explanation["binding"])
    curve = rec.explanation["micro_batch_curve"]
    assert [row["micro_batch"] for row in curve] == sorted(row["micro_batch"] for row in curve)
    assert rec.explanation["runner_up"]["slower_by_s"] >= 0


def test_the_runner_up_is_the_first_plan_that_does_not_tie():
    """Plans that differ only where the model charges nothing (here the placement: dp 2 and
    tp 4 on one 8-GPU node lie on NVLink in either order) tie with the best: they are counted,
    and the runner-up is the first plan that differs in time or memory."""
    model, hw = load_model(MODEL), load_hardware(HW)
    req = SearchRequest(gpus=(8,), global_batch=8, tp=4, pp=1, micro_batch=1, cp=1,
                        recompute="none", zero=1, sequence_parallel=True)
    rec = recommend(model, hw, req, top=6)
    ru = rec.explanation["runner_up"]
    ties = [p for p in rec.top[1:] if p.step_time_s == rec.top[0].step_time_s
            and p.memory_per_gpu_bytes == rec.top[0].memory_per_gpu_bytes]
    assert ties and ru["ties"] == len(ties)
    assert ru["ties_differ_in"] == ["placement"]
    runner = rec.top[ru["rank"] - 1]
    assert ru["slower_by_s"] == runner.step_time_s - rec.top[0].step_time_s
    assert (ru["slower_by_s"], ru["memory_delta_bytes"]) != (0, 0)


def test_objectives_rank_by_time_to_train_and_cost():
    model, hw = load_model(MODEL), load_hardware(HW)
    req = SearchRequest(gpus=(8, 16), global_batch=32, objective="cost", gpu_hour_price=2.0,
                        tokens=1e9, max_micro_batch=2)
    result = search(model, hw, req)
    best = result.best
    tokens_per_step = 32 * model.seq_len
    steps = math.ceil(1e9 / tokens_per_step)  # whole steps: the last tokens take one of their own
    expected = best.step_time_s[0] * steps / 3600 * best.plans.cols["gpus"][0] * 2.0
    assert best.objective[0] == pytest.approx(expected)


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
    assert sens["intra_node.latency_s"] >= 0 and sens["inter_node.bandwidth_bytes_per_s"] <= 0
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
    # the default memory margin, 10% of 80 GiB, and the 2 GiB the preset reserves
    assert data["memory_margin"] == 0.1
    assert data["memory_limit_bytes"] == 0.9 * 80 * 2**30
    assert all(p["memory_per_gpu_bytes"] <= data["memory_limit_bytes"] for p in data["plans"])
    assert len(data["plans"]) == 3 and "plan" in data["plans"][0] and "mfu" in data["plans"][0]
    assert (tmp_path / "front.png").stat().st_size > 1000
    assert len((tmp_path / "all.csv").read_text().splitlines()) == data["enumerated"] + 1
    table = run_cli("recommend", "--model", MODEL, "--hardware", HW, "--gpus", "16",
                    "--global-batch", "32", "--what-if", "intra_node.bandwidth_bytes_per_s=0.5x")
    assert table.returncode == 0 and "what binds it" in table.stdout and "what if" in table.stdout
    assert "memory limit 72.0 GiB per GPU: memory_margin 10%" in table.stdout
    none = run_cli("recommend", "--model", "llama3-405b", "--hardware", HW, "--gpus", "8",
                   "--global-batch", "8")
    assert none.returncode == 4 and "no plan fits in memory" in none.stdout


def test_csv_of_a_search_that_fails_leaves_no_file(monkeypatch, tmp_path):
    """The CSV is written as the search goes (no limit on its rows, memory bounded), and only
    a finished search replaces the file."""
    from click.testing import CliRunner

    import perfmodel.recommend as R
    import perfmodel.search as S
    from perfmodel.cli import cli

    monkeypatch.setattr(S, "CHUNK_PLANS", 500)
    real, calls = R.PlanCsv.__call__, []

    def second_chunk_breaks(self, rows):
        calls.append(len(rows))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(self, rows)

    monkeypatch.setattr(R.PlanCsv, "__call__", second_chunk_breaks)
    target = tmp_path / "all.csv"
    target.write_text("old")
    out = CliRunner().invoke(cli, ["recommend", "--model", MODEL, "--hardware", HW, "--gpus", "16",
                                   "--global-batch", "32", "--csv", str(target)])
    assert out.exit_code != 0 and len(calls) == 2 and calls[0] <= 500
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["all.csv"]


def test_csv_rows_come_chunk_by_chunk_with_one_header(monkeypatch):
    import perfmodel.search as S
    from perfmodel.recommend import PlanCsv

    monkeypatch.setattr(S, "CHUNK_PLANS", 500)
    buffer = io.BytesIO()
    table = PlanCsv(buffer)
    result = search(load_model(MODEL), load_hardware(HW),
                    SearchRequest(gpus=(16,), global_batch=32, max_micro_batch=4), on_chunk=table)
    import pandas as pd

    text = buffer.getvalue().decode()
    assert sum(line.startswith("gpus,") for line in text.splitlines()) == 1  # one header
    frame = pd.read_csv(io.StringIO(text))
    assert len(frame) == result.enumerated > 1000  # every plan, from chunks of 500
    assert frame["evaluated"].sum() == result.evaluated < len(frame)
    # a plan pruned by its model states has no step time, and does not fit
    pruned = frame[~frame["evaluated"]]
    assert pruned["step_time_s"].isna().all() and not pruned["fits_in_memory"].any()
    assert frame["fits_in_memory"].sum() == result.feasible


def test_a_search_that_evaluates_nothing_says_why():
    model, hw = load_model("gpt3-175b"), load_hardware(HW)
    # no split: 7 GPUs, 96 heads and layers, a batch of 8
    rec = recommend(model, hw, SearchRequest(gpus=(7,), global_batch=8))
    info = rec.explanation["infeasible"]
    assert rec.result.enumerated == 0 and info["binding"] == "divisibility"
    assert "7 GPUs cannot be split" in info["reason"] and "heads (96)" in info["reason"]
    # every plan pruned by its model states alone: the leanest three layouts, named
    rec = recommend(model, hw, SearchRequest(gpus=(8,), global_batch=8))
    info = rec.explanation["infeasible"]
    assert rec.result.evaluated == 0 and rec.result.enumerated > 0
    assert "for its model states alone" in info["reason"]
    assert [n["bound_only"] for n in info["nearest"]] == [True] * 3
    assert len({n["plan"] for n in info["nearest"]}) == 3


def test_the_search_encodes_each_plan_as_predict_does(small):
    """One plan encoder (perfmodel.encode): the values the search gives the formulas for a plan
    (its row of each group of columns) are those predict gives it alone (values_of)."""
    from perfmodel.encode import PLAN_SYMBOLS, values_of
    from perfmodel.search import group_values, scalar_values

    model, hw, req, result, every = small
    groups = group_values(hw, every.plans)
    scalars = scalar_values(model, hw, req)
    assert not PLAN_SYMBOLS & set(scalars)  # a plan's symbols come from its columns only
    for i in np.linspace(0, len(every) - 1, 40).astype(int):
        alone = values_of(model, hw, result.plan(every, i))
        searched = dict(scalars)
        for g in groups.values():
            searched.update({k: float(v[g.codes[i]]) for k, v in g.args.items()})
        assert searched == alone


def test_a_symbol_without_a_value_is_an_internal_error_naming_it():
    """Never a silent default: a compiled family given no value for one of its symbols refuses."""
    from perfmodel.errors import InternalError
    from perfmodel.evaluate import compile_family, family_of, values_of
    from perfmodel.strategy import Plan

    model, hw = load_model(MODEL), load_hardware(HW)
    plan = Plan(gpus=8, tp=8, global_batch=8)
    compiled = compile_family(family_of(model, hw, plan))
    values = values_of(model, hw, plan)
    assert compiled(values)["step_time"] > 0
    del values["inter_bandwidth"]
    with pytest.raises(InternalError, match="'inter_bandwidth'"):
        compiled(values)


def test_a_symbol_without_a_value_is_an_internal_error_in_the_search_too(small):
    from perfmodel.errors import InternalError
    from perfmodel.search import GROUPS, group_values, scalar_values
    from perfmodel.staged import compile_staged, run

    model, hw, req, _, every = small
    family = dataclasses.replace(family_of(model, hw, Plan(gpus=1)), tp_layout="1d")
    plans = every.plans.take(np.flatnonzero(every.plans.cols["tp_layout"] == 0))
    groups = group_values(hw, plans)
    scalars = scalar_values(model, hw, req)
    staged = compile_staged(family, "search", GROUPS)
    assert np.isfinite(run(staged, scalars, groups, len(plans))["step_time"]).all()
    del scalars["peak_flops_per_s"]
    with pytest.raises(InternalError, match="'peak_flops_per_s'"):
        run(staged, scalars, groups, len(plans))


@pytest.mark.parametrize(("pins", "needle"), [
    (dict(tp_comm_overlap=True, sequence_parallel=False),
     "tp_comm_overlap needs sequence_parallel"),
    (dict(overlap_param_gather=True, zero=0), "overlap_param_gather needs zero >= 1"),
    (dict(ep=2), "applies to a mixture-of-experts model"),
])
def test_recommend_names_the_rule_its_pins_break(pins, needle):
    """A request whose pinned options leave no valid plan: the reason is the rule Plan.check
    names for a plan of those pins (recommend used to list the divisibility rules, all of
    which held)."""
    req = SearchRequest(gpus=(16,), global_batch=64, **pins)
    rec = recommend(load_model("llama3-8b"), load_hardware("dgx-h100"), req)
    assert not rec.top and needle in rec.explanation["infeasible"]["reason"]


def test_a_grid_block_of_every_combination_is_the_masked_one():
    """_Grid.block's shortcut for an all-true mask (a skeleton: each column repeated and tiled)
    gives the rows, in the order, that its general path (unravelled flat indices) gives."""
    from perfmodel.search import _Grid

    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 5, size=rng.integers(1, 6))
        axes = tuple({f"c{i}_{j}": rng.integers(0, 100, size=int(size))
                      for j in range(rng.integers(1, 3))} for i, size in enumerate(sizes))
        grid = _Grid({"gpus": 8}, axes)
        at = tuple(sorted(int(i) for i in rng.choice(len(axes), rng.integers(1, len(axes) + 1),
                                                     replace=False)))
        first = bool(rng.integers(0, 2))
        ones = np.ones([grid.shape[i] for i in at], dtype=bool)
        fast = grid.block(at, ones, first)
        # what the general path gives: every combination of the rows, first axis slowest
        shape = [grid.shape[i] if (i in at or not first) else 1 for i in range(len(axes))]
        index = np.unravel_index(np.arange(math.prod(shape)), shape)
        assert fast is not None and fast.n == math.prod(shape)
        for i, axis in enumerate(axes):
            for name, values in axis.items():
                assert np.array_equal(fast.cols[name], values[index[i]])
