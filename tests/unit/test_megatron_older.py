"""Megatron-LM scripts of 2021-23 (NVIDIA/Megatron-LM megatron/arguments.py at the commits named):
their recompute options, their pipeline sends (scatter-gathered over tp), their attention
(unfused), --DDP-impl, and the v2.x example's launch (srun sh -c "${run_cmd}" with "$@")."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError, SpecError

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
BASE = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --fp16 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 ")


def plan_of(tmp_path: Path, text: str, gpus: int = 8) -> tuple[object, dict]:
    path = tmp_path / "args.txt"
    path.write_text(text)
    job = read_config(path)
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": gpus})
    return job, plan


def test_the_v2_example_script_reads_as_its_era_ran():
    job = read_config(DATA / "megatron_v2_gpt3_175b.sh")
    _, plan = resolve_plan(job, resolve_model(job, "gpt3-175b", None), {"gpus": 1024})
    assert (plan["tp"], plan["pp"], plan["dp"], plan["global_batch"]) == (8, 16, 8, 1536)
    assert (plan["recompute"], plan["dtype"]) == ("full", "fp16")
    # v2.3 to 2023-01 scatter-gathered the sends over tp; no fused attention kernel then
    assert plan["pp_scatter_gather"] is True and plan["flash_attention"] is False
    assert any("$@ (the script's own arguments) read as none" in n for n in job.notes)
    assert dict((s.key, s.value) for s in job.read)["launch"] == "python -u `pwd`/pretrain_gpt.py"


def test_checkpoint_activations_is_todays_full_uniform_recompute(tmp_path):
    _, plan = plan_of(tmp_path, BASE + "--checkpoint-activations")
    assert (plan["recompute"], plan["pp_scatter_gather"]) == ("full", True)
    _, plan = plan_of(tmp_path, BASE + "--checkpoint-activations --checkpoint-num-layers 1 "
                                       "--no-scatter-gather-tensors-in-pipeline")
    assert plan["recompute"] == "full" and not plan.get("pp_scatter_gather")
    # chunks of 2 layers save half the inputs: today's uniform method in groups of 2
    _, plan = plan_of(tmp_path, BASE + "--checkpoint-activations --checkpoint-num-layers 2")
    assert (plan["recompute"], plan["recompute_method"], plan["recompute_num_layers"]) == \
        ("full", "uniform", 2)
    # without --checkpoint-activations the chunk size does nothing
    job, plan = plan_of(tmp_path, BASE + "--checkpoint-num-layers 2")
    assert plan["recompute"] == "none" and "pp_scatter_gather" not in plan


def test_activations_checkpoint_method_of_v2_6(tmp_path):
    # block: the first k of each chunk's layers recomputed whole
    _, plan = plan_of(tmp_path, BASE + "--activations-checkpoint-method block "
                                       "--activations-checkpoint-num-layers 2")
    assert (plan["recompute"], plan["recompute_method"], plan["recompute_num_layers"]) == \
        ("full", "block", 2)
    with pytest.raises(SpecError, match="older and the newer way"):
        plan_of(tmp_path, BASE + "--checkpoint-activations --recompute-granularity full "
                                 "--recompute-method uniform")


def test_sends_are_whole_with_sequence_parallelism_or_a_script_of_today(tmp_path):
    _, plan = plan_of(tmp_path, BASE + "--checkpoint-activations --sequence-parallel")
    assert not plan.get("pp_scatter_gather")  # 2022's condition: not args.sequence_parallel
    _, plan = plan_of(tmp_path, BASE + "--recompute-granularity full --recompute-method uniform")
    assert not plan.get("pp_scatter_gather") and plan.get("flash_attention") is not False


def test_ddp_impl(tmp_path):
    one = BASE.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1")
    _, plan = plan_of(tmp_path, one + "--DDP-impl torch")
    assert plan["overlap_grad_sync"] is True
    _, plan = plan_of(tmp_path, one + "--DDP-impl local")
    assert plan["overlap_grad_sync"] is False
    with pytest.raises(PlanError, match="--DDP-impl torch: with a pipeline"):
        plan_of(tmp_path, BASE + "--DDP-impl torch")


def test_recommend_says_it_searches_whole_sends(run_cli):
    """recommend --from-config of such a script: its scatter-gathered sends are not searched
    (Plan.pp_scatter_gather never is), and it says so rather than drop them without a word."""
    res = run_cli("recommend", "--from-config", DATA / "megatron_v2_gpt3_175b.sh", "--model",
                  "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "1024", "--top", "1")
    assert res.returncode == 0, res.stderr
    assert "recommend searches whole sends" in res.stderr
