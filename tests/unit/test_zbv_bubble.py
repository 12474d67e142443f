"""ZB-V's bubble as its order runs (perfmodel.step.pipeline.zbv_terms): with equal stages the
closed form is the span perfmodel.schedule's simulator lays out, to rounding, where the paper's
(pp - 1)(F + B - 2W) fell up to a third short with few micro-batches (a derivation from the
simulator's critical paths, 2026-12-07)."""

from __future__ import annotations

import pytest
import sympy as sp

from perfmodel.schedule import BACKWARD, FORWARD, WEIGHT, orders, simulate
from perfmodel.step.pipeline import zbv_flush_bubble

# forward, input-gradient and weight-gradient times of a chunk: equal, a long backward, a long
# weight gradient, a long forward
PASSES = [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (0.5, 1.0, 1.5), (2.0, 0.5, 0.3), (1.0, 1.3, 0.7)]


def _span(pp: int, m: int, f: float, b: float, w: float) -> float:
    timed = simulate("zbv", orders("zbv", pp, m, 2), pp, 2, {FORWARD: f, BACKWARD: b, WEIGHT: w})
    return max(t.end_s for st in timed for t in st) - min(t.start_s for st in timed for t in st)


F, B, W = sp.symbols("F B W", nonnegative=True)


def _bubble(pp: int, m: int):
    """The closed form compiled as the step model's is (numpy), for one pp and m."""
    return sp.lambdify((F, B, W), zbv_flush_bubble(sp.Integer(pp), sp.Integer(m), F, B, W),
                       "numpy")


@pytest.mark.parametrize("pp", [2, 3, 4, 6])
def test_the_closed_form_is_the_order_s_span(pp):
    for m in range(1, 3 * pp + 1):
        bubble = _bubble(pp, m)
        for f, b, w in PASSES:
            span = _span(pp, m, f, b, w)
            assert 2 * m * (f + b + w) + bubble(f, b, w) == pytest.approx(span, rel=1e-12), \
                (m, f, b, w)


def test_the_paper_s_form_is_one_chain_of_the_order():
    """At F = B = W the paper's (pp - 1)(F + B - 2W) is 0; the order idles (pp - 1) F (the last
    rank's late start) from 2 pp - 1 micro-batches on, more below."""
    pp, f = 4, 1.0
    for m in (2 * pp - 1, 2 * pp, 4 * pp):
        assert _bubble(pp, m)(f, f, f) == pytest.approx((pp - 1) * f)
    assert _bubble(pp, pp)(f, f, f) == pytest.approx(2 * (pp - 1) * f)


def test_explain_prints_zbv_s_bubble_as_the_step_takes_it():
    from perfmodel.explain import explain_text
    from perfmodel.predict import predict

    plan = dict(gpus=64, tp=8, pp=8, global_batch=8, micro_batch=1, schedule="zbv",
                virtual_stages=2)
    text = explain_text("gpt3-175b", "dgx-a100-80gb", plan, only="pipeline")
    bubble = predict("gpt3-175b", "dgx-a100-80gb", plan).breakdown_s["pipeline/bubble"]
    assert "  T_bubble = T_zbv" in text
    assert f"  T_zbv = {bubble:.6g} s: ZB-V's bubble as its order runs" in text
