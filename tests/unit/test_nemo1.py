"""NeMo 1 megatron_gpt configs (the NeMo Framework Launcher's, NVIDIA dgxc-benchmarking v24.11.1's)
read as Megatron settings (perfmodel.configs.nemo1): the development set's own Nemotron-4 15B
config gives the plan the benchmark maps its published row to."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from benchmarks import bench_accuracy as B
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

CONFIG = ROOT / "tests/data/configs/nemo1_nemotron4_15b.yaml"
ROWS = pd.read_csv(ROOT / "tests/data/accuracy/published-steps.csv").to_dict("records")


def _read(tmp_path, **model):
    """The published config with configure.sh's per-run overrides (nodes, model fields)."""
    data = yaml.safe_load(CONFIG.read_text())
    data["trainer"]["num_nodes"] = model.pop("num_nodes", 1)
    data["model"].update(model)
    path = tmp_path / "nemo1.yaml"
    path.write_text(yaml.safe_dump(data))
    return read_config(path)


def test_the_published_15b_config_gives_the_benchmarks_plan(tmp_path):
    # the 16-GPU bf16 run: configure.sh sets 2 nodes and GBS 64 (its README_15b.md)
    row = next(r for r in ROWS if r["source"] == "dgxc" and r["layers"] == 32
               and r["gpus"] == 16 and r["dtype"] == "bf16" and "v24.11.1" in r["source_ref"])
    model, bench, _ = B.plan_of(row)
    spec = tmp_path / "model.yaml"
    # the config's rotary_percentage 0.5 (Nemotron-4 rotates half of each head), which the
    # benchmark's Nemotron-4 architecture does not state
    spec.write_text(yaml.safe_dump({k: v for k, v in model.items() if k != "name"}
                                   | {"kind": "transformer", "seq_len": int(row["seq_len"]),
                                      "rotary_fraction": 0.5}))
    job = _read(tmp_path, num_nodes=2, global_batch_size=64)
    assert not job.unknown
    _, plan = resolve_plan(job, resolve_model(job, str(spec), None), {})
    for key in ("tp", "pp", "dp", "micro_batch", "global_batch", "zero", "sequence_parallel",
                "tp_comm_overlap", "overlap_grad_sync", "overlap_param_gather", "recompute",
                "grad_dtype", "flash_attention", "dtype", "master_weights"):
        assert plan.get(key) == bench.get(key, plan.get(key)), key
    assert (plan["zero"], plan["grad_dtype"], plan["tp_comm_overlap"]) == (1, "bf16", True)


def test_fp8_is_te_delayed_scaling_and_the_activation_gates(tmp_path):
    # the config's bias_activation_fusion false would run SwiGLU op by op (refused)
    job = _read(tmp_path, fp8=True, fp8_params=True, activation="fast-swiglu",
                bias_activation_fusion=True)
    assert (job.plan["dtype"], job.plan["fp8_recipe"], job.plan["fp8_params"]) == (
        "fp8", "delayed", True)
    assert job.model["gated_mlp"] is True
    job = _read(tmp_path, activations_checkpoint_granularity="full",
                activations_checkpoint_method="uniform", activations_checkpoint_num_layers=1)
    assert job.plan["recompute"] == "full"


def test_distributed_adam_keeps_the_master_weights_as_nemo_sets_it_up(tmp_path):
    # NeMo's megatron_base_model.py setup_optimization (v1.23.0 to v2.0.0): Apex's
    # DistributedFusedAdam with fp32 states beside megatron_amp_O2's bf16 weights stores the
    # master weights' 16-bit remainders; with fp8_params whole (store_params); with dtype bf16
    # none (the states in the weights' dtype)
    assert _read(tmp_path).plan["master_weights"] == "remainders"
    assert "master_weights" not in _read(tmp_path, fp8=True, fp8_params=True).plan
    with pytest.raises(PlanError, match="model.megatron_amp_O2 False: fp32 weights"):
        _read(tmp_path, megatron_amp_O2=False)  # fp32 weights under autocast: not modelled
    optim = yaml.safe_load(CONFIG.read_text())["model"]["optim"]
    job = _read(tmp_path, optim=dict(optim, dtype="bf16"))
    assert job.plan["optimizer_dtype"] == "bf16" and "master_weights" not in job.plan
    job = _read(tmp_path, optim=dict(optim, name="mcore_distributed_optim"))
    assert "master_weights" not in job.plan  # Megatron's own: fp32 master weights


def test_the_launchers_interpolations_are_resolved(tmp_path):
    # NeMo-Framework-Launcher's training configs (tag 24.07, e.g. conf/training/gpt3/5b.yaml):
    # ffn_hidden_size ${multiply:4, ${.hidden_size}} with its multiply resolver (main.py), and
    # references through its mount point, ${training.model.x}; ${data_dir} is the launcher's
    job = _read(tmp_path, ffn_hidden_size="${multiply:4, ${.hidden_size}}",
                global_batch_size="${multiply:8, ${training.model.micro_batch_size}}",
                micro_batch_size=2, data={"data_prefix": ["${data_dir}/my_text_document"]})
    assert job.model["ffn_hidden"] == 4 * job.model["hidden"]
    assert job.plan["global_batch"] == 16 and not job.unknown


def test_no_recompute_granularity_leaves_its_method_unread(tmp_path):
    # NeMo-Framework-Launcher 24.03.01 llama/llama2_7b.yaml: granularity null beside method
    # block and 0 layers, which Megatron reads only under a granularity
    job = _read(tmp_path, activations_checkpoint_granularity=None,
                activations_checkpoint_method="block", activations_checkpoint_num_layers=0,
                num_micro_batches_with_partial_activation_checkpoints=0,
                activations_checkpoint_layers_per_pipeline=0)
    assert job.plan["recompute"] == "none" and not job.unknown
    assert "recompute_method" not in job.plan and "recompute_num_layers" not in job.plan


def test_use_flash_attention_acts_on_the_legacy_layers_only(tmp_path):
    # NeMo passes it to its legacy model's own layers (ParallelTransformerLayer, nemo/collections/
    # nlp/modules/common/megatron/transformer.py v2.0.0); with transformer_engine true, legacy or
    # Megatron-Core's model, Transformer Engine's layers pick the attention ("this config does
    # nothing when transformer_engine=True", megatron_gpt_config.yaml)
    assert _read(tmp_path, mcore_gpt=False, use_flash_attention=False).plan["flash_attention"]
    job = _read(tmp_path, mcore_gpt=True, use_flash_attention=False)
    assert job.plan["flash_attention"] and not job.unknown


@pytest.mark.parametrize("model, error, text", [
    (dict(fsdp=True), PlanError, "model.fsdp"),
    (dict(position_embedding_type="alibi"), SpecError, "model.position_embedding_type alibi"),
    (dict(activation="swish"), SpecError, "model.activation swish"),
    (dict(num_micro_batches_with_partial_activation_checkpoints=2,
          activations_checkpoint_granularity="full", activations_checkpoint_method="block",
          activations_checkpoint_num_layers=1), PlanError, "partial"),
    (dict(optim={"name": "sgd"}), PlanError, "model.optim.name sgd"),
])
def test_what_nemo1_runs_that_perfmodel_does_not_model_is_refused(tmp_path, model, error, text):
    with pytest.raises(error, match=text):
        _read(tmp_path, **model)
