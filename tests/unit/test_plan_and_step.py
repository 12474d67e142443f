"""Plan rules and properties of the step model."""

import pytest

from perfmodel import Plan, PlanError, load_hardware, load_model, predict

H100 = "dgx-h100"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(gpus=8, tp=4), "dp x tp x pp must equal gpus"),
    (dict(gpus=8, dp=8, micro_batch=2, global_batch=12),
     "global_batch must be divisible by dp x micro_batch"),
    (dict(gpus=8, pp=8, global_batch=8, schedule="interleaved"), "virtual_stages >= 2"),
    (dict(gpus=8, pp=8, global_batch=8, virtual_stages=2), "needs schedule interleaved, zb or zbv"),
    (dict(gpus=8, dp=8, global_batch=8, sequence_parallel=True), "sequence_parallel needs tp > 1"),
    (dict(gpus=8, dp=8, global_batch=8, zero=4), "zero must be between 0 and 3"),
    (dict(gpus=8, dp=8, global_batch=8, schedule="zb-h2"), "schedule must be one of"),
    (dict(gpus=8, pp=8, global_batch=8, schedule="zbv"), "virtual_stages = 2"),
    (dict(gpus=0), "gpus must be between 1"),
    (dict(gpus=8, dp=8, global_batch=8, recompute="ful"), "did you mean 'full'"),
])
def test_invalid_plans_name_the_rule(kwargs, needle):
    with pytest.raises(PlanError, match=needle):
        Plan(**kwargs)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(gpus=64, tp=64, global_batch=1), r"heads \(32\) must be divisible by tp \(64\)"),
    (dict(gpus=5, pp=5, global_batch=5), r"layers \(32\) must be divisible by pp x virtual_stages"),
    (dict(gpus=12, pp=4, tp=3, global_batch=4), "heads"),
])
def test_model_rules(kwargs, needle):
    with pytest.raises(PlanError, match=needle):
        predict("llama2-7b", H100, Plan(**kwargs))


def test_the_rules_over_columns_give_each_plan_what_plan_check_says():
    """strategy.RULES, written once: the vectorised mask (the search's) allows exactly the plans
    that Plan() and Plan.check() accept, on random plans of every option (context and expert
    parallelism too), 3 dense models and 2 mixtures of experts."""
    import numpy as np

    from perfmodel.strategy import CP_COMMS, LAYOUTS, RECOMPUTES, SCHEDULES, PlanColumns, allowed

    rng = np.random.default_rng(14)
    n = 20000
    cols = {"dp": rng.choice([1, 2, 3, 4, 8], n), "tp": rng.choice([1, 2, 3, 4, 5, 6, 8, 9, 27], n),
            "pp": rng.choice([1, 2, 3, 4, 8], n), "micro_batch": rng.choice([1, 2, 3, 4, 8], n),
            "schedule": rng.integers(0, len(SCHEDULES), n),
            "virtual_stages": rng.choice([1, 1, 2, 3], n),
            "sequence_parallel": rng.integers(0, 2, n), "tp_layout": rng.choice([0, 0, 1, 2, 3], n),
            "tp_depth": rng.choice([1, 1, 1, 3], n), "cp": rng.choice([1] * 7 + [2, 3, 4], n),
            "ep": rng.choice([1, 1, 1, 1, 2, 4, 8, 3], n), "etp": rng.choice([1] * 5 + [2, 4], n),
            "cp_comm": rng.integers(0, len(CP_COMMS), n),
            "recompute": rng.integers(0, len(RECOMPUTES), n), "zero": rng.integers(0, 4, n),
            "tp_comm_overlap": rng.choice([0] * 15 + [1], n),
            "overlap_param_gather": rng.choice([0] * 7 + [1], n),
            "first_stage_layers": rng.choice([0] * 48 + [1, 2, 3, 7, 9], n),
            "last_stage_layers": rng.choice([0] * 48 + [1, 2, 3, 7, 9], n)}
    cols["gpus"] = cols["dp"] * cols["tp"] * cols["pp"] * cols["cp"] \
        * rng.choice([1] * 19 + [2], n)
    cols["global_batch"] = cols["dp"] * cols["micro_batch"] * rng.choice([1, 2, 4, 8, 3], n)
    options = {"schedule": SCHEDULES, "tp_layout": LAYOUTS, "cp_comm": CP_COMMS,
               "recompute": RECOMPUTES}
    for name in ("llama2-7b", "gpt3-175b", "gpt-22b", "mixtral-8x7b", "qwen3-30b-a3b"):
        model = load_model(name)
        mask = allowed(PlanColumns(cols), model)
        accepted = []
        for i in range(n):
            try:
                Plan(**{k: int(v[i]) for k, v in cols.items() if k not in options},
                     **{k: names[cols[k][i]] for k, names in options.items()}).check(model)
                accepted.append(True)
            except PlanError:
                accepted.append(False)
        assert 50 < sum(accepted) < n - 50  # both kinds, for the comparison to mean something
        np.testing.assert_array_equal(mask, accepted)


def test_sequence_parallelism_needs_the_sequence_to_divide_by_tp():
    # issue 14: what predict refused and the search ranked first (gpt-1t on 640 GPUs: tp 5)
    with pytest.raises(PlanError, match=r"seq_len \(2048\) must be divisible by tp \(5\)"):
        Plan(gpus=640, dp=8, tp=5, pp=16, global_batch=640,
             sequence_parallel=True).check(load_model("gpt-1t"))


def test_degree_one_means_no_communication_on_that_axis():
    r = predict("llama2-7b", H100, Plan(gpus=1, global_batch=4, micro_batch=1))
    assert r.breakdown_s["comm/tp"] == 0
    assert r.breakdown_s["comm/dp"] == 0
    assert r.breakdown_s["pipeline/p2p"] == 0
    assert r.breakdown_s["pipeline/bubble"] == 0
    r = predict("llama2-7b", H100, Plan(gpus=8, tp=8, global_batch=4))
    assert r.breakdown_s["comm/tp"] > 0 and r.breakdown_s["comm/dp"] == 0


def test_step_time_is_never_below_flops_over_peak():
    hw = load_hardware(H100)
    for plan in (Plan(gpus=8, dp=8, global_batch=64), Plan(gpus=64, tp=8, pp=8, global_batch=64),
                 Plan(gpus=16, tp=2, pp=2, dp=4, global_batch=32, recompute="full", zero=1)):
        r = predict("llama2-7b", hw, plan)
        assert r.step_time_s >= r.model_flops_per_step / (plan.gpus * hw.peak("bf16"))
        assert 0 < r.mfu < 1


def test_terms_sum_to_the_step_time():
    r = predict("gpt3-175b", "dgx-a100-80gb", Plan(gpus=64, tp=8, pp=8, global_batch=64,
                                                    schedule="interleaved", virtual_stages=3))
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert sum(r.memory_breakdown_bytes.values()) == pytest.approx(r.memory_per_gpu_bytes)


def _stage_times(model, hardware, plan):
    """One micro-batch's time on the first, a middle and the last stage [s]."""
    from perfmodel.evaluate import compile_family, family_of, values_of

    model, hardware = load_model(model), load_hardware(hardware)
    out = compile_family(family_of(model, hardware, plan))(values_of(model, hardware, plan))
    return {st: float(out[f"stage_time:{st}"]) for st in ("first", "middle", "last")}


def test_pipeline_bubble_is_the_fill_and_drain_through_every_stage():
    """Narayanan et al. 2021, Sec. 2.2: bubble / ideal = (pp - 1) / m (divided by v when
    interleaved) with equal stages. With unequal ones (the last stage carries the output layer
    and the loss, the first the embedding) the fill and drain pass through every stage once:
    (pp - 1)/v micro-batch times of the stages other than the slowest, (sum - max) / (pp - 1)
    each, less than (pp - 1) x the slowest."""
    model = load_model("gpt3-175b")
    for v, sched in ((1, "1f1b"), (3, "interleaved"), (1, "gpipe")):
        plan = Plan(gpus=64, tp=8, pp=8, global_batch=32, schedule=sched, virtual_stages=v)
        r = predict(model, "dgx-a100-80gb", plan)
        t = _stage_times(model, "dgx-a100-80gb", plan)
        assert t["last"] > t["middle"] and t["first"] > t["middle"]  # the ends carry more
        slowest = max(t.values())
        other = (t["first"] + 6 * t["middle"] + t["last"] - slowest) / 7
        assert r.breakdown_s["pipeline/bubble"] == pytest.approx(7 / v * other, rel=1e-9)
        ideal = r.step_time_s - r.breakdown_s["pipeline/bubble"] - r.breakdown_s["comm/dp"] \
            - r.breakdown_s["optimizer/step"] - r.breakdown_s["comm/tp_grads"]
        assert ideal == pytest.approx(32 * slowest, rel=1e-9)
        assert r.breakdown_s["pipeline/bubble"] / ideal < 7 / 32 / v


def test_zero_stages_shrink_memory_monotonically():
    mem = [predict("llama2-7b", H100,
                   Plan(gpus=8, dp=8, global_batch=8, zero=z)).memory_per_gpu_bytes
           for z in range(4)]
    assert mem[0] > mem[1] > mem[2] > mem[3]


def test_more_tensor_parallelism_shrinks_memory():
    mem = [predict("llama2-70b", H100, Plan(gpus=t, tp=t, global_batch=1)).memory_per_gpu_bytes
           for t in (1, 2, 4, 8)]
    assert mem == sorted(mem, reverse=True)


def test_gpipe_holds_more_activations_than_1f1b():
    kw = dict(gpus=8, pp=8, global_batch=64)
    gpipe = predict("gpt3-175b", "dgx-a100-80gb", Plan(**kw, schedule="gpipe"))
    one = predict("gpt3-175b", "dgx-a100-80gb", Plan(**kw))
    assert gpipe.memory_breakdown_bytes["activations/layers"] == pytest.approx(
        one.memory_breakdown_bytes["activations/layers"] * 64 / 8)


def test_tensor_parallel_inside_a_node_is_faster_than_across_nodes():
    inner = Plan(gpus=16, tp=8, dp=2, global_batch=16, placement="tp,dp,pp")
    outer = Plan(gpus=16, tp=8, dp=2, global_batch=16, placement="dp,tp,pp")
    a = predict("llama2-70b", H100, inner).breakdown_s["comm/tp"]
    b = predict("llama2-70b", H100, outer).breakdown_s["comm/tp"]
    assert b > a


def test_breakdown_frame():
    r = predict("tiny-gpt", H100, Plan(gpus=1, global_batch=8))
    frame = r.breakdown_frame()
    assert frame["seconds"].sum() == pytest.approx(r.step_time_s)
    assert "compute/forward/gemm" in frame.index


def test_ledger_lists_no_tensor_parallel_collective_when_tp_is_1():
    # regression: the cross-entropy and embedding all-reduces were listed for tp = 1
    from perfmodel import comm_ledger

    ledger = comm_ledger("tiny-gpt", Plan(gpus=2, dp=2, global_batch=4, micro_batch=2))
    assert [r["axis"] for r in ledger] == ["dp"]
    ledger = comm_ledger("tiny-gpt", Plan(gpus=4, dp=2, tp=2, global_batch=4,
                                          sequence_parallel=True))
    ops = {(r["axis"], r["op"]) for r in ledger}
    assert ("tp", "all_gather") in ops and ("tp", "reduce_scatter") in ops
    # with sequence parallelism the layers use no all-reduce: the embedding does (1 per
    # micro-batch, learned positions), the cross entropy (3 per micro-batch), and the norms'
    # gradients once per step (Megatron-LM allreduce_layernorm_grads)
    calls = {r["name"]: r["calls"] for r in ledger if r["op"] == "all_reduce" and r["axis"] == "tp"}
    assert calls == {"tp/embedding/all_reduce": 2, "tp/cross_entropy/all_reduce": 3 * 2,
                     "tp/norm_grads/all_reduce": 1}


def test_zero_bubble_schedules_shrink_the_bubble_as_the_paper_says():
    # Qi et al. 2024: with F = B = W, ZB-H1 leaves a third of 1F1B's bubble; here the bubble is
    # (pp - 1)(t_mb - 2 W) for zb and (pp - 1)(t_mb - 3 W)/2 for zbv, W the weight-gradient half of
    # the backward GEMMs
    model = load_model("gpt3-175b")
    kw = dict(gpus=64, tp=8, pp=8, global_batch=64, recompute="selective", sequence_parallel=True)
    base = predict(model, "dgx-a100-80gb", Plan(**kw))
    zb = predict(model, "dgx-a100-80gb", Plan(**kw, schedule="zb"))
    zbv = predict(model, "dgx-a100-80gb", Plan(**kw, schedule="zbv", virtual_stages=2))
    assert zbv.breakdown_s["pipeline/bubble"] < zb.breakdown_s["pipeline/bubble"] < \
        base.breakdown_s["pipeline/bubble"]
    # W comes from the stage with less of it (the first: the output layer's weight gradients sit on
    # the last); the layers' half of the backward GEMMs is the same on both
    w = zb.breakdown_s["compute/backward/gemm"] / 2
    m = 64
    t = _stage_times(model, "dgx-a100-80gb", Plan(**kw, schedule="zb"))
    other = (sum(t.values()) + 5 * t["middle"] - max(t.values())) / 7  # the fill and drain's
    assert zb.breakdown_s["pipeline/bubble"] == pytest.approx(7 * (other - 2 * w / m), rel=0.01)
    # same activations in flight as 1F1B
    assert zb.memory_per_gpu_bytes == pytest.approx(base.memory_per_gpu_bytes)


def test_selective_recompute_with_flash_attention_keeps_no_attention_statistics():
    """Regression (issue 8, found by the memory property): selective recompute checkpoints the
    core attention, so with flash attention its fp32 log-sum-exp (4 a b s bytes per layer, 1/tp
    per GPU) is recomputed too; flash attention must never add memory to selective recompute."""
    model, hw = load_model("llama2-7b"), load_hardware(H100)
    plan = Plan(gpus=1, global_batch=1, recompute="selective", flash_attention=False)
    without = predict(model, hw, plan).memory_breakdown_bytes["activations/layers"]
    with_flash = predict(model, hw, plan.replace(flash_attention=True))
    assert with_flash.memory_breakdown_bytes["activations/layers"] == pytest.approx(without)
    # without recompute, flash attention replaces the (2e + 1) a b s^2 scores (softmax output,
    # dropout mask and output; Korthikanti et al. 2022) by 4 a b s, or without attention dropout
    # (Llama 2 has none) the e a b s^2 softmax output alone
    a, s, layers = model.heads, model.seq_len, model.layers
    for dropout, scores in ((0.1, 2 * 2 + 1), (0.0, 2)):
        spec = model.replace(attention_dropout=dropout)
        none = predict(spec, hw, plan.replace(recompute="none"))
        none_flash = predict(spec, hw, plan.replace(recompute="none", flash_attention=True))
        assert (none.memory_breakdown_bytes["activations/layers"]
                - none_flash.memory_breakdown_bytes["activations/layers"]) == pytest.approx(
            layers * (scores * a * s**2 - 4 * a * s))


def test_gemm_shapes_add_up_to_narayanans_layer_flops():
    """One layer's forward GEMMs on one of tp ranks: (24 T h^2 + 4 T s h) / tp FLOPs with
    kv = a, ungated, f = 4h (Narayanan et al. 2021, Eq. 3, per layer and forward); the 2D grid
    gives each rank the same FLOPs as 1D, cut into q SUMMA steps."""
    from perfmodel.predict import gemm_shapes

    model = load_model("gpt3-175b")  # h 12288, a 96, f 4h, s 2048, not gated
    assert model.ffn_hidden == 4 * model.hidden and model.kv_heads == model.heads
    h, s = model.hidden, model.seq_len
    plan = Plan(gpus=16, tp=16, global_batch=16, micro_batch=4)
    T = plan.micro_batch * s
    layer = [g for g in gemm_shapes(model, plan) if g["name"] != "logits"]
    assert sum(g["flops"] for g in layer) == pytest.approx((24 * T * h**2 + 4 * T * s * h) / 16)
    logits = next(g for g in gemm_shapes(model, plan) if g["name"] == "logits")
    assert logits["flops"] == pytest.approx(2 * T * h * model.vocab / 16)
    grid = gemm_shapes(model, Plan(gpus=16, tp=16, tp_layout="2d", global_batch=16, micro_batch=4))
    qkv = next(g for g in grid if g["name"] == "qkv")
    assert qkv["batch"] == 4  # q = 4 SUMMA steps
    assert sum(g["flops"] for g in grid if g["name"] != "logits") == pytest.approx(
        sum(g["flops"] for g in layer))


def test_selective_recompute_holds_one_layers_rebuilt_attention_core():
    """Selective recompute rebuilds each layer's attention core in its backward (the scores and
    softmax without flash attention) and holds it for that layer's backward: a buffer of one
    layer's core, which it lacked (a metamorphic fuzz: gpt2-small on 4 MI355X, pp 4, unfused
    attention, 3.69 GB selective and 3.70 GB full, full recompute keeping more than selective)."""
    model, hw = load_model("gpt2-small"), load_hardware("mi355x")
    # one GPU, one micro-batch: what the 12 layers' cores drop, a twelfth of it held again
    one = dict(gpus=1, global_batch=1, flash_attention=False)
    none, selective = (predict(model, hw, Plan(**one, recompute=r)).memory_breakdown_bytes
                       for r in ("none", "selective"))
    core = none["activations/layers"] - selective["activations/layers"]
    assert core > 0
    assert selective["activations/recompute_buffer"] == pytest.approx(core / model.layers)
    kw = dict(gpus=4, pp=4, global_batch=4, flash_attention=False)
    by = {r: predict(model, hw, Plan(**kw, recompute=r)) for r in ("none", "selective", "full")}
    assert by["none"].memory_per_gpu_bytes > by["selective"].memory_per_gpu_bytes \
        > by["full"].memory_per_gpu_bytes
