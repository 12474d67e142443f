"""Context parallelism: the sequence sharded over the cp ranks, and causal attention across them.

Layout (Megatron-LM's get_batch_on_this_cp_rank; Transformer Engine): the sequence is cut into
2 cp chunks of s / (2 cp) tokens and cp rank i holds chunks i and 2 cp - 1 - i, in that order, so
that every rank does the same share of the causal attention work. Everything outside attention
(embeddings, norms, MLPs, the loss) is token-wise and runs on the rank's s / cp tokens unchanged.

Attention, three ways (Megatron-Core's ``cp_comm_type``, implemented by Transformer Engine's
context_parallel.py); C = b (s / cp) (kv_heads / tp) head_dim elements, one of K or V of the local
chunk; per layer and micro-batch:

- ``p2p`` (ring attention; TE AttnFuncWithCPAndKVP2P): K and V travel round the ring in one
  buffer, by send/recv, while the local queries attend to the chunk at hand; partial results are
  merged by their log-sum-exp (online softmax). Causal masking per chunk pair: the local chunk
  pair is causal, a pair from a lower cp rank is attended by all local queries but only with its
  first chunk, a pair from a higher rank only by the second local chunk (with both of its chunks).
  Forward: cp - 1 exchanges (each one send to the next rank and one receive from the previous) of
  2C elements. Backward, round the ring the other way, K/V and their gradients in one buffer:
  cp exchanges, the first of 2C (K, V), cp - 2 of 4C (K, V, dK, dV), the last of 2C (dK, dV), after
  which each rank holds its own chunk's dK, dV. The forward keeps the last K/V it received (the
  next rank's), where the backward starts: no extra message.
- ``allgather`` (TE AttnFuncWithCPAndKVAllGather; Llama 3, Sec. 3.3.2): K and V all-gathered
  (two calls, each gathering cp C elements), each local chunk attends to the keys up to its own
  end; the backward gathers K and V again (nothing kept) and reduce-scatters dK and dV:
  forward 2 all-gathers, backward 2 all-gathers and 2 reduce-scatters, each of cp C elements.
- ``a2a`` (Ulysses, Jacobs et al. 2023; TE's a2a): all-to-alls swap the sequence shards for head
  shards (heads / (tp cp) per rank, the full sequence), attention runs locally, and one all-to-all
  swaps back: forward 4 all-to-alls (Q, K, V, the output), backward 4 (their gradients); Q and the
  output of b (s / cp) (heads / tp) head_dim elements, K and V of C. Needs heads / tp and
  kv_heads / tp divisible by cp.

Why not torch.distributed.tensor.experimental.context_parallel (torch 2.13): it dispatches on the
CUDA SDPA kernels only (flash, memory-efficient and cuDNN attention, in its _attention.py handler
table), never on the CPU one (aten._scaled_dot_product_flash_attention_for_cpu), so under gloo the
attention would run unsharded; and its ring rotates K/V by all-gather or all-to-all
(rotate_method), not by Megatron's send/recv, which is what the model costs. Hence our own ring
over torch.distributed point-to-point (isend/irecv: gloo has them; batch_isend_irecv is avoided
because it needs a device backend the dry run's meta tensors lack).

The attention math is written out (scores, log-sum-exp, the FlashAttention backward: dS = P (dP -
rowsum(dO O))), in fp32, so that forward and backward see exactly the blocks the ring exchanges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True)
class CPGroup:
    """The context-parallel group of this rank: its process group, rank in it, size, and how
    attention communicates (workload.settings.CPComm)."""

    group: Any
    rank: int
    size: int
    comm: str = "p2p"  # workload.settings.CPComm


def chunk_order(cp: int) -> list[int]:
    """The sequence chunks in rank-slot order: rank 0's two, rank 1's two, ...
    [0, 2cp-1, 1, 2cp-2, ...]."""
    return [c for r in range(cp) for c in (r, 2 * cp - 1 - r)]


def local_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The token positions cp rank `rank` holds: chunk rank then chunk 2 cp - 1 - rank."""
    cs = seq_len // (2 * cp)
    first = torch.arange(rank * cs, (rank + 1) * cs)
    second = torch.arange((2 * cp - 1 - rank) * cs, (2 * cp - rank) * cs)
    return torch.cat([first, second])


# --- the attention math of one block of queries and keys ----------------------------------------


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Key/value heads repeated for grouped-query attention (query head i uses kv head i // g)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _fold(dx: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of _expand: summed over each kv head's query heads."""
    if groups == 1:
        return dx
    b, h, n, d = dx.shape
    return dx.view(b, h // groups, groups, n, d).sum(2)


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries q (b, h, m, d) to keys/values k, v (b, h_kv, n, d), mask (m, n: True
    attends) or None: the output O = softmax(S) V and the log-sum-exp L of each row of
    S = q k^T / sqrt(d) (fp32)."""
    g = q.shape[1] // k.shape[1]
    s = _scores(q.float(), _expand(k, g).float(), mask)
    lse = torch.logsumexp(s, -1)
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), _expand(v, g).float())
    return out, lse


def block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of one block, given the rows' final log-sum-exp L and delta = rowsum(dO * O)
    (FlashAttention-2's backward, Dao 2023, Alg. 2): P = exp(S - L), dV = P^T dO, dP = dO V^T,
    dS = P (dP - delta), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)."""
    g = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), _expand(k, g).float(), _expand(v, g).float()
    p = torch.exp(_scores(qf, kf, mask) - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, vf.transpose(-1, -2)) - delta.unsqueeze(-1))
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qf) * scale
    return dq, _fold(dk, g), _fold(dv, g)


def _merge(
    out: torch.Tensor, lse: torch.Tensor, out_i: torch.Tensor, lse_i: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Online softmax: two partial results over disjoint keys merged by their log-sum-exps."""
    new = torch.logaddexp(lse, lse_i)
    return (
        out * torch.exp(lse - new).unsqueeze(-1) + out_i * torch.exp(lse_i - new).unsqueeze(-1),
        new,
    )


def _causal(n: int, device: Any) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


# --- p2p: ring attention ------------------------------------------------------------------------


def _exchange(send: torch.Tensor, recv: torch.Tensor, cpg: CPGroup, forward: bool) -> list[Any]:
    """One ring step: send to the next rank and receive from the previous one (forward), or the
    other way round (backward). Even ranks post the send first (TE's flash_attn_p2p_communicate)."""
    nxt, prv = (cpg.rank + 1) % cpg.size, (cpg.rank - 1) % cpg.size
    dst, src = (nxt, prv) if forward else (prv, nxt)
    ops = [
        lambda: dist.isend(send, group=cpg.group, group_dst=dst),
        lambda: dist.irecv(recv, group=cpg.group, group_src=src),
    ]
    if cpg.rank % 2:
        ops.reverse()
    return [op() for op in ops]


def _wait(reqs: list[Any]) -> None:
    for req in reqs:
        if req is not None:
            req.wait()


def _pair_rows(src: int, rank: int, half: int) -> tuple[slice, slice, bool]:
    """For the local queries and the K/V pair of cp rank src: (query rows, key rows, causal)."""
    if src == rank:
        return slice(None), slice(None), True  # the local pair: causal over both chunks
    if src < rank:
        return slice(None), slice(0, half), False  # every local query, their first chunk
    return slice(half, None), slice(None), False  # the second local chunk, both of theirs


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cpg: CPGroup
    ) -> torch.Tensor:
        r, n = cpg.rank, cpg.size
        half = q.shape[2] // 2
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        for i in range(n):
            reqs: list[Any] = []
            if i < n - 1:
                nxt = torch.empty_like(kv)
                reqs = _exchange(kv, nxt, cpg, forward=True)
            rows, keys, causal = _pair_rows((r - i) % n, r, half)
            mask = _causal(q.shape[2], q.device) if causal else None
            o_i, l_i = block_forward(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], mask)
            out[:, :, rows], lse[:, :, rows] = _merge(out[:, :, rows], lse[:, :, rows], o_i, l_i)
            _wait(reqs)
            if i < n - 1:
                kv = nxt
        ctx.cpg = cpg
        ctx.save_for_backward(q, kv, out, lse)  # kv: the next rank's pair, where backward starts
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, kv, out, lse = ctx.saved_tensors
        cpg: CPGroup = ctx.cpg
        r, n = cpg.rank, cpg.size
        half = q.shape[2] // 2
        dout = dout.float()
        delta = (dout * out).sum(-1)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        acc: torch.Tensor | None = None  # dK, dV of the pair handled at the previous step
        for i in range(n):
            if i == 0:
                send = kv
            elif i < n - 1:
                assert acc is not None
                send = torch.cat([kv, acc.to(kv.dtype)]).contiguous()
            else:
                assert acc is not None
                send = acc.to(kv.dtype).contiguous()
            recv = torch.empty_like(send)
            reqs = _exchange(send, recv, cpg, forward=False)
            rows, keys, causal = _pair_rows((r + 1 + i) % n, r, half)
            mask = _causal(q.shape[2], q.device) if causal else None
            dq_i, dk_i, dv_i = block_backward(
                q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], mask,
                dout[:, :, rows], lse[:, :, rows], delta[:, :, rows],
            )
            dq[:, :, rows] += dq_i
            mine = torch.zeros((2, *kv.shape[1:]), dtype=torch.float32, device=q.device)
            mine[0][:, :, keys] = dk_i
            mine[1][:, :, keys] = dv_i
            _wait(reqs)
            # what arrived: the next pair (i < n - 1) and, from step 1, the dK/dV of this one
            acc = mine if i == 0 else mine + recv[-2:].float()
            if i < n - 1:
                kv = recv[:2]
        assert acc is not None  # the local pair's dK, dV, complete
        return dq.to(q.dtype), acc[0].to(q.dtype), acc[1].to(q.dtype), None


# --- allgather: K/V gathered, local chunks attend up to their end -------------------------------


def _natural(slots: torch.Tensor, cp: int) -> torch.Tensor:
    """(cp, b, h, s/cp, d) in rank-slot order -> (b, h, s, d) in sequence order."""
    _, b, h, sl, d = slots.shape
    x = slots.permute(1, 2, 0, 3, 4).reshape(b, h, 2 * cp, sl // 2, d)
    slot_of = sorted(range(2 * cp), key=chunk_order(cp).__getitem__)  # chunk c's slot
    order = torch.tensor(slot_of, device=slots.device)
    return x.index_select(2, order).reshape(b, h, cp * sl, d)


def _slots(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(b, h, s, d) in sequence order -> (cp, b, h, s/cp, d) in rank-slot order."""
    b, h, s, d = x.shape
    order = torch.tensor(chunk_order(cp), device=x.device)
    chunks = x.reshape(b, h, 2 * cp, s // (2 * cp), d).index_select(2, order)
    return chunks.reshape(b, h, cp, s // cp, d).permute(2, 0, 1, 3, 4)


def _gather_kv(k: torch.Tensor, v: torch.Tensor, cpg: CPGroup) -> list[torch.Tensor]:
    """K and V of the whole sequence (two all-gathers), in sequence order."""
    full = []
    for x in (k, v):
        out = x.new_empty((cpg.size * x.shape[0], *x.shape[1:]))  # gloo: ranks along dim 0
        dist.all_gather_single(out, x.contiguous(), group=cpg.group)
        full.append(_natural(out.view(cpg.size, *x.shape), cpg.size))
    return full


def _prefix_masks(rank: int, cp: int, cs: int, device: Any) -> list[tuple[int, torch.Tensor]]:
    """For each local chunk: how many keys it sees (up to its end) and its causal mask."""
    out = []
    for c in (rank, 2 * cp - 1 - rank):
        n = (c + 1) * cs
        qpos = torch.arange(c * cs, n, device=device).unsqueeze(1)
        out.append((n, torch.arange(n, device=device).unsqueeze(0) <= qpos))
    return out


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cpg: CPGroup
    ) -> torch.Tensor:
        kf, vf = _gather_kv(k, v, cpg)
        cs = q.shape[2] // 2
        outs, lses = [], []
        for j, (n, mask) in enumerate(_prefix_masks(cpg.rank, cpg.size, cs, q.device)):
            o, lse = block_forward(q[:, :, j * cs : (j + 1) * cs], kf[:, :, :n], vf[:, :, :n], mask)
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
        ctx.cpg = cpg
        ctx.save_for_backward(q, k, v, out, lse)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        cpg: CPGroup = ctx.cpg
        kf, vf = _gather_kv(k, v, cpg)  # gathered again: the forward keeps only its own chunk
        dout = dout.float()
        delta = (dout * out).sum(-1)
        cs = q.shape[2] // 2
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dkf = torch.zeros(kf.shape, dtype=torch.float32, device=q.device)
        dvf = torch.zeros_like(dkf)
        for j, (n, mask) in enumerate(_prefix_masks(cpg.rank, cpg.size, cs, q.device)):
            rows = slice(j * cs, (j + 1) * cs)
            dq_j, dk_j, dv_j = block_backward(
                q[:, :, rows], kf[:, :, :n], vf[:, :, :n], mask,
                dout[:, :, rows], lse[:, :, rows], delta[:, :, rows],
            )
            dq[:, :, rows] = dq_j
            dkf[:, :, :n] += dk_j
            dvf[:, :, :n] += dv_j
        grads = []
        for g in (dkf, dvf):  # each rank's slot, summed over the ranks
            local = k.new_empty(k.shape)
            slots = _slots(g, cpg.size).to(k.dtype).reshape(cpg.size * k.shape[0], *k.shape[1:])
            dist.reduce_scatter_single(local, slots, group=cpg.group)
            grads.append(local)
        return dq.to(q.dtype), grads[0], grads[1], None


# --- a2a: Ulysses -------------------------------------------------------------------------------


class AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 (split sizes optional), differentiable: the backward is the
    all-to-all back with the split sizes swapped (Megatron's _AllToAll)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        group: Any,
        out_splits: list[int] | None = None,
        in_splits: list[int] | None = None,
    ) -> torch.Tensor:
        ctx.group, ctx.splits = group, (out_splits, in_splits)
        rows = sum(out_splits) if out_splits is not None else x.shape[0]
        out = x.new_empty((rows, *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits) if in_splits is not None else grad.shape[0],
                               *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def _seq_to_heads(x: torch.Tensor, cpg: CPGroup) -> torch.Tensor:
    """(b, h, s/cp, d), all local heads of the rank's chunks -> (b, h/cp, s, d), the rank's head
    group over the whole sequence, in sequence order."""
    b, h, sl, d = x.shape
    parts = x.reshape(b, cpg.size, h // cpg.size, sl, d).permute(1, 0, 2, 3, 4)
    got = AllToAll.apply(parts.contiguous(), cpg.group)  # [j]: rank j's chunks, my heads
    return _natural(got, cpg.size)


def _heads_to_seq(x: torch.Tensor, cpg: CPGroup) -> torch.Tensor:
    """The inverse of _seq_to_heads."""
    got = AllToAll.apply(_slots(x, cpg.size).contiguous(), cpg.group)  # [j]: head group j
    cp, b, hg, sl, d = got.shape
    return got.permute(1, 0, 2, 3, 4).reshape(b, cp * hg, sl, d)


def _ulysses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cpg: CPGroup) -> torch.Tensor:
    qh, kh, vh = (_seq_to_heads(x, cpg) for x in (q, k, v))
    y = F.scaled_dot_product_attention(
        qh, kh, vh, is_causal=True, enable_gqa=qh.shape[1] != kh.shape[1]
    )
    return _heads_to_seq(y, cpg)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cpg: CPGroup) -> torch.Tensor:
    """Causal attention of this rank's queries q (b, heads, s/cp, d) over the whole sequence,
    given the rank's keys and values (b, kv_heads, s/cp, d), by cpg.comm."""
    if cpg.comm == "allgather":
        return _AllGatherAttention.apply(q, k, v, cpg)
    if cpg.comm == "a2a":
        return _ulysses(q, k, v, cpg)
    return _RingAttention.apply(q, k, v, cpg)
