"""The job as validation runs it: the model and plan as workload builds and runs them, its JSON
config (workload.job reads it), and the settings of a run. Used by the real run (validation.run),
the dry run (validation.dryrun), the ledger check (validation.ledger) and the layouts' command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    nprocs: int
    backend: str = "gloo"
    steps: int = 3
    warmup: int = 1
    timeout_s: float = 300.0
    master_addr: str = "127.0.0.1"
    port: int | None = None
    fault: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def local_dtype(plan: Plan, backend: str) -> tuple[Plan, str]:
    """The plan the local job really runs: bf16/fp16 become fp32 on a CPU (no fast path there)."""
    if backend == "gloo" and plan.dtype.value in ("bf16", "fp16"):
        note = (
            f"{plan.dtype.value} has no fast path on this CPU (60-200x slower than fp32): "
            "the run and the prediction both use fp32"
        )
        return plan.replace(dtype="fp32"), note
    return plan, ""


def job_model(model: TransformerSpec) -> TransformerSpec:
    """The model as the job (workload.model) builds it: untied embeddings (tying across pipeline
    stages needs an all-reduce the job does not do) and a learned position table (seq_len x
    hidden) even for rotary models. The prediction, the ledger and --dry-run all take this model."""
    return model.replace(tied_embeddings=False, position_embedding="learned")


def job_model_note(model: TransformerSpec) -> str:
    """What job_model changed, for the user ('' when nothing)."""
    changed = []
    if model.position_embedding != "learned":
        changed.append(
            f"learns a position table where {model.name} uses {model.position_embedding} positions"
        )
    if model.tied_embeddings:
        changed.append("unties the embeddings")
    return f"the job {' and '.join(changed)}: compared as the job builds it" if changed else ""


def as_run(model: TransformerSpec, plan: Plan, backend: str) -> tuple[TransformerSpec, Plan, str]:
    """The model and plan the job really runs, so that the prediction describes the same job.

    The job unties the embeddings and learns positions (job_model); it attends with fused SDPA
    (no s^2 activations: flash_attention); it syncs gradients after backward, gathers parameters
    when it needs them and communicates tensor-parallel between its GEMMs (no overlap); it runs
    eagerly; bf16/fp16 become fp32 on a CPU (gloo). Returns the notes the user should read.
    """
    plan, note = local_dtype(plan, backend)
    notes = [note] if note else []
    model = job_model(model)
    if plan.overlap_grad_sync:
        notes.append("the job syncs gradients after backward: predicted without overlap")
    if plan.overlap_param_gather or plan.tp_comm_overlap:
        notes.append("the job overlaps no parameter gather or tensor-parallel communication: "
                     "predicted without")
    if plan.stack.value != "eager":
        notes.append(f"the job runs eagerly, not {plan.stack.value}: predicted eager")
    plan = plan.replace(flash_attention=True, overlap_grad_sync=False, overlap_param_gather=False,
                        tp_comm_overlap=False, stack="eager")
    return model, plan, "; ".join(notes)


def job_config(model: TransformerSpec, plan: Plan, settings: RunSettings) -> dict[str, Any]:
    """The job's JSON config (see workload.job)."""
    return {
        "model": {
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "seq_len": model.seq_len,
            "vocab": model.vocab,
            "ffn_hidden": model.ffn_hidden,
            "kv_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "gated_mlp": model.gated_mlp,
            "bias": model.bias,
            "norm": model.norm,
        },
        "plan": plan.to_dict(),
        "backend": settings.backend,
        "steps": settings.steps,
        "warmup": settings.warmup,
        "timeout_s": settings.timeout_s,
        "fault": settings.fault,
        **settings.extra,
    }


def model_overrides(model: Any, kw: dict[str, Any]) -> Any:
    """Scale the model down for a small machine (--layers, --hidden, --heads, --vocab, ...)."""
    changes = {
        k: kw[k]
        for k in ("layers", "hidden", "heads", "vocab", "ffn_hidden")
        if kw.get(k) is not None
    }
    if not changes:
        return model
    # the MLP width, key/value grouping and attention width keep their proportions
    return model.scaled(**changes)
