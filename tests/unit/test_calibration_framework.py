"""Fixed framework costs recovered from synthetic measurements (calibration.fit)."""

import numpy as np
import pandas as pd
import pytest

from calibration.fit import LAYER_KERNEL_MIX, KernelOverheadModel, OptimizerModel
from calibration.run import _fit_framework
from perfmodel.errors import DataError

LENGTHS = (4, 8, 16, 32)


def chains(per_op_s, intercept_s=2e-4, noise=0.02, seed=0):
    """Chain times t = c + N * per_op, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for op, cost in per_op_s.items():
        for n in LENGTHS:
            t = (intercept_s + n * cost) * (1 + noise * rng.standard_normal())
            rows.append({"op": op, "length": n, "time_s": t, "variant": "plain", "ranks": 2})
    return pd.DataFrame(rows)


def test_one_op_kind_gives_a_third_of_its_forward_backward_cost():
    # 90 us per op forward + backward: perfmodel charges 3 kernel overheads per forward kernel
    model = KernelOverheadModel().fit(chains({"linear": 90e-6}, noise=0.0))
    assert model.per_op_s_["linear"] == pytest.approx(90e-6, rel=1e-3)
    assert model.intercept_s_["linear"] == pytest.approx(2e-4, rel=1e-2)
    assert model.kernel_overhead_s_ == pytest.approx(30e-6, rel=1e-3)


def test_kinds_are_weighted_by_the_layer_mix():
    costs = {"linear": 120e-6, "layernorm": 60e-6, "gelu": 30e-6, "add": 15e-6, "softmax": 45e-6}
    model = KernelOverheadModel().fit(chains(costs))
    # by hand: (6*120 + 2*60 + 1*30 + 6*15 + 2*45) / 17 / 3 us = 1050 / 51 us = 20.6 us
    assert sum(LAYER_KERNEL_MIX.values()) == 17
    assert model.kernel_overhead_s_ == pytest.approx(1050e-6 / 51, rel=0.05)
    assert model.summary()["worst_rel_error"] < 0.1


def test_kernel_overhead_needs_two_lengths():
    one = chains({"add": 10e-6})
    with pytest.raises(DataError, match="2 lengths"):
        KernelOverheadModel().fit(one[one["length"] == 8])


def test_optimizer_bandwidth_and_fixed_cost():
    params = np.array([2e5, 8e5, 3.2e6, 7.1e6])
    t = 1e-3 + 36 * params / 3e9  # 1 ms per step, 3 GB/s at perfmodel's 36 bytes per parameter
    model = OptimizerModel(36).fit(pd.DataFrame({"params": params, "time_s": t}))
    assert model.bandwidth_bytes_per_s_ == pytest.approx(3e9, rel=1e-3)
    assert model.alpha_s_ == pytest.approx(1e-3, rel=1e-2)
    assert model.residuals_["worst_rel_error"] < 1e-3


def test_profile_fields_from_framework_records():
    df = chains({"linear": 90e-6, "add": 30e-6}, noise=0.0).assign(kind="kernel_chain")
    disp = pd.DataFrame(
        {
            "kind": "collective_dispatch",
            "implementation": ["dist.all_reduce", "dtensor.redistribute"],
            "nbytes": 16,
            "time_s": [1e-4, 3e-4],
            "ranks": 2,
        }
    )
    params = np.array([2e5, 8e5, 3.2e6])
    opt = pd.DataFrame({"kind": "optimizer", "params": params, "time_s": 36 * params / 2e9})
    fits, hardware, notes = {}, {"memory_bandwidth_bytes_per_s": 8e9}, []
    _fit_framework(pd.concat([df, disp, opt], ignore_index=True), fits, hardware, notes)
    # (6 * 90 + 6 * 30) / 12 / 3 us = 20 us
    assert hardware["kernel_overhead_s"] == pytest.approx(20e-6, rel=1e-3)
    assert hardware["collective_overhead_s"] == pytest.approx(2e-4)
    # the optimizer's own efficiency: memory_bandwidth_efficiency (the copy rate's) is untouched
    assert hardware["optimizer_bandwidth_efficiency"] == pytest.approx(0.25, rel=1e-3)
    assert "memory_bandwidth_efficiency" not in hardware
    assert hardware["optimizer_overhead_s"] == pytest.approx(0.0, abs=1e-6)
    assert set(fits) == {
        "kernel_overhead/plain",
        "collective_dispatch",
        "memory/adamw_foreach",
    }


def test_run_interrupted_before_the_framework_stage_keeps_the_other_fits():
    # regression: an interrupted run has no framework columns at all
    df = pd.DataFrame({"kind": ["gemm"], "time_s": [1e-3]})
    fits, hardware, notes = {}, {}, []
    _fit_framework(df, fits, hardware, notes)
    assert fits == {} and hardware == {}
