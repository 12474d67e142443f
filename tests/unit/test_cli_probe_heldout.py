"""Regressions a held-out probe of the command line found (FP8, context and expert parallelism,
fabric levels, recommend's pins): each named after what broke, each failing before its fix."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from perfmodel.cli import main
from perfmodel.search import SearchRequest


def _run(*args: str) -> tuple[int, str, str]:
    """perfmodel ARGS in this process, as the `perfmodel` script runs it: (exit code, out, err)."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


def test_recommend_gpus_listed_twice_searches_each_count_once() -> None:
    # `--gpus 8,8` searched the 8-GPU plans twice: twice the plans counted, each plan ranked
    # twice in the table (the best plan and its copy one after the other)
    assert SearchRequest(gpus=(8, 8, 16, 8), global_batch=8).gpus == (8, 16)
    args = ("recommend", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--global-batch", "8",
            "--top", "3", "--json")
    code, once, _ = _run(*args, "--gpus", "8")
    code_twice, twice, _ = _run(*args, "--gpus", "8,8")
    assert code == code_twice == 0
    a, b = json.loads(once), json.loads(twice)
    assert b["enumerated"] == a["enumerated"]
    labels = [json.dumps(p["plan"], sort_keys=True) for p in b["plans"]]
    assert len(set(labels)) == len(labels)
