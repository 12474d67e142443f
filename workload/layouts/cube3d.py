"""3D tensor parallelism (Agarwal et al. 1995; Bian et al. 2021, "Maximizing Parallelism in
Distributed Training for Huge Neural Networks"; Colossal-AI's Linear3D), q x q x q mesh with axes
("c", "a", "b"), c outermost.

A linear layer Y = X W (X: N x K, W: K x M) is given three roles, a permutation of the axes: the
input axis a, the weight axis w and the output axis o; (p_a, p_w, p_o) are the process's
coordinates on them. Layout (fp32, bytes per process):

  X piece  rows p_w*N/q + p_a*N/q^2 .. (N/q^2 rows), cols block p_o of K/q      N K / q^3 elements
  W piece  rows p_o*K/q + p_w*K/q^2 .. (K/q^2 rows), cols block p_a of M/q      K M / q^3
  Y piece  rows p_w*N/q + p_o*N/q^2 .. (N/q^2 rows), cols block p_a of M/q      N M / q^3

  forward   all_gather X on a      -> X block (N/q x K/q)        nbytes = N K / q^2 * 4
            all_gather W on w      -> W block (K/q x M/q)        nbytes = K M / q^2 * 4
            reduce_scatter X W on o  (the sum over K blocks)     nbytes = N M / q^2 * 4 (input)
  backward  all_gather dY on o                                   nbytes = N M / q^2 * 4
            reduce_scatter dY W^T on a                           nbytes = N K / q^2 * 4 (input)
            reduce_scatter X^T dY on w                           nbytes = K M / q^2 * 4 (input)
  (the gathered X and W blocks are kept from forward to backward, as Colossal-AI does)

Y's layout is X's with a and o swapped, so consecutive linears swap the input and output axes
(Colossal-AI's swap_in_out_group): QKV and MLP-up run with (a, w, o) = (a, c, b), the attention
output and MLP-down with (b, c, a); the weight axis is always c, the outermost mesh dim (the
weights, K M / q^2, are the smallest messages when tokens outnumber the hidden size, so they take
the axis most likely to cross nodes). The block's input and output share one layout, L0: rows
p_c*N/q + p_a*N/q^2 (whole samples: b divisible by q^2), hidden block p_b. After QKV (layout L1)
each process holds whole samples and the heads of column block p_a, so attention is local.
LayerNorm in L0: statistics all-reduced on b (2 N/q^2 elements forward and backward); gamma and
beta (hidden block p_b, replicated over a and c) have their gradients all-reduced on a and on c
(2 h/q elements each).
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

AXES = ("c", "a", "b")
ROLES = {
    "qkv": ("a", "c", "b"),
    "up": ("a", "c", "b"),
    "proj": ("b", "c", "a"),
    "down": ("b", "c", "a"),
}


class _Linear3D(Function):
    @staticmethod
    def forward(ctx, x, w, grid, roles, tag):
        a, wa, o = roles
        ctx.grid, ctx.roles, ctx.tag = grid, roles, tag
        xg = grid.all_gather(x, a, "fwd", tag)
        wg = grid.all_gather(w, wa, "fwd", tag)
        ctx.save_for_backward(xg, wg)
        return grid.reduce_scatter(xg @ wg, o, "fwd", tag)

    @staticmethod
    def backward(ctx, dy):
        xg, wg = ctx.saved_tensors
        grid, (a, wa, o), tag = ctx.grid, ctx.roles, ctx.tag
        dyg = grid.all_gather(dy.contiguous(), o, "bwd", tag)
        dx = grid.reduce_scatter(dyg @ wg.t(), a, "bwd", tag)
        dw = grid.reduce_scatter(xg.t() @ dyg, wa, "bwd", tag)
        return dx, dw, None, None, None


def linear3d(
    x: torch.Tensor, w: torch.Tensor, grid: Grid, roles: tuple[str, str, str], tag: str
) -> torch.Tensor:
    """The local Y piece of Y = X W; x and w are the local pieces described in the docstring."""
    return _Linear3D.apply(x, w, grid, roles, tag)


def check_dims(dims: BlockDims, q: int) -> None:
    dims.require("batch", q * q, f"whole samples per process, q^2 = {q * q}")
    dims.require("heads", q, f"a contiguous set of heads per column block, q = {q}")
    dims.require("hidden", q * q, f"weight pieces of hidden/q^2 rows, q^2 = {q * q}")
    dims.require("ffn", q * q, f"weight pieces of ffn/q^2 rows, q^2 = {q * q}")


class Block3D(nn.Module):
    """RefBlock split over a q x q x q mesh; input and output are L0 pieces (b/q^2, s, h/q)."""

    def __init__(self, grid: Grid, ref: RefBlock) -> None:
        super().__init__()
        q = grid.size["a"]
        if grid.axes != AXES or any(grid.size[a] != q for a in AXES):
            raise PlanError(f"3D needs a cubic mesh with axes {AXES}, got {grid.size}")
        check_dims(ref.dims, q)
        self.grid, self.dims, self.q = grid, ref.dims, q
        h = ref.dims.hidden
        pb = grid.coord["b"]
        cols = slice(pb * h // q, (pb + 1) * h // q)
        self.ln1 = SplitLayerNorm(grid, ref.ln1, cols, "b", ("a", "c"), "ln1")
        self.ln2 = SplitLayerNorm(grid, ref.ln2, cols, "b", ("a", "c"), "ln2")
        self.w = nn.ParameterDict(
            {
                n: nn.Parameter(self.local(weight_km(getattr(ref, n).weight.detach(), n, q), n))
                for n in LINEARS
            }
        )

    def local(self, w_km: torch.Tensor, name: str) -> torch.Tensor:
        """The W piece of this process for the linear `name`."""
        a, wa, o = (self.grid.coord[r] for r in ROLES[name])
        q = self.q
        r, c = w_km.shape[0] // (q * q), w_km.shape[1] // q
        row0 = o * q * r + wa * r
        return w_km[row0 : row0 + r, a * c : (a + 1) * c].clone()

    def shard_input(self, x: torch.Tensor) -> torch.Tensor:
        """The L0 piece of a full (b, s, h) activation."""
        q, pa, pb, pc = self.q, self.grid.coord["a"], self.grid.coord["b"], self.grid.coord["c"]
        b, h = x.shape[0] // (q * q), x.shape[2] // q
        b0 = pc * q * b + pa * b
        return x[b0 : b0 + b, :, pb * h : (pb + 1) * h].contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, hq = x.shape

        def lin(t: torch.Tensor, name: str) -> torch.Tensor:
            return linear3d(t.reshape(-1, t.shape[-1]), self.w[name], self.grid, ROLES[name], name)

        qkv = lin(self.ln1(x), "qkv")  # L1: (b s) x 3h/q, whole samples, heads block p_a
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
                    lambda t, n=n: self.local(weight_km(t, n, self.q), n),
                )
            )
        for ln in ("ln1", "ln2"):
            mine, theirs = getattr(self, ln), getattr(ref, ln)
            for p in ("weight", "bias"):
                out.append(
                    (f"{ln}.{p}", getattr(mine, p), getattr(theirs, p), lambda t, c=mine.cols: t[c])
                )
        return out
