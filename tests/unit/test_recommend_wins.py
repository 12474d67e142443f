"""recommend's explanation of what makes the best plan win (perfmodel.recommend.parallelism_wins):
the same search without the axis."""

from __future__ import annotations

import json

from perfmodel import load_hardware, load_model
from perfmodel.recommend import best_without, recommend
from perfmodel.search import SearchRequest

MOE = ("qwen3-30b-a3b", "dgx-h100")  # 16 GPUs: its best plan spreads the experts (ep 8)


def test_expert_parallelism_wins_against_the_search_without_it():
    model, hw = load_model(MOE[0]), load_hardware(MOE[1])
    req = SearchRequest(gpus=(16,), global_batch=64)
    rec = recommend(model, hw, req, top=1, prune=True)
    best = rec.top[0]
    wins = {w["axis"]: w for w in rec.explanation["parallelism"]}
    assert best.plan.ep > 1 and wins["ep"]["degree"] == best.plan.ep
    alt = best_without(model, hw, rec.result.request, "ep")
    assert alt is not None and wins["ep"]["best_without"] == alt["plan"]
    assert wins["ep"]["objective_without"] == alt["objective"] > best.step_time_s
    assert f"(ep={best.plan.ep}) makes the best plan win" in wins["ep"]["note"]


def test_the_searches_run_ahead_are_those_the_explanation_may_ask_for():
    """alternatives(): without ep where the request leaves it open, without cp where the search
    takes cp > 1 (open, flash attention, a sequence it cuts): DeepSeek-V3 on 256 GB200, whose
    best plan takes both; none for a dense model pinned to cp 1 or without flash attention."""
    from perfmodel.recommend import alternatives
    from perfmodel.search import resolved_request

    model, hw = load_model("deepseek-v3"), load_hardware("gb200-nvl72")
    req = resolved_request(model, hw, SearchRequest(gpus=(256,), global_batch=4096))
    assert [key for key, _ in alternatives(model, req)] == ["ep", "cp"]
    assert {alt.ep for key, alt in alternatives(model, req) if key == "ep"} == {1}
    assert {alt.cp for key, alt in alternatives(model, req) if key == "cp"} == {1}
    dense, a100 = load_model("llama3-8b"), load_hardware("dgx-a100-80gb")
    for pins in ({"cp": 1}, {"flash_attention": False}):
        req = resolved_request(dense, a100, SearchRequest(gpus=(64,), global_batch=512, **pins))
        assert alternatives(dense, req) == []


def test_a_gpu_count_with_no_split_names_the_nearest_that_have_one():
    """Llama 2 70B (64 heads, 80 layers) on one GB200 NVL72 rack's 72 GPUs at global batch 512:
    72's factor 9 fits no degree (tp divides 64, pp 80, dp the batch), so no plan exists; the
    refusal names the nearest GPU counts with a plan at that batch and the nearest batches with
    one at 72 GPUs, each the first on its side (every count and batch between has none), and
    --json gives them as explanation.infeasible.nearest_splits."""
    from perfmodel.search import count_plans, resolved_request
    from tests.unit.test_bad_input import run_main

    model, hw = load_model("llama2-70b"), load_hardware("gb200-nvl72")
    req = SearchRequest(gpus=(72,), global_batch=512)
    rec = recommend(model, hw, req, top=1)
    why = rec.explanation["infeasible"]
    assert why["binding"] == "divisibility" and not rec.top
    splits = why["nearest_splits"]
    assert splits == {"gpus": [64, 80], "global_batch": [504, 513]}

    def plans(gpus, batch):
        return count_plans(model, resolved_request(model, hw, SearchRequest(
            gpus=(gpus,), global_batch=batch)))

    assert all(plans(g, 512) > 0 for g in splits["gpus"])
    assert all(plans(72, b) > 0 for b in splits["global_batch"])
    # between them only counts of whole hosts (4 GPUs each beyond one rack) take a plan
    assert [g for g in range(65, 80) if g <= 72 or g % 4 == 0 if plans(g, 512)] == []
    assert [b for b in range(505, 513) if plans(72, b)] == []
    assert ("the nearest with a plan: 64 or 80 GPUs at global batch 512, or 72 GPUs at global "
            "batch 504 or 513") in why["reason"]
    code, out, err = run_main(["recommend", "--model", "llama2-70b", "--hardware", "gb200-nvl72",
                               "--gpus", "72", "--global-batch", "512", "--json"])
    assert code == 4 and "the nearest with a plan" in err
    assert json.loads(out)["explanation"]["infeasible"]["nearest_splits"] == splits


def test_a_plans_short_text_names_a_placement_that_places_its_ranks_otherwise():
    """recommend's alternatives in short (the best bf16 plan, the best without cp or ep) left a
    placement out: 'dp,tp,pp' was predicted as 'tp,dp,pp' from the text (a probe's finding,
    2026-12-07). One that places the ranks as the default does is left out still."""
    from perfmodel import Plan
    from perfmodel.recommend import _short

    assert _short(Plan(gpus=64, dp=8, tp=8, global_batch=64, placement="dp,tp,pp")).endswith(
        " placement=dp,tp,pp")
    for same in (dict(dp=8, tp=8), dict(dp=64, placement="dp,tp,pp"),
                 dict(dp=8, cp=8, placement="tp,cp,dp,pp", flash_attention=True)):
        assert "placement" not in _short(Plan(gpus=64, global_batch=64, **same))
