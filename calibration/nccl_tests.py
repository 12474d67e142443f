"""Reading nccl-tests output (github.com/NVIDIA/nccl-tests): all_reduce_perf, all_gather_perf, ...

A log may hold several tests (one section per `# nThread ...` header), mpirun/srun line prefixes
(`[1,0]<stdout>:`, `0: `) and interleaved `NCCL INFO` lines. From each section we read the
collective, the ranks and hosts (`#  Rank ... on HOST device ... NAME` lines) and the rows
size, count, type, redop, [root,] then time/algbw/busbw/#wrong out-of-place and in-place.
Every row is checked (algbw = size / time), so a garbled log is refused, never half-read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.costs.collectives import Op
from perfmodel.errors import DataError

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
_PREFIX = re.compile(r"^(\[\d+,\d+\]<\w+>:|\s*\d+:\s)")
_PERF = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv|broadcast|reduce|"
    r"hypercube)_perf(?:_mpi)?\b"  # the MPI build of nccl-tests names its binaries *_perf_mpi
)
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+"
    r"device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$"
)
_VERSION = re.compile(r"nccl-library=(\d+)")
_ALGO = re.compile(r"NCCL_ALGO set by environment to (\w+)", re.I)
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
    """One test section of an nccl-tests log."""

    path: Path
    line: int  # line of the section's `# nThread` header
    op: Op
    ranks: int
    nodes: int
    device: str
    hosts: tuple[str, ...]
    nccl_version: str | None
    nccl_algo: str | None
    records: pd.DataFrame  # nbytes, count, type, time_s, time_in_place_s, algbw, busbw, wrong, line
    complete: bool  # the section reached its `# Avg bus bandwidth` line
    notes: list[str] = field(default_factory=list)

    @property
    def scope(self) -> str:
        return "inter" if self.nodes > 1 else "intra"


def _number(token: str, path: Path, lineno: int, what: str) -> float | None:
    if token.upper() == "N/A":
        return None
    try:
        return float(token)
    except ValueError:
        raise DataError(
            f"{path}:{lineno}: {what} '{token}' is not a number (garbled nccl-tests row)"
        ) from None


def _row(tokens: list[str], path: Path, lineno: int) -> dict:
    """size count type [redop] [root] (time algbw busbw [#wrong]) x2.

    Older nccl-tests print no root column, and no redop column for gathers.
    """
    rest = tokens[3:]
    if rest and not _numeric(rest[0]):  # redop
        rest = rest[1:]
    if len(rest) in (7, 9):  # with root column
        rest = rest[1:]
    if len(rest) == 8:
        oop, inp = rest[:4], rest[4:]
    elif len(rest) == 6:
        oop, inp = rest[:3] + ["0"], rest[3:] + ["0"]
    else:
        raise DataError(
            f"{path}:{lineno}: incomplete or unknown nccl-tests row ({len(tokens)} "
            "columns; expected size count type redop root, then time algbw busbw "
            "#wrong out-of-place and in-place): truncated log?"
        )
    size = _number(tokens[0], path, lineno, "size")
    count = _number(tokens[1], path, lineno, "count")
    t_out = _number(oop[0], path, lineno, "time")
    if size is None or count is None or t_out is None:
        raise DataError(f"{path}:{lineno}: size, count and out-of-place time must be numbers")
    t_in = _number(inp[0], path, lineno, "in-place time")
    algbw = _number(oop[1], path, lineno, "algbw")
    busbw = _number(oop[2], path, lineno, "busbw")
    wrong = _number(oop[3], path, lineno, "#wrong") or 0.0
    if size < 0 or t_out <= 0:
        raise DataError(
            f"{path}:{lineno}: size must be >= 0 and time > 0, got {tokens[0]} and {oop[0]}"
        )
    if algbw is not None and algbw >= 1.0:  # nccl-tests prints algbw = size / time (GB/s, us)
        expected = size / (t_out * 1e-6) / 1e9
        if abs(expected / algbw - 1) > 0.05:
            raise DataError(
                f"{path}:{lineno}: algbw {algbw} GB/s does not match size/time = "
                f"{expected:.2f} GB/s: not a consistent nccl-tests row"
            )
    return {
        "nbytes": size,
        "count": count,
        "type": tokens[2],
        "time_s": t_out * 1e-6,
        "time_in_place_s": None if t_in is None else t_in * 1e-6,
        "algbw": algbw,
        "busbw": busbw,
        "wrong": wrong,
        "line": lineno,
    }


def _numeric(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return token.upper() == "N/A"
    return True


def _is_row(tokens: list[str]) -> bool:
    return len(tokens) >= 9 and tokens[0].isdigit() and tokens[1].isdigit()


def _op_from_name(path: Path) -> Op | None:
    name = path.name.lower().replace("-", "_")
    squashed = name.replace("_", "")
    for hint, op in _NAME_HINTS:
        if hint in name or hint.replace("_", "") in squashed:
            return op
    return None


def parse_nccl_tests(path: str | Path, op: Op | str | None = None) -> list[NcclTestsRun]:
    """Every test section of an nccl-tests log; DataError naming file and line if it is not one.

    op: the collective when the log does not say (no `*_perf` name in it or in the file name).
    """
    path = Path(path)
    try:
        from perfmodel.files import read_bytes_bounded  # a regular file of at most 16 MiB

        raw = read_bytes_bounded(path, "", error=DataError)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror})") from None
    if not raw.strip():
        raise DataError(f"{path}: empty file, not an nccl-tests log")
    if b"\x00" in raw[:4096]:
        raise DataError(f"{path}: binary file, not an nccl-tests log")
    lines = [_PREFIX.sub("", line, count=1) for line in raw.decode("utf-8", "replace").splitlines()]
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("# nThread")]
    if not starts:
        raise DataError(
            f"{path}: no nccl-tests header ('# nThread ... minBytes ... maxBytes') "
            "found: not an nccl-tests log"
        )
    runs = []
    for j, start in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(lines)
        prev_end = starts[j - 1] + 1 if j else 0
        runs.append(_section(path, lines, start, end, prev_end, op))
    return runs


def _section(
    path: Path, lines: list[str], start: int, end: int, prev_end: int, op_hint: Op | str | None
) -> NcclTestsRun:
    names, hosts, devices, algo, version = [], {}, set(), None, None
    # the preamble (text since the previous section's rows) names the binary and the version
    preamble_start = prev_end
    for i in range(start - 1, prev_end - 1, -1):
        if _is_row(lines[i].split()):
            preamble_start = i + 1
            break
    for line in lines[preamble_start : start + 1]:
        names += _PERF.findall(line)
        if m := _VERSION.search(line):
            version = m.group(1)
    rows, complete, notes = [], False, []
    for i in range(start, end):
        line = lines[i]
        if "NCCL INFO" in line or "NCCL WARN" in line:
            if m := _ALGO.search(line):
                algo = m.group(1).lower()
            continue
        if m := _RANK.match(line.strip()):
            hosts[int(m.group(1))] = m.group(2)
            devices.add(m.group(3))
            continue
        if "Avg bus bandwidth" in line:
            complete = True
            continue
        tokens = line.split()
        if tokens and tokens[0].isdigit() and not line.lstrip().startswith("#"):
            if complete:  # rows after the summary belong to no test
                continue
            rows.append(_row(tokens, path, i + 1))
    name = _starting_name(lines[preamble_start:end]) or (names[-1] if names else None)
    if name is not None:
        op = BINARIES[name]
    elif op_hint is not None:
        op = Op(op_hint)
    elif (guess := _op_from_name(path)) is not None:
        op = guess
    else:
        raise DataError(
            f"{path}:{start + 1}: cannot tell which collective this test ran (no "
            "'*_perf' name in the log or the file name); pass --op"
        )
    if not hosts:
        raise DataError(
            f"{path}:{start + 1}: no '#  Rank N Group G Pid P on HOST device D [...] "
            "NAME' lines: cannot tell the rank count"
        )
    if not rows:
        raise DataError(
            f"{path}:{start + 1}: {op.value} section has no data rows (truncated or failed run?)"
        )
    if not complete:
        notes.append(
            f"section at line {start + 1} ends before '# Avg bus bandwidth': "
            f"truncated run, {len(rows)} sizes kept"
        )
    records = pd.DataFrame(rows)
    # '#wrong' counts wrong elements; older logs print 'error', a float max-abs error instead
    counts_wrong = any("#wrong" in line for line in lines[start:end])
    bad = (records["wrong"] > 0) if counts_wrong else pd.Series(False, index=records.index)
    if bad.any():
        notes.append(f"{int(bad.sum())} rows with #wrong > 0 dropped")
        records = records[~bad]
    n_ranks = len(hosts)
    if sorted(hosts) != list(range(n_ranks)):
        raise DataError(
            f"{path}:{start + 1}: rank lines are not 0..N-1 (got {sorted(hosts)[:5]}"
            "...): truncated header?"
        )
    return NcclTestsRun(
        path=path,
        line=start + 1,
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
    )


def _starting_name(lines: list[str]) -> str | None:
    for line in lines:
        if "Collective test starting" in line and (m := _PERF.search(line)):
            return m.group(1)
    return None
