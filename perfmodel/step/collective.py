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

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

import sympy as sp

from perfmodel import symbols as S
from perfmodel.costs import collectives as C
from perfmodel.costs.lattice import lmin, times
from perfmodel.family import SCOPES, Family
from perfmodel.specs.hardware import LINK_PROTOCOLS
from perfmodel.specs.profile import two_regimes
from perfmodel.step.context import I, active

AXIS_DEGREE = {"tp": S.tp, "dp": S.dp, "pp": S.pp, "tpa": S.q_a, "tpb": S.q_b, "tpc": S.q_c,
               "cp": S.cp, "ep": S.ep, "dp_cp": S.dp * S.cp,
               "edp": S.tp * S.dp * S.cp / (S.ep * S.etp), "etp": S.etp, "etp_ep": S.etp * S.ep,
               "tp_dp_cp": S.tp * S.dp * S.cp}
_AXIS_PER_NODE = {"tp": S.k_tp, "dp": S.k_dp, "pp": S.k_pp, "tpa": S.k_a, "tpb": S.k_b,
                  "tpc": S.k_c, "cp": S.k_cp, "ep": S.k_ep, "dp_cp": S.k_dpcp, "edp": S.k_edp,
                  "etp": S.k_etp, "etp_ep": S.k_etpep, "tp_dp_cp": S.k_tdc}
# when a collective is issued: in a micro-batch's forward, backward, both, or once per step
LEDGER_PHASES = ("fwd", "bwd", "fwd+bwd", "step")
# on which pipeline stages: every one, the first (embedding), the last or the ones between (a
# pipeline's send/receive counts differ by position), or the one with the output layer (the last,
# or zbv's first: issued_share)
LEDGER_STAGES = ("every", "first", "last", "middle", "output")


def issued_share(declared: str, position: str, head_first: sp.Expr | int) -> sp.Expr:
    """1 where a collective declared for stage `declared` (LEDGER_STAGES) is issued on the
    pipeline position `position` (first, last, middle), else 0: the output layer's on the last,
    or on the first where it holds the output layer too (head_first, Context.head_first: zbv's
    V shape); with one stage composed as first and last, the output layer's count on the last."""
    if declared == "every":
        return sp.Integer(1)
    if declared == "output":
        return {"first": sp.sympify(head_first),
                "last": 1 - sp.sympify(head_first)}.get(position, sp.Integer(0))
    return sp.Integer(declared == position)


# the phases of the output layer's stage (LEDGER_STAGES "output") are named for the last
PHASE_STAGE = {"output": "last"}


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
    stage: str = "every"  # LEDGER_STAGES: every stage, one position, or the output layer's


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
    # the time of one call where not the library's collective (DeepEP's dispatch and combine:
    # dispatch_time), with active(group) in it
    call_time: sp.Expr | None = None

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
        if self.call_time is not None:
            return self.call_time
        nbytes = self.nbytes if self.time_nbytes is None else self.time_nbytes
        return group_time(self.op, nbytes, self.axis, self.fam)

    @cached_property
    def time_s(self) -> sp.Expr:
        """Time of its calls per micro-batch (or per step, for phase step) [s]."""
        # none issued: 0, without sympy asking whether the call's time could be infinite (a
        # walk of the whole expression, ~0.05 s for a 2D layout's all-reduce)
        return times(self.calls if self.transfers is None else self.transfers, self.call_s)

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


def issued_launches(collectives: Iterable[Collective], position: str,
                    head_first: sp.Expr | int) -> list[tuple[Collective, sp.Expr]]:
    """(collective, its launches per micro-batch) of each collective issued in a micro-batch on
    the pipeline position (issued_share); none is multiplied by a share of 1."""
    out = []
    for x in collectives:
        share = issued_share(x.stage, position, head_first)
        if not x.per_step and share != 0:
            out.append((x, x.launches if share == 1 else x.launches * share))
    return out


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
    n = AXIS_DEGREE[axis]
    fit_scope = "intra" if scope == "intra" else "inter"
    fitted = sorted(alg for (o, sc, alg) in fam.fits if o == op and sc == fit_scope)
    if fitted:  # one per op and scope: HardwareSpec and profiles refuse a second
        alpha, busbw, alpha_small, busbw_small, breakpoint = S.fit_symbols(op, fit_scope)
        steps, factor = C.steps(op, n, fitted[0]), C.bus_factor(op, n)
        large = steps * alpha + factor * nbytes / busbw
        small = steps * alpha_small + factor * nbytes / busbw_small
        return two_regimes(small, large, nbytes, breakpoint, busbw, busbw_small)
    options = _options(op, nbytes, axis, fam)
    chosen = [option[scope] for option in options if option[scope] is not None]
    return chosen[0] if len(chosen) == 1 else lmin(*chosen)


def dispatch_time(row_bytes: sp.Expr, copies: Callable[[sp.Expr], sp.Expr], axis: str,
                  fam: Family) -> sp.Expr:
    """One DeepEP dispatch (or combine) over the axis's group [s], n ranks, k of them in each of
    N = n / k nodes: DeepEP's normal kernels send a token once to each node that holds one of
    its experts, to the rank of the sender's local index there (RDMA), which forwards it over
    NVLink to each of that node's ranks holding one of its experts (deepseek-ai/DeepEP,
    csrc/kernels/internode.cu; inside one node, once to each such rank). Of a rank's row_bytes
    (its tokens, one row each), per call:
        network   row_bytes D_N (N - 1) / N    over its NIC share beta_o / G
        NVLink    row_bytes D_n (k - 1) / k    over beta_i
    D_N = copies(N), D_n = copies(n): the distinct nodes and ranks a token's experts lie in
    (perfmodel.costs.moe.spread); the two links at once, as the all-to-all's:
        t = call + steps + max(network / (beta_o / G), NVLink / beta_i)
    one call, and one step of each link a token crosses (the kernels send to every peer at once
    over their channels, not in n - 1 rounds): the inter-node call and step plus an NVLink step
    across nodes, the NVLink ones inside one. Deduplicated by node and by rank, where NCCL's
    all-to-all sends every top-k copy (group_time)."""
    n, k = AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    links = _links(fam, axis)
    i, o = links["intra"]["simple"], links["inter"]["simple"]

    def scoped(scope: str, guard: sp.Expr | None) -> sp.Expr:
        beta_i, beta_o = i.bandwidth, o.bandwidth
        if guard is not None:  # an open scope's indicator: never a division by a missing link
            beta_i, beta_o = guard * beta_i + (1 - guard), guard * beta_o + (1 - guard)
        if scope == "intra":
            return i.call_s + i.step_s + row_bytes * copies(n) * (n - 1) / n / beta_i
        per_node = sp.Integer(1) if scope == "inter" else k
        nodes = n / per_node
        network = row_bytes * copies(nodes) * (nodes - 1) / nodes / (beta_o / S.G)
        nvlink = row_bytes * copies(n) * (per_node - 1) / per_node / beta_i
        if scope == "inter":
            return o.call_s + o.step_s + network
        return o.call_s + o.step_s + i.step_s + sp.Max(network, nvlink, evaluate=False)

    scope = fam.scope(axis)
    if scope is not None:
        return active(n) * scoped(scope, None)
    return active(n) * sum((I[f"{axis}_{sc}"] * scoped(sc, I[f"{axis}_{sc}"])
                            for sc in SCOPES), sp.Integer(0))


_NEVER_S = sp.Float(1e30)  # a time no algorithm takes: removes an option from a Min


def _open_scope_time(op: str, nbytes: sp.Expr, axis: str, fam: Family) -> sp.Expr:
    """The generic link model of _scope_time for a scope left open: each option (an algorithm in
    a protocol) is the sum of its three scopes' times, each weighted by its indicator; an option
    a scope lacks (NVLS outside a node, the hierarchical form outside mixed groups) costs
    _NEVER_S there. Equal to sum(I_scope * _scope_time(scope)): one indicator is 1."""
    ind = {sc: I[f"{axis}_{sc}"] for sc in SCOPES}
    chosen = []
    for option in _options(op, nbytes, axis, fam, guards=ind):
        chosen.append(sum((ind[sc] * (t if t is not None else _NEVER_S)
                           for sc, t in option.items()), sp.Integer(0)))
    return chosen[0] if len(chosen) == 1 else lmin(*chosen)


def _links(fam: Family, axis: str) -> dict[str, dict[str, C.LinkCost]]:
    """Each link's protocols in the family, by name: simple (the link's latency per step and
    effective bandwidth, and its call start-up where the hardware gives one) and the low-latency
    protocols the hardware lists; the bandwidth is per GPU inside a node, per node between nodes.
    A protocol one link lacks is its Simple protocol there (perfmodel.encode.link_values).
    Between nodes: inter_node's symbols on a two-level fabric; on one of more levels the axis's
    own (perfmodel.encode.outer_link_values: the slowest level its group crosses)."""
    multi = fam.fabric_levels > 2
    alpha_o, beta_o, call_o = (S.outer_link_symbols(axis) if multi
                               else (S.alpha_o, S.beta_o, S.call_o))
    out: dict[str, dict[str, C.LinkCost]] = {}
    for link, alpha, beta, call in (("intra", S.alpha_i, S.beta_i, S.call_i),
                                    ("inter", alpha_o, beta_o, call_o)):
        simple = C.LinkCost(call if f"{link}:call" in fam.link_features else sp.Integer(0),
                            alpha, beta)
        costs = {C.Protocol.SIMPLE.value: simple}
        for proto in LINK_PROTOCOLS:
            if any(f"{lk}:{proto}" in fam.link_features for lk in ("intra", "inter")):
                if f"{link}:{proto}" in fam.link_features:
                    call_p, step_p, fraction = (
                        S.outer_protocol_symbols(axis, proto) if multi and link == "inter"
                        else S.protocol_symbols(link, proto))
                    costs[proto] = C.LinkCost(call_p, step_p, beta * fraction)
                else:
                    costs[proto] = simple
        out[link] = costs
    return out


def _algorithms(op: str, fam: Family) -> list[C.Algorithm]:
    """The algorithms "auto" chooses from for op: the library's, or the one the family fixes."""
    library = list(C.LIBRARY_ALGORITHMS[fam.collective_library][C.Op(op)])
    if fam.algorithm in ("auto", "nvls"):
        return library
    if fam.algorithm == "hierarchical":
        return library[:1]  # outside mixed groups: the first (ring)
    fixed = C.Algorithm(fam.algorithm)
    return [fixed] if fixed in C.ALGORITHMS[C.Op(op)] else library


def _options(op: str, nbytes: sp.Expr, axis: str, fam: Family,
             guards: dict[str, sp.Expr] | None = None) -> list[dict[str, sp.Expr | None]]:
    """Every way the library can run one collective of the axis's group, each as its time in the
    three scopes (None: not available there).

    intra: the group inside one node, over NVLink (per-GPU bandwidth beta_i);
    inter: one rank per node, each with its share beta_o / G of the node's NICs;
    mixed: k ranks per node: a flat ring or tree whose slowest hop is the NIC share of the group,
    min(beta_i, beta_o k / G), its steps at the intra- or inter-node latency as they cross
    (costs.collectives.mixed_flat_time); all_to_all and send_recv, whose every rank sends through
    its own NIC share (beta_o / G), all_to_all's traffic out of the GPU all over beta_i where
    that is the GPU's host link ("intra:host_link", costs.collectives.all_to_all_mixed_time);
    and the hierarchical form (all_reduce in nccl, every two-level op in generic), where the
    algorithm is auto or hierarchical: a pinned ring, tree or recursive is costed flat.
    Each algorithm runs in each protocol of the links (Simple, LL, LL128 where the hardware lists
    them); NVLS is one more option for all_reduce inside an NVSwitch node.
    guards (an open scope's indicators): each scope's bandwidths become I beta + (1 - I), so that
    a scope the plan does not have divides by 1, never by a broken link's 0 (0 x inf = nan).
    """

    def g(scope: str, cost: C.LinkCost) -> C.LinkCost:
        if guards is None:
            return cost
        ind = guards[scope]
        return C.LinkCost(cost.call_s, cost.step_s, ind * cost.bandwidth + (1 - ind))

    n, k = AXIS_DEGREE[axis], _AXIS_PER_NODE[axis]
    links = _links(fam, axis)
    intra, inter = links["intra"], links["inter"]
    nic = {p: C.LinkCost(c.call_s, c.step_s, c.bandwidth / S.G) for p, c in inter.items()}
    protocols = list(dict.fromkeys([*intra, *inter]))
    if fam.protocol != "auto":
        protocols = [fam.protocol]
    has_nvls = op == "all_reduce" and "intra:nvls" in fam.link_features
    host_link = "intra:host_link" in fam.link_features  # PCIe: NIC traffic crosses it too
    no_ll128 = fam.protocol == "auto" and not ll128_over_nodes(fam.collective_library,
                                                                 fam.link_features)
    nvls_fixed = fam.algorithm == "nvls" and has_nvls
    hier_fixed = fam.algorithm == "hierarchical" and _has_hierarchical(op, fam)
    # a pinned flat algorithm in generic, which the two-level form no longer stands beside: a
    # group of it that lies in one node (a layer graph's contributors, perfmodel.layerwise) runs
    # inside that node (costs.collectives.mixed_flat_time's intra_beta), as the two-level form
    # (its intra-node stage alone there) priced it before
    pinned_flat = (fam.collective_library == "generic" and _has_hierarchical(op, fam)
                   and fam.algorithm not in ("auto", "hierarchical"))
    options: list[dict[str, sp.Expr | None]] = []
    for alg in _algorithms(op, fam):
        for p in protocols:
            i0, o0 = intra.get(p, intra["simple"]), nic.get(p, nic["simple"])
            t_intra = C.protocol_time(op, nbytes, n, g("intra", i0), alg)
            t_inter = C.protocol_time(op, nbytes, n, g("inter", o0), alg)
            i, o = g("mixed", i0), g("mixed", o0)
            if fam.collective_library == "nccl" and alg is C.Algorithm.TREE:
                beta = sp.Min(i.bandwidth, o.bandwidth * k, evaluate=False)
                intra_i, inter_o = g("intra", i0), g("inter", o0)
                t_intra = C.nccl_tree_all_reduce_time(nbytes, n, n, intra_i.call_s, intra_i.step_s,
                                                      o.step_s, intra_i.bandwidth)
                if op == "all_reduce":  # one rank a node: NCCL's model too, floor(log2 n) levels
                    t_inter = C.nccl_tree_all_reduce_time(nbytes, n, 1, inter_o.call_s,
                                                          inter_o.step_s, inter_o.step_s,
                                                          inter_o.bandwidth)
                t_mixed = C.nccl_tree_all_reduce_time(nbytes, n, k, o.call_s, i.step_s, o.step_s,
                                                      beta)
            elif op == "send_recv":
                t_mixed = C.protocol_time(op, nbytes, n, o, alg)
            elif op == "all_to_all":
                t_mixed = C.all_to_all_mixed_time(nbytes, n, k, o.call_s, o.step_s, i.bandwidth,
                                                  o.bandwidth, shares_host_link=host_link)
            else:
                beta = sp.Min(i.bandwidth, o.bandwidth * k, evaluate=False)
                t_mixed = C.mixed_flat_time(op, nbytes, n, n / k, o.call_s, i.step_s, o.step_s,
                                            beta, alg, i.bandwidth if pinned_flat else None)
            options.append({"intra": None if nvls_fixed else t_intra, "inter": t_inter,
                            "mixed": None if hier_fixed or (no_ll128 and p == "ll128")
                            else t_mixed})
    if has_nvls and fam.protocol in ("auto", "simple") and fam.algorithm in ("auto", "nvls"):
        nvls = g("intra", C.LinkCost(sp.Integer(0), S.t_nvls, S.beta_i * S.f_nvls))
        t_nvls = C.nvls_all_reduce_time(nbytes, n, nvls.step_s, nvls.bandwidth)
        options.append({"intra": t_nvls, "inter": None, "mixed": None})
    # the two-level form competes in mixed groups where the algorithm is auto (or hierarchical),
    # never beside a pinned flat one: a pinned ring is costed as a ring (NCCL_ALGO=RING runs a
    # ring; generic's ring, tree or recursive is the flat collective over all n ranks)
    if _has_hierarchical(op, fam) and fam.algorithm in ("auto", "hierarchical"):
        for p in protocols:
            if no_ll128 and p == "ll128":
                continue
            i = g("mixed", intra.get(p, intra["simple"]))
            o = g("mixed", nic.get(p, nic["simple"]))
            hier = o.call_s + C.hierarchical_time(op, nbytes, n, k, i.step_s, i.bandwidth,
                                                  o.step_s, o.bandwidth)
            options.append({"intra": None, "inter": None, "mixed": hier})
    return options


def ll128_over_nodes(library: str, link_features: frozenset[str]) -> bool:
    """Whether a group over nodes with several ranks in each takes LL128 by default. NCCL turns
    it on only where the paths inside a node are NVLink (src/graph/tuning.cc, ncclTopoTuneModel:
    `pEnable &= (graphs[a]->typeIntra <= PATH_NVB)`, NVIDIA/nccl 2.18 on): where the node's link
    lists it; a pinned protocol (NCCL_PROTO) runs whatever this says."""
    return library != "nccl" or "intra:ll128" in link_features


def _has_hierarchical(op: str, fam: Family) -> bool:
    """Whether the library runs op in two levels in groups over nodes: every op with a two-level
    form in generic; all_reduce in nccl (NVLS tree / CollNet: reduce in the node, across nodes
    one rank per NIC, then broadcast in the node)."""
    if op in ("all_to_all", "send_recv"):
        return False
    return fam.collective_library == "generic" or op == "all_reduce"
