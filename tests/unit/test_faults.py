"""Faults without a training job (issue 8): files written whole or not at all, concurrent appends
to the validation history, stale and held locks. The faults of real runs (Ctrl-C, SIGTERM, a
killed launcher or rank) are in tests/distributed/test_faults.py."""

from __future__ import annotations

import ast
import contextlib
import csv
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.errors import PerfmodelError
from perfmodel.files import file_lock, lock_path
from tests.conftest import PATIENCE_S, ROOT

REPORT = {"model": "tiny-gpt", "plan_label": "dp2", "status": "ok", "ranks": 2, "steps": 3}


def _append_rows(path: str, worker: int, rows: int) -> None:
    from validation.report import append_history

    for i in range(rows):
        append_history({**REPORT, "steps": worker * 1000 + i}, Path(path))


def test_concurrent_appends_to_the_history_lose_no_rows(tmp_path):
    history = tmp_path / "history.csv"
    workers, rows = 6, 15
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_rows, args=(str(history), w, rows)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=PATIENCE_S)  # their exit; the bound is for a hang
    assert [p.exitcode for p in procs] == [0] * workers
    with history.open() as f:
        got = list(csv.DictReader(f))
    assert sorted(int(r["steps"]) for r in got) == sorted(
        w * 1000 + i for w in range(workers) for i in range(rows))
    assert history.read_text().count("created,model") == 1  # one header
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*.tmp*"))


def test_a_history_of_something_else_is_refused_not_misaligned(tmp_path):
    from perfmodel.errors import DataError
    from validation.report import append_history

    other = tmp_path / "other.csv"
    other.write_text("name,score\nx,1\n")
    with pytest.raises(DataError, match="is not a history of this perfmodel"):
        append_history(REPORT, other)
    assert other.read_text() == "name,score\nx,1\n"


def test_a_lock_file_left_behind_is_not_stale(tmp_path):
    """The lock is the kernel's (flock), not the file's existence: a lock file a crashed run left,
    whatever it holds, does not block the next run."""
    target = tmp_path / "history.csv"
    lock_path(target).write_text("12345\nleft by a run that crashed\n")
    with file_lock(target, wait_s=0):
        assert lock_path(target).read_text().strip() == str(os.getpid())


def _hold(path: str, ready: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    with file_lock(Path(path), wait_s=0):
        ready.set()
        while True:  # until SIGKILL: a fixed sleep could end, and free the lock, mid-test
            time.sleep(3600)


@contextlib.contextmanager
def held_lock(target: Path) -> Iterator[int]:
    """Another process holds target's lock meanwhile (its pid is yielded); then it is killed
    with SIGKILL, releasing nothing itself."""
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(target), ready))
    holder.start()
    try:
        assert ready.wait(PATIENCE_S)  # returns when the lock is held; the bound is for a hang
        yield holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()  # SIGKILL: it exits


def test_a_held_lock_names_its_holder_and_is_freed_when_the_holder_dies(tmp_path):
    target = tmp_path / "cpu.json"
    with held_lock(target) as pid:
        with pytest.raises(PerfmodelError, match=f"in use by another process \\(pid {pid}"):
            with file_lock(target, wait_s=0.2):
                pass
    with file_lock(target, wait_s=5):
        pass


def test_calibrate_run_refuses_a_profile_another_run_is_writing(tmp_path):
    from tests.unit.test_bad_input import run_main

    target = tmp_path / "cpu.json"
    with held_lock(target) as pid:
        code, _, err = run_main(["calibrate", "run", "--quick", "--out", str(target)])
    assert code == 2
    assert err.strip() == (f"error: profile {target} (another calibrate run writes it) is in use "
                           f"by another process (pid {pid}, lock {lock_path(target)})")
    assert not target.exists()


def test_validation_refuses_a_run_directory_another_run_uses(tmp_path):
    from validation.run import RunSettings, run_job

    run_dir = tmp_path / "run"
    with file_lock(run_dir / "run", wait_s=0):
        with pytest.raises(PerfmodelError, match="run directory .* is in use"):
            run_job({}, run_dir, RunSettings(nprocs=2, timeout_s=5))
    assert not (run_dir / "config.json").exists()  # nothing was started


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_write_that_fails_leaves_the_old_file_whole(tmp_path, monkeypatch, failure):
    from perfmodel.errors import OutputError
    from perfmodel.files import write_atomic

    target = tmp_path / "report.json"
    write_atomic(target, '{"old": true}')

    def crash(*args, **kwargs):
        raise failure

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OutputError if isinstance(failure, OSError) else KeyboardInterrupt):
        write_atomic(target, '{"new": true, "half": ' + "x" * 10_000)
    monkeypatch.undo()
    assert target.read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temp file left


def test_a_profile_is_never_half_written(tmp_path, monkeypatch):
    """write_profile validates the document before it writes, and writes both files atomically."""
    from calibration.profile_io import provenance, write_profile

    out = tmp_path / "p.json"
    with pytest.raises(PerfmodelError, match="unknown field 'memry_bytes'"):
        write_profile(out, hardware={"base": "dgx-h100", "memry_bytes": 1}, fits={},
                      measurements=pd.DataFrame({"x": [1]}), provenance=provenance())
    assert not out.exists()


# Every file the tool writes goes through perfmodel.files.write_atomic (or is a log written as it
# grows). A new writer that opens its target directly, or a second atomic writer, fails here.
STREAMS = {  # (file, function): why writing in place is right there
    ("calibration/measure.py", "_write"): "measurements streamed as JSON lines; a cut last line "
                                        "is dropped by calibration.run.read_records",
    ("workload/launcher.py", "_start_rank"): "a rank's log, written by the rank as it runs",
    ("workload/launcher.py", "_start_fork_parent"): "the fork parent's log, written as it runs",
    ("benchmarks/fuzz_parsers.py", "check"): "a fuzzed input in a throwaway temporary directory",
    ("benchmarks/hostile_inputs.py", "inputs"): "hostile inputs in a throwaway temporary directory",
}
THE_WRITER = ("perfmodel/files.py", "atomic_file")  # write_atomic writes through it
# The emitted job (workload/job.py and the modules it imports) is copied to a cluster without
# perfmodel and imports only torch and the standard library: workload/job.py keeps its own
# temp-file-and-rename writer (write_json) for the files of its own run directory.
STANDALONE = {"workload/job.py"}


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def _writes_in_place(tree: ast.AST) -> list[tuple[str, int]]:
    """(function, line) of every call that writes a file (write_text, write_bytes, copyfile,
    to_csv/savefig to a path, open(..., 'w'/'a'/'x')) or renames one into place (os.replace,
    os.rename, mkstemp, NamedTemporaryFile): only the one atomic writer may."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node)
            func = node.func
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            writes = name in ("write_text", "write_bytes", "copyfile", "mkstemp",
                              "NamedTemporaryFile") or (owner == "os" and name in (
                                  "replace", "rename")) or (owner == "shutil" and name in (
                                      "copy", "copy2", "move"))
            if name in ("to_csv", "to_json", "savefig", "to_parquet"):  # to a path, not a buffer
                first = node.args[0] if node.args else None
                writes = first is not None and getattr(first, "id", "") not in ("buffer", "buf")
            if name in ("open", "fdopen"):
                modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                modes += [k.value.value for k in node.keywords
                          if k.arg == "mode" and isinstance(k.value, ast.Constant)]
                writes = any(set(str(m)) & set("wax") for m in modes)
            if writes:
                found.append((fn.name, node.lineno))
    return found


def test_every_file_the_tool_writes_is_written_by_the_one_atomic_writer():
    offenders = []
    for package in ("perfmodel", "workload", "calibration", "validation", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in STANDALONE:
                continue
            for fn, line in _writes_in_place(ast.parse(path.read_text())):
                if (rel, fn) not in STREAMS and (rel, fn) != THE_WRITER:
                    offenders.append(f"{rel}:{line} in {fn}()")
    assert offenders == []


def test_the_atomic_write_check_finds_a_direct_write():
    tree = ast.parse("def save(path, text):\n    path.write_text(text)\n")
    assert _writes_in_place(tree) == [("save", 2)]
    # a second temp-file-and-rename writer is a second writer: only perfmodel.files has one
    tree = ast.parse("import os\ndef save(path, text):\n    tmp = path.with_suffix('.tmp')\n"
                     "    tmp.write_text(text)\n    os.replace(tmp, path)\n")
    assert _writes_in_place(tree) == [("save", 4), ("save", 5)]
    tree = ast.parse("def save(frame, path):\n    buffer = frame.to_csv(index=False)\n")
    assert _writes_in_place(tree) == []
