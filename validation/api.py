"""Validate a plan scaled down to this machine (used by `perfmodel recommend --validate`)."""

from __future__ import annotations

from typing import Any

from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan
from validation.run import RunSettings, default_run_dir, validate

MAX_LOCAL_RANKS = 4


def scale_down(model: TransformerSpec, plan: Plan) -> tuple[TransformerSpec, Plan]:
    """The same kind of layout on at most 4 local ranks, on a small model of the same family.

    Each parallel axis in use keeps 2 ranks (tp, pp, then dp while ranks remain); the schedule,
    recompute, sequence parallelism and ZeRO stage are kept; the model keeps its structure (gating,
    norms, and the proportions of its explicit MLP width, key/value grouping and attention width:
    TransformerSpec.scaled) at 4 layers, hidden 256, 8 heads, 128 tokens, vocabulary 1024.
    """
    tp = 2 if plan.tp > 1 else 1
    pp = 2 if plan.pp > 1 else 1
    dp = 2 if plan.dp > 1 and tp * pp * 2 <= MAX_LOCAL_RANKS else 1
    v = 2 if plan.schedule.value == "interleaved" else 1
    small = model.scaled(name=f"{model.name}-scaled", layers=4, hidden=256, heads=8, seq_len=128,
                         vocab=1024)
    if small.kv_heads < tp:  # the job splits whole key/value heads over the tp ranks
        small = small.replace(kv_heads=tp)
    micro = min(plan.micro_batch, 2)
    m = max(2, pp * v) if pp > 1 else 2
    layout = plan.replace(gpus=dp * tp * pp, dp=dp, tp=tp, pp=pp, virtual_stages=v,
                          micro_batch=micro, global_batch=dp * micro * m,
                          sequence_parallel=plan.sequence_parallel and tp > 1,
                          zero=plan.zero if dp > 1 else 0, tp_layout="1d", tp_depth=1)
    return small, layout.check(small)


def validate_scaled(model: TransformerSpec, hardware: Any, plan: Plan,
                    steps: int = 3) -> dict[str, Any]:
    """Scale the plan down, run it with gloo (NCCL where GPUs are), return the report."""
    small, local = scale_down(model, plan)
    backend = "nccl" if _has_cuda() and local.gpus <= _cuda_count() else "gloo"
    settings = RunSettings(nprocs=local.gpus, backend=backend, steps=steps, warmup=1)
    report = validate(small, hardware, local, settings, default_run_dir(local))
    report["scaled_from"] = plan.to_dict()
    return report


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


__all__ = ["scale_down", "validate_scaled"]
