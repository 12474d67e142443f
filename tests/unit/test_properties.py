"""Invariants of the cost models, on random inputs (hypothesis)."""

import math

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel import symbols as S
from perfmodel.costs.collectives import ALGORITHMS, Op, collective_time
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.evaluate import family_of, values_of
from perfmodel.step import build

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
H100 = load_hardware("dgx-h100")
MODEL = load_model("llama2-7b")


@SETTINGS
@given(op=st.sampled_from(list(Op)), n=st.integers(2, 4096), nbytes=st.floats(1, 1e11),
       factor=st.floats(1.0, 100.0))
def test_collective_time_never_falls_when_bytes_grow(op, n, nbytes, factor):
    for alg in ALGORITHMS[op]:
        small = float(collective_time(op, nbytes, n, 5e-6, 1e11, alg))
        large = float(collective_time(op, nbytes * factor, n, 5e-6, 1e11, alg))
        assert large >= small > 0


@SETTINGS
@given(m=st.integers(1, 65536), n=st.integers(1, 65536), k=st.integers(1, 65536),
       grow=st.sampled_from(["m", "n", "k"]), factor=st.integers(2, 8))
def test_gemm_time_never_falls_when_flops_grow(m, n, k, grow, factor):
    params = {"max_fraction": 0.8, "half_dim": 0, "m_half_dim": 33, "n_half_dim": 33,
              "k_half_dim": 160, "batch_half": 0.02, "min_time_s": 5e-6}

    def t(**dims):
        d = {"m": m, "n": n, "k": k, **dims}
        return float(gemm_time_s(d["m"], d["n"], d["k"], 1, 2, 989e12, 3.35e12, **params))

    assert t(**{grow: {"m": m, "n": n, "k": k}[grow] * factor}) >= t()


def plans():
    @st.composite
    def build_plan(draw):
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        pp = draw(st.sampled_from([1, 2, 4]))
        dp = draw(st.sampled_from([1, 2, 4]))
        mb = draw(st.sampled_from([1, 2]))
        m = draw(st.sampled_from([1, 2, 4, 8]))
        schedule = draw(st.sampled_from(["gpipe", "1f1b"] + (["interleaved"] if pp > 1 else [])))
        v = 2 if schedule == "interleaved" else 1
        if schedule == "interleaved":
            m = max(m - m % pp, pp)
        return Plan(gpus=dp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=dp * mb * m,
                    schedule=schedule, virtual_stages=v,
                    sequence_parallel=draw(st.booleans()) and tp > 1,
                    recompute=draw(st.sampled_from(["none", "selective", "full"])),
                    zero=draw(st.sampled_from([0, 1, 2, 3])) if dp > 1 else 0,
                    dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                    flash_attention=draw(st.booleans()),
                    overlap_grad_sync=draw(st.booleans()),
                    placement=draw(st.sampled_from(["tp,dp,pp", "dp,tp,pp", "pp,dp,tp"])))

    return build_plan()


@SETTINGS
@given(plan=plans())
def test_step_time_is_never_below_model_flops_at_peak(plan):
    r = predict(MODEL, H100, plan)
    assert r.step_time_s >= r.model_flops_per_step / (plan.gpus * H100.peak(plan.dtype.value))
    assert all(v >= 0 for v in r.breakdown_s.values())
    assert all(v >= 0 for v in r.memory_breakdown_bytes.values())


@SETTINGS
@given(plan=plans())
def test_degree_one_axes_do_not_communicate(plan):
    r = predict(MODEL, H100, plan)
    assert (r.breakdown_s["comm/tp"] == 0) == (plan.tp == 1)
    assert (r.breakdown_s["comm/dp"] == 0) == (plan.dp == 1) or plan.overlap_grad_sync
    assert (r.breakdown_s["pipeline/p2p"] == 0) == (plan.pp == 1)


@SETTINGS
@given(plan=plans())
def test_more_sharding_never_needs_more_memory(plan):
    base = predict(MODEL, H100, plan).memory_per_gpu_bytes
    if plan.dp > 1 and plan.zero < 3:
        assert predict(MODEL, H100, plan.replace(zero=plan.zero + 1)).memory_per_gpu_bytes <= base
    if plan.recompute.value != "full":
        assert predict(MODEL, H100, plan.replace(recompute="full")).memory_per_gpu_bytes <= base * (1 + 1e-12)


@settings(max_examples=8, deadline=None)
@given(plan=plans())
def test_symbolic_and_lambdified_forms_agree(plan):
    """The plan's own (specialised) sympy formula, evaluated exactly, equals the compiled universal
    expression that predict uses."""
    family = family_of(MODEL, H100, plan, specialise=True)
    expr = build(family).step_time
    values = values_of(MODEL, H100, plan)
    numbers = {sym: values[name] for name, (sym, _) in S.table().items() if name in values}
    exact = float(expr.xreplace(numbers))
    assert predict(MODEL, H100, plan).step_time_s == pytest.approx(exact, rel=1e-9)
    assert math.isfinite(exact)
    assert not isinstance(expr, sp.Number)
