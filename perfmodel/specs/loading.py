"""Reading spec files: safe YAML/JSON loading, `base:` inheritance and strict field checking."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import numbers
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml

from perfmodel.errors import SpecError


class DuplicateField(Exception):
    """A mapping of a spec file repeats a key (args: the key, ' at line N' or '')."""


# libyaml's parser where PyYAML has it: the same safe constructor over the same nodes (every YAML
# file of the repository reads the same, and its errors name the same line and column), the
# gb200-nvl72 preset in 0.85 ms instead of 16 ms (2026-12-06)
try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # a PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _UniqueKeyLoader(_SafeLoader):
    """yaml's safe loader that refuses a key repeated in one mapping (PyYAML keeps the last one
    silently, so a typo'd override would pass unnoticed)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # `<<:` merges may be overridden, as YAML intends
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DuplicateField(key, f" (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateField(key, "")
        out[key] = value
    return out


# A YAML alias is a reference: PyYAML builds one object per anchor, so a few lines of aliases of
# aliases ("billion laughs": 9 aliases to 9 aliases ... 9 levels deep) hold 9^9 values once
# something walks them (json.dumps, deep_merge, repr). The document is streamed through the
# parser's events first and refused past these limits; nothing is built.
MAX_YAML_NODES = 200_000  # values, aliases expanded: a spec has tens; a 10,000-layer graph ~160,000
MAX_YAML_DEPTH = 100  # nested collections: a spec nests 3 deep (gemm_efficiency.bf16.max_fraction)


def _line(event: yaml.Event) -> int | str:
    """The line (from 1) where a parser event starts (the parser marks every event)."""
    return event.start_mark.line + 1 if event.start_mark is not None else "?"


def check_yaml_size(text: str, where: str) -> None:
    """SpecError when the YAML document's values, counting each alias as the values of the node
    it names, exceed MAX_YAML_NODES, when an alias names a node that contains it (a cycle), or
    when it nests deeper than MAX_YAML_DEPTH. Streams libyaml's events where PyYAML has it (200,000
    events in ~0.1 s); a syntax error is left to the loader, which says where."""
    events = yaml.parse(text, Loader=_SafeLoader)
    sizes: dict[str, int] = {}  # anchor -> values of its node, aliases expanded
    open_: list[tuple[str | None, int]] = []  # collections being read: (anchor, total before)
    total = 0
    try:
        for event in events:
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in sizes:
                    total += sizes[event.anchor]
                elif any(anchor == event.anchor for anchor, _ in open_):
                    raise SpecError(f"{where}: alias *{event.anchor} (line "
                                    f"{_line(event)}) is inside the node it names; "
                                    "a spec cannot contain itself")
            elif isinstance(event, yaml.ScalarEvent):
                total += 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                open_.append((event.anchor, total))
                total += 1
                if len(open_) > MAX_YAML_DEPTH:
                    raise SpecError(f"{where} is nested too deeply to be a spec (more than "
                                    f"{MAX_YAML_DEPTH} levels, line {_line(event)})")
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, before = open_.pop()
                if anchor:
                    sizes[anchor] = total - before
            if total > MAX_YAML_NODES:
                raise SpecError(f"{where} holds more than {MAX_YAML_NODES:,} values with its "
                                "aliases expanded (a YAML alias bomb?); a spec holds far fewer")
    except yaml.YAMLError:
        return  # the loader reports the error and where it is


# The presets shipped with the package, read once a process: (path, mtime, size) -> mapping.
# PyYAML's pure-Python loader takes ~14 ms a hardware preset, most of a warm predict by name
# (the golden corpus: 17 of 29 s); a copy is handed out, so that no caller changes the memo.
_PRESETS = Path(__file__).resolve().parent / "presets"
_PRESET_MEMO: dict[tuple[str, int, int], dict[str, Any]] = {}


def _preset_key(path: Path) -> tuple[str, int, int] | None:
    try:
        resolved = path.resolve()
        if not resolved.is_relative_to(_PRESETS):
            return None
        stat = resolved.stat()
    except (OSError, ValueError, RuntimeError):
        return None
    return str(resolved), stat.st_mtime_ns, stat.st_size


def read_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML, JSON or TOML file holding one mapping (safe loaders only: no code, no tags).

    The file is read by perfmodel.files.read_text_bounded (a regular file of at most 16 MiB);
    a YAML document is refused before it is built when its values, aliases expanded, exceed
    MAX_YAML_NODES or it nests deeper than MAX_YAML_DEPTH (check_yaml_size). A preset of the
    package is read once a process (_PRESET_MEMO).
    """
    key = _preset_key(path)
    if key is not None and key in _PRESET_MEMO:
        return copy.deepcopy(_PRESET_MEMO[key])
    data = _read_mapping(path, what)
    if key is not None:
        _PRESET_MEMO[key] = copy.deepcopy(data)
    return data


def _read_mapping(path: Path, what: str) -> dict[str, Any]:
    from perfmodel.files import read_text_bounded

    text = read_text_bounded(path, what, error=SpecError)
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_pairs)
        elif suffix == ".toml":
            data = tomllib.loads(text)  # refuses a repeated key itself
        else:
            check_yaml_size(text, f"{what} file {path}")
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except SpecError:  # check_yaml_size's own message (a ValueError: not the number's below)
        raise
    except DuplicateField as exc:
        raise SpecError(f"{what} file {path}: field '{exc.args[0]}' is given twice{exc.args[1]}; "
                        "give each field once") from None
    except (yaml.YAMLError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        elif isinstance(exc, tomllib.TOMLDecodeError):
            where = f" ({exc})"
        kind = {".json": "JSON", ".toml": "TOML"}.get(suffix, "YAML/JSON")
        raise SpecError(f"{what} file {path} is not valid {kind}{where}") from None
    except RecursionError:  # thousands of nested brackets
        raise SpecError(f"{what} file {path} is nested too deeply to be a spec") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise SpecError(f"{what} file {path} holds a number perfmodel cannot read ({exc})"
                        ) from None
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{what} file {path} must hold a mapping of fields, got {type(data).__name__}")
    return dict(data)


def suggest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choice, or '': the choice it spells in other case
    (DGX-H100), else the only choice it begins (qwen3-30b: qwen3-30b-a3b), else difflib's
    closest, compared in lower case."""
    lower = {str(c).lower(): str(c) for c in choices}
    key = str(name).strip().lower()
    if key in lower:
        return f" (did you mean '{lower[key]}'?)" if lower[key] != name else ""
    begun = [c for low, c in lower.items() if key and low.startswith(key)]
    if len(begun) == 1:
        return f" (did you mean '{begun[0]}'?)"
    close = difflib.get_close_matches(key, list(lower), n=1, cutoff=0.6)
    return f" (did you mean '{lower[close[0]]}'?)" if close else ""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Override's fields replace base's; nested mappings merge field by field."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def check_fields(data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Refuse unknown fields (a typo must not be silently ignored)."""
    allowed = list(allowed)
    for key in data:
        if key not in allowed:
            raise SpecError(
                f"{where}: unknown field '{key}'{suggest(str(key), allowed)}; "
                f"allowed: {', '.join(sorted(allowed))}"
            )


def label(value: Any, field: str, *, empty: bool = False) -> str:
    """A spec's text field (a name, a GPU's name, a source): a string, non-empty unless `empty`,
    or SpecError naming the field (a YAML null or list would print as None or ['a'])."""
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise SpecError(f"{field} must be {'a' if empty else 'a non-empty'} string, got "
                        f"{value!r}")
    return value


# the largest finite float, 1.8e308: an integer above it has no float (float() raises)
_FLOAT_MAX = sys.float_info.max
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _range(minimum: float, strict: bool, maximum: float) -> str:
    """'> 0 and <= 1', '>= 1e+06' (as number's errors say a range)."""
    low = f"> {minimum:g}" if strict else f">= {minimum:g}"
    return low + (f" and <= {maximum:g}" if maximum != math.inf else "")


def _magnitude(value: int) -> str:
    """'~1e+400': the size of an integer too long to show (YAML and JSON read any number of
    digits exactly; past 1.8e308 no float holds it), from its bits (str() stops at 4,300
    digits)."""
    exponent = int((abs(value).bit_length() - 1) * math.log10(2))  # low by at most one
    if abs(value) >= 10 ** (exponent + 1):
        exponent += 1
    return f"~{'-' if value < 0 else ''}1e+{exponent}"


def plain(value: Any) -> Any:
    """A numpy scalar as its Python equivalent (np.int64 as int, np.float32 as float, np.bool_ as
    bool, np.str_ as str); anything else as it is. The API takes numpy's numbers where it takes
    Python's (a field of a DataFrame's row, a sweep's array), and stores Python's."""
    if isinstance(value, np.ndarray) and value.ndim == 0:  # np.array(4): one number
        return value.item()
    return value.item() if isinstance(value, np.generic) else value


def boolean(value: Any, field: str, error: type[Exception] = SpecError) -> bool:
    """value as a bool if it is true or false (Python's or numpy's); anything else (1, "true")
    refused naming field."""
    value = plain(value)
    if not isinstance(value, bool):
        raise error(f"{field} must be true or false, got {value!r}")
    return value


def number(value: Any, field: str, *, minimum: float = 0.0, strict: bool = True,
           maximum: float = math.inf, integer: bool = False, reason: str = "",
           allowed: str = "") -> float:
    """Validate a positive (or non-negative) finite number, naming the field when it is not
    (and, out of range, the reason for the range when one is given; `allowed`: the range as the
    error says it, where it is more than minimum and maximum, Bound.describe)."""
    why = f" ({reason})" if reason else ""
    value = plain(value)  # numpy's numbers as Python's (np.bool_ as bool: refused below)
    if not isinstance(value, (bool, int, float)) and isinstance(value, numbers.Real):
        # another type of real number (fractions.Fraction): as its int or float
        value = int(value) if isinstance(value, numbers.Integral) else float(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
        # above 1.8e308 no float holds it (float() raises OverflowError): out of every range;
        # with no range of its own (model_from_dict's whole numbers), the float's is the range
        allowed = allowed or (_range(minimum, strict, maximum) if math.isfinite(minimum)
                              or math.isfinite(maximum) else f"at most {_FLOAT_MAX:.3g} in size")
        raise SpecError(f"{field} must be {allowed}, got {_magnitude(value)}{why}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # a string in plain decimal notation only: YAML 1.1 (PyYAML) reads 1e15 as a string, but
        # float() would also take '4_0', full-width or Arabic-Indic digits
        if isinstance(value, str):
            if not _DECIMAL.fullmatch(value.strip()):
                raise SpecError(f"{field} must be a number, got '{value}'")
            value = float(value)
        else:
            raise SpecError(f"{field} must be a number, got {type(value).__name__}")
    if math.isnan(value) or math.isinf(value):
        raise SpecError(f"{field} must be a finite number, got {value}")
    # an int is whole as given (10**30 is, though float(10**30) != 10**30)
    if integer and not isinstance(value, int) and not float(value).is_integer():
        raise SpecError(f"{field} must be a whole number, got {value}")
    bad_low = value <= minimum if strict else value < minimum
    if bad_low or value > maximum:
        # the value as given where its short form would round it (4.0000001 is not 4), but an
        # integer of more digits than a float's 16 by its size (10**300: not 301 digits)
        shown = f"{value:g}" if float(f"{value:g}") == value else repr(value)
        if isinstance(value, int) and abs(value) >= 10**16:
            shown = _magnitude(value)
        allowed = allowed or _range(minimum, strict, maximum)
        raise SpecError(f"{field} must be {allowed}, got {shown}{why}")
    return int(value) if integer else float(value)


# The smallest fraction of a peak (an efficiency, a kernel's or link's share of its datasheet
# rate) a spec may give: as a bandwidth's floor is 1 MB/s, one below 0.1% is a slip (0.85 written
# 8.5e-4, a percentage divided twice) or a broken fit, not a machine, and it divides a time
# (1e-300 made a step of 300 digits). The lowest any preset or calibration writes is 0.13 (a GEMM
# ceiling, dgx-v100); a rate slowed 100x (the property tests' what-if) stays above it.
FRACTION_FLOOR = 1e-3


@dataclass(frozen=True)
class Bound:
    """The physical range of a numeric spec field, with why: (minimum, maximum], or
    [minimum, maximum] when `inclusive`; `integer`: whole numbers only; `floor`: the smallest
    value above minimum (a field whose 0 means "not given": 0, or floor to maximum). The ranges
    are generous: a value outside is a slip of units or a typo (1e-300 B/s, 1e9 GPUs per node),
    not a machine.
    """

    minimum: float
    maximum: float
    reason: str
    inclusive: bool = False
    integer: bool = False
    floor: float = 0.0

    def check(self, value: Any, field: str) -> Any:
        """The value as a float (int when integer), or SpecError naming field, range and reason."""
        kind = type(value)
        if kind is float or kind is int:  # the common case, a finite number in range, at once:
            # a spec's hundreds of fields are checked each time one is built (a predict by name
            # builds two), and number()'s messages are only wanted when the value is refused
            low = value >= self.minimum if self.inclusive else value > self.minimum
            if (low and value <= self.maximum and not self.minimum < value < self.floor
                    and -_FLOAT_MAX <= value <= _FLOAT_MAX):
                if not self.integer:
                    return float(value)
                if kind is int or value.is_integer():
                    return int(value)
        value = number(value, field, minimum=self.minimum, strict=not self.inclusive,
                       maximum=self.maximum, integer=self.integer, reason=self.reason,
                       allowed=self.describe())
        if self.minimum < value < self.floor:
            raise SpecError(f"{field} must be {self.describe()}, got {value:g} ({self.reason})")
        return value

    def describe(self) -> str:
        """'> 0 and <= 1', '>= 1 and <= 65536', '0, or >= 0.001 and <= 1' (as the errors say)."""
        low = f">= {self.minimum:g}" if self.inclusive else f"> {self.minimum:g}"
        if self.floor > self.minimum:  # 0 ("not given") where inclusive, else from the floor
            low = (f"{self.minimum:g}, or " if self.inclusive else "") + f">= {self.floor:g}"
        return f"{low} and <= {self.maximum:g}"


_C = TypeVar("_C", bound=type)


def keyword_fields(cls: _C, error: type[Exception], what: str) -> _C:
    """cls (a keyword-only dataclass) whose constructor refuses, with `error` naming the field,
    what its generated __init__ would refuse with a bare TypeError: an unknown field (with the
    closest name), a required field left out, a positional argument. dataclasses.replace and the
    classes' replace() build through it too."""
    init = cls.__dict__["__init__"]  # the dataclass's own
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            example = ", ".join([*(f"{k}=..." for k in required[:2]), "..."])
            raise error(f"{what} takes its fields by name ({cls.__name__}({example})), got "
                        f"{len(args)} positional argument(s)")
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            raise error(f"unknown {what} field '{unknown[0]}'{suggest(str(unknown[0]), names)}; "
                        f"allowed: {', '.join(names)}")
        missing = [k for k in required if k not in kwargs]
        if missing:
            raise error(f"{what}: missing required field '{missing[0]}'"
                        + (f" (required: {', '.join(required)})" if len(required) > 1 else ""))
        init(self, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls
