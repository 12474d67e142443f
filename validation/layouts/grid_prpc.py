"""Pr x Pc grid: integrated model and batch parallelism (Gholami et al. 2018, "Integrated Model,
Batch and Domain Parallelism in Training Neural Networks", SPAA), mesh axes ("pr", "pc").

Process (i, j) holds rows i of every weight (d_out/Pr x d_in; for a convolution the filters
Cout/Pr) and the batch slice j (B/Pc samples, all input features). Per fully connected or
convolutional layer, with X_j the layer input (B/Pc x d_in) and Y the output:

  forward   Y_ij = X_j W_i^T (+ b_i)                               local
            all_gather along pr of Y_ij -> Y_j (B/Pc x d_out)      nbytes = B/Pc * d_out * 4
  backward  dX_j = dY_ij W_i, all_reduce along pr                  nbytes = B/Pc * d_in * 4
            (skipped for the first layer: its input needs no gradient)
            [dW_i, db_i] = [dY_ij^T X_j, sum dY_ij], one all_reduce along pc
                                                                   nbytes = (d_out/Pr)(d_in+1) * 4
For a convolution, d_out counts output channels x output pixels in the all-gather, d_in input
channels x input pixels in the input-gradient all-reduce, and the weight is Cout/Pr x Cin x k x k.
The gradient of the gathered output is the same on every process of a pr group (the layers after it
are computed redundantly there), so the all-gather's backward only keeps the local slice. Gradients
are sums over the batch (the reference loss is a sum). Pr = 1 is pure data parallelism, Pc = 1 pure
model parallelism.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from perfmodel.errors import PlanError

from .comm import Grid, copy_to, gather, grad_all_reduce

AXES = ("pr", "pc")


def reference_mlp(widths: tuple[int, ...], seed: int = 0) -> nn.Sequential:
    """Linear layers of the given widths with ReLU between them (none after the last)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if k < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def reference_cnn(
    channels: int = 3,
    image: int = 8,
    widths: tuple[int, int] = (8, 16),
    classes: int = 8,
    seed: int = 0,
) -> nn.Sequential:
    """conv3x3 - ReLU - maxpool2 - conv3x3 - ReLU - maxpool2 - flatten - linear."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(channels, widths[0], 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(widths[0], widths[1], 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(widths[1] * (image // 4) ** 2, classes),
    )


class GridLayer(nn.Module):
    """A Linear or Conv2d with its output features/channels split over pr, the batch over pc."""

    def __init__(self, grid: Grid, ref: nn.Linear | nn.Conv2d, tag: str) -> None:
        super().__init__()
        pr, i = grid.size["pr"], grid.coord["pr"]
        rows = ref.weight.shape[0]
        if rows % pr:
            raise PlanError(f"{tag}: {rows} output features/channels not divisible by pr = {pr}")
        n = rows // pr
        self.grid, self.tag, self.ref = grid, tag, ref
        self.conv = isinstance(ref, nn.Conv2d)
        self.first = False
        self.weight = nn.Parameter(ref.weight.detach()[i * n : (i + 1) * n].clone())
        self.bias = nn.Parameter(ref.bias.detach()[i * n : (i + 1) * n].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, tag = self.grid, self.tag
        x = copy_to(x, g, "pr", tag)
        w, b = grad_all_reduce([self.weight, self.bias], g, ("pc",), tag)
        if self.conv:
            c = self.ref
            y = F.conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups)
        else:
            y = F.linear(x, w, b)
        return gather(y, g, "pr", 1, tag)


class GridModel(nn.Module):
    """A Sequential reference with every Linear and Conv2d replaced by its GridLayer."""

    def __init__(self, grid: Grid, ref: nn.Sequential) -> None:
        super().__init__()
        self.grid = grid
        mods: list[nn.Module] = []
        for k, m in enumerate(ref):
            if isinstance(m, nn.Linear | nn.Conv2d):
                mods.append(GridLayer(grid, m, f"{k}:{type(m).__name__.lower()}"))
            else:
                mods.append(m)
        self.body = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def batch_slice(self, batch: int) -> slice:
        pc, j = self.grid.size["pc"], self.grid.coord["pc"]
        if batch % pc:
            raise PlanError(f"batch {batch} not divisible by pc = {pc}")
        n = batch // pc
        return slice(j * n, (j + 1) * n)

    def shard_pairs(self, ref: nn.Sequential) -> list[tuple[str, torch.Tensor, torch.Tensor, Any]]:
        """(name, local parameter, reference parameter, reference tensor -> the slice held here)."""
        pr, i = self.grid.size["pr"], self.grid.coord["pr"]
        out = []
        for k, m in enumerate(self.body):
            if isinstance(m, GridLayer):
                r = ref[k]
                n = r.weight.shape[0] // pr

                def rows(t: torch.Tensor, n: int = n) -> torch.Tensor:
                    return t[i * n : (i + 1) * n]

                out.append((f"{k}.weight", m.weight, r.weight, rows))
                out.append((f"{k}.bias", m.bias, r.bias, rows))
        return out
