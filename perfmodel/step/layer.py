"""One transformer layer on one rank: its forward's device time, and its three phases in a
micro-batch (forward, backward, recompute).

Forward of one layer, one micro-batch [s] (perfmodel.costs.compute; Megatron-LM's layer):
    t_gemm      = the four linear layers' GEMMs (QKV, attention output, MLP up (and gate), down);
                  on a 2d / 2.5d / 3d grid their blocks (perfmodel.costs.layouts)
    t_attention = unfused: the scores and context GEMMs (all s^2 of them) + the softmax and
                  dropout bytes / W (Megatron's fused scale-mask-softmax; op by op, kernels
                  eager, the validation job's mask, softmax, scaling and copies:
                  perfmodel.costs.compute.eager_unfused_attention_bytes);
                  flash: one compute-bound kernel doing the causal half of those FLOPs at the
                  hardware's measured flash efficiency (perfmodel.costs.compute.flash_attention_s),
                  no s^2 bytes; where the hardware has no measured kernel, those FLOPs as GEMMs
    t_elementwise = norms, activation, dropout-adds, rotary embedding bytes / W, by how the
                  plan's kernels run them (perfmodel.strategy.Kernels; elementwise_traffic):
                  fused (Megatron-Core / TE), eager (torchtitan's modules op by op: their own
                  backward) or compiled (Inductor: fused, with the grouped K and V expanded)
    t_fp8_cast  = fp8 plans: the casts of the FP8 GEMMs' inputs, q_8 x elements / W
                  (perfmodel.step.fp8.layer_cast_elements: a standard attention's and MLP's,
                  perfmodel.costs.compute.fp8_cast_elements, or MLA's projections'; an MoE
                  layer's, perfmodel.step.moe; their grad outputs in the backward), with
                  sequence parallelism less the gathered shards' columnwise copies and plus
                  the backward's transposes of the gathered tensors
                  (perfmodel.step.fp8.layer_cast_bytes)
An fp8 plan's linear-layer GEMMs (MLA's projections among them) run on the FP8 device (peak
F_peak^fp8, its own GEMM fit), read e_8-byte operands and write bf16 (perfmodel.costs.fp8;
perfmodel.step.context.linear_gemm_time); a sliding window shrinks a flash kernel's
FLOPs to the pairs it attends (perfmodel.costs.compute.attended_share).
Backward = 2 x forward (eager element-wise ops and an unfused core run op by op: the bytes
autograd's backward of each moves): a
GEMM's input gradient and its weight gradient each cost one forward
(Narayanan et al. SC21, appendix on FLOPs); a flash kernel's backward 2.5 x its forward's FLOPs
(it recomputes the scores; FlashAttention-2, Sec. 4.1) at its backward efficiency. Recompute
repeats the forward (full) or the attention core (selective) before the backward (Korthikanti et
al. 2022, Sec. 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import layouts as LY
from perfmodel.costs import mla as MLA
from perfmodel.costs.lattice import times
from perfmodel.family import Family
from perfmodel.step import fp8 as FP8
from perfmodel.step import op_recompute as OP
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context, linear_gemm_time
from perfmodel.step.framework import (
    BACKWARD_PER_FORWARD,
    PartCost,
    eager_bias_grads,
    eager_input_sums,
    eager_qkv_split,
)

ZERO = sp.Integer(0)


@dataclass(frozen=True)
class LayerWork:
    """Device time of one layer's forward on one rank, per micro-batch [s], and of its
    attention's backward (the rest of the backward is BACKWARD_PER_FORWARD x the forward); or
    of several layers together (`+`, `times`: a stage's layers)."""

    gemm_s: sp.Expr
    attention_s: sp.Expr
    elementwise_s: sp.Expr
    attention_backward_s: sp.Expr
    # fp8 plans: the casts to FP8 of the GEMMs' inputs (forward) and grad outputs (backward);
    # None for other plans (no term)
    fp8_cast_s: sp.Expr | None = None
    fp8_cast_backward_s: sp.Expr | None = None
    # the element-wise ops' backward; None: BACKWARD_PER_FORWARD x their forward
    elementwise_backward_s: sp.Expr | None = None
    # the forward of each part selective recompute can repeat beyond the attention core
    # (perfmodel.strategy.RECOMPUTE_MODULES: mla_up_proj, mlp, moe_act, shared_experts,
    # layernorm), of
    # these layers; a part they lack is absent
    module_s: tuple[tuple[str, sp.Expr], ...] = ()
    # what torchtitan's per-op recompute repeats of these layers where they count their own
    # matmuls (MLA, a mixture of experts: perfmodel.step.op_recompute); None: the dense share
    per_op_s: sp.Expr | None = None

    @property
    def total_s(self) -> sp.Expr:
        return self.gemm_s + self.attention_s + self.elementwise_s + (self.fp8_cast_s or ZERO)

    @property
    def elementwise_back_s(self) -> sp.Expr:
        """The element-wise ops' backward [s]."""
        if self.elementwise_backward_s is None:
            return BACKWARD_PER_FORWARD * self.elementwise_s
        return self.elementwise_backward_s

    @property
    def backward_s(self) -> sp.Expr:
        return BACKWARD_PER_FORWARD * self.gemm_s + self.elementwise_back_s \
            + self.attention_backward_s + (self.fp8_cast_backward_s or ZERO)

    def module(self, name: str) -> sp.Expr:
        """The forward of the recompute module `name` in these layers [s] (0 where they have
        none)."""
        return dict(self.module_s).get(name, ZERO)

    def times(self, n: sp.Expr) -> LayerWork:
        """n such layers (n is 0 for a kind a stage lacks: lattice.times, not sympy's product,
        which asks every node under each term whether it is infinite)."""
        def of(t: sp.Expr) -> sp.Expr:
            return times(n, t)

        return LayerWork(of(self.gemm_s), of(self.attention_s), of(self.elementwise_s),
                         of(self.attention_backward_s),
                         None if self.fp8_cast_s is None else of(self.fp8_cast_s),
                         None if self.fp8_cast_backward_s is None
                         else of(self.fp8_cast_backward_s),
                         None if self.elementwise_backward_s is None
                         else of(self.elementwise_backward_s),
                         tuple((k, of(t)) for k, t in self.module_s),
                         None if self.per_op_s is None else of(self.per_op_s))

    def __add__(self, other: LayerWork) -> LayerWork:
        def add(x: sp.Expr | None, y: sp.Expr | None) -> sp.Expr | None:
            return None if x is None and y is None else (x or ZERO) + (y or ZERO)

        return LayerWork(self.gemm_s + other.gemm_s, self.attention_s + other.attention_s,
                         self.elementwise_s + other.elementwise_s,
                         self.attention_backward_s + other.attention_backward_s,
                         add(self.fp8_cast_s, other.fp8_cast_s),
                         add(self.fp8_cast_backward_s, other.fp8_cast_backward_s),
                         None if self.elementwise_backward_s is None
                         and other.elementwise_backward_s is None
                         else self.elementwise_back_s + other.elementwise_back_s,
                         tuple((k, self.module(k) + other.module(k)) for k in dict.fromkeys(
                             [k for k, _ in self.module_s + other.module_s])),
                         add(self.per_op_s, other.per_op_s))

    def forward_terms(self) -> dict[str, sp.Expr]:
        """The forward, by term compute/forward/<part>."""
        out = {"compute/forward/gemm": self.gemm_s,
               "compute/forward/attention": self.attention_s,
               "compute/forward/elementwise": self.elementwise_s}
        if self.fp8_cast_s is not None:
            out["compute/forward/fp8_cast"] = self.fp8_cast_s
        return out

    def backward_terms(self) -> dict[str, sp.Expr]:
        """The backward, by term compute/backward/<part>."""
        out = {"compute/backward/gemm": BACKWARD_PER_FORWARD * self.gemm_s,
               "compute/backward/attention": self.attention_backward_s,
               "compute/backward/elementwise": self.elementwise_back_s}
        if self.fp8_cast_backward_s is not None:
            out["compute/backward/fp8_cast"] = self.fp8_cast_backward_s
        return out


def attention_core_gemms(c: Context) -> list[K.Gemm]:
    """The attention core's two batched products on one rank: scores Q K^T (d_qk wide) and
    context A V (d_v wide), heads split over tp and the queries over cp (each cp rank computes
    its s / cp queries against all s keys, whichever way K and V reach it)."""
    s, b, cp = S.s, S.b, S.cp
    heads = b * S.a / S.tp
    return [K.Gemm("attention_scores", s / cp, s, c.d_qk, batch=heads),
            K.Gemm("attention_context", s / cp, c.d_v, s, batch=heads)]


def layer_gemms(c: Context, *, moe: bool = False) -> list[K.Gemm]:
    """One layer's forward GEMMs on one rank over its c.T = b s / cp tokens: the attention's
    projections (Megatron 1D: QKV and output, or MLA's, perfmodel.costs.mla), the core
    (attention_core_gemms) and, in a dense layer, the MLP (up and gate, down); an MoE layer's MLP
    is perfmodel.step.moe's."""
    h, a, kv, f, s, b, tp = S.h, S.a, S.kv, S.f, S.s, S.b, S.tp
    gemms = {g.name: g for g in K.layer_gemms(c.T, b, s, h, a, kv, f, tp, c.gated, c.d)}
    gemms.update({g.name: g for g in attention_core_gemms(c)})
    if c.fam.mla:
        del gemms["qkv"]
        gemms.update({g.name: g for g in MLA.mla_gemms(c.T, h, a, S.r_q, S.r_kv, S.d_nope,
                                                       S.d_rope, S.d_v, tp,
                                                       q_lora=c.fam.mla_q_lora,
                                                       T_down=c.T / c.act_ranks)})
    if moe:
        del gemms["mlp_up"], gemms["mlp_down"]
    return list(gemms.values())


_WORK: dict[tuple[Family, bool], LayerWork] = {}


def layer_work(c: Context, *, moe: bool = False) -> LayerWork:
    """One layer's forward: GEMMs (Megatron 1D, or a grid's blocks), attention, element-wise,
    and an fp8 plan's casts; an MoE layer's MLP from perfmodel.step.moe. Built once per family
    and kind (the stages, the MTP modules and the parts ask for it again)."""
    key = (c.fam, moe)
    if key not in _WORK:
        _WORK[key] = _layer_work(c, moe)
    return _WORK[key]


def _layer_work(c: Context, moe: bool) -> LayerWork:
    h, a, kv, f, s, b, tp, e = S.h, S.a, S.kv, S.f, S.s, S.b, S.tp, S.e
    gemm_t = {g.name: K.gemm_time(g, e, c.dev) if g.name in K.ATTENTION_CORE
              else linear_gemm_time(c, g) for g in layer_gemms(c, moe=moe)}
    if c.fam.tp_layout != "1d":  # the grid layouts replace the four linear layers' GEMMs
        for name, K_, M_ in LY.linear_shapes(h, a, kv, f, c.gated, c.d):
            grid = LY.grid_gemms(name, c.T, K_, M_, S.q_a, S.q_c)
            grid_t = times(c.grid2, linear_gemm_time(c, grid["2d"])) \
                + times(c.grid3, linear_gemm_time(c, grid["3d"]))
            gemm_t[name] = times(c.megatron, gemm_t[name]) + grid_t
    ew = K.elementwise_bytes(c.T, b, s, h, a, f, tp, e, sequence_parallel=c.split,
                             flash=c.flash, gated=c.gated, dropout=c.dropout,
                             attention_dropout=c.attention_dropout)
    # each cp rank holds s / cp of the s^2 scores an unfused softmax reads and writes: in one
    # fused kernel (Megatron's scale-mask-softmax; backward twice its bytes), or op by op as
    # the validation job's core runs them (kernels eager: eager_unfused_attention_bytes)
    dropout = ew["attention_dropout"] / S.cp
    by_op = K.eager_unfused_attention_bytes(
        scores=S.a * b * s**2 / (tp * S.cp), mask=s**2 / S.cp,
        q_elements=c.T * a * c.d_qk / tp, kv_elements=c.T * c.kv_heads * c.d_qk / tp, e=e,
        gqa=c.gqa)
    eager = c.eager_kernels
    quadratic = (1 - eager) * ew["softmax"] / S.cp + eager * by_op[0] + dropout
    quadratic_backward = (1 - eager) * BACKWARD_PER_FORWARD * ew["softmax"] / S.cp \
        + eager * by_op[1] + BACKWARD_PER_FORWARD * dropout
    core_gemms_s = sum((gemm_t[n] for n in K.ATTENTION_CORE), ZERO)
    unfused_s = core_gemms_s + K.memory_time(quadratic, c.dev)
    unfused_backward_s = BACKWARD_PER_FORWARD * core_gemms_s \
        + K.memory_time(quadratic_backward, c.dev)
    fused_s, fused_backward_s = flash_attention(c, core_gemms_s)
    # as modelled under every plan's kernels: MLA's latent RMSNorms (read and write
    # e T (r_q + r_kv)) and an MoE layer's routed MLP (perfmodel.step.moe)
    common = ZERO
    if c.fam.mla:
        common += 2 * e * c.T * ((S.r_q if c.fam.mla_q_lora else 0) + S.r_kv)
    gemm_s = sum((t for n, t in gemm_t.items() if n not in K.ATTENTION_CORE), ZERO)
    experts_s = ZERO
    if moe:
        from perfmodel.step.moe import expert_extra_bytes, moe_mlp_work, routed_experts_s

        mlp_gemm_s, mlp_elementwise = moe_mlp_work(c)
        gemm_s, common = gemm_s + mlp_gemm_s, common + mlp_elementwise
        experts_s = routed_experts_s(c)  # the routed experts' alone (no router, shared experts)
        # Megatron-Core's experts' passes beyond their fused kernel, backward not 2 x forward
        extra_forward, extra_backward = expert_extra_bytes(c)
    else:
        extra_forward = extra_backward = ZERO
    ew_forward, ew_backward = elementwise_traffic(c, ew, moe)
    modules = recompute_module_s(c, gemm_t, ew, moe)
    attention_s = c.flash * fused_s + (1 - c.flash) * unfused_s
    elementwise_s = K.memory_time(common + ew_forward + extra_forward, c.dev)
    per_op_s = None
    if c.fam.moe or c.fam.mla:  # per-op recompute as torchtitan's modules call their matmuls
        per_op_s = OP.recompute_s(c, moe, elementwise_s, attention_s, experts_s)
    cast_s = cast_backward_s = None
    if c.fam.fp8:
        if moe:  # the attention's casts, then the routed and shared experts' (moe.py)
            forward, backward = moe_fp8_cast_elements(c)
        else:
            forward, backward = FP8.layer_cast_elements(c)
        forward, backward = FP8.layer_cast_bytes(c, forward, backward, moe=moe)
        cast_s = K.memory_time(forward, c.dev)
        cast_backward_s = K.memory_time(backward, c.dev)
    return LayerWork(
        gemm_s=gemm_s,
        attention_s=attention_s,
        elementwise_s=elementwise_s,
        attention_backward_s=c.flash * fused_backward_s + (1 - c.flash) * unfused_backward_s,
        fp8_cast_s=cast_s, fp8_cast_backward_s=cast_backward_s,
        elementwise_backward_s=K.memory_time(BACKWARD_PER_FORWARD * common + ew_backward
                                              + extra_backward, c.dev),
        module_s=modules,
        per_op_s=per_op_s,
    )


def recompute_module_s(c: Context, gemm_t: Mapping[str, sp.Expr], ew: Mapping[str, sp.Expr],
                       moe: bool) -> tuple[tuple[str, sp.Expr], ...]:
    """The forward of each part of one layer that selective recompute's modules repeat [s]
    (only those the family's plan names, perfmodel.strategy.RECOMPUTE_MODULES):
        mla_up_proj     MLA's up projections (q_up, or the query projection without a query
                        latent, and kv_up) and the rotary embedding of what they give
        mlp             a dense layer's MLP: up (and gate), down, and its activation's bytes
        moe_act         the routed experts' activation: (2 + gated) e A_r f_E bytes / W
        shared_experts  the shared experts' GEMMs and activation (perfmodel.step.moe)
        layernorm       an MoE layer's pre-MLP norm: reads its input, writes its output,
                        2 e T h / r bytes / W
    An fp8 plan's recomputed GEMMs cast their inputs again: not counted (a small share of the
    casts)."""
    names = set(c.fam.recompute_modules) - {"core_attn"}
    out: list[tuple[str, sp.Expr]] = []
    if "mla_up_proj" in names and c.fam.mla:
        n_q, n_k = rope_elements(c)
        up = gemm_t["q_up" if c.fam.mla_q_lora else "q"] + gemm_t["kv_up"]
        out.append(("mla_up_proj", up + K.memory_time(K.fused_rope_bytes(n_q, n_k, S.e),
                                                      c.dev)))
    if "mlp" in names and not moe:
        out.append(("mlp", gemm_t["mlp_up"] + gemm_t["mlp_down"]
                    + K.memory_time(ew["activation"], c.dev)))
    if moe and "layernorm" in names:
        out.append(("layernorm", K.memory_time(2 * S.e * c.T * S.h / c.act_ranks, c.dev)))
    if moe and names & {"moe_act", "shared_experts"}:
        from perfmodel.step.moe import moe_act_s, shared_experts_s

        if "moe_act" in names:
            out.append(("moe_act", moe_act_s(c)))
        if "shared_experts" in names and c.fam.moe_shared:
            out.append(("shared_experts", shared_experts_s(c)))
    return tuple(out)


def rope_elements(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """Elements of the queries and keys one rank rotates in a layer (0 with learned positions):
    T a d / tp and T kv d / tp; MLA: the rotary parts only, T a d_rope / tp of the queries and
    the one shared key head, T d_rope, on every tp rank (DeepSeek-V2, Sec. 2.1.3)."""
    if c.fam.mla:
        return c.rotary * c.T * S.a * S.d_rope / S.tp, c.rotary * c.T * S.d_rope
    return c.rotary * c.T * S.a * c.d / S.tp, c.rotary * c.T * S.kv * c.d / S.tp


def elementwise_traffic(c: Context, ew: Mapping[str, sp.Expr],
                        moe: bool) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) bytes of a layer's norms, rotary embedding, activation (a dense
    layer's) and residual adds on one rank, by the plan's kernels (perfmodel.strategy.Kernels):

        fused:    norms + dropout-adds + activation (perfmodel.costs.compute.elementwise_bytes,
                  backward 2 x forward) + fused RoPE, 2 e (N_q + N_k) each way (whole heads
                  read and written, however much of each RoPE rotates: fused_rope_bytes)
        compiled: fused + the grouped-query K and V expanded for the attention kernel,
                  2 e N_rep each way where a > kv (gqa_expand_bytes)
        eager:    torchtitan's layer op by op, each op's forward and autograd backward
                  (eager_elementwise_bytes; a model whose RoPE rotates r < 1 of each head:
                  the rotation's ops on that share, and the split and concatenation around
                  them, rope_split_bytes)
    """
    e, T, tp = S.e, c.T, S.tp
    n_q, n_k = rope_elements(c)
    dense = 0 if moe else 1
    fused = ew["layernorm"] + ew["dropout_add"] + dense * ew["activation"]
    rope = K.fused_rope_bytes(n_q, n_k, e)
    expanded = T * S.a * c.d_qk / tp  # K (or V) with every query head (MLA: a heads anyway)
    expand = c.compiled_kernels * K.gqa_expand_bytes(expanded, e, c.gqa)
    bias_elements, _ = eager_bias_grads(c, moe)
    eager = K.eager_elementwise_bytes(
        norm_elements=T * S.h / c.act_ranks, q_elements=n_q, k_elements=n_k,
        kv_elements=T * c.kv_heads * c.d_qk / tp, expanded_elements=expanded,
        mlp_elements=dense * T * S.f / tp, attention_elements=T * S.a * c.d_v / tp, e=e,
        layernorm=c.layernorm, gated=c.gated, gqa=c.gqa, flash=c.flash, rotary=1,
        rotary_fraction=S.r_rot if c.fam.partial_rotary else 1,
        partial=int(c.fam.partial_rotary), bias_elements=bias_elements,
        norm_weight_pass=int(c.asynchronous), input_elements=T * S.h,
        input_sums=eager_input_sums(c, moe), split_elements=eager_qkv_split(c))
    eager_fwd = sum((fwd for fwd, _ in eager.values()), ZERO)
    eager_bwd = sum((bwd for _, bwd in eager.values()), ZERO)
    built = 1 - c.eager_kernels  # fused or compiled
    return (built * (fused + rope + expand) + c.eager_kernels * eager_fwd,
            built * (BACKWARD_PER_FORWARD * fused + rope + expand) + c.eager_kernels * eager_bwd)


def stage_work(c: Context, stage: str) -> LayerWork:
    """The layers of a stage (first, middle or last; perfmodel.step.context.stage_layers) in one
    micro-batch: its dense layers and, in a mixture of experts, its MoE layers
    (perfmodel.step.moe.moe_layers)."""
    n = c.stage_layers[stage]
    if not c.fam.moe:
        return layer_work(c).times(n)
    from perfmodel.step.moe import moe_layers

    moe = moe_layers(c)[stage]
    return layer_work(c).times(n - moe) + layer_work(c, moe=True).times(moe)


def full_recomputed(c: Context, stage: str) -> tuple[sp.Expr, sp.Expr]:
    """(dense, MoE) layers full recompute repeats of a stage's n (first, middle or last), whole
    layers as the job picks them (0 under the other policies):
        n_rc,moe   = perfmodel.step.moe.moe_recomputed   (the MoE layers among them)
        n_rc,dense = full_layers(n) - n_rc,moe            (Context.full_layers)
    Not full x n_dense and full x n_moe, the share of all the stage's layers applied to each
    kind: 4 layers, layer 0 dense, one in 2 recomputed (layers 1 and 3, both MoE) are 0 dense and
    2 MoE layers, not 0.5 and 1.5. A dense model's stay full x n (the first stage's share applied
    to n); where a pipeline layout places the dense layers (Family.stage_dense) the share of
    each kind, full x n_dense and full x n_moe (moe_recomputed)."""
    n = c.stage_layers[stage]
    if not c.fam.moe:
        return c.full * n, ZERO
    from perfmodel.step.moe import moe_layers, moe_recomputed

    moe, moe_rc = moe_layers(c)[stage], moe_recomputed(c)[stage]
    if c.fam.stage_dense is not None:
        return c.full * (n - moe), moe_rc
    return c.full_layers(n) - moe_rc, moe_rc


def full_recompute_s(c: Context, stage: str, work: LayerWork) -> sp.Expr:
    """What full recompute repeats of a stage's layers in one micro-batch [s]: the forward of
    each layer it recomputes (full_recomputed), a dense layer's or an MoE layer's,
        n_rc,dense x t_dense + n_rc,moe x t_moe
    (work: the stage's layers, stage_work; a dense model's, full x their forward)."""
    if not c.fam.moe:
        return times(c.full, work.total_s)
    dense, moe = full_recomputed(c, stage)
    return times(dense, layer_work(c).total_s) + times(moe, layer_work(c, moe=True).total_s)


def attended_share(c: Context) -> sp.Expr:
    """The query-key pairs a layer attends over s^2, on average over the layers: 1/2 (causal), or
    with a sliding window in a share rho_w of the layers (1 - rho_w) / 2 + rho_w P(w) / s^2
    (perfmodel.costs.compute.attended_share)."""
    if c.fam.windowed:
        return K.attended_share(S.s, S.w, S.rho_w)
    return K.CAUSAL_FRACTION


def flash_attention(c: Context, core_gemms_s: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) of one layer's fused causal attention on one rank [s].

    Measured kernel (I_fa = 1): the causal half of the core's FLOPs (forward) and 2.5 x that
    (backward) at the hardware's flash efficiencies (perfmodel.costs.compute.flash_attention_s).
    Not measured (I_fa = 0: a calibrated CPU, a GPU without flash benchmarks): the same FLOPs at
    the GEMM efficiency of the scores and context products (core_gemms_s, all s^2 of them).
    Context parallelism: each cp rank does 1/cp of the FLOPs (load-balanced chunks: cp rank i
    holds chunks i and 2 cp - 1 - i of 2 cp; Megatron-Core, Transformer Engine). The kernel's
    per-row cost is paid once per launch: ring attention (p2p) launches it for each of its cp
    steps over s / cp keys, the all-gather and Ulysses forms over all s:
        s_kernel = s_eff / (1 + I_p2p (cp - 1)).
    MLA: the scores d_qk and the context d_v wide, the FLOPs of a head of (d_qk + d_v) / 2.
    Sliding window (a share rho_w of the layers, window w): those layers' kernels do P(w) of the
    s^2 pairs (perfmodel.costs.compute.windowed_pairs), and their per-row cost is that of a
    causal kernel whose rows are as long on average: s_eff = 2 P(w) / s tokens (s for full
    causal attention, whose rows average s / 2 keys) in the fit's (1 + s_half / s_eff)."""
    fwd, bwd = K.FLASH_BACKWARD_PER_FORWARD, (S.E_fa_bwd, S.s_fa_bwd)
    d_core = (c.d_qk + c.d_v) / 2
    launches = 1 + c.cp_p2p * (S.cp - 1)

    def measured(share: sp.Expr, s_eff: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
        flops = K.attention_core_flops(S.b, S.s, S.a, d_core, S.tp, share=share) / S.cp
        return (K.flash_attention_s(flops, S.F, S.E_fa_fwd, S.s_fa_fwd, s_eff / launches),
                K.flash_attention_s(fwd * flops, S.F, *bwd, s_eff / launches))

    full, full_bwd = measured(K.CAUSAL_FRACTION, S.s)
    as_gemms = attended_share(c) * core_gemms_s
    if c.fam.windowed:
        pairs = K.windowed_pairs(S.s, S.w)
        win, win_bwd = measured(pairs / S.s**2, 2 * pairs / S.s)
        full = (1 - S.rho_w) * full + S.rho_w * win
        full_bwd = (1 - S.rho_w) * full_bwd + S.rho_w * win_bwd
    return (S.I_fa * full + (1 - S.I_fa) * as_gemms,
            S.I_fa * full_bwd + (1 - S.I_fa) * fwd * as_gemms)


def op_recomputed_gemm_share(c: Context) -> sp.Expr:
    """The share of a layer's linear-layer FLOPs that torchtitan's per-op recompute repeats: of
    the matmuls Q, K, V, attention output, MLP up (w1), [gate (w3),] down (w2) it keeps every
    other output (the 1st, 3rd, ...) and recomputes K, the attention output and w3 (SwiGLU) or
    w2 (GeLU): (kv d + a d + f) h of (a d + 2 kv d + a d + (2 + gated) f) h."""
    d, a, kv, f = c.d, S.a, S.kv, S.f
    return (kv * d + a * d + f) / (2 * a * d + 2 * kv * d + (2 + c.gated) * f)


def op_recompute_s(c: Context, work: LayerWork) -> sp.Expr:
    """What per-op recompute repeats of one layer's forward [s]: its recomputed matmuls (their
    share of the linear FLOPs, at the layer's GEMM time per FLOP), every element-wise operation,
    and an unfused attention core (its batched products and softmax are not kept; a flash
    kernel's output is)."""
    if work.per_op_s is not None:  # the layers' own count (perfmodel.step.op_recompute)
        return work.per_op_s
    share = op_recomputed_gemm_share(c)
    return share * work.gemm_s + work.elementwise_s + (1 - c.flash) * work.attention_s \
        + share * (work.fp8_cast_s or ZERO)


def layer_phases(c: Context, work: LayerWork, cost: PartCost,
                 issued: Mapping[str, tuple[Collective, ...]], stage: str = "first",
                 overlap: Mapping[str, tuple[Overlap, ...]] | None = None,
                 overlap_device: Mapping[str, sp.Expr] | None = None,
                 extra_kernels: tuple[sp.Expr, sp.Expr] = (ZERO, ZERO)
                 ) -> tuple[Phase, Phase, Phase]:
    """The stage's n layers in one micro-batch (n: c.stage_layers[stage]; `work`: all of them,
    stage_work): forward, backward, recompute.

    device: the layers' work (x 2 backward); where calibrated, (s - 1) x that (the framework's
            scale; s >= 1: calibration.layers fits it so, a profile's below 1 is read as 1,
            perfmodel.specs.profile, so the term is never negative)
    host:   n x c_fwd (c_bwd); n x ops x t_op (framework.PartCost) where not calibrated, and
            what the stage's MoE layers issue beyond dense ones (extra_kernels: forward and
            backward per micro-batch, perfmodel.step.moe.extra_kernels, at the same cost each)
    recompute: the forward of the layers full recompute repeats (full_recompute_s: whole dense
    and MoE layers) + selective x attention (core_attn) and the parts its other modules
    name (recompute_module_s) + op x what per-op recompute repeats (op_recompute_s), device and
    host (charged to compute/recompute; the host's at full x n), and the forward's
    collectives (full; op: all but the reduce-scatters, whose outputs it keeps). full, selective
    and op are the shares of the stage's layers under each policy (Context).
    overlap, overlap_device: by phase, the Overlaps of its tensor-parallel collectives and what
    the overlapped GEMMs lose (perfmodel.step.tensor_parallel.layer_overlaps).
    """
    n = c.stage_layers[stage]
    scale = n / c.layers_per_stage  # the collectives are declared for the first stage's layers
    overlap, extra = overlap or {}, overlap_device or {}
    kernels = cost.kernel_s * (n * cost.forward_ops + extra_kernels[0])
    back_kernels = cost.backward_kernel_s * (n * cost.backward_ops + extra_kernels[1])
    slower = cost.scale - 1  # what the framework's scale adds to the rooflines
    recomputed = full_recompute_s(c, stage, work) + times(c.core, work.attention_s) \
        + times(c.op, op_recompute_s(c, work)) \
        + sum((times(c.recomputes(name), t) for name, t in work.module_s), ZERO)

    def lost(name: str) -> dict[str, sp.Expr]:
        return {"compute/tp_overlap": extra[name]} if name in extra else {}

    forward = Phase(
        name="layers/forward",
        device={**work.forward_terms(),
                "compute/forward/framework": times(slower, work.total_s),
                **lost("layers/forward")},
        host={"compute/forward/framework": n * cost.forward_s, "overhead/kernels": kernels},
        comms=issued.get("layers/forward", ()), overlaps=overlap.get("layers/forward", ()),
        comm_scale=scale)
    backward = Phase(
        name="layers/backward",
        device={**work.backward_terms(),
                "compute/backward/framework": times(slower, work.backward_s),
                **lost("layers/backward")},
        host={"compute/backward/framework": n * cost.backward_s,
              "overhead/kernels": back_kernels},
        comms=issued.get("layers/backward", ()), overlaps=overlap.get("layers/backward", ()),
        comm_scale=scale)
    recompute = Phase(
        name="layers/recompute",
        device={"compute/recompute": recomputed + times(slower, recomputed),
                **lost("layers/recompute")},
        host={"compute/recompute": n * (c.full + c.op) * cost.forward_s,
              "overhead/kernels": (c.full + c.op) * kernels},
        comms=issued.get("layers/recompute", ()), overlaps=overlap.get("layers/recompute", ()),
        comm_scale=scale)
    return forward, backward, recompute


def moe_fp8_cast_elements(c: Context) -> tuple[sp.Expr, sp.Expr]:
    """Elements an fp8 plan's MoE layer casts to FP8 on one rank, forward and backward
    (perfmodel.costs.compute.fp8_cast_elements' counting): the attention's (a standard
    attention's or MLA's projections', perfmodel.step.fp8.attention_cast_elements), the routed
    experts' inputs etp A_r h (up, the gathered rows) and etp A_r f_E / etp (down) forward and
    grad outputs etp A_r h (down) and etp A_r (1 + gated) f_E / etp (up) backward, and the shared
    experts' as a dense MLP's; the router runs in bf16 (Megatron-Core)."""
    h = S.h
    from perfmodel.step.moe import routed_tokens

    _, _, _, A_r = routed_tokens(c)
    forward, backward = FP8.attention_cast_elements(c)
    if c.fam.moe_shared:
        shared_forward, shared_backward = FP8.mlp_cast_elements(c, S.f_sh)
        forward, backward = forward + shared_forward, backward + shared_backward
    forward += A_r * (S.etp * h + S.f_E)
    backward += A_r * (S.etp * h + (1 + c.gated) * S.f_E)
    return forward, backward
