"""Imports of published measurements that used to write a profile perfmodel then misread
(2026-12-02 probe): GEMM fits against a peak the hardware does not have, in the wrong units, of
several campaigns at once; nccl-tests logs read as another collective, or of some of a host's
GPUs. Each test fails before its fix."""

from __future__ import annotations

import pandas as pd
import pytest

from calibration.importers import import_gemm, import_nccl_tests
from perfmodel.errors import DataError
from tests.conftest import ROOT

GEMM = ROOT / "tests/data/gemm/xla-matmul-perf-table-h100-sm90-bf16-f32-fp8.csv"
NCCL = ROOT / "tests/data/nccl-tests"


def _bf16(tmp_path, name: str, **change) -> object:
    rows = pd.read_csv(GEMM)
    rows = rows[rows["dtype"] == "bf16xbf16->bf16"].rename(columns={"device_key": "device"})
    rows = rows.assign(dtype="bf16")
    for column, value in change.items():
        if value is None:
            rows = rows.drop(columns=[column])
        elif callable(value):
            rows[column] = value(rows[column])
        else:
            rows[column] = value
    path = tmp_path / name
    rows.to_csv(path, index=False)
    return path


def test_a_gemm_table_without_its_device_writes_no_efficiency(tmp_path):
    # its fractions would be of the best measured rate, and predict scales the hardware's peak
    result = import_gemm([_bf16(tmp_path, "nodev.csv", device=None)])
    assert "gemm_efficiency" not in result.hardware
    assert any("no datasheet peak known" in n for n in result.notes)
    assert "bf16" in import_gemm([_bf16(tmp_path, "dev.csv")]).hardware["gemm_efficiency"]


def test_a_gemm_table_in_the_wrong_units_is_refused(tmp_path):
    with pytest.raises(DataError, match="check the table's units"):
        import_gemm([_bf16(tmp_path, "tf.csv", flops_per_s=lambda f: f / 1e12)])
    with pytest.raises(DataError, match="up to 1e18 FLOP/s"):
        import_gemm([_bf16(tmp_path, "huge.csv", flops_per_s=1e300)])


def test_two_campaigns_of_one_dtype_write_neither(tmp_path):
    one = _bf16(tmp_path, "one.csv", source_commit="aaaaaaaa")
    two = _bf16(tmp_path, "two.csv", source_commit="bbbbbbbb")
    result = import_gemm([one, two])
    assert len(result.fits) == 2 and "gemm_efficiency" not in result.hardware
    assert any("which one the hardware takes is not chosen" in n for n in result.notes)


def test_more_folds_than_shapes_are_refused(tmp_path):
    path = _bf16(tmp_path, "dev.csv")
    shapes = len(pd.read_csv(path))
    with pytest.raises(DataError, match=f"--folds {shapes + 1} exceeds the {shapes} shapes"):
        import_gemm([path], folds=shapes + 1)


def test_a_log_is_read_as_the_collective_its_bus_factor_says(tmp_path):
    # nccl-tests: busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather
    text = (NCCL / "h100x8-allgather-nccl-tests-cluster-cluster01.txt").read_text()
    renamed = tmp_path / "allreduce-run3.txt"
    renamed.write_text("\n".join(ln for ln in text.splitlines() if "_perf" not in ln) + "\n")
    with pytest.raises(DataError, match="busbw / algbw is 0.875 .* the log measured all_gather"):
        import_nccl_tests([renamed])
    with pytest.raises(DataError, match="--op all_gather, but the log ran all_reduce"):
        import_nccl_tests([NCCL / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"],
                          op="all_gather")
    with pytest.raises(DataError, match="--algorithm tree: all_gather has no tree form"):
        import_nccl_tests([NCCL / "h100x8-allgather-nccl-tests-cluster-cluster01.txt"],
                          algorithm="tree")


def test_a_one_host_log_does_not_say_how_many_gpus_a_node_has():
    one_host = import_nccl_tests([NCCL / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt"])
    assert "gpus_per_node" not in one_host.hardware
    nodes = import_nccl_tests([NCCL / "h100x80-10node-allreduce-nccl-tests-cluster-cluster01.txt"])
    assert nodes.hardware["gpus_per_node"] == 8


def test_a_base_of_another_gpu_is_refused(tmp_path):
    from tests.unit.test_bad_input import run_main

    log = str(NCCL / "h100x8-allreduce-nccl-tests-cluster-cluster01.txt")
    code, _, err = run_main(["calibrate", "import-nccl-tests", log, "--base", "mi300x",
                             "--out", str(tmp_path / "mi.json")])
    assert code == 5 and "--base mi300x is AMD Instinct MI300X, the logs ran on NVIDIA H100" in err
    code, _, err = run_main(["calibrate", "import-nccl-tests", log, "--base", "dgx-h100",
                             "--out", str(tmp_path / "h.json")])
    assert code == 0, err
