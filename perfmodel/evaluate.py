"""Numeric evaluation: lambdify each family's expressions once, evaluate numbers or numpy arrays.

The compiled numpy source of each family is cached on disk (keyed by the family and a hash of the
cost-model sources), so a cold `perfmodel predict` skips building the sympy expressions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.errors import OutputError
from perfmodel.files import write_atomic
from perfmodel.specs.hardware import HardwareSpec
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import BYTES_PER_ELEMENT, Dtype, Plan

_PACKAGE = Path(__file__).parent


def grid_degrees(plan: Plan) -> tuple[int, int, int]:
    """The sub-axes (a, b, c) of the tensor-parallel grid: (q, q, 1) for 2d, (q, q, d) for 2.5d,
    (q, q, q) for 3d, (1, 1, 1) for 1d."""
    layout = plan.tp_layout.value
    if layout == "1d":
        return 1, 1, 1
    q = plan.grid_q
    return q, q, (q if layout == "3d" else plan.tp_depth)


def axis_per_node(plan: Plan, gpus_per_node: int) -> dict[str, tuple[int, str]]:
    """For each axis: ranks of one group inside one node, and the scope (intra, inter, mixed).

    Ranks are numbered with the first axis of `plan.placement` varying fastest; a group of an axis
    holds ranks `stride` apart, stride = product of the degrees of the axes inside it. The
    tensor-parallel group is laid out as its grid's sub-axes a, b, c (a fastest).
    """
    degrees = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    grid = dict(zip(("tpa", "tpb", "tpc"), grid_degrees(plan), strict=True))
    out: dict[str, tuple[int, str]] = {}

    def place(axis: str, n: int, stride: int) -> None:
        k = 1 if stride >= gpus_per_node else max(1, min(n, gpus_per_node // stride))
        out[axis] = (k, "intra" if k >= n else ("inter" if k == 1 else "mixed"))

    stride = 1
    for axis in plan.placement:
        n = degrees[axis]
        place(axis, n, stride)
        if axis == "tp":
            sub = stride
            for name in ("tpa", "tpb", "tpc"):
                place(name, grid[name], sub)
                sub *= grid[name]
        stride *= n
    return out


def family_of(model: TransformerSpec, hardware: HardwareSpec, plan: Plan, *,
              specialise: bool = False) -> Any:
    """The universal family of a hardware (every option open), or the plan's own fixed family."""
    from perfmodel.family import Family

    fixed = dict(algorithm=hardware.collective_algorithm,
                 fits=frozenset((fit.op, fit.scope, fit.algorithm) for fit in hardware.collectives),
                 gemm_split_k=any(g.splits_k for g in hardware.gemm_efficiency.values()),
                 gemm_large_kernel=any(g.has_large_kernel
                                       for g in hardware.gemm_efficiency.values()),
                 gemm_epilogue=any(g.has_epilogue for g in hardware.gemm_efficiency.values()),
                 layer_costs=frozenset((c.part, c.style, c.tp) for c in hardware.layer_costs))
    if not specialise:
        return Family(**fixed, free_head_dim=True)
    placement = axis_per_node(plan, hardware.gpus_per_node)
    return Family(
        schedule=plan.schedule.value,
        recompute=plan.recompute.value,
        sequence_parallel=plan.sequence_parallel,
        zero=plan.zero,
        flash=plan.flash_attention,
        overlap_grad_sync=plan.overlap_grad_sync,
        gated=model.gated_mlp,
        tied_embeddings=model.tied_embeddings,
        learned_positions=model.position_embedding == "learned",
        bias=model.bias,
        qkv_bias=bool(model.qkv_bias),
        layernorm=model.norm == "layernorm",
        tp_layout="2d" if plan.tp_layout.value == "2.5d" else plan.tp_layout.value,
        free_head_dim=model.attention_width != model.hidden,
        scopes=tuple((axis, placement[axis][1]) for axis in ("tp", "dp", "pp", "tpa", "tpb", "tpc")),
        **fixed,
    )


def precision_of(plan: Plan) -> str:
    return plan.dtype.value if plan.dtype in (Dtype.BF16, Dtype.FP16) else "fp32"


def values_of(model: TransformerSpec, hardware: HardwareSpec, plan: Plan) -> dict[str, float]:
    """The numeric value of every symbol, by symbol name (see perfmodel.symbols)."""
    from perfmodel import symbols as S
    from perfmodel.costs.precision import (
        model_state_bytes_per_param,
        optimizer_step_bytes_per_param,
    )

    placement = axis_per_node(plan, hardware.gpus_per_node)
    gemm = hardware.gemm(plan.dtype.value)
    precision = precision_of(plan)
    state = model_state_bytes_per_param(precision)
    vals: dict[str, float] = {
        "layers": model.layers, "hidden": model.hidden, "heads": model.heads,
        "kv_heads": model.kv_heads, "ffn_hidden": model.ffn_hidden, "head_dim": model.head_dim,
        "seq_len": model.seq_len,
        "vocab": model.vocab, "dp": plan.dp, "tp": plan.tp, "pp": plan.pp,
        "micro_batch": plan.micro_batch, "global_batch": plan.global_batch,
        "virtual_stages": plan.virtual_stages,
        "bytes_per_element": BYTES_PER_ELEMENT[plan.dtype],
        "weight_bytes_per_param": state["weights"],
        "grad_bytes_per_param": state["gradients"],
        "optimizer_bytes_per_param": state["optimizer_states"],
        "optimizer_step_bytes_per_param": optimizer_step_bytes_per_param(precision),
        "tp_per_node": placement["tp"][0], "dp_per_node": placement["dp"][0],
        "pp_per_node": placement["pp"][0],
        **dict(zip(("tpa", "tpb", "tpc"), grid_degrees(plan), strict=True)),
        "tpa_per_node": placement["tpa"][0], "tpb_per_node": placement["tpb"][0],
        "tpc_per_node": placement["tpc"][0],
        "peak_flops_per_s": hardware.peak(plan.dtype.value),
        "memory_bandwidth_bytes_per_s": hardware.memory_bandwidth_bytes_per_s
        * hardware.memory_bandwidth_efficiency,
        "optimizer_bandwidth_bytes_per_s": hardware.memory_bandwidth_bytes_per_s
        * (hardware.optimizer_bandwidth_efficiency or hardware.memory_bandwidth_efficiency),
        "kernel_overhead_s": hardware.kernel_overhead_s,
        "collective_overhead_s": hardware.collective_overhead_s,
        "kernel_overhead_tp_s": hardware.kernel_overhead_tp_s,
        "optimizer_overhead_s": hardware.optimizer_overhead_s,
        "gpus_per_node": hardware.gpus_per_node,
        "ranks_per_device": hardware.ranks_per_device,
        "fsdp_forward_overhead_s": hardware.fsdp_forward_overhead_s,
        "fsdp_backward_overhead_s": hardware.fsdp_backward_overhead_s,
        "fsdp_reduce_overhead_s": hardware.fsdp_reduce_overhead_s,
        "intra_latency_s": hardware.intra_node.latency_s,
        "intra_bandwidth": hardware.intra_node.effective_bandwidth_bytes_per_s,
        "inter_latency_s": hardware.inter_node.latency_s,
        "inter_bandwidth": hardware.inter_node.effective_bandwidth_bytes_per_s,
    }
    flags = {
        "sequence_parallel": plan.sequence_parallel,
        "recompute_full": plan.recompute.value == "full",
        "recompute_selective": plan.recompute.value == "selective",
        "zero1": plan.zero >= 1, "zero2": plan.zero >= 2, "zero3": plan.zero >= 3,
        "gpipe": plan.schedule.value == "gpipe", "interleaved": plan.schedule.value == "interleaved",
        "zero_bubble": plan.schedule.value in ("zb", "zbv"), "zbv": plan.schedule.value == "zbv",
        "flash": plan.flash_attention, "overlap_grad_sync": plan.overlap_grad_sync,
        "gated": model.gated_mlp, "bias": model.bias, "qkv_bias": bool(model.qkv_bias),
        "layernorm": model.norm == "layernorm", "tied": model.tied_embeddings,
        "learned_positions": model.position_embedding == "learned",
        "tp2d": plan.tp_layout.value in ("2d", "2.5d"), "tp3d": plan.tp_layout.value == "3d",
    }
    for axis in ("tp", "dp", "pp", "tpa", "tpb", "tpc"):
        for scope in ("intra", "inter", "mixed"):
            flags[f"{axis}_{scope}"] = placement[axis][1] == scope
    vals.update({f"is_{name}": float(value) for name, value in flags.items()})
    for fld in dataclasses.fields(gemm):
        vals[f"gemm_{fld.name}"] = float(getattr(gemm, fld.name))
    # no large-tile kernel: a threshold no GEMM reaches (perfmodel.costs.gemm_efficiency.at_least);
    # no split-K: any chunk (k / chunk is computed, then multiplied by 0), but not 0
    vals["gemm_large_flops"] = gemm.large_flops or math.inf
    if not gemm.splits_k:
        vals["gemm_split_k_chunk"] = 1.0
    for cost in hardware.layer_costs:
        vals.update(zip(S.layer_cost_names(cost.part, cost.style, cost.tp),
                        (getattr(cost, name) for name in S.LAYER_COST_FIELDS), strict=True))
    for fit in hardware.collectives:
        key = f"fit_{fit.op}_{fit.scope}"
        two = fit.breakpoint_bytes > 0
        vals.update({
            f"{key}_alpha_s": fit.alpha_s, f"{key}_busbw": fit.bus_bandwidth_bytes_per_s,
            f"{key}_alpha_s_small": fit.alpha_s_small if two else fit.alpha_s,
            f"{key}_busbw_small": fit.bus_bandwidth_bytes_per_s_small if two
            else fit.bus_bandwidth_bytes_per_s,
            f"{key}_breakpoint_bytes": fit.breakpoint_bytes,
        })
    return vals


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A family's expressions compiled to one numpy function."""

    arg_names: tuple[str, ...]
    out_names: tuple[str, ...]
    fn: Callable[..., Any]

    def __call__(self, values: Mapping[str, Any]) -> dict[str, Any]:
        args = [values.get(name, 1.0) for name in self.arg_names]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.fn(*args)
        return dict(zip(self.out_names, out, strict=True))


STATES = ("weights", "gradients", "optimizer_states")


def outputs_of(built: Any, which: str = "all") -> dict[str, Any]:
    """Flatten a built step model into name -> expression.

    which: "all" (every term, for predict), "search" (step time, memory per stage, model FLOPs, for
    ranking arrays of plans) or "bounds" (model-state memory per stage: a cheap pruning bound).
    """
    if which == "bounds":
        return {f"states:{st}": sum(terms[k] for k in STATES)
                for st, terms in built.memory_terms.items()}
    if which == "search":
        out = {"step_time": built.step_time,
               "q:model_flops_per_step": built.quantities["model_flops_per_step"]}
        out.update({f"memory:{st}": sum(terms.values()) for st, terms in built.memory_terms.items()})
        return out
    out: dict[str, Any] = {"step_time": built.step_time}
    out.update({f"time:{k}": v for k, v in built.time_terms.items()})
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


def cached(name: str, load: Callable[[Path], Any], build: Callable[[], tuple[Any, str]]) -> Any:
    """Generated code from the disk cache, `load(path)`; else what `build()` makes, whose source
    (its second item) is then filed under `name` for the next process."""
    root = cache_dir()
    path = root / f"{_source_hash()}-{name}.py" if root else None
    if path is not None and path.is_file():
        try:
            return load(path)
        except Exception:  # a corrupt or foreign cache file is rebuilt, never trusted
            path.unlink(missing_ok=True)
    made, source = build()
    if path is not None:
        try:
            write_atomic(path, source, what="compiled-code cache", make_parents=True)
        except OutputError:
            pass  # a read-only cache directory only costs speed
    return made


@lru_cache(maxsize=256)
def compile_family(family: Any, which: str = "all") -> Compiled:
    """Lambdify a family once per process (and once per machine, through the disk cache)."""
    key = hashlib.sha256(f"{family!r}/{which}".encode()).hexdigest()[:20]
    return cached(key, _load, lambda: _lambdify(family, which))


@lru_cache(maxsize=16)
def _built(family: Any) -> Any:
    from perfmodel.step import build

    return build(family)


def _lambdify(family: Any, which: str) -> tuple[Compiled, str]:
    import sympy as sp

    from perfmodel import symbols as S

    outputs = outputs_of(_built(family), which)
    table = S.table()
    used = set().union(*(sp.sympify(e).free_symbols for e in outputs.values()))
    arg_names = tuple(name for name, (sym, _) in table.items() if sym in used)
    args = [table[name][0] for name in arg_names]
    exprs = [sp.sympify(e) for e in outputs.values()]
    fn = sp.lambdify(args, exprs, modules="numpy", cse=True, docstring_limit=0)
    import inspect

    body = inspect.getsource(fn)
    header = json.dumps({"args": arg_names, "outs": list(outputs)})
    # import only the numpy names the code uses: `from numpy import *` would load numpy's lazy
    # submodules (f2py, ...) and cost most of a second at every start
    import ast

    names = {node.id for node in ast.walk(ast.parse(body)) if isinstance(node, ast.Name)}
    used_numpy = sorted(n for n in names if hasattr(np, n) and not n.startswith("_"))
    imports = f"from numpy import {', '.join(used_numpy)}\n" if used_numpy else ""
    source = (f"# perfmodel compiled family\n# {header}\nimport numpy\n{imports}"
              f"from functools import reduce\n{body}")
    return Compiled(arg_names, tuple(outputs), fn), source


def _load(path: Path) -> Compiled:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    meta = json.loads(lines[1][2:])
    namespace: dict[str, Any] = {}
    exec(compile(text, str(path), "exec"), namespace)  # our own generated numpy code
    fn = next(v for k, v in namespace.items() if k.startswith("_lambdifygenerated"))
    return Compiled(tuple(meta["args"]), tuple(meta["outs"]), fn)
