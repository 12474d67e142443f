"""recommend's explanation of what makes the best plan win (perfmodel.recommend.parallelism_wins):
the same search without the axis, and the forked child that runs those searches beside the main
one for a mixture of experts (_WithoutAhead) answering exactly what this process would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from perfmodel import load_hardware, load_model
from perfmodel.recommend import best_without, recommend
from perfmodel.search import SearchRequest
from tests.conftest import PATIENCE_S, ROOT

MOE = ("qwen3-30b-a3b", "dgx-h100")  # 16 GPUs: its best plan spreads the experts (ep 8)
ARGS = ["recommend", "--model", MOE[0], "--hardware", MOE[1], "--gpus", "16",
        "--global-batch", "64", "--json"]


def test_expert_parallelism_wins_against_the_search_without_it(monkeypatch):
    monkeypatch.setenv("PERFMODEL_NO_BUILD_AHEAD", "1")  # no child: this process searches
    model, hw = load_model(MOE[0]), load_hardware(MOE[1])
    req = SearchRequest(gpus=(16,), global_batch=64)
    rec = recommend(model, hw, req, top=1, prune=True)
    best = rec.top[0]
    wins = {w["axis"]: w for w in rec.explanation["parallelism"]}
    assert best.plan.ep > 1 and wins["ep"]["degree"] == best.plan.ep
    alt = best_without(model, hw, rec.result.request, "ep")
    assert alt is not None and wins["ep"]["best_without"] == alt["plan"]
    assert wins["ep"]["objective_without"] == alt["objective"] > best.step_time_s
    assert f"(ep={best.plan.ep}) makes the best plan win" in wins["ep"]["note"]


def _run(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "perfmodel", *ARGS], capture_output=True,
                          text=True, timeout=PATIENCE_S,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    out.pop("search_time_s")
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="the child is forked on Linux with a second CPU only")
def test_the_forked_searches_answer_as_this_process_would():
    # a new process (one thread: the child may be forked), with and without the child
    forked = _run({})
    serial = _run({"PERFMODEL_NO_BUILD_AHEAD": "1"})
    assert forked == serial and forked["explanation"]["parallelism"]
