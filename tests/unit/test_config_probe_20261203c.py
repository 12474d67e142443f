"""The job-config readers' findings of the 2026-12-03 probe (c): public configs whose settings
change the step were read as if they did not (NeMo 1's Hyena spec, Megatron-LM's fine-grained
offloading, Megatron-Bridge's PEFT and distillation), and files that are not read were refused
with a reason that did not fit them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

CONFIGS = ROOT / "tests/data/configs"
NEMO1 = CONFIGS / "probe-20261203/nemo1_gpt3_5b.yaml"


def _changed(tmp_path: Path, source: Path, change: Any) -> Path:
    data = yaml.safe_load(source.read_text())
    change(data)
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _listed(job: Any) -> dict[str, str]:
    return {s.key: s.note for s in (*job.read, *job.ignored)}


# NeMo 1: model.name is the layer spec (NVIDIA/NeMo 8cfedd72, megatron_gpt_model.py get_specs);
# examples/nlp/language_modeling/conf/megatron_gpt_config_hyena.yaml names te_gpt_hyena
@pytest.mark.parametrize("name, says", [
    ("te_gpt_hyena", "Hyena"), ("megatron_falcon_gpt", "Falcon"),
    ("megatron_gemma2", "Gemma 2"), ("modelopt", "ModelOpt"), ("my_spec", "not a layer spec"),
])
def test_nemo1_refuses_a_layer_spec_it_does_not_model(tmp_path, name, says):
    def named(data: Any) -> None:
        data["model"]["mcore_gpt"] = True
        data["model"]["name"] = name

    with pytest.raises(PlanError, match=says) as exc:
        read_config(_changed(tmp_path, NEMO1, named))
    assert "model.name" in str(exc.value)


def test_nemo1_reads_the_te_gpt_spec(tmp_path):
    def named(data: Any) -> None:
        data["model"]["mcore_gpt"] = True
        data["model"]["name"] = "te_gpt"

    job = read_config(_changed(tmp_path, NEMO1, named))
    assert "Transformer Engine" in _listed(job)["model.name"]


def test_megatron_refuses_fine_grained_activation_offloading(tmp_path):
    # Megatron-LM d98e8a64 tests/functional_tests/test_cases/moe/
    # gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading: its memory was printed as if
    # nothing were offloaded
    path = tmp_path / "args.txt"
    path.write_text((CONFIGS / "megatron_llama3_8b.txt").read_text()
                    + "\n--fine-grained-activation-offloading\n")
    with pytest.raises(PlanError, match="fine-grained activation offloading"):
        read_config(path)


def test_megatron_says_expert_tensor_parallelism_does_nothing_without_experts(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text((CONFIGS / "megatron_llama3_8b.txt").read_text()
                    + "\n--expert-tensor-parallel-size 4\n")
    job = read_config(path)
    assert "no experts" in _listed(job)["--expert-tensor-parallel-size"]


@pytest.mark.parametrize("key, value, says", [
    # Megatron-Bridge 067f987d tutorials/recipes/llama/conf/llama32_1b_finetune.yaml
    ("peft", {"dim": 8, "alpha": 16}, "LoRA/PEFT"),
    # examples/distillation/llama/conf/llama32_3b-1b_distill_override_example.yaml
    ("teacher", {"seq_length": 4096, "tensor_model_parallel_size": 2}, "distillation"),
    ("kd_config", {"logit_layers": ["output_layer", "output_layer"]}, "distillation"),
])
def test_bridge_refuses_what_trains_another_step(tmp_path, key, value, says):
    def add(data: Any) -> None:
        (data if key == "peft" else data["model"])[key] = value

    with pytest.raises(PlanError, match=says):
        read_config(_changed(tmp_path, CONFIGS / "bridge_llama3_8b.yaml", add))


@pytest.mark.parametrize("name, text, says", [
    # torchtitan's config registry (b5bcd76c torchtitan/experiments/graph_trainer/llama3/)
    ("config_registry.py", "from torchtitan.config import JobConfig\n\ndef llama3_8b():\n"
     "    return JobConfig()\n", "Python code"),
    # Megatron-LM d98e8a64 examples/mamba/train.sh
    ("train.sh", "#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_hybrid.py \\\n"
     "    --num-layers 56 --hidden-size 4096\n", "runs pretrain_hybrid.py"),
    # examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh: the command in a multi-line string
    # that a here-document's srun runs
    ("sbatch.sh", "#!/bin/bash\nPRETRAIN_ARGS=(--num-layers 61)\nTRAINING_CMD=\"\n"
     "cd ${MEGATRON_PATH};\npython ${MEGATRON_PATH}/pretrain_gpt.py ${PRETRAIN_ARGS[@]}\"\n"
     "sbatch <<EOF\n#!/bin/bash\nsrun bash -x -c \"${TRAINING_CMD}\"\nEOF\n",
     "not as a command perfmodel reads"),
])
def test_an_unread_file_is_refused_with_its_own_reason(tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError, match=says):
        read_config(path)
