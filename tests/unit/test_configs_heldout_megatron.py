"""Megatron-LM and Megatron-DeepSpeed scripts a reviewer ran through `predict --from-config`
(NVIDIA/Megatron-LM at d98e8a64dd, microsoft/Megatron-DeepSpeed at f4157bea69, bigscience-workshop/
bigscience at 9e64edec2a): each test is named after what the reader got wrong, and holds the
smallest script that showed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.shell import launch_command
from perfmodel.errors import SpecError

ARGS = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
        "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 ")


def write(tmp_path: Path, text: str, name: str = "run.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def plan_of(tmp_path: Path, text: str, name: str = "run.sh", **given: object
            ) -> tuple[object, object, dict]:
    job = read_config(write(tmp_path, text, name))
    spec, plan = resolve_plan(job, resolve_model(job, None, None), dict(given))
    return job, spec, plan


def launch(script: str):
    return launch_command(script, "s.sh", lambda w: w.endswith("pretrain_gpt.py"))


# --- the shell subset ---------------------------------------------------------------------------


@pytest.mark.parametrize("assignments, value", [
    ("GBS=16\nGBS=$(( GBS * 2 ))\n", "32"),  # a bare name, spaces inside
    ("A=4\nB=8\nGBS=$(($A * $B))\n", "32"),
    ("GPN=8\nMICRO_BATCH=2\nNODES=2\nGBS=$(( ${GPN} * ${MICRO_BATCH} * ${NODES} ))\n", "32"),
    ("GBS=$(( 2 * (4 + 12) ))\n", "32"),
    ("GBS=$(( -7 / 2 + 35 ))\n", "32"),  # bash divides towards zero: -3
    ("GBS=$(( -7 % 2 + 33 ))\n", "32"),  # and its remainder takes the dividend's sign: -1
    ("E='2*2'\nGBS=$(( E * 8 ))\n", "32"),  # a variable's value is itself evaluated
], ids=["bare name", "$A * $B", "${A} * ${B} * ${C}", "parentheses", "division", "remainder",
        "nested value"])
def test_shell_arithmetic_with_spaces_is_evaluated(assignments, value):
    found = launch(assignments + "torchrun pretrain_gpt.py --global-batch-size $GBS\n")
    assert found.args == ["--global-batch-size", value]


@pytest.mark.parametrize("assignments, needle", [
    ("GBS=$(( NODES * 8 ))\n", r"NODES: not set in the script"),
    ("GBS=$(( ${NODES} * 8 ))\n", r"\$\{NODES\}: not set in the script"),
    ("GBS=$(( 2 ** 5 ))\n", r"not '\*\*'"),
    ("if [ x ]; then\n  N=4\nfi\nGBS=$(( N * 8 ))\n", r"N: set inside an if/for/while/case"),
], ids=["bare name unset", "${NAME} unset", "power", "set under if"])
def test_shell_arithmetic_perfmodel_cannot_evaluate_is_refused_by_name(tmp_path, assignments,
                                                                        needle):
    with pytest.raises(SpecError, match=r"--global-batch-size \$\(\(.*\)\) cannot be read: "
                                        r"arithmetic perfmodel cannot evaluate.*" + needle):
        read_config(write(tmp_path, assignments + "torchrun pretrain_gpt.py " + ARGS
                          + "--global-batch-size $GBS\n"))
