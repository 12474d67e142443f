"""Spec files, layer graphs, `collective` and `sweep` where a probe found them silently wrong or
idle (2026-12-02): a base read from the working directory, labels that are not text, a batch
that a layer-graph row stopped, transformer options a layer graph ignored, idle grid options,
a layer graph's memory without its reserves, a collective priced apart from predict. Each test
fails before its fix."""

from __future__ import annotations

import json

import pytest

from perfmodel.errors import SpecError
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.layers import LayerGraphSpec, LayerSpec
from perfmodel.specs.model import load_model
from tests.unit.test_bad_input import run_main

GRAPH = ["--hardware", "dgx-v100", "--global-batch", "256"]


def test_a_models_base_is_read_beside_the_spec(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "parent.yaml").write_text("base: llama3-8b\nlayers: 16\n")
    (sub / "child.yaml").write_text("base: parent.yaml\nhidden: 2048\nheads: 16\nkv_heads: 8\n")
    (tmp_path / "parent.yaml").write_text("base: llama3-70b\n")  # another file where we stand
    monkeypatch.chdir(tmp_path)
    spec = load_model("sub/child.yaml")
    assert (spec.layers, spec.hidden, spec.name) == (16, 2048, "sub/child.yaml")
    (tmp_path / "cyc.yaml").write_text("base: cyc.yaml\nlayers: 2\n")
    with pytest.raises(SpecError, match="forms a cycle"):
        load_model("cyc.yaml")


@pytest.mark.parametrize("kind, text, says", [
    ("hardware", "base: dgx-h100\nname: null\n", "name must be a non-empty string, got None"),
    ("hardware", "base: dgx-h100\ngpu_name: [a]\n", "gpu_name must be a non-empty string"),
    ("model", "base: llama3-8b\nname: ''\n", "name must be a non-empty string, got ''"),
    ("model", "base: llama3-8b\nsource: [x]\n", "source must be a string"),
])
def test_a_label_that_is_not_text_is_refused(tmp_path, kind, text, says):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=says):
        (load_hardware if kind == "hardware" else load_model)(path)


def test_a_layer_graph_row_of_a_batch_is_one_bad_row(tmp_path):
    plans = tmp_path / "plans.csv"
    plans.write_text("model,gpus,dp,global_batch\nllama3-8b,8,8,8\nalexnet,16,,256\n"
                     "llama3-8b,8,8,8\n")
    out = tmp_path / "out.csv"
    code, _, err = run_main(["predict", "--batch", str(plans), "--hardware", "dgx-h100",
                             "--out", str(out)])
    assert code == 5 and "'alexnet' is a layer graph" in err and "Traceback" not in err
    assert out.read_text().count("llama3-8b,8,8,8,") == 2


@pytest.mark.parametrize("extra, says", [
    (["--pr", "2", "--pc", "8", "--attention", "flash"], "--attention: a transformer's"),
    (["--pr", "2", "--pc", "8", "--recompute-every", "2"], "--recompute-every: a transformer's"),
    (["--pr", "2", "--pc", "8", "--micro-batch", "4"], "--micro-batch beside --global-batch"),
    # idle where the grid makes them so
    (["--model", "alexnet", "--pr", "2", "--pc", "8", "--norm", "sync"], "has no norm layer"),
    (["--pr", "16", "--pc", "1", "--norm", "sync"], "the grid has Pc 1"),
    (["--pr", "1", "--pc", "16", "--collective-variant", "split"], "the grid has Pr 1"),
    (["--pr", "2", "--pc", "8", "--contributors", "specialised"], "fewer units than Pr (2)"),
])
def test_a_layer_graph_refuses_options_that_change_nothing(extra, says):
    model = [] if "--model" in extra else ["--model", "resnet50"]
    code, _, err = run_main(["predict", *model, *GRAPH, *extra])
    assert code == 2 and says in err, err


def test_a_layer_graph_takes_the_collective_algorithm():
    runs = [run_main(["predict", "--model", "resnet50", *GRAPH, "--pr", "2", "--pc", "8",
                      "--json", *extra]) for extra in ([], ["--collective-algorithm", "tree"])]
    assert all(code == 0 for code, _, _ in runs)
    auto, tree = (json.loads(out)["step_time_s"] for _, out, _ in runs)
    assert tree != auto


def test_explain_of_a_layer_graph_refuses_a_grid_and_terms():
    for extra, says in ((["--pr", "4"], "explain analyses a layer graph over every"),
                        (["--term", "comm"], "--term selects a transformer's terms")):
        code, _, err = run_main(["explain", "--model", "alexnet", *GRAPH, "--gpus", "16",
                                 *extra])
        assert code == 2 and says in err


def test_a_layer_graphs_memory_counts_its_reserves():
    code, out, _ = run_main(["predict", "--model", "resnet50", "--hardware", "dgx-h100",
                             "--pr", "1", "--pc", "8", "--global-batch", "4000", "--json"])
    data = json.loads(out)
    terms = data["memory_breakdown_bytes"]
    # dgx-h100: fragmentation 0.15 of the activations, one NCCL communicator (Pc's)
    assert terms["reserved/fragmentation"] == pytest.approx(terms["activations"] * 0.15 / 0.85)
    assert terms["reserved/nccl_buffers"] == load_hardware("dgx-h100").nccl_buffer_bytes
    assert data["fits_in_memory"] is False  # 72 GiB of tensors; 85 GiB with the reserves


@pytest.mark.parametrize("layers, says", [
    ([dict(name="c1", kind="conv", params=1, flops=2, gemm_m=1, gemm_n=64, gemm_k=1),
      dict(name="c1", kind="linear", params=1, flops=2, gemm_m=1, gemm_n=10, gemm_k=1)],
     "layer name.s. c1 given twice"),
    ([dict(name="fc", kind="linear", params=1, flops=2, gemm_m=1, gemm_n=64.5, gemm_k=1)],
     "gemm_n must be a whole number"),
    ([dict(name="bn", kind="norm")], "needs channels > 0"),
])
def test_a_layer_graph_spec_is_checked(layers, says):
    with pytest.raises(SpecError, match=says):
        LayerGraphSpec(name="g", layers=tuple(LayerSpec(**layer) for layer in [
            *layers, dict(name="out", kind="linear", params=1, flops=2, gemm_m=1, gemm_n=2,
                          gemm_k=1)]))


def test_collective_prices_as_predict_does(tmp_path):
    spec = tmp_path / "tree.yaml"
    spec.write_text("base: dgx-h100\ncollective_algorithm: tree\n")
    code, out, _ = run_main(["collective", "--hardware", str(spec), "--op", "all_reduce",
                             "--bytes", "1GiB", "--ranks", "16", "--json"])
    assert code == 0 and json.loads(out)["algorithm"] == "tree"
    fit = tmp_path / "fit.yaml"
    fit.write_text("base: dgx-h100\ncollectives:\n  - {op: all_reduce, scope: intra, algorithm: "
                   "ring, alpha_s: 4.471e-06, bus_bandwidth_bytes_per_s: 4.75e+11}\n")
    code, _, err = run_main(["collective", "--hardware", str(fit), "--op", "all_reduce",
                             "--bytes", "64MiB", "--ranks", "8", "--algorithm", "tree"])
    assert code == 4 and "has a calibrated fit of all_reduce" in err


def test_sweep_varies_what_a_layer_graph_reads(tmp_path):
    base = ["sweep", "--model", "resnet50", "--hardware", "dgx-h100", "--gpus", "16",
            "--global-batch", "256"]
    code, _, err = run_main([*base, "--vary", "memory_bytes=3e10,6e10"])
    assert code == 2 and "a layer graph reads no field 'memory_bytes'" in err
    levels = tmp_path / "f3.yaml"
    levels.write_text(
        "base: dgx-b200\nlevels:\n"
        "  - {name: rack, gpus: 72, bandwidth_bytes_per_s: 9.0e11, latency_s: 3.0e-6}\n"
        "  - {name: spine, bandwidth_bytes_per_s: 4.0e11, latency_s: 7.0e-6}\n")
    code, out, err = run_main(["sweep", "--model", "resnet50", "--hardware", str(levels),
                               "--gpus", "144", "--global-batch", "576", "--json", "--vary",
                               "levels.1.bandwidth_bytes_per_s=1e10,1e12"])
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert rows[0]["step_time_s"] > rows[1]["step_time_s"]
