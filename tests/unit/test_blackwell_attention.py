"""The Blackwell presets' flash-attention kernel, refitted from the published measurements.

cuDNN's fused attention as NVIDIA's cudnn-frontend SDPA training benchmark measured it (causal,
bf16, head dim 128, batch 1, 128 query and 8 key/value heads; FLOPs counted as FlashAttention-3's
paper does: forward 4 b h s^2 d / 2 causal, backward 2.5 x the forward):
- B200, cuDNN 9.13.1: github NVIDIA/cudnn-frontend @ 0b1577c8c83401237d601d0d0db5210506705396,
  benchmark/sdpa_benchmark_training/artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv (its
  bf16 rows: fwd_tflops_per_sec, bwd_tflops_per_sec);
- GB200, cuDNN 9.17.0: the same benchmark @ b372d39879d44c91a8d5b342022e74802b6a8da2,
  benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv (its
  cudnn_fe rows).
The presets fit TFLOP/s = peak x max_fraction x s / (s + half_seq) in log least squares at
s = 1k..32k (the 512-token point is listed, and left out).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import least_squares

from perfmodel import load_hardware

SEQ = (512, 1024, 2048, 4096, 8192, 16384, 32768)
# (preset, bf16 dense peak [TFLOP/s], forward, backward TFLOP/s at SEQ): the published figures
PUBLISHED = [
    ("dgx-b200", 2250.0,
     (244.143, 561.287, 907.547, 1141.140, 1384.231, 1475.253, 1514.764),
     (200.594, 376.937, 545.088, 832.907, 994.850, 1151.690, 1180.250)),
    ("gb200-nvl72", 2500.0,
     (408.0, 733.0, 1069.0, 1386.0, 1584.0, 1668.0, 1681.0),
     (329.0, 527.0, 655.0, 1054.0, 1211.0, 1304.0, 1348.0)),
]
FITTED = slice(1, None)  # s = 1k..32k


def _fit(peak: float, tflops: tuple[float, ...]) -> tuple[np.ndarray, float]:
    s, t = np.array(SEQ[FITTED], float), np.array(tflops[FITTED], float)
    fit = least_squares(lambda p: np.log(peak * p[0] * s / (s + p[1])) - np.log(t), [0.7, 1e3],
                        bounds=([0, 0], [1.5, 1e6])).x
    err = peak * fit[0] * s / (s + fit[1]) / t - 1
    return fit, float(np.abs(err).max())


@pytest.mark.parametrize(("preset", "peak", "forward", "backward"), PUBLISHED)
def test_the_preset_is_the_fit_of_the_published_runs(preset, peak, forward, backward):
    hardware = load_hardware(preset)
    assert hardware.peak("bf16") == pytest.approx(peak * 1e12)
    kernel = hardware.flash_kernel("bf16")
    assert kernel is not None and "cuDNN" in kernel.kernel
    point = kernel.at(128)
    for pass_, tflops, fraction, half in (
            ("forward", forward, point.forward_max_fraction, point.forward_half_seq),
            ("backward", backward, point.backward_max_fraction, point.backward_half_seq)):
        (want_fraction, want_half), worst = _fit(peak, tflops)
        assert fraction == pytest.approx(want_fraction, abs=5e-4), pass_
        assert half == pytest.approx(want_half, abs=1.0), pass_
        assert worst < 0.14, pass_  # the presets' comments state each fit's worst error


def test_flash_is_the_default_on_blackwell():
    """--attention auto takes the measured kernel where the hardware has one for the dtype."""
    from perfmodel import load_model, predict

    model = load_model("llama3-8b").replace(seq_len=4096)
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, zero=1)
    for preset in ("dgx-b200", "gb200-nvl72"):
        auto = predict(model, preset, plan)
        flash = predict(model, preset, dict(plan, flash_attention=True))
        assert auto.step_time_s == flash.step_time_s
        assert auto.step_time_s != predict(model, preset,
                                           dict(plan, flash_attention=False)).step_time_s
