"""Communication and compute of one linear layer Y = X W under the 2D, 2.5D and 3D tensor layouts.

X is N x K (N tokens of a micro-batch), W is K x M. The tensor-parallel group is a grid with
sub-axes a, b, c (a innermost) of q_a, q_b, q_c ranks. Every collective below is issued by every
rank of the grid; `nbytes` follows nccl-tests (output of all_gather, input of reduce_scatter, the
buffer of broadcast/reduce/all_reduce). e is bytes per element.

2D, SUMMA / Optimus (Xu et al. 2021, arXiv 2104.05343), q x q grid, q_a = q_b = q, q_c = 1; 2.5D,
Tesseract (Wang et al. 2021, arXiv 2105.14500), the same on each of d = q_c stacked grids that split
the tokens, weights replicated over the depth:
  forward : q broadcasts of an X block (N/(q d) x K/q) along a, q broadcasts of a W block
            (K/q x M/q) along b; q GEMMs (N/(q d) x K/q) @ (K/q x M/q)
  backward: dX = dY W^T: q broadcasts of a W block along b and q reduces of a dX block along a;
            dW = X^T dY: q broadcasts of an X block along a and q reduces of a dW block along b;
            2.5D: the weight gradient block is all-reduced over the depth c.
3D (Bian et al. 2021, arXiv 2105.14450), q x q x q cube, q_a = q_b = q_c = q:
  forward : all-gather the input block along a (N K / q^2 gathered), all-gather the weight block
            along c (K M / q^2 gathered), one GEMM (N/q x K/q) @ (K/q x M/q), reduce-scatter the
            output along b (N M / q^2 in, N M / q^3 out)
  backward: all-gather dY along b (N M / q^2), reduce-scatter dX along a (N K / q^2) and dW along c
            (K M / q^2).
Layer norms over a hidden dimension split along a all-reduce their mean and variance (fp32, 2 per
token) along a, forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from perfmodel.costs.compute import Flag, Gemm, as_flag


@dataclass(frozen=True)
class GridComm:
    """`count` collectives `op` of `nbytes` along grid sub-axis `axis` ("tpa", "tpb", "tpc")."""

    axis: str
    op: str
    phase: str  # fwd or bwd
    count: sp.Expr
    nbytes: sp.Expr


def linear_shapes(h: sp.Expr, a: sp.Expr, kv: sp.Expr, f: sp.Expr, gated: Flag,
                  d: sp.Expr | None = None) -> list[tuple[str, sp.Expr, sp.Expr]]:
    """(name, K, M) of the four linear layers of a transformer layer (d: head size, default h/a;
    the queries and the attention output are a*d wide)."""
    d = h / a if d is None else d
    return [("qkv", h, a * d + 2 * kv * d), ("attention_output", a * d, h),
            ("mlp_up", h, (1 + as_flag(gated)) * f), ("mlp_down", f, h)]


def summa_gemm(name: str, N: sp.Expr, K: sp.Expr, M: sp.Expr, q: sp.Expr, depth: sp.Expr) -> Gemm:
    """The q SUMMA steps of one rank: (N/(q d) x K/q) @ (K/q x M/q), q times."""
    return Gemm(name, N / (q * depth), M / q, K / q, batch=q)


def cube_gemm(name: str, N: sp.Expr, K: sp.Expr, M: sp.Expr, q: sp.Expr) -> Gemm:
    """The one GEMM of a rank of the cube: (N/q x K/q) @ (K/q x M/q)."""
    return Gemm(name, N / q, M / q, K / q)


def grid_gemms(name: str, N: sp.Expr, K: sp.Expr, M: sp.Expr, qa: sp.Expr,
               qc: sp.Expr) -> dict[str, Gemm]:
    """A linear layer's GEMM on one rank of each grid layout: {"2d": SUMMA (2.5D with depth qc),
    "3d": the cube}; qa, qc: the grid's first and third axes (perfmodel.evaluate.grid_degrees)."""
    return {"2d": summa_gemm(name, N, K, M, qa, qc), "3d": cube_gemm(name, N, K, M, qa)}


def summa_comm(N: sp.Expr, K: sp.Expr, M: sp.Expr, e: sp.Expr, q: sp.Expr,
               depth: sp.Expr) -> list[GridComm]:
    x_block = e * N * K / (q * q * depth)
    w_block = e * K * M / (q * q)
    return [
        GridComm("tpa", "broadcast", "fwd", q, x_block),
        GridComm("tpb", "broadcast", "fwd", q, w_block),
        GridComm("tpb", "broadcast", "bwd", q, w_block),
        GridComm("tpa", "reduce", "bwd", q, x_block),
        GridComm("tpa", "broadcast", "bwd", q, x_block),
        GridComm("tpb", "reduce", "bwd", q, w_block),
        GridComm("tpc", "all_reduce", "bwd", sp.Integer(1), w_block),
    ]


def cube_comm(N: sp.Expr, K: sp.Expr, M: sp.Expr, e: sp.Expr, q: sp.Expr,
              swapped: bool = False) -> list[GridComm]:
    """Weights (K M) travel along c, the outermost sub-axis (the one most likely to cross nodes;
    the smallest tensors when tokens outnumber the hidden size); activations along a and b. The
    input axis is a and the output axis b for the QKV and MLP-up projections, and the other way
    round (`swapped`) for the attention-output and MLP-down projections, so that each layer's
    output lies where the next layer reads it (as Colossal-AI's 3D linear alternates)."""
    one = sp.Integer(1)
    x_axis, y_axis = ("tpb", "tpa") if swapped else ("tpa", "tpb")
    return [
        GridComm(x_axis, "all_gather", "fwd", one, e * N * K / q**2),
        GridComm("tpc", "all_gather", "fwd", one, e * K * M / q**2),
        GridComm(y_axis, "reduce_scatter", "fwd", one, e * N * M / q**2),
        GridComm(y_axis, "all_gather", "bwd", one, e * N * M / q**2),
        GridComm(x_axis, "reduce_scatter", "bwd", one, e * N * K / q**2),
        GridComm("tpc", "reduce_scatter", "bwd", one, e * K * M / q**2),
    ]


def norm_comm(N: sp.Expr, rows_split: sp.Expr, axis: str) -> list[GridComm]:
    """Two layer norms per layer, forward and backward: all-reduce 2 fp32 values (mean and
    variance) per local token along the axis that splits the hidden dimension of their input."""
    nbytes = 2 * 4 * N / rows_split
    return [GridComm(axis, "all_reduce", "fwd", sp.Integer(2), nbytes),
            GridComm(axis, "all_reduce", "bwd", sp.Integer(2), nbytes)]


def norm_weight_grads(h: sp.Expr, q: sp.Expr, wbytes: sp.Expr, vectors: sp.Expr,
                      axes: tuple[str, ...]) -> list[GridComm]:
    """The norms' weight (and bias) gradients, split along the hidden dimension but computed from
    a slice of the tokens, are all-reduced over the axes that split the tokens: one call per norm
    (2 per layer) and axis, of `vectors` x h/q values."""
    return [GridComm(axis, "all_reduce", "bwd", sp.Integer(2), wbytes * vectors * h / q)
            for axis in axes]
