"""HOW a model is trained: the parallel plan (degrees, layout, micro-batch, schedule) and its rules.

One vocabulary of parallel degrees everywhere: dp (data), tp (tensor), pp (pipeline), cp (context:
each sequence split over cp ranks), ep (expert: a mixture of experts' experts split over ep ranks,
carved out of a stage's tp x cp x dp ranks, tp innermost, after etp's), etp (expert tensor: each
expert split over etp of the tp ranks); "axis" is a mesh axis. Options are
enums. The rules a plan obeys are written once (RULES), over plan columns: `Plan()` and
`Plan.check(model)` refuse a plan that breaks one, naming it; the search applies the same rules
to millions of plans at once (`allowed`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from perfmodel.costs.precision import MASTER_WEIGHTS, STATE_DTYPES
from perfmodel.errors import PlanError
from perfmodel.pipeline_layout import PipelineLayout, accounted_layout
from perfmodel.specs.loading import keyword_fields, plain, suggest
from perfmodel.specs.model import TransformerSpec

# Megatron-Core's default bucket without --ddp-bucket-size: max(40,000,000, 1,000,000 x the
# dp x cp group's ranks) parameters, "larger DP sizes need larger buckets to ensure collectives
# do not become latency-bound" (megatron/core/distributed/distributed_data_parallel_config.py and
# distributed_data_parallel.py, from core v0.7.0 on; perfmodel.step.data_parallel.bucket_size)
BUCKET_MIN_PARAMS = 40_000_000
BUCKET_PARAMS_PER_RANK = 1_000_000


class Schedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZERO_BUBBLE = "zb"  # interleaved zero bubble, ZB1P (Qi et al. 2024), v chunks per GPU (v >= 1)
    ZBV = "zbv"  # zero bubble, V-shape: 2 chunks per GPU, rank r holds chunks r and 2 pp - 1 - r


class Recompute(StrEnum):
    """Activation recompute (checkpointing), by the policies the stacks name:

    selective: Megatron-LM's --recompute-granularity selective: the attention core (Korthikanti
        et al. 2022, Sec. 5);
    full: every layer recomputed from its input (Megatron --recompute-granularity full
        --recompute-method uniform --recompute-num-layers 1; torchtitan mode full);
    op: torchtitan's per-op selective AC (mode selective, selective_ac_option op): the outputs of
        every other matmul, of the attention kernel and of the reduce-scatters are kept, the rest
        (the other matmuls, norms, activations) recomputed.
    With Plan.recompute_every N > 1 the policy applies to one layer in N, the others keep every
    activation (torchtitan selective_ac_option N with full). Full recompute as Megatron-LM runs
    it has its own knobs, Plan.recompute_method and recompute_num_layers (RecomputeMethod).
    """

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP = "op"


class RecomputeMethod(StrEnum):
    """How Megatron-LM's full recompute (--recompute-granularity full) picks and groups the
    layers of each model chunk, with k = Plan.recompute_num_layers
    (megatron/core/transformer/transformer_block.py, _checkpointed_forward):

    uniform: every layer recomputed, the chunk's layers checkpointed in groups of k (each group
        keeps its input; its backward recomputes the group's k layers at once);
    block: the first k layers of each chunk recomputed, each checkpointed alone; the others keep
        every activation.
    """

    UNIFORM = "uniform"
    BLOCK = "block"


class Attention(StrEnum):
    """How the attention core runs: auto (flash where the hardware has a kernel for the dtype,
    perfmodel.encode.resolve_flash), flash (one fused kernel), unfused (two GEMMs around a fused
    softmax, s^2 scores in memory). A Plan holds it as flash_attention: None, True, False."""

    AUTO = "auto"
    FLASH = "flash"
    UNFUSED = "unfused"

    @property
    def flash(self) -> bool | None:
        return {"auto": None, "flash": True, "unfused": False}[self.value]


class Dtype(StrEnum):
    """The training precision. fp8: bf16 mixed precision whose linear layers' GEMMs run in FP8
    (Transformer Engine, Micikevicius et al. 2022, "FP8 Formats for Deep Learning"); the
    attention core, softmax, norms, embedding and output layer stay bf16 (perfmodel.costs.fp8)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    TF32 = "tf32"
    FP8 = "fp8"


class Fp8Recipe(StrEnum):
    """How Transformer Engine scales FP8 tensors (transformer_engine.common.recipe):

    delayed: DelayedScaling, one scale per tensor from an amax history of earlier steps (TE's
        default on Hopper; NeMo's fp8_recipe "delayed");
    current: Float8CurrentScaling, one scale per tensor from the tensor itself (an extra amax
        pass before each cast);
    mxfp8: MXFP8BlockScaling, one E8M0 scale per 32 consecutive values, Blackwell's tensor cores
        (SM 10.0+) apply them in the GEMM.
    A plan with dtype fp8 and no recipe takes the hardware's default (HardwareSpec.fp8_recipe)."""

    DELAYED = "delayed"
    CURRENT = "current"
    MXFP8 = "mxfp8"


class TPLayout(StrEnum):
    """How the tensor-parallel group splits each linear layer.

    1d: Megatron (Shoeybi et al. 2019), column then row parallel, tp ranks.
    2d: SUMMA / Optimus (Xu et al. 2021), a q x q grid, tp = q^2.
    2.5d: Tesseract (Wang et al. 2021), d stacked q x q grids, tp = q^2 d.
    3d: Bian et al. 2021, a q x q x q cube, tp = q^3.
    """

    ONE_D = "1d"
    TWO_D = "2d"
    TWO_HALF_D = "2.5d"
    THREE_D = "3d"


class Placement(StrEnum):
    """The order of the axes over the ranks, innermost (fastest-varying rank, inside a node
    first) out: a group of an axis holds ranks `stride` apart, stride = the product of the degrees
    of the axes inside it (perfmodel.encode). An order of tp, dp and pp alone puts cp right
    outside tp (Megatron's order tp-cp-dp-pp; the validation job's mesh, workload.parallelize);
    the orders of all four place cp anywhere (inside a node or across nodes). Expert parallelism
    and expert tensor parallelism have no place of their own: their ranks are carved out of a
    stage's tp x cp x dp ranks, tp innermost, then cp (Megatron-Core's expert rank order: etp
    first, then ep, then edp)."""

    TP_DP_PP = "tp,dp,pp"
    TP_PP_DP = "tp,pp,dp"
    DP_TP_PP = "dp,tp,pp"
    DP_PP_TP = "dp,pp,tp"
    PP_TP_DP = "pp,tp,dp"
    PP_DP_TP = "pp,dp,tp"
    TP_CP_DP_PP = "tp,cp,dp,pp"
    TP_CP_PP_DP = "tp,cp,pp,dp"
    TP_DP_CP_PP = "tp,dp,cp,pp"
    TP_DP_PP_CP = "tp,dp,pp,cp"
    TP_PP_CP_DP = "tp,pp,cp,dp"
    TP_PP_DP_CP = "tp,pp,dp,cp"
    CP_TP_DP_PP = "cp,tp,dp,pp"
    CP_TP_PP_DP = "cp,tp,pp,dp"
    CP_DP_TP_PP = "cp,dp,tp,pp"
    CP_DP_PP_TP = "cp,dp,pp,tp"
    CP_PP_TP_DP = "cp,pp,tp,dp"
    CP_PP_DP_TP = "cp,pp,dp,tp"
    DP_TP_CP_PP = "dp,tp,cp,pp"
    DP_TP_PP_CP = "dp,tp,pp,cp"
    DP_CP_TP_PP = "dp,cp,tp,pp"
    DP_CP_PP_TP = "dp,cp,pp,tp"
    DP_PP_TP_CP = "dp,pp,tp,cp"
    DP_PP_CP_TP = "dp,pp,cp,tp"
    PP_TP_CP_DP = "pp,tp,cp,dp"
    PP_TP_DP_CP = "pp,tp,dp,cp"
    PP_CP_TP_DP = "pp,cp,tp,dp"
    PP_CP_DP_TP = "pp,cp,dp,tp"
    PP_DP_TP_CP = "pp,dp,tp,cp"
    PP_DP_CP_TP = "pp,dp,cp,tp"

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(self.value.split(","))

    @property
    def order(self) -> tuple[str, ...]:
        """The four axes innermost first: cp right outside tp where the placement does not name
        it."""
        return placement_order(self.axes)


class CPComm(StrEnum):
    """How attention crosses the cp ranks (Megatron-Core's cp_comm_type; Transformer Engine's
    context-parallel attention): p2p, ring attention (K and V passed round the ring by
    send/recv, each step's transfer behind the previous chunk's attention); allgather, K and V
    all-gathered (dK and dV reduce-scattered); a2a, Ulysses (all-to-alls swap sequence shards for
    head shards: Jacobs et al., DeepSpeed-Ulysses, 2023)."""

    P2P = "p2p"
    ALLGATHER = "allgather"
    A2A = "a2a"


class EPDispatcher(StrEnum):
    """How a mixture of experts' tokens reach their experts and come back (perfmodel.step.moe):
    alltoall, NCCL's all-to-all of every token's top-k copies (Megatron-Core's alltoall token
    dispatcher, torchtitan's standard backend, the validation job's); deepep, DeepEP's kernels
    (deepseek-ai/DeepEP; NVIDIA's HybridEP works the same way), which send a token once to each
    node and each rank holding one of its experts and forward it over NVLink inside the node
    (Megatron-Core's flex dispatcher, torchtitan's and NeMo AutoModel's deepep/hybridep)."""

    ALLTOALL = "alltoall"
    DEEPEP = "deepep"


class OptimizerKernels(StrEnum):
    """How the AdamW step runs over the parameters (perfmodel.costs.precision.
    optimizer_step_bytes_per_param): fused, one kernel reading and writing each state once
    (torch's AdamW(fused=True), Apex / Transformer Engine FusedAdam: Megatron-LM, NeMo,
    DeepSpeed; torchtitan's default since 2025-02-24); foreach, torch's multi-tensor path, one
    pass over every parameter, gradient and state per operation, eight of them (torch's default
    for CUDA tensors when neither foreach nor fused is given; torchtitan's before 2025-02-24)."""

    FUSED = "fused"
    FOREACH = "foreach"


class CrossEntropy(StrEnum):
    """How the loss runs over the logits (perfmodel.step.memory, .embedding_head): unfused,
    cross entropy on an fp32 copy of the logits (Megatron-LM's vocabulary-parallel cross
    entropy: one, normalised in place, beside the logits; with eager kernels PyTorch's
    F.cross_entropy on logits.float(), three); no-upcast, PyTorch's F.cross_entropy on the
    logits in their own dtype (bf16), no fp32 copy (NeMo AutoModel's MaskedCrossEntropy with
    fp32_upcast false; Megatron-Core's vocab_parallel_cross_entropy always upcasts, its
    fp16_lm_cross_entropy is stored and unused by GPTModel at d98e8a64dd); te, Transformer
    Engine's fused cross entropy (transformer_engine.pytorch.cross_entropy, Megatron-Core
    --cross-entropy-loss-fusion --cross-entropy-fusion-impl te): one kernel over the bf16
    logits that keeps them for the backward and writes their gradient in place, no fp32 copy;
    torch, PyTorch's F.cross_entropy on logits.float() named as such: its three fp32 copies
    whatever the other kernels (NeMo AutoModel's MaskedCrossEntropy, its default; unfused counts
    three only with eager kernels, Megatron's one beside the logits otherwise); native,
    Megatron-Core's native fusion (--cross-entropy-loss-fusion with --cross-entropy-fusion-impl
    native, NeMo 2's and Megatron-Bridge's default cross_entropy_loss_fusion true): the unfused
    loss's steps under torch.compile, which hold the logits as unfused does and pass over them
    fewer times (perfmodel.costs.compute); flash-attn, flash-attn's fused cross entropy
    (flash_attn.losses.cross_entropy.CrossEntropyLoss, llm-foundry's default loss
    fused_crossentropy): one kernel over the logits in their own dtype (an fp32 row held in
    registers, not in memory) that keeps them for the backward, whose gradient is a new tensor
    beside them (inplace_backward false, its default)."""

    UNFUSED = "unfused"
    NO_UPCAST = "no-upcast"
    TORCH = "torch"
    TE = "te"
    NATIVE = "native"
    FLASH_ATTN = "flash-attn"


class DpBucketing(StrEnum):
    """Which parameters a data-parallel sync overlapped with the backward buckets
    (Plan.dp_bucket_size; perfmodel.step.data_parallel.sync_buckets): megatron, Megatron-Core's
    DDP (NeMo 2, Megatron-Bridge, Megatron-LM): the first model chunk's in buckets of
    dp_bucket_size, each later chunk of an interleaved pipeline one bucket (megatron/training/
    training.py: disable_bucketing for model_chunk_idx > 0, "overlapped with compute anyway");
    all, every parameter (Apex's DistributedFusedAdam, NeMo 1's distributed_fused_adam, whose
    buckets run through all the parameters: apex/contrib/optimizers/distributed_fused_adam.py;
    PyTorch DDP)."""

    MEGATRON = "megatron"
    ALL = "all"


class FsdpReshard(StrEnum):
    """When ZeRO 3 without a pipeline frees a unit's gathered weights (perfmodel.step.
    data_parallel, .memory): forward, after each forward, gathered again for the backward
    (FSDP2's reshard_after_forward true: torchtitan's default without a pipeline, the validation
    job's); backward, after each backward, the forward's gather kept for it (reshard_after_forward
    false: NeMo AutoModel's default for a mixture of experts, torchtitan's "never"), every unit
    gathered at the forward's end; step, after the step's last backward, every unit gathered from
    the first micro-batch's forward on and the reduction deferred to the last micro-batch (NeMo
    AutoModel's enable_fsdp_optimizations: set_reshard_after_backward and
    set_requires_gradient_sync off until the last micro-batch)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"


class ExpertWeighting(StrEnum):
    """Where a mixture of experts multiplies the routing weights in (perfmodel.costs.moe,
    perfmodel.step.moe): activation, inside each expert's activation (Megatron-Core from 0.13:
    TEGroupedMLP's bias_act_func with the permuted probabilities, one fused weighted-SwiGLU
    kernel, the probabilities sent with the tokens; NeMo AutoModel's experts likewise), so the
    experts' outputs are only summed back; output, on the experts' outputs at the combine
    (torchtitan's token dispatcher, the validation job), which keeps them for the product's
    backward."""

    ACTIVATION = "activation"
    OUTPUT = "output"


class Stack(StrEnum):
    """How the framework runs a layer's ops (perfmodel.step.host): eagerly, op by op (PyTorch
    eager, Megatron-LM, NeMo); compiled, fused kernels launched by generated code
    (torch.compile); or compiled and replayed as CUDA graphs (one launch for many kernels)."""

    EAGER = "eager"
    COMPILED = "compiled"
    CUDA_GRAPHS = "cuda-graphs"


class TpBackward(StrEnum):
    """How the stack runs Megatron 1D tensor parallelism's backward (perfmodel.step.
    tensor_parallel): megatron, as Megatron-Core's linear layers and Transformer Engine's do
    (megatron/core/tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication,
    since Megatron-LM 2022; TE's LayerNormLinear and Linear): a sequence-parallel input kept as
    its shard and gathered again for the weight gradient, behind the input-gradient GEMM, and
    the input gradient's reduce-scatter (all-reduce without sequence parallelism) issued before
    the weight-gradient GEMM, which hides it; dtensor, as torch's DTensor runs it (torchtitan,
    the validation job): the gathered input kept for autograd, each reduction in its turn."""

    MEGATRON = "megatron"
    DTENSOR = "dtensor"


class Kernels(StrEnum):
    """How a layer's memory-bound element-wise ops run (perfmodel.costs.compute.elementwise_bytes):
    fused, hand-written fused kernels (Megatron-Core and Transformer Engine: fused RMSNorm /
    LayerNorm, fused RoPE, fused bias-SwiGLU / bias-GeLU, bias-dropout-add); eager, PyTorch
    modules op by op, one kernel per op (torchtitan without torch.compile: the RMSNorm in fp32,
    RoPE through complex views, repeat_kv's copies); compiled, the same modules' chains fused by
    Inductor (torch.compile), the grouped-query K and V still expanded for the attention kernel."""

    FUSED = "fused"
    EAGER = "eager"
    COMPILED = "compiled"


def kernels_stack_conflict(kernels: Kernels, stack: Stack) -> str | None:
    """The one-line refusal of element-wise kernels a stack cannot run, else None: torch.compile
    fuses the modules' element-wise ops (kernels eager with stack compiled is not a thing), and
    Inductor's kernels exist only under a compiled stack (compiled or cuda-graphs)."""
    if kernels is Kernels.EAGER and stack is Stack.COMPILED:
        return ("kernels eager runs the modules op by op, which stack compiled fuses: give "
                "kernels compiled (or fused) with stack compiled, or stack eager")
    if kernels is Kernels.COMPILED and stack is Stack.EAGER:
        return ("kernels compiled are torch.compile's: give stack compiled or cuda-graphs with "
                "them, or kernels eager or fused with stack eager")
    return None


def tp_backward_of(plan: Plan) -> TpBackward:
    """The plan's tensor-parallel backward: Plan.tp_backward, else its kernels' stack's (fused:
    Megatron-Core / Transformer Engine, megatron; eager or compiled: torch DTensor). The step
    model takes the same rule symbolically where the kernels are open
    (perfmodel.step.context.Context.megatron_backward)."""
    if plan.tp_backward is not None:
        return plan.tp_backward
    return TpBackward.MEGATRON if plan.kernels is Kernels.FUSED else TpBackward.DTENSOR


def default_kernels(stack: Stack | str) -> Kernels:
    """The element-wise kernels of a plan that names none: Inductor's under a compiled stack,
    else fused (Megatron-Core / Transformer Engine)."""
    return Kernels.COMPILED if parse_option(Stack, stack, "stack") is Stack.COMPILED \
        else Kernels.FUSED


class Objective(StrEnum):
    """What `recommend` ranks plans by: seconds per step, seconds to train a token budget, or the
    price of that (GPU-hours times a price)."""

    STEP_TIME = "step_time"
    TIME_TO_TRAIN = "time_to_train"
    COST = "cost"


def integer_root(n: int, k: int) -> int | None:
    """The whole number r with r**k == n, or None."""
    r: int = round(n ** (1 / k))
    for c in (r - 1, r, r + 1):
        if c >= 1 and c**k == n:
            return c
    return None


AXES = ("tp", "dp", "pp")
ORDER_AXES = ("tp", "cp", "dp", "pp")


def placement_order(axes: tuple[str, ...]) -> tuple[str, ...]:
    """A placement's axes, innermost first, with cp right outside tp where they do not name it."""
    if "cp" in axes:
        return axes
    at = axes.index("tp") + 1
    return (*axes[:at], "cp", *axes[at:])
# Fraction of each GPU's memory a recommended plan leaves free, beyond the hardware's
# memory_reserved_bytes (the CUDA context, ~2 GiB): for what the model does not count. The PyTorch
# caching allocator fragments memory: Guo et al., "GMLake" (ASPLOS 2024), measured 9.2 GB per 80 GB
# A100 on average (11.5%; up to 25 GB) over eight LLM training runs, worst with recompute and
# ZeRO; NCCL's communication buffers and the kernels' workspaces come on top (Megatron Bridge's
# memory estimator lists both as not included). 10% keeps a plan the model puts at the limit
# from running out of memory; `recommend --memory-margin 0` lets a plan fill the memory.
DEFAULT_MEMORY_MARGIN = 0.10
# recommend's token budget and price of a GPU-hour (--tokens, --gpu-hour-price; perfmodel.search.
# SearchRequest checks them too): ranges within which a plan's time to train and cost are finite
# and nonzero numbers, whatever the step time a spec's physical ranges allow (1e24 tokens is 1e10
# times Llama 3's 15T; a price from a millionth of a millionth to a million million in any
# currency)
TOKEN_BUDGET, GPU_HOUR_PRICE = (1.0, 1e24), (1e-12, 1e12)
# bytes of an activation element: fp8 training keeps its activations (and the weights it holds)
# in bf16, casting to FP8 only the GEMMs' operands (perfmodel.costs.fp8)
BYTES_PER_ELEMENT = {Dtype.BF16: 2, Dtype.FP16: 2, Dtype.FP32: 4, Dtype.TF32: 4, Dtype.FP8: 2}
# the dtypes that train with bf16 mixed precision's model states (fp8: TE's bf16 weights with
# fp32 master weights in the optimizer)
BF16_STATES = (Dtype.BF16, Dtype.FP8)


E = TypeVar("E", bound=StrEnum)


def parse_option(cls: type[E], value: Any, field: str) -> E:
    """The member of an option's enum that value names (case and spaces aside), or a PlanError
    naming the field and the allowed values."""
    if isinstance(value, cls):
        return value
    text = str(value).strip().lower()
    allowed = [m.value for m in cls]
    if text not in allowed:
        other = OTHER_NAMES.get(field, {}).get(text)
        hint = f" ({other[1]} is '{other[0]}')" if other else suggest(text, allowed)
        raise PlanError(f"{field} must be one of {', '.join(allowed)}, got '{value}'{hint}")
    return cls(text)


# What other tools call an option's value, said in the refusal (never taken in its place: the
# value given is not one perfmodel's field defines)
OTHER_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "cp_comm": {"ring": ("p2p", "ring attention"), "ulysses": ("a2a", "Ulysses"),
                "all_gather": ("allgather", "Megatron-Core's all-gather of K and V"),
                "all-gather": ("allgather", "Megatron-Core's all-gather of K and V")},
    "ep_dispatcher": {"hybridep": ("deepep", "HybridEP, which exchanges as DeepEP does,"),
                      "flex": ("deepep",
                               "Megatron-Core's flex dispatcher, with DeepEP or HybridEP,"),
                      "all_to_all": ("alltoall", "NCCL's all-to-all")},
}


def _positive_int(value: Any, field: str, minimum: int = 1, maximum: int = 10**7) -> int:
    if isinstance(value, bool):
        raise PlanError(f"{field} must be a whole number, got {value}")
    try:
        number = float(value)
    except OverflowError:  # an int past 1.8e308 (a flag or cell of a few hundred digits)
        raise PlanError(f"{field} must be between {minimum} and {maximum:g}, got a number of "
                        f"{len(str(abs(int(value))))} digits") from None
    except (TypeError, ValueError):
        raise PlanError(f"{field} must be a whole number, got '{value}'") from None
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise PlanError(f"{field} must be a whole number, got '{value}'")
    if number < minimum or number > maximum:
        raise PlanError(f"{field} must be between {minimum} and {maximum:g}, got {value}")
    return int(number)


def ep_overlap_runs(recompute: Recompute, schedule: Schedule, pp: int) -> bool:
    """Whether Megatron-Core runs combined 1F1B (Plan.ep_comm_overlap) with this recompute and
    schedule: not with full recompute; with several stages only interleaved (interleaving
    needs virtual_stages > 1, a rule of its own). The search's plans and its CSV
    (perfmodel.search) and the step model (perfmodel.step.moe.ep_overlaps) follow it."""
    return recompute is not Recompute.FULL and (pp == 1 or schedule is Schedule.INTERLEAVED)


def ep_overlap_pairs(pp: Any, virtual_stages: Any, interleaved: Any, micro_batches: Any) -> Any:
    """Whether a schedule leaves combined 1F1B any pair of chunks to overlap: its warm-up and
    cool-down, 1 + 2 (pp - 1) + (v - 1) pp of its m v chunks, do not take them all
    (perfmodel.step.moe.ep_overlaps' floor below 1); m the micro-batches of one schedule, v the
    virtual stages where interleaved. One plan's numbers, or the search's arrays."""
    v = _where(interleaved, virtual_stages, 1)
    return 1 + 2 * (pp - 1) + (v - 1) * pp < micro_batches * v


# selective recompute's modules (Megatron-Core TransformerConfig.recompute_modules, its names):
# the attention core; MLA's up projections and rotary embedding; a dense layer's MLP; the routed
# experts' activation function; the shared experts
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe_act", "shared_experts",
                     "layernorm")
_MODULES_NOT_MODELLED = {"moe": "recomputing a whole MoE layer (its all-to-alls too) is not "
                                "modelled: give moe_act and shared_experts, or recompute full"}


def parse_recompute_modules(value: Any) -> tuple[str, ...]:
    """Selective recompute's modules from a list or a comma-separated string, in
    RECOMPUTE_MODULES' order; () for none given (the attention core, Megatron's default).
    ["core_attn"] alone is the default too, and reads as ()."""
    if value is None:
        return ()
    if not isinstance(value, (str, list, tuple)):
        raise PlanError(f"recompute_modules must be some of {', '.join(RECOMPUTE_MODULES)}, as "
                        f"a list or separated by commas, got {value!r}")
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip() for v in items if str(v).strip()]
    for name in names:
        if name in _MODULES_NOT_MODELLED:
            raise PlanError(f"recompute_modules {name}: {_MODULES_NOT_MODELLED[name]}")
        if name not in RECOMPUTE_MODULES:
            raise PlanError(f"recompute_modules must be some of {', '.join(RECOMPUTE_MODULES)}"
                            f", got '{name}'")
    if len(set(names)) != len(names):
        raise PlanError(f"recompute_modules names a module twice: {','.join(names)}")
    ordered = tuple(m for m in RECOMPUTE_MODULES if m in names)
    return () if ordered == ("core_attn",) else ordered


def modules_missing(modules: tuple[str, ...], model: Any) -> str | None:
    """The first recompute module the model has no part for, as one line; None if none."""
    parts = {"mla_up_proj": (getattr(model, "kv_lora_rank", None) is not None,
                             "multi-head latent attention"),
             "moe_act": (bool(getattr(model, "experts", 0)), "routed experts"),
             "shared_experts": (bool(getattr(model, "shared_experts", 0)), "shared experts"),
             "mlp": (not getattr(model, "experts", 0)
                     or len(getattr(model, "moe_layers", ())) < model.layers,
                     "dense layer's MLP"),
             # Megatron-Core recomputes the norms that are modules of their own: an MoE layer's
             # pre-MLP norm (a dense layer's norms are fused into Transformer Engine's linears)
             "layernorm": (bool(getattr(model, "experts", 0)),
                           "norm outside Transformer Engine's linear layers (an MoE layer's "
                           "pre-MLP norm)")}
    for name in modules:
        has, what = parts.get(name, (True, ""))
        if not has:
            return f"recompute_modules {name}: the model has no {what}"
    return None


def _bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise PlanError(f"{field} must be true or false, got '{value}'")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A parallel training plan.

    gpus = dp * cp * tp * pp. The global batch (in samples) is split into dp replicas and, on each,
    into micro-batches of micro_batch samples: num_micro_batches = global_batch / (dp *
    micro_batch). Context parallelism splits each sequence over cp ranks (cp_comm: how attention
    crosses them); expert parallelism splits a mixture of experts' experts over ep ranks, carved
    out of a stage's tp x cp x dp ranks; expert tensor parallelism splits each expert's FFN over
    etp of the tp ranks (etp divides tp). Megatron-Core's expert mesh etp x ep x edp is the same
    tp x cp x dp ranks of a pipeline stage flattened tp innermost, then cp, then dp: etp takes
    the first etp ranks, ep the next ep (the rest of the tp axis first, then cp, then dp), edp =
    tp cp dp / (etp ep) the rest (etp 1: an ep group takes the attention's tp ranks first; etp =
    tp: it lies on the dp x cp ranks). placement lists the axes from the innermost
    (fastest-varying rank, inside a node first) out.
    """

    gpus: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    cp_comm: CPComm = CPComm.P2P
    ep: int = 1
    # expert tensor parallelism (Megatron --expert-tensor-parallel-size): each routed expert's
    # FFN split column- then row-parallel over etp of the tp ranks (perfmodel.step.moe)
    etp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.NONE
    # the recompute policy applies to one layer in every N of a stage (floor(n / N) of its n
    # layers; torchtitan wraps layers N, 2N, ...); 1: every layer
    recompute_every: int = 1
    # selective recompute's modules, Megatron-Core's --recompute-modules (RECOMPUTE_MODULES);
    # () the default, the attention core alone
    recompute_modules: tuple[str, ...] = ()
    # full recompute as Megatron-LM's --recompute-method and --recompute-num-layers
    # (RecomputeMethod): uniform 1, the default, checkpoints every layer alone
    recompute_method: RecomputeMethod = RecomputeMethod.UNIFORM
    recompute_num_layers: int = 1
    # activation offloading to the host (Megatron-Core --cpu-offloading-num-layers k, Transformer
    # Engine's get_cpu_offload_context): the activations of the model's first k layers are copied
    # to host memory in the forward and back in the backward, behind the other layers' compute
    # (perfmodel.step.offload); 0: none. As Megatron-Core allows it: pp 1, no recompute,
    # k below the model's layers
    cpu_offload_layers: int = 0
    zero: int = 0
    dtype: Dtype = Dtype.BF16
    tp_layout: TPLayout = TPLayout.ONE_D
    tp_depth: int = 1
    # fused (flash) attention: True, False (unfused: Megatron's fused softmax between two GEMMs), or
    # None: flash where the hardware has a flash kernel for the dtype and the model's head size
    # (predict and recommend decide; perfmodel.encode.resolve_flash)
    flash_attention: bool | None = None
    # the flash kernel by its name on the hardware (HardwareSpec.flash_attention_names: cudnn,
    # fa2, ...): None, the hardware's default; a name means flash attention by that kernel
    attention_kernel: str | None = None
    overlap_grad_sync: bool = False
    # with overlap_grad_sync (ZeRO 0-2), the parameters per data-parallel bucket: the gradients
    # are reduced and the weights gathered one bucket per collective, each bucket as its
    # layers' backward has produced it (Megatron-Core --ddp-bucket-size; NeMo 1's
    # distributed_fused_adam bucket_cap_mb MiB of its gradient dtype; PyTorch DDP's
    # bucket_cap_mb; perfmodel.step.data_parallel). None: Megatron-Core's default,
    # max(40,000,000, 1,000,000 x dp x cp). Without overlap the stacks build one bucket
    dp_bucket_size: int | None = None
    # which parameters go in buckets (DpBucketing): Megatron-Core's first model chunk, or all
    dp_bucketing: DpBucketing = DpBucketing.MEGATRON
    # the distributed optimizer's (ZeRO 1-2) or FSDP's (ZeRO 3) parameter all-gather overlapped
    # with the forward (Megatron --overlap-param-gather, FSDP2's prefetch)
    overlap_param_gather: bool = False
    # tensor-parallel all-gathers and reduce-scatters overlapped with the GEMMs they feed or
    # follow (Megatron --tp-comm-overlap with Transformer Engine's userbuffers, torchtitan's
    # async TP); needs sequence parallelism
    tp_comm_overlap: bool = False
    # a mixture of experts' dispatch and combine all-to-alls of one micro-batch overlapped with
    # the computation of another (Megatron-Core's combined 1F1B, --overlap-moe-expert-parallel-
    # comm; perfmodel.step.moe.ep_overlaps)
    ep_comm_overlap: bool = False
    # Megatron-LM's scatter-gather of pipeline sends (2021-22, default on there, gone from
    # Megatron-Core): without sequence parallelism a stage sends 1/tp of its output and the
    # receiver all-gathers it over tp (Narayanan et al. SC21, Sec. 4.1)
    pp_scatter_gather: bool = False
    # ZeRO 3 without a pipeline: the gradients accumulate unsharded over the micro-batches and
    # are reduce-scattered once, in the last one's backward (FSDP2's set_requires_gradient_sync
    # off before it: NeMo AutoModel's defer_fsdp_grad_sync, its default); off: every
    # micro-batch's backward reduce-scatters (torchtitan, Megatron-LM, DeepSpeed ZeRO-3)
    defer_grad_sync: bool = False
    # DeepSpeed's BF16_Optimizer (bf16 at DeepSpeed's ZeRO stage 0, Megatron-DeepSpeed's; zero 1
    # here: its fp32 master weights and Adam states sharded over dp): after every micro-batch's
    # backward it adds the bf16 gradients into whole fp32 ones (update_hp_grads), which it
    # all-reduces in fp32 after the last (never searched)
    bf16_optimizer: bool = False
    # Megatron-Core's gradient accumulation fusion (--gradient-accumulation-fusion, its default;
    # Transformer Engine's fuse_wgrad_accumulation follows it): each linear layer's weight-
    # gradient GEMM accumulates into the main gradient; off (--no-gradient-accumulation-fusion),
    # the GEMM writes the gradient in the parameter's dtype and DDP's hook adds it into the main
    # gradient, a pass over the stage's linear weights every micro-batch (perfmodel.step.
    # grad_accumulation; never searched). Not with ZeRO 3 or bf16_optimizer, which have no
    # main-gradient buffer to add into (FSDP reduce-scatters the backward's own gradients,
    # DeepSpeed adds them itself)
    grad_accumulation_fusion: bool = True
    # how the stack runs tensor parallelism's backward (TpBackward: megatron, dtensor); None:
    # the kernels' stack (fused: Megatron-Core / Transformer Engine; eager or compiled: torch
    # DTensor, torchtitan). Never searched (perfmodel.step.tensor_parallel)
    tp_backward: TpBackward | None = None
    # ZeRO 3 without a pipeline: when a unit's gathered weights are freed (FsdpReshard): after
    # each forward (FSDP2's default), each backward, or the step's last backward
    fsdp_reshard: FsdpReshard = FsdpReshard.FORWARD
    # the experts' token dispatcher (EPDispatcher): NCCL's all-to-all or DeepEP's kernels
    ep_dispatcher: EPDispatcher = EPDispatcher.ALLTOALL
    # how the loss runs over the logits (CrossEntropy): fp32 copies, or TE's fused kernel
    cross_entropy: CrossEntropy = CrossEntropy.UNFUSED
    # how the AdamW step runs (OptimizerKernels): one fused kernel, or torch's foreach passes
    optimizer_kernels: OptimizerKernels = OptimizerKernels.FUSED
    # where a mixture of experts applies its routing weights (ExpertWeighting)
    expert_weighting: ExpertWeighting = ExpertWeighting.ACTIVATION
    stack: Stack = Stack.EAGER
    # PyTorch's caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=
    # expandable_segments:True): under memory pressure it unmaps the free blocks' pages and maps
    # what a request needs at a segment's end, so the step's transient tensors leave no
    # fragmentation to count (perfmodel.step.memory; never searched)
    expandable_segments: bool = False
    # how the element-wise ops run (Kernels): eager needs a stack that runs the modules' ops
    # (eager, or CUDA graphs capturing them), compiled a compiled stack (compiled, cuda-graphs)
    # None: the stack's (default_kernels), resolved in __post_init__: never None after it
    kernels: Kernels = None  # type: ignore[assignment]
    # layers of the first and the last pipeline stage where not L / pp (0: even split; Megatron
    # --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers): the other stages
    # split the rest evenly
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # every pipeline stage's layers as Megatron-Core's --pipeline-model-parallel-layout writes
    # them ("Et|(tt|)*30mL"; perfmodel.pipeline_layout), instead of first/last_stage_layers:
    # stages of unequal layers under virtual stages; "" for none
    pipeline_layout: str = ""
    # the micro-batches of one pipeline schedule, where the step runs several (torchtitan and
    # NeMo AutoModel run one per gradient-accumulation step: local batch / the pipeline's
    # micro-batch, each with its fill and drain); 0: one schedule of every micro-batch (Megatron)
    pipeline_micro_batches: int = 0
    placement: tuple[str, ...] = AXES
    # bf16 mixed precision's main-gradient and optimizer-state dtypes, fp32 or bf16
    # (perfmodel.costs.precision); None: Megatron-LM's, fp32 and fp32
    grad_dtype: str | None = None
    optimizer_dtype: str | None = None
    # and its master weights (perfmodel.costs.precision.MASTER_WEIGHTS): fp32, remainders
    # (Megatron-Core's precision-aware optimizer), none; None: fp32 with fp32 states, none with
    # bf16 ones
    master_weights: str | None = None
    # dtype fp8 only: Transformer Engine's scaling recipe (None: the hardware's default, decided
    # by perfmodel.predict.resolve_inputs), and whether the output layer's GEMM runs in FP8 too
    # (Megatron-LM's output layer is a bf16 ColumnParallelLinear outside TE's FP8 autocast; AMD
    # Primus can run it in FP8: use_turbo_fp8_output_layer)
    fp8_recipe: Fp8Recipe | None = None
    fp8_output_layer: bool = False
    # dtype fp8 only: the linear layers' weights held in FP8 (TE's fp8_model_init: Megatron-LM
    # --fp8-param-gather, NeMo fp8_params / fp8_param_gather), the fp32 master weights in the
    # optimizer: no bf16 copy of them, and the distributed optimizer (zero 1-2) or FSDP (zero 3,
    # as Megatron FSDP shards and gathers them; per-tensor recipes) all-gathers them in FP8
    fp8_params: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # numpy's scalars as Python's: np.bool_ is a bool
            object.__setattr__(self, f.name, plain(getattr(self, f.name)))
        for key in ("dp", "tp", "pp", "cp", "ep", "etp", "micro_batch", "global_batch",
                    "virtual_stages", "tp_depth", "gpus", "recompute_every",
                    "recompute_num_layers"):
            object.__setattr__(self, key, _positive_int(getattr(self, key), key))
        object.__setattr__(self, "zero", _positive_int(self.zero, "zero", minimum=0, maximum=3))
        object.__setattr__(self, "cpu_offload_layers",
                           _positive_int(self.cpu_offload_layers, "cpu_offload_layers", minimum=0))
        if self.dp_bucket_size is not None and str(self.dp_bucket_size).strip() != "":
            object.__setattr__(self, "dp_bucket_size",
                               _positive_int(self.dp_bucket_size, "dp_bucket_size",
                                             maximum=10**13))
        else:
            object.__setattr__(self, "dp_bucket_size", None)
        kernel = None if self.attention_kernel is None else str(self.attention_kernel).strip()
        object.__setattr__(self, "attention_kernel", kernel or None)
        for key in ("first_stage_layers", "last_stage_layers", "pipeline_micro_batches"):
            object.__setattr__(self, key, _positive_int(getattr(self, key), key, minimum=0))
        object.__setattr__(self, "stack", parse_option(Stack, self.stack, "stack"))
        object.__setattr__(self, "cross_entropy",
                           parse_option(CrossEntropy, self.cross_entropy, "cross_entropy"))
        object.__setattr__(self, "optimizer_kernels", parse_option(
            OptimizerKernels, self.optimizer_kernels, "optimizer_kernels"))
        object.__setattr__(self, "expert_weighting", parse_option(
            ExpertWeighting, self.expert_weighting, "expert_weighting"))
        object.__setattr__(self, "fsdp_reshard",
                           parse_option(FsdpReshard, self.fsdp_reshard, "fsdp_reshard"))
        object.__setattr__(self, "dp_bucketing",
                           parse_option(DpBucketing, self.dp_bucketing, "dp_bucketing"))
        # not given: the stack's (Inductor's under torch.compile), as plan_from_dict and the
        # command line take it
        object.__setattr__(self, "kernels", default_kernels(self.stack) if self.kernels is None
                           else parse_option(Kernels, self.kernels, "kernels"))
        kernels_rule = kernels_stack_conflict(self.kernels, self.stack)
        if kernels_rule is not None:
            raise PlanError(kernels_rule)
        object.__setattr__(self, "schedule", parse_option(Schedule, self.schedule, "schedule"))
        object.__setattr__(self, "recompute", parse_option(Recompute, self.recompute, "recompute"))
        if self.recompute_every > 1 and self.recompute is Recompute.NONE:
            raise PlanError(f"recompute_every {self.recompute_every} needs a recompute policy "
                            "(it applies the policy to one layer in N): give recompute full, "
                            "selective or op")
        object.__setattr__(self, "recompute_method",
                           parse_option(RecomputeMethod, self.recompute_method,
                                        "recompute_method"))
        if (self.recompute_method is not RecomputeMethod.UNIFORM
                or self.recompute_num_layers > 1):
            given = (f"recompute_method {self.recompute_method.value} recompute_num_layers "
                     f"{self.recompute_num_layers}")
            if self.recompute is not Recompute.FULL:
                raise PlanError(f"{given}: Megatron-LM's methods group full recompute; the plan "
                                f"recomputes {self.recompute.value} (give recompute full)")
            if self.recompute_every > 1:
                raise PlanError(f"{given} with recompute_every {self.recompute_every}: "
                                "Megatron-LM's layer choice or torchtitan's one in N, not both")
            uneven = self.first_stage_layers or self.last_stage_layers or \
                str(self.pipeline_layout or "").strip()
            if uneven:
                raise PlanError(f"{given} with uneven pipeline stages: Megatron's methods pick "
                                "and group the layers of each chunk, and the stages' chunks "
                                "differ (not modelled); give equal stages, or recompute_method "
                                "uniform with recompute_num_layers 1")
        if self.cpu_offload_layers:
            given = f"cpu_offload_layers {self.cpu_offload_layers}"
            # megatron/core/transformer/transformer_config.py refuses both
            if self.pp > 1:
                raise PlanError(f"{given} with pp {self.pp}: Megatron-Core offloads activations "
                                "without pipeline parallelism only; give pp 1")
            if self.recompute is not Recompute.NONE:
                raise PlanError(f"{given} with recompute {self.recompute.value}: Megatron-Core "
                                "does not offload activations beside recomputation; give "
                                "recompute none")
        object.__setattr__(self, "recompute_modules",
                           parse_recompute_modules(self.recompute_modules))
        if self.recompute_modules and self.recompute is not Recompute.SELECTIVE:
            raise PlanError(f"recompute_modules ({','.join(self.recompute_modules)}) apply to "
                            f"recompute selective, not {self.recompute.value}")
        object.__setattr__(self, "dtype", parse_option(Dtype, self.dtype, "dtype"))
        object.__setattr__(self, "tp_layout", parse_option(TPLayout, self.tp_layout, "tp_layout"))
        if self.recompute_modules and self.tp_layout is not TPLayout.ONE_D:
            raise PlanError(f"recompute_modules are Megatron-Core's, with tp_layout 1d, not "
                            f"{self.tp_layout.value}")
        object.__setattr__(self, "cp_comm", parse_option(CPComm, self.cp_comm, "cp_comm"))
        object.__setattr__(self, "ep_dispatcher",
                           parse_option(EPDispatcher, self.ep_dispatcher, "ep_dispatcher"))
        if self.ep_dispatcher is EPDispatcher.DEEPEP and self.etp > 1:
            raise PlanError(f"ep_dispatcher deepep with etp {self.etp} is not modelled (the "
                            "model's expert-tensor exchanges are the alltoall dispatcher's): "
                            "give etp 1, or ep_dispatcher alltoall")
        for key in ("grad_dtype", "optimizer_dtype"):
            value = getattr(self, key)
            if value is None or str(value).strip() == "":
                object.__setattr__(self, key, None)
                continue
            text = str(value).strip().lower()
            if text not in STATE_DTYPES:
                raise PlanError(f"{key} must be one of {', '.join(STATE_DTYPES)}, got '{value}'")
            if self.dtype not in BF16_STATES:
                raise PlanError(f"{key} applies to bf16 mixed precision (bf16, fp8), not dtype "
                                f"{self.dtype.value}")
            object.__setattr__(self, key, text)
        if self.fp8_recipe is not None and str(self.fp8_recipe).strip() != "":
            if self.dtype is not Dtype.FP8:
                raise PlanError(f"fp8_recipe applies to dtype fp8, not {self.dtype.value}")
            object.__setattr__(self, "fp8_recipe",
                               parse_option(Fp8Recipe, self.fp8_recipe, "fp8_recipe"))
        else:
            object.__setattr__(self, "fp8_recipe", None)
        object.__setattr__(self, "fp8_output_layer",
                           _bool(self.fp8_output_layer, "fp8_output_layer"))
        object.__setattr__(self, "fp8_params", _bool(self.fp8_params, "fp8_params"))
        for key in ("fp8_output_layer", "fp8_params"):
            if getattr(self, key) and self.dtype is not Dtype.FP8:
                raise PlanError(f"{key} applies to dtype fp8, not {self.dtype.value}")
        self._check_master_weights()
        for key in ("sequence_parallel", "flash_attention", "overlap_grad_sync",
                    "overlap_param_gather", "tp_comm_overlap", "ep_comm_overlap",
                    "pp_scatter_gather", "defer_grad_sync", "bf16_optimizer",
                    "grad_accumulation_fusion", "expandable_segments"):
            if key == "flash_attention" and (self.flash_attention is None
                                             or str(self.flash_attention).lower() == "auto"):
                object.__setattr__(self, key, None)
                continue
            object.__setattr__(self, key, _bool(getattr(self, key), key))
        if self.tp_backward is not None:  # "auto": the kernels' stack decides (None)
            object.__setattr__(self, "tp_backward", None if str(self.tp_backward).strip().lower()
                               in ("auto", "") else parse_option(TpBackward, self.tp_backward,
                                                                 "tp_backward"))
        if self.bf16_optimizer and (self.dtype is not Dtype.BF16 or self.zero != 1
                                    or self.grad_dtype not in (None, "fp32")
                                    or self.optimizer_dtype not in (None, "fp32")
                                    or self.master_weights not in (None, "fp32")):
            raise PlanError("bf16_optimizer is DeepSpeed's BF16_Optimizer: dtype bf16 and zero 1 "
                            "(its fp32 master weights and states sharded over dp), with fp32 "
                            f"gradients, states and master weights; got dtype {self.dtype.value}, "
                            f"zero {self.zero}, grad_dtype {self.grad_dtype or 'fp32'}, "
                            f"optimizer_dtype {self.optimizer_dtype or 'fp32'}, master_weights "
                            f"{self.master_weights or 'fp32'}")
        if self.bf16_optimizer and (self.overlap_grad_sync or self.overlap_param_gather):
            raise PlanError("bf16_optimizer: DeepSpeed reduces the gradients after the last "
                            "micro-batch and gathers the weights in the step, overlapping "
                            "neither (leave overlap_grad_sync and overlap_param_gather off)")
        bucketing = self.dp_bucket_size is not None or self.dp_bucketing is DpBucketing.ALL
        if bucketing and (self.zero == 3 or self.bf16_optimizer):
            given = (f"dp_bucket_size {self.dp_bucket_size}" if self.dp_bucket_size is not None
                     else f"dp_bucketing {self.dp_bucketing.value}")
            raise PlanError(f"{given} sizes the buckets of a "
                            "gradient sync overlapped with the backward (zero 0-2 with "
                            "overlap_grad_sync), and "
                            + ("ZeRO 3 (FSDP) syncs one unit a layer" if self.zero == 3
                               else "DeepSpeed's BF16_Optimizer reduces after the backward")
                            + ": leave it out")
        if not self.grad_accumulation_fusion and (self.zero == 3 or self.bf16_optimizer):
            raise PlanError("grad_accumulation_fusion false adds each micro-batch's weight "
                            "gradients into Megatron-Core's main-gradient buffer, which "
                            + ("ZeRO 3 (FSDP) has not: it reduce-scatters the backward's own "
                               "gradients" if self.zero == 3 else "DeepSpeed's BF16_Optimizer "
                               "replaces: it adds them into its fp32 ones itself")
                            + "; leave grad_accumulation_fusion at its default (true)")
        if self.attention_kernel and self.flash_attention is False:
            raise PlanError(f"attention_kernel {self.attention_kernel} names a flash kernel, and "
                            "the plan attends unfused (flash_attention false): leave one out")
        if not isinstance(self.placement, (str, list, tuple)):
            raise PlanError(f"placement must order the axes {', '.join(AXES)} or "
                            f"{', '.join(ORDER_AXES)} (innermost first), as a list or separated "
                            f"by commas, got {self.placement!r}")
        placement = tuple(self.placement) if not isinstance(self.placement, str) else tuple(
            p.strip() for p in self.placement.split(",")
        )
        if ",".join(map(str, placement)) not in _PLACEMENT_NAMES:
            raise PlanError(f"placement must order the axes {', '.join(AXES)} (cp right outside "
                            f"tp) or {', '.join(ORDER_AXES)} (innermost first), got "
                            f"{','.join(map(str, placement))}")
        object.__setattr__(self, "placement", placement)
        self._check_ep_overlap()
        self._check_scatter_gather()
        self._check_deferred_sync()
        self._check_layout()
        self._check_flushes()
        broken = first_broken(self.columns(), None)
        if broken is not None:
            raise PlanError(broken)

    def _check_ep_overlap(self) -> None:
        """ep_comm_overlap as Megatron-Core takes --overlap-moe-expert-parallel-comm: with
        experts over several ranks, without full recompute, and with virtual stages where there
        are several pipeline stages (its combined 1F1B pairs the chunks of two micro-batches)."""
        if not self.ep_comm_overlap:
            return
        if self.ep == 1:
            raise PlanError("ep_comm_overlap overlaps the expert-parallel all-to-alls: it needs "
                            "ep > 1")
        if self.recompute is Recompute.FULL:
            raise PlanError("ep_comm_overlap does not run with recompute full (Megatron-Core "
                            "refuses the pair)")
        if not ep_overlap_runs(self.recompute, self.schedule, self.pp):
            raise PlanError("ep_comm_overlap with pp > 1 needs the interleaved schedule "
                            "(virtual_stages > 1), as Megatron-Core's combined 1F1B does")

    def _check_deferred_sync(self) -> None:
        """defer_grad_sync and fsdp_reshard where FSDP2 runs the micro-batches itself: ZeRO 3
        without a pipeline (torch.distributed.pipelining defers the reduction and keeps the
        stage's units gathered anyway)."""
        if self.fsdp_reshard is not FsdpReshard.FORWARD and (self.zero < 3 or self.pp > 1):
            raise PlanError(f"fsdp_reshard {self.fsdp_reshard.value} keeps FSDP's units "
                            "gathered longer: it needs zero 3 and pp 1 (a pipeline's FSDP keeps "
                            "the stage's units gathered through the step anyway)")
        if self.defer_grad_sync and (self.zero < 3 or self.pp > 1):
            raise PlanError("defer_grad_sync defers FSDP's reduce-scatters to the last "
                            "micro-batch: it needs zero 3 and pp 1 (ZeRO 0-2 reduce once a step, "
                            "and a pipeline's FSDP reduces after the stage's last backward)")
        per_step = max(1, self.dp * self.micro_batch)
        if self.defer_grad_sync and self.global_batch == per_step:
            raise PlanError("defer_grad_sync defers FSDP's reduce-scatters to the last "
                            "micro-batch, and the step has one (global_batch = dp x "
                            "micro_batch): it would change nothing; leave it out")

    def _check_scatter_gather(self) -> None:
        """pp_scatter_gather where Megatron-LM split its sends: between pipeline stages, over
        tensor-parallel ranks (Megatron's 1D layout) that each hold the whole activation."""
        if self.pp_scatter_gather and (self.pp == 1 or self.tp == 1 or self.sequence_parallel
                                       or self.tp_layout is not TPLayout.ONE_D):
            raise PlanError("pp_scatter_gather splits pipeline sends over tp: it needs pp > 1 "
                            "and tp > 1 with tp_layout 1d and without sequence_parallel "
                            "(Megatron-LM sent 1/tp only then)")

    def _check_flushes(self) -> None:
        """pipeline_micro_batches: whole schedules of the step's micro-batches (refused where
        the plan's batch does not divide: checked after the batch rules)."""
        n = self.pipeline_micro_batches
        if not n:
            return
        if self.pp == 1:  # no fill and drain to repeat: it would change nothing
            raise PlanError(f"pipeline_micro_batches ({n}) splits a step into pipeline "
                            "schedules, and the plan has pp 1: give pp > 1, or leave it out")
        m = self.global_batch // max(1, self.dp * self.micro_batch)
        if self.global_batch % max(1, self.dp * self.micro_batch) == 0 and m % n:
            raise PlanError(f"pipeline_micro_batches ({n}) must divide the step's {m} "
                            "micro-batches (global_batch / (dp x micro_batch)): each pipeline "
                            "schedule runs that many")

    @property
    def pipeline_flushes(self) -> int:
        """Pipeline schedules per step (pipeline_micro_batches; 1 where 0)."""
        if not self.pipeline_micro_batches:
            return 1
        return max(1, self.num_micro_batches // self.pipeline_micro_batches)

    def _check_layout(self) -> None:
        """pipeline_layout: a string of Megatron's syntax that gives pp x virtual_stages stages
        (the rules that need no model; perfmodel.pipeline_layout), and not with
        first/last_stage_layers (it gives every stage's)."""
        text = self.pipeline_layout
        if text is None or not isinstance(text, str):
            if text is not None:
                raise PlanError(f"pipeline_layout must be a string (Megatron's "
                                f"--pipeline-model-parallel-layout), got {text!r}")
            text = ""
        object.__setattr__(self, "pipeline_layout", text.strip())
        if not self.pipeline_layout:
            return
        if self.first_stage_layers or self.last_stage_layers:
            raise PlanError("pipeline_layout gives every stage's layers: leave first_stage_layers "
                            "and last_stage_layers unset (0)")
        if self.schedule is Schedule.ZBV:
            raise PlanError("pipeline_layout does not apply to schedule zbv (its V places two "
                            "chunks on every rank in its own order)")
        layout = PipelineLayout.parse(self.pipeline_layout, self.pp)
        if layout.virtual_stages != self.virtual_stages:
            raise PlanError(f"pipeline_layout '{self.pipeline_layout}' has {len(layout.stages)} "
                            f"stages, {layout.virtual_stages} per pipeline rank: give "
                            f"virtual_stages {layout.virtual_stages} (got {self.virtual_stages})")

    @property
    def layout(self) -> PipelineLayout | None:
        """The parsed pipeline_layout, or None."""
        if not self.pipeline_layout:
            return None
        return PipelineLayout.parse(self.pipeline_layout, self.pp)

    @property
    def grid_q(self) -> int:
        """The side q of the tensor-parallel grid (tp for 1d; see PlanColumns.grid_q)."""
        return int(self.columns().grid_q)

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def bucket_params(self) -> int:
        """Parameters per bucket of an overlapped data-parallel sync: dp_bucket_size, else
        Megatron-Core's default over the dp x cp group (perfmodel.step.data_parallel.
        bucket_size, which the step model computes)."""
        return self.dp_bucket_size or max(BUCKET_MIN_PARAMS,
                                          BUCKET_PARAMS_PER_RANK * self.dp * self.cp)

    def columns(self) -> PlanColumns:
        """This plan as one row of plan columns (what the search holds for millions of plans):
        every column of COLUMNS, options as codes; a plan with a pipeline_layout has its first
        and last rank's layers as first/last_stage_layers, and a column pipeline_layout 1 (the
        search has none)."""
        layout = self.layout
        first, last = ((layout.decoder_layers[0], layout.decoder_layers[-1]) if layout
                       else (self.first_stage_layers, self.last_stage_layers))
        return PlanColumns({
            "gpus": self.gpus, "dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp,
            "ep": self.ep, "etp": self.etp, "cp_comm": CP_COMMS.index(self.cp_comm),
            "micro_batch": self.micro_batch, "global_batch": self.global_batch,
            "schedule": SCHEDULES.index(self.schedule), "virtual_stages": self.virtual_stages,
            "recompute": RECOMPUTES.index(self.recompute),
            "sequence_parallel": int(self.sequence_parallel), "zero": self.zero,
            "placement": _PLACEMENT_NAMES.index(",".join(self.placement)),
            "tp_layout": LAYOUTS.index(self.tp_layout), "tp_depth": self.tp_depth,
            "tp_comm_overlap": int(self.tp_comm_overlap),
            "overlap_grad_sync": int(self.overlap_grad_sync),
            "overlap_param_gather": int(self.overlap_param_gather),
            "first_stage_layers": first, "last_stage_layers": last,
            "ep_comm_overlap": int(self.ep_comm_overlap),
            "pipeline_layout": int(layout is not None),
            "pipeline_micro_batches": self.pipeline_micro_batches})

    def check(self, model: TransformerSpec) -> Plan:
        """The rules that need the model; returns self so calls chain."""
        broken = first_broken(self.columns(), model, model_rules_only=True)
        if broken is not None:
            raise PlanError(broken)
        layout = self.layout
        if layout is not None:
            layout.check_model(model.layers, model.mtp_layers)
        missing = modules_missing(self.recompute_modules, model)
        if missing:
            raise PlanError(missing)
        if self.cpu_offload_layers >= model.layers:
            # Transformer Engine asserts num_layers <= model_layers - 1; Megatron-Core refuses
            # cpu_offloading_num_layers >= num_layers
            raise PlanError(f"cpu_offload_layers {self.cpu_offload_layers}: at most "
                            f"{model.layers - 1} of the model's {model.layers} layers can be "
                            "offloaded (one set of activations stays on the GPU)")
        if self.recompute_every > 1 and self.layout is None:
            # torchtitan applies the policy to every N-th layer a rank builds: none where the
            # stage holds fewer than N (the model takes the first stage's share for every stage)
            first = first_stage_holds(model.layers, self.pp, self.first_stage_layers,
                                      self.last_stage_layers)
            if self.recompute_every > first:
                raise PlanError(f"recompute_every {self.recompute_every} exceeds the "
                                f"{first} layers a pipeline stage holds: no layer would "
                                f"recompute (give at most {first}, or recompute none)")
        if self.ep_dispatcher is EPDispatcher.DEEPEP and getattr(model, "capacity_factor",
                                                                 None) is not None:
            raise PlanError("ep_dispatcher deepep is modelled dropless (DeepEP sends the routed "
                            "tokens, no padded capacity buffers): leave the model's "
                            "capacity_factor out, or give ep_dispatcher alltoall")
        return self

    def _check_master_weights(self) -> None:
        """master_weights: one of MASTER_WEIGHTS, for bf16 mixed precision; an fp32 copy or none
        where FSDP2 holds the parameter (zero 3: the fp32 shard is the master), and no remainders
        beside FP8 weights (FusedAdam keeps remainders of bf16 parameters only)."""
        value = self.master_weights
        if value is None or str(value).strip() == "":
            object.__setattr__(self, "master_weights", None)
            return
        text = str(value).strip().lower()
        if text not in MASTER_WEIGHTS:
            raise PlanError(f"master_weights must be one of {', '.join(MASTER_WEIGHTS)}, got "
                            f"'{value}'")
        if self.dtype not in BF16_STATES:
            raise PlanError(f"master_weights applies to bf16 mixed precision (bf16, fp8), not "
                            f"dtype {self.dtype.value}")
        if text == "remainders" and self.zero >= 3:
            raise PlanError("master_weights remainders with zero 3: FSDP2 keeps the fp32 shard "
                            "as the parameter (give master_weights fp32, or zero 0-2)")
        if text == "remainders" and self.fp8_params:
            raise PlanError("master_weights remainders with fp8_params: the remainders complete "
                            "bf16 weights, and these are held in FP8 (give master_weights fp32)")
        if text == "remainders" and self.optimizer_kernels is OptimizerKernels.FOREACH:
            raise PlanError("master_weights remainders with optimizer_kernels foreach: the "
                            "remainders are Transformer Engine's FusedAdam's (give "
                            "optimizer_kernels fused, or master_weights fp32)")
        object.__setattr__(self, "master_weights", text)

    def replace(self, **changes: Any) -> Plan:
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise PlanError(f"unknown plan field(s) {', '.join(unknown)}"
                            f"{suggest(unknown[0], names)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields; those of dtype fp8 only (FP8_FIELDS) are left out of another
        dtype's plan (they do not apply to it), and etp where it is 1, pipeline_layout and
        recompute_modules where none is given, ep_comm_overlap where off, ep_dispatcher where
        alltoall, cross_entropy where unfused, optimizer_kernels where fused, expert_weighting
        where activation,
        defer_grad_sync, bf16_optimizer and expandable_segments where off,
        grad_accumulation_fusion where on,
        tp_backward where not given (the kernels' stack decides), fsdp_reshard where forward,
        pipeline_micro_batches where 0, master_weights where not given, cpu_offload_layers
        where 0, attention_kernel where not given (the plans written before them had no such
        fields)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, StrEnum):
                out[key] = value.value
        out["placement"] = ",".join(self.placement)
        if self.dtype is not Dtype.FP8:
            for key in FP8_FIELDS:
                del out[key]
        if self.etp == 1:
            del out["etp"]
        if not self.pipeline_layout:
            del out["pipeline_layout"]
        if not self.ep_comm_overlap:  # off: as plans were written before it
            del out["ep_comm_overlap"]
        if not self.pp_scatter_gather:  # likewise
            del out["pp_scatter_gather"]
        if not self.defer_grad_sync:  # likewise
            del out["defer_grad_sync"]
        if not self.bf16_optimizer:  # likewise
            del out["bf16_optimizer"]
        if not self.expandable_segments:  # likewise
            del out["expandable_segments"]
        if self.grad_accumulation_fusion:  # likewise (on: Megatron-Core's default)
            del out["grad_accumulation_fusion"]
        if self.tp_backward is None:  # likewise (the kernels' stack decides)
            del out["tp_backward"]
        if self.ep_dispatcher is EPDispatcher.ALLTOALL:  # as plans were written before it
            del out["ep_dispatcher"]
        if self.cross_entropy is CrossEntropy.UNFUSED:  # likewise
            del out["cross_entropy"]
        if self.optimizer_kernels is OptimizerKernels.FUSED:  # likewise
            del out["optimizer_kernels"]
        if self.expert_weighting is ExpertWeighting.ACTIVATION:  # likewise
            del out["expert_weighting"]
        if self.fsdp_reshard is FsdpReshard.FORWARD:  # likewise
            del out["fsdp_reshard"]
        if not self.cpu_offload_layers:  # likewise
            del out["cpu_offload_layers"]
        if self.dp_bucket_size is None:  # likewise: Megatron-Core's default rule
            del out["dp_bucket_size"]
        if self.dp_bucketing is DpBucketing.MEGATRON:  # likewise
            del out["dp_bucketing"]
        if self.attention_kernel is None:  # likewise: the hardware's default kernel
            del out["attention_kernel"]
        if not self.pipeline_micro_batches:
            del out["pipeline_micro_batches"]
        if self.master_weights is None:  # likewise
            del out["master_weights"]
        if self.recompute_modules:
            out["recompute_modules"] = ",".join(self.recompute_modules)
        else:
            del out["recompute_modules"]
        if self.recompute_method is RecomputeMethod.UNIFORM and self.recompute_num_layers == 1:
            del out["recompute_method"], out["recompute_num_layers"]  # as plans were written
        return out


# --- the plan rules, written once ------------------------------------------------------------
# A plan as columns: whole numbers, one per plan (numpy arrays in the search, plain ints for one
# Plan); an option is its position in its enum (SCHEDULES, LAYOUTS, RECOMPUTES, PLACEMENTS: the
# codes of every column of options, from the CLI's choices to the encoder). Plan() and
# Plan.check() apply every rule to one plan and raise the first broken rule's message; the search
# applies them to millions of plans at once (`allowed`), and to the columns it knows while it
# enumerates (partial=True: the rules that read only those columns).

SCHEDULES: tuple[Schedule, ...] = tuple(Schedule)
LAYOUTS: tuple[TPLayout, ...] = tuple(TPLayout)
CP_COMMS: tuple[CPComm, ...] = tuple(CPComm)
RECOMPUTES: tuple[Recompute, ...] = tuple(Recompute)
PLACEMENTS: tuple[Placement, ...] = tuple(Placement)
_PLACEMENT_NAMES = tuple(p.value for p in PLACEMENTS)
# the columns of a plan (Plan.columns, the search's Plans); options as codes
COLUMNS = ("gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "schedule", "virtual_stages",
           "recompute", "sequence_parallel", "zero", "placement", "tp_layout", "tp_depth", "cp",
           "ep", "etp", "cp_comm", "tp_comm_overlap", "overlap_grad_sync", "overlap_param_gather",
           "first_stage_layers", "last_stage_layers", "ep_comm_overlap")
_INTERLEAVED, _ZB, _ZBV = (SCHEDULES.index(s) for s in (Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE,
                                                         Schedule.ZBV))
_1D, _2D, _25D, _3D = range(len(LAYOUTS))
_A2A = CP_COMMS.index(CPComm.A2A)


def _root(n: Any, k: int) -> Any:
    """The whole k-th root of n where there is one, else 0 (elementwise; n below 2**53)."""
    if not isinstance(n, np.ndarray):
        return integer_root(int(n), k) or 0
    r = np.rint(np.cbrt(n) if k == 3 else np.sqrt(n)).astype(np.int64)
    return np.where(r**k == n, r, 0)


def _where(condition: Any, yes: Any, no: Any) -> Any:
    """np.where over arrays; plain Python for one plan of whole numbers (ten times faster)."""
    if any(isinstance(x, np.ndarray) for x in (condition, yes, no)):
        return np.where(condition, yes, no)
    return yes if condition else no


def _nonzero(x: Any) -> Any:
    """x, with 1 for 0 (a divisor where a rule before has refused the plan)."""
    return _where(x > 0, x, 1)


class PlanColumns:
    """Plans as columns (attribute per column) and the quantities the rules derive from them.

    Columns: those of COLUMNS (sequence_parallel 0/1, options as codes). A rule reads only the
    columns it names.
    """

    def __init__(self, columns: Mapping[str, Any]) -> None:
        self.columns = dict(columns)
        self.__dict__.update(self.columns)  # each column an attribute

    def __getattr__(self, name: str) -> Any:  # a column this table lacks (typing: any column)
        raise AttributeError(f"plan column '{name}' not given")

    @functools.cached_property
    def layout_given(self) -> Any:
        """1 where the stages' layers come from a pipeline layout (Plan.pipeline_layout; never
        in the search), else 0."""
        return self.columns.get("pipeline_layout", 0)

    @functools.cached_property
    def micro_batches(self) -> Any:
        """Micro-batches per step: global_batch / (dp micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @functools.cached_property
    def interleaved_rounds_fit(self) -> Any:
        """Whether interleaving can run the micro-batches: Megatron's, one schedule a step, a
        multiple of pp; torch's ScheduleInterleaved1F1B, where a step runs several
        (Plan.pipeline_micro_batches: torchtitan's, NeMo AutoModel's), max(1, m // pp) rounds
        of equal size of one schedule's m (torch 2.13 schedules.py)."""
        m = self.schedule_micro_batches
        torch_rounds = m % _nonzero(m // self.pp) == 0
        return _where(self.columns.get("pipeline_micro_batches", 0) > 0, torch_rounds,
                      self.micro_batches % self.pp == 0)

    @functools.cached_property
    def schedule_micro_batches(self) -> Any:
        """Micro-batches of one pipeline schedule: Plan.pipeline_micro_batches where the step
        runs several (never in the search), else the step's."""
        given = self.columns.get("pipeline_micro_batches", 0)
        return _where(given > 0, given, self.micro_batches)

    @functools.cached_property
    def grid_q(self) -> Any:
        """The side q of the tensor-parallel grid: tp (1d), sqrt(tp) (2d), sqrt(tp / tp_depth)
        (2.5d), cbrt(tp) (3d); 0 where tp makes no such grid."""
        square = _root(self.tp // self.tp_depth, 2) * (self.tp % self.tp_depth == 0)
        return _where(self.tp_layout == _1D, self.tp,
                      _where(self.tp_layout == _3D, _root(self.tp, 3), square))

    @functools.cached_property
    def grid_rows(self) -> Any:
        """The ranks a grid layout splits the samples of a micro-batch over: q tp_depth (2d,
        2.5d), q^2 (3d); 1 for 1d."""
        q = self.grid_q
        return _where(self.tp_layout == _1D, 1,
                      _where(self.tp_layout == _3D, q * q, q * self.tp_depth))

    def name(self, enum: tuple[StrEnum, ...], column: str) -> str:
        """The option of one plan's column, by name."""
        return enum[int(getattr(self, column))].value


@dataclass(frozen=True)
class Rule:
    """A rule every plan obeys: which plans do (elementwise over PlanColumns, with the model when
    `model` is True), and what a plan that does not is told (one line naming the fields)."""

    columns: frozenset[str]
    model: bool
    ok: Callable[[PlanColumns, Any], Any]
    message: Callable[[PlanColumns, Any], str]


def _kv_per_tp_rank(kv_heads: int, tp: int) -> str:
    """The kv heads a tp rank holds, in words: kv_heads / tp, or one (replicated) where tp
    exceeds kv_heads (the Ulysses rule's message)."""
    if tp > kv_heads:
        return f"1: tp ({tp}) exceeds kv_heads ({kv_heads}), each rank holds one, replicated"
    return str(kv_heads // tp)


def _rule(columns: str, ok: Callable[[PlanColumns, Any], Any],
          message: Callable[[PlanColumns, Any], str], model: bool = False) -> Rule:
    return Rule(frozenset(columns.split()), model, ok, message)


def _shared_stages(c: PlanColumns) -> Any:
    """Pipeline stages that split the layers evenly: pp less the first and the last where their
    layers are given (Plan.first_stage_layers, last_stage_layers)."""
    return c.pp - (c.first_stage_layers > 0) - (c.last_stage_layers > 0)


def first_stage_holds(layers: int, pp: int, first: int = 0, last: int = 0) -> int:
    """The layers of the first pipeline stage: `first` where given (Plan.first_stage_layers),
    else its share of what the last stage leaves, as perfmodel.step.context.stage_layers
    splits it."""
    return first or (layers - last) // max(1, pp - (last > 0))


def stage_split(layers: int, pp: int) -> tuple[int, int]:
    """The first and the last pipeline stage's layers (Plan.first_stage_layers,
    last_stage_layers) that split `layers` over pp stages where pp does not divide them, as
    Llama 3 405B's 126 layers ran on 16 stages (Meta, "The Llama 3 Herd of Models", 2024,
    Sec. 3.3.2: one layer fewer on the first and on the last stage): the stages between take
    m = ceil(L / pp) layers each, the first and the last the rest, L - (pp - 2) m, the first the
    larger half (the last holds the output layer and the loss). (0, 0) where pp divides the
    layers (L / pp each), and where that would leave the last stage none (pp too large for L)."""
    if pp < 2 or layers % pp == 0:
        return 0, 0
    middle = -(-layers // pp)
    rest = layers - (pp - 2) * middle
    last = rest // 2
    return (rest - last, last) if last >= 1 else (0, 0)


def _uneven_ok(c: PlanColumns, m: Any) -> Any:
    """An uneven split: each given stage's layers a multiple of virtual_stages, the rest a positive
    multiple of (stages sharing it) x virtual_stages (nothing left when none shares it)."""
    v, k = c.virtual_stages, _shared_stages(c)
    rest = m.layers - c.first_stage_layers - c.last_stage_layers
    shared = _where(k > 0, (rest % _nonzero(k * v) == 0) & (rest >= k * v), rest == 0)
    split = (c.first_stage_layers % v == 0) & (c.last_stage_layers % v == 0) & (rest >= 0) & shared
    return _where(c.layout_given == 1, True, split)  # a layout's own rules: Plan.check


def _uneven_message(c: PlanColumns, m: Any) -> str:
    k, v = _shared_stages(c), c.virtual_stages
    rest = m.layers - c.first_stage_layers - c.last_stage_layers
    return (f"first_stage_layers ({c.first_stage_layers}) and last_stage_layers "
            f"({c.last_stage_layers}) must be multiples of virtual_stages ({v}), and the "
            f"remaining {rest} of the {m.layers} layers a positive multiple of the {k} other "
            f"stages x virtual_stages ({k} x {v}; none left when no other stage shares them)")


def _split_hint(layers: int, pp: int, v: int, mtp: int = 0) -> str:
    """The uneven split that makes pp stages of one chunk each (v = 1) valid, as a hint; with
    several chunks, the pipeline layout that counts the embedding and the loss as layers
    (Megatron-Core's account_for_embedding/loss_in_pipeline_split) where it splits them."""
    first, last = stage_split(layers, pp)
    if v != 1 and pp >= 2:
        try:
            text = accounted_layout(layers, pp, v, embedding=True, loss=True, mtp=mtp)
        except PlanError:
            return ""
        return (f", or give a pipeline layout: the embedding and the loss counted as layers "
                f"(Megatron's account_for_embedding/loss_in_pipeline_split) give "
                f"pipeline_layout '{text}'")
    if v != 1 or not first:
        return ""
    return (f", or split them unevenly: first_stage_layers {first} and last_stage_layers "
            f"{last} leave {-(-layers // pp)} to each other stage")


def _grid_field(field: str) -> Rule:
    """A grid layout splits heads, hidden, ffn_hidden and kv_heads q ways."""
    return _rule("tp tp_layout tp_depth",
                 lambda c, m: (c.tp_layout == _1D) | (c.grid_q == 0)
                 | (getattr(m, field) % _nonzero(c.grid_q) == 0),
                 lambda c, m: f"{field} ({getattr(m, field)}) must be divisible by the grid side q "
                              f"({c.grid_q}) of tp_layout {c.name(LAYOUTS, 'tp_layout')}",
                 model=True)


def _moe(m: Any) -> bool:
    return bool(m.experts)


def _ep_fits(c: PlanColumns, m: Any) -> Any:
    """An ep group is the ep ranks after an expert-tensor group's etp of a stage's tp x cp x dp
    ranks flattened tp inner, then cp, then dp (Megatron-Core, parallel_state.
    initialize_model_parallel: the expert RankGenerator's order "tp-cp-ep-dp-pp" with tp =
    expert_tensor_parallel_size puts ep right outside etp, over the rest of the attention's tp
    ranks first): ep and tp / etp divide one another, and beyond tp / etp, ep / (tp / etp) and
    cp divide one another (each axis's share of the group a whole sub-axis)."""
    rest = _nonzero(c.tp // _nonzero(c.etp))  # the tp ranks beyond one expert-tensor group
    beyond = c.ep // rest  # the group's ranks beyond the tp axis (0: inside it)
    return (((rest % c.ep == 0) | (c.ep % rest == 0))
            & ((beyond <= 1) | (c.cp % _nonzero(beyond) == 0) | (beyond % c.cp == 0)))


def _ep_etp(c: PlanColumns) -> str:
    """ep, or ep x etp where expert tensor parallelism is on, with its values (a refusal's)."""
    return f"ep ({c.ep})" if c.etp == 1 else f"ep x etp ({c.ep} x {c.etp} = {c.ep * c.etp})"


def _tp_rest(c: PlanColumns) -> str:
    """The tp ranks an ep group starts on, with their value: tp, or tp / etp (a refusal's)."""
    return f"tp ({c.tp})" if c.etp == 1 else f"tp / etp ({c.tp} / {c.etp} = {c.tp // c.etp})"


RULES: tuple[Rule, ...] = (
    _rule("gpus dp tp pp cp", lambda c, m: c.dp * c.cp * c.tp * c.pp == c.gpus,
          lambda c, m: f"dp x cp x tp x pp must equal gpus: {c.dp} x {c.cp} x {c.tp} x {c.pp} = "
                       f"{c.dp * c.cp * c.tp * c.pp}, but gpus = {c.gpus}"
          if c.cp > 1 else f"dp x tp x pp must equal gpus: {c.dp} x {c.tp} x {c.pp} = "
                           f"{c.dp * c.tp * c.pp}, but gpus = {c.gpus}"),
    _rule("cp tp_layout", lambda c, m: (c.cp == 1) | (c.tp_layout == _1D),
          lambda c, m: f"context parallelism (cp {c.cp}) is modelled with tp_layout 1d, got "
                       f"tp_layout {c.name(LAYOUTS, 'tp_layout')}"),
    # expert tensor and expert parallelism: Megatron-Core's expert mesh of a pipeline stage is
    # etp x ep x edp = tp x cp x dp, flattened tp inner, then cp, then dp (megatron/core/
    # parallel_state.py, initialize_model_parallel, at d98e8a64ddf34856e74b24714e3bedb2f5a39553:
    # the expert RankGenerator, tp = expert_tensor_parallel_size, order tp-cp-ep-dp-pp,
    # expert_data_parallel_size = world / (etp ep pp)); etp takes the first of the tp ranks
    _rule("etp tp", lambda c, m: c.tp % c.etp == 0,
          lambda c, m: f"etp ({c.etp}) must divide tp ({c.tp}): each expert is split over etp of "
                       "the tensor-parallel ranks"),
    _rule("ep etp tp dp cp", lambda c, m: (c.tp * c.dp * c.cp) % (c.ep * c.etp) == 0,
          lambda c, m: f"{_ep_etp(c)} must divide tp x dp x cp ({c.tp} x {c.dp} x {c.cp} = "
                       f"{c.tp * c.dp * c.cp}): the experts are sharded over a stage's ranks"),
    _rule("ep etp tp cp", _ep_fits,
          lambda c, m: f"ep ({c.ep}) must divide or be divisible by {_tp_rest(c)}, and beyond it "
                       f"ep / {'tp' if c.etp == 1 else '(tp / etp)'} and cp ({c.cp}) must "
                       "divide one another (an ep group is the ranks after etp's of a stage's "
                       "tp x cp x dp ranks, tp inner, then cp)"),
    _rule("global_batch dp micro_batch", lambda c, m: c.global_batch % (c.dp * c.micro_batch) == 0,
          lambda c, m: f"global_batch must be divisible by dp x micro_batch: {c.global_batch} is "
                       f"not a multiple of {c.dp} x {c.micro_batch} = {c.dp * c.micro_batch}"),
    _rule("schedule virtual_stages",
          lambda c, m: (c.schedule != _INTERLEAVED) | (c.virtual_stages >= 2),
          lambda c, m: "schedule interleaved needs virtual_stages >= 2"),
    _rule("schedule pp", lambda c, m: (c.schedule != _INTERLEAVED) | (c.pp >= 2),
          lambda c, m: "schedule interleaved needs pp >= 2"),
    _rule("schedule global_batch dp micro_batch pp",
          lambda c, m: (c.schedule != _INTERLEAVED) | c.interleaved_rounds_fit,
          lambda c, m: f"schedule interleaved needs the number of micro-batches "
                       f"({c.micro_batches}) to be a multiple of pp ({c.pp}): global_batch / "
                       f"(dp x micro_batch) = {c.global_batch} / ({c.dp} x {c.micro_batch}); "
                       f"give a global_batch that is a multiple of dp x micro_batch x pp = "
                       f"{c.dp * c.micro_batch * c.pp} (a Megatron-LM config's "
                       "--global-batch-size and --micro-batch-size: Megatron-Core's interleaved "
                       "1F1B runs other counts only with a "
                       "--microbatch-group-size-per-virtual-pipeline-stage other than pp, which "
                       "perfmodel does not model)"
          if not c.columns.get("pipeline_micro_batches") else
          f"schedule interleaved runs a schedule's micro-batches in rounds of equal size "
          f"(torch's ScheduleInterleaved1F1B): {c.schedule_micro_batches} is not a multiple "
          f"of {max(1, c.schedule_micro_batches // c.pp)} rounds"),
    _rule("schedule pp", lambda c, m: (c.schedule < _ZB) | (c.pp >= 2),
          lambda c, m: f"schedule {c.name(SCHEDULES, 'schedule')} needs pp >= 2"),
    _rule("schedule virtual_stages", lambda c, m: (c.schedule != _ZBV) | (c.virtual_stages == 2),
          lambda c, m: "schedule zbv needs virtual_stages = 2 (two chunks per GPU, V-shape)"),
    _rule("schedule global_batch dp micro_batch pp",
          lambda c, m: (c.schedule < _ZB) | (c.schedule_micro_batches >= c.pp),
          lambda c, m: f"schedule {c.name(SCHEDULES, 'schedule')} needs at least pp ({c.pp}) "
                       f"micro-batches, got {c.schedule_micro_batches}"),
    # torch's ScheduleInterleavedZeroBubble runs m in max(1, m // pp) rounds of equal size (m:
    # one schedule's micro-batches, schedule_micro_batches)
    _rule("schedule global_batch dp micro_batch pp",
          lambda c, m: (c.schedule != _ZB)
          | (c.schedule_micro_batches % _nonzero(c.schedule_micro_batches // c.pp) == 0),
          lambda c, m: f"schedule zb runs the micro-batches in rounds of equal size "
                       f"(torch's ScheduleInterleavedZeroBubble): {c.schedule_micro_batches} "
                       f"is not a multiple of {max(1, c.schedule_micro_batches // c.pp)} "
                       "rounds"),
    _rule("schedule virtual_stages",
          lambda c, m: (c.schedule == _INTERLEAVED) | (c.schedule >= _ZB) | (c.virtual_stages == 1),
          lambda c, m: f"virtual_stages > 1 needs schedule interleaved, zb or zbv, got schedule "
                       f"{c.name(SCHEDULES, 'schedule')}"),
    _rule("sequence_parallel tp", lambda c, m: (c.sequence_parallel == 0) | (c.tp > 1),
          lambda c, m: "sequence_parallel needs tp > 1 (it shards along the tensor-parallel axis)"),
    _rule("tp_layout tp_depth", lambda c, m: (c.tp_layout == _25D) | (c.tp_depth == 1),
          lambda c, m: f"tp_depth > 1 needs tp_layout 2.5d, got tp_layout "
                       f"{c.name(LAYOUTS, 'tp_layout')}"),
    _rule("sequence_parallel tp_layout",
          lambda c, m: (c.sequence_parallel == 0) | (c.tp_layout == _1D),
          lambda c, m: f"sequence_parallel applies to tp_layout 1d only (tp_layout "
                       f"{c.name(LAYOUTS, 'tp_layout')} already distributes every activation)"),
    _rule("tp tp_layout", lambda c, m: (c.tp_layout != _2D) | (_root(c.tp, 2) > 0),
          lambda c, m: f"tp_layout 2d needs tp = q^2 (a square grid), got tp = {c.tp}"),
    _rule("tp tp_layout tp_depth", lambda c, m: (c.tp_layout != _25D) | (c.grid_q > 0),
          lambda c, m: f"tp_layout 2.5d needs tp = q^2 x tp_depth, got tp = {c.tp}, "
                       f"tp_depth = {c.tp_depth}"),
    _rule("tp tp_layout", lambda c, m: (c.tp_layout != _3D) | (_root(c.tp, 3) > 0),
          lambda c, m: f"tp_layout 3d needs tp = q^3 (a cube), got tp = {c.tp}"),
    _rule("micro_batch tp tp_layout tp_depth",
          lambda c, m: (c.grid_q == 0) | (c.micro_batch % _nonzero(c.grid_rows) == 0),
          lambda c, m: f"tp_layout {c.name(LAYOUTS, 'tp_layout')} splits the samples of a "
                       f"micro-batch over {c.grid_rows} ranks: micro_batch ({c.micro_batch}) must "
                       f"be a multiple of {c.grid_rows}"),
    _rule("tp_comm_overlap sequence_parallel",
          lambda c, m: (c.tp_comm_overlap == 0) | (c.sequence_parallel == 1),
          lambda c, m: "tp_comm_overlap needs sequence_parallel (it overlaps sequence "
                       "parallelism's all-gathers and reduce-scatters with the GEMMs)"),
    _rule("overlap_param_gather zero", lambda c, m: (c.overlap_param_gather == 0) | (c.zero >= 1),
          lambda c, m: "overlap_param_gather needs zero >= 1 (a distributed optimizer or FSDP "
                       "gathers the parameters)"),
    _rule("first_stage_layers last_stage_layers pp",
          lambda c, m: (c.first_stage_layers + c.last_stage_layers == 0) | (c.pp >= 2),
          lambda c, m: "first_stage_layers and last_stage_layers need pp >= 2"),
    _rule("first_stage_layers last_stage_layers schedule",
          lambda c, m: (c.first_stage_layers + c.last_stage_layers == 0) | (c.schedule != _ZBV),
          lambda c, m: "first_stage_layers and last_stage_layers do not apply to schedule zbv "
                       "(its V places two chunks on every rank)"),
    # the rules that need the model (Plan.check)
    *(_grid_field(f) for f in ("heads", "hidden", "ffn_hidden", "kv_heads")),
    _rule("tp tp_layout", lambda c, m: (c.tp_layout != _1D) | (m.heads % c.tp == 0),
          lambda c, m: f"heads ({m.heads}) must be divisible by tp ({c.tp})", model=True),
    # Megatron-Core divides num_query_groups by tp (attention.py: divide() asserts) and
    # torchtitan its n_kv_heads: no training stack here replicates key/value heads over tp
    _rule("tp tp_layout",
          lambda c, m: (c.tp_layout != _1D) | (m.kv_heads % c.tp == 0),
          lambda c, m: f"kv_heads ({m.kv_heads}) must be divisible by tp ({c.tp}): Megatron-Core "
                       "and torchtitan split the key/value heads over tp, none replicates them",
          model=True),
    _rule("tp tp_layout", lambda c, m: (c.tp_layout != _1D) | (m.ffn_hidden % c.tp == 0),
          lambda c, m: f"ffn_hidden ({m.ffn_hidden}) must be divisible by tp ({c.tp})", model=True),
    _rule("pp virtual_stages first_stage_layers last_stage_layers",
          lambda c, m: _where(c.first_stage_layers + c.last_stage_layers == 0,
                              m.layers % (c.pp * c.virtual_stages) == 0, _uneven_ok(c, m)),
          lambda c, m: f"layers ({m.layers}) must be divisible by pp x virtual_stages "
                       f"({c.pp} x {c.virtual_stages} = {c.pp * c.virtual_stages})"
                       + _split_hint(m.layers, int(c.pp), int(c.virtual_stages),
                                     int(m.mtp_layers))
          if c.first_stage_layers + c.last_stage_layers == 0 else _uneven_message(c, m),
          model=True),
    # each cp rank's s / cp tokens are split over tp (Megatron-Core's sequence-parallel scatter
    # asserts that they divide)
    _rule("sequence_parallel tp cp",
          lambda c, m: (c.sequence_parallel == 0) | (m.seq_len % (c.tp * c.cp) == 0),
          lambda c, m: f"seq_len ({m.seq_len}) must be divisible by tp ({c.tp}) for "
                       "sequence_parallel" if c.cp == 1 else
                       f"seq_len ({m.seq_len}) must be divisible by tp x cp ({c.tp} x {c.cp} = "
                       f"{c.tp * c.cp}) for sequence_parallel: each cp rank's seq_len / cp "
                       "tokens are split over tp", model=True),
    # context parallelism (Megatron-Core: load-balanced causal chunks, 2 cp of them)
    _rule("cp", lambda c, m: (c.cp == 1) | (m.seq_len % (2 * c.cp) == 0),
          lambda c, m: f"seq_len ({m.seq_len}) must be divisible by 2 cp ({2 * c.cp}): each cp "
                       "rank holds two load-balanced chunks of every sequence", model=True),
    _rule("cp", lambda c, m: (c.cp == 1) | (m.windowed_share == 0),
          lambda c, m: f"context parallelism (cp {c.cp}) with sliding-window attention is not "
                       "modelled (the ring skips the chunks outside the window)", model=True),
    _rule("cp cp_comm tp",
          lambda c, m: (c.cp == 1) | (c.cp_comm != _A2A)
          | (((m.heads // c.tp) % c.cp == 0) & (np.maximum(1, m.kv_heads // c.tp) % c.cp == 0)),
          lambda c, m: f"cp_comm a2a (Ulysses) needs heads / tp ({m.heads // c.tp}) and the kv "
                       f"heads a tp rank holds ({_kv_per_tp_rank(m.kv_heads, c.tp)}) divisible "
                       f"by cp ({c.cp})", model=True),
    # a mixture of experts
    _rule("ep", lambda c, m: (c.ep == 1) | _moe(m),
          lambda c, m: f"ep ({c.ep}) applies to a mixture-of-experts model: the model has no "
                       "experts", model=True),
    _rule("etp", lambda c, m: (c.etp == 1) | _moe(m),
          lambda c, m: f"etp ({c.etp}) applies to a mixture-of-experts model: the model has no "
                       "experts", model=True),
    _rule("etp", lambda c, m: not _moe(m) or m.expert_ffn_hidden % c.etp == 0,
          lambda c, m: f"expert_ffn_hidden ({m.expert_ffn_hidden}) must be divisible by etp "
                       f"({c.etp}): each expert's FFN is split over etp ranks", model=True),
    _rule("etp", lambda c, m: (c.etp == 1) | (not (_moe(m) and m.bias)),
          lambda c, m: f"etp ({c.etp}) with a model with biases (bias true) is not "
                       "supported: Megatron-Core's TransformerConfig allows a bias in MoE only "
                       "with etp 1; give etp 1 or bias false", model=True),
    _rule("ep", lambda c, m: not _moe(m) or m.experts % c.ep == 0,
          lambda c, m: f"ep ({c.ep}) must divide the experts ({m.experts})", model=True),
    _rule("tp_layout", lambda c, m: not _moe(m) or c.tp_layout == _1D,
          lambda c, m: f"a mixture of experts is modelled with tp_layout 1d, got tp_layout "
                       f"{c.name(LAYOUTS, 'tp_layout')}", model=True),
    _rule("tp_layout", lambda c, m: m.kv_lora_rank is None or c.tp_layout == _1D,
          lambda c, m: f"multi-head latent attention (MLA) is modelled with tp_layout 1d, got "
                       f"tp_layout {c.name(LAYOUTS, 'tp_layout')}", model=True),
    _rule("tp sequence_parallel",
          lambda c, m: (not _moe(m)) | (c.tp == 1) | (c.sequence_parallel == 1),
          lambda c, m: f"a mixture of experts with tp > 1 ({c.tp}) needs sequence_parallel "
                       "(Megatron-Core requires it: each rank routes its own tokens)", model=True),
)


_WITHOUT_MODEL = tuple(r for r in RULES if not r.model)
_OF_MODEL = tuple(r for r in RULES if r.model)


def _applied(model: Any, known: set[str] | None,
             model_rules_only: bool = False) -> tuple[Rule, ...]:
    rules = _OF_MODEL if model_rules_only else RULES if model is not None else _WITHOUT_MODEL
    return rules if known is None else tuple(r for r in rules if r.columns <= known)


def allowed(plans: PlanColumns, model: TransformerSpec | None, *, partial: bool = False) -> Any:
    """Which plans obey every rule (a boolean array, broadcast from the columns: a column that is
    one number holds for every plan): the rules that need the model only when it is given; with
    partial=True only the rules whose columns `plans` has."""
    known = set(plans.columns) if partial else None
    mask: Any = True
    for rule in _applied(model, known):
        mask = mask & rule.ok(plans, model)
    shape = np.broadcast_shapes(*(np.shape(v) for v in plans.columns.values()))
    return np.broadcast_to(np.asarray(mask, dtype=bool), shape)


RULE_COLUMNS = frozenset().union(*(r.columns for r in RULES))  # the plan columns a rule reads


def first_broken(plan: PlanColumns, model: TransformerSpec | None, *,
                 model_rules_only: bool = False) -> str | None:
    """The message of the first rule one plan (columns of whole numbers) breaks, or None."""
    for rule in _applied(model, None, model_rules_only):
        if not rule.ok(plan, model):
            return rule.message(plan, model)
    return None


keyword_fields(Plan, PlanError, "plan")
PLAN_FIELDS = [f.name for f in dataclasses.fields(Plan)]
FP8_FIELDS = ("fp8_recipe", "fp8_output_layer", "fp8_params")  # fields of dtype fp8 only


def sync_ranks(plan: Plan, model: Any) -> int:
    """The most ranks a gradient of the plan is reduced (and, under ZeRO, a weight gathered)
    over: dp x cp, and for a mixture of experts the expert-data-parallel group's tp dp cp /
    (ep etp) (perfmodel.step.data_parallel: replicas, expert_replicas). 1: the plan has no
    gradient sync and no parameter gather (overlap_grad_sync and overlap_param_gather have
    nothing to overlap)."""
    ranks = plan.dp * plan.cp
    if getattr(model, "experts", 0):
        ranks = max(ranks, plan.tp * plan.dp * plan.cp // (plan.ep * plan.etp))
    return ranks


def derived_dp(gpus: int, tp: int, pp: int, cp: int) -> int | None:
    """The data-parallel degree a GPU count leaves to the other degrees, gpus / (tp x pp x cp),
    as Megatron-LM derives it from the world size; None where they do not divide it."""
    rest = tp * pp * cp
    return gpus // rest if rest >= 1 and gpus % rest == 0 else None


def fields_given(plan: Plan, names: Iterable[str] | None = None) -> set[str]:
    """The fields among `names` (a mapping's keys, read into `plan` by plan_from_dict, or a
    --batch row's cells; None: every field) that `plan` sets to other than Plan's defaults: what
    perfmodel.idle takes as asked for. A field at its default asks for nothing: a plan's own
    to_dict (predict --json's "plan") writes cp_comm p2p with cp 1 and recompute_every 1 without
    recompute, and read back it is the same plan; a value other than the default where it
    changes nothing is refused."""
    defaults = {f.name: f.default for f in dataclasses.fields(Plan)}
    defaults["kernels"] = default_kernels(plan.stack)  # not given: the stack's
    return {k for k in (defaults if names is None else names)
            if k in defaults and getattr(plan, k) != defaults[k]}


def plan_from_dict(data: dict[str, Any]) -> Plan:
    """A Plan from a mapping of its fields (a plan's to_dict, predict --json's "plan", a
    config's): every field checked as Plan checks it (a degree that is not a whole number, None,
    NaN or a list is a PlanError naming it, never Python's own error); gpus, where not given, is
    dp x tp x pp x cp; kernels, where not given, the stack's."""
    unknown = [k for k in data if k not in PLAN_FIELDS]
    if unknown:
        raise PlanError(f"unknown plan field '{unknown[0]}'{suggest(str(unknown[0]), PLAN_FIELDS)}"
                        f"; allowed: {', '.join(PLAN_FIELDS)}")
    if data.get("kernels") is None:  # not given: the stack's (Inductor's under torch.compile)
        data = {**data, "kernels": default_kernels(data.get("stack") or Stack.EAGER)}
    if "gpus" not in data:  # each degree checked as Plan checks it before it is multiplied
        degrees = [_positive_int(plain(data.get(k, 1)), k) for k in ("dp", "tp", "pp", "cp")]
        data = {**data, "gpus": degrees[0] * degrees[1] * degrees[2] * degrees[3]}
    return Plan(**data)
