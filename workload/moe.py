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
Megatron-Core's MoEAlltoAllTokenDispatcher), per MoE layer and micro-batch, T = the rank's tokens
(micro_batch x seq_len / cp, and / tp under tensor parallelism, which needs sequence parallelism:
each tp rank routes its own share of the sequence). The experts are whole on each rank (expert
tensor parallelism 1): Megatron-Core's dispatcher then takes its "tp" as the expert tp group of
one rank (MoETokenDispatcher: tp_group = pg_collection.expt_tp), so it issues no tensor-parallel
all-gather or reduce-scatter around the experts (dispatch_postprocess / combine_preprocess: only
when tp_size > 1), and gathers the counts over tp_ep_group, the ep group itself; the ep group
takes a stage's ranks tp innermost (workload.parallelize):

- dropless: one all-gather over ep of the E token counts per rank (int64: the output is
  ep E 8 bytes), then dispatch and combine, each one all_to_all_single with split sizes, of the
  T k assignments' hidden-wide rows (T k h elements sent per rank, in balanced routing also
  received); backward: the two all-to-alls back, with the split sizes swapped.
- with a capacity factor: dispatch and combine of E C rows of h (fixed sizes, no count exchange).

gloo has all_to_all_single with uneven split sizes in torch 2.13 (the job uses it directly).
Balanced routing (``routing = "balanced"``: assignment n = t k + j goes to expert n mod E, the
router still weighting it) makes every split size a function of the shapes: the dry run uses it
(its meta tensors hold no values to route by) and it gives a real run exchange sizes the model can
know; "learned" (the default) routes by the router's scores.

Gradients: the experts' own over the expert-data-parallel group (workload.trainer); the router's
and shared experts' with the rest of the model.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from workload.context_parallel import AllToAll


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Tokens one expert takes at most: C = ceil(factor T k / E) (GShard; Megatron-Core's
    get_capacity)."""
    return math.ceil(factor * tokens * top_k / experts)


def balanced_counts(assignments: int, experts: int) -> list[int]:
    """Assignments per expert under balanced routing (assignment n to expert n mod E)."""
    return [assignments // experts + (e < assignments % experts) for e in range(experts)]


class MoE(nn.Module):
    """Routed experts (and shared ones) in place of a block's MLP."""

    def __init__(self, m: dict[str, Any], mlp: Any) -> None:
        super().__init__()
        self.experts_total, self.top_k = m["experts"], m["top_k"]
        self.router = nn.Linear(m["hidden"], self.experts_total, bias=m["bias"])
        width = m.get("expert_ffn_hidden") or m["ffn_hidden"]
        self.experts = nn.ModuleList(
            mlp({**m, "ffn_hidden": width}) for _ in range(self.experts_total)
        )
        shared = m.get("shared_expert_ffn_hidden") or width
        self.shared = nn.ModuleList(
            mlp({**m, "ffn_hidden": shared}) for _ in range(m.get("shared_experts", 0))
        )
        self.capacity_factor: float | None = m.get("capacity_factor")
        self.routing = "learned"
        self.first_expert = 0  # the global index of self.experts[0]
        self.ep_group: Any = None
        self.ep, self.ep_rank = 1, 0
        self.tp_mesh: Any = None  # under tp: the tp mesh (the shared experts' collectives)

    def shard_experts(self, group: Any, rank: int, size: int) -> None:
        """Keep this ep rank's experts (rank E/ep ... ): all E were built first, so that every
        expert's initial weights are the same as in one process."""
        per = self.experts_total // size
        self.first_expert = rank * per
        self.experts = nn.ModuleList(list(self.experts)[rank * per : (rank + 1) * per])
        self.ep_group, self.ep, self.ep_rank = group, size, rank

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
        if self.shared:
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
        """counts[s][e]: assignments of ep rank s to expert e. One all-gather over ep (Megatron's
        dispatcher gathers them likewise); balanced routing knows them from the shapes."""
        e_total = self.experts_total
        local = (
            torch.bincount(flat, minlength=e_total)
            if self.routing == "learned"
            else torch.zeros(e_total, dtype=torch.int64, device=flat.device)
        )
        gathered = local.view(1, -1)
        if self.ep > 1:
            out = local.new_empty(self.ep * e_total)
            dist.all_gather_single(out, local.contiguous(), group=self.ep_group)
            gathered = out.view(self.ep, e_total)
        if self.routing == "balanced":
            return [balanced_counts(tokens * self.top_k, e_total)] * self.ep
        return [[int(c) for c in row] for row in gathered.tolist()]

    def _run_experts(self, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Each local expert on its consecutive rows."""
        outs = [mlp(part) for mlp, part in zip(self.experts, rows.split(sizes), strict=True)]
        return torch.cat(outs) if outs else rows

    def _dropless(self, xf: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        tokens, k = idx.shape
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)  # assignments grouped by expert
        rows = xf.index_select(0, order // k)
        counts = self._counts(flat, tokens)
        per, me = len(self.experts), self.ep_rank
        if self.ep > 1:
            send = [sum(counts[me][d * per : (d + 1) * per]) for d in range(self.ep)]
            recv = [sum(counts[s][me * per : (me + 1) * per]) for s in range(self.ep)]
            got = AllToAll.apply(rows, self.ep_group, recv, send)
            # from each source rank, its rows for my experts in expert order: regroup by expert
            blocks = [
                (s, e, counts[s][me * per + e]) for s in range(self.ep) for e in range(per)
            ]
            starts, pos = {}, 0
            for s, e, c in blocks:
                starts[(s, e)] = pos
                pos += c
            perm = [
                starts[(s, e)] + i
                for e in range(per)
                for s in range(self.ep)
                for i in range(counts[s][me * per + e])
            ]
            perm_t = torch.tensor(perm, dtype=torch.long, device=xf.device)
            sizes = [sum(counts[s][me * per + e] for s in range(self.ep)) for e in range(per)]
            out_sorted = self._run_experts(got.index_select(0, perm_t), sizes)
            back = torch.empty_like(out_sorted).index_copy(0, perm_t, out_sorted)
            done = AllToAll.apply(back, self.ep_group, send, recv)
        else:
            done = self._run_experts(rows, counts[0])
        # back to (token, slot) order, weighted, summed over each token's k experts
        out = torch.empty_like(done).index_copy(0, order, done)
        return (out.view(tokens, k, -1) * weight.unsqueeze(-1)).sum(1)

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
        per = len(self.experts)
        if self.ep > 1:
            got = AllToAll.apply(buf.reshape(e_total * cap, -1), self.ep_group)
            # [source rank][my expert][slot] -> per expert, every source's slots
            got = got.view(self.ep, per, cap, -1).transpose(0, 1).reshape(per * self.ep * cap, -1)
            done = self._run_experts(got, [self.ep * cap] * per)
            done = done.view(per, self.ep, cap, -1).transpose(0, 1).reshape(e_total * cap, -1)
            done = AllToAll.apply(done, self.ep_group).view(e_total, cap, -1)
        else:
            done = self._run_experts(buf.reshape(e_total * cap, -1), [cap] * per)
            done = done.view(e_total, cap, -1)
        gate = w.index_select(0, slot.reshape(-1)).view(e_total, cap) * keep.to(w.dtype)
        out = torch.zeros_like(xf)
        return out.index_add(0, (slot // k).reshape(-1), (done * gate.unsqueeze(-1)).flatten(0, 1))
