"""Plots from the API (matplotlib): the same functions back the CLI's --plot options.

Each `*_axes(obj, ax=None)` draws one chart on `ax` (or on a new figure's) and returns the Axes;
each `*_figure(obj)` returns a Figure of several panels. No pyplot: figures are plain
matplotlib.figure.Figure objects, so nothing global is touched and nothing needs closing. In a
notebook run `%matplotlib inline` once and a Figure a cell returns is shown.
The `*_plot(obj, path)` functions the CLI uses render a figure and write the file atomically
(PNG, SVG or PDF by the suffix; PNG for any other).

Charts and what they draw:
- breakdown_axes: the step-time breakdown of a prediction, one bar per non-zero named term [s]
- memory_axes: the per-GPU memory breakdown [GiB] with the capacity
- pareto_axes: every plan of a search, step time against memory, the Pareto front
- collective_fit_axes, gemm_fit_axes, bandwidth_fit_axes, calibration_figure: a profile's fits,
  measured points against the fitted curve, log-log
- validation_axes: predicted against measured time per term of one validation report
- predicted_vs_measured_axes: predicted against measured step time over many runs (reports or
  the history CSV `perfmodel validate` appends to)
- sweep_figure: a layer-graph sweep (step time and communication share against one field)
- timeline_axes, timeline_figure: Gantt charts of perfmodel.timeline timelines (predicted, and
  measured beside it for validate)
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.errors import DataError
from perfmodel.files import figure_format, read_text_bounded, write_atomic

GiB = 2**30


# --- figures and files --------------------------------------------------------------------------


def new_figure(width: float = 7.0, height: float = 4.5) -> Any:
    """A Figure outside pyplot (no global state, garbage-collected like any object)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _axes(ax: Any, width: float = 7.0, height: float = 4.5) -> Any:
    return ax if ax is not None else new_figure(width, height).add_subplot()


def figure_bytes(fig: Any, fmt: str = "png") -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=120, bbox_inches="tight")
    return buffer.getvalue()


def save_figure(fig: Any, path: str | Path) -> Path:
    """Render to memory, then write the file atomically: never a half-written image."""
    path = Path(path)
    write_atomic(path, figure_bytes(fig, figure_format(path)), what="plot")
    return path


def _figure_of(ax: Any) -> Any:
    return ax.get_figure()


# --- predictions --------------------------------------------------------------------------------


def _terms(mapping: Mapping[str, float], what: str, scale: float = 1.0) -> list[tuple[str, float]]:
    items = [(str(k), float(v) / scale) for k, v in mapping.items()]
    bad = [k for k, v in items if not math.isfinite(v) or v < 0]
    if bad:
        raise DataError(f"{what}: term(s) {', '.join(bad)} are not finite non-negative numbers")
    return [(k, v) for k, v in items if v > 0]


def _need(obj: Any, attrs: tuple[str, ...], what: str) -> None:
    missing = [a for a in attrs if not hasattr(obj, a)]
    if missing:
        raise TypeError(f"{what} needs an object with {', '.join(attrs)} (a perfmodel Prediction "
                        f"or GridPrediction); got {type(obj).__name__} without {missing[0]}")


def _capacity(prediction: Any) -> float:
    cap = getattr(prediction, "memory_capacity_bytes", None)
    return float(cap if cap is not None else prediction.hardware.memory_bytes)


def breakdown_axes(prediction: Any, ax: Any = None) -> Any:
    """Horizontal bars of the step-time breakdown: one bar per named term above zero [s]."""
    _need(prediction, ("breakdown_s", "step_time_s"), "breakdown_axes")
    items = _terms(prediction.breakdown_s, "step-time breakdown")
    ax = _axes(ax, 7.0, 0.3 * len(items) + 1.5)
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step")
    title = f"step time {prediction.step_time_s:.4g} s"
    if hasattr(prediction, "mfu"):
        title += f", MFU {prediction.mfu:.1%}"
    ax.set_title(title)
    return ax


def memory_axes(prediction: Any, ax: Any = None) -> Any:
    """Horizontal bars of the per-GPU memory breakdown [GiB], with the capacity as a line."""
    _need(prediction, ("memory_breakdown_bytes", "memory_per_gpu_bytes"), "memory_axes")
    items = _terms(prediction.memory_breakdown_bytes, "memory breakdown", GiB)
    ax = _axes(ax, 7.0, 0.3 * len(items) + 1.5)
    ax.barh([k for k, _ in items], [v for _, v in items], color="tab:green")
    ax.invert_yaxis()
    ax.axvline(_capacity(prediction) / GiB, color="tab:red", ls="--", label="capacity")
    ax.set_xlabel("GiB per GPU")
    ax.set_title(f"memory {prediction.memory_per_gpu_bytes / GiB:.3g} GiB per GPU")
    ax.legend(loc="lower right", fontsize=8)
    return ax


def prediction_figure(prediction: Any) -> Any:
    """The step-time and the memory breakdown of one prediction, side by side."""
    _need(prediction, ("breakdown_s", "memory_breakdown_bytes"), "prediction_figure")
    rows = max(len(prediction.breakdown_s), len(prediction.memory_breakdown_bytes))
    fig = new_figure(12, 0.32 * rows + 1.8)
    left, right = fig.subplots(1, 2)
    breakdown_axes(prediction, left)
    memory_axes(prediction, right)
    gpus = getattr(prediction.plan, "gpus", "?")
    fig.suptitle(f"{prediction.model.name} on {gpus} x {prediction.hardware.gpu_name}")
    fig.tight_layout()
    return fig


# --- search -------------------------------------------------------------------------------------


def pareto_front(times: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the plans no other plan beats in both step time and memory, fastest first."""
    times, memory = np.asarray(times, dtype=float), np.asarray(memory, dtype=float)
    if times.shape != memory.shape:
        raise DataError(f"pareto_front: {times.shape[0]} times but {memory.shape[0]} memories")
    order = np.lexsort((memory, times))
    front, best_memory = [], np.inf
    for i in order:
        if memory[i] < best_memory:
            front.append(i)
            best_memory = memory[i]
    return np.array(front, dtype=int)


def pareto_axes(result: Any, ax: Any = None) -> Any:
    """The evaluated plans of a search (perfmodel.search.SearchResult: its random sample of them)
    in step time against memory per GPU, log-log, with the Pareto front of every evaluated plan,
    the memory limit and the recommended plan."""
    for attr in ("sample", "front", "best", "capacity_bytes", "evaluated"):
        if not hasattr(result, attr):
            raise TypeError(f"pareto_axes needs a perfmodel.search.SearchResult; got "
                            f"{type(result).__name__} without {attr}")
    if not result.evaluated:
        raise DataError("pareto_axes: the search evaluated no plan (nothing to plot)")
    if getattr(result, "skipped", 0):
        raise DataError(f"pareto_axes: the search skipped {result.skipped:,} plans by their "
                        "step time's lower bound, so its front lacks them (search with "
                        "prune=False)")
    sample, front = result.sample, result.front
    ax = _axes(ax)
    label = ("evaluated plans" if len(sample) == result.evaluated else
             f"evaluated plans (a random {len(sample):,} of {result.evaluated:,})")
    ax.scatter(sample.step_time_s, sample.memory_bytes / GiB, s=4, alpha=0.25, color="tab:gray",
               label=label)
    ax.plot(front.step_time_s, front.memory_bytes / GiB, "o-", color="tab:blue", ms=3,
            label="Pareto front")
    ax.axhline(result.capacity_bytes / GiB, color="tab:red", ls="--", label="memory limit")
    if len(result.best):
        ax.plot(result.best.step_time_s[0], result.best.memory_bytes[0] / GiB, "*", ms=14,
                color="tab:orange", label="recommended")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step time [s]")
    ax.set_ylabel("memory per GPU [GiB]")
    ax.legend(loc="best", fontsize=8)
    ax.set_title("time-memory trade-off of every plan")
    return ax


# --- layer-graph sweeps -------------------------------------------------------------------------


def sweep_figure(frame: Any, varied: list[str], title: str = "") -> Any:
    """Step time (top, log-log) and its communication share (bottom) against the first varied
    field of a perfmodel.layerwise.sweep table, one line per value of the others."""
    if not varied:
        raise DataError("sweep_figure: name at least one varied field")
    missing = [c for c in (*varied, "step_time_s", "communication_share") if c not in frame]
    if missing:
        raise DataError(f"sweep_figure: the table has no column '{missing[0]}'")
    x, others = varied[0], list(varied[1:])
    fig = new_figure(7, 6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    groups = frame.groupby(others) if others else [((), frame)]
    for key, group in groups:
        values = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v:g}" for k, v in zip(others, values, strict=True)) or None
        group = group.sort_values(x)
        top.plot(group[x], group["step_time_s"], "o-", label=label)
        bottom.plot(group[x], group["communication_share"] * 100, "o-", label=label)
    top.set_xscale("log")
    top.set_yscale("log")
    top.set_ylabel("step time [s]")
    bottom.set_ylabel("communication [% of step]")
    bottom.set_xlabel(x)
    if others:
        top.legend(fontsize=8)
    top.set_title(title)
    return fig


# --- calibration fits ---------------------------------------------------------------------------


def _fit_rows(measurements: Any, fit: Mapping[str, Any], name: str = "") -> Any:
    """The measurements a fit was made from (by kind, op/scope, dtype/device, kernel)."""
    if measurements is None or len(measurements) == 0:
        return None
    df = measurements
    kind = fit.get("kind")
    if kind == "collective":
        if not {"op", "scope", "nbytes", "time_s"} <= set(df):
            return None
        return df[(df["op"] == fit["op"]) & (df["scope"] == fit["scope"])]
    if kind == "gemm":
        if not {"b", "m", "n", "k", "time_s"} <= set(df):
            return None
        keep = np.ones(len(df), dtype=bool)
        if "kind" in df:
            keep &= (df["kind"] == "gemm").to_numpy()
        for col in ("dtype", "device"):
            if col in df and fit.get(col) is not None:
                keep &= (df[col] == fit[col]).to_numpy()
        parts = name.split("/")
        if "campaign" in df and len(parts) > 3:
            keep &= (df["campaign"].astype(str) == parts[3]).to_numpy()
        return df[keep]
    if kind == "memory_bandwidth":
        if not {"nbytes", "time_s"} <= set(df):
            return None
        keep = np.ones(len(df), dtype=bool)
        if "kind" in df:
            keep &= (df["kind"] == "memory").to_numpy()
        if "kernel" in df and fit.get("kernel") is not None:
            keep &= (df["kernel"] == fit["kernel"]).to_numpy()
        return df[keep]
    return None


def _check_fit_kind(fit: Mapping[str, Any], kind: str, what: str) -> None:
    if not isinstance(fit, Mapping) or fit.get("kind") != kind or "params" not in fit:
        got = fit.get("kind") if isinstance(fit, Mapping) else type(fit).__name__
        raise DataError(f"{what} needs a profile fit of kind '{kind}' (a mapping with 'kind' and "
                        f"'params'); got {got!r}")


def collective_fit_axes(fit: Mapping[str, Any], measurements: Any = None, ax: Any = None,
                        title: str = "") -> Any:
    """Measured against fitted time of one collective fit, log-log, one colour per rank count.

    fit: a profile's fit (kind "collective"); measurements: a DataFrame with op, scope, ranks,
    nbytes and time_s (the profile's CSV), or None for the curve alone."""
    from perfmodel.specs.hardware import CollectiveFit
    from perfmodel.specs.profile import fitted_collective_time

    _check_fit_kind(fit, "collective", "collective_fit_axes")
    cf = CollectiveFit(op=fit["op"], scope=fit["scope"], algorithm=fit["algorithm"],
                       **fit["params"])
    rows = _fit_rows(measurements, fit)
    ax = _axes(ax, 5.0, 3.6)
    lo, hi = fit["size_range"]
    sizes = np.geomspace(max(lo, 1), max(hi, 2), 200)
    for i, ranks in enumerate(fit.get("ranks") or [2]):
        ax.loglog(sizes, fitted_collective_time(cf, fit["op"], sizes, ranks) * 1e6, "-",
                  color=f"C{i}", label=f"fit n={ranks}")
        if rows is not None and "ranks" in rows:
            pts = rows[(rows["ranks"] == ranks) & (rows["nbytes"] > 0)]
            if len(pts):
                ax.loglog(pts["nbytes"], pts["time_s"] * 1e6, "o", ms=3, color=f"C{i}",
                          alpha=0.6, label=f"measured n={ranks}")
    title = title or (f"{fit['op']} {fit['scope']} ({fit['algorithm']})\n"
                      f"median err {fit['median_rel_error']:.1%}")
    return _label(ax, title, "size [B] (nccl-tests convention)", "time [us]")


@lru_cache(maxsize=64)
def _gemm_time_function(params: tuple[tuple[str, float], ...], bytes_per_element: float,
                        peak: float, bandwidth: float, output_bytes: float | None = None) -> Any:
    """perfmodel.costs.gemm_efficiency.gemm_time_s of one fit as a numpy function of (m, n, k,
    batch): the fitted numbers go in before lambdify, so the terms they switch off vanish."""
    import sympy as sp

    from perfmodel.costs.gemm_efficiency import gemm_time_s

    m, n, k, batch = sp.symbols("m n k batch", positive=True)
    bw = sp.oo if math.isinf(bandwidth) else bandwidth
    try:
        expr = gemm_time_s(m, n, k, batch, bytes_per_element, peak, bw, **dict(params),
                           output_bytes_per_element=output_bytes)
    except TypeError as exc:
        raise DataError(f"a GEMM fit has a parameter perfmodel does not know ({exc})") from None
    return sp.lambdify((m, n, k, batch), expr, "numpy")


def fitted_gemm_time(fit: Mapping[str, Any], b: Any, m: Any, n: Any, k: Any) -> np.ndarray:
    """Time [s] of GEMMs of shape (b, m, n, k) under a profile's GEMM fit: the roofline of
    perfmodel.costs.gemm_efficiency with the fitted efficiency (the memory roofline only when
    the fit records a bandwidth)."""
    _check_fit_kind(fit, "gemm", "fitted_gemm_time")
    peak = fit.get("peak_flops_per_s")
    if not peak:
        raise DataError("a GEMM fit needs 'peak_flops_per_s' to give times")
    params = tuple(sorted((str(key), float(v)) for key, v in fit["params"].items()))
    out_bytes = fit.get("output_bytes_per_element")
    fn = _gemm_time_function(params, float(fit.get("bytes_per_element", 2.0)), float(peak),
                             float(fit.get("memory_bandwidth_bytes_per_s") or math.inf),
                             None if out_bytes is None else float(out_bytes))
    arrays = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (m, n, k, b)))
    return np.broadcast_to(np.asarray(fn(*arrays), dtype=float), arrays[0].shape)


def _label(ax: Any, title: str, xlabel: str, ylabel: str) -> Any:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return ax


def gemm_fit_axes(fit: Mapping[str, Any], measurements: Any = None, ax: Any = None,
                  title: str = "") -> Any:
    """Achieved FLOP/s against the FLOPs of each GEMM, log-log: the measured shapes (dots), the
    fit at the same shapes (crosses) and the fit along square shapes (line), with the peak."""
    _check_fit_kind(fit, "gemm", "gemm_fit_axes")
    ax = _axes(ax, 5.0, 3.6)
    rows = _fit_rows(measurements, fit)
    peak = float(fit["peak_flops_per_s"])
    if rows is not None and len(rows):
        b, m, n, k = (rows[c].to_numpy(float) for c in ("b", "m", "n", "k"))
        flops = 2 * b * m * n * k
        ax.loglog(flops, flops / rows["time_s"].to_numpy(float), "o", ms=3, alpha=0.6,
                  color="C0", label="measured")
        ax.loglog(flops, flops / fitted_gemm_time(fit, b, m, n, k), "x", ms=3, color="C1",
                  label="fit, same shapes")
    lo, hi = fit["size_range"]
    side = np.geomspace(max((lo / 2) ** (1 / 3), 1.0), max((hi / 2) ** (1 / 3), 2.0), 100)
    square = 2 * side**3
    ax.loglog(square, square / fitted_gemm_time(fit, 1, side, side, side), "-", color="C1",
              label="fit, square m = n = k")
    ax.axhline(peak, color="tab:red", ls="--", lw=1, label="peak")
    title = title or (f"GEMM {fit.get('device', '')} {fit.get('dtype', '')}\n"
                      f"median err {fit['median_rel_error']:.1%}")
    return _label(ax, title, "FLOPs per GEMM", "FLOP/s")


def bandwidth_fit_axes(fit: Mapping[str, Any], measurements: Any = None, ax: Any = None,
                       title: str = "") -> Any:
    """Measured against fitted time of a memory-bandwidth fit (T = alpha + bytes / bandwidth)."""
    _check_fit_kind(fit, "memory_bandwidth", "bandwidth_fit_axes")
    p = fit["params"]
    ax = _axes(ax, 5.0, 3.6)
    lo, hi = fit["size_range"]
    sizes = np.geomspace(max(lo, 1), max(hi, 2), 100)
    ax.loglog(sizes, (p["alpha_s"] + sizes / p["bandwidth_bytes_per_s"]) * 1e6, "-", color="C1",
              label="fit")
    rows = _fit_rows(measurements, fit)
    if rows is not None and len(rows):
        ax.loglog(rows["nbytes"], rows["time_s"] * 1e6, "o", ms=3, alpha=0.6, color="C0",
                  label="measured")
    title = title or f"memory {fit.get('kernel', '')}: {p['bandwidth_bytes_per_s'] / 1e9:.3g} GB/s"
    return _label(ax, title, "bytes moved", "time [us]")


_FIT_AXES = {"collective": collective_fit_axes, "gemm": gemm_fit_axes,
             "memory_bandwidth": bandwidth_fit_axes}


def read_measurements(profile: Any) -> Any:
    """The profile's measurements CSV as a DataFrame (None when it has none)."""
    import pandas as pd

    path = getattr(profile, "measurements", None)
    if path is None:
        return None
    if not Path(path).exists():  # named, not there: the measured points would drop silently
        raise DataError(f"{path}: the profile's measurements CSV is not there (written beside "
                        "the profile when it was made; moved?): the measured points cannot be "
                        "drawn")
    text = read_text_bounded(path, "measurements CSV", error=DataError, encoding="utf-8-sig")
    try:
        return pd.read_csv(io.StringIO(text), low_memory=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise DataError(f"{path}: measurements CSV cannot be read") from None


def calibration_figure(profile: Any, kinds: Iterable[str] = ("collective", "gemm",
                                                               "memory_bandwidth"),
                       measurements: Any = None, columns: int = 3) -> Any:
    """Every fit of a calibration profile (perfmodel.specs.profile.Profile), one panel each:
    measured against fitted, log-log. measurements: a DataFrame, or None to read the profile's."""
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in _FIT_AXES]
    if unknown:
        raise DataError(f"calibration_figure: unknown fit kind '{unknown[0]}' "
                        f"(known: {', '.join(_FIT_AXES)})")
    fits = {k: v for k, v in profile.fits.items() if v["kind"] in kinds}
    if not fits:
        raise DataError(f"{profile.path}: no {' or '.join(kinds)} fits to plot")
    data = read_measurements(profile) if measurements is None else measurements
    cols = max(1, min(columns, len(fits)))
    rows = -(-len(fits) // cols)
    fig = new_figure(5 * cols, 3.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (name, fit) in zip(axes, fits.items(), strict=False):
        _FIT_AXES[fit["kind"]](fit, _fit_rows(data, fit, name), ax,
                               title=f"{name}\nmedian err {fit['median_rel_error']:.1%}")
    for ax in axes[len(fits):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


# --- validation ---------------------------------------------------------------------------------


def validation_axes(report: Mapping[str, Any], ax: Any = None) -> Any:
    """Predicted and measured time per term of one validation report (and the whole step) [ms]."""
    if not isinstance(report, Mapping) or "terms" not in report:
        raise DataError("validation_axes needs a validation report (a mapping with 'terms', as "
                        "perfmodel validate writes)")
    names = [r["name"] for r in report["terms"]] + ["step"]
    pred = [(r.get("predicted_s") or 0.0) * 1e3 for r in report["terms"]]
    meas = [(r.get("measured_s") or 0.0) * 1e3 for r in report["terms"]]
    pred.append((report.get("predicted_step_time_s") or 0.0) * 1e3)
    meas.append((report.get("measured_step_time_s") or 0.0) * 1e3)
    ax = _axes(ax, 8, 4)
    xs = np.arange(len(names))
    ax.bar(xs - 0.2, pred, width=0.4, label="predicted")
    ax.bar(xs + 0.2, meas, width=0.4, label="measured")
    ax.set_xticks(xs, names, rotation=30)
    ax.set_ylabel("time per step [ms]")
    ax.set_title(f"{report.get('model', '')} {report.get('plan_label', '')}")
    ax.legend()
    return ax


def runs_frame(data: Any) -> Any:
    """Predicted and measured step times as a DataFrame (columns plan, predicted_step_time_s,
    measured_step_time_s, relative_error) from a history CSV (path), a DataFrame, or an iterable
    of validation reports (mappings or JSON paths). Runs that did not measure are dropped."""
    import json

    import pandas as pd

    cols = ["predicted_step_time_s", "measured_step_time_s"]
    if isinstance(data, (str, Path)):
        path = Path(data)
        text = read_text_bounded(path, "", error=DataError, encoding="utf-8-sig")
        try:
            data = pd.read_csv(io.StringIO(text))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
            raise DataError(f"{path}: not a readable history CSV") from None
    if not isinstance(data, pd.DataFrame):
        rows = []
        for item in data:
            if isinstance(item, (str, Path)):
                try:
                    item = json.loads(read_text_bounded(item, "validation report",
                                                        error=DataError))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{item}: not a readable validation report ({exc})") from None
            if not isinstance(item, Mapping):
                raise DataError(f"runs_frame: expected validation reports, got "
                                f"{type(item).__name__}")
            rows.append({"plan": item.get("plan_label", ""), "model": item.get("model", ""),
                         **{c: item.get(c) for c in cols}})
        data = pd.DataFrame(rows, columns=["plan", "model", *cols])
    missing = [c for c in cols if c not in data]
    if missing:
        raise DataError(f"runs: no column '{missing[0]}' (a history CSV of perfmodel validate has "
                        f"{', '.join(cols)})")
    out = data.copy()
    for c in cols:
        out[c] = pd.to_numeric(out[c], errors="coerce")
    out = out[np.isfinite(out[cols]).all(axis=1) & (out[cols] > 0).all(axis=1)]
    if "plan" not in out:
        out["plan"] = ""
    out["relative_error"] = out["measured_step_time_s"] / out["predicted_step_time_s"] - 1
    return out.reset_index(drop=True)


def predicted_vs_measured_axes(data: Any, ax: Any = None, band: float = 0.2,
                               label: bool = True) -> Any:
    """Measured against predicted step time of many runs, log-log, with the line y = x and a band
    of +-band around it; the title gives the median and worst |relative error|."""
    runs = runs_frame(data)
    if runs.empty:
        raise DataError("predicted_vs_measured_axes: no run with both a predicted and a measured "
                        "step time")
    pred, meas = runs["predicted_step_time_s"] * 1e3, runs["measured_step_time_s"] * 1e3
    ax = _axes(ax, 5.5, 5)
    ax.loglog(pred, meas, "o", color="tab:blue", label="runs")
    lo, hi = min(pred.min(), meas.min()) / 1.3, max(pred.max(), meas.max()) * 1.3
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, "-", color="black", lw=1, label="measured = predicted")
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="tab:gray", alpha=0.2,
                    label=f"within {band:.0%}")
    if label:
        for x, y, name in zip(pred, meas, runs["plan"], strict=True):
            ax.annotate(str(name), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    err = runs["relative_error"].abs()
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted step time [ms]")
    ax.set_ylabel("measured step time [ms]")
    ax.set_title(f"{len(runs)} runs: median |error| {err.median():.0%}, worst {err.max():.0%}")
    ax.legend(fontsize=8, loc="upper left")
    return ax


# --- timelines (perfmodel.timeline) -------------------------------------------------------------

TIMELINE_COLORS = {"forward": "tab:blue", "recompute": "tab:orange", "backward": "tab:green",
                   "weight": "tab:purple", "bubble": "#dddddd", "sync": "tab:red",
                   "step": "tab:olive"}


def timeline_axes(timeline: Any, ax: Any = None, end_s: float | None = None) -> Any:
    """A Gantt chart of one perfmodel.timeline.Timeline: one row per track of each process (top
    to bottom as listed), one bar per span [ms], coloured by its category (the pass, the bubble,
    the step's sync and optimizer); a dashed line at the predicted step time where given."""
    for attr in ("processes", "spans", "threads", "step_time_s"):
        if not hasattr(timeline, attr):
            raise TypeError(f"timeline_axes needs a perfmodel.timeline.Timeline; got "
                            f"{type(timeline).__name__} without {attr}")
    rows = [(proc, thread) for proc in timeline.processes for thread in timeline.threads(proc)]
    ax = _axes(ax, 11, 0.22 * len(rows) + 1.2)
    index = {row: i for i, row in enumerate(rows)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s in timeline.spans:
        bars.setdefault((index[(s.process, s.thread)], s.category), []).append(
            (s.start_s * 1e3, s.duration_s * 1e3))
    per_row: dict[int, int] = {}
    for (row, _), xs in bars.items():
        per_row[row] = per_row.get(row, 0) + len(xs)
    crowded = max(per_row.values(), default=0) > 150  # white edges would wash the colours out
    for (row, category), xs in sorted(bars.items()):
        ax.broken_barh(xs, (row - 0.4, 0.8), facecolors=TIMELINE_COLORS.get(category, "tab:gray"),
                       edgecolor="white", linewidth=0.0 if crowded else 0.3)
    ax.set_yticks(range(len(rows)), [f"{p}: {t}" for p, t in rows], fontsize=6)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    predicted = getattr(timeline, "predicted_step_time_s", None)
    if predicted:
        ax.axvline(predicted * 1e3, color="black", ls="--", lw=0.8, label="predicted step")
    ax.set_xlim(0, 1.02e3 * max(end_s or 0.0, timeline.step_time_s, predicted or 0.0))
    ax.set_xlabel("time in the step [ms]")
    ax.set_title(f"{timeline.title}: {timeline.step_time_s * 1e3:.4g} ms", fontsize=9)
    shown = sorted({c for _, c in bars}, key=lambda c: list(TIMELINE_COLORS).index(c)
                   if c in TIMELINE_COLORS else len(TIMELINE_COLORS))
    from matplotlib.patches import Patch

    handles = [Patch(color=TIMELINE_COLORS.get(c, "tab:gray"), label=c) for c in shown]
    if predicted:
        handles += ax.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def timeline_figure(timelines: Any) -> Any:
    """One Gantt chart per timeline, stacked on one time axis (predicted above measured)."""
    timelines = list(timelines)
    if not timelines:
        raise DataError("timeline_figure: no timeline to draw")
    end = max(max(t.step_time_s, t.predicted_step_time_s or 0.0) for t in timelines)
    heights = [0.22 * sum(len(t.threads(p)) for p in t.processes) + 1.2 for t in timelines]
    fig = new_figure(12, min(sum(heights), 60.0))
    axes = fig.subplots(len(timelines), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    for tl, ax in zip(timelines, axes, strict=True):
        timeline_axes(tl, ax, end_s=end)
    fig.tight_layout()
    return fig


# --- the CLI's --plot: render and write atomically ------------------------------------------------


def prediction_plot(prediction: Any, path: str | Path) -> Path:
    """`perfmodel predict --plot`."""
    return save_figure(prediction_figure(prediction), path)


def breakdown_plot(prediction: Any, path: str | Path) -> Path:
    return save_figure(_figure_of(breakdown_axes(prediction)), path)


def memory_plot(prediction: Any, path: str | Path) -> Path:
    return save_figure(_figure_of(memory_axes(prediction)), path)


def pareto_plot(result: Any, path: str | Path) -> Path:
    """`perfmodel recommend --plot`."""
    return save_figure(_figure_of(pareto_axes(result)), path)


def sweep_plot(frame: Any, varied: list[str], path: str | Path, title: str = "") -> Path:
    """`perfmodel sweep --plot`."""
    return save_figure(sweep_figure(frame, varied, title), path)


def calibration_plot(profile: Any, path: str | Path) -> Path:
    """`perfmodel calibrate report --plot`."""
    return save_figure(calibration_figure(profile), path)


def validation_plot(report: Mapping[str, Any], path: str | Path) -> Path:
    """`perfmodel validate --plot`."""
    return save_figure(_figure_of(validation_axes(report)), path)


def history_plot(data: Any, path: str | Path) -> Path:
    return save_figure(_figure_of(predicted_vs_measured_axes(data)), path)


def timeline_plot(timelines: Any, path: str | Path) -> Path:
    """`perfmodel predict --timeline`, `perfmodel validate --timeline`."""
    return save_figure(timeline_figure(timelines), path)
