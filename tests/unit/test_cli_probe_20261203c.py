"""The command line where a probe found its commands disagreeing with each other (2026-12-03):
perfmodel's own plans (predict --json, recommend --csv) refused when read back by predict --batch,
--collective-algorithm recorded nowhere, layer-graph options and GPU counts predict refuses taken
by sweep and recommend, sweep's --vary help, exit codes of one kind of mistake in two classes,
validate --dry-run --emit, and two messages. Each test fails before its fix."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from perfmodel.layerwise import GRID_DTYPES
from perfmodel.specs.model import load_model
from tests.unit.test_bad_input import run_main

H100 = ["--hardware", "dgx-h100"]
V100 = ["--hardware", "dgx-v100"]
LLAMA = ["--model", "llama3-8b", *H100, "--gpus", "8", "--global-batch", "64"]
TINY_SEARCH = ["recommend", "--model", "tiny-gpt", *H100, "--gpus", "8", "--global-batch", "8"]
GRAPH = [*V100, "--global-batch", "256"]


def _cell(value: Any) -> str:
    """A JSON value as a plans file's cell: true/false, empty for null."""
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def _write_plans(path: Path, rows: list[dict[str, Any]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    path.write_text(buffer.getvalue())
    return path


def _batch(path: Path, *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    code, out, err = run_main(["predict", "--batch", str(path), *flags, "--json"])
    return code, json.loads(out)["rows"], err


# --- 1. perfmodel's own plans read back by predict --batch ----------------------------------------
@pytest.mark.parametrize("flags", [
    [],  # cp 1 (cp_comm p2p written), no recompute (recompute_every 1 written)
    ["--recompute", "full", "--recompute-method", "block", "--recompute-num-layers", "2"],
    ["--cp", "2", "--cp-comm", "a2a"],
    ["--tp", "2", "--collective-algorithm", "tree"],
])
def test_a_predict_json_plan_read_back_by_batch_is_the_same_plan(tmp_path, flags):
    # before: every plan of predict --json says cp_comm p2p with cp 1 and recompute_every 1,
    # which --batch refused ("cp_comm p2p applies to context parallelism (cp > 1)", exit 5)
    code, out, err = run_main(["predict", *LLAMA, *flags, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    row = {**doc["plan"], "collective_algorithm": doc["collective_algorithm"]}
    code, rows, err = _batch(_write_plans(tmp_path / "plans.csv", [row]), "--model", "llama3-8b",
                             *H100)
    assert code == 0 and rows[0]["error"] == "", err
    assert rows[0]["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-12)


def test_a_recommend_csv_read_back_by_batch_predicts_its_step_times(tmp_path):
    # before: recommend --csv writes cp_comm p2p with cp 1, recompute_method uniform and
    # recompute_every 1 with every recompute policy: predict --batch refused those rows
    plans_csv = tmp_path / "searched.csv"
    code, _, err = run_main([*TINY_SEARCH, "--pp", "1", "--tp-layout", "1d", "--csv",
                             str(plans_csv)])
    assert code == 0, err
    searched = list(csv.DictReader(plans_csv.open()))
    picked: dict[tuple[str, bool], dict[str, str]] = {}
    for row in searched:  # one of each recompute policy, with and without context parallelism
        picked.setdefault((row["recompute"], row["cp"] == "1"), row)
    assert {key[0] for key in picked} == {"none", "selective", "full", "op"}
    assert any(cp1 for _, cp1 in picked) and any(not cp1 for _, cp1 in picked)
    results = ("evaluated", "step_time_s", "memory_per_gpu_bytes", "fits_in_memory", "objective")
    rows = [{k: v for k, v in row.items() if k not in results} for row in picked.values()]
    code, predicted, err = _batch(_write_plans(tmp_path / "plans.csv", rows), "--model",
                                  "tiny-gpt", *H100)
    assert code == 0 and all(r["error"] == "" for r in predicted), err
    for row, got in zip(picked.values(), predicted, strict=True):
        assert got["step_time_s"] == pytest.approx(float(row["step_time_s"]), rel=1e-9)


@pytest.mark.parametrize("cells, says", [
    ({"cp": 1, "cp_comm": "a2a"}, "cp_comm a2a applies to context parallelism"),
    ({"recompute": "none", "recompute_every": 2}, "recompute_every 2 needs a recompute policy"),
    ({"recompute": "selective", "recompute_method": "block"}, "the plan recomputes selective"),
])
def test_a_batch_cell_other_than_the_default_where_it_changes_nothing_is_refused(tmp_path, cells,
                                                                                 says):
    plans = _write_plans(tmp_path / "plans.csv", [{"gpus": 8, "dp": 8, **cells}])
    code, rows, err = _batch(plans, "--model", "tiny-gpt", *H100)
    assert code == 5 and says in rows[0]["error"] and says in err, err


# --- 2. --collective-algorithm: recorded, and a plans file's column ------------------------------
def test_the_collective_algorithm_is_recorded_and_a_batch_column(tmp_path):
    base = ["predict", *LLAMA, "--tp", "2"]
    code, text, err = run_main([*base, "--collective-algorithm", "tree"])
    assert code == 0, err
    assert "collective algorithm tree" in text
    code, plain, _ = run_main(base)
    assert "collective algorithm" not in plain  # auto: the hardware's, as before
    tree = json.loads(run_main([*base, "--collective-algorithm", "tree", "--json"])[1])
    auto = json.loads(run_main([*base, "--json"])[1])
    assert (tree["collective_algorithm"], auto["collective_algorithm"]) == ("tree", "auto")
    assert tree["step_time_s"] != auto["step_time_s"]
    plans = _write_plans(tmp_path / "plans.csv", [
        {"tp": 2, "dp": 4, "global_batch": 64, "collective_algorithm": "tree"},
        {"tp": 2, "dp": 4, "global_batch": 64},
        {"tp": 2, "dp": 4, "global_batch": 64, "collective_algorithm": "sideways"}])
    code, rows, err = _batch(plans, "--model", "llama3-8b", *H100)
    assert code == 5 and "collective_algorithm must be one of" in rows[2]["error"], err
    assert rows[0]["step_time_s"] == pytest.approx(tree["step_time_s"], rel=1e-12)
    assert rows[1]["step_time_s"] == pytest.approx(auto["step_time_s"], rel=1e-12)
    # --collective-algorithm stays every row's default; a row's cell wins
    code, rows, _ = _batch(plans, "--model", "llama3-8b", *H100, "--collective-algorithm",
                           "tree")
    assert [r["step_time_s"] for r in rows[:2]] == pytest.approx([tree["step_time_s"]] * 2)


# --- 3. the layer graph's idle options: refused by sweep and recommend as by predict -------------
SWEEP = ["sweep", *GRAPH]


@pytest.mark.parametrize("args, says", [
    ([*SWEEP, "--model", "alexnet", "--norm", "sync", "--vary", "gpus=16"],
     "--norm sync: alexnet has no norm layer"),
    ([*SWEEP, "--model", "resnet50", "--gpus", "16", "--pr", "16", "--norm", "sync", "--vary",
      "peak_flops_per_s=1e14"], "the grid has Pc 1"),
    ([*SWEEP, "--model", "resnet50", "--collective-variant", "split", "--vary",
      "gpus=8,16"], "every grid of the sweep (Pr 1 on 8, 16 GPUs) has Pr 1"),
    ([*SWEEP, "--model", "resnet50", "--contributors", "specialised", "--vary",
      "gpus=16"], "fewer units than Pr (1), and resnet50 has none at this grid"),
    ([*SWEEP, "--model", "resnet50", "--best-pr", "--pr", "4", "--vary",
      "gpus=16"], "--pr 4 beside --best-pr"),
    (["recommend", "--model", "alexnet", *GRAPH, "--gpus", "8", "--norm", "sync"],
     "--norm sync: alexnet has no norm layer"),
    (["recommend", "--model", "alexnet", *GRAPH, "--gpus", "8", "--contributors", "specialised"],
     "alexnet has none at any Pr x Pc split of 8 GPUs"),
    (["predict", "--model", "alexnet", *GRAPH, "--gpus", "8", "--norm", "group"],
     "--norm group: alexnet has no norm layer"),
])
def test_sweep_and_recommend_refuse_the_grid_options_predict_refuses(args, says):
    code, _, err = run_main(args)
    assert code == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1


def test_sweep_refuses_a_pr_that_does_not_divide_a_points_gpus_as_a_plan_error():
    """A split that does not divide the GPU count is a plan error (exit 4), as predict's."""
    code, _, err = run_main([*SWEEP, "--model", "resnet50", "--pr", "16",
                             "--vary", "gpus=16,24"])
    assert code == 4, err
    assert err.strip() == "error: --pr (16) must divide every --vary gpus value, got 24"


@pytest.mark.parametrize("args", [
    # Pr checked against the GPU counts the points take, not the base --gpus
    [*SWEEP, "--model", "resnet50", "--pr", "16", "--vary", "gpus=16"],
    # sync over Pc where some point has Pc > 1
    [*SWEEP, "--model", "resnet50", "--pr", "16", "--norm", "sync", "--vary",
     "gpus=16,32"],
    [*SWEEP, "--model", "resnet50", "--gpus", "8", "--best-pr", "--collective-variant", "split",
     "--vary", "peak_flops_per_s=1e14"],
])
def test_grid_options_where_some_point_uses_them_are_taken(args):
    code, _, err = run_main(args)
    assert code == 0, err


# --- 4. a layer graph's GPUs in whole nodes, as a transformer's ---------------------------------
@pytest.mark.parametrize("args", [
    ["predict", "--model", "resnet50", *V100, "--global-batch", "240", "--pr", "2", "--pc", "6"],
    ["explain", "--model", "resnet50", *V100, "--global-batch", "240", "--gpus", "12"],
    [*SWEEP, "--model", "resnet50", "--vary", "gpus=8,12"],
    [*SWEEP, "--model", "resnet50", "--gpus", "8", "--vary", "gpus_per_node=3"],
    ["recommend", "--model", "resnet50", *V100, "--global-batch", "240", "--gpus", "8,12"],
])
def test_a_layer_graph_takes_whole_nodes_as_a_transformer_does(args):
    code, _, err = run_main(args)
    assert code == 4 and "is not whole nodes of" in err, err
    code, _, err = run_main(["predict", "--model", "llama3-8b", *V100, "--gpus", "12",
                             "--global-batch", "12"])
    assert code == 4 and "is not whole nodes of" in err  # the rule it shares
    code, _, err = run_main(["predict", "--model", "resnet50", *V100, "--global-batch", "240",
                             "--pr", "2", "--pc", "3"])
    assert code == 0, err  # 6 GPUs in one node


# --- 5. sweep --vary's help lists what it accepts ------------------------------------------------
@pytest.mark.parametrize("hardware", ["dgx-v100", "gb200-nvl72"])
def test_sweep_vary_help_names_every_field_the_error_allows(hardware):
    _, help_text, _ = run_main(["sweep", "--help"])
    help_text = " ".join(help_text.split())
    code, _, err = run_main([*SWEEP, "--model", "resnet50", "--hardware", hardware, "--gpus",
                             "8", "--vary", "bogus=1"])
    assert code == 2
    allowed = err.split("allowed: ")[1].split(" (see")[0].split(", ")
    assert len(allowed) > 6
    for field in allowed:
        for part in field.split("."):
            if not part.isdigit() and part not in GRID_DTYPES:
                assert part in help_text, (field, part)


# --- 6. one kind of mistake, one exit code -------------------------------------------------------
def test_an_emit_config_directory_that_is_no_directory_is_an_output_error(tmp_path):
    # before: an existing file was a usage error (2, click's), a FIFO or /dev/null an output one
    existing = tmp_path / "existing.txt"
    existing.write_text("")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for where in (existing, fifo, Path("/dev/null")):
        code, _, err = run_main([*TINY_SEARCH, "--emit-config", "megatron", str(where)])
        assert code == 7 and f"--emit-config: {where} is not a directory" in err, err


@pytest.mark.parametrize("change, code, says", [
    ("bogus=2x", 2, "unknown numeric hardware field 'bogus'"),
    ("asynchronous_device=maybe", 2, "--what-if must look like FIELD=VALUE"),
    ("asynchronous_device=2x", 2, "asynchronous_device is true or false"),
    ("memory_bytes=1e", 2, "is not a number"),
    ("memory_bandwidth_bytes_per_s=nanx", 2, "must be a finite number"),
    # what a well-formed change does to the hardware keeps its class
    ("gpus_per_host=2x", 4, "gpus_per_host is not set on hardware 'dgx-h100'"),
    ("inter_node.bandwidth_bytes_per_s=1e-300x", 3, "must be >= 1e+06"),
])
def test_a_what_if_flag_value_is_a_usage_error_as_a_vary_one(change, code, says):
    # before: --what-if bogus=2x exited 4 where sweep's --vary bogus=1 exits 2 (docs/cli.md: an
    # unknown field of a flag's value is a usage error)
    got, _, err = run_main([*TINY_SEARCH, "--what-if", change])
    assert got == code and says in err, err
    got, _, err = run_main([*SWEEP, "--model", "resnet50", "--gpus", "8", "--vary", "bogus=1"])
    assert got == 2 and "--vary: unknown field 'bogus'" in err


@pytest.mark.parametrize("pins, says", [
    (["--emit-config", "torchtitan", "{tmp}/t", "--zero", "1"],
     "--zero 1: --emit-config torchtitan writes zero 0, 3"),
    (["--emit-config", "torchtitan", "{tmp}/t", "--cpu-offload-layers", "1"],
     "--emit-config torchtitan writes no activation offloading"),
    (["--emit-config", "deepspeed", "{tmp}/d", "--ep", "2"],
     "--emit-config deepspeed writes no ep"),
    (["--emit-config", "megatron", "{tmp}/m", "--placement", "dp,tp,pp"],
     "the plan's placement dp,tp,pp cannot be written"),
])
def test_a_pin_the_emitted_framework_cannot_write_is_a_plan_error_whichever_pin(tmp_path, pins,
                                                                                 says):
    # before: --zero and --recompute exited 2, --placement and --stack 4 (the writer's)
    code, _, err = run_main([*TINY_SEARCH, *(p.format(tmp=tmp_path) for p in pins)])
    assert code == 4 and says in err, err


# --- 7. validate --dry-run --emit ----------------------------------------------------------------
def test_validate_refuses_emit_beside_dry_run(tmp_path):
    out = tmp_path / "job"
    code, _, err = run_main(["validate", "--model", "tiny-gpt", *H100, "--dp", "2",
                             "--global-batch", "4", "--dry-run", "--emit", str(out)])
    assert code == 2 and "--emit beside --dry-run" in err, err
    assert not out.exists()


def test_validate_emit_into_what_is_no_directory_is_an_output_error(tmp_path):
    # before: a FIFO or /dev/null was a traceback (FileExistsError), a file a usage error
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for where in (fifo, Path("/dev/null")):
        code, _, err = run_main(["validate", "--model", "tiny-gpt", *H100, "--dp", "2",
                                 "--global-batch", "4", "--emit", str(where)])
        assert code == 7 and "is not a directory" in err and "Traceback" not in err, err


# --- 8. messages ----------------------------------------------------------------------------------
def test_an_emit_directory_through_a_dangling_link_says_so(tmp_path):
    # before: "cannot create the directory .../megatron_args.txt: File exists", after the search
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    for where in (link, link / "sub"):
        code, _, err = run_main([*TINY_SEARCH, "--emit-config", "megatron", str(where)])
        assert code == 7 and f"{link} is a dangling symbolic link" in err, err


def test_a_batch_cell_too_large_names_its_bound(tmp_path):
    # before: layers=<400 digits> said "must be a whole number >= 1", naming no upper bound
    huge = "1" * 400
    limit = 100_000  # TransformerSpec's (perfmodel.specs.model)
    load_model("llama3-8b", layers=limit)
    with pytest.raises(ValueError, match=f"<= {limit}"):
        load_model("llama3-8b", layers=limit + 1)
    plans = _write_plans(tmp_path / "plans.csv", [
        {"gpus": 8, "layers": huge}, {"gpus": 8, "virtual_stages": huge},
        {"gpus": 8, "layers": "1" * 5000}])
    code, rows, err = _batch(plans, "--model", "llama3-8b", *H100)
    assert code == 5
    for row in (rows[0], rows[2]):  # the spec's bound, of a number of any size
        assert "layers must be > 0 and <= 100000, got ~1e+" in row["error"], err
    assert "at most 1e+07" in rows[1]["error"] and "(400 characters)" in rows[1]["error"]
    assert len(err) < 2000  # the cells are quoted by their ends, not whole
