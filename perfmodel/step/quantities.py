"""What a prediction reports besides time and memory: FLOPs, parameters, micro-batches, and each
part's raw times (what calibration.layers fits the measured framework costs against).

Model FLOPs: 3 x the forward's (forward + a backward of twice its FLOPs; Narayanan et al. SC21,
Eq. 3 without recompute), in two conventions:
  model_flops_per_step (what MFU is printed in): Megatron-LM's num_floating_point_operations
      (megatron/training/training.py, since 8873b55, 2025-03): the causal attention core counted
      as half of its s^2 products ("only half of the attention matrix is non-zero");
  model_flops_per_step_full_attention: the core counted whole, as torchtitan's
      get_num_flop_per_token (6 N + 12 L heads head_dim s per token) and Megatron-LM before 2025-03
      do (torchtitan's 6 N also counts the norms' weights: 12 h per layer and token, < 0.01%).
With a sliding window (perfmodel.costs.compute.attended_share) both the model's and a flash
kernel's core count the query-key pairs attended (each query min(i + 1, w) keys in a windowed
layer); the full-attention convention keeps s^2 in every layer, as torchtitan's formula does.
Hardware FLOPs: what the kernels execute: the unfused core's full s^2 products (3 x), or a flash
kernel's causal half (forward) and 2.5 x that (backward, which recomputes the scores); plus what
recompute repeats (full: every layer's forward; selective: the attention core; op: its recomputed
matmuls and an unfused core), never the logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.data_parallel import fsdp_copy_passes
from perfmodel.step.framework import BACKWARD_PER_FORWARD
from perfmodel.step.layer import attended_share, op_recomputed_gemm_share
from perfmodel.step.parameters import Parameters

ZERO, ONE = sp.Integer(0), sp.Integer(1)


def flops(c: Context) -> dict[str, sp.Expr]:
    """model_flops_per_step (Megatron-LM's convention: causal core halved),
    model_flops_per_step_full_attention (torchtitan's: the core whole) and
    hardware_flops_per_step (what the kernels execute); a multiply-add counts 2."""
    gemms = K.layer_gemms(c.T, S.b, S.s, S.h, S.a, S.kv, S.f, 1, c.gated, c.d)  # tp = 1: all
    core = sum((g.flops for g in gemms if g.name in K.ATTENTION_CORE), ZERO)
    linear = sum((g.flops for g in gemms if g.name not in K.ATTENTION_CORE), ZERO)
    logits = K.logits_gemm(c.T, S.h, S.V, S.tp).flops * S.tp
    steps = (1 + BACKWARD_PER_FORWARD) * c.m * S.dp
    attended = attended_share(c)  # 1/2 (causal), less with a sliding window
    model = steps * (S.L * (linear + attended * core) + logits)
    full_attention = steps * (S.L * (linear + core) + logits)
    # the core as it runs: a flash kernel its causal half (the pairs it attends), forward and
    # 2.5 x backward
    fused = attended * core
    core_run = c.flash * fused * (1 + K.FLASH_BACKWARD_PER_FORWARD) \
        + (1 - c.flash) * (1 + BACKWARD_PER_FORWARD) * core
    core_forward = c.flash * fused + (1 - c.flash) * core
    op_forward = op_recomputed_gemm_share(c) * linear + (1 - c.flash) * core
    hardware = steps * (S.L * linear + logits) + S.L * c.m * S.dp * (
        core_run + c.full * (linear + core_forward) + c.selective * core_forward
        + c.op * op_forward)
    return {"model_flops_per_step": model,
            "model_flops_per_step_full_attention": full_attention,
            "hardware_flops_per_step": hardware}


def _comm_s(phases: Sequence[Phase], per: sp.Expr = ONE) -> sp.Expr:
    """The phases' collectives with their fixed cost per call, per `per` (one layer of n) [s]."""
    return sum((x.time_s + S.t_coll * x.launches for p in phases for x in p.comms), ZERO) / per


def part_times(c: Context, forward_s: Mapping[str, sp.Expr], backward_s: Mapping[str, sp.Expr],
               phases: Mapping[str, Phase], collectives: Sequence[Collective],
               units: tuple[tuple[sp.Expr, sp.Expr], ...]) -> dict[str, sp.Expr]:
    """Per micro-batch on one rank, for one layer, the embedding and the output layer: forward_s
    and backward_s (the kernels' rooflines: BACKWARD_PER_FORWARD x the forward unless
    backward_s gives it), comm_forward_s and comm_backward_s (their
    collectives with the fixed cost per call), without what measured layer costs add; and one
    layer's FSDP unit: a gather of its weights and a reduce-scatter of its gradients, each with
    its copies."""
    n = c.layers_per_stage
    comm = {
        "layer": (_comm_s([phases["layers/forward"]], n),
                  _comm_s([phases["layers/backward"], phases["layers/recompute"]], n)),
        "embedding": (_comm_s([phases["embedding/forward"]]),
                      _comm_s([phases["embedding/backward"]])),
        "output": (_comm_s([phases["output/forward"]]), _comm_s([phases["output/backward"]])),
    }
    out = {}
    for part, fwd in forward_s.items():
        out[f"part:{part}:forward_s"] = fwd
        out[f"part:{part}:backward_s"] = backward_s.get(part, BACKWARD_PER_FORWARD * fwd)
        out[f"part:{part}:comm_forward_s"] = comm[part][0]
        out[f"part:{part}:comm_backward_s"] = comm[part][1]
    by_name = {x.name: x for x in collectives}
    unit_copies = fsdp_copy_passes(c) * units[0][1]
    out["part:fsdp_unit:gather_s"] = by_name["dp/fsdp_layer/all_gather"].call_s \
        + K.memory_time(S.wbytes * unit_copies, c.dev)
    out["part:fsdp_unit:reduce_s"] = by_name["dp/fsdp_layer/reduce_scatter"].call_s \
        + K.memory_time(S.gbytes * unit_copies, c.dev)
    return out


def quantities(c: Context, params: Parameters, parts: Mapping[str, sp.Expr]) -> dict[str, sp.Expr]:
    return {**parts, "micro_batches": c.m, **flops(c), "parameters": params.total,
            "parameters_per_gpu": params.per_gpu, "tokens_per_step": S.B * S.s}
