"""recommend and predict with FP8, context and expert parallelism where a probe found them wrong
(2026-12-02). Each test fails before its fix."""

from __future__ import annotations

import pytest

from perfmodel import Plan, PlanError, load_hardware, load_model, predict
from perfmodel.recommend import without
from perfmodel.search import SearchRequest
from tests.unit.test_bad_input import run_main

LONG = ["--model", "llama3.1-8b", "--seq-len", "32776"]


def test_sequence_parallelism_needs_each_cp_ranks_tokens_to_divide_over_tp():
    """32776 tokens over cp 2 leave 16388 a rank, 2048.5 per tp rank of 8: Megatron-Core's
    sequence-parallel scatter asserts they divide; it was predicted (417 ms)."""
    model = load_model("llama3.1-8b", seq_len=32776)
    with pytest.raises(PlanError, match=r"divisible by tp x cp \(8 x 2 = 16\) for "
                                        "sequence_parallel"):
        predict(model, "dgx-h100", Plan(gpus=16, tp=8, cp=2, sequence_parallel=True))
    predict(model, "dgx-h100", Plan(gpus=16, tp=8, cp=2))  # without it: fine
    predict(load_model("llama3.1-8b", seq_len=32768), "dgx-h100",
            Plan(gpus=16, tp=8, cp=2, sequence_parallel=True))
    # the search takes the rule: no sequence-parallel plan for that length
    code, out, err = run_main(["recommend", *LONG, "--hardware", "dgx-h100", "--gpus", "16",
                               "--global-batch", "16", "--tp", "8", "--cp", "2", "--json"])
    assert code == 0, err
    assert '"sequence_parallel": true' not in out


def test_the_search_without_expert_parallelism_leaves_the_ep_overlap_pin_open():
    """--ep-comm-overlap pins the combined 1F1B on, which needs ep > 1: the ep = 1 search kept
    it, found no valid plan and said 'without it no plan fits'."""
    req = SearchRequest(gpus=(64,), global_batch=64, ep_comm_overlap=True)
    assert without(req, "ep").ep_comm_overlap is None and without(req, "ep").ep == 1
    assert without(req, "cp").ep_comm_overlap is True


@pytest.mark.parametrize("hardware, extra, why", [
    ("mi325x", ["--dtype", "fp8"], "the attention has no fused kernel"),
    ("dgx-h100", ["--max-cp", "1"], "max_cp 1 leaves every plan at cp 1"),
])
def test_a_cp_comm_pin_no_searched_plan_takes_is_refused(hardware, extra, why):
    code, _, err = run_main(["recommend", "--model", "llama3.1-8b", "--seq-len", "32768",
                             "--hardware", hardware, "--gpus", "16", "--global-batch", "16",
                             "--cp-comm", "a2a", *extra])
    assert code == 4 and "cp_comm a2a applies to context parallelism" in err and why in err, err


def test_hardware_without_a_fused_kernel_is_mi325x():
    """The case above rests on the preset having no flash kernel (perfmodel presets)."""
    assert not load_hardware("mi325x").flash_attention_names()
