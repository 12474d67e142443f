"""Probe of the calibration path (2026-12-07): a memory sweep with one size beyond the cache,
a bandwidth fit held at alpha 0, FSDP unit costs clamped at 0, NCCL_ALGO forms."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.fit import BandwidthModel
from calibration.importers import _pinned_algorithm, import_nccl_tests
from calibration.run import _fit_memory

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
MiB = 1 << 20


def memory_rows(cache_rate, memory_rate, sizes, llc):
    """copy times: sizes whose bytes over 2 ranks fit in 2 x LLC run at the cache's rate."""
    return pd.DataFrame([{"kind": "memory", "kernel": "copy", "nbytes": float(n),
                          "time_s": n / (cache_rate if 2 * n <= 2 * llc else memory_rate)}
                         for n in sizes])


def test_one_size_beyond_the_cache_gives_the_memory_rate_not_the_caches():
    # the CPU's quick sweep: copies of 16 and 64 MiB, a 32 MiB LLC, 2 ranks: only 64 MiB is beyond
    df = memory_rows(44e9, 18e9, [MiB, 4 * MiB, 16 * MiB, 64 * MiB], 32 * MiB)
    fits, hw, notes = {}, {}, []
    _fit_memory(df, {"local_world": 2, "last_level_cache_bytes": 32 * MiB}, fits, hw, notes)
    assert hw["memory_bandwidth_bytes_per_s"] == pytest.approx(18e9, rel=1e-9)
    assert fits["memory/copy"]["params"]["bandwidth_bytes_per_s"] == pytest.approx(18e9)
    assert any("one size beyond the cache" in n for n in notes)


def test_two_sizes_beyond_the_cache_are_fitted_as_before():
    df = memory_rows(44e9, 18e9, [MiB, 16 * MiB, 64 * MiB, 256 * MiB], 32 * MiB)
    fits, hw, notes = {}, {}, []
    _fit_memory(df, {"local_world": 2, "last_level_cache_bytes": 32 * MiB}, fits, hw, notes)
    assert hw["memory_bandwidth_bytes_per_s"] == pytest.approx(18e9, rel=1e-3)
    assert not notes


def test_a_bandwidth_fit_held_at_alpha_zero_says_so():
    nb = np.array([16 * MiB, 64 * MiB], dtype=float)
    df = pd.DataFrame({"nbytes": nb, "time_s": [nb[0] / 44e9, nb[1] / 18e9]})
    model = BandwidthModel("copy", tail=1.0).fit(df)
    assert model.alpha_s_ >= 0 and np.isfinite(model.bandwidth_bytes_per_s_)
    assert model.alpha_pinned_  # the line wanted a negative fixed cost
    fits, hw, notes = {}, {}, []
    _fit_memory(df.assign(kind="memory", kernel="copy"), {"local_world": 2,
                "last_level_cache_bytes": 1 << 30}, fits, hw, notes)
    assert any("held at 0" in n for n in notes) and any("no size beyond" in n for n in notes)
    clean = pd.DataFrame({"nbytes": nb, "time_s": 1e-5 + nb / 18e9})
    assert not BandwidthModel("copy", tail=1.0).fit(clean).alpha_pinned_


def test_fsdp_unit_costs_held_at_zero_are_said():
    from calibration.layers import fit_fsdp_costs
    from tests.unit.test_calibration_layers import HW, MS, fsdp_records

    fits, notes = {}, []
    params = fit_fsdp_costs(fsdp_records(-20 * MS, 3 * MS, 5 * MS), HW, fits, notes)
    assert params["fsdp_forward_overhead_s"] == 0.0
    assert any("FSDP unit costs: held at 0" in n and "forward" in n for n in notes)
    fits, notes = {}, []
    fit_fsdp_costs(fsdp_records(2 * MS, 3 * MS, 5 * MS), HW, fits, notes)
    assert not notes


@pytest.mark.parametrize("value, op, pinned, noted", [
    ("ring", "all_reduce", "ring", False),
    ("tree", "all_gather", "tree", False),
    ("tree,ring", "all_reduce", None, True),
    ("^nvls", "all_reduce", None, True),
    ("allreduce:tree;allgather:ring", "all_reduce", "tree", False),
    ("allreduce:tree;allgather:ring", "all_gather", "ring", False),
    ("allreduce:tree", "reduce_scatter", None, True),
    ("ring;allreduce:tree", "reduce_scatter", "ring", False),
    ('"nvls"', "all_reduce", "nvls", False),
])
def test_nccl_algo_forms(value, op, pinned, noted):
    got, why = _pinned_algorithm(value, op)
    assert got == pinned and bool(why) == noted


@pytest.mark.parametrize("value, fitted", [("Tree,Ring", "ring"), ("^NVLS", "ring"),
                                            ("allreduce:tree", "tree"), ("Tree", "tree")])
def test_nccl_algo_of_a_log(tmp_path, value, fitted):
    lines = LOG.read_text().splitlines()
    lines.insert(3, f"cnode3-002:4180122:4180122 [0] NCCL INFO NCCL_ALGO set by environment to "
                    f"{value}")
    path = tmp_path / "all_reduce.txt"
    path.write_text("\n".join(lines) + "\n")
    result = import_nccl_tests([path])
    assert list(result.fits) == [f"collective/all_reduce/intra/{fitted}"]


def collective_rows(noise, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [8 * 4**i for i in range(11)]
    return pd.DataFrame([{"kind": "collective", "op": "all_reduce", "scope": "intra",
                          "group": "world", "ranks": 2, "nbytes": float(n), "spread": 0.1,
                          "time_s": (3e-4 + n / 1.5e9) * float(np.exp(rng.normal(0, noise)))}
                         for n in sizes])


def test_a_collective_fit_that_misses_its_measurements_is_said():
    from calibration.run import _fit_collectives

    for noise, said in ((0.0, False), (1.0, True)):
        fits, hw, notes = {}, {}, []
        _fit_collectives(collective_rows(noise), {"local_world": 2}, fits, hw, notes, {})
        assert any("misses its measurements" in n for n in notes) == said, notes


def test_a_kernel_measured_only_in_the_cache_does_not_set_the_memory_bandwidth():
    # 1 rank: the copy (2 x 32 MiB moved at most) never leaves a 32 MiB LLC, the triad (3 x) does
    rows = [{"kind": "memory", "kernel": "copy", "nbytes": float(n), "time_s": n / 145e9}
            for n in (16 * MiB, 64 * MiB)]
    rows += [{"kind": "memory", "kernel": "triad", "nbytes": float(n),
              "time_s": n / (60e9 if n <= 64 * MiB else 13e9)} for n in (24 * MiB, 96 * MiB)]
    fits, hw, notes = {}, {}, []
    _fit_memory(pd.DataFrame(rows), {"local_world": 1, "last_level_cache_bytes": 32 * MiB},
                fits, hw, notes)
    assert hw["memory_bandwidth_bytes_per_s"] == pytest.approx(13e9)
    assert any("copy: no size beyond the cache" in n for n in notes)
