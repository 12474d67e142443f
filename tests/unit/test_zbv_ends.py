"""zbv's V shape puts the model's first and last chunks on rank 0
(torch.distributed.pipelining.ScheduleZBVZeroBubble; workload.model builds the stages so): the
first rank holds the embedding, the output layer and the loss, the last rank two chunks from
the middle of the model (perfmodel.step.context.Context.head_first)."""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.strategy import Plan

HW = load_hardware("dgx-h100")
MODEL = load_model("llama3-8b")  # untied: V h = 128,256 x 4,096 each for embedding and head
V, H = 128_256, 4_096


def _out(plan):
    return compile_family(family_of(MODEL, HW, plan))(values_of(MODEL, HW, plan))


def _plan(schedule, v):
    return Plan(gpus=4, pp=4, global_batch=16, schedule=schedule, virtual_stages=v)


def test_rank_zero_holds_the_output_layer_and_the_loss():
    zbv, one = _out(_plan("zbv", 2)), _out(_plan("1f1b", 1))
    bf16 = 2
    # 1F1B: the first stage has the embedding, the last the head (and the final norm); zbv's
    # first has both and its last neither: the two differ by both matrices
    gap = float(zbv["memory:first:weights"] - zbv["memory:last:weights"])
    assert gap == pytest.approx(bf16 * (2 * V * H + H), rel=1e-9)
    assert float(one["memory:first:weights"]) == pytest.approx(
        float(one["memory:last:weights"]) - bf16 * H, rel=1e-9)
    # the logits for the loss sit where the output layer is
    assert float(zbv["memory:last:activations/embedding_output"]) == 0
    assert float(zbv["memory:first:activations/embedding_output"]) > \
        float(one["memory:first:activations/embedding_output"])
    # and its time: the first rank's micro-batch carries the output layer's GEMMs
    assert float(zbv["time:first:compute/forward/embedding_logits"]) > \
        float(one["time:first:compute/forward/embedding_logits"])
    assert float(zbv["time:last:compute/forward/embedding_logits"]) == 0
