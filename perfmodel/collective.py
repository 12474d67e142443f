"""One collective's predicted time, algorithm and bandwidth (`perfmodel collective`)."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from perfmodel.errors import PlanError, UsageError
from perfmodel.output import fmt_bytes, require_finite
from perfmodel.specs.hardware import HardwareSpec

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "eb": 1e18,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60,
          "k": 2**10, "m": 2**20, "g": 2**30}


MAX_BYTES = 2.0**60  # one collective of more than an exbibyte per rank is a typo, not a plan


def parse_bytes(text: str) -> float:
    """'1e9', '256MiB', '64KB', '8G' (nccl-tests style: K/M/G are powers of 1024) -> bytes. A
    text that is no size, not finite or not whole bytes is a usage error (exit 2: the option's
    form); a size of 0 or less, or over MAX_BYTES, a plan error (exit 4, as --ranks 0)."""
    match = re.fullmatch(r"\s*([+-]?(?:nan|infinity|inf|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?))\s*"
                         r"([a-zA-Z]*)\s*", str(text), re.IGNORECASE)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"--bytes must be a size like 1e9, 256MiB, 64KB or 8G, got '{text}'")
    unit = match.group(2)
    if len(unit) > 1 and unit.endswith("b") and unit[-2] != "i":  # Gb, Mb, kb: bits or bytes?
        raise UsageError(f"--bytes {text}: '{unit}' reads as bits; give bytes "
                         f"({_byte_units(unit[:-1])})")
    number = float(match.group(1))
    if not math.isfinite(number):  # 1e400: read as inf, neither positive nor a size
        raise UsageError(f"--bytes must be a finite number, got '{text}'")
    value = number * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise PlanError(f"--bytes must be positive, got '{text}'")
    if value > MAX_BYTES:
        raise PlanError(f"--bytes must be at most 1 EiB (2^60 bytes) per rank, got '{text}'")
    if value != math.floor(value):  # a message is whole bytes: 1.5 would print as 2 B
        raise UsageError(f"--bytes must be a whole number of bytes, got '{text}' ({value:g} "
                         "bytes)")
    return value


def _byte_units(prefix: str) -> str:
    """The byte units of a prefix as parse_bytes takes them: 'g' -> 'GB, GiB or G' (kB, KiB or
    K; TB or TiB: a bare T, P or E is not one)."""
    letter = prefix.lower()
    decimal = "kB" if letter == "k" else f"{letter.upper()}B"
    units = [decimal, f"{letter.upper()}iB"] + ([letter.upper()] if letter in _UNITS else [])
    return ", ".join(units[:-1]) + " or " + units[-1]


@lru_cache(maxsize=256)
def _compiled(op: str, scope: str, algorithm: str, protocol: str, fitted: tuple[str, ...],
              library: str, features: frozenset[str]) -> tuple[tuple[str, ...], Any]:
    """One option's time as a numpy function: (argument names, function). The expression is the
    step model's own (perfmodel.step.group_time) for a tensor-parallel group of --ranks."""
    import sympy as sp

    from perfmodel import symbols as S
    from perfmodel.step import Family, group_time

    nbytes = sp.Symbol("nbytes", positive=True)
    fam = Family(scopes=(("tp", scope), ("dp", "intra"), ("pp", "intra")), algorithm=algorithm,
                 protocol=protocol, collective_library=library, link_features=features,
                 fits=frozenset((op, fs, fa) for fs, fa in (f.split(":") for f in fitted)))
    expr = group_time(op, nbytes, "tp", fam)
    names = {sym: name for sym, (name, _) in S.by_symbol().items()}
    names[nbytes] = "nbytes"
    args = sorted(expr.free_symbols, key=str)
    return tuple(names[a] for a in args), sp.lambdify(args, expr, modules="numpy")


def _options(op: str, scope: str, algorithm: str, protocol: str,
             hardware: HardwareSpec) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs to cost: every one the hardware's library and links have
    for the op and scope (auto), or the ones asked for."""
    from perfmodel.costs.collectives import LIBRARY_ALGORITHMS, Op, Protocol

    algs = [a.value for a in LIBRARY_ALGORITHMS[hardware.collective_library][Op(op)]]
    two_level = op not in ("all_to_all", "send_recv") and (
        hardware.collective_library == "generic" or op == "all_reduce")
    if scope == "mixed" and two_level:
        algs.append("hierarchical")
    nvls = op == "all_reduce" and scope == "intra" and hardware.intra_node.has_nvls
    if nvls:
        algs.append("nvls")
    if algorithm != "auto":
        algs = [algorithm]
    links = {"intra": (hardware.intra_node,), "inter": (hardware.inter_node,),
             "mixed": (hardware.intra_node, hardware.inter_node)}[scope]
    names = list(dict.fromkeys([Protocol.SIMPLE.value,
                                *(p.name for link in links for p in link.protocols)]))
    protos = names if protocol == "auto" else [protocol]
    return [(a, p) for a in algs for p in protos if a != "nvls" or p == Protocol.SIMPLE.value]


def _on_level(hardware: HardwareSpec, nodes: int) -> tuple[HardwareSpec, str, str]:
    """A fabric of more than two levels (HardwareSpec.levels): the hardware whose network is the
    link that prices a group over `nodes` consecutive nodes, the level the group reaches and
    the name of the level whose bandwidth prices it. The group reaches the smallest level one
    of whose domains holds its GPUs (the top if none) and is priced on the levels from 1 up to
    it, the slowest one's bandwidth and the most latency, as the step model prices each axis's
    group (perfmodel.specs.hardware.crossed_link; perfmodel.encode.fabric_of, axis_levels)."""
    import dataclasses

    from perfmodel.encode import fabric_of
    from perfmodel.specs.hardware import crossed_link

    levels, node = hardware.levels, hardware.gpus_per_node
    sizes = [lv.gpus for lv in levels]
    reached = next((j for j, size in enumerate(sizes) if j >= 1
                    and (size is None or size >= nodes * node)), len(levels) - 1)
    slowest = levels[fabric_of(hardware).slowest[reached - 1]]
    priced = dataclasses.replace(hardware, levels=(),
                                 inter_node=crossed_link(levels[1:reached + 1], node))
    return priced, levels[reached].name, slowest.name


def predict_collective(op: str, nbytes: float, ranks: int, hardware: HardwareSpec,
                       ranks_per_node: int | None = None, algorithm: str = "auto",
                       protocol: str = "auto") -> dict[str, Any]:
    """Time [s], algorithm, protocol, algorithm bandwidth and bus bandwidth [B/s] (nccl-tests'
    definitions) of one collective: the device's time from the start of the call to its end (a
    framework's time to issue it is not in it)."""
    from perfmodel.costs.collectives import ALGORITHMS, LIBRARY_ALGORITHMS, Op, bus_factor
    from perfmodel.encode import fit_values, link_features, link_values
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.loading import plain
    from perfmodel.step.collective import ll128_over_nodes
    from perfmodel.strategy import _positive_int

    hardware = load_hardware(hardware)  # a preset's name or a file, as predict takes it
    ops = [o.value for o in Op]
    if str(op) not in ops:
        from perfmodel.specs.loading import suggest

        raise PlanError(f"op must be one of {', '.join(ops)}, got '{op}'{suggest(str(op), ops)}")
    op = str(op)
    nbytes = plain(nbytes)
    if isinstance(nbytes, str):  # "1GiB", "256MiB": as --bytes takes it
        nbytes = parse_bytes(nbytes)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) \
            or not math.isfinite(nbytes) or not 0 < nbytes <= MAX_BYTES:
        raise PlanError(f"nbytes must be a positive number of bytes, at most 2^60 (as --bytes), "
                        f"got {nbytes!r}")
    # whole numbers (np.int64, 16.0, "16" as Plan takes them); their range checked below
    ranks = _positive_int(plain(ranks), "ranks", minimum=-(2**62), maximum=2**62)
    if ranks_per_node is not None:
        ranks_per_node = _positive_int(plain(ranks_per_node), "ranks_per_node",
                                       minimum=-(2**62), maximum=2**62)
    if ranks < 1 or ranks > 10**8:
        raise PlanError(f"--ranks must be between 1 and 1e8, got {ranks}")
    given_algorithm = algorithm
    per_node = ranks_per_node if ranks_per_node is not None else min(ranks, hardware.gpus_per_node)
    if ranks_per_node is None and ranks % per_node:  # the default: whole nodes
        divisors = ", ".join(str(d) for d in range(1, per_node) if ranks % d == 0)
        raise PlanError(f"--ranks {ranks} is not whole nodes of {hardware.name}'s "
                        f"{hardware.gpus_per_node} GPUs (the default --ranks-per-node): give "
                        f"--ranks-per-node (one that divides {ranks}: {divisors}), "
                        f"or --ranks a multiple of {per_node}")
    if per_node < 1 or per_node > ranks or ranks % per_node:
        raise PlanError(f"--ranks-per-node must divide --ranks ({ranks}) and be >= 1, "
                        f"got {per_node}")
    if per_node > hardware.gpus_per_node:
        raise PlanError(f"--ranks-per-node ({per_node}) exceeds the hardware's gpus_per_node "
                        f"({hardware.gpus_per_node})")
    scope = "intra" if per_node >= ranks else ("inter" if per_node == 1 else "mixed")
    fabric_level, priced_on = "node", "node"
    if scope != "intra" and len(hardware.levels) > 2:
        hardware, fabric_level, priced_on = _on_level(hardware, ranks // per_node)
    elif scope != "intra":  # two levels: the network beyond the node
        fabric_level = priced_on = (hardware.levels[1].name if len(hardware.levels) == 2
                                    else "network")
    library = hardware.collective_library
    allowed = [a.value for a in LIBRARY_ALGORITHMS[library][Op(op)]]
    if scope == "mixed" and op not in ("all_to_all", "send_recv") and (
            library == "generic" or op == "all_reduce"):
        allowed.append("hierarchical")
    if op == "all_reduce" and scope == "intra" and hardware.intra_node.has_nvls:
        allowed.append("nvls")
    if algorithm == "auto" and hardware.collective_algorithm in allowed:
        # the spec's collective_algorithm, as predict's step model takes it where it applies
        # (perfmodel.step.collective._algorithms)
        algorithm = hardware.collective_algorithm
    if algorithm != "auto" and algorithm not in allowed:
        lib = "" if library == "generic" else f" in {library}"
        known = [a.value for a in ALGORITHMS[Op(op)]] + ["hierarchical", "nvls"]
        why = (" (NVLS: all_reduce inside an NVSwitch node whose intra_node has "
               "nvls_bandwidth_fraction)" if algorithm == "nvls" else "")
        if algorithm not in known:
            why = ""
        where = {"intra": "inside one node", "inter": "one rank per node",
                 "mixed": "over nodes, several ranks each"}[scope]
        raise PlanError(f"algorithm '{algorithm}' is not available for {op} {where}{lib}{why}; "
                        f"allowed: auto, {', '.join(allowed)}")
    links = {"intra": (hardware.intra_node,), "inter": (hardware.inter_node,),
             "mixed": (hardware.intra_node, hardware.inter_node)}[scope]
    protocols = list(dict.fromkeys(["simple", *(p.name for ln in links for p in ln.protocols)]))
    if protocol != "auto" and protocol not in protocols:
        raise PlanError(f"protocol '{protocol}' is not one of the links of '{hardware.name}' "
                        f"({scope} group); allowed: auto, {', '.join(protocols)}")
    fit_scope = "intra" if scope == "intra" else "inter"
    fits = [f for f in hardware.collectives if f.op == op and f.scope == fit_scope]
    asked = [f"--{name} {value}" for name, value in (("algorithm", given_algorithm),
                                                     ("protocol", protocol)) if value != "auto"]
    if fits and asked:
        raise PlanError(f"{', '.join(asked)}: '{hardware.name}' has a calibrated fit of {op} "
                        f"({fit_scope}, {fits[0].algorithm}), which gives the time whatever the "
                        "algorithm and protocol; leave them out")
    fitted = tuple(f"{f.scope}:{f.algorithm}" for f in fits[:1])
    values: dict[str, float] = {"nbytes": nbytes, "tp": ranks, "tp_per_node": per_node,
                                "gpus_per_node": hardware.gpus_per_node,
                                **link_values(hardware), **fit_values(hardware)}
    features = link_features(hardware)
    choices = [("auto", "auto")] if fits else _options(op, scope, algorithm, protocol, hardware)
    if scope == "mixed" and protocol == "auto" and not ll128_over_nodes(library, features):
        choices = [(a, p) for a, p in choices if p != "ll128"]  # NVLink nodes' only
    if not choices:
        raise PlanError(f"algorithm 'nvls' runs in the simple protocol only, got --protocol "
                        f"'{protocol}'")
    times: dict[tuple[str, str], float] = {}
    for alg, proto in choices:
        names, fn = _compiled(op, scope, alg, proto, fitted, library, features)
        times[alg, proto] = float(fn(*(values[name] for name in names)))
    (best, fastest_protocol), t = min(times.items(), key=lambda kv: kv[1])
    best_protocol: str | None = fastest_protocol
    by_algorithm: dict[str, float] = {}
    for (alg, _), value in times.items():
        by_algorithm[alg] = min(value, by_algorithm.get(alg, math.inf))
    if fits:
        best, best_protocol = f"calibrated ({fits[0].algorithm})", None
        by_algorithm = {best: t}
    factor = float(bus_factor(op, ranks))
    # one rank moves nothing (time 0): its bandwidths are undefined, not infinite (null in JSON)
    moves = ranks > 1
    result = {
        "op": op, "bytes": nbytes, "ranks": ranks, "ranks_per_node": per_node, "scope": scope,
        "algorithm": best, "protocol": best_protocol, "time_s": t,
        "algbw_bytes_per_s": nbytes / t if moves else None,
        "busbw_bytes_per_s": nbytes / t * factor if moves else None,
        "bus_factor": factor, "by_algorithm_s": by_algorithm,
        "by_option_s": {} if fits else {f"{a}/{p}": v for (a, p), v in times.items()},
        "hardware": hardware.name, "fabric_level": fabric_level, "priced_on": priced_on,
    }
    require_finite(result, "the collective's time",
                   f"{op} of {fmt_bytes(nbytes)} over {ranks} rank{'s' if ranks != 1 else ''} "
                   f"on {hardware.name}")
    return result


_SCOPE_WORDS = {"intra": "inside one node", "inter": "one rank a node",
                "mixed": "over nodes, several ranks each"}


def pinned_algorithm_notes(model: Any, hardware: HardwareSpec, plan: Any) -> list[str]:
    """Where the hardware's collective_algorithm (--collective-algorithm) does not run a
    collective of the plan, what runs it instead, one note per op and group: the step model
    takes a pinned algorithm where it applies and the library's choice elsewhere
    (perfmodel.step.collective._algorithms): nvls for an all_reduce inside an NVLS node only,
    hierarchical for a group over nodes with several ranks in each (every op with a two-level
    form in generic, all_reduce in nccl; the library's first algorithm, ring, elsewhere), ring,
    tree or recursive for the ops that have it. A group a calibrated fit prices takes the fit's
    time whatever the algorithm. Point-to-point sends have no algorithm to pin."""
    pinned = hardware.collective_algorithm
    if pinned == "auto":  # before the imports: a warm predict imports no sympy
        return []
    from perfmodel.costs.collectives import ALGORITHMS, LIBRARY_ALGORITHMS, Algorithm, Op
    from perfmodel.evaluate import values_of
    from perfmodel.predict import comm_ledger
    from perfmodel.step.collective import AXIS_DEGREE

    values = values_of(model, hardware, plan)
    library = hardware.collective_library
    notes: dict[tuple[str, str], str] = {}
    for record in comm_ledger(model, plan, hardware):
        op, axis = record["op"], record["axis"]
        if op == "send_recv" or (op, axis) in notes or axis not in AXIS_DEGREE:
            continue
        degree = AXIS_DEGREE[axis]
        n = float(degree.subs({x: values[x.name] for x in degree.free_symbols}))
        k = float(values.get(f"{axis}_per_node", n))
        if n <= 1:
            continue
        scope = "intra" if k >= n else ("inter" if k <= 1 else "mixed")
        fits = [f for f in hardware.collectives
                if f.op == op and f.scope == ("intra" if scope == "intra" else "inter")]
        choice = " or ".join(a.value for a in LIBRARY_ALGORITHMS[library][Op(op)])
        group = f"{op} of the {axis} group ({n:g} ranks, {_SCOPE_WORDS[scope]})"
        if fits:
            notes[op, axis] = (f"collective_algorithm {pinned}: the {group} takes the "
                               "calibrated fit's time, whatever the algorithm")
            continue
        if pinned == "nvls":
            runs = op == "all_reduce" and scope == "intra" and hardware.intra_node.has_nvls
        elif pinned == "hierarchical":
            # perfmodel.step.collective._has_hierarchical's rule (send_recv skipped above)
            runs = scope == "mixed" and op != "all_to_all" and (
                library == "generic" or op == "all_reduce")
            choice = LIBRARY_ALGORITHMS[library][Op(op)][0].value
        else:
            runs = Algorithm(pinned) in ALGORITHMS[Op(op)]
        if not runs:
            notes[op, axis] = (f"collective_algorithm {pinned} does not run the {group}: it "
                               f"takes the library's choice ({library}: {choice})")
    return list(notes.values())
