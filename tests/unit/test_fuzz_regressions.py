"""Inputs benchmarks/fuzz_parsers.py found that crashed a parser (or were silently misread), each
now refused with one line naming the field. Named after what broke."""

from __future__ import annotations

import json

import pytest

from perfmodel.errors import SpecError
from perfmodel.specs.hardware import COLLECTIVE_OPS, load_hardware
from perfmodel.specs.model import load_model
from perfmodel.specs.profile import apply_profile, load_profile

HF = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
      "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
      "max_position_embeddings": 4096}


def _write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_empty_gemm_efficiency_was_a_stop_iteration(tmp_path):
    from perfmodel.specs.hardware import load_hardware_dict

    spec = {**load_hardware_dict("dgx-h100"), "gemm_efficiency": {}}  # no base to merge with
    path = _write(tmp_path, "hw.json", spec)
    with pytest.raises(SpecError, match="gemm_efficiency is empty; give max_fraction"):
        load_hardware(path)


@pytest.mark.parametrize("op,needle", [
    ({}, "collectives.op must be one of all_reduce, .*got {}"),  # was: unhashable type: 'dict'
    # was: a fit silently never used
    ("all_reduc", ".*got 'all_reduc' \\(did you mean 'all_reduce'"),
])
def test_a_profile_fit_of_an_unknown_collective(tmp_path, op, needle):
    fit = {"op": op, "scope": "intra", "algorithm": "ring", "alpha_s": 2.5e-6,
           "bus_bandwidth_bytes_per_s": 4e11}
    path = _write(tmp_path, "p.json", {"format": "perfmodel-profile", "version": 1,
                                       "complete": True, "fits": {},
                                       "hardware": {"base": "dgx-h100", "collectives": [fit]}})
    with pytest.raises(SpecError, match=f"profile .*p.json: hardware: {needle}"):
        apply_profile(None, load_profile(path))


def test_collective_ops_of_the_specs_are_those_of_the_cost_model():
    from perfmodel.costs.collectives import Op

    assert COLLECTIVE_OPS == tuple(op.value for op in Op)


@pytest.mark.parametrize("value,needle", [
    (float("inf"), "num_hidden_layers must be a finite number"),  # was: OverflowError
    (32.7, "num_hidden_layers must be a whole number, got 32.7"),  # was: read as 32 layers
    (True, "num_hidden_layers must be a number, got bool"),  # was: read as 1 layer
    ("thirty", "num_hidden_layers must be a number, got 'thirty'"),
])
def test_hugging_face_config_numbers_are_read_exactly_or_refused(tmp_path, value, needle):
    path = _write(tmp_path, "config.json", {**HF, "num_hidden_layers": value})
    with pytest.raises(SpecError, match=needle):
        load_model(path)


def test_hugging_face_config_flags_must_be_booleans(tmp_path):
    """"false" (a string) was read as true."""
    path = _write(tmp_path, "config.json", {**HF, "tie_word_embeddings": "false"})
    with pytest.raises(SpecError, match="tie_word_embeddings must be true or false, got 'false'"):
        load_model(path)
    assert load_model(_write(tmp_path, "ok.json", HF), seq_len=4096).layers == 32


def test_a_plans_csv_with_old_mac_line_ends_is_read_as_before(tmp_path):
    """A lone '\\r' line end (found by the fuzzer when the bounded reader first decoded bytes
    itself: csv.Error 'new-line character seen in unquoted field'): read as a line end, as
    Path.read_text does; '\\r\\n' too."""
    from perfmodel.batch import read_rows

    for end in ("\r", "\r\n"):
        path = tmp_path / "plans.csv"
        path.write_bytes(f"gpus,dp{end}8,8{end}".encode())
        assert read_rows(path) == (["gpus", "dp"], [(2, {"gpus": "8", "dp": "8"}, "")])


@pytest.mark.parametrize("field,value,needle", [
    ("out_channels", {"a": 1}, "out_channels must be a number, got dict"),  # was: a TypeError
    ("output_shape", 64, "output_shape must be a list of at least 2 numbers"),
    ("output_shape", [1, "x"], "output_shape must be a number, got 'x'"),
    ("activation_bytes", [4], "activation_bytes must be a number, got list"),
])
def test_a_traced_layer_with_a_wrong_type_is_refused(tmp_path, field, value, needle):
    layer = {"name": "0", "kind": "conv", "input_shape": [1, 3, 224, 224],
             "output_shape": [1, 64, 55, 55], "params": 23296, "flops": 140553600.0,
             "out_channels": 64}
    if field == "activation_bytes":
        del layer["output_shape"]
    layer[field] = value
    path = _write(tmp_path, "g.json", {"kind": "layers", "name": "g", "layers": [layer]})
    with pytest.raises(SpecError, match=needle):
        load_model(path)


# Job configs (a mutation fuzz of tests/data/configs, 2026-11-28): each was a raw Python error.
_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.mark.parametrize("name, edit, needle", [
    # torchtitan: int() of any value of global_batch_size / data_parallel_shard_degree
    ("torchtitan_qwen3_30b_a3b.toml", ("training", "global_batch_size", {}),
     "training.global_batch_size must be a whole number"),
    ("torchtitan_qwen3_30b_a3b.toml", ("parallelism", "data_parallel_shard_degree", "x"),
     "parallelism.data_parallel_shard_degree must be a whole number"),
    # AutoModel: a section that is not a mapping
    ("automodel_qwen3_30b_a3b.yaml", (None, "step_scheduler", 8),
     "step_scheduler must be a mapping"),
    ("automodel_qwen3_30b_a3b.yaml", ("model", "backend", "te"),
     "backend must be a mapping"),
])
def test_a_config_value_of_the_wrong_type_is_refused(tmp_path, name, edit, needle):
    import tomllib

    import yaml

    from perfmodel.configs import read_config

    text = (_CONFIGS / name).read_text()
    data = tomllib.loads(text) if name.endswith(".toml") else yaml.safe_load(text)
    parent, key, value = edit
    (data if parent is None else data[parent])[key] = value
    path = tmp_path / ("job.json" if name.endswith(".toml") else "recipe.yaml")
    path.write_text(json.dumps(data) if name.endswith(".toml") else yaml.safe_dump(data))
    with pytest.raises(SpecError, match=needle):
        read_config(path)


def test_megatron_dropout_that_is_not_a_number_is_refused(tmp_path):
    from perfmodel.configs import read_config

    text = (_CONFIGS / "megatron_llama3_8b.txt").read_text() + "--hidden-dropout {}\n"
    path = tmp_path / "args.txt"
    path.write_text(text)
    with pytest.raises(SpecError, match="--hidden-dropout must be a number, got '{}'"):
        read_config(path)


def test_nemo2_data_section_that_is_not_a_mapping_is_refused(tmp_path):
    import yaml

    from perfmodel.configs import read_config

    data = yaml.safe_load((_CONFIGS / "nemo2_llama3_8b.yaml").read_text())
    data["data"] = 3
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="data must be a mapping"):
        read_config(path)
