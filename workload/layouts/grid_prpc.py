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

A layer with fewer output features/channels (d_out) than Pr is split over c = min(Pr, d_out) of
the Pr processes (coordinates 0 .. c-1 on pr; the others hold none of it, and their pc group, all
non-holders, has no weight gradient to reduce). Its two collectives then have c contributors and
Pr receivers (Castelló et al. 2019; perfmodel --contributors), realised per the plan's
"contributors":
  standard     all_gather along pr of blocks padded to d_out/c (the non-holders send zeros)
                                                               nbytes = B/Pc * Pr * d_out/c * 4
               all_reduce along pr of dX (the non-holders add zeros)  nbytes = B/Pc * d_in * 4
  specialised  all_gather among the c holders (nbytes = B/Pc * d_out * 4) and all_reduce of dX
               among them, each followed by ceil(log2(Pr / c)) rounds of send_recv in which every
               holder sends the result to one process that lacks it (holder i to i + h, h = c,
               2c, ...)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Function

from perfmodel.errors import PlanError

from .comm import Grid, copy_to, gather, grad_all_reduce

AXES = ("pr", "pc")
CONTRIBUTORS = ("standard", "specialised")  # the realisations the job runs (not auto)


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


def degree(rows: int, pr: int, tag: str) -> int:
    """c = min(pr, rows): the processes a layer of `rows` output features/channels splits over."""
    c = min(pr, rows)
    if rows % c:
        raise PlanError(f"{tag}: {rows} output features/channels not divisible by pr = {pr}")
    return c


class GridLayer(nn.Module):
    """A Linear or Conv2d with its output features/channels split over the first c = min(pr,
    d_out) processes of pr, the batch over pc."""

    def __init__(
        self, grid: Grid, ref: nn.Linear | nn.Conv2d, tag: str, contributors: str = "standard"
    ) -> None:
        super().__init__()
        if contributors not in CONTRIBUTORS:
            raise PlanError(
                f"contributors must be one of {', '.join(CONTRIBUTORS)} for the job, got "
                f"{contributors!r}"
            )
        pr, i = grid.size["pr"], grid.coord["pr"]
        rows = ref.weight.shape[0]
        self.c = degree(rows, pr, tag)
        n = rows // self.c
        self.grid, self.tag, self.rows = grid, tag, rows
        # nn.Linear or nn.Conv2d: the convolution's attributes are read where self.conv
        self.ref: Any = ref
        self.specialised = contributors == "specialised" and self.c < pr
        self.holds = i < self.c
        self.conv = isinstance(ref, nn.Conv2d)
        self.first = False
        # a process beyond the first c holds an empty slice
        self.weight = nn.Parameter(ref.weight.detach()[i * n : (i + 1) * n].clone())
        assert ref.bias is not None, "the reference layers have biases"
        self.bias = nn.Parameter(ref.bias.detach()[i * n : (i + 1) * n].clone())
        if self.specialised and self.c > 1:
            grid.subgroup("pr", self.c)  # created by every rank, in layer order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, tag, c = self.grid, self.tag, self.c
        first = c if self.specialised else 0
        x = copy_to(x, g, "pr", tag, first)
        if self.holds:
            w, b = grad_all_reduce([self.weight, self.bias], g, ("pc",), tag)
            y = self._local(x, w, b)
        else:  # zeros of a block's shape (standard: the padding) or of none (specialised)
            block = 0 if first else self.rows // c
            y = _NoRows.apply(x, self.weight, self.bias, self._shape(x, block))
        if not first:
            if c == g.size["pr"]:
                return gather(y, g, "pr", 1, tag)
            return gather(y, g, "pr", 1, tag).narrow(1, 0, self.rows)  # drop the padding
        return _GatherFew.apply(y, g, c, self._shape(x, self.rows), tag)

    def _local(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.conv:
            r = self.ref
            return F.conv2d(x, w, b, r.stride, r.padding, r.dilation, r.groups)
        return F.linear(x, w, b)

    def _shape(self, x: torch.Tensor, width: int) -> tuple[int, ...]:
        """The shape of this layer's output for input x with `width` features/channels."""
        if not self.conv:
            return (x.shape[0], width)
        r, size = self.ref, []
        for d in (0, 1):
            k, s, p, dil = r.kernel_size[d], r.stride[d], r.padding[d], r.dilation[d]
            size.append((x.shape[2 + d] + 2 * p - dil * (k - 1) - 1) // s + 1)
        return (x.shape[0], width, *size)


class _NoRows(Function):
    """The output of a process that holds none of a layer: zeros of the given shape, still a
    function of the input and the (empty) parameters, so that backward reaches the collectives
    every process of the pr group takes part in; gradients of zeros."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape):
        ctx.save_for_backward(x, weight, bias)
        return x.new_zeros(shape)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        return torch.zeros_like(x), torch.zeros_like(weight), torch.zeros_like(bias), None


class _GatherFew(Function):
    """Specialised all-gather along pr with c contributors: all_gather among the c holders, then
    the spread to the others; backward keeps this process's slice (none off the holders)."""

    @staticmethod
    def forward(ctx, y, grid, c, shape, tag):
        i = grid.coord["pr"]
        ctx.slice = (i * y.shape[1], y.shape[1])
        if i < c:
            out = grid.all_gather(y.movedim(1, 0), "pr", "fwd", tag, first=c)
            out = out.movedim(0, 1).contiguous()
        else:
            out = y.new_empty(shape)
        return grid.spread(out, "pr", c, "fwd", tag)

    @staticmethod
    def backward(ctx, dout):
        start, width = ctx.slice
        return dout.narrow(1, start, width).contiguous(), None, None, None, None


class GridModel(nn.Module):
    """A Sequential reference with every Linear and Conv2d replaced by its GridLayer."""

    def __init__(self, grid: Grid, ref: nn.Sequential, contributors: str = "standard") -> None:
        super().__init__()
        self.grid = grid
        mods: list[nn.Module] = []
        for k, m in enumerate(ref):
            if isinstance(m, nn.Linear | nn.Conv2d):
                mods.append(GridLayer(grid, m, f"{k}:{type(m).__name__.lower()}", contributors))
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
        i = self.grid.coord["pr"]
        out: list[tuple[str, torch.Tensor, torch.Tensor, Any]] = []
        r: Any  # the reference's layer k (nn.Linear or nn.Conv2d)
        for k, m in enumerate(self.body):
            if isinstance(m, GridLayer):
                r = ref[k]
                n = r.weight.shape[0] // m.c  # none beyond the first c processes

                def rows(t: torch.Tensor, n: int = n) -> torch.Tensor:
                    return t[i * n : (i + 1) * n]

                out.append((f"{k}.weight", m.weight, r.weight, rows))
                out.append((f"{k}.bias", m.bias, r.bias, rows))
        return out
