"""The memory verdict: fits with the caching allocator's fragmentation margin, tight without it,
or does not fit (perfmodel.predict.memory_verdict)."""

import json

import pytest

from perfmodel import Plan, predict
from perfmodel.predict import FRAGMENTATION, memory_verdict

GIB = 2**30


@pytest.mark.parametrize(("total", "fragmentation", "verdict"), [
    (79, 7, "fits"), (80, 7, "fits"),  # at the capacity: fits
    (83, 7, "tight"), (87, 7, "tight"),  # over by the margin at most
    (87.5, 7, "does not fit"), (81, 0, "does not fit")])
def test_the_three_verdicts(total, fragmentation, verdict):
    assert memory_verdict(total * GIB, fragmentation * GIB, 80 * GIB) == verdict


# Llama 3 8B on 8 H100s, tp 2 with sequence parallelism, micro-batch 2, ZeRO 1: 83.3 GiB with the
# allocator's 15% margin on the step's transient tensors (7.1 GiB of it), 76.3 without
TIGHT = dict(gpus=8, dp=4, tp=2, sequence_parallel=True, micro_batch=2, global_batch=32, zero=1)


def test_a_plan_over_only_by_the_margin_is_tight_and_fits():
    p = predict("llama3-8b", "dgx-h100", Plan(**TIGHT))
    margin = p.memory_breakdown_bytes[FRAGMENTATION]
    assert p.memory_per_gpu_bytes > p.memory_capacity_bytes >= p.memory_per_gpu_bytes - margin
    assert p.memory_verdict == "tight" and p.fits_in_memory
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
    assert data["memory_verdict"] == "tight" and data["fits_in_memory"] is True
