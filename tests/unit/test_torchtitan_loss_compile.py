"""torchtitan's loss, compiled with the blocks or eager, read and written as torchtitan ran it.

compile.enable compiles the loss only with "loss" among compile.components; the older
training.compile compiled it only in two windows of torchtitan's history (perfmodel.configs.
torchtitan.LOSS_COMPILED_FROM), so it is read eager, said in a note, and --cross-entropy
overrides it. An eager loss keeps three fp32 copies of the logits (Plan.cross_entropy torch).
"""

from __future__ import annotations

import tomllib

import pytest

from perfmodel import load_hardware, load_model, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.torchtitan import torchtitan_toml
from perfmodel.strategy import plan_from_dict

BASE = ["[model]", 'name = "llama3"', 'flavor = "8B"', "[training]", "local_batch_size = 1",
        "seq_len = 8192"]


def _job(tmp_path, *lines: str):
    path = tmp_path / "job.toml"
    path.write_text("\n".join([*BASE, *lines]) + "\n")
    return read_config(path)


@pytest.mark.parametrize(("lines", "loss"), [
    (["[compile]", "enable = true", 'components = ["model", "loss"]'], None),
    (["[compile]", "enable = true"], None),  # torchtitan's default components: model and loss
    (["[compile]", "enable = true", 'components = ["model"]'], "torch"),
    (["compile = true"], None),  # [training] compile (older torchtitan): taken once resolved
    (["[compile]", "enable = false"], None),  # eager kernels: the eager loss already
])
def test_the_loss_is_eager_where_torchtitan_did_not_compile_it(tmp_path, lines, loss):
    job = _job(tmp_path, *lines)
    assert job.plan.get("cross_entropy") == loss
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert plan.get("cross_entropy") == loss or (lines == ["compile = true"]
                                                  and plan["cross_entropy"] == "torch")
    says = [n for n in job.notes if n.startswith("training.compile: the loss taken eager")]
    assert len(says) == (1 if lines == ["compile = true"] else 0)


def test_an_eager_loss_holds_three_fp32_copies_of_the_logits(tmp_path):
    """Compiled blocks with the eager loss: three fp32 copies of the logits (8192 tokens x
    128,256 words) where the compiled loss is counted as one fp32 and one bf16 copy
    (perfmodel.step.memory: LOSS_LOGITS_EAGER against LOSS_LOGITS and LOSS_LOGITS_OWN), the
    rest alike."""
    hw = load_hardware("dgx-h100")
    memory = {}
    for components in ('["model"]', '["model", "loss"]'):
        job = _job(tmp_path, "[compile]", "enable = true", f"components = {components}")
        spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
        memory[components] = predict(spec, hw, plan_from_dict(plan),
                                     refuse_idle=False).memory_breakdown_bytes
    eager, compiled = memory['["model"]'], memory['["model", "loss"]']
    extra = eager["activations/embedding_output"] - compiled["activations/embedding_output"]
    assert extra > 0
    assert extra == pytest.approx((3 * 4 - (4 + 2)) * 8192 * 128256, rel=1e-6)
    assert eager["activations/layers"] == compiled["activations/layers"]


def test_a_given_cross_entropy_overrides_the_older_compile(tmp_path):
    job = _job(tmp_path, "compile = true")
    _, plan = resolve_plan(job, resolve_model(job, None, None),
                           {"gpus": 8, "cross_entropy": "unfused"})
    assert plan["cross_entropy"] == "unfused"


@pytest.mark.parametrize(("loss", "components"), [("torch", ["model"]),
                                                   ("unfused", ["model", "loss"])])
def test_the_written_config_compiles_the_loss_the_plan_has(tmp_path, loss, components):
    model = load_model("llama3-8b")
    plan = plan_from_dict(dict(gpus=8, dp=8, micro_batch=1, global_batch=8, zero=3,
                               stack="compiled", cross_entropy=loss, flash_attention=True,
                               overlap_grad_sync=True, overlap_param_gather=True))
    text = torchtitan_toml(model, plan)
    assert tomllib.loads(text)["compile"]["components"] == components
    path = tmp_path / "back.toml"
    path.write_text(text)
    assert read_config(path).plan.get("cross_entropy", "unfused") == loss
