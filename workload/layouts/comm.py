"""A device mesh with named axes, the collectives the layouts issue on its sub-groups, their log.

Every collective goes through :class:`Grid`, which skips it on an axis of size 1 (nothing moves) and
otherwise records one :class:`CommRecord`: the op, the mesh axis whose group it runs on (the group
of the processes that differ only in that axis's coordinate), the phase (``fwd``/``bwd``), the layer
tag and the bytes. ``nbytes`` follows nccl-tests (and perfmodel.costs.collectives): the tensor size
for broadcast, reduce and all_reduce, the gathered output for all_gather, the input before the
scatter for reduce_scatter. With ``CommLog(timed=True)`` each collective is preceded by a barrier on
its group and its wall time is recorded (a probe step; the barriers perturb forward and backward,
so those are timed in steps without probing).

The autograd Functions used by more than one layout live here: ``copy_to`` (identity forward,
all-reduce backward: Megatron's f), ``gather`` (all-gather forward, slice backward: g),
``all_reduce_sum`` (all-reduce both ways, for LayerNorm statistics) and ``grad_all_reduce``
(identity forward, one all-reduce of the concatenated gradients backward, for replicated
parameters).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Function

from perfmodel.errors import PlanError


@dataclass(frozen=True)
class CommRecord:
    op: str  # broadcast | reduce | all_reduce | all_gather | reduce_scatter
    axis: str  # mesh axis whose group the collective runs on
    group_size: int
    phase: str  # fwd | bwd
    tag: str  # the layer, e.g. "attention/qkv"
    nbytes: int  # nccl-tests convention (see module docstring)
    seconds: float = 0.0


@dataclass
class CommLog:
    """Collectives issued by this process, in order; ``timed``: barrier + wall time for each."""

    timed: bool = False
    records: list[CommRecord] = field(default_factory=list)

    def clear(self) -> None:
        self.records.clear()

    def counts(self, steps: int = 1) -> list[dict[str, Any]]:
        """Per (tag, phase, op, axis, nbytes): calls per step and seconds per step."""
        agg: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0])
        for r in self.records:
            key = (r.tag, r.phase, r.op, r.axis, r.group_size, r.nbytes)
            agg[key][0] += 1
            agg[key][1] += r.seconds
        return [
            {
                "tag": k[0],
                "phase": k[1],
                "op": k[2],
                "axis": k[3],
                "group_size": k[4],
                "nbytes": k[5],
                "calls": v[0] / steps,
                "seconds": v[1] / steps,
            }
            for k, v in agg.items()
        ]

    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]


class Grid:
    """A DeviceMesh seen by one process: its coordinate and group along every named axis."""

    def __init__(self, mesh: Any, log: CommLog | None = None) -> None:
        self.mesh = mesh
        self.log = log if log is not None else CommLog()
        self.axes: tuple[str, ...] = tuple(mesh.mesh_dim_names)
        self.size = {a: mesh.size(k) for k, a in enumerate(self.axes)}
        self.coord = {a: mesh.get_local_rank(a) for a in self.axes}
        self.group = {a: mesh.get_group(a) for a in self.axes}
        self._subgroups: dict[tuple[str, int], Any] = {}

    @classmethod
    def build(cls, shape: tuple[int, ...], axes: tuple[str, ...], log: CommLog | None = None):
        """A mesh of ``shape`` over all ranks of the default process group (gloo on CPU)."""
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        n = 1
        for s in shape:
            n *= s
        if n != world:
            raise PlanError(
                f"mesh {dict(zip(axes, shape, strict=True))} needs {n} ranks, got {world}"
            )
        return cls(init_device_mesh("cpu", shape, mesh_dim_names=axes), log)

    def _src(self, axis: str, coord: int) -> int:
        return dist.get_global_rank(self.group[axis], coord)

    def _run(
        self, op: str, axis: str, phase: str, tag: str, nbytes: int, fn: Any, first: int = 0
    ) -> None:
        """fn() on the group of axis, or on the sub-group of its `first` processes."""
        group, size = (self.subgroup(axis, first), first) if first else (None, self.size[axis])
        t0 = 0.0
        if self.log.timed:
            dist.barrier(group=group or self.group[axis])
            t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0 if self.log.timed else 0.0
        self.log.records.append(CommRecord(op, axis, size, phase, tag, nbytes, dt))

    # --- the first c processes of an axis (contributors of a layer narrower than the axis) ------
    def subgroup(self, axis: str, first: int) -> Any:
        """The process group of the processes with coordinates 0 .. first-1 on axis (and this
        process's coordinates on the other axes). Every rank must call this first with the same
        (axis, first), in the same order: it creates the sub-groups of every line of the mesh."""
        key = (axis, first)
        if key not in self._subgroups:
            k = self.axes.index(axis)
            lines = self.mesh.mesh.movedim(k, -1).reshape(-1, self.size[axis])
            mine = None
            for line in lines.tolist():
                group = dist.new_group(line[:first])
                if dist.get_rank() in line[:first]:
                    mine = group
            self._subgroups[key] = mine
        return self._subgroups[key]

    def spread(self, t: torch.Tensor, axis: str, first: int, phase: str, tag: str) -> torch.Tensor:
        """In place: t from the processes with coordinates < first on axis to all the others of
        the group, the holders doubling every round (holder i sends to i + h, h = first, 2 first,
        ...): ceil(log2(size / first)) rounds, one send or receive of t per process and round.
        Every process of the group calls it."""
        n, i = self.size[axis], self.coord[axis]
        h = first
        while h < n:
            peer = i + h if i < h else i - h if i < 2 * h else None
            if peer is not None and peer < n:
                other = self._src(axis, peer)

                def move(other: int = other, send: bool = i < h) -> None:
                    (dist.send if send else dist.recv)(t, other)

                t0 = time.perf_counter()
                move()
                dt = time.perf_counter() - t0 if self.log.timed else 0.0
                self.log.records.append(
                    CommRecord("send_recv", axis, 2, phase, tag, _nbytes(t), dt)
                )
            h *= 2
        return t

    # --- plain collectives (no autograd) -----------------------------------------------------
    def broadcast(self, t: torch.Tensor, axis: str, src: int, phase: str, tag: str) -> torch.Tensor:
        """In place: t from the process with coordinate src on axis, to its whole group."""
        if self.size[axis] > 1:
            g, root = self.group[axis], self._src(axis, src)
            self._run(
                "broadcast",
                axis,
                phase,
                tag,
                _nbytes(t),
                lambda: dist.broadcast(t, src=root, group=g),
            )
        return t

    def reduce(self, t: torch.Tensor, axis: str, dst: int, phase: str, tag: str) -> torch.Tensor:
        """In place: the sum over the group lands in t on the process with coordinate dst."""
        if self.size[axis] > 1:
            g, root = self.group[axis], self._src(axis, dst)
            self._run(
                "reduce", axis, phase, tag, _nbytes(t), lambda: dist.reduce(t, dst=root, group=g)
            )
        return t

    def all_reduce(
        self, t: torch.Tensor, axis: str, phase: str, tag: str, first: int = 0
    ) -> torch.Tensor:
        """In place; with `first`, among the processes with coordinates < first (members only)."""
        if (first or self.size[axis]) > 1:
            g = self.subgroup(axis, first) if first else self.group[axis]
            self._run(
                "all_reduce",
                axis,
                phase,
                tag,
                _nbytes(t),
                lambda: dist.all_reduce(t, group=g),
                first,
            )
        return t

    def all_gather(
        self, t: torch.Tensor, axis: str, phase: str, tag: str, first: int = 0
    ) -> torch.Tensor:
        """Concatenate along dim 0, in coordinate order; with `first`, among the processes with
        coordinates < first (members only)."""
        n = first or self.size[axis]
        if n == 1:
            return t
        t = t.contiguous()
        out = t.new_empty((n * t.shape[0], *t.shape[1:]))
        g = self.subgroup(axis, first) if first else self.group[axis]
        self._run(
            "all_gather",
            axis,
            phase,
            tag,
            _nbytes(out),
            lambda: _ALL_GATHER(out, t, group=g),
            first,
        )
        return out

    def reduce_scatter(self, t: torch.Tensor, axis: str, phase: str, tag: str) -> torch.Tensor:
        """Sum over the group, then keep the dim-0 chunk of this process's coordinate."""
        n = self.size[axis]
        if n == 1:
            return t
        t = t.contiguous()
        if t.shape[0] % n:
            raise PlanError(f"reduce_scatter of {tuple(t.shape)} over {n} processes along dim 0")
        out = t.new_empty((t.shape[0] // n, *t.shape[1:]))
        g = self.group[axis]
        self._run(
            "reduce_scatter", axis, phase, tag, _nbytes(t), lambda: _REDUCE_SCATTER(out, t, group=g)
        )
        return out


# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor (same semantics).
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# --- autograd Functions shared by the layouts ------------------------------------------------


class _CopyTo(Function):
    @staticmethod
    def forward(ctx, x, grid, axis, tag, first):
        ctx.grid, ctx.axis, ctx.tag, ctx.first = grid, axis, tag, first
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        g, axis, first = ctx.grid, ctx.axis, ctx.first
        dx = dx.contiguous().clone()
        if not first:
            return g.all_reduce(dx, axis, "bwd", ctx.tag), None, None, None, None
        if g.coord[axis] < first:
            g.all_reduce(dx, axis, "bwd", ctx.tag, first=first)  # nothing to do when first = 1
        return g.spread(dx, axis, first, "bwd", ctx.tag), None, None, None, None


def copy_to(x: torch.Tensor, grid: Grid, axis: str, tag: str, first: int = 0) -> torch.Tensor:
    """Identity forward; backward all-reduces the (partial) input gradient along axis. With
    `first`, only the processes with coordinates < first contribute: they all-reduce among
    themselves, then spread the sum to the others (a specialised all-reduce)."""
    return _CopyTo.apply(x, grid, axis, tag, first)


class _Gather(Function):
    @staticmethod
    def forward(ctx, y, grid, axis, dim, tag):
        ctx.grid, ctx.axis, ctx.dim = grid, axis, dim
        ctx.width = y.shape[dim]
        out = grid.all_gather(y.movedim(dim, 0), axis, "fwd", tag)
        return out.movedim(0, dim).contiguous()

    @staticmethod
    def backward(ctx, dout):
        i = ctx.grid.coord[ctx.axis]
        return dout.narrow(ctx.dim, i * ctx.width, ctx.width).contiguous(), None, None, None, None


def gather(y: torch.Tensor, grid: Grid, axis: str, dim: int, tag: str) -> torch.Tensor:
    """All-gather forward (concatenate along dim in coordinate order); backward keeps this process's
    slice, without communication (the gradient of the gathered tensor is the same on every process
    of the group, since everything after it is computed redundantly there)."""
    if grid.size[axis] == 1:
        return y
    return _Gather.apply(y, grid, axis, dim % y.dim(), tag)


class _AllReduceSum(Function):
    @staticmethod
    def forward(ctx, x, grid, axis, tag):
        ctx.grid, ctx.axis, ctx.tag = grid, axis, tag
        return grid.all_reduce(x.contiguous().clone(), axis, "fwd", tag)

    @staticmethod
    def backward(ctx, dy):
        return (
            ctx.grid.all_reduce(dy.contiguous().clone(), ctx.axis, "bwd", ctx.tag),
            None,
            None,
            None,
        )


def all_reduce_sum(x: torch.Tensor, grid: Grid, axis: str, tag: str) -> torch.Tensor:
    """Sum over the group of axis; the backward sums the output gradients the same way."""
    if grid.size[axis] == 1:
        return x
    return _AllReduceSum.apply(x, grid, axis, tag)


class _GradAllReduce(Function):
    @staticmethod
    def forward(ctx, grid, axes, tag, *params):
        ctx.grid, ctx.axes, ctx.tag = grid, axes, tag
        ctx.shapes = [p.shape for p in params]
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx, *grads):
        flat = torch.cat([g.reshape(-1) for g in grads])
        for axis in ctx.axes:
            ctx.grid.all_reduce(flat, axis, "bwd", ctx.tag)
        out, k = [], 0
        for shape in ctx.shapes:
            n = shape.numel()
            out.append(flat[k : k + n].view(shape))
            k += n
        return (None, None, None, *out)


def grad_all_reduce(
    params: list[torch.Tensor], grid: Grid, axes: tuple[str, ...], tag: str
) -> list[torch.Tensor]:
    """Identity forward on parameters replicated along axes; backward sums their gradients over
    those axes with one all-reduce per axis of the concatenated gradients (fired when autograd
    reaches them, as a data-parallel bucket would)."""
    axes = tuple(a for a in axes if grid.size[a] > 1)
    if not axes:
        return list(params)
    return list(_GradAllReduce.apply(grid, axes, tag, *params))
