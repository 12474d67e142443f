"""perfmodel.costs.lattice's product, total and power build the expression sympy's own evaluation
builds (same arguments in the same order: the generated code, and so every number, unchanged), and
leave to sympy the cases they do not handle."""

from __future__ import annotations

import pytest
import sympy as sp

from perfmodel.costs import gemm_efficiency as GE
from perfmodel.costs.lattice import (
    _FINITE,
    _compare,
    _no_infinity,
    power,
    product,
    quotient,
    times,
    total,
)
from perfmodel.step import compose as CO

a, b, c, d = sp.symbols("a b c d", positive=True)
H = 2.0 * a + b * c  # a sum of two terms: the case sympy asks about
D = 3.0 * c + a * b + d

PRODUCTS = [
    (H, D), (sp.Max(a, b) ** -1, H**7), (1.5, H ** sp.Rational(3, 8), D**4), (a, a), (2, H),
    (a * b, c * H), (sp.Rational(1, 2), a, b), (-1, H, D**2), (H**2, H), (0, H), (2.0, 3.0, a),
    (sp.Integer(1), H), (H,), (), (sp.sqrt(a * b), a), (sp.oo, a), (H + sp.oo, a**2),
    # bases shared by several factors: their exponents added (to 0: the factor drops out)
    (a * H, b / H), (a**2, a**-2, b), (H ** sp.Rational(1, 2), H ** sp.Rational(1, 2), c),
    (H**2, 3 * c / H, D), (a * b, a / b, c * a), (sp.Max(a, b), 1 / sp.Max(a, b), c),
    (H + sp.oo, 1 / (H + sp.oo), a), (sp.sqrt(a * b), sp.sqrt(a * b), c),
    # several numbers: multiplied in Mul.flatten's order (a product's factors come last), which
    # fixes the rounding of floats
    (sp.Float("0.1"), a, sp.Float("0.7") * b, sp.Float("0.3")), (2, 3 * a, 5 * b * c),
    (sp.Float("1e-300"), sp.Float("1e-300") * a, b), (0.5, 2 * a, 2.0 * b), (2.0, 0.5 * a, H),
    (sp.Rational(1, 3), 3 * a, H, D), (-1, -H, a), (sp.zoo, a, b), (sp.nan, a, b), (0.0, a, b),
    # a zero factor: 0 where nothing is infinite, else sympy's answer (nan)
    (H**7, 0, D), (0, sp.Max(a, b) ** -1), (0, H + sp.oo), (sp.zoo, 0), (0, 0, a),
]


@pytest.mark.parametrize("factors", PRODUCTS, ids=str)
def test_product_is_sympys_product(factors):
    assert sp.srepr(product(*factors)) == sp.srepr(sp.Mul(*factors))


@pytest.mark.parametrize("pair", [(0, H), (H, 0), (0, H**7 * D), (sp.Integer(0), a), (0, 0),
                                  (2, H), (H, D), (0, H + sp.oo), (sp.zoo, 0), (0.0, H)],
                         ids=str)
def test_times_is_pythons_product(pair):
    x, y = pair
    assert sp.srepr(times(x, y)) == sp.srepr(sp.sympify(x) * sp.sympify(y))


TOTALS = [
    (a, b), (1, H), (sp.Rational(1, 2), a * b), (1.5, a, 2.5),
    (sp.Float("0.1"), a, sp.Float("0.2")), (H, D, c), (2 * a * b, 3 / H, c, D**2), (a, 2 * a, b),
    (a * b, -a * b, c), (sp.oo, a, b),
    (sp.nan, a, b), (sp.zoo, a, b), (sp.Mul(2, H, evaluate=False), c, d),
    (sp.Mul(2.0, sp.Max(a, b), evaluate=False), c, d), (sp.Mul(2, 1 / H), c, d),
    (sp.Pow(2, 3, evaluate=False), a, b), (1e30 * a, b, -1e30 * c), (H, -H, a), (0, a),
    (sp.Add(a, 1, evaluate=False), 2, b), (a + 1, 2.5, b), (sp.Mul(a, b, evaluate=False), c, d),
    (a,), (),
]


@pytest.mark.parametrize("terms", TOTALS, ids=str)
def test_total_is_sympys_sum(terms):
    assert sp.srepr(total(*terms)) == sp.srepr(sp.Add(*terms))


@pytest.mark.parametrize("base", [H, D, a, a * b, sp.Max(a, b), H + D, H + sp.oo, sp.Integer(4),
                                  2 * a * H, -3 * b * D**2 * H ** sp.Rational(1, 8),
                                  a * H * (H + sp.oo),
                                  sp.Rational(1, 2) * a / H, 2.5 * a * sp.sqrt(b)], ids=str)
@pytest.mark.parametrize("exponent", [2, 7, sp.Rational(1, 8), sp.Rational(3, 8), -1, 0, 1])
def test_power_is_sympys_power(base, exponent):
    assert sp.srepr(power(base, exponent)) == sp.srepr(base**exponent)


def test_host_share_is_the_expression_sympy_builds():
    """The smooth maximum's share, built through product and power, against the formula written
    with sympy's operators (x = H^7 / sum_k S^k D^(7-k), S = (H^8 + D^8)^(1/8))."""
    s = (H**8 + D**8) ** sp.Rational(1, 8)
    expected = H**7 / CO.lmax(sp.Add(*(s**k * D ** (7 - k) for k in range(8))), CO._NO_TIME_S8)
    assert sp.srepr(CO.host_share(H, D)) == sp.srepr(expected)
    assert sp.srepr(CO.smooth_max(H, D)) == sp.srepr(s)


@pytest.mark.parametrize("numerator", [1, 3, a, 2.0 * a * H, H, sp.Rational(1, 3)], ids=str)
@pytest.mark.parametrize("denominator", [H, a * H, 2 * b * D, a + 1, a, sp.Integer(3), 2.5,
                                         H + sp.oo], ids=str)
def test_quotient_is_sympys_division(numerator, denominator):
    assert sp.srepr(quotient(numerator, denominator)) == sp.srepr(
        sp.sympify(numerator) / sp.sympify(denominator))


def test_gemm_time_is_the_expression_sympy_builds():
    """gemm_time_s built through quotient and product against the formula written with sympy's
    operators (every half size set: each d / (d + h) factor, the harmonic mean, the division of the
    FLOPs by peak times efficiency)."""
    m, n, k, bt, bpe, peak, bw, mf, hd, mh, nh, kh, bh, ph = sp.symbols(
        "m n k bt bpe peak bw mf hd mh nh kh bh ph", positive=True)
    x = 3 / (1 / m + 1 / n + 1 / k)
    eff = mf * (x / (x + hd)) * (m / (m + mh)) * (n / (n + nh)) * (k / (k + kh)) * (bt / (bt + bh))
    eff *= bt * m * n / (bt * m * n + ph)
    flops = 2 * bt * m * n * k
    compute = flops / (peak * eff)
    memory = bt * (bpe * (m * k + k * n) + bpe * m * n) / bw
    got = GE.gemm_time_s(m, n, k, bt, bpe, peak, bw, mf, hd, m_half_dim=mh, n_half_dim=nh,
                         k_half_dim=kh, batch_half=bh, parallel_half=ph)
    assert got.args[0] == compute and got.args[1] == memory
    assert sp.srepr(got.args[0]) == sp.srepr(compute)


def test_no_infinity_walks_a_shared_graph_once():
    """A chain of sums, each using the one below twice: 2^24 paths, 24 nodes (a walk that
    follows every path takes minutes)."""
    _FINITE.clear()
    node = a + b
    for _ in range(24):
        node = sp.Add(node, sp.Mul(node, c, evaluate=False), evaluate=False)
    assert _no_infinity(node)
    assert not _no_infinity(sp.Add(node, sp.oo, evaluate=False))


def test_compare_is_sympys_canonical_order():
    """_compare (the order product and total sort by) against Basic.compare on every pair of a
    mix of symbols (with and without assumptions), numbers, sums, products, powers, functions
    and a set (a class with its own compare)."""
    x = sp.Symbol("x")
    nodes = [a, b, x, sp.Dummy("a"), sp.Integer(2), sp.Rational(1, 3), sp.Float("2.5"), H, D,
             a * b, 2 * a * b, a**2, H**-1, H ** sp.Rational(1, 8), sp.Max(a, b), sp.Min(a, H),
             sp.sign(H), sp.Abs(D), sp.floor(a / b), sp.log(a), sp.FiniteSet(1, 2),
             sp.Interval(0, 1), sp.UnevaluatedExpr(H), sp.Piecewise((a, b > 1), (c, True))]
    for left in nodes:
        for right in nodes:
            assert _compare(left, right) == left.compare(right), (left, right)


def _larger_than(expr, limit):
    """expr has more than `limit` distinct nodes (a walk that stops there)."""
    seen, stack = set(), [expr]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            if len(seen) > limit:
                return True
            stack.extend(node.args)
    return False


def test_building_a_step_model_multiplies_no_large_term_by_sympys_zero(monkeypatch):
    """A family's 0 (a layer kind a stage lacks, a recompute or ZeRO-3 switch that is off) times a
    term goes through lattice.times: sympy's product of 0 and a term asks every node under the
    term whether it is infinite, a walk of all of it (at a35f9ae this build made 15 such products
    of terms of over 200 nodes; the walks were a third of the sympy time of building the
    Megatron-Bridge rows' families). The generated code is the same either way (times gives
    sympy's answer, 0)."""
    from sympy.core.mul import Mul

    from perfmodel import load_hardware, load_model
    from perfmodel.evaluate import family_of
    from perfmodel.step import build
    from perfmodel.strategy import Plan
    from perfmodel.timeline import _outputs

    flatten = Mul.flatten.__func__
    large = []

    def watched(cls, seq):
        if any(x is sp.S.Zero for x in seq):
            large.extend(x for x in seq if x is not sp.S.Zero and _larger_than(x, 200))
        return flatten(cls, seq)

    model, hw = load_model("deepseek-v3"), load_hardware("dgx-h100")
    plan = Plan(gpus=64, dp=8, tp=2, pp=4, ep=8, sequence_parallel=True, global_batch=64,
                recompute="full")
    family = family_of(model, hw, plan, specialise=True)
    monkeypatch.setattr(Mul, "flatten", classmethod(watched))
    built = build(family)
    outputs = _outputs(built)
    monkeypatch.undo()
    assert outputs and built.step_time.free_symbols
    assert not large, f"{len(large)} products of 0 and a term of over 200 nodes"
