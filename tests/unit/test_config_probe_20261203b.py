"""The job-config readers' findings of the 2026-12-03 probe (b): each config, copied with its
source line into tests/data/configs/probe-20261203/, read as its framework runs it, refused in
one line, or its unmodelled part said in a note."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.costs.precision import model_state_bytes_per_param
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

DATA = ROOT / "tests/data/configs/probe-20261203"


def _plan(name: str, model: str | None = None, **given: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(job, model, plan fields) of a probe config with the command line's options."""
    job = read_config(DATA / name)
    spec = resolve_model(job, model, None)
    spec, plan = resolve_plan(job, spec, given)
    return job, spec, plan


def _listed(job: Any) -> dict[str, str]:
    return {s.key: s.note for s in (*job.read, *job.ignored)}


def _yaml(tmp_path: Any, name: str, change: Any) -> Any:
    data = yaml.safe_load((DATA / name).read_text())
    change(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return read_config(path)


# 1. NeMo 1: mcore_distributed_optim's overlap_param_sync (NVIDIA/NeMo bd618ccb29, v2.1.0 on)

def test_nemo1_mcore_optimizer_gathers_behind_the_forward_with_overlap_param_sync():
    # NeMo-Framework-Launcher gpt3/5b.yaml: mcore_distributed_optim, overlap_param_sync true
    job, _, plan = _plan("nemo1_gpt3_5b.yaml", gpus=128)
    assert plan["zero"] == 1 and plan["overlap_param_gather"] is True
    assert "overlap_param_gather" in _listed(job)["model.optim.overlap_param_sync"]
    # --overlap-param-gather agrees with the config now (it was refused as contradicting it)
    _, _, plan = _plan("nemo1_gpt3_5b.yaml", overlap_param_gather=True)
    assert plan["overlap_param_gather"] is True


def test_nemo1_v2_0_overlap_param_gather_is_ignored_and_a_difference_noted(tmp_path):
    def gather_only(data: Any) -> None:
        data["model"]["optim"]["overlap_param_sync"] = False
        data["model"]["optim"]["overlap_param_gather"] = True

    job = _yaml(tmp_path, "nemo1_gpt3_5b.yaml", gather_only)
    assert job.plan["overlap_param_gather"] is False
    assert "ignored from v2.1.0" in _listed(job)["model.optim.overlap_param_gather"]
    assert any("NeMo v2.0.0 read overlap_param_gather instead" in n for n in job.notes)


def test_nemo1_overlap_param_sync_without_grad_sync_is_refused_as_nemo_raises(tmp_path):
    def no_grad_sync(data: Any) -> None:
        data["model"]["optim"]["overlap_grad_sync"] = False

    with pytest.raises(PlanError, match="Must use overlap_param_sync together with "
                                        "overlap_grad_sync"):
        _yaml(tmp_path, "nemo1_gpt3_5b.yaml", no_grad_sync)


# 2. Megatron-Bridge override: cross_entropy_fusion_impl te over the provider's fusion default

def test_bridge_override_te_cross_entropy_runs_fused_as_the_providers_default():
    # GPTModelProvider.cross_entropy_loss_fusion = True (Megatron-Bridge gpt_provider.py at
    # 6292d347): the override's impl te is Transformer Engine's fused loss
    job, _, plan = _plan("bridge_llama3_70b_overrides.yaml", "llama3-70b", gpus=64)
    assert plan["cross_entropy"] == "te"
    assert "(fusion off)" not in str(_listed(job))
    _, _, plan = _plan("bridge_llama3_70b_overrides.yaml", "llama3-70b", gpus=64,
                       cross_entropy="te")
    assert plan["cross_entropy"] == "te"


# 3. Megatron-Bridge performance-matrix YAML: nothing read, refused

def test_bridge_perf_matrix_yaml_is_refused_naming_what_is_read():
    with pytest.raises(SpecError) as caught:
        read_config(DATA / "bridge_perf_llama3_70b.yaml")
    text = str(caught.value)
    assert "performance-matrix" in text and "ConfigContainer, perf_matrix" in text
    assert "NeMo 2 recipe" in text and "\n" not in text


# 4-5. NeMo AutoModel: TE's FusedAdam, per-layer compile, prefetch

def test_automodel_te_fused_adam_keeps_fp32_moments_and_no_master():
    # transformer_engine/pytorch/optimizers/fused_adam.py (d0067d0da): exp_avg_dtype and
    # exp_avg_sq_dtype torch.float32, master_weights False, called with the YAML's kwargs
    job, _, plan = _plan("am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", gpus=64)
    assert plan["optimizer_dtype"] == "fp32" and plan["master_weights"] == "none"
    states = model_state_bytes_per_param("bf16", plan["grad_dtype"], plan["optimizer_dtype"],
                                         plan["master_weights"])["optimizer_states"]
    assert states == 8  # two fp32 moments, no master (torch's Adam on bf16 params: 4)
    assert "Transformer Engine's FusedAdam" in _listed(job)["optimizer._target_"]


@pytest.mark.parametrize("kwargs, optimizer, master", [
    ({"master_weights": True}, "fp32", "fp32"),
    ({"exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.bfloat16"}, "bf16", "none"),
])
def test_automodel_te_fused_adam_arguments_are_read(tmp_path, kwargs, optimizer, master):
    def given(data: Any) -> None:
        data["optimizer"].update(kwargs)

    job = _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", given)
    assert job.plan["optimizer_dtype"] == optimizer and job.plan["master_weights"] == master


@pytest.mark.parametrize("kwargs, match", [
    ({"exp_avg_dtype": "torch.bfloat16"}, "one dtype"),
    ({"exp_avg_dtype": "torch.uint8", "exp_avg_sq_dtype": "torch.uint8"}, "FP8"),
    ({"master_weights": True, "store_param_remainders": True}, "remainders"),
])
def test_automodel_te_fused_adam_states_not_modelled_are_refused(tmp_path, kwargs, match):
    def given(data: Any) -> None:
        data["optimizer"].update(kwargs)

    with pytest.raises(PlanError, match=match):
        _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", given)


def test_automodel_apex_fused_adam_is_not_taken_for_torch_adam(tmp_path):
    def apex(data: Any) -> None:
        data["optimizer"]["_target_"] = "apex.optimizers.FusedAdam"

    with pytest.raises(PlanError, match="Adam's states"):
        _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", apex)


def test_automodel_enable_compile_compiles_each_decoder_layer():
    # FSDP2Manager.maybe_compile (Automodel 2013a4dd6 on; 36044ad3d): each decoder layer
    # torch.compiled under FSDP2 without a pipeline
    job, _, plan = _plan("am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", gpus=64)
    assert plan["stack"] == "compiled" and plan["kernels"] == "compiled"
    listed = _listed(job)
    assert "torch.compiled" in listed["distributed.enable_compile"]
    assert "overlap_param_gather" in listed["distributed.enable_fsdp2_prefetch"]
    assert plan["overlap_param_gather"] is True
    assert any("fsdp2_backward_prefetch_depth 2" in n for n in job.notes)
    assert "off" in listed["distributed.enable_async_tensor_parallel"]
    assert "distributed.patch_is_packed_sequence" in listed
    assert not [s.key for s in job.unknown if s.key.startswith("distributed.")]


def test_automodel_enable_compile_has_no_effect_under_a_pipeline_or_ddp(tmp_path):
    def ddp(data: Any) -> None:
        data["distributed"]["strategy"] = "ddp"

    job = _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml", ddp)
    assert job.plan["stack"] == "eager"
    assert "no effect with strategy ddp" in _listed(job)["distributed.enable_compile"]


def test_automodel_async_tp_is_tp_comm_overlap_and_needs_sequence_parallel(tmp_path):
    def async_tp(sp: bool) -> Any:
        def change(data: Any) -> None:
            data["distributed"].update(tp_size=2, cp_size=1, sequence_parallel=sp,
                                       enable_async_tensor_parallel=True,
                                       enable_compile=False)
        return change

    job = _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml",
                async_tp(True))
    assert job.plan["tp_comm_overlap"] is True and job.plan["stack"] == "compiled"
    with pytest.raises(PlanError, match="requires sequence_parallel=True"):
        _yaml(tmp_path, "am_custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml",
              async_tp(False))


# 6. Bridge override with dist.use_torch_fsdp2: FSDP2's prefetch kept

def test_bridge_override_fsdp2_keeps_its_prefetch_and_lists_dist_once():
    job, _, plan = _plan("bridge_llama3_8b_override_fsdp2.yaml", "llama3-8b", gpus=8)
    assert plan["zero"] == 3 and plan["overlap_param_gather"] is True
    listed = _listed(job)
    assert listed["dist.use_megatron_fsdp"] == "off"
    assert "dist.*" not in listed  # its two settings are the two read above
    assert not any("overlap_param_gather" in n for n in job.notes
                   if n.startswith("a Megatron-Bridge override file"))


# 7. Megatron-LM script: a world size from ${SLURM_NNODES:-"1"} alone

def test_megatron_world_from_an_unset_variables_default_is_set_by_gpus():
    job, _, plan = _plan("mlm_mixtral_8x7b_nowandb.sh", "mixtral-8x7b", gpus=32)
    assert plan["gpus"] == 32
    assert any(n.startswith("--gpus 32 sets the world size") and "SLURM_NNODES" in n
               for n in job.notes)
    with pytest.raises(PlanError, match="not a multiple of the 8 GPUs a node"):
        _plan("mlm_mixtral_8x7b_nowandb.sh", "mixtral-8x7b", gpus=12)


def test_megatron_world_from_a_default_is_named_without_gpus():
    job = read_config(DATA / "mlm_mixtral_8x7b_nowandb.sh")
    resolve_plan(job, resolve_model(job, "mixtral-8x7b", None), {})
    assert any(n.startswith("world size 8 (torchrun --nnodes 1 --nproc-per-node 8)")
               and "SLURM_NNODES" in n for n in job.notes)


def test_a_plan_the_default_world_cannot_hold_names_where_the_world_came_from(capsys):
    """Without --gpus the script's default world (8 GPUs) cannot hold ep 8 with pp 4: the
    refusal says the world size came from $SLURM_NNODES's default, and to give --gpus."""
    from perfmodel.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["predict", "--from-config", str(DATA / "mlm_mixtral_8x7b_nowandb.sh"),
              "--model", "mixtral-8x7b", "--hardware", "dgx-h100"])
    err = capsys.readouterr().err
    assert ended.value.code == 4 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ep (8) must divide tp x dp x cp")
    assert "(the world size 8 is torchrun --nnodes 1 --nproc-per-node 8: torchrun --nnodes " \
           "from the default of ${SLURM_NNODES:-1}" in err and err.rstrip().endswith(
               "give --gpus)")


def test_megatron_world_stated_by_the_script_still_refuses_another_gpus():
    with pytest.raises(PlanError, match="contradicts the config's world size 32"):
        _plan("mlm_mixtral_8x7b_4nodes.sh", "mixtral-8x7b", gpus=64)


# 8. NeMo 1 window_size, read as the NeMo 2 / Bridge reader reads it

def test_nemo1_window_size_is_the_models_sliding_window():
    # the launcher's mistral_7b.yaml: window_size [4096, 0], Transformer Engine's window of
    # 4096 tokens back and the token itself (NeMo 1 copies TransformerConfig fields by name:
    # megatron_base_model.py build_transformer_config)
    job = read_config(DATA / "nemo1_mistral_mistral_7b.yaml")
    assert job.model["sliding_window"] == 4097 and job.model["full_attention_every"] == 0
    assert "sliding_window 4097" in _listed(job)["model.window_size"]
    with pytest.raises(SpecError, match=r"sliding_window \(4097\) differs from model "
                                        r"'mistral-7b' \(4096\) \(its window_size \[4096, 0\]"):
        resolve_model(job, "mistral-7b", None)


# 9. overlap_p2p_comm: a note (not modelled), never "the same cost"

def test_nemo1_overlap_p2p_comm_is_said_not_modelled():
    job = read_config(DATA / "nemo1_gpt3_175b.yaml")  # interleaved, overlap_p2p_comm True
    assert "model.overlap_p2p_comm" not in _listed(job)
    assert any(n.startswith("model.overlap_p2p_comm: the interleaved schedule's pipeline sends")
               and "not modelled" in n for n in job.notes)
    job = read_config(DATA / "nemo1_gpt3_5b.yaml")  # overlap_p2p_comm False
    assert "exposed, as perfmodel counts them" in _listed(job)["model.overlap_p2p_comm"]


def test_megatron_overlap_p2p_communication_flags(tmp_path):
    base = ("--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
            "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 16 "
            "--vocab-size 32000 --bf16 --pipeline-model-parallel-size 2 "
            "--num-layers-per-virtual-pipeline-stage 2 ")
    for extra, listed, noted in (("", None, "Megatron-LM (from 2023-10-12"),
                                 ("--overlap-p2p-communication", None, "--overlap-p2p-"
                                  "communication: the interleaved schedule's"),
                                 ("--no-overlap-p2p-communication", "exposed", None)):
        path = tmp_path / "args.txt"
        path.write_text(base + extra)
        job = read_config(path)
        said = {s.key: s.note for s in (*job.read, *job.ignored)}
        if listed:
            assert listed in said[extra] and "the same cost" not in said[extra]
        else:
            assert not any("p2p" in k for k in said)
        p2p_notes = [n for n in job.notes if "p2p" in n or "pipeline sends" in n]
        assert p2p_notes == [] if noted is None else any(noted in n for n in p2p_notes)


def test_bridge_comm_overlap_overlap_p2p_comm_is_a_note(tmp_path):
    def p2p(data: Any) -> None:
        data["comm_overlap"] = {"overlap_p2p_comm": True}

    job = _yaml(tmp_path, "bridge_llama3_70b_overrides.yaml", p2p)
    assert any(n.startswith("comm_overlap.overlap_p2p_comm") and "not modelled" in n
               for n in job.notes)
    assert "comm_overlap.overlap_p2p_comm" not in {s.key for s in job.unknown}


# 10. torchtitan: compile.components ["loss"] alone

def test_torchtitan_loss_alone_compiled_is_said_costed_eager():
    job = read_config(DATA / "tt_deepseek_v3_671b.toml")
    assert job.plan["stack"] == "eager"
    assert any(n.startswith("compile.components loss: torchtitan compiles the loss alone")
               for n in job.notes)


# cosmetic: a store_false switch echoed as given; per-token loss and manual GC said what they are

def test_megatron_negated_switch_is_shown_as_given_and_host_options_said():
    job = read_config(DATA / "mlm_mixtral_8x7b_4nodes.sh")
    lines = "\n".join(job.report())
    assert "--no-masked-softmax-fusion: off" in lines
    assert "--no-masked-softmax-fusion False" not in lines
    job = read_config(DATA / "mlm_llama3_8b_fp8_resolved.sh")
    listed = _listed(job)
    assert listed["--calculate-per-token-loss"].startswith("per-token loss normalisation")
    assert listed["--manual-gc"].startswith("Python's garbage collection on the host")
