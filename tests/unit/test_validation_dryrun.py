"""--dry-run: the job's collectives on a fake process group of 64 and 512 ranks, in one process.

Counts are worked by hand for tiny-gpt (L=4 layers, h=256, s=128, V=1024, fp32, micro-batch 1):
one activation of a micro-batch is T*h*4 = 128*256*4 = 131,072 bytes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from perfmodel import Plan, load_model  # noqa: E402
from validation import dryrun  # noqa: E402
from validation.jobspec import TP_BACKWARD_NOTE  # noqa: E402

ACT = 128 * 256 * 4
L = 4


def _counts(plan: Plan) -> dict[tuple[str, str, int], float]:
    model = load_model("tiny-gpt").replace(tied_embeddings=False)
    counted = dryrun.count_collectives(model, plan)
    out: dict[tuple[str, str, int], float] = {}
    for r in counted["records"]:
        key = (r["axis"], r["op"], r["bytes"])
        out[key] = out.get(key, 0) + r["count"]
    total = sum(out.values())
    # torch's own CommDebugMode sees exactly as many collectives as the job's counter (pipeline
    # messages are derived, not issued: the fake group cannot carry them).
    assert counted["comm_debug_mode_total"] + counted["derived_total"] == total
    return out


def test_tensor_parallel_1d_on_64_ranks_is_megatron():
    counts = _counts(Plan(gpus=64, tp=8, dp=8, global_batch=8, dtype="fp32"))
    # forward: 2 per layer + embedding; backward: 2 per layer + LM head input.
    assert counts[("tp", "all_reduce", ACT)] == 2 * L + 1 + 2 * L + 1
    # vocab-parallel cross-entropy: max, sum of exponentials, target logit over T fp32 values.
    assert counts[("tp", "all_reduce", 128 * 4)] == 3
    assert [k for k in counts if k[0] == "dp"] == [
        ("dp", "all_reduce", k[2]) for k in counts if k[0] == "dp"
    ]
    assert sum(v for k, v in counts.items() if k[0] == "dp") == 1  # one flat gradient all-reduce


def test_sequence_parallel_on_512_ranks():
    counts = _counts(
        Plan(gpus=512, tp=8, dp=64, global_batch=64, sequence_parallel=True, dtype="fp32")
    )
    # Per layer 2 all-gathers forward (2 reduce-scatters backward) and 2 reduce-scatters forward
    # (2 all-gathers backward); the LM head gathers its input forward and reduce-scatters backward;
    # the embedding all-reduces forward and gathers its gradient backward (learned positions).
    assert counts[("tp", "all_gather", ACT)] == 4 * L + 1 + 1
    assert counts[("tp", "reduce_scatter", ACT)] == 4 * L + 1
    assert counts[("tp", "all_reduce", ACT)] == 1
    # Norm weights and biases (2 per norm, 2L + 1 norms) are reduced in one call.
    assert counts[("tp", "all_reduce", (2 * L + 1) * 2 * 256 * 4)] == 1


def test_sequence_parallel_norm_gradients_of_rank_0_over_two_stages():
    """pp 2: rank 0 holds layers 0-1 and their 2 x 2 norms (weight and bias); the final norm is
    the last stage's, not in rank 0's all-reduce."""
    counts = _counts(Plan(gpus=64, tp=8, pp=2, dp=4, global_batch=8, sequence_parallel=True,
                          dtype="fp32"))
    assert counts[("tp", "all_reduce", (2 * L // 2) * 2 * 256 * 4)] == 1
    assert ("tp", "all_reduce", (2 * L // 2 + 1) * 2 * 256 * 4) not in counts


def test_data_parallel_gradient_bytes_on_64_ranks():
    counts = _counts(Plan(gpus=64, dp=64, global_batch=64, dtype="fp32"))
    h, f, V, s = 256, 1024, 1024, 128
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, MLP, two layer norms
    params = L * layer + V * h + s * h + 2 * h + V * h  # + embeddings, final norm, untied head
    assert counts == {("dp", "all_reduce", 4 * params): 1}


def test_fsdp_zero3_gathers_every_unit_forward_and_backward():
    counts = _counts(Plan(gpus=64, dp=64, global_batch=64, zero=3, dtype="fp32"))
    gathered = sum(k[2] * v for k, v in counts.items() if k[1] == "all_gather")
    scattered = sum(k[2] * v for k, v in counts.items() if k[1] == "reduce_scatter")
    assert gathered == 2 * scattered  # every parameter gathered twice, its gradient scattered once
    assert sum(v for k, v in counts.items() if k[1] == "all_gather") == 2 * (L + 1)


def test_pipeline_messages_of_rank_0_on_64_ranks():
    # pp 2 x tp 2 x dp 16, 4 micro-batches of 1: rank 0 holds chunk 0 of 2; per micro-batch it
    # sends an activation forward and receives its gradient: 8 messages of 1 x 128 x 256 fp32
    # (the whole activation: torch.distributed.pipelining sends it from every tp rank).
    counts = _counts(Plan(gpus=64, pp=2, tp=2, dp=16, global_batch=64, dtype="fp32"))
    assert counts[("pp", "send_recv", ACT)] == 8
    # Its two layers: 2 all-reduces forward and 2 backward each, + the embedding's, per micro-batch.
    assert counts[("tp", "all_reduce", ACT)] == 4 * (2 * 2 + 1 + 2 * 2)


def test_interleaved_rank_0_holds_a_middle_chunk():
    # pp 2, 2 virtual stages: rank 0 holds chunks 0 and 2 of 4; chunk 2 receives and sends in
    # both directions: (2 + 4) messages per micro-batch, 2 micro-batches of 2 samples.
    counts = _counts(
        Plan(
            gpus=64,
            pp=2,
            dp=32,
            global_batch=128,
            micro_batch=2,
            schedule="interleaved",
            virtual_stages=2,
            dtype="fp32",
        )
    )
    assert counts[("pp", "send_recv", 2 * ACT)] == (2 + 4) * 2


def test_pipeline_with_fsdp_is_refused_with_a_reason():
    from perfmodel.errors import PlanError

    with pytest.raises(PlanError, match="pipeline"):
        dryrun.count_collectives(
            load_model("tiny-gpt"), Plan(gpus=64, pp=2, dp=32, global_batch=64, zero=3)
        )


def test_fsdp_of_a_model_the_cpu_cannot_hold_is_refused_in_one_line(monkeypatch):
    # FSDP2 refuses meta parameters: a zero-3 dry run builds the model on the CPU; where that
    # would not fit (here: a system that says it has 1 GiB free) it says so before it starts,
    # rather than the kernel killing it without a word
    import os

    from perfmodel.errors import PlanError

    real = os.sysconf
    free = {"SC_AVPHYS_PAGES": 2**18, "SC_PAGE_SIZE": 4096}  # 1 GiB
    monkeypatch.setattr(os, "sysconf", lambda name: free.get(name) or real(name))
    with pytest.raises(PlanError, match=r"builds mixtral-8x7b whole on the CPU .* about 174 GiB, "
                                        r"and 1 GiB are free") as err:
        dryrun.count_collectives(load_model("mixtral-8x7b"),
                                 Plan(gpus=16, dp=16, ep=8, global_batch=16, zero=3))
    assert "\n" not in str(err.value)


PLANS = {
    "data-64": dict(gpus=64, dp=64, global_batch=64),
    "data-512": dict(gpus=512, dp=512, global_batch=512),
    "tensor-64": dict(gpus=64, tp=8, dp=8, global_batch=8),
    "tensor-512": dict(gpus=512, tp=8, dp=64, global_batch=64),
    "sequence-64": dict(gpus=64, tp=8, dp=8, global_batch=8, sequence_parallel=True),
    "sequence-512": dict(gpus=512, tp=8, dp=64, global_batch=64, sequence_parallel=True),
    "fsdp-64": dict(gpus=64, dp=64, global_batch=64, zero=3),
    "fsdp-512": dict(gpus=512, tp=8, dp=64, global_batch=64, zero=3),
    # three micro-batches: FSDP2 reduce-scatters in each backward, or, deferred, the last only
    "fsdp-64-mb3": dict(gpus=64, dp=64, global_batch=192, zero=3),
    "fsdp-64-mb3-deferred": dict(gpus=64, dp=64, global_batch=192, zero=3, defer_grad_sync=True),
    # kept gathered from forward to backward (one gather a micro-batch), or through the step (one
    # gather and, deferred, one reduce-scatter a step: NeMo AutoModel's enable_fsdp_optimizations)
    "fsdp-64-mb3-kept-backward": dict(gpus=64, dp=64, global_batch=192, zero=3,
                                      fsdp_reshard="backward"),
    "fsdp-512-mb3-kept-step": dict(gpus=512, tp=8, dp=64, global_batch=192, zero=3,
                                   fsdp_reshard="step"),
    # bf16: weights gathered in bf16, gradients reduced in fp32 (Megatron-LM's convention)
    "data-64-bf16": dict(gpus=64, dp=64, global_batch=64, dtype="bf16"),
    "fsdp-512-bf16": dict(gpus=512, tp=8, dp=64, global_batch=64, zero=3, dtype="bf16"),
    # sequence parallelism over pipeline stages: rank 0's norm-gradient all-reduce holds its
    # own stage's norms, not the last stage's final norm
    "sequence-pipeline-64": dict(gpus=64, tp=8, pp=2, dp=4, global_batch=8,
                                 sequence_parallel=True),
    "sequence-pipeline-512": dict(gpus=512, tp=4, pp=4, dp=32, global_batch=64,
                                  sequence_parallel=True),
    # full recompute repeats the whole layer, its last reduce-scatter included (Megatron's)
    "sequence-full-recompute-64": dict(gpus=64, tp=8, dp=8, global_batch=8,
                                       sequence_parallel=True, recompute="full"),
    "sequence-full-recompute-512": dict(gpus=512, tp=4, pp=2, cp=2, dp=32, global_batch=64,
                                        sequence_parallel=True, recompute="full"),
    # ZeRO 1 and 2: Megatron's distributed optimizer, one reduce-scatter of the gradient buffer
    # and one all-gather of the weights per step, over dp (dp x cp with cp); several micro-batches
    "zero1-64": dict(gpus=64, dp=64, global_batch=256, zero=1),
    "zero2-512": dict(gpus=512, dp=512, global_batch=1024, zero=2),
    "zero1-sequence-64": dict(gpus=64, tp=8, dp=8, global_batch=32, zero=1,
                              sequence_parallel=True),
    "zero2-sequence-512": dict(gpus=512, tp=8, dp=64, global_batch=128, zero=2,
                               sequence_parallel=True),
    "zero1-cp-64": dict(gpus=64, tp=2, cp=4, dp=8, global_batch=32, zero=1,
                        sequence_parallel=True),
    "zero1-cp-512": dict(gpus=512, tp=4, cp=2, dp=64, global_batch=128, zero=1),
    "zero1-pipeline-64": dict(gpus=64, tp=2, pp=4, dp=8, global_batch=32, zero=1,
                              sequence_parallel=True),
    "zero2-pipeline-512": dict(gpus=512, tp=4, pp=2, cp=2, dp=32, global_batch=128, zero=2,
                               sequence_parallel=True),
    "zero1-interleaved-64": dict(gpus=64, pp=2, dp=32, global_batch=128, zero=1,
                                 schedule="interleaved", virtual_stages=2),
    # bf16: gradients reduce-scattered in fp32 (4 B each), weights all-gathered in bf16 (2 B)
    "zero1-64-bf16": dict(gpus=64, dp=64, global_batch=256, zero=1, dtype="bf16"),
    "zero1-pipeline-512-bf16": dict(gpus=512, tp=8, pp=2, dp=32, global_batch=64, zero=1,
                                    sequence_parallel=True, dtype="bf16"),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_dry_run_agrees_with_the_model_ledger(name):
    """The issue's acceptance test: every collective of the job, counted on a fake process group
    of the full world, agrees exactly (count and bytes per call) with perfmodel's ledger."""
    plan = Plan(**{"dtype": "fp32", **PLANS[name]})
    result = dryrun.dry_run(load_model("tiny-gpt"), plan)
    assert result["ledger_available"]
    differs = [r for r in result["rows"] if not r["agree"]]
    assert not differs, f"ledger differs from the job: {differs}"
    assert result["agree"]


def test_gpt3_175b_on_1024_ranks_fits_on_the_meta_device():
    """A rank of GPT-3 175B (tp 8) holds 22e9 parameters: counted without storage, in seconds."""
    model = load_model("gpt3-175b").replace(tied_embeddings=False)
    plan = Plan(gpus=1024, tp=8, dp=128, global_batch=128, dtype="bf16")
    counted = dryrun.count_collectives(model, plan)
    act = 2048 * 12288 * 2  # T * h * 2 bytes (bf16)
    counts: dict[tuple[str, str, int], float] = {}
    for r in counted["records"]:  # summed over phases
        key = (r["axis"], r["op"], r["bytes"])
        counts[key] = counts.get(key, 0) + r["count"]
    layers = 96
    assert counts[("tp", "all_reduce", act)] == 2 * layers + 1 + 2 * layers + 1
    assert counts[("tp", "all_reduce", 2048 * 4)] == 3
    assert counted["comm_debug_mode_total"] == sum(counts.values())
    assert counted["derived_total"] == 0


@pytest.mark.parametrize("name", ["llama3-8b", "llama2-7b"])
def test_dry_run_of_rotary_models_agrees_and_says_what_the_job_changes(name):
    """The job learns a position table (seq_len x hidden) where Llama uses rotary positions: the
    ledger is taken for the model as the job builds it, and the result says so (before, the dp
    all-reduce differed by that table: 8192 x 4096 x 4 B for llama3-8b); and it runs tensor
    parallelism's backward as torch DTensor does (jobspec.TP_BACKWARD_NOTE)."""
    model = load_model(name)
    assert model.position_embedding == "rotary"
    result = dryrun.dry_run(model, Plan(gpus=16, tp=8, dp=2, global_batch=2, dtype="bf16"))
    assert result["agree"], [r for r in result["rows"] if not r["agree"]]
    assert result["notes"] == [
        f"the job learns a position table where {name} uses rotary positions: compared as the "
        "job builds it", TP_BACKWARD_NOTE]


@pytest.mark.parametrize("tp", [2, 8])
def test_a_vocabulary_tp_does_not_divide_is_padded_as_megatron_pads_it(tp):
    """GPT-2's 50,257 tokens over tp ranks: torch's Shard would give rank 0 one row more of the
    embedding and of the output layer than the ledger's vocab / tp (before: the dp all-reduce
    differed by h elements, and --dry-run said the job disagreed). The job pads the vocabulary to
    a multiple of tp, as Megatron-LM does, and both sides count the padded model."""
    model = load_model("tiny-gpt").replace(vocab=1025)
    result = dryrun.dry_run(model, Plan(gpus=2 * tp, tp=tp, dp=2, global_batch=2, dtype="fp32"))
    assert result["agree"], [r for r in result["rows"] if not r["agree"]]
    padded = -(-1025 // tp) * tp
    assert any(f"pads the vocabulary to {padded:,}" in note for note in result["notes"])


def test_the_job_builds_the_q_k_v_biases_qwen2_has():
    """Qwen2's q, k and v projections carry biases its other linears lack (qkv_bias): the job
    built none, and the dp all-reduce differed by them (a dry-run probe, 2026-12-07)."""
    model = load_model("tests/data/hf/qwen2.5-7b/config.json", seq_len=256).replace(
        layers=2, hidden=256, heads=8, kv_heads=4, ffn_hidden=512, vocab=512)
    assert model.qkv_bias and not model.bias
    result = dryrun.dry_run(model, Plan(gpus=16, tp=4, dp=4, global_batch=4, dtype="fp32",
                                        sequence_parallel=True))
    assert result["agree"], [r for r in result["rows"] if not r["agree"]]


def test_a_cp_plan_predict_refuses_for_its_hardware_s_kernels_is_counted_and_said(run_cli):
    """The dry run counts the job's collectives whatever the hardware (the job attends with
    torch's fused SDPA); predict refuses cp where the hardware has no flash kernel for the dtype:
    the dry run says so (it agreed in silence, a dry-run probe's finding, 2026-12-07)."""
    args = ("--model", "tiny-gpt", "--dp", "8", "--cp", "8", "--global-batch", "8", "--dtype",
            "fp32", "--hardware", "dgx-a100-80gb")
    refused = run_cli("predict", *args)
    assert refused.returncode == 4 and "cp 8 needs fused (flash) attention" in refused.stderr
    counted = run_cli("validate", "--dry-run", *args)
    assert counted.returncode == 0, counted.stderr
    assert "dgx-a100-80gb has no flash kernel measured for fp32, so predict refuses" in \
        " ".join((counted.stdout + counted.stderr).split())


@pytest.mark.parametrize("hardware, flags, why", [
    ("dgx-h100", ("--fp8-recipe", "mxfp8"), "fp8_recipe mxfp8: hardware 'dgx-h100' runs"),
    ("dgx-b200", ("--fp8-params", "--zero", "3"), "fp8_params with zero 3 is modelled for")])
def test_an_fp8_plan_predict_refuses_for_its_hardware_is_counted_and_said(run_cli, hardware,
                                                                          flags, why):
    """As the cp plan above: an FP8 recipe the GPU does not run, FP8 weights under ZeRO 3 with
    MXFP8 (predict refuses both) agreed in silence (a dry-run probe's finding, 2026-12-07)."""
    args = ("--model", "tiny-gpt", "--dp", "8", "--global-batch", "8", "--dtype", "fp8",
            "--hardware", hardware, *flags)
    refused = run_cli("predict", *args)
    assert refused.returncode == 4 and why in " ".join(refused.stderr.split())
    counted = run_cli("validate", "--dry-run", *args)
    assert counted.returncode == 0, counted.stderr
    said = " ".join((counted.stdout + counted.stderr).split())
    assert f"predict refuses this plan on {hardware} ({why}" in said
    plain = run_cli("validate", "--dry-run", *args[:-len(flags)])
    assert "predict refuses" not in plain.stdout + plain.stderr


def test_the_python_dry_run_refuses_a_plan_as_the_command_line_does():
    """dryrun.dry_run checks the plan against the model: layers that do not split over pp raised
    the job's own ValueError (workload.model.chunk_layers) from Python (a probe's finding)."""
    from perfmodel.errors import PlanError

    model = load_model("tiny-gpt").replace(layers=5)
    with pytest.raises(PlanError, match=r"layers \(5\) must be divisible by pp"):
        dryrun.dry_run(model, Plan(gpus=2, pp=2, global_batch=4, micro_batch=1))
