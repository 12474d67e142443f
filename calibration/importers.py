"""`calibrate import-nccl-tests` and `import-gemm`: published measurements -> a profile."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fit import (
    UNRESOLVED_BANDWIDTH_RATIO,
    CollectiveModel,
    GemmModel,
    holdout_error,
    residual_summary,
)
from calibration.gemm_tables import (
    bytes_per_element,
    canonical_dtype,
    device_info,
    output_bytes_per_element,
    peak_for,
    read_gemm_table,
)
from calibration.nccl_tests import NcclTestsRun, parse_nccl_tests
from calibration.profile_io import provenance, write_profile
from perfmodel.costs.collectives import ALGORITHMS, Algorithm
from perfmodel.errors import DataError, SpecError
from perfmodel.specs.hardware import DTYPES, GemmEfficiency


@dataclass
class ImportResult:
    hardware: dict[str, Any]
    fits: dict[str, dict[str, Any]]
    measurements: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    per_source: list[dict[str, Any]] = field(default_factory=list)  # residuals per log/sweep
    nccl_versions: list[str] = field(default_factory=list)  # the logs' NCCL library versions


# NCCL's algorithms (NCCL_ALGO) -> the alpha-beta form that stands for them
_NCCL_ALGORITHMS = {
    "ring": "ring",
    "tree": "tree",
    "recursive": "recursive",  # not NCCL's: `--algorithm recursive`
    "nvls": "ring",
    "nvlstree": "tree",
    "collnet": "ring",
    "collnetdirect": "ring",
    "collnetchain": "tree",
    "pat": "ring",
}


def _pinned_algorithm(value: str, op: str) -> tuple[str | None, str | None]:
    """(the one algorithm NCCL_ALGO=value pins for op, or None where NCCL still chooses; why
    not, or None). NCCL_ALGO takes one algorithm (Ring), a list NCCL chooses from per size
    (Tree,Ring), an exclusion (^NVLS) and, since NCCL 2.24, a setting per collective
    (allreduce:tree;allgather:ring, where a part without a collective is the others')."""
    v = value.strip().strip("\"'").lower()
    name = op.replace("_", "")  # all_reduce -> allreduce, all_to_all -> alltoall
    if ":" in v or ";" in v:
        chosen: str | None = None
        default: str | None = None
        for part in filter(None, (p.strip() for p in v.split(";"))):
            if ":" not in part:
                default = part
                continue
            ops, these = part.split(":", 1)
            if name in {o.strip() for o in ops.split(",")}:
                chosen = these.strip()
        picked = chosen if chosen is not None else default
        if not picked:
            return None, f"NCCL_ALGO={value} sets no algorithm for {op}: NCCL's own choice"
        v = picked
    if v.startswith("^"):
        return None, (f"NCCL_ALGO={value} excludes {v[1:]} for {op}: NCCL's own choice among "
                      "the others")
    algos = [a.strip() for a in v.split(",") if a.strip()]
    if len(algos) > 1:
        return None, (f"NCCL_ALGO={value} lets NCCL choose among {', '.join(algos)} for {op} "
                      "(per size): no one algorithm")
    return (algos[0] if algos else None), None


def _algorithm(run: NcclTestsRun, override: str | None, notes: list[str]) -> str:
    """The alpha-beta form to fit: the user's choice, the log's NCCL_ALGO, else ring."""
    pinned = None
    if not override and run.nccl_algo:
        pinned, why = _pinned_algorithm(run.nccl_algo, run.op.value)
        if why:
            notes.append(f"{run.path.name}: {why}: fitted as ring (choose with --algorithm)")
    choice = (override or pinned or "ring").lower()
    form = _NCCL_ALGORITHMS.get(choice)
    if form is None:
        notes.append(
            f"{run.path.name}: NCCL_ALGO={run.nccl_algo} is not an algorithm perfmodel knows: "
            "fitted as ring (choose with --algorithm)"
        )
        form = "ring"
    if Algorithm(form) not in ALGORITHMS[run.op]:
        if override:
            raise DataError(f"--algorithm {override}: {run.op.value} has no {form} form "
                            f"(perfmodel's: {', '.join(a.value for a in ALGORITHMS[run.op])})")
        return Algorithm.RING.value
    return form


def import_nccl_tests(
    paths: Sequence[str | Path],
    *,
    algorithm: str | None = None,
    op: str | None = None,
    allow_truncated: bool = True,
) -> ImportResult:
    """Parse every log, fit one model per (op, scope) over all logs that share it; logs of one op
    and scope that ran different algorithms are refused (perfmodel holds one fit per op and scope).

    allow_truncated=False refuses a log whose test stops before its summary line (a run cut
    short: its largest sizes are missing, so the bandwidth fit would rest on the small ones) or
    whose last row is cut mid-line; True keeps the complete rows, with a note.
    Logs are text output (plain, mpirun --tag-output, srun --label, NCCL_DEBUG lines) or -J JSON.
    """
    if not paths:
        raise DataError("no nccl-tests log given")
    runs = [
        run for p in paths for run in parse_nccl_tests(p, op=op, allow_truncated=allow_truncated)
    ]
    alone = next((r for r in runs if r.ranks < 2), None)
    if alone is not None:
        where = f"{alone.path}" if alone.json else f"{alone.path}:{alone.line}"
        raise DataError(
            f"{where}: the {alone.op.value} test ran on 1 rank: no data crosses a link, "
            "nothing to fit"
        )
    cut = next((r for r in runs if not r.complete), None)
    if cut is not None and not allow_truncated:
        if cut.json:
            raise DataError(
                f"{cut.path}: the {cut.op.value} results end after {len(cut.records)} sizes, "
                "before 'average_bus_bandwidth': a truncated nccl-tests -J file "
                "(--allow-truncated keeps its results)"
            )
        raise DataError(
            f"{cut.path}:{cut.line}: the {cut.op.value} test ends after {len(cut.records)} sizes, "
            "before its '# Avg bus bandwidth' line: a truncated log (--allow-truncated keeps "
            "its rows)"
        )
    notes = [f"{r.path.name}: {n}" for r in runs for n in r.notes]
    runs = _distinct_runs(runs, notes)
    groups: dict[tuple[str, str, str], list[NcclTestsRun]] = {}
    for run in runs:
        key = (run.op.value, run.scope, _algorithm(run, algorithm, notes))
        groups.setdefault(key, []).append(run)
    by_op: dict[tuple[str, str], list[str]] = {}
    for op_name, scope, alg in groups:
        by_op.setdefault((op_name, scope), []).append(alg)
    for (op_name, scope), algs in by_op.items():
        if len(algs) > 1:  # a profile holds one fit per op and scope (perfmodel.specs.profile)
            raise DataError(
                f"the {op_name} {scope}-node logs ran {' and '.join(algs)} (NCCL_ALGO): perfmodel "
                "holds one fit per op and scope; import one algorithm's logs, or logs run "
                "without NCCL_ALGO (NCCL's own choice per size)"
            )
    fits, collectives, frames, per_source = {}, [], [], []
    for (op_name, scope, alg), members in groups.items():
        data = pd.concat(
            [
                r.records.assign(
                    ranks=r.ranks, nodes=r.nodes, source=r.path.name, op=op_name, scope=scope
                )
                for r in members
            ]
        )
        frames.append(data)
        sources = ", ".join(str(r.path) for r in members)
        if ((data["nbytes"] > 0) & (data["time_s"] > 0)).sum() < 2:
            why = "; ".join(f"{r.path.name}: {n}" for r in members for n in r.notes)
            raise DataError(f"{sources}: the {op_name} {scope}-node logs keep "
                            f"{len(data[data['nbytes'] > 0])} sizes above 0 B, 2 are needed to "
                            f"fit" + (f" ({why})" if why else ""))
        model = CollectiveModel(op_name, scope, alg).fit(data)
        name = f"collective/{op_name}/{scope}/{alg}"
        summary = model.summary()
        summary["sources"] = sorted({r.path.name for r in members})
        # the groups' layouts, (ranks, nodes): one fit over nodes prices a ring of the same
        # ranks laid out otherwise (16 x 1 for 2 x 8) only by extrapolation (collective_notes)
        summary["layouts"] = [list(x) for x in sorted({(r.ranks, r.nodes) for r in members})]
        fits[name] = summary
        if model.bandwidth_resolved_:
            collectives.append({k: v for k, v in model.to_fit().__dict__.items()})
        else:  # as `calibrate run` does: the bus term was not seen, its bandwidth is noise
            notes.append(
                f"{name}: fitted bus bandwidth {model.bus_bandwidth_bytes_per_s_:.3g} B/s is over "
                f"{UNRESOLVED_BANDWIDTH_RATIO:g}x the best measured, "
                f"{model.measured_bus_bandwidth_bytes_per_s_:.3g} B/s: the sizes (up to "
                f"{model.size_range_[1]:.0f} B) are latency-bound, or the times do not grow "
                "with size; not written (measure larger sizes: -e)"
            )
        for r in members:
            rec = r.records[r.records["nbytes"] > 0]
            res = residual_summary(model.predict(rec["nbytes"], r.ranks), rec["time_s"])
            notes += _irregular_rows(r, rec, model.predict(rec["nbytes"], r.ranks))
            per_source.append(
                {
                    "source": r.path.name,
                    "op": op_name,
                    "scope": scope,
                    "ranks": r.ranks,
                    "nodes": r.nodes,
                    "device": r.device,
                    "fit": name,
                    "hosts": list(r.hosts),
                    "n_points": len(rec),
                    **res,
                }
            )
    if not collectives:
        raise DataError(
            f"{', '.join(str(p) for p in paths)}: no fit resolved a bus bandwidth (each is over "
            f"{UNRESOLVED_BANDWIDTH_RATIO:g}x the best measured: latency-bound sizes, or times "
            "that do not grow with size): nothing to write"
        )
    devices = sorted({r.device for r in runs})
    hardware: dict[str, Any] = {"collectives": collectives}
    if len(devices) == 1:
        hardware["gpu_name"] = devices[0]
    # a node's GPUs, where logs over several nodes show them; a one-host log may have run on
    # some of its GPUs (4 of 8), which does not say how many the node has
    # uneven hosts (8 + 4 + 4): the node holds at least the most any host ran, which is what
    # predict takes to place a plan's ranks (ranks // hosts would be 5, a node no one has)
    per_node = sorted({max(r.ranks_per_host or (r.ranks // r.nodes,)) for r in runs
                       if r.nodes > 1})
    for r in runs:
        if r.nodes > 1 and len(set(r.ranks_per_host)) > 1:
            notes.append(f"{r.path.name}: its hosts ran {' + '.join(map(str, r.ranks_per_host))} "
                         f"ranks: gpus_per_node taken as the most, {max(r.ranks_per_host)}")
    if len(per_node) == 1:
        hardware["gpus_per_node"] = per_node[0]
    elif per_node:
        notes.append(f"the logs ran {', '.join(map(str, per_node))} GPUs per node: "
                     "gpus_per_node is not taken from them")
    elif not per_node:
        notes.append("the logs ran on one host each: gpus_per_node is not taken from them (the "
                     "base's, or --hardware's beside --profile)")
    return ImportResult(
        hardware=hardware,
        fits=fits,
        measurements=pd.concat(frames),
        notes=notes,
        per_source=per_source,
        nccl_versions=sorted({r.nccl_version for r in runs if r.nccl_version}),
    )


def _distinct_runs(runs: list[NcclTestsRun], notes: list[str]) -> list[NcclTestsRun]:
    """The runs, each test once: a log given twice (or a copy of it), whose section measured the
    same op on the same ranks, hosts, device, NCCL version and NCCL_ALGO with the same numbers at
    every size, is kept once, with a note (as a size repeated in one log is:
    nccl_tests._distinct_sizes); fitted twice, its points would count double."""
    same = ["nbytes", "time_s", "time_in_place_s", "algbw", "busbw"]
    seen: dict[tuple[Any, ...], NcclTestsRun] = {}
    kept = []
    for run in runs:
        key = (run.op, run.ranks, run.hosts, run.device, run.nccl_algo, run.nccl_version,
               tuple(map(tuple, run.records[same].astype(str).to_numpy())))
        first = seen.setdefault(key, run)
        if first is run:
            kept.append(run)
            continue
        where = f"{run.path}" if run.json else f"{run.path}:{run.line}"
        was = f"{first.path}" if first.json else f"{first.path}:{first.line}"
        notes.append(f"{where} repeats {was} (the same {run.op.value} test: same ranks, "
                     "hosts, sizes and numbers): kept once")
    return kept


# a row whose time is this many times the fit's at its size (or a this-th of it) is noted: the
# real logs of tests/data keep within 1.6x of their fits but for one row of the untuned A100 RoCE
# log (3.1x, its out-of-place time 6058 us against 3709 us in place); a busbw 10x off the others'
# (a slip of units, an edited row) is far outside
IRREGULAR_ROW_FACTOR = 3.0


def _irregular_rows(run: NcclTestsRun, rec: pd.DataFrame, predicted: Any) -> list[str]:
    """A note naming the rows of a log whose time is over IRREGULAR_ROW_FACTOR times off the
    fit (a robust fit: one such row hardly moves it); the rows are kept."""
    ratio = np.asarray(rec["time_s"], dtype=float) / np.asarray(predicted, dtype=float)
    off = np.flatnonzero((ratio > IRREGULAR_ROW_FACTOR) | (ratio < 1 / IRREGULAR_ROW_FACTOR))
    if not len(off):
        return []
    rows = []
    for i in off[:5]:
        row = rec.iloc[int(i)]
        line = row.get("line")
        at = f"line {int(line)}, " if line is not None and line == line else ""
        rows.append(f"{at}{row['nbytes']:.0f} B: {row['time_s'] * 1e6:.4g} us, "
                    f"{ratio[i]:.3g}x the fit's")
    more = f" and {len(off) - 5} more" if len(off) > 5 else ""
    return [f"{run.path.name}: {len(off)} row{'s' if len(off) > 1 else ''} over "
            f"{IRREGULAR_ROW_FACTOR:g}x off the fit ({'; '.join(rows)}{more}): kept; an "
            "irregular measurement, or an edited row?"]


def import_gemm(
    paths: Sequence[str | Path],
    *,
    device: str | None = None,
    folds: int = 5,
    peaks: dict[str, float] | None = None,
) -> ImportResult:
    """Fit the GEMM efficiency model per device and dtype; report k-fold hold-out error."""
    if not paths:
        raise DataError("no GEMM table given")
    table = pd.concat([read_gemm_table(p) for p in paths], ignore_index=True)
    if "source_commit" in table:  # earlier campaigns: keep each campaign apart
        table["campaign"] = table["source_commit"].fillna("").astype(str).str[:8]
    else:
        table["campaign"] = ""
    if table.empty:
        raise DataError(f"{', '.join(map(str, paths))}: no GEMM shapes (a header and no rows)")
    table = _distinct_shapes(table, notes := [])
    if device is not None:
        table = table[table["device"] == device]
        if table.empty:
            raise DataError(f"no rows for device '{device}' in the tables given")
    fits, gemm_eff, per_source = {}, {}, []
    primary: dict[str, list[str]] = {}  # perfmodel dtype -> the same-type fits that give it
    dev: Any  # a group's keys: pandas types them Hashable, they are the columns' values
    dtype: Any
    for (dev, dtype, campaign), rows in table.groupby(["device", "dtype", "campaign"], sort=True):
        if len(rows) < 12:
            notes.append(f"{dev} {dtype}: only {len(rows)} shapes, too few to fit (need 12)")
            continue
        canon = canonical_dtype(dtype)
        peak, peak_source = peak_for(dev, dtype, rows)
        if peaks and canon in peaks:
            peak, peak_source = peaks[canon], "given"
        bw = (device_info(dev) or {}).get("memory_bandwidth_bytes_per_s", math.inf)

        def make(peak: float = peak, bw: float = bw, dtype: str = dtype) -> GemmModel:
            return GemmModel(peak, bw, bytes_per_element(dtype), output_bytes_per_element(dtype))

        if folds > len(rows):
            raise DataError(f"--folds {folds} exceeds the {len(rows)} shapes of {dev} {dtype}: "
                            f"give at most {len(rows)}")
        model = make().fit(rows)
        notes += _far_from_fit(f"{dev} {dtype}", rows, model.predict(rows))
        try:
            hold = holdout_error(rows, make, folds=folds)
        except DataError as exc:
            raise DataError(f"--folds {folds}: each fold's fit leaves out 1/{folds} of the "
                            f"{len(rows)} shapes of {dev} {dtype} ({exc}); give more folds") \
                from None
        name = f"gemm/{dev}/{dtype}" + (f"/{campaign}" if campaign else "")
        summary = model.summary()
        summary.update(
            device=dev,
            dtype=dtype,
            perfmodel_dtype=canon,
            peak_source=peak_source,
            holdout_median_rel_error=hold["median_rel_error"],
            holdout_worst_rel_error=hold["worst_rel_error"],
            holdout_folds=folds,
            sources=sorted(set(rows["file"])),
        )
        fits[name] = summary
        per_source.append(
            {
                "source": name,
                "n_points": len(rows),
                **model.residuals_,
                "holdout_median_rel_error": hold["median_rel_error"],
            }
        )
        if model.peak_fraction_ > 1.0:
            notes.append(
                f"{name}: measured FLOP/s exceed the {peak_source} peak "
                f"(max_fraction {model.peak_fraction_:.2f}): suspect data or "
                "wrong peak; not written to the hardware section"
            )
            continue
        if not peak_source.endswith("datasheet") and peak_source != "given":
            notes.append(
                f"{name}: no datasheet peak known for {dev} {dtype}, so its fractions are of the "
                "best measured rate, not of the hardware's peak they would scale: not written "
                "to the hardware section (give --base, whose peaks they are then fitted against)"
            )
            continue
        if canon not in DTYPES:
            notes.append(f"{name}: dtype {canon} is not one a hardware spec takes "
                         f"({', '.join(DTYPES)}): fit reported, not written")
            continue
        params = {**model.params_, "half_dim": 0.0}
        try:  # what the profile's reader takes (a slip of units fits absurd values)
            GemmEfficiency(**params)
        except SpecError as exc:
            raise DataError(f"{name}: the fit is not a GEMM efficiency perfmodel can use ({exc}); "
                            "check the table's units (flops_per_s in FLOP/s, tflops in "
                            "TFLOP/s)") from None
        if model.residuals_["median_rel_error"] > GEMM_NOT_REPRODUCED:
            notes.append(
                f"{name}: the fit does not reproduce its own {dtype} shapes (median error "
                f"{model.residuals_['median_rel_error']:.0%}, over "
                f"{GEMM_NOT_REPRODUCED:.0%}): mixed units or mixed sweeps in the table? not "
                "written to the hardware section"
            )
            continue
        if _is_primary(dtype):
            primary.setdefault(canon, []).append(name)
        if canon not in gemm_eff or _is_primary(dtype):
            gemm_eff[canon] = params
    for canon, names in primary.items():
        if len(names) > 1:  # several campaigns (or sources) of one dtype: none is chosen
            del gemm_eff[canon]
            notes.append(f"{canon}: fitted by {', '.join(names)}; which one the hardware takes "
                         "is not chosen here: not written (import one campaign's table)")
    hardware: dict[str, Any] = {}
    if table["device"].nunique() == 1 and gemm_eff:
        hardware["gemm_efficiency"] = gemm_eff
    elif gemm_eff:
        notes.append(
            "tables of several devices: fits reported, hardware section left empty "
            "(choose one with --device)"
        )
    if not fits:
        raise DataError(f"nothing to fit: {'; '.join(notes)}")
    return ImportResult(
        hardware=hardware, fits=fits, measurements=table, notes=notes, per_source=per_source
    )


# a shape whose time is this many times the fit's (or a this-th of it) is noted: the sweeps of
# tests/data/gemm keep within 8.2x of their fits (gfx950's f32 rows, the farthest; the others
# within 3.2x), a rate in TFLOP/s among FLOP/s (10^12 off) or a corrupt row is far outside
FAR_FROM_FIT_FACTOR = 10.0


def _far_from_fit(what: str, rows: pd.DataFrame, predicted: Any) -> list[str]:
    """A note naming the rows (file:line) whose time is over FAR_FROM_FIT_FACTOR times off the
    fit (robust: such rows hardly move it); the rows are kept."""
    ratio = rows["time_s"].to_numpy(float) / np.asarray(predicted, dtype=float)
    far = np.flatnonzero((ratio > FAR_FROM_FIT_FACTOR) | (ratio < 1 / FAR_FROM_FIT_FACTOR))
    if not len(far):
        return []
    shown = "; ".join(
        f"{rows['file'].iloc[i]}:{rows['line'].iloc[i]} "
        f"{rows['flops_per_s'].iloc[i]:.4g} FLOP/s, {ratio[i]:.3g}x the fit's time"
        for i in far[:5])
    more = f" and {len(far) - 5} more" if len(far) > 5 else ""
    return [f"{what}: {len(far)} shape{'s' if len(far) > 1 else ''} over "
            f"{FAR_FROM_FIT_FACTOR:g}x off the fit ({shown}{more}): kept; a rate in other "
            "units (TFLOP/s among FLOP/s) or a corrupt row?"]


# a fit whose median error on its own shapes is above this does not reproduce them (the 10% that
# `import-nccl-tests` notes a log by): its efficiency is not written
GEMM_NOT_REPRODUCED = 0.10
_SHAPE = ["device", "dtype", "campaign", "file", "b", "m", "n", "k"]


def _distinct_shapes(table: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """One row per shape of a table: a shape repeated with the same rate is kept once (a note
    says so); with another rate, the table is refused (which one to fit is not known)."""
    key = [c for c in _SHAPE if c in table]
    dup = table[table.duplicated(subset=key, keep=False)]
    if dup.empty:
        return table
    rate = "flops_per_s" if "flops_per_s" in table else "time_s"
    for _, rows in dup.groupby(key, sort=False):
        if rows[rate].nunique() > 1:
            first = rows.iloc[0]
            shape = "x".join(f"{first[c]:g}" for c in ("b", "m", "n", "k") if c in rows)
            lines = ", ".join(str(v) for v in rows["line"]) if "line" in rows else ""
            raise DataError(
                f"{first['file']}: {first['dtype']} shape b x m x n x k = {shape} is measured "
                f"{len(rows)} times{f' (lines {lines})' if lines else ''} at different rates "
                f"({', '.join(f'{v:.4g}' for v in rows[rate])}): which to fit is not known; "
                "keep one row per shape"
            )
    kept = table.drop_duplicates(subset=key)
    repeated = len(table) - len(kept)
    shapes = "shape" if repeated == 1 else "shapes"
    notes.append(f"{repeated} repeated GEMM {shapes} (same shape, same rate) kept once")
    return kept.reset_index(drop=True)


def _is_primary(dtype: str) -> bool:
    """'bf16xbf16->bf16': same input and output type (not a mixed-precision variant)."""
    parts = dtype.lower().replace("->", "x").split("x")
    return len(set(parts)) == 1


def save(result: ImportResult, out: str | Path, *, base: str | None, **prov: Any) -> Path:
    hardware = dict(result.hardware)
    if base:
        hardware["base"] = base
    return write_profile(
        out,
        hardware=hardware,
        fits=result.fits,
        measurements=result.measurements,
        provenance=provenance(**prov),
        complete=True,
        notes=result.notes,
    )
