"""The loss's kernel (Plan.cross_entropy): Transformer Engine's fused cross entropy keeps the bf16
logits, which hold their gradient (transformer_engine/pytorch/cross_entropy.py at 02965d2), where
Megatron's unfused loss keeps an fp32 copy beside them (perfmodel.step.memory.LOSS_LOGITS,
LOSS_LOGITS_OWN), as does Megatron-Core's native fusion; each moves the bytes its kernels move
(perfmodel.costs.compute: Megatron's op by op, counted on torch's dispatch in
tests/unit/test_loss_memory.py). PyTorch's F.cross_entropy on the bf16 logits without an upcast
(no-upcast: NeMo AutoModel's MaskedCrossEntropy with fp32_upcast false) keeps three bf16 copies
(counted op by op in tests/unit/test_loss_memory.py) and passes three times over bf16 values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel import PlanError, SpecError, load_hardware, load_model, predict
from perfmodel.costs.compute import (
    CROSS_ENTROPY_PASSES,
    MEGATRON_LOSS_BACKWARD_BYTES,
    MEGATRON_LOSS_FORWARD_BYTES,
    NATIVE_LOSS_BACKWARD_BYTES,
    NATIVE_LOSS_FORWARD_BYTES,
    TE_LOSS_BACKWARD_PASSES,
    TE_LOSS_FORWARD_PASSES,
)
from perfmodel.step.memory import LOSS_LOGITS, LOSS_LOGITS_EAGER, LOSS_LOGITS_OWN, LOSS_LOGITS_TE
from perfmodel.strategy import Plan

HW = "dgx-h100"
MEGATRON_BYTES = LOSS_LOGITS * 4 + LOSS_LOGITS_OWN * 2  # per bf16 logit: Megatron's loss
ROOT = Path(__file__).resolve().parents[2]


def _pair(**plan):
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    unfused = predict(model, hw, Plan(**plan))
    te = predict(model, hw, Plan(**plan, cross_entropy="te"))
    return model, hw, unfused, te


@pytest.mark.parametrize("tp", [1, 4])
def test_te_keeps_the_bf16_logits_instead_of_an_fp32_copy_beside_them(tp):
    model, _, unfused, te = _pair(gpus=8, dp=8 // tp, tp=tp, micro_batch=2, global_batch=64,
                                  sequence_parallel=tp > 1)
    tokens = 2 * model.seq_len
    per_copy = tokens * model.vocab / tp  # elements of the logits on one rank
    key = "activations/embedding_output"
    saved = unfused.memory_breakdown_bytes[key] - te.memory_breakdown_bytes[key]
    assert saved == pytest.approx((MEGATRON_BYTES - LOSS_LOGITS_TE * 2) * per_copy, rel=1e-9)
    assert te.memory_per_gpu_bytes < unfused.memory_per_gpu_bytes


@pytest.mark.parametrize("kernel, forward, backward", [
    # per bf16 logit: Transformer Engine's two kernels forward (3 e), its in-place scaling
    # backward (2 e); Megatron-Core's native fusion 20 + e and 8 + 2
    ("te", TE_LOSS_FORWARD_PASSES * 2, TE_LOSS_BACKWARD_PASSES * 2),
    ("native", NATIVE_LOSS_FORWARD_BYTES + 2, NATIVE_LOSS_BACKWARD_BYTES + 2)])
def test_each_loss_kernel_moves_its_own_bytes(kernel, forward, backward):
    """Against Megatron's unfused loss, 32 + (2 + 4) bytes a logit forward and 8 + (4 + 2)
    backward (its upcast and the upcast's backward)."""
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8)
    unfused = predict(model, hw, Plan(**plan))
    other = predict(model, hw, Plan(**plan, cross_entropy=kernel))
    per_copy = model.seq_len * model.vocab
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    megatron = {"forward": MEGATRON_LOSS_FORWARD_BYTES + 6,
                "backward": MEGATRON_LOSS_BACKWARD_BYTES + 6}
    for direction, own in (("forward", forward), ("backward", backward)):
        key = f"compute/{direction}/embedding_logits"
        assert unfused.breakdown_s[key] - other.breakdown_s[key] == pytest.approx(
            (megatron[direction] - own) * per_copy / bandwidth, rel=1e-9)
    if kernel == "native":  # the fp32 copy held as the unfused loss holds it
        assert other.memory_breakdown_bytes == unfused.memory_breakdown_bytes


def test_the_unfused_loss_is_pytorchs_with_eager_kernels():
    """With eager kernels the unfused loss is PyTorch's F.cross_entropy (torchtitan's, the
    validation job's): its three passes over fp32 values forward, twice that backward, as
    cross_entropy torch."""
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels="eager")
    eager = predict(model, hw, Plan(**plan))
    torch = predict(model, hw, Plan(**plan, cross_entropy="torch"))
    fused = predict(model, hw, Plan(**{**plan, "kernels": "fused"}))
    per_copy = model.seq_len * model.vocab
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    for direction, factor in (("forward", 1), ("backward", 2)):
        key = f"compute/{direction}/embedding_logits"
        assert eager.breakdown_s[key] == pytest.approx(torch.breakdown_s[key], rel=1e-9)
        pytorch = factor * CROSS_ENTROPY_PASSES * 4
        megatron = (MEGATRON_LOSS_FORWARD_BYTES if factor == 1
                    else MEGATRON_LOSS_BACKWARD_BYTES) + 6
        assert eager.breakdown_s[key] - fused.breakdown_s[key] == pytest.approx(
            (pytorch - megatron) * per_copy / bandwidth, rel=1e-9)


@pytest.mark.parametrize("kernels", ["fused", "eager"])
def test_no_upcast_keeps_three_bf16_copies_whatever_the_kernels(kernels):
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels=kernels)
    unfused = predict(model, hw, Plan(**plan))
    low = predict(model, hw, Plan(**plan, cross_entropy="no-upcast"))
    per_copy = model.seq_len * model.vocab
    key = "activations/embedding_output"
    upcast = LOSS_LOGITS_EAGER * 4 if kernels == "eager" else MEGATRON_BYTES
    assert unfused.memory_breakdown_bytes[key] - low.memory_breakdown_bytes[key] == \
        pytest.approx((upcast - LOSS_LOGITS_EAGER * 2) * per_copy, rel=1e-9)
    bandwidth = hw.memory_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    # Megatron's loss with fused kernels, PyTorch's with eager ones
    upcast_bytes = MEGATRON_LOSS_FORWARD_BYTES + 6 if kernels == "fused" \
        else CROSS_ENTROPY_PASSES * 4
    fewer = (upcast_bytes - CROSS_ENTROPY_PASSES * 2) * per_copy / bandwidth
    key = "compute/forward/embedding_logits"
    assert unfused.breakdown_s[key] - low.breakdown_s[key] == pytest.approx(fewer, rel=1e-9)


def test_torch_keeps_three_fp32_copies_whatever_the_kernels():
    """PyTorch's F.cross_entropy on logits.float() (NeMo AutoModel's default loss): its three
    fp32 copies and its passes with fused kernels too, where unfused counts Megatron's."""
    model, hw = load_model("llama3-8b"), load_hardware(HW)
    plan = dict(gpus=8, dp=8, micro_batch=1, global_batch=8, kernels="fused")
    unfused = predict(model, hw, Plan(**plan))
    torch = predict(model, hw, Plan(**plan, cross_entropy="torch"))
    eager = predict(model, hw, Plan(**{**plan, "kernels": "eager"}))
    key = "activations/embedding_output"
    per_copy = model.seq_len * model.vocab
    assert torch.memory_breakdown_bytes[key] - unfused.memory_breakdown_bytes[key] == \
        pytest.approx((LOSS_LOGITS_EAGER * 4 - MEGATRON_BYTES) * per_copy, rel=1e-9)
    assert torch.memory_breakdown_bytes[key] == pytest.approx(
        eager.memory_breakdown_bytes[key], rel=1e-9)
    for direction in ("forward", "backward"):  # PyTorch's passes, as with eager kernels
        key = f"compute/{direction}/embedding_logits"
        assert torch.breakdown_s[key] == pytest.approx(eager.breakdown_s[key], rel=1e-9)


def test_a_search_takes_the_loss_kernel_for_every_plan_and_agrees_with_predict():
    from perfmodel.recommend import recommend
    from perfmodel.search import SearchRequest

    model, hw = load_model("llama3-8b"), load_hardware(HW)
    rec = recommend(model, hw, SearchRequest(gpus=(8,), global_batch=64, cp=1,
                                             cross_entropy="te"), top=1)
    best = rec.top[0]
    assert best.plan.cross_entropy.value == "te"
    p = predict(model, hw, best.plan)
    assert p.step_time_s == pytest.approx(best.step_time_s, rel=1e-6)
    assert p.memory_per_gpu_bytes == pytest.approx(best.memory_per_gpu_bytes, rel=1e-6)


def test_plans_write_and_refuse_the_option():
    assert "cross_entropy" not in Plan(gpus=8, dp=8, global_batch=8).to_dict()
    assert Plan(gpus=8, dp=8, global_batch=8,
                cross_entropy="te").to_dict()["cross_entropy"] == "te"
    with pytest.raises(PlanError,
                       match="cross_entropy must be one of unfused, no-upcast, torch, te, native"):
        Plan(gpus=8, dp=8, global_batch=8, cross_entropy="liger")


def test_the_cli_and_the_config_readers_take_the_loss_kernel(run_cli, tmp_path):
    out = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                  "--global-batch", "8", "--cross-entropy", "te", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["cross_entropy"] == "te"
    bad = run_cli("predict", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                  "--global-batch", "8", "--cross-entropy", "liger")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "te" in bad.stderr
    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
            "--vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
            "--disable-bias-linear --untie-embeddings-and-output-weights "
            "--tensor-model-parallel-size 1 --cross-entropy-loss-fusion")
    for impl, want in (("te", "te"), ("native", "native")):
        path = tmp_path / f"{impl}.txt"
        path.write_text(f"{args} --cross-entropy-fusion-impl {impl}\n")
        read = run_cli("predict", "--from-config", path, "--hardware", HW, "--gpus", "8",
                       "--json")
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["plan"].get("cross_entropy") == want, impl
        assert "cross_entropy" in read.stderr
    emitted = run_cli("recommend", "--from-config", tmp_path / "te.txt", "--hardware", HW,
                      "--gpus", "8", "--emit-config", "megatron", tmp_path / "out")
    assert emitted.returncode == 0, emitted.stderr
    text = " ".join((tmp_path / "out" / "megatron_args.txt").read_text().split())
    assert "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te" in text
    native = run_cli("recommend", "--from-config", tmp_path / "native.txt", "--hardware", HW,
                     "--gpus", "8", "--emit-config", "megatron", tmp_path / "native-out")
    assert native.returncode == 0, native.stderr
    text = " ".join((tmp_path / "native-out" / "megatron_args.txt").read_text().split())
    assert "--cross-entropy-loss-fusion --cross-entropy-fusion-impl native" in text
    titan = run_cli("recommend", "--from-config", tmp_path / "native.txt", "--hardware", HW,
                    "--gpus", "8", "--emit-config", "torchtitan", tmp_path / "titan-native")
    assert titan.returncode != 0 and "cross_entropy native" in titan.stderr
    titan = run_cli("recommend", "--from-config", tmp_path / "te.txt", "--hardware", HW,
                    "--gpus", "8", "--emit-config", "torchtitan", tmp_path / "titan")
    assert titan.returncode != 0 and "cross_entropy te" in titan.stderr
    assert "Traceback" not in titan.stderr
    torch = run_cli("recommend", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                    "--global-batch", "8", "--cross-entropy", "torch", "--emit-config",
                    "megatron", tmp_path / "torch-megatron")
    assert torch.returncode != 0 and "cross_entropy torch" in torch.stderr
    for fmt in ("megatron", "torchtitan"):  # both stacks' losses upcast the logits
        low = run_cli("recommend", "--model", "llama3-8b", "--hardware", HW, "--gpus", "8",
                      "--global-batch", "8", "--cross-entropy", "no-upcast", "--emit-config",
                      fmt, tmp_path / f"low-{fmt}")
        assert low.returncode != 0 and "cross_entropy no-upcast" in low.stderr, fmt
        assert "Traceback" not in low.stderr


def test_bridge_and_automodel_configs_give_the_loss_kernel(tmp_path):
    from perfmodel.configs import read_config

    bridge = (ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text()
    assert "cross_entropy" not in bridge
    path = tmp_path / "bridge.yaml"
    path.write_text(bridge.replace("  add_bias_linear: false\n", "  add_bias_linear: false\n"
                                   "  cross_entropy_loss_fusion: true\n"
                                   "  cross_entropy_fusion_impl: te\n", 1))
    assert read_config(path).plan["cross_entropy"] == "te"
    assert "cross_entropy" not in read_config(ROOT / "tests/data/configs/bridge_llama3_8b.yaml"
                                              ).plan
    recipe = (ROOT / "tests/data/configs/automodel_qwen3_30b_a3b.yaml").read_text()
    te = tmp_path / "automodel.yaml"
    te.write_text(recipe.replace("nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy",
                                 "nemo_automodel.components.loss.te_parallel_ce."
                                 "TEParallelCrossEntropy"))
    assert read_config(te).plan["cross_entropy"] == "te"
    # the recipe's MaskedCrossEntropy with fp32_upcast false: the bf16 logits as they are
    assert "fp32_upcast: false" in recipe
    job = read_config(ROOT / "tests/data/configs/automodel_qwen3_30b_a3b.yaml")
    assert job.plan["cross_entropy"] == "no-upcast"
    upcast = tmp_path / "upcast.yaml"  # PyTorch's loss on fp32 copies, its default too
    upcast.write_text(recipe.replace("fp32_upcast: false", "fp32_upcast: true"))
    assert read_config(upcast).plan.get("cross_entropy") == "torch"
    upcast.write_text(recipe.replace("  fp32_upcast: false\n", ""))
    assert read_config(upcast).plan.get("cross_entropy") == "torch"
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe.replace("fp32_upcast: false", "fp32_upcast: sometimes"))
    with pytest.raises(SpecError, match="loss_fn.fp32_upcast"):
        read_config(bad)
    # the chunked loss keeps the bf16 logits and one fp32 chunk: not modelled, refused
    bad.write_text(recipe.replace("fp32_upcast: false", "fp32_upcast: true\n  chunk_size: 1024"))
    with pytest.raises(PlanError, match="loss_fn.chunk_size"):
        read_config(bad)
    # with tensor parallelism its loss gathers the whole vocabulary: said, not counted
    tp = tmp_path / "tp.yaml"
    tp.write_text(recipe.replace("tp_size: 1", "tp_size: 2"))
    assert any("full_tensor" in note for note in read_config(tp).notes)


def test_validation_refuses_transformer_engines_loss():
    from validation.jobspec import check_job, job_parallel

    model = load_model("tiny-gpt")
    for kernel in ("te", "native"):  # Megatron-Core's
        plan = Plan(gpus=2, dp=2, global_batch=2, cross_entropy=kernel)
        with pytest.raises(PlanError, match=f"cross_entropy {kernel}: .*F.cross_entropy"):
            check_job(model, plan, job_parallel(plan))
    # PyTorch's loss on fp32 copies is the job's own
    plan = Plan(gpus=2, dp=2, global_batch=2, cross_entropy="torch")
    check_job(model, plan, job_parallel(plan))


def test_the_validation_job_predicts_its_own_loss():
    """The validation job's loss is PyTorch's F.cross_entropy on fp32 logits (workload.model
    .loss_fn), not Megatron's: a plan of the unfused loss (every plan's default) is predicted
    as cross_entropy torch, as the job runs (as_run's documented form), so that its three fp32
    copies are counted on a GPU."""
    from perfmodel.strategy import plan_from_dict
    from validation.jobspec import as_run

    model = load_model("tiny-gpt")
    for given in ("unfused", "torch"):
        _, ran, _ = as_run(model, plan_from_dict(dict(gpus=2, dp=2, global_batch=4,
                                                      cross_entropy=given)), "nccl")
        assert ran.cross_entropy.value == "torch"


def test_a_nemo2_recipe_runs_gptconfigs_native_fusion_unless_it_says_otherwise(tmp_path):
    """nemo_run serializes what a recipe overrides: a model.config without
    cross_entropy_loss_fusion has GPTConfig's default, on (NeMo v2.0.0 and v2.2.0
    nemo/collections/llm/gpt/model/base.py), which is Megatron-Core's native fusion."""
    from perfmodel.configs import read_config

    recipe = (ROOT / "tests/data/configs/nemo2_llama3_8b.yaml").read_text()
    assert "cross_entropy" not in recipe
    assert read_config(ROOT / "tests/data/configs/nemo2_llama3_8b.yaml").plan[
        "cross_entropy"] == "native"
    anchor = "    _target_: nemo.collections.llm.gpt.model.llama.Llama3Config8B\n"
    assert anchor in recipe
    for value, want in (("false", "unfused"), ("true", "native")):
        path = tmp_path / f"{value}.yaml"
        stated = f"    cross_entropy_loss_fusion: {value}\n"
        path.write_text(recipe.replace(anchor, anchor + stated))
        assert read_config(path).plan["cross_entropy"] == want, value


def test_the_validation_run_refuses_what_its_dry_run_refuses():
    """The run as its dry run: a loss the job does not run is refused, never run as PyTorch's
    (until 2026-12-01 the run took te and native as cross_entropy torch without a word)."""
    from perfmodel.strategy import plan_from_dict
    from validation.jobspec import as_run

    model = load_model("tiny-gpt")
    for kernel in ("te", "native", "no-upcast"):
        plan = plan_from_dict(dict(gpus=2, dp=2, global_batch=4, cross_entropy=kernel))
        with pytest.raises(PlanError, match=f"cross_entropy {kernel}: "):
            as_run(model, plan, "gloo")
