"""Layer-graph models (CNNs, MLPs): a list of layers with their sizes, as plain data.

Built by perfmodel.specs.cnn (AlexNet, VGG-16, ResNet-50, MLPs), read from YAML/JSON
(`kind: layers`), or traced from any torch nn.Module on the meta device by validation.cnn_graph.
Sizes are per sample. A layer that splits over model-parallel ranks (conv, linear) has a GEMM
view: out[m, n] = in[m, k] @ w[k, n] with m = gemm_m per sample (output pixels; 1 for a linear
layer), n = its output channels or features (the dimension Pr splits), k = its reduction size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.specs.loading import check_fields, number

LAYER_KINDS = ("conv", "linear", "pool", "norm", "activation", "add", "flatten", "dropout", "softmax")


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    name: str
    kind: str
    params: float = 0.0  # weights and biases
    flops: float = 0.0  # forward FLOPs per sample (2 per multiply-add)
    in_elements: float = 0.0  # input activation elements per sample
    out_elements: float = 0.0  # output activation elements per sample
    gemm_m: float = 0.0  # GEMM rows per sample (output pixels) for conv / linear
    gemm_n: float = 0.0  # output channels / features: what model parallelism splits
    gemm_k: float = 0.0  # reduction size (in_channels * kernel area, or in_features)
    channels: float = 0.0  # norm layers: channels whose statistics synchronised BN all-reduces

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise SpecError(f"layer '{self.name}': kind must be one of {', '.join(LAYER_KINDS)}, "
                            f"got '{self.kind}'")
        for fld in ("params", "flops", "in_elements", "out_elements", "gemm_m", "gemm_n", "gemm_k",
                    "channels"):
            number(getattr(self, fld), f"layer '{self.name}'.{fld}", strict=False, maximum=1e18)
        if self.kind in ("conv", "linear") and min(self.gemm_m, self.gemm_n, self.gemm_k) <= 0:
            raise SpecError(f"layer '{self.name}' ({self.kind}) needs gemm_m, gemm_n and gemm_k > 0")

    @property
    def splits(self) -> bool:
        return self.kind in ("conv", "linear")


@dataclass(frozen=True, kw_only=True)
class LayerGraphSpec:
    name: str
    kind: str = "layers"
    input_shape: tuple[int, ...] = ()
    layers: tuple[LayerSpec, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if not self.layers:
            raise SpecError(f"model '{self.name}': a layer graph needs at least one layer")
        if not any(layer.splits for layer in self.layers):
            raise SpecError(f"model '{self.name}': no conv or linear layer to split")

    @property
    def parameters(self) -> float:
        return sum(layer.params for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        return sum(layer.flops for layer in self.layers)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_LAYER_FIELDS = [f.name for f in dataclasses.fields(LayerSpec)]
_GRAPH_FIELDS = [f.name for f in dataclasses.fields(LayerGraphSpec)]


def layer_graph_from_dict(data: Mapping[str, Any], where: str) -> LayerGraphSpec:
    check_fields(data, [*_GRAPH_FIELDS, "base"], where)
    raw = data.get("layers")
    if not isinstance(raw, list):
        raise SpecError(f"{where}: 'layers' must be a list of layers")
    layers = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}: layers[{i}] must be a mapping")
        extra = {k: v for k, v in item.items() if k not in _LAYER_FIELDS}
        fields = {k: v for k, v in item.items() if k in _LAYER_FIELDS}
        # the tracer's names (validation.cnn_graph) map onto ours
        fields.setdefault("name", f"layer{i}")
        if "activation_bytes" in extra and "out_elements" not in fields:
            fields["out_elements"] = float(extra["activation_bytes"]) / 4
        try:
            layers.append(LayerSpec(**fields))
        except TypeError as exc:
            raise SpecError(f"{where}: layers[{i}]: {exc}") from None
    return LayerGraphSpec(name=str(data.get("name", where)), input_shape=tuple(data.get("input_shape", ())),
                          layers=tuple(layers), source=str(data.get("source", "")))
