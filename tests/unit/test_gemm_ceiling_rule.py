"""One GEMM-ceiling rule for every GPU preset (docs/model.md, "GEMM ceiling"), recomputed from the
shared GEMM data (tests/data/gemm, a copy of ../shared/data/gemm; SOURCES.md):

    ceiling(GPU, dtype) = best measured TFLOP/s of the GPU in the dtype / its datasheet peak

the best measured TFLOP/s taken from the first source that has the GPU and dtype:
  1. MAMF (dataset 7): the best shape of a brute-force search over large shapes (torch.mm);
  2. the XLA sweep of the GPU's chip (datasets 1-4): its best shape (up to 4096^3);
  3. Triton's reference (dataset 8): the best shape's utilisation x its clock-adjusted peak
     (peak x 1350 MHz, the clock the reference ran at, / the datasheet's boost clock).
The ceiling is the entry's large-tile kernel's `large_max_fraction` where it has one (the fits of
the Blackwell and AMD sweeps), else its `max_fraction`. fp16 takes bf16's (the same tensor-core
rate); `default` is the preset's 16-bit entry. A part no source measured (H100 PCIe) takes the
ceilings of the measured part of the same chip, as fractions of its own peak. What a part sustains
in training against its measured ceiling is its sustained_clock_fraction (docs/model.md): a
sustained over a burst measurement of the same GEMM where one is published and its burst is the
ceiling (H100 SXM), a sustained measurement over the ceiling where the ceiling is no such burst
(A100 SXM), the PCIe/SXM pair's ratio for H100 PCIe, a flash kernel's (FlashAttention-4)
sustained over burst rate for B200 (its attention's too: flash_attention.sustained_fraction),
else 1.
"""

from __future__ import annotations

import pandas as pd
import pytest

from calibration.gemm_tables import read_gemm_table
from perfmodel import load_hardware
from perfmodel.costs.gemm_efficiency import gemm_efficiency
from perfmodel.specs import list_presets
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "gemm"
MAMF = pd.read_csv(DATA / "mamf-best-per-accelerator-ml-engineering.csv")
TRITON = pd.read_csv(DATA / "a100-v100-triton-matmul-reference-utilization.csv")

# Each preset's GPU in each source. MAMF: its accelerator name per dtype (its H100 SXM bf16 row
# says "H200 is the same"; H200 has its own fp8 row). XLA: the sweep file of the GPU's chip
# (sm_90: H100; sm_100: B200, GB200's chip; gfx942: MI300X and MI325X; gfx950: MI350X/MI355X) and
# its dtype names (fp8: e4m3 x e4m3 -> bf16, a forward GEMM of an FP8 step).
MAMF_NAMES = {
    "NVIDIA H100 80GB HBM3": {"bf16": "NVIDIA H100 SXM", "fp8": "NVIDIA H100 SXM"},
    "NVIDIA H200": {"bf16": "NVIDIA H100 SXM", "fp8": "NVIDIA H200 SXM"},
    "NVIDIA A100-SXM4-80GB": {"bf16": "NVIDIA A100 SXM"},
    "NVIDIA A100-SXM4-40GB": {"bf16": "NVIDIA A100 SXM"},
    "NVIDIA B200": {"bf16": "NVIDIA B200 SXM", "fp8": "NVIDIA B200 SXM"},
    "NVIDIA GB200": {"bf16": "NVIDIA GB200 SXM", "fp8": "NVIDIA GB200 SXM"},
    "AMD Instinct MI300X": {"bf16": "AMD MI300X"},
    "AMD Instinct MI325X": {"bf16": "AMD MI325X"},
    "AMD Instinct MI355X": {"bf16": "AMD MI355X"},
}
_SM90 = ("xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv",
         {"bf16": "bf16xbf16->bf16", "tf32": "f32xf32->f32"})
_SM100 = ("xla-matmul-perf-table-b200-sm100-bf16-f32-fp8.csv",
          {"bf16": "bf16xbf16->bf16", "tf32": "f32xf32->f32",
           "fp8": "f8e4m3fnxf8e4m3fn->bf16"})
_GFX942 = ("xla-matmul-perf-table-mi300-gfx942-bf16-f32-fp8.csv",
           {"bf16": "bf16xbf16->bf16", "tf32": "f32xf32->f32",
            "fp8": "f8e4m3fnuzxf8e4m3fnuz->bf16"})
# (gfx950's f32 rows ran in a bf16-class precision, SOURCES.md: no tf32 or fp32 entry)
_GFX950 = ("xla-matmul-perf-table-mi350-gfx950-multi-dtype.csv",
           {"bf16": "bf16xbf16->bf16", "fp8": "f8e4m3fnxf8e4m3fn->bf16"})
XLA = {"NVIDIA H100 80GB HBM3": _SM90, "NVIDIA H200": _SM90, "NVIDIA B200": _SM100,
       "NVIDIA GB200": _SM100, "AMD Instinct MI300X": _GFX942, "AMD Instinct MI325X": _GFX942,
       "AMD Instinct MI355X": _GFX950}
# (the sm_90 fp8 rows exceed the fp8 peak, SOURCES.md: not a measurement the rule can take)
TRITON_NAMES = {"NVIDIA A100-SXM4-80GB": ("a100", 1410), "NVIDIA A100-SXM4-40GB": ("a100", 1410),
                "Tesla V100-SXM2-32GB": ("v100", 1530)}
TRITON_CLOCK_MHZ = 1350
TRITON_DTYPES = {"bf16": "float16", "fp16": "float16", "tf32": "float32"}  # A100 bf16 = fp16 rate
# parts no source measured -> the preset of the measured part of the same chip
SAME_CHIP = {"NVIDIA H100 PCIe": "dgx-h100"}


def best_measured(gpu: str, dtype: str, peak: float) -> tuple[float, str] | None:
    """(best measured FLOP/s, its source) of a GPU in a dtype by the rule's order, or None."""
    look = "bf16" if dtype == "fp16" else dtype
    name = MAMF_NAMES.get(gpu, {}).get(look)
    if name is not None:
        table = "bf16" if look == "bf16" else "float8_e4m3fn"
        row = MAMF[(MAMF.accelerator == name) & (MAMF.table_dtype == table)]
        if len(row) and pd.notna(row.mamf_tflops.iloc[0]):
            return float(row.mamf_tflops.iloc[0]) * 1e12, f"MAMF {name}"
    if gpu in XLA and look in XLA[gpu][1]:
        file, dtypes = XLA[gpu]
        rows = read_gemm_table(DATA / file)
        return float(rows[rows["dtype"] == dtypes[look]]["flops_per_s"].max()), f"XLA {file}"
    if gpu in TRITON_NAMES and look in TRITON_DTYPES:
        name, boost = TRITON_NAMES[gpu]
        rows = TRITON[(TRITON.gpu == name) & (TRITON.dtype == TRITON_DTYPES[look])]
        if len(rows):
            util = float(rows.ref_utilization.max())
            return util * peak * TRITON_CLOCK_MHZ / boost, f"Triton {name}"
    return None


def ceiling(hw, dtype: str) -> float:
    """The entry's large-GEMM efficiency: its large-tile kernel's where it has one."""
    g = hw.gemm(dtype)
    return g.large_max_fraction if g.has_large_kernel else g.max_fraction


def rule_fraction(hw, dtype: str) -> tuple[float, str]:
    """The rule's ceiling for a preset's entry (dtype or `default`), with its source."""
    of = hw.default_dtype() if dtype == "default" else dtype  # default: the 16-bit entry
    if hw.gpu_name in SAME_CHIP:
        measured = load_hardware(SAME_CHIP[hw.gpu_name])
        return rule_fraction(measured, dtype if dtype in measured.gemm_efficiency
                             else "default")[0], f"as {measured.name}"
    peak = hw.peak(of)
    found = best_measured(hw.gpu_name, of, peak)
    assert found is not None, (f"{hw.name}: no shared GEMM data for {hw.gpu_name} in {of}: give "
                               f"no entry for it (or add the GPU to this test's source tables)")
    flops, source = found
    return flops / peak, source


def _entries():
    for name in list_presets()["hardware"]:
        hw = load_hardware(name)
        for dtype in hw.gemm_efficiency:
            yield pytest.param(name, dtype, id=f"{name}-{dtype}")


@pytest.mark.parametrize("name,dtype", list(_entries()))
def test_every_preset_ceiling_follows_the_rule(name, dtype):
    hw = load_hardware(name)
    want, source = rule_fraction(hw, dtype)
    assert ceiling(hw, dtype) == pytest.approx(want, abs=0.0006), source


def test_the_rule_gives_what_the_sources_say():
    # spot checks by hand (SOURCES.md): MAMF H100 bf16 794.5 of 989.4; A100 271.2 of 312; the XLA
    # sm_90 f32 sweep's best shape 403.1 TFLOP/s (TF32, of 494.7); Triton V100 fp16 0.849 at
    # 1350 MHz of a 1530 MHz peak
    assert best_measured("NVIDIA H100 80GB HBM3", "bf16", 989.4e12)[0] == 794.5e12
    assert best_measured("NVIDIA A100-SXM4-80GB", "fp16", 312e12)[0] == 271.2e12
    assert best_measured("NVIDIA H100 80GB HBM3", "tf32", 494.7e12)[0] == pytest.approx(
        403.15e12, rel=1e-3)
    assert best_measured("Tesla V100-SXM2-32GB", "fp16", 125e12)[0] == pytest.approx(
        0.849 * 125e12 * 1350 / 1530)
    # MAMF before a sweep: B200 fp8 3432.5 TFLOP/s (the sm_100 sweep's best e4m3 shape: 3279.7);
    # no MAMF fp8 row for MI325X: the gfx942 sweep's best fnuz shape, 1745.7
    assert best_measured("NVIDIA B200", "fp8", 4.5e15)[0] == 3432.5e12
    assert best_measured("AMD Instinct MI325X", "fp8", 2614.9e12)[0] == pytest.approx(
        1745.7e12, rel=1e-3)


def test_a_sustained_fraction_scales_the_gemms_not_the_fused_attention_nor_the_mfu_peak():
    from perfmodel import Plan, load_model, predict

    hw = load_hardware("dgx-a100-80gb").replace(sustained_clock_fraction=1.0)
    capped = hw.replace(sustained_clock_fraction=0.8)  # e.g. a power-capped part
    plan = Plan(gpus=8, tp=8, global_batch=8, micro_batch=1, flash_attention=True)
    model = load_model("llama3-8b")
    full, slow = predict(model, hw, plan), predict(model, capped, plan)
    for gemm in ("compute/forward/gemm", "compute/backward/gemm"):
        assert slow.breakdown_s[gemm] == pytest.approx(full.breakdown_s[gemm] / 0.8, rel=0.05)
    for kept in ("compute/forward/attention", "compute/backward/attention",
                 "compute/forward/elementwise"):
        assert slow.breakdown_s[kept] == pytest.approx(full.breakdown_s[kept], rel=1e-9)
    assert slow.mfu < full.mfu  # MFU stays against the datasheet peak
    assert slow.hardware_flops_per_step == full.hardware_flops_per_step


# Standard Kernel, "This Kernel Was Faster Yesterday - In Pursuit of High-Fidelity GPU Kernel
# Benchmarking" (standardkernel.com/blog, 2026-02-24), its power-and-clock table: one H100-SXM-5,
# a 16k x 16k x 16k matmul; "No Sleep" (power at the 700 W cap) 12.36 ms mean, "Sleep 500ms"
# (150-160 W, SM clock ~1970-1980 MHz) 11.04 ms.
H100_SUSTAINED_MS, H100_BURST_MS = 12.36, 11.04


def test_h100_sxm_sustains_the_measured_share_of_its_burst_gemm_rate():
    flops = 2 * 16384**3
    burst, sustained = flops / (H100_BURST_MS * 1e-3), flops / (H100_SUSTAINED_MS * 1e-3)
    assert burst > load_hardware("dgx-h100").peak("tf32")  # a 16-bit GEMM: above TF32's peak
    # MAMF's H100 SXM bf16 ceiling is the burst rate (within 0.5%), not the sustained one
    bf16 = MAMF[MAMF.table_dtype == "bf16"].set_index("accelerator").mamf_tflops
    assert bf16["NVIDIA H100 SXM"] * 1e12 == pytest.approx(burst, rel=0.005)
    assert sustained / burst == pytest.approx(0.893, abs=0.0005)
    for name in ("dgx-h100", "hgx-h200"):  # the same die at the same 700 W cap
        assert load_hardware(name).sustained_clock_fraction == pytest.approx(
            sustained / burst, abs=0.0005), name


def test_h100_pcie_sustains_the_one_pcie_sxm_pair_measured():
    # MAMF's A100 PCIe and SXM rows: the same SMs and datasheet clock, the PCIe part power-capped
    # (at its cap even in MAMF's loop: the SXM part's sustained share is not applied again)
    bf16 = MAMF[MAMF.table_dtype == "bf16"].set_index("accelerator").mamf_tflops
    ratio = bf16["NVIDIA A100 PCIe"] / bf16["NVIDIA A100 SXM"]
    pcie = load_hardware("h100-pcie")
    assert pcie.sustained_clock_fraction == pytest.approx(ratio, abs=0.0006)
    measured = {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200", *SAME_CHIP,
                "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"}
    for name, h in ((n, load_hardware(n)) for n in list_presets()["hardware"]):
        if h.gpu_name not in measured:  # no sustained measurement shared: the ceiling as measured
            assert h.sustained_clock_fraction == 1.0, name
        for kernel in (h.flash_attention, *h.flash_attention_alternatives):
            if kernel is not None and h.gpu_name != "NVIDIA B200":  # its benchmark's rates
                assert kernel.sustained_fraction == 1.0, (name, kernel.name)


# Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable' Data!
# [short]" (thonking.ai, 2024): one A100 at its 400 W limit, cuBLAS (torch.mm), 8192^3, back to
# back: 257 TFLOP/s with torch.randn inputs, 295 with zeros (fewer bit flips: under the cap).
A100_SUSTAINED, A100_UNDER_CAP = 257e12, 295e12


def test_a100_sxm_sustains_the_measured_rate_against_its_ceiling():
    bf16 = MAMF[MAMF.table_dtype == "bf16"].set_index("accelerator").mamf_tflops
    ceiling = bf16["NVIDIA A100 SXM"] * 1e12
    # MAMF's A100 SXM ceiling lies between the two: not the unthrottled rate (as H100's is), so
    # the sustained/unthrottled ratio would count the throttling its ceiling holds twice
    assert A100_SUSTAINED < ceiling < A100_UNDER_CAP * 0.95
    for name in ("dgx-a100-80gb", "dgx-a100-40gb"):  # A100 SXM4, 400 W both
        hw = load_hardware(name)
        assert hw.sustained_clock_fraction == pytest.approx(A100_SUSTAINED / ceiling, abs=0.0005)
        # the model's 8192^3 rate is the measured one less its shape factor (k 160, batch
        # 0.0186 of the XLA fit carried to A100: 4.3%), no more
        fit = hw.training_gemm("bf16")
        eff = float(gemm_efficiency(8192, 8192, 8192, fit.max_fraction, fit.half_dim, 1,
                                    fit.m_half_dim, fit.n_half_dim, fit.k_half_dim,
                                    fit.batch_half))
        assert 0.95 < eff * hw.peak("bf16") / A100_SUSTAINED < 1


# flashinfer-ai/flashinfer PR 2899, "bench: fix GPU power throttling in benchmark utilities"
# (2026-03-26, its description): FlashAttention-4, bf16, b 4, s 8192, 16 heads, d 128, on B200,
# 100 event-timed iterations back to back: 1450 TFLOP/s average over iterations 10-19 (the peak,
# SM clock 1965 MHz), 1237 over iterations 70-79 ("fully throttled": ~1580 MHz, ~1000 W).
B200_FA4_BURST, B200_FA4_SUSTAINED = 1450e12, 1237e12


def test_b200_sustains_the_measured_share_of_its_burst_flash_rate_in_attention_and_gemms():
    ratio = B200_FA4_SUSTAINED / B200_FA4_BURST
    b200 = load_hardware("dgx-b200")
    assert b200.flash_attention is not None
    assert b200.flash_attention.sustained_fraction == pytest.approx(ratio, abs=0.0005)
    # the GEMMs: no sustained GEMM measurement on B200; its GEMM ceiling (MAMF's burst rate) is
    # a larger share of the tensor peak than FA4's burst, so it draws no less power and throttles
    # no less: the same ratio
    bf16 = MAMF[MAMF.table_dtype == "bf16"].set_index("accelerator").mamf_tflops
    assert bf16["NVIDIA B200 SXM"] * 1e12 > B200_FA4_BURST
    assert b200.sustained_clock_fraction == pytest.approx(ratio, abs=0.0005)
    # GB200 runs its B200s at another cap (1,200 W) and no sustained measurement of it is shared
    assert load_hardware("gb200-nvl72").sustained_clock_fraction == 1.0


def test_a_flash_kernels_sustained_fraction_scales_its_attention_only():
    import dataclasses

    from perfmodel import Plan, load_model, predict

    hw = load_hardware("dgx-a100-80gb")
    assert hw.flash_attention is not None and hw.flash_attention.sustained_fraction == 1.0
    capped = hw.replace(flash_attention=dataclasses.replace(hw.flash_attention,
                                                            sustained_fraction=0.8))
    plan = Plan(gpus=8, tp=8, global_batch=8, micro_batch=1, flash_attention=True)
    model = load_model("llama3-8b")
    full, slow = predict(model, hw, plan), predict(model, capped, plan)
    for attention in ("compute/forward/attention", "compute/backward/attention"):
        assert full.breakdown_s[attention] > 0
        assert slow.breakdown_s[attention] > full.breakdown_s[attention] * 1.05
        assert slow.breakdown_s[attention] <= full.breakdown_s[attention] / 0.8 * (1 + 1e-9)
    for kept in ("compute/forward/gemm", "compute/backward/gemm", "compute/forward/elementwise"):
        assert slow.breakdown_s[kept] == pytest.approx(full.breakdown_s[kept], rel=1e-9)
    assert slow.hardware_flops_per_step == full.hardware_flops_per_step


def test_a_flash_kernels_sustained_fraction_survives_a_round_trip_and_a_kernel_laid_over_it():
    from perfmodel.specs.hardware import hardware_from_dict, load_hardware_dict, merge_hardware

    b200 = load_hardware("dgx-b200")
    assert hardware_from_dict(b200.to_dict(), "round trip") == b200
    # a calibrated profile's own kernel (calibrate run's sdpa) replaces the preset's whole: its
    # rates as measured (docs/model.md, "GEMM ceiling")
    sdpa = {"name": "sdpa", "kernel": "PyTorch SDPA as calibrate run measured it",
            "dtypes": ["bf16"], "by_head_dim": [
                {"head_dim": 128, "forward_max_fraction": 0.5, "forward_half_seq": 500,
                 "backward_max_fraction": 0.4, "backward_half_seq": 600}]}
    laid = hardware_from_dict(merge_hardware(load_hardware_dict("dgx-b200"),
                                             {"flash_attention": sdpa}), "profile")
    assert laid.flash_attention is not None and laid.flash_attention.sustained_fraction == 1.0
    assert laid.sustained_clock_fraction == b200.sustained_clock_fraction
    # a file restating only the fraction keeps the preset's kernel
    kept = hardware_from_dict(merge_hardware(load_hardware_dict("dgx-b200"),
                                             {"flash_attention": {"sustained_fraction": 1.0}}),
                              "file")
    assert kept.flash_attention is not None and kept.flash_attention.name == "cudnn"
    assert kept.flash_attention.sustained_fraction == 1.0
