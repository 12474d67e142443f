"""Import paths against mutated real inputs: each case is one a probe found accepted with exit 0.

The inputs are built from the shared logs and sweeps (tests/data/*/SOURCES.md): a real row
repeated, a column garbled, a log renamed to another collective.
"""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from calibration.cli import calibrate
from calibration.importers import import_gemm, import_nccl_tests
from perfmodel.errors import DataError

DATA = Path(__file__).resolve().parents[1] / "data"
ALLREDUCE = DATA / "nccl-tests" / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
ALLGATHER = DATA / "nccl-tests" / "h100x8-allgather-nccl-tests-cluster-cluster01.txt"
REDUCE_SCATTER = DATA / "nccl-tests" / "h100x8-reducescatter-nccl-tests-cluster-cluster01.txt"
SENDRECV = DATA / "nccl-tests" / "h100x8-sendrecv-nccl-tests-cluster-cluster01.txt"
XLA_H100 = DATA / "gemm" / "xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
ROW = re.compile(r"^\s+\d+\s")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    out = tmp_path / name
    out.write_text("".join(lines))
    return out


def _rows(lines: list[str]) -> list[int]:
    return [i for i, ln in enumerate(lines) if ROW.match(ln)]


def _unnamed(lines: list[str]) -> list[str]:
    """The log without its '*_perf' name: the file name (or --op) then says the op."""
    return [re.sub(r"\w+_perf", "", ln) for ln in lines]


def _with_rows(path: Path, rows: list[str]) -> list[str]:
    lines = _lines(path)
    idx = _rows(lines)
    return lines[: idx[0]] + rows + lines[idx[-1] + 1 :]


def _row(size: int, count: int, t_us: float, factor: float = 1.75) -> str:
    alg = size / t_us / 1e3
    cols = f"{t_us:8.2f} {alg:7.2f} {alg * factor:7.2f}      0"
    return f"{size:12d} {count:12d}    double     sum      -1 {cols} {cols}\n"


# item 4: a sweep that never reached the bus term fitted 3e13-3e29 B/s and was written
@pytest.mark.parametrize(
    "times_us",
    [[20.0] * 8, [80.0 - 8 * i for i in range(8)]],
    ids=["flat-latency", "times-fall-as-size-grows"],
)
def test_a_latency_bound_log_writes_no_bus_bandwidth(tmp_path, times_us):
    rows = [_row(8 << i, 1 << i, t) for i, t in enumerate(times_us)]
    log = _write(tmp_path, "allreduce.txt", _with_rows(ALLREDUCE, rows))
    with pytest.raises(DataError, match="no fit resolved a bus bandwidth.*10x"):
        import_nccl_tests([log])


def test_a_latency_bound_log_beside_a_resolved_one_is_noted_not_written(tmp_path):
    # all-gather over 8 ranks: bus factor 7/8, no reduction, a rank's count of doubles printed
    rows = [_row(64 << i, 1 << i, 20.0, 0.875).replace(" sum ", " none ") for i in range(8)]
    flat = _write(tmp_path, "allgather.txt", _with_rows(ALLGATHER, rows))
    result = import_nccl_tests([ALLREDUCE, flat])
    assert [c["op"] for c in result.hardware["collectives"]] == ["all_reduce"]
    assert any("collective/all_gather/intra" in n and "not written" in n for n in result.notes)


# item 6: a table mixing FLOP/s and TFLOP/s fitted a 100% median error and was written
def test_a_gemm_fit_that_misses_its_own_shapes_is_not_written(tmp_path):
    lines = [ln for ln in _lines(XLA_H100) if "bf16xbf16->bf16" in ln or ln.startswith("device")]
    mixed = [lines[0]] + [
        ln if i % 2 else re.sub(r",(\d+)$", lambda m: f",{float(m.group(1)) / 1e12}", ln.strip())
        + "\n"
        for i, ln in enumerate(lines[1:])
    ]
    result = import_gemm([_write(tmp_path, "mixed-units.csv", mixed)])
    assert "gemm_efficiency" not in result.hardware
    assert any("bf16xbf16->bf16" in n and "over 10%" in n for n in result.notes)
    # the clean table still writes its efficiency
    clean = import_gemm([_write(tmp_path, "bf16.csv", lines)])
    assert "bf16" in clean.hardware["gemm_efficiency"]


# item 7: repeated sizes and shapes
def test_a_size_repeated_at_another_time_is_refused_naming_it(tmp_path):
    lines = _lines(ALLREDUCE)
    i = _rows(lines)[1]  # 64 MiB
    slow = lines[i].replace("313.66  213.95  374.42", "627.32  106.98  187.22", 1)
    log = _write(tmp_path, "allreduce.txt", lines[: i + 1] + [slow] + lines[i + 1 :])
    with pytest.raises(DataError, match=r"allreduce.txt:\d+: size 67108864 B is measured 2 times"):
        import_nccl_tests([log])


def test_a_size_repeated_exactly_is_kept_once_with_a_note(tmp_path):
    lines = _lines(ALLREDUCE)
    i = _rows(lines)[1]
    log = _write(tmp_path, "allreduce.txt", lines[: i + 1] + [lines[i]] + lines[i + 1 :])
    result = import_nccl_tests([log])
    assert result.per_source[0]["n_points"] == len(_rows(lines))
    assert any("1 repeated row (same size" in n for n in result.notes)


def test_a_gemm_shape_repeated_at_another_rate_is_refused_naming_it(tmp_path):
    lines = [ln for ln in _lines(XLA_H100) if "bf16xbf16->bf16" in ln or ln.startswith("device")]
    halved = [re.sub(r",(\d+)$", lambda m: f",{int(m.group(1)) // 2}", ln.strip()) + "\n"
              for ln in lines[1:]]
    with pytest.raises(DataError, match=r"dup.csv: .*1x256x256x256 is measured 2 times"):
        import_gemm([_write(tmp_path, "dup.csv", lines + halved)])
    exact = import_gemm([_write(tmp_path, "same.csv", lines + lines[1:])])
    assert any("repeated GEMM shapes" in n for n in exact.notes)
    assert "bf16" in exact.hardware["gemm_efficiency"]


# item 9: 8 + 4 + 4 ranks over 3 hosts wrote gpus_per_node 5 (16 // 3)
def test_uneven_hosts_give_the_largest_host_not_ranks_over_hosts(tmp_path):
    lines = _lines(ALLREDUCE)
    ranks = [i for i, ln in enumerate(lines) if "#  Rank" in ln]
    extra = [
        re.sub(r"Rank\s+\d+", f"Rank {8 + j:2d}", lines[ranks[j % 8]]).replace(
            "cnode3-002", "host-b" if j < 4 else "host-c")
        for j in range(8)
    ]
    body = lines[: ranks[-1] + 1] + extra + lines[ranks[-1] + 1 :]
    # 16 ranks: busbw = algbw x 2 x 15 / 16
    body = [ln if not ROW.match(ln) else _fix_factor(ln, 2 * 15 / 16) for ln in body]
    result = import_nccl_tests([_write(tmp_path, "allreduce.txt", body)])
    assert result.hardware["gpus_per_node"] == 8
    assert any("8 + 4 + 4" in n for n in result.notes)


def _fix_factor(line: str, factor: float) -> str:
    t = line.split()
    for alg, bus in ((6, 7), (10, 11)):
        t[bus] = f"{float(t[alg]) * factor:.2f}"
    return "    " + "  ".join(t) + "\n"


# item 10: the in-place half of a row was not checked
@pytest.mark.parametrize(
    ("column", "value", "match"),
    [(11, "inf", "in-place algbw 'inf'"), (12, "inf", "in-place busbw 'inf'"),
     (12, "-5", "in-place busbw -5 GB/s is negative")],
    ids=["inf-algbw", "inf-busbw", "negative-busbw"],
)
def test_a_garbled_in_place_half_is_refused(tmp_path, column, value, match):
    lines = _lines(ALLREDUCE)
    i = _rows(lines)[0]
    t = lines[i].split()
    t[column - 1] = value
    lines[i] = "    " + "  ".join(t) + "\n"
    with pytest.raises(DataError, match=match):
        import_nccl_tests([_write(tmp_path, "allreduce.txt", lines)])


def test_a_row_wrong_in_place_is_dropped(tmp_path):
    lines = _lines(ALLREDUCE)
    i = _rows(lines)[0]
    t = lines[i].split()
    t[12] = "5"
    lines[i] = "    " + "  ".join(t) + "\n"
    result = import_nccl_tests([_write(tmp_path, "allreduce.txt", lines)])
    assert result.per_source[0]["n_points"] == len(_rows(lines)) - 1
    assert any("1 row with #wrong > 0 dropped" in n for n in result.notes)


# item 11: equal bus factors (all_gather and reduce_scatter; sendrecv and broadcast)
@pytest.mark.parametrize(
    ("log", "name", "match"),
    [
        (REDUCE_SCATTER, "h100x8-allgather.txt", "reduction sum, which all_gather"),
        (ALLGATHER, "h100x8-reducescatter.txt", "no reduction, which reduce_scatter"),
        (SENDRECV, "h100x8-broadcast.txt", "which broadcast"),
    ],
    ids=["rs-as-ag", "ag-as-rs", "sendrecv-as-broadcast"],
)
def test_a_log_named_after_an_op_with_its_bus_factor_is_refused(tmp_path, log, name, match):
    renamed = _write(tmp_path, name, _unnamed(_lines(log)))
    with pytest.raises(DataError, match=match):
        import_nccl_tests([renamed])


# item 13: every row #wrong gave 'all_reduce/intra: need at least 2 ...', no file, no reason
def test_a_log_whose_rows_are_all_wrong_names_the_file_and_why(tmp_path):
    lines = _lines(ALLREDUCE)
    for i in _rows(lines):
        t = lines[i].split()
        t[8] = "3"
        lines[i] = "    " + "  ".join(t) + "\n"
    log = _write(tmp_path, "allreduce.txt", lines)
    with pytest.raises(DataError, match=r"allreduce.txt:\d+: every one of .* #wrong > 0"):
        import_nccl_tests([log])
    out = CliRunner().invoke(calibrate, ["import-nccl-tests", str(log), "--out",
                                         str(tmp_path / "p.json")])
    assert out.exit_code == 5
