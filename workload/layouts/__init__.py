"""2D (SUMMA/Optimus), 3D (Bian et al. / Colossal-AI) and Pr x Pc (Gholami et al.) layouts written
with torch.distributed collectives on DeviceMesh sub-groups, their equivalence checks against a
single-process reference, and their timing for `perfmodel validate` (validation.layouts compares
the timings and collectives with the model).

Modules: comm (mesh, logged collectives, shared autograd Functions), block (the transformer block
and its reference), summa2d, cube3d, grid_prpc, harness (check, time_layout, launch, run_layout),
__main__ (python -m workload.layouts: the ranks' entry point). Importing the package does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CommLog": "comm",
    "CommRecord": "comm",
    "Grid": "comm",
    "check": "harness",
    "launch": "harness",
    "run_layout": "harness",
    "time_layout": "harness",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
