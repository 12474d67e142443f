"""FP8 training (perfmodel.costs.fp8, docs/fp8.md): the linear layers' GEMMs at the FP8 rate, the
casts, the FP8 copies and scaling state in memory, the communication dtype, the MFU convention;
each number against a hand computation from the preset's fields and the cited sources."""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.costs import fp8 as F
from perfmodel.errors import PlanError
from perfmodel.predict import comm_ledger

H100 = load_hardware("dgx-h100")
W_H100 = 3.35e12 * 0.88  # dgx-h100: datasheet bandwidth x the copy kernels' efficiency
# llama3-8b (Meta's Llama 3 card): 32 layers, hidden 4096, 32 heads of 128, 8 kv heads, SwiGLU 14336
L, H, A, KV, FF, D = 32, 4096, 32, 8, 14336, 128
PLAN = dict(gpus=8, dp=4, tp=2, sequence_parallel=True, micro_batch=1, global_batch=16,
            flash_attention=True)


def _pair(**extra):
    model = load_model("llama3-8b")
    fp8 = predict(model, "dgx-h100", Plan(**{**PLAN, **extra}, dtype="fp8"))
    bf16 = predict(model, "dgx-h100", Plan(**PLAN, dtype="bf16"))
    return fp8, bf16


def test_recipe_bytes_by_hand():
    # TE docs: delayed scaling reads a tensor once to cast it, current scaling twice (amax, then
    # cast); Hopper writes a rowwise and a transposed copy, Blackwell one per-tensor copy; MXFP8
    # two copies, each with one E8M0 byte per 32 values
    assert F.quantize_bytes("delayed", True, 2) == 2 + 1 + 1
    assert F.quantize_bytes("current", True, 2) == 2 * 2 + 1 + 1
    assert F.quantize_bytes("delayed", False, 2) == 2 + 1
    assert F.quantize_bytes("mxfp8", False, 2) == 2 + 2 * (1 + 1 / 32)
    hopper, blackwell = F.fp8_bytes("delayed", True, 2), F.fp8_bytes("delayed", False, 2)
    assert (hopper.weight_copy, hopper.saved, hopper.operand) == (2, 1, 1)
    assert (blackwell.weight_copy, blackwell.saved) == (1, 1)
    assert F.fp8_bytes("mxfp8", False, 2).weight_copy == 2 * 33 / 32
    # a sequence-parallel gather of the rowwise copy: transposed after it where the columnwise
    # copy is a transpose (Hopper), not on Blackwell (one copy) nor in MXFP8 (gathered columnwise)
    assert hopper.gathered_transpose == 2 and blackwell.gathered_transpose == 0
    assert F.fp8_bytes("current", True, 2).gathered_transpose == 2
    assert F.fp8_bytes("mxfp8", True, 2).gathered_transpose == 0
    # DelayedScaling(amax_history_len=1024): 5 tensors x (1024 + 2) fp32 per GEMM
    assert F.scaling_state_bytes("delayed") == 5 * 4 * 1026
    with pytest.raises(ValueError, match="fp8 recipe must be one of"):
        F.usage_bytes("mxfp4", True)


def _gemm_s(m, n, k, g, peak, bpe, out_bpe):
    """One GEMM by the roofline of perfmodel.costs.gemm_efficiency, written out by hand."""
    eff = g.max_fraction * m / (m + g.m_half_dim) * n / (n + g.n_half_dim) \
        * k / (k + g.k_half_dim) * 1 / (1 + g.batch_half)
    compute = 2 * m * n * k / (peak * eff)
    memory = (bpe * (m * k + k * n) + out_bpe * m * n) / W_H100
    return g.min_time_s + max(compute, memory)


def test_fp8_gemm_time_by_hand():
    """The forward GEMM term of an fp8 plan: the four linear GEMMs at the H100's FP8 peak
    (1978.9 TFLOP/s, datasheet) and FP8 fit (max_fraction 0.709: MAMF H100 SXM fp8 1402.6 / 1978.9,
    shared/data/gemm dataset 7) at what the part sustains in training (x 0.893, its
    sustained_clock_fraction), 1-byte operands and bf16 outputs; tp 2 (column / row parallel)."""
    fp8, _ = _pair()
    g = H100.training_gemm("fp8")
    assert g.max_fraction == pytest.approx(0.709 * 0.893)
    T, tp = 8192, 2
    qkv = (A * D + 2 * KV * D) // tp
    shapes = [(T, qkv, H), (T, H, A * D // tp), (T, 2 * FF // tp, H), (T, H, FF // tp)]
    per_layer = sum(_gemm_s(m, n, k, g, 1978.9e12, 1, 2) for m, n, k in shapes)
    m = 16 // 4  # micro-batches
    assert fp8.breakdown_s["compute/forward/gemm"] == pytest.approx(L * per_layer * m, rel=1e-9)
    assert fp8.breakdown_s["compute/backward/gemm"] == pytest.approx(2 * L * per_layer * m,
                                                                     rel=1e-9)


def test_what_stays_bf16_is_bf16s():
    """Attention, element-wise kernels, embedding and output layer, and the data-parallel
    gradient sync are the bf16 plan's; the GEMMs are faster; casts appear only in fp8."""
    fp8, bf16 = _pair()
    for term in ("compute/forward/attention", "compute/backward/attention",
                 "compute/forward/elementwise", "compute/forward/embedding_logits",
                 "compute/backward/embedding_logits", "comm/dp"):
        assert fp8.breakdown_s[term] == pytest.approx(bf16.breakdown_s[term], rel=1e-12), term
    assert fp8.breakdown_s["compute/forward/gemm"] < 0.7 * bf16.breakdown_s["compute/forward/gemm"]
    assert "compute/forward/fp8_cast" not in bf16.breakdown_s
    assert fp8.parameters == bf16.parameters and fp8.model_flops_per_step == \
        bf16.model_flops_per_step


def test_cast_terms_by_hand():
    """Delayed scaling on Hopper: 4 bytes per element cast (read bf16, write the FP8 copy and its
    transpose). Per layer and micro-batch (tp 2 with sequence parallelism: r = 2): forward the QKV
    and MLP-up inputs T h / 2 each, the attention-output input T a d / 2 and the MLP-down input
    T f / 2; backward the grad outputs T h / 2 (x 2), T (a d + 2 kv d) / 2 and T 2 f / 2. The
    four sequence-parallel shards (QKV and MLP-up inputs, the grad outputs of the attention output
    and MLP down) are gathered in their rowwise copy only: 3 bytes an element, and the backward
    transposes each gathered T h (read 1, write 1; Transformer Engine's update_usage after the
    gather). The weights once per step: every layer's linear weights on the rank (the pipeline
    fill)."""
    fp8, _ = _pair()
    T, tp, m = 8192, 2, 4
    forward = 4 * (T * (A * D + FF) / tp) + 3 * (2 * T * H / 2)
    backward = 4 * (T * (A * D + 2 * KV * D + 2 * FF) / tp) + 3 * (2 * T * H / 2) \
        + 2 * (4 * T * H)
    assert fp8.breakdown_s["compute/forward/fp8_cast"] == pytest.approx(
        L * m * forward / W_H100, rel=1e-12)
    assert fp8.breakdown_s["compute/backward/fp8_cast"] == pytest.approx(
        L * m * backward / W_H100, rel=1e-12)
    no_sp, _ = _pair(sequence_parallel=False)  # every rank casts the whole inputs, both copies
    forward = 4 * (2 * T * H + T * (A * D + FF) / tp)
    assert no_sp.breakdown_s["compute/forward/fp8_cast"] == pytest.approx(
        L * m * forward / W_H100, rel=1e-12)
    linear = (A * D + 2 * KV * D) * H + A * D * H + 2 * FF * H + FF * H  # one layer's matrices
    assert fp8.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        4 * L * linear / tp / W_H100, rel=1e-12)
    current, _ = _pair(fp8_recipe="current")  # an amax pass first: 2 bytes more an element
    forward = 6 * (T * (A * D + FF) / tp) + 5 * (2 * T * H / 2)
    assert current.breakdown_s["compute/forward/fp8_cast"] == pytest.approx(
        L * m * forward / W_H100, rel=1e-12)


def test_memory_terms_by_hand():
    """TE caches each linear weight in FP8 with its transpose on Hopper (2 bytes per parameter),
    keeps 5 x (1024 + 2) fp32 of delayed-scaling state per GEMM, and saves the GEMM inputs for the
    weight gradients as 1-byte FP8 copies instead of bf16: the QKV and MLP-up inputs (norm
    outputs, T h / r each), the MLP-down input (T f / tp); the attention output stays bf16 for the
    flash backward and gains its FP8 copy (T a d / tp)."""
    fp8, bf16 = _pair()
    linear = (A * D + 2 * KV * D) * H + A * D * H + 2 * FF * H + FF * H
    mem = fp8.memory_breakdown_bytes
    assert mem["fp8/weight_copies"] == pytest.approx(2 * L * linear / 2, rel=1e-12)
    assert mem["fp8/scaling_state"] == pytest.approx(4 * L * 5 * 4 * 1026, rel=1e-12)
    T, tp, inflight = 8192, 2, 1  # 1f1b, one stage: one micro-batch in flight
    per_layer = 2 * (1 - 2) * T * H / 2 + (1 * T * A * D + (1 - 2) * T * FF) / tp
    assert mem["activations/layers"] - bf16.memory_breakdown_bytes["activations/layers"] == \
        pytest.approx(L * inflight * per_layer, rel=1e-9)


def test_the_sequence_parallel_gathers_carry_fp8():
    """TE casts the QKV and MLP-up inputs on the rank's shard, then all-gathers the FP8 copy
    (TE docs, te.Linear walkthrough), and gathers the backward's grad outputs with their
    quantizer (base.py grad_output_preprocess, TE d0067d0), and the inputs it gathers again for
    the weight gradients likewise (layernorm_linear.py ln_out_needs_gather): half the bytes of
    bf16's; every reduce-scatter stays bf16. Delayed scaling adds its amax reductions (below)."""
    model = load_model("llama3-8b")
    fp8 = comm_ledger(model, Plan(**PLAN, dtype="fp8"), "dgx-h100")
    bf16 = comm_ledger(model, Plan(**PLAN, dtype="bf16"), "dgx-h100")
    layer = ("tp/layer/all_gather", "tp/layer/all_gather_again")
    gathers = [(r["name"], r["phase"], r["nbytes"]) for r in fp8 if r["name"] in layer]
    full = 2 * 8192 * H
    assert gathers == [(layer[0], "fwd", full / 2), (layer[0], "bwd", full / 2),
                       (layer[1], "bwd", full / 2)]
    assert [(r["name"], r["nbytes"]) for r in bf16 if r["name"] in layer] == \
        [(layer[0], full), (layer[0], full), (layer[1], full)]
    assert [r["nbytes"] for r in fp8 if r["name"] not in layer + (
        "tp_dp_cp/fp8_amax/all_reduce",)] == \
        [r["nbytes"] for r in bf16 if r["name"] not in layer]


def test_mfu_is_against_the_bf16_peak():
    """torchtitan's MFU (tools/utils.py get_peak_flops: the BF16 peak) for float8 runs too;
    mfu_fp8_peak against the FP8 peak (H100 SXM datasheet: 989.4 and 1978.9 TFLOP/s dense)."""
    fp8, _ = _pair()
    flops_per_gpu_s = fp8.model_flops_per_step / fp8.step_time_s / 8
    assert fp8.mfu == pytest.approx(flops_per_gpu_s / 989.4e12, rel=1e-12)
    assert fp8.mfu_fp8_peak == pytest.approx(flops_per_gpu_s / 1978.9e12, rel=1e-12)
    assert "mfu_fp8_peak" in fp8.to_dict() and "mfu_fp8_peak" not in _pair()[1].to_dict()


def test_the_recipe_is_the_hardwares_default_and_refused_where_not_run():
    model = load_model("llama3-8b")
    plan = Plan(gpus=8, dp=8, global_batch=8, dtype="fp8")
    assert predict(model, "dgx-h100", plan).plan.fp8_recipe.value == "delayed"
    b200 = predict(model, "dgx-b200", plan)
    assert b200.plan.fp8_recipe.value == "mxfp8"  # TE's get_default_fp8_recipe on Blackwell
    # Blackwell: no transposed copy; MXFP8's two copies with their scales
    assert b200.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(
        2 * 33 / 32 * 32 * ((A * D + 2 * KV * D) * H + A * D * H + 3 * FF * H), rel=1e-12)
    with pytest.raises(PlanError, match="fp8_recipe mxfp8: hardware 'dgx-h100' runs"):
        predict(model, "dgx-h100", plan.replace(fp8_recipe="mxfp8"))
    with pytest.raises(PlanError, match="has no peak_flops_per_s.fp8"):
        predict(model, "dgx-a100-80gb", plan)


def test_fp8_output_layer_moves_the_logits_gemm():
    fp8, _ = _pair()
    out, _ = _pair(fp8_output_layer=True)
    assert out.breakdown_s["compute/forward/embedding_logits"] < \
        fp8.breakdown_s["compute/forward/embedding_logits"]
    assert out.memory_breakdown_bytes["fp8/weight_copies"] - \
        fp8.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(2 * 128256 * H / 2)


def test_a_plan_dict_leaves_fp8_fields_out_unless_fp8():
    assert "fp8_recipe" not in Plan(gpus=1).to_dict()
    assert Plan(gpus=1, dtype="fp8").to_dict()["fp8_recipe"] is None
    with pytest.raises(PlanError, match="fp8_recipe applies to dtype fp8"):
        Plan(gpus=1, fp8_recipe="delayed")


def test_cli_predict_and_recommend_fp8(run_cli):
    out = json.loads(run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--dp", "8", "--dtype", "fp8", "--json").stdout)
    assert out["plan"]["dtype"] == "fp8" and out["plan"]["fp8_recipe"] == "delayed"
    assert out["mfu_fp8_peak"] == pytest.approx(out["mfu"] * 989.4 / 1978.9, rel=1e-9)
    assert "compute/forward/fp8_cast" in out["breakdown_s"]
    rec = json.loads(run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "64", "--global-batch", "512", "--dtype", "fp8",
                             "--top", "1", "--json").stdout)
    why = rec["explanation"]["fp8"]
    assert why["recipe"] == "delayed" and why["best_bf16_plan"]
    assert why["wins"] == (why["speedup_over_best_bf16"] > 1)
    assert why["says"].startswith("FP8 is what makes the best plan win" if why["wins"]
                                  else "FP8 does not win here")
    text = run_cli("explain", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                   "--dp", "8", "--dtype", "fp8").stdout
    assert "compute/forward/fp8_cast" in text and "T_fp8_wc" in text and "F_peak_fp8" in text


def test_recommend_fp8_names_a_plan_that_fp8_weights_make_faster():
    """Under ZeRO 3 without --fp8-params TE's per-module caches keep every gathered weight's FP8
    copy through the step: Llama 3.1 405B's whole (2 bytes a weight on Hopper, over tp 2) on
    each of 2,048 H100s, so the FP8 search's best plan (ZeRO 3 pinned) loses to the best bf16
    plan. Held in FP8 (--fp8-params) the copies are each rank's shard, 1 byte over dp: the best
    bf16 plan's layout then fits and beats both, and recommend's FP8 explanation names it."""
    from perfmodel.recommend import FP8_PARAMS_CANDIDATES, best_of, bf16_request, recommend
    from perfmodel.search import SearchRequest
    from perfmodel.strategy import Dtype

    model = load_model("llama3.1-405b", seq_len=8192)
    req = SearchRequest(gpus=(2048,), global_batch=2048, dtype=Dtype.FP8, zero=3)
    rec = recommend(model, H100, req, top=1, prune=True)
    why, best = rec.explanation["fp8"], rec.top[0]
    bf16 = best_of(model, H100, bf16_request(rec.result.request))
    assert not why["wins"] and bf16 is not None and why["best_bf16_plan"] == bf16["plan"]
    assert why["fp8_params_from"] == FP8_PARAMS_CANDIDATES[1]
    plan = Plan(**{**bf16["fields"], "dtype": "fp8", "fp8_recipe": "delayed",
                   "fp8_params": True})
    weights, cached = predict(model, H100, plan), predict(model, H100,
                                                          plan.replace(fp8_params=False))
    assert why["fp8_params_plan"] == bf16["plan"] and plan.zero == 3
    assert why["fp8_params_step_time_s"] == weights.step_time_s == why["fp8_params_objective"]
    assert weights.step_time_s < bf16["step_time_s"] < best.step_time_s
    assert weights.memory_per_gpu_bytes <= rec.result.capacity_bytes \
        < cached.memory_per_gpu_bytes
    copies = "fp8/weight_copies"
    assert cached.memory_breakdown_bytes[copies] == pytest.approx(
        2 * plan.dp * weights.memory_breakdown_bytes[copies], rel=1e-12)
    assert f"With FP8 weights (--fp8-params) the best bf16 plan's layout ({bf16['plan']})" \
        in why["says"]
    held = recommend(model, H100, SearchRequest(gpus=(2048,), global_batch=2048,
                                                dtype=Dtype.FP8, zero=3, fp8_params=True),
                     top=1, prune=True)
    assert held.top[0].step_time_s <= weights.step_time_s
    assert held.explanation["fp8"]["fp8_params_plan"] is None
    assert "--fp8-params" not in held.explanation["fp8"]["says"]


def test_fp8_params_hold_the_linear_weights_in_fp8():
    """fp8_params (TE fp8_model_init; Megatron-LM --fp8-param-gather, NeMo fp8_params): no bf16
    copy of the linear weights (2 bytes each fewer in `weights`), their FP8 data and transpose
    (Hopper: 2 bytes) are the weights; the distributed optimizer (ZeRO 1) all-gathers them at
    1 byte; a step transposes them (read 1, write 1) instead of casting (4)."""
    model = load_model("llama3-8b")
    plan = Plan(**{**PLAN, "zero": 1}, dtype="fp8")
    copies = predict(model, "dgx-h100", plan)
    params = predict(model, "dgx-h100", plan.replace(fp8_params=True))
    linear = L * ((A * D + 2 * KV * D) * H + A * D * H + 2 * FF * H + FF * H) / 2  # tp 2
    assert copies.memory_breakdown_bytes["weights"] - params.memory_breakdown_bytes["weights"] \
        == pytest.approx(2 * linear, rel=1e-12)
    assert params.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(2 * linear)
    assert params.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        copies.breakdown_s["compute/fp8_weight_cast"] * 2 / 4, rel=1e-12)
    gather = {r["name"]: r["nbytes"] for r in comm_ledger(model, plan, "dgx-h100")}
    gather8 = {r["name"]: r["nbytes"] for r in comm_ledger(model, plan.replace(fp8_params=True),
                                                           "dgx-h100")}
    assert gather["dp/all_gather"] - gather8["dp/all_gather"] == pytest.approx((2 - 1) * linear)
    # MXFP8 weights (B200's default recipe) as Megatron-Bridge holds them: no bf16 weights kept,
    # the bf16 weights gathered into the gradient buffer (2 bytes) and cast each step
    mx, mx8 = (predict(model, "dgx-b200", plan.replace(fp8_params=flag)) for flag in (False, True))
    assert mx.memory_breakdown_bytes["weights"] - mx8.memory_breakdown_bytes["weights"] \
        == pytest.approx(2 * linear, rel=1e-12)
    assert mx8.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(
        mx.memory_breakdown_bytes["fp8/weight_copies"], rel=1e-12)
    assert mx8.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        mx.breakdown_s["compute/fp8_weight_cast"], rel=1e-12)
    gather_mx = {r["name"]: r["nbytes"] for r in comm_ledger(
        model, plan.replace(fp8_params=True), "dgx-b200")}
    assert gather_mx["dp/all_gather"] == pytest.approx(gather["dp/all_gather"], rel=1e-12)



def test_fp8_params_under_zero3_are_sharded_and_gathered_in_fp8():
    """fp8_params with ZeRO 3 (Megatron FSDP's --fp8-param-gather): the FP8 weights sharded over
    dp (1 byte each / 4) beside the fp32 master shard, where without them Transformer Engine
    caches whole FP8 copies (2 bytes each on Hopper); each layer unit all-gathered with its FP8
    weights at 1 byte; on Hopper every micro-batch's backward transposes the gathered weights
    again (4 micro-batches: 4 x the ZeRO-1 plan's one transpose a step); on Blackwell a gathered
    FP8 weight takes 1 byte where a bf16 one takes 2; MXFP8 refused."""
    model = load_model("llama3-8b")
    plan = Plan(**{**PLAN, "zero": 3}, dtype="fp8", fp8_recipe="current")
    cached, sharded = (predict(model, "dgx-h100", plan.replace(fp8_params=flag))
                       for flag in (False, True))
    linear = L * ((A * D + 2 * KV * D) * H + A * D * H + 2 * FF * H + FF * H) / 2  # tp 2
    assert sharded.memory_breakdown_bytes["weights"] == cached.memory_breakdown_bytes["weights"]
    assert cached.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(2 * linear)
    assert sharded.memory_breakdown_bytes["fp8/weight_copies"] == pytest.approx(linear / 4)
    assert sharded.memory_breakdown_bytes["buffers/zero3_gather"] == pytest.approx(
        cached.memory_breakdown_bytes["buffers/zero3_gather"], rel=1e-12)  # 1 + 1 = 2 bytes
    gather = {r["name"]: r for r in comm_ledger(model, plan, "dgx-h100")}
    gather8 = {r["name"]: r for r in comm_ledger(model, plan.replace(fp8_params=True),
                                                 "dgx-h100")}
    unit = "dp/fsdp_layer/all_gather"
    assert gather[unit]["nbytes"] - gather8[unit]["nbytes"] == pytest.approx((2 - 1) * linear / L)
    assert gather8[unit]["calls"] == gather[unit]["calls"]
    zero1 = predict(model, "dgx-h100", plan.replace(zero=1, fp8_params=True))
    assert sharded.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        4 * zero1.breakdown_s["compute/fp8_weight_cast"], rel=1e-9)
    b200 = [predict(model, "dgx-b200", plan.replace(fp8_params=flag)) for flag in (False, True)]
    assert b200[0].memory_breakdown_bytes["buffers/zero3_gather"] \
        - b200[1].memory_breakdown_bytes["buffers/zero3_gather"] \
        == pytest.approx((2 - 1) * 2 * linear / L, rel=1e-9)  # the two gathered layers
    assert b200[1].breakdown_s["compute/fp8_weight_cast"] == 0  # no transposes on Blackwell
    with pytest.raises(PlanError, match="not mxfp8"):
        predict(model, "dgx-b200", plan.replace(fp8_recipe=None, fp8_params=True))


def test_the_search_leaves_zero3_out_of_fp8_weights_under_mxfp8_only():
    from perfmodel.search import SearchRequest, search

    model = load_model("llama3-8b")
    for hardware, recipe, zero3 in (("dgx-h100", "current", True), ("dgx-b200", None, False)):
        req = SearchRequest(gpus=(8,), global_batch=16, dtype="fp8", fp8_recipe=recipe,
                            fp8_params=True)
        zeros: set[int] = set()
        search(model, load_hardware(hardware), req,
               on_chunk=lambda chunk, seen=zeros: seen.update(chunk.plans.cols["zero"].tolist()))
        assert (3 in zeros) is zero3, (hardware, zeros)
    with pytest.raises(PlanError, match="not mxfp8"):
        search(model, load_hardware("dgx-b200"),
               SearchRequest(gpus=(8,), global_batch=16, dtype="fp8", fp8_params=True, zero=3))

def test_megatron_mxfp8_weights_need_the_gradient_buffers_reuse(tmp_path):
    """Megatron-Core holds MXFP8 weights without a bf16 buffer only with
    --reuse-grad-buf-for-mxfp8-param-ag (the bf16 weights gathered into the gradient buffer):
    with it --fp8-param-gather is fp8_params, without it the bf16 buffer stays (fp8_params
    false); the emitter writes both flags back."""
    from perfmodel.configs import read_config
    from perfmodel.configs.megatron import megatron_arguments

    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
            "--disable-bias-linear --untie-embeddings-and-output-weights "
            "--use-distributed-optimizer --fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather")
    for extra, want in (("", False), (" --reuse-grad-buf-for-mxfp8-param-ag", True)):
        path = tmp_path / f"mx{len(extra)}.txt"
        path.write_text(args + extra + "\n")
        job = read_config(path)
        assert job.plan["fp8_params"] is want, extra
    model = load_model("llama3-8b")
    plan = Plan(gpus=8, dp=8, global_batch=8, zero=1, dtype="fp8", fp8_recipe="mxfp8",
                fp8_params=True)
    words = " ".join(" ".join(a) for a in megatron_arguments(model, plan))
    assert "--fp8-param-gather --reuse-grad-buf-for-mxfp8-param-ag" in words


@pytest.mark.parametrize("preset, recipe", [("bf16_with_mxfp8_mixed", "mxfp8"),
                                            ("bf16_with_fp8_current_scaling_mixed", "current"),
                                            ("bf16_with_fp8_delayed_scaling_mixed", "delayed")])
def test_bridge_precision_presets_hold_their_weights_in_fp8(tmp_path, preset, recipe):
    """Megatron-Bridge's presets named by their string set fp8_param_gather (mixed_precision.py at
    0465189), MXFP8's with the gradient buffer's reuse: fp8_params; under FSDP the preset's
    FP8 weights are left out with a note."""
    from pathlib import Path

    from perfmodel.configs import read_config

    src = (Path(__file__).resolve().parents[2] / "tests/data/configs/bridge_llama3_8b.yaml"
           ).read_text()
    start = src.index("mixed_precision:")
    end = src.index("model:", start)
    path = tmp_path / "bridge.yaml"
    path.write_text(src[:start] + f"mixed_precision: {preset}\n" + src[end:])
    job = read_config(path)
    assert (job.plan["dtype"], job.plan["fp8_recipe"], job.plan["fp8_params"]) == \
        ("fp8", recipe, True)
    fsdp = (src[:start] + f"mixed_precision: {preset}\n" + src[end:]).replace(
        "  overlap_param_gather: true\n", "  overlap_param_gather: false\n", 1)
    path.write_text(fsdp + "dist:\n  use_torch_fsdp2: true\n")
    job = read_config(path)
    assert not job.plan.get("fp8_params")
    assert any("fp8_param_gather under FSDP is not modelled" in n for n in job.notes)


def test_fp8_weights_under_zero3_kept_gathered_through_the_step_are_transposed_once():
    """fsdp_reshard step: one gather a step, so one transpose of each FP8 weight (as ZeRO 1's)."""
    model = load_model("llama3-8b")
    plan = Plan(**{**PLAN, "tp": 1, "dp": 8, "sequence_parallel": False, "zero": 3},
                dtype="fp8", fp8_recipe="current", fp8_params=True, fsdp_reshard="step")
    zero1 = plan.replace(zero=1, fsdp_reshard="forward")
    kept, once = (predict(model, "dgx-h100", p) for p in (plan, zero1))
    assert kept.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        once.breakdown_s["compute/fp8_weight_cast"], rel=1e-9)
    every = predict(model, "dgx-h100", plan.replace(fsdp_reshard="forward"))
    assert every.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        2 * once.breakdown_s["compute/fp8_weight_cast"], rel=1e-9)  # 16 / (8 x 1): 2 a step


def test_a_tied_output_layer_stays_bf16_in_the_zero3_gather():
    """gpt2-small ties its output layer to the embedding: in FP8 (fp8_output_layer) it is still
    the bf16 embedding's weight where the root unit holds both (pp 1), so only the layers'
    FP8 weights gather at 1 byte on Blackwell."""
    model = load_model("gpt2-small")
    assert model.tied_embeddings
    plan = Plan(gpus=8, dp=8, zero=3, micro_batch=1, global_batch=8, dtype="fp8",
                fp8_recipe="current", fp8_output_layer=True)
    bf16, fp8 = (predict(model, "dgx-b200", plan.replace(fp8_params=flag)).memory_breakdown_bytes
                 for flag in (False, True))
    h, f = model.hidden, model.ffn_hidden
    lin = 4 * h * h + 2 * f * h  # a GPT layer's QKV, output and MLP weights
    assert bf16["buffers/zero3_gather"] - fp8["buffers/zero3_gather"] == pytest.approx(
        (2 - 1) * 2 * lin, rel=1e-9)


def test_the_validation_job_runs_an_fp8_weights_plan_in_bf16():
    from validation.jobspec import without_fp8

    plan = Plan(**{**PLAN, "zero": 1}, dtype="fp8", fp8_params=True, fp8_output_layer=True)
    local = without_fp8(plan)
    assert (local.dtype.value, local.fp8_params, local.fp8_output_layer) == ("bf16", False, False)


def test_recommend_emitting_megatron_keeps_fp8_weights_on_the_distributed_optimizer(run_cli,
                                                                                     tmp_path):
    out = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "16", "--dtype", "fp8", "--fp8-recipe", "current",
                  "--fp8-params", "--tp", "1", "--pp", "1", "--emit-config", "megatron",
                  tmp_path / "out", "--json")
    assert out.returncode == 0, out.stderr
    args = " ".join((tmp_path / "out" / "megatron_args.txt").read_text().split())
    assert "--fp8-param-gather" in args and "--use-torch-fsdp2" not in args
    assert all(p["plan"]["zero"] in (0, 1) for p in json.loads(out.stdout)["plans"])


AMAX_PLAN = dict(gpus=32, dp=8, tp=2, pp=2, sequence_parallel=True, micro_batch=1,
                 global_batch=64, schedule="interleaved", virtual_stages=2)


def test_delayed_scaling_reduces_its_amaxes_per_chunk_and_micro_batch():
    """Transformer Engine all-reduces (MAX) delayed scaling's amaxes when the outermost
    fp8_autocast exits, and the backward's in the autocast's first module (quantization.py,
    reduce_and_update_fp8_tensors, async_op=False), over Megatron-Core's amax reduction group: a
    stage's tp x dp x cp ranks (parallel_state.get_amax_reduction_group); Megatron-Core wraps a
    chunk's block in one autocast under delayed scaling (transformer_block.py). Per micro-batch
    each of the rank's v = 2 chunks reduces once forward, once backward: 8 layers of 4 FP8 GEMMs a
    chunk, 4 bytes x 3 amaxes per GEMM forward, x 2 backward; 8 micro-batches. Over 16 ranks, 8
    per node, exposed: the collective's own time (`perfmodel collective`)."""
    from perfmodel.collective import predict_collective

    plan = Plan(**AMAX_PLAN, dtype="fp8")
    rows = [r for r in comm_ledger("llama3-8b", plan, "dgx-h100")
            if r["name"] == "tp_dp_cp/fp8_amax/all_reduce"]
    gemms = 32 // 2 // 2 * 4
    assert [(r["phase"], r["axis"], r["calls"], r["nbytes"]) for r in rows] == [
        ("fwd", "tp_dp_cp", 8 * 2, 4 * 3 * gemms), ("bwd", "tp_dp_cp", 8 * 2, 4 * 2 * gemms)]
    r = predict("llama3-8b", "dgx-h100", plan)
    each = [predict_collective("all_reduce", n, 16, H100, ranks_per_node=8)["time_s"]
            for n in (4 * 3 * gemms, 4 * 2 * gemms)]
    assert r.breakdown_s["comm/fp8_amax"] == pytest.approx(8 * 2 * sum(each), rel=1e-9)


def test_current_scaling_reduces_the_amax_of_each_gathered_shard_over_tp():
    """Current scaling takes each scale from its tensor: no stage-wide reduction, but a shard
    gathered in FP8 needs the whole tensor's scale, so Transformer Engine all-reduces its amax
    over the tp group and waits (layernorm_linear.py / linear.py set_quantizer_amax_reduction_group
    for a column-parallel input and a row-parallel grad output with sequence parallelism;
    quantizer.cpp allreduce(...)->wait()): per layer the QKV and MLP-up inputs forward, the
    grad outputs of the attention output and MLP down backward, 4 bytes each; 16 layers a stage,
    8 micro-batches; over the tp pair inside a node, exposed."""
    from perfmodel.collective import predict_collective

    plan = Plan(**AMAX_PLAN, dtype="fp8", fp8_recipe="current")
    rows = [r for r in comm_ledger("llama3-8b", plan, "dgx-h100") if "amax" in r["name"]]
    assert {r["name"] for r in rows} == {"tp/fp8_amax/all_reduce"}
    first = [(r["phase"], r["axis"], r["calls"], r["nbytes"]) for r in rows
             if r["stage"] == "first"]
    assert first == [("fwd", "tp", 8 * 16 * 2, 4), ("bwd", "tp", 8 * 16 * 2, 4)]
    one = predict_collective("all_reduce", 4, 2, H100)["time_s"]
    r = predict("llama3-8b", "dgx-h100", plan)
    assert r.breakdown_s["comm/fp8_amax"] == pytest.approx(8 * 16 * 4 * one, rel=1e-9)
    no_sp = Plan(**{**AMAX_PLAN, "sequence_parallel": False}, dtype="fp8", fp8_recipe="current")
    assert not [r for r in comm_ledger("llama3-8b", no_sp, "dgx-h100") if "amax" in r["name"]]


@pytest.mark.parametrize("model, hardware, dtype, recipe", [
    ("llama3-8b", "dgx-h100", "bf16", None), ("llama3-8b", "dgx-b200", "fp8", "mxfp8")])
def test_no_amax_reductions_without_a_per_tensor_scale(model, hardware, dtype, recipe):
    """bf16 has no scales; MXFP8's block scales come from each block of 32 values."""
    plan = Plan(**AMAX_PLAN, dtype=dtype, fp8_recipe=recipe)
    assert not [r for r in comm_ledger(model, plan, hardware) if "amax" in r["name"]]
    assert "comm/fp8_amax" not in predict(model, hardware, plan).breakdown_s
