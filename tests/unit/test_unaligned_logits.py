"""An output layer whose vocabulary is not a multiple of 8 (bf16: rows not 16 bytes apart) runs
on cuBLAS's alignment-1 fallback kernels, priced at the hardware's measured unaligned rate
(GemmEfficiency.unaligned_fraction; H100/H200: 0.121 of peak, from the kernel trace in
docs/evidence/h200-2026-12-04/kernels.json); hardware that did not measure it, dtypes it did not
measure and aligned vocabularies are priced as before."""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.evaluate import family_of, values_of

PLAN = Plan(gpus=1, micro_batch=4, global_batch=4)  # GPT-2 small: 4 x 1024 tokens


def _forward_logits(vocab: int, hardware: str, plan: Plan = PLAN) -> float:
    model = dataclasses.replace(load_model("gpt2-small"), vocab=vocab)
    return predict(model, load_hardware(hardware), plan).breakdown_s[
        "compute/forward/embedding_logits"]


def test_gpt2s_vocabulary_runs_at_the_unaligned_rate_on_h200():
    """50257 against 50264 (a multiple of 8): the loss and the embedding barely differ; the
    GEMM goes from the aligned roofline to 2 T h V / (peak x 0.121)."""
    hw = load_hardware("hgx-h200")
    tokens, hidden = 4 * 1024, 768
    unaligned = 2 * tokens * hidden * 50257 / (hw.peak("bf16") * 0.121)
    values = values_of(load_model("gpt2-small"), hw, PLAN)
    fit = {k: v for k, v in dataclasses.asdict(hw.training_gemm("bf16")).items()}
    aligned = float(gemm_time_s(tokens, 50264, hidden, 1, 2, hw.peak("bf16"),
                                values["memory_bandwidth_bytes_per_s"], **fit))
    assert aligned < unaligned / 3  # the fallback is several times slower
    difference = _forward_logits(50257, "hgx-h200") - _forward_logits(50264, "hgx-h200")
    assert difference == pytest.approx(unaligned - aligned, rel=0.01)


@pytest.mark.parametrize("hardware", ["dgx-a100-80gb", "mi300x"])
def test_hardware_that_did_not_measure_it_prices_it_aligned(hardware):
    assert load_hardware(hardware).gemm("bf16").unaligned_fraction == 0
    assert _forward_logits(50257, hardware) == pytest.approx(_forward_logits(50264, hardware),
                                                             rel=1e-3)


def test_the_family_flag_follows_the_vocabulary_and_the_dtype():
    hw, model = load_hardware("dgx-h100"), load_model("gpt2-small")
    assert family_of(model, hw, PLAN).unaligned_logits
    assert not family_of(dataclasses.replace(model, vocab=50304), hw, PLAN).unaligned_logits
    # tf32 measured no unaligned GEMM; fp8 keeps its output layer in bf16 unless asked
    assert not family_of(model, hw, PLAN.replace(dtype="tf32")).unaligned_logits
    assert family_of(model, hw, PLAN.replace(dtype="fp8")).unaligned_logits
    assert not family_of(model, hw, PLAN.replace(dtype="fp8",
                                                 fp8_output_layer=True)).unaligned_logits
