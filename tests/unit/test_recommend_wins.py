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
