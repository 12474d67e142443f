"""Megatron-LM launch scripts read as bash runs them (a probe of 2026-12-07): a `#` inside a word
is a character of it, a variable set where perfmodel cannot tell whether or how (after `&&` or
`||`, by `((...))`, `let` or `read`) is refused by name, an array's element assignment is
applied, and a function's definition is skipped until it is called."""

from pathlib import Path

import pytest

from perfmodel.cli import main
from perfmodel.configs import read_config

MODEL = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
         "--max-position-embeddings 4096 --vocab-size 50304 --micro-batch-size 1 "
         "--global-batch-size 128 --bf16")
LAUNCH = f"torchrun --nproc-per-node 8 pretrain_gpt.py {MODEL}"


def _write(tmp_path: Path, text: str, name: str = "run.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _refused(capsys, path: Path) -> str:
    """The one line `perfmodel predict --from-config` refuses the script with (exit 3)."""
    with pytest.raises(SystemExit) as ended:
        main(["predict", "--from-config", str(path), "--hardware", "dgx-h100"])
    err = capsys.readouterr().err
    assert ended.value.code == 3 and err.count("\n") == 1, err
    return err


# --- 1. a `#` inside a word starts no comment -----------------------------------------------


def test_a_hash_inside_a_word_of_a_launch_script_is_a_character_of_it(tmp_path):
    job = read_config(_write(tmp_path, f"""#!/bin/bash
CKPT=/ckpt/run1  # a comment
TWO=ab
{LAUNCH} \\
    --save /ckpt/${{CKPT##*/}}/ck#1 --pipeline-model-parallel-size ${{#TWO}} \\
    --tensor-model-parallel-size 4 # --tensor-model-parallel-size 8
"""))
    assert job.plan["tp"] == 4 and job.plan["pp"] == 2 and job.plan["dtype"] == "bf16"
    assert [(s.key, s.value) for s in job.ignored] == [("--save", "/ckpt/run1/ck#1")]


def test_a_hash_inside_a_word_of_an_argument_file_is_a_character_of_it(tmp_path):
    job = read_config(_write(tmp_path, f"{MODEL} --save /ck#1 --tensor-model-parallel-size 4 "
                                       "# --tensor-model-parallel-size 8\n", "args.txt"))
    assert job.plan["tp"] == 4
    assert [(s.key, s.value) for s in job.ignored] == [("--save", "/ck#1")]


# --- 2. an assignment that may not run ------------------------------------------------------


@pytest.mark.parametrize("condition, operator", [
    ('[ -n "$USE_TP4" ] && TP=4', "&&"),
    ("[ -z \"$USE_TP2\" ] || TP=4", "||"),
    ('[ -n "$USE_TP4" ] && export TP=4', "&&"),
    ('[ -n "$USE_TP4" ] &&\n    TP=4', "&&"),  # the list goes on at the next line
])
def test_an_assignment_after_and_or_or_is_refused_by_name(capsys, tmp_path, condition, operator):
    err = _refused(capsys, _write(tmp_path, f"TP=2\n{condition}\n{LAUNCH} "
                                            "--tensor-model-parallel-size $TP\n"))
    assert f"--tensor-model-parallel-size $TP cannot be read: set after {operator} (line 2)" \
        in err


def test_an_assignment_after_a_conditional_one_is_read(tmp_path):
    job = read_config(_write(tmp_path, f'TP=2\n[ -n "$USE_TP4" ] && TP=4\nTP=8\nTP=4 && :\n'
                                       f"{LAUNCH} --tensor-model-parallel-size $TP\n"))
    assert job.plan["tp"] == 4


# --- 3. arithmetic commands and read ---------------------------------------------------------


@pytest.mark.parametrize("command, why", [
    ("((TP*=2))", "set by ((TP*=2)) (line 2), arithmetic perfmodel does not evaluate"),
    ("(( TP++ ))", "set by (( TP++ )) (line 2), arithmetic perfmodel does not evaluate"),
    ("let TP=TP*2", "set by let TP=TP*2 (line 2), arithmetic perfmodel does not evaluate"),
    (": $(( TP *= 2 ))", "set by $(( TP *= 2 )) (line 2), arithmetic perfmodel does not"),
    ("read TP < tpfile", "set by read TP (line 2), from what perfmodel does not read"),
    ("read -r -p prompt TP", "set by read -r -p prompt TP (line 2)"),
])
def test_a_variable_an_arithmetic_command_or_read_sets_is_refused_by_name(capsys, tmp_path,
                                                                          command, why):
    err = _refused(capsys, _write(tmp_path, f"TP=2\n{command}\n{LAUNCH} "
                                            "--tensor-model-parallel-size $TP\n"))
    assert f"--tensor-model-parallel-size $TP cannot be read: {why}" in err


# --- 4. an array's element assignment --------------------------------------------------------


def test_an_array_element_assignment_is_applied_as_bash_applies_it(tmp_path):
    job = read_config(_write(tmp_path, """MODEL_ARGS=(--num-layers 32 --hidden-size 4096)
MODEL_ARGS[1]=16
PAR=(--tensor-model-parallel-size 8)
PAR[-1]=2
PAR[${#PAR[@]}]=--pipeline-model-parallel-size
PAR[3]=4
torchrun --nproc-per-node 8 pretrain_gpt.py ${MODEL_ARGS[@]} "${PAR[@]}" \\
    --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 \\
    --vocab-size 50304 --micro-batch-size 1 --global-batch-size 128 --bf16
"""))
    assert job.model["layers"] == 16
    assert (job.plan["tp"], job.plan["pp"]) == (2, 4)


def test_an_array_element_past_the_end_is_refused_by_name(capsys, tmp_path):
    err = _refused(capsys, _write(tmp_path, f"PAR=(--tensor-model-parallel-size)\nPAR[5]=2\n"
                                            f"{LAUNCH} ${{PAR[@]}}\n"))
    assert "PAR[5] set past the array's end (line 2)" in err


# --- 5. function definitions -----------------------------------------------------------------


@pytest.mark.parametrize("definition", [
    'log() { echo "$@"; }',
    'log(){ echo "$@";}',
    "log() {\n    echo \"$@\"\n    TP=8\n}",
    "function log {\n    if [ -n \"$1\" ]; then echo \"$1\"; fi\n}",
    "log()\n{\n    TP=8\n}",
])
def test_a_function_definition_is_skipped_until_it_is_called(tmp_path, definition):
    job = read_config(_write(tmp_path, f"TP=2\n{definition}\n{LAUNCH} "
                                       "--tensor-model-parallel-size $TP\n"))
    assert job.plan["tp"] == 2


def test_a_variable_a_called_function_sets_is_refused_by_name(capsys, tmp_path):
    err = _refused(capsys, _write(tmp_path, "TP=2\nsetup() {\n    TP=4\n}\nsetup\n"
                                            f"{LAUNCH} --tensor-model-parallel-size $TP\n"))
    assert ("--tensor-model-parallel-size $TP cannot be read: set inside function setup (line "
            "2), called at line 5") in err


def test_a_launch_inside_a_called_function_is_refused(capsys, tmp_path):
    err = _refused(capsys, _write(tmp_path, f"train() {{\n    {LAUNCH} "
                                            "--tensor-model-parallel-size 2\n}\ntrain\n"))
    assert "the training script runs inside function train (line 1), called at line 4" in err


def test_a_launch_inside_a_function_never_called_does_not_run(capsys, tmp_path):
    job = read_config(_write(tmp_path, f"old() {{\n    {LAUNCH} --tensor-model-parallel-size "
                                       f"8\n}}\n{LAUNCH} --tensor-model-parallel-size 2\n"))
    assert job.plan["tp"] == 2
    err = _refused(capsys, _write(tmp_path, f"old() {{\n    {LAUNCH}\n}}\necho done\n"))
    assert "runs only inside function old (line 1), which the script does not call" in err
