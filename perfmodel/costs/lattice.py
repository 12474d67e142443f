"""max and min of cost expressions, built without sympy's argument sort.

sympy's Max(..., evaluate=False) still sorts its arguments into a canonical order by counting
their nodes as trees; the step model's expressions are graphs of shared sub-expressions, whose
trees are exponentially larger, so that sort cost most of the build of a mixture-of-experts family
(and a fair share of a dense one's). These build the same unevaluated Max and Min with the
arguments in the order given (duplicates dropped); numbers still evaluate. The value is the same
whatever the order: numpy folds them with maximum / minimum (perfmodel.codegen).
"""

from __future__ import annotations

import sys
from functools import cmp_to_key
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


def either(flag: Any, one: Any, other: Any) -> Any:
    """flag x one + (1 - flag) x other for a 0/1 option: where the option is fixed (0 or 1) only
    its side is built (sympy's 0 x expr asks questions of every node of expr), else the sum with
    the option's indicator."""
    if flag == 1:
        return one
    if flag == 0:
        return other
    return flag * one + (1 - flag) * other


def lmax(*args: Any) -> sp.Expr:
    """Max(*args), unevaluated unless every argument is a number, in the order given."""
    return _lattice(sp.Max, args)


def lmin(*args: Any) -> sp.Expr:
    """Min(*args), unevaluated unless every argument is a number, in the order given."""
    return _lattice(sp.Min, args)


def applied(func: Any, *args: Any) -> Any:
    """func(*args) for a function of sympy's (sign, Abs, floor, ceiling), evaluated only where
    every argument is a number: its rules ask the argument's sign, size or integrality (sympy's
    assumptions, which walk the whole expression below it) and on the step model's expressions
    find nothing (a third of a mixture of experts' assumption queries). Unevaluated it prints the
    same numpy function of the same value."""
    values = [_sympified(a) for a in args]
    if all(v.is_number for v in values):
        return func(*values)
    return func(*values, evaluate=False)


def rebuilt(expr: Any, args: list[Any]) -> Any:
    """expr's function over new arguments: a Min or Max as lmin / lmax (unsorted), a product or a
    power as `product` and `power` build them (what sympy would), anything else as
    expr.func(*args)."""
    if isinstance(expr, sp.Max):
        return lmax(*args)
    if isinstance(expr, sp.Min):
        return lmin(*args)
    return evaluated(expr.func, args)


def evaluated(func: Any, args: Any) -> Any:
    """func(*args), a Mul through `product`, a Pow through `power` and an Add through `total`."""
    if func is sp.Mul:
        return product(*args)
    if func is sp.Pow:
        return power(*args)
    if func is sp.Add:
        return total(*args)
    return func(*args)


# --- sympy's canonical order of arguments, compared faster ------------------------------------
_BASIC_COMPARE = sp.Basic.compare
_CLASS_ORDER: dict[tuple[type, type], int] = {}  # sympy's order of two classes (by their names)


def _compare(a: Any, b: Any) -> int:
    """a.compare(b) (sympy's Basic.compare, by which Add and Mul sort their arguments): -1, 0 or 1
    by the classes' names, then the length and the items of their hashable contents; the same
    steps, with the order of each pair of classes kept (sympy looks both names up in a list at
    every comparison) and a class's own compare, if it has one, called as sympy calls it."""
    if a is b:
        return 0
    if type(a).compare is not _BASIC_COMPARE:
        return int(a.compare(b))
    if type(a) is not type(b):
        types = (type(a), type(b))
        c = _CLASS_ORDER.get(types)
        if c is None:
            from sympy.core.basic import _cmp_name

            c = _CLASS_ORDER[types] = _cmp_name(*types)
        if c:
            return c
    st, ot = a._hashable_content(), b._hashable_content()
    c = (len(st) > len(ot)) - (len(st) < len(ot))
    if c:
        return c
    for left, right in zip(st, ot, strict=True):  # of one length here
        if isinstance(left, sp.Basic):
            c = _compare(left, right)
        elif isinstance(left, frozenset):
            c = sp.Basic(*left).compare(sp.Basic(*right) if isinstance(right, frozenset)
                                        else right)
        else:
            c = (left > right) - (left < right)
        if c:
            return c
    return 0


_sort_key = cmp_to_key(_compare)


# --- products and powers as sympy evaluates them, without its assumption queries ---------------
# sympy's evaluation of a power of a sum asks whether a term of the sum is infinite (a sum of two
# terms: Add._eval_power), and a product re-evaluates each power in it: each question walks every
# node under the sum, most of the build of a family with the host-device smooth maximum (its
# (H^8 + D^8)^(k/8)). These build the very expression sympy would (same arguments, same order,
# so the same numbers to the bit) where the answer is known without asking: a sum with no
# infinity in it (no oo, -oo, zoo or nan among its atoms; the step model has none) is not
# infinite. Anything else is left to sympy.

_INFINITIES = (sp.S.Infinity, sp.S.NegativeInfinity, sp.S.ComplexInfinity, sp.S.NaN)
# id(node) -> (node, no infinity among its atoms); bounded: cleared when full. Keyed by identity,
# the node held so that its id is not reused: keyed by the node, a look-up of a node equal to a
# known one but not the same object compares the two trees node by node (sympy's __eq__), which
# made a 64-rank dry run's ledger spend 8 of its 11 s in __eq__
_FINITE: dict[int, tuple[Any, bool]] = {}
_FINITE_LIMIT = 500_000


def _known(node: Any) -> bool:
    hit = _FINITE.get(id(node))
    return hit is not None and hit[0] is node


def _no_infinity(expr: Any) -> bool:
    """No infinite atom under expr (each node once)."""
    if len(_FINITE) > _FINITE_LIMIT:
        _FINITE.clear()
    stack: list[tuple[Any, bool]] = [(expr, False)]
    while stack:  # iterative post-order (the graphs are deep), each node once
        node, ready = stack.pop()
        if _known(node):
            continue
        if node.is_Atom:
            _FINITE[id(node)] = (node, node not in _INFINITIES and not (
                node.is_Symbol and node.is_infinite))
        elif ready:  # its arguments are done
            _FINITE[id(node)] = (node, all(_FINITE[id(a)][1] for a in node.args))
        else:
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if not _known(a))
    return _FINITE[id(expr)][1]


def _sympified(x: Any) -> Any:
    """x as a sympy object (sympify's answer, without its checks for one already)."""
    return x if isinstance(x, sp.Basic) else sp.sympify(x)


def _plain_sum(base: Any) -> bool:
    """A symbolic sum whose powers sympy leaves as they are (Add._eval_power returns None)."""
    return (isinstance(base, sp.Add) and not base.is_number
            and (len(base.args) != 2 or _no_infinity(base)))


def power(base: Any, exponent: Any) -> Any:
    """base**exponent as sympy evaluates it; a power of a symbolic sum without its questions, an
    integer power of a symbolic product as the product of its factors' powers (Mul._eval_power)."""
    base, exponent = sp.sympify(base), sp.sympify(exponent)
    if exponent.is_Rational and exponent not in (0, 1) and _plain_sum(base):
        return sp.Pow(base, exponent, evaluate=False)
    if (exponent.is_Integer and exponent not in (0, 1) and base.is_Mul and base.is_commutative
            and not base.is_number):  # Mul._eval_power: the product of its factors' powers
        return product(*(power(b, exponent) for b in base.args))
    return base**exponent


def _plain_factor(f: Any) -> bool:
    """A factor a product keeps as it is: not a number, a product or an unusual node; a power
    that evaluates to itself again (Mul.flatten rebuilds each power: one of a symbol or of a
    symbolic sum, or any other that sympy gives back unchanged), none of a number (gathered into
    the coefficient)."""
    if f.is_Number or f.is_Mul or not f.is_commutative or f.is_Order or f is sp.S.ImaginaryUnit \
            or _unusual(f):
        return False
    if not f.is_Pow:
        return True
    if f.base.is_Number:
        return False
    if f.exp.is_Rational and (f.base.is_Symbol or _plain_sum(f.base)):
        return True
    return bool(sp.Pow(f.base, f.exp) == f)


def times(a: Any, b: Any) -> Any:
    """a * b, as Python's operator has sympy evaluate it; 0 where either is 0 and the other has
    no infinite atom in it (_no_infinity), without sympy's question whether the other is
    infinite (a walk of every node under it: a family's fixed indicator, 0, times a whole
    stage's terms). For scalar expressions none of whose nodes is infinite by assumption alone
    (the step model's); not for a matrix or an Order, which sympy multiplies otherwise."""
    a, b = _sympified(a), _sympified(b)
    if (a is sp.S.Zero and _no_infinity(b)) or (b is sp.S.Zero and _no_infinity(a)):
        return sp.S.Zero
    return a * b


def product(*factors: Any) -> Any:
    """Mul(*factors) as sympy evaluates it (Mul.flatten: the factors of products appended after
    the other arguments, the numbers multiplied into the coefficient in that order, the powers of
    one base gathered into one power, sorted canonically); built directly where every number is
    finite and not zero and the bases shared by several factors are symbols or sums without an
    infinity, raised to rational powers (their exponents added, as Mul.flatten's _gather does),
    or 0 where a factor is 0 and none has an infinite atom in it (sympy asks each whether it is
    infinite: a walk of the whole expression; see times for the expressions this is for), else
    left to sympy."""
    args = [a for a in map(_sympified, factors) if a is not sp.S.One]
    if any(a is sp.S.Zero for a in args) and all(map(_no_infinity, args)):
        return sp.S.Zero  # Mul.flatten's zero coefficient: no factor is infinite, not asked
    if len(args) <= 1:
        return args[0] if args else sp.S.One
    if len(args) == 2 and any(a.is_Rational for a in args):  # Mul.flatten's two-argument rules
        return sp.Mul(*args)
    seq = list(args)
    coeff = sp.S.One
    by_base: dict[Any, list[Any]] = {}  # base -> its factors, in Mul.flatten's order
    for x in seq:  # grows: a product's factors are appended, as Mul.flatten does
        if x.is_Mul:
            if not x.is_commutative:
                return sp.Mul(*args)
            seq.extend(x.args)
        elif x.is_Number:
            if x.is_zero or not x.is_finite:
                return sp.Mul(*args)
            coeff *= x
        else:
            by_base.setdefault(x.as_base_exp()[0], []).append(x)
    c_part = []
    for base, group in by_base.items():
        if len(group) == 1:
            if not _plain_factor(group[0]):
                return sp.Mul(*args)
            c_part.append(group[0])
            continue
        exponents = [x.as_base_exp()[1] for x in group]
        if not (all(e.is_Rational for e in exponents) and all(map(_plain_factor, group))
                and (base.is_Symbol or (_plain_sum(base) and _no_infinity(base)))):
            return sp.Mul(*args)
        exponent = sp.Add(*exponents)
        if exponent is sp.S.One:
            c_part.append(base)
        elif exponent is not sp.S.Zero:
            c_part.append(power(base, exponent))
    if coeff.is_zero or not coeff.is_finite:
        return sp.Mul(*args)
    c_part.sort(key=_sort_key)
    if coeff is not sp.S.One:
        c_part.insert(0, coeff)
    if len(c_part) <= 1:
        return c_part[0] if c_part else sp.S.One
    if len(c_part) == 2 and c_part[0].is_Number and c_part[1].is_Add:  # sympy distributes
        return sp.Mul(*args)
    obj = sp.Mul._from_args(c_part, True)
    return sp.Mul._exec_constructor_postprocessors(obj)


_UNUSUAL: dict[type, bool] = {}  # class -> whether its nodes are unusual (see _unusual)


def _unusual(x: Any) -> bool:
    """A node sum and product evaluation treat apart (complex infinity, an interval, a matrix
    or tensor expression); decided once per class."""
    unusual = _UNUSUAL.get(type(x))
    if unusual is None:
        from sympy.calculus.accumulationbounds import AccumBounds
        from sympy.matrices.expressions import MatrixExpr

        classes = [AccumBounds, MatrixExpr, type(sp.S.ComplexInfinity)]
        # sympy.tensor.tensor imports sympy.combinatorics (a twentieth of a second): until some
        # code has imported it, no class derives from its TensExpr
        tensor = sys.modules.get("sympy.tensor.tensor")
        if tensor is not None:
            classes.append(tensor.TensExpr)
        unusual = _UNUSUAL[type(x)] = issubclass(type(x), tuple(classes))
    return unusual


def _kept_term(term: Any) -> bool:
    """A term Add.flatten puts back as it is: not a number, a sum or an unusual node; a product
    it splits into coefficient and rest and rebuilds (the same arguments, or the coefficient
    times one factor, which Mul evaluates: the product itself where that factor is one a
    product keeps, see _plain_factor, or a sum)."""
    if term.is_Number or term.is_Add or not term.is_commutative or term.is_Order \
            or _unusual(term):
        return False
    if term.is_Pow:
        return not term.base.is_Number  # a number's power may evaluate to a number
    if not term.is_Mul:
        return True
    coeff = term.args[0]
    if not coeff.is_Number or coeff is sp.S.One:
        return True  # the term itself
    if coeff.is_zero or not coeff.is_finite:
        return False
    return len(term.args) > 2 or term.args[1].is_Add or _plain_factor(term.args[1])


def total(*terms: Any) -> Any:
    """Add(*terms) as sympy evaluates it (Add.flatten: the terms of sums appended after the
    other arguments, the numbers added into the constant in that order, terms with the same
    non-numeric part gathered, sorted canonically, the constant first); built directly where
    every number is finite, no two terms share their non-numeric part and each term is one
    Add.flatten puts back as it is (_kept_term), else left to sympy."""
    args = [a for a in map(_sympified, terms) if a is not sp.S.Zero]
    if len(args) <= 1:
        return args[0] if args else sp.S.Zero
    if len(args) == 2 and any(a.is_Rational for a in args):  # Add.flatten's two-argument rule
        return sp.Add(*args)
    seq = list(args)
    constant = sp.S.Zero
    parts: set[Any] = set()  # each term's non-numeric part
    kept = []
    for x in seq:  # grows: a sum's terms are appended, as Add.flatten does
        if x.is_Add:
            seq.extend(x.args)
        elif x.is_Number:
            if not x.is_finite:
                return sp.Add(*args)
            constant += x
        else:
            part = x.as_coeff_Mul()[1] if x.is_Mul else x
            if part in parts or not _kept_term(x):
                return sp.Add(*args)
            parts.add(part)
            kept.append(x)
    if not constant.is_finite:
        return sp.Add(*args)
    kept.sort(key=_sort_key)
    if constant is not sp.S.Zero:
        kept.insert(0, constant)
    if len(kept) <= 1:
        return kept[0] if kept else sp.S.Zero
    obj = sp.Add._from_args(kept, True)
    return sp.Add._exec_constructor_postprocessors(obj)


def quotient(numerator: Any, denominator: Any) -> Any:
    """numerator / denominator as sympy evaluates it (Expr.__truediv__: Mul(numerator,
    Pow(denominator, -1)), or the power alone over 1), through `power` and `product`; a number
    over a number is left to sympy (Rational and Float division)."""
    numerator, denominator = sp.sympify(numerator), sp.sympify(denominator)
    if denominator.is_Number:
        return numerator / denominator
    inverse = power(denominator, sp.S.NegativeOne)
    return inverse if numerator is sp.S.One else product(numerator, inverse)
