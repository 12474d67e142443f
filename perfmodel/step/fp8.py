"""What FP8 training adds beyond the layers' GEMMs: the casts of the GEMMs' inputs and grad outputs
(counted here, charged by perfmodel.step.layer), the weights' casts once per step, the FP8 weight
copies and the scaling state in memory (perfmodel.costs.fp8).

The FP8 weights of one layer on one GPU are its Transformer Engine linears' weight matrices (no
biases, norms):
    P_att       a standard attention's QKV and output, ((a d + 2 kv d) h + a d h) / tp; MLA's
                projections (perfmodel.costs.mla.mla_linear_weights): the up projections and the
                output / tp, the down projections whole on every tp rank
    P_mlp(w)    an MLP w wide, ((1 + gated) w h + w h) / tp
    dense layer P_lin = P_att + P_mlp(f)          (Megatron 1D; a 2d / 2.5d grid: / (q_a q_b))
    MoE layer   P_att + P_mlp(f_sh) (the shared experts, if any), and the rank's routed experts
                P_exp = E / ep x ((1 + gated) f_E h + f_E h) / etp (perfmodel.costs.moe.
                expert_params without biases); the router stays bf16 (Megatron-Core's TopKRouter
                is no TE linear: a torch linear in bf16 or fp32)
    MTP module  its layer's, and its 2h -> h projection 2 h h / tp (eh_proj, a TE column-parallel
                linear that Megatron-Core's MultiTokenPredictionLayer runs under FP8 autocast)
Scaling state: TE keeps one set per GEMM (3 forward tensors, 2 backward), a GroupedLinear one per
GEMM of its num_gemms, one for each local expert (transformer_engine/pytorch/module/base.py
set_meta_tensor: num_fp8_tensors = num_gemms x 3 forward, x 2 backward; grouped_linear.py
GroupedLinear(num_gemms): prepare_forward(inp, num_gemms=self.num_gemms)). GEMMs of a layer:
    standard attention 2 (QKV, output), MLA 5 (q_down, q_up, kv_down, kv_up, output; 4 with the
    query projection whole), dense MLP 2 (up with its gate, down), MoE layer the attention's +
    2 E / ep (each local expert's fc1 and fc2) + 2 (the shared experts), MTP module 1 + its layer's.
Per stage (n layers, n_moe of them MoE: perfmodel.step.moe.moe_layers; the MTP modules on the
last; o: 1 for the output layer in FP8, Plan.fp8_output_layer, on the stage holding it):
    W8          = (n - n_moe) P_lin + n_moe (P_att + P_mlp(f_sh)) + n_moe P_exp + [last] D P_mtp
                  + o V h / tp
    fp8/weight_copies   = c_w8 W8                                                          [B]
    fp8/scaling_state   = M_scale8 G                     G: the stage's GEMMs, as above    [B]
    T_fp8_wc    = q_w8 W8_all / W                                                  [s per step]
W8_all: the model's layers' FP8 weights on their ranks, (L - L_moe) P_lin + L_moe (P_att +
P_mlp(f_sh) + P_exp) + D P_mtp + o V h / tp (dense: L P_lin + o V h / tp).
Transformer Engine casts a weight on the first micro-batch of a step and caches both usages for
the others [TE-linear]: once per step (q_w8 = q_8). With the weights held in FP8 (fp8_params) the
copies are the weights (the `weights` term leaves them out: no bf16 copy; the routed experts'
share by the expert-data-parallel ZeRO divisor), the optimizer writes them, and a step only
transposes them on Hopper (q_w8 = 2; 0 on Blackwell); the distributed optimizer all-gathers them
at e_8 bytes, over dp x cp and the experts' over edp (perfmodel.step.data_parallel). Under ZeRO 3
with FP8 weights (Megatron FSDP's --fp8-param-gather) the copies are each rank's shard, e_8 W8 /
dp, and the gathered weights are transposed for every backward (perfmodel.step.memory.
fp8_zero3_terms, perfmodel.step.data_parallel.fp8_weight_casts).
The casts lie on the pipeline's fill: the first micro-batch's forward crosses every stage, each
casting its weights before its first GEMM, so a step pays the casts of all L layers' weights (the
stages' shares, one after the other): W8_all. The copies stay allocated (TE's per-module weight
workspaces), in every stage's memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import memory as M
from perfmodel.costs import mla as MLA
from perfmodel.costs import moe as CM
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context, active
from perfmodel.step.pipeline import STAGES

ZERO = sp.Integer(0)
ONE = sp.Integer(1)
FP8_GEMMS_PER_LAYER = 4  # QKV, attention output, MLP up (with its gate, one GEMM), MLP down
ATTENTION_GEMMS = 2  # QKV, attention output
MLP_GEMMS = 2  # up (with its gate), down: a dense MLP's, the shared experts', each local expert's
MTP_PROJECTION_GEMMS = 1  # an MTP module's eh_proj


def _tp_divisor(c: Context) -> sp.Expr:
    """What splits a layer's weight matrices on one GPU: tp (Megatron 1D and the 3d cube), q_a q_b
    (a 2d or 2.5d grid, copied over its depth), as perfmodel.step.parameters splits them."""
    return c.megatron * S.tp + c.grid2 * S.q_a * S.q_b + c.grid3 * S.tp


def attention_weights_per_gpu(c: Context) -> sp.Expr:
    """P_att: the attention's linear weights on one GPU (module doc)."""
    if c.fam.mla:  # modelled with tp_layout 1d (the plan rules)
        w = MLA.mla_linear_weights(S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v,
                                   q_lora=c.fam.mla_q_lora)
        return w["sharded"] / S.tp + w["replicated"]
    return M.linear_weights(S.h, S.a, S.kv, 0, gated=c.gated, d=c.d) / _tp_divisor(c)


def mlp_weights_per_gpu(c: Context, width: sp.Expr) -> sp.Expr:
    """P_mlp(w): an MLP w wide, up (and gate) and down, on one GPU."""
    return ((1 + c.gated) * width * S.h + width * S.h) / _tp_divisor(c)


def linear_weights_per_gpu(c: Context) -> sp.Expr:
    """P_lin: one dense layer's linear weight matrices on one GPU (module doc)."""
    if c.fam.mla:
        return attention_weights_per_gpu(c) + mlp_weights_per_gpu(c, S.f)
    lin = M.linear_weights(S.h, S.a, S.kv, S.f, gated=c.gated, d=c.d)
    return lin / _tp_divisor(c)


def moe_weights_per_gpu(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """One MoE layer's FP8 weights on one GPU: (the attention's and the shared experts', the
    rank's routed experts' P_exp)."""
    shared = mlp_weights_per_gpu(c, S.f_sh) if c.fam.moe_shared else ZERO
    experts = S.E / S.ep * CM.expert_params(S.h, S.f_E, gated=c.gated, bias=0, etp=S.etp)
    return attention_weights_per_gpu(c) + shared, experts


def attention_gemms(c: Context) -> int:
    """The attention's FP8 GEMMs: QKV and output, or MLA's projections."""
    if c.fam.mla:
        return len(MLA.mla_gemms(c.T, S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v, S.tp,
                                 q_lora=c.fam.mla_q_lora))
    return ATTENTION_GEMMS


def layer_gemms(c: Context, *, moe: bool = False) -> sp.Expr:
    """One layer's FP8 GEMMs with scaling state (module doc): a dense layer's, or an MoE
    layer's (2 E / ep for its local experts, 2 for the shared experts)."""
    if not moe:
        return sp.Integer(attention_gemms(c) + MLP_GEMMS)
    shared = MLP_GEMMS if c.fam.moe_shared else 0
    return attention_gemms(c) + shared + MLP_GEMMS * S.E / S.ep


def mtp_weights_per_gpu(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """The D MTP modules' FP8 weights on one GPU of the last stage: (their projections and their
    layers' but the routed experts', the routed experts')."""
    projection = M.MTP_PROJECTION * S.h * S.h / S.tp
    if c.fam.mtp_last_moe:
        rest, experts = moe_weights_per_gpu(c)
    else:
        rest, experts = linear_weights_per_gpu(c), ZERO
    return S.D_mtp * (projection + rest), S.D_mtp * experts


def output_weights_per_gpu(c: Context, counted: sp.Expr | None = None) -> sp.Expr:
    """o V h / tp: the output layer's weight when it runs in FP8 (Plan.fp8_output_layer), or
    where `counted` (0/1) says so."""
    return (c.fp8_output if counted is None else counted) * S.V * S.h / S.tp


def _moe_count(c: Context, stage: str) -> sp.Expr:
    if not c.fam.moe:
        return ZERO
    from perfmodel.step.moe import moe_layers

    return moe_layers(c)[stage]


def stage_fp8_weights(c: Context, stage: str, has_output: sp.Expr,
                      output: sp.Expr | None = None) -> tuple[sp.Expr, sp.Expr]:
    """The FP8 weights on one GPU of a stage (first, middle, last): (its layers' but the routed
    experts', with the MTP modules on the last stage (where perfmodel.step.parameters counts
    them) and, where the stage holds it with Plan.fp8_output_layer, the output layer's; the
    routed experts'). `output` (0/1): count the output layer's weight where that says instead
    (perfmodel.step.grad_accumulation: every linear layer's weight, FP8 or not)."""
    n, n_moe = c.stage_layers[stage], _moe_count(c, stage)
    dense, experts = (n - n_moe) * linear_weights_per_gpu(c), ZERO
    if c.fam.moe:
        moe_rest, moe_experts = moe_weights_per_gpu(c)
        dense, experts = dense + n_moe * moe_rest, n_moe * moe_experts
    if c.fam.mtp:  # beside the output layer
        mtp_rest, mtp_experts = mtp_weights_per_gpu(c)
        dense, experts = dense + has_output * mtp_rest, experts + has_output * mtp_experts
    return dense + has_output * output_weights_per_gpu(c, output), experts


def stage_fp8_gemms(c: Context, stage: str, has_output: sp.Expr) -> sp.Expr:
    """The FP8 GEMMs of a stage's rank with scaling state (module doc)."""
    n, n_moe = c.stage_layers[stage], _moe_count(c, stage)
    gemms = (n - n_moe) * layer_gemms(c)
    if c.fam.moe:
        gemms += n_moe * layer_gemms(c, moe=True)
    if c.fam.mtp:  # beside the output layer
        gemms += has_output * S.D_mtp * (MTP_PROJECTION_GEMMS
                                         + layer_gemms(c, moe=c.fam.mtp_last_moe))
    return gemms + has_output * c.fp8_output


def model_fp8_weights_per_gpu(c: Context) -> sp.Expr:
    """W8_all: every layer's FP8 weights on the ranks holding it, one rank of each stage, and
    the output layer's in FP8 (module doc)."""
    if not c.fam.moe:
        out = S.L * linear_weights_per_gpu(c)
    else:
        from perfmodel.step.moe import moe_layers_total

        L_moe = moe_layers_total(c)
        out = (S.L - L_moe) * linear_weights_per_gpu(c) + L_moe * sum(moe_weights_per_gpu(c))
    if c.fam.mtp:
        out += sum(mtp_weights_per_gpu(c))
    return out + output_weights_per_gpu(c)


def weight_cast_phase(c: Context, casts: sp.Expr = ONE) -> Phase:
    """The step's casts of the FP8 GEMMs' weights (module doc), memory-bound, `casts` times a
    step (perfmodel.step.data_parallel.fp8_weight_casts: once, but under ZeRO 3 with FP8
    weights once per gather)."""
    return Phase(name="fp8/weight_cast", per_step=True,
                 device={"compute/fp8_weight_cast":
                         K.memory_time(casts * S.qw8 * model_fp8_weights_per_gpu(c), c.dev)})


def memory_terms(c: Context, stage: str, has_output: sp.Expr) -> dict[str, sp.Expr]:
    """The FP8 weight copies and the scaling state on one GPU of a stage [B] (module doc)."""
    dense, experts = stage_fp8_weights(c, stage, has_output)
    return {"fp8/weight_copies": S.cw8 * (dense + experts),
            "fp8/scaling_state": S.M_scale8 * stage_fp8_gemms(c, stage, has_output)}


# --- the casts of the GEMMs' inputs and grad outputs, per layer and micro-batch ----------------

def attention_cast_elements(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """Elements one rank casts in a layer's attention, forward and backward: a standard
    attention's QKV and output (perfmodel.costs.compute.fp8_cast_elements less its MLP's), or
    MLA's projections (perfmodel.costs.mla.mla_fp8_cast_elements)."""
    T, h, r = c.T, S.h, c.act_ranks
    if c.fam.mla:
        return MLA.mla_fp8_cast_elements(T, h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v,
                                         S.tp, r, q_lora=c.fam.mla_q_lora)
    forward, backward = K.fp8_cast_elements(T, h, S.a, S.kv, 0, S.tp, r, c.gated, c.d)
    return forward - T * h / r, backward - T * h / r


def mlp_cast_elements(c: Context, width: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """Elements one rank casts in an MLP w wide (a dense MLP, the shared experts), forward (its
    up input T h / r, its down input T w / tp) and backward (the grad outputs of down, T h / r,
    and of up, T (1 + gated) w / tp)."""
    T, h, r, tp = c.T, S.h, c.act_ranks, S.tp
    return T * h / r + T * width / tp, T * h / r + T * (1 + c.gated) * width / tp


def gathered_tensors(c: Context, *, moe: bool = False
                     ) -> tuple[tuple[sp.Expr, ...], tuple[sp.Expr, ...]]:
    """The FP8 tensors sequence parallelism all-gathers in one layer per micro-batch, each as its
    elements whole (after the gather): (the column-parallel GEMMs' inputs, gathered in the
    forward and again in the backward; the row-parallel GEMMs' grad outputs, gathered in the
    backward). A standard attention's QKV input and its output projection's grad output, T h
    each; MLA's latents the up projections read, T r_q (with q_lora) and T r_kv (perfmodel.costs.
    mla.mla_fp8_cast_elements), and its output projection's grad output, T h; a dense MLP's (or
    the shared experts') up input and down grad output, T h each; the routed experts' tokens
    reach them through the dispatcher, not a sequence-parallel gather. Each is 0 without sequence
    parallelism, with tp = 1 or on a grid (Megatron 1D only): sequence_gathered."""
    gathered = c.T * sequence_gathered(c)
    whole = gathered * S.h
    if c.fam.mla:
        inputs = (*((gathered * S.r_q,) if c.fam.mla_q_lora else ()), gathered * S.r_kv)
    else:
        inputs = (whole,)
    if not moe or c.fam.moe_shared:
        return (*inputs, whole), (whole, whole)
    return inputs, (whole,)


def sequence_gathered(c: Context) -> sp.Expr:
    """1 where sequence parallelism gathers the layers' activations over tp (Megatron 1D with it,
    tp > 1), else 0."""
    return c.megatron * c.split * active(S.tp)


def gathered_elements(c: Context, *, moe: bool = False) -> tuple[sp.Expr, sp.Expr]:
    """(G_f, G_b): the elements of gathered_tensors in each direction."""
    forward, backward = gathered_tensors(c, moe=moe)
    return sp.Add(*forward), sp.Add(*backward)


def layer_cast_bytes(c: Context, forward: sp.Expr, backward: sp.Expr, *,
                     moe: bool = False) -> tuple[sp.Expr, sp.Expr]:
    """Bytes one rank's FP8 casts move in a layer, forward and backward, per micro-batch, from the
    elements it casts (layer_cast_elements; an MoE layer's, perfmodel.step.layer.
    moe_fp8_cast_elements): q_8 each, less the columnwise copy a shard gathered in its rowwise
    copy does not write (t_8 / 2 for each of its G / tp elements), plus the backward's
    transposes of the gathered tensors, t_8 for each of their G elements (perfmodel.costs.fp8,
    gathered_transpose; gathered_elements):
        forward  = q_8 F - t_8 / 2 x G_f / tp
        backward = q_8 B - t_8 / 2 x G_b / tp + t_8 (G_f + G_b)"""
    g_forward, g_backward = gathered_elements(c, moe=moe)
    return (S.q8 * forward - S.t8 / 2 * g_forward / S.tp,
            S.q8 * backward - S.t8 / 2 * g_backward / S.tp + S.t8 * (g_forward + g_backward))


def layer_cast_elements(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """Elements one rank casts in a dense layer, forward and backward (an MoE layer's:
    perfmodel.step.layer.moe_fp8_cast_elements)."""
    if c.fam.mla:
        attention, mlp = attention_cast_elements(c), mlp_cast_elements(c, S.f)
        return attention[0] + mlp[0], attention[1] + mlp[1]
    return K.fp8_cast_elements(c.T, S.h, S.a, S.kv, S.f, S.tp, c.act_ranks, c.gated, c.d)


# --- delayed scaling's amax reductions, per model chunk and micro-batch -------------------------

AMAX_BYTES = 4  # an fp32 amax
# the amaxes of one FP8 GEMM reduced in each direction: TE's forward scaling tensors (input,
# weight, output) and backward ones (grad output, grad input); perfmodel.costs.fp8
FORWARD_AMAXES, BACKWARD_AMAXES = 3, 2
AMAX = "fp8_amax"  # the phases: fp8_amax/forward, fp8_amax/backward


def amax_collectives(c: Context) -> list[Collective]:
    """Delayed scaling's amax reductions (Family.fp8_recipe). Transformer Engine
    all-reduces (MAX) the amaxes its modules recorded when the outermost fp8_autocast exits, and
    the backward's in the backward of the autocast's first module, with async_op=False: the next
    kernel waits (transformer_engine/pytorch/quantization.py, reduce_and_update_fp8_tensors, at
    d0067d0); over Megatron-Core's amax reduction group, every tp x dp x cp rank of a pipeline
    stage (parallel_state.get_amax_reduction_group(with_context_parallel=True), axis tp_dp_cp).
    Under delayed scaling Megatron-Core wraps a model chunk's whole block in one fp8_autocast
    (transformer_block.py, use_outer_quantization_context at d98e8a64), so in each micro-batch
    each of the rank's v chunks issues one forward and one backward reduction of 4 bytes x 3
    (forward) or 2 (backward) amaxes per FP8 GEMM of the chunk (G / v, G the first stage's
    GEMMs with scaling state, stage_fp8_gemms), exposed. Not counted: a recomputed forward's (TE
    restores the forward's scaling state for it), the MTP modules' own autocast."""
    if c.fam.fp8_recipe != "delayed":
        return []
    chunk_gemms = stage_fp8_gemms(c, "first", ZERO) / S.v
    return [Collective(name="tp_dp_cp/fp8_amax/all_reduce", op="all_reduce", axis="tp_dp_cp",
                       nbytes=AMAX_BYTES * amaxes * chunk_gemms, calls=S.v, phase=phase,
                       in_phase=f"{AMAX}/{direction}", term="comm/fp8_amax", fam=c.fam)
            for phase, direction, amaxes in (("fwd", "forward", FORWARD_AMAXES),
                                             ("bwd", "backward", BACKWARD_AMAXES))]


def amax_phases(issued: Mapping[str, tuple[Collective, ...]]) -> tuple[Phase, ...]:
    """A stage's amax reductions in one micro-batch, exposed (amax_collectives); none without
    delayed scaling."""
    return tuple(Phase(name=f"{AMAX}/{direction}", comms=issued[f"{AMAX}/{direction}"])
                 for direction in ("forward", "backward") if f"{AMAX}/{direction}" in issued)


# --- current scaling's amax reductions over tp, per gathered shard --------------------------------

def tp_amax_collectives(c: Context) -> list[Collective]:
    """Current scaling's amax reductions with sequence parallelism. A shard that is gathered in
    FP8 needs the scale of the whole tensor: Transformer Engine gives the quantizer of a
    column-parallel GEMM's input and of a row-parallel GEMM's grad output the tp group
    (set_quantizer_amax_reduction_group in layernorm_linear.py and linear.py, at d0067d0), and
    the cast all-reduces its amax over it and waits (quantizer.cpp: allreduce(...)->wait()),
    4 bytes each. Per layer and micro-batch, one for each tensor of gathered_tensors (a dense
    layer's, an MoE layer's), forward and backward. Declared per stage (phases
    layers@<stage>/...), exposed. Not counted: a recomputed forward's (Megatron-Core's full
    recompute casts again)."""
    if c.fam.fp8_recipe != "current":
        return []
    from perfmodel.step.moe import moe_layers

    moe = moe_layers(c) if c.fam.moe else {st: ZERO for st in STAGES}
    dense_layer, moe_layer = gathered_tensors(c), gathered_tensors(c, moe=True)
    out = []
    for st in STAGES:
        dense, experts = c.stage_layers[st] - moe[st], moe[st]
        share = ONE if st == "first" else c.multi
        for phase, direction, i in (("fwd", "forward", 0), ("bwd", "backward", 1)):
            calls = dense * len(dense_layer[i]) + experts * len(moe_layer[i])
            out.append(Collective(name="tp/fp8_amax/all_reduce", op="all_reduce", axis="tp",
                                  nbytes=sp.Integer(AMAX_BYTES),
                                  calls=sequence_gathered(c) * calls, phase=phase,
                                  in_phase=f"layers@{st}/{direction}", term="comm/fp8_amax",
                                  fam=c.fam, stage=st, ledger_share=share))
    return out
