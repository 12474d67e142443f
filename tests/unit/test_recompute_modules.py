"""Selective recompute's modules (Plan.recompute_modules, Megatron-Core's --recompute-modules):
what each drops from a layer's kept activations, against hand counts, what its recompute repeats,
and the refusals of what is not modelled."""

from __future__ import annotations

import pytest

from perfmodel import Plan, PlanError, load_hardware, load_model, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron import megatron_arguments
from perfmodel.strategy import plan_from_dict

H100 = load_hardware("dgx-h100")


def _layers(r):
    return r.memory_breakdown_bytes["activations/layers"]


def test_mlp_drops_the_dense_mlps_activations_and_recomputes_them():
    """llama3-8b on tp 8 with sequence parallelism, one micro-batch in flight: each of the 32
    layers no longer keeps its SwiGLU MLP's up, gate and down inputs, 3 e T f / tp bytes
    (Korthikanti et al. 2022, Sec. 4.1's MLP terms, gated)."""
    model = load_model("llama3-8b")
    kw = dict(gpus=8, tp=8, global_batch=8, recompute="selective", sequence_parallel=True,
              flash_attention=True)
    core = predict(model, H100, Plan(**kw))
    both = predict(model, H100, Plan(**kw, recompute_modules="core_attn,mlp"))
    T, f, e = model.seq_len, model.ffn_hidden, 2
    assert _layers(core) - _layers(both) == pytest.approx(32 * 3 * e * T * f / 8, rel=1e-12)
    # the recompute repeats the MLPs' forward: their GEMMs (a third of the backward's two) ...
    extra = both.breakdown_s["compute/recompute"] - core.breakdown_s["compute/recompute"]
    gemm = core.breakdown_s["compute/forward/gemm"]
    assert 0.5 * gemm < extra < gemm  # the MLP: most of a llama layer's linear FLOPs
    # ... and their tensor-parallel collectives
    assert both.breakdown_s["comm/tp"] > core.breakdown_s["comm/tp"]
    assert both.step_time_s > core.step_time_s


def test_without_core_attn_the_attention_core_is_kept():
    """Megatron-Core's modules replace the default: 'mlp' alone does not recompute the attention
    core, whose unfused scores (s^2 per head) are then kept."""
    model = load_model("llama3-8b")
    kw = dict(gpus=8, tp=8, global_batch=8, recompute="selective", sequence_parallel=True,
              flash_attention=False)
    core_and_mlp = predict(model, H100, Plan(**kw, recompute_modules="core_attn,mlp"))
    mlp = predict(model, H100, Plan(**kw, recompute_modules="mlp"))
    assert _layers(mlp) > 2 * _layers(core_and_mlp)
    assert mlp.breakdown_s["compute/recompute"] < core_and_mlp.breakdown_s["compute/recompute"]


def test_mla_up_proj_and_moe_act_drop_their_tensors():
    """DeepSeek-V3 (tp 1, one stage's worth of layers: a pp 16 x ep 64 plan, first stage 4
    layers, 3 dense): mla_up_proj frees Q, K (e T a d_qk) and V (e T a d_v) of every layer;
    moe_act the routed experts' activation output, e A_r f_E of each MoE layer (bf16)."""
    model = load_model("deepseek-v3")
    kw = dict(gpus=1024, dp=64, pp=16, ep=64, global_batch=1024, recompute="selective",
              flash_attention=True, first_stage_layers=4, last_stage_layers=1)
    base = _first_stage(model, Plan(**kw))
    up = _first_stage(model, Plan(**kw, recompute_modules="core_attn,mla_up_proj"))
    act = _first_stage(model, Plan(**kw, recompute_modules="core_attn,moe_act"))
    T, a, e = model.seq_len, model.heads, 2
    d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    inflight = 16  # 1F1B: min(pp, m) micro-batches on the first stage
    assert base - up == pytest.approx(inflight * 4 * e * T * a * (2 * d_qk + model.v_head_dim),
                                      rel=1e-9)
    # the first stage's one MoE layer (layer 3) drops e A_r f_E: A_r the rows of its busiest
    # rank's experts, T k on average (k experts a token) times the routing imbalance
    rows = (base - act) / inflight / (e * model.expert_ffn_hidden)
    assert rows == pytest.approx(T * model.top_k * model.routing_imbalance, rel=1e-9)
    fp8 = dict(kw, dtype="fp8")  # the down projections keep their FP8 copy: nothing dropped
    assert _first_stage(model, Plan(**fp8, recompute_modules="core_attn,moe_act")) \
        == pytest.approx(_first_stage(model, Plan(**fp8)), rel=1e-12)


def test_layernorm_drops_each_moe_layers_pre_mlp_norm_output():
    """Megatron-Core's layernorm module on Qwen3-30B-A3B (48 MoE layers, tp 2 with sequence
    parallelism: r = 2): the pre-MLP norm's output, e T h / r, freed in every MoE layer, and the
    norm's forward (read and write e T h / r) repeated."""
    model = load_model("qwen3-30b-a3b")
    kw = dict(gpus=8, dp=4, tp=2, ep=4, global_batch=4, recompute="selective",
              sequence_parallel=True)
    act = predict(model, H100, Plan(**kw, recompute_modules="moe_act"))
    norm = predict(model, H100, Plan(**kw, recompute_modules="moe_act,layernorm"))
    e, T, h, r = 2, model.seq_len, model.hidden, 2
    assert _layers(act) - _layers(norm) == pytest.approx(model.layers * e * T * h / r, rel=1e-9)
    bandwidth = H100.memory_bandwidth_bytes_per_s * H100.memory_bandwidth_efficiency
    assert norm.breakdown_s["compute/recompute"] - act.breakdown_s["compute/recompute"] == \
        pytest.approx(model.layers * 2 * e * T * h / r / bandwidth, rel=1e-9)


def _first_stage(model, plan):
    from perfmodel.evaluate import compile_family, family_of, values_of

    out = compile_family(family_of(model, H100, plan))(values_of(model, H100, plan))
    return float(out["memory:first:activations/layers"])


@pytest.mark.parametrize("kw, why", [
    (dict(recompute="full", recompute_modules="mlp"), "apply to recompute selective"),
    (dict(recompute="selective", recompute_modules="moe"), "whole MoE layer"),
    (dict(recompute="selective", recompute_modules="attn"), "must be some of"),
    (dict(recompute="selective", recompute_modules="mlp,mlp"), "twice"),
    (dict(recompute="selective", recompute_modules="mlp", tp=4, tp_layout="2d"),
     "tp_layout 1d"),
])
def test_what_is_not_modelled_is_refused(kw, why):
    with pytest.raises(PlanError, match=why):
        Plan(**{"gpus": 4, "global_batch": 4, **kw})


def test_a_module_the_model_lacks_is_refused():
    plan = Plan(gpus=1, recompute="selective", recompute_modules="mla_up_proj")
    with pytest.raises(PlanError, match="no multi-head latent attention"):
        plan.check(load_model("llama3-8b"))
    with pytest.raises(PlanError, match="no routed experts"):
        plan.replace(recompute_modules="moe_act").check(load_model("llama3-8b"))
    with pytest.raises(PlanError, match="no shared experts"):
        plan.replace(recompute_modules="shared_experts").check(load_model("mixtral-8x7b"))
    with pytest.raises(PlanError, match="no norm outside Transformer Engine's linear layers"):
        plan.replace(recompute_modules="layernorm").check(load_model("llama3-8b"))
    assert plan.replace(recompute_modules=["core_attn"]).recompute_modules == ()  # the default


def test_megatron_reads_and_writes_the_modules(tmp_path):
    base = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 "
            "--global-batch-size 8 --bf16 --recompute-granularity selective ")
    path = tmp_path / "args.txt"
    path.write_text(base + "--recompute-modules mlp core_attn")
    job = read_config(path)
    spec = resolve_model(job, None, None)
    spec, fields = resolve_plan(job, spec, {"gpus": 1})
    assert fields["recompute_modules"] == "core_attn,mlp"
    args = [a for group in megatron_arguments(spec, plan_from_dict(fields).check(spec))
            for a in group]
    at = args.index("--recompute-modules")
    assert args[at + 1:at + 3] == ["core_attn", "mlp"]
    path.write_text(base + "--recompute-modules moe")
    with pytest.raises(PlanError, match="--recompute-modules"):
        resolve_plan(read_config(path), spec, {"gpus": 1})
    path.write_text(base)  # Megatron's default: the attention core
    _, fields = resolve_plan(read_config(path), spec, {"gpus": 1})
    assert not fields.get("recompute_modules")
