"""Fabrics of more than two levels (a probe of 2026-12-07): a group is priced on the levels it
crosses, the slowest one's bandwidth and the most latency, so that a level made faster never
slows it; a level's bandwidth out of a node link's range is refused naming the level's field;
the advice for a GPU count that is not whole nodes names the field a spec with levels sets."""
import itertools

import pytest

from perfmodel import load_hardware, predict
from perfmodel.collective import predict_collective
from perfmodel.errors import PlanError, SpecError
from perfmodel.strategy import Plan

THREE = """base: dgx-h100
levels:
  - {{name: nvlink, gpus: 8, bandwidth_bytes_per_s: 450.0e9, latency_s: 3.4e-6}}
  - {{name: leaf, gpus: 64, bandwidth_bytes_per_s: {leaf}, latency_s: {leaf_latency}}}
  - {{name: spine, bandwidth_bytes_per_s: {spine}, latency_s: {spine_latency}}}
"""


def _spec(tmp_path, name="fabric.yaml", **values):
    fields = dict(leaf=50e9, leaf_latency=1e-4, spine=25e9, spine_latency=1e-6)
    path = tmp_path / name
    path.write_text(THREE.format(**{**fields, **values}))
    return load_hardware(path)


def _time(hardware, nbytes, ranks, per_node):
    return predict_collective("all_reduce", nbytes, ranks, hardware, per_node)["time_s"]


def test_a_faster_spine_does_not_slow_a_group_that_crosses_the_leaf_too(tmp_path):
    # 16 ranks, one a node, over 16 nodes: two leaf domains of 8 nodes, so the ring crosses the
    # leaf (100 us a step) and the spine; a spine at 25 GB/s priced it on the spine alone (its
    # 1 us: 8 us for 1 KiB), at 100 GB/s on the leaf alone (800 us)
    slow = _time(_spec(tmp_path, "a.yaml", spine=25e9), 1024, 16, 1)
    fast = _time(_spec(tmp_path, "b.yaml", spine=100e9), 1024, 16, 1)
    assert fast <= slow
    assert slow > 1e-4  # its steps cross the leaf: at least one of its 100 us


def test_predict_on_a_faster_level_is_no_slower(tmp_path):
    plan = Plan(gpus=512, dp=128, tp=4, global_batch=1024, placement="dp,tp,pp")
    slow = predict("gpt2-small", _spec(tmp_path, "a.yaml", spine=25e9), plan).step_time_s
    fast = predict("gpt2-small", _spec(tmp_path, "b.yaml", spine=100e9), plan).step_time_s
    assert fast <= slow


def test_no_level_made_faster_slows_any_collective(tmp_path):
    """Three-level fabrics, each level fast or slow, of short or long latency: raising one
    level's bandwidth, at small and large sizes, over the leaf and over the spine."""
    speeds, latencies = (10e9, 50e9, 200e9), (1e-6, 1e-4)
    for k, (leaf, spine, leaf_latency, spine_latency, level) in enumerate(itertools.product(
            speeds, speeds, latencies, latencies, ("leaf", "spine"))):
        base = dict(leaf=leaf, spine=spine, leaf_latency=leaf_latency,
                    spine_latency=spine_latency)
        before = _spec(tmp_path, f"{k}a.yaml", **base)
        after = _spec(tmp_path, f"{k}b.yaml", **{**base, level: base[level] * 4})
        for nbytes, (ranks, per_node) in itertools.product((8, 1 << 30), ((16, 1), (128, 8))):
            assert _time(after, nbytes, ranks, per_node) <= \
                _time(before, nbytes, ranks, per_node) * (1 + 1e-12), (base, level, ranks)


@pytest.mark.parametrize("levels", [
    # level 1 at 2e14 B/s a GPU: 1.6e15 a node of 8 (it was refused naming no level, with the
    # derived value; on level 2 it was accepted)
    "  - {name: ib, bandwidth_bytes_per_s: 2.0e14, latency_s: 1.4e-5}\n",
    "  - {name: leaf, gpus: 64, bandwidth_bytes_per_s: 5.0e10, latency_s: 1.4e-5}\n"
    "  - {name: spine, bandwidth_bytes_per_s: 2.0e14, latency_s: 1.4e-5}\n",
])
def test_a_level_whose_node_link_is_out_of_range_is_refused_by_its_field(tmp_path, levels):
    path = tmp_path / "hw.yaml"
    path.write_text("base: dgx-h100\nlevels:\n  - {name: nvlink, gpus: 8, "
                    "bandwidth_bytes_per_s: 450.0e9, latency_s: 3.4e-6}\n" + levels)
    index = levels.count("\n")
    with pytest.raises(SpecError, match=rf"levels\[{index}\]\.bandwidth_bytes_per_s \(2e\+14 a "
                                        r"GPU\) x levels\[0\]\.gpus \(8\)"):
        load_hardware(path)


def test_the_whole_node_advice_names_the_field_a_spec_with_levels_sets(tmp_path):
    with pytest.raises(PlanError, match=r"whose levels\[0\]\.gpus is the GPUs the job takes"):
        predict("llama3-8b", _spec(tmp_path), Plan(gpus=100, dp=100, global_batch=100))
    with pytest.raises(PlanError, match="whose gpus_per_node is the GPUs the job takes"):
        predict("llama3-8b", "dgx-h100", Plan(gpus=100, dp=100, global_batch=100))


def test_a_what_if_that_resizes_the_node_is_refused_before_the_search_naming_it(capsys):
    # 64 GPUs are no whole nodes of 3 x 8: refused at once, the what-if named (it was refused
    # after the search, as dgx-h100's own gpus_per_node of 24)
    from perfmodel.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64",
              "--global-batch", "512", "--what-if", "gpus_per_node=3x"])
    err = capsys.readouterr().err
    assert ended.value.code == 4 and err.count("\n") == 1
    assert err.startswith("error: --what-if gpus_per_node=3x: gpus 64 is not whole nodes of 24")
