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


# --- bounded reading of user files ---------------------------------------------------------------
# Every file a user names (a model, hardware spec, profile, plans CSV, nccl-tests log, GEMM table,
# validation results, history) is read here: a device (/dev/zero), a FIFO, a socket or a directory
# is refused before it is opened, and at most limit + 1 bytes are read, so a hostile or mistaken
# path costs well under a second and a bounded amount of memory.

import stat as _stat  # noqa: E402 (this section is kept apart from the locks above)
from collections.abc import Callable  # noqa: E402

MAX_INPUT_BYTES = 16 * 2**20  # 16 MiB: ~100x the largest input shipped (a 357 kB GEMM table)

_NOT_REGULAR = ((_stat.S_ISDIR, "is a directory, not a file"),
                (_stat.S_ISCHR, "is a character device, not a regular file"),
                (_stat.S_ISBLK, "is a block device, not a regular file"),
                (_stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
                (_stat.S_ISSOCK, "is a socket, not a regular file"))


def _mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def read_bytes_bounded(path: str | os.PathLike[str], what: str, *,
                       error: type[PerfmodelError], limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or `error` in one line.

    The message reads '{what} {path}: {reason}' (reason: file not found, is a directory, is a
    character device or FIFO, is larger than the limit, cannot be read). The file is opened
    non-blocking (a FIFO swapped in after the check cannot block) and checked again by its
    descriptor; at most limit + 1 bytes are read (a file of /proc reports size 0, or one may grow).
    """
    path = Path(path)
    name = f"{what} {path}" if what else str(path)

    def refuse(reason: str) -> PerfmodelError:
        return error(f"{name}: {reason}")

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise refuse("file not found") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a loop of links
        raise refuse(f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    _check_regular(info, limit, refuse)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    try:
        _check_regular(os.fstat(fd), limit, refuse)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise refuse(f"is larger than the {_mib(limit)} limit")
    return data


def _check_regular(info: os.stat_result, limit: int,
                   refuse: Callable[[str], PerfmodelError]) -> None:
    for test, reason in _NOT_REGULAR:
        if test(info.st_mode):
            raise refuse(reason)
    if info.st_size > limit:
        raise refuse(f"is {_mib(info.st_size)}, larger than the {_mib(limit)} limit")


def read_text_bounded(path: str | os.PathLike[str], what: str, *,
                      error: type[PerfmodelError], limit: int = MAX_INPUT_BYTES,
                      encoding: str = "utf-8") -> str:
    """read_bytes_bounded decoded as text ('utf-8-sig' drops a spreadsheet's byte-order mark),
    line ends '\\r\\n' and '\\r' read as '\\n' (as Path.read_text does); `error` 'is not UTF-8
    text' when it does not decode."""
    data = read_bytes_bounded(path, what, error=error, limit=limit)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        name = f"{what} {path}" if what else str(path)
        raise error(f"{name}: is not UTF-8 text (byte {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


__all__ += ["MAX_INPUT_BYTES", "read_bytes_bounded", "read_text_bounded"]
