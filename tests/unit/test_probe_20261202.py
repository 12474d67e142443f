"""Regressions from the 2026-12-02 probes of the Hugging Face import and the DeepSpeed reader."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from perfmodel.cli import cli, main
from tests.conftest import ROOT

HF = ROOT / "tests" / "data" / "hf"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})


def _exit(capsys, *args: str) -> tuple[int, str]:
    """perfmodel's exit status and standard error, as a user's command ends."""
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    return int(ended.value.code or 0), capsys.readouterr().err


def _qwen3_moe(tmp_path, **changes):
    """Qwen/Qwen3-30B-A3B's config.json with some keys changed."""
    target = tmp_path / "qwen3"
    shutil.copytree(HF / "qwen3-30b-a3b", target)
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(changes)
    (target / "config.json").write_text(json.dumps(cfg))
    return target


@pytest.mark.parametrize("changes", [{"num_experts": "12_8"}, {"num_experts": " 128 "},
                                     {"num_experts": "1.28e2"}, {"hidden_size": "2048"},
                                     {"mlp_only_layers": ["0"]}])
def test_a_quoted_number_in_a_hugging_face_config_is_refused(tmp_path, capsys, changes):
    """Regression: float() read '12_8' (Python's digit grouping) and ' 128 ' as 128, a model
    transformers would not build (nn.Linear of a string): 30.5B parameters printed."""
    model = _qwen3_moe(tmp_path, **changes)
    code, err = _exit(capsys, "predict", "--model", str(model), "--hardware", "dgx-h100",
                      "--gpus", "8", "--ep", "8", "--seq-len", "4096", "--global-batch", "64")
    assert code == 3, err
    assert "must be a JSON number, got the string" in err and err.count("\n") == 1


def test_an_integer_too_long_for_python_is_a_spec_error(tmp_path, capsys):
    """Regression: json.loads raised ValueError (over 4,300 digits): 'internal error', exit 1."""
    target = tmp_path / "llama"
    shutil.copytree(HF / "llama-3.1-8b", target)
    text = (target / "config.json").read_text()
    cfg = json.loads(text)
    text = json.dumps(cfg).replace(f'"hidden_size": {cfg["hidden_size"]}',
                                   '"hidden_size": 1' + "0" * 5000)
    (target / "config.json").write_text(text)
    code, err = _exit(capsys, "predict", "--model", str(target), "--hardware", "dgx-h100",
                      "--gpus", "8", "--seq-len", "4096", "--global-batch", "64")
    assert code == 3 and "holds a number perfmodel cannot read" in err, err


def test_a_deepspeed_config_pins_data_parallelism_alone_for_a_hugging_face_moe(capsys):
    """A Hugging Face MoE block under DeepSpeed's engine is a plain module ZeRO shards over dp:
    no expert groups (deepspeed.moe.layer.MoE's), no context parallelism, no combined 1F1B.
    Regression: recommend searched ep and cp (best plan dp=4 cp=4 ep=8 ... ep-overlap) and
    predict took --ep 8."""
    config = str(ROOT / "tests/data/configs/deepspeed_zero3.json")
    common = ["--from-config", config, "--model", str(HF / "qwen3-30b-a3b"), "--seq-len",
              "4096", "--hardware", "dgx-h100"]
    for flag in ("--ep", "--cp", "--etp"):
        code, err = _exit(capsys, "predict", *common, flag, "2")
        assert code != 0 and "contradicts the config's" in err, err
    res = _run("recommend", *common, "--top", "3")
    assert res.exit_code == 0, res.output
    pins = next(line for line in res.output.splitlines() if "recommend pins" in line)
    assert "cp 1, ep 1, etp 1" in pins and "searches recompute" in pins
    best = next(line for line in res.output.splitlines() if line.startswith("best plan:"))
    assert "ep=" not in best and "cp=" not in best
