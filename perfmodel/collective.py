"""One collective's predicted time, algorithm and bandwidth (`perfmodel collective`)."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from perfmodel.errors import PlanError
from perfmodel.output import fmt_bytes, require_finite
from perfmodel.specs.hardware import HardwareSpec

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30}


MAX_BYTES = 2.0**60  # one collective of more than an exbibyte per rank is a typo, not a plan


def parse_bytes(text: str) -> float:
    """'1e9', '256MiB', '64KB', '8G' (nccl-tests style: K/M/G are powers of 1024) -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise PlanError(f"--bytes must be a size like 1e9, 256MiB, 64KB or 8G, got '{text}'")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"--bytes must be positive, got '{text}'")
    if value > MAX_BYTES:
        raise PlanError(f"--bytes must be at most 1 EiB (2^60 bytes) per rank, got '{text}'")
    return value


@lru_cache(maxsize=64)
def _compiled(op: str, scope: str, algorithm: str, fitted: tuple[str, ...]) -> dict[str, Any]:
    import sympy as sp

    from perfmodel import symbols as S
    from perfmodel.costs import collectives as C
    from perfmodel.step import Family, group_time

    nbytes = sp.Symbol("nbytes", positive=True)
    options: dict[str, Any] = {}
    algs = [a.value for a in C.ALGORITHMS[C.Op(op)]]
    if scope == "mixed" and op not in ("all_to_all", "send_recv"):
        algs.append("hierarchical")
    choices = algs if algorithm == "auto" else [algorithm]
    for alg in choices:
        fam = Family(scopes=(("tp", scope), ("dp", "intra"), ("pp", "intra")), algorithm=alg,
                     fits=frozenset((op, fs, fa) for fs, fa in (f.split(":") for f in fitted)))
        expr = group_time(op, nbytes, "tp", fam)
        args = [nbytes, S.tp, S.k_tp, S.G, S.alpha_i, S.beta_i, S.alpha_o, S.beta_o]
        fit_args = [sym for f in fitted for sym in S.fit_symbols(op, f.split(":")[0])]  # 5 each
        options[alg] = sp.lambdify(args + fit_args, expr, modules="numpy")
    return options


def predict_collective(op: str, nbytes: float, ranks: int, hardware: HardwareSpec,
                       ranks_per_node: int | None = None,
                       algorithm: str = "auto") -> dict[str, Any]:
    """Time [s], algorithm bandwidth and bus bandwidth [B/s] (nccl-tests' definitions)."""
    from perfmodel.costs.collectives import ALGORITHMS, Op, bus_factor

    if ranks < 1 or ranks > 10**8:
        raise PlanError(f"--ranks must be between 1 and 1e8, got {ranks}")
    per_node = ranks_per_node if ranks_per_node is not None else min(ranks, hardware.gpus_per_node)
    if per_node < 1 or per_node > ranks or ranks % per_node:
        raise PlanError(f"--ranks-per-node must divide --ranks ({ranks}) and be >= 1, "
                        f"got {per_node}")
    if per_node > hardware.gpus_per_node:
        raise PlanError(f"--ranks-per-node ({per_node}) exceeds the hardware's gpus_per_node "
                        f"({hardware.gpus_per_node})")
    scope = "intra" if per_node >= ranks else ("inter" if per_node == 1 else "mixed")
    allowed = [a.value for a in ALGORITHMS[Op(op)]] + (["hierarchical"] if scope == "mixed" else [])
    if algorithm != "auto" and algorithm not in allowed:
        raise PlanError(f"algorithm '{algorithm}' is not available for {op} on a {scope}-node "
                        f"group; allowed: auto, {', '.join(allowed)}")
    fit_scope = "intra" if scope == "intra" else "inter"
    fits = [f for f in hardware.collectives if f.op == op and f.scope == fit_scope]
    fitted = tuple(f"{f.scope}:{f.algorithm}" for f in fits[:1])
    fns = _compiled(op, scope, algorithm, fitted)
    args = [nbytes, ranks, per_node, hardware.gpus_per_node, hardware.intra_node.latency_s,
            hardware.intra_node.effective_bandwidth_bytes_per_s, hardware.inter_node.latency_s,
            hardware.inter_node.effective_bandwidth_bytes_per_s]
    for f in fits[:1]:
        two = f.breakpoint_bytes > 0
        args += [f.alpha_s, f.bus_bandwidth_bytes_per_s,
                 f.alpha_s_small if two else f.alpha_s,
                 f.bus_bandwidth_bytes_per_s_small if two else f.bus_bandwidth_bytes_per_s,
                 f.breakpoint_bytes]
    times = {alg: float(fn(*args)) for alg, fn in fns.items()}
    best = min(times, key=times.__getitem__)
    if fits:
        best = f"calibrated ({fits[0].algorithm})"
        times = {best: next(iter(times.values()))}
    t = min(times.values())
    factor = float(bus_factor(op, ranks))
    # one rank moves nothing (time 0): its bandwidths are undefined, not infinite (null in JSON)
    moves = ranks > 1
    result = {
        "op": op, "bytes": nbytes, "ranks": ranks, "ranks_per_node": per_node, "scope": scope,
        "algorithm": best, "time_s": t,
        "algbw_bytes_per_s": nbytes / t if moves else None,
        "busbw_bytes_per_s": nbytes / t * factor if moves else None,
        "bus_factor": factor, "by_algorithm_s": times, "hardware": hardware.name,
    }
    require_finite(result, "the collective's time",
                   f"{op} of {fmt_bytes(nbytes)} over {ranks} ranks on {hardware.name}")
    return result
