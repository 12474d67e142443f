"""Alpha-beta costs of collectives, per algorithm, as sympy expressions.

Conventions follow nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): `nbytes` is the
size nccl-tests prints: the full buffer for all_reduce, broadcast and reduce; the full *output* of
all_gather; the full *input* of reduce_scatter; the whole send buffer of one rank for all_to_all;
the message for send_recv. algbw = nbytes / T and busbw = algbw * bus_factor(op, n).

alpha is the start-up latency of one step [s], beta the bandwidth a rank reaches on the link [B/s].
Sources: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in MPICH"
(IJHPCA 2005); Sanders, Speck, Träff, "Two-tree algorithms for full bandwidth broadcast, reduction
and scan" (Parallel Computing 2009) for the double binary tree NCCL uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sympy as sp


class Op(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"  # double binary tree (NCCL), pipelined
    RECURSIVE = "recursive"  # recursive doubling / halving; Rabenseifner for all_reduce


class Protocol(StrEnum):
    """NCCL's protocols (src/device/prims_*.h): how a step's data and its ready flag travel."""

    SIMPLE = "simple"  # bulk copies, a fence and a flag per chunk: full bandwidth, slow start
    LL = "ll"  # 8-byte stores of 4 data bytes + a 4-byte flag: no fence, half the bandwidth at most
    LL128 = "ll128"  # 128-byte lines of 120 data bytes + a flag (NVLink, NVIDIA's NICs): 120/128


# Which algorithms each op has; the first is the default when latency does not matter.
ALGORITHMS: dict[Op, tuple[Algorithm, ...]] = {
    Op.ALL_REDUCE: (Algorithm.RING, Algorithm.TREE, Algorithm.RECURSIVE),
    Op.ALL_GATHER: (Algorithm.RING, Algorithm.RECURSIVE),
    Op.REDUCE_SCATTER: (Algorithm.RING, Algorithm.RECURSIVE),
    Op.BROADCAST: (Algorithm.RING, Algorithm.TREE),
    Op.REDUCE: (Algorithm.RING, Algorithm.TREE),
    Op.ALL_TO_ALL: (Algorithm.RING,),  # pairwise exchange: n-1 steps, one peer each
    Op.SEND_RECV: (Algorithm.RING,),  # one point-to-point message
}


# The algorithms NCCL (and RCCL, its AMD port) has (src/graph/tuning.cc, ncclTopoTuneModel):
# all_reduce runs a ring or a tree (NVLS inside an NVSwitch node and a hierarchical form across
# nodes are added by perfmodel.step.collective where the hardware has them); all_gather,
# reduce_scatter, broadcast and reduce run a ring; all_to_all and send_recv are point-to-point.
# NCCL has no recursive doubling/halving: PAT (all_gather/reduce_scatter with one rank per node)
# is not modelled.
NCCL_ALGORITHMS: dict[Op, tuple[Algorithm, ...]] = {
    Op.ALL_REDUCE: (Algorithm.RING, Algorithm.TREE),
    Op.ALL_GATHER: (Algorithm.RING,),
    Op.REDUCE_SCATTER: (Algorithm.RING,),
    Op.BROADCAST: (Algorithm.RING,),
    Op.REDUCE: (Algorithm.RING,),
    Op.ALL_TO_ALL: (Algorithm.RING,),
    Op.SEND_RECV: (Algorithm.RING,),
}
# per collective library (HardwareSpec.collective_library)
LIBRARY_ALGORITHMS: dict[str, dict[Op, tuple[Algorithm, ...]]] = {
    "generic": ALGORITHMS, "nccl": NCCL_ALGORITHMS}


# sympy ships no types: its Function is Any to mypy
class _IntegerLog2(sp.Function):  # type: ignore[misc]
    """An integer log2 of x >= 1, exact: numbers evaluate in integers (`_exponent`), and the
    compiled (numpy) form rounds numpy.log2 (`ROUND`), exact at powers of two
    (log(x)/log(2) is not: ceil at 2^29 -> 30)."""

    ROUND = ""

    @classmethod
    def _exponent(cls, p: int, q: int) -> int:
        raise NotImplementedError

    @classmethod
    def eval(cls, x: sp.Expr) -> sp.Expr | None:
        if x.is_Rational:
            if x < 1:
                raise ValueError(f"{cls.__name__} takes x >= 1, got {x}")
            return sp.Integer(cls._exponent(int(x.p), int(x.q)))
        if x.is_Float:
            return cls.eval(sp.Rational(x))
        return None

    @classmethod
    def numpy_form(cls, numpy: str, x: str) -> str:
        """Its numpy text for perfmodel.codegen: numpy's module name, the argument's text."""
        return f"{numpy}.{cls.ROUND}({numpy}.log2({x}))"

    def _numpycode(self, printer: Any) -> str:  # sympy's printer (lambdify), the same text
        return self.numpy_form(printer._module_format("numpy"), printer._print(self.args[0]))


class ceil_log2(_IntegerLog2):  # noqa: N801  (reads like the formula)
    """ceil(log2(x)) for x >= 1 (_IntegerLog2)."""

    ROUND = "ceil"

    @classmethod
    def _exponent(cls, p: int, q: int) -> int:
        k = 0
        while 2**k * q < p:
            k += 1
        return k


class floor_log2(_IntegerLog2):  # noqa: N801  (reads like the formula)
    """floor(log2(x)) for x >= 1 (_IntegerLog2); NCCL's log2i (src/graph/tuning.cc) for whole
    x."""

    ROUND = "floor"

    @classmethod
    def _exponent(cls, p: int, q: int) -> int:
        k = 0
        while 2 ** (k + 1) * q <= p:
            k += 1
        return k


def power_of_two_split(n: sp.Expr | int) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """(q, p', e) of a group of n ranks: q = floor(log2 n), p' = 2^q the largest power of two
    <= n, and e = ceil(log2 n) - q: 0 where n is a power of two, 1 where it is not (then the
    r = n - p' ranks beyond p' fold into partners before a recursive algorithm and are served
    after it; Thakur, Rabenseifner, Gropp 2005, Sec. 4.2 and 4.4)."""
    n = sp.sympify(n)
    q = floor_log2(n)
    return q, 2**q, ceil_log2(n) - q


def bus_factor(op: Op | str, n: sp.Expr | int) -> sp.Expr:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce,
    send_recv 1.
    """
    op = Op(op)
    n = sp.sympify(n)
    if op is Op.ALL_REDUCE:
        return 2 * (n - 1) / n
    if op in (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_TO_ALL):
        return (n - 1) / n
    return sp.Integer(1)


def steps(op: Op | str, n: sp.Expr | int, algorithm: Algorithm | str) -> sp.Expr:
    """Number of latency-bound steps (messages in sequence) of one collective.

    ring       all_reduce 2 (n - 1), the others n - 1
    tree       all_reduce 2 ceil(log2 n) (reduce up, broadcast down), broadcast/reduce
               ceil(log2 n): the depth of NCCL's binary tree (src/graph/trees.cc, ncclGetBtree:
               rank 0's one child is the largest power of two below n, each level halves the
               stride), ceil(log2 n) edges deep for any n
    recursive  with q = floor(log2 n), e = 0 where n is a power of two and 1 where not:
               all_reduce 2 q + 2 e (Rabenseifner: halving reduce-scatter + doubling all-gather),
               reduce_scatter and all_gather q + 2 e; a group of n = 2^q + r ranks first folds
               its r extra ranks into partners (one step), runs the power-of-two algorithm on
               2^q, then serves them (one step) (Thakur, Rabenseifner, Gropp 2005, Sec. 4.2
               and 4.4)
    """
    op, algorithm, n = Op(op), Algorithm(algorithm), sp.sympify(n)
    if op is Op.SEND_RECV:
        return sp.Integer(1)
    if algorithm is Algorithm.RING:
        return 2 * (n - 1) if op is Op.ALL_REDUCE else n - 1
    if algorithm is Algorithm.TREE:
        return 2 * ceil_log2(n) if op is Op.ALL_REDUCE else ceil_log2(n)
    q, _, extra = power_of_two_split(n)
    return 2 * q + 2 * extra if op is Op.ALL_REDUCE else q + 2 * extra


def volume_factor(op: Op | str, n: sp.Expr | int, algorithm: Algorithm | str) -> sp.Expr:
    """Bytes that cross the busiest link of a rank, as a multiple of nbytes.

    Ring and recursive (bandwidth-optimal) algorithms move bus_factor * nbytes. A pipelined double
    binary tree moves nbytes up and nbytes down for all_reduce and nbytes for broadcast/reduce (each
    of the two trees carries half, and every rank is interior in one of them).
    Recursive on n = p' + r ranks, r > 0 (p' = 2^floor(log2 n); Thakur, Rabenseifner, Gropp 2005):
    all_reduce 2 (p' - 1)/p' + 2: the r extra ranks send their whole buffer to a partner, the p'
    run Rabenseifner's algorithm on it, the partners send the whole result back (MPICH
    allreduce_intra_reduce_scatter_allgather: the p' ranks split the buffer evenly);
    reduce_scatter 2: the whole input to a partner, recursive halving among p', a block back
    (Sec. 4.2: (floor(log2 n) + 2) alpha + 2 nbytes / beta, the paper's approximation: the
    partners' extra blocks in the halving ignored); all_gather 2, its mirror image (a block to a
    partner, recursive doubling among p', the gathered buffer back).
    """
    op, algorithm = Op(op), Algorithm(algorithm)
    if algorithm is Algorithm.TREE:
        return sp.Integer(2) if op is Op.ALL_REDUCE else sp.Integer(1)
    if algorithm is Algorithm.RECURSIVE and op is not Op.SEND_RECV:
        _, pof2, extra = power_of_two_split(n)
        if op is Op.ALL_REDUCE:
            return 2 * (pof2 - 1) / pof2 + 2 * extra
        return (1 - extra) * bus_factor(op, n) + 2 * extra
    return bus_factor(op, n)


def collective_time(op: Op | str, nbytes: sp.Expr, n: sp.Expr | int, alpha_s: sp.Expr,
                    beta_bytes_per_s: sp.Expr, algorithm: Algorithm | str) -> sp.Expr:
    """Time of one collective on one level of links [s].

    T = steps(op, n, alg) * alpha + volume_factor(op, n, alg) * nbytes / beta
    e.g. ring all_reduce: 2(n-1) alpha + 2(n-1)/n * nbytes / beta   (Thakur et al. 2005, Sec. 4)
    """
    n = sp.sympify(n)
    if n == 1:
        return sp.Integer(0)
    return (steps(op, n, algorithm) * alpha_s
            + volume_factor(op, n, algorithm) * nbytes / beta_bytes_per_s)


@dataclass(frozen=True)
class LinkCost:
    """One protocol on one link class, as expressions: the start-up of a call [s], the latency of
    one step [s] and the bandwidth one rank reaches [B/s]."""

    call_s: sp.Expr
    step_s: sp.Expr
    bandwidth: sp.Expr


def protocol_time(op: Op | str, nbytes: sp.Expr, n: sp.Expr | int, cost: LinkCost,
                  algorithm: Algorithm | str) -> sp.Expr:
    """Time of one collective in one protocol on one link [s]: its call's start-up, then the
    algorithm's steps (0 for a group of one rank).

    T = call_s + steps(op, n, alg) * step_s + volume_factor(op, n, alg) * nbytes / bandwidth
    NCCL's tuning model (src/graph/tuning.cc, ncclTopoGetAlgoTime) has this form per algorithm
    and protocol, time = latency + nbytes / bandwidth, latency = baseLat (call) + steps x hwLat,
    and picks the cheapest; LL and LL128 start faster than Simple and move less per second.
    """
    n = sp.sympify(n)
    if n == 1:
        return sp.Integer(0)
    return cost.call_s + collective_time(op, nbytes, n, cost.step_s, cost.bandwidth, algorithm)


def nvls_all_reduce_time(nbytes: sp.Expr, n: sp.Expr | int, latency_s: sp.Expr,
                         bandwidth: sp.Expr) -> sp.Expr:
    """All-reduce inside an NVSwitch node with NVLink SHARP (NVLS): the switch adds [s].

    T = latency_s + (n + 1)/n * nbytes / bandwidth
    Each rank reduces one n-th of the buffer with multimem.ld_reduce (the switch reads that piece
    from all n GPUs: the rank's link sends nbytes in all, and receives nbytes/n) and writes it back
    with multimem.st (the switch copies it to all n: the link receives nbytes, sends nbytes/n):
    (n + 1)/n * nbytes each way, against 2 (n - 1)/n for a ring; 1.125 against 1.75 at n = 8.
    Source: NVIDIA, "NVLink SHARP" (Hopper NVSwitch, 2022); NCCL src/device/all_reduce.h
    (runRing vs the NVLS path) and src/graph/tuning.cc (nvlsEfficiency: 0.85 on Hopper).
    """
    n = sp.sympify(n)
    if n == 1:
        return sp.Integer(0)
    return latency_s + (n + 1) / n * nbytes / bandwidth


def nccl_tree_all_reduce_time(nbytes: sp.Expr, n: sp.Expr | int, per_node: sp.Expr | int,
                              call_s: sp.Expr, intra_step_s: sp.Expr, inter_step_s: sp.Expr,
                              beta_bytes_per_s: sp.Expr) -> sp.Expr:
    """NCCL's tree all_reduce: a chain through the k ranks of each node, a double binary tree
    across the n/k nodes, reduce up and broadcast down, pipelined [s].

    T = call + 2 ((k - 1) intra_step + floor(log2(n / k)) inter_step) + 2 nbytes / beta
    Latency: NCCL src/graph/tuning.cc (2 ((nRanks/nNodes - 1) intraLat + log2i(nNodes)
    interLat), log2i the integer floor(log2)): inside one node the tree is a chain, as slow to
    start as a ring. Bandwidth: as volume_factor's tree (every rank receives and sends the buffer
    once each way). k = n: one node; k = 1: one rank per node (NCCL's model, where the generic
    tree of `steps` counts the tree's depth, ceil(log2 n); the two agree at powers of two).
    """
    n, k = sp.sympify(n), sp.sympify(per_node)
    if n == 1:
        return sp.Integer(0)
    return (call_s + 2 * ((k - 1) * intra_step_s + floor_log2(n / k) * inter_step_s)
            + 2 * nbytes / beta_bytes_per_s)


def ring_inter_steps(op: Op | str, nodes: sp.Expr | int) -> sp.Expr:
    """Steps of a flat ring that cross between nodes when its ranks fill `nodes` nodes in order:
    2 (nodes - 1) for all_reduce (a reduce-scatter and an all-gather pass), nodes - 1 otherwise.
    NCCL src/graph/tuning.cc: nInterSteps, the rest of the nsteps at the intra-node latency."""
    nodes = sp.sympify(nodes)
    return 2 * (nodes - 1) if Op(op) is Op.ALL_REDUCE else nodes - 1


def mixed_flat_time(op: Op | str, nbytes: sp.Expr, n: sp.Expr | int, nodes: sp.Expr | int,
                    call_s: sp.Expr, intra_step_s: sp.Expr, inter_step_s: sp.Expr,
                    beta_bytes_per_s: sp.Expr, algorithm: Algorithm | str,
                    intra_beta: sp.Expr | None = None) -> sp.Expr:
    """A flat (one-level) collective over n ranks that lie in `nodes` nodes [s].

    ring:  T = call + x inter_step + (steps - x) intra_step + volume * nbytes / beta,
           x = ring_inter_steps(op, nodes)   (NCCL tuning.cc: the ring's latency)
    tree, recursive: every step at the inter-node latency.
    beta is the bandwidth of the ring's slowest hop: the NIC share of a rank that crosses.
    intra_beta, where given: a group whose ranks all lie in one node (nodes = 1: a sub-group of
    the axis's, as a layer graph's contributors, perfmodel.layerwise) runs inside that node,
    T = call + steps * intra_step + volume * nbytes / intra_beta.
    """
    n = sp.sympify(n)
    if n == 1:
        return sp.Integer(0)
    st = steps(op, n, algorithm)
    volume = volume_factor(op, n, algorithm) * nbytes
    if Algorithm(algorithm) is Algorithm.RING and Op(op) is not Op.SEND_RECV:
        x = ring_inter_steps(op, nodes)
        latency = x * inter_step_s + (st - x) * intra_step_s
    else:
        latency = st * inter_step_s
    spans = call_s + latency + volume / beta_bytes_per_s
    if intra_beta is None:
        return spans
    one_node = call_s + st * intra_step_s + volume / intra_beta
    return sp.Piecewise((one_node, sp.Eq(sp.sympify(nodes), 1)), (spans, True))


def all_to_all_mixed_time(nbytes: sp.Expr, n: sp.Expr | int, per_node: sp.Expr | int,
                          call_s: sp.Expr, inter_step_s: sp.Expr, intra_beta: sp.Expr,
                          nic_beta: sp.Expr, shares_host_link: bool = False) -> sp.Expr:
    """All-to-all over n ranks, k of them in each node [s]: every rank sends nbytes/n to each
    other rank, (n - k)/n of its buffer through its share of the node's NICs, (k - 1)/n over the
    links inside the node, both at once.

    T = call + (n - 1) inter_step
        + max((n - k)/n * nbytes / nic_beta, (k - 1)/n * nbytes / intra_beta)
    (pairwise exchange: n - 1 steps; Thakur, Rabenseifner, Gropp 2005, Sec. 4.5)

    shares_host_link: the link inside the node is the GPU's own host link (PCIe: h100-pcie),
    and the rank's NIC traffic leaves the GPU over that same link (GPUDirect RDMA through the
    PCIe switch). Then all (n - 1)/n of the buffer that leaves the GPU crosses it, and the NIC
    share is still bounded by the NIC:

    T = call + (n - 1) inter_step
        + max((n - k)/n * nbytes / nic_beta, (n - 1)/n * nbytes / intra_beta)

    so spanning nodes never shortens the link term below one node's: (n - 1)/n >= (k - 1)/k
    for n >= k (the separate-links form would take (k - 1)/n, less than one node's (k - 1)/k:
    a group that got faster for leaving its node). Over NVLink (NVSwitch nodes) GPU-to-GPU
    traffic never crosses the host link, and the two shares run on separate links (the first
    form). A flat ring needs no such form: each rank sends to one neighbour a step, over one
    link (the node's or, through the host link, the NIC), at min(intra_beta, k nic_beta).
    """
    n, k = sp.sympify(n), sp.sympify(per_node)
    if n == 1:
        return sp.Integer(0)
    intra_share = (n - 1) / n if shares_host_link else (k - 1) / n
    return call_s + (n - 1) * inter_step_s + sp.Max(
        (n - k) / n * nbytes / nic_beta, intra_share * nbytes / intra_beta, evaluate=False)


def hierarchical_time(op: Op | str, nbytes: sp.Expr, n: sp.Expr | int, per_node: sp.Expr | int,
                      intra_alpha_s: sp.Expr, intra_beta: sp.Expr,
                      inter_alpha_s: sp.Expr, inter_beta: sp.Expr,
                      inter_algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """Two-level collective: inside each node first, then between nodes, then inside again.

    all_reduce    = reduce_scatter(intra, k) + all_reduce(inter, n/k, nbytes/k)
                    + all_gather(intra, k)
    all_gather    = all_gather(inter, n/k, nbytes/k ... gathered) + all_gather(intra, k, nbytes)
    reduce_scatter= reduce_scatter(intra, k, nbytes) + reduce_scatter(inter, n/k, nbytes/k)
    broadcast/reduce = the inter-node step on nbytes + the intra-node step on nbytes
    all_to_all and send_recv have no two-level form: the inter-node link carries their traffic.
    k = per_node ranks of the group in one node, n/k nodes.
    """
    op = Op(op)
    n, k = sp.sympify(n), sp.sympify(per_node)
    nodes = n / k

    def intra(o: Op, size: sp.Expr) -> sp.Expr:
        return collective_time(o, size, k, intra_alpha_s, intra_beta, Algorithm.RING)

    def inter(o: Op, size: sp.Expr) -> sp.Expr:
        alg = inter_algorithm if Algorithm(inter_algorithm) in ALGORITHMS[o] else Algorithm.RING
        return collective_time(o, size, nodes, inter_alpha_s, inter_beta, alg)

    if op is Op.ALL_REDUCE:
        return intra(Op.REDUCE_SCATTER, nbytes) + inter(Op.ALL_REDUCE, nbytes / k) + intra(
            Op.ALL_GATHER, nbytes)
    if op is Op.ALL_GATHER:
        return inter(Op.ALL_GATHER, nbytes / k) + intra(Op.ALL_GATHER, nbytes)
    if op is Op.REDUCE_SCATTER:
        return intra(Op.REDUCE_SCATTER, nbytes) + inter(Op.REDUCE_SCATTER, nbytes / k)
    if op in (Op.BROADCAST, Op.REDUCE):
        return inter(op, nbytes) + intra(op, nbytes)
    return collective_time(op, nbytes, n, inter_alpha_s, inter_beta, Algorithm.RING)


# --- Collectives whose contributors are fewer than their receivers --------------------------------
# Castelló, Dolz, Quintana-Ortí, Duato, "Analysis of model parallelism for distributed neural
# networks" (EuroMPI 2019): in layer-wise model parallelism a layer with fewer output units than
# the r processes of its group is split over c < r of them, yet all r need its output (an all-gather
# with c contributors) and the reduced input gradient (an all-reduce with c contributors). `nbytes`
# keeps the nccl-tests convention: the full gathered output, the full reduced vector.


class Realisation(StrEnum):
    STANDARD = "standard"  # the ordinary collective over all r, empty or zero contributions
    SPECIALISED = "specialised"  # the collective among the c contributors, then a spread to r - c
    AUTO = "auto"  # the cheaper of the two


def all_gather_padded_time(nbytes: sp.Expr, contributors: sp.Expr | int, receivers: sp.Expr | int,
                           alpha_s: sp.Expr, beta_bytes_per_s: sp.Expr,
                           algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """All-gather over all r processes, c of them contributing nbytes/c each, the r - c others
    nothing (MPI_Allgatherv with zero counts; NCCL's equal-size all-gather with every block padded
    to nbytes/c): each of the r - 1 ring steps carries the largest block [s].

    T = (r - 1) alpha + (r - 1)/c * nbytes / beta             (ring)
      = collective_time(all_gather, nbytes * r / c, r)        (any algorithm, padded blocks)
    c = r gives the ring all-gather (r - 1) alpha + (r - 1)/r nbytes / beta.
    Source: Thakur, Rabenseifner, Gropp 2005 (ring all-gather); Castelló et al. 2019.
    """
    c, r = sp.sympify(contributors), sp.sympify(receivers)
    return collective_time(Op.ALL_GATHER, nbytes * r / c, r, alpha_s, beta_bytes_per_s, algorithm)


def all_reduce_padded_time(nbytes: sp.Expr, contributors: sp.Expr | int, receivers: sp.Expr | int,
                           alpha_s: sp.Expr, beta_bytes_per_s: sp.Expr,
                           algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """All-reduce over all r processes of the full nbytes vector, the r - c non-contributors adding
    zeros: the contributor count does not change the cost [s].

    T = 2 (r - 1) alpha + 2 (r - 1)/r * nbytes / beta          (ring)
    Source: Thakur, Rabenseifner, Gropp 2005, Sec. 4; Castelló et al. 2019.
    """
    del contributors  # the zeros travel like any other contribution
    return collective_time(Op.ALL_REDUCE, nbytes, receivers, alpha_s, beta_bytes_per_s, algorithm)


def spread_rounds(contributors: sp.Expr | int, receivers: sp.Expr | int) -> sp.Expr:
    """Rounds in which c holders of a buffer reach r processes, every holder sending to one new
    process per round (the holders double): ceil(log2(r / c)); 1 when r - c <= c, 0 when c = r."""
    c, r = sp.sympify(contributors), sp.sympify(receivers)
    return ceil_log2(r / c)


def spread_time(nbytes: sp.Expr, contributors: sp.Expr | int, receivers: sp.Expr | int,
                alpha_s: sp.Expr, beta_bytes_per_s: sp.Expr) -> sp.Expr:
    """Copy a buffer of nbytes that c processes hold to the r - c processes that lack it [s].

    T = ceil(log2(r / c)) * (alpha + nbytes / beta)
    When r - c <= c one round does it: holder i sends to process c + i, all pairs in parallel, and
    each receiver takes in the whole buffer once (nbytes / beta, the least it can). Beyond that the
    holders double every round, as a binomial broadcast started from c roots.
    Source: binomial-tree broadcast, Thakur, Rabenseifner, Gropp 2005, Sec. 4.1; Castelló et al.
    2019 (the copy to the non-contributing processes).
    """
    return spread_rounds(contributors, receivers) * (alpha_s + nbytes / beta_bytes_per_s)


def all_gather_specialised_time(nbytes: sp.Expr, contributors: sp.Expr | int,
                                receivers: sp.Expr | int, alpha_s: sp.Expr,
                                beta_bytes_per_s: sp.Expr,
                                algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """All-gather among the c contributors, then a spread of the gathered nbytes to the r - c
    others [s].

    T = (c - 1) alpha + (c - 1)/c * nbytes / beta + ceil(log2(r / c)) (alpha + nbytes / beta)
    With r - c <= c: c alpha + (2c - 1)/c * nbytes / beta (ring). c = r: the ring all-gather.
    Source: Castelló et al. 2019 (specialised Allgather); Thakur et al. 2005 (its two parts).
    """
    c = sp.sympify(contributors)
    return (collective_time(Op.ALL_GATHER, nbytes, c, alpha_s, beta_bytes_per_s, algorithm)
            + spread_time(nbytes, c, receivers, alpha_s, beta_bytes_per_s))


def all_reduce_specialised_time(nbytes: sp.Expr, contributors: sp.Expr | int,
                                receivers: sp.Expr | int, alpha_s: sp.Expr,
                                beta_bytes_per_s: sp.Expr,
                                algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """All-reduce among the c contributors, then a spread of the reduced nbytes to the r - c
    others [s].

    T = 2 (c - 1) alpha + 2 (c - 1)/c * nbytes / beta + ceil(log2(r / c)) (alpha + nbytes / beta)
    With r - c <= c: (2c - 1) alpha + (3c - 2)/c * nbytes / beta (ring). c = r: the ring all-reduce.
    Source: Castelló et al. 2019 (specialised Allreduce); Thakur et al. 2005 (its two parts).
    """
    c = sp.sympify(contributors)
    return (collective_time(Op.ALL_REDUCE, nbytes, c, alpha_s, beta_bytes_per_s, algorithm)
            + spread_time(nbytes, c, receivers, alpha_s, beta_bytes_per_s))


_CONTRIBUTED = {
    (Op.ALL_GATHER, Realisation.STANDARD): all_gather_padded_time,
    (Op.ALL_GATHER, Realisation.SPECIALISED): all_gather_specialised_time,
    (Op.ALL_REDUCE, Realisation.STANDARD): all_reduce_padded_time,
    (Op.ALL_REDUCE, Realisation.SPECIALISED): all_reduce_specialised_time,
}


def contributed_time(op: Op | str, nbytes: sp.Expr, contributors: sp.Expr | int,
                     receivers: sp.Expr | int, alpha_s: sp.Expr, beta_bytes_per_s: sp.Expr,
                     realisation: Realisation | str = Realisation.STANDARD,
                     algorithm: Algorithm | str = Algorithm.RING) -> sp.Expr:
    """Time of an all-gather or all-reduce with c contributors and r >= c receivers, in one
    realisation (standard, specialised, or auto: the cheaper of the two) [s]."""
    op, realisation = Op(op), Realisation(realisation)
    if op not in (Op.ALL_GATHER, Op.ALL_REDUCE):
        raise ValueError(f"contributed_time: op must be all_gather or all_reduce, got '{op}'")
    args = (nbytes, contributors, receivers, alpha_s, beta_bytes_per_s, algorithm)
    if realisation is Realisation.AUTO:
        return sp.Min(*(_CONTRIBUTED[op, r_](*args) for r_ in (Realisation.STANDARD,
                                                                Realisation.SPECIALISED)))
    return _CONTRIBUTED[op, realisation](*args)
