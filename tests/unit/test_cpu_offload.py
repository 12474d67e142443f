"""Activation offloading to host memory (Plan.cpu_offload_layers; perfmodel.step.offload):
Megatron-Core's --cpu-offloading-num-layers k, Transformer Engine's get_cpu_offload_context."""

from __future__ import annotations

import json
import random

import pytest

from perfmodel import PlanError, load_hardware, load_model, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron import megatron_arguments
from perfmodel.step.offload import backward_exposed_s, forward_exposed_s
from perfmodel.strategy import plan_from_dict

MODEL = load_model("llama3-8b").replace(seq_len=4096)  # 32 layers, no dropout
BASE = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, zero=1)


def _simulate(layers: int, k: int, f: float, b: float, x: float) -> tuple[float, float]:
    """What k layers' copies add to a forward (layers of f each) and a backward (b each), copies
    of x, event by event under Transformer Engine's rules (its docs, features/
    other_optimizations/cpu_offloading): at most layers - k sets on the GPU; an offload starts
    with its layer and ends no sooner, after the one before; a reload follows the one before it
    once the layer m above has freed its set, and its layer's backward waits for it."""
    m = layers - k
    start, end, copied = [0.0] * (layers + 1), [0.0] * (layers + 1), [0.0] * (k + 1)
    for j in range(1, layers + 1):
        start[j] = max(end[j - 1], copied[j - m] if 1 <= j - m <= k else 0.0)
        end[j] = start[j] + f
        if j <= k:
            copied[j] = max(max(copied[j - 1], start[j]) + x, end[j])
    forward = end[layers] - layers * f
    done, reloaded = {layers + 1: 0.0}, {k + 1: 0.0}
    for j in range(layers, 0, -1):
        if j <= k:
            reloaded[j] = max(reloaded[j + 1], done[j + m]) + x
        done[j] = max(done[j + 1], reloaded.get(j, 0.0)) + b
    return forward, done[1] - layers * b


def test_the_closed_forms_are_the_schedule_a_simulation_runs():
    rng = random.Random(20261129)
    for _ in range(3000):
        layers = rng.randint(2, 60)
        k = rng.randint(1, layers - 1)
        f, b, x = rng.uniform(0.1, 2), rng.uniform(0.1, 4), rng.uniform(0.01, 6)
        forward, backward = _simulate(layers, k, f, b, x)
        assert float(forward_exposed_s(k, layers, f, x)) == pytest.approx(forward, abs=1e-9)
        assert float(backward_exposed_s(k, layers, b, x)) == pytest.approx(backward, abs=1e-9)


def test_the_gpu_keeps_the_activations_of_the_layers_not_offloaded():
    none = predict(MODEL, "dgx-h100", BASE).memory_breakdown_bytes
    for k in (1, 16, 31):
        kept = predict(MODEL, "dgx-h100", dict(BASE, cpu_offload_layers=k)).memory_breakdown_bytes
        # Transformer Engine: "(num_layers - num_offloaded_layers) * T" on the GPU
        assert kept["activations/layers"] == pytest.approx(none["activations/layers"]
                                                           * (32 - k) / 32)
        assert kept["activations/embedding_output"] == none["activations/embedding_output"]
        assert kept["weights"] == none["weights"]


def test_a_mixture_of_experts_offloads_its_dense_first_layers_first():
    """DeepSeek-V3's first 3 layers are dense: offloading 1-3 layers moves dense layers' sets,
    beyond 3 its MoE layers' (larger); its MTP module's layer stays on the GPU."""
    plan = dict(gpus=256, dp=32, tp=8, ep=32, micro_batch=1, global_batch=32, zero=1,
                sequence_parallel=True, dtype="bf16")
    model = load_model("deepseek-v3").replace(seq_len=2048)
    kept = {k: predict(model, "dgx-h100", dict(plan, cpu_offload_layers=k))
            .memory_breakdown_bytes["activations/layers"] for k in (0, 1, 3, 4, 5)}
    dense = kept[0] - kept[1]
    assert kept[0] - kept[3] == pytest.approx(3 * dense)
    moe = kept[3] - kept[4]
    assert moe == pytest.approx(kept[4] - kept[5]) and moe > 1.1 * dense


def test_a_mixture_of_experts_offloads_its_first_layers_whatever_their_kind(tmp_path):
    """Dense layers where --moe-layer-freq puts them (layers 1 and 3 of 4): the first offloaded
    layer is an MoE layer's set, the second a dense one's, the third an MoE one's again."""
    spec = tmp_path / "moe.yaml"
    spec.write_text("name: tiny-moe\nlayers: 4\nhidden: 1024\nheads: 8\nseq_len: 2048\n"
                    "vocab: 32000\nffn_hidden: 4096\ngated_mlp: true\nexperts: 16\ntop_k: 2\n"
                    "expert_ffn_hidden: 2048\nmoe_dense_layers: [1, 3]\nhidden_dropout: 0\n"
                    "attention_dropout: 0\n")
    model = load_model(str(spec))
    plan = dict(gpus=8, dp=8, ep=8, micro_batch=1, global_batch=8, zero=1)
    kept = [predict(model, "dgx-h100", dict(plan, cpu_offload_layers=k))
            .memory_breakdown_bytes["activations/layers"] for k in range(4)]
    moe, dense, moe_again = (kept[i] - kept[i + 1] for i in range(3))
    assert moe == pytest.approx(moe_again) and moe != pytest.approx(dense)
    whole = kept[0]  # 2 MoE and 2 dense layers' sets
    assert whole == pytest.approx(2 * moe + 2 * dense)


def test_copies_hide_behind_the_layers_until_the_link_is_too_slow():
    fast = load_hardware("gb200-nvl72")  # NVLink-C2C
    plan = dict(BASE, gpus=8, cpu_offload_layers=16)
    t0 = predict(MODEL, fast, dict(BASE)).step_time_s
    hidden = predict(MODEL, fast, plan)
    assert hidden.breakdown_s.get("comm/offload", 0.0) == 0.0
    assert hidden.step_time_s == pytest.approx(t0)
    slow = fast.replace(host_link_bytes_per_s=1e9)
    shown = predict(MODEL, slow, plan)
    assert shown.breakdown_s["comm/offload"] > 0
    # the step grows by the exposed copies, less what of the host's time the longer device time
    # now covers (the smooth maximum of perfmodel.step.compose): at most that host time
    offload = shown.breakdown_s["comm/offload"]
    host = sum(v for k, v in hidden.hidden_s.items() if k.startswith("overhead/"))
    assert t0 + offload - host <= shown.step_time_s <= (t0 + offload) * (1 + 1e-9)
    assert shown.step_time_s == pytest.approx(t0 + offload, rel=1e-3)
    # the same copies at 1 GB/s: forward and backward each wait about 16 copies of a layer's
    # activations less the layers they hide behind (one micro-batch a step)
    layer_bytes = (predict(MODEL, slow, dict(BASE)).memory_breakdown_bytes["activations/layers"]
                   / 32)
    assert shown.breakdown_s["comm/offload"] == pytest.approx(2 * 16 * layer_bytes / 1e9,
                                                              rel=0.15)


def test_plans_megatron_core_refuses_are_refused():
    with pytest.raises(PlanError, match="cpu_offload_layers 4 with pp 2"):
        plan_from_dict(dict(gpus=8, dp=4, pp=2, global_batch=8, cpu_offload_layers=4))
    with pytest.raises(PlanError, match="beside recomputation"):
        plan_from_dict(dict(gpus=8, dp=8, global_batch=8, recompute="full",
                            cpu_offload_layers=4))
    with pytest.raises(PlanError, match="at most 31 of the model's 32 layers"):
        predict(MODEL, "dgx-h100", dict(BASE, cpu_offload_layers=32))
    bare = load_hardware("dgx-h100").replace(host_link_bytes_per_s=0.0)
    with pytest.raises(PlanError, match="gives no host_link_bytes_per_s"):
        predict(MODEL, bare, dict(BASE, cpu_offload_layers=4))


BASE_ARGS = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
             "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 2 --bf16 ")


def test_megatron_arguments_read_and_write_the_offloaded_layers(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text(BASE_ARGS + "--cpu-offloading-num-layers 2")
    job = read_config(path)
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert plan["cpu_offload_layers"] == 2
    made = plan_from_dict(plan).check(spec)
    args = [a for group in megatron_arguments(spec, made) for a in group]
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "2"
    path.write_text(BASE_ARGS)  # off by default
    assert "cpu_offload_layers" not in read_config(path).plan


def test_a_nemo_config_offloads_only_with_cpu_offloading_on(tmp_path):
    """Megatron-Core hands cpu_offloading to Transformer Engine as `enabled`: a layer count
    beside cpu_offloading false offloads nothing (only Megatron-LM's argument list turns it on
    from the count)."""
    from tests.unit.test_configs import DATA

    path = tmp_path / "off.yaml"
    path.write_text((DATA / "bridge_llama3_8b.yaml").read_text().replace(
        "  recompute_granularity: null",
        "  recompute_granularity: null\n  cpu_offloading: false\n  cpu_offloading_num_layers: 10"))
    assert "cpu_offload_layers" not in read_config(path).plan


def test_nemo_configs_read_the_offload_and_refuse_weights(tmp_path):
    from tests.unit.test_configs import DATA

    text = (DATA / "bridge_llama3_8b.yaml").read_text().replace(
        "  recompute_granularity: null",
        "  recompute_granularity: null\n  cpu_offloading: true\n  cpu_offloading_num_layers: 10\n"
        "  cpu_offloading_activations: true\n  cpu_offloading_weights: false\n"
        "  cpu_offloading_double_buffering: false")
    path = tmp_path / "offload.yaml"
    path.write_text(text)
    assert read_config(path).plan["cpu_offload_layers"] == 10
    path.write_text(text.replace("cpu_offloading_weights: false", "cpu_offloading_weights: true"))
    with pytest.raises(PlanError, match="cpu_offloading_weights.*offloading weights"):
        read_config(path)


def test_the_cli_predicts_recommends_and_refuses(run_cli):
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "64", "--micro-batch", "2", "--cpu-offload-layers", "16")
    assert res.returncode == 0, res.stderr
    assert "the first 16 layers' activations offloaded to the host" in res.stdout
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--cpu-offload-layers", "8", "--json")
    assert res.returncode == 0, res.stderr
    plans = [p["plan"] for p in json.loads(res.stdout)["plans"]]
    assert plans and all(p["pp"] == 1 and p["recompute"] == "none"
                         and p["cpu_offload_layers"] == 8 for p in plans)
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--cpu-offload-layers", "8", "--pp", "2")
    assert res.returncode == PlanError.exit_code and "give pp 1" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "64", "--pp", "2", "--cpu-offload-layers", "4")
    assert res.returncode == PlanError.exit_code and "Megatron-Core offloads" in res.stderr
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--cpu-offload-layers", "8", "--recompute-every", "2")
    assert res.returncode == PlanError.exit_code and "beside recomputation" in res.stderr


def test_the_timeline_trace_and_reports_draw_the_copies(run_cli, tmp_path):
    """The copies are a forward and a backward phase: the timeline places each in its pass, so
    the passes of the trace grow by what the copies expose."""
    args = ["predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
            "--global-batch", "64", "--micro-batch", "2", "--json"]
    passes = {}
    for k in (0, 16):
        res = run_cli(*args, "--cpu-offload-layers", k, "--html", tmp_path / f"{k}.html",
                      "--trace", tmp_path / f"{k}.json", "--timeline", tmp_path / f"{k}.png")
        assert res.returncode == 0, res.stderr
        events = json.loads((tmp_path / f"{k}.json").read_text())["traceEvents"]
        passes[k] = sum(e["dur"] for e in events
                        if e.get("ph") == "X" and e.get("tid") == 1  # the schedule track
                        and e.get("cat") in ("forward", "backward")) / 1e6
        assert (tmp_path / f"{k}.html").stat().st_size and (tmp_path / f"{k}.png").stat().st_size
    exposed = json.loads(res.stdout)["breakdown_s"]["comm/offload"]
    assert exposed > 0 and passes[16] - passes[0] == pytest.approx(exposed, rel=1e-3)


def test_the_validation_job_refuses_to_pretend_it_offloads(run_cli):
    from validation.jobspec import as_run

    with pytest.raises(PlanError, match="the validation job offloads no activations"):
        as_run(MODEL, plan_from_dict(dict(BASE, cpu_offload_layers=4)), "gloo")
    res = run_cli("validate", "--model", "tiny-gpt", "--nprocs", "4", "--tp-layout", "2d",
                  "--tp", "4", "--cpu-offload-layers", "1")
    assert res.returncode == 2 and "offloads no activations" in res.stderr
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", "--cpu-offload-layers", "8", "--validate")
    assert res.returncode == 2 and "offloads no" in res.stderr
