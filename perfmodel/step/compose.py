"""A Phase, and the one rule that composes phases into a micro-batch, a stage and a step.

A phase is what one part of the model does once in a micro-batch on a stage (the layers' forward,
the embedding's backward, the pipeline's sends and receives), or once per step (the gradient
sync, the optimizer). It has
    device: seconds on the device, by breakdown term (kernels' rooflines; how much slower the
            framework runs them, where measured)
    host:   seconds of dispatch on the host, by breakdown term (a cost per kernel launch; the
            framework's measured fixed costs)
    comms:  the collectives it issues (perfmodel.step.collective), each adding its time to its
            own term
    overlap: None, or the compute its collectives may hide behind (an Overlap)
    present: 1 on a stage that holds the part (the embedding on the first stage), else 0.

The composition rule, here and nowhere else:
    t_phase = present x (device + host + exposed(comm))                                   [s]
    exposed(comm) = comm                                        no Overlap
                  = I max(0, comm - window) + (1 - I) comm       Overlap (I: the plan overlaps)
    t_stage = sum of its micro-batch phases' terms + t_coll x its collective launches
    t_mb    = max(t_first, t_last)                              (the slowest stage)
    T_step  = m t_mb + T_bubble + sum of the step phases' terms (+ t_coll x per-step launches)
Host and device time add (synchronous ranks; nothing of the host hides behind the device) and
communication adds unless its phase names a window (today the data-parallel sync, behind the
backward). A collective's launches are charged where it is issued (its ledger phase: in every
micro-batch, on the stages its ledger entry names, or once per step), its time in the phase that
holds it: FSDP's gathers, issued in every micro-batch, are timed with the step's sync.
The next issue changes it here: host and device overlapped on asynchronous devices, and Overlaps
on the layers' tensor-parallel collectives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs.lattice import lmax
from perfmodel.step.collective import Collective

ZERO, ONE = sp.Integer(0), sp.Integer(1)

# The breakdown of one micro-batch on a stage, and of the rest of the step, in print order.
STAGE_TERMS = (
    "compute/forward/gemm", "compute/forward/attention", "compute/forward/elementwise",
    "compute/forward/embedding_logits",
    "compute/backward/gemm", "compute/backward/attention", "compute/backward/elementwise",
    "compute/backward/embedding_logits",
    "compute/forward/framework", "compute/backward/framework", "compute/recompute",
    "comm/tp", "comm/cp", "comm/ep", "overhead/kernels", "pipeline/p2p", "overhead/collectives",
)
STEP_TERMS = ("pipeline/bubble", "comm/dp", "comm/dp_framework", "comm/tp_grads", "optimizer/step")
# Terms only some families have (an fp8 plan's casts, perfmodel.step.fp8): a breakdown shows them
# where a phase gives them, after the terms above.
OPTIONAL_STAGE_TERMS = ("compute/forward/fp8_cast", "compute/backward/fp8_cast")
OPTIONAL_STEP_TERMS = ("compute/fp8_weight_cast",)


def _present(terms: tuple[str, ...], optional: tuple[str, ...],
             phases: Sequence[Phase]) -> tuple[str, ...]:
    """terms, and those of `optional` that some phase gives."""
    given = {t for p in phases for t in (*p.device, *p.host)}
    return terms + tuple(t for t in optional if t in given)


@dataclass(frozen=True)
class Overlap:
    """Communication that may hide behind compute: up to `window_s` of it, when `enabled`."""

    behind: str  # the compute it hides behind, in words
    window_s: sp.Expr
    enabled: sp.Expr  # 0/1 (or an indicator symbol)


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One phase of a micro-batch on a stage (or of the step: per_step); see the module doc."""

    name: str
    device: Mapping[str, sp.Expr] = field(default_factory=dict)
    host: Mapping[str, sp.Expr] = field(default_factory=dict)
    comms: tuple[Collective, ...] = ()
    overlap: Overlap | None = None
    present: sp.Expr = ONE
    per_step: bool = False

    def __post_init__(self) -> None:
        known = STEP_TERMS + OPTIONAL_STEP_TERMS if self.per_step \
            else STAGE_TERMS + OPTIONAL_STAGE_TERMS
        for term in (*self.device, *self.host, *(c.term for c in self.comms)):
            if term not in known:
                raise ValueError(f"phase {self.name}: '{term}' is not a term of "
                                 f"{'the step' if self.per_step else 'a stage'}")
        wrong = [c.name for c in self.comms if c.in_phase != self.name]
        if wrong or (not self.per_step and any(c.per_step for c in self.comms)):
            raise ValueError(f"phase {self.name}: collectives {wrong} belong to another phase")


def exposed(comm_s: sp.Expr, overlap: Overlap | None) -> sp.Expr:
    """The part of a phase's communication time that is not hidden [s]."""
    if overlap is None:
        return comm_s
    hidden_rest = lmax(0, comm_s - overlap.window_s)
    return overlap.enabled * hidden_rest + (1 - overlap.enabled) * comm_s


def phase_terms(phase: Phase, m: sp.Expr = ONE) -> dict[str, sp.Expr]:
    """A phase's seconds by breakdown term, by the rule above (m: micro-batches per step, for the
    per-micro-batch collectives a step phase holds)."""
    terms: dict[str, list[sp.Expr]] = {}
    for part in (phase.device, phase.host):
        for term, seconds in part.items():
            terms.setdefault(term, []).append(seconds)
    comm: dict[str, list[sp.Expr]] = {}
    for c in phase.comms:
        comm.setdefault(c.term, []).append(c.time_per_step_s(m) if phase.per_step else c.time_s)
    for term, times in comm.items():
        terms.setdefault(term, []).append(exposed(sp.Add(*times), phase.overlap))
    return {term: phase.present * sp.Add(*parts) for term, parts in terms.items()}


def launch_s(collectives: Iterable[Collective], stage: str | None = None) -> sp.Expr:
    """Host time of launching collectives, t_coll per call [s]: on a stage (per micro-batch) those
    issued in a micro-batch whose ledger entry names that stage or every stage; with stage None
    (per step) those issued once per step.

    Note: with pp = 1 the one stage is composed twice, as "first" and as "last", and each counts
    only the launches its ledger stage names (the first lacks the output layer's, the last the
    embedding's), while their time counts on both; kept as it was (issue 15 changes no number).
    """
    if stage is None:
        calls = [c.launches for c in collectives if c.per_step]
    else:
        calls = [c.launches for c in collectives if not c.per_step and c.stage in ("every", stage)]
    return S.t_coll * sp.Add(*calls)


def stage_terms(phases: Sequence[Phase], launches_s: sp.Expr) -> dict[str, sp.Expr]:
    """One micro-batch on one stage, by breakdown term [s]: its phases and its launches."""
    parts: dict[str, list[sp.Expr]] = {
        term: [] for term in _present(STAGE_TERMS, OPTIONAL_STAGE_TERMS, phases)}
    for phase in phases:
        for term, seconds in phase_terms(phase).items():
            parts[term].append(seconds)
    parts["overhead/collectives"].append(launches_s)
    return {term: sp.Add(*p) for term, p in parts.items()}


def backward_s(terms: Mapping[str, sp.Expr]) -> sp.Expr:
    """One micro-batch's backward on a stage [s]: its compute/backward terms."""
    return sp.Add(*(t for name, t in terms.items() if name.startswith("compute/backward")))


def step_terms(phases: Sequence[Phase], m: sp.Expr, launches_s: sp.Expr,
               bubble_s: sp.Expr) -> dict[str, sp.Expr]:
    """The step's terms beyond its m micro-batches [s]: the pipeline bubble, the step phases, and
    the launches of the per-step collectives (charged to the optimizer step)."""
    parts: dict[str, list[sp.Expr]] = {
        term: [] for term in _present(STEP_TERMS, OPTIONAL_STEP_TERMS, phases)}
    parts["pipeline/bubble"].append(bubble_s)
    for phase in phases:
        for term, seconds in phase_terms(phase, m).items():
            parts[term].append(seconds)
    parts["optimizer/step"].append(launches_s)
    return {term: sp.Add(*p) for term, p in parts.items()}


# --- the step's composition: functions applied to the terms' symbols (what `explain` prints) and
# to their expressions (what predict evaluates), so that the two cannot differ -------------------

def micro_batch_time(stage_times: Iterable[sp.Expr]) -> sp.Expr:
    """t_mb = max over the stages of one micro-batch's time [s]: the slowest sets the pace."""
    return lmax(*stage_times)


def step_time(m: sp.Expr, t_mb: sp.Expr, terms: Mapping[str, sp.Expr]) -> sp.Expr:
    """T_step = m t_mb + T_bubble + T_dp + T_dp_framework + T_tp_grads + T_opt [s] (+ T_fp8_wc,
    an fp8 plan's weight casts)."""
    return sp.Add(m * t_mb, *(terms[name] for name in (*STEP_TERMS, *OPTIONAL_STEP_TERMS)
                              if name in terms))


# the symbols of the composition, as `explain` prints it
M_SYM, T_MB, W_FILL = sp.Symbol("m"), sp.Symbol("t_mb"), sp.Symbol("W_fill")
STAGE_SYMBOLS = {"first": sp.Symbol("t_first"), "last": sp.Symbol("t_last")}
STEP_SYMBOLS = {"pipeline/bubble": sp.Symbol("T_bubble"), "comm/dp": sp.Symbol("T_dp"),
                "comm/dp_framework": sp.Symbol("T_dp_framework"),
                "comm/tp_grads": sp.Symbol("T_tp_grads"), "optimizer/step": sp.Symbol("T_opt"),
                "compute/fp8_weight_cast": sp.Symbol("T_fp8_wc")}
