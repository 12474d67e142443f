"""torchtitan's async TP (tp_comm_overlap on the compiled stack) as torch runs it: each fused
matmul-reduce-scatter ends in a sum of the tp partials, a memory-bound pass over (tp + 1) / tp of
the unsharded output (torch 2.13 torch/distributed/_symmetric_memory,
_fused_matmul_reduce_scatter_impl): forward, the attention output's and MLP down's; backward, an
ungated MLP up's input gradient (one GEMM produces it; separate q, k, v or a gate add theirs
first, and Inductor's pass fuses a reduce-scatter only behind a matmul); NeMo's userbuffers (an
eager stack) has none."""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel import Plan, load_hardware, load_model, predict

H100 = load_hardware("dgx-h100")


def _lost(model, stack: str, bandwidth: float) -> float:
    hw = dataclasses.replace(H100, memory_bandwidth_bytes_per_s=bandwidth)
    plan = Plan(gpus=8, tp=8, sequence_parallel=True, tp_comm_overlap=True, stack=stack,
                micro_batch=1, global_batch=1)
    return predict(model, hw, plan).breakdown_s["compute/tp_overlap"]


@pytest.mark.parametrize("name, passes_per_layer", [
    ("llama3-8b", 2),  # gated MLP: the forward's two
    ("gpt-22b", 3),  # ungated: and the MLP up's input gradient
])
def test_the_partials_sum_is_a_pass_over_the_output_per_fused_reduce_scatter(name,
                                                                            passes_per_layer):
    """With memory bandwidth to spare every GEMM of the chunk losses is compute-bound: halving it
    adds the sums' time alone, passes of 9/8 x tokens x hidden bf16 elements each at the
    effective bandwidth (the given one x the preset's efficiency)."""
    model = load_model(name)
    fast, slow = 1e15, 5e14
    added = _lost(model, "compiled", slow) - _lost(model, "compiled", fast)
    passes = passes_per_layer * model.layers * (8 + 1) / 8 * 2 * model.seq_len * model.hidden
    effective = H100.memory_bandwidth_efficiency
    assert added == pytest.approx(passes / (slow * effective) - passes / (fast * effective),
                                  rel=1e-6)
    assert _lost(model, "eager", slow) == pytest.approx(_lost(model, "eager", fast), rel=1e-9)
