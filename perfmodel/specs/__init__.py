"""What is trained (model specs) and where (hardware specs): frozen, validated data."""

from perfmodel.specs.hardware import HardwareSpec, LinkSpec, load_hardware
from perfmodel.specs.model import TransformerSpec, load_model
from perfmodel.specs.presets import list_presets

__all__ = [
    "HardwareSpec",
    "LinkSpec",
    "TransformerSpec",
    "list_presets",
    "load_hardware",
    "load_model",
]
