"""The tensor-parallel collectives: each declared once (perfmodel.step.collective).

Megatron 1D (Shoeybi et al. 2019, Sec. 3): per layer, forward, an all-reduce after the attention
and one after the MLP (the f and g operators of their Fig. 3); with sequence parallelism each
becomes an all-gather before and a reduce-scatter after (Korthikanti et al. 2022, Sec. 4.2.2).
The backward issues the same collectives again (their adjoints), recompute repeats the forward's.
All carry a full activation, e T h bytes; an fp8 plan's forward all-gathers (and recompute's) carry
the QKV and MLP-up inputs in FP8, e_8 T h: Transformer Engine casts the shard, then gathers it
(TE docs, the te.Linear walkthrough: "quantize locally first, then all-gather the quantized data";
TE 1.x's LayerNormLinear gathers the norm's FP8 output likewise), and so are the backward's
all-gathers of the grad outputs (TE's grad_output_preprocess gathers with the grad output's
quantizer, transformer_engine/pytorch/module/base.py at d0067d0); every reduce-scatter and
all-reduce (GEMM outputs) stays bf16, e T h.
With sequence parallelism Megatron-Core and Transformer Engine keep a column-parallel layer's
input as its shard and gather it again in the backward for the weight gradient (Context.regather;
megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward
at d98e8a64; TE layernorm_linear.py ln_out_needs_gather and linear.py
backward_input_needs_gather): one more all-gather per sub-layer (the QKV input, MLP up's) and of
the output layer's input, e T h (e_8 T h in FP8: TE gathers the quantized shard), issued before
the input-gradient GEMM and waited for after it, which hides it (an NCCL all-gather on its own
stream, or userbuffers' bulk overlap under tp_comm_overlap). Full recompute does not spare it:
the recomputed forward keeps the shard again. torch's DTensor (torchtitan, the validation job)
keeps the gathered input for autograd instead (Plan.tp_backward dtensor; what it costs in memory
is not modelled).
2d / 2.5d / 3d grids: the collectives of each linear layer and norm (perfmodel.costs.layouts).
Embedding (vocabulary-parallel): its output all-reduced forward; with sequence parallelism the
sequence is then split (its backward all-gathers), and without learned positions the all-reduce
and split fuse into a reduce-scatter (Megatron-LM). Output layer: its input gathered (SP) forward
and reduced backward; cross entropy all-reduces max, sum and target logits over T fp32 values.
Sequence parallelism leaves the norms' weight gradients partial: one all-reduce per step of every
norm vector (Megatron-LM allreduce_layernorm_grads).

Overlapped with the GEMMs (tp_comm_overlap: Megatron --tp-comm-overlap, Transformer Engine's
userbuffers; torchtitan's async TP), as NeMo's H100 configurations run it
(nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py; NeMo docs, "Communication
Overlap"), per layer, C one collective's time, G the GEMM it pairs with:
  - an all-gather feeding a GEMM (forward before QKV and MLP up, backward before the attention
    output's and MLP down's input-gradient GEMMs): ring exchange, the GEMM in tp chunks, each
    computed while the next chunk arrives, the first on the local shard:
        exposed = max(0, C - G (tp - 1) / tp)
  - a reduce-scatter after a GEMM (forward after the attention output and MLP down): pipelined,
    the GEMM in RS_SPLITS chunks, each chunk's reduce-scatter behind the next chunk's GEMM, the
    last chunk's exposed:   exposed = max(C / RS_SPLITS, C - G (RS_SPLITS - 1) / RS_SPLITS)
  - the backward's reduce-scatter of the QKV and MLP-up input gradients: bulk, behind the weight-
    gradient GEMM that does not depend on it:  exposed = max(0, C - G)
  - what the overlapped GEMMs lose: they run in chunks (tp chunks of the tokens for a ring
    exchange, RS_SPLITS for a pipelined reduce-scatter: smaller GEMMs, less efficient by the
    hardware's GEMM model, perfmodel.costs.gemm_efficiency); and the pipelined reduce-scatters
    run on SMs the GEMM gives up (set_sm_margin): the attention output's GEMM runs on
    1 - 24/132 of them, MLP down's on 1 - 16/132 (num_sm of the H100 configurations' proj_fprop
    and fc2_fprop, of H100's 132 SMs), 1/(1 - share) times as long; ring exchange and bulk use
    the copy engines or a few SMs without a margin (num_sm 1-4 for the forward's all-gathers):
    no slowdown. The windows above are the GEMMs as they run.
  - the contention of compute beside a collective (HardwareSpec.overlap_compute_slowdown, k;
    perfmodel.step.compose): the ring exchanges' and the bulk reduce-scatters' windows run 1 + k
    as long while their collective runs (the copy engines and the few SMs they use still take
    memory bandwidth and power; compute/overlap_contention); the pipelined reduce-scatters'
    GEMMs do not take it again: their SM margin is that contention made explicit (their GEMMs
    already take 1/(1 - share), 1.22 x for the attention output, 1.14 x for MLP down, against
    the measured mean 1.189), so their Overlaps give k = 0.
torchtitan's async TP (tp_comm_overlap with the compiled stack: Inductor's micro-pipeline TP pass
fuses the all-gathers feeding a matmul and the reduce-scatters a matmul feeds, forward and
backward graphs alike, torch 2.13 torch/_inductor/fx_passes/micro_pipeline_tp.py) runs the same
shapes of overlap with torch's symmetric-memory kernels (torch/distributed/_symmetric_memory):
  - the all-gathers as the ring exchange above (the GEMM in tp chunks, the local shard's first);
  - a reduce-scatter after a GEMM in tp chunks (_pipelined_produce_and_all2all: each chunk's
    partial copied to its rank while the next computes, on two streams), not RS_SPLITS; no SM
    margin (the copies are kernels beside the GEMMs: the contention k, as for a ring exchange);
    and a sum of the tp partials at the end, a memory-bound pass reading (tp + 1) / tp of the
    unsharded output (compute/tp_overlap), for each fused reduce-scatter: the forward's, and
    the backward's where one GEMM's output feeds it (an MLP up without a gate: torchtitan's
    separate q, k, v and gated up projections add their input gradients first, and the pass
    fuses a reduce-scatter only behind a matmul, _find_producer_matmul); the backward's windows
    as above.
Full recompute repeats the forward's collectives and their overlaps.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import compute as K
from perfmodel.costs import layouts as LY
from perfmodel.costs import mla as MLA
from perfmodel.costs.compute import FP32_BYTES
from perfmodel.costs.lattice import lmax, times
from perfmodel.step.collective import PHASE_STAGE, Collective
from perfmodel.step.compose import Overlap, Phase
from perfmodel.step.context import Context, linear_gemm_time
from perfmodel.step.pipeline import STAGES

ZERO, ONE = sp.Integer(0), sp.Integer(1)
COLLECTIVES_PER_LAYER = 2  # Megatron 1D, per layer and direction: after attention, after MLP
REGATHER = "tp/layer/all_gather_again"  # a column-parallel input gathered again (backward)
MLA_REGATHER = "tp/mla/all_gather_again"
OUTPUT_REGATHER = "tp/output/all_gather_again"
RS_SPLITS = 4  # num_splits of every PipelineOverlapCfg in NeMo's userbuffers.py
SM_SHARE = {"attention_output": sp.Rational(24, 132),  # proj_fprop num_sm 24, H100: 132 SMs
            "mlp_down": sp.Rational(16, 132)}  # fc2_fprop num_sm 16 (Llama 3 70B, tp 4, bf16)
CROSS_ENTROPY_ALL_REDUCES = 3  # the logits' max, the sum of their exponentials, the target logit
NORMS_PER_LAYER = 2  # before the attention and before the MLP


def _tp(c: Context, name: str, op: str, nbytes: sp.Expr, calls: sp.Expr, phase: str,
        in_phase: str, axis: str = "tp", stage: str = "every") -> Collective:
    return Collective(name=name, op=op, axis=axis, nbytes=nbytes, calls=calls, phase=phase,
                      in_phase=in_phase, term="comm/tp", fam=c.fam, stage=stage)


def megatron_collectives(c: Context, count: sp.Expr, prefix: str = "layers",
                         stage: str = "every", share: sp.Expr = ONE,
                         recomputed: bool = True,
                         full_count: sp.Expr | None = None) -> list[Collective]:
    """Megatron 1D's collectives of `count` sub-layers (an attention or an MLP each) per
    micro-batch, issued in the phases <prefix>/forward, /backward, /recompute on `stage` (its
    ledger calls x share); full_count: those of them full recompute repeats (default full x
    count, the share of the stage's layers)."""
    sp_ = c.seq_parallel
    act_bytes = S.e * c.T * S.h
    fp8_gather = S.e8 * c.T * S.h if c.fam.fp8 else act_bytes  # the GEMM inputs, cast first
    out = []
    # recompute repeats the forward's (full), or all but the reduce-scatters, whose outputs
    # torchtitan's per-op recompute keeps (op)
    full = c.full * count if full_count is None else full_count
    recompute = {"all_gather": full + c.op * count, "reduce_scatter": full,
                 "all_reduce": full + c.op * count}
    where = prefix if stage == "every" else f"{prefix}@{PHASE_STAGE.get(stage, stage)}"
    directions: list[tuple[str, str, dict[str, sp.Expr] | None]] = [
        (f"{where}/forward", "fwd", None), (f"{where}/backward", "bwd", None)]
    if recomputed:
        directions.append((f"{where}/recompute", "bwd", recompute))
    for in_phase, phase, repeat in directions:
        for op, part in (("all_gather", sp_), ("reduce_scatter", sp_), ("all_reduce", 1 - sp_)):
            repeated = count if repeat is None else repeat[op]
            calls = c.megatron * part * repeated
            # the all-gathers carry FP8 (the forward's GEMM inputs and the backward's grad
            # outputs, cast on the shard first); reduce-scatters and all-reduces bf16
            nbytes = fp8_gather if op == "all_gather" else act_bytes
            out.append(Collective(name=f"tp/layer/{op}", op=op, axis="tp", nbytes=nbytes,
                                  calls=calls, phase=phase, in_phase=in_phase, term="comm/tp",
                                  fam=c.fam, stage=stage, ledger_share=share))
    # the column-parallel inputs (QKV's, MLP up's) gathered again for the weight gradients
    # (Megatron-Core and Transformer Engine keep the shard; Context.regather), in FP8 where the
    # forward gathered FP8
    out.append(Collective(name=REGATHER, op="all_gather", axis="tp", nbytes=fp8_gather,
                          calls=c.regather * count, phase="bwd", in_phase=f"{where}/backward",
                          term="comm/tp", fam=c.fam, stage=stage, ledger_share=share))
    return out


def mla_collectives(c: Context, count: sp.Expr, prefix: str = "layers", stage: str = "every",
                    recomputed: bool = True) -> list[Collective]:
    """Multi-head latent attention's tensor-parallel collectives of `count` layers per micro-batch
    (perfmodel.costs.mla): with sequence parallelism, forward an all-gather of each latent (e T
    w, w = r_q (or h), r_kv, d_rope) and a reduce-scatter of the output (e T h), backward their
    adjoints (reduce-scatters of the latents' gradients, an all-gather of the output's);
    without it, an all-reduce of the output forward and of each latent's gradient backward.
    Full recompute repeats the forward's. An fp8 plan's forward gathers of the query and
    key/value latents (the up projections' inputs; the hidden state itself for a whole query
    projection) carry their FP8 copies, e_8 T w: Transformer Engine's column-parallel up
    projections cast the shard, then gather it (as the QKV input's, megatron_collectives); the
    rotary key is gathered apart, in bf16 (Megatron-Core's MLASelfAttention: linear_q_up_proj,
    linear_kv_up_proj column-parallel TE linears over the sequence-parallel latents; k_pos_emb
    through gather_from_sequence_parallel_region). In the backward the output's grad is
    gathered in FP8 likewise, and where the stack re-gathers (Context.regather) the two up
    projections' latents are gathered again for their weight gradients (tp/mla/
    all_gather_again), in FP8 where the forward's were; the rotary key's gather is Megatron-
    Core's autograd function, whose backward only reduce-scatters."""
    sp_, e, T = c.seq_parallel, S.e, c.T
    latents = MLA.latent_widths(S.r_q, S.r_kv, S.d_rope, S.h, q_lora=c.fam.mla_q_lora)
    where = prefix if stage == "every" else f"{prefix}@{PHASE_STAGE.get(stage, stage)}"
    out: list[Collective] = []

    def add(op: str, width: sp.Expr, calls: sp.Expr, phase: str, pass_: str,
            nbytes: sp.Expr = e, name: str = "") -> None:
        out.append(Collective(name=name or f"tp/mla/{op}", op=op, axis="tp",
                              nbytes=nbytes * T * width,
                              calls=c.megatron * calls * count, phase=phase,
                              in_phase=f"{where}/{pass_}", term="comm/tp", fam=c.fam,
                              stage=stage))

    repeats = [("forward", "fwd", sp.Integer(1))]
    if recomputed:
        repeats.append(("recompute", "bwd", c.full))
    # bytes per element of each latent's forward gather: query, key/value, rotary key
    cast_first = S.e8 if c.fam.fp8 else e
    gathered = (cast_first, cast_first, e)
    for pass_, phase, repeat in repeats:
        for w, per_element in zip(latents, gathered, strict=True):
            add("all_gather", w, repeat * sp_, phase, pass_, per_element)
        add("reduce_scatter", S.h, repeat * sp_, phase, pass_)
        add("all_reduce", S.h, repeat * (1 - sp_), phase, pass_)
    for w in latents:
        add("reduce_scatter", w, sp_, "bwd", "backward")
        add("all_reduce", w, 1 - sp_, "bwd", "backward")
    add("all_gather", S.h, sp_, "bwd", "backward", cast_first)
    for w in latents[:2]:  # the up projections' inputs (add gives megatron's factor)
        add("all_gather", w, sp_ * c.megatron_backward, "bwd", "backward", cast_first,
            MLA_REGATHER)
    return out


def dense_mlp_collectives(c: Context) -> list[Collective]:
    """The MLP collectives of each stage's dense layers (a mixture of experts without shared
    experts), declared per stage (phases layers@<stage>/...): the first stage's in the ledger,
    the last's and a middle one's only with several stages. Full recompute repeats those of
    the dense layers it recomputes, whole layers (perfmodel.step.layer.full_recomputed: 4
    layers, layer 0 dense, one in 2 recomputed, none; not full x 1 = 1/2)."""
    from perfmodel.step.layer import full_recomputed
    from perfmodel.step.moe import moe_layers

    moe, out = moe_layers(c), []
    for st in STAGES:
        share = ONE if st == "first" else c.multi
        out += megatron_collectives(c, c.stage_layers[st] - moe[st], stage=st, share=share,
                                    full_count=full_recomputed(c, st)[0])
    return out


def module_recompute_collectives(c: Context) -> list[Collective]:
    """What selective recompute's mlp and shared_experts modules repeat of each stage's MLP
    collectives (Megatron-Core checkpoints the MLP module, its sequence-parallel all-gather and
    reduce-scatter or its all-reduce inside): the forward's Megatron pair of a dense layer's MLP
    (mlp) and of an MoE layer's shared experts (shared_experts), in the phases
    layers@<stage>/recompute, declared per stage as dense_mlp_collectives."""
    modules = set(c.fam.recompute_modules)
    if not modules & {"mlp", "shared_experts"}:
        return []
    from perfmodel.step.moe import moe_layers

    moe = moe_layers(c) if c.fam.moe else {st: ZERO for st in STAGES}
    sp_ = c.seq_parallel
    act_bytes = S.e * c.T * S.h
    gather_bytes = S.e8 * c.T * S.h if c.fam.fp8 else act_bytes
    out = []
    for st in STAGES:
        count = (c.stage_layers[st] - moe[st]) * c.recomputes("mlp")
        if c.fam.moe_shared:
            count += moe[st] * c.recomputes("shared_experts")
        for op, part in (("all_gather", sp_), ("reduce_scatter", sp_), ("all_reduce", 1 - sp_)):
            out.append(Collective(
                name=f"tp/layer/{op}", op=op, axis="tp",
                nbytes=gather_bytes if op == "all_gather" else act_bytes,
                calls=c.megatron * part * count, phase="bwd", in_phase=f"layers@{st}/recompute",
                term="comm/tp", fam=c.fam, stage=st, ledger_share=ONE if st == "first"
                else c.multi))
    return out


def layer_collectives(c: Context) -> list[Collective]:
    """The collectives of the stage's layers per micro-batch (declared for the first stage's,
    the ledger's: a stage's phases scale them to its own, Phase.comm_scale): Megatron 1D, then
    the grids'. A mixture of experts whose MoE layers have no shared experts issues none for
    their MLP (the experts are whole on each rank, which routes its own tokens): the attention's
    of every layer, the MLP's of each stage's dense layers (dense_mlp_collectives)."""
    n = c.layers_per_stage
    if c.fam.mla:  # the attention's own (mla_collectives), the MLPs' as a dense layer's
        out = mla_collectives(c, n)
        if not c.fam.moe or c.fam.moe_shared:
            return out + megatron_collectives(c, n)
        return out + dense_mlp_collectives(c)
    if c.fam.moe and not c.fam.moe_shared:
        return megatron_collectives(c, n) + dense_mlp_collectives(c)
    out = megatron_collectives(c, COLLECTIVES_PER_LAYER * n)
    if c.fam.tp_layout != "1d":  # 2d / 2.5d / 3d grids: see perfmodel.costs.layouts
        out += _grid_collectives(c)
    return out


def layer_overlaps(c: Context, n: sp.Expr, attention: bool,
                   mlps: tuple[tuple[sp.Expr, sp.Expr], ...], prefix: str = "layers"
                   ) -> tuple[dict[str, tuple[Overlap, ...]], dict[str, sp.Expr]]:
    """The Overlaps of some layers' tensor-parallel collectives (tp/layer/...) with their GEMMs
    (tp_comm_overlap; see the module doc), by phase (<prefix>/forward, /backward, /recompute),
    and what the overlapped GEMMs lose (compute/tp_overlap). The phases' collectives: the
    attention's of the stage's n layers (attention: Megatron's QKV and output projections; not
    MLA's, whose own collectives are not overlapped here) and the MLPs' of `mlps`, (count, width)
    each (a dense layer's MLP f wide, a mixture of experts' shared experts f_sh wide), each kind
    an equal share of the phase's calls per sub-layer."""
    on, tp = c.tp_comm_overlap, S.tp
    # torchtitan's async TP (a compiled stack): torch's fused matmul-reduce-scatter computes the
    # tp partials chunk by chunk, with no SM margin (its copies contend as a ring's do); NeMo's
    # userbuffers (eager stacks) in RS_SPLITS chunks on the SMs the margin leaves (module doc)
    fused = c.compiled
    splits = RS_SPLITS * (1 - fused) + tp * fused
    ag, rs = ("tp/layer/all_gather",), ("tp/layer/reduce_scatter",)
    ar = ("tp/layer/all_reduce",)  # without sequence parallelism (backward: the input grads')
    share = sp.Integer(1) / (int(attention) + int(bool(mlps)))
    # the overlapped GEMMs as they run: in chunks of the tokens (tp for the ring exchanges,
    # RS_SPLITS for the pipelined reduce-scatters), those before a pipelined reduce-scatter on
    # the SMs it leaves them; and whole (the bulk overlaps' windows)
    kinds: tuple[tuple[sp.Expr, sp.Expr, tuple[str, str]], ...] = \
        ((n, S.f, ("qkv", "attention_output")),) if attention else ()
    kinds += tuple((count, width, ("mlp_up", "mlp_down")) for count, width in mlps)
    ring: dict[str, sp.Expr] = {}
    pipe: dict[str, sp.Expr] = {}
    whole: dict[str, sp.Expr] = {}
    for count, width, names in kinds:
        for g, t in _chunked(c, tp, names, width).items():
            ring[g] = ring.get(g, ZERO) + times(count, t)
        for g, t in _chunked(c, splits, names[1:], width).items():
            pipe[g] = pipe.get(g, ZERO) + times(count, t) / (1 - (1 - fused) * SM_SHARE[g])
        for g, t in _chunked(c, ONE, names, width).items():
            whole[g] = whole.get(g, ZERO) + times(count, t)

    def ov(behind: str, time: sp.Expr, of: tuple[str, ...], hides: sp.Expr,
           floor: sp.Expr = ZERO, contention: sp.Expr = S.s_ovl) -> Overlap:
        return Overlap(behind, hides * time, on, floor=floor, of=of, share=share,
                       contention=contention)

    before, after = (tp - 1) / tp, (splits - 1) / splits
    forward, backward = [], []
    label = {"qkv": "the QKV", "attention_output": "the attention output",
             "mlp_up": "the MLP up", "mlp_down": "the MLP down"}
    for first, second in (("qkv", "attention_output"), ("mlp_up", "mlp_down")):
        if first not in ring:
            continue
        forward += [ov(f"{label[first]} GEMM", ring[first], ag, before),
                    ov(f"{label[second]} GEMM", pipe[second], rs, after, 1 / splits,
                       fused * S.s_ovl)]
        backward += [ov(f"{label[second]}'s input-gradient GEMM", ring[second], ag, before),
                     # the input gradient's reduce-scatter (all-reduce without sequence
                     # parallelism) behind the weight-gradient GEMM: userbuffers' bulk overlap,
                     # or Megatron's own backward, which issues it asynchronously before that
                     # GEMM (megatron_backward; DTensor reduces in turn)
                     Overlap(f"{label[first]} weight-gradient GEMM", whole[first],
                             on + (1 - on) * c.megatron_backward, of=rs + ar, share=share),
                     # the input gathered again for the weight gradient (Context.regather):
                     # issued before the input-gradient GEMM and waited for after it, with or
                     # without tp_comm_overlap (userbuffers' bulk dgrad overlap, or an NCCL
                     # all-gather on its own stream)
                     Overlap(f"{label[first]} input-gradient GEMM", whole[first], ONE,
                             of=(REGATHER,), share=share)]
    lost_forward = sum((ring[g] - whole[g] for g in ("qkv", "mlp_up") if g in ring), ZERO) \
        + sum((t - whole[g] for g, t in pipe.items()), ZERO)
    lost_backward = sum((ring[g] - whole[g] for g in ("attention_output", "mlp_down")
                         if g in ring), ZERO)
    # torch's fused matmul-reduce-scatter ends in a sum of the tp partials: a pass reading tp
    # shards of its h-wide output and writing one (torch/distributed/_symmetric_memory,
    # _fused_matmul_reduce_scatter_impl), for the forward's reduce-scatters (attention output,
    # MLP down) and the backward's where one GEMM produces the input gradient: an MLP up without
    # a gate; torchtitan's separate q, k, v and gated up projections sum their input gradients
    # before the reduce-scatter, which the pass then does not fuse
    one = K.memory_time((tp + 1) * S.e * c.T * S.h / tp, c.dev)
    lost_forward += fused * sum((count for count, _, _ in kinds), ZERO) * one
    lost_backward += fused * (1 - c.gated) * sum((count for count, _ in mlps), ZERO) * one
    return ({f"{prefix}/forward": tuple(forward), f"{prefix}/backward": tuple(backward),
             f"{prefix}/recompute": tuple(forward)},
            {f"{prefix}/forward": times(on, lost_forward),
             f"{prefix}/backward": times(on, lost_backward),
             f"{prefix}/recompute": times(c.full * on, lost_forward)})


def mla_regather_overlap(c: Context, count: sp.Expr) -> Overlap:
    """The MLA latents gathered again for the up projections' weight gradients (mla_collectives)
    behind those projections' input-gradient GEMMs, of `count` layers, as a Megatron layer's
    re-gathers hide behind QKV's (layer_overlaps)."""
    gemms = {g.name: g for g in MLA.mla_gemms(c.T, S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope,
                                               S.d_v, S.tp, q_lora=c.fam.mla_q_lora,
                                               T_down=c.T / c.act_ranks)}
    up = ("q_up" if c.fam.mla_q_lora else "q", "kv_up")
    window = count * sum((linear_gemm_time(c, gemms[name]) for name in up), ZERO)
    return Overlap("the up projections' input-gradient GEMMs", window, ONE, of=(MLA_REGATHER,))


def _chunked(c: Context, chunks: sp.Expr, names: tuple[str, ...],
             width: sp.Expr = S.f) -> dict[str, sp.Expr]:
    """The forward time of some linear layers' GEMMs run in `chunks` pieces of the micro-batch's
    tokens (Megatron 1D shapes, the MLP `width` wide) [s]."""
    gemms = {g.name: g for g in K.layer_gemms(c.T / chunks, S.b, S.s, S.h, S.a, S.kv, width,
                                              S.tp, c.gated, c.d)}
    if c.fam.fp8:  # on the FP8 device, e_8-byte operands, bf16 out (perfmodel.step.layer)
        return {name: chunks * K.gemm_time(gemms[name], S.e8, c.linear,
                                           output_bytes_per_element=S.e) for name in names}
    return {name: chunks * K.gemm_time(gemms[name], S.e, c.dev) for name in names}


def _grid_collectives(c: Context) -> list[Collective]:
    h, a, kv, f, e, qa, qc, T = S.h, S.a, S.kv, S.f, S.e, S.q_a, S.q_c, c.T
    linears = LY.linear_shapes(h, a, kv, f, c.gated, c.d)
    vectors = 1 + c.layernorm  # weight and bias, or RMSNorm's weight
    grid2, grid3 = c.grid2, c.grid3
    ops = [(grid2, op) for _, K_, M_ in linears for op in LY.summa_comm(T, K_, M_, e, qa, qc)]
    ops += [(grid3, op) for name, K_, M_ in linears
            for op in LY.cube_comm(T, K_, M_, e, qa,
                                   swapped=name in ("attention_output", "mlp_down"))]
    ops += [(grid2, op) for op in LY.norm_comm(T, qa * qc, "tpa")]
    ops += [(grid3, op) for op in LY.norm_comm(T, qa * qa, "tpb")]
    # 2.5D splits the tokens over the depth c too, which replicates the norms' weights
    ops += [(grid2, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors, ("tpb", "tpc"))]
    ops += [(grid3, op) for op in LY.norm_weight_grads(h, qa, S.wbytes, vectors, ("tpa", "tpc"))]
    out = []
    for weight, op in ops:
        issued = [(op.phase, "layers/forward" if op.phase == "fwd" else "layers/backward", 1)]
        if op.phase == "fwd":  # recomputed with the forward
            issued.append(("bwd", "layers/recompute", c.full + c.op))
        for phase, in_phase, repeat in issued:
            calls = weight * repeat * op.count * c.layers_per_stage
            out.append(_tp(c, f"{op.axis}/layer/{op.op}", op.op, op.nbytes, calls, phase,
                           in_phase, axis=op.axis))
    return out


def embedding_collectives(c: Context) -> list[Collective]:
    """The embedding's, per micro-batch on the first stage."""
    act_bytes = S.e * c.T * S.h
    fused = c.seq_parallel * (1 - c.learned_positions)  # 1: reduce-scatter instead of all-reduce
    return [_tp(c, f"tp/embedding/{op}", op, act_bytes, calls, phase, f"embedding/{direction}",
                stage="first")
            for op, calls, phase, direction in (
                ("reduce_scatter", fused, "fwd", "forward"),
                ("all_reduce", 1 - fused, "fwd", "forward"),
                ("all_gather", c.seq_parallel, "bwd", "backward"))]


def output_collectives(c: Context) -> list[Collective]:
    """The output layer's and the loss's, per micro-batch on the stage with the output layer;
    where the stack re-gathers (Context.regather: Megatron-Core's ColumnParallelLinear keeps the
    input's shard) the input is gathered again in the backward for the weight gradient."""
    act_bytes, sp_ = S.e * c.T * S.h, c.seq_parallel
    return [
        _tp(c, "tp/output/all_gather", "all_gather", act_bytes, sp_, "fwd", "output/forward",
            stage="output"),
        _tp(c, OUTPUT_REGATHER, "all_gather", act_bytes, c.regather, "bwd", "output/backward",
            stage="output"),
        _tp(c, "tp/output/reduce_scatter", "reduce_scatter", act_bytes, sp_, "bwd",
            "output/backward", stage="output"),
        _tp(c, "tp/output/all_reduce", "all_reduce", act_bytes, 1 - sp_, "bwd", "output/backward",
            stage="output"),
        _tp(c, "tp/cross_entropy/all_reduce", "all_reduce", FP32_BYTES * c.T,
            sp.Integer(CROSS_ENTROPY_ALL_REDUCES), "fwd", "output/forward", stage="output"),
    ]


def norm_grad_collectives(c: Context) -> list[Collective]:
    """Per step, with sequence parallelism: one all-reduce of every norm vector of a stage (two
    per layer, and the final norm on the stage that holds it: the last, zbv's first or the only
    one; LayerNorm has a weight and a bias, RMSNorm a weight), and of an MoE layer's router
    (Megatron-Core all-reduces the routers' gradients over tp with the norms'). The ledger
    counts rank 0's (the first stage's, as every other ledger entry); the time is the stage with
    the most of them (every stage syncs at once).

    Under ZeRO 3 (FSDP) each rank all-reduces its shards of them, after FSDP has reduce-scattered
    them over dp: Megatron-FSDP's finalize_model_grads coalesces each parameter's local shard
    (_allreduce_non_tensor_model_parallel_grads, ``grad._local_tensor``), as the validation job
    does: rank 0's shard of a tensor of r rows is ceil(r / (dp cp)) of them (FSDP2's split of
    the first dimension, as perfmodel.costs.memory.fsdp_padded pads it)."""
    from perfmodel.costs.memory import fsdp_padded
    from perfmodel.step.data_parallel import replicas

    final = {"first": c.single + c.head_first, "last": 1 - c.head_first, "middle": ZERO}
    ranks = replicas(c)

    def held(rows: sp.Expr, cols: sp.Expr | int = 1) -> sp.Expr:
        """A tensor's elements in the all-reduce: whole, or rank 0's FSDP shard (ZeRO 3)."""
        return (1 - c.zero3) * rows * cols + c.zero3 * fsdp_padded([(rows, cols)], ranks) / ranks

    if not c.fam.moe and not c.fam.mla:
        def on_stage(st: str) -> sp.Expr:
            return (1 + c.layernorm) * held(S.h) \
                * (NORMS_PER_LAYER * c.stage_layers[st] + final[st])
    else:
        from perfmodel.step.moe import moe_layers

        moe = moe_layers(c) if c.fam.moe else {}
        # the down projections and the latents' norms, whole on every tp rank, each over its
        # own tokens with sequence parallelism (under ZeRO 3 their shards taken as 1 / (dp cp)
        # of them: the job, whose ledger agreement is checked, runs no MLA)
        down = MLA.mla_params(S.h, S.a, S.r_q, S.r_kv, S.d_nope, S.d_rope, S.d_v,
                              q_lora=c.fam.mla_q_lora, bias=0)["replicated"] \
            if c.fam.mla else ZERO
        down = (1 - c.zero3) * down + c.zero3 * down / ranks
        # the router: E x h weights and E biases (perfmodel.costs.moe.router_params)
        router = held(S.E, S.h) + c.bias * held(S.E) if c.fam.moe else ZERO

        def on_stage(st: str) -> sp.Expr:
            n = c.stage_layers[st]
            return (1 + c.layernorm) * held(S.h) * (NORMS_PER_LAYER * n + final[st]) \
                + moe.get(st, ZERO) * router + n * down

    vectors = lmax(*(on_stage(st) for st in STAGES))
    return [Collective(name="tp/norm_grads/all_reduce", op="all_reduce", axis="tp",
                       nbytes=S.wbytes * on_stage("first"), time_nbytes=S.wbytes * vectors,
                       calls=c.seq_parallel, phase="step", in_phase="tensor_parallel/norm_grads",
                       term="comm/tp_grads", fam=c.fam)]


def norm_grad_phase(issued: Mapping[str, tuple[Collective, ...]]) -> Phase:
    name = "tensor_parallel/norm_grads"
    return Phase(name=name, comms=issued.get(name, ()), per_step=True)
