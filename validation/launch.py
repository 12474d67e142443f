"""Launch the job's ranks on this machine, watch them, and stop them all cleanly.

The ranks are started directly (the environment torchrun would set: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) in one new process group (rank 0 leads it; the terminal's Ctrl-C reaches
only this launcher, which then kills the group), so that a timeout, a failed rank or Ctrl-C kills
the whole group and nothing is left behind. The rendezvous binds to 127.0.0.1 unless told otherwise;
a port already in use is replaced by a free one (and the run retried once if the store still fails
to bind).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import workload
from perfmodel.files import write_atomic

JOB_MODULE = "workload.job"  # python -P -m workload.job CONFIG.json (-P: not from the cwd)
# the directory the ranks import workload from: the one this process imported it from
WORKLOAD_ROOT = Path(workload.__file__).resolve().parents[1]
GRACE_S = 5.0  # after the first failure, how long the other ranks get to fail on their own


@dataclass
class RankStatus:
    rank: int
    pid: int
    exit_code: int | None = None
    state: str = "running"  # ok | failed | killed (still running at the end) | running
    error: str = ""
    log: str = ""
    exited_at: float = float("inf")


@dataclass
class LaunchResult:
    ok: bool
    ranks: list[RankStatus]
    elapsed_s: float
    port: int
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    results: dict[str, Any] | None = None
    rank_records: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM: rank_records hold what was measured

    def failed_rank(self) -> RankStatus | None:
        """The rank to blame. A rank whose error is its own comes first (in the order the ranks
        exited); ranks that only saw a peer vanish or a collective time out are victims; a rank
        still alive when its peers gave up is the one that hung."""
        failed = sorted((r for r in self.ranks if r.state == "failed"), key=lambda r: r.exited_at)
        killed = [r for r in self.ranks if r.state == "killed"]
        own = [r for r in failed if not _is_peer_error(r.error)]
        if own:
            return own[0]
        if killed:
            return killed[0]
        return failed[0] if failed else None


_PEER_ERRORS = (
    "connection closed by peer",
    "connection reset by peer",
    "timed out",
    "timeout",
    "broken pipe",
    "socket closed",
    "remote worker",
)


def _is_peer_error(error: str) -> bool:
    text = error.lower()
    return any(p in text for p in _PEER_ERRORS)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """All live descendants of pid, read from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(parts[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_group(pgid: int, procs: list[subprocess.Popen]) -> None:
    extra = [d for p in procs for d in descendants(p.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for pid in extra:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        if all(p.poll() is not None for p in procs):
            break
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(timeout=1)


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _error_line(log: str) -> str:
    for line in reversed(log.splitlines()):
        line = line.strip()
        if "Error" in line or "error" in line or "Exception" in line:
            return line.removeprefix("[rank0]: ").strip()[:300]
    return ""


def launch(
    config: dict[str, Any],
    out_dir: Path,
    nprocs: int,
    *,
    timeout_s: float = 300.0,
    master_addr: str = "127.0.0.1",
    port: int | None = None,
    python: str = sys.executable,
    on_start: Any = None,
) -> LaunchResult:
    """Run the job with nprocs ranks; return what happened to each rank and what it measured.

    Ctrl-C or SIGTERM (raised here as KeyboardInterrupt) stops every rank and returns what they
    measured so far with interrupted=True. One run at a time uses out_dir (a lock beside it).
    """
    from perfmodel.files import file_lock

    out_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir / "run", wait_s=0, what=f"run directory {out_dir}"):
        return _launch_locked(config, out_dir, nprocs, timeout_s, master_addr, port, python,
                              on_start)


def _launch_locked(
    config: dict[str, Any],
    out_dir: Path,
    nprocs: int,
    timeout_s: float,
    master_addr: str,
    port: int | None,
    python: str,
    on_start: Any,
) -> LaunchResult:
    notes: list[str] = []
    if port is None:
        port = free_port(master_addr)
    elif not port_is_free(port, master_addr):
        new = free_port(master_addr)
        notes.append(f"port {port} is in use: used {new}")
        port = new
    for attempt in range(2):
        result = _launch_once(
            config, out_dir, nprocs, timeout_s, master_addr, port, python, on_start
        )
        logs = " ".join(r.log for r in result.ranks)
        busy = "address already in use" in logs.lower()
        if result.ok or result.interrupted or not busy or attempt:
            break
        new = free_port(master_addr)
        notes.append(f"port {port} was taken during start-up: retried on {new}")
        port = new
    result.notes = notes + result.notes
    return result


def _launch_once(
    config: dict[str, Any],
    out_dir: Path,
    nprocs: int,
    timeout_s: float,
    master_addr: str,
    port: int,
    python: str,
    on_start: Any,
) -> LaunchResult:
    for stale in [*out_dir.glob("rank*.json"), out_dir / "results.json"]:
        stale.unlink(missing_ok=True)
    cfg_path = out_dir / "config.json"
    write_atomic(cfg_path, json.dumps({**config, "output_dir": str(out_dir)}, indent=1),
                 what="job config")
    threads = max(1, (os.cpu_count() or 1) // nprocs)
    env = {
        **os.environ,
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        # the ranks exit if this launcher dies without stopping them (e.g. SIGKILL)
        "PERFMODEL_PARENT_PID": str(os.getpid()),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(WORKLOAD_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    if master_addr in ("127.0.0.1", "localhost", "::1"):  # gloo's sockets on loopback too
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs: list[subprocess.Popen] = []
    statuses: list[RankStatus] = []
    logs = [out_dir / f"rank{r}.log" for r in range(nprocs)]
    start = time.monotonic()
    pgid = 0
    interrupted = False
    try:
        for rank in range(nprocs):
            rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}
            with open(logs[rank], "wb") as log:
                kwargs: dict[str, Any] = {"process_group": 0 if rank == 0 else pgid}
                p = subprocess.Popen(
                    [python, "-P", "-m", JOB_MODULE, str(cfg_path)],
                    env=rank_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    **kwargs,
                )
            if rank == 0:
                pgid = p.pid
            procs.append(p)
            statuses.append(RankStatus(rank=rank, pid=p.pid))
        if on_start is not None:
            on_start([s.pid for s in statuses])
        reason = _watch(procs, statuses, start, timeout_s)
    except KeyboardInterrupt:
        interrupted = True
        reason = "interrupted (Ctrl-C or SIGTERM): every rank was stopped"
    finally:
        if pgid:
            _kill_group(pgid, procs)
    elapsed = time.monotonic() - start
    records = []
    for s, p in zip(statuses, procs, strict=True):
        if s.state == "running":
            s.state = "stopped" if interrupted else "killed"
        s.exit_code = p.returncode if s.exit_code is None else s.exit_code
        s.log = _tail(logs[s.rank])
        rec = _read_json(out_dir / f"rank{s.rank}.json")
        if rec is not None:
            records.append(rec)
            if rec.get("error"):
                s.error = rec["error"]
        if not s.error and s.state == "failed":
            s.error = _error_line(s.log) or f"exit code {s.exit_code}"
            if s.exit_code is not None and s.exit_code < 0:
                s.error = f"killed by signal {-s.exit_code} ({signal.Signals(-s.exit_code).name})"
        if s.state == "killed" and not s.error:
            s.error = "did not finish: still running when the run was stopped (hung?)"
        if s.state == "stopped" and not s.error:
            s.error = "stopped: the run was interrupted"
    results = _read_json(out_dir / "results.json")
    ok = all(s.state == "ok" for s in statuses) and results is not None
    return LaunchResult(
        ok=ok,
        ranks=statuses,
        elapsed_s=elapsed,
        port=port,
        reason=reason,
        results=results,
        rank_records=records,
        interrupted=interrupted,
    )


def _watch(
    procs: list[subprocess.Popen], statuses: list[RankStatus], start: float, timeout_s: float
) -> str:
    first_failure: float | None = None
    while True:
        for s, p in zip(statuses, procs, strict=True):
            code = p.poll()
            if code is not None and s.state == "running":
                s.exit_code = code
                s.exited_at = time.monotonic()
                s.state = "ok" if code == 0 else "failed"
                if code != 0 and first_failure is None:
                    first_failure = time.monotonic()
        if all(s.state != "running" for s in statuses):
            return "" if first_failure is None else "a rank failed"
        now = time.monotonic()
        if first_failure is not None and now - first_failure > GRACE_S:
            return "a rank failed; the others were stopped"
        if now - start > timeout_s:
            return f"timeout: the job did not finish within {timeout_s:g} s"
        time.sleep(0.1)
