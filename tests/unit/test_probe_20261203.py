"""Regressions from the 2026-12-03 probe of the CLI: options and fields that were taken silently
(a pinned collective algorithm where it cannot run, Qwen3-Next's linear attention, quoted
numbers in other scripts, MoE-only fields on a dense model), and the exit codes of a standard
output or error that is closed or full."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel import Plan, PlanError, SpecError
from perfmodel.cli import main
from perfmodel.collective import pinned_algorithm_notes
from perfmodel.configs.emit import header
from perfmodel.predict import resolve_inputs
from perfmodel.specs.loading import number
from perfmodel.specs.model import load_model
from perfmodel.specs.profile import load_profile
from perfmodel.specs.resolve import resolve_hardware
from tests.conftest import ROOT

HF = ROOT / "tests" / "data" / "hf"


def _exit(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    return int(ended.value.code or 0), capsys.readouterr().err


def _notes(algorithm: str, **plan) -> list[str]:
    hardware = resolve_hardware("dgx-h100", None, algorithm)
    model, hardware, plan = resolve_inputs("llama3-8b", hardware, plan)
    return pinned_algorithm_notes(model, hardware, plan)


def test_a_pinned_algorithm_says_which_groups_it_does_not_run():
    # NVLS reduces inside an NVSwitch node: a data-parallel group over 16 nodes takes NCCL's
    # own choice
    assert _notes("nvls", gpus=128, dp=128, global_batch=128) == [
        "collective_algorithm nvls does not run the all_reduce of the dp group (128 ranks, "
        "over nodes, several ranks each): it takes the library's choice (nccl: ring or tree)"]
    assert _notes("nvls", gpus=8, tp=8, global_batch=8) == []  # tp inside the node: NVLS
    # hierarchical needs several ranks in each of several nodes: tp 8 in one node and dp 2 one
    # rank a node take ring
    notes = _notes("hierarchical", gpus=16, tp=8, dp=2, global_batch=2)
    assert [n.split(" of the ")[1].split(" (")[0] for n in notes] == ["tp group", "dp group"]
    assert all(n.endswith("(nccl: ring)") for n in notes)
    # NCCL's tree is an all-reduce's: ZeRO 3's gathers and reduce-scatters run rings
    zero3 = _notes("tree", gpus=16, tp=8, dp=2, global_batch=2, zero=3)
    assert {n.split(" of the ")[0].split()[-1] for n in zero3} == {"all_gather",
                                                                   "reduce_scatter"}
    assert _notes("auto", gpus=16, tp=8, dp=2, global_batch=2) == []


def test_predict_prints_the_pinned_algorithms_note(capsys):
    code, err = _exit(capsys, "predict", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                      "--gpus", "128", "--global-batch", "128", "--collective-algorithm", "nvls",
                      "--json")
    assert code == 0
    assert "note: collective_algorithm nvls does not run the all_reduce of the dp group" in err


def _hf(tmp_path, name: str, **changes) -> str:
    data = json.loads((HF / name / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_qwen3_next_style_linear_attention_layers_are_refused(tmp_path):
    path = _hf(tmp_path, "qwen3-8b", layer_types=["linear_attention"] * 36)
    with pytest.raises(SpecError, match="layer_types linear_attention is not modelled"):
        load_model(path, seq_len=4096)


def test_gemma_without_its_kv_heads_is_refused_not_guessed(tmp_path):
    # transformers' GemmaConfig fills num_key_value_heads with 16, not the query heads
    path = _hf(tmp_path, "gemma-2b", num_key_value_heads=None)
    with pytest.raises(SpecError, match="num_key_value_heads', which its configuration class "
                                        "sets to 16"):
        load_model(path, seq_len=4096)


@pytest.mark.parametrize("text", ["１２", "٤", "4_0", "0x10", "nan", "1e"])
def test_a_quoted_number_is_plain_decimal_or_refused(text):
    with pytest.raises(SpecError, match="must be a number"):
        number(text, "layers")


def test_yamls_string_floats_still_read():
    # PyYAML reads 1e15 as a string (YAML 1.1 wants 1.0e+15)
    assert number("1e15", "peak") == 1e15 and number(" 4 ", "layers", integer=True) == 4


def test_active_count_on_a_dense_model_is_refused(tmp_path):
    spec = tmp_path / "m.yaml"
    spec.write_text("layers: 4\nhidden: 256\nheads: 8\nseq_len: 128\nvocab: 50000\n"
                    "active_count: no_embedding\n")
    with pytest.raises(SpecError, match="active_count applies to a mixture-of-experts"):
        load_model(spec)


def test_a_profile_of_version_true_is_refused(tmp_path):
    data = json.loads((ROOT / "docs" / "examples" / "cpu.json").read_text())
    data["version"] = True
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="profile version True is not supported"):
        load_profile(path)


def test_the_emitted_header_names_the_context_and_expert_degrees():
    model = load_model("mixtral-8x7b")
    plan = Plan(gpus=64, dp=8, pp=4, cp=2, ep=8, micro_batch=1, global_batch=64)
    hardware = resolve_hardware("dgx-h100", None)
    line = header(model, hardware, plan, 1.0)[1]
    assert line.startswith("Plan: dp 8, tp 1, pp 4, cp 2, ep 8, micro-batch 1,")


def test_a_plans_file_with_a_header_alone_is_refused(tmp_path, capsys):
    path = tmp_path / "plans.csv"
    path.write_text("gpus,tp,global_batch\n")
    code, err = _exit(capsys, "predict", "--batch", str(path), "--model", "llama3-8b",
                      "--hardware", "dgx-h100")
    assert code == 5 and "has a header and no rows" in err


def test_a_spec_on_a_layer_graph_preset_says_so(tmp_path, capsys):
    spec = tmp_path / "b.yaml"
    spec.write_text("base: vgg16\nlayers: 2\n")
    code, err = _exit(capsys, "predict", "--model", str(spec), "--hardware", "dgx-h100")
    assert code == 3 and "is a layer graph (CNN/MLP) preset" in err


def test_an_error_with_a_newline_in_the_value_stays_one_line(capsys):
    code, err = _exit(capsys, "predict", "--model", "llama3-8b\nfoo", "--hardware", "dgx-h100")
    assert code == 3 and err.count("\n") == 1 and "'llama3-8b\\nfoo'" in err


def _shell(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", f"{sys.executable} -m perfmodel {command}"],
                          capture_output=True, text=True, timeout=120)


NO_DEV_FULL = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")


@NO_DEV_FULL
def test_a_closed_or_full_standard_output_exits_as_an_output_error():
    closed = _shell("presets >&-")
    assert closed.returncode == 7 and "standard output is closed" in closed.stderr
    assert "Traceback" not in closed.stderr
    full = _shell("presets > /dev/full")
    assert full.returncode == 7 and "No space left on device" in full.stderr


@NO_DEV_FULL
def test_a_full_or_closed_standard_error_keeps_the_errors_exit_code():
    assert _shell("predict --model nope --hardware dgx-h100 2>/dev/full").returncode == 3
    assert _shell("predict --model nope --hardware dgx-h100 2>&-").returncode == 3


def test_defer_grad_sync_with_one_micro_batch_is_refused():
    with pytest.raises(PlanError, match="the step has one"):
        Plan(gpus=8, dp=8, zero=3, micro_batch=1, global_batch=8, defer_grad_sync=True)


def test_seq_len_on_a_learned_position_preset_says_its_table_grows(capsys):
    code, err = _exit(capsys, "predict", "--model", "gpt2-small", "--hardware", "dgx-h100",
                      "--seq-len", "4096", "--json")
    # 3,072 more rows of 768: GPT-2 small's own table holds 1,024
    assert code == 0 and ("note: gpt2-small has learned positions: --seq-len 4096 sizes its "
                          "position table to 4096 rows (its own: 1024), +2.36M parameters") in err
    code, err = _exit(capsys, "predict", "--model", "llama3-8b", "--hardware", "dgx-h100",
                      "--seq-len", "4096", "--json")
    assert code == 0 and "learned positions" not in err  # RoPE: no table


def test_a_hardware_spec_given_as_a_model_or_its_base_is_named(tmp_path):
    hardware = tmp_path / "h.yaml"
    hardware.write_text("base: dgx-h100\nmemory_bytes: 96e9\n")
    model = tmp_path / "m.yaml"
    model.write_text("base: h.yaml\nlayers: 2\n")
    for path in (hardware, model):
        with pytest.raises(SpecError, match="a hardware spec \\(memory_bytes\\), not a model"):
            load_model(path)


def test_a_model_spec_with_a_stray_model_type_is_not_read_as_a_hugging_face_config(tmp_path):
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"layers": 4, "hidden": 256, "heads": 8, "seq_len": 128,
                                "vocab": 1000, "model_type": "llama"}))
    with pytest.raises(SpecError, match="unknown field 'model_type' in a perfmodel model spec"):
        load_model(spec)
