"""validation.cnn_graph: layer graphs traced on the meta device, against published numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perfmodel import load_model  # noqa: E402
from validation import cnn_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "cnn"


@pytest.fixture(scope="module")
def graphs():
    return {name: cnn_graph.trace_builtin(name) for name in cnn_graph.BUILDERS}


# Parameter counts: torchvision model documentation ("num_params" of AlexNet_Weights.IMAGENET1K_V1,
# VGG16_Weights.IMAGENET1K_V1, ResNet50_Weights.IMAGENET1K_V1),
# https://pytorch.org/vision/stable/models.html.
# The builders reproduce those architectures layer by layer, so the counts must match exactly.
# GFLOPS in the same tables count multiply-accumulates (0.71, 15.47, 4.09 at 224 x 224); He et al.
# 2016 Table 1 gives 3.8e9 for ResNet-50 v1 (stride in the first 1x1 conv; v1.5 moves it to the 3x3,
# which costs ~0.3e9 more).
PUBLISHED = {
    "alexnet": (61_100_840, 0.71e9),
    "vgg16": (138_357_544, 15.47e9),
    "resnet50": (25_557_032, 4.09e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_match_torchvision_exactly(graphs, name):
    assert sum(layer["params"] for layer in graphs[name]["layers"]) == PUBLISHED[name][0]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_conv_and_linear_flops_are_twice_the_published_macs(graphs, name):
    flops = sum(x["flops"] for x in graphs[name]["layers"] if x["kind"] in ("conv", "linear"))
    assert flops / 2 == pytest.approx(PUBLISHED[name][1], rel=0.01)


def test_resnet50_total_flops_per_sample(graphs):
    """~8.2 GFLOPs counting 2 per MAC; norm, pooling, activations and adds add under 1 %."""
    total = sum(x["flops"] for x in graphs["resnet50"]["layers"])
    assert 8.18e9 < total < 8.30e9
    kinds = {x["kind"] for x in graphs["resnet50"]["layers"]}
    assert kinds == {"conv", "norm", "activation", "pool", "add", "flatten", "linear"}
    assert sum(x["kind"] == "add" for x in graphs["resnet50"]["layers"]) == 16  # 3 + 4 + 6 + 3


def test_a_small_module_by_hand():
    """conv 3->4, 3x3, pad 1 on 2 x 3 x 5 x 5: out 2 x 4 x 5 x 5; per sample 2 * 100 * 27 FLOPs;
    then linear 100 -> 7."""
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(100, 7),
    )
    layers = cnn_graph.layer_graph(m, (2, 3, 5, 5))
    conv, relu, flat, lin = layers
    assert conv["kind"] == "conv" and conv["out_channels"] == 4
    assert conv["input_shape"] == [2, 3, 5, 5] and conv["output_shape"] == [2, 4, 5, 5]
    assert conv["params"] == 4 * 27 + 4 and conv["weight_bytes"] == 4 * conv["params"]
    assert conv["flops"] == 2 * 100 * 27
    assert conv["activation_bytes"] == 100 * 4
    assert relu["kind"] == "activation" and relu["flops"] == 100
    assert flat["kind"] == "flatten" and flat["flops"] == 0
    assert lin["kind"] == "linear" and lin["out_features"] == 7 and lin["flops"] == 2 * 100 * 7
    # the module's real tensors were not replaced by meta ones
    assert m[0].weight.device.type == "cpu" and not m[0].weight.is_meta


def test_a_shared_module_counts_its_parameters_once():
    lin = torch.nn.Linear(8, 8)
    m = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
    layers = cnn_graph.layer_graph(m, (1, 8))
    assert [x["params"] for x in layers] == [72, 0, 0]
    assert layers[2]["flops"] == 2 * 8 * 8


def test_bad_input_shape_is_a_value_error():
    with pytest.raises(ValueError, match="input_shape"):
        cnn_graph.layer_graph(torch.nn.Linear(2, 2), (0, 2))


def test_resnet50_traces_without_real_memory():
    """In a fresh process: build on meta and trace, peak RSS + < 100 MB (the real model's fp32
    weights alone would be 102 MB). How fast it traces is benchmarks/bench_cnn_trace.py's (a
    timed assertion failed on a loaded machine: 1.11 s against its 1 s)."""
    code = (
        "import resource, time, torch\n"
        "from validation import cnn_graph\n"
        "cnn_graph.trace_builtin('alexnet', (1, 3, 64, 64))\n"  # warm up the import paths
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t = time.perf_counter()\n"
        "g = cnn_graph.trace_builtin('resnet50')\n"
        "dt = time.perf_counter() - t\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(dt, (after - before) * 1024, len(g['layers']))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seconds, grown_bytes, n = r.stdout.split()
    assert int(n) == 175 and float(seconds) > 0
    assert int(grown_bytes) < 100e6


def test_exported_presets_are_what_the_tracer_writes_and_perfmodel_reads(graphs, tmp_path):
    for name, graph in graphs.items():
        stored = json.loads((DATA / f"{name}.json").read_text())
        assert stored == json.loads(json.dumps(graph)), f"regenerate tests/data/cnn/{name}.json"
        spec = load_model(str(DATA / f"{name}.json"))
        assert spec.parameters == PUBLISHED[name][0]
    out = tmp_path / "r.yaml"
    cnn_graph.write(out, graphs["resnet50"])
    assert load_model(str(out)).flops_per_sample == pytest.approx(
        sum(x["flops"] for x in graphs["resnet50"]["layers"])
    )
