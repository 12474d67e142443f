"""Megatron-Bridge's FP8 recipe and precision precedence, read as Bridge applies them.

Source: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/mixed_precision.py at 067f987df
(MixedPrecisionConfig: fp8 None, fp8_recipe "tensorwise", grad_reduce_in_fp32 True;
update_config_with_precision_overrides copies every field onto the model and the DDP, defaults
included, from runtime_config_update in training/config.py) and Megatron-Core's TransformerConfig
(fp8_recipe "delayed"). NeMo 2's MegatronMixedPrecision keeps its own default, delayed
(nemo/lightning/pytorch/plugins/mixed_precision.py at 8cfedd7).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

DATA = ROOT / "tests/data/configs"


def _bridge(tmp_path, model: dict[str, Any], precision: Any = "keep",
            ddp: dict[str, Any] | None = None):
    """The Bridge llama3_8b ConfigContainer with model fields changed and its mixed_precision
    section replaced (None: removed; "keep": the file's bf16 section), read."""
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(model)
    data["ddp"].update(ddp or {})
    if precision is None:
        del data["mixed_precision"]
    elif precision != "keep":
        data["mixed_precision"] = precision
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return read_config(path)


def _recipe(job) -> tuple[str, str | None]:
    return job.plan["dtype"], job.plan.get("fp8_recipe")


MP = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"


@pytest.mark.parametrize("recipe, want", [("tensorwise", "current"), ("delayed", "delayed"),
                                          ("mxfp8", "mxfp8")])
def test_model_fp8_recipe_is_the_recipe_without_a_mixed_precision_section(tmp_path, recipe,
                                                                         want):
    """model.fp8_recipe was listed as the same cost: tensorwise priced as delayed scaling."""
    job = _bridge(tmp_path, {"fp8": "hybrid", "fp8_recipe": recipe}, precision=None)
    assert _recipe(job) == ("fp8", want)
    assert not any("no --fp8-recipe" in note for note in job.notes)


def test_model_fp8_recipe_blockwise_is_refused_as_the_megatron_reader_refuses_it(tmp_path):
    with pytest.raises(PlanError, match="model.fp8_recipe blockwise"):
        _bridge(tmp_path, {"fp8": "hybrid", "fp8_recipe": "blockwise"}, precision=None)


def test_model_fp8_without_a_recipe_is_megatron_cores_delayed(tmp_path):
    job = _bridge(tmp_path, {"fp8": "hybrid"}, precision=None)
    assert _recipe(job) == ("fp8", "delayed")


def test_mixed_precision_fp8_without_a_recipe_is_bridges_tensorwise(tmp_path):
    """MixedPrecisionConfig.fp8_recipe defaults to tensorwise (current scaling), over the
    model's recipe too."""
    section = {"_target_": MP, "bf16": True, "fp16": False, "fp8": "hybrid"}
    assert _recipe(_bridge(tmp_path, {}, section)) == ("fp8", "current")
    job = _bridge(tmp_path, {"fp8_recipe": "delayed"}, section)
    assert _recipe(job) == ("fp8", "current")
    assert "model.fp8_recipe delayed: overridden by mixed_precision" in "\n".join(job.report())


def test_mixed_precision_without_fp8_trains_the_models_fp8_in_bf16(tmp_path):
    """Bridge copies the section's fp8 (default None) onto the model: bf16, not FP8."""
    section = {"_target_": MP, "bf16": True, "fp16": False, "grad_reduce_in_fp32": True}
    job = _bridge(tmp_path, {"fp8": "hybrid", "fp8_recipe": "tensorwise"}, section)
    assert job.plan["dtype"] == "bf16"
    assert "model.fp8 hybrid: overridden by mixed_precision" in "\n".join(job.report())


def test_mixed_precision_grad_reduce_default_is_over_the_ddps(tmp_path):
    section = {"_target_": MP, "bf16": True}
    job = _bridge(tmp_path, {}, section, ddp={"grad_reduce_in_fp32": False})
    assert job.plan.get("grad_dtype") != "bf16"
    stated = _bridge(tmp_path, {}, {**section, "grad_reduce_in_fp32": False})
    assert stated.plan.get("grad_dtype") == "bf16"


@pytest.mark.parametrize("preset, want", [("bf16_mixed", ("bf16", None)),
                                          ("bf16-mixed", ("bf16", None)),
                                          ("bf16_with_fp8_delayed_scaling_mixed",
                                           ("fp8", "delayed"))])
def test_a_preset_name_sets_every_precision_field_over_the_models(tmp_path, preset, want):
    job = _bridge(tmp_path, {"fp8": "hybrid", "fp8_recipe": "tensorwise"}, preset)
    assert _recipe(job) == want


def test_presets_are_read_by_their_fields_not_their_names(tmp_path):
    """nanov2_bf16_with_fp8_current_scaling_mixed is blockwise (refused) despite its name."""
    with pytest.raises(PlanError, match="blockwise"):
        _bridge(tmp_path, {}, "nanov2_bf16_with_fp8_current_scaling_mixed")
    with pytest.raises(SpecError, match="not a Megatron-Bridge precision preset"):
        _bridge(tmp_path, {}, "bf16_with_fp8_mixed")


def test_current_scaling_presets_bf16_end_layers_are_said_not_modelled(tmp_path):
    job = _bridge(tmp_path, {}, "bf16_with_fp8_current_scaling_mixed")
    assert _recipe(job) == ("fp8", "current")
    assert any("first_last_layers_bf16" in note for note in job.notes)


def test_nemo2_plugin_fp8_without_a_recipe_keeps_nemos_delayed(tmp_path):
    data = yaml.safe_load((DATA / "nemo2_llama3_8b.yaml").read_text())
    plugins = data["trainer"]["plugins"]
    (plugins[0] if isinstance(plugins, list) else plugins).update(fp8="hybrid")
    path = tmp_path / "nemo2.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert _recipe(read_config(path)) == ("fp8", "delayed")
