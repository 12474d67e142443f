"""Reading published GEMM sweeps (CSV: shape, dtype, achieved FLOP/s) into one table of records.

Formats read (column names decide):
- XLA matmul performance tables: device_key, b, m, n, k, dtype, flops_per_s [, source_commit]
- DeepGEMM README tables: table, num_groups, m_or_m_per_group, n, k, tflops (dense and grouped)
- a generic CSV: m, n, k, dtype, flops_per_s (or tflops, or time_s) [, b] [, device]
Records: device, dtype (as in the file), b, m, n, k, flops_per_s, time_s, file, line.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.errors import DataError
from perfmodel.files import read_text_bounded

# Datasheet dense peaks [FLOP/s] and memory bandwidth [B/s] of the GPUs in the published sweeps,
# keyed by the device names the tables use. Only the scale of max_fraction depends on them.
# "gpus": the model numbers of the GPUs the device name covers (an architecture: sm_90 is H100,
# H200, H800 and GH200), what a --base's gpu_name must name; "preset": the hardware preset of the
# GPU whose peaks these are, the spec predict scales a fit by where no --base is given.
DEVICES: dict[str, dict[str, Any]] = {
    # NVIDIA H100 SXM5 datasheet (2023): bf16/fp16 989.4 TF, TF32 494.7 TF, FP8 1978.9 TF, 3.35 TB/s
    "sm_90": {
        "gpu": "H100",
        "gpus": ("H100", "H200", "H800", "H20", "GH200"),
        "preset": "dgx-h100",
        "bf16": 989.4e12,
        "fp16": 989.4e12,
        "tf32": 494.7e12,
        "fp8": 1978.9e12,
        "memory_bandwidth_bytes_per_s": 3.35e12,
    },
    # H800 SXM5: the H100 SXM compute (DeepGEMM README; NVIDIA H800 product brief)
    "H800": {
        "gpu": "H800",
        "gpus": ("H800",),
        "preset": None,
        "bf16": 989.4e12,
        "fp16": 989.4e12,
        "tf32": 494.7e12,
        "fp8": 1978.9e12,
        "memory_bandwidth_bytes_per_s": 3.35e12,
    },
    # NVIDIA HGX B200 datasheet (2024), per GPU (8 GPUs' figures / 8), dense = half the sparse
    # figures: bf16 2.25 PF, TF32 1.125 PF (18 PF sparse / 8 / 2), FP8 4.5 PF, 8 TB/s HBM3e
    "sm_100": {
        "gpu": "B200",
        "gpus": ("B200", "B100", "GB200"),
        "preset": "dgx-b200",
        "bf16": 2.25e15,
        "fp16": 2.25e15,
        "tf32": 1.125e15,
        "fp8": 4.5e15,
        "memory_bandwidth_bytes_per_s": 8.0e12,
    },
    # AMD Instinct MI300X datasheet (2023): bf16 1307.4 TF, TF32 653.7 TF, FP8 2614.9 TF, 5.3 TB/s
    "gfx942": {
        "gpu": "MI300",
        "gpus": ("MI300X", "MI300A", "MI325X"),
        "preset": "mi300x",
        "bf16": 1307.4e12,
        "fp16": 1307.4e12,
        "tf32": 653.7e12,
        "fp8": 2614.9e12,
        "memory_bandwidth_bytes_per_s": 5.3e12,
    },
    # AMD Instinct MI355X datasheet (2025): bf16/fp16 2.5 PF, FP8 5.0 PF dense, 8 TB/s. The gfx950
    # f32 rows ran in a bf16-class precision (SOURCES.md), so they are scaled by the bf16 peak; the
    # mi355x preset has no TF32 and prices a tf32 plan at its fp32 rate, so import-gemm reports
    # that fit and does not write it (calibration.cli: a fit's peak must be the one predict scales).
    "gfx950": {
        "gpu": "MI350",
        "gpus": ("MI350X", "MI355X"),
        "preset": "mi355x",
        "bf16": 2516.6e12,
        "fp16": 2516.6e12,
        "tf32": 2516.6e12,
        "fp8": 5033.2e12,
        "memory_bandwidth_bytes_per_s": 8.0e12,
    },
}
_ALIASES = {"sm_100_B200": "sm_100"}


def canonical_dtype(dtype: str) -> str:
    """perfmodel dtype of a table's dtype string, by its first operand.

    f32 on tensor-core GPUs runs the TF32 path by default (XLA, cuBLAS), hence 'tf32'.
    """
    first = dtype.lower().split("x")[0].split("->")[0]
    if first.startswith(("f8", "fp8", "float8", "e4m3", "e5m2")):
        return "fp8"
    if first.startswith("bf16") or first == "bfloat16":
        return "bf16"
    if first in ("f16", "fp16", "float16", "half"):
        return "fp16"
    if first in ("f32", "fp32", "float32", "float", "tf32"):
        return "tf32"
    return first


def bytes_per_element(dtype: str) -> float:
    return {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "tf32": 4.0}.get(canonical_dtype(dtype), 2.0)


def output_bytes_per_element(dtype: str) -> float:
    """Bytes of one output element: the type after '->' (bf16xbf16->f32 writes 4), else the
    input's."""
    if "->" not in dtype:
        return bytes_per_element(dtype)
    return bytes_per_element(dtype.split("->", 1)[1])


def device_info(device: str) -> dict | None:
    return DEVICES.get(_ALIASES.get(device, device))


def device_gpus(device: str) -> tuple[str, ...]:
    """Model numbers of the GPUs a table's device name covers (sm_90: H100, H200, ...); empty
    where the device is not one perfmodel knows."""
    return tuple((device_info(device) or {}).get("gpus", ()))


def device_preset(device: str) -> str | None:
    """The hardware preset whose peaks are the device's datasheet peaks, if one is shipped."""
    return (device_info(device) or {}).get("preset")


# 1e18 FLOP/s is a hundred of today's largest GPUs: a rate above it is a slip of units
MAX_FLOPS = 1e18
_DIMS = "a whole number from 1 to 1e9"
# a table's time_s and its rate (2 b m n k / time_s) may differ by this much (rounding, a rate
# printed to 3 or 4 digits), no more: beyond it the two columns are not one measurement
TIME_RATE_TOLERANCE = 0.05


def read_gemm_table(path: str | Path) -> pd.DataFrame:
    """Records of one GEMM sweep file; DataError naming file, line and column when malformed."""
    path = Path(path)
    text = read_text_bounded(path, "", error=DataError, encoding="utf-8-sig")  # at most 16 MiB
    try:
        df = pd.read_csv(io.StringIO(text), comment=None, skipinitialspace=True)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a GEMM table") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: empty file, not a GEMM table") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{path}: not a CSV table ({str(exc).splitlines()[0]})") from None
    cols = set(df.columns)
    time_col: pd.Series | None = None
    time_name = "time_s"
    if {"m_or_m_per_group", "n", "k", "tflops"} <= cols:  # DeepGEMM
        # a table without num_groups: one group (pd.to_numeric(None) is a scalar NaN)
        groups = (_column(df["num_groups"], path, "num_groups", _DIMS).fillna(1)
                  if "num_groups" in cols else 1)
        out = pd.DataFrame(
            {
                "device": "H800",
                "dtype": "fp8e4m3-blockscaled",
                "b": groups,
                "m": df["m_or_m_per_group"],
                "n": df["n"],
                "k": df["k"],
            }
        )
        out["dtype"] = out["dtype"] + np.where(df.get("table", "dense") == "dense", "", "-grouped")
        if "source_commit" in df:
            out["source_commit"] = df["source_commit"]
        rate: tuple[str, pd.Series, float] | None = ("tflops", df["tflops"], 1e12)
        dims = {"b": "num_groups", "m": "m_or_m_per_group", "n": "n", "k": "k"}
    elif {"m", "n", "k", "dtype"} <= {c.lower() for c in cols}:
        low = df.rename(columns={c: c.lower() for c in df.columns})
        named = {c.lower(): str(c) for c in df.columns}  # the user's spelling, for messages
        out = pd.DataFrame(
            {
                "device": low.get("device_key", low.get("device", "unknown")),
                "dtype": low["dtype"].astype(str),
                "b": low["b"] if "b" in low else 1,
                "m": low["m"],
                "n": low["n"],
                "k": low["k"],
            }
        )
        if "flops_per_s" in low:
            rate = (named["flops_per_s"], low["flops_per_s"], 1.0)
        elif "tflops" in low:
            rate = (named["tflops"], low["tflops"], 1e12)
        elif "time_s" in low:
            rate = None
        else:
            raise DataError(
                f"{path}: a GEMM table needs a flops_per_s, tflops or time_s column; "
                f"it has {', '.join(map(str, df.columns))}"
            )
        if "time_s" in low:
            time_col, time_name = low["time_s"], named["time_s"]
        if "source_commit" in low:
            out["source_commit"] = low["source_commit"]
        dims = {c: named.get(c, c) for c in ("b", "m", "n", "k")}
    else:
        raise DataError(
            f"{path}: not a GEMM sweep: need columns m, n, k, dtype and flops_per_s "
            f"(or tflops/time_s) per shape; it has {', '.join(map(str, df.columns))}"
            " (utilization-only or best-shape-only tables cannot be fitted)"
        )
    out["file"] = path.name
    out["line"] = np.arange(len(out)) + 2
    for col in ("b", "m", "n", "k"):
        values = _column(out[col], path, dims[col], _DIMS)
        # a GEMM's sizes are whole elements; over 1e9 a slip of units or a corrupt row
        bad = ~np.isfinite(values) | (values < 1) | (values > 1e9) | (values != np.floor(values))
        _refuse_first(bad, path, f"column '{dims[col]}' must be {_DIMS}", out[col])
        out[col] = values.astype(float)
    work = 2.0 * out["b"] * out["m"] * out["n"] * out["k"]  # FLOPs of each shape
    times = None
    if time_col is not None:
        times = _column(time_col, path, time_name, "a positive number of seconds")
        bad = ~np.isfinite(times) | (times <= 0) | (work / times.where(times > 0, 1.0) > MAX_FLOPS)
        _refuse_first(bad, path, f"column '{time_name}' must be a positive number of seconds, "
                      "2 b m n k / time_s at most 1e18 FLOP/s", time_col)
    if rate is not None:
        name, cells, scale = rate
        unit = "FLOP/s" if scale == 1.0 else "TFLOP/s"
        most = f"1e{round(math.log10(MAX_FLOPS / scale))} {unit}"  # 1e18 FLOP/s, 1e6 TFLOP/s
        values = _column(cells, path, name, f"a positive number up to {most}")
        over = (values * scale > MAX_FLOPS).to_numpy()
        bad = ~np.isfinite(values) | (values <= 0) | over
        first = np.flatnonzero(bad.to_numpy())
        # a TFLOP/s column over 1e6 holds FLOP/s: say so (its name is the user's)
        hint = ("; FLOP/s in a TFLOP/s column? (name it flops_per_s)"
                if scale != 1.0 and len(first) and over[first[0]] else "")
        _refuse_first(bad, path, f"column '{name}' must be a positive number up to {most}",
                      cells, hint)
        out["flops_per_s"] = values * scale
        if times is not None:  # two measurements of each shape: they must be one
            _check_time_and_rate(out, times, work, path, name)
    elif times is not None:
        out["flops_per_s"] = work / times
    out["device"] = out["device"].astype(str).map(lambda d: _ALIASES.get(d, d))
    out["time_s"] = work / out["flops_per_s"]
    return out.reset_index(drop=True)


def _column(cells: pd.Series, path: Path, column: str, allowed: str) -> pd.Series:
    """A column's cells as floats, NaN where a cell is not a number; DataError naming the file,
    line and column for an integer past what a float holds (the CSV reader reads 10^400 as an
    exact integer, which pd.to_numeric and float() refuse with an OverflowError)."""
    try:
        return pd.to_numeric(cells, errors="coerce").astype(float)
    except OverflowError:
        pass
    values = []
    for i, cell in enumerate(cells):
        try:
            values.append(float(cell))
        except OverflowError:
            digits = int(abs(int(cell)).bit_length() * 0.30103) + 1
            raise DataError(f"{path}:{i + 2}: column '{column}' holds an integer of about "
                            f"{digits} digits, past what a float holds: it must be {allowed}") \
                from None
        except (TypeError, ValueError):
            values.append(math.nan)
    return pd.Series(values, index=cells.index, dtype=float)


def _refuse_first(bad: pd.Series, path: Path, message: str, cells: pd.Series,
                  hint: str = "") -> None:
    """DataError naming the line of the first bad row and its cell as written."""
    flags = np.asarray(bad, dtype=bool)
    if flags.any():
        i = int(np.flatnonzero(flags)[0])
        raise DataError(f"{path}:{i + 2}: {message}, got '{cells.iloc[i]}'{hint}")


def _check_time_and_rate(out: pd.DataFrame, times: pd.Series, work: pd.Series, path: Path,
                         name: str) -> None:
    """A table with both time_s and a rate column: each row's 2 b m n k / time_s must be its rate
    within TIME_RATE_TOLERANCE; DataError naming the first row where it is not (which of the two
    is the measurement is not known)."""
    ratio = (work / times) / out["flops_per_s"]
    off = np.flatnonzero(((ratio - 1).abs() > TIME_RATE_TOLERANCE).to_numpy())
    if len(off):
        i = int(off[0])
        from_time, given = (work / times).iloc[i], out["flops_per_s"].iloc[i]
        raise DataError(
            f"{path}:{i + 2}: time_s {times.iloc[i]:g} s gives 2 b m n k / time_s = "
            f"{from_time:.4g} FLOP/s, {ratio.iloc[i]:.3g}x the {given:.4g} FLOP/s of column "
            f"'{name}' (over {TIME_RATE_TOLERANCE:.0%} apart; {len(off)} "
            f"row{'s' if len(off) != 1 else ''} so): which is the "
            "measurement is not known; give one of the two columns"
        )


def peak_for(device: str, dtype: str, records: pd.DataFrame | None = None) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for a device and table dtype."""
    info = device_info(device)
    canon = canonical_dtype(dtype)
    if info is not None and canon in info:
        return float(info[canon]), f"{info['gpu']} datasheet"
    if records is None or records.empty:
        return math.nan, "unknown"
    return float(records["flops_per_s"].max()), "best measured (no datasheet peak known)"
