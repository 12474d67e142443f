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
gradients (W) and fill the bubble with W: ZB1P leaves (pp - 1)(F + B - W) per chunk (Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 3 and 6). ZB-V's bubble is its order's
(zbv_bubble_s, since 2026-12-07): the paper's (pp - 1)(F + B - 2W) is one of the chains of its
order, which also holds the last rank's late start, (pp - 1) F, the cool-down's 2 (pp - 1)(B - W)
and, below 2 pp - 1 micro-batches, the holes of the missing ones (zbv_terms); on stages of the
other stages' pace, less what a slower stage's own work covers. Against the order laid out with
each stage's own pass times (predict --trace), over 96 plans: median 0.8%, worst 8.3% short; the
paper's form alone, median 2.5%, worst 23.9% short (docs/timeline.md).
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


def weight_gradients_s(stage_terms: Mapping[str, Mapping[str, sp.Expr]]) -> dict[str, sp.Expr]:
    """Each stage's weight-gradient passes of a micro-batch [s]: the weight-gradient half of its
    backward GEMMs (a backward is two forwards: input and weight gradients), as the host lets
    them run (compose.in_backward_s)."""
    return {st: in_backward_s((terms["compute/backward/gemm"]
                               + terms["compute/backward/embedding_logits"])
                              / BACKWARD_PER_FORWARD, terms)
            for st, terms in stage_terms.items()}


def weight_gradient_fill(c: Context, stage_terms: Mapping[str, Mapping[str, sp.Expr]]) -> sp.Expr:
    """W_fill = zb (2 + zbv) min over stages of W [s], W = the weight-gradient half of the stage's
    backward GEMMs (a backward is two forwards: input and weight gradients), as the host lets
    them run (compose.in_backward_s: a host-bound stage's W passes take as long as the host
    issuing them; their device time alone before 2026-12-07, when a faster GPU grew a
    host-bound bubble)."""
    w = dict(weight_gradients_s(stage_terms))
    if "middle" in w:  # a middle stage exists from pp = 3 on; below, never the smallest
        w["middle"] = w["middle"] + (1 - middle_exists()) * w["first"]
    return times(c.zero_bubble * (2 + c.zbv), lmin(*w.values()))


def zbv_terms(pp: sp.Expr, m: sp.Expr) -> list[tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]]:
    """ZB-V's idle time a flush, as the order runs (perfmodel.schedule: torch's
    ScheduleZBVZeroBubble, its order built for max(2 pp - 1, m) micro-batches, the missing ones'
    passes dropped): [(gate, a, b, c)], the bubble the largest gate (a F + b B + c W) over them,
    F, B, W one chunk's forward, input-gradient and weight-gradient times, m the micro-batches of
    the flush. Each term is a chain of dependent passes, the span the longest path through the
    order's graph: the last rank starts (pp - 1) F late; the first's last input gradient waits
    (pp - 1) B; the paper's (pp - 1)(F + B - 2W), two weight gradients hiding each hop; the
    cool-down's 2 (pp - 1)(B - W); below 2 pp - 1 micro-batches the holes of the dropped ones,
    (2 pp - 1 - m)(F + B). Derived from the simulator's critical paths (integer coefficients,
    piecewise in m with breaks at pp, pp + 1 and 2 pp - 1) and checked against it to 1e-14
    relative over pp 2 to 16, m 1 to 4 pp and F, B, W from 0.1 to 2.5 (and at random points
    anywhere in (0, 4]^3), 2026-12-07. Written by hand: no library derives a schedule's span."""
    p, k = pp, pp - 1

    def mx(*args: sp.Expr | int) -> sp.Expr:
        return sp.Max(*args, evaluate=False)

    def mn(*args: sp.Expr | int) -> sp.Expr:
        return sp.Min(*args, evaluate=False)

    mp = mn(m, 2 * p - 1)  # the micro-batches the order's pattern sees, capped
    u = mx(0, p - m)  # short of pp: holes in the warm-up
    j = mx(0, mp - p)  # beyond pp, at most pp - 1
    r = 2 * p - 1 - mp  # short of 2 pp - 1
    ge_p = mx(0, mn(1, m - p + 1))  # 1 from m = pp on
    gt_p = mx(0, mn(1, m - p))  # 1 from m = pp + 1 on
    one = sp.Integer(1)
    return [
        (one, 2 * u, 2 * k, -2 * j),
        (one, k + u, k + u, -2 * j),
        (one, 2 * k, 2 * u, -mn(2 * (m - 1), 2 * p - 1)),
        (one, 2 * k, mx(2 * k - 3 * (m - 1), -k), -mn(m - 1, mx(1, mn(k, 4 * p - 1 - 2 * m)))),
        (one, 2 * u, mx(k, 2 * k - 2 * j), sp.Integer(0)),
        (one, k, sp.Integer(0), sp.Integer(0)),
        (gt_p, sp.Integer(0), mx(1, 2 * p - m), mn(k - 1, m - p - 1)),
        (gt_p, mx(1, 2 * p - m), sp.Integer(0), mn(k - 1, m - p - 1)),
        (gt_p, mp - 2, -(mp - p - 1), sp.Integer(0)),
        (gt_p, mp - 2, 2 * p - mp, -2 * (mp - p)),
        (gt_p, mp - 1, -(mp - p), -one),
        (ge_p, r, r, sp.Integer(0)),
        (ge_p, mp - 1, 3 * p - 1 - 2 * mp, -mn(mp - p, 2 * p - mp)),
        (ge_p, sp.Integer(0), 3 * p - 2 - mp, -r),
        (ge_p, k, r, -r),
        (ge_p, mp - 2, 3 * p - 2 * mp, -r),
        (ge_p, 2 * k, -j, -(3 * r + 1)),
        (ge_p, mp - 1, r, -(2 * mp - 2 * p + 1)),
        (gt_p, 2 * k, -j, -(2 * p - 2 - j)),
    ]


def zbv_flush_bubble(pp: sp.Expr, m: sp.Expr, f: sp.Expr, b: sp.Expr, w: sp.Expr) -> sp.Expr:
    """ZB-V's idle time of one flush of m micro-batches [s] from one chunk's pass times
    (zbv_terms; (pp - 1) F at least, the last rank's late start, never below 0)."""
    chains = []
    for g, a, b_, c_ in zbv_terms(pp, m):
        # unevaluated: a number times a stage's expression has sympy ask each node whether it
        # is zero or finite (1.8 s a family)
        parts = [sp.Mul(coef, x, evaluate=False) for coef, x in ((a, f), (b_, b), (c_, w))
                 if coef != 0]
        if g == 0 or not parts:
            continue
        chain = sp.Add(*parts, evaluate=False) if len(parts) > 1 else parts[0]
        chains.append(chain if g == 1 else sp.Mul(g, chain, evaluate=False))
    return lmax(0, *chains)


def zbv_passes(stage_time: Mapping[str, sp.Expr], forward: Mapping[str, sp.Expr],
               weight: Mapping[str, sp.Expr], t_other: sp.Expr
               ) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(F, B, W) of one chunk of the stages other than the slowest [s]: t_other split by the
    stages' own shares of forward, input-gradient and weight-gradient time (the forward as the
    stage runs it, W weight_gradients_s's, B the rest of the backward), over v = 2 chunks, the
    stages weighted as other_stages_time weighs them."""
    weights = {"first": sp.Integer(1), "middle": lmax(0, S.pp - 2), "last": sp.Integer(1)}
    f, total, w = (sp.Add(*(weights[st] * x[st] for st in STAGES))
                   for x in (forward, stage_time, weight))
    # one chunk's share of a stage's time, unevaluated (as zbv_flush_bubble's)
    per = sp.Mul(t_other, sp.Pow(2 * lmax(total, sp.Float(1e-30)), -1, evaluate=False),
                 evaluate=False)
    w_chunk = sp.Mul(lmin(w, lmax(0, total - f)), per, evaluate=False)
    return (sp.Mul(f, per, evaluate=False), sp.Mul(lmax(0, total - f - w), per, evaluate=False),
            w_chunk)


def zbv_bubble_s(c: Context, m: sp.Expr, passes: tuple[sp.Expr, sp.Expr, sp.Expr],
                 t_other: sp.Expr, t_mb: sp.Expr, flushes: sp.Expr | int = 1) -> sp.Expr:
    """T_bubble of a ZB-V plan as its order runs [s], where the other stages' own order sets the
    step: each of `flushes` schedules of m / F micro-batches, on stages of the other stages'
    pace (t_other a micro-batch, of passes (F, B, W) a chunk), takes m/F t_other and their
    zbv_flush_bubble; the step pays what that exceeds of the slowest stage's m/F t_mb, less as
    bubble_s's time-sharing ranks (rho > 1) run faster while others wait. A slowest stage
    (ZB-V's first holds the embedding and the output layer) that the others' idle time fits
    under pays none of it. 0 for any other schedule (c.zbv)."""
    if c.zbv == 0:
        return sp.Integer(0)
    per = m / flushes
    full = (S.pp - 1) / S.v
    kept = lmin(full, lmax(0, (per + full) / S.rho - per))
    share = kept / lmax(full, sp.Rational(1, 2))  # 1 with rho = 1
    lead = sp.Mul(per, sp.Add(t_other, sp.Mul(-1, t_mb, evaluate=False), evaluate=False),
                  evaluate=False)  # what the other stages' work leaves of the slowest's
    idle = lmax(0, sp.Add(lead, zbv_flush_bubble(S.pp, per, *passes), evaluate=False))
    return times(c.zbv, flushes * share * idle)


def middle_exists() -> sp.Expr:
    """1 from pp = 3 on (a stage holding neither end), else 0."""
    return sp.Max(0, sp.Min(1, S.pp - 2, evaluate=False), evaluate=False)


def bubble_s(m: sp.Expr, t_other: sp.Expr, w_fill: sp.Expr, flushes: sp.Expr | int,
             t_mb: sp.Expr) -> sp.Expr:
    """T_bubble [s] (see the module doc); m, t_other and W_fill as expressions or as symbols.
    With F pipeline schedules a step (flushes; torchtitan and NeMo AutoModel run one per
    gradient-accumulation step), each of m / F micro-batches fills and drains: F bubbles.

    t_mb (the slowest stage's micro-batch): with v > 1 chunks and fewer micro-batches a schedule
    than stages (interleaved with pipeline_micro_batches below pp: torch's ScheduleInterleaved1F1B
    runs them in one round), the first micro-batch crosses all pp v chunks before the rounds
    repeat, and the span is at least its path, every stage once and the other m - 1 micro-batches
    a chunk each on the slowest: (pp - 1) t_other + t_mb + (m - 1) t_mb / v (pp + (m - 1)/v
    micro-batch times on equal stages, not m + (pp - 1)/v). It never binds where m >= pp (every
    Megatron plan; zb and zbv refuse fewer) or v = 1."""
    bubble = (S.pp - 1) / S.v
    per = m / flushes
    kept = lmin(bubble, lmax(0, (per + bubble) / S.rho - per))
    idle = lmax(0, t_other - w_fill)
    share = kept / lmax(bubble, 1 / (2 * S.v))  # 1 with rho = 1 (bubble >= 1/v from pp = 2)
    path = lmax(0, (S.pp - 1) * idle - lmax(0, per - 1) * (1 - 1 / S.v) * t_mb)
    return flushes * lmax(kept * idle, share * path)


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
