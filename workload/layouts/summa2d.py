"""2D tensor parallelism with SUMMA (van de Geijn and Watts 1997) as in Optimus (Xu et al. 2021,
"An Efficient 2D Method for Training Super-Large Deep Learning Models", IPDPS), q x q mesh with
axes ("row", "col"); process (i, j) has coordinate i on "row" and j on "col".

An axis names the group the collective runs on: on axis "col" the q processes (i, 0..q-1) that
share row i (the "row group"), on axis "row" the processes (0..q-1, j) that share column j.

Y = X W, X (N x K), W (K x M), process (i, j) holds the blocks X_ij (N/q x K/q), W_ij (K/q x M/q)
and produces Y_ij (N/q x M/q). Per linear layer and process, bytes for fp32:

  forward   for t in 0..q-1:  broadcast X_it on "col" from (i, t)     N K / q^2 * 4 bytes
                              broadcast W_tj on "row" from (t, j)     K M / q^2 * 4 bytes
                              Y_ij += X_it W_tj
  backward  dX_it = sum_j dY_ij W_tj^T:
              for t: broadcast W_tj on "row" from (t, j)              K M / q^2 * 4 bytes
                     reduce dY_ij W_tj^T on "col" to (i, t)           N K / q^2 * 4 bytes
            dW_tj = sum_i X_it^T dY_ij:
              for t: broadcast X_it on "col" from (i, t)              N K / q^2 * 4 bytes
                     reduce X_it^T dY_ij on "row" to (t, j)           K M / q^2 * 4 bytes
  i.e. q + q broadcasts forward; 2q broadcasts and 2q reduces backward.

In the transformer block N = b*s: row block i is b/q whole samples, and the hidden columns are split
so that column block j holds heads j*heads/q .. (j+1)*heads/q - 1 (the fused QKV output is
reordered so that its block j holds q, k and v of those heads). The attention core is local. The
LayerNorm statistics are all-reduced on "col" (2 N/q elements forward, the same backward), the
LayerNorm gamma and beta (held per column block, replicated over rows) have their gradients
all-reduced on "row" (2 h/q elements).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Function

from perfmodel.errors import PlanError

from .block import LINEARS, BlockDims, RefBlock, SplitLayerNorm, attention, weight_km
from .comm import Grid

AXES = ("row", "col")


class _Summa(Function):
    @staticmethod
    def forward(ctx, x, w, grid, tag):
        q, i, j = grid.size["row"], grid.coord["row"], grid.coord["col"]
        ctx.grid, ctx.tag = grid, tag
        ctx.save_for_backward(x, w)
        y = x.new_zeros((x.shape[0], w.shape[1]))
        for t in range(q):
            xt = x.clone() if j == t else torch.empty_like(x)
            grid.broadcast(xt, "col", t, "fwd", tag)
            wt = w.clone() if i == t else torch.empty_like(w)
            grid.broadcast(wt, "row", t, "fwd", tag)
            y += xt @ wt
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        grid, tag = ctx.grid, ctx.tag
        q, i, j = grid.size["row"], grid.coord["row"], grid.coord["col"]
        dy = dy.contiguous()
        dx = dw = None
        for t in range(q):  # dX_it = sum_j dY_ij W_tj^T, reduced to (i, t)
            wt = w.clone() if i == t else torch.empty_like(w)
            grid.broadcast(wt, "row", t, "bwd", tag)
            part = grid.reduce(dy @ wt.t(), "col", t, "bwd", tag)
            if j == t:
                dx = part
        for t in range(q):  # dW_tj = sum_i X_it^T dY_ij, reduced to (t, j)
            xt = x.clone() if j == t else torch.empty_like(x)
            grid.broadcast(xt, "col", t, "bwd", tag)
            part = grid.reduce(xt.t() @ dy, "row", t, "bwd", tag)
            if i == t:
                dw = part
        return dx, dw, None, None


def summa(x: torch.Tensor, w: torch.Tensor, grid: Grid, tag: str) -> torch.Tensor:
    """Y_ij of Y = X W on a q x q mesh; x: X_ij (N/q x K/q), w: W_ij (K/q x M/q)."""
    return _Summa.apply(x, w, grid, tag)


def check_dims(dims: BlockDims, q: int) -> None:
    dims.require("batch", q, f"row blocks of whole samples, q = {q}")
    dims.require("heads", q, f"a contiguous set of heads per column block, q = {q}")
    dims.require("ffn", q, f"column blocks of the MLP, q = {q}")


class Block2D(nn.Module):
    """RefBlock split over a q x q mesh; input and output are the blocks x_ij (b/q, s, h/q)."""

    def __init__(self, grid: Grid, ref: RefBlock) -> None:
        super().__init__()
        q = grid.size["row"]
        if grid.axes != AXES or grid.size["col"] != q:
            raise PlanError(f"2D needs a square mesh with axes {AXES}, got {grid.size}")
        check_dims(ref.dims, q)
        self.grid, self.dims, self.q = grid, ref.dims, q
        i, j = grid.coord["row"], grid.coord["col"]
        h = ref.dims.hidden
        cols = slice(j * h // q, (j + 1) * h // q)
        self.ln1 = SplitLayerNorm(grid, ref.ln1, cols, "col", ("row",), "ln1")
        self.ln2 = SplitLayerNorm(grid, ref.ln2, cols, "col", ("row",), "ln2")
        self.w = nn.ParameterDict(
            {
                n: nn.Parameter(self.local(weight_km(getattr(ref, n).weight.detach(), n, q)))
                for n in LINEARS
            }
        )
        self.i, self.j = i, j

    def local(self, w_km: torch.Tensor) -> torch.Tensor:
        """Block (i, j) of a K x M matrix."""
        i, j, q = self.grid.coord["row"], self.grid.coord["col"], self.grid.size["row"]
        r, c = w_km.shape[0] // q, w_km.shape[1] // q
        return w_km[i * r : (i + 1) * r, j * c : (j + 1) * c].clone()

    def shard_input(self, x: torch.Tensor) -> torch.Tensor:
        """Block (i, j) of a full (b, s, h) activation."""
        q = self.q
        b, h = x.shape[0] // q, x.shape[2] // q
        return x[self.i * b : (self.i + 1) * b, :, self.j * h : (self.j + 1) * h].contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, hq = x.shape
        n = b * s

        def lin(t: torch.Tensor, name: str) -> torch.Tensor:
            return summa(t.reshape(n, -1), self.w[name], self.grid, name)

        qkv = lin(self.ln1(x), "qkv")
        qh, kh, vh = (t.reshape(b, s, hq) for t in qkv.split(hq, -1))
        a = attention(qh, kh, vh, self.dims.heads // self.q)
        x = x + lin(a, "proj").view(b, s, hq)
        return x + lin(F.gelu(lin(self.ln2(x), "up")), "down").view(b, s, hq)

    def shard_pairs(self, ref: RefBlock) -> list[tuple[str, torch.Tensor, torch.Tensor, Any]]:
        """(name, local parameter, reference parameter, reference tensor -> the part held here)."""
        out: list[tuple[str, torch.Tensor, torch.Tensor, Any]] = []
        for n in LINEARS:
            out.append(
                (
                    n,
                    self.w[n],
                    getattr(ref, n).weight,
                    lambda t, n=n: self.local(weight_km(t, n, self.q)),
                )
            )
        for ln in ("ln1", "ln2"):
            mine, theirs = getattr(self, ln), getattr(ref, ln)
            for p in ("weight", "bias"):
                out.append(
                    (f"{ln}.{p}", getattr(mine, p), getattr(theirs, p), lambda t, c=mine.cols: t[c])
                )
        return out
