"""Evaluate a family's expressions over many plans, each sub-expression once per distinct value of
the plan columns it depends on.

A search's plans vary in a few groups of columns: the topology (degrees, tensor layout, placement),
the micro-batch, the schedule, the recompute mode, sequence parallelism and the ZeRO stage. Most of
the step model depends on a few of them: a collective's time on the topology alone, a GEMM's on the
topology and the micro-batch. `compile_staged` splits the expressions by the set of groups each
sub-expression depends on (its *level*) and lambdifies one numpy function per level; `run` evaluates
a level once per combination of its groups' values (numpy broadcasting over one axis per group) and
only the level of every group (the plan itself) once per plan, gathering what it needs from the
others. Every plan is still evaluated in full: the shared terms are exactly the ones its own
expression contains.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from perfmodel.evaluate import (
    _built,
    _source,
    build_ahead,
    cached,
    family_key,
    family_module,
    outputs_of,
    value_of,
)

CHUNK_ROWS = 8192  # rows per numpy pass: temporaries stay in cache
SHARED = 0.5  # a level with at most this many combinations per plan is evaluated per combination


@dataclasses.dataclass(frozen=True)
class Level:
    """One numpy function: the sub-expressions that depend on exactly `groups`."""

    groups: tuple[str, ...]
    inputs: tuple[str, ...]  # symbol names, group columns' symbols, or lower levels' terms
    outputs: tuple[str, ...]  # names of the terms it computes
    fn: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Staged:
    """A family's expressions split into levels (lowest first) and the term of each output."""

    groups: tuple[str, ...]  # the axis order
    levels: tuple[Level, ...]
    outputs: tuple[tuple[str, str], ...]  # output name -> term name


@dataclasses.dataclass(frozen=True)
class GroupValues:
    """The distinct rows of a group of plan columns, the symbols they set, and each plan's row."""

    codes: np.ndarray  # (plans,) integers in [0, card)
    card: int
    args: dict[str, np.ndarray]  # symbol name -> (card,) values
    rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # column -> (card,)

    def restrict(self, index: np.ndarray | None, lo: int, hi: int) -> GroupValues:
        """The plans of `index` (None: all), whose rows all lie in lo..hi-1."""
        codes = self.codes if index is None else np.take(self.codes, index)
        return GroupValues(codes - lo if lo else codes, hi - lo,
                           {k: v[lo:hi] for k, v in self.args.items()},
                           {k: v[lo:hi] for k, v in self.rows.items()})

    def take(self, index: np.ndarray) -> GroupValues:
        return self.restrict(index, 0, self.card)


def _hoist(outputs: Mapping[str, Any], group_of: Mapping[Any, str],
           order: Sequence[str]) -> tuple[dict[frozenset[str], dict[Any, Any]], dict[str, Any]]:
    """Split expressions by level: every sub-expression whose groups are fewer than its parent's
    becomes a term of its own level. The terms of a sum (or product) that lack a group are summed
    apart, at the level of the groups they have, so that a plan gathers one number for them."""
    import sympy as sp
    from sympy.functions.elementary.piecewise import ExprCondPair

    from perfmodel.codegen import huge_memo, keep_huge_together

    levels: dict[frozenset[str], dict[Any, Any]] = defaultdict(dict)  # level -> body -> term
    # the memos below are keyed by the node's id (sympy's hash and equality walk the node: most
    # of the split's time), each entry holding the node so that no id is reused while they live
    level_of: dict[int, tuple[Any, frozenset[str]]] = {}
    defined: set[Any] = set()  # every level's terms

    def deps(expr: Any) -> frozenset[str]:
        """The groups of the symbols in expr (from its arguments', each node once)."""
        known = level_of.get(id(expr))
        if known is not None:
            return known[1]
        if expr.is_Atom:
            found = frozenset((group_of[expr],)) if expr in group_of else frozenset()
        else:
            found = frozenset().union(*(deps(arg) for arg in expr.args))
        level_of[id(expr)] = (expr, found)
        return found

    def define(level: frozenset[str], body: Any) -> Any:
        terms = levels[level]
        term = terms.get(body)
        if term is None:
            term = sp.Symbol(f"t{len(defined)}_")
            terms[body] = term
            level_of[id(term)] = (term, level)
            defined.add(term)
        return term

    def lift(expr: Any) -> Any:
        if expr.is_Atom:
            return expr
        level = deps(expr)
        body = rebuild(expr, level)
        return body if body.is_Atom else define(level, body)

    rebuilt: dict[tuple[int, frozenset[str]], tuple[Any, Any]] = {}

    def rebuild(expr: Any, level: frozenset[str]) -> Any:
        """expr at `level`, its sub-expressions of fewer groups lifted (each node once)."""
        if expr.is_Atom:
            return expr
        done = rebuilt.get((id(expr), level))
        if done is None:
            done = rebuilt[id(expr), level] = (expr, _rebuild(expr, level))
        return done[1]

    def _rebuild(expr: Any, level: frozenset[str]) -> Any:
        found = [(arg, deps(arg)) for arg in expr.args]
        if isinstance(expr, (sp.Add, sp.Mul)):
            args = [rebuild(arg, level) for arg, d in found if d == level]
            lower = [(arg, d) for arg, d in found if d != level]
            while lower:  # the terms that lack a group, summed (or multiplied) where they lack it
                if frozenset().union(*(d for _, d in lower)) != level:
                    args.append(lift(_joined(expr.func, [arg for arg, _ in lower])))
                    break
                lacking = max((g for g in order if g in level),
                              key=lambda g: sum(g not in d for _, d in lower))
                args.append(lift(_joined(expr.func, [arg for arg, d in lower
                                                      if lacking not in d])))
                lower = [(arg, d) for arg, d in lower if lacking in d]
            return _joined(expr.func, args)
        keep = isinstance(expr, (ExprCondPair, sp.logic.boolalg.Boolean))
        args = [rebuild(arg, level) if keep or d == level
                or isinstance(arg, (ExprCondPair, sp.logic.boolalg.Boolean)) else lift(arg)
                for arg, d in found]
        return _rebuilt(expr, args)

    terms = {}
    memo = huge_memo()
    for name, expr in outputs.items():
        expr = keep_huge_together(sp.sympify(expr), memo)
        term = lift(expr)
        if term not in defined:  # a number or a symbol
            term = define(deps(expr), term)
        terms[name] = term
    return levels, terms


def _joined(func: Any, args: list[Any]) -> Any:
    """The sum (or product) of args as it stands, unevaluated.

    args are terms of one evaluated sum (product) or the terms lifted out of it: sympy would
    find nothing to gather among them (a canonical sum holds one number and no two terms alike),
    only sort them, and its sort costs most of the split (the orders of a sum's terms give
    numbers equal to rounding). The number goes first, where the printer looks for a product's
    coefficient (perfmodel.codegen)."""
    import sympy as sp

    identity = sp.S.Zero if func is sp.Add else sp.S.One
    args = [a for a in args if a is not identity]
    if len(args) <= 1:
        return args[0] if args else identity
    numbers = [a for a in args if a.is_Number]
    if len(numbers) > 1:  # not a canonical sum's terms: as sympy evaluates it
        return func(*args)
    if numbers and args[0] is not numbers[0]:
        args = numbers + [a for a in args if not a.is_Number]
    return func._from_args(args, True)


def _rebuilt(expr: Any, args: list[Any]) -> Any:
    """expr's node over new arguments (its own, some replaced by a term's symbol), unevaluated:
    evaluated, a function's rules ask of its argument's sign or size (sympy's assumptions, which
    walk the expression), and a symbol answers nothing more than the expression it stands for
    did when the model was built (a Max or Min keeps its order, perfmodel.costs.lattice)."""
    import sympy as sp

    from perfmodel.costs.lattice import lmax, lmin

    if list(expr.args) == args:
        return expr
    if isinstance(expr, sp.Max):
        return lmax(*args)
    if isinstance(expr, sp.Min):
        return lmin(*args)
    if isinstance(expr, (sp.Add, sp.Mul)):
        return _joined(expr.func, args)
    try:
        return expr.func(*args, evaluate=False)
    except TypeError:  # a node whose constructor takes no evaluate flag
        return expr.func(*args)


def _build(family: Any, which: str, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """The source of a staged family: META (groups, levels, outputs), then one function per
    level (perfmodel.codegen)."""
    from perfmodel import codegen
    from perfmodel import symbols as S

    table = S.table()
    name_of = {sym: name for name, (sym, _) in table.items()}
    order = [g for g, _ in groups]
    group_of = {table[arg][0]: g for g, args in groups for arg in args if arg in table}
    built = _built(family)
    if which == "lower_grid":  # a pruned search's first: its others built beside it
        # (build_ahead), and the prediction's for the 1D layout (the best plan's, nearly always:
        # another's is built here when its plan is predicted)
        build_ahead([(staged_module(family, other, groups),
                      lambda other=other: _build(family, other, groups))
                     for other in ("bounds", "lower", "memory", "search")]
                    + ([(family_module(family), lambda: _source(family, "all"))]
                       if family.tp_layout == "1d" else []))
    levels, terms = _hoist(outputs_of(built, which), group_of, order)
    meta: dict[str, Any] = {"groups": order, "levels": [], "outputs": []}
    bodies = []
    ranked = sorted(levels, key=lambda lv: (len(lv), sorted(order.index(g) for g in lv)))
    for i, level in enumerate(ranked):
        exprs = list(levels[level])
        outs = [str(levels[level][e]) for e in exprs]
        used = codegen.free_symbols(exprs)
        inputs = sorted(used, key=lambda s: (s not in name_of, name_of.get(s, ""), str(s)))
        names = [name_of.get(s, str(s)) for s in inputs]
        taken: set[str] = set()
        params = [(sym, codegen.identifier(name, taken)) for sym, name in zip(inputs, names,
                                                                               strict=True)]
        bodies.append(codegen.function_source(f"level{i}", params, exprs))
        meta["levels"].append({"groups": [g for g in order if g in level],
                               "inputs": names, "outputs": outs})
    meta["outputs"] = [[name, str(term)] for name, term in terms.items()]
    code = "\n\n".join(bodies)
    return (f"# perfmodel staged family\nimport numpy as {codegen.NUMPY}\n\nMETA = {meta!r}\n\n\n"
            f"{code}")


def _staged(namespace: Mapping[str, Any]) -> Staged:
    meta = namespace["META"]
    levels = tuple(Level(tuple(lv["groups"]), tuple(lv["inputs"]), tuple(lv["outputs"]),
                         namespace[f"level{i}"]) for i, lv in enumerate(meta["levels"]))
    return Staged(tuple(meta["groups"]), levels, tuple((n, t) for n, t in meta["outputs"]))


@lru_cache(maxsize=64)
def compile_staged(family: Any, which: str,
                   groups: tuple[tuple[str, tuple[str, ...]], ...]) -> Staged:
    """Split and lambdify a family once per process (and once per machine, through the disk cache).

    groups: (name, symbol names) in axis order; every other symbol is one number for all plans.
    """
    return _staged(cached(staged_module(family, which, groups),
                          lambda: _build(family, which, groups)))


def staged_module(family: Any, which: str, groups: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    """The disk cache's name for compile_staged(family, which, groups)."""
    key = hashlib.sha256(f"{family_key(family)}/{which}/{groups!r}".encode()).hexdigest()[:20]
    return f"staged-{key}"


def output_groups(staged: Staged, name: str) -> tuple[str, ...]:
    """The groups the output `name` depends on: its level's (none for a constant)."""
    term = dict(staged.outputs)[name]
    return next((level.groups for level in staged.levels if term in level.outputs), ())


def run(staged: Staged, scalars: Mapping[str, Any], groups: Mapping[str, GroupValues],
        n: int) -> dict[str, np.ndarray]:
    """Every output for each of the n plans.

    A level whose groups take few combinations (at most SHARED per plan) is evaluated once per
    combination, as an array with one axis per group; the others, and always the level of every
    group that varies, once per plan, in chunks of CHUNK_ROWS, gathering what they need.
    """
    card = {g: groups[g].card for g in staged.groups}
    varying = {g for g in staged.groups  # the groups that take more than one value in these plans
               if card[g] > 1 and n and (groups[g].codes != groups[g].codes[0]).any()}
    arg_group = {name: g for g, data in groups.items() for name in data.args}
    values: dict[str, Any] = dict(scalars)
    shared: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}  # term -> (groups, array)
    per_plan: list[Level] = []
    planned: set[str] = set()  # terms of the per-plan levels
    for level in staged.levels:
        if not level.groups:
            with np.errstate(all="ignore"):
                numbers = level.fn(*(value_of(values, k) for k in level.inputs))
            values.update(zip(level.outputs, numbers, strict=True))
            continue
        size = math.prod(card[g] for g in level.groups)
        if (varying <= set(level.groups) or planned.intersection(level.inputs)
                or size > SHARED * n):
            per_plan.append(level)
            planned.update(level.outputs)
        else:
            _run_shared(level, card, groups, arg_group, values, shared, size)
    out: dict[str, np.ndarray] = {}
    wanted = []
    for name, term in staged.outputs:
        if term in shared:
            level_groups, array = shared[term]
            out[name] = np.take(array, _flat_index(level_groups, card, groups, slice(None)))
        elif term in values:
            out[name] = np.full(n, float(values[term]))
        else:
            out[name] = np.empty(n)
            wanted.append((name, term))
    if not per_plan:
        return out
    # how each input of a per-plan level is found: ("local" | "shared" | "group", ...)
    sources: dict[str, tuple[Any, ...]] = {}
    for level in per_plan:
        for k in level.inputs:
            if k in planned:
                sources[k] = ("local", k)
            elif k in shared:
                sources[k] = ("shared", *shared[k])
            elif k in arg_group:
                sources[k] = ("group", groups[arg_group[k]].codes, groups[arg_group[k]].args[k])
            else:
                sources[k] = ("scalar", value_of(values, k))
    for start in range(0, n, CHUNK_ROWS):
        rows = slice(start, min(start + CHUNK_ROWS, n))
        local: dict[str, Any] = {}
        index_of: dict[tuple[str, ...], np.ndarray] = {}
        for level in per_plan:
            args = []
            for k in level.inputs:
                source = sources[k]
                kind = source[0]
                if kind == "local":
                    args.append(local[k])
                elif kind == "shared":
                    index = _flat_index(source[1], card, groups, rows, index_of)
                    args.append(np.take(source[2], index))
                elif kind == "group":
                    args.append(np.take(source[2], source[1][rows]))
                else:
                    args.append(source[1])
            with np.errstate(all="ignore"):
                local.update(zip(level.outputs, level.fn(*args), strict=True))
        for name, term in wanted:
            out[name][rows] = local[term]
    return out


def _run_shared(level: Level, card: Mapping[str, int], groups: Mapping[str, GroupValues],
                arg_group: Mapping[str, str], values: Mapping[str, Any],
                shared: dict[str, tuple[tuple[str, ...], np.ndarray]], size: int) -> None:
    """Evaluate a level over every combination of its groups' values: one axis per group, in the
    order of the groups; lower levels broadcast along the axes they lack."""
    axes = level.groups
    shape = tuple(card[g] for g in axes)

    def view(groups_of: Sequence[str], array: np.ndarray) -> np.ndarray:
        return array.reshape([card[g] if g in groups_of else 1 for g in axes])

    args = []
    for name in level.inputs:
        if name in shared:
            args.append(view(*shared[name]))
        elif name in arg_group:
            args.append(view((arg_group[name],), groups[arg_group[name]].args[name]))
        else:
            args.append(value_of(values, name))
    results = [np.empty(shape) for _ in level.outputs]
    step = max(1, CHUNK_ROWS * shape[0] // size)  # rows of the first axis per numpy pass
    for start in range(0, shape[0], step):
        part = slice(start, start + step)
        sliced = [a[part] if isinstance(a, np.ndarray) and a.ndim and a.shape[0] > 1 else a
                  for a in args]
        with np.errstate(all="ignore"):
            for target, value in zip(results, level.fn(*sliced), strict=True):
                target[part] = value
    for name, array in zip(level.outputs, results, strict=True):
        shared[name] = (axes, array.reshape(-1))


def _flat_index(level_groups: Sequence[str], card: Mapping[str, int],
                groups: Mapping[str, GroupValues], rows: slice,
                memo: dict[tuple[str, ...], np.ndarray] | None = None) -> np.ndarray:
    """Each plan's element of a shared level's array (C order over its groups); `memo` keeps the
    indices of the leading groups, which other levels share."""
    if len(level_groups) == 1:
        return groups[level_groups[0]].codes[rows]
    key = tuple(level_groups)
    if memo is not None and key in memo:
        return memo[key]
    head = _flat_index(level_groups[:-1], card, groups, rows, memo)
    last = level_groups[-1]
    index: np.ndarray = head * card[last] + groups[last].codes[rows]
    if memo is not None:
        memo[key] = index
    return index
