"""Tensor parallelism's backward as Megatron-Core runs it (Plan.tp_backward megatron;
perfmodel.step.tensor_parallel): a sequence-parallel column-parallel input is kept as its shard
and gathered again for the weight gradient (megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward, at NVIDIA/Megatron-LM d98e8a64), as
Transformer Engine's LayerNormLinear and Linear do (ln_out_needs_gather,
backward_input_needs_gather; NVIDIA/TransformerEngine d0067d0), issued before the input-gradient
GEMM and waited for after it; torch's DTensor (torchtitan, the validation job) keeps the gathered
input instead. Megatron's backward also issues the input gradient's reduce-scatter (all-reduce
without sequence parallelism) before the weight-gradient GEMM, which hides it (layers.py at
d98e8a64 and at Megatron-LM 80389ef6, 2022; TE's layernorm_linear.py dgrad_work), with or
without userbuffers; DTensor reduces in turn.
"""

from __future__ import annotations

import json

import pytest

from perfmodel import Plan, comm_ledger, load_model, predict
from perfmodel.errors import PlanError
from tests.unit.test_bad_input import run_main

HW = "dgx-h100"
AGAIN = ("tp/layer/all_gather_again", "tp/output/all_gather_again", "tp/mla/all_gather_again")
# GPT-3 175B, tp 8 over 8 stages, 64 micro-batches of one sequence: 12 layers a stage
GPT3 = dict(gpus=64, tp=8, pp=8, dp=1, micro_batch=1, global_batch=64, sequence_parallel=True)


def _again(model, plan) -> dict[str, tuple[str, str, float, float]]:
    return {r["name"]: (r["phase"], r["stage"], r["calls"], r["nbytes"])
            for r in comm_ledger(model, plan, HW) if r["name"] in AGAIN}


def test_megatron_gathers_each_column_parallel_input_again_in_the_backward():
    """Per layer the QKV and MLP-up inputs, per micro-batch the output layer's, e T h each."""
    model = load_model("gpt3-175b")
    act = 2 * model.seq_len * model.hidden  # bf16, one sequence, gathered
    again = _again(model, Plan(**GPT3))
    assert again == {"tp/layer/all_gather_again": ("bwd", "every", 2 * 12 * 64, act),
                     "tp/output/all_gather_again": ("bwd", "output", 64, act)}
    # full recompute repeats the forward, whose autograd keeps the shard again
    assert _again(model, Plan(**GPT3, recompute="full")) == again


@pytest.mark.parametrize("change", [dict(kernels="eager"), dict(tp_backward="dtensor"),
                                    dict(sequence_parallel=False),
                                    dict(sequence_parallel=False, tp_layout="2d", tp=4, dp=2,
                                         micro_batch=2, global_batch=128)])
def test_torch_dtensor_keeps_the_gathered_input(change):
    """torchtitan's kernels (eager, compiled), tp_backward dtensor, no sequence parallelism or a
    2d grid: no re-gather."""
    plan = Plan(**{**GPT3, **change})
    assert _again("gpt3-175b", plan) == {}


def test_the_field_overrides_the_kernels():
    plan = Plan(**GPT3, kernels="eager", tp_backward="megatron")
    assert set(_again("gpt3-175b", plan)) == {"tp/layer/all_gather_again",
                                              "tp/output/all_gather_again"}


def test_mla_gathers_its_two_up_projection_latents_again():
    """The query and key/value latents feed TE column-parallel up projections; the rotary key's
    gather is Megatron-Core's autograd function, whose backward only reduce-scatters."""
    model = load_model("deepseek-v3")
    plan = Plan(gpus=256, tp=2, dp=128, ep=64, micro_batch=1, global_batch=1024,
                sequence_parallel=True)
    rows = [(r["stage"], r["nbytes"]) for r in comm_ledger(model, plan, HW)
            if r["name"] == "tp/mla/all_gather_again"]
    T = model.seq_len
    latents = [2 * T * model.q_lora_rank, 2 * T * model.kv_lora_rank]
    assert [b for st, b in rows if st == "every"] == latents


@pytest.mark.parametrize("model, plan", [
    ("gpt3-175b", GPT3),
    ("llama3-8b", dict(gpus=8, tp=2, dp=4, micro_batch=1, global_batch=64,
                       sequence_parallel=True)),
    ("qwen3-235b-a22b", dict(gpus=256, tp=2, dp=128, ep=32, micro_batch=1, global_batch=1024,
                             sequence_parallel=True)),
    ("deepseek-v3", dict(gpus=256, tp=2, dp=128, ep=64, micro_batch=1, global_batch=1024,
                         sequence_parallel=True)),
])
def test_the_re_gathers_never_make_a_plan_faster_and_hide_behind_the_gemms(model, plan):
    """With userbuffers (tp_comm_overlap) both backwards hide the input gradients' reductions
    behind the weight-gradient GEMMs, so Megatron's differs from DTensor's by its re-gathers
    alone: more communication costs time or nothing, never less (a phase's overlap covers each
    of its collectives once, however many share a name: MLA's latents); they hide behind the
    input-gradient GEMMs, slowing them by the contention."""
    plan = dict(plan, tp_comm_overlap=True)
    on = predict(model, HW, Plan(**plan))
    off = predict(model, HW, Plan(**plan, tp_backward="dtensor"))
    assert on.step_time_s >= off.step_time_s
    assert on.hidden_s["comm/tp"] > off.hidden_s["comm/tp"]
    assert on.breakdown_s["compute/overlap_contention"] > \
        off.breakdown_s["compute/overlap_contention"]


def test_to_dict_and_the_plan_rules():
    assert "tp_backward" not in Plan(**GPT3).to_dict()
    assert Plan(**GPT3, tp_backward="dtensor").to_dict()["tp_backward"] == "dtensor"
    assert Plan(**GPT3, tp_backward="auto").tp_backward is None
    with pytest.raises(PlanError, match="tp_backward"):
        Plan(**GPT3, tp_backward="deepspeed")


def test_the_cli_flags_and_the_idle_refusal():
    base = ["predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8", "--tp", "2",
            "--global-batch", "64", "--json"]
    code, out, err = run_main([*base, "--sequence-parallel", "--tp-backward", "dtensor"])
    assert code == 0, err
    assert json.loads(out)["plan"]["tp_backward"] == "dtensor"
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", HW, "--gpus",
                             "8", "--global-batch", "64", "--tp-backward", "megatron"])  # tp 1
    assert code == 4 and len(err.strip().splitlines()) == 1, err
    assert "tp_backward" in err and "--tp-backward" in err


def test_the_validation_dry_run_agrees_and_says_the_job_keeps_the_gathered_inputs():
    """The job (torch DTensor) issues no re-gather: its collectives are compared with the ledger
    of tp_backward dtensor, and the notes say so."""
    code, out, err = run_main(["validate", "--dry-run", "--model", "gpt2-small", "--gpus", "4",
                               "--tp", "2", "--dp", "2", "--sequence-parallel",
                               "--global-batch", "8", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["agree"] is True
    assert any("gather the input again" in note for note in doc["notes"])


def test_megatron_hides_the_input_gradients_reduction_behind_the_weight_gradient_gemm():
    """Without userbuffers too: the backward's reduce-scatters (all-reduces without sequence
    parallelism) of the QKV and MLP-up input gradients hide behind their weight-gradient GEMMs;
    under DTensor they show whole."""
    for kw in (dict(GPT3), dict(GPT3, sequence_parallel=False)):
        meg = predict("gpt3-175b", HW, Plan(**kw))
        dt = predict("gpt3-175b", HW, Plan(**kw, tp_backward="dtensor"))
        assert dt.hidden_s.get("comm/tp", 0.0) == 0.0
        assert meg.breakdown_s["comm/tp"] < dt.breakdown_s["comm/tp"]
        assert meg.step_time_s < dt.step_time_s
