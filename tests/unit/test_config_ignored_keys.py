"""Config keys the readers listed as changing nothing, which change the step in the framework.

An audit of the readers' "ignored (does not change the predicted step)" lines (2026-12-07) found
keys that do change it: DeepSpeed's stage3_prefetch_bucket_size 0 turns ZeRO 3's prefetch off
(predicted 5.2% fast), its bf16 section's 16-bit master weights and states and ZeRO++'s keys
change the states and the gathers; torchtitan's compile.backend aot_eager fuses nothing (read as
the compiled stack: 13% fast) and debug.deterministic selects slower kernels; AutoModel's torch
Adam runs foreach unless told fused (costed fused whatever it said); Megatron-Core's
defer_embedding_wgrad_compute keeps the output layer's inputs and logits gradients until the
pipeline's flush; NeMo 1's distributed optimizer within a node shards the states over fewer
ranks. Each is now read, refused or noted; each test failed before.
"""

from __future__ import annotations

import json

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError
from tests.conftest import ROOT

CONFIGS = ROOT / "tests/data/configs"
DS = {"zero_optimization": {"stage": 3, "overlap_comm": True}, "bf16": {"enabled": True},
      "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 8}


def _plan(job, model=None, gpus=8):
    spec = resolve_model(job, model, 4096 if model else None)
    return resolve_plan(job, spec, {"gpus": gpus})[1]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("size, overlap", [(0, False), (5e8, True), ("5e8", True)])
def test_deepspeed_prefetch_bucket_zero_gathers_in_the_pass(tmp_path, size, overlap):
    config = {**DS, "zero_optimization": {**DS["zero_optimization"],
                                          "stage3_prefetch_bucket_size": size}}
    job = read_config(_write(tmp_path, "ds.json", json.dumps(config)))
    assert _plan(job, "llama3-8b")["overlap_param_gather"] is overlap
    assert not any("prefetch" in s.key for s in job.ignored)


@pytest.mark.parametrize("section, key, value", [
    ("bf16", "bf16_master_weights_and_grads", True),
    ("bf16", "bf16_optimizer_states", True),
    ("zero_optimization", "zero_quantized_weights", True),
    ("zero_optimization", "zero_quantized_gradients", True),
    ("zero_optimization", "zero_hpz_partition_size", 8),
    ("zero_optimization", "mics_shard_size", 8),
])
def test_deepspeed_states_and_gathers_it_does_not_model_are_refused(tmp_path, section, key,
                                                                     value):
    config = json.loads(json.dumps(DS))
    config[section][key] = value
    with pytest.raises(PlanError, match=f"{section}.{key}"):
        read_config(_write(tmp_path, "ds.json", json.dumps(config)))


def test_deepspeed_zero_plus_plus_defaults_are_read(tmp_path):
    config = json.loads(json.dumps(DS))
    config["zero_optimization"].update(zero_hpz_partition_size=1, mics_shard_size=-1,
                                       zero_quantized_weights=False)
    assert _plan(read_config(_write(tmp_path, "ds.json", json.dumps(config))),
                 "llama3-8b")["zero"] == 3


TITAN = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 8192\n'
         'local_batch_size = 1\n')


def test_torchtitan_compile_backend_other_than_inductor_is_refused(tmp_path):
    path = _write(tmp_path, "job.toml", TITAN + '[compile]\nenable = true\nbackend = "aot_eager"\n')
    with pytest.raises(PlanError, match="compile.backend aot_eager: perfmodel models "
                                        "torch.compile with Inductor"):
        read_config(path)
    path = _write(tmp_path, "job.toml", TITAN + '[compile]\nenable = true\nbackend = "inductor"\n')
    assert _plan(read_config(path))["stack"] == "compiled"


def test_torchtitan_deterministic_is_noted_not_ignored(tmp_path):
    job = read_config(_write(tmp_path, "job.toml", TITAN + "[debug]\ndeterministic = true\n"))
    assert any("debug.deterministic: deterministic algorithms" in n for n in job.notes)
    assert not any(s.key == "debug.deterministic" for s in job.ignored)


@pytest.mark.parametrize("kwargs, kernels", [({}, "foreach"), ({"fused": True}, "fused"),
                                              ({"foreach": True}, "foreach"),
                                              ({"foreach": False}, "foreach"),
                                              ({"fused": False, "foreach": None}, "foreach")])
def test_automodel_torch_adam_runs_as_torch_runs_it(tmp_path, kwargs, kernels):
    data = yaml.safe_load((CONFIGS / "automodel_qwen3_30b_a3b.yaml").read_text())
    data["optimizer"] = {"_target_": "torch.optim.AdamW", "lr": 1e-4, **kwargs}
    job = read_config(_write(tmp_path, "recipe.yaml", yaml.safe_dump(data)))
    assert _plan(job)["optimizer_kernels"] == kernels
    assert not any(s.key in ("optimizer.fused", "optimizer.foreach") for s in job.ignored)


def test_megatron_core_deferred_output_layer_gradients_are_noted(tmp_path):
    data = yaml.safe_load((CONFIGS / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(defer_embedding_wgrad_compute=True, wgrad_deferral_limit=22)
    job = read_config(_write(tmp_path, "bridge.yaml", yaml.safe_dump(data)))
    assert any("defer_embedding_wgrad_compute: Megatron-Core defers the output layer's "
               "weight-gradient GEMMs" in n for n in job.notes)
    assert not any("defer_embedding" in s.key and "the same cost" in s.line()
                   for s in job.ignored)


@pytest.mark.parametrize("key", ["distribute_within_nodes", "disable_distributed_parameters"])
def test_nemo1_distributed_adam_sharded_otherwise_is_refused(tmp_path, key):
    data = yaml.safe_load((CONFIGS / "nemo1_nemotron4_15b.yaml").read_text())
    data["model"]["optim"][key] = True
    with pytest.raises(PlanError, match=f"model.optim.{key}: the distributed optimizer sharded "
                                        "within a node"):
        read_config(_write(tmp_path, "nemo1.yaml", yaml.safe_dump(data)))


def test_megatron_clip_grad_zero_is_noted(tmp_path):
    # Megatron-Core's optimizer clips only where clip_grad > 0; perfmodel counts the clipping's
    # read of the gradients in every step: said, not listed as a hyperparameter that changes
    # nothing (a positive value is one)
    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
            "--max-position-embeddings 2048 --vocab-size 50304 --micro-batch-size 1 "
            "--global-batch-size 8 --clip-grad {}\n")
    job = read_config(_write(tmp_path, "args.txt", args.format("0.0")))
    assert any(n.startswith("--clip-grad 0: no gradient clipping") for n in job.notes)
    job = read_config(_write(tmp_path, "args.txt", args.format("1.0")))
    assert not any("clip" in n for n in job.notes)
    assert any(s.key == "--clip-grad" for s in job.ignored)
