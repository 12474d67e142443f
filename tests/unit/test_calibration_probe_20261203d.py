"""`perfmodel calibrate` (and `validate`) defects of a probe (2026-12-03, /tmp/probe_api): outputs
ending in '/' that replaced the file, profiles written into directories made for them, integers
past a float read as OverflowError, -J files read without the op checks of a text log, a
two-regime collective fit whose time fell as bytes grew, nccl-tests rows and GEMM rows dropped
or taken without a word, and `collective` notes and suggestions that misled. Each test fails
before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.fit import CollectiveModel
from calibration.gemm_tables import read_gemm_table
from calibration.importers import import_gemm, import_nccl_tests, save
from calibration.nccl_tests import parse_nccl_tests
from perfmodel.collective import parse_bytes
from perfmodel.errors import DataError, OutputError, UsageError
from perfmodel.specs.hardware import CollectiveFit
from perfmodel.specs.profile import fitted_collective_time
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main as run_in_process

NCCL = ROOT / "tests/data/nccl-tests"
H100_LOG = NCCL / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
A100_LOG = NCCL / "a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt"
A3MEGA_LOG = NCCL / "h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt"
TEN_NODE_LOG = NCCL / "h100x80-10node-allreduce-nccl-tests-cluster-cluster01.txt"
NVLS_JSON = NCCL / "derived/h100x8-allreduce-nvls-together.json"
GEMM = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"


def run_main(args: list[object]) -> tuple[int, str, str]:
    """perfmodel ARGS in this process: (exit code, stdout, stderr)."""
    return run_in_process([str(a) for a in args])


def _one_line_error(code: int, err: str, exit_code: int, *needles: str) -> None:
    assert code == exit_code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def a100_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The A100 RoCE log's profile: its all_reduce fit has two regimes."""
    out = tmp_path_factory.mktemp("a100") / "a100.json"
    save(import_nccl_tests([A100_LOG]), out, base="dgx-a100-40gb")  # the CLI's choice
    return out


def _gemm_table(tmp_path: Path, name: str, edit=None) -> Path:
    """42 bf16 shapes (b = 1) of the H100 sweep, edited by `edit(rows)`: a quick fit."""
    rows = pd.read_csv(GEMM)
    rows = rows[(rows["dtype"] == "bf16xbf16->bf16") & (rows["b"] == 1)].iloc[::3]
    rows = rows.reset_index(drop=True).astype({"m": object, "flops_per_s": object})
    if edit is not None:
        edit(rows)
    path = tmp_path / name
    rows.to_csv(path, index=False)
    return path


# --- D1: an output ending in '/' never replaces the file it names --------------------------------


@pytest.mark.parametrize("command", [
    ["import-nccl-tests", H100_LOG, "--out", "{real}/"],
    ["import-gemm", GEMM, "--out", "{real}/"],
    ["report", "{profile}", "--plot", "{real}/"],
], ids=["import-nccl-tests --out", "import-gemm --out", "report --plot"])
def test_a_calibrate_output_ending_in_a_slash_never_replaces_the_file(tmp_path, a100_profile,
                                                                     command):
    """click's Path(path_type=Path) dropped the '/': `--out real.json/` wrote real.json, exit 0.
    Refused as predict's `--out real.csv/` is (docs/cli.md, exit 7), before anything is read."""
    real = tmp_path / "real.json"
    real.write_text("precious\n")
    args = [str(a).format(real=real, profile=a100_profile) for a in command]
    code, _, err = run_main(["calibrate", *args])
    _one_line_error(code, err, 7, "the trailing '/' names a directory")
    assert real.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.json"]


def test_calibrate_run_out_ending_in_a_slash_is_refused_before_the_run(tmp_path):
    """`calibrate run --out real.json/` is refused before any rank starts."""
    pytest.importorskip("torch")
    real = tmp_path / "real.json"
    real.write_text("precious\n")
    code, _, err = run_main(["calibrate", "run", "--out", f"{real}/"])
    _one_line_error(code, err, 7, "the trailing '/' names a directory")
    assert real.read_text() == "precious\n"


@pytest.mark.parametrize("option", ["--out", "--history", "--trace"])
def test_a_validate_collect_output_ending_in_a_slash_never_replaces_the_file(tmp_path, option):
    """validation/cli.py's outputs had the same click.Path(path_type=Path) as calibrate's."""
    pytest.importorskip("torch")
    emitted = tmp_path / "job"
    emitted.mkdir()
    real = tmp_path / "real.json"
    real.write_text("precious\n")
    code, _, err = run_main(["validate", "collect", emitted, option, f"{real}/"])
    _one_line_error(code, err, 7, "the trailing '/' names a directory")
    assert real.read_text() == "precious\n"


# --- D10: a profile's directory is not made for it ------------------------------------------------


def test_a_profile_in_a_missing_directory_is_refused_and_none_is_made(tmp_path):
    """`--out /nonexistent/o.json` created /nonexistent/ (make_parents=True); docs/cli.md exit 7
    refuses an output whose directory is missing, as predict's outputs are."""
    out = tmp_path / "missing" / "p.json"
    code, _, err = run_main(["calibrate", "import-nccl-tests", H100_LOG, "--out", out])
    _one_line_error(code, err, 7, "output directory does not exist", str(out.parent))
    assert not out.parent.exists()
    with pytest.raises(OutputError, match="output directory does not exist"):
        save(import_nccl_tests([H100_LOG]), out, base=None)  # the Python API, the same
    assert not out.parent.exists()


# --- D2: integers past a float are refused naming their field and range ---------------------------


@pytest.mark.parametrize(("field", "allowed"), [
    ("time", "0.001 to 1e+10 us"), ("size", "a whole number of bytes from 0 to 2^50")])
def test_a_400_digit_integer_in_a_json_log_is_refused_naming_its_field(tmp_path, field, allowed):
    """JSON reads 10^400 exactly: float() of it was an OverflowError, `internal error`, exit 1."""
    doc = json.loads(NVLS_JSON.read_text())
    half = doc["results"][5] if field == "size" else doc["results"][5]["out_of_place"]
    half[field] = 10**400
    log = tmp_path / "all_reduce.json"
    log.write_text(json.dumps(doc))
    code, _, err = run_main(["calibrate", "import-nccl-tests", log, "--out", tmp_path / "p.json"])
    where = "results[5]" + (".out_of_place" if field == "time" else "") + f".{field}"
    _one_line_error(code, err, 5, where, "past what a float holds", allowed)


@pytest.mark.parametrize(("column", "allowed"), [
    ("m", "a whole number from 1 to 1e9"), ("flops_per_s", "a positive number up to 1e18")])
def test_a_401_digit_integer_in_a_gemm_table_is_refused_naming_its_column(tmp_path, column,
                                                                            allowed):
    """pandas reads a 401-digit cell as a Python int, pd.to_numeric raised OverflowError."""
    def edit(rows):
        rows.loc[4, column] = int("1" * 401)
    table = _gemm_table(tmp_path, "big.csv", edit)
    code, _, err = run_main(["calibrate", "import-gemm", table, "--out", tmp_path / "p.json"])
    _one_line_error(code, err, 5, "big.csv:6", f"column '{column}'", "past what a float holds",
                    allowed)


# --- D3: a -J file is checked as a text log is ----------------------------------------------------


def _json_log(tmp_path: Path, args: list[str], *, all_gather: bool = False,
              redop: str | None = None) -> Path:
    """The NVLS all_reduce -J file with other args; all_gather: its busbw made an all_gather's
    (algbw x 7/8) and its counts a rank's (nccl-tests prints all_gather's so); redop: every
    result's redop column."""
    doc = json.loads(NVLS_JSON.read_text())
    doc["args"] = args
    for result in doc["results"]:
        if redop is not None:
            result["redop"] = redop
        if all_gather:  # a rank's count printed, and the size it makes (0 below a float a rank)
            result["count"] = result["size"] // (4 * 8)
            result["size"] = result["count"] * 4 * 8
        for half in ("out_of_place", "in_place"):
            if all_gather:
                result[half]["bus_bw"] = round(result[half]["alg_bw"] * 7 / 8, 2)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    return path


def test_an_op_flag_against_a_json_files_binary_is_refused():
    """args[0] overrode --op silently; a text log refuses --op against its `*_perf` name."""
    with pytest.raises(DataError, match=r"--op all_gather, but the file ran all_reduce \(its "
                                        r"args\[0\] is all_reduce_perf\); leave --op out"):
        parse_nccl_tests(NVLS_JSON, op="all_gather")


def test_a_json_file_read_as_another_op_is_refused_by_its_bus_factor(tmp_path):
    """args = [] and --op all_gather: an all_reduce's busbw was fitted as an all_gather's (half
    the right bandwidth); args naming all_gather_perf over all_reduce results: the same."""
    with pytest.raises(DataError, match="busbw / algbw is 1.75 .* the log measured all_reduce"):
        parse_nccl_tests(_json_log(tmp_path, []), op="all_gather")
    with pytest.raises(DataError, match="the log measured all_reduce; its args.0. names "
                                        "all_gather's test"):
        parse_nccl_tests(_json_log(tmp_path, ["./build/all_gather_perf"]))
    with pytest.raises(DataError, match="--op all_reduce, but the file ran all_gather"):
        parse_nccl_tests(_json_log(tmp_path, ["./build/all_gather_perf"]), op="all_reduce")
    (run,) = parse_nccl_tests(_json_log(tmp_path, []), op="all_reduce")  # what it is
    assert run.op.value == "all_reduce"


def test_a_json_files_redop_tells_all_gather_from_reduce_scatter(tmp_path):
    """The two share a bus factor: the redop column (and root, written '    -1') tells them apart,
    as in a text log."""
    summed = _json_log(tmp_path, ["./build/all_gather_perf"], all_gather=True, redop="sum")
    with pytest.raises(DataError, match="redop column says it ran the reduction sum"):
        parse_nccl_tests(summed)
    (run,) = parse_nccl_tests(
        _json_log(tmp_path, ["./build/reduce_scatter_perf"], all_gather=True, redop="sum"))
    assert run.op.value == "reduce_scatter"
    (run,) = parse_nccl_tests(
        _json_log(tmp_path, ["./build/all_gather_perf"], all_gather=True, redop="none"))
    assert run.op.value == "all_gather"


# --- D4: a two-regime collective fit never falls as bytes grow ------------------------------------


def _fit_of(profile: Path) -> CollectiveFit:
    (fit,) = json.loads(profile.read_text())["hardware"]["collectives"]
    return CollectiveFit(**fit)


def test_the_a100_fit_no_longer_falls_between_180000_and_190000_bytes(tmp_path, a100_profile):
    """`collective --ranks 16 --bytes 180000` took 131.3 us and 190000 114.2 us: the breakpoint
    (185,364 B) lay where the small regime was 134 us and the large 114 us."""
    times = []
    for nbytes in (180000, 190000):
        code, out, err = run_main(["collective", "--op", "all_reduce", "--ranks", 16,
                                   "--profile", a100_profile, "--bytes", nbytes, "--json"])
        assert code == 0, err
        times.append(json.loads(out)["time_s"])
    assert times[0] <= times[1]


@pytest.mark.parametrize("log", [A100_LOG, A3MEGA_LOG, TEN_NODE_LOG],
                         ids=["a100-roce", "a3mega", "h100x80"])
def test_a_two_regime_fit_grows_with_size_and_meets_at_a_protocol_switch(log):
    """Every two-regime fit of the shared logs: the time never falls as the size grows, at the
    measured ranks and at larger groups; where the small regime is a protocol of lower alpha and
    lower bandwidth (a100, a3mega) the two meet at the breakpoint (continuous); the h100x80
    log's large regime is slower at every size (its busbw falls beyond 2 GiB): a step up."""
    (run,) = parse_nccl_tests(log)
    model = CollectiveModel("all_reduce", run.scope).fit(run.records.assign(ranks=run.ranks))
    fit = model.to_fit()
    assert fit.breakpoint_bytes > 0
    sizes = np.geomspace(8, 2**36, 5000)
    for ranks in (run.ranks, 2 * run.ranks, 8 * run.ranks):
        t = fitted_collective_time(fit, "all_reduce", sizes, ranks)
        assert (np.diff(t) >= 0).all(), ranks
    below, at = fitted_collective_time(fit, "all_reduce", np.array(
        [fit.breakpoint_bytes * (1 - 1e-12), fit.breakpoint_bytes]), run.ranks)
    switch = (fit.alpha_s_small < fit.alpha_s
              and fit.bus_bandwidth_bytes_per_s_small < fit.bus_bandwidth_bytes_per_s)
    assert switch == (log != TEN_NODE_LOG)
    step = at / below - 1
    assert step == (pytest.approx(0, abs=1e-9) if switch else pytest.approx(0.19, rel=0.1))


def test_the_residuals_reported_are_those_of_the_fit_written(a100_profile):
    """The import's residuals are the written fit's own (the time at the breakpoint it writes),
    not those of the lines before the breakpoint was placed; the a100 log's median stays 4.2%."""
    result = import_nccl_tests([A100_LOG])
    (source,) = result.per_source
    run = parse_nccl_tests(A100_LOG)[0]
    rec = run.records[run.records["nbytes"] > 0]
    t = fitted_collective_time(_fit_of(a100_profile), "all_reduce", rec["nbytes"], run.ranks)
    err = np.abs(t / rec["time_s"].to_numpy() - 1)
    assert source["median_rel_error"] == pytest.approx(float(np.median(err)), rel=1e-9)
    assert source["worst_rel_error"] == pytest.approx(float(np.max(err)), rel=1e-9)
    assert source["median_rel_error"] == pytest.approx(0.0418, abs=5e-4)


# --- D8: nccl-tests rows refused or noted, not dropped without a word ----------------------------


def _edited_log(tmp_path: Path, size: str, edit) -> tuple[Path, int]:
    """The H100 all_reduce log with the row of `size` edited: (log, its line)."""
    lines = H100_LOG.read_text().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [size])
    lines[i] = edit(lines[i])
    log = tmp_path / "all_reduce.txt"
    log.write_text("\n".join(lines) + "\n")
    return log, i + 1


@pytest.mark.parametrize("size", ["-268435456", "268435456.5"])
def test_a_row_with_a_negative_or_fractional_size_is_refused_naming_its_line(tmp_path, size):
    """`_is_row` wanted tokens[0].isdigit(): such a row was skipped, the size check never ran."""
    log, line = _edited_log(tmp_path, "268435456", lambda ln: ln.replace("268435456", size, 1))
    with pytest.raises(DataError, match=rf"all_reduce.txt:{line}: size must be a whole number "
                                        rf"of bytes from 0 to 2\^50 .*got {size}"):
        parse_nccl_tests(log)


def test_a_size_in_full_width_digits_is_refused_naming_its_line(tmp_path):
    """float() reads '２６８４３５４５６': the row was taken as 268435456 B."""
    wide = "268435456".translate({ord(c): ord(c) + 0xFEE0 for c in "0123456789"})
    log, line = _edited_log(tmp_path, "268435456", lambda ln: ln.replace("268435456", wide, 1))
    with pytest.raises(DataError, match=rf"all_reduce.txt:{line}: size '{wide}' is not a number "
                                        "in ASCII digits"):
        parse_nccl_tests(log)


def test_a_log_given_twice_is_fitted_once_with_a_note():
    """The same log twice gave 20 points; docs/calibration.md: a repeat with the same numbers is
    kept once, with a note."""
    once = import_nccl_tests([H100_LOG])
    twice = import_nccl_tests([H100_LOG, H100_LOG])
    (fit,) = twice.fits.values()
    assert fit["n_points"] == next(iter(once.fits.values()))["n_points"]
    assert any("repeats" in n and "kept once" in n for n in twice.notes), twice.notes
    assert fit["params"] == next(iter(once.fits.values()))["params"]


def test_a_row_whose_busbw_is_not_algbw_times_the_bus_factor_is_noted(tmp_path):
    """busbw 43.45 GB/s where algbw 248.29 x 1.75 = 434.5: accepted without a word (only the
    median ratio was checked)."""
    def edit(line):
        tokens = line.split()
        tokens[7] = f"{float(tokens[7]) / 10:.2f}"  # the out-of-place busbw
        return "  ".join(tokens)
    log, line = _edited_log(tmp_path, "268435456", edit)
    result = import_nccl_tests([log])
    assert any(f"line {line}, 268435456 B: busbw" in n and "bus factor" in n
               for n in result.notes), result.notes


def test_a_row_far_off_the_fit_is_noted(tmp_path):
    """A row 10x slower than the others (time, algbw and busbw edited alike) was fitted without a
    note; now one names its line (the fit, robust, hardly moves)."""
    def edit(line):
        tokens = line.split()
        for i in (5, 9):  # times
            tokens[i] = f"{float(tokens[i]) * 10:.1f}"
        for i in (6, 7, 10, 11):  # algbw, busbw
            tokens[i] = f"{float(tokens[i]) / 10:.2f}"
        return "  ".join(tokens)
    log, line = _edited_log(tmp_path, "268435456", edit)
    result = import_nccl_tests([log])
    assert any(f"over 3x off the fit (line {line}, 268435456 B" in n for n in result.notes), \
        result.notes
    assert not any("off the fit" in n for n in import_nccl_tests([H100_LOG]).notes)


# --- D9: GEMM rows checked and named ----------------------------------------------------------


def test_a_fractional_gemm_dimension_is_refused(tmp_path):
    """m = 256.5 was fitted."""
    def edit(rows):
        rows.loc[5, "m"] = 256.5
    with pytest.raises(DataError, match=r"frac.csv:7: column 'm' must be a whole number from 1 "
                                        r"to 1e9, got '256.5'"):
        read_gemm_table(_gemm_table(tmp_path, "frac.csv", edit))


def test_time_s_disagreeing_with_flops_per_s_is_refused_naming_the_row(tmp_path):
    """A time_s column 10x off flops_per_s was ignored: which is the measurement is not known."""
    def edit(rows):
        rows["time_s"] = 2.0 * rows["m"].astype(float) * rows["n"] * rows["k"] / rows[
            "flops_per_s"].astype(float)
        rows.loc[3, "time_s"] *= 10
    with pytest.raises(DataError, match=r"times.csv:5: time_s .* 0.1x the .* FLOP/s of column "
                                        r"'flops_per_s' \(over 5% apart; 1 row so\)"):
        read_gemm_table(_gemm_table(tmp_path, "times.csv", edit))
    ok = _gemm_table(tmp_path, "ok.csv", lambda rows: rows.__setitem__(
        "time_s", 2.0 * rows["m"].astype(float) * rows["n"] * rows["k"]
        / rows["flops_per_s"].astype(float)))
    assert len(read_gemm_table(ok)) == 42


def test_a_tflops_column_of_flop_per_s_is_refused_naming_that_column(tmp_path):
    """The message named 'flops_per_s', a column the user's table does not have."""
    table = _gemm_table(tmp_path, "renamed.csv")
    table.write_text(table.read_text().replace("flops_per_s", "TFLOPS", 1))
    with pytest.raises(DataError, match=r"renamed.csv:2: column 'TFLOPS' must be a positive "
                                        r"number up to 1e6 TFLOP/s, got .*FLOP/s in a TFLOP/s "
                                        "column"):
        read_gemm_table(table)


def test_gemm_rows_far_off_the_fit_are_noted(tmp_path):
    """A row of 1e-3 FLOP/s and rows in TFLOP/s among FLOP/s were fitted without a note."""
    def edit(rows):
        rows.loc[5, "flops_per_s"] = 1e-3
        for i in (20, 21):
            rows.loc[i, "flops_per_s"] = float(rows.loc[i, "flops_per_s"]) / 1e12
    result = import_gemm([_gemm_table(tmp_path, "odd.csv", edit)], folds=2)
    (note,) = [n for n in result.notes if "off the fit" in n]
    assert "3 shapes over 10x off the fit" in note
    for line in (7, 22, 23):
        assert f"odd.csv:{line} " in note


# --- D12: `collective` ----------------------------------------------------------------------------


def test_a_single_rank_collective_with_a_profile_has_no_note(a100_profile):
    """One rank moves nothing (0 s): it was noted 'outside the sizes the profile measured'."""
    for nbytes in ("1MiB", "1GiB"):
        code, out, err = run_main(["collective", "--op", "all_reduce", "--ranks", 1,
                                   "--profile", a100_profile, "--bytes", nbytes, "--json"])
        assert code == 0 and "note" not in err, err
        doc = json.loads(out)
        assert doc["time_s"] == 0 and doc["extrapolations"] == []


@pytest.mark.parametrize(("given", "units"), [
    ("1gb", "GB, GiB or G"), ("1Gb", "GB, GiB or G"), ("1kb", "kB, KiB or K"),
    ("1mb", "MB, MiB or M"), ("1tb", "TB or TiB"), ("1eb", "EB or EiB")])
def test_a_size_in_bits_suggests_the_byte_units_accepted(given, units):
    """'--bytes 1gb' suggested 'gB, GiB or G'; each unit suggested is one parse_bytes takes."""
    with pytest.raises(UsageError, match=rf"reads as bits; give bytes \({units}\)"):
        parse_bytes(given)
    for unit in units.replace(" or ", ", ").split(", "):
        assert parse_bytes(f"1{unit}") > 1


def test_a_400_digit_number_in_a_text_log_is_refused_as_out_of_range(tmp_path):
    """A text log's 400-digit time said "is not a number" (float() reads it as inf): it is a
    number, out of every column's range, and the error says so, naming file:line."""
    lines = H100_LOG.read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.split() and line.split()[0] == "33554432")
    tokens = lines[row].split()
    tokens[5] = "9" * 400  # the out-of-place time
    lines[row] = "  " + "  ".join(tokens) + "\n"
    log = tmp_path / "h100x8-allreduce-big.txt"
    log.write_text("".join(lines))
    with pytest.raises(DataError, match=rf"{log.name}:{row + 1}: .* is out of range") as err:
        parse_nccl_tests(log)
    assert "\n" not in str(err.value) and "400 characters" in str(err.value)
