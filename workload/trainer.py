"""The training loop of one rank: builds its chunks under the plan and runs timed steps.

Per step, the wall time of forward, backward, gradient sync, optimizer step and, for pipelines,
the time spent outside stage compute (pipeline waits and p2p), with a barrier at the start of each
step (workload.timers.Clock waits for the device before reading the time). The same clock readings
give the step's events (``Trainer.events``: every micro-batch's forward, backward and weight
gradient pass per chunk, the gradient sync, the optimizer step, from the step's start), what
``perfmodel validate --trace`` draws beside the predicted timeline. Pipelines run with
``torch.distributed.pipelining`` (GPipe, 1F1B, interleaved 1F1B, zero-bubble). Data parallel,
zero 0: one flat all-reduce of all gradients over the dp group after the last backward, averaged;
bf16 gradients are reduced in fp32, as Megatron-LM does. SP norm gradients (Partial over tp) are
all-reduced in one call, as Megatron's allreduce_layernorm_grads (under FSDP, zero 3, each rank's
shards of them, after FSDP2 reduce-scattered them over dp). Parameters are kept in the run's
dtype (no fp32 master copy). zero 1 and 2: Megatron-LM's distributed optimizer (workload.distopt:
one reduce-scatter of a flat gradient buffer per step, fp32 for bf16, over the same groups as the
all-reduces below, AdamW on this rank's shard with fp32 main weights for bf16, one all-gather of
the updated weights); zero 3: FSDP2.

Context parallelism: each rank trains on its cp share of every sequence (workload.context_parallel)
and the gradient all-reduce runs over the dp x cp ranks of a replica (axis "dp_cp"), averaged over
dp cp. Expert parallelism (ep > 1) or a mixture of experts under tp with tp / etp > 1: the routed
experts' gradients (each rank's etp slices of them) are all-reduced in a second flat call over the
expert-data-parallel group (axis "edp", tp dp cp / (ep etp) ranks; none when that is 1) and
averaged over dp cp as well; with ep = 1 and etp = tp they join the first call. An MoE layer's
router under tp (whole on every rank, each rank's gradient over its own tokens) is all-reduced
over tp in the norms' call.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from workload.context_parallel import local_positions
from workload.distopt import wait_seen
from workload.model import build_chunk, chunk_ids, loss_fn
from workload.parallelize import (
    apply_cp,
    apply_ep,
    apply_fsdp,
    apply_tp,
    check_parallel,
    expert_parameters,
    experts_apart,
    extra_groups,
    loss_context,
)
from workload.settings import adamw_kernels
from workload.timers import Clock, axis_of_group


def _scalar(loss: torch.Tensor) -> float:
    """A loss as a float (a DTensor's replicated local value; 0 on the meta device)."""
    t = loss.detach()
    t = t.to_local() if hasattr(t, "to_local") else t
    return 0.0 if t.device.type == "meta" else float(t.float())


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
        self.cp, self.ep = plan.get("cp", 1), plan.get("ep", 1)
        check_parallel(m, plan)
        # dp_cp, etp, etp_ep, ep, edp: {axis: (group, rank in it, size)}
        self.groups = extra_groups(mesh, plan, experts=bool(m.get("experts")))
        self.cp_rank = mesh.get_local_rank("cp") if self.cp > 1 else 0
        self.mb = plan["micro_batch"]
        self.n_mb = plan["global_batch"] // (self.dp * self.mb)
        self.pp_rank = mesh.get_local_rank("pp") if self.pp > 1 else 0
        self.dp_rank = mesh.get_local_rank("dp") if self.dp > 1 else 0
        self.clock = Clock(device)
        self.zero = plan.get("zero", 0)
        replicas = self.dp * self.cp
        # zero 3: FSDP2 over dp; zero 1 and 2: Megatron's distributed optimizer over dp x cp
        self.fsdp = self.dp > 1 and self.zero == 3
        # with ep > 1 or tp / etp > 1, the routed experts' parameters (or their etp slices)
        # sync over edp (tp dp cp / (ep etp) ranks), apart from the rest
        apart = bool(m.get("experts")) and experts_apart(self.ep, self.tp, plan.get("etp", 1))
        # (one replica (dp cp 1) but experts copied over tp ranks (edp > 1): their buffer still
        # syncs over edp, as Megatron-Core's distributed optimizer shards the experts over their
        # expert-data-parallel group; before 2026-12-07 their gradients were left unsynced)
        self.distopt = self.zero in (1, 2) and (replicas > 1 or (apart and "edp" in self.groups))
        # zero 3 where the routed experts are apart: their FSDP mesh (edp; None where that group
        # is one rank: kept whole); False: with the rest
        fsdp_experts: Any = False
        if self.fsdp and apart:
            from torch.distributed.device_mesh import DeviceMesh

            edp = self.groups.get("edp")
            fsdp_experts = None if edp is None else DeviceMesh.from_group(edp[0], device.type)
        # zero 3 under tp: (chunk, name) of the parameters whose gradients came Partial over tp
        # (_defer_partial_grads), all-reduced over tp in one call by _reduce_partial_grads
        self._partial_names: set[tuple[int, str]] = set()
        self.chunks: list[nn.Module] = []
        for c in chunk_ids(plan, self.pp_rank):
            mod = build_chunk(m, plan, c).to(device=device, dtype=dtype)
            if m.get("experts"):
                apply_ep(mod, self.groups, plan.get("moe_routing", "learned"))
            if self.cp > 1:
                comm = plan.get("cp_comm", "p2p")
                apply_cp(mod, mesh.get_group("cp"), self.cp_rank, self.cp, comm, m["seq_len"])
            if self.tp > 1:
                apply_tp(mod, mesh["tp"], plan.get("sequence_parallel", False))
            if self.fsdp and self.tp > 1:
                self._defer_partial_grads(mod, len(self.chunks))
            if self.fsdp:
                apply_fsdp(mod, mesh["dp"], self.zero, fsdp_experts,
                           pipelined=self.pp > 1,
                           keep=plan.get("fsdp_reshard", "forward") != "forward")
            self.chunks.append(mod)
        params = [p for mod in self.chunks for p in mod.parameters()]
        self.expert_ids = expert_parameters(self.chunks) if apart else set()
        # DTensor or plain parameters: DTensor's attributes (placements, device_mesh) are read
        # where present
        self.params: list[Any] = params
        self.optimizer: Any
        if self.distopt:
            self.optimizer = self._distributed_optimizer(dtype)
        else:
            # foreach kernels cannot mix DTensor and plain parameters, nor DTensors of two
            # meshes (zero 3 with experts apart: dp and edp): one group of each
            by_mesh: dict[Any, list[Any]] = {}
            for p in params:
                by_mesh.setdefault(getattr(p, "device_mesh", None), []).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": group} for group in by_mesh.values()], lr=1e-4,
                **adamw_kernels(device.type)
            )
        self.times: dict[str, float] = {}
        # the step's events, seconds from its start (after the barrier): see event()
        self.events: list[dict[str, Any]] = []
        self._step_start = 0.0
        # a CollectiveCounter while one counts the step's collectives (the job's probe steps,
        # the dry run); the timed phases tell it which phase a collective belongs to
        self.counter: Any = None
        # pipeline=False (dry-run): no schedule; chunks_step runs this rank's chunks one by one.
        self.schedule = self._schedule() if self.pp > 1 and pipeline else None
        if self.distopt and self.schedule is None:
            # each gradient into the flat buffer as autograd accumulates it (workload.distopt;
            # a pipeline schedule accumulates and scales .grad itself: added at the sync)
            self.optimizer.accumulate_in_backward()
        g = torch.Generator().manual_seed(1234 + self.dp_rank)
        shape = (self.n_mb * self.mb, m["seq_len"])
        # The same tokens on every tensor-parallel rank of a replica (seeded by dp rank only);
        # with cp, each rank keeps its two chunks of every sequence.
        self.tokens = torch.randint(0, m["vocab"], shape, generator=g)
        self.targets = torch.randint(0, m["vocab"], shape, generator=g)
        if self.cp > 1:
            keep = local_positions(m["seq_len"], self.cp, self.cp_rank)
            self.tokens, self.targets = self.tokens[:, keep], self.targets[:, keep]
        self.tokens, self.targets = self.tokens.to(device), self.targets.to(device)
        # the last step's loss on this rank (its local tokens); None where it has no loss (a
        # pipeline rank without the last chunk)
        self.last_loss: float | None = None

    def _defer_partial_grads(self, mod: nn.Module, chunk: int) -> None:
        """zero 3 under tensor parallelism: FSDP2 would reduce each sequence-parallel norm's
        Partial gradient over tp by itself, one all-reduce per parameter in the backward
        (torch's FSDPParam._get_grad_inner_tensor redistributes it to the parameter's
        Replicate), where Megatron all-reduces them in one call per step. So each gradient that
        reaches a replicated tensor-parallel parameter Partial is relabelled Replicate without
        communication (a tensor hook on the parameter FSDP2 gathers, registered when its module
        first runs): FSDP2 reduce-scatters each tp rank's partial sums over dp as they are (both
        sums, so the order does not matter), and _reduce_partial_grads all-reduces this rank's
        shards of them over tp in one flat call after the backward, as Megatron-FSDP does
        (finalize_model_grads._allreduce_non_tensor_model_parallel_grads: each parameter's
        local shard, coalesced). The parameters are found by name after FSDP2 replaces them."""
        from torch.distributed.tensor import DTensor, Replicate

        def relabel(fqn: str, grad: Any) -> Any:
            if not isinstance(grad, DTensor) or not any(pl.is_partial()
                                                        for pl in grad.placements):
                return grad
            self._partial_names.add((chunk, fqn))
            placements = [Replicate() if pl.is_partial() else pl for pl in grad.placements]
            return DTensor.from_local(grad.to_local(), grad.device_mesh, placements,
                                      run_check=False)

        def hook_parameters(module: nn.Module, prefix: str) -> None:
            for name, p in module._parameters.items():  # FSDP2's gathered ones in its forward
                if p is not None and p.requires_grad and not getattr(p, "_partial_hook", False):
                    p.register_hook(functools.partial(relabel, prefix + name))
                    p._partial_hook = True  # type: ignore[attr-defined]

        for prefix, module in mod.named_modules():
            replicated = [p for p in module._parameters.values() if isinstance(p, DTensor)
                          and all(pl.is_replicate() for pl in p.placements)]
            if replicated:  # the norms (SequenceParallel), row-parallel biases
                dotted = prefix + "." if prefix else ""
                module.register_forward_pre_hook(
                    lambda m, args, dotted=dotted: hook_parameters(m, dotted))

    def axis_names(self) -> dict[str, str]:
        """Group name -> axis, for CollectiveCounter: the mesh's dims and the extra groups."""
        names = axis_of_group(self.mesh)
        for axis, (group, _, _) in self.groups.items():
            names[group.group_name] = axis
        return names

    def _distributed_optimizer(self, dtype: torch.dtype) -> Any:
        """zero 1 and 2 (workload.distopt): the dense parameters' buffer over dp (dp x cp with
        context parallelism); the routed experts' over edp where they sync apart (no collective
        where edp is one rank)."""
        from workload.distopt import DistributedOptimizer, make_buffer

        if self.cp > 1:
            group, rank, size = self.groups["dp_cp"]
        elif self.dp > 1:
            group, rank, size = self.mesh.get_group("dp"), self.dp_rank, self.dp
        else:  # one replica (the experts' buffer alone syncs, over edp): no collective
            group, rank, size = None, 0, 1
        dense = [p for p in self.params if id(p) not in self.expert_ids]
        experts = [p for p in self.params if id(p) in self.expert_ids]
        buffers = [make_buffer(dense, group, rank, size, dtype)] if dense else []
        if experts:
            e_group, e_rank, e_size = self.groups.get("edp", (None, 0, 1))
            buffers.append(make_buffer(experts, e_group, e_rank, e_size, dtype))
        return DistributedOptimizer(buffers, self.dp * self.cp, lr=1e-4,
                                    **adamw_kernels(self.device.type))

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
        stages: list[Any] = []  # PipelineStage (the schedules take list[_PipelineStageBase])
        for mod, c in zip(self.chunks, chunk_ids(self.plan, self.pp_rank), strict=True):
            stage = PipelineStage(mod, c, n_chunks, self.device, group=group)
            # the stage's own passes, timed (assigned over its methods)
            stage.forward_one_chunk = self._timed(  # type: ignore[method-assign]
                stage.forward_one_chunk, "forward", "F", c
            )
            stage.backward_one_chunk = self._timed(  # type: ignore[method-assign]
                stage.backward_one_chunk, "backward", "B", c
            )
            # zero-bubble schedules run the weight gradients as a separate pass
            stage.backward_weight_one_chunk = self._timed(  # type: ignore[method-assign]
                stage.backward_weight_one_chunk, "backward", "W", c
            )
            stages.append(stage)
        self.stages = stages
        timed_loss = self._timed(loss_fn, "forward", "loss")
        kind = self.plan.get("schedule", "1f1b")
        if kind == "interleaved":
            return ScheduleInterleaved1F1B(stages, self.n_mb, loss_fn=timed_loss)
        if kind == "zb":
            return ScheduleInterleavedZeroBubble(stages, self.n_mb, loss_fn=timed_loss)
        if kind == "zbv":
            return ScheduleZBVZeroBubble(stages, self.n_mb, loss_fn=timed_loss)
        cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
        return cls(stages[0], self.n_mb, loss_fn=timed_loss)

    def _timed(self, fn: Any, name: str, kind: str, chunk: int | None = None) -> Any:
        """fn timed into self.times[name], and each call an event of `kind` (F, B, W, loss) of
        its micro-batch (the stage methods' first argument) on model chunk `chunk`."""
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
                end = self.clock.now()
                self.times[name] = self.times.get(name, 0.0) + end - start
                mb = None
                if chunk is not None:
                    mb = args[0] if args else kwargs.get("fwd_chunk_id",
                                                         kwargs.get("bwd_chunk_id"))
                self.event(kind, start, end, micro_batch=mb, chunk=chunk)
                if counter is not None:
                    counter.phase = previous

        return wrapper

    def event(self, kind: str, start: float, end: float, micro_batch: Any = None,
              chunk: int | None = None, thread: str = "schedule") -> None:
        """Record one event of the step: kind F (forward), B (backward; input gradient only
        where a W follows), W (weight gradient), loss, sync or optimizer; clock readings."""
        self.events.append({
            "kind": kind,
            "micro_batch": micro_batch if isinstance(micro_batch, int) else None,
            "chunk": chunk,
            "thread": thread,
            "start_s": start - self._step_start,
            "end_s": end - self._step_start,
        })

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
        total = 0.0
        # fsdp_reshard step: every unit kept gathered until the last micro-batch's backward, and
        # its reduction deferred to it (NeMo AutoModel's enable_fsdp_optimizations,
        # components/moe/fsdp_mixin.py: prepare_for_grad_accumulation, prepare_for_final_backward)
        step = self.plan.get("fsdp_reshard", "forward") == "step"
        defer = bool(self.plan.get("defer_grad_sync")) or step
        for i in range(self.n_mb):
            # FSDP2 reduce-scatters each micro-batch's gradients in its backward and accumulates
            # them sharded, as torchtitan, Megatron-LM's torch FSDP2 and DeepSpeed's ZeRO-3 do;
            # with defer_grad_sync only the last one's, the others' accumulated unsharded (NeMo
            # AutoModel's default; perfmodel.step.data_parallel)
            if self.fsdp and defer:  # fully_shard made the chunk an FSDPModule
                mod.set_requires_gradient_sync(i == self.n_mb - 1)  # type: ignore[operator]
            if self.fsdp and step:
                mod.set_reshard_after_backward(i == self.n_mb - 1)  # type: ignore[operator]
            sl = slice(i * self.mb, (i + 1) * self.mb)
            with self._loss_context():
                self._set_phase("fwd")
                start = self.clock.now()
                loss = loss_fn(mod(self.tokens[sl]), self.targets[sl]) / self.n_mb
                mid = self.clock.now()
                self._set_phase("bwd")
                loss.backward()
                end = self.clock.now()
            total += _scalar(loss)
            self.times["forward"] = self.times.get("forward", 0.0) + mid - start
            self.times["backward"] = self.times.get("backward", 0.0) + end - mid
            self.event("F", start, mid, micro_batch=i, chunk=0)
            self.event("B", mid, end, micro_batch=i, chunk=0)
        self.last_loss = total

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
        assert self.schedule is not None, "the pipeline runs with a schedule (pp > 1)"
        with self._loss_context():
            self.schedule.step(*args, **kwargs)
        total = self.clock.now() - start
        if kwargs.get("losses"):  # the last chunk's rank: the mean of its micro-batches' losses
            self.last_loss = sum(_scalar(x) for x in kwargs["losses"]) / len(kwargs["losses"])
        self.times["pipeline_wait"] = (
            total - self.times.get("forward", 0.0) - self.times.get("backward", 0.0)
        )

    def _reduce_partial_grads(self) -> None:
        """Sequence parallelism leaves the norm weights' gradients Partial over tp (each rank saw
        its slice of the sequence); DTensor does not reduce them. Megatron all-reduces them in one
        call (allreduce_layernorm_grads); so does this on the 1D tp mesh (zero 0 to 2; with FSDP,
        zero 3, this rank's shards of them: _reduce_fsdp_partial_grads)."""
        partial = [
            p
            for p in self.params
            if p.grad is not None
            and hasattr(p.grad, "placements")
            and any(pl.is_partial() for pl in p.grad.placements)
        ]
        partial_ids = {id(p) for p in partial}
        # plain parameters whole on every tp rank, each rank's gradient over its own tokens (an
        # MoE layer's router: workload.parallelize._moe_tp_styles), reduced in the same call
        plain = [p for p in self.params if p.grad is not None and self.tp > 1
                 and getattr(p, "sequence_parallel", False) and not hasattr(p.grad, "placements")]
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
        if self.fsdp:  # (no plain ones: check_parallel refuses MoE, tp and zero 3)
            self._reduce_fsdp_partial_grads()
            return
        if not partial and not plain:
            return
        self._set_phase("grad")
        from torch.distributed.tensor import DTensor

        local = [p.grad.to_local() for p in partial] + [p.grad for p in plain]
        synced = self._tp_all_reduce(local)
        for p, g in zip(partial, synced[: len(partial)], strict=True):
            p.grad = DTensor.from_local(g, p.device_mesh, p.placements, run_check=False)
        for p, g in zip(plain, synced[len(partial):], strict=True):
            p.grad.copy_(g)

    def _reduce_fsdp_partial_grads(self) -> None:
        """zero 3: this rank's shards of the gradients that came Partial over tp (FSDP2 has
        reduce-scattered them over dp: _defer_partial_grads), all-reduced over tp in one flat
        call and copied back."""
        if not self._partial_names:
            return
        named = [dict(mod.named_parameters()) for mod in self.chunks]
        grads: list[Any] = [named[c][name].grad for c, name in sorted(self._partial_names)]
        local = [g.to_local() for g in grads if g is not None]
        if not local:
            return
        self._set_phase("grad")
        with torch.no_grad():
            for g, synced in zip(local, self._tp_all_reduce(local), strict=True):
                g.copy_(synced)

    def _tp_all_reduce(self, tensors: list[Any]) -> list[Any]:
        """The tensors summed over tp in one flat all-reduce (Megatron's coalesced call), as new
        tensors of their shapes."""
        flat = torch._utils._flatten_dense_tensors(tensors)
        dist.all_reduce(flat, group=self.mesh.get_group("tp"))
        return list(torch._utils._unflatten_dense_tensors(flat, tensors))

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
                    seq = m["seq_len"] // self.cp // (self.tp if sp else 1)
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
        self._set_phase("step")
        self.optimizer.step()  # the distributed optimizer's parameter all-gather (zero 1, 2)
        self.optimizer.zero_grad(set_to_none=True)
        return p2p

    def _grad_sync(self) -> None:
        """zero 0: one flat all-reduce of the gradients over the dp group (dp x cp with context
        parallelism), averaged; with ep > 1 the routed experts' in a second one over edp. zero 1
        and 2: the distributed optimizer's reduce-scatter of each buffer (workload.distopt);
        zero 3: FSDP2 reduced them in the backward."""
        self._reduce_partial_grads()
        if self.distopt:
            self._set_phase("grad")
            self.optimizer.reduce_gradients()
            return
        if self.fsdp and self.expert_ids:
            # the routed experts' gradients: every replica's tokens reached them through the
            # all-to-alls, so their mean is over the replicas (dp cp), as FSDP2 takes the rest's
            # over dp; FSDP2 averaged them over edp (or left them whole where edp is one rank)
            edp = self.groups["edp"][2] if "edp" in self.groups else 1
            for p in self.params:
                if id(p) in self.expert_ids and p.grad is not None:
                    p.grad.mul_(edp / (self.dp * self.cp))
        if self.zero > 0:
            return
        replicas = self.dp * self.cp
        dense: list[torch.Tensor] = []
        experts: list[torch.Tensor] = []
        for p in self.params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                (experts if id(p) in self.expert_ids else dense).append(g)
        if replicas > 1:
            group = self.groups["dp_cp"][0] if self.cp > 1 else self.mesh.get_group("dp")
            self._all_reduce_mean(dense, group, replicas)
        if "edp" in self.groups:
            self._all_reduce_mean(experts, self.groups["edp"][0], replicas)
        elif experts and replicas > 1:  # every replica of these experts is in this ep group
            for g in experts:
                g.div_(replicas)

    def _all_reduce_mean(self, grads: list[torch.Tensor], group: Any, replicas: int) -> None:
        """One flat all-reduce of grads over group, divided by the model's replicas (dp cp)."""
        if not grads:
            return
        self._set_phase("grad")
        flat = torch._utils._flatten_dense_tensors(grads)
        if flat.dtype == torch.bfloat16:  # Megatron-LM reduces bf16 gradients in fp32
            flat = flat.float()
        # (gloo's worker holds the buffer too: let it go first, so that the profiler of the
        # CPU tensor peak sees the buffer freed: workload.distopt.wait_seen)
        wait_seen(dist.all_reduce(flat, group=group, async_op=True), group)
        flat.div_(replicas)
        for g, synced in zip(
            grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
        ):
            g.copy_(synced)

    def gradients(self) -> None:
        """Forward, backward and the gradient sync of one step, without the optimizer step (the
        equivalence checks read the gradients)."""
        if self.schedule is not None:
            self._pipeline()
        else:
            self._fwd_bwd()
        self._grad_sync()

    def step(self) -> dict[str, float]:
        self.times = {}
        self.events = []
        dist.barrier()
        start = self._step_start = self.clock.now()
        if self.schedule is not None:
            self._pipeline()
        else:
            self._fwd_bwd()
        t = self.clock.now()
        self._grad_sync()
        synced = self.clock.now()
        self.times["grad_sync"] = synced - t
        self.event("sync", t, synced, thread="DP comm")
        t = self.clock.now()
        self._set_phase("step")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        end = self.clock.now()
        self.times["optimizer"] = end - t
        self.event("optimizer", t, end, thread="compute")
        self.times["step"] = end - start
        return dict(self.times)
