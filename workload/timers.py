"""What a rank measures: a synchronised clock, every collective (counted, and timed in probe steps),
peak memory.

Tensor-parallel communication cannot be separated from forward and backward without changing
them, so probe steps run under a dispatch mode that waits on and times every collective, and
counts it with its bytes (the same counter serves ``--dry-run``). Peak memory:
``torch.cuda.max_memory_allocated`` on GPU. On CPU the process's peak resident set (which also
holds the torch runtime, gloo's buffers and what the allocator keeps) and, comparable with the GPU
figure and the prediction, the peak of tensor allocations: one more step under torch's profiler
(``profile_memory``), its allocations' running peak added to the tensors that live across steps
(parameters, optimizer states, the batch).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

_OPS = {
    "all_reduce": "all_reduce",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "all_to_all_single": "all_to_all",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "send": "send_recv",
    "recv_": "send_recv",
    "recv_any_source_": "send_recv",
    "barrier": "barrier",
}


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CollectiveCounter(TorchDispatchMode):
    """Counts (and optionally times) every collective that reaches the dispatcher.

    Sees both functional collectives (DTensor, ``_c10d_functional``) and c10d ops (FSDP2,
    ``dist.all_reduce``, pipeline p2p). Bytes follow nccl-tests' size convention: the larger of the
    input and output buffers of one call on one rank (all_reduce: the buffer; all_gather: the
    gathered output; reduce_scatter: the input before scattering; send/recv: the message).
    With ``timed``, each collective is waited on at once and its wall time recorded.
    """

    def __init__(self, axis_of_group: dict[str, str], timed: bool = False) -> None:
        super().__init__()
        self.axis_of_group = axis_of_group
        self.timed = timed
        self.phase = "step"
        self.records: dict[tuple[str, str, str, int], int] = {}
        self.seconds: dict[tuple[str, str], float] = {}

    def _axis(self, func: Any, args: tuple, kwargs: dict) -> str:
        for a in list(args) + list(kwargs.values()):
            name = a if isinstance(a, str) else None
            if isinstance(a, torch.ScriptObject):
                with contextlib.suppress(Exception):
                    name = dist.ProcessGroup.unbox(a).group_name
            if isinstance(name, str) and name in self.axis_of_group:
                return self.axis_of_group[name]
        return "world"

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ):
        kwargs = kwargs or {}
        if any(t.__name__ == "DTensor" for t in types):
            # Let DTensor desugar the op into local ops and collectives first
            # (as CommDebugMode does).
            return NotImplemented
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        ns = func.namespace
        base = func._overloadpacket.__name__
        if ns not in ("_c10d_functional", "c10d") or base not in _OPS:
            return func(*args, **kwargs)
        op = _OPS[base]
        axis = self._axis(func, args, kwargs)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        if op == "barrier":
            return out
        # c10d ops put the output first (_reduce_scatter_base_(output, input)), functional ones the
        # input: the larger of the first two arguments and the result is the nccl-tests size.
        nbytes = max([_nbytes(_tensors(a)) for a in args[:2]] + [_nbytes(_tensors(out))])
        if self.timed:
            if ns == "_c10d_functional":
                for t in _tensors(out):
                    torch.ops._c10d_functional.wait_tensor(t)
            elif isinstance(out, tuple) and out and hasattr(out[-1], "wait"):
                out[-1].wait()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            key2 = (axis, self.phase)
            self.seconds[key2] = self.seconds.get(key2, 0.0) + time.perf_counter() - start
        key = (axis, op, self.phase, nbytes)
        self.records[key] = self.records.get(key, 0) + 1
        return out

    def table(self, steps: int = 1) -> list[dict[str, Any]]:
        """Records per step per rank: axis, op, phase, count, bytes (per call)."""
        return [
            {"axis": a, "op": o, "phase": p, "bytes": b, "count": c / steps}
            for (a, o, p, b), c in sorted(self.records.items())
        ]


def axis_of_group(mesh: Any) -> dict[str, str]:
    out = {}
    for name in mesh.mesh_dim_names:
        out[mesh.get_group(name).group_name] = name
    return out



class Clock:
    """Synchronised wall clock: waits for the device before reading the time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def tensor_peak_bytes(trainer: Any, tries: int = 3) -> int:
    """Peak bytes of tensors during one step on CPU (what max_memory_allocated counts on a GPU).

    peak = bytes of the tensors that live across steps (parameters, optimizer states, the batch;
    gradients are freed after each step) + the running maximum of the step's allocations minus
    its frees, from the CPU allocator's events under torch.profiler(profile_memory=True). A
    tensor from before the step that the step frees is not subtracted (slightly high, never low).

    gloo frees a temporary of an in-place collective (the copy its reduce-scatter all-reduces) on
    its worker thread where that thread lets go of the work last: the free is out of the
    profiler's view and the running sum keeps the buffer to the end of the step (one buffer
    high). Such a step is seen (a ``c10d::`` op's allocation with no free) and, if any rank saw
    one, every rank measures one more step, up to ``tries``; the lowest reading is kept (a lost
    free only adds).
    """
    from torch.profiler import ProfilerActivity, profile

    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.untyped_storage().nbytes()

    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    # the distributed optimizer's fp32 main shards of 16-bit parameters (workload.distopt)
    main: list[torch.Tensor] = getattr(trainer.optimizer, "main_params", list)()
    persistent = sum(nbytes(t) for t in [*trainer.params, *state, *main, trainer.tokens,
                                         trainer.targets])
    best: int | None = None
    for _ in range(tries):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            trainer.step()
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]"
        )
        live = peak = 0
        for _, change in events:
            live += change
            peak = max(peak, live)
        best = peak if best is None else min(best, peak)
        lost = torch.tensor([float(_lost_collective_frees(prof))])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(lost, op=dist.ReduceOp.MAX)  # every rank steps again, or none
        if not lost.item():
            break
    assert best is not None
    return persistent + best


def _lost_collective_frees(prof: Any) -> bool:
    """Whether an in-place c10d collective (``c10d::..._``: no output of its own) allocated a
    buffer the profile never sees freed: a gloo temporary freed on its worker thread."""
    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except Exception:  # torch's experimental interface: no check without it
        return False
    memory: list[tuple[int, int, int, bool]] = []  # time, ptr, bytes, inside such an op

    def walk(events: Any, inside: bool) -> None:
        for e in events:
            if e.name == "[memory]":
                ptr = getattr(e.extra_fields, "ptr", None)
                if ptr is not None:
                    memory.append((e.start_time_ns, ptr, e.extra_fields.alloc_size, inside))
            else:
                walk(e.children, inside or (e.name.startswith("c10d::") and e.name.endswith("_")))

    walk(roots, False)
    allocated: dict[int, bool] = {}  # ptr -> allocated inside an in-place c10d op, not freed
    for _, ptr, size, inside in sorted(memory, key=lambda m: m[0]):
        if size > 0:
            if allocated.get(ptr):  # its address taken again: it was freed out of view
                return True
            allocated[ptr] = inside
        else:
            allocated.pop(ptr, None)
    return any(allocated.values())


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_memory_bytes(torch.device("cpu"))

