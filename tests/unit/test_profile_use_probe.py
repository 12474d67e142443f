"""A calibration profile in use, where a probe (2026-12-02) found it silently wrong: an H100
profile laid over gb200-nvl72 or mi300x took the other GPU's memory and peak under the H100's
name, with no word; `collective --profile` priced sizes and group sizes its fit never saw
without saying so, and predict said nothing of a group of another rank count than the fit's.
Each test fails before its fix."""

from __future__ import annotations

import json

import pytest

from perfmodel.errors import SpecError
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.profile import apply_profile, profile_from_dict
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

H100 = "NVIDIA H100 80GB HBM3"


def _profile(tmp_path, *, gpu_name=H100, scope="intra", ranks=(8,), per_node=None,
             base="dgx-h100"):
    """An nccl-tests import of one all-reduce log as `calibrate import-nccl-tests` writes it
    (tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt: 8 ranks,
    32 MiB to 16 GiB)."""
    params = {"alpha_s": 4.47e-06, "bus_bandwidth_bytes_per_s": 4.75e11}
    hardware = {"collectives": [{"op": "all_reduce", "scope": scope, "algorithm": "ring",
                                 **params}]}
    if base is not None:
        hardware["base"] = base
    if gpu_name is not None:
        hardware["gpu_name"] = gpu_name
    if per_node is not None:
        hardware["gpus_per_node"] = per_node
    data = {"format": "perfmodel-profile", "version": 1, "complete": True, "hardware": hardware,
            "fits": {f"collective/all_reduce/{scope}/ring": {
                "kind": "collective", "op": "all_reduce", "scope": scope, "algorithm": "ring",
                "ranks": list(ranks), "params": params, "median_rel_error": 0.015,
                "worst_rel_error": 0.035, "size_range": [33554432.0, 17179869184.0],
                "n_points": 10}},
            "measurements": None, "provenance": {"device": gpu_name}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


PREDICT = ["predict", "--model", "tiny-gpt", "--gpus", "8", "--global-batch", "8"]


@pytest.mark.parametrize("hardware, per_node, scope, ranks", [
    ("gb200-nvl72", None, "intra", (8,)),   # the one-node log: GB200's peak, H100's name
    ("gb200-nvl72", 8, "inter", (80,)),     # the 10-node log: was "change levels, not it"
    ("mi300x", None, "intra", (8,)),
])
def test_a_profile_of_another_gpu_is_refused_naming_both(tmp_path, hardware, per_node, scope,
                                                          ranks):
    path = _profile(tmp_path, scope=scope, ranks=ranks, per_node=per_node)
    code, out, err = run_main([*PREDICT, "--tp", "8", "--hardware", hardware, "--profile", path])
    gpu = load_hardware(hardware).gpu_name
    assert code == SpecError.exit_code, err
    assert f"measured on {H100}, hardware '{hardware}' is {gpu}" in err
    assert "gpus_per_node must agree" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run_main(["collective", "--op", "all_reduce", "--bytes", "1GiB", "--ranks",
                             "8", "--hardware", hardware, "--profile", path])
    assert code == SpecError.exit_code and f"measured on {H100}" in err


def test_another_board_or_a_cpu_profile_is_refused_beside_a_gpu_preset(tmp_path):
    # an SXM H100's profile over the PCIe H100 preset: its NVLink fits would price PCIe links
    # (accepted by model number until the probe of 2026-12-03 (c))
    code, out, err = run_main([*PREDICT, "--tp", "8", "--hardware", "h100-pcie", "--profile",
                               _profile(tmp_path)])
    assert code == 3 and "SXM" in err and "PCIe" in err, err
    # calibrate run on CPU ranks laid over a GPU preset: its bf16 beside the preset's fp16 peak
    code, out, err = run_main([*PREDICT, "--dp", "8", "--hardware", "dgx-h100", "--profile",
                               str(ROOT / "docs/examples/cpu.json")])
    assert code == 3 and "CPU" in err, err


def test_a_profile_that_names_no_gpu_is_used_with_a_note(tmp_path):
    """GEMM sweeps imported without a device name write no gpu_name: nothing to compare."""
    # (no base either: a base names the machine, dgx-h100's, which mi300x is not)
    path = _profile(tmp_path, gpu_name=None, base=None)
    code, _, err = run_main([*PREDICT, "--tp", "8", "--hardware", "mi300x", "--profile", path])
    assert code == 0, err
    assert (f"note: profile {path} names no GPU (hardware.gpu_name): that it was measured on "
            "AMD Instinct MI300X (mi300x) is not checked") in err
    path = _profile(tmp_path, gpu_name=None)
    code, _, err = run_main([*PREDICT, "--tp", "8", "--profile", path])  # its own base: no note
    assert code == 0 and "names no GPU" not in err


@pytest.mark.parametrize("name, models", [
    (H100, {"H100"}), ("NVIDIA H100 PCIe", {"H100"}), ("NVIDIA GB200", {"GB200"}),
    ("AMD Instinct MI300X", {"MI300X"}), ("Tesla V100-SXM2-32GB", {"V100"}),
    ("NVIDIA A100-SXM4-80GB", {"A100"}), ("CPU AMD EPYC (2 cores)", set()),
])
def test_gpu_models_read_the_model_number(name, models):
    from perfmodel.specs.profile import gpu_models  # new with the fix

    assert gpu_models(name) == models


def test_apply_profile_itself_refuses_another_gpu(tmp_path):
    prof = profile_from_dict(json.loads(open(_profile(tmp_path)).read()), "profile p.json")
    with pytest.raises(SpecError, match="measured on NVIDIA H100 80GB HBM3"):
        apply_profile(load_hardware("gb200-nvl72"), prof)
    assert apply_profile(load_hardware("dgx-h100"), prof).gpu_name == H100


def _collective(path, nbytes, ranks):
    code, out, err = run_main(["collective", "--op", "all_reduce", "--bytes", nbytes, "--ranks",
                               ranks, "--profile", path, "--json"])
    assert code == 0, err
    return json.loads(out)["extrapolations"], err


def test_collective_flags_sizes_and_rank_counts_its_fit_did_not_measure(tmp_path):
    path = _profile(tmp_path)
    notes, err = _collective(path, "1KiB", "8")  # the fit saw 32 MiB-16 GiB
    assert notes == ["all_reduce (1.00 KiB, intra-node) is outside the sizes the profile "
                     "measured: extrapolated"]
    assert f"note: {notes[0]}" in err
    notes, err = _collective(path, "1GiB", "2")  # the fit saw 8 ranks
    assert notes == ["all_reduce (1.00 GiB, intra-node) over 2 ranks: the profile's fit "
                     "measured 8 ranks: extrapolated"]
    assert f"note: {notes[0]}" in err
    assert _collective(path, "1GiB", "8") == ([], "")  # inside both: nothing said
    code, _, err = run_main(["collective", "--op", "all_reduce", "--bytes", "1KiB", "--ranks",
                             "8", "--profile", path])  # text: the note on standard error
    assert code == 0 and "note: all_reduce (1.00 KiB, intra-node) is outside" in err
    # an op the profile has no fit of is priced by the links, as predict says
    code, out, err = run_main(["collective", "--op", "all_gather", "--bytes", "1GiB", "--ranks",
                               "8", "--profile", path, "--json"])
    assert code == 0 and json.loads(out)["extrapolations"] == [
        "all_gather (1.00 GiB, intra-node): the profile has no intra-node fit of all_gather; "
        "priced by the hardware's link model"]


def test_predict_flags_a_group_of_other_ranks_than_the_fit_measured(tmp_path):
    path = _profile(tmp_path)

    def notes(*plan):
        code, out, err = run_main([*PREDICT, *plan, "--hardware", "dgx-h100", "--profile", path,
                                   "--json"])
        assert code == 0, err
        return [n for n in json.loads(out)["extrapolations"] if " ranks: " in n]

    assert notes("--tp", "8") == []  # the fit's 8 ranks
    assert notes("--tp", "4", "--dp", "2") == [
        f"{name} (all_reduce, {size}, intra-node) over {n} ranks: the profile's fit measured 8 "
        "ranks: extrapolated"
        for name, size, n in (("tp/layer/all_reduce", "64.00 KiB", 4),
                              ("tp/embedding/all_reduce", "64.00 KiB", 4),
                              ("tp/output/all_reduce", "64.00 KiB", 4),
                              ("tp/cross_entropy/all_reduce", "512 B", 4),
                              ("dp/all_reduce", "3.41 MiB", 2))]
