"""Inputs a user gives that change nothing or cannot be what they mean: refused in one line, or
honoured as given (a CLI sweep of 2026-12-01 found each of these accepted, or answered
inconsistently with predict)."""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, load_hardware, predict
from perfmodel.encode import axis_per_node
from perfmodel.specs.loading import suggest
from tests.unit.test_bad_input import run_main

HW = "dgx-h100"


def _one_line_refusal(code: int, err: str, *words: str) -> None:
    assert code == 4, err
    assert len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("flag, name", [("--ep-dispatcher deepep", "ep_dispatcher"),
                                        ("--expert-weighting output", "expert_weighting"),
                                        ("--ep-comm-overlap", "ep_comm_overlap")])
def test_recommend_refuses_the_experts_options_for_a_model_without_experts(flag, name):
    """As predict refuses them: no plan of a dense model could use them."""
    code, _, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", HW, "--gpus",
                             "8", "--global-batch", "16", *flag.split()])
    _one_line_refusal(code, err, name, "no experts", flag.split()[0])


def test_recommend_with_ep_comm_overlap_pinned_searches_only_where_megatron_runs_it():
    """Combined 1F1B runs with ep > 1, without full recompute, and with pp > 1 only interleaved
    (strategy.ep_overlap_runs): every plan recommended has it on, and predict takes the best."""
    code, out, err = run_main(["recommend", "--model", "mixtral-8x7b", "--hardware", HW,
                               "--gpus", "16", "--global-batch", "32", "--seq-len", "4096",
                               "--ep-comm-overlap", "--top", "5", "--json"])
    assert code == 0, err
    plans = [p["plan"] for p in json.loads(out)["plans"]]
    assert plans
    for plan in plans:
        assert plan["ep_comm_overlap"] is True and plan["ep"] > 1
        assert plan["recompute"] != "full"
        assert plan["pp"] == 1 or plan["schedule"] == "interleaved"
    best = predict("mixtral-8x7b", HW, Plan(**plans[0]))
    assert best.step_time_s > 0


@pytest.mark.parametrize("size", ["1.5", "0.4", "1e-300"])
def test_collective_sizes_are_whole_bytes(size):
    """A message of 1.5 bytes was priced as 1.5 and printed as '2 B'."""
    code, _, err = run_main(["collective", "--hardware", HW, "--op", "all_reduce", "--bytes",
                             size, "--ranks", "16"])
    assert code == 2, err  # not a size in bytes: the option's form (usage, docs/cli.md)
    assert len(err.strip().splitlines()) == 1 and "whole number of bytes" in err, err


def test_collective_takes_a_fractional_size_in_units_that_makes_whole_bytes():
    code, out, err = run_main(["collective", "--hardware", HW, "--op", "all_reduce", "--bytes",
                               "1.5KiB", "--ranks", "16", "--json"])
    assert code == 0, err
    assert json.loads(out)["bytes"] == 1536


def test_a_data_parallel_group_that_straddles_nodes_is_priced_as_described():
    """dp 3 innermost over 24 GPUs (ranks 6, 7, 8 straddle two nodes): the gradient sync's group
    (dp x cp, cp 1) is dp's, costed as the straddling one, as explain's header says, and as
    the same dp with tp innermost."""
    hw = load_hardware(HW)
    plan = Plan(gpus=24, tp=8, dp=3, placement="dp,tp,pp", global_batch=24)
    per_node = axis_per_node(plan, hw)
    assert per_node["dp_cp"] == per_node["dp"] == (1, "inter")
    inner = predict("llama3-8b", HW, plan).breakdown_s["comm/dp"]
    outer = predict("llama3-8b", HW, plan.replace(placement="tp,dp,pp")).breakdown_s["comm/dp"]
    assert inner == pytest.approx(outer, rel=1e-12)


def test_validate_dry_run_refuses_nprocs_that_is_not_the_plans_ranks():
    """As the run does (validation.run.validate): a dry run of 2 ranks is no check of 8."""
    code, _, err = run_main(["validate", "--dry-run", "--model", "tiny-gpt", "--hardware", HW,
                             "--dp", "2", "--nprocs", "8"])
    _one_line_refusal(code, err, "--nprocs is 8", "2 ranks")


def test_a_dtype_the_hardware_lacks_is_a_plan_error_whichever_it_is():
    """bf16 on V100 exited 3 (a spec error) where fp8 on A100 exits 4: both are the plan's
    dtype against the hardware (docs/cli.md, exit codes)."""
    for hardware, dtype in (("dgx-v100", "bf16"), ("dgx-a100-80gb", "fp8")):
        code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", hardware,
                                 "--gpus", "8", "--global-batch", "8", "--dtype", dtype])
        _one_line_refusal(code, err, f"dtype {dtype}", f"peak_flops_per_s.{dtype}")


def test_presets_names_the_16_bit_peak_it_shows():
    code, out, err = run_main(["presets"])
    assert code == 0, err
    text = " ".join(out.split())  # (a narrow terminal wraps the table's rows)
    v100 = text[text.index("dgx-v100"):]
    assert "125 TFLOP/s (fp16)" in v100[:200]
    assert "bf16 peak" not in text


@pytest.mark.parametrize("given, meant", [("DGX-H100", "dgx-h100"), ("LLAMA3-8B", "llama3-8b"),
                                          ("qwen3-30b", "qwen3-30b-a3b"),
                                          ("mixtral-8x7", "mixtral-8x7b")])
def test_a_preset_name_in_capitals_or_cut_short_is_suggested(given, meant):
    names = ["dgx-h100", "dgx-h100-superpod", "llama3-8b", "llama3-70b", "qwen3-32b",
             "qwen3-30b-a3b", "mixtral-8x7b", "mixtral-8x22b"]
    assert suggest(given, names) == f" (did you mean '{meant}'?)"


def test_the_stages_not_given_show_the_layers_they_split():
    code, out, err = run_main(["predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                               "--pp", "8", "--last-stage-layers", "25", "--global-batch", "64"])
    assert code == 0, err
    assert "stages' layers 1 first, 25 last, 1 on each other stage" in " ".join(out.split())
