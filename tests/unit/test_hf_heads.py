"""A Hugging Face config is read only as the causal language model perfmodel costs.

A probe of about 120 published configs not in tests/data/hf (2026-12-07) found every count within
0.5% and every unmodelled family refused, but three configs answered for a model they are not:
a reward model (Skywork-Reward-Llama-3.1-8B-v0.2, LlamaForSequenceClassification: a one-logit
score head, 7.50B parameters, predicted 8.03B with a 128,256-row output layer and its loss), an
embedding model (e5-mistral-7b-instruct, MistralModel: no head at all, 7.11B, predicted 7.24B)
and Qwen2.5-Math-RM-72B (Qwen2ForRewardModel). Their architectures name the class transformers
builds; perfmodel now refuses any but a causal language model's. And a DeepSeek sparse-attention
config (DeepSeek-V3.2's index_topk, index_n_heads, index_head_dim) is refused for its attention,
whatever its model_type: under model_type deepseek_v3 it was read as DeepSeek-V3, each query
attending to every earlier token where the indexer picks index_topk of them.
"""

from __future__ import annotations

import json

import pytest

from perfmodel import SpecError
from perfmodel.specs.model import model_from_hf_config
from tests.conftest import ROOT

HF = ROOT / "tests/data/hf"


def _config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


@pytest.mark.parametrize("name,architecture", [
    ("llama-3.1-8b", "LlamaForSequenceClassification"),   # Skywork-Reward-Llama-3.1-8B-v0.2
    ("mistral-7b-v0.1", "MistralModel"),                  # e5-mistral-7b-instruct
    ("qwen2.5-7b", "Qwen2ForRewardModel"),                # Qwen2.5-Math-RM-72B
    ("qwen3-8b", "Qwen3ForTokenClassification"),
])
def test_a_head_other_than_a_language_models_is_refused(name, architecture):
    config = _config(name)
    model_from_hf_config(config, "lm.json", 4096)  # its published causal LM is read
    config["architectures"] = [architecture]
    with pytest.raises(SpecError, match=f"architectures {architecture} is not a causal "
                                        "language model"):
        model_from_hf_config(config, "head.json", 4096)


def test_every_published_config_names_a_language_model_head():
    # the shared corpus's configs all pass the check: GPT2LMHeadModel and <Family>ForCausalLM
    for path in sorted(HF.glob("*/config.json")):
        heads = json.loads(path.read_text()).get("architectures")
        assert heads and all(h.endswith(("ForCausalLM", "LMHeadModel")) for h in heads), path


def test_architectures_must_be_a_list_of_names():
    config = _config("llama-3.1-8b")
    config["architectures"] = "LlamaForCausalLM"
    with pytest.raises(SpecError, match="architectures must be a list of class names"):
        model_from_hf_config(config, "lm.json", 4096)


def test_a_config_without_architectures_is_still_read():
    config = _config("llama-3.1-8b")
    del config["architectures"]
    assert model_from_hf_config(config, "lm.json", 4096).hidden == 4096


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v32"])
def test_a_sparse_attention_indexer_is_refused_by_name(model_type, tmp_path, run_cli):
    # DeepSeek-V3.2-Exp's config.json (huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp): DeepSeek-V3's
    # shapes plus the lightning indexer's index_head_dim 128, index_n_heads 64, index_topk 2048
    config = _config("deepseek-v3")
    config.update(model_type=model_type, index_head_dim=128, index_n_heads=64, index_topk=2048)
    with pytest.raises(SpecError, match="sparse-attention indexer \\(index_head_dim, "
                                        "index_n_heads, index_topk"):
        model_from_hf_config(config, "v32.json", 4096)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_cli("predict", "--model", str(path), "--seq-len", "4096",
                     "--hardware", "gb200-nvl72", "--gpus", "64", "--ep", "64")
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert "sparse-attention indexer" in result.stderr and result.stdout == ""
