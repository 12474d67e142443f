"""perfmodel: predict, recommend and validate the speed and memory of parallel training."""

from typing import overload

from perfmodel.errors import DataError, OutputError, PerfmodelError, PlanError, SpecError
from perfmodel.predict import Prediction, comm_ledger, predict
from perfmodel.specs import HardwareSpec, TransformerSpec, load_hardware, load_model
from perfmodel.specs import presets as _presets
from perfmodel.strategy import Plan

# list_presets' kinds, as a caller may name them, and the key of each in its mapping
_PRESET_KINDS = {"hardware": "hardware", "model": "models", "models": "models"}


@overload
def list_presets(kind: None = None) -> dict[str, list[str]]: ...


@overload
def list_presets(kind: str) -> list[str]: ...


def list_presets(kind: str | None = None) -> dict[str, list[str]] | list[str]:
    """The preset names, as `perfmodel presets` lists them: {'hardware': [...], 'models': [...]}
    (models: transformers, then layer graphs); given a kind ('hardware', or 'model'), that
    kind's names. Another kind is a SpecError naming the two."""
    names = _presets.list_presets()
    if kind is None:
        return names
    key = _PRESET_KINDS.get(kind.strip().lower()) if isinstance(kind, str) else None
    if key is None:
        from perfmodel.specs.loading import suggest

        raise SpecError(f"list_presets kind must be 'model' or 'hardware', got {kind!r}"
                        f"{suggest(str(kind), ('model', 'hardware'))}")
    return names[key]


__version__ = "0.1.0"

__all__ = [
    "DataError",
    "OutputError",
    "HardwareSpec",
    "PerfmodelError",
    "Plan",
    "PlanError",
    "Prediction",
    "SpecError",
    "TransformerSpec",
    "comm_ledger",
    "list_presets",
    "load_hardware",
    "load_model",
    "predict",
]
