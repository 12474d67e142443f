"""A job's own config in (perfmodel.configs readers), a launchable config out (emit), and the
round trip between them. Test data: tests/data/configs/, each file naming its source."""

from __future__ import annotations

import functools
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from perfmodel import Plan, load_hardware
from perfmodel import predict as _predict
from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.deepspeed import ds_config
from perfmodel.configs.megatron import READ_OPTIONS, megatron_arguments, padded_vocab
from perfmodel.configs.shell import launch_command
from perfmodel.configs.torchtitan import (
    QWEN3_PRESETS,
    SECTIONS,
    ffn_width,
    flavor_model,
    qwen3_model,
    torchtitan_toml,
)
from perfmodel.errors import PlanError, SpecError
from perfmodel.predict import comm_ledger, parameter_count
from perfmodel.specs.model import load_model
from perfmodel.strategy import plan_from_dict
from tests.unit.test_json_schemas import check

# these tests predict plans as they stand (generated, or read from configs), options that
# change nothing included: perfmodel.predict refuses those by default (refuse_idle)
predict = functools.partial(_predict, refuse_idle=False)

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
ARCHITECTURE = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
                "gated_mlp", "tied_embeddings", "bias", "qkv_bias", "norm",
                "position_embedding")


def job_plan(name, model=None, seq_len=None, **given):
    job = read_config(DATA / name)
    spec = resolve_model(job, model, seq_len)
    spec, plan = resolve_plan(job, spec, given)
    return job, spec, plan


def architecture(spec):
    return {k: getattr(spec, k) for k in ARCHITECTURE}


# --- Megatron-LM ----------------------------------------------------------------------------


def test_megatron_gpt3_script_reads_torchrun_world_and_layout():
    # examples/gpt3/train_gpt3_175b_distributed.sh with 16 nodes: 16 x 8 GPUs, tp 8 x pp 16
    job, spec, plan = job_plan("megatron_gpt3_175b.sh", model="gpt3-175b")
    assert job.gpus == 128
    assert (plan["tp"], plan["pp"], plan["dp"]) == (8, 16, 1)
    assert (plan["micro_batch"], plan["global_batch"]) == (1, 1536)
    assert plan["dtype"] == "fp16" and "flash_attention" not in plan  # auto: the hardware's
    assert plan["zero"] == 0 and plan["recompute"] == "none"
    # the arguments agree with the preset (Brown et al. 2020, Table 2.1): the config's fields
    # were checked against it, and the vocabulary is the preset's (the script has a vocab file)
    assert architecture(spec) == architecture(load_model("gpt3-175b"))
    assert "--data-path" in {s.key for s in job.ignored}  # its value is the script's $5


def test_megatron_script_without_model_needs_the_vocabulary():
    with pytest.raises(SpecError, match="give --model"):
        job_plan("megatron_gpt3_175b.sh")


def test_megatron_llama3_args_are_the_llama3_8b_architecture():
    # Llama 3 8B (Meta 2024, Table 3; the llama3-8b preset) from Megatron-LM's example arguments
    job, spec, plan = job_plan("megatron_llama3_8b.txt", gpus=8)
    assert architecture(spec) == architecture(load_model("llama3-8b"))
    assert spec.seq_len == 8192
    assert (plan["tp"], plan["dp"], plan["sequence_parallel"]) == (2, 4, True)
    assert (plan["zero"], plan["overlap_grad_sync"], plan["dtype"]) == (1, True, "bf16")
    assert plan["flash_attention"] is True  # --attention-backend fused
    assert job.pins >= {"tp", "micro_batch", "zero", "sequence_parallel"}
    assert "pp" not in job.pins  # not stated: recommend searches it


def write(tmp_path, text, name="args.txt"):
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = ("--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 "
        "--max-position-embeddings 512 --vocab-size 1000 --micro-batch-size 2 --bf16 ")


def test_megatron_defaults_ffn_and_padding(tmp_path):
    # --swiglu without --ffn-hidden-size: int(4 h 2/3 / 64) 64 = int(682.67 / 64) 64 = 640;
    # --vocab-size 1000 padded to a multiple of 128 x tp 2 = 256: 1024 (arguments.py,
    # build_tokenizer.py's vocab_size_with_padding)
    job = read_config(write(tmp_path, BASE + "--swiglu --tensor-model-parallel-size 2"))
    spec = resolve_model(job, None, None)
    spec, plan = resolve_plan(job, spec, {"gpus": 4})
    assert spec.ffn_hidden == 640 and spec.vocab == 1024
    assert plan["global_batch"] == 2 * 2  # Megatron's default: micro-batch x dp
    assert padded_vocab(50257, 128, 8) == 51200  # GPT-2's vocabulary at tp 8 (1024 x 50)


def test_megatron_fp8_is_read(tmp_path):
    """Megatron-LM's --fp8-format with --bf16 is dtype fp8 (docs/fp8.md): --fp8-recipe tensorwise
    is TE's current scaling, the default delayed; --fp8-param-gather holds the weights in FP8.
    Written back by --emit-config as Megatron-LM takes it."""
    job = read_config(write(tmp_path, BASE + "--fp8-format hybrid --fp8-recipe tensorwise "
                                             "--fp8-param-gather --use-distributed-optimizer"))
    assert (job.plan["dtype"], job.plan["fp8_recipe"], job.plan["fp8_params"]) == \
        ("fp8", "current", True)
    plain = read_config(write(tmp_path, BASE + "--fp8-format e4m3", "plain.txt"))
    assert (plain.plan["dtype"], plain.plan["fp8_recipe"]) == ("fp8", "delayed")
    assert "fp8_params" not in plain.plan
    with pytest.raises(PlanError, match="--fp8-recipe.*blockwise"):
        read_config(write(tmp_path, BASE + "--fp8-format hybrid --fp8-recipe blockwise", "b.txt"))
    with pytest.raises(PlanError, match="over bf16 mixed precision, not fp16"):
        read_config(write(tmp_path, BASE.replace("--bf16", "--fp16") + "--fp8-format hybrid",
                          "f.txt"))
    from perfmodel.configs.megatron import megatron_arguments
    from perfmodel.strategy import Plan

    plan = Plan(gpus=8, dp=8, global_batch=8, zero=1, dtype="fp8", fp8_recipe="current",
                fp8_params=True)
    args = megatron_arguments(load_model("llama3-8b"), plan)
    assert [["--bf16"], ["--fp8-format", "hybrid"], ["--fp8-recipe", "tensorwise"],
            ["--fp8-param-gather"]] == [a for a in args if a[0].startswith(("--bf16", "--fp8"))]


@pytest.mark.parametrize("extra, field", [
    ("--fp4-format e2m1", "--fp4-format"),
    ("--context-parallel-size 2 --cp-comm-type a2a+p2p", "--cp-comm-type"),
    # issue 17: an expert-tensor-parallel degree that does not divide tp (perfmodel takes etp
    # out of the tp ranks); the default, tp, is read (test_megatron_expert_tensor_parallelism...)
    ("--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall "
     "--tensor-model-parallel-size 2 --expert-tensor-parallel-size 4",
     "--expert-tensor-parallel-size"),
    # Megatron-LM's default dispatcher all-gathers the tokens: perfmodel models the all-to-all
    ("--num-experts 8 --moe-router-topk 2", "--moe-token-dispatcher-type"),
    ("--overlap-param-gather", "--overlap-param-gather"),  # needs the distributed optimizer
    ("--pipeline-model-parallel-layout Et*2|t*2L", "--pipeline-model-parallel-layout"),
    ("--recompute-granularity full", "--recompute-granularity"),
    ("--recompute-granularity full --recompute-method block", "--recompute-method block"),
    # Megatron's methods work on each chunk; uneven stages are refused naming the config
    ("--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1 "
     "--recompute-granularity full --recompute-method block --recompute-num-layers 1",
     "args.txt: --recompute-method block: Megatron.s recompute methods"),
    ("--optimizer-cpu-offload", "--optimizer-cpu-offload"),
])
def test_megatron_refuses_what_is_not_modelled(tmp_path, extra, field):
    with pytest.raises(PlanError, match=field):
        read_config(write(tmp_path, BASE + extra))


def test_megatron_overlaps_and_uneven_stages_are_plan_options(tmp_path):
    # --tp-comm-overlap (userbuffers), the distributed optimizer's two overlaps, each its own,
    # and Megatron-LM's --decoder-first/last-pipeline-num-layers (arguments.py)
    job = read_config(write(tmp_path, BASE + "--tensor-model-parallel-size 2 --sequence-parallel "
                                             "--tp-comm-overlap --use-distributed-optimizer "
                                             "--overlap-grad-reduce "
                                             "--pipeline-model-parallel-size 2 "
                                             "--decoder-first-pipeline-num-layers 1"))
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert (plan["tp_comm_overlap"], plan["overlap_grad_sync"], plan["overlap_param_gather"]) \
        == (True, True, False)
    assert (plan["first_stage_layers"], plan.get("last_stage_layers", 0)) == (1, 0)
    made = plan_from_dict(plan).check(spec)  # 1 layer first, 3 last: the plan rules take it
    args = [a for group in megatron_arguments(spec, made) for a in group]
    assert "--tp-comm-overlap" in args and "--overlap-param-gather" not in args
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "1"
    with pytest.raises(PlanError, match="tp_comm_overlap needs sequence_parallel"):
        plan_from_dict({**plan, "sequence_parallel": False})


def test_megatron_context_and_expert_parallelism_are_read_into_the_plan(tmp_path):
    """issue 17: --context-parallel-size, --cp-comm-type and --expert-model-parallel-size become
    the plan's cp, cp_comm and ep (dp what the world leaves of tp x pp x cp, ep carved out of
    dp x cp); experts whole on each rank: --expert-tensor-parallel-size 1."""
    text = BASE + ("--context-parallel-size 2 --cp-comm-type all_gather --num-experts 8 "
                   "--moe-router-topk 2 --moe-token-dispatcher-type alltoall "
                   "--expert-model-parallel-size 4 "
                   "--expert-tensor-parallel-size 1")
    job = read_config(write(tmp_path, text))
    spec = resolve_model(job, None, None)
    spec, plan = resolve_plan(job, spec, {"gpus": 8})
    assert (plan["cp"], plan["cp_comm"], plan["ep"], plan["dp"]) == (2, "allgather", 4, 4)
    assert {"cp", "cp_comm", "ep"} <= job.pins
    assert spec.experts == 8


def test_megatron_expert_tensor_parallelism_is_read_into_the_plan(tmp_path):
    """issue 17: --expert-tensor-parallel-size becomes the plan's etp; Megatron-LM defaults it to
    --tensor-model-parallel-size (megatron/training/arguments.py at d98e8a6: "if
    args.expert_tensor_parallel_size is None: args.expert_tensor_parallel_size =
    args.tensor_model_parallel_size")."""
    # (without biases: Megatron-Core allows a bias in MoE only with etp 1)
    moe = BASE + "--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall " \
        "--tensor-model-parallel-size 2 --sequence-parallel --disable-bias-linear "
    for extra, etp, pinned in (("", 2, False), ("--expert-tensor-parallel-size 1", 1, True)):
        job = read_config(write(tmp_path, moe + extra))
        spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
        assert (plan["tp"], plan["etp"]) == (2, etp)
        assert ("etp" in job.pins) is pinned
        assert plan_from_dict(plan).check(spec).etp == etp


def test_megatron_unknown_option_is_named_and_a_misspelling_refused(tmp_path):
    job = read_config(write(tmp_path, BASE + "--my-custom-flag 3"))
    assert [(s.key, s.value) for s in job.unknown] == [("--my-custom-flag", "3")]
    with pytest.raises(SpecError, match="did you mean 'num-layers'"):
        read_config(DATA / "megatron_typo.txt")


def test_megatron_options_that_cost_unmodelled_are_said_not_ignored(tmp_path):
    """--deterministic-mode, --log-params-norm, --log-num-zeros-in-grad and
    --empty-unused-memory-level cost time every step (megatron/training/training.py): a note says
    they are not modelled, never that they leave the step as it is."""
    job = read_config(write(tmp_path, BASE + "--deterministic-mode --log-params-norm "
                            "--log-num-zeros-in-grad --empty-unused-memory-level 1 "
                            "--log-interval 10"))
    ignored = {s.key for s in job.ignored}
    assert "--log-interval" in ignored
    for option in ("--deterministic-mode", "--log-params-norm", "--log-num-zeros-in-grad",
                   "--empty-unused-memory-level"):
        assert option not in ignored
        assert any(n.startswith(option) and n.endswith("not modelled") for n in job.notes)
    job = read_config(write(tmp_path, BASE + "--empty-unused-memory-level 0", "zero.txt"))
    assert "--empty-unused-memory-level" in {s.key for s in job.ignored}


def test_megatron_full_recompute_uniform_one_layer(tmp_path):
    job = read_config(write(tmp_path, BASE + "--recompute-granularity full "
                                             "--recompute-method uniform --recompute-num-layers 1"))
    assert job.plan["recompute"] == "full"


def test_megatron_world_needs_gpus_for_an_argument_file(tmp_path):
    job = read_config(write(tmp_path, BASE))
    with pytest.raises(PlanError, match="give --gpus"):
        resolve_plan(job, resolve_model(job, None, None), {})


# --- the shell subset -------------------------------------------------------------------------


def test_shell_expands_arrays_defaults_and_arithmetic():
    script = """
N=2
PER=${GPUS_PER_NODE:-8}
ARGS=(
    --num-layers 4   # a comment (with parentheses)
    --hidden-size $((64 * N))
)
EXTRA="--bf16 --micro-batch-size ${MB:-3}"
torchrun --nnodes $N --nproc-per-node $PER pretrain_gpt.py \\
    ${ARGS[@]} $EXTRA --save $1
"""
    launch = launch_command(script, "s.sh", lambda w: w.endswith("pretrain_gpt.py"))
    assert launch.launcher == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8"]
    assert launch.args[:7] == ["--num-layers", "4", "--hidden-size", "128", "--bf16",
                               "--micro-batch-size", "3"]
    assert launch.reason(launch.args[-1]) == "$1: a script argument"


def test_shell_refuses_arguments_set_under_a_condition(tmp_path):
    script = """
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=("--fp8-format hybrid")
fi
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 ${DTYPE_ARGS[@]}
"""
    with pytest.raises(SpecError, match=r"DTYPE_ARGS.*if/for/while/case"):
        read_config(write(tmp_path, script, "run.sh"))


def test_shell_refuses_a_needed_value_from_the_environment(tmp_path):
    with pytest.raises(SpecError, match=r"--tensor-model-parallel-size \$TP.*environment"):
        read_config(write(tmp_path, "torchrun pretrain_gpt.py " + BASE +
                          "--tensor-model-parallel-size $TP", "run.sh"))


# --- torchtitan -------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor, preset, ffn", [("8B", "llama3-8b", 14336),
                                                 ("70B", "llama3-70b", 28672),
                                                 ("405B", "llama3-405b", 53248)])
def test_torchtitan_flavors_are_the_llama3_presets(flavor, preset, ffn):
    # torchtitan/models/llama3/__init__.py llama3_args (dim, n_layers, n_heads, n_kv_heads,
    # ffn_dim_multiplier, multiple_of) against the Llama 3 Herd of Models, Table 3
    fields = flavor_model(flavor)
    assert fields["ffn_hidden"] == ffn
    spec = load_model(preset)
    assert {k: getattr(spec, k) for k in fields} == fields


def test_torchtitan_ffn_width_by_hand():
    # 8B: int(2 x 16384 / 3) = 10922; int(1.3 x 10922) = 14198; up to a multiple of 1024: 14336
    assert ffn_width(4096, 1.3, 1024) == 14336


def test_torchtitan_70b_toml_on_64_gpus():
    job, spec, plan = job_plan("torchtitan_llama3_70b.toml", gpus=64)
    assert (plan["dp"], plan["tp"], plan["pp"]) == (8, 8, 1)  # data_parallel_shard_degree -1
    assert (plan["zero"], plan["dtype"], plan["recompute"]) == (3, "bf16", "full")
    assert (plan["micro_batch"], plan["global_batch"]) == (8, 64)
    assert plan["sequence_parallel"] is True and plan["overlap_grad_sync"] is True
    assert architecture(spec) == architecture(load_model("llama3-70b"))


def test_torchtitan_per_op_and_layer_checkpointing(tmp_path):
    job, spec, plan = job_plan("torchtitan_llama3_8b.toml", gpus=8)  # selective_ac_option "op"
    assert (plan["recompute"], plan.get("recompute_every", 1)) == ("op", 1)
    data = tomllib.loads((DATA / "torchtitan_llama3_8b.toml").read_text())
    data["activation_checkpoint"]["selective_ac_option"] = "2"  # every 2nd block wrapped whole
    job = read_config(write(tmp_path, json.dumps(data), name="every2.json"))
    assert (job.plan["recompute"], job.plan["recompute_every"]) == ("full", 2)


def test_megatron_block_recompute_and_bf16_gradients(tmp_path):
    job = read_config(write(tmp_path, BASE + "--recompute-granularity full --recompute-method "
                                             "block --recompute-num-layers 2 "
                                             "--grad-reduce-in-bf16"))
    # Megatron's block method: the first 2 of each chunk's layers recomputed whole
    assert (job.plan["recompute"], job.plan["recompute_method"],
            job.plan["recompute_num_layers"]) == ("full", "block", 2)
    assert job.plan["grad_dtype"] == "bf16"
    # uniform in groups of 3 (4 layers a stage: groups of 3 and 1)
    job = read_config(write(tmp_path, BASE + "--recompute-granularity full --recompute-method "
                                             "uniform --recompute-num-layers 3", "u.txt"))
    assert (job.plan["recompute_method"], job.plan["recompute_num_layers"]) == ("uniform", 3)
    with pytest.raises(PlanError, match="--grad-reduce-in-bf16.*needs --bf16"):
        read_config(write(tmp_path, BASE.replace("--bf16 ", "") + "--grad-reduce-in-bf16"))


def test_torchtitan_json_dump_with_interleaved_pipeline():
    job, spec, plan = job_plan("torchtitan_llama3_8b_pp.json", gpus=16)
    # 32 layers / 4 per stage = 8 stages over pp 2: 4 per rank; 16 GPUs / pp 2 = dp 8 (FSDP)
    assert (plan["pp"], plan["virtual_stages"], plan["schedule"]) == (2, 4, "interleaved")
    assert (plan["dp"], plan["zero"], plan["micro_batch"], plan["global_batch"]) == (8, 3, 1, 64)
    # local batch 8 / micro-batch 1
    assert plan_from_dict({**plan, "zero": 1}).num_micro_batches == 8
    # FSDP over 4 stages a rank: torch keeps 3 gathered and gathers the others again, 8
    # micro-batches in 4 rounds of pp: 2 x 1 x 4 + 3 + 2 x 2 = 15 gathers of rank 0's 4 stages
    # (perfmodel.step.data_parallel.schedule_gathers), 4 layers each
    ledger = {r["name"]: r["calls"] for r in comm_ledger(spec, plan_from_dict(plan),
                                                         load_hardware("dgx-h100"))}
    assert ledger["dp/fsdp_layer/all_gather_once"] == 16
    assert ledger["dp/fsdp_layer/all_gather_again"] == (15 - 4) * 4


def test_torchtitan_uneven_stages_and_tp_without_fsdp(tmp_path):
    data = tomllib.loads((DATA / "torchtitan_llama3_70b.toml").read_text())
    data["parallelism"].update(pipeline_parallel_degree=2)
    path = tmp_path / "pp.json"
    path.write_text(json.dumps(data))
    # torchtitan's generate_llm_fqn_per_model_part: (80 layers + 1 + 1 left out) // 2 stages
    # = 41 each, the first and the last one short (first/last_stage_less_layers default 1)
    _, _, plan = job_plan(path, gpus=16)
    assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (40, 40)
    # several stages per rank: only the model's end chunks are short, written as a layout
    # (stages 0 and 2 on rank 0): 82 // 4 = 20, 2 left over to stages 0 and 1
    data["parallelism"].update(pipeline_parallel_schedule="Interleaved1F1B")
    path.write_text(json.dumps(data))
    _, _, plan = job_plan(path, gpus=16)
    assert plan["virtual_stages"] == 2
    assert plan["pipeline_layout"] == "E" + "t" * 20 + "|" + "t" * 21 + "|" + "t" * 20 + "|" \
        + "t" * 19 + "L"
    # pp 4 with one stage a rank: 82 // 4 = 20, stages 0 and 1 one more: 20/21/20/19, the
    # ranks between unequal (each costed as 21, the slowest)
    data["parallelism"].update(pipeline_parallel_degree=4, pipeline_parallel_schedule="1F1B",
                               data_parallel_shard_degree=-1)
    path.write_text(json.dumps(data))
    job, spec, plan = job_plan(path, gpus=64)
    assert plan["pipeline_layout"] == "E" + "|".join("t" * n for n in (20, 21, 20, 19)) + "L"
    assert Plan(**plan).layout.middle_layers == 21
    assert predict(spec, "dgx-h100", Plan(**plan)).step_time_s > 0
    data["parallelism"].update(pipeline_parallel_degree=1, data_parallel_shard_degree=1)
    path.write_text(json.dumps(data))
    job, _, plan = job_plan(path, gpus=8)
    assert plan["zero"] == 0 and plan["dtype"] == "fp32"  # no FSDP: training.dtype float32


# --- DeepSpeed --------------------------------------------------------------------------------


def test_deepspeed_zero3_beside_a_model():
    job, spec, plan = job_plan("deepspeed_zero3.json", model="llama3-8b", seq_len=4096)
    assert job.gpus == 512 // (4 * 8)
    assert (plan["zero"], plan["overlap_grad_sync"], plan["dtype"]) == (3, True, "bf16")
    assert (plan["micro_batch"], plan["global_batch"], plan["dp"]) == (4, 512, 16)
    # ZeRO 3's release rule (reuse distance) is named, not taken for bucket sizes
    assert any("stage3_max_reuse_distance elements" in n for n in job.notes)
    assert any(s.key == "zero_optimization.stage3_max_reuse_distance"
               and "keeps" in s.note for s in job.ignored)
    with pytest.raises(SpecError, match="give --model"):
        job_plan("deepspeed_zero3.json")


def test_deepspeed_offload_and_auto():
    with pytest.raises(PlanError, match="offload_optimizer.device cpu"):
        read_config(DATA / "deepspeed_offload.json")
    with pytest.raises(PlanError, match="give --dtype"):
        job_plan("deepspeed_auto.json", model="llama3-8b", gpus=8)
    with pytest.raises(PlanError, match="train_micro_batch_size_per_gpu 'auto'"):
        job_plan("deepspeed_auto.json", model="llama3-8b", gpus=8, dtype="bf16")
    _, _, plan = job_plan("deepspeed_auto.json", model="llama3-8b", gpus=8, dtype="bf16",
                          micro_batch=2, global_batch=32)
    assert (plan["zero"], plan["overlap_grad_sync"], plan["dp"]) == (2, True, 8)


@pytest.mark.parametrize("batch, expected", [
    # DeepSpeedConfig._set_batch_related_parameters (deepspeed/runtime/config.py): the batch
    # alone is one micro-batch of batch / dp a step; the micro-batch alone one a step; two of
    # the three give the third
    ({"train_batch_size": 256}, (16, 256)),
    ({"train_micro_batch_size_per_gpu": 2}, (2, 32)),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, (2, 128)),
    ({"train_batch_size": 256, "gradient_accumulation_steps": 4}, (4, 256)),
    ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2}, (2, 256)),
])
def test_deepspeed_batch_as_deepspeed_completes_it(tmp_path, batch, expected):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**batch, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2}}))
    _, _, plan = job_plan(path, model="llama3-8b", gpus=16)
    assert (plan["micro_batch"], plan["global_batch"]) == expected


@pytest.mark.parametrize("batch, error, match", [
    ({"gradient_accumulation_steps": 4}, PlanError, "only gradient_accumulation_steps 4"),
    ({}, PlanError, "neither train_batch_size nor train_micro_batch_size_per_gpu"),
    ({"train_batch_size": 250}, SpecError, r"15 x 1 x 16 = 240"),
    ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 3}, SpecError, "DeepSpeed"),
])
def test_deepspeed_refuses_a_batch_deepspeed_refuses(tmp_path, batch, error, match):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**batch, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2}}))
    with pytest.raises(error, match=match):
        job_plan(path, model="llama3-8b", gpus=16)
    if not batch or list(batch) == ["gradient_accumulation_steps"]:  # the command line gives it
        _, _, plan = job_plan(path, model="llama3-8b", gpus=16, micro_batch=2)
        assert plan["global_batch"] == 2 * batch.get("gradient_accumulation_steps", 1) * 16


@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_refuses_zero_1_2_gradients_all_reduced(tmp_path, stage):
    """reduce_scatter false makes ZeRO 1-2 all-reduce each gradient bucket (stage_1_and_2.py,
    average_tensor): not a bucket option, and not modelled; ZeRO 3 reduce-scatters whatever."""
    path = tmp_path / "ds.json"
    config = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
              "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage, "reduce_scatter": False}}
    path.write_text(json.dumps(config))
    with pytest.raises(PlanError, match="zero_optimization.reduce_scatter"):
        read_config(path)
    config["zero_optimization"]["stage"] = 3
    path.write_text(json.dumps(config))
    assert read_config(path).plan["zero"] == 3


# --- Megatron-Bridge / NeMo 2 -----------------------------------------------------------------


def test_bridge_container_yaml():
    job, spec, plan = job_plan("bridge_llama3_8b.yaml", gpus=16)
    assert architecture(spec) == architecture(load_model("llama3-8b"))
    assert (plan["tp"], plan["dp"], plan["sequence_parallel"], plan["zero"]) == (2, 8, True, 1)
    assert (plan["overlap_grad_sync"], plan["dtype"], plan["global_batch"]) == (True, "bf16", 512)


def test_nemo2_recipe_yaml_names_a_preset():
    job, spec, plan = job_plan("nemo2_llama3_8b.yaml")
    assert job.gpus == 16 and job.preset == "llama3-8b"
    assert architecture(spec) == architecture(load_model("llama3-8b"))
    assert (plan["dp"], plan["micro_batch"], plan["global_batch"], plan["zero"]) == \
        (16, 1, 512, 1)


def test_nemo_context_parallel_is_read_into_the_plan(tmp_path):
    """issue 17: cp (and its cp_comm_type) are read; dp is what the world leaves of tp x pp x cp.
    Megatron's hierarchical a2a+p2p is refused, not costed as another."""
    text = (DATA / "bridge_llama3_8b.yaml").read_text().replace(
        "  context_parallel_size: 1", "  context_parallel_size: 2\n  cp_comm_type: a2a")
    job, _, plan = job_plan(write(tmp_path, text, "cp.yaml"), gpus=16)
    assert (plan["cp"], plan["cp_comm"], plan["dp"] * plan["cp"] * plan["tp"] * plan["pp"]) \
        == (2, "a2a", 16)
    hierarchical = text.replace("cp_comm_type: a2a", "cp_comm_type: a2a+p2p")
    with pytest.raises(PlanError, match="cp_comm_type a2a\\+p2p is not modelled"):
        read_config(write(tmp_path, hierarchical, "cp2.yaml"))


def test_bridge_mixture_of_experts_is_read_with_its_dispatcher_and_dense_layers(tmp_path):
    """A Megatron-Bridge model with experts: its dense layers (moe_layer_freq, a YAML list) and
    the all-to-all dispatcher are read; TransformerConfig's default dispatcher, allgather, is
    refused rather than costed as the all-to-all."""
    moe = (DATA / "bridge_llama3_8b.yaml").read_text().replace(
        "  num_moe_experts: null", "  num_moe_experts: 8\n  moe_router_topk: 2\n"
                                  "  moe_ffn_hidden_size: 7168\n"
                                  "  moe_layer_freq: [0, 0, " + "1, " * 29 + "1]")
    text = moe.replace("  moe_router_topk: 2", "  moe_router_topk: 2\n"
                                              "  moe_token_dispatcher_type: alltoall")
    _, spec, _ = job_plan(write(tmp_path, text, "moe.yaml"), gpus=16)
    assert (spec.experts, spec.top_k, spec.expert_ffn_hidden) == (8, 2, 7168)
    assert (spec.moe_first_dense, spec.moe_dense_layers) == (2, ())
    with pytest.raises(PlanError, match="moe_token_dispatcher_type.*alltoall"):
        read_config(write(tmp_path, moe, "moe2.yaml"))


# --- malformed files --------------------------------------------------------------------------


@pytest.mark.parametrize("name, text", [("bad.toml", "[training]\nseq_len = \n"),
                                        ("bad.json", '{"train_batch_size": 8,'),
                                        ("bad.yaml", "- a list\n- not a mapping\n"),
                                        ("other.json", '{"hello": 1}')])
def test_malformed_configs_are_one_line_spec_errors(tmp_path, name, text):
    with pytest.raises(SpecError) as err:
        read_config(write(tmp_path, text, name))
    assert "\n" not in str(err.value)


# --- writing ----------------------------------------------------------------------------------


def plan(**kw):
    base = dict(gpus=16, dp=8, tp=2, pp=1, micro_batch=1, global_batch=64, dtype="bf16",
                zero=1, flash_attention=True, sequence_parallel=True)
    return plan_from_dict({**base, **kw})


def test_emitted_names_are_the_frameworks():
    """Every Megatron option written is one the reader reads (Megatron-LM's arguments.py names);
    every torchtitan key is a field of its JobConfig; every DeepSpeed key one it documents."""
    model = load_model("llama3-8b")
    for group in megatron_arguments(model, plan()):
        assert group[0][2:] in READ_OPTIONS, group
    data = tomllib.loads(torchtitan_toml(model, plan(zero=3, tp=1, dp=16,
                                                     sequence_parallel=False,
                                                     overlap_grad_sync=True,
                                                     overlap_param_gather=True,
                                                     kernels="eager")))
    for section, fields in data.items():
        assert set(fields) <= set(SECTIONS[section]), section
    config = ds_config(plan(tp=1, dp=16, sequence_parallel=False, zero=3,
                            overlap_param_gather=True))
    assert set(config) <= {"train_batch_size", "train_micro_batch_size_per_gpu",
                           "gradient_accumulation_steps", "bf16", "fp16", "zero_optimization",
                           "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
                           "communication_data_type", "data_types"}


@pytest.mark.parametrize("emit, kw, field", [
    ("megatron", dict(schedule="zb", pp=2, dp=4, global_batch=64), "schedule zb"),
    ("megatron", dict(zero=2), "zero 2"),
    ("torchtitan", dict(zero=1), "zero 1"),
    ("deepspeed", dict(), "tp 2"),
])
def test_emit_refuses_what_the_framework_cannot_run(emit, kw, field):
    model = load_model("llama3-8b")
    write_fn = {"megatron": lambda p: megatron_arguments(model, p),
                "torchtitan": lambda p: torchtitan_toml(model, p),
                "deepspeed": ds_config}[emit]
    with pytest.raises(PlanError, match=field):
        write_fn(plan(**kw))


# --- the command line -------------------------------------------------------------------------


def test_cli_predict_from_config_prints_what_it_read(run_cli):
    res = run_cli("predict", "--from-config", DATA / "megatron_llama3_8b.txt", "--hardware",
                  "dgx-h100", "--gpus", "8", "--json")
    assert res.returncode == 0, res.stderr
    assert "read megatron config" in res.stderr and "--rotary-base" in res.stderr
    data = json.loads(res.stdout)
    assert data["config"]["framework"] == "megatron"
    assert data["plan"]["tp"] == 2


@pytest.mark.parametrize("args, code, text", [
    (["megatron_typo.txt"], 3, "did you mean"),
    (["deepspeed_offload.json", "--model", "llama3-8b"], 4, "offload_optimizer"),
    (["malformed.toml", "--gpus", "8"], 3, "not valid TOML"),
    (["megatron_llama3_8b.txt", "--gpus", "8", "--tp", "4"], 4, "contradicts the config's tp 2"),
    (["megatron_llama3_8b.txt"], 4, "give --gpus"),
])
def test_cli_bad_configs(run_cli, args, code, text):
    res = run_cli("predict", "--hardware", "dgx-h100", "--from-config", DATA / args[0],
                  *args[1:])
    assert res.returncode == code, res.stderr
    assert text in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr


def _read_back(run_cli, chosen: dict, config: Path, *extra: str) -> tuple[Any, dict]:
    """predict --from-config of an emitted config: the recommended plan, step and memory
    (1e-9); (the process, its JSON)."""
    back = run_cli("predict", "--hardware", "dgx-h100", "--from-config", config, *extra,
                   "--json")
    assert back.returncode == 0, back.stderr
    again = json.loads(back.stdout)
    assert again["plan"] == chosen["plan"]
    assert again["step_time_s"] == pytest.approx(chosen["step_time_s"], rel=1e-9)
    assert again["memory_per_gpu_bytes"] == pytest.approx(chosen["memory_per_gpu_bytes"],
                                                          rel=1e-9)
    return back, again


@pytest.mark.parametrize("fmt, pins, read", [
    ("megatron", [], ["launch.sh"]),
    ("torchtitan", ["--zero", "3", "--flash-attention", "--overlap-grad-sync", "--recompute",
                    "full"], ["job.toml", "--gpus", "16"]),
    ("deepspeed", ["--flash-attention", "--recompute", "full"],
     ["ds_config.json", "--model", "llama3-8b", "--recompute", "full"]),
    # the policies written as each framework spells them: Megatron's block method, torchtitan's
    # per-op save list and selective layer AC
    ("megatron", ["--recompute", "full", "--recompute-every", "2"], ["launch.sh"]),
    ("torchtitan", ["--recompute", "op"], ["job.toml", "--gpus", "16"]),
    ("torchtitan", ["--recompute", "full", "--recompute-every", "2"], ["job.toml", "--gpus", "16"]),
    # activation offloading: --cpu-offloading-num-layers (pp 1, no recompute)
    ("megatron", ["--cpu-offload-layers", "8"], ["launch.sh"]),
])
def test_round_trip_emit_then_read_back(run_cli, tmp_path, fmt, pins, read):
    """recommend --emit-config, read back with predict --from-config: the same step (1e-9)."""
    out = tmp_path / fmt
    out.mkdir()
    res = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16",
                  "--global-batch", "64", *pins, "--json", "--emit-config", fmt, out)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    chosen = rec["plans"][rec["emitted"]["plan_rank"] - 1]
    if fmt == "megatron" and chosen["plan"]["recompute_every"] > 1:
        # one layer in N is written as Megatron's block method, the first n / N layers of each
        # chunk (32 layers, pp 1: 16), which reads back as itself: the same step and memory
        chosen = {**chosen, "plan": {**chosen["plan"], "recompute_every": 1,
                                     "recompute_method": "block", "recompute_num_layers": 16}}
    back, again = _read_back(run_cli, chosen, out / read[0], *read[1:])
    check(res.stdout, "recommend")  # the published schemas hold "emitted" and "config""
    check(back.stdout, "predict")
    assert rec["emitted"]["format"] == fmt and again["config"]["framework"] == fmt


@pytest.mark.parametrize("model, gpus, pins", [
    # every layer a mixture of 8 experts: the search picks ep (and cp) and Megatron-LM's
    # arguments carry them
    ("mixtral-8x7b", "64", ["--seq-len", "4096"]),
    # a dense first layer (--moe-layer-freq), two shared experts (Megatron-LM's one MLP as wide
    # as both), context parallelism pinned
    ("moe.yaml", "16", ["--seq-len", "8192", "--cp", "2"]),
    # DeepSeek-V3: multi-head latent attention, a multi-token-prediction module, 3 dense layers
    ("deepseek-v3", "256", ["--seq-len", "4096", "--global-batch", "512"]),
])
def test_round_trip_of_a_mixture_of_experts_through_megatron(run_cli, tmp_path, model, gpus,
                                                             pins):
    """recommend --emit-config megatron of a mixture of experts (issue 17), read back with
    predict --from-config: the same plan, step and memory (1e-9)."""
    if model.endswith(".yaml"):
        spec = tmp_path / model
        spec.write_text("name: moe\nlayers: 8\nhidden: 2048\nheads: 16\nkv_heads: 4\n"
                        "seq_len: 8192\nvocab: 32000\nffn_hidden: 5632\ngated_mlp: true\n"
                        "bias: false\nnorm: rmsnorm\ntied_embeddings: false\nexperts: 16\n"
                        "position_embedding: rotary\n"
                        "top_k: 4\nexpert_ffn_hidden: 1408\nshared_experts: 2\n"
                        "shared_expert_ffn_hidden: 1408\nmoe_first_dense: 1\n")
        model = str(spec)
    out = tmp_path / "megatron"
    out.mkdir()
    pins = pins if "--global-batch" in pins else [*pins, "--global-batch", "64"]
    res = run_cli("recommend", "--model", model, "--hardware", "dgx-h100", "--gpus", gpus,
                  *pins, "--json", "--emit-config", "megatron", out)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    chosen = rec["plans"][rec["emitted"]["plan_rank"] - 1]
    text = (out / "megatron_args.txt").read_text()
    assert "--num-experts" in text and "--moe-token-dispatcher-type alltoall" in text
    assert f"--expert-model-parallel-size {chosen['plan']['ep']}" in text
    _, again = _read_back(run_cli, chosen, out / "launch.sh")
    assert again["parameters"] == pytest.approx(rec["parameters"], rel=1e-12)


def test_megatron_reads_latent_attention_with_its_defaults(tmp_path):
    # --multi-latent-attention with --kv-lora-rank only: the head sizes Megatron-LM's defaults
    # (arguments.py: qk 128, rotary 64, v 128; queries uncompressed), said in the notes
    job = read_config(write(tmp_path, BASE + "--disable-bias-linear --multi-latent-attention "
                                             "--kv-lora-rank 64 "
                                             "--mtp-num-layers 1"))
    spec = resolve_model(job, None, None)
    assert (spec.kv_lora_rank, spec.q_lora_rank, spec.qk_nope_head_dim, spec.qk_rope_head_dim,
            spec.v_head_dim, spec.mtp_layers) == (64, None, 128, 64, 128, 1)
    assert "qk_nope_head_dim 128: Megatron-LM's default for --qk-head-dim" in job.notes


def test_megatron_reads_which_layers_are_dense(tmp_path):
    # --moe-layer-freq as Megatron-LM's recipes write it, and as N (every N-th layer from 0)
    moe = BASE + "--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall "
    for freq, first, others in (("'([0]*1+[1]*3)'", 1, ()), ("2", 0, (1, 3)),
                                ("'[1,0,1,1]'", 0, (1,))):
        job = read_config(write(tmp_path, moe + f"--moe-layer-freq {freq}"))
        spec = resolve_model(job, None, None)
        assert (spec.moe_first_dense, spec.moe_dense_layers) == (first, others), freq
    # 3 of 4 layers; no layer; not a list; a list of 10^12 items (refused before it is built)
    for bad in ("'[0]*3'", "0", "'__import__(\"os\")'", "'[0]*1000000*1000000'"):
        with pytest.raises(SpecError, match="--moe-layer-freq must be N >= 1 or a list of 4"):
            read_config(write(tmp_path, moe + f"--moe-layer-freq {bad}"))


def test_recommend_from_config_pins_its_choices(run_cli):
    res = run_cli("recommend", "--from-config", DATA / "bridge_llama3_8b.yaml", "--hardware",
                  "dgx-h100", "--gpus", "16", "--json", "--top", "2")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    for entry in data["plans"]:
        p = entry["plan"]
        assert (p["tp"], p["pp"], p["zero"], p["micro_batch"], p["global_batch"]) == \
            (2, 1, 1, 1, 512)
    assert "recommend pins the config's" in res.stderr


def test_launch_scripts_run_one_torchrun_per_host(tmp_path):
    # GB200 NVL72: one node (the rack's NVLink domain, 72 GPUs) of 18 hosts of 4 GPUs; 256 GPUs
    # are 64 hosts (not whole nodes of 72, which the writer refused before gpus_per_host)
    from perfmodel.configs.emit import emit
    from perfmodel.specs.hardware import load_hardware

    hardware = load_hardware("gb200-nvl72")
    made = plan(gpus=256, dp=128, tp=2, global_batch=256).check(load_model("llama3-8b"))
    for fmt, name in (("megatron", "launch.sh"), ("torchtitan", "launch.sh")):
        out = tmp_path / fmt
        kw = dict(zero=3, sequence_parallel=True, overlap_grad_sync=True, kernels="eager",
                  overlap_param_gather=True) if fmt == "torchtitan" else {}
        emit(fmt, out, load_model("llama3-8b"), hardware, made.replace(**kw), 1.0)
        assert "--nnodes 64 --nproc-per-node 4" in (out / name).read_text(), fmt


def test_megatron_expert_parallel_overlap_is_read_and_written(tmp_path):
    """--overlap-moe-expert-parallel-comm (Megatron-Core's combined 1F1B) becomes the plan's
    ep_comm_overlap and is written back."""
    text = BASE + ("--num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall "
                   "--expert-model-parallel-size 4 --expert-tensor-parallel-size 1 "
                   "--position-embedding-type rope --overlap-moe-expert-parallel-comm")
    job = read_config(write(tmp_path, text))
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert plan["ep_comm_overlap"] is True
    args = [a for group in megatron_arguments(spec, plan_from_dict(plan).check(spec))
            for a in group]
    assert "--overlap-moe-expert-parallel-comm" in args


def test_torchtitan_context_parallelism_is_read_and_written(tmp_path):
    """parallelism.context_parallel_degree with its rotate method (alltoall: the ring, as p2p;
    allgather: the K/V all-gather) and the head-tail balance (torchtitan's job_config.py at
    9810191bb~1); FSDP2 shards over dp_shard x cp, the ranks tp, cp, dp, pp from the inside."""
    data = tomllib.loads((DATA / "torchtitan_llama3_8b.toml").read_text())
    data["training"]["seq_len"] = 65536
    data["parallelism"].update(context_parallel_degree=8,
                               context_parallel_rotate_method="alltoall")
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(data))
    _, spec, fields = job_plan(path, gpus=64)
    assert (fields["cp"], fields["cp_comm"], fields["dp"], fields["zero"], fields["placement"]) \
        == (8, "p2p", 8, 3, "tp,cp,dp,pp")
    made = plan_from_dict(fields).check(spec)
    written = tomllib.loads(torchtitan_toml(spec, made))["parallelism"]
    assert (written["context_parallel_degree"], written["context_parallel_rotate_method"],
            written["data_parallel_shard_degree"]) == (8, "alltoall", 8)
    path.write_text(json.dumps(data | {"parallelism": data["parallelism"] | written}))
    assert job_plan(path, gpus=64)[2] == fields  # the written config reads back as the plan
    data["parallelism"].update(context_parallel_degree=8, data_parallel_shard_degree=1)
    path.write_text(json.dumps(data))  # cp alone: FSDP over the cp ranks
    assert job_plan(path, gpus=8)[2]["zero"] == 3
    for key, value, why in (("context_parallel_load_balancer", "ptrr", "head-tail"),
                            ("context_parallel_rotate_method", "ring", "torchtitan's values")):
        path.write_text(json.dumps(data | {"parallelism": data["parallelism"] | {key: value}}))
        with pytest.raises(PlanError, match=why):
            read_config(path)
    with pytest.raises(PlanError, match="allgather, p2p"):
        torchtitan_toml(spec, made.replace(cp_comm="a2a"))


# torchtitan/models/qwen3/__init__.py qwen3_args at 9810191bb~1; the three flavors perfmodel has
# presets of are the same models as those presets' Hugging Face configs
@pytest.mark.parametrize("flavor, preset", sorted(QWEN3_PRESETS.items()))
def test_torchtitan_qwen3_flavors_are_the_qwen3_presets(flavor, preset):
    spec = load_model(preset)
    assert {k: getattr(spec, k) for k in qwen3_model(flavor)} == qwen3_model(flavor)


def _qwen3_toml(tmp_path, flavor="30B-A3B", **parallelism):
    path = tmp_path / "qwen3.toml"
    lines = ["[model]", 'name = "qwen3"', f'flavor = "{flavor}"', "[training]",
             "local_batch_size = 4", "seq_len = 4096", "global_batch_size = 512",
             "[parallelism]"] + [f"{k} = {json.dumps(v)}" for k, v in parallelism.items()] + [
             "[activation_checkpoint]", 'mode = "full"']
    path.write_text("\n".join(lines) + "\n")
    return path


def test_torchtitan_qwen3_moe_with_expert_parallelism(tmp_path):
    """A qwen3 MoE flavor with expert_parallel_degree: the preset's model, FSDP2 over the dp
    ranks with the routed experts over their expert-data-parallel group (torchtitan's efsdp),
    etp torchtitan's default 1."""
    job, spec, plan = job_plan(_qwen3_toml(tmp_path, expert_parallel_degree=8), gpus=16)
    assert spec.name == "qwen3-30b-a3b" and spec.experts == 128
    assert (plan["dp"], plan["ep"], plan["etp"], plan["zero"], plan["recompute"]) == \
        (16, 8, 1, 3, "full")
    p = predict(spec, "dgx-h100", Plan(**plan))
    assert p.step_time_s > 0 and p.parameters == pytest.approx(30.5e9, rel=0.005)
    # etp = tp: each expert split over the attention's tp ranks
    _, _, plan = job_plan(_qwen3_toml(tmp_path, expert_parallel_degree=4,
                                      expert_tensor_parallel_degree=2,
                                      tensor_parallel_degree=2), gpus=16)
    assert (plan["tp"], plan["ep"], plan["etp"], plan["dp"]) == (2, 4, 2, 8)


def test_torchtitan_qwen3_dense_flavor_is_built_from_its_args(tmp_path):
    job, spec, plan = job_plan(_qwen3_toml(tmp_path, flavor="0.6B"), gpus=8)
    # Qwen3-0.6B: head_dim 128 over 16 heads of a 1024-wide model, tied embeddings
    assert (spec.layers, spec.hidden, spec.head_dim, spec.tied_embeddings, spec.experts) == \
        (28, 1024, 128, True, 0)
    assert parameter_count(spec, load_hardware("dgx-h100"), "bf16") == pytest.approx(0.6e9,
                                                                                    rel=0.01)


@pytest.mark.parametrize("flavor, parallelism, why", [
    ("8B", dict(expert_parallel_degree=2), "this flavor has no experts"),
    ("30B-A3B", dict(expert_parallel_degree=4, expert_tensor_parallel_degree=2,
                     tensor_parallel_degree=4), "1 or the tensor-parallel degree"),
    ("30B-A3B", dict(expert_parallel_degree=8, expert_parallel_comm_backend="nvshmem"),
     "standard, deepep"),
    ("30B-A3B", dict(pipeline_parallel_degree=2), "no pipeline parallelism"),
    ("1T", {}, "qwen3 flavors"),
])
def test_torchtitan_qwen3_refusals(tmp_path, flavor, parallelism, why):
    with pytest.raises((PlanError, SpecError), match=why):
        read_config(_qwen3_toml(tmp_path, flavor=flavor, **parallelism))


def test_torchtitan_deepep_is_read_as_the_deepep_dispatcher(tmp_path):
    job, _, plan = job_plan(_qwen3_toml(tmp_path, expert_parallel_degree=8,
                                        expert_parallel_comm_backend="deepep"), gpus=8)
    assert (plan["ep"], plan["ep_dispatcher"]) == (8, "deepep")
    assert any("deepep's kernels: ep_dispatcher deepep" in line for line in job.report())
    # torchtitan's HybridEP backend (dgxc-benchmarking's GB200 recipe) sends the same way
    _, _, plan = job_plan(_qwen3_toml(tmp_path, expert_parallel_degree=8,
                                      expert_parallel_comm_backend="hybridep"), gpus=8)
    assert plan["ep_dispatcher"] == "deepep"


def test_torchtitan_experts_without_fsdp_are_refused(tmp_path):
    path = _qwen3_toml(tmp_path, expert_parallel_degree=2, data_parallel_shard_degree=1,
                       tensor_parallel_degree=2)
    with pytest.raises(PlanError, match="wraps the experts in FSDP"):
        job_plan(path, gpus=2)


def test_torchtitan_deepseek_v3_flavor_says_its_attention_is_costed_causal(tmp_path):
    """deepseekv3_args' 16B/236B/671B run FlexAttention with block-causal masks: with --model the
    config is read, and the note says perfmodel's causal attention is an upper bound."""
    path = tmp_path / "ds.toml"
    path.write_text('[model]\nname = "deepseek_v3"\nflavor = "671B"\n[training]\n'
                    'local_batch_size = 1\nseq_len = 4096\n[parallelism]\n'
                    'expert_parallel_degree = 64\n')
    job, spec, plan = job_plan(path, model="deepseek-v3", gpus=256)
    assert plan["ep"] == 64 and plan["zero"] == 3
    assert any("block-causal" in note and "upper bound" in note for note in job.notes)


# --- NeMo AutoModel ---------------------------------------------------------------------------


def test_automodel_recipe_with_expert_parallelism():
    """tests/data/configs/automodel_qwen3_30b_a3b.yaml (AutoModel's Qwen3 MoE 30B benchmark
    recipe): the Hugging Face model is the preset of its config, FSDP2 over the 8 ranks with the
    experts over ep 8, every block checkpointed, bf16 parameters (no fp32 master: Adam's states
    and the sharded gradients bf16), TE's fused kernels and attention."""
    job, spec, plan = job_plan("automodel_qwen3_30b_a3b.yaml", gpus=8)
    assert job.framework.value == "automodel" and spec.name == "qwen3-30b-a3b"
    assert (spec.seq_len, spec.routing_imbalance) == (4096, 1.0)
    assert {k: plan[k] for k in ("dp", "ep", "zero", "micro_batch", "global_batch", "recompute",
                                 "optimizer_dtype", "grad_dtype", "kernels",
                                 "flash_attention")} == dict(
        dp=8, ep=8, zero=3, micro_batch=4, global_batch=512, recompute="full",
        optimizer_dtype="bf16", grad_dtype="bf16", kernels="fused", flash_attention=True)
    # distributed.moe.reshard_after_forward false: each unit kept gathered from its forward to
    # its backward
    assert plan["fsdp_reshard"] == "backward"
    assert any("DeepEP" in line for line in job.report())
    assert (plan["ep_dispatcher"], spec.routing) == ("deepep", "round_robin")
    # FSDP2Config.defer_fsdp_grad_sync, true by default: one reduction a step, in the last of
    # its 16 micro-batches, the gradients unsharded until then
    assert plan["defer_grad_sync"] is True
    p = predict(spec, "dgx-h100", Plan(**plan))
    assert p.fits_in_memory  # the published run ran on 80 GB H100s


def test_automodel_reduces_every_micro_batch_where_the_recipe_says_so(tmp_path):
    _, _, plan = job_plan(_automodel(tmp_path, **{"distributed.defer_fsdp_grad_sync": False}),
                          gpus=8)
    assert not plan.get("defer_grad_sync")
    with pytest.raises(SpecError, match="defer_fsdp_grad_sync must be true or false, got the "
                                        "string 'sometimes'"):  # a wrong type: a spec error
        read_config(_automodel(tmp_path, **{"distributed.defer_fsdp_grad_sync": "sometimes"}))


def test_automodel_defers_only_where_the_outer_model_is_an_fsdp_unit(tmp_path):
    """utils.get_sync_ctx calls set_requires_gradient_sync on an FSDPModule only: with the MoE
    parallelizer's wrap_outer_model false (NVIDIA-NeMo/Automodel moe/parallelizer.py at 36044ad;
    the code before 8134b0c03 never wrapped it) the outer model is not one and FSDP reduces every
    micro-batch whatever defer_fsdp_grad_sync says."""
    for where in ("distributed.moe", "parallelizer"):
        job, _, plan = job_plan(_automodel(tmp_path, **{"distributed.moe": None,
                                                        f"{where}.wrap_outer_model": False}),
                                gpus=8)
        assert not plan.get("defer_grad_sync")
        assert any("defer_fsdp_grad_sync" in line and "no effect" in line
                   for line in job.report())
        _, _, plan = job_plan(_automodel(tmp_path, **{"distributed.moe": None,
                                                      f"{where}.wrap_outer_model": True}), gpus=8)
        assert plan["defer_grad_sync"] is True


def test_automodel_moe_parallelizer_settings_are_read_or_refused(tmp_path):
    """Each of the MoE parallelizer's settings is read, refused or named as not read: none is
    dropped silently. reshard_after_forward false without a pipeline (stated, or the default of
    MoEParallelizerConfig at 36044ad) keeps each unit gathered from its forward to its backward
    (fsdp_reshard backward); FSDP2Config.reshard_after_forward overrides it where given
    (8a83fdcee); with ep_size 1 the MoE parallelizer does not run (FSDP2Manager shards the root
    model, an FSDP unit: the reduction is deferred, the units resharded after each forward).
    enable_fsdp_optimizations keeps every unit gathered through the step (fsdp_reshard step)."""
    def read(**changes):
        return job_plan(_automodel(tmp_path, **changes), gpus=8)

    job, _, plan = read(**{"distributed.moe": {"mp_policy": "x", "_target_": "y"}})
    assert sorted(s.key for s in job.unknown) == ["distributed.moe._target_",
                                                  "distributed.moe.mp_policy"]
    assert plan["fsdp_reshard"] == "backward"
    assert any("the MoE parallelizer's default" in str(s.value) for s in job.read)
    for key in ("distributed.moe.reshard_after_forward", "distributed.reshard_after_forward"):
        job, _, plan = read(**{key: True})
        assert "fsdp_reshard" not in plan and not job.unknown
    _, _, plan = read(**{"distributed.moe.reshard_after_forward": True,
                         "distributed.reshard_after_forward": False})
    assert plan["fsdp_reshard"] == "backward"
    job, _, plan = read(**{"distributed.ep_size": 1, "distributed.moe.wrap_outer_model": False})
    assert plan["defer_grad_sync"] is True and "fsdp_reshard" not in plan
    _, _, plan = read(**{"model.backend.enable_fsdp_optimizations": True})
    assert plan["fsdp_reshard"] == "step"
    _, _, plan = read(**{"model.backend.enable_fsdp_optimizations": True,
                         "distributed.pp_size": 2})  # a pipeline's schedule keeps them anyway
    assert "fsdp_reshard" not in plan
    job, _, _ = read(**{"distributed.moe.lm_head_precision": "torch.bfloat16"})
    assert any(s.key == "distributed.moe.lm_head_precision" for s in job.read)
    with pytest.raises(PlanError, match="lm_head_precision"):
        read_config(_automodel(tmp_path, **{"distributed.moe.lm_head_precision": "float32"}))
    with pytest.raises(SpecError, match="wrap_outer_model must be true or false"):
        read_config(_automodel(tmp_path, **{"distributed.moe.wrap_outer_model": "yes"}))
    with pytest.raises(PlanError, match="enable_fsdp_optimizations.*gathered again"):
        read(**{"model.backend.enable_fsdp_optimizations": True,
                "distributed.moe.reshard_after_forward": True})
    # the mixin is the MoE model's (MoEFSDPSyncMixin): with ep_size 1 FSDP2Manager shards the
    # root, resharding after each forward unless told, and the mixin keeps the units after each
    # backward: refused, or with reshard_after_forward false kept through the step
    with pytest.raises(PlanError, match=r"reshard_after_forward \(FSDP2Manager's default\)"):
        read(**{"model.backend.enable_fsdp_optimizations": True, "distributed.ep_size": 1})
    _, _, plan = read(**{"model.backend.enable_fsdp_optimizations": True,
                         "distributed.ep_size": 1, "distributed.reshard_after_forward": False})
    assert plan["fsdp_reshard"] == "step"


def test_automodel_backend_is_read_or_refused(tmp_path):
    """model.backend (BackendConfig at NVIDIA-NeMo/Automodel 36044ad): the experts' dispatcher
    with ep_size > 1 (deepep, hybridep; AutoModel's torch dispatcher all-gathers every token:
    refused, as is one left to what is installed), the experts' kernels of a mixture of experts,
    Transformer Engine's FP8 refused (it read as bf16), and every other key named."""
    def read(**changes):
        return job_plan(_automodel(tmp_path, **changes), gpus=8)

    _, _, plan = read(**{"model.backend.dispatcher": "hybridep"})
    assert plan["ep_dispatcher"] == "deepep"
    for value, why in (("torch", "all-gather of every token"), (None, "name it")):
        with pytest.raises(PlanError, match=f"model.backend.dispatcher.*{why}"):
            read(**{"model.backend.dispatcher": value})
    job, _, plan = read(**{"model.backend.dispatcher": "torch", "distributed.ep_size": 1})
    assert "ep_dispatcher" not in plan  # no token leaves its rank
    job, _, _ = read(**{"model.backend.experts": "gmm", "model.backend.rope_fusion": True,
                        "model.backend.wibble": 1})
    assert any(s.key == "model.backend.experts" for s in job.read)
    assert any(s.key == "model.backend.rope_fusion" for s in job.ignored)
    assert [s.key for s in job.unknown] == ["model.backend.wibble"]
    with pytest.raises(PlanError, match="model.backend.experts torch_mm_mxfp8"):
        read(**{"model.backend.experts": "torch_mm_mxfp8"})
    job, _, _ = read(**{"model.backend.experts": "torch"})  # beside DeepEP: TE's grouped GEMMs
    assert any("TE's" in s.note for s in job.read if s.key == "model.backend.experts")
    with pytest.raises(PlanError, match="model.backend.experts torch: .*a loop"):
        read(**{"model.backend.experts": "torch", "model.backend.dispatcher": None,
                "distributed.ep_size": 1})
    with pytest.raises(PlanError, match="model.backend.experts bogus"):
        read(**{"model.backend.experts": "bogus"})
    # the degree as whole() reads it: "8" is 8 ranks, their tokens exchanged (it read as 1)
    _, _, plan = read(**{"distributed.ep_size": "8"})
    assert plan["ep_dispatcher"] == "deepep"
    _, _, plan = read(**{"model.backend.attn": "eager"})
    assert plan["flash_attention"] is False
    with pytest.raises(PlanError, match="model.backend.attn tilelang"):  # a plan's, exit 4
        read(**{"model.backend.attn": "tilelang"})
    with pytest.raises(SpecError, match="distributed.ep_size must be >= 1 and <= 1e10, got 0"):
        read(**{"distributed.ep_size": 0})  # (it read as one rank)
    with pytest.raises(PlanError, match="model.backend.te_fp8"):
        read(**{"model.backend.te_fp8": {"recipe": "mxfp8"}})


def set_dotted(data, changes):
    """data with each dotted key of `changes` set in place (None: removed)."""
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return data


def edited_yaml(name, tmp_path, changes):
    """tests/data/configs/NAME with each dotted key of `changes` set (None: removed), written
    under tmp_path."""
    data = set_dotted(yaml.safe_load((DATA / name).read_text()), changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _automodel(tmp_path, **changes):
    return edited_yaml("automodel_qwen3_30b_a3b.yaml", tmp_path, changes)


def test_automodel_fp32_parameters_are_the_master_and_a_model_without_preset_needs_model(
        tmp_path):
    _, _, plan = job_plan(_automodel(tmp_path, **{"model.torch_dtype": "float32"}), gpus=8)
    assert "optimizer_dtype" not in plan and "grad_dtype" not in plan
    path = _automodel(tmp_path, **{"model.config.pretrained_model_name_or_path": "org/other"})
    with pytest.raises(SpecError, match="org/other: a Hugging Face model perfmodel has no "
                                        "preset of.*give --model"):
        job_plan(path, gpus=8)
    # the mock dataset without seq_len trains at its default, 1024 (AutoModel 36044ad3d
    # mock_iterable_dataset.py), which a --seq-len must agree with
    assert job_plan(_automodel(tmp_path, **{"dataset.seq_len": None}),
                    gpus=8)[1].seq_len == 1024
    with pytest.raises(SpecError, match="1024"):
        job_plan(_automodel(tmp_path, **{"dataset.seq_len": None}), seq_len=2048, gpus=8)
    # a dataset that fixes no length: --seq-len gives it
    chat = "nemo_automodel.components.datasets.llm.chat_dataset.ChatDataset"
    with pytest.raises(SpecError, match="give --seq-len"):
        job_plan(_automodel(tmp_path, **{"dataset.seq_len": None, "dataset._target_": chat}),
                 gpus=8)
    assert job_plan(_automodel(tmp_path, **{"dataset.seq_len": None, "dataset._target_": chat}),
                    seq_len=2048, gpus=8)[1].seq_len == 2048


def test_automodel_pipeline_split_is_autopipelines():
    """AutoModel's split (components/distributed/pipelining/functional.py): ceil(layers /
    layers_per_stage) stages rounded to a multiple of pp, the first layers % stages one layer
    more. DeepSeek-V3's 61 layers by 2 on pp 4: 31 stages, down to 28 (5 of 3, 23 of 2), up to
    32 (29 of 2, 3 of 1); no layers_per_stage: 2 stages a rank (interleaved), 1 (1F1B)."""
    from perfmodel.configs.automodel import stage_layers

    assert stage_layers(61, 4, 2, False, "down", "x") == [3] * 5 + [2] * 23
    assert stage_layers(61, 4, 2, False, "up", "x") == [2] * 29 + [1] * 3
    assert stage_layers(32, 4, None, False, None, "x") == [4] * 8
    assert stage_layers(30, 4, None, True, None, "x") == [8, 8, 7, 7]
    with pytest.raises(PlanError, match="31 stages of 61 layers do not divide over pp 4"):
        stage_layers(61, 4, 2, False, None, "x")
    with pytest.raises(PlanError, match="single-stage schedule takes one"):
        stage_layers(64, 4, 2, True, None, "x")


def test_automodel_recipe_with_pipeline_parallelism(tmp_path):
    path = _automodel(tmp_path, **{"model.config.pretrained_model_name_or_path":
                                   "deepseek-ai/DeepSeek-V3", "distributed.pp_size": 4,
                                   "distributed.ep_size": 64, "step_scheduler.local_batch_size": 8,
                                   "distributed.pipeline": {
                                       "pp_schedule": "interleaved1f1b", "pp_microbatch_size": 1,
                                       "layers_per_stage": 2,
                                       "round_virtual_stages_to_pp_multiple": "down"}})
    job, spec, plan = job_plan(path, gpus=256)
    assert spec.mtp_layers == 0  # AutoModel's DeepSeek-V3 builds no MTP module
    assert (plan["pp"], plan["dp"], plan["schedule"], plan["virtual_stages"],
            plan["micro_batch"]) == (4, 64, "interleaved", 7, 1)
    assert plan["pipeline_layout"] == "|".join(["Ettt"] + ["ttt"] * 4 + ["tt"] * 22 + ["ttL"])
    # FSDP2 over 7 stages a rank: torch's pipelining keeps 3 gathered, the others gathered
    # again (perfmodel.step.data_parallel.regathers), and 3 of 7 stages' weights held
    result = predict(spec, load_hardware("dgx-h100"), Plan(**plan))
    assert result.step_time_s > 0
    ledger = {r["name"]: r["calls"] for r in comm_ledger(spec, Plan(**plan),
                                                         load_hardware("dgx-h100"))}
    assert ledger["dp/fsdp_root/all_gather_again"] > 0


def test_automodel_splits_the_layers_of_a_model_given_by_model(tmp_path):
    """A model perfmodel has no preset of, with pp: AutoModel's split of --model's layers once
    it is known (the config alone cannot say: give --model)."""
    path = _automodel(tmp_path, **{"distributed.pp_size": 2,
                                   "model.config.pretrained_model_name_or_path": "org/x"})
    job = read_config(path)
    with pytest.raises(SpecError, match="give --model"):
        resolve_model(job, None, None)
    job, spec, plan = job_plan(path, model=str(DATA.parent / "hf" / "qwen3-30b-a3b"), gpus=8)
    assert (spec.layers, plan["pp"], plan["schedule"]) == (48, 2, "1f1b")
    assert plan["pipeline_layout"] == "E" + "t" * 24 + "|" + "t" * 24 + "L"
    assert any("pipeline" in line for line in job.report())


@pytest.mark.parametrize("changes, why", [
    ({"distributed.pp_size": 2, "distributed.pipeline": {"pp_schedule": "dualpipev"}},
     "pipeline.pp_schedule"),
    ({"distributed.dp_replicate_size": 2}, "HSDP"),
    ({"distributed.strategy": "megatron_fsdp"}, "megatron_fsdp is not modelled"),
    ({"peft.dim": 8}, "LoRA"),
    ({"optimizer._target_": "torch.optim.SGD"}, "Adam's states"),
    ({"packed_sequence.packed_sequence_size": 4096}, "packed sequences"),
])
def test_automodel_refusals(tmp_path, changes, why):
    with pytest.raises((PlanError, SpecError), match=why):
        read_config(_automodel(tmp_path, **changes))


def test_recommend_from_config_keeps_its_expert_parallelism_and_state_dtypes(run_cli, tmp_path):
    """A config's cp, ep and etp are pinned like its tp and pp, and what it states for every plan
    (the gradients' and Adam's dtypes, recompute every N layers, the stack) is kept: the search
    ranks the config's own memory (before: ep and cp searched, the bf16 states dropped)."""
    res = run_cli("recommend", "--from-config", DATA / "automodel_qwen3_30b_a3b.yaml",
                  "--hardware", "dgx-h100", "--gpus", "8", "--json", "--top", "3")
    assert res.returncode == 0, res.stderr
    plans = [entry["plan"] for entry in json.loads(res.stdout)["plans"]]
    assert {(p["ep"], p.get("cp", 1), p["optimizer_dtype"], p["grad_dtype"]) for p in plans} == \
        {(8, 1, "bf16", "bf16")}
    # a command-line value that contradicts the config's is refused, as for the pins
    bad = run_cli("recommend", "--from-config", DATA / "automodel_qwen3_30b_a3b.yaml",
                  "--hardware", "dgx-h100", "--gpus", "8", "--grad-dtype", "fp32")
    assert bad.returncode != 0 and "--grad-dtype fp32 contradicts" in bad.stderr
    # torchtitan's selective_ac_option "2": every second block, kept by the search
    data = tomllib.loads((DATA / "torchtitan_llama3_8b.toml").read_text())
    data["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": "2"}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    res = run_cli("recommend", "--from-config", path, "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "16", "--json", "--top", "2")
    assert res.returncode == 0, res.stderr
    assert {(e["plan"]["recompute"], e["plan"]["recompute_every"])
            for e in json.loads(res.stdout)["plans"]} == {("full", 2)}


def test_torchtitan_deepseek_v3_as_dgxc_benchmarking_runs_it(tmp_path):
    """dgxc-benchmarking's torchtitan DeepSeek-V3 recipe on 512 H100s (deepseek_v3_671b.toml
    with its launch.sh overrides: pp 8 1F1B, ep 64 over DeepEP, FSDP 64, per-op recompute,
    local batch 16): the 671B flavor is the preset without an MTP module, the split torchtitan's
    (61 + 1 + 1 over 8: 7 first, 6 last).

    It ran on 80 GB GPUs. With its FSDP under the pipeline as torch runs it (each stage's weights
    gathered and its gradients accumulated unsharded in fp32 through the step: perfmodel.step.
    data_parallel, stage_resident) the model counts 91.5 GiB: a known miss of the memory model
    (docs/accuracy.md#torchtitan-pipeline-fsdp), held here so that it shows if it moves. (91
    GiB, with the plain MLP count of per-op AC below, until the routed experts of an
    expert-data-parallel group of one rank, whole and never gathered as perfmodel takes them,
    left the gathered weights: torchtitan wraps them in an FSDP unit over that one rank all the
    same, for its mixed precision.)"""
    path = tmp_path / "dsv3.toml"
    path.write_text("\n".join([
        "[model]", 'name = "deepseek_v3"', 'flavor = "671B"',
        "[training]", "local_batch_size = 16", "global_batch_size = 1024", "seq_len = 4096",
        "[parallelism]", "data_parallel_shard_degree = 64", "pipeline_parallel_degree = 8",
        'pipeline_parallel_schedule = "1F1B"', "expert_parallel_degree = 64",
        'expert_parallel_comm_backend = "deepep"',
        "[activation_checkpoint]", 'mode = "selective"', 'selective_ac_option = "op"',
        "[compile]", "enable = true", 'components = ["model", "loss"]']) + "\n")
    job, spec, plan = job_plan(path, gpus=512)
    assert (spec.name, spec.mtp_layers, spec.expert_groups) == ("deepseek-v3", 0, 8)
    assert (plan["ep"], plan["ep_dispatcher"], plan["recompute"], plan["pp"]) == \
        (64, "deepep", "op", 8)
    assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (7, 6)
    p = predict(spec, "dgx-h100", Plan(**plan))
    assert p.step_time_s > 0
    # the stage's gathered weights and unsharded fp32 gradients, and the rest
    parts = p.memory_breakdown_bytes
    assert parts["buffers/zero3_gather"] > 3 * 2**30 and parts["gradients"] > 10 * 2**30
    # 91.5 GiB, held so that a move shows (88.0 until 2026-12-07: per-op AC under predict's
    # compiled family took every MLP as ungated, keeping w2's output where torchtitan's call
    # order keeps w3's, and the shared experts' w1 alone)
    assert 91 < p.memory_per_gpu_bytes / 2**30 < 92


def test_megatron_turns_fp8_param_gather_off_beside_torch_fsdp2(tmp_path):
    """megatron/training/arguments.py: with --use-torch-fsdp2 (Transformer Engine 2.0 or later)
    --fp8-param-gather is turned off and the parameters are all-gathered in bf16."""
    job = read_config(write(tmp_path, BASE + "--untie-embeddings-and-output-weights "
                                             "--use-torch-fsdp2 --fp8-format hybrid "
                                             "--no-gradient-accumulation-fusion "
                                             "--fp8-param-gather"))
    assert (job.plan["zero"], job.plan["dtype"], job.plan["fp8_params"]) == (3, "fp8", False)
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    plan_from_dict(plan).check(spec)  # a plan perfmodel predicts (fp8_params with zero 3 is not)
    dist = read_config(write(tmp_path, BASE + "--use-distributed-optimizer --fp8-format hybrid "
                                              "--fp8-param-gather", "d.txt"))
    assert dist.plan["fp8_params"] is True


@pytest.mark.parametrize("var, backend, says", [
    ("NVTE_FUSED_ATTN", "", "ran its FlashAttention backend"),
    ("NVTE_FLASH_ATTN", "", "ran cuDNN's fused attention"),
    ("NVTE_FLASH_ATTN", "--attention-backend fused ", None),  # as the backend says: no note
    ("NVTE_FUSED_ATTN", "--attention-backend unfused ", None),  # no fused attention at all
])
def test_a_launch_script_that_switches_te_attention_backends_off_says_which_runs(
        tmp_path, var, backend, says):
    """Transformer Engine's NVTE_FUSED_ATTN=0 / NVTE_FLASH_ATTN=0 (dgxc's Nemotron-4 340B
    configure.sh exports the first, with NeMo 24.09's Megatron-Core): against --attention-backend
    Megatron-LM stops at start-up since core_r0.11 (language_module.py _set_attention_backend);
    before, Transformer Engine ran the other backend. The reader says so; the kernel stays the
    user's to name (--attention-kernel), as with --attention-backend."""
    script = (f"#!/bin/bash\nexport {var}=0\ntorchrun --nproc-per-node 8 pretrain_gpt.py "
              + backend + BASE.strip() + "\n")
    job = read_config(write(tmp_path, script, "launch.sh"))
    notes = [n for n in job.notes if n.startswith(f"{var}=0")]
    if says is None:
        assert not notes
    else:
        assert len(notes) == 1 and says in notes[0] and "core_r0.11" in notes[0]
    assert "attention_kernel" not in job.plan


@pytest.mark.parametrize(("compile_lines", "stack"), [
    (["enable = true", 'components = ["model", "loss"]'], "compiled"),
    (["enable = true", 'components = ["model"]'], "compiled"),
    (["enable = true"], "compiled"),  # torchtitan's default components: model and loss
    (["enable = true", 'components = ["loss"]'], "eager"),  # the loss alone: the blocks eager
    (["enable = false", 'components = ["model"]'], "eager"),
    # compile off: what the components would name is not read (a later torchtitan's component
    # is not refused where nothing compiles)
    (["enable = false", 'components = ["model", "optimizer"]'], "eager"),
])
def test_torchtitan_compiles_the_blocks_only_with_model_among_the_components(
        tmp_path, compile_lines, stack):
    """torchtitan compiles the model when compile.enable and "model" is in compile.components
    (torchtitan/models/llama3/config_registry.py); the loss alone leaves the blocks eager."""
    path = tmp_path / "job.toml"
    path.write_text("\n".join(["[model]", 'name = "llama3"', 'flavor = "8B"',
                               "[training]", "local_batch_size = 1", "seq_len = 8192",
                               "[compile]", *compile_lines]) + "\n")
    job = read_config(path)
    assert (job.plan["stack"], job.plan["kernels"]) == (stack, stack)


@pytest.mark.parametrize("lines, error", [
    (["enable = \"yes\""], SpecError),  # a string for a boolean: a wrong type
    (["enable = true", 'components = "model"'], PlanError),
    (["enable = true", 'components = ["model", "optimizer"]'], PlanError)])
def test_torchtitan_refuses_a_compile_setting_it_cannot_read(tmp_path, lines, error):
    path = tmp_path / "job.toml"
    path.write_text("\n".join(["[model]", 'name = "llama3"', 'flavor = "8B"',
                               "[training]", "local_batch_size = 1", "[compile]", *lines]) + "\n")
    with pytest.raises(error, match="compile"):
        read_config(path)


def test_megatron_refuses_use_flash_attn_beside_an_unfused_backend(tmp_path):
    """--use-flash-attn and --attention-backend unfused contradict each other; which one ran
    depends on Megatron-LM's version, so neither is taken (the flag used to win silently)."""
    with pytest.raises(PlanError, match=r"--use-flash-attn.*contradicts --attention-backend "
                                        r"unfused"):
        read_config(write(tmp_path, BASE + "--use-flash-attn --attention-backend unfused"))
    job = read_config(write(tmp_path, BASE + "--use-flash-attn --attention-backend flash"))
    assert job.plan["flash_attention"] is True


@pytest.mark.parametrize(("extra", "stack"), [
    ("", "eager"),  # Megatron-Core compiles none of its layers
    ("--cuda-graph-impl none", "eager"),
    ("--cuda-graph-impl transformer_engine", "cuda-graphs"),  # modules "full": whole layers
    ("--cuda-graph-impl local --cuda-graph-modules attn mlp", "cuda-graphs"),
    ("--cuda-graph-impl full_iteration", "cuda-graphs"),
    ("--enable-cuda-graph", "cuda-graphs"),  # the older name of local
    ("--external-cuda-graph", "cuda-graphs"),  # and of transformer_engine
])
def test_megatron_reads_cuda_graphs_as_the_stack(tmp_path, extra, stack):
    """megatron/core/transformer/transformer_config.py: cuda_graph_impl (none, local,
    transformer_engine, full_iteration) and cuda_graph_modules ("full", the default: the whole
    layer); the stack is the config's, so a contradicting --stack is refused."""
    job = read_config(write(tmp_path, BASE + extra))
    assert job.plan["stack"] == stack


@pytest.mark.parametrize("extra", [
    "--enable-cuda-graph --cuda-graph-impl local",
    "--cuda-graph-impl everything",
])
def test_megatron_refuses_cuda_graphs_it_cannot_read(tmp_path, extra):
    with pytest.raises(PlanError, match="cuda-graph"):
        read_config(write(tmp_path, BASE + extra))


@pytest.mark.parametrize("extra", ["--cuda-graph-impl transformer_engine --cuda-graph-scope attn",
                                   "--cuda-graph-impl local --cuda-graph-modules mlp"])
def test_megatron_reads_graphs_over_part_of_a_layer_as_eager_with_a_note(tmp_path, extra):
    """As the AutoModel reader does: the partial graphs are not modelled, and the note says the
    layers are costed eager."""
    job = read_config(write(tmp_path, BASE + extra))
    assert job.plan["stack"] == "eager"
    assert any("part of each layer are not modelled" in n for n in job.notes)


def test_bridge_reads_cuda_graphs_whole_or_partial(tmp_path):
    """A Megatron-Bridge config's model.cuda_graph_impl and cuda_graph_scope: whole layers are
    the cuda-graphs stack; part of a layer (attention alone, or an MoE layer's router and
    preprocess, the MoE recipes' partial graphs) is read as eager, with a note."""
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn", "mlp"])
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    assert read_config(path).plan["stack"] == "cuda-graphs"
    # a Megatron-Bridge dump writes the modules as their enums
    enum = "megatron.core.transformer.enums.CudaGraphModule"
    data["model"].pop("cuda_graph_scope")
    data["model"]["cuda_graph_modules"] = [
        {"_target_": enum, "_args_": [1], "_name_": "attn"},
        {"_target_": enum, "_args_": [2], "_name_": "mlp"}]
    path.write_text(yaml.safe_dump(data))
    assert read_config(path).plan["stack"] == "cuda-graphs"
    data["model"]["cuda_graph_modules"] = ["attn"]
    path.write_text(yaml.safe_dump(data))
    job = read_config(path)
    assert job.plan["stack"] == "eager"
    assert any(n.startswith("model.cuda_graph_modules attn") for n in job.notes)


def test_megatron_refuses_an_fp8_format_it_does_not_know(tmp_path):
    """Megatron-LM's --fp8-format takes e4m3 or hybrid (its argparse choices): a misspelt one was
    read as FP8 all the same."""
    with pytest.raises(PlanError, match="--fp8-format hybird.*e4m3 or hybrid"):
        read_config(write(tmp_path, BASE + "--bf16 --fp8-format hybird"))
    assert read_config(write(tmp_path, BASE + "--bf16 --fp8-format hybrid")).plan["dtype"] == "fp8"


@pytest.mark.parametrize(("section", "key", "value", "error", "needle"), [
    ("ddp", "overlap_grad_reduc", True, SpecError, "did you mean 'overlap_grad_reduce'"),
    ("train", "micro_batch_sze", 4, SpecError, "did you mean 'micro_batch_size'"),
    ("optimizer", "optimizer_cpu_offload", True, PlanError, "optimizer_cpu_offload"),
])
def test_bridge_refuses_a_misspelt_or_unmodelled_key_outside_model(
        tmp_path, section, key, value, error, needle):
    """Outside `model:` an unknown key was filed as 'not the step's' and dropped: a misspelt
    overlap_grad_reduce or micro_batch_size changed the plan silently, and an optimizer on the
    host was costed on the GPU. A near-miss of a key perfmodel reads is refused with its name, and
    optimizer_cpu_offload as Megatron's --optimizer-cpu-offload is."""
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data[section][key] = value
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(error, match=needle):
        read_config(path)


def test_megatron_cores_own_fields_near_a_read_key_are_not_taken_for_misspellings(tmp_path):
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(tp_comm_overlap_ag=True, eval_context_parallel_size=None,
                         encoder_tensor_model_parallel_size=0)
    data["train"]["micro_batch_sze"] = None  # off: not a setting, whatever its name
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    assert read_config(path).plan["tp"] >= 1


def test_the_read_list_says_what_each_value_became(tmp_path):
    """The read lines show each key's own value and what perfmodel took (they printed
    'add_qkv_bias False: qkv_bias true', 'fp16 False: dtype fp16' and, for NeMo's
    share_embeddings_and_output_weights true, 'False: tied_embeddings false')."""
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(add_qkv_bias=False, share_embeddings_and_output_weights=True)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    job = read_config(path)
    read = {s.key: (s.value, s.note) for s in job.read}
    assert read["model.add_qkv_bias"] == (False, "qkv_bias false")
    value, note = read["model.share_embeddings_and_output_weights"]
    assert value is True and note.startswith("tied_embeddings true")
    assert job.model["tied_embeddings"] is True


def test_megatron_emit_writes_cuda_graphs_and_refuses_a_compiled_stack():
    """A cuda-graphs plan is written with --cuda-graph-impl transformer_engine (whole layers),
    which reads back as cuda-graphs; Megatron-LM compiles no layer, so a compiled plan is
    refused (it was written as eager and read back so)."""
    model = load_model("llama3-8b")
    base = dict(gpus=8, dp=8, global_batch=64, flash_attention=True, kernels="fused")
    args = [a for group in megatron_arguments(model, Plan(**base, stack="cuda-graphs"))
            for a in group]
    assert args[args.index("--cuda-graph-impl") + 1] == "transformer_engine"
    assert "--cuda-graph-impl" not in [a for group in megatron_arguments(
        model, Plan(**base, stack="eager")) for a in group]
    with pytest.raises(PlanError, match="stack compiled"):
        megatron_arguments(model, Plan(**base, stack="compiled"))
