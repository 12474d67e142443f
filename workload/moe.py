"""The mixture-of-experts MLP of the job, and its expert parallelism.

Routing (Shazeer et al. 2017; Mixtral): a router (hidden x experts, with a bias when the model has
biases) scores each token; softmax over the experts, the top_k kept and renormalised to sum 1
(the same as Mixtral's softmax over its top-k logits). Each expert is an MLP of the model's kind
(SwiGLU when gated, GELU otherwise) expert_ffn_hidden wide; shared experts (DeepSeekMoE,
Qwen2-MoE) see every token and are added. No auxiliary load-balancing loss.

Capacity: with a capacity factor cf each expert takes at most C = ceil(cf T k / E) of the T local
tokens' T k assignments (GShard; Megatron-Core's formula), the C with the highest routing weight
(Megatron's default drop policy, "probs"); the rest are dropped (the token keeps its residual
path), and every expert's buffer is padded to C (Megatron's moe_pad_expert_input_to_capacity), so
that the exchange sizes are fixed. Without one (None): dropless (Mixtral, DeepSeek-V3, Megatron's
default), every assignment computed.

Expert parallelism (ep ranks, E / ep experts each, rank j holding experts j E/ep ... (j+1) E/ep - 1;
Megatron-Core's MoEAlltoAllTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py at
NVIDIA/Megatron-LM d98e8a64dd), per MoE layer and micro-batch, T = the rank's tokens
(micro_batch x seq_len / cp, and / tp under tensor parallelism, which needs sequence parallelism:
each tp rank routes its own share of the sequence). Expert tensor parallelism (etp ranks, of the
tp axis: workload.parallelize) splits each of the rank's experts over the etp group as
Megatron-Core's TEGroupedMLP with expert_tensor_parallel_size (moe/experts.py: each expert's up
(and gate) projection column-parallel, f / etp of its width on a rank, its down projection
row-parallel); the dispatcher's "tp" is that group (MoETokenDispatcher: tp_group =
pg_collection.expt_tp), of one rank with etp 1:

- dropless: the E token counts of every rank of the etp x ep group (Megatron's tp_ep group: etp
  inner; the ep group with etp 1) all-gathered, int64 (the output is etp ep E 8 bytes; preprocess),
  then dispatch, one all_to_all_single over ep with split sizes, of the T k assignments'
  hidden-wide rows (T k h elements sent per rank, in balanced routing also received); with
  etp > 1 the rows a rank received all-gathered over etp (dispatch_postprocess:
  gather_from_sequence_parallel_region over expt_tp, the etp ranks' rows in rank order), every
  expert slice run on all of them, its partial outputs reduce-scattered back to the rank that
  received each row (combine_preprocess: reduce_scatter_to_sequence_parallel_region), then
  combine by all-to-all back; backward: the all-to-alls back with the split sizes swapped, the
  all-gather's adjoint a reduce-scatter and the reduce-scatter's an all-gather.
- with a capacity factor: dispatch and combine of E C rows of h (fixed sizes, no count exchange),
  with etp > 1 the E C rows a rank received (C for each of its E / ep experts from each of the
  ep ranks) gathered over etp and the outputs reduce-scattered, etp E C rows of h each.

With etp > 1 and unequal row counts across the etp ranks (learned routing; balanced routing and a
capacity give equal ones), gloo has no all-gather of unequal sizes (ProcessGroupGloo::allgather
refuses them): the job pads each rank's rows to the largest for the all-gather (its bytes are
then etp x the largest, not the sum: counted as issued) and reduce-scatters with the unequal
sizes (dist.reduce_scatter of a list, as Megatron's _reduce_scatter_along_first_dim with
input_split_sizes). Megatron-Core also exchanges the routing probabilities with the tokens (an
all-to-all, and an all-gather over etp); the job applies them at the source rank and does not.
gloo has all_to_all_single with uneven split sizes in torch 2.13 (the job uses it directly).
Balanced routing (``routing = "balanced"``: assignment n = t k + j goes to expert n mod E, the
router still weighting it) makes every split size a function of the shapes: the dry run uses it
(its meta tensors hold no values to route by) and it gives a real run exchange sizes the model can
know; "learned" (the default) routes by the router's scores.

Gradients: the experts' own (each rank's etp slices of them) over the expert-data-parallel group
(workload.trainer); the router's and shared experts' with the rest of the model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from workload.context_parallel import AllToAll


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Tokens one expert takes at most: C = ceil(factor T k / E) (GShard; Megatron-Core's
    get_capacity)."""
    return math.ceil(factor * tokens * top_k / experts)


def balanced_counts(assignments: int, experts: int) -> list[int]:
    """Assignments per expert under balanced routing (assignment n to expert n mod E)."""
    return [assignments // experts + (e < assignments % experts) for e in range(experts)]


def gather_rows(x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
    """Every rank's rows (rank i's sizes[i]) all-gathered over group, in rank order (Megatron's
    gather_from_sequence_parallel_region with output_split_sizes). Equal sizes: one all-gather
    of the concatenation; unequal ones (gloo refuses them): each rank's padded to the largest."""
    n = max(sizes)
    src = x.contiguous()
    if any(size != n for size in sizes):
        src = torch.cat([src, src.new_zeros((n - x.shape[0], *x.shape[1:]))])
    out = x.new_empty((n * len(sizes), *x.shape[1:]))
    dist.all_gather_single(out, src, group=group)
    if all(size == n for size in sizes):
        return out
    return torch.cat([out[i * n : i * n + size] for i, size in enumerate(sizes)])


def reduce_scatter_rows(x: torch.Tensor, group: Any, sizes: list[int], rank: int) -> torch.Tensor:
    """x (the group's rows, rank i's sizes[i] of them in rank order) summed over group, rank's
    own rows kept (Megatron's reduce_scatter_to_sequence_parallel_region with input_split_sizes):
    one reduce-scatter, of a list where the sizes differ."""
    out = x.new_empty((sizes[rank], *x.shape[1:]))
    src = x.contiguous()
    if all(size == sizes[0] for size in sizes):
        dist.reduce_scatter_single(out, src, group=group)
    else:
        dist.reduce_scatter(out, list(src.split(sizes)), group=group)
    return out


class GatherRows(torch.autograd.Function):
    """gather_rows, differentiable: the backward reduce-scatters the gradient (the rows' partial
    sums over the ranks' expert slices) back to their ranks."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int],
                rank: int) -> torch.Tensor:
        ctx.args = (group, sizes, rank)
        return gather_rows(x, group, sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return reduce_scatter_rows(grad, *ctx.args), None, None, None


class ScatterRows(torch.autograd.Function):
    """reduce_scatter_rows, differentiable: the backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int],
                rank: int) -> torch.Tensor:
        ctx.args = (group, sizes)
        return reduce_scatter_rows(x, group, sizes, rank)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return gather_rows(grad, *ctx.args), None, None, None


def _split_linear(linear: nn.Linear, dim: int, rank: int, size: int) -> None:
    """Keep rank's 1 / size of a linear layer's weight along dim (0: its outputs, column-parallel,
    with its bias; 1: its inputs, row-parallel, no bias); each kept parameter says which slice
    of the whole it is (``etp_slice``: dim, rank, size; workload.equivalence compares it so)."""
    if dim == 1 and linear.bias is not None:
        raise ValueError("a row-parallel expert projection has no bias (etp > 1 and bias: "
                         "workload.settings.check_parallel refuses it)")
    params = [("weight", dim)] + ([("bias", 0)] if linear.bias is not None else [])
    for name, d in params:
        whole = getattr(linear, name).detach()
        part = nn.Parameter(whole.chunk(size, d)[rank].clone())
        part.etp_slice = (d, rank, size)  # type: ignore[attr-defined]
        setattr(linear, name, part)
    if dim == 0:
        linear.out_features //= size
    else:
        linear.in_features //= size


class Experts(nn.ModuleList):
    """A rank's routed experts (MLPs), run as one module: each on its consecutive rows. One
    forward for all of them is what FSDP2 hooks (zero 3: the experts one unit, sharded over the
    expert-data-parallel group, workload.parallelize.apply_fsdp)."""

    def forward(self, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        outs = [mlp(part) for mlp, part in zip(self, rows.split(sizes), strict=True)]
        return torch.cat(outs) if outs else rows


class MoE(nn.Module):
    """Routed experts (and shared ones) in place of a block's MLP."""

    def __init__(self, m: dict[str, Any], mlp: Any) -> None:
        super().__init__()
        self.experts_total, self.top_k = m["experts"], m["top_k"]
        self.router = nn.Linear(m["hidden"], self.experts_total, bias=m["bias"])
        width = m.get("expert_ffn_hidden") or m["ffn_hidden"]
        self.experts = Experts(
            mlp({**m, "ffn_hidden": width}) for _ in range(self.experts_total)
        )
        # the shared experts as the stacks build them: one MLP as wide as all of them
        # (Megatron-Core's SharedExpertMLP, Hugging Face's DeepseekV3MoE), one collective of
        # tensor parallelism and one bias for all (the model's f_sh); one MLP each before
        # 2026-12-07, whose n - 1 extra biases perfmodel does not count
        shared = (m.get("shared_expert_ffn_hidden") or width) * m.get("shared_experts", 0)
        self.shared = nn.ModuleList([mlp({**m, "ffn_hidden": shared})] if shared else [])
        self.capacity_factor: float | None = m.get("capacity_factor")
        self.routing = "learned"
        self.first_expert = 0  # the global index of self.experts[0]
        self.ep_group: Any = None
        self.ep, self.ep_rank = 1, 0
        # expert tensor parallelism: each expert's slice on etp ranks (split_experts); the
        # counts' group, etp x ep ranks (Megatron's tp_ep: the ep group with etp 1)
        self.etp_group: Any = None
        self.etp, self.etp_rank = 1, 0
        self.counts_group: Any = None
        self.tp_mesh: Any = None  # under tp: the tp mesh (the shared experts' collectives)
        self.shared_recompute = False  # selective recompute's shared_experts module

    def shard_experts(self, group: Any, rank: int, size: int) -> None:
        """Keep this ep rank's experts (rank E/ep ... ): all E were built first, so that every
        expert's initial weights are the same as in one process."""
        per = self.experts_total // size
        self.first_expert = rank * per
        self.experts = Experts(list(self.experts)[rank * per : (rank + 1) * per])
        self.ep_group, self.ep, self.ep_rank = group, size, rank
        self.counts_group = group  # the etp x ep group where split_experts follows

    def split_experts(self, group: Any, rank: int, size: int, counts_group: Any) -> None:
        """Keep this etp rank's slice of each expert the rank holds: the up (and gate) projection's
        outputs rank f / etp ... (column-parallel), the down projection's inputs alike
        (row-parallel); counts_group: the etp x ep ranks (workload.parallelize)."""
        mlp: Any  # an MLP (a ModuleList yields Module to mypy)
        for mlp in self.experts:
            _split_linear(mlp.w1, 0, rank, size)
            if mlp.w3 is not None:
                _split_linear(mlp.w3, 0, rank, size)
            _split_linear(mlp.w2, 1, rank, size)
        self.etp_group, self.etp, self.etp_rank = group, size, rank
        self.counts_group = counts_group

    # -- routing ---------------------------------------------------------------------------
    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert index, weight) of each token's top_k assignments, both (T, k)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        if self.routing == "balanced":
            n = x.shape[0] * self.top_k
            idx = (torch.arange(n, device=x.device) % self.experts_total).view(-1, self.top_k)
            weight = probs.gather(1, idx)
        else:
            weight, idx = probs.topk(self.top_k, dim=-1)
        return idx, (weight / weight.sum(-1, keepdim=True)).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        idx, weight = self._route(xf)
        if self.capacity_factor is None:
            y = self._dropless(xf, idx, weight)
        else:
            y = self._capacity(xf, idx, weight)
        y = y.view(shape)
        if self.shared and self.shared_recompute and torch.is_grad_enabled():
            # selective recompute's shared_experts: their collectives recomputed too
            y = y + checkpoint(self._shared, x, use_reentrant=False, early_stop=False)
        elif self.shared:
            y = y + self._shared(x)
        return y

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        """The shared experts on every token. Under tp (tp_mesh set: workload.parallelize) one
        tensor-parallel MLP as Megatron-Core's SharedExpertMLP: x (this rank's sequence shard)
        all-gathered once, each expert's column- and row-parallel GEMMs, their Partial sum
        reduce-scattered back to the shard once (the adjoints backward)."""
        if self.tp_mesh is None:
            return sum((mlp(x) for mlp in self.shared[1:]), self.shared[0](x))
        from torch.distributed.tensor import DTensor, Replicate, Shard

        full = DTensor.from_local(x, self.tp_mesh, [Shard(1)], run_check=False)
        full = full.redistribute(self.tp_mesh, [Replicate()])
        out = sum((mlp(full) for mlp in self.shared[1:]), self.shared[0](full))
        return out.redistribute(self.tp_mesh, [Shard(1)]).to_local()

    # -- dropless: exchange with split sizes -------------------------------------------------
    def _counts(self, flat: torch.Tensor, tokens: int) -> list[list[int]]:
        """counts[s etp + t][e]: assignments of the rank (ep s, etp t) to expert e. One all-gather
        over the etp x ep ranks (Megatron's dispatcher gathers them likewise, over tp_ep); balanced
        routing knows them from the shapes."""
        e_total, sources = self.experts_total, self.ep * self.etp
        local = (
            torch.bincount(flat, minlength=e_total)
            if self.routing == "learned"
            else torch.zeros(e_total, dtype=torch.int64, device=flat.device)
        )
        gathered = local.view(1, -1)
        if sources > 1:
            out = local.new_empty(sources * e_total)
            dist.all_gather_single(out, local.contiguous(), group=self.counts_group)
            gathered = out.view(sources, e_total)
        if self.routing == "balanced":
            return [balanced_counts(tokens * self.top_k, e_total)] * sources
        return [[int(c) for c in row] for row in gathered.tolist()]

    def _run_experts(self, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Each local expert (or its etp slice: partial sums) on its consecutive rows."""
        out: torch.Tensor = self.experts(rows, sizes)
        return out

    def _dropless(self, xf: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        tokens, k = idx.shape
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)  # assignments grouped by expert
        rows = xf.index_select(0, order // k)
        counts = self._counts(flat, tokens)
        if self.ep * self.etp > 1:
            done = self._exchange(rows, counts)
        else:
            done = self._run_experts(rows, counts[0])
        # back to (token, slot) order, weighted, summed over each token's k experts
        out = torch.empty_like(done).index_copy(0, order, done)
        return (out.view(tokens, k, -1) * weight.unsqueeze(-1)).sum(1)

    def _exchange(self, rows: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
        """This rank's rows (grouped by expert) through the experts of their ep ranks and back:
        dispatch by all-to-all over ep, with etp > 1 the received rows gathered over etp, the
        experts (or their slices) on every gathered row, the outputs reduce-scattered back over
        etp, combine by all-to-all over ep (module docstring)."""
        per, me, mt, ep, etp = len(self.experts), self.ep_rank, self.etp_rank, self.ep, self.etp

        def n(s: int, t: int, e: int) -> int:  # assignments of rank (ep s, etp t) to my expert e
            return counts[s * etp + t][me * per + e]

        mine = counts[me * etp + mt]
        send = [sum(mine[d * per : (d + 1) * per]) for d in range(ep)]
        recv = [sum(n(s, mt, e) for e in range(per)) for s in range(ep)]
        got = AllToAll.apply(rows, self.ep_group, recv, send) if ep > 1 else rows
        # the rows each etp rank received (its ep sources' for my experts)
        held = [sum(n(s, t, e) for s in range(ep) for e in range(per)) for t in range(etp)]
        if etp > 1:
            got = GatherRows.apply(got, self.etp_group, held, mt)
        # blocks [etp rank t][ep source s][my expert e]: regroup by expert
        starts, pos = {}, 0
        for t in range(etp):
            for s in range(ep):
                for e in range(per):
                    starts[(t, s, e)] = pos
                    pos += n(s, t, e)
        perm = [starts[(t, s, e)] + i for e in range(per) for t in range(etp)
                for s in range(ep) for i in range(n(s, t, e))]
        perm_t = torch.tensor(perm, dtype=torch.long, device=rows.device)
        sizes = [sum(n(s, t, e) for t in range(etp) for s in range(ep)) for e in range(per)]
        out_sorted = self._run_experts(got.index_select(0, perm_t), sizes)
        back = torch.empty_like(out_sorted).index_copy(0, perm_t, out_sorted)
        if etp > 1:
            back = ScatterRows.apply(back, self.etp_group, held, mt)
        return AllToAll.apply(back, self.ep_group, send, recv) if ep > 1 else back

    # -- with a capacity factor: fixed-size buffers ------------------------------------------
    def _capacity(self, xf: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        tokens, k = idx.shape
        e_total = self.experts_total
        cap = capacity(tokens, k, e_total, self.capacity_factor or 1.0)
        flat, w = idx.reshape(-1), weight.reshape(-1)
        routed = torch.nn.functional.one_hot(flat, e_total).T.bool()  # (E, T k)
        score = torch.where(routed, w.detach().float().unsqueeze(0), float("-inf"))
        top, slot = score.topk(min(cap, tokens * k), dim=1)  # the heaviest C per expert
        keep = torch.isfinite(top)  # fewer than C routed: padding
        if cap > tokens * k:  # an expert could take more than every assignment: pad further
            pad = cap - tokens * k
            slot = torch.cat([slot, slot.new_zeros(e_total, pad)], 1)
            keep = torch.cat([keep, keep.new_zeros(e_total, pad)], 1)
        buf = xf.index_select(0, (slot // k).reshape(-1)).view(e_total, cap, -1)
        buf = buf * keep.unsqueeze(-1).to(buf.dtype)
        per, ep, etp = len(self.experts), self.ep, self.etp
        sources = ep * etp  # [etp rank][ep source] blocks after the gather, each per x cap rows
        got = buf.reshape(e_total * cap, -1)
        if ep > 1:  # [ep source][my expert][slot]
            got = AllToAll.apply(got, self.ep_group)
        if etp > 1:
            got = GatherRows.apply(got, self.etp_group, [per * ep * cap] * etp, self.etp_rank)
        # per expert, every source's slots
        got = got.view(sources, per, cap, -1).transpose(0, 1).reshape(per * sources * cap, -1)
        done = self._run_experts(got, [sources * cap] * per)
        done = done.view(per, sources, cap, -1).transpose(0, 1).reshape(sources * per * cap, -1)
        if etp > 1:
            done = ScatterRows.apply(done, self.etp_group, [per * ep * cap] * etp, self.etp_rank)
        if ep > 1:
            done = AllToAll.apply(done, self.ep_group)
        done = done.view(e_total, cap, -1)
        gate = w.index_select(0, slot.reshape(-1)).view(e_total, cap) * keep.to(w.dtype)
        out = torch.zeros_like(xf)
        return out.index_add(0, (slot // k).reshape(-1), (done * gate.unsqueeze(-1)).flatten(0, 1))
