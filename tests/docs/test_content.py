"""What the docs claim, checked against its sources: the spec examples are complete and real, the
accuracy summary is the measurements it summarises, and the README has what a newcomer needs."""

from __future__ import annotations

import dataclasses
import json
import re

import yaml

from tests.docs.samples import DOC_FILES, ROOT, blocks, commands


def _example(source: str, name: str) -> str:
    for block in blocks(source):
        for d in block.directive("file"):
            if d.args[1] == name:
                return block.text
    raise AssertionError(f"{source} has no example file {name}")


def _keys(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield f"{prefix}{key}"
            yield from _keys(value, f"{prefix}{key}.")
    elif isinstance(data, list):
        for item in data:
            yield from _keys(item, f"{prefix}[].")


def test_the_complete_hardware_example_has_every_field():
    from perfmodel.specs.hardware import CollectiveFit, GemmEfficiency, HardwareSpec, LinkSpec

    keys = set(_keys(yaml.safe_load(_example("docs/specs.md", "my-cluster.yaml"))))
    top = {k for k in keys if "." not in k}
    assert top == {f.name for f in dataclasses.fields(HardwareSpec)}
    for link in ("intra_node", "inter_node"):
        assert {f"{link}.{f.name}" for f in dataclasses.fields(LinkSpec)} <= keys
    assert {f"gemm_efficiency.bf16.{f.name}" for f in dataclasses.fields(GemmEfficiency)} <= keys
    assert {f"collectives.[].{f.name}" for f in dataclasses.fields(CollectiveFit)} <= keys


def test_the_complete_model_example_has_every_field():
    from perfmodel.specs.model import MODEL_FIELDS

    data = yaml.safe_load(_example("docs/specs.md", "my-model.yaml"))
    assert set(data) == set(MODEL_FIELDS)


def test_the_hf_config_example_is_the_llama3_8b_preset():
    from perfmodel.specs.model import load_model, model_from_hf_config

    hf = model_from_hf_config(json.loads(_example("docs/specs.md", "hf-llama/config.json")), "hf",
                              seq_len=8192)
    preset = load_model("llama3-8b")
    assert hf.replace(name=preset.name, source=preset.source) == preset


def test_the_layer_graph_example_has_every_layer_field_and_consistent_sizes():
    from perfmodel.specs.layers import LayerSpec

    data = yaml.safe_load(_example("docs/specs.md", "small-cnn.yaml"))
    used = {k for layer in data["layers"] for k in layer}
    assert used == {f.name for f in dataclasses.fields(LayerSpec)}
    for layer in data["layers"]:
        if layer["kind"] in ("conv", "linear"):  # FLOPs = 2 m n k; params = k n + n (bias)
            m, n, k = layer["gemm_m"], layer["gemm_n"], layer["gemm_k"]
            assert layer["flops"] == 2 * m * n * k and layer["params"] == k * n + n


def test_the_plans_example_has_every_column():
    from perfmodel.batch import MODEL_COLUMNS, PLAN_COLUMNS

    header = _example("docs/specs.md", "plans-mixed.csv").splitlines()[0].split(",")
    assert set(PLAN_COLUMNS) | {"model", "hardware"} <= set(header)
    assert set(header) - set(PLAN_COLUMNS) - {"model", "hardware"} <= set(MODEL_COLUMNS)


def test_the_profile_example_has_every_field_and_fit_kind():
    from perfmodel.specs.profile import _FIT_REQUIRED, _TOP, FIT_KINDS, PROVENANCE_FIELDS

    data = json.loads((ROOT / "docs/examples/cpu.json").read_text())
    assert set(data) == set(_TOP)
    assert {f["kind"] for f in data["fits"].values()} == set(FIT_KINDS)
    assert all(set(_FIT_REQUIRED) <= set(f) for f in data["fits"].values())
    assert set(PROVENANCE_FIELDS) <= set(data["provenance"])


def test_the_history_example_is_what_validate_appends_for_the_accuracy_runs(tmp_path):
    from validation.report import append_history

    reports = sorted((json.loads(p.read_text())
                      for p in (ROOT / "tests/data/validation").glob("*.json")),
                     key=lambda r: r["created"])
    path = tmp_path / "history.csv"
    for report in reports:
        append_history(report, path)
    assert path.read_text() == (ROOT / "docs/examples/history.csv").read_text()


def _accuracy_sections() -> tuple[str, str]:
    """docs/accuracy.md split into its summary (before the first section) and the sections."""
    text = (ROOT / "docs/accuracy.md").read_text()
    cut = text.index("\n## ")
    return text[:cut], text[cut:]


def test_accuracy_summary_numbers_are_the_measurements_below_it():
    """The summary table invents nothing: each of its numbers stands in a section of the page."""
    summary, sections = _accuracy_sections()
    table = "\n".join(line for line in summary.splitlines() if line.startswith("|"))
    numbers = re.findall(r"(?<![\w.])\d+(?:\.\d+)?%?", table)
    assert len(numbers) > 20
    missing = [n for n in numbers
               if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", sections)]
    assert not missing, f"numbers of the summary of docs/accuracy.md not below it: {missing}"


def test_readme_has_what_a_newcomer_needs():
    """What it is, the two set-up commands, a quick start of every command, a sample output."""
    readme = (ROOT / "README.md").read_text()
    setup = [c for b in blocks("README.md") if b.language == "bash" for c in commands(b)]
    assert setup[:2] == ["pip install torch==2.13.0 -e '.[dev]' '&&' python -m compileall -q "
                         "perfmodel workload calibration validation", "python -m pytest -n 2"]
    run = " ".join(setup)
    for command in ("presets", "predict", "explain", "collective", "recommend", "sweep",
                    "calibrate run", "calibrate import-nccl-tests", "calibrate import-gemm",
                    "calibrate report", "validate"):
        assert f"perfmodel {command} " in run + " ", f"no quick start of perfmodel {command}"
    assert any(b.directive("output") for b in blocks("README.md")), "no sample output"
    assert readme.startswith("# perfmodel\n\nPredict how fast")
    assert len(readme.splitlines()) <= 150, "the README is the front door: the rest goes to docs/"


def test_the_readme_links_every_page_of_the_docs():
    readme = (ROOT / "README.md").read_text()
    missing = [page for page in DOC_FILES[1:] if f"]({page})" not in readme]
    assert not missing, f"pages the README does not point to: {missing}"


def test_docs_index_has_a_quick_start_of_every_command():
    from tests.docs.test_reference import _tree

    run = " ".join(c for b in blocks("docs/index.md") if b.language == "bash" for c in commands(b))
    for path, _, _ in _tree():
        if path in ("perfmodel", "perfmodel calibrate"):
            continue  # groups; `perfmodel validate` is a command of its own too
        assert f"{path} " in run + " ", f"docs/index.md has no quick start of {path}"
