"""The memory verdict: fits with the caching allocator's fragmentation margin (fits_in_memory),
tight without it, or does not fit (perfmodel.predict.memory_verdict)."""

import json

import pytest

from perfmodel import Plan, predict
from perfmodel.predict import FRAGMENTATION, memory_verdict

GIB = 2**30


@pytest.mark.parametrize(("total", "without", "verdict"), [
    (79, 72, "fits"), (80, 73, "fits"),  # at the capacity: fits
    (83, 76, "tight"), (87, 80, "tight"),  # over by the margin at most
    (87.5, 80.5, "does not fit"), (81, 81, "does not fit")])
def test_the_three_verdicts(total, without, verdict):
    assert memory_verdict(total * GIB, without * GIB, 80 * GIB) == verdict


# Llama 3 8B on 8 H100s, tp 2 with sequence parallelism, micro-batch 2, ZeRO 1: 83.3 GiB with the
# allocator's 15% margin on the step's transient tensors (7.1 GiB of it), 76.3 without
TIGHT = dict(gpus=8, dp=4, tp=2, sequence_parallel=True, micro_batch=2, global_batch=32, zero=1)


def test_a_plan_over_only_by_the_margin_is_tight_and_fits():
    p = predict("llama3-8b", "dgx-h100", Plan(**TIGHT))
    margin = p.memory_breakdown_bytes[FRAGMENTATION]
    assert p.memory_per_gpu_bytes > p.memory_capacity_bytes >= p.memory_per_gpu_bytes - margin
    assert p.memory_verdict == "tight" and not p.fits_in_memory
    assert p.memory_without_margin_bytes == pytest.approx(p.memory_per_gpu_bytes - margin)
    assert p.to_dict()["memory_verdict"] == "tight"
    # a larger micro-batch leaves the tensors themselves over: does not fit
    q = predict("llama3-8b", "dgx-h100", Plan(**{**TIGHT, "micro_batch": 4, "global_batch": 64}))
    assert q.memory_verdict == "does not fit" and not q.fits_in_memory


def test_predict_says_tight_in_words_and_in_json(run_cli):
    args = ["predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--tp",
            "2", "--sequence-parallel", "--micro-batch", "2", "--global-batch", "32", "--zero",
            "1"]
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    assert "tight" in out.stdout and "fragmentation margin" in out.stdout
    assert "does NOT fit" not in out.stdout
    data = json.loads(run_cli(*args, "--json").stdout)
    assert data["memory_verdict"] == "tight" and data["fits_in_memory"] is False


def test_the_verdict_takes_the_stage_that_holds_most_without_the_margin():
    """Under a pipeline the stage that holds the most with the margin need not be the one that
    holds the most without it: the verdict reads every stage (the review's case: Llama 3 70B,
    pp 8 with 5 layers first and 21 last, on a 105 GiB GPU: the middle stage holds the most
    with the margin, the last without it, over the GPU)."""
    from perfmodel.specs.hardware import load_hardware

    hw = load_hardware("dgx-h100").replace(memory_bytes=105 * GIB)
    p = predict("llama3-70b", hw, Plan(gpus=64, dp=2, tp=4, pp=8, sequence_parallel=True,
                                      micro_batch=2, global_batch=64, first_stage_layers=5,
                                      last_stage_layers=21))
    heaviest_without = p.memory_per_gpu_bytes - p.memory_breakdown_bytes[FRAGMENTATION]
    assert p.memory_without_margin_bytes > max(heaviest_without, 105 * GIB)
    assert p.memory_verdict == "does not fit" and not p.fits_in_memory
