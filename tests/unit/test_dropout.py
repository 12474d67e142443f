"""Dropout masks only where the model trains with dropout (TransformerSpec.hidden_dropout,
attention_dropout).

With a rate of 0 PyTorch's dropout returns its input (ATen Dropout.cpp: `p == 0`), so Megatron's
bias-dropout-adds and embedding dropout keep no mask, and an unfused attention core keeps its
softmax output alone. Korthikanti et al. 2022 (Table 2) count the masks of a run with dropout:
34 s b h + 5 a s^2 b per layer, of which 2 s b h (the two hidden masks) and 3 a s^2 b (the
attention's mask and dropped probabilities) are dropout's.
"""

from __future__ import annotations

import json

import pytest
import sympy as sp

from perfmodel import TransformerSpec, load_model, predict
from perfmodel.configs import read_config, resolve_model
from perfmodel.costs.compute import elementwise_bytes
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.errors import SpecError
from perfmodel.specs.model import model_from_hf_config
from validation.jobspec import job_model, job_model_note

b, s, h, a, t = sp.symbols("b s h a t", positive=True)


def _layer(**flags):
    return layer_activation_bytes(b, s, h, a, a, 4 * h, t, 2, sequence_parallel=1, full=0,
                                  selective=0, flash=0, gated=0, **flags)


def test_korthikanti_with_dropout_and_the_masks_without():
    with_dropout = _layer()
    assert sp.simplify(with_dropout - s * b * h / t * (34 + 5 * a * s / h)) == 0
    # no hidden dropout: the two 1-byte masks of s b h / t (sequence parallel) go
    assert sp.simplify(with_dropout - _layer(dropout=0) - 2 * s * b * h / t) == 0
    # no attention dropout: of 5 a s^2 b / t, the mask (1) and the dropped output (2) go
    assert sp.simplify(with_dropout - _layer(attention_dropout=0) - 3 * a * s**2 * b / t) == 0
    # flash attention keeps no s^2 tensor either way: only the hidden masks differ
    flash = dict(sequence_parallel=1, full=0, selective=0, flash=1, gated=0)
    kept = [layer_activation_bytes(b, s, h, a, a, 4 * h, t, 2, **flash, attention_dropout=d)
            for d in (0, 1)]
    assert sp.simplify(kept[0] - kept[1]) == 0


def test_elementwise_traffic_writes_no_mask_without_dropout():
    def ew(**flags):
        return elementwise_bytes(b * s, b, s, h, a, 4 * h, 1, 2, sequence_parallel=0, flash=0,
                                 gated=0, **flags)
    on, off = ew(), ew(dropout=0, attention_dropout=0)
    # the two bias-dropout-adds still read input and residual and write their sum (3 e)
    assert sp.simplify(off["dropout_add"] - 2 * 3 * 2 * b * s * h) == 0
    assert sp.simplify(on["dropout_add"] - off["dropout_add"] - 2 * b * s * h) == 0
    assert off["attention_dropout"] == 0 and on["attention_dropout"] != 0


def test_predicted_memory_drops_exactly_the_masks():
    """One stage, one micro-batch in flight, tp 1: the layers' activations differ by 2 b s h per
    layer and the embedding's output by its b s h mask, nothing else."""
    model = load_model("llama3-8b").replace(seq_len=4096)
    assert model.hidden_dropout == 0 and model.attention_dropout == 0
    plan = dict(gpus=8, dp=8, micro_batch=2, global_batch=16, zero=1)
    without = predict(model, "dgx-h100", plan).memory_breakdown_bytes
    masked = predict(model.replace(hidden_dropout=0.1, attention_dropout=0.1), "dgx-h100",
                     plan).memory_breakdown_bytes
    tokens = 2 * 4096
    assert masked["activations/layers"] - without["activations/layers"] == \
        pytest.approx(32 * 2 * tokens * 4096)
    assert masked["activations/embedding_output"] - without["activations/embedding_output"] == \
        pytest.approx(tokens * 4096)
    assert masked["weights"] == without["weights"]


def test_presets_and_default():
    # Megatron-Core's TransformerConfig default (0.1 each) for a model that does not say
    assert TransformerSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=100).hidden_dropout \
        == 0.1
    assert load_model("gpt3-175b").attention_dropout == 0.1
    for name in ("llama3.1-405b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b",
                 "gpt-oss-120b", "bloom-176b"):
        spec = load_model(name)
        assert (spec.hidden_dropout, spec.attention_dropout) == (0, 0), name
    with pytest.raises(SpecError, match="hidden_dropout must be >= 0 and <= 1"):
        TransformerSpec(layers=2, hidden=64, heads=4, seq_len=32, vocab=100, hidden_dropout=1.5)


def test_hugging_face_configs():
    llama = dict(model_type="llama", num_hidden_layers=2, hidden_size=64,
                 num_attention_heads=4, intermediate_size=128, vocab_size=100,
                 attention_dropout=0.0)
    spec = model_from_hf_config(llama, "config.json", seq_len=32)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.0, 0.0)
    # GPT-2: resid_pdrop and attn_pdrop, 0.1 each where the config leaves them out (GPT2Config)
    gpt2 = dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, vocab_size=100)
    spec = model_from_hf_config(gpt2, "config.json", seq_len=32)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.1)
    spec = model_from_hf_config(dict(gpt2, resid_pdrop=0.0, attn_pdrop=0.2), "c", seq_len=32)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.0, 0.2)
    with pytest.raises(SpecError, match="attention_dropout"):
        model_from_hf_config(dict(llama, attention_dropout="high"), "config.json", seq_len=32)


BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 2 --bf16 ")


def test_megatron_arguments(tmp_path):
    """Megatron-LM's --hidden-dropout and --attention-dropout, 0.1 where the arguments do not
    give them (arguments.py); a NeMo 2 config over a preset changes only what it states."""
    args = tmp_path / "args.txt"
    args.write_text(BASE)
    job = read_config(args)
    spec = resolve_model(job, None, None)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.1)
    assert any("Megatron-LM's default" in n for n in job.notes)
    args.write_text(BASE + "--hidden-dropout 0.0 --attention-dropout 0")
    spec = resolve_model(read_config(args), None, None)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.0, 0.0)
    # the NeMo 2 recipe YAML of a Llama config class: the preset's 0, or what it states
    recipe = {"trainer": {"devices": 8, "num_nodes": 1},
              "data": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
              "model": {"config": {"_target_": "nemo.collections.llm.gpt.model.llama."
                                   "Llama3Config8B"}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))
    assert resolve_model(read_config(path), None, None).hidden_dropout == 0.0
    recipe["model"]["config"]["hidden_dropout"] = 0.1
    path.write_text(json.dumps(recipe))
    spec = resolve_model(read_config(path), None, None)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.0)


def test_the_validation_job_trains_without_dropout():
    gpt = load_model("gpt2-small")
    assert gpt.hidden_dropout > 0
    ran = job_model(gpt)
    assert (ran.hidden_dropout, ran.attention_dropout) == (0.0, 0.0)
    assert "trains without dropout" in job_model_note(gpt)


def test_no_attention_dropout_kernel_without_its_rate():
    from perfmodel.costs.compute import kernels_per_layer_forward

    unfused = kernels_per_layer_forward(sequence_parallel=0, flash=0)
    assert kernels_per_layer_forward(sequence_parallel=0, flash=0, attention_dropout=0) == \
        unfused - 1
    # a flash kernel fuses the dropout either way
    assert kernels_per_layer_forward(sequence_parallel=0, flash=1, attention_dropout=0) == \
        kernels_per_layer_forward(sequence_parallel=0, flash=1)
