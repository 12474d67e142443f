"""predict --batch, recommend --html and sweep where a probe found them wrong (2026-12-02).
Each test fails before its fix."""

from __future__ import annotations

import json
import re

from tests.unit.test_bad_input import run_main


def test_a_plans_file_that_repeats_a_column_is_refused_naming_it(tmp_path):
    """csv.DictReader keeps the last of two cells of a name: ep 8 then ep 1 was predicted as ep 1
    and echoed with the 8 gone."""
    plans = tmp_path / "dup.csv"
    plans.write_text("model,hardware,gpus,tp,ep,sequence_parallel,global_batch,ep\n"
                     "mixtral-8x7b,dgx-h100,16,2,8,true,16,1\n")
    code, _, err = run_main(["predict", "--batch", str(plans)])
    assert code == 5 and "column 'ep' is given 2 times: give each column once" in err, err


def test_the_collective_algorithm_applies_to_rows_that_name_their_hardware(tmp_path):
    """No column gives it: a row naming dgx-h100 was priced with auto, the same plan without a
    hardware cell with tree."""
    plans = tmp_path / "ca.csv"
    plans.write_text("model,hardware,gpus,tp,ep,sequence_parallel,global_batch\n"
                     "mixtral-8x7b,dgx-h100,64,2,8,true,64\n"
                     "mixtral-8x7b,,64,2,8,true,64\n")
    code, out, err = run_main(["predict", "--batch", str(plans), "--hardware", "dgx-h100",
                               "--collective-algorithm", "tree", "--json"])
    assert code == 0, err
    first, second = (r["step_time_s"] for r in json.loads(out)["rows"])
    assert first == second
    code, out, _ = run_main(["predict", "--batch", str(plans), "--hardware", "dgx-h100",
                             "--json"])
    assert json.loads(out)["rows"][0]["step_time_s"] != first  # tree is not auto here


def test_the_html_plans_table_gives_cp_ep_and_the_overlaps(tmp_path):
    """The terminal table had cp (with its form), ep, etp and the overlaps; the HTML table did
    not, so dp x tp did not make the GPUs and two plans differing in cp read alike."""
    report = tmp_path / "rec.html"
    code, _, err = run_main(["recommend", "--model", "mixtral-8x7b", "--hardware", "dgx-b200",
                             "--gpus", "16", "--global-batch", "64", "--dtype", "fp8",
                             "--max-pp", "2", "--top", "3", "--html", str(report)])
    assert code == 0, err
    table = re.search(r'<table[^>]*id="plans-table".*?</table>', report.read_text(), re.S)
    assert table is not None
    headers = re.findall(r"<th[^>]*>(.*?)</th>", table.group(0))
    for name in ("cp", "ep", "etp", "overlap"):
        assert name in headers, headers


def test_a_sweep_refusal_names_the_peak_given_not_its_factor():
    code, _, err = run_main(["sweep", "--model", "resnet50", "--hardware", "dgx-h100", "--gpus",
                             "16", "--global-batch", "256", "--pr", "2", "--vary",
                             "peak_flops_per_s=1e-300"])
    assert code == 3 and "(peak_flops_per_s=1e-300)" in err and "x)" not in err, err


def test_a_refusal_names_the_value_given_not_a_rounding_of_it():
    """'got 4' for 4.0000001 contradicted 'at most 4'; a batch cell ep=1e30 printed 31 digits."""
    import pytest

    from perfmodel import PlanError, SpecError
    from perfmodel.specs.loading import number
    from perfmodel.strategy import Plan

    with pytest.raises(SpecError, match=r"<= 4, got 4\.0000001"):
        number(4.0000001, "routing_imbalance", maximum=4)
    with pytest.raises(PlanError, match=r"got 1e30$"):
        Plan(gpus=8, ep="1e30")


def test_sweep_offers_only_the_dtypes_a_layer_graph_takes():
    """--help listed fp8, which the grid plan then refused."""
    from perfmodel import cli, layerwise

    assert cli.GRID_DTYPES == layerwise.GRID_DTYPES
    code, _, err = run_main(["sweep", "--model", "resnet50", "--hardware", "dgx-h100", "--gpus",
                             "16", "--global-batch", "256", "--pr", "2", "--dtype", "fp8",
                             "--vary", "peak_flops_per_s=1e15"])
    assert code == 2 and "'fp8' is not one of 'fp32', 'tf32', 'bf16', 'fp16'" in err, err
