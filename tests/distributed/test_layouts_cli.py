"""perfmodel validate --tp-layout 2d and --pr/--pc: workload.layouts runs through the CLI."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from perfmodel.specs.cnn import mlp  # noqa: E402
from validation.cli import validate  # noqa: E402

pytestmark = pytest.mark.distributed


def test_2d_layout_block_through_validate(tmp_path):
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        validate,
        [
            "--model",
            "tiny-gpt",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--tp",
            "4",
            "--tp-layout",
            "2d",
            "--micro-batch",
            "2",
            "--hardware",
            "dgx-a100-80gb",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "2d layout on 4 ranks" in result.output
    report = json.loads(out.read_text())
    assert report["measured_block"]["forward_s"] > 0
    summa = [r for r in report["ledger"] if r["op"] in ("broadcast", "reduce")]
    assert summa and all(r["agree"] for r in summa)


def test_prpc_mlp_through_validate(tmp_path):
    spec = tmp_path / "mlp.json"
    spec.write_text(json.dumps(mlp(widths=(32, 16), inputs=24).to_dict()))
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        validate,
        [
            "--model",
            str(spec),
            "--pr",
            "2",
            "--pc",
            "2",
            "--global-batch",
            "8",
            "--hardware",
            "dgx-a100-80gb",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())
    assert report["plan"] == {"pr": 2, "pc": 2, "global_batch": 8, "contributors": "standard"}
    assert {t["name"] for t in report["terms"]} >= {"comm/model_parallel", "comm/data_parallel"}


def test_a_2d_plan_on_a_non_square_grid_is_one_line(run_cli):
    r = run_cli(
        "validate",
        "--model",
        "tiny-gpt",
        "--tp",
        "8",
        "--tp-layout",
        "2d",
        "--dtype",
        "fp32",
        "--hardware",
        "dgx-a100-80gb",
    )
    assert r.returncode == 4, r.stderr
    assert "Traceback" not in r.stderr and "q^2" in r.stderr
