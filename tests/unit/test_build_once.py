"""A step model's build asks for the same expressions many times (each stage, with and without
recompute): perfmodel.step.context.per_context and the GEMM model's cache construct each once
(2026-12-07: DeepSeek-V3's family built in about 0.7 of the time, the same expressions)."""

import sympy as sp

from perfmodel import load_hardware, load_model
from perfmodel.costs import gemm_efficiency as G
from perfmodel.evaluate import family_of
from perfmodel.step import build
from perfmodel.step import moe as MOE
from perfmodel.step.context import Context, per_context
from perfmodel.strategy import Plan


def _family(model="deepseek-v3", hardware="gb200-nvl72"):
    return family_of(load_model(model), load_hardware(hardware),
                     Plan(gpus=64, dp=64, ep=8, global_batch=64))


def test_per_context_computes_once_per_context_and_arguments():
    calls = []

    @per_context
    def times(c, x):
        calls.append(x)
        return sp.Symbol("y") * x

    fam = _family()
    a, b = Context.of(fam), Context.of(fam)
    assert times(a, 2) is times(a, 2)
    times(a, 3)
    times(b, 2)  # another context: its own
    assert calls == [2, 3, 2]
    assert times(b, 2) == times(a, 2)


def test_a_build_places_the_dense_layers_once(monkeypatch):
    # DeepSeek-V3's 3 dense layers are placed on the stages by an expression per layer and
    # stage; every phase asks for the MoE layers of its stage (30 times a build before)
    seen = []
    original = MOE._to_stages
    monkeypatch.setattr(MOE, "_to_stages", lambda c, per: seen.append(1) or original(c, per))
    build(_family())
    assert len(seen) == 2  # the dense layers and those full recompute repeats, once each


def test_the_gemm_model_is_built_once_per_shape():
    m, n, k = sp.symbols("m n k", positive=True)
    args = (m, n, k, 1, 2, 1e15, 3e12, 0.8, 0)
    assert G.gemm_time_s(*args, m_half_dim=32) is G.gemm_time_s(*args, m_half_dim=32)
    assert G.gemm_time_s(*args, m_half_dim=32) is not G.gemm_time_s(*args, m_half_dim=32.0)
    # an integer and a float of the same value are other arguments (an Integer or a Float in
    # the expression)
    one = G.gemm_efficiency(m, n, k, 1, 0)
    assert one is not G.gemm_efficiency(m, n, k, 1.0, 0)
    assert one == G.gemm_efficiency(m, n, k, 1, 0)
