"""The host ops of an MoE layer on a GPU (perfmodel.step.moe.extra_kernels): counted again on the
validation job's MoE block as perfmodel.step.host counts a dense block's (every aten op under
torch's dispatcher), and charged per local expert by the step model."""

from __future__ import annotations

import pytest

from perfmodel import load_hardware, load_model, predict
from perfmodel.step.moe import EXCHANGE_HOST_OPS, EXPERT_HOST_OPS, MOE_HOST_OPS
from perfmodel.strategy import Plan

# the block the counts were taken on: gated, bias-free, RMSNorm (Mixtral's, Qwen's, DeepSeek's)
BLOCK = {"hidden": 16, "heads": 2, "kv_heads": 2, "ffn_hidden": 64, "seq_len": 64, "vocab": 32,
         "bias": False, "gated_mlp": True, "norm": "rmsnorm"}


def _ops(torch, spec, moe, ep=1, routing="learned"):
    """(forward, backward) aten ops of one block, after a warm-up step (gradients exist)."""
    from calibration.host import count_ops
    from workload.model import Block

    torch.manual_seed(0)
    block = Block(spec, moe=moe)
    if moe:
        block.feed_forward.routing = routing
    if ep > 1:
        import torch.distributed as dist

        block.feed_forward.shard_experts(dist.group.WORLD, 0, ep)
    x = torch.randn(1, spec["seq_len"], spec["hidden"], requires_grad=True)

    def step():
        block(x).sum().backward()

    step()
    forward = count_ops(torch, lambda: block(x))
    return forward, count_ops(torch, step) - forward


@pytest.mark.parametrize("experts", [2, 4, 8])
def test_the_counts_are_the_validation_jobs_moe_block(experts):
    torch = pytest.importorskip("torch")
    dense = _ops(torch, BLOCK, False)
    moe = _ops(torch, dict(BLOCK, experts=experts, top_k=2, expert_ffn_hidden=32), True)
    for i in (0, 1):
        assert moe[i] - dense[i] == MOE_HOST_OPS[i] + EXPERT_HOST_OPS[i] * experts


def test_the_exchange_adds_its_ops_over_ep_ranks():
    """8 experts over 2 ranks against 4 on one: the same experts per rank, the exchange's ops
    between. On torch's fake process group (no peers: the routing balanced, whose counts come
    from the shapes, as the exchanged data is not real)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    spec = dict(BLOCK, experts=8, top_k=2, expert_ffn_hidden=32)
    alone = _ops(torch, dict(spec, experts=4), True, routing="balanced")
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        split = _ops(torch, spec, True, ep=2, routing="balanced")
    finally:
        dist.destroy_process_group()
    for i in (0, 1):
        assert split[i] - alone[i] == EXCHANGE_HOST_OPS[i]


def test_the_host_time_grows_with_the_experts_a_rank_holds():
    """Qwen3-30B-A3B (128 experts, 48 MoE layers) on 8 H100s: ep 4 puts 32 experts on a rank, ep 8
    sixteen; the host issues EXPERT_HOST_OPS more per layer, micro-batch and expert."""
    model, hw = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")

    def host(ep):
        p = predict(model, hw, Plan(gpus=8, dp=8, ep=ep, global_batch=16))
        return p.breakdown_s["overhead/kernels"] + p.hidden_s.get("overhead/kernels", 0.0)

    t_op = hw.host_op_overhead_s or hw.kernel_overhead_s
    micro_batches = 16 // 8
    more = model.layers * sum(EXPERT_HOST_OPS) * (128 // 4 - 128 // 8) * micro_batches * t_op
    assert host(4) - host(8) == pytest.approx(more, rel=1e-9)
