"""Megatron-Core's DDP settings as Megatron-LM and Megatron-Bridge resolve them.

Sources: NVIDIA/Megatron-LM at d98e8a64dd (megatron/training/arguments.py:
--data-parallel-sharding-strategy, default optim_grads_params since 3499efef80, read only under
--use-megatron-fsdp; megatron/core/optimizer/__init__.py reads ddp_config's strategy only under
use_megatron_fsdp) and NVIDIA-NeMo/Megatron-Bridge at 067f987df (recipes/common.py: every
pretrain recipe's DistributedDataParallelConfig sets data_parallel_sharding_strategy
"optim_grads_params" beside use_distributed_optimizer, without Megatron FSDP;
training/config.py _validate_and_sync_distributed_optimizer_settings: the distributed optimizer
on in ddp and optimizer where either has it).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config
from perfmodel.errors import PlanError
from tests.conftest import ROOT

DATA = ROOT / "tests/data/configs"


def _bridge(tmp_path, **sections: dict[str, Any]):
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    for name, fields in sections.items():
        data[name].update(fields)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return read_config(path)


def _megatron(tmp_path, extra: str):
    text = (DATA / "megatron_llama3_8b.txt").read_text() + extra
    path = tmp_path / "args.txt"
    path.write_text(text)
    return read_config(path)


def test_bridge_recipes_sharding_strategy_without_megatron_fsdp_is_no_sharding(tmp_path):
    job = _bridge(tmp_path, ddp={"data_parallel_sharding_strategy": "optim_grads_params",
                                 "use_megatron_fsdp": False})
    assert job.plan["zero"] == 1
    read = {s.key: s.note for s in job.read}
    assert "no effect without Megatron FSDP" in read["ddp.data_parallel_sharding_strategy"]


def test_megatron_lm_sharding_strategy_without_megatron_fsdp_is_no_sharding(tmp_path):
    job = _megatron(tmp_path, "\n--data-parallel-sharding-strategy optim_grads_params\n")
    assert job.plan["zero"] == 1
    assert "--data-parallel-sharding-strategy" in {s.key for s in job.read}


def test_megatron_fsdp_is_still_refused(tmp_path):
    with pytest.raises(PlanError, match="Megatron FSDP"):
        _megatron(tmp_path, "\n--use-megatron-fsdp\n"
                            "--data-parallel-sharding-strategy optim_grads_params\n")


def test_bridge_distributed_optimizer_is_on_where_either_section_has_it(tmp_path):
    # ddp's on, the optimizer's off: Bridge turns both on (ZeRO 1), and the overlapped
    # parameter gather the DDP states stays valid
    job = _bridge(tmp_path, ddp={"use_distributed_optimizer": True},
                  optimizer={"use_distributed_optimizer": False})
    assert job.plan["zero"] == 1
    ignored = {s.key: s.note for s in job.ignored}
    assert "overridden by ddp.use_distributed_optimizer" in \
        ignored["optimizer.use_distributed_optimizer"]


def test_bridge_settings_given_by_two_sections_are_listed(tmp_path):
    job = _bridge(tmp_path, comm_overlap={"overlap_grad_reduce": True})
    ignored = {s.key: s.note for s in job.ignored}
    assert ignored["ddp.use_distributed_optimizer"] == \
        "the same as optimizer.use_distributed_optimizer"
    assert ignored["ddp.overlap_grad_reduce"] == "the same as comm_overlap.overlap_grad_reduce"
    assert job.plan["overlap_grad_sync"] is True
