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
        # eight GPUs per server; an NVL72 rack is one NVLink domain of 72 (its "node")
        assert hw.gpus_per_node == (72 if name == "gb200-nvl72" else 8), name
        assert hw.memory_bytes > 16 * 2**30
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
                "max_position_embeddings": 32768, "vocab_size": 32000, "sliding_window": 4096},
    "qwen2": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
              "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
              "max_position_embeddings": 32768, "vocab_size": 152064},
    "gpt2": {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
             "vocab_size": 50257},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 2560, "intermediate_size": 10240,
                 "num_attention_heads": 32, "num_hidden_layers": 32,
                 "max_position_embeddings": 2048, "vocab_size": 50432, "rotary_pct": 0.25},
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
    path.write_text(json.dumps({"model_type": "falcon", "n_layer": 2}))
    with pytest.raises(SpecError, match="model_type 'falcon' is not supported; supported: llama"):
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
    # micro-batch 8: device-bound (at micro-batch 1 both models are host-bound, 2% apart)
    plan = Plan(gpus=8, tp=8, global_batch=8, micro_batch=8)
    expected = predict(whole, "dgx-h100", plan)
    for how, spec in merged.items():
        assert spec == whole, how
        assert predict(spec, "dgx-h100", plan).step_time_s == expected.step_time_s, how
    # what the merge used to give is another, faster model: the test can tell them apart
    stale = whole.replace(ffn_hidden=4096, kv_heads=16)
    assert predict(stale, "dgx-h100", plan).step_time_s < 0.95 * expected.step_time_s
    # the model columns of predict --batch: the resolved fields and the size of every row
    plans = tmp_path / "plans.csv"
    plans.write_text("gpus,tp,global_batch,micro_batch,hidden,heads\n8,8,8,8,3072,32\n8,8,8,8,,\n")
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
    import dataclasses

    from perfmodel.specs import hardware as H

    BOUNDS, HardwareSpec, LinkSpec = H.BOUNDS, H.HardwareSpec, H.LinkSpec
    GemmEfficiency, LayerCost, CollectiveFit = H.GemmEfficiency, H.LayerCost, H.CollectiveFit

    fields = (_numeric_fields(HardwareSpec) | {"peak_flops_per_s", "gpus_per_host"}  # or None
              | _numeric_fields(LinkSpec, "link.")
              | _numeric_fields(GemmEfficiency, "gemm_efficiency.")
              | _numeric_fields(LayerCost, "layer_costs.")
              | _numeric_fields(H.FlashAttentionPoint, "flash_attention.")
              | _numeric_fields(H.FlashAttention, "flash_attention.")
              | (_numeric_fields(CollectiveFit, "collectives.")
                 - {"collectives.alpha_s_small", "collectives.bus_bandwidth_bytes_per_s_small"})
              | _numeric_fields(H.ProtocolSpec, "protocols.")
              # a fabric level's own fields (its link's are LinkSpec's); gpus: None at the top
              | {f"levels.{f.name}" for f in dataclasses.fields(H.FabricLevel)
                 if f.name not in {g.name for g in dataclasses.fields(LinkSpec)}
                 and f.name != "name"})
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
        # (a ceiling at either end of its range is taken as it stands: sustained_clock_fraction
        # 0.893, dgx-h100's, takes 0.001 under the floor, which refuses the pair, not the field)
        data["sustained_clock_fraction"] = 1.0
    elif group in ("collectives", "layer_costs"):
        data[group][0][name] = value
        if key == "layer_costs.tp" and value == 1:
            data[group][0]["style"] = "plain"  # tp 1 is a plain layer's
    elif key in ("flash_attention.sustained_fraction", "flash_attention.max_head_dim"):
        data[group][name] = value  # the kernel's own fields
        if name == "max_head_dim":  # its measured head sizes at most its limit (a relation)
            data[group]["by_head_dim"] = [dict(data[group]["by_head_dim"][0], head_dim=1)]
    elif group == "flash_attention":
        data[group]["by_head_dim"][0][name] = value
        if name == "head_dim":  # the kernel's limit above every measured head size (a relation)
            data[group]["max_head_dim"] = 4096
    elif key == "peak_flops_per_s":
        data[key]["bf16"] = value
    elif group == "levels":  # a three-level fabric: a 1-GPU node, then `value` on the middle level
        node, inter = data.pop("intra_node"), data.pop("inter_node")
        del data["gpus_per_node"]
        data["levels"] = [{**node, "name": "node", "gpus": 1},
                          {**inter, "name": "leaf", "gpus": 64}, {**inter, "name": "spine"}]
        data["levels"][1][name] = value
    else:
        data[key] = value
        if key == "sustained_clock_fraction" and isinstance(value, (int, float)) and value > 0:
            # the GEMM ceilings it scales, where either end of its range keeps them in 0.001..1
            # of the peak (a pair outside is refused naming it: test_sustained_clock_...)
            for fit in data["gemm_efficiency"].values():
                fit["max_fraction"] = min(1.0, 1 / value)
                if fit.get("large_max_fraction"):
                    fit["large_max_fraction"] = min(1.0, 1 / value)
        if key == "gpus_per_host" and isinstance(value, int) and 1 <= value <= 65_536:
            data["gpus_per_node"] = value  # a node of one host (whose GPUs it must divide)
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


def test_a_bounds_quick_acceptance_gives_what_its_full_check_gives():
    """Bound.check accepts a plain int or float in range without number()'s path; on every
    bound of the specs (and an open, a whole and a floored one), for values at, inside and
    beyond its ends (its floor, whole and fractional values, 0, -0.0, the largest float, an int
    beyond it, inf, nan), it returns what number() and the floor's check return, of the same
    type, or refuses what they refuse."""
    import sys

    from perfmodel.specs import hardware, layers, profile
    from perfmodel.specs.loading import Bound, number

    bounds = {**hardware.BOUNDS, **{f"layers.{k}": b for k, b in layers.BOUNDS.items()},
              **{f"profile.{k}": b for k, b in profile.FIT_BOUNDS.items()},
              "exclusive": Bound(1, 10, "a range open at 1"),
              "exclusive, whole": Bound(0, 64, "whole, above 0", integer=True),
              "floored": Bound(0, 1, "0, or from 0.01", floor=0.01)}

    def full(b, value):
        value = number(value, "f", minimum=b.minimum, strict=not b.inclusive,
                       maximum=b.maximum, integer=b.integer, reason=b.reason,
                       allowed=b.describe())
        if b.minimum < value < b.floor:
            raise SpecError("below the floor")
        return value

    def outcome(f, *args):
        try:
            value = f(*args)
        except SpecError:
            return "refused"
        return type(value), value

    big = sys.float_info.max
    for key, b in bounds.items():
        ends = [b.minimum, b.maximum, b.floor]
        values = [0, 0.0, -0.0, 1, 1.0, 2.5, -1, big, -big, 10**400, float("inf"), float("nan"),
                  *(f(e) for e in ends for f in (lambda e: e, lambda e: e * (1 + 1e-12),
                                                 lambda e: e * (1 - 1e-12), lambda e: e + 0.5,
                                                 lambda e: e - 1, lambda e: e + 1))]
        values += [int(v) for v in values if isinstance(v, float) and abs(v) < 1e300
                   and v == v]
        for value in values:
            assert outcome(b.check, value, "f") == outcome(full, b, value), (key, value)


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


# --- mixture of experts, MLA and windows in the spec (issue 17) -------------------------------
def test_expert_widths_follow_unless_given_and_a_base_plus_overrides_is_the_whole_model(tmp_path):
    from perfmodel.specs.model import TransformerSpec

    mixtral = load_model("mixtral-8x7b")  # gives ffn_hidden; expert_ffn_hidden follows it
    assert mixtral.expert_ffn_hidden == 14336 and "expert_ffn_hidden" not in mixtral.explicit
    wider = mixtral.replace(ffn_hidden=16384)
    assert wider.expert_ffn_hidden == 16384  # derived: follows the final ffn_hidden
    qwen = load_model("qwen3-30b-a3b")  # gives expert_ffn_hidden 768: it stays
    assert qwen.replace(ffn_hidden=8192).expert_ffn_hidden == 768
    deepseek = load_model("deepseek-v3")
    assert deepseek.shared_expert_ffn_hidden == 2048  # follows expert_ffn_hidden
    assert deepseek.moe_layers == tuple(range(3, 61))
    # a base plus overrides equals the same model written out whole
    (tmp_path / "child.yaml").write_text("base: deepseek-v3\nname: m\nlayers: 30\n"
                                         "moe_dense_layers: [10, 20]\n")
    child = load_model(str(tmp_path / "child.yaml"))
    whole = TransformerSpec(**{**deepseek.given(), "name": "m", "layers": 30,
                               "moe_dense_layers": (20, 10)})
    assert child == whole and child.moe_layer_count == 30 - 3 - 2
    # a dense model has no experts: the MoE fields are refused, not ignored
    with pytest.raises(SpecError, match="shared_experts applies to a mixture-of-experts model"):
        load_model("llama3-8b", shared_experts=1)


def test_a_scaled_down_mixture_of_experts_keeps_its_shape():
    small = load_model("deepseek-v3").scaled(layers=8, hidden=896, heads=16)
    assert small.experts == 256 and small.top_k == 8  # the routing is the model's, kept
    assert small.expert_ffn_hidden == 256  # 2048 / 7168 x 896
    assert (small.kv_lora_rank, small.q_lora_rank) == (64, 192)  # 512 and 1536 / 8
    assert (small.qk_nope_head_dim, small.qk_rope_head_dim, small.v_head_dim) == (128, 64, 128)
    assert small.moe_first_dense == 0 and small.moe_layer_count == 8  # 3 x 8 / 61 rounds to 0
    qwen = load_model("qwen3-30b-a3b").scaled(hidden=512, heads=8)
    assert qwen.expert_ffn_hidden == 192  # 768 / 2048 x 512
    assert qwen.attention_width == 2 * qwen.hidden  # 32 x 128 over 2048: 8 x 128 over 512


def test_windows_apply_only_when_shorter_than_the_sequence():
    oss = load_model("gpt-oss-120b")
    assert oss.windowed_layers == tuple(range(0, 36, 2)) and oss.windowed_share == 0.5
    # its window, sinks and experts are all costed (issue 17: perfmodel.specs.model.uncosted)
    assert oss.uncosted() == []
    mistral = load_model("mistral-7b")
    assert mistral.windowed_share == 1 and not mistral.uncosted()
    assert load_model("mistral-7b", seq_len=4096).windowed_share == 0


# Published parameter counts of the model presets (the presets are written from the sources in
# their comments; tests/unit/test_hf_configs.py checks the same counts from the configs).
PRESET_COUNTS = [  # (preset, total, active or None, leave out the embedding table, source)
    ("llama3.1-8b", 8.03e9, None, False, "huggingface.co/meta-llama/Llama-3.1-8B: 8.03B params"),
    ("llama3.1-70b", 70.6e9, None, False, "huggingface.co/meta-llama/Llama-3.1-70B: 70.6B params"),
    ("llama3.1-405b", 406e9, None, False,
     "huggingface.co/meta-llama/Llama-3.1-405B: 406B params (Meta: 405B)"),
    ("mistral-7b", 7.24e9, None, False, "huggingface.co/mistralai/Mistral-7B-v0.1: 7.24B params"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, False, "mistral.ai/news/mixtral-of-experts: 46.7B, 12.9B"),
    ("mixtral-8x22b", 141e9, 39e9, False, "mistral.ai/news/mixtral-8x22b: 141B, 39B active"),
    ("qwen3-32b", 32.8e9, None, False, "huggingface.co/Qwen/Qwen3-32B model card: 32.8B"),
    ("qwen3-30b-a3b", 30.5e9, None, False, "huggingface.co/Qwen/Qwen3-30B-A3B model card: 30.5B"),
    ("qwen3-235b-a22b", 235e9, None, False, "huggingface.co/Qwen/Qwen3-235B-A22B card: 235B"),
    ("deepseek-v3", 671e9, 36.7e9, True,
     "github.com/deepseek-ai/DeepSeek-V3 README_WEIGHTS.md: 671B, 36.7B activated"),
    ("gpt-oss-120b", 116.83e9, 5.13e9, True, "gpt-oss model card (OpenAI 2025), Table 1"),
]


@pytest.mark.parametrize("name,total,active,no_embedding,source", PRESET_COUNTS,
                         ids=[p[0] for p in PRESET_COUNTS])
def test_model_presets_match_their_published_parameter_counts(name, total, active, no_embedding,
                                                               source):
    from perfmodel.params import parameter_counts

    counts = parameter_counts(load_model(name))
    assert counts.total == pytest.approx(total, rel=0.005), source
    if active is not None:
        ours = counts.active - (counts.embedding if no_embedding else 0)
        assert ours == pytest.approx(active, rel=0.005), source
    elif not load_model(name).experts:
        assert counts.active == counts.total


def test_new_hardware_presets_hold_their_datasheet_values():
    b200, nvl72 = load_hardware("dgx-b200"), load_hardware("gb200-nvl72")
    assert b200.peak("bf16") == 2.25e15 and b200.peak("fp8") == 4.5e15  # HGX B200 (sparse / 2)
    assert b200.peak_flops_per_s["fp4"] == 9.0e15
    assert nvl72.gpus_per_node == 72 and nvl72.peak("bf16") == 2.5e15  # 360 PF sparse / 72 / 2
    assert nvl72.inter_node.bandwidth_bytes_per_s == 72 * 50e9  # a 400 Gb/s NIC per GPU
    mi325, mi355 = load_hardware("mi325x"), load_hardware("mi355x")
    assert mi325.peak("bf16") == load_hardware("mi300x").peak("bf16")  # the same CDNA3 die
    assert mi325.memory_bytes == 256 * 2**30 and mi355.memory_bytes == 288 * 2**30
    assert mi355.peak("tf32") == mi355.peak("fp32")  # CDNA4 has no TF32: the FP32 rate
    assert load_hardware("h100-pcie").peak("bf16") == 756e12


# (preset, sweep in tests/data/gemm, table dtype, perfmodel dtype, bytes in, bytes out, the fit's
# 5-fold hold-out median error (calibrate import-gemm), the fit's own plateau where the preset's
# ceiling is the GEMM-ceiling rule's instead: a measured ceiling, never a plateau extrapolated
# beyond the sweep's 4096^3, docs/model.md)
GEMM_PRESETS = [
    ("dgx-b200", "b200-sm100-bf16-f32-fp8", "bf16xbf16->bf16", "bf16", 2, 2, 0.017, 0.741),
    ("dgx-b200", "b200-sm100-bf16-f32-fp8", "f32xf32->f32", "tf32", 4, 4, 0.029, 0.796),
    ("dgx-b200", "b200-sm100-bf16-f32-fp8", "f8e4m3fnxf8e4m3fn->bf16", "fp8", 1, 2, 0.034, 0.853),
    ("gb200-nvl72", "b200-sm100-bf16-f32-fp8", "bf16xbf16->bf16", "bf16", 2, 2, 0.017, 0.670),
    ("gb200-nvl72", "b200-sm100-bf16-f32-fp8", "f8e4m3fnxf8e4m3fn->bf16", "fp8", 1, 2, 0.034,
     0.768),
    ("mi325x", "mi300-gfx942-bf16-f32-fp8", "bf16xbf16->bf16", "bf16", 2, 2, 0.046, 0.504),
    ("mi325x", "mi300-gfx942-bf16-f32-fp8", "f32xf32->f32", "tf32", 4, 4, 0.067, 0.403),
    ("mi325x", "mi300-gfx942-bf16-f32-fp8", "f8e4m3fnuzxf8e4m3fnuz->bf16", "fp8", 1, 2, 0.087,
     0.878),
    ("mi355x", "mi350-gfx950-multi-dtype", "bf16xbf16->bf16", "bf16", 2, 2, 0.058, 0.725),
    ("mi355x", "mi350-gfx950-multi-dtype", "f16xf16->f16", "fp16", 2, 2, 0.052, 0.585),
    ("mi355x", "mi350-gfx950-multi-dtype", "f8e4m3fnxf8e4m3fn->bf16", "fp8", 1, 2, 0.054, 0.559),
]


@pytest.mark.parametrize("name,sweep,table_dtype,dtype,bpe,out_bpe,holdout,plateau",
                         GEMM_PRESETS, ids=[f"{g[0]}-{g[3]}" for g in GEMM_PRESETS])
def test_new_hardware_gemm_fields_reproduce_their_sweep(name, sweep, table_dtype, dtype, bpe,
                                                        out_bpe, holdout, plateau):
    """A preset's GEMM fields, as written (rounded to 3 digits), predict every third shape of the
    sweep they were fitted on within the fit's hold-out median error plus 1%: a transcription
    slip shows. Where the preset's ceiling is the GEMM-ceiling rule's (MAMF's, or the sweep's best
    measured shape) rather than the fit's plateau, the fit's plateau is put back for the
    comparison."""
    import dataclasses

    import numpy as np
    import pandas as pd

    from perfmodel.costs.gemm_efficiency import gemm_time_s
    from tests.conftest import ROOT

    hw = load_hardware(name)
    rows = pd.read_csv(ROOT / f"tests/data/gemm/xla-matmul-perf-table-{sweep}.csv")
    rows = rows[rows["dtype"] == table_dtype].iloc[::3]
    fields = dataclasses.asdict(hw.gemm(dtype))
    if plateau is not None:
        assert fields["large_max_fraction"] != plateau  # the rule's ceiling, not the fit's
        fields["large_max_fraction"] = plateau
    errors = []
    for r in rows.itertuples():
        ours = float(gemm_time_s(r.m, r.n, r.k, r.b, bpe, hw.peak(dtype),
                                 hw.memory_bandwidth_bytes_per_s, output_bytes_per_element=out_bpe,
                                 **fields))
        measured = 2 * r.b * r.m * r.n * r.k / r.flops_per_s
        errors.append(abs(ours - measured) / measured)
    assert len(errors) == 125 and np.median(errors) < holdout + 0.01


def test_gpus_per_host_divides_the_node_and_sizes_the_launch():
    # a GB200 NVL72 rack is one node (its NVLink domain) of 18 hosts of 4 GPUs: torchrun runs per
    # host; a host count that does not divide the node is refused
    from perfmodel.specs.hardware import hardware_from_dict

    gb200 = load_hardware("gb200-nvl72")
    assert (gb200.gpus_per_node, gb200.gpus_per_host, gb200.host_gpus) == (72, 4, 4)
    assert load_hardware("dgx-h100").host_gpus == 8  # one host a node
    data = {k: v for k, v in load_hardware("dgx-h100").to_dict().items() if k != "levels"}
    with pytest.raises(SpecError, match=r"gpus_per_host \(3\) must divide gpus_per_node \(8\)"):
        hardware_from_dict({**data, "gpus_per_host": 3}, "test")


def test_host_op_cost_follows_the_host_cpu():
    # One rule for every preset's host time per framework op: the x86 hosts' 4 us, scaled by how
    # much slower a CPU ran the same script. GB200's Grace: one torch.nn.Linear forward (bf16,
    # hidden 2048, 8192 tokens) 37.08 us of CPU time against DGX H100's Xeon 8480C 13.48 us
    # (NVIDIA/TransformerEngine issue #2053, 2025-08-11, its table).
    def host_op(name: str) -> float:
        hw = load_hardware(name)
        return hw.host_op_overhead_s or hw.kernel_overhead_s

    x86 = host_op("dgx-h100")
    assert host_op("dgx-b200") == x86  # Xeon 8570: the same generation, no measurement of its own
    assert host_op("gb200-nvl72") == pytest.approx(x86 * 37.08 / 13.48, rel=0.01)
    # the GPU's own launch cost (kernel_overhead_s) is the device's, not Grace's
    assert (load_hardware("gb200-nvl72").kernel_overhead_s
            == load_hardware("dgx-h100").kernel_overhead_s)


def test_the_yaml_loader_reads_every_yaml_file_of_the_repository_as_pyyamls_own():
    # the spec loader takes libyaml's parser where PyYAML has it (0.85 ms for a preset instead of
    # 16 ms); PyYAML's pure-Python SafeLoader is the reference: the same data, the same errors
    from pathlib import Path

    import yaml

    from perfmodel.specs import loading

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the loader is PyYAML's own")
    assert issubclass(loading._UniqueKeyLoader, yaml.CSafeLoader)

    def read(text, loader):
        try:
            return "data", yaml.load(text, Loader=loader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            return type(exc).__name__, (mark.line, mark.column) if mark else None

    root = Path(__file__).resolve().parents[2]
    files = [p for p in root.rglob("*.y*ml") if ".git" not in p.parts]
    assert len(files) > 40
    for path in files:
        text = path.read_text()
        assert read(text, loading._UniqueKeyLoader) == read(text, yaml.SafeLoader), path
    for text in ("a: 1\n b: 2\n", "a: [1, 2\n", "\ta: 1\n", "a: 'x\n", "a: *x\n",
                 "a: !!python/object:os.system 1\n", "a:\n  - 1\n  b: 2\n"):
        assert read(text, loading._UniqueKeyLoader) == read(text, yaml.SafeLoader), text


_LOLS = ['&a [' + ", ".join(['"lol"'] * 9) + "]"] + [
    f"&{b} [" + ", ".join([f"*{a}"] * 9) + "]"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True)]


@pytest.mark.parametrize("source, says", [
    # 9 aliases of 9 aliases, 9 levels deep: 9^9 values from 10 lines
    ("[" + ",\n  ".join(_LOLS) + "]", "holds more than 200,000 values with its aliases expanded"),
    ("&loop [*loop]", "alias *loop (line 7) is inside the node it names"),
    ("[" * 150 + "]" * 150, "is nested too deeply to be a spec"),
], ids=["alias bomb", "recursive alias", "nested"])
def test_a_yaml_spec_refused_for_its_shape_says_that_alone(tmp_path, source, says):
    # check_yaml_size's SpecError is a ValueError: until 2026-12-06 the loader's handler of a
    # number Python cannot convert wrapped it ("holds a number perfmodel cannot read (...)")
    path = tmp_path / "model.yaml"
    path.write_text("kind: transformer\nlayers: 4\nhidden: 256\nheads: 8\nseq_len: 128\n"
                    f"vocab: 1024\nsource: {source}\n")
    with pytest.raises(SpecError) as refused:
        load_model(str(path))
    message = str(refused.value)
    assert says in message and "number" not in message


def test_a_sustained_clock_that_takes_a_gemm_ceiling_out_of_range_is_refused_naming_it():
    """sustained_clock_fraction within its own bound (up to 1.5) can lift a GEMM fit's ceiling
    over the peak (or take it under 0.001): refused naming it and the range the fits allow, not
    the fit's max_fraction, which the user never set (found by a fuzz of sweep --vary,
    2026-12-07)."""
    from perfmodel.specs.hardware import hardware_from_dict, load_hardware_dict

    data = load_hardware_dict("dgx-h100")
    top = max(max(f["max_fraction"], f.get("large_max_fraction") or 0)
              for f in data["gemm_efficiency"].values())
    data["sustained_clock_fraction"] = 0.999 / top  # about the largest these fits allow
    hardware_from_dict(data, "test")
    for value in (1.01 / top, 1.5):
        data["sustained_clock_fraction"] = value
        with pytest.raises(SpecError) as err:
            hardware_from_dict(data, "test")
        assert f"sustained_clock_fraction {value:g} takes gemm_efficiency." in str(err.value)
        assert f"..{1 / top:.4g}" in str(err.value)
        assert "max_fraction must be" not in str(err.value)
