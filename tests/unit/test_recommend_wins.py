"""recommend's explanation of what makes the best plan win (perfmodel.recommend.parallelism_wins):
the same search without the axis."""

from __future__ import annotations

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
