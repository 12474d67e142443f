"""A collective, declared once: what a rank issues, and from it its time and its ledger entry.

A `Collective` names the operation, the group (a parallel axis), the bytes and the calls, when in
the step it is issued (the ledger's phase), on which pipeline stage, the Phase whose time holds it
and the breakdown term it adds to. From that one declaration
    its time     t = calls x t_call,   t_call = group_time(op, nbytes, axis)    [s]
    its ledger   CommOp(name, axis, op, phase, calls x active(group) [x m], nbytes, stage)
where group_time costs one call on the links the family's placement gives the axis's group
(intra-node, inter-node or mixed) with the cheapest algorithm (or the one the hardware fixes), or
with a calibrated fit where the hardware has one. The ledger feeds perfmodel.predict.comm_ledger,
`validate --dry-run` (validation/dryrun.py) and `predict --profile`'s extrapolation notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import collectives as C
from perfmodel.costs.lattice import lmin
from perfmodel.family import SCOPES, Family
from perfmodel.step.context import I, active

AXIS_DEGREE = {"tp": S.tp, "dp": S.dp, "pp": S.pp, "tpa": S.q_a, "tpb": S.q_b, "tpc": S.q_c,
               "cp": S.cp, "ep": S.ep, "dp_cp": S.dp * S.cp, "edp": S.tp * S.dp * S.cp / S.ep}
_AXIS_PER_NODE = {"tp": S.k_tp, "dp": S.k_dp, "pp": S.k_pp, "tpa": S.k_a, "tpb": S.k_b,
                  "tpc": S.k_c, "cp": S.k_cp, "ep": S.k_ep, "dp_cp": S.k_dpcp, "edp": S.k_edp}
# when a collective is issued: in a micro-batch's forward, backward, both, or once per step
LEDGER_PHASES = ("fwd", "bwd", "fwd+bwd", "step")
# on which pipeline stages: every one, or only the first (embedding), the last (output layer) or
# the ones between (a pipeline's send/receive counts differ by position)
LEDGER_STAGES = ("every", "first", "last", "middle")


@dataclass(frozen=True)
class CommOp:
    """A ledger record: a kind of collective a rank issues, `nbytes` per call (nccl-tests
    convention), `calls` per step."""

    name: str
    axis: str
    op: str
    phase: str
    calls: sp.Expr
    nbytes: sp.Expr
    stage: str = "every"  # every stage, or only the "first" (embedding) or "last" (output layer)


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One kind of collective a rank issues, declared once.

    calls: per micro-batch on a stage that holds the issuing part (phase fwd, bwd, fwd+bwd), or
    per step (phase step); a group of one rank issues none (the ledger multiplies by active(n), the
    time's group_time is 0). transfers: the calls on the critical path, where fewer than calls (a
    pipeline receive waits for its peer's send: one transfer for the pair). in_phase: the Phase
    whose time holds this collective's time; term: the breakdown term it adds to.
    time_nbytes: the bytes its time is taken for, where not nbytes (an expert all-to-all: the
    busiest rank receives more than a rank sends). ledger_share: a factor of its ledger calls
    (a per-stage twin of a collective that one stage already counts with pp = 1: multi).
    """

    name: str
    op: str
    axis: str
    nbytes: sp.Expr
    calls: sp.Expr
    phase: str
    in_phase: str
    term: str
    fam: Family
    stage: str = "every"
    transfers: sp.Expr | None = None
    time_nbytes: sp.Expr | None = None
    ledger_share: sp.Expr = sp.Integer(1)

    def __post_init__(self) -> None:
        C.Op(self.op)
        if self.axis not in AXIS_DEGREE:
            raise ValueError(f"Collective.axis must be one of {', '.join(AXIS_DEGREE)}, "
                             f"got '{self.axis}'")
        if self.phase not in LEDGER_PHASES or self.stage not in LEDGER_STAGES:
            raise ValueError(f"Collective {self.name}: phase must be one of {LEDGER_PHASES} and "
                             f"stage one of {LEDGER_STAGES}, got '{self.phase}', '{self.stage}'")

    @property
    def per_step(self) -> bool:
        """Issued once per step (True) or in every micro-batch (False)."""
        return self.phase == "step"

    @property
    def scope(self) -> str | None:
        """The links of its group: intra, inter, mixed, or None (open: the plan's indicators)."""
        return self.fam.scope(self.axis)

    @cached_property
    def call_s(self) -> sp.Expr:
        """Time of one call [s]: 0 for a group of one rank."""
        nbytes = self.nbytes if self.time_nbytes is None else self.time_nbytes
        return group_time(self.op, nbytes, self.axis, self.fam)

    @cached_property
    def time_s(self) -> sp.Expr:
        """Time of its calls per micro-batch (or per step, for phase step) [s]."""
        return (self.calls if self.transfers is None else self.transfers) * self.call_s

    def time_per_step_s(self, m: sp.Expr) -> sp.Expr:
        """Time of its calls in one step of m micro-batches [s]."""
        return self.time_s if self.per_step else m * self.time_s

    @cached_property
    def launches(self) -> sp.Expr:
        """Calls issued per micro-batch (or per step): none in a group of one rank."""
        return self.calls * active(AXIS_DEGREE[self.axis])

    def ledger_entry(self, m: sp.Expr) -> CommOp:
        """Its ledger record: calls per step."""
        calls = (self.launches if self.per_step else self.launches * m) * self.ledger_share
        return CommOp(self.name, self.axis, self.op, self.phase, calls, self.nbytes, self.stage)


def group_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """Time of one collective over the group of a parallel axis, on the links its placement gives.

    intra: all ranks in one node (NVLink); inter: one rank per node, the node's NICs shared by its
    G GPUs; mixed: k ranks per node: the cheaper of a flat ring (its inter-node hop shares the NICs
    among G/k groups) and the hierarchical form. The algorithm is the cheapest unless the hardware
    fixes one. A calibrated fit for (op, scope) replaces the generic link model. An open scope is
    the sum of the three, each weighted by its indicator.
    """
    return _group_time(op, sp.sympify(nbytes), axis, fam)


@lru_cache(maxsize=4096)
def _group_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    n, scope = AXIS_DEGREE[axis], fam.scope(axis)
    if scope is not None:
        return active(n) * _scope_time(op, nbytes, axis, scope, fam)
    fitted = {sc for sc in SCOPES if any(o == op and fs == ("intra" if sc == "intra" else "inter")
                                         for (o, fs, _) in fam.fits)}
    generic = _open_scope_time(op, nbytes, axis, fam)
    if not fitted:
        return active(n) * generic
    return active(n) * sum((I[f"{axis}_{sc}"] * (_scope_time(op, nbytes, axis, sc, fam)
                                                 if sc in fitted else generic)
                            for sc in SCOPES), sp.Integer(0))


def _scope_time(op: str, nbytes: sp.Expr, axis: str, scope: str, fam: Family) -> sp.Expr:
    """Time of one collective of an axis's group when the group lies `scope` (intra/inter/mixed)."""
    n, k = AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    fit_scope = "intra" if scope == "intra" else "inter"
    fitted = sorted(alg for (o, sc, alg) in fam.fits if o == op and sc == fit_scope)
    if fitted:  # one per op and scope: HardwareSpec and profiles refuse a second
        alpha, busbw, alpha_small, busbw_small, breakpoint = S.fit_symbols(op, fit_scope)
        steps, factor = C.steps(op, n, fitted[0]), C.bus_factor(op, n)
        large = steps * alpha + factor * nbytes / busbw
        small = steps * alpha_small + factor * nbytes / busbw_small
        return sp.Piecewise((small, nbytes < breakpoint), (large, True))
    algs = list(C.ALGORITHMS[C.Op(op)])
    if fam.algorithm not in ("auto", "hierarchical") and C.Algorithm(fam.algorithm) in algs:
        algs = [C.Algorithm(fam.algorithm)]
    if scope == "intra":
        options = [C.collective_time(op, nbytes, n, S.alpha_i, S.beta_i, alg) for alg in algs]
    elif scope == "inter":
        beta = S.beta_o / S.G
        options = [C.collective_time(op, nbytes, n, S.alpha_o, beta, alg) for alg in algs]
    else:
        flat_beta = sp.Min(S.beta_i, S.beta_o * k / S.G, evaluate=False)
        options = [C.collective_time(op, nbytes, n, S.alpha_o, flat_beta, alg) for alg in algs]
        hier = C.hierarchical_time(op, nbytes, n, k, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o / S.G)
        options = [hier] if fam.algorithm == "hierarchical" else [*options, hier]
    if fam.algorithm == "hierarchical" and scope != "mixed":
        options = options[:1]
    return options[0] if len(options) == 1 else lmin(*options)


_NEVER_S = sp.Float(1e30)  # a time no algorithm takes: removes an option from a Min


def _open_scope_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """The generic link model of _scope_time for a scope left open, written once: the scope picks
    the latency and bandwidth through its indicators, and the hierarchical form competes only in
    mixed groups. Equal to sum(I_scope * _scope_time(scope)) with a third of the operations."""
    n, k = AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    i_intra, i_inter, i_mixed = (I[f"{axis}_{sc}"] for sc in SCOPES)
    alpha = i_intra * S.alpha_i + (1 - i_intra) * S.alpha_o
    beta = i_intra * S.beta_i + i_inter * S.beta_o / S.G + i_mixed * sp.Min(
        S.beta_i, S.beta_o * k / S.G, evaluate=False)
    algs = list(C.ALGORITHMS[C.Op(op)])
    if fam.algorithm not in ("auto", "hierarchical") and C.Algorithm(fam.algorithm) in algs:
        algs = [C.Algorithm(fam.algorithm)]
    if fam.algorithm == "hierarchical":
        algs = algs[:1]
    options = [C.collective_time(op, nbytes, n, alpha, beta, alg) for alg in algs]
    if op not in ("all_to_all", "send_recv"):
        hier = C.hierarchical_time(op, nbytes, n, k, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o / S.G)
        if fam.algorithm == "hierarchical":
            # fixed: hierarchical in mixed groups, the first algorithm elsewhere
            return i_mixed * hier + (1 - i_mixed) * options[0]
        options.append(hier + _NEVER_S * (1 - i_mixed))
    return options[0] if len(options) == 1 else lmin(*options)
