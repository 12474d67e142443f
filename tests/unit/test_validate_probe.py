"""validate, profiles in use and grid layouts' reserves where a probe found them silently idle or
wrong (2026-12-02): options the chosen way of validating does not read, an emitted job that
dropped its port, a collective said extrapolated that the profile does not price at all, a
report drawn without its measured points, a grid rank's communicators. Each test fails before
its fix."""

from __future__ import annotations

import json

import pytest

from perfmodel.errors import DataError
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

TINY = ["--model", "tiny-gpt", "--dp", "2", "--global-batch", "8"]


@pytest.mark.parametrize("extra, says", [
    (["--dry-run", "--steps", "9"], "--steps: a dry run counts the job's collectives"),
    (["--dry-run", "--nodes", "7"], "--nodes: a dry run"),
    (["--hardware", "dgx-h100", "--emit", "{tmp}/em", "--history", "{tmp}/h.csv"],
     "--history: --emit writes the job to run elsewhere"),
    (["--hardware", "dgx-h100", "--nodes", "1"], "--nodes: with --emit only"),
])
def test_validate_refuses_what_its_way_of_validating_does_not_read(tmp_path, extra, says):
    args = [a.format(tmp=tmp_path) for a in extra]
    code, _, err = run_main(["validate", *TINY, *args])
    assert code == 2 and says in err, err


def test_an_emitted_job_listens_on_the_port_given(tmp_path):
    code, _, err = run_main(["validate", *TINY, "--hardware", "dgx-h100", "--emit",
                             str(tmp_path / "em"), "--port", "31000"])
    assert code == 0, err
    assert '"$MASTER_ADDR:31000"' in (tmp_path / "em" / "run.sh").read_text()
    code, _, err = run_main(["validate", "collect", str(tmp_path / "em"), "--profile",
                             "p.json"])
    assert code == 2 and "--hardware and --profile give the predicted step of --trace" in err


def test_a_collective_the_profile_has_no_fit_of_is_said_so():
    code, _, err = run_main(["predict", "--model", "tiny-gpt",
                             "--profile", str(ROOT / "docs/examples/cpu.json"), "--gpus", "8",
                             "--dp", "8", "--global-batch", "8"])
    assert code == 0
    assert "the profile has no inter-node fit of all_reduce; priced by the hardware's link" in err
    assert "inter-node) is outside the sizes the profile measured" not in err


def test_a_profile_whose_measurements_moved_is_not_drawn_without_them(tmp_path):
    from perfmodel.plot import read_measurements
    from perfmodel.specs.profile import load_profile

    profile = tmp_path / "cpu.json"
    profile.write_text((ROOT / "docs/examples/cpu.json").read_text())  # its CSV left behind
    with pytest.raises(DataError, match="measurements CSV is not there"):
        read_measurements(load_profile(profile))


@pytest.mark.parametrize("layout, extra, communicators", [
    ("1d", [], 1), ("2d", [], 2), ("2.5d", ["--tp-depth", "2"], 3), ("3d", [], 3)])
def test_a_grid_rank_holds_a_communicator_for_each_sub_axis(layout, extra, communicators):
    gpus = {"1d": 16, "2d": 16, "2.5d": 32, "3d": 64}[layout]
    code, out, err = run_main(["predict", "--model", "gpt-22b", "--hardware", "dgx-a100-80gb",
                               "--gpus", str(gpus), "--tp", str(gpus), "--tp-layout", layout,
                               *extra, "--micro-batch", "16", "--global-batch", "16", "--json"])
    assert code == 0, err
    buffers = json.loads(out)["memory_breakdown_bytes"]["reserved/nccl_buffers"]
    assert buffers == communicators * 231211008  # dgx-a100-80gb's nccl_buffer_bytes
