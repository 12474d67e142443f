"""Regressions from the second 2026-12-03 probe of predict: flash attention asked for where no
measured kernel runs the plan's dtype is said to be costed at the GEMM efficiency, and a head
size no flash kernel runs is refused whether or not a kernel is measured."""

from __future__ import annotations

import json

import pytest

from perfmodel.cli import main

PLAN = ("predict", "--model", "llama3-8b", "--gpus", "8")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


@pytest.mark.parametrize("hardware, dtype, runs", [
    ("dgx-h100", "fp32", "its kernels run bf16, fp16"),
    ("dgx-h100", "tf32", "its kernels run bf16, fp16"),
    ("mi300x", "bf16", "its spec has no flash kernel")])
def test_flash_without_a_measured_kernel_for_the_dtype_is_said(capsys, hardware, dtype, runs):
    """Regression: H100 in fp32 or tf32 with --attention flash (no measured kernel runs either)
    was costed at the GEMM efficiency without a word, while naming H100's default kernel
    (--attention-kernel cudnn) refused the same plan."""
    code, _, err = _run(capsys, *PLAN, "--hardware", hardware, "--dtype", dtype,
                        "--attention", "flash")
    assert code == 0
    assert (f"note: flash attention in {dtype}: no flash kernel of {hardware} is measured for "
            f"{dtype} ({runs}): costed as the fused kernel's FLOPs at {hardware}'s {dtype} GEMM "
            "efficiency") in err
    code, out, _ = _run(capsys, *PLAN, "--hardware", hardware, "--dtype", dtype,
                        "--attention", "flash", "--json")
    assert any("no flash kernel" in note for note in json.loads(out)["extrapolations"])


def test_a_measured_kernel_and_the_unfused_path_say_nothing(capsys):
    for attention in ("flash", "unfused"):
        code, _, err = _run(capsys, *PLAN, "--hardware", "dgx-h100", "--attention", attention)
        assert code == 0 and "no flash kernel" not in err


@pytest.mark.parametrize("hardware, dtype", [("dgx-h100", "bf16"), ("dgx-h100", "fp32"),
                                             ("mi300x", "bf16")])
def test_a_head_size_no_flash_kernel_runs_is_refused_everywhere(capsys, tmp_path, hardware,
                                                                dtype):
    """Regression: head_dim 512 with --attention flash was refused in bf16 on H100 (a measured
    kernel) but costed in fp32 on H100 and on MI300X (none measured): every flash kernel stops
    at head size 256."""
    spec = tmp_path / "hd512.yaml"
    spec.write_text("base: llama3-8b\nhead_dim: 512\n")
    code, _, err = _run(capsys, "predict", "--model", str(spec), "--gpus", "8", "--hardware",
                        hardware, "--dtype", dtype, "--attention", "flash")
    assert code == 4
    assert err.strip() == ("error: flash_attention: head_dim 512 is above the 256 flash kernels "
                           "run; use --attention unfused")
