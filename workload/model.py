"""The model the validation job trains and calibration times: a GPT-style transformer cut into
pipeline chunks. Its configuration is a plain dict (the job's JSON config, "model" and "plan").

Embeddings are not tied (tying across pipeline stages needs an extra all-reduce the job does not
do); positions are learned even for rotary models. recompute: ``full`` checkpoints every
transformer block, ``selective`` only the attention core.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}





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
        if self.output is not None and self.norm is not None:  # both on the last chunk
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
    block: Any  # a Block (a ModuleList yields Module to mypy)
    for block in mod.layers:
        block.full_recompute = recompute == "full"
        block.attention.selective = recompute == "selective"
    return mod



def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))

