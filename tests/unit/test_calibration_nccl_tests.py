"""nccl-tests logs: every real log imports and is reproduced; broken logs fail clearly."""

import json
import os
import re
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


# --- real shapes of nccl-tests output (issue 14, item 10) ------------------------------------
# Files in tests/data/nccl-tests/derived/ carry the numbers of two shared logs in the shapes real
# runs give them (derived/SOURCES.md; written by derived/make_derived.py).
DERIVED = DATA / "derived"
A3MEGA = DATA / "h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt"
TOGETHER = DATA / "h100x8-allreduce-nvls-together-nccl-tests.txt"
SAME_AS_SOURCE = {
    "h100x16-2node-a3mega-allreduce.tag-output.log": A3MEGA,
    "h100x16-2node-a3mega-allreduce.json": A3MEGA,
    "h100x8-allreduce-nvls-together.crlf.log": TOGETHER,
    "h100x8-allreduce-nvls-together.json": TOGETHER,
}


@pytest.mark.parametrize("name", SAME_AS_SOURCE, ids=list(SAME_AS_SOURCE))
def test_each_shape_imports_to_the_fit_of_its_plain_log(name):
    if "crlf" in name:
        assert (DERIVED / name).read_bytes().count(b"\r\n") == len(
            TOGETHER.read_text().splitlines()
        )
    derived, plain = import_nccl_tests([DERIVED / name]), import_nccl_tests([SAME_AS_SOURCE[name]])
    assert list(derived.fits) == list(plain.fits)
    for key, fit in plain.fits.items():
        assert derived.fits[key]["params"] == pytest.approx(fit["params"], rel=1e-12)
        assert derived.fits[key]["size_range"] == fit["size_range"]
    (a,), (b,) = parse_nccl_tests(DERIVED / name), parse_nccl_tests(SAME_AS_SOURCE[name])
    for what in ("op", "ranks", "nodes", "hosts", "device"):
        assert getattr(a, what) == getattr(b, what), what
    assert a.records["nbytes"].tolist() == b.records["nbytes"].tolist()
    assert a.records["time_s"].tolist() == pytest.approx(b.records["time_s"].tolist(), rel=1e-12)
    assert a.records["time_in_place_s"].tolist() == pytest.approx(
        b.records["time_in_place_s"].tolist(), rel=1e-12
    )
    assert a.complete and not a.notes


def test_tag_output_rows_broken_mid_line_are_put_back_together():
    """The three rows make_derived.py broke: by rank 0's own NCCL INFO lines (8 B), by rank 9's
    chunk inside '203.2' (1 MiB) and by a chunk boundary of rank 0 (256 MiB)."""
    (run,) = parse_nccl_tests(DERIVED / "h100x16-2node-a3mega-allreduce.tag-output.log")
    by_size = run.records.set_index("nbytes")
    assert by_size.loc[8, "time_s"] == pytest.approx(135.8e-6)  # source log: 135.8 us
    assert by_size.loc[1048576, "time_s"] == pytest.approx(203.2e-6)  # 203.2 us
    assert by_size.loc[268435456, "busbw"] == pytest.approx(213.19)  # 213.19 GB/s


def _tagged(text, rank=0, space=""):
    return "".join(f"[1,{rank}]<stdout>:{space}{line}" for line in text.splitlines(True))


def test_open_mpi_5_tags_with_a_space_and_timestamps_and_srun_labels(tmp_path):
    src = TOGETHER.read_text()
    plain = parse_nccl_tests(TOGETHER)[0].records
    shapes = {
        "spaced.log": _tagged(src, space=" "),
        "stamped.log": "".join(
            f"Thu Mar  5 22:09:44 2026[1,0]<stdout>:{line}" for line in src.splitlines(True)
        ),
        "srun.log": "".join(f"0: {line}" for line in src.splitlines(True)),
    }
    for name, text in shapes.items():
        (tmp_path / name).write_text(text)
        (run,) = parse_nccl_tests(tmp_path / name)
        assert run.records["time_s"].tolist() == plain["time_s"].tolist(), name


def test_an_info_line_glued_into_a_row_without_mpirun(tmp_path):
    """A single process (-g 8): NCCL's first-call lines land between a row's printed pieces."""
    src = TOGETHER.read_text()
    row = "           8             2     float     sum      -1"
    glued = src.replace(
        row,
        row + "gpu-dp-2jvzl-pqq7p:1595772:1595801 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via "
        "P2P/CUMEM/read\ngpu-dp-2jvzl-pqq7p:1595772:1595801 [0] NCCL INFO Connected all rings\n",
    )
    log = tmp_path / "all_reduce.log"
    log.write_text(glued)
    (run,), (plain,) = parse_nccl_tests(log), parse_nccl_tests(TOGETHER)
    assert run.records["time_s"].tolist() == plain.records["time_s"].tolist()


def test_truncated_log_refused_in_one_line_without_the_flag_and_kept_with_it(tmp_path, run_cli):
    log = DERIVED / "h100x8-allreduce-nvls-together.cut-mid-row.log"
    out = tmp_path / "p.json"
    refused = run_cli("calibrate", "import-nccl-tests", log, "--out", out)
    assert refused.returncode == 5 and not out.exists()
    assert refused.stderr.count("\n") == 1
    assert f"{log.name}:45:" in refused.stderr and "--allow-truncated" in refused.stderr
    kept = run_cli("calibrate", "import-nccl-tests", log, "--out", out, "--allow-truncated")
    assert kept.returncode == 0, kept.stderr
    assert "line 45 is cut mid-line" in " ".join(kept.stdout.split())
    # the rows before the cut, fitted, are the source log's first 27 rows (8 B to 512 MiB), fitted
    src = TOGETHER.read_text()
    between = tmp_path / "all_reduce_cut_between_rows.log"
    between.write_text(src[: src.index("  1073741824")])
    expected = import_nccl_tests([between], allow_truncated=True)
    got = load_profile(out)
    (key,) = expected.fits
    assert got.fits[key]["params"] == pytest.approx(expected.fits[key]["params"], rel=1e-12)
    assert expected.fits[key]["size_range"] == [8, 536870912]


def test_a_cut_row_must_be_the_last_one(tmp_path):
    """An 11-column row (the in-place busbw and #wrong lost) in the middle of a log is garbled,
    not cut: refused even under allow_truncated. (Without the column header's 13 columns it
    used to be read as a row without root and #wrong, its in-place time 0.)"""
    src = TOGETHER.read_text()
    line = next(x for x in src.splitlines() if x.lstrip().startswith("1048576 "))
    log = tmp_path / "all_reduce.log"
    log.write_text(src.replace(line, " ".join(line.split()[:11])))
    with pytest.raises(
        DataError, match=r"all_reduce.log:\d+: incomplete or unknown nccl-tests row \(11 columns"
    ):
        parse_nccl_tests(log, allow_truncated=True)


def test_tagged_log_cut_inside_rank_0s_line(tmp_path):
    """mpirun killed: the last chunk of rank 0 ends mid-row, other ranks' lines come after it."""
    src = _tagged(TOGETHER.read_text())
    killed = "[1,3]<stderr>:mpirun noticed that process rank 3 exited on signal 9\n"
    cut = src[: src.index("  1073741824") + 30] + killed
    log = tmp_path / "all_reduce.log"
    log.write_text(cut)
    with pytest.raises(DataError, match="truncated log"):
        parse_nccl_tests(log)
    (run,) = parse_nccl_tests(log, allow_truncated=True)
    assert run.records["nbytes"].max() == 536870912 and not run.complete


def test_truncated_json_refused_without_the_flag_and_keeps_its_results_with_it(tmp_path):
    text = (DERIVED / "h100x8-allreduce-nvls-together.json").read_text()
    log = tmp_path / "all_reduce.json"
    log.write_text(text[: text.index('{"size":1073741824') + 50])  # killed while writing 1 GiB
    with pytest.raises(DataError, match="truncated nccl-tests -J file"):
        import_nccl_tests([log], allow_truncated=False)
    (run,) = parse_nccl_tests(log, allow_truncated=True)
    assert run.json and not run.complete
    assert run.records["nbytes"].max() == 536870912 and len(run.records) == 27


def test_json_fields(tmp_path):
    """args[0] names the collective, env's NCCL_ALGO the algorithm; nwrong > 0 drops a result.
    (The results are made an all_gather's, busbw = algbw x 7/8 and no reduction: a -J file's
    columns are checked against its op as a text log's are.)"""
    doc = json.loads((DERIVED / "h100x8-allreduce-nvls-together.json").read_text())
    doc["args"][0] = "/opt/nccl-tests/build/all_gather_perf_mpi"
    for result in doc["results"]:
        result["redop"] = "none"
        result["count"] = result["size"] // (4 * 8)  # a rank's floats, as all_gather prints them
        result["size"] = result["count"] * 4 * 8
        for half in ("out_of_place", "in_place"):
            result[half]["bus_bw"] = round(result[half]["alg_bw"] * 7 / 8, 2)
    doc["env"] = ["PATH=/usr/bin", "NCCL_ALGO=Tree"]
    doc["results"][3]["out_of_place"]["nwrong"] = 12.0
    log = tmp_path / "run.json"
    log.write_text(json.dumps(doc))
    (run,) = parse_nccl_tests(log)
    assert (run.op.value, run.nccl_algo, run.ranks) == ("all_gather", "tree", 8)
    assert len(run.records) == 30 and "nwrong > 0" in run.notes[0]


@pytest.mark.parametrize(("algo", "noted"), [("CollNetDirect", False), ("Foo", True)])
def test_every_nccl_algo_gets_a_fit_form(tmp_path, algo, noted):
    """NCCL_ALGO=CollNetDirect ended in a traceback (exit 1); one perfmodel does not know is
    fitted as ring and says so."""
    src = TOGETHER.read_text()
    log = tmp_path / "all_reduce.log"
    info = f"h1:1:1 [0] NCCL INFO NCCL_ALGO set by environment to {algo}"
    log.write_text(src.replace("# Using devices\n", f"# Using devices\n{info}\n"))
    result = import_nccl_tests([log])
    assert list(result.fits) == ["collective/all_reduce/intra/ring"]
    assert any(algo.lower() in n and "fitted as ring" in n for n in result.notes) == noted


def test_logs_of_one_collective_with_two_algorithms_are_refused(tmp_path):
    """perfmodel holds one fit per op and scope (a ring and a tree fit were mixed, issue 15): the
    import says so instead of writing a profile it would then refuse."""
    src = TOGETHER.read_text()
    logs = []
    for algo in ("Ring", "Tree"):
        log = tmp_path / f"all_reduce_{algo}.log"
        info = f"h1:1:1 [0] NCCL INFO NCCL_ALGO set by environment to {algo}"
        log.write_text(src.replace("# Using devices\n", f"# Using devices\n{info}\n"))
        logs.append(log)
    with pytest.raises(DataError, match="the all_reduce intra-node logs ran ring and tree "
                                        r"\(NCCL_ALGO\): perfmodel holds one fit per op and scope"):
        import_nccl_tests(logs)
    assert list(import_nccl_tests(logs, algorithm="ring").fits) == [
        "collective/all_reduce/intra/ring"]


BAD_FILES = {
    "json without results": ('{"version": 3, "config": {}}', "without a 'results' list"),
    "json garbage": ('{"results": [1, 2', "truncated nccl-tests -J file"),
    "json not json": ("{oops", "not valid JSON"),
    "json nan": (
        json.dumps(
            {
                "args": ["all_reduce_perf"],
                "config": {"devices": [{"rank": 0, "hostname": "h", "device_info": "GPU"}]},
                "results": [{"size": 8, "count": 2, "out_of_place": {"time": "nan"}}],
            }
        ),
        r"results\[0\].out_of_place.time must be a number, got 'nan'",
    ),
    "json Infinity": ('{"results": [Infinity]}', "Infinity is not a JSON number"),
    "json deep": ("{" + '"a":[' * 100000, "not valid JSON"),
    "cputime": (
        TOGETHER.read_text().replace("root     time", "root  cputime"),
        "CPU time",
    ),
    "tags only": ("[1,0]<stdout>:hello\n[1,1]<stdout>:world\n", "not an nccl-tests log"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_bad_shapes_are_one_line_data_errors(tmp_path, case):
    text, message = BAD_FILES[case]
    log = tmp_path / "all_reduce_perf.log"
    log.write_text(text)
    out = tmp_path / "p.json"
    res = CliRunner().invoke(calibrate, ["import-nccl-tests", str(log), "--out", str(out)])
    assert res.exit_code == 5, res.output
    assert res.output.count("\n") == 1 and re.search(message, res.output), res.output
    assert not out.exists()


def test_a_file_over_16_mib_and_dev_zero_are_refused_after_a_bounded_read(tmp_path):
    big = tmp_path / "big.log"
    with big.open("wb") as f:  # sparse: 17 MiB of nothing on disk
        f.truncate(17 * 2**20)
    with pytest.raises(DataError, match="larger than the 16 MiB limit"):
        parse_nccl_tests(big)
    with pytest.raises(DataError, match="/dev/zero: is a character device"):
        parse_nccl_tests(Path("/dev/zero"))


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "all_reduce.log"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is a FIFO"):
        parse_nccl_tests(fifo)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("   36.22    0.00", "   1e-300    0.00", "time must be from 0.001 us"),
        ("           8             2", "1000000000000000000000 2", "size must be a whole number"),
        ("   34.72    0.00", "   1e+11    0.00", "time must be from"),
        ("  31372.3  273.81", "     50.0  273.81", "above 100 TB/s"),  # 8 GiB in 50 us
    ],
)
def test_numbers_no_measurement_can_have_are_refused(tmp_path, old, new, message):
    """They reached the fit and ended in ZeroDivisionError or a scipy ValueError (the fuzzer)."""
    src = TOGETHER.read_text()
    assert old in src
    log = tmp_path / "all_reduce.log"
    log.write_text(src.replace(old, new, 1))
    with pytest.raises(DataError, match=message):
        import_nccl_tests([log])


def test_a_test_of_one_rank_has_nothing_to_fit(tmp_path):
    doc = json.loads((DERIVED / "h100x16-2node-a3mega-allreduce.json").read_text())
    doc["config"]["devices"] = doc["config"]["devices"][:1]
    log = tmp_path / "all_reduce.json"
    log.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="1 rank: no data crosses a link"):
        import_nccl_tests([log])


# nccl-tests prints size = count x the type's bytes, x the ranks where the count is a rank's share
# (all_gather, reduce_scatter, alltoall): every shared log holds it (src/common.cu's type names)
@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name[:48])
def test_every_shared_log_s_sizes_are_its_counts_of_its_type(log):
    for run in parse_nccl_tests(log):
        assert set(run.records["type"]) <= {"float", "double"}


def test_a_row_of_an_unknown_type_or_an_edited_count_is_refused_naming_its_line(tmp_path):
    src = (DATA / "h100x8-allgather-ring-together-nccl-tests.txt").read_text().splitlines(True)
    i = next(k for k, ln in enumerate(src) if re.match(r"\s+1048576\s+32768\s+float\s", ln))
    for edit, message in (
            (src[i].replace(" float ", " fp8e4 "), "type 'fp8e4' is not one of nccl-tests'"),
            # an all_gather's count is a rank's: 32768 floats x 8 ranks is the 1 MiB printed
            (src[i].replace(" 32768 ", " 262144 "),
             r"size 1048576 B is not count 262144 x 4 B \(float\) x 8 ranks")):
        log = tmp_path / "all_gather.txt"
        log.write_text("".join(src[:i] + [edit] + src[i + 1:]))
        with pytest.raises(DataError, match=rf"all_gather.txt:{i + 1}: {message}"):
            parse_nccl_tests(log)
