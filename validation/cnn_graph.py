"""Any torch nn.Module as a layer graph (FLOPs, parameters, activation sizes per layer), traced on
the meta device: shapes propagate, no tensor data is allocated, so a ResNet-50 traces in a fraction
of a second and a few MB. The result is plain data perfmodel reads (``kind: layers``; perfmodel
itself never imports torch).

    python -m validation.cnn_graph resnet50 --out resnet50.json [--input 1,3,224,224]

Per leaf module call (forward hooks), with B the traced batch (input_shape[0]); sizes are per
sample, i.e. divided by B, as perfmodel.specs.layers expects:
  conv        flops = 2 * out elements * in_channels/groups * kernel area          (2 per MAC)
  linear      flops = 2 * out elements * in_features
  pool        flops = out elements * kernel area (adaptive pools: in elements)
  norm        flops = 2 * out elements (scale and shift with folded statistics)
  activation, add, dropout: 1 per out element; softmax 3; flatten and other 0
  params      the module's own parameters (a module called twice counts them once)
  activation_bytes = out elements * 4, weight_bytes = params * 4 (fp32)
Functional operations (torch.add, F.relu, x + y) are not modules and are not seen: write residual
sums as a module (``Add`` here) to have them counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.modules.pooling import (
    _AdaptiveAvgPoolNd,
    _AdaptiveMaxPoolNd,
    _AvgPoolNd,
    _MaxPoolNd,
)

from perfmodel.files import write_atomic

F32 = 4


class Add(nn.Module):
    """A residual sum as a module, so that tracing sees it."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


_ACTIVATIONS = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.LeakyReLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.ELU,
    nn.Mish,
)
_NORMS = (_BatchNorm, nn.LayerNorm, nn.GroupNorm, _InstanceNorm, nn.RMSNorm, nn.LocalResponseNorm)


def layer_kind(m: nn.Module) -> str:
    if isinstance(m, _ConvNd):
        return "conv"
    if isinstance(m, nn.Linear):
        return "linear"
    if isinstance(m, _MaxPoolNd | _AvgPoolNd | _AdaptiveAvgPoolNd | _AdaptiveMaxPoolNd):
        return "pool"
    if isinstance(m, _NORMS):
        return "norm"
    if isinstance(m, _ACTIVATIONS):
        return "activation"
    if isinstance(m, Add):
        return "add"
    if isinstance(m, _DropoutNd):
        return "dropout"
    if isinstance(m, nn.Softmax):
        return "softmax"
    if isinstance(m, nn.Flatten):
        return "flatten"
    return "other"


def _pair(k: Any, n: int) -> tuple[int, ...]:
    return tuple(k) if isinstance(k, Sequence) else (int(k),) * n


def _flops(m: Any, kind: str, x: torch.Tensor, y: torch.Tensor) -> float:
    """m: the module of its kind (nn.Conv2d, nn.Linear, ...), whose attributes are read."""
    out = y.numel()
    if kind == "conv":
        return 2.0 * out * (m.in_channels // m.groups) * math.prod(m.kernel_size)
    if kind == "linear":
        return 2.0 * out * m.in_features
    if kind == "pool":
        if isinstance(m, _AdaptiveAvgPoolNd | _AdaptiveMaxPoolNd):
            return float(x.numel())
        return float(out * math.prod(_pair(m.kernel_size, y.dim() - 2)))
    if kind == "norm":
        return 2.0 * out
    if kind in ("activation", "add", "dropout"):
        return float(out)
    if kind == "softmax":
        return 3.0 * out
    return 0.0


def layer_graph(module: nn.Module, input_shape: Sequence[int]) -> list[dict[str, Any]]:
    """Trace module on an input of input_shape (batch first) on the meta device; one dict per leaf
    module call, in execution order. The module's own tensors are not touched: parameters and
    buffers are replaced by meta tensors for the trace (torch.func.functional_call)."""
    shape = [int(d) for d in input_shape]
    if not shape or min(shape) < 1:
        raise ValueError(
            f"input_shape must be positive sizes, batch first; got {list(input_shape)}"
        )
    batch = shape[0]
    layers: list[dict[str, Any]] = []
    seen: set[int] = set()
    hooks = []

    def hook(name: str) -> Any:
        def fn(m: Any, args: tuple, y: Any) -> None:  # m: any module, its attributes by kind
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if not isinstance(y, torch.Tensor):
                return
            kind = layer_kind(m)
            params = 0 if id(m) in seen else sum(p.numel() for p in m.parameters(recurse=False))
            seen.add(id(m))
            rec: dict[str, Any] = {
                "name": name,
                "kind": kind,
                "input_shape": list(x.shape) if x is not None else [],
                "output_shape": list(y.shape),
                "params": params,
                "flops": _flops(m, kind, x if x is not None else y, y) / batch,
                "activation_bytes": y.numel() * F32 // batch,
                "weight_bytes": params * F32,
            }
            if kind == "conv":
                rec.update(
                    in_channels=m.in_channels,
                    out_channels=m.out_channels,
                    kernel_size=list(m.kernel_size),
                )
            elif kind == "linear":
                rec.update(in_features=m.in_features, out_features=m.out_features)
            layers.append(rec)

        return fn

    for name, m in module.named_modules():
        if not any(True for _ in m.children()):
            hooks.append(m.register_forward_hook(hook(name or type(m).__name__.lower())))
    meta = {
        n: torch.empty_like(t, device="meta")
        for n, t in [*module.named_parameters(), *module.named_buffers()]
    }
    try:
        with torch.no_grad():
            torch.func.functional_call(module, meta, (torch.empty(shape, device="meta"),))
    finally:
        for h in hooks:
            h.remove()
    return layers


def to_dict(
    layers: list[dict[str, Any]], name: str, input_shape: Sequence[int], source: str = ""
) -> dict[str, Any]:
    """The plain-data form perfmodel reads (perfmodel.specs.layers, kind: layers)."""
    out: dict[str, Any] = {"kind": "layers", "name": name, "input_shape": list(input_shape)}
    if source:
        out["source"] = source
    out["layers"] = layers
    return out


def write(path: str | Path, graph: dict[str, Any]) -> None:
    """JSON, or YAML for a .yaml/.yml path, through perfmodel's one atomic writer."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(graph, sort_keys=False)
    else:
        text = json.dumps(graph, indent=1) + "\n"
    write_atomic(path, text, what="layer graph")


# --- builders in plain torch (torchvision's architectures, without torchvision) ------------------


def alexnet(classes: int = 1000) -> nn.Sequential:
    """torchvision.models.alexnet: the single-tower variant of "One weird trick" (Krizhevsky 2014),
    not the two-GPU original of 2012. 61,100,840 parameters."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 11, stride=4, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d((6, 6)),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(256 * 6 * 6, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, classes),
    )


def vgg16(classes: int = 1000) -> nn.Sequential:
    """VGG-16, configuration D of Simonyan and Zisserman 2015 (torchvision.models.vgg16, no batch
    norm). 138,357,544 parameters."""
    layers: list[nn.Module] = []
    c = 3
    for v in (
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        "M",
    ):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            c = int(v)
    return nn.Sequential(
        *layers,
        nn.AdaptiveAvgPool2d((7, 7)),
        nn.Flatten(),
        nn.Linear(512 * 7 * 7, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, classes),
    )


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here: ResNet v1.5, as torchvision) -> 1x1 (x4), each with BatchNorm."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = 4 * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
        self.downsample = (
            nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )
            if stride != 1 or c_in != c_out
            else None
        )
        self.add = Add()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu3(self.add(y, skip))


def resnet50(classes: int = 1000) -> nn.Sequential:
    """ResNet-50 (He et al. 2016) as torchvision.models.resnet50 (v1.5). 25,557,032 parameters."""
    stages: list[nn.Module] = []
    c = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(blocks):
            stages.append(Bottleneck(c, width, stride if k == 0 else 1))
            c = 4 * width
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, padding=1),
        *stages,
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(2048, classes),
    )


BUILDERS = {"alexnet": alexnet, "vgg16": vgg16, "resnet50": resnet50}
SOURCES = {
    "alexnet": "torchvision.models.alexnet (Krizhevsky 2014, arXiv:1404.5997), traced by "
    "validation.cnn_graph",
    "vgg16": "VGG-16 config D (Simonyan & Zisserman 2015, arXiv:1409.1556), traced by "
    "validation.cnn_graph",
    "resnet50": "ResNet-50 v1.5 as torchvision (He et al. 2016, arXiv:1512.03385), traced by "
    "validation.cnn_graph",
}


def trace_builtin(name: str, input_shape: Sequence[int] = (1, 3, 224, 224)) -> dict[str, Any]:
    """Build a named model on the meta device (no memory) and trace it."""
    if name not in BUILDERS:
        raise ValueError(f"model must be one of {', '.join(BUILDERS)}, got {name!r}")
    with torch.device("meta"):
        model = BUILDERS[name]()
    return to_dict(layer_graph(model, input_shape), name, input_shape, SOURCES[name])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m validation.cnn_graph",
        description="Trace a built-in CNN into a layer graph.",
    )
    p.add_argument("model", choices=sorted(BUILDERS))
    p.add_argument("--input", default="1,3,224,224", help="input shape, batch first")
    p.add_argument("--out", required=True, help=".json or .yaml")
    a = p.parse_args(argv)
    try:
        shape = [int(s) for s in a.input.split(",")]
        graph = trace_builtin(a.model, shape)
        write(a.out, graph)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = len(graph["layers"])
    params = sum(layer["params"] for layer in graph["layers"])
    flops = sum(layer["flops"] for layer in graph["layers"])
    print(
        f"{a.model}: {n} layers, {params / 1e6:.2f} M parameters, "
        f"{flops / 1e9:.2f} GFLOPs per sample -> {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
