"""calibrate's inputs as a collective probe found them (2026-12-07): a corrupted data row of an
nccl-tests log is refused by line, where the fit took the other rows and said nothing, and
`calibrate report --plot` never draws over the measurements the profile reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calibration.nccl_tests import parse_nccl_tests
from perfmodel.errors import DataError
from tests.unit.test_bad_input import run_main

DATA = Path(__file__).parents[1] / "data" / "nccl-tests"
LOG = DATA / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
ROW = b"  67108864       8388608"


@pytest.mark.parametrize("size", [b"  6710886O", b"  67108864,", b"  67108864\xa0"])
def test_a_corrupted_row_is_refused_by_its_line(tmp_path, size):
    text = LOG.read_bytes()
    assert text.count(ROW) == 1
    line = text[:text.index(ROW)].count(b"\n") + 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(text.replace(ROW, size + b"       8388608"))
    with pytest.raises(DataError, match=rf"bad.txt:{line}: a data row whose size does not read"):
        parse_nccl_tests(bad)


def test_other_lines_in_a_section_are_still_passed_over(tmp_path):
    """A launcher's or a program's line among the rows is not a row of the section's columns."""
    text = LOG.read_bytes()
    noisy = tmp_path / "noisy.txt"
    noisy.write_bytes(text.replace(ROW, b"Warning: Permanently added host (ED25519)\n" + ROW))
    (clean,), (kept,) = parse_nccl_tests(LOG), parse_nccl_tests(noisy)
    assert kept.records.drop(columns="line").equals(clean.records.drop(columns="line"))


def test_report_never_plots_over_the_profile_s_measurements(tmp_path):
    profile = tmp_path / "cl.json"
    code, _, _ = run_main(["calibrate", "import-nccl-tests", str(LOG), "--out", str(profile)])
    assert code == 0
    csv = tmp_path / "cl.measurements.csv"
    before = csv.read_bytes()
    link = tmp_path / "evil.png"
    os.symlink(csv.name, link)
    code, _, err = run_main(["calibrate", "report", str(profile), "--plot", str(link)])
    assert code == 7 and "it is the input profile's measurements" in err
    assert csv.read_bytes() == before


def test_a_fit_over_nodes_says_when_the_same_ranks_lie_otherwise(tmp_path):
    """A fit of 16 ranks on 2 nodes of 8 priced a ring of 16 ranks on 16 nodes (30 network
    steps, not 2) without a note (a collective probe, 2026-12-07): the profile records the
    layouts it measured, and collective --profile says where a group lies otherwise."""
    import json

    profile = tmp_path / "a100.json"
    log = DATA / "a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt"
    assert run_main(["calibrate", "import-nccl-tests", str(log), "--out", str(profile)])[0] == 0
    fit = json.loads(profile.read_text())["fits"]["collective/all_reduce/inter/ring"]
    assert fit["layouts"] == [[16, 2]]
    said = {}
    for per_node in (8, 2, 1):
        code, out, _ = run_main(["collective", "--profile", str(profile), "--op", "all_reduce",
                                 "--bytes", "1GiB", "--ranks", "16", "--ranks-per-node",
                                 str(per_node), "--json"])
        assert code == 0
        said[per_node] = json.loads(out)["extrapolations"]
    assert said[8] == []
    assert said[1] == ["all_reduce (1.00 GiB, inter-node) over 16 ranks on 16 nodes: the "
                       "profile's fit measured 16 ranks on 2 nodes: extrapolated"]
    assert "over 16 ranks on 8 nodes" in said[2][0]


def test_a_log_with_classic_mac_line_ends_is_read(tmp_path):
    """CR alone ends its lines: it was called 'not an nccl-tests log' (a collective probe)."""
    cr = tmp_path / "cr.txt"
    cr.write_bytes(LOG.read_bytes().replace(b"\n", b"\r"))
    (read,), (clean,) = parse_nccl_tests(cr), parse_nccl_tests(LOG)
    assert read.records.equals(clean.records)


def test_a_profile_whose_base_is_another_gpu_than_its_own_is_refused(tmp_path):
    """A profile alone (no --hardware) took its base's fields under its own gpu_name: a base
    edited to mi300x priced MI300X compute as 'NVIDIA H100 80GB HBM3 (mi300x)' (a probe's,
    2026-12-07); with --hardware check_machine already refused it."""
    import json

    profile = tmp_path / "p.json"
    assert run_main(["calibrate", "import-nccl-tests", str(LOG), "--base", "dgx-h100", "--out",
                     str(profile)])[0] == 0
    args = ["predict", "--model", "llama3-8b", "--profile", str(profile), "--gpus", "8", "--tp",
            "2"]
    assert run_main(args)[0] == 0
    data = json.loads(profile.read_text())
    data["hardware"]["base"] = "mi300x"
    profile.write_text(json.dumps(data))
    code, out, err = run_main(args)
    assert code == 3 and out == "", err
    assert "name different GPUs: another GPU (H100, not MI300X)" in err
