"""A standalone distributed training job for one parallel plan; imports only torch and the stdlib.

Copy this file and its JSON config to any machine and launch it with torchrun (or any launcher that
sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT):

    torchrun --nproc-per-node 4 job.py config.json

It trains a GPT-style transformer on synthetic tokens under the plan, all composed on one DeviceMesh
with dims named after the plan's axes ("pp", "dp", "tp", outermost first by default). NCCL on GPUs,
gloo on CPUs: the same code, only the device and the backend differ.

- data parallel, zero 0: gradients averaged by one flat all-reduce over the dp group after the last
  backward (not overlapped, so that it can be timed; DDP's bucketed overlap is not used even with
  overlap_grad_sync). zero 1 and 2: FSDP2 ``fully_shard`` with ``reshard_after_forward=False``
  (parameters stay gathered from forward to backward, gradients reduce-scattered: ZeRO-2).
  zero 3: FSDP2 ``fully_shard`` with ``reshard_after_forward=True``. One FSDP unit per block and one
  for the rest of each chunk.
- tensor parallel 1D (Megatron layout) and sequence parallel with DTensor parallel styles; one
  ``PrepareModuleInput`` per sub-layer so that the backward reduces the input gradient once (the
  f / g operators); the LM head is column-parallel with a vocab-parallel cross-entropy
  (``loss_parallel``); the token embedding is row-parallel (vocab-sharded, all-reduce forward); the
  learned position embedding is replicated and, with SP, the sum is scattered along the sequence
  (all-gather backward), as Megatron does with learned positions. SP norm gradients (Partial over
  tp) are all-reduced in one call, as Megatron's allreduce_layernorm_grads.
- pipeline parallel with ``torch.distributed.pipelining`` (GPipe, 1F1B, interleaved 1F1B).
- recompute: ``full`` checkpoints every transformer block, ``selective`` only the attention core.
- parameters are kept in the run's dtype (no fp32 master copy); bf16 gradients are reduced in fp32
  (the flat all-reduce, FSDP2's reduce_dtype), as Megatron-LM does; on a CPU bf16/fp16 runs as fp32.

Embeddings are not tied (tying across pipeline stages needs an extra all-reduce this job does not
do); positions are learned even for rotary models.

Measurement: ``warmup`` untimed steps, then ``steps`` timed steps with a barrier at the start of
each; per rank the wall time of forward, backward, gradient sync, optimizer step and, for pipelines,
the time spent outside stage compute (pipeline waits and p2p). On CUDA the clocks are read after
``torch.cuda.synchronize``. Tensor-parallel communication cannot be separated from forward and
backward without changing them, so one extra probe step runs under a dispatch mode that waits on
and times every collective, and counts it with its bytes (the same counter serves ``--dry-run``).
Peak memory: ``torch.cuda.max_memory_allocated`` on GPU. On CPU the process's peak resident set
(which also holds the torch runtime, gloo's buffers and what the allocator keeps) and, comparable
with the GPU figure and the prediction, the peak of tensor allocations: one more step after the
probes under torch's profiler (``profile_memory``), its allocations' running peak added to the
tensors that live across steps (parameters, optimizer states, the batch).
Every rank writes ``rank<R>.json`` after each step (so a crash keeps what was measured); rank 0
writes the merged results file at the end. Files are written atomically (temp file + os.replace).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import functools
import json
import os
import resource
import socket
import statistics
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def _norm(kind: str, hidden: int) -> nn.Module:
    return nn.RMSNorm(hidden) if kind == "rmsnorm" else nn.LayerNorm(hidden)


class Embedding(nn.Module):
    def __init__(self, m: dict[str, Any]) -> None:
        super().__init__()
        self.tok = nn.Embedding(m["vocab"], m["hidden"])
        self.pos = nn.Embedding(m["seq_len"], m["hidden"])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Attention(nn.Module):
    def __init__(self, m: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads, kv_heads = m["hidden"], m["heads"], m["kv_heads"]
        self.head_dim = m.get("head_dim") or hidden // heads  # the attention is heads x head_dim
        bias = m["bias"]
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.selective = False

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.selective:
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, m: dict[str, Any]) -> None:
        super().__init__()
        hidden, ffn, bias = m["hidden"], m["ffn_hidden"], m["bias"]
        self.gated = m["gated_mlp"]
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=bias) if self.gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, m: dict[str, Any]) -> None:
        super().__init__()
        self.attention_norm = _norm(m["norm"], m["hidden"])
        self.attention = Attention(m)
        self.ffn_norm = _norm(m["norm"], m["hidden"])
        self.feed_forward = MLP(m)
        self.full_recompute = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Chunk(nn.Module):
    """One pipeline chunk: [embedding] + blocks + [final norm and LM head]."""

    def __init__(self, m: dict[str, Any], layers: int, first: bool, last: bool) -> None:
        super().__init__()
        self.embedding = Embedding(m) if first else None
        self.layers = nn.ModuleList(Block(m) for _ in range(layers))
        self.norm = _norm(m["norm"], m["hidden"]) if last else None
        self.output = nn.Linear(m["hidden"], m["vocab"], bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = layer(x)
        if self.output is not None:
            x = self.output(self.norm(x))
        return x


def chunk_ids(plan: dict[str, Any], pp_rank: int) -> list[int]:
    """Chunks held by pipeline rank pp_rank: pp_rank, pp_rank + pp, ... (Megatron interleaving);
    for the V-shape zero-bubble schedule, pp_rank and 2 pp - 1 - pp_rank."""
    if plan.get("schedule") == "zbv":
        return [pp_rank, 2 * plan["pp"] - 1 - pp_rank]
    return [pp_rank + k * plan["pp"] for k in range(plan.get("virtual_stages", 1))]


def build_chunk(m: dict[str, Any], plan: dict[str, Any], chunk: int) -> Chunk:
    n_chunks = plan["pp"] * plan.get("virtual_stages", 1)
    if m["layers"] % n_chunks:
        raise ValueError(
            f"layers ({m['layers']}) must be divisible by pp x virtual_stages ({n_chunks})"
        )
    mod = Chunk(m, m["layers"] // n_chunks, first=chunk == 0, last=chunk == n_chunks - 1)
    recompute = plan.get("recompute", "none")
    for block in mod.layers:
        block.full_recompute = recompute == "full"
        block.attention.selective = recompute == "selective"
    return mod


# ---------------------------------------------------------------------------------------------
# Parallelisation
# ---------------------------------------------------------------------------------------------


def apply_tp(mod: Chunk, tp_mesh: Any, sequence_parallel: bool) -> None:
    """Megatron 1D tensor parallelism (and sequence parallelism) with DTensor parallel styles."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    act = Shard(1) if sp else Replicate()
    if mod.embedding is not None:
        parallelize_module(
            mod.embedding,
            tp_mesh,
            {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())},
        )
        if sp:  # scatter to the sequence-parallel region: a local slice (all-gather in backward)
            parallelize_module(
                mod,
                tp_mesh,
                {
                    "embedding": PrepareModuleOutput(
                        output_layouts=Replicate(), desired_output_layouts=act
                    )
                },
            )
    for block in mod.layers:
        styles: dict[str, Any] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=act),
        }
        if block.feed_forward.w3 is not None:
            styles["feed_forward.w3"] = ColwiseParallel()
        # One entry point per sub-layer (Megatron's f / g operators): the input becomes a replicated
        # DTensor once, so wq, wk and wv (and w1, w3) sum their Partial input gradients locally and
        # the backward reduces them in one collective (all-reduce; reduce-scatter with SP).
        for name in ("attention", "feed_forward"):
            styles[name] = PrepareModuleInput(
                input_layouts=(act,), desired_input_layouts=(Replicate(),)
            )
        if sp:
            styles["attention_norm"] = SequenceParallel()
            styles["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, styles)
    if mod.output is not None:
        styles = {
            "output": ColwiseParallel(
                input_layouts=act, output_layouts=Shard(-1), use_local_output=False
            )
        }
        if sp:
            styles["norm"] = SequenceParallel()
        parallelize_module(mod, tp_mesh, styles)


def apply_fsdp(mod: Chunk, dp_mesh: Any, zero: int) -> None:
    """FSDP2: one unit per block and one for the rest of the chunk; bf16 gradients are
    reduce-scattered in fp32, as Megatron-LM reduces them."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reshard = zero == 3
    bf16 = next(mod.parameters()).dtype == torch.bfloat16
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in mod.layers:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(mod, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)


def loss_context(tp: int) -> Any:
    """Vocabulary-parallel cross entropy (``loss_parallel``) under tensor parallelism."""
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


# ---------------------------------------------------------------------------------------------
# Collective counter (probe step and --dry-run)
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


class Clock:
    """Synchronised wall clock: waits for the device before reading the time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Trainer:
    """Builds this rank's part of the model under the plan and runs training steps."""

    def __init__(
        self,
        cfg: dict[str, Any],
        mesh: Any,
        device: torch.device,
        dtype: torch.dtype,
        pipeline: bool = True,
    ) -> None:
        self.cfg, self.mesh, self.device, self.dtype = cfg, mesh, device, dtype
        m, plan = cfg["model"], cfg["plan"]
        self.plan = plan
        self.pp, self.dp, self.tp = plan["pp"], plan["dp"], plan["tp"]
        self.mb = plan["micro_batch"]
        self.n_mb = plan["global_batch"] // (self.dp * self.mb)
        self.pp_rank = mesh.get_local_rank("pp") if self.pp > 1 else 0
        self.dp_rank = mesh.get_local_rank("dp") if self.dp > 1 else 0
        self.clock = Clock(device)
        self.zero = plan.get("zero", 0)
        self.chunks: list[nn.Module] = []
        for c in chunk_ids(plan, self.pp_rank):
            mod = build_chunk(m, plan, c).to(device=device, dtype=dtype)
            if self.tp > 1:
                apply_tp(mod, mesh["tp"], plan.get("sequence_parallel", False))
            if self.dp > 1 and self.zero > 0:
                apply_fsdp(mod, mesh["dp"], self.zero)
            self.chunks.append(mod)
        params = [p for mod in self.chunks for p in mod.parameters()]
        self.params = params
        # foreach kernels cannot mix DTensor and plain parameters: one group of each.
        groups = [
            {"params": [p for p in params if hasattr(p, "to_local")]},
            {"params": [p for p in params if not hasattr(p, "to_local")]},
        ]
        self.optimizer = torch.optim.AdamW(
            [g for g in groups if g["params"]], lr=1e-4, foreach=True
        )
        self.times: dict[str, float] = {}
        # pipeline=False (dry-run): no schedule; chunks_step runs this rank's chunks one by one.
        self.schedule = self._schedule() if self.pp > 1 and pipeline else None
        g = torch.Generator().manual_seed(1234 + self.dp_rank)
        shape = (self.n_mb * self.mb, m["seq_len"])
        # The same tokens on every tensor-parallel rank of a replica (seeded by dp rank only).
        self.tokens = torch.randint(0, m["vocab"], shape, generator=g).to(device)
        self.targets = torch.randint(0, m["vocab"], shape, generator=g).to(device)

    # -- pipeline ------------------------------------------------------------------------------
    def _schedule(self) -> Any:
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
            ScheduleZBVZeroBubble,
        )

        n_chunks = self.pp * self.plan.get("virtual_stages", 1)
        group = self.mesh.get_group("pp")
        stages = []
        for mod, c in zip(self.chunks, chunk_ids(self.plan, self.pp_rank), strict=True):
            stage = PipelineStage(mod, c, n_chunks, self.device, group=group)
            stage.forward_one_chunk = self._timed(stage.forward_one_chunk, "forward")
            stage.backward_one_chunk = self._timed(stage.backward_one_chunk, "backward")
            # zero-bubble schedules run the weight gradients as a separate pass
            stage.backward_weight_one_chunk = self._timed(
                stage.backward_weight_one_chunk, "backward"
            )
            stages.append(stage)
        self.stages = stages
        timed_loss = self._timed(loss_fn, "forward")
        kind = self.plan.get("schedule", "1f1b")
        if kind == "interleaved":
            return ScheduleInterleaved1F1B(stages, self.n_mb, loss_fn=timed_loss)
        if kind == "zb":
            return ScheduleInterleavedZeroBubble(stages, self.n_mb, loss_fn=timed_loss)
        if kind == "zbv":
            return ScheduleZBVZeroBubble(stages, self.n_mb, loss_fn=timed_loss)
        cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
        return cls(stages[0], self.n_mb, loss_fn=timed_loss)

    def _timed(self, fn: Any, name: str) -> Any:
        counter_phase = {"forward": "fwd", "backward": "bwd"}[name]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counter = getattr(self, "counter", None)
            if counter is not None:
                previous, counter.phase = counter.phase, counter_phase
            start = self.clock.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.times[name] = self.times.get(name, 0.0) + self.clock.now() - start
                if counter is not None:
                    counter.phase = previous

        return wrapper

    # -- one step ------------------------------------------------------------------------------
    def _loss_context(self) -> Any:
        return loss_context(self.tp)

    def _set_phase(self, phase: str) -> None:
        counter = getattr(self, "counter", None)
        if counter is not None:
            counter.phase = phase

    def _fwd_bwd(self) -> None:
        """Forward and backward over all micro-batches without a pipeline (pp = 1)."""
        mod = self.chunks[0]
        fsdp = self.dp > 1 and self.zero > 0
        for i in range(self.n_mb):
            if fsdp:
                mod.set_requires_gradient_sync(i == self.n_mb - 1)
            sl = slice(i * self.mb, (i + 1) * self.mb)
            with self._loss_context():
                self._set_phase("fwd")
                start = self.clock.now()
                loss = loss_fn(mod(self.tokens[sl]), self.targets[sl]) / self.n_mb
                mid = self.clock.now()
                self._set_phase("bwd")
                loss.backward()
                end = self.clock.now()
            self.times["forward"] = self.times.get("forward", 0.0) + mid - start
            self.times["backward"] = self.times.get("backward", 0.0) + end - mid

    def _pipeline(self) -> None:
        kwargs: dict[str, Any] = {}
        args: tuple = ()
        held = chunk_ids(self.plan, self.pp_rank)
        last = self.pp * self.plan.get("virtual_stages", 1) - 1
        if 0 in held:  # the first chunk takes the tokens (rank 0)
            args = (self.tokens,)
        if last in held:  # the last chunk the targets (the last rank; rank 0 in the V shape)
            kwargs = {"target": self.targets, "losses": []}
        self._set_phase("pipe")  # p2p between chunks; stage compute sets fwd / bwd itself
        start = self.clock.now()
        with self._loss_context():
            self.schedule.step(*args, **kwargs)
        total = self.clock.now() - start
        self.times["pipeline_wait"] = (
            total - self.times.get("forward", 0.0) - self.times.get("backward", 0.0)
        )

    def _reduce_partial_grads(self) -> None:
        """Sequence parallelism leaves the norm weights' gradients Partial over tp (each rank saw
        its slice of the sequence); DTensor does not reduce them. Megatron all-reduces them in one
        call (allreduce_layernorm_grads); so does this on the 1D tp mesh (per parameter with
        FSDP)."""
        partial = [
            p
            for p in self.params
            if p.grad is not None
            and hasattr(p.grad, "placements")
            and any(pl.is_partial() for pl in p.grad.placements)
        ]
        partial_ids = {id(p) for p in partial}
        for p in self.params:
            # The row-parallel embedding's gradient comes back Replicate (full vocab) from DTensor's
            # embedding backward; slice it to the parameter's Shard(0) (local, no communication).
            if (
                p.grad is not None
                and hasattr(p.grad, "placements")
                and id(p) not in partial_ids
                and p.grad.placements != p.placements
            ):
                p.grad = p.grad.redistribute(p.grad.device_mesh, p.placements)
        if not partial:
            return
        self._set_phase("grad")
        if self.dp > 1 and self.zero > 0:
            for p in partial:
                p.grad = p.grad.redistribute(p.grad.device_mesh, p.placements)
            return
        from torch.distributed.tensor import DTensor

        local = [p.grad.to_local() for p in partial]
        flat = torch._utils._flatten_dense_tensors(local)
        dist.all_reduce(flat, group=self.mesh.get_group("tp"))
        for p, g in zip(partial, torch._utils._unflatten_dense_tensors(flat, local), strict=True):
            p.grad = DTensor.from_local(g, p.device_mesh, p.placements, run_check=False)

    def chunks_step(self) -> list[dict[str, Any]]:
        """Forward and backward of this rank's chunks, micro-batch by micro-batch, without the
        pipeline schedule (for --dry-run, where the fake group carries no tensors between stages).
        Returns the point-to-point messages the schedule would exchange, derived from the chunks:
        per micro-batch, each chunk receives its input and sends its output forward (unless it is
        the first / last chunk of the model) and the reverse for gradients backward."""
        n_chunks = self.pp * self.plan.get("virtual_stages", 1)
        m = self.cfg["model"]
        p2p: list[dict[str, Any]] = []
        for mod, c in zip(self.chunks, chunk_ids(self.plan, self.pp_rank), strict=True):
            for i in range(self.n_mb):
                sl = slice(i * self.mb, (i + 1) * self.mb)
                if c == 0:
                    x = self.tokens[sl]
                else:
                    sp = self.plan.get("sequence_parallel", False) and self.tp > 1
                    seq = m["seq_len"] // (self.tp if sp else 1)
                    x = torch.zeros(
                        self.mb,
                        seq,
                        m["hidden"],
                        device=self.device,
                        dtype=self.dtype,
                        requires_grad=True,
                    )
                with self._loss_context():
                    self._set_phase("fwd")
                    out = mod(x)
                    self._set_phase("bwd")
                    if c == n_chunks - 1:
                        (loss_fn(out, self.targets[sl]) / self.n_mb).backward()
                    else:
                        out.backward(torch.ones_like(out))
                nbytes = x.numel() * x.element_size() if c > 0 else 0
                if c > 0:  # receive the activation, send its gradient back
                    p2p += [{"axis": "pp", "op": "send_recv", "phase": "pipe", "bytes": nbytes}] * 2
                if c < n_chunks - 1:  # send the activation, receive its gradient
                    size = out.numel() * out.element_size()
                    p2p += [{"axis": "pp", "op": "send_recv", "phase": "pipe", "bytes": size}] * 2
        self._grad_sync()
        return p2p

    def _grad_sync(self) -> None:
        """zero 0: one flat all-reduce of all gradients over the dp group, then averaged."""
        self._reduce_partial_grads()
        if self.dp == 1 or self.zero > 0:
            return
        self._set_phase("grad")
        grads = []
        for p in self.params:
            if p.grad is None:
                continue
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
        flat = torch._utils._flatten_dense_tensors(grads)
        if flat.dtype == torch.bfloat16:  # Megatron-LM reduces bf16 gradients in fp32
            flat = flat.float()
        dist.all_reduce(flat, group=self.mesh.get_group("dp"))
        flat.div_(self.dp)
        for g, synced in zip(
            grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
        ):
            g.copy_(synced)

    def step(self) -> dict[str, float]:
        self.times = {}
        dist.barrier()
        start = self.clock.now()
        if self.schedule is not None:
            self._pipeline()
        else:
            self._fwd_bwd()
        t = self.clock.now()
        self._grad_sync()
        self.times["grad_sync"] = self.clock.now() - t
        t = self.clock.now()
        self._set_phase("step")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        end = self.clock.now()
        self.times["optimizer"] = end - t
        self.times["step"] = end - start
        return dict(self.times)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def keep_freed_memory() -> bool:
    """CPU runs: glibc keeps the memory a step frees for the next one (never trims the heap, serves
    blocks up to 32 MiB from it instead of mmap), as the CUDA caching allocator does on GPUs.

    By default every large tensor is a fresh mmap whose pages the kernel faults in one by one:
    on a virtual machine that costs ~2 us per 4 KiB, so a 15 MB gradient buffer took 9 ms to
    allocate against 2 ms to copy. PyTorch's CPU tuning guide gives the same advice (jemalloc or
    tcmalloc). Returns whether glibc took the settings (False on other C libraries).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    trim = mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1))
    mmap = mallopt(m_mmap_threshold, ctypes.c_int(32 * 2**20))
    return trim == 1 and mmap == 1


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def tensor_peak_bytes(trainer: Any) -> int:
    """Peak bytes of tensors during one step on CPU (what max_memory_allocated counts on a GPU).

    peak = bytes of the tensors that live across steps (parameters, optimizer states, the batch;
    gradients are freed after each step) + the running maximum of the step's allocations minus
    its frees, from the CPU allocator's events under torch.profiler(profile_memory=True). A
    tensor from before the step that the step frees is not subtracted (slightly high, never low).
    """
    from torch.profiler import ProfilerActivity, profile

    def nbytes(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.untyped_storage().nbytes()

    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    persistent = sum(nbytes(t) for t in [*trainer.params, *state, trainer.tokens, trainer.targets])
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
    return persistent + peak


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_memory_bytes(torch.device("cpu"))


def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def choose_dtype(name: str, device: torch.device) -> tuple[torch.dtype, str, str]:
    """The plan's dtype where the device has a fast path for it; fp32 otherwise (and why)."""
    if device.type == "cpu" and name in ("bf16", "fp16"):
        return (
            torch.float32,
            "fp32",
            f"{name} has no fast path on this CPU (60-200x slower): ran fp32",
        )
    return DTYPES[name], name, ""


def make_mesh(plan: dict[str, Any], device_type: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    placement = plan.get("placement", "tp,dp,pp")
    inner_first = (
        [a.strip() for a in placement.split(",")] if isinstance(placement, str) else placement
    )
    names = tuple(reversed(inner_first))
    return init_device_mesh(device_type, tuple(plan[a] for a in names), mesh_dim_names=names)


def _inject_fault(cfg: dict[str, Any], rank: int, step: int) -> None:
    fault = cfg.get("fault") or {}
    if fault.get("rank") != rank or fault.get("step", 0) != step:
        return
    if fault.get("kind") == "crash":
        raise RuntimeError(f"injected crash on rank {rank} at step {step}")
    if fault.get("kind") == "hang":
        time.sleep(10**6)


def run(cfg: dict[str, Any]) -> None:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out_dir = cfg["output_dir"]
    os.makedirs(out_dir, exist_ok=True)
    rank_file = os.path.join(out_dir, f"rank{rank}.json")
    backend = cfg.get("backend", "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        keep_freed_memory()
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    dtype, dtype_used, dtype_note = choose_dtype(cfg["plan"].get("dtype", "fp32"), device)
    record: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "host": os.uname().nodename,
        "device": str(device),
        "dtype": dtype_used,
        "dtype_note": dtype_note,
        "steps": [],
        "status": "running",
        "baseline_memory_bytes": current_rss_bytes() if device.type == "cpu" else 0,
    }
    write_json(rank_file, record)
    timeout = datetime.timedelta(seconds=float(cfg.get("timeout_s", 300)))
    dist.init_process_group(
        backend,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
        **loopback_rendezvous(rank, world, timeout),
    )
    try:
        mesh = make_mesh(cfg["plan"], device.type)
        record["coords"] = {n: mesh.get_local_rank(n) for n in mesh.mesh_dim_names}
        torch.manual_seed(0)
        trainer = Trainer(cfg, mesh, device, dtype)
        record["parameters_local"] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in trainer.params
        )
        warmup, steps = int(cfg.get("warmup", 1)), int(cfg.get("steps", 3))
        for i in range(warmup + steps):
            _inject_fault(cfg, rank, i)
            times = trainer.step()
            if i >= warmup:
                record["steps"].append(times)
            record["peak_memory_bytes"] = peak_memory_bytes(device)
            write_json(rank_file, record)
        probes = int(cfg.get("probe_steps", 2))
        if probes > 0:
            # Collectives timed one by one in probe steps; the median over them per axis and phase.
            counters, times = [], []
            for _ in range(probes):
                counter = CollectiveCounter(axis_of_group(mesh), timed=True)
                trainer.counter = counter
                with counter:
                    times.append(trainer.step())
                trainer.counter = None
                counters.append(counter)
            keys = sorted({k for c in counters for k in c.seconds})
            record["probe"] = {
                "steps": probes,
                "times": times,
                "comm_seconds": [
                    {
                        "axis": a,
                        "phase": p,
                        "seconds": statistics.median(c.seconds.get((a, p), 0.0) for c in counters),
                    }
                    for a, p in keys
                ],
                "collectives": counters[0].table(),
            }
        if device.type == "cpu" and cfg.get("tensor_memory", True):
            try:
                record["tensor_peak_memory_bytes"] = tensor_peak_bytes(trainer)
            except Exception as exc:  # the profiler's interface is torch's to change
                record["tensor_memory_note"] = f"tensor peak not measured: {exc}"
        record["status"] = "ok"
        write_json(rank_file, record)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(record, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            write_json(
                os.path.join(out_dir, "results.json"),
                {
                    "config": cfg,
                    "ranks": gathered,
                    "torch": torch.__version__,
                    "backend": backend,
                    "world_size": world,
                },
            )
    except BaseException as exc:
        record["status"] = "failed"
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=8)
        write_json(rank_file, record)
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


LOOPBACK = ("127.0.0.1", "localhost", "::1")
_LISTENING: list[socket.socket] = []  # the store's listening socket lives as long as the rank


def loopback_rendezvous(rank: int, world: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """init_process_group's store for a run on this machine (MASTER_ADDR a loopback address):
    rank 0 binds the rendezvous to that address itself (torch's own store listens on every
    interface), so nothing of the job is reachable from the network. {} otherwise: a cluster's
    MASTER_ADDR, or torchrun's store, as torch sets them up."""
    addr = os.environ.get("MASTER_ADDR", "")
    if addr not in LOOPBACK or os.environ.get("TORCHELASTIC_RUN_ID"):
        return {}
    port = int(os.environ["MASTER_PORT"])
    listen_fd = None
    if rank == 0:
        family = socket.AF_INET6 if addr == "::1" else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::1" if addr == "::1" else "127.0.0.1", port))
        sock.listen(max(world, 16))
        _LISTENING.append(sock)
        listen_fd = sock.fileno()
    store = dist.TCPStore(addr, port, world, rank == 0, timeout, master_listen_fd=listen_fd)
    return {"store": store, "rank": rank, "world_size": world}


def watch_parent() -> None:
    """Exit when the launcher that set PERFMODEL_PARENT_PID is gone (killed without stopping us):
    a rank must never outlive the command that started it."""
    parent = os.environ.get("PERFMODEL_PARENT_PID")
    if not parent:
        return

    def poll() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=poll, name="watch-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: job.py CONFIG.json", file=sys.stderr)
        return 2
    watch_parent()
    with open(argv[0]) as f:
        cfg = json.load(f)
    run(cfg)
    # Everything is written (atomically) and the process group destroyed. torch's gloo threads
    # can still abort the interpreter's teardown afterwards ("terminate called without an active
    # exception", SIGABRT: 3 of 20 runs with torch 2.13), which would report a finished rank as
    # failed: leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
