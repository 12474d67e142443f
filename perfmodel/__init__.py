"""perfmodel: predict, recommend and validate the speed and memory of parallel training."""

from perfmodel.errors import DataError, OutputError, PerfmodelError, PlanError, SpecError
from perfmodel.predict import Prediction, comm_ledger, predict
from perfmodel.specs import HardwareSpec, TransformerSpec, list_presets, load_hardware, load_model
from perfmodel.strategy import Plan

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
