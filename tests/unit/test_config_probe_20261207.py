"""Job configs read as their frameworks read them (a probe of 2026-12-07): DeepSpeed's yes-or-no
settings as its pydantic models take them, the Trainer's 'auto' bucket, a NaN bucket refused,
Megatron-LM's switches and integers as argparse takes them, a wrong type a spec error in every
reader, and NeMo 2's learned position table at its config class's length."""
import json

import pytest

from perfmodel.cli import main

DS = {"zero_optimization": {"stage": 2}, "train_batch_size": 512,
      "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}
MEGATRON = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
            "--max-position-embeddings 4096 --vocab-size 50304 --micro-batch-size 1 "
            "--global-batch-size 128\n")


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


def _deepspeed(capsys, tmp_path, config: dict) -> tuple[int, dict, str]:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    code, out, err = _run(capsys, "predict", "--from-config", str(path), "--model", "llama3-8b",
                          "--seq-len", "4096", "--hardware", "dgx-h100", "--json")
    return code, json.loads(out) if code == 0 else {}, err


@pytest.mark.parametrize("enabled", [True, "true", "True", 1, "yes", "on"])
def test_deepspeed_bf16_enabled_as_its_config_model_reads_it(capsys, tmp_path, enabled):
    code, result, _ = _deepspeed(capsys, tmp_path, {**DS, "bf16": {"enabled": enabled}})
    assert code == 0 and result["plan"]["dtype"] == "bf16"


@pytest.mark.parametrize("enabled", [False, "false", 0, "off"])
def test_deepspeed_bf16_disabled_trains_fp32(capsys, tmp_path, enabled):
    code, result, err = _deepspeed(capsys, tmp_path, {**DS, "bf16": {"enabled": enabled}})
    assert code == 0 and result["plan"]["dtype"] == "fp32"
    assert "neither bf16 nor fp16 enabled" in err


@pytest.mark.parametrize("config, message", [
    ({"bf16": {"enabled": "maybe"}}, "bf16.enabled must be true or false, got the string 'maybe'"),
    ({"bf16": {"enabled": 2}}, "bf16.enabled must be true or false, got 2"),
    ({"bf16": True}, 'bf16: must be an object, such as {"enabled": true}'),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "sometimes"}},
     "zero_optimization.overlap_comm must be true or false"),
])
def test_deepspeed_refuses_what_its_config_model_cannot_read(capsys, tmp_path, config, message):
    code, _, err = _deepspeed(capsys, tmp_path, {**DS, "bf16": {"enabled": True}, **config})
    assert code == 3 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("overlap, expected", [("false", False), ("true", True), (0, False)])
def test_deepspeed_overlap_comm_as_a_word(capsys, tmp_path, overlap, expected):
    config = {**DS, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "overlap_comm": overlap}}
    code, result, _ = _deepspeed(capsys, tmp_path, config)
    assert code == 0 and result["plan"]["overlap_grad_sync"] is expected


@pytest.mark.parametrize("size", [float("nan"), float("inf"), -5, 0.5])
def test_deepspeed_a_bucket_that_is_no_count_is_refused(capsys, tmp_path, size):
    path = tmp_path / "ds.json"
    # json.dumps writes NaN and Infinity, as Python's json reads them (DeepSpeed's json.load too)
    path.write_text(json.dumps({**DS, "bf16": {"enabled": True}, "zero_optimization": {
        "stage": 2, "overlap_comm": True, "reduce_bucket_size": size}}))
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--model", "llama3-8b",
                        "--seq-len", "4096", "--hardware", "dgx-h100")
    assert code == 3 and "reduce_bucket_size must be a whole number of elements" in err


def test_deepspeed_auto_bucket_is_the_trainers_hidden_squared(capsys, tmp_path):
    # transformers' integrations/deepspeed.py (HfTrainerDeepSpeedConfig.trainer_config_finalize)
    # fills zero_optimization.reduce_bucket_size 'auto' with hidden_size * hidden_size
    config = {**DS, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "overlap_comm": True,
                                    "reduce_bucket_size": "auto"}}
    code, result, err = _deepspeed(capsys, tmp_path, config)
    assert code == 0 and result["plan"]["dp_bucket_size"] == 4096 * 4096
    assert "the Hugging Face Trainer's hidden x hidden" in err


@pytest.mark.parametrize("arguments, message", [
    # a switch given a value: argparse refuses it ("ignored explicit argument"), the job never
    # starts; an integer option: argparse's type=int, which refuses 2.0 and 2e0
    *[(f"--tensor-model-parallel-size 2 --bf16 {switch}", "is a switch and takes no value")
      for switch in ("--bf16=false", "--sequence-parallel=false", "--bf16=")],
    *[(f"--bf16 --tensor-model-parallel-size {value}",
       "--tensor-model-parallel-size must be a whole number") for value in ("2.0", "2e0", "two")],
])
def test_megatron_arguments_are_read_as_argparse_reads_them(capsys, tmp_path, arguments,
                                                             message):
    path = tmp_path / "args.txt"
    path.write_text(MEGATRON + arguments + "\n")
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--hardware", "dgx-h100",
                        "--gpus", "8")
    assert code == 3 and message in err and err.count("\n") == 1


def test_a_huge_count_says_the_range(capsys, tmp_path):
    path = tmp_path / "args.txt"
    path.write_text(MEGATRON.replace("--global-batch-size 128", "--global-batch-size " + "9" * 27)
                    + "--bf16\n")
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--hardware", "dgx-h100",
                        "--gpus", "8")
    assert code == 3 and "--global-batch-size must be >= 1 and <= 1e10, got 1e+27" in err


TORCHTITAN = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
[parallelism]
data_parallel_shard_degree = -1
[compile]
enable = {value}
"""


@pytest.mark.parametrize("value", ['"false"', '"maybe"', "1"])
def test_torchtitan_a_flag_of_the_wrong_type_is_a_spec_error(capsys, tmp_path, value):
    path = tmp_path / "job.toml"
    path.write_text(TORCHTITAN.format(value=value))
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--hardware", "dgx-h100",
                        "--gpus", "8")
    assert code == 3 and "compile.enable must be true or false" in err


NEMO2 = """_target_: nemo.collections.llm.api.pretrain
data:
  _target_: nemo.collections.llm.gpt.data.mock.MockDataModule
  global_batch_size: 512
  micro_batch_size: 1
  seq_length: {seq}
model:
  _target_: nemo.collections.llm.gpt.model.base.GPTModel
  config:
    _target_: nemo.collections.llm.gpt.model.base.GPTConfig175B
trainer:
  _target_: nemo.lightning.pytorch.trainer.Trainer
  devices: 8
  num_nodes: 16
  plugins:
    _target_: nemo.lightning.pytorch.plugins.mixed_precision.MegatronMixedPrecision
    precision: bf16-mixed
  strategy:
    _target_: nemo.lightning.pytorch.strategies.megatron_strategy.MegatronStrategy
    tensor_model_parallel_size: 8
    pipeline_model_parallel_size: 8
"""


def test_nemo2_learned_table_at_the_config_class_length(capsys, tmp_path):
    # GPTConfig175B's seq_length, 2048, sizes its learned position table where the config
    # leaves it unset, as a stated 2048 does
    path = tmp_path / "nemo2.yaml"
    path.write_text(NEMO2.format(seq=8192))
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--hardware", "dgx-h100")
    assert code == 3 and "differs from model.config (GPTConfig175B's seq_length) 2048" in err
    path.write_text(NEMO2.format(seq=2048))
    code, _, err = _run(capsys, "predict", "--from-config", str(path), "--hardware", "dgx-h100",
                        "--json")
    assert code == 0
