"""Fields two sections of a NeMo 2 recipe, a Megatron-Bridge ConfigContainer or a NeMo 1 config
can state: read as the framework resolves them, the losing setting listed, never dropped."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from perfmodel.errors import PlanError
from tests.conftest import ROOT
from tests.unit.test_nemo_bridge_probe2 import BRIDGE, NEMO2, _read

NEMO1 = yaml.safe_load((ROOT / "tests/data/configs/nemo1_nemotron4_15b.yaml").read_text())


def _nemo2(ddp: dict[str, Any], optim: dict[str, Any] | None, drop: tuple[str, ...] = ()):
    recipe = copy.deepcopy(NEMO2)
    recipe["trainer"]["strategy"]["ddp"].update(ddp)
    for name in drop:
        del recipe["optim"]["config"][name]
    if optim is None:
        del recipe["optim"]
    else:
        recipe["optim"]["config"].update(optim)
    return recipe


def _ignored(job) -> dict[str, str]:
    return {s.key: s.note for s in job.ignored}


def test_nemo2_optimizer_config_decides_the_distributed_optimizer_over_the_ddps(tmp_path):
    # NVIDIA/NeMo 8cfedd7 nemo/lightning/pytorch/strategies/megatron_strategy.py
    # MegatronStrategy.connect: where model.optim.config is an OptimizerConfig and its
    # use_distributed_optimizer differs from the DDP config's, "Fixing mis-match between
    # ddp-config & mcore-optimizer config" sets ddp_config.use_distributed_optimizer to the
    # optimizer's. Before, ddp true beside optim.config false was refused with Megatron-LM's
    # "--overlap-param-gather: applies to --use-distributed-optimizer", a config NeMo runs.
    job = _read(tmp_path, _nemo2({"use_distributed_optimizer": True},
                                 {"use_distributed_optimizer": False}))
    assert job.plan["zero"] == 0
    ignored = _ignored(job)
    assert ignored["trainer.strategy.ddp.use_distributed_optimizer"].startswith(
        "overridden by optim.config.use_distributed_optimizer")
    # Megatron-Core core_v0.13.0 distributed_data_parallel.py: use_forward_hook =
    # use_distributed_optimizer and overlap_param_gather; without the distributed optimizer
    # nothing gathers weights: listed as no effect, not read, not refused
    assert job.plan["overlap_param_gather"] is False
    assert "no effect without the distributed optimizer" in \
        ignored["trainer.strategy.ddp.overlap_param_gather"]
    assert job.plan["overlap_grad_sync"] is True  # the all-reduce still overlaps


def test_nemo2_unstated_optimizer_field_is_optimizerconfigs_default_false(tmp_path):
    # the same connect(): the OptimizerConfig nemo_run builds has use_distributed_optimizer
    # False where the recipe does not set it (megatron/core/optimizer/optimizer_config.py), and
    # that is copied over the DDP's true. Before, perfmodel read the DDP's true: ZeRO-1's memory
    # and reduce-scatter for a run whose optimizer is not distributed.
    job = _read(tmp_path, _nemo2({"use_distributed_optimizer": True}, {},
                                 drop=("use_distributed_optimizer",)))
    assert job.plan["zero"] == 0
    assert "overridden by optim.config (OptimizerConfig's use_distributed_optimizer default" in \
        _ignored(job)["trainer.strategy.ddp.use_distributed_optimizer"]
    read = {s.key: s.note for s in job.read}
    assert "zero 0" in read["optim.config (OptimizerConfig's use_distributed_optimizer default, "
                            "False)"]


def test_nemo2_ddps_false_beside_optimizers_true_is_listed(tmp_path):
    # the same connect(): the optimizer's true wins; before, the DDP's false was dropped unlisted
    job = _read(tmp_path, _nemo2({"use_distributed_optimizer": False},
                                 {"use_distributed_optimizer": True}))
    assert job.plan["zero"] == 1 and job.plan["overlap_param_gather"] is True
    assert _ignored(job)["trainer.strategy.ddp.use_distributed_optimizer"].startswith(
        "overridden by optim.config.use_distributed_optimizer")


def test_nemo2_without_optim_keeps_the_ddps_distributed_optimizer(tmp_path):
    # no model.optim.config, no sync in connect(): the DDP's stands
    job = _read(tmp_path, _nemo2({"use_distributed_optimizer": True}, None))
    assert job.plan["zero"] == 1
    read = {s.key for s in job.read}
    assert "trainer.strategy.ddp.use_distributed_optimizer" in read


def test_bridge_turns_overlap_param_gather_on_where_either_section_has_it(tmp_path):
    # NVIDIA-NeMo/Megatron-Bridge 067f987df src/megatron/bridge/training/config.py
    # _validate_and_sync_distributed_optimizer_settings (overlap_param_gather since 4bb633034,
    # "Sync overlap_param_gather between DDP and optimizer (#4141)"): ddp's or optimizer's
    # overlap_param_gather true turns it on in both. Before, optimizer's false over ddp's true
    # was read as off.
    config = copy.deepcopy(BRIDGE)
    config["ddp"].update(overlap_param_gather=True, use_distributed_optimizer=True)
    config["optimizer"]["overlap_param_gather"] = False
    job = _read(tmp_path, config)
    assert job.plan["overlap_param_gather"] is True
    assert "turns overlap_param_gather on in both" in \
        _ignored(job)["optimizer.overlap_param_gather"]


@pytest.mark.parametrize("value", ["false", "False", "true"])
def test_nemo1_megatron_amp_o2_as_text_is_refused(tmp_path, value):
    # NVIDIA/NeMo 8cfedd7 nemo/collections/nlp/models/language_modeling/megatron_base_model.py:
    # self.megatron_amp_O2 = cfg.get('megatron_amp_O2', False), tested as Python tests it, and
    # OmegaConf keeps a quoted YAML value text: "false" runs with bf16 weights. Before, perfmodel
    # read "false" as on for the weights and as off for gradient_accumulation_fusion (its _truth),
    # numbers for neither run.
    config = copy.deepcopy(NEMO1)
    config["model"]["megatron_amp_O2"] = value
    with pytest.raises(PlanError) as err:
        _read(tmp_path, config)
    text = str(err.value)
    assert "model.megatron_amp_O2" in text and "allowed: true or false" in text
    assert "\n" not in text
