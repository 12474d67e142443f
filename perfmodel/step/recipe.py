"""The recipe: `build(family)` composes a training step from named phases, top to bottom."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import times
from perfmodel.family import Family
from perfmodel.step import compose as CO
from perfmodel.step import context_parallel as CP
from perfmodel.step import data_parallel as DP
from perfmodel.step import embedding_head as EH
from perfmodel.step import fp8 as FP8
from perfmodel.step import grad_accumulation as GACC
from perfmodel.step import host as H
from perfmodel.step import moe as MOE
from perfmodel.step import mtp as MTP
from perfmodel.step import offload as OFF
from perfmodel.step import pipeline as PP
from perfmodel.step import tensor_parallel as TP
from perfmodel.step.collective import Collective, CommOp
from perfmodel.step.compose import Phase
from perfmodel.step.context import Context
from perfmodel.step.framework import part_costs
from perfmodel.step.layer import layer_phases, layer_work, stage_work
from perfmodel.step.memory import memory_terms
from perfmodel.step.optimizer import optimizer_phase
from perfmodel.step.parameters import parameters
from perfmodel.step.quantities import part_times, quantities


@dataclass(frozen=True)
class Model:
    """The built expressions of one family."""

    family: Family
    time_terms: dict[str, sp.Expr]  # "stage:name" or name -> seconds per step
    stage_time: dict[str, sp.Expr]  # stage -> seconds per micro-batch
    step_time: sp.Expr
    memory_terms: dict[str, dict[str, sp.Expr]]  # stage -> name -> bytes
    quantities: dict[str, sp.Expr]  # model FLOPs, parameters, micro-batches ...
    ledger: list[CommOp] = field(default_factory=list)
    stage_terms: dict[str, dict[str, sp.Expr]] = field(default_factory=dict)  # per micro-batch
    phases: dict[str, tuple[Phase, ...]] = field(default_factory=dict)  # stage, or "step"
    # the step's composition in its terms' symbols (T_step, t_mb, T_bubble: what explain prints),
    # and what each of those symbols stands for
    composition: dict[sp.Symbol, sp.Expr] = field(default_factory=dict)
    term_values: dict[sp.Symbol, sp.Expr] = field(default_factory=dict)
    # 1 where the schedule fills the pipeline's bubble with weight gradients (zb, zbv), else 0
    zero_bubble: sp.Expr = sp.Integer(0)
    zbv: sp.Expr = sp.Integer(0)  # 1 for ZB-V (its bubble: perfmodel.step.pipeline.zbv_bubble_s)
    # what each term hides, per step ("stage:name" or name): communication behind compute, host
    # time behind the device's (reported beside the breakdown, not in the step time)
    hidden_terms: dict[str, sp.Expr] = field(default_factory=dict)
    # each stage composed: its terms as explain prints them (the host's exposed share a symbol)
    stages: dict[str, CO.Stage] = field(default_factory=dict)


def build(fam: Family) -> Model:
    """The step time and memory of one family, in the symbols of perfmodel.symbols."""
    c = Context.of(fam)
    # 1. the work of one micro-batch: a layer's forward (GEMMs, attention, element-wise), the
    #    embedding's and the output layer's, and what the framework adds to each
    layer = layer_work(c)
    works = {st: stage_work(c, st) for st in PP.STAGES}  # its dense and MoE layers
    forward_s = {"layer": layer.total_s, "embedding": EH.embedding_forward_s(c),
                 "output": EH.output_forward_s(c)}
    costs = part_costs(c)
    # 2. its communication: every collective a rank issues, declared once, in ledger order
    params, units = parameters(c), DP.fsdp_units(c)
    p2p = PP.p2p_collectives(c)
    collectives = [*TP.layer_collectives(c), *TP.module_recompute_collectives(c),
                   *CP.cp_collectives(c), *MOE.ep_collectives(c),
                   *MTP.mtp_collectives(c), *TP.embedding_collectives(c),
                   *TP.output_collectives(c), *(x for sends in p2p.values() for x in sends),
                   *DP.sync_collectives(c, params, units),
                   *TP.norm_grad_collectives(c), *FP8.amax_collectives(c),
                   *FP8.tp_amax_collectives(c)]
    issued = _by_phase(collectives)
    # 3. one micro-batch on each stage, phase by phase (the layers' tensor-parallel collectives
    #    behind their GEMMs where the plan overlaps them; the loop's own ops on a GPU's host)
    launch = H.launch_s(c) if c.asynchronous else S.t_coll
    # the memory first: an offloading stage's copies are its offloaded activations
    offloaded: dict[str, sp.Expr] = {}
    memory = memory_terms(c, params, offloaded)
    phases: dict[str, tuple[Phase, ...]] = {}
    for st in PP.STAGES:
        has_embedding, has_output = PP.holds(c, st)
        overlaps, lost, stage_overlaps, stage_lost = _tp_overlaps(c, st)
        for phase, extra in MOE.ep_overlaps(c, st, works[st]).items():
            stage_overlaps = {**stage_overlaps,
                              phase: (*stage_overlaps.get(phase, ()), *extra)}
        loop = (Phase(name="training_loop",
                      host={"overhead/loop": H.loop_s(c, has_embedding, has_output)}),) \
            if c.asynchronous else ()
        phases[st] = (*layer_phases(c, works[st], costs["layer"], issued, st, overlaps, lost,
                                    MOE.extra_kernels(c, st)),
                      *CP.cp_phases(c, works[st], issued,
                                    comm_scale=c.stage_layers[st] / c.layers_per_stage),
                      *MOE.stage_phases(st, issued, overlaps=stage_overlaps, lost=stage_lost),
                      *MTP.mtp_phases(c, costs, issued, has_output),
                      *EH.embedding_phases(c, costs["embedding"], issued, has_embedding),
                      *EH.output_phases(c, costs["output"], issued, has_output),
                      PP.p2p_phase(p2p[st]), DP.fsdp_hook_phase(c, st, units), *loop,
                      *FP8.amax_phases(issued),
                      *GACC.grad_accumulation_phases(c, st, has_embedding, has_output),
                      *(OFF.offload_phases(c, works[st], st, offloaded[st])
                        if fam.cpu_offload else ()))
    moe_layer_s = layer_work(c, moe=True).total_s if fam.moe else sp.Integer(0)
    composed = {st: CO.stage_terms(phases[st], CO.launch_s(collectives, st, launch, c.head_first),
                                   c.asynchronous, st,
                                   MOE.synced(c, st, costs["layer"], moe_layer_s),
                                   MOE.synced(c, st, costs["layer"], moe_layer_s,
                                              recomputed=False))
                for st in PP.STAGES}
    stage_terms = {st: stage.terms for st, stage in composed.items()}
    # 4. the step: m micro-batches through the pipeline schedule, its fill and drain (the other
    #    stages' time), then the data-parallel gradient sync (behind the last stage's backward),
    #    the parameter gathers (behind the forward) and the optimizer
    stage_time = {st: sp.Add(*terms.values()) for st, terms in stage_terms.items()}
    t_mb = CO.micro_batch_time(stage_time.values())
    t_other = CO.other_stages_time(stage_time["first"], stage_time["middle"], stage_time["last"],
                                   t_mb, S.pp, c.multi)
    w_fill = PP.weight_gradient_fill(c, stage_terms)
    phases["step"] = (DP.sync_phase(c, params, units, issued, CO.backward_s(composed["last"]),
                                    CO.forward_s(composed["first"])),
                      TP.norm_grad_phase(issued), optimizer_phase(c, params),
                      *((FP8.weight_cast_phase(c, DP.fp8_weight_casts(c)),) if fam.fp8
                        else ()))
    bubble = PP.bubble_s(c.m, t_other, w_fill, PP.flushes(c), t_mb)
    zbv_bubble = None
    if c.zbv != 0:  # ZB-V's order idles more than the closed form where m < 2 pp or F != B
        zbv_passes = PP.zbv_passes(stage_time, {st: CO.forward_s(stage)
                                                for st, stage in composed.items()},
                                   PP.weight_gradients_s(stage_terms), t_other)
        zbv_bubble = PP.zbv_bubble_s(c, c.m, zbv_passes, t_other, t_mb, PP.flushes(c))
        bubble = times(1 - c.zbv, bubble) + zbv_bubble
    step_terms, step_hidden = CO.step_terms(phases["step"], c.m,
                                            CO.launch_s(collectives, None, launch), bubble)
    # 5. what else a prediction reports
    backward_s = {"layer": layer.backward_s, "output": EH.output_backward_s(c)}
    parts = part_times(c, forward_s, backward_s,
                       {p.name: p for p in phases["last"] + phases["first"]}, collectives, units)
    hidden = {f"{st}:{k}": c.m * x for st, stage in composed.items()
              for k, x in stage.hidden.items() if x != 0}
    hidden.update({k: x for k, x in step_hidden.items() if x != 0})
    return Model(
        family=fam,
        time_terms={**{f"{st}:{k}": c.m * t for st in PP.STAGES
                       for k, t in stage_terms[st].items()}, **step_terms},
        stage_time=stage_time,
        step_time=CO.step_time(c.m, t_mb, step_terms),
        memory_terms=memory,
        quantities=quantities(c, params, parts),
        ledger=[x.ledger_entry(c.m) for x in collectives],
        stage_terms=stage_terms,
        phases=phases,
        hidden_terms=hidden,
        stages={st: stage for st, stage in composed.items()},
        zero_bubble=c.zero_bubble,
        zbv=c.zbv,
        **_composition(c, stage_time, step_terms, w_fill, zbv_bubble),
    )


def _by_phase(collectives: list[Collective]) -> dict[str, tuple[Collective, ...]]:
    """The collectives by the phase that holds them (the pipeline's: one per stage position)."""
    out: dict[str, tuple[Collective, ...]] = {}
    for x in collectives:
        out[x.in_phase] = (*out.get(x.in_phase, ()), x)
    return out


def _tp_overlaps(c: Context, stage: str) -> tuple[dict[str, tuple[CO.Overlap, ...]],
                                                   dict[str, sp.Expr],
                                                   dict[str, tuple[CO.Overlap, ...]],
                                                   dict[str, sp.Expr]]:
    """The tensor-parallel overlaps of a stage's layers (perfmodel.step.tensor_parallel.
    layer_overlaps), for the phases layers/... (the attention's collectives, not MLA's; the MLPs'
    that every layer issues: a dense layer's, an MoE layer's shared experts') and layers@<stage>/...
    (a mixture of experts without shared experts: its dense layers' MLPs), with what the
    overlapped GEMMs lose in each."""
    n = c.stage_layers[stage]
    moe = MOE.moe_layers(c)[stage] if c.fam.moe else sp.Integer(0)
    attention = not c.fam.mla
    mlps: tuple[tuple[sp.Expr, sp.Expr], ...] = ((n, S.f),)
    own: tuple[tuple[sp.Expr, sp.Expr], ...] = ()
    if c.fam.moe:
        mlps = ((n - moe, S.f), (moe, S.f_sh)) if c.fam.moe_shared else ()
        own = () if c.fam.moe_shared else ((n - moe, S.f),)
    overlaps, lost = TP.layer_overlaps(c, n, attention, mlps) if attention or mlps else ({}, {})
    mine, mine_lost = TP.layer_overlaps(c, n, False, own, prefix=f"layers@{stage}") if own \
        else ({}, {})
    if c.fam.mla:  # the latents gathered again, behind the up projections' input gradients
        overlaps = {**overlaps, "layers/backward": overlaps.get("layers/backward", ())
                    + (TP.mla_regather_overlap(c, n),)}
    return overlaps, lost, mine, mine_lost


def _composition(c: Context, stage_time: dict[str, sp.Expr], step_terms: dict[str, sp.Expr],
                 w_fill: sp.Expr, zbv_bubble: sp.Expr | None = None
                 ) -> dict[str, dict[sp.Symbol, sp.Expr]]:
    """The step's composition written with the functions that composed it, over the terms'
    symbols (perfmodel.step.compose), and the expression each symbol stands for (T_zbv: a ZB-V
    plan's bubble as its order runs, perfmodel.step.pipeline.zbv_bubble_s)."""
    st = CO.STAGE_SYMBOLS
    symbols = {name: sym for name, sym in CO.STEP_SYMBOLS.items() if name in step_terms}
    with sp.evaluate(False):  # as written: explain prints them in this order
        composition = {
            sp.Symbol("T_step"): CO.step_time(CO.M_SYM, CO.T_MB, symbols),
            CO.T_MB: CO.micro_batch_time([st[s] for s in PP.STAGES]),
            CO.T_OTHER: CO.other_stages_time(st["first"], st["middle"], st["last"], CO.T_MB,
                                             S.pp, c.multi),
            CO.STEP_SYMBOLS["pipeline/bubble"]: PP.bubble_s(CO.M_SYM, CO.T_OTHER, CO.W_FILL,
                                                            PP.flushes(c), CO.T_MB),
        }
    extra: dict[sp.Symbol, sp.Expr] = {}
    if zbv_bubble is not None:  # ZB-V's order's bubble in the closed form's place
        bubble = CO.STEP_SYMBOLS["pipeline/bubble"]
        composition[bubble] = CO.T_ZBV if c.zbv == 1 else \
            times(1 - c.zbv, composition[bubble]) + CO.T_ZBV
        extra[CO.T_ZBV] = zbv_bubble
    values = {CO.M_SYM: c.m, CO.W_FILL: w_fill, **extra,
              **{CO.STAGE_SYMBOLS[st]: t for st, t in stage_time.items()},
              **{sym: step_terms[name] for name, sym in symbols.items()
                 if name != "pipeline/bubble"}}
    return {"composition": composition, "term_values": values}
