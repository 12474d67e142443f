"""Profiles: written atomically, read back with clear errors, applied over a preset."""

import json
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

from calibration.cli import calibrate
from calibration.profile_io import provenance, write_profile
from perfmodel.errors import SpecError
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.profile import apply_profile, is_extrapolation, load_profile
from tests.conftest import ROOT

FIT = {
    "kind": "collective",
    "op": "all_reduce",
    "scope": "intra",
    "algorithm": "ring",
    "params": {"alpha_s": 5e-6, "bus_bandwidth_bytes_per_s": 400e9},
    "median_rel_error": 0.02,
    "worst_rel_error": 0.1,
    "size_range": [8, 8e9],
    "n_points": 31,
}
COLLECTIVE = {
    "op": "all_reduce",
    "scope": "intra",
    "algorithm": "ring",
    "alpha_s": 5e-6,
    "bus_bandwidth_bytes_per_s": 400e9,
}


def write(tmp_path, hardware, fits=None, **kw):
    return write_profile(
        tmp_path / "p.json",
        hardware=hardware,
        fits={"collective/all_reduce/intra/ring": FIT} if fits is None else fits,
        measurements=pd.DataFrame({"nbytes": [8.0], "time_s": [1e-5]}),
        provenance=provenance(device="test"),
        **kw,
    )


def test_profile_fields_override_the_preset(tmp_path):
    path = write(
        tmp_path,
        {
            "base": "dgx-h100",
            "collectives": [COLLECTIVE],
            "gemm_efficiency": {"bf16": {"max_fraction": 0.7, "half_dim": 0, "min_time_s": 5e-6}},
        },
    )
    hw = apply_profile(None, load_profile(path))
    preset = load_hardware("dgx-h100")
    assert hw.gemm("bf16").max_fraction == 0.7 and hw.gemm("bf16").min_time_s == 5e-6
    assert hw.gemm("fp8") == preset.gemm("fp8")  # untouched fields keep the preset's values
    assert hw.peak_flops_per_s == preset.peak_flops_per_s
    assert hw.collectives[0].bus_bandwidth_bytes_per_s == 400e9
    assert "calibrated" in hw.source
    # an explicit --hardware of the profile's machine wins over the profile's base; another
    # machine's (an A100 node's, beside this dgx-h100-based profile) is refused
    assert apply_profile(load_hardware("dgx-h100-superpod"),
                         load_profile(path)).name == "dgx-h100-superpod"
    with pytest.raises(SpecError):
        apply_profile(load_hardware("dgx-a100-80gb"), load_profile(path))


def test_profile_is_written_with_its_measurements_and_provenance(tmp_path):
    path = write(tmp_path, {"base": "dgx-h100"})
    doc = json.loads(path.read_text())
    assert doc["format"] == "perfmodel-profile" and doc["version"] == 1 and doc["complete"]
    assert (tmp_path / doc["measurements"]).exists()
    for key in ("host", "device", "date", "command", "git_revision", "torch_version"):
        assert key in doc["provenance"]
    assert list(tmp_path.glob("*.tmp")) == []


def test_a_standalone_profile_must_hold_every_required_field(tmp_path):
    path = write(tmp_path, {"gpus_per_node": 4})
    with pytest.raises(SpecError, match="missing required field 'peak_flops_per_s'.*--hardware"):
        apply_profile(None, load_profile(path))


def test_unknown_hardware_field_is_named(tmp_path):
    hardware = {"base": "dgx-h100", "peak_flop_per_s": {"bf16": 1e15}}
    with pytest.raises(SpecError, match="unknown field 'peak_flop_per_s'.*did you mean"):
        write(tmp_path, hardware)  # never written
    assert not (tmp_path / "p.json").exists()
    path = tmp_path / "p.json"  # a hand-edited profile is refused when read, not when applied
    doc = {"format": "perfmodel-profile", "version": 1, "complete": True, "hardware": hardware,
           "fits": {}}
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="unknown field 'peak_flop_per_s'.*did you mean"):
        load_profile(path)


BAD = {
    "not json": ('{"format": "perfmodel-profile", ', "not valid JSON at line 1"),
    "wrong format": (json.dumps({"format": "x", "version": 1}), "field 'format' must be"),
    "other version": (
        json.dumps({"format": "perfmodel-profile", "version": 2}),
        "version 2 is not supported",
    ),
    "no fits": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True, "hardware": {}}),
        "missing required field 'fits'",
    ),
    "bad fit": (
        json.dumps(
            {
                "format": "perfmodel-profile",
                "version": 1,
                "complete": True,
                "hardware": {},
                "fits": {"f": {**FIT, "params": {"alpha_s": "x"}}},
            }
        ),
        r"fits.f.params.alpha_s must be a finite number",
    ),
    "bad range": (
        json.dumps(
            {
                "format": "perfmodel-profile",
                "version": 1,
                "complete": True,
                "hardware": {},
                "fits": {"f": {**FIT, "size_range": [9, 1]}},
            }
        ),
        "size_range must be",
    ),
    "complete not bool": (
        json.dumps(
            {
                "format": "perfmodel-profile",
                "version": 1,
                "complete": "yes",
                "hardware": {},
                "fits": {},
            }
        ),
        "'complete' must be true or false",
    ),
    "a list": ("[1, 2]", "must be a JSON object"),
    "duplicated collective fit": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True,
                    "hardware": {}, "fits": {"a": FIT, "b": {**FIT, "n_points": 5}}}),
        r"fits.a and fits.b are both fits of all_reduce intra \(ring, ring\)",
    ),
    # issue 15: two algorithms of one op and scope were mixed (one's parameters, the other's steps)
    "two algorithms of one collective fit": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True,
                    "hardware": {}, "fits": {"a": FIT, "b": {**FIT, "algorithm": "tree"}}}),
        r"fits.a and fits.b are both fits of all_reduce intra \(ring, tree\): a profile holds "
        "one collective fit per op and scope",
    ),
    "duplicated hardware collective": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True,
                    "hardware": {"base": "dgx-h100", "collectives": [
                        COLLECTIVE, {**COLLECTIVE, "alpha_s": 1e-3}]}, "fits": {}}),
        r"hardware.collectives\[0\] and \[1\] are both fits of all_reduce intra",
    ),
    "two algorithms of one hardware collective": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True,
                    "hardware": {"base": "dgx-h100", "collectives": [
                        COLLECTIVE, {**COLLECTIVE, "algorithm": "tree"}]}, "fits": {}}),
        r"hardware.collectives\[0\] and \[1\] are both fits of all_reduce intra: a profile holds "
        "one fit per op and scope",
    ),
    # json.loads would keep the second of two equal keys: the fit given first would vanish
    "key given twice": (
        '{"format": "perfmodel-profile", "version": 1, "complete": true, "hardware": {}, '
        f'"fits": {{"collective/all_reduce/intra/ring": {json.dumps(FIT)}, '
        f'"collective/all_reduce/intra/ring": {json.dumps(FIT)}}}}}',
        "key 'collective/all_reduce/intra/ring' is given twice in one object",
    ),
    "missing stages of a complete profile": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": True,
                    "missing_stages": ["layers"], "hardware": {}, "fits": {}}),
        "'missing_stages' names layers but 'complete' is true",
    ),
    "missing stages not a list": (
        json.dumps({"format": "perfmodel-profile", "version": 1, "complete": False,
                    "missing_stages": "layers", "hardware": {}, "fits": {}}),
        "'missing_stages' must be a list of stage names",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_profiles_are_refused_with_the_field(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_profile(path)


def test_a_duplicated_fit_is_refused_by_predict_in_one_line(tmp_path, run_cli):
    path = tmp_path / "dup.json"
    path.write_text(BAD["duplicated collective fit"][0])
    res = run_cli("predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--tp", "8", "--profile", path)
    assert res.returncode == 3 and res.stdout == ""
    assert res.stderr == (f"error: profile {path}: fits.a and fits.b are both fits of "
                          "all_reduce intra (ring, ring): a profile holds one collective fit per "
                          "op and scope\n")


def test_predict_says_when_a_profile_is_incomplete(tmp_path, run_cli):
    """An interrupted calibration's profile: predict says so on stderr and in --json, naming the
    stages it lacks; a complete one gets no note."""
    args = ("predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "8", "--tp",
            "8", "--json", "--profile")
    cut = write(tmp_path, {"base": "dgx-h100"}, complete=False,
                missing_stages=["framework", "layers"])
    res = run_cli(*args, cut)
    assert res.returncode == 0, res.stderr
    note = (f"profile {cut} is incomplete (its calibration was interrupted; missing stages: "
            "framework, layers): what it did not measure comes from the base preset or "
            "perfmodel's defaults")
    assert res.stderr.splitlines()[0] == f"note: {note}"
    assert json.loads(res.stdout)["profile"] == {
        "path": str(cut), "complete": False, "missing_stages": ["framework", "layers"],
        "note": note}
    assert load_profile(cut).missing_stages == ("framework", "layers")
    done = write(tmp_path, {"base": "dgx-h100"})
    res = run_cli(*args, done)
    assert res.returncode == 0 and "incomplete" not in res.stderr
    assert json.loads(res.stdout)["profile"]["complete"] is True


def test_report_of_a_bad_profile_is_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{")
    res = CliRunner().invoke(calibrate, ["report", str(path)])
    assert res.exit_code == 3 and res.output.count("\n") == 1 and "bad.json" in res.output


def test_report_prints_fits_and_plots(tmp_path):
    path = write(tmp_path, {"base": "dgx-h100", "collectives": [COLLECTIVE]})
    png = tmp_path / "fits.png"
    res = CliRunner().invoke(calibrate, ["report", str(path), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "collective/all_reduce/intra/ring" in res.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_extrapolation_is_flagged_outside_the_sizes_seen(tmp_path):
    profile = load_profile(write(tmp_path, {"base": "dgx-h100"}))
    assert list(is_extrapolation(profile, "all_reduce", [4, 1e6, 1e10])) == [True, False, True]
    assert is_extrapolation(profile, "all_gather", 1e6)  # never measured


BLOCK_TORCH = """
import sys, time
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
t = time.perf_counter()
import calibration.cli, calibration.importers, calibration.report, calibration.run
import perfmodel.specs.profile
assert "torch" not in sys.modules
print("ok")
"""


def test_calibration_imports_without_torch():
    """import-nccl-tests, import-gemm and report must work (and start fast) without torch."""
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
