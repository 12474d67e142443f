"""How fast one GEMM runs: a roofline with a shape-dependent compute efficiency.

T = max(F / (peak * eff(m, n, k)), B / bw)          [s]
F = 2 m n k (FLOPs), B = bytes of A, B and C once, eff = max_fraction * x / (x + half_dim),
x = 3 / (1/m + 1/n + 1/k)  (harmonic mean of the three dimensions: small in any one dimension means
poor tile use). The parameters are fitted by calibration/ on measured sweeps.
"""

from __future__ import annotations

import sympy as sp


def harmonic_dim(m: sp.Expr, n: sp.Expr, k: sp.Expr) -> sp.Expr:
    return 3 / (1 / m + 1 / n + 1 / k)


def gemm_efficiency(m: sp.Expr, n: sp.Expr, k: sp.Expr, max_fraction: sp.Expr,
                    half_dim: sp.Expr) -> sp.Expr:
    """Fraction of peak FLOP/s a GEMM of shape (m x k) @ (k x n) reaches [dimensionless]."""
    x = harmonic_dim(m, n, k)
    return max_fraction * x / (x + half_dim)


def gemm_time_s(m: sp.Expr, n: sp.Expr, k: sp.Expr, batch: sp.Expr, bytes_per_element: sp.Expr,
                peak_flops_per_s: sp.Expr, memory_bandwidth_bytes_per_s: sp.Expr,
                max_fraction: sp.Expr, half_dim: sp.Expr) -> sp.Expr:
    """Roofline time of `batch` independent GEMMs of shape (m x k) @ (k x n) [s]."""
    flops = 2 * batch * m * n * k
    nbytes = batch * bytes_per_element * (m * k + k * n + m * n)
    eff = gemm_efficiency(m, n, k, max_fraction, half_dim)
    return sp.Max(flops / (peak_flops_per_s * eff), nbytes / memory_bandwidth_bytes_per_s)
