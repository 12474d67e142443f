"""The gemm stage's sustained point (calibration.bench.bench_gemm_sustained) and the profile's
sustained_clock_fraction fitted from it (calibration.run._fit_gemm_sustained): the sweep's time
of the largest square GEMM over its time back to back once the device settled, written on a GPU
(docs/model.md, "GEMM ceiling"), reported on CPU ranks."""

from __future__ import annotations

import pandas as pd
import pytest

from calibration.bench import count_measurements, sustained_shape, sweep_for
from calibration.run import _fit_gemm, _fit_gemm_sustained


def _records(swept_s: float, settled_s: float, dtype: str = "bf16", size: int = 8192,
             sweep_shape: int | None = None) -> pd.DataFrame:
    n = size if sweep_shape is None else sweep_shape
    return pd.DataFrame([
        {"kind": "gemm", "dtype": dtype, "b": 1, "m": n, "n": n, "k": n, "time_s": swept_s},
        {"kind": "gemm_sustained", "dtype": dtype, "b": 1, "m": size, "n": size, "k": size,
         "time_s": settled_s, "duration_s": 10.0, "chunks": 200},
    ])


def test_a_gpu_profile_takes_the_sweeps_time_over_the_settled_one():
    fits: dict = {}
    hardware = _swept_gpu_hardware()
    notes: list[str] = []
    _fit_gemm_sustained(_records(11.04e-3, 12.36e-3), {"device_type": "cuda"}, fits, hardware,
                        notes)
    assert hardware["sustained_clock_fraction"] == pytest.approx(11.04 / 12.36)
    fit = fits["gemm_sustained/cuda/bf16"]
    assert fit["shape"] == [1, 8192, 8192, 8192] and fit["written"] == pytest.approx(0.8932, 1e-3)
    assert not notes


def test_a_settled_run_faster_than_the_sweep_is_noise_and_writes_one():
    fits: dict = {}
    hardware: dict = {}
    notes: list[str] = []
    _fit_gemm_sustained(_records(10e-3, 9.5e-3), {"device_type": "cuda"}, fits, hardware, notes)
    assert hardware["sustained_clock_fraction"] == 1.0
    assert fits["gemm_sustained/cuda/bf16"]["ratio"] == pytest.approx(10 / 9.5)
    assert any("noise" in n for n in notes)


def test_cpu_ranks_report_it_and_keep_the_ceiling_as_swept():
    fits: dict = {}
    hardware: dict = {"sustained_clock_fraction": 1.0}
    notes: list[str] = []
    _fit_gemm_sustained(_records(2.0e-3, 2.4e-3, "fp32", 512), {"device_type": "cpu"}, fits,
                        hardware, notes)
    assert hardware["sustained_clock_fraction"] == 1.0
    assert fits["gemm_sustained/cpu/fp32"]["written"] is None
    assert any("not written" in n and "0.833" in n for n in notes)


def test_a_shape_the_sweep_did_not_time_is_named_not_guessed():
    fits: dict = {}
    hardware: dict = {}
    notes: list[str] = []
    _fit_gemm_sustained(_records(1e-3, 1e-3, sweep_shape=4096), {"device_type": "cuda"}, fits,
                        hardware, notes)
    assert "sustained_clock_fraction" not in hardware and not fits
    assert any("no time of that shape" in n for n in notes)


def _swept_hardware(device: str, dtype: str, rate: float) -> dict:
    """The hardware fields _fit_gemm writes from a sweep of one dtype at `rate` FLOP/s for
    large GEMMs (half of it at 32 rows or columns)."""
    from calibration.fit import GemmModel

    shapes = [(m, n, k) for m in (64, 512, 2048) for n in (128, 1024) for k in (256, 4096)]
    assert len(shapes) >= GemmModel.MIN_POINTS
    rows = [{"kind": "gemm", "dtype": dtype, "b": 1, "m": m, "n": n, "k": k,
             "time_s": 2 * m * n * k / (rate * m / (m + 32) * n / (n + 32)) + 5e-6}
            for m, n, k in shapes]
    hardware: dict = {}
    _fit_gemm(pd.DataFrame(rows), {"device_type": device}, {}, hardware, [])
    assert "gemm_efficiency" in hardware
    return hardware


def _swept_gpu_hardware() -> dict:
    return _swept_hardware("cuda", "bf16", 7e14)


def test_a_swept_cpu_profile_states_its_ceilings_as_measured():
    # a profile laid over a preset (dgx-h100: 0.893 against MAMF's burst) must not derate its
    # own measured ceilings by the preset's fraction
    assert _swept_hardware("cpu", "fp32", 1e11)["sustained_clock_fraction"] == 1.0


@pytest.mark.parametrize("device, quick, seconds", [("cuda", False, 10.0), ("cuda", True, 6.0),
                                                     ("cpu", False, 1.0), ("cpu", True, 0.5)])
def test_the_sweep_runs_its_largest_square_gemm_long_enough(device, quick, seconds):
    sweep = sweep_for(device, quick)
    assert sweep.sustained_s == seconds
    shape = sustained_shape(sweep)
    assert shape is not None and shape in sweep.gemm_shapes
    assert shape[1] == max(s[1] for s in sweep.gemm_shapes if s[1] == s[2] == s[3])
    without = count_measurements(sweep.__class__(**{**sweep.__dict__, "sustained_s": 0.0}), 2, 2,
                                 device)
    assert count_measurements(sweep, 2, 2, device) == without + 1


def test_a_gpu_sweep_without_its_sustained_point_keeps_the_presets_fraction_and_says_so():
    hardware = _swept_gpu_hardware()
    assert "sustained_clock_fraction" not in hardware  # not 1: the sweep's rates may be bursts
    notes: list[str] = []
    frame = pd.DataFrame([{"kind": "gemm", "dtype": "bf16", "b": 1, "m": 64, "n": 64, "k": 64,
                           "time_s": 1e-5}])
    _fit_gemm_sustained(frame, {"device_type": "cuda"}, {}, hardware, notes)
    assert "sustained_clock_fraction" not in hardware
    assert any("not run" in n and "keeps its own" in n for n in notes)


def test_a_gpu_point_too_short_to_settle_is_reported_not_written():
    hardware = _swept_gpu_hardware()
    fits: dict = {}
    notes: list[str] = []
    short = _records(11.04e-3, 12.36e-3).assign(duration_s=0.2)
    _fit_gemm_sustained(short, {"device_type": "cuda"}, fits, hardware, notes)
    assert "sustained_clock_fraction" not in hardware
    assert fits["gemm_sustained/cuda/bf16"]["written"] is None
    assert any("0.2 s" in n and "settle" in n for n in notes)
