"""Megatron-Core's gradient accumulation fusion switched off (Plan.grad_accumulation_fusion false:
--no-gradient-accumulation-fusion, NeMo's and Megatron-Bridge's gradient_accumulation_fusion
false): each linear layer's weight gradient written in the parameter's dtype and added into the
main gradient by DDP's hook, every micro-batch (perfmodel.step.grad_accumulation):
    compute/backward/grad_accumulation = m (e_w + 2 e_g) P_lin,stage / W_mem     [s per step]
"""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.encode import values_of
from perfmodel.errors import PlanError
from tests.unit.test_bad_input import run_main

HW = "dgx-h100"
TERM = "compute/backward/grad_accumulation"
PLAN = dict(gpus=8, dp=4, tp=2, micro_batch=1, global_batch=16, sequence_parallel=True)  # m 4
ARGS = ("--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 "
        "--max-position-embeddings 4096 --vocab-size 1000 --micro-batch-size 2 "
        "--global-batch-size 32 --bf16 --position-embedding-type rope --swiglu "
        "--disable-bias-linear --hidden-dropout 0 --tensor-model-parallel-size 2 "
        "--untie-embeddings-and-output-weights ")


def _bandwidth(model, plan) -> float:
    return values_of(model, load_hardware(HW), plan)["memory_bandwidth_bytes_per_s"]


def _linear_weights(model, *, output: bool = True) -> int:
    """Every linear weight matrix of the model, by hand: QKV, the attention's output, the
    (gated) MLP's up and down, and the output layer's V h."""
    h, d, f = model.hidden, model.head_dim, model.ffn_hidden
    qkv = h * (model.heads + 2 * model.kv_heads) * d
    mlp = (3 if model.gated_mlp else 2) * f * h
    return model.layers * (qkv + model.heads * d * h + mlp) + output * model.vocab * h


@pytest.mark.parametrize("change, e_w, e_g", [
    (dict(), 2, 4),  # bf16 weights, fp32 main gradients (Megatron-LM's default)
    (dict(grad_dtype="bf16"), 2, 2),  # --grad-reduce-in-bf16
    (dict(dtype="fp32"), 4, 4),  # Megatron-Core's DDP adds fp32 gradients into fp32 main ones
])
def test_the_term_is_the_linear_weights_bytes_over_the_bandwidth(change, e_w, e_g):
    model = load_model("llama3-8b")
    plan = Plan(**PLAN, **change, grad_accumulation_fusion=False)
    got = predict(model, HW, plan).breakdown_s[TERM]
    m, tp = 4, 2
    assert got == pytest.approx(m * (e_w + 2 * e_g) * _linear_weights(model) / tp
                                / _bandwidth(model, plan), rel=1e-12)


def test_with_the_fusion_it_adds_nothing():
    model = load_model("llama3-8b")
    base = predict(model, HW, Plan(**PLAN))
    assert TERM not in base.breakdown_s
    assert predict(model, HW, Plan(**PLAN, grad_accumulation_fusion=True)).step_time_s \
        == base.step_time_s
    off = predict(model, HW, Plan(**PLAN, grad_accumulation_fusion=False))
    assert off.step_time_s - base.step_time_s == pytest.approx(off.breakdown_s[TERM], rel=1e-6)
    assert off.memory_per_gpu_bytes == base.memory_per_gpu_bytes


def test_a_tied_output_layer_is_the_embedding_table_and_not_counted():
    model = load_model("gpt2-small")  # tied embeddings, a GeLU MLP
    assert model.tied_embeddings
    plan = Plan(gpus=8, dp=8, micro_batch=1, global_batch=8, grad_accumulation_fusion=False)
    got = predict(model, HW, plan).breakdown_s[TERM]
    assert got == pytest.approx((2 + 2 * 4) * _linear_weights(model, output=False)
                                / _bandwidth(model, plan), rel=1e-12)


def test_to_dict_and_the_plan_rules():
    assert "grad_accumulation_fusion" not in Plan(**PLAN).to_dict()
    assert Plan(**PLAN, grad_accumulation_fusion=False).to_dict()[
        "grad_accumulation_fusion"] is False
    assert Plan(**PLAN, grad_accumulation_fusion="false").grad_accumulation_fusion is False
    with pytest.raises(PlanError, match="grad_accumulation_fusion must be"):
        Plan(**PLAN, grad_accumulation_fusion="maybe")
    with pytest.raises(PlanError, match="ZeRO 3"):
        Plan(**PLAN, zero=3, grad_accumulation_fusion=False)
    with pytest.raises(PlanError, match="BF16_Optimizer"):
        Plan(gpus=8, dp=8, zero=1, global_batch=8, bf16_optimizer=True,
             grad_accumulation_fusion=False)


def test_a_megatron_args_file_with_the_flag_predicts_slower_by_the_term(tmp_path):
    times = {}
    for name, extra in (("on", ""), ("off", "--no-gradient-accumulation-fusion")):
        path = tmp_path / f"{name}.txt"
        path.write_text(ARGS + extra)
        code, out, err = run_main(["predict", "--from-config", str(path), "--hardware", HW,
                                   "--gpus", "8", "--json"])
        assert code == 0, err
        times[name] = json.loads(out)
    off, on = times["off"], times["on"]
    assert off["plan"]["grad_accumulation_fusion"] is False
    assert "grad_accumulation_fusion" not in on["plan"] and TERM not in on["breakdown_s"]
    # 4 layers of QKV 2048 x 6144, output 2048 x 2048, SwiGLU 3 x 2048 x 5440 (Megatron-LM's
    # int(8/3 h / 64) x 64), the output layer 1024 x 2048 (the vocabulary padded to 128 x tp):
    # over tp 2, 10 bytes each, 4 micro-batches of 2 on dp 4
    from perfmodel.configs import read_config

    assert read_config(tmp_path / "off.txt").model["ffn_hidden"] == 5440
    weights = (4 * (2048 * 6144 + 2048 * 2048 + 3 * 2048 * 5440) + 1024 * 2048) / 2
    model = load_model("llama3-8b")  # the bandwidth is the hardware's
    bandwidth = _bandwidth(model, Plan(**PLAN))
    assert off["breakdown_s"][TERM] == pytest.approx(4 * 10 * weights / bandwidth, rel=1e-9)
    assert off["step_time_s"] - on["step_time_s"] == pytest.approx(off["breakdown_s"][TERM],
                                                                   rel=1e-3)


def test_the_cli_flag_and_its_idle_refusal():
    base = ["predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
            "--global-batch", "64", "--json"]
    code, out, err = run_main([*base, "--no-gradient-accumulation-fusion"])
    assert code == 0, err
    result = json.loads(out)
    assert result["plan"]["grad_accumulation_fusion"] is False and TERM in result["breakdown_s"]
    code, out, err = run_main(["explain", *base[1:-1], "--no-gradient-accumulation-fusion",
                               "--term", TERM])
    assert code == 0 and "(2*e_g + e_w)" in out, err
    code, _, err = run_main([*base, "--zero", "3", "--no-gradient-accumulation-fusion"])
    assert code == 4 and len(err.strip().splitlines()) == 1, err
    assert "grad_accumulation_fusion" in err and "ZeRO 3" in err


def test_the_megatron_writer_round_trip_and_the_other_writers_refuse(tmp_path):
    from perfmodel.configs import read_config
    from perfmodel.configs.emit import emit

    model, hw = load_model("llama3-8b"), load_hardware(HW)
    plan = Plan(**PLAN, grad_accumulation_fusion=False)
    paths = emit("megatron", tmp_path, model, hw, plan, 1.0)
    args = next(p for p in paths if p.name == "megatron_args.txt")
    assert "--no-gradient-accumulation-fusion" in args.read_text().split()
    assert read_config(args).plan["grad_accumulation_fusion"] is False
    # FSDP2 (zero 3): Megatron-LM refuses it with the fusion on; read back as the same cost
    fsdp = Plan(gpus=8, dp=8, global_batch=8, zero=3)
    emit("megatron", tmp_path, model, hw, fsdp, 1.0)
    assert "--no-gradient-accumulation-fusion" in args.read_text().split()
    back = read_config(args).plan
    assert back["zero"] == 3 and "grad_accumulation_fusion" not in back
    for fmt in ("torchtitan", "deepspeed"):
        with pytest.raises(PlanError, match="grad_accumulation_fusion false"):
            emit(fmt, tmp_path, model, hw, Plan(gpus=8, dp=8, global_batch=8,
                                                grad_accumulation_fusion=False), 1.0)


def test_the_validation_job_refuses_it():
    from validation.jobspec import check_job, job_parallel

    plan = Plan(**PLAN, grad_accumulation_fusion=False)
    with pytest.raises(PlanError, match="grad_accumulation_fusion false: the validation job"):
        check_job(load_model("gpt2-small"), plan, job_parallel(plan))


def test_recommend_pins_it_for_every_plan_and_leaves_zero_3_out():
    from perfmodel.search import SearchRequest

    req = SearchRequest(gpus=(8,), global_batch=64, grad_accumulation_fusion=False)
    assert 3 not in req.zero_stages and req.shared()["grad_accumulation_fusion"] is False
    with pytest.raises(PlanError, match="zero 3"):
        SearchRequest(gpus=(8,), global_batch=64, zero=3, grad_accumulation_fusion=False)
    code, out, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", HW, "--gpus",
                               "8", "--global-batch", "64", "--top", "1", "--json",
                               "--no-gradient-accumulation-fusion"])
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    assert best["plan"]["grad_accumulation_fusion"] is False
