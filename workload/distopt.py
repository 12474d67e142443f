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

Here the gradients accumulate over micro-batches in the parameters' ``.grad`` (autograd, and the
pipeline schedule's own accumulation and scaling) and are added to the flat buffer at the sync,
each ``.grad`` freed as it is copied; Megatron's backward hooks add each ``.grad`` to its main_grad
as soon as it is produced. The buffer is allocated per step (Megatron's lives across steps and is
zeroed each step): the same peak within a step.
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

    def flat_params(self) -> torch.Tensor:
        """The parameters' local values, flat and padded (the all-gather's output buffer)."""
        with torch.no_grad():
            flat = torch.cat([_local(p).detach().reshape(-1) for p in self.params])
            return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))


def make_buffer(params: list[Any], group: Any, rank: int, size: int,
                param_dtype: torch.dtype) -> FlatBuffer:
    """A buffer of params over group; its main shard: fp32 (a copy for 16-bit parameters, a
    view of the parameters taken at each step for fp32 ones)."""
    grad_dtype = torch.float32 if param_dtype in (torch.bfloat16, torch.float16) else param_dtype
    buf = FlatBuffer(params=params, group=group, rank=rank, size=size, grad_dtype=grad_dtype,
                     main=torch.empty(0))
    n = buf.padded // size
    if param_dtype == torch.float32:  # set to a view of the parameters at each step
        buf.main = torch.empty(n, dtype=torch.float32, device=_local(params[0]).device)
    else:
        buf.main = buf.flat_params()[buf.shard].float().clone()
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

    def reduce_gradients(self) -> None:
        """Each buffer: the parameters' gradients into one flat buffer (their .grad freed), scaled
        by 1 / (dp cp), reduce-scattered once; this rank's shard becomes the main shard's grad."""
        for buf in self.buffers:
            flat = torch.zeros(buf.padded, dtype=buf.grad_dtype, device=buf.main.device)
            offset = 0
            for p in buf.params:
                n = _local(p).numel()
                if p.grad is not None:
                    flat[offset:offset + n].copy_(_local(p.grad).reshape(-1))
                    p.grad = None
                offset += n
            flat.mul_(1.0 / self.replicas)
            shard = torch.empty(buf.padded // buf.size, dtype=flat.dtype, device=flat.device)
            if buf.group is None:
                shard.copy_(flat)
            else:
                dist.reduce_scatter_tensor(shard, flat, group=buf.group)
            del flat
            buf.grad = shard

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
        (in their dtype) into every rank's parameters."""
        flats = []
        for buf, fp32 in zip(self.buffers, self.fp32, strict=True):
            flat = buf.flat_params()
            if fp32:  # AdamW updates the shard of the parameters in place
                buf.main.data = flat[buf.shard]
            buf.main.grad, buf.grad = buf.grad, None
            flats.append(flat)
        self.optimizer.step()
        with torch.no_grad():
            for buf, fp32, flat in zip(self.buffers, self.fp32, flats, strict=True):
                if not fp32:
                    flat[buf.shard].copy_(buf.main)
                else:  # nothing kept between steps but the states
                    buf.main.data = torch.empty(0, dtype=buf.main.dtype, device=flat.device)
                if buf.group is not None:
                    mine = flat[buf.shard].clone()  # gloo: the input apart from the output
                    dist.all_gather_into_tensor(flat, mine, group=buf.group)
                offset = 0
                for p in buf.params:
                    local = _local(p)
                    local.copy_(flat[offset:offset + local.numel()].view_as(local))
                    offset += local.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for buf in self.buffers:
            buf.grad = None
            for p in buf.params:
                p.grad = None
