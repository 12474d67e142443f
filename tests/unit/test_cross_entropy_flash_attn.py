"""flash-attn's fused cross entropy (Plan.cross_entropy flash-attn; flash_attn/ops/triton/
cross_entropy.py at 058ad35a, llm-foundry's default loss): one kernel reads the logits in their
own dtype forward (an online softmax, no fp32 copy in memory), one reads them again backward and
writes their gradient into a new tensor beside them (inplace_backward false): two copies in the
logits' dtype where Transformer Engine's in-place kernel keeps one."""

from __future__ import annotations

import pytest

from benchmarks import bench_accuracy as B
from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.configs.emit import emit
from perfmodel.costs.compute import (
    FLASH_LOSS_BACKWARD_PASSES,
    FLASH_LOSS_FORWARD_PASSES,
    TE_LOSS_BACKWARD_PASSES,
    TE_LOSS_FORWARD_PASSES,
)
from perfmodel.errors import PerfmodelError
from perfmodel.step.memory import LOSS_LOGITS_FLASH, LOSS_LOGITS_TE
from perfmodel.strategy import Plan
from validation.jobspec import check_loss

PLAN = dict(gpus=8, dp=8, micro_batch=2, global_batch=16)


def _predict(kernel: str):
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    return model, hw, predict(model, hw, Plan(**PLAN, cross_entropy=kernel))


def test_flash_attn_keeps_the_logits_and_their_new_gradient():
    model, _, te = _predict("te")
    _, _, flash = _predict("flash-attn")
    per_copy = 2 * model.seq_len * model.vocab  # elements of one rank's logits, 2 bf16 bytes
    key = "activations/embedding_output"
    assert flash.memory_breakdown_bytes[key] - te.memory_breakdown_bytes[key] == \
        pytest.approx((LOSS_LOGITS_FLASH - LOSS_LOGITS_TE) * 2 * per_copy, rel=1e-9)
    assert LOSS_LOGITS_FLASH == 2  # the logits kept, their gradient beside them


def test_flash_attn_moves_one_pass_forward_and_two_backward():
    model, hw, te = _predict("te")
    _, _, flash = _predict("flash-attn")
    per_copy = 2 * model.seq_len * model.vocab
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    for direction, ours, theirs in (
            ("forward", FLASH_LOSS_FORWARD_PASSES, TE_LOSS_FORWARD_PASSES),
            ("backward", FLASH_LOSS_BACKWARD_PASSES, TE_LOSS_BACKWARD_PASSES)):
        key = f"compute/{direction}/embedding_logits"
        assert te.breakdown_s[key] - flash.breakdown_s[key] == pytest.approx(
            (theirs - ours) * 2 * per_copy / bandwidth, rel=1e-9)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan"])
def test_no_emitted_config_runs_flash_attns_loss(tmp_path, fmt):
    model, hw, _ = _predict("flash-attn")
    with pytest.raises(PerfmodelError, match="cross_entropy flash-attn"):
        emit(fmt, tmp_path, model, hw, Plan(**PLAN, cross_entropy="flash-attn"), 1.0)


def test_the_validation_job_refuses_flash_attns_loss():
    with pytest.raises(PlanError, match="flash-attn's Triton kernel runs on GPUs only"):
        check_loss(Plan(**PLAN, cross_entropy="flash-attn"))


@pytest.mark.parametrize("feature", ["flash-attn fused cross entropy", "fused_crossentropy",
                                     "Fused cross entropy (flash-attn)"])
def test_the_accuracy_bench_reads_llm_foundrys_loss(feature):
    """Regression: llm-foundry's rows were priced with Megatron's fp32 copy of the logits, three
    MPT-350M runs on A100 40GB predicted not to fit where they ran."""
    assert B.generic_feature(feature) == {"cross_entropy": "flash-attn"}
