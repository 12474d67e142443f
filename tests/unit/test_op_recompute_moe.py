"""torchtitan's per-op recompute (recompute op) of MLA and mixture-of-experts layers
(perfmodel.step.op_recompute): the matmuls counted in call order, the odd ones kept."""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp

from perfmodel import load_hardware, load_model, predict
from perfmodel import symbols as S
from perfmodel.costs import memory as M
from perfmodel.evaluate import family_of, values_of
from perfmodel.step import op_recompute as OP
from perfmodel.step.context import Context
from perfmodel.strategy import Plan
from perfmodel.symbols import by_symbol

HW = "dgx-h100"


def _context(model, plan):
    return Context.of(family_of(model, load_hardware(HW), plan, specialise=True))


def _number(expr, model, plan):
    values, names = values_of(model, load_hardware(HW), plan), by_symbol()
    return float(sp.sympify(expr).subs({x: values[names[x][0]] for x in
                                        sp.sympify(expr).free_symbols}))


def test_the_matmuls_are_counted_across_the_block_in_torchtitans_order():
    """DeepSeek-V3 (MLA with a query latent, a shared expert): wq_a, wq_b, wkv_a, wkv_b, wo,
    then a dense layer's w1, w3, w2 or an MoE layer's router and shared w1, w3, w2; the 1st,
    3rd, ... kept. Qwen3 MoE (GQA, no shared expert): wq, wk, wv, wo, router: the router kept."""
    dsv3 = load_model("deepseek-v3")
    plan = Plan(gpus=64, dp=64, ep=64, global_batch=64, recompute="op")
    c = _context(dsv3, plan)
    saved, recomputed = OP._split(c, moe=False, gated=True)
    assert [g.name for g in saved] == ["q_down", "kv_down", "attention_output", "w3"]
    assert [g.name for g in recomputed] == ["q_up", "kv_up", "w1", "w2"]
    saved, recomputed = OP._split(c, moe=True, gated=True)
    assert [g.name for g in saved] == ["q_down", "kv_down", "attention_output", "shared_w1",
                                       "shared_w2"]
    assert [g.name for g in recomputed] == ["q_up", "kv_up", "router", "shared_w3"]
    qwen = load_model("qwen3-30b-a3b")
    c = _context(qwen, Plan(gpus=8, dp=8, ep=8, global_batch=8, recompute="op"))
    saved, recomputed = OP._split(c, moe=True, gated=True)
    assert [g.name for g in saved] == ["q", "v", "router"]
    assert [g.name for g in recomputed] == ["k", "attention_output"]


@pytest.mark.parametrize("tp, sp_on", [(1, False), (4, True)])
def test_a_dense_layer_keeps_what_the_dense_count_keeps(tp, sp_on):
    """The op module's count of a dense layer with standard attention equals
    perfmodel.costs.memory's per-op count (the one the dense models use)."""
    model = dataclasses.replace(load_model("llama3-8b"), seq_len=4096)
    plan = Plan(gpus=8, dp=8 // tp, tp=tp, global_batch=8, recompute="op", flash_attention=True,
                sequence_parallel=sp_on)
    c = _context(model, plan)
    ours = OP.kept_bytes(c, False, S.s / S.cp)
    dense = M.layer_activation_bytes(S.b, S.s / S.cp, S.h, S.a, S.kv, S.f, S.tp, S.e,
                                     sequence_parallel=c.split, full=0, selective=0,
                                     flash=c.flash, gated=c.gated, op=1, d=c.d)
    assert _number(ours, model, plan) == pytest.approx(_number(dense, model, plan), rel=1e-12)


def test_moe_and_mla_models_predict_under_op_between_none_and_full():
    """torchtitan's DeepSeek-V3 and Qwen3 MoE runs use recompute op (selective_ac_option
    'op'): their memory lies between no recompute and full, and so does their recompute."""
    hw = load_hardware(HW)
    for name, kw in (("qwen3-30b-a3b", dict(gpus=16, dp=16, ep=16, global_batch=64, zero=3)),
                     ("deepseek-v3", dict(gpus=512, dp=64, pp=8, ep=64, global_batch=1024,
                                          zero=3, first_stage_layers=7,
                                          last_stage_layers=6))):
        model = load_model(name)
        runs = {r: predict(model, hw, Plan(**kw, recompute=r)) for r in ("none", "op", "full")}
        mem = {r: p.memory_breakdown_bytes["activations/layers"] for r, p in runs.items()}
        assert mem["full"] < mem["op"] < mem["none"], name
        again = {r: p.breakdown_s.get("compute/recompute", 0.0) for r, p in runs.items()}
        assert again["none"] == 0 < again["op"] < again["full"], name
        assert runs["op"].hardware_flops_per_step < runs["full"].hardware_flops_per_step


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("name, kw", [
    ("deepseek-v3", dict(gpus=8, dp=8, global_batch=8)),  # MLA, its dense layers and experts
    ("qwen3-30b-a3b", dict(gpus=8, dp=8, ep=8, global_batch=8)),  # all-to-alls kept, ep > 1
])
def test_predict_keeps_what_the_plans_own_family_keeps(name, kw, gated):
    """predict's compiled family leaves the MLP's gate open (an indicator): what per-op
    recompute keeps and repeats follows the call order's parity, which w3 changes, so it is
    the gated or the plain count by the indicator, equal to the specialised family's (it was
    the plain count for every model: a gated MLA layer kept 31 MiB where it keeps 55)."""
    model = dataclasses.replace(load_model(name), gated_mlp=gated)
    hw, plan = load_hardware(HW), Plan(**kw, recompute="op")
    result = predict(model, hw, plan)
    family = family_of(model, hw, plan, specialise=True)
    assert family.gated is gated
    from perfmodel.evaluate import _built

    built = _built(family)
    for term in ("activations/layers", "activations/recompute_buffer"):
        own = _number(built.memory_terms[result.breakdown_stage][term], model, plan)
        assert result.memory_breakdown_bytes[term] == pytest.approx(own, rel=1e-9), term
    flops = _number(built.quantities["hardware_flops_per_step"], model, plan)
    assert result.hardware_flops_per_step == pytest.approx(flops, rel=1e-9)
