"""explain's text formulas read back by sympy (perfmodel.symbols.parse), the crossovers' sizes
and explain's symbol table under --term (a probe's findings, 2026-12-07)."""

import math

import pytest
import sympy as sp

from perfmodel import PlanError
from perfmodel import symbols as S
from perfmodel.analysis import (
    algorithm_crossover_bytes,
    contributors_crossover_bytes,
    latency_bandwidth_bytes,
)
from perfmodel.explain import explain_text
from perfmodel.names import NAMES


def test_every_plain_name_is_a_sympy_symbol():
    for latex, _ in NAMES.values():
        name = S.plain_name(latex)
        assert sp.sympify(name) == sp.Symbol(name), latex


def _table(text):
    rows = text.split("\nsymbols:\n")[1].splitlines()
    return {r.split(" = ")[0].strip(): float(r.split(" = ")[1].split()[0]) for r in rows}


@pytest.mark.parametrize("plan, term", [
    ({"gpus": 16, "dp": 8, "tp": 2, "ep": 8, "global_batch": 8, "sequence_parallel": True},
     "compute/forward/elementwise"),  # E, the experts: Euler's number to sympify
    ({"gpus": 8, "tp": 8}, "pipeline/p2p"),
    ({"gpus": 8, "tp": 8}, "comm/cp"),  # alpha_intra^ll: a power to sympify
])
def test_printed_formula_reads_back(plan, term):
    model = "mixtral-8x7b" if "ep" in plan else "llama3-8b"
    text = explain_text(model, "dgx-h100", plan, only=term)
    line = text.split(f"- {term} = ")[1]
    printed = float(line.split()[0])
    expr = S.parse(line.splitlines()[1].strip())
    table = _table(text)
    value = float(expr.xreplace({s: table[S.plain_name(s.name)] for s in expr.free_symbols}))
    assert math.isclose(value, printed, rel_tol=1e-4, abs_tol=1e-12)


def test_term_filters_the_symbol_table():
    text = explain_text("llama3-8b", "dgx-h100", {"gpus": 8, "tp": 8}, only="memory/weights")
    assert "gemm_max_fraction" not in _table(text)
    assert {"e_w", "L", "h", "tp"} <= set(_table(text))


def test_crossovers_are_positive_sizes_or_none():
    # ring is cheaper in steps and in bytes than recursive doubling on 3 ranks: no crossover
    assert algorithm_crossover_bytes("all_gather", 3, "ring", "recursive", 3.4e-6, 3.6e11) is None
    # equal volumes: None with floats as with exact numbers (not a rounding error's 1e22 B)
    assert contributors_crossover_bytes("all_gather", 4, 8, 3.4e-6, 3.6e11) is None
    assert contributors_crossover_bytes("all_gather", 1, 8, 3.4e-6, 3.6e11) is None
    with pytest.raises(PlanError, match="ranks"):
        latency_bandwidth_bytes("all_reduce", 1, "ring", 3.4e-6, 3.6e11)
