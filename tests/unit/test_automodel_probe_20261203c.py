"""NeMo AutoModel's reader against AutoModel (NVIDIA-NeMo/Automodel at 36044ad3d), where the
2026-12-03 probe (c) found them apart: loss targets that fell through silently, the Hugging Face
attention implementation and force_hf not read, the backend's default taken as torch's rather
than Transformer Engine's, the loader's `none` refused, `torch_dtype: auto` refused, and keys
left out of the read lists. Each recipe below is a small copy of the AutoModel recipe its
comment names; each test fails before its fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from perfmodel import Plan, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT
from tests.unit.test_configs import set_dotted

HF = ROOT / "tests/data/hf"
TRAIN = "TrainFinetuneRecipeForNextTokenPrediction"
MASKED = "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"
MOCK = "nemo_automodel.components.datasets.llm.mock_iterable_dataset.MockIterableDataset"
CHAT = "nemo_automodel.components.datasets.llm.chat_dataset.ChatDataset"

# examples/llm_benchmark/llama3_1/llama3_1_8b_quack_rope.yaml (its loss: Apple's cut cross
# entropy, FusedLinearCrossEntropy)
LLAMA_QUACK: dict[str, Any] = {
    "recipe": "BenchmarkingRecipeForNextTokenPrediction",
    "step_scheduler": {"global_batch_size": 128, "local_batch_size": 1, "max_steps": 30},
    "distributed": {"strategy": "fsdp2", "tp_size": 1, "cp_size": 1, "pp_size": 1,
                    "sequence_parallel": False, "activation_checkpointing": True},
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_config",
              "config": {"_target_": "transformers.AutoConfig.from_pretrained",
                         "pretrained_model_name_or_path": "meta-llama/Llama-3.1-8B"},
              "output_hidden_states": True,
              "backend": {"attn": "sdpa", "linear": "torch", "rms_norm": "torch_fp32",
                          "rope": "quack", "rope_fusion": False}},
    "loss_fn": {"_target_": "nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy"},
    "dataset": {"_target_": MOCK, "seq_len": 4096, "num_samples": 100000},
    "optimizer": {"_target_": "torch.optim.Adam", "lr": 0.0001},
}
# examples/llm_finetune/gemma/gemma_7b_squad.yaml: Hugging Face's Gemma (AutoModel has no gemma
# class), eager attention; its dp_size none written null here (the probe's copy), none below
GEMMA_SQUAD: dict[str, Any] = {
    "recipe": TRAIN,
    "step_scheduler": {"global_batch_size": 64, "local_batch_size": 4, "max_steps": 100},
    "dist_env": {"backend": "nccl"},
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "google/gemma-7b", "torch_dtype": "bf16",
              "attn_implementation": "eager"},
    "distributed": {"strategy": "fsdp2", "dp_size": None, "tp_size": 1, "cp_size": 1,
                    "sequence_parallel": False},
    "loss_fn": {"_target_": MASKED},
    "dataset": {"_target_": "nemo_automodel.components.datasets.llm.squad.make_squad_dataset",
                "dataset_name": "rajpurkar/squad", "split": "train"},
    "packed_sequence": {"packed_sequence_size": 0},
    "optimizer": {"_target_": "torch.optim.Adam", "lr": 1.0e-5},
}
# examples/llm_finetune/qwen/qwen3_moe_30b_te_deepep.yaml, its model.backend left to
# BackendConfig's defaults (as examples/llm_finetune/glm/glm_4.5_air_te_deepep.yaml leaves attn,
# linear and rms_norm), ep_size 1
QWEN3_MOE: dict[str, Any] = {
    "recipe": TRAIN,
    "step_scheduler": {"global_batch_size": 32, "local_batch_size": 4},
    "distributed": {"strategy": "fsdp2", "tp_size": 1, "cp_size": 1, "pp_size": 1,
                    "ep_size": 1},
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "Qwen/Qwen3-30B-A3B"},
    "loss_fn": {"_target_": MASKED},
    "dataset": {"_target_": MOCK, "seq_len": 4096},
    "optimizer": {"_target_": "torch.optim.Adam", "lr": 1.0e-5},
}
# examples/llm_finetune/mistral/mistral_7b_squad.yaml: Hugging Face's Mistral with Liger's kernels
MISTRAL_SQUAD: dict[str, Any] = {
    **GEMMA_SQUAD,
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "mistralai/Mistral-7B-v0.1"},
}
# examples/llm_finetune/qwen/qwen3_32b_tulu3_cp2.yaml (its loss TEParallelCrossEntropy, as the
# probe's copy): ChatDataset with seq_length, dp_size null, output_hidden_states
TULU: dict[str, Any] = {
    "recipe": TRAIN,
    "step_scheduler": {"global_batch_size": 64, "local_batch_size": 2, "ckpt_every_steps": 1000,
                       "val_every_steps": 100, "max_steps": 100},
    "model": {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
              "pretrained_model_name_or_path": "Qwen/Qwen3-32B", "output_hidden_states": True},
    "distributed": {"strategy": "fsdp2", "dp_size": None, "tp_size": 1, "cp_size": 2,
                    "pp_size": 1, "sequence_parallel": False, "activation_checkpointing": True,
                    "defer_fsdp_grad_sync": False},
    "loss_fn": {"_target_": "nemo_automodel.components.loss.te_parallel_ce."
                            "TEParallelCrossEntropy"},
    "dataset": {"_target_": CHAT, "path_or_dataset_id": "allenai/tulu-3-sft-mixture",
                "split": "train", "seq_length": 2048, "truncation": True,
                "padding": "do_not_pad", "chat_template": "qwen3_tulu3_chat_template.jinja"},
    "packed_sequence": {"packed_sequence_size": 0},
    "optimizer": {"_target_": "torch.optim.Adam", "betas": [0.9, 0.999], "lr": 1.0e-5},
}


def _recipe(tmp_path: Any, base: dict[str, Any], **changes: Any) -> Any:
    """base with each dotted key of changes set (None: removed), written as a YAML file."""
    data = set_dotted(copy.deepcopy(base), changes)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _plan(path: Any, model: str | None = None, seq_len: int | None = None,
          **given: Any) -> tuple[Any, Any, dict[str, Any]]:
    job = read_config(path)
    spec = resolve_model(job, model, seq_len)
    spec, plan = resolve_plan(job, spec, given)
    return job, spec, plan


def _notes(job: Any) -> dict[str, str]:
    """Every key the reader listed (read, ignored or not read), with what it made of it."""
    return {s.key: s.note for s in (*job.read, *job.ignored, *job.unknown)}


# 1. loss_fn: only the targets perfmodel models are read; AutoModel has no default loss

@pytest.mark.parametrize("target", [
    "nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy",  # 14 recipes
    "nemo_automodel.components.loss.chunked_ce.ChunkedCrossEntropy",
    "nemo_automodel.components.loss.kd_loss.KDLoss",
])
def test_a_loss_perfmodel_does_not_model_is_refused_naming_the_targets_read(tmp_path, target):
    # before: the target fell through, the plan's unfused loss over whole fp32 logits priced
    with pytest.raises(PlanError) as caught:
        read_config(_recipe(tmp_path, LLAMA_QUACK, **{"loss_fn._target_": target}))
    text = str(caught.value)
    assert f"loss_fn._target_ {target}: perfmodel reads AutoModel's " in text
    assert "masked_ce.MaskedCrossEntropy and te_parallel_ce.TEParallelCrossEntropy" in text
    assert "\n" not in text


def test_a_recipe_without_loss_fn_is_refused_as_automodel_has_no_default(tmp_path):
    # recipes/llm/train_ft.py setup: self.cfg.loss_fn.build(), RecipeConfig.loss_fn None
    with pytest.raises(PlanError, match=r"loss_fn._target_ \(not given\): .*with no default"):
        read_config(_recipe(tmp_path, QWEN3_MOE, loss_fn=None))


def test_the_quack_rope_recipes_cut_cross_entropy_is_refused_in_one_line(tmp_path, run_cli):
    path = _recipe(tmp_path, LLAMA_QUACK)
    res = run_cli("predict", "--from-config", path, "--hardware", "dgx-h100", "--gpus", "8")
    assert res.returncode == 4 and "step time" not in res.stdout
    error = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert error == [f"error: {path}: loss_fn._target_ nemo_automodel.components.loss.linear_ce."
                     "FusedLinearCrossEntropy: perfmodel reads AutoModel's nemo_automodel."
                     "components.loss.masked_ce.MaskedCrossEntropy and te_parallel_ce."
                     "TEParallelCrossEntropy (a recipe without loss_fn does not run: "
                     "train_ft.py builds it, with no default)"]


def test_the_losses_read_keep_their_kernels_and_name_their_other_keys(tmp_path):
    job = read_config(_recipe(tmp_path, QWEN3_MOE, **{"loss_fn.reduction": "sum",
                                                     "loss_fn.fp32_upcast": False}))
    assert job.plan["cross_entropy"] == "no-upcast"
    assert _notes(job)["loss_fn.reduction"] == "how the token losses are summed (the same work)"
    job = read_config(_recipe(tmp_path, TULU))
    assert job.plan["cross_entropy"] == "te"


# 2. model.attn_implementation and model.force_hf: Hugging Face's attention where it applies

def test_hf_attn_implementation_eager_attends_unfused(tmp_path):
    # Gemma has no AutoModel class (registry.py): Hugging Face's, model.attn_implementation;
    # before: flash_attention true (the backend's default sdpa) for an eager run
    path = _recipe(tmp_path, GEMMA_SQUAD)
    job, _, plan = _plan(path, str(HF / "gemma-7b"), 1024, gpus=8)
    assert plan["flash_attention"] is False
    assert _notes(job)["model.attn_implementation"] == ("unfused attention (flash_attention "
                                                        "false)")
    _, _, fused = _plan(_recipe(tmp_path, GEMMA_SQUAD, **{"model.attn_implementation": "sdpa"}),
                        str(HF / "gemma-7b"), 1024, gpus=8)
    assert fused["flash_attention"] is True
    unfused_s = predict(resolve_model(job, str(HF / "gemma-7b"), 1024), "dgx-h100",
                        Plan(**plan)).step_time_s
    fused_s = predict(resolve_model(job, str(HF / "gemma-7b"), 1024), "dgx-h100",
                      Plan(**fused)).step_time_s
    assert unfused_s > fused_s  # the s^2 scores written and read: the printed step grows


@pytest.mark.parametrize("impl, flash", [("sdpa", True), ("flash_attention_2", True),
                                         ("flash_attention_3", True), ("eager", False)])
def test_attn_implementation_values(tmp_path, impl, flash):
    path = _recipe(tmp_path, MISTRAL_SQUAD, **{"model.attn_implementation": impl})
    assert _plan(path, seq_len=1024, gpus=8)[2]["flash_attention"] is flash


def test_an_attn_implementation_perfmodel_does_not_read_is_refused(tmp_path):
    path = _recipe(tmp_path, MISTRAL_SQUAD, **{"model.attn_implementation": "flex_attention"})
    with pytest.raises(PlanError, match="model.attn_implementation flex_attention: perfmodel "
                                        "reads eager, sdpa, flash_attention_2, "
                                        "flash_attention_3"):
        read_config(path)


def test_force_hf_decides_which_attention_applies(tmp_path):
    # Qwen3-30B-A3B has AutoModel's own class, which attends with model.backend.attn: the
    # recipe's eager attn_implementation has no effect there; force_hf true runs Hugging Face's
    eager = {"model.attn_implementation": "eager"}
    job, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE, **eager), gpus=8)
    assert plan["flash_attention"] is True
    assert "no effect: AutoModel's own qwen3_moe class" in _notes(job)[
        "model.attn_implementation"]
    job, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE, **eager, **{"model.force_hf": True}),
                         gpus=8)
    assert plan["flash_attention"] is False
    assert _notes(job)["model.force_hf"] == ("Hugging Face's implementation (model_init.py: "
                                             "force_hf)")
    with pytest.raises(SpecError, match="model.force_hf must be true or false, got the string "
                                        "'yes'"):
        read_config(_recipe(tmp_path, QWEN3_MOE, **{"model.force_hf": "yes"}))


def test_llamas_own_class_attends_through_hugging_faces_interface(tmp_path):
    # components/models/llama/model.py: unpacked batches take config._attn_implementation;
    # backend.attn only packed ones
    path = _recipe(tmp_path, LLAMA_QUACK, **{"loss_fn._target_": MASKED,
                                            "model.attn_implementation": "eager"})
    job, _, plan = _plan(path, gpus=8)
    assert plan["flash_attention"] is False
    assert "only packed sequences' attention" in _notes(job)["model.backend.attn"]


def test_hugging_faces_attention_takes_sdpa_with_context_parallelism(tmp_path):
    # _apply_preload_overrides: cp_size > 1 sets attn_implementation sdpa (Hugging Face's)
    path = _recipe(tmp_path, GEMMA_SQUAD, **{"distributed.cp_size": 2})
    job, _, plan = _plan(path, str(HF / "gemma-7b"), 1024, gpus=8)
    assert (plan["flash_attention"], plan["cp_comm"]) == (True, "allgather")
    assert _notes(job)["model.attn_implementation"].endswith(
        "cp_size 2 takes sdpa (_apply_preload_overrides)")


def test_a_command_line_attention_contradicting_the_recipes_is_refused(tmp_path):
    # decided once --model gives the model's type: resolve_plan's check, done there
    with pytest.raises(PlanError, match="--attention flash contradicts the config's "
                                        "flash_attention False"):
        _plan(_recipe(tmp_path, GEMMA_SQUAD), str(HF / "gemma-7b"), 1024, gpus=8,
              flash_attention=True)


def test_hugging_faces_models_run_ligers_kernels_as_automodel_patches_them(tmp_path):
    # auto_model.py _build_model: _patch_liger_kernel for Hugging Face's classes,
    # use_liger_kernel true by default, off with tp_size or cp_size > 1
    job, _, plan = _plan(_recipe(tmp_path, MISTRAL_SQUAD), seq_len=1024, gpus=8)
    assert plan["kernels"] == "fused"
    assert any("x86_64 hosts only" in n for n in job.notes)
    for change in ({"model.use_liger_kernel": False}, {"distributed.tp_size": 2}):
        _, _, plan = _plan(_recipe(tmp_path, MISTRAL_SQUAD, **change), seq_len=1024, gpus=8)
        assert plan["kernels"] == "eager", change
    job = read_config(_recipe(tmp_path, QWEN3_MOE, **{"model.use_liger_kernel": True,
                                                     "model.use_sdpa_patching": True}))
    assert _notes(job)["model.use_liger_kernel"].startswith("no effect: AutoModel patches "
                                                            "Liger into Hugging Face's")
    assert "SDPA's fused kernels" in _notes(job)["model.use_sdpa_patching"]


# 3. model.backend absent: BackendConfig's defaults with Transformer Engine installed

def test_an_absent_backend_takes_transformer_engines_defaults(tmp_path):
    # components/models/common/utils.py BackendConfig: attn te, linear te, rms_norm torch_fp32
    # with TE and CUDA; before: sdpa and torch's linears (kernels eager)
    job, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE), gpus=8)
    assert (plan["flash_attention"], plan["kernels"]) == (True, "fused")
    notes = _notes(job)
    assert notes["model.backend.attn"].endswith("BackendConfig's default with Transformer "
                                                "Engine installed, as in AutoModel's container")
    assert any("rms_norm torch_fp32 (default), linear te (default)" in s.note
               for s in job.read if s.key == "model.backend")
    _, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE, **{"distributed.cp_size": 2}), gpus=8)
    assert plan["cp_comm"] == "p2p"  # TE's attention's ring
    _, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE, **{"model.backend": {"linear": "torch"}}),
                       gpus=8)
    assert plan["kernels"] == "eager"  # torch's linears, rms_norm torch_fp32


def test_llamas_own_class_keeps_torchs_linears_whatever_the_backend(tmp_path):
    # components/models/llama/model.py: nn.Linear, model.backend.rms_norm's norms
    path = _recipe(tmp_path, LLAMA_QUACK, **{"loss_fn._target_": MASKED, "model.backend":
                                             {"linear": "te"}})
    job, _, plan = _plan(path, gpus=8)
    assert plan["kernels"] == "eager"
    assert _notes(job)["model.backend.linear"].startswith("not applied: AutoModel's own llama")
    _, _, plan = _plan(_recipe(tmp_path, LLAMA_QUACK, **{"loss_fn._target_": MASKED,
                                                        "model.backend": {"rms_norm": "te"}}),
                       gpus=8)
    assert plan["kernels"] == "fused"


def test_a_model_given_by_model_is_decided_by_its_config_type(tmp_path):
    # NeMoAutoModelForCausalLM over a model perfmodel has no preset of: its config.json's type
    path = _recipe(tmp_path, QWEN3_MOE, **{"model.pretrained_model_name_or_path": "org/x"})
    job, _, plan = _plan(path, str(HF / "qwen3-30b-a3b"), gpus=8)
    assert (plan["flash_attention"], plan["kernels"]) == (True, "fused")
    assert any("AutoModel's own qwen3_moe class" in s.note for s in job.read
               if s.key == "model.backend")


# 4. the loader's translation of every value: none is None

def test_dp_size_none_is_inferred_as_automodel_reads_it(tmp_path):
    # components/config/loader.py translate_value: "none" -> None (inferred dp); before:
    # "distributed.dp_size must be a whole number, got 'none'"
    path = _recipe(tmp_path, GEMMA_SQUAD, **{"distributed.dp_size": "none"})
    job, _, plan = _plan(path, str(HF / "gemma-7b"), 1024, gpus=16)
    assert plan["dp"] == 16
    assert _notes(job)["distributed.dp_size"].startswith("dp inferred")
    path = _recipe(tmp_path, GEMMA_SQUAD, **{"distributed.dp_replicate_size": "None"})
    assert _plan(path, str(HF / "gemma-7b"), 1024, gpus=8)[2]["dp"] == 8
    with pytest.raises(SpecError, match="distributed.dp_size must be a whole number, got "
                                        "'NONE'"):  # translate_value's spellings only
        read_config(_recipe(tmp_path, GEMMA_SQUAD, **{"distributed.dp_size": "NONE"}))


def test_every_value_is_translated_as_automodels_loader_does(tmp_path):
    path = _recipe(tmp_path, QWEN3_MOE, **{"distributed.tp_size": "2",
                                          "distributed.sequence_parallel": "true",
                                          "loss_fn.fp32_upcast": "False"})
    _, _, plan = _plan(path, gpus=8)
    assert (plan["tp"], plan["sequence_parallel"], plan["cross_entropy"]) == \
        (2, True, "no-upcast")


# 5. model.torch_dtype auto: the model config's

def test_torch_dtype_auto_is_the_model_configs(tmp_path):
    # from_pretrained's default "auto"; before: refused as not bfloat16 or float32
    job = read_config(_recipe(tmp_path, QWEN3_MOE, **{"model.torch_dtype": "auto"}))
    assert (job.plan["optimizer_dtype"], job.plan["grad_dtype"]) == ("bf16", "bf16")
    assert _notes(job)["model.torch_dtype"].endswith(
        "(the model config's torch_dtype: auto, from_pretrained's default)")


# 6. every key read, ignored or named as not read; the chat dataset's seq_length

def test_every_key_of_the_tulu_recipe_is_listed(tmp_path):
    job, _, _ = _plan(_recipe(tmp_path, TULU), seq_len=2048, gpus=8)
    listed = _notes(job)
    sections = {s.key for s in (*job.read, *job.ignored) if s.value == "..."}

    def leaves(node: Any, prefix: str) -> list[str]:
        if not isinstance(node, dict) or not node:
            return [prefix]
        return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}.{k}"
                                                                 if prefix else k)]

    missing = [leaf for leaf in leaves(TULU, "") if leaf not in listed
               and not any(leaf.startswith(f"{s}.") or leaf == s for s in sections)]
    assert missing == []
    assert listed["distributed.sequence_parallel"] == "off"
    assert listed["packed_sequence.packed_sequence_size"] == "no packing: each sample its own row"
    assert listed["model.output_hidden_states"].startswith("every layer's output returned")
    assert listed["dataset.path_or_dataset_id"].startswith("the data")


@pytest.mark.parametrize("padding, truncation, fixed", [
    ("max_length", True, True), ("do_not_pad", True, False), ("max_length", False, False),
])
def test_chat_dataset_seq_length_is_the_length_only_where_it_pads_and_cuts(
        tmp_path, padding, truncation, fixed):
    # formatting_utils._package_tokenized_example: padded to seq_length with padding
    # max_length only; cut to it with truncation
    path = _recipe(tmp_path, TULU, **{"dataset.padding": padding,
                                      "dataset.truncation": truncation})
    job = read_config(path)
    if fixed:
        assert job.model["seq_len"] == 2048
        with pytest.raises(SpecError, match="--seq-len 4096 contradicts the config's sequence "
                                            "length 2048"):
            resolve_model(job, None, 4096)
    else:
        assert "seq_len" not in job.model
        with pytest.raises(SpecError, match="dataset.seq_length 2048 is a bound, not the "
                                            "length.*give --seq-len"):
            resolve_model(job, None, None)


def test_dataset_sequence_keys_are_each_classs_own(tmp_path):
    # MegatronPretraining(seq_length=2048) by default; ChatDataset has no seq_len argument
    megatron = {"_target_": "nemo_automodel.components.datasets.llm.megatron_dataset."
                            "MegatronPretraining", "paths": ["/data/x"]}
    assert read_config(_recipe(tmp_path, TULU, dataset=megatron)).model["seq_len"] == 2048
    job = read_config(_recipe(tmp_path, TULU, **{"dataset.seq_length": None,
                                                 "dataset.seq_len": 4096}))
    assert "seq_len" not in job.model
    assert "dataset.seq_len" in {s.key for s in job.unknown}


def test_pipeline_micro_batch_is_listed_and_automodels_assertion_kept(tmp_path):
    pipe = {"distributed.pp_size": 2, "step_scheduler.local_batch_size": 8,
            "distributed.pipeline": {"pp_schedule": "1f1b", "pp_microbatch_size": 2,
                                     "scale_grads_in_schedule": False}}
    job, _, plan = _plan(_recipe(tmp_path, QWEN3_MOE, **pipe), gpus=8)
    assert plan["micro_batch"] == 2
    assert _notes(job)["pipeline.pp_microbatch_size"].startswith("micro_batch 2")
    pipe["distributed.pipeline"]["pp_microbatch_size"] = 8  # 8 / 8 = 1 micro-batch < pp 2
    with pytest.raises(PlanError, match="local_batch_size 8 / it must be >= pp_size 2"):
        _plan(_recipe(tmp_path, QWEN3_MOE, **pipe), gpus=8)


def test_the_mock_dataset_without_seq_len_is_its_default_1024(tmp_path):
    # nemo_automodel/components/datasets/llm/mock_iterable_dataset.py at 36044ad3d:
    # MockIterableDataset(seq_len=1024); before, --seq-len was asked for and any length taken
    path = _recipe(tmp_path, LLAMA_QUACK, **{"dataset.seq_len": None,
                                             "loss_fn._target_": MASKED})
    job, spec, _ = _plan(path, gpus=8)
    assert spec.seq_len == 1024
    assert "MockIterableDataset's default" in _notes(job)["dataset.seq_len"]
    with pytest.raises(SpecError, match="1024"):
        _plan(path, seq_len=2048, gpus=8)
