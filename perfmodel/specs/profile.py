"""Calibration profiles: reading, validating and applying them to a HardwareSpec (no torch).

A profile is one JSON file written by `perfmodel calibrate ...`:

    {"format": "perfmodel-profile", "version": 1, "complete": true, "missing_stages": [],
     "hardware": {<HardwareSpec fields to override; may hold "base": "<preset>">},
     "fits": {"<name>": {"kind": "collective" | "gemm" | "memory_bandwidth", "params": {...},
                         "median_rel_error": x, "worst_rel_error": x, "size_range": [lo, hi],
                         "n_points": n, ...}},
     "measurements": "<CSV file beside the profile>",
     "provenance": {"host", "device", "device_count", "nodes", "torch_version", "nccl_version",
                    "gloo", "date", "command", "git_revision"}}

"complete": false marks a calibration that was interrupted; "missing_stages" (optional; absent in
profiles written before it existed) names the stages it did not finish. One collective fit per op,
scope (in `fits` and in hardware.collectives; two algorithms of one op and scope included): a
duplicate is refused, never resolved to one of the two or mixed; so is a JSON object with a key
given twice.
`apply_profile` merges the profile's hardware fields over a preset's (profile wins); a profile of
another machine than the preset's (CPU ranks against a GPU, another GPU part, another node) is
refused (`check_machine`).
A layer cost whose compute_scale is below 1 (a fit of an older `calibrate run`, held at its then
lower bound 0.2: calibration.layers) is read as 1, with a note (`Profile.notes`, said on standard
error by `apply_profile`): the step model charges (s - 1) x the rooflines as what the framework
adds to a part's kernels (perfmodel.step.layer), which must not be a negative time.
`fitted_collective_time` is how a fitted collective (one or two alpha-beta regimes) is evaluated;
`two_regimes` says which regime holds at a size, for any group.
`is_extrapolation` tells whether a size lies outside the range a fit saw; `collective_notes` says
so, and where a group has another number of ranks than the fit measured.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sympy as sp

from perfmodel.costs.collectives import bus_factor, steps
from perfmodel.errors import SpecError
from perfmodel.files import read_text_bounded
from perfmodel.specs.hardware import (
    CollectiveFit,
    HardwareSpec,
    LinkSpec,
    hardware_from_dict,
    load_hardware_dict,
    merge_hardware,
)
from perfmodel.specs.loading import Bound, check_fields, number

FORMAT = "perfmodel-profile"
VERSION = 1
FIT_KINDS = ("collective", "gemm", "memory_bandwidth", "layer")
_TOP = ("format", "version", "complete", "missing_stages", "hardware", "fits", "measurements",
        "provenance")
_FIT_REQUIRED = ("kind", "params", "median_rel_error", "worst_rel_error", "size_range", "n_points")
_HARDWARE_FIELDS = [f.name for f in dataclasses.fields(HardwareSpec)] + ["base"]
_LINK_FIELDS = [f.name for f in dataclasses.fields(LinkSpec)]
# The range of every number of a fit's summary (its parameters are the hardware's: BOUNDS of
# perfmodel.specs.hardware check them when the profile is applied), stated once.
FIT_BOUNDS: dict[str, Bound] = {
    "median_rel_error": Bound(0, 1e6, "a relative error: 1e6 is a fit that explains nothing",
                              inclusive=True),
    "worst_rel_error": Bound(0, 1e6, "a relative error", inclusive=True),
    "size_range": Bound(0, 1e30, "sizes a fit saw: bytes, FLOPs, tokens or parameters",
                        inclusive=True),
    "n_points": Bound(1, 1e9, "measurements of one fit", inclusive=True, integer=True),
}
PROVENANCE_FIELDS = (
    "host",
    "device",
    "device_count",
    "nodes",
    "torch_version",
    "nccl_version",
    "gloo",
    "date",
    "command",
    "git_revision",
)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A validated calibration profile. `hardware` holds HardwareSpec field overrides."""

    path: Path
    complete: bool
    hardware: Mapping[str, Any]
    fits: Mapping[str, Mapping[str, Any]]
    measurements: Path | None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    missing_stages: tuple[str, ...] | None = None  # None: not recorded (an older profile)
    # what reading it changed (a layer cost's compute_scale below 1 read as 1), one line each
    notes: tuple[str, ...] = ()

    def collective_fits(self) -> list[Mapping[str, Any]]:
        return [f for f in self.fits.values() if f["kind"] == "collective"]


def profile_from_dict(data: Any, where: str, path: Path | None = None) -> Profile:
    """Validate a profile mapping; every problem names the field and what is allowed."""
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: a profile must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise SpecError(
            f"{where}: field 'format' must be '{FORMAT}', got {data.get('format')!r} "
            "(is this a perfmodel profile?)"
        )
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):  # True == 1 in Python, not in JSON
        raise SpecError(
            f"{where}: profile version {version!r} is not supported; this perfmodel "
            f"reads version {VERSION}: re-run `perfmodel calibrate` to rewrite it"
        )
    check_fields(data, _TOP, where)
    for key in ("complete", "hardware", "fits"):
        if key not in data:
            raise SpecError(f"{where}: missing required field '{key}'")
    if not isinstance(data["complete"], bool):
        raise SpecError(f"{where}: field 'complete' must be true or false")
    missing = data.get("missing_stages")
    if missing is not None and (
        not isinstance(missing, list) or not all(isinstance(s, str) and s for s in missing)
    ):
        raise SpecError(f"{where}: field 'missing_stages' must be a list of stage names")
    if missing and data["complete"]:
        raise SpecError(
            f"{where}: field 'missing_stages' names {', '.join(missing)} but 'complete' is true"
        )
    if not isinstance(data["hardware"], Mapping):
        raise SpecError(f"{where}: field 'hardware' must be an object of HardwareSpec fields")
    check_fields(data["hardware"], _HARDWARE_FIELDS, f"{where}: hardware")
    for link in ("intra_node", "inter_node"):
        if isinstance(data["hardware"].get(link), Mapping):
            check_fields(data["hardware"][link], _LINK_FIELDS, f"{where}: hardware.{link}")
    fits = data["fits"]
    if not isinstance(fits, Mapping):
        raise SpecError(f"{where}: field 'fits' must be an object of named fits")
    for name, fit in fits.items():
        _check_fit(fit, f"{where}: fits.{name}")
    _check_unique_collectives(fits, data["hardware"], where)
    provenance = data.get("provenance", {})
    if not isinstance(provenance, Mapping):
        raise SpecError(f"{where}: field 'provenance' must be an object")
    measurements = data.get("measurements")
    if measurements is not None and not isinstance(measurements, str):
        raise SpecError(f"{where}: field 'measurements' must be a file name (string) or null")
    base_dir = path.parent if path is not None else Path(".")
    hardware, notes = _layer_costs_at_least_roofline(data["hardware"], where)
    hardware = _optimizer_kernels(hardware, fits)
    return Profile(
        path=path or Path(where),
        complete=data["complete"],
        hardware=hardware,
        fits={k: dict(v) for k, v in fits.items()},
        measurements=base_dir / measurements if measurements else None,
        provenance=dict(provenance),
        missing_stages=None if missing is None else tuple(missing),
        notes=notes,
    )


def _layer_costs_at_least_roofline(
    hardware: Mapping[str, Any], where: str
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The hardware fields with every layer cost's compute_scale below 1 read as 1, and a note
    each. A scale s < 1 says the part ran faster than its kernels' rooflines (the profile's own
    GEMM, attention and memory fits) and collectives price it: no framework cost explains that,
    and the step model's (s - 1) x roofline would be a negative time. Entries that are not
    numbers in (0, 1) are left to the hardware's checks (apply_profile)."""
    out = dict(hardware)
    costs = out.get("layer_costs")
    if not isinstance(costs, (list, tuple)):
        return out, ()
    notes, entries = [], []
    for entry in costs:
        scale = entry.get("compute_scale") if isinstance(entry, Mapping) else None
        if isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < 1:
            notes.append(
                f"{where}: layer cost ({entry.get('part')}, {entry.get('style')}, tp "
                f"{entry.get('tp')}) has compute_scale {scale:.3g}, below the rooflines (a fit "
                "held at its lower bound, or timings the profile's fits over-price): read as 1 "
                "(the framework adds its fixed costs only); re-run `perfmodel calibrate run` to "
                "refit it"
            )
            entry = {**entry, "compute_scale": 1.0}
        entries.append(entry)
    out["layer_costs"] = entries
    return out, tuple(notes)


def _optimizer_kernels(hardware: dict[str, Any], fits: Mapping[str, Any]) -> dict[str, Any]:
    """The hardware fields with optimizer_kernels: as given; else, where the profile measured an
    optimizer efficiency, the AdamW kernels its optimizer stage stepped, which a profile written
    before the field (2026-12-04) names in its fit's name only: memory/adamw_fused (a GPU's,
    since 81c5a51), foreach otherwise (CPU ranks, and every calibrate run before it)."""
    if "optimizer_kernels" in hardware or not hardware.get("optimizer_bandwidth_efficiency"):
        return hardware
    return {**hardware, "optimizer_kernels": "fused" if "memory/adamw_fused" in fits
            else "foreach"}


def _check_unique_collectives(
    fits: Mapping[str, Any], hardware: Mapping[str, Any], where: str
) -> None:
    """One collective fit per (op, scope) among the fits and among hardware.collectives: the
    predictor reads one, so a second would be silently dropped, or (another algorithm's) mixed
    with the first."""
    named: dict[tuple[str, str], str] = {}
    for name, fit in fits.items():
        if fit["kind"] != "collective":
            continue
        key = (fit["op"], fit["scope"])
        if key in named:
            algs = f"{fits[named[key]]['algorithm']}, {fit['algorithm']}"
            raise SpecError(
                f"{where}: fits.{named[key]} and fits.{name} are both fits of {' '.join(key)} "
                f"({algs}): a profile holds one collective fit per op and scope"
            )
        named[key] = name
    entries = hardware.get("collectives")
    if not isinstance(entries, (list, tuple)):
        return  # its type is apply_profile's check
    seen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        key = (str(entry.get("op")), str(entry.get("scope")))
        if key in seen:
            raise SpecError(
                f"{where}: hardware.collectives[{seen[key]}] and [{i}] are both fits of "
                f"{' '.join(key)}: a profile holds one fit per op and scope"
            )
        seen[key] = i


def _check_fit(fit: Any, where: str) -> None:
    if not isinstance(fit, Mapping):
        raise SpecError(f"{where} must be an object")
    for key in _FIT_REQUIRED:
        if key not in fit:
            raise SpecError(f"{where}: missing required field '{key}'")
    if fit["kind"] not in FIT_KINDS:
        raise SpecError(f"{where}.kind must be one of {', '.join(FIT_KINDS)}, got {fit['kind']!r}")
    if not isinstance(fit["params"], Mapping):
        raise SpecError(f"{where}.params must be an object of numbers")
    for key, value in fit["params"].items():
        _finite(value, f"{where}.params.{key}")
    for key in ("median_rel_error", "worst_rel_error"):
        _finite(fit[key], f"{where}.{key}")
        FIT_BOUNDS[key].check(fit[key], f"{where}.{key}")
    rng = fit["size_range"]
    if (
        not isinstance(rng, (list, tuple))
        or len(rng) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rng)
        or rng[0] > rng[1]
    ):
        raise SpecError(f"{where}.size_range must be [smallest, largest] (numbers), got {rng!r}")
    for value in rng:
        FIT_BOUNDS["size_range"].check(value, f"{where}.size_range")
    if not isinstance(fit["n_points"], int) or isinstance(fit["n_points"], bool):
        raise SpecError(f"{where}.n_points must be a positive whole number")
    FIT_BOUNDS["n_points"].check(fit["n_points"], f"{where}.n_points")
    if fit["kind"] == "collective":
        for key in ("op", "scope", "algorithm"):
            if not isinstance(fit.get(key), str):
                raise SpecError(f"{where}: a collective fit needs a string field '{key}'")


def _finite(value: Any, where: str) -> None:
    """A number a float holds: not NaN, not infinite, not an integer past 1.8e308 (JSON reads
    any number of digits exactly; math.isfinite would raise OverflowError on it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # JSON: no "1.5"
        raise SpecError(f"{where} must be a finite number, got {value!r}")
    number(value, where, minimum=-math.inf, strict=False)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile JSON file (SpecError with file and field when it is wrong)."""
    path = Path(path)
    where = f"profile {path}"
    text = read_text_bounded(path, "profile", error=SpecError)
    try:
        data = json.loads(text, object_pairs_hook=functools.partial(_unique_keys, where))
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{where}: not valid JSON at line {exc.lineno}, column {exc.colno} "
            "(truncated or not a profile?)"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; deep nesting
        raise SpecError(f"{where}: not a profile perfmodel can read ({exc})") from None
    return profile_from_dict(data, where, path)


def _unique_keys(where: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a key given twice is refused (json.loads would keep the last one)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SpecError(f"{where}: key '{key}' is given twice in one object: keep one")
        out[key] = value
    return out


def incomplete_note(profile: Profile) -> str | None:
    """One line saying that a profile is incomplete and what it lacks, or None when complete."""
    if profile.complete:
        return None
    if profile.missing_stages is None:
        lacks = "which stages it lacks was not recorded"
    elif profile.missing_stages:
        lacks = f"missing stages: {', '.join(profile.missing_stages)}"
    else:
        lacks = "every stage finished, the run was stopped before its end"
    return (
        f"profile {profile.path} is incomplete (its calibration was interrupted; {lacks}): what it "
        "did not measure comes from the base preset or perfmodel's defaults"
    )


def hardware_to_mapping(hardware: HardwareSpec) -> dict[str, Any]:
    """The plain field mapping of a spec, as hardware_from_dict reads it."""
    data = dataclasses.asdict(hardware)
    data["collectives"] = list(data["collectives"])
    data["peak_flops_per_s"] = dict(data["peak_flops_per_s"])
    data["gemm_efficiency"] = {k: dict(v) for k, v in data["gemm_efficiency"].items()}
    return data


def gpu_models(name: str) -> set[str]:
    """The model numbers in a GPU's name (H100, MI300X, GB200, V100), to tell two GPUs apart
    however their names are written ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe": both H100). A
    CPU's name ("CPU AMD EPYC (2 cores)") has none."""
    return set(re.findall(r"\b[A-Z]{1,3}\d{2,4}[A-Z]?\b", name.upper()))


def gpu_board(name: str) -> str | None:
    """'PCIe' or 'SXM' where a GPU's name says it (nvidia-smi: 'NVIDIA H100 PCIe',
    'NVIDIA A100-SXM4-40GB'; 'NVIDIA H100 80GB HBM3' is the SXM5 board: the PCIe card has
    HBM2e), else None. One GPU on two boards is two machines: H100 SXM talks over NVLink at
    450 GB/s, H100 PCIe over PCIe at 64 GB/s, at another clock."""
    up = name.upper()
    if "PCIE" in up:
        return "PCIe"
    if "SXM" in up or "HBM3" in up:
        return "SXM"
    return None


def gpu_memory(name: str) -> str | None:
    """The memory size a GPU's name gives ('40GB' of 'NVIDIA A100-SXM4-40GB'), else None: the
    40 and 80 GB A100 differ in memory bandwidth as well (1.555 and 2.0 TB/s)."""
    sizes = re.findall(r"(\d+)\s*GB\b", name.upper())
    return f"{sizes[0]}GB" if len(sizes) == 1 else None


def device_kind(gpu_name: str | None, asynchronous: bool | None) -> str | None:
    """'GPU' or 'CPU' (ranks on host cores, whose host runs the work itself), or None where
    nothing says: asynchronous_device where given (calibrate run writes it from the device it
    ran on); else a name that calibrate run gives CPU ranks ('CPU <model> (N cores)',
    calibration.bench) or one with a GPU model number (a hardware file for a GPU that leaves
    asynchronous_device out: its default, false, says nothing)."""
    if asynchronous is not None:
        return "GPU" if asynchronous else "CPU"
    if gpu_name is None:
        return None
    if gpu_name.strip().upper().startswith("CPU"):
        return "CPU"
    return "GPU" if gpu_models(gpu_name) else None


def gpu_difference(theirs: str, ours: str) -> str | None:
    """How two GPU names name different parts (another model number, board or memory size),
    or None where they do not, or do not say (check_machine; calibration's import-nccl-tests
    --base)."""
    models_a, models_b = gpu_models(theirs), gpu_models(ours)
    if models_a and models_b and not models_a & models_b:
        return f"another GPU ({'/'.join(sorted(models_a))}, not {'/'.join(sorted(models_b))})"
    for what, read in (("board", gpu_board), ("memory size", gpu_memory)):
        a, b = read(theirs), read(ours)
        if a and b and a != b:
            return f"another {what} ({a}, not {b})"
    return None


def _gbps(link_bytes_per_s: float) -> str:
    return f"{link_bytes_per_s / 1e9:.4g} GB/s"


def check_machine(hardware: HardwareSpec, profile: Profile) -> str | None:
    """Refuse a profile measured on another machine than the hardware's (SpecError naming
    both): its fits would price that machine's kernels and links under this one's name, memory
    and peaks, mixed with the fields it did not measure. The profile's machine is what its
    fields say, else its `base` (the preset an import was told the logs or sweeps came from):
    another device kind (CPU ranks against a GPU: asynchronous_device, or calibrate run's CPU
    names), another GPU part (model number, board or memory size in the names: gpu_models,
    gpu_board, gpu_memory), or, where the base is another spec than the hardware, another link
    inside the node (intra_node bandwidth beyond 1%: NVLink against PCIe) is refused. Returns a
    note where neither the profile nor a base names its device, or its base cannot be read here
    (a file of the machine it was imported on): what is not compared is not checked. A profile
    applies to the machine it measured, or stands alone (no --hardware)."""
    fields = profile.hardware
    base_name = fields.get("base")
    base, unread = None, None
    if isinstance(base_name, str) and base_name != hardware.name:
        from perfmodel.specs.hardware import load_hardware

        try:
            base = load_hardware(base_name)
        except SpecError as exc:  # a file of the machine it was imported on: said, not needed
            unread = (f"profile {profile.path}: its base {base_name} cannot be read here "
                      f"({exc}): that it measured the node of hardware '{hardware.name}' is not "
                      "checked")
    gpu = fields.get("gpu_name")
    if gpu is not None and not isinstance(gpu, str):
        return None  # hardware_from_dict refuses it, naming the field
    asynchronous = fields.get("asynchronous_device")
    if not isinstance(asynchronous, bool):
        asynchronous = None  # absent; or not true or false, which hardware_from_dict refuses
    theirs_named = gpu if gpu is not None else base.gpu_name if base is not None else None
    theirs = device_kind(gpu, asynchronous) or (
        device_kind(base.gpu_name, base.asynchronous_device or None) if base is not None
        else None)
    unnamed = unread
    if theirs_named is None and (unread or not isinstance(base_name, str)):  # base: this one
        unnamed = (f"profile {profile.path} names no GPU (hardware.gpu_name): that it was "
                   f"measured on {hardware.gpu_name} ({hardware.name}) is not checked"
                   + (f"; its base {base_name} cannot be read here" if unread else ""))
    ours = device_kind(hardware.gpu_name, hardware.asynchronous_device or None)
    difference = None
    if theirs and ours and theirs != ours:
        what = {"CPU": "CPU ranks", "GPU": "a GPU"}
        difference = f"another kind of device ({what[theirs]}, not {what[ours]})"
    elif theirs_named is not None:
        difference = gpu_difference(theirs_named, hardware.gpu_name)
    if difference is None and base is not None:
        there, here = base.intra_node.bandwidth_bytes_per_s, \
            hardware.intra_node.bandwidth_bytes_per_s
        if abs(there - here) > 0.01 * max(there, here):
            difference = (f"another node (its base {base.name}: intra_node {_gbps(there)}, "
                          f"this {_gbps(here)})")
    if difference is None:
        return unnamed
    named = theirs_named or {"CPU": "CPU ranks", "GPU": "a GPU"}[theirs or "GPU"]
    raise SpecError(
        f"profile {profile.path} was measured on {named}, hardware "
        f"'{hardware.name}' is {hardware.gpu_name}: {difference}; a profile prices the machine "
        f"it measured: give a profile of {hardware.gpu_name}, or the profile without --hardware")


# the 16-bit tensor-core types one datasheet rates alike (H100, A100, B200, MI300X: bf16 = fp16):
# what a profile measures of one holds for the other
PAIRED_PEAKS = (("bf16", "fp16"), ("fp16", "bf16"))


def _paired_peaks(overrides: dict[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's peaks with the twin of each it measured where the base rates the two alike
    (PAIRED_PEAKS): a GPU's `calibrate run` measures bf16, and the preset's fp16 at its
    datasheet rate would otherwise outrun it and become the default dtype (the fastest 16-bit
    type) of a machine the profile says is slower."""
    peaks, rated = overrides.get("peak_flops_per_s"), base.get("peak_flops_per_s")
    if not isinstance(peaks, Mapping) or not isinstance(rated, Mapping):
        return overrides
    twins = {other: peaks[measured] for measured, other in PAIRED_PEAKS
             if measured in peaks and other not in peaks and measured in rated
             and other in rated and rated[measured] == rated[other]}
    return {**overrides, "peak_flops_per_s": {**peaks, **twins}} if twins else overrides


def apply_profile(hardware: HardwareSpec | None, profile: Profile) -> HardwareSpec:
    """A HardwareSpec with the profile's fields over the preset's.

    hardware=None: the profile stands alone (its own `base`, or every required field itself).
    A profile measured on another machine than `hardware` is refused (check_machine).
    A fitted collective of the profile replaces a preset's fit of the same op and scope.
    What reading the profile changed (Profile.notes) is said on standard error, once per use.
    """
    if hardware is not None:
        check_machine(hardware, profile)
    for line in profile.notes:
        print(f"note: {line}", file=sys.stderr)
    overrides = dict(profile.hardware)
    base = overrides.pop("base", None)
    where = f"profile {profile.path}: hardware"
    if hardware is not None:
        data = hardware_to_mapping(hardware)
    elif base is not None:
        if not isinstance(base, str):
            raise SpecError(f"{where}.base must be a preset name or a file path")
        data = load_hardware_dict(base)
        # its own GPU against its base's: a base of another part would price that part's
        # compute under this one's name (a hand-edited base, mi300x under an H100 log's
        # gpu_name, was taken: a probe's, 2026-12-07), as check_machine refuses with --hardware
        own, theirs = overrides.get("gpu_name"), data.get("gpu_name")
        if isinstance(own, str) and isinstance(theirs, str):
            difference = gpu_difference(own, theirs)
            if difference is not None:
                raise SpecError(f"{where}: gpu_name {own!r} and its base {base} ({theirs}) "
                                f"name different GPUs: {difference}; give the base of the GPU "
                                "it measured")
    else:
        data = {}
        required = (
            "gpus_per_node",
            "peak_flops_per_s",
            "memory_bytes",
            "memory_bandwidth_bytes_per_s",
            "intra_node",
            "inter_node",
            "gemm_efficiency",
        )
        missing = [key for key in required if key not in overrides]
        if missing:
            raise SpecError(
                f"{where}: missing required field '{missing[0]}' and no base preset: "
                "give a hardware preset too (--hardware), or import with --base"
            )
    overrides = _paired_peaks(overrides, data)
    new_fits = overrides.pop("collectives", None)
    if overrides.get("levels"):  # a profile's levels replace the base's fabric, as a file's do
        data = {k: v for k, v in data.items()
                if k not in ("gpus_per_node", "intra_node", "inter_node")}
    merged = merge_hardware(data, overrides)
    if new_fits is not None:
        if not isinstance(new_fits, (list, tuple)):
            raise SpecError(f"{where}.collectives must be a list of fitted entries")
        for i, fit in enumerate(new_fits):
            if not isinstance(fit, Mapping):
                raise SpecError(f"{where}.collectives[{i}] must be a mapping of fitted fields")
        keys = {(str(f.get("op")), str(f.get("scope"))) for f in new_fits}
        kept = [f for f in merged.get("collectives", [])
                if (str(f.get("op")), str(f.get("scope"))) not in keys]
        merged["collectives"] = kept + list(new_fits)
    note = f"calibrated: {profile.path}" + ("" if profile.complete else " (incomplete run)")
    merged["source"] = f"{merged.get('source', '')}; {note}".lstrip("; ")
    return hardware_from_dict(merged, where)


def two_regimes(small: Any, large: Any, nbytes: Any, breakpoint_bytes: Any, busbw: Any,
                busbw_small: Any) -> Any:
    """The time of a two-regime fit (calibration.fit.CollectiveModel._split) from its two
    regimes' times at a size [s]: sympy expressions (returns one) or numpy arrays.

    A protocol switch (the large messages' regime has the higher bandwidth, and the higher
    latency): NCCL runs the faster protocol at each size, the lower of the two times. Their lines
    meet at the breakpoint for the ranks the fit measured, and elsewhere for another group
    (steps over bus factor grow with n): taking the lower keeps the time continuous and never
    falling as the size grows at any rank count, where a switch at the measured breakpoint fell
    4.5x at 2 ranks and stepped up 1.9x at 64 for a fit measured at 16 (before 2026-12-07).
    A slowdown (no higher bandwidth, no lower latency: slower at every size, as when the bus
    bandwidth falls beyond some size): the small regime below the breakpoint, the large from it
    on, a step up at any rank count. A one-regime fit has both regimes equal and breakpoint 0.
    """
    if isinstance(small, sp.Basic) or isinstance(large, sp.Basic):
        return sp.Piecewise((sp.Min(small, large), busbw > busbw_small),
                            (small, nbytes < breakpoint_bytes), (large, True))
    switch = np.asarray(busbw) > np.asarray(busbw_small)
    return np.where(switch, np.minimum(small, large),
                    np.where(np.asarray(nbytes) < breakpoint_bytes, small, large))


def fitted_collective_time(fit: CollectiveFit, op: str, nbytes: Any, n: Any) -> Any:
    """Time of one collective from a fitted CollectiveFit [s].

    T = steps(op, n, algorithm) * alpha + bus_factor(op, n) * nbytes / busbw
    with (alpha, busbw) = (alpha_s_small, bus_bandwidth_bytes_per_s_small) for small messages and
    (alpha_s, bus_bandwidth_bytes_per_s) for large ones, where breakpoint_bytes > 0: which holds
    at a size is two_regimes'. nbytes, n: numbers or numpy arrays (returns numpy), or sympy
    expressions (returns a sympy Piecewise). n == 1 costs 0.
    """
    symbolic = isinstance(nbytes, sp.Basic) or isinstance(n, sp.Basic)
    n_sym = sp.Symbol("n", positive=True)

    def regime(alpha: float, busbw: float) -> sp.Expr:
        return (
            steps(op, n_sym, fit.algorithm) * alpha
            + bus_factor(op, n_sym) * sp.Symbol("nbytes") / busbw
        )

    main = regime(fit.alpha_s, fit.bus_bandwidth_bytes_per_s)
    small = (
        regime(fit.alpha_s_small, fit.bus_bandwidth_bytes_per_s_small)
        if fit.breakpoint_bytes > 0
        else None
    )
    if symbolic:
        subs = {n_sym: n, sp.Symbol("nbytes"): nbytes}
        expr = main.subs(subs)
        if small is not None:
            expr = two_regimes(small.subs(subs), expr, sp.sympify(nbytes), fit.breakpoint_bytes,
                               fit.bus_bandwidth_bytes_per_s, fit.bus_bandwidth_bytes_per_s_small)
        return sp.Piecewise((0, sp.Eq(sp.sympify(n), 1)), (expr, True))
    nb, nn = np.asarray(nbytes, dtype=float), np.asarray(n, dtype=float)
    out = _lambdified(main)(nb, nn)
    if small is not None:
        out = two_regimes(_lambdified(small)(nb, nn), out, nb, fit.breakpoint_bytes,
                          fit.bus_bandwidth_bytes_per_s, fit.bus_bandwidth_bytes_per_s_small)
    return np.where(nn <= 1, 0.0, out)


def fitted_collective_expr(
    op: str,
    algorithm: str,
    nbytes: sp.Expr,
    n: sp.Expr,
    alpha_s: sp.Expr,
    bus_bandwidth_bytes_per_s: sp.Expr,
    breakpoint_bytes: sp.Expr,
    alpha_s_small: sp.Expr,
    bus_bandwidth_bytes_per_s_small: sp.Expr,
) -> sp.Expr:
    """The same time as fitted_collective_time, with every fitted value a symbol [s].

    small = steps(op, n, alg) * alpha_s_small + bus_factor(op, n) * nbytes / busbw_small
    large = steps(op, n, alg) * alpha_s + bus_factor(op, n) * nbytes / busbw
    T = two_regimes(small, large, nbytes, bp, busbw, busbw_small)
    Bind the symbols with `fit_values(fit)` (a one-regime fit has both regimes equal and bp = 0:
    the large), so one compiled expression serves fits with one or two regimes. Lambdified to
    numpy the Piecewise becomes numpy.select: it evaluates arrays. (n = 1 is the caller's.)
    """
    st, bf = steps(op, n, algorithm), bus_factor(op, n)
    return two_regimes(st * alpha_s_small + bf * nbytes / bus_bandwidth_bytes_per_s_small,
                       st * alpha_s + bf * nbytes / bus_bandwidth_bytes_per_s, nbytes,
                       breakpoint_bytes, bus_bandwidth_bytes_per_s,
                       bus_bandwidth_bytes_per_s_small)


def fit_values(fit: CollectiveFit) -> dict[str, float]:
    """The values of fitted_collective_expr's parameters for one fit."""
    two = fit.breakpoint_bytes > 0
    return {
        "alpha_s": fit.alpha_s,
        "bus_bandwidth_bytes_per_s": fit.bus_bandwidth_bytes_per_s,
        "breakpoint_bytes": fit.breakpoint_bytes if two else 0.0,
        "alpha_s_small": fit.alpha_s_small if two else fit.alpha_s,
        "bus_bandwidth_bytes_per_s_small": (
            fit.bus_bandwidth_bytes_per_s_small if two else fit.bus_bandwidth_bytes_per_s
        ),
    }


_LAMBDA_CACHE: dict[sp.Expr, Any] = {}


def _lambdified(expr: sp.Expr) -> Any:
    if expr not in _LAMBDA_CACHE:
        _LAMBDA_CACHE[expr] = sp.lambdify(
            (sp.Symbol("nbytes"), sp.Symbol("n", positive=True)), expr, "numpy"
        )
    return _LAMBDA_CACHE[expr]


def gemm_fit_in_use(profile: Profile, gemm: Any) -> Mapping[str, Any] | None:
    """The profile's GEMM fit whose parameters are `gemm` (a GemmEfficiency of the hardware the
    profile made), or None when the hardware's GEMM model did not come from one of its fits."""
    wanted = dataclasses.asdict(gemm)
    for fit in profile.fits.values():
        if fit["kind"] != "gemm":
            continue
        params = {**wanted, **{k: float(v) for k, v in fit["params"].items()}}
        if params == wanted:
            return fit
    return None


def is_extrapolation(profile: Profile, op: str, nbytes: Any, scope: str | None = None) -> Any:
    """True where nbytes lies outside the sizes the profile's fit of `op` (and scope) saw.

    No fit of that op at all counts as extrapolation. Works on numbers and numpy arrays.
    """
    nb = np.asarray(nbytes, dtype=float)
    fits = [
        f
        for f in profile.collective_fits()
        if f["op"] == op and (scope is None or f["scope"] == scope)
    ]
    if not fits:
        return np.ones_like(nb, dtype=bool) if nb.ndim else True
    inside = np.zeros_like(nb, dtype=bool)
    for fit in fits:
        lo, hi = fit["size_range"]
        inside |= (nb >= lo) & (nb <= hi)
    out = ~inside
    return out if out.ndim else bool(out)


def measured_ranks(profile: Profile, op: str, scope: str) -> tuple[int, ...]:
    """The group sizes the profile's fit of op and scope measured (its "ranks"), or () where it
    has no such fit or records none (a hand-written profile)."""
    ranks = _fit_field(profile, op, scope, "ranks")
    if isinstance(ranks, list) and all(
            isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return tuple(sorted(set(ranks)))
    return ()


def measured_layouts(profile: Profile, op: str, scope: str) -> tuple[tuple[int, int], ...]:
    """The (ranks, nodes) of the groups the profile's fit of op and scope measured (its
    "layouts", written by calibrate import-nccl-tests since 2026-12-07), or () where it records
    none."""
    layouts = _fit_field(profile, op, scope, "layouts")
    if isinstance(layouts, list) and all(
            isinstance(x, list) and len(x) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in x) for x in layouts):
        return tuple(sorted((x[0], x[1]) for x in layouts))
    return ()


def _fit_field(profile: Profile, op: str, scope: str, key: str) -> Any:
    """A field of the profile's fit of op and scope (one at most: load_profile refuses a
    second), or None."""
    for fit in profile.collective_fits():
        if fit["op"] == op and fit["scope"] == scope:
            return fit.get(key)
    return None


def collective_notes(profile: Profile, what: str, op: str, nbytes: float, ranks: int,
                     scope: str, nodes: int | None = None) -> list[str]:
    """What a command says of one collective (`what` names it) of a group of `ranks` priced
    with the profile (scope: intra or inter, the fit's): the profile has no fit of its op and
    scope (the hardware's link model prices it), or its size lies outside the sizes the fit
    saw, or the group has another number of ranks than the fit measured, or (nodes given, the
    fit's layouts recorded) the same ranks over another number of nodes (a ring of 16 ranks on
    16 nodes crosses the network at every step, on 2 nodes of 8 at two). send_recv is a pair
    whatever the group: its rank count is not compared."""
    if (op, scope) not in {(f["op"], f["scope"]) for f in profile.collective_fits()}:
        return [f"{what}: the profile has no {scope}-node fit of {op}; priced by the hardware's "
                "link model"]
    notes = []
    if is_extrapolation(profile, op, nbytes, scope):
        notes.append(f"{what} is outside the sizes the profile measured: extrapolated")
    measured = measured_ranks(profile, op, scope)
    if op != "send_recv" and ranks > 1 and measured and ranks not in measured:
        counts = ", ".join(str(r) for r in measured)
        notes.append(f"{what} over {ranks} ranks: the profile's fit measured {counts} ranks: "
                     "extrapolated")
    elif op != "send_recv" and ranks > 1 and nodes is not None:
        layouts = measured_layouts(profile, op, scope)
        if layouts and (ranks, nodes) not in layouts:
            seen = ", ".join(f"{r} ranks on {n} node{'s' if n > 1 else ''}"
                             for r, n in layouts if r == ranks)
            notes.append(f"{what} over {ranks} ranks on {nodes} node{'s' if nodes > 1 else ''}:"
                         f" the profile's fit measured {seen}: extrapolated")
    return notes


__all__ = [
    "FORMAT",
    "gemm_fit_in_use",
    "VERSION",
    "Profile",
    "apply_profile",
    "check_machine",
    "device_kind",
    "gpu_board",
    "gpu_memory",
    "collective_notes",
    "fit_values",
    "fitted_collective_expr",
    "fitted_collective_time",
    "two_regimes",
    "gpu_models",
    "hardware_to_mapping",
    "incomplete_note",
    "is_extrapolation",
    "load_profile",
    "measured_layouts",
    "measured_ranks",
    "profile_from_dict",
]
