"""Megatron-Core's routed experts beyond their GEMMs and fused activation kernel
(perfmodel.step.moe.expert_extra_bytes; megatron/core/transformer/moe/experts.py and
fusions/fused_bias_geglu.py at d7288711, Megatron-Bridge v0.4.0's Megatron-Core, and d98e8a64dd):
a clamped GLU (GPT-OSS) clamps and concatenates the up projection's halves in eager PyTorch
before weighted_bias_quick_geglu_impl's fused kernel, and the down projection's biases are
added by _apply_bias, each expert's bias times its rows' routing weights, in the weights' dtype
(fp32 under DeepEP / HybridEP, whose dispatcher upcasts them). The step's element-wise time moves
by those bytes over the memory bandwidth, checked here against the passes counted by hand."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from perfmodel import Plan, PlanError, SpecError, TransformerSpec, load_hardware
from perfmodel import predict as _predict
from perfmodel.specs.model import load_model

# these tests predict plans as they stand (generated, or read from configs), options that
# change nothing included: perfmodel.predict refuses those by default (refuse_idle)
predict = functools.partial(_predict, refuse_idle=False)

HW = "dgx-h100"
# a small GPT-OSS-like mixture of experts: 2 MoE layers, 4 experts of 128, top 2, 128 tokens
MOE = dict(name="tiny-oss", layers=2, hidden=256, heads=4, kv_heads=4, ffn_hidden=128,
           seq_len=128, vocab=1000, gated_mlp=True, bias=False, experts=4, top_k=2,
           hidden_dropout=0.0, attention_dropout=0.0)
PLAN = dict(gpus=1, micro_batch=1, global_batch=1, dtype="bf16")
ROWS = 128 * 2  # the rank's routed rows, A_r: every token's top 2 (ep 1)


def _elementwise(spec: dict, **plan) -> tuple[float, float]:
    p = predict(TransformerSpec(**spec), HW, Plan(**PLAN, **plan))
    return (p.breakdown_s["compute/forward/elementwise"],
            p.breakdown_s["compute/backward/elementwise"])


def _seconds(nbytes: float) -> float:
    hw = load_hardware(HW)
    return nbytes / (hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)


def test_a_clamped_glu_adds_its_eager_clamps_and_concatenation():
    """Forward: two clamps (read and write a half, A_r x f_E bf16 each) and the concatenation
    (read and write both halves): 8 halves' bytes; backward: the clamps' (gradient and input
    read, gradient written) and the concatenation of the gradients for the chunk: 10."""
    plain, clamped = _elementwise(MOE), _elementwise({**MOE, "clamped_glu": True})
    half = 2 * ROWS * 128 * MOE["layers"]  # bytes of one half, over the MoE layers
    assert clamped[0] - plain[0] == pytest.approx(_seconds(8 * half), rel=1e-9)
    assert clamped[1] - plain[1] == pytest.approx(_seconds(10 * half), rel=1e-9)


@pytest.mark.parametrize(("dispatcher", "forward", "backward"), [
    # bf16 routing weights (the all-to-all dispatcher keeps the router's dtype): b p, t + b p,
    # the concatenation: 2 + 6 + 4 bytes an element; backward the bias's and the weights'
    # gradients (a product and its reduction each: 3 x 2)
    ("alltoall", 12, 12),
    # fp32 weights (DeepEP / HybridEP): 4 + (2 + 4 + 4) + 8, and the cast back, 4 + 2;
    # backward the casts (2 + 4, 4 + 2) and the gradients (6 x 4)
    ("deepep", 28, 36)])
def test_the_experts_biases_add_their_loop(dispatcher, forward, backward):
    """The down projection's biases (a model with biases and experts), per element of the
    rank's A_r x h routed rows."""
    biased = {**MOE, "bias": True}
    plain = _elementwise(MOE, ep_dispatcher=dispatcher)
    with_bias = _elementwise(biased, ep_dispatcher=dispatcher)
    rows = ROWS * MOE["hidden"] * MOE["layers"]
    # Megatron-Core's fused kernels take the attention's biases in their GEMMs and fused ops:
    # the expert loop is all the biases add
    assert with_bias[0] - plain[0] == pytest.approx(_seconds(forward * rows), rel=1e-6)
    assert with_bias[1] - plain[1] == pytest.approx(_seconds(backward * rows), rel=1e-6)
    # op by op no loop (the experts' MLP is moe.py's either way), but each of the attention's
    # biases (q, k, v and the output: 3 h + h outputs) has its gradient summed over the 128
    # tokens in its own kernel: 2 B x 128 x 1,024 a layer, 4 of the rows' units
    eager = _elementwise(biased, ep_dispatcher=dispatcher, kernels="eager")
    eager_plain = _elementwise(MOE, ep_dispatcher=dispatcher, kernels="eager")
    assert eager[0] == pytest.approx(eager_plain[0], rel=1e-9)
    assert eager[1] - eager_plain[1] == pytest.approx(_seconds(4 * rows), rel=1e-6)


def test_only_megatron_cores_fused_stack_runs_them():
    """Eager and compiled kernels (torchtitan, the validation job) cost the experts' passes as
    the fused activation's: no clamp or bias loop added (a limitation, docs/moe.md)."""
    spec = {**MOE, "clamped_glu": True, "bias": True}
    assert _elementwise(spec, kernels="eager") == _elementwise({**MOE, "bias": True},
                                                               kernels="eager")


def test_selective_recompute_of_moe_act_repeats_the_clamps():
    spec = {**MOE, "clamped_glu": True}
    plan = dict(recompute="selective", recompute_modules="moe_act")
    plain = predict(TransformerSpec(**MOE), HW, Plan(**PLAN, **plan))
    clamped = predict(TransformerSpec(**spec), HW, Plan(**PLAN, **plan))
    half = 2 * ROWS * 128 * MOE["layers"]
    assert clamped.breakdown_s["compute/recompute"] - plain.breakdown_s["compute/recompute"] \
        == pytest.approx(_seconds(8 * half), rel=1e-9)


def test_gpt_oss_clamps_and_a_dense_or_ungated_clamp_is_refused_or_free():
    assert load_model("gpt-oss-120b").clamped_glu
    with pytest.raises(SpecError, match="clamped_glu clamps a gated MLP"):
        TransformerSpec(**{**MOE, "gated_mlp": False, "clamped_glu": True})
    dense = {k: v for k, v in MOE.items() if k not in ("experts", "top_k")}
    assert _elementwise({**dense, "clamped_glu": True}) == _elementwise(dense)


def test_hugging_face_gpt_oss_reads_clamped(tmp_path):
    config = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
              "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 128,
              "vocab_size": 1000, "num_local_experts": 4, "num_experts_per_tok": 2,
              "swiglu_limit": 7.0, "sliding_window": 128}  # as gpt-oss's configs give it
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = load_model(str(path), seq_len=128)
    assert spec.clamped_glu and spec.experts == 4


def test_megatron_configs_and_the_clamp(tmp_path):
    """Megatron-LM's --activation-func-clamp-value with SwiGLU clamps inside the fused kernel
    (no pass: clamped_glu stays off, said); a Megatron-Bridge model with the quick-GeGLU and a
    clamp (GPT-OSS's providers) is clamped_glu; a clamped model is not emitted as Megatron-LM
    arguments (its SwiGLU would not clamp as costed)."""
    from perfmodel.configs import read_config
    from perfmodel.configs.megatron import megatron_arguments

    args = tmp_path / "args.txt"
    args.write_text("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
                    "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
                    "--bf16 --vocab-size 1000 --swiglu --activation-func-clamp-value 7.0\n")
    job = read_config(args)
    assert "clamped_glu" not in job.model
    assert any(s.key == "--activation-func-clamp-value" and "inside" in s.note for s in job.read)
    bridge = (Path(__file__).resolve().parents[1] / "data" / "configs" /
              "bridge_llama3_8b.yaml").read_text()
    quick = bridge.replace("    _target_: torch.nn.functional.silu",
                           "    _target_: megatron.core.fusions.fused_bias_geglu.quick_gelu\n"
                           "  activation_func_clamp_value: 7.0")
    assert quick != bridge
    (tmp_path / "bridge.yaml").write_text(quick)
    assert read_config(tmp_path / "bridge.yaml").model["clamped_glu"] is True
    with pytest.raises(PlanError, match="clamped_glu"):
        megatron_arguments(TransformerSpec(**{**MOE, "clamped_glu": True, "norm": "rmsnorm",
                                              "position_embedding": "rotary"}), Plan(**PLAN))


def test_automodel_clamps_inside_its_compiled_activation():
    """NeMo AutoModel's GPT-OSS experts clamp inside a torch.compile'd kernel
    (components/moe/experts.py, quick_geglu_deepep): its reader leaves the eager clamp out, and
    the preset's clamped_glu gives way to it as a run's setting."""
    from perfmodel.configs import read_config, resolve_model

    runs = Path(__file__).resolve().parents[1] / "data" / "automodel-runs"
    job = read_config(runs / "gpt_oss_120b_64.yaml")
    assert job.model["clamped_glu"] is False
    spec = resolve_model(job, "gpt-oss-120b", None)
    assert spec.experts == 128 and not spec.clamped_glu and spec.bias
