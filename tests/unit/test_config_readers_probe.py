"""Config readers against what the frameworks run, where a probe of the readers found them apart
(2026-12-02): NeMo 1's gradient-accumulation fusion default and its override, AutoModel's
distributed.dp_size, Megatron-LM's per-layer --cp-comm-type and its sequence against the
position reach, a launch script's nested defaults and sourced files. Each test fails before its
fix."""

from __future__ import annotations

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

NEMO1 = {
    "trainer": {"devices": 8, "num_nodes": 1, "precision": "bf16"},
    "model": {"micro_batch_size": 1, "global_batch_size": 32, "tensor_model_parallel_size": 2,
              "pipeline_model_parallel_size": 1, "num_layers": 4, "hidden_size": 1024,
              "ffn_hidden_size": 4096, "num_attention_heads": 16, "activation": "fast-swiglu",
              "normalization": "rmsnorm", "bias": False, "position_embedding_type": "rope",
              "apply_rope_fusion": True, "share_embeddings_and_output_weights": False,
              "override_vocab_size": 32000, "megatron_amp_O2": True, "mcore_gpt": True,
              "transformer_engine": True, "sequence_parallel": True, "hidden_dropout": 0,
              "attention_dropout": 0, "optim": {"name": "fused_adam"},
              "data": {"seq_length": 2048}},
}
MEGATRON = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 "
            "--global-batch-size 16 --bf16 --tensor-model-parallel-size 2 ")


def _plan(path, gpus: int | None = None) -> dict:
    job = read_config(path)
    _, plan = resolve_plan(job, resolve_model(job, None, None),
                           {"gpus": gpus} if gpus else {})
    return plan


def _nemo1(tmp_path, trainer=None, optim=None, **model) -> dict:
    data = yaml.safe_load(yaml.safe_dump(NEMO1))
    data["trainer"].update(trainer or {})
    data["model"].update(model)
    if optim:
        data["model"]["optim"] = optim
    path = tmp_path / "nemo1.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("model, optim, fused", [
    # absent: ModelParallelConfig's default, false (megatron_base_model.py
    # build_model_parallel_config, NeMo v1.23.0 to v2.0.0)
    ({}, None, False),
    ({"gradient_accumulation_fusion": False}, None, False),
    # true beside dp 4, pp 1 and fused_adam: _validate_and_override_config turns it off
    ({"gradient_accumulation_fusion": True}, None, False),
    # a distributed optimizer, or a pipeline, keeps it
    ({"gradient_accumulation_fusion": True}, {"name": "distributed_fused_adam"}, True),
    ({"gradient_accumulation_fusion": True, "pipeline_model_parallel_size": 2}, None, True),
])
def test_nemo1_gradient_accumulation_fusion_as_nemo_runs_it(tmp_path, model, optim, fused):
    plan = _plan(_nemo1(tmp_path, optim=optim, **model))
    assert plan.get("grad_accumulation_fusion", True) is fused


def test_nemo1_fusion_override_waits_for_the_world_from_gpus(tmp_path):
    path = _nemo1(tmp_path, trainer={"devices": -1}, gradient_accumulation_fusion=True)
    assert _plan(path, gpus=8).get("grad_accumulation_fusion") is False  # dp 4
    assert _plan(path, gpus=2).get("grad_accumulation_fusion", True) is True  # dp 1


def test_nemo1_rope_fusion_default_is_said_to_differ_by_version(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(NEMO1))
    del data["model"]["apply_rope_fusion"]
    path = tmp_path / "n.yaml"
    path.write_text(yaml.safe_dump(data))
    assert any("apply_rope_fusion not given" in n for n in read_config(path).notes)


def _automodel(tmp_path, dp_size) -> object:
    data = yaml.safe_load((ROOT / "tests/data/configs/automodel_qwen3_30b_a3b.yaml").read_text())
    data["distributed"]["dp_size"] = dp_size
    path = tmp_path / "am.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_automodel_dp_size_gives_the_world(tmp_path):
    # nemo_automodel mesh_utils.py (_infer_dp_size, _create_fsdp2_device_mesh): the mesh is
    # pp x dp x cp x tp ranks with dp as given
    assert _plan(_automodel(tmp_path, 16))["gpus"] == 16
    with pytest.raises(PlanError, match="contradicts the config's world size 16"):
        _plan(_automodel(tmp_path, 16), gpus=32)
    # <= 0: inferred from the world, which --gpus then gives
    assert _plan(_automodel(tmp_path, -1), gpus=32)["dp"] == 32


def _megatron(tmp_path, extra: str):
    path = tmp_path / "args.txt"
    path.write_text(MEGATRON + extra)
    return path


def test_megatron_cp_comm_type_takes_one_type_per_layer(tmp_path):
    # arguments.py: --cp-comm-type nargs='+', one type or one per layer
    plan = _plan(_megatron(tmp_path, "--context-parallel-size 2 --cp-comm-type " + "a2a " * 8),
                 gpus=8)
    assert plan["cp_comm"] == "a2a"
    with pytest.raises(PlanError, match="a different type by layer is not modelled"):
        _plan(_megatron(tmp_path, "--context-parallel-size 2 --cp-comm-type "
                        + "a2a p2p " * 4), gpus=8)
    with pytest.raises(PlanError, match="2 types for 8 layers"):
        _plan(_megatron(tmp_path, "--context-parallel-size 2 --cp-comm-type a2a a2a"), gpus=8)


def test_megatron_lm_refuses_a_sequence_beyond_the_position_reach(tmp_path):
    # arguments.py validate_args asserts max_position_embeddings >= seq_length, rotary or not
    with pytest.raises(SpecError, match="asserts it >= --seq-length"):
        _plan(_megatron(tmp_path, "--position-embedding-type rope --seq-length 4096"), gpus=8)


def test_a_nested_default_is_expanded_as_bash_does(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("PP=${PP:-${DEFAULT_PP:-2}}\nTP=${TP:-${A:-${B:-4}}}\n"
                    "torchrun --nproc-per-node 8 pretrain_gpt.py " + MEGATRON.replace(
                        "--tensor-model-parallel-size 2", "") +
                    "--tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP\n")
    plan = _plan(path)
    assert (plan["tp"], plan["pp"]) == (4, 2)


def test_a_sourced_file_is_said_not_read(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text("TP=2\nsource ./cluster_env.sh\n"
                    "torchrun --nproc-per-node 8 pretrain_gpt.py " + MEGATRON + "\n")
    notes = read_config(path).notes
    assert any("source ./cluster_env.sh (line 2) is not read" in n for n in notes), notes
