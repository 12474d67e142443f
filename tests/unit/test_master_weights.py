"""How bf16 mixed precision keeps its master weights (Plan.master_weights): an fp32 copy, the
16-bit remainders Megatron-Core's precision-aware optimizer keeps (OptimizerConfig
store_param_remainders, on by default: "store the 16-bit FP32 parameter remainders in the
optimizer state, excluding the 16 bits shared with the BF16 parameters"; megatron/core/optimizer/
optimizer_config.py), or none (Apex's bf16 optimizer updates the bf16 weights in place)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.costs.precision import (
    megatron_master_weights,
    model_state_bytes_per_param,
    optimizer_step_bytes_per_param,
    sharded_state_bytes_per_param,
)
from perfmodel.strategy import Plan

HW = "dgx-h100"
ROOT = Path(__file__).resolve().parents[2]
ARGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
        "--vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --untie-embeddings-and-output-weights "
        "--tensor-model-parallel-size 1 --use-distributed-optimizer")


@pytest.mark.parametrize(("grads", "states", "master", "want"), [
    (None, None, None, (2, 4, 12)),  # Megatron-LM's 18 bytes
    (None, "bf16", None, (2, 4, 4)),  # Apex with bf16 states: no master
    (None, None, "remainders", (2, 4, 2 + 8)),  # the precision-aware optimizer's default
    ("bf16", "bf16", "remainders", (2, 2, 2 + 4)),  # ... with bf16 moments and main grads
    (None, "bf16", "fp32", (2, 4, 4 + 4)),
    (None, None, "none", (2, 4, 8)),
])
def test_the_bytes_per_parameter_of_each_way(grads, states, master, want):
    got = model_state_bytes_per_param("bf16", grads, states, master)
    assert (got["weights"], got["gradients"], got["optimizer_states"]) == want


def test_fsdp_shards_hold_the_fp32_master_only_where_there_is_one():
    assert sharded_state_bytes_per_param("bf16") == {"weights": 4, "gradients": 4,
                                                     "optimizer_states": 8}
    assert sharded_state_bytes_per_param("bf16", None, "bf16", "fp32")["weights"] == 4
    assert sharded_state_bytes_per_param("bf16", None, "bf16") == model_state_bytes_per_param(
        "bf16", None, "bf16")


def test_the_step_reads_and_writes_the_remainders_beside_the_bf16_weights():
    # fp32 master: read 4, grads 4, moments 8; write 4, moments 8; clip 4, zero 4; copy 4 + 2
    assert optimizer_step_bytes_per_param("bf16", None, None, "fp32") == 42
    # remainders: the bf16 weight and its remainder read and written (4 each way), no copy
    assert optimizer_step_bytes_per_param("bf16", None, None, "remainders") == \
        4 + 4 + 8 + 4 + 8 + 4 + 4


def test_megatron_keeps_remainders_in_bf16_and_under_delayed_scaling_only():
    # OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8: bf16 or delayed FP8
    assert megatron_master_weights(True, None, False) == "remainders"
    assert megatron_master_weights(True, "delayed", False) == "remainders"
    assert megatron_master_weights(True, "current", False) == "fp32"
    assert megatron_master_weights(True, "mxfp8", False) == "fp32"
    assert megatron_master_weights(True, "delayed", True) == "fp32"  # FP8 weights
    assert megatron_master_weights(False, None, False) == "fp32"


def test_predict_counts_the_remainders_in_the_sharded_optimizer_states():
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    base = dict(gpus=8, dp=8, global_batch=64, zero=1)
    fp32 = predict(model, hw, Plan(**base)).memory_breakdown_bytes["optimizer_states"]
    rem = predict(model, hw, Plan(**base, master_weights="remainders")
                  ).memory_breakdown_bytes["optimizer_states"]
    assert rem == pytest.approx(fp32 * 10 / 12, rel=1e-12)


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(master_weights="fp64"), "master_weights must be one of fp32, remainders, none"),
    (dict(master_weights="remainders", dtype="fp32"), "bf16 mixed precision"),
    (dict(master_weights="remainders", zero=3), "FSDP2 keeps the fp32 shard"),
    (dict(master_weights="remainders", dtype="fp8", fp8_params=True), "held in FP8"),
])
def test_plans_refuse_what_no_stack_keeps(kw, needle):
    with pytest.raises(PlanError, match=needle):
        Plan(gpus=8, dp=8, global_batch=8, **kw)
    assert "master_weights" not in Plan(gpus=8, dp=8, global_batch=8).to_dict()


def test_the_search_leaves_zero3_out_with_remainders_and_agrees_with_predict():
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest

    model, hw = load_model("llama3-8b"), load_hardware(HW)
    req = SearchRequest(gpus=(8,), global_batch=64, cp=1, master_weights="remainders")
    assert 3 not in req.zero_stages
    best = recommend(model, hw, req, top=1).top[0]
    assert best.plan.master_weights == "remainders"
    p = predict(model, hw, best.plan)
    assert p.memory_per_gpu_bytes == pytest.approx(best.memory_per_gpu_bytes, rel=1e-6)
    with pytest.raises(PlanError, match="FSDP2"):
        SearchRequest(gpus=(8,), global_batch=64, zero=3, master_weights="remainders")


def _read(run_cli, tmp_path, extra: str, name: str = "args.txt"):
    path = tmp_path / name
    path.write_text(f"{ARGS} {extra}\n")
    return run_cli("predict", "--from-config", path, "--hardware", HW, "--gpus", "8", "--json")


@pytest.mark.parametrize(("extra", "want"), [
    ("--use-precision-aware-optimizer",
     {"master_weights": "remainders"}),
    ("--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 "
     "--exp-avg-sq-dtype bf16",
     {"master_weights": "remainders", "grad_dtype": "bf16", "optimizer_dtype": "bf16"}),
    ("--use-precision-aware-optimizer --no-store-param-remainders",
     {"master_weights": "fp32"}),
    ("--use-precision-aware-optimizer --fp8-format hybrid --fp8-recipe tensorwise",
     {"master_weights": "fp32", "dtype": "fp8"}),
])
def test_megatrons_precision_aware_optimizer_is_read(run_cli, tmp_path, extra, want):
    out = _read(run_cli, tmp_path, extra)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)["plan"]
    assert {k: plan.get(k) for k in want} == want
    assert "--use-precision-aware-optimizer" in out.stderr


@pytest.mark.parametrize(("extra", "needle"), [
    ("--exp-avg-dtype bf16", "with --use-precision-aware-optimizer only"),
    ("--use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8",
     "--exp-avg-dtype fp8: not modelled"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", "one dtype"),
    ("--use-precision-aware-optimizer --main-params-dtype fp16", "--main-params-dtype fp16"),
])
def test_what_is_not_modelled_is_refused_in_one_line(run_cli, tmp_path, extra, needle):
    out = _read(run_cli, tmp_path, extra)
    assert out.returncode != 0 and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_megatron_emitter_writes_what_it_reads(run_cli, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text(f"{ARGS} --use-precision-aware-optimizer --main-grads-dtype bf16 "
                   "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16\n")
    emitted = run_cli("recommend", "--from-config", src, "--hardware", HW, "--gpus", "8",
                      "--emit-config", "megatron", tmp_path / "out", "--json")
    assert emitted.returncode == 0, emitted.stderr
    text = " ".join((tmp_path / "out" / "megatron_args.txt").read_text().split())
    assert "--use-precision-aware-optimizer" in text
    assert "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16" in text
    back = run_cli("predict", "--from-config", tmp_path / "out" / "megatron_args.txt",
                   "--hardware", HW, "--gpus", "8", "--json")
    assert back.returncode == 0, back.stderr
    best = json.loads(emitted.stdout)["plans"][0]
    assert json.loads(back.stdout)["memory_per_gpu_bytes"] == pytest.approx(
        best["memory_per_gpu_bytes"], rel=1e-9)
    from perfmodel.configs.emit import emit

    plan = Plan(gpus=8, dp=8, global_batch=8, master_weights="remainders")
    for fmt in ("torchtitan", "deepspeed"):
        with pytest.raises(PlanError, match="master_weights remainders"):
            emit(fmt, tmp_path, load_model("llama3-8b"), load_hardware(HW), plan, 1.0)
    # Megatron-Core keeps an fp32 master under current scaling: remainders are not written
    current = Plan(gpus=8, dp=8, global_batch=8, dtype="fp8", fp8_recipe="current",
                   master_weights="remainders")
    with pytest.raises(PlanError, match="fp32 master weights there"):
        emit("megatron", tmp_path, load_model("llama3-8b"), load_hardware(HW), current, 1.0)


def test_bridge_yaml_gives_the_optimizer_dtypes_by_torchs_names(tmp_path):
    from perfmodel.configs import read_config

    text = (ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text()
    path = tmp_path / "bridge.yaml"
    path.write_text(text.replace("  optimizer: adam\n", "  optimizer: adam\n"
                                 "  use_precision_aware_optimizer: true\n"
                                 "  exp_avg_dtype: torch.bfloat16\n"
                                 "  exp_avg_sq_dtype: torch.bfloat16\n"
                                 "  main_grads_dtype: torch.float32\n", 1))
    plan = read_config(path).plan
    assert plan["master_weights"] == "remainders" and plan["optimizer_dtype"] == "bf16"
    assert "master_weights" not in read_config(
        ROOT / "tests/data/configs/bridge_llama3_8b.yaml").plan


def test_the_cli_takes_and_refuses_the_option(run_cli):
    out = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                  "--global-batch", "8", "--zero", "1", "--master-weights", "remainders")
    assert out.returncode == 0, out.stderr
    assert "master weights remainders" in out.stdout
    bad = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                  "--global-batch", "8", "--zero", "3", "--master-weights", "remainders")
    assert bad.returncode != 0 and "master_weights" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_validation_refuses_master_weights_its_optimizer_does_not_keep():
    from validation.jobspec import check_job, job_parallel

    model = load_model("tiny-gpt")
    plan = Plan(gpus=2, dp=2, global_batch=2, dtype="bf16", master_weights="remainders")
    with pytest.raises(PlanError, match="fp32 master weights"):
        check_job(model, plan, job_parallel(plan))
