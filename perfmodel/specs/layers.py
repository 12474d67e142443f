"""Layer-graph models (CNNs, MLPs): a list of layers with their sizes, as plain data.

Built by perfmodel.specs.cnn (AlexNet, VGG-16, ResNet-50, MLPs), read from YAML/JSON
(`kind: layers`), or traced from any torch nn.Module on the meta device by validation.cnn_graph.
Sizes are per sample. A layer that splits over model-parallel ranks (conv, linear) has a GEMM
view: out[m, n] = in[m, k] @ w[k, n] with m = gemm_m per sample (output pixels; a linear layer's
rows, 1 on a flat vector), n = its output channels or features (the dimension Pr splits), k = its
reduction size. The sizes one implies of another must agree (LayerSpec.check_sizes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.specs.loading import Bound, check_fields

# The physical range of every number of a layer (per sample), stated once; generous: a value outside
# is a slip of units, not a network.
BOUNDS: dict[str, Bound] = {
    "params": Bound(0, 1e16, "as for transformers: more than 1e16 parameters is absurd",
                    inclusive=True),
    "flops": Bound(0, 1e18, "one sample's forward pass: 1,000x GPT-3's 7e14 for 2048 tokens",
                   inclusive=True),
    "in_elements": Bound(0, 1e15, "activation elements of one sample: 1e15 fp32 values are 4 PB",
                         inclusive=True),
    "out_elements": Bound(0, 1e15, "as in_elements", inclusive=True),
    "gemm_m": Bound(0, 1e12, "output pixels of one sample: a 10,000^3 volume", inclusive=True),
    "gemm_n": Bound(0, 1e12, "output channels or features", inclusive=True),
    "gemm_k": Bound(0, 1e12, "a reduction length", inclusive=True),
    "channels": Bound(0, 1e12, "channels of a norm layer", inclusive=True),
    "input_shape": Bound(1, 1e9, "one dimension of a sample", inclusive=True, integer=True),
}

# a traced layer's channel, feature and kernel counts (validation.cnn_graph)
_TRACED_COUNT = Bound(1, 1e12, "a layer's channels, features or kernel extent", inclusive=True,
                      integer=True)

LAYER_KINDS = ("conv", "linear", "pool", "norm", "activation", "add", "flatten", "dropout",
               "softmax", "other")
# Kinds that hold no weights (validation.cnn_graph traces none: pooling, a residual sum, a
# reshape, dropout and softmax have no nn.Parameter), and kinds whose output is their input
# element for element (a norm, an activation such as ReLU, dropout, softmax, a flatten: torch's
# modules of these kinds keep the shape; a gated unit that halves its input, GLU, is `other`).
NO_WEIGHTS = ("pool", "add", "flatten", "dropout", "softmax")
ELEMENTWISE = ("norm", "activation", "dropout", "softmax", "flatten")
# Two sizes of a layer that one implies of the other (flops = 2 m n k) agree within 1%: a value
# rounded to 3 significant figures (8.85e5 for 884,736) passes, a slip of units (x1000) does not.
SIZE_TOLERANCE = 0.01


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
        if not isinstance(self.name, str) or not self.name.strip():
            raise SpecError(f"a layer's name must be a non-empty string, got {self.name!r}")
        if self.kind not in LAYER_KINDS:
            raise SpecError(f"layer '{self.name}': kind must be one of {', '.join(LAYER_KINDS)}, "
                            f"got '{self.kind}'")
        for fld in ("params", "flops", "in_elements", "out_elements", "gemm_m", "gemm_n", "gemm_k",
                    "channels"):  # stored as floats (YAML reads 1e9 as text)
            object.__setattr__(self, fld, BOUNDS[fld].check(getattr(self, fld),
                                                            f"layer '{self.name}'.{fld}"))
        if self.kind in ("conv", "linear") and min(self.gemm_m, self.gemm_n, self.gemm_k) <= 0:
            raise SpecError(
                f"layer '{self.name}' ({self.kind}) needs gemm_m, gemm_n and gemm_k > 0")
        for fld in ("gemm_n", "channels"):  # output channels or features: whole units
            if not float(getattr(self, fld)).is_integer():
                raise SpecError(f"layer '{self.name}'.{fld} must be a whole number, got "
                                f"{getattr(self, fld):g}")
        if self.kind == "norm" and self.channels <= 0:
            raise SpecError(f"layer '{self.name}' (norm) needs channels > 0: the statistics a "
                            "synchronised batch norm all-reduces")
        self._complete()

    def _complete(self) -> None:
        """Work out a size left out (0) that the others imply (check_sizes' rules), checked as a
        given one would be; and refuse a layer without a size the model reads that nothing
        implies. Before 2026-12-07 a size left out was taken as 0: a conv without out_elements
        gathered nothing and kept no activation, and GEMM sizes of 1e12 each implied 1e24
        output elements unchecked (a layer-graph probe's finding)."""
        where = f"layer '{self.name}' ({self.kind})"
        implied = self._gemm_implied()
        if not self.splits and self.kind in ELEMENTWISE:
            if self.out_elements and not self.in_elements:
                implied["in_elements"] = self.out_elements, "its out_elements"
            if self.in_elements and not self.out_elements:
                implied["out_elements"] = self.in_elements, "its in_elements"
        for fld, (value, by) in implied.items():
            if not getattr(self, fld):
                object.__setattr__(self, fld, BOUNDS[fld].check(
                    value, f"{where}.{fld} (left out: {by})"))
        needed = ("out_elements",) if self.splits else ("in_elements", "out_elements")
        for fld in needed:
            if not getattr(self, fld):
                raise SpecError(f"{where} needs {fld} > 0 (elements per sample: the model reads "
                                "it for the layer's activations and their traffic)")

    def _gemm_implied(self) -> dict[str, tuple[float, str]]:
        """A conv's or linear's sizes its GEMM gives, each with what gives it: flops = 2 m n k,
        out_elements = m n, a linear's in_elements = m k ({} for other kinds)."""
        if not self.splits:
            return {}
        m, n, k = self.gemm_m, self.gemm_n, self.gemm_k
        implied = {"flops": (2 * m * n * k, f"2 x gemm_m {m:g} x gemm_n {n:g} x gemm_k {k:g}"),
                   "out_elements": (m * n, f"gemm_m {m:g} x gemm_n {n:g}")}
        if self.kind == "linear":
            implied["in_elements"] = m * k, f"gemm_m {m:g} x gemm_k {k:g}"
        return implied

    @property
    def splits(self) -> bool:
        return self.kind in ("conv", "linear")

    def check_sizes(self) -> None:
        """The sizes the format derives from others agree with them (SpecError naming the field,
        its value and the value the others imply); a size of 0 is one not given.

        conv, linear (the GEMM out[m, n] = in[m, k] @ w[k, n] per sample): flops = 2 m n k,
        out_elements = m n, a linear layer's in_elements = m k (a conv's depends on its padding
        and stride: not derived), and params at most k n weights with a bias and a weight-norm
        gain per output (k n + 2 n; fewer where a module called twice counts them once, as
        validation.cnn_graph does). A norm's channels divide its elements (each channel's
        statistics over the same number of them). ELEMENTWISE kinds: in_elements = out_elements;
        NO_WEIGHTS kinds: params 0. channels are a norm's, the GEMM sizes a conv's or linear's
        only (no other kind reads them). A layer's in_elements is not compared with the previous
        layer's out_elements: a graph branches (ResNet's shortcut reads the block's input, an add
        two tensors) and joins tensors the tracer does not see (torch.cat)."""
        where = f"layer '{self.name}' ({self.kind})"
        if self.splits:
            for fld, (value, by) in self._gemm_implied().items():
                _agree(getattr(self, fld), value, f"{where}.{fld}", by)
            n, k = self.gemm_n, self.gemm_k
            most = k * n + 2 * n
            if self.params > most * (1 + SIZE_TOLERANCE):
                raise SpecError(f"{where}.params is {self.params:g}, more than its GEMM holds: "
                                f"gemm_k x gemm_n = {k * n:g} weights and a bias and a "
                                f"weight-norm gain per output, {most:g} at most")
        else:
            for fld in ("gemm_m", "gemm_n", "gemm_k"):
                if getattr(self, fld):
                    raise SpecError(f"{where}.{fld} is {getattr(self, fld):g}: a GEMM view is a "
                                    "conv's or linear's (the layers model parallelism splits); "
                                    f"a {self.kind} layer reads none: leave it out")
        if self.kind == "norm" and self.out_elements and self.out_elements % self.channels:
            raise SpecError(f"{where}.channels is {self.channels:g}, which does not divide its "
                            f"out_elements {self.out_elements:g}: a norm's statistics are per "
                            "channel, over an equal share of its elements each")
        if self.kind != "norm" and self.channels:
            raise SpecError(f"{where}.channels is {self.channels:g}: channels are a norm "
                            "layer's (the statistics synchronised batch norm all-reduces); a "
                            f"{self.kind} layer reads none: leave it out")
        if self.kind in ELEMENTWISE:
            _agree(self.in_elements, self.out_elements, f"{where}.in_elements",
                   f"its out_elements ({self.kind} keeps its input's size)")
        if self.kind in NO_WEIGHTS and self.params:
            raise SpecError(f"{where}.params is {self.params:g}: a {self.kind} layer holds no "
                            "weights; give 0 or leave it out")


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
        BOUNDS["params"].check(self.parameters, f"model '{self.name}': parameters (all layers)")
        BOUNDS["flops"].check(self.flops_per_sample, f"model '{self.name}': flops (all layers)")
        for dim in self.input_shape:
            BOUNDS["input_shape"].check(dim, f"model '{self.name}': input_shape")
        names = [layer.name for layer in self.layers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SpecError(f"model '{self.name}': layer name(s) {', '.join(twice)} given twice; "
                            "each layer needs its own name")
        for layer in self.layers:  # last: the graph's own errors first, naming the graph
            try:
                layer.check_sizes()
            except SpecError as exc:
                raise SpecError(f"model '{self.name}': {exc}") from None
        split = [layer for layer in self.layers if layer.splits]
        for layer in split[1:]:  # the first one's input gradient is never all-reduced
            if not layer.in_elements:
                raise SpecError(f"model '{self.name}': layer '{layer.name}' ({layer.kind}) needs "
                                "in_elements > 0: its input gradient is all-reduced over Pr "
                                "(a conv's input size depends on its padding and stride: not "
                                "worked out from its GEMM)")

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


def _agree(given: float, implied: float, field: str, implied_by: str) -> None:
    """SpecError where a size given (not 0) differs from the one the others imply by more than
    SIZE_TOLERANCE."""
    if given and abs(given - implied) > SIZE_TOLERANCE * max(abs(given), abs(implied)):
        raise SpecError(f"{field} is {given:g}, but {implied_by} is {implied:g}: they must "
                        "agree; fix whichever is wrong")


def layer_graph_from_dict(data: Mapping[str, Any], where: str) -> LayerGraphSpec:
    if "base" in data:  # accepted and dropped before 2026-12-07
        raise SpecError(f"{where}: base builds a transformer spec on a preset's; a layer graph "
                        "lists every layer: leave base out")
    check_fields(data, _GRAPH_FIELDS, where)
    raw = data.get("layers")
    if not isinstance(raw, list):
        raise SpecError(f"{where}: 'layers' must be a list of layers")
    layers = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}: layers[{i}] must be a mapping")
        extra = {k: v for k, v in item.items() if k not in _LAYER_FIELDS}
        fields = {k: v for k, v in item.items() if k in _LAYER_FIELDS}
        # the tracer's names (validation.cnn_graph: input_shape, output_shape, out_channels or
        # out_features, activation_bytes) map onto ours
        fields.setdefault("name", f"layer{i}")
        if "kind" not in fields:
            raise SpecError(f"{where}: layers[{i}] needs kind: one of {', '.join(LAYER_KINDS)}")
        _from_traced(fields, extra, f"{where}: layers[{i}]")
        try:
            layer = LayerSpec(**fields)
            layer.check_sizes()  # here too, to name the file and the entry (the graph's own)
        except TypeError as exc:
            raise SpecError(f"{where}: layers[{i}]: {exc}") from None
        except SpecError as exc:
            raise SpecError(f"{where}: layers[{i}]: {exc}") from None
        layers.append(layer)
    shape = data.get("input_shape", ())
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise SpecError(f"{where}: input_shape must be a list of positive whole numbers, got "
                        f"{shape!r}")
    return LayerGraphSpec(name=str(data.get("name", where)), input_shape=tuple(shape),
                          layers=tuple(layers), source=str(data.get("source", "")))


def _shape(shape: Any, where: str, name: str) -> list[float]:
    """A traced shape: a list of at least 2 positive whole numbers (batch first)."""
    if not isinstance(shape, (list, tuple)) or len(shape) < 2:
        raise SpecError(f"{where}: {name} must be a list of at least 2 numbers (batch first), "
                        f"got {shape!r}")
    return [BOUNDS["input_shape"].check(d, f"{where}: {name}") for d in shape]


def _prod(shape: list[float]) -> float:
    out = 1.0
    for d in shape:
        out *= d
    return out


def _from_traced(fields: dict[str, Any], extra: Mapping[str, Any], where: str) -> None:
    """Fill our per-sample sizes from a traced layer's shapes (batch dimension first); every
    number read is checked against BOUNDS."""
    known = {"input_shape", "output_shape", "out_channels", "out_features", "activation_bytes",
             "weight_bytes", "in_channels", "in_features", "kernel_size"}
    unknown = [k for k in extra if k not in known]
    if unknown:
        check_fields({unknown[0]: None}, [*_LAYER_FIELDS, *sorted(known)], where)
    out_shape = extra.get("output_shape")
    in_shape = extra.get("input_shape")
    if out_shape is not None:
        out_shape = _shape(out_shape, where, "output_shape")
    if in_shape is not None:
        in_shape = _shape(in_shape, where, "input_shape")
    if out_shape is not None and "out_elements" not in fields:
        fields["out_elements"] = _prod(out_shape[1:])
    elif "activation_bytes" in extra and "out_elements" not in fields:
        fields["out_elements"] = BOUNDS["out_elements"].check(
            extra["activation_bytes"], f"{where}: activation_bytes") / 4
    if in_shape is not None and "in_elements" not in fields:
        fields["in_elements"] = _prod(in_shape[1:])
    kind = fields.get("kind")
    if kind in ("conv", "linear") and not fields.get("gemm_n"):
        key = "out_channels" if extra.get("out_channels") else "out_features"
        n = extra.get(key)
        if not n and out_shape is not None:
            key, n = "output_shape", out_shape[1]
        if not n:
            raise SpecError(f"{where}: a {kind} layer needs out_channels/out_features or gemm_n")
        n = BOUNDS["gemm_n"].check(n, f"{where}: {key}")
        out = BOUNDS["out_elements"].check(fields.get("out_elements", 0), f"{where}: out_elements")
        # m: a conv's output pixels, a linear layer's rows (1 on a flat vector, tokens on a
        # sequence; 1 where no output size is given): the GEMM out[m, n] = in[m, k] @ w[k, n],
        # so that k is in_features and out_elements = m n
        m = out / n if out or kind == "conv" else 1.0
        flops = BOUNDS["flops"].check(fields.get("flops", 0), f"{where}: flops")
        if flops <= 0 or m <= 0:
            raise SpecError(f"{where}: a {kind} layer needs flops > 0 and an output shape")
        fields.update(gemm_m=m, gemm_n=n, gemm_k=flops / (2 * m * n))
    if kind == "norm" and not fields.get("channels") and out_shape is not None:
        fields["channels"] = out_shape[1]
    _traced_agree(fields, extra, where)


def _traced_agree(fields: Mapping[str, Any], extra: Mapping[str, Any], where: str) -> None:
    """The tracer's other numbers (validation.cnn_graph: in_channels and kernel_size of a conv,
    in_features of a linear layer, weight_bytes) are whole and positive, and agree with the
    sizes they imply: a linear layer's gemm_k is in_features, a conv's at most in_channels x
    its kernel area (less with groups), weight_bytes 4 per parameter (fp32). Read and dropped
    unchecked before 2026-12-07."""
    def whole(key: str, value: Any) -> float:
        return float(_TRACED_COUNT.check(value, f"{where}: {key}"))

    numbers = {key: whole(key, extra[key]) for key in ("in_channels", "in_features")
               if key in extra}
    area = 1.0
    if "kernel_size" in extra:
        raw = extra["kernel_size"]
        dims = raw if isinstance(raw, (list, tuple)) and raw else [raw]
        for d in dims:
            area *= whole("kernel_size", d)
    kind, k = fields.get("kind"), float(fields.get("gemm_k") or 0)
    if kind == "linear" and "in_features" in numbers and k:
        _agree(numbers["in_features"], k, f"{where}: in_features", f"gemm_k {k:g}")
    if kind == "conv" and "in_channels" in numbers and k \
            and k > numbers["in_channels"] * area * (1 + SIZE_TOLERANCE):
        raise SpecError(f"{where}: gemm_k {k:g} is more than in_channels "
                        f"{numbers['in_channels']:g} x kernel area {area:g}: a conv reduces "
                        "over its input channels (of a group) and its kernel")
    if "weight_bytes" in extra:
        weight = BOUNDS["params"].check(extra["weight_bytes"], f"{where}: weight_bytes")
        params = float(fields.get("params") or 0)
        if params:
            _agree(weight, 4 * params, f"{where}: weight_bytes", f"4 x params {params:g}")

