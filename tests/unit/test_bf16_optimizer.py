"""DeepSpeed's BF16_Optimizer (Plan.bf16_optimizer; Megatron-DeepSpeed's bf16 at ZeRO stage 0):
after every micro-batch's backward it adds the bf16 gradients into whole fp32 ones, 18 bytes a
parameter moved (deepspeed/runtime/bf16_optimizer.py update_hp_grads: lp.grad.to(fp32), read 2
and write 4; hp_grad.add_, read 4 and 4, write 4), and after the last it all-reduces the fp32
gradients (the pipeline engine's _bf16_reduce_grads) where Megatron's distributed optimizer
reduce-scatters them; the bf16 gradients stay beside the fp32 ones until the next backward."""

from __future__ import annotations

import pytest

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.encode import values_of
from perfmodel.errors import PlanError
from perfmodel.predict import comm_ledger

PLAN = dict(gpus=8, dp=8, zero=1, micro_batch=1, global_batch=32)  # 4 micro-batches


def test_the_per_micro_batch_accumulation_the_fp32_all_reduce_and_the_bf16_gradients():
    model = load_model("gpt2-small")
    plan = Plan(**PLAN)
    bo = plan.replace(bf16_optimizer=True)
    base, ds = predict(model, "dgx-a100-80gb", plan), predict(model, "dgx-a100-80gb", bo)
    params = base.parameters  # tp 1, pp 1: every parameter on every GPU
    bandwidth = values_of(model, load_hardware("dgx-a100-80gb"), bo)[
        "optimizer_bandwidth_bytes_per_s"]
    assert ds.breakdown_s["optimizer/step"] - base.breakdown_s["optimizer/step"] == \
        pytest.approx(4 * 18 * params / bandwidth, rel=1e-9)
    assert ds.memory_breakdown_bytes["gradients"] - base.memory_breakdown_bytes["gradients"] \
        == pytest.approx(2 * params, rel=1e-9)
    calls = {r["name"]: r for r in comm_ledger(model, bo, "dgx-a100-80gb")}
    before = {r["name"]: r for r in comm_ledger(model, plan, "dgx-a100-80gb")}
    # (the ledger lists the collectives a rank issues: none of the other kind)
    assert calls["dp/all_reduce"]["calls"] == 1 and "dp/all_reduce" not in before
    assert calls["dp/all_reduce"]["nbytes"] == pytest.approx(4 * params, rel=1e-9)  # fp32
    assert "dp/reduce_scatter" not in calls and before["dp/reduce_scatter"]["calls"] == 1
    assert calls["dp/all_gather"]["calls"] == before["dp/all_gather"]["calls"] == 1


@pytest.mark.parametrize("change,needle", [
    (dict(zero=0), "zero 0"), (dict(dtype="fp16"), "dtype fp16"), (dict(zero=2), "zero 2"),
    (dict(grad_dtype="bf16"), "grad_dtype bf16"), (dict(dtype="fp8"), "dtype fp8"),
    (dict(overlap_grad_sync=True), "overlapping"), (dict(overlap_param_gather=True), "overlapping"),
])
def test_it_is_bf16_at_zero_1_with_fp32_states(change, needle):
    with pytest.raises(PlanError, match=needle):
        Plan(**{**PLAN, **change}, bf16_optimizer=True)
    assert "bf16_optimizer" not in Plan(**PLAN).to_dict()
    assert Plan(**PLAN, bf16_optimizer=True).to_dict()["bf16_optimizer"] is True


def test_only_deepspeed_is_written_with_it_and_the_validation_job_refuses_it(tmp_path):
    import json

    from perfmodel.configs.emit import emit
    from validation.jobspec import check_job, job_parallel

    model, hw = load_model("gpt2-small"), load_hardware("dgx-a100-80gb")
    plan = Plan(**{**PLAN, "overlap_param_gather": False}, bf16_optimizer=True)
    for fmt in ("megatron", "torchtitan"):
        with pytest.raises(PlanError, match="bf16_optimizer"):
            emit(fmt, tmp_path, model, hw, plan, 1.0)
    # DeepSpeed's BF16_Optimizer in every version since v0.8.1: stage 1 with fp32 gradient
    # accumulation (stage 0 only before v0.17.6), read back as written
    from perfmodel.configs import read_config

    (tmp_path / "ds").mkdir()
    paths = emit("deepspeed", tmp_path / "ds", model, hw, plan, 1.0)
    written = next(p for p in paths if p.suffix == ".json")
    config = json.loads(written.read_text())
    assert config["zero_optimization"]["stage"] == 1 and config["bf16"]["enabled"] is True
    assert config["data_types"] == {"grad_accum_dtype": "fp32"}
    back = read_config(written).plan
    assert (back["zero"], back["bf16_optimizer"], back["overlap_grad_sync"]) == (1, True, False)
    with pytest.raises(PlanError, match="zero 0 with bf16"):
        emit("deepspeed", tmp_path / "ds", model, hw, plan.replace(zero=0, bf16_optimizer=False),
             1.0)
    with pytest.raises(PlanError, match="BF16_Optimizer"):
        check_job(model, plan, job_parallel(plan))


def test_the_routed_experts_gradients_are_all_reduced_over_their_group_too():
    model = load_model("mixtral-8x7b")
    plan = Plan(gpus=32, dp=8, tp=4, ep=8, zero=1, micro_batch=1, global_batch=16,
                sequence_parallel=True)
    rows = {r["name"]: r for r in comm_ledger(model, plan.replace(bf16_optimizer=True),
                                              "dgx-h100")}
    before = {r["name"]: r for r in comm_ledger(model, plan, "dgx-h100")}
    assert "edp/reduce_scatter" in before and "edp/reduce_scatter" not in rows
    assert rows["edp/all_reduce"]["calls"] == 1
    assert rows["edp/all_reduce"]["nbytes"] == pytest.approx(
        before["edp/reduce_scatter"]["nbytes"], rel=1e-2)  # the same fp32 gradients, unpadded


@pytest.mark.parametrize("zero,accum,expected", [
    (1, "fp32", True), (1, None, False), (2, None, False), (3, "bf16", False)])
def test_a_deepspeed_config_reads_bf16_optimizer_where_deepspeed_picks_it(tmp_path, zero, accum,
                                                                           expected):
    """engine._do_optimizer_sanity_check: bf16 at stage 1 with fp32 gradient accumulation
    (data_types.grad_accum_dtype) and no offload runs BF16_Optimizer (since v0.8.1); other
    stages run ZeRO, their gradients kept and reduced in bf16 (communication_data_type and
    grad_accum_dtype default to the model's dtype: engine.communication_data_type,
    get_data_types at edaa72212)."""
    import json

    from perfmodel.configs import read_config

    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": zero}}
    if accum:
        config["data_types"] = {"grad_accum_dtype": accum}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    plan = read_config(path).plan
    assert bool(plan.get("bf16_optimizer")) is expected
    if expected:
        assert (plan["zero"], plan["overlap_grad_sync"], plan["overlap_param_gather"]) == \
            (1, False, False)
        assert "grad_dtype" not in plan  # its fp32 gradients
    else:
        assert plan["grad_dtype"] == "bf16"


@pytest.mark.parametrize("accum", [None, "fp32"])
def test_a_deepspeed_bf16_config_without_zero_is_refused_for_its_version_dependence(tmp_path,
                                                                                    accum):
    """bf16 at stage 0: BF16_Optimizer before DeepSpeed v0.17.6; from v0.17.6 (889f0ead2,
    #7515) FP16_Optimizer in bf16 (DDP_BFLOAT16), or NotImplementedError with fp32
    accumulation: which one the config does not say. Regression: read as BF16_Optimizer."""
    import json

    from perfmodel.configs import read_config

    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}}
    if accum:
        config["data_types"] = {"grad_accum_dtype": accum}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    with pytest.raises(PlanError, match=r"zero_optimization.stage 0: with bf16, DeepSpeed before "
                                        r"v0.17.6 runs its BF16_Optimizer .*grad_accum_dtype fp32"):
        read_config(path)


def _zero2(tmp_path, dtype, comm, accum):
    """A ZeRO 2 DeepSpeed config of the model dtype, communication_data_type and
    data_types.grad_accum_dtype given (None: left out)."""
    import json

    config: dict = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                    dtype: {"enabled": True}, "zero_optimization": {"stage": 2}}
    if comm:
        config["communication_data_type"] = comm
    if accum:
        config["data_types"] = {"grad_accum_dtype": accum}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("comm, accum, grad_dtype", [
    (None, None, "bf16"), ("bf16", None, "bf16"), ("bfloat16", "bf16", "bf16"),
    ("fp32", None, None), ("float32", "fp32", None)])
def test_a_deepspeed_bf16_configs_gradients_are_reduced_in_its_communication_dtype(
        tmp_path, comm, accum, grad_dtype):
    """engine.communication_data_type: the config's, else the model's dtype. Regression: an
    unset one was costed as an fp32 reduce (Llama 3 8B on 16 H100s, ZeRO 2: comm/dp 0.126 s
    against 0.084 s in bf16), and an explicit bf16 one was refused."""

    from perfmodel.configs import read_config

    assert read_config(_zero2(tmp_path, "bf16", comm, accum)).plan.get("grad_dtype") == grad_dtype


@pytest.mark.parametrize("dtype, comm, accum, match", [
    ("bf16", "fp16", None, "reduced in fp16"),
    ("bf16", None, "fp32", "accumulated in fp32 and reduced in bf16"),
    ("fp16", "fp32", None, "fp16 model's gradients"),
    ("bf16", "int8", None, "DeepSpeed takes fp32, fp16 or bf16")])
def test_a_deepspeed_gradient_dtype_mix_not_modelled_is_refused(tmp_path, dtype, comm, accum,
                                                                  match):

    from perfmodel.configs import read_config
    from perfmodel.errors import SpecError

    with pytest.raises((PlanError, SpecError), match=match):
        read_config(_zero2(tmp_path, dtype, comm, accum))
