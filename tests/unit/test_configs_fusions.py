"""Fused kernels and numerics switches that the readers once took for the same cost: read into a
field where perfmodel has one (rotary_fraction); where they take effect and are not modelled,
said so when they cost a few element-wise passes over a layer's activations (RoPE, the bias and
activation, bias-dropout-add, query and key norms) and refused in one line where they cost more;
the weight gradients added apart (gradient accumulation fusion off) read into
Plan.grad_accumulation_fusion; accepted where Megatron-Core would not run the kernel anyway
(perfmodel.configs.megatron._fusions)."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config
from perfmodel.errors import PlanError
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

DATA = ROOT / "tests/data/configs"
BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 2 --bf16 "
        "--position-embedding-type rope --swiglu --disable-bias-linear --hidden-dropout 0 ")


def _megatron(tmp_path, extra: str):
    path = tmp_path / "args.txt"
    path.write_text(BASE + extra)
    return read_config(path)


def _lines(job) -> str:
    return "\n".join(job.report())


@pytest.mark.parametrize("extra, error, text", [
    ("--fp32-residual-connection", PlanError, "--fp32-residual-connection: the residual"),
    ("--no-masked-softmax-fusion --attention-backend unfused", PlanError,
     "--no-masked-softmax-fusion: unfused attention's softmax"),
])
def test_megatron_fusions_off_where_they_cost_more_are_refused(tmp_path, extra, error, text):
    with pytest.raises(error, match=text):
        _megatron(tmp_path, extra)


@pytest.mark.parametrize("extra, text", [
    ("--no-rope-fusion", "--no-rope-fusion: off: op by op: its extra element-wise passes "
                         "are not modelled (costed as the fused RoPE kernel)"),
    ("--no-bias-swiglu-fusion", "--no-bias-swiglu-fusion: off: the gated activation op by "
                                "op: its extra element-wise passes are not modelled"),
    # Megatron-LM's default --hidden-dropout 0.1 (the dropout is not fused away)
    ("--no-bias-dropout-fusion --hidden-dropout 0.1",
     "--no-bias-dropout-fusion: off: the bias, dropout (0.1) and residual add op by op"),
    ("--qk-layernorm", "--qk-layernorm: on: a norm of each query and key head, not modelled"),
])
def test_megatron_small_fusions_off_are_read_and_said_not_modelled(tmp_path, extra, text):
    """Megatron-LM's own example and test scripts switch these off where apex is missing:
    predicted, the read line saying what the step time leaves out."""
    assert text in _lines(_megatron(tmp_path, extra))


def test_megatron_gelu_fusion_off_is_said_not_modelled_with_a_bias_only(tmp_path):
    gelu = BASE.replace("--swiglu ", "").replace("--disable-bias-linear ", "")
    path = tmp_path / "args.txt"
    path.write_text(gelu + "--no-bias-gelu-fusion")
    assert ("--no-bias-gelu-fusion: off: the bias add and GeLU op by op: its extra "
            "element-wise passes are not modelled") in _lines(read_config(path))
    # without a bias Megatron-LM turns bias_gelu_fusion off itself (arguments.py): the same
    # kernels, as SwiGLU's switch beside a GeLU MLP
    job = _megatron(tmp_path, "--no-bias-gelu-fusion")
    assert "--no-bias-gelu-fusion: off: no fused kernel" in _lines(job)


def test_megatron_switches_without_effect_here_are_accepted(tmp_path):
    # learned positions: no RoPE to fuse; no bias and no dropout: one residual add; flash
    # attention: no masked softmax; fp32 gradients are --bf16's own; fp32 residuals in fp32
    job = _megatron(tmp_path.joinpath(), "--no-bias-dropout-fusion --attention-backend flash "
                                         "--no-masked-softmax-fusion "
                                         "--accumulate-allreduce-grads-in-fp32 "
                                         "--no-persist-layer-norm --rotary-base 500000")
    text = _lines(job)
    assert "--no-bias-dropout-fusion: off: no bias and no dropout" in text
    assert "--no-masked-softmax-fusion: off: flash or fused attention" in text
    assert "--accumulate-allreduce-grads-in-fp32: fp32 main gradients: bf16's already" in text
    assert "--no-persist-layer-norm: numerics or initialization with the same cost" in text
    path = tmp_path / "learned.txt"
    path.write_text(BASE.replace("--position-embedding-type rope", "") + "--no-rope-fusion")
    assert "--no-rope-fusion: off: no rotary embedding" in _lines(read_config(path))
    path.write_text(BASE.replace("--bf16", "") + "--fp32-residual-connection")
    assert "--fp32-residual-connection: dtype fp32 anyway" in _lines(read_config(path))


def test_megatron_fp32_gradients_with_fp16_are_refused(tmp_path):
    path = tmp_path / "args.txt"
    path.write_text(BASE.replace("--bf16", "--fp16") + "--accumulate-allreduce-grads-in-fp32")
    with pytest.raises(PlanError, match="--accumulate-allreduce-grads-in-fp32: fp32 main"):
        read_config(path)


def test_a_refusal_is_one_line_with_the_plan_or_the_model_exit_code(tmp_path):
    path = tmp_path / "args.txt"
    for extra, exit_code in (("--fp32-residual-connection", 4), ("--quick-geglu", 3)):
        path.write_text(BASE + extra)
        code, _, err = run_main(["predict", "--from-config", str(path), "--hardware",
                                 "dgx-h100", "--gpus", "8"])
        assert code == exit_code and len(err.strip().splitlines()) == 1, err
        assert extra in err


def _edited(tmp_path, name: str, section: tuple[str, ...], **fields: Any):
    """tests/data/configs/<name> with `fields` set in its `section` (a path of keys), read."""
    data = yaml.safe_load((DATA / name).read_text())
    target = data
    for key in section:
        target = target[key]
    target.update(fields)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return read_config(path)


def _bridge(tmp_path, **model: Any):
    return _edited(tmp_path, "bridge_llama3_8b.yaml", ("model",), **model)


def test_bridge_rotary_percent_is_the_models_rotary_fraction(tmp_path):
    job = _bridge(tmp_path, rotary_percent=0.5)
    assert job.model["rotary_fraction"] == 0.5
    assert "model.rotary_percent 0.5: rotary_fraction 0.5" in _lines(job)


def test_nemo2_rotary_percent_over_a_preset(tmp_path):
    data = yaml.safe_load((DATA / "nemo2_llama3_8b.yaml").read_text())
    data["model"]["config"]["rotary_percent"] = 0.5
    path = tmp_path / "nemo2.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert read_config(path).model["rotary_fraction"] == 0.5


def test_megatron_gradient_accumulation_fusion_off_is_read_into_the_plan(tmp_path):
    """--no-gradient-accumulation-fusion: the weight gradients added into the main gradients
    apart (Plan.grad_accumulation_fusion false, perfmodel.step.grad_accumulation)."""
    job = _megatron(tmp_path, "--no-gradient-accumulation-fusion")
    assert job.plan["grad_accumulation_fusion"] is False
    assert ("--no-gradient-accumulation-fusion: off: grad_accumulation_fusion false"
            in _lines(job))
    assert "grad_accumulation_fusion" not in _megatron(tmp_path, "").plan


def test_megatron_gradient_accumulation_fusion_off_under_fsdp2_is_the_same_cost(tmp_path):
    # Megatron-LM requires the fusion off with --use-torch-fsdp2: FSDP2 reduce-scatters the
    # backward's own gradients, as zero 3 is modelled
    job = _megatron(tmp_path, "--no-gradient-accumulation-fusion --use-torch-fsdp2 "
                              "--untie-embeddings-and-output-weights --data-parallel-size 8")
    assert job.plan["zero"] == 3 and "grad_accumulation_fusion" not in job.plan
    assert "--no-gradient-accumulation-fusion: off: FSDP2 (zero 3)" in _lines(job)


@pytest.mark.parametrize("extra, says", [
    # megatron/training/arguments.py validate_args at d98e8a64: each asserted at start-up
    ("--overlap-param-gather --use-distributed-optimizer",
     "--overlap-param-gather: Megatron-LM asserts --overlap-grad-reduce"),
    ("--use-torch-fsdp2 --use-distributed-optimizer --untie-embeddings-and-output-weights "
     "--no-gradient-accumulation-fusion", "without --use-distributed-optimizer"),
    ("--use-torch-fsdp2 --no-gradient-accumulation-fusion",
     "asserts --untie-embeddings-and-output-weights"),
    ("--use-torch-fsdp2 --untie-embeddings-and-output-weights",
     "asserts --no-gradient-accumulation-fusion"),
    ("--fp8-format hybrid --fp8-param-gather", "--fp8-param-gather: Megatron-LM asserts the "
                                               "distributed optimizer"),
    ("--recompute-granularity selective --recompute-method uniform",
     "--recompute-method uniform: Megatron-LM asserts no recompute method"),
])
def test_megatron_lm_refuses_what_its_argument_validation_stops(tmp_path, extra, says):
    with pytest.raises(PlanError, match=re.escape(says)):
        _megatron(tmp_path, extra)


def test_bridge_fusions_off_where_they_run(tmp_path):
    job = _bridge(tmp_path, gradient_accumulation_fusion=False)
    assert job.plan["grad_accumulation_fusion"] is False
    assert "model.gradient_accumulation_fusion False: off: grad_accumulation_fusion false" \
        in _lines(job)
    for model, text in ((dict(apply_rope_fusion=False), "model.apply_rope_fusion False: off: op "
                                                        "by op"),
                        (dict(bias_activation_fusion=False), "model.bias_activation_fusion False:"
                                                             " off: the gated activation op by op"),
                        (dict(qk_layernorm=True), "model.qk_layernorm: on: a norm"),
                        (dict(bias_dropout_fusion=False, hidden_dropout=0.1),
                         "model.bias_dropout_fusion False: off: the bias, dropout (0.1)")):
        assert text in _lines(_bridge(tmp_path, **model)), model


def test_bridge_fusions_on_and_harmless_fields_stay_accepted(tmp_path):
    job = _bridge(tmp_path, apply_rope_fusion=True, bias_activation_fusion=True,
                  gradient_accumulation_fusion=True, masked_softmax_fusion=False,
                  bias_dropout_fusion=False, qk_layernorm=False, persist_layer_norm=False,
                  rotary_base=500000)
    text = _lines(job)
    assert "model.apply_rope_fusion: on: fused RoPE" in text
    assert "model.bias_dropout_fusion False: off: no bias and no dropout" in text
    assert "model.persist_layer_norm False: the same cost" in text
    assert not job.unknown


def _nemo1(tmp_path, **model: Any):
    return _edited(tmp_path, "nemo1_nemotron4_15b.yaml", ("model",), **model)


def test_nemo1_rotary_percentage_is_the_models_rotary_fraction(tmp_path):
    # Nemotron-4 15B rotates half of each head (the config's rotary_percentage 0.5)
    job = _nemo1(tmp_path)
    assert job.model["rotary_fraction"] == 0.5
    # its fusions off where they do not run: squared ReLU, no bias, no dropout
    text = _lines(job)
    assert "model.bias_activation_fusion False: off: no fused kernel" in text
    assert "model.bias_dropout_add_fusion False: off: no bias and no dropout" in text


def test_nemo1_small_fusions_off_are_said_not_modelled(tmp_path):
    for model, text in ((dict(apply_rope_fusion=False), "model.apply_rope_fusion False: off: op"),
                        (dict(activation="swiglu"), "model.bias_activation_fusion False: off: "
                                                    "the gated activation op by op"),
                        (dict(bias_dropout_add_fusion=False, hidden_dropout=0.1),
                         "model.bias_dropout_add_fusion False: off: the bias, dropout")):
        assert text in _lines(_nemo1(tmp_path, **model)), model


def test_nemo1_gradient_accumulation_fusion_off_is_read_into_the_plan(tmp_path):
    assert _nemo1(tmp_path, gradient_accumulation_fusion=False).plan[
        "grad_accumulation_fusion"] is False


@pytest.mark.parametrize("model, error, text", [
    (dict(fp32_residual_connection=True), PlanError, "model.fp32_residual_connection"),
    (dict(megatron_amp_O2=False), PlanError, "model.megatron_amp_O2 False: fp32 weights"),
])
def test_nemo1_settings_that_change_the_cost_are_refused(tmp_path, model, error, text):
    with pytest.raises(error, match=text):
        _nemo1(tmp_path, **model)


@pytest.mark.parametrize("where, name, value", [
    ("mixed_precision", "fp8_wgrad", False),
    ("mixed_precision", "fp8_dot_product_attention", True),
    ("mixed_precision", "fp8_multi_head_attention", True)])
def test_bridge_fp8_switches_that_change_the_gemms_or_attention_are_refused(tmp_path, where,
                                                                             name, value):
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["mixed_precision"].update(fp8="hybrid", fp8_recipe="delayed")
    data[where][name] = value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError, match=f"{where}.{name}"):
        read_config(path)
    data[where][name] = not value  # their defaults: the same cost
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert read_config(path).plan["dtype"] == "fp8"
    del data["mixed_precision"]["fp8"]
    data[where][name] = value  # no effect without FP8
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "no effect without FP8" in _lines(read_config(path))


@pytest.mark.parametrize("name, value", [("fp8_wgrad", False),
                                         ("fp8_dot_product_attention", True)])
def test_a_bridge_models_fp8_switch_is_overridden_by_the_mixed_precision_section(tmp_path, name,
                                                                                  value):
    """Bridge copies every MixedPrecisionConfig field onto the model, its defaults included
    (update_config_with_precision_overrides, src/megatron/bridge/training/mixed_precision.py
    at 067f987df): a model's switch under a section that leaves it out trains as the section's
    default (fp8_wgrad true, fp8_dot_product_attention false). It was refused as if it ran."""
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["mixed_precision"].update(fp8="hybrid", fp8_recipe="delayed")
    data["model"][name] = value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = read_config(path)
    assert config.plan["dtype"] == "fp8"
    assert re.search(rf"model\.{name}( False)?: overridden by mixed_precision "
                     rf"\(MixedPrecisionConfig's {name} default", _lines(config)), _lines(config)


def test_nemo2_plugin_fp8_attention_is_refused(tmp_path):
    data = yaml.safe_load((DATA / "nemo2_llama3_8b.yaml").read_text())
    plugin = data["trainer"].get("plugins")
    if isinstance(plugin, list):
        plugin = plugin[0]
    plugin.update(fp8="hybrid", fp8_dot_product_attention=True)
    path = tmp_path / "nemo2.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(PlanError, match="trainer.plugins.fp8_dot_product_attention: Transformer"):
        read_config(path)


def _titan(tmp_path, name: str, **sections: dict[str, Any]):
    data = tomllib.loads((DATA / name).read_text())
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
    path = tmp_path / "titan.json"
    path.write_text(json.dumps(data))
    return read_config(path)


@pytest.mark.parametrize("implementation, kernels", [("foreach", "foreach"),
                                                      ("for-loop", "foreach"),
                                                      ("fused", "fused")])
def test_torchtitan_adamw_implementation_is_the_plan_s_optimizer_kernels(tmp_path, implementation,
                                                                        kernels):
    """optimizer.implementation sets Plan.optimizer_kernels (the for-loop's passes are
    foreach's), pinned for recommend; a name torch.optim does not have is refused."""
    job = _titan(tmp_path, "torchtitan_llama3_8b.toml",
                 optimizer={"implementation": implementation})
    assert job.plan["optimizer_kernels"] == kernels and "optimizer_kernels" in job.pins
    assert f"optimizer.implementation {implementation}: optimizer_kernels {kernels}" \
        in _lines(job)


def test_torchtitan_unknown_adamw_implementation_is_refused(tmp_path):
    with pytest.raises(PlanError, match="optimizer.implementation.*fused, foreach or for-loop"):
        _titan(tmp_path, "torchtitan_llama3_8b.toml", optimizer={"implementation": "fast"})


@pytest.mark.parametrize("sections, text", [
    (dict(optimizer={"early_step_in_backward": True}), "optimizer.early_step_in_backward"),
    (dict(parallelism={"tensor_parallel_degree": 2, "disable_loss_parallel": True}),
     "parallelism.disable_loss_parallel: with tp 2 the logits all-gathered"),
])
def test_torchtitan_settings_that_change_the_cost_are_refused(tmp_path, sections, text):
    with pytest.raises(PlanError, match=text):
        _titan(tmp_path, "torchtitan_llama3_8b.toml", **sections)


def test_torchtitan_settings_of_the_modelled_cost_stay_accepted(tmp_path):
    text = _lines(_titan(tmp_path, "torchtitan_llama3_8b.toml",
                         optimizer={"implementation": "fused", "early_step_in_backward": False},
                         parallelism={"disable_loss_parallel": True}))
    assert "optimizer.implementation fused: optimizer_kernels fused" in text
    assert "parallelism.disable_loss_parallel: no tensor parallelism" in text


def test_torchtitan_older_fused_and_loss_parallel_switches(tmp_path):
    # before 2025-02-24 optimizer.fused (default false: foreach); before 2024-06
    # training.enable_loss_parallel
    foreach = _titan(tmp_path, "torchtitan_2024_llama3_8b.toml", optimizer={"fused": False})
    assert "optimizer.fused False: optimizer_kernels foreach" in _lines(foreach)
    assert foreach.plan["optimizer_kernels"] == "foreach"
    assert "optimizer.fused: optimizer_kernels fused" in _lines(
        _titan(tmp_path, "torchtitan_2024_llama3_8b.toml", optimizer={"fused": True}))
    with pytest.raises(PlanError, match="training.enable_loss_parallel False: with tp 2"):
        _titan(tmp_path, "torchtitan_2024_llama3_8b.toml",
               training={"tensor_parallel_degree": 2, "enable_loss_parallel": False})


def _automodel(tmp_path, **backend: Any):
    return _edited(tmp_path, "automodel_qwen3_30b_a3b.yaml", ("model", "backend"), **backend)


def test_automodel_rope_fusion_off_beside_fused_kernels_is_said_not_modelled(tmp_path):
    assert ("model.backend.rope_fusion False: RoPE op by op beside fused norms and linears: its "
            "extra element-wise passes are not modelled") in _lines(
                _automodel(tmp_path, rope_fusion=False))
    # AutoModel 36044ad3d's BackendConfig.__post_init__ forces it off whatever is asked
    assert ("model.backend.rope_fusion: RoPE op by op (forced off by AutoModel's BackendConfig, "
            "issue #3027) beside fused norms") in _lines(_automodel(tmp_path, rope_fusion=True))
    # torch's norms and linears: the whole layer op by op (kernels eager), RoPE among them
    job = _automodel(tmp_path, rope_fusion=False, rms_norm="torch", linear="torch")
    assert job.plan["kernels"] == "eager"


def test_bridge_pipeline_outputs_kept_are_refused_with_a_pipeline_only(tmp_path):
    with pytest.raises(PlanError, match="model.deallocate_pipeline_outputs False: each"):
        _bridge(tmp_path, deallocate_pipeline_outputs=False, pipeline_model_parallel_size=2)
    assert "model.deallocate_pipeline_outputs False: no pipeline" in _lines(
        _bridge(tmp_path, deallocate_pipeline_outputs=False, pipeline_model_parallel_size=1))
