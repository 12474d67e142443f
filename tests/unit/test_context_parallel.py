"""Context parallelism in the step model (perfmodel.step.context_parallel), each formula against a
number computed here by hand.

Sources: Megatron-Core's context parallelism (load-balanced causal chunks: cp rank i holds chunks i
and 2 cp - 1 - i of 2 cp, docs "context_parallel"); Transformer Engine's context-parallel
attention (AttnFuncWithCPAndKVP2P: cp steps, the next K/V chunk sent during this step's kernel;
AttnFuncWithCPAndKVAllGather; the a2a form after DeepSpeed-Ulysses, Jacobs et al. 2023);
Korthikanti et al. 2022, Table 2 (activations, here over the rank's s / cp tokens).
"""

from __future__ import annotations

import math

import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.collective import predict_collective
from perfmodel.predict import comm_ledger
from perfmodel.strategy import Plan

HW = "dgx-h100"
BF16 = 2


def _plan(**kw: object) -> Plan:
    kw.setdefault("gpus", int(kw.get("dp", 1)) * int(kw.get("cp", 1)) * int(kw.get("tp", 1))
                  * int(kw.get("pp", 1)))
    return Plan(**kw)


def test_each_cp_rank_does_one_cp_th_of_the_causal_attention():
    """The flash kernel's time (perfmodel.costs.compute.flash_attention_s) over 1/cp of the
    causal FLOPs, its per-row cost paid once per launch: cp launches over s/cp keys (ring), one
    over s (Ulysses)."""
    model, hw = load_model("llama3-8b", seq_len=16384), load_hardware(HW)
    kernel = hw.flash_kernel("bf16").at(model.head_dim)
    b, s, a, d, cp, L = 1, model.seq_len, model.heads, model.head_dim, 4, model.layers
    flops = 0.5 * 4 * b * a * s**2 * d / cp  # causal half of scores and context, 1/cp of it
    for comm, s_kernel in (("p2p", s / cp), ("a2a", s)):
        p = predict(model, hw, _plan(dp=2, cp=cp, cp_comm=comm, global_batch=4))
        per_layer = p.breakdown_s["compute/forward/attention"] / (p.micro_batches * L)
        expected = flops / (hw.peak("bf16") * kernel.forward_max_fraction) \
            * (1 + kernel.forward_half_seq / s_kernel)
        assert per_layer == pytest.approx(expected, rel=1e-12), comm


def test_ring_exchanges_hide_behind_the_previous_steps_attention():
    """Ring attention, per layer and micro-batch: forward cp - 1 exchanges of K and V (2C), each
    exposed by max(0, t_exchange - t_step); backward one of 2C and cp - 2 of 4C behind a step
    each, the last dK, dV (2C) after the last step: t_step = the layer's attention / cp."""
    model, hw = load_model("llama3-8b", seq_len=32768), load_hardware(HW)
    cp, b, L = 8, 1, model.layers
    p = predict(model, hw, _plan(dp=1, cp=cp, global_batch=2))
    n = p.micro_batches * L
    fwd = p.breakdown_s["compute/forward/attention"] / n / cp
    bwd = p.breakdown_s["compute/backward/attention"] / n / cp
    c = b * model.seq_len // cp * model.kv_heads * model.head_dim  # K or V of the rank's chunks

    def exchange(elements: int) -> float:  # one send/recv over the cp group (8 GPUs, one node)
        return predict_collective("send_recv", BF16 * elements, cp, hw, cp)["time_s"]

    x2, x4 = exchange(2 * c), exchange(4 * c)
    expected = n * ((cp - 1) * max(0.0, x2 - fwd) + max(0.0, x2 - bwd)
                    + (cp - 2) * max(0.0, x4 - bwd) + x2)
    assert p.breakdown_s["comm/cp"] == pytest.approx(expected, rel=1e-12)
    assert x2 < fwd  # long sequences: the forward's exchanges hide, the last one does not
    assert p.breakdown_s["comm/cp"] == pytest.approx(n * x2, rel=0.5)


def test_all_gather_and_ulysses_are_exposed_and_counted_as_the_job_counts_them():
    model = load_model("llama3-8b", seq_len=8192)
    cp, b = 4, 2
    c = b * model.seq_len // cp * model.kv_heads * model.head_dim
    q = b * model.seq_len // cp * model.heads * model.head_dim
    gathered = comm_ledger(model, _plan(dp=2, cp=cp, micro_batch=b, global_batch=4,
                                        cp_comm="allgather"), HW)
    cp_records = {(r["op"], r["nbytes"]): 0.0 for r in gathered if r["axis"] == "cp"}
    for r in gathered:
        if r["axis"] == "cp":
            cp_records[(r["op"], r["nbytes"])] += r["calls"]
    L = model.layers  # one micro-batch per step
    assert cp_records == {("all_gather", BF16 * cp * c): L * (2 + 2),
                          ("reduce_scatter", BF16 * cp * c): L * 2}
    ulysses = comm_ledger(model, _plan(dp=2, cp=cp, micro_batch=b, global_batch=4,
                                       cp_comm="a2a"), HW)
    a2a: dict[float, float] = {}
    for r in ulysses:
        if r["axis"] == "cp":
            assert r["op"] == "all_to_all"
            a2a[r["nbytes"]] = a2a.get(r["nbytes"], 0.0) + r["calls"]
    # Q and the output (heads), K and V (kv heads), each way
    assert a2a == {BF16 * q: L * 2 * 2, BF16 * c: L * 2 * 2}


def test_activations_are_the_ranks_s_over_cp_tokens():
    """Korthikanti et al. 2022, Table 2 (no tensor parallelism, 16-bit, LayerNorm, f = 4h, kv =
    a) with s / cp tokens, the flash kernel's fp32 log-sum-exp (4 a b s/cp) in place of the s^2
    terms: sbh/cp (34) + 4 a b s/cp per layer, times L/pp layers and the 1F1B micro-batches in
    flight."""
    model = load_model("gpt3-175b")
    b, s, h, a, cp, pp = 1, model.seq_len, model.hidden, model.heads, 4, 8
    plan = _plan(dp=1, cp=cp, pp=pp, micro_batch=b, global_batch=16, flash_attention=True)
    p = predict(model, "dgx-h100", plan)
    per_layer = s / cp * b * h * 34 + 4 * a * b * s / cp
    expected = per_layer * model.layers / pp * min(pp, p.micro_batches)
    assert p.memory_breakdown_bytes["activations/layers"] == pytest.approx(expected, rel=1e-12)
    one = predict(model, "dgx-h100", plan.replace(cp=1, gpus=pp))
    assert one.memory_breakdown_bytes["activations/layers"] == pytest.approx(cp * expected)


def test_gradients_are_reduced_over_the_dp_times_cp_ranks():
    """Megatron-Core reduces (and ZeRO-shards) a replica's gradients over its dp x cp ranks: dp 2
    x cp 4 syncs as dp 8 does (one node either way), over axis dp_cp, named dp when cp = 1."""
    model = load_model("llama3-8b", seq_len=8192)
    for zero in (0, 1):
        with_cp = predict(model, HW, _plan(dp=2, cp=4, zero=zero, global_batch=8))
        without = predict(model, HW, _plan(dp=8, zero=zero, global_batch=8))
        assert with_cp.breakdown_s["comm/dp"] == pytest.approx(without.breakdown_s["comm/dp"],
                                                               rel=1e-12)
        assert with_cp.memory_breakdown_bytes["optimizer_states"] == pytest.approx(
            without.memory_breakdown_bytes["optimizer_states"], rel=1e-12)
    axes = {r["axis"] for r in comm_ledger(model, _plan(dp=2, cp=4, global_batch=8), HW)}
    assert "dp_cp" in axes and "dp" not in axes
    assert "dp" in {r["axis"] for r in comm_ledger(model, _plan(dp=8, global_batch=8), HW)}


def test_cp_placed_across_nodes_pays_the_network():
    """An order of tp, dp, pp puts cp right outside tp (one node here); tp,dp,cp,pp across nodes:
    its ring exchanges cross the network and cost more."""
    model = load_model("llama3-8b", seq_len=16384)
    inside = predict(model, HW, _plan(dp=8, cp=2, global_batch=8))
    across = predict(model, HW, _plan(dp=8, cp=2, global_batch=8, placement="tp,dp,cp,pp"))
    assert across.breakdown_s["comm/cp"] > inside.breakdown_s["comm/cp"]
    assert inside.plan.placement == ("tp", "dp", "pp")


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(dp=1, cp=3, global_batch=1), r"seq_len \(8192\) must be divisible by 2 cp \(6\)"),
    (dict(dp=1, cp=16, cp_comm="a2a", global_batch=1),
     r"cp_comm a2a \(Ulysses\) needs heads / tp \(32\) and the kv heads a tp rank holds \(8"),
    (dict(dp=2, cp=2, flash_attention=False, global_batch=2),
     "cp 2 needs fused \\(flash\\) attention"),
    (dict(dp=2, cp=2, tp=4, tp_layout="2d", global_batch=2), "modelled with tp_layout 1d"),
])
def test_plans_with_cp_that_cannot_run_are_refused_naming_the_field(kw, needle):
    with pytest.raises(PlanError, match=needle) as err:
        predict(load_model("llama3-8b", seq_len=8192), HW, _plan(**kw))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("seq_len", [1023, 4097, 7])
def test_an_odd_sequence_runs_without_cp_and_is_refused_with_it(seq_len):
    """The two load-balanced chunks a cp rank holds are cp's rule alone (it once held every
    plan: an odd sequence length found no plan at all)."""
    model = load_model("llama3-8b", seq_len=seq_len)
    assert math.isfinite(predict(model, HW, _plan(dp=2, global_batch=2)).step_time_s)
    with pytest.raises(PlanError, match=rf"seq_len \({seq_len}\) must be divisible by 2 cp"):
        predict(model, HW, _plan(dp=1, cp=2, global_batch=1))


def test_the_cli_takes_cp_like_tp_and_refuses_a_bad_one_in_one_line(run_cli):
    out = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--dp", "2", "--cp", "4",
                  "--cp-comm", "a2a", "--global-batch", "8", "--seq-len", "8192", "--json")
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert (data["plan"]["cp"], data["plan"]["cp_comm"], data["plan"]["gpus"]) == (4, "a2a", 8)
    assert data["breakdown_s"]["comm/cp"] > 0 and math.isfinite(data["step_time_s"])
    assert "cp=4 (a2a)" in run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--dp",
                                   "2", "--cp", "4", "--cp-comm", "a2a", "--global-batch", "8",
                                   "--seq-len", "8192").stdout
    bad = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--cp", "3",
                  "--seq-len", "8192")
    assert bad.returncode == 4 and "2 cp (6)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_tp_beyond_the_kv_heads_is_refused():
    """llama3-8b has 8 kv heads: Megatron-Core divides them over tp (attention.py, divide()) and
    torchtitan likewise, so tp 16 cannot run; it is refused whatever cp's exchange, where the
    model once replicated one head a rank for the exchange while its weights took half of one."""
    model = load_model("llama3-8b", seq_len=32768)
    for comm in ("allgather", "a2a", "p2p"):
        with pytest.raises(PlanError, match=r"kv_heads \(8\) must be divisible by tp \(16\)"):
            predict(model, HW, _plan(tp=16, cp=2, cp_comm=comm, sequence_parallel=True,
                                     global_batch=1))
    assert predict(model, HW, _plan(tp=8, cp=2, cp_comm="allgather", sequence_parallel=True,
                                    global_batch=1)).step_time_s > 0
