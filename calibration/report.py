"""`calibrate report`: the fits and residuals as a table, and measured-vs-fitted plots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from calibration.profile_io import atomic_write
from perfmodel.errors import DataError
from perfmodel.specs.hardware import CollectiveFit
from perfmodel.specs.profile import Profile, fitted_collective_time


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _params(fit: dict) -> str:
    p = fit["params"]
    if fit["kind"] == "collective":
        busbw = _si(p["bus_bandwidth_bytes_per_s"], "B/s")
        text = f"alpha {p['alpha_s'] * 1e6:.3g} us, busbw {busbw}"
        if p.get("breakpoint_bytes", 0) > 0:
            text = (
                f"below {_si(p['breakpoint_bytes'], 'B')}: alpha "
                f"{p['alpha_s_small'] * 1e6:.3g} us, busbw "
                f"{_si(p['bus_bandwidth_bytes_per_s_small'], 'B/s')}; from there: {text}"
            )
        return text
    if fit["kind"] == "memory_bandwidth":
        return f"{_si(p['bandwidth_bytes_per_s'], 'B/s')}, alpha {p['alpha_s'] * 1e6:.3g} us"
    text = ", ".join(f"{k} {v:.3g}" for k, v in p.items() if k != "half_dim")
    if "holdout_median_rel_error" in fit:
        text += f"; hold-out median {fit['holdout_median_rel_error']:.1%}"
    return text


def print_report(profile: Profile, console: Console | None = None) -> None:
    console = console or Console()
    console = Console(width=max(console.width, 150), file=console.file)
    prov = profile.provenance
    console.print(
        f"[bold]{profile.path}[/bold]  device {prov.get('device')} x "
        f"{prov.get('device_count')}, {prov.get('nodes')} node(s), "
        f"{prov.get('date')}, complete: {profile.complete}"
    )
    table = Table("fit", "parameters", "median err", "worst err", "sizes seen", "points")
    for name, fit in profile.fits.items():
        unit = "FLOP" if fit.get("size_unit") == "flops" else "B"
        lo, hi = fit["size_range"]
        table.add_row(
            name,
            _params(fit),
            f"{fit['median_rel_error']:.1%}",
            f"{fit['worst_rel_error']:.1%}",
            f"{_si(lo, unit)} - {_si(hi, unit)}",
            str(fit["n_points"]),
        )
    console.print(table)
    for note in prov.get("notes", []):
        console.print(f"note: {note}")


def plot_profile(profile: Profile, out: Path) -> Path:
    """Measured against fitted time per collective, log-log, one panel per fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits = {k: v for k, v in profile.fits.items() if v["kind"] == "collective"}
    if not fits:
        raise DataError(f"{profile.path}: no collective fits to plot")
    data = _measurements(profile)
    cols = min(3, len(fits))
    rows = -(-len(fits) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, fit) in zip(axes.flat, fits.items(), strict=False):
        cf = CollectiveFit(
            op=fit["op"], scope=fit["scope"], algorithm=fit["algorithm"], **fit["params"]
        )
        sub = None
        if data is not None and {"op", "scope", "ranks", "nbytes", "time_s"} <= set(data):
            sub = data[(data["op"] == fit["op"]) & (data["scope"] == fit["scope"])]
        for i, ranks in enumerate(fit.get("ranks", []) or [2]):
            lo, hi = fit["size_range"]
            sizes = np.geomspace(max(lo, 1), max(hi, 2), 200)
            ax.loglog(
                sizes,
                fitted_collective_time(cf, fit["op"], sizes, ranks) * 1e6,
                "-",
                color=f"C{i}",
                label=f"fit n={ranks}",
            )
            if sub is not None and not sub.empty:
                pts = sub[(sub["ranks"] == ranks) & (sub["nbytes"] > 0)]
                ax.loglog(
                    pts["nbytes"],
                    pts["time_s"] * 1e6,
                    "o",
                    ms=3,
                    color=f"C{i}",
                    alpha=0.6,
                    label=f"measured n={ranks}",
                )
        ax.set_title(f"{name}\nmedian err {fit['median_rel_error']:.1%}", fontsize=9)
        ax.set_xlabel("size [B]")
        ax.set_ylabel("time [us]")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(fits) :]:
        ax.axis("off")
    fig.tight_layout()
    atomic_write(out, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
    return out


def _measurements(profile: Profile) -> pd.DataFrame | None:
    if profile.measurements is None or not profile.measurements.exists():
        return None
    try:
        return pd.read_csv(profile.measurements, low_memory=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise DataError(f"{profile.measurements}: measurements CSV cannot be read") from None
