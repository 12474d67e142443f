"""perfmodel.codegen: the numpy code printed from a graph of sympy expressions computes what sympy
computes, shares each repeated node once, and keeps the sentinel sums exact."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from perfmodel import codegen

x, y, z = sp.symbols("x y z", positive=True)
# an indicator (0 or 1), named to sort after x, y, z: sympy orders the sum t + 1e30 - 1e30 I
# as 1e30, x y, z, -1e30 I, which summed in that order loses t
I = sp.Symbol("z_mixed", positive=True)  # noqa: E741


def _function(exprs, symbols=(x, y, z, I)):
    params = [(s, codegen.identifier(s.name, set())) for s in symbols]
    source = codegen.numpy_function("f", params, exprs)
    namespace: dict = {}
    exec(compile(f"import numpy as {codegen.NUMPY}\n{source}", "<test>", "exec"), namespace)
    return namespace["f"], source


EXPRESSIONS = [
    x + 2 * y - z / 3,
    x**2 / (y * z) + sp.sqrt(x) - 1 / sp.sqrt(y) + x ** sp.Rational(3, 2),
    sp.Min(x, y, z + 1, evaluate=False) * sp.Max(x - y, 0, evaluate=False),
    sp.log(x * y) + sp.ceiling(z / x) + sp.floor(y),
    sp.Piecewise((x, x < y), (y, True)),
    -x * y ** (-2) + sp.Rational(1, 7) * z,
    sp.Integer(0),
    x,
]


@pytest.mark.parametrize("values", [(1.0, 2.0, 3.0, 1.0), (7.5, 0.25, 11.0, 0.0),
                                    (1e9, 3e-6, 4096.0, 1.0)])
def test_the_printed_code_computes_what_sympy_computes(values):
    fn, _ = _function(EXPRESSIONS)
    got = fn(*values)
    subs = {s: sp.Float(v, 30) for s, v in zip((x, y, z, I), values, strict=True)}
    for expr, value in zip(EXPRESSIONS, got, strict=True):
        assert float(value) == pytest.approx(float(expr.xreplace(subs).evalf(30)), rel=1e-12)


def test_arrays_of_plans_evaluate_elementwise():
    fn, _ = _function(EXPRESSIONS[:6])
    xs, ys, zs = np.array([1.0, 7.5]), np.array([2.0, 0.25]), np.array([3.0, 11.0])
    together = fn(xs, ys, zs, np.array([1.0, 0.0]))
    for i in range(2):
        alone = fn(xs[i], ys[i], zs[i], [1.0, 0.0][i])
        np.testing.assert_allclose([np.asarray(t)[i] for t in together],
                                   [float(a) for a in alone], rtol=1e-15)


def test_a_node_used_twice_is_computed_once():
    shared = sp.log(x + y)
    _, source = _function([shared * z, shared / z, sp.Max(shared, z, evaluate=False)])
    assert source.count("_np.log(") == 1


def test_a_divisor_shared_by_products_is_computed_once_and_divided_by():
    """x / m and 3 y / m share the power m^-1, which a product prints as a division by m: m is
    computed once, then each product divides by it (the operations of dividing by m written out,
    so the same numbers to the bit), never multiplies by a reciprocal."""
    divisor = sp.Max(y + z, x, evaluate=False)
    fn, source = _function([x / divisor, 3 * y / divisor])
    assert source.count("_np.maximum(") == 1
    assert "**(-" not in source
    xs, ys, zs = np.array([1.0, 7.5, 1e9, 3.3]), np.array([2.0, 0.25, 3e-6, 0.1]), \
        np.array([3.0, 11.0, 4096.0, 0.7])
    got = fn(xs, ys, zs, np.ones(4))
    expected = [xs / np.maximum(ys + zs, xs), 3 * ys / np.maximum(ys + zs, xs)]
    for value, written_out in zip(got, expected, strict=True):
        assert np.asarray(value).tobytes() == written_out.tobytes()


def test_a_sentinel_sum_keeps_the_small_terms():
    """step.py removes an option from a Min by adding 1e30 (1 - I): summed in the printer's
    order, (t - 1e30 I) + 1e30 would be 0 for I = 1; the sentinel terms are summed first."""
    t = x * y + z
    option = t + sp.Float(1e30) * (1 - I)
    fn, _ = _function([option, sp.Min(option, 2 * t, evaluate=False)])
    assert float(fn(2.0, 3.0, 5.0, 1.0)[0]) == 11.0
    assert float(fn(2.0, 3.0, 5.0, 1.0)[1]) == 11.0
    assert float(fn(2.0, 3.0, 5.0, 0.0)[1]) == 22.0


def test_powers_are_products_and_share_one_root():
    """Integer powers print as squarings and products (numpy's pow costs about 15 products an
    element), and the powers b**(p/8) of one base share one b**(1/8): the smooth maximum's
    exposed share (perfmodel.step.compose) takes seven of them. The values are pow's to a few
    units in the last place, arrays and scalars alike, a zero and an infinity included."""
    s = x + y
    exprs = [s**8, s**3, x**7 * y**-5, z / s**2,
             *(s ** sp.Rational(p, 8) for p in (1, 3, 5, 7)), s ** sp.Rational(-3, 8),
             x ** sp.Rational(3, 4)]
    fn, source = _function(exprs)
    assert "**8" not in source and "**3" not in source and "**7" not in source
    assert source.count("**(1/8)") == 1  # the root of s, computed once
    assert "**(3/4)" in source  # a base with one fractional power keeps its one pow
    for values in [(1.0, 2.0, 3.0, 1.0), (7.5, 0.25, 11.0, 0.0), (1e9, 3e-6, 4096.0, 1.0)]:
        subs = {v: sp.Float(a, 30) for v, a in zip((x, y, z, I), values, strict=True)}
        for expr, value in zip(exprs, fn(*values), strict=True):
            assert float(value) == pytest.approx(float(expr.xreplace(subs).evalf(30)), rel=1e-14)
    with np.errstate(all="ignore"):
        arrays = fn(np.array([0.0, np.inf, 2.0]), np.array([0.0, 1.0, 0.5]), np.ones(3),
                    np.ones(3))
        s_values = np.array([0.0, np.inf, 2.5])
        np.testing.assert_allclose(arrays[0], s_values**8, rtol=1e-14)
        np.testing.assert_allclose(arrays[6], s_values**(5 / 8), rtol=1e-14)
        np.testing.assert_allclose(arrays[8], s_values**(-3 / 8), rtol=1e-14)


def test_a_node_without_a_numpy_form_falls_back_to_lambdify():
    with pytest.raises(codegen.Unsupported):
        codegen.numpy_function("f", [(x, "x")], [sp.gamma(x)])
    source = codegen.function_source("f", [(x, "x")], [sp.gamma(x) + 1])
    assert "def f(x)" in source
    namespace: dict = {}
    exec(compile(source, "<fallback>", "exec"), namespace)  # runs as a module of its own
    assert namespace["f"](3.0) == [3.0]  # gamma(3) + 1
    # a Max of several arguments: sympy prints it with functools.reduce
    y, z = sp.symbols("y z")
    several = codegen.function_source("g", [(x, "x"), (y, "y"), (z, "z")],
                                      [sp.Max(x, y, z) + sp.gamma(x)])
    exec(compile(several, "<fallback>", "exec"), namespace)
    assert namespace["g"](2.0, 5.0, 3.0) == [6.0]


def test_xreplace_shared_rebuilds_what_xreplace_rebuilds_from_a_shared_graph():
    """A graph whose nodes are shared by many parents: the same result as sympy's xreplace,
    symbol and sub-expression keys alike, and a rule that matches nothing returns the input."""
    shared = sp.Max(x * y, z + 1, evaluate=False)
    layer = shared
    for k in range(6):  # each level uses the one below twice: 2^6 paths, a node or two a level
        layer = sp.Min(layer + k, layer * 2 + y, evaluate=False)
    for rule in ({x: sp.Float(2.5), y: sp.Integer(3), z: sp.Float(0.5)},
                 {shared: z, y: x},
                 {x * y: sp.Integer(7)}):
        assert codegen.xreplace_shared(layer, rule) == layer.xreplace(rule)
    numbers = codegen.xreplace_shared(layer, {x: 2.5, y: 3, z: 0.5})
    assert numbers.is_Number
    assert float(numbers) == pytest.approx(float(layer.subs({x: 2.5, y: 3, z: 0.5})))
    assert codegen.xreplace_shared(layer, {sp.Symbol("unused"): 1}) is layer


def _nested(levels):
    expr = x
    for i in range(levels):
        expr = sp.log(expr + y) * (i + 2)
    return expr


def test_equal_subtrees_that_are_distinct_objects_are_found_by_structure(monkeypatch):
    """A graph built in parts holds equal nodes that are distinct objects (sympy's cache evicts);
    looking one up in a table keyed by nodes makes sympy compare the two trees node by node, so
    printing took time quadratic in the depth (447 s for mixtral's timeline). Keyed by structure,
    the copies share one computation and no tree is compared: the printer at 5d0ca58 made 16,826
    __eq__ calls on this graph."""
    levels = 60
    first = _nested(levels)
    sp.core.cache.clear_cache()
    second = _nested(levels)
    assert first == second and first is not second
    calls = []
    compare = sp.Basic.__eq__

    def counted(self, other):
        calls.append(1)
        return compare(self, other)

    monkeypatch.setattr(sp.Basic, "__eq__", counted)
    fn, source = _function([first, second / 2], symbols=(x, y))
    monkeypatch.undo()
    assert source.count("_np.log(") == levels
    assert len(calls) < levels
    a, b = fn(1.5, 2.0)
    assert b == pytest.approx(a / 2, rel=1e-15)


def test_shared_replacement_keeps_a_max_or_min_as_it_stands():
    # sympy's Max.__new__ compares its arguments to drop those another bounds: on a step model's
    # terms that took minutes (explain of Mixtral 8x7B on 8 H100s with ZeRO 3 and the
    # parameter gather overlapped never ended before 2026-12-06); explain asks for the replaced
    # node as it stands, its value the same
    import sympy as sp

    from perfmodel.codegen import xreplace_shared

    x, y, z = sp.symbols("x y z", positive=True)
    expr = sp.Max(y, x + 1, evaluate=False) + sp.Min(y, x + 2, evaluate=False) * z
    out = xreplace_shared(expr, {y: x}, lattice_as_is=True)
    assert xreplace_shared(expr, {y: x}) == expr.xreplace({y: x})  # by default, xreplace's
    big, small = sorted((a for a in sp.preorder_traversal(out) if isinstance(a, (sp.Max, sp.Min))),
                        key=lambda a: isinstance(a, sp.Min))
    assert isinstance(big, sp.Max) and set(big.args) == {x, x + 1}  # not evaluated to x + 1
    assert isinstance(small, sp.Min) and set(small.args) == {x, x + 2}  # not x
    for v in (0.5, 2.0):
        assert float(out.subs({x: v, z: 3.0})) == float(expr.subs({y: v, x: v, z: 3.0}))


def test_xreplace_shared_names_the_sums_and_products_a_larger_one_holds():
    """partial_sums (what explain asks for): a sum in the rule names the part of a larger sum
    that holds all of its terms, a product the part of a larger product; the value the same
    once the names are replaced back; a sum held only in part stays as it is."""
    import random

    import sympy as sp

    from perfmodel.codegen import xreplace_shared

    a, b, c, d, k = sp.symbols("a b c d k", positive=True)
    window, share = a + sp.Max(b, c), (a + d) / (b + c)  # a sum; a product (a + d) (b + c)^-1
    W, X = sp.symbols("W X")
    rule = {window: W, share: X}
    expr = k * (window + d) + sp.Min(window + c, 3 * k) + 2 * k * share + sp.Max(0, -(a + d))
    out = xreplace_shared(expr, rule, lattice_as_is=True, partial_sums=True)
    assert out.free_symbols >= {W, X}
    assert xreplace_shared(a + d, rule, partial_sums=True) == a + d  # (b's Max is not there)
    assert xreplace_shared(expr, rule) == expr.xreplace(rule)  # by default, xreplace's
    rng = random.Random(7)
    for _ in range(20):
        at = {s_: rng.uniform(0.1, 5.0) for s_ in (a, b, c, d, k)}
        named = {W: float(window.subs(at)), X: float(share.subs(at)), **at}
        assert float(out.subs(named)) == pytest.approx(float(expr.subs(at)), rel=1e-12)
