"""What perfmodel prints is finite, and its JSON is strict JSON.

`require_finite` is the one check every computed answer passes before it is shown (predict,
explain, recommend, collective, sweep): a NaN or an infinity is never an answer; it is a bug,
reported as exit 1 in one line that names the non-finite terms. Bad input never gets this far:
the specs' physical ranges (perfmodel.specs.*.BOUNDS) refuse it first, as a spec or plan error.

`json_text` is the one JSON writer of every command's --json output: strict JSON (RFC 8259 has
no NaN or Infinity, which Python's json writes by default and strict parsers refuse).

`document` puts the "schema" field first in a --json document: "perfmodel.KIND/VERSION", whose
JSON Schema perfmodel.schemas builds and docs/schemas/KIND.json publishes (docs/json.md: an
added field keeps the version; a renamed, removed or retyped field bumps it).

`fmt_bytes` is how every text output writes a size: binary units (KiB, MiB, GiB, TiB), never a
raw count like 3.277e+04 B.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfmodel.errors import InternalError

_SHOWN = 3  # non-finite values named in one error line


def non_finite(data: Any, path: str = "") -> list[tuple[str, float]]:
    """(dotted path, value) of every NaN or infinity in nested mappings, lists, tuples, numpy
    arrays and pandas frames (a frame's cells are named row.column)."""
    if isinstance(data, bool) or data is None or isinstance(data, (str, bytes)):
        return []
    if isinstance(data, Mapping):
        return [hit for k, v in data.items() for hit in non_finite(v, f"{path}.{k}" if path
                                                                    else str(k))]
    if hasattr(data, "select_dtypes"):  # a pandas DataFrame: its numeric cells, vectorised
        import numpy as np

        numbers = data.select_dtypes("number")
        rows, cols = np.nonzero(~np.isfinite(numbers.to_numpy(dtype=float)))
        return [(f"{path + '.' if path else ''}{numbers.index[r]}.{numbers.columns[c]}",
                 float(numbers.iat[r, c])) for r, c in zip(rows, cols, strict=True)]
    if hasattr(data, "tolist") and not isinstance(data, (int, float)):  # numpy arrays, scalars
        return non_finite(data.tolist(), path)
    if isinstance(data, (list, tuple)):
        return [hit for i, v in enumerate(data) for hit in non_finite(v, f"{path}[{i}]")]
    if isinstance(data, (int, float)):
        return [] if math.isfinite(data) else [(path, float(data))]
    return []


def require_finite(data: Any, what: str, context: str = "") -> None:
    """InternalError (exit 1) 'internal: WHAT is not finite (term = inf, ...) for CONTEXT' when
    data holds a NaN or an infinity; the most specific (deepest) terms are named first."""
    bad = non_finite(data)
    if not bad:
        return
    bad.sort(key=lambda hit: -hit[0].count("."))
    named = ", ".join(f"{name or 'value'} = {value}" for name, value in bad[:_SHOWN])
    more = f" and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
    where = f" for {context}" if context else ""
    raise InternalError(f"{what} is not finite ({named}{more}){where}; please report it")


# the kinds of --json document and their versions (perfmodel.schemas, docs/json.md)
SCHEMA_VERSIONS = {
    "predict": 1, "predict.grid": 1, "predict.batch": 1, "recommend": 1, "recommend.grid": 1,
    "collective": 1, "sweep": 1, "presets": 1, "validate": 1, "validate.dry-run": 1,
}


def schema_id(kind: str) -> str:
    """'perfmodel.KIND/VERSION', the value of a document's "schema" field."""
    return f"perfmodel.{kind}/{SCHEMA_VERSIONS[kind]}"


def document(kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """data as a --json document of kind: its "schema" field first, then data's fields."""
    return {"schema": schema_id(kind), **{k: v for k, v in data.items() if k != "schema"}}


def fmt_fixed(x: float, spec: str) -> str:
    """x by a fixed-point spec (',.2f', '.1f', '.1%', '+.3f'); a value that is not zero but
    would read as one (3e-8 samples/s as 0.00) by three significant digits instead: 3e-08,
    0.00412. A table never prints a nonzero number as 0."""
    text = format(x, spec)
    if x == 0 or any(ch in "123456789" for ch in text) or not math.isfinite(x):
        return text
    sign = "+" if "+" in spec else ""
    if spec.endswith("%"):
        return f"{x * 100:{sign}.3g}%"
    return format(x, f"{sign}.3g")


def fmt_bytes(n: float, signed: bool = False) -> str:
    """A size in binary units: 512 B, 32.00 KiB, 1.50 GiB (with its sign when signed)."""
    sign = "+" if signed else ""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:{sign}.2f} {unit}"
    return f"{fmt_fixed(n, sign + '.0f')} B"


def _plain(value: Any) -> Any:
    """JSON for what json does not know: numpy and sympy numbers, arrays, paths, enums."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if hasattr(value, "is_number") and value.is_number:  # a sympy number
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def json_text(data: Any, *, indent: int | None = 2,
              default: Callable[[Any], Any] | None = None) -> str:
    """Strict JSON of data (allow_nan=False): InternalError naming the non-finite values when
    one slipped through. default: how to write other objects (e.g. str), after _plain's types."""
    def fallback(value: Any) -> Any:
        try:
            return _plain(value)
        except TypeError:
            if default is None:
                raise
            return default(value)

    try:
        return json.dumps(data, indent=indent, allow_nan=False, default=fallback)
    except ValueError:
        require_finite(data, "the JSON output")
        raise  # a non-finite value that non_finite cannot reach (inside an object's default)


def _option_value(option: Any) -> str:
    """An enum option's name as the command line spells it."""
    return str(getattr(option, "value", option))


def degrees_text(p: Any) -> str:
    """dp=.. tp=.. pp=.., with cp (and how attention crosses it) and ep where not 1."""
    text = f"dp={p.dp} tp={p.tp} pp={p.pp}"
    if getattr(p, "cp", 1) > 1:
        text += f" cp={p.cp} ({_option_value(p.cp_comm)})"
    if getattr(p, "ep", 1) > 1:
        text += f" ep={p.ep}"
        if _option_value(getattr(p, "ep_dispatcher", "alltoall")) != "alltoall":
            text += f" ({_option_value(p.ep_dispatcher)})"
    if getattr(p, "etp", 1) > 1:
        text += f" etp={p.etp}"
    return text


__all__ = ["SCHEMA_VERSIONS", "degrees_text", "document", "fmt_bytes", "json_text", "non_finite",
           "require_finite", "schema_id"]


# --- a prediction's views (perfmodel.predict.Prediction, perfmodel.layerwise.GridPrediction) ----

def breakdown_frame(breakdown_s: Mapping[str, float], step_time_s: float) -> Any:
    """A step time's terms as a pandas DataFrame: term, seconds, share of the step."""
    import pandas as pd

    total = step_time_s or 1.0
    rows = [(k, v, v / total) for k, v in breakdown_s.items()]
    return pd.DataFrame(rows, columns=["term", "seconds", "share"]).set_index("term")


def memory_frame(memory_bytes: Mapping[str, float]) -> Any:
    """Memory terms as a pandas DataFrame: term, bytes, GiB."""
    import pandas as pd

    rows = [(k, v, v / 2**30) for k, v in memory_bytes.items()]
    return pd.DataFrame(rows, columns=["term", "bytes", "GiB"]).set_index("term")


def breakdown_html(summary: str, breakdown_s: Mapping[str, float], step_time_s: float) -> str:
    """Jupyter's view of a prediction: its summary line and the step time's breakdown."""
    import html

    total = step_time_s or 1.0
    rows = "".join(f"<tr><td>{html.escape(term)}</td><td>{seconds:.4g} s</td>"
                   f"<td>{seconds / total:.1%}</td></tr>" for term, seconds in breakdown_s.items())
    return (f"<p>{html.escape(summary)}</p><table><thead><tr><th>term</th><th>time</th>"
            f"<th>share</th></tr></thead><tbody>{rows}</tbody></table>")
