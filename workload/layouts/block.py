"""The transformer block the 2D and 3D layouts split, its single-process reference, and the pieces
they share: LayerNorm over a hidden dimension split across a group, the local attention core and
the fused-QKV column order that gives every process a contiguous set of heads.

Block (pre-norm, GPT-2 style, linears without bias, x of shape b x s x h):
    x = x + proj(attention(qkv(ln1(x))))      qkv: h -> 3h, proj: h -> h
    x = x + down(gelu(up(ln2(x))))            up: h -> ffn, down: ffn -> h
The attention core (causal scaled dot-product attention) and GELU are local: the layouts keep whole
sequences and whole heads on each process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from perfmodel.errors import PlanError

from .comm import Grid, all_reduce_sum, grad_all_reduce

LINEARS = ("qkv", "proj", "up", "down")


@dataclass(frozen=True, kw_only=True)
class BlockDims:
    batch: int
    seq: int
    hidden: int
    heads: int
    ffn: int

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "hidden", "heads", "ffn"):
            if getattr(self, name) < 1:
                raise PlanError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise PlanError(f"hidden {self.hidden} not divisible by heads {self.heads}")

    def require(self, name: str, divisor: int, why: str) -> None:
        value = getattr(self, name)
        if value % divisor:
            raise PlanError(f"{name} = {value} must be divisible by {divisor} ({why})")


class RefBlock(nn.Module):
    """The single-process reference."""

    def __init__(self, dims: BlockDims, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        h = dims.hidden
        self.dims = dims
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.ln2 = nn.LayerNorm(h)
        self.up = nn.Linear(h, dims.ffn, bias=False)
        self.down = nn.Linear(dims.ffn, h, bias=False)
        with torch.no_grad():  # not the identity, so that their gradients are tested too
            for ln in (self.ln1, self.ln2):
                ln.weight.normal_(1.0, 0.1)
                ln.bias.normal_(0.0, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, -1)
        a = attention(q, k, v, self.dims.heads)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal attention over heads contiguous in the last dim; q, k, v: (b, s, heads * d)."""
    b, s, width = q.shape
    d = width // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(b, s, heads, d).transpose(1, 2)

    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return y.transpose(1, 2).reshape(b, s, width)


def qkv_columns(hidden: int, blocks: int) -> torch.Tensor:
    """Column order of the fused QKV weight (h x 3h) for `blocks` column blocks: block j holds
    [q, k, v] of heads block j, so that a process holding column block j has whole heads."""
    w = hidden // blocks
    cols = []
    for j in range(blocks):
        for part in range(3):
            start = part * hidden + j * w
            cols.append(torch.arange(start, start + w))
    return torch.cat(cols)


def weight_km(weight: torch.Tensor, name: str, blocks: int) -> torch.Tensor:
    """A reference nn.Linear weight (M x K) as the K x M matrix W of Y = X W (QKV reordered)."""
    w = weight.t()
    if name == "qkv":
        w = w[:, qkv_columns(weight.shape[1], blocks)]
    return w


class SplitLayerNorm(nn.Module):
    """LayerNorm whose hidden dim is split over `stat_axis`: the sums of x and x^2 are all-reduced
    there (one all_reduce of 2 x tokens elements forward and one backward); gamma and beta are
    replicated over `replica_axes`, where their gradients are all-reduced (one all_reduce of
    2 x hidden/parts elements per axis)."""

    def __init__(
        self,
        grid: Grid,
        ref: nn.LayerNorm,
        cols: slice,
        stat_axis: str,
        replica_axes: tuple[str, ...],
        tag: str,
    ) -> None:
        super().__init__()
        self.grid, self.stat_axis, self.replica_axes, self.tag = grid, stat_axis, replica_axes, tag
        self.hidden, self.eps, self.cols = ref.normalized_shape[0], ref.eps, cols
        self.weight = nn.Parameter(ref.weight.detach()[cols].clone())
        self.bias = nn.Parameter(ref.bias.detach()[cols].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sums = torch.stack([x.sum(-1), (x * x).sum(-1)])
        sums = all_reduce_sum(sums, self.grid, self.stat_axis, self.tag)
        mean = sums[0] / self.hidden
        var = sums[1] / self.hidden - mean * mean
        w, b = grad_all_reduce([self.weight, self.bias], self.grid, self.replica_axes, self.tag)
        return (x - mean[..., None]) * torch.rsqrt(var + self.eps)[..., None] * w + b
