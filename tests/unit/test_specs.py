"""Spec files: presets, `base:` inheritance, Hugging Face configs, and clear errors."""

import json

import pytest

from perfmodel import SpecError, list_presets, load_hardware, load_model

REQUIRED_HARDWARE = {"dgx-v100", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "mi300x"}
REQUIRED_MODELS = {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b"}


def test_required_presets_exist_and_load():
    names = list_presets()
    assert REQUIRED_HARDWARE <= set(names["hardware"])
    assert REQUIRED_MODELS <= set(names["models"])
    for name in names["hardware"]:
        hw = load_hardware(name)
        assert hw.gpus_per_node == 8 and hw.memory_bytes > 16 * 2**30
    for name in names["models"]:
        load_model(name)


def test_a100_80gb_preset_values():
    hw = load_hardware("dgx-a100-80gb")
    assert hw.peak("bf16") == 312e12  # A100 datasheet
    assert hw.memory_bytes == 80 * 2**30
    assert hw.inter_node.bandwidth_bytes_per_s == 200e9  # 8 x 200 Gb/s HDR


def test_user_file_overrides_a_preset_through_base(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("base: dgx-h100\ninter_node:\n  bandwidth_bytes_per_s: 100.0e9\n")
    hw = load_hardware(str(path))
    assert hw.inter_node.bandwidth_bytes_per_s == 100e9
    assert hw.inter_node.latency_s == load_hardware("dgx-h100").inter_node.latency_s
    assert hw.peak("bf16") == 989.4e12


@pytest.mark.parametrize("text,needle", [
    ("base: dgx-h100\nmemory_bytes: -1\n", "memory_bytes"),
    ("base: dgx-h100\nmemroy_bytes: 1\n", "did you mean 'memory_bytes'"),
    ("base: dgx-h100\nintra_node:\n  latency_s: .nan\n", "intra_node.latency_s"),
    ("base: dgx-h100\npeak_flops_per_s: {bf17: 1.0e12}\n", "bf17"),
    ("base: no-such-preset\n", "unknown hardware preset"),
    ("gpus_per_node: [1, 2\n", "not valid YAML"),
    ("- just\n- a list\n", "must hold a mapping"),
    ("gpus_per_node: 8\n", "missing required field"),
])
def test_bad_hardware_files_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_hardware(str(path))


def test_unknown_preset_suggests_the_closest():
    with pytest.raises(SpecError, match="did you mean 'dgx-h100'"):
        load_hardware("dgx-h10")
    with pytest.raises(SpecError, match="did you mean 'llama3-8b'"):
        load_model("llama3-8")


def test_yaml_tags_are_not_executed(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_model(str(path))


def test_model_file_and_validation(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"kind": "transformer", "layers": 2, "hidden": 64, "heads": 4,
                                "seq_len": 32, "vocab": 100}))
    m = load_model(str(path))
    assert m.ffn_hidden == 256 and m.kv_heads == 4
    path.write_text(json.dumps({"kind": "transformer", "layers": 2, "hidden": 65, "heads": 4,
                                "seq_len": 32, "vocab": 100}))
    with pytest.raises(SpecError, match="divisible by heads"):
        load_model(str(path))
    path.write_text(json.dumps({"kind": "transformer", "layers": 0, "hidden": 64, "heads": 4,
                                "seq_len": 32, "vocab": 100}))
    with pytest.raises(SpecError, match="layers must be > 0"):
        load_model(str(path))


# Hugging Face config.json excerpts (field names as in transformers' configuration classes)
HF = {
    "llama": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 8192, "vocab_size": 128256, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 32768, "vocab_size": 32000},
    "qwen2": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
              "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
              "max_position_embeddings": 32768, "vocab_size": 152064},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
             "vocab_size": 50257},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 2560, "intermediate_size": 10240,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "max_position_embeddings": 2048,
                 "vocab_size": 50432},
}


@pytest.mark.parametrize("family", sorted(HF))
def test_hugging_face_configs_import(tmp_path, family):
    path = tmp_path / family / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(HF[family]))
    m = load_model(str(path), seq_len=1024)
    assert m.layers > 0 and m.hidden % m.heads == 0 and m.seq_len == 1024
    assert load_model(str(path.parent) + "/", seq_len=1024) == m  # a model directory works too
    # a config has no training sequence length: never its max_position_embeddings, silently
    with pytest.raises(SpecError, match="has no training sequence length: give --seq-len"):
        load_model(str(path))


def test_llama3_8b_from_hf_matches_the_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF["llama"]))
    from perfmodel import Plan, predict

    plan = Plan(gpus=8, tp=8, global_batch=1)
    hf = predict(load_model(str(path), seq_len=8192), "dgx-h100", plan)
    preset = predict("llama3-8b", "dgx-h100", plan)
    assert hf.parameters == preset.parameters
    # Llama 3 8B has 8.03 billion parameters (Meta model card)
    assert hf.parameters == pytest.approx(8.03e9, rel=0.005)


def test_unsupported_hf_family_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(SpecError, match="is an encoder-decoder model, which perfmodel does not"):
        load_model(str(path), seq_len=512)
    path.write_text(json.dumps({"model_type": "bloom", "n_layer": 2}))
    with pytest.raises(SpecError, match="model_type 'bloom' is not supported; supported: llama"):
        load_model(str(path), seq_len=512)


def test_fuzz_regression_base_that_is_not_a_string(tmp_path):
    # benchmarks/fuzz_parsers.py found: a mapping as `base` became a file name too long for the OS
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"base": {"type": {"": False}}}))
    with pytest.raises(SpecError, match="base must be a preset name or a path"):
        load_model(str(path))
    with pytest.raises(SpecError, match="not a preset or a readable path"):
        load_model("x" * 5000 + ".yaml")


def test_absurd_models_and_clusters_are_refused(tmp_path):
    from perfmodel import Plan, PlanError

    path = tmp_path / "huge.yaml"
    path.write_text("kind: transformer\nlayers: 100000\nhidden: 1000000\nheads: 8\nseq_len: 8\n"
                    "vocab: 8\n")
    with pytest.raises(SpecError, match="refused as absurd"):
        load_model(str(path))
    with pytest.raises(PlanError, match="dp must be between 1 and 1e\\+07"):
        Plan(gpus=10**9, dp=10**9, global_batch=10**9)


def test_per_dtype_gemm_fits_over_a_flat_preset(tmp_path):
    """A calibrated profile's per-dtype GEMM fits laid over a preset whose one model is flat:
    the flat fields become the default for the dtypes the profile does not list."""
    path = tmp_path / "hw.yaml"
    path.write_text(
        "base: mi300x\n"
        "gemm_efficiency:\n"
        "  bf16: {max_fraction: 0.5, half_dim: 0, split_k_ratio: 384, split_k_chunk: 320}\n"
    )
    hw = load_hardware(path)
    flat = load_hardware("mi300x").gemm("fp8")
    assert hw.gemm("bf16").split_k_ratio == 384 and hw.gemm("bf16").max_fraction == 0.5
    assert hw.gemm("fp8") == flat  # from the preset's flat fields


@pytest.mark.parametrize(("fields", "message"), [
    ("split_k_ratio: 384", "split_k_chunk must be > 0 when split_k_ratio is set"),
    ("large_flops: 8.6e9", "large_max_fraction must be > 0 when large_flops is set"),
])
def test_a_gemm_switch_needs_its_partner_field(tmp_path, fields, message):
    path = tmp_path / "hw.yaml"
    gemm = f"{{max_fraction: 0.5, half_dim: 0, {fields}}}"
    path.write_text(f"base: mi300x\ngemm_efficiency: {gemm}\n")
    with pytest.raises(SpecError, match=message):
        load_hardware(path)


# --- derived fields follow the fields they derive from (issue 14, item 1) ---------------------
BASE_1024 = ("kind: transformer\nname: m\nlayers: 24\nhidden: 1024\nheads: 16\nseq_len: 2048\n"
             "vocab: 50304\n")
WHOLE_3072 = BASE_1024.replace("hidden: 1024", "hidden: 3072").replace("heads: 16", "heads: 32")


def test_a_base_plus_overrides_equals_the_model_written_whole(tmp_path):
    """The issue's case: a 3072-wide model over a 1024-wide base got the base's 4096-wide MLP and
    16 key/value heads (grouped-query attention the model does not have), 27% too fast."""
    from perfmodel import Plan, predict
    from perfmodel.batch import run_batch

    (tmp_path / "base.yaml").write_text(BASE_1024)
    (tmp_path / "whole.yaml").write_text(WHOLE_3072)
    (tmp_path / "child.yaml").write_text(f"base: {tmp_path / 'base.yaml'}\nname: m\nhidden: 3072\n"
                                         "heads: 32\n")
    whole = load_model(str(tmp_path / "whole.yaml"))
    assert (whole.ffn_hidden, whole.kv_heads, whole.head_dim) == (12288, 32, 96)
    base = load_model(str(tmp_path / "base.yaml"))
    merged = {
        "load_model(file, **overrides)": load_model(str(tmp_path / "base.yaml"), hidden=3072,
                                                    heads=32),
        "a file with base:": load_model(str(tmp_path / "child.yaml")),
        "TransformerSpec.replace": base.replace(hidden=3072, heads=32),
        "load_model(spec, **overrides)": load_model(base, hidden=3072, heads=32),
    }
    plan = Plan(gpus=8, tp=8, global_batch=8)
    expected = predict(whole, "dgx-h100", plan)
    for how, spec in merged.items():
        assert spec == whole, how
        assert predict(spec, "dgx-h100", plan).step_time_s == expected.step_time_s, how
    # what the merge used to give is another, faster model: the test can tell them apart
    stale = whole.replace(ffn_hidden=4096, kv_heads=16)
    assert predict(stale, "dgx-h100", plan).step_time_s < 0.95 * expected.step_time_s
    # the model columns of predict --batch: the resolved fields and the size of every row
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,tp,global_batch,hidden,heads\n8,8,8,3072,32\n8,8,8,,\n")
    out = tmp_path / "out.csv"
    assert run_batch(plans, {"model": str(tmp_path / "base.yaml"), "hardware": "dgx-h100"}, out,
                     as_json=False) == 0
    import csv

    rows = list(csv.DictReader(out.open()))
    assert (rows[0]["ffn_hidden"], rows[0]["kv_heads"]) == ("12288", "32")
    assert float(rows[0]["parameters"]) == expected.parameters
    assert float(rows[0]["step_time_s"]) == pytest.approx(expected.step_time_s, rel=1e-12)
    assert (rows[1]["ffn_hidden"], rows[1]["kv_heads"]) == ("4096", "16")


def test_fields_given_explicitly_stay_and_derived_ones_follow():
    llama = load_model("llama2-7b")  # gives ffn_hidden 11008 and kv_heads 32
    assert llama.explicit == {"ffn_hidden", "kv_heads"}
    wider = load_model("llama2-7b").replace(hidden=8192, heads=64, kv_heads=None)  # None: derive
    assert wider.ffn_hidden == 11008 and wider.kv_heads == 64 and wider.head_dim == 128
    assert load_model("llama2-7b", hidden=8192, heads=64, kv_heads=0) == wider  # 0 too
    with pytest.raises(SpecError, match=r"heads \(16\) must be divisible by kv_heads \(32\)"):
        load_model("llama2-7b", heads=16)  # its kv_heads is given: not silently changed
    gpt = load_model("gpt3-175b").replace(hidden=4096, heads=32)
    assert (gpt.ffn_hidden, gpt.kv_heads, gpt.qkv_bias) == (16384, 32, True)
    assert load_model("gpt3-175b").replace(bias=False).qkv_bias is False  # qkv_bias follows bias
    # 0 and null mean "derive", as older spec files write them
    from perfmodel.specs.model import TransformerSpec

    zero = TransformerSpec(layers=2, hidden=64, heads=4, seq_len=8, vocab=10, ffn_hidden=0)
    assert zero.ffn_hidden == 256 and zero.explicit == frozenset()
    assert TransformerSpec(layers=2, hidden=64, heads=4, seq_len=8, vocab=10, head_dim=32) \
        .attention_width == 128


def test_a_scaled_down_model_keeps_its_proportions():
    """validate --hidden/--heads and recommend --validate run a faithful small version: the
    explicit MLP width, grouping and attention width keep their ratios to what changed."""
    from perfmodel import Plan
    from validation.api import scale_down
    from validation.jobspec import model_overrides

    small = load_model("llama3-8b").scaled(hidden=256, heads=8)
    assert (small.ffn_hidden, small.kv_heads, small.head_dim) == (896, 2, 32)  # 14336/4096 x 256
    assert model_overrides(load_model("llama2-7b"), {"hidden": 2048, "heads": 16}) \
        .ffn_hidden == 5504
    qwen = load_model(str(__import__("tests.conftest").conftest.ROOT / "tests/data/hf/qwen3-0.6b"),
                      seq_len=4096)
    scaled, plan = scale_down(qwen, Plan(gpus=16, tp=2, dp=8, global_batch=16))
    assert scaled.attention_width / scaled.hidden == qwen.attention_width / qwen.hidden == 2
    assert scaled.ffn_hidden / scaled.hidden == qwen.ffn_hidden / qwen.hidden == 3
    scaled, _ = scale_down(load_model("llama2-70b"), Plan(gpus=16, tp=2, dp=8, global_batch=16))
    assert scaled.kv_heads == 2  # grouping 8 -> 1 head, but the job splits whole heads over tp


@pytest.mark.parametrize("name", ["alexnet", "mlp"])
def test_a_layer_graph_refuses_transformer_overrides(name, run_cli):
    # regression: recommend --seq-len on a CNN preset was ignored without a word
    with pytest.raises(SpecError, match=f"model '{name}' is a layer graph .*: seq_len does not"):
        load_model(name, seq_len=100)
    res = run_cli("recommend", "--model", name, "--hardware", "dgx-v100", "--gpus", "16",
                  "--global-batch", "256", "--seq-len", "100")
    assert res.returncode == 3 and res.stderr.strip().count("\n") == 0, res.stderr


# --- physical ranges (issue 14): one table per spec, every numeric field in it -----------------
def _numeric_fields(cls, prefix=""):
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    return {f"{prefix}{f.name}" for f in dataclasses.fields(cls) if hints[f.name] in (int, float)}


def test_every_numeric_hardware_field_has_a_physical_range_with_a_reason():
    from perfmodel.specs import hardware as H

    BOUNDS, HardwareSpec, LinkSpec = H.BOUNDS, H.HardwareSpec, H.LinkSpec
    GemmEfficiency, LayerCost, CollectiveFit = H.GemmEfficiency, H.LayerCost, H.CollectiveFit

    fields = (_numeric_fields(HardwareSpec) | {"peak_flops_per_s"}
              | _numeric_fields(LinkSpec, "link.")
              | _numeric_fields(GemmEfficiency, "gemm_efficiency.")
              | _numeric_fields(LayerCost, "layer_costs.")
              | (_numeric_fields(CollectiveFit, "collectives.")
                 - {"collectives.alpha_s_small", "collectives.bus_bandwidth_bytes_per_s_small"})
              | _numeric_fields(H.ProtocolSpec, "protocols."))
    assert fields == set(BOUNDS)  # the small-message regime takes the large one's ranges
    for key, bound in BOUNDS.items():
        assert bound.reason and 0 <= bound.minimum < bound.maximum < float("inf"), key


def test_every_numeric_layer_field_has_a_physical_range():
    from perfmodel.specs.layers import BOUNDS, LayerSpec

    assert _numeric_fields(LayerSpec) | {"input_shape"} == set(BOUNDS)


def _hardware_with(key, value):
    """dgx-h100's fields with one of BOUNDS' fields set to value (in the first entry of a list)."""
    from perfmodel.specs.hardware import hardware_from_dict, load_hardware_dict

    data = load_hardware_dict("dgx-h100")
    data["memory_reserved_bytes"] = 0  # (below memory_bytes)
    data["gemm_efficiency"]["bf16"].update(split_k_chunk=64, large_max_fraction=0.5)  # partners
    data["collectives"] = [{"op": "all_reduce", "scope": "intra", "algorithm": "ring",
                            "alpha_s": 1e-5, "bus_bandwidth_bytes_per_s": 4e11,
                            "breakpoint_bytes": 0, "alpha_s_small": 5e-6,
                            "bus_bandwidth_bytes_per_s_small": 1e11}]
    data["layer_costs"] = [{"part": "layer", "style": "tp", "tp": 8, "forward_overhead_s": 1e-4,
                            "backward_overhead_s": 1e-4}]
    group, _, name = key.rpartition(".")
    if group == "link":
        # NVLS is the intra-node link's only (an NVSwitch node's all-reduce)
        for link in ("intra_node",) if name.startswith("nvls") else ("intra_node", "inter_node"):
            data[link][name] = value
    elif group == "protocols":
        for link in ("intra_node", "inter_node"):
            data[link]["protocols"][0][name] = value
    elif group == "gemm_efficiency":
        data["gemm_efficiency"]["bf16"][name] = value
    elif group in ("collectives", "layer_costs"):
        data[group][0][name] = value
        if key == "layer_costs.tp" and value == 1:
            data[group][0]["style"] = "plain"  # tp 1 is a plain layer's
    elif key == "peak_flops_per_s":
        data[key]["bf16"] = value
    else:
        data[key] = value
    return hardware_from_dict(data, "test")


def _edges():
    from perfmodel.specs.hardware import BOUNDS

    for key, b in BOUNDS.items():
        if b.integer:
            below = b.minimum - 1
        elif not b.inclusive:
            below = b.minimum
        else:
            below = b.minimum / 10 if b.minimum > 0 else -1.0
        yield pytest.param(key, below, b.maximum * 10, id=key)


@pytest.mark.parametrize("key,below,above", list(_edges()))
def test_a_value_outside_the_physical_range_is_refused_naming_field_and_range(key, below, above):
    """Just outside each end of BOUNDS is refused with the field, the range and its reason;
    the ends themselves pass (except where a relation with another field forbids them)."""
    from perfmodel.specs.hardware import BOUNDS

    bound = BOUNDS[key]
    name = key.split(".")[-1]
    for value in (below, above):
        with pytest.raises(SpecError) as err:
            _hardware_with(key, value)
        assert name in str(err.value) and bound.describe() in str(err.value), str(err.value)
        assert bound.reason in str(err.value)
    if key != "memory_reserved_bytes":  # it must also be below memory_bytes
        _hardware_with(key, bound.maximum)
    if bound.inclusive:
        _hardware_with(key, bound.minimum)


def test_a_bandwidth_of_1e_minus_300_is_refused_not_turned_into_nan(tmp_path):
    """Regression: 1e-300 B/s between nodes gave 'step time nan us ... fits'."""
    path = tmp_path / "hw.yaml"
    path.write_text("base: dgx-h100\ninter_node:\n  bandwidth_bytes_per_s: 1.0e-300\n")
    with pytest.raises(SpecError, match=r"inter_node.bandwidth_bytes_per_s must be >= 1e\+06 and "
                                        r"<= 1e\+15, got 1e-300"):
        load_hardware(str(path))


def test_a_layer_graph_outside_its_ranges_is_refused():
    from perfmodel.specs.layers import LayerGraphSpec, LayerSpec

    fc = {"name": "fc", "kind": "linear", "params": 10, "flops": 20, "gemm_m": 1, "gemm_n": 10,
          "gemm_k": 1}
    with pytest.raises(SpecError, match=r"layer 'fc'.flops must be >= 0 and <= 1e\+18"):
        LayerSpec(**{**fc, "flops": 1e30})
    huge = LayerSpec(**{**fc, "params": 1e16})
    with pytest.raises(SpecError, match=r"parameters \(all layers\) must be >= 0 and <= 1e\+16"):
        LayerGraphSpec(name="g", layers=(huge, huge))


@pytest.mark.parametrize("field,value,needle", [
    ("median_rel_error", -0.5, r"median_rel_error must be >= 0 and <= 1e\+06"),
    ("worst_rel_error", 1e300, r"worst_rel_error must be >= 0 and <= 1e\+06"),
    ("size_range", [1.0, 1e40], r"size_range must be >= 0 and <= 1e\+30"),
    ("size_range", [-5.0, 1.0], r"size_range must be >= 0"),
    ("n_points", 10**12, r"n_points must be >= 1 and <= 1e\+09"),
    ("n_points", True, "n_points must be a positive whole number"),
])
def test_a_profile_fit_outside_its_ranges_is_refused(field, value, needle):
    from perfmodel.specs.profile import profile_from_dict

    fit = {"kind": "gemm", "params": {"max_fraction": 0.8}, "median_rel_error": 0.01,
           "worst_rel_error": 0.05, "size_range": [1e6, 1e12], "n_points": 40, field: value}
    doc = {"format": "perfmodel-profile", "version": 1, "complete": True,
           "hardware": {"base": "dgx-h100"}, "fits": {"gemm/bf16": fit}}
    with pytest.raises(SpecError, match=needle):
        profile_from_dict(doc, "p.json")
