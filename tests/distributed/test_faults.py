"""Killing runs mid-way (issue 8): a launcher killed with SIGKILL (no chance to clean up) leaves
no rank behind, and a killed rank ends `perfmodel validate` with one line naming it. Ctrl-C and
SIGTERM are in test_validation_e2e.py and test_calibration_run.py. Each test is one launch of
two gloo ranks (5-15 s on the 2-core machine)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PATIENCE_S, ROOT, wait_for
from tests.distributed.test_calibration_run import alive, children

pytest.importorskip("torch")
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ENV = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
VALIDATE = ["validate", "--model", "tiny-gpt", "--hardware", "dgx-a100-80gb", "--dp", "2",
            "--steps", "1000", "--warmup", "0", "--timeout", "60"]


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "perfmodel", *args], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run_dir: Path, rank: int, proc: subprocess.Popen, steps: int = 1) -> None:
    def measured() -> bool:
        try:
            return len(json.loads((run_dir / f"rank{rank}.json").read_text())["steps"]) >= steps
        except (OSError, ValueError, KeyError):
            return False

    wait_for(measured, f"rank {rank} measures {steps} step(s)", proc=proc)


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)


def listening(pids: list[int]) -> set[str]:
    """The local addresses the processes listen on (TCP, from /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addr = bytes.fromhex(fields[1].split(":")[0])
                words = [addr[i:i + 4][::-1] for i in range(0, len(addr), 4)]  # host order
                out.add(socket.inet_ntop(socket.AF_INET if len(addr) == 4 else socket.AF_INET6,
                                         b"".join(words)))
    return out


def test_a_killed_validate_leaves_no_rank_running(tmp_path):
    """SIGKILL gives the launcher no chance to stop its ranks: they notice and exit themselves.
    While they run, they listen on loopback only (rendezvous store and gloo)."""
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, *VALIDATE, "--run-dir", str(run_dir), "--history",
                  str(tmp_path / "h.csv"))
    try:
        _wait_for_steps(run_dir, 1, proc)
        ranks = children(proc.pid)
        assert len(ranks) == 2
        addresses = listening(ranks)
        assert addresses and addresses <= {"127.0.0.1", "::1", "::ffff:127.0.0.1"}, addresses
        proc.kill()
        proc.wait()  # SIGKILL: it exits
        assert alive(ranks) == []
    finally:
        proc.kill()


def test_a_killed_rank_ends_validate_with_one_line_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    history = tmp_path / "h.csv"
    proc = _start(tmp_path, *VALIDATE, "--run-dir", str(run_dir), "--history", str(history))
    try:
        _wait_for_steps(run_dir, 1, proc)
        ranks = {_rank_of(pid): pid for pid in children(proc.pid)}
        os.kill(ranks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=PATIENCE_S)  # its exit; the bound is for a hang
    finally:
        proc.kill()
    assert proc.returncode == 6, err
    assert err.strip().splitlines() == [
        f"error: the job failed: rank 1: killed by signal 9 (SIGKILL) (report: "
        f"{run_dir / 'report.json'})"]
    assert alive(list(ranks.values())) == []
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "failed" and report["launch"]["failure"]["rank"] == 1
    assert ",failed," in history.read_text().splitlines()[1]


def test_a_killed_calibration_leaves_no_rank_and_no_profile(tmp_path):
    out = tmp_path / "cpu.json"
    records = tmp_path / f".{out.name}.records.jsonl"
    proc = _start(tmp_path, "calibrate", "run", "--quick", "--nprocs", "2", "--backend", "gloo",
                  "--out", str(out))
    try:
        wait_for(lambda: records.exists() and records.read_text().count('"kind": "gemm"') >= 2,
                 "two GEMMs measured", proc=proc)
        ranks = children(proc.pid)
        assert len(ranks) >= 2
        proc.kill()
        proc.wait()  # SIGKILL: it exits
        assert alive(ranks) == []
    finally:
        proc.kill()
    assert not out.exists()  # no half profile: it is written only once the fits are done
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_a_killed_launcher_of_forked_ranks_leaves_none_running(tmp_path):
    """workload.launcher's fork mode (the layouts): the fork parent and the ranks it forked exit
    when the launcher is killed with SIGKILL."""
    from workload.launcher import descendants

    out = tmp_path / "t.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workload.layouts", "--layout", "prpc", "--plan",
         '{"pr": 2, "pc": 1}', "--dims", '{"model": "mlp", "batch": 8, "widths": [16, 32, 8]}',
         "--steps", "1000000", "--warmup", "0", "--json", str(out), "--nprocs", "2"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the fork parent and the two ranks it forked
        started = wait_for(lambda: len(descendants(proc.pid)) >= 3 and descendants(proc.pid),
                           "the fork parent forks two ranks", proc=proc)
        proc.kill()
        proc.wait()  # SIGKILL: it exits
        assert alive(started) == []
    finally:
        proc.kill()
