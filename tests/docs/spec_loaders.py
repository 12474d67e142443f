"""The reader perfmodel uses for each kind of file the docs show an example of.

Each loader reads the file as perfmodel does and checks what it got, raising on any problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hardware(path: Path) -> Any:
    from perfmodel.specs.hardware import HardwareSpec, load_hardware

    spec = load_hardware(str(path))
    assert isinstance(spec, HardwareSpec)
    return spec


def model(path: Path) -> Any:
    from perfmodel.errors import SpecError
    from perfmodel.specs.layers import LayerGraphSpec
    from perfmodel.specs.model import TransformerSpec, load_model

    if path.name == "config.json":  # a Hugging Face config has no training length: --seq-len
        try:
            load_model(str(path))
            raise AssertionError(f"{path}: a Hugging Face config was read without a seq_len")
        except SpecError as exc:
            assert "give --seq-len" in str(exc), exc
        spec = load_model(str(path), seq_len=2048)
    else:
        spec = load_model(str(path))
    assert isinstance(spec, (TransformerSpec, LayerGraphSpec))
    return spec


def plans(path: Path) -> Any:
    """The rows of a plans CSV, each turned into a Plan as `predict --batch` does."""
    from perfmodel.batch import PLAN_COLUMNS, read_rows
    from perfmodel.strategy import plan_from_dict

    _, rows = read_rows(path)
    assert rows, f"{path}: no plan"
    out = []
    for line, row, problem in rows:
        assert not problem, f"{path}:{line}: {problem}"
        kw = {k: row[k] for k in PLAN_COLUMNS if row.get(k)}
        kw.setdefault("dtype", "bf16")
        out.append(plan_from_dict(kw))
    return out


def profile(path: Path) -> Any:
    """A profile, applied alone (a profile of `calibrate run` stands alone)."""
    from perfmodel.specs.profile import apply_profile, load_profile

    loaded = load_profile(path)
    apply_profile(None, loaded)
    return loaded


def measurements(path: Path) -> Any:
    """The measurements CSV, read through the profile beside it that names it."""
    from perfmodel.plot import read_measurements
    from perfmodel.specs.profile import load_profile

    owners = [p for p in path.parent.glob("*.json")
              if json.loads(p.read_text()).get("measurements") == path.name]
    assert owners, f"no profile beside {path} names it"
    frame = read_measurements(load_profile(owners[0]))
    assert frame is not None and len(frame), f"{path}: no measurements read"
    assert {"kind", "time_s"} <= set(frame.columns)
    return frame


def report(path: Path) -> Any:
    from perfmodel.plot import runs_frame, validation_axes

    data = json.loads(path.read_text())
    validation_axes(data)
    runs = runs_frame([path])
    assert len(runs) == 1
    return data


def history(path: Path) -> Any:
    from perfmodel.plot import runs_frame

    runs = runs_frame(path)
    assert len(runs) > 0
    return runs


def trace(path: Path) -> Any:
    """A Chrome/Perfetto trace as predict --trace writes it: valid, named, monotone per track."""
    from perfmodel.timeline import check_trace

    tracks = check_trace(json.loads(path.read_text()))
    assert tracks, f"{path}: no complete event"
    return tracks


LOADERS: dict[str, Callable[[Path], Any]] = {
    "hardware": hardware,
    "model": model,
    "plans": plans,
    "profile": profile,
    "measurements": measurements,
    "report": report,
    "history": history,
    "trace": trace,
}
