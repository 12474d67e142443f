"""predict's and recommend's options where a probe found them idle or their refusal untrue
(2026-12-02): combined 1F1B with no pair of micro-batches, a negative degree beside --gpus, a
layer graph's search handed a transformer search's options, caps beside pins of the same axis.
Each test fails before its fix."""

from __future__ import annotations

import pytest

from tests.unit.test_bad_input import run_main

QWEN = ["--model", "qwen3-30b-a3b", "--hardware", "dgx-h100", "--gpus", "16", "--ep", "8"]


@pytest.mark.parametrize("extra", [
    ["--global-batch", "16"],  # one micro-batch: nothing to pair it with
    ["--global-batch", "16", "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2"],
])
def test_combined_1f1b_with_no_pair_of_micro_batches_is_refused(extra):
    code, _, err = run_main(["predict", *QWEN, *extra, "--ep-comm-overlap"])
    assert code == 4 and "this schedule leaves none paired" in err
    code, _, err = run_main(["predict", *QWEN, "--global-batch", "32", "--ep-comm-overlap"])
    assert code == 0, err


def test_a_degree_below_one_beside_gpus_names_its_range():
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--cp", "-2"])
    assert code == 4 and "cp must be between 1" in err and "multiple of" not in err


@pytest.mark.parametrize("extra", [["--csv", "x.csv"], ["--sensitivities"],
                                   ["--memory-margin", "0.5"], ["--max-pp", "4"]])
def test_a_layer_graph_search_refuses_a_transformer_searchs_options(extra, tmp_path):
    code, _, err = run_main(["recommend", "--model", "alexnet", "--hardware", "dgx-a100-80gb",
                             "--gpus", "16", "--global-batch", "1024", *extra])
    assert code == 2 and "a transformer search's" in err
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("extra, says", [
    (["--tp", "4", "--max-tp", "8"], "--max-tp caps a searched tp, and tp is pinned at 4"),
    (["--micro-batch", "1", "--max-micro-batch", "4"], "micro_batch is pinned at 1"),
    (["--pp", "2", "--uneven-stages"], "pp is pinned at 2"),
])
def test_a_cap_beside_a_pin_of_its_axis_is_refused(extra, says):
    code, _, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "16", "--global-batch", "64", *extra])
    assert code == 4 and says in err, err


@pytest.mark.parametrize("extra, says", [
    (["--pp", "2", "--schedule", "zb", "--emit-config", "megatron", "{tmp}/m"],
     "--schedule zb: --emit-config megatron writes schedule 1f1b, interleaved"),
    (["--recompute", "selective", "--emit-config", "torchtitan", "{tmp}/t"],
     "--recompute selective: --emit-config torchtitan writes recompute none, full, op"),
])
def test_a_pin_the_emitted_framework_cannot_run_is_named(extra, says, tmp_path):
    # before: "no plan satisfies the pins ..." with divisibility rules nothing broke
    code, _, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "16", "--global-batch", "64",
                             *(a.format(tmp=tmp_path) for a in extra)])
    # options that do not combine: class 4, as the writer's own refusals (docs/cli.md)
    assert code == 4 and says in err, err
