"""Write the derived nccl-tests files of this folder from two of the shared real logs.

Run from the repository root: python tests/data/nccl-tests/derived/make_derived.py
Every number (sizes, times, algbw, busbw, #wrong, ranks, hosts, pids, devices) is copied from the
source log. What is added is the shape a real run gives them: Open MPI's --tag-output tags and the
ways it breaks lines, NCCL_DEBUG=INFO lines (their text written in NCCL's format for this file,
not captured from the run), CRLF line ends, a cut, and nccl-tests' -J JSON layout (src/util.cu,
JSON_FILE_VERSION 3). SOURCES.md says which file comes from which log.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent
A3MEGA = SHARED / "h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt"
TOGETHER = SHARED / "h100x8-allreduce-nvls-together-nccl-tests.txt"
RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
    r"\[([^\]]*)\]\s+(.+?)\s*$"
)


def ranks(text: str) -> list[tuple[int, int, int, str, int, str, str]]:
    """(rank, group, pid, host, device, device_hex, device name) of every `# Rank` line."""
    out = []
    for line in text.splitlines():
        if m := RANK.match(line):
            r, g, pid, host, dev, hexid, name = m.groups()
            out.append((int(r), int(g), int(pid), host, int(dev), hexid, name))
    return out


def info(rank: tuple, tid_offset: int, message: str) -> str:
    """An NCCL debug line as src/debug.cc writes it: 'HOST:PID:TID [DEV] NCCL INFO ...'."""
    _, _, pid, host, dev, _, _ = rank
    return f"{host}:{pid}:{pid + tid_offset} [{dev}] NCCL INFO {message}\n"


def tag_output() -> str:
    """mpirun --tag-output -np 16 with NCCL_DEBUG=INFO, of the A3 Mega all-reduce log.

    Open MPI tags every chunk of a rank's output and every line in it ('[1,R]<stdout>:'); a chunk
    that does not end a line is continued by the next chunk of the same rank, with its own tag,
    maybe after other ranks' chunks on the same file line (orte/prte iof_base_output.c). Rank 0
    prints the log; every rank prints NCCL's lines. Three rows are broken as real runs break them:
    the first row by NCCL's messages of the first collective (nccl-tests prints a row in pieces),
    the 1 MiB row by another rank's chunk in the middle of a number, the 256 MiB row by a chunk
    boundary of rank 0's own output.
    """
    text = A3MEGA.read_text()
    rk = ranks(text)
    out: list[str] = []

    def put(r: int, chunk: str) -> None:
        out.append(f"[1,{r}]<stdout>:{chunk}")

    for r in (0, 8, 3, 12, 1, 15):  # NCCL's start-up lines, interleaved as ranks start
        put(r, info(rk[r], 0, "cudaDriverVersion 12020"))
        put(r, info(rk[r], 0, "Bootstrap : Using eth0"))
    for line in text.splitlines(keepends=True):
        if line.startswith("           8             2"):  # the first row
            # printed as '%12li  %12li  %8s  %6s  %6s' (ends at the root column), then the times;
            # NCCL's lines go to the same stdio buffer: glued to the root column, one chunk
            head, tail = line[:52], line[52:]
            assert head.endswith("-1"), head
            out.append(f"[1,0]<stdout>:{head}")
            out.append(info(rk[0], 51, "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"))
            put(0, info(rk[0], 51, "Connected all rings, use ring PXN 0 GDR 1"))
            put(0, tail)
            put(9, info(rk[9], 51, "Connected all rings, use ring PXN 0 GDR 1"))
            continue
        if line.startswith("     1048576"):  # another rank's chunk in the middle of '203.2'
            cut = line.index("203.2") + 2
            out.append(f"[1,0]<stdout>:{line[:cut]}")
            put(9, info(rk[9], 60, "comm 0x5566 rank 9 nRanks 16 nNodes 2 localRanks 8"))
            put(0, line[cut:])
            continue
        if line.startswith("   268435456"):  # rank 0's own chunk boundary inside the row
            cut = line.index("113.70") + 6
            out.append(f"[1,0]<stdout>:{line[:cut]}[1,0]<stdout>:{line[cut:]}")
            continue
        put(0, line)
        if line.startswith("#  Rank 15"):
            for r in (4, 11):
                put(r, info(rk[r], 0, f"comm 0x5566 rank {r} nRanks 16 nNodes 2 localRanks 8"))
    return "".join(out)


def crlf() -> str:
    """The together all-reduce log with CRLF line ends (a log copied through Windows)."""
    return TOGETHER.read_text().replace("\n", "\r\n")


def cut_mid_row() -> str:
    """The together all-reduce log as a run killed while printing its 1 GiB row leaves it: the
    row's out-of-place columns printed, its in-place ones not (nccl-tests prints them apart)."""
    text = TOGETHER.read_text()
    row = text.index("  1073741824")
    # size count type redop root, then the out-of-place time algbw busbw #wrong: 9 columns
    nine = re.match(r"(?:\s*\S+){9}", text[row:])
    assert nine is not None
    return text[: row + nine.end()]


def json_of(path: Path, args: list[str], env: list[str], start: str, end: str) -> str:
    """nccl-tests -J output (src/util.cu, JSON_FILE_VERSION 3) with the numbers of a text log.

    The writer prints no spaces, doubles as printf("%lf"), one `devices` entry per process (the
    first of its nThread * nGpus ranks), `nwrong` as a double, and `root` as the '%6i' string.
    """
    text = path.read_text()
    head = re.search(
        r"# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\(factor\) "
        r"warmup iters: (\d+) iters: (\d+) agg iters: (\d+) validation: (\d+) graph: (\d+)",
        text,
    )
    assert head is not None, path
    nthread, ngpus, lo, hi, step, warm, iters, agg, valid, graph = map(int, head.groups())
    version = re.search(r"nccl-library=(\d+)", text)
    per_process = nthread * ngpus
    devices = [d for d in ranks(text) if d[0] % per_process == 0]

    def s(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def f(value: str) -> str:
        return f"{float(value):f}"  # printf("%lf")

    parts = [
        '{"version":3',
        f'"start_time":{s(start)}',
        '"args":[' + ",".join(map(s, args)) + "]",
        '"env":[' + ",".join(map(s, env)) + "]",
        f'"nccl_version":{int(version.group(1)) if version else 0}',
    ]
    config = (
        f'"config":{{"nthreads":{nthread},"ngpus":{ngpus},"minimum_bytes":{lo},'
        f'"maximum_bytes":{hi},"step_factor":{step},"warmup_iters":{warm},'
        f'"iterations":{iters},"aggregated_iterations":{agg},"validation":{valid},'
        f'"graph":{graph},"blocking_collectives":"false","per_iter_timing":"false",'
        '"per_iter_skip":0,"parallel_init":"false","devices":['
        + ",".join(
            f'{{"rank":{r},"group":{g},"pid":{pid},"hostname":{s(host)},"device":{dev},'
            f'"device_hex":{s(hexid)},"device_info":{s(name)}}}'
            for r, g, pid, host, dev, hexid, name in devices
        )
        + "]}"
    )
    parts.append(config)
    results = []
    for line in text.splitlines():
        tok = line.split()
        if len(tok) != 13 or not tok[0].isdigit():
            continue
        size, count, dtype, redop, root = tok[:5]
        oop = (
            f'{{"time":{f(tok[5])},"alg_bw":{f(tok[6])},"bus_bw":{f(tok[7])},"nwrong":{f(tok[8])}}}'
        )
        inp = (
            f'{{"time":{f(tok[9])},"alg_bw":{f(tok[10])},"bus_bw":{f(tok[11])},'
            f'"nwrong":{f(tok[12])}}}'
        )
        results.append(
            f'{{"size":{size},"count":{count},"type":{s(dtype)},"redop":{s(redop)},'
            f'"root":{s(f"{int(root):6d}")},"out_of_place":{oop},"in_place":{inp},'
            f'"actual_iterations":{iters},"experiment_name":""}}'
        )
    parts.append('"results":[' + ",".join(results) + "]")
    oob = re.search(r"# Out of bounds values : (\d+)", text)
    avg = re.search(r"# Avg bus bandwidth\s+: (\S+)", text)
    assert oob is not None and avg is not None, path
    okay = '"true"' if oob.group(1) == "0" else '"false"'
    parts.append(f'"out_of_bounds":{{"count":{oob.group(1)},"okay":{okay}}}')
    parts.append(f'"average_bus_bandwidth":{{"bandwidth":{f(avg.group(1))},"okay":"unchecked"}}')
    parts.append('"errors":[]')
    parts.append(f'"end_time":{s(end)}}}')
    return ",".join(parts)


FILES = {
    "h100x16-2node-a3mega-allreduce.tag-output.log": tag_output,
    "h100x8-allreduce-nvls-together.crlf.log": crlf,
    "h100x8-allreduce-nvls-together.cut-mid-row.log": cut_mid_row,
    "h100x8-allreduce-nvls-together.json": lambda: json_of(
        TOGETHER,
        [
            "./build/all_reduce_perf",
            "-b",
            "8",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            "8",
            "-J",
            "all_reduce.json",
        ],
        [],
        "2026-03-05 22:09:44",
        "2026-03-05 22:09:44",
    ),
    "h100x16-2node-a3mega-allreduce.json": lambda: json_of(
        A3MEGA,
        [
            "./build/all_reduce_perf",
            "-b",
            "8",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            "1",
            "-J",
            "all_reduce.json",
        ],
        [],
        "2025-04-02 00:00:00",
        "2025-04-02 00:00:00",
    ),
}


def main() -> None:
    for name, make in FILES.items():
        (HERE / name).write_bytes(make().encode())
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
