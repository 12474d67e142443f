"""Fitting perfmodel's symbolic cost models to measurements (scikit-learn style fit / predict).

Every fit minimises relative error (a robust soft-L1 loss on (predicted - measured) / measured),
because measurements span five or more decades of size. Fitted values end in `_`.
The formulas are perfmodel's own, lambdified once, so what is fitted here is what predict uses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import sympy as sp
from scipy.optimize import least_squares, nnls

from perfmodel.costs.collectives import bus_factor, steps
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.errors import DataError
from perfmodel.specs.hardware import CollectiveFit, GemmEfficiency
from perfmodel.specs.loading import FRACTION_FLOOR
from perfmodel.specs.profile import fitted_collective_time, two_regimes

# a fitted bus bandwidth this many times the best one measured was not seen by the sweep: its sizes
# were all latency-bound (or its times fall as sizes grow), and the bus term is noise around zero
# (`calibrate run` applies the same rule to the link it writes, calibration/run.py)
UNRESOLVED_BANDWIDTH_RATIO = 10.0


def rel_errors(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> np.ndarray:
    return np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)


def residual_summary(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> dict[str, float]:
    err = rel_errors(predicted, measured)
    return {"median_rel_error": float(np.median(err)), "worst_rel_error": float(np.max(err))}


@functools.cache
def _collective_terms(op: str, algorithm: str) -> tuple[Callable, Callable]:
    """steps(n) and bus_factor(n) * nbytes as numpy functions, lambdified once."""
    n, nbytes = sp.symbols("n nbytes", positive=True)
    return (
        sp.lambdify(n, steps(op, n, algorithm) + 0 * n, "numpy"),
        sp.lambdify((nbytes, n), bus_factor(op, n) * nbytes, "numpy"),
    )


def _fit_alpha_beta(a: np.ndarray, c: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Minimise relative error of t = a * alpha + c / busbw; returns (alpha_s, busbw)."""
    A = np.column_stack([a / t, c / t])
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    x0, _ = nnls(A / scale, np.ones_like(t))
    x0 = np.maximum(x0 / scale, 0.0)
    if x0[1] <= 0:  # a pure-latency curve still needs a finite bandwidth
        x0[1] = 1e-3 / max(float(np.max(c / t)), 1e-30)

    def resid(x: np.ndarray) -> np.ndarray:
        return (a * x[0] + c * x[1]) / t - 1.0

    res = least_squares(
        resid,
        x0,
        bounds=([0.0, 1e-30], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.05,
        x_scale=np.maximum(x0, 1e-30),
    )
    return float(res.x[0]), float(1.0 / res.x[1])


# a slowdown regime (CollectiveModel._split) may start this much above the small regime's time
# at the breakpoint, no more: a larger step would be fitting noise
MAX_STEP_UP = 0.3


def _breakpoint(steps_n: float, bus_factor_n: float, small: tuple[float, float],
                large: tuple[float, float], cut: float) -> float | None:
    """Where a second regime (alpha_s, busbw) takes over from the small messages' at a group's
    steps and bus factor [B], the time never falling as the size grows; None where it would.

    A protocol switch (large has the higher alpha and the higher bandwidth): where the lines
    meet, steps alpha_small + bf N / busbw_small = steps alpha + bf N / busbw, so
    N = steps (alpha - alpha_small) / (bf (1 / busbw_small - 1 / busbw)): continuous there.
    A slowdown (large has no lower alpha and no higher bandwidth, slower at every size): `cut`,
    between the sizes measured on either side, where the time steps up by at most MAX_STEP_UP.
    """
    extra_latency = steps_n * (large[0] - small[0])
    extra_per_byte = bus_factor_n * (1.0 / small[1] - 1.0 / large[1])
    if extra_latency > 0 and extra_per_byte > 0:
        return extra_latency / extra_per_byte
    if extra_latency >= 0 and extra_per_byte <= 0:
        below = steps_n * small[0] + bus_factor_n * cut / small[1]
        step = extra_latency - extra_per_byte * cut
        return cut if step <= MAX_STEP_UP * below else None
    return None


class CollectiveModel:
    """Alpha-beta fit of one collective on one scope.

    T = steps(op, n, algorithm) * alpha_s + bus_factor(op, n) * nbytes / busbw
    One (alpha, busbw) pair; when it misses the median by more than `split_above` (NCCL's
    protocol or algorithm switches make the curve piecewise), a second regime for small messages
    is added, from the size where its line meets the first (continuous, growing with size: see
    _split). See perfmodel.specs.profile.fitted_collective_time.
    """

    def __init__(
        self,
        op: str,
        scope: str,
        algorithm: str = "ring",
        *,
        split_above: float = 0.05,
        min_points: int = 3,
    ) -> None:
        self.op, self.scope, self.algorithm = op, scope, algorithm
        self.split_above, self.min_points = split_above, min_points

    def fit(self, records: pd.DataFrame) -> CollectiveModel:
        """records: columns nbytes, ranks, time_s (one row per measurement)."""
        df = records[(records["nbytes"] > 0) & (records["time_s"] > 0)]
        if len(df) < 2:
            raise DataError(
                f"{self.op}/{self.scope}: need at least 2 measurements with "
                f"size > 0 to fit, got {len(df)}"
            )
        df = df.sort_values("nbytes")
        nb, n, t = (df[c].to_numpy(float) for c in ("nbytes", "ranks", "time_s"))
        f_steps, f_bytes = _collective_terms(self.op, self.algorithm)
        a, c = np.broadcast_to(f_steps(n), n.shape).astype(float), f_bytes(nb, n)
        self.alpha_s_, self.bus_bandwidth_bytes_per_s_ = _fit_alpha_beta(a, c, t)
        self.breakpoint_bytes_ = 0.0
        self.alpha_s_small_ = self.bus_bandwidth_bytes_per_s_small_ = 0.0
        single = float(np.median(rel_errors(self.predict(nb, n), t)))
        sizes = np.unique(nb)
        if single > self.split_above and len(sizes) >= 2 * self.min_points:
            self._split(nb, n, a, c, t, sizes, single)
        self.size_range_ = (float(nb.min()), float(nb.max()))
        # the highest bus bandwidth a measurement reached: a lower bound on the link's, all a
        # latency-bound sweep (small sizes only) can say about it
        self.measured_bus_bandwidth_bytes_per_s_ = float(np.max(c / t))
        self.ranks_ = sorted({int(v) for v in n})
        self.n_points_ = len(t)
        self.residuals_ = residual_summary(self.predict(nb, n), t)
        return self

    def _split(self, nb: np.ndarray, n: np.ndarray, a: np.ndarray, c: np.ndarray,
               t: np.ndarray, sizes: np.ndarray, single: float) -> None:
        """Try a second regime for small messages; keep it where it cuts the median error of
        one regime by a fifth or more. The fitted time stays non-decreasing in size.

        Each split of the sizes fits one (alpha, busbw) pair below and one above. Two kinds of
        split are taken, and the breakpoint placed by its kind:
        - a protocol switch (the small regime has the lower alpha and the lower bandwidth):
          NCCL runs the faster protocol at each size, so the breakpoint is where the two lines
          meet, and the time is continuous there. They are made to meet at the fewest ranks
          measured; for another group the faster of the two holds at each size
          (perfmodel.specs.profile.two_regimes), so they meet where that group's lines do;
        - a slowdown (the large regime has no lower alpha and no higher bandwidth: slower at
          every size, as when busbw falls beyond some size): the breakpoint lies between the two
          sizes measured on either side, where the measured times themselves step up, by 30% at
          most (a larger step would be fitting noise).
        A split whose large regime would be faster than the small one at the breakpoint (the
        time falling as the size grows) is not taken, nor one with fewer than min_points sizes
        on a side. Candidates are scored by the mean relative error of the time as written (the
        median is flat near the optimum).
        """
        n0 = float(n.min())
        f_steps, f_bytes = _collective_terms(self.op, self.algorithm)
        st0, bf0 = float(f_steps(n0)), float(f_bytes(1.0, n0))
        # (mean error, median error, (breakpoint, small regime, large regime) or None)
        best: tuple[float, float, tuple[float, tuple[float, float], tuple[float, float]] | None]
        best = (math.inf, math.inf, None)
        least = max(self.min_points, math.ceil(0.2 * len(sizes)))  # sizes per regime
        for i in range(least, len(sizes) - least + 1):
            cut = math.sqrt(sizes[i - 1] * sizes[i])
            lo = nb < cut
            p_lo = _fit_alpha_beta(a[lo], c[lo], t[lo])
            p_hi = _fit_alpha_beta(a[~lo], c[~lo], t[~lo])
            bp = _breakpoint(st0, bf0, p_lo, p_hi, cut)
            if bp is None or min(np.sum(sizes < bp), np.sum(sizes >= bp)) < self.min_points:
                continue
            pred = two_regimes(a * p_lo[0] + c / p_lo[1], a * p_hi[0] + c / p_hi[1], nb, bp,
                               p_hi[1], p_lo[1])
            err = rel_errors(pred, t)
            if float(np.mean(err)) < best[0]:
                best = (float(np.mean(err)), float(np.median(err)), (bp, p_lo, p_hi))
        if best[2] is not None and best[1] < single * 0.8:
            bp, p_lo, p_hi = best[2]
            self.breakpoint_bytes_ = bp
            self.alpha_s_small_, self.bus_bandwidth_bytes_per_s_small_ = p_lo
            self.alpha_s_, self.bus_bandwidth_bytes_per_s_ = p_hi

    @property
    def bandwidth_resolved_(self) -> bool:
        """The fitted bus bandwidth is within UNRESOLVED_BANDWIDTH_RATIO of the best measured: the
        sweep reached sizes where the bus term shows (a latency-bound one fits 1e13-1e29 B/s)."""
        return (self.bus_bandwidth_bytes_per_s_
                <= UNRESOLVED_BANDWIDTH_RATIO * self.measured_bus_bandwidth_bytes_per_s_)

    def to_fit(self) -> CollectiveFit:
        return CollectiveFit(
            op=self.op,
            scope=self.scope,
            algorithm=self.algorithm,
            alpha_s=self.alpha_s_,
            bus_bandwidth_bytes_per_s=self.bus_bandwidth_bytes_per_s_,
            breakpoint_bytes=self.breakpoint_bytes_,
            alpha_s_small=self.alpha_s_small_,
            bus_bandwidth_bytes_per_s_small=self.bus_bandwidth_bytes_per_s_small_,
        )

    def predict(self, nbytes: Any, ranks: Any) -> np.ndarray:
        return fitted_collective_time(self.to_fit(), self.op, nbytes, ranks)

    def summary(self) -> dict[str, Any]:
        fit = self.to_fit()
        params = {
            "alpha_s": fit.alpha_s,
            "bus_bandwidth_bytes_per_s": fit.bus_bandwidth_bytes_per_s,
        }
        if fit.breakpoint_bytes > 0:
            params.update(
                breakpoint_bytes=fit.breakpoint_bytes,
                alpha_s_small=fit.alpha_s_small,
                bus_bandwidth_bytes_per_s_small=fit.bus_bandwidth_bytes_per_s_small,
            )
        return {
            "kind": "collective",
            "op": self.op,
            "scope": self.scope,
            "algorithm": self.algorithm,
            "ranks": self.ranks_,
            "params": params,
            **self.residuals_,
            "size_range": list(self.size_range_),
            "n_points": self.n_points_,
        }


# Fitted continuously (least squares), in this order in the parameter vector (all but
# max_fraction as logarithms); split_k_ratio and large_flops are thresholds, chosen from a grid.
_GEMM_PARAMS = (
    "max_fraction",
    "m_half_dim",
    "n_half_dim",
    "k_half_dim",
    "parallel_half",
    "split_k_chunk",
    "min_time_s",
    "epilogue_s",
)
_LARGE_PARAMS = ("large_max_fraction", "large_parallel_half")
# 0 = never split; AMD's switch lies at 256-512. Powers of 2, as the sweeps' shapes are.
_SPLIT_K_RATIOS = (0.0, *(2.0**e for e in range(4, 13)))
# large-tile kernel thresholds: powers of 2 of FLOPs with at least this share of the shapes (and
# GemmModel.MIN_POINTS) on each side: the switch must be seen from both sides to be fitted
_LARGE_MIN_SHARE = 0.08
_STEP = float(np.finfo(float).eps) ** 0.5  # scipy's relative step for '2-point'


@functools.lru_cache(maxsize=1)
def _gemm_function() -> Callable:
    names = ("m", "n", "k", "batch", "bpe", "peak", "bw", *_GEMM_PARAMS, *_LARGE_PARAMS,
             "split_k_ratio", "large_flops", "obpe")
    syms = sp.symbols(names, positive=True)
    s = dict(zip(names, syms, strict=True))
    expr = gemm_time_s(
        s["m"],
        s["n"],
        s["k"],
        s["batch"],
        s["bpe"],
        s["peak"],
        s["bw"],
        half_dim=0,
        **{p: s[p] for p in (*_GEMM_PARAMS, *_LARGE_PARAMS, "split_k_ratio", "large_flops")},
        output_bytes_per_element=s["obpe"],
    )
    return sp.lambdify(syms, expr, "numpy", cse=True)


def _large_thresholds(flops: np.ndarray, min_points: int) -> list[float]:
    """Candidate large_flops: powers of 2 with at least _LARGE_MIN_SHARE of the shapes, and at
    least min_points shapes, below and at or above (none for a small sweep)."""
    out = []
    for e in range(int(np.floor(np.log2(flops.min()))), int(np.ceil(np.log2(flops.max()))) + 1):
        above = int(np.sum(flops >= 2.0**e))
        low = max(min_points, _LARGE_MIN_SHARE * len(flops))
        if above >= low and len(flops) - above >= low:
            out.append(2.0**e)
    return out


class GemmModel:
    """Fit perfmodel.costs.gemm_efficiency.gemm_time_s to measured GEMM times.

    The peak and memory bandwidth are given (datasheet); max_fraction, the half sizes of m, n, k
    and of the parallel work, the split-K chunk, min_time_s and the epilogue time are fitted by
    least squares in relative error, for each split-K threshold in _SPLIT_K_RATIOS; the threshold
    with the smallest loss wins (a threshold has no useful gradient). Then, at that split-K
    threshold, a large-tile kernel (its own max_fraction and parallel_half from large_flops on) is
    tried at each power-of-2 threshold inside the sweep, starting from the one-kernel fit; it is
    kept where it lowers the loss. half_dim (harmonic mean term) and batch_half are left at 0:
    batch enters through the parallel work.
    max_fraction may exceed 1 when the data beat the datasheet peak (suspect data, or a wrong
    peak); `efficiency()` refuses that, the caller decides.
    """

    MIN_POINTS = len(_GEMM_PARAMS) + 1  # fewer shapes than parameters cannot be fitted

    def __init__(
        self,
        peak_flops_per_s: float,
        memory_bandwidth_bytes_per_s: float = math.inf,
        bytes_per_element: float = 2.0,
        output_bytes_per_element: float | None = None,
    ) -> None:
        self.peak_flops_per_s = peak_flops_per_s
        self.memory_bandwidth_bytes_per_s = memory_bandwidth_bytes_per_s
        self.bytes_per_element = bytes_per_element
        self.output_bytes_per_element = (
            bytes_per_element if output_bytes_per_element is None else output_bytes_per_element
        )

    def _time(self, x: np.ndarray, ratio: float, large_flops: float, b, m, n, k) -> np.ndarray:
        """x: the _GEMM_PARAMS (max_fraction, then logarithms), then with a large kernel its
        max_fraction and log parallel_half."""
        one = [x[0], *np.exp(x[1:len(_GEMM_PARAMS)])]
        large = [x[len(_GEMM_PARAMS)], np.exp(x[-1])] if large_flops > 0 else [0.0, 0.0]
        return _gemm_function()(
            m,
            n,
            k,
            b,
            self.bytes_per_element,
            self.peak_flops_per_s,
            self.memory_bandwidth_bytes_per_s,
            *one,
            *large,
            ratio,
            large_flops or math.inf,  # 0: never (the symbols are positive; see at_least)
            self.output_bytes_per_element,
        )

    def fit(self, records: pd.DataFrame) -> GemmModel:
        """records: columns b, m, n, k, time_s."""
        df = records[records["time_s"] > 0]
        if len(df) < self.MIN_POINTS:
            raise DataError(f"GEMM fit needs at least {self.MIN_POINTS} shapes, got {len(df)}")
        b, m, n, k, t = (df[c].to_numpy(float) for c in ("b", "m", "n", "k", "time_s"))
        best_eff = float(np.max(2 * b * m * n * k / t)) / self.peak_flops_per_s
        log = math.log
        # fractions of peak stay <= 1 unless the data beat the peak (then the caller is told)
        top = 1.0 if best_eff <= 1.0 else 1.5 * best_eff
        # max_fraction, m, n, k halves, parallel_half, split_k_chunk, min_time_s, epilogue_s
        x0 = [best_eff, log(64), log(64), log(64), log(1e5), log(512),
              log(max(t.min() / 4, 1e-9)), log(1e-13)]
        # (a fraction below FRACTION_FLOOR is no spec a profile may write: perfmodel.specs.loading)
        lo = [FRACTION_FLOOR, log(1e-2), log(1e-2), log(1e-2), log(1.0), log(16.0), log(1e-10),
              log(1e-18)]
        hi = [top, log(1e6), log(1e6), log(1e6), log(1e9), log(1e5), log(10.0), log(1e-9)]

        def solve(x0, lo, hi, ratio, large_flops):
            lo, hi = np.array(lo), np.array(hi)
            reps = len(x0) + 1
            tiles = [np.tile(v, reps) for v in (b, m, n, k, t)]

            def residuals(x):
                return self._time(x, ratio, large_flops, b, m, n, k) / t - 1.0

            def jacobian(x):
                # scipy's '2-point' forward differences (approx_derivative: the step
                # sqrt(eps) max(1, |x|), backward where forward would leave the bounds), with
                # the p + 1 parameter vectors evaluated in one call over p + 1 copies of the
                # shapes rather than p + 1 calls: the same Jacobian at a fraction of the cost
                h = _STEP * np.where(x >= 0, 1.0, -1.0) * np.maximum(1.0, np.abs(x))
                below, above = x - lo, hi - x
                fits = np.abs(h) <= np.maximum(below, above)
                h = np.where(((x + h < lo) | (x + h > hi)) & fits, -h, h)
                h = np.where(fits, h, np.where(above >= below, above, -below))
                h = (x + h) - x
                rows = np.vstack([x, x + np.diag(h)])  # (p + 1, p)
                f = (self._time(np.repeat(rows, len(t), axis=0).T, ratio, large_flops, *tiles[:4])
                     / tiles[-1] - 1.0).reshape(len(rows), len(t))
                return ((f[1:] - f[0]) / h[:, None]).T

            return least_squares(
                residuals,
                np.clip(x0, lo + 1e-9, hi - 1e-9),
                jac=jacobian,
                bounds=(lo, hi),
                # robust: kernel-selection outliers (2x off) must not pull the fit; cauchy beat
                # soft_l1 on the hold-out of every sweep in tests/data/gemm
                loss="cauchy",
                f_scale=0.05,
            )

        # the first ratio of the lowest cost
        best = min(((solve(x0, lo, hi, ratio, 0.0), ratio, 0.0) for ratio in _SPLIT_K_RATIOS),
                   key=lambda tried: tried[0].cost)
        one, ratio, _ = best
        # the large-tile kernel starts as a copy of the one kernel
        x1 = [*one.x, one.x[0], one.x[4]]
        for large_flops in _large_thresholds(2 * b * m * n * k, self.MIN_POINTS):
            res = solve(x1, [*lo, FRACTION_FLOOR, lo[4]], [*hi, top, hi[4]], ratio, large_flops)
            if res.cost < best[0].cost:
                best = (res, ratio, large_flops)
        res, self.split_k_ratio_, self.large_flops_ = best
        self.x_ = res.x
        x = [float(v) for v in res.x]
        self.params_ = dict(
            zip(_GEMM_PARAMS, [x[0], *map(math.exp, x[1:len(_GEMM_PARAMS)])], strict=True)
        )
        self.params_["split_k_ratio"] = float(self.split_k_ratio_)
        self.params_["large_flops"] = float(self.large_flops_)
        large = self.large_flops_ > 0
        self.params_["large_max_fraction"] = x[len(_GEMM_PARAMS)] if large else 0.0
        self.params_["large_parallel_half"] = math.exp(x[-1]) if large else 0.0
        flops = 2 * b * m * n * k
        self.size_range_ = (float(flops.min()), float(flops.max()))
        self.n_points_ = len(t)
        self.residuals_ = residual_summary(self.predict(df), t)
        return self

    def predict(self, records: pd.DataFrame) -> np.ndarray:
        b, m, n, k = (records[c].to_numpy(float) for c in ("b", "m", "n", "k"))
        return self._time(self.x_, self.split_k_ratio_, self.large_flops_, b, m, n, k)

    @property
    def peak_fraction_(self) -> float:
        """The highest fraction of peak the fit reaches: the faster kernel's max_fraction."""
        return max(self.params_["max_fraction"], self.params_["large_max_fraction"])

    def efficiency(self) -> GemmEfficiency:
        return GemmEfficiency(half_dim=0.0, **self.params_)

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "gemm",
            "params": dict(self.params_, half_dim=0.0),
            "peak_flops_per_s": self.peak_flops_per_s,
            "bytes_per_element": self.bytes_per_element,
            "output_bytes_per_element": self.output_bytes_per_element,
            # the memory roofline of the fit (absent when the fit ignored it: an infinite bandwidth)
            **(
                {"memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s}
                if math.isfinite(self.memory_bandwidth_bytes_per_s)
                else {}
            ),
            **self.residuals_,
            "size_range": list(self.size_range_),
            "size_unit": "flops",
            "n_points": self.n_points_,
        }


def holdout_error(
    records: pd.DataFrame, make_model: Callable[[], GemmModel], *, folds: int = 5, seed: int = 0
) -> dict[str, float]:
    """k-fold cross-validation: fit on (folds-1)/folds of the shapes, predict the rest."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(records))
    errs = []
    for part in np.array_split(idx, folds):
        train = records.iloc[np.setdiff1d(idx, part)]
        test = records.iloc[part]
        model = make_model().fit(train)
        errs.append(rel_errors(model.predict(test), test["time_s"].to_numpy(float)))
    err = np.concatenate(errs)
    return {
        "median_rel_error": float(np.median(err)),
        "worst_rel_error": float(np.max(err)),
        "n_points": len(err),
    }


class BandwidthModel:
    """Memory bandwidth: T = alpha_s + nbytes / bandwidth, fitted on the sizes beyond cache.

    nbytes are the bytes a kernel moves (read + write). Cache-resident sizes run faster than
    memory; the fit uses the largest `tail` fraction of the sizes (by default the upper half).
    """

    def __init__(self, kernel: str, tail: float = 0.5) -> None:
        self.kernel, self.tail = kernel, tail

    def fit(self, records: pd.DataFrame) -> BandwidthModel:
        df = records[(records["nbytes"] > 0) & (records["time_s"] > 0)].sort_values("nbytes")
        sizes = np.unique(df["nbytes"])
        if len(sizes) < 2:
            raise DataError(f"memory bandwidth ({self.kernel}): need at least 2 sizes")
        cut = sizes[min(len(sizes) - 2, int(len(sizes) * (1 - self.tail)))]
        df = df[df["nbytes"] >= cut]
        nb, t = df["nbytes"].to_numpy(float), df["time_s"].to_numpy(float)
        self.alpha_s_, self.bandwidth_bytes_per_s_ = _fit_alpha_beta(np.ones_like(nb), nb, t)
        self.size_range_ = (float(nb.min()), float(nb.max()))
        self.n_points_ = len(t)
        self.residuals_ = residual_summary(self.predict(nb), t)
        return self

    @property
    def alpha_pinned_(self) -> bool:
        """The fixed cost sits at its lower bound 0 and the line still misses the times by
        over 10% (median): the data wanted a negative fixed cost (times growing faster than
        the bytes, as where the smaller sizes ran in a cache)."""
        return (self.alpha_s_ <= 1e-6 * float(self.predict(self.size_range_[1]))
                and self.residuals_["median_rel_error"] > 0.10)

    def predict(self, nbytes: Any) -> np.ndarray:
        return self.alpha_s_ + np.asarray(nbytes, dtype=float) / self.bandwidth_bytes_per_s_

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "memory_bandwidth",
            "kernel": self.kernel,
            "params": {
                "alpha_s": self.alpha_s_,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s_,
            },
            **self.residuals_,
            "size_range": list(self.size_range_),
            "n_points": self.n_points_,
        }


# the mix of kernels perfmodel counts in one layer's forward (kernels_per_layer_forward in
# perfmodel.costs.compute, without its communication calls): 6 GEMMs; element-wise: 2 norms,
# 1 activation, 6 adds (2 residual, 4 bias), softmax and dropout (the softmax chain: both)
LAYER_KERNEL_MIX = {"linear": 6, "layernorm": 2, "gelu": 1, "add": 6, "softmax": 2}


class KernelOverheadModel:
    """Fixed cost per kernel from chains of N tiny ops run forward and backward.

    Per op kind: t(N) = c + N * per_op_s (least relative error), per_op_s the fixed cost of one
    op forward + backward. perfmodel charges kernel_overhead_s three times per forward kernel
    (forward, and backward at twice the forward), so kernel_overhead_s = sum_k w_k per_op_s_k /
    (3 sum_k w_k), with w the kernel mix of a layer as perfmodel counts it (LAYER_KERNEL_MIX).
    """

    def __init__(self, mix: dict[str, float] | None = None) -> None:
        self.mix = dict(mix or LAYER_KERNEL_MIX)

    def fit(self, records: pd.DataFrame) -> KernelOverheadModel:
        """records: columns op, length, time_s (one row per chain)."""
        df = records[(records["length"] > 0) & (records["time_s"] > 0)]
        self.per_op_s_, self.intercept_s_, self.residuals_ = {}, {}, {}
        for op, rows in df.groupby("op"):
            if rows["length"].nunique() < 2:
                continue
            n, t = rows["length"].to_numpy(float), rows["time_s"].to_numpy(float)
            c, inv = _fit_alpha_beta(np.ones_like(n), n, t)  # t = c + n / inv
            self.per_op_s_[op], self.intercept_s_[op] = 1.0 / inv, c
            self.residuals_[op] = residual_summary(c + n / inv, t)
        weights = {op: w for op, w in self.mix.items() if op in self.per_op_s_}
        if not weights:
            raise DataError("kernel overhead: need chains of at least 2 lengths of one op kind")
        total = sum(weights.values())
        self.kernel_overhead_s_ = (
            sum(w * self.per_op_s_[op] for op, w in weights.items()) / total / 3.0
        )
        self.lengths_ = sorted({int(v) for v in df["length"]})
        self.n_points_ = len(df)
        errs = [r["median_rel_error"] for r in self.residuals_.values()]
        worst = [r["worst_rel_error"] for r in self.residuals_.values()]
        self.summary_residuals_ = {
            "median_rel_error": float(np.median(errs)),
            "worst_rel_error": float(np.max(worst)),
        }
        return self

    def predict(self, op: str, length: Any) -> np.ndarray:
        return self.intercept_s_[op] + np.asarray(length, dtype=float) * self.per_op_s_[op]

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "kernel_overhead",
            "params": {"kernel_overhead_s": self.kernel_overhead_s_},
            "per_op_forward_backward_s": dict(self.per_op_s_),
            "intercept_s": dict(self.intercept_s_),
            "residuals_per_op": dict(self.residuals_),
            "mix": dict(self.mix),
            **self.summary_residuals_,
            "size_range": [min(self.lengths_), max(self.lengths_)],
            "size_unit": "ops per chain",
            "n_points": self.n_points_,
        }


class OptimizerModel:
    """Optimizer step: T = alpha_s + bytes_per_param * params / bandwidth.

    bytes_per_param is perfmodel's count (perfmodel.costs.precision.optimizer_step_bytes_per_param),
    so the fitted bandwidth is the rate at which perfmodel's optimizer term must run to reproduce
    the measured steps.
    """

    def __init__(self, bytes_per_param: float, kernel: str = "adamw_foreach") -> None:
        self.bytes_per_param = bytes_per_param
        self.kernel = kernel  # how AdamW ran: adamw_foreach (CPU) or adamw_fused (GPU)

    def fit(self, records: pd.DataFrame) -> OptimizerModel:
        """records: columns params, time_s."""
        df = records[(records["params"] > 0) & (records["time_s"] > 0)]
        if df["params"].nunique() < 2:
            raise DataError("optimizer: need steps over at least 2 parameter counts")
        nb = df["params"].to_numpy(float) * self.bytes_per_param
        t = df["time_s"].to_numpy(float)
        self.alpha_s_, self.bandwidth_bytes_per_s_ = _fit_alpha_beta(np.ones_like(nb), nb, t)
        self.size_range_ = (float(df["params"].min()), float(df["params"].max()))
        self.n_points_ = len(t)
        self.residuals_ = residual_summary(self.predict(df["params"]), t)
        return self

    def predict(self, params: Any) -> np.ndarray:
        nb = np.asarray(params, dtype=float) * self.bytes_per_param
        return self.alpha_s_ + nb / self.bandwidth_bytes_per_s_

    def summary(self) -> dict[str, Any]:
        return {
            "kind": "memory_bandwidth",
            "kernel": self.kernel,
            "params": {
                "alpha_s": self.alpha_s_,
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s_,
                "bytes_per_param": self.bytes_per_param,
            },
            **self.residuals_,
            "size_range": list(self.size_range_),
            "size_unit": "parameters",
            "n_points": self.n_points_,
        }
