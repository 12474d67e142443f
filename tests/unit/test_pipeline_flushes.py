"""Several pipeline schedules a step (Plan.pipeline_micro_batches): torchtitan and NeMo AutoModel
run one schedule per gradient-accumulation step, each with its fill and drain, where Megatron
runs every micro-batch of the step in one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.strategy import Plan

ROOT = Path(__file__).resolve().parents[2]
HW = "dgx-h100"


def _plan(**kw):
    return Plan(**{**dict(gpus=32, dp=8, pp=4, micro_batch=1, global_batch=128), **kw})


def test_each_schedule_pays_its_own_fill_and_drain():
    """16 micro-batches as 4 schedules of 4: four bubbles (1f1b: (pp - 1) stage times each,
    whatever the schedule's length), the rest of the step unchanged."""
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    one = predict(model, hw, _plan())
    four = predict(model, hw, _plan(pipeline_micro_batches=4))
    assert four.breakdown_s["pipeline/bubble"] == pytest.approx(
        4 * one.breakdown_s["pipeline/bubble"], rel=1e-9)
    rest = {k: v for k, v in one.breakdown_s.items() if k != "pipeline/bubble"}
    assert rest == pytest.approx({k: four.breakdown_s[k] for k in rest}, rel=1e-9)
    # one schedule of every micro-batch is the default, written so
    same = predict(model, hw, _plan(pipeline_micro_batches=16))
    assert same.step_time_s == pytest.approx(one.step_time_s, rel=1e-12)
    assert "pipeline_micro_batches" not in _plan().to_dict()
    assert _plan(pipeline_micro_batches=4).to_dict()["pipeline_micro_batches"] == 4


def test_a_schedule_length_that_does_not_divide_the_step_is_refused():
    with pytest.raises(PlanError, match="pipeline_micro_batches .5. must divide the step's 16"):
        _plan(pipeline_micro_batches=5)


def _torchtitan_pp(tmp_path, global_batch):
    data = json.loads((ROOT / "tests/data/configs/torchtitan_llama3_8b_pp.json").read_text())
    data["training"]["global_batch_size"] = global_batch
    path = tmp_path / "tt.json"
    path.write_text(json.dumps(data))
    return path


def test_the_schedule_rules_count_one_schedule_s_micro_batches():
    """torch's interleaved schedules run each schedule's m micro-batches in max(1, m // pp)
    rounds of equal size (torch 2.13 schedules.py: ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble): with several schedules a step (torchtitan's, AutoModel's)
    the rules hold one schedule's m to that; Megatron's interleaving, one schedule a step, needs
    a multiple of pp."""
    kw = dict(gpus=8, dp=2, pp=4, zero=3, micro_batch=1, schedule="zb", virtual_stages=4)
    Plan(**kw, global_batch=60, pipeline_micro_batches=10)  # 3 schedules of 2 rounds of 5
    with pytest.raises(PlanError, match="9 is not a multiple of 2 rounds"):
        Plan(**kw, global_batch=72, pipeline_micro_batches=9)  # 36 a step would be 9 rounds
    kw["schedule"] = "interleaved"
    Plan(**kw, global_batch=48, pipeline_micro_batches=6)  # 4 schedules of 1 round of 6
    Plan(**kw, global_batch=40, pipeline_micro_batches=10)  # 2 of 2 rounds of 5
    with pytest.raises(PlanError, match="9 is not a multiple of 2 rounds"):
        Plan(**kw, global_batch=36, pipeline_micro_batches=9)
    with pytest.raises(PlanError, match=r"micro-batches \(6\) to be a multiple of pp"):
        Plan(**kw, global_batch=12)  # Megatron's: one schedule of 6


def test_torchtitan_and_automodel_run_a_schedule_per_accumulation_step(tmp_path):
    """torchtitan's trainer calls pp_schedule.step once per gradient-accumulation step
    (torchtitan/trainer.py, train_step); NeMo AutoModel's recipe likewise."""
    for global_batch, want in ((32, 0), (64, 8)):  # 8 GPUs: pp 2, dp 4, local batch 8 each
        job = read_config(_torchtitan_pp(tmp_path, global_batch))
        spec = resolve_model(job, None, None)
        _, plan = resolve_plan(job, spec, {"gpus": 8})
        assert plan.get("pipeline_micro_batches", 0) == want, global_batch
    recipe = (ROOT / "tests/data/configs/automodel_qwen3_30b_a3b.yaml").read_text()
    piped = recipe.replace("pp_size: 1", "pp_size: 2")
    assert piped != recipe
    path = tmp_path / "am.yaml"
    path.write_text(piped + "\n")
    job = read_config(path)
    spec = resolve_model(job, None, None)
    _, plan = resolve_plan(job, spec, {"gpus": 8})
    # 512 = local 4 x dp 4 x 32 accumulation steps: 32 schedules of 4 micro-batches
    assert (plan["dp"], plan["micro_batch"], plan["pipeline_micro_batches"]) == (4, 1, 4)
    assert any("32 gradient-accumulation steps" in n for n in job.notes)


def test_recommend_and_validate_refuse_it(run_cli, tmp_path):
    from validation.jobspec import check_job, job_parallel

    plan = Plan(gpus=4, dp=2, pp=2, global_batch=8, pipeline_micro_batches=2)
    with pytest.raises(PlanError, match="one pipeline schedule"):
        check_job(load_model("tiny-gpt"), plan, job_parallel(plan))
    out = run_cli("recommend", "--from-config", _torchtitan_pp(tmp_path, 128), "--hardware", HW,
                  "--gpus", "8")
    assert out.returncode != 0 and "one pipeline schedule a step" in out.stderr
    assert "Traceback" not in out.stderr
