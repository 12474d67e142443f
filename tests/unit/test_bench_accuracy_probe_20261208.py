"""benchmarks/bench_accuracy.py on held-out rows as other engineers transcribe them (probe of
2026-12-08): a published time in the units of the logs it is copied from (Megatron-LM's
'elapsed time per iteration (ms)', Megatron-DeepSpeed's 'samples per second', 'tokens/sec/GPU')
is read; a published_step_s that its own published_value contradicts is refused rather than
compared; the experts' degrees stated as features are checked against the ep and etp columns,
and left unstated they are named as assumed; a cloud instance named by its type names its
network; Lightning's precision names read as the dtype."""

from __future__ import annotations

import pytest

from benchmarks import bench_accuracy as B

# Llama 3 8B on 64 H100s, tp 4, pp 2, dp 8, global batch 512 x 4096 tokens
_DENSE = dict(source="megatron-lm", gpu="H100", hardware_note="DGX H100", gpus=64, tp=4, pp=2,
              dp=8, cp=1, micro_batch=1, global_batch=512, seq_len=4096, dtype="bf16",
              features="", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
              vocab=128256, gated_mlp=True, tied_embeddings=False, published_step_s=5.0,
              model="llama3-8b")
# Qwen3-30B-A3B on 16 H100s, ep 8
_MOE = dict(_DENSE, source="megatron-bridge", model="qwen3-30b-a3b", gpus=16, tp=1, pp=1, dp=16,
            layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=6144, vocab=151936, ep=8,
            etp=1)


@pytest.mark.parametrize("value, unit, step", [
    # Megatron-LM's and Megatron-DeepSpeed's logs: 'elapsed time per iteration (ms)'
    (5000, "ms", 5.0), (5000, "ms/iteration", 5.0), (5000, "ms per iteration", 5.0),
    (5000, "ms/step (elapsed time per iteration)", 5.0),
    (5, "sec/step", 5.0), (5, "seconds per step", 5.0), (5, "s/iteration", 5.0),
    # tokens a second, 'sec' and 'per' in words: 512 x 4096 tokens a step
    (3276.8, "tokens/sec/GPU", 10.0), (3276.8, "tokens per second per GPU", 10.0),
    (3276.8, "tokens/s per GPU", 10.0), (209715.2, "tokens/sec", 10.0),
    # samples (sequences) a second: global_batch / value, per GPU over the 64 GPUs
    (102.4, "samples/s", 5.0), (102.4, "samples/sec (Megatron-DeepSpeed)", 5.0),
    (1.6, "samples/s/GPU", 5.0),
])
def test_published_units_of_the_logs_rows_are_copied_from(value, unit, step):
    row = dict(_DENSE, published_step_s="", published_value=value, published_unit=unit)
    assert B.step_from_value(row) == pytest.approx(step)
    assert B.published_row(row).published_s == pytest.approx(step)


@pytest.mark.parametrize("unit", ["TFLOP/s/GPU", "MFU %", "it/s"])
def test_units_that_need_the_sources_own_count_stay_refused(unit):
    row = dict(_DENSE, published_step_s="", published_value=40, published_unit=unit)
    assert "not read: published_unit" in B.published_row(row).error


def test_a_step_its_own_published_value_contradicts_is_refused():
    # the step time transcribed in the log's milliseconds: 5000 'seconds' against 5000 ms
    row = dict(_DENSE, published_step_s=5000, published_value=5000, published_unit="ms/iteration")
    assert "published_step_s 5000 and published_value 5000 ms/iteration" in \
        B.published_row(row).error
    # a tokens/s/GPU converted over other GPUs than the row's 64 (here 32: twice the step)
    row = dict(_DENSE, published_step_s=20.0, published_value=3276.8,
               published_unit="tokens/s/GPU")
    assert "disagree" in B.published_row(row).error
    # agreeing to the published figure's rounding: read; a unit only the conversion reads: kept
    for value, unit in ((3280, "tokens/s/GPU"), (400, "TFLOP/s/GPU")):
        row = dict(_DENSE, published_step_s=10.0, published_value=value, published_unit=unit)
        assert not B.published_row(row).error.startswith("not read")


@pytest.mark.parametrize("features, columns, options", [
    ("EP 8, ETP 1", {}, {"ep": 8}), ("EP=8", {}, {"ep": 8}),
    ("expert parallel 8", {}, {"ep": 8}), ("8-way expert parallelism", {}, {"ep": 8}),
    ("expert tensor parallel size 1", {}, {"ep": 8}),
    ("EP 4, ETP 2", dict(ep=4, etp=2, tp=2, dp=8), {"ep": 4, "etp": 2}),
])
def test_expert_degrees_as_features_agree_with_the_columns(features, columns, options):
    _, plan, missing, _ = B.read_row(dict(_MOE, features=features, **columns))
    assert {k: plan.get(k) for k in options} == options
    assert not [m for m in missing if "not mapped" in m]


@pytest.mark.parametrize("features, columns, said", [
    ("EP8", dict(ep=""), "feature 'EP8' says ep 8, the row's ep column 1"),
    ("EP 16", {}, "feature 'EP 16' says ep 16, the row's ep column 8"),
    ("ETP 2", {}, "feature 'ETP 2' says etp 2, the row's etp column 1"),
])
def test_expert_degrees_the_columns_do_not_carry_refuse_the_row(features, columns, said):
    # before: named 'not mapped' and priced on the columns' degrees (ep 1: every expert on
    # every rank)
    with pytest.raises(ValueError, match=said):
        B.read_row(dict(_MOE, features=features, **columns))


def test_unstated_expert_degrees_are_named_as_assumed():
    _, plan, missing, _ = B.read_row(dict(_MOE, ep="", etp="", tp=2, dp=8))
    assert plan.get("ep", 1) == 1 and plan.get("etp", 1) == 1
    assert any(m.startswith("assumed: ep not stated: 1") for m in missing)
    # Megatron-Core's unset expert_tensor_parallel_size is the tp, not the plan's 1
    assert any(m.startswith("assumed: etp not stated: 1") and "the tp, 2" in m for m in missing)
    _, _, missing, _ = B.read_row(_MOE)  # stated: nothing assumed
    assert not [m for m in missing if "ep not stated" in m]
    _, _, missing, _ = B.read_row(dict(_DENSE, features="EP 1"))  # no experts: nothing said
    assert not [m for m in missing if "ep not stated" in m]


@pytest.mark.parametrize("gpu, note, fabric", [
    ("A100", "AWS p4d.24xlarge (8x A100 40GB)", "EFA"),
    ("A100", "p4de.24xlarge", "EFA"), ("H100", "AWS p5.48xlarge", "EFA"),
    ("H100", "GCP a3-megagpu-8g", "GPUDirect-TCPX"), ("H100", "a3-highgpu-8g", "GPUDirect-TCPX"),
    ("H100", "a3-ultragpu-8g", "RoCE"), ("A100", "a2-ultragpu-8g (A100 80GB)", "Ethernet"),
])
def test_a_cloud_instance_names_its_network(gpu, note, fabric):
    # before: an instance named without its fabric's word was priced on the DGX's InfiniBand
    # with nothing said (p4d: 4 x 100 Gb/s EFA against the DGX A100's 8 x 200 Gb/s)
    row = dict(_DENSE, gpu=gpu, hardware_note=note)
    notes = B.hardware_notes(row, B.hardware_of(row))
    assert notes and notes[0].startswith(f"hardware note names {fabric}")


@pytest.mark.parametrize("dtype, read", [("bf16-mixed", "bf16"), ("BF16-mixed", "bf16"),
                                         ("16-mixed", "fp16")])
def test_lightning_precision_names_read_as_the_dtype(dtype, read):
    assert B.dtype_of(dict(_DENSE, dtype=dtype)) == read


def test_bf16_true_is_not_read_as_mixed_precision():
    with pytest.raises(ValueError, match="dtype 'bf16-true'"):
        B.dtype_of(dict(_DENSE, dtype="bf16-true"))


@pytest.mark.parametrize("features, cp_comm", [
    ("cp_comm_type a2a", "a2a"), ("cp-comm-type all_gather", "allgather"),
    ("ring attention", "p2p"), ("Ulysses", "a2a"), ("DeepSpeed-Ulysses", "a2a"),
    # inside Megatron's word, Ulysses still replaces sequence parallelism rather than joining it
    ("sequence parallelism (Ulysses)", "a2a"),
])
def test_context_parallel_exchange_in_megatron_and_paper_words(features, cp_comm):
    # before: named 'not mapped' and priced as Megatron-Core's default ring (p2p)
    _, plan, missing, _ = B.read_row(dict(_DENSE, features=features, cp=2, dp=4))
    assert plan["cp_comm"] == cp_comm and not plan.get("sequence_parallel")
    assert not [m for m in missing if "not mapped" in m]


@pytest.mark.parametrize("features, said", [
    ("Ulysses, ring attention", "disagree: cp_comm a2a against p2p"),
])
def test_two_context_parallel_exchanges_disagree(features, said):
    with pytest.raises(ValueError, match=said):
        B.read_row(dict(_DENSE, features=features, cp=2, dp=4))


@pytest.mark.parametrize("features", ["cp_comm_type a2a", "Ulysses", "ring attention"])
def test_context_parallel_exchange_without_cp_is_refused(features):
    # predict (refuse_idle=False) would price the exchange as none: the degree is elsewhere
    with pytest.raises(ValueError, match="cp column|cp 1 here"):
        B.read_row(dict(_DENSE, features=features))


@pytest.mark.parametrize("dtype, recipe", [
    # Megatron-Bridge's performance tables' precision column (docs/performance-summary.md)
    ("FP8-CS", "current"), ("fp8_cs", "current"), ("FP8-DS", "delayed"), ("FP8-MX", "mxfp8"),
    ("MXFP8", "mxfp8"), ("fp8 (current scaling)", "current")])
def test_an_fp8_dtype_column_that_names_its_recipe_is_read_with_it(dtype, recipe):
    row = dict(_DENSE, dtype=dtype, features="SP, recompute none")
    _, plan, _ = B.plan_of(row)
    assert (plan["dtype"], plan["fp8_recipe"]) == ("fp8", recipe)
    # a feature naming another recipe disagrees with the column
    other = "FP8 delayed scaling" if recipe != "delayed" else "FP8 current scaling"
    with pytest.raises(ValueError, match="disagree"):
        B.plan_of(dict(row, features=f"{other}, SP, recompute none"))


@pytest.mark.parametrize("dtype", ["FP8-SS", "NVFP4", "fp8-blockwise"])
def test_a_recipe_the_model_does_not_have_is_refused_as_a_dtype(dtype):
    with pytest.raises(ValueError, match="fp8 with its recipe: FP8-CS, FP8-DS, FP8-MX or MXFP8"):
        B.plan_of(dict(_DENSE, dtype=dtype, features="SP, recompute none"))


@pytest.mark.parametrize("feature, modules", [
    # Megatron-Bridge's tables ('recompute moe_act') and Megatron-LM's flag in words
    ("recompute moe_act", "moe_act"), ("recompute modules moe_act+layernorm", "moe_act,layernorm"),
    ("--recompute-modules mla_up_proj moe_act", "mla_up_proj,moe_act"),
    ("selective recompute moe_act", "moe_act"), ("recompute_modules: core_attn", "core_attn")])
def test_recompute_modules_in_other_words_are_selective_recompute_of_them(feature, modules):
    _, plan, missing = B.plan_of(dict(_MOE, features=feature))
    assert (plan["recompute"], plan["recompute_modules"]) == ("selective", modules)
    assert not [n for n in missing if "not mapped" in n]


def test_recomputing_whole_moe_layers_is_refused_in_its_row(tmp_path):
    import pandas as pd

    pd.DataFrame([dict(_MOE, features="recompute moe")]).to_csv(
        tmp_path / "published-steps.csv", index=False)
    (row,) = B.published_rows(tmp_path)
    assert row.predicted_s is None and "recomputing a whole MoE layer" in row.error, row.error


def test_the_expert_exchanges_overlap_in_more_words():
    for words in ("EP A2A overlap", "EP all-to-all overlap", "MoE all-to-all overlap"):
        _, plan, _ = B.plan_of(dict(_MOE, features=words))
        assert plan["ep_comm_overlap"] is True
