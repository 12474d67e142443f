"""The disk cache of compiled formulas (perfmodel.evaluate.cached): a module is built once and
imported after; another version's modules go once unused for two weeks, this version's stay."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

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
