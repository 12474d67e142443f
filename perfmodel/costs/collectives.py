"""Alpha-beta costs of collectives, per algorithm, as sympy expressions.

Conventions follow nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): `nbytes` is the
size nccl-tests prints: the full buffer for all_reduce, broadcast and reduce; the full *output* of
all_gather; the full *input* of reduce_scatter; the whole send buffer of one rank for all_to_all; the
message for send_recv. algbw = nbytes / T and busbw = algbw * bus_factor(op, n).

alpha is the start-up latency of one step [s], beta the bandwidth a rank reaches on the link [B/s].
Sources: Thakur, Rabenseifner, Gropp, "Optimization of Collective Communication Operations in MPICH"
(IJHPCA 2005); Sanders, Speck, Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and
scan" (Parallel Computing 2009) for the double binary tree NCCL uses.
"""

from __future__ import annotations

from enum import StrEnum

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

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1.
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
    # recursive doubling/halving; Rabenseifner all_reduce = halving reduce-scatter + doubling all-gather
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

    all_reduce    = reduce_scatter(intra, k) + all_reduce(inter, n/k, nbytes/k) + all_gather(intra, k)
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
