"""How the stacks run (issue 16, items 1, 3 and 5): host time overlapped with the device's on a
GPU and added on CPU ranks; tensor- and data-parallel communication hidden behind compute where
the plan overlaps it; the pipeline's fill and drain through unequal stages, and uneven splits."""

import numpy as np
import pandas as pd
import pytest
import sympy as sp

from perfmodel import Plan, PlanError, load_hardware, load_model, predict
from perfmodel.step import compose as CO
from perfmodel.step import host as H

H100 = "dgx-h100"
HOST_TERMS = ("overhead/kernels", "overhead/loop", "overhead/collectives")


def _small(hidden: int, layers: int = 24):
    """A GPT of the given width (GPT-2 style: LayerNorm, biases, GELU), sequence 2048."""
    return load_model("gpt2-small").scaled(name=f"gpt-h{hidden}", layers=layers, hidden=hidden,
                                           heads=hidden // 128, seq_len=2048)


def _layers_time(r):
    """One step's time less the step phases (optimizer, gradient sync): the micro-batches'."""
    return r.step_time_s - sum(r.breakdown_s[k] for k in CO.STEP_TERMS)


def _host(r):
    return sum(r.breakdown_s[k] + r.hidden_s.get(k, 0.0) for k in HOST_TERMS)


def _compute(r):
    return sum(v for k, v in r.breakdown_s.items() if k.startswith("compute/"))


@pytest.mark.parametrize("hidden,mb", [(1024, 1), (1024, 2), (2048, 1)])
def test_small_layers_stop_shrinking_with_tp_at_the_host_time(hidden, mb):
    """Small layers on an eager stack (hidden 1-2k, micro-batch 1-2): from tp 4 to 8 the GPU's
    compute keeps shrinking, the predicted time hardly does: it never goes below the host's time
    to issue the layers' ops, and exceeds the larger of host and device time by at most the
    smooth maximum's 2^(1/8)."""
    model = _small(hidden)
    runs = {tp: predict(model, H100, Plan(gpus=tp, tp=tp, micro_batch=mb, global_batch=mb,
                                          sequence_parallel=True, flash_attention=True))
            for tp in (4, 8)}
    four, eight = runs[4], runs[8]
    assert _compute(eight) < 0.75 * _compute(four)  # the device's work keeps shrinking
    assert _layers_time(eight) > 0.85 * _layers_time(four)  # the step does not
    host = _host(eight)
    device = _layers_time(eight) - sum(eight.breakdown_s[k] for k in HOST_TERMS)
    assert host <= _layers_time(eight) <= 2 ** (1 / 8) * max(host, device) * (1 + 1e-9)
    if (hidden, mb) == (1024, 1):  # host-bound: it rests on the host's time
        assert host > device and _layers_time(eight) < 1.1 * host
    # (micro-batch 2, hidden 2048: the tensor-parallel collectives' per-call floors make the
    # device's time as long as the host's; either way the step stops shrinking)


def test_large_layers_keep_their_device_time():
    """A large layer (GPT-3 175B, tp 8, micro-batch 1): the host's dispatch hides behind the
    device's work entirely (under 0.1 % of the step exposed), so its prediction is its device
    time: compute plus communication."""
    r = predict("gpt3-175b", H100, Plan(gpus=8, tp=8, global_batch=8, sequence_parallel=True))
    exposed = sum(r.breakdown_s[k] for k in HOST_TERMS)
    assert exposed < 1e-3 * r.step_time_s
    assert _host(r) > 0  # the host time is there, all but a smooth maximum's sliver hidden
    assert sum(r.hidden_s.get(k, 0) for k in HOST_TERMS) > (1 - 1e-3) * _host(r)


def test_synchronous_ranks_keep_adding_host_and_device_time():
    """CPU ranks (asynchronous_device false, a file that does not say so): nothing of the host
    hides; the breakdown adds up as before issue 16 and reports no hidden host time."""
    # one cost per op both ways (CPU ranks charge kernel_overhead_s per kernel launch)
    same = load_hardware(H100).replace(host_op_overhead_s=load_hardware(H100).kernel_overhead_s)
    hw = same.replace(asynchronous_device=False)
    plan = Plan(gpus=8, tp=8, global_batch=8, sequence_parallel=True)
    r = predict(_small(1024), hw, plan)
    assert not any(k in r.hidden_s for k in HOST_TERMS)
    assert r.breakdown_s["overhead/kernels"] > 0
    assert r.breakdown_s["overhead/loop"] == 0  # the loop's ops: a GPU host's only
    gpu = predict(_small(1024), same, plan)
    assert r.step_time_s > gpu.step_time_s  # adding is slower than overlapping


def test_the_smooth_maximum():
    h, d = sp.symbols("h d", positive=True)
    f = sp.lambdify((h, d), CO.smooth_max(h, d))
    assert f(1.0, 0.0) == pytest.approx(1.0)
    assert f(1.0, 1.0) == pytest.approx(2 ** (1 / 8))
    for a, b in ((1.0, 1.5), (3.0, 0.2), (0.01, 2.0)):
        assert max(a, b) <= f(a, b) <= 2 ** (1 / 8) * max(a, b)
        assert f(2 * a, 2 * b) == pytest.approx(2 * f(a, b))  # homogeneous
    assert f(1.0, 1.5) < 1.01 * 1.5  # under 1 % once one side is 1.5 times the other
    assert sp.diff(CO.smooth_max(h, d), h) != 0  # differentiable for the sensitivities


def test_the_host_share_is_never_negative_where_the_device_dominates():
    """Regression: the host's exposed share, ((H^8 + D^8)^(1/8) - D) / H, cancelled to about
    -1e-17 where H << D and showed a negative host term in the breakdown (test_properties found
    it); written as H^7 / sum_k S^k D^(7-k) it is H^7 / (8 D^7) to first order, exactly."""
    h, d = sp.symbols("h d", positive=True)
    share = sp.lambdify((h, d), CO.host_share(h, d))
    assert share(1e-3, 0.5) == pytest.approx((1e-3 / 0.5) ** 7 / 8, rel=1e-12)
    assert share(0.0, 1.0) == 0.0 and share(1.0, 0.0) == 1.0
    assert share(1.0, 1.0) == pytest.approx(2 ** (1 / 8) - 1, rel=1e-12)


def test_the_stack_sets_the_host_time():
    """Eager issues the counted aten ops; compiled the fused kernels (fewer); CUDA graphs replay
    the layers with no host time per op, leaving the embedding, loss and loop."""
    model = _small(1024)
    # the same kernels under every stack (a compiled stack's own, compiled, keeps the gathered
    # input for the backward: its tensor-parallel launches differ, not its host time per op)
    host = {stack: _host(predict(model, H100, Plan(gpus=8, tp=8, global_batch=1,
                                                   sequence_parallel=True, stack=stack,
                                                   kernels="fused")))
            for stack in ("eager", "compiled", "cuda-graphs")}
    assert host["eager"] > host["compiled"] > host["cuda-graphs"] > 0
    t_op = load_hardware(H100).host_op_overhead_s  # calibrate run's, on an H200 machine
    per_layer = H.EAGER_FORWARD_OPS + H.EAGER_BACKWARD_OPS + H.EAGER_BACKWARD_BIAS
    loop = H.LOOP_DATA_OPS + H.LOOP_LOSS_OPS
    ends = H.EMBEDDING_FORWARD_OPS + H.EMBEDDING_BACKWARD_OPS + H.OUTPUT_FORWARD_OPS \
        + H.OUTPUT_BACKWARD_OPS
    graphs = loop + ends
    assert host["cuda-graphs"] == pytest.approx(graphs * t_op, rel=1e-6)
    launches = host["eager"] - (24 * per_layer + loop + ends) * t_op  # the collectives'
    assert launches == pytest.approx(host["compiled"] - (24 * (
        H.COMPILED_FORWARD_KERNELS + H.COMPILED_BACKWARD_KERNELS + H.COMPILED_BACKWARD_BIAS)
        + loop + ends) * t_op, rel=1e-6)
    assert launches > 0


def test_tensor_parallel_overlap_hides_behind_the_gemms_and_costs_them():
    """With tp_comm_overlap the layers' all-gathers and reduce-scatters hide behind the GEMMs
    they feed or follow: what shows plus what hides is the communication without overlap; a
    pipelined reduce-scatter's last chunk (a quarter of it) always shows; the overlapped GEMMs
    run in chunks and on fewer SMs (compute/tp_overlap). (The inputs gathered again for the
    weight gradients hide behind the input-gradient GEMMs either way: Megatron-Core issues them
    so without tp_comm_overlap too.)"""
    model = load_model("llama3-8b")
    kw = dict(gpus=8, tp=8, global_batch=8, sequence_parallel=True)
    plain = predict(model, H100, Plan(**kw))
    over = predict(model, H100, Plan(**kw, tp_comm_overlap=True))
    assert over.breakdown_s["comm/tp"] + over.hidden_s["comm/tp"] == pytest.approx(
        plain.breakdown_s["comm/tp"] + plain.hidden_s["comm/tp"], rel=1e-9)
    assert plain.hidden_s["comm/tp"] < 0.5 * plain.breakdown_s["comm/tp"]  # the re-gathers'
    assert over.breakdown_s["comm/tp"] < 0.5 * plain.breakdown_s["comm/tp"]
    assert over.breakdown_s["compute/tp_overlap"] > 0 == plain.breakdown_s["compute/tp_overlap"]
    assert over.step_time_s < plain.step_time_s
    with pytest.raises(PlanError, match="tp_comm_overlap needs sequence_parallel"):
        Plan(gpus=8, tp=8, global_batch=8, tp_comm_overlap=True)


def test_data_parallel_overlaps_hide_up_to_one_chunk():
    """The distributed optimizer (ZeRO 1): the gradients' reduce-scatter behind the last
    micro-batch's backward, the parameters' all-gather behind the next forward; without
    overlap_param_gather the gather shows whole. One layer's share of each always shows."""
    model = load_model("llama3-8b")
    kw = dict(gpus=64, dp=64, global_batch=64, zero=1)
    plain = predict(model, H100, Plan(**kw))
    grad = predict(model, H100, Plan(**kw, overlap_grad_sync=True))
    both = predict(model, H100, Plan(**kw, overlap_grad_sync=True, overlap_param_gather=True))
    # (overlapped, the sync runs in Megatron-Core's buckets, 64M parameters at dp 64: the same
    # bytes in more calls, tests/unit/test_dp_buckets.py)
    total = grad.breakdown_s["comm/dp"] + grad.hidden_s["comm/dp"]
    assert both.breakdown_s["comm/dp"] + both.hidden_s["comm/dp"] == pytest.approx(total,
                                                                                   rel=1e-9)
    assert total > plain.breakdown_s["comm/dp"]
    assert plain.breakdown_s["comm/dp"] > grad.breakdown_s["comm/dp"] > both.breakdown_s["comm/dp"]
    assert both.breakdown_s["comm/dp"] >= total / model.layers * (1 - 1e-9)  # one chunk shows
    # FSDP (ZeRO 3): its gathers, twice per micro-batch, hide behind every micro-batch
    fsdp = dict(gpus=64, dp=64, global_batch=256, zero=3)
    exposed = predict(model, H100, Plan(**fsdp)).breakdown_s["comm/dp"]
    hidden = predict(model, H100, Plan(**fsdp, overlap_grad_sync=True, overlap_param_gather=True))
    assert hidden.breakdown_s["comm/dp"] < 0.2 * exposed
    with pytest.raises(PlanError, match="overlap_param_gather needs zero >= 1"):
        Plan(gpus=8, dp=8, global_batch=8, overlap_param_gather=True)


def test_recommend_searches_the_overlaps_where_the_plan_allows_them():
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest, enumerate_plans

    model, hw = load_model("llama3-8b"), load_hardware(H100)
    req = SearchRequest(gpus=(64,), global_batch=512, pp=1, max_tp=8)
    plans = enumerate_plans(model, req).cols
    dp = plans["dp"] > 1
    assert (plans["overlap_grad_sync"] == dp).all()
    assert (plans["overlap_param_gather"] == (dp & (plans["zero"] >= 1))).all()
    sp_on = plans["sequence_parallel"] == 1
    assert set(plans["tp_comm_overlap"][sp_on]) == {0, 1}
    assert (plans["tp_comm_overlap"][~sp_on] == 0).all()
    best = recommend(model, hw, req, top=1).top[0].plan
    assert best.overlap_grad_sync == (best.dp > 1)
    pinned = recommend(model, hw, SearchRequest(gpus=(64,), global_batch=512, pp=1, max_tp=8,
                                                tp_comm_overlap=False, overlap_grad_sync=False),
                       top=1).top[0]
    assert not pinned.plan.tp_comm_overlap and not pinned.plan.overlap_grad_sync
    assert pinned.step_time_s >= recommend(model, hw, req, top=1).top[0].step_time_s


def test_an_uneven_split_llama3_405b_126_layers_over_16_stages():
    """Llama 3 405B's 126 layers over 16 stages, the first and last one layer short (Dubey et
    al. 2024, Sec. 3.3.2: 'we reduce one Transformer layer each from the first and the last
    stages'): 7, 8 x 14, 7 (Megatron --decoder-first/last-pipeline-num-layers)."""
    from perfmodel.evaluate import compile_family, family_of, values_of

    model = load_model("llama3-405b")
    assert model.layers == 126
    kw = dict(gpus=128, tp=8, pp=16, global_batch=16, sequence_parallel=True)
    with pytest.raises(PlanError, match="divisible by pp x virtual_stages"):
        Plan(**kw).check(model)
    plan = Plan(**kw, first_stage_layers=7, last_stage_layers=7).check(model)
    r = predict(model, H100, plan)
    hw = load_hardware(H100)
    out = compile_family(family_of(model, hw, plan))(values_of(model, hw, plan))
    params = {st: float(out[f"memory:{st}:weights"]) for st in ("first", "middle", "last")}
    assert params["middle"] > params["first"]  # 8 layers against 7 and the embedding
    assert r.bottleneck_stage in ("first", "middle", "last")
    t = {st: float(out[f"stage_time:{st}"]) for st in ("first", "middle", "last")}
    other = (t["first"] + 14 * t["middle"] + t["last"] - max(t.values())) / 15
    assert r.breakdown_s["pipeline/bubble"] == pytest.approx(15 * other, rel=1e-9)
    even = predict(model.scaled(name="llama3-405b-128", layers=128), H100, Plan(**kw))  # 8 each
    assert r.step_time_s < even.step_time_s
    with pytest.raises(PlanError, match="remaining 116 of the 126 layers"):
        Plan(**kw, first_stage_layers=5, last_stage_layers=5).check(model)


def test_the_host_stage_fits_the_host_time_per_op():
    from calibration.host import HostOpModel

    ops = np.array([136.0, 268.0, 532.0, 1060.0])
    records = pd.DataFrame({"ops": ops, "time_s": 2e-4 + 5e-6 * ops})
    model = HostOpModel().fit(records)
    assert model.host_op_overhead_s_ == pytest.approx(5e-6)
    assert model.summary()["params"]["host_op_overhead_s"] == pytest.approx(5e-6)
    assert model.hardware() == {"host_op_overhead_s": pytest.approx(5e-6)}


def test_the_host_stage_times_the_forward_s_ops_and_the_backward_s_apart():
    """Records with the forward alone: the forward's ops (through Python modules) at 7 us, the
    backward's (autograd's engine) at 4 us; the profile takes the two, the step's slope is their
    mix."""
    from calibration.host import HostOpModel

    blocks = np.array([1, 2, 4, 8, 16])
    forward_ops, backward_ops = 41.0 * blocks + 2, 95.0 * blocks + 4
    forward_t = 1e-4 + 7e-6 * forward_ops
    records = pd.DataFrame({"ops": forward_ops + backward_ops, "forward_ops": forward_ops,
                            "forward_time_s": forward_t,
                            "time_s": forward_t + 5e-5 + 4e-6 * backward_ops})
    model = HostOpModel().fit(records)
    assert model.hardware() == {"host_op_overhead_s": pytest.approx(7e-6),
                                "host_op_backward_overhead_s": pytest.approx(4e-6)}
    assert 4e-6 < model.host_op_overhead_s_ < 7e-6
    # a backward that does not grow with its ops keeps the step's one cost, said in a note
    flat = records.assign(time_s=forward_t + 5e-4)
    model = HostOpModel().fit(flat)
    assert set(model.hardware()) == {"host_op_overhead_s"}
    assert "one cost per op kept" in model.split_note_


def test_a_gpu_s_backward_ops_cost_their_own_host_time():
    """host_op_backward_overhead_s prices the backward's host ops (layers, embedding, output);
    unset, they cost host_op_overhead_s as before."""
    import dataclasses

    hw = load_hardware("hgx-h200")
    plan = Plan(gpus=1, global_batch=1, kernels="eager")
    base = predict("gpt2-small", hw, plan)
    same = predict("gpt2-small", dataclasses.replace(
        hw, host_op_backward_overhead_s=hw.host_op_overhead_s), plan)
    assert same.step_time_s == pytest.approx(base.step_time_s, rel=1e-12)
    cheaper = predict("gpt2-small", dataclasses.replace(hw, host_op_backward_overhead_s=2e-6),
                      plan)
    host = base.breakdown_s["overhead/kernels"] + base.hidden_s.get("overhead/kernels", 0)
    less = cheaper.breakdown_s["overhead/kernels"] + cheaper.hidden_s.get("overhead/kernels", 0)
    assert 0 < less < host


def test_every_gpu_preset_is_an_asynchronous_device():
    """Every hardware preset is a GPU node, whose host queues kernels and goes on: a preset that
    forgot asynchronous_device would silently add its host and device time (CPU ranks' rule)."""
    from perfmodel.specs.presets import HARDWARE_DIR

    names = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))
    assert len(names) >= 6
    assert [n for n in names if not load_hardware(n).asynchronous_device] == []
