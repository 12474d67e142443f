"""What a named flash kernel runs at all (FlashAttention.max_head_dim, its dtypes), wherever a plan
or a published row names it: flash-attn's Triton kernel (the A100 presets' `triton`) asserts
fp16/bf16 inputs and head_dim <= 128 (flash_attn_triton.py), so a plan naming it at head dim 256
is refused, as FlashAttention-2 is above 256, rather than priced at head dim 128's speed; and a
published row naming it in fp32 is refused on H100 (which does not measure it) as on A100."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import bench_accuracy as B
from perfmodel import PlanError, SpecError, load_hardware, predict
from perfmodel.specs.hardware import hardware_from_dict
from perfmodel.specs.model import TransformerSpec
from tests.conftest import ROOT

PLAN = dict(gpus=8, dp=8, micro_batch=1, global_batch=8)


def _model(head_dim: int) -> TransformerSpec:
    return TransformerSpec(name=f"hd{head_dim}", layers=2, hidden=4096, heads=4096 // head_dim,
                           kv_heads=4096 // head_dim, ffn_hidden=11008, seq_len=4096,
                           vocab=32000, gated_mlp=True)


def test_the_a100_triton_kernel_stops_at_head_dim_128():
    hw = load_hardware("dgx-a100-80gb")
    assert hw.named_flash_kernel("triton").max_head_dim == 128
    assert hw.named_flash_kernel("fa2").max_head_dim == 256  # the default: every kernel's limit
    assert load_hardware("dgx-a100-40gb").named_flash_kernel("triton").max_head_dim == 128
    predict(_model(128), "dgx-a100-80gb", dict(PLAN, attention_kernel="triton"))
    with pytest.raises(PlanError, match="attention_kernel triton: head_dim 256 is above 128, the "
                                        "largest head size dgx-a100-80gb's FlashAttention in "
                                        "Triton .* runs \\(its max_head_dim\\); name another "
                                        "kernel"):
        predict(_model(256), "dgx-a100-80gb", dict(PLAN, attention_kernel="triton"))
    # FlashAttention-2 runs head dim 256 (costed at 128's speed, with a note), as before
    fa2 = predict(_model(256), "dgx-a100-80gb", dict(PLAN, attention_kernel="fa2"))
    assert fa2.plan.flash_attention


def test_a_kernels_head_limit_is_a_spec_field_checked_as_the_others():
    spec = load_hardware("dgx-h100").to_dict()
    assert spec["flash_attention"]["max_head_dim"] == 256
    assert hardware_from_dict(spec, "h100.yaml").flash_attention.max_head_dim == 256  # round trip
    small = dict(spec, flash_attention=dict(spec["flash_attention"], max_head_dim=128))
    with pytest.raises(SpecError, match="head_dim 256 is above the kernel's max_head_dim 128"):
        hardware_from_dict(small, "h100.yaml")
    with pytest.raises(SpecError, match="max_head_dim"):
        hardware_from_dict(dict(spec, flash_attention=dict(spec["flash_attention"],
                                                           max_head_dim=0)), "h100.yaml")
    # a default kernel that stops at 64: auto attends unfused above it, flash is refused
    points = [p for p in spec["flash_attention"]["by_head_dim"] if p["head_dim"] == 64]
    hw = hardware_from_dict(dict(spec, flash_attention=dict(
        spec["flash_attention"], max_head_dim=64, by_head_dim=points),
        flash_attention_alternatives=[]), "h100.yaml")
    assert not predict(_model(128), hw, PLAN).plan.flash_attention
    with pytest.raises(PlanError, match="head_dim 128 is above 64, the largest head size"):
        predict(_model(128), hw, dict(PLAN, flash_attention=True))


def test_the_cli_refuses_triton_at_head_dim_256(run_cli, tmp_path):
    spec = tmp_path / "hd256.yaml"
    spec.write_text("base: llama2-7b\nheads: 16\nkv_heads: 16\n")  # head_dim 256
    res = run_cli("predict", "--model", spec, "--hardware", "dgx-a100-80gb", "--gpus", "8",
                  "--attention-kernel", "triton")
    assert res.returncode == PlanError.exit_code and "Traceback" not in res.stderr
    assert "head_dim 256 is above 128" in res.stderr and len(res.stderr.splitlines()) == 1


_ROW = dict(pd.read_csv(ROOT / "tests/data/accuracy/published-steps.csv").to_dict("records")[0],
            source="llm-foundry", gpu="H100", hardware_note="DGX H100", gpus=8, tp=1, pp=1, dp=8,
            cp=1, micro_batch=1, global_batch=8, seq_len=2048, dtype="bf16", layers=32,
            hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=50368, gated_mlp=False,
            tied_embeddings=True, features="FSDP; no activation checkpointing; "
                                           "flash attention (triton)")


def test_a_row_naming_triton_where_it_cannot_run_is_refused_on_h100_as_on_a100(tmp_path):
    """H100 does not measure the Triton kernel: a bf16 row is priced with its default kernel and
    says so; an fp32 row (the kernel runs fp16/bf16 only) or a head size above 128 is refused,
    as the A100 preset refuses it, not priced as 'its default flash kernel, cudnn' (which does
    not run fp32 either: the attention was costed at the GEMM efficiency)."""
    rows = [_ROW, dict(_ROW, dtype="fp32"), dict(_ROW, dtype="tf32"),
            dict(_ROW, heads=16, kv_heads=16), dict(_ROW, gpu="A100", hardware_note="A100 80GB "
                                                    "SXM", dtype="fp32")]
    pd.DataFrame(rows).to_csv(tmp_path / "published-steps.csv", index=False)
    bf16, fp32, tf32, wide, a100 = B.published_rows(tmp_path)
    assert not bf16.error and any("priced as its default flash kernel, cudnn (the kernel not "
                                  "mapped)" in note for note in bf16.not_modelled)
    for row, dtype in ((fp32, "fp32"), (tf32, "tf32")):
        assert row.error == ("not read: feature 'triton': flash-attn's flash attention in Triton "
                             f"runs bf16, fp16 (dgx-a100-80gb's spec of it), not the row's "
                             f"{dtype}")
    assert "runs head sizes up to 128 (dgx-a100-80gb's spec of it), not the row's 256" \
        in wide.error
    assert "is measured for bf16, fp16, not fp32" in a100.error  # the preset's own refusal
