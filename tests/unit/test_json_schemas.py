"""Every --json document names its kind and version and matches its published JSON Schema
(issue 18, item 6).

The schemas are built by perfmodel.schemas and published in docs/schemas/KIND.json; the real
outputs of each command are validated against the published files (draft 2020-12, the
jsonschema package), and a document that breaks the contract is refused by them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from perfmodel.output import SCHEMA_VERSIONS, document, schema_id
from perfmodel.schemas import schema
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

PUBLISHED = ROOT / "docs" / "schemas"


def published(kind: str) -> dict:
    return json.loads((PUBLISHED / f"{kind}.json").read_text())


def check(out: str, kind: str) -> dict:
    """The document printed, checked against the published schema of kind."""
    doc = json.loads(out)
    assert next(iter(doc)) == "schema" and doc["schema"] == schema_id(kind)
    errors = [f"{list(e.absolute_path)}: {e.message}"
              for e in Draft202012Validator(published(kind)).iter_errors(doc)]
    assert errors == []
    return doc


def test_the_published_schemas_are_the_code_s_and_valid_draft_2020_12():
    files = sorted(p.stem for p in PUBLISHED.glob("*.json"))
    assert files == sorted(SCHEMA_VERSIONS), "python -m perfmodel.schemas docs/schemas"
    for kind in SCHEMA_VERSIONS:
        Draft202012Validator.check_schema(published(kind))
        assert published(kind) == schema(kind), (
            f"docs/schemas/{kind}.json is stale: python -m perfmodel.schemas docs/schemas")
        assert published(kind)["properties"]["schema"]["const"] == \
            f"perfmodel.{kind}/{SCHEMA_VERSIONS[kind]}"


def test_the_docs_page_names_every_kind_and_links_its_file():
    page = (ROOT / "docs" / "json.md").read_text()
    for kind in SCHEMA_VERSIONS:
        assert f"`{schema_id(kind)}`" in page and f"(schemas/{kind}.json)" in page


def test_document_puts_the_schema_first():
    assert list(document("collective", {"op": "x", "schema": "old"})) == ["schema", "op"]
    with pytest.raises(KeyError):
        schema_id("explain")


COMMANDS = [
    ("predict", "predict --model llama2-7b --hardware dgx-h100 --tp 8 --gpus 8 --json"),
    ("predict", f"predict --model llama3-8b --profile "
                f"{ROOT}/docs/examples/cpu.json --tp 2 --gpus 2 --global-batch 2 --json"),
    ("predict.grid", "predict --model alexnet --hardware dgx-v100 --gpus 8 --json"),
    ("recommend", "recommend --model llama2-7b --hardware dgx-h100 --gpus 8 --global-batch 8 "
                  "--json --sensitivities --what-if inter_node.bandwidth_bytes_per_s=2x"),
    ("recommend", "recommend --model llama2-7b --hardware dgx-h100 --gpus 8,16 --global-batch 16 "
                  "--tokens 1e9 --gpu-hour-price 2.5 --top 3 --json"),
    ("recommend", "recommend --model llama2-7b --hardware dgx-h100 --gpus 8 --global-batch 8 "
                  "--gpu-hour-price 2.5 --top 2 --json"),
    # plans that tie with the best (another placement): runner_up.ties > 0; the others 0
    ("recommend", "recommend --model llama2-7b --hardware dgx-h100 --gpus 8 --global-batch 8 "
                  "--tp 4 --pp 1 --micro-batch 1 --cp 1 --recompute none --zero 1 "
                  "--sequence-parallel --top 6 --json"),
    ("recommend.grid", "recommend --model alexnet --hardware dgx-v100 --gpus 8 --global-batch 256 "
                       "--json"),
    ("collective", "collective --op all_reduce --bytes 1GiB --ranks 1 --hardware dgx-h100 --json"),
    ("collective", "collective --op all_gather --bytes 64KB --ranks 16 --hardware dgx-h100 --json"),
    ("sweep", "sweep --model alexnet --hardware dgx-v100 --gpus 16 "
              "--vary peak_flops_per_s=1e13,1e14 --vary global_batch=128,256 --json"),
    ("presets", "presets --json"),
    ("validate.dry-run", "validate --model tiny-gpt --dry-run --dp 2 --tp 2 --json"),
]


@pytest.mark.parametrize(("kind", "command"), COMMANDS,
                         ids=[f"{k}: {c.split(' --json')[0][:50]}" for k, c in COMMANDS])
def test_each_command_s_json_matches_its_published_schema(kind, command):
    code, out, err = run_main(command.split())
    assert code == 0, err
    check(out, kind)


def test_recommend_without_a_plan_that_fits_is_a_document_too():
    code, out, _ = run_main("recommend --model gpt3-175b --hardware dgx-a100-80gb --gpus 8 "
                            "--global-batch 8 --json".split())
    assert code == 4
    doc = check(out, "recommend")
    assert doc["plans"] == [] and "no plan fits" in doc["explanation"]["infeasible"]["reason"]


def test_predict_batch_json_matches_its_schema(tmp_path: Path):
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,dp,tp\n8,8,1\n8,abc,1\n")
    code, out, _ = run_main(["predict", "--model", "llama2-7b", "--hardware", "dgx-h100",
                             "--batch", str(plans), "--json"])
    assert code == 5
    rows = check(out, "predict.batch")["rows"]
    assert rows[0]["step_time_s"] > 0 and rows[1]["step_time_s"] is None and rows[1]["error"]


@pytest.mark.parametrize(("path", "value"), [
    (["step_time_s"], None),  # removed
    (["plan", "dp"], "8"),  # retyped
    (["breakdown_s", "comm/tp"], "fast"),
    (["schema"], "perfmodel.predict/2"),  # another version
])
def test_the_schema_refuses_a_document_that_breaks_the_contract(path, value):
    code, out, _ = run_main("predict --model llama2-7b --hardware dgx-h100 --tp 8 --gpus 8 "
                            "--json".split())
    doc = json.loads(out)
    broken = copy.deepcopy(doc)
    node = broken
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    validator = Draft202012Validator(published("predict"))
    assert validator.is_valid(doc) and not validator.is_valid(broken)
    added = {**doc, "a_field_from_a_later_release": 1}  # an added field keeps the version
    assert validator.is_valid(added)


@pytest.mark.distributed
def test_validate_json_and_its_report_match_the_schema(tmp_path: Path):
    """A real two-rank gloo job (tiny-gpt, two steps): its --json and its report.json."""
    from validation.cli import validate

    out = tmp_path / "report.json"
    result = CliRunner().invoke(validate, [
        "--model", "tiny-gpt", "--hardware", "dgx-h100", "--dp", "2", "--global-batch", "4",
        "--nprocs", "2", "--backend", "gloo", "--steps", "2", "--warmup", "1", "--out", str(out),
        "--history", str(tmp_path / "history.csv"), "--run-dir", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    printed = check(result.stdout, "validate")
    assert printed["status"] == "ok" and printed["measured_step_time_s"] > 0
    assert check(out.read_text(), "validate") == printed
