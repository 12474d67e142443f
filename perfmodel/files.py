"""Files several processes share: an advisory lock (fcntl.flock) beside the file.

The lock is the kernel's, held by an open file descriptor: it is released when its process exits,
however it exits (a crash, SIGKILL), so a lock file left behind is never stale; it is reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from perfmodel.errors import PerfmodelError


def lock_path(path: Path) -> Path:
    """The lock file of path: `.NAME.lock` in the same directory."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def file_lock(path: Path, *, wait_s: float = 30.0, what: str = "") -> Iterator[None]:
    """Hold an exclusive lock on path's lock file; wait up to wait_s for another holder.

    Raises PerfmodelError (naming the holder's pid, as written in the lock file) when the lock
    stays busy. wait_s=0 fails at once.
    """
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise PerfmodelError(
                        f"{what or path} is in use by another process (pid {holder}, lock {lock})"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


__all__ = ["file_lock", "lock_path"]
