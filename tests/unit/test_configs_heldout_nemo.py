"""NeMo 1, NeMo 2 / Megatron-Bridge and torchtitan job configs as the frameworks' own examples
write them (the NeMo Framework Launcher's, NeMo's example configs, Megatron-Bridge's override
examples, torchtitan's train configs), each read as the framework runs it: regressions found by
running configs the readers had not seen."""

from __future__ import annotations

from typing import Any

import yaml

from perfmodel.configs import read_config
from tests.conftest import ROOT

NEMO1 = ROOT / "tests/data/configs/nemo1_nemotron4_15b.yaml"
NEMO2 = ROOT / "tests/data/configs/nemo2_llama3_8b.yaml"


def _write(tmp_path, data: dict[str, Any], name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _nemo1(tmp_path, *, trainer: dict[str, Any] | None = None, optim: dict[str, Any] | None = None,
           data: dict[str, Any] | None = None, **model: Any):
    """The development set's NeMo 1 config (Nemotron-4 15B) with the model's fields changed
    (None removes one), read."""
    config = yaml.safe_load(NEMO1.read_text())
    config["trainer"].update(trainer or {})
    config["model"]["optim"].update(optim or {})
    config["model"]["data"].update(data or {})
    for key, value in model.items():
        if value is None:
            config["model"].pop(key, None)
        else:
            config["model"][key] = value
    return read_config(_write(tmp_path, config))


def _lines(job) -> str:
    return "\n".join(job.report())


def test_nemos_own_sum_resolver_is_resolved(tmp_path):
    # NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (8cfedd7):
    # cpu_offloading_num_layers ${sum:${.num_layers},-1}, NeMo's resolver (hydra_runner.py)
    job = _nemo1(tmp_path, cpu_offloading=False,
                 cpu_offloading_num_layers="${sum:${.num_layers},-1}",
                 ffn_hidden_size="${multiply:4, ${.hidden_size}}")
    assert job.model["ffn_hidden"] == 4 * 6144
    assert "model.cpu_offloading_num_layers 31" in _lines(job)
