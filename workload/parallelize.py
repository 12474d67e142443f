"""How a rank's chunks are parallelised, all on one DeviceMesh with dims named after the plan's axes
("pp", "dp", "tp", outermost first by default). NCCL on GPUs, gloo on CPUs: the same code.

- data parallel, zero 0: gradients averaged by one flat all-reduce over the dp group after the last
  backward (workload.trainer; not overlapped, so that it can be timed). zero 1 and 2: FSDP2
  ``fully_shard`` with ``reshard_after_forward=False`` (parameters stay gathered from forward to
  backward, gradients reduce-scattered: ZeRO-2). zero 3: ``reshard_after_forward=True``. One FSDP
  unit per block and one for the rest of each chunk.
- tensor parallel 1D (Megatron layout) and sequence parallel with DTensor parallel styles; one
  ``PrepareModuleInput`` per sub-layer so that the backward reduces the input gradient once (the
  f / g operators); the LM head is column-parallel with a vocab-parallel cross-entropy
  (``loss_parallel``); the token embedding is row-parallel (vocab-sharded, all-reduce forward); the
  learned position embedding is replicated and, with SP, the sum is scattered along the sequence
  (all-gather backward), as Megatron does with learned positions.
- pipeline parallel: workload.trainer (``torch.distributed.pipelining``).
- bf16 gradients are reduced in fp32 (FSDP2's reduce_dtype), as Megatron-LM does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from workload.model import Chunk


def make_mesh(plan: dict[str, Any], device_type: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    placement = plan.get("placement", "tp,dp,pp")
    inner_first = (
        [a.strip() for a in placement.split(",")] if isinstance(placement, str) else placement
    )
    names = tuple(reversed(inner_first))
    return init_device_mesh(device_type, tuple(plan[a] for a in names), mesh_dim_names=names)



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
    block: Any  # a Block (a ModuleList yields Module to mypy)
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

