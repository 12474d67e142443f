"""Shared experts are one MLP as wide as all of them, as the stacks build them (Megatron-Core's
SharedExpertMLP; Hugging Face's DeepseekV3MoE: `DeepseekV3MLP(intermediate_size=
moe_intermediate_size * n_shared_experts)`), with one down-projection bias. perfmodel.params
counted one MLP each (n biases) and the validation job built one each, while the step model
costs and stores one f_sh wide: with biases the three disagreed by (n - 1) h a layer."""

import pytest

from perfmodel.params import moe_ffn_parameters, parameter_counts
from perfmodel.predict import parameter_count
from perfmodel.specs.model import TransformerSpec

SPEC = dict(name="moe-bias", layers=4, hidden=64, heads=4, vocab=512, seq_len=128,
            ffn_hidden=256, experts=4, top_k=2, expert_ffn_hidden=32, shared_experts=3,
            shared_expert_ffn_hidden=16, bias=True, gated_mlp=True)


@pytest.mark.parametrize("bias", [True, False])
def test_the_count_is_the_step_models_with_several_biased_shared_experts(bias):
    model = TransformerSpec(**{**SPEC, "bias": bias})
    assert parameter_counts(model).total == parameter_count(model, "dgx-h100")
    h, width = 64, 3 * 16
    shared = 3 * width * h + bias * (2 * width + h)  # gate, up, down; their biases once
    router = h * 4 + bias * 4
    experts = 4 * (3 * 32 * h + bias * (2 * 32 + h))
    assert moe_ffn_parameters(model) == experts + shared + router


def test_the_job_builds_them_as_one_mlp_of_the_counted_size():
    torch = pytest.importorskip("torch")
    from workload.model import MLP
    from workload.moe import MoE

    model = TransformerSpec(**SPEC)
    torch.manual_seed(0)
    block = MoE({**model.to_dict(), "ffn_hidden": SPEC["ffn_hidden"]}, MLP)
    assert len(block.shared) == 1 and block.shared[0].w1.out_features == 48
    assert sum(p.numel() for p in block.parameters()) == moe_ffn_parameters(model)
