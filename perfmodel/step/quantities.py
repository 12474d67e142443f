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
An MoE layer counts k experts per token in both (Megatron-LM's moe_router_topk), times the
capacity factor where one below 1 drops assignments; its router's GEMM only in torchtitan's,
whose active parameters include the router (torchtitan/models/utils.py nparams_moe_router);
Megatron-LM's formula has no router term.
With a sliding window (perfmodel.costs.compute.attended_share) both the model's and a flash
kernel's core count the query-key pairs attended (each query min(i + 1, w) keys in a windowed
layer); the full-attention convention keeps s^2 in every layer, as torchtitan's formula does.
Hardware FLOPs: what the kernels execute: the unfused core's full s^2 products (3 x), or a flash
kernel's causal half (forward) and 2.5 x that (backward, which recomputes the scores); plus what
recompute repeats (full: every layer's forward; selective: the attention core and its other
modules' GEMMs, module_flops; op: its recomputed matmuls and an unfused core), never the logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import mla as MLA
from perfmodel.costs import moe as CM
from perfmodel.step import op_recompute as OP
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.data_parallel import FsdpUnit, fsdp_copy_passes
from perfmodel.step.framework import BACKWARD_PER_FORWARD
from perfmodel.step.layer import attended_share, op_recomputed_gemm_share
from perfmodel.step.parameters import Parameters

ZERO, ONE = sp.Integer(0), sp.Integer(1)


def flops(c: Context) -> dict[str, sp.Expr]:
    """model_flops_per_step (Megatron-LM's convention: causal core halved),
    model_flops_per_step_full_attention (torchtitan's: the core whole) and
    hardware_flops_per_step (what the kernels execute); a multiply-add counts 2."""
    T = c.tokens  # a replica's micro-batch (every cp rank's tokens)
    gemms = K.layer_gemms(T, S.b, S.s, S.h, S.a, S.kv, S.f, 1, c.gated, c.d)  # tp = 1: all
    core = sum((g.flops for g in gemms if g.name in K.ATTENTION_CORE), ZERO)
    linear = sum((g.flops for g in gemms if g.name not in K.ATTENTION_CORE), ZERO)
    if c.fam.mla:  # MLA's projections for QKV and the output; its core d_qk and d_v wide
        projections = MLA.mla_gemms(T, S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v, 1,
                                    q_lora=c.fam.mla_q_lora)
        standard = [g for g in gemms if g.name in ("qkv", "attention_output")]
        linear += sum((g.flops for g in projections), ZERO) - sum((g.flops for g in standard),
                                                                 ZERO)
        core = 2 * S.b * S.a * S.s**2 * (c.d_qk + c.d_v)
    logits = K.logits_gemm(T, S.h, S.V, S.tp).flops * S.tp
    steps = (1 + BACKWARD_PER_FORWARD) * c.m * S.dp
    layers_linear = S.L * linear  # every layer's linear FLOPs (model and hardware)
    layers_linear_hw = layers_linear
    if c.fam.moe:  # an MoE layer: the router, k of the experts (hardware: the padded rows
        # of a capacity), the shared experts, in place of the dense MLP
        from perfmodel.step.moe import moe_layers_total

        mlp = sum((g.flops for g in gemms if g.name in ("mlp_up", "mlp_down")), ZERO)
        expert = sum((g.flops for g in CM.expert_gemms(1, S.h, S.f_E, c.gated)), ZERO)
        routed = T * S.k_E
        if c.fam.moe_capacity:
            routed_hw = S.cp * c.act_ranks * S.E * CM.capacity(c.T / c.act_ranks, S.k_E, S.E,
                                                               S.c_E)
            # below a factor of 1 the dropped assignments skip the experts: the model's work
            # is the assignments computed (Megatron's formula counts all k, and prints an MFU
            # above 100% as the factor shrinks)
            routed = routed * sp.Min(ONE, S.c_E)
        else:
            routed_hw = routed
        # the router: torchtitan's count has it (its active parameters), Megatron-LM's not
        router = CM.router_gemm(T, S.h, S.E).flops
        routers = moe_layers_total(c) + (S.D_mtp if c.fam.mtp and c.fam.mtp_last_moe else 0)
        router_only = routers * router
        rest = router - mlp
        if c.fam.moe_shared:
            rest += sum((g.flops for g in CM.shared_gemms(T, S.h, S.f_sh, 1, c.gated)), ZERO)
        L_moe = moe_layers_total(c)
        layers_linear = layers_linear + L_moe * (rest + routed * expert)
        layers_linear_hw = S.L * linear + L_moe * (rest + routed_hw * expert)
    else:
        router_only = ZERO
    attended = attended_share(c)  # 1/2 (causal), less with a sliding window
    extra = extra_hw = ZERO
    if c.fam.mtp:  # the modules: a layer like the last, the projection, the output layer
        from perfmodel.step.mtp import mtp_flops

        last = linear + (rest + routed * expert if c.fam.mtp_last_moe else 0)
        last_hw = linear + (rest + routed_hw * expert if c.fam.mtp_last_moe else 0)
        extra = mtp_flops(c, last + attended * core, logits)
        extra_hw = mtp_flops(c, last_hw + attended * core, logits)
    model = steps * (layers_linear + S.L * attended * core + logits + extra - router_only)
    full_attention = steps * (layers_linear + S.L * core + logits
                              + extra + (S.D_mtp * attended * core if c.fam.mtp else 0))
    # the core as it runs: a flash kernel its causal half (the pairs it attends), forward and
    # 2.5 x backward
    fused = attended * core
    core_run = c.flash * fused * (1 + K.FLASH_BACKWARD_PER_FORWARD) \
        + (1 - c.flash) * (1 + BACKWARD_PER_FORWARD) * core
    core_forward = c.flash * fused + (1 - c.flash) * core
    op_forward = op_recomputed_gemm_share(c) * layers_linear_hw + S.L * (1 - c.flash) * core
    if c.fam.moe or c.fam.mla:  # the layers' recomputed matmuls (perfmodel.step.op_recompute)
        op_forward = S.L * (1 - c.flash) * core
        if c.fam.moe:
            from perfmodel.step.moe import moe_layers_total

            L_moe = moe_layers_total(c)
            op_forward += (S.L - L_moe) * OP.recomputed_flops(c, False, T) + L_moe * (
                OP.recomputed_flops(c, True, T) + routed_hw * expert)
        else:
            op_forward += S.L * OP.recomputed_flops(c, False, T)
    hardware = steps * (layers_linear_hw + logits + extra_hw) + c.m * S.dp * (
        S.L * core_run + c.full * (layers_linear_hw + S.L * core_forward)
        + S.L * c.core * core_forward + c.op * op_forward + module_flops(c, T, gemms))
    return {"model_flops_per_step": model,
            "model_flops_per_step_full_attention": full_attention,
            "hardware_flops_per_step": hardware}


def module_flops(c: Context, T: sp.Expr, gemms: Sequence[K.Gemm]) -> sp.Expr:
    """The GEMM FLOPs selective recompute's modules repeat in one micro-batch of a replica
    (perfmodel.step.layer.recompute_module_s): MLA's up projections in every layer, a dense
    layer's MLP, an MoE layer's shared experts (the routed experts' activation has none)."""
    if not set(c.fam.recompute_modules) - {"core_attn"}:
        return ZERO
    from perfmodel.step.moe import moe_layers_total

    moe_layers = moe_layers_total(c) if c.fam.moe else ZERO
    out = ZERO
    if c.fam.mla:
        up = [g for g in MLA.mla_gemms(T, S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v, 1,
                                       q_lora=c.fam.mla_q_lora)
              if g.name in ("q_up", "kv_up") or (g.name == "q" and not c.fam.mla_q_lora)]
        out += S.L * c.recomputes("mla_up_proj") * sum((g.flops for g in up), ZERO)
    mlp = sum((g.flops for g in gemms if g.name in ("mlp_up", "mlp_down")), ZERO)
    out += (S.L - moe_layers) * c.recomputes("mlp") * mlp
    if c.fam.moe_shared:
        shared = sum((g.flops for g in CM.shared_gemms(T, S.h, S.f_sh, 1, c.gated)), ZERO)
        out += moe_layers * c.recomputes("shared_experts") * shared
    return out


def _comm_s(phases: Sequence[Phase], per: sp.Expr = ONE) -> sp.Expr:
    """The phases' collectives with their fixed cost per call, per `per` (one layer of n) [s]."""
    return sum((x.time_s + S.t_coll * x.launches for p in phases for x in p.comms), ZERO) / per


def part_times(c: Context, forward_s: Mapping[str, sp.Expr], backward_s: Mapping[str, sp.Expr],
               phases: Mapping[str, Phase], collectives: Sequence[Collective],
               units: tuple[FsdpUnit, ...]) -> dict[str, sp.Expr]:
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
    passes = fsdp_copy_passes(c)
    out["part:fsdp_unit:gather_s"] = by_name["dp/fsdp_layer/all_gather"].call_s \
        + K.memory_time(passes * (S.wbytes * units[0].elements
                                  - c.zero3 * (S.wbytes - S.g8) * units[0].fp8), c.dev)
    out["part:fsdp_unit:reduce_s"] = by_name["dp/fsdp_layer/reduce_scatter"].call_s \
        + K.memory_time(S.gbytes * passes * units[0].elements, c.dev)
    return out


def quantities(c: Context, params: Parameters, parts: Mapping[str, sp.Expr]) -> dict[str, sp.Expr]:
    return {**parts, "micro_batches": c.m, **flops(c), "parameters": params.total,
            "parameters_per_gpu": params.per_gpu, "tokens_per_step": S.B * S.s}
