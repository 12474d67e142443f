"""Pipeline degrees that do not divide the layers: the split (strategy.stage_split), the search
over them (recommend --uneven-stages, or a pinned --pp), and what predict and recommend say."""

import dataclasses

import numpy as np
import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.recommend import recommend, uneven_note
from perfmodel.search import Scored, SearchRequest, chunk_layers, search
from perfmodel.strategy import Plan, stage_split


@pytest.mark.parametrize(("layers", "pp", "split"), [
    # Llama 3 405B, 126 layers on 16 stages: the first and the last one layer short (Meta, "The
    # Llama 3 Herd of Models", 2024, Sec. 3.3.2), 8 on each of the 14 others
    (126, 16, (7, 7)),
    (61, 16, (3, 2)),  # DeepSeek-V3's 61 layers: 4 x 14 + 3 + 2
    (61, 8, (7, 6)),  # 8 x 6 + 7 + 6
    (61, 2, (31, 30)),  # no stage between: the two ends share all
    (80, 3, (27, 26)),  # 27 + 27 + 26
    (96, 8, (0, 0)),  # pp divides the layers: L / pp each
    (61, 32, (0, 0)),  # 2 x 30 leaves 1: the last stage would hold none
    (61, 1, (0, 0)),
])
def test_stage_split_shortens_the_ends(layers, pp, split):
    assert stage_split(layers, pp) == split
    first, last = split
    if first:  # every layer placed once, the ends no longer than a middle stage
        middle = -(-layers // pp)
        assert first + last + (pp - 2) * middle == layers
        assert 1 <= last <= first <= middle


def test_chunk_layers_is_what_every_stage_divides():
    assert chunk_layers(96, 8) == 12  # even: L / pp
    assert chunk_layers(126, 16) == 1  # 7, 8 and 7
    assert stage_split(44, 6) == (6, 6)  # 6 + 8 x 4 + 6: two chunks of each stage at most
    assert chunk_layers(44, 6) == 2


@pytest.fixture(scope="module")
def uneven():
    """llama2-7b cut to 30 layers: pp 4 and 8 do not divide them (7 + 8 x 2 + 7, 3 + 4 x 6 + 3)."""
    model = dataclasses.replace(load_model("llama2-7b"), layers=30)
    hw = load_hardware("dgx-h100")
    req = SearchRequest(gpus=(16,), global_batch=32, max_micro_batch=1, cp=1, tp=2,
                        uneven_stages=True)
    chunks = []
    result = search(model, hw, req, top=10**6, on_chunk=chunks.append)
    return model, hw, req, result, Scored.concat(chunks)


def test_the_search_splits_the_degrees_that_do_not_divide_the_layers(uneven):
    model, hw, req, result, every = uneven
    cols = every.plans.cols
    for pp in (4, 8):
        rows = cols["pp"] == pp
        assert rows.any()
        assert set(cols["first_stage_layers"][rows]) == {stage_split(30, pp)[0]}
        assert set(cols["last_stage_layers"][rows]) == {stage_split(30, pp)[1]}
    even = np.isin(cols["pp"], (1, 2))  # they divide 30: L / pp, no split given
    assert not cols["first_stage_layers"][even].any()
    # without --uneven-stages only the divisors of the layers
    plain = search(model, hw, dataclasses.replace(req, uneven_stages=False), top=1)
    assert plain.enumerated == int(even.sum())


def test_the_search_and_predict_agree_on_uneven_plans(uneven):
    model, hw, _, result, every = uneven
    rows = np.flatnonzero((every.plans.cols["first_stage_layers"] > 0) & every.evaluated)
    assert len(rows) > 50
    for i in rows[:: max(1, len(rows) // 60)]:
        p = predict(model, hw, result.plan(every, i))
        assert p.step_time_s == pytest.approx(every.step_time_s[i], rel=1e-9)
        assert p.memory_per_gpu_bytes == pytest.approx(every.memory_bytes[i], rel=1e-9)


def test_a_pinned_pp_is_split_without_the_flag():
    model = dataclasses.replace(load_model("llama2-7b"), layers=30)
    hw = load_hardware("dgx-h100")
    result = search(model, hw, SearchRequest(gpus=(16,), global_batch=32, pp=8), top=1)
    best = result.plan(result.best, 0)
    assert (best.pp, best.first_stage_layers, best.last_stage_layers) == (8, 3, 3)  # 3+4x6+3


def test_recommend_says_which_degrees_it_left_out():
    model = load_model("deepseek-v3")
    req = SearchRequest(gpus=(256,), global_batch=4096)
    note = uneven_note(model, req)
    assert "pp 2, 4, 8, 16 do not divide the 61 layers" in note
    assert "--uneven-stages" in note
    assert uneven_note(model, dataclasses.replace(req, uneven_stages=True)) == ""
    assert uneven_note(model, dataclasses.replace(req, max_pp=1)) == ""
    assert uneven_note(load_model("llama2-7b"), dataclasses.replace(req, gpus=(64,))) == ""


def test_the_best_plan_names_its_split():
    model = dataclasses.replace(load_model("llama2-7b"), layers=30)
    hw = load_hardware("dgx-h100")
    rec = recommend(model, hw, SearchRequest(gpus=(16,), global_batch=32, pp=4, tp=4), top=1)
    assert "pp=4" in rec.explanation["best"]
    assert "first-layers=7 last-layers=7" in rec.explanation["best"]  # 7 + 8 x 2 + 7


def test_predict_names_the_split_that_would_do():
    model, hw = load_model("deepseek-v3"), load_hardware("dgx-h100")
    plan = Plan(gpus=1024, dp=64, pp=16, ep=64, global_batch=8192)
    with pytest.raises(PlanError, match="first_stage_layers 3 and last_stage_layers 2 leave 4"):
        predict(model, hw, plan)
    p = predict(model, hw, dataclasses.replace(plan, first_stage_layers=3, last_stage_layers=2))
    assert np.isfinite(p.step_time_s)


def test_uneven_stages_cli(run_cli):
    args = ("recommend", "--model", "llama3-405b", "--hardware", "dgx-h100", "--gpus", "2048",
            "--global-batch", "1024", "--seq-len", "4096", "--tp", "8", "--cp", "1",
            "--max-micro-batch", "1", "--top", "1")
    plain = run_cli(*args)
    assert plain.returncode == 0, plain.stderr
    assert "pp 4, 8, 16, 32, 64 do not divide the 126 layers" in " ".join(plain.stdout.split())
    flagged = run_cli(*args, "--uneven-stages")
    assert flagged.returncode == 0, flagged.stderr
    assert "do not divide" not in flagged.stdout
    pinned = run_cli(*args, "--pp", "16")  # 126 layers on 16 stages, as Llama 3 405B ran
    assert pinned.returncode == 0, pinned.stderr
    assert "pp=16" in pinned.stdout and "first-layers=7 last-layers=7" in pinned.stdout
