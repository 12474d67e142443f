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


def test_mixture_of_experts_is_refused_never_the_nearest_dense_family():
    with pytest.raises(SpecError) as err:
        _model("mixtral-8x7b-v0.1")
    message = str(err.value)
    assert "mixture-of-experts model (num_local_experts: 8)" in message
    assert "did you mean" not in message and "mistral'" not in message
    # experts in a family perfmodel reads are refused too
    cfg = json.loads((HF / "meta-llama-3-8b" / "config.json").read_text())
    from perfmodel.specs.model import model_from_hf_config

    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        with pytest.raises(SpecError, match=f"mixture-of-experts model \\({key}: 4\\)"):
            model_from_hf_config({**cfg, key: 4}, "m", seq_len=2048)
    with pytest.raises(SpecError, match="'qwen3_moe' is a mixture-of-experts model"):
        model_from_hf_config({**cfg, "model_type": "qwen3_moe"}, "m", seq_len=2048)


def test_sliding_window_attention_shorter_than_the_sequence_is_refused():
    """Mistral 7B v0.1 attends over a 4096-token window: at 4096 tokens that is full attention,
    longer it is not what perfmodel models."""
    assert _model("mistral-7b-v0.1", 4096).seq_len == 4096
    with pytest.raises(SpecError, match="sliding_window 4096 < seq_len 8192"):
        _model("mistral-7b-v0.1", 8192)
    # qwen2's window only counts with use_sliding_window
    cfg = json.loads((HF / "qwen2.5-7b" / "config.json").read_text())
    from perfmodel.specs.model import model_from_hf_config

    assert model_from_hf_config(cfg, "q", seq_len=200_000).seq_len == 200_000
    with pytest.raises(SpecError, match="sliding-window attention"):
        model_from_hf_config({**cfg, "use_sliding_window": True, "sliding_window": 4096}, "q",
                             seq_len=8192)
    with pytest.raises(SpecError, match="alternates sliding-window and global attention"):
        model_from_hf_config({**cfg, "model_type": "gemma2"}, "g", seq_len=8192)


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
