"""The activations each stage holds at its peak under interleaved 1F1B, in the stage's
micro-batches: Megatron-Core's schedule (megatron/core/pipeline_parallel/schedules.py,
forward_backward_pipelining_with_interleaving) runs 2 (pp - r - 1) + (v - 1) pp warm-up
forwards of chunks on rank r, then one more forward before its first backward; each chunk holds
1 / v of the stage's layers. So the first rank holds (v pp + pp - 1) / v stage micro-batches
(Korthikanti et al. 2022, Sec. 4.2.3: pp (1 + (pp - 1) / (pp v))), the second (v pp + pp - 3) / v
and the last ((v - 1) pp + 1) / v; under 1F1B (v = 1 in Megatron's plain schedule) pp, pp - 1
and 1. torch's ScheduleInterleaved1F1B warms up alike (its get_rank_warmup_ops)."""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.strategy import Plan

HW = load_hardware("dgx-h100")


def _stages(model, plan):
    out = compile_family(family_of(model, HW, plan))(values_of(model, HW, plan))
    return {st: float(out[f"memory:{st}:activations/layers"])
            for st in ("first", "middle", "last")}


@pytest.mark.parametrize(("pp", "v", "m"), [(4, 2, 16), (4, 4, 8), (8, 2, 16)])
def test_each_stage_holds_megatrons_warm_up(pp, v, m):
    model = load_model("llama3-8b")
    base = dict(gpus=pp, pp=pp, global_batch=m)
    one = _stages(model, Plan(**base))  # 1F1B: pp, pp - 1, 1 stage micro-batches
    per_mb = one["last"]  # one micro-batch of a stage's layers (8 / (pp/4) layers each)
    assert one["first"] == pytest.approx(pp * per_mb, rel=1e-12)
    assert one["middle"] == pytest.approx((pp - 1) * per_mb, rel=1e-12)
    inter = _stages(model, Plan(**base, schedule="interleaved", virtual_stages=v))
    assert inter["first"] == pytest.approx((v * pp + pp - 1) / v * per_mb, rel=1e-12)
    assert inter["middle"] == pytest.approx((v * pp + pp - 3) / v * per_mb, rel=1e-12)
    assert inter["last"] == pytest.approx(((v - 1) * pp + 1) / v * per_mb, rel=1e-12)


def test_few_micro_batches_cap_the_warm_up():
    """With m micro-batches a rank runs at most m v chunk forwards before a backward: all
    stages hold m."""
    model = load_model("llama3-8b")
    one = _stages(model, Plan(gpus=4, pp=4, global_batch=4))
    inter = _stages(model, Plan(gpus=4, pp=4, global_batch=4, schedule="interleaved",
                                virtual_stages=4))
    assert inter["last"] == pytest.approx(min(4, (3 * 4 + 1) / 4) * one["last"], rel=1e-12)
    assert inter["first"] == pytest.approx(4 * one["last"], rel=1e-12)
