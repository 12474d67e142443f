"""Files: the one atomic writer every output goes through, and an advisory lock for files that
several processes share.

Writing: `write_atomic(path, data)` writes a whole file or nothing (a temporary file in the target's
directory, flushed to disk, then renamed over the target). It refuses a target that is a directory,
a device, a FIFO or a socket (as root, replacing /dev/null with a file would break the machine),
writes through a symbolic link to the file it points to (the link stays a link), keeps an existing
file's mode and owner, and turns a missing or read-only directory or a full disk into one line
(OutputError, exit 7). tests/unit/test_faults.py reads the sources so that no other writer appears.

Locking: the lock is the kernel's, held by an open file descriptor: it is released when its process
exits, however it exits (a crash, SIGKILL), so a lock file left behind is never stale; it is reused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from perfmodel.errors import OutputError, PerfmodelError

# --- writing -------------------------------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))
_REASONS = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.EROFS: "the file system is read-only", errno.ENOSPC: "no space left on device",
            errno.EDQUOT: "disk quota exceeded", errno.ENAMETOOLONG: "the file name is too long",
            errno.ENOTDIR: "a part of the path is not a directory"}


@contextlib.contextmanager
def _path_errors(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Turn an OSError of looking at an output's path (pathlib's is_symlink, exists and is_dir
    raise all but ENOENT, ENOTDIR, EBADF and ELOOP: EACCES under a directory without search
    permission, ENAMETOOLONG) into OutputError naming the path and the reason."""
    try:
        yield
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
        raise OutputError(f"cannot write {what} {os.fspath(path)}: {reason}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _as_path(path: str | os.PathLike[str], what: str) -> Path:
    """path as a Path, refusing a name that ends in '/' (or '/.'): Path() drops the slash, and
    'real.csv/' would replace the file real.csv where POSIX refuses it (ENOTDIR, or EISDIR for a
    name that does not exist): the slash names a directory."""
    text = os.fspath(path)
    if not text:  # Path('') is '.': an empty name (an unset shell variable) names no file
        raise OutputError(f"cannot write {what}: its path is empty; give the path of a "
                          "regular file")
    if text == "-":  # many tools' standard output: perfmodel would write a file named '-'
        raise OutputError(f"cannot write {what} to '-': perfmodel writes files only (--json "
                          "prints to standard output); give a path ('./-' for a file of that "
                          "name)")
    with _path_errors(text, what):
        _refuse_trailing_slash(text, what)
    return Path(path)


def _refuse_trailing_slash(text: str | bytes, what: str) -> None:
    if isinstance(text, str) and (text.endswith(os.sep) or text.endswith(os.sep + ".")
                                  or (os.altsep and text.endswith(os.altsep))):
        stripped = Path(text)
        if not stripped.is_dir():  # a directory is refused as one (_target)
            found = ("is not a directory" if stripped.exists() or stripped.is_symlink()
                     else "does not exist")
            raise OutputError(f"cannot write {what} {text}: the trailing '/' names a directory "
                              f"and {stripped} {found}; give the path of a regular file, "
                              "without the '/'")


def _target(path: Path, what: str) -> tuple[Path, os.stat_result | None]:
    """The regular file a write lands in (a symlink's target) and its status if it exists."""
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target, None
    except OSError as exc:
        raise OutputError(f"cannot write {what} {path}: "
                          f"{_REASONS.get(exc.errno or 0, exc.strerror)}") from None
    for test, kind in _KINDS:
        if test(st.st_mode):
            raise OutputError(f"refusing to write {what} {path}: it is {kind}; give the path of "
                              "a regular file")
    return target, st


def _prepare(path: Path, what: str, make_parents: bool) -> tuple[Path, os.stat_result | None]:
    with _path_errors(path, what):
        target, st = _target(path, what)
        directory = target.parent if str(target.parent) else Path(".")
        if make_parents:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"cannot create the directory of {what} {path}: "
                                  f"{_REASONS.get(exc.errno or 0, exc.strerror)}") from None
        if not directory.is_dir():
            raise OutputError(f"output directory does not exist: {directory} (for {what} "
                              f"{path})")
    return target, st


# the image formats a figure is written in, by the output's suffix
FIGURE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def figure_format(path: str | Path, what: str = "plot") -> str:
    """The format of a figure written at path, by its suffix; OutputError for another suffix
    (a .jpg was written as PNG under its name)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FIGURE_FORMATS:
        raise OutputError(f"{what} {path}: give a name ending in "
                          f"{', '.join(FIGURE_FORMATS)} (the image's format)")
    return FIGURE_FORMATS[suffix]


def check_output(path: str | Path | None, *, what: str = "output",
                 make_parents: bool = False, figure: bool = False) -> None:
    """Refuse now (OutputError) a path a later write_atomic(path, make_parents=...) would refuse
    (a directory, a device, a FIFO; a missing directory where the write makes none; an ancestor
    that is not a directory where it does): for a command that writes only after a long run, so
    that a bad output path costs no run. It creates nothing: a missing parent is the write's to
    make, and a command that fails before it leaves none behind. figure: an image, whose suffix
    must name its format. None: no output, nothing to check."""
    if path is None:
        return
    path = _as_path(path, what)
    with _path_errors(path, what):
        _check_path(path, what, make_parents)
    if figure:  # an image: its suffix names its format (checked after where it goes)
        figure_format(path, what)


def check_distinct(outputs: Iterable[tuple[str | os.PathLike[str] | None, str]],
                   inputs: Iterable[tuple[str | os.PathLike[str] | None, str]] = ()) -> None:
    """Refuse now (OutputError) an output that is where another output of the same command goes,
    or an input it reads: the later write would replace it (the nccl-tests log with the profile
    fitted to it, a plans file with its results, a trace with the HTML report). Paths are
    compared where their writes go (symbolic links followed) and, where both exist, as files (a
    hard link is the same file). (path, what) pairs; a path of None is none, and an input that
    is not an existing file (a preset's name) is not a file an output could replace."""
    seen: list[tuple[str, str, str, bool]] = []  # (real path, path as given, what, an input)
    for path, what, is_input in [(p, w, True) for p, w in inputs] + \
            [(p, w, False) for p, w in outputs]:
        if path is None or (is_input and not os.path.isfile(path)):
            continue
        real = os.path.realpath(path)
        for other_real, other, other_what, other_input in seen:
            same = real == other_real
            if not same and os.path.exists(real) and os.path.exists(other_real):
                with contextlib.suppress(OSError):
                    same = os.path.samefile(real, other_real)
            if same and not is_input:
                kind = "the input" if other_input else "also the path of the"
                raise OutputError(f"refusing to write {what} {path}: it is {kind} {other_what}"
                                  f"{'' if os.fspath(path) == other else ' ' + other} (give "
                                  f"the {what} a path of its own)")
        seen.append((real, os.fspath(path), what, is_input))


def _check_path(path: Path, what: str, make_parents: bool) -> None:
    """check_output's refusals of where the file goes."""
    if make_parents and not path.parent.exists():  # the write makes it: its ancestor must allow
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise OutputError(f"cannot create the directory of {what} {path}: {ancestor} is not "
                              "a directory")
        return
    target, _ = _target(path, what)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise OutputError(f"output directory does not exist: {directory} (for {what} {path})")


@contextlib.contextmanager
def atomic_file(path: str | Path, *, what: str = "output",
                make_parents: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write into; on leaving the block it replaces path whole (after an
    exception, or Ctrl-C, nothing is replaced). For outputs written piece by piece (a CSV of
    millions of plans) without holding them in memory. The target is checked before the block
    runs: a refused path costs no work. Raises OutputError naming the path and the reason."""
    path = _as_path(path, what)
    target, st = _prepare(path, what, make_parents)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if st is not None:  # an existing file keeps its mode and, where allowed, its owner
                os.fchmod(fh.fileno(), stat.S_IMODE(st.st_mode))
                with contextlib.suppress(PermissionError):
                    if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                        os.fchown(fh.fileno(), st.st_uid, st.st_gid)
            else:  # mkstemp creates 0600: give a new file the mode open() would
                os.fchmod(fh.fileno(), 0o666 & ~_umask())
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
        raise OutputError(f"cannot write {what} {path}: {reason}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_atomic(path: str | Path, data: str | bytes, *, what: str = "output",
                 make_parents: bool = False) -> Path:
    """Write data (text as UTF-8) to path as a whole file or not at all; returns path.

    make_parents creates missing directories (for files perfmodel lays out itself: run
    directories, the cache); a user's output path must name an existing directory.
    Raises OutputError naming the path and the reason.
    """
    with atomic_file(path, what=what, make_parents=make_parents) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))
    return Path(path)


# --- locking -------------------------------------------------------------------------------------


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


__all__ = ["atomic_file", "file_lock", "lock_path", "write_atomic"]


# --- bounded reading of user files ---------------------------------------------------------------
# Every file a user names (a model, hardware spec, profile, plans CSV, nccl-tests log, GEMM table,
# validation results, history) is read here: a device (/dev/zero), a FIFO, a socket or a directory
# is refused before it is opened, and at most limit + 1 bytes are read, so a hostile or mistaken
# path costs well under a second and a bounded amount of memory.

MAX_INPUT_BYTES = 16 * 2**20  # 16 MiB: ~100x the largest input shipped (a 357 kB GEMM table)

_NOT_REGULAR = ((stat.S_ISDIR, "is a directory, not a file"),
                (stat.S_ISCHR, "is a character device, not a regular file"),
                (stat.S_ISBLK, "is a block device, not a regular file"),
                (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
                (stat.S_ISSOCK, "is a socket, not a regular file"))


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
