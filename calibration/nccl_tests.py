"""Reading nccl-tests output (github.com/NVIDIA/nccl-tests): all_reduce_perf, all_gather_perf, ...

Two forms are read:

- the text log a test prints. A log may hold several tests (one section per `# nThread ...`
  header). From each section we read the collective, the ranks and hosts (`#  Rank ... on HOST
  device ... NAME` lines), the column header (`#  size  count  type  redop  root  time  algbw ...`)
  and the rows under it. Launcher prefixes are taken off: `mpirun --tag-output` (`[1,0]<stdout>:`,
  put before every chunk a rank writes, so a chunk cut mid-line puts the next tag, often another
  rank's, in the middle of a row), `srun --label` (`0: `) and `mpiexec -prepend-rank` (`[0] `).
  NCCL_DEBUG lines (`host:pid:tid [dev] NCCL INFO ...`) are skipped, also where one was printed
  inside a row (nccl-tests prints a row in three pieces, and NCCL's first collective of a size
  logs its connections between them). CRLF and CR line ends and a UTF-8/UTF-16 byte-order mark
  are accepted.
- the JSON file `-J FILE.json` writes (format version 1 to 3 of nccl-tests' src/util.cu).

Every row is checked (algbw = size / time), so a garbled log is refused, never half-read. A last
row cut mid-line (a run killed while printing) is refused naming its line, or dropped with a note
under allow_truncated. A file is read up to MAX_LOG_BYTES: a larger one is refused, so /dev/zero or
a wrong multi-GB file costs a bounded read.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

import pandas as pd

from perfmodel.costs.collectives import Op
from perfmodel.errors import DataError
from perfmodel.files import read_bytes_bounded

# A log of one nccl-tests run is a few kB (a thousand lines with NCCL_DEBUG=INFO on many ranks);
# 16 MiB is the input bound of issue 14 (item 6).
MAX_LOG_BYTES = 16 * 2**20

# What a row can hold (_checked). nccl-tests sizes fit in GPU memory (its -e caps maxBytes there):
# 2^50 B (1 PiB) is far above any. It prints times to 0.01 us; no collective takes under 1 ns or
# over 10^10 us (about 3 hours). algbw = size / time: NVLink 5 gives 1.8 TB/s per GPU (NVIDIA
# Blackwell datasheet), so 100 TB/s is out of reach of any interconnect.
MAX_BYTES = 2**50
MIN_TIME_US, MAX_TIME_US = 1e-3, 1e10
MAX_ALGBW_BYTES_PER_S = 1e14

# nccl-tests binary name -> perfmodel op
BINARIES = {
    "all_reduce": Op.ALL_REDUCE,
    "all_gather": Op.ALL_GATHER,
    "reduce_scatter": Op.REDUCE_SCATTER,
    "alltoall": Op.ALL_TO_ALL,
    "sendrecv": Op.SEND_RECV,
    "broadcast": Op.BROADCAST,
    "reduce": Op.REDUCE,
    "hypercube": Op.ALL_GATHER,
}
# nccl-tests' type names and their bytes (src/common.cu, test_typenames, NVIDIA/nccl-tests at
# d2d40cc8: NCCL 2's, bfloat16 from NCCL 2.10; NCCL 1's char and int)
TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
              "half": 2, "float": 4, "double": 8, "bfloat16": 2, "char": 1, "int": 4}
# The collectives whose printed count is one rank's share, so that the size printed (the larger
# buffer) is count x the type's bytes x the ranks (nccl-tests' *GetCollByteCount: all_gather's
# and hypercube's send count, reduce_scatter's receive count, alltoall's count per peer); the
# others' count is the buffer's
PER_RANK_COUNT = (Op.ALL_GATHER, Op.REDUCE_SCATTER, Op.ALL_TO_ALL)
# file-name hints, most specific first
_NAME_HINTS = [
    ("allreduce", Op.ALL_REDUCE),
    ("all_reduce", Op.ALL_REDUCE),
    ("allgather", Op.ALL_GATHER),
    ("all_gather", Op.ALL_GATHER),
    ("reducescatter", Op.REDUCE_SCATTER),
    ("reduce_scatter", Op.REDUCE_SCATTER),
    ("alltoall", Op.ALL_TO_ALL),
    ("all_to_all", Op.ALL_TO_ALL),
    ("sendrecv", Op.SEND_RECV),
    ("send_recv", Op.SEND_RECV),
    ("broadcast", Op.BROADCAST),
    ("reduce", Op.REDUCE),
]
# Open MPI's --tag-output (orte/prte/pmix iof_base_output.c: "[%s,%s]<%s>:", jobid, rank,
# stream; with --timestamp-output a ctime() date before it). Open MPI 5 may add a space.
_TAG = re.compile(
    r"(?:[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})?"
    r"\[([^\[\]<>\s]{1,64},\d{1,9})\]<(stdout|stderr|stddiag)>:"
)
# line-start prefixes of other launchers: srun --label ("0: "), mpiexec -prepend-rank ("[0] ")
_PREFIX = re.compile(r"^(?:\s*\d+:\s|\[\d+\]\s)")
# NCCL's debug line header (src/debug.cc): "HOST:PID:TID [DEV] NCCL INFO ", with an optional
# "[date time] " before it where NCCL_DEBUG_TIMESTAMP_LEVELS asks for one. Found from its fixed
# tail, right before each ' NCCL ' (see _find_debug): one pass over a line, however long.
_DEBUG_TAIL = re.compile(r":\d{1,10}:\d{1,10} \[\d{1,4}\] NCCL (?:INFO|WARN|TRACE|ABORT)\b")
_DEBUG_TS = re.compile(r"\[\d{4}-\d\d-\d\d[^\]\n]{0,40}\] $")
_PERF = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv|broadcast|reduce|"
    r"hypercube)_perf(?:_mpi)?\b"  # the MPI build of nccl-tests names its binaries *_perf_mpi
)
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+"
    r"device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$"
)
_COLUMNS = re.compile(r"^#\s*size\s+count\s")  # the column header: '#  size  count  type ...'
_VERSION = re.compile(r"nccl-library=(\d+)")
# the value as set: one algorithm, a list NCCL chooses from, an exclusion (^nvls) or, since NCCL
# 2.24, per collective (allreduce:tree;allgather:ring): read by importers._algorithm
_ALGO = re.compile(r"NCCL_ALGO set by environment to (\S+)", re.I)
_DTYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float16": 2,
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
}


@dataclass(frozen=True, kw_only=True)
class NcclTestsRun:
    """One test section of an nccl-tests log, or one -J JSON file."""

    path: Path
    line: int  # line of the section's `# nThread` header (1 for a JSON file)
    op: Op
    ranks: int
    nodes: int
    device: str
    hosts: tuple[str, ...]
    nccl_version: str | None
    nccl_algo: str | None
    records: pd.DataFrame  # nbytes, count, type, time_s, time_in_place_s, algbw, busbw, wrong, line
    complete: bool  # the section reached its `# Avg bus bandwidth` line (JSON: its footer)
    notes: list[str] = field(default_factory=list)
    json: bool = False  # read from nccl-tests' -J JSON output
    # GPUs one thread drives (`-g`, the header's nGpus): with more than one, a thread launches a
    # kernel per GPU every iteration, so a small collective's time is the host's launches
    gpus_per_thread: int = 1
    ranks_per_host: tuple[int, ...] = ()  # in the order of `hosts`

    @property
    def scope(self) -> str:
        return "inter" if self.nodes > 1 else "intra"


class _Line(NamedTuple):
    """One line of a rank's output, put back together: where it starts in the file, its stream."""

    lineno: int
    stream: str | None  # '1,0<stdout>' under mpirun --tag-output, else None
    text: str


@dataclass(frozen=True)
class _Layout:
    """Where the columns are, from a section's column header (names as nccl-tests prints them)."""

    width: int  # tokens per row
    time: int
    algbw: int
    busbw: int
    wrong: int | None
    time_in_place: int | None
    counts_wrong: bool  # '#wrong' counts wrong elements; older logs print 'error' (max abs error)
    in_place: tuple[int | None, int | None, int | None] = (None, None, None)  # algbw busbw #wrong
    redop: int | None = None
    root: int | None = None


def read_log(path: str | Path, what: str = "nccl-tests log") -> str:
    """The text of path, read up to MAX_LOG_BYTES; DataError (one line) if it cannot be.

    Decodes UTF-8 (a UTF-8 or UTF-16 byte-order mark is honoured); refuses an empty, binary or
    oversized file. The read is perfmodel's bounded one (perfmodel.files.read_bytes_bounded): a
    device (/dev/zero), a FIFO or a directory is refused before it is opened, and a huge file
    costs at most 16 MiB.
    """
    path = Path(path)
    raw = read_bytes_bounded(path, "", error=DataError, limit=MAX_LOG_BYTES)
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        text = raw.decode("utf-16", "replace")
    else:
        if b"\x00" in raw[:4096]:
            raise DataError(f"{path}: binary file, not an {what}")
        text = raw.decode("utf-8", "replace").removeprefix("\ufeff")
    if not text.strip():
        raise DataError(f"{path}: empty file, not an {what}")
    if "\r" in text and "\n" not in text:  # classic Mac line ends: read as lines, not one
        text = text.replace("\r", "\n")
    return text


def _number(token: str, path: Path, lineno: int, what: str) -> float | None:
    if token.upper() == "N/A":
        return None
    if not token.isascii():  # float() reads full-width and other scripts' digits: not a log's
        raise DataError(
            f"{path}:{lineno}: {what} '{token}' is not a number in ASCII digits (nccl-tests "
            "prints 0-9): an edited or converted log?"
        )
    try:
        value = float(token)
    except ValueError:
        value = float("nan")
    if value in (float("inf"), float("-inf")) and re.fullmatch(r"[-+]?[0-9.]+(e[-+]?[0-9]+)?",
                                                                token, re.IGNORECASE):
        # digits past what a float holds (10^309 and up): a number, out of every column's range
        shown = token if len(token) <= 24 else f"{token[:12]}...({len(token)} characters)"
        raise DataError(
            f"{path}:{lineno}: {what} {shown} is out of range (a float holds at most ~1.8e308; "
            f"a log's sizes are at most 2^50 bytes and its times {MAX_TIME_US:g} us)"
        )
    if value != value or value in (float("inf"), float("-inf")):
        raise DataError(
            f"{path}:{lineno}: {what} '{token}' is not a number (garbled nccl-tests row)"
        )
    return value


def _layout(text: str, path: Path, lineno: int) -> _Layout:
    """The columns of a header like '#  size count type redop root  time algbw busbw #wrong  time
    algbw busbw #wrong' (nccl-tests src/util.cu writeResultHeader; older versions have no root,
    'error' for '#wrong'; -I 1 adds i_min i_max i_p99 i_cv%; -T 1 a timestamp)."""
    names = text.lstrip("#").split()
    if "cputime" in names:
        raise DataError(
            f"{path}:{lineno}: the log reports CPU time (nccl-tests -C 1), not the "
            "collective's time: run the test without -C"
        )
    times = [i for i, n in enumerate(names) if n == "time"]
    if not times or "algbw" not in names[times[0] :] or "busbw" not in names[times[0] :]:
        raise DataError(
            f"{path}:{lineno}: column header without time, algbw and busbw: not an "
            "nccl-tests log of a known version"
        )
    t0 = times[0]
    oop = names[t0 : times[1]] if len(times) > 1 else names[t0:]
    wrong = next((t0 + i for i, n in enumerate(oop) if n in ("#wrong", "error")), None)
    in_place: tuple[int | None, int | None, int | None] = (None, None, None)
    if len(times) > 1:
        inp = names[times[1] :]
        in_place = tuple(  # type: ignore[assignment]
            next((times[1] + i for i, n in enumerate(inp) if n in alias), None)
            for alias in (("algbw",), ("busbw",), ("#wrong", "error"))
        )
    width = len(names) + (1 if names[-1] == "timestamp" else 0)  # a date and a time: 2 tokens
    return _Layout(
        width=width,
        time=t0,
        algbw=t0 + oop.index("algbw"),
        busbw=t0 + oop.index("busbw"),
        wrong=wrong,
        time_in_place=times[1] if len(times) > 1 else None,
        counts_wrong="#wrong" in names,
        in_place=in_place,
        redop=names.index("redop") if "redop" in names[:t0] else None,
        root=names.index("root") if "root" in names[:t0] else None,
    )


def _row(tokens: list[str], path: Path, lineno: int, layout: _Layout | None) -> dict:
    """One row: by the section's column header, or for a log without one by its column count:
    size count type [redop] [root] (time algbw busbw [#wrong]) x2."""
    if layout is not None:
        if len(tokens) != layout.width:
            raise DataError(
                f"{path}:{lineno}: incomplete or unknown nccl-tests row ({len(tokens)} columns, "
                f"the column header has {layout.width}): truncated log?"
            )
        t = layout
        wrong = tokens[t.wrong] if t.wrong is not None else "0"
        t_in = tokens[t.time_in_place] if t.time_in_place is not None else "N/A"
        oop = [tokens[t.time], tokens[t.algbw], tokens[t.busbw], wrong]
        inp = [t_in] + [tokens[i] if i is not None else "N/A" for i in t.in_place]
        redop = tokens[t.redop] if t.redop is not None else None
        root = tokens[t.root] if t.root is not None else None
        return _record(tokens, oop, inp, path, lineno, redop, root)
    rest, redop, root = tokens[3:], None, None
    if rest and not _numeric(rest[0]):  # redop
        redop, rest = rest[0], rest[1:]
    if len(rest) in (7, 9):  # with root column
        root, rest = rest[0], rest[1:]
    if len(rest) == 8:
        oop, inp = rest[:4], rest[4:8]
    elif len(rest) == 6:
        oop, inp = rest[:3] + ["0"], rest[3:6] + ["N/A"]
    else:
        raise DataError(
            f"{path}:{lineno}: incomplete or unknown nccl-tests row ({len(tokens)} "
            "columns; expected size count type redop root, then time algbw busbw "
            "#wrong out-of-place and in-place): truncated log?"
        )
    return _record(tokens, oop, inp, path, lineno, redop, root)


def _record(
    tokens: list[str],
    oop: list[str],
    inp: list[str],
    path: Path,
    lineno: int,
    redop: str | None = None,
    root: str | None = None,
) -> dict:
    """Check one row (size >= 0, time > 0, algbw = size / time, both halves: out-of-place and
    in-place) and return its record; `redop` and `root` (the op's columns) ride along."""
    size = _number(tokens[0], path, lineno, "size")
    count = _number(tokens[1], path, lineno, "count")
    t_out = _number(oop[0], path, lineno, "time")
    if size is None or count is None or t_out is None:
        raise DataError(f"{path}:{lineno}: size, count and out-of-place time must be numbers")
    t_in = _number(inp[0], path, lineno, "in-place time")
    algbw = _number(oop[1], path, lineno, "algbw")
    busbw = _number(oop[2], path, lineno, "busbw")
    wrong = _number(oop[3], path, lineno, "#wrong") or 0.0
    where = f"{path}:{lineno}"
    if t_in is not None:  # the in-place half is checked as the out-of-place one is
        in_algbw = _number(inp[1], path, lineno, "in-place algbw")
        in_busbw = _number(inp[2], path, lineno, "in-place busbw")
        _checked(size, count, tokens[2], t_in, None, in_algbw, in_busbw, 0.0, where, lineno,
                 half="in-place ")
        wrong = max(wrong, _number(inp[3], path, lineno, "in-place #wrong") or 0.0)
    record = _checked(size, count, tokens[2], t_out, t_in, algbw, busbw, wrong, where, lineno)
    root_value = _number(root, path, lineno, "root") if root is not None else None
    return {**record, "redop": redop, "root": root_value}


def _checked(
    size: float,
    count: float,
    dtype: str,
    t_out_us: float,
    t_in_us: float | None,
    algbw: float | None,
    busbw: float | None,
    wrong: float,
    where: str,
    line: int | None,
    half: str = "",
) -> dict:
    """A record of one size; DataError naming `where` if its numbers cannot be a measurement:
    a size of 0 to MAX_BYTES whole bytes, a time of MIN_TIME_US to MAX_TIME_US, no more than
    MAX_ALGBW_BYTES_PER_S moved (size / time), algbw = size / time where the row gives it."""
    if not 0 <= size <= MAX_BYTES or size != int(size) or count < 0:
        raise DataError(
            f"{where}: size must be a whole number of bytes from 0 to 2^50 and count >= 0, "
            f"got {size:.17g} and {count:.17g}"
        )
    for what, t_us in (("time", t_out_us), ("in-place time", t_in_us)):
        if t_us is not None and not MIN_TIME_US <= t_us <= MAX_TIME_US:
            raise DataError(
                f"{where}: {half}{what} must be from {MIN_TIME_US:g} us to {MAX_TIME_US:g} us, "
                f"got {t_us:g}"
            )
    for what, bw in (("algbw", algbw), ("busbw", busbw)):
        if bw is not None and bw < 0:
            raise DataError(f"{where}: {half}{what} {bw:g} GB/s is negative: not a measurement")
    if size / (t_out_us * 1e-6) > MAX_ALGBW_BYTES_PER_S:
        raise DataError(
            f"{where}: {half}{size:g} B in {t_out_us:g} us is {size / t_out_us / 1e6:.3g} TB/s, "
            f"above {MAX_ALGBW_BYTES_PER_S / 1e12:g} TB/s: not a measurement"
        )
    if algbw is not None and algbw >= 1.0:  # nccl-tests prints algbw = size / time (GB/s, us)
        expected = size / (t_out_us * 1e-6) / 1e9
        if abs(expected / algbw - 1) > 0.05:
            raise DataError(
                f"{where}: {half}algbw {algbw} GB/s does not match size/time = "
                f"{expected:.2f} GB/s: not a consistent nccl-tests row"
            )
    return {
        "nbytes": size,
        "count": count,
        "type": dtype,
        "time_s": t_out_us * 1e-6,
        "time_in_place_s": None if t_in_us is None else t_in_us * 1e-6,
        "algbw": algbw,
        "busbw": busbw,
        "wrong": wrong,
        "line": line,
    }


def _numeric(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return token.upper() == "N/A"
    return True


# a row's first token, its size: digits, and a sign, a fraction or an exponent where a row was
# edited (-268435456, 268435456.5), so that _checked refuses it naming its line rather than the
# row being passed over; \d is any script's digit (full-width '２５６'), refused by _number
_ROW_START = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _is_row(text: str) -> bool:
    tokens = text.split()
    return (bool(tokens) and _ROW_START.fullmatch(tokens[0]) is not None
            and not text.lstrip().startswith("#"))


def _garbled_row(text: str, layout: _Layout | None) -> bool:
    """A line with a section row's columns, its other columns numbers as a row's are, whose
    first (the size) is not a number: a corrupted row ('6710886O', '67108864,', a stray byte),
    refused, where other lines in a section (a launcher's, a program's) are passed over. Before
    2026-12-07 it was passed over too: the fit took the other rows and said nothing."""
    tokens = text.split()
    if layout is None or text.lstrip().startswith("#") or len(tokens) != layout.width:
        return False
    numbers = sum(_ROW_START.fullmatch(t) is not None or t == "N/A" for t in tokens[1:])
    return numbers >= layout.width - 3  # all but the type and reduction op


def _op_from_name(path: Path) -> Op | None:
    name = path.name.lower().replace("-", "_")
    squashed = name.replace("_", "")
    for hint, op in _NAME_HINTS:
        if hint in name or hint.replace("_", "") in squashed:
            return op
    return None


def _logical_lines(text: str) -> list[_Line]:
    """The lines each rank wrote, in the order they ended, each with the file line it starts on.

    Open MPI's --tag-output puts its tag before every chunk a rank's output arrives in, and after
    every newline in it. A chunk that does not end a line (a full stdio buffer, or a row printed in
    pieces) is continued by the next chunk of the same tag, which may come after other ranks'
    chunks, on the same file line. Joining the chunks of each tag gives each rank's lines back.
    """
    physical = text.split("\n")
    if physical and physical[-1] == "":
        physical.pop()
    if "]<std" not in text:
        return [
            _Line(n, None, _PREFIX.sub("", line.rstrip("\r"), count=1))
            for n, line in enumerate(physical, 1)
        ]
    # Open MPI 5 may print "[1,0]<stdout>: " (a space after every tag): then drop that space
    after = [text[m.end() : m.end() + 1] for m in itertools.islice(_TAG.finditer(text), 10000)]
    spaced = " " in after and all(c in (" ", "\n", "\r", "") for c in after)
    open_lines: dict[str, tuple[int, list[str]]] = {}
    out: list[_Line] = []
    for n, raw in enumerate(physical, 1):
        line = raw.rstrip("\r")
        found = list(_TAG.finditer(line))
        if not found:  # not from a rank: mpirun's own messages, a script's echo
            out.append(_Line(n, None, _PREFIX.sub("", line, count=1)))
            continue
        if line[: found[0].start()].strip():
            out.append(_Line(n, None, line[: found[0].start()]))
        for k, m in enumerate(found):
            stream = f"{m.group(1)}<{m.group(2)}>"
            begin = m.end() + (1 if spaced and line[m.end() : m.end() + 1] == " " else 0)
            end = found[k + 1].start() if k + 1 < len(found) else len(line)
            start, parts = open_lines.setdefault(stream, (n, []))
            parts.append(line[begin:end])
            if k + 1 == len(found):  # the file's newline ends this rank's line
                del open_lines[stream]
                out.append(_Line(start, stream, "".join(parts)))
    for stream, (start, parts) in sorted(open_lines.items(), key=lambda kv: kv[1][0]):
        out.append(_Line(start, stream, "".join(parts)))  # the file ends inside this line
    return out


class _Debug(NamedTuple):
    """Where an NCCL debug message starts in a line, and its host name as far as it can tell."""

    start: int  # the timestamp's '[' if there is one, else the first character of `host`
    host: str  # the non-space, non-colon run before ':PID:TID': may have a row glued before it
    timestamped: bool


def _find_debug(text: str) -> _Debug | None:
    """The first NCCL debug header in text, found from ':PID:TID [DEV] NCCL INFO' before each
    ' NCCL ' and read backwards from there: a long line costs one pass, not a search from every
    place (a 16 MiB garbled line stays linear)."""
    at = text.find(" NCCL ")
    while at >= 0:
        if m := _DEBUG_TAIL.search(text, max(0, at - 30), at + 12):
            begin = m.start()
            while begin > 0 and m.start() - begin < 255 and not text[begin - 1].isspace():
                if text[begin - 1] == ":":
                    break
                begin -= 1
            if begin < m.start():
                ts = _DEBUG_TS.search(text, max(0, begin - 64), begin)
                start = ts.start() if ts else begin
                return _Debug(start, text[begin : m.start()], ts is not None)
        at = text.find(" NCCL ", at + 1)
    return None


def _debug_hosts(lines: list[_Line]) -> set[str]:
    """Host names of the NCCL debug lines that start a line, and of the `# Rank` lines."""
    hosts = set()
    for ln in lines:
        text = ln.text.lstrip()
        if (d := _find_debug(text)) is not None and d.start == 0:
            hosts.add(d.host)
        elif (r := _RANK.match(text)) is not None:
            hosts.add(r.group(2))
    return hosts


def _unglue(lines: list[_Line], path: Path) -> list[_Line]:
    """Take NCCL debug messages out of the rows they were printed into.

    nccl-tests prints a row as 'size count type redop root', then the out-of-place and the in-place
    columns, then a newline; NCCL logs the connections of a collective's first call between them:
    '     8     2  float  sum  -1host:12:34 [0] NCCL INFO Channel 00/0 : ...' and the row goes on
    after the message's newline. The host name is glued to the row's last column: where it starts
    is found from the host names of whole debug lines (or `# Rank` lines).
    """
    hosts = sorted(_debug_hosts(lines), key=len, reverse=True)
    held: dict[str | None, _Line] = {}
    out: list[_Line] = []
    for ln in lines:
        m = _find_debug(ln.text)
        if m is not None and ln.text[: m.start].strip():
            cut = m.start
            if not m.timestamped:
                host = next((h for h in hosts if m.host.endswith(h)), None)
                if host is None:
                    raise DataError(
                        f"{path}:{ln.lineno}: an NCCL debug message is printed into this line "
                        f"and its host name cannot be told from '{m.host[-60:]}'"
                    )
                cut = m.start + len(m.host) - len(host)
            head, message = ln.text[:cut], ln.text[cut:]
            out.append(ln._replace(text=message))
            if ln.stream in held:
                prev = held.pop(ln.stream)
                ln, head = prev, prev.text + head
            if _is_row(head):  # the row goes on after the message: hold it until then
                held[ln.stream] = ln._replace(text=head)
            else:
                out.append(ln._replace(text=head))
            continue
        if m is None and ln.stream in held:
            prev = held.pop(ln.stream)
            ln = prev._replace(text=prev.text + ln.text)
        out.append(ln)
    out.extend(held.values())  # the file ends inside these rows
    return out


def parse_nccl_tests(
    path: str | Path, op: Op | str | None = None, *, allow_truncated: bool = False
) -> list[NcclTestsRun]:
    """Every test section of an nccl-tests log (or its -J JSON file); DataError naming file and
    line if it is not one.

    op: the collective when the log does not say (no `*_perf` name in it or in the file name).
    allow_truncated: drop a last row cut mid-line (with a note) instead of refusing the log. A
    section that stops before its summary is read either way (`complete` False); the caller
    decides whether to keep it.
    """
    path = Path(path)
    text = read_log(path)
    if text.lstrip().startswith("{"):
        return [_parse_json(path, text, op, allow_truncated)]
    lines = _unglue(_logical_lines(text), path)
    starts = [i for i, ln in enumerate(lines) if ln.text.lstrip().startswith("# nThread")]
    if not starts:
        raise DataError(
            f"{path}: no nccl-tests header ('# nThread ... minBytes ... maxBytes') "
            "found: not an nccl-tests log"
        )
    runs = []
    for j, start in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(lines)
        prev_end = starts[j - 1] + 1 if j else 0
        runs.append(_section(path, lines, start, end, prev_end, op, allow_truncated))
    return runs


def _section(
    path: Path,
    lines: list[_Line],
    start: int,
    end: int,
    prev_end: int,
    op_hint: Op | str | None,
    allow_truncated: bool,
) -> NcclTestsRun:
    names, hosts, devices, algo, version = [], {}, set(), None, None
    # the preamble (text since the previous section's rows) names the binary and the version
    preamble_start = prev_end
    for i in range(start - 1, prev_end - 1, -1):
        if _is_row(lines[i].text):
            preamble_start = i + 1
            break
    for ln in lines[preamble_start : start + 1]:
        names += _PERF.findall(ln.text)
        if m := _VERSION.search(ln.text):
            version = m.group(1)
    header_line = lines[start]
    gpus = re.search(r"\bnGpus\s+(\d+)", header_line.text)
    complete, notes, layout = False, [], None
    found: list[tuple[_Line, _Layout | None]] = []
    for ln in lines[start:end]:
        text = ln.text
        if "NCCL INFO" in text or "NCCL WARN" in text:
            if m := _ALGO.search(text):
                algo = m.group(1).strip("\"'").lower()
            continue
        if ln.stream is not None and ln.stream != header_line.stream:
            continue  # nccl-tests prints from one process; other ranks' lines are NCCL's
        if m := _RANK.match(text.strip()):
            hosts[int(m.group(1))] = m.group(2)
            devices.add(m.group(3))
            continue
        if "Avg bus bandwidth" in text:
            complete = True
            continue
        if _COLUMNS.match(text.strip()):
            layout = _layout(text.strip(), path, ln.lineno)
            continue
        if _is_row(text) and not complete:  # rows after the summary belong to no test
            found.append((ln, layout))
        elif not complete and _garbled_row(text, layout):
            raise DataError(
                f"{path}:{ln.lineno}: a data row whose size does not read "
                f"({text.split()[0]!r} is not a byte count; the row has the "
                f"{layout.width if layout else ''} columns of the section's rows): a corrupted "
                "log? (fix or delete the line)")
    rows = []
    for k, (ln, lay) in enumerate(found):
        tokens = ln.text.split()
        try:
            rows.append(_row(tokens, path, ln.lineno, lay))
        except DataError:
            if k + 1 < len(found) or complete or not _looks_cut(tokens, lay):
                raise
            if not allow_truncated:
                width = f" of {lay.width}" if lay is not None else ""
                raise DataError(
                    f"{path}:{ln.lineno}: incomplete nccl-tests row ({len(tokens)}{width} "
                    "columns, the log ends inside it): truncated log? (--allow-truncated "
                    f"drops this row and keeps the {len(rows)} before it)"
                ) from None
            notes.append(f"the row at line {ln.lineno} is cut mid-line: dropped")
    name = _starting_name(lines[preamble_start:end]) or (names[-1] if names else None)
    if name is not None:
        op = BINARIES[name]
        if op_hint is not None and Op(op_hint) is not op:
            raise DataError(f"{path}:{header_line.lineno}: --op {Op(op_hint).value}, but the "
                            f"log ran {op.value}; leave --op out")
    elif op_hint is not None:
        op = Op(op_hint)
    elif (guess := _op_from_name(path)) is not None:
        op = guess
    else:
        raise DataError(
            f"{path}:{header_line.lineno}: cannot tell which collective this test ran (no "
            "'*_perf' name in the log or the file name); pass --op"
        )
    if not hosts:
        raise DataError(
            f"{path}:{header_line.lineno}: no '#  Rank N Group G Pid P on HOST device D [...] "
            "NAME' lines: cannot tell the rank count"
        )
    if not rows:
        raise DataError(
            f"{path}:{header_line.lineno}: {op.value} section has no data rows (truncated or "
            "failed run?)"
        )
    if not complete:
        notes.append(
            f"section at line {header_line.lineno} ends before '# Avg bus bandwidth': "
            f"truncated run, {len(rows)} sizes kept"
        )
    records, columns = _op_columns(pd.DataFrame(rows))
    counts_wrong = (
        layout.counts_wrong
        if layout is not None
        else any("#wrong" in ln.text for ln in lines[start:end])
    )
    bad = (records["wrong"] > 0) if counts_wrong else pd.Series(False, index=records.index)
    if bad.any():
        wrong = int(bad.sum())
        notes.append(f"{wrong} {'row' if wrong == 1 else 'rows'} with #wrong > 0 dropped")
        records = records[~bad]
    if records.empty:
        raise DataError(
            f"{path}:{header_line.lineno}: every one of the {op.value} section's {len(rows)} "
            "rows has #wrong > 0 (nccl-tests found wrong results): nothing to fit"
        )
    records = _distinct_sizes(records, f"{path}", notes)
    n_ranks = len(hosts)
    if sorted(hosts) != list(range(n_ranks)):
        raise DataError(
            f"{path}:{header_line.lineno}: rank lines are not 0..N-1 (got {sorted(hosts)[:5]}"
            "...): truncated header?"
        )
    _check_bus_factor(records, op, n_ranks, f"{path}:{header_line.lineno}")
    _check_counts(records, op, n_ranks, str(path))
    notes += _busbw_notes(records, op, n_ranks)
    _check_op_columns(columns, op, f"{path}:{header_line.lineno}")
    counts = Counter(hosts.values())
    return NcclTestsRun(
        path=path,
        line=header_line.lineno,
        op=op,
        ranks=n_ranks,
        nodes=len(set(hosts.values())),
        device=" / ".join(sorted(devices)),
        hosts=tuple(sorted(set(hosts.values()))),
        nccl_version=version,
        nccl_algo=algo,
        records=records.reset_index(drop=True),
        complete=complete,
        notes=notes,
        gpus_per_thread=max(int(gpus.group(1)), 1) if gpus else 1,
        ranks_per_host=tuple(counts[h] for h in sorted(counts)),
    )


_FIX_OP = "give the right --op (or name the file after its collective)"


def _check_bus_factor(records: pd.DataFrame, op: Op, ranks: int, where: str,
                      fix: str = _FIX_OP) -> None:
    """nccl-tests writes busbw = algbw x the op's bus factor (doc/PERFORMANCE.md: 2(n-1)/n for
    all_reduce, (n-1)/n for all_gather, reduce_scatter and alltoall, 1 for the others), so the
    log's own columns say which collective it measured: a log read as another op (its name, or
    --op, where the log names none) is refused. Rows with a zero or missing bandwidth, and ratios
    rounded in the log's two decimals, are left out (within 5%)."""
    from perfmodel.costs.collectives import bus_factor

    rows = records[(records["algbw"] > 0.5) & (records["busbw"] > 0)]
    if rows.empty or ranks < 2:
        return
    ratio = float((rows["busbw"] / rows["algbw"]).median())
    expected = float(bus_factor(op.value, ranks))
    if abs(ratio / expected - 1) <= 0.05:
        return
    others = [o.value for o in Op if o is not op
              and abs(ratio / float(bus_factor(o.value, ranks)) - 1) <= 0.05]
    raise DataError(f"{where}: busbw / algbw is {ratio:.3g} in the log, where {op.value} over "
                    f"{ranks} ranks has {expected:.3g} (nccl-tests' bus factor)"
                    + (f": the log measured {' or '.join(others)}" if others else "")
                    + f"; {fix}")


def _check_counts(records: pd.DataFrame, op: Op, ranks: int, where: str,
                  fix: str = _FIX_OP) -> None:
    """Each row's type one of nccl-tests' (TYPE_BYTES) and its size its count x the type's bytes,
    x the ranks where the count is one rank's share (PER_RANK_COUNT), as nccl-tests prints them:
    a row of another type, an edited row, or a log of another op (or rank count) than it is read
    as is refused naming the row (its line, or its place in a JSON file's results)."""
    share = ranks if op in PER_RANK_COUNT else 1
    columns = (records.index, records["line"], records["type"], records["count"],
               records["nbytes"])
    for i, line, kind, count, size in zip(*columns, strict=True):
        at = f"{where}:{int(line)}" if pd.notna(line) else f"{where}: results[{i}]"
        kind = str(kind)
        if kind not in TYPE_BYTES:
            raise DataError(f"{at}: type {kind!r} is not one of nccl-tests' "
                            f"({', '.join(TYPE_BYTES)})")
        if count * TYPE_BYTES[kind] * share != size:
            per = f" x {ranks} ranks" if share > 1 else ""
            raise DataError(
                f"{at}: size {size:.0f} B is not count {count:.0f} x "
                f"{TYPE_BYTES[kind]} B ({kind}){per}, as nccl-tests prints {op.value} over "
                f"{ranks} ranks: an edited row, or another op or rank count; {fix}")


def _busbw_notes(records: pd.DataFrame, op: Op, ranks: int) -> list[str]:
    """A note naming the rows whose busbw is not algbw x the op's bus factor (within 5%, rows of
    algbw > 0.5 GB/s as _check_bus_factor reads them), where the log's other rows are: nccl-tests
    computes it so, an edited row does not. Only the time is fitted: the rows are kept."""
    from perfmodel.costs.collectives import bus_factor

    rows = records[(records["algbw"] > 0.5) & records["busbw"].notna()]
    if rows.empty or ranks < 2:
        return []
    expected = float(bus_factor(op.value, ranks))
    off = rows[((rows["busbw"] / rows["algbw"]) / expected - 1).abs() > 0.05]
    if off.empty:
        return []

    def at(row: pd.Series) -> str:
        line = row.get("line")
        where = f"line {int(line)}, " if line is not None and line == line else ""
        return (f"{where}{row['nbytes']:.0f} B: busbw {row['busbw']:g} GB/s, algbw "
                f"{row['algbw']:g} x {expected:.3g} = {row['algbw'] * expected:.4g} GB/s")
    shown = "; ".join(at(row) for _, row in off.head(5).iterrows())
    more = f" and {len(off) - 5} more" if len(off) > 5 else ""
    return [f"{len(off)} row{'s' if len(off) > 1 else ''} whose busbw is not algbw x the "
            f"{op.value} bus factor, as nccl-tests prints it ({shown}{more}): an edited row? "
            "kept (the time is what is fitted)"]


# the redop column: nccl-tests prints the reduction (sum, prod, min, max, avg) for the ops that
# reduce (and for sendrecv, whose test passes ncclSum), 'none' for the ones that move data only
_REDUCING = {Op.ALL_REDUCE, Op.REDUCE_SCATTER, Op.REDUCE}
_NOT_REDUCING = {Op.ALL_GATHER, Op.ALL_TO_ALL, Op.BROADCAST}
_ROOTED = {Op.BROADCAST, Op.REDUCE}  # root >= 0; the others print -1


def _op_columns(records: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The records without their redop and root columns, and those columns (what op ran)."""
    cols = [c for c in ("redop", "root") if c in records]
    return records.drop(columns=cols), records[cols]


def _check_op_columns(columns: pd.DataFrame, op: Op, where: str, fix: str = _FIX_OP) -> None:
    """A log read as another op whose bus factor is the same (all_gather and reduce_scatter,
    sendrecv and broadcast) is told apart by its redop column ('none' where nothing is reduced)
    and its root column (-1 but for broadcast and reduce); a log without them is not checked."""
    if "redop" in columns and columns["redop"].notna().any():
        redop = str(columns["redop"].dropna().iloc[0]).lower()
        if (redop == "none" and op in _REDUCING) or (redop != "none" and op in _NOT_REDUCING):
            ran = "no reduction" if redop == "none" else f"the reduction {redop}"
            raise DataError(f"{where}: the log's redop column says it ran {ran}, which "
                            f"{op.value} does not; {fix}")
    if "root" in columns and columns["root"].notna().any():
        root = float(columns["root"].dropna().iloc[0])
        if (root < 0) == (op in _ROOTED):
            raise DataError(f"{where}: the log's root column is {root:g}, where {op.value} has "
                            f"{'a root rank >= 0' if op in _ROOTED else 'none (-1)'}; {fix}")


def _distinct_sizes(records: pd.DataFrame, where: str, notes: list[str]) -> pd.DataFrame:
    """One row per size above 0 B (0 B rows, which nccl-tests repeats where a rank's share
    rounds to nothing, are not fitted): a size repeated with the same numbers is kept once (a
    note says so); with other numbers, the log is refused (which of the two to fit is unknown)."""
    dup = records[records["nbytes"].duplicated(keep=False) & (records["nbytes"] > 0)]
    if dup.empty:
        return records
    same = ["nbytes", "time_s", "time_in_place_s", "algbw", "busbw"]
    for size, rows in dup.groupby("nbytes"):
        if len(rows[same].astype(str).drop_duplicates()) > 1:
            lines = ", ".join(str(v) for v in rows["line"] if v is not None and v == v)
            times = " and ".join(f"{t * 1e6:g} us" for t in rows["time_s"])
            raise DataError(
                f"{where}{':' + lines.split(',')[0] if lines else ''}: size {size:.0f} B is "
                f"measured {len(rows)} times{f' (lines {lines})' if lines else ''} with "
                f"different results ({times}): which to fit is not known; keep one row per size"
            )
    kept = records[~(records.duplicated(subset=same) & (records["nbytes"] > 0))]
    repeated = len(records) - len(kept)
    noun = "row" if repeated == 1 else "rows"
    notes.append(f"{repeated} repeated {noun} (same size, same numbers) kept once")
    return kept


def _looks_cut(tokens: list[str], layout: _Layout | None) -> bool:
    """A row a cut at the end of the log can leave: fewer columns than the header's, or its last
    column broken off ('N/' of 'N/A'). Without a header, any row that does not parse."""
    if layout is None:
        return True
    return len(tokens) < layout.width or (len(tokens) == layout.width and not _numeric(tokens[-1]))


def _starting_name(lines: list[_Line]) -> str | None:
    for ln in lines:
        if "Collective test starting" in ln.text and (m := _PERF.search(ln.text)):
            return m.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# nccl-tests -J FILE.json (src/util.cu, JSON_FILE_VERSION 1 to 3): one object, written as the test
# runs: version, start_time, args, env, nccl_version, config {nthreads, ngpus, ..., devices:
# [{rank, group, pid, hostname, device, device_hex, device_info}]}, results: [{size, count, type,
# redop, root, out_of_place: {time, alg_bw, bus_bw, nwrong}, in_place: {...}, ...}],
# out_of_bounds, average_bus_bandwidth (version 1: 'average_bus_bandwidith'), errors, end_time.
# Only rank 0 writes it. `devices` has one entry per process (the first of its nthreads * ngpus
# ranks), so a single process driving 8 GPUs (-g 8) lists one device.
# ---------------------------------------------------------------------------------------------


def _json_strict(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def _parse_json(
    path: Path, text: str, op_hint: Op | str | None, allow_truncated: bool
) -> NcclTestsRun:
    decoder = json.JSONDecoder(parse_constant=_json_strict)
    whole = True
    try:
        doc = decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        if not (isinstance(exc, json.JSONDecodeError) and _ends_early(exc, text)):
            where = (
                f"{path}:{exc.lineno}:{exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else str(path)
            )
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise DataError(f"{where}: not valid JSON ({msg}): not an nccl-tests -J file") from None
        if not allow_truncated:
            raise DataError(
                f"{path}:{exc.lineno}: the JSON ends inside its results: a truncated nccl-tests "
                "-J file (--allow-truncated keeps its complete results)"
            ) from None
        doc, whole = _json_prefix(path, text, decoder), False
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise DataError(f"{path}: a JSON file without a 'results' list: not an nccl-tests -J file")
    config = doc.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("devices"), list):
        raise DataError(f"{path}: 'config.devices' missing: cannot tell the rank count")
    hosts, device = _json_ranks(path, config)
    op = _json_op(path, doc, op_hint)
    rows, notes = [], []
    for i, result in enumerate(doc["results"]):
        rows.append(_json_row(path, i, result))
    if not rows:
        raise DataError(f"{path}: {op.value} results are empty (a failed run?)")
    complete = whole and any(k in doc for k in ("average_bus_bandwidth", "average_bus_bandwidith"))
    if not complete:
        notes.append(
            f"the results stop before 'average_bus_bandwidth': truncated run, "
            f"{len(rows)} sizes kept"
        )
    errors = doc.get("errors")
    if isinstance(errors, list) and any(isinstance(e, str) and e for e in errors):
        notes.append(f"nccl-tests reported errors: {'; '.join(str(e) for e in errors)[:200]}")
    records, columns = _op_columns(pd.DataFrame(rows))
    # the file's own columns say which op it measured, as a text log's do
    fix = (f"its args[0] names {op.value}'s test: an edited file?" if _json_binary(doc)
           else _FIX_OP)
    _check_bus_factor(records, op, len(hosts), str(path), fix)
    _check_counts(records, op, len(hosts), str(path), fix)
    notes += _busbw_notes(records, op, len(hosts))
    _check_op_columns(columns, op, str(path), fix)
    bad = records["wrong"] > 0
    if bad.any():
        notes.append(f"{int(bad.sum())} results with nwrong > 0 dropped")
        records = records[~bad]
    if records.empty:
        raise DataError(f"{path}: every one of the {op.value} file's {len(rows)} results has "
                        "nwrong > 0 (nccl-tests found wrong results): nothing to fit")
    records = _distinct_sizes(records, str(path), notes)
    env = doc.get("env")
    env = env if isinstance(env, list) else []
    algo = next(
        (
            e.split("=", 1)[1].strip().strip("\"'").lower()
            for e in env
            if isinstance(e, str)
            and e.startswith("NCCL_ALGO=")
            and e.split("=", 1)[1].strip()
        ),
        None,
    )
    version = doc.get("nccl_version")
    return NcclTestsRun(
        path=path,
        line=1,
        op=op,
        ranks=len(hosts),
        nodes=len(set(hosts)),
        device=device,
        hosts=tuple(sorted(set(hosts))),
        nccl_version=str(version) if _is_int(version) and version > 0 else None,
        nccl_algo=algo,
        records=records.reset_index(drop=True),
        complete=complete,
        notes=notes,
        json=True,
        gpus_per_thread=int(config.get("ngpus", 1)),
        ranks_per_host=tuple(Counter(hosts)[h] for h in sorted(set(hosts))),
    )


def _ends_early(exc: json.JSONDecodeError, text: str) -> bool:
    """The JSON is cut short (not malformed): the decoder ran out of text, inside a string, a
    word (nul, tru, fals) or between tokens."""
    if exc.msg.startswith("Unterminated string"):
        return True
    rest = text[exc.pos :].strip()
    return any(word.startswith(rest) for word in ("null", "true", "false"))


def _json_prefix(path: Path, text: str, decoder: json.JSONDecoder) -> dict:
    """What a -J file cut short still holds: its head and every complete result.

    The writer puts no spaces between tokens; the head ends with ',"results":[' and the results
    are objects separated by commas.
    """
    key = text.find('"results":[')
    if key < 0:
        raise DataError(f"{path}: the JSON ends before its results: nothing to keep")
    try:
        doc = decoder.decode(text[:key].rstrip().rstrip(",") + "}")
    except (ValueError, RecursionError):
        raise DataError(f"{path}: the JSON head before 'results' is not valid") from None
    results, pos = [], key + len('"results":[')
    while True:
        try:
            result, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        results.append(result)
        if text[pos : pos + 1] != ",":
            break
        pos += 1
    if isinstance(doc, dict):
        doc["results"] = results
    return doc


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_ranks(path: Path, config: dict) -> tuple[list[str], str]:
    """The host of every rank, and the device name, from config.devices.

    One entry per process, rank = process * nthreads * ngpus (nccl-tests writeDeviceReport), or
    one per rank (ranks 0..N-1).
    """
    per_process = 1
    for key in ("nthreads", "ngpus"):
        value = config.get(key, 1)
        if not _is_int(value) or not 1 <= value <= 4096:
            raise DataError(f"{path}: config.{key} must be a whole number >= 1, got {value!r}")
        per_process *= value
    devices = config["devices"]
    if not devices:
        raise DataError(f"{path}: config.devices is empty: cannot tell the rank count")
    listed, hosts_of, names = [], [], set()
    for i, d in enumerate(devices):
        if not isinstance(d, dict) or not _is_int(d.get("rank")):
            raise DataError(f"{path}: config.devices[{i}].rank must be a whole number")
        if not isinstance(d.get("hostname"), str) or not d["hostname"]:
            raise DataError(f"{path}: config.devices[{i}].hostname must be a host name")
        listed.append(d["rank"])
        hosts_of.append(d["hostname"])
        if isinstance(d.get("device_info"), str) and d["device_info"].strip():
            names.add(d["device_info"].strip())
    if listed == [i * per_process for i in range(len(listed))]:
        hosts = [h for h in hosts_of for _ in range(per_process)]
    elif listed == list(range(len(listed))):
        hosts = hosts_of
    else:
        raise DataError(
            f"{path}: config.devices ranks are {listed[:5]}..., neither one per process "
            f"(0, {per_process}, ...) nor one per rank: not an nccl-tests -J file"
        )
    return hosts, " / ".join(sorted(names))


def _json_binary(doc: dict) -> str | None:
    """The nccl-tests binary args[0] names (all_reduce, all_gather, ...), if it names one."""
    args = doc.get("args")
    if isinstance(args, list) and args and isinstance(args[0], str):
        if m := _PERF.search(args[0]):
            return m.group(1)
    return None


def _json_op(path: Path, doc: dict, op_hint: Op | str | None) -> Op:
    """The collective: from the binary's name (args[0]), else --op, else the file name. An --op
    that the binary's name contradicts is refused, as in a text log."""
    if (binary := _json_binary(doc)) is not None:
        op = BINARIES[binary]
        if op_hint is not None and Op(op_hint) is not op:
            raise DataError(f"{path}: --op {Op(op_hint).value}, but the file ran {op.value} "
                            f"(its args[0] is {binary}_perf); leave --op out")
        return op
    if op_hint is not None:
        return Op(op_hint)
    if (guess := _op_from_name(path)) is not None:
        return guess
    raise DataError(
        f"{path}: cannot tell which collective this test ran (no '*_perf' binary in 'args' "
        "or the file name); pass --op"
    )


def _json_row(path: Path, i: int, result: Any) -> dict:
    """One result: size, count, type and the out-of-place (and in-place) time, algbw, busbw."""
    where = f"{path}: results[{i}]"
    if not isinstance(result, dict):
        raise DataError(f"{where} must be an object")
    oop = result.get("out_of_place")
    if not isinstance(oop, dict):
        raise DataError(f"{where}.out_of_place is missing: no out-of-place measurement")
    if "time" not in oop and "cpu_time" in oop:
        raise DataError(
            f"{where}.out_of_place: 'cpu_time' (nccl-tests -C 1) is not the collective's time: "
            "run the test without -C"
        )
    inp = result.get("in_place")
    inp = inp if isinstance(inp, dict) else {}
    dtype = result.get("type")
    if _json_optional(inp, "time", f"{where}.in_place") is not None:
        _checked(
            _json_number(result, "size", where),
            _json_number(result, "count", where),
            "",
            _json_number(inp, "time", f"{where}.in_place"),
            None,
            _json_optional(inp, "alg_bw", f"{where}.in_place"),
            _json_optional(inp, "bus_bw", f"{where}.in_place"),
            0.0,
            where,
            line=None,
            half="in-place ",
        )
    redop, root = result.get("redop"), result.get("root")
    record = _checked(
        _json_number(result, "size", where),
        _json_number(result, "count", where),
        dtype if isinstance(dtype, str) else "",
        _json_number(oop, "time", f"{where}.out_of_place"),
        _json_optional(inp, "time", f"{where}.in_place"),
        _json_optional(oop, "alg_bw", f"{where}.out_of_place"),
        _json_optional(oop, "bus_bw", f"{where}.out_of_place"),
        max(_json_optional(oop, "nwrong", f"{where}.out_of_place") or 0.0,
            _json_optional(inp, "nwrong", f"{where}.in_place") or 0.0),
        where,
        line=None,
    )
    if isinstance(root, str) and re.fullmatch(r"\s*-?\d{1,9}\s*", root):
        root = int(root)  # nccl-tests writes it as printed, '    -1'
    return {
        **record,
        "redop": redop if isinstance(redop, str) else None,
        "root": float(root) if _is_int(root) else None,
    }


def _json_optional(obj: dict, key: str, where: str) -> float | None:
    """obj[key] as a float; None where it is absent or null (nccl-tests writes null for a
    '#wrong' it did not check)."""
    return None if obj.get(key) is None else _json_number(obj, key, where)


# what each number of a -J result may be (_checked's ranges), for the message of one that is not
_JSON_RANGES = {
    "size": "a whole number of bytes from 0 to 2^50",
    "count": "a whole number >= 0",
    "time": f"{MIN_TIME_US:g} to {MAX_TIME_US:g} us",
    "alg_bw": f"0 to {MAX_ALGBW_BYTES_PER_S / 1e9:g} GB/s",
    "bus_bw": f"0 to {MAX_ALGBW_BYTES_PER_S / 1e9:g} GB/s",
    "nwrong": "a count >= 0",
}


def _json_number(obj: dict, key: str, where: str) -> float:
    """obj[key], a finite number; DataError naming the field otherwise (nccl-tests writes NaN as
    the string "nan"), also for an integer past what a float holds (JSON reads 10^400 exactly:
    float() of it would raise OverflowError)."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DataError(f"{where}.{key} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise DataError(f"{where}.{key} must be a finite number, got {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int of over 308 digits
        allowed = _JSON_RANGES.get(key, "a finite number")
        digits = int(abs(int(value)).bit_length() * 0.30103) + 1
        raise DataError(f"{where}.{key} is an integer of about {digits} digits, past what a "
                        f"float holds: it must be {allowed}") from None
