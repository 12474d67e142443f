"""A mixture of experts' active parameters are reported as its model card counts them
(TransformerSpec.active_count; perfmodel.params.ParameterCounts.reported): in `perfmodel
presets`, and `active_parameters` of `presets --json`, `predict --json` and `recommend --json`.

Before, every model's active count held the input embedding table, so gpt-oss-120b's was 5.71B
against its card's 5.13B (+11%) and gpt-oss-20b's 4.19B against 3.61B (+16%). Also the Hugging
Face reader's handling of configs a probe found misread (2026-12-02)."""

from __future__ import annotations

import json

import pytest

from perfmodel import SpecError, TransformerSpec
from perfmodel.params import parameter_counts
from tests.conftest import ROOT

HF = ROOT / "tests/data/hf"


def _json(run_cli, *args: str) -> dict:
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_gpt_oss_20b_reports_its_cards_active_count_in_predict_json(run_cli):
    # gpt-oss-120b & gpt-oss-20b Model Card (OpenAI 2025), Table 1: 20.91B total, 3.61B active
    data = _json(run_cli, "predict", "--model", str(HF / "gpt-oss-20b"), "--hardware", "dgx-h100",
                 "--gpus", "8", "--global-batch", "8", "--seq-len", "4096", "--json")
    assert data["parameters"] == pytest.approx(20.91e9, rel=0.005)
    assert data["active_parameters"] == pytest.approx(3.61e9, rel=0.005)


def test_presets_json_reports_each_card_convention(run_cli):
    counts = _json(run_cli, "presets", "--json")["model_parameters"]
    # OpenAI's Table 1: 5.13B active; DeepSeek-V3 README_WEIGHTS.md: 36.7B activated;
    # Mistral AI (mistral.ai/news/mixtral-of-experts): 12.9B per token, the table counted
    assert counts["gpt-oss-120b"]["active_parameters"] == pytest.approx(5.13e9, rel=0.005)
    assert counts["deepseek-v3"]["active_parameters"] == pytest.approx(36.7e9, rel=0.005)
    assert counts["mixtral-8x7b"]["active_parameters"] == pytest.approx(12.9e9, rel=0.005)
    # a dense model's: all of it, whatever its convention
    assert counts["llama3-8b"]["active_parameters"] == counts["llama3-8b"]["parameters"]


def test_presets_table_marks_a_count_without_the_embedding(run_cli):
    out = run_cli("presets")
    assert out.returncode == 0, out.stderr
    assert "(5.13B active*)" in out.stdout and "(12.88B active)" in out.stdout
    assert "* active as the model's card counts them: without the embedding table" in out.stdout


def _moe(**kw: object) -> TransformerSpec:
    return TransformerSpec(**{**dict(name="m", layers=2, hidden=64, heads=4, seq_len=32,
                                     vocab=1000, experts=8, top_k=2, expert_ffn_hidden=32,
                                     gated_mlp=True, tied_embeddings=False), **kw})


def test_a_spec_chooses_what_its_active_count_leaves_out():
    every = parameter_counts(_moe(position_embedding="rotary"))
    table = 1000 * 64
    assert every.reported == every.active
    assert parameter_counts(_moe(active_count="no_embedding", position_embedding="rotary")
                            ).reported == every.active - table
    assert parameter_counts(_moe(active_count="no_embeddings", position_embedding="rotary")
                            ).reported == every.active - 2 * table
    # tied: no output layer of its own to leave out; learned positions are the embedding's
    tied = parameter_counts(_moe(active_count="no_embeddings", tied_embeddings=True))
    assert tied.reported == tied.active - table - 32 * 64
    # the work is the same: only the report differs
    assert parameter_counts(_moe(active_count="no_embedding", position_embedding="rotary")
                            ).total == every.total


def test_an_unknown_active_count_is_refused_naming_the_choices():
    with pytest.raises(SpecError, match="active_count must be one of all, no_embedding, "
                                        "no_embeddings, got 'embedding'"):
        _moe(active_count="embedding")


def test_a_spec_file_gives_active_count(run_cli, tmp_path):
    spec = tmp_path / "moe.yaml"
    spec.write_text("base: mixtral-8x7b\nactive_count: no_embedding\n")
    data = _json(run_cli, "predict", "--model", str(spec), "--hardware", "dgx-h100", "--gpus", "8",
                 "--ep", "8", "--global-batch", "8", "--seq-len", "4096", "--json")
    assert data["active_parameters"] == pytest.approx(12.749e9, rel=1e-3)


def test_a_hugging_face_config_without_model_type_is_named_so(tmp_path):
    """It was read as a perfmodel spec and refused for an unknown field ('attention_bias')."""
    config = json.loads((HF / "qwen3-8b" / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    from perfmodel.specs.model import load_model

    with pytest.raises(SpecError, match="a Hugging Face config.json .* without model_type: give "
                                        "its model_type"):
        load_model(tmp_path, seq_len=4096)


@pytest.mark.parametrize("name", ["gemma-2b", "olmoe-1b-7b-0924"])
def test_a_window_key_the_familys_code_ignores_is_ignored(tmp_path, name):
    """GemmaConfig and OlmoeConfig have no sliding window (transformers 5): a sliding_window key
    in their config.json changes nothing there, and was costed as every layer windowed."""
    from perfmodel.specs.model import load_model

    config = json.loads((HF / name / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window": 1024}))
    assert load_model(tmp_path, seq_len=4096) == load_model(HF / name, seq_len=4096)
