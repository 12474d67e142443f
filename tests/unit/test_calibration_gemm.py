"""The GEMM efficiency model against published GPU sweeps (tests/data/gemm, SOURCES.md).

Fitted on 4/5 of a sweep, it must predict the held-out fifth with a median relative error of at
most 10%, per GPU and dtype.
"""

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from calibration.cli import calibrate
from calibration.fit import GemmModel, holdout_error
from calibration.gemm_tables import (
    bytes_per_element,
    device_info,
    output_bytes_per_element,
    peak_for,
    read_gemm_table,
)
from perfmodel.errors import DataError
from perfmodel.specs.hardware import GemmEfficiency
from perfmodel.specs.profile import apply_profile, load_profile

DATA = Path(__file__).resolve().parents[1] / "data" / "gemm"
XLA = {
    "H100": "xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv",
    "B200": "xla-matmul-perf-table-b200-sm100-bf16-f32-fp8.csv",
    "MI300": "xla-matmul-perf-table-mi300-gfx942-bf16-f32-fp8.csv",
    "MI350": "xla-matmul-perf-table-mi350-gfx950-multi-dtype.csv",
}
NVIDIA_DTYPES = [
    "bf16xbf16->bf16",
    "f32xf32->f32",
    "f8e4m3fnxf8e4m3fn->bf16",
    "f8e4m3fnxf8e5m2->bf16",
    "f8e5m2xf8e4m3fn->bf16",
]
# AMD: every dtype of the sweeps. hipBLASLt's split-K switch makes efficiency fall by up to 2x along
# batch*m*n = ~512 k, and its large-tile kernels lift it above a size (MI300 fp8: a median of 5% of
# peak below 2^33 FLOPs, 31% above); the model's split-K and large-kernel terms follow them
# (perfmodel.costs.gemm_efficiency).
MI350_DTYPES = [
    f"{a}x{b}->{out}"
    for a, b, outs in (
        ("bf16", "bf16", ("bf16", "f32")),
        ("f16", "f16", ("f16", "f32")),
        ("f32", "f32", ("f32",)),
        ("f8e4m3fn", "f8e4m3fn", ("bf16", "f32", "f8e4m3fn")),
        ("f8e4m3fn", "f8e5m2", ("bf16", "f32", "f8e4m3fn", "f8e5m2")),
        ("f8e5m2", "f8e4m3fn", ("bf16", "f32", "f8e4m3fn", "f8e5m2")),
    )
    for out in outs
]
AMD = {
    "MI300": ["bf16xbf16->bf16", "bf16xbf16->f32", "f32xf32->f32", "f8e4m3fnuzxf8e4m3fnuz->bf16"],
    "MI350": MI350_DTYPES,
}
CASES = [(gpu, dt) for gpu in ("H100", "B200") for dt in NVIDIA_DTYPES]
CASES += [(gpu, dt) for gpu, dts in AMD.items() for dt in dts]


def holdout(gpu, dtype):
    table = read_gemm_table(DATA / XLA[gpu])
    rows = table[table["dtype"] == dtype]
    assert len(rows) == 375  # b in {1,2,4} x m, n, k in {256 .. 4096}
    device = rows["device"].iloc[0]
    peak, _ = peak_for(device, dtype)
    bw = device_info(device)["memory_bandwidth_bytes_per_s"]
    return holdout_error(
        rows,
        lambda: GemmModel(peak, bw, bytes_per_element(dtype), output_bytes_per_element(dtype)),
        folds=5,
    )


@pytest.mark.parametrize(("gpu", "dtype"), CASES)
def test_gemm_model_predicts_held_out_shapes_within_10_percent(gpu, dtype):
    err = holdout(gpu, dtype)
    assert err["median_rel_error"] <= 0.10, err


def test_small_shapes_are_floor_bound_and_large_ones_near_peak():
    """256^3 bf16 on H100 runs at under 1% of peak; the fitted floor must explain it."""
    table = read_gemm_table(DATA / XLA["H100"])
    rows = table[table["dtype"] == "bf16xbf16->bf16"]
    model = GemmModel(989.4e12, 3.35e12, 2).fit(rows)
    small = rows[(rows.b == 1) & (rows.m == 256) & (rows.n == 256) & (rows.k == 256)]
    assert small["flops_per_s"].iloc[0] / 989.4e12 < 0.01
    assert model.predict(small)[0] == pytest.approx(small["time_s"].iloc[0], rel=0.15)
    assert 3e-6 < model.params_["min_time_s"] < 1e-5  # a few microseconds per kernel


def test_predicted_time_is_never_below_flops_over_peak():
    table = read_gemm_table(DATA / XLA["B200"])
    rows = table[table["dtype"] == "bf16xbf16->bf16"]
    model = GemmModel(2.25e15, 8e12, 2).fit(rows)
    flops = 2 * rows.b * rows.m * rows.n * rows.k
    assert (model.predict(rows) >= flops / 2.25e15).all()


def test_deepgemm_table_reads_shapes_and_groups():
    table = read_gemm_table(DATA / "h800-fp8-deepgemm-deepseek-v3-shapes.csv")
    dense = table[table["dtype"] == "fp8e4m3-blockscaled"]
    assert (dense["b"] == 1).all() and len(dense) == 36  # 18 shapes x 2 README versions
    grouped = table[table["dtype"].str.endswith("grouped")]
    # README: grouped_contiguous, 4 groups of m=8192, n=4096, k=7168 at 1297 TFLOP/s
    row = grouped[(grouped.b == 4) & (grouped.m == 8192) & (grouped.n == 4096)].iloc[0]
    assert row["flops_per_s"] == pytest.approx(1297e12)


def test_deepgemm_table_without_a_groups_column_is_dense(tmp_path):
    # found by mypy: pd.to_numeric of the missing column gave a scalar NaN, whose .fillna failed
    table = tmp_path / "dense.csv"
    table.write_text("m_or_m_per_group,n,k,tflops\n64,2112,7168,206\n128,2112,7168,352\n")
    rows = read_gemm_table(table)
    assert list(rows["b"]) == [1, 1] and list(rows["dtype"]) == ["fp8e4m3-blockscaled"] * 2
    assert list(rows["flops_per_s"]) == [206e12, 352e12]


def test_best_shape_only_table_is_refused_clearly():
    with pytest.raises(DataError, match="not a GEMM sweep"):
        read_gemm_table(DATA / "mamf-best-per-accelerator-ml-engineering.csv")


def test_bad_value_names_line_and_column(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "device_key,b,m,n,k,dtype,flops_per_s\nsm_90,1,256,256,256,bf16,1e12\n"
        "sm_90,1,512,-512,512,bf16,2e12\n"
    )
    with pytest.raises(DataError, match=r"bad.csv:3: column 'n'"):
        read_gemm_table(bad)


def test_import_gemm_cli_writes_a_profile_predict_can_use(tmp_path):
    out = tmp_path / "h100-gemm.json"
    res = CliRunner().invoke(
        calibrate, ["import-gemm", str(DATA / XLA["H100"]), "--out", str(out), "--base", "dgx-h100"]
    )
    assert res.exit_code == 0, res.output
    assert "exceed" in res.output  # the suspect sm_90 fp8 rows are reported, not written
    profile = load_profile(out)
    hw = apply_profile(None, profile)
    assert set(profile.hardware["gemm_efficiency"]) == {"bf16", "tf32"}
    assert hw.gemm("bf16").min_time_s > 0 and hw.gemm("fp8").max_fraction == pytest.approx(0.709)
    fit = profile.fits["gemm/sm_90/bf16xbf16->bf16"]
    assert fit["holdout_median_rel_error"] <= 0.10


def _specialised_step_s(model, hw, plan) -> float:
    """The step time of the plan's own specialised family (what `perfmodel explain` prints), built
    apart from predict's universal family and evaluated with the plan's values through its own
    numpy code (perfmodel.evaluate.compile_outputs: 0.2 s, where substituting the numbers into
    the expression with sympy's xreplace takes 6 s)."""
    from perfmodel.evaluate import compile_outputs, family_of, values_of

    family = family_of(model, hw, plan, specialise=True)
    step = compile_outputs(family, "specialised_step", lambda built: {"step": built.step_time})
    return float(step(values_of(model, hw, plan))["step"])


def test_split_k_fit_reaches_the_step_model():
    """A hardware whose GEMM fit splits K compiles the switch into the step model: a threshold
    that splits every GEMM changes the compute terms, and the specialised (explain) family gives
    the same step time as the universal one that predict and recommend evaluate."""
    from perfmodel import Plan, load_hardware, load_model, predict
    from perfmodel.evaluate import family_of

    model, base = load_model("llama2-7b"), load_hardware("mi300x")
    plain = GemmEfficiency(max_fraction=0.7, half_dim=0, k_half_dim=512, parallel_half=1e6)
    split = dataclasses.replace(plain, split_k_ratio=1e12, split_k_chunk=64)
    plan = Plan(gpus=8, tp=8, global_batch=8)
    results = {}
    for name, gemm in (("plain", plain), ("split", split)):
        hw = base.replace(gemm_efficiency={"default": gemm})
        assert family_of(model, hw, plan).gemm_split_k == (name == "split")
        results[name] = pred = predict(model, hw, plan)
        assert _specialised_step_s(model, hw, plan) == pytest.approx(pred.step_time_s, rel=1e-9)
    gemm = "compute/forward/gemm"
    # chunks of 64 instead of k: each tile's pipeline is mostly fill (k_half_dim 512)
    assert results["split"].breakdown_s[gemm] > 2 * results["plain"].breakdown_s[gemm]


def test_large_kernel_and_epilogue_reach_the_step_model():
    """A hardware whose bf16 GEMM fit has a large-tile kernel and an epilogue compiles both into
    the step model: a large kernel at half the efficiency from 1 FLOP on doubles the GEMM time;
    the specialised (explain) family agrees with the universal one; a dtype of the same hardware
    without them, or without split-K (fp16), predicts as a hardware that never had them."""
    from perfmodel import Plan, load_hardware, load_model, predict
    from perfmodel.evaluate import family_of

    model, base = load_model("llama2-7b"), load_hardware("mi300x")
    plain = GemmEfficiency(max_fraction=0.7, half_dim=0, k_half_dim=512, parallel_half=1e4)
    large = dataclasses.replace(plain, large_flops=1.0, large_max_fraction=0.35,
                                large_parallel_half=1e4)
    epi = dataclasses.replace(plain, epilogue_s=1e-12)
    split = dataclasses.replace(plain, split_k_ratio=1e12, split_k_chunk=64)
    gemm = "compute/forward/gemm"
    times = {}
    for name, bf16 in (("plain", plain), ("large", large), ("epilogue", epi), ("split", split)):
        hw = base.replace(gemm_efficiency={"default": plain, "bf16": bf16})
        fam = family_of(model, hw, Plan(gpus=8, tp=8, global_batch=8))
        assert (fam.gemm_large_kernel, fam.gemm_epilogue, fam.gemm_split_k) == (
            name == "large", name == "epilogue", name == "split")
        for dtype in ("bf16", "fp16"):
            plan = Plan(gpus=8, tp=8, global_batch=8, dtype=dtype)
            times[name, dtype] = pred = predict(model, hw, plan)
            assert _specialised_step_s(model, hw, plan) == pytest.approx(pred.step_time_s,
                                                                      rel=1e-9)
    assert times["large", "bf16"].breakdown_s[gemm] == pytest.approx(
        2 * times["plain", "bf16"].breakdown_s[gemm], rel=1e-6)
    assert times["epilogue", "bf16"].breakdown_s[gemm] > times["plain", "bf16"].breakdown_s[gemm]
    # regression: fp16 without split-K under a split-K family divided by its chunk of 0
    for name in ("large", "epilogue", "split"):
        assert times[name, "fp16"].step_time_s == pytest.approx(times["plain", "fp16"].step_time_s,
                                                               rel=1e-12)
