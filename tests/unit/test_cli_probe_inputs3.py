"""Regressions a probe of the command line's input handling found (recommend's cost objective,
a spec file's zero sizes, an output path ending in '/', lenient numbers and lists): each named
after what broke, each failing before its fix."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from perfmodel.errors import OutputError, PerfmodelError, PlanError
from tests.unit.test_bad_input import run_main

REC = ("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
       "--global-batch", "8")
SMALL = "layers: 4\nhidden: 512\nheads: 8\nseq_len: 1024\nvocab: 32000\n"
PREDICT = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--tp", "8")


def _run(*args: str) -> tuple[int, str, str]:
    """perfmodel ARGS in this process: (exit code, out, err), with no Python warning raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_main(list(args))
    assert not caught, [str(w.message) for w in caught]
    assert "Traceback" not in err and "Warning" not in err, err
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- 1. recommend --objective cost: an infinite or zero cost ----------------------------------


def test_a_cost_that_overflows_is_refused_not_written_as_inf(tmp_path: Path) -> None:
    # --gpu-hour-price 1e300 exited 0 with inf in the CSV's objective column and numpy's
    # RuntimeWarning (overflow in multiply) on stderr
    csv = tmp_path / "rc.csv"
    code, out, err = _run(*REC, "--objective", "cost", "--tokens", "1e15", "--gpu-hour-price",
                          "1e300", "--csv", str(csv))
    line = _one_line(err)
    assert code == 2 and out == "", err
    assert "'--gpu-hour-price'" in line and "1e-12<=x<=1e+12" in line, line
    assert "finite and nonzero" in line, line
    assert not csv.exists()


def test_a_token_budget_and_price_of_1e308_are_refused_not_an_internal_error() -> None:
    # 'internal error: the recommendation is not finite' (exit 1)
    code, _, err = _run(*REC, "--objective", "cost", "--tokens", "1e308", "--gpu-hour-price",
                        "1e308")
    line = _one_line(err)
    assert code == 2 and "'--tokens'" in line and "1<=x<=1e+24" in line, err
    # the ends of the ranges give finite, nonzero costs
    for tokens, price in (("1e24", "1e12"), ("1", "1e-12")):
        code, out, err = _run(*REC, "--top", "1", "--tokens", tokens, "--gpu-hour-price", price,
                              "--json")
        assert code == 0, err
        plan = json.loads(out)["plans"][0]
        assert math.isfinite(plan["objective"]) and plan["objective"] > 0
        assert math.isfinite(plan["cost"]) and plan["cost"] > 0


def test_a_price_that_underflows_to_a_zero_cost_is_refused_not_a_zero_division() -> None:
    # 'internal error: ZeroDivisionError' (recommend.py: other / objective - 1 with a cost of 0)
    for args in (("--tokens", "1", "--gpu-hour-price", "1e-320"),
                 ("--gpu-hour-price", "1e-320"),
                 ("--objective", "time_to_train", "--tokens", "1e-320")):
        code, _, err = _run(*REC, *args)
        line = _one_line(err)
        assert code == 2, (args, err)
        option = "--gpu-hour-price" if "--gpu-hour-price" in args else "--tokens"
        assert f"'{option}'" in line and "finite and nonzero" in line, line


def test_the_api_refuses_the_same_ranges_and_never_ranks_an_infinite_cost() -> None:
    from perfmodel import cli
    from perfmodel.search import GPU_HOUR_PRICE, TOKEN_BUDGET, SearchRequest, objective_of
    from perfmodel.specs.model import load_model
    from perfmodel.strategy import Objective

    assert (cli.TOKEN_BUDGET, cli.GPU_HOUR_PRICE) == (TOKEN_BUDGET, GPU_HOUR_PRICE)
    with pytest.raises(PlanError, match=r"tokens \(--tokens\) must be between 1 and 1e\+24"):
        SearchRequest(gpus=(8,), global_batch=8, tokens=1e308, gpu_hour_price=1.0,
                      objective=Objective.COST)
    with pytest.raises(PlanError, match=r"gpu_hour_price \(--gpu-hour-price\) must be between"):
        SearchRequest(gpus=(8,), global_batch=8, gpu_hour_price=1e-320, objective=Objective.COST)
    req = SearchRequest(gpus=(8,), global_batch=8, tokens=1e15, gpu_hour_price=1.0,
                        objective=Objective.COST)
    object.__setattr__(req, "gpu_hour_price", 1e308)  # past the check: objective_of's guard
    step, gpus = np.array([0.8, np.inf]), np.array([8, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PerfmodelError, match="not a finite nonzero number") as exc:
            objective_of(req, load_model("llama3-8b"), step, gpus)
    assert exc.value.exit_code == 2


# --- 2. a spec file's 0 for a derived size ------------------------------------------------------


@pytest.mark.parametrize("field, extra", [
    ("ffn_hidden: 0", ""), ("ffn_hidden: 0.0", ""), ("kv_heads: 0", ""), ("head_dim: 0", ""),
    ("expert_ffn_hidden: 0", "experts: 8\ntop_k: 2\n"),
    ("shared_expert_ffn_hidden: 0", "experts: 8\ntop_k: 2\nshared_experts: 1\n")])
def test_a_zero_derived_size_in_a_spec_file_is_refused_not_derived(
        tmp_path: Path, field: str, extra: str) -> None:
    # ffn_hidden: 0 was priced as 4 x hidden (a size 0 read as "derive it")
    spec = tmp_path / "z.yaml"
    spec.write_text(SMALL + extra + field + "\n")
    code, out, err = _run("predict", "--model", str(spec), "--hardware", "dgx-h100", "--gpus",
                          "1")
    line = _one_line(err)
    name = field.split(":")[0]
    assert code == 3 and out == "", err
    assert f"{name} must be > 0, got 0" in line and "leave it out" in line, line


def test_a_zero_derived_size_in_json_and_over_a_base_is_refused_null_still_derives(
        tmp_path: Path) -> None:
    spec = tmp_path / "z.json"
    spec.write_text(json.dumps({"layers": 4, "hidden": 512, "heads": 8, "seq_len": 1024,
                                "vocab": 32000, "kv_heads": 0}))
    base = tmp_path / "b.yaml"
    base.write_text("base: llama3-8b\nffn_hidden: 0\n")
    for path in (spec, base):
        code, _, err = _run("predict", "--model", str(path), "--hardware", "dgx-h100", "--gpus",
                            "8")
        assert code == 3 and "must be > 0, got 0" in _one_line(err), err
    null = tmp_path / "n.yaml"
    null.write_text(SMALL + "ffn_hidden: null\n")
    code, out, err = _run("predict", "--model", str(null), "--hardware", "dgx-h100", "--gpus",
                          "1", "--json")
    assert code == 0, err
    from perfmodel.specs.model import TransformerSpec

    # the Python API's 0 still derives (TransformerSpec, load_model's overrides)
    assert TransformerSpec(layers=4, hidden=512, heads=8, seq_len=1024, vocab=32000,
                           ffn_hidden=0).ffn_hidden == 2048


# --- 3. an output path ending in '/' -----------------------------------------------------------


def test_an_output_path_with_a_trailing_slash_never_replaces_the_file(tmp_path: Path) -> None:
    # --trace real.csv/ exited 0 and replaced real.csv (Path() drops the slash)
    real = tmp_path / "real.csv"
    real.write_text("keep\n")
    plans = tmp_path / "b.csv"
    plans.write_text("gpus,tp,global_batch\n8,8,8\n")
    for args in ((*PREDICT, "--trace", f"{real}/"), (*PREDICT, "--trace", f"{real}/."),
                 ("predict", "--batch", str(plans), "--model", "llama3-8b", "--hardware",
                  "dgx-h100", "--out", f"{real}/"),
                 (*REC, "--csv", f"{real}/"),
                 ("sweep", "--model", "alexnet", "--hardware", "dgx-h100",
                  "--global-batch", "64", "--vary", "gpus=8,16", "--csv", f"{real}/")):
        code, _, err = _run(*args)
        line = _one_line(err)
        assert code == 7, (args, err)
        assert "trailing '/'" in line and "is not a directory" in line, line
        assert real.read_text() == "keep\n", args
    missing = tmp_path / "missing.json"
    code, _, err = _run(*PREDICT, "--trace", f"{missing}/")
    assert code == 7 and "does not exist" in _one_line(err), err
    assert not missing.exists()


def test_the_atomic_writer_refuses_a_trailing_slash_itself(tmp_path: Path) -> None:
    from perfmodel.files import atomic_file, check_output, write_atomic

    real = tmp_path / "real.csv"
    real.write_text("keep\n")
    with pytest.raises(OutputError, match="trailing '/'"):
        write_atomic(f"{real}/", "new")
    with pytest.raises(OutputError, match="trailing '/'"):
        check_output(f"{real}/")
    with pytest.raises(OutputError, match="trailing '/'"):
        with atomic_file(f"{real}/") as fh:
            fh.write(b"new")
    assert real.read_text() == "keep\n"
    with pytest.raises(OutputError, match="it is a directory"):  # a directory, as before
        write_atomic(f"{tmp_path}/", "new")
    assert write_atomic(str(tmp_path / "ok.csv"), "x").read_text() == "x"


# --- 4. lenient input --------------------------------------------------------------------------


def test_sweep_refuses_an_empty_value_in_vary() -> None:
    # --vary peak_flops_per_s=1e13,,1e14 dropped the empty value (recommend --gpus 8,,16 refuses)
    base = ("sweep", "--model", "alexnet", "--hardware", "dgx-h100", "--gpus", "8",
            "--global-batch", "64")
    for vary in ("peak_flops_per_s=1e13,,1e14", "peak_flops_per_s=1e13,", "gpus=,8"):
        code, out, err = _run(*base, "--vary", vary)
        assert code == 2 and out == "", err
        assert "an empty value" in _one_line(err), err
    for vary in ("peak_flops_per_s=1_0e13", "gpus=８"):
        code, _, err = _run(*base, "--vary", vary)
        assert code == 2 and "ASCII digits" in _one_line(err), err


def test_recompute_modules_with_an_empty_name_is_refused() -> None:
    # '' and ',mlp' were read as none and as mlp, where 'mlp,mlp' is refused
    args = (*PREDICT, "--recompute", "selective", "--recompute-modules")
    for modules in ("", ",mlp", "mlp,", "mlp,,core_attn"):
        code, out, err = _run(*args, modules)
        assert code == 4 and out == "", (modules, err)
        assert f"recompute_modules: an empty name in '{modules}'" in _one_line(err), err
    code, _, err = _run(*args, "mlp", "--json")
    assert code == 0, err


def test_numbers_are_read_in_ascii_digits_only(tmp_path: Path) -> None:
    # recommend --gpus 8_0 searched 80 GPUs, a full-width '８' 8 GPUs; predict --tp 8_0 read 80
    for gpus in ("8_0", "８", "8,,16"):
        code, _, err = _run(*REC[:5], "--gpus", gpus, "--global-batch", "8")
        assert code == 2 and "--gpus must be whole numbers separated by commas" in \
            _one_line(err), (gpus, err)
    for args in ((*PREDICT[:-2], "--tp", "8_0"), (*PREDICT[:5], "--gpus", "８"),
                 (*REC, "--top", "５"), (*REC, "--memory-margin", "０.5"),
                 (*REC, "--tokens", "1_000")):
        code, _, err = _run(*args)
        assert code == 2 and "write it in ASCII digits, without '_'" in _one_line(err), \
            (args, err)


def test_batch_cells_are_read_in_ascii_digits_only(tmp_path: Path) -> None:
    plans = tmp_path / "b.csv"
    plans.write_text("gpus,tp,global_batch,hidden,recompute,recompute_modules\n"
                     "8_0,8,80,,,\n８,8,8,,,\n8,8,8,4_096,,\n8,8,8,,selective,\",mlp\"\n"
                     "8,8,8,,,\n")
    out = tmp_path / "out.csv"
    code, _, err = _run("predict", "--batch", str(plans), "--model", "llama3-8b", "--hardware",
                        "dgx-h100", "--out", str(out))
    assert code == 5, err
    import csv

    rows = list(csv.DictReader(out.open()))
    assert "column 'gpus' must be a whole number in ASCII digits" in rows[0]["error"]
    assert "column 'gpus' must be a whole number in ASCII digits" in rows[1]["error"]
    assert "column 'hidden' must be a whole number in ASCII digits" in rows[2]["error"]
    assert "recompute_modules': an empty name" in rows[3]["error"]
    assert rows[4]["error"] == "" and float(rows[4]["step_time_s"]) > 0


def test_a_hardware_spec_naming_an_fp8_recipe_twice_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "h.yaml"
    spec.write_text("base: dgx-h100\nfp8_recipes: [delayed, delayed]\n")
    code, _, err = _run("predict", "--model", "llama3-8b", "--hardware", str(spec), "--gpus",
                        "8", "--tp", "8")
    assert code == 3 and "fp8_recipes names 'delayed' twice" in _one_line(err), err


def test_round_robin_routing_with_an_imbalance_is_refused(tmp_path: Path) -> None:
    # the imbalance was applied though round_robin gives every expert the same tokens
    spec = tmp_path / "rr.yaml"
    spec.write_text("base: qwen3-30b-a3b\nrouting: round_robin\nrouting_imbalance: 2\n")
    args = ("predict", "--model", str(spec), "--hardware", "dgx-h100", "--gpus", "8", "--ep", "8")
    code, _, err = _run(*args)
    line = _one_line(err)
    assert code == 3 and "routing round_robin" in line and "routing_imbalance 2" in line, err
    spec.write_text("base: qwen3-30b-a3b\nrouting: round_robin\nrouting_imbalance: 1\n")
    code, _, err = _run(*args, "--json")
    assert code == 0, err


def test_the_no_plan_hint_says_what_rules_the_pinned_pipeline_out() -> None:
    # it said "pp must divide layers (32)" though a pinned pp 5 splits the 32 layers unevenly:
    # what rules the plans out is that no virtual_stages divides 6, 7, 7, 7 and 5 layers
    code, _, err = _run(*REC[:5], "--gpus", "40", "--global-batch", "40", "--pp", "5",
                        "--schedule", "interleaved")
    line = _one_line(err)
    assert code == 4, err
    assert "pp must divide layers" not in line, line
    assert "pp 5 splits the 32 layers 6, 7 on each of the 3 middle stages, 5" in line, line
    code, _, err = _run(*REC[:5], "--gpus", "40", "--global-batch", "40", "--pp", "5",
                        "--schedule", "interleaved", "--virtual-stages", "2")
    assert code == 4 and "virtual_stages 2 must divide every pipeline stage's layers" in \
        _one_line(err), err
    # no pin: the rule names --uneven-stages, which searches the pp that do not divide them
    code, _, err = _run(*REC[:5], "--gpus", "5", "--global-batch", "7")
    assert code == 4 and "--uneven-stages also searches" in _one_line(err), err


def test_memory_margin_prints_the_digits_it_needs() -> None:
    # --memory-margin 0.999 said "memory_margin 100%"
    from perfmodel.recommend import percent

    assert [percent(x) for x in (0.1, 0.999, 0.0004, 0.0, 0.5)] == \
        ["10%", "99.9%", "0.04%", "0%", "50%"]
    assert percent(1 - 2**-40) != "100%"
    code, out, err = _run(*REC, "--memory-margin", "0.999")
    assert "memory_margin 99.9%" in out + err and "memory_margin 100%" not in out + err, err
