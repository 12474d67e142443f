"""An MoE layer's forward synchronises the host with the device (the token counts the exchange's
split sizes and the grouped GEMM read on the host): the stage's MoE forward sections compose as
perfmodel.step.compose's module doc says, and only where the stacks sync."""

from __future__ import annotations

import pytest
import sympy as sp

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.evaluate import family_of
from perfmodel.step import build
from perfmodel.step import compose as CO

P = CO.HOST_DEVICE_SHARPNESS


def _smax(a: float, b: float) -> float:
    return (a ** P + b ** P) ** (1 / P)


def _stage(host_r, device_r, host_a, device_a, host_b, device_b, synced=True):
    """One stage of three phases (its R, A and B sections, each a host and a device term) as
    stage_terms composes it: the time of one micro-batch [s]."""
    phases = [CO.Phase(name=name, device={"compute/forward/gemm": sp.Float(d)},
                       host={"overhead/kernels": sp.Float(h)})
              for name, h, d in (("r", host_r, device_r), ("a", host_a, device_a),
                                 ("b", host_b, device_b))]
    sections = CO.Synced(sp.Float(host_r), sp.Float(device_r), sp.Float(host_a),
                         sp.Float(device_a)) if synced else None
    stage = CO.stage_terms(phases, sp.Integer(0), asynchronous=True, synced=sections)
    return float(sp.Add(*stage.terms.values()))


def test_a_host_bound_routed_section_adds_to_the_device_bound_rest():
    """R host-bound (H_R = 3, D_R = 1), A device-bound (H_A = 1, D_A = 3): the device cannot
    start A before the host has issued R, max(H_R + max(H_A, D_A), D_R + D_A) = 6 where the
    p-norm of the sums gives max(4, 4) (times 2^(1/8))."""
    t = _stage(3.0, 1.0, 1.0, 3.0, 0.0, 0.0)
    assert t == pytest.approx(3.0 + _smax(3.0 + (_smax(1.0, 3.0) - 3.0), 1.0), rel=1e-12)
    assert 6.0 <= t <= 6.0 * 1.01
    assert _stage(3.0, 1.0, 1.0, 3.0, 0.0, 0.0, synced=False) == pytest.approx(_smax(4.0, 4.0))


def test_a_device_bound_routed_section_lets_the_host_run_ahead():
    """R device-bound, A host-bound: the host issues A while the device runs R,
    max(H_R + max(H_A, D_A), D_R + D_A) = max(1 + 3, 4 + 1) = 5 (the p-norm's 2^(1/8) at most
    where the two sides tie)."""
    assert 5.0 <= _stage(1.0, 4.0, 3.0, 1.0, 0.0, 0.0) <= 5.0 * 1.01
    assert 4.0 <= _stage(1.0, 3.0, 3.0, 1.0, 0.0, 0.0) <= 4.0 * 2 ** (1 / P)


def test_without_host_time_the_device_times_add_and_the_rest_is_as_before():
    assert _stage(0.0, 2.0, 0.0, 3.0, 0.0, 5.0) == pytest.approx(10.0, rel=1e-12)
    # no MoE sections (all 0): the p-norm of host and device, as without the sync
    assert _stage(0.0, 0.0, 0.0, 0.0, 2.0, 3.0) == pytest.approx(_smax(2.0, 3.0), rel=1e-12)
    # B alone adds its p-norm
    assert _stage(0.0, 2.0, 0.0, 3.0, 2.0, 3.0) == pytest.approx(5.0 + _smax(2.0, 3.0),
                                                                rel=1e-12)


def _sections(model, hardware, plan):
    built = build(family_of(model, hardware, plan, specialise=True))
    return built.stages["first"].synced


def test_the_stacks_that_sync_and_those_that_do_not():
    """Megatron-Core's dropless dispatchers and DeepEP sync in every MoE forward, torchtitan with
    ep > 1 (its all-to-all splits on the host); torchtitan's grouped_mm with ep 1 takes device
    offsets and does not, nor does a capacity factor's padding; a dense model has no such
    sections."""
    moe, h100 = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    plan = Plan(gpus=8, dp=8, ep=8, global_batch=16)
    values = {}
    for name, p in (("megatron ep8", plan), ("megatron ep1", Plan(gpus=8, dp=8, global_batch=16)),
                    ("torchtitan ep8", Plan(gpus=8, dp=8, ep=8, global_batch=16,
                                            kernels="eager")),
                    ("torchtitan ep1", Plan(gpus=8, dp=8, global_batch=16, kernels="eager"))):
        result = predict(moe, h100, p)
        sections = _sections(result.model, result.hardware, result.plan)
        values[name] = [float(sp.sympify(x).xreplace(_values(result))) for x in sections]
    assert all(v > 0 for v in values["megatron ep8"])
    assert all(v > 0 for v in values["megatron ep1"])
    assert all(v > 0 for v in values["torchtitan ep8"])
    assert values["torchtitan ep1"] == [0.0, 0.0, 0.0, 0.0]
    dense = predict(load_model("llama3-8b"), h100, Plan(gpus=8, dp=8, global_batch=16))
    assert _sections(dense.model, dense.hardware, dense.plan) is None
    # padded to a capacity the counts are known on the host (Megatron-Core's drop-and-pad path
    # leaves cuda_sync_point "no_sync")
    padded = predict(moe.scaled(capacity_factor=1.25), h100, plan)
    assert _sections(padded.model, padded.hardware, padded.plan) is None


def _values(result):
    from perfmodel import symbols as S
    from perfmodel.evaluate import values_of

    values = values_of(result.model, result.hardware, result.plan)
    return {sym: values[name] for name, (sym, _) in S.table().items() if name in values}


def test_the_sync_costs_time_where_the_routed_sections_are_host_bound():
    """Qwen3-30B-A3B on one H100, micro-batch 4: its 128 experts on the rank (8 host ops each a
    forward) make the routed sections host-bound, the attention at 4 x 4096 tokens device-bound;
    composed with the syncs the micro-batch is slower than the p-norm of the stage's sums (what
    it was without them), by the host time the attention could no longer hide."""
    moe, h100 = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100")
    result = predict(moe, h100, Plan(gpus=1, dp=1, micro_batch=4, global_batch=4))
    built = build(family_of(result.model, result.hardware, result.plan, specialise=True))
    stage = built.stages["first"]
    subs = _values(result)
    _, share, host, device = stage.host_share
    h, d = (float(sp.sympify(v).xreplace(subs)) for v in (host, device))
    h_r, d_r, h_a, d_a = (float(sp.sympify(v).xreplace(subs)) for v in stage.synced)
    assert h_r > d_r and d_a > h_a  # the case the sync matters in
    t = d + float(sp.sympify(share).xreplace(subs)) * h
    assert t > 1.05 * _smax(h, d)
    assert t == pytest.approx(d_a + _smax(h_r + _smax(h_a, d_a) - d_a, d_r)
                              + _smax(h - h_r - h_a, d - d_r - d_a), rel=1e-9)
