"""`calibrate report`: the fits and residuals as a table.

The plots (`--plot`) are perfmodel.plot.calibration_figure's: measured against fitted, log-log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from perfmodel.output import fmt_bytes
from perfmodel.render import console as terminal
from perfmodel.render import print_with_sources
from perfmodel.specs.profile import Profile


def _si(value: float, unit: str) -> str:
    """value with an SI prefix (FLOP, B/s); a size in bytes in binary units (KiB, MiB)."""
    if unit.startswith(" "):  # a count (" tokens"): no prefix
        return f"{value:.3g}{unit}"
    if unit == "B":
        return fmt_bytes(value)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _params(fit: Mapping[str, Any]) -> str:
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
    if fit["kind"] == "layer":  # fixed costs per micro-batch and the compute scale
        names = {"forward_overhead_s": "fwd +", "backward_overhead_s": "bwd +",
                 "fsdp_forward_overhead_s": "fwd +", "fsdp_backward_overhead_s": "bwd +",
                 "fsdp_reduce_overhead_s": "reduce +"}
        text = ", ".join(f"{names[k]}{v * 1e3:.3g} ms" for k, v in p.items() if k in names)
        if "compute_scale" in p:
            text += f", compute x{p['compute_scale']:.3g}"
        return text
    if fit["kind"] == "memory_bandwidth":
        return f"{_si(p['bandwidth_bytes_per_s'], 'B/s')}, alpha {p['alpha_s'] * 1e6:.3g} us"
    text = ", ".join(f"{k} {v:.3g}" for k, v in p.items() if k != "half_dim")
    if "holdout_median_rel_error" in fit:
        text += f"; hold-out median {fit['holdout_median_rel_error']:.1%}"
    return text


def print_report(profile: Profile, console: Console | None = None) -> None:
    """The fits as a table at the terminal's width (perfmodel.render: 100 columns in a pipe); the
    parameters wrap between words."""
    console = console or terminal()
    prov = profile.provenance
    console.print(
        f"[bold]{profile.path}[/bold]  device {prov.get('device')} x "
        f"{prov.get('device_count')}, {prov.get('nodes')} node(s), "
        f"{prov.get('date')}, complete: {profile.complete}"
    )
    rows = []
    for name, fit in profile.fits.items():
        unit = {"flops": "FLOP"}.get(fit.get("size_unit", ""), "B")
        if fit["kind"] == "layer":
            unit = " tokens"
        lo, hi = fit["size_range"]
        rows.append([name, f"{fit['median_rel_error']:.1%}", f"{fit['worst_rel_error']:.1%}",
                     f"{_si(lo, unit)} - {_si(hi, unit)}", str(fit["n_points"]), _params(fit)])
    headers = ("fit", "median err", "worst err", "sizes seen", "points", "parameters")
    columns = [(h, h in ("fit", "parameters"), [row[i] for row in rows])
               for i, h in enumerate(headers)]
    print_with_sources(console, "fits", columns, heading="parameters")
    for note in prov.get("notes", []):
        console.print(f"note: {note}")
