"""Regressions from the third 2026-12-03 probe of recommend --emit-config: a plan option the
written config cannot carry (a tensor-parallel backward, a flash kernel, DeepSpeed's kernels,
loss and expert weighting, Megatron-LM's parameter gather without the gradient overlap, FSDP's
deferred reduction or kept weights, several pipeline schedules a step) was dropped without a
word, so that predict --from-config read the config back as another plan; torchtitan's
narrowed search ranked first a rank order its config cannot write, and its refusal read "the
plan's the layout". Each option is now written so that it reads back, or refused in one line
naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli
from perfmodel.configs.emit import emit
from perfmodel.errors import PlanError
from perfmodel.predict import predict
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model
from perfmodel.strategy import plan_from_dict

HARDWARE = "dgx-h100"
RECOMMEND = ("recommend", "--model", "llama3-8b", "--hardware", HARDWARE, "--gpus", "16",
             "--global-batch", "64", "--top", "1")
# a plan each framework runs: Megatron-LM's tp 2 with the distributed optimizer, torchtitan's
# and DeepSpeed's ZeRO 3 over 16 ranks (torchtitan's modules op by op)
PLANS: dict[str, dict[str, Any]] = {
    "megatron": dict(gpus=16, dp=8, tp=2, micro_batch=1, global_batch=64, zero=1,
                     flash_attention=True, sequence_parallel=True, overlap_grad_sync=True,
                     overlap_param_gather=True),
    "torchtitan": dict(gpus=16, dp=16, micro_batch=1, global_batch=64, zero=3,
                       flash_attention=True, overlap_grad_sync=True, overlap_param_gather=True,
                       kernels="eager"),
    "deepspeed": dict(gpus=16, dp=16, micro_batch=1, global_batch=64, zero=3,
                      flash_attention=True, overlap_grad_sync=True, overlap_param_gather=True),
}
# predict --from-config's arguments for each format's emitted file
READ = {"megatron": ("launch.sh",), "torchtitan": ("job.toml", "--gpus", "16"),
        "deepspeed": ("ds_config.json", "--model", "llama3-8b")}


def _emit(fmt: str, directory: Path, model: str = "llama3-8b", **fields: Any) -> Any:
    """The prediction of PLANS[fmt] with `fields`, written as `fmt`'s config into directory."""
    spec, hardware = load_model(model), load_hardware(HARDWARE)
    prediction = predict(spec, hardware, plan_from_dict({**PLANS[fmt], **fields}),
                         refuse_idle=False)
    emit(fmt, directory, spec, hardware, prediction.plan, prediction.step_time_s)
    return prediction


def _read_back(fmt: str, directory: Path, *extra: str) -> dict[str, Any]:
    name, *given = READ[fmt]
    out = CliRunner().invoke(cli, ["predict", "--from-config", str(directory / name),
                                   "--hardware", HARDWARE, *given, *extra, "--json"])
    assert out.exit_code == 0, out.output
    back: dict[str, Any] = json.loads(out.stdout)
    return back


def _same_step(prediction: Any, back: dict[str, Any]) -> None:
    assert back["step_time_s"] == pytest.approx(prediction.step_time_s, rel=1e-9)
    assert back["memory_per_gpu_bytes"] == pytest.approx(prediction.memory_per_gpu_bytes,
                                                         rel=1e-9)


@pytest.mark.parametrize("fmt, backward", [("megatron", "dtensor"), ("torchtitan", "megatron")])
def test_a_tensor_parallel_backward_the_framework_does_not_run_is_refused(
        tmp_path: Path, fmt: str, backward: str) -> None:
    """Regression: --tp-backward dtensor emitted as megatron read back as Megatron-Core's
    backward (3.13225 s against the 3.12357 s recommended); torchtitan's DTensor likewise."""
    fields: dict[str, Any] = dict(tp=2, dp=8, sequence_parallel=True) \
        if fmt == "torchtitan" else {}
    with pytest.raises(PlanError, match=f"the plan's tp_backward {backward} cannot be written"):
        _emit(fmt, tmp_path, tp_backward=backward, **fields)
    assert not list(tmp_path.iterdir())


def test_the_kernels_stay_named_where_they_decide_the_backward(tmp_path: Path) -> None:
    """Eager kernels (whose backward is DTensor's) are refused as the kernels, not as the
    backward they imply."""
    with pytest.raises(PlanError, match="the plan's kernels eager cannot be written"):
        _emit("megatron", tmp_path, kernels="eager")


def test_recommend_refuses_to_emit_the_dtensor_backward_as_megatron(tmp_path: Path) -> None:
    """Regression (the probe's command): the header said 3.12357 s, the config read back
    3.13225 s."""
    out = CliRunner().invoke(cli, [*RECOMMEND, "--tp-backward", "dtensor",
                                   "--emit-config", "megatron", str(tmp_path / "m")])
    assert isinstance(out.exception, PlanError)
    assert str(out.exception).startswith("--emit-config megatron: the plan's tp_backward "
                                         "dtensor cannot be written")
    assert "\n" not in str(out.exception) and not (tmp_path / "m" / "launch.sh").exists()


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed"])
def test_a_flash_kernel_the_config_cannot_name_is_refused(tmp_path: Path, fmt: str) -> None:
    """Regression: --attention-kernel fa2 read back as the hardware's default kernel, cuDNN's
    (megatron 3.4477 s recommended against 3.1323 s read back)."""
    with pytest.raises(PlanError, match=f"--emit-config {fmt}: the plan's attention_kernel fa2 "
                                        "cannot be written: .* dgx-h100's default, cudnn"):
        _emit(fmt, tmp_path, attention_kernel="fa2")


def test_the_default_flash_kernel_by_name_reads_back(tmp_path: Path) -> None:
    prediction = _emit("megatron", tmp_path, attention_kernel="cudnn")
    _same_step(prediction, _read_back("megatron", tmp_path))


@pytest.mark.parametrize("model, field, value, read", [
    ("llama3-8b", "kernels", "eager", "fused"),
    ("llama3-8b", "cross_entropy", "torch", "unfused"),
    ("mixtral-8x7b", "expert_weighting", "output", "activation"),
])
def test_deepspeed_refuses_what_its_reader_reads_back_otherwise(
        tmp_path: Path, model: str, field: str, value: str, read: str) -> None:
    """Regression: --kernels eager emitted as deepspeed read back fused (3.6829 s recommended,
    3.2613 s read back); PyTorch's loss read back unfused; a mixture of experts' outputs
    weighted read back weighted in the activation (the same step, another memory)."""
    with pytest.raises(PlanError, match=f"the plan's {field} {value} cannot be written: .* "
                                        f"reads it back as {read}"):
        _emit("deepspeed", tmp_path, model=model, **{field: value})


def test_megatron_refuses_the_parameter_gather_overlapped_without_the_gradient_overlap(
        tmp_path: Path) -> None:
    """Regression: recommend --no-overlap-grad-sync --emit-config megatron wrote
    --overlap-param-gather without --overlap-grad-reduce, which Megatron-LM asserts against (and
    predict --from-config refused to read back)."""
    with pytest.raises(PlanError, match="the plan's overlap_param_gather without "
                                        "overlap_grad_sync cannot be written"):
        _emit("megatron", tmp_path, overlap_grad_sync=False)


@pytest.mark.parametrize("fmt, fields, refused", [
    ("megatron", dict(dp=4, pp=2, pipeline_micro_batches=4), "pipeline_micro_batches 4"),
    ("megatron", dict(zero=3), None),
    ("deepspeed", dict(defer_grad_sync=True), "defer_grad_sync"),
    ("torchtitan", dict(defer_grad_sync=True), "defer_grad_sync"),
    ("megatron", dict(zero=3, fsdp_reshard="backward"), "fsdp_reshard backward"),
    ("deepspeed", dict(fsdp_reshard="backward"), "fsdp_reshard backward"),
    ("torchtitan", dict(fsdp_reshard="step"), "fsdp_reshard step"),
])
def test_options_of_the_python_api_the_config_cannot_carry_are_refused(
        tmp_path: Path, fmt: str, fields: dict[str, Any], refused: str | None) -> None:
    """Regression: a plan of the Python API with FSDP's reduction deferred, its weights kept
    gathered or several pipeline schedules a step was written as one without (Megatron-LM with
    pipeline_micro_batches 4: 4.170 s planned, 3.617 s read back)."""
    if refused is None:  # ZeRO 3 as Megatron-LM writes it (FSDP2) reads back
        prediction = _emit(fmt, tmp_path, **fields)
        _same_step(prediction, _read_back(fmt, tmp_path))
        return
    with pytest.raises(PlanError, match=f"the plan's {refused} cannot be written"):
        _emit(fmt, tmp_path, **fields)


@pytest.mark.parametrize("fields", [dict(dp=8, pp=2, pipeline_micro_batches=4),
                                    dict(fsdp_reshard="backward")])
def test_torchtitan_writes_the_pipeline_schedules_and_the_kept_weights(
        tmp_path: Path, fields: dict[str, Any]) -> None:
    """Regression: torchtitan's config held the whole local batch in one pipeline schedule
    (4.630 s planned, 4.174 s read back) and FSDP's default resharding (3.609 s, 3.683 s); its
    local_batch_size and fsdp_reshard_after_forward "never" say them."""
    prediction = _emit("torchtitan", tmp_path, **fields)
    _same_step(prediction, _read_back("torchtitan", tmp_path))


def test_torchtitan_with_a_pinned_pipeline_is_written_its_own_rank_order(tmp_path: Path) -> None:
    """Regression: --pp 2 --top 1 --emit-config torchtitan ranked first a tp,pp,dp plan, which
    torchtitan's mesh cannot take, and stopped at "the plan's the layout cannot be written"."""
    out = CliRunner().invoke(cli, [*RECOMMEND, "--pp", "2", "--json", "--emit-config",
                                   "torchtitan", str(tmp_path)])
    assert out.exit_code == 0, out.output
    best = json.loads(out.stdout)["plans"][0]
    assert best["plan"]["placement"] == "tp,dp,pp" and best["plan"]["pp"] == 2
    back = _read_back("torchtitan", tmp_path)
    assert back["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("fields, field", [(dict(dp=8, pp=2, placement="tp,pp,dp"),
                                            "placement tp,pp,dp"),
                                           (dict(dp=4, tp=4, tp_layout="2d", micro_batch=2),
                                            "tp_layout 2d")])
def test_torchtitan_names_the_layout_field_it_refuses(tmp_path: Path, fields: dict[str, Any],
                                                      field: str) -> None:
    with pytest.raises(PlanError) as refused:
        _emit("torchtitan", tmp_path, **fields)
    assert str(refused.value).startswith(f"--emit-config torchtitan: the plan's {field} cannot "
                                         "be written: torchtitan")
    assert "the plan's the" not in str(refused.value)


def test_a_file_without_the_environment_says_how_to_read_it_back(tmp_path: Path) -> None:
    """job.toml holds no environment: its header names --expandable-segments, with which
    predict --from-config reads the plan back (the memory counted without fragmentation)."""
    prediction = _emit("torchtitan", tmp_path, expandable_segments=True)
    assert "# Read back with predict --from-config ... --expandable-segments" in \
        (tmp_path / "job.toml").read_text()
    _same_step(prediction, _read_back("torchtitan", tmp_path, "--expandable-segments"))
