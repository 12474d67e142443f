"""Thresholds the cost formulas imply, in closed form (sympy) or as numbers.

- the roofline's ridge point: the arithmetic intensity (and the square GEMM) at which a GEMM stops
  being memory-bound;
- a collective's latency-bandwidth crossover: the size at which the alpha and the beta terms of
  perfmodel.costs.collectives.collective_time are equal;
- the size at which one collective algorithm overtakes another, and the size at which the
  specialised realisation of a collective with fewer contributors than receivers stops paying;
- the pipeline bubble's share of a step, (pp - 1)/v of m + (pp - 1)/v micro-batch times
  (perfmodel.step).

Every function takes numbers or sympy expressions; with numbers it returns a sympy number
(float() it), with symbols the closed form.
"""

from __future__ import annotations

import sympy as sp

from perfmodel.costs.collectives import ALGORITHMS, Algorithm, Op, steps, volume_factor
from perfmodel.errors import PlanError


def gemm_intensity(m: sp.Expr, n: sp.Expr, k: sp.Expr, bytes_per_element: sp.Expr) -> sp.Expr:
    """FLOPs per byte of one (m x k) @ (k x n) GEMM reading A and B and writing C once [FLOP/B].

    I = 2 m n k / (e (m k + k n + m n)); a square GEMM (m = n = k = d): I = 2 d / (3 e).
    """
    m, n, k, e = map(sp.sympify, (m, n, k, bytes_per_element))
    return 2 * m * n * k / (e * (m * k + k * n + m * n))


def ridge_intensity(peak_flops_per_s: sp.Expr, bandwidth_bytes_per_s: sp.Expr) -> sp.Expr:
    """The roofline's ridge point [FLOP/B]: below it a kernel is memory-bound, above it
    compute-bound. I* = peak / bandwidth (Williams, Waterman, Patterson, CACM 2009)."""
    return sp.sympify(peak_flops_per_s) / sp.sympify(bandwidth_bytes_per_s)


def ridge_square_dim(peak_flops_per_s: sp.Expr, bandwidth_bytes_per_s: sp.Expr,
                     bytes_per_element: sp.Expr) -> sp.Expr:
    """The side d* of the square GEMM that sits on the ridge: 2 d / (3 e) = peak / bw, so
    d* = 3 e peak / (2 bw) [elements]."""
    d = sp.Symbol("d", positive=True)
    (solution,) = sp.solve(sp.Eq(gemm_intensity(d, d, d, bytes_per_element),
                                 ridge_intensity(peak_flops_per_s, bandwidth_bytes_per_s)), d)
    return solution


def _ranks(ranks: sp.Expr) -> sp.Expr:
    """A collective's group size: a number must be a whole number >= 2 (one rank has no
    collective: its latency and bandwidth terms are both 0, their crossover 0/0)."""
    n = sp.sympify(ranks)
    if n.is_number and (n.has(sp.nan) or not n.is_finite or not (n - sp.floor(n)).is_zero
                          or not n >= 2):
        raise PlanError(f"ranks must be a whole number >= 2, got {ranks}")
    return n


def _check(op: str, algorithm: str) -> tuple[Op, Algorithm]:
    try:
        o = Op(op)
    except ValueError:
        raise PlanError(f"unknown collective '{op}' (known: {', '.join(x.value for x in Op)})"
                        ) from None
    try:
        a = Algorithm(algorithm)
    except ValueError:
        raise PlanError(f"unknown algorithm '{algorithm}' (known: "
                        f"{', '.join(x.value for x in Algorithm)})") from None
    if a not in ALGORITHMS[o]:
        raise PlanError(f"{op} has no {algorithm} algorithm (it has: "
                        f"{', '.join(x.value for x in ALGORITHMS[o])})")
    return o, a


def latency_bandwidth_bytes(op: str, ranks: sp.Expr, algorithm: str, alpha_s: sp.Expr,
                            beta_bytes_per_s: sp.Expr) -> sp.Expr:
    """The size [B] at which a collective's latency term equals its bandwidth term:
    steps alpha = volume S / beta, so S = steps alpha beta / volume. Below it the collective is
    latency-bound (time nearly flat in size), above it bandwidth-bound (time grows with size)."""
    o, a = _check(op, algorithm)
    n = _ranks(ranks)
    return sp.simplify(steps(o, n, a) * sp.sympify(alpha_s) * sp.sympify(beta_bytes_per_s)
                       / volume_factor(o, n, a))


def algorithm_crossover_bytes(op: str, ranks: sp.Expr, first: str, second: str, alpha_s: sp.Expr,
                              beta_bytes_per_s: sp.Expr) -> sp.Expr | None:
    """The size [B] at which two algorithms of one collective cost the same on one link, or None
    when their bandwidth terms are equal (one is then faster at every size).

    steps_1 alpha + v_1 S / beta = steps_2 alpha + v_2 S / beta
    => S = (steps_2 - steps_1) alpha beta / (v_1 - v_2)
    e.g. all-reduce, ring against double binary tree on n ranks: S = n (n - 1 - log2 n) alpha beta.
    """
    o, a1 = _check(op, first)
    _, a2 = _check(op, second)
    n = _ranks(ranks)
    dv = volume_factor(o, n, a1) - volume_factor(o, n, a2)
    if sp.simplify(dv) == 0:
        return None
    ds = steps(o, n, a2) - steps(o, n, a1)
    return _positive_or_none(
        sp.simplify(ds * sp.sympify(alpha_s) * sp.sympify(beta_bytes_per_s) / dv))


def _positive_or_none(size: sp.Expr) -> sp.Expr | None:
    """A crossover size, or None where it is a number that is not positive: the two costs then
    meet at no size a message has (one is cheaper at every size)."""
    return None if size.is_number and not size > 0 else size


def contributors_crossover_bytes(op: str, contributors: sp.Expr, receivers: sp.Expr,
                                 alpha_s: sp.Expr, beta_bytes_per_s: sp.Expr) -> sp.Expr | None:
    """The size [B] at which the standard and the specialised realisation of an all-gather or
    all-reduce with c contributors and r receivers (perfmodel.costs.collectives, ring) cost the
    same, or None when their bandwidth terms are equal (the one with fewer steps then wins at every
    size). Both are steps alpha + volume S / beta:

    S = (steps_specialised - steps_standard) alpha beta / (volume_standard - volume_specialised)
    e.g. all-reduce with c < r <= 2c: S = (2r - 2c - 1) alpha beta / (1 - 2/c + 2/r); below it the
    specialised realisation (fewer steps) wins, above it the standard one (fewer bytes).
    """
    from perfmodel.costs.collectives import contributed_time

    o = Op(_check(op, "ring")[0])
    if o not in (Op.ALL_GATHER, Op.ALL_REDUCE):
        raise PlanError(f"contributors apply to all_gather and all_reduce, got '{op}'")
    size = sp.Dummy("S", positive=True)
    # alpha and beta as symbols until the end: with floats the two volumes' difference is a
    # rounding error, not 0, and the crossover a size of 1e22 B
    alpha, beta = sp.Dummy("alpha", positive=True), sp.Dummy("beta", positive=True)
    gap = sp.expand(contributed_time(o, size, contributors, receivers, alpha, beta, "standard")
                    - contributed_time(o, size, contributors, receivers, alpha, beta,
                                       "specialised"))
    slope = sp.simplify(sp.diff(gap, size))
    if slope == 0:
        return None
    crossing = sp.simplify(-gap.subs(size, 0) / slope)
    return _positive_or_none(sp.simplify(crossing.subs({alpha: sp.sympify(alpha_s),
                                                        beta: sp.sympify(beta_bytes_per_s)})))


def bubble_fraction(pp: sp.Expr, micro_batches: sp.Expr, virtual_stages: sp.Expr = 1) -> sp.Expr:
    """The pipeline bubble's share of the pipelined part of a step [dimensionless].

    T = (m + (pp - 1)/v) t_mb (perfmodel.step), so the bubble is ((pp - 1)/v) / (m + (pp - 1)/v)
    (Narayanan et al. SC21, Sec. 2.2: (pp - 1)/(v m) of the ideal time)."""
    pp, m, v = map(sp.sympify, (pp, micro_batches, virtual_stages))
    for value, name in ((pp, "pp"), (m, "micro_batches"), (v, "virtual_stages")):
        if value.is_number and (value.has(sp.nan) or not value.is_finite or not value >= 1):
            raise PlanError(f"{name} must be >= 1 (and finite), got {value}")
    idle = (pp - 1) / v
    return idle / (m + idle)
