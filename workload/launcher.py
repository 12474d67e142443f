"""The one launcher of local ranks: validation jobs, calibration sweeps and the layouts' runs.

`launch(module, args, nprocs, run_dir)` runs `python -P -m module args` on nprocs ranks of this
machine with the environment torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), watches them, and stops them all cleanly. Its guarantees, whoever calls it:

- one run at a time per run directory (a lock beside it, released however the run ends);
- the rendezvous is on loopback (127.0.0.1 unless told otherwise; gloo's sockets too), and the
  ranks bind their store themselves (workload.process.loopback_rendezvous); a port already in use
  is replaced by a free one, and the run retried once if the store still fails to bind;
- the ranks form one new process group: the terminal's Ctrl-C reaches only the launcher, and a
  timeout, a failed rank (after GRACE_S for the others to fail on their own), Ctrl-C or SIGTERM
  (raised here as KeyboardInterrupt) kills the whole group; the result says which rank to blame
  (LaunchResult.failed_rank) and, when interrupted, keeps what the ranks wrote so far;
- a rank never outlives the launcher: PERFMODEL_PARENT_PID names it, and every rank watches it
  (workload.process.watch_parent) and exits when it is gone, even after a SIGKILL;
- rank R's output goes to run_dir/rankR.log.

Two ways to start the ranks: one process each (the default), or, with fork=True, one parent
process that imports `preload` (torch: ~3 s of CPU per process, which 8 ranks on 2 cores would pay
8 times) and forks the ranks from it (python -m workload.launcher --fork; it reports each rank's
pid and exit to the launcher and exits with them).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

GRACE_S = 5.0  # after the first failure, how long the other ranks get to fail on their own
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# The directory the ranks import workload (and the caller's packages) from: the one this launcher
# was imported from, whatever the current directory holds (-P keeps the cwd off sys.path).
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RankStatus:
    rank: int
    pid: int = 0
    exit_code: int | None = None
    state: str = "running"  # ok | failed | killed (still running at the end) | stopped | running
    error: str = ""
    log: str = ""
    exited_at: float = float("inf")


@dataclass
class LaunchResult:
    ok: bool  # every rank exited with 0
    ranks: list[RankStatus]
    elapsed_s: float
    port: int
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False  # stopped by Ctrl-C or SIGTERM: what the ranks wrote is kept

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


def launch(
    module: str,
    args: Sequence[str],
    nprocs: int,
    run_dir: Path,
    *,
    timeout_s: float | None = 300.0,
    master_addr: str = "127.0.0.1",
    port: int | None = None,
    threads: int | None = None,
    env: Mapping[str, str] | None = None,
    world_size: int | None = None,
    fork: bool = False,
    preload: Sequence[str] = (),
    prepare: Callable[[], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
    on_poll: Callable[[], None] | None = None,
    python: str = sys.executable,
) -> LaunchResult:
    """Run `python -P -m module args` on nprocs local ranks; return what happened to each.

    timeout_s: the whole run's limit (None: none). threads: OMP_NUM_THREADS per rank (default:
    the CPUs shared out). env: more environment. world_size: larger than nprocs only for tests of
    a rendezvous that never completes. fork, preload: see the module docstring. prepare: called
    under the run directory's lock before each start (to write the ranks' inputs). on_start: the
    ranks' pids once all started. on_poll: called while the ranks run (every 0.1 s).
    """
    from perfmodel.files import file_lock  # lazily: the fork parent (__main__) needs none of it

    run_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(run_dir / "run", wait_s=0, what=f"run directory {run_dir}"):
        notes: list[str] = []
        if port is None:
            port = free_port(master_addr)
        elif not port_is_free(port, master_addr):
            new = free_port(master_addr)
            notes.append(f"port {port} is in use: used {new}")
            port = new
        spec = _Spec(module, list(args), nprocs, world_size or nprocs, run_dir, timeout_s,
                     master_addr, threads, dict(env or {}), fork, list(preload), python)
        for attempt in range(2):
            if prepare is not None:
                prepare()
            result = _launch_once(spec, port, on_start, on_poll)
            logs = " ".join(r.log for r in result.ranks)
            busy = "address already in use" in logs.lower()
            if result.ok or result.interrupted or not busy or attempt:
                break
            new = free_port(master_addr)
            notes.append(f"port {port} was taken during start-up: retried on {new}")
            port = new
        result.notes = notes + result.notes
        return result


@dataclass(frozen=True)
class _Spec:
    module: str
    args: list[str]
    nprocs: int
    world_size: int
    run_dir: Path
    timeout_s: float | None
    master_addr: str
    threads: int | None
    env: dict[str, str]
    fork: bool
    preload: list[str]
    python: str


def _environment(spec: _Spec, port: int) -> dict[str, str]:
    threads = spec.threads or max(1, (os.cpu_count() or 1) // spec.nprocs)
    env = {
        **os.environ,
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_WORLD_SIZE": str(spec.nprocs),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        # the ranks exit if this launcher dies without stopping them (e.g. SIGKILL)
        "PERFMODEL_PARENT_PID": str(os.getpid()),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        **spec.env,
    }
    env.pop("RANK", None)
    if spec.master_addr in LOOPBACK:  # gloo's sockets on loopback too
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _launch_once(
    spec: _Spec,
    port: int,
    on_start: Callable[[list[int]], None] | None,
    on_poll: Callable[[], None] | None,
) -> LaunchResult:
    env = _environment(spec, port)
    statuses = [RankStatus(rank=r) for r in range(spec.nprocs)]
    logs = [spec.run_dir / f"rank{r}.log" for r in range(spec.nprocs)]
    procs: list[subprocess.Popen] = []
    forked: _ForkedRanks | None = None
    start = time.monotonic()
    interrupted = False
    try:
        if spec.fork:
            forked = _ForkedRanks(spec, env, statuses)
            procs.append(forked.parent)
        else:
            for rank in range(spec.nprocs):
                procs.append(_start_rank(spec, env, rank, logs[rank], procs[0].pid if procs else 0))
                statuses[rank].pid = procs[-1].pid
        reason = _watch(spec, procs, forked, statuses, start, on_start, on_poll)
    except KeyboardInterrupt:
        interrupted = True
        reason = "interrupted (Ctrl-C or SIGTERM): every rank was stopped"
    finally:
        if procs:
            _kill_group(procs[0].pid, procs)
    if forked is not None:
        forked.read()  # exits reported before the group was killed
    elapsed = time.monotonic() - start
    for s in statuses:
        if s.state == "running":
            s.state = "stopped" if interrupted else "killed"
        if s.exit_code is None and not spec.fork:
            s.exit_code = procs[s.rank].returncode if s.rank < len(procs) else None
        s.log = _tail(logs[s.rank])
        if s.state == "failed" and not s.error:
            s.error = _error_line(s.log) or f"exit code {s.exit_code}"
            if s.exit_code is not None and s.exit_code < 0:
                s.error = f"killed by signal {-s.exit_code} ({signal.Signals(-s.exit_code).name})"
        if s.state == "killed" and not s.error:
            s.error = "did not finish: still running when the run was stopped (hung?)"
        if s.state == "stopped" and not s.error:
            s.error = "stopped: the run was interrupted"
    return LaunchResult(
        ok=all(s.state == "ok" for s in statuses),
        ranks=statuses,
        elapsed_s=elapsed,
        port=port,
        reason=reason,
        interrupted=interrupted,
    )


def _start_rank(spec: _Spec, env: dict[str, str], rank: int, log: Path, pgid: int
                ) -> subprocess.Popen:
    """Rank 0 leads a new process group; the others join it."""
    rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [spec.python, "-P", "-m", spec.module, *spec.args],
            env=rank_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=pgid,
        )


def _start_fork_parent(spec: _Spec, env: dict[str, str]) -> subprocess.Popen:
    """The fork parent leads a new process group; its own output goes to run_dir/launcher.log."""
    cmd = [spec.python, "-P", "-m", "workload.launcher", "--fork", str(spec.nprocs),
           "--log-dir", str(spec.run_dir), *(f"--preload={m}" for m in spec.preload),
           spec.module, *spec.args]
    with open(spec.run_dir / "launcher.log", "wb") as err:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, process_group=0)


class _ForkedRanks:
    """The fork parent (python -m workload.launcher --fork) and what it reports of its ranks:
    'start RANK PID' and 'exit RANK CODE' lines on its stdout."""

    def __init__(self, spec: _Spec, env: dict[str, str], statuses: list[RankStatus]) -> None:
        self.parent = _start_fork_parent(spec, env)
        assert self.parent.stdout is not None
        os.set_blocking(self.parent.stdout.fileno(), False)
        self.statuses = statuses
        self.log = spec.run_dir / "launcher.log"
        self.buffer = b""

    def read(self) -> None:
        """Apply the lines reported so far."""
        assert self.parent.stdout is not None
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            while chunk := self.parent.stdout.read():
                self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            what, rank, value = line.decode(errors="replace").split()
            s = self.statuses[int(rank)]
            if what == "start":
                s.pid = int(value)
            elif s.state == "running":
                s.exit_code, s.exited_at = int(value), time.monotonic()
                s.state = "ok" if s.exit_code == 0 else "failed"

    def lost(self) -> bool:
        """The fork parent is gone: ranks it did not report as ended are failed."""
        if self.parent.poll() is None:
            return False
        self.read()
        why = _error_line(_tail(self.log))
        for s in self.statuses:
            if s.state == "running":
                s.state, s.exited_at = "failed", time.monotonic()
                s.error = f"the fork parent exited with {self.parent.returncode}" + (
                    f": {why}" if why else "")
        return True


def _watch(
    spec: _Spec,
    procs: list[subprocess.Popen],
    forked: _ForkedRanks | None,
    statuses: list[RankStatus],
    start: float,
    on_start: Callable[[list[int]], None] | None,
    on_poll: Callable[[], None] | None,
) -> str:
    first_failure: float | None = None
    started = False
    while True:
        if forked is not None:
            forked.read()
            forked.lost()
        else:
            for s, p in zip(statuses, procs, strict=True):
                code = p.poll()
                if code is not None and s.state == "running":
                    s.exit_code, s.exited_at = code, time.monotonic()
                    s.state = "ok" if code == 0 else "failed"
        if not started and all(s.pid for s in statuses):
            started = True
            if on_start is not None:
                on_start([s.pid for s in statuses])
        if first_failure is None and any(s.state == "failed" for s in statuses):
            first_failure = time.monotonic()
        if on_poll is not None:
            on_poll()
        if all(s.state != "running" for s in statuses):
            return "" if first_failure is None else "a rank failed"
        now = time.monotonic()
        if first_failure is not None and now - first_failure > GRACE_S:
            return "a rank failed; the others were stopped"
        if spec.timeout_s is not None and now - start > spec.timeout_s:
            return f"timeout: the job did not finish within {spec.timeout_s:g} s"
        time.sleep(0.1)


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


def _error_line(log: str) -> str:
    for line in reversed(log.splitlines()):
        line = line.strip()
        if "Error" in line or "error" in line or "Exception" in line:
            return line.removeprefix("[rank0]: ").strip()[:300]
    return ""


# --- the fork parent ------------------------------------------------------------------------------


def fork_ranks(nprocs: int, log_dir: Path, module: str, args: list[str],
               preload: Sequence[str] = ()) -> int:
    """In the fork parent: import preload and the module's entry point once, fork nprocs ranks
    (RANK and LOCAL_RANK set, output to log_dir/rankR.log, exit code: the entry's main(args)),
    report each rank's pid and exit on stdout, and wait for all. The ranks watch this process;
    it watches the launcher (and, should the launcher go, kills the ranks and exits)."""
    reports = os.dup(1)  # the launcher reads this pipe; what the imports print goes to stderr
    os.dup2(2, 1)
    for name in preload:
        importlib.import_module(name)
    entry = importlib.import_module(module)
    if hasattr(entry, "__path__"):  # a package runs as its __main__
        entry = importlib.import_module(f"{module}.__main__")
    launcher = int(os.environ.get("PERFMODEL_PARENT_PID") or os.getppid())
    os.environ["PERFMODEL_PARENT_PID"] = str(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for rank in range(nprocs):
        pid = os.fork()
        if pid == 0:
            os.close(reports)
            _forked_rank(rank, log_dir, entry, args)
        pids[pid] = rank
        _report(reports, f"start {rank} {pid}")
    while pids:
        if os.getppid() != launcher:  # the launcher is gone: so are its ranks
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(1)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            time.sleep(0.02)
            continue
        _report(reports, f"exit {pids.pop(pid)} {os.waitstatus_to_exitcode(status)}")
    return 0


def _forked_rank(rank: int, log_dir: Path, entry: object, args: list[str]) -> None:
    code = 1
    try:
        fd = os.open(log_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        # a crash in native code (a SIGSEGV in torch or gloo) leaves the Python stack of every
        # thread in the rank's log, which the launcher's error quotes
        faulthandler.enable()
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0")
        code = int(entry.main(list(args)) or 0)  # type: ignore[attr-defined]
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _report(fd: int, line: str) -> None:
    os.write(fd, f"{line}\n".encode())


def main(argv: list[str] | None = None) -> int:
    """python -m workload.launcher --fork N --log-dir D [--preload=M ...] MODULE ARGS..."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 5 or argv[0] != "--fork" or argv[2] != "--log-dir":
        print(main.__doc__, file=sys.stderr)
        return 2
    nprocs, log_dir, rest = int(argv[1]), Path(argv[3]), argv[4:]
    preload = [a.removeprefix("--preload=") for a in rest if a.startswith("--preload=")]
    rest = rest[len(preload):]
    return fork_ranks(nprocs, log_dir, rest[0], rest[1:], preload)


if __name__ == "__main__":
    sys.exit(main())
