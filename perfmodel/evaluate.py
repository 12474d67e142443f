"""Numeric evaluation: lambdify each family's expressions once, evaluate numbers or numpy arrays.

The compiled numpy source of each family is cached on disk (keyed by the family and a hash of the
cost-model sources), so a cold `perfmodel predict` skips building the sympy expressions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.encode import (
    axis_per_node,
    compute_dtype,
    grid_degrees,
    layout_family,
    link_features,
    resolve_flash,
    values_of,
)
from perfmodel.errors import InternalError, OutputError
from perfmodel.files import write_atomic
from perfmodel.names import AXES
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import BYTES_PER_ELEMENT, Dtype, Plan, RecomputeMethod

__all__ = ["Compiled", "axis_per_node", "compile_family", "family_of", "grid_degrees",
           "outputs_of", "values_of"]

_PACKAGE = Path(__file__).parent


def fp8_recipe_of(plan: Plan, hardware: HardwareSpec) -> str | None:
    """The FP8 recipe the plan runs (the hardware's default where it names none), None
    without FP8."""
    if plan.dtype is not Dtype.FP8:
        return None
    return hardware.fp8_recipe(None if plan.fp8_recipe is None else plan.fp8_recipe.value)


def unaligned_logits(model: TransformerSpec, hardware: HardwareSpec, plan: Plan) -> bool:
    """Whether the output layer's GEMMs run on unaligned rows, priced as such: a vocabulary not
    a multiple of the elements in 16 bytes (8 in bf16: cuBLAS's fast kernels need 16-byte
    aligned leading dimensions), in a dtype whose GEMM fit measures such GEMMs
    (GemmEfficiency.unaligned_fraction). Judged on the whole vocabulary, as stacks that do not pad
    it hold it (Megatron pads it to a multiple of 128 tp); an output layer in FP8 is not."""
    if plan.dtype is Dtype.FP8 and plan.fp8_output_layer:
        return False
    dtype = compute_dtype(plan.dtype)
    if dtype not in hardware.gemm_efficiency and "default" not in hardware.gemm_efficiency:
        return False  # refused where it is priced (HardwareSpec.gemm)
    per_16_bytes = 16 // int(BYTES_PER_ELEMENT[Dtype(dtype)])
    return hardware.gemm(dtype).has_unaligned and model.vocab % per_16_bytes != 0


def family_of(model: TransformerSpec, hardware: HardwareSpec, plan: Plan, *,
              specialise: bool = False) -> Any:
    """The family of the plan's tensor layout with every other option open: the expression the
    search evaluates for the plan, compiled once per hardware and layout (Megatron 1d, the 2d grid
    with or without depth, the 3d cube); or, with specialise=True, the plan's own fixed family
    (what `perfmodel explain` prints)."""
    from perfmodel.family import Family

    fixed: dict[str, Any] = dict(algorithm=hardware.collective_algorithm,
                 fits=frozenset((fit.op, fit.scope, fit.algorithm) for fit in hardware.collectives),
                 collective_library=hardware.collective_library,
                 link_features=link_features(hardware),
                 fabric_levels=max(2, len(hardware.levels)),
                 gemm_split_k=any(g.splits_k for g in hardware.gemm_efficiency.values()),
                 gemm_large_kernel=any(g.has_large_kernel
                                       for g in hardware.gemm_efficiency.values()),
                 gemm_epilogue=any(g.has_epilogue for g in hardware.gemm_efficiency.values()),
                 unaligned_logits=unaligned_logits(model, hardware, plan),
                 layer_costs=frozenset((c.part, c.style, c.tp) for c in hardware.layer_costs),
                 asynchronous=hardware.asynchronous_device,
                 fp8=plan.dtype is Dtype.FP8, fp8_output_layer=plan.fp8_output_layer,
                 fp8_params=plan.fp8_params,
                 fp8_recipe=fp8_recipe_of(plan, hardware),
                 windowed=model.windowed_share > 0, attention_sinks=model.attention_sinks,
                 clamped_glu=model.clamped_glu and bool(model.experts),
                 partial_rotary=model.rotary_fraction < 1,
                 fused_qkv=model.fused_qkv,
                 dropout=model.hidden_dropout > 0,
                 attention_dropout=model.attention_dropout > 0)
    fixed.update(architecture_family(model))
    fixed["stage_dense"] = stage_dense(plan, fixed.get("moe_dense_layers", ()))
    fixed["middle_layers"] = None if plan.layout is None else plan.layout.middle_layers
    fixed["end_chunks"] = None if plan.layout is None else plan.layout.end_chunks
    fixed["recompute_modules"] = plan.recompute_modules
    fixed["megatron_recompute"] = (plan.recompute_method is not RecomputeMethod.UNIFORM
                                   or plan.recompute_num_layers > 1)
    fixed["cpu_offload"] = plan.cpu_offload_layers > 0
    # one dispatcher for every plan of a search (the stack's): fixed, so that a search compiles
    # one dispatcher's expressions
    fixed["ep_dispatcher"] = plan.ep_dispatcher.value
    fixed["cross_entropy"] = plan.cross_entropy.value  # likewise, the loss's kernel
    fixed["expert_weighting"] = plan.expert_weighting.value  # and the experts' weighting
    fixed["pipeline_flushes"] = plan.pipeline_flushes > 1
    fixed["pp_scatter_gather"] = plan.pp_scatter_gather  # a stack's, never searched
    fixed["defer_grad_sync"] = plan.defer_grad_sync  # likewise
    fixed["bf16_optimizer"] = plan.bf16_optimizer  # likewise
    fixed["grad_accumulation_fusion"] = plan.grad_accumulation_fusion  # likewise
    fixed["tp_backward"] = plan.tp_backward.value if plan.tp_backward else None  # likewise
    fixed["fsdp_reshard"] = plan.fsdp_reshard.value  # likewise
    if not specialise:
        return Family(**fixed, free_head_dim=True, tp_layout=layout_family(plan.tp_layout))
    placement = axis_per_node(plan, hardware)
    return Family(
        schedule=plan.schedule.value,
        recompute=plan.recompute.value,
        sequence_parallel=plan.sequence_parallel,
        zero=plan.zero,
        flash=resolve_flash(plan.flash_attention, model, hardware, plan.dtype,
                            plan.attention_kernel),
        overlap_grad_sync=plan.overlap_grad_sync,
        overlap_param_gather=plan.overlap_param_gather,
        tp_comm_overlap=plan.tp_comm_overlap,
        ep_comm_overlap=plan.ep_comm_overlap,
        stack=plan.stack.value,
        kernels=plan.kernels.value,
        uneven_stages=bool(plan.first_stage_layers or plan.last_stage_layers
                           or plan.pipeline_layout),
        gated=model.gated_mlp,
        tied_embeddings=model.tied_embeddings,
        learned_positions=model.position_embedding == "learned",
        rotary_positions=model.position_embedding == "rotary",
        bias=model.bias,
        qkv_bias=bool(model.qkv_bias),
        layernorm=model.norm == "layernorm",
        tp_layout=layout_family(plan.tp_layout),
        free_head_dim=model.attention_width != model.hidden,
        scopes=tuple((axis, placement[axis][1]) for axis in AXES),
        cp_comm=plan.cp_comm.value,
        **fixed,
    )


def stage_dense(plan: Plan, dense: tuple[int, ...]) -> tuple[int, int, int] | None:
    """A mixture of experts' dense layers on the first rank, the last and the ranks between,
    where the plan's pipeline layout places them (else None)."""
    layout = plan.layout
    return layout.dense_split(dense) if layout is not None and dense else None


def architecture_family(model: TransformerSpec) -> dict[str, Any]:
    """The Family fields a model fixes: its mixture of experts (dense layers, shared experts,
    capacity), multi-head latent attention, multi-token-prediction modules; a model without them
    has none of their terms."""
    if not isinstance(model, TransformerSpec):
        return {}
    moe = bool(model.experts)
    dense = tuple(i for i in range(model.layers) if i not in set(model.moe_layers)) if moe else ()
    return dict(moe=moe, moe_dense_layers=dense, moe_shared=moe and model.shared_experts > 0,
                moe_capacity=moe and model.capacity_factor is not None,
                moe_round_robin=moe and model.routing == "round_robin",
                mla=model.kv_lora_rank is not None,
                mla_q_lora=model.kv_lora_rank is not None and model.q_lora_rank is not None,
                mtp=model.mtp_layers > 0,
                mtp_last_moe=model.mtp_layers > 0 and (model.layers - 1) in model.moe_layers)


def value_of(values: Mapping[str, Any], name: str) -> Any:
    """values[name]; a symbol without a value is a bug of the encoder (perfmodel.encode), never
    a silent default."""
    try:
        return values[name]
    except KeyError:
        raise InternalError(f"the symbol '{name}' of the compiled step model has no "
                            "value (perfmodel.encode gives every symbol one); please report it"
                            ) from None


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A family's expressions compiled to one numpy function."""

    arg_names: tuple[str, ...]
    out_names: tuple[str, ...]
    fn: Callable[..., Any]
    # what the module's META holds beyond the names, so that a warm process needs no sympy model
    # for them: "ledger", the communication ledger's records ([name, axis, op, phase, stage]
    # each, for the outputs ledger:<i>:calls and :nbytes) of a family's "all" outputs; or
    # compile_outputs' `extra` literals (the timeline's step phases and their streams)
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, values: Mapping[str, Any]) -> dict[str, Any]:
        # numbers as numpy floats: x / 0.0 is then inf (refused by its consumer), not a Python
        # ZeroDivisionError (a product of tiny factors, as a bandwidth times a fraction, is 0.0)
        args = [np.float64(v) if type(v) in (float, int) else v
                for v in (value_of(values, name) for name in self.arg_names)]
        with np.errstate(all="ignore"):  # a non-finite result is refused by its consumer
            out = self.fn(*args)
        return dict(zip(self.out_names, out, strict=True))


STATES = ("weights", "gradients", "optimizer_states")
# Lower bounds on the step time, cheaper to evaluate than it (search(prune=True)). Every term of
# a stage's time is a time (>= 0), and a stage's micro-batch is the sum of its terms (on a GPU the
# host's exposed share is a term of its own: the smooth maximum of host and device time is the
# device's terms plus it); the step is m times the slowest stage plus its own terms (>= 0: the
# pipeline's fill and drain, the gradient sync, the optimizer). So any choice of terms gives a
# bound, m max_stage (sum of its chosen stage terms) + the chosen step terms. The choice is by
# what a term depends on: the terms that depend on no plan group of `unread` (the groups of
# perfmodel.encode.GROUPS), so that the bound is evaluated once per combination of the others
# (perfmodel.staged). tests/unit/test_search_bound.py checks step_time >= bound.
BOUNDS_UNREAD = {
    # evaluated per plan beside the model-state memory: all but what the overlaps decide
    "step_time_lb": ("overlap",),
    # per combination of a grid's degrees, micro-batch, schedule, recompute, sequence
    # parallelism and cp exchange: before its plans are enumerated (search._Pruner)
    "step_time_lb_grid": ("overlap", "zero"),
}
# the bounds that also take each stage's host time (step_lower_bound): the per-plan one. In the
# grid's the host's terms that read no ZeRO stage (FSDP's hooks do) prune no more plans of the
# searches measured (docs/model.md#bound) and its every evaluation costs more
HOST_FLOOR_BOUNDS = frozenset({"step_time_lb"})
# the module of each bound (outputs_of): one bound each, as each is evaluated where the other is
# not needed (a skeleton's rows: the grid's; a chunk's plans: the per-plan one), and a staged
# module evaluates every output it holds
LOWER_MODULES = {"lower": "step_time_lb", "lower_grid": "step_time_lb_grid"}


def step_lower_bound(built: Any, unread: tuple[str, ...], host: bool = False) -> Any:
    """m x max over the stages of their terms + the step's terms, of the terms that depend on no
    group of `unread` [s]: at most the step time of every plan of the family. `host`: a stage's
    bound is at least its host's time too (below)."""
    from perfmodel import symbols as S
    from perfmodel.codegen import reads
    from perfmodel.costs.lattice import lmax
    from perfmodel.encode import GROUPS
    from perfmodel.step.compose import overlap_floors

    table = S.table()
    unread_symbols = {table[name][0] for g in GROUPS if g.name in unread
                      for name in g.symbols if name in table}
    terms = list(built.time_terms.items())
    unchosen = reads([term for _, term in terms], unread_symbols)
    stages: dict[str, list[Any]] = {}
    step = []
    for (key, term), skip in zip(terms, unchosen, strict=True):
        stage = key.partition(":")[0] if ":" in key else ""
        if stage:
            stages.setdefault(stage, []).append(0 if skip else term)
        elif not skip:
            step.append(term)
    m = built.quantities["micro_batches"]
    if "overlap" in unread:  # the terms the overlap flags decide, dropped above: their floors
        for stage, phases in built.phases.items():
            pairs = [pair for p in phases for pair in overlap_floors(p, m)]
            # an overlap whose switch reads an unread group has its terms (its exposed
            # communication, its contention) dropped above: its floor counts for them, where it
            # reads no unread group itself
            switched = reads([on for on, _ in pairs], unread_symbols)
            unreadable = reads([f for _, f in pairs], unread_symbols)
            kept = [f for (_, f), on, skip in zip(pairs, switched, unreadable, strict=True)
                    if on and not skip]
            if stage == "step":
                step.extend(kept)
            elif stage in stages:
                stages[stage].extend(m * f for f in kept)
    # on an asynchronous device a stage's micro-batch takes at least its host's time, H (its
    # terms add up to the smooth maximum of H and the device's time, or, where its MoE layers
    # sync the host, to sections that each take at least their host's share): its host terms
    # (Stage.host_terms, each a time, >= 0) that read no unread group bound the stage too, so
    # that a host-bound plan's bound is not its device time's
    for stage in stages if host else ():
        times = [x for x in built.stages[stage].host_terms.values() if x != 0] \
            if stage in built.stages else []
        kept = [x for x, skip in zip(times, reads(times, unread_symbols), strict=True) if not skip]
        if kept:
            stages[stage] = [lmax(sum(stages[stage], 0), m * sum(kept, 0))]
    bounds = {stage: sum(terms, 0) for stage, terms in stages.items()}
    skipped = {key for (key, _), skip in zip(terms, unchosen, strict=True) if skip}
    if "pipeline/bubble" in skipped:
        step.append(_bubble_bound(built, bounds, m, unread_symbols))
    return lmax(*bounds.values()) + sum(step, 0)


def _bubble_bound(built: Any, bounds: Mapping[str, Any], m: Any, unread: set[Any]) -> Any:
    """A lower bound on the pipeline's fill and drain, T_bubble = F kept max(0, t_other -
    W_fill), from the stages' bounds (each at most m times its stage's micro-batch time): the
    step term reads every stage's time, and so whatever group one of them reads. t_other (pp - 1)
    = sum_i w_i t_i - max_i t_i, w = (1, pp - 2, 1) over the first, a middle and the last stage,
    is at least the same of the bounds a_i <= t_i: with j the slowest stage it is
    sum_{i != j} w_i t_i + (w_j - 1) t_j, which grows with every t_i where w_j >= 1, so at least
    its value at the a_i, and at least the least such value over j, sum_i w_i a_i - max_i a_i.
    With pp = 2 a middle stage (w 0) never exceeds the others (perfmodel.step.context.
    stage_layers): the slowest is an end, whose w is 1. The zero-bubble fill W_fill subtracts:
    taken as it is where it reads no unread group, else the bound is 0 for a zero-bubble plan
    (built.zero_bubble); 0 for ZB-V, whose bubble is its order's (perfmodel.step.pipeline.
    zbv_bubble_s), which may be below this one. Built with the functions the step model's own are
    (not by replacing the stages' symbols in built.composition: sympy's Max would compare the
    bounds' large terms with each other as it rebuilds)."""
    from perfmodel import symbols as S
    from perfmodel.codegen import reads
    from perfmodel.costs.lattice import lmax, times
    from perfmodel.step import compose as CO
    from perfmodel.step import pipeline as PP
    from perfmodel.step.context import active

    a = {stage: bounds.get(stage, 0) / m for stage in PP.STAGES}
    t_other = CO.other_stages_time(a["first"], a["middle"], a["last"], lmax(*a.values()),
                                   S.pp, active(S.pp))
    w_fill = built.term_values[CO.W_FILL]
    fill_read = reads([w_fill], unread)[0]
    flushes = S.F_pp if built.family.pipeline_flushes else 1
    bubble = PP.bubble_s(m, t_other, 0 if fill_read else w_fill, flushes, lmax(*a.values()))
    bubble = times(1 - built.zbv, bubble)  # ZB-V's own (zbv_bubble_s) may be below it: 0
    return times(1 - built.zero_bubble, bubble) if fill_read else bubble


def outputs_of(built: Any, which: str = "all") -> dict[str, Any]:
    """Flatten a built step model into name -> expression.

    which: "all" (every term, for predict), "search" (step time, memory per stage, model FLOPs, for
    ranking arrays of plans), "bounds" (model-state memory per stage: a cheap pruning bound),
    "memory" (the memory per stage alone, as "search" has it: which plans fit, before their step
    time), or
    one of LOWER_MODULES, a step time's lower bound of BOUNDS_UNREAD for a search that prunes by
    it: "lower" (the per-plan bound) or "lower_grid" (a grid skeleton's).
    """
    out: dict[str, Any]
    if which == "bounds":
        return {f"states:{st}": sum(terms[k] for k in STATES)
                for st, terms in built.memory_terms.items()}
    if which in LOWER_MODULES:
        name = LOWER_MODULES[which]
        return {name: step_lower_bound(built, BOUNDS_UNREAD[name], name in HOST_FLOOR_BOUNDS)}
    if which == "memory":
        return {f"memory:{st}": sum(terms.values()) for st, terms in built.memory_terms.items()}
    if which == "search":
        out = {"step_time": built.step_time,
               "q:model_flops_per_step": built.quantities["model_flops_per_step"]}
        out.update({f"memory:{st}": sum(terms.values())
                    for st, terms in built.memory_terms.items()})
        return out
    out = {"step_time": built.step_time}
    out.update({f"time:{k}": v for k, v in built.time_terms.items()})
    out.update({f"hidden:{k}": v for k, v in built.hidden_terms.items()})
    out.update({f"stage_time:{k}": v for k, v in built.stage_time.items()})
    for stage, terms in built.memory_terms.items():
        out.update({f"memory:{stage}:{k}": v for k, v in terms.items()})
    out.update({f"q:{k}": v for k, v in built.quantities.items()})
    for i, op in enumerate(built.ledger):
        out[f"ledger:{i}:calls"] = op.calls
        out[f"ledger:{i}:nbytes"] = op.nbytes
    return out


def _hash_sources() -> str:
    """A hash of every source file of the package: any change rebuilds the compiled formulas."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# Taken when the package is imported, so that a process names its cache files after the code it
# runs, even if the files change while it runs (it would otherwise file old formulas under the
# new code's name).
_SOURCE_HASH = _hash_sources()


def _source_hash() -> str:
    return _SOURCE_HASH


def cache_dir() -> Path | None:
    if os.environ.get("PERFMODEL_NO_CACHE"):
        return None
    root = os.environ.get("PERFMODEL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "perfmodel")
    return Path(root)


def cached(name: str, build: Callable[[], str]) -> dict[str, Any]:
    """The namespace of generated code: the disk cache's module `name`, else the source `build()`
    makes, then filed under `name` for the next process.

    A cached module is imported as Python imports any module, its bytecode cached next to it
    (__pycache__), so that a warm start neither builds nor compiles it. A module that a child
    process builds (build_ahead) is waited for, then read from the cache."""
    root = cache_dir()
    path = root / f"{_source_hash()}-{name}.py" if root else None
    if path is not None:
        try:
            path.is_file()  # pathlib raises EACCES (a directory this user cannot search)
        except OSError:  # a cache that cannot be looked into only costs speed, as a read-only one
            path = None
    if path is not None:
        _await(path)
    if _WARM_ONLY and not _BUILD_MISSING and (path is None or not path.is_file()):
        if path is None or _ON_MISSING is None:
            raise Cold(name)
        _ON_MISSING(path)  # waits until another process has filed it (perfmodel.ahead)
    if path is not None and path.is_file():
        try:
            return _import(path)
        except Exception:  # a corrupt or foreign cache file is rebuilt, never trusted
            import importlib.util

            path.unlink(missing_ok=True)
            Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)
    source = build()
    if path is not None:
        try:
            write_atomic(path, source, what="compiled-code cache", make_parents=True)
        except OutputError:
            pass  # a read-only cache directory only costs speed
        else:
            _prune(path.parent)
            return _import(path)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<perfmodel {name}>", "exec"), namespace)  # our own generated code
    return namespace


# --- building the next modules in a child process -----------------------------------------------
# A cold search builds several modules of one family from one step model: the lower bounds' first,
# then the search's and the prediction's. The step model built, a child process (a fork: it has
# the model already) builds the others into the disk cache while this process splits and prints
# the first and runs the bounds; each module is read from the cache once the child says it is
# there. os.fork by hand, not multiprocessing: its child flushes the parent's buffered output
# again on exit, and importing it costs more than the fork.

class Cold(Exception):
    """A module the disk cache lacks, asked for in a process that reads the cache only
    (warm_only)."""


# a child that runs work ahead of its parent (perfmodel.ahead) reads the modules the disk cache
# has and builds none: where the cache is cold the parent builds them once, itself
_WARM_ONLY = False
_ON_MISSING: Callable[[Path], None] | None = None


# ... except in a job that build_missing allows: one of a family its parent builds no module of
_BUILD_MISSING = False


def build_missing(allowed: bool) -> None:
    """In a child that runs ahead (warm_only): whether its next job builds the modules the disk
    cache lacks itself, in this process and in order (none ahead in a child of its own), instead
    of waiting for them: a job of a family its parent builds no module of (an FP8 search's bf16
    twin), which would otherwise wait for the parent to finish and build it after its own."""
    global _BUILD_MISSING
    _BUILD_MISSING = allowed


def warm_only(on_missing: Callable[[Path], None] | None = None) -> None:
    """In a forked child that runs ahead of its parent (perfmodel.ahead): from now on read
    compiled modules from the disk cache only and build none ahead; forget the parent's
    build-ahead children (theirs to wait for). A missing module raises Cold, or, with
    on_missing, is waited for: on_missing(path) returns once the module is filed there (the
    parent, or its build-ahead child, builds it) or ends the process."""
    global _WARM_ONLY, _ON_MISSING
    _WARM_ONLY, _ON_MISSING = True, on_missing
    _AHEAD.clear()
    _DONE.clear()


def coming(path: Path) -> bool:
    """The module at `path` is in the disk cache, or a build-ahead child of this process is
    still building it (one that has ended without filing it will not)."""
    if path.is_file():
        return True
    _reap()  # (a child that has ended is forgotten: it filed what it built)
    return path in _AHEAD or path.is_file()


_AHEAD: dict[Path, tuple[int, int, str]] = {}  # module path -> (child pid, read end of its
# pipe, module name)
_DONE: dict[int, tuple[set[str], bytearray]] = {}  # pipe -> the names its child has filed so
# far, and what it has written of the next


def _can_fork() -> bool:
    """A child may be forked: Linux (a fork elsewhere may break system libraries), no other
    Python thread in this process (a fork copies one thread: a lock another one holds stays
    held; numpy's BLAS threads hold none the child takes), and a second CPU to run it on."""
    import sys
    import threading

    if os.environ.get("PERFMODEL_NO_BUILD_AHEAD") or not sys.platform.startswith("linux"):
        return False
    if threading.active_count() != 1:
        return False
    return len(os.sched_getaffinity(0)) > 1


# The signals that stop a child (SIGTERM from its parent, SIGINT from the terminal) are held
# from before the fork until the child has set its own handlers (child_ready): one that came
# before would run the parent's handler in the child (the CLI's raises), and the child would go
# on in its copy of the parent's code (a test runner's loop, waited for by its parent for ever).
_HELD = frozenset({signal.SIGTERM, signal.SIGINT})
_MASK_BEFORE_FORK: set[int | signal.Signals] | None = None


def fork_child() -> tuple[int, int, int] | None:
    """Fork a child with a pipe to it: (pid, read end, write end), pid 0 in the child; None
    where no child may be forked (_can_fork) or the fork failed. The child's SIGTERM and SIGINT
    are held until it calls child_ready, once its handlers are set, in its `try`."""
    global _MASK_BEFORE_FORK
    if not _can_fork():
        return None
    read, write = os.pipe()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(read)
        os.close(write)
        return None
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    else:
        _MASK_BEFORE_FORK = mask
    return pid, read, write


def child_ready() -> None:
    """In a forked child whose handlers are set: the signals held since the fork are taken (a
    SIGTERM its parent sent meanwhile is delivered now)."""
    if _MASK_BEFORE_FORK is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _MASK_BEFORE_FORK)


def detach_child(read: int) -> None:
    """In a forked child: close the pipe's read end and put its standard streams on /dev/null
    (whoever reads the parent's output is not kept waiting for the child)."""
    os.close(read)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def build_ahead(modules: list[tuple[str, Callable[[], str]]]) -> None:
    """Build `modules` ((cache name, source builder) each) into the disk cache in a child process,
    in order, unless cached, already under way or the child cannot be forked (_can_fork). A
    child still building when this process exits is stopped (_stop_ahead)."""
    root = cache_dir()
    if root is None or _WARM_ONLY:
        return
    _reap()
    paths = {name: root / f"{_source_hash()}-{name}.py" for name, _ in modules}
    todo = [(name, build) for name, build in modules
            if paths[name] not in _AHEAD and not paths[name].is_file()]
    forked = fork_child() if todo else None
    if forked is None:
        return
    pid, read, write = forked
    if pid == 0:  # the child: build, file, tell; never returns into the parent's code
        _child(todo, paths, read, write)
    os.close(write)
    global _STOP_REGISTERED
    if not _STOP_REGISTERED:
        import atexit

        atexit.register(_stop_ahead)
        _STOP_REGISTERED = True
    _DONE[read] = (set(), bytearray())
    for name, _ in todo:
        _AHEAD[paths[name]] = (pid, read, name)


_STOP_REGISTERED = False


def _child(todo: list[tuple[str, Callable[[], str]]], paths: dict[str, Path], read: int,
           write: int) -> None:
    """The child of build_ahead: off the parent's terminal and pipes (whoever reads the parent's
    output is not kept waiting for it), stopped by SIGTERM as by an exception (a module half
    written is removed), it files each module and its bytecode and writes its name to the pipe."""
    status = 0
    try:
        def stop(signum: int, frame: Any) -> None:
            raise SystemExit(1)

        signal.signal(signal.SIGTERM, stop)
        child_ready()
        detach_child(read)
        for name, build in todo:
            write_atomic(paths[name], build(), what="compiled-code cache", make_parents=True)
            _compile_bytecode(paths[name])
            os.write(write, f"{name}\n".encode())
    except BaseException:  # noqa: BLE001 (the parent builds what is missing itself)
        status = 1
    os._exit(status)


def _stop_ahead() -> None:
    """Stop the children still building (at exit: their modules were not asked for)."""
    for pid, read in {(pid, read) for pid, read, _ in _AHEAD.values()}:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        _close(pid, read)


def _await(path: Path) -> None:
    """Wait until the child building the module at `path` has filed it or ended (reading its
    pipe)."""
    entry = _AHEAD.pop(path, None)
    if entry is None:
        return
    pid, read, name = entry
    if read not in _DONE:  # closed: the child has ended
        return
    done, partial = _DONE[read]
    while name not in done:
        chunk = os.read(read, 4096)
        if not chunk:  # the child has ended: what it did not file, this process builds
            break
        partial += chunk
        *lines, rest = partial.split(b"\n")
        partial[:] = rest
        done.update(line.decode() for line in lines)
    if name not in done or not any(p == pid for p, _, _ in _AHEAD.values()):
        _close(pid, read)


def _close(pid: int, read: int) -> None:
    if _DONE.pop(read, None) is not None:
        os.close(read)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    for path in [path for path, (p, _, _) in _AHEAD.items() if p == pid]:
        del _AHEAD[path]


def _reap() -> None:
    """Collect the children that have ended (modules a process never asked for)."""
    for pid, read in {(pid, read) for pid, read, _ in _AHEAD.values()}:
        try:
            ended, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            ended = pid
        if ended == pid:
            _close(pid, read)


STALE_S = 14 * 86400  # another version's modules unused this long are removed
_PRUNED: set[Path] = set()  # the cache directories this process has pruned


def _prune(root: Path) -> None:
    """Remove the modules of other versions of perfmodel (another source hash) not used for
    STALE_S, with their bytecode: each version files its own, so without this the cache would
    grow with every upgrade. A module's bytecode is touched when imported (_import), so that two
    versions used side by side (two environments) keep theirs. Runs after a build only (a new
    version, or a family not seen yet), where listing the directory is a small part of it."""
    import time

    if root in _PRUNED:  # once a process: a cold search builds several modules
        return
    _PRUNED.add(root)
    now = time.time()
    current = f"{_source_hash()}-"
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    import importlib.util

    for entry in entries:
        if entry.name.startswith(current) or not entry.name.endswith(".py"):
            continue
        try:
            if not entry.is_file(follow_symlinks=False) \
                    or now - entry.stat(follow_symlinks=False).st_mtime < STALE_S:
                continue
            bytecode = Path(importlib.util.cache_from_source(entry.path))
            if bytecode.is_file() and now - bytecode.stat().st_mtime < STALE_S:
                continue
            os.unlink(entry.path)
            bytecode.unlink(missing_ok=True)
        except OSError:
            continue  # another process removed it first, or the directory is read-only


def _compile_bytecode(path: Path) -> None:
    """Cache the bytecode of the generated module at path (py_compile: as Python caches any
    module's, but also where PYTHONDONTWRITEBYTECODE is set, since these modules are ours)."""
    import py_compile

    try:
        py_compile.compile(str(path), doraise=True)
    except (py_compile.PyCompileError, OSError):
        pass  # no bytecode cache only costs a compile per process


def _import(path: Path) -> dict[str, Any]:
    """The namespace of the generated module at path (importlib: its bytecode cached)."""
    import importlib.util

    bytecode = importlib.util.cache_from_source(str(path))
    if not os.path.exists(bytecode):
        _compile_bytecode(path)
    else:
        try:  # in use, kept from _prune: the bytecode's mtime is when the module was last used
            os.utime(bytecode)  # (the source's would make Python recompile it)
        except OSError:
            pass
    spec = importlib.util.spec_from_file_location(f"perfmodel_generated_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def family_key(family: Any) -> str:
    """The family as text that is the same in every process: its fields in order, a set's items
    sorted (a frozenset of strings iterates in an order that changes with PYTHONHASHSEED, so its
    repr cannot key the disk cache)."""
    import dataclasses

    def stable(value: Any) -> Any:
        if isinstance(value, frozenset | set):
            return sorted((stable(v) for v in value), key=repr)
        if isinstance(value, tuple):
            return tuple(stable(v) for v in value)
        return value

    return repr([(f.name, stable(getattr(family, f.name)))
                 for f in dataclasses.fields(family)])


@lru_cache(maxsize=256)
def compile_family(family: Any, which: str = "all") -> Compiled:
    """Lambdify a family once per process (and once per machine, through the disk cache)."""
    return _compiled(cached(family_module(family, which), lambda: _source(family, which)))


def _compiled(namespace: Mapping[str, Any]) -> Compiled:
    """A compiled module's function, its names and the rest of its META."""
    meta = namespace["META"]
    return Compiled(tuple(meta["args"]), tuple(meta["outs"]), namespace["family"],
                    {k: v for k, v in meta.items() if k not in ("args", "outs")})


def family_module(family: Any, which: str = "all") -> str:
    """The disk cache's name for compile_family(family, which)."""
    return hashlib.sha256(f"{family_key(family)}/{which}".encode()).hexdigest()[:20]


@lru_cache(maxsize=16)
def _built(family: Any) -> Any:
    from perfmodel.step import build

    return build(family)


def _source(family: Any, which: str) -> str:
    """The numpy source of a family's outputs: META (argument and output names; for "all", the
    ledger's records) and `family(*args)` (perfmodel.codegen; sympy.lambdify for a node codegen
    cannot print)."""
    built = _built(family)
    extra = {"ledger": [[op.name, op.axis, op.op, op.phase, op.stage] for op in built.ledger]} \
        if which == "all" else {}
    return outputs_source(outputs_of(built, which), extra)


def compile_outputs(family: Any, name: str, outputs: Callable[[Any], Mapping[str, Any]],
                    extra: Callable[[Any], Mapping[str, Any]] | None = None) -> Compiled:
    """Compile other outputs of a family's built model (`outputs(built)`: name -> expression),
    cached on disk like compile_family's under `name` (e.g. perfmodel.timeline's pass times);
    `extra(built)`, literals about the built model, kept in Compiled.meta (no sympy model in a
    warm process)."""
    key = hashlib.sha256(f"{family_key(family)}/{name}".encode()).hexdigest()[:20]

    def source() -> str:
        built = _built(family)
        return outputs_source(outputs(built), extra(built) if extra else None)

    return _compiled(cached(key, source))


def outputs_source(outputs: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> str:
    """The numpy source of named expressions (see _source), `extra` in its META (literals)."""
    import sympy as sp

    from perfmodel import codegen
    from perfmodel import symbols as S

    exprs = [sp.sympify(e) for e in outputs.values()]
    table = S.table()
    used = codegen.free_symbols(exprs)
    arg_names = tuple(name for name, (sym, _) in table.items() if sym in used)
    taken: set[str] = set()
    params = [(table[name][0], codegen.identifier(name, taken)) for name in arg_names]
    meta = {"args": list(arg_names), "outs": list(outputs), **(extra or {})}
    return (f"# perfmodel compiled family\nimport numpy as {codegen.NUMPY}\n\nMETA = {meta!r}\n\n\n"
            f"{codegen.function_source('family', params, exprs)}")
