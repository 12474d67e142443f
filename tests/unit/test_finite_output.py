"""Every answer is finite and every --json is strict JSON (issue 14, item 4).

A NaN or an infinity is never printed: bad input is refused by the specs' physical ranges
(tests/unit/test_specs.py); what still comes out non-finite is a bug, and the command says so in
one line with exit 1 (perfmodel.output.require_finite). --json goes through one writer
(perfmodel.output.json_text, allow_nan=False); a source check keeps it so, and every command's
--json output is parsed here by a strict parser.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path

import pytest

from perfmodel.errors import InternalError
from perfmodel.output import json_text, non_finite, require_finite
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

PACKAGES = ("perfmodel", "calibration", "validation")
OUTPUT_CALLS = {"echo", "secho", "print"}  # and sys.stdout.write / sys.stderr.write


def _strict(text: str) -> object:
    """json.loads that refuses NaN, Infinity and -Infinity (RFC 8259)."""
    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# --- the source check ------------------------------------------------------------------------
def _is_json_text(node: ast.AST) -> bool:
    """json.dumps(...) / json.dump(...) / X.to_json(...) without allow_nan=False."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    f = node.func
    dumps = isinstance(f.value, ast.Name) and f.value.id == "json" and f.attr in ("dumps", "dump")
    strict = any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant)
                 and k.value.value is False for k in node.keywords)
    return (dumps and not strict) or f.attr == "to_json"


def _is_output(node: ast.Call) -> bool:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in OUTPUT_CALLS
    if isinstance(f, ast.Attribute):
        if f.attr in OUTPUT_CALLS:
            return True
        owner = f.value
        return (f.attr == "write" and isinstance(owner, ast.Attribute)
                and owner.attr in ("stdout", "stderr"))
    return False


def json_output_without_the_helper(rel: str, tree: ast.AST) -> list[str]:
    """Places where a command prints JSON not written by perfmodel.output.json_text: a
    json.dumps / to_json in what is echoed or printed, or in a name that is printed later in the
    same function, or json.dump to standard output."""
    found = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        tainted = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
                   and any(_is_json_text(c) for c in ast.walk(n.value))
                   for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            if _is_output(node):
                inner = [c for a in node.args for c in ast.walk(a)]
                if any(_is_json_text(c) for c in inner) or any(
                        isinstance(c, ast.Name) and c.id in tainted for c in inner):
                    found.append(f"{rel}:{node.lineno}")
            if _is_json_text(node) and any(isinstance(a, ast.Attribute) and a.attr == "stdout"
                                           for a in node.args[1:]):
                found.append(f"{rel}:{node.lineno}")
    return sorted(set(found))


def test_every_json_a_command_prints_goes_through_the_strict_helper():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            found += json_output_without_the_helper(rel, ast.parse(path.read_text()))
    assert found == []


@pytest.mark.parametrize("code", [
    "import click, json\nclick.echo(json.dumps(x))\n",
    "import json\nprint(json.dumps(x, indent=2))\n",
    "def f(frame):\n    text = frame.to_json()\n    print(text)\n",
    "import json, sys\ndef f(x):\n    out = json.dumps(x)\n    sys.stdout.write(out)\n",
    "import json, sys\njson.dump(x, sys.stdout)\n",
])
def test_the_source_check_catches_each_way_of_printing_json(code):
    assert json_output_without_the_helper("x.py", ast.parse(code))


def test_the_source_check_passes_the_helper_and_file_writes():
    code = ("import json\nfrom perfmodel.output import json_text\nprint(json_text(x))\n"
            "path.write_text(json.dumps(x))\nprint(json.dumps(x, allow_nan=False))\n")
    assert json_output_without_the_helper("x.py", ast.parse(code)) == []


# --- the helpers -------------------------------------------------------------------------------
def test_json_text_is_strict_and_names_what_is_not_finite():
    assert _strict(json_text({"a": [1.5, None, True]})) == {"a": [1.5, None, True]}
    with pytest.raises(InternalError, match=r"the JSON output is not finite \(b\.c\[1\] = inf\)"):
        json_text({"a": 1.0, "b": {"c": [2.0, math.inf]}})
    with pytest.raises(InternalError, match="nan"):
        json_text([math.nan])


def test_json_text_writes_numpy_and_sympy_numbers_and_refuses_their_nan():
    import numpy as np
    import sympy as sp

    assert _strict(json_text({"n": np.float64(2.5), "a": np.arange(2), "s": sp.Float(0.5)})) == {
        "n": 2.5, "a": [0, 1], "s": 0.5}
    with pytest.raises(InternalError, match="x = nan"):
        json_text({"x": np.float64("nan")})


def test_non_finite_finds_the_cells_of_a_frame():
    import pandas as pd

    frame = pd.DataFrame({"t": [1.0, math.inf], "name": ["a", "b"]})
    assert non_finite(frame) == [("1.t", math.inf)]
    assert non_finite({"rows": [1, 2]}) == []


def test_require_finite_names_the_most_specific_terms_first():
    data = {"step_time_s": math.inf, "breakdown_s": {"comm/dp": math.inf, "compute": 1.0}}
    with pytest.raises(InternalError) as err:
        require_finite(data, "step time", "m on h")
    assert str(err.value) == ("step time is not finite (breakdown_s.comm/dp = inf, step_time_s = "
                              "inf) for m on h; please report it")


# --- a non-finite answer that slipped past the ranges: exit 1, one line ------------------------
def _slipped(hardware: str = "dgx-h100"):
    """A spec whose inter-node bandwidth is 5e-324 B/s (the smallest float: bytes over it are
    infinite), set past its checks as a bug would."""
    from perfmodel.specs.hardware import load_hardware

    hw = load_hardware(hardware)
    link = dataclasses.replace(hw.inter_node)
    object.__setattr__(link, "bandwidth_bytes_per_s", 5e-324)
    out = dataclasses.replace(hw)
    object.__setattr__(out, "inter_node", link)
    return out


def test_a_non_finite_prediction_is_an_internal_error_naming_the_term():
    from perfmodel import Plan, load_model, predict

    with pytest.raises(InternalError, match=r"step time is not finite \(.*comm/dp = (nan|inf)"):
        predict(load_model("tiny-gpt"), _slipped(), Plan(gpus=16, dp=16, global_batch=16))


def test_a_non_finite_layer_graph_prediction_is_an_internal_error(monkeypatch):
    from perfmodel import layerwise, load_hardware, load_model

    compiled = layerwise._compiled

    def broken(*args):  # a formula that overflows its first term
        names, fn, times, memory = compiled(*args)
        return names, lambda *x: [math.inf, *fn(*x)[1:]], times, memory

    monkeypatch.setattr(layerwise, "_compiled", broken)
    with pytest.raises(InternalError, match=r"step time is not finite \(compute/forward = inf"):
        layerwise.predict_grid(load_model("alexnet"), load_hardware("dgx-v100"),
                               layerwise.GridPlan(pr=1, pc=16, global_batch=256))


def test_the_cli_says_internal_error_in_one_line_and_exits_1(monkeypatch):
    import perfmodel.specs.resolve as resolve  # where the commands load --hardware

    slipped = _slipped()
    monkeypatch.setattr(resolve, "load_hardware", lambda name: slipped)
    code, out, err = run_main(["predict", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                               "--dp", "16", "--gpus", "16", "--json"])
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith("internal error: step time is not finite (") and "comm/dp = " in err
    assert "for tiny-gpt on dgx-h100, dp=16 tp=1 pp=1" in err and len(err.splitlines()) == 1


# --- every command's --json is strict JSON -----------------------------------------------------
COMMANDS = [
    "predict --model llama2-7b --hardware dgx-h100 --tp 8 --gpus 8 --json",
    "predict --model alexnet --hardware dgx-v100 --gpus 8 --json",
    "collective --op all_reduce --bytes 1GiB --ranks 1 --hardware dgx-h100 --json",
    "collective --op all_gather --bytes 64KB --ranks 16 --hardware dgx-h100 --json",
    "recommend --model llama2-7b --hardware dgx-h100 --gpus 8 --global-batch 8 --json "
    "--sensitivities --what-if inter_node.bandwidth_bytes_per_s=2x",
    "recommend --model alexnet --hardware dgx-v100 --gpus 8 --global-batch 256 --json",
    "sweep --model alexnet --hardware dgx-v100 --gpus 16 --global-batch 256 "
    "--vary peak_flops_per_s=1e13,1e14 --json",
    "presets --json",
    "validate --model tiny-gpt --dry-run --dp 2 --json",
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split(" --json")[0][:60] for c in COMMANDS])
def test_every_json_output_is_strict_json(command):
    code, out, err = run_main(command.split())
    assert code == 0, err
    _strict(out)


def test_predict_batch_json_is_strict_json(tmp_path: Path):
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,dp,tp\n8,8,1\n8,1,8\n8,abc,1\n")
    code, out, _ = run_main(["predict", "--model", "llama2-7b", "--hardware", "dgx-h100",
                             "--batch", str(plans), "--json"])
    assert code == 5  # the bad row
    rows = _strict(out)["rows"]
    assert [bool(r["error"]) for r in rows] == [False, False, True]
    assert rows[2]["step_time_s"] is None  # what the bad row lacks is null, not ""


def test_a_collective_over_one_rank_takes_no_time_and_has_no_bandwidth():
    """Regression: `collective --ranks 1 --json` printed "algbw_bytes_per_s": Infinity."""
    code, out, err = run_main(COMMANDS[2].split())
    assert code == 0, err
    result = _strict(out)
    assert result["time_s"] == 0.0
    assert result["algbw_bytes_per_s"] is None and result["busbw_bytes_per_s"] is None
    code, out, _ = run_main(COMMANDS[2].replace(" --json", "").split())
    assert code == 0 and "n/a (one rank moves nothing)" in out


def test_recommend_csv_leaves_the_step_time_of_plans_that_do_not_fit_empty(tmp_path: Path):
    """The search never ranks a plan that does not fit (its step time is left infinite): the CSV
    of every evaluated plan says nothing for it rather than 'inf'."""
    import pandas as pd

    csv = tmp_path / "all.csv"
    code, _, err = run_main(["recommend", "--model", "llama2-7b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--global-batch", "8", "--csv", str(csv)])
    assert code == 0, err
    assert "inf" not in csv.read_text()
    frame = pd.read_csv(csv)
    empty = frame["step_time_s"].isna()
    assert empty.any() and not frame.loc[empty, "fits_in_memory"].any()
    # the attention each plan was costed with: the hardware's default where the request leaves
    # it (it was left empty), so that the CSV reads back
    assert frame["flash_attention"].all() and set(frame["attention_kernel"]) == {"cudnn"}
    # fp8 attends in bf16: its kernel too
    code, _, err = run_main(["recommend", "--model", "llama2-7b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--global-batch", "8", "--dtype", "fp8",
                             "--csv", str(csv)])
    assert code == 0, err
    assert set(pd.read_csv(csv)["attention_kernel"]) == {"cudnn"}
