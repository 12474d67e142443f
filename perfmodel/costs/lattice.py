"""max and min of cost expressions, built without sympy's argument sort.

sympy's Max(..., evaluate=False) still sorts its arguments into a canonical order by counting
their nodes as trees; the step model's expressions are graphs of shared sub-expressions, whose
trees are exponentially larger, so that sort cost most of the build of a mixture-of-experts family
(and a fair share of a dense one's). These build the same unevaluated Max and Min with the
arguments in the order given (duplicates dropped); numbers still evaluate. The value is the same
whatever the order: numpy folds them with maximum / minimum (perfmodel.codegen).
"""

from __future__ import annotations

from typing import Any

import sympy as sp


def _lattice(cls: Any, args: tuple[Any, ...]) -> sp.Expr:
    values = tuple(dict.fromkeys(sp.sympify(a) for a in args))
    if all(v.is_number for v in values):
        return cls(*values)
    if len(values) == 1:
        return values[0]
    obj = sp.Expr.__new__(cls, *values)
    obj._argset = frozenset(values)
    return obj


def lmax(*args: Any) -> sp.Expr:
    """Max(*args), unevaluated unless every argument is a number, in the order given."""
    return _lattice(sp.Max, args)


def lmin(*args: Any) -> sp.Expr:
    """Min(*args), unevaluated unless every argument is a number, in the order given."""
    return _lattice(sp.Min, args)


def rebuilt(expr: Any, args: list[Any]) -> Any:
    """expr's function over new arguments: a Min or Max as lmin / lmax (unsorted), anything else
    as expr.func(*args)."""
    if isinstance(expr, sp.Max):
        return lmax(*args)
    if isinstance(expr, sp.Min):
        return lmin(*args)
    return expr.func(*args)
