"""How fast one GEMM runs: a roofline with a shape-dependent compute efficiency and a time floor.

T = min_time_s + max(F / (peak * eff) + epilogue_s batch m n, B / bw)             [s]
eff = max_fraction * x / (x + half_dim)
      / ((1 + m_half_dim/m) (1 + n_half_dim/n) (1 + k_half_dim/(k/s))
         (1 + batch_half/batch) (1 + parallel_half/(batch m n s)))
F = 2 batch m n k (FLOPs), B = batch * (bytes_per_element (m k + k n) + output_bytes m n) (A, B
and C once; output_bytes = bytes_per_element unless the output has its own type, as bf16 -> f32),
x = 3 / (1/m + 1/n + 1/k) (harmonic mean of the three dimensions),
s = k / split_k_chunk when batch m n < split_k_ratio k and k > split_k_chunk (split-K), else 1.

Each factor (1 + h/d) is the saturation of one source of parallelism or reuse: a dimension d much
larger than its half-size h costs nothing, d = h costs a factor 2. m and n fill the SMs with output
tiles, k amortises each tile's prologue and epilogue, batch adds tiles when m and n are small, and
batch m n s counts the independent pieces of work (output elements times K splits).
min_time_s is the shortest kernel (launch inside the GPU, one tile's pipeline fill): small GEMMs run
at ~1% of peak because of it. With the per-dimension half sizes and min_time_s at 0 (their
defaults) this is the earlier harmonic-mean model, so presets that give only max_fraction and
half_dim keep their meaning.

Split-K: when the output is small next to the contraction (batch m n < split_k_ratio k) GEMM
libraries cut k into chunks of split_k_chunk, run the chunks on separate compute units and add the
partial outputs. Parallel work grows by s and each tile's pipeline gets s times shorter. The switch
is a threshold, as in the libraries' heuristics, so efficiency is not monotone in the shape: on the
AMD sweeps (hipBLASLt under XLA) it falls by up to 2x where batch m n reaches ~512 k (e.g. MI300
f32, k = 4096: 38% of peak at m n = 2^20, 22% at 2^21). split_k_ratio = 0 (the default) never
splits.

Epilogue: after its main loop each output tile is converted, scaled and written; epilogue_s is
that time per output element where it does not overlap the next tile's loads. It matters when k
is short next to m n, and most with a wide output type (f16 x f16 -> f32 on MI350).

Large-tile kernel: libraries switch to bigger macro-tiles (more reuse, fewer tiles) once a
problem is big enough; from large_flops FLOPs on, max_fraction and parallel_half take the
values large_max_fraction and large_parallel_half. A step in FLOPs, like split-K's. MI300 fp8
(gfx942, fnuz) shows it most: fitted on its whole sweep the switch sits at 2^33 FLOPs; the shapes
below it reach a median of 5% of peak (at most 31%), those above a median of 31% (up to 67%), and
max_fraction goes from 0.15 to 0.88. large_flops = 0 (the default) keeps one kernel for every size.

Fitted (calibration.fit.GemmModel) on the XLA matmul performance tables (openxla/xla
default_matmul_perf_table, 375 shapes per dtype): fitted on 80% of a sweep it predicts the held-out
shapes with a median relative error of 2-7% per dtype on H100 and B200 and 2-9% on MI300 and
MI350 (tests/unit/test_calibration_gemm.py).
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp

from perfmodel.costs.lattice import applied, lmax, product, quotient


def _zero(x: sp.Expr) -> bool:
    """x is the number 0 (0 or 0.0: sympy's Float(0.0) != Integer(0)); a symbol is not (asked
    of the number only: sympy's assumption queries on the GEMM parameters' symbols cost a third of
    a mixture of experts' build)."""
    x = sp.sympify(x)
    return bool(x.is_Number and x.is_zero)


def harmonic_dim(m: sp.Expr, n: sp.Expr, k: sp.Expr) -> sp.Expr:
    return quotient(3, quotient(1, m) + quotient(1, n) + quotient(1, k))


def split_k_factor(
    m: sp.Expr, n: sp.Expr, k: sp.Expr, batch: sp.Expr, ratio: sp.Expr, chunk: sp.Expr
) -> sp.Expr:
    """How many pieces split-K cuts the contraction into [dimensionless].

    s = k / chunk if batch m n < ratio k and k > chunk, else 1. Each condition is the step
    max(0, sign(x)) (0 at the switch, so batch m n = ratio k does not split), which lambdifies to
    two numpy ufuncs (Heaviside would become a slow numpy.select).
    """
    if _zero(ratio):
        return sp.Integer(1)

    def step(x: sp.Expr) -> sp.Expr:
        return sp.Max(0, sp.sign(x)) if sp.sympify(x).is_number else lmax(0, applied(sp.sign, x))

    split = step(ratio * k - batch * m * n) * step(k - chunk)
    return 1 + split * (k / chunk - 1)


def at_least(x: sp.Expr, threshold: sp.Expr) -> sp.Expr:
    """1 where x >= threshold, else 0 [dimensionless].

    Written with max(0, sign(.)) as split_k_factor is, for the same reason (fast numpy). A
    threshold of infinity never switches: numeric evaluation of a symbolic threshold passes inf
    for large_flops = 0 (perfmodel.evaluate.values_of), as the symbols are positive.
    """
    diff = sp.sympify(threshold - x)
    return 1 - (sp.Max(0, sp.sign(diff)) if diff.is_number else lmax(0, applied(sp.sign, diff)))


# the same GEMM is asked for by every stage, forward and recompute: built once (typed: 1 and
# 1.0 would give an Integer and a Float)
@lru_cache(maxsize=4096, typed=True)
def gemm_efficiency(
    m: sp.Expr,
    n: sp.Expr,
    k: sp.Expr,
    max_fraction: sp.Expr,
    half_dim: sp.Expr,
    batch: sp.Expr = 1,
    m_half_dim: sp.Expr = 0,
    n_half_dim: sp.Expr = 0,
    k_half_dim: sp.Expr = 0,
    batch_half: sp.Expr = 0,
    parallel_half: sp.Expr = 0,
    split_k_ratio: sp.Expr = 0,
    split_k_chunk: sp.Expr = 0,
    large_flops: sp.Expr = 0,
    large_max_fraction: sp.Expr = 0,
    large_parallel_half: sp.Expr = 0,
) -> sp.Expr:
    """Fraction of peak FLOP/s a GEMM of shape (m x k) @ (k x n) reaches [dimensionless].

    Written as d / (d + h) per factor (= 1 / (1 + h/d)); a term whose half size is 0 is left out,
    so the expression stays small for sympy (explain, simplify). With large_flops set, the
    large-tile kernel's max_fraction and parallel_half apply from 2 batch m n k >= large_flops.
    """
    if not _zero(large_flops):
        large = at_least(2 * batch * m * n * k, large_flops)
        max_fraction = max_fraction + large * (large_max_fraction - max_fraction)
        parallel_half = parallel_half + large * (large_parallel_half - parallel_half)
    eff = sp.sympify(max_fraction)
    if not _zero(half_dim):
        x = harmonic_dim(m, n, k)
        eff = product(eff, quotient(x, x + half_dim))
    s = split_k_factor(m, n, k, batch, split_k_ratio, split_k_chunk)
    work = batch * m * n * s
    for dim, half in ((m, m_half_dim), (n, n_half_dim), (quotient(k, s), k_half_dim),
                      (batch, batch_half), (work, parallel_half)):
        if not _zero(half):
            eff = product(eff, quotient(dim, dim + half))
    return eff


# the same GEMM is asked for by every stage, forward and recompute: built once (typed: 1 and
# 1.0 would give an Integer and a Float)
@lru_cache(maxsize=4096, typed=True)
def gemm_time_s(
    m: sp.Expr,
    n: sp.Expr,
    k: sp.Expr,
    batch: sp.Expr,
    bytes_per_element: sp.Expr,
    peak_flops_per_s: sp.Expr,
    memory_bandwidth_bytes_per_s: sp.Expr,
    max_fraction: sp.Expr,
    half_dim: sp.Expr,
    m_half_dim: sp.Expr = 0,
    n_half_dim: sp.Expr = 0,
    k_half_dim: sp.Expr = 0,
    batch_half: sp.Expr = 0,
    min_time_s: sp.Expr = 0,
    parallel_half: sp.Expr = 0,
    split_k_ratio: sp.Expr = 0,
    split_k_chunk: sp.Expr = 0,
    epilogue_s: sp.Expr = 0,
    large_flops: sp.Expr = 0,
    large_max_fraction: sp.Expr = 0,
    large_parallel_half: sp.Expr = 0,
    unaligned_fraction: sp.Expr = 0,
    output_bytes_per_element: sp.Expr | None = None,
) -> sp.Expr:
    """Time of `batch` independent GEMMs of shape (m x k) @ (k x n) [s].

    T = min_time_s + max(2 batch m n k / (peak * eff) + epilogue_s batch m n,
                         batch * (bpe (mk + kn) + obpe mn) / bw)
    The keyword parameters after memory_bandwidth_bytes_per_s are the fields of
    perfmodel.specs.hardware.GemmEfficiency, so `gemm_time_s(..., **asdict(hw.gemm(dtype)))` works;
    unaligned_fraction is not read here (an aligned GEMM's time: the output layer of a vocabulary
    that is not aligned takes the unaligned rate beside it, perfmodel.step.embedding_head).
    """
    del unaligned_fraction
    flops = 2 * batch * m * n * k
    out_bpe = bytes_per_element if output_bytes_per_element is None else output_bytes_per_element
    nbytes = batch * (bytes_per_element * (m * k + k * n) + out_bpe * m * n)
    eff = gemm_efficiency(
        m, n, k, max_fraction, half_dim, batch, m_half_dim, n_half_dim, k_half_dim, batch_half,
        parallel_half, split_k_ratio, split_k_chunk, large_flops, large_max_fraction,
        large_parallel_half,
    )
    compute = quotient(flops, product(peak_flops_per_s, eff)) + epilogue_s * batch * m * n
    memory = nbytes / memory_bandwidth_bytes_per_s
    # symbolic arguments stay unevaluated: sympy's search for a dominated argument costs most of
    # the step model's build time and finds none (numbers still evaluate)
    numbers = sp.sympify(compute).is_number and sp.sympify(memory).is_number
    return min_time_s + (sp.Max(compute, memory) if numbers else lmax(compute, memory))
