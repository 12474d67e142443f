"""The job as validation runs it: the model and plan as workload builds and runs them, its JSON
config (workload.job reads it), and the settings of a run. Used by the real run (validation.run),
the dry run (validation.dryrun), the ledger check (validation.ledger) and the layouts' command.

Context and expert parallelism: perfmodel's Plan has no cp / ep yet, so the job's degrees travel
beside it in JobParallel (cp, cp_comm, ep, moe_routing); once the Plan grows fields of those
names, job_parallel takes them from the plan. The world is dp x cp x tp x pp ranks; ep is carved
out of a stage's tp x cp x dp ranks, tp innermost (workload.parallelize).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmodel.errors import PlanError, SpecError
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan, Recompute, TpBackward, tp_backward_of
from workload.settings import (
    JOB_RECOMPUTE_MODULES,
    CPComm,
    MoERouting,
    adamw_kind,
    check_parallel,
)


@dataclass(frozen=True, kw_only=True)
class JobParallel:
    """The job's degrees that perfmodel's Plan does not hold: context parallelism (cp ranks,
    attention across them by cp_comm), expert parallelism (ep ranks) and how tokens choose their
    experts (moe_routing)."""

    cp: int = 1
    cp_comm: CPComm = CPComm.P2P
    ep: int = 1
    moe_routing: MoERouting = MoERouting.LEARNED

    def __post_init__(self) -> None:
        for key in ("cp", "ep"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{key} must be a positive integer, got {value!r}")
        for key, enum in (("cp_comm", CPComm), ("moe_routing", MoERouting)):
            value = getattr(self, key)
            try:
                object.__setattr__(self, key, enum(value))
            except ValueError:
                allowed = ", ".join(e.value for e in enum)
                raise PlanError(f"{key} must be one of {allowed}, got {value!r}") from None

    def plan_keys(self) -> dict[str, Any]:
        """The job config's plan keys (workload.settings)."""
        return {"cp": self.cp, "cp_comm": self.cp_comm.value, "ep": self.ep,
                "moe_routing": self.moe_routing.value}


def job_parallel(plan: Plan, given: JobParallel | None = None) -> JobParallel:
    """The plan's cp / ep where perfmodel's Plan holds them (fields cp, ep, and cp_comm if it has
    one), else the given ones (default: none). A degree given both ways must agree."""
    given = given or JobParallel()
    changes = {}
    for key in ("cp", "ep", "cp_comm"):
        if hasattr(plan, key):
            value = getattr(plan, key)
            value = getattr(value, "value", value)
            mine = getattr(given, key)
            if mine != getattr(JobParallel(), key) and mine != value:
                raise PlanError(f"{key} is {value} in the plan but {getattr(mine, 'value', mine)} "
                                "in the job's settings: give it once")
            changes[key] = value
    return JobParallel(**{**given.plan_keys(), **changes})


def world_size(plan: Plan, parallel: JobParallel) -> int:
    """The job's ranks: dp x cp x tp x pp (the plan's gpus already count cp once it holds it)."""
    return plan.gpus if hasattr(plan, "cp") else plan.gpus * parallel.cp


def check_job(model: TransformerSpec, plan: Plan, parallel: JobParallel) -> None:
    """What the job cannot build (SpecError) or run (PlanError), in one line naming the field."""
    missing = []
    if model.kv_lora_rank is not None:
        missing.append("multi-head latent attention (kv_lora_rank)")
    if model.windowed_layers and model.sliding_window is not None and (
            model.sliding_window < model.seq_len):
        missing.append("sliding-window attention (sliding_window)")
    if model.attention_sinks:
        missing.append("attention sinks (attention_sinks)")
    if model.mtp_layers:
        missing.append("multi-token-prediction modules (mtp_layers)")
    if missing:
        raise SpecError(f"model '{model.name}' has {'; '.join(missing)}: the validation job does "
                        "not build these")
    if plan.bf16_optimizer:
        raise PlanError("bf16_optimizer: the validation job runs Megatron's distributed "
                        "optimizer (workload/distopt.py), not DeepSpeed's BF16_Optimizer "
                        "(leave bf16_optimizer off)")
    if not plan.grad_accumulation_fusion:
        raise PlanError("grad_accumulation_fusion false: the validation job is plain torch, its "
                        "gradients accumulated by autograd in each parameter's .grad, without "
                        "Megatron-Core's main-gradient hook to add them apart (leave "
                        "grad_accumulation_fusion at its default, true)")
    if plan.pp_scatter_gather:
        raise PlanError("pp_scatter_gather: the validation job's stages send their outputs "
                        "whole, as Megatron-Core does (leave pp_scatter_gather off)")
    if plan.ep_comm_overlap:
        raise PlanError("ep_comm_overlap: the validation job runs each micro-batch's forward "
                        "and backward apart (no combined 1F1B)")
    if plan.layout is not None and plan.layout.middle_layers is not None:
        raise PlanError(f"pipeline_layout {plan.pipeline_layout}: its ranks between the first "
                        "and the last hold unequal layers, which the model costs each as the "
                        "slowest; the job's measured times and counts would not compare term by "
                        "term (validate a layout of equal ranks between)")
    if plan.pipeline_micro_batches:
        raise PlanError("pipeline_micro_batches: the validation job runs every micro-batch of "
                        "the step in one pipeline schedule (leave it 0)")
    if plan.ep_dispatcher.value != "alltoall":
        raise PlanError(f"ep_dispatcher {plan.ep_dispatcher.value}: the validation job "
                        "dispatches the experts' tokens with torch's all_to_all_single (give "
                        "ep_dispatcher alltoall; DeepEP's kernels run on NVLink and RDMA only)")
    check_loss(plan)
    # zero 0 and 3 on a GPU keep bf16 states and no master copy (local_dtype)
    own_bf16 = keeps_bf16_states(plan) and has_bf16_states(plan)
    if plan.master_weights not in (None, "fp32") and not own_bf16:
        raise PlanError(f"master_weights {plan.master_weights}: the validation job's optimizer "
                        "keeps fp32 master weights (give master_weights fp32)")
    if plan.dtype.value == "fp16" and plan.zero in (1, 2):
        raise PlanError(f"dtype fp16 with zero {plan.zero}: the validation job's distributed "
                        "optimizer reduces fp32 gradients, Megatron's (and the model's) fp16 "
                        "ones (give dtype bf16, or zero 0)")
    if plan.grad_dtype not in (None, "fp32") and not own_bf16:
        raise PlanError(f"grad_dtype {plan.grad_dtype}: the validation job keeps and reduces "
                        "fp32 gradients for 16-bit weights (workload/distopt.py; give grad_dtype "
                        "fp32 or leave it out)")
    if plan.recompute is Recompute.OP and max(parallel.cp, parallel.ep, plan.cp, plan.ep) > 1:
        raise PlanError("recompute op with context or expert parallelism: the validation job's "
                        "per-op policy saves attention and the tensor-parallel reductions, not "
                        "the context-parallel or expert exchanges, which it runs again and the "
                        "model does not (give recompute full or selective)")
    unbuilt = [m for m in plan.recompute_modules if m not in JOB_RECOMPUTE_MODULES]
    if unbuilt:
        raise PlanError(f"recompute_modules {','.join(unbuilt)}: the validation job's selective "
                        f"recompute takes {', '.join(JOB_RECOMPUTE_MODULES)}")
    broken = check_parallel(model_keys(model), {**plan.to_dict(), **parallel.plan_keys()})
    if broken is not None:
        raise PlanError(broken)


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


# the job's tensor parallelism is torch DTensor's: autograd keeps each gathered sequence-parallel
# input for the weight gradient and reduces each input gradient in its turn, where Megatron-Core
# and Transformer Engine gather the input again and hide the reduction behind the weight gradient
TP_BACKWARD_NOTE = ("the job runs tensor parallelism's backward as torch DTensor does (each "
                    "sequence-parallel input it gathers kept for the weight gradient, each input "
                    "gradient reduced in turn), where Megatron-Core and Transformer Engine gather "
                    "the input again and hide the reduction behind the weight-gradient GEMM: "
                    "predicted so (tp_backward dtensor)")


def megatron_backward(plan: Plan) -> bool:
    """Whether perfmodel's step model runs the plan's tensor-parallel backward as Megatron-Core
    does (strategy.tp_backward_of: megatron, on tp > 1 in 1D), which the job does not."""
    return (tp_backward_of(plan) is TpBackward.MEGATRON and plan.tp > 1
            and plan.tp_layout.value == "1d")


FP8_NOTE = ("the validation job has no FP8 path (no Transformer Engine): it runs the plan's bf16 "
            "mixed precision, and is predicted so")


def without_fp8(plan: Plan) -> Plan:
    """The plan with dtype fp8 as the job runs it: its bf16 mixed precision, no FP8 GEMMs."""
    return plan.replace(dtype="bf16", fp8_recipe=None, fp8_output_layer=False, fp8_params=False)


# the plan fields of the job's bf16 states (keeps_bf16_states)
BF16_STATES = {"optimizer_dtype": "bf16", "grad_dtype": "bf16", "master_weights": "none"}


def has_bf16_states(plan: Plan) -> bool:
    return all(getattr(plan, field) == value for field, value in BF16_STATES.items())


def keeps_bf16_states(plan: Plan) -> bool:
    """Whether the job, on a GPU, keeps a bf16 plan's parameters, gradients and AdamW states in
    bf16 with no master copy: at zero 0 and 3, torch.optim.AdamW over the bf16 parameters
    (workload.trainer; zero 3: FSDP2's bf16 shards); zero 1-2 keep fp32 main shards
    (workload.distopt), and DeepSpeed's BF16_Optimizer is refused (check_job)."""
    return plan.zero in (0, 3) and plan.dtype.value == "bf16" and not plan.bf16_optimizer


def local_dtype(plan: Plan, backend: str) -> tuple[Plan, str]:
    """The plan the local job really runs: fp8 becomes bf16 (FP8_NOTE); bf16/fp16 become fp32
    on a CPU (no fast path there); on a GPU at zero 0 or 3, bf16 keeps its states in bf16 (the
    job's torch AdamW over bf16 parameters) and fp16 is refused."""
    if plan.dtype.value == "fp8":
        plan, note = local_dtype(without_fp8(plan), backend)
        return plan, "; ".join(n for n in (FP8_NOTE, note) if n)
    if backend == "gloo" and plan.dtype.value in ("bf16", "fp16"):
        note = (
            f"{plan.dtype.value} has no fast path on this CPU (60-200x slower than fp32): "
            "the run and the prediction both use fp32"
        )
        return plan.replace(dtype="fp32"), note
    if backend == "nccl" and plan.zero in (0, 3) and plan.dtype.value == "fp16":
        raise PlanError("dtype fp16 at zero 0 or 3 on a GPU: the validation job keeps the "
                        "parameters and AdamW's states in fp16 there, with no fp32 master copy "
                        "or loss scaling, which a plan cannot describe; validate it with --dtype "
                        "bf16, or --zero 1 (the distributed optimizer's fp32 main shards)")
    if backend == "nccl" and keeps_bf16_states(plan) and not has_bf16_states(plan):
        return plan.replace(**BF16_STATES), (
            f"at zero {plan.zero} the job keeps its parameters, gradients and AdamW states in "
            "bf16 (no fp32 master copy; zero 1 and 2 keep fp32 main shards): predicted so")
    return plan, ""


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp, as Megatron-LM pads it (there to a multiple
    of make_vocab_size_divisible_by x tp) so that every tensor-parallel rank holds vocab / tp rows
    of the embedding and the output layer."""
    return -(-vocab // tp) * tp


def job_model(model: TransformerSpec, tp: int = 1) -> TransformerSpec:
    """The model as the job (workload.model) builds it: untied embeddings (tying across pipeline
    stages needs an all-reduce the job does not do), a learned position table (seq_len x
    hidden) even for rotary models, no dropout (the job's layers have none: no masks kept),
    queries, keys and values in three projections (wq, wk, wv) and the vocabulary padded to a
    multiple of tp (padded_vocab: torch's Shard would otherwise give the first ranks one row
    more than the others, and the ranks' gradients would differ in size). The prediction, the
    ledger and --dry-run all take this model."""
    return model.replace(tied_embeddings=False, position_embedding="learned", rotary_fraction=1,
                         hidden_dropout=0.0, attention_dropout=0.0, fused_qkv=False,
                         vocab=padded_vocab(model.vocab, tp))


def job_model_note(model: TransformerSpec, tp: int = 1) -> str:
    """What job_model changed, for the user ('' when nothing)."""
    changed = []
    if padded_vocab(model.vocab, tp) != model.vocab:
        changed.append(f"pads the vocabulary to {padded_vocab(model.vocab, tp):,} (a multiple of "
                       f"tp {tp}, as Megatron-LM pads it; {model.name}: {model.vocab:,})")
    if model.position_embedding != "learned":
        changed.append(
            f"learns a position table where {model.name} uses {model.position_embedding} positions"
        )
    if model.tied_embeddings:
        changed.append("unties the embeddings")
    if model.hidden_dropout or model.attention_dropout:
        changed.append("trains without dropout")
    if model.fused_qkv:
        changed.append(f"projects queries, keys and values in three layers where {model.name} "
                       "fuses them")
    return f"the job {' and '.join(changed)}: compared as the job builds it" if changed else ""


def check_loss(plan: Plan) -> None:
    """The job's loss is PyTorch's F.cross_entropy on fp32 logits: a plan of another kernel is
    refused (the run as its dry run), never run as that one."""
    if plan.cross_entropy.value not in ("unfused", "torch"):  # torch: the job's own loss
        why = {"te": "Transformer Engine's kernel runs on NVIDIA GPUs only",
               "native": "native is Megatron-Core's vocabulary-parallel loss, compiled",
               "no-upcast": "a local job runs fp32, where no-upcast changes nothing",
               "flash-attn": "flash-attn's Triton kernel runs on GPUs only"}
        raise PlanError(f"cross_entropy {plan.cross_entropy.value}: the validation job's loss is "
                        "PyTorch's F.cross_entropy on fp32 logits (give cross_entropy unfused or "
                        f"torch; {why[plan.cross_entropy.value]})")


def check_layout(plan: Plan) -> None:
    """The job (workload.parallelize) runs Megatron's 1D tensor parallelism: a plan in another
    tensor layout is refused here, never run, counted or emitted as a 1D job compared with the
    other layout's prediction. The 2D and 3D layouts run locally through workload.layouts
    (validation.layouts: `validate` without --dry-run or --emit); 2.5D runs in no job."""
    layout = plan.tp_layout.value
    if layout == "1d":
        return
    where = ("by a local run (validate without --dry-run or --emit: workload.layouts runs it)"
             if layout in ("2d", "3d") else "by no job here (workload.layouts runs 2d and 3d)")
    raise PlanError(f"tp_layout {layout}: the validation job runs tensor parallelism in 1d "
                    f"(Megatron's); a {layout} plan is validated {where}")


def as_run(model: TransformerSpec, plan: Plan, backend: str) -> tuple[TransformerSpec, Plan, str]:
    """The model and plan the job really runs, so that the prediction describes the same job.

    The job unties the embeddings and learns positions (job_model); it attends with fused SDPA
    (no s^2 activations: flash_attention), or unfused where the plan says so
    (workload.model.unfused_attention); it syncs gradients after backward, gathers parameters
    when it needs them and communicates tensor-parallel between its GEMMs (no overlap); it runs
    eagerly; its loss is PyTorch's F.cross_entropy on fp32 logits (cross_entropy torch);
    bf16/fp16 become fp32 on a CPU (gloo); its norms, activations and residual adds run op by op
    (kernels eager), its AdamW as workload.settings.adamw_kernels picks. Returns the notes the
    user should read.
    """
    check_loss(plan)
    check_layout(plan)
    if plan.cpu_offload_layers:
        raise PlanError(f"cpu_offload_layers {plan.cpu_offload_layers}: the validation job "
                        "offloads no activations to the host (Transformer Engine's offload "
                        "is Megatron-Core's); validate the plan with --cpu-offload-layers 0")
    plan, note = local_dtype(plan, backend)
    notes = [note] if note else []
    model = job_model(model, plan.tp)
    if plan.overlap_grad_sync:
        notes.append("the job syncs gradients after backward: predicted without overlap")
    if plan.overlap_param_gather or plan.tp_comm_overlap:
        notes.append("the job overlaps no parameter gather or tensor-parallel communication: "
                     "predicted without")
    if plan.stack.value != "eager":
        notes.append(f"the job runs eagerly, not {plan.stack.value}: predicted eager")
    if plan.kernels.value != "eager":
        notes.append(f"the job runs its element-wise ops op by op (PyTorch modules), not "
                     f"{plan.kernels.value} kernels: predicted with eager kernels")
    if megatron_backward(plan):
        notes.append(TP_BACKWARD_NOTE)
    if plan.attention_kernel:
        notes.append(f"the job attends with PyTorch SDPA, which picks its own kernel: predicted "
                     f"with the hardware's default flash kernel, not {plan.attention_kernel}")
    kernels = job_optimizer_kernels(backend)
    if plan.optimizer_kernels.value != kernels:
        where = "a GPU" if backend == "nccl" else "CPU ranks"
        notes.append(f"the job steps AdamW {kernels} on {where} (workload.settings."
                     f"adamw_kernels), not {plan.optimizer_kernels.value}: predicted {kernels}")
    if model.experts and plan.expert_weighting.value != "output":
        notes.append("the job weights its experts' outputs at the combine (workload.moe): "
                     "predicted with expert_weighting output")
    plan = plan.replace(flash_attention=plan.flash_attention is not False, attention_kernel=None,
                        overlap_grad_sync=False,
                        overlap_param_gather=False, cross_entropy="torch",
                        tp_comm_overlap=False, stack="eager", expert_weighting="output",
                        tp_backward="dtensor", optimizer_kernels=kernels, kernels="eager")
    return model, plan, "; ".join(notes)


def job_optimizer_kernels(backend: str) -> str:
    """The AdamW kernels the job steps on the backend's device (Plan.optimizer_kernels' value):
    fused on a GPU (nccl), foreach on CPU ranks (gloo)."""
    return adamw_kind("cuda" if backend == "nccl" else "cpu")


def model_keys(model: TransformerSpec) -> dict[str, Any]:
    """The job config's model (workload.model): a mixture of experts adds its keys."""
    keys = {
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
        "qkv_bias": model.bias if model.qkv_bias is None else model.qkv_bias,
        "norm": model.norm,
    }
    if model.experts:
        keys.update(
            experts=model.experts,
            top_k=model.top_k,
            expert_ffn_hidden=model.expert_ffn_hidden,
            shared_experts=model.shared_experts,
            shared_expert_ffn_hidden=model.shared_expert_ffn_hidden,
            capacity_factor=model.capacity_factor,
            moe_layers=list(model.moe_layers),
        )
    return keys


def job_config(
    model: TransformerSpec,
    plan: Plan,
    settings: RunSettings,
    parallel: JobParallel | None = None,
) -> dict[str, Any]:
    """The job's JSON config (see workload.job). Context / expert parallelism (job_parallel) and a
    mixture of experts add their keys; a plan without them gives the config it always gave."""
    par = job_parallel(plan, parallel)
    check_job(model, plan, par)
    plan_keys = plan.to_dict()
    if par != JobParallel() or model.experts:
        plan_keys.update(par.plan_keys())
    layout = plan.layout
    if layout is not None:  # each chunk's layers, in model order (workload.model.chunk_layers)
        plan_keys["chunk_layers"] = [layout.chunk_layers(k) for k in range(len(layout.stages))]
    return {
        "model": model_keys(model),
        "plan": plan_keys,
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
