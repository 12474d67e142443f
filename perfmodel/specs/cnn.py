"""Layer graphs of classic networks, computed from their definitions (no torch needed).

AlexNet (Krizhevsky et al. 2012; the single-tower variant of torchvision, 61.1M parameters),
VGG-16 (Simonyan & Zisserman 2015, configuration D, 138.4M), ResNet-50 (He et al. 2016, 25.6M),
and plain MLPs. FLOPs count a multiply-add as 2.
"""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.specs.layers import LayerGraphSpec, LayerSpec


class _Builder:
    def __init__(self, channels: int, height: int, width: int) -> None:
        self.c, self.h, self.w = channels, height, width
        self.layers: list[LayerSpec] = []

    @property
    def size(self) -> int:
        return self.c * self.h * self.w

    def conv(self, name: str, out: int, kernel: int, stride: int = 1, pad: int = 0,
             bias: bool = True) -> None:
        h = (self.h + 2 * pad - kernel) // stride + 1
        w = (self.w + 2 * pad - kernel) // stride + 1
        k = self.c * kernel * kernel
        self.layers.append(LayerSpec(
            name=name, kind="conv", params=k * out + (out if bias else 0),
            flops=2.0 * h * w * k * out, in_elements=self.size, out_elements=out * h * w,
            gemm_m=h * w, gemm_n=out, gemm_k=k))
        self.c, self.h, self.w = out, h, w

    def pool(self, name: str, kernel: int, stride: int, pad: int = 0) -> None:
        h = (self.h + 2 * pad - kernel) // stride + 1
        w = (self.w + 2 * pad - kernel) // stride + 1
        before = self.size
        self.c, self.h, self.w = self.c, h, w
        self.layers.append(LayerSpec(name=name, kind="pool",
                                     flops=float(self.size * kernel * kernel),
                                     in_elements=before, out_elements=self.size))

    def act(self, name: str) -> None:
        self.layers.append(LayerSpec(name=name, kind="activation", flops=float(self.size),
                                     in_elements=self.size, out_elements=self.size))

    def norm(self, name: str) -> None:
        self.layers.append(LayerSpec(name=name, kind="norm", params=2.0 * self.c,
                                     flops=4.0 * self.size, in_elements=self.size,
                                     out_elements=self.size, channels=self.c))

    def linear(self, name: str, out: int, bias: bool = True) -> None:
        k = self.size
        self.layers.append(LayerSpec(
            name=name, kind="linear", params=k * out + (out if bias else 0), flops=2.0 * k * out,
            in_elements=k, out_elements=out, gemm_m=1, gemm_n=out, gemm_k=k))
        self.c, self.h, self.w = out, 1, 1

    def graph(self, name: str, shape: tuple[int, ...], source: str) -> LayerGraphSpec:
        return LayerGraphSpec(name=name, input_shape=shape, layers=tuple(self.layers),
                              source=source)


def alexnet(classes: int = 1000) -> LayerGraphSpec:
    """torchvision's AlexNet (one tower), 224 x 224 input."""
    b = _Builder(3, 224, 224)
    for i, (out, kernel, stride, pad, pool) in enumerate(
            [(64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
             (256, 3, 1, 1, False), (256, 3, 1, 1, True)], start=1):
        b.conv(f"conv{i}", out, kernel, stride, pad)
        b.act(f"relu{i}")
        if pool:
            b.pool(f"pool{i}", 3, 2)
    b.pool("avgpool", 1, 1)  # adaptive 6 x 6: already 6 x 6
    for i, out in enumerate((4096, 4096), start=6):
        b.linear(f"fc{i}", out)
        b.act(f"relu{i}")
    b.linear("fc8", classes)
    return b.graph("alexnet", (3, 224, 224), "Krizhevsky et al. 2012; torchvision alexnet")


def vgg16(classes: int = 1000) -> LayerGraphSpec:
    """VGG-16 (configuration D), 224 x 224 input."""
    b = _Builder(3, 224, 224)
    blocks = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    for bi, (out, convs) in enumerate(blocks, start=1):
        for ci in range(1, convs + 1):
            b.conv(f"conv{bi}_{ci}", out, 3, 1, 1)
            b.act(f"relu{bi}_{ci}")
        b.pool(f"pool{bi}", 2, 2)
    for i, out in enumerate((4096, 4096), start=6):
        b.linear(f"fc{i}", out)
        b.act(f"relu{i}")
    b.linear("fc8", classes)
    return b.graph("vgg16", (3, 224, 224), "Simonyan & Zisserman 2015, Table 1, configuration D")


def resnet50(classes: int = 1000) -> LayerGraphSpec:
    """ResNet-50 (bottleneck blocks 3-4-6-3), 224 x 224 input, batch norm after every conv."""
    b = _Builder(3, 224, 224)
    b.conv("conv1", 64, 7, 2, 3, bias=False)
    b.norm("bn1")
    b.act("relu1")
    b.pool("maxpool", 3, 2, 1)
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                     (512, 3, 2)], start=1):
        for block in range(blocks):
            s = stride if block == 0 else 1
            c_in, h_in, w_in = b.c, b.h, b.w
            p = f"layer{stage}.{block}"
            b.conv(f"{p}.conv1", width, 1, 1, 0, bias=False)
            b.norm(f"{p}.bn1")
            b.act(f"{p}.relu1")
            b.conv(f"{p}.conv2", width, 3, s, 1, bias=False)
            b.norm(f"{p}.bn2")
            b.act(f"{p}.relu2")
            b.conv(f"{p}.conv3", width * 4, 1, 1, 0, bias=False)
            b.norm(f"{p}.bn3")
            if block == 0:  # projection shortcut
                c_out, h_out, w_out = b.c, b.h, b.w
                b.c, b.h, b.w = c_in, h_in, w_in
                b.conv(f"{p}.downsample", width * 4, 1, s, 0, bias=False)
                b.norm(f"{p}.downsample_bn")
                assert (b.c, b.h, b.w) == (c_out, h_out, w_out)
            b.layers.append(LayerSpec(name=f"{p}.add", kind="add", flops=float(b.size),
                                      in_elements=2.0 * b.size, out_elements=b.size))
            b.act(f"{p}.relu3")
    b.pool("avgpool", b.h, 1)
    b.linear("fc", classes)
    return b.graph("resnet50", (3, 224, 224), "He et al. 2016, Table 1 (50-layer)")


def mlp(widths: tuple[int, ...] = (4096, 4096, 4096, 4096, 1000),
        inputs: int = 4096) -> LayerGraphSpec:
    b = _Builder(inputs, 1, 1)
    for i, out in enumerate(widths, start=1):
        b.linear(f"fc{i}", out)
        if i < len(widths):
            b.act(f"relu{i}")
    return b.graph("mlp", (inputs,), "a fully connected network")


BUILDERS: dict[str, Callable[[], LayerGraphSpec]] = {"alexnet": alexnet, "vgg16": vgg16,
                                                     "resnet50": resnet50, "mlp": mlp}
