"""A GPU's flash kernels by name (HardwareSpec.flash_attention_alternatives, Plan.attention_kernel):
H100's FlashAttention-2 beside its cuDNN kernel, fitted as the default kernel is."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.optimize import least_squares

from perfmodel import PlanError, SpecError, load_hardware, load_model, predict
from perfmodel.specs.hardware import hardware_from_dict

S = np.array([512, 1024, 2048, 4096, 8192, 16384], dtype=float)
# FlashAttention-2 forward on H100 80GB SXM5, causal mask, TFLOP/s at s = 512 .. 16k (Shah et al.
# 2024, arXiv 2407.08608, Fig. 5b head dim 64 and 5d head dim 128; github Dao-AILab/
# flash-attention assets/flash3_fp16_fwd.png, its FlashAttention-2 bars)
FA2_FWD = {64: [180, 229, 262, 284, 295, 299], 128: [191, 260, 298, 319, 333, 335]}
# FlashAttention-2 forward + backward on H100 80GB SXM5, causal mask (github Dao-AILab/
# flash-attention assets/flash2_h100_fwd_bwd_benchmark.png, panels c head dim 64 and d head dim
# 128)
FA2_FWD_BWD = {64: [141, 192, 232, 257, 273, 284], 128: [163, 221, 265, 294, 308, 328]}
PEAK = 989.4  # H100 SXM bf16, TFLOP/s


def _fit(tflops: np.ndarray) -> tuple[float, float]:
    """The presets' form, peak x f x s / (s + s_half), by log least squares."""
    def residual(p: np.ndarray) -> np.ndarray:
        return np.log(PEAK * p[0] * S / (S + p[1])) - np.log(tflops)
    return tuple(least_squares(residual, [0.4, 500], bounds=([0, 0], [1, 1e5])).x)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_h100_fa2_kernel_is_fitted_from_its_published_benchmarks(head_dim):
    forward = np.array(FA2_FWD[head_dim], dtype=float)
    # the backward's rate from the forward and the forward + backward (FLOPs 1 : 2.5)
    backward = 2.5 / (3.5 / np.array(FA2_FWD_BWD[head_dim], dtype=float) - 1 / forward)
    point = load_hardware("dgx-h100").named_flash_kernel("fa2").at(head_dim)
    for series, f, half in ((forward, point.forward_max_fraction, point.forward_half_seq),
                            (backward, point.backward_max_fraction, point.backward_half_seq)):
        fitted_f, fitted_half = _fit(series)
        assert f == pytest.approx(fitted_f, abs=0.002)
        assert half == pytest.approx(fitted_half, rel=0.01)
        assert PEAK * f * S / (S + half) == pytest.approx(series, rel=0.04)


def test_a_plan_picks_a_kernel_by_name():
    model = load_model("llama3-8b")
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, zero=1)
    default = predict(model, "dgx-h100", plan)
    cudnn = predict(model, "dgx-h100", dict(plan, attention_kernel="cudnn"))
    fa2 = predict(model, "dgx-h100", dict(plan, attention_kernel="fa2"))
    assert cudnn.step_time_s == default.step_time_s
    hw = load_hardware("dgx-h100")
    for kernel, result in (("cudnn", cudnn), ("fa2", fa2)):
        point = hw.flash_kernel("bf16", kernel).at(128)
        s = model.seq_len
        flops = model.layers * 0.5 * 4 * model.heads * s * s * model.head_dim
        assert result.breakdown_s["compute/forward/attention"] == pytest.approx(
            flops / (PEAK * 1e12 * point.forward_max_fraction) * (1 + point.forward_half_seq / s),
            rel=1e-9)
    # FlashAttention-2 on H100 runs at about 0.6 of cuDNN's rate
    ratio = fa2.breakdown_s["compute/forward/attention"] \
        / cudnn.breakdown_s["compute/forward/attention"]
    assert 1.5 < ratio < 1.8
    assert fa2.to_dict()["plan"]["attention_kernel"] == "fa2"
    assert "attention_kernel" not in default.to_dict()["plan"]


def test_what_a_kernel_name_cannot_mean_is_refused():
    model = load_model("llama3-8b")
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8)
    with pytest.raises(PlanError, match="'dgx-b200' has no measured flash kernel called so; "
                                        "its kernels: cudnn"):
        predict(model, "dgx-b200", dict(plan, attention_kernel="fa2"))
    with pytest.raises(PlanError, match="attends unfused"):
        predict(model, "dgx-h100", dict(plan, attention_kernel="fa2", flash_attention=False))
    with pytest.raises(PlanError, match="measured for bf16, fp16, not fp32"):
        predict(model, "dgx-h100", dict(plan, attention_kernel="fa2", dtype="fp32"))
    spec = load_hardware("dgx-h100").to_dict()
    spec["flash_attention_alternatives"] = [dict(spec["flash_attention_alternatives"][0],
                                                 name="")]
    with pytest.raises(SpecError, match="missing required field 'name'"):
        hardware_from_dict(spec, "h100.yaml")
    spec["flash_attention_alternatives"] = [dict(spec["flash_attention_alternatives"][0],
                                                 name="cudnn")]
    with pytest.raises(SpecError, match="a name is given twice"):
        hardware_from_dict(spec, "h100.yaml")


def test_the_cli_names_the_kernel(run_cli, tmp_path):
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "64", "--attention-kernel", "fa2")
    assert res.returncode == 0, res.stderr
    assert "flash attention (fa2)" in res.stdout
    res = run_cli("presets", "--json")
    kernels = json.loads(res.stdout)["flash_kernels"]
    assert kernels["dgx-h100"] == ["cudnn", "fa2"] and kernels["dgx-a100-80gb"] == ["fa2"]
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--attention-kernel", "fa2", "--json")
    assert res.returncode == 0, res.stderr
    assert all(p["plan"]["attention_kernel"] == "fa2" for p in json.loads(res.stdout)["plans"])
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-a100-80gb", "--gpus", "8",
                  "--global-batch", "64", "--attention-kernel", "cudnn")
    assert res.returncode == PlanError.exit_code
    assert "its kernels: fa2" in res.stderr and "Traceback" not in res.stderr


def test_megatron_writes_the_backend_of_the_kernel():
    from perfmodel.configs.megatron import megatron_arguments
    from perfmodel.strategy import plan_from_dict

    model = load_model("llama3-8b")
    for kernel, backend in (("cudnn", "fused"), ("fa2", "flash"), (None, "flash")):
        plan = plan_from_dict(dict(gpus=8, dp=8, global_batch=8, flash_attention=True,
                                   attention_kernel=kernel))
        args = [a for group in megatron_arguments(model, plan) for a in group]
        assert args[args.index("--attention-backend") + 1] == backend
