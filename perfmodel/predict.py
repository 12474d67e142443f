"""The Python API: predict the step time and per-GPU memory of one plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from perfmodel.encode import (
    check_dispatcher,
    check_stack,
    check_whole_nodes,
    compute_dtype,
    resolve_flash,
)
from perfmodel.errors import PlanError
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.output import require_finite
from perfmodel.specs.hardware import HardwareSpec, load_hardware
from perfmodel.specs.model import TransformerSpec, load_model
from perfmodel.strategy import Dtype, Plan, fields_given, plan_from_dict

if TYPE_CHECKING:
    import pandas as pd


# The convention of model_flops_per_step and mfu (perfmodel.step.quantities)
FLOPS_CONVENTION = ("megatron: Megatron-LM num_floating_point_operations (6 x GEMM parameters x "
                    "tokens + the causal attention core counted as half, since 8873b55, "
                    "2025-03); *_full_attention: the core counted whole, as torchtitan's "
                    "get_num_flop_per_token")
# The peak MFU divides by (mfu_peak_dtype): an fp8 plan's against the bf16 dense peak, as
# torchtitan's MFU (tools/utils.py get_peak_flops: "BF16 peak", also for float8 training) and
# NVIDIA's published FP8 runs (model TFLOP/s per GPU next to bf16's) report it; mfu_fp8_peak
# divides by the FP8 peak.
MFU_CONVENTION = ("mfu: model FLOP/s per GPU over the dense peak of the plan's dtype, of bf16 "
                  "for an fp8 plan (torchtitan's convention); mfu_fp8_peak: over the FP8 peak")


FRAGMENTATION = "reserved/fragmentation"


def memory_verdict(total_bytes: float, without_margin_bytes: float,
                   capacity_bytes: float) -> str:
    """Whether a plan fits in a GPU's memory: "fits" with the caching allocator's fragmentation
    margin (HardwareSpec.memory_fragmentation: the pool a step's transient tensors leave unused
    where the GPU has room, GMLake's 15% average; total_bytes, the stage that holds the most
    with it), "tight" where only that margin does not fit, "does not fit" where the tensors, the
    CUDA context and NCCL's buffers alone exceed the memory (without_margin_bytes, the stage that
    holds the most without it: under a pipeline not always the same stage). The margin is not a
    hard limit: under memory pressure the allocator frees its cached blocks and retries before
    it fails (expandable segments leave little to fragment), and published runs have trained in
    it (docs/model.md, "What fits")."""
    if total_bytes <= capacity_bytes:
        return "fits"
    return "tight" if without_margin_bytes <= capacity_bytes else "does not fit"


@dataclass(frozen=True)
class Prediction:
    """A prediction with its breakdown: every number explains itself by named terms.

    model_flops_per_step and mfu follow Megatron-LM (causal attention core counted as half);
    model_flops_per_step_full_attention and mfu_full_attention count it whole (torchtitan)."""

    step_time_s: float
    samples_per_s: float
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    tflops_per_gpu: float
    mfu: float
    memory_per_gpu_bytes: float
    memory_capacity_bytes: float
    fits_in_memory: bool
    breakdown_s: dict[str, float]  # exposed: they add up to the step time
    memory_breakdown_bytes: dict[str, float]
    bottleneck_stage: str
    parameters: float
    micro_batches: int
    plan: Plan
    model: TransformerSpec
    hardware: HardwareSpec
    comm_ledger: list[dict[str, Any]] = field(default_factory=list)
    # what each term hid, per step (not in the step time): communication behind compute, host
    # dispatch behind the device's work; by the breakdown's term names, 0 left out
    hidden_s: dict[str, float] = field(default_factory=dict)
    model_flops_per_step_full_attention: float = 0.0
    mfu_full_attention: float = 0.0
    # an fp8 plan's MFU over the FP8 peak (mfu is over the bf16 peak: MFU_CONVENTION); None else
    mfu_fp8_peak: float | None = None
    # the memory per GPU without the caching allocator's fragmentation margin, on the stage that
    # holds the most without it (memory_verdict); None: the same as memory_per_gpu_bytes
    memory_without_margin_bytes: float | None = None
    # the stage composition whose terms breakdown_s holds (the slowest; with one stage, the
    # slower of its two): what explain prints (not in to_dict)
    breakdown_stage: str = "first"

    def to_dict(self) -> dict[str, Any]:
        out = self._dict()
        if self.mfu_fp8_peak is not None:
            out["mfu_fp8_peak"] = self.mfu_fp8_peak
            out["mfu_convention"] = MFU_CONVENTION
        return out

    @property
    def memory_verdict(self) -> str:
        """fits (fits_in_memory), tight (only the allocator's fragmentation margin does not fit)
        or does not fit (memory_verdict)."""
        without = self.memory_without_margin_bytes
        return memory_verdict(self.memory_per_gpu_bytes,
                              self.memory_per_gpu_bytes if without is None else without,
                              self.memory_capacity_bytes)

    def _dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "model_flops_per_step_full_attention": self.model_flops_per_step_full_attention,
            "mfu_full_attention": self.mfu_full_attention,
            "flops_convention": FLOPS_CONVENTION,
            "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_in_memory": self.fits_in_memory,
            "memory_verdict": self.memory_verdict,
            "memory_without_margin_bytes": (self.memory_per_gpu_bytes
                                            if self.memory_without_margin_bytes is None
                                            else self.memory_without_margin_bytes),
            "breakdown_s": dict(self.breakdown_s),
            "hidden_s": dict(self.hidden_s),
            "memory_breakdown_bytes": dict(self.memory_breakdown_bytes),
            "bottleneck_stage": self.bottleneck_stage,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
            "mtp_parameters": self.mtp_parameters,
            "micro_batches": self.micro_batches,
            "plan": self.plan.to_dict(),
            "model": self.model.name,
            "hardware": self.hardware.name,
        }

    @property
    def active_parameters(self) -> float:
        """The parameters one token's forward pass uses (perfmodel.params): `parameters` for a
        dense model, less the routed experts a token is not sent to for a mixture of experts."""
        from perfmodel.params import parameter_counts

        counts = parameter_counts(self.model)
        return self.parameters if not counts.sparse else float(counts.reported)

    @property
    def mtp_parameters(self) -> float:
        """The multi-token-prediction modules' own parameters (perfmodel.params), not in
        `parameters`: 0 for a model without them."""
        from perfmodel.params import parameter_counts

        return float(parameter_counts(self.model).mtp)

    def breakdown_frame(self) -> pd.DataFrame:
        """The time breakdown as a DataFrame: term, seconds, share of the step."""
        from perfmodel.output import breakdown_frame

        frame: pd.DataFrame = breakdown_frame(self.breakdown_s, self.step_time_s)
        return frame

    def memory_frame(self) -> pd.DataFrame:
        """The memory per GPU's terms as a DataFrame: term, bytes, GiB."""
        from perfmodel.output import memory_frame

        frame: pd.DataFrame = memory_frame(self.memory_breakdown_bytes)
        return frame

    def summary(self) -> str:
        """One line: model, hardware, layout, step time, throughput, MFU and memory (what the
        object shows in a notebook or a REPL; to_dict holds every field)."""
        from perfmodel.output import degrees_text, fmt_bytes

        plan = self.plan
        layout = [degrees_text(plan), f"mb={plan.micro_batch}"]
        if plan.pp > 1:
            layout.append(str(plan.schedule.value))
        if plan.zero:
            layout.append(f"zero{plan.zero}")
        if plan.recompute.value != "none":
            layout.append(f"recompute {plan.recompute.value}")
        return (f"{self.model.name} on {plan.gpus:,} x {self.hardware.name} "
                f"({' '.join(layout)}): step {self.step_time_s:.4g} s, "
                f"{self.tokens_per_s:,.0f} tokens/s, MFU {self.mfu:.1%}, memory "
                f"{fmt_bytes(self.memory_per_gpu_bytes)} of "
                f"{fmt_bytes(self.memory_capacity_bytes)} per GPU: {self.memory_verdict}")

    def __repr__(self) -> str:
        # the generated one printed every field, the model and hardware specs with them (9 KB)
        return f"<Prediction {self.summary()}>"

    def _repr_html_(self) -> str:
        """Jupyter's view: the summary line and the step time's breakdown."""
        from perfmodel.output import breakdown_html

        return breakdown_html(self.summary(), self.breakdown_s, self.step_time_s)


def _mapping(plan: Any) -> dict[str, Any]:
    try:
        return dict(plan)
    except (TypeError, ValueError):
        raise PlanError(f"a plan is a perfmodel.Plan or a mapping of its fields, got "
                        f"{type(plan).__name__}") from None


def resolve_inputs(model: TransformerSpec | str | Path, hardware: HardwareSpec | str | Path,
                   plan: Plan | dict[str, Any]) -> tuple[TransformerSpec, HardwareSpec, Plan]:
    spec = load_model(model)
    if not isinstance(spec, TransformerSpec):
        raise PlanError(f"model '{spec.name}' is a layer graph (CNN/MLP): predict it on a Pr x Pc "
                        "grid (perfmodel predict --pr R --pc C, or "
                        "perfmodel.layerwise.predict_grid)")
    model = spec
    model.require_costed()  # a mixture of experts, MLA, a window: refused, never costed as dense
    hardware = load_hardware(hardware)
    plan = plan if isinstance(plan, Plan) else plan_from_dict(_mapping(plan))
    plan.check(model)
    check_whole_nodes(hardware, plan.gpus)
    asked = plan.flash_attention  # None: --attention auto (the refusal of cp says which)
    flash = resolve_flash(plan.flash_attention, model, hardware, plan.dtype,
                          plan.attention_kernel)
    if flash != plan.flash_attention:  # the default (None) decided for this hardware and model
        plan = plan.replace(flash_attention=flash)
    if plan.dtype is Dtype.FP8:  # the recipe: the given one, if the GPU runs it, or its default
        recipe = hardware.fp8_recipe(None if plan.fp8_recipe is None else plan.fp8_recipe.value)
        plan = plan.replace(fp8_recipe=recipe)
    require_fused_for_cp(plan, model, hardware, auto=asked is None)
    check_stack(hardware, plan.stack)
    if plan.ep > 1:
        check_dispatcher(hardware, plan.ep_dispatcher)
    return model, hardware, plan


def require_fused_for_cp(plan: Plan, model: TransformerSpec | None = None,
                         hardware: HardwareSpec | None = None, auto: bool = False) -> None:
    """Context parallelism runs on a fused attention kernel (ring attention merges each step's
    partial result by its log-sum-exp: Transformer Engine's fused attention; Megatron-Core
    needs it): refused with unfused attention. Given the model and hardware, the refusal says
    why `auto` (--attention auto) attended unfused: no kernel for the dtype (MI325X, fp32), or
    a head size above the kernel's max_head_dim (a model spec's head_dim 320 on MI300X's ck-v3
    read as 'the hardware has none', which it has)."""
    if plan.cp > 1 and not plan.flash_attention:
        from perfmodel.encode import _head_limit, compute_dtype

        why = "the hardware has none for this dtype or --attention unfused was given"
        if model is not None and hardware is not None and auto:
            kernel = hardware.flash_kernel(compute_dtype(plan.dtype))
            head = model.attention_head_dim
            if kernel is not None and head > kernel.max_head_dim:
                why = (f"the model's head_dim {head} is above {_head_limit(kernel, hardware)}, "
                       "so --attention auto attends unfused")
        raise PlanError(f"cp {plan.cp} needs fused (flash) attention: its ring, all-gather and "
                        f"Ulysses forms run on a fused kernel; {why}")


def predict(model: TransformerSpec | str | Path, hardware: HardwareSpec | str | Path,
            plan: Plan | dict[str, Any], *, refuse_idle: bool = True) -> Prediction:
    """Predict one plan. `model` and `hardware` are specs, preset names or file paths.
    refuse_idle: an option given that would change nothing for the plan (zero 3 without data
    parallelism, cp_comm without cp, an overlap of a sync the plan has not, a schedule without a
    pipeline: perfmodel.idle) is refused (PlanError), as the command line refuses its flags;
    given are a dict's fields, or a Plan's, set to other than Plan's defaults
    (perfmodel.strategy.fields_given). perfmodel's own callers, whose plans come from a search
    or a config, pass False."""
    names = None
    if not isinstance(plan, Plan):
        names = _mapping(plan)
        plan = plan_from_dict(names)
    given = fields_given(plan, names) if refuse_idle else None
    model, hardware, plan = resolve_inputs(model, hardware, plan)
    if given is not None:
        from perfmodel.idle import refuse_idle_flags

        refuse_idle_flags(plan, model, given.__contains__)
    family = family_of(model, hardware, plan)
    compiled = compile_family(family)
    out = compiled(values_of(model, hardware, plan))
    return _assemble(out, family, model, hardware, plan)


def parameter_count(model: TransformerSpec | str | Path, hardware: HardwareSpec | str | Path,
                    dtype: str | None = None) -> float:
    """The model's parameters as perfmodel.step counts them (every layer, the embeddings, the
    final norm, an untied output layer), whatever the plan: those of a one-GPU plan."""
    model, hardware, plan = resolve_inputs(model, hardware, {
        "gpus": 1, "dtype": dtype or load_hardware(hardware).default_dtype()})
    out = compile_family(family_of(model, hardware, plan))(values_of(model, hardware, plan))
    return float(out["q:parameters"])


def heaviest_stage(memory: Mapping[str, float]) -> str:
    """The stage whose GPUs hold the most (memory per stage name), the one a prediction reports;
    on a tie the first by name."""
    return max(sorted(memory), key=lambda stage: memory[stage])


def _assemble(out: dict[str, Any], family: Any, model: TransformerSpec, hardware: HardwareSpec,
              plan: Plan) -> Prediction:
    stages = [k.split(":", 1)[1] for k in out if k.startswith("stage_time:")]
    # the slowest stage (first, then last, then a middle one on a tie: as before the middle)
    slowest = max(stages, key=lambda st: float(out[f"stage_time:{st}"]))
    breakdown: dict[str, float] = {}
    hidden: dict[str, float] = {}
    for key, value in out.items():
        kind, _, name = key.partition(":")
        if kind in ("time", "hidden"):
            if ":" in name:  # a stage's term (term names hold no colon)
                stage, name = name.split(":", 1)
                if stage != slowest:
                    continue
            if kind == "time":
                breakdown[name] = float(value)
            elif float(value) != 0:
                hidden[name] = float(value)
    stage_memory: dict[str, dict[str, float]] = {}  # stage -> its memory terms
    for key, value in out.items():
        if key.startswith("memory:"):
            _, stage, term = key.split(":", 2)
            stage_memory.setdefault(stage, {})[term] = float(value)
    mem_stage = heaviest_stage({st: sum(t.values()) for st, t in stage_memory.items()})
    # the most any stage holds without the fragmentation margin (another stage than mem_stage
    # where the margins differ)
    without_margin = max(sum(t.values()) - t.get(FRAGMENTATION, 0.0)
                         for t in stage_memory.values()) \
        + float(hardware.memory_reserved_bytes or 0)
    memory = dict(stage_memory[mem_stage])
    if hardware.memory_reserved_bytes:
        memory["reserved"] = float(hardware.memory_reserved_bytes)
    step = float(out["step_time"])
    context = (f"{model.name} on {hardware.name}, dp={plan.dp} tp={plan.tp} pp={plan.pp}, "
               f"micro-batch {plan.micro_batch}, global batch {plan.global_batch}")
    require_finite({**breakdown, **hidden, "step_time_s": step}, "step time", context)
    require_finite(memory, "memory per GPU", context)
    ledger = [{"name": op.name, "axis": ledger_axis(op.axis, plan), "op": op.op,
               "phase": op.phase, "stage": op.stage, "calls": float(out[f"ledger:{i}:calls"]),
               "nbytes": float(out[f"ledger:{i}:nbytes"])}
              for i, op in enumerate(build_ledger_meta(family))
              if f"ledger:{i}:calls" in out and float(out[f"ledger:{i}:calls"]) != 0]
    model_flops = float(out["q:model_flops_per_step"])
    full_attention_flops = float(out["q:model_flops_per_step_full_attention"])
    peak = hardware.peak(compute_dtype(plan.dtype))  # bf16's for an fp8 plan (MFU_CONVENTION)
    mem_total = sum(memory.values())
    result = Prediction(
        step_time_s=step,
        samples_per_s=plan.global_batch / step,
        tokens_per_s=plan.global_batch * model.seq_len / step,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=float(out["q:hardware_flops_per_step"]),
        tflops_per_gpu=model_flops / step / plan.gpus / 1e12,
        mfu=model_flops / (step * plan.gpus * peak),
        memory_per_gpu_bytes=mem_total,
        memory_capacity_bytes=float(hardware.memory_bytes),
        fits_in_memory=mem_total <= hardware.memory_bytes,
        memory_without_margin_bytes=without_margin,
        breakdown_s=breakdown,
        memory_breakdown_bytes=memory,
        bottleneck_stage=slowest if plan.pp > 1 else "all",
        breakdown_stage=slowest,
        hidden_s=hidden,
        parameters=float(out["q:parameters"]),
        micro_batches=plan.num_micro_batches,
        plan=plan,
        model=model,
        hardware=hardware,
        comm_ledger=ledger,
        model_flops_per_step_full_attention=full_attention_flops,
        mfu_full_attention=full_attention_flops / (step * plan.gpus * peak),
        mfu_fp8_peak=model_flops / (step * plan.gpus * hardware.peak("fp8"))
        if plan.dtype is Dtype.FP8 else None,
    )
    require_finite(result.to_dict(), "prediction", context)
    return result


def part_times(model: TransformerSpec | str | Path, hardware: HardwareSpec | str | Path,
               plan: Plan | dict[str, Any]) -> dict[str, dict[str, float]]:
    """One layer's, the embedding's and the output layer's (with its loss) raw times per
    micro-batch on one rank: forward_s and backward_s (the kernels' rooflines), comm_forward_s and
    comm_backward_s (tensor-parallel collectives and their fixed cost per call), without what
    the hardware's measured layer costs add (what calibration.layers fits them against)."""
    model, hardware, plan = resolve_inputs(model, hardware, plan)
    family = family_of(model, hardware, plan)
    out = compile_family(family)(values_of(model, hardware, plan))
    parts: dict[str, dict[str, float]] = {}
    for key, value in out.items():
        if key.startswith("q:part:"):
            part, name = key[len("q:part:"):].split(":")
            parts.setdefault(part, {})[name] = float(value)
    return parts


def comm_ledger(model: TransformerSpec | str | Path, plan: Plan | dict[str, Any],
                hardware: HardwareSpec | str | Path = "dgx-h100") -> list[dict[str, Any]]:
    """Every collective one rank issues in one step, as the model counts them.

    Each record: name, axis (tp, dp, pp), op, phase (fwd, bwd, step), stage (every, first, last,
    middle, or output: the rank with the output layer), calls per step and bytes per call
    (nccl-tests' size convention). Counts do not depend on the hardware except through the
    structure (which links), so any preset will do.
    """
    if isinstance(hardware, (Plan, Mapping)) and isinstance(plan, (str, Path, HardwareSpec)):
        raise PlanError("comm_ledger takes (model, plan, hardware), the plan second: predict's "
                        "order (model, hardware, plan) was given")
    model, hardware, plan = resolve_inputs(model, hardware, plan)
    family = family_of(model, hardware, plan)
    out = compile_family(family)(values_of(model, hardware, plan))
    records = []
    for i, op in enumerate(build_ledger_meta(family)):
        calls = float(out[f"ledger:{i}:calls"])
        if calls == 0:
            continue
        records.append({"name": op.name, "axis": ledger_axis(op.axis, plan), "op": op.op,
                        "phase": op.phase,
                        "stage": op.stage, "calls": calls,
                        "nbytes": float(out[f"ledger:{i}:nbytes"])})
    return records


def gemm_shapes(model: TransformerSpec | str | Path,
                plan: Plan | dict[str, Any]) -> list[dict[str, Any]]:
    """The forward GEMMs of one layer and of the output layer on one rank, as the model has them
    (perfmodel.step: Megatron 1D, or the 2D/2.5D/3D grid's blocks for the four linear layers).

    Each record: name, batch, m, n, k and flops (2 batch m n k). The backward runs the same
    products transposed (the same FLOPs each).
    """
    import sympy as sp

    from perfmodel.costs import compute as K
    from perfmodel.costs import layouts as LY
    from perfmodel.evaluate import grid_degrees

    model, _, plan = resolve_inputs(model, "dgx-h100", plan)
    b, s, h, tp = plan.micro_batch, model.seq_len, model.hidden, plan.tp
    T = b * s
    gemms = {g.name: g for g in K.layer_gemms(T, b, s, h, model.heads, model.kv_heads,
                                                model.ffn_hidden, tp, model.gated_mlp,
                                                model.head_dim)}
    layout = plan.tp_layout.value
    if layout != "1d":  # the grid layouts replace the four linear layers' GEMMs
        qa, _, qc = grid_degrees(plan)
        for name, K_, M_ in LY.linear_shapes(h, model.heads, model.kv_heads, model.ffn_hidden,
                                             model.gated_mlp, model.head_dim):
            grid = LY.grid_gemms(name, T, K_, M_, qa, qc)
            gemms[name] = grid["2d" if layout == "2.5d" else layout]  # 2.5d: 2d with depth
    gemms["logits"] = K.logits_gemm(T, h, model.vocab, tp)
    return [{"name": g.name, **{key: float(sp.sympify(getattr(g, key)))
                                for key in ("batch", "m", "n", "k")},
             "flops": float(sp.sympify(g.flops))} for g in gemms.values()]


def ledger_axis(axis: str, plan: Plan) -> str:
    """The name of a ledger record's group as the job names it: the dp x cp group is the dp group
    when cp = 1 (validation's job names its gradients' group dp then, dp_cp with context
    parallelism)."""
    return "dp" if axis == "dp_cp" and plan.cp == 1 else axis


class LedgerRecord(NamedTuple):
    """What a ledger record is beyond its numbers (comm_ledger: calls and bytes per call)."""

    name: str
    axis: str
    op: str
    phase: str
    stage: str


def build_ledger_meta(family: Any) -> list[LedgerRecord]:
    """The ledger's records (names, ops) of a family, as its compiled module holds them (no
    sympy model in a warm process); the numbers come from the compiled outputs."""
    from perfmodel.evaluate import compile_family

    return [LedgerRecord(*record) for record in compile_family(family).meta["ledger"]]
