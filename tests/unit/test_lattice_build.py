"""perfmodel.costs.lattice's product and power build the expression sympy's own evaluation builds
(same arguments in the same order: the generated code, and so every number, unchanged), and leave
to sympy the cases they do not handle."""

from __future__ import annotations

import pytest
import sympy as sp

from perfmodel.costs.lattice import power, product
from perfmodel.step import compose as CO

a, b, c, d = sp.symbols("a b c d", positive=True)
H = 2.0 * a + b * c  # a sum of two terms: the case sympy asks about
D = 3.0 * c + a * b + d

PRODUCTS = [
    (H, D), (sp.Max(a, b) ** -1, H**7), (1.5, H ** sp.Rational(3, 8), D**4), (a, a), (2, H),
    (a * b, c * H), (sp.Rational(1, 2), a, b), (-1, H, D**2), (H**2, H), (0, H), (2.0, 3.0, a),
    (sp.Integer(1), H), (H,), (), (sp.sqrt(a * b), a), (sp.oo, a), (H + sp.oo, a**2),
]


@pytest.mark.parametrize("factors", PRODUCTS, ids=str)
def test_product_is_sympys_product(factors):
    assert sp.srepr(product(*factors)) == sp.srepr(sp.Mul(*factors))


@pytest.mark.parametrize("base", [H, D, a, a * b, sp.Max(a, b), H + D, H + sp.oo, sp.Integer(4)],
                         ids=str)
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
