"""Numpy source code from sympy expressions, in one pass over their graph.

What sympy.lambdify(args, exprs, modules="numpy", cse=True) makes, at a fraction of its cost:
lambdify's common-subexpression search rebuilds every node (and a Min or Max rebuilt compares its
arguments symbolically, which costs most of a second per family); here a sympy expression is
already a graph of shared nodes, so each node that is used more than once becomes one assignment,
the others are written inline, and nothing is rebuilt. A node the printer does not know raises
Unsupported (the caller then lambdifies).

The sums that hold a sentinel (step.py's 1e30 that removes an option from a Min) are evaluated
huge terms first (keep_huge_together), so that 1e30 - 1e30 I is exactly 0 or 1e30 before the rest
is added: summed in another order, t + 1e30 - 1e30 would lose t.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping, Sequence
from typing import Any

import sympy as sp

from perfmodel.costs.lattice import rebuilt

HUGE = 1e20  # a coefficient this large is a sentinel (step.py's 1e30 that removes a Min option)
_HUGE = sp.Float(HUGE)  # what sympy compares a coefficient with (abs(c) >= HUGE makes it anew)
MAX_INLINE = 400  # characters of an inline sub-expression before it gets its own assignment
NUMPY = "_np"  # the name the generated module binds numpy to


class Unsupported(Exception):
    """An expression node the printer has no numpy form for."""


# keep_huge_together's answers in this process (see huge_memo), by the node's identity: id ->
# (the node, its answer); the node held keeps its id from being reused
_HUGE_MEMO: dict[int, tuple[Any, Any]] = {}
_HUGE_MEMO_LIMIT = 500_000


def huge_memo() -> dict[int, tuple[Any, Any]]:
    """The memo keep_huge_together shares between calls: each node's answer depends on the node
    alone, and the staged search and the full family print the same built model's nodes (so the
    second walk finds most of them done); cleared when it holds too many.

    Keyed by identity, not by sympy's equality: a node equal to one from an earlier family but
    not the same object would be compared with it node by node on every look-up (sympy's __eq__
    walks both trees), which made the 18 Megatron-Bridge runs' families take 224 s to compile
    one after another in one process, where each alone takes 2-3 s."""
    if len(_HUGE_MEMO) > _HUGE_MEMO_LIMIT:
        _HUGE_MEMO.clear()
    return _HUGE_MEMO


def keep_huge_together(expr: Any, memo: dict[int, tuple[Any, Any]]) -> Any:
    """Wrap the sentinel terms of every sum, 1e30 - 1e30 I, in one unevaluated unit.

    Summed apart (by level, perfmodel.staged, or in the printer's order), 1e30 + t - 1e30 I would
    lose t (1e30 + t rounds to 1e30); as a unit they add to 0 or 1e30 exactly, then t, as in the
    model."""
    if expr.is_Atom:
        return expr
    hit = memo.get(id(expr))
    if hit is not None and hit[0] is expr:
        return hit[1]
    done = None
    args = [keep_huge_together(arg, memo) for arg in expr.args]
    if isinstance(expr, sp.Add):
        flags = [_is_huge(arg) for arg in args]
        if any(flags) and not all(flags):
            rest = [arg for arg, flag in zip(args, flags, strict=True) if not flag]
            huge = [arg for arg, flag in zip(args, flags, strict=True) if flag]
            done = sp.Add(*rest, sp.UnevaluatedExpr(sp.Add(*huge)))
    if done is None:
        if args == list(expr.args):
            done = expr
        else:
            done = rebuilt(expr, args)
    memo[id(expr)] = (expr, done)
    return done


def _is_huge(term: Any) -> bool:
    """Whether a term of a sum is a sentinel: its coefficient at least HUGE in magnitude."""
    coeff = term.as_coeff_Mul()[0]
    return coeff is not sp.S.One and bool(abs(coeff) >= _HUGE)


_FUNCTIONS = {sp.log: "log", sp.exp: "exp", sp.ceiling: "ceil", sp.floor: "floor",
              sp.sign: "sign", sp.Abs: "abs", sp.sqrt: "sqrt"}
_FOLDS = {sp.Min: "minimum", sp.Max: "maximum"}
_RELATIONS = {sp.StrictLessThan: "<", sp.LessThan: "<=", sp.StrictGreaterThan: ">",
              sp.GreaterThan: ">=", sp.Equality: "==", sp.Unequality: "!="}


class _Printer:
    """Prints a graph of sympy nodes as numpy statements: shared nodes become assignments."""

    def __init__(self, keys: _Keys, names: Mapping[Any, str], uses: Mapping[int, int],
                 rooted: frozenset[tuple[int, int]] = frozenset()) -> None:
        self.keys = keys
        # node's key -> the variable holding it (arguments first)
        self.names = {keys.of(node): name for node, name in names.items()}
        self.uses = uses  # by node key
        self.lines: list[str] = []
        # (base's key, q) whose powers b**(p/q) take more than one p: b**(1/q) computed once into
        # a variable (self.roots), each power then multiplied from it (_pow)
        self.rooted = rooted
        self.roots: dict[tuple[int, int], str] = {}

    def value(self, node: Any) -> str:
        """The node as an operand: a name, a number or a parenthesised expression."""
        text, atomic = self.text(node)
        return text if atomic else f"({text})"

    def text(self, node: Any) -> tuple[str, bool]:
        """(the node's code, whether it needs no parentheses as an operand)."""
        key = self.keys.of(node)
        name = self.names.get(key)
        if name is not None:
            return name, True
        if node.is_Number or node.is_NumberSymbol:
            return _number(node)
        if node.is_Symbol:
            raise Unsupported(f"symbol {node} is not an argument")
        code, atomic = self._compose(node)
        if self.uses.get(key, 0) > 1 or len(code) > MAX_INLINE:
            name = f"x{len(self.lines)}"
            self.lines.append(f"    {name} = {code}")
            self.names[key] = name
            return name, True
        return code, atomic

    def _compose(self, node: Any) -> tuple[str, bool]:
        """The node's code from its arguments', and whether it is a call (needs no
        parentheses)."""
        call = not isinstance(node, (sp.Add, sp.Mul, sp.Pow, sp.UnevaluatedExpr)) \
            and type(node) not in _RELATIONS
        code = self._code(node)
        return code, call or isinstance(node, sp.Pow) and code.startswith(f"{NUMPY}.sqrt(")

    def _code(self, node: Any) -> str:
        if isinstance(node, sp.Add):
            out = self.value(node.args[0])
            for arg in node.args[1:]:
                out += f" + {self.value(arg)}"
            return out
        if isinstance(node, sp.Mul):
            return self._mul(node)
        if isinstance(node, sp.Pow):
            return self._pow(node)
        if isinstance(node, sp.UnevaluatedExpr):
            return self.text(node.args[0])[0]
        fold = _FOLDS.get(node.func)
        if fold is not None:
            out = self.value(node.args[0])
            for arg in node.args[1:]:
                out = f"{NUMPY}.{fold}({out}, {self.value(arg)})"
            return out
        function = _FUNCTIONS.get(node.func)
        if function is not None and len(node.args) == 1:
            return f"{NUMPY}.{function}({self.value(node.args[0])})"
        relation = _RELATIONS.get(type(node))
        if relation is not None:
            return f"{self.value(node.lhs)} {relation} {self.value(node.rhs)}"
        form = getattr(node, "numpy_form", None)  # a function of ours with its numpy text
        if form is not None:
            return str(form(NUMPY, *(self.value(arg) for arg in node.args)))
        if isinstance(node, sp.Piecewise):
            conditions = ", ".join(self._condition(c) for _, c in node.args)
            choices = ", ".join(self.value(e) for e, _ in node.args)
            return f"{NUMPY}.select([{conditions}], [{choices}], default={NUMPY}.nan)"
        raise Unsupported(f"no numpy form for {type(node).__name__}")

    def _condition(self, condition: Any) -> str:
        if condition is sp.true:
            return "True"
        if condition is sp.false:
            return "False"
        if isinstance(condition, (sp.And, sp.Or)):
            fold = "logical_and" if isinstance(condition, sp.And) else "logical_or"
            out = self._condition(condition.args[0])
            for arg in condition.args[1:]:
                out = f"{NUMPY}.{fold}({out}, {self._condition(arg)})"
            return out
        if isinstance(condition, sp.Not):
            return f"{NUMPY}.logical_not({self._condition(condition.args[0])})"
        return self.value(condition)

    def _mul(self, node: Any) -> str:
        """coefficient * numerator / denominator, as sympy's printers write a product."""
        coeff, factors = _coeff_mul(node)
        numerator, denominator = [], []
        for factor in factors:
            if isinstance(factor, sp.Pow):
                base, exp = _base_exp(factor)
                if exp.is_Number and exp.is_negative:
                    denominator.append((base, -exp))
                    continue
            numerator.append(factor)
        parts = [self.value(f) for f in numerator]
        sign = ""
        if coeff == -1:
            sign = "-"
        elif coeff != 1:
            parts.insert(0, self.value(coeff))
        top = "*".join(parts) if parts else "1"
        if denominator:
            bottom = "*".join(self._power_value(base, exp) for base, exp in denominator)
            bottom = f"({bottom})" if len(denominator) > 1 else bottom
            top = f"{top}/{bottom}"
        return f"{sign}{top}"

    def _power_value(self, base: Any, exp: Any) -> str:
        """value(base**exp) without building the power: a product's divisor b**e. Built, it would
        go through sympy's cache, whose look-up compares b with the cached powers' bases node by
        node wherever an equal one is a distinct object."""
        if exp == 1:
            return self.value(base)
        key = self.keys.structure(sp.Pow, base, exp)
        name = self.names.get(key)
        if name is not None:
            return name
        code = self._pow_code(base, exp)
        if self.uses.get(key, 0) > 1 or len(code) > MAX_INLINE:
            name = f"x{len(self.lines)}"
            self.lines.append(f"    {name} = {code}")
            self.names[key] = name
            return name
        return code if code.startswith(f"{NUMPY}.sqrt(") else f"({code})"

    def _pow(self, node: Any) -> str:
        return self._pow_code(*node.args)

    def _pow_code(self, base: Any, exp: Any) -> str:
        if exp == sp.Rational(1, 2):
            return f"{NUMPY}.sqrt({self.value(base)})"
        if exp == sp.Rational(-1, 2):
            return f"1/{NUMPY}.sqrt({self.value(base)})"
        if exp.is_Integer:
            power = int(exp)
            if power in (0, 1, 2) or abs(power) > MAX_CHAIN:
                return f"{self.value(base)}**{power}" if power >= 0 else \
                    f"{self.value(base)}**({float(power)!r})"
            chain = _chain(self._named(base), abs(power))
            return chain if power > 0 else f"1/{_operand(chain)}"
        rooted = (self.keys.of(base), int(exp.q)) if exp.is_Rational else None
        if rooted in self.rooted and abs(exp.p) <= MAX_CHAIN:
            root = self.roots.get(rooted)
            if root is None:
                value = self.value(base)
                root = f"x{len(self.lines)}"
                self.lines.append(f"    {root} = " + (f"{NUMPY}.sqrt({value})" if exp.q == 2
                                                      else f"{value}**(1/{exp.q})"))
                self.roots[rooted] = root
            chain = _chain(root, abs(exp.p))
            return chain if exp.p > 0 else f"1/{_operand(chain)}"
        return f"{self.value(base)}**{self.value(exp)}"

    def _named(self, node: Any) -> str:
        """The node as a variable or a number: an operand a chain of products may repeat."""
        text, atomic = self.text(node)
        if atomic and (text.isidentifier() or _is_literal(text)):
            return text
        name = f"x{len(self.lines)}"
        self.lines.append(f"    {name} = {text}")
        self.names[self.keys.of(node)] = name
        return name


# numpy's power ufunc calls the C library's pow for every element (about 15 times a product's
# time) except for the exponents it special-cases (2, 0.5, -1, ...): an integer power up to this
# is printed as products of its base (_chain)
MAX_CHAIN = 16


def _coeff_mul(node: Any) -> tuple[Any, tuple[Any, ...]]:
    """node.as_coeff_mul() of a product, read off its arguments: sympy's method is cached, and its
    cache's look-up compares the product with an equal cached one node by node."""
    args = node.args
    first = args[0]
    if first.is_Number:
        if first.is_Rational:
            return first, args[1:]
        if first.is_extended_negative:
            return sp.S.NegativeOne, (-first, *args[1:])
    return sp.S.One, args


def _base_exp(power: Any) -> tuple[Any, Any]:
    """power.as_base_exp(): a base 1/q reads as q with the exponent negated."""
    base, exp = power.args
    if base.is_Rational and base.p == 1 and base.q != 1:
        return sp.Integer(base.q), -exp
    return base, exp


def _chain(name: str, power: int) -> str:
    """name**power (power >= 1) as squarings and products: x**8 is ((x**2)**2)**2 (numpy squares
    without pow). Its value differs from pow's by a few units in the last place."""
    if power == 1:
        return name
    if power % 2:
        return f"{_operand(_chain(name, power - 1))}*{name}"
    return f"{_operand(_chain(name, power // 2))}**2"


def _operand(code: str) -> str:
    return code if code.isidentifier() or _is_literal(code) else f"({code})"


def _is_literal(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return not text.startswith("-")


def _number(node: Any) -> tuple[str, bool]:
    if node.is_Integer:
        value = int(node)
        return str(value), value >= 0
    if node.is_Rational:
        return f"{int(node.p)}/{int(node.q)}", False
    if node is sp.oo:
        return f"{NUMPY}.inf", True
    if node is sp.S.NegativeInfinity:
        return f"-{NUMPY}.inf", False
    if node is sp.nan:
        return f"{NUMPY}.nan", True
    if node is sp.zoo:
        raise Unsupported("complex infinity")
    number = float(node)
    return repr(number), number >= 0


def free_symbols(exprs: Sequence[Any]) -> set[Any]:
    """The symbols of expressions, each shared node visited once (sympy's free_symbols walks a
    shared sub-expression again from every parent: quadratic on the step model's graph)."""
    seen: set[Any] = set()
    out: set[Any] = set()
    stack = list(exprs)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.is_Symbol:
            out.add(node)
        elif not node.is_Atom:
            stack.extend(node.args)
    return out


def xreplace_shared(expr: Any, rule: Mapping[Any, Any], *, lattice_as_is: bool = False,
                    partial_sums: bool = False) -> Any:
    """expr.xreplace(rule), each shared node rebuilt once (sympy's xreplace walks a shared
    sub-expression again from every parent: the step model's graph is visited millions of times
    where it has thousands of nodes). Nodes are remembered by identity (an equal but distinct
    node's __eq__ walks it); iterative, so no depth limit applies. lattice_as_is: a max or min
    of expressions is rebuilt as it stands, its arguments not compared again (sympy's
    Max.__new__ looks for arguments one bounds another: on a step model's terms that took
    minutes, and explain of a mixture of experts under FSDP never ended before 2026-12-06); the
    same value, not always xreplace's form. partial_sums: a sum or product in `rule` also names
    the part of a larger sum or product that holds all of its terms or factors (a + b -> s in
    a + b + c: s + c; sympy's subs does this, walking every node again), the larger rules
    first; the rest rebuilt from `rule` as well."""
    memo: dict[int, Any] = {}
    sums = {kind: sorted(((frozenset(k.args), v) for k, v in rule.items() if type(k) is kind),
                         key=lambda kv: -len(kv[0]))
            for kind in (sp.Add, sp.Mul)} if partial_sums else {}
    held: list[Any] = []  # the nodes whose ids memo holds stay alive
    stack: list[tuple[Any, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if key in memo:
            continue
        if node in rule:
            memo[key] = rule[node]
        elif node.is_Atom or not node.args:
            memo[key] = node
        elif not expanded:
            stack.append((node, True))
            stack.extend((arg, False) for arg in node.args if id(arg) not in memo)
            continue
        else:
            args = [memo[id(arg)] for arg in node.args]
            if type(node) in sums:
                args = _named_parts(node.args, args, sums[type(node)])
            same = len(args) == len(node.args) and all(
                new is old for new, old in zip(args, node.args, strict=True))
            as_is = lattice_as_is and isinstance(node, (sp.Max, sp.Min)) and not all(
                getattr(a, "is_number", True) for a in args)  # of numbers: its number
            memo[key] = node if same else node.func(*args, evaluate=False) if as_is \
                else node.func(*args)
        held.append(node)
    return memo[id(expr)]


def _named_parts(terms: tuple[Any, ...], rebuilt: list[Any],
                 sums: list[tuple[frozenset[Any], Any]]) -> list[Any]:
    """A sum's terms or a product's factors (rebuilt: each one's replacement) with the sums or
    products of `sums` it holds whole replaced by their names (xreplace_shared's
    partial_sums)."""
    left = dict(zip(terms, rebuilt, strict=True))
    named = []
    for parts, name in sums:
        if len(parts) < len(left) and parts <= left.keys():
            named.append(name)
            for t in parts:
                del left[t]
    return [*named, *left.values()] if named else rebuilt


def reads(exprs: Sequence[Any], symbols: set[Any]) -> list[bool]:
    """Whether each expression depends on any of `symbols`, each node of their shared graph
    decided once (free_symbols per expression would walk what they share again for each)."""
    memo: dict[Any, bool] = {}

    def visit(root: Any) -> bool:
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in memo:
                continue
            if node.is_Symbol or node.is_Atom:
                memo[node] = node in symbols
            elif expanded:
                memo[node] = any(memo[arg] for arg in node.args)
            else:
                stack.append((node, True))
                stack.extend((arg, False) for arg in node.args if arg not in memo)
        return memo[root]

    return [visit(e) for e in exprs]


class _Keys:
    """Each node's key: one integer per structure, so that equal nodes share it whether or not
    they are the same object.

    The printer's tables are keyed by these, not by the nodes: a look-up of a node that is equal
    to a key but a distinct object makes sympy's __eq__ walk both trees, and a graph built in
    parts (the timeline's per-stage outputs) holds many such copies. Keyed by nodes, one family's
    timeline took 447 s to print (182M __eq__ calls); the structure here is each node's type
    (with an atom's own value) and its arguments' keys, found once per object."""

    def __init__(self) -> None:
        self.by_id: dict[int, int] = {}
        self.table: dict[tuple[Any, ...], int] = {}
        self.held: list[Any] = []  # the nodes whose ids by_id holds stay alive

    def of(self, root: Any) -> int:
        key = self.by_id.get(id(root))
        if key is not None:
            return key
        by_id = self.by_id
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in by_id:
                continue
            if node.is_Atom or not node.args:
                # type first: sympy's Float(2) and Integer(2) are unequal but hash alike
                structure: tuple[Any, ...] = (type(node), node)
            elif not expanded:
                stack.append((node, True))
                stack.extend((arg, False) for arg in node.args if id(arg) not in by_id)
                continue
            else:
                structure = (type(node), *(by_id[id(arg)] for arg in node.args))
            by_id[id(node)] = self.table.setdefault(structure, len(self.table))
            self.held.append(node)
        return by_id[id(root)]

    def structure(self, kind: type, *args: Any) -> int:
        """The key a node kind(*args) would have, without building it."""
        return self.table.setdefault((kind, *(self.of(arg) for arg in args)), len(self.table))


def _count_uses(exprs: Sequence[Any], keys: _Keys) -> tuple[dict[int, int], dict[int, Any]]:
    """How many parents (and outputs) use each node of the graph of exprs, by key; and a node of
    each key.

    A product prints its factors b**-e as a division by b**e (_Printer._mul), so such a power is
    never printed itself: its base counts each use of the power, and a divisor that several
    products share is computed once (into a variable) rather than in each of them."""
    uses: dict[int, int] = {}
    nodes: dict[int, Any] = {}
    stack = list(exprs)
    while stack:
        node = stack.pop()
        key = keys.of(node)
        seen = key in uses
        uses[key] = uses.get(key, 0) + 1
        if not seen:
            nodes[key] = node
            if not node.is_Atom:
                stack.extend(node.args)
    for key, count in list(uses.items()):
        node = nodes[key]
        if count > 1 and node.is_Pow and node.exp.is_Number and node.exp.is_negative:
            uses[keys.of(node.base)] += count - 1
    return uses, nodes


def _rooted(nodes: Mapping[int, Any], keys: _Keys) -> frozenset[tuple[int, int]]:
    """The (base's key, q) of the graph's powers base**(p/q) (p/q not an integer) that take two or
    more exponents p: one root base**(1/q) serves them all (_Printer._pow). A product's b**(-p/q)
    prints as a division by b**(p/q) (_Printer._mul), so an exponent counts by its size."""
    exponents: dict[tuple[int, int], set[int]] = {}
    for node in nodes.values():
        if node.is_Pow and node.exp.is_Rational and not node.exp.is_Integer:
            exponents.setdefault((keys.of(node.base), int(node.exp.q)),
                                 set()).add(abs(int(node.exp.p)))
    return frozenset(key for key, ps in exponents.items() if len(ps) > 1)


def identifier(name: str, taken: set[str]) -> str:
    """A Python parameter name for a symbol's table name (the name itself when it is one)."""
    ok = name.isidentifier() and not keyword.iskeyword(name) and name != NUMPY \
        and not (name.startswith("x") and name[1:].isdigit())
    out = name if ok else f"_a{len(taken)}"
    taken.add(out)
    return out


def numpy_function(name: str, params: Sequence[tuple[Any, str]], exprs: Sequence[Any]) -> str:
    """The source of `def name(params...)` returning the list of exprs' values, as numpy code.

    params: (symbol, parameter name) of every symbol the expressions hold. Raises Unsupported for
    a node with no numpy form here."""
    memo = huge_memo()
    exprs = [keep_huge_together(sp.sympify(e), memo) for e in exprs]
    keys = _Keys()
    uses, nodes = _count_uses(exprs, keys)
    printer = _Printer(keys, {sym: pname for sym, pname in params}, uses, _rooted(nodes, keys))
    outs = [printer.text(e)[0] for e in exprs]
    head = f"def {name}({', '.join(pname for _, pname in params)}):"
    return "\n".join([head, *printer.lines, f"    return [{', '.join(outs)}]", ""])


def function_source(name: str, params: Sequence[tuple[Any, str]], exprs: Sequence[Any]) -> str:
    """numpy_function's source, or sympy.lambdify's (renamed `name`) when an expression holds a
    node the printer has no numpy form for."""
    try:
        return numpy_function(name, params, exprs)
    except Unsupported:
        pass
    import inspect

    from sympy.printing.numpy import NumPyPrinter

    memo = huge_memo()
    exprs = [keep_huge_together(sp.sympify(e), memo) for e in exprs]
    renamed = {sym: sp.Symbol(pname) for sym, pname in params}
    fn = sp.lambdify(list(renamed.values()), [e.xreplace(renamed) for e in exprs],
                     printer=NumPyPrinter({"fully_qualified_modules": True}), cse=True,
                     docstring_limit=0)
    body = inspect.getsource(fn).replace("def _lambdifygenerated(", f"def {name}(", 1)
    # what sympy's printers may name: functools.reduce or reduce (a Max or Min of several
    # arguments), math (a function numpy lacks, as gamma)
    return f"import functools\nimport math\nimport numpy\nfrom functools import reduce\n\n\n{body}"
