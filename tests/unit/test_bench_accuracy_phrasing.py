"""benchmarks/bench_accuracy.py reads a held-out file's features in the words other people write
them: each common phrasing of a feature that moves the step maps to the plan option it names,
is refused in its row where the model does not have it, or is named as not read; and whatever
the row leaves to a default or a guess (its architecture, its FP8 recipe, its GPU's part) is
said in the row, and counted in its source's summary line."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import bench_accuracy as B
from tests.conftest import ROOT

ROWS = pd.read_csv(ROOT / "tests/data/accuracy/published-steps.csv").to_dict("records")
_DGXC = ROWS[0]  # Nemotron-4 15B, 16 H100s, tp 4, dp 4, bf16

# MPT-7B as llm-foundry's benchmark table trains it (mosaicml/llm-foundry scripts/train/
# benchmarking/README.md, H100 80GB BF16 table, 8 GPUs, seq 2048): GPT-NeoX's tokenizer (50,277
# tokens) padded to 50,368, ALiBi, no biases, no dropout, tied embeddings
_MPT_7B = dict(_DGXC, source="llm-foundry", gpu="H100", hardware_note="DGX H100", gpus=8, tp=1,
               pp=1, dp=8, cp=1, micro_batch=6, global_batch=48, seq_len=2048, dtype="bf16",
               layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=50368,
               gated_mlp=False, tied_embeddings=True,
               features="amp_bf16; FSDP; no activation checkpointing; flash attention")


@pytest.mark.parametrize("feature, options", [
    # activation recompute in any order of its words (Plan.recompute)
    ("activation checkpointing full", {"recompute": "full"}),
    ("full activation recomputation", {"recompute": "full"}),
    ("gradient checkpointing", {"recompute": "full"}),  # Hugging Face's: every layer
    ("selective activation recomputation", {"recompute": "selective"}),
    ("selective activation checkpointing", {"recompute": "selective"}),
    ("activation checkpointing: none", {"recompute": "none"}), ("AC none", {"recompute": "none"}),
    ("recompute granularity full", {"recompute": "full"}),
    # PyTorch FSDP's names in any order, and Megatron-Core's own FSDP (optim_grads_params: ZeRO 3,
    # its overlaps Megatron's flags of their own)
    ("FSDP full_shard", {"zero": 3, "overlap_grad_sync": True}),
    ("PyTorch FSDP full shard", {"zero": 3, "overlap_grad_sync": True}),
    ("FULL_SHARD FSDP", {"zero": 3, "overlap_grad_sync": True}),
    ("Megatron FSDP", {"zero": 3}),
    # FSDP's SHARD_GRAD_OP: the weights kept gathered from each unit's forward to its backward
    # (llm-foundry's large-scale H100 rows were priced as FULL_SHARD)
    ("SHARD_GRAD_OP", {"zero": 3, "overlap_grad_sync": True, "fsdp_reshard": "backward"}),
    # Transformer Engine's userbuffers: Megatron's --tp-comm-overlap
    ("TP overlap", {"tp_comm_overlap": True}),
    ("tensor parallel communication overlap", {"tp_comm_overlap": True}),
    ("userbuffers", {"tp_comm_overlap": True}),
    # a flash-attention version names its kernel; SDPA picks one per call: the plan's auto
    ("FlashAttention2", {"flash_attention": True, "attention_kernel": "fa2"}),
    ("flash attention 2", {"flash_attention": True, "attention_kernel": "fa2"}),
    ("flash-attn v2", {"flash_attention": True, "attention_kernel": "fa2"}),
    ("SDPA", {"flash_attention": None}),
    # current scaling in Megatron-LM's (--fp8-recipe tensorwise) and Megatron-Bridge's words
    ("FP8-CS", {"fp8_recipe": "current"}), ("fp8_cs", {"fp8_recipe": "current"}),
    ("fp8 tensorwise", {"fp8_recipe": "current"}),
    ("distributed optimizer with overlapped grad reduce and param gather",
     {"zero": 1, "overlap_grad_sync": True, "overlap_param_gather": True}),
    # what the row's columns give, checked against them by plan_of
    ("context parallel 2", {"_cp": 2}), ("grad accumulation 16", {"_grad_accumulation": 16}),
    ("gradient accumulation 3", {"_grad_accumulation": 3}),
    ("amp_bf16", {"_dtype": "bf16"}), ("BF16 AMP", {"_dtype": "bf16"}),
    ("TE", {}),
    # never a guess: a word of the pattern that says something else stays unknown
    ("partial activation checkpointing", None), ("FSDP hybrid", None),
    ("distributed optimizer with a new trick", None)])
def test_the_common_phrasings_of_a_feature_are_read(feature, options):
    """Regression: each of these was listed as an unknown feature while the plan took the
    default in its place (recompute none, ZeRO 0, no overlap, the preset's kernel)."""
    assert B.generic_feature(feature) == options


@pytest.mark.parametrize("feature, model", [
    ("no bias", {"bias": False}),
    ("no dropout", {"hidden_dropout": 0.0, "attention_dropout": 0.0}),
    ("dropout 0.1", {"hidden_dropout": 0.1, "attention_dropout": 0.1})])
def test_features_state_the_models_biases_and_dropout(feature, model):
    assert B.feature_options(feature, {}, {}) == ({}, model)


def test_a_features_case_does_not_matter():
    for feature, key, value in (("sp", "sequence_parallel", True), ("Full AC", "recompute", "full"),
                                ("No AC", "recompute", "none")):
        assert B.feature_options(feature, {}, {})[0][key] == value


@pytest.mark.parametrize("feature, key, value", [
    ("FP8 (current scaling)", "fp8_recipe", "current"),
    ("FP8 (tensorwise)", "fp8_recipe", "current"),
    ("FP8 (delayed scaling)", "fp8_recipe", "delayed"),
    ("Megatron FSDP (optim_grads_params)", "zero", 3),
    ("SDPA (cuDNN)", "attention_kernel", "cudnn")])
def test_a_parenthetical_qualifies_its_feature(feature, key, value):
    """Regression: 'FP8 (current scaling)' ran the preset's default recipe (delayed on H100)."""
    fp8 = dict(_DGXC, dtype="fp8", features=feature)
    _, plan, missing = B.plan_of(fp8)
    assert plan[key] == value and not [m for m in missing if "not mapped" in m], missing


def test_context_parallelism_in_words_agrees_with_the_cp_column():
    row = dict(_DGXC, gpus=32, cp=2, features="bf16, context parallel 2 (p2p)")
    _, plan, missing = B.plan_of(row)
    assert plan["cp"] == 2 and missing == []
    with pytest.raises(ValueError, match="'context parallel 4' says cp 4, the row's cp column 2"):
        B.plan_of(dict(row, features="bf16, context parallel 4"))


def test_gradient_accumulation_agrees_with_the_batch_or_refuses_the_row():
    """global_batch / (dp x micro_batch): MPT-7B's 48 / (8 x 6) = 1; the probe's 405B row said
    96 where 1536 / (8 x 1) is 192."""
    _, _, missing = B.plan_of(dict(_MPT_7B, features=_MPT_7B["features"] + "; grad accumulation 1"))
    assert not [m for m in missing if "not mapped" in m]
    with pytest.raises(ValueError, match=r"'grad accumulation 2' says 2 micro-batches a step, "
                                         r"the row's global_batch / \(dp x micro_batch\) "
                                         r"48 / \(8 x 6\) = 1$"):
        B.plan_of(dict(_MPT_7B, features="grad accumulation 2"))


def test_a_precision_in_autocasts_words_is_checked_against_the_dtype_column():
    with pytest.raises(ValueError, match="'amp_bf16' says bf16, the row's dtype column fp16"):
        B.plan_of(dict(_MPT_7B, dtype="fp16"))


@pytest.mark.parametrize("feature, why", [
    ("HSDP", "HSDP"), ("FSDP (HYBRID_SHARD)", "HSDP"), ("PyTorch FSDP hybrid shard", "HSDP"),
    ("float8", "torchao's float8"), ("float8 (tensorwise)", "torchao's float8")])
def test_a_run_the_model_does_not_have_is_refused_in_its_row(feature, why):
    with pytest.raises(ValueError, match=f"feature '{feature[:4]}.*{why}"):
        B.plan_of(dict(_MPT_7B, features=feature))


def test_torchtitans_selective_ac_must_say_which():
    """torchtitan's selective AC is per op or every N layers; Megatron's selective recompute
    (the attention core alone) is neither."""
    row = next(r for r in ROWS if r["source"] == "torchtitan")
    with pytest.raises(ValueError, match="state 'selective op AC' or 'selective layer AC'"):
        B.plan_of(dict(row, features="bf16; FSDP2, selective activation checkpointing"))


def test_sdpas_backend_and_an_unstated_fp8_recipe_are_named_as_assumed():
    """Regression: a row saying only 'FP8' ran the preset's default recipe silently."""
    model, plan, _ = B.plan_of(dict(_MPT_7B, features="SDPA; FSDP; no AC"))
    assert B.assumed_defaults(model, plan, "dgx-h100") == [
        "assumed: SDPA's backend not stated: flash (cudnn, the preset's default kernel)"]
    fp8 = dict(_DGXC, dtype="fp8", features="fp8; SP, TP comm overlap (ub_tp_comm_overlap), "
                                            "distributed_fused_adam + overlap grad/param sync, "
                                            "recompute none, flash/cuDNN attention")
    model, plan, _ = B.plan_of(fp8)
    assert B.assumed_defaults(model, plan, "dgx-h100") == [
        "assumed: FP8 recipe not stated: delayed scaling (the preset's default)"]
    model, plan, _ = B.plan_of(dict(fp8, features=fp8["features"] + ", FP8-CS"))
    assert B.assumed_defaults(model, plan, "dgx-h100") == []


def test_an_architecture_guessed_from_a_nearby_vocabulary_is_named():
    """Regression: MPT's 50,368 (GPT-NeoX's 50,277 padded) was taken for GPT-2's 50,257 with
    biases and dropout 0.1, silently. The row's features and columns state what they can."""
    model, _, _, origin = B.read_row(_MPT_7B)
    assert (model["bias"], model["hidden_dropout"]) == (True, 0.1)
    assert B.architecture_assumed(_MPT_7B, origin) == [
        "assumed: architecture not stated: vocab 50368, near GPT-2 BPE's 50257 but not its "
        "padding: its entry's bias True, norm layernorm, position_embedding learned, dropout "
        "0.1 (columns or features state them: 'no bias', 'no dropout', ...)"]
    stated = dict(_MPT_7B, norm="layernorm", features=_MPT_7B["features"] + "; no bias, ALiBi",
                  dropout=0)
    model, _, _, origin = B.read_row(stated)
    assert (model["bias"], model["position_embedding"], model["hidden_dropout"],
            model["attention_dropout"]) == (False, "alibi", 0.0, 0.0)
    assert B.architecture_assumed(stated, origin) == []
    # the tokenizer's own vocabulary, as Megatron pads it, is what its entry's source describes:
    # nothing guessed (50,304: 50,257 to 128 at tp 1; 50,257 itself) ...
    gpt2 = dict(_MPT_7B, vocab=50257, features="full recompute")
    assert B.architecture_assumed(gpt2, B.read_row(gpt2)[3]) == []
    # ... unless another tokenizer's padding lands there too and the row does not tell them
    # apart (regression: Pythia's 50,304, GPT-NeoX's 50,277 to 128, and GPT-NeoX-20B's 50,432 at
    # tp 2 were read as GPT-2's, silently); GPT-2's rows state their tied embeddings
    for vocab, tp in ((50304, 1), (50432, 2), (51200, 8)):
        row = dict(_MPT_7B, vocab=vocab, tp=tp, dp=8 // tp, features="full recompute",
                   tied_embeddings=None)
        (note,) = B.architecture_assumed(row, B.read_row(row)[3])
        assert note.startswith(f"assumed: architecture not stated: vocab {vocab}, GPT-2 BPE's "
                               "50257 padded and GPT-NeoX-20B's tokenizer (GPT-NeoX-20B, "
                               "Pythia)'s too: its entry's")
        tied = dict(row, tied_embeddings=True)
        assert B.architecture_assumed(tied, B.read_row(tied)[3]) == []


@pytest.mark.parametrize("gpu, note, preset", [
    ("H100 SXM", "", "dgx-h100"), ("H100-SXM5-80GB", "", "dgx-h100"), ("H100 80GB", "", "dgx-h100"),
    ("NVIDIA H100 80GB HBM3", "", "dgx-h100"), ("H100 PCIe", "", "h100-pcie"),
    ("H100-PCIe-80GB", "", "h100-pcie"), ("H100", "H100 PCIe 80GB HBM2e", "h100-pcie")])
def test_an_h100_is_read_by_its_names_words(gpu, note, preset):
    """Regression: 'H100 SXM', 'H100-SXM5-80GB' and 'H100 80GB' had no preset."""
    assert B.hardware_of(dict(gpu=gpu, hardware_note=note)) == preset


@pytest.mark.parametrize("gpu, note, why", [
    ("H100 NVL", "", "no preset has its memory"), ("H100 94GB", "", "no preset has its memory"),
    ("H100 SXM", "96GB HBM2e, 500 W", "no preset has its memory"),
    ("H100 SXM PCIe", "", "names both the PCIe card and the SXM5 part"),
    ("H100X", "", "has no preset")])
def test_an_h100_no_preset_has_is_refused(gpu, note, why):
    with pytest.raises(ValueError, match=why):
        B.hardware_of(dict(gpu=gpu, hardware_note=note))


def test_a_gpus_part_and_memory_not_stated_are_named_as_assumed():
    """Regression: a bare 'A100' was taken for the 80 GB SXM part, an 'H100 80GB' for the SXM
    part, silently (the DGX A100 320GB has 40 GB parts; the H100 PCIe card has 80 GB too)."""
    assert B.hardware_notes(dict(gpu="A100", hardware_note="DGX A100"), "dgx-a100-80gb") == [
        "assumed: A100 memory not stated: 80 GB (dgx-a100-80gb; the 40 GB part, or a DGX A100 "
        "320GB, is dgx-a100-40gb)"]
    assert B.hardware_notes(dict(gpu="H100 80GB", hardware_note=""), "dgx-h100") == [
        "assumed: H100 part not stated: the SXM part (dgx-h100; the PCIe card: h100-pcie)"]
    for gpu, note in (("A100", "A100 80GB SXM"), ("H100-SXM5-80GB", ""),
                      ("H100", "8 x H100, NVLink 4th generation")):
        assert B.hardware_notes(dict(gpu=gpu, hardware_note=note),
                                B.hardware_of(dict(gpu=gpu, hardware_note=note))) == []


def test_a_sources_summary_line_counts_its_rows_read_in_part_and_those_that_would_not_fit(
        tmp_path):
    """Regression: a row with features not read was predicted on defaults and scored in its
    source's MAPE, and a row predicted not to fit where it ran too, and the summary line said
    neither. They stay in the MAPE; the line says how many, and the MAPE of the others."""
    rows = [_MPT_7B, dict(_MPT_7B, features=_MPT_7B["features"] + "; a new trick"),
            dict(_MPT_7B, features="amp_bf16; ZeRO-0; no AC; flash attention")]
    pd.DataFrame(rows).to_csv(tmp_path / "published-steps.csv", index=False)
    read = B.published_rows(tmp_path)
    assert "unknown feature 'a new trick' (not mapped)" in read[1].not_modelled
    assert read[2].memory_verdict == "does not fit"
    notes = B.caveats(read)
    assert notes["llm-foundry bf16"] == (
        f"1 with features not read, 1 predicted not to fit where it ran; MAPE of the other 1: "
        f"{abs(read[0].signed_error):.1%}")
    assert B.summary(read)[0][1:3] == (3, 0)  # all three still counted
    page = B.markdown(read, [])
    assert f"| llm-foundry bf16 | 3 ({notes['llm-foundry bf16']}) | 0 |" in page


def test_llm_foundrys_bf16_rows_run_mpts_modules_op_by_op():
    # Composer runs MPT's LayerNorm, GeLU and residual adds as written (no torch.compile in the
    # benchmark yamls); its FP8 rows' Transformer Engine linears fuse their bias gradients
    _, plan, _ = B.plan_of(_MPT_7B)
    assert plan["kernels"] == "eager"
    _, fp8, _ = B.plan_of(dict(_MPT_7B, dtype="fp8", features=_MPT_7B["features"] + "; fp8"))
    assert "kernels" not in fp8
    _, dgxc, _ = B.plan_of(_DGXC)  # NeMo: Transformer Engine's fused kernels
    assert "kernels" not in dgxc


def test_flash_attns_triton_kernel_is_the_presets_where_it_measures_it(tmp_path):
    """llm-foundry's attn_impl triton ('flash attention (triton)', 204 of its rows): the A100
    presets' triton kernel (the FlashAttention-2 figure's Triton bars); H100's has none, so the row
    is priced with its default kernel, said in the row and counted as read in part."""
    a100 = dict(_MPT_7B, gpu="A100", hardware_note="A100 80GB SXM", seq_len=8192, micro_batch=1,
                global_batch=8, features="amp_bf16; FSDP; no activation checkpointing; "
                                         "flash attention (triton)")
    h100 = dict(a100, gpu="H100", hardware_note="DGX H100")
    _, plan, missing = B.plan_of(a100)
    assert plan["attention_kernel"] == "triton" and plan["flash_attention"] is True
    pd.DataFrame([a100, h100, dict(a100, features=a100["features"].replace(" (triton)", ""))]) \
        .to_csv(tmp_path / "published-steps.csv", index=False)
    triton, h100_row, default = B.published_rows(tmp_path)
    assert not triton.error and not B.has_unread(triton), triton.not_modelled
    assert "triton kernel" in triton.label
    # the Triton kernel's attention at 0.4 of FlashAttention-2's rate: a slower step
    assert triton.predicted_s > 1.1 * default.predicted_s
    assert B.has_unread(h100_row) and not h100_row.error
    assert ("feature 'triton': flash-attn's flash attention in Triton has no measurement on "
            "dgx-h100: priced as its default flash kernel, cudnn (the kernel not mapped)"
            in h100_row.not_modelled)
