"""What `recommend` says must be true of the request (a probe of its explanations against
re-predictions, 2026-12-07): an FP8-weights note only where FP8 weights are faster by more than
rounding, and remedies for a search where nothing fits only where they would lower the nearest
plans' memory."""

from __future__ import annotations

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.recommend import _remedies, recommend
from perfmodel.search import SearchRequest
from perfmodel.strategy import Dtype


def test_the_fp8_weights_note_needs_more_than_rounding():
    """gpt3-175b on 1,024 B200s in FP8: the best plan with FP8 weights takes the same time
    (they only save memory), and came out 2e-16 faster than the search's staged value of the
    plan: the note said "1.00x as fast as this search's best"."""
    model, hardware = load_model("gpt3-175b"), load_hardware("dgx-b200")
    rec = recommend(model, hardware, SearchRequest(gpus=(1024,), global_batch=1536,
                                                   dtype=Dtype.FP8), top=1, prune=True)
    best = rec.top[0]
    weights = predict(model, hardware, best.plan.replace(fp8_params=True), refuse_idle=False)
    assert weights.step_time_s >= best.step_time_s * (1 - 1e-9)
    fp8 = rec.explanation["fp8"]
    assert fp8["fp8_params_plan"] is None and "--fp8-params" not in fp8["says"]


def _plan(**fields: object) -> Plan:
    return Plan(**{"gpus": 8, "dp": 8, "global_batch": 16, **fields})


def test_the_remedies_are_only_what_would_lower_the_nearest_plans():
    """The nearest plans all under ZeRO 3 are not told to take ZeRO-3 (gpt-oss-120b on 8 MI300X
    in FP8 was: its model states alone, 219.6 GiB a GPU, were already sharded over the 8); where
    only their model states were bounded, recompute, offloading and the micro-batch change
    nothing; each of those is named only where some nearest plan lacks it."""
    req = SearchRequest(gpus=(8,), global_batch=16)
    sharded = [_plan(zero=3), _plan(zero=3, ep=1)]
    assert _remedies(req, sharded, evaluated=False) == ["more GPUs"]
    assert _remedies(req, [_plan(zero=1)], evaluated=False) == ["more GPUs", "ZeRO-3"]
    lean = [_plan(zero=3, recompute="full", micro_batch=1)]
    assert _remedies(req, lean, evaluated=True) == [
        "more GPUs", "activation offloading (--cpu-offload-layers, pp 1)"]
    assert _remedies(req, [_plan(micro_batch=2)], evaluated=True) == [
        "more GPUs", "ZeRO-3", "full recompute",
        "activation offloading (--cpu-offload-layers, pp 1)", "a smaller micro-batch"]


def test_a_search_whose_plans_are_sharded_already_names_more_gpus(run_cli):
    out = run_cli("recommend", "--model", "gpt-oss-120b", "--hardware", "mi300x", "--gpus", "8",
                  "--global-batch", "64", "--dtype", "fp8")
    assert out.returncode == 4, out.stderr
    assert "model states alone 219.6 GiB per GPU" in out.stdout
    assert "; more GPUs reduce it" in out.stdout and "ZeRO-3" not in out.stdout
