"""NeMo 2 and Megatron-Bridge sequence lengths where the model's and the data's differ: read as
the framework trains (NeMo 2: the data module's) or refused as it refuses (Megatron-Bridge)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import SpecError
from tests.conftest import ROOT

NEMO2 = yaml.safe_load((ROOT / "tests/data/configs/nemo2_llama3_8b.yaml").read_text())
BRIDGE = yaml.safe_load((ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text())


def _read(tmp_path, data: dict[str, Any]):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return read_config(path)


def _nemo2(*, data: dict[str, Any] | None = None, drop_data_seq: bool = False,
           **config: Any) -> dict[str, Any]:
    recipe = copy.deepcopy(NEMO2)
    recipe["data"].update(data or {})
    if drop_data_seq:
        del recipe["data"]["seq_length"]
    recipe["model"]["config"].update(config)
    return recipe


def _listed(job) -> dict[str, str]:
    """Each key the reader listed (read or ignored), with its note."""
    return {s.key: s.note for s in (*job.read, *job.ignored)}


def test_nemo2_trains_at_data_seq_length_where_the_model_config_differs(tmp_path):
    # NeMo v2.2.0 (7192a2c): the data module builds its samples at its seq_length and gives it to
    # the schedule (nemo/collections/llm/gpt/data/mock.py MockDataModule: MockGPTDataset(...,
    # self.seq_length), MegatronDataSampler(seq_len=self.seq_length);
    # nemo/lightning/pytorch/plugins/data_sampler.py: seq_length=self.seq_len); model.config
    # .seq_length is GPTModel's max_sequence_length only (gpt/model/base.py configure_model), and
    # nemo/collections/llm/api.py _validate_config asserts no equality. /tmp/probe2/n7.yaml.
    job = _read(tmp_path, _nemo2(seq_length=4096))
    assert job.model.get("seq_len", None) in (None, 8192)
    model, plan = resolve_plan(job, resolve_model(job, None, None), {})
    assert model.seq_len == 8192
    listed = _listed(job)
    assert "data.seq_length" in listed and "seq_len 8192" in listed["data.seq_length"]
    assert "not the step's" in listed["model.config.seq_length"]
    assert any("differs from data.seq_length 8192" in n for n in job.notes)


def test_nemo2_equal_lengths_list_both_keys(tmp_path):
    # the same sources: with the two equal, data.seq_length is read and the model's listed as
    # the same (before, whichever came last hid the other unlisted)
    job = _read(tmp_path, _nemo2(seq_length=8192))
    listed = _listed(job)
    assert "seq_len 8192" in listed["data.seq_length"]
    assert listed["model.config.seq_length"] == "the same as data.seq_length"


def test_nemo2_learned_positions_refuse_a_differing_model_length(tmp_path):
    # NeMo v2.2.0 gpt/model/base.py: GPTConfig's position_embedding_type learned_absolute, its
    # table max_sequence_length=self.seq_length long (configure_model); a longer data.seq_length
    # indexes past it, a shorter one leaves a table perfmodel (sized by the sequence) would miss
    recipe = _nemo2(seq_length=4096, position_embedding_type="learned_absolute")
    with pytest.raises(SpecError) as err:
        _read(tmp_path, recipe)
    text = str(err.value)
    assert "data.seq_length 8192" in text and "model.config.seq_length 4096" in text
    assert "\n" not in text


def test_nemo2_without_data_seq_length_trains_at_the_data_modules_default(tmp_path):
    # NeMo v2.0.0 to v2.4.0 nemo/collections/llm/gpt/data/mock.py: MockDataModule(seq_length:
    # int = 2048): without data.seq_length the samples are 2048 long, whatever the model's
    job = _read(tmp_path, _nemo2(drop_data_seq=True, seq_length=4096))
    model, _ = resolve_plan(job, resolve_model(job, None, None), {})
    assert model.seq_len == 2048
    listed = _listed(job)
    assert "data (MockDataModule's seq_length default)" in listed
    assert "model.config.seq_length" in listed


def test_bridge_refuses_a_model_seq_length_other_than_the_datasets(tmp_path):
    # NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py at 067f987df,
    # ConfigContainer.validate: assert self.model.seq_length == data_seq_length for
    # GPTDatasetConfig and the other canonical dataset configs. /tmp/probe2/b1.yaml.
    recipe = copy.deepcopy(BRIDGE)
    recipe["dataset"]["sequence_length"] = 4096
    with pytest.raises(SpecError) as err:
        _read(tmp_path, recipe)
    text = str(err.value)
    assert "model.seq_length 8192" in text and "dataset.sequence_length 4096" in text
    assert "\n" not in text


def test_bridge_equal_lengths_list_the_models(tmp_path):
    # the same source: equal, the dataset's is read and the model's listed as the same
    job = _read(tmp_path, copy.deepcopy(BRIDGE))
    listed = _listed(job)
    assert "seq_len 8192" in listed["dataset.sequence_length"]
    assert listed["model.seq_length"] == "the same as dataset.sequence_length"
