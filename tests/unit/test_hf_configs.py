"""Hugging Face config.json files read faithfully (issue 14, item 2).

tests/data/hf/*/config.json are the published configs of each model, written out with the fields
that matter (sizes, grouping, head_dim, biases, tying, windows) and a few that do not (rope,
norm epsilon, dtype), as their Hugging Face repositories give them. Each parameter count is
checked against the count its publisher gives, within 0.5%.
"""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, SpecError, load_model, predict
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.predict import gemm_shapes, parameter_count
from perfmodel.specs.model import model_from_hf_config
from tests.conftest import ROOT

HF = ROOT / "tests/data/hf"

# (config directory, published total parameters, where it is published)
PUBLISHED = [
    ("llama-2-7b", 6.74e9,
     "huggingface.co/meta-llama/Llama-2-7b-hf, model page: 'Model size 6.74B params'"),
    ("meta-llama-3-8b", 8.03e9,
     "huggingface.co/meta-llama/Meta-Llama-3-8B, model page: 'Model size 8.03B params'"),
    ("llama-3.1-8b", 8.03e9,
     "huggingface.co/meta-llama/Llama-3.1-8B, model page: 'Model size 8.03B params'"),
    ("llama-3.1-70b", 70.6e9,
     "huggingface.co/meta-llama/Llama-3.1-70B, model page: 'Model size 70.6B params'"),
    ("mistral-7b-v0.1", 7.24e9,
     "huggingface.co/mistralai/Mistral-7B-v0.1, model page: 'Model size 7.24B params' "
     "(Mistral AI's announcement rounds it to 7.3B)"),
    ("mistral-nemo-base-2407", 12.2e9,
     "huggingface.co/mistralai/Mistral-Nemo-Base-2407, model page: 'Model size 12.2B params'"),
    ("qwen2.5-7b", 7.61e9,
     "huggingface.co/Qwen/Qwen2.5-7B, model card: 'Number of Parameters: 7.61B'"),
    ("qwen3-8b", 8.2e9,
     "huggingface.co/Qwen/Qwen3-8B, model card: 'Number of Parameters: 8.2B'"),
    ("gpt2", 124e6,
     "huggingface.co/openai-community/gpt2, model card: 'the smallest version of GPT-2, with "
     "124M parameters' (github.com/openai/gpt-2: the 124M model)"),
    ("pythia-160m", 162_322_944,
     "huggingface.co/EleutherAI/pythia-160m, model card (and github.com/EleutherAI/pythia, "
     "models table): 162,322,944 total parameters"),
    # the word embeddings' LayerNorm (2 h = 28,672) is not counted (perfmodel.specs.model)
    ("bloom", 176_247_271_424,
     "huggingface.co/bigscience/bloom, model card: 'Number of parameters: 176,247,271,424'"),
    # Gemma Team 2024 (arXiv 2403.08295), Table 2: embedding 786,825,216 (a 256,128-row table;
    # the config's vocab_size is 256,000) + non-embedding 7,751,248,896; 2B: 524,550,144 +
    # 1,981,884,416
    ("gemma-7b", 786_825_216 + 7_751_248_896, "arXiv 2403.08295, Table 2 (Gemma 7B)"),
    ("gemma-2b", 524_550_144 + 1_981_884_416, "arXiv 2403.08295, Table 2 (Gemma 2B)"),
]

# (config directory, published non-embedding parameters (without the embedding and output
# layer), where); Qwen's model cards give both counts
NON_EMBEDDING = [
    ("qwen2.5-7b", 6.53e9,
     "huggingface.co/Qwen/Qwen2.5-7B, model card: 'Number of Paramaters (Non-Embedding): 6.53B'"),
    ("qwen3-8b", 6.95e9,
     "huggingface.co/Qwen/Qwen3-8B, model card: 'Number of Paramaters (Non-Embedding): 6.95B'"),
    ("qwen3-0.6b", 0.44e9,
     "huggingface.co/Qwen/Qwen3-0.6B, model card: 'Number of Paramaters (Non-Embedding): 0.44B'"),
    ("gemma-7b", 7_751_248_896, "arXiv 2403.08295, Table 2: 'Non-embedding Parameters'"),
    ("gemma-2b", 1_981_884_416, "arXiv 2403.08295, Table 2: 'Non-embedding Parameters'"),
]


def _model(name: str, seq_len: int = 1024):
    """A config at a training length (1024: GPT-2's learned position table is that long, and a
    learned table's parameters count as seq_len x hidden)."""
    return load_model(str(HF / name), seq_len=seq_len)


@pytest.mark.parametrize("name,published,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_counts_match_the_published_ones(name, published, source):
    assert parameter_count(_model(name), "dgx-h100") == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("name,published,source", NON_EMBEDDING, ids=[p[0] for p in NON_EMBEDDING])
def test_non_embedding_counts_match_the_published_ones(name, published, source):
    model = _model(name)
    embeddings = model.vocab * model.hidden * (1 if model.tied_embeddings else 2)
    ours = parameter_count(model, "dgx-h100") - embeddings
    assert ours == pytest.approx(published, rel=0.005), source


def test_qwen3_head_dim_sets_the_attention_width():
    """Qwen3-0.6B: 16 heads of 128 over a 1024-wide residual: its attention is 2048 wide. Read as
    hidden / heads (64) it had 508M parameters; its card says 0.6B (0.44B without embeddings)."""
    model = _model("qwen3-0.6b")
    assert (model.head_dim, model.attention_width, model.hidden) == (128, 2048, 1024)
    assert parameter_count(model, "dgx-h100") == pytest.approx(0.6e9, rel=0.01)  # card: "0.6B"
    shapes = {g["name"]: g for g in gemm_shapes(model, Plan(gpus=1))}
    assert shapes["qkv"]["n"] == 16 * 128 + 2 * 8 * 128 and shapes["qkv"]["k"] == 1024
    assert shapes["attention_output"]["k"] == 2048 and shapes["attention_output"]["n"] == 1024
    assert shapes["attention_scores"]["k"] == 128


def test_a_head_dim_equal_to_hidden_over_heads_changes_nothing():
    """Llama 3.1 8B's config may carry head_dim 128 (= 4096 / 32): the same model, the same
    numbers, whichever formulas (the universal ones with d, or the specialised with h/a)."""
    with_head_dim = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    with_head_dim["head_dim"] = 128
    from perfmodel.specs.model import model_from_hf_config

    explicit = model_from_hf_config(with_head_dim, "llama-3.1-8b", seq_len=8192)
    derived = _model("llama-3.1-8b", 8192)
    assert explicit == derived
    plan = Plan(gpus=8, tp=8, global_batch=8, micro_batch=1, dp=1)
    a, b = predict(explicit, "dgx-h100", plan), predict(derived, "dgx-h100", plan)
    assert a.step_time_s == b.step_time_s and a.memory_per_gpu_bytes == b.memory_per_gpu_bytes


@pytest.mark.parametrize("plan", [
    Plan(gpus=8, tp=8, global_batch=8),
    Plan(gpus=16, tp=4, pp=2, dp=2, global_batch=32, sequence_parallel=True, recompute="selective",
         zero=1),
    Plan(gpus=8, dp=8, global_batch=16, zero=3, flash_attention=True),
    Plan(gpus=16, tp=4, dp=4, micro_batch=4, global_batch=16, tp_layout="2d"),
], ids=["tp8", "tp4-pp2-sp", "zero3", "2d"])
def test_universal_and_specialised_formulas_agree_for_a_wide_attention(plan):
    """The universal family (the head size its own symbol d) and the plan's own fixed family
    (what explain prints) give the same numbers for a model whose attention is not hidden wide."""
    from perfmodel.specs.hardware import load_hardware

    model, hardware = _model("qwen3-0.6b", 4096), load_hardware("dgx-h100")
    plan = plan.check(model)
    values = values_of(model, hardware, plan)
    fixed = family_of(model, hardware, plan, specialise=True)
    assert fixed.free_head_dim
    ours = compile_family(family_of(model, hardware, plan))(values)
    theirs = compile_family(fixed)(values)
    for key in ("step_time", "q:parameters", "q:model_flops_per_step", "memory:first:weights",
                "memory:first:activations/layers"):
        assert float(ours[key]) == pytest.approx(float(theirs[key]), rel=1e-12), key


def test_a_config_has_no_training_sequence_length():
    """Never max_position_embeddings (131072 for Llama 3.1) silently: refused without one."""
    with pytest.raises(SpecError, match=r"has no training sequence length: give --seq-len \(its "
                                        r"max_position_embeddings is 131072\)"):
        load_model(str(HF / "llama-3.1-8b"))
    model = _model("llama-3.1-8b", 4096)
    assert model.seq_len == 4096 and model.seq_len_from == "the seq_len argument"
    assert "Hugging Face config" in model.origin


def test_mixture_of_experts_is_read_and_predicted_as_one_never_the_nearest_dense_family():
    """Mixtral is read as what it is (8 experts, top 2) and predicted as a mixture of experts
    (issue 17: perfmodel.step.moe), never as Mistral."""
    mixtral = _model("mixtral-8x7b-v0.1", 4096)
    assert (mixtral.experts, mixtral.top_k, mixtral.expert_ffn_hidden) == (8, 2, 14336)
    assert mixtral.moe_layers == tuple(range(32))
    result = predict(mixtral, "dgx-h100", Plan(gpus=8, dp=8, ep=8, global_batch=8))
    mistral = predict(_model("mistral-7b-v0.1", 4096), "dgx-h100",
                      Plan(gpus=8, dp=8, global_batch=8))
    # Mistral AI: 46.7B parameters, 12.9B active (mistral.ai/news/mixtral-of-experts)
    assert result.parameters == pytest.approx(46.7e9, rel=0.005)
    assert result.active_parameters == pytest.approx(12.9e9, rel=0.005)
    assert result.step_time_s > mistral.step_time_s  # two experts per token, and their exchange
    assert result.breakdown_s["comm/ep"] > 0
    # experts in a family perfmodel reads as dense are refused on import
    cfg = json.loads((HF / "meta-llama-3-8b" / "config.json").read_text())
    from perfmodel.specs.model import model_from_hf_config

    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        with pytest.raises(SpecError, match=f"mixture-of-experts model of a family perfmodel "
                                            f"does not read \\({key}: 4\\)"):
            model_from_hf_config({**cfg, key: 4}, "m", seq_len=2048)
    # a MoE family's config without its experts is missing a field, not a dense model
    with pytest.raises(SpecError, match="qwen3_moe\\) is missing 'num_experts'"):
        model_from_hf_config({**cfg, "model_type": "qwen3_moe"}, "m", seq_len=2048)


def test_sliding_window_is_read_and_costed_when_shorter_than_the_sequence():
    """Mistral 7B v0.1 attends over a 4096-token window: at 4096 tokens that is full attention;
    at 8192 every query attends min(i + 1, 4096) keys, 3/4 of the causal s^2 / 2 pairs
    (perfmodel.costs.compute.windowed_pairs), and the prediction counts them."""
    short = _model("mistral-7b-v0.1", 4096)
    assert short.sliding_window == 4096 and short.windowed_share == 0 and short.uncosted() == []
    assert predict(short, "dgx-h100", Plan(gpus=8, tp=8, global_batch=8)).step_time_s > 0
    long = _model("mistral-7b-v0.1", 8192)
    assert (long.sliding_window, long.full_attention_every) == (4096, 0)
    assert long.windowed_share == 1 and long.uncosted() == []
    plan = Plan(gpus=8, tp=8, global_batch=8, flash_attention=True)
    windowed = predict(long, "dgx-h100", plan)
    full = predict(long.replace(sliding_window=None), "dgx-h100", plan)
    # by hand: 4096 x 8192 - 4096 x 4095 / 2 = 25,167,872 pairs against 8192^2 / 2 = 33,554,432,
    # 4 a d FLOPs each (a = 32 heads of d = 128), x 3 (forward, backward), 32 layers, 8 sequences
    saved = 3 * 8 * 32 * 4 * 32 * 128 * (33_554_432 - 25_167_872)
    assert full.model_flops_per_step - windowed.model_flops_per_step == pytest.approx(saved)
    assert windowed.step_time_s < full.step_time_s
    # qwen2's window only counts with use_sliding_window, and then from max_window_layers on
    cfg = json.loads((HF / "qwen2.5-7b" / "config.json").read_text())
    from perfmodel.specs.model import model_from_hf_config

    assert model_from_hf_config(cfg, "q", seq_len=200_000).sliding_window is None
    on = {**cfg, "use_sliding_window": True, "sliding_window": 4096}
    assert model_from_hf_config(on, "q", seq_len=8192).sliding_window is None  # 28 of 28 full
    every = model_from_hf_config({**on, "max_window_layers": 0}, "q", seq_len=8192)
    assert (every.sliding_window, every.windowed_layers) == (4096, tuple(range(28)))
    with pytest.raises(SpecError, match=r"layer_types puts full attention in layers \[0, 1, 2"):
        model_from_hf_config({**on, "max_window_layers": 14}, "q", seq_len=8192)
    with pytest.raises(SpecError, match="alternates sliding-window and global attention"):
        model_from_hf_config({**cfg, "model_type": "gemma2"}, "g", seq_len=8192)


def test_a_windowed_models_whole_attention_count_says_why_it_passes_the_peak(run_cli):
    # Mistral 7B at 32,768 tokens: torchtitan's count (s^2 in every layer) holds 8.5 times the
    # scores its 4,096-token windows compute, and its MFU passes 100%; the line says why
    out = run_cli("predict", "--model", "mistral-7b", "--hardware", "dgx-a100-80gb", "--dp", "4",
                  "--seq-len", "32768", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["mfu_full_attention"] > 1
    text = run_cli("predict", "--model", "mistral-7b", "--hardware", "dgx-a100-80gb", "--dp",
                   "4", "--seq-len", "32768").stdout
    assert "with attention whole, the windows' skipped scores counted)" in text
    short = run_cli("predict", "--model", "mistral-7b", "--hardware", "dgx-a100-80gb", "--dp",
                    "4").stdout  # 8,192 tokens: under the peak, nothing to say
    assert "with attention whole)" in short and "skipped scores" not in short


def test_biases_and_tying_are_read():
    from perfmodel.specs.model import model_from_hf_config

    qwen = _model("qwen2.5-7b")
    assert qwen.qkv_bias and not qwen.bias and not qwen.tied_embeddings
    assert _model("qwen3-0.6b").tied_embeddings and not _model("qwen3-0.6b").qkv_bias
    pythia = _model("pythia-160m")
    assert pythia.bias and pythia.qkv_bias and pythia.norm == "layernorm"
    cfg = json.loads((HF / "meta-llama-3-8b" / "config.json").read_text())
    both = model_from_hf_config({**cfg, "attention_bias": True, "mlp_bias": True}, "m", 2048)
    assert both.bias and both.qkv_bias
    with pytest.raises(SpecError, match="attention_bias true with mlp_bias false"):
        model_from_hf_config({**cfg, "attention_bias": True}, "m", seq_len=2048)
    with pytest.raises(SpecError, match="longer than the learned position table"):
        _model("gpt2", 2048)


def test_predict_header_names_source_parameters_and_sequence_length(run_cli):
    args = ("--model", str(HF / "qwen3-0.6b"), "--hardware", "dgx-h100", "--seq-len", "4096")
    out = run_cli("predict", *args)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert "qwen3-0.6b/config.json (Hugging Face config)" in first
    assert "596.0M parameters" in first and "sequence length 4096 (from --seq-len)" in first
    data = json.loads(run_cli("predict", *args, "--json").stdout)
    assert data["parameters"] == pytest.approx(596e6, rel=0.001)
    assert data["seq_len"] == 4096 and data["seq_len_from"] == "--seq-len"
    refused = run_cli("predict", *args[:4])
    assert refused.returncode == 3 and "give --seq-len" in refused.stderr


# --- mixture-of-experts, MLA and windowed families (issue 17) --------------------------------
# tests/data/hf/*/config.json of these models are the published config.json values, read from
# copies in public repositories where the Hugging Face file itself was not at hand:
# - mixtral-8x22b-v0.1: huggingface.co/mistralai/Mixtral-8x22B-v0.1 config.json (hidden 6144,
#   56 layers, 48 heads, 8 kv heads, 16384, 8 experts top 2; vocab 32000 as the base model's,
#   mistral-community/Mixtral-8x22B-v0.1 and Cerebras modelzoo's mixtral 8x22B config)
# - qwen1.5-moe-a2.7b: huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json (as vendored in public
#   planners' fixtures: 60 experts of 1408, top 4, shared expert 5632)
# - qwen3-30b-a3b, qwen3-32b: the Qwen/Qwen3-30B-A3B and Qwen/Qwen3-32B config.json files as
#   collected whole in a public repository (find_string "moe_intermediate_size": 768)
# - qwen3-235b-a22b: Qwen/Qwen3-235B-A22B config.json (a public repository's hard-coded copy)
# - deepseek-v3: deepseek-ai/DeepSeek-V3 config.json (fields of DeepSeek-R1's identical
#   config.json copied in a public repository), checked against github.com/deepseek-ai/DeepSeek-V3
#   inference/configs/config_671B.json (dim 7168, inter_dim 18432, moe_inter_dim 2048, 61 layers,
#   3 dense, 128 heads, 256 routed + 1 shared, 8 activated, q_lora_rank 1536, kv_lora_rank 512,
#   qk_nope 128, qk_rope 64, v 128, vocab 129280)
# - deepseek-v2.5: deepseek-ai/DeepSeek-V2.5 config.json (a public repository's copy)
# - gpt-oss-120b: huggingface.co/openai/gpt-oss-120b/raw/main/config.json (a public test's copy,
#   read 2026-10-02); gpt-oss-20b: the same with 24 layers and 32 experts (its model card, Table 1;
#   github.com/openai/gpt-oss gpt_oss/torch/model.py builds both from these fields)
from perfmodel.params import parameter_counts  # noqa: E402

# (config, published total, published active, whether the card's active count leaves out the
# input embedding table, where). A card that counts the embedding table in its active parameters
# (Mistral AI, Qwen) is compared with ours; one that leaves it out (OpenAI: 5.13B = attention + 4
# experts + router + unembedding, its Table 1 sums; DeepSeek: README_WEIGHTS.md's 36.7B, which its
# own 671B and 0.9B embedding sum to only without it) with ours less the table.
MOE_PUBLISHED = [
    ("mixtral-8x7b-v0.1", 46.7e9, 12.9e9, False,
     "mistral.ai/news/mixtral-of-experts: 'Mixtral has 46.7B total parameters but only uses "
     "12.9B parameters per token'"),
    ("mixtral-8x22b-v0.1", 141e9, 39e9, False,
     "mistral.ai/news/mixtral-8x22b: 'using only 39B active parameters out of 141B'"),
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, False,
     "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B, model card: '14.3B parameters in total and 2.7B "
     "activated parameters during runtime'"),
    ("deepseek-v3", 671e9, 36.7e9, True,
     "github.com/deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: main model 'Total parameters: 671B', "
     "'Activation parameters: 36.7B'"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, True,
     "gpt-oss-120b & gpt-oss-20b Model Card (OpenAI 2025), Table 1: 116.83B total, 5.13B active"),
    ("gpt-oss-20b", 20.91e9, 3.61e9, True,
     "gpt-oss-120b & gpt-oss-20b Model Card (OpenAI 2025), Table 1: 20.91B total, 3.61B active"),
]
# (config, published total, published non-embedding (without embedding and output layer), where)
MOE_TOTALS = [
    ("qwen3-30b-a3b", 30.5e9, 29.9e9,
     "huggingface.co/Qwen/Qwen3-30B-A3B, model card: 'Number of Parameters: 30.5B in total and "
     "3.3B activated', 'Number of Paramaters (Non-Embedding): 29.9B'"),
    ("qwen3-235b-a22b", 235e9, 234e9,
     "huggingface.co/Qwen/Qwen3-235B-A22B, model card: '235B in total and 22B activated', "
     "'(Non-Embedding): 234B'"),
    ("qwen3-32b", 32.8e9, 31.2e9,
     "huggingface.co/Qwen/Qwen3-32B, model card: 'Number of Parameters: 32.8B', "
     "'(Non-Embedding): 31.2B'"),
    ("deepseek-v2.5", 236e9, None,
     "github.com/deepseek-ai/DeepSeek-V3 README, Table: DeepSeek-V2 '# Total Params 236B' "
     "(DeepSeek-V2.5 has DeepSeek-V2's architecture)"),
]


@pytest.mark.parametrize("name,total,active,no_embedding,source", MOE_PUBLISHED,
                         ids=[p[0] for p in MOE_PUBLISHED])
def test_moe_total_and_active_parameters_match_the_published_ones(name, total, active,
                                                                  no_embedding, source):
    counts = parameter_counts(_model(name, 4096))
    assert counts.total == pytest.approx(total, rel=0.005), source
    # reported as the card counts: the importer knows each family's convention
    assert counts.active_count == ("no_embedding" if no_embedding else "all"), source
    assert counts.reported == pytest.approx(active, rel=0.005), source
    assert counts.reported == counts.active - (counts.embedding if no_embedding else 0)


@pytest.mark.parametrize("name,total,non_embedding,source", MOE_TOTALS,
                         ids=[p[0] for p in MOE_TOTALS])
def test_moe_totals_match_the_published_ones(name, total, non_embedding, source):
    model = _model(name, 4096)
    counts = parameter_counts(model)
    assert counts.total == pytest.approx(total, rel=0.005), source
    if non_embedding is not None:
        embeddings = model.vocab * model.hidden * (1 if model.tied_embeddings else 2)
        assert counts.total - embeddings == pytest.approx(non_embedding, rel=0.005), source


def test_two_digit_active_counts_agree_to_their_digits():
    """Cards that round the active count to two digits: Qwen3-235B-A22B '22B activated' (ours
    22.19B), DeepSeek-V2 '21B activated' (github.com/deepseek-ai/DeepSeek-V3 README table; ours
    21.38B). Qwen3-30B-A3B's '3.3B activated' is 1.6% under ours (3.353B, the embedding table
    counted as Qwen counts it for Qwen1.5-MoE-A2.7B's 2.7B; without it 3.04B): no convention
    reaches it, and its total and non-embedding counts agree within 0.1%."""
    assert round(parameter_counts(_model("qwen3-235b-a22b")).active / 1e9) == 22
    assert round(parameter_counts(_model("deepseek-v2.5")).active / 1e9) == 21
    assert parameter_counts(_model("qwen3-30b-a3b")).active == pytest.approx(3.353e9, rel=1e-3)


def test_deepseek_v3_mtp_module_is_counted_apart():
    """The main model is the published 671B; the multi-token-prediction module (a MoE layer, a
    2h x h projection, three norms: enorm, hnorm and shared_head.norm in the checkpoint) shares
    its embedding and output layer. The Hugging Face checkpoint keeps its own copies of both:
    685B in all (README: 'The total size of DeepSeek-V3 models on Hugging Face is 685B, which
    includes 671B of the Main Model weights and 14B of the Multi-Token Prediction (MTP) Module
    weights')."""
    model = _model("deepseek-v3", 4096)
    assert model.mtp_layers == 1 and model.kv_lora_rank == 512 and model.q_lora_rank == 1536
    assert (model.moe_first_dense, model.moe_layer_count, model.shared_experts) == (3, 58, 1)
    counts = parameter_counts(model)
    moe_layer = 11_507_286_016  # one MoE layer of DeepSeek-V3: its terms below
    attention = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512
                 + 512 * 128 * 256 + 128 * 128 * 7168)
    assert moe_layer == attention + 257 * 3 * 7168 * 2048 + 7168 * 256 + 2 * 7168
    assert counts.mtp == moe_layer + 2 * 7168 * 7168 + 3 * 7168
    hf_copies = 2 * 129280 * 7168  # the MTP module's embed_tokens and shared_head in the checkpoint
    assert counts.total + counts.mtp + hf_copies == pytest.approx(685e9, rel=0.005)


def test_gpt_oss_windows_sinks_and_biases_are_read():
    model = _model("gpt-oss-120b", 4096)
    assert (model.sliding_window, model.full_attention_every) == (128, 2)
    assert model.windowed_layers == tuple(range(0, 36, 2))  # even layers banded, odd full
    assert model.attention_sinks and model.bias and model.qkv_bias
    assert (model.experts, model.top_k, model.expert_ffn_hidden, model.head_dim) == (128, 4, 2880,
                                                                                       64)
    # Table 1 of the model card: attention 0.96B, MLP 114.71B, embed + unembed 1.16B
    from perfmodel.params import attention_parameters, moe_ffn_parameters

    assert 36 * attention_parameters(model) == pytest.approx(0.96e9, rel=0.005)
    assert 36 * moe_ffn_parameters(model) == pytest.approx(114.71e9, rel=0.005)
    assert 2 * model.vocab * model.hidden == pytest.approx(1.16e9, rel=0.005)


def test_qwen2_moe_shared_expert_and_dense_layers_are_read():
    model = _model("qwen1.5-moe-a2.7b")
    assert (model.experts, model.top_k, model.expert_ffn_hidden) == (60, 4, 1408)
    assert (model.shared_experts, model.shared_expert_ffn_hidden) == (1, 5632)
    assert model.qkv_bias and not model.bias and model.moe_dense_layers == ()
    from perfmodel.specs.model import model_from_hf_config

    cfg = json.loads((HF / "qwen1.5-moe-a2.7b" / "config.json").read_text())
    # transformers' Qwen2MoeDecoderLayer: sparse when (i + 1) % decoder_sparse_step == 0 and i is
    # not in mlp_only_layers
    sparse = model_from_hf_config({**cfg, "decoder_sparse_step": 2, "mlp_only_layers": [5]}, "q",
                                  seq_len=2048)
    assert sparse.moe_layers == tuple(i for i in range(24) if (i + 1) % 2 == 0 and i != 5)


def test_counts_equal_the_step_models_for_every_config_and_preset():
    """perfmodel.params counts a model term for term as perfmodel.step does (the golden corpus'
    `parameters`): equal, not approximately; dense models, mixtures of experts, MLA (the MTP
    modules apart in both)."""
    from perfmodel import list_presets

    names = [str(p) for p in sorted(HF.iterdir())]
    sparse = 0
    for name in names + list_presets()["models"]:
        model = load_model(name, seq_len=1024) if name in names else load_model(name)
        if getattr(model, "kind", "") == "layers" or model.uncosted():
            continue
        counts = parameter_counts(model)
        assert (counts.active == counts.total) == (not model.experts), name
        sparse += bool(model.experts)
        assert counts.total == pytest.approx(parameter_count(model, "dgx-h100"), rel=1e-12), name
    assert sparse >= 4  # mixtral, qwen3-moe, deepseek-v3 presets and configs


def test_olmoe_is_read_with_its_published_counts():
    """OLMoE-1B-7B (tests/data/hf/olmoe-1b-7b-0924/config.json: allenai/OLMoE-1B-7B-0924's
    config.json fields as public repositories' fixtures copy them): every layer MoE, 64 SwiGLU
    experts of 1024, top 8, no shared expert, untied. Muennighoff et al. 2024 (OLMoE, arXiv
    2409.02060), Table 1: 6.9B total parameters, 1.3B active (two digits: ours 6.919B and
    1.282B, the embedding tables counted in both, as the paper's 1B-7B name rounds them)."""
    model = _model("olmoe-1b-7b-0924", 4096)
    assert (model.experts, model.top_k, model.expert_ffn_hidden, model.shared_experts) == \
        (64, 8, 1024, 0)
    assert model.moe_layers == tuple(range(16)) and not model.bias and not model.qkv_bias
    counts = parameter_counts(model)
    assert round(counts.total / 1e8) / 10 == 6.9 and round(counts.active / 1e8) / 10 == 1.3
    # by hand: 16 layers of q, k, v, o (4 h^2), 64 experts of 3 h f, a router (64 h), two norms,
    # and the two 50304 x h tables and the final norm
    h, f = 2048, 1024
    assert counts.total == 16 * (4 * h * h + 64 * 3 * h * f + 64 * h + 2 * h) \
        + 2 * 50304 * h + h


def test_kimi_k2_is_read_as_deepseek_v3():
    """Kimi K2 (tests/data/hf/kimi-k2-instruct/config.json: moonshotai/Kimi-K2-Instruct's
    config.json fields as public repositories copy them: 61 layers, 1 dense, 384 routed experts
    of 2048 and 1 shared, top 8, 64 MLA heads, vocab 163840). Moonshot AI's deployment guide:
    K2 reuses DeepSeek-V3's architecture, model_type kimi_k2 only tells engines apart. Its model
    card: 1T total parameters, 32B activated (ours 1.026T, and 31.7B without the input
    embedding table, DeepSeek's convention)."""
    model = _model("kimi-k2-instruct", 4096)
    assert (model.experts, model.top_k, model.shared_experts, model.moe_first_dense,
            model.kv_lora_rank) == (384, 8, 1, 1, 512)
    counts = parameter_counts(model)
    assert round(counts.total / 1e12) == 1
    assert round((counts.active - counts.embedding) / 1e9) == 32
    bad = json.loads((HF / "kimi-k2-instruct" / "config.json").read_text())
    bad["architectures"] = ["KimiForCausalLM"]
    with pytest.raises(SpecError, match="reads it as deepseek_v3"):
        model_from_hf_config(bad, "kimi.json", 4096)


def test_bloom_is_alibi_with_biases_and_a_tied_output():
    # transformers' modeling_bloom: n_layer, n_head, hidden 4 h GeLU MLP, biases, LayerNorm,
    # ALiBi (no position table, no RoPE kernels), tied output (tie_word_embeddings default)
    bloom = _model("bloom", seq_len=2048)
    assert (bloom.layers, bloom.heads, bloom.ffn_hidden) == (70, 112, 4 * 14336)
    assert (bloom.position_embedding, bloom.bias, bloom.qkv_bias, bloom.norm,
            bloom.tied_embeddings) == ("alibi", True, True, "layernorm", True)
    plan = Plan(gpus=384, tp=4, pp=12, dp=8, micro_batch=2, global_batch=2048,
                recompute="full", zero=1, first_stage_layers=5, last_stage_layers=5)
    alibi = predict(bloom, "dgx-a100-80gb", plan)
    rotary = predict(bloom.replace(position_embedding="rotary"), "dgx-a100-80gb", plan)
    learned = predict(bloom.replace(position_embedding="learned"), "dgx-a100-80gb", plan)
    # RoPE's kernels cost time; a learned table costs s x h parameters; ALiBi neither
    assert alibi.step_time_s < rotary.step_time_s
    assert learned.parameters - alibi.parameters == 2048 * 14336


def test_gpt_neox_rotary_pct_is_read():
    """GPT-NeoX rotates rotary_pct of each head (transformers 5's GPTNeoXAttention: rotary_ndims
    = int(head_size x partial_rotary_factor), rotary_pct in older configs; GPTNeoXConfig sets
    0.25 where a config says neither). Before, Pythia's 0.25 was ignored and its RoPE costed on
    whole heads: op by op 20 bytes per element of q and k each way where it moves 5 + 4 forward
    and 5 + 14 backward (perfmodel.costs.compute.rope_split_bytes)."""
    pythia = _model("pythia-160m", 2048)
    assert pythia.rotary_fraction == 0.25 and pythia.position_embedding == "rotary"
    cfg = json.loads((HF / "pythia-160m" / "config.json").read_text())
    # transformers 5 saves it in rope_parameters, which GPTNeoXConfig reads first
    saved = {k: v for k, v in cfg.items() if k != "rotary_pct"}
    saved["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000,
                                "partial_rotary_factor": 0.5}
    assert model_from_hf_config(saved, "pythia", 2048).rotary_fraction == 0.5
    with pytest.raises(SpecError, match="is missing 'rotary_pct', which its configuration class "
                                        "sets to 0.25: give it"):
        model_from_hf_config({k: v for k, v in cfg.items() if k != "rotary_pct"}, "pythia", 2048)
    with pytest.raises(SpecError, match="rotary_pct must be > 0 and <= 1"):
        model_from_hf_config({**cfg, "rotary_pct": 1.5}, "pythia", 2048)
    plan = Plan(gpus=1, global_batch=8, micro_batch=8, kernels="eager")
    assert predict(pythia, "dgx-h100", plan).step_time_s != predict(
        pythia.replace(rotary_fraction=1), "dgx-h100", plan).step_time_s


def test_partial_rotary_factor_is_not_read_where_the_modelling_code_rotates_whole_heads():
    """transformers 5's Llama (and Mistral, Qwen, Gemma, ...) rotary embedding takes the head's
    width and apply_rotary_pos_emb multiplies whole heads: a partial_rotary_factor in such a
    config changes nothing they build."""
    cfg = json.loads((HF / "llama-3.1-8b" / "config.json").read_text())
    assert model_from_hf_config({**cfg, "partial_rotary_factor": 0.5}, "llama", 8192) == \
        model_from_hf_config(cfg, "llama", 8192)


@pytest.mark.parametrize("name,fused", [("gpt2", True), ("pythia-160m", True), ("bloom", True),
                                        ("llama-3.1-8b", False), ("qwen2.5-7b", False),
                                        ("gemma-2b", False), ("mixtral-8x7b-v0.1", False),
                                        ("gpt-oss-20b", False)])
def test_fused_qkv_is_the_modelling_codes(name, fused):
    """transformers' modelling code: GPT-2's c_attn (Conv1D of 3 n_embd), GPT-NeoX's and
    BLOOM's query_key_value project q, k and v in one layer; the Llama-style families
    (q_proj, k_proj, v_proj) in three. The validation job builds three whatever the model, and
    says so."""
    from validation.jobspec import job_model, job_model_note

    model = _model(name)
    assert model.fused_qkv is fused
    assert job_model(model).fused_qkv is False
    assert ("projects queries, keys and values in three layers" in job_model_note(model)) is fused
    # the eager backward: the attention input's two gradient sums (3 e T h each) against the
    # split's cat of the projection's output (2 e T (a + 2 kv) d): equal for multi-head GPT-2,
    # a third less for grouped-query Llama 3.1 8B (a 4,096 + 2 kv 1,024 wide against 3 x 4,096)
    plan = Plan(gpus=1, global_batch=8, micro_batch=8, kernels="eager")
    if name in ("gpt2", "llama-3.1-8b"):
        term = "compute/backward/elementwise"
        apart = predict(model.replace(fused_qkv=False), "dgx-h100", plan).breakdown_s[term]
        together = predict(model.replace(fused_qkv=True), "dgx-h100", plan).breakdown_s[term]
        if name == "gpt2":
            assert together == pytest.approx(apart, rel=1e-12)
        else:
            assert together < apart


def test_a_config_without_its_hub_name_is_named_after_its_directory_or_file(tmp_path):
    """The Hub's config.json files seldom give _name_or_path: two Mixtrals were both named by
    their model_type, 'mixtral' (a probe's finding, 2026-12-07)."""
    cfg = {k: v for k, v in json.loads((HF / "mixtral-8x7b-v0.1" / "config.json").read_text())
           .items() if k != "_name_or_path"}
    folder = tmp_path / "Mixtral-8x22B-v0.1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "my-mixtral.json").write_text(json.dumps(cfg))
    assert load_model(str(folder), seq_len=4096).name == "Mixtral-8x22B-v0.1"
    assert load_model(str(folder / "config.json"), seq_len=4096).name == "Mixtral-8x22B-v0.1"
    assert load_model(str(tmp_path / "my-mixtral.json"), seq_len=4096).name == "my-mixtral"
    named = {**cfg, "_name_or_path": "mistralai/Mixtral-8x7B-v0.1"}
    (folder / "config.json").write_text(json.dumps(named))
    assert load_model(str(folder), seq_len=4096).name == "mistralai/Mixtral-8x7B-v0.1"
