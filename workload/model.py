"""The model the validation job trains and calibration times: a GPT-style transformer cut into
pipeline chunks. Its configuration is a plain dict (the job's JSON config, "model" and "plan").

Embeddings are not tied (tying across pipeline stages needs an extra all-reduce the job does not
do); positions are learned even for rotary models. recompute: ``full`` checkpoints every
transformer block, ``selective`` only the attention core, ``op`` every block with torchtitan's
per-op policy (the outputs of every other matmul, of the attention kernel and of the
reduce-scatters saved, the rest recomputed); ``recompute_every`` N applies the policy to the N-th,
2N-th, ... block a rank holds (torchtitan's selective layer AC); ``recompute_method`` block with
``recompute_num_layers`` k recomputes the first k blocks of each chunk, uniform with k > 1
checkpoints a chunk's blocks in groups of k (Megatron-LM's methods).

Mixture of experts (model keys experts, top_k, expert_ffn_hidden, shared_experts,
shared_expert_ffn_hidden, capacity_factor and moe_layers, the global indices of the MoE layers):
those layers' MLP is workload.moe.MoE. Context parallelism: a block's attention core runs
workload.context_parallel.attention when ``attention.cp`` is set, and the embedding takes the
rank's token positions (``embedding.positions``). The plan's ``flash_attention`` false
(``--attention unfused``) attends without SDPA: the scores and context products and a softmax
whose output the backward keeps (b heads s^2 values), as Megatron's unfused core does without
attention dropout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from workload.context_parallel import CPGroup, attention
from workload.moe import MoE
from workload.settings import JOB_RECOMPUTE_MODULES

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
        # the positions of the tokens this rank holds (context parallelism); None: 0 .. s-1
        self.positions: torch.Tensor | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = self.positions
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class Attention(nn.Module):
    def __init__(self, m: dict[str, Any]) -> None:
        super().__init__()
        hidden, heads, kv_heads = m["hidden"], m["heads"], m["kv_heads"]
        self.head_dim = m.get("head_dim") or hidden // heads  # the attention is heads x head_dim
        bias = m["bias"]
        # Qwen2's q, k and v projections have biases where its other linear layers have none
        qkv_bias = m.get("qkv_bias", bias)
        self.wq = nn.Linear(hidden, heads * self.head_dim, bias=qkv_bias)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.wo = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.selective = False
        self.unfused = False  # the plan's flash_attention false: unfused_attention
        self.cp: CPGroup | None = None  # context parallelism: this rank's group

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.cp is not None:
            return attention(q, k, v, self.cp)
        if self.unfused:
            return unfused_attention(q, k, v)
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
            # early_stop off: the core again whole, its context-parallel exchanges included (the
            # output all-to-all of Ulysses follows the last tensor the backward needs back)
            y = checkpoint(self._core, q, k, v, use_reentrant=False, early_stop=False)
        else:
            y = self._core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


def unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention as two batched products and a softmax (q: b, heads, s, d; k, v: b,
    kv heads, s, d). The scale goes on q (its product saves the scaled q, no s^2 copy), the mask
    is filled in place, and the softmax's output is the one s^2 tensor the backward keeps."""
    group = q.shape[1] // k.shape[1]
    if group > 1:  # grouped-query attention: each kv head serves `group` query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q.shape[2]
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu_(1)
    scores.masked_fill_(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


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


def _op_save_list() -> set[Any]:
    """The ops whose outputs torchtitan's per-op recompute keeps (torchtitan
    parallelize_llama.py _save_list, 2024): matmuls, the SDPA kernels (here also the CPU flash
    kernel the job runs) and reduce-scatters. The job's linear layers have biases, which run as
    addmm: counted with the matmuls."""
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default,
           aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_flash_attention.default,
           torch.ops._c10d_functional.reduce_scatter_tensor.default}
    cpu_flash = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_flash is not None:
        ops.add(cpu_flash.default)
    return ops


def _op_policy_context() -> Any:
    """torchtitan's per-op policy for one block: save what the save list makes, except every
    second matmul (counted in the block's forward, and again in its recompute)."""
    save, matmuls = _op_save_list(), {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in matmuls:
            counts[mode] += 1
        if func in save and not (func in matmuls and counts[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Block(nn.Module):
    def __init__(self, m: dict[str, Any], moe: bool = False) -> None:
        super().__init__()
        self.attention_norm = _norm(m["norm"], m["hidden"])
        self.attention = Attention(m)
        self.ffn_norm = _norm(m["norm"], m["hidden"])
        self.feed_forward: nn.Module = MoE(m, MLP) if moe else MLP(m)
        self.full_recompute = False
        self.op_recompute = False
        # selective recompute's mlp module (a dense block's MLP under a checkpoint, its
        # collectives included, as Megatron-Core's recompute_modules mlp)
        self.mlp_recompute = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        h = self.ffn_norm(x)
        if self.mlp_recompute and torch.is_grad_enabled():
            return x + checkpoint(self.feed_forward, h, use_reentrant=False, early_stop=False)
        return x + self.feed_forward(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            # the whole layer again, its last collectives included, as Megatron's full recompute
            # runs it (tensor_parallel.checkpoint, reentrant); torch's non-reentrant checkpoint
            # would stop once the saved tensors are back (early_stop), skipping the MLP's
            # reduce-scatter
            return checkpoint(self._forward, x, use_reentrant=False, early_stop=False)
        if self.op_recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False,
                              context_fn=_op_policy_context)
        return self._forward(x)


class Chunk(nn.Module):
    """One pipeline chunk: [embedding] + blocks + [final norm and LM head]."""

    def __init__(
        self, m: dict[str, Any], layers: int, first: bool, last: bool, offset: int = 0
    ) -> None:
        super().__init__()
        self.embedding = Embedding(m) if first else None
        moe = set(m.get("moe_layers") or ())  # global layer indices
        self.layers = nn.ModuleList(Block(m, offset + i in moe) for i in range(layers))
        self.norm = _norm(m["norm"], m["hidden"]) if last else None
        self.output = nn.Linear(m["hidden"], m["vocab"], bias=False) if last else None
        # full recompute in groups of this many blocks (Megatron's uniform method with
        # --recompute-num-layers k: each group keeps its input and recomputes its k blocks)
        self.recompute_group = 1

    def _run(self, start: int, end: int) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers[start:end]:
                x = layer(x)
            return x
        return run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        group = self.recompute_group
        if group > 1 and torch.is_grad_enabled():
            for start in range(0, len(self.layers), group):
                x = checkpoint(self._run(start, start + group), x, use_reentrant=False,
                               early_stop=False)
        else:
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


def _pp_rank_of(plan: dict[str, Any], chunk: int) -> int:
    """The pipeline rank that holds a chunk (chunk_ids inverted)."""
    pp = plan["pp"]
    if plan.get("schedule") == "zbv":
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def chunk_layers(m: dict[str, Any], plan: dict[str, Any], chunk: int) -> int:
    """Layers of one chunk: L / (pp v), or with an uneven split (the plan's first_stage_layers /
    last_stage_layers, Megatron's --decoder-first/last-pipeline-num-layers) its stage's layers
    (the given ones, the others sharing the rest evenly) over v, or the plan's chunk_layers (a
    pipeline layout's, Megatron's --pipeline-model-parallel-layout) of each chunk."""
    pp, v = plan["pp"], plan.get("virtual_stages", 1)
    given = plan.get("chunk_layers")
    if given is not None:  # a pipeline layout's (perfmodel.pipeline_layout), in model order
        if (not isinstance(given, list) or len(given) != pp * v
                or not all(isinstance(n, int) and n >= 0 for n in given)
                or sum(given) != m["layers"]):
            raise ValueError(f"chunk_layers must list pp x virtual_stages ({pp * v}) whole "
                             f"numbers that add up to the layers ({m['layers']}), got {given!r}")
        return given[chunk]
    first, last = plan.get("first_stage_layers", 0), plan.get("last_stage_layers", 0)
    if not (first or last):
        if m["layers"] % (pp * v):
            raise ValueError(
                f"layers ({m['layers']}) must be divisible by pp x virtual_stages ({pp * v})"
            )
        return m["layers"] // (pp * v)
    if plan.get("schedule") == "zbv":
        raise ValueError("first/last_stage_layers do not apply to schedule zbv")
    shared = pp - (first > 0) - (last > 0)
    rest = m["layers"] - first - last
    stage = _pp_rank_of(plan, chunk)
    layers = first if stage == 0 and first else last if stage == pp - 1 and last else (
        rest // shared if shared else 0)
    if layers % v or (shared and rest % shared):
        raise ValueError(f"the stages' layers ({first} first, {last} last, {rest} shared by "
                         f"{shared}) must split into {v} chunks each")
    return layers // v


def build_chunk(m: dict[str, Any], plan: dict[str, Any], chunk: int) -> Chunk:
    n_chunks = plan["pp"] * plan.get("virtual_stages", 1)
    layers = chunk_layers(m, plan, chunk)
    offset = sum(chunk_layers(m, plan, c) for c in range(chunk))  # the chunks before it
    mod = Chunk(m, layers, first=chunk == 0, last=chunk == n_chunks - 1, offset=offset)
    recompute = plan.get("recompute", "none")
    every = int(plan.get("recompute_every", 1) or 1)
    # full recompute by Megatron's methods: block, the first k blocks of the chunk; uniform,
    # every block, in groups of k (the chunk's own checkpoints; its blocks then run plain)
    method = plan.get("recompute_method") or "uniform"
    count = int(plan.get("recompute_num_layers", 1) or 1)
    if recompute == "full" and method == "uniform" and count > 1:
        mod.recompute_group = count
    # the blocks a rank holds, numbered 1, 2, ... in the order it builds them (its chunks in
    # order): the policy applies to the N-th, 2N-th, ... (torchtitan's counter)
    held = chunk_ids(plan, _pp_rank_of(plan, chunk))
    first = sum(chunk_layers(m, plan, c) for c in held[:held.index(chunk)])
    modules = recompute_modules(plan)
    block: Any  # a Block (a ModuleList yields Module to mypy)
    for i, block in enumerate(mod.layers):
        on = (first + i + 1) % every == 0
        if recompute == "full" and method == "block":
            on = i < count
        block.full_recompute = on and recompute == "full" and mod.recompute_group == 1
        block.op_recompute = on and recompute == "op"
        selective = on and recompute == "selective"
        block.attention.selective = selective and "core_attn" in modules
        block.attention.unfused = plan.get("flash_attention") is False
        moe = isinstance(block.feed_forward, MoE)
        block.mlp_recompute = selective and "mlp" in modules and not moe
        if moe:
            block.feed_forward.shared_recompute = selective and "shared_experts" in modules
    return mod


def recompute_modules(plan: dict[str, Any]) -> set[str]:
    """Selective recompute's modules (the plan's recompute_modules, comma-separated; none:
    core_attn, Megatron-Core's default); ValueError for one the job does not build."""
    names = {n.strip() for n in str(plan.get("recompute_modules") or "").split(",") if n.strip()}
    unknown = names - set(JOB_RECOMPUTE_MODULES)
    if unknown:
        raise ValueError(f"recompute_modules {','.join(sorted(unknown))}: the job recomputes "
                         f"{', '.join(JOB_RECOMPUTE_MODULES)}")
    return names or {"core_attn"}


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))

