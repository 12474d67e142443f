"""Regressions a probe of the command line found (2026-12-02): options taken but changing
nothing, a plans file's cells the command line refuses, framework settings read over the wrong
source, and a spec's field guessed; each failing before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from perfmodel import load_model
from perfmodel.configs import read_config
from perfmodel.errors import PlanError, SpecError
from perfmodel.specs.presets import HARDWARE_DIR
from perfmodel.strategy import Plan
from tests.unit.test_bad_input import run_main
from tests.unit.test_configs import edited_yaml

DATA = Path(__file__).resolve().parents[1] / "data"
BASE = ("--hardware", "dgx-h100", "--gpus", "8", "--global-batch", "32")


def test_recompute_every_beyond_a_stages_layers_is_refused() -> None:
    # torchtitan recomputes every N-th layer a rank builds: with more than a stage holds none
    # recomputes, and predict printed 'recompute full (one layer in 100)' for recompute none's
    # numbers, recommend ranked it as a policy of its own
    model = load_model("llama3-70b")  # 80 layers
    plan = Plan(gpus=64, tp=8, pp=8, global_batch=64, recompute="full", recompute_every=11)
    with pytest.raises(PlanError, match="exceeds the 10 layers a pipeline stage holds"):
        plan.check(model)
    Plan(gpus=64, tp=8, pp=8, global_batch=64, recompute="full", recompute_every=10).check(model)
    code, _, err = run_main(["recommend", "--model", "llama3-8b", *BASE,
                             "--recompute-every", "100"])
    assert code == 4 and "exceeds the model's 32 layers" in err
    code, out, _ = run_main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "64", "--global-batch", "64", "--recompute-every", "16",
                             "--json"])
    assert code == 0
    for row in json.loads(out)["plans"]:  # no stage of fewer than 16 layers
        assert 32 // row["plan"]["pp"] >= 16


def test_pipeline_micro_batches_without_a_pipeline_is_refused() -> None:
    code, _, err = run_main(["predict", "--model", "llama3-8b", *BASE,
                             "--pipeline-micro-batches", "4"])
    assert code == 4 and "plan has pp 1" in err


# (recommend has no --collective-variant: it searches both variants of a layer graph)
@pytest.mark.parametrize("command, flag, value", [
    *((c, f, v) for c in ("predict", "explain", "recommend")
      for f, v in (("--norm", "sync"), ("--contributors", "auto"))),
    ("predict", "--collective-variant", "split"), ("explain", "--collective-variant", "split")])
def test_layer_graph_options_for_a_transformer_are_refused(command, flag, value) -> None:
    code, _, err = run_main([command, "--model", "llama3-8b", *BASE, flag, value])
    assert code == 2 and f"{flag} applies to layer-graph models" in err


def test_a_plans_files_cells_are_refused_as_their_flags_are(tmp_path) -> None:
    # predict --batch predicted each of these rows as if the cell were empty
    path = tmp_path / "plans.csv"
    path.write_text(
        "model,hardware,gpus,tp,cp,global_batch,cp_comm,tp_backward,ep_dispatcher,"
        "overlap_grad_sync\n"
        "llama3-8b,dgx-h100,8,2,1,32,a2a,,,\n"
        "llama3-8b,dgx-h100,8,1,1,32,,dtensor,,\n"
        "llama3-8b,dgx-h100,8,2,1,32,,,deepep,\n"
        "llama3-8b,dgx-h100,2,2,1,32,,,,true\n"
        "llama3-8b,dgx-h100,8,2,2,32,a2a,,,\n")
    code, out, err = run_main(["predict", "--batch", str(path), "--json"])
    rows = json.loads(out)["rows"]
    assert code == 5 and [bool(r["error"]) for r in rows] == [True] * 4 + [False]
    for text in ("cp_comm a2a applies to context parallelism", "tp_backward dtensor applies",
                 "ep_dispatcher deepep exchanges", "--overlap-grad-sync overlaps"):
        assert text in err


def _nemo2(tmp_path, **changes) -> object:
    return read_config(edited_yaml("nemo2_llama3_8b.yaml", tmp_path, changes))


def test_nemo2_strategy_parallel_sizes_win_over_the_model_config(tmp_path) -> None:
    # MegatronStrategy.connect copies its ParallelismConfig onto the model's config
    # (set_model_parallel_attributes): the model config's tp was taken, the strategy's dropped
    job = _nemo2(tmp_path, **{"trainer.strategy.tensor_model_parallel_size": 4,
                              "model.config.tensor_model_parallel_size": 2})
    assert job.plan["tp"] == 4
    assert any(s.key == "model.config.tensor_model_parallel_size" and "overridden" in s.note
               for s in job.ignored)
    # unstated in the strategy: its default, 1
    job = _nemo2(tmp_path, **{"trainer.strategy.tensor_model_parallel_size": None,
                              "model.config.tensor_model_parallel_size": 2})
    assert job.plan["tp"] == 1
    with pytest.raises(PlanError, match="trainer.strategy.ddp pytorch"):
        _nemo2(tmp_path, **{"trainer.strategy.ddp": "pytorch"})
    with pytest.raises(PlanError, match="Megatron FSDP is not modelled"):
        _nemo2(tmp_path, **{"trainer.strategy.fsdp": "megatron"})


def test_bridge_fields_outside_the_model_are_said_why_or_not_read(tmp_path) -> None:
    # every unknown key outside `model` was 'not the step's (run length, data,
    # hyperparameters)', those that change the step among them
    job = read_config(edited_yaml("bridge_llama3_8b.yaml", tmp_path, {
        "ddp.num_distributed_optimizer_instances": 2, "comm_overlap.delay_wgrad_compute": True,
        "train.empty_unused_memory_level": 1, "logger.log_params_norm": True,
        "model.deterministic_mode": True}))
    unknown = {s.key for s in job.unknown}
    assert {"ddp.num_distributed_optimizer_instances",
            "comm_overlap.delay_wgrad_compute"} <= unknown
    notes = "\n".join(job.notes)
    for key in ("train.empty_unused_memory_level", "logger.log_params_norm",
                "model.deterministic_mode"):
        assert key in notes
    reasons = {s.key: s.note for s in job.ignored}
    assert "optimizer hyperparameter" in reasons["optimizer.lr"]
    assert "run's length" in reasons["train.train_iters"]


def test_per_dtype_gemm_fits_without_a_default_refuse_a_dtype_they_lack(tmp_path) -> None:
    # the first dtype listed was taken for any other: reordering the keys changed fp16's step
    # four times over
    spec = yaml.safe_load((HARDWARE_DIR / "dgx-h100.yaml").read_text())
    spec.pop("base", None)
    fit = {"max_fraction": 0.8, "m_half_dim": 32, "n_half_dim": 32, "k_half_dim": 160}
    spec["gemm_efficiency"] = {"fp32": {**fit, "max_fraction": 0.1}, "bf16": fit}
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", str(path),
                             "--gpus", "8", "--tp", "8", "--dtype", "fp16"])
    assert code == 3 and "gemm_efficiency has no fp16 entry and no default" in err
    del fit["max_fraction"]
    spec["gemm_efficiency"] = fit
    path.write_text(yaml.safe_dump(spec))
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", str(path)])
    assert code == 3 and "missing required field 'max_fraction'" in err


def test_a_deepseek_v3_config_without_its_router_groups_is_refused(tmp_path) -> None:
    # transformers' DeepseekV3Config fills in n_group 8, topk_group 4; perfmodel took 1 group
    config = json.loads((DATA / "hf" / "deepseek-v3" / "config.json").read_text())
    for key in ("n_group", "topk_group"):
        edited = {k: v for k, v in config.items() if k != key}
        (tmp_path / "config.json").write_text(json.dumps(edited))
        with pytest.raises(SpecError, match=f"missing '{key}'"):
            load_model(str(tmp_path / "config.json"), seq_len=4096)


def test_an_empty_torchtitan_config_is_refused(tmp_path) -> None:
    # it predicted torchtitan's debug model (6.2M parameters), where every other reader refuses
    # an empty file
    path = tmp_path / "job.toml"
    path.write_text("# nothing yet\n")
    with pytest.raises(SpecError, match="is empty"):
        read_config(path)


def test_sweep_refuses_a_field_varied_twice() -> None:
    # the first --vary of a field was dropped silently
    code, _, err = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus",
                             "8", "--global-batch", "256", "--vary", "gpus=8", "--vary",
                             "gpus=16"])
    assert code == 2 and "--vary gpus is given twice" in err
    code, out, _ = run_main(["sweep", "--model", "alexnet", "--hardware", "dgx-h100",
                             "--global-batch", "256", "--vary", "gpus=8,16", "--json"])
    assert code == 0 and [r["gpus"] for r in json.loads(out)["rows"]] == [8, 16]


def test_sweep_takes_the_gpus_and_batch_from_vary_alone() -> None:
    """--gpus and --global-batch were required even where --vary gave the values (which then
    replaced them unseen): now one of each is needed, and both is refused."""
    base = ["sweep", "--model", "alexnet", "--hardware", "dgx-h100"]
    code, out, err = run_main([*base, "--vary", "gpus=8,16", "--vary", "global_batch=64,128",
                               "--json"])
    assert code == 0, err
    assert [(r["gpus"], r["global_batch"]) for r in json.loads(out)["rows"]] == \
        [(8, 64), (8, 128), (16, 64), (16, 128)]
    for args, says in (([*base, "--vary", "gpus=8,16"], "give --global-batch (or --vary "
                        "global_batch=V1,V2,...)"),
                       ([*base, "--global-batch", "64", "--vary", "peak_flops_per_s=1e14"],
                        "give --gpus (or --vary gpus=V1,V2,...)"),
                       ([*base, "--gpus", "8", "--global-batch", "64", "--vary", "gpus=8,16"],
                        "--gpus 8 beside --vary gpus"),
                       ([*base, "--gpus", "8", "--global-batch", "64", "--vary",
                         "global_batch=64,128"], "--global-batch 64 beside --vary global_batch")):
        code, out, err = run_main(args)
        assert code == 2 and out == "" and says in err, (args, err)
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("family, config, key", [
    # MistralConfig windows every layer over 4096 tokens where the key is left out; the Qwen
    # classes window from layer 28 on over 4096 once use_sliding_window is on; GptOssConfig
    # every other layer over 128: each was read as no window, or as every layer windowed
    ("mistral", {}, "sliding_window"),
    ("gpt_oss", {}, "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 28}, "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096}, "max_window_layers"),
])
def test_a_window_the_config_class_fills_in_is_refused(tmp_path, family, config, key) -> None:
    base = {"model_type": family, "hidden_size": 2048, "intermediate_size": 8192,
            "num_attention_heads": 16, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "head_dim": 128, "max_position_embeddings": 32768, "vocab_size": 32000}
    if family == "gpt_oss":
        base.update(num_local_experts=32, num_experts_per_tok=4)
    (tmp_path / "config.json").write_text(json.dumps({**base, **config}))
    with pytest.raises(SpecError, match=f"missing '{key}'"):
        load_model(str(tmp_path / "config.json"), seq_len=32768)


def test_torchtitan_zero_bubble_schedules_are_written_as_torchtitan_runs_them(tmp_path) -> None:
    # ZBVZeroBubble (two stages a rank, evenly split) was read back as a pipeline layout, which
    # schedule zbv refuses: no ZBV job could be read; and an interleaved zero bubble of one stage
    # a rank was written, which torchtitan refuses
    from perfmodel import load_hardware, predict
    from perfmodel.configs import resolve_model, resolve_plan
    from perfmodel.configs.emit import emit

    model, hw = load_model("llama3-70b"), load_hardware("dgx-h100")
    plan = Plan(gpus=64, dp=2, tp=8, pp=4, global_batch=128, schedule="zbv", virtual_stages=2,
                zero=3, overlap_grad_sync=True, overlap_param_gather=True,
                sequence_parallel=True, kernels="eager")
    paths = emit("torchtitan", tmp_path, model, hw, plan, 1.0)
    job = read_config(next(p for p in paths if p.suffix == ".toml"))
    spec, fields = resolve_plan(job, resolve_model(job, None, None), {"gpus": 64})
    back = Plan(**fields)
    assert (back.schedule.value, back.virtual_stages, back.pipeline_layout) == ("zbv", 2, "")
    # a plan read from a config carries its framework's settings (torchtitan's expert
    # weighting on a dense model): predicted as it stands
    assert predict(spec, hw, back, refuse_idle=False).step_time_s == pytest.approx(
        predict(model, hw, plan).step_time_s)
    with pytest.raises(PlanError, match="several stages a rank"):
        emit("torchtitan", tmp_path / "zb", model, hw,
             plan.replace(schedule="zb", virtual_stages=1), 1.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_the_timeline_runs_each_pipeline_schedule_of_a_step(schedule) -> None:
    # 16 micro-batches as 4 schedules of 4: the trace laid out one run of 16 (no fill and drain
    # between them) and ended 27% before the predicted step, blaming the pass times
    from perfmodel import load_hardware, predict
    from perfmodel.timeline import predicted_timeline

    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    plan = Plan(gpus=16, dp=4, pp=4, global_batch=64, schedule=schedule,
                pipeline_micro_batches=4)
    timeline = predicted_timeline(model, hw, plan)
    assert timeline.step_time_s == pytest.approx(predict(model, hw, plan).step_time_s, rel=1e-6)
    assert not timeline.notes
    forwards = {sp.name for sp in timeline.spans if sp.name.startswith("F")}
    assert len(forwards) == 16  # every micro-batch of the step, each schedule's own


def test_explain_prints_the_stage_composition_predict_takes() -> None:
    # with one stage predict takes the slower of its two compositions, explain printed the
    # first's: its host terms were off by up to 1.7% and did not add up to its own step time
    import re

    from perfmodel import load_hardware, predict
    from perfmodel.explain import explain_text

    model, hw = load_model("llama3-8b"), load_hardware("gb200-nvl72")
    plan = Plan(gpus=72, dp=18, tp=4, sequence_parallel=True, global_batch=72)
    result = predict(model, hw, plan)
    text = explain_text(model, hw, plan)
    printed = {name: float(value) for name, value in
               re.findall(r"^- (\S+) = \S+ s per micro-batch, (\S+) s per step", text, re.M)}
    assert printed["overhead/collectives"] > 0
    for name, value in printed.items():
        assert value == pytest.approx(result.breakdown_s[name], rel=1e-5), name


def test_explain_term_selects_a_term_or_a_group_not_a_prefix_of_a_name() -> None:
    # --term comm/tp printed comm/tp_grads too, and --term comm/t worked
    base = ["explain", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--tp",
            "8", "--global-batch", "8"]
    code, out, _ = run_main([*base, "--term", "comm/tp"])
    assert code == 0 and "- comm/tp =" in out and "comm/tp_grads" not in out
    code, _, err = run_main([*base, "--term", "comm/t"])
    assert code != 0 and "no term 'comm/t'" in err
    code, out, _ = run_main([*base, "--term", "comm"])
    assert code == 0 and "- comm/tp =" in out and "- comm/dp (T_dp) =" in out
