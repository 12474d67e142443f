"""`calibrate import-gemm` / `import-nccl-tests` defects of a probe (2026-12-02, /tmp/probe7):
a GEMM efficiency written against a peak predict does not scale, a --base of another GPU (or of
the PCIe board for SXM logs) taken, logs of two GPUs fitted as one, notes left out of the
profile, and a measurements CSV named after a symlink. Each test fails before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.profile import gpu_difference, load_profile
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main as run_in_process

GEMM = ROOT / "tests/data/gemm"
NCCL = ROOT / "tests/data/nccl-tests"
A3MEGA = NCCL / "h100x16-2node-a3mega-tcpxo-allreduce-create-a3mega-ztan-fork.txt"
H100_LOG = NCCL / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"  # NVIDIA H100 80GB HBM3


def run_main(args: list[object]) -> tuple[int, str, str]:
    """test_bad_input's run_main over the arguments as strings."""
    return run_in_process([str(a) for a in args])


def _table(tmp_path: Path, source: str, dtypes: list[str]) -> Path:
    """The b = 1 shapes (125 a dtype) of some dtypes of a published sweep: a quick fit."""
    rows = pd.read_csv(GEMM / source)
    rows = rows[rows["dtype"].isin(dtypes) & (rows["b"] == 1)]
    path = tmp_path / f"{source.split('-')[3]}.csv"
    rows.to_csv(path, index=False)
    return path


def _written_peaks(profile: Path) -> dict[str, float]:
    """The peak each written dtype's efficiency was fitted against."""
    doc = json.loads(profile.read_text())
    fits = [f for f in doc["fits"].values() if "perfmodel_dtype" in f]
    return {d: next(f["peak_flops_per_s"] for f in fits if f["perfmodel_dtype"] == d)
            for d in doc["hardware"].get("gemm_efficiency", {})}


MI350 = "xla-matmul-perf-table-mi350-gfx950-multi-dtype.csv"
MI300 = "xla-matmul-perf-table-mi300-gfx942-bf16-f32-fp8.csv"


@pytest.mark.parametrize("base", [[], ["--base", "mi355x"]])
def test_gfx950_f32_efficiency_is_not_written_against_a_peak_mi355x_does_not_scale(tmp_path, base):
    # gfx950's f32 rows were fitted against the bf16 peak (2.5 PF); mi355x has no TF32 and
    # prices a tf32 plan at its fp32 157.3 TF: predict was 6x too slow (57.1 s against 9.2 s)
    table = _table(tmp_path, MI350, ["bf16xbf16->bf16", "f32xf32->f32"])
    out = tmp_path / "g.json"
    code, _, err = run_main(["calibrate", "import-gemm", table, "--out", out, *base])
    assert code == 0, err
    written = _written_peaks(out)
    assert "bf16" in written
    mi355x = load_hardware("mi355x")
    for dtype, peak in written.items():  # every written dtype: fitted against what predict scales
        assert peak == pytest.approx(mi355x.peak(dtype)), dtype
    doc = json.loads(out.read_text())
    assert doc["hardware"]["gpu_name"] == "AMD Instinct MI355X"
    if not base:
        assert "tf32" not in written
        assert any("tf32" in n and "not written" in n for n in doc["provenance"]["notes"])


def test_gfx942_f32_efficiency_is_written_where_the_preset_scales_its_peak(tmp_path):
    # mi300x has a TF32 peak, the datasheet's 653.7 TF: the fit stands
    table = _table(tmp_path, MI300, ["bf16xbf16->bf16", "f32xf32->f32"])
    out = tmp_path / "g.json"
    code, _, err = run_main(["calibrate", "import-gemm", table, "--out", out])
    assert code == 0, err
    assert _written_peaks(out) == {"bf16": 1307.4e12, "tf32": 653.7e12}


def test_import_gemm_refuses_a_base_of_another_gpu(tmp_path):
    # MI300 sweeps fitted against H100 peaks were written, exit 0
    table = _table(tmp_path, MI300, ["bf16xbf16->bf16"])
    out = tmp_path / "x.json"
    code, _, err = run_main(["calibrate", "import-gemm", table, "--base", "dgx-h100", "--out", out])
    assert code == 5, err
    assert "--base dgx-h100 is NVIDIA H100 80GB HBM3, the tables' device gfx942" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "x.measurements.csv").exists()
    code, _, err = run_main(["calibrate", "import-gemm", table, "--base", "mi325x", "--out", out])
    assert code == 0, err  # gfx942 is MI300X, MI300A and MI325X
    assert json.loads(out.read_text())["hardware"]["gpu_name"] == "AMD Instinct MI325X"


@pytest.mark.parametrize(("a", "b", "other"), [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", True),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", True),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", True),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100", False),  # the board is not said: not told apart
    ("AMD Instinct MI300X", "AMD Instinct MI300X", False),
])
def test_gpu_names_tell_sxm_from_pcie(a, b, other):
    assert (gpu_difference(a, b) is not None) is other


def test_import_nccl_tests_refuses_the_pcie_preset_for_sxm_logs(tmp_path):
    # an H100 SXM log (475 GB/s busbw over NVLink) was laid over h100-pcie: _gpu_models saw 'H100'
    out = tmp_path / "p.json"
    code, _, err = run_main(["calibrate", "import-nccl-tests", H100_LOG, "--base", "h100-pcie",
                             "--out", out])
    assert code == 5, err
    assert "--base h100-pcie is NVIDIA H100 PCIe, the logs ran on NVIDIA H100 80GB HBM3" in err
    assert not out.exists()


def test_import_nccl_tests_refuses_logs_of_two_gpus(tmp_path):
    out = tmp_path / "mix.json"
    code, _, err = run_main(["calibrate", "import-nccl-tests",
                             NCCL / "a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt",
                             A3MEGA, "--out", out])
    assert code == 5, err
    assert "NVIDIA A100-SXM4-40GB" in err and "NVIDIA H100 80GB HBM3" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_log_not_reproduced_within_10_percent_is_noted_in_the_profile(tmp_path):
    # the note was appended after the profile was saved: printed, never in provenance.notes
    out = tmp_path / "two.json"
    code, stdout, err = run_main([
        "calibrate", "import-nccl-tests",
        A3MEGA, NCCL / "h100x80-10node-allreduce-nccl-tests-cluster-cluster01.txt", "--out", out])
    assert code == 0, err
    notes = json.loads(out.read_text())["provenance"]["notes"]
    assert any("is not reproduced within 10%" in n for n in notes), notes


def test_a_profile_written_through_a_symlink_keeps_its_csv_beside_the_target(tmp_path):
    # the CSV was named after the link, in the link's directory; report then could not find it
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "victim.json"
    target.write_text("{}")
    link = tmp_path / "link2.json"
    link.symlink_to(Path("sub") / "victim.json")
    code, _, err = run_main(["calibrate", "import-nccl-tests", H100_LOG, "--out", link])
    assert code == 0, err
    assert link.is_symlink()
    assert (tmp_path / "sub" / "victim.measurements.csv").is_file()
    assert not (tmp_path / "link2.measurements.csv").exists()
    profile = load_profile(target)
    assert profile.measurements is not None and profile.measurements.is_file()
    code, _, err = run_main(["calibrate", "report", target])
    assert code == 0, err
