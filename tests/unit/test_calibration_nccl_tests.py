"""nccl-tests logs: every real log imports and is reproduced; broken logs fail clearly."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from calibration.cli import calibrate
from calibration.importers import import_nccl_tests
from calibration.nccl_tests import parse_nccl_tests
from perfmodel.errors import DataError
from perfmodel.specs.profile import (
    apply_profile,
    fitted_collective_time,
    is_extrapolation,
    load_profile,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl-tests"
LOGS = sorted(DATA.glob("*.txt"))  # real logs, sources in tests/data/nccl-tests/SOURCES.md


def test_the_shared_logs_are_all_here():
    assert len(LOGS) == 15


@pytest.mark.parametrize("log", LOGS, ids=[p.stem for p in LOGS])
def test_each_real_log_is_reproduced_within_10_percent(log):
    result = import_nccl_tests([log])
    (source,) = result.per_source
    assert source["median_rel_error"] <= 0.10, source
    fit = result.fits[source["fit"]]
    run = parse_nccl_tests(log)[0]
    sizes = run.records.loc[run.records["nbytes"] > 0, "nbytes"]
    assert fit["size_range"] == [sizes.min(), sizes.max()]


@pytest.mark.parametrize(
    ("name", "op", "ranks", "nodes"),
    [
        ("h100x80-10node-sendrecv-nccl-tests-cluster-cluster01.txt", "send_recv", 80, 10),
        ("h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt", "all_reduce", 16, 2),
        ("h100x8-allgather-ring-together-nccl-tests.txt", "all_gather", 8, 1),
        ("a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt", "all_reduce", 16, 2),
    ],
)
def test_header_gives_op_ranks_nodes_and_device(name, op, ranks, nodes):
    (run,) = parse_nccl_tests(DATA / name)
    assert (run.op.value, run.ranks, run.nodes) == (op, ranks, nodes)
    assert run.scope == ("inter" if nodes > 1 else "intra")
    assert "H100" in run.device or "A100" in run.device


def test_size_zero_rows_are_read_but_not_fitted():
    (run,) = parse_nccl_tests(DATA / "h100x8-allgather-ring-together-nccl-tests.txt")
    assert (run.records["nbytes"] == 0).sum() == 4
    result = import_nccl_tests([DATA / "h100x8-allgather-ring-together-nccl-tests.txt"])
    assert result.per_source[0]["n_points"] == 27


def test_in_place_column_and_na_are_read():
    (run,) = parse_nccl_tests(DATA / "h100x8-alltoall-nccl-tests-cluster-cluster01.txt")
    first = run.records.iloc[0]
    # first row of the log: 33554432 B, 124.79 us out-of-place, 123.64 us in-place, #wrong N/A
    assert first["nbytes"] == 33554432
    assert first["time_s"] == pytest.approx(124.79e-6)
    assert first["time_in_place_s"] == pytest.approx(123.64e-6)


def mpirun_style(text):
    """What `mpirun --tag-output` with NCCL_DEBUG=INFO makes of a log."""
    out = []
    for i, line in enumerate(text.splitlines()):
        out.append(f"[1,0]<stdout>:{line}")
        if i % 7 == 3:
            out.append("[1,0]<stdout>:node01:1234:1250 [0] NCCL INFO Channel 00/24 : 0 1 2 3")
    return "\n".join(out) + "\n"


def test_mpirun_prefixes_and_info_lines_do_not_change_the_result(tmp_path):
    src = DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt"
    tagged = tmp_path / "tagged.log"
    tagged.write_text(mpirun_style(src.read_text()))
    (a,), (b,) = parse_nccl_tests(src), parse_nccl_tests(tagged)
    assert (a.op, a.ranks, a.nodes) == (b.op, b.ranks, b.nodes)
    assert a.records["time_s"].tolist() == b.records["time_s"].tolist()


def test_mpi_build_binary_names_are_recognised(tmp_path):
    src = (DATA / "h100x8-alltoall-nccl-tests-cluster-cluster01.txt").read_text()
    log = tmp_path / "run.log"
    log.write_text(src.replace("alltoall_perf", "alltoall_perf_mpi"))
    (run,) = parse_nccl_tests(log)
    assert run.op.value == "all_to_all"


def test_a_log_holding_several_tests_gives_one_run_each(tmp_path):
    names = [
        "h100x8-allreduce-nccl-tests-cluster-cluster01.txt",
        "h100x8-allgather-nccl-tests-cluster-cluster01.txt",
        "h100x8-sendrecv-nccl-tests-cluster-cluster01.txt",
    ]
    combined = tmp_path / "nccl_N1_G8.log"
    combined.write_text("".join((DATA / n).read_text() for n in names))
    runs = parse_nccl_tests(combined)
    assert [r.op.value for r in runs] == ["all_reduce", "all_gather", "send_recv"]


OLD_LAYOUT = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20
#   Rank  0 Pid  11 on  node1 device  0 [0x07] Tesla V100-SXM2-16GB
#   Rank  1 Pid  12 on  node1 device  1 [0x08] Tesla V100-SXM2-16GB
#                                              out-of-place                in-place
#     size      count   type  redop    time  algbw  busbw  error    time  algbw  busbw  error
   1048576     262144  float    sum   40.00  26.21  26.21  1e-07   40.10  26.15  26.15  1e-07
   4194304    1048576  float    sum  120.00  34.95  34.95  1e-07  121.00  34.66  34.66  1e-07
  16777216    4194304  float    sum  440.00  38.13  38.13  1e-07  441.00  38.04  38.04  1e-07
# Avg bus bandwidth    : 33.1
"""


def test_older_format_without_root_and_group_columns(tmp_path):
    """nccl-tests 2.0-era layout: no 'Group', no 'root', 'error' (a float) instead of '#wrong'.

    The rows are made up for the layout (algbw = size / time holds), not a measurement.
    """
    log = tmp_path / "old_all_reduce.log"
    log.write_text(OLD_LAYOUT)
    (run,) = parse_nccl_tests(log)
    assert (run.op.value, run.ranks, len(run.records)) == ("all_reduce", 2, 3)


BROKEN = {
    "empty": ("", "empty file"),
    "garbage": ("hello world\nthis is not a log\n", "no nccl-tests header"),
    "binary": ("\x00\x01\x02" * 50, "binary file"),
    "header only": (
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor)\n"
        "#  Rank  0 Group  0 Pid 1 on h device  0 [0] GPU\n",
        "no data rows",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_broken_logs_raise_data_error(tmp_path, case):
    text, message = BROKEN[case]
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(text)
    with pytest.raises(DataError, match=message):
        parse_nccl_tests(log)


def test_truncated_row_names_its_line(tmp_path):
    src = (DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt").read_text()
    cut = src[: src.index("1048576") + 60]  # the log stops in the middle of a row
    log = tmp_path / "cut.log"
    log.write_text(cut)
    with pytest.raises(DataError, match=r"cut.log:\d+: incomplete"):
        parse_nccl_tests(log)


def test_a_log_cut_between_rows_keeps_the_rows_and_says_so(tmp_path):
    src = (DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt").read_text()
    log = tmp_path / "cut.log"
    log.write_text(src[: src.index("     2097152")])
    (run,) = parse_nccl_tests(log)
    assert not run.complete and "truncated" in run.notes[0]
    assert run.records["nbytes"].max() == 1048576


def test_a_garbled_number_is_refused(tmp_path):
    src = (DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt").read_text()
    log = tmp_path / "bad.log"
    log.write_text(src.replace("   55.76   75.22", "   5x.76   75.22"))
    with pytest.raises(DataError, match="is not a number"):
        parse_nccl_tests(log)


def test_inconsistent_time_and_algbw_are_refused(tmp_path):
    src = (DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt").read_text()
    log = tmp_path / "bad.log"
    log.write_text(src.replace("  326.64  205.45", "  926.64  205.45"))
    with pytest.raises(DataError, match="does not match size/time"):
        parse_nccl_tests(log)


def test_cli_imports_logs_into_a_profile_that_predict_can_use(tmp_path):
    out = tmp_path / "h100.json"
    logs = [
        str(DATA / n)
        for n in (
            "h100x8-allreduce-nccl-tests-cluster-cluster01.txt",
            "h100x80-10node-allreduce-nccl-tests-cluster-cluster01.txt",
            "h100x8-alltoall-nccl-tests-cluster-cluster01.txt",
        )
    ]
    res = CliRunner().invoke(
        calibrate, ["import-nccl-tests", *logs, "--out", str(out), "--base", "dgx-h100"]
    )
    assert res.exit_code == 0, res.output
    profile = load_profile(out)
    assert profile.complete and profile.measurements.exists()
    hw = apply_profile(None, profile)
    assert {(f.op, f.scope) for f in hw.collectives} == {
        ("all_reduce", "intra"),
        ("all_reduce", "inter"),
        ("all_to_all", "intra"),
    }
    assert hw.gpus_per_node == 8 and hw.name == "dgx-h100"
    assert is_extrapolation(profile, "all_reduce", 1e3)  # logs start at 32 MB
    assert not is_extrapolation(profile, "all_reduce", 1e9)


def test_cli_garbage_log_is_one_line_and_exit_code_5(tmp_path):
    log = tmp_path / "junk.txt"
    log.write_text("not a log\n")
    res = CliRunner().invoke(
        calibrate, ["import-nccl-tests", str(log), "--out", str(tmp_path / "p.json")]
    )
    assert res.exit_code == 5
    assert res.output.count("\n") == 1 and "junk.txt" in res.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(
    "name",
    [
        "h100x8-allreduce-nvls-together-nccl-tests.txt",  # one regime
        "h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt",  # two regimes
    ],
)
def test_predict_uses_what_calibration_fitted(tmp_path, run_cli, name):
    """`perfmodel collective --profile` gives the fitted time for a size the log measured."""
    out = tmp_path / "p.json"
    imported = run_cli("calibrate", "import-nccl-tests", DATA / name, "--out", out)
    assert imported.returncode == 0, imported.stderr
    (run,) = parse_nccl_tests(DATA / name)
    row = run.records[run.records["nbytes"] == 1073741824].iloc[0]  # 1 GiB, measured in both logs
    res = run_cli(
        "collective",
        "--op",
        "all_reduce",
        "--bytes",
        "1073741824",
        "--ranks",
        str(run.ranks),
        "--ranks-per-node",
        str(run.ranks // run.nodes),
        "--profile",
        out,
        "--json",
    )
    assert res.returncode == 0, res.stderr
    predicted = json.loads(res.stdout)["time_s"]
    fit = apply_profile(None, load_profile(out)).collectives[0]
    assert predicted == pytest.approx(
        float(fitted_collective_time(fit, "all_reduce", 1073741824, run.ranks)), rel=1e-6
    )
    assert predicted == pytest.approx(row["time_s"], rel=0.10)
