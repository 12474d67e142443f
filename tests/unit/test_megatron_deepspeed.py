"""Megatron-DeepSpeed launch scripts (--deepspeed): DeepSpeed's pipeline engine, its partition
of the layers, ZeRO from the DeepSpeed config, BLOOM's ALiBi and padded vocabulary
(perfmodel.configs.megatron_deepspeed; the sources in its docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfmodel import load_model
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron_deepspeed import partition_balanced, stage_split
from perfmodel.errors import PlanError, SpecError
from perfmodel.predict import parameter_count
from tests.unit.test_megatron_older import plan_of

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
BASE = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --bf16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --deepspeed ")


def test_the_bloom_176b_script_reads_as_it_ran():
    job = read_config(DATA / "megatron_deepspeed_bloom_176b.slurm")
    spec = resolve_model(job, None, None)
    spec, plan = resolve_plan(job, spec, {"gpus": 384})  # its torchrun's nnodes is SLURM's
    assert (spec.layers, spec.hidden, spec.heads, spec.vocab, spec.position_embedding) == (
        70, 14336, 112, 250880, "alibi")
    assert parameter_count(spec, "dgx-a100-80gb") == parameter_count(
        load_model("bloom-176b"), "dgx-a100-80gb")
    assert (plan["tp"], plan["pp"], plan["dp"], plan["micro_batch"]) == (4, 12, 8, 2)
    # BF16_Optimizer at ZeRO stage 0; the engine's 1F1B, its sends partitioned over tp
    assert (plan["zero"], plan["schedule"], plan["pp_scatter_gather"]) == (1, "1f1b", True)
    assert plan["bf16_optimizer"] is True
    assert (plan["recompute"], plan["flash_attention"]) == ("full", False)
    # type:transformer|embedding: 70 layers + 2 embeddings over 12 stages, 6 each
    assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (5, 5)
    # the comment ending in a backslash continues nothing: --exit-duration-in-mins was read
    assert "--exit-duration-in-mins" in {s.key for s in job.ignored}
    # its export CUDA_LAUNCH_BLOCKING=1 (host and device time add) is said, not modelled
    assert any(n.startswith("CUDA_LAUNCH_BLOCKING=1") for n in job.notes)


def test_deepspeed_partitions_as_deepspeed_does():
    # deepspeed/runtime/utils.py partition_balanced (v0.6.5): the greedy fill of the lightest
    # bottleneck; 7 equal items over 3 parts: 3, 3, 1
    assert partition_balanced([1] * 7, 3) == [0, 3, 6, 7]
    assert partition_balanced([0, 1, 0, 1, 1, 1, 0, 0, 1, 0], 2) == [0, 5, 10]
    assert stage_split("type:transformer", 70, 12, True, "x", "k") == [6] * 11 + [4]
    # uniform counts every entry of GPTModelPipe's list (3 before the layers, 4 after)
    assert stage_split("uniform", 24, 4, True, "x", "k") == [4, 7, 7, 6]
    with pytest.raises(PlanError, match="parameters balances"):
        stage_split("parameters", 24, 4, True, "x", "k")


def test_ds_config_beside_the_arguments_gives_the_stage(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1},
                                                  "bf16": {"enabled": True}}))
    job, plan = plan_of(tmp_path, BASE + "--deepspeed_config ds.json --zero-stage 0")
    assert plan["zero"] == 1 and any("runs the config's" in n for n in job.notes)
    assert not plan.get("bf16_optimizer")  # stage 1: DeepSpeed's ZeRO optimizer, not BF16's
    (tmp_path / "ds.json").write_text(json.dumps({"fp16": {"enabled": True}}))
    with pytest.raises(SpecError, match="bf16.enabled False disagrees"):
        plan_of(tmp_path, BASE + "--deepspeed_config ds.json")
    (tmp_path / "ds.json").write_text(json.dumps({"bf16": {"enabled": True},
                                                  "pipeline": {"pipe_partitioned": False}}))
    _, plan = plan_of(tmp_path, BASE + "--deepspeed_config ds.json")
    assert plan["pp_scatter_gather"] is False


@pytest.mark.parametrize("extra, field", [
    ("--zero-stage 2", "refuses ZeRO stages 2 and 3"),
    ("--partition-activations", "--partition-activations"),
    ("--checkpoint-in-cpu", "--checkpoint-in-cpu"),
    ("--num-layers-per-virtual-pipeline-stage 2", "does not interleave"),
    ("--pp-partition-method type:nothing", "matches no layer"),
])
def test_what_megatron_deepspeed_cannot_run_or_perfmodel_cannot_model(tmp_path, extra, field):
    with pytest.raises(PlanError, match=field):
        plan_of(tmp_path, BASE + extra)


def test_deepspeed_options_need_deepspeed(tmp_path):
    with pytest.raises(PlanError, match="without --deepspeed"):
        plan_of(tmp_path, BASE.replace("--deepspeed ", "") + "--zero-stage 1")
    # without a pipeline engine (microsoft's --no-pipeline-parallel) ZeRO 3 is DeepSpeed's
    one = BASE.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
    _, plan = plan_of(tmp_path, one + "--no-pipeline-parallel --zero-stage 3")
    assert plan["zero"] == 3
