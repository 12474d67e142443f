"""What a command says of its inputs (a learned position table resized by --seq-len, how a job
config was read) comes with its answer; where it refuses, the refusal is its one line."""
from pathlib import Path

import pytest

from perfmodel.cli import main

CONFIG = Path(__file__).parents[1] / "data" / "configs" / "megatron_llama3_8b.txt"
TABLE_NOTE = "note: gpt2-small has learned positions: --seq-len 4096"


def _exit(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    return int(ended.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ("predict", "--tp", "3"),  # 8 GPUs are no multiple of tp 3
    ("explain", "--tp", "3"),
    ("validate", "--tp", "3", "--dry-run"),
    ("predict", "--micro-batch", "0"),
])
def test_a_refusal_after_the_seq_len_note_is_one_line(capsys, command):
    code, err = _exit(capsys, command[0], "--model", "gpt2-small", "--hardware", "dgx-h100",
                      "--gpus", "8", "--seq-len", "4096", *command[1:])
    assert code in (2, 4)
    assert err.count("\n") == 1 and err.startswith("error: ")


@pytest.mark.parametrize("command", ["predict", "explain"])
def test_the_seq_len_note_comes_with_an_answer(capsys, command):
    code, err = _exit(capsys, command, "--model", "gpt2-small", "--hardware", "dgx-h100",
                      "--gpus", "8", "--seq-len", "4096")
    assert code == 0 and err.count(TABLE_NOTE) == 1


def test_recommend_says_the_note_once_it_has_a_plan(capsys):
    code, err = _exit(capsys, "recommend", "--model", "gpt2-small", "--hardware", "dgx-h100",
                      "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--json")
    assert code == 0 and err.count(TABLE_NOTE) == 1
    code, err = _exit(capsys, "recommend", "--model", "gpt2-small", "--hardware", "dgx-h100",
                      "--gpus", "8", "--global-batch", "64", "--seq-len", "4096", "--tp", "3")
    assert code == 4 and TABLE_NOTE not in err


def test_a_config_read_is_reported_with_the_answer_not_before_a_refusal(capsys):
    # the config's global batch, 128, is no multiple of dp 12 / tp 2 ... = 6
    code, err = _exit(capsys, "predict", "--from-config", str(CONFIG), "--hardware", "dgx-h100",
                      "--gpus", "12")
    assert code == 4 and err.count("\n") == 1 and err.startswith("error: global_batch")
    code, err = _exit(capsys, "predict", "--from-config", str(CONFIG), "--hardware", "dgx-h100",
                      "--gpus", "8", "--json")
    assert code == 0 and f"read megatron config {CONFIG}:" in err
    assert "--num-layers 32: layers 32" in err
