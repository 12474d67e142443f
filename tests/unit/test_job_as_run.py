"""The validation job runs what its prediction describes: --attention unfused attends without SDPA
(the scores, a softmax kept for the backward, the context product), and a GPU job at zero 0 or 3
keeps bf16 states (torch AdamW over bf16 parameters), which validation.jobspec.as_run says."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from perfmodel import Plan, PlanError, load_model  # noqa: E402
from validation.jobspec import as_run  # noqa: E402
from workload.model import build_chunk, unfused_attention  # noqa: E402


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_unfused_attention_is_causal_sdpa(kv_heads):
    """Forward and gradients equal PyTorch's causal SDPA, grouped-query heads included."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, kv_heads, 16, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, kv_heads, 16, 8, dtype=torch.float64, requires_grad=True)
    ours = unfused_attention(q, k, v)
    grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != 4)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(ours, ref)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_unfused_attention_keeps_one_s2_tensor_for_the_backward():
    """What autograd saves: one b x heads x s^2 tensor (the softmax's output, saved by the
    softmax and by the context product), not the scores (filled in place), as the model counts
    the unfused core without attention dropout (perfmodel.costs.memory)."""
    b, heads, s, d = 1, 2, 64, 4
    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) for _ in range(3))
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        unfused_attention(q, k, v)
    squares = {t.untyped_storage().data_ptr() for t in saved if t.numel() == b * heads * s * s}
    assert len(squares) == 1


def _blocks(flash):
    model = load_model("tiny-gpt")
    ran_model, ran, _ = as_run(model, Plan(gpus=1, dtype="fp32", flash_attention=flash), "gloo")
    m = {"vocab": ran_model.vocab, "hidden": ran_model.hidden, "heads": ran_model.heads,
         "kv_heads": ran_model.kv_heads, "ffn_hidden": ran_model.ffn_hidden,
         "seq_len": ran_model.seq_len, "layers": ran_model.layers, "bias": True,
         "gated_mlp": False, "norm": "layernorm"}
    return ran, build_chunk(m, {**ran.to_dict(), "pp": 1}, 0).layers


@pytest.mark.parametrize("flash", [None, True, False])
def test_the_job_attends_as_the_plan_says(flash):
    ran, blocks = _blocks(flash)
    assert ran.flash_attention is (flash is not False)
    assert all(block.attention.unfused is (flash is False) for block in blocks)


def test_a_gpu_job_at_zero_0_or_3_is_predicted_with_bf16_states():
    model = load_model("tiny-gpt")
    for zero, gpus in ((0, 1), (3, 2)):
        plan = Plan(gpus=gpus, dp=gpus, global_batch=gpus, zero=zero, dtype="bf16")
        _, ran, note = as_run(model, plan, "nccl")
        assert (ran.optimizer_dtype, ran.grad_dtype, ran.master_weights) == ("bf16", "bf16",
                                                                              "none")
        assert "AdamW states in bf16" in note
    zero1 = Plan(gpus=2, dp=2, global_batch=2, zero=1, dtype="bf16")  # fp32 main shards
    _, ran, note = as_run(model, zero1, "nccl")
    assert (ran.optimizer_dtype, ran.master_weights) == (None, None) and "AdamW" not in note
    _, ran, _ = as_run(model, Plan(gpus=1, dtype="bf16"), "gloo")  # fp32 on a CPU
    assert ran.dtype.value == "fp32" and ran.optimizer_dtype is None
    with pytest.raises(PlanError, match="dtype fp16 at zero 0 or 3 on a GPU"):
        as_run(model, Plan(gpus=1, dtype="fp16"), "nccl")


def test_the_gpu_jobs_own_precision_passes_the_jobs_checks():
    """The plan as_run describes at zero 0 on a GPU (bf16 states, no master copy) is one the
    job's config accepts, as emit and validate build it; given by hand at zero 1 it is not."""
    from validation.jobspec import job_config
    from validation.run import RunSettings

    model = load_model("tiny-gpt")
    ran_model, ran, _ = as_run(model, Plan(gpus=1, dtype="bf16"), "nccl")
    cfg = job_config(ran_model, ran, RunSettings(nprocs=1, backend="nccl"))
    assert cfg["plan"]["optimizer_dtype"] == "bf16"
    with pytest.raises(PlanError, match="master_weights none"):
        job_config(ran_model, Plan(gpus=2, dp=2, global_batch=2, zero=1, dtype="bf16",
                                   optimizer_dtype="bf16", master_weights="none"),
                   RunSettings(nprocs=2, backend="nccl"))
