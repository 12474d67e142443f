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
FA2_FWD = {64: [180, 229, 262, 284, 295, 299], 128: [191, 260, 298, 319, 333, 335],
           256: [208, 251, 278, 293, 297, 298]}  # and Fig. 5f, head dim 256 (forward only)
# FlashAttention-2 forward + backward on H100 80GB SXM5, causal mask (github Dao-AILab/
# flash-attention assets/flash2_h100_fwd_bwd_benchmark.png, panels c head dim 64 and d head dim
# 128)
FA2_FWD_BWD = {64: [141, 192, 232, 257, 273, 284], 128: [163, 221, 265, 294, 308, 328]}
PEAK = 989.4  # H100 SXM bf16, TFLOP/s


def _fit(tflops: np.ndarray, peak: float = PEAK) -> tuple[float, float]:
    """The presets' form, peak x f x s / (s + s_half), by log least squares."""
    def residual(p: np.ndarray) -> np.ndarray:
        return np.log(peak * p[0] * S / (S + p[1])) - np.log(tflops)
    return tuple(least_squares(residual, [0.4, 500], bounds=([0, 0], [1, 1e5])).x)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_the_h100_fa2_kernel_is_fitted_from_its_published_benchmarks(head_dim):
    forward = np.array(FA2_FWD[head_dim], dtype=float)
    point = load_hardware("dgx-h100").named_flash_kernel("fa2").at(head_dim)
    fitted = [(forward, point.forward_max_fraction, point.forward_half_seq)]
    if head_dim in FA2_FWD_BWD:  # no backward at head dim 256: the preset takes 128's
        # the backward's rate from the forward and the forward + backward (FLOPs 1 : 2.5)
        backward = 2.5 / (3.5 / np.array(FA2_FWD_BWD[head_dim], dtype=float) - 1 / forward)
        fitted.append((backward, point.backward_max_fraction, point.backward_half_seq))
    else:
        at_128 = load_hardware("dgx-h100").named_flash_kernel("fa2").at(128)
        assert (point.backward_max_fraction, point.backward_half_seq) == \
            (at_128.backward_max_fraction, at_128.backward_half_seq)
    for series, f, half in fitted:
        fitted_f, fitted_half = _fit(series)
        assert f == pytest.approx(fitted_f, abs=0.002)
        assert half == pytest.approx(fitted_half, rel=0.01)
        assert PEAK * f * S / (S + half) == pytest.approx(series, rel=0.04)


# FlashAttention in Triton (flash_attn/flash_attn_triton.py) and FlashAttention-2, forward +
# backward on A100 80GB SXM4, causal mask, TFLOP/s at s = 512 .. 16k (github Dao-AILab/
# flash-attention assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35, panels c head dim 64 and
# d head dim 128, the "FlashAttention Triton" and "FlashAttention-2" bars)
A100_FWD_BWD = {"triton": {64: [59, 75, 79, 76, 79, 80], 128: [50, 61, 68, 74, 78, 80]},
                "fa2": {64: [88, 119, 140, 156, 165, 171], 128: [99, 133, 155, 173, 182, 189]}}


@pytest.mark.parametrize("kernel", ["triton", "fa2"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_a100_kernels_are_fitted_from_their_published_benchmark(kernel, head_dim):
    """Only forward + backward is published for A100: both directions take its one fit."""
    series = np.array(A100_FWD_BWD[kernel][head_dim], dtype=float)
    peak = 312.0  # A100 SXM bf16, TFLOP/s
    for hardware in ("dgx-a100-80gb", "dgx-a100-40gb"):
        point = load_hardware(hardware).named_flash_kernel(kernel).at(head_dim)
        fitted_f, fitted_half = _fit(series, peak)
        for f, half in ((point.forward_max_fraction, point.forward_half_seq),
                        (point.backward_max_fraction, point.backward_half_seq)):
            assert f == pytest.approx(fitted_f, abs=0.001)
            assert half == pytest.approx(fitted_half, rel=0.01)
            # within 7% of every bar (head dim 64's Triton bars dip at 4k)
            assert peak * f * S / (S + half) == pytest.approx(series, rel=0.07)


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
    for unfused in (False, "false", 0):  # as a flag, as a file's text, as a number
        with pytest.raises(PlanError, match="attends unfused"):
            predict(model, "dgx-h100", dict(plan, attention_kernel="fa2", flash_attention=unfused))
    with pytest.raises(PlanError, match="measured for bf16, fp16, not fp32"):
        predict(model, "dgx-h100", dict(plan, attention_kernel="fa2", dtype="fp32"))
    spec = load_hardware("dgx-h100").to_dict()
    spec["flash_attention_alternatives"] = [dict(spec["flash_attention_alternatives"][0],
                                                 name="")]
    with pytest.raises(SpecError, match="^h100.yaml: flash_attention_alternatives\\[0\\]: "
                                        "missing required field 'name'"):
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
    assert kernels["dgx-h100"] == ["cudnn", "fa2"]
    assert kernels["dgx-a100-80gb"] == kernels["dgx-a100-40gb"] == ["fa2", "triton"]
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--attention-kernel", "fa2", "--json")
    assert res.returncode == 0, res.stderr
    assert all(p["plan"]["attention_kernel"] == "fa2" for p in json.loads(res.stdout)["plans"])
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-a100-80gb", "--gpus", "8",
                  "--global-batch", "64", "--attention-kernel", "cudnn")
    assert res.returncode == PlanError.exit_code
    assert "its kernels: fa2, triton" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "64", "--attention-kernel", "triton")
    assert res.returncode == PlanError.exit_code and "its kernels: cudnn, fa2" in res.stderr
    # flash-attn's Triton kernel runs attention at about 0.42 of FlashAttention-2's rate on A100
    times = {}
    for kernel in ("fa2", "triton"):
        res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-a100-80gb", "--gpus",
                      "8", "--global-batch", "64", "--attention-kernel", kernel, "--json")
        assert res.returncode == 0, res.stderr
        times[kernel] = json.loads(res.stdout)["breakdown_s"]["compute/backward/attention"]
    assert 2.2 < times["triton"] / times["fa2"] < 2.6


def test_megatron_writes_the_backend_of_the_kernel_it_was_costed_with(tmp_path):
    """Transformer Engine's fused backend is cuDNN's kernel, its flash backend FlashAttention's;
    a plan that names none was costed with the hardware's default kernel, which is written."""
    from perfmodel.configs.megatron import write_megatron
    from perfmodel.strategy import plan_from_dict

    model = load_model("llama3-8b")
    for hardware, kernel, backend in (("dgx-h100", "cudnn", "fused"), ("dgx-h100", "fa2", "flash"),
                                      ("dgx-h100", None, "fused"),
                                      ("dgx-a100-80gb", None, "flash")):
        plan = plan_from_dict(dict(gpus=8, dp=8, global_batch=8, flash_attention=True,
                                   attention_kernel=kernel))
        out = tmp_path / f"{hardware}-{kernel}"
        out.mkdir()
        write_megatron(out, model, plan, load_hardware(hardware), [])
        args = (out / "megatron_args.txt").read_text().split()
        assert args[args.index("--attention-backend") + 1] == backend


def test_a_file_over_the_h100_preset_keeps_or_drops_its_kernels(tmp_path):
    """flash_attention: null over dgx-h100 drops its FlashAttention-2 too; a kernel of the
    file's own replaces the default whole (it must name itself beside the inherited fa2)."""
    (tmp_path / "none.yaml").write_text("base: dgx-h100\nflash_attention: null\n")
    bare = load_hardware(str(tmp_path / "none.yaml"))
    assert bare.flash_attention is None and bare.flash_attention_names() == ()
    mine = ("base: dgx-h100\nflash_attention:\n  kernel: SDPA as measured here\n"
            "  dtypes: [bf16]\n  by_head_dim: [{head_dim: 128, forward_max_fraction: 0.5, "
            "forward_half_seq: 300, backward_max_fraction: 0.5, backward_half_seq: 300}]\n")
    (tmp_path / "mine.yaml").write_text(mine)
    with pytest.raises(SpecError, match="flash_attention needs a name"):
        load_hardware(str(tmp_path / "mine.yaml"))
    (tmp_path / "named.yaml").write_text(mine.replace("  kernel:", "  name: sdpa\n  kernel:"))
    assert load_hardware(str(tmp_path / "named.yaml")).flash_attention_names() == ("sdpa", "fa2")


def test_the_validation_job_and_its_dry_run_leave_the_kernel_out():
    from perfmodel.strategy import plan_from_dict
    from validation.jobspec import as_run
    from validation.ledger import model_ledger

    model = load_model("tiny-gpt")
    plan = plan_from_dict(dict(gpus=2, dp=2, global_batch=4, attention_kernel="cudnn"))
    _, ran, note = as_run(model, plan, "gloo")
    assert ran.attention_kernel is None and "PyTorch SDPA" in note
    assert model_ledger(model, plan) is not None  # counted on A100, which has no cudnn kernel


def test_recommend_keeps_a_configs_unfused_attention(run_cli, tmp_path):
    """A Megatron-LM argument list with --attention-backend unfused: every plan attends unfused
    (the config's flag was read, then lost to --attention's default, auto)."""
    args = tmp_path / "args.txt"
    args.write_text("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
                    "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 2 "
                    "--bf16 --attention-backend unfused --global-batch-size 16")
    res = run_cli("recommend", "--from-config", args, "--hardware", "dgx-h100", "--gpus", "8",
                  "--json")
    assert res.returncode == 0, res.stderr
    assert {p["plan"]["flash_attention"] for p in json.loads(res.stdout)["plans"]} == {False}
    res = run_cli("recommend", "--from-config", args, "--hardware", "dgx-h100", "--gpus", "8",
                  "--attention-kernel", "fa2")
    assert res.returncode == 2 and "attends unfused" in res.stderr


def test_explain_names_the_kernel_whose_values_it_prints():
    from perfmodel.explain import explain_text

    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8)
    text = explain_text("llama3-8b", "dgx-a100-80gb", dict(plan, attention_kernel="triton"))
    assert ("attention: flash, kernel triton (FlashAttention in Triton (flash_attn_triton, "
            "triton 2.0.0.dev20221202)), named by --attention-kernel; measured at head dims 64, "
            "128 (the model's: 128): its E_fa and s_fa below") in text
    assert "E_fa_fwd = 0.258" in text
    assert "kernel cudnn (cuDNN" in explain_text("llama3-8b", "dgx-h100", plan)
    assert "the hardware's default" in explain_text("llama3-8b", "dgx-h100", plan)
    assert "attention: unfused" in explain_text("llama3-8b", "dgx-h100",
                                                dict(plan, flash_attention=False))
    # fp32 on H100: no kernel measured for it, fused attention asked for: the GEMM efficiency
    assert "no flash kernel of dgx-h100 measured for fp32" in explain_text(
        "llama3-8b", "dgx-h100", dict(plan, dtype="fp32", flash_attention=True))


# AITER's assembly FMHA kernels (Transformer Engine on ROCm's CK v3), causal, bf16, head dim 128,
# batch 8 x 64 query heads (8 kv heads) at s = 1k..10k, batch 1 at 16k: forward, backward with
# 16-bit and with fp32 dQ atomics, TFLOP/s (github ROCm/aiter op_tests/cpp/mha/README.md, the asm
# kernels' table, added a83421bee646)
AMD_S = np.array([1024, 2048, 4096, 8192, 10240, 16384], dtype=float)
AITER = {"mi300x": (1307.4, {"fwd": [321.865, 452.03, 509.255, 550.67, 547.05, 541.55],
                             "a16": [324.22, 382.1, 457.05, 474.02, 489.075, 458.075],
                             "a32": [265.08, 347.89, 402.18, 432.715, 439.785, 412.04]}),
         "mi355x": (2516.6, {"fwd": [626.57, 963.165, 1190.295, 1311.955, 1313.695, 1392.485],
                             "a16": [576.345, 817.49, 972.25, 1067.89, 1084.75, 1162.805],
                             "a32": [484.34, 630.43, 710.905, 772.605, 792.91, 808.93]})}
# the backward each preset's default kernel takes: as AMD's Primus recipes set
# NVTE_CK_IS_V3_ATOMIC_FP32 (1 on MI300X/MI325X, 0 in its MI355X examples)
AMD_KERNELS = {"mi300x": {"ck-v3": "a32", "ck-v3-a16": "a16"},
               "mi355x": {"ck-v3": "a16", "ck-v3-a32": "a32"}}


@pytest.mark.parametrize("gpu", ["mi300x", "mi355x"])
def test_the_amd_kernels_are_fitted_from_aiters_published_table(gpu):
    peak, series = AITER[gpu]
    hw = load_hardware(gpu)
    assert hw.flash_kernel("bf16").name == "ck-v3"  # the default: auto attends with it

    def fit(tflops):
        def residual(p):
            return np.log(peak * p[0] * AMD_S / (AMD_S + p[1])) - np.log(tflops)
        return least_squares(residual, [0.4, 500], bounds=([0, 0], [1, 1e5])).x

    for name, backward in AMD_KERNELS[gpu].items():
        point = hw.named_flash_kernel(name).at(128)
        for f, half, key in ((point.forward_max_fraction, point.forward_half_seq, "fwd"),
                             (point.backward_max_fraction, point.backward_half_seq, backward)):
            measured = np.array(series[key])
            fitted_f, fitted_half = fit(measured)
            assert f == pytest.approx(fitted_f, abs=0.001)
            assert half == pytest.approx(fitted_half, rel=0.01)
            assert peak * f * AMD_S / (AMD_S + half) == pytest.approx(measured, rel=0.08)
    # MI325X (MI300X's compute die) has no published measurement: not taken from MI300X's
    assert load_hardware("mi325x").flash_kernel("bf16") is None
