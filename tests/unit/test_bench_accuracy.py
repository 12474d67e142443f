"""benchmarks/bench_accuracy.py reads every published run: each feature its source states is mapped
to a plan option or named as not modelled (never dropped), and each model has the published size."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import bench_accuracy as B
from perfmodel import TransformerSpec, load_hardware
from perfmodel.predict import parameter_count
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "accuracy"
ROWS = pd.read_csv(DATA / "published-steps.csv").to_dict("records")

# Published sizes [parameters]: Nemotron-4 15B (arXiv 2402.16819: 15B, of which 3.2B embeddings),
# Nemotron-4 340B (arXiv 2406.11704), GPT-3 175B (Brown et al. 2020, Table 2.1), Llama 3 8B and
# 70B (Meta's model cards: 8.03B, 70.6B), Llama 2 13B and 70B (arXiv 2307.09288: 13B, 70B)
SIZES = {"nemotron4-15b": 15.7e9, "nemotron4-340b": 341e9, "gpt3-175b-nemo": 175e9,
         "llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama2-13b": 13.0e9, "llama2-70b": 69.0e9}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['source']}-{i}" for i, r in enumerate(ROWS)])
def test_every_feature_is_mapped_or_named(row):
    model, plan, missing = B.plan_of(row)
    assert not [m for m in missing if m.startswith("unknown feature")], missing
    assert plan["dp"] * plan["tp"] * plan["pp"] == plan["gpus"]
    spec = TransformerSpec(**model)
    size = parameter_count(spec, load_hardware(B.hardware_of(row)), "bf16")
    assert size == pytest.approx(SIZES[model["name"]], rel=0.05), model["name"]


def test_an_unknown_feature_is_named():
    row = dict(ROWS[0], features="bf16; SP, a new trick")
    assert "unknown feature 'a new trick' (not mapped)" in B.plan_of(row)[2]


def test_the_dgxc_configs_state_dtypes_are_mapped_by_release():
    # v24.11.1 nemotron4-340b-synth.yaml: distributed_fused_adam dtype bf16, grad_sync_dtype bf16;
    # its configure.sh exports NVTE_FUSED_ATTN=0: Transformer Engine runs FlashAttention-2
    row = next(r for r in ROWS if r["source"] == "dgxc" and r["hidden"] == 18432
               and "v24.11.1" in r["source_ref"] and r["dtype"] == "bf16")
    assert B.release_of(row) == "v24.11.1"
    _, plan, missing = B.plan_of(row)
    assert plan["grad_dtype"] == "bf16" and plan["optimizer_dtype"] == "bf16"
    assert plan["attention_kernel"] == "fa2" and not missing
    later = next(r for r in ROWS if r["source"] == "dgxc" and r["hidden"] == 18432
                 and B.release_of(r) == "v25.04")
    assert "attention_kernel" not in B.plan_of(later)[1]  # the preset's default, cuDNN's


def test_nemo_1s_distributed_adam_keeps_remainders_where_its_config_does():
    # NeMo megatron_base_model.py (v1.23.0 to v2.0.0): fp32 states beside bf16 weights store
    # the master weights' 16-bit remainders unless fp8_params (store_params); v24.11.1
    # nemotron/configure.sh sets fp8_params to FP8_ENABLED, gpt3_175b_hydra.yaml to true always
    def master(hidden, dtype):
        row = next(r for r in ROWS if r["source"] == "dgxc" and r["hidden"] == hidden
                   and B.release_of(r) == "v24.11.1" and r["dtype"] == dtype)
        return B.plan_of(row)[1].get("master_weights")
    assert master(6144, "bf16") == "remainders"
    assert master(6144, "fp8") is None and master(12288, "bf16") is None


def test_the_fp8_runs_map_their_stated_recipe_and_fp8_weights():
    # dgxc v24.11.1: nemotron/configure.sh +model.fp8_params=${FP8_ENABLED}, fp8_hybrid, amax
    # history 1024 (DelayedScaling); gpt3_175b_hydra.yaml fp8_params: true; v25.04: NeMo 2's
    # bf16_with_fp8_mixed (fp8_recipe "delayed", fp8_params / fp8_param_gather)
    for row in (r for r in ROWS if r["dtype"] == "fp8"):
        _, plan, _ = B.plan_of(row)
        assert (plan["dtype"], plan["fp8_recipe"], plan["fp8_params"]) == \
            ("fp8", "delayed", True)


def test_the_fp8_rows_are_predicted_and_scored():
    """Issue 17: the 12 FP8 runs are predicted (none refused) and scored beside their bf16
    twins; the MAPE itself is measured by `python benchmarks/bench_accuracy.py`, not held here
    (it moves with the model; docs/accuracy.md reports it)."""
    rows = [r for r in B.published_rows(DATA) if r.dtype == "fp8"]
    assert len(rows) == 12 and all(r.predicted_s and not r.error for r in rows)
    summary = {key: (n, refused) for key, n, refused, _, _ in B.summary(rows)}
    assert summary == {"dgxc fp8": (12, 0)}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['source']}-{r['hidden']}-{r['gpus']}-"
                                                    f"{r['dtype']}")
def test_every_published_run_fits(row):
    """Issue 16: no plan that ran is predicted not to fit (issue 17: the FP8 runs too)."""
    from perfmodel import predict

    model, plan, _ = B.plan_of(row)
    r = predict(TransformerSpec(**model), B.hardware_of(row), plan)
    assert r.fits_in_memory, f"{r.memory_per_gpu_bytes / 2**30:.1f} GiB"


# Held-out runs come in the same schema with models, GPUs and features the development set does
# not have: the benchmark reads what it can know and refuses the rest row by row, never the file.
_GPT_2P7B = dict(ROWS[0], source="megatron-deepspeed", gpu="A100",
                 hardware_note="A100 40GB SXM", gpus=8, tp=1, pp=1, dp=8, micro_batch=4,
                 global_batch=32, seq_len=2048, dtype="fp16", layers=32, hidden=2560, heads=32,
                 kv_heads=32, ffn_hidden=10240, vocab=50304, gated_mlp=False,
                 tied_embeddings=True, features="fp16; DeepSpeed ZeRO-1, FlashAttention-2")


def test_a_model_outside_the_table_takes_its_tokenizers_architecture():
    model, plan, missing = B.plan_of(_GPT_2P7B)
    # GPT-2 BPE (50257, padded to 50304): learned positions, biases, LayerNorm, tied
    assert (model["position_embedding"], model["bias"], model["norm"], model["gated_mlp"],
            model["tied_embeddings"]) == ("learned", True, "layernorm", False, True)
    assert (plan["zero"], plan["flash_attention"], missing) == (1, True, [])
    assert B.hardware_of(_GPT_2P7B) == "dgx-a100-40gb"
    llama2_7b = dict(_GPT_2P7B, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008,
                     vocab=32000, gated_mlp=True, tied_embeddings=False)
    arch = B.architecture_of(llama2_7b)
    assert (arch["position_embedding"], arch["norm"], arch["bias"]) == ("rotary", "rmsnorm",
                                                                        False)


@pytest.mark.parametrize("change, why", [
    (dict(vocab=151936, gated_mlp=True, tied_embeddings=False), "vocab 151936: no known"),
    # Gemma's 256000 is gated and tied; the table's 256000 is Nemotron-4's (squared ReLU)
    (dict(vocab=256000, gated_mlp=True), "vocab 256000: no known"),
    (dict(gpu="H800"), "gpu 'H800' has no preset"),
    # torchtitan's H100 benchmarks (benchmarks/llama3_h100_202412_torchtitan.md, 9dec370): Grand
    # Teton's 96 GB HBM2e H100 at 500 W is not the DGX H100
    (dict(gpu="H100", hardware_note="H100 96GB HBM2e, 500W (Grand Teton)"),
     "no preset has its memory"),
])
def test_a_row_it_cannot_know_is_refused_in_its_row(tmp_path, change, why):
    frame = pd.DataFrame([ROWS[0], dict(_GPT_2P7B, **change)])
    frame.to_csv(tmp_path / "published-steps.csv", index=False)
    known, unknown = B.published_rows(tmp_path)
    assert known.predicted_s and not known.error
    assert unknown.predicted_s is None and why in unknown.error, unknown.error
    assert B.summary([unknown]) == [("megatron-deepspeed fp16", 0, 1, pytest.approx(float("nan"),
                                                                                   nan_ok=True),
                                     pytest.approx(float("nan"), nan_ok=True))]


def test_architecture_columns_a_row_states_win():
    row = dict(_GPT_2P7B, vocab=151936, gated_mlp=True, tied_embeddings=False, bias=False,
               norm="rmsnorm", position_embedding="rotary", model="qwen-like")
    arch = B.architecture_of(row)
    assert (arch["name"], arch["norm"], arch["bias"]) == ("qwen-like", "rmsnorm", False)
    assert "fused_qkv" not in arch  # not stated: the spec's default, q, k and v apart
    # MPT's Wqkv, as llm-foundry's rows state it (tests/data/accuracy-llm-foundry/SOURCES.md)
    assert B.architecture_of(dict(row, fused_qkv="yes"))["fused_qkv"] is True
    assert B.model_of(dict(row, fused_qkv="true"))["fused_qkv"] is True


@pytest.mark.parametrize("feature, options", [
    ("ZeRO-1", {"zero": 1}), ("DeepSpeed ZeRO-3", {"zero": 3}), ("ZeRO stage 2", {"zero": 2}),
    ("VP=4", {"schedule": "interleaved", "virtual_stages": 4}),
    ("Full recompute", {"recompute": "full"}), ("selective recompute", {"recompute": "selective"}),
    ("distributed optimizer", {"zero": 1}), ("overlap-grad-reduce", {"overlap_grad_sync": True}),
    ("torch.compile", {"stack": "compiled"}), ("FP8 current scaling", {"fp8_recipe": "current"}),
    ("DeepEP", {"ep_dispatcher": "deepep"}), ("HybridEP", {"ep_dispatcher": "deepep"}),
    ("alltoall dispatcher", {"ep_dispatcher": "alltoall"}),
    ("MoE A2A overlap", {"ep_comm_overlap": True}),
    ("bf16 gradient reduce", {"grad_dtype": "bf16"}),
    ("TE cross-entropy fusion", {"cross_entropy": "te"}),
    ("selective recompute of mla_up_proj", {"recompute": "selective",
                                            "recompute_modules": "mla_up_proj"}),
    ("selective recompute of layernorm+moe_act", {"recompute": "selective",
                                                  "recompute_modules": "layernorm,moe_act"}),
    # NeMo 1's names (megatron_gpt_config.yaml) and other stacks' words
    ("distributed_fused_adam", {"zero": 1, "dp_bucketing": "all"}),
    ("overlap_param_sync", {"overlap_param_gather": True}),
    ("ub_tp_comm_overlap", {"tp_comm_overlap": True}), ("fp8_hybrid", {"fp8_recipe": "delayed"}),
    ("megatron_amp_O2", {}), ("FSDP", {"zero": 3, "overlap_grad_sync": True}),
    ("async TP", {"tp_comm_overlap": True}),
    ("store_param_remainders", {"master_weights": "remainders"}),
    # a named attention kernel is that kernel (a preset without it refuses the row), an unnamed
    # one the preset's default
    ("flash attention", {"flash_attention": True}),
    ("NVTE_FUSED_ATTN=0", None),  # which flash-attn TE then runs depends on its version
    ("grad_sync_dtype bf16", {"grad_dtype": "bf16"}),
    ("FlashAttention-2", {"flash_attention": True, "attention_kernel": "fa2"}),
    ("FA3", {"flash_attention": True, "attention_kernel": "fa3"}),
    ("cuDNN attention", {"flash_attention": True, "attention_kernel": "cudnn"}),
    ("a new trick", None), ("ZeRO-4", None), ("selective recompute of", None),
])
def test_features_as_other_runs_state_them(feature, options):
    assert B.generic_feature(feature) == options


def test_a_compiled_torchtitan_run_keeps_compiled_kernels():
    row = next(r for r in ROWS if r["source"] == "torchtitan")
    assert B.plan_of(row)[1]["kernels"] == "eager"  # the 2024 A100 runs: compile = false
    plan = B.plan_of(dict(row, features=row["features"] + ", torch.compile"))[1]
    assert plan["stack"] == "compiled" and "kernels" not in plan


def test_an_nccl_tests_log_of_another_cluster_is_reported_not_held():
    assert B.nccl_preset("h200x8-allreduce-somewhere.txt") == (
        "hgx-h200", "not in NCCL_LOGS: its fabric is not documented here")
    preset, why = B.nccl_preset("h800x8-allreduce.txt")
    assert preset is None and "no preset for this log's GPU" in why


_MIXTRAL = dict(_GPT_2P7B, source="megatron-moe", gpu="H100", hardware_note="DGX H100", gpus=64,
                tp=2, pp=1, dp=32, micro_batch=1, global_batch=256, seq_len=4096, dtype="bf16",
                layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
                gated_mlp=True, tied_embeddings=False,
                features="bf16; SP, distributed optimizer, recompute full, flash attention")


def test_a_mixture_of_experts_row_names_its_preset_or_its_experts():
    """A held-out file's optional columns: `model` (a preset the row's sizes must agree with),
    the experts' fields and the expert-parallel degrees; never read as the dense model its
    sizes alone would give."""
    # (etp stated: unstated with tp 2, the row says which it assumed, test_bench_accuracy_probe_
    # 20261208)
    model, plan, missing = B.plan_of(dict(_MIXTRAL, model="mixtral-8x7b", ep=8, etp=1))
    assert (model["name"], model["experts"], model["top_k"], model["seq_len"]) == \
        ("mixtral-8x7b", 8, 2, 4096)
    assert (plan["ep"], plan["zero"], plan["recompute"]) == (8, 1, "full")
    # the routing the row does not state: the preset's even routing, said as assumed
    assert len(missing) == 1 and missing[0].startswith("assumed: routing not stated: even")
    _, _, missing = B.plan_of(dict(_MIXTRAL, model="mixtral-8x7b", ep=8, etp=1,
                                   features=_MIXTRAL["features"] + ", force load balancing"))
    assert missing == []
    model, plan, _ = B.plan_of(dict(_MIXTRAL, experts=8, top_k=2, moe_ffn_hidden=14336, ep=4))
    assert (model["experts"], model["top_k"], model["expert_ffn_hidden"], plan["ep"]) == \
        (8, 2, 14336, 4)
    spec = TransformerSpec(**model)
    assert parameter_count(spec, load_hardware("dgx-h100"), "bf16") == pytest.approx(46.7e9,
                                                                                   rel=0.005)


def test_a_moe_row_states_its_dispatcher_and_routing():
    model, plan, missing = B.plan_of(dict(
        _MIXTRAL, model="mixtral-8x7b", ep=8, etp=1, dispatcher="HybridEP",
        features=_MIXTRAL["features"] + ", fake balanced gate, MoE A2A overlap"))
    assert (plan["ep_dispatcher"], plan["ep_comm_overlap"], missing) == ("deepep", True, [])
    assert (model["routing"], model["routing_imbalance"]) == ("round_robin", 1.0)
    with pytest.raises(ValueError, match="dispatcher nvshmem"):
        B.plan_of(dict(_MIXTRAL, model="mixtral-8x7b", dispatcher="nvshmem"))
    _, _, missing = B.plan_of(dict(_MIXTRAL, features="bf16, fake balanced gate"))
    assert missing == ["feature 'fake balanced gate' on a model without experts (not mapped)"]


def test_a_column_it_does_not_read_is_named_and_a_preset_that_disagrees_refused(tmp_path):
    _, _, missing = B.plan_of(dict(_MIXTRAL, model="mixtral-8x7b", router="sinkhorn"))
    assert missing[0] == "column router=sinkhorn (not read)"
    with pytest.raises(ValueError, match="ffn_hidden 2048 .preset 14336. differ"):
        B.plan_of(dict(_MIXTRAL, model="mixtral-8x7b", ffn_hidden=2048))
    frame = pd.DataFrame([dict(_MIXTRAL, model="mixtral-8x7b", ffn_hidden=2048)])
    frame.to_csv(tmp_path / "published-steps.csv", index=False)
    (row,) = B.published_rows(tmp_path)
    assert row.label.startswith("mixtral-8x7b ") and "ffn_hidden 2048" in row.error


def test_a_row_gives_its_pipeline_layout_and_its_mtp_modules():
    """The held-out columns `pipeline_layout` (Megatron's syntax: a split the stages' even share
    cannot give) and `mtp_layers` (a recipe that trains a preset without its MTP module)."""
    llama = dict(_MIXTRAL, layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248,
                 vocab=128256, gpus=1024, tp=8, pp=8, dp=16, model="llama3.1-405b",
                 features="bf16; VP=8, SP", pipeline_layout="Et*1|(t*2|)*62t*1L")
    model, plan, missing = B.plan_of(llama)
    assert (plan["pipeline_layout"], missing) == ("Et*1|(t*2|)*62t*1L", [])
    dsv3 = dict(_MIXTRAL, model="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128,
                ffn_hidden=18432, vocab=129280, mtp_layers=0)
    assert B.model_of(dsv3)["mtp_layers"] == 0
    assert B.model_of({**dsv3, "mtp_layers": None})["mtp_layers"] == 1


def test_the_megatron_bridge_runs_are_read():
    """tests/data/accuracy-megatron-bridge (Megatron-Bridge's published 25.11 tables): every row
    predicted, or refused in its row with the reason (the one whose pipeline layout no recipe
    gives); none lost to an exception."""
    rows = B.published_rows(ROOT / "tests/data/accuracy-megatron-bridge")
    assert len(rows) == 18
    refused = {r.label.split(" [")[0]: r.error for r in rows if r.error}
    unlaid = "deepseek-v3 GB200 x256 tp1 pp8 dp32 mb1 fp8"
    assert list(refused) == [unlaid], refused
    assert "divisible by pp x virtual_stages" in refused[unlaid]


def test_the_moe_heldout_runs_are_read():
    """tests/data/accuracy-moe-heldout (mixtures of experts from Megatron-Bridge's 26.02, 26.04
    and 26.06 tables, Megatron-MoE-ModelZoo's H100 table and Megatron-LM's MoE README): every row
    predicted, none refused, none lost to an exception."""
    rows = B.published_rows(ROOT / "tests/data/accuracy-moe-heldout")
    assert len(rows) == 22
    assert not [(r.label, r.error) for r in rows if r.error]
    assert all(r.predicted_s and r.predicted_s > 0 for r in rows)


def test_the_nemo_long_context_runs_are_read():
    """tests/data/accuracy-nemo-long-context (NeMo's long-sequence table of 2024, Llama 2 7B FP8
    on DGX H100, 4K to 1M tokens): every row read as its layout, with the settings of the
    container's launcher (FlashAttention-2: NVTE_FUSED_ATTN=0; bf16 gradients; the master
    weights' remainders), and predicted; every one fits, as they ran."""
    rows = B.published_rows(ROOT / "tests/data/accuracy-nemo-long-context")
    frame = pd.read_csv(ROOT / "tests/data/accuracy-nemo-long-context/published-steps.csv")
    assert len(rows) == len(frame) == 9 and not [r.error for r in rows if r.error]
    for row in frame.to_dict("records"):
        model, plan, missing = B.plan_of(row)
        assert not missing and model["name"] == "llama2-7b"
        assert (plan["attention_kernel"], plan["master_weights"], plan["fp8_recipe"],
                plan["grad_dtype"]) == ("fa2", "remainders", "delayed", "bf16")
        assert plan.get("cp", 1) * plan["tp"] * plan["pp"] * plan["dp"] == row["gpus"]
    assert all(r.memory_gib is not None and r.capacity_gib is not None
               and r.memory_gib <= r.capacity_gib for r in rows), [r.memory_gib for r in rows]


@pytest.mark.parametrize("data, anchor, end, digits", [
    ("accuracy-nemo-long-context", "{#nemo-long-context}", "{#nemo-2407}", 2),
    ("accuracy-nemo-2407", "{#nemo-2407}", "{#megatron-bridge}", 3)])
def test_the_nemo_sections_report_the_benchmarks_numbers(data, anchor, end, digits):
    """docs/accuracy.md's sections on NeMo's 2024 tables: each row's published and predicted
    seconds, error and memory (marked tight or not fitting, as perfmodel.predict.memory_verdict
    says) are what the benchmark gives now, in the CSV's order."""
    rows = B.published_rows(ROOT / "tests/data" / data)
    text = (ROOT / "docs/accuracy.md").read_text()
    section = text[text.index(anchor):text.index(end)]
    table = [line.split(" | ") for line in section.splitlines()
             if line.startswith("| ") and not line.startswith(("| run ", "| sequence "))
             and "---" not in line]
    assert len(table) == len(rows)
    for cells, row in zip(table, rows, strict=True):
        assert row.predicted_s is not None and row.signed_error is not None
        assert cells[2:5] == [f"{row.published_s:.{digits}f}", f"{row.predicted_s:.{digits}f}",
                              f"{100 * row.signed_error:+.1f}%"], cells
        assert row.memory_gib is not None and row.capacity_gib is not None
        mark = {"fits": "", "tight": ": tight"}.get(row.memory_verdict, ": not fitting")
        assert cells[-1].rstrip(" |") == f"{row.memory_gib:.1f}{mark}", cells


# Narayanan et al. SC21 Table 1 as NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (de7dc40f88)
# runs it: size -> (tp, pp, micro-batch, virtual stages: layers / (pp x layers per virtual stage))
SC21_SCRIPT = {24: (1, 1, 16, 1), 30: (2, 1, 16, 1), 36: (4, 1, 16, 1), 40: (8, 1, 8, 1),
               48: (8, 2, 4, 1), 60: (8, 4, 2, 3), 80: (8, 8, 2, 2), 96: (8, 16, 1, 2),
               105: (8, 35, 1, 3), 128: (8, 64, 1, 1)}


def test_the_sc21_weak_scaling_runs_are_read_as_their_script_ran_them():
    """tests/data/accuracy-megatron-sc21: the ten runs, each read with its script's layout, fp16,
    full recompute, unfused attention, torch DDP's overlapped reduce without a pipeline and local
    DDP's reduce after the backward with one (scatter-gathered sends), no distributed optimizer;
    nothing assumed, and predicted; every one fits."""
    frame = pd.read_csv(ROOT / "tests/data/accuracy-megatron-sc21/published-steps.csv")
    rows = B.published_rows(ROOT / "tests/data/accuracy-megatron-sc21")
    assert len(rows) == len(frame) == 10 and not [r.error for r in rows if r.error]
    for row in frame.to_dict("records"):
        model, plan, missing = B.plan_of(row)
        tp, pp, micro, virtual = SC21_SCRIPT[row["layers"]]
        assert (plan["tp"], plan["pp"], plan["micro_batch"], plan.get("virtual_stages", 1)) == (
            tp, pp, micro, virtual), row["layers"]
        assert plan["tp"] * plan["pp"] * plan["dp"] == row["gpus"]
        assert (plan["dtype"], plan["recompute"], plan["flash_attention"], plan["zero"]) == (
            "fp16", "full", False, 0)
        assert plan["overlap_grad_sync"] == (pp == 1)
        assert plan.get("pp_scatter_gather", False) == (pp > 1)
        assert not missing and B.assumed_defaults(model, plan, B.hardware_of(row)) == []
        # the published TFLOP/s turned into seconds with the paper's Eq. 3 (s 2048, V 51,200)
        b, s, layers, h, v = row["global_batch"], 2048, row["layers"], row["hidden"], 51200
        flops = 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))
        assert row["published_step_s"] == pytest.approx(
            flops / (row["published_value"] * 1e12 * row["gpus"]), abs=0.0006)
    assert all(r.memory_gib is not None and r.capacity_gib is not None
               and r.memory_gib <= r.capacity_gib for r in rows)


def test_the_nemo_2407_runs_are_read():
    """tests/data/accuracy-nemo-2407 (NeMo's 24.07 performance summary): every row read with its
    launcher's settings (FlashAttention-2, the master weights as NeMo keeps them) and predicted;
    a model of another depth than its width's entry (Nemotron 22B beside Nemotron-4 15B) is not
    taken for it."""
    frame = pd.read_csv(ROOT / "tests/data/accuracy-nemo-2407/published-steps.csv")
    rows = B.published_rows(ROOT / "tests/data/accuracy-nemo-2407")
    assert len(rows) == len(frame) == 12 and not [r.error for r in rows if r.error]
    names = []
    for row in frame.to_dict("records"):
        model, plan, missing = B.plan_of(row)
        assert not missing and plan["attention_kernel"] == "fa2", missing
        assert plan.get("master_weights") == ("remainders" if plan.get("optimizer_dtype") is None
                                              else None)
        names.append(model["name"])
    assert names[8] == "40x6144-v256000" and names[6] == "llama2-70b"


def test_a_megatron_deepspeed_run_of_its_era():
    """BLOOM-176B as a row would state it (bigscience-workshop/bigscience train/tr11-176B-ml
    README at 00327f8c: 384 A100 80GB, tp 4, pp 12, micro-batch 2, global batch 2048, bf16 with
    BF16_Optimizer, --checkpoint-activations, DeepSpeed's pipeline engine): BLOOM's tokenizer
    (250,680 padded to 250,880) gives ALiBi and the rest; the engine's sends scatter-gathered."""
    row = dict(_GPT_2P7B, gpu="A100", gpus=384, tp=4, pp=12, dp=8, micro_batch=2,
               global_batch=2048, seq_len=2048, dtype="bf16", layers=70, hidden=14336, heads=112,
               kv_heads=112, ffn_hidden=57344, vocab=250880, gated_mlp=False,
               tied_embeddings=True, hardware_note="A100 80GB",
               features="bf16; DeepSpeed pipeline, BF16 optimizer, activation checkpointing, "
                        "unfused attention")
    model, plan, missing = B.plan_of(row)
    assert (model["position_embedding"], model["bias"], missing) == ("alibi", True, [])
    assert (plan["schedule"], plan["pp_scatter_gather"], plan["zero"], plan["recompute"],
            plan["flash_attention"]) == ("1f1b", True, 1, "full", False)
    # the same with sequence parallelism, or tp 1: nothing to scatter
    assert "pp_scatter_gather" not in B.plan_of(dict(row, features="bf16; SP, scatter-gather"))[1]
    assert "pp_scatter_gather" not in B.plan_of(dict(row, tp=1, dp=32,
                                                     features="bf16; scatter-gather"))[1]
    assert B.plan_of(dict(row, features="bf16; ALiBi"))[0]["position_embedding"] == "alibi"


# Narayanan et al. SC21 (arXiv 2104.04473) Table 1, GPT 7.5B: 128 DGX A100 80GB, tp 4, micro-batch
# 16, batch 512 (NVIDIA/Megatron-LM examples/sc21/run_table_1.sh and CONFIG.sh at de7dc40f88:
# --checkpoint-activations, --fp16; the README's vocab 51,200 and sequence 2048)
_SC21_7B5 = dict(_GPT_2P7B, source="megatron-sc21", hardware_note="DGX A100 (8 x A100 SXM4 80GB)",
                 gpus=128, tp=4, pp=1, dp=32, micro_batch=16, global_batch=512, layers=36,
                 hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, vocab=51200,
                 features="fp16; full activation recompute (uniform, 1 layer per checkpoint), "
                          "unfused attention")


def test_a_comma_inside_parentheses_does_not_split_a_feature():
    assert B._features("fp16; full activation recompute (uniform, 1 layer per checkpoint), "
                       "unfused attention [a, b]") == [
        "fp16", "full activation recompute (uniform, 1 layer per checkpoint)",
        "unfused attention [a, b]"]
    assert B._parenthetical("DeepSpeed pipeline parallelism (1F1B)") == (
        "DeepSpeed pipeline parallelism", ["1F1B"])
    assert B._parenthetical("SP") is None


def test_a_feature_is_read_without_its_parenthetical_and_the_parenthetical_too():
    """Regression: 'full activation recompute (uniform, 1 layer per checkpoint)' was split at its
    comma into two unknown pieces, and the SC21 7.5B run predicted without recompute (231 GiB,
    'does not fit', for a run that ran); 'DeepSpeed pipeline parallelism (1F1B)' was unknown."""
    from perfmodel import predict

    model, plan, missing = B.plan_of(_SC21_7B5)
    assert (plan["recompute"], plan["recompute_method"], plan["recompute_num_layers"],
            missing) == ("full", "uniform", 1, [])
    assert predict(TransformerSpec(**model), B.hardware_of(_SC21_7B5), plan).fits_in_memory
    # MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990, Sec. 2): DeepSpeed's pipeline engine
    mtnlg = dict(_SC21_7B5, source="mt-nlg", gpus=2240, tp=8, pp=35, dp=8, micro_batch=1,
                 global_batch=1920, layers=105, hidden=20480, heads=128, kv_heads=128,
                 ffn_hidden=81920, features="fp16; DeepSpeed pipeline parallelism (1F1B), "
                                            "activation checkpointing")
    _, plan, missing = B.plan_of(mtnlg)
    assert (plan["schedule"], plan["pp_scatter_gather"], missing) == ("1f1b", True, [])
    # a word of the parenthetical no reading knows is named where its feature only restates a
    # column (nothing for it to narrow); beside an option it could narrow, it refuses the row
    _, plan, missing = B.plan_of(dict(_SC21_7B5, features="fp16 (static loss scale 8192); "
                                                          "full recompute"))
    assert plan["recompute"] == "full" and missing == [
        "unknown feature 'static loss scale 8192' (in 'fp16 (static loss scale 8192)'; not "
        "mapped)"]
    with pytest.raises(ValueError, match="its parenthetical 'sometimes' is not read"):
        B.plan_of(dict(_SC21_7B5, features="full recompute (sometimes)"))


# BLOOM-176B (bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: TP 4, PP 12,
# DP 8, --bf16, ZERO_STAGE=0, which with bf16 runs DeepSpeed's BF16_Optimizer)
_BLOOM = dict(_GPT_2P7B, source="bloom", gpus=384, tp=4, pp=12, dp=8, micro_batch=2,
              global_batch=2048, dtype="bf16", layers=70, hidden=14336, heads=112, kv_heads=112,
              ffn_hidden=57344, vocab=250880, hardware_note="8 x A100 SXM4 80GB per node",
              features="bf16; BF16 optimizer, ZeRO stage 0, DeepSpeed pipeline engine, "
                       "checkpoint-activations, unfused attention")


@pytest.mark.parametrize("features", [
    "BF16 optimizer, ZeRO stage 0", "ZeRO stage 0, BF16 optimizer", "BF16_Optimizer, zero-stage 0",
    "ZeRO-1, BF16 optimizer"])
def test_the_order_of_features_does_not_matter(features):
    """Regression: 'BF16 optimizer' then 'ZeRO stage 0' gave zero 0 (the row refused), the other
    order zero 1. ZeRO stage 0 with bf16 is DeepSpeed's BF16_Optimizer, its own stage 1
    (perfmodel.configs.megatron_deepspeed)."""
    _, plan, missing = B.plan_of(dict(_BLOOM, features=f"bf16; {features}, unfused attention"))
    assert (plan["zero"], plan["bf16_optimizer"], missing) == (1, True, [])


@pytest.mark.parametrize("features, why", [
    ("BF16 optimizer, ZeRO-2", "features 'BF16 optimizer' and 'ZeRO-2' disagree: zero 1 against 2"),
    ("recompute none, full recompute", "'recompute none' and 'full recompute' disagree"),
    ("DeepSpeed pipeline, VP=2", "'DeepSpeed pipeline' and 'VP=2' disagree: schedule"),
])
def test_features_that_disagree_refuse_the_row(features, why):
    with pytest.raises(ValueError, match=why):
        B.plan_of(dict(_BLOOM, features=f"bf16; {features}"))


def test_a_plain_1f1b_is_the_interleaved_schedules_too():
    _, plan, _ = B.plan_of(dict(_BLOOM, layers=72, features="bf16; 1F1B, VP=2"))
    assert (plan["schedule"], plan["virtual_stages"]) == ("interleaved", 2)


@pytest.mark.parametrize("feature, stage", [
    ("ZeRO stage 1", 1), ("zero-stage 2", 2), ("--zero-stage=1", 1), ("ZeRO stage: 3", 3),
    ("zero_stage 0", 0), ("ZeRO-1", 1), ("DeepSpeed ZeRO stage 1", 1), ("ZeRO1", 1)])
def test_zero_as_its_stacks_word_it(feature, stage):
    assert B.generic_feature(feature) == {"zero": stage}


@pytest.mark.parametrize("feature, overlap", [
    ("torch DDP", True), ("PyTorch DDP", True), ("DDP-impl torch", True),
    ("--DDP-impl torch", True), ("local DDP", False), ("DDP-impl local", False),
    ("--DDP-impl=local", False)])
def test_megatrons_ddp_impl_is_its_gradient_overlap(feature, overlap):
    """Megatron-LM's --DDP-impl (perfmodel.configs.megatron): torch's DDP all-reduces during the
    backward (overlap_grad_sync), local after it; both were listed as unknown features."""
    _, plan, missing = B.plan_of(dict(_SC21_7B5, features=f"fp16; {feature}, full recompute"))
    assert (plan["overlap_grad_sync"], missing) == (overlap, [])


def test_torch_ddp_with_a_pipeline_or_beside_an_overlap_it_contradicts_is_refused():
    with pytest.raises(ValueError, match="torch DDP with pp 2"):
        B.plan_of(dict(_SC21_7B5, pp=2, dp=16, features="fp16; torch DDP"))
    with pytest.raises(ValueError, match="'local DDP' and 'overlap grad reduce' disagree"):
        B.plan_of(dict(_SC21_7B5, features="fp16; local DDP, overlap grad reduce"))
    with pytest.raises(ValueError, match="'DeepSpeed pipeline' and 'overlap grad reduce'"):
        B.plan_of(dict(_BLOOM, features="bf16; DeepSpeed pipeline, overlap grad reduce"))


# SC21 Table 1 (run_table_1.sh at de7dc40f88): GPT 76B, 60 layers on tp 8 x pp 4; GPT 310B, 96
# layers on pp 16; GPT 1T, 128 layers on pp 64
_SC21_76B = dict(_SC21_7B5, gpus=1024, tp=8, pp=4, dp=32, micro_batch=2, global_batch=1792,
                 layers=60, hidden=10240, heads=80, kv_heads=80, ffn_hidden=40960)


@pytest.mark.parametrize("feature, layers, pp, chunks", [
    ("interleaved schedule (5 layers per virtual stage)", 60, 4, 3),
    ("num-layers-per-virtual-pipeline-stage 3", 96, 16, 2),
    ("--num-layers-per-virtual-pipeline-stage=5", 60, 4, 3),
    ("VP=3", 60, 4, 3), ("virtual pipeline 3", 60, 4, 3), ("3 virtual stages", 60, 4, 3),
    ("--virtual-pipeline-model-parallel-size 3", 60, 4, 3),
    ("num-virtual-stages-per-pipeline-rank 3", 60, 4, 3),
    ("interleaved 1F1B, 5 layers per virtual stage", 60, 4, 3),
    ("15 layers per virtual stage", 60, 4, 1)])  # one chunk a rank: not interleaved
def test_interleaving_in_megatrons_words(feature, layers, pp, chunks):
    """Regression: Megatron's --num-layers-per-virtual-pipeline-stage and 'k layers per virtual
    stage' were unknown (the runs predicted without interleaving): virtual stages = layers /
    (pp k), as perfmodel.configs.megatron reads the flag."""
    row = dict(_SC21_76B, layers=layers, pp=pp, dp=1024 // (8 * pp),
               features=f"fp16; full recompute, {feature}")
    _, plan, missing = B.plan_of(row)
    assert (plan["schedule"], plan["virtual_stages"], missing) == (
        "interleaved" if chunks > 1 else "1f1b", chunks, [])


@pytest.mark.parametrize("features, why", [
    ("7 layers per virtual stage", "the layers .60. must split into pp .4. x whole chunks of 7"),
    ("VP=2, 5 layers per virtual stage", "are 3 virtual stages .* another feature says 2"),
    ("interleaved schedule", "the interleaved schedule .'interleaved schedule'. without its"),
    ("non-interleaved 1F1B, VP=3", "'non-interleaved 1F1B' and 'VP=3' disagree: schedule")])
def test_interleaving_that_does_not_add_up_is_refused(features, why):
    with pytest.raises(ValueError, match=why):
        B.plan_of(dict(_SC21_76B, features=f"fp16; {features}"))


def test_non_interleaved_1f1b_is_1f1b():
    _, plan, missing = B.plan_of(dict(_SC21_76B, features="fp16; non-interleaved 1F1B"))
    assert (plan["schedule"], plan.get("virtual_stages", 1), missing) == ("1f1b", 1, [])


def test_deepspeeds_stage_partition_gives_the_stages_layers():
    """Regression: BLOOM's '--pp-partition-method type:transformer|embedding' was unknown and
    its rows refused (70 layers over pp 12). DeepSpeed balances the transformer layers and the
    two embeddings (input, tied output) over the stages: 5 + 10 x 6 + 5
    (perfmodel.configs.megatron_deepspeed.stage_split)."""
    from perfmodel import predict

    row = dict(_BLOOM, features=_BLOOM["features"] + ", pp-partition-method "
                                                     "type:transformer|embedding")
    model, plan, missing = B.plan_of(row)
    assert (plan["first_stage_layers"], plan["last_stage_layers"], missing) == (5, 5, [])
    assert predict(TransformerSpec(**model), B.hardware_of(row), plan).step_time_s > 0
    # the same split as a pipeline_layout column: it agrees; another split is refused
    _, plan, _ = B.plan_of(dict(row, pipeline_layout="Ettttt|(tttttt|)*10tttttL"))
    assert "first_stage_layers" not in plan and plan["pipeline_layout"]
    with pytest.raises(ValueError, match=r"splits the layers \[5, 6, .* the pipeline_layout"):
        B.plan_of(dict(row, pipeline_layout="Etttttt|(tttttt|)*10ttttL"))
    with pytest.raises(ValueError, match="matches no layer"):
        B.plan_of(dict(_BLOOM, features="bf16; --pp-partition-method type:nothing"))


def test_a_pipeline_of_uneven_stages_not_stated_is_refused_not_guessed():
    """A row that does not state DeepSpeed's partition is not given its default's split."""
    from perfmodel import PerfmodelError, predict

    model, plan, _ = B.plan_of(_BLOOM)
    with pytest.raises(PerfmodelError, match=r"layers \(70\) must be divisible by pp"):
        predict(TransformerSpec(**model), B.hardware_of(_BLOOM), plan)


@pytest.mark.parametrize("feature, options", [
    # Megatron-LM's attention of 2021-22: its fused scale-mask-softmax between two GEMMs
    ("fused scale-mask-softmax", {"flash_attention": False}),
    ("no flashattention", {"flash_attention": False}),
    ("No Flash-Attention", {"flash_attention": False}),
    ("scatter-gather optimization", {"pp_scatter_gather": "where it applies"}),
    ("Scatter_Gather", {"pp_scatter_gather": "where it applies"}),
    ("Overlap-Grad-Reduce", {"overlap_grad_sync": True}),
    ("distributed fused adam optimizer", {"zero": 1, "dp_bucketing": "all"}),
    ("ZeRO-1 optimizer", {"zero": 1}),
    ("mixed precision", {}),
    # never a guess: an optimizer of a precision is not that precision, an unknown stays unknown
    ("fp32 optimizer", None), ("fp8 optimization", None), ("a new trick optimization", None)])
def test_features_are_matched_tolerantly_but_not_guessed(feature, options):
    assert B.generic_feature(feature) == options


def test_the_held_out_phrasings_are_read():
    """Regression: SC21's 'fused scale-mask-softmax (no FlashAttention)', 'unfused attention
    (fused softmax)', 'scatter-gather optimization', MT-NLG's '8-way tensor slicing', 'mixed
    precision', 'ZeRO-powered data parallelism' and BLOOM's 'ALiBi positions' were listed as
    unknown (and the attention taken for flash)."""
    model, plan, missing = B.plan_of(dict(
        _SC21_76B, features="fp16; checkpoint activations, fused scale-mask-softmax (no "
                            "FlashAttention), scatter-gather optimization, 8-way tensor slicing"))
    assert (plan["flash_attention"], plan["pp_scatter_gather"], missing) == (False, True, [])
    _, plan, missing = B.plan_of(dict(_SC21_76B, features="fp16; unfused attention (fused "
                                                          "softmax), full recompute"))
    assert (plan["flash_attention"], missing) == (False, [])
    # MT-NLG (arXiv 2201.11990): ZeRO beside DeepSpeed's pipeline engine, which refuses stages 2
    # and 3 (perfmodel.configs.megatron_deepspeed): stage 1
    mtnlg = dict(_SC21_76B, pp=35, dp=8, gpus=2240, layers=105,
                 features="mixed precision; 8-way tensor slicing, DeepSpeed pipeline parallelism "
                          "(1F1B), ZeRO-powered data parallelism, activation checkpointing")
    _, plan, missing = B.plan_of(mtnlg)
    assert (plan["zero"], plan["schedule"], missing) == (1, "1f1b", [])
    model, _, missing = B.plan_of(dict(_BLOOM, features="bf16; ALiBi positions, unfused "
                                                        "attention"))
    assert (model["position_embedding"], missing) == ("alibi", [])


@pytest.mark.parametrize("change, why", [
    (dict(features="fp16; 4-way tensor slicing"), "'4-way tensor slicing' says tp 4, the row's "
                                                  "tp column 8"),
    (dict(features="bf16 mixed precision; full recompute"), "says bf16, the row's dtype column "
                                                            "fp16"),
    (dict(features="fp16; ZeRO-powered data parallelism", pp=1, dp=128),
     "names no ZeRO stage"),
    (dict(features="fp16; ZeRO-powered data parallelism, ZeRO stage 0"), "disagree")])
def test_a_stated_setting_the_columns_contradict_is_refused(change, why):
    with pytest.raises(ValueError, match=why):
        B.plan_of(dict(_SC21_76B, **change))


def test_a_default_the_row_does_not_state_is_named_with_it(tmp_path):
    """Regression: MT-NLG's rows (no attention stated) were predicted with flash attention, the
    preset's default, without saying so; so were ZeRO 0, no recompute and a reduction after the
    backward where a row states none of them."""
    silent = dict(_SC21_76B, features="fp16; 8-way tensor slicing")
    stated = dict(_SC21_76B, features="fp16; full recompute, unfused attention, local DDP, "
                                      "ZeRO-0")
    pd.DataFrame([silent, stated]).to_csv(tmp_path / "published-steps.csv", index=False)
    silent_row, stated_row = B.published_rows(tmp_path)
    assert silent_row.not_modelled == [
        "assumed: attention not stated: flash (fa2, the preset's default kernel)",
        "assumed: recompute not stated: none (the plan's default)",
        "assumed: ZeRO not stated: 0, the optimizer states and gradients replicated over dp "
        "(the plan's default)",
        "assumed: gradient reduction not stated: after the backward, not overlapped (the "
        "plan's default)"]
    assert stated_row.not_modelled == []


@pytest.mark.parametrize("data", ["accuracy", "accuracy-nemo-2407", "accuracy-megatron-bridge",
                                  "accuracy-nemo-long-context", "accuracy-megatron-sc21"])
def test_the_repositorys_runs_state_what_their_plans_take(data):
    frame = pd.read_csv(ROOT / "tests/data" / data / "published-steps.csv")
    for row in frame.to_dict("records"):
        model, plan, _ = B.plan_of(row)
        assert B.assumed_defaults(model, plan, B.hardware_of(row)) == [], row["features"]


@pytest.mark.parametrize("gpu, note, preset", [
    ("A100", "DGX A100 (8 x A100 SXM4 80GB, NVLink3/NVSwitch, 8 x 200 Gb/s HDR InfiniBand)",
     "dgx-a100-80gb"),
    ("A100", "A100 40GB SXM", "dgx-a100-40gb"), ("A100-SXM4-40GB", "", "dgx-a100-40gb"),
    ("A100 80GB", "", "dgx-a100-80gb"),
    ("A100", "A100 SXM4 80GB behind PCIe Gen4 switches", "dgx-a100-80gb")])
def test_an_a100_is_its_dgx_preset_by_memory(gpu, note, preset):
    assert B.hardware_of(dict(gpu=gpu, hardware_note=note)) == preset


@pytest.mark.parametrize("gpu, note, why", [
    ("A100", "A100 PCIe 80GB", "the A100 PCIe card"),
    ("A100 PCIe 80GB", "", "the A100 PCIe card"), ("A100", "A100-PCIE-40GB", "the A100 PCIe card"),
    ("A100X", "", "gpu 'A100X' has no preset")])
def test_an_a100_no_preset_has_is_refused(gpu, note, why):
    """Regression: 'A100 PCIe 80GB' in a row's hardware note was predicted on the DGX A100 (SXM4,
    NVSwitch) as an H100 PCIe is not: a part no preset has is refused in its row."""
    with pytest.raises(ValueError, match=why):
        B.hardware_of(dict(gpu=gpu, hardware_note=note))


def test_a_network_other_than_the_presets_is_named_with_the_row(tmp_path):
    """Jean Zay's BLOOM nodes (bigscience tr11-176B-ml README: 8 x A100 SXM4 80GB, 4 x Omni-Path
    100 Gb/s; not DGX): predicted on the DGX A100's node and network, and the row says so."""
    note = ("Jean Zay gpu_p5 (8 x A100 SXM4 80GB per node, NVLink, 4 x Omni-Path 100 Gb/s "
            "inter-node; not a DGX)")
    row = dict(_BLOOM, hardware_note=note)
    assert B.hardware_of(row) == "dgx-a100-80gb"
    assert B.hardware_notes(row, "dgx-a100-80gb") == [
        "hardware note names Omni-Path, not a DGX: predicted on dgx-a100-80gb's node and network "
        "(200 GB/s per node between nodes; a spec file with base: dgx-a100-80gb can state this "
        "one)"]
    for data in ("accuracy", "accuracy-nemo-2407", "accuracy-megatron-bridge",
                 "accuracy-nemo-long-context"):
        frame = pd.read_csv(ROOT / "tests/data" / data / "published-steps.csv")
        assert not [r for r in frame.to_dict("records")
                    if B.hardware_notes(r, B.hardware_of(r))], data


def test_a_feature_known_not_to_be_modelled_says_what_it_leaves_out():
    _, _, missing = B.plan_of(dict(_BLOOM, features=_BLOOM["features"]
                                   + ", Embed-LayerNorm, CUDA_LAUNCH_BLOCKING=1"))
    assert [m.split(":")[0] for m in missing] == ["feature 'Embed-LayerNorm'",
                                                  "feature 'CUDA_LAUNCH_BLOCKING=1'"]
    assert missing[0].endswith("its 2 h parameters and its one norm a micro-batch (not modelled)")


@pytest.mark.parametrize("gpu, note, preset", [
    ("A100", "DGX A100 640GB", "dgx-a100-80gb"),  # NVIDIA's DGX A100 640GB: 8 x 80 GB
    ("A100", "DGX A100 320GB", "dgx-a100-40gb"),  # ... and 320GB: 8 x 40 GB
    ("A100", "DGX A100, NVSwitch, HDR InfiniBand NICs on PCIe Gen4", "dgx-a100-80gb"),
    ("A100", "DGX A100 80GB (PCIe Gen4 host interface)", "dgx-a100-80gb"),
    ("H100", "DGX H100, ConnectX-7 on PCIe Gen5", "dgx-h100"),
    ("H100", "H100 PCIe", "h100-pcie")])
def test_a_dgx_note_is_read_by_whole_sizes_and_its_pcie_links_are_not_the_card(gpu, note, preset):
    """Regression: '640GB' held '40GB' as a substring (the 40 GB preset), and a DGX note naming
    the PCIe links of its NICs was read as the PCIe card (refused, or h100-pcie)."""
    assert B.hardware_of(dict(gpu=gpu, hardware_note=note)) == preset


def test_an_a100s_memory_the_gpu_column_and_note_disagree_on_is_refused():
    with pytest.raises(ValueError, match="disagree on its memory"):
        B.hardware_of(dict(gpu="A100-SXM4-40GB", hardware_note="A100 SXM4 80GB"))


_FP8 = next(r for r in ROWS if r["dtype"] == "fp8")


@pytest.mark.parametrize("features", ["fp8; bf16, full recompute", "bf16; fp8, full recompute"])
def test_bf16_beside_fp8_is_the_fp8_runs_other_precision(features):
    """Regression: an FP8 run keeps bf16 for its other operations and weights (Transformer
    Engine's FP8 autocast inside bf16): 'fp8' and 'bf16' were refused as disagreeing."""
    _, plan, _ = B.plan_of(dict(_FP8, features=features))
    assert plan["dtype"] == "fp8" and plan["recompute"] == "full"
    with pytest.raises(ValueError, match="'fp8' says fp8, the row's dtype column bf16"):
        B.plan_of(dict(ROWS[0], dtype="bf16", features="fp8; bf16"))


def test_a_disagreement_names_the_rows_columns_not_internal_keys():
    with pytest.raises(ValueError, match="disagree: dtype fp16 against bf16"):
        B.plan_of(dict(ROWS[0], features="fp16; bf16"))
    with pytest.raises(ValueError, match=r"disagree: tp \d+ against \d+"):
        B.plan_of(dict(ROWS[0], features=f"TP={ROWS[0]['tp']}, TP={ROWS[0]['tp'] + 1}"))


def test_a_thousands_separator_does_not_split_a_feature():
    """Regression: '1,024-way data parallelism' split into '1' and '024-way ...' (dp 24)."""
    r = ROWS[0]
    row = dict(r, dp=1024, gpus=1024 * r["tp"] * r["pp"], global_batch=1024 * r["micro_batch"],
               features="bf16, 1,024-way data parallelism, DP=1,024")
    assert B.plan_of(row)[1]["dp"] == 1024
    assert B._features("bf16, x (1,024 GPUs), TP=2,PP=4") == ["bf16", "x (1,024 GPUs)", "TP=2",
                                                              "PP=4"]


_PIPELINED = next(r for r in ROWS if r["pp"] > 1 and r["layers"] % (r["pp"] * 3) == 0)


def test_a_parentheticals_pieces_are_features_of_their_own():
    """Regression: a parenthetical's pieces were merged under the whole feature's name, so
    '1F1B (interleaved)' disagreed with itself, and 'N layers per checkpoint' set the uniform
    method over the parenthetical's 'block'."""
    _, plan, _ = B.plan_of(dict(_PIPELINED, features="bf16, 1F1B (interleaved), VP=3"))
    assert (plan["schedule"], plan["virtual_stages"]) == ("interleaved", 3)
    _, plan, _ = B.plan_of(dict(_PIPELINED,
                                features="bf16, full recompute (block, 2 layers per checkpoint)"))
    assert (plan["recompute"], plan["recompute_method"], plan["recompute_num_layers"]) == \
        ("full", "block", 2)
    _, plan, _ = B.plan_of(dict(_PIPELINED, features="bf16, 2 layers per checkpoint"))
    assert "recompute_method" not in plan and plan["recompute_num_layers"] == 2  # uniform


def test_one_chunk_per_stage_disagrees_with_a_stated_interleaving():
    """Regression: 'interleaved schedule, k layers per virtual stage' of one chunk was run as
    1F1B, silently."""
    per = _PIPELINED["layers"] // _PIPELINED["pp"]
    with pytest.raises(ValueError, match="disagree: the interleaved schedule, but"):
        B.plan_of(dict(_PIPELINED, features=f"bf16, interleaved schedule, {per} layers per "
                                            "virtual stage"))


@pytest.mark.parametrize("features", [
    "bf16, ZeRO-powered data parallelism, ZeRO-2, DeepSpeed pipeline",
    "bf16, DeepSpeed pipeline, ZeRO-3"])
def test_deepspeeds_pipeline_with_zero_2_or_3_is_refused(features):
    with pytest.raises(ValueError, match="refuses ZeRO stages 2 and 3"):
        B.plan_of(dict(_PIPELINED, features=features))


def test_a_feature_does_not_override_a_column():
    with pytest.raises(ValueError, match="'ep_dispatcher column' and 'deepep' disagree"):
        B.plan_of(dict(ROWS[0], ep_dispatcher="alltoall", features="bf16, deepep"))


def test_an_unbalanced_parenthesis_is_refused_naming_its_feature():
    """Regression: an unclosed '(' swallowed the features after it (read as not modelled)."""
    with pytest.raises(ValueError, match="'unfused attention \\(fused softmax, full recompute': "
                                         "unbalanced"):
        B.plan_of(dict(ROWS[0], features="bf16, unfused attention (fused softmax, full recompute"))


def test_a_parenthetical_that_reverses_its_feature_is_refused():
    """Regression: 'flash attention (disabled)' ran flash attention, 'activation checkpointing
    (selective)' full recompute."""
    with pytest.raises(ValueError, match="'flash attention \\(disabled\\)': its parenthetical"):
        B.plan_of(dict(ROWS[0], features="bf16, flash attention (disabled)"))
    with pytest.raises(ValueError, match="disagree: recompute full against selective"):
        B.plan_of(dict(ROWS[0], features="bf16, activation checkpointing (selective)"))
