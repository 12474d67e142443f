"""A multi-token-prediction module has three norms: of the previous depth's hidden state and of
the embedding, and its own final norm before the shared output layer (Megatron-Core's
MultiTokenPredictionLayer: enorm, hnorm, final_layernorm; DeepSeek-V3's weights: enorm, hnorm,
shared_head.norm). Both counts left the last out before 2026-12-07 (a probe's finding)."""

from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.params import layer_parameters, parameter_counts
from perfmodel.predict import resolve_inputs
from perfmodel.specs.model import TransformerSpec


def test_an_mtp_module_counts_its_final_norm_in_both_counts():
    h = 64
    model = TransformerSpec(name="t", layers=2, hidden=h, heads=4, vocab=512, seq_len=128,
                            ffn_hidden=256, mtp_layers=1)
    # its layer, eh_proj and three LayerNorms (weight and bias each)
    module = layer_parameters(model, False) + 2 * h * h + 3 * 2 * h
    assert parameter_counts(model).mtp == module
    # the step model's one-GPU weights: the model's, and the module beside its output layer
    model, hw, plan = resolve_inputs(model, "dgx-h100", {"gpus": 1})
    out = compile_family(family_of(model, hw, plan))(values_of(model, hw, plan))
    assert float(out["q:parameters_per_gpu"]) - float(out["q:parameters"]) == module
