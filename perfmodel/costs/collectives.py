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


def log2(n: sp.Expr) -> sp.Expr:
    return sp.log(n, 2)


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
    """Number of latency-bound steps (messages in sequence) of one collective."""
    op, algorithm, n = Op(op), Algorithm(algorithm), sp.sympify(n)
    if op is Op.SEND_RECV:
        return sp.Integer(1)
    if algorithm is Algorithm.RING:
        return 2 * (n - 1) if op is Op.ALL_REDUCE else n - 1
    if algorithm is Algorithm.TREE:
        return 2 * log2(n) if op is Op.ALL_REDUCE else log2(n)
    # recursive doubling/halving; Rabenseifner all_reduce = halving reduce-scatter + doubling
    # all-gather
    return 2 * log2(n) if op is Op.ALL_REDUCE else log2(n)


def volume_factor(op: Op | str, n: sp.Expr | int, algorithm: Algorithm | str) -> sp.Expr:
    """Bytes that cross the busiest link of a rank, as a multiple of nbytes.

    Ring and recursive (bandwidth-optimal) algorithms move bus_factor * nbytes. A pipelined double
    binary tree moves nbytes up and nbytes down for all_reduce and nbytes for broadcast/reduce (each
    of the two trees carries half, and every rank is interior in one of them).
    """
    op, algorithm = Op(op), Algorithm(algorithm)
    if algorithm is Algorithm.TREE:
        return sp.Integer(2) if op is Op.ALL_REDUCE else sp.Integer(1)
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


# sympy ships no types: its Function is Any to mypy
class ceil_log2(sp.Function):  # type: ignore[misc]  # noqa: N801  (reads like the formula)
    """ceil(log2(x)) for x >= 1, exact: numbers evaluate in integers, and the compiled (numpy) form
    takes numpy.log2, which is exact at powers of two (ceil(log(x)/log(2)) is not: 2^29 -> 30)."""

    @classmethod
    def eval(cls, x: sp.Expr) -> sp.Expr | None:
        if x.is_Rational:
            if x < 1:
                raise ValueError(f"ceil_log2 takes x >= 1, got {x}")
            k = 0
            while 2**k * x.q < x.p:
                k += 1
            return sp.Integer(k)
        if x.is_Float:
            return cls.eval(sp.Rational(x))
        return None

    def _numpycode(self, printer: Any) -> str:
        ceil, log2_ = (printer._module_format(f"numpy.{f}") for f in ("ceil", "log2"))
        return f"{ceil}({log2_}({printer._print(self.args[0])}))"


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
