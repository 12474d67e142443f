"""Attention as it runs (flash kernels, FLOP conventions) and memory as it is allocated (named
recompute policies, the optimizer's state dtypes), issue 16 items 4 and 6."""

from __future__ import annotations

import math

import pytest

from perfmodel import Plan, TransformerSpec, load_hardware, load_model, predict
from perfmodel.costs.precision import model_state_bytes_per_param
from perfmodel.errors import PlanError

A100, H100, V100 = "dgx-a100-80gb", "dgx-h100", "dgx-v100"

# FlashAttention-2 on A100 80GB SXM4, forward + backward, causal mask, head dim 128, 16k tokens
# per batch, TFLOP/s at sequence length 512 ... 16k (github Dao-AILab/flash-attention,
# assets/flash2_a100_fwd_bwd_benchmark.png, panel d; Dao 2023, arXiv 2307.08691, Fig. 4)
FA2_A100_CAUSAL_HD128 = {512: 99, 1024: 133, 2048: 155, 4096: 173, 8192: 182, 16384: 189}
# cuDNN on H100 80GB SXM5, forward, causal mask, head dim 128 (Shah et al. 2024, arXiv 2407.08608,
# Fig. 5d; assets/flash3_fp16_fwd.png)
CUDNN_H100_FWD_CAUSAL_HD128 = {512: 315, 1024: 410, 2048: 484, 4096: 518, 8192: 529, 16384: 539}


def _achieved(point_fraction: float, half_seq: float, peak: float, s: int) -> float:
    return peak * point_fraction * s / (s + half_seq) / 1e12


@pytest.mark.parametrize("hardware,series,direction", [
    (A100, FA2_A100_CAUSAL_HD128, "forward"), (A100, FA2_A100_CAUSAL_HD128, "backward"),
    (H100, CUDNN_H100_FWD_CAUSAL_HD128, "forward")])
def test_preset_flash_kernels_reproduce_their_published_benchmarks(hardware, series, direction):
    hw = load_hardware(hardware)
    point = hw.flash_attention.at(128)
    fraction = getattr(point, f"{direction}_max_fraction")
    half = getattr(point, f"{direction}_half_seq")
    for s, published in series.items():
        assert _achieved(fraction, half, hw.peak("bf16"), s) == pytest.approx(published, rel=0.03)


def test_flash_attention_time_is_the_causal_half_at_the_kernels_efficiency():
    """Llama 3 8B on one A100, micro-batch 1: the forward's attention is L x the causal half of
    4 b a s^2 d at the FlashAttention-2 fit, the backward 2.5 x its FLOPs."""
    model, hw = load_model("llama3-8b"), load_hardware(A100)
    r = predict(model, hw, Plan(gpus=1, global_batch=1))
    assert r.plan.flash_attention is True  # on by default: A100 runs FlashAttention-2 in bf16
    point = hw.flash_attention.at(model.head_dim)
    s, flops = model.seq_len, 0.5 * 4 * model.heads * model.seq_len**2 * model.head_dim
    fwd = model.layers * flops / (312e12 * point.forward_max_fraction) * (
        1 + point.forward_half_seq / s)
    bwd = model.layers * 2.5 * flops / (312e12 * point.backward_max_fraction) * (
        1 + point.backward_half_seq / s)
    assert r.breakdown_s["compute/forward/attention"] == pytest.approx(fwd, rel=1e-9)
    assert r.breakdown_s["compute/backward/attention"] == pytest.approx(bwd, rel=1e-9)
    unfused = predict(model, hw, Plan(gpus=1, global_batch=1, flash_attention=False))
    assert unfused.breakdown_s["compute/forward/attention"] > 3 * fwd  # s^2 GEMMs and bytes
    # no s^2 activations with flash
    assert (unfused.memory_breakdown_bytes["activations/layers"]
            > r.memory_breakdown_bytes["activations/layers"] + model.layers * model.heads * s**2)


def test_flash_is_the_default_only_where_the_hardware_has_a_kernel_for_the_dtype():
    gpt = load_model("gpt2-small")
    assert predict(gpt, A100, Plan(gpus=1, global_batch=1)).plan.flash_attention is True
    assert predict(gpt, A100, Plan(gpus=1, global_batch=1, dtype="fp32")).plan.flash_attention \
        is False
    assert predict(gpt, V100, Plan(gpus=1, global_batch=1, dtype="fp16")).plan.flash_attention \
        is False
    assert predict(gpt, "mi325x", Plan(gpus=1, global_batch=1)).plan.flash_attention is False
    assert predict(gpt, "mi300x", Plan(gpus=1, global_batch=1)).plan.flash_attention is True
    with pytest.raises(PlanError, match="no flash-attention kernel"):
        predict(gpt, V100, Plan(gpus=1, global_batch=1, dtype="fp16", flash_attention=True))
    # where the kernel is not measured (fp32 on A100), asked-for fused attention runs its FLOPs
    # as GEMMs: cheaper than the unfused path, which also moves the s^2 scores
    fused = predict(gpt, A100, Plan(gpus=1, global_batch=1, dtype="fp32", flash_attention=True))
    unfused = predict(gpt, A100, Plan(gpus=1, global_batch=1, dtype="fp32"))
    assert fused.breakdown_s["compute/forward/attention"] < unfused.breakdown_s[
        "compute/forward/attention"]


def test_attention_option_on_the_command_line(run_cli):
    ok = run_cli("predict", "--model", "gpt2-small", "--hardware", V100, "--attention", "unfused",
                 "--json")
    assert ok.returncode == 0, ok.stderr
    refused = run_cli("predict", "--model", "gpt2-small", "--hardware", V100, "--attention",
                      "flash")
    assert refused.returncode == 4 and refused.stderr.startswith("error: flash_attention")
    old = run_cli("predict", "--model", "gpt2-small", "--hardware", A100, "--flash-attention",
                  "--attention", "unfused")
    assert old.returncode == 2 and "contradicts" in old.stderr


def test_mfu_conventions_differ_by_the_causal_half_of_the_attention_core():
    """Megatron-LM (num_floating_point_operations since 8873b55) counts the causal core as half;
    torchtitan's get_num_flop_per_token (6 N + 12 L heads head_dim s per token) counts it whole."""
    model = load_model("llama3-8b")
    r = predict(model, A100, Plan(gpus=8, dp=8, global_batch=16, micro_batch=2))
    tokens = r.plan.global_batch * model.seq_len
    core = 12 * model.layers * model.heads * model.head_dim * model.seq_len * tokens
    assert r.model_flops_per_step_full_attention - r.model_flops_per_step == pytest.approx(
        core / 2, rel=1e-12)
    assert r.mfu_full_attention / r.mfu == pytest.approx(
        r.model_flops_per_step_full_attention / r.model_flops_per_step)
    assert "megatron" in r.to_dict()["flops_convention"]


LLAMA = dict(name="llama-like", layers=4, hidden=1024, heads=8, kv_heads=2, ffn_hidden=2816,
             vocab=1000, seq_len=512, gated_mlp=True, bias=False, norm="rmsnorm",
             position_embedding="rotary", tied_embeddings=False)


def test_per_op_recompute_keeps_torchtitans_saved_outputs():
    """torchtitan's op-level AC on a Llama layer (tp 1) keeps its input and the outputs of wq,
    wv, w1 and w2 (every other matmul), of the flash kernel and its fp32 log-sum-exp."""
    model = TransformerSpec(**LLAMA)
    b, s, h, a, kv, f, d, e = 2, 512, 1024, 8, 2, 2816, 128, 2
    r = predict(model, A100, Plan(gpus=1, global_batch=b, micro_batch=b, recompute="op"))
    T = b * s
    per_layer = e * T * (h + a * d + kv * d + f + h) + e * T * a * d + 4 * a * b * s
    assert r.memory_breakdown_bytes["activations/layers"] == pytest.approx(4 * per_layer)
    # it repeats the recomputed matmuls (wk, wo, w3: their share of the linear FLOPs) and every
    # element-wise op, not the attention
    none = predict(model, A100, Plan(gpus=1, global_batch=b, micro_batch=b))
    share = (kv * d + a * d + f) / (2 * a * d + 2 * kv * d + 3 * f)
    expected = share * none.breakdown_s["compute/forward/gemm"] \
        + none.breakdown_s["compute/forward/elementwise"]
    assert r.breakdown_s["compute/recompute"] == pytest.approx(expected, rel=1e-9)


def test_every_second_layer_recomputed_halves_full_recomputes_time_and_saving():
    model = TransformerSpec(**LLAMA)
    plan = Plan(gpus=1, global_batch=2, micro_batch=2, recompute="full")
    full, half = predict(model, A100, plan), predict(model, A100, plan.replace(recompute_every=2))
    none = predict(model, A100, plan.replace(recompute="none"))
    act = "activations/layers"
    assert half.memory_breakdown_bytes[act] == pytest.approx(
        (full.memory_breakdown_bytes[act] + none.memory_breakdown_bytes[act]) / 2)
    assert half.breakdown_s["compute/recompute"] == pytest.approx(
        full.breakdown_s["compute/recompute"] / 2)
    # one layer in 3 of 4: floor(4 / 3) = 1 layer (torchtitan wraps the 3rd)
    third = predict(model, A100, plan.replace(recompute_every=3))
    assert third.breakdown_s["compute/recompute"] == pytest.approx(
        full.breakdown_s["compute/recompute"] / 4)
    with pytest.raises(PlanError, match="recompute_every"):
        Plan(gpus=1, recompute_every=2)


@pytest.mark.parametrize("grad,states,per_param", [
    (None, None, (2 + 4, 12)),  # Megatron: bf16 parameters, fp32 gradients: 6 + 12/d
    ("bf16", None, (2 + 2, 12)),  # NeMo 2 grad_reduce_in_fp32 False
    ("bf16", "bf16", (2 + 2, 4)),  # Apex distributed_fused_adam dtype bf16: no master copy
])
def test_distributed_optimizer_bytes_per_parameter(grad, states, per_param):
    """Megatron-LM docs/user-guide/features/dist_optimizer.md: the distributed optimizer (ZeRO 1)
    shards the fp32 master weights and Adam states, not the main gradients."""
    model, d = load_model("llama2-7b"), 8
    r = predict(model, A100, Plan(gpus=d, dp=d, global_batch=d, zero=1, grad_dtype=grad,
                                  optimizer_dtype=states))
    mem = r.memory_breakdown_bytes
    states_bytes = mem["weights"] + mem["gradients"] + mem["optimizer_states"]
    replicated, sharded = per_param
    assert states_bytes / r.parameters == pytest.approx(replicated + sharded / d)


def test_megatron_doc_table_of_bytes_per_parameter():
    # docs/user-guide/features/dist_optimizer.md: non-distributed 20 (fp16), 18 (bf16), 16 (fp32)
    assert sum(model_state_bytes_per_param("fp16").values()) == 20
    assert sum(model_state_bytes_per_param("bf16").values()) == 18
    assert sum(model_state_bytes_per_param("fp32").values()) == 16
    with pytest.raises(PlanError, match="bf16 mixed precision"):
        Plan(gpus=1, dtype="fp16", grad_dtype="bf16")


def test_llama2_70b_per_op_recompute_fits_micro_batch_1_not_2():
    """torchtitan docs/performance.md (015ccb237): Llama 2 70B on 64 A100 80GB with FSDP2 and
    selective (op) AC ran with local batch 1; "local batch size 2 will cause an OOM error"."""
    model = TransformerSpec(name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                            ffn_hidden=28672, vocab=32000, seq_len=4096, gated_mlp=True,
                            bias=False, position_embedding="rotary", norm="rmsnorm",
                            tied_embeddings=False)
    plan = Plan(gpus=64, dp=64, zero=3, global_batch=64, recompute="op")
    assert predict(model, A100, plan).fits_in_memory
    assert not predict(model, A100, plan.replace(micro_batch=2, global_batch=128)).fits_in_memory
    assert math.isfinite(predict(model, A100, plan).step_time_s)
