"""Megatron-LM and Megatron-DeepSpeed scripts a reviewer ran through `predict --from-config`
(NVIDIA/Megatron-LM at d98e8a64dd, microsoft/Megatron-DeepSpeed at f4157bea69, bigscience-workshop/
bigscience at 9e64edec2a): each test is named after what the reader got wrong, and holds the
smallest script that showed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.shell import launch_command
from perfmodel.errors import PlanError, SpecError

ARGS = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
        "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 ")


def write(tmp_path: Path, text: str, name: str = "run.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def plan_of(tmp_path: Path, text: str, name: str = "run.sh", **given: object
            ) -> tuple[object, object, dict]:
    job = read_config(write(tmp_path, text, name))
    spec, plan = resolve_plan(job, resolve_model(job, None, None), dict(given))
    return job, spec, plan


def launch(script: str):
    return launch_command(script, "s.sh", lambda w: w.endswith("pretrain_gpt.py"))


# --- the shell subset ---------------------------------------------------------------------------


@pytest.mark.parametrize("assignments, value", [
    ("GBS=16\nGBS=$(( GBS * 2 ))\n", "32"),  # a bare name, spaces inside
    ("A=4\nB=8\nGBS=$(($A * $B))\n", "32"),
    ("GPN=8\nMICRO_BATCH=2\nNODES=2\nGBS=$(( ${GPN} * ${MICRO_BATCH} * ${NODES} ))\n", "32"),
    ("GBS=$(( 2 * (4 + 12) ))\n", "32"),
    ("GBS=$(( -7 / 2 + 35 ))\n", "32"),  # bash divides towards zero: -3
    ("GBS=$(( -7 % 2 + 33 ))\n", "32"),  # and its remainder takes the dividend's sign: -1
    ("E='2*2'\nGBS=$(( E * 8 ))\n", "32"),  # a variable's value is itself evaluated
], ids=["bare name", "$A * $B", "${A} * ${B} * ${C}", "parentheses", "division", "remainder",
        "nested value"])
def test_shell_arithmetic_with_spaces_is_evaluated(assignments, value):
    found = launch(assignments + "torchrun pretrain_gpt.py --global-batch-size $GBS\n")
    assert found.args == ["--global-batch-size", value]


@pytest.mark.parametrize("assignments, needle", [
    ("GBS=$(( NODES * 8 ))\n", r"NODES: not set in the script"),
    ("GBS=$(( ${NODES} * 8 ))\n", r"\$\{NODES\}: not set in the script"),
    ("GBS=$(( 2 ** 5 ))\n", r"not '\*\*'"),
    ("if [ x ]; then\n  N=4\nfi\nGBS=$(( N * 8 ))\n", r"N: set inside an if/for/while/case"),
], ids=["bare name unset", "${NAME} unset", "power", "set under if"])
def test_shell_arithmetic_perfmodel_cannot_evaluate_is_refused_by_name(tmp_path, assignments,
                                                                        needle):
    with pytest.raises(SpecError, match=r"--global-batch-size \$\(\(.*\)\) cannot be read: "
                                        r"arithmetic perfmodel cannot evaluate.*" + needle):
        read_config(write(tmp_path, assignments + "torchrun pretrain_gpt.py " + ARGS
                          + "--global-batch-size $GBS\n"))


@pytest.mark.parametrize("tail", [
    " 2>&1 | tee $LOG", " &> $LOG", " > $LOG", " >> /tmp/x.log 2>/dev/null", " 2>&1|tee -a x",
    "; echo done", " && echo done", " || exit 1", " > `pwd`/log.txt", " &",
], ids=["2>&1 | tee", "&>", ">", ">> 2>", "|tee", ";", "&&", "||", "> `pwd`", "&"])
def test_redirections_and_pipes_after_the_launch_are_not_its_arguments(tmp_path, tail):
    # min/redir.sh: `... --bf16 2>&1 | tee $LOG` was read as arguments ('2>&1', '|', 'tee', ...)
    job, _, plan = plan_of(tmp_path, "LOG=`pwd`/log.txt\ntorchrun --nproc_per_node 8 "
                           "pretrain_gpt.py " + ARGS + "--bf16" + tail + "\n")
    assert not job.unknown and plan["dtype"] == "bf16" and plan["gpus"] == 8


def test_a_launch_after_cd_and_a_command_list_is_read(tmp_path):
    job, _, plan = plan_of(tmp_path, "cd /workspace && torchrun --nproc_per_node 4 "
                           "pretrain_gpt.py " + ARGS + "--bf16 | tee log\n")
    assert plan["gpus"] == 4 and not job.unknown


def test_a_shell_string_with_a_redirection_is_read(tmp_path):
    # min/redir3.sh: run_cmd="torchrun ... --bf16 &> ${LOG}"; bash -c "${run_cmd}"
    job, _, plan = plan_of(tmp_path, "LOG=`pwd`/log.txt\nrun_cmd=\"torchrun --nproc_per_node 8 "
                           "pretrain_gpt.py " + ARGS + "--bf16 &> ${LOG}\"\n"
                           "bash -c \"${run_cmd}\"\n")
    assert not job.unknown and plan["gpus"] == 8


def test_a_quoted_operator_and_a_placeholder_are_arguments():
    found = launch("torchrun pretrain_gpt.py --data-path 'a|b' \">\" x\\;y --save <PATH TO "
                   "ckpt> --bf16 <in.txt >out.txt\n")
    assert found.args == ["--data-path", "a|b", ">", "x;y", "--save", "<PATH", "TO", "ckpt>",
                          "--bf16"]


def test_assignments_on_one_line_with_an_if_are_under_it(tmp_path):
    with pytest.raises(SpecError, match=r"\$N cannot be read: set inside an if/for/while/case"):
        read_config(write(tmp_path, "N=2; if [ x ]; then N=4; fi\ntorchrun pretrain_gpt.py "
                          + ARGS + "--tensor-model-parallel-size $N\n"))
    found = launch("A=1; B=2\ntorchrun pretrain_gpt.py --x $A$B\n")
    assert found.args == ["--x", "12"]


# --- the arguments ------------------------------------------------------------------------------

IF_SCALARS = """LOG_TO_WANDB=0
WANDB_ARGS=
if [ $LOG_TO_WANDB -eq 1 ]
then
WANDB_ARGS="--wandb-project x"
fi
ds_args=" --deepspeed"
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 \\
    --max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --bf16 \\
    --tensor-model-parallel-size 2 {unknown} \\
    $WANDB_ARGS \\
    $ds_args
"""


@pytest.mark.parametrize("unknown", ["", "--some-unknown-opt 4", "--some-unknown-flag",
                                     "--save-interval 100"])
def test_an_unreadable_variable_is_refused_after_an_unknown_option_too(tmp_path, unknown):
    # min/ifscalar3.sh: an option perfmodel does not know took $WANDB_ARGS (set under an if,
    # perhaps '--wandb-project x' or more options) as its value; exit 0 where ifscalar.sh, without
    # the option, was refused
    with pytest.raises(SpecError, match=r"\$WANDB_ARGS cannot be read: set inside an if/for"):
        read_config(write(tmp_path, IF_SCALARS.format(unknown=unknown)))


def test_an_ignored_options_own_value_may_be_unreadable(tmp_path):
    job = read_config(write(tmp_path, "torchrun pretrain_gpt.py " + ARGS + "--bf16 --data-path "
                            "$DATA --save $1\n"))
    assert {s.key for s in job.ignored} >= {"--data-path", "--save"}


# --- the world size -----------------------------------------------------------------------------


def test_a_bare_deepspeed_launch_leaves_the_world_size_to_gpus(tmp_path):
    # min/dslaunch.sh: DeepSpeed's runner uses every GPU of its hostfile (or of this host): it was
    # read as one GPU, and --gpus 8 then refused as contradicting it
    script = "deepspeed pretrain_gpt.py " + ARGS + "--fp16 --deepspeed\n"
    job = read_config(write(tmp_path, script))
    assert job.gpus is None and any("every GPU" in n for n in job.notes)
    with pytest.raises(PlanError, match="give --gpus"):
        resolve_plan(job, resolve_model(job, None, None), {})
    _, _, plan = plan_of(tmp_path, script, gpus=8)
    assert plan["gpus"] == 8


@pytest.mark.parametrize("options, gpus", [
    ("--num_gpus 4", 4), ("--num_gpus=8 --num_nodes 2", 16), ("--num_nodes 1 --num_gpus 2", 2),
    ("--include localhost:0,1,2", 3), ("-i worker-0:0,1@worker-1:0,1", 4),
    ("--include=localhost:0,1 --master_port 29500", 2),
    ("--num_nodes 2", None), ("--hostfile hosts --num_gpus 8", None),
    ("--include worker-0@worker-1:0", None), ("--exclude worker-1:0", None),
])
def test_a_deepspeed_launch_gives_the_gpus_its_options_name(tmp_path, options, gpus):
    job = read_config(write(tmp_path, f"deepspeed {options} pretrain_gpt.py " + ARGS
                            + "--fp16 --deepspeed\n"))
    assert job.gpus == gpus


def test_deepspeed_include_with_num_gpus_is_refused(tmp_path):
    with pytest.raises(SpecError, match="--include.*with --num_gpus"):
        read_config(write(tmp_path, "deepspeed --num_gpus 2 --include localhost:0,1 "
                          "pretrain_gpt.py " + ARGS + "--fp16 --deepspeed\n"))


# --- the model ----------------------------------------------------------------------------------

LLAMA = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 "
         "--swiglu --normalization RMSNorm --disable-bias-linear "
         "--untie-embeddings-and-output-weights --seq-length 4096 --max-position-embeddings 4096 "
         "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 ")


@pytest.mark.parametrize("extra", ["", "--deepspeed --zero-stage 1"])
def test_use_rotary_position_embeddings_is_rope(tmp_path, extra):
    # min/rope_legacy.txt: Megatron-LM maps the legacy flag to --position-embedding-type rope
    # (megatron/training/arguments.py), Megatron-DeepSpeed builds RotaryEmbedding and drops the
    # learned table (megatron/arguments.py, model/language_model.py); it was ignored as
    # "numerics", leaving a 4096 x 4096 learned table in the model
    _, legacy, _ = plan_of(tmp_path, LLAMA + "--use-rotary-position-embeddings " + extra,
                           "legacy.txt", gpus=8)
    _, rope, _ = plan_of(tmp_path, LLAMA + "--position-embedding-type rope " + extra,
                         "rope.txt", gpus=8)
    assert legacy.position_embedding == rope.position_embedding == "rotary"


@pytest.mark.parametrize("positions", ["--position-embedding-type rope",
                                       "--use-rotary-position-embeddings"])
def test_no_position_embedding_beside_rope_is_accepted(tmp_path, positions):
    # examples/mixtral/train_mixtral_8x7b_distributed.sh gives both; Megatron-LM raises on
    # --no-position-embedding only where the type is not rope
    job, spec, _ = plan_of(tmp_path, LLAMA + positions + " --no-position-embedding", "a.txt",
                           gpus=8)
    assert spec.position_embedding == "rotary"
    assert any(s.key == "--no-position-embedding" for s in job.read + job.ignored)


def test_no_position_embedding_without_rope_is_refused(tmp_path):
    with pytest.raises(SpecError, match="--no-position-embedding: .*--position-embedding-type"):
        read_config(write(tmp_path, LLAMA + "--no-position-embedding", "a.txt"))


def test_megatron_deepspeed_num_key_value_heads_is_gqa(tmp_path):
    # min/mds_gqa.txt: Llama-2-70B in Megatron-DeepSpeed's terms (its GQA option, megatron/
    # arguments.py); 8 kv heads were read as 64: 78.38B parameters for 68.98B
    from perfmodel.predict import parameter_count

    args = (LLAMA.replace("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                          "--ffn-hidden-size 11008", "--num-layers 80 --hidden-size 8192 "
                          "--num-attention-heads 64 --ffn-hidden-size 28672")
            + "--num-key-value-heads 8 --position-embedding-type rope --deepspeed --zero-stage 0")
    job, spec, _ = plan_of(tmp_path, args, "a.txt", gpus=8)
    assert spec.kv_heads == 8
    assert round(parameter_count(spec, "dgx-h100") / 1e9, 2) == 68.98
    with pytest.raises(SpecError, match="--num-key-value-heads 8 .*--num-query-groups 4"):
        read_config(write(tmp_path, args + " --group-query-attention --num-query-groups 4",
                          "b.txt"))


@pytest.mark.parametrize("given, norm", [("rmsnorm", "rmsnorm"), ("layernorm", "layernorm"),
                                         ("RMSNorm", "rmsnorm")])
def test_megatron_deepspeed_lowercase_normalization_is_read(tmp_path, given, norm):
    # Megatron-DeepSpeed's --normalization takes layernorm and rmsnorm (megatron/arguments.py):
    # 'rmsnorm' was refused with "perfmodel models LayerNorm and RMSNorm"
    _, spec, _ = plan_of(tmp_path, LLAMA.replace("RMSNorm", given) + "--deepspeed", "a.txt",
                         gpus=8)
    assert spec.norm == norm


def test_an_unknown_normalization_is_refused(tmp_path):
    with pytest.raises(SpecError, match="--normalization groupnorm: perfmodel models LayerNorm "
                                        "and RMSNorm"):
        read_config(write(tmp_path, LLAMA.replace("RMSNorm", "groupnorm"), "a.txt"))


# --- Megatron-DeepSpeed -------------------------------------------------------------------------

MDS = ARGS + "--global-batch-size 64 --fp16 --deepspeed --zero-stage 0 --no-pipeline-parallel "


@pytest.mark.parametrize("moe", [
    "--num-experts 128 --moe-expert-parallel-size 64 --moe-train-capacity-factor 1.0",
    "--num-experts 8 8 16 16 --topk 2",  # a list: one number per MoE layer
    "--num-experts 8 --expert-interval 1",
])
def test_megatron_deepspeed_moe_is_refused_in_one_line(tmp_path, moe):
    # ds_pretrain_gpt_1.3B_MoE128.sh: DeepSpeed's MoE layer was read with Megatron-LM's
    # semantics (--moe-expert-parallel-size not read, top_k 2 for DeepSpeed's default 1, every
    # layer MoE for --expert-interval 2's every other one) and then asked for Megatron-LM's
    # --moe-token-dispatcher-type, an option Megatron-DeepSpeed does not have
    with pytest.raises(PlanError, match=r"--num-experts .*: Megatron-DeepSpeed's mixture of "
                                        r"experts .* is not modelled"):
        read_config(write(tmp_path, MDS + moe, "a.txt"))


def test_megatron_deepspeed_one_expert_is_the_dense_model(tmp_path):
    # Megatron-DeepSpeed's default --num-experts [1]: its example scripts pass ${EP_SIZE} = 1
    job, spec, _ = plan_of(tmp_path, MDS + "--num-experts 1 --moe-expert-parallel-size 1 "
                           "--topk 1 --create-moe-param-group", "a.txt", gpus=8)
    assert spec.experts == 0 and not job.unknown
    assert {s.key for s in job.read} >= {"--num-experts", "--topk"}


def test_megatron_lm_num_experts_takes_one_number(tmp_path):
    with pytest.raises(SpecError, match="--num-experts 8 8: Megatron-LM takes one number"):
        read_config(write(tmp_path, ARGS + "--bf16 --num-experts 8 8", "a.txt"))


def test_megatron_deepspeed_switch_mlp_is_refused(tmp_path):
    with pytest.raises(PlanError, match="--num-experts-switch 8: Megatron-DeepSpeed's SwitchMLP"):
        read_config(write(tmp_path, MDS + "--num-experts-switch 8", "a.txt"))


ULYSSES = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 32768 "
           "--max-position-embeddings 32768 --vocab-size 50257 --micro-batch-size 1 "
           "--global-batch-size 2 --fp16 --tensor-model-parallel-size 1 "
           "--pipeline-model-parallel-size 1 --no-pipeline-parallel --deepspeed --zero-stage 3 "
           "--checkpoint-activations --deepspeed-activation-checkpointing ")


@pytest.mark.parametrize("flash", ["--use-flash-attn-triton", "--use-flash-attn-v2",
                                   "--use-flash-attn-v1", "--use-flash-attn",
                                   "--use-flash-attn-builder"])
def test_deepspeed_ulysses_is_context_parallelism_by_all_to_all(tmp_path, flash):
    # mds_30b_ulysses_args.txt (ds_pretrain_gpt_30B_seq_parallel_32k.sh): DeepSpeed-Ulysses
    # splits the sequence over --ds-sequence-parallel-size ranks and all-to-alls heads for the
    # attention (DistributedAttention, megatron/model/transformer.py): cp 4, cp_comm a2a; it was
    # not read (dp 8 for 2) and the triton flash attention read as unfused
    _, _, plan = plan_of(tmp_path, ULYSSES + "--ds-sequence-parallel-size 4 " + flash, "a.txt",
                         gpus=8)
    assert (plan["cp"], plan["cp_comm"], plan["dp"]) == (4, "a2a", 2)
    assert plan["flash_attention"] is True


@pytest.mark.parametrize("extra, needle", [
    ("--tensor-model-parallel-size 2", "with tp 2"),
    ("--sequence-parallel --tensor-model-parallel-size 2", "with tp 2"),
    ("--ds-sequence-parallel-fpdt", "FPDT"),
])
def test_deepspeed_ulysses_what_megatron_deepspeed_refuses(tmp_path, extra, needle):
    with pytest.raises((PlanError, SpecError), match=needle):
        read_config(write(tmp_path, ULYSSES + "--ds-sequence-parallel-size 4 "
                          "--use-flash-attn-v2 " + extra, "a.txt"))


# --- the plan -----------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, batch", [("'0:384 200B:768 400B:1152'", 1152),
                                             ("'0:16,1M:32'", 32), ("'0:64'", 64),
                                             ("'1.5k:32 0:16'", 32)])
def test_step_batch_size_schedule_gives_its_last_batch(tmp_path, schedule, batch):
    # ft_gpt3_15b_8t_release: Megatron-Core's StepBatchsizeNumMicroBatchesCalculator (megatron/
    # core/num_microbatches_calculator.py) steps the global batch up at each threshold (samples,
    # or tokens with K M B T); the step after the last is predicted, as --rampup-batch-size's is.
    # It was not read: the batch was micro-batch x dp
    job, _, plan = plan_of(tmp_path, ARGS + "--bf16 --step-batch-size-schedule " + schedule,
                           "a.txt", gpus=8)
    assert plan["global_batch"] == batch
    assert any(s.key == "--step-batch-size-schedule" for s in job.read)


def test_step_batch_size_schedule_beside_the_same_global_batch_is_read(tmp_path):
    # examples/gpt3/train_gpt3_175b_distributed.sh at d98e8a64 gives both (Megatron-LM's
    # arguments.py raises on it): where they agree the batch is taken, with a note
    job, _, plan = plan_of(tmp_path, ARGS + "--bf16 --global-batch-size 1536 "
                           "--step-batch-size-schedule '0:16 2.4B:320 12B:1536'", "a.txt", gpus=8)
    assert plan["global_batch"] == 1536
    assert any("--step-batch-size-schedule" in n and "raises" in n for n in job.notes)


@pytest.mark.parametrize("extra, needle", [
    ("--step-batch-size-schedule '0:384 1B:768' --global-batch-size 64", "768 .* 64"),
    ("--step-batch-size-schedule '0:384 x:768'", "THRESHOLD:BATCH"),
    ("--step-batch-size-schedule '10:384'", "threshold 0"),
    ("--step-batch-size-schedule '0:0'", "THRESHOLD:BATCH"),
])
def test_a_step_batch_size_schedule_megatron_refuses_is_refused(tmp_path, extra, needle):
    with pytest.raises(SpecError, match=needle):
        read_config(write(tmp_path, ARGS + "--bf16 " + extra, "a.txt"))


MLA = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --bf16 "
       "--multi-latent-attention --q-lora-rank 384 --kv-lora-rank 128 --qk-head-dim 64 "
       "--qk-pos-emb-head-dim 32 --v-head-dim 64 --position-embedding-type rope "
       "--normalization RMSNorm --swiglu --disable-bias-linear ")


def test_kv_channels_under_latent_attention_is_skipped(tmp_path):
    # DeepSeek-V3's Megatron-LM arguments give --kv-channels 128 beside --multi-latent-attention;
    # Megatron-Core's MLA sizes its heads by --qk-head-dim, --qk-pos-emb-head-dim and
    # --v-head-dim (multi_latent_attention.py), kv_channels unused. It was read as head_dim and
    # the model then refused (head_dim does not apply to MLA), or refused against --model
    job, spec, _ = plan_of(tmp_path, MLA + "--kv-channels 128", "a.txt", gpus=8)
    assert spec.kv_lora_rank == 128
    assert any(s.key == "--kv-channels" and "multi-latent-attention" in s.note
               for s in job.ignored)


def test_the_default_attention_backend_is_the_hardwares(tmp_path, run_cli):
    # min/v100.txt on dgx-v100: --attention-backend auto (the default) was read as flash
    # attention, refused on the V100 (no flash kernel), and --attention unfused then refused as
    # contradicting flash_attention True, which the file never stated. Transformer Engine falls
    # back to its unfused attention there
    path = write(tmp_path, ARGS + "--global-batch-size 8 --fp16", "v100.txt")
    assert "flash_attention" not in read_config(path).plan
    for hardware, extra, attention in (("dgx-v100", [], "unfused attention"),
                                       ("dgx-v100", ["--attention", "unfused"],
                                        "unfused attention"),
                                       ("dgx-h100", [], "flash attention")):
        done = run_cli("predict", "--from-config", path, "--gpus", 8, "--hardware", hardware,
                       *extra)
        assert done.returncode == 0, done.stderr
        assert attention in done.stdout
    # a backend the file states is pinned as before
    path = write(tmp_path, ARGS + "--global-batch-size 8 --fp16 --attention-backend flash",
                 "flash.txt")
    done = run_cli("predict", "--from-config", path, "--gpus", 8, "--hardware", "dgx-v100")
    assert done.returncode == 4 and "no flash-attention kernel" in done.stderr


@pytest.mark.parametrize("option, reason", [
    ("--data-impl mmap", "data"),  # Megatron-LM's own option (2021-23), not Megatron-DeepSpeed's
    ("--fp8-amax-history-len 1024", "amax history"),
    ("--fp8-amax-compute-algo max", "amax history"),
    ("--moe-router-score-function sigmoid", "router"),
    ("--moe-router-pre-softmax", "router"),
    ("--moe-router-topk-scaling-factor 2.5", "router"),
    ("--moe-router-enable-expert-bias", "router"),
    ("--moe-router-bias-update-rate 1e-3", "router"),
    ("--moe-router-fusion", "router"),
    ("--moe-permute-fusion", "permutation"),
    ("--moe-router-force-load-balancing", "even"),
    ("--mscale 1.0", "numerics"),
    ("--mscale-all-dim 1.0", "numerics"),
    ("--mtp-loss-scaling-factor 0.1", "numerics"),
    ("--enable-experimental", "experimental"),
    ("--override-opt_param-scheduler", "optimizer"),
    ("--no-ckpt-fully-parallel-save", "checkpointing"),
    ("--use-persistent-ckpt-worker", "checkpointing"),
])
def test_options_without_an_effect_on_the_step_are_ignored_with_their_reason(tmp_path, option,
                                                                              reason):
    # they were "not read" (or --data-impl, which Megatron-LM had too, labelled Megatron-
    # DeepSpeed's); each changes no cost perfmodel models (perfmodel.costs.moe costs the
    # router's scoring and the permutation by the bytes they move, whichever kernel)
    job = read_config(write(tmp_path, ARGS + "--bf16 " + option, "a.txt"))
    name = option.split()[0]
    found = [s for s in job.ignored if s.key == name]
    assert found and reason in found[0].note and "DeepSpeed" not in found[0].note, job.report()


# --- launch forms -------------------------------------------------------------------------------

TORCHRUN = "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py " + ARGS + "--bf16"


@pytest.mark.parametrize("script", [
    f'PROFILE_CMD=()\n"${{PROFILE_CMD[@]}}" {TORCHRUN}\n',  # min/emptyarr.sh: an empty array
    'PROFILE_CMD=()\n"${PROFILE_CMD[@]}" '
    + TORCHRUN.replace("torchrun", "python -m torch.distributed.run") + "\n",
    f'VENV_PREFIX="uv run"\nPROFILE_CMD=()\n$VENV_PREFIX "${{PROFILE_CMD[@]}}" {TORCHRUN}\n',
    f"uv run {TORCHRUN}\n",  # min/uvtorchrun.sh: was read as launched by 'uv run'
    f"exec {TORCHRUN}\n",
    f"time nohup env A=1 {TORCHRUN}\n",
    f"EXTRA=()\n{TORCHRUN} \"${{EXTRA[@]}}\"\n",
], ids=["empty array", "empty array, torch.distributed.run", "uv run and an empty array",
        "uv run", "exec", "time nohup env", "empty array after"])
def test_launch_wrappers_and_empty_arrays_before_torchrun(tmp_path, script):
    job, _, plan = plan_of(tmp_path, script)
    assert plan["gpus"] == 8 and not job.unknown


def test_an_unreadable_prefix_before_the_launcher_is_a_wrapper(tmp_path):
    # min/prefix2.sh: VENV_PREFIX is "uv run" or "" by an if; the launch was not found at all
    script = ('if [ "${USE_UV:-1}" = 1 ]; then\n  VENV_PREFIX="uv run"\nelse\n  VENV_PREFIX=""\n'
              "fi\n$VENV_PREFIX " + TORCHRUN.replace("torchrun", "python -m torch.distributed.run")
              + "\n")
    job, _, plan = plan_of(tmp_path, script)
    assert plan["gpus"] == 8
    assert any("$VENV_PREFIX" in n and "wrapper" in n for n in job.notes)


def test_eval_of_a_command_string_is_the_launch(tmp_path):
    # min/evalrun.sh, Megatron-DeepSpeed's ds_pretrain_gpt_*.sh: run_cmd="deepspeed ... &> log";
    # eval ${run_cmd}: eval reads its words as shell code again, operators and all
    script = ('LOG=`pwd`/x.log\nrun_cmd="deepspeed --num_gpus 8 pretrain_gpt.py ' + ARGS
              + '--fp16 --deepspeed &> ${LOG}"\necho ${run_cmd}\neval ${run_cmd}\nset +x\n')
    job, _, plan = plan_of(tmp_path, script)
    assert plan["gpus"] == 8 and not job.unknown


@pytest.mark.parametrize("script, needle", [
    ('torchrun pretrain_gpt.py "${EXTRA[@]}"\n', r"\$\{EXTRA\[@\]\} cannot be read: not set"),
    ('if [ x ]; then\n  EXTRA=(--bf16)\nfi\ntorchrun pretrain_gpt.py "${EXTRA[@]}"\n',
     r"\$\{EXTRA\[@\]\} cannot be read: set inside an if"),
])
def test_a_quoted_array_perfmodel_cannot_read_is_refused_by_name(tmp_path, script, needle):
    with pytest.raises(SpecError, match=needle):
        read_config(write(tmp_path, script))
    job = read_config(write(tmp_path, 'torchrun pretrain_gpt.py ' + ARGS + '--bf16 "$@"\n'))
    assert any("$@" in n for n in job.notes) and not job.unknown


@pytest.mark.parametrize("text", [
    '8 deepspeed pretrain_gpt.py " $( " % 0:1 & A=(1 2) < " > 2>&1 fi " x ( if',
    '$1 " - A=(1 2) $(( / $X + then % \\\\ " then X=1 pretrain_gpt.py then @ ` sh ` ` x',
])
def test_a_quote_a_substitution_leaves_open_is_a_spec_error(tmp_path, text):
    # found by a fuzz of the command splitting: a '$(' inside double quotes took their closing
    # quote with it, and shlex's ValueError was an internal error
    with pytest.raises(SpecError):
        read_config(write(tmp_path, text))
