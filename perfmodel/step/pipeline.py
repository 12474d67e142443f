"""The pipeline: which stage holds what, its sends and receives, and the schedule's bubble.

Stages: the first holds the embedding, the last the output layer and loss, the ones between
(middle) neither; with pp = 1 one stage holds both. Each holds L/pp layers (v chunks of them,
interleaved), or, split unevenly, the first and last stages the layers the plan gives them and
the others the rest (perfmodel.step.context.stage_layers).
Send/receive: per chunk and micro-batch an activation crosses forward and its gradient backward,
e T h / r bytes each, r the ranks an activation is split over (tp with sequence parallelism or a
2D/3D grid, else 1: Megatron-Core's get_tensor_shapes divides the sequence by tp only under
sequence parallelism; Megatron-LM's scatter-gather of 2021, Narayanan et al. SC21 Sec. 4.1, which
sent 1/tp and gathered it, is gone; the validation job sends what its stages output):
    t_p2p = 2 v t_send_recv                                              [s per micro-batch]
Bubble (Narayanan et al. SC21, Sec. 2.2): (pp - 1)/v micro-batch times idle in every step, each
the time of a stage other than the slowest (the fill and drain pass through every stage once:
their sum, less the slowest's, which every micro-batch pays anyway; compose.other_stages_time):
    T_bubble = min(B, max(0, (m + B)/rho - m)) x max(0, t_other - W_fill),   B = (pp - 1)/v
    t_other  = (t_first + (pp - 2) t_middle + t_last - t_mb) / (pp - 1)
where ranks time-sharing a device (rho > 1, CPU ranks on fewer cores) run faster while others wait:
the pipeline takes max(m, (m + B)/rho) micro-batch times (the rates are per rank with every rank
busy, so m of them are the cores' work), so the bubble lasts min(B, max(0, (m + B)/rho - m)) (B
when rho = 1). Zero-bubble schedules split the backward into input gradients (B) and weight
gradients (W) and fill the bubble with W: ZB1P leaves (pp - 1)(F + B - W), ZB-V (pp - 1)(F + B - 2W)
per chunk (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3 and 6).
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import lmax, lmin, times
from perfmodel.step.collective import Collective
from perfmodel.step.compose import Phase, in_backward_s
from perfmodel.step.context import Context
from perfmodel.step.framework import BACKWARD_PER_FORWARD

STAGES = ("first", "last", "middle")
TRANSFERS_PER_CHUNK = 2  # an activation forward, its gradient backward


def holds(c: Context, stage: str) -> tuple[sp.Expr, sp.Expr]:
    """(1 if the stage holds the embedding, 1 if it holds the output layer): both with one stage
    and on zbv's first rank (Context.head_first), neither on a middle stage."""
    if stage == "middle":
        return sp.Integer(0), sp.Integer(0)
    if stage == "first":
        return sp.Integer(1), c.single + c.head_first
    return c.single, 1 - c.head_first


def p2p_collectives(c: Context) -> dict[str, tuple[Collective, ...]]:
    """The sends and receives of one micro-batch, per stage position.

    Messages a rank sends or receives: 4 per chunk (activation in and out, gradient in and out),
    less the 2 the very first and very last chunk of the model skip (V shape, zbv: rank 0 holds
    the model's first and last chunks, 2 messages each; the last rank holds two middle chunks).
    With Megatron-LM's scatter-gather (Plan.pp_scatter_gather) each message is 1/tp of the
    activation, and the rank all-gathers each one it receives over tp (half the messages:
    p2p_communication's gather_split_1d_tensor), on the pipeline's time.
    """
    v, zbv = S.v, c.zbv
    messages = {"first": 4 * v - 2 - zbv * (4 * v - 6), "last": 4 * v - 2 + 2 * zbv,
                "middle": 4 * v}
    whole = S.e * c.T * S.h
    split = S.tp if c.fam.pp_scatter_gather else c.act_ranks
    out = {}
    for stage, calls in messages.items():
        sends = [Collective(name="pp/send_recv", op="send_recv", axis="pp", nbytes=whole / split,
                            calls=calls, phase="fwd+bwd", in_phase="pipeline/p2p",
                            term="pipeline/p2p", fam=c.fam, stage=stage,
                            transfers=TRANSFERS_PER_CHUNK * v)]
        if c.fam.pp_scatter_gather:
            sends.append(Collective(name="pp/gather/all_gather", op="all_gather", axis="tp",
                                    nbytes=whole, calls=calls / 2, phase="fwd+bwd",
                                    in_phase="pipeline/p2p", term="pipeline/p2p", fam=c.fam,
                                    stage=stage, transfers=TRANSFERS_PER_CHUNK * v))
        out[stage] = tuple(sends)
    return out


def p2p_phase(collectives: tuple[Collective, ...]) -> Phase:
    return Phase(name="pipeline/p2p", comms=collectives)


def weight_gradient_fill(c: Context, stage_terms: Mapping[str, Mapping[str, sp.Expr]]) -> sp.Expr:
    """W_fill = zb (2 + zbv) min over stages of W [s], W = the weight-gradient half of the stage's
    backward GEMMs (a backward is two forwards: input and weight gradients), as the host lets
    them run (compose.in_backward_s: a host-bound stage's W passes take as long as the host
    issuing them; their device time alone before 2026-12-07, when a faster GPU grew a
    host-bound bubble)."""
    w = {st: in_backward_s((terms["compute/backward/gemm"]
                            + terms["compute/backward/embedding_logits"]) / BACKWARD_PER_FORWARD,
                           terms) for st, terms in stage_terms.items()}
    if "middle" in w:  # a middle stage exists from pp = 3 on; below, never the smallest
        w["middle"] = w["middle"] + (1 - middle_exists()) * w["first"]
    return times(c.zero_bubble * (2 + c.zbv), lmin(*w.values()))


def middle_exists() -> sp.Expr:
    """1 from pp = 3 on (a stage holding neither end), else 0."""
    return sp.Max(0, sp.Min(1, S.pp - 2, evaluate=False), evaluate=False)


def bubble_s(m: sp.Expr, t_other: sp.Expr, w_fill: sp.Expr,
             flushes: sp.Expr | int = 1) -> sp.Expr:
    """T_bubble [s] (see the module doc); m, t_other and W_fill as expressions or as symbols.
    With F pipeline schedules a step (flushes; torchtitan and NeMo AutoModel run one per
    gradient-accumulation step), each of m / F micro-batches fills and drains: F bubbles."""
    bubble = (S.pp - 1) / S.v
    per = m / flushes
    kept = lmin(bubble, lmax(0, (per + bubble) / S.rho - per))
    return flushes * kept * lmax(0, t_other - w_fill)


def flushes(c: Context) -> sp.Expr:
    """Pipeline schedules per step: F_pp where the plan runs several (Plan.pipeline_micro_batches),
    else 1."""
    return S.F_pp if c.fam.pipeline_flushes else sp.Integer(1)


def schedule_micro_batches(c: Context) -> sp.Expr:
    """Micro-batches of one pipeline schedule, m / F (Plan.pipeline_micro_batches where the step
    runs several schedules, else the step's m): each schedule drains, its last backward done,
    before the next fills, so what a stage holds in flight is counted on these, not on m
    (perfmodel.step.memory; perfmodel.strategy's schedule_micro_batches for the plan rules)."""
    return c.m / flushes(c)
