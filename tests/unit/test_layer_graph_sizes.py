"""A layer graph's sizes as a user's file gives them (a layer-graph probe, 2026-12-07): a size
left out is worked out from the GEMM where the format says how (docs/specs.md: out_elements =
gemm_m x gemm_n, flops = 2 m n k), a size nothing implies and the model reads is asked for, and
what a file gives is read or refused, never dropped."""

from __future__ import annotations

import re

import pytest

from perfmodel.errors import SpecError
from perfmodel.layerwise import GridPlan, predict_grid
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.layers import layer_graph_from_dict
from tests.unit.test_bad_input import run_main

CONV = dict(name="c1", kind="conv", params=448, flops=884736, in_elements=3072,
            out_elements=16384, gemm_m=1024, gemm_n=16, gemm_k=27)
FC = dict(name="fc", kind="linear", params=16 * 10 + 10, flops=2 * 16 * 10, in_elements=16,
          out_elements=10, gemm_m=1, gemm_n=10, gemm_k=16)


def _graph(*layers: dict) -> object:
    return layer_graph_from_dict({"kind": "layers", "name": "g", "layers": list(layers)}, "test")


def test_a_size_left_out_is_the_one_its_gemm_implies():
    whole = _graph(CONV, dict(name="r", kind="activation", in_elements=16384,
                              out_elements=16384), FC)
    omitted = _graph({k: v for k, v in CONV.items() if k != "out_elements"},
                     dict(name="r", kind="activation", out_elements=16384),
                     {k: v for k, v in FC.items()
                      if k not in ("flops", "in_elements", "out_elements")})
    assert omitted == whole
    plan = GridPlan(pr=2, pc=4, global_batch=256)
    a, b = (predict_grid(g, load_hardware("dgx-v100"), plan) for g in (whole, omitted))
    assert a.step_time_s == b.step_time_s and a.model_flops_per_step == b.model_flops_per_step


def test_an_implied_size_is_bounded_as_a_given_one():
    with pytest.raises(SpecError, match=r"flops \(left out: 2 x gemm_m 1e\+12.*<= 1e\+18"):
        _graph(dict(name="c", kind="conv", gemm_m=1e12, gemm_n=1e12, gemm_k=1e12))


@pytest.mark.parametrize(("layers", "needs"), [
    ([CONV, dict(name="p", kind="pool", out_elements=100)], "'p' (pool) needs in_elements"),
    ([CONV, dict(name="a", kind="activation")], "'a' (activation) needs in_elements"),
    ([CONV, {k: v for k, v in CONV.items() if k != "in_elements"} | {"name": "c2"}],
     "'c2' (conv) needs in_elements > 0: its input gradient"),
])
def test_a_size_the_model_reads_and_nothing_implies_is_asked_for(layers, needs):
    with pytest.raises(SpecError, match=re.escape(needs)):
        _graph(*layers)


def test_the_first_conv_needs_no_input_size():
    """Its input gradient is never computed: nothing reads its in_elements."""
    _graph({k: v for k, v in CONV.items() if k != "in_elements"})


@pytest.mark.parametrize(("entry", "message"), [
    (dict(CONV, name=[1]), "a layer's name must be a non-empty string, got \\[1\\]"),
    ({k: v for k, v in CONV.items() if k != "kind"}, r"layers\[0\] needs kind: one of conv"),
    (dict(CONV, kernel_size=-3), "kernel_size must be >= 1"),
    (dict(CONV, in_channels=3, kernel_size=[2, 2]), "gemm_k 27 is more than in_channels 3 x "
                                                    "kernel area 4"),
    (dict(FC, in_features=17), "in_features is 17, but gemm_k 16"),
    (dict(CONV, weight_bytes=448), "weight_bytes is 448, but 4 x params 448 is 1792"),
])
def test_what_a_layer_gives_is_read_or_refused(entry, message):
    with pytest.raises(SpecError, match=message):
        _graph(entry)


def test_the_traced_numbers_that_agree_are_taken():
    _graph(dict(CONV, in_channels=3, kernel_size=[3, 3], weight_bytes=1792),
           dict(FC, in_features=16))


def test_a_base_or_another_kind_is_refused_by_name(tmp_path):
    graph = tmp_path / "b.yaml"
    graph.write_text("kind: layers\nbase: vgg16\nname: x\nlayers:\n  - {name: c, kind: conv, "
                     "gemm_m: 1024, gemm_n: 16, gemm_k: 27}\n")
    code, _, err = run_main(["predict", "--model", str(graph), "--hardware", "dgx-v100",
                             "--pr", "2", "--pc", "4", "--global-batch", "256"])
    assert code == 3 and "base builds a transformer spec" in err
    other = tmp_path / "k.yaml"
    other.write_text("kind: cnn\nname: x\nlayers: []\n")
    code, _, err = run_main(["predict", "--model", str(other), "--hardware", "dgx-v100",
                             "--pr", "2", "--pc", "4", "--global-batch", "256"])
    assert code == 3 and "kind must be 'transformer' (the default) or 'layers'" in err


def test_sweep_refuses_two_fields_that_set_one_quantity():
    code, _, err = run_main(["sweep", "--model", "resnet50", "--hardware", "dgx-v100", "--gpus",
                             "8", "--global-batch", "256", "--dtype", "fp16", "--vary",
                             "peak_flops_per_s=5e13,1e14", "--vary", "peak_flops_per_s.fp16=1e14"])
    assert code == 2
    assert "--vary peak_flops_per_s.fp16 and --vary peak_flops_per_s set the same quantity" in err


def test_a_sweep_point_says_its_memory_and_whether_it_fits():
    """VGG-16 at a global batch of 4096 on 8 V100s needs 66.8 GiB of the 32: the sweep listed it
    as any other point (a layer-graph probe, 2026-12-07); its row now says so, as predict does."""
    import json

    code, out, _ = run_main(["sweep", "--model", "vgg16", "--hardware", "dgx-v100", "--gpus",
                             "8", "--vary", "global_batch=256,4096",
                             "--json"])
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["fits_in_memory"] for r in rows] == [True, False]
    code, out, _ = run_main(["predict", "--model", "vgg16", "--hardware", "dgx-v100", "--gpus",
                             "8", "--global-batch", "4096", "--pr", "1", "--json"])
    assert rows[1]["memory_per_gpu_bytes"] == json.loads(out)["memory_per_gpu_bytes"]
