"""Mixtures of experts with expert parallelism, multi-head latent attention and multi-token
prediction in the step model (perfmodel.step.moe, perfmodel.costs.moe, perfmodel.costs.mla,
perfmodel.step.mtp), each formula against a number computed here by hand.

Sources: Megatron-Core's MoE (megatron/core/transformer/moe: the router, the all-to-all token
dispatcher, GroupedMLP, expert data parallelism; num_floating_point_operations counts an MoE
layer's top_k experts), GShard (Lepikhin et al. 2020, Sec. 2.2: the capacity), DeepSeek-V2 Sec.
2.1 and DeepSeek-V3 Sec. 2.1-2.2 (MLA, multi-token prediction).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfmodel import PerfmodelError, PlanError, load_hardware, load_model, predict
from perfmodel.costs.gemm_efficiency import gemm_time_s
from perfmodel.evaluate import family_of, values_of
from perfmodel.params import expert_parameters, parameter_counts
from perfmodel.predict import comm_ledger
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan

HW = "dgx-h100"
BF16 = 2


def _plan(**kw: object) -> Plan:
    kw.setdefault("gpus", int(kw.get("dp", 1)) * int(kw.get("cp", 1)) * int(kw.get("tp", 1))
                  * int(kw.get("pp", 1)))
    return Plan(**kw)


# the presets against their model cards (perfmodel.params counts them; the step model must agree)
@pytest.mark.parametrize(("name", "plan", "total", "active"), [
    # Mistral AI, mistral.ai/news/mixtral-of-experts: 46.7B parameters, 12.9B per token
    ("mixtral-8x7b", dict(dp=8, ep=8, pp=4, global_batch=64, recompute="full"), 46.7e9, 12.9e9),
    # Qwen/Qwen3-30B-A3B model card: 30.5B parameters ("3.3B activated" is 1.6% under
    # perfmodel.params' 3.353B: tests/unit/test_hf_configs.py)
    ("qwen3-30b-a3b", dict(dp=8, ep=8, global_batch=64), 30.5e9, 3.353e9),
    # DeepSeek-V3 README: 671B parameters; README_WEIGHTS.md: 36.7B activated (no embedding)
    ("deepseek-v3", dict(dp=64, ep=64, zero=1, recompute="full", global_batch=1024), 671e9,
     36.7e9),
])
def test_moe_presets_predict_with_their_cards_parameters(name, plan, total, active):
    model = load_model(name)
    p = predict(model, HW, _plan(**plan))
    assert p.parameters == pytest.approx(total, rel=0.005)
    # deepseek-v3's card leaves the embedding table out (its preset's active_count)
    assert p.active_parameters == pytest.approx(active, rel=0.005)
    # the MTP module apart (its parameters in the memory, not in `parameters`), with its three
    # norms (its final norm's 7,168 counted since 2026-12-07: tests/unit/test_mtp_norms.py)
    assert p.to_dict()["mtp_parameters"] == (11_610_067_968 if model.mtp_layers else 0)
    assert math.isfinite(p.step_time_s) and p.breakdown_s["comm/ep"] > 0
    assert 0 < p.mfu < 1


def _small_moe(**kw: object) -> TransformerSpec:
    return TransformerSpec(**{**dict(name="moe", layers=4, hidden=1024, heads=8, seq_len=2048,
                                     vocab=32000, gated_mlp=True, bias=False, norm="rmsnorm",
                                     position_embedding="rotary", tied_embeddings=False,
                                     experts=16, top_k=2, expert_ffn_hidden=2048), **kw})


def _evaluate(model: TransformerSpec, plan: Plan, expr: object) -> float:
    import sympy as sp

    from perfmodel import symbols as S

    hw = load_hardware(HW)
    values = values_of(model, hw, plan)
    subs = {sym: values[name] for name, (sym, _) in S.table().items() if name in values}
    return float(sp.sympify(expr).xreplace(subs))


def _gemm_s(m: float, n: float, k: float, floor: bool = True) -> float:
    """One bf16 GEMM on the hardware's model (perfmodel.costs.gemm_efficiency), in numbers."""
    hw = load_hardware(HW)
    g = hw.training_gemm("bf16").__dict__.copy()
    if not floor:
        g["min_time_s"] = 0.0
    g.pop("large_flops") if not g["large_flops"] else None
    return float(gemm_time_s(m, n, k, 1, BF16, hw.peak("bf16"),
                             hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency,
                             **g))


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_experts_run_at_their_token_count_the_busiest_on_the_slowest_rank(imbalance):
    """An MoE layer's MLP on one rank: the router GEMM over its T_r tokens, then its E/ep experts
    as one grouped GEMM, each expert's up and down GEMMs at its own token count m = ep T_r k / E
    (the busiest rho m), the kernel floor once."""
    from perfmodel.step.context import Context
    from perfmodel.step.moe import moe_mlp_work

    model = _small_moe(routing_imbalance=imbalance)
    plan = _plan(dp=8, ep=4, micro_batch=2, global_batch=16)
    hw = load_hardware(HW)
    c = Context.of(family_of(model, hw, plan))
    gemm_expr, _ = moe_mlp_work(c)
    T_r, h, E, k, f, ep = 2 * model.seq_len, model.hidden, 16, 2, 2048, 4
    m = ep * T_r * k / E

    def expert(tokens: float) -> float:
        return _gemm_s(tokens, 2 * f, h, floor=False) + _gemm_s(tokens, h, f, floor=False)

    # the E - 1 experts other than the busiest share the rest of the E m assignments
    rest = (E - imbalance) / (E - 1)
    expected = _gemm_s(T_r, E, h) + (E / ep - 1) * expert(rest * m) + expert(imbalance * m) \
        + 2 * hw.training_gemm("bf16").min_time_s
    assert _evaluate(model, plan, gemm_expr) == pytest.approx(expected, rel=1e-12)


def test_a_capacity_pads_every_expert_to_it_and_exchanges_fixed_buffers():
    """GShard: an expert takes at most C = ceil(c T_r k / E) of each rank's assignments, in
    padded buffers: dispatch and combine carry E C rows each way, no count exchange."""
    model = _small_moe(capacity_factor=1.25)
    b, ep = 2, 4
    # the tokens' exchanges alone (the probabilities': the weighting tests below)
    plan = _plan(dp=8, ep=ep, micro_batch=b, global_batch=16, expert_weighting="output")
    C = math.ceil(1.25 * b * model.seq_len * 2 / 16)
    records = [r for r in comm_ledger(model, plan, HW) if r["axis"] == "ep"]
    assert [(r["op"], r["nbytes"]) for r in records] == [
        ("all_to_all", BF16 * 16 * C * model.hidden)] * 2  # forward, backward
    assert sum(r["calls"] for r in records) == model.layers * 4 * 1  # 1 micro-batch per step


def test_dropless_dispatch_and_combine_carry_each_ranks_assignments():
    """Dropless: per MoE layer and micro-batch, the tokens per expert all-gathered (ep E int64)
    and dispatch and combine by all-to-all of T_r k rows of h, each way."""
    model = load_model("deepseek-v3")
    plan = _plan(dp=64, ep=64, micro_batch=1, global_batch=128, zero=1, recompute="full",
                 expert_weighting="output")  # the tokens' exchanges alone
    records: dict[tuple[str, float], float] = {}
    for r in comm_ledger(model, plan, HW):
        if r["axis"] == "ep":
            records[(r["op"], r["nbytes"])] = records.get((r["op"], r["nbytes"]), 0) + r["calls"]
    moe_layers, m = 58, 2  # 3 of 61 dense; 128 / (64 x 1) micro-batches
    mtp = 1  # the MTP module's layer, an MoE layer like the last, not recomputed
    assert records == {
        # forward, and again in the full recompute
        ("all_gather", 64 * 256 * 8): moe_layers * m * 2 + mtp * m,
        # dispatch and combine forward, backward and recomputed
        ("all_to_all", BF16 * model.seq_len * 8 * model.hidden): moe_layers * m * 2 * 3
        + mtp * m * 2 * 2,
    }


def test_expert_weights_split_by_ep_and_their_states_by_the_expert_data_parallel_group():
    """Megatron-Core: each rank holds E/ep experts; the distributed optimizer shards the other
    parameters' states over dp x cp and the experts' over the tp dp cp / ep ranks holding
    them."""
    model = _small_moe()
    hw = load_hardware(HW)
    dp, cp, ep = 8, 2, 4
    p = predict(model, hw, _plan(dp=dp, cp=cp, ep=ep, zero=1, global_batch=8))
    counts = parameter_counts(model)
    experts = model.layers * model.experts * expert_parameters(model)
    rest = counts.total - experts
    mine = experts / ep
    assert p.memory_breakdown_bytes["weights"] == pytest.approx(BF16 * (rest + mine), rel=1e-12)
    # fp32 main gradients (4) and Adam's fp32 master weights, momentum and variance (12)
    assert p.memory_breakdown_bytes["gradients"] == pytest.approx(4 * (rest + mine), rel=1e-12)
    edp = dp * cp // ep
    assert p.memory_breakdown_bytes["optimizer_states"] == pytest.approx(
        12 * (rest / (dp * cp) + mine / edp), rel=1e-12)
    # their gradients: the others over dp x cp, the experts over edp, apart
    syncs = {r["axis"]: r["nbytes"] for r in comm_ledger(model, _plan(dp=dp, cp=cp, ep=ep,
                                                                      global_batch=8), hw)
             if r["phase"] == "step"}
    assert syncs == {"dp_cp": pytest.approx(4 * rest), "edp": pytest.approx(4 * mine)}


def test_zero3_shards_the_experts_over_their_replicas_and_gathers_them_as_a_unit():
    """FSDP2 beside expert parallelism (torchtitan, NeMo AutoModel): every state of the other
    parameters sharded over dp x cp, the experts' over edp; each MoE layer's routed experts a
    unit of their own over edp, gathered for each micro-batch's forward and backward; the
    largest layer gathered whole is an MoE layer with its E / ep experts."""
    model = _small_moe()  # 4 MoE layers of 16 experts, 2048 wide, gated, no bias
    hw = load_hardware(HW)
    dp, ep, m = 16, 4, 2
    plan = _plan(dp=dp, ep=ep, zero=3, global_batch=dp * m)
    p = predict(model, hw, plan)
    counts = parameter_counts(model)
    h, f = model.hidden, model.expert_ffn_hidden
    expert = 3 * h * f  # w1, w3 (f x h) and w2 (h x f)
    experts = model.layers * model.experts * expert
    rest = counts.total - experts
    mine, edp = experts / ep, dp // ep
    # FSDP2's shard is the fp32 master (4 bytes), beside momentum and variance (8)
    assert p.memory_breakdown_bytes["weights"] == pytest.approx(
        4 * (rest / dp + mine / edp), rel=1e-12)
    assert p.memory_breakdown_bytes["optimizer_states"] == pytest.approx(
        8 * (rest / dp + mine / edp), rel=1e-12)
    # two gathered layers: the layer computing and the next, each an MoE layer with its 4
    # experts (4 x 3 h f), its attention, norms and router; and the root (embedding and output
    # layer, 2 x 32000 h, and the final norm)
    layer = counts.total - experts - 2 * 32000 * h - h  # the 4 layers' rest, the final norm out
    moe_layer = layer / model.layers + model.experts / ep * expert
    assert p.memory_breakdown_bytes["buffers/zero3_gather"] == pytest.approx(
        BF16 * (2 * moe_layer + 2 * 32000 * h + h), rel=1e-12)
    # the ledger: per step, each MoE layer's block gathered over dp and its experts over edp,
    # twice per micro-batch, their gradients reduce-scattered in each micro-batch's backward; no
    # all-reduce
    ledger = {(r["name"], r["axis"]): r for r in comm_ledger(model, plan, hw)
              if r["name"].startswith(("dp/", "edp/"))}
    gathers = ledger["edp/fsdp_experts/all_gather", "edp"]
    assert gathers["calls"] == 2 * m * model.layers
    assert gathers["nbytes"] == pytest.approx(BF16 * model.experts / ep * expert)
    assert ledger["edp/fsdp_experts/reduce_scatter", "edp"]["calls"] == m * model.layers
    assert ledger["dp/fsdp_moe_layer/all_gather", "dp"]["calls"] == 2 * m * model.layers
    assert ledger["dp/fsdp_moe_layer/all_gather", "dp"]["nbytes"] == pytest.approx(
        BF16 * layer / model.layers)
    assert not [r for r in ledger.values() if r["calls"] and r["op"] == "all_reduce"]
    # with ep 1 the experts gather with their layer, over dp: no edp collective
    one = {r["name"]: r for r in comm_ledger(model, _plan(dp=dp, zero=3, global_batch=dp * m),
                                             hw)}
    assert not [r for r in one.values() if r["axis"] == "edp" and r["calls"]]
    assert one["dp/fsdp_moe_layer/all_gather"]["nbytes"] == pytest.approx(
        BF16 * (layer / model.layers + model.experts * expert))


def test_model_flops_count_the_active_parameters():
    """MFU's model FLOPs (Megatron-LM's num_floating_point_operations, megatron/training/
    training.py at d98e8a6: no router term): 3 x the forward's, an MoE layer's top_k experts
    (and shared ones) in place of a dense MLP; the causal attention core counted as half. Per
    token and layer (forward): 2 x (q, k, v, o and k experts' weights) + 2 a s d (scores and
    context, causal half), and the logits 2 V h. The count with attention whole (torchtitan's
    get_moe_model_nparams_and_flops at b5bcd76: its active parameters include the router's
    weights) adds 2 h E per MoE layer and the whole core."""
    model = load_model("mixtral-8x7b", seq_len=4096)
    plan = _plan(dp=8, ep=8, pp=4, global_batch=64, recompute="full")
    p = predict(model, HW, plan)
    h, a, kv, d, s, f, E, k = (model.hidden, model.heads, model.kv_heads, model.head_dim,
                               model.seq_len, model.expert_ffn_hidden, model.experts, model.top_k)
    attention = (a * d + 2 * kv * d) * h + a * d * h
    layer = 2 * (attention + k * 3 * h * f) + 2 * a * s * d
    forward = model.layers * layer + 2 * model.vocab * h
    assert p.model_flops_per_step == pytest.approx(3 * forward * 64 * s, rel=1e-12)
    whole = model.layers * (layer + 2 * h * E + 2 * a * s * d) + 2 * model.vocab * h
    assert p.model_flops_per_step_full_attention == pytest.approx(3 * whole * 64 * s, rel=1e-12)
    assert p.mfu == pytest.approx(p.model_flops_per_step
                                  / (p.step_time_s * 32 * load_hardware(HW).peak("bf16")))



@pytest.mark.parametrize("factor", [0.01, 0.25, 0.5, 1.0, 1.25])
def test_a_capacity_below_one_counts_the_assignments_the_experts_compute(factor):
    """A capacity factor c < 1 drops assignments: the experts compute min(1, c) k per token, and
    the model's FLOPs count those (Megatron's formula counts all k: at c = 0.01 it gave a
    1070 TFLOP/s, 108% MFU on an H100). Dense part as without a capacity; MFU stays below 1."""
    base = load_model("mixtral-8x7b", seq_len=4096)
    capped = load_model("mixtral-8x7b", seq_len=4096, capacity_factor=factor)
    plan = _plan(dp=8, ep=8, global_batch=64)
    p, q = predict(base, HW, plan), predict(capped, HW, plan)
    h, f, k, s = base.hidden, base.expert_ffn_hidden, base.top_k, base.seq_len
    experts = 3 * 2 * k * 3 * h * f * base.layers * 64 * s  # the dropless run's expert FLOPs
    assert q.model_flops_per_step == pytest.approx(
        p.model_flops_per_step - (1 - min(1.0, factor)) * experts, rel=1e-12)
    assert 0 < q.mfu < 1
    assert q.model_flops_per_step <= q.hardware_flops_per_step * (1 + 1e-12)

def test_mla_and_mtp_flops_as_deepseek_v3_builds_them():
    """DeepSeek-V3: MLA's projections (q 7168 -> 1536 -> 128 x 192, kv 7168 -> 512 + 64, 512 -> 128
    x (128 + 128), o 128 x 128 -> 7168), its core of 192-wide scores and 128-wide context (causal
    half), 3 dense layers (MLP 18432), 58 MoE layers (router 256, 8 routed and 1 shared expert
    of 2048), the output layer, and one MTP module (a layer like the last, a 2h -> h projection
    and the output layer)."""
    model = load_model("deepseek-v3")
    p = predict(model, HW, _plan(dp=64, ep=64, zero=1, recompute="full", global_batch=64))
    h, a, s, V = 7168, 128, model.seq_len, model.vocab
    mla = h * 1536 + 1536 * a * 192 + h * (512 + 64) + 512 * a * (128 + 128) + a * 128 * h
    core = 2 * a * s * (192 + 128) / 2  # scores and context, causal half, per token
    dense = 2 * (mla + 3 * h * 18432) + core
    moe = 2 * (mla + 8 * 3 * h * 2048 + 3 * h * 2048) + core  # Megatron's: no router
    logits = 2 * V * h
    mtp = moe + 2 * 2 * h * h + logits
    forward = 3 * dense + 58 * moe + logits + mtp
    assert p.model_flops_per_step == pytest.approx(3 * forward * 64 * s, rel=1e-12)


def test_dense_layers_count_on_the_stage_that_holds_them():
    """The first 3 of 8 layers dense, pp 2: 1f1b puts layers 0-3 on rank 0 (1 MoE), 4-7 on rank
    1 (4 MoE); interleaved with 2 chunks each (chunks of 2 layers: rank 0 layers 0, 1, 4, 5:
    2 MoE; rank 1 layers 2, 3, 6, 7: 3 MoE); zbv (rank 0 chunks 0 and 3: layers 0, 1, 6, 7, 2
    MoE; rank 1 chunks 1 and 2: layers 2-5, 3 MoE)."""
    from perfmodel.step.context import Context
    from perfmodel.step.moe import moe_layers

    model = _small_moe(layers=8, moe_first_dense=3)
    hw = load_hardware(HW)
    for schedule, v, expected in (("1f1b", 1, (1, 4)), ("interleaved", 2, (2, 3)),
                                  ("zbv", 2, (2, 3))):
        plan = _plan(dp=2, pp=2, ep=2, schedule=schedule, virtual_stages=v, global_batch=8)
        c = Context.of(family_of(model, hw, plan))
        counts = moe_layers(c)
        assert (_evaluate(model, plan, counts["first"]),
                _evaluate(model, plan, counts["last"])) == expected, schedule


def test_the_search_enumerates_ep_and_cp_and_agrees_with_predict():
    from perfmodel.search import SearchRequest, search

    model, hw = _small_moe(), load_hardware(HW)
    req = SearchRequest(gpus=(16,), global_batch=16, max_micro_batch=2, zero=1,
                        recompute="full", flash_attention=True)
    chunks: list = []
    result = search(model, hw, req, top=10**6, on_chunk=chunks.append)
    from perfmodel.search import Scored

    every = Scored.concat(chunks)
    eps = set(every.plans.cols["ep"].tolist())
    cps = set(every.plans.cols["cp"].tolist())
    assert eps == {1, 2, 4, 8, 16} and {1, 2, 4, 8, 16} <= cps
    rng = np.random.default_rng(17)
    for i in rng.choice(len(every), size=60, replace=False):
        if not every.evaluated[i]:
            continue
        expected = predict(model, hw, result.plan(every, int(i)))
        assert every.step_time_s[i] == pytest.approx(expected.step_time_s, rel=1e-9)
        assert every.memory_bytes[i] == pytest.approx(expected.memory_per_gpu_bytes, rel=1e-9)


def test_max_cp_bounds_the_context_degrees_searched():
    from perfmodel.search import SearchRequest, count_plans, plan_chunks

    model = _small_moe()
    req = SearchRequest(gpus=(16,), global_batch=16, max_micro_batch=2, zero=1,
                        recompute="full", flash_attention=True, max_cp=4)
    cps = {int(cp) for plans in plan_chunks(model, req) for cp in plans.cols["cp"]}
    assert cps == {1, 2, 4}
    import dataclasses

    assert count_plans(model, dataclasses.replace(req, max_cp=1)) \
        == count_plans(model, dataclasses.replace(req, cp=1))


@pytest.mark.parametrize(("model", "kw", "needle"), [
    ("mixtral-8x7b", dict(dp=6, ep=3, global_batch=6), r"ep \(3\) must divide the experts \(8\)"),
    ("mixtral-8x7b", dict(dp=2, ep=4, global_batch=2), r"ep \(4\) must divide tp x dp x cp"),
    ("llama3-8b", dict(dp=2, ep=2, global_batch=2), "the model has no experts"),
    ("mixtral-8x7b", dict(dp=2, tp=2, ep=2, global_batch=2), "needs sequence_parallel"),
])
def test_moe_plans_that_cannot_run_are_refused_naming_the_field(model, kw, needle):
    with pytest.raises(PlanError, match=needle) as err:
        predict(model, HW, _plan(**kw))
    assert "\n" not in str(err.value)


def test_the_cli_takes_ep_and_refuses_one_that_does_not_divide_the_experts(run_cli):
    ok = run_cli("predict", "--model", "qwen3-30b-a3b", "--hardware", HW, "--dp", "8", "--ep",
                 "8", "--global-batch", "64", "--json")
    assert ok.returncode == 0, ok.stderr
    import json

    data = json.loads(ok.stdout)
    assert data["plan"]["ep"] == 8 and data["active_parameters"] < data["parameters"] / 8
    bad = run_cli("predict", "--model", "qwen3-30b-a3b", "--hardware", HW, "--dp", "6", "--ep",
                  "3", "--global-batch", "6")
    assert bad.returncode == 4 and "ep (3) must divide the experts (128)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_mla_gathers_its_latents_over_tp():
    """Megatron-Core's MLASelfAttention with tp 2 and sequence parallelism: per layer and
    micro-batch, the query latent (1536), the key/value latent (512) and the rotary key (64)
    all-gathered forward (e T w bytes each) and reduce-scattered backward, the output
    reduce-scattered forward and all-gathered backward (e T h); the down projections over the
    rank's s / tp tokens (perfmodel.costs.mla)."""
    model = load_model("deepseek-v3")
    plan = _plan(dp=32, tp=2, ep=32, sequence_parallel=True, zero=1, recompute="full",
                 global_batch=32)
    T, h = model.seq_len, model.hidden
    records: dict[tuple[str, str, float], float] = {}
    for r in comm_ledger(model, plan, HW):
        if r["name"].startswith("tp/mla"):
            key = (r["op"], r["phase"], r["nbytes"])
            records[key] = records.get(key, 0) + r["calls"]
    layers = 61 + 1  # the model's and the MTP module's (not recomputed)
    recomputed = 61
    forward = {("all_gather", "fwd", BF16 * T * w): layers for w in (1536, 512, 64)}
    forward[("reduce_scatter", "fwd", BF16 * T * h)] = layers
    again = {("all_gather", "bwd", BF16 * T * w): recomputed for w in (1536, 512, 64)}
    again[("reduce_scatter", "bwd", BF16 * T * h)] = recomputed
    backward = {("reduce_scatter", "bwd", BF16 * T * w): layers for w in (1536, 512, 64)}
    backward[("all_gather", "bwd", BF16 * T * h)] = layers
    # the up projections' latents gathered again for their weight gradients (TE's column-
    # parallel linears keep the shard; perfmodel.step.tensor_parallel): the rotary key's not
    regather = {("all_gather", "bwd", BF16 * T * w): layers for w in (1536, 512)}
    expected: dict[tuple[str, str, float], float] = dict(forward)
    for part in (again, backward, regather):
        for key, calls in part.items():
            expected[key] = expected.get(key, 0) + calls
    assert records == expected
    tp1 = predict(model, HW, plan.replace(tp=1, sequence_parallel=False, gpus=32, dp=32,
                                          ep=32))
    tp2 = predict(model, HW, plan)
    assert tp2.memory_breakdown_bytes["weights"] < tp1.memory_breakdown_bytes["weights"]
    assert tp2.breakdown_s["comm/tp"] > 0 and tp1.breakdown_s["comm/tp"] == 0


def test_explain_prints_the_new_terms_formulas():
    """explain writes comm/cp and comm/ep as formulas of the plan's own family (cp, the experts'
    token counts), evaluated to the prediction's numbers."""
    from perfmodel.explain import explain_text

    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    plan = _plan(dp=4, cp=2, ep=8, global_batch=16)
    text = explain_text(model, hw, plan)
    p = predict(model, hw, plan)
    for term, symbol in (("comm/cp", "cp"), ("comm/ep", "k_E")):
        line = next(i for i, x in enumerate(text.splitlines()) if x.startswith(f"- {term} ="))
        formula = text.splitlines()[line + 1]
        assert symbol in formula
        per_step = float(text.splitlines()[line].split(",")[1].split()[0])
        assert per_step == pytest.approx(p.breakdown_s[term], rel=1e-5)
    # the memory per GPU, term by term (memory/NAME), adds up to the prediction's, each term its
    # memory_breakdown_bytes entry; the experts' weights and states are divided by ep
    memory = {x.split(" = ")[0][2:]: float(x.split(" = ")[1].split()[0])
              for x in text.splitlines() if x.startswith("- memory/")}
    assert sum(memory.values()) == pytest.approx(p.memory_per_gpu_bytes, rel=1e-5)
    for name, value in p.memory_breakdown_bytes.items():
        assert memory[f"memory/{name}"] == pytest.approx(value, rel=1e-5)
    weights = text.splitlines()[text.splitlines().index(next(
        x for x in text.splitlines() if x.startswith("- memory/weights ="))) + 1]
    assert "/(ep*etp*pp)" in weights
    only = explain_text(model, hw, plan, only=("memory/weights",)).splitlines()
    assert [x for x in only if x.startswith("- ")] == ["- memory/weights = " + next(
        x for x in text.splitlines() if x.startswith("- memory/weights = ")).split(" = ")[1]]
    with pytest.raises(PerfmodelError, match="memory/weights"):  # a bf16 plan: no FP8 copies
        explain_text(model, hw, plan, only=("memory/fp8",))


def test_explain_values_are_the_substituted_formulas():
    """explain evaluates its formulas compiled (perfmodel.evaluate.compile_outputs, as the
    timeline's) rather than by substituting into each tree: the same numbers as sympy's
    substitution, for the stage totals and the MoE host sections (a synchronised host on an
    asynchronous device)."""
    import sympy as sp

    from perfmodel.evaluate import _built, compile_outputs
    from perfmodel.explain import _printed
    from perfmodel.symbols import table

    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    plan = _plan(dp=8, ep=8, global_batch=16)
    family = family_of(model, hw, plan, specialise=True)
    built = _built(family)
    composed = built.stages["first"]
    assert composed.host_share is not None and composed.synced is not None
    exprs = [*built.term_values.values(), *composed.host_share[1:], *composed.synced]
    values = values_of(model, hw, plan)
    subs = {sym: values[name] for name, (sym, _) in table().items() if name in values}
    printed = _printed(built, "first")
    out = compile_outputs(family, "explain-first", lambda b: _printed(b, "first"))(values)
    got = {sp.sympify(e): float(out[name]) for name, e in printed.items()}
    for e in exprs:
        assert got[sp.sympify(e)] == pytest.approx(float(sp.sympify(e).xreplace(subs)), rel=1e-9)


def test_ep_groups_take_the_tensor_parallel_ranks_first():
    # Megatron-Core with expert tensor parallelism 1 (parallel_state.initialize_model_parallel:
    # the expert RankGenerator, order "tp-cp-ep-dp-pp", expert tp 1) numbers a stage's ranks with
    # ep innermost: an ep group is ep consecutive ranks of the tp x cp x dp ranks, tp first.
    from perfmodel.encode import axis_per_node

    # tp 4 x dp 8, ep 8, 8 GPUs a node: the ep group is a node (its 4 tp ranks and 2 dp
    # neighbours); the 4 ranks holding the same experts lie one per node
    plan = _plan(dp=8, tp=4, ep=8, sequence_parallel=True, global_batch=8)
    per_node = axis_per_node(plan, 8)
    assert per_node["ep"] == (8, "intra") and per_node["edp"] == (1, "inter")
    # tp = 1: ep consecutive of the dp x cp ranks, as before
    per_node = axis_per_node(_plan(dp=16, cp=2, ep=4, global_batch=16), 8)
    assert per_node["ep"] == (4, "intra") and per_node["edp"][0] == 2
    # ep over the tp ranks alone (ep = tp, dp 1): a plan the old rule (ep dividing dp x cp)
    # refused, Megatron-Core runs
    model = load_model("mixtral-8x7b")
    plan = _plan(tp=8, ep=8, sequence_parallel=True, global_batch=1)
    plan.check(model)
    assert axis_per_node(plan, 8)["ep"] == (8, "intra")


def test_an_ep_group_that_cuts_a_tp_group_unevenly_is_refused():
    # 12 experts, tp 4, dp 3, ep 6: ep and tp divide neither one another, so an ep group would
    # take one tp group whole and half of the next
    model = TransformerSpec(name="twelve", layers=2, hidden=96, heads=12, seq_len=64, vocab=128,
                            experts=12, top_k=2)
    with pytest.raises(PlanError, match=r"ep \(6\) must divide or be divisible by tp \(4\)"):
        _plan(dp=3, tp=4, ep=6, sequence_parallel=True, global_batch=3).check(model)
    _plan(dp=3, tp=4, ep=4, sequence_parallel=True, global_batch=3).check(model)


@pytest.mark.parametrize("q_lora", [True, False], ids=["q-lora", "whole-queries"])
def test_mla_tensors_hold_the_mla_parameters_of_one_rank(q_lora):
    """FSDP pads each of MLA's tensors (perfmodel.costs.mla.mla_tensors): together they hold
    what mla_params gives one of tp ranks (its sharded part / tp, its replicated part whole)."""
    from perfmodel.costs import mla

    dims = dict(h=7168, a=128, r_q=1536, r_kv=512, d_nope=128, d_rope=64, d_v=128)
    tp = 8
    params = mla.mla_params(**dims, q_lora=q_lora, bias=1)
    tensors = mla.mla_tensors(**dims, tp=tp, q_lora=q_lora, bias=1)
    assert sum(rows * cols for rows, cols in tensors) == params["sharded"] / tp \
        + params["replicated"]


def test_combined_1f1b_hides_the_all_to_alls_behind_the_paired_micro_batch():
    """Megatron-Core's --overlap-moe-expert-parallel-comm (Plan.ep_comm_overlap): each
    micro-batch's all-to-alls behind the paired one's compute, at the overlap's contention, the
    unpaired warm-up share never hidden; what is hidden plus what is exposed is what the plan
    without it exposes."""
    model = load_model("qwen3-30b-a3b")
    hw = load_hardware("dgx-h100")
    kw = dict(gpus=64, dp=64, ep=64, micro_batch=1, global_batch=1024, zero=1)
    plain = predict(model, hw, Plan(**kw))
    both = predict(model, hw, Plan(**kw, ep_comm_overlap=True))
    hidden = both.hidden_s["comm/ep"]
    assert hidden > 0 and both.breakdown_s["comm/ep"] < plain.breakdown_s["comm/ep"]
    assert both.breakdown_s["comm/ep"] + hidden == pytest.approx(plain.breakdown_s["comm/ep"],
                                                                 rel=1e-9)
    # the compute beside a hidden collective runs slower: k / (1 + k) of the hidden time
    k = hw.overlap_compute_slowdown
    assert both.breakdown_s["compute/overlap_contention"] == pytest.approx(
        k / (1 + k) * hidden, rel=1e-6)
    # one stage, 16 micro-batches per replica: the first forward and the last backward (1 in
    # 16) stay exposed at least
    assert both.breakdown_s["comm/ep"] >= plain.breakdown_s["comm/ep"] / 16 * (1 - 1e-9)
    assert both.step_time_s < plain.step_time_s


@pytest.mark.parametrize("kw, why", [
    (dict(ep=1), "needs ep > 1"),
    (dict(recompute="full"), "recompute full"),
    (dict(pp=2, dp=32), "interleaved schedule"),
])
def test_combined_1f1b_is_refused_where_megatron_refuses_it(kw, why):
    with pytest.raises(PlanError, match=why):
        Plan(**{"gpus": 64, "dp": 64, "ep": 8, "global_batch": 256, "ep_comm_overlap": True,
                **kw})


def test_the_search_turns_combined_1f1b_on_where_megatron_runs_it():
    """recommend takes Megatron-Core's combined 1F1B on every plan with ep > 1 where it runs
    (no full recompute; one stage, or interleaved stages), off elsewhere, and its step times are
    predict's for the same plans; --no-ep-comm-overlap (False) leaves it off everywhere."""
    from perfmodel.search import Scored, SearchRequest, search

    model, hw = _small_moe(), load_hardware(HW)
    req = SearchRequest(gpus=(16,), global_batch=32, max_micro_batch=2, zero=1,
                        flash_attention=True, recomputes=("selective", "full"))
    chunks: list = []
    result = search(model, hw, req, top=10**6, on_chunk=chunks.append)
    every = Scored.concat(chunks)
    plans = [result.plan(every, i) for i in range(len(every)) if every.evaluated[i]]
    on = [p for p in plans if p.ep_comm_overlap]
    assert on and all(p.ep > 1 and p.recompute.value != "full"
                      and (p.pp == 1 or p.schedule.value == "interleaved") for p in on)
    # on where it runs and the schedule pairs micro-batches (one micro-batch pairs none)
    assert not [p for p in plans if p.ep > 1 and p.recompute.value == "selective" and p.pp == 1
                and p.num_micro_batches > 1 and not p.ep_comm_overlap]
    assert not [p for p in on if p.pp == 1 and p.num_micro_batches == 1]
    frame = every.frame()  # the CSV's column says what runs
    assert frame["ep_comm_overlap"].tolist() == [result.plan(every, i).ep_comm_overlap
                                                 for i in range(len(every))]
    rng = np.random.default_rng(5)
    evaluated = np.flatnonzero(every.evaluated)
    for i in rng.choice(evaluated, size=min(40, len(evaluated)), replace=False):
        expected = predict(model, hw, result.plan(every, int(i)))
        assert every.step_time_s[i] == pytest.approx(expected.step_time_s, rel=1e-9)
    chunks = []
    off = search(model, hw, SearchRequest(**{**req.__dict__, "ep_comm_overlap": False}), top=5,
                 on_chunk=chunks.append)
    every_off = Scored.concat(chunks)
    assert not any(off.plan(every_off, i).ep_comm_overlap for i in range(len(every_off)))


@pytest.mark.parametrize("etp", [1, 2])
def test_weighting_the_activation_keeps_no_expert_output(etp):
    """Megatron-Core (from 0.13) multiplies the routing probabilities into the experts'
    activation (moe/experts.py, TEGroupedMLP.bias_act_func -> weighted_bias_swiglu_impl, which
    saves its input and the permuted probabilities), and the combine only sums the outputs;
    torchtitan's token dispatcher and the validation job scale the experts' outputs at the
    combine, so that product's backward keeps them (Plan.expert_weighting activation, output).
    Per MoE layer and micro-batch on one rank, activation keeps e A_r h fewer bytes and 4 etp
    A_r more (the fp32 probabilities, gathered over etp with the rows), A_r = T k the rank's
    routed rows (T = b s / tp with sequence parallelism)."""
    model = _small_moe()
    hw = load_hardware(HW)
    tp = etp
    kw = dict(tp=tp, etp=etp, sequence_parallel=tp > 1, global_batch=1)
    act = predict(model, hw, _plan(expert_weighting="activation", **kw)).memory_breakdown_bytes
    out = predict(model, hw, _plan(expert_weighting="output", **kw)).memory_breakdown_bytes
    rows = 1 * model.seq_len // tp * model.top_k
    per_layer = BF16 * rows * model.hidden - 4 * etp * rows
    assert out["activations/layers"] - act["activations/layers"] == pytest.approx(
        model.layers * per_layer, rel=1e-12)


def test_weighting_the_activation_sends_the_probabilities_with_the_tokens():
    """Megatron-Core's MoEAlltoAllTokenDispatcher.token_dispatch sends the permuted
    probabilities by a second all-to-all beside the tokens (their gradient back in the
    backward), and with etp > 1 gathers them over etp; weighted at the outputs (the validation
    job) they stay on the source rank; DeepEP carries them in its own dispatch."""
    model = _small_moe()
    hw = load_hardware(HW)
    ep, etp, tp, dp = 4, 2, 2, 4
    kw = dict(dp=dp, tp=tp, ep=ep, etp=etp, sequence_parallel=True, global_batch=dp)
    rows = model.seq_len // tp * model.top_k  # T_r k: the rows a rank sends
    probs = [r for r in comm_ledger(model, _plan(**kw), hw) if "probs" in r["name"]]
    got = {(r["name"], r["phase"]): (r["nbytes"], r["calls"]) for r in probs}
    layers = model.layers
    assert got == {
        ("ep/probs/all_to_all", "fwd"): (pytest.approx(4 * rows), layers),
        ("ep/probs/all_to_all", "bwd"): (pytest.approx(4 * rows), layers),
        ("etp/probs/all_gather", "fwd"): (pytest.approx(4 * etp * rows), layers),
        ("etp/probs/reduce_scatter", "bwd"): (pytest.approx(4 * etp * rows), layers),
    }
    for weighting, dispatcher in (("output", "alltoall"), ("activation", "deepep")):
        plan = _plan(**{**kw, "etp": 1, "tp": 1, "dp": 8, "global_batch": 8,
                        "sequence_parallel": False}, expert_weighting=weighting,
                     ep_dispatcher=dispatcher)
        assert not [r for r in comm_ledger(model, plan, hw) if "probs" in r["name"]]


def test_each_stack_gives_its_weighting_and_the_job_predicts_its_own(tmp_path):
    """torchtitan's reader gives output (its dispatcher scales the routed outputs), Megatron's
    the default, activation; Megatron-LM's arguments cannot write output; the validation job
    (workload.moe scales its experts' outputs at the combine) is predicted with output, said in
    its notes."""
    from perfmodel.configs import read_config
    from perfmodel.configs.emit import emit
    from validation.jobspec import as_run

    root = Path(__file__).resolve().parents[2]
    assert read_config(root / "tests/data/configs/torchtitan_qwen3_30b_a3b.toml"
                       ).plan["expert_weighting"] == "output"
    model, hw = load_model("qwen3-30b-a3b"), load_hardware(HW)
    plan = _plan(dp=8, ep=8, global_batch=8, expert_weighting="output")
    with pytest.raises(PlanError, match="expert_weighting output"):
        emit("megatron", tmp_path, model, hw, plan, 1.0)
    _, ran_plan, note = as_run(model, _plan(dp=2, ep=2, global_batch=2), "gloo")
    assert ran_plan.expert_weighting.value == "output"
    assert "expert_weighting output" in note
    _, _, dense_note = as_run(load_model("llama3-8b"), _plan(dp=2, global_batch=2),
                                       "gloo")
    assert "expert_weighting" not in dense_note


@pytest.mark.parametrize("ep", [1, 2, 4, 16])
def test_a_routing_imbalance_never_gives_a_rank_more_rows_than_its_ep_group_routes(ep):
    """rho is the busiest expert's load over the mean: the other experts share what is left, so
    a rank's rows are at most its ep group's ep T_r k, and with ep 1 exactly its own T_r k."""
    import sympy as sp

    from perfmodel.costs.moe import expert_tokens

    T_r, k, E = 4096, 2, 16
    for rho in (1.0, 1.5, 4.0, E / k):
        _, busy, A_r = (float(sp.sympify(x)) for x in
                        expert_tokens(T_r, k, E, ep, rho, capacity_factor=None))
        assert A_r <= ep * T_r * k * (1 + 1e-12)
        assert busy <= ep * T_r * k * (1 + 1e-12)
        if ep == 1:
            assert A_r == pytest.approx(T_r * k)
