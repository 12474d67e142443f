"""The disk cache of compiled formulas (perfmodel.evaluate.cached): a module is built once and
imported after; another version's modules go once unused for two weeks, this version's stay."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from perfmodel import evaluate


def _module(root: Path, name: str, age_s: float, bytecode: bool = True) -> Path:
    path = root / f"{name}.py"
    path.write_text("VALUE = 1\n")
    if bytecode:
        evaluate._compile_bytecode(path)
    then = time.time() - age_s
    for p in (path, Path(importlib.util.cache_from_source(str(path)))):
        if p.exists():
            os.utime(p, (then, then))
    return path


def test_a_build_removes_other_versions_unused_for_two_weeks(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PERFMODEL_NO_CACHE", raising=False)
    ours = f"{evaluate._source_hash()}-"
    old_other = _module(tmp_path, "0123456789abcdef-old", 30 * 86400)
    recent_other = _module(tmp_path, "0123456789abcdef-recent", 86400)
    old_ours = _module(tmp_path, f"{ours}old", 30 * 86400)
    # used recently: its bytecode touched by an import, the source as old as the other's
    used_other = _module(tmp_path, "fedcba9876543210-used", 30 * 86400)
    os.utime(importlib.util.cache_from_source(str(used_other)))
    stranger = tmp_path / "notes.txt"
    stranger.write_text("not ours")
    os.utime(stranger, (0, 0))

    namespace = evaluate.cached("fresh", lambda: "ANSWER = 42\n")
    assert namespace["ANSWER"] == 42
    assert (tmp_path / f"{ours}fresh.py").is_file()
    assert not old_other.exists()
    assert not Path(importlib.util.cache_from_source(str(old_other))).exists()
    assert recent_other.exists() and old_ours.exists() and used_other.exists()
    assert stranger.exists()


def test_importing_a_cached_module_marks_it_used_without_recompiling(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PERFMODEL_NO_CACHE", raising=False)
    path = _module(tmp_path, f"{evaluate._source_hash()}-kept", 30 * 86400)
    bytecode = Path(importlib.util.cache_from_source(str(path)))
    before = bytecode.read_bytes()
    assert evaluate.cached("kept", lambda: "raise AssertionError('rebuilt')\n")["VALUE"] == 1
    assert time.time() - bytecode.stat().st_mtime < 3600
    assert time.time() - path.stat().st_mtime > 29 * 86400  # the source untouched
    assert bytecode.read_bytes() == before  # still valid: not compiled again


# --- modules built ahead in a child process (evaluate.build_ahead) ---------------------------

@pytest.fixture()
def ahead(monkeypatch, tmp_path):
    """A fresh cache where children may be forked; none left behind, whatever the test did."""
    if not evaluate._can_fork():
        pytest.skip("no child process here (one CPU, another thread, or not Linux)")
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PERFMODEL_NO_CACHE", raising=False)
    monkeypatch.delenv("PERFMODEL_NO_BUILD_AHEAD", raising=False)
    yield tmp_path
    evaluate._stop_ahead()


def _never() -> str:
    raise AssertionError("built here, not read from the child's")


def test_modules_built_ahead_are_read_from_the_cache_in_any_order(ahead):
    tmp_path = ahead
    evaluate.build_ahead([("first", lambda: "ANSWER = 1\n"), ("second", lambda: "ANSWER = 2\n")])
    assert evaluate.cached("second", _never)["ANSWER"] == 2
    assert evaluate.cached("first", _never)["ANSWER"] == 1
    ours = evaluate._source_hash()
    for name in ("first", "second"):  # filed with their bytecode, as a build here files them
        path = tmp_path / f"{ours}-{name}.py"
        assert Path(importlib.util.cache_from_source(str(path))).is_file()
    assert not evaluate._AHEAD and not evaluate._DONE  # the child waited for and its pipe closed


def test_what_the_child_fails_to_build_is_built_here(ahead):
    evaluate.build_ahead([("fine", lambda: "ANSWER = 3\n"), ("broken", lambda: str(1 / 0)),
                          ("after", lambda: "ANSWER = 5\n")])
    assert evaluate.cached("broken", lambda: "ANSWER = 4\n")["ANSWER"] == 4
    assert evaluate.cached("fine", _never)["ANSWER"] == 3
    # the child stopped at the broken one: what came after it is built here
    assert evaluate.cached("after", lambda: "ANSWER = 6\n")["ANSWER"] == 6
    assert not evaluate._AHEAD and not evaluate._DONE


def test_a_cached_module_is_not_built_ahead_again(ahead, monkeypatch):
    assert evaluate.cached("there", lambda: "ANSWER = 7\n")["ANSWER"] == 7
    evaluate.build_ahead([("there", _never)])
    assert not evaluate._AHEAD  # no child for a module the cache holds
    monkeypatch.setenv("PERFMODEL_NO_BUILD_AHEAD", "1")
    evaluate.build_ahead([("refused", _never)])
    assert not evaluate._AHEAD


def test_a_module_under_way_for_another_cache_directory_is_built_here(ahead, monkeypatch):
    evaluate.build_ahead([("elsewhere", lambda: "ANSWER = 8\n")])
    other = ahead / "other"
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(other))
    assert evaluate.cached("elsewhere", lambda: "ANSWER = 9\n")["ANSWER"] == 9
    assert (other / f"{evaluate._source_hash()}-elsewhere.py").is_file()


def test_a_child_never_waited_for_is_stopped_at_exit_and_holds_no_output(tmp_path):
    """A process that exits while its child builds a module it never asked for: the child is
    stopped (its half-written module removed) and does not hold the output pipe that the
    process's reader waits on to close."""
    import subprocess
    import sys

    script = (
        "import time\n"
        "from perfmodel import evaluate\n"
        "if not evaluate._can_fork():\n"
        "    print('no fork'); raise SystemExit\n"
        "evaluate.build_ahead([('forever', lambda: time.sleep(3600) or '')])\n"
        "print(next(iter(evaluate._AHEAD.values()))[0])\n")
    env = {**os.environ, "PERFMODEL_CACHE_DIR": str(tmp_path)}
    env.pop("PERFMODEL_NO_CACHE", None)
    env.pop("PERFMODEL_NO_BUILD_AHEAD", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    if out == "no fork":
        pytest.skip("no child process here (one CPU, or not Linux)")
    with pytest.raises(ProcessLookupError):  # stopped and waited for by its parent
        os.kill(int(out), 0)
    assert not list(tmp_path.glob("*forever*")) and not list(tmp_path.glob(".*.tmp"))


def test_a_cold_pruned_search_builds_its_other_modules_in_a_child(tmp_path):
    """A new process with an empty cache (one thread, as the CLI runs): it builds the grid
    bound's module itself, the child the per-plan bound's, the search's, the bounds' and the
    prediction's, and the answer is the one of a process that builds them all itself."""
    import json
    import subprocess
    import sys

    script = (
        "import json, os, sys\n"
        "import perfmodel.staged as st\n"
        "from perfmodel import load_hardware, load_model\n"
        "from perfmodel.recommend import recommend\n"
        "from perfmodel.search import SearchRequest\n"
        "built, build = [], st._build\n"
        "def spy(family, which, groups):\n"
        "    built.append(which)\n"
        "    return build(family, which, groups)\n"
        "st._build = spy\n"
        "r = recommend(load_model('llama3-8b'), load_hardware('dgx-h100'),\n"
        "              SearchRequest(gpus=(64,), global_batch=512), prune=True)\n"
        "print(json.dumps({'built': built, 'skipped': r.result.skipped,\n"
        "                  'best': [p.to_dict() for p in r.result.best_plans()],\n"
        "                  'steps': [b.step_time_s for b in r.top]}))\n")
    answers = {}
    for ahead in (True, False):
        env = {**os.environ, "PERFMODEL_CACHE_DIR": str(tmp_path / str(ahead))}
        env.pop("PERFMODEL_NO_CACHE", None)
        if ahead:
            env.pop("PERFMODEL_NO_BUILD_AHEAD", None)
        else:
            env["PERFMODEL_NO_BUILD_AHEAD"] = "1"
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True).stdout
        answers[ahead] = json.loads(out)
    assert answers[False]["skipped"] > 0  # pruned: the grid bound's module is built first
    lower = [w for w in answers[False]["built"] if w == "lower_grid"]  # one a layout family
    assert lower and set(answers[False]["built"]) == {"lower_grid", "lower", "bounds", "memory",
                                                      "search"}
    if len(os.sched_getaffinity(0)) > 1:
        assert answers[True]["built"] == lower
    assert answers[True]["best"] == answers[False]["best"]
    assert answers[True]["steps"] == answers[False]["steps"]
    # every module the search read (the child also builds each layout's prediction module)
    modules = {p.name for p in (tmp_path / "True").glob("*.py")}
    assert modules >= {p.name for p in (tmp_path / "False").glob("*.py")}
