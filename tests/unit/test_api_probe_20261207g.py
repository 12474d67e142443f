"""The Python API as a notebook uses it (a probe of 2026-12-07): every input refused in words
(a perfmodel error, never Python's own), a plan the same whether given as a Plan or a dict, and
the objects' dicts copies of their own."""

from __future__ import annotations

import numpy as np
import pytest

import perfmodel
from perfmodel import PerfmodelError, Plan, PlanError, SpecError
from perfmodel.collective import predict_collective
from perfmodel.layerwise import GridPlan, best_grid, predict_grid, sweep
from perfmodel.recommend import apply_what_if
from perfmodel.search import SearchRequest

M, H = "llama3-8b", "dgx-h100"


def test_a_plan_takes_its_stacks_kernels_as_a_dict_plan_and_the_command_line_do():
    fields = dict(gpus=16, dp=16, global_batch=64, stack="compiled")
    as_plan = perfmodel.predict(M, H, Plan(**fields))
    as_dict = perfmodel.predict(M, H, fields)
    assert as_plan.plan.kernels == as_dict.plan.kernels == "compiled"
    assert as_plan.step_time_s == as_dict.step_time_s
    # given, the kernels are the ones given; the default stack's are fused
    assert Plan(gpus=1, stack="compiled", kernels="fused").kernels == "fused"
    assert Plan(gpus=1).kernels == "fused"


@pytest.mark.parametrize("hardware", [Plan(gpus=8, tp=8), "x" * 300, {"name": "x"}, b"dgx-h100",
                                      perfmodel.load_model("llama2-7b")])
def test_a_hardware_that_is_no_name_or_spec_is_a_spec_error(hardware):
    with pytest.raises(SpecError):
        perfmodel.load_hardware(hardware)


@pytest.mark.parametrize("model", [Plan(gpus=8, tp=8), "x" * 300, 5])
def test_a_model_that_is_no_name_or_spec_is_a_spec_error(model):
    with pytest.raises(SpecError):
        perfmodel.load_model(model)


def test_comm_ledger_in_predicts_argument_order_is_told_its_own():
    plan = Plan(gpus=8, tp=8)
    with pytest.raises(PlanError, match="comm_ledger takes"):
        perfmodel.comm_ledger(M, H, plan)


def test_a_predictions_comm_ledger_is_the_ledger():
    r = perfmodel.predict(M, H, Plan(gpus=16, tp=4, pp=4, global_batch=64))
    assert r.comm_ledger and r.comm_ledger == perfmodel.comm_ledger(M, r.plan)


def test_the_dicts_of_a_result_are_copies():
    vgg = perfmodel.load_model("vgg16")
    grid = predict_grid(vgg, perfmodel.load_hardware("dgx-v100"),
                        GridPlan(pr=2, pc=8, global_batch=256))
    out = grid.to_dict()
    out["breakdown_s"]["comm/norm"] = 42.0
    out["memory_breakdown_bytes"].clear()
    out["layer_degrees"].clear()
    assert grid.breakdown_s["comm/norm"] == 0.0
    assert grid.memory_breakdown_bytes and grid.layer_degrees


@pytest.mark.parametrize("call, error", [
    (lambda hw: predict_collective("all_reduce", 2**30, 16, "dgx-h100"), None),
    (lambda hw: predict_collective("all_reduce", "1GiB", 16, hw), None),
    (lambda hw: predict_collective("all_reduce", np.float64(2**30), np.int64(16), hw), None),
    (lambda hw: predict_collective("allreduce", 2**30, 16, hw), "did you mean 'all_reduce'"),
    (lambda hw: predict_collective("all_reduce", -5, 16, hw), "positive"),
    (lambda hw: predict_collective("all_reduce", float("nan"), 16, hw), "positive"),
    (lambda hw: predict_collective("all_reduce", 2**30, None, hw), "ranks"),
    (lambda hw: predict_collective("all_reduce", 2**30, 16.5, hw), "whole number"),
    (lambda hw: predict_collective("all_reduce", 2**30, 16, hw, ranks_per_node="x"), "ranks_per"),
    (lambda hw: predict_collective("all_reduce", 2**30, 0, hw), "--ranks must be between"),
])
def test_predict_collective_takes_or_refuses_its_inputs_in_words(call, error):
    hw = perfmodel.load_hardware(H)
    if error is None:
        assert call(hw)["time_s"] == predict_collective("all_reduce", 2**30, 16, hw)["time_s"]
    else:
        with pytest.raises(PlanError, match=error):
            call(hw)


def test_a_grid_plan_takes_numpy_and_text_whole_numbers_and_refuses_unknown_fields():
    assert GridPlan(pr=np.int64(2), pc="8", global_batch=256.0) == \
        GridPlan(pr=2, pc=8, global_batch=256)
    with pytest.raises(PlanError, match="did you mean|unknown grid plan field"):
        GridPlan(pr=2, pc=8, global_batch=256, batch=3)


def test_the_layer_graph_api_takes_names_and_dict_plans():
    by_name = predict_grid("vgg16", "dgx-v100", {"pr": 2, "pc": 8, "global_batch": 256})
    by_spec = predict_grid(perfmodel.load_model("vgg16"), perfmodel.load_hardware("dgx-v100"),
                           GridPlan(pr=2, pc=8, global_batch=256))
    assert by_name.step_time_s == by_spec.step_time_s
    assert best_grid("alexnet", "dgx-v100", 16, np.int64(256))[0].plan.pr >= 1
    with pytest.raises(PlanError, match="transformer"):
        predict_grid(M, "dgx-v100", GridPlan(pr=2, pc=8, global_batch=256))


@pytest.mark.parametrize("vary, says", [({"peak_flops_per_s": 1e13}, "list of values"),
                                        ({"peak_flops_per_s": "1e13"}, "list of values"),
                                        ({"gpus": [16.5]}, "whole number")])
def test_sweep_refuses_what_it_cannot_sweep_in_words(vary, says):
    with pytest.raises(PlanError, match=says):
        sweep("alexnet", "dgx-v100", GridPlan(pr=2, pc=8, global_batch=256), vary)


def test_a_search_request_refuses_in_words():
    with pytest.raises(PlanError, match="did you mean 'max_tp'"):
        SearchRequest(gpus=(8,), global_batch=64, maxtp=3)
    with pytest.raises(PlanError, match="tokens must be a number"):
        SearchRequest(gpus=(8,), global_batch=64, tokens="1e12")
    assert SearchRequest(gpus=(8,), global_batch=64, tokens=np.float64(1e12)).tokens == 1e12


def test_apply_what_if_takes_a_presets_name_and_refuses_a_change_that_is_not_text():
    assert apply_what_if(H, "inter_node.bandwidth_bytes_per_s=2x").inter_node \
        .bandwidth_bytes_per_s == 2 * perfmodel.load_hardware(H).inter_node.bandwidth_bytes_per_s
    with pytest.raises(PerfmodelError):
        apply_what_if(H, {"peak_flops_per_s": 2})
