"""benchmarks/bench_accuracy.py on held-out mixture-of-experts and long-context rows written by
other people: a preset named in any case, its MoE columns checked against it, an mtp_layers or
vp column read, and the other GPUs' names in their vendors' and nodes' words."""

from __future__ import annotations

import re

import pytest

from benchmarks import bench_accuracy as B

# Qwen3-30B-A3B on 16 DGX H100 GPUs (tests/data/accuracy-moe-heldout's mbridge-26.04 row)
QWEN = dict(source="probe", gpu="H100", hardware_note="DGX-H100", gpus=16, tp=1, pp=1, dp=16,
            cp=1, micro_batch=1, global_batch=1024, seq_len=4096, dtype="bf16",
            features="bf16; distributed optimizer, alltoall dispatcher", layers=48, hidden=2048,
            heads=32, kv_heads=4, ffn_hidden=6144, vocab=151936, gated_mlp=True,
            tied_embeddings=False, published_step_s=30.0, model="qwen3-30b-a3b", ep=16, etp=1,
            experts=128, top_k=8, moe_ffn_hidden=768, head_dim=128)


@pytest.mark.parametrize("change, why", [
    (dict(experts=64), "experts 64 (preset 128)"), (dict(top_k=4), "top_k 4 (preset 8)"),
    (dict(moe_ffn_hidden=1536), "moe_ffn_hidden 1536 (preset 768)"),
    (dict(shared_experts=1), "shared_experts 1 (preset 0)"),
    (dict(head_dim=64), "head_dim 64 (preset 128)")])
def test_a_presets_moe_columns_that_differ_refuse_the_row(change, why):
    """Regression: the preset's experts, top_k, expert width and head size were predicted
    whatever the row's columns said, silently."""
    with pytest.raises(ValueError, match=re.escape(f"model qwen3-30b-a3b: the row's {why}")):
        B.model_of(dict(QWEN, **change))
    assert B.model_of(QWEN)["experts"] == 128  # the row's own, agreeing


def test_an_mla_presets_head_dim_may_be_its_q_k_or_v_head():
    deepseek = dict(QWEN, model="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128,
                    ffn_hidden=18432, vocab=129280, experts=256, top_k=8, moe_ffn_hidden=2048,
                    shared_experts=1)
    for head_dim in (128, 192):  # qk_nope (= v) and qk_nope + qk_rope
        assert B.model_of(dict(deepseek, head_dim=head_dim))["name"] == "deepseek-v3"
    with pytest.raises(ValueError, match="head_dim 64"):
        B.model_of(dict(deepseek, head_dim=64))


def test_a_presets_name_is_read_whatever_its_case():
    """Regression: 'Qwen3-30B-A3B' was no preset: the row took its tokenizer's architecture and
    was refused for its vocabulary (a name with an architecture entry lost the preset's MLA,
    windows and MTP silently)."""
    model = B.model_of(dict(QWEN, model=" Qwen3-30B-A3B "))
    assert (model["name"], model["experts"]) == ("qwen3-30b-a3b", 128)
    _, _, _, origin = B.read_row(dict(QWEN, model="Qwen3-30B-A3B"))
    assert B.architecture_assumed(dict(QWEN, model="Qwen3-30B-A3B"), origin) == []


def test_the_mtp_layers_column_is_read_without_a_preset():
    """Regression: mtp_layers was read for a preset only; on a model of the row's columns it was
    dropped, silently (it is a known column, so not even named as not read)."""
    mixtral = dict(QWEN, model=None, layers=32, hidden=4096, heads=32, kv_heads=8,
                   ffn_hidden=14336, vocab=32000, experts=8, top_k=2, moe_ffn_hidden=14336,
                   head_dim=None, mtp_layers=1)
    assert B.model_of(mixtral)["mtp_layers"] == 1


@pytest.mark.parametrize("column", ["vp", "VPP", "virtual_stages"])
def test_a_vp_column_is_the_interleaved_schedule(column):
    """Regression: a vp column was 'not read' and the run predicted without interleaving."""
    row = dict(QWEN, pp=2, dp=8, **{column.lower(): 4})
    _, plan, missing = B.plan_of(row)
    assert (plan["schedule"], plan["virtual_stages"]) == ("interleaved", 4)
    assert not [m for m in missing if "not read" in m]
    assert B.plan_of(dict(row, features=row["features"] + ", VP=4"))[1]["virtual_stages"] == 4
    with pytest.raises(ValueError, match="disagree: virtual_stages 4 against 2"):
        B.plan_of(dict(row, features=row["features"] + ", VP=2"))
    assert B.plan_of(dict(QWEN, vp=1))[1]["schedule"] == "1f1b"


@pytest.mark.parametrize("gpu, preset", [
    ("H200 SXM 141GB", "hgx-h200"), ("HGX H200", "hgx-h200"), ("NVIDIA H200", "hgx-h200"),
    ("GB200 NVL72", "gb200-nvl72"), ("DGX-GB200", "gb200-nvl72"), ("HGX B200", "dgx-b200"),
    ("B200 SXM 180GB", "dgx-b200"), ("AMD Instinct MI300X", "mi300x"),
    ("MI300X OAM", "mi300x"), ("AMD MI355X", "mi355x")])
def test_other_gpus_are_read_by_their_words(gpu, preset):
    """Regression: every one was refused as a GPU without a preset."""
    assert B.hardware_of(dict(gpu=gpu, hardware_note="")) == preset


@pytest.mark.parametrize("gpu", ["H200 NVL", "B200 PCIe", "MI300A", "GB200 NVL36", "H20",
                                 "H200 96GB"])
def test_another_part_of_those_gpus_is_still_refused(gpu):
    with pytest.raises(ValueError, match="has no preset"):
        B.hardware_of(dict(gpu=gpu, hardware_note=""))


@pytest.mark.parametrize("value, unit, step", [
    (30.0, "s", 30.0), (30.0, "s/step (train_step_timing)", 30.0),
    # 1,024 x 4,096 tokens in 30 s on 16 GPUs
    (1024 * 4096 / 30.0 / 16, "tokens/s/GPU", 30.0),
    (1024 * 4096 / 30.0 / 16, "Tokens/s/GPU (tps)", 30.0),
    (1024 * 4096 / 30.0, "tokens/s, all GPUs (Throughput (T/s))", 30.0)])
def test_a_published_value_in_seconds_or_tokens_stands_for_an_empty_step(value, unit, step):
    """The step time of a row that gives only published_value and published_unit (the columns
    the sets hold beside published_step_s: it used to be refused as empty)."""
    row = B.published_row(dict(QWEN, published_step_s=None, published_value=value,
                               published_unit=unit))
    assert not row.error and row.published_s == pytest.approx(step)
    same = B.published_row(dict(QWEN, published_step_s=step))
    assert row.predicted_s == same.predicted_s


@pytest.mark.parametrize("value, unit, why", [
    (None, "tokens/s/GPU", "published_step_s: empty"), (512.0, None, "published_step_s: empty"),
    (512.0, "TFLOP/s/GPU", "published_unit 'TFLOP/s/GPU': with published_step_s empty"),
    (-1.0, "s", "published_value '-1.0'")])
def test_a_published_value_that_does_not_give_a_step_is_refused(value, unit, why):
    row = B.published_row(dict(QWEN, published_step_s=None, published_value=value,
                               published_unit=unit))
    assert why in row.error
