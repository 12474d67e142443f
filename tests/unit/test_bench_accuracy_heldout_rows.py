"""benchmarks/bench_accuracy.py on held-out rows written by other people: every row is either
predicted with what it states read (and what it leaves to a default or a guess said as
'assumed: ...'), or refused in its own row with a one-line reason; no row stops the benchmark,
and no GPU, network, feature or model column is read as something it does not say."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from benchmarks import bench_accuracy as B
from tests.conftest import ROOT

# Llama 3 8B under FSDP on one DGX H100: the probe's base row, each case a change to it
BASE = dict(source="misc", gpu="H100 SXM5 80GB", hardware_note="DGX H100", gpus=8, tp=1, pp=1,
            dp=8, cp=1, micro_batch=1, global_batch=8, seq_len=8192, dtype="bf16",
            features="bf16; FSDP", layers=32, hidden=4096, heads=32, kv_heads=8,
            ffn_hidden=14336, vocab=128256, gated_mlp=True, tied_embeddings=False,
            published_step_s=1.0)
ROWS = pd.read_csv(ROOT / "tests/data/accuracy/published-steps.csv").to_dict("records")
_TORCHTITAN = next(r for r in ROWS if r["source"] == "torchtitan")


def _published(tmp_path, rows: list[dict], **csv) -> list[B.Row]:
    pd.DataFrame(rows).to_csv(tmp_path / "published-steps.csv", index=False, **csv)
    return B.published_rows(tmp_path)


# ---- the GPU and its network, as a hardware note states them ----

@pytest.mark.parametrize("gpu, note, preset", [
    # NVLink is the SXM part's; the PCIe a DGX or HGX note names is its hosts' and NICs' links
    ("H100", "8x H100 80GB per node, NVLink 900 GB/s, 8x ConnectX-7 400G InfiniBand (PCIe Gen5)",
     "dgx-h100"),
    ("H100 80GB", "Azure ND H100 v5: 8 x H100, NVLink 4.0, PCIe Gen5 host, 3.2 Tbps InfiniBand",
     "dgx-h100"),
    ("A100", "8 x A100 80GB, NVLink, PCIe Gen4 host links", "dgx-a100-80gb"),
    ("H100", "H100 PCIe 80GB, NVLink bridges joining pairs", "h100-pcie"),
    # the GPU's name in other words
    ("HGX H100", "", "dgx-h100"), ("H100 (SXM5)", "", "dgx-h100"),
    ("A100-80G", "", "dgx-a100-80gb"), ("V100-SXM2-32GB", "", "dgx-v100"),
    # a network's rate is not the GPU's memory
    ("A100-SXM4-80GB", "8 x 200 Gb/s HDR, 40 GB/s per NIC", "dgx-a100-80gb"),
    ("A100", "DGX A100, 40 Gb/s Ethernet management", "dgx-a100-80gb")])
def test_a_gpu_is_read_by_what_its_note_says_of_it(gpu, note, preset):
    """Regression: NVLink beside PCIe host links was read as the H100 PCIe card (an A100 as the
    refused A100 PCIe card); '40 Gb/s Ethernet' as an A100's 40 GB."""
    assert B.hardware_of(dict(gpu=gpu, hardware_note=note)) == preset


@pytest.mark.parametrize("gpu, note, why", [
    ("H100", "H100 nodes on PCIe Gen5", "names PCIe but neither the PCIe card"),
    ("A100", "A100 servers, PCIe Gen4", "names PCIe but neither the PCIe card"),
    ("H100", "H100 PCIe cards in an HGX chassis", "names both the PCIe card and the SXM5 part"),
    # any memory but the preset's 80 GB, as 'H100 96GB HBM2e' is
    ("H100 SXM5 80GB", "95 GiB", "95 GB stated"), ("H100", "8 x H100 SXM, 96 GiB", "96 GB stated"),
    ("H100", "H100 SXM 94 GB", "94 GB stated"),
    ("H100", "HGX H100 with 141GB", "141 GB is the H200's memory"),
    ("H100", "H800 SXM (export variant, 400 GB/s NVLink)", "not the DGX H100"),
    ("V100", "DGX-1 V100 16GB", "16 GB stated"), ("V100 16GB", "", "16 GB stated")])
def test_a_gpu_no_preset_has_or_a_note_of_both_readings_is_refused(gpu, note, why):
    """Regression: '95 GiB', '96 GiB' and '141GB' beside an H100 were the DGX H100's 80 GB, and
    'DGX-1 V100 16GB' the DGX-1's 32 GB, silently."""
    with pytest.raises(ValueError, match=why):
        B.hardware_of(dict(gpu=gpu, hardware_note=note))


def test_a_network_rate_keeps_an_a100s_memory_not_stated():
    assert B.hardware_notes(dict(gpu="A100 SXM4", hardware_note="2 x 80 Gb/s RoCE"),
                            "dgx-a100-80gb")[1:] == [
        "assumed: A100 memory not stated: 80 GB (dgx-a100-80gb; the 40 GB part, or a DGX A100 "
        "320GB, is dgx-a100-40gb)"]


@pytest.mark.parametrize("note, stated", [
    ("DGX H100, 1 x 100 Gb/s InfiniBand HDR per node", "1 x 100 Gb/s, HDR InfiniBand"),
    ("DGX H100, 8 x 200 Gb/s", "8 x 200 Gb/s"), ("DGX H100, 100 Gbps", "100 Gb/s")])
def test_a_network_slower_than_the_presets_is_named(note, stated):
    """Regression: a node with one 100 Gb/s NIC was predicted on the DGX H100's eight 400 Gb/s
    ones, and said nothing."""
    assert B.hardware_notes(dict(gpu="H100 SXM5", hardware_note=note), "dgx-h100") == [
        f"hardware note states a network of {stated}: predicted on dgx-h100's (8 x 400 Gb/s NDR, "
        "400 GB/s per node between nodes; a spec file with base: dgx-h100 can state this one)"]


@pytest.mark.parametrize("note", [
    "DGX H100 (8 x H100 SXM 80GB, NVLink4, 8 x 400 Gb/s IB)", "8 x NDR 400G InfiniBand, HGX",
    "HGX H100, InfiniBand 8x400 Gbit/s", "ND H100 v5, SXM, 3.2 Tbps InfiniBand",
    "HGX H100, 400 Gb/s per GPU"])
def test_the_presets_own_network_in_other_words_is_not_named(note):
    assert B.hardware_notes(dict(gpu="H100", hardware_note=note), "dgx-h100") == []


def test_spectrum_x_is_another_network():
    (note,) = B.hardware_notes(dict(gpu="H100 SXM", hardware_note="Spectrum-X 400G"), "dgx-h100")
    assert note.startswith("hardware note names Spectrum-X: predicted on dgx-h100's")


# ---- the source's stack ----

def test_a_torchtitan_fp8_row_is_torchaos_float8_whatever_its_words():
    """Regression: dtype fp8 in a torchtitan row ran Transformer Engine's delayed scaling."""
    with pytest.raises(ValueError, match="torchtitan's FP8 is torchao's float8"):
        B.plan_of(dict(_TORCHTITAN, dtype="fp8", features="fp8; FSDP2"))


def test_a_sources_name_is_compared_whatever_its_case_and_spaces():
    """Regression: 'TorchTitan' was not torchtitan (its eager kernels dropped)."""
    assert B.plan_of(dict(_TORCHTITAN, source=" TorchTitan "))[1]["kernels"] == "eager"
    with pytest.raises(ValueError, match="torchao"):
        B.plan_of(dict(_TORCHTITAN, source="TorchTitan", dtype="fp8"))


def test_a_deepspeed_source_with_a_pipeline_is_deepspeeds_pipeline_engine():
    """Regression: Megatron-DeepSpeed with pp 2 ran Megatron's pipeline (its gradients
    reduced during the backward, no scatter-gather), and took ZeRO-2 with it."""
    row = dict(BASE, source="Megatron-DeepSpeed", gpus=16, tp=2, pp=2, dp=4, global_batch=8,
               features="bf16; ZeRO-1")
    _, plan, _ = B.plan_of(row)
    assert (plan["schedule"], plan["overlap_grad_sync"], plan["pp_scatter_gather"]) == (
        "1f1b", False, True)
    with pytest.raises(ValueError, match="pipeline engine refuses ZeRO stages 2 and 3"):
        B.plan_of(dict(row, features="bf16; ZeRO-2"))
    with pytest.raises(ValueError, match="disagree: schedule interleaved against 1f1b"):
        B.plan_of(dict(row, features="bf16; ZeRO-1, VP=2"))


# ---- the model's columns and its sliding window ----

_MISTRAL = dict(BASE, vocab=32000, features="bf16; FSDP, full recompute, flash attention")


def test_mistrals_shape_says_its_window_is_assumed_or_reads_it():
    """Regression: Mistral 7B's shape was read by its tokenizer (Llama's 32000) and its 4096-token
    window dropped, silently."""
    model, _, _, origin = B.read_row(_MISTRAL)
    assert "sliding_window" not in model
    assert B.architecture_assumed(_MISTRAL, origin) == [
        "assumed: sliding window not stated: none, every layer attends over the whole sequence "
        "(the shape of Mistral 7B v0.1, which attends over 4096 tokens; 'sliding window 4096' or "
        "a sliding_window column states it)"]
    for feature in ("sliding window attention (window 4096)", "SWA 4096", "sliding window 4096"):
        row = dict(_MISTRAL, features=f"{_MISTRAL['features']}, {feature}")
        model, _, missing, origin = B.read_row(row)
        assert model["sliding_window"] == 4096 and missing == [], feature
        assert B.architecture_assumed(row, origin) == []
    assert B.read_row(dict(_MISTRAL, sliding_window=4096))[0]["sliding_window"] == 4096


def test_the_rows_model_columns_win_over_the_architecture_table():
    """Regression: bias, norm and position columns were dropped on an ARCHITECTURES shape."""
    model = B.model_of(dict(BASE, bias="yes", norm="LayerNorm", position_embedding="learned"))
    assert (model["name"], model["bias"], model["norm"], model["position_embedding"]) == (
        "llama3-8b", True, "layernorm", "learned")


@pytest.mark.parametrize("change, why", [
    (dict(position_embedding="rotary", features="bf16; FSDP, ALiBi"),
     "'position_embedding column' and 'ALiBi' disagree"),
    (dict(bias=True, features="bf16; FSDP, no bias"), "'bias column' and 'no bias' disagree"),
    (dict(dropout=0.1, features="bf16; FSDP, no dropout"), "disagree: hidden_dropout 0.1")])
def test_a_feature_that_contradicts_a_column_refuses_the_row(change, why):
    """Regression: the feature won, silently."""
    with pytest.raises(ValueError, match=why):
        B.plan_of(dict(BASE, **change))


def test_an_empty_kv_heads_or_ffn_hidden_is_read_or_refused_by_name():
    gpt = dict(BASE, vocab=50304, gated_mlp=False, tied_embeddings=True, kv_heads="",
               ffn_hidden=None)
    model, _, _, origin = B.read_row(gpt)
    assert (model["kv_heads"], "ffn_hidden" in model) == (32, False)  # TransformerSpec: 4 h
    assert [n for n in B.architecture_assumed(gpt, origin) if "not stated: " in n][:2] == [
        "assumed: kv_heads not stated: heads (multi-head attention)",
        "assumed: ffn_hidden not stated: 4 x hidden (TransformerSpec's default for an MLP not "
        "gated)"]
    with pytest.raises(ValueError, match="ffn_hidden: empty, and a gated MLP's width"):
        B.plan_of(dict(BASE, ffn_hidden=float("nan")))


@pytest.mark.parametrize("value, read", [
    ("yes", True), ("No", False), ("n", False), ("Y", True), (1, True), (0.0, False),
    ("FALSE", False), (" true ", True)])
def test_a_boolean_column_is_read_in_its_words(value, read):
    """Regression: bool('no') is True: tied_embeddings 'no' read as tied."""
    assert B._flag({"tied_embeddings": value}, "tied_embeddings") is read
    with pytest.raises(ValueError, match="tied_embeddings 'maybe': true or false"):
        B._flag({"tied_embeddings": "maybe"}, "tied_embeddings")


# ---- features ----

@pytest.mark.parametrize("feature, options", [
    ("FSDP (NO_SHARD)", {"zero": 0, "overlap_grad_sync": True}),
    ("FSDP NO_SHARD", {"zero": 0, "overlap_grad_sync": True})])
def test_fsdps_no_shard_is_data_parallel(feature, options):
    """Regression: 'FSDP (NO_SHARD)' was ZeRO 3, NO_SHARD named as not read."""
    _, plan, missing = B.plan_of(dict(BASE, features=f"bf16; {feature}"))
    assert {k: plan[k] for k in options} == options and missing == []


@pytest.mark.parametrize("feature, why", [
    ("activation checkpointing (4 of 32 layers)", "its parenthetical '4 of 32 layers' is not read"),
    ("sequence parallelism (Ulysses)", "DeepSpeed-Ulysses is context parallelism"),
    ("FSDP with CPU offload", "offloading to the host"),
    ("DeepSpeed ZeRO-3 with offload", "offloading to the host"),
    ("ZeRO++ hierarchical partitioning", "names ZeRO or FSDP but is not read"),
    ("0 layers per virtual stage", "0 layers per virtual stage: at least 1")])
def test_a_feature_that_would_be_misread_refuses_its_row(feature, why):
    """Regression: each was applied in full (full recompute of every layer, Megatron's sequence
    parallelism, ZeRO 3), or taken for ZeRO 0 ('assumed: ZeRO not stated'), or divided by."""
    with pytest.raises(ValueError, match=why):
        B.plan_of(dict(BASE, gpus=16, pp=2, features=f"bf16; {feature}"))


def test_ulysses_with_the_cp_column_is_context_parallel_all_to_all():
    _, plan, _ = B.plan_of(dict(BASE, gpus=16, cp=2,
                                features="bf16; FSDP, sequence parallelism (Ulysses)"))
    assert (plan["cp"], plan["cp_comm"], "sequence_parallel" in plan) == (2, "a2a", False)


def test_vp_1_is_plain_1f1b():
    """Regression: NeMo's VP=1 (no interleaving) was refused as interleaved without its stages."""
    _, plan, _ = B.plan_of(dict(BASE, gpus=16, pp=2, features="bf16; FSDP, VP=1"))
    assert plan["schedule"] == "1f1b" and "virtual_stages" not in plan


@pytest.mark.parametrize("feature, options", [
    ("Megatron sequence-parallel", {"sequence_parallel": True}),
    ("TE fp8 hybrid", {"fp8_recipe": "delayed"}),
    ("flash-attn v2.5", {"flash_attention": True, "attention_kernel": "fa2"}),
    ("--use-flash-attn", {"flash_attention": True}),
    ("torch compile", {"stack": "compiled"}),
    ("--recompute-activations", {"recompute": "selective"}),
    ("grad accum 8", {"_grad_accumulation": 8}), ("GAS 8", {"_grad_accumulation": 8})])
def test_more_common_wordings_are_read(feature, options):
    assert B.generic_feature(feature) == options


def test_quoted_features_fp8_hybrid_and_compile_with_cuda_graphs_are_read():
    _, plan, missing = B.plan_of(dict(BASE, features='bf16; "ZeRO-1", torch.compile, CUDA graphs'))
    assert (plan["zero"], plan["stack"], missing) == (1, "cuda-graphs", [])
    # the HYBRID format: either recipe; the recipe unstated is the preset's, named as assumed
    model, plan, missing = B.plan_of(dict(BASE, dtype="fp8", features="fp8 (hybrid); FSDP"))
    assert "fp8_recipe" not in plan and missing == []
    assert "assumed: FP8 recipe not stated: delayed scaling (the preset's default)" in (
        B.assumed_defaults(model, plan, "dgx-h100"))


@pytest.mark.parametrize("dtype, read", [("BF16", "bf16"), (" bf16 ", "bf16"),
                                         ("bfloat16", "bf16"), ("FP8", "fp8"),
                                         ("float16", "fp16"), ("fp16", "fp16"),
                                         ("float32", "fp32")])
def test_a_dtype_is_read_in_its_words(dtype, read):
    features = {"fp8": "fp8; FSDP", "fp16": "FSDP", "fp32": "FSDP"}.get(read, "bf16; FSDP")
    assert B.plan_of(dict(BASE, dtype=dtype, features=features))[1]["dtype"] == read


# ---- whole files: no row stops the benchmark ----

@pytest.mark.parametrize("change, why", [
    (dict(cp="-"), "cp '-': not a whole number"), (dict(cp="none"), "cp 'none'"),
    (dict(micro_batch=1.5), "micro_batch 1.5: not a whole number"),
    (dict(micro_batch=0, global_batch=8, features="bf16; FSDP, gradient accumulation 8"),
     "micro_batch 0: at least 1"),
    (dict(published_step_s="1.5 s"), "published_step_s '1.5 s': a positive number of seconds"),
    (dict(published_step_s=0), "published_step_s '0.0': a positive number"),
    (dict(published_step_s=-1), "published_step_s '-1.0'"),
    (dict(published_step_s="N/A"), "published_step_s: empty"),  # pandas' NaN
    (dict(published_step_s=None), "published_step_s: empty"),
    (dict(published_peak_mem_gib="60 GiB"), "published_peak_mem_gib '60 GiB'"),
    (dict(source=None), "source: empty"),
    (dict(dtype="int8"), "dtype 'int8' (one of bf16")])
def test_a_row_that_would_stop_the_benchmark_is_refused_in_its_row(tmp_path, change, why):
    """Regression: each raised out of published_rows (ValueError, ZeroDivisionError) and the
    whole benchmark stopped; a step of 0, N/A or below spoilt its set's MAPE."""
    good, bad = _published(tmp_path, [BASE, dict(BASE, **change)])
    assert good.predicted_s and not good.error
    assert bad.predicted_s is None and why in bad.error, bad.error
    assert not math.isnan(B.mape([good, bad]))


def test_empty_cells_read_as_their_defaults(tmp_path):
    """Regression: an empty cp or pp was 'cannot convert float NaN to integer'; '2.0' is 2; an
    empty features or hardware_note cell was a feature or note called 'nan'."""
    rows = _published(tmp_path, [dict(BASE, cp=None, pp=None, features=None, hardware_note=None),
                                 dict(BASE, gpus=16, cp="2.0")])
    assert all(r.predicted_s for r in rows), [r.error for r in rows]
    assert not [n for r in rows for n in r.not_modelled if "nan" in n]
    assert rows[0].label.endswith("tp1 pp1 dp8 mb1 bf16 []") and " cp2 " in rows[1].label


@pytest.mark.parametrize("header", [
    lambda c: c.upper(), lambda c: f" {c} "])
def test_headers_are_read_whatever_their_case_and_spaces(tmp_path, header):
    """Regression: 'TP' for tp, and spaces after the commas of the header, were KeyErrors."""
    frame = pd.DataFrame([BASE]).rename(columns=header)
    frame.to_csv(tmp_path / "published-steps.csv", index=False)
    (row,) = B.published_rows(tmp_path)
    assert row.predicted_s and not row.error


def test_a_file_without_a_column_every_row_needs_refuses_its_rows_by_name(tmp_path):
    (row,) = _published(tmp_path, [{k: v for k, v in BASE.items() if k != "dp"}])
    assert row.error == ("not read: the file has no dp column (published-steps.csv's schema: "
                         "SOURCES.md)")


def test_a_row_refused_before_its_time_was_read_prints_no_nan(tmp_path, capsys):
    """Regression: a file without a column every row needs printed 'nan' as each row's
    published time (console, markdown, CSV)."""
    rows = _published(tmp_path, [{k: v for k, v in BASE.items() if k != "seq_len"}])
    B.print_report(rows, [])
    page = B.markdown(rows, [])
    assert "nan" not in capsys.readouterr().out.lower() and "nan" not in page.lower()
    line = next(x for x in page.splitlines() if "no seq_len column" in x)
    assert line.split("|")[3].strip() == "-"


def test_rows_text_is_printed_as_written(tmp_path, capsys):
    """Regression: features holding '[/ none]' stopped the console table (rich's MarkupError),
    its labels lost their '[...]', and '|' or a line break in a feature (BLOOM's
    --pp-partition-method 'type:transformer|embedding') broke the markdown table."""
    rows = _published(tmp_path, [dict(BASE, features="bf16; FSDP, a new trick [/ none]"),
                                 dict(BASE, features="bf16; FSDP, x|y\nflash attention")])
    B.print_report(rows, [])
    out = capsys.readouterr().out
    assert "[/ none]" in out and "[FSDP" in out
    page = B.markdown(rows, [])
    line = next(x for x in page.splitlines() if "x\\|y" in x)
    assert line.replace("\\|", "").count("|") == 9
