"""Writing profiles: the JSON with fits and provenance, the raw CSV beside it, atomically."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from perfmodel.files import check_output, write_atomic
from perfmodel.specs.profile import FORMAT, VERSION, profile_from_dict


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _program() -> str:
    """'perfmodel' for `python -m perfmodel` (argv[0] is then .../perfmodel/__main__.py)."""
    path = Path(sys.argv[0])
    return path.parent.name if path.name == "__main__.py" else path.name


def provenance(**fields: Any) -> dict[str, Any]:
    """Host, date, command line and git revision, plus the caller's device/version fields."""
    torch = sys.modules.get("torch")
    base = {
        "host": socket.gethostname(),
        "device": None,
        "device_count": None,
        "nodes": None,
        "torch_version": getattr(torch, "__version__", None),
        "nccl_version": None,
        "gloo": None,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([_program(), *sys.argv[1:]]),
        "git_revision": git_revision(),
        "python": platform.python_version(),
    }
    base.update(fields)
    return base


def _clean(value: Any) -> Any:
    """JSON-ready: numpy scalars to Python, tuples to lists."""
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def write_profile(
    path: str | Path,
    *,
    hardware: Mapping[str, Any],
    fits: Mapping[str, Mapping[str, Any]],
    measurements: pd.DataFrame | None,
    provenance: Mapping[str, Any],
    complete: bool = True,
    notes: list[str] | None = None,
    missing_stages: list[str] | None = None,
) -> Path:
    """Write PROFILE.json and PROFILE.measurements.csv beside it; returns the profile path.

    The document is validated with perfmodel's own reader before it is written. The directory
    must exist (a user's output path: a missing one is refused, OutputError, not made); a path
    ending in '/' is refused (give it as a str: Path() drops the slash).
    """
    check_output(path, what="profile")  # refused: no measurements beside it
    path = Path(path)
    # a write through a symlink writes its target and keeps the link: the CSV goes beside the
    # target, named after it, where the JSON's "measurements" is looked up
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    csv_name = None
    if measurements is not None:
        csv_name = f"{target.stem}.measurements.csv"
        write_atomic(target.parent / csv_name, measurements.to_csv(index=False),
                     what="profile measurements")
    doc = _clean(
        {
            "format": FORMAT,
            "version": VERSION,
            "complete": complete,
            **({} if missing_stages is None else {"missing_stages": list(missing_stages)}),
            "hardware": dict(hardware),
            "fits": dict(fits),
            "measurements": csv_name,
            "provenance": dict(provenance, notes=list(notes or [])),
        }
    )
    profile_from_dict(doc, f"profile {path}", target)  # never write what we could not read back
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    write_atomic(path, text, what="profile")
    return path
