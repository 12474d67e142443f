"""The Megatron-LM reader reads each setting that changes the step exactly or refuses it in one
line naming it (perfmodel.configs.megatron, with job.typo and the option table
perfmodel.configs.megatron_options). Sources: NVIDIA/Megatron-LM at d98e8a64dd (gpt_builders.py,
megatron/core/models/backends.py LocalSpecProvider, megatron/core/transformer/
multi_latent_attention.py, transformer_config.py, megatron/core/pipeline_parallel/schedules.py,
megatron/training/arguments.py and training.py), and its legacy model before 8de82388
(megatron/legacy/model/transformer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron import megatron_arguments
from perfmodel.configs.megatron_options import MEGATRON_LM_OPTIONS
from perfmodel.errors import PlanError, SpecError
from perfmodel.strategy import plan_from_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1024 --micro-batch-size 1 "
        "--global-batch-size 8 --bf16 ")
MLA = ("--multi-latent-attention --q-lora-rank 64 --kv-lora-rank 32 --qk-head-dim 32 "
       "--qk-pos-emb-head-dim 16 --v-head-dim 32 --position-embedding-type rope ")


def read(tmp_path: Path, text: str):
    path = tmp_path / "args.txt"
    path.write_text(text)
    return read_config(path)


def plan(tmp_path: Path, text: str, gpus: int = 8):
    job = read(tmp_path, text)
    model, fields = resolve_plan(job, resolve_model(job, None, None), {"gpus": gpus})
    fields.setdefault("dtype", "bf16")
    built = plan_from_dict(fields)
    built.check(model)
    return job, model, built


def line(job, key: str) -> str:
    return next(s.line() for s in job.read if s.key == key)


# --- 1. Megatron's own layers: --transformer-impl local, --use-legacy-models ---------------------


def test_local_layers_attend_unfused(tmp_path):
    # gpt_builders.py: use_te = transformer_impl == "transformer_engine"; the local spec's
    # core attention is Megatron-Core's DotProductAttention (backends.py LocalSpecProvider),
    # unfused whatever --attention-backend says (it sets Transformer Engine's backend only)
    for extra in ("", "--attention-backend flash ", "--use-flash-attn "):
        job = read(tmp_path, BASE + "--transformer-impl local " + extra)
        assert job.plan["flash_attention"] is False, extra
        assert "local layers" in line(job, "--transformer-impl")
    job = read(tmp_path, BASE + "--transformer-impl local --attention-backend flash")
    assert "no effect on Megatron-Core's local layers" in line(job, "--attention-backend")
    # Transformer Engine's layers (the default) keep the hardware's choice
    assert read(tmp_path, BASE).plan.get("flash_attention") is None


def test_local_layers_follow_the_unfused_softmax_rule(tmp_path):
    # the probe's gpt_gpt3_mcore_tp2_pp2_uninstall_te: --transformer-impl local beside
    # --no-masked-softmax-fusion was costed with flash attention
    with pytest.raises(PlanError, match="--no-masked-softmax-fusion.*unfused attention's softmax "
                                        "op by op is not modelled.*--transformer-impl "
                                        "transformer_engine"):
        read(tmp_path, BASE + "--transformer-impl local --no-masked-softmax-fusion")


@pytest.mark.parametrize("extra, match", [
    # FP8 GEMMs and the userbuffers overlap are Transformer Engine's
    ("--fp8-format hybrid", "--fp8-format hybrid: FP8 GEMMs are Transformer Engine's: "
                            "Megatron-Core's local layers"),
    ("--tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap",
     "--tp-comm-overlap: Transformer Engine's userbuffers"),
    ("--transformer-impl inference_optimized", "--transformer-impl inference_optimized: "
                                               "perfmodel models the training layers"),
])
def test_what_only_transformer_engine_runs_is_refused_beside_local_layers(tmp_path, extra, match):
    impl = "" if "--transformer-impl" in extra else "--transformer-impl local "
    with pytest.raises(PlanError, match=match):
        read(tmp_path, BASE + impl + extra)


def test_the_legacy_models_attention_follows_use_flash_attn(tmp_path):
    # megatron/legacy/model/transformer.py (8de82388^): ParallelAttention uses FlashSelfAttention
    # under --use-flash-attn, its unfused core attention otherwise; with Transformer Engine's
    # layers (the default impl since 2024-04) te.pytorch.TransformerLayer, as Megatron-Core's
    legacy = BASE + "--use-legacy-models --transformer-impl local "
    assert read(tmp_path, legacy).plan["flash_attention"] is False
    assert read(tmp_path, legacy + "--use-flash-attn").plan["flash_attention"] is True
    job = read(tmp_path, BASE + "--use-legacy-models")
    assert job.plan.get("flash_attention") is None
    # a script of 2021-23 (an older recompute option) ran the legacy model by default
    older = BASE + "--checkpoint-activations --transformer-impl local "
    assert read(tmp_path, older + "--use-flash-attn").plan["flash_attention"] is True
    assert read(tmp_path, older + "--use-mcore-models --use-flash-attn"
                ).plan["flash_attention"] is False
    assert "Transformer Engine's TransformerLayer" in line(job, "--use-legacy-models")


@pytest.mark.parametrize("extra, match", [
    ("--context-parallel-size 2", "Context parallelism is not supported in legacy models"),
    ("--position-embedding-type rope --mtp-num-layers 1", "does not support Multi-Token"),
    ("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather",
     "only supported with MCore models"),
])
def test_the_legacy_model_refuses_what_megatron_lm_asserts(tmp_path, extra, match):
    with pytest.raises(PlanError, match="--use-legacy-models: Megatron-LM asserts .*" + match):
        read(tmp_path, BASE + "--use-legacy-models " + extra)


# --- 2. architectures perfmodel does not cost ----------------------------------------------------


@pytest.mark.parametrize("extra", [
    "--experimental-attention-variant gated_delta_net",
    "--experimental-attention-variant dsa",
    "--linear-attention-freq 3", "--linear-num-key-heads 4", "--linear-value-head-dim 64",
    "--attention-output-gate",
    "--dsa-indexer-topk 2048", "--dsa-indexer-n-heads 64", "--no-dsa-indexer-rotate-activation",
    "--hybrid-layer-pattern M-M*-", "--hybrid-override-pattern M*M*", "--is-hybrid-model",
    "--mamba-num-heads 64", "--mamba-state-dim 128", "--gdp-num-householder 3",
    "--heterogeneous-layers-config-path layers.json", "--enable-mhc-connections",
])
def test_uncosted_architectures_are_refused(tmp_path, extra):
    name = extra.split()[0]
    with pytest.raises(SpecError, match=f"{name}.*: .*not modelled") as info:
        read(tmp_path, BASE + extra)
    assert "\n" not in str(info.value)


def test_softmax_type_and_window_skip(tmp_path):
    # TransformerConfig.softmax_type: learnable is GPT-OSS's sinks (the NeMo reader's reading);
    # off-by-one refused; window_attn_skip_freq without a window changes nothing
    job = read(tmp_path, BASE + "--softmax-type learnable --window-attn-skip-freq 2")
    assert job.model["attention_sinks"] is True and not job.unknown
    assert "no effect without --window-size" in line(job, "--window-attn-skip-freq")
    assert "attention_sinks" not in read(tmp_path, BASE + "--softmax-type vanilla").model
    with pytest.raises(SpecError, match="--softmax-type off-by-one: perfmodel models"):
        read(tmp_path, BASE + "--softmax-type off-by-one")


# --- 3. FSDP2's resharding, micro-batch groups, optimizer instances ------------------------------


FSDP2 = ("--use-torch-fsdp2 --untie-embeddings-and-output-weights "
         "--no-gradient-accumulation-fusion ")


def test_fsdp2_no_reshard_after_forward_is_fsdp_reshard_backward(tmp_path):
    # training.py get_megatron_ddp_config: TorchFullyShardedDataParallelConfig(
    # reshard_after_forward=args.torch_fsdp2_reshard_after_forward)
    job = read(tmp_path, BASE + FSDP2 + "--torch-fsdp2-no-reshard-after-forward")
    assert job.plan["fsdp_reshard"] == "backward" and not job.unknown
    job = read(tmp_path, BASE + "--torch-fsdp2-no-reshard-after-forward")
    assert "fsdp_reshard" not in job.plan
    assert "no effect without --use-torch-fsdp2" in line(
        job, "--torch-fsdp2-no-reshard-after-forward")


INTERLEAVED = BASE.replace("--num-layers 4", "--num-layers 8") + \
    "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 "


def test_microbatch_group_size_is_read_at_pp_and_refused_otherwise(tmp_path):
    # schedules.py get_schedule_table: groups of N micro-batches a virtual stage (default pp)
    job = read(tmp_path, INTERLEAVED + "--microbatch-group-size-per-virtual-pipeline-stage 4")
    assert job.plan["schedule"] == "interleaved" and not job.unknown
    with pytest.raises(PlanError, match="--microbatch-group-size-per-virtual-pipeline-stage 5: "
                                        ".*not modelled.*groups of pp \\(4\\).*give 4"):
        read(tmp_path, INTERLEAVED + "--microbatch-group-size-per-virtual-pipeline-stage 5")
    job = read(tmp_path, BASE + "--microbatch-group-size-per-virtual-pipeline-stage 5")
    assert "no effect without the interleaved schedule" in line(
        job, "--microbatch-group-size-per-virtual-pipeline-stage")


def test_interleaved_micro_batches_refusal_names_the_config_settings(tmp_path):
    # the probe's *tunable_overlap* without its group size: 40 / (2 x 4) = 5 micro-batches over
    # pp 4, which Megatron-Core's default groups of pp refuse as well (schedules.py)
    text = INTERLEAVED.replace("--global-batch-size 8", "--global-batch-size 40").replace(
        "--micro-batch-size 1", "--micro-batch-size 4")
    with pytest.raises(PlanError, match="micro-batches \\(5\\) to be a multiple of pp \\(4\\).* "
                                        "multiple of dp x micro_batch x pp = 32.*"
                                        "--global-batch-size and --micro-batch-size"):
        plan(tmp_path, text)


def test_distributed_optimizer_instances(tmp_path):
    job = read(tmp_path, BASE + "--use-distributed-optimizer "
                                "--num-distributed-optimizer-instances 1")
    assert job.plan["zero"] == 1 and not job.unknown
    with pytest.raises(PlanError, match="--num-distributed-optimizer-instances 2: .*not "
                                        "modelled.*give 1"):
        read(tmp_path, BASE + "--use-distributed-optimizer "
                              "--num-distributed-optimizer-instances 2")


# --- 4. multi-head latent attention's biases -----------------------------------------------------


def test_mla_with_megatrons_default_biases_has_no_qkv_bias(tmp_path):
    # multi_latent_attention.py: the q/kv projections bias=False; linear_proj add_bias_linear
    job, model, _ = plan(tmp_path, BASE + MLA)
    assert job.model["bias"] is True and job.model["qkv_bias"] is False
    assert model.bias and not model.qkv_bias
    job = read(tmp_path, BASE + MLA + "--disable-bias-linear --add-qkv-bias")
    assert job.model["qkv_bias"] is False
    assert "no effect under --multi-latent-attention" in line(job, "--add-qkv-bias")
    # written back as Megatron-LM arguments (no --disable-bias-linear: the default biases)
    _, model, built = plan(tmp_path, BASE + MLA)
    words = [w for group in megatron_arguments(model, built) for w in group]
    assert "--multi-latent-attention" in words and "--disable-bias-linear" not in words


# --- 5. real Megatron-LM options are no misspellings ---------------------------------------------


def test_real_options_are_not_typos(tmp_path):
    assert {"tp-comm-overlap-cfg", "fp4-param-gather", "checkpoint-activations", "DDP-impl",
            "hybrid-layer-pattern", "no-rope-fusion", "top_k"} <= MEGATRON_LM_OPTIONS
    job = read(tmp_path, BASE + "--tensor-model-parallel-size 2 --sequence-parallel "
                                "--tp-comm-overlap --tp-comm-overlap-cfg ${UB_CFG}")
    assert job.plan["tp_comm_overlap"] is True and not job.unknown
    assert "the file not read" in line(job, "--tp-comm-overlap-cfg")
    # a real option perfmodel does not read: named as not read
    job = read(tmp_path, BASE + "--disable-tp-comm-bulk-dgrad")
    assert [s.key for s in job.unknown] == ["--disable-tp-comm-bulk-dgrad"]
    # --fp4-param-gather without --fp4-format: Megatron-LM raises
    with pytest.raises(PlanError, match="--fp4-param-gather: Megatron-LM raises"):
        read(tmp_path, BASE + "--fp4-param-gather")
    # a misspelling of an option perfmodel reads is still refused
    with pytest.raises(SpecError, match="likely misspelling"):
        read(tmp_path, BASE + "--tensor-model-paralel-size 2")


# --- 7. NeMo 1's refusals in NeMo 1's names ------------------------------------------------------


def _nemo1(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((DATA / "nemo1_nemotron4_15b.yaml").read_text())
    for key, value in changes.items():
        section, name = key.split("__")
        (data["trainer"] if section == "trainer" else data["model"][section]
         if section != "model" else data["model"])[name] = value
    path = tmp_path / "nemo1.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_nemo1_refusals_name_nemo1_settings(tmp_path):
    path = _nemo1(tmp_path, trainer__precision="16-mixed", optim__grad_sync_dtype="bf16")
    with pytest.raises(PlanError, match="model.optim.grad_sync_dtype: a bf16 gradient buffer "
                                        "needs bf16 precision \\(trainer.precision 16-mixed"):
        read_config(path)
    job = read_config(_nemo1(tmp_path))
    with pytest.raises(SpecError, match="model.tokenizer.library sentencepiece .*give --model"):
        resolve_model(job, None, None)
