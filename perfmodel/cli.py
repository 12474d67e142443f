"""The `perfmodel` command line: thin (parse, call the API, render).

Exit codes: 0 success; 1 internal error (a bug: please report it); 2 usage error (bad flag or
value); 3 spec error (hardware/model/profile file or preset); 4 plan error (a rule of the parallel
plan); 5 data error (CSV, log or table input); 6 the validation job failed (validation.run);
7 an output cannot be written (perfmodel.files.write_atomic); 130 interrupted (Ctrl-C or
SIGTERM). Tracebacks only with --debug.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import click

from perfmodel.costs.precision import MASTER_WEIGHTS, STATE_DTYPES
from perfmodel.errors import OutputError, PerfmodelError, PlanError, SpecError
from perfmodel.output import document, fmt_bytes, json_text, require_finite
from perfmodel.specs import resolve as specs_resolve
from perfmodel.specs.hardware import COLLECTIVE_ALGORITHMS, COLLECTIVE_OPS, LINK_PROTOCOLS
from perfmodel.strategy import (
    DEFAULT_MEMORY_MARGIN,
    GPU_HOUR_PRICE,
    TOKEN_BUDGET,
    Attention,
    CPComm,
    CrossEntropy,
    DpBucketing,
    Dtype,
    EPDispatcher,
    ExpertWeighting,
    Fp8Recipe,
    FsdpReshard,
    Kernels,
    Objective,
    OptimizerKernels,
    Placement,
    Recompute,
    RecomputeMethod,
    Schedule,
    Stack,
    TpBackward,
    TPLayout,
    parse_option,
)

EXIT_INTERNAL, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
# the reader of standard output closed it (`perfmodel presets | head`): quietly, with the status of
# a process SIGPIPE ends, as cat or grep there (click's and rich's own is 1, perfmodel's internal
# error)
EXIT_BROKEN_PIPE = 128 + 13
MAX_DEGREE = 10**7  # the largest parallel degree or GPU count a plan accepts (perfmodel.strategy)
# what recommend's --tokens and --gpu-hour-price ranges keep (perfmodel.strategy.TOKEN_BUDGET)
BUDGET_WHY = ("the range in which a plan's time to train and cost (tokens x step time x GPUs x "
              "price) are finite and nonzero")


def ascii_number(text: str) -> bool:
    """Whether text writes a number as the command line's numbers are written: ASCII digits,
    without the '_' separators or the other scripts' digits (full-width '８') that Python's int()
    and float() accept ('8_0' read as 80)."""
    return text.isascii() and "_" not in text


def _ascii_only(kind: click.ParamType[Any], value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> None:
    if isinstance(value, str) and not ascii_number(value):
        kind.fail(f"{value!r} is not a valid number: write it in ASCII digits, without '_'",
                  param, ctx)


class AsciiInt(click.types.IntParamType):
    """click's integer, in ASCII digits only (see ascii_number)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _ascii_only(self, value, param, ctx)
        return super().convert(value, param, ctx)


class IntRange(click.IntRange):
    """click's IntRange, in ASCII digits only (see ascii_number)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _ascii_only(self, value, param, ctx)
        return super().convert(value, param, ctx)


INT = AsciiInt()


class FiniteFloat(click.FloatRange):
    """A float option that refuses nan and inf (click's FloatRange lets nan through), written in
    ASCII (see ascii_number); `why`: what the range keeps, said where a value lies outside it."""

    name = "finite float"

    def __init__(self, *args: Any, why: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.why = why

    def _describe_range(self) -> str:
        if not self.why or self.min is None or self.max is None:
            return super()._describe_range()
        return (f"{self.min:g}{'<' if self.min_open else '<='}x"
                f"{'<' if self.max_open else '<='}{self.max:g}")  # 1e+12, not 1000000000000.0

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        _ascii_only(self, value, param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", param, ctx)
        if self.why:
            try:
                return super().convert(number, param, ctx)
            except click.BadParameter as exc:
                self.fail(f"{exc.message.rstrip('.')}: {self.why}", param, ctx)
        return super().convert(number, param, ctx)


def whole(minimum: int = 1, maximum: int = MAX_DEGREE) -> click.IntRange:
    """A whole-number option between minimum and maximum (out of range: a usage error)."""
    return IntRange(minimum, maximum)


class FieldRange(IntRange):
    """A whole number that sets a plan's or a model's field (a degree, a batch, a stage's
    layers, the ZeRO stage; validate's --layers): not a whole number is a usage error (exit 2),
    as for any option; one outside its range is an error of what it sets (`error`: PlanError,
    exit 4, as `predict --dp 0` where the plan checks it; SpecError, exit 3, as `--seq-len 0`),
    so that a flag's value belongs to what it sets in every command (docs/cli.md, exit codes)."""

    def __init__(self, minimum: int, maximum: int | None, error: type[PerfmodelError]) -> None:
        super().__init__(minimum, maximum)
        self.error = error

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = INT.convert(value, param, ctx)
        try:
            return super().convert(number, param, ctx)
        except click.BadParameter:
            flag = param.opts[0] if param is not None and param.opts else "the value"
            allowed = f"at least {self.min}" if self.max is None \
                else f"between {self.min} and {self.max:g}"
            raise self.error(f"{flag} must be {allowed}, got {number}") from None


def plan_whole(minimum: int = 1, maximum: int | None = MAX_DEGREE) -> click.IntRange:
    """A plan field's whole-number option between minimum and maximum (FieldRange)."""
    return FieldRange(minimum, maximum, PlanError)


def spec_whole(minimum: int = 1, maximum: int | None = MAX_DEGREE) -> click.IntRange:
    """A model field's whole-number option between minimum and maximum (FieldRange)."""
    return FieldRange(minimum, maximum, SpecError)


class LazyGroup(click.Group):
    """A group whose external subcommands (calibrate, validate) load only when they are run."""

    def _external(self) -> dict[str, Any]:
        from importlib.metadata import entry_points  # 8 ms: only for a command not built in

        try:
            return {ep.name: ep for ep in entry_points(group="perfmodel.commands")}
        except Exception:  # broken metadata must not break predict
            return {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._external()))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        ep = self._external().get(name)
        if ep is None:
            return None
        try:
            loaded: click.Command = ep.load()
            return loaded
        except ImportError as exc:
            reason = f"'perfmodel {name}' is not available: {exc}"

            def unavailable() -> None:
                raise click.ClickException(reason)

            return click.Command(name, callback=unavailable, help=f"(unavailable: {exc})",
                                 context_settings={"ignore_unknown_options": True},
                                 params=[click.Argument(["args"], nargs=-1)])

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; what it held to say of its inputs (hold) is said once it has run,
        unless it said it before (release_held), and never where it refuses: a refusal is
        one line."""
        _HELD.clear()
        try:
            result = super().invoke(ctx)
        except BaseException:
            _HELD.clear()
            raise
        release_held()
        return result


# what a command says of its inputs before it has an answer (a learned position table resized
# by --seq-len, how a job config was read): said with the answer, dropped with a refusal
_HELD: list[str] = []


def hold(line: str) -> None:
    """A line for standard error, said once the command has an answer (release_held)."""
    _HELD.append(line)


def release_held() -> None:
    """Say the lines held so far (a command calls it where its input is checked and its own
    notes or a long run begin)."""
    lines = _HELD[:]
    _HELD.clear()
    for line in lines:
        click.echo(line, err=True)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks of errors.")
@click.version_option(package_name="perfmodel")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Predict, explain, recommend and validate parallel training plans."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# --- shared plan options -------------------------------------------------------------------------
DTYPE_HELP = ("Training precision (default: the hardware's fastest 16-bit type, bf16 on a tie: "
              "bf16 on H100, A100 and MI300X, fp16 on V100; fp32 for layer graphs). fp8: bf16 "
              "mixed precision whose linear layers' GEMMs run in FP8 (Transformer Engine; "
              "docs/fp8.md).")
FP8_RECIPE_HELP = ("With --dtype fp8: Transformer Engine's scaling recipe, delayed or current "
                   "(per-tensor) or mxfp8 (32-value blocks, Blackwell); default: the hardware's "
                   "(mxfp8 on B200/GB200, delayed elsewhere).")
FP8_OUTPUT_LAYER_HELP = ("With --dtype fp8: the output layer's GEMM in FP8 too (default: bf16, "
                         "as Megatron-LM and NeMo keep it).")
DP_BUCKET_SIZE_HELP = ("Parameters per data-parallel bucket with --overlap-grad-sync (ZeRO 0-2): "
                       "the gradients are reduced and the weights gathered one collective a "
                       "bucket (Megatron-Core --ddp-bucket-size; NeMo 1's bucket_cap_mb MiB / "
                       "the gradient bytes). Default: Megatron-Core's, max(40M, 1M x dp x cp).")
DP_BUCKETING_HELP = ("Which parameters --overlap-grad-sync buckets: megatron (Megatron-Core's "
                     "DDP: the first model chunk's, each later chunk of an interleaved pipeline "
                     "one bucket) or all (Apex's DistributedFusedAdam, NeMo 1; PyTorch DDP).")
FP8_PARAMS_HELP = ("With --dtype fp8: the linear weights held in FP8, fp32 master weights in the "
                   "optimizer, the parameter all-gather in FP8 (Megatron-LM --fp8-param-gather, "
                   "NeMo fp8_params; with ZeRO 3 as Megatron FSDP shards and gathers them, "
                   "per-tensor recipes only).")
SEQ_LEN_HELP = ("The training sequence length (default: the model spec's seq_len). Required for a "
                "Hugging Face config.json, which has none (its max_position_embeddings is how far "
                "positions reach, not what training uses).")


FROM_CONFIG_HELP = ("The job's own config: a Megatron-LM argument file or launch script, a "
                    "Megatron-Bridge / NeMo 2 YAML, a torchtitan TOML (or its JSON dump), a "
                    "DeepSpeed JSON or a NeMo AutoModel recipe YAML (docs/configs.md). Its model "
                    "and plan; --model fills what it lacks (a DeepSpeed config's model).")


def choice(options: Any) -> click.Choice[str]:
    """The values of an option's enum (or tuple of names) as a click choice: one vocabulary from
    the command line to the formulas."""
    return click.Choice([str(getattr(o, "value", o)) for o in options])


# layer graphs' options: perfmodel.layerwise's Norm, Variant and Contributors (that module imports
# sympy, which the command line does not load to parse; tests/unit/test_cli.py checks they agree)
NORMS = ("local", "sync", "group")
VARIANTS = ("fused", "split")
CONTRIBUTORS = choice(("standard", "specialised", "auto"))
# a layer graph's dtypes (perfmodel.layerwise.GRID_DTYPES, which the command line does not load
# to parse): no FP8 recipe for a CNN or MLP
GRID_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def _kernel_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--attention-kernel: an empty name is refused (exit 4, as a name the hardware lacks), not
    read as the flag left out (a plans CSV's empty cell is: not given)."""
    if value is not None and not value.strip():
        raise PlanError("--attention-kernel: an empty name; give one of the hardware's flash "
                        "kernels (perfmodel presets lists them) or leave the flag out")
    return value


def _module_names(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--recompute-modules: names separated by single commas, none empty ('' and ',mlp' were
    read as none and as mlp, where 'mlp,mlp' is refused)."""
    from perfmodel.strategy import RECOMPUTE_MODULES

    if value is not None and not all(name.strip() for name in value.split(",")):
        # a plan field's value: a plan error, as 'mlp,mlp' and an unknown name are
        raise PlanError(f"recompute_modules: an empty name in '{value}': give some of "
                        f"{', '.join(RECOMPUTE_MODULES)} separated by single commas (or leave "
                        "--recompute-modules out: core_attn)")
    return value


def plan_options(fn: Any) -> Any:
    options = [
        click.option("--model", "model", required=False,
                     help="Model preset or spec file (YAML/JSON, HF config.json)."),
        click.option("--from-config", "from_config", type=click.Path(),
                     default=None, help=FROM_CONFIG_HELP),
        click.option("--hardware", "hardware", default=None, help="Hardware preset or spec file."),
        click.option("--profile", "profile", default=None, type=click.Path(),
                     help="Calibrated profile (overrides the hardware preset's fields)."),
        click.option("--gpus", type=INT, default=None,
                     help="GPU count (default dp x tp x pp x cp)."),
        click.option("--dp", type=INT, default=1, show_default=True,
                     help="Data-parallel degree (with --gpus and without --dp: gpus / (tp x pp "
                          "x cp))."),
        click.option("--tp", type=INT, default=1, show_default=True,
                     help="Tensor-parallel degree."),
        click.option("--pp", type=INT, default=1, show_default=True,
                     help="Pipeline-parallel degree."),
        click.option("--cp", type=INT, default=1, show_default=True,
                     help="Context-parallel degree: each sequence split over cp ranks "
                          "(load-balanced causal chunks; docs/context-parallel.md)."),
        click.option("--cp-comm", type=choice(CPComm), default=CPComm.P2P.value,
                     show_default=True,
                     help="How attention crosses the cp ranks: p2p (ring attention, send/recv "
                          "overlapped with the attention), allgather (of K and V) or a2a "
                          "(Ulysses)."),
        click.option("--ep", type=INT, default=1, show_default=True,
                     help="Expert-parallel degree of a mixture of experts: its experts split over "
                          "ep of a stage's tp x cp x dp ranks, tp inner, after etp's "
                          "(docs/moe.md)."),
        click.option("--etp", type=INT, default=1, show_default=True,
                     help="Expert-tensor-parallel degree of a mixture of experts: each expert's "
                          "FFN split over etp of the tp ranks (Megatron "
                          "--expert-tensor-parallel-size; docs/moe.md)."),
        click.option("--micro-batch", type=INT, default=1, show_default=True,
                     help="Micro-batch size [samples]."),
        click.option("--global-batch", type=INT, default=None,
                     help="Global batch [samples] (default dp x micro-batch)."),
        click.option("--schedule", type=choice(Schedule), default=Schedule.ONE_F_ONE_B.value,
                     show_default=True,
                     help="Pipeline schedule; zb: interleaved zero bubble (ZB1P), zbv: zero "
                          "bubble V."),
        click.option("--virtual-stages", type=INT, default=1, show_default=True,
                     help="Model chunks per GPU (interleaved)."),
        click.option("--sequence-parallel", is_flag=True,
                     help="Megatron sequence parallelism (needs tp > 1)."),
        click.option("--recompute", type=choice(Recompute), default=Recompute.NONE.value,
                     show_default=True,
                     help="Activation recompute: none, selective (Megatron: the attention core), "
                          "full (every layer), or op (torchtitan's per-op selective AC: every "
                          "other matmul's output and the attention kept)."),
        click.option("--recompute-every", type=INT, default=None,
                     help="Apply the recompute policy to one layer in N (torchtitan "
                          "selective_ac_option N with --recompute full; default 1: every layer)."),
        click.option("--recompute-method", type=choice(RecomputeMethod), default=None,
                     help="With --recompute full, Megatron-LM's method: uniform (every layer, "
                          "checkpointed in groups of --recompute-num-layers; the default) or "
                          "block (the first --recompute-num-layers layers of each chunk)."),
        click.option("--recompute-num-layers", type=INT, default=None,
                     help="With --recompute full: the layers of a uniform group, or of a chunk "
                          "recomputed under block (Megatron-LM's; default 1)."),
        click.option("--cpu-offload-layers", type=INT, default=None,
                     help="Offload the activations of the model's first N layers to host memory "
                          "(Megatron-Core --cpu-offloading-num-layers, Transformer Engine; pp 1, "
                          "no recompute; default 0)."),
        click.option("--recompute-modules", default=None, metavar="NAMES",
                     callback=_module_names,
                     help="With --recompute selective: what it recomputes, comma-separated, as "
                          "Megatron's --recompute-modules: core_attn (the default), mla_up_proj, "
                          "mlp, moe_act, shared_experts, layernorm."),
        click.option("--grad-dtype", type=choice(STATE_DTYPES), default=None,
                     help="bf16: main gradients' dtype (default fp32, Megatron-LM's; bf16: NeMo's "
                          "grad_reduce_in_fp32 False)."),
        click.option("--dp-bucket-size", type=INT, default=None, help=DP_BUCKET_SIZE_HELP),
        click.option("--dp-bucketing", type=choice(DpBucketing), default=None,
                     help=DP_BUCKETING_HELP),
        click.option("--optimizer-dtype", type=choice(STATE_DTYPES), default=None,
                     help="bf16: Adam states' dtype (default fp32 with fp32 master weights; bf16: "
                          "no master copy, Apex distributed_fused_adam dtype bf16)."),
        click.option("--master-weights", type=choice(MASTER_WEIGHTS), default=None,
                     help="bf16: the master weights beside the bf16 ones: fp32 (a copy), "
                          "remainders (their 16 low bits: Megatron's precision-aware optimizer), "
                          "none (default: fp32 with fp32 optimizer states, none with bf16)."),
        click.option("--zero", type=plan_whole(0, 3), default=0, show_default=True,
                     help="ZeRO stage."),
        click.option("--dtype", type=choice(Dtype), default=None, help=DTYPE_HELP),
        click.option("--fp8-recipe", type=choice(Fp8Recipe), default=None, help=FP8_RECIPE_HELP),
        click.option("--fp8-output-layer", is_flag=True, default=None,
                     help=FP8_OUTPUT_LAYER_HELP),
        click.option("--fp8-params", is_flag=True, default=None, help=FP8_PARAMS_HELP),
        click.option("--attention", type=choice(Attention), default=Attention.AUTO.value,
                     show_default=True,
                     help="Attention core: flash (one fused kernel, causal half of the s^2 FLOPs, "
                          "no s^2 memory), unfused (two GEMMs and a softmax), or auto: flash "
                          "where the hardware has a flash kernel for the dtype."),
        click.option("--flash-attention", is_flag=True, hidden=True,
                     help="The old spelling of --attention flash."),
        click.option("--attention-kernel", default=None, metavar="NAME",
                     callback=_kernel_name,
                     help="The flash kernel, by its name on the hardware (perfmodel presets "
                          "lists them; dgx-h100: cudnn, its default, or fa2, FlashAttention-2 "
                          "as flash-attn 2.x runs it; the A100s: fa2, or triton, flash-attn's "
                          "kernel in Triton, llm-foundry's attn_impl triton; MI300X and MI355X: "
                          "ck-v3, Transformer Engine on ROCm's CK kernels, or its backward with "
                          "the other dQ atomics, ck-v3-a16 / ck-v3-a32)."),
        click.option("--overlap-grad-sync", is_flag=True,
                     help="Overlap the data-parallel gradient sync with backward."),
        click.option("--overlap-param-gather", is_flag=True,
                     help="Overlap the parameter all-gather (ZeRO 1-2: distributed optimizer; "
                          "ZeRO 3: FSDP prefetch) with the forward."),
        click.option("--tp-comm-overlap", is_flag=True,
                     help="Overlap tensor-parallel communication with the GEMMs (Megatron "
                          "userbuffers, torchtitan async TP; needs --sequence-parallel)."),
        click.option("--ep-comm-overlap", is_flag=True,
                     help="Overlap a mixture of experts' all-to-alls of one micro-batch with "
                          "another's compute (Megatron --overlap-moe-expert-parallel-comm: "
                          "combined 1F1B; needs ep > 1, virtual stages with pp > 1)."),
        click.option("--pp-scatter-gather", is_flag=True,
                     help="Megatron-LM's scatter-gather of pipeline sends (2021-22, its default "
                          "then; gone from Megatron-Core): without sequence parallelism a stage "
                          "sends 1/tp of its output and the receiver all-gathers it over tp."),
        click.option("--defer-grad-sync", is_flag=True,
                     help="ZeRO 3 without a pipeline: accumulate the gradients unsharded and "
                          "reduce-scatter them once, in the last micro-batch's backward (FSDP2 "
                          "with set_requires_gradient_sync off before it: NeMo AutoModel's "
                          "default); without it every micro-batch reduce-scatters (torchtitan, "
                          "Megatron-LM, DeepSpeed ZeRO-3)."),
        click.option("--bf16-optimizer", is_flag=True,
                     help="DeepSpeed's BF16_Optimizer (bf16 at its ZeRO stage 0; Megatron-"
                          "DeepSpeed's; give --zero 1): each micro-batch's bf16 gradients added "
                          "into whole fp32 ones, all-reduced in fp32."),
        click.option("--gradient-accumulation-fusion/--no-gradient-accumulation-fusion",
                     "grad_accumulation_fusion", default=None,
                     help="Megatron-Core's gradient accumulation fusion (default on): off, each "
                          "linear layer's weight gradient is written in the parameter's dtype "
                          "and added into the main gradient apart, a pass over the stage's "
                          "linear weights every micro-batch (not with ZeRO 3 or "
                          "--bf16-optimizer)."),
        click.option("--tp-backward", type=choice(TpBackward), default=None,
                     help="How tensor parallelism's backward runs: megatron (Megatron-Core, "
                          "Transformer Engine: a sequence-parallel input gathered again for "
                          "its weight gradient behind the input-gradient GEMM, the input "
                          "gradient's reduction behind the weight-gradient GEMM) or dtensor "
                          "(torch DTensor, torchtitan: the gathered input kept, each reduction "
                          "in turn). Default: by --kernels (fused: megatron)."),
        click.option("--fsdp-reshard", type=choice(FsdpReshard),
                     default=FsdpReshard.FORWARD.value, show_default=True,
                     help="ZeRO 3 without a pipeline: when a unit's gathered weights are freed: "
                          "after each forward, gathered again for the backward (FSDP2's "
                          "default); after each backward (reshard_after_forward false: NeMo "
                          "AutoModel's for a mixture of experts); or after the step's last "
                          "backward, the reduction deferred too (AutoModel's "
                          "enable_fsdp_optimizations)."),
        click.option("--ep-dispatcher", type=choice(EPDispatcher),
                     default=EPDispatcher.ALLTOALL.value, show_default=True,
                     help="How a mixture of experts' tokens reach their experts: alltoall "
                          "(NCCL's all-to-all of every top-k copy) or deepep (DeepEP/HybridEP: "
                          "once per node and rank, forwarded over NVLink; docs/moe.md)."),
        click.option("--cross-entropy", type=choice(CrossEntropy),
                     default=CrossEntropy.UNFUSED.value, show_default=True,
                     help="How the loss runs over the logits: unfused (an fp32 copy: "
                          "Megatron's vocabulary-parallel cross entropy, one beside the logits; "
                          "with eager kernels PyTorch's, three), no-upcast (PyTorch's "
                          "on the bf16 logits as they are: NeMo AutoModel's fp32_upcast false), "
                          "torch (PyTorch's on fp32 copies, three whatever --kernels: "
                          "AutoModel's default), te (Transformer Engine's fused kernel, the "
                          "gradient in place in the bf16 logits: Megatron "
                          "--cross-entropy-fusion-impl te) or native (Megatron-Core's native "
                          "fusion: unfused's fp32 copy in fewer passes; "
                          "--cross-entropy-fusion-impl native, NeMo 2's default) or flash-attn "
                          "(flash-attn's fused kernel: the bf16 logits kept, their gradient a "
                          "new tensor; llm-foundry's default loss)."),
        click.option("--optimizer-kernels", type=choice(OptimizerKernels),
                     default=OptimizerKernels.FUSED.value, show_default=True,
                     help="How the AdamW step runs: fused (one kernel reading and writing each "
                          "state once: torch's fused=True, Apex / Transformer Engine FusedAdam "
                          "in Megatron, NeMo, DeepSpeed) or foreach (torch's multi-tensor path, "
                          "eight passes: its default for CUDA tensors; docs/model.md)."),
        click.option("--expert-weighting", type=choice(ExpertWeighting),
                     default=ExpertWeighting.ACTIVATION.value, show_default=True,
                     help="Where a mixture of experts applies its routing weights: activation "
                          "(inside the experts' activation, Megatron-Core from 0.13, NeMo "
                          "AutoModel) or output (on the experts' outputs at the combine, "
                          "torchtitan: their outputs kept for the backward)."),
        click.option("--stack", type=choice(Stack), default=Stack.EAGER.value, show_default=True,
                     help="How the framework runs the layers: eager op by op, compiled "
                          "(torch.compile), or compiled as CUDA graphs (host time per op)."),
        click.option("--expandable-segments", is_flag=True,
                     help="The job runs PyTorch's caching allocator with expandable segments "
                          "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): under memory "
                          "pressure it unmaps free blocks and maps what a request needs, so "
                          "no fragmentation margin is counted (docs/model.md, 'What fits')."),
        click.option("--kernels", type=choice(Kernels), default=None,
                     help="How the element-wise ops (norms, RoPE, activation, residual adds) "
                          "run: fused (Megatron-Core / Transformer Engine kernels), eager "
                          "(PyTorch modules op by op, torchtitan without torch.compile) or "
                          "compiled (Inductor); default: compiled with --stack compiled, else "
                          "fused."),
        click.option("--first-stage-layers", type=plan_whole(0), default=0,
                     help="Layers of the first pipeline stage (Megatron's "
                          "--decoder-first-pipeline-num-layers; 0: not given); the stages not "
                          "given split the rest evenly (L / pp when neither end is given)."),
        click.option("--last-stage-layers", type=plan_whole(0), default=0,
                     help="Layers of the last pipeline stage (Megatron's "
                          "--decoder-last-pipeline-num-layers; 0: not given, as for "
                          "--first-stage-layers)."),
        click.option("--pipeline-layout", default="", metavar="LAYOUT",
                     help="Every pipeline stage's layers, as Megatron's "
                          "--pipeline-model-parallel-layout writes them: E embedding, "
                          "t layer, m MTP module, L loss, '|' ends a stage, x*n and (...)*n "
                          "repeat; pp x --virtual-stages stages (e.g. 'Et|(tt|)*30mL')."),
        click.option("--pipeline-micro-batches", type=plan_whole(0), default=0,
                     help="Micro-batches of one pipeline schedule where the step runs several, "
                          "each with its fill and drain (torchtitan, NeMo AutoModel: one per "
                          "gradient-accumulation step); 0: one schedule a step (Megatron)."),
        click.option("--placement", type=choice(Placement), default=Placement.TP_DP_PP.value,
                     show_default=True, help="Axes from innermost (inside a node) out."),
        click.option("--tp-layout", type=choice(TPLayout), default=TPLayout.ONE_D.value,
                     show_default=True,
                     help="Tensor-parallel layout: Megatron 1d, SUMMA 2d, Tesseract 2.5d, "
                          "3d cube."),
        click.option("--tp-depth", type=INT, default=1, show_default=True,
                     help="Depth d of the 2.5d layout (tp = q^2 d)."),
        click.option("--pr", type=plan_whole(), default=None,
                     help="Layer graphs (CNN/MLP): ranks splitting each layer (model parallel)."),
        click.option("--pc", type=plan_whole(), default=None,
                     help="Layer graphs: ranks splitting the batch (data parallel)."),
        click.option("--norm", type=choice(NORMS), default="local", show_default=True,
                     help="Layer graphs: batch norm local to a rank, synchronized, or group norm."),
        click.option("--collective-variant", type=choice(VARIANTS), default="fused",
                     show_default=True,
                     help="Layer graphs: Allgather/Allreduce, or Gather+Bcast / Reduce+Bcast."),
        click.option("--contributors", type=CONTRIBUTORS, default="standard", show_default=True,
                     help="Layer graphs: the all-gather and all-reduce of a layer with fewer units "
                          "than Pr (c = min(Pr, units) contributors, Pr receivers): over all Pr, "
                          "among the c then a copy to the others, or the cheaper per call."),
        click.option("--seq-len", type=INT, default=None, help=SEQ_LEN_HELP),
        click.option("--collective-algorithm", default=None, type=choice(COLLECTIVE_ALGORITHMS),
                     help="Fix the collective algorithm (default: the hardware's, normally the "
                          "cheapest)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


# a transformer plan's options, which a layer graph (split over Pr x Pc) has none of
TRANSFORMER_ONLY = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "cp_comm", "ep_dispatcher",
                    "ep_comm_overlap", "recompute", "schedule", "virtual_stages",
                    "sequence_parallel", "stack", "kernels", "tp_comm_overlap",
                    "overlap_grad_sync", "overlap_param_gather", "placement", "tp_layout",
                    "tp_depth", "expandable_segments", "attention", "attention_kernel",
                    "flash_attention", "recompute_every", "recompute_method",
                    "recompute_modules", "recompute_num_layers", "grad_dtype",
                    "optimizer_dtype", "master_weights", "cross_entropy", "optimizer_kernels",
                    "pipeline_micro_batches", "pipeline_layout", "first_stage_layers",
                    "last_stage_layers", "cpu_offload_layers", "dp_bucket_size", "dp_bucketing",
                    "tp_backward", "fsdp_reshard",
                    "defer_grad_sync", "bf16_optimizer", "grad_accumulation_fusion",
                    "expert_weighting", "pp_scatter_gather", "uneven_stages")


def _transformer_options_given() -> list[str]:
    """The transformer-only options (TRANSFORMER_ONLY) given on the command line, as flags."""
    ctx = click.get_current_context()
    return [f"--{k.replace('_', '-')}" for k in TRANSFORMER_ONLY
            if k in ctx.params and _given(ctx, k)]


def _given(ctx: click.Context, name: str) -> bool:
    """Whether an option was given on the command line (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source not in (click.core.ParameterSource.DEFAULT,
                                                 click.core.ParameterSource.DEFAULT_MAP)


def _flags_given(ctx: click.Context) -> Callable[[str], bool]:
    """given(field) of perfmodel.idle: whether this command has the option and it was given."""
    return lambda name: name in ctx.params and _given(ctx, name)


def check_outputs(*outputs: tuple[str | None, str]) -> None:
    """Refuse in one line (OutputError), before anything is computed, each (path, what) a later
    write would refuse: a missing directory, a directory, device or FIFO in its place; a path of
    None is no output."""
    from perfmodel.files import check_distinct, check_output

    for path, what in outputs:
        check_output(path, what=what, figure=what in ("plot", "timeline"))
    check_distinct(outputs, input_files())


# the options whose value may be a file the command reads: what no output may replace
_INPUT_OPTIONS = {"model": "model spec", "hardware": "hardware spec", "profile": "profile",
                  "from_config": "job config", "batch": "plans file"}


def input_files() -> list[tuple[str | None, str]]:
    """The files the running command reads by its options (a preset's name is none)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    return [(str(ctx.params[name]) if ctx.params.get(name) else None, what)
            for name, what in _INPUT_OPTIONS.items()]


PLAN_KEYS = ("gpus", "dp", "tp", "pp", "cp", "cp_comm", "ep", "etp", "micro_batch", "global_batch",
             "schedule", "virtual_stages",
             "sequence_parallel", "recompute", "recompute_every", "recompute_method",
             "recompute_num_layers", "recompute_modules", "cpu_offload_layers",
             "dp_bucket_size", "dp_bucketing", "attention_kernel", "grad_dtype",
             "optimizer_dtype", "master_weights",
             "zero", "dtype", "fp8_recipe", "fp8_output_layer", "fp8_params", "flash_attention",
             "overlap_grad_sync", "overlap_param_gather", "tp_comm_overlap", "ep_comm_overlap",
             "pp_scatter_gather", "defer_grad_sync", "bf16_optimizer",
             "grad_accumulation_fusion", "tp_backward", "fsdp_reshard", "expandable_segments",
             "ep_dispatcher",
             "cross_entropy", "optimizer_kernels",
             "expert_weighting", "stack",
             "kernels", "first_stage_layers", "last_stage_layers", "pipeline_layout",
             "pipeline_micro_batches", "placement",
             "tp_layout", "tp_depth")


# the plan options of predict that a plans file's rows give (--dtype and --seq-len are the
# rows' default; --model, --hardware, --profile and --collective-algorithm apply to every row)
BATCH_COLUMNS = tuple(k for k in PLAN_KEYS if k != "dtype")
BATCH_REFUSED = (*BATCH_COLUMNS, "attention", "pr", "pc", "norm", "collective_variant",
                 "contributors", "from_config")


def resolve_hardware(hardware: str | None, profile: str | None,
                     algorithm: str | None = None) -> Any:
    """A HardwareSpec from --hardware and/or --profile (the profile's fields win), with
    --collective-algorithm where given."""
    if not hardware and not profile:
        raise click.UsageError("give --hardware (a preset or file) or --profile")
    return specs_resolve.resolve_hardware(hardware, profile, algorithm)


def profile_status(profile: str | None) -> dict[str, Any]:
    """--json's "profile": its path, whether complete, the stages it lacks and the note (or {})."""
    if not profile:
        return {}
    from perfmodel.specs import profile as profiles

    prof = profiles.load_profile(Path(profile))
    missing = None if prof.missing_stages is None else list(prof.missing_stages)
    return {"profile": {"path": str(prof.path), "complete": prof.complete,
                        "missing_stages": missing, "note": profiles.incomplete_note(prof)}}


def profile_extrapolations(profile: str | None, model: Any, hardware: Any, plan: Any) -> list[str]:
    """The collectives and GEMMs of the plan whose sizes lie outside what the profile's fits saw,
    a flash kernel taken at a head size it was not measured at, and the collectives a pinned
    collective_algorithm does not run (perfmodel.collective.pinned_algorithm_notes)."""
    from perfmodel.collective import pinned_algorithm_notes

    flash = _flash_extrapolation(model, hardware, plan) + pinned_algorithm_notes(
        model, hardware, plan)
    if not profile:
        return flash
    from perfmodel.specs import profile as profiles

    prof = profiles.load_profile(Path(profile))
    notes = _collective_extrapolations(prof, model, hardware, plan) + \
        _gemm_extrapolations(prof, model, hardware, plan) + \
        _layer_extrapolations(prof, model, plan) + flash
    return list(dict.fromkeys(notes))  # a collective issued in forward and backward: one note


def _flash_extrapolation(model: Any, hardware: Any, plan: Any) -> list[str]:
    """A flash kernel costed at a head size its hardware was not measured at: between measured
    sizes its parameters are interpolated, beyond them the nearest size's are taken
    (HardwareSpec.flash_attention.at)."""
    from perfmodel.encode import compute_dtype, resolve_flash

    if not hasattr(model, "attention_head_dim") or \
            not resolve_flash(plan.flash_attention, model, hardware, plan.dtype,
                              plan.attention_kernel):
        return []
    dtype = compute_dtype(plan.dtype)
    kernel = hardware.flash_kernel(dtype, plan.attention_kernel)
    if kernel is None:
        runs = dict.fromkeys(d for k in (hardware.flash_attention,
                                         *hardware.flash_attention_alternatives)
                             if k is not None for d in k.dtypes)
        its = f"its kernels run {', '.join(runs)}" if runs else "its spec has no flash kernel"
        return [f"flash attention in {dtype}: no flash kernel of {hardware.name} is measured "
                f"for {dtype} ({its}): costed as the fused kernel's FLOPs at {hardware.name}'s "
                f"{dtype} GEMM efficiency"]
    dims = [p.head_dim for p in kernel.by_head_dim]
    d = model.attention_head_dim
    if d in dims:
        return []
    measured = ", ".join(str(x) for x in dims)
    how = (f"interpolated between head dims {max(x for x in dims if x < d)} and "
           f"{min(x for x in dims if x > d)}" if min(dims) < d < max(dims)
           else f"head dim {min(dims, key=lambda x: abs(x - d))}'s speed taken")
    return [f"flash attention at head dim {d}: {hardware.name}'s kernel ({kernel.kernel}) was "
            f"measured at head dims {measured}: {how}"]


def _collective_extrapolations(prof: Any, model: Any, hardware: Any, plan: Any) -> list[str]:
    from perfmodel.evaluate import axis_per_node
    from perfmodel.predict import comm_ledger
    from perfmodel.specs import profile as profiles

    if not prof.collective_fits():  # e.g. a GEMM-only profile: the collectives are the preset's
        return []
    scopes = axis_per_node(plan, hardware)
    ranks = _axis_degrees(plan, hardware)
    notes = []
    for record in comm_ledger(model, plan, hardware):
        per_node, where = scopes[record["axis"]]
        scope = "intra" if where == "intra" else "inter"
        what = f"{record['name']} ({record['op']}, {fmt_bytes(record['nbytes'])}, {scope}-node)"
        group = ranks[record["axis"]]
        notes += profiles.collective_notes(prof, what, record["op"], record["nbytes"], group,
                                           scope, -(-group // per_node) if per_node else None)
    return notes


def _axis_degrees(plan: Any, hardware: Any) -> dict[str, int]:
    """The ranks of one group of each axis of the plan (as axis_per_node names the axes)."""
    from perfmodel.encode import axis_ranks_per_node, fabric_of, plan_arrays

    arrays = plan_arrays(plan)
    taken = fabric_of(hardware).domains(arrays)[0]
    return {axis: int(degree[0])
            for axis, (degree, _) in axis_ranks_per_node(arrays, taken).items()}


def _gemm_extrapolations(prof: Any, model: Any, hardware: Any, plan: Any) -> list[str]:
    """GEMMs of the plan whose FLOPs lie outside the range of the profile's GEMM fit in use (the
    one whose parameters are the hardware's for the plan's dtype; none: the preset's model)."""
    from perfmodel.predict import gemm_shapes
    from perfmodel.specs import profile as profiles

    fit = profiles.gemm_fit_in_use(prof, hardware.gemm(plan.dtype.value))
    if fit is None:
        return []
    lo, hi = fit["size_range"]
    dtype = fit.get("perfmodel_dtype") or fit.get("dtype") or plan.dtype.value
    notes = []
    for g in gemm_shapes(model, plan):
        if not lo <= g["flops"] <= hi:
            notes.append(f"gemm {g['name']} ({g['batch']:g} x {g['m']:g} x {g['n']:g} x "
                         f"{g['k']:g}, {g['flops']:.3g} FLOP) is outside the sizes the profile's "
                         f"{dtype} GEMM fit measured ({lo:.3g}-{hi:.3g} FLOP): "
                         "extrapolated")
    return notes


def _layer_extrapolations(prof: Any, model: Any, plan: Any) -> list[str]:
    """Parts whose measured framework costs (calibrate run, stage layers) the plan uses outside
    the tokens per micro-batch, widths or tensor-parallel degrees they were measured at."""
    from perfmodel.specs.hardware import LAYER_PARTS

    # the style perfmodel.step charges: tp or tp_sp for Megatron 1D with tp > 1, else plain
    style = "plain" if plan.tp == 1 or plan.tp_layout.value != "1d" else (
        "tp_sp" if plan.sequence_parallel else "tp")
    tokens, hidden = plan.micro_batch * model.seq_len, model.hidden
    notes = []
    for part in LAYER_PARTS:
        fits = [f for f in prof.fits.values()
                if f["kind"] == "layer" and f.get("part") == part and f.get("style") == style]
        if not fits:
            continue
        lo, hi = min(f["size_range"][0] for f in fits), max(f["size_range"][1] for f in fits)
        widths = [f["hidden_range"] for f in fits if "hidden_range" in f]
        degrees = sorted({int(f["tp"]) for f in fits})
        outside = []
        if not lo <= tokens <= hi:
            outside.append(f"{tokens} tokens per micro-batch (measured {lo}-{hi})")
        if widths and not min(w[0] for w in widths) <= hidden <= max(w[1] for w in widths):
            outside.append(f"hidden {hidden} (measured {min(w[0] for w in widths)}-"
                           f"{max(w[1] for w in widths)})")
        if not degrees[0] <= plan.tp <= degrees[-1] and style != "plain":
            outside.append(f"tp {plan.tp} (measured {', '.join(map(str, degrees))})")
        if outside:
            notes.append(f"framework cost of the {part} ({style}) at {', '.join(outside)}: "
                         "extrapolated")
    return notes


PR_PC_TRANSFORMER = ("--pr/--pc apply to layer-graph models (alexnet, vgg16, resnet50, mlp or a "
                     "'kind: layers' file); transformers take --dp/--tp/--pp")


def _refuse_graph_options() -> None:
    """A layer graph's options (its normalization, collective variant and contributors) given
    for a transformer would change nothing: refused, as --pr/--pc are."""
    ctx = click.get_current_context(silent=True)
    given = [f"--{name.replace('_', '-')}" for name in ("norm", "collective_variant",
                                                        "contributors")
             if ctx is not None and _flags_given(ctx)(name)]
    if given:
        raise click.UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                               "layer-graph models (alexnet, vgg16, resnet50, mlp or a 'kind: "
                               "layers' file); a transformer has none")


def layer_graph_inputs(kw: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """(model, hardware, GridPlan) when --model is a layer graph (CNN/MLP), else None."""
    from perfmodel.specs.layers import LayerGraphSpec
    from perfmodel.specs.model import load_model

    if not kw.get("model"):
        raise click.UsageError("give --model (a preset, spec file or Hugging Face config.json)")
    model = load_model(kw["model"]) if kw.get("seq_len") is None else None
    if not isinstance(model, LayerGraphSpec):
        if kw.get("pr") or kw.get("pc"):
            raise click.UsageError(PR_PC_TRANSFORMER)
        return None
    if kw.get("fp8_recipe") or kw.get("fp8_output_layer") or kw.get("fp8_params"):
        raise click.UsageError("--fp8-recipe, --fp8-output-layer and --fp8-params apply to "
                               "transformers trained in fp8 (--dtype fp8); a layer graph trains "
                               "in fp32, tf32, bf16 or fp16")
    given = _transformer_options_given()
    if given:
        raise click.UsageError(f"{', '.join(given)}: a transformer's degrees and options; a "
                               "layer graph splits over --pr x --pc")
    from perfmodel.layerwise import Contributors, GridPlan

    ctx = click.get_current_context()
    if _given(ctx, "micro_batch") and kw.get("global_batch"):
        raise click.UsageError("--micro-batch beside --global-batch: a layer graph's step is one "
                               "batch split over --pc, without micro-batches; give one of them")
    hardware = resolve_hardware(kw.get("hardware"), kw.get("profile"),
                                kw.get("collective_algorithm"))
    gpus: int | None = kw.get("gpus")
    pr: int | None = kw.get("pr")
    pc: int | None = kw.get("pc")
    # a split that does not divide the GPUs is a plan error (as dp x tp x pp != gpus), named
    # by the flags given (never a derived 0: --pr 16 on 8 GPUs)
    if gpus is not None and gpus % ((pr or 1) * (pc or 1)):
        split = " x ".join(f"--{k} {v}" for k, v in (("pr", pr), ("pc", pc)) if v is not None)
        raise PlanError(f"{split} must divide --gpus {gpus}")
    if pr is None:
        pr = 1 if pc is None else (gpus or pc) // pc
    if pc is None:
        pc = (gpus or pr) // pr
    if gpus is not None and pr * pc != gpus:
        raise PlanError(f"--pr x --pc must equal --gpus: {pr} x {pc} != {gpus}")
    batch = kw.get("global_batch") or pc * kw["micro_batch"]
    if ctx.command.name == "explain":  # every split of the GPUs, those whose Pc divides the
        # batch: the plan's own grid Pr = P, Pc = 1, which every batch fits (with Pc = P, a
        # batch of 8 on 16 GPUs was refused, a split of which runs it: a probe's, 2026-12-07)
        pr, pc = pr * pc, 1
    plan = GridPlan(pr=pr, pc=pc, global_batch=batch, norm=kw["norm"],
                    variant=kw["collective_variant"],
                    contributors=kw.get("contributors") or Contributors.STANDARD,
                    dtype=kw.get("dtype") or "fp32")
    if ctx.command.name == "explain":  # over every Pr x Pc split of the GPUs
        grids, scope = grid_splits([plan.gpus]), f"Pr x Pc split of {plan.gpus} GPUs"
    else:  # predict and validate: the one grid
        grids, scope = [(plan.pr, plan.pc)], ""
    refuse_idle_graph_options(_flags_given(ctx), model, plan.norm.value, plan.variant.value,
                              plan.contributors.value, grids, scope)
    from perfmodel.encode import check_whole_nodes

    check_whole_nodes(hardware, plan.gpus)  # as a transformer's plan (perfmodel.predict)
    return model, hardware, plan


def refuse_idle_graph_options(given: Callable[[str], bool], model: Any, norm: str,
                              variant: str, contributors: str,
                              grids: Sequence[tuple[int, int]], scope: str = "") -> None:
    """A layer graph's option given where it changes nothing on every grid (Pr, Pc) the command
    computes: refused (exit 2), as a transformer's idle flags are (perfmodel.idle). One rule for
    predict and validate (one grid), explain (every split of --gpus), sweep (the grid of each
    point, or every split with --best-pr) and recommend (every split of each GPU count); `scope`
    names the grids where there are several ('': the one grid). `given(name)`: whether the user
    gave the option (a command without it: never)."""
    from perfmodel.layerwise import layer_degrees

    if given("norm") and norm != "local" and not any(layer.kind == "norm"
                                                     for layer in model.layers):
        what = "synchronise" if norm == "sync" else "replace by a group norm"
        raise click.UsageError(f"--norm {norm}: {model.name} has no norm layer whose statistics "
                               f"it would {what}; leave --norm out")
    one = not scope
    if given("norm") and norm == "sync" and all(pc == 1 for _, pc in grids):
        raise click.UsageError("--norm sync synchronises the statistics over the data-parallel "
                               f"ranks, and {'the grid' if one else 'every ' + scope} has Pc 1; "
                               "leave --norm out")
    if given("collective_variant") and variant == "split" and all(pr == 1 for pr, _ in grids):
        raise click.UsageError("--collective-variant split changes the model-parallel "
                               f"collectives, and {'the grid' if one else 'every ' + scope} has "
                               "Pr 1 (none); leave it out")

    def idle_at(pr: int) -> bool:  # no layer has fewer units than Pr: --contributors does nothing
        return all(c >= pr for c in layer_degrees(model, pr).values())

    if given("contributors") and contributors != "standard" \
            and all(idle_at(pr) for pr in {pr for pr, _ in grids}):
        where = f"Pr ({grids[0][0]}), and {model.name} has none at this grid" if one else \
            f"Pr, and {model.name} has none at any {scope}"
        raise click.UsageError(f"--contributors {contributors} applies to layers with fewer "
                               f"units than {where}; leave it out")


def grid_splits(gpu_counts: Sequence[int]) -> list[tuple[int, int]]:
    """Every Pr x Pc split of each GPU count (what explain and recommend go over)."""
    from perfmodel.layerwise import divisors

    return [(pr, gpus // pr) for gpus in gpu_counts for pr in divisors(gpus)]


def model_summary(model: Any) -> dict[str, Any]:
    """Where the model was read and where its sequence length came from (for --json)."""
    return {"model_source": model.origin or "given in Python", "seq_len": model.seq_len,
            "seq_len_from": model.seq_len_from or "the model"}


def active_parameters(model: Any, parameters: float) -> float:
    """The parameters one token uses (perfmodel.params): `parameters` for a dense model."""
    from perfmodel.params import parameter_counts

    counts = parameter_counts(model)
    return parameters if not counts.sparse else float(counts.reported)


def mtp_parameters(model: Any) -> float:
    """The multi-token-prediction modules' own parameters (perfmodel.params): 0 without them."""
    from perfmodel.params import parameter_counts

    return float(parameter_counts(model).mtp)


def noted_seq_len(model: Any, seq_len: int | None, given: Any = None) -> Any:
    """The model with --seq-len noted as where its sequence length came from (when given). A
    preset's or spec file's learned position table follows the sequence length
    (perfmodel.params): where --seq-len changes it, a note says by how much (a Hugging Face
    config's table is its checkpoint's, which --seq-len may not pass)."""
    if seq_len is None or not hasattr(model, "noted"):
        return model
    if given is not None and model.position_embedding == "learned" \
            and not model.origin.endswith("(Hugging Face config)"):
        from perfmodel.specs.model import load_model

        own = load_model(given).seq_len
        if own != seq_len:
            hold(f"note: {model.name} has learned positions: --seq-len {seq_len} sizes its "
                 f"position table to {seq_len} rows (its own: {own}), "
                 f"{(seq_len - own) * model.hidden / 1e6:+.2f}M parameters")
    return model.noted(seq_len_from="--seq-len")


def attention_option(kw: dict[str, Any]) -> bool | None:
    """--attention (auto, flash, unfused) as the plan's flash_attention (None, True, False);
    the old flag --flash-attention is --attention flash."""
    attention = Attention(kw.pop("attention", None) or Attention.AUTO.value)
    if kw.pop("flash_attention", False):
        if attention is Attention.UNFUSED:
            raise click.UsageError("--flash-attention contradicts --attention unfused; give one")
        attention = Attention.FLASH
    return attention.flash


def given_plan_options(kw: dict[str, Any]) -> dict[str, Any]:
    """The plan options given on the command line (not left at their defaults)."""
    ctx = click.get_current_context()
    given = {k: kw[k] for k in PLAN_KEYS if k in kw and _given(ctx, k)}
    if _given(ctx, "attention") or kw.get("flash_attention"):
        given["flash_attention"] = attention_option(dict(kw))
    else:
        given.pop("flash_attention", None)
    return given


def config_inputs(kw: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(model, hardware, plan, job) of --from-config: the config's model and plan, --model
    filling what it lacks, the command line's plan options what it leaves open."""
    from perfmodel.configs import read_config, resolve_model, resolve_plan
    from perfmodel.strategy import plan_from_dict

    if kw.get("pr") or kw.get("pc"):
        raise click.UsageError(PR_PC_TRANSFORMER)
    _refuse_graph_options()
    job = read_config(kw["from_config"])
    model = resolve_model(job, kw.get("model"), kw.get("seq_len"))
    model.require_costed()
    hardware = resolve_hardware(kw.get("hardware"), kw.get("profile"),
                                kw.get("collective_algorithm"))
    try:
        model, plan_kw = resolve_plan(job, model, given_plan_options(kw))
        plan_kw.setdefault("dtype", hardware.default_dtype())
        plan = plan_from_dict(plan_kw)
        plan.check(model)
    except PlanError as exc:
        if job.gpus_default and kw.get("gpus") is None:  # a world the script does not state
            raise PlanError(f"{exc} (the world size {job.gpus} is {job.gpus_from}: "
                            f"{job.gpus_default}; give --gpus)") from None
        raise
    return model, hardware, plan, job


def print_job(job: Any) -> None:
    """What a config held: read, ignored, unknown, assumed (standard error, once the command
    has an answer: hold)."""
    for line in job.report():
        hold(line)


def derive_dp(kw: dict[str, Any]) -> None:
    """--gpus without --dp: the data-parallel degree is what the other degrees leave,
    gpus / (tp x pp x cp), as Megatron-LM derives it from the world size; refused in one line
    where they do not divide the GPU count."""
    from perfmodel.strategy import derived_dp

    gpus = kw.get("gpus")
    if gpus is None or _given(click.get_current_context(), "dp"):
        return
    if not 1 <= gpus <= MAX_DEGREE:  # the plan refuses the count the user gave, named gpus
        return                       # (not a dp derived from it)
    tp, pp, cp = kw["tp"], kw["pp"], kw.get("cp", 1)
    if min(tp, pp, cp) < 1:  # the plan names the degree and its range (exit 4), as without --gpus
        return
    dp = derived_dp(gpus, tp, pp, cp)
    if dp is None:
        raise PlanError(  # degrees that do not divide: a plan error, as dp x tp x pp != gpus
            f"--gpus ({gpus}) must be a multiple of tp x pp x cp ({tp} x {pp} x {cp} = "
            f"{tp * pp * cp}) to derive --dp from it; or give --dp")
    kw["dp"] = dp


def build_inputs(kw: dict[str, Any], adjust: Callable[[Any], Any] | None = None
                 ) -> tuple[Any, Any, Any]:
    """The model, hardware and plan of a command's options; `adjust` changes the model before
    the plan is checked against it (validate's --layers, --hidden ...)."""
    from perfmodel.specs.model import load_model
    from perfmodel.strategy import plan_from_dict

    if kw.get("from_config"):
        model, hardware, plan, job = config_inputs(kw)
        print_job(job)
        if adjust is not None:
            model = adjust(model)
            plan.check(model)
        return model, hardware, plan
    if not kw.get("model"):
        raise click.UsageError("give --model (a preset, spec file or Hugging Face config.json)")
    model = noted_seq_len(load_model(kw["model"], seq_len=kw.get("seq_len")), kw.get("seq_len"),
                          kw["model"])
    if getattr(model, "kind", "") == "layers":
        raise click.UsageError(f"model '{model.name}' is a layer graph (CNN/MLP): this takes a "
                               "transformer (layer graphs take --pr/--pc in predict, explain and "
                               "validate runs)")
    if kw.get("pr") or kw.get("pc"):  # validate --emit and --dry-run come here directly
        raise click.UsageError(PR_PC_TRANSFORMER)
    _refuse_graph_options()
    if adjust is not None:
        model = adjust(model)
    model.require_costed()  # a mixture of experts, MLA, a window: refused, never costed as dense
    hardware = resolve_hardware(kw.get("hardware"), kw.get("profile"),
                                kw.get("collective_algorithm"))
    kw["flash_attention"] = attention_option(kw)
    derive_dp(kw)
    plan_kw = {k: kw[k] for k in PLAN_KEYS if kw.get(k) is not None}
    plan_kw.setdefault("dtype", hardware.default_dtype())
    plan_kw.setdefault("gpus", kw["dp"] * kw["tp"] * kw["pp"] * kw.get("cp", 1))
    plan_kw.setdefault("global_batch", kw["dp"] * kw["micro_batch"])
    plan = plan_from_dict(plan_kw)
    plan.check(model)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        from perfmodel.idle import refuse_idle_flags

        refuse_idle_flags(plan, model, _flags_given(ctx))
    return model, hardware, plan


def _refuse_idle_pins(pins: dict[str, Any], gpu_counts: Sequence[int], experts: int = 0) -> None:
    """recommend's pins that no plan it searches could use, as predict refuses their flags
    (perfmodel.idle): --cp-comm beside --cp 1, an overlap of the data-parallel sync where
    every GPU count is 1 (no plan has a group to sync over), and the experts' options the user
    gives for a model without experts (a config's own, written for any model, are not refused)."""
    ctx = click.get_current_context(silent=True)
    if not experts and ctx is not None:
        for name, default in (("ep_dispatcher", "alltoall"), ("expert_weighting", "activation")):
            value = str(getattr(pins.get(name), "value", pins.get(name)))
            if name in ctx.params and _given(ctx, name) and value != default:
                flag = "--" + name.replace("_", "-")
                raise PlanError(f"{name} {value} applies to a mixture of experts, and the model "
                                f"has no experts: leave {flag} out")
        if "ep_comm_overlap" in ctx.params and _given(ctx, "ep_comm_overlap") \
                and pins.get("ep_comm_overlap"):
            raise PlanError("ep_comm_overlap overlaps a mixture of experts' all-to-alls, and the "
                            "model has no experts: leave --ep-comm-overlap out")
    if ctx is not None:  # a cap beside a pin of the same axis: the pin decides
        for cap, axis in (("max_tp", "tp"), ("max_pp", "pp"), ("max_cp", "cp"),
                          ("max_micro_batch", "micro_batch")):
            if cap in ctx.params and _given(ctx, cap) and pins.get(axis) is not None:
                raise PlanError(f"--{cap.replace('_', '-')} caps a searched {axis}, and "
                                f"{axis} is pinned at {pins[axis]}: leave one out")
        if "uneven_stages" in ctx.params and _given(ctx, "uneven_stages") \
                and pins.get("pp") is not None:
            raise PlanError(f"--uneven-stages searches the pp that do not divide the layers, "
                            f"and pp is pinned at {pins['pp']} (split so anyway where it does "
                            "not): leave one out")

    def typed(name: str) -> bool:  # given on the command line (a config's own are not refused)
        return ctx is not None and name in ctx.params and _given(ctx, name) \
            and pins.get(name) is not None

    dispatcher = str(getattr(pins.get("ep_dispatcher"), "value", pins.get("ep_dispatcher")))
    if pins.get("ep") == 1 and typed("ep_dispatcher") and dispatcher != "alltoall":
        raise PlanError(f"ep_dispatcher {dispatcher} exchanges a mixture of experts' tokens over "
                        "expert parallelism (ep > 1), and --ep pins ep 1: give --ep above 1 (or "
                        "leave it free), or leave --ep-dispatcher out")
    if pins.get("tp") == 1 and typed("tp_backward"):
        backward = getattr(pins["tp_backward"], "value", pins["tp_backward"])
        if str(backward).strip().lower() not in ("auto", ""):
            raise PlanError(f"tp_backward {backward} applies to tensor parallelism (tp > 1), and "
                            "--tp pins tp 1: give --tp above 1 (or leave it free), or leave "
                            "--tp-backward out")
    if pins.get("cp") == 1 and pins.get("cp_comm") is not None:
        raise PlanError(f"cp_comm {pins['cp_comm']} applies to context parallelism (cp > 1), and "
                        "--cp pins cp 1: give --cp above 1 (or leave it free), or leave "
                        "--cp-comm out")
    if max(gpu_counts) == 1:
        for name in ("overlap_grad_sync", "overlap_param_gather"):
            if pins.get(name):
                flag = "--" + name.replace("_", "-")
                raise PlanError(f"{flag} overlaps the data-parallel sync, and on one GPU no plan "
                                f"has one: give --gpus above 1, or leave {flag} out")
        if pins.get("zero"):
            raise PlanError(f"zero {pins['zero']} shards over the data-parallel ranks, and on one "
                            "GPU no plan has them: give --gpus above 1, or leave --zero out")


# --- predict -------------------------------------------------------------------------------------
@cli.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--batch", "batch", type=click.Path(), default=None,
              help="CSV of plans, one per row (columns named like the flags).")
@click.option("--out", "out", type=click.Path(), default=None,
              help="With --batch: write results here (CSV) instead of standard output.")
@click.option("--plot", "plot_path", type=click.Path(), default=None,
              help="Draw the time and memory breakdowns (PNG, SVG or PDF, by the suffix).")
@click.option("--trace", "trace_path", type=click.Path(), default=None,
              help="Write the predicted step as a Chrome/Perfetto trace (JSON): every stage's "
                   "passes per the schedule, the bubbles, the sync and the optimizer.")
@click.option("--timeline", "timeline_path", type=click.Path(), default=None,
              help="Draw the predicted step as a Gantt chart (PNG, SVG or PDF by the suffix).")
@click.option("--html", "html_path", type=click.Path(), default=None,
              help="Write a self-contained HTML report (plan, breakdown, memory, timeline).")
def predict(as_json: bool, batch: str | None, out: str | None, plot_path: str | None,
            trace_path: str | None, timeline_path: str | None, html_path: str | None,
            **kw: Any) -> None:
    """Predict step time, throughput and per-GPU memory of one plan (or a CSV of plans)."""
    from perfmodel.predict import predict as run

    if out and not batch:
        raise click.UsageError("--out goes with --batch (for one plan: --json > FILE)")
    outputs = {"plot_path": plot_path, "trace_path": trace_path,
               "timeline_path": timeline_path, "html_path": html_path}
    if batch:
        given = [name for name in BATCH_REFUSED if _given(click.get_current_context(), name)]
        given += [name for name, path in outputs.items() if path]
        if given:
            flag = "--" + given[0].removesuffix("_path").replace("_", "-")
            raise click.UsageError(
                f"{flag} does not go with --batch: each row is its own plan (give it as a "
                f"'{given[0]}' column of the plans file)" if given[0] in BATCH_COLUMNS else
                f"{flag} does not go with --batch (it applies to one plan or to layer graphs)")
        from perfmodel.batch import run_batch

        check_outputs((out, "results"))  # before any plan is predicted
        failures = run_batch(Path(batch), kw, Path(out) if out else None, as_json)
        if failures:
            sys.exit(5)
        return
    job = None
    if kw.get("from_config"):
        model, hardware, plan, job = config_inputs(kw)
        print_job(job)
        graph = None
    else:
        graph = layer_graph_inputs(kw)
    if graph is not None:
        from perfmodel.layerwise import predict_grid

        if trace_path or timeline_path or html_path:
            raise click.UsageError("--trace, --timeline and --html draw transformer plans; a "
                                   "layer graph takes --plot")
        check_outputs((plot_path, "plot"))
        grid = predict_grid(*graph)
        if plot_path:
            from perfmodel.plot import prediction_plot

            prediction_plot(grid, Path(plot_path))
        if as_json:
            click.echo(json_text(document("predict.grid", {
                **grid.to_dict(), "collective_algorithm": grid.hardware.collective_algorithm})))
        else:
            from perfmodel.render import print_grid_prediction

            print_grid_prediction(grid)
        return
    if job is None:
        model, hardware, plan = build_inputs(kw)
    check_outputs((plot_path, "plot"), (trace_path, "trace"), (timeline_path, "timeline"),
                  (html_path, "HTML report"))  # before the prediction, not after it
    result = run(model, hardware, plan, refuse_idle=False)  # the flags are checked above
    notes = profile_extrapolations(kw.get("profile"), model, hardware, plan)
    if plot_path:
        from perfmodel.plot import prediction_plot

        prediction_plot(result, Path(plot_path))
    drawn = []  # what the timeline says of itself (not an extrapolation of the profile)
    if trace_path or timeline_path:
        drawn = _timeline_outputs(model, hardware, plan, trace_path, timeline_path)
    elif plan.schedule.value == "zbv" and plan.pp > 1 \
            and plan.num_micro_batches // plan.pipeline_flushes < 2 * plan.pp:
        drawn = _zbv_order_note(model, hardware, plan)
    if html_path:
        from perfmodel.htmlreport import prediction_html, write_html

        write_html(html_path, prediction_html(result, notes))
    release_held()
    for note in notes + drawn:
        click.echo(f"note: {note}", err=True)
    if as_json:
        config = {"config": job.to_dict()} if job is not None else {}
        click.echo(json_text(document("predict", {
            **result.to_dict(), "collective_algorithm": hardware.collective_algorithm,
            **model_summary(model), "extrapolations": notes,
            **profile_status(kw.get("profile")), **config})))
    else:
        from perfmodel.render import print_prediction

        print_prediction(result)


def _zbv_order_note(model: Any, hardware: Any, plan: Any) -> list[str]:
    """ZB-V with fewer than 2 pp micro-batches a schedule: its order, laid out with each stage's
    own pass times, differs from the closed form (taken on the other stages' pace: within 3% of
    the order in docs/timeline.md's table, 8% in its 96 plans; the paper's (pp - 1)(F + B - 2W)
    alone was 15% short at m = pp before 2026-12-07): said where it differs, as --trace says
    it. A few micro-batches lay out in milliseconds."""
    from perfmodel.errors import PlanError
    from perfmodel.timeline import predicted_timeline

    try:
        notes = list(predicted_timeline(model, hardware, plan).notes)
    except PlanError:  # a plan the timeline does not draw (ranks time-sharing a device)
        return []
    return [f"{note} (fewer than 2 x pp = {2 * plan.pp} micro-batches a schedule: "
            "predict --trace draws the order)" for note in notes]


def _timeline_outputs(model: Any, hardware: Any, plan: Any, trace_path: str | None,
                      timeline_path: str | None) -> list[str]:
    """predict --trace / --timeline: write them; returns the timeline's notes (where its schedule
    does not take the model's closed-form time)."""
    from perfmodel.timeline import predicted_timeline, write_trace

    timeline = predicted_timeline(model, hardware, plan)
    if trace_path:
        write_trace(trace_path, [timeline])
    if timeline_path:
        from perfmodel.plot import timeline_plot

        timeline_plot([timeline], Path(timeline_path))
    return list(timeline.notes)


@cli.command()
@plan_options
@click.option("--latex", is_flag=True, help="Print LaTeX instead of plain text.")
@click.option("--term", "terms", multiple=True,
              help="Only these terms (repeatable; a group such as comm or compute/forward "
                   "selects every term under it), e.g. comm/tp, memory/weights.")
def explain(latex: bool, terms: tuple[str, ...], **kw: Any) -> None:
    """Print the symbolic formulas of the step time and of each term, with the symbols' values."""
    graph = None if kw.get("from_config") else layer_graph_inputs(kw)
    if graph is not None:
        from perfmodel.explain import explain_grid_text

        ctx = click.get_current_context()
        given = [f"--{n}" for n in ("pr", "pc") if _given(ctx, n)]
        if given:
            raise click.UsageError(f"{', '.join(given)}: explain analyses a layer graph over "
                                   "every Pr x Pc split of --gpus; leave it out (predict takes "
                                   "one split)")
        if terms:
            raise click.UsageError("--term selects a transformer's terms; a layer graph's "
                                   "explanation is its communication over Pr and its splits' "
                                   "step times, whole")

        click.echo(explain_grid_text(*graph, latex=latex))
        return
    from perfmodel.explain import explain_text

    model, hardware, plan = build_inputs(kw)
    click.echo(explain_text(model, hardware, plan, latex=latex, only=terms))


@cli.command()
@click.option("--model", "model", default=None,
              help="Model preset or spec file (required unless --from-config gives the model).")
@click.option("--from-config", "from_config", type=click.Path(), default=None,
              help="The job's own config (as predict's): its stated choices are pinned, what it "
                   "leaves open is searched (docs/configs.md).")
@click.option("--emit-config", "emit_config", nargs=2, default=None,
              type=(choice(("megatron", "torchtitan", "deepspeed")), click.Path()),
              help="Write the best plan as FORMAT's config (megatron, torchtitan, deepspeed) "
                   "into the directory DIR.")
@click.option("--hardware", default=None, help="Hardware preset or spec file.")
@click.option("--profile", default=None, type=click.Path(),
              help="Calibrated profile.")
@click.option("--gpus", default=None,
              help="GPU count, or several separated by commas (e.g. 512,1024); required unless "
                   "--from-config gives the world size.")
@click.option("--global-batch", type=plan_whole(), default=None,
              help="Global batch [samples]; required unless --from-config gives it.")
@click.option("--dtype", type=choice(Dtype), default=None, help=DTYPE_HELP)
@click.option("--fp8-recipe", type=choice(Fp8Recipe), default=None, help=FP8_RECIPE_HELP)
@click.option("--fp8-output-layer", is_flag=True, default=False, help=FP8_OUTPUT_LAYER_HELP)
@click.option("--fp8-params", is_flag=True, default=False, help=FP8_PARAMS_HELP)
@click.option("--seq-len", type=INT, default=None, help=SEQ_LEN_HELP)
@click.option("--dp", type=plan_whole(), default=None, help="Pin the data-parallel degree.")
@click.option("--tp", type=plan_whole(), default=None, help="Pin the tensor-parallel degree.")
@click.option("--pp", type=plan_whole(), default=None, help="Pin the pipeline-parallel degree.")
@click.option("--cp", type=plan_whole(), default=None,
              help="Pin the context-parallel degree (default: search 1 and, with fused "
                   "attention, those dividing the sequence into 2 cp chunks).")
@click.option("--cp-comm", type=choice(CPComm), default=None,
              help="Pin how attention crosses the cp ranks (default: search p2p, allgather, a2a).")
@click.option("--ep", type=plan_whole(), default=None,
              help="Pin the expert-parallel degree of a mixture of experts (default: search those "
                   "dividing the experts and tp x dp x cp / etp).")
@click.option("--etp", type=plan_whole(), default=None,
              help="Pin the expert-tensor-parallel degree of a mixture of experts (default: "
                   "search those dividing tp and the experts' FFN width).")
@click.option("--micro-batch", type=plan_whole(), default=None, help="Pin the micro-batch size.")
@click.option("--schedule", type=choice(Schedule), default=None, help="Pin the pipeline schedule.")
@click.option("--virtual-stages", type=plan_whole(), default=None,
              help="Pin the model chunks per GPU.")
@click.option("--recompute", type=choice(Recompute), default=None,
              help="Pin the activation recompute.")
@click.option("--recompute-every", type=plan_whole(), default=1, show_default=True,
              help="Every plan applies its recompute policy to one layer in N.")
@click.option("--recompute-method", type=choice(RecomputeMethod),
              default=RecomputeMethod.UNIFORM.value, show_default=True,
              help="Every plan's full recompute by Megatron-LM's method (block: the first "
                   "--recompute-num-layers of each chunk); a method or count beyond uniform 1 "
                   "searches full recompute only.")
@click.option("--recompute-num-layers", type=plan_whole(), default=1, show_default=True,
              help="Every plan's full recompute: the layers of a uniform group, or of a chunk "
                   "under block.")
@click.option("--cpu-offload-layers", type=plan_whole(0, None), default=0, show_default=True,
              help="Every plan offloads the activations of the model's first N layers to host "
                   "memory (Megatron-Core --cpu-offloading-num-layers): only pp 1 without "
                   "recompute is searched then.")
@click.option("--grad-dtype", type=choice(STATE_DTYPES), default=None,
              help="bf16: every plan's main-gradient dtype (default fp32).")
@click.option("--dp-bucket-size", type=plan_whole(maximum=10**13), default=None,
              help="Every plan's " + DP_BUCKET_SIZE_HELP[0].lower() + DP_BUCKET_SIZE_HELP[1:]
              + " Given, ZeRO 3 is not searched.")
@click.option("--dp-bucketing", type=choice(DpBucketing), default=DpBucketing.MEGATRON.value,
              show_default=True, help=DP_BUCKETING_HELP)
@click.option("--optimizer-dtype", type=choice(STATE_DTYPES), default=None,
              help="bf16: every plan's Adam-state dtype (default fp32, with master weights).")
@click.option("--master-weights", type=choice(MASTER_WEIGHTS), default=None,
              help="bf16: every plan's master weights: fp32, remainders (Megatron's "
                   "precision-aware optimizer; leaves ZeRO 3 out) or none.")
@click.option("--sequence-parallel/--no-sequence-parallel", default=None,
              help="Pin sequence parallelism on or off.")
@click.option("--zero", type=plan_whole(0, 3), default=None, help="Pin the ZeRO stage.")
@click.option("--placement", type=choice(Placement), default=None,
              help="Pin the placement of the axes, innermost (inside a node) first (default: "
                   "search tp,dp,pp, tp,pp,dp and dp,tp,pp).")
@click.option("--tp-layout", type=choice(TPLayout), default=None,
              help="Pin the tensor-parallel layout (default: search 1d, 2d, 2.5d and 3d).")
@click.option("--tp-depth", type=plan_whole(), default=None, help="Pin the 2.5d depth.")
@click.option("--max-tp", type=plan_whole(), default=None, help="Largest tensor-parallel degree.")
@click.option("--max-pp", type=plan_whole(), default=None, help="Largest pipeline-parallel degree.")
@click.option("--max-cp", type=plan_whole(), default=None,
              help="Largest context-parallel degree (every one that splits the sequence into 2 "
                   "cp chunks is searched: at short sequences they multiply the plans).")
@click.option("--uneven-stages", is_flag=True,
              help="Also search pipeline degrees that do not divide the layers, the first and "
                   "the last stage taking fewer (as Llama 3 405B: 126 layers on 16 stages, 7 on "
                   "the first and the last); a pinned --pp is split so anyway.")
@click.option("--max-micro-batch", type=plan_whole(), default=None, help="Largest micro-batch.")
@click.option("--attention", type=choice(Attention), default=Attention.AUTO.value,
              show_default=True,
              help="Every plan's attention core: flash, unfused, or auto (flash where the "
                   "hardware has a flash kernel for the dtype).")
@click.option("--flash-attention", is_flag=True, hidden=True,
              help="The old spelling of --attention flash.")
@click.option("--attention-kernel", default=None, metavar="NAME", callback=_kernel_name,
              help="Every plan's flash kernel, by its name on the hardware (dgx-h100: cudnn, "
                   "its default, or fa2).")
@click.option("--overlap-grad-sync/--no-overlap-grad-sync", default=None,
              help="Pin the data-parallel gradient sync overlapped with backward, or not "
                   "(default: overlapped wherever dp > 1).")
@click.option("--overlap-param-gather/--no-overlap-param-gather", default=None,
              help="Pin the parameter all-gather overlapped with forward, or not (default: "
                   "overlapped wherever ZeRO >= 1).")
@click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
              help="Pin tensor-parallel communication overlapped with the GEMMs, or not "
                   "(default: both searched, with sequence parallelism).")
@click.option("--ep-comm-overlap/--no-ep-comm-overlap", default=None,
              help="Pin a mixture of experts' all-to-alls overlapped with another micro-batch "
                   "(Megatron's combined 1F1B: only plans where it runs, ep > 1 without full "
                   "recompute, pp 1 or interleaved, are searched), or not (default: on wherever "
                   "Megatron runs it).")
@click.option("--no-gradient-accumulation-fusion", "grad_accumulation_fusion", flag_value=False,
              default=True,
              help="Every plan without Megatron-Core's gradient accumulation fusion: each "
                   "micro-batch's weight gradients added into the main gradients apart (ZeRO 0-2 "
                   "searched).")
@click.option("--tp-backward", type=choice(TpBackward), default=None,
              help="Every plan's tensor-parallel backward: megatron (Megatron-Core, Transformer "
                   "Engine) or dtensor (torch DTensor, torchtitan); the stack's, not searched. "
                   "Default: by --kernels (fused: megatron).")
@click.option("--ep-dispatcher", type=choice(EPDispatcher), default=EPDispatcher.ALLTOALL.value,
              show_default=True,
              help="Every plan's experts' dispatcher: alltoall (NCCL) or deepep (DeepEP/"
                   "HybridEP); the stack's, not searched.")
@click.option("--cross-entropy", type=choice(CrossEntropy),
              default=CrossEntropy.UNFUSED.value, show_default=True,
              help="Every plan's loss kernel: unfused (fp32 logits), no-upcast (the bf16 "
                   "logits as they are), torch (PyTorch's on fp32 logits), te (Transformer "
                   "Engine's fused cross entropy), native (Megatron-Core's native fusion) or "
                   "flash-attn (flash-attn's fused cross entropy); the stack's, not searched.")
@click.option("--optimizer-kernels", type=choice(OptimizerKernels),
              default=OptimizerKernels.FUSED.value, show_default=True,
              help="Every plan's AdamW step: fused (one kernel) or foreach (torch's "
                   "multi-tensor passes); the job's, not searched.")
@click.option("--expert-weighting", type=choice(ExpertWeighting),
              default=ExpertWeighting.ACTIVATION.value, show_default=True,
              help="Every plan's experts' routing weights: in their activation (Megatron-Core) "
                   "or on their outputs (torchtitan); the stack's, not searched.")
@click.option("--stack", type=choice(Stack), default=Stack.EAGER.value, show_default=True,
              help="How the framework runs the layers: eager, compiled or cuda-graphs.")
@click.option("--expandable-segments", is_flag=True,
              help="Every plan's job runs PyTorch's allocator with expandable segments "
                   "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): no fragmentation margin "
                   "counted; the job's, not searched.")
@click.option("--kernels", type=choice(Kernels), default=None,
              help="Every plan's element-wise kernels: fused (Megatron-Core / TE), eager (op "
                   "by op) or compiled (Inductor); default: compiled with --stack compiled, "
                   "else fused.")
@click.option("--norm", type=choice(NORMS), default="local", show_default=True,
              help="Layer graphs: the normalization to keep (batch norm local or synchronized, "
                   "group norm).")
@click.option("--contributors", type=CONTRIBUTORS, default=None,
              help="Layer graphs: collectives of layers with fewer units than Pr, as in predict "
                   "(default: auto, the cheaper per call).")
@click.option("--memory-margin", type=FiniteFloat(0.0, 1.0, max_open=True),
              default=DEFAULT_MEMORY_MARGIN, show_default=True,
              help="Fraction of each GPU's memory a plan leaves free, beyond the hardware's "
                   "reserved memory: for what the model does not count, the caching allocator's "
                   "fragmentation (9.2 GB per 80 GB A100 on average, GMLake, ASPLOS 2024) and "
                   "NCCL's buffers. 0 lets a plan fill the memory.")
@click.option("--objective", type=choice(Objective), default=None,
              help="Default: step_time (time_to_train with --tokens, cost with --gpu-hour-price).")
@click.option("--tokens", type=FiniteFloat(*TOKEN_BUDGET, why=BUDGET_WHY), default=None,
              help="Token budget to train (for time_to_train / cost).")
@click.option("--gpu-hour-price", type=FiniteFloat(*GPU_HOUR_PRICE, why=BUDGET_WHY),
              default=None,
              help="Price of one GPU-hour (for cost), in any currency.")
@click.option("--top", type=IntRange(1, 100), default=5, show_default=True,
              help="How many plans to print.")
@click.option("--what-if", "what_if", multiple=True,
              help="Change the hardware and search again, e.g. "
                   "inter_node.bandwidth_bytes_per_s=2x (a factor), =400e9 (a value), "
                   "asynchronous_device=false (a yes-or-no field).")
@click.option("--sensitivities", is_flag=True,
              help="Elasticity of the best plan's step time to each hardware parameter (central "
                   "differences of its compiled formula, each parameter moved as --what-if moves "
                   "it; at a kink, the mean of the two sides).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--csv", "csv_path", type=click.Path(), default=None,
              help="Write every plan the search enumerates here, one per row, as the search "
                   "goes; a plan whose model states alone exceed the memory has evaluated=False "
                   "and no step time.")
@click.option("--plot", "plot_path", type=click.Path(), default=None,
              help="Time-memory Pareto front (PNG, SVG or PDF, by the suffix).")
@click.option("--html", "html_path", type=click.Path(), default=None,
              help="Write a self-contained HTML report (best plans, breakdown, memory, timeline, "
                   "runner-up, Pareto front).")
@click.option("--validate", is_flag=True,
              help="Run the best plan through `perfmodel validate` (scaled down).")
@click.option("--validate-profile", type=click.Path(), default=None,
              help="The calibrated profile of this machine, for --validate's prediction.")
def recommend(model: str | None, from_config: str | None,
              emit_config: tuple[str, str] | None, hardware: str | None, profile: str | None,
              gpus: str | None, global_batch: int | None,
              dtype: str | None, seq_len: int | None, norm: str, contributors: str | None, top: int,
              what_if: tuple[str, ...],
              sensitivities: bool,
              as_json: bool, csv_path: str | None, plot_path: str | None,
              html_path: str | None, validate: bool, validate_profile: str | None,
              **pins: Any) -> None:
    """Search every layout for the fastest plan that fits, and say why it wins."""
    from perfmodel.recommend import apply_what_if
    from perfmodel.recommend import recommend as run
    from perfmodel.recommend import sensitivities as sens
    from perfmodel.search import SearchRequest
    from perfmodel.specs.model import load_model

    if validate:  # refused before the search, not after it
        from perfmodel.extras import require_torch

        require_torch("recommend --validate")
        if pins.get("cpu_offload_layers"):
            raise click.UsageError("--validate runs the validation job, which offloads no "
                                   "activations: leave --cpu-offload-layers out")
    hw = resolve_hardware(hardware, profile)
    job = None
    if from_config:
        spec, gpus, global_batch, dtype, job = _config_pins(from_config, model, seq_len, gpus,
                                                            global_batch, dtype, pins)
    else:
        if not model:
            raise click.UsageError("give --model (or --from-config)")
        spec = noted_seq_len(load_model(model, seq_len=seq_len), seq_len, model)
    if gpus is None or global_batch is None:
        raise click.UsageError(f"give {'--gpus' if gpus is None else '--global-batch'}")
    asked = dict(pins)  # the search the user asked for, before --emit-config narrows it
    if emit_config:  # every framework written is 1d; DeepSpeed's Trainer data parallel only
        pins["tp_layout"] = pins.get("tp_layout") or "1d"
        if emit_config[0] == "deepspeed":
            pins["tp"] = pins.get("tp") or 1
            pins["pp"] = pins.get("pp") or 1
        # what each framework runs (perfmodel.configs' emitters refuse the rest)
        pins["zero_stages"] = {"megatron": (0, 1, 3), "torchtitan": (0, 3)}.get(
            emit_config[0], (0, 1, 2, 3))
        if emit_config[0] == "deepspeed":  # ZeRO 1-2 gather in the optimizer step
            pins["param_gather_stages"] = (3,)
        if emit_config[0] == "torchtitan":  # its DDP runs alone
            pins["ddp_alone"] = True
        if emit_config[0] == "deepspeed" and str(pins.get("dtype") or "bf16") == "bf16":
            # DeepSpeed runs bf16 without ZeRO with its BF16_Optimizer (never searched)
            pins["zero_stages"] = (1, 2, 3)
        if emit_config[0] == "megatron" and pins.get("fp8_params"):
            # Megatron-LM's ZeRO 3 is torch FSDP2, beside which it gathers bf16 (the emitter
            # refuses FP8 weights there): the distributed optimizer's stages
            pins["zero_stages"] = (0, 1)
        if emit_config[0] == "megatron":
            pins["schedules"] = ("1f1b", "interleaved")
        if emit_config[0] != "megatron":  # Megatron-Core's combined 1F1B only
            pins["ep_comm_overlap"] = False
        if emit_config[0] == "torchtitan":  # FSDP2 and DDP overlap the sync with the backward
            pins["overlap_grad_sync"] = True
            if pins.get("stack") != "compiled" and pins.get("tp_comm_overlap") is None:
                pins["tp_comm_overlap"] = False  # its async TP needs torch.compile
            if pins.get("kernels") is None:  # its modules' own ops, op by op or compiled
                pins["kernels"] = "compiled" if pins.get("stack") == "compiled" else "eager"
            pins["expert_weighting"] = "output"  # as its reader reads it back
        if emit_config[0] != "megatron" and pins.get("cpu_offload_layers"):
            raise PlanError(f"--emit-config {emit_config[0]} writes no activation offloading "
                            "(Megatron-LM's does): leave --cpu-offload-layers out")
        if pins.get("dp_bucket_size") is not None and emit_config[0] != "megatron" \
                or pins.get("dp_bucketing") not in (None, "megatron"):
            # (torchtitan's FSDP2 and DDP: no bucket size of Megatron-Core's to write)
            raise PlanError(f"--emit-config {emit_config[0]} writes Megatron-Core's buckets "
                            "(--ddp-bucket-size) only: leave --dp-bucketing at megatron"
                            + (", and --dp-bucket-size out" if emit_config[0] != "megatron"
                               else ""))
        if emit_config[0] == "megatron" and pins.get("kernels") is None:
            pins["kernels"] = "fused"
        if emit_config[0] == "megatron" and pins.get("overlap_grad_sync") is False \
                and pins.get("overlap_param_gather") is None:
            # Megatron-LM asserts --overlap-param-gather beside --overlap-grad-reduce only
            pins["overlap_param_gather"] = False
        if emit_config[0] == "torchtitan" and not pins.get("placement"):
            # torchtitan's mesh orders the ranks tp, (cp,) dp, pp (its emitter refuses others)
            pins["placement"] = "tp,cp,dp,pp" if (pins.get("cp") or 1) > 1 else "tp,dp,pp"
        pins["recomputes"] = {"megatron": ("none", "selective", "full"),
                              "torchtitan": ("none", "full", "op")}.get(emit_config[0],
                                                                         ("none", "full"))
        # torchtitan's writer writes context parallelism, not expert parallelism (its llama3
        # flavors have no experts); DeepSpeed's neither (Megatron-LM's writes both)
        if emit_config[0] == "torchtitan" and (pins.get("cp") or 1) > 1:
            pins["placement"] = pins.get("placement") or "tp,cp,dp,pp"  # its mesh's order
        elif emit_config[0] == "torchtitan":
            pins["cp"] = 1  # a searched cp could place its ranks where torchtitan does not
        if emit_config[0] != "megatron":
            for key in ("ep", "etp") if emit_config[0] == "torchtitan" else ("cp", "ep", "etp"):
                if pins.get(key) not in (None, 1):
                    raise PlanError(f"--emit-config {emit_config[0]} writes no {key} yet: "
                                    f"leave --{key} out")
                pins[key] = 1
        elif getattr(spec, "experts", 0):  # Megatron-LM's FSDP2
            # path is not written with experts
            pins["zero_stages"] = (0, 1)
        # a pin the framework written cannot run: refused naming it, not searched into "no plan"
        # (a plan error, as the pins the writer refuses are, --stack and --placement: options
        # that do not combine)
        for pin, allowed in (("schedule", pins.get("schedules")),
                             ("recompute", pins.get("recomputes")),
                             ("zero", pins.get("zero_stages"))):
            value = pins.get(pin)
            value = getattr(value, "value", value)
            if value is not None and allowed is not None and value not in allowed:
                raise PlanError(f"--{pin} {value}: --emit-config {emit_config[0]} writes "
                                f"{pin} {', '.join(str(a) for a in allowed)}; leave one out")
    # the request's fields --emit-config set (a flag's own value kept by the user's search)
    narrowing = [k for k, v in pins.items() if asked.get(k) != v and v is not None]
    gpu_counts = _gpu_counts(gpus)
    if any(not 1 <= g <= MAX_DEGREE for g in gpu_counts):
        # a plan error, as a pinned degree's (FieldRange)
        raise PlanError(f"--gpus must be between 1 and {MAX_DEGREE:g}, got '{gpus}'")
    if getattr(spec, "kind", "") == "layers":
        if pins.get("fp8_recipe") or pins.get("fp8_output_layer") or pins.get("fp8_params"):
            raise click.UsageError("--fp8-recipe, --fp8-output-layer and --fp8-params apply to "
                                   "transformers trained in fp8 (--dtype fp8)")
        pinned = _transformer_options_given()
        if pinned:
            raise click.UsageError(f"{', '.join(pinned)}: a transformer's degrees and options; "
                                   "a layer graph's search is over its Pr x Pc grids")
        if html_path:
            raise click.UsageError("--html reports transformer plans; a layer graph takes --json")
        if validate or validate_profile:
            raise click.UsageError("--validate and --validate-profile run a transformer's "
                                   "plan; validate a layer graph's with perfmodel validate "
                                   "--pr N --pc M")
        ctx = click.get_current_context()
        # what the layer graph's search (every Pr x Pc grid, by step time) has no use for
        unread = [f"--{n.replace('_path', '').replace('_', '-')}" for n in (
            "csv_path", "plot_path", "emit_config", "what_if", "sensitivities", "tokens",
            "gpu_hour_price", "objective", "memory_margin", "max_tp", "max_pp", "max_cp",
            "max_micro_batch") if n in ctx.params and _given(ctx, n)]
        if unread:
            raise click.UsageError(f"{', '.join(unread)}: a transformer search's; a layer "
                                   "graph's search ranks its Pr x Pc grids by step time (--json "
                                   "for the table)")
        # as predict refuses them, over every split the search ranks (it ranks both variants)
        refuse_idle_graph_options(_flags_given(ctx), spec, norm, "fused",
                                  contributors or "auto", grid_splits(gpu_counts),
                                  f"Pr x Pc split of {', '.join(map(str, gpu_counts))} GPUs")
        from perfmodel.encode import check_whole_nodes

        for count in gpu_counts:
            check_whole_nodes(hw, count)
        _recommend_grid(spec, hw, gpu_counts, global_batch, dtype or "fp32", top, as_json, norm,
                        contributors or "auto")
        return
    _refuse_graph_options()
    spec.require_costed()
    recompute = pins.get("recompute")
    ctx = click.get_current_context()
    from perfmodel.idle import refuse_idle_recompute

    refuse_idle_recompute(_flags_given(ctx), str(recompute) if recompute else None)
    _refuse_idle_pins(pins, gpu_counts, getattr(spec, "experts", 0))
    pins["flash_attention"] = attention_option(pins)
    objective = pins.pop("objective") or ("cost" if pins.get("gpu_hour_price") else
                                          "time_to_train" if pins.get("tokens") else "step_time")
    req = SearchRequest(gpus=gpu_counts, global_batch=global_batch,
                        dtype=parse_option(Dtype, dtype or hw.default_dtype(), "dtype"),
                        objective=parse_option(Objective, objective, "objective"), **pins)
    from perfmodel.files import atomic_file
    from perfmodel.predict import parameter_count
    from perfmodel.recommend import PlanCsv, shared_columns

    changed = hw  # the hardware of --what-if, refused (a typo, a stack it cannot run) first
    fields = [change.partition("=")[0].strip() for change in what_if]
    twice = next((f for i, f in enumerate(fields) if f in fields[:i]), None)
    if twice is not None:  # 2x then 3x would compound to 6x unsaid: one change a field, as --vary
        raise click.UsageError(f"--what-if {twice} is given twice: give each field one change "
                               "(a factor or a value)")
    for change in what_if:
        try:
            changed = apply_what_if(changed, change)
        except PlanError as exc:  # the flag's value itself: a usage error, as --vary's
            if _what_if_malformed(changed, change):
                raise click.UsageError(str(exc)) from None
            raise
    if what_if:
        from perfmodel.encode import check_stack, check_whole_nodes

        try:
            check_stack(changed, req.stack)
            for count in req.gpus:  # a node the what-if resizes: before the search, named
                check_whole_nodes(changed, count)
        except PlanError as exc:
            raise PlanError(f"--what-if {' '.join(what_if)}: {exc}") from None
    # what the search's end writes or reads, refused before the search (and before the CSV)
    check_outputs((plot_path, "plot"), (html_path, "HTML report"), (csv_path, "plans CSV"))
    if emit_config:  # its files are written into the directory, made where missing
        from perfmodel.configs.emit import check_emitted

        check_output_directory(Path(emit_config[1]), "--emit-config")
        check_emitted(emit_config[0], emit_config[1], input_files())
    if validate_profile and not validate:
        raise click.UsageError("--validate-profile is the profile of --validate's local run: "
                               "give --validate too, or leave it out")
    if validate_profile:
        resolve_hardware(None, validate_profile)

    with contextlib.ExitStack() as stack:  # the CSV is written as the search goes, whole or not
        csv_file = stack.enter_context(atomic_file(csv_path, what="plans CSV")) if csv_path \
            else None
        # the plans a lower bound on their step time ranks below the best are skipped unless the
        # answer shows every evaluated plan (the CSV, the Pareto plot, the HTML report)
        rec = run(spec, hw, req, top=top,
                  on_chunk=PlanCsv(csv_file, shared_columns(req, spec, hw),
                                   experts=bool(spec.experts)) if csv_file
                  else None,
                  prune=not (csv_file or plot_path or html_path))
    if rec.top:  # (none: the answer is a refusal)
        release_held()
    parameters = parameter_count(spec, hw, req.dtype)
    data = {"model": spec.name, "parameters": parameters,
            "active_parameters": active_parameters(spec, parameters),
            "mtp_parameters": mtp_parameters(spec), **model_summary(spec), **rec.to_dict()}
    if rec.top and sensitivities:
        data["sensitivities"] = sens(spec, hw, rec.top[0].plan)
    if what_if:
        alt = run(spec, changed, req, top=1, prune=True)
        data["what_if"] = {"changes": list(what_if),
                           "best": alt.to_dict()["plans"][0] if alt.top else None,
                           "speedup": (rec.top[0].step_time_s / alt.top[0].step_time_s)
                           if rec.top and alt.top else None}
    if job is not None:
        data["config"] = job.to_dict()
    narrowed = _emit_scope({k: pins[k] for k in narrowing}) if emit_config else ""
    if emit_config and rec.top:
        from perfmodel.configs.emit import emit_best
        from perfmodel.recommend import best_of

        rank, written = emit_best(emit_config[0], emit_config[1], spec, hw, rec.top)
        data["emitted"] = {"format": emit_config[0], "plan_rank": rank,
                           "files": [str(p) for p in written], "searched": narrowed,
                           "fastest_of_any_framework": None}
        click.echo(f"wrote plan {rank} as {emit_config[0]}'s config: "
                   f"{', '.join(map(str, written))}", err=True)
        # what the narrowing cost: the best plan of the search the user asked for
        import dataclasses

        anywhere = best_of(spec, hw, dataclasses.replace(req, **{
            k: asked.get(k, SearchRequest.__dataclass_fields__[k].default) for k in narrowing}))
        written_objective = float(rec.result.best.objective[rank - 1])
        if anywhere is not None and anywhere["objective"] < written_objective * (1 - 1e-9):
            data["emitted"]["fastest_of_any_framework"] = anywhere
            click.echo(f"note: --emit-config {emit_config[0]} searched the plans it writes "
                       f"({narrowed}); the best plan of the whole search, {anywhere['plan']}, "
                       f"takes {anywhere['step_time_s']:.4g} s a step against "
                       f"{rec.top[rank - 1].step_time_s:.4g} s", err=True)
    require_finite(data, "the recommendation", f"{spec.name} on {hw.name}, {gpus} GPUs, "
                   f"global batch {global_batch}")
    if plot_path:
        from perfmodel.plot import pareto_plot

        pareto_plot(rec.result, Path(plot_path))
    if html_path:
        from perfmodel.htmlreport import recommendation_html, write_html

        write_html(html_path, recommendation_html(rec, data))
    if validate and rec.top:
        local_hw = resolve_hardware(None, validate_profile) if validate_profile else hw
        if not validate_profile:
            click.echo("note: --validate without --validate-profile predicts the local run with "
                       "the GPU hardware; calibrate this machine (perfmodel calibrate run) for a "
                       "fair comparison", err=True)
        report = _validate_best(spec, local_hw, rec.top[0].plan)
        data["validation"] = {k: report.get(k) for k in (
            "predicted_step_time_s", "measured_step_time_s", "relative_error", "ranks", "backend",
            "status", "scaled_from", "plan", "caveats")}
    if as_json:
        click.echo(json_text(document("recommend", data), default=float))
    else:
        from perfmodel.render import print_recommendation

        print_recommendation(rec, data)
    if not rec.top:
        reason = rec.explanation.get("infeasible", {}).get("reason", "no plan fits")
        if emit_config:
            reason = (f"--emit-config {emit_config[0]} searches the plans it writes "
                      f"({narrowed}): {reason}")
        click.echo(f"error: {reason}", err=True)
        sys.exit(4)


def check_output_directory(directory: Path, option: str) -> None:
    """A directory files are written into (recommend --emit-config DIR, validate --emit DIR),
    made where missing: refused (OutputError, exit 7) before any work, as every output path is,
    where it is there and no directory (a file, a FIFO, /dev/null), or where a dangling symbolic
    link lies on it (no directory can be made where the link is, nor through it)."""
    try:
        _check_output_directory(directory, option)
    except OSError as exc:  # EACCES under a directory without search permission, ENAMETOOLONG
        raise OutputError(f"{option}: cannot create the directory {directory}: "
                          f"{exc.strerror or exc}") from None


def _check_output_directory(directory: Path, option: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{option}: {directory} is not a directory")
    for path in (directory, *directory.parents):
        if path.is_symlink() and not path.exists():
            raise OutputError(f"{option}: cannot create the directory {directory}: {path} is a "
                              f"dangling symbolic link (to {os.readlink(path)}, which does not "
                              "exist); remove it or give another directory")


def _what_if_malformed(hardware: Any, change: str) -> bool:
    """Whether a --what-if change is malformed as a flag value: not FIELD=VALUE or
    FIELD=FACTORx, a field the hardware has no number or yes-or-no of (a typo, a group of
    fields, a link a fabric's levels replace), or a value of the wrong kind (not a number, a
    number or factor for a yes-or-no field, true or false for a number, a value for a mapping,
    not finite): a usage error (exit 2), as sweep's --vary FIELD=... is. What a well-formed
    change does to the hardware is the hardware's (a factor on a field that is 0 or unset: a
    plan error; a value out of its physical range: a spec error)."""
    field, equals, given = (part.strip() for part in change.partition("="))
    given = given.lower()
    factor = given.endswith("x")
    text = given[:-1].strip() if factor else given
    data = hardware.to_dict()
    if data.get("levels"):  # a fabric's levels replace the two links (apply_what_if)
        for key in ("intra_node", "inter_node", "gpus_per_node"):
            data.pop(key, None)
    node: Any = data
    for key in field.split("."):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return True
    if not equals:
        return True
    if isinstance(node, bool):
        return given not in ("true", "false")
    try:
        if given in ("true", "false") or not ascii_number(text) \
                or not math.isfinite(float(text)):
            return True
    except ValueError:
        return True
    if isinstance(node, dict):  # numbers by key (peak_flops_per_s by dtype): a factor
        return not (factor and node and all(isinstance(v, (int, float))
                                            and not isinstance(v, bool)
                                            for v in node.values()))
    return node is not None and not isinstance(node, (int, float))


def _emit_scope(pins: dict[str, Any]) -> str:
    """The pins --emit-config added to the search, in words: 'tp 1, pp 1, zero 1/2/3, ...'."""
    from perfmodel.recommend import said

    names = {"zero_stages": "zero", "schedules": "schedule", "recomputes": "recompute",
             "param_gather_stages": "parameter gather overlapped with zero",
             "ddp_alone": "zero 0 only without tp and pp"}
    return ", ".join(names[k] if k == "ddp_alone" else f"{names.get(k, k)} {said(v)}"
                     for k, v in pins.items())


def _gpu_counts(text: str) -> tuple[int, ...]:
    """recommend's --gpus: whole numbers in ASCII digits separated by commas (int() reads '8_0'
    as 80 and a full-width '８' as 8: refused, as an empty item is)."""
    items = [g.strip() for g in text.split(",")]
    # a negative count is a whole number out of range (exit 4, as 0 is), not malformed
    if not all(g.isascii() and g.removeprefix("-").isdigit() for g in items):
        raise click.UsageError(
            f"--gpus must be whole numbers separated by commas (ASCII digits, no empty item), "
            f"got '{text}'")
    return tuple(int(g) for g in items)


# the plan fields a config may pin in recommend's search (perfmodel.search.SearchRequest)
CONFIG_PINS = ("tp", "pp", "cp", "cp_comm", "ep", "etp", "micro_batch", "schedule",
               "virtual_stages", "recompute", "sequence_parallel", "zero", "placement", "tp_layout")
# what a config states for every plan (not searched): kept as the config says, and a command-line
# value that contradicts it refused as the pins' are
CONFIG_WIDE = ("stack", "kernels", "recompute_every", "recompute_method",
               "recompute_num_layers", "cpu_offload_layers", "dp_bucket_size", "dp_bucketing",
               "attention_kernel", "grad_dtype", "optimizer_dtype",
               "master_weights", "fp8_recipe", "ep_dispatcher", "cross_entropy",
               "optimizer_kernels", "expert_weighting")
CONFIG_FLAGS = ("flash_attention", "overlap_grad_sync", "overlap_param_gather", "tp_comm_overlap",
                "ep_comm_overlap", "fp8_params", "fp8_output_layer", "expandable_segments")


def _config_pins(path: str, model: str | None, seq_len: int | None, gpus: str | None,
                 global_batch: int | None, dtype: str | None, pins: dict[str, Any]
                 ) -> tuple[Any, str, int | None, str | None, Any]:
    """recommend --from-config: the model, world size, global batch and dtype of the config, and
    its stated plan choices as pins (in `pins`; a pin given on the command line too must agree).
    What the config leaves open stays searched. Returns (model, gpus, global batch, dtype, job)."""
    from perfmodel.configs import pad_vocab, read_config, resolve_model, resolve_plan

    job = read_config(path)
    spec = resolve_model(job, model, seq_len)
    spec.require_costed()
    counts = list(_gpu_counts(gpus)) if gpus else []
    if len(counts) > 1:
        raise click.UsageError("--from-config takes one --gpus (the job's world size)")
    # an option at its default (--stack eager, --recompute-every 1) is no choice made
    defaults = {param.name: param.default for param in recommend.params}
    given = {"gpus": counts[0] if counts else None,
             **{k: pins[k] for k in CONFIG_PINS + CONFIG_WIDE + CONFIG_FLAGS
                if pins.get(k) is not None and pins[k] != defaults.get(k)}}
    if global_batch is not None:
        given["global_batch"] = global_batch
    if dtype is not None:
        given["dtype"] = dtype
    _, plan = resolve_plan(job, spec, given)
    for key in CONFIG_PINS:
        if key in job.pins:
            pins[key] = plan[key]
    for key in CONFIG_FLAGS:
        if key in plan:
            pins[key] = bool(plan[key]) or bool(pins.get(key))
    if plan.get("grad_accumulation_fusion") is False:  # the config's, for every plan searched
        pins["grad_accumulation_fusion"] = False
    if plan.get("flash_attention") is False:  # the config attends unfused: so do its plans
        if pins.get("attention") == "flash" or pins.get("attention_kernel"):
            raise click.UsageError(f"{path} attends unfused: --attention flash and "
                                   "--attention-kernel contradict it")
        pins["attention"] = "unfused"
    for key in CONFIG_WIDE:
        if plan.get(key) is not None:
            pins[key] = plan[key]
    uneven = {k: plan[k] for k in ("first_stage_layers", "last_stage_layers", "pipeline_layout",
                                   "recompute_modules", "pipeline_micro_batches")
              if plan.get(k)}
    if uneven:
        raise PlanError(f"{path}: {', '.join(f'{k} {v}' for k, v in uneven.items())}: recommend "
                        "searches even pipeline splits, one pipeline schedule a step and the "
                        "default selective recompute; predict --from-config takes this one")
    if plan.get("fsdp_reshard", "forward") != "forward":  # never searched (Plan.fsdp_reshard)
        step = plan["fsdp_reshard"] == "step"  # (which defers the reduction too)
        job.notes.append(f"fsdp_reshard {plan['fsdp_reshard']}: the config keeps FSDP's units "
                         "gathered longer" + (" and defers their reduction" if step else "")
                         + "; recommend searches them gathered again for each backward"
                         + (" and reduced in every micro-batch" if step else "")
                         + ", predict --from-config takes the config's")
    if plan.get("defer_grad_sync"):  # never searched (Plan.defer_grad_sync)
        job.notes.append("defer_grad_sync: the config defers FSDP's reduction to the last "
                         "micro-batch; recommend searches a reduction in every micro-batch, "
                         "predict --from-config takes the config's")
    if plan.get("bf16_optimizer"):  # never searched (Plan.bf16_optimizer)
        job.notes.append("bf16_optimizer: the config runs DeepSpeed's BF16_Optimizer; recommend "
                         "searches Megatron's gradient buffers and distributed optimizer, "
                         "predict --from-config takes the config's")
    if plan.get("pp_scatter_gather"):  # never searched (Plan.pp_scatter_gather)
        job.notes.append("pp_scatter_gather: the config's pipeline sends are scatter-gathered "
                         "over tp; recommend searches whole sends (Megatron-Core's), predict "
                         "--from-config takes the config's")
    if "tp" in job.pins:
        spec = pad_vocab(job, spec, int(plan["tp"]))
    elif job.vocab_multiple:
        job.notes.append(f"tp is searched: the model keeps vocab {spec.vocab} (Megatron-LM pads "
                         f"it to a multiple of {job.vocab_multiple} x tp)")
    batch = plan["global_batch"] if "global_batch" in job.pins or global_batch else None
    if batch is None:
        raise click.UsageError(f"{path} gives no global batch: give --global-batch")
    searched = [k for k in CONFIG_PINS if k not in job.pins and pins.get(k) is None]
    if plan.get("cpu_offload_layers") or pins.get("cpu_offload_layers"):
        searched = [k for k in searched if k not in ("pp", "recompute")]  # pp 1, none: offload
    if (plan.get("cp") if "cp" in job.pins else pins.get("cp")) == 1:
        searched = [k for k in searched if k != "cp_comm"]  # (idle without context parallelism)
    job.notes.append("recommend pins the config's "
                     f"{', '.join(f'{k} {plan[k]}' for k in CONFIG_PINS if k in job.pins)}; "
                     f"searches {', '.join(searched) or 'nothing else'}")
    print_job(job)
    return spec, str(plan["gpus"]), batch, plan.get("dtype", dtype), job


def _evaluated_csv(frame: Any, model: Any, hardware: Any) -> str:
    """recommend --csv: every evaluated plan. The search leaves the step time of a plan that does
    not fit in memory infinite (never ranked): an empty cell here; a plan that fits is finite."""
    import numpy as np

    fits = frame["fits_in_memory"].astype(bool)
    require_finite(frame[fits], "an evaluated plan", f"{model.name} on {hardware.name}")
    text: str = frame.replace([np.inf, -np.inf], np.nan).to_csv(index=False)
    return text


def _recommend_grid(model: Any, hardware: Any, gpu_counts: tuple[int, ...], global_batch: int,
                    dtype: str, top: int, as_json: bool, norm: str,
                    contributors: str = "auto") -> None:
    """A layer graph: every Pr x Pc split of every GPU count and both collective variants, fastest
    first (the normalization changes accuracy, not only speed: it is the user's choice)."""
    import time

    from perfmodel.layerwise import best_grid

    start = time.perf_counter()
    results = []
    for gpus in gpu_counts:
        for variant in ("fused", "split"):  # split only where there is model parallelism
            results += [r for r in best_grid(model, hardware, gpus, global_batch, norm=norm,
                                             variant=variant, contributors=contributors,
                                             dtype=dtype)
                        if variant == "fused" or r.plan.pr > 1]
    results.sort(key=lambda r: r.step_time_s)
    feasible = [r for r in results if r.fits_in_memory]
    elapsed = time.perf_counter() - start
    if as_json:
        click.echo(json_text(document("recommend.grid", {
            "plans": [r.to_dict() for r in feasible[:top]], "evaluated": len(results),
            "feasible": len(feasible), "search_time_s": elapsed})))
    else:
        from perfmodel.render import print_grid_recommendation

        print_grid_recommendation(feasible[:top], len(results), elapsed)
    if not feasible:
        sys.exit(4)


def _validate_best(model: Any, hardware: Any, plan: Any) -> dict[str, Any]:
    """Hand the best plan to the validation package (scaled down to this machine), found through
    the `perfmodel.hooks` entry point so that perfmodel does not import it."""
    from importlib.metadata import entry_points

    hooks = {ep.name: ep for ep in entry_points(group="perfmodel.hooks")}
    if "validate_scaled" not in hooks:
        raise click.ClickException("--validate needs the validation package (pip install -e .)")
    validate_scaled = hooks["validate_scaled"].load()  # torch: recommend checked it is here
    report: dict[str, Any] = validate_scaled(model, hardware, plan)
    return report


@cli.command()
@click.option("--op", required=True, type=choice(COLLECTIVE_OPS),
              help="The collective (nccl-tests' names).")
@click.option("--bytes", "nbytes", required=True,
              help="Size in nccl-tests' convention, e.g. 1e9, 256MiB, 64KB.")
@click.option("--ranks", required=True, type=INT, help="Ranks in the group.")
@click.option("--ranks-per-node", type=INT, default=None,
              help="Ranks of the group per node (default: GPUs per node).")
@click.option("--hardware", default=None, help="Hardware preset or file.")
@click.option("--profile", default=None, type=click.Path(),
              help="Calibrated profile.")
@click.option("--algorithm", type=choice(COLLECTIVE_ALGORITHMS), default="auto", show_default=True,
              help="The algorithm (NCCL_ALGO); auto: the cheapest the hardware's library has.")
@click.option("--protocol", type=choice(("auto", "simple", *LINK_PROTOCOLS)), default="auto",
              show_default=True,
              help="The protocol (NCCL_PROTO); auto: the cheapest the hardware's links have.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def collective(op: str, nbytes: str, ranks: int, ranks_per_node: int | None, hardware: str | None,
               profile: str | None, algorithm: str, protocol: str, as_json: bool) -> None:
    """Predicted time, algorithm, protocol and bus bandwidth of one collective (its device time,
    from the call's start to its end)."""
    from perfmodel.collective import parse_bytes, predict_collective

    hw = resolve_hardware(hardware, profile)
    result = predict_collective(op, parse_bytes(nbytes), ranks, hw, ranks_per_node, algorithm,
                                protocol)
    notes = _collective_command_notes(profile, result)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if as_json:
        click.echo(json_text(document("collective", {**result, "extrapolations": notes})))
    else:
        from perfmodel.render import print_collective

        print_collective(result)


def _collective_command_notes(profile: str | None, result: dict[str, Any]) -> list[str]:
    """`collective --profile`: its collective outside the sizes or rank counts the profile's fit
    measured, or of an op and scope it has no fit of (as predict notes a plan's). One rank moves
    nothing (0 s, whatever the fits): no note."""
    if not profile or result["ranks"] <= 1:
        return []
    from perfmodel.specs import profile as profiles

    prof = profiles.load_profile(Path(profile))
    if not prof.collective_fits():  # e.g. a GEMM-only profile: the collectives are the preset's
        return []
    scope = "intra" if result["scope"] == "intra" else "inter"
    what = f"{result['op']} ({fmt_bytes(result['bytes'])}, {scope}-node)"
    per_node = result.get("ranks_per_node")
    nodes = -(-result["ranks"] // per_node) if per_node else None
    return profiles.collective_notes(prof, what, result["op"], result["bytes"], result["ranks"],
                                     scope, nodes)


# the hardware fields a layer graph's step time reads (perfmodel.layerwise: its GEMMs at the
# dtype's peak, its element-wise passes and optimizer at the memory bandwidth, its collectives on
# the links or fabric levels); the others (host and kernel overheads, attention kernels, memory
# capacity and reserves: sweep prints no memory) would give identical rows
_GRAPH_FIELDS = ("memory_bandwidth_bytes_per_s", "memory_bandwidth_efficiency",
                 "sustained_clock_fraction")
_GRAPH_NODE_FIELDS = ("gpus_per_node",)  # a spec with fabric levels: its first level's gpus
_GRAPH_LINK_FIELDS = ("bandwidth_bytes_per_s", "efficiency", "latency_s", "call_latency_s")
_GRAPH_NODE_LINK_FIELDS = ("nvls_bandwidth_fraction", "nvls_latency_s")  # the node's link's
_GRAPH_LEVEL_FIELDS = ("oversubscription",)  # a fabric level's above the node
# the plan's fields a sweep varies (the others are the hardware's)
_SWEEP_PLAN_FIELDS = ("gpus", "global_batch")
# sweep's --vary fields in words, from the lists graph_fields builds them from (of those, what the
# hardware spec has: its fabric levels or its two links)
VARY_HELP = ("FIELD=V1,V2,...: " + ", ".join(_SWEEP_PLAN_FIELDS) + ", peak_flops_per_s (one "
             "GPU's peak FLOP/s, every dtype's scaled), peak_flops_per_s.DTYPE (--dtype's), "
             + ", ".join(_GRAPH_FIELDS) + ", " + ", ".join(_GRAPH_NODE_FIELDS) + " (without "
             "fabric levels); of each link "
             "(intra_node, inter_node) or fabric level (levels.0, levels.1, ...): "
             + ", ".join(_GRAPH_LINK_FIELDS) + "; of the node's (intra_node, levels.0): "
             + ", ".join(_GRAPH_NODE_LINK_FIELDS) + "; of a level above it: "
             + ", ".join(_GRAPH_LEVEL_FIELDS) + ". Repeatable.")


@cli.command()
@click.option("--model", required=True,
              help="A layer-graph model: alexnet, vgg16, resnet50, mlp or a file.")
@click.option("--hardware", default=None, help="Hardware preset or file.")
@click.option("--profile", default=None, type=click.Path(),
              help="Calibrated profile.")
@click.option("--gpus", type=plan_whole(), default=None,
              help="GPU count (unless --vary gpus gives them).")
@click.option("--global-batch", type=plan_whole(), default=None,
              help="Global batch [samples] (unless --vary global_batch gives them).")
@click.option("--pr", type=plan_whole(), default=1, show_default=True,
              help="Ranks splitting each layer.")
@click.option("--best-pr", is_flag=True,
              help="For every point, take the fastest Pr x Pc split instead.")
@click.option("--norm", type=choice(NORMS), default="local",
              show_default=True, help="Batch norm local to a rank, synchronized, or group norm.")
@click.option("--collective-variant", type=choice(VARIANTS), default="fused",
              show_default=True, help="Allgather/Allreduce, or Gather+Bcast / Reduce+Bcast.")
@click.option("--contributors", type=CONTRIBUTORS, default="standard", show_default=True,
              help="Collectives of layers with fewer units than Pr: over all Pr, among the "
                   "holders then a copy, or the cheaper.")
@click.option("--dtype", type=choice(GRID_DTYPES), default=Dtype.FP32.value,
              show_default=True, help="Training precision.")
@click.option("--vary", multiple=True, required=True, help=VARY_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: the table as rows (docs/json.md).")
@click.option("--csv", "csv_path", type=click.Path(), default=None,
              help="Write the table here (CSV).")
@click.option("--plot", "plot_path", type=click.Path(), default=None,
              help="Step time and communication share against each varied field (PNG, SVG or "
                   "PDF, by the suffix).")
def sweep(model: str, hardware: str | None, profile: str | None, gpus: int | None,
          global_batch: int | None, pr: int, best_pr: bool, norm: str,
          collective_variant: str, contributors: str, dtype: str,
          vary: tuple[str, ...], as_json: bool, csv_path: str | None,
          plot_path: str | None) -> None:
    """Sweep a layer graph (CNN/MLP) over a GPU's peak FLOP/s, memory bandwidth, GPU count, link
    bandwidth and batch size (Castelló et al. 2019's analysis of model parallelism for CNNs): a
    table and a plot."""
    from perfmodel.layerwise import Contributors, GridPlan, Norm, Variant
    from perfmodel.layerwise import sweep as run_sweep
    from perfmodel.specs.layers import LayerGraphSpec
    from perfmodel.specs.model import load_model

    if not model:  # --model '': not given, as predict says it
        raise click.UsageError("give --model (a layer-graph model: alexnet, vgg16, resnet50, mlp "
                               "or a file)")
    spec = load_model(model)
    if not isinstance(spec, LayerGraphSpec):
        raise click.UsageError("sweep takes a layer-graph model (alexnet, vgg16, resnet50, mlp or "
                               "a 'kind: layers' file)")
    ctx = click.get_current_context()
    if best_pr and _given(ctx, "pr"):
        raise click.UsageError(f"--pr {pr} beside --best-pr, which takes the fastest Pr x Pc "
                               "split at every point: give one of them")
    check_outputs((csv_path, "sweep CSV"), (plot_path, "plot"))
    hw = resolve_hardware(hardware, profile)
    values: dict[str, list[float]] = {}
    for field, numbers in (_vary(item, hw, dtype) for item in vary):
        if field in values:  # a dict would keep the last silently
            raise click.UsageError(f"--vary {field} is given twice: give its values in one "
                                   f"(--vary {field}=V1,V2,...)")
        # one within the other (peak_flops_per_s sets every dtype's peak, .fp16 one of them):
        # the later would set what the earlier's column names (before 2026-12-07, silently)
        within = [f for f in values if field.startswith(f + ".") or f.startswith(field + ".")]
        if within:
            raise click.UsageError(f"--vary {field} and --vary {within[0]} set the same "
                                   "quantity: vary one of them")
        values[field] = numbers
    for option, field, given in (("--gpus", "gpus", gpus), ("--global-batch", "global_batch",
                                                              global_batch)):
        if given is None and field not in values:
            raise click.UsageError(f"give {option} (or --vary {field}=V1,V2,...)")
        if given is not None and field in values:  # the sweep's values would replace it unseen
            raise click.UsageError(f"{option} {given} beside --vary {field}, which gives its "
                                   "values at every point: give one of them")
    # the GPU counts the points take (--vary gpus's, else --gpus) and the grids they run on
    counts = [int(n) for n in values["gpus"]] if "gpus" in values else [cast(int, gpus)]
    for n in counts:
        if n % pr:
            raise PlanError(f"--pr ({pr}) must divide --gpus ({n})" if "gpus" not in values
                            else f"--pr ({pr}) must divide every --vary gpus value, got {n}")
    if best_pr:
        grids = grid_splits(counts)
        scope = f"Pr x Pc split of {', '.join(map(str, counts))} GPUs"
    else:
        grids = [(pr, n // pr) for n in counts]
        scope = f"grid of the sweep (Pr {pr} on {', '.join(map(str, counts))} GPUs)" \
            if len(counts) > 1 else ""
    refuse_idle_graph_options(_flags_given(ctx), spec, norm, collective_variant, contributors,
                              grids, scope)
    _sweep_whole_nodes(hw, counts, values.get("gpus_per_node"))
    plan = GridPlan(pr=pr, pc=counts[0] // pr,
                    global_batch=int(values["global_batch"][0]) if "global_batch" in values
                    else cast(int, global_batch),
                    norm=Norm(norm), variant=Variant(collective_variant),
                    contributors=Contributors(contributors), dtype=dtype)
    frame = run_sweep(spec, hw, plan, values, best_pr=best_pr)
    require_finite(frame, "the sweep", f"{spec.name} on {hw.name}")
    if csv_path:
        from perfmodel.files import write_atomic

        write_atomic(csv_path, frame.to_csv(index=False), what="sweep CSV")
    if plot_path:
        from perfmodel.plot import sweep_plot

        sweep_plot(frame, list(values), Path(plot_path), title=f"{spec.name} on {hw.name}")
    if as_json:
        click.echo(json_text(document("sweep", {"rows": frame.to_dict(orient="records")})))
    else:
        from perfmodel.render import print_frame

        print_frame(frame, f"{spec.name}: sweep of {', '.join(values)}")


def _sweep_whole_nodes(hardware: Any, counts: Sequence[int],
                       per_node: Sequence[float] | None) -> None:
    """Every GPU count of a sweep in whole nodes of every node size it takes (--vary
    gpus_per_node's, else the hardware's), as a transformer's plan (encode.check_whole_nodes)."""
    from perfmodel.encode import check_whole_nodes
    from perfmodel.recommend import apply_what_if

    sizes: Sequence[float | None] = per_node or [None]
    for size in sizes:
        node = hardware if size is None else \
            apply_what_if(hardware, f"gpus_per_node={size!r}", "--vary")
        for n in counts:
            try:
                check_whole_nodes(node, n)
            except PlanError as exc:
                where = "" if size is None else f"--vary gpus_per_node={size:g}: "
                raise PlanError(f"{where}{exc}") from None


def graph_fields(hardware: Any, dtype: str) -> list[str]:
    """The hardware's --vary fields of sweep: those of _GRAPH_FIELDS (and _GRAPH_NODE_FIELDS
    without fabric levels), the peak (all dtypes' or the plan dtype's), each link's (intra_node,
    inter_node) or fabric level's (levels.N) of _GRAPH_LINK_FIELDS, the node's of
    _GRAPH_NODE_LINK_FIELDS and a level's above it of _GRAPH_LEVEL_FIELDS (VARY_HELP says them
    in words)."""
    from perfmodel.recommend import numeric_fields

    out = ["peak_flops_per_s", f"peak_flops_per_s.{dtype}", *_GRAPH_FIELDS,
           *(() if hardware.levels else _GRAPH_NODE_FIELDS)]
    links = [f"levels.{i}" for i in range(len(hardware.levels))] if hardware.levels \
        else ["intra_node", "inter_node"]
    for i, link in enumerate(links):
        out += [f"{link}.{f}" for f in _GRAPH_LINK_FIELDS]
        if i == 0:
            out += [f"{link}.{f}" for f in _GRAPH_NODE_LINK_FIELDS]
        elif hardware.levels:
            out += [f"{link}.{f}" for f in _GRAPH_LEVEL_FIELDS]
    known = set(numeric_fields(hardware.to_dict()))
    return [f for f in out if f in known or f.startswith("levels.")]


def _vary(item: str, hardware: Any, dtype: str = "fp32") -> tuple[str, list[float]]:
    """'FIELD=V1,V2' of sweep's --vary: a known field and positive finite numbers (whole numbers
    for gpus and global_batch)."""
    from perfmodel.recommend import numeric_fields
    from perfmodel.specs.loading import suggest

    field, _, text = (part.strip() for part in item.partition("="))
    allowed = sorted({*_SWEEP_PLAN_FIELDS, *graph_fields(hardware, dtype)})
    if field not in allowed:
        known = field in numeric_fields(hardware.to_dict())
        raise click.UsageError(f"--vary: {'a layer graph reads no' if known else 'unknown'} "
                               f"field '{field}'{'' if known else suggest(field, allowed)}; "
                               f"allowed: {', '.join(allowed)}")
    items = [v.strip() for v in text.split(",")]
    if not any(items):
        raise click.UsageError(f"--vary {field}: give at least one value")
    if not all(items):  # '1e13,,1e14' (recommend --gpus 8,,16 is refused so too)
        raise click.UsageError(f"--vary {field}: an empty value in '{text}'; give numbers "
                               "separated by single commas")
    try:
        if not all(ascii_number(v) for v in items):  # float() reads '1_0' as 10, '８' as 8
            raise ValueError
        numbers = [float(v) for v in items]
    except ValueError:
        raise click.UsageError(f"--vary must look like FIELD=V1,V2 with numbers (ASCII digits, "
                               f"no '_'), got '{item}'") from None
    # a value of the wrong form is a usage error; one out of its range, an error of what it
    # sets: the plan's (exit 4, as --gpus 0) or the hardware's (exit 3, as a spec's 0 bandwidth)
    for v in numbers:
        if not math.isfinite(v):
            raise click.UsageError(f"--vary {field}: values must be finite numbers, got {v:g}")
        if field in _SWEEP_PLAN_FIELDS:
            if v != int(v):
                raise click.UsageError(f"--vary {field}: values must be whole numbers, got {v:g}")
            if not 1 <= v <= MAX_DEGREE:
                raise PlanError(f"--vary {field}: values must be whole numbers from 1 to "
                                f"{MAX_DEGREE:g}, got {v:g}")
        elif v <= 0:
            raise SpecError(f"--vary {field}: values must be > 0, got {v:g}")
    if field in ("gpus", "global_batch"):  # counts: whole numbers in the table and its JSON
        return field, [int(v) for v in numbers]
    return field, numbers


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def presets(as_json: bool) -> None:
    """List the hardware and model presets."""
    from perfmodel.render import print_presets

    print_presets(as_json)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (kill, a scheduler's stop) is handled like Ctrl-C: the commands that launch
    processes stop them and keep what was measured."""
    raise KeyboardInterrupt


# sympy memoizes its constructors (sympy.core.cache) in LRU caches of SYMPY_CACHE_SIZE entries
# each, read when sympy is imported: 1,000 by default, which building a family's step model
# overflows (deepseek-v3's: 0.72 s with 1,000, 0.59 s with 10,000, the medians of five builds
# alternated; docs/performance.md). The command's own process, where no sympy is imported yet; a
# value the user set is kept
SYMPY_CACHE_SIZE = "10000"


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning user errors into one line and an exit code."""
    if "sympy" not in sys.modules:
        os.environ.setdefault("SYMPY_CACHE_SIZE", SYMPY_CACHE_SIZE)
    args = argv if argv is not None else sys.argv[1:]
    debug = bool(args) and "--debug" in args[: args.index("--") if "--" in args else len(args)]
    if sys.stderr is None:  # started with standard error closed (2>&-): its lines go nowhere
        sys.stderr = io.StringIO()
    if sys.stdout is None:  # started with standard output closed (>&-): nowhere to answer
        print("error: standard output is closed: nowhere to write the answer", file=sys.stderr)
        sys.exit(OutputError.exit_code)
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (e.g. called from a test's worker thread)
        previous = None
    try:
        _run(argv, debug)
    except SystemExit as exc:
        code = exc.code
        if code == 1 and isinstance(exc.__context__, BrokenPipeError):
            code = EXIT_BROKEN_PIPE  # click or rich caught EPIPE writing standard output
    else:
        code = 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if argv is None and threading.active_count() == 1:
        _exit_now(code)
    sys.exit(code)


_STREAM_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _say(text: str) -> None:
    """An error's one line on standard error: a newline inside it (a value the user gave)
    written as \\n; a standard error that cannot take it (2>/dev/full) does not change the
    exit code the error has."""
    try:
        click.echo(text.rstrip().replace("\r", "\\r").replace("\n", "\\n"), err=True)
    except OSError:
        pass


def _exit_now(code: object) -> None:
    """End the process without tearing down its objects: the exit handlers run and the
    output is flushed, as at a normal exit, but the interpreter does not free the step model's
    expressions one by one (a third of a second after a search that built them). Only as the
    process's entry point (main() without argv) with no other thread alive (a normal exit would
    wait for it)."""
    import atexit

    status = code if isinstance(code, int) else (0 if code is None else 1)
    if not isinstance(code, int) and code is not None:
        print(code, file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):  # neither None: main() checked both
        try:
            stream.flush()
        except BrokenPipeError:  # the reader went away before the last buffered output
            status = status or EXIT_BROKEN_PIPE
        except OSError as exc:  # the last buffered output did not fit (> /dev/full)
            status = status or (OutputError.exit_code if exc.errno in _STREAM_FULL else 120)
        except ValueError:  # another failed flush: as Python's own exit reports it
            status = status or 120
    os._exit(status)


def _run(argv: list[str] | None, debug: bool) -> None:
    try:
        cli.main(args=argv, prog_name="perfmodel", standalone_mode=False)
    except PerfmodelError as exc:
        if debug:
            raise
        label = "internal error" if exc.exit_code == EXIT_INTERNAL else "error"  # InternalError
        _say(f"{label}: {exc}")
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        _say("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        message = exc.format_message()
        if isinstance(exc, click.MissingParameter):  # click's own layout of a choice's values
            message = message.replace("\n\t", " ")  # (no value of the user's in it to escape)
        _say(f"error: {message}{hint}")
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        _say(f"error: {exc.format_message()}")
        sys.exit(exc.exit_code if exc.exit_code else EXIT_USAGE)
    except KeyboardInterrupt:
        _say("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit:
        raise
    except OSError as exc:
        if debug:
            raise
        if exc.errno not in _STREAM_FULL:  # one a command did not turn into its class: a bug,
            # said in one line as any other (not a traceback)
            _say(f"internal error: {type(exc).__name__}: {exc} (run with --debug for a "
                 "traceback)")
            sys.exit(EXIT_INTERNAL)
        # a full disk or quota under a redirected standard output (> /dev/full, > file): the
        # files perfmodel writes itself say so as OutputError already
        _say(f"error: cannot write the output: {exc.strerror}")
        sys.exit(OutputError.exit_code)
    except Exception as exc:  # a bug: say so in one line; --debug shows the traceback
        if debug:
            raise
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "torch":
            # a command path that needs torch without saying so first (perfmodel.extras)
            from perfmodel.extras import command_of, missing_torch_message

            command = command_of(argv if argv is not None else sys.argv[1:])
            _say(f"error: {missing_torch_message(command)}")
            sys.exit(EXIT_USAGE)
        _say(f"internal error: {type(exc).__name__}: {exc} (run with --debug for a traceback)")
        sys.exit(EXIT_INTERNAL)
