"""torchtitan's async TP (tp_comm_overlap on the compiled stack) as torch runs it: each fused
matmul-reduce-scatter ends in a sum of the tp partials, a memory-bound pass over (tp + 1) / tp of
the unsharded output (torch 2.13 torch/distributed/_symmetric_memory,
_fused_matmul_reduce_scatter_impl), per sub-layer forward (the attention output, MLP down) and
backward (the QKV's and MLP up's input gradients); NeMo's userbuffers (an eager stack) has none."""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel import Plan, load_hardware, load_model, predict

MODEL = load_model("llama3-8b")  # 32 layers, hidden 4096
H100 = load_hardware("dgx-h100")


def _lost(stack: str, bandwidth: float) -> float:
    hw = dataclasses.replace(H100, memory_bandwidth_bytes_per_s=bandwidth)
    plan = Plan(gpus=8, tp=8, sequence_parallel=True, tp_comm_overlap=True, stack=stack,
                micro_batch=1, global_batch=1)
    return predict(MODEL, hw, plan).breakdown_s["compute/tp_overlap"]


def test_the_partials_sum_is_a_pass_over_the_output_per_fused_reduce_scatter():
    """With memory bandwidth to spare every GEMM of the chunk losses is compute-bound: halving it
    adds the sums' time alone, 4 passes a layer of 9/8 x 8,192 x 4,096 bf16 elements each at
    the effective bandwidth (the given one x the preset's efficiency)."""
    fast, slow = 1e15, 5e14
    added = _lost("compiled", slow) - _lost("compiled", fast)
    passes = 4 * MODEL.layers * (8 + 1) / 8 * 2 * 8192 * 4096
    effective = H100.memory_bandwidth_efficiency
    assert added == pytest.approx(passes / (slow * effective) - passes / (fast * effective),
                                  rel=1e-6)
    assert _lost("eager", slow) == pytest.approx(_lost("eager", fast), rel=1e-9)
