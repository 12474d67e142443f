"""Work run ahead in a child process: the searches `recommend` runs after its main one (the best
plan without expert or context parallelism, the best bf16 plan of an FP8 search), started in a
forked child before the main search so that they run beside it on a second CPU.

The child runs its jobs in order and writes each result to a pipe as it finishes (a length, then
the JSON of [key, result]: a job's result is plain data, strings, numbers, lists and dicts of them,
or None); it reads compiled modules from the disk cache only and builds none
(perfmodel.evaluate.warm_only), except in the jobs named `builds`, of families the parent builds no
module of (an FP8 search's bf16 twin), which build what they lack, in the child, in order
(evaluate.build_missing; none ahead in a child of the child). With a cold cache it waits for a
module it lacks, saying so on the pipe ([null, {"waiting": path}], then [null, {"waiting": null}]
once it has it): the parent builds the modules of its own search anyway (it, or its build-ahead
child, files them), and the searches run ahead are of the same model on the same hardware, so they
mostly need the same modules and start as soon as those are filed, still beside the main search.
The parent asks for a job's result when it needs it (Ahead.get): from the pipe, waiting while the
child computes it, or computed in this process where the child cannot give it (not forked: one CPU,
another thread, not Linux, PERFMODEL_NO_BUILD_AHEAD; the child failed or ended; the child waits for
a module nobody is building: evaluate.coming) or has not started it yet: while the child is on a
job before it, this process computes it beside the child, which keeps on where a job it has left is
needed and is stopped where none is (waiting for both jobs in turn would take their sum). Either
way the result is the same function's on the same input: running ahead changes how long the answer
takes, never the answer. A child still running when the parent has what it needs, or exits, is
stopped (SIGTERM); a child whose parent has gone stops itself.

os.fork by hand, as perfmodel.evaluate.build_ahead (its reasons there); the framing of the
results by hand too (a length and JSON: never a pickle, which would run code from the pipe;
multiprocessing's connection pickles).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import struct
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from perfmodel import evaluate

_HEADER = struct.Struct("<Q")  # the length of one JSON [key, result]
_RUNNING: set[Ahead] = set()  # the parent's children still running (stopped at exit)
POLL_S = 0.02  # how often a waiting child looks for the module it waits for
CHECK_S = 0.1  # how often a parent waiting on its child checks that the child's wait will end


class Ahead:
    """Jobs (key, function of no arguments returning plain data: JSON) run in a child, in
    order. get(key, compute) gives a job's result; stop() ends the child."""

    def __init__(self, jobs: Iterable[tuple[str, Callable[[], Any]]],
                 builds: Iterable[str] = ()) -> None:
        self.jobs = list(jobs)
        self.builds = frozenset(builds)  # the jobs that build the modules they lack
        self.keys = [key for key, _ in self.jobs]
        self.results: dict[str, Any] = {}  # the child's, and those computed here
        self.given: set[str] = set()  # the keys whose results the child has written
        self.waiting: str | None = None  # the module the child waits for, if it waits
        self.pid: int | None = None
        self.read: int | None = None
        self._buffer = bytearray()
        forked = evaluate.fork_child() if self.jobs else None
        if forked is None:
            return
        pid, read, write = forked
        if pid == 0:  # the child: never returns into the parent's code
            _child(self.jobs, read, write, self.builds)
        os.close(write)
        self.pid, self.read = pid, read
        if not _RUNNING:
            atexit.register(_stop_all)
        _RUNNING.add(self)

    def get(self, key: str, compute: Callable[[], Any], needed: Iterable[str] = ()) -> Any:
        """The result of job `key`: the child's, or compute() here. The child runs its jobs in
        order, so it is on the first job it has not given: `key` is waited for only if it is
        that job; a later one is computed here meanwhile (the child keeps on where `needed`, the
        other keys the caller will ask for, holds a job it has not given, else it is stopped)."""
        if key in self.results:
            return self.results[key]
        if key not in self.keys:
            return compute()
        stuck = False
        if self.read is not None:
            self._drain(block=False)
            if key not in self.results and self._current() == key:
                while key not in self.results and self.read is not None:
                    if self.waiting is not None and not evaluate.coming(Path(self.waiting)):
                        stuck = True  # it waits for a module nobody is building
                        break
                    self._drain(block=True, timeout_s=CHECK_S)
            if key in self.results:
                return self.results[key]
        if stuck or not set(needed).intersection(
                k for k in self.keys if k != key and k not in self.given and k not in self.results):
            self.stop()  # nothing it has left is needed: its CPU is this computation's
        result = compute()
        self.results[key] = result  # the same function's on the same input as the child's
        return result

    def _current(self) -> str | None:
        """The job the child is on: the first it has not given (None: it has given them all)."""
        return next((k for k in self.keys if k not in self.given), None)

    def stop(self) -> None:
        """End the child (if running) and collect it."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self._close()

    def _drain(self, block: bool, timeout_s: float | None = None) -> None:
        """Read what the child has written: all of it (waiting for one read, at most timeout_s
        where given) when `block`, what is there now otherwise; the pipe's end closes the
        child."""
        assert self.read is not None
        if block and timeout_s is not None and not select.select([self.read], [], [],
                                                                   timeout_s)[0]:
            return
        if not block:
            os.set_blocking(self.read, False)
        try:
            while True:
                try:
                    chunk = os.read(self.read, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:  # the child has ended
                    self._parse()
                    self._close()
                    return
                self._buffer += chunk
                self._parse()
                if block:
                    break
        finally:
            if self.read is not None:
                os.set_blocking(self.read, True)

    def _parse(self) -> None:
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                return
            key, result = json.loads(bytes(self._buffer[_HEADER.size:_HEADER.size + size]))
            del self._buffer[:_HEADER.size + size]
            if key is None:  # the child waits for a module, or has it
                self.waiting = result["waiting"]
            else:  # a result computed here meanwhile stands (the same, by the same function)
                self.results.setdefault(key, result)
                self.given.add(key)

    def _close(self) -> None:
        if self.read is not None:
            os.close(self.read)
            self.read = None
        if self.pid is not None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        _RUNNING.discard(self)


def _stop_all() -> None:
    for ahead in list(_RUNNING):
        ahead.stop()


def _child(jobs: list[tuple[str, Callable[[], Any]]], read: int, write: int,
           builds: frozenset[str] = frozenset()) -> None:
    """The forked child: off the parent's terminal, SIGTERM's default action (the parent's
    handler is the CLI's), the disk cache read only, a module it lacks waited for, except in
    the jobs of `builds` (of families the parent builds no module of), which build it;
    each job's result written as it ends."""
    status = 0
    parent = os.getppid()

    def wait(path: Path) -> None:
        _send(write, None, {"waiting": str(path)})
        while not path.is_file():
            if os.getppid() != parent:  # the parent has gone: nobody will read the result
                os._exit(1)
            time.sleep(POLL_S)
        _send(write, None, {"waiting": None})

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        evaluate.child_ready()
        # at a lower priority: its jobs may not be asked for, and where the CPUs are busy this
        # process's search and the child building modules (evaluate.build_ahead) come first
        os.nice(10)
        evaluate.detach_child(read)
        evaluate.warm_only(on_missing=wait)
        _RUNNING.clear()  # the parent's other children are not this one's to stop
        for key, job in jobs:
            evaluate.build_missing(key in builds)
            _send(write, key, job())
    except BaseException:  # noqa: BLE001 (a failed job: the parent computes it)
        status = 1
    os._exit(status)


def _send(write: int, key: str | None, result: Any) -> None:
    """One [key, result] on the pipe: its length, then its JSON (key None: a message about the
    child itself, not a result)."""
    data = json.dumps([key, result], allow_nan=False).encode()
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(write, view):]
