"""The search's branch and bound (search(prune=True)): the step time's lower bounds never exceed
the step time, and a pruned search answers as the full one does."""

import dataclasses

import numpy as np
import pytest

from perfmodel import encode, load_hardware, load_model
from perfmodel import search as S
from perfmodel.search import Evaluator, SearchRequest, plan_chunks, search
from perfmodel.staged import compile_staged, run
from perfmodel.strategy import Dtype, Objective

# (model, hardware, request): dense and MoE, fp8, cp, a pipeline with interleaving and zero
# bubble, CPU-like synchronous ranks (tiny-gpt on a GPU preset is host-bound instead)
CASES = [
    ("llama2-7b", "dgx-h100", dict(gpus=(16,), global_batch=64, flash_attention=True)),
    ("gpt3-175b", "dgx-a100-80gb", dict(gpus=(64,), global_batch=128)),
    ("mixtral-8x7b", "dgx-h100", dict(gpus=(32,), global_batch=64, dtype=Dtype.FP8,
                                       max_cp=2)),
    ("qwen3-30b-a3b", "gb200-nvl72", dict(gpus=(16,), global_batch=64, flash_attention=True,
                                           max_cp=4)),
    ("tiny-gpt", "dgx-h100", dict(gpus=(8,), global_batch=32)),
    # pipelines of 3, 6 and 12 uneven stages (32 layers), every schedule: the bound holds their
    # fill and drain (evaluate._bubble_bound)
    ("llama2-7b", "dgx-h100", dict(gpus=(24,), global_batch=48, uneven_stages=True)),
]


def _bounds_and_steps(name, hw_name, fields, columns=()):
    """(both lower bounds, step time) of every plan of the request that passes the memory bound,
    evaluated family by family as the search does; and the plans' `columns`."""
    model, hw = load_model(name), load_hardware(hw_name)
    req = SearchRequest(**fields)
    ev = Evaluator(model, hw, req)
    out = []
    for plans in plan_chunks(model, req):
        groups = S.group_values(hw, plans)
        for family, rows, part in ev._by_layout(groups):
            n = len(part["topology"].codes)
            plan = run(compile_staged(family, "lower", S.GROUPS), ev.scalars, part, n)
            grid = run(compile_staged(family, "lower_grid", S.GROUPS), ev.scalars, part, n)
            full = run(compile_staged(family, "search", S.GROUPS), ev.scalars, part, n)
            out.append((plan["step_time_lb"], grid["step_time_lb_grid"], full["step_time"],
                        *(plans.cols[c][rows] for c in columns)))
    return [np.concatenate(x) for x in zip(*out, strict=True)]


@pytest.mark.parametrize("name, hw_name, fields", CASES, ids=[c[0] for c in CASES])
def test_lower_bounds_never_exceed_the_step_time(name, hw_name, fields):
    plan_lb, grid_lb, step = _bounds_and_steps(name, hw_name, fields)
    ok = np.isfinite(step)
    assert ok.sum() > 500
    # the per-plan bound reads more terms than the grid's: at least as tight
    assert (grid_lb[ok] <= plan_lb[ok] * (1 + 1e-12)).all()
    assert (plan_lb[ok] <= step[ok] * (1 + 1e-12)).all()
    assert (plan_lb[ok] > 0).all()
    # and tight enough to prune: on some plans within 20% of the step time, host-bound ones
    # included (tiny-gpt on H100; qwen3-30b-a3b's 128 small experts on GB200, Grace's 24.1 us
    # an op): the per-plan bound takes each stage's host time (evaluate.HOST_FLOOR_BOUNDS;
    # before 2026-12-05 those two reached 0.09 and 0.77 of it at best)
    assert np.max(plan_lb[ok] / step[ok]) > 0.8


def test_the_bounds_hold_the_pipelines_fill_and_drain():
    # the bubble reads every stage's time, so the overlaps' groups too: before 2026-12-06 both
    # bounds dropped it, and a pipeline's bound was its stages' alone (median 0.37 to 0.52 of the
    # step time at pp 4 to 12 with GPipe and 1F1B); now a bound on it from the stages' bounds
    # (evaluate._bubble_bound), uneven splits (pp 3, 6, 12) and zero bubble (0 where its fill
    # reads an overlap) included
    plan_lb, grid_lb, step, pp, schedule = _bounds_and_steps(*CASES[-1], columns=("pp",
                                                                                  "schedule"))
    ok = np.isfinite(step)
    assert set(pp[ok]) >= {3, 4, 6, 8, 12}
    assert (plan_lb[ok] <= step[ok] * (1 + 1e-12)).all()
    flushed = np.isin(schedule, [S.SCHEDULES.index(s) for s in ("gpipe", "1f1b")])
    for stages in (3, 4, 6, 8, 12):
        rows = ok & flushed & (pp == stages)
        assert rows.sum() > 100
        assert np.median(plan_lb[rows] / step[rows]) > 0.85
        assert np.median(grid_lb[rows] / step[rows]) > 0.85


def _compare(model, hw, req, top, monkeypatch, probe=64):
    """The same search unpruned and pruned, the pruner's thresholds lowered so that a small
    request is pruned at both levels (grids and plans)."""
    full = search(model, hw, req, top=top)
    monkeypatch.setattr(S, "PRUNE_PLANS", 0)
    monkeypatch.setattr(S, "PROBE_PLANS", probe)
    pruned = search(model, hw, req, top=top, prune=True)
    assert full.skipped == 0 and pruned.skipped > 0
    assert pruned.enumerated == full.enumerated  # every plan counted, evaluated or skipped
    assert pruned.evaluated + pruned.skipped >= full.evaluated
    assert pruned.evaluated < full.evaluated
    # the same best plans, in the same order, with the same numbers
    for a, b in ((full.best, pruned.best),):
        assert len(a) == len(b) == top
        np.testing.assert_array_equal(a.step_time_s, b.step_time_s)
        np.testing.assert_array_equal(a.memory_bytes, b.memory_bytes)
        for i in range(top):
            assert full.plan(a, i) == pruned.plan(b, i)
    # what explains the best: the faster plans that do not fit, and the fastest of them
    assert pruned.unfit_faster == full.unfit_faster
    assert pruned.unfit_faster_at_least == full.unfit_faster_at_least
    if full.unfit_faster:
        assert full.plan(full.fastest_unfit, 0) == pruned.plan(pruned.fastest_unfit, 0)
    return full, pruned


@pytest.mark.parametrize("name, hw_name, fields", CASES[:4] + CASES[-1:],
                         ids=[c[0] for c in CASES[:4] + CASES[-1:]])
def test_a_pruned_search_ranks_the_same_best_plans(name, hw_name, fields, monkeypatch):
    _compare(load_model(name), load_hardware(hw_name), SearchRequest(**fields), 5, monkeypatch)


@pytest.mark.parametrize("name, hw_name, fields", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_the_plans_left_after_the_probe_in_small_batches_rank_the_same(name, hw_name, fields,
                                                                       monkeypatch):
    # each batch's best plans tighten what the next batches must reach; the family's probe and
    # batches meet the search's probe plans again: counted twice they would cut plans that rank
    # (llama2-7b's selective-recompute plan, 4th, was cut so before 2026-12-01)
    monkeypatch.setattr(S, "TIGHTEN_PLANS", 512)
    _compare(load_model(name), load_hardware(hw_name), SearchRequest(**fields), 5, monkeypatch)


def test_a_probe_as_large_as_the_search(monkeypatch):
    # the grids' probe then holds the best plans, and each chunk's plans, ordered by their bound,
    # are evaluated in one pass: their numbers land on their own rows
    _compare(load_model("llama2-7b"), load_hardware("dgx-h100"),
             SearchRequest(gpus=(16,), global_batch=64), 5, monkeypatch, probe=10**7)


def test_a_probe_holding_the_best_across_many_chunks(monkeypatch):
    # the probe's best plans are met again by the search, chunk after chunk: counted twice they
    # would make the objective to reach look lower than the top-th best and cut plans that rank
    monkeypatch.setattr(S, "CHUNK_PLANS", 512)
    _compare(load_model("llama2-7b"), load_hardware("dgx-h100"),
             SearchRequest(gpus=(32,), global_batch=64, flash_attention=True), 20, monkeypatch,
             probe=4096)


def test_pruned_by_the_price_of_one_gpu_count(monkeypatch):
    # the objective (the price of a token budget) is the step time times one factor
    req = SearchRequest(gpus=(16,), global_batch=64, objective=Objective.COST, tokens=1e9,
                        gpu_hour_price=2.0, flash_attention=True)
    _compare(load_model("llama2-7b"), load_hardware("dgx-h100"), req, 3, monkeypatch)


def test_no_pruning_by_the_price_of_several_gpu_counts(monkeypatch):
    # over several GPU counts the cheapest plan need not be the fastest: a plan slower than the
    # best ones by price can be faster than the best by step time, and the count of faster plans
    # that do not fit would miss it; such a search is not pruned
    monkeypatch.setattr(S, "PRUNE_PLANS", 0)
    req = SearchRequest(gpus=(8, 16), global_batch=64, objective=Objective.COST, tokens=1e9,
                        gpu_hour_price=2.0)
    result = search(load_model("llama2-7b"), load_hardware("dgx-h100"), req, top=3, prune=True)
    assert result.skipped == 0 and result.unfit_faster > 0


def test_nothing_fits_nothing_is_pruned(monkeypatch):
    # with no plan that fits there is no best to beat: every plan that passes the memory bound
    # is evaluated, and the nearest plans are the full search's
    model, hw = load_model("gpt3-175b"), load_hardware("dgx-h100")
    req = SearchRequest(gpus=(8,), global_batch=8)
    full = search(model, hw, req, top=5)
    monkeypatch.setattr(S, "PRUNE_PLANS", 0)
    pruned = search(model, hw, req, top=5, prune=True)
    assert not len(full.best) and not len(pruned.best)
    assert pruned.skipped == 0 and pruned.evaluated == full.evaluated
    np.testing.assert_array_equal(full.nearest.memory_bytes, pruned.nearest.memory_bytes)


def test_the_pareto_plot_refuses_a_pruned_search(monkeypatch):
    from perfmodel.errors import DataError
    from perfmodel.plot import pareto_axes

    monkeypatch.setattr(S, "PRUNE_PLANS", 0)
    result = search(load_model("llama2-7b"), load_hardware("dgx-h100"),
                    SearchRequest(gpus=(16,), global_batch=64), top=5, prune=True)
    assert result.skipped
    with pytest.raises(DataError, match="skipped .* plans by their step time's lower bound"):
        pareto_axes(result)


def test_the_grid_bound_reads_neither_zero_nor_the_overlaps():
    # what lets a grid's skeleton stand for its plans: the bound's groups (perfmodel.staged)
    model, hw = load_model("llama2-7b"), load_hardware("dgx-h100")
    ev = Evaluator(model, hw, SearchRequest(gpus=(16,), global_batch=64))
    for layout in (0, *encode.LAYOUT_FAMILIES["2d"]):
        groups = ev.bound_groups(layout)
        assert "micro_batch" in groups and "topology" in groups
        assert not {"zero", "overlap"} & groups
    family = dataclasses.replace(ev.universal, tp_layout="1d")
    staged = compile_staged(family, "lower", S.GROUPS)
    assert "overlap" not in S.output_groups(staged, "step_time_lb")


def test_lower_bounds_on_synchronous_ranks(tmp_path):
    # CPU ranks add host and device time (no smooth maximum): the bounds still hold
    spec = tmp_path / "sync.yaml"
    spec.write_text("base: dgx-h100\nasynchronous_device: false\n")
    plan_lb, grid_lb, step = _bounds_and_steps("llama2-7b", str(spec),
                                               dict(gpus=(16,), global_batch=64))
    ok = np.isfinite(step)
    assert ok.sum() > 500
    assert (grid_lb[ok] <= plan_lb[ok] * (1 + 1e-12)).all()
    assert (plan_lb[ok] <= step[ok] * (1 + 1e-12)).all()


def test_the_probe_s_plans_are_not_counted_twice():
    # the keeper has met the probe's five best plans again: five plans, not ten, so the fifth
    # best is what to reach, not the third
    model, hw = load_model("llama2-7b"), load_hardware("dgx-h100")
    req = SearchRequest(gpus=(16,), global_batch=64)
    keeper = S._Keeper(model, req, 5)
    pruner = S._Pruner(model, req, S.Evaluator(model, hw, req), 1e12, keeper, [])
    plans = S.enumerate_plans(model, req).take(np.arange(6))
    best = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    pruner._keep_probe(plans.take(np.arange(5)), best)
    assert pruner.reach() == pytest.approx(5.0)  # the probe's alone
    keeper.best = S.Scored(plans.take(np.arange(5)), np.arange(5), best, np.zeros(5),
                           np.zeros(5), best, np.ones(5, dtype=bool))
    assert pruner.reach() == pytest.approx(5.0)
    assert pruner.reach(np.array([0.5])) == pytest.approx(4.0)  # a plan the keeper lacks
    # a probe plan the keeper does not hold counts
    pruner._keep_probe(plans.take(np.array([5])), np.array([1.5]))
    assert pruner.reach() == pytest.approx(4.0)


def _every_plan_fits(self, groups, family, at, capacity):
    """Evaluator._fit as if every plan fitted in memory: every plan that passes the bounds is
    evaluated in full, as before the memory came first (2026-12-07)."""
    return np.ones(len(at), dtype=bool)


@pytest.mark.parametrize("name, hw_name, fields", CASES[1:3], ids=[c[0] for c in CASES[1:3]])
def test_plans_that_do_not_fit_are_evaluated_only_where_they_may_be_faster(name, hw_name, fields,
                                                                          monkeypatch):
    # their memory first: a plan that does not fit is evaluated in full only where its lower
    # bound is below the best step time found so far (it may count among the faster plans that
    # do not fit, which _compare checks are the full search's)
    model, hw, req = load_model(name), load_hardware(hw_name), SearchRequest(**fields)
    _, pruned = _compare(model, hw, req, 5, monkeypatch)
    monkeypatch.setattr(S.Evaluator, "_fit", _every_plan_fits)
    every = search(model, hw, req, top=5, prune=True)
    assert pruned.evaluated < every.evaluated
    assert pruned.skipped > every.skipped
    assert pruned.unfit_faster == every.unfit_faster > 0
    assert pruned.plan(pruned.fastest_unfit, 0) == every.plan(every.fastest_unfit, 0)


@pytest.mark.parametrize("prune", [True, False])
def test_a_search_for_its_best_plan_alone_evaluates_only_plans_that_fit(prune, monkeypatch):
    # recommend's alternatives (the best plan without ep, cp or FP8) want the best plan alone
    monkeypatch.setattr(S, "PRUNE_PLANS", 0 if prune else 10**12)
    model, hw = load_model("mixtral-8x7b"), load_hardware("dgx-h100")
    req = SearchRequest(gpus=(32,), global_batch=64)
    chunks = []
    lean = search(model, hw, req, top=3, prune=prune, count_unfit=False, on_chunk=chunks.append)
    full = search(model, hw, req, top=3, prune=prune)
    assert lean.skipped > 0  # the plans that do not fit (and, pruned, those the bound cuts)
    np.testing.assert_array_equal(lean.best.step_time_s, full.best.step_time_s)
    assert lean.best_plans() == full.best_plans()
    assert full.unfit_faster > 0 and lean.unfit_faster == 0 and not len(lean.fastest_unfit)
    assert 0 < lean.evaluated < full.evaluated
    assert lean.feasible == lean.evaluated
    assert all(c.fits[c.evaluated].all() for c in chunks)
