"""Spec input a probe (2026-12-03) found read without refusal, or crashing: a fraction of a peak
of 1e-300 gave a step time of 300 digits with exit 0; an integer above 1.8e308 in a model or
hardware spec was "internal error: OverflowError"; a calibration profile of CPU ranks, or of an
H100 SXM node, was laid over a GPU preset, or over the PCIe H100, under that preset's name (the
CPU profile's bf16 peak beside the H100's fp16, "fastest 16-bit" at H100 speed; SXM NVLink fits
pricing PCIe links, 4.02 ms for 36.79 ms); a layer graph whose flops, GEMM sizes, params,
channels or sizes disagreed was read as given (MFU 1112189%). Each test fails before its fix."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from perfmodel.errors import SpecError
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.layers import LayerGraphSpec, layer_graph_from_dict
from perfmodel.specs.model import load_model
from perfmodel.specs.profile import apply_profile, load_profile, profile_from_dict
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main

CPU_PROFILE = str(ROOT / "docs/examples/cpu.json")
H100 = "NVIDIA H100 80GB HBM3"
HUGE = 10**400  # YAML and JSON read it exactly; no float holds it


def _one_line_refusal(code: int, err: str) -> str:
    assert code == SpecError.exit_code, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "internal error" not in err, err
    return err


# --- 1. a fraction of a peak has a floor ----------------------------------------------------
@pytest.mark.parametrize("fields, name", [
    ({"memory_bandwidth_efficiency": 1e-300}, "memory_bandwidth_efficiency"),
    ({"sustained_clock_fraction": 1e-300}, "sustained_clock_fraction"),
    ({"intra_node": {"efficiency": 1e-300}}, "intra_node.efficiency"),
    ({"inter_node": {"efficiency": 1e-300}}, "inter_node.efficiency"),
    ({"gemm_efficiency": {"bf16": {"max_fraction": 1e-300}}}, "max_fraction"),
])
def test_a_fraction_of_a_peak_below_the_floor_is_refused(tmp_path, fields, name):
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump({"base": "dgx-h100", **fields}))
    code, out, err = run_main(["predict", "--model", "llama3-8b", "--hardware", str(path),
                               "--gpus", "16", "--tp", "2"])
    _one_line_refusal(code, err)
    assert f"{name} must be >= 0.001 and <= " in err and "got 1e-300" in err
    assert out == ""


@pytest.mark.parametrize("field", ["optimizer_bandwidth_efficiency",
                                   "intra_node.nvls_bandwidth_fraction"])
def test_a_fraction_whose_zero_means_unset_keeps_zero_and_has_the_floor(tmp_path, field):
    from perfmodel.specs.loading import FRACTION_FLOOR  # new with the fix

    def spec(value):
        top, _, leaf = field.rpartition(".")
        path = tmp_path / f"{value}.yaml"
        path.write_text(yaml.safe_dump({"base": "dgx-h100",
                                        **({top: {leaf: value}} if top else {leaf: value})}))
        return str(path)

    load_hardware(spec(0))  # 0: not measured / no NVLS
    load_hardware(spec(FRACTION_FLOOR))
    with pytest.raises(SpecError, match=rf"{field} must be 0, or >= 0.001 and <= 1, got 1e-300"):
        load_hardware(spec(1e-300))


def test_a_split_k_chunk_below_one_element_is_refused(tmp_path):
    # it divides k: 1e-300 gave "internal error: step time is not finite"
    path = tmp_path / "hw.yaml"
    path.write_text("base: dgx-h100\ngemm_efficiency:\n  bf16:\n    split_k_ratio: 1.0e6\n"
                    "    split_k_chunk: 1.0e-300\n")
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", str(path),
                             "--gpus", "8", "--tp", "8"])
    _one_line_refusal(code, err)
    assert "split_k_chunk must be 0, or >= 1 and <= 1e+09, got 1e-300" in err


def test_what_if_and_vary_go_through_the_same_floor():
    code, _, err = run_main(["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100",
                             "--gpus", "8", "--global-batch", "8", "--what-if",
                             "memory_bandwidth_efficiency=1e-300"])
    _one_line_refusal(code, err)
    assert "memory_bandwidth_efficiency must be >= 0.001 and <= 1, got 1e-300" in err
    code, _, err = run_main(["sweep", "--model", "vgg16", "--hardware", "dgx-v100", "--gpus",
                             "16", "--global-batch", "256", "--pr", "2", "--vary",
                             "intra_node.efficiency=1e-300"])
    _one_line_refusal(code, err)
    assert "intra_node.efficiency must be >= 0.001 and <= 1, got 1e-300" in err


# --- 2. an integer past a float's range is refused naming the field ---------------------------
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("fields, name", [
    ({"memory_bytes": HUGE}, "memory_bytes must be >= 1e+06 and <= 1e+15, got ~1e+400"),
    ({"gpus_per_node": HUGE}, "gpus_per_node must be >= 1 and <= 65536, got ~1e+400"),
    ({"memory_bandwidth_bytes_per_s": HUGE}, "memory_bandwidth_bytes_per_s must be >= 1e+06"),
    ({"intra_node": {"bandwidth_bytes_per_s": HUGE}}, "intra_node.bandwidth_bytes_per_s must"),
])
def test_a_huge_integer_in_a_hardware_spec_is_refused(tmp_path, suffix, fields, name):
    path = tmp_path / f"hw{suffix}"
    path.write_text(json.dumps({"base": "dgx-h100", **fields}))  # JSON is YAML too
    code, _, err = run_main(["predict", "--model", "llama3-8b", "--hardware", str(path),
                             "--gpus", "16", "--tp", "2"])
    _one_line_refusal(code, err)
    assert name in err


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("field, allowed", [("vocab", "> 0 and <= 1e+08"),
                                            ("hidden", "> 0 and <= 1e+06"),
                                            ("layers", "> 0 and <= 100000")])
def test_a_huge_integer_in_a_model_spec_is_refused_with_its_range(tmp_path, suffix, field,
                                                                   allowed):
    spec = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 1000, field: HUGE}
    path = tmp_path / f"m{suffix}"
    path.write_text(json.dumps(spec))
    code, _, err = run_main(["predict", "--model", str(path), "--hardware", "dgx-h100",
                             "--gpus", "8"])
    _one_line_refusal(code, err)
    assert f"{field} must be {allowed}, got ~1e+400" in err


def test_a_whole_number_beyond_a_floats_precision_is_out_of_range_not_fractional(tmp_path):
    # 10**30 is whole; float(10**30) != 10**30 made it "must be a whole number"
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"layers": 10**30, "hidden": 256, "heads": 4,
                                    "seq_len": 128, "vocab": 1000}))
    with pytest.raises(SpecError, match=r"layers must be > 0 and <= 100000, got ~1e\+30"):
        load_model(str(path))


def test_a_huge_integer_in_a_profile_fit_or_a_layer_graph_is_refused(tmp_path):
    data = json.loads((ROOT / "docs/examples/cpu.json").read_text())
    name = next(iter(data["fits"]))
    data["fits"][name]["params"] = {"alpha_s": HUGE}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=rf"fits.{name}.params.alpha_s must be at most 1.8e\+308"):
        load_profile(path)
    graph = _small_cnn()
    graph["layers"][0]["params"] = HUGE
    with pytest.raises(SpecError, match=r"params must be >= 0 and <= 1e\+16, got ~1e\+400"):
        layer_graph_from_dict(graph, "g")


# --- 3. a profile applies to the machine it measured ------------------------------------------
def test_a_cpu_profile_over_a_gpu_preset_is_refused_naming_both():
    code, out, err = run_main(["predict", "--model", "tiny-gpt", "--profile", CPU_PROFILE,
                               "--hardware", "dgx-h100", "--gpus", "2", "--global-batch", "8"])
    _one_line_refusal(code, err)
    assert (f"was measured on CPU AMD EPYC (2 cores), hardware 'dgx-h100' is {H100}: another "
            "kind of device (CPU ranks, not a GPU)") in err
    assert out == ""
    # alone, the CPU profile is its own machine
    code, out, err = run_main(["predict", "--model", "tiny-gpt", "--profile", CPU_PROFILE,
                               "--gpus", "2", "--global-batch", "8"])
    assert code == 0, err
    assert "CPU AMD EPYC" in out


@pytest.fixture(scope="module")
def sxm_profile(tmp_path_factory):
    """calibrate import-nccl-tests of an H100 SXM node's all-reduce log, --base dgx-h100."""
    out = tmp_path_factory.mktemp("nccl") / "prof1.json"
    log = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
    code, _, err = run_main(["calibrate", "import-nccl-tests", str(log), "--out", str(out),
                             "--base", "dgx-h100"])
    assert code == 0, err
    return str(out)


def test_an_sxm_nodes_profile_over_the_pcie_h100_is_refused(sxm_profile):
    args = ["--op", "all_reduce", "--bytes", "1GiB", "--ranks", "8", "--profile", sxm_profile]
    code, _, err = run_main(["collective", "--hardware", "h100-pcie", *args])
    _one_line_refusal(code, err)
    assert (f"measured on {H100}, hardware 'h100-pcie' is NVIDIA H100 PCIe: another board "
            "(SXM, not PCIe)") in err
    for hardware in ("dgx-h100", "dgx-h100-superpod"):  # its own node, here under levels
        code, _, err = run_main(["collective", "--hardware", hardware, *args])
        assert code == 0, err


def _profile(**hardware):
    return profile_from_dict({"format": "perfmodel-profile", "version": 1, "complete": True,
                              "hardware": hardware, "fits": {}}, "p.json")


@pytest.mark.parametrize("fields, hardware, says", [
    ({"base": "dgx-h100"}, "h100-pcie", "another board (SXM, not PCIe)"),  # its base's GPU
    ({"base": "dgx-a100-80gb"}, "dgx-a100-40gb", "another memory size (80GB, not 40GB)"),
    ({"gpu_name": H100, "asynchronous_device": True}, "hgx-h200", "another GPU (H100, not H200)"),
    ({"asynchronous_device": False}, "mi300x", "another kind of device (CPU ranks, not a GPU)"),
])
def test_a_profile_of_another_machine_is_refused_by_the_api(fields, hardware, says):
    with pytest.raises(SpecError, match=r"a profile prices the machine it measured") as err:
        apply_profile(load_hardware(hardware), _profile(**fields))
    assert says in str(err.value)


def test_a_profile_whose_base_has_another_node_link_is_refused(tmp_path):
    # the same GPU name, another link inside the node: the base's fits price NVLink
    path = tmp_path / "pcie-sxm.yaml"
    path.write_text("base: dgx-h100\nintra_node: {bandwidth_bytes_per_s: 64.0e9}\n")
    with pytest.raises(SpecError, match=r"another node \(its base dgx-h100: intra_node 450 GB/s, "
                                        r"this 64 GB/s\)"):
        apply_profile(load_hardware(str(path)), _profile(base="dgx-h100"))


@pytest.mark.parametrize("fields, hardware", [
    ({"base": "dgx-h100"}, "dgx-h100"),
    ({"base": "dgx-h100"}, "dgx-h100-superpod"),
    ({"gpu_name": H100, "asynchronous_device": True}, "dgx-h100"),  # a GPU's calibrate run
    ({"gpu_name": "NVIDIA A100-SXM4-80GB"}, "dgx-a100-80gb"),
])
def test_a_profile_of_the_same_machine_is_laid_over_it(fields, hardware):
    spec = apply_profile(load_hardware(hardware), _profile(**fields))
    assert spec.gpu_name == load_hardware(hardware).gpu_name


def test_a_profile_that_says_nothing_of_its_machine_is_used_with_a_note():
    from perfmodel.specs.profile import check_machine  # new with the fix (was check_gpu)

    note = check_machine(load_hardware("mi300x"), _profile(kernel_overhead_s=5e-6))
    assert note is not None and "names no GPU (hardware.gpu_name)" in note
    # a base that is a file of the machine it was imported on: its GPU is still compared
    far = {"base": "nowhere/cluster.yaml", "gpu_name": H100}
    note = check_machine(load_hardware("dgx-h100"), _profile(**far))
    assert note is not None and "its base nowhere/cluster.yaml cannot be read here" in note
    with pytest.raises(SpecError, match="another GPU"):
        check_machine(load_hardware("mi300x"), _profile(**far))


# --- 4. a layer graph's derived sizes agree with the others -----------------------------------
def _small_cnn():
    """docs/specs.md's small-cnn, as its docs-check file."""
    text = (ROOT / "docs/specs.md").read_text()
    start = text.index("kind: layers\nname: small-cnn")
    return yaml.safe_load(text[start:text.index("```", start)])


def test_the_documented_small_cnn_loads():
    graph = layer_graph_from_dict(_small_cnn(), "small-cnn")
    assert graph.flops_per_sample == 884736 + 65536 + 16384 + 16384 + 81920


def test_a_layer_whose_flops_disagree_with_its_gemm_is_refused(tmp_path):
    graph = _small_cnn()
    graph["layers"][0]["flops"] = 884736000000
    path = tmp_path / "bad_flops.yaml"
    path.write_text(yaml.safe_dump(graph))
    code, out, err = run_main(["predict", "--model", str(path), "--hardware", "dgx-v100",
                               "--pr", "2", "--pc", "4", "--global-batch", "256"])
    _one_line_refusal(code, err)
    assert ("layers[0]: layer 'conv1' (conv).flops is 8.84736e+11, but 2 x gemm_m 1024 x "
            "gemm_n 16 x gemm_k 27 is 884736") in err
    assert out == ""


@pytest.mark.parametrize("index, change, says", [
    (0, {"gemm_k": 27000}, r"flops is 884736, but 2 x gemm_m 1024 x gemm_n 16 x gemm_k 27000 "
                           r"is 8.84736e\+08"),
    (0, {"params": 1e9}, r"'conv1' \(conv\).params is 1e\+09, more than its GEMM holds: "
                         r"gemm_k x gemm_n = 432 weights"),
    (0, {"out_elements": 1000}, r"out_elements is 1000, but gemm_m 1024 x gemm_n 16 is 16384"),
    (5, {"in_elements": 40}, r"'fc' \(linear\).in_elements is 40, but gemm_m 1 x gemm_k 4096"),
    (1, {"channels": 100000}, r"'bn1' \(norm\).channels is 100000, which does not divide its "
                              r"out_elements 16384"),
    (2, {"in_elements": 999}, r"'relu1' \(activation\).in_elements is 999, but its "
                              r"out_elements"),
    (3, {"params": 1000}, r"'pool1' \(pool\).params is 1000: a pool layer holds no weights"),
    (5, {"channels": 10}, r"'fc' \(linear\).channels is 10: channels are a norm layer's"),
    (3, {"gemm_n": 16}, r"'pool1' \(pool\).gemm_n is 16: a GEMM view is a conv's or linear's"),
])
def test_a_layer_whose_sizes_disagree_is_refused_naming_field_and_values(index, change, says):
    graph = _small_cnn()
    graph["layers"][index].update(change)
    with pytest.raises(SpecError, match=says):
        layer_graph_from_dict(graph, "g")
    layers = layer_graph_from_dict(_small_cnn(), "g").layers  # and by the API
    bad = dataclasses.replace(layers[index], **change)
    with pytest.raises(SpecError, match=says):
        LayerGraphSpec(name="g", layers=(*layers[:index], bad, *layers[index + 1:]))


def test_sizes_within_a_rounding_pass():
    graph = _small_cnn()
    graph["layers"][0]["flops"] = 8.85e5  # 884,736 to 3 significant figures
    layer_graph_from_dict(graph, "g")


def test_a_layers_input_is_not_compared_with_the_layer_before():
    # ResNet's shortcut conv reads its block's input, not the norm before it: the builders and
    # the traced graphs (validation.cnn_graph) load as before
    from perfmodel.specs.cnn import BUILDERS

    for build in BUILDERS.values():
        build()
    for name in ("alexnet", "vgg16", "resnet50"):
        assert load_model(str(ROOT / f"tests/data/cnn/{name}.json")).layers


def test_a_traced_linear_over_rows_has_them_as_its_gemm_rows():
    # nn.Linear(30, 20) on [1, 8, 30]: 8 rows of 30 -> 20, the GEMM [8, 30] @ [30, 20] (m was 1
    # and k 240, so that out_elements 160 was not m x n)
    graph = layer_graph_from_dict({"kind": "layers", "name": "t", "layers": [
        {"name": "lin", "kind": "linear", "input_shape": [1, 8, 30], "output_shape": [1, 8, 20],
         "out_features": 20, "params": 620, "flops": 2 * 8 * 20 * 30}]}, "t")
    lin = graph.layers[0]
    assert (lin.gemm_m, lin.gemm_n, lin.gemm_k) == (8, 20, 30)
    assert (lin.in_elements, lin.out_elements) == (240, 160)
