"""ZeRO 3 keeps the fp32 master as the shard (FSDP2's mixed precision: no bf16 copy of the
shard), so bf16 with Adam holds 4 + 4 + 8 = 16 bytes per parameter over dp where Megatron's
distributed optimizer holds 2 + 4 + 12 / dp (perfmodel.costs.precision)."""

from __future__ import annotations

import pytest

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.costs.precision import model_state_bytes_per_param, sharded_state_bytes_per_param

HW = load_hardware("dgx-h100")


@pytest.mark.parametrize("precision, grad, optimizer, expected", [
    ("bf16", None, None, {"weights": 4, "gradients": 4, "optimizer_states": 8}),
    ("bf16", "bf16", None, {"weights": 4, "gradients": 2, "optimizer_states": 8}),
    # no master: the bf16 parameter is the one the optimizer updates (NeMo AutoModel's bf16 model)
    ("bf16", "bf16", "bf16", {"weights": 2, "gradients": 2, "optimizer_states": 4}),
    ("fp32", None, None, {"weights": 4, "gradients": 4, "optimizer_states": 8}),
])
def test_the_shard_is_the_master(precision, grad, optimizer, expected):
    assert sharded_state_bytes_per_param(precision, grad, optimizer) == expected
    unsharded = model_state_bytes_per_param(precision, grad, optimizer)
    master = 4 if (precision, optimizer) == ("bf16", None) else 0
    assert sum(expected.values()) == sum(unsharded.values()) - (2 if master else 0)


def test_zero3_holds_16_bytes_per_parameter_over_dp_and_zero1_megatrons_18():
    model = load_model("llama3-8b")
    dp = 8
    states = ("weights", "gradients", "optimizer_states")
    z3 = predict(model, HW, Plan(gpus=dp, dp=dp, zero=3, global_batch=dp)).memory_breakdown_bytes
    z1 = predict(model, HW, Plan(gpus=dp, dp=dp, zero=1, global_batch=dp)).memory_breakdown_bytes
    n = predict(model, HW, Plan(gpus=1, global_batch=1)).parameters
    # FSDP2 pads each unit's rows to a multiple of dp: the shard is at least P / dp
    assert sum(z3[k] for k in states) == pytest.approx(16 * n / dp, rel=1e-3)
    assert (z3["weights"], z3["optimizer_states"]) == pytest.approx(
        (4 * n / dp, 8 * n / dp), rel=1e-3)
    assert sum(z1[k] for k in states) == pytest.approx((2 + 4 + 12 / dp) * n, rel=1e-9)
