"""Megatron-LM: a `pretrain_gpt.py` argument list (a file of arguments, or a shell script that
launches pretrain_gpt.py with torchrun or python) read as a model and a plan, and a plan written
as one.

Option names, defaults and rules are Megatron-LM's (megatron/training/arguments.py and
megatron/core/transformer/transformer_config.py at NVIDIA/Megatron-LM commit d98e8a64, 2026-08):
  - --ffn-hidden-size defaults to 4 h, or int(4 h 2/3 / 64) 64 with --swiglu;
  - --num-query-groups applies with --group-query-attention (default 1), else kv heads = heads;
  - --disable-bias-linear turns off every linear bias; --add-bias-linear implies --add-qkv-bias;
  - the vocabulary is padded to a multiple of --make-vocab-size-divisible-by (128) x tp
    (megatron/core/tokenizers/utils/build_tokenizer.py, vocab_size_with_padding);
  - --global-batch-size defaults to micro-batch x data-parallel size;
  - --sequence-parallel is switched off when tp = 1;
  - --recompute-activations is --recompute-granularity selective (the core attention,
    --recompute-modules core_attn); full needs --recompute-method;
  - --use-distributed-optimizer shards the optimizer states (and fp32 main weights) over the
    data-parallel ranks, reduce-scattering gradients and all-gathering weights: ZeRO stage 1;
  - the rank order is tp, cp, ep, dp, pp from the innermost (--use-tp-pp-dp-mapping: tp, pp, dp);
  - older scripts (2021-23): --checkpoint-activations (chunks of --checkpoint-num-layers) and
    --activations-checkpoint-method/-num-layers are today's full recompute, their era's pipeline
    sends scatter-gathered over tp (--no-scatter-gather-tensors-in-pipeline: whole), --DDP-impl
    local (no overlap) or torch (the reduce during the backward);
  - --attention-backend defaults to auto (Transformer Engine's fused or flash attention where the
    device runs one for the dtype, bf16 and fp16; its unfused attention elsewhere): left to the
    hardware (Plan.flash_attention None);
  - --use-rotary-position-embeddings sets --position-embedding-type rope; --no-position-embedding
    raises unless the type is rope;
  - --step-batch-size-schedule steps the global batch up (megatron/core/
    num_microbatches_calculator.py; Megatron-LM raises beside --global-batch-size: read where the
    two agree on the last batch);
  - --transformer-impl local builds Megatron-Core's local layers, whose DotProductAttention is
    unfused (gpt_builders.py, megatron/core/models/backends.py); --use-legacy-models with it the
    legacy model's, flash attention only under --use-flash-attn;
  - multi-head latent attention's query and key/value projections have no biases whatever
    --add-bias-linear says (megatron/core/transformer/multi_latent_attention.py);
  - an option Megatron-LM registers (megatron_options.MEGATRON_LM_OPTIONS) is never taken for a
    misspelling: one not read is listed as not read; the options of architectures perfmodel
    does not cost (experimental attention variants, hybrid Mamba stacks, ...) are refused.
The world size is the launcher's: torchrun's --nnodes x --nproc-per-node (python -m
torch.distributed.run and .launch alike), what deepspeed's runner options fix, or perfmodel's
--gpus.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfmodel.configs import megatron_deepspeed
from perfmodel.configs.job import (
    CAPACITY,
    Framework,
    JobConfig,
    allocator_export,
    capacity,
    capacity_balancing,
    refuse_plan,
    refuse_spec,
    typo,
    whole,
)
from perfmodel.configs.megatron_options import MEGATRON_LM_OPTIONS
from perfmodel.configs.shell import DEFAULTED, Launch, argument_words, launch_command
from perfmodel.costs.precision import default_master, megatron_master_weights
from perfmodel.errors import PlanError, SpecError
from perfmodel.pipeline_layout import PipelineLayout, accounted_layout
from perfmodel.specs.loading import number
from perfmodel.strategy import parse_recompute_modules

SCRIPTS = ("pretrain_gpt.py",)
DEFAULT_VOCAB_MULTIPLE = 128  # --make-vocab-size-divisible-by's default
GPT2_VOCAB = 50257  # GPT2BPETokenizer's vocabulary (gpt2-vocab.json)

# Megatron-LM's switches that turn a fused kernel off (store_false, arguments.py at d98e8a64),
# read as the TransformerConfig field they set false (_fusions)
NEGATED = {"no-rope-fusion": "apply_rope_fusion", "no-bias-swiglu-fusion": "bias_swiglu_fusion",
           "no-bias-gelu-fusion": "bias_gelu_fusion", "no-bias-dropout-fusion":
           "bias_dropout_fusion", "no-masked-softmax-fusion": "masked_softmax_fusion",
           "no-scaled-masked-softmax-fusion": "masked_softmax_fusion",
           "no-gradient-accumulation-fusion": "gradient_accumulation_fusion",
           # store_false since 2023-10-12 (NVIDIA/Megatron-LM 4eeff55d1f, "Make overlap_p2p_comm
           # the default"): the interleaved schedule's sends overlapped unless it is given
           "no-overlap-p2p-communication": "overlap_p2p_comm"}
# options whose dest is not their name with '_' for '-' (Megatron-LM's add_argument dest=...):
# --overlap-p2p-communication, store_true from 2023-05-31 (f9283c5a8a) to 2023-10-12
DESTS = {"overlap_p2p_communication": "overlap_p2p_comm"}
# options perfmodel reads: name -> number of values (0: a flag; -1: one or more)
READ_OPTIONS: dict[str, int] = {
    **dict.fromkeys((
        "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups",
        "num-key-value-heads",
        "kv-channels", "seq-length", "max-position-embeddings", "vocab-size",
        "make-vocab-size-divisible-by", "tokenizer-type", "micro-batch-size",
        "global-batch-size", "tensor-model-parallel-size", "pipeline-model-parallel-size",
        "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
        "context-parallel-size", "expert-model-parallel-size",
        "expert-tensor-parallel-size",
        "moe-router-topk", "moe-ffn-hidden-size",
        "moe-shared-expert-intermediate-size", "moe-layer-freq", "moe-token-dispatcher-type",
        "moe-flex-dispatcher-backend", "moe-router-num-groups", "moe-router-group-topk",
        "moe-expert-capacity-factor", "moe-token-drop-policy", "moe-latent-size",
        "moe-expert-rank-capacity-factor",
        "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim",
        "fp8-format", "fp8-recipe", "fp4-format",
        "recompute-granularity", "recompute-method", "recompute-num-layers", "normalization",
        "position-embedding-type", "rotary-percent", "attention-backend", "hidden-dropout",
        "attention-dropout",
        "data-parallel-sharding-strategy", "pipeline-model-parallel-layout",
        "num-layers-in-first-pipeline-stage", "num-layers-in-last-pipeline-stage",
        "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "mtp-num-layers",
        "optimizer", "transformer-impl", "window-size", "tokenizer-model", "vocab-file",
        "cpu-offloading-num-layers", "main-grads-dtype", "main-params-dtype",
        "exp-avg-dtype", "exp-avg-sq-dtype", "cross-entropy-fusion-impl",
        "activation-func-clamp-value", "num-layers-at-start-in-bf16",
        "num-layers-at-end-in-bf16", "microbatch-group-size-per-virtual-pipeline-stage",
        "num-distributed-optimizer-instances", "tp-comm-overlap-cfg", "softmax-type",
        "window-attn-skip-freq", "ddp-bucket-size"), 1),
    **dict.fromkeys(("checkpoint-num-layers", "activations-checkpoint-method",
                     "activations-checkpoint-num-layers", "DDP-impl"), 1),
    # --num-experts: one or more numbers (Megatron-DeepSpeed's, one per MoE layer)
    # --cp-comm-type: one or one per layer (Megatron-LM's nargs='+')
    **dict.fromkeys(("recompute-modules", "cuda-graph-modules", "cuda-graph-scope",
                     "num-experts", "cp-comm-type", "hierarchical-context-parallel-sizes"), -1),
    "cuda-graph-impl": 1,
    "rampup-batch-size": 3,
    "step-batch-size-schedule": 1,
    **dict.fromkeys((
        "group-query-attention", "sequence-parallel", "bf16", "fp16", "use-distributed-optimizer",
        "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap", "use-flash-attn",
        "swiglu", "untie-embeddings-and-output-weights", "disable-bias-linear", "add-bias-linear",
        "add-qkv-bias", "recompute-activations", "distribute-saved-activations",
        "use-torch-fsdp2", "use-megatron-fsdp", "use-custom-fsdp", "grad-reduce-in-bf16",
        "use-tp-pp-dp-mapping", "multi-latent-attention", "cpu-offloading",
        "cross-entropy-loss-fusion",
        "optimizer-cpu-offload", "fine-grained-activation-offloading",
        "account-for-embedding-in-pipeline-split",
        "account-for-loss-in-pipeline-split", "squared-relu", "quick-geglu", "use-legacy-models",
        "use-mcore-models", "mock-data", "no-position-embedding", "fp8-param-gather",
        "use-rotary-position-embeddings", "first-last-layers-bf16",
        "reuse-grad-buf-for-mxfp8-param-ag",
        "use-precision-aware-optimizer", "no-store-param-remainders", "store-param-remainders",
        "checkpoint-activations", "distribute-checkpointed-activations",
        "no-scatter-gather-tensors-in-pipeline", "moe-grouped-gemm",
        "overlap-moe-expert-parallel-comm", "moe-enable-deepep", "enable-cuda-graph",
        "moe-pad-expert-input-to-capacity", "moe-layer-recompute", "moe-shared-expert-overlap",
        "moe-apply-probs-on-input",
        "external-cuda-graph", "qk-layernorm", "fp32-residual-connection",
        "accumulate-allreduce-grads-in-fp32", "torch-fsdp2-no-reshard-after-forward",
        "fp4-param-gather", "qk-l2-norm", "overlap-p2p-communication", *NEGATED), 0),
    **megatron_deepspeed.OPTIONS,
    **megatron_deepspeed.MOE_OPTIONS,
}

# options that do not change the step's time or memory, by kind (a prefix ending in '-' names
# every option starting with it)
_IGNORED_KINDS = {
    "Megatron-DeepSpeed's data, logging or safety switches (not the step)":
        megatron_deepspeed.IGNORED,
    "an optimizer hyperparameter (the step's cost is Adam's whatever its rates)": (
        "lr", "lr-", "min-lr", "weight-decay", "start-weight-decay", "end-weight-decay",
        "weight-decay-incr-style", "adam-", "sgd-momentum", "clip-grad", "decoupled-lr",
        "decoupled-min-lr", "init-method-std", "init-method-xavier-uniform", "seed",
        "loss-scale", "initial-loss-scale", "min-loss-scale", "loss-scale-window",
        "hysteresis", "override-opt_param-scheduler", "override-lr-scheduler",
        "use-checkpoint-opt_param-scheduler", "use-checkpoint-lr-scheduler"),
    "the run's length, data or tokenizer files (not its step)": (
        "train-iters", "train-samples", "exit-", "data-path", "train-data-path",
        "valid-data-path", "test-data-path", "split", "merge-file", "data-cache-path",
        "num-workers", "tiktoken-pattern", "no-mmap-bin-files", "mmap-bin-files",
        "no-create-attention-mask-in-dataloader", "dataloader-type", "eod-mask-loss",
        "reset-position-ids", "reset-attention-mask", "per-split-data-args-path",
        "data-args-path", "tokenizer-prompt-format", "skip-train", "full-validation",
        "object-storage-cache-path", "mid-level-dataset-surplus", "data-impl", "mmap-warmup"),
    "logging, checkpointing, evaluation or profiling": (
        "log-", "save", "save-", "load", "no-load-", "eval-", "tensorboard-", "wandb-", "ckpt-",
        "profile", "profile-", "timing-log-", "distributed-timeout-minutes", "async-save",
        "use-dist-ckpt", "auto-detect-ckpt-format", "non-persistent-", "finetune",
        "pretrained-checkpoint", "no-save-", "use-checkpoint-args", "record-memory-history",
        "memory-snapshot-path", "logging-level", "straggler-", "check-for-", "no-check-for-",
        "rerun-mode", "enable-ft-package", "one-logger-", "result-rejected-tracker-filename",
        "use-pytorch-profiler", "tensorboard-dir", "dist-ckpt-", "no-ckpt-",
        "use-persistent-ckpt-worker", "moe-per-layer-logging"),
    # megatron/core/distributed/finalize_model_grads.py and distributed_data_parallel.py at
    # d98e8a64: without it DDP scales each bucket by 1/dp before the reduction, with it the
    # gradients are divided by the global batch's token count after it (scale_gradients)
    "per-token loss normalisation: one scaling pass over the gradient buffers either way (1/dp "
    "before the reduction, or 1/tokens after it) and a scalar all-reduce: the same cost": (
        "calculate-per-token-loss",),
    # megatron/training/training.py at d98e8a64: gc.disable() at start, gc.collect() every
    # --manual-gc-interval steps (0: never)
    "Python's garbage collection on the host (automatic collection off, a full one every "
    "--manual-gc-interval steps): not the device's step": ("manual-gc", "manual-gc-"),
    "numerics or initialization with the same cost": (
        "rotary-", "rope-scaling", "rope-scaling-factor", "apply-layernorm-1p",
        "norm-epsilon", "layernorm-epsilon", "attention-softmax-in-fp32",
        "apply-query-key-layer-scaling",
        "apply-residual-connection-post-layernorm", "no-persist-layer-norm", "yarn-",
        "untie-embeddings-and-output-weights-init", "bias-swiglu-fusion",
        "no-async-tensor-model-"
        "parallel-allreduce", "use-cpu-initialization", "no-initialization",
        "disable-tp-comm-split-ag", "disable-tp-comm-split-rs",
        "ddp-average-in-collective", "distributed-backend", "local-rank", "lazy-mpu-init",
        "use-ring-exchange-p2p",
        "barrier-with-L1-time", "no-barrier-with-level-1-timing", "high-priority-stream-groups",
        "moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-z-loss-coeff",
        "moe-router-dtype", "moe-router-quantile-balancing-ema", "no-query-key-layer-scaling",
        "no-contiguous-buffers-in-local-ddp", "use-contiguous-buffers-in-ddp", "mscale",
        "mscale-all-dim", "mtp-loss-scaling-factor"),
    # Megatron-Core's router and token permutation (megatron/core/transformer/moe/router.py,
    # moe_utils.py at d98e8a64): softmax, sigmoid or pre-softmax scores, a top-k scaling, the
    # aux-loss-free expert bias and fused kernels read and write the same tokens x experts
    # scores and permuted rows, which perfmodel.costs.moe costs by those bytes
    "the router's scoring: one element-wise pass over tokens x experts, costed alike "
    "(perfmodel.costs.moe)": (
        "moe-router-score-function", "moe-router-pre-softmax", "moe-router-topk-scaling-factor",
        "moe-router-enable-expert-bias", "moe-router-bias-update-rate", "moe-router-fusion"),
    "the fused permutation kernel: the same rows moved to the experts and back, costed by "
    "their bytes (perfmodel.costs.moe)": ("moe-permute-fusion", "moe-permute-fusion-into-hybridep"),
    # Transformer Engine's GroupedTensor path and the GLUs' block-interleaved layout
    # (transformer_config.py at d98e8a64): the same expert GEMMs, stored or laid out otherwise
    "the experts' weights stored or laid out otherwise: the same grouped GEMMs (perfmodel's "
    "grouped-GEMM efficiency)": (
        "moe-use-grouped-tensor", "moe-single-grouped-weight", "moe-single-grouped-bias",
        "moe-mlp-glu-interleave-size", "moe-shared-expert-glu-interleave-size"),
    "inference only (decode's padded experts for CUDA graphs), not the training step": (
        "moe-pad-experts-for-cuda-graph-inference",),
    "balanced routing (a benchmark's): perfmodel's routing is even unless the model's "
    "routing_imbalance says otherwise": ("moe-router-force-load-balancing",),
    "FP8 delayed scaling's amax history (a few scalars a tensor, their reduction): the same "
    "FP8 GEMMs": ("fp8-amax-history-len", "fp8-amax-compute-algo", "fp8-margin"),
    "unlocks Megatron-Core's experimental features, each turned on by its own option (read "
    "or named on its own)": ("enable-experimental",),
}


def _is_zero(value: Any) -> bool:
    """Whether an option's value is the number 0 (as argparse's float reads it: 0, 0.0, 0e0)."""
    try:
        return float(str(value)) == 0
    except ValueError:
        return False


# Options read and named, whose cost in every step perfmodel does not model: said in a note as
# not modelled, never listed as leaving the step as it is (megatron/training/training.py and
# arguments.py at d98e8a64dd)
UNMODELLED_COSTS = {
    "deterministic-mode": "deterministic algorithms (torch.use_deterministic_algorithms; "
                          "Transformer Engine's deterministic attention backward under "
                          "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0; one NCCL algorithm): their "
                          "slowdown is not modelled",
    "log-params-norm": "the parameters' norm every logged step (a pass over them and an "
                       "all-reduce) is not modelled",
    "log-num-zeros-in-grad": "the gradients' zeros counted every step (a pass over them and "
                             "an all-reduce) are not modelled",
    "empty-unused-memory-level": "torch.cuda.empty_cache() every step (the allocator's cached "
                                 "blocks freed and allocated again) is not modelled",
    # Megatron-Core's router and shared experts (megatron/core/transformer/moe/router.py
    # apply_input_jitter, shared_experts.py gate_weight, at d98e8a64)
    "moe-input-jitter-eps": "the router's input multiplied by uniform noise (a pass over each "
                            "MoE layer's tokens x hidden, forward) is not modelled",
    "moe-shared-expert-gate": "the shared expert's sigmoid gate (a hidden x 1 projection and a "
                              "pass over its output) is not modelled",
}


# Megatron-LM's options of model features perfmodel does not cost (megatron/core/transformer/
# transformer_config.py and megatron/training/arguments.py at d98e8a64: TransformerConfig's
# experimental attention variants, linear attention, DeepSeek sparse attention, the attention
# output gate, hybrid Mamba / Gated DeltaProduct stacks, heterogeneous layers, mHC residual
# streams), refused where given: an argument list with them is written for that architecture.
# A prefix ending in '-' names every option starting with it.
_UNCOSTED_ARCHITECTURE = {
    "Megatron-Core's experimental attention variants (gdn, gdn2, gated_delta_net: Gated "
    "DeltaNet's linear attention; dsa: DeepSeek sparse attention) are not modelled (perfmodel "
    "costs softmax attention)": ("experimental-attention-variant",),
    "Gated DeltaNet's linear attention layers (--experimental-attention-variant gated_delta_net) "
    "are not modelled": (
        "linear-attention-freq", "linear-conv-kernel-dim", "linear-key-head-dim",
        "linear-value-head-dim", "linear-num-key-heads", "linear-num-value-heads"),
    "DeepSeek sparse attention's indexer (--experimental-attention-variant dsa) is not "
    "modelled": ("dsa-", "disable-dsa-", "no-dsa-"),
    "a gate on each attention output (a sigmoid of a projection of the layer's input) is not "
    "modelled": ("attention-output-gate",),
    "a hybrid model's Mamba and Gated DeltaProduct layers are not modelled (perfmodel costs "
    "transformer layers: attention and MLP)": (
        "hybrid-layer-pattern", "hybrid-override-pattern", "mtp-hybrid-override-pattern",
        "is-hybrid-model", "mamba-state-dim", "mamba-head-dim", "mamba-num-groups",
        "mamba-num-heads", "mamba-training-ssm-states-dtype", "disable-mamba-mem-eff-path",
        "gdp-"),
    "layers of different configurations (a heterogeneous model's per-layer config) are not "
    "modelled": ("heterogeneous-layers-config-path", "heterogeneous-layers-config-encoded-json"),
    "mHC's hyper-connections (several residual streams mixed at each layer) are not "
    "modelled": ("enable-mhc-connections", "mhc-"),
}


def uncosted_architecture(name: str) -> str | None:
    """Why perfmodel refuses a Megatron-LM option of a model feature it does not cost, or None."""
    for reason, names in _UNCOSTED_ARCHITECTURE.items():
        if any(name == n or (n.endswith("-") and name.startswith(n)) for n in names):
            return reason
    return None


def ignored_reason(name: str) -> str | None:
    for reason, names in _IGNORED_KINDS.items():
        for n in names:
            if name == n or (n.endswith("-") and name.startswith(n)):
                return reason
    return None


def is_script(word: str) -> bool:
    return word.rsplit("/", 1)[-1] in SCRIPTS


# --- reading ------------------------------------------------------------------------------------


def parse_words(launch: Launch, where: str, job: JobConfig) -> dict[str, tuple[str, Any]]:
    """The arguments as {dest: (option as written, value)}: flags True, others their words
    (a list for options of several values). Options perfmodel does not read are recorded in job
    (ignored with a reason, or unknown); a repeated option keeps its last value, as argparse."""
    out: dict[str, tuple[str, Any]] = {}
    words, i = launch.args, 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            reason = launch.reason(word)
            if reason:
                raise SpecError(f"{where}: the arguments {launch.shown(word)} cannot be read: "
                                f"{reason.split(': ', 1)[1]}; give them literally")
            job.strange(word, None, "a word that is no option's value")
            i += 1
            continue
        name, equals, inline = word[2:].partition("=")
        arity = READ_OPTIONS.get(name)
        if arity == 0 and equals:  # argparse: "ignored explicit argument", the job never starts
            raise SpecError(f"{where}: {launch.shown(word)}: --{name} is a switch and takes no "
                            f"value (Megatron-LM's argparse refuses it): give --{name} alone, "
                            "or leave it out for off")
        reason = ignored_reason(name) if arity is None else None
        values: list[str] = [inline] if inline else []
        i += 1
        if arity is None or arity != 0:
            while i < len(words) and not words[i].startswith("--") and (
                    arity is None or arity < 0 or len(values) < arity):
                if arity is None and launch.bare(words[i]) and (values or not reason):
                    # a word that is an unreadable variable may stand for options (`$WANDB_ARGS
                    # $ds_args`): where the option's number of values is not known it is no
                    # value of it, and is refused below, but the first of an option ignored for
                    # what it is (`--save $1`, `--data-path $DATA`)
                    break
                values.append(words[i])
                i += 1
        if arity is None:
            shown: Any = " ".join(launch.shown(v) for v in values) or True
            if name in UNMODELLED_COSTS:
                off = name == "empty-unused-memory-level" and str(shown).strip() == "0"
                if off:  # level 0, Megatron-LM's default: no empty_cache
                    job.skipped(word.partition("=")[0], shown, "level 0: no empty_cache")
                else:
                    job.notes.append(f"--{name}{'' if shown is True else ' ' + str(shown)}: "
                                     f"{UNMODELLED_COSTS[name]}")
                continue
            if name == "clip-grad" and _is_zero(shown):
                # Megatron-Core's optimizer clips only where clip_grad > 0 (its norm: a pass
                # over the gradients), which perfmodel's step always counts
                job.notes.append("--clip-grad 0: no gradient clipping; perfmodel's optimizer "
                                 "step counts the clipping's read of the gradients anyway "
                                 "(perfmodel.costs.precision)")
                continue
            if reason:
                job.skipped(word.partition("=")[0], shown, reason)
                continue
            architecture = uncosted_architecture(name)
            if architecture:
                raise refuse_spec(where, f"--{name}", shown, architecture)
            close = typo(name, READ_OPTIONS, MEGATRON_LM_OPTIONS)
            if close:
                raise SpecError(f"{where}: unknown Megatron-LM option --{name}{close}; "
                                "perfmodel refuses a likely misspelling of an option it reads")
            job.strange(f"--{name}", shown, "a Megatron-LM option perfmodel does not read"
                        if name in MEGATRON_LM_OPTIONS else "")
            continue
        if arity and len(values) < abs(arity):
            raise SpecError(f"{where}: --{name} needs {abs(arity)} value(s), got "
                            f"{len(values)}")
        for v in values if name not in _PATHS else ():
            reason = launch.reason(v)
            if reason:
                raise SpecError(f"{where}: --{name} {launch.shown(v)} cannot be read: "
                                f"{reason.split(': ', 1)[1]}; give the value")
        if name in _PATHS:
            values = [launch.shown(v) for v in values]
        value: Any = True if arity == 0 else values[0] if arity == 1 else values
        dest = DESTS.get(name.replace("-", "_"), name.replace("-", "_"))
        if name in NEGATED:  # --no-rope-fusion: apply_rope_fusion False
            value, dest = False, NEGATED[name]
        if dest in out:
            job.notes.append(f"--{name} is given twice; Megatron-LM takes the last, "
                             f"{_text(value)}")
        out[dest] = (f"--{name}", value)
    return out


# read for what they are, not their paths (a DeepSpeed config is read where it can be)
_PATHS = ("tokenizer-model", "vocab-file", "deepspeed_config", "tp-comm-overlap-cfg")


def _text(value: Any) -> str:
    return " ".join(value) if isinstance(value, list) else str(value)


_LAUNCH_OPTIONS = {"nproc_per_node": "nproc-per-node", "nproc-per-node": "nproc-per-node",
                   "nnodes": "nnodes"}


_WORLD_LAUNCHERS = ("torchrun", "deepspeed")
_TORCH_RUNS = ("torch.distributed.run", "torch.distributed.launch")


def _module(words: list[str]) -> str:
    """The module a `python ... -m MODULE` command runs ('' for none)."""
    return words[words.index("-m") + 1] if "-m" in words[:-1] else ""


def launcher_world(launch: Launch, where: str, job: JobConfig) -> None:
    """The world size from torchrun (or python -m torch.distributed.run/launch): --nnodes x
    --nproc-per-node (each 1 when not given, as torchrun's defaults); from deepspeed, what its
    runner's options fix (_deepspeed_world)."""
    words = launch.launcher
    if not words:
        return
    start = next((i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] in _WORLD_LAUNCHERS
                  or (re.fullmatch(r"python3?(\.\d+)?", w.rsplit("/", 1)[-1])
                      and _module(words[i:]) in _TORCH_RUNS)), 0)
    if start:  # uv run, exec, time, env ..., or an unreadable $VENV_PREFIX: a wrapper
        job.notes.append(f"'{' '.join(launch.shown(w) for w in words[:start])}' before "
                         f"{words[start].rsplit('/', 1)[-1]}: a wrapper of the launch, whose "
                         "world size is the launcher's")
        words = words[start:]
        launch = Launch(launcher=words, script=launch.script, args=launch.args,
                        line=launch.line, unresolved=launch.unresolved)
    first = words[0].rsplit("/", 1)[-1]
    module = _module(words)
    if first == "deepspeed":
        _deepspeed_world(launch, where, job)
        return
    if first != "torchrun" and module not in _TORCH_RUNS:
        job.notes.append(f"launched by '{' '.join(words[:2])}': perfmodel reads the world size "
                         "from torchrun's --nnodes and --nproc-per-node only; give --gpus")
        return
    found = {"nnodes": "1", "nproc-per-node": "1"}
    for i, w in enumerate(words):
        name, _, inline = w.lstrip("-").partition("=")
        if w.startswith("-") and name in _LAUNCH_OPTIONS:
            value = inline or (words[i + 1] if i + 1 < len(words) else "")
            reason = launch.reason(value)
            if reason:  # the world size is then --gpus's (resolve refuses a plan without it)
                job.notes.append(f"{first} --{name} {launch.shown(value)} cannot be read: "
                                 f"{reason.split(': ', 1)[1]}; the world size is --gpus")
                return
            found[_LAUNCH_OPTIONS[name]] = value
            job.took(f"{first} --{name}", value, "world size")
    for key, value in found.items():
        # ASCII digits only: int() refuses '²', which isdigit() takes; 10 at most: a world size
        if not (value.isascii() and value.isdigit() and len(value) <= 10) or int(value) < 1:
            raise SpecError(f"{where}: {first} --{key} {value}: perfmodel reads a whole number of "
                            "nodes and of processes per node (not a range or 'gpu'); give --gpus")
    job.gpus = int(found["nnodes"]) * int(found["nproc-per-node"])
    job.gpus_from = f"{first} --nnodes {found['nnodes']} --nproc-per-node " \
                    f"{found['nproc-per-node']}"


def _world_defaults(strict: Launch | None, job: JobConfig) -> None:
    """Where torchrun's --nnodes or --nproc-per-node hold only the default of a variable the
    script does not set (`NNODES=${SLURM_NNODES:-"1"}`: the launch's environment sets it, a
    Slurm job its node count), the world size is not the script's statement: job.gpus_default
    says so, and --gpus sets the world (a multiple of the factor the script does state).
    strict: the launch with such defaults left as markers (launch_command defaults=False)."""
    if strict is None or not strict.launcher:
        return
    words, defaulted, multiple = strict.launcher, [], 1
    first = words[0].rsplit("/", 1)[-1]
    for option in ("nnodes", "nproc-per-node"):
        value = None
        for i, w in enumerate(words):
            name, _, inline = w.lstrip("-").partition("=")
            if w.startswith("-") and _LAUNCH_OPTIONS.get(name) == option:
                value = inline or (words[i + 1] if i + 1 < len(words) else "")
        reason = strict.reason(value) if value is not None else None
        if reason and DEFAULTED in reason:
            reference = reason[:reason.index(DEFAULTED)].rstrip(": ").rsplit(": ", 1)[-1]
            defaulted.append(f"--{option} from the default of {reference} (unset in the "
                             "script: the launch's environment gives it)")
        elif value is not None and value.isascii() and value.isdigit():
            multiple *= int(value)
    if defaulted:
        job.gpus_default = f"{first} " + " and ".join(defaulted)
        job.gpus_multiple = multiple


# DeepSpeed's runner (deepspeed/launcher/runner.py, deepspeedai/DeepSpeed at 2d991ba3): the hosts
# of its hostfile (-H/--hostfile, default /job/hostfile; none: this host), each with every GPU it
# has, narrowed by --num_nodes (the first N hosts), --num_gpus (GPUs 0..N-1 of each) or
# --include/--exclude (NODE[:SLOT,SLOT...]@...), which it refuses beside --num_nodes/--num_gpus
_DS_RUNNER = {"num_gpus": "num_gpus", "num-gpus": "num_gpus", "num_accelerators": "num_gpus",
              "num_nodes": "num_nodes", "num-nodes": "num_nodes", "i": "include",
              "include": "include", "e": "exclude", "exclude": "exclude", "H": "hostfile",
              "hostfile": "hostfile"}


def _deepspeed_world(launch: Launch, where: str, job: JobConfig) -> None:
    """The world size DeepSpeed's runner starts, where its options fix it (_DS_RUNNER); else a
    note, and the world size is --gpus's (resolve_plan asks for it)."""
    words, given = launch.launcher, dict[str, tuple[str, str]]()
    for i, w in enumerate(words):
        name, _, inline = w.lstrip("-").partition("=")
        if w.startswith("-") and name in _DS_RUNNER:
            value = inline or (words[i + 1] if i + 1 < len(words) else "")
            reason = launch.reason(value)
            if reason:
                job.notes.append(f"deepspeed {w.partition('=')[0]} {launch.shown(value)} cannot "
                                 f"be read: {reason.split(': ', 1)[1]}; the world size is --gpus")
                return
            given[_DS_RUNNER[name]] = (w.partition("=")[0], value)
    if ("include" in given or "exclude" in given) and (
            "num_gpus" in given or "num_nodes" in given):
        both = (given.get("include") or given["exclude"])[0]
        other = (given.get("num_gpus") or given["num_nodes"])[0]
        raise SpecError(f"{where}: deepspeed {both} with {other}: DeepSpeed's runner refuses "
                        "them together (Cannot specify num_nodes/gpus with include/exclude)")
    counts = {}
    for key in ("num_gpus", "num_nodes"):
        if key in given:
            option, value = given[key]
            if not (value.isascii() and value.isdigit() and len(value) <= 10) or int(value) < 1:
                raise SpecError(f"{where}: deepspeed {option} {value}: perfmodel reads a whole "
                                "number of nodes and of GPUs per node; give --gpus")
            counts[key] = int(value)
            job.took(f"deepspeed {option}", value, "world size")
    unknown = "the world size is --gpus"
    if "exclude" in given:
        job.notes.append(f"deepspeed {' '.join(given['exclude'])}: every GPU of the hostfile but "
                         f"these: {unknown}")
        return
    if "include" in given:
        option, value = given["include"]
        slots = []
        for spec in value.split("@"):
            host, _, listed = spec.partition(":")
            if not listed:
                job.notes.append(f"deepspeed {option} {value}: every GPU of host {host}: "
                                 f"{unknown}")
                return
            slots.append(len({s.strip() for s in listed.split(",") if s.strip()}))
        job.took(f"deepspeed {option}", value, "world size")
        job.gpus, job.gpus_from = sum(slots), f"deepspeed {option} {value}"
        return
    if "num_gpus" in counts and ("num_nodes" in counts or "hostfile" not in given):
        nodes = counts.get("num_nodes", 1)
        if "num_nodes" not in counts:
            job.notes.append(f"deepspeed {given['num_gpus'][0]} {counts['num_gpus']} without "
                             "--num_nodes or --hostfile: one node (DeepSpeed's default hostfile, "
                             "/job/hostfile, absent; where it lists more hosts, give --gpus)")
        job.gpus = nodes * counts["num_gpus"]
        job.gpus_from = f"deepspeed --num_nodes {nodes} --num_gpus {counts['num_gpus']}"
        return
    job.notes.append("deepspeed " + (" ".join(f"{o} {v}" for o, v in given.values()) or
                                     "without --num_gpus, --num_nodes or --include")
                     + ": DeepSpeed's runner uses every GPU of each host of its hostfile (or of "
                       f"this host): {unknown}")


def _not_read_why(text: str, path: Path) -> str:
    """Why a file is neither Megatron-LM arguments nor a launch script perfmodel reads: Python
    code (torchtitan's config registry, a recipe script), another entry point than GPT's, or
    pretrain_gpt.py named only where no shell command runs it (a quoted string, a
    here-document an sbatch script writes)."""
    if path.suffix == ".py" or re.search(r"^\s*(import \w|from \w[\w.]* import |def \w+\()",
                                         text, re.M):
        return ("Python code: perfmodel reads a job's configuration files (Megatron-LM "
                "arguments or launch scripts, YAML, TOML, JSON), not the Python that builds one "
                "(give the settings it sets as flags or as one of those files)")
    scripts = set(re.findall(r"[\w./-]*?(pretrain_\w+\.py)", text))
    others = sorted(scripts - set(SCRIPTS))
    if others and not scripts & set(SCRIPTS):
        return (f"runs {', '.join(others)}: perfmodel reads GPT training "
                f"({', '.join(SCRIPTS)}), not that entry point's models")
    if scripts & set(SCRIPTS):
        return ("pretrain_gpt.py is named, but not as a command perfmodel reads (inside a quoted "
                "string or a here-document, as an sbatch script writes another script): give "
                "the script that runs it, or its arguments")
    return ("neither a file of Megatron-LM arguments (starting with --) nor a script that runs "
            "pretrain_gpt.py")


def read_megatron(text: str, path: Path) -> JobConfig:
    """A Megatron-LM argument file or launch script, read."""
    where = str(path)
    job = JobConfig(path=where, framework=Framework.MEGATRON)
    launch = launch_command(text, where, is_script)
    if launch is None:
        launch = argument_words(text, where)
        if launch.args and not launch.args[0].startswith("--"):
            raise SpecError(f"{where}: {_not_read_why(text, path)}")
    else:
        job.took("launch", " ".join(launch.shown(w) for w in launch.launcher + [launch.script]),
                 f"line {launch.line}")
        launcher_world(launch, where, job)
        if job.gpus is not None and launch.notes:  # a default read: which words hold one
            _world_defaults(launch_command(text, where, is_script, defaults=False), job)
        if launch.variables.get("CUDA_LAUNCH_BLOCKING") == "1":  # BLOOM's tr11 script
            job.notes.append("CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the device "
                             "(host and device time add there); not modelled: the host's time is "
                             "taken as queued ahead of the device's")
    job.notes += launch.notes
    settings = parse_words(launch, where, job)
    apply_settings(settings, job, where)
    _te_attention_env(launch.variables, settings, job)
    read_allocator(launch, job)
    return job


def read_allocator(launch: Launch, job: JobConfig) -> None:
    """A launch script's PyTorch allocator settings (PYTORCH_ALLOC_CONF, else the older
    PYTORCH_CUDA_ALLOC_CONF, as c10's allocator config reads them: comma-separated key:value
    options, spaces around them skipped): expandable_segments:True is the plan's
    expandable_segments (no fragmentation margin counted). Only an exported variable reaches
    the ranks (one the script sets without `export` is said and not read); an assignment before
    the command alone (`VAR=... torchrun`) is not read."""
    variables = launch.variables
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if var not in variables:
            continue
        if var not in launch.exported:
            job.notes.append(f"{var} is set but not exported: the ranks do not see it (not "
                             "read; the allocator taken as PyTorch's default)")
            continue
        if launch.reason(variables[var]):  # it expands what the script does not set
            job.notes.append(f"{var}: not read (it expands a variable the script does not "
                             "set); the allocator taken as PyTorch's default")
            return
        options = {k.strip(): v.strip() for k, v in (
            item.split(":", 1) for item in variables[var].split(",") if ":" in item)}
        value = options.get("expandable_segments", "")
        if options.get("backend") == "cudaMallocAsync":
            job.notes.append(f"{var} backend:cudaMallocAsync: CUDA's asynchronous allocator, "
                             "its fragmentation taken as the caching allocator's (not "
                             "modelled apart)")
        if value in ("True", "False"):
            job.fix("expandable_segments", value == "True")
            job.took(var, variables[var], f"expandable_segments {value.lower()}")
        elif value:  # PyTorch itself stops on another value
            raise SpecError(f"{job.path}: {var} expandable_segments:{value}: PyTorch takes "
                            "True or False")
        return


# the presets' flash kernels that Transformer Engine's fused attention backend runs
# (--attention-backend fused, NVTE_FUSED_ATTN): cuDNN's on NVIDIA GPUs, on ROCm the CK kernels
# (ck-v3: AITER's assembly FMHA, with fp32 or 16-bit dQ atomics)
TE_FUSED_KERNELS = frozenset({"cudnn", "ck-v3", "ck-v3-a16", "ck-v3-a32"})

# Megatron-LM's expectation of Transformer Engine's backend switches for each --attention-backend
# (megatron/core/models/common/language_module/language_module.py, _set_attention_backend, at
# d98e8a64: since core_r0.11, 2024-12, a switch set otherwise stops the run at start-up)
_TE_ATTENTION_ENV = {
    "auto": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "1"},
    "flash": {"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0"},
    "fused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1"},
}
_TE_LEFT = {"NVTE_FUSED_ATTN": "its FlashAttention backend (FlashAttention-2, or -3 where "
                               "installed: --attention-kernel fa2 where the hardware measures it)",
            "NVTE_FLASH_ATTN": "cuDNN's fused attention (its default on Hopper and Blackwell)"}


def _te_attention_env(variables: dict[str, str], settings: Settings, job: JobConfig) -> None:
    """A launch script's NVTE_FUSED_ATTN=0 or NVTE_FLASH_ATTN=0 beside a fused attention: said
    in a note (which of Transformer Engine's backends runs, or that Megatron-LM refuses the
    mismatch); the kernel stays --attention-kernel's, as for --attention-backend."""
    if job.plan.get("flash_attention", True) is False:  # unfused (or auto: the hardware's)
        return
    backend = str(settings.get("attention_backend", (None, "auto"))[1])
    expected = _TE_ATTENTION_ENV.get(backend, {})
    for var, left in _TE_LEFT.items():
        if variables.get(var) != "0" or expected.get(var) == "0":
            continue  # not switched off, or as --attention-backend already says
        job.notes.append(f"{var}=0 beside --attention-backend {backend}: Megatron-LM since "
                         "core_r0.11 (2024-12) stops at start-up on this mismatch; before, "
                         f"Transformer Engine ran {left}")


# --- Megatron settings -> model and plan (shared with the Megatron-Bridge / NeMo YAML reader) ---

Settings = dict[str, tuple[str, Any]]


def _flag(settings: Settings, dest: str, where: str) -> bool:
    if dest not in settings:
        return False
    key, value = settings[dest]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "none", "null", ""):
        return False
    raise SpecError(f"{where}: {key} must be true or false, got '{value}'")


def _int(settings: Settings, dest: str, where: str, default: int | None = None, *,
         minimum: int = 1) -> int | None:
    if dest not in settings or settings[dest][1] in (None, "None", "null"):
        return default
    key, value = settings[dest]
    if isinstance(value, str) and key.startswith("--"):  # an argument: argparse's type=int,
        try:                                              # int(text), which refuses 2.0 and 1e3
            int(value)
        except ValueError:
            raise SpecError(f"{where}: {key} must be a whole number (Megatron-LM reads it with "
                            f"int()), got '{value}'") from None
    return whole(value, key, where, minimum=minimum)


def _str(settings: Settings, dest: str, default: str | None = None) -> str | None:
    if dest not in settings or settings[dest][1] is None:
        return default
    return str(settings[dest][1])


def apply_settings(settings: Settings, job: JobConfig, where: str) -> None:
    """Megatron settings (argument dests) as the job's model and plan fields."""
    used: set[str] = set()

    def take(dest: str, note: str) -> None:
        if dest in settings:
            used.add(dest)
            key, value = settings[dest]
            if dest == "untie_embeddings_and_output_weights" \
                    and key.endswith("share_embeddings_and_output_weights"):
                value = not _flag(settings, dest, where)  # NeMo's key, shown as it is given
            if value is False and key.startswith("--") and key[2:] in NEGATED:
                value = True  # --no-masked-softmax-fusion: the switch as given, not its dest's
            job.took(key, value, note)

    _model(settings, job, where, take)
    _plan(settings, job, where, take)
    _p2p_overlap(settings, job, where, take)
    plan = job.plan
    if (plan.get("recompute_method", "uniform") != "uniform"
            or plan.get("recompute_num_layers", 1) > 1) and (
            plan.get("first_stage_layers") or plan.get("last_stage_layers")
            or plan.get("pipeline_layout")):
        key = settings["recompute_method"][0] if "recompute_method" in settings \
            else "--recompute-method"
        raise refuse_plan(where, key, plan.get("recompute_method", "uniform"),
                          "Megatron's recompute methods pick and group the layers of each "
                          "chunk, and this config's pipeline stages differ (not modelled): give "
                          "--recompute-method uniform --recompute-num-layers 1")
    if _str(settings, "activation_func_clamp_value") not in (None, "None"):
        # megatron/core/fusions/fused_bias_swiglu.py at d98e8a64dd: the SwiGLU kernels take
        # clamp_value (the quick-GeGLU that clamps eagerly, GPT-OSS's, is refused above)
        take("activation_func_clamp_value", "the SwiGLU's halves clamped inside Megatron-Core's "
             "fused kernel: no pass of its own (clamped_glu, an eager clamp, not set)")
    for dest, (key, value) in settings.items():
        if dest not in used:
            job.skipped(key, value, "read: no effect on the step here")


def _p2p_overlap(settings: Settings, job: JobConfig, where: str,
                 take: Callable[[str, str], None]) -> None:
    """overlap_p2p_comm (Megatron-LM's --overlap-p2p-communication, on by default from
    2023-10-12 with --no-overlap-p2p-communication to turn it off; NeMo's and Megatron-Bridge's
    overlap_p2p_comm): Megatron-Core's interleaved schedule then overlaps the pipeline's sends
    and receives with the chunks' compute (megatron/core/pipeline_parallel/schedules.py at
    core_r0.9.0 and d98e8a64: only forward_backward_pipelining_with_interleaving reads it, and
    Megatron-LM's validate_args turns it off without virtual stages). perfmodel counts the sends
    exposed (docs/model.md, Known limits): on, said in a note, never listed as the same cost."""
    interleaved = job.plan.get("virtual_stages", 1) > 1 and job.plan.get("pp", 1) > 1
    if "overlap_p2p_comm" not in settings:
        if interleaved and _megatron_lm(settings, job, where):
            job.notes.append("Megatron-LM (from 2023-10-12, 4eeff55d1f) overlaps the interleaved "
                             "schedule's pipeline sends with compute unless "
                             "--no-overlap-p2p-communication is given: that overlap is not "
                             "modelled (perfmodel counts the sends exposed)")
        return
    key, value = settings["overlap_p2p_comm"]
    if not _flag(settings, "overlap_p2p_comm", where):
        take("overlap_p2p_comm", "off: the sends between pipeline stages exposed, as perfmodel "
                                 "counts them")
        return
    if not interleaved and _megatron_lm(settings, job, where):
        take("overlap_p2p_comm", "no effect without the interleaved schedule (Megatron-LM turns "
                                 "it off)")
        return
    del settings["overlap_p2p_comm"]  # said in a note alone (not read, not the same cost)
    job.notes.append(f"{key}{'' if value is True else ' ' + str(value)}: the interleaved "
                     "schedule's pipeline sends overlapped with compute are not modelled: "
                     "perfmodel counts them exposed (docs/model.md, Known limits)"
                     + ("" if interleaved else "; no effect where the schedule is not "
                        "interleaved"))


def _model(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None]
           ) -> None:
    if _flag(settings, "quick_geglu", where):
        raise refuse_spec(where, settings["quick_geglu"][0], True,
                          "a quick-GeGLU MLP is not modelled (SwiGLU and GeLU are)")
    if _str(settings, "window_size") not in (None, "0", "None"):
        raise refuse_spec(where, settings["window_size"][0], settings["window_size"][1],
                          "sliding windows from Megatron arguments are not read")
    take("window_attn_skip_freq", "no effect without --window-size (every layer attends fully)")
    _softmax_type(settings, job, where, take)
    if job.preset:
        given = {"multi_latent_attention": _flag(settings, "multi_latent_attention", where),
                 "mtp_num_layers": _str(settings, "mtp_num_layers") not in (None, "0", "None")}
        for dest in (d for d, on in given.items() if on):
            raise refuse_spec(where, settings[dest][0], settings[dest][1],
                              "multi-head latent attention and multi-token prediction are read "
                              "from Megatron arguments, not over a preset")
        _preset_overrides(settings, job, where, take)
        return
    model = job.model
    _latent_attention(settings, job, where, take)
    for dest, field_name in (("num_layers", "layers"), ("hidden_size", "hidden"),
                             ("num_attention_heads", "heads"), ("seq_length", "seq_len")):
        value = _int(settings, dest, where)
        if value is None:
            job.needs_model = job.needs_model or f"no --{dest.replace('_', '-')}"
            continue
        model[field_name] = value
        take(dest, f"{field_name} {value}")
    swiglu = _flag(settings, "swiglu", where)
    model["gated_mlp"] = swiglu
    take("swiglu", "gated_mlp (SwiGLU)")
    take("squared_relu", "a squared-ReLU MLP: two matrices, as GeLU's (the activation's "
                         "elementwise cost is GeLU's)")
    ffn = _int(settings, "ffn_hidden_size", where)
    if ffn is not None:
        model["ffn_hidden"] = ffn
        take("ffn_hidden_size", f"ffn_hidden {ffn}")
    elif "hidden" in model:
        hidden = model["hidden"]
        model["ffn_hidden"] = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        job.notes.append(f"ffn_hidden {model['ffn_hidden']}: Megatron-LM's default for "
                         f"--hidden-size {hidden}{' with --swiglu' if swiglu else ''}")
    gqa = _flag(settings, "group_query_attention", where)
    groups = _int(settings, "num_query_groups", where)
    if job.framework is Framework.MEGATRON:
        take("group_query_attention", "grouped-query attention")
        if gqa:
            model["kv_heads"] = groups if groups is not None else 1
            take("num_query_groups", f"kv_heads {model['kv_heads']}")
        elif groups is not None:
            job.skipped(settings.pop("num_query_groups")[0], groups,
                        "applies with --group-query-attention only (Megatron-LM)")
    elif groups is not None:
        model["kv_heads"] = groups
        take("num_query_groups", f"kv_heads {groups}")
    kv_heads = _int(settings, "num_key_value_heads", where)
    if kv_heads is not None:
        # Megatron-DeepSpeed's grouped-query attention (microsoft/Megatron-DeepSpeed megatron/
        # arguments.py at f4157bea: default the heads, which must be a multiple of it)
        if model.get("kv_heads", kv_heads) != kv_heads:
            raise SpecError(f"{where}: --num-key-value-heads {kv_heads} and "
                            f"{settings['num_query_groups'][0]} {model['kv_heads']} give two "
                            "numbers of key/value heads: give one")
        model["kv_heads"] = kv_heads
        take("num_key_value_heads", f"kv_heads {kv_heads} (Megatron-DeepSpeed's grouped-query "
                                    "attention)")
    kv_channels = _int(settings, "kv_channels", where)
    if kv_channels is not None and "kv_lora_rank" in model:
        # Megatron-Core's MLA sizes its heads by qk_head_dim + qk_pos_emb_head_dim and v_head_dim
        # (megatron/core/transformer/multi_latent_attention.py at d98e8a64): kv_channels unused
        job.skipped(settings.pop("kv_channels")[0], kv_channels,
                    "no effect under --multi-latent-attention (its heads are --qk-head-dim + "
                    "--qk-pos-emb-head-dim and --v-head-dim wide)")
    elif kv_channels is not None:
        model["head_dim"] = kv_channels
        take("kv_channels", f"head_dim {kv_channels}")
    model["tied_embeddings"] = not _flag(settings, "untie_embeddings_and_output_weights", where)
    take("untie_embeddings_and_output_weights",
         f"tied_embeddings {str(model['tied_embeddings']).lower()}")
    bias = not _flag(settings, "disable_bias_linear", where)
    if "add_bias_linear" in settings:
        bias = _flag(settings, "add_bias_linear", where)
        take("add_bias_linear", f"bias {str(bias).lower()}")
    model["bias"] = bias
    if "kv_lora_rank" in model:
        # Megatron-Core's MLA builds its query and key/value projections with bias=False
        # whatever add_bias_linear or add_qkv_bias say; its output projection takes
        # add_bias_linear (megatron/core/transformer/multi_latent_attention.py at d98e8a64)
        model["qkv_bias"] = False
        take("disable_bias_linear", f"bias {str(bias).lower()} (the attention's output "
                                    "projection and the MLP; MLA's query and key/value "
                                    "projections have none)")
        take("add_qkv_bias", "no effect under --multi-latent-attention (its query and "
                             "key/value projections have no biases)")
    else:
        model["qkv_bias"] = bias or _flag(settings, "add_qkv_bias", where)
        take("disable_bias_linear", f"bias {str(bias).lower()}")
        take("add_qkv_bias", f"qkv_bias {str(model['qkv_bias']).lower()}")
    norm = _str(settings, "normalization", "LayerNorm")
    # Megatron-LM's choices, LayerNorm and RMSNorm; Megatron-DeepSpeed's, layernorm and rmsnorm
    # (microsoft/Megatron-DeepSpeed megatron/arguments.py at f4157bea)
    if norm not in ("LayerNorm", "RMSNorm", "layernorm", "rmsnorm"):
        raise refuse_spec(where, settings["normalization"][0], norm,
                          "perfmodel models LayerNorm and RMSNorm (Megatron-DeepSpeed: layernorm "
                          "and rmsnorm)")
    model["norm"] = norm.lower()
    take("normalization", f"norm {norm.lower()}")
    positions = _positions(settings, job, where, take)
    max_positions = _int(settings, "max_position_embeddings", where)
    if max_positions is not None:
        if positions == "learned" and max_positions != model.get("seq_len"):
            raise refuse_spec(where, "--max-position-embeddings", max_positions,
                              f"with learned positions perfmodel's position table is "
                              f"seq_len ({model.get('seq_len')}) long; give them equal")
        seq = model.get("seq_len")
        if _megatron_lm(settings, job, where) and isinstance(seq, int) and max_positions < seq:
            # megatron/training/arguments.py (validate_args, at d98e8a64) asserts it whatever
            # the positions
            raise refuse_spec(where, "--max-position-embeddings", max_positions,
                              f"Megatron-LM asserts it >= --seq-length ({seq})")
        take("max_position_embeddings", "the position table (learned) or the reach of "
                                        "rotary positions")
    experts = 0
    if not megatron_deepspeed.experts(settings, job, where, take, _flag):
        if isinstance(settings.get("num_experts", (None, None))[1], list):
            key, counts = settings["num_experts"]
            if len(counts) != 1:
                raise SpecError(f"{where}: {key} {' '.join(counts)}: Megatron-LM takes one "
                                "number (a list is Megatron-DeepSpeed's, with --deepspeed)")
            settings["num_experts"] = (key, counts[0])
        experts = _int(settings, "num_experts", where, minimum=0) or 0
    if experts:
        model["experts"] = experts
        model["top_k"] = _int(settings, "moe_router_topk", where, 2)
        take("num_experts", f"experts {experts}")
        take("moe_router_topk", f"top_k {model['top_k']}")
        width = _int(settings, "moe_ffn_hidden_size", where)
        if width is not None:
            model["expert_ffn_hidden"] = width
            take("moe_ffn_hidden_size", f"expert_ffn_hidden {width}")
        shared = _int(settings, "moe_shared_expert_intermediate_size", where)
        if shared is not None:
            model["shared_experts"] = 1
            model["shared_expert_ffn_hidden"] = shared
            take("moe_shared_expert_intermediate_size", f"a shared expert {shared} wide")
        _moe_extras(settings, job, where, take, shared)
    _dispatcher(settings, job, where, take, experts)
    if experts:
        groups = _int(settings, "moe_router_num_groups", where)
        if groups is not None and groups > 1:
            model["expert_groups"] = groups
            model["group_topk"] = _int(settings, "moe_router_group_topk", where)
            if model["group_topk"] is None:
                raise refuse_plan(where, settings["moe_router_num_groups"][0], str(groups),
                                  "node-limited routing needs --moe-router-group-topk (the "
                                  "groups a token's experts come from)")
            take("moe_router_num_groups", f"expert_groups {groups}")
            take("moe_router_group_topk", f"group_topk {model['group_topk']}")
        take("moe_grouped_gemm", "the experts' GEMMs grouped (perfmodel's grouped-GEMM "
                                 "efficiency, with or without it)")
        freq = _str(settings, "moe_layer_freq")
        if freq is not None:
            layers = _int(settings, "num_layers", where)
            pattern = moe_layer_pattern(freq, layers, where, settings["moe_layer_freq"][0])
            dense = [i for i, moe in enumerate(pattern) if not moe]
            first = next((i for i, moe in enumerate(pattern) if moe), len(pattern))
            model["moe_first_dense"] = first
            model["moe_dense_layers"] = tuple(i for i in dense if i >= first)
            take("moe_layer_freq", f"dense layers {dense or 'none'}")
    _capacity(settings, job, where, take, experts)
    _vocab(settings, job, where, take)
    _dropout(settings, job, where, take, over_preset=False)


def _softmax_type(settings: Settings, job: JobConfig, where: str,
                  take: Callable[[str, str], None]) -> None:
    """--softmax-type (TransformerConfig.softmax_type at d98e8a64: vanilla, off-by-one,
    learnable): learnable is the model's attention_sinks (a learned logit per head in each
    softmax's denominator: GPT-OSS's), as the NeMo reader reads the same field; off-by-one (a
    fixed 1 in it) is refused."""
    softmax = _str(settings, "softmax_type", "vanilla")
    if softmax == "learnable":
        job.model["attention_sinks"] = True
        take("softmax_type", "attention_sinks (a learned logit per head in each softmax's "
                             "denominator)")
    elif softmax not in ("vanilla", None):
        raise refuse_spec(where, settings["softmax_type"][0], softmax,
                          "perfmodel models the vanilla softmax and learnable sinks")
    else:
        take("softmax_type", "the plain softmax")


# Megatron-Core's token dispatchers and the flex dispatcher's backends (TransformerConfig's
# Literal fields, Megatron-LM's argparse choices through ArgumentGroupFactory, at d98e8a64)
DISPATCHERS = ("allgather", "alltoall", "flex")
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")


def _dispatcher(settings: Settings, job: JobConfig, where: str,
                take: Callable[[str, str], None], experts: int) -> None:
    """--moe-token-dispatcher-type (alltoall; flex: DeepEP's or HybridEP's kernels, ep_dispatcher
    deepep) with --moe-flex-dispatcher-backend and the deprecated --moe-enable-deepep. Refused:
    a value outside Megatron-Core's choices; what its TransformerConfig raises on
    (transformer_config.py __post_init__ at d98e8a64: --moe-enable-deepep without the flex
    dispatcher or beside the hybridep backend, the ncclep backend without flex), with or without
    experts; with experts, Megatron-LM's default allgather and the ncclep backend (NCCL EP's
    dispatch, token_dispatcher.py _NCCLEPManager), which perfmodel does not model."""
    dispatcher = _str(settings, "moe_token_dispatcher_type", "allgather")
    backend = _str(settings, "moe_flex_dispatcher_backend", "deepep")
    for dest, value, allowed in (("moe_token_dispatcher_type", dispatcher, DISPATCHERS),
                                 ("moe_flex_dispatcher_backend", backend, FLEX_BACKENDS)):
        # argparse refuses another value; a config's TransformerConfig builds no dispatcher
        # without experts
        if value not in allowed and (experts or settings[dest][0].startswith("--")):
            raise refuse_plan(where, settings[dest][0], value,
                              f"one of {', '.join(allowed)} (Megatron-Core's choices)")
    if _flag(settings, "moe_enable_deepep", where):
        key = settings["moe_enable_deepep"][0]
        if dispatcher != "flex":
            raise refuse_plan(where, key, True, "Megatron-Core raises 'DeepEP backend is only "
                              "supported with flex token dispatcher' (give "
                              "--moe-token-dispatcher-type flex)")
        if backend == "hybridep":
            raise refuse_plan(where, key, True, "Megatron-Core raises 'Only one backend is "
                              "supported for flex token dispatcher' (beside "
                              f"{settings['moe_flex_dispatcher_backend'][0]} hybridep)")
    if backend == "ncclep" and dispatcher != "flex":
        raise refuse_plan(where, settings["moe_flex_dispatcher_backend"][0], backend,
                          "Megatron-Core raises \"moe_flex_dispatcher_backend='ncclep' requires "
                          "moe_token_dispatcher_type='flex'\"")
    if not experts:
        return  # no MoE layer: read as no effect
    if dispatcher == "allgather":  # Megatron-LM's default
        raise refuse_plan(where, settings["moe_token_dispatcher_type"][0]
                          if "moe_token_dispatcher_type" in settings
                          else "--moe-token-dispatcher-type / moe_token_dispatcher_type "
                               "(default: allgather)", dispatcher,
                          "perfmodel models the all-to-all dispatch: give the token "
                          "dispatcher type alltoall (or flex)")
    if dispatcher == "flex" and backend == "ncclep":
        raise refuse_plan(where, settings["moe_flex_dispatcher_backend"][0], backend,
                          "NCCL EP's dispatch is not modelled (perfmodel's flex dispatcher is "
                          "DeepEP's or HybridEP's kernels): give deepep or hybridep")
    take("moe_token_dispatcher_type", f"{dispatcher}: the tokens' all-to-all"
         + (" by DeepEP's (or HybridEP's) kernels: ep_dispatcher deepep"
            if dispatcher == "flex" else ""))
    if dispatcher == "flex":  # Megatron-Core's flex dispatcher runs DeepEP or HybridEP
        job.fix("ep_dispatcher", "deepep")
        take("moe_flex_dispatcher_backend", f"{backend}: ep_dispatcher deepep (HybridEP "
                                            "sends a token once per node as DeepEP does)")
        take("moe_enable_deepep", "ep_dispatcher deepep")
    else:
        take("moe_flex_dispatcher_backend", f"no effect with the {dispatcher} dispatcher "
                                            "(Megatron-Core runs a backend under flex only)")


def _moe_extras(settings: Settings, job: JobConfig, where: str,
                take: Callable[[str, str], None], shared: int | None) -> None:
    """Megatron-Core's MoE options that change the layer perfmodel costs and that it does not
    model (megatron/core/transformer/transformer_config.py and moe/ at d98e8a64): refused, or
    read as having no effect where Megatron-Core says they have none."""
    if _flag(settings, "moe_shared_expert_overlap", where):
        # shared_experts.py: the shared expert's GEMMs on a side stream behind the dispatch's
        # all-to-all; "only effective when moe-shared-expert-intermediate-size is set"
        if shared is not None:
            raise refuse_plan(where, settings["moe_shared_expert_overlap"][0], True,
                              "the shared expert computed behind the token dispatch is not "
                              "modelled (perfmodel runs it before the dispatch): leave it out")
        take("moe_shared_expert_overlap", "no effect without a shared expert "
                                          "(--moe-shared-expert-intermediate-size)")
    if _flag(settings, "moe_apply_probs_on_input", where):
        # experts.py: the routing weights multiplied into the experts' input (top-k 1 only)
        raise refuse_plan(where, settings["moe_apply_probs_on_input"][0], True,
                          "the routing weights applied to the experts' input are not modelled "
                          "(perfmodel's expert_weighting: activation, Megatron-Core's default, "
                          "or output)")
    for dest, why, refuse in (
            ("moe_latent_size", "the experts' latent projections are not modelled", refuse_spec),
            ("moe_expert_rank_capacity_factor", "a per-rank token budget (HybridEP drops the "
             "tokens over it; NCCL EP's fixed receive buffers) is not modelled: perfmodel's "
             "flex dispatch is dropless", refuse_plan)):
        if _str(settings, dest) not in (None, "None"):
            raise refuse(where, settings[dest][0], settings[dest][1], why)


def _capacity(settings: Settings, job: JobConfig, where: str,
              take: Callable[[str, str], None], experts: int) -> None:
    """--moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity and
    --moe-token-drop-policy, read as NeMo's and Megatron-Bridge's reader reads Megatron-Core's
    same settings (job.capacity: the model's capacity_factor where the experts' input is
    padded to it). What Megatron-Core raises on is refused (transformer_config.py __post_init__ at
    d98e8a64: a factor, negative or not, needs aux_loss, seq_aux_loss, global_aux_loss or none
    load balancing (job.capacity_balancing); a negative factor is None, dropless; padding needs a
    factor; the flex dispatcher's deepep backend does not pad), and a capacity with the flex
    dispatcher, which perfmodel models dropless (Plan's ep_dispatcher deepep; its ncclep backend
    is refused by _dispatcher)."""

    dests = [d for d in CAPACITY if d in settings]
    if not dests:
        return
    fields = {d: settings[d][1] for d in dests}
    factor_dest, pad_dest, _ = CAPACITY
    factor = fields.get(factor_dest)
    if factor is not None:
        # Megatron-LM's option is read as ignored (the same cost), its value looked up there
        capacity_balancing(settings[factor_dest][0], factor, "--moe-router-load-balancing-type",
                           _ignored_value(job, "--moe-router-load-balancing-type"), where)
        try:
            number = float(factor)
        except ValueError:
            raise SpecError(f"{where}: {settings[factor_dest][0]} must be a number, got "
                            f"'{factor}'") from None
        if number < 0:  # Megatron-Core sets it None: dropless
            factor = fields.pop(factor_dest)
            job.skipped(*settings.pop(factor_dest), "negative: Megatron-Core's None, dropless "
                                                    "experts")
            factor = None
    pad = _flag(settings, pad_dest, where)
    if pad and factor is None:
        raise refuse_plan(where, settings[pad_dest][0], True,
                          "Megatron-Core raises 'moe_expert_capacity_factor must be set to use "
                          "moe_pad_expert_input_to_capacity' (give --moe-expert-capacity-factor)")
    if not experts:
        for dest in dests:
            job.skipped(*settings.pop(dest), "no effect without --num-experts")
        return
    dispatcher = _str(settings, "moe_token_dispatcher_type", "allgather")
    if factor is not None and dispatcher == "flex":
        backend = "deepep" if _flag(settings, "moe_enable_deepep", where) else \
            _str(settings, "moe_flex_dispatcher_backend", "deepep")
        why = ("Megatron-Core raises: the flex dispatcher's deepep backend does not pad to the "
               "capacity" if pad and backend == "deepep" else
               "perfmodel models the flex dispatcher (ep_dispatcher deepep) dropless: give the "
               "alltoall dispatcher, or no capacity")
        raise refuse_plan(where, settings[factor_dest][0], factor, why)
    record = JobConfig(path=job.path, framework=job.framework, model=job.model)
    try:
        capacity(fields, "", record, where)
    except PlanError:  # a factor without the padding: the tokens over it dropped
        raise refuse_plan(where, settings[factor_dest][0], factor,
                          "dropping the tokens over an expert's capacity without "
                          "--moe-pad-expert-input-to-capacity is not modelled: perfmodel's "
                          "experts are dropless or padded to their capacity") from None
    for setting in record.read:
        take(setting.key.lstrip("."), setting.note)
    for setting in record.ignored:
        job.skipped(*settings.pop(setting.key.lstrip(".")), setting.note)


def _ignored_value(job: JobConfig, key: str) -> Any:
    """The value of an option read as ignored (the last given), or None."""
    return next((s.value for s in reversed(job.ignored) if s.key == key), None)


def _positions(settings: Settings, job: JobConfig, where: str,
               take: Callable[[str, str], None]) -> str:
    """The model's position embedding (learned, rotary or alibi) from --position-embedding-type,
    the legacy --use-rotary-position-embeddings (Megatron-LM sets the type to rope,
    megatron/training/arguments.py at d98e8a64; Megatron-DeepSpeed builds RotaryEmbedding and
    drops the learned table, megatron/arguments.py and model/language_model.py at f4157bea) and
    --no-position-embedding (no learned table: nothing to drop beside rotary positions;
    Megatron-LM raises on it with another type)."""
    positions = _str(settings, "position_embedding_type", "learned_absolute")
    # Megatron-LM's names, and Megatron-DeepSpeed's (PositionEmbeddingType: absolute, rotary,
    # alibi; bigscience-workshop/Megatron-DeepSpeed megatron/enums.py)
    kinds = {"learned_absolute": "learned", "rope": "rotary", "yarn": "rotary",
             "absolute": "learned", "rotary": "rotary", "alibi": "alibi"}
    if _flag(settings, "use_rotary_position_embeddings", where):
        if "position_embedding_type" in settings and positions not in ("rope", "rotary"):
            job.notes.append(f"--use-rotary-position-embeddings overrides "
                             f"{settings['position_embedding_type'][0]} {positions}: rope, as "
                             "Megatron-LM sets it")
            take("position_embedding_type", "overridden by --use-rotary-position-embeddings")
        positions = "rope"
        take("use_rotary_position_embeddings", "position_embedding rotary (rope)")
    if positions not in kinds:
        raise refuse_spec(where, settings["position_embedding_type"][0], positions,
                          "perfmodel models learned_absolute, rope, yarn and Megatron-DeepSpeed's "
                          "alibi")
    job.model["position_embedding"] = kinds[positions]
    take("position_embedding_type", f"position_embedding {kinds[positions]}")
    if kinds[positions] == "rotary":
        _rotary_percent(settings, job, where, take)
    if _flag(settings, "no_position_embedding", where):
        if positions not in ("rope", "rotary"):
            raise refuse_spec(where, settings["no_position_embedding"][0], True,
                              f"beside position embeddings {positions}: a model without any is "
                              "not modelled (Megatron-LM raises on it unless "
                              "--position-embedding-type rope)")
        take("no_position_embedding", "no learned position table: none beside rotary positions")
    return str(kinds[positions])


def _rotary_percent(settings: Settings, job: JobConfig, where: str,
                    take: Callable[[str, str], None]) -> None:
    """--rotary-percent (NeMo's rotary_percent, NeMo 1's rotary_percentage) as rotary_fraction:
    RotaryEmbedding rotates int(kv_channels x rotary_percent) of each head (Megatron-LM
    megatron/core/models/common/embeddings/rotary_pos_embedding.py)."""
    if settings.get("rotary_percent", (None, None))[1] in (None, "None", "null"):
        return
    key, value = settings["rotary_percent"]
    fraction = number(value, f"{where}: {key}", maximum=1,
                      reason="the share of each head's dimensions RoPE rotates")
    if fraction != 1:
        job.model["rotary_fraction"] = fraction
    take("rotary_percent", f"rotary_fraction {fraction:g}")


# Megatron-Core's TransformerConfig defaults (hidden_dropout, attention_dropout), which
# Megatron-LM's --hidden-dropout and --attention-dropout default to (arguments.py)
MEGATRON_DROPOUT = 0.1


def _dropout(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None], *,
             over_preset: bool) -> None:
    """The model's dropout rates: what the settings state; a Megatron-LM argument list that
    states none runs Megatron's 0.1 (a NeMo or Megatron-Bridge config leaves it to its model
    class, the preset's, or TransformerSpec's 0.1, Megatron-Core's default)."""
    for dest in ("hidden_dropout", "attention_dropout"):
        if dest in settings:
            key, value = settings[dest]
            try:
                rate = float("nan" if isinstance(value, bool) else value)
            except (TypeError, ValueError):
                raise SpecError(f"{where}: {key} must be a number, got '{value}'") from None
            if not 0 <= rate <= 1:
                raise SpecError(f"{where}: {key} must be a rate from 0 to 1, got '{value}'")
            job.model[dest] = rate
            take(dest, f"{dest} {rate:g}" + (" (over the preset's)" if over_preset else "")
                 + ("" if rate else ": no masks kept"))
        elif job.framework is Framework.MEGATRON and not over_preset:
            job.model[dest] = MEGATRON_DROPOUT
            job.notes.append(f"{dest} {MEGATRON_DROPOUT:g}: Megatron-LM's default (its masks "
                             "are kept for the backward)")


# Megatron-LM's defaults of its multi-head latent attention arguments (arguments.py at d98e8a6)
MLA_DEFAULTS = {"q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128,
                "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
MLA_FIELD_OF = {"q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
                "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim",
                "v_head_dim": "v_head_dim"}


def _latent_attention(settings: Settings, job: JobConfig, where: str,
                      take: Callable[[str, str], None]) -> None:
    """--multi-latent-attention with its ranks and head sizes (Megatron-LM's defaults where not
    given, said in the notes), and --mtp-num-layers: DeepSeek-V3's attention and multi-token
    prediction."""
    model = job.model
    mtp = _int(settings, "mtp_num_layers", where, 0, minimum=0)
    if mtp:
        model["mtp_layers"] = mtp
    take("mtp_num_layers", f"mtp_layers {mtp or 0}")
    if not _flag(settings, "multi_latent_attention", where):
        for dest in MLA_DEFAULTS:
            take(dest, "without --multi-latent-attention: none")
        return
    take("multi_latent_attention", "multi-head latent attention (MLA)")
    for dest, default in MLA_DEFAULTS.items():
        value = _int(settings, dest, where, default, minimum=1)
        if value is not None:
            model[MLA_FIELD_OF[dest]] = value
        if dest in settings:
            take(dest, f"{MLA_FIELD_OF[dest]} {value}")
        else:
            job.notes.append(f"{MLA_FIELD_OF[dest]} {value}: Megatron-LM's default for "
                             f"--{dest.replace('_', '-')}")


def moe_layer_pattern(text: str, layers: int | None, where: str, option: str) -> list[int]:
    """Megatron-LM's --moe-layer-freq: N (every N-th layer from the first is an MoE layer) or a
    list of 0 (dense) and 1 (MoE), one per layer, as Python writes it ([0]*3+[1]*58 included:
    literal lists, + and * of them, read by this small evaluator, never eval)."""
    import ast

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, list) \
                    and isinstance(right, int) and 0 <= len(left) * right <= 10**6:
                return left * right  # (bounded: a layer list, never a billion items)
        raise ValueError

    if layers is None:
        raise refuse_spec(where, option, text, "--moe-layer-freq needs --num-layers")
    try:
        parsed = value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, int) and parsed >= 1:
        return [int(i % parsed == 0) for i in range(layers)]
    if (not isinstance(parsed, list) or len(parsed) != layers
            or any(v not in (0, 1) for v in parsed)):
        raise refuse_spec(where, option, text, f"--moe-layer-freq must be N >= 1 or a list of "
                                               f"{layers} zeros and ones (e.g. ([0]*3+[1]*5))")
    return [int(v) for v in parsed]


_OVERRIDES = {"num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
              "seq_length": "seq_len", "ffn_hidden_size": "ffn_hidden",
              "num_query_groups": "kv_heads", "kv_channels": "head_dim", "vocab_size": "vocab",
              "num_experts": "experts", "moe_router_topk": "top_k"}


def _preset_overrides(settings: Settings, job: JobConfig, where: str,
                      take: Callable[[str, str], None]) -> None:
    """The model fields a config gives over the preset it names (NeMo 2's config classes):
    only those it states, never Megatron-LM's defaults for the others."""
    for dest, field_name in _OVERRIDES.items():
        value = _int(settings, dest, where, minimum=0)
        if value is not None:
            job.model[field_name] = value
            take(dest, f"{field_name} {value} (over the preset's)")
    for dest, field_name, invert in (("swiglu", "gated_mlp", False),
                                     ("untie_embeddings_and_output_weights", "tied_embeddings",
                                      True), ("add_bias_linear", "bias", False)):
        if dest in settings:
            job.model[field_name] = _flag(settings, dest, where) != invert
            take(dest, f"{field_name} {str(job.model[field_name]).lower()} (over the preset's)")
    if "normalization" in settings:
        job.model["norm"] = str(settings["normalization"][1]).lower()
        take("normalization", f"norm {job.model['norm']}")
    _dropout(settings, job, where, take, over_preset=True)
    if _model_value(job, "position_embedding", "learned") in ("rotary", None):
        _rotary_percent(settings, job, where, take)
    job.vocab_multiple = _int(settings, "make_vocab_size_divisible_by", where,
                              DEFAULT_VOCAB_MULTIPLE) or DEFAULT_VOCAB_MULTIPLE


def _vocab(settings: Settings, job: JobConfig, where: str,
           take: Callable[[str, str], None]) -> None:
    vocab = _int(settings, "vocab_size", where)
    tokenizer = _str(settings, "tokenizer_type")
    take("tokenizer_type", "the vocabulary's source")
    padded = _int(settings, "pad_vocab_size_to", where)
    if padded is not None:  # Megatron-DeepSpeed (bigscience): the padded vocabulary itself
        job.model["vocab"] = padded
        job.vocab_multiple = 0
        take("pad_vocab_size_to", f"vocab {padded} (padded to it: no further padding)")
        take("make_vocab_size_divisible_by", "no effect beside --pad-vocab-size-to")
        return
    if vocab is not None:
        job.model["vocab"] = vocab
        take("vocab_size", f"vocab {vocab} (before Megatron's padding)")
    elif tokenizer == "GPT2BPETokenizer":
        job.model["vocab"] = GPT2_VOCAB
        job.notes.append(f"vocab {GPT2_VOCAB}: GPT2BPETokenizer's vocabulary (gpt2-vocab.json), "
                         "before Megatron's padding")
    else:
        # the tokenizer's setting as the config names it (NeMo 1: model.tokenizer.library)
        source = f"{settings['tokenizer_type'][0]} {tokenizer}" if tokenizer else \
            "no --vocab-size" + (" (a --vocab-file)" if "vocab_file" in settings else "")
        job.needs_model = job.needs_model or f"{source} (the tokenizer's files give the " \
                                             "vocabulary)"
    job.vocab_multiple = _int(settings, "make_vocab_size_divisible_by", where,
                              DEFAULT_VOCAB_MULTIPLE) or DEFAULT_VOCAB_MULTIPLE
    take("make_vocab_size_divisible_by", "the vocabulary's padding")


def padded_vocab(vocab: int, multiple: int, tp: int) -> int:
    """Megatron-LM's vocab_size_with_padding: the vocabulary rounded up to a multiple of
    make_vocab_size_divisible_by x tp (megatron/core/tokenizers/utils/build_tokenizer.py)."""
    step = multiple * tp
    return int(math.ceil(vocab / step) * step)


# Megatron-LM's --cp-comm-type and perfmodel's cp_comm (its hierarchical a2a+p2p is not modelled)
CP_COMM_TYPES = {"p2p": "p2p", "all_gather": "allgather", "a2a": "a2a"}


def _cross_entropy(settings: Settings, job: JobConfig, where: str,
                   take: Callable[[str, str], None]) -> None:
    """--cross-entropy-loss-fusion with --cross-entropy-fusion-impl te: Transformer Engine's
    fused cross entropy (Plan.cross_entropy te: the bf16 logits hold their gradient); with the
    native impl (its default) Megatron-Core's fused_vocab_parallel_cross_entropy (native: the
    unfused loss's fp32 copy, its steps compiled)."""
    if "cross_entropy_loss_fusion" not in settings and "cross_entropy_fusion_impl" not in settings:
        return  # not stated: the plan's default (or the command line's)
    fused = _flag(settings, "cross_entropy_loss_fusion", where)
    impl = _str(settings, "cross_entropy_fusion_impl", "native")
    if impl not in ("native", "te"):
        raise refuse_plan(where, settings["cross_entropy_fusion_impl"][0], impl,
                          "Megatron-Core's cross entropy fusion is native or te")
    kernel = impl if fused else "unfused"
    job.fix("cross_entropy", kernel)
    take("cross_entropy_loss_fusion",
         "cross_entropy te (Transformer Engine's fused kernel)" if kernel == "te" else
         "cross_entropy native (Megatron-Core's native fusion: fp32 logits, compiled steps)"
         if fused else "off: cross_entropy unfused")
    take("cross_entropy_fusion_impl", f"{impl}" + ("" if fused else " (fusion off)"))


def _cp_comm_type(settings: Settings, where: str, cp: int) -> str:
    """--cp-comm-type: one type for every layer, or one per layer (Megatron-LM's nargs='+',
    argument_utils.py passing a list of more than one on; TransformerConfig asserting a list as
    long as the layers where cp > 1, transformer_config.py at d98e8a64): a list whose types
    agree is that type; a mix of types by layer is not modelled."""
    if "cp_comm_type" not in settings or settings["cp_comm_type"][1] is None:
        return "p2p"
    key, raw = settings["cp_comm_type"]
    types = [str(t) for t in raw] if isinstance(raw, list | tuple) else [str(raw)]
    layers = _int(settings, "num_layers", where, None)
    if len(types) > 1 and cp > 1 and layers is not None and len(types) != layers:
        raise refuse_plan(where, key, " ".join(types), f"one type, or one per layer: {len(types)} "
                          f"types for {layers} layers (Megatron-Core asserts as many)")
    if len(set(types)) > 1 and cp > 1:
        raise refuse_plan(where, key, " ".join(types), "a different type by layer is not "
                          "modelled: give one type for every layer")
    return types[0] if types else "p2p"


def _hierarchical_cp(settings: Settings, job: JobConfig, where: str,
                     take: Callable[[str, str], None], cp: int) -> None:
    """--hierarchical-context-parallel-sizes, the levels of hierarchical a2a+p2p context
    parallelism: Megatron-LM asserts their product is cp, and asserts them beside a2a+p2p
    (validate_args at d98e8a64); a2a+p2p at cp > 1 is refused (not modelled), so they change no
    step perfmodel predicts. Given, they pin cp (recommend keeps it)."""
    raw = settings.get("cp_comm_type", (None, None))[1]
    types = [str(t) for t in raw] if isinstance(raw, list | tuple) else [str(raw)]
    megatron_lm = _megatron_lm(settings, job, where)
    if "hierarchical_context_parallel_sizes" not in settings:
        if "a2a+p2p" in types and megatron_lm:
            raise refuse_plan(where, settings["cp_comm_type"][0], " ".join(types),
                              "Megatron-LM asserts '--hierarchical-context-parallel-sizes must "
                              "be set when a2a+p2p is used in cp comm'")
        return
    key, sizes = settings["hierarchical_context_parallel_sizes"]
    sizes = sizes if isinstance(sizes, list | tuple) else str(sizes).split()
    levels = [whole(size, key, where) for size in sizes]
    if megatron_lm and math.prod(levels) != cp:
        raise refuse_plan(where, key, " ".join(map(str, levels)),
                          f"Megatron-LM asserts their product is --context-parallel-size ({cp})")
    job.fix("cp", cp)
    take("hierarchical_context_parallel_sizes", "no effect with cp 1" if cp == 1 else
         "no effect without --cp-comm-type a2a+p2p")


def _plan(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None]
          ) -> None:
    explicit = {dest for dest in settings if settings[dest][1] is not None}
    cp = _int(settings, "context_parallel_size", where, 1) or 1
    job.fix("cp", cp, pin="context_parallel_size" in explicit)
    take("context_parallel_size", f"cp {cp}")
    comm = _cp_comm_type(settings, where, cp)
    _hierarchical_cp(settings, job, where, take, cp)
    if comm not in CP_COMM_TYPES and not (cp == 1 and comm == "a2a+p2p"):
        raise refuse_plan(where, settings["cp_comm_type"][0], comm,
                          f"cp_comm_type {comm} is not modelled (perfmodel models "
                          f"{', '.join(CP_COMM_TYPES)})")
    if comm in CP_COMM_TYPES:  # hierarchical a2a+p2p (cp 1 here): Transformer Engine's at cp > 1
        job.fix("cp_comm", CP_COMM_TYPES[comm], pin="cp_comm_type" in explicit)
    take("cp_comm_type", f"cp_comm {CP_COMM_TYPES[comm]}" if cp > 1 else "no effect with cp 1")
    ep = _int(settings, "expert_model_parallel_size", where, 1) or 1
    job.fix("ep", ep, pin="expert_model_parallel_size" in explicit)
    take("expert_model_parallel_size", f"ep {ep}")
    # Megatron-LM: --expert-tensor-parallel-size defaults to --tensor-model-parallel-size
    tp = _int(settings, "tensor_model_parallel_size", where, 1) or 1
    etp = _int(settings, "expert_tensor_parallel_size", where, tp)
    etp = etp or 1
    if job.model.get("experts"):  # the plan's etp (perfmodel.step.moe; a dense model has none)
        given = "expert_tensor_parallel_size" in explicit
        if tp % etp:
            raise refuse_plan(where, settings["expert_tensor_parallel_size"][0] if given
                              else "--expert-tensor-parallel-size (default: tp)", etp,
                              f"expert tensor parallelism is modelled over tp's ranks: give an "
                              f"--expert-tensor-parallel-size dividing tp ({tp})")
        job.fix("etp", etp, pin=given)
        take("expert_tensor_parallel_size", f"etp {etp}")
    else:
        take("expert_tensor_parallel_size", "no experts: no effect on a dense model")
    for dest, why in (
            ("distribute_saved_activations", "distributing the checkpointed inputs over the "
                                             "tensor-parallel ranks is not modelled"),
            ("optimizer_cpu_offload", "an optimizer on the host is not modelled"),
            # Megatron-Core's per-module offloading (--offload-modules): its activations'
            # copies to the host and the memory they free are not modelled
            ("fine_grained_activation_offloading", "fine-grained activation offloading to the "
                                                   "host is not modelled (--cpu-offloading-num-"
                                                   "layers, Transformer Engine's, is)"),
            ("use_megatron_fsdp", "Megatron FSDP is not modelled (--use-torch-fsdp2 is: ZeRO "
                                  "stage 3)"),
            ("use_custom_fsdp", "Megatron FSDP is not modelled (--use-torch-fsdp2 is: ZeRO "
                                "stage 3)"),
            ("distribute_checkpointed_activations", "distributing the checkpointed inputs over "
                                                    "the tensor-parallel ranks is not modelled")):
        if _flag(settings, dest, where):
            raise refuse_plan(where, settings[dest][0], True, why)
    _stage_layers(settings, job, where, take)
    text = _str(settings, "fp4_format")
    if text not in (None, "None", "null"):
        raise refuse_plan(where, settings["fp4_format"][0], text, "fp4 training is not modelled")
    if _flag(settings, "fp4_param_gather", where):  # megatron/training/arguments.py raises
        raise refuse_plan(where, settings["fp4_param_gather"][0], True,
                          "Megatron-LM raises '--fp4-param-gather must be used together with "
                          "--fp4-format' (fp4 training is not modelled: leave both out)")
    optimizer = _str(settings, "optimizer", "adam")
    if optimizer != "adam":
        raise refuse_plan(where, settings["optimizer"][0], optimizer,
                          "perfmodel models Adam's states (2 fp32 moments)")
    take("optimizer", "Adam")
    take("use_mcore_models", "the same model")
    take("mock_data", "synthetic data")
    take("tokenizer_model", "the tokenizer's file")
    take("vocab_file", "the tokenizer's file")
    _degrees(settings, job, where, take)
    _options(settings, job, where, take)


def _stage_layers(settings: Settings, job: JobConfig, where: str,
                  take: Callable[[str, str], None]) -> None:
    """--decoder-first/last-pipeline-num-layers (and their older names
    --num-layers-in-first/last-pipeline-stage): the first and the last pipeline stage's layers,
    the other stages sharing the rest evenly (Plan.first_stage_layers / last_stage_layers)."""
    for end in ("first", "last"):
        for dest in (f"decoder_{end}_pipeline_num_layers", f"num_layers_in_{end}_pipeline_stage"):
            layers = _int(settings, dest, where)
            if layers is not None:
                job.fix(f"{end}_stage_layers", layers)
                take(dest, f"{end}_stage_layers {layers}")


def _layout(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
            pp: int, chunks: int | None) -> int | None:
    """--pipeline-model-parallel-layout: every stage's layers (Plan.pipeline_layout); Megatron
    takes the virtual stages per rank from it (stages / pp). Returns the virtual stages (chunks
    as given where there is no layout)."""
    text = _str(settings, "pipeline_model_parallel_layout")
    accounted = {end: _flag(settings, f"account_for_{end}_in_pipeline_split", where)
                 for end in ("embedding", "loss")}
    if any(accounted.values()) and text in (None, "None", "null", ""):
        return _accounted(settings, job, where, take, pp, chunks, accounted)
    if text in (None, "None", "null", ""):
        return chunks
    key = settings["pipeline_model_parallel_layout"][0]
    if any(accounted.values()):
        raise refuse_plan(where, key, text, "Megatron-LM takes it or --account-for-*-in-"
                          "pipeline-split, not both")
    try:
        layout = PipelineLayout.parse(text, pp)
    except PlanError as exc:
        raise refuse_plan(where, key, text, str(exc).split(": ", 1)[-1]) from None
    given = [k for k in ("first_stage_layers", "last_stage_layers") if job.plan.get(k)]
    if given:
        raise refuse_plan(where, key, text, "Megatron-LM takes it or --decoder-first/last-"
                          "pipeline-num-layers, not both")
    if chunks is not None and chunks != layout.virtual_stages:
        raise refuse_plan(where, key, text, f"gives {layout.virtual_stages} virtual stages per "
                          f"rank ({len(layout.stages)} stages over pp {pp}), the config "
                          f"{chunks}")
    job.fix("pipeline_layout", layout.text)
    take("pipeline_model_parallel_layout", f"pipeline_layout {layout.text}, virtual_stages "
                                           f"{layout.virtual_stages}")
    return layout.virtual_stages


def _accounted(settings: Settings, job: JobConfig, where: str,
               take: Callable[[str, str], None], pp: int, chunks: int | None,
               accounted: dict[str, bool]) -> int | None:
    """--account-for-embedding/loss-in-pipeline-split (Megatron-Bridge's Qwen3 recipes turn
    both on): the embedding and the loss each count as a layer of the first and the last stage,
    as the pipeline layout perfmodel.pipeline_layout.accounted_layout writes. With one pipeline
    stage they change nothing."""
    names = [f"account_for_{end}_in_pipeline_split" for end, on in accounted.items() if on]
    if pp == 1:
        for dest in names:
            take(dest, "one pipeline stage: no split")
        return chunks
    key = settings[names[0]][0]
    if job.plan.get("first_stage_layers") or job.plan.get("last_stage_layers"):
        raise refuse_plan(where, key, True, "Megatron-LM takes it or --decoder-first/last-"
                          "pipeline-num-layers, not both")
    layers = job.model.get("layers")
    if layers is None:
        raise refuse_plan(where, key, True, "needs the model's layers (--num-layers)")
    try:
        text = accounted_layout(int(layers), pp, chunks or 1, mtp=int(job.model.get(
            "mtp_layers") or 0), **accounted)
    except PlanError as exc:
        raise refuse_plan(where, key, True, str(exc)) from None
    job.fix("pipeline_layout", text)
    for dest in names:
        take(dest, f"pipeline_layout {text}")
    return chunks


def _degrees(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None]
             ) -> None:
    explicit = {dest for dest in settings if settings[dest][1] is not None}
    tp = _int(settings, "tensor_model_parallel_size", where, 1) or 1
    pp = _int(settings, "pipeline_model_parallel_size", where, 1) or 1
    job.fix("tp", tp, pin="tensor_model_parallel_size" in explicit)
    job.fix("pp", pp, pin="pipeline_model_parallel_size" in explicit)
    # Megatron-Core's layer with Transformer Engine: fused norms (TE LayerNormLinear / RMSNorm),
    # fused RoPE, bias-SwiGLU / bias-GeLU and bias-dropout-add (perfmodel.strategy.Kernels)
    job.fix("kernels", "fused")
    take("tensor_model_parallel_size", f"tp {tp}")
    take("pipeline_model_parallel_size", f"pp {pp}")
    per_stage = _int(settings, "num_layers_per_virtual_pipeline_stage", where)
    chunks = _int(settings, "num_virtual_stages_per_pipeline_rank", where)
    if per_stage is not None and chunks is not None:
        raise SpecError(f"{where}: give --num-layers-per-virtual-pipeline-stage or "
                        "--num-virtual-stages-per-pipeline-rank, not both (Megatron-LM)")
    if per_stage is not None:
        layers = job.model.get("layers")
        if layers is None or layers % (pp * per_stage):
            raise refuse_plan(where, "--num-layers-per-virtual-pipeline-stage", per_stage,
                              f"the layers ({layers}) must split into pp ({pp}) x whole "
                              f"chunks of {per_stage}")
        chunks = layers // (pp * per_stage)
        take("num_layers_per_virtual_pipeline_stage", f"virtual_stages {chunks}")
    elif chunks is not None:
        take("num_virtual_stages_per_pipeline_rank", f"virtual_stages {chunks}")
    chunks = _layout(settings, job, where, take, pp, chunks)
    _microbatch_groups(settings, where, take, pp, chunks or 1)
    if chunks is not None:
        job.fix("virtual_stages", chunks)
        job.fix("schedule", "interleaved" if chunks > 1 else "1f1b")
    else:
        job.fix("virtual_stages", 1, pin="pipeline_model_parallel_size" in explicit)
        job.fix("schedule", "1f1b", pin="pipeline_model_parallel_size" in explicit)
    job.fix("tp_layout", "1d")
    mapping = _flag(settings, "use_tp_pp_dp_mapping", where)
    job.fix("placement", "tp,pp,dp" if mapping else "tp,dp,pp")
    take("use_tp_pp_dp_mapping", "placement tp,pp,dp")
    sp = _flag(settings, "sequence_parallel", where)
    if sp and tp == 1:
        job.notes.append("--sequence-parallel with tp 1: Megatron-LM switches it off")
        sp = False
    job.fix("sequence_parallel", sp, pin="sequence_parallel" in explicit or tp > 1)
    take("sequence_parallel", f"sequence_parallel {str(sp).lower()}")
    micro = _int(settings, "micro_batch_size", where, 1) or 1
    job.fix("micro_batch", micro, pin="micro_batch_size" in explicit)
    take("micro_batch_size", f"micro_batch {micro}")
    batch = _int(settings, "global_batch_size", where)
    if batch is not None and "step_batch_size_schedule" in settings:
        # Megatron-LM's arguments.py at d98e8a64 raises on both, and its own example
        # (examples/gpt3/train_gpt3_175b_distributed.sh) gives both: read where they agree
        text = str(settings["step_batch_size_schedule"][1])
        last = step_batch_size_schedule(text, where)
        if last != batch:
            raise SpecError(f"{where}: --step-batch-size-schedule {text} ends at {last}, "
                            f"--global-batch-size is {batch}: Megatron-LM raises on both "
                            "('Cannot specify both'); give one")
        job.notes.append(f"--step-batch-size-schedule and --global-batch-size {batch}: "
                         "Megatron-LM's arguments.py raises on both; they agree on the last "
                         f"batch, {batch}")
        take("step_batch_size_schedule", f"global_batch {last}: the step after its last "
                                         "threshold is predicted")
    if batch is not None:
        job.fix("global_batch", batch)
        take("global_batch_size", f"global_batch {batch}")
    elif "step_batch_size_schedule" in settings:
        last = step_batch_size_schedule(str(settings["step_batch_size_schedule"][1]), where)
        job.fix("global_batch", last)
        take("step_batch_size_schedule", f"global_batch {last}: the step after its last "
                                         "threshold is predicted")
    else:
        job.notes.append("no --global-batch-size: Megatron-LM's default, micro-batch x "
                         "data-parallel size (one micro-batch per step)")
    if "rampup_batch_size" in settings:
        take("rampup_batch_size", "the step after the ramp-up (the full global batch) is "
                                  "predicted")


def _microbatch_groups(settings: Settings, where: str, take: Callable[[str, str], None],
                       pp: int, chunks: int) -> None:
    """--microbatch-group-size-per-virtual-pipeline-stage N: Megatron-Core's interleaved 1F1B
    runs N micro-batches through one virtual stage before the next (megatron/core/
    pipeline_parallel/schedules.py get_schedule_table at d98e8a64; N pp by default,
    model_parallel_config.py), its warm-up (v - 1) N micro-batches long, and takes a number of
    micro-batches M with pp <= N <= M and M % N 0 or at least pp. perfmodel's interleaved
    schedule is the default's, groups of pp (M a multiple of pp): N = pp is read, another N
    refused; without virtual stages the schedule does not read it."""
    group = _int(settings, "microbatch_group_size_per_virtual_pipeline_stage", where)
    if group is None:
        return
    dest = "microbatch_group_size_per_virtual_pipeline_stage"
    if chunks == 1 or pp == 1:
        take(dest, "no effect without the interleaved schedule (virtual pipeline stages)")
    elif group != pp:
        raise refuse_plan(where, settings[dest][0], group,
                          f"interleaved 1F1B in groups of {group} micro-batches a virtual stage "
                          f"is not modelled: perfmodel's runs Megatron-Core's default, groups of "
                          f"pp ({pp}), with the micro-batches (--global-batch-size / (dp x "
                          f"--micro-batch-size)) a multiple of pp: give {pp}, or leave it out")
    else:
        take(dest, f"groups of pp ({pp}) micro-batches a virtual stage: Megatron-Core's default")


_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def step_batch_size_schedule(text: str, where: str) -> int:
    """The last global batch of --step-batch-size-schedule "THRESHOLD:BS ..." (spaces or commas
    between; numbers with a K, M, B or T suffix), as Megatron-Core's
    StepBatchsizeNumMicroBatchesCalculator reads it (megatron/core/num_microbatches_calculator.py
    at d98e8a64: sorted by threshold, the first 0, strictly increasing, batches > 0)."""
    def number(word: str) -> int:
        word = word.strip().upper()
        scale = _SUFFIXES.get(word[-1:], 1)
        value = float(word[:-1] if scale > 1 else word)
        if value != value or value in (float("inf"), -float("inf")) or abs(value) > 1e18:
            raise ValueError
        return int(value * scale)

    steps = []
    for entry in text.replace(",", " ").split():
        threshold, colon, size = entry.partition(":")
        try:
            if not colon:
                raise ValueError
            steps.append((number(threshold), number(size)))
        except ValueError:
            raise SpecError(f"{where}: --step-batch-size-schedule {text}: '{entry}' is not "
                            "THRESHOLD:BATCH_SIZE (Megatron-Core's format)") from None
    steps.sort()
    if not steps or steps[0][0] != 0 or len({t for t, _ in steps}) != len(steps):
        raise SpecError(f"{where}: --step-batch-size-schedule {text}: Megatron-Core needs a first "
                        "threshold 0 and strictly increasing thresholds")
    if any(size < 1 for _, size in steps):
        raise SpecError(f"{where}: --step-batch-size-schedule {text}: every THRESHOLD:BATCH_SIZE "
                        "needs a batch size >= 1")
    return steps[-1][1]


# Megatron-LM's --fp8-recipe (Transformer Engine's recipes) as perfmodel's Plan.fp8_recipe:
# tensorwise is TE's Float8CurrentScaling; blockwise (DeepSeek-style 128-blocks) is not modelled
FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current", "mxfp8": "mxfp8"}


# torch's dtype names as Megatron-LM's arguments spell them
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "fp8"}


def _precision_aware_optimizer(settings: Settings, job: JobConfig, where: str,
                               take: Callable[[str, str], None]) -> None:
    """Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer: Transformer
    Engine's FusedAdam holds the optimizer's tensors, OptimizerConfig in megatron/core/optimizer/
    optimizer_config.py): --main-grads-dtype fp32|bf16 (grad_dtype), --exp-avg-dtype and
    --exp-avg-sq-dtype fp32|bf16 (optimizer_dtype: one dtype for both) and the master weights,
    --main-params-dtype fp32 kept as the 16 bits the bf16 weight lacks
    (store_param_remainders, on unless --no-store-param-remainders; master_weights remainders)
    or whole (fp32; perfmodel.costs.precision.megatron_master_weights says where). Without the
    flag Megatron-Core takes none of these dtypes: fp32 only."""
    aware = _flag(settings, "use_precision_aware_optimizer", where)
    dtypes = {}
    for dest in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        text = _str(settings, dest)  # Megatron-LM's names, or torch's (Megatron-Bridge's YAML)
        name = "fp32" if text in (None, "None", "null") else text.strip().lower()
        dtypes[dest] = _TORCH_DTYPES.get(name.removeprefix("torch."), name)
        if dtypes[dest] != "fp32" and not aware:
            raise refuse_plan(where, settings[dest][0], text,
                              "Megatron-Core takes it with --use-precision-aware-optimizer only")
    if not aware:
        for dest in ("store_param_remainders", "no_store_param_remainders"):
            take(dest, "no master weights' remainders without a precision-aware optimizer")
        return
    if job.plan.get("dtype") not in ("bf16", "fp8"):
        raise refuse_plan(where, settings["use_precision_aware_optimizer"][0], True,
                          "a precision-aware optimizer is modelled for bf16 mixed precision "
                          f"(dtype here: {job.plan.get('dtype')})")
    for dest, allowed, field_name in (("main_grads_dtype", ("fp32", "bf16"), "grad_dtype"),
                                      ("main_params_dtype", ("fp32",), None),
                                      ("exp_avg_dtype", ("fp32", "bf16"), "optimizer_dtype")):
        if dtypes[dest] not in allowed:
            raise refuse_plan(where, settings[dest][0], dtypes[dest],
                              f"not modelled ({' or '.join(allowed)} is)")
        if field_name and dtypes[dest] != "fp32":
            job.fix(field_name, dtypes[dest])
        take(dest, f"{field_name or 'master weights'} {dtypes[dest]}")
    if dtypes["exp_avg_sq_dtype"] != dtypes["exp_avg_dtype"]:
        raise refuse_plan(where, settings.get("exp_avg_sq_dtype", ("--exp-avg-sq-dtype",))[0],
                          dtypes["exp_avg_sq_dtype"],
                          f"perfmodel keeps both Adam moments in one dtype (--exp-avg-dtype "
                          f"{dtypes['exp_avg_dtype']})")
    take("exp_avg_sq_dtype", f"optimizer_dtype {dtypes['exp_avg_sq_dtype']}")
    remainders = not _flag(settings, "no_store_param_remainders", where) and (
        "store_param_remainders" not in settings
        or _flag(settings, "store_param_remainders", where))
    master = megatron_master_weights(remainders, job.plan.get("fp8_recipe"),
                                     bool(job.plan.get("fp8_params")))
    take("store_param_remainders", f"master_weights {master}")
    take("no_store_param_remainders", "master_weights fp32")
    if remainders and master == "fp32":
        job.notes.append("--use-precision-aware-optimizer under FP8 "
                         f"({job.plan.get('fp8_recipe')} scaling"
                         + (", FP8 weights" if job.plan.get("fp8_params") else "")
                         + "): the master weights counted whole (fp32), as Megatron-Core keeps "
                           "them there")
    job.fix("master_weights", master)
    take("use_precision_aware_optimizer", "its dtypes (grad_dtype, optimizer_dtype, "
                                          "master_weights)")


def _fp8(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
         dtype: str) -> None:
    """--fp8-format (e4m3 or hybrid: they cost alike) with --bf16: dtype fp8 (docs/fp8.md), with
    --fp8-recipe (default delayed, Megatron-LM's) and --fp8-param-gather (fp8_params)."""
    fmt = _str(settings, "fp8_format")
    if fmt in (None, "None", "null", "False", "false"):
        for dest in ("fp8_recipe", "fp8_param_gather"):
            take(dest, "no --fp8-format: not used")
        for dest in _BF16_LAYERS:
            take(dest, "no effect without FP8 (no --fp8-format)")
        return
    key = settings["fp8_format"][0]
    # Megatron-LM's choices for --fp8-format (and Megatron-Bridge's mixed_precision.fp8); a
    # Bridge precision preset named by its string (bf16_with_fp8_..._mixed) is its own
    preset = not key.startswith("--") and "fp8" in fmt.lower()
    if fmt.lower() not in ("e4m3", "hybrid") and not preset:
        raise refuse_plan(where, key, fmt, "e4m3 or hybrid (Megatron-Core's choices; hybrid "
                                           "takes E5M2 for the gradients)")
    if dtype != "bf16":
        raise refuse_plan(where, settings["fp8_format"][0], fmt,
                          f"FP8 is modelled over bf16 mixed precision, not {dtype} (give --bf16)")
    recipe = _str(settings, "fp8_recipe", "delayed") or "delayed"
    if recipe not in FP8_RECIPES:
        raise refuse_plan(where, settings["fp8_recipe"][0], recipe,
                          f"perfmodel models the FP8 recipes {', '.join(FP8_RECIPES)}")
    _bf16_layers(settings, where, take, recipe)
    job.fix("dtype", "fp8")
    job.fix("fp8_recipe", FP8_RECIPES[recipe])
    take("fp8_format", f"dtype fp8 (format {fmt}: E4M3 and E5M2 GEMMs cost alike)")
    take("fp8_recipe", f"fp8_recipe {FP8_RECIPES[recipe]}")
    if "fp8_recipe" not in settings:
        job.notes.append("no --fp8-recipe: Megatron-LM's default, delayed scaling")
    mx = FP8_RECIPES[recipe] == "mxfp8"
    reuse = _flag(settings, "reuse_grad_buf_for_mxfp8_param_ag", where)
    if _flag(settings, "fp8_param_gather", where) and _flag(settings, "use_torch_fsdp2", where):
        # megatron/training/arguments.py: "FSDP2 FP8 param gather is not supported yet in TE
        # 2.0, will fallback to bf16 all_gather", and it turns the option off
        job.fix("fp8_params", False)
        take("fp8_param_gather", "off beside --use-torch-fsdp2: Megatron-LM turns it off with "
                                 "Transformer Engine 2.0 or later (bf16 all-gathers): fp8_params "
                                 "false")
    elif _flag(settings, "fp8_param_gather", where):
        # MXFP8 weights without the gradient buffer's reuse: Megatron-Core keeps the bf16 weight
        # buffer beside them, as the model counts weights that are not held in FP8
        job.fix("fp8_params", reuse or not mx)
        take("fp8_param_gather",
             "fp8_params (the weights held and all-gathered in FP8)" if not mx else
             "fp8_params (MXFP8 weights, gathered in bf16 into the gradient buffer)" if reuse
             else "MXFP8 weights beside the bf16 weight buffer (no "
                  "--reuse-grad-buf-for-mxfp8-param-ag): fp8_params false")
    take("reuse_grad_buf_for_mxfp8_param_ag", "the bf16 weights gathered into the gradient "
                                              "buffer (MXFP8 weights, fp8_params)")


# Megatron-Core's first and last layers kept in bf16 under FP8 (TransformerConfig's
# first_last_layers_bf16, num_layers_at_start_in_bf16 and _end_in_bf16, each 1 by default)
_BF16_LAYERS = ("first_last_layers_bf16", "num_layers_at_start_in_bf16",
                "num_layers_at_end_in_bf16")


def _bf16_layers(settings: Settings, where: str, take: Callable[[str, str], None],
                 recipe: str) -> None:
    """--first-last-layers-bf16 under FP8: Megatron-Core runs the first and the last layers'
    GEMMs in bf16 (fp8_utils.py is_first_last_bf16_layer at d98e8a64), which perfmodel does not
    model (every layer's GEMMs are FP8 under dtype fp8): refused, as the NeMo reader refuses
    it; with delayed scaling as Megatron-Core raises (transformer_config.py __post_init__). The
    counts without the flag, or the flag with both counts 0, keep no layer in bf16."""
    counts = [_int(settings, dest, where, 1, minimum=0) or 0 for dest in _BF16_LAYERS[1:]]
    if not _flag(settings, "first_last_layers_bf16", where):
        for dest in _BF16_LAYERS:
            take(dest, "no effect without --first-last-layers-bf16")
        return
    key = settings["first_last_layers_bf16"][0]
    if recipe == "delayed":
        raise refuse_plan(where, key, True, "Megatron-Core raises 'Delayed scaling does not "
                          "support first / last layer in BF16'")
    if any(counts):
        raise refuse_plan(where, key, True, "FP8 layers kept in bf16 are not modelled (every "
                          f"layer's GEMMs are FP8 under dtype fp8; here the first {counts[0]} "
                          f"and the last {counts[1]})")
    for dest in _BF16_LAYERS:
        take(dest, "no layer kept in bf16 (0 at the start and at the end)")


_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")


def _cuda_graphs(settings: Settings, job: JobConfig, where: str,
                 take: Callable[[str, str], None]) -> None:
    """The stack: Megatron-Core runs eager (no torch.compile of its layers) unless CUDA graphs
    capture them. --cuda-graph-impl local or transformer_engine graphs each layer over
    --cuda-graph-modules (--cuda-graph-scope before; "full", the default, the whole layer),
    full_iteration the forward and backward whole; --enable-cuda-graph and --external-cuda-graph
    are the older names of local and transformer_engine (megatron/training/arguments.py,
    TransformerConfig.cuda_graph_impl). Graphs over part of a layer (attn alone, or an MoE
    layer's router and preprocess) are read as the eager stack, with a note: the cuda-graphs
    stack graphs whole layers."""
    impl = _str(settings, "cuda_graph_impl", "none") or "none"
    key = settings["cuda_graph_impl"][0] if "cuda_graph_impl" in settings else "--cuda-graph-impl"
    for flag, name in (("enable_cuda_graph", "local"),
                       ("external_cuda_graph", "transformer_engine")):
        if _flag(settings, flag, where):
            if impl != "none":
                raise refuse_plan(where, settings[flag][0], True,
                                  f"give it or {key} {impl}, not both (Megatron-LM refuses both)")
            impl, key = name, settings[flag][0]
            take(flag, f"CUDA graphs ({name})")
    if impl not in _GRAPH_IMPLS:
        raise refuse_plan(where, key, impl, f"one of {', '.join(_GRAPH_IMPLS)}")
    if impl == "none":
        job.fix("stack", "eager")
        take("cuda_graph_impl", "stack eager")
        return
    given = next((d for d in ("cuda_graph_modules", "cuda_graph_scope") if d in settings), "")
    modules = settings[given][1] if given else "full"
    where_key = settings[given][0] if given else key
    if isinstance(modules, str):
        modules = [m for m in modules.replace(",", " ").split() if m]
    if not isinstance(modules, list | tuple):
        raise refuse_plan(where, where_key, modules,
                          "a list of modules (attn, mlp, moe, ...) or full")
    # a Megatron-Bridge dump writes each module as its enum ({_target_: ...CudaGraphModule,
    # _name_: attn, ...}); an argument list or a hand-written YAML as its name
    names = {str(m.get("_name_", m.get("_args_", [""])[0]) if isinstance(m, dict) else m)
             .rsplit(".", 1)[-1].lower() for m in modules}
    moe = bool(job.model.get("experts"))
    whole = impl == "full_iteration" or not names or names <= {"full", "full_iteration"} \
        or {"attn", "moe" if moe else "mlp"} <= names
    if not whole:  # as the AutoModel reader reads its partial graphs: eager, said so
        job.fix("stack", "eager")
        take("cuda_graph_impl", f"{impl} over part of each layer: stack eager")
        if given:
            take(given, f"{', '.join(sorted(names))}: part of each layer")
        job.notes.append(f"{where_key} {', '.join(sorted(names))}: CUDA graphs over part of "
                         "each layer are not modelled (perfmodel's cuda-graphs stack graphs whole "
                         "layers): the layers are costed on the eager stack, their host time as "
                         "if nothing were graphed")
        return
    job.fix("stack", "cuda-graphs")
    take("cuda_graph_impl", f"{impl}: stack cuda-graphs (whole layers graphed)")
    if given:
        take(given, f"{', '.join(sorted(names))}: whole layers")


def _megatron_lm(settings: Settings, job: JobConfig, where: str) -> bool:
    """Whether the settings are a Megatron-LM launch's, whose validate_args applies (not
    Megatron-DeepSpeed's, nor NeMo's or Megatron-Bridge's configs, which validate their own way)."""
    return job.framework is Framework.MEGATRON and not _flag(settings, "deepspeed", where)


def _megatron_lm_asserts(settings: Settings, where: str) -> None:
    """What Megatron-LM's argument validation refuses at start-up (megatron/training/
    arguments.py, validate_args, at d98e8a64), among the options perfmodel reads: a script it
    would stop is refused, not predicted. (NeMo's and Megatron-Bridge's configs are not checked
    here: they validate their own way.)"""
    def given(dest: str) -> bool:
        return dest in settings and _flag(settings, dest, where)

    def refuse(dest: str, why: str) -> PlanError:
        return refuse_plan(where, settings[dest][0], settings[dest][1], why)

    if given("overlap_param_gather") and not given("overlap_grad_reduce"):
        raise refuse("overlap_param_gather", "Megatron-LM asserts --overlap-grad-reduce with it")
    if given("use_torch_fsdp2"):
        if given("use_distributed_optimizer"):
            raise refuse("use_torch_fsdp2", "Megatron-LM asserts it without "
                                            "--use-distributed-optimizer (FSDP2 shards the states)")
        if not given("untie_embeddings_and_output_weights"):
            raise refuse("use_torch_fsdp2", "Megatron-LM asserts "
                                            "--untie-embeddings-and-output-weights with it")
        if "gradient_accumulation_fusion" not in settings \
                or _flag(settings, "gradient_accumulation_fusion", where):
            raise refuse("use_torch_fsdp2", "Megatron-LM asserts --no-gradient-accumulation-"
                                            "fusion with it (the fusion is on by default)")
    if given("fp8_param_gather") and not (given("use_distributed_optimizer") or given(
            "use_torch_fsdp2") or given("use_megatron_fsdp")):
        raise refuse("fp8_param_gather", "Megatron-LM asserts the distributed optimizer, "
                                         "--use-torch-fsdp2 or Megatron FSDP with it")
    granularity = _str(settings, "recompute_granularity")
    method = _str(settings, "recompute_method")
    if granularity == "selective" and method not in (None, "None", "null"):
        raise refuse("recompute_method", "Megatron-LM asserts no recompute method beside "
                                         "--recompute-granularity selective")


def _options(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None]
             ) -> None:
    bf16, fp16 = _flag(settings, "bf16", where), _flag(settings, "fp16", where)
    if bf16 and fp16:
        raise SpecError(f"{where}: --bf16 and --fp16 are both given; Megatron-LM takes one")
    dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    job.fix("dtype", dtype)
    take("bf16", f"dtype {dtype}")
    take("fp16", f"dtype {dtype}")
    if dtype == "fp32":
        job.notes.append("neither --bf16 nor --fp16: Megatron-LM trains in fp32 (dtype fp32)")
    _fp8(settings, job, where, take, dtype)
    if _flag(settings, "grad_reduce_in_bf16", where):
        if dtype != "bf16":
            key = settings["grad_reduce_in_bf16"][0]
            # the precision's setting as the config names it (NeMo 1: trainer.precision)
            given = next((settings[d][0] for d in ("bf16", "fp16") if d in settings), None)
            need = "--bf16" if key.startswith("--") or not given else \
                f"bf16 precision ({given} trains {dtype})"
            raise refuse_plan(where, key, True, f"a bf16 gradient buffer needs {need}"
                              + (f" (dtype here: {dtype})" if "trains" not in need else ""))
        # DistributedDataParallelConfig.grad_reduce_in_fp32 = False: the main-gradient buffer
        # and its reduction in bf16 (Megatron-LM training/arguments.py, distributed/
        # distributed_data_parallel_config.py)
        job.fix("grad_dtype", "bf16")
        take("grad_reduce_in_bf16", "grad_dtype bf16 (main gradients kept and reduced in bf16)")
    _precision_aware_optimizer(settings, job, where, take)
    _recompute(settings, job, where, take)
    _cpu_offload(settings, job, where, take)
    torch_fsdp = _flag(settings, "use_torch_fsdp2", where)
    dist_opt = _flag(settings, "use_distributed_optimizer", where)
    zero = 3 if torch_fsdp else 1 if dist_opt else 0
    strategy = _str(settings, "data_parallel_sharding_strategy")
    # Megatron-Core reads the strategy only under Megatron FSDP (core/optimizer/__init__.py,
    # distributed/fsdp at d98e8a64dd): Megatron-LM's own default is optim_grads_params since
    # 3499efef80, and Megatron-Bridge's recipes (recipes/common.py at 067f987df) set it beside
    # the distributed optimizer without FSDP, where it changes nothing
    megatron_fsdp = _flag(settings, "use_megatron_fsdp", where) \
        or _flag(settings, "use_custom_fsdp", where)
    if strategy not in (None, "no_shard") and megatron_fsdp:
        raise refuse_plan(where, settings["data_parallel_sharding_strategy"][0], strategy,
                          "Megatron FSDP's sharding is not modelled (--use-torch-fsdp2 is: ZeRO "
                          "stage 3; --use-distributed-optimizer: stage 1)")
    job.fix("zero", zero)
    if _megatron_lm(settings, job, where):
        _megatron_lm_asserts(settings, where)
    if torch_fsdp:  # megatron/training/arguments.py asserts both (at d98e8a64)
        for key, flag in (("pp", "--pipeline-model-parallel-size"),
                          ("ep", "--expert-model-parallel-size")):
            if job.plan.get(key, 1) > 1:
                raise refuse_plan(where, "--use-torch-fsdp2", True,
                                  f"Megatron-LM runs it without {flag.strip('-')} > 1, got "
                                  f"{job.plan[key]}")
            job.fix(key, 1)
    take("use_distributed_optimizer", "zero 1 (optimizer states sharded over dp)" if dist_opt
         else "no distributed optimizer" + (" (zero 3 from FSDP2)" if torch_fsdp else
                                            ": zero 0 (optimizer states replicated)"))
    take("use_torch_fsdp2", "zero 3 (PyTorch FSDP2)")
    _sharding_options(settings, job, where, take, zero)
    take("data_parallel_sharding_strategy", "no sharding" if strategy in (None, "no_shard") else
         "Megatron FSDP's sharding: no effect without Megatron FSDP (--use-megatron-fsdp), "
         f"the only reader of it (zero {zero} as the other options say)")
    grad = _flag(settings, "overlap_grad_reduce", where)
    param = _flag(settings, "overlap_param_gather", where)
    if param and zero != 1:
        raise refuse_plan(where, "--overlap-param-gather", True,
                          "applies to --use-distributed-optimizer (Megatron-LM)")
    impl = _str(settings, "DDP_impl")
    if impl is not None:
        # Megatron-LM before 2023-08 (3fb3e95e): local (its default) all-reduces the gradients
        # after the last micro-batch, torch's DDP during the backward; its pipeline schedules
        # used no_sync only without a pipeline (schedules.py), so with pp > 1 torch's DDP
        # all-reduced in every micro-batch
        if impl not in ("local", "torch"):
            raise refuse_plan(where, "--DDP-impl", impl, "Megatron-LM's values: local, torch")
        if impl == "torch" and job.plan.get("pp", 1) > 1:
            raise refuse_plan(where, "--DDP-impl", impl, "with a pipeline Megatron-LM's torch "
                              "DDP all-reduced the gradients in every micro-batch: not modelled")
        if grad and impl == "local":
            raise SpecError(f"{where}: --DDP-impl local and --overlap-grad-reduce contradict")
        grad = impl == "torch"
        take("DDP_impl", "overlap_grad_sync (torch's DDP reduces during the backward)" if grad
             else "no overlap: Megatron-LM's local DDP all-reduces after the last micro-batch")
    job.fix("overlap_grad_sync", grad)
    take("overlap_grad_reduce", "overlap_grad_sync (the gradient reduction hides behind the "
                                "last micro-batch's backward)" if grad
         else "overlap_grad_sync false")
    _buckets(settings, job, where, take, grad, zero, impl)
    if zero == 3:  # FSDP2 issues the next unit's all-gather while the current one computes
        job.fix("overlap_param_gather", True, pin=False)
        job.notes.append("--use-torch-fsdp2: FSDP2 prefetches the next unit's parameters "
                         "(its default): overlap_param_gather")
    else:
        job.fix("overlap_param_gather", param)
    take("overlap_param_gather", "overlap_param_gather (the weight all-gather hides behind the "
                                 "next forward)" if job.plan.get("overlap_param_gather")
         else "overlap_param_gather false")
    _cross_entropy(settings, job, where, take)
    _cuda_graphs(settings, job, where, take)
    tp_overlap = _flag(settings, "tp_comm_overlap", where)
    job.fix("tp_comm_overlap", tp_overlap)
    take("tp_comm_overlap", "tp_comm_overlap (tensor-parallel communication behind the GEMMs, "
                            "Transformer Engine's userbuffers)" if tp_overlap
         else "tp_comm_overlap false")
    # megatron/training/initialize.py _initialize_tp_communicators: the userbuffers' YAML
    # (each GEMM's overlap method, SMs, chunks) handed to Transformer Engine's initialize_ub
    take("tp_comm_overlap_cfg", "the userbuffers' settings (how each GEMM's communication "
                                "overlaps): tuning of the overlap tp_comm_overlap costs, the "
                                "file not read" if tp_overlap
         else "no effect without --tp-comm-overlap")
    if _flag(settings, "overlap_moe_expert_parallel_comm", where):
        job.fix("ep_comm_overlap", True)
        take("overlap_moe_expert_parallel_comm", "ep_comm_overlap (the all-to-alls of one "
                                                 "micro-batch behind another's compute)")
    if not _flag(settings, "deepspeed", where):  # Megatron-DeepSpeed's switches decide it
        _attention(settings, job, where, take, dtype, _implementation(settings, job, where, take))
    else:
        take("transformer_impl", "the same GEMMs")
    _older_sends(settings, job, where, take)
    megatron_deepspeed.apply(settings, job, where, take, _flag)
    _fusions(settings, job, where, take, dtype)


def _sharding_options(settings: Settings, job: JobConfig, where: str,
                      take: Callable[[str, str], None], zero: int) -> None:
    """--torch-fsdp2-no-reshard-after-forward (FSDP2's reshard_after_forward false, megatron/
    training/training.py get_megatron_ddp_config at d98e8a64: each unit's gathered weights kept
    from its forward to its backward): Plan.fsdp_reshard backward, as the torchtitan reader
    reads fsdp_reshard_after_forward "never"; no effect without --use-torch-fsdp2.
    --num-distributed-optimizer-instances N (DistributedDataParallelConfig): 1, Megatron-LM's
    default, shards the optimizer over every data-parallel rank; N > 1 shards it within dp / N
    ranks and reduces the gradients across the N instances besides (megatron/core/
    parallel_state.py's intra- and inter-instance groups), which perfmodel's zero 1 does not
    model: refused."""
    dest = "torch_fsdp2_no_reshard_after_forward"
    if _flag(settings, dest, where) and zero == 3:
        job.fix("fsdp_reshard", "backward")
        take(dest, "fsdp_reshard backward (each unit's gathered weights kept from its forward to "
                   "its backward)")
    else:
        take(dest, "no effect without --use-torch-fsdp2")
    dest = "num_distributed_optimizer_instances"
    instances = _int(settings, dest, where)
    if instances is not None and instances > 1:
        raise refuse_plan(where, settings[dest][0], instances,
                          "several distributed-optimizer instances (the states sharded within "
                          "dp / N ranks, the gradients reduced across the N) are not modelled: "
                          "perfmodel's zero 1 shards over every data-parallel rank: give 1")
    take(dest, "one instance: the optimizer sharded over every data-parallel rank"
         if zero == 1 else "1: no distributed optimizer to split")


def _grad_accumulation(settings: Settings, job: JobConfig, where: str,
                       keep: Callable[[str, str], None], refuse: Callable[[str, str], PlanError],
                       off: bool) -> None:
    """--no-gradient-accumulation-fusion (NeMo's and Megatron-Bridge's gradient_accumulation_
    fusion false): the weight gradients written in the parameter's dtype and added into the main
    gradients by DDP's hook, Plan.grad_accumulation_fusion false (perfmodel.step.
    grad_accumulation). With --use-torch-fsdp2 (zero 3) Megatron-LM requires it off (arguments.py
    at d98e8a64: "--use-torch-fsdp2 is not supported with gradient accumulation fusion"), and FSDP2
    reduce-scatters the backward's own gradients: the same cost. Under DeepSpeed's engine
    (Megatron-DeepSpeed) DeepSpeed accumulates the gradients: not modelled apart, refused."""
    if not off:
        keep("gradient_accumulation_fusion", "the weight gradient GEMM accumulates into the main "
                                             "gradient")
    elif _flag(settings, "deepspeed", where) or job.plan.get("bf16_optimizer"):
        raise refuse("gradient_accumulation_fusion",
                     "under DeepSpeed's engine the weight gradients accumulate in DeepSpeed's "
                     "buffers, not modelled apart: leave the fusion on")
    elif job.plan.get("zero") == 3:
        keep("gradient_accumulation_fusion", "FSDP2 (zero 3) reduce-scatters the backward's own "
                                             "gradients, as modelled (Megatron-LM requires the "
                                             "fusion off there)")
    else:
        job.fix("grad_accumulation_fusion", False)
        keep("gradient_accumulation_fusion", "grad_accumulation_fusion false: each micro-batch's "
                                             "weight gradients added into the main gradients "
                                             "apart, a pass over the linear weights")


def _model_value(job: JobConfig, field_name: str, default: Any) -> Any:
    """A model field as read, else the preset's (NeMo 2's config classes), else default; None
    where the model is not known here (a Megatron-Bridge override file's: the recipe's)."""
    if field_name in job.model:
        return job.model[field_name]
    if job.preset:
        from perfmodel.specs.model import load_model

        try:
            return getattr(load_model(job.preset), field_name, default)
        except SpecError:  # no preset: the recipe's model, which --model gives later
            return None
    return default


def _fusions(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
             dtype: str) -> None:
    """Megatron-Core's fused kernels and numerics switches that change the step's cost where
    they take effect (megatron/training/arguments.py and megatron/core/transformer at d98e8a64):
    perfmodel costs the fused kernels (Plan.kernels fused: one RoPE kernel, bias-SwiGLU /
    bias-GeLU, bias-dropout-add, the scaled masked softmax of unfused attention, the weight
    gradient accumulated into the fp32 main gradient by the GEMM), so where one of them is off
    the layer runs that part op by op, not modelled apart from the whole layer's eager kernels.
    Where that costs a few element-wise passes over a layer's activations (RoPE, the bias and
    activation, bias-dropout-add) it is read and said not modelled; where it costs more
    (unfused attention's softmax op by op over s^2 scores) it is refused; the weight gradients
    added apart are Plan.grad_accumulation_fusion false (_grad_accumulation); where
    Megatron-Core would not use the kernel anyway (no RoPE, no bias and no dropout to add,
    flash attention) it is no change. Likewise --qk-layernorm (a norm of every
    query and key head: said not modelled), --fp32-residual-connection (the residual stream
    kept in fp32: refused) and --accumulate-allreduce-grads-in-fp32 (fp32 main gradients:
    Megatron-LM's default with --bf16; with --fp16 refused)."""
    def off(dest: str) -> bool:
        return dest in settings and not _flag(settings, dest, where)

    def keep(dest: str, why: str) -> None:
        take(dest, f"{'off' if off(dest) else 'on'}: {why}")

    def refuse(dest: str, why: str) -> PlanError:
        key, value = settings[dest]
        if value is False and key.startswith("--") and key[2:] in NEGATED:
            value = True  # --no-masked-softmax-fusion: the switch as given, not its dest's
        return refuse_plan(where, key, value, why)

    # None: not known here (an override file's recipe model): as where the kernel runs
    rotary = _model_value(job, "position_embedding", "learned") in ("rotary", None)
    gated = _model_value(job, "gated_mlp", False)
    swiglu = gated in (True, None)
    bias = _model_value(job, "bias", True) in (True, None)
    rate = _model_value(job, "hidden_dropout", MEGATRON_DROPOUT)
    dropout = MEGATRON_DROPOUT if rate is None else float(rate or 0)
    kernels = job.plan.get("kernels", "fused")
    # A fusion switched off where it takes effect, with a small cost (a few element-wise passes
    # over a layer's activations against its GEMMs), is read and said not modelled, as
    # Megatron-DeepSpeed's reader says of --embed-layernorm: refusing it would refuse most of
    # Megatron-LM's own example and test scripts, which switch these off where apex is missing
    unfused = "op by op: its extra element-wise passes are not modelled (costed as the fused "
    if off("apply_rope_fusion") and rotary and kernels != "eager":
        keep("apply_rope_fusion", unfused + "RoPE kernel)")
    else:
        keep("apply_rope_fusion", "no rotary embedding" if not rotary else
             "RoPE op by op, as kernels eager cost the whole layer" if off("apply_rope_fusion")
             else "fused RoPE")
    gated_off = off("bias_swiglu_fusion") or (off("bias_activation_fusion") and swiglu)
    gelu = gated in (False, None) and not _flag(settings, "squared_relu", where)
    plain_off = off("bias_gelu_fusion") or (off("bias_activation_fusion") and gelu)
    for dest in ("bias_swiglu_fusion", "bias_gelu_fusion", "bias_activation_fusion"):
        if dest not in settings:
            continue
        if swiglu and gated_off:
            keep(dest, "the gated activation " + unfused + "bias-SwiGLU or bias-GeGLU kernel)")
        elif gelu and bias and plain_off:
            keep(dest, "the bias add and GeLU " + unfused + "bias-GeLU kernel)")
        else:
            keep(dest, "the fused activation" if not off(dest) else
                 "no fused kernel for this activation (Megatron-Core fuses bias-GeLU with a "
                 "bias and SwiGLU): the same kernels")
    if off("bias_dropout_fusion") and (bias or dropout):
        keep("bias_dropout_fusion", f"the bias, dropout ({dropout:g}) and residual add "
                                    + unfused + "bias-dropout-add)")
    else:
        keep("bias_dropout_fusion", "no bias and no dropout: one residual add either way"
             if off("bias_dropout_fusion") else "the fused bias-dropout-add")
    if not off("masked_softmax_fusion"):
        keep("masked_softmax_fusion", "unfused attention's fused scaled masked softmax")
    else:
        if job.plan.get("flash_attention") is False:
            local = _str(settings, "transformer_impl") == "local"
            raise refuse("masked_softmax_fusion",
                         "unfused attention's softmax op by op is not modelled (its fused scaled "
                         "masked softmax is): leave it on, or use flash attention"
                         + (" (Transformer Engine's layers: --transformer-impl "
                            "transformer_engine)" if local else ""))
        keep("masked_softmax_fusion", "flash or fused attention computes its own softmax"
             if job.plan.get("flash_attention") else "flash or fused attention computes its "
             "own softmax where the hardware runs one (unfused attention's softmax op by op "
             "is not modelled)")
    _grad_accumulation(settings, job, where, keep, refuse, off("gradient_accumulation_fusion"))
    take("qk_layernorm", "on: a norm of each query and key head, not modelled (its 2 d "
                         "weights a layer and its element-wise passes left out, as for Hugging "
                         "Face configs' qk_norm)" if _flag(settings, "qk_layernorm", where)
         else "off")
    # TransformerConfig.qk_l2_norm (Llama 4's): an L2 norm of each query and key head, no
    # weights (megatron/core/transformer/attention.py at d98e8a64)
    take("qk_l2_norm", "on: an L2 norm of each query and key head, not modelled (its "
                       "element-wise passes left out)" if _flag(settings, "qk_l2_norm", where)
         else "off")
    if _flag(settings, "fp32_residual_connection", where) and dtype != "fp32":
        raise refuse("fp32_residual_connection", f"the residual stream kept in fp32 beside "
                                                 f"{dtype} layers is not modelled")
    take("fp32_residual_connection", "off" if not _flag(settings, "fp32_residual_connection",
                                                        where) else "dtype fp32 anyway")
    if off("deallocate_pipeline_outputs") and job.plan.get("pp", 1) > 1:
        # megatron/core/pipeline_parallel/schedules.py deallocate_output_tensor: the stage's
        # output sent on is kept whole until its backward, not shrunk to its grad_fn
        raise refuse("deallocate_pipeline_outputs",
                     "each in-flight micro-batch's stage output kept until its backward is not "
                     "modelled (Megatron-LM frees it once sent)")
    take("deallocate_pipeline_outputs", "no pipeline: no stage outputs sent"
         if off("deallocate_pipeline_outputs") else "each stage output freed once sent")
    fp8 = job.plan.get("dtype") == "fp8"
    for dest, bad, why in (
            ("fp8_wgrad", False, "the weight-gradient GEMMs in 16 bits beside FP8 forward and "
                                 "input-gradient GEMMs are not modelled (dtype fp8 runs all "
                                 "three in FP8)"),
            ("fp8_dot_product_attention", True, "Transformer Engine's FP8 attention is not "
                                                "modelled (the attention is costed in 16 bits)"),
            ("fp8_multi_head_attention", True, "Transformer Engine's FP8 attention and its FP8 "
                                               "activations are not modelled")):
        if dest not in settings:
            continue
        value = _flag(settings, dest, where)
        if fp8 and value == bad:
            raise refuse(dest, why)
        take(dest, "no effect without FP8" if not fp8 else
             "the weight gradients in FP8 (dtype fp8's)" if dest == "fp8_wgrad" else "off")
    if _flag(settings, "accumulate_allreduce_grads_in_fp32", where):
        if dtype == "fp16":
            raise refuse("accumulate_allreduce_grads_in_fp32",
                         "fp32 main gradients with --fp16 are not modelled (fp16's are fp16; "
                         "grad_dtype applies to bf16)")
        take("accumulate_allreduce_grads_in_fp32",
             "overridden by --grad-reduce-in-bf16 (Megatron-LM)"
             if job.plan.get("grad_dtype") == "bf16" else
             f"fp32 main gradients: {dtype}'s already (Megatron-LM's default with --bf16)")


# Megatron-LM's layer implementations perfmodel models (--transformer-impl: TransformerConfig's
# choices at d98e8a64 are these and inference_optimized; transformer_engine is Megatron-LM's
# default since 2024-04, e7b74a4b, local before)
_IMPLEMENTATIONS = ("transformer_engine", "local")


def _implementation(settings: Settings, job: JobConfig, where: str,
                    take: Callable[[str, str], None]) -> str:
    """The layers' implementation: "te", Transformer Engine's (Megatron-Core's TE spec, or the
    legacy model's te.pytorch.TransformerLayer); "local", Megatron-Core's local spec
    (--transformer-impl local: gpt_builders.py at d98e8a64, use_te = transformer_impl ==
    "transformer_engine"; megatron/core/models/backends.py LocalSpecProvider: ColumnParallelLinear
    and RowParallelLinear, the norm apart from them, and Megatron-Core's own DotProductAttention,
    unfused: the scores' GEMM, the fused scaled masked softmax, the values' GEMM, whatever
    --attention-backend says, which sets Transformer Engine's backend only); or "legacy", the
    legacy model's own layers (--use-legacy-models with --transformer-impl local:
    ParallelTransformerLayer, megatron/legacy/model/transformer.py before 8de82388, 2026-05:
    FlashAttention under --use-flash-attn, else the same unfused core attention; a script of
    2021-23 without --use-mcore-models ran it too). Refused beside
    Megatron's own layers, as Transformer Engine's alone: FP8 GEMMs (the legacy model asserts
    Transformer Engine for them; Megatron-Core's local linear layers run no FP8 under its
    autocast) and --tp-comm-overlap (Transformer Engine's userbuffers overlap its own GEMMs).
    The legacy model (39ec5ebe^, validate_args) refuses context parallelism, multi-token
    prediction and --overlap-param-gather; its experts (SwitchMLP, top-1) and its attention
    beside --multi-latent-attention (it has no MLA) are not modelled."""
    impl = _str(settings, "transformer_impl", "transformer_engine") or "transformer_engine"
    if impl not in _IMPLEMENTATIONS:
        raise refuse_plan(where, settings["transformer_impl"][0], impl,
                          "perfmodel models the training layers transformer_engine (Megatron-LM's "
                          "default) and local (inference_optimized is Megatron-Core's inference "
                          "path)")
    # a script of 2021-23 (_older_recompute) ran the legacy model, Megatron-LM's default until
    # 2024-05 (9ad1a56f) unless --use-mcore-models
    legacy = _flag(settings, "use_legacy_models", where) or (
        bool(job.plan.get("_older_megatron")) and not _flag(settings, "use_mcore_models", where))
    if _flag(settings, "use_legacy_models", where):
        key = settings["use_legacy_models"][0]
        for on, why in (
                (job.plan.get("cp", 1) > 1, "Megatron-LM asserts 'Context parallelism is not "
                                            "supported in legacy models'"),
                (bool(job.model.get("mtp_layers")), "Megatron-LM asserts 'The legacy Megatron "
                                                    "models does not support Multi-Token "
                                                    "Prediction (MTP)'"),
                (bool(job.plan.get("overlap_param_gather")) and job.plan.get("zero") == 1,
                 "Megatron-LM asserts '--overlap-param-gather only supported with MCore "
                 "models'"),
                (bool(job.model.get("experts")), "the legacy model's experts (SwitchMLP: top-1 "
                                                 "routing) are not modelled (Megatron-Core's "
                                                 "MoE is)"),
                ("kv_lora_rank" in job.model, "the legacy model has no multi-head latent "
                                              "attention (Megatron-Core's has)")):
            if on:
                raise refuse_plan(where, key, True, why)
    if impl == "transformer_engine":
        take("transformer_impl", "Transformer Engine's layers")
        take("use_legacy_models", "the legacy model with Transformer Engine's TransformerLayer "
                                  "(--transformer-impl transformer_engine): its layers and "
                                  "attention costed as Megatron-Core's")
        return "te"
    key = settings["transformer_impl"][0]
    own = "the legacy model's own layers" if legacy else "Megatron-Core's local layers"
    if job.plan.get("dtype") == "fp8":
        raise refuse_plan(where, settings["fp8_format"][0], settings["fp8_format"][1],
                          f"FP8 GEMMs are Transformer Engine's: {own} ({key} local) run none "
                          "(give --transformer-impl transformer_engine, or no FP8)")
    if job.plan.get("tp_comm_overlap"):
        raise refuse_plan(where, settings["tp_comm_overlap"][0], True,
                          f"Transformer Engine's userbuffers overlap its own GEMMs: {own} "
                          f"({key} local) overlap none (give --transformer-impl "
                          "transformer_engine, or leave it out)")
    if legacy:
        take("transformer_impl", "the legacy model's own layers (ParallelTransformerLayer): "
                                 "flash attention under --use-flash-attn, else unfused")
        take("use_legacy_models", "the legacy model (megatron/legacy/model)")
        return "legacy"
    take("transformer_impl", "Megatron-Core's local layers (its own DotProductAttention: "
                             "unfused)")
    return "local"


def _attention(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
               dtype: str, layers: str = "te") -> None:
    """Megatron-LM's attention: --attention-backend (flash and fused: flash_attention; unfused
    and local: not; auto, the default: Transformer Engine's choice for the device, left to the
    hardware) and the older --use-flash-attn; a script of 2021-23 attends unfused. Megatron's
    own layers (`layers`, _implementation) attend as they do whatever the backend: Megatron-Core's
    local layers unfused, the legacy model's with FlashAttention under --use-flash-attn."""
    backend = _str(settings, "attention_backend", "auto")
    if layers != "te":
        flash = layers == "legacy" and _flag(settings, "use_flash_attn", where)
        whose = "the legacy model's layers" if layers == "legacy" else \
            "Megatron-Core's local layers"
        take("use_flash_attn", "flash_attention (the legacy model's FlashAttention)"
             if flash else f"no effect on {whose}: their attention is unfused")
        take("attention_backend", f"no effect on {whose} (it picks Transformer Engine's "
                                  "attention): flash_attention "
                                  f"{str(flash).lower()}")
        job.fix("flash_attention", flash)
        return
    if _flag(settings, "use_flash_attn", where) and backend in ("unfused", "local"):
        # Megatron-Core's attention follows --attention-backend; --use-flash-attn is the older
        # switch: which of the two ran depends on the version, so neither is taken
        raise refuse_plan(where, settings["use_flash_attn"][0], True,
                          f"contradicts {settings['attention_backend'][0]} {backend}: give one "
                          "(Megatron-Core's attention follows --attention-backend)")
    if _flag(settings, "use_flash_attn", where):
        flash = True
        take("use_flash_attn", "flash_attention")
    elif backend in ("flash", "fused"):
        flash = True
        job.notes.append(f"--attention-backend {backend}: Transformer Engine's "
                         + ("fused attention (cuDNN's; CK's on ROCm)" if backend == "fused" else
                            "FlashAttention backend (FlashAttention-2 or -3)")
                         + ", costed with the hardware's default flash kernel unless "
                           "--attention-kernel names another it measures (`perfmodel presets` "
                           "lists them; dgx-h100's fa2)")
    elif backend in ("unfused", "local"):
        flash = False
    elif backend == "auto" and "attention_backend" not in settings and \
            job.plan.get("_older_megatron"):
        # Megatron-LM of 2021-23 had no fused attention kernel (--use-flash-attn came in 2023,
        # --attention-backend in 2024): the core attention's GEMMs and its fused softmax
        flash = False
        job.notes.append(f"{job.plan['_older_megatron']}: a Megatron-LM script of 2021-23, whose "
                         "attention is unfused unless --use-flash-attn: flash_attention false")
    elif backend == "auto" and dtype in ("bf16", "fp16") and \
            job.framework is Framework.MEGATRON:
        # Transformer Engine picks its flash or fused (cuDNN) attention where the device runs
        # one for the dtype, its unfused attention elsewhere (a V100): a Megatron-LM argument
        # list's plan leaves flash_attention to the hardware (perfmodel.encode.resolve_flash)
        default = " (the default)" if "attention_backend" not in settings else ""
        job.notes.append(f"--attention-backend auto{default}: Transformer Engine's fused or "
                         f"flash attention where the hardware runs one for {dtype}, its unfused "
                         "attention elsewhere: flash_attention as the hardware has it "
                         "(--attention pins it)")
        take("attention_backend", "flash_attention auto (the hardware's)")
        return
    elif backend == "auto":
        flash = dtype in ("bf16", "fp16")
        default = " (the default)" if "attention_backend" not in settings else ""
        job.notes.append(f"--attention-backend auto{default}: Transformer Engine's fused or "
                         f"flash attention for {dtype}" if flash else
                         f"--attention-backend auto{default} with fp32: unfused attention")
    else:
        raise refuse_plan(where, "--attention-backend", backend,
                          "Megatron-LM's backends are flash, fused, unfused, local and auto")
    job.fix("flash_attention", flash)
    take("attention_backend", f"flash_attention {str(flash).lower()}")


def _older_sends(settings: Settings, job: JobConfig, where: str,
                 take: Callable[[str, str], None]) -> None:
    """Pipeline sends scatter-gathered over tp (pp_scatter_gather): Megatron-LM's default from
    v2.3 (72e4230b, 2021-02) without sequence parallelism until the pipeline code moved into
    megatron/core (39b83c79, 2023-01), with --no-scatter-gather-tensors-in-pipeline to turn it
    off. Taken where the script is of that era (an older recompute option: _older_recompute);
    Megatron-Core sends whole tensors otherwise."""
    off = _flag(settings, "no_scatter_gather_tensors_in_pipeline", where)
    era = job.plan.pop("_older_megatron", None)
    if _flag(settings, "deepspeed", where):
        return  # DeepSpeed's pipeline engine sends as it does (megatron_deepspeed)
    applies = job.plan.get("pp", 1) > 1 and job.plan.get("tp", 1) > 1 and \
        not job.plan.get("sequence_parallel")
    take("no_scatter_gather_tensors_in_pipeline", "pp_scatter_gather false (whole sends)")
    if off or not era:
        return
    if applies:
        job.fix("pp_scatter_gather", True)
        job.notes.append(f"{era}: a Megatron-LM script of 2021-23, whose pipeline sends are "
                         "scatter-gathered over tp by default: pp_scatter_gather "
                         "(--no-scatter-gather-tensors-in-pipeline turns it off)")


def _module_names(modules: Any) -> list[str]:
    """--recompute-modules' names: the argument's words, or a config's list (a YAML list, or
    its text '[a, b]'); none given: [] (Megatron's default, core_attn)."""
    if modules in (None, "", "None", "null"):
        return []
    if isinstance(modules, str):
        modules = modules.strip().strip("[]").replace(",", " ").split()
    return [str(m).strip().strip("'\"") for m in modules if str(m).strip()]


# Megatron-LM's recompute options before 2022-05 (NVIDIA/Megatron-LM megatron/arguments.py):
# --checkpoint-activations recomputes every layer of a stage in chunks of --checkpoint-num-layers
# (default 1; v2.0 to v2.5, c1e0689d removed it); v2.6 (3860e995) to 2022-05 read it as
# --activations-checkpoint-method uniform, with --activations-checkpoint-num-layers (default 1);
# 2022-05 (9aad9203) to 23.04 as --recompute-granularity full --recompute-method uniform; 23.04
# (3e71ad9c) on exits on it. Their era's pipeline sends are scatter-gathered (_older_sends).
OLDER_RECOMPUTE = ("checkpoint_activations", "checkpoint_num_layers",
                   "activations_checkpoint_method", "activations_checkpoint_num_layers",
                   "distribute_checkpointed_activations")


def _older_recompute(settings: Settings, job: JobConfig, where: str,
                     take: Callable[[str, str], None]) -> Settings:
    """The older recompute options as today's settings (--recompute-granularity full, its method
    and layers) under the options' own names, to read in their place."""
    method = _str(settings, "activations_checkpoint_method")
    if not _flag(settings, "checkpoint_activations", where) and method in (None, "None"):
        for dest in ("checkpoint_num_layers", "activations_checkpoint_num_layers"):
            take(dest, "no effect without --checkpoint-activations or "
                       "--activations-checkpoint-method")
        return {}
    given = [d for d in ("recompute_granularity", "recompute_activations", "recompute_method")
             if d in settings]
    old = "activations_checkpoint_method" if method not in (None, "None") else \
        "checkpoint_activations"
    if given:
        raise SpecError(f"{where}: {settings[old][0]} and {settings[given[0]][0]} are the older "
                        "and the newer way to give recompute: give one")
    count_dest = "activations_checkpoint_num_layers" if old != "checkpoint_activations" else \
        "checkpoint_num_layers"
    key = settings[old][0]
    take(old, "recompute full: Megatron-LM before 23.04 (today's --recompute-granularity full "
              f"--recompute-method {method or 'uniform'})")
    take(count_dest, "layers a chunk (today's --recompute-num-layers)")
    job.plan["_older_megatron"] = key
    return {"recompute_granularity": (key, "full"), "recompute_method": (key, method or "uniform"),
            **({"recompute_num_layers": settings[count_dest]} if count_dest in settings else {})}


def _recompute(settings: Settings, job: JobConfig, where: str,
               take: Callable[[str, str], None]) -> None:
    settings = {**settings, **_older_recompute(settings, job, where, take)}
    granularity = _str(settings, "recompute_granularity")
    if granularity in ("None", "null"):
        granularity = None
    if _flag(settings, "recompute_activations", where):
        if granularity not in (None, "selective"):
            raise SpecError(f"{where}: --recompute-activations (selective) contradicts "
                            f"--recompute-granularity {granularity}")
        granularity = "selective"
        take("recompute_activations", "recompute selective")
    if _flag(settings, "moe_layer_recompute", where):
        _moe_layer_recompute(settings, job, where, granularity)
    method = _str(settings, "recompute_method")
    method = None if method in ("None", "null") else method
    modules = settings.get("recompute_modules", ("", None))[1]
    if granularity is None:
        # Megatron reads the method and the layer count only under a granularity (its
        # TransformerBlock checkpoints nothing without one): NeMo 1's launcher configs give
        # activations_checkpoint_method block and _num_layers 0 beside granularity null
        job.fix("recompute", "none", pin="recompute_granularity" in settings)
        for dest in ("recompute_method", "recompute_num_layers"):
            take(dest, "no effect without a recompute granularity")
        return
    count = _int(settings, "recompute_num_layers", where)
    if granularity == "selective":
        names = _module_names(modules)
        try:
            parsed = parse_recompute_modules(names)
        except PlanError as exc:
            raise refuse_plan(where, settings["recompute_modules"][0], modules,
                              str(exc).split(": ", 1)[-1]) from None
        _recompute_module_rules(settings, job, where, names)
        job.fix("recompute", "selective")
        if parsed:
            job.fix("recompute_modules", ",".join(parsed))
        take("recompute_granularity", "recompute selective")
        take("recompute_modules", "recompute_modules " + ",".join(parsed or ("core_attn",)))
        return
    if granularity != "full":
        raise refuse_plan(where, "--recompute-granularity", granularity,
                          "Megatron-LM's granularities are full and selective")
    if method is None:
        raise refuse_plan(where, "--recompute-granularity full", True,
                          "needs --recompute-method uniform or block (Megatron-LM)")
    if method not in ("uniform", "block"):
        raise refuse_plan(where, settings["recompute_method"][0], method,
                          "Megatron-LM's methods are uniform and block")
    counted = settings["recompute_num_layers"][0] if "recompute_num_layers" in settings \
        else "--recompute-num-layers"
    if count is None and method == "block":
        raise refuse_plan(where, f"{settings['recompute_method'][0]} block", True,
                          f"needs {counted}: the layers of each chunk it recomputes")
    if count is not None and count < 1:
        raise refuse_plan(where, counted, count, "a whole number of layers, >= 1")
    job.fix("recompute", "full")
    if method == "uniform" and count in (None, 1):
        take("recompute_granularity", "recompute full (every layer)")
        take("recompute_method", method)
        take("recompute_num_layers", "every layer")
        return
    job.fix("recompute_method", method)
    job.fix("recompute_num_layers", count)
    take("recompute_granularity", "recompute full")
    take("recompute_method", f"recompute_method {method}")
    take("recompute_num_layers", f"recompute_num_layers {count}: "
         + (f"the first {count} layers of each chunk" if method == "block"
            else f"each chunk's layers checkpointed in groups of {count}"))


def _recompute_module_rules(settings: Settings, job: JobConfig, where: str,
                            names: list[str]) -> None:
    """What Megatron-Core raises on among selective recompute's modules (transformer_config.py
    __post_init__ at d98e8a64): moe_act without grouped GEMMs (checked for a Megatron-LM
    argument list, where leaving --moe-grouped-gemm out is False; a config's model class may set
    it), and moe_act or layernorm under FP8 delayed scaling."""
    key = settings["recompute_modules"][0] if "recompute_modules" in settings \
        else "--recompute-modules"
    shown = " ".join(names)
    if "moe_act" in names and _megatron_lm(settings, job, where) \
            and not _flag(settings, "moe_grouped_gemm", where):
        raise refuse_plan(where, key, shown, "Megatron-Core raises 'moe_act in recompute_modules "
                          "is only supported with moe_grouped_gemm' (give --moe-grouped-gemm)")
    late = [m for m in ("moe_act", "layernorm") if m in names]
    if late and job.plan.get("dtype") == "fp8" and job.plan.get("fp8_recipe") == "delayed":
        raise refuse_plan(where, key, shown, "Megatron-Core raises 'Delayed scaling does not "
                          "support moe_act and layernorm recompute for fp8' (give "
                          "--fp8-recipe tensorwise or mxfp8)")


def _moe_layer_recompute(settings: Settings, job: JobConfig, where: str,
                         granularity: str | None) -> None:
    """--moe-layer-recompute, refused: Megatron-Core (transformer_config.py __post_init__ at
    d98e8a64) raises on it beside full recompute, and otherwise makes it recompute granularity
    selective with moe among the recompute modules (before 0.12 the MoE layer checkpointed
    itself: moe_layer.py), which perfmodel refuses as it refuses --recompute-modules moe."""
    key = settings["moe_layer_recompute"][0]
    if granularity == "full":
        raise refuse_plan(where, key, True, "Megatron-Core raises 'Do not set "
                          "--moe-layer-recompute with full recompute granularity'")
    if not job.model.get("experts"):
        raise refuse_plan(where, key, True, "without experts Megatron-Core still turns "
                          "selective recompute on with it (its modules: core_attn): give "
                          "--recompute-granularity selective instead")
    try:
        parse_recompute_modules(["moe"])
    except PlanError as exc:
        raise refuse_plan(where, key, True, str(exc).split(": ", 1)[-1]) from None


def _cpu_offload(settings: Settings, job: JobConfig, where: str,
                 take: Callable[[str, str], None]) -> None:
    """Megatron-Core's activation offloading: cpu_offloading with cpu_offloading_num_layers k
    and cpu_offloading_activations (its default) is Plan.cpu_offload_layers k; offloading
    weights is not modelled (Transformer Engine deprecated it). Megatron-LM's argument list
    turns cpu_offloading on from --cpu-offloading-num-layers k > 0 (megatron/training/
    arguments.py); a TransformerConfig (NeMo, Megatron-Bridge) offloads only with
    cpu_offloading true (Transformer Engine's `enabled`), whatever its layer count."""
    count = _int(settings, "cpu_offloading_num_layers", where, 0, minimum=0) or 0
    on = _flag(settings, "cpu_offloading", where) \
        or (count > 0 and job.framework is Framework.MEGATRON)
    if not on:
        take("cpu_offloading", "off")
        take("cpu_offloading_num_layers", f"{count}: no offloading (cpu_offloading is off)"
             if count else "0: no offloading")
        return
    if _flag(settings, "cpu_offloading_weights", where):
        raise refuse_plan(where, settings["cpu_offloading_weights"][0], True,
                          "offloading weights to the host is not modelled (activations are)")
    take("cpu_offloading_weights", "off")
    activations = "cpu_offloading_activations" not in settings or _flag(
        settings, "cpu_offloading_activations", where)
    take("cpu_offloading_activations", "on" if activations else "off: nothing offloaded")
    if activations and count:
        job.fix("cpu_offload_layers", count)
    take("cpu_offloading", "activation offloading")
    take("cpu_offloading_num_layers", f"cpu_offload_layers {count if activations else 0}")


# --- writing ------------------------------------------------------------------------------------


def megatron_arguments(model: Any, plan: Any) -> list[list[str]]:
    """The pretrain_gpt.py arguments of a model and a plan, in groups (one option and its
    value each); PlanError for what Megatron-LM cannot run."""
    from perfmodel.configs.job import refuse_emit

    if plan.tp_layout.value != "1d":
        raise refuse_emit("megatron", f"tp_layout {plan.tp_layout.value}",
                          "Megatron-LM's tensor parallelism is 1d")
    if plan.schedule.value not in ("1f1b", "interleaved"):
        raise refuse_emit("megatron", f"schedule {plan.schedule.value}",
                          "Megatron-LM runs 1f1b and interleaved (pin --schedule)")
    if plan.kernels.value != "fused":
        raise refuse_emit("megatron", f"kernels {plan.kernels.value}",
                          "Megatron-LM runs its fused element-wise kernels (pin --kernels fused)")
    if plan.zero == 2:
        raise refuse_emit("megatron", "zero 2",
                          "Megatron-LM has the distributed optimizer (zero 1) and FSDP2 "
                          "(zero 3), no stage 2 (pin --zero)")
    placements = {"tp,dp,pp": [], "tp,pp,dp": [["--use-tp-pp-dp-mapping"]]}
    placement = ",".join(plan.placement)
    if placement not in placements:
        raise refuse_emit("megatron", f"placement {placement}",
                          "Megatron-LM orders ranks tp,dp,pp (or tp,pp,dp with "
                          "--use-tp-pp-dp-mapping)")
    if model.uncosted():
        raise refuse_emit("megatron", "the model", "; ".join(model.uncosted()))
    if model.position_embedding == "learned" and model.experts:
        raise refuse_emit("megatron", "the model", "mixture of experts")
    if model.position_embedding == "alibi":
        raise refuse_emit("megatron", "position_embedding alibi", "Megatron-LM has no ALiBi "
                          "(Megatron-DeepSpeed's does)")
    for field, given, why in (
            ("sliding_window", model.sliding_window is not None, "sliding-window attention"),
            ("attention_sinks", model.attention_sinks, "attention sinks"),
            # GPT-OSS's clamped quick-GeGLU: its SwiGLU with --activation-func-clamp-value
            # clamps inside the fused kernel, not as the costed eager passes
            ("clamped_glu", model.clamped_glu and model.experts, "clamped quick-GeGLU")):
        if given:  # arguments perfmodel's reader does not read back: not written either
            raise refuse_emit("megatron", field, f"written Megatron-LM arguments carry no {why} "
                                                 "yet")
    if model.experts and plan.zero == 3:
        raise refuse_emit("megatron", "zero 3 with experts", "Megatron-LM's torch FSDP2 path is "
                          "not written with experts (pin --zero 0 or 1)")
    if plan.stack.value == "compiled":
        raise refuse_emit("megatron", "stack compiled", "Megatron-LM compiles none of its "
                          "layers: eager or CUDA graphs (pin --stack eager or cuda-graphs)")
    graphs = [["--cuda-graph-impl", "transformer_engine"]] \
        if plan.stack.value == "cuda-graphs" else []  # whole layers: its modules' default, full
    args = [*graphs, ["--num-layers", str(model.layers)], ["--hidden-size", str(model.hidden)],
            ["--ffn-hidden-size", str(model.ffn_hidden)],
            ["--num-attention-heads", str(model.heads)], ["--kv-channels", str(model.head_dim)]]
    if model.kv_heads != model.heads:
        args += [["--group-query-attention"], ["--num-query-groups", str(model.kv_heads)]]
    if model.kv_lora_rank is not None:  # DeepSeek's multi-head latent attention
        args.append(["--multi-latent-attention"])
        for dest, field in MLA_FIELD_OF.items():
            value = getattr(model, field)
            if value is not None:  # q_lora_rank None: queries not compressed (the default)
                args.append([f"--{dest.replace('_', '-')}", str(value)])
    if model.mtp_layers:
        args.append(["--mtp-num-layers", str(model.mtp_layers)])
    args += [["--seq-length", str(model.seq_len)],
             ["--max-position-embeddings", str(model.seq_len)],
             ["--position-embedding-type",
              "rope" if model.position_embedding == "rotary" else "learned_absolute"],
             *([["--rotary-percent", f"{model.rotary_fraction:g}"]]
               if model.rotary_fraction != 1 else []),
             ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]]
    if model.gated_mlp:
        args.append(["--swiglu"])
    if not model.tied_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    if not model.bias:
        args.append(["--disable-bias-linear"])
        if model.qkv_bias:
            args.append(["--add-qkv-bias"])
    elif not model.qkv_bias and model.kv_lora_rank is None:  # MLA's q/kv projections: no bias
        raise refuse_emit("megatron", "bias without qkv_bias",
                          "Megatron-LM's --add-bias-linear adds the QKV bias too")
    args += [["--hidden-dropout", f"{model.hidden_dropout:g}"],
             ["--attention-dropout", f"{model.attention_dropout:g}"]]
    multiple = vocab_multiple(model.vocab, plan.tp)
    args += [["--tokenizer-type", "NullTokenizer"], ["--vocab-size", str(model.vocab)],
             ["--make-vocab-size-divisible-by", str(multiple)], ["--mock-data"],
             ["--micro-batch-size", str(plan.micro_batch)],
             ["--global-batch-size", str(plan.global_batch)],
             ["--tensor-model-parallel-size", str(plan.tp)],
             ["--pipeline-model-parallel-size", str(plan.pp)]]
    if plan.virtual_stages > 1:
        args.append(["--num-virtual-stages-per-pipeline-rank", str(plan.virtual_stages)])
    if plan.cp > 1:
        comm = {ours: theirs for theirs, ours in CP_COMM_TYPES.items()}[plan.cp_comm.value]
        args += [["--context-parallel-size", str(plan.cp)], ["--cp-comm-type", comm]]
    if model.experts:
        args += moe_arguments(model, plan)
    if plan.pipeline_layout:  # Megatron takes the virtual stages from it
        args = [a for a in args if a[0] != "--num-virtual-stages-per-pipeline-rank"]
        args.append(["--pipeline-model-parallel-layout", plan.pipeline_layout])
    for end in ("first", "last"):
        if getattr(plan, f"{end}_stage_layers"):
            args.append([f"--decoder-{end}-pipeline-num-layers",
                         str(getattr(plan, f"{end}_stage_layers"))])
    if plan.sequence_parallel:
        args.append(["--sequence-parallel"])
    if plan.tp_comm_overlap:
        args.append(["--tp-comm-overlap"])
    if plan.ep_comm_overlap:
        args.append(["--overlap-moe-expert-parallel-comm"])
    if plan.cross_entropy.value in ("te", "native"):
        args += [["--cross-entropy-loss-fusion"],
                 ["--cross-entropy-fusion-impl", plan.cross_entropy.value]]
    args += placements[placement]
    dtype = plan.dtype.value
    if dtype in ("bf16", "fp16"):
        args.append([f"--{dtype}"])
    elif dtype == "fp8":  # Transformer Engine's FP8 over bf16 (docs/fp8.md)
        recipe = {v: k for k, v in FP8_RECIPES.items()}[plan.fp8_recipe.value
                                                        if plan.fp8_recipe else "delayed"]
        args += [["--bf16"], ["--fp8-format", "hybrid"], ["--fp8-recipe", recipe]]
        if plan.fp8_params and plan.zero == 3:
            # megatron/training/arguments.py turns --fp8-param-gather off beside
            # --use-torch-fsdp2 (bf16 all-gathers); the plan's FP8 gather is Megatron FSDP's
            raise refuse_emit("megatron", "fp8_params with zero 3", "Megatron-LM's ZeRO 3 here "
                              "is --use-torch-fsdp2, which gathers the weights in bf16 (it turns "
                              "--fp8-param-gather off); the plan's FP8 gather is Megatron FSDP's "
                              "(--use-megatron-fsdp), which perfmodel does not emit")
        if plan.fp8_params:
            args.append(["--fp8-param-gather"])
            if recipe == "mxfp8":  # MXFP8 weights as the model holds them (docs/fp8.md)
                args.append(["--reuse-grad-buf-for-mxfp8-param-ag"])
        if plan.fp8_output_layer:
            raise refuse_emit("megatron", "fp8_output_layer", "Megatron-LM's output layer is a "
                              "bf16 ColumnParallelLinear")
    elif dtype == "tf32":
        raise refuse_emit("megatron", "dtype tf32", "Megatron-LM trains bf16, fp16 or fp32")
    stage_layers = model.layers // (plan.pp * plan.virtual_stages)
    if plan.recompute.value == "op":
        raise refuse_emit("megatron", "recompute op", "Megatron-LM has no per-op policy "
                                                      "(torchtitan's); pin --recompute")
    if plan.recompute_every > 1 and plan.pipeline_layout:
        raise refuse_emit("megatron", f"recompute on one layer in {plan.recompute_every} with "
                          "a pipeline layout", "Megatron-LM's block method recomputes k layers "
                          "of each stage, and the layout's stages differ")
    if plan.recompute_every > 1 and (plan.recompute.value != "full"
                                     or stage_layers % plan.recompute_every):
        raise refuse_emit("megatron", f"recompute {plan.recompute.value} on one layer in "
                                      f"{plan.recompute_every}",
                          "Megatron-LM's block method recomputes k whole layers of a stage's "
                          f"{stage_layers} (full, k dividing them)")
    master = plan.master_weights or default_master(plan.optimizer_dtype)
    if master == "none":
        raise refuse_emit("megatron", f"optimizer_dtype {plan.optimizer_dtype} without master "
                                      "weights",
                          "Megatron-Core's optimizers keep master weights (give master_weights "
                          "remainders or fp32)")
    scaling = plan.fp8_recipe.value if plan.fp8_recipe is not None else None
    if master == "remainders" and megatron_master_weights(True, scaling,
                                                          plan.fp8_params) != "remainders":
        raise refuse_emit("megatron", f"master_weights remainders with fp8_recipe {scaling}"
                          + (" and fp8_params" if plan.fp8_params else ""),
                          "Megatron-Core keeps fp32 master weights there (give master_weights "
                          "fp32)")
    if plan.optimizer_dtype == "bf16" or master == "remainders":
        # Megatron-Core's precision-aware optimizer (OptimizerConfig: store_param_remainders on
        # by default)
        args.append(["--use-precision-aware-optimizer"])
        if plan.optimizer_dtype == "bf16":
            args.append(["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"])
        if master == "fp32":
            args.append(["--no-store-param-remainders"])
    if plan.recompute.value == "selective":
        args.append(["--recompute-granularity", "selective"])
        if plan.recompute_modules:
            args.append(["--recompute-modules", *plan.recompute_modules])
    elif plan.recompute.value == "full" and (plan.recompute_method.value != "uniform"
                                             or plan.recompute_num_layers > 1):
        args += [["--recompute-granularity", "full"],
                 ["--recompute-method", plan.recompute_method.value],
                 ["--recompute-num-layers", str(plan.recompute_num_layers)]]
    elif plan.recompute.value == "full" and plan.recompute_every > 1:
        args += [["--recompute-granularity", "full"], ["--recompute-method", "block"],
                 ["--recompute-num-layers", str(stage_layers // plan.recompute_every)]]
    elif plan.recompute.value == "full":
        args += [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                 ["--recompute-num-layers", "1"]]
    if plan.cpu_offload_layers:
        args.append(["--cpu-offloading-num-layers", str(plan.cpu_offload_layers)])
    if plan.grad_dtype == "bf16":
        args.append(["--grad-reduce-in-bf16"])
    if plan.zero == 1:
        args.append(["--use-distributed-optimizer"])
    elif plan.zero == 3:
        args.append(["--use-torch-fsdp2"])
    if not plan.grad_accumulation_fusion or plan.zero == 3:
        # Megatron-LM refuses FSDP2 with the fusion on (arguments.py at d98e8a64); FSDP2 has no
        # main gradient to accumulate into, so zero 3 costs the same either way
        args.append(["--no-gradient-accumulation-fusion"])
    if plan.overlap_grad_sync:
        args.append(["--overlap-grad-reduce"])
        if plan.dp_bucket_size is not None and plan.zero < 3:
            args.append(["--ddp-bucket-size", str(plan.dp_bucket_size)])
    if plan.overlap_param_gather and plan.zero == 1:  # FSDP2 (zero 3) prefetches by itself
        args.append(["--overlap-param-gather"])
    # Transformer Engine's backends: fused is cuDNN's kernel (TE on ROCm: its CK kernels, the
    # MI300X / MI355X presets' ck-v3 and its atomics variants), flash FlashAttention's; ck-v3
    # written as flash set NVTE_FUSED_ATTN=0 and ran ROCm's flash-attn package, not the kernel
    # it was costed with
    backend = "fused" if plan.attention_kernel in TE_FUSED_KERNELS else "flash"
    args.append(["--attention-backend", backend if plan.flash_attention else "unfused"])
    return args


# torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb (Megatron-LM's --DDP-impl
# torch passed none), MiB of the 16-bit model's gradients it reduces
TORCH_DDP_BUCKET_MIB = 25
TORCH_DDP_BUCKET_PARAMS = TORCH_DDP_BUCKET_MIB * 2**20 // 2


def _buckets(settings: Settings, job: JobConfig, where: str, take: Callable[[str, str], None],
             grad: bool, zero: int, impl: str | None) -> None:
    """The gradient sync's buckets (Plan.dp_bucket_size, dp_bucketing): --ddp-bucket-size, in
    parameters, where Megatron-Core buckets (--overlap-grad-reduce, ZeRO 0-1; without overlap it
    sets no bucket size: one bucket), else its default, max(4e7, 1e6 dp cp); torch's DDP
    (--DDP-impl torch) buckets every parameter, 25 MiB of gradients."""
    size = _int(settings, "ddp_bucket_size", where)
    if impl == "torch":
        job.fix("dp_bucketing", "all", pin=False)
        job.fix("dp_bucket_size", TORCH_DDP_BUCKET_PARAMS, pin=False)
        job.notes.append("--DDP-impl torch: PyTorch DDP's buckets, bucket_cap_mb 25 MiB of 16-bit "
                         f"gradients over every parameter (dp_bucket_size "
                         f"{TORCH_DDP_BUCKET_PARAMS:,}, dp_bucketing all)")
        take("ddp_bucket_size", "not read by --DDP-impl torch (PyTorch DDP's own buckets)")
        return
    if size is None:
        return
    if grad and zero < 3:
        job.fix("dp_bucket_size", size)
        take("ddp_bucket_size", f"dp_bucket_size {size} (parameters a bucket of the overlapped "
                                "gradient sync and parameter gather)")
    else:
        take("ddp_bucket_size", "no effect: Megatron-Core buckets only an overlapped sync "
                                "(--overlap-grad-reduce) of ZeRO 0-1" if zero < 3
             else "no effect: FSDP2 syncs one unit a layer")


def moe_arguments(model: Any, plan: Any) -> list[list[str]]:
    """A mixture of experts' pretrain_gpt.py arguments: its experts, top-k and widths, which
    layers are dense (--moe-layer-freq as a list), the dispatch perfmodel models (all-to-all,
    grouped GEMMs, dropless or padded to the model's capacity_factor) and the plan's ep and etp
    (Megatron-LM's etp default is tp: always written)."""
    if plan.expert_weighting.value != "activation":
        from perfmodel.configs.job import refuse_emit

        raise refuse_emit("megatron", f"expert_weighting {plan.expert_weighting.value}",
                          "Megatron-Core weights the experts' activation by the routing "
                          "probabilities (give expert_weighting activation)")
    args = [["--num-experts", str(model.experts)], ["--moe-router-topk", str(model.top_k)],
            ["--moe-ffn-hidden-size", str(model.expert_ffn_hidden or model.ffn_hidden)]]
    if model.shared_experts:  # Megatron-Core's shared experts are one MLP as wide as all of them
        width = model.shared_experts * (model.shared_expert_ffn_hidden
                                        or model.expert_ffn_hidden or model.ffn_hidden)
        args.append(["--moe-shared-expert-intermediate-size", str(width)])
    moe = set(model.moe_layers)
    if len(moe) != model.layers:
        pattern = [int(i in moe) for i in range(model.layers)]
        runs: list[str] = []  # ([0]*3+[1]*58): run-length, as Megatron-LM's recipes write it
        start = 0
        for i in range(1, model.layers + 1):
            if i == model.layers or pattern[i] != pattern[start]:
                runs.append(f"[{pattern[start]}]*{i - start}")
                start = i
        args.append(["--moe-layer-freq", f"({'+'.join(runs)})"])
    if model.capacity_factor is not None:  # padded to the capacity, as the reader reads it
        args += [["--moe-expert-capacity-factor", str(model.capacity_factor)],
                 ["--moe-pad-expert-input-to-capacity"]]
    if model.expert_groups:  # node-limited routing
        args += [["--moe-router-num-groups", str(model.expert_groups)],
                 ["--moe-router-group-topk", str(model.group_topk)]]
    dispatcher = ([["--moe-token-dispatcher-type", "flex"],
                   ["--moe-flex-dispatcher-backend", "deepep"]]
                  if plan.ep_dispatcher.value == "deepep"
                  else [["--moe-token-dispatcher-type", "alltoall"]])
    args += [*dispatcher, ["--moe-grouped-gemm"],
             ["--expert-model-parallel-size", str(plan.ep)],
             ["--expert-tensor-parallel-size", str(plan.etp)]]
    return args


def vocab_multiple(vocab: int, tp: int) -> int:
    """The largest --make-vocab-size-divisible-by, at most Megatron-LM's 128, that leaves the
    vocabulary unpadded at this tp (1 when only 1 does; Megatron then pads to a multiple of tp)."""
    for multiple in range(DEFAULT_VOCAB_MULTIPLE, 0, -1):
        if vocab % (multiple * tp) == 0:
            return multiple
    return 1


def write_megatron(directory: Path, model: Any, plan: Any, hardware: Any, header: list[str]
                   ) -> list[Path]:
    """megatron_args.txt (the arguments, one option a line) and launch.sh (torchrun on every
    node), written atomically into directory."""
    from perfmodel.files import write_atomic

    named = plan
    if plan.flash_attention and plan.attention_kernel is None and hardware.flash_attention \
            and hardware.flash_attention.name:  # the kernel it was costed with: the default
        named = plan.replace(attention_kernel=hardware.flash_attention.name)
    args = megatron_arguments(model, named)
    if padded_vocab(model.vocab, vocab_multiple(model.vocab, plan.tp), plan.tp) != model.vocab:
        header = [*header, f"Megatron-LM pads the vocabulary {model.vocab} to "
                           f"{padded_vocab(model.vocab, 1, plan.tp)} rows at tp {plan.tp}: "
                           "the job trains a few more rows than perfmodel predicted"]
    per_node = min(hardware.host_gpus, plan.gpus)  # torchrun's processes on one host
    if plan.gpus % per_node:
        from perfmodel.configs.job import refuse_emit

        raise refuse_emit("megatron", f"gpus {plan.gpus}",
                          f"not whole hosts of {hardware.host_gpus} GPUs")
    nodes = plan.gpus // per_node
    comment = "".join(f"# {line}\n" for line in header)
    text = comment + "".join(shlex.join(group) + "\n" for group in args)
    lines = [f"    {shlex.join(group)} \\" for group in args]
    script = ("#!/bin/bash\n" + comment + "# Run on every node; NODE_RANK and MASTER_ADDR "
              "name this node and the first.\nset -euo pipefail\n"
              "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + allocator_export(plan) + "\n"
              f"torchrun --nnodes {nodes} --nproc-per-node {per_node} "
              "--node-rank \"${NODE_RANK:-0}\" --master-addr \"${MASTER_ADDR:-localhost}\" "
              "--master-port 6000 \\\n    pretrain_gpt.py \\\n" + "\n".join(lines) +
              "\n    --train-iters \"${TRAIN_ITERS:-100}\" --lr 3e-4\n")
    out = [directory / "megatron_args.txt", directory / "launch.sh"]
    write_atomic(out[0], text, what="Megatron-LM arguments", make_parents=True)
    write_atomic(out[1], script, what="Megatron-LM launch script", make_parents=True)
    return out
