"""FP8 training of mixtures of experts, MLA and MTP (perfmodel.step.fp8, docs/fp8.md, docs/moe.md):
the FP8 weight copies, the scaling state, the weights' casts, the GEMM inputs' casts, the FP8
parameter gathers and the FP8 copies in the activations of an MoE layer (its attention, shared
experts and its rank's routed experts; the router bf16), of multi-head latent attention (its
projections) and of the MTP modules, each against a hand count from the preset's fields.

Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1): 32 layers, dim 4096, 32 heads of
128, 8 kv heads, hidden_dim 14336 (SwiGLU), 8 experts, top 2, vocab 32000.
DeepSeek-V3 (DeepSeek-V3 Technical Report, Sec. 4.2; deepseek-ai/DeepSeek-V3 config.json): 61
layers, hidden 7168, 128 heads, MLA q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64,
v 128; the first 3 layers dense (18432), the other 58 with 1 shared and 256 routed experts of
2048, top 8; 1 MTP module.
H100 SXM: 3.35 TB/s HBM3 (datasheet) x the copy kernels' efficiency 0.88 (the dgx-h100 preset);
delayed scaling on Hopper: a cast moves 2 + 1 + 1 bytes, a weight copy is 1 + 1 (rowwise and its
transpose), a saved GEMM input 1 byte, 5 x (1024 + 2) fp32 of scaling state per GEMM (TE docs;
perfmodel.costs.fp8, checked in test_fp8.py).
"""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, load_hardware, predict
from perfmodel.evaluate import compile_family, family_of, values_of
from perfmodel.predict import comm_ledger, resolve_inputs
from perfmodel.specs.model import TransformerSpec

W = 3.35e12 * 0.88  # dgx-h100's effective memory bandwidth [B/s]
Q8, COPY8, SAVED8, E = 4, 2, 1, 2  # delayed scaling on Hopper: cast, weight copy, saved; bf16
SCALING = 5 * 4 * (1024 + 2)  # bytes of delayed-scaling state per GEMM
STAGES = ("first", "middle", "last")

# Mixtral 8x7B
MX_H, MX_A, MX_KV, MX_D, MX_F, MX_E, MX_K, MX_L = 4096, 32, 8, 128, 14336, 8, 2, 32
MX_PLAN = dict(gpus=64, dp=8, tp=2, pp=4, sequence_parallel=True, global_batch=256, dtype="fp8")
# DeepSeek-V3
DS_H, DS_A, DS_RQ, DS_RKV, DS_NOPE, DS_ROPE, DS_V = 7168, 128, 1536, 512, 128, 64, 128
DS_F, DS_FE, DS_FSH, DS_E, DS_K = 18432, 2048, 2048, 256, 8
DS_PLAN = dict(gpus=1024, dp=32, tp=2, ep=64, pp=16, first_stage_layers=4, last_stage_layers=1,
               sequence_parallel=True, global_batch=1024, recompute="full", dtype="fp8")


def _out(model, plan):
    """Every stage's numbers of one plan on dgx-h100 (memory:<stage>:<term>, time:<stage>:...)."""
    model, hw, plan = resolve_inputs(model, "dgx-h100", plan)
    return compile_family(family_of(model, hw, plan))(values_of(model, hw, plan))


def _mixtral_weights(tp, ep, etp):
    """One Mixtral MoE layer's FP8 weights on one GPU: (QKV and output / tp, the rank's E / ep
    experts, each (2 f h + f h) / etp)."""
    attention = ((MX_A * MX_D + 2 * MX_KV * MX_D) * MX_H + MX_A * MX_D * MX_H) / tp
    return attention, MX_E / ep * 3 * MX_F * MX_H / etp


@pytest.mark.parametrize(("ep", "etp"), [(8, 1), (4, 2)])
def test_mixtral_fp8_weight_copies_and_scaling_state_per_stage(ep, etp):
    """8 MoE layers a stage: each keeps the FP8 copies (2 bytes: data and transpose) of its
    attention's weights and of its rank's routed experts, and one scaling-state set per GEMM:
    QKV, output, and fc1 and fc2 of each local expert (TE GroupedLinear: one per GEMM of its
    num_gemms); the router has none (bf16)."""
    out = _out("mixtral-8x7b", Plan(**MX_PLAN, ep=ep, etp=etp))
    attention, experts = _mixtral_weights(2, ep, etp)
    n = MX_L // 4
    for st in STAGES:
        assert float(out[f"memory:{st}:fp8/weight_copies"]) == pytest.approx(
            COPY8 * n * (attention + experts), rel=1e-12), st
        assert float(out[f"memory:{st}:fp8/scaling_state"]) == pytest.approx(
            SCALING * n * (2 + 2 * MX_E / ep), rel=1e-12), st
    # ep 8, etp 1: 8 x (20,971,520 + 176,160,768) = 1,577,058,304 FP8 weights per GPU
    if ep == 8:
        assert n * (attention + experts) == 1_577_058_304


def test_mixtral_fp8_casts_by_hand():
    """Per MoE layer and micro-batch (T = 32768 tokens, tp 2 with sequence parallelism: r = 2;
    T_r = T / 2 routed by each rank, k = 2, balanced: A_r = T_r k = T rows received):
    forward  the QKV input T h / r, the output projection's T a d / tp, the experts' up inputs
             etp A_r h (the gathered rows) and down inputs A_r f;
    backward the output projection's grad output T h / r, QKV's T (a d + 2 kv d) / tp, the
             experts' down grad outputs etp A_r h and up (with its gate) 2 A_r f;
    8 layers on the slowest stage, 32 micro-batches; the weights once per step, every layer's."""
    for ep, etp in ((8, 1), (4, 2)):
        r = predict("mixtral-8x7b", "dgx-h100", Plan(**MX_PLAN, ep=ep, etp=etp))
        T, rr, tp, m, n = 32768, 2, 2, 256 // 8, 8
        A_r = T / 2 * MX_K
        forward = T * MX_H / rr + T * MX_A * MX_D / tp + A_r * (etp * MX_H + MX_F)
        backward = T * MX_H / rr + T * (MX_A * MX_D + 2 * MX_KV * MX_D) / tp \
            + A_r * (etp * MX_H + 2 * MX_F)
        # the attention's QKV input and output grad are gathered (SP); the experts' are not
        forward, backward = _cast_bytes(forward, backward, T * MX_H, T * MX_H, tp)
        assert r.breakdown_s["compute/forward/fp8_cast"] == pytest.approx(
            n * m * forward / W, rel=1e-12)
        assert r.breakdown_s["compute/backward/fp8_cast"] == pytest.approx(
            n * m * backward / W, rel=1e-12)
        attention, experts = _mixtral_weights(2, ep, etp)
        assert r.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
            Q8 * MX_L * (attention + experts) / W, rel=1e-12)


def test_mixtral_fp8_params_drop_the_bf16_weights_and_gather_in_fp8():
    """fp8_params with the distributed optimizer (ZeRO 1): each stage's `weights` lose 2 bytes per
    FP8 weight (the attention's and the routed experts'); the dp group all-gathers the
    attention's at 1 byte (dp/all_gather: 8 P_att fewer bytes), the expert-data-parallel group
    the experts' (edp/all_gather: 1 byte each instead of 2); a step transposes them (2 bytes
    per weight) instead of casting (4)."""
    plan = Plan(**MX_PLAN, ep=8, zero=1)
    copies, params = _out("mixtral-8x7b", plan), _out("mixtral-8x7b", plan.replace(fp8_params=True))
    attention, experts = _mixtral_weights(2, 8, 1)
    n = MX_L // 4
    for st in STAGES:
        assert float(copies[f"memory:{st}:weights"]) - float(params[f"memory:{st}:weights"]) \
            == pytest.approx(E * n * (attention + experts), rel=1e-12), st
        assert float(params[f"memory:{st}:fp8/weight_copies"]) == pytest.approx(
            COPY8 * n * (attention + experts), rel=1e-12)
    gather = {r["name"]: r["nbytes"] for r in comm_ledger("mixtral-8x7b", plan, "dgx-h100")}
    gather8 = {r["name"]: r["nbytes"] for r in comm_ledger(
        "mixtral-8x7b", plan.replace(fp8_params=True), "dgx-h100")}
    assert gather["dp/all_gather"] - gather8["dp/all_gather"] == pytest.approx(
        (E - 1) * n * attention, rel=1e-12)
    assert gather["edp/all_gather"] == pytest.approx(E * n * experts, rel=1e-12)
    assert gather8["edp/all_gather"] == pytest.approx(1 * n * experts, rel=1e-12)
    both = [predict("mixtral-8x7b", "dgx-h100", p)
            for p in (plan, plan.replace(fp8_params=True))]
    assert both[1].breakdown_s["comm/dp"] < both[0].breakdown_s["comm/dp"]
    assert both[1].breakdown_s["compute/fp8_weight_cast"] == pytest.approx(
        both[0].breakdown_s["compute/fp8_weight_cast"] * 2 / Q8, rel=1e-12)


def test_mixtral_fp8_activations_keep_the_experts_inputs_in_fp8():
    """What an fp8 plan keeps beyond bf16's per MoE layer and micro-batch (recompute none): the
    QKV input and the output projection's FP8 copies as a dense layer's ((1 - 2) T h / r and
    1 x T a d / tp beside the flash kernel's bf16 output), the routed experts' up and down inputs
    in FP8 ((1 - 2) (A_r h + A_r f)); the MLP input stays bf16 for the router. 8 layers x the
    micro-batches in flight: 4, 3, 1 on the first, a middle and the last stage (1f1b, pp 4)."""
    plan = Plan(**MX_PLAN, ep=8)
    fp8, bf16 = _out("mixtral-8x7b", plan), _out("mixtral-8x7b", plan.replace(dtype="bf16"))
    T, rr, tp = 32768, 2, 2
    A_r = T / 2 * MX_K
    per_layer = (SAVED8 - E) * T * MX_H / rr + SAVED8 * T * MX_A * MX_D / tp \
        + (SAVED8 - E) * (A_r * MX_H + A_r * MX_F)
    for st, inflight in zip(STAGES, (4, 3, 1), strict=True):
        key = f"memory:{st}:activations/layers"
        assert float(fp8[key]) - float(bf16[key]) == pytest.approx(
            8 * inflight * per_layer, rel=1e-9), st


def _ds_weights(tp=2, ep=64):
    """DeepSeek-V3's FP8 weights on one GPU: (MLA's projections, a dense layer's, an MoE layer's
    all but the experts', its routed experts', an MTP module's projection)."""
    d_qk = DS_NOPE + DS_ROPE
    mla = (DS_RQ * DS_A * d_qk + DS_RKV * DS_A * (DS_NOPE + DS_V) + DS_A * DS_V * DS_H) / tp \
        + DS_H * DS_RQ + DS_H * (DS_RKV + DS_ROPE)  # the down projections whole on every rank
    dense = mla + 3 * DS_F * DS_H / tp
    moe_rest = mla + 3 * DS_FSH * DS_H / tp
    experts = DS_E / ep * 3 * DS_FE * DS_H
    return mla, dense, moe_rest, experts, 2 * DS_H * DS_H / tp


def test_deepseek_v3_fp8_weights_scaling_state_and_weight_cast_by_hand():
    """pp 16 with 4 layers on the first stage (3 dense, 1 MoE), 4 MoE on each middle one, 1 MoE
    and the MTP module (its projection and an MoE layer) on the last. GEMMs with scaling state:
    MLA 5 (q_down, q_up, kv_down, kv_up, output), a dense MLP 2, an MoE layer's shared experts 2
    and 2 per local expert (256 / 64 = 4), the MTP projection 1."""
    out = _out("deepseek-v3", Plan(**DS_PLAN))
    mla, dense, moe_rest, experts, projection = _ds_weights()
    assert mla == 85_983_232 + 15_138_816
    moe = moe_rest + experts
    weights = {"first": 3 * dense + moe, "middle": 4 * moe, "last": moe + projection + moe}
    dense_gemms, moe_gemms = 5 + 2, 5 + 2 + 2 * 4
    gemms = {"first": 3 * dense_gemms + moe_gemms, "middle": 4 * moe_gemms,
             "last": moe_gemms + 1 + moe_gemms}
    for st in STAGES:
        assert float(out[f"memory:{st}:fp8/weight_copies"]) == pytest.approx(
            COPY8 * weights[st], rel=1e-12), st
        assert float(out[f"memory:{st}:fp8/scaling_state"]) == pytest.approx(
            SCALING * gemms[st], rel=1e-12), st
    r = predict("deepseek-v3", "dgx-h100", Plan(**DS_PLAN))
    every_layer = 3 * dense + 58 * moe + projection + moe  # the model's, and the MTP module's
    assert r.breakdown_s["compute/fp8_weight_cast"] == pytest.approx(Q8 * every_layer / W,
                                                                     rel=1e-12)


def _cast_bytes(forward, backward, gathered_forward, gathered_backward, tp):
    """Bytes of the casts (forward, backward) on Hopper with delayed scaling, from the elements
    cast (Q8 = 4 each) and the elements sequence parallelism gathers in FP8, whole: a gathered
    shard writes no transposed copy (1 byte fewer an element), the backward transposes every
    gathered tensor (read 1, write 1)."""
    return (Q8 * forward - gathered_forward / tp,
            Q8 * backward - gathered_backward / tp + 2 * (gathered_forward + gathered_backward))


def _mla_casts(T, rr, tp):
    """MLA's elements cast per layer and micro-batch (forward, backward): the normed input for
    each down projection, the latents (r_q, r_kv) on the shard, the output projection's input;
    the grad outputs of the output, the up projections (a (d_qk + d_nope + d_v) / tp) and the
    down projections (r_q + r_kv + d_rope on the rank's tokens)."""
    d_qk = DS_NOPE + DS_ROPE
    forward = 2 * T * DS_H / rr + T * (DS_RQ + DS_RKV) / rr + T * DS_A * DS_V / tp
    backward = T * DS_H / rr + T * DS_A * (d_qk + DS_NOPE + DS_V) / tp \
        + T * (DS_RQ + DS_RKV + DS_ROPE) / rr
    return forward, backward


def test_deepseek_v3_fp8_casts_by_hand():
    """T = 4096, tp 2 with sequence parallelism (r = 2), 32 micro-batches. An MoE layer: MLA's
    casts, the shared experts' as a dense MLP's (T h / r + T f_sh / tp forward), the routed
    experts' (A_r = T / 2 x 8 rows: A_r (h + f_E) forward, A_r (h + 2 f_E) backward); a dense
    layer MLA's and its MLP's; the MTP module's layer and its projection (input 2 T h / r,
    grad output T h / tp)."""
    out = _out("deepseek-v3", Plan(**DS_PLAN))
    T, rr, tp, m = 4096, 2, 2, 32
    A_r = T / 2 * DS_K
    mla_f, mla_b = _mla_casts(T, rr, tp)
    moe_f = mla_f + T * DS_H / rr + T * DS_FSH / tp + A_r * (DS_H + DS_FE)
    moe_b = mla_b + T * DS_H / rr + T * 2 * DS_FSH / tp + A_r * (DS_H + 2 * DS_FE)
    dense_f = mla_f + T * DS_H / rr + T * DS_F / tp
    dense_b = mla_b + T * DS_H / rr + T * 2 * DS_F / tp
    # gathered in FP8 (SP), whole: MLA's latents and its output's grad; the MLP's (the shared
    # experts') up input and down grad
    g_f, g_b = T * (DS_RQ + DS_RKV) + T * DS_H, 2 * T * DS_H
    dense = _cast_bytes(dense_f, dense_b, g_f, g_b, tp)
    moe = _cast_bytes(moe_f, moe_b, g_f, g_b, tp)
    mtp = _cast_bytes(2 * T * DS_H / rr, T * DS_H / tp, 0, 0, tp)  # the projection's
    forward = {"first": 3 * dense[0] + moe[0], "middle": 4 * moe[0], "last": 2 * moe[0] + mtp[0]}
    backward = {"first": 3 * dense[1] + moe[1], "middle": 4 * moe[1],
                "last": 2 * moe[1] + mtp[1]}
    for st in STAGES:
        assert float(out[f"time:{st}:compute/forward/fp8_cast"]) == pytest.approx(
            m * forward[st] / W, rel=1e-12), st
        assert float(out[f"time:{st}:compute/backward/fp8_cast"]) == pytest.approx(
            m * backward[st] / W, rel=1e-12), st


def test_deepseek_v3_fp8_predicts_and_is_faster_than_bf16():
    fp8 = predict("deepseek-v3", "dgx-h100", Plan(**DS_PLAN))
    bf16 = predict("deepseek-v3", "dgx-h100", Plan(**{**DS_PLAN, "dtype": "bf16"}))
    assert fp8.step_time_s < bf16.step_time_s
    assert fp8.breakdown_s["compute/forward/gemm"] < bf16.breakdown_s["compute/forward/gemm"]
    for term in ("compute/forward/attention", "comm/ep"):  # bf16 in both
        assert fp8.breakdown_s[term] == pytest.approx(bf16.breakdown_s[term], rel=1e-12), term
    assert fp8.parameters == bf16.parameters


# a dense model with DeepSeek-V3's attention (MLA), 4 layers: MLA without experts
MLA_DENSE = TransformerSpec(
    name="mla-dense", kind="transformer", layers=4, hidden=DS_H, heads=DS_A, seq_len=4096,
    vocab=129280, ffn_hidden=DS_F, gated_mlp=True, tied_embeddings=False, bias=False,
    norm="rmsnorm", position_embedding="rotary", q_lora_rank=DS_RQ, kv_lora_rank=DS_RKV,
    qk_nope_head_dim=DS_NOPE, qk_rope_head_dim=DS_ROPE, v_head_dim=DS_V)
MLA_PLAN = Plan(gpus=8, dp=4, tp=2, sequence_parallel=True, micro_batch=1, global_batch=8,
                flash_attention=True, dtype="fp8")


def _gemm_s(m, n, k, g, peak, bpe, out_bpe):
    """One GEMM by the roofline of perfmodel.costs.gemm_efficiency, written out by hand."""
    eff = g.max_fraction * m / (m + g.m_half_dim) * n / (n + g.n_half_dim) \
        * k / (k + g.k_half_dim) * 1 / (1 + g.batch_half)
    return g.min_time_s + max(2 * m * n * k / (peak * eff),
                              (bpe * (m * k + k * n) + out_bpe * m * n) / W)


def test_mla_projections_run_on_the_fp8_device():
    """MLA's five projections and the MLP at the H100's FP8 peak (1978.9 TFLOP/s, datasheet) and
    FP8 fit, 1-byte operands, bf16 outputs: the down projections over the rank's T / 2 tokens,
    the up projections and the output split by heads over tp 2."""
    r = predict(MLA_DENSE, "dgx-h100", MLA_PLAN)
    g = load_hardware("dgx-h100").training_gemm("fp8")
    T, tp = 4096, 2
    shapes = [(T / 2, DS_RQ, DS_H), (T, DS_A * (DS_NOPE + DS_ROPE) / tp, DS_RQ),
              (T / 2, DS_RKV + DS_ROPE, DS_H), (T, DS_A * (DS_NOPE + DS_V) / tp, DS_RKV),
              (T, DS_H, DS_A * DS_V / tp), (T, 2 * DS_F / tp, DS_H), (T, DS_H, DS_F / tp)]
    per_layer = sum(_gemm_s(m, n, k, g, 1978.9e12, 1, 2) for m, n, k in shapes)
    assert r.breakdown_s["compute/forward/gemm"] == pytest.approx(4 * 2 * per_layer, rel=1e-9)
    mla_f, mla_b = _mla_casts(T, 2, tp)
    forward, _ = _cast_bytes(mla_f + T * DS_H / 2 + T * DS_F / tp, mla_b,
                             T * (DS_RQ + DS_RKV) + T * DS_H, 2 * T * DS_H, tp)
    assert r.breakdown_s["compute/forward/fp8_cast"] == pytest.approx(4 * 2 * forward / W,
                                                                      rel=1e-12)


def test_mla_latent_gathers_carry_fp8_and_its_activations_its_copies():
    """The query and key/value latents are gathered after Transformer Engine's cast (1 byte),
    the rotary key in bf16 (Megatron-Core gathers it apart); the backward gathers the output's
    grad in FP8 too (TE's grad_output_preprocess quantizes before its gather), and the two
    latents again for the up projections' weight gradients, in FP8 as in the forward.
    Activations: the normed input kept as one FP8 copy per down
    projection instead of one bf16 ((2 - 2) T h / r), the latents the up projections read in
    FP8 ((1 - 2) T (r_q + r_kv)), the output projection's FP8 copy (T a d_v / tp), and the MLP's
    as a dense layer's ((1 - 2) T h / r and (1 - 2) T f / tp); 4 layers, 1 micro-batch in
    flight."""
    fp8 = [(r["name"][7:], r["phase"], r["nbytes"])
           for r in comm_ledger(MLA_DENSE, MLA_PLAN, "dgx-h100")
           if r["name"] in ("tp/mla/all_gather", "tp/mla/all_gather_again")]
    T = 4096
    assert fp8 == [("all_gather", "fwd", T * DS_RQ), ("all_gather", "fwd", T * DS_RKV),
                   ("all_gather", "fwd", E * T * DS_ROPE), ("all_gather", "bwd", T * DS_H),
                   ("all_gather_again", "bwd", T * DS_RQ),
                   ("all_gather_again", "bwd", T * DS_RKV)]
    out = _out(MLA_DENSE, MLA_PLAN)
    bf16 = _out(MLA_DENSE, MLA_PLAN.replace(dtype="bf16"))
    rr, tp = 2, 2
    per_layer = (2 * SAVED8 - E) * T * DS_H / rr + (SAVED8 - E) * T * (DS_RQ + DS_RKV) \
        + SAVED8 * T * DS_A * DS_V / tp + (SAVED8 - E) * T * DS_H / rr \
        + (SAVED8 - E) * T * DS_F / tp
    key = "memory:first:activations/layers"
    assert float(out[key]) - float(bf16[key]) == pytest.approx(4 * per_layer, rel=1e-9)


def test_dense_fp8_weight_copies_follow_each_stages_layers():
    """Regression: the FP8 copies and scaling state of every stage were counted with the first
    stage's layers; an uneven split (Llama 3 405B, 126 layers: 7 on the first and the last stage,
    8 on each of the 14 between) gives each stage its own."""
    kw = dict(gpus=128, tp=8, pp=16, global_batch=16, sequence_parallel=True, dtype="fp8",
              first_stage_layers=7, last_stage_layers=7)
    out = _out("llama3-405b", Plan(**kw))
    # Llama 3 405B (Meta's Llama 3 card): hidden 16384, 128 heads of 128, 8 kv heads, 53248
    h, a, kv, d, f = 16384, 128, 8, 128, 53248
    linear = ((a * d + 2 * kv * d) * h + a * d * h + 3 * f * h) / 8
    for st, n in (("first", 7), ("middle", 8), ("last", 7)):
        assert float(out[f"memory:{st}:fp8/weight_copies"]) == pytest.approx(
            COPY8 * n * linear, rel=1e-12), st
        assert float(out[f"memory:{st}:fp8/scaling_state"]) == pytest.approx(
            SCALING * 4 * n, rel=1e-12), st


def test_cli_predict_and_recommend_fp8_moe(run_cli):
    """The issue's plan predicts (it was refused), and `recommend --dtype fp8` on Mixtral says
    whether FP8 is what makes the best plan win."""
    out = json.loads(run_cli(
        "predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--gpus", "64", "--dp",
        "8", "--tp", "2", "--ep", "8", "--pp", "4", "--sequence-parallel", "--global-batch",
        "256", "--dtype", "fp8", "--json").stdout)
    assert out["plan"]["dtype"] == "fp8" and out["plan"]["ep"] == 8
    assert out["memory_breakdown_bytes"]["fp8/weight_copies"] == pytest.approx(
        COPY8 * 1_577_058_304, rel=1e-12)
    rec = json.loads(run_cli(
        "recommend", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--gpus", "64",
        "--global-batch", "256", "--seq-len", "4096", "--dtype", "fp8", "--top", "1",
        "--json").stdout)
    why = rec["explanation"]["fp8"]
    assert why["recipe"] == "delayed" and why["best_bf16_plan"]
    assert why["wins"] == (why["speedup_over_best_bf16"] > 1)
    assert why["says"].startswith("FP8 is what makes the best plan win" if why["wins"]
                                  else "FP8 does not win here")


def test_recommend_fp8_params_compares_with_bf16_without_the_fp8_fields():
    """Regression: `recommend --dtype fp8 --fp8-params` searched bf16 with fp8_params still set
    and failed ("fp8_params applies to dtype fp8, not bf16"); its bf16 comparison leaves every
    fp8-only field off."""
    from perfmodel import load_model
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest
    from perfmodel.strategy import Dtype

    req = SearchRequest(gpus=(8,), global_batch=64, dtype=Dtype.FP8, fp8_params=True, tp=2,
                        pp=1)
    rec = recommend(load_model("llama3-8b"), load_hardware("dgx-h100"), req, top=1)
    why = rec.explanation["fp8"]
    assert rec.top[0].plan.fp8_params and why["best_bf16_plan"]
    assert why["same_plan_in_bf16_s"] > 0 and why["wins"] == (why["speedup_over_best_bf16"] > 1)
