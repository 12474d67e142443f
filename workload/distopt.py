"""ZeRO 1 and 2 of the job: Megatron-LM's distributed optimizer.

As Megatron-Core does it (megatron/core/distributed/param_and_grad_buffer.py,
distributed_data_parallel.py and megatron/core/optimizer/distrib_optimizer.py), without
overlap (no bucketing: one bucket per buffer, as Megatron builds when overlap_grad_sync is off):

- the parameters stay whole on every data-parallel rank (replicated, as with zero 0);
- the gradients of a buffer's parameters (each rank's local shards under tensor parallelism,
  DTensor ``to_local()``) go into one contiguous flat buffer in the gradient dtype (fp32 for bf16
  parameters: Megatron's grad_reduce_in_fp32), padded at the end to a multiple of the group size
  (uniform shards: Megatron's _pad_end_of_bucket_if_needed; its further alignment, parameter
  starts to 64 elements and the end to lcm(group, 128), is left out: it only aligns addresses for
  GPU kernels, and perfmodel's ledger counts the unpadded bytes);
- after the last micro-batch's backward the buffer is scaled by 1 / (dp cp) (Megatron's
  gradient_scaling_factor, the experts' too) and reduce-scattered once (SUM) over the buffer's
  group: ``reduce_scatter_tensor``;
- AdamW steps on this rank's shard only: an fp32 main copy of the shard for bf16 parameters
  (Megatron's main params, states fp32), the shard of the parameters themselves in fp32;
- the updated shards are all-gathered once (``all_gather_into_tensor``) in the parameter dtype
  into every rank's parameters.

Buffers: the dense parameters over the dp group (dp x cp with context parallelism, "dp_cp");
with a mixture of experts whose experts sync apart (ep > 1 or tp / etp > 1) the routed experts'
over the expert-data-parallel group ("edp"; none when it has one rank: no collective), as
Megatron-Core builds its expert buffers.

What a rank holds, as Megatron's does (megatron/core/distributed/distributed_data_parallel.py's
backward hooks add each parameter's ``.grad`` into its ``main_grad``, a view of the flat buffer,
and free it; distrib_optimizer.py steps fp32 parameters through views of their shard and
all-gathers into the parameters' own buffer):

- without a pipeline (``accumulate_in_backward``), each parameter's gradient is added to the
  step's flat buffer as autograd accumulates it (a post-accumulate-grad hook) and its ``.grad``
  freed: no whole copy of the gradients beside the buffer. The buffer is allocated at the first
  gradient of the step (Megatron's lives across steps and is zeroed each step: the same peak,
  but for the step's activations already freed by then). Gradients the trainer still reduces
  over tp first (sequence-parallel norms, Partial; an MoE layer's router) stay in ``.grad``
  until the sync, and so do all of them under a pipeline, whose schedule accumulates and scales
  ``.grad`` itself: they are added to the buffer at the sync;
- the buffer is dropped as soon as it is reduce-scattered (ZeRO 2 shards the gradients; the
  job does the same at zero 1, where Megatron keeps the buffer to the next step: the peak of
  either is at the end of the backward, buffer and weights and states at once); the
  reduce-scatter runs in place, its output the buffer's own shard (gloo's temporary copy of the
  input is freed within the call: wait_seen);
- the step fills one flat output buffer in the parameter dtype with this rank's shard of the
  parameters (fp32 parameters: AdamW updates that slice in place, Megatron's views; 16-bit ones:
  the fp32 main shard is copied into it), frees the reduced gradient shard, all-gathers in
  place (the input is the output's own shard) and copies the buffer into the parameters, which
  are not one contiguous buffer here: the one copy of the weights the job holds beyond
  Megatron's during the gather (and gloo allocates one more for its all-gather; NCCL none).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist


def _local(t: Any) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    return t.to_local() if hasattr(t, "to_local") else t


@dataclasses.dataclass
class FlatBuffer:
    """One buffer's parameters, laid out flat (each one's local shard, in order) and padded to a
    multiple of the group size; this rank's shard of it and its main copy for AdamW."""

    params: list[Any]
    group: Any  # None: a group of one rank (no collective)
    rank: int
    size: int
    grad_dtype: torch.dtype
    main: torch.Tensor  # the leaf AdamW steps (fp32): this rank's shard
    grad: torch.Tensor | None = None  # this rank's shard of the reduced gradients
    flat: torch.Tensor | None = None  # the step's flat gradient buffer, until reduce-scattered
    offsets: list[int] = dataclasses.field(default_factory=list)  # each parameter's start

    def __post_init__(self) -> None:
        offset = 0
        for p in self.params:
            self.offsets.append(offset)
            offset += _local(p).numel()

    @property
    def numel(self) -> int:
        return sum(_local(p).numel() for p in self.params)

    @property
    def padded(self) -> int:
        """Elements of the buffer: numel padded up to a multiple of the group size."""
        return -(-self.numel // self.size) * self.size

    @property
    def shard(self) -> slice:
        n = self.padded // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def fill_shard(self, out: torch.Tensor) -> None:
        """This rank's shard of the parameters' local values into out (shard-sized; the padding
        zeros), from the parameters it overlaps: no whole copy."""
        lo, hi = self.shard.start, self.shard.stop
        offset = 0
        with torch.no_grad():
            for p in self.params:
                local = _local(p)
                n = local.numel()
                a, b = max(offset, lo), min(offset + n, hi)
                if a < b:
                    out[a - lo:b - lo].copy_(local.detach().reshape(-1)[a - offset:b - offset])
                offset += n
            if hi > offset:  # the padding at the buffer's end
                out[max(offset, lo) - lo:].zero_()

    def add_gradient(self, index: int, grad: torch.Tensor) -> None:
        """Add one parameter's local gradient to its place in the step's flat buffer
        (allocated, zeroed, at the first)."""
        if self.flat is None:
            self.flat = torch.zeros(self.padded, dtype=self.grad_dtype, device=grad.device)
        offset = self.offsets[index]
        with torch.no_grad():
            self.flat[offset:offset + grad.numel()].add_(grad.reshape(-1))


def wait_seen(work: Any, group: Any) -> None:
    """Wait for a collective issued with async_op; under torch's profiler on gloo, also until
    gloo's worker threads have let go of it, so that the caller frees its buffers last.

    Under the profiler (the job's CPU tensor peak, workload.timers.tensor_peak_bytes) a tensor
    freed by gloo's worker thread, outside the work it runs, is freed out of the profiler's
    view: the measured peak keeps it for the rest of the step. gloo's reduce-scatter
    all-reduces a copy of its input (ProcessGroupGloo::reduce_scatter_tensor_coalesced), and an
    all-reduce holds its buffer, in the work the call returns and in the worker's hands; where
    the worker let go last, the step's peak read one buffer high (once in about eight runs of
    tiny-gpt at dp 2, zero 2). The caller keeps the work while two barriers on the group pass
    (each taken by a worker thread once it has finished its last work; a barrier moves no data
    and is not counted). Only under the profiler: the timed steps are left alone. Under load a
    worker can still let go last; the profile shows it and the step is measured again
    (workload.timers.tensor_peak_bytes)."""
    work.wait()
    if torch._C._autograd._profiler_enabled() and dist.get_backend(group) == "gloo":
        dist.barrier(group=group)
        dist.barrier(group=group)


def make_buffer(params: list[Any], group: Any, rank: int, size: int,
                param_dtype: torch.dtype) -> FlatBuffer:
    """A buffer of params over group; its main shard: fp32 (a copy for 16-bit parameters, a
    view of the parameters taken at each step for fp32 ones)."""
    grad_dtype = torch.float32 if param_dtype in (torch.bfloat16, torch.float16) else param_dtype
    buf = FlatBuffer(params=params, group=group, rank=rank, size=size, grad_dtype=grad_dtype,
                     main=torch.empty(0))
    n = buf.padded // size
    device = _local(params[0]).device
    if param_dtype == torch.float32:  # set to a view of the step's gather buffer at each step
        buf.main = torch.empty(n, dtype=torch.float32, device=device)
    else:
        shard = torch.empty(n, dtype=param_dtype, device=device)
        buf.fill_shard(shard)
        buf.main = shard.float()
    buf.main.requires_grad_(True)
    return buf


class DistributedOptimizer:
    """Megatron's distributed optimizer over the buffers (module docstring). ``reduce_gradients``
    after the last backward; ``step`` then ``zero_grad`` (the trainer's optimizer interface)."""

    def __init__(self, buffers: list[FlatBuffer], replicas: int, **adamw: Any) -> None:
        self.buffers = [b for b in buffers if b.params]
        self.replicas = replicas  # dp x cp: every buffer's gradients are averaged over them
        self.fp32 = [b.main.dtype == _local(b.params[0]).dtype for b in self.buffers]
        for buf, fp32 in zip(self.buffers, self.fp32, strict=True):
            if fp32:  # a view of the parameters from the next step on; nothing kept between
                buf.main.data = torch.empty(0, dtype=buf.main.dtype, device=buf.main.device)
        self.adamw = adamw  # AdamW's settings (the equivalence check steps a whole copy with them)
        self.optimizer = torch.optim.AdamW([b.main for b in self.buffers], **adamw)
        self.state = self.optimizer.state
        self._flat: list[torch.Tensor | None] = [None] * len(self.buffers)

    def main_params(self) -> list[torch.Tensor]:
        """The fp32 main shards kept across steps (16-bit parameters only)."""
        return [b.main for b, fp32 in zip(self.buffers, self.fp32, strict=True) if not fp32]

    def accumulate_in_backward(self) -> None:
        """Add each parameter's gradient to its buffer as autograd accumulates it, freeing its
        .grad (Megatron's main_grad hooks); for runs without a pipeline schedule (module
        docstring). Gradients Partial over tp and the routers' (reduced over tp by the trainer
        first) are left in .grad."""
        for buf in self.buffers:
            for index, p in enumerate(buf.params):
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(
                        lambda param, buf=buf, index=index: self._take(buf, index, param))

    @staticmethod
    def _take(buf: FlatBuffer, index: int, p: Any) -> None:
        g = p.grad
        if g is None or getattr(p, "sequence_parallel", False):
            return
        if hasattr(g, "placements"):
            if any(pl.is_partial() for pl in g.placements):
                return
            if g.placements != p.placements:  # the row-parallel embedding's Replicate gradient:
                g = g.redistribute(g.device_mesh, p.placements)  # its local rows, no collective
        buf.add_gradient(index, _local(g))
        p.grad = None

    def reduce_gradients(self) -> None:
        """Each buffer: the gradients still in .grad added to the step's flat buffer (their
        .grad freed), scaled by 1 / (dp cp), reduce-scattered once and dropped; this rank's
        shard becomes the main shard's grad."""
        for buf in self.buffers:
            for index, p in enumerate(buf.params):
                if p.grad is not None:
                    buf.add_gradient(index, _local(p.grad))
                    p.grad = None
            if buf.flat is None:  # no gradient at all this step
                buf.flat = torch.zeros(buf.padded, dtype=buf.grad_dtype, device=buf.main.device)
            flat = buf.flat
            flat.mul_(1.0 / self.replicas)
            # in place, as Megatron reduce-scatters its buffer: the output is the buffer's own
            # shard (no shard-sized copy; gloo's temporary copy of the input is freed within
            # the call, where its list form's is freed by gloo's thread, at any time)
            shard = flat[buf.shard]
            if buf.group is not None:
                work = dist.reduce_scatter_tensor(shard, flat, group=buf.group, async_op=True)
                wait_seen(work, buf.group)
                del work  # (after gloo's threads have let go of it: wait_seen)
            buf.grad = shard  # the rest of the buffer: the step's all-gather output (step)

    def gathered_gradients(self) -> None:
        """The reduced gradients back on every parameter (all-gathered: for the equivalence check
        only, outside the counted step)."""
        from torch.distributed.tensor import DTensor

        for buf in self.buffers:
            assert buf.grad is not None, "reduce_gradients first"
            flat = torch.empty(buf.padded, dtype=buf.grad_dtype, device=buf.grad.device)
            if buf.group is None:
                flat.copy_(buf.grad)
            else:
                dist.all_gather_into_tensor(flat, buf.grad, group=buf.group)
            offset = 0
            for p in buf.params:
                local = _local(p)
                g = flat[offset:offset + local.numel()].view_as(local).to(local.dtype)
                offset += local.numel()
                p.grad = (DTensor.from_local(g, p.device_mesh, p.placements, run_check=False)
                          if hasattr(p, "to_local") else g)

    def step(self) -> None:
        """AdamW on this rank's shards, then one all-gather of each buffer's updated parameters
        (in their dtype), in place into a flat buffer copied into every rank's parameters."""
        outs: list[torch.Tensor | None] = []
        for buf, fp32 in zip(self.buffers, self.fp32, strict=True):
            local = _local(buf.params[0])
            out = self._gather_buffer(buf, local.dtype)
            if fp32:  # AdamW updates this rank's shard of the parameters in place
                if buf.grad is not None and out.dtype == buf.grad.dtype and buf.flat is not None:
                    buf.grad = buf.grad.clone()  # (its place in the buffer takes the parameters)
                buf.fill_shard(out[buf.shard])
                buf.main.data = out[buf.shard]
            buf.main.grad, buf.grad = buf.grad, None
            outs.append(out)
        self.optimizer.step()
        with torch.no_grad():
            for i, (buf, fp32) in enumerate(zip(self.buffers, self.fp32, strict=True)):
                gathered = outs[i]
                assert gathered is not None
                buf.main.grad = None  # the reduced shard, freed before the gather
                mine = gathered[buf.shard]
                if not fp32:
                    mine.copy_(buf.main)
                else:  # nothing kept between steps but the states
                    buf.main.data = torch.empty(0, dtype=buf.main.dtype, device=gathered.device)
                if buf.group is not None:  # in place: the input is the output's own shard
                    dist.all_gather_into_tensor(gathered, mine, group=buf.group)
                del mine
                for p, offset in zip(buf.params, buf.offsets, strict=True):
                    local = _local(p)
                    local.copy_(gathered[offset:offset + local.numel()].view_as(local))
                outs[i] = None
                del gathered
                buf.flat = None

    @staticmethod
    def _gather_buffer(buf: FlatBuffer, dtype: torch.dtype) -> torch.Tensor:
        """The all-gather's output, padded elements of the parameter dtype: the memory of the
        step's reduced gradient buffer (read no more once AdamW has its shard), or a new buffer
        where there is none; Megatron gathers into the parameters' own buffer, which the job's
        parameters, each its own tensor, are not."""
        flat = buf.flat
        if flat is None or flat.element_size() < torch.empty(0, dtype=dtype).element_size():
            return torch.empty(buf.padded, dtype=dtype, device=buf.main.device)
        return flat.view(dtype)[:buf.padded] if flat.dtype != dtype else flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for buf in self.buffers:
            buf.grad = buf.flat = None
            for p in buf.params:
                p.grad = None
