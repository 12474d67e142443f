"""Inputs benchmarks/fuzz_parsers.py found that crashed a parser (or were silently misread), each
now refused with one line naming the field. Named after what broke."""

from __future__ import annotations

import json
import re

import pytest

from perfmodel.errors import PlanError, SpecError
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
    ("thirty", "num_hidden_layers must be a JSON number, got the string 'thirty'"),
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
     "parallelism.data_parallel_shard_degree must be -1 .the ranks the other degrees leave. or "
     "a whole number from 1 to 1e10, got 'x'"),
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


# Job configs (benchmarks/fuzz_parsers.py's configs targets, 2026-11-29): each was a raw Python
# error, or a NaN perfmodel refused to print as its own bug.
def _job_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_nan_in_an_ignored_setting_is_written_as_text_by_predict_json(tmp_path):
    """optimizer.lr = nan (ignored: not the step's) made `predict --from-config --json` stop with
    InternalError 'the JSON output is not finite (config.ignored[9].value = nan)'."""
    import tomllib

    from perfmodel.configs import read_config
    from perfmodel.output import json_text

    data = tomllib.loads((_CONFIGS / "torchtitan_llama3_70b.toml").read_text())
    data["optimizer"]["lr"] = float("nan")
    job = read_config(_job_file(tmp_path, "job.json", json.dumps(data)))
    lr = next(s for s in job.to_dict()["ignored"] if s["key"] == "optimizer.lr")
    assert lr["value"] == "nan"
    json_text(job.to_dict())


def test_a_quote_in_a_launch_script_is_split_as_bash_splits_it(tmp_path):
    """`'$(a'` (single quotes keep it as text) was expanded as a command substitution that ate
    the closing quote: ValueError 'No closing quotation' from shlex."""
    from perfmodel.configs import read_config

    script = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
              "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
              "--vocab-size 1000 --micro-batch-size 1 --bf16 --data-path '$(a' \\\"$B\\\"\n")
    job = read_config(_job_file(tmp_path, "train.sh", script))
    assert any(s.key == "--data-path" and s.value == "$(a \"$B\"" for s in job.ignored)
    with pytest.raises(SpecError, match="train.sh: line 2: no closing quotation once the "
                                        "script's variables are expanded"):
        read_config(_job_file(tmp_path, "train.sh", "Q=\"'\"\n" + script.replace("$B", "$Q")))


@pytest.mark.parametrize("text, needle", [
    # was: ValueError 'Exceeds the limit (4300 digits) for integer string conversion'
    ("A=1" + "0" * 400 + "\nA=$((A*A*A*A*A*A*A*A*A*A*A*A))\n",
     r"--num-layers \$\(\(A\*A.*\)\) cannot be read: arithmetic perfmodel cannot evaluate"),
    ("A=$((4294967296*4294967296))\n",  # 2^64: bash wraps it round to 0
     r"--num-layers \$\(\(4294967296\*4294967296\)\) cannot be read: arithmetic perfmodel "
     "cannot evaluate"),
], ids=["4800 digits", "2^64"])
def test_launch_script_arithmetic_past_64_bits_is_refused(tmp_path, text, needle):
    from perfmodel.configs import read_config

    path = _job_file(tmp_path, "train.sh", text + "torchrun pretrain_gpt.py --num-layers $A\n")
    with pytest.raises(SpecError, match=needle):
        read_config(path)


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000], ids=["superscript two", "5000 digits"])
# was: ValueError from int()
def test_a_torchrun_world_size_int_cannot_read_is_refused(tmp_path, value):
    from perfmodel.configs import read_config

    path = _job_file(tmp_path, "train.sh",
                     f"torchrun --nproc_per_node {value} pretrain_gpt.py --num-layers 2\n")
    with pytest.raises(SpecError, match="torchrun --nproc-per-node .*: perfmodel reads a whole "
                                        "number of nodes and of processes per node"):
        read_config(path)


@pytest.mark.parametrize("name, edit, needle", [
    # was: TypeError 'float() argument must be a string or a real number, not dict'
    ("bridge_llama3_8b.yaml", {"hidden_dropout": {"a": 1}},
     "model.hidden_dropout must be a number, got '{'a': 1}'"),
    ("bridge_llama3_8b.yaml", {"attention_dropout": 1.5},
     "model.attention_dropout must be a rate from 0 to 1, got '1.5'"),
])
def test_a_dropout_that_is_not_a_rate_is_refused(tmp_path, name, edit, needle):
    import yaml

    from perfmodel.configs import read_config

    data = yaml.safe_load((_CONFIGS / name).read_text())
    data["model"].update(edit)
    with pytest.raises(SpecError, match=re.escape(needle)):
        read_config(_job_file(tmp_path, name, yaml.safe_dump(data)))


def test_megatron_deepspeed_zero_stage_past_a_float_is_refused(tmp_path):
    """--zero-stage 1e400 (an infinity to float): OverflowError from int()."""
    from perfmodel.configs import read_config

    args = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --bf16 "
            "--deepspeed --zero-stage 1e400\n")
    with pytest.raises(SpecError, match="--zero-stage 1e400: a stage 0-3"):
        read_config(_job_file(tmp_path, "args.txt", args))


@pytest.mark.parametrize("section, edit, error, needle", [
    # was: ValueError from int(): '²' is a digit to str.isdigit, not to int
    ("parallelism", {"pipeline_parallel_split_points": ["layers.\u00b2"]}, PlanError,
     "parallelism.pipeline_parallel_split_points layers.\u00b2: a stage boundary names a layer"),
    ("activation_checkpoint", {"mode": "selective", "selective_ac_option": "\u00b2"}, PlanError,
     "activation_checkpoint.selective_ac_option \u00b2: selective layer AC wraps every N-th "
     "block, N a whole number >= 1"),
    # was: ValueError 'Exceeds the limit (4300 digits) for integer string conversion'
    ("activation_checkpoint", {"mode": "selective", "selective_ac_option": "9" * 5000},
     PlanError, "activation_checkpoint.selective_ac_option 999999999999... (5000 characters): "
                "selective layer AC wraps every N-th block"),
    # was: TypeError 'int' object is not iterable
    ("model", {"converters": 8}, SpecError,
     "model.converters must be a list of converter names, got '8'"),
], ids=["split point", "ac option", "ac option of 5000 digits", "converters"])
def test_torchtitan_values_of_the_wrong_kind_are_refused(tmp_path, section, edit, error, needle):
    from perfmodel.configs import read_config

    data = json.loads((_CONFIGS / "torchtitan_llama3_8b_pp.json").read_text())
    data.setdefault(section, {}).update(edit)
    with pytest.raises(error, match=re.escape(needle)):
        read_config(_job_file(tmp_path, "job.json", json.dumps(data)))


@pytest.mark.parametrize("name, edit, needle", [
    # was: AttributeError "'list' object has no attribute 'get'"
    ("nemo1_nemotron4_15b.yaml", ("model", "optim", ["adam"]),
     "model.optim must be a mapping of settings, got '['adam']'"),
    # was: AttributeError "'int' object has no attribute 'get'" (and 'list' for data_types)
    ("deepspeed_zero3.json", (None, "activation_checkpointing", 5),
     "activation_checkpointing must be an object"),
    ("deepspeed_zero3.json", (None, "data_types", ["fp32"]), "data_types must be an object"),
], ids=["nemo1 optim", "deepspeed activation_checkpointing", "deepspeed data_types"])
def test_a_config_section_that_is_not_a_mapping_is_refused(tmp_path, name, edit, needle):
    import yaml

    from perfmodel.configs import read_config

    data = yaml.safe_load((_CONFIGS / name).read_text())
    parent, key, value = edit
    (data if parent is None else data[parent])[key] = value
    with pytest.raises(SpecError, match=re.escape(needle)):
        read_config(_job_file(tmp_path, name, yaml.safe_dump(data) if name.endswith(".yaml")
                              else json.dumps(data)))


def test_a_deepspeed_config_name_too_long_for_a_file_is_not_readable_here(tmp_path):
    """--deepspeed_config 1000...0 (300 characters): OSError 'File name too long' from
    Path.is_file; now the note of a config not readable here, as for any absent file."""
    from perfmodel.configs import read_config

    args = ("--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
            "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 1 --bf16 "
            f"--deepspeed --deepspeed_config {'1' + '0' * 300}\n")
    job = read_config(_job_file(tmp_path, "args.txt", args))
    assert any("not readable here" in note for note in job.notes)


def test_a_bridge_sections_key_that_is_not_text_is_ignored_with_the_section(tmp_path):
    # was: AttributeError "'int' object has no attribute 'replace'" (benchmarks/fuzz_parsers.py,
    # configs (fields), 2026-12-05): an ignored section's keys were taken for text
    import yaml

    from perfmodel.configs import read_config

    data = yaml.safe_load((_CONFIGS / "bridge_llama3_8b.yaml").read_text())
    data["checkpoint"] = {1: True, None: "x", "save": None}
    job = read_config(_job_file(tmp_path, "job.yaml", yaml.safe_dump(data)))
    assert "checkpoint" in "\n".join(job.report())
