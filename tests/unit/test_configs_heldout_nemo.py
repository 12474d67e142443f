"""NeMo 1, NeMo 2 / Megatron-Bridge and torchtitan job configs as the frameworks' own examples
write them (the NeMo Framework Launcher's, NeMo's example configs, Megatron-Bridge's override
examples, torchtitan's train configs), each read as the framework runs it: regressions found by
running configs the readers had not seen."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.errors import PlanError, SpecError
from tests.conftest import ROOT

NEMO1 = ROOT / "tests/data/configs/nemo1_nemotron4_15b.yaml"
NEMO2 = ROOT / "tests/data/configs/nemo2_llama3_8b.yaml"


def _write(tmp_path, data: dict[str, Any], name: str = "job.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _nemo1(tmp_path, *, trainer: dict[str, Any] | None = None, optim: dict[str, Any] | None = None,
           data: dict[str, Any] | None = None, drop: tuple[str, ...] = (), **model: Any):
    """The development set's NeMo 1 config (Nemotron-4 15B) with the model's fields changed
    (drop: the model's fields left out), read."""
    config = yaml.safe_load(NEMO1.read_text())
    config["trainer"].update(trainer or {})
    config["model"]["optim"].update(optim or {})
    config["model"]["data"].update(data or {})
    config["model"].update(model)
    for key in drop:
        config["model"].pop(key, None)
    return read_config(_write(tmp_path, config))


def _spec(tmp_path, **changes: Any):
    """A model spec of the development set's Nemotron-4 15B (its tokenizer file gives the
    vocabulary, so a NeMo 1 config of it needs --model), rotating half of each head as its
    config's rotary_percentage 0.5."""
    spec = dict(kind="transformer", layers=32, hidden=6144, heads=48, kv_heads=8,
                ffn_hidden=24576, seq_len=4096, vocab=256000, tied_embeddings=False, bias=False,
                position_embedding="rotary", norm="layernorm", gated_mlp=False,
                hidden_dropout=0.0, attention_dropout=0.0, rotary_fraction=0.5, **changes)
    path = tmp_path / "nemotron4-15b.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _lines(job) -> str:
    return "\n".join(job.report())


def test_nemos_own_sum_resolver_is_resolved(tmp_path):
    # NVIDIA/NeMo examples/nlp/language_modeling/conf/megatron_gpt_config.yaml (8cfedd7):
    # cpu_offloading_num_layers ${sum:${.num_layers},-1}, NeMo's resolver (hydra_runner.py)
    job = _nemo1(tmp_path, cpu_offloading=False,
                 cpu_offloading_num_layers="${sum:${.num_layers},-1}",
                 ffn_hidden_size="${multiply:4, ${.hidden_size}}")
    assert job.model["ffn_hidden"] == 4 * 6144
    assert "model.cpu_offloading_num_layers 31" in _lines(job)


def test_stock_zero_partial_checkpoints_under_full_recompute_are_none(tmp_path):
    # the NeMo Framework Launcher's llama2_70b with activations_checkpoint_granularity full:
    # num_micro_batches_with_partial_activation_checkpoints 0 and
    # activations_checkpoint_layers_per_pipeline 0 (or null) checkpoint nothing partially
    full = dict(activations_checkpoint_granularity="full", activations_checkpoint_method="block",
                activations_checkpoint_num_layers=2)
    for stock in (0, None):
        job = _nemo1(tmp_path, **full,
                     num_micro_batches_with_partial_activation_checkpoints=stock,
                     activations_checkpoint_layers_per_pipeline=stock)
        assert (job.plan["recompute"], job.plan["recompute_method"]) == ("full", "block")
        assert "no effect without a checkpoint granularity" not in _lines(job)
    with pytest.raises(PlanError, match="num_micro_batches_with_partial_activation_checkpoints 2"):
        _nemo1(tmp_path, **full, num_micro_batches_with_partial_activation_checkpoints=2)


@pytest.mark.parametrize("devices", [-1, "auto"])
def test_trainer_devices_of_every_gpu_take_the_world_from_gpus(tmp_path, devices):
    # Lightning's devices -1 / auto: every GPU of each node, which the launcher knows
    job = _nemo1(tmp_path, trainer={"devices": devices, "num_nodes": 16})
    assert job.gpus is None
    _, plan = resolve_plan(job, resolve_model(job, str(_spec(tmp_path)), None), {"gpus": 128})
    assert (plan["gpus"], plan["dp"]) == (128, 32)
    config = yaml.safe_load(NEMO2.read_text())
    config["trainer"]["devices"] = devices
    job = read_config(_write(tmp_path, config))
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 16})
    assert plan["gpus"] == 16
    with pytest.raises(PlanError, match="give --gpus"):
        resolve_plan(job, resolve_model(job, None, None), {})


def test_the_sequence_is_the_datas_where_encoder_seq_length_differs(tmp_path):
    # the NeMo Framework Launcher's mistral_7b (26e42fa): encoder_seq_length 4096, data.seq_length
    # 2048; NeMo builds its samples data.seq_length long (megatron_gpt_model.py)
    job = _nemo1(tmp_path, encoder_seq_length=8192, max_position_embeddings=8192)
    assert job.model["seq_len"] == 4096
    assert "differs from model.data.seq_length 4096" in _lines(job)
    assert "pipeline's sends" not in _lines(job)
    job = _nemo1(tmp_path, encoder_seq_length=8192, max_position_embeddings=8192,
                 pipeline_model_parallel_size=2)
    assert "with pp 2 NeMo sizes the pipeline's sends" in _lines(job)
    job = _nemo1(tmp_path)  # the same length: encoder_seq_length's, as before
    assert job.model["seq_len"] == 4096 and "model.encoder_seq_length 4096: seq_len" in _lines(job)
    job = _nemo1(tmp_path, data={"seq_length": None})
    assert job.model["seq_len"] == 4096


def test_qkv_bias_and_override_vocab_size_are_the_models(tmp_path):
    # the NeMo Framework Launcher's qwen2_72b: bias false, qkv_bias true, override_vocab_size
    # 152064 (NeMo's model takes it as given, unpadded: megatron_gpt_model.py)
    job = _nemo1(tmp_path, qkv_bias=True, override_vocab_size=152064)
    assert (job.model["bias"], job.model["qkv_bias"], job.model["vocab"]) == (False, True, 152064)
    assert not job.needs_model
    model, _ = resolve_plan(job, resolve_model(job, None, None), {})
    assert model.vocab == 152064 and model.qkv_bias  # not padded to a multiple of 128 x tp
    assert "model.make_vocab_size_divisible_by 128: no effect beside override_vocab_size" \
        in _lines(job)
    assert "model.qkv_bias" not in "\n".join(s.line() for s in job.unknown)
    job = _nemo1(tmp_path, qkv_bias=False)
    assert job.model["qkv_bias"] is False


def test_megatron_cores_distributed_optimizer_takes_no_dtype_from_nemo(tmp_path):
    # the NeMo Framework Launcher's nemotron_340b: mcore_distributed_optim with dtype bf16,
    # overlap_param_sync true; NeMo's setup_megatron_optimization passes no dtype to
    # Megatron-Core's OptimizerConfig, and its DDP gathers behind the forward with
    # optim.overlap_param_sync since NeMo v2.1.0 (megatron_gpt_model.py
    # setup_mcore_distributed_parallel, NVIDIA/NeMo bd618ccb29)
    optim = {"name": "mcore_distributed_optim", "dtype": "bf16", "overlap_param_sync": True}
    job = _nemo1(tmp_path, optim=optim)
    assert "optimizer_dtype" not in job.plan and "master_weights" not in job.plan
    assert job.plan["zero"] == 1 and job.plan["overlap_param_gather"] is True
    assert "NeMo passes no dtype to Megatron-Core's OptimizerConfig" in _lines(job)
    job = _nemo1(tmp_path, optim=dict(optim, overlap_param_gather=True))
    assert job.plan["overlap_param_gather"] is True
    job = _nemo1(tmp_path, optim={"dtype": "bf16"})  # Apex's: bf16 moments, as before
    assert job.plan["optimizer_dtype"] == "bf16"


def test_a_plain_adam_is_said_to_be_zero_0(tmp_path):
    job = _nemo1(tmp_path, optim={"name": "fused_adam"})
    assert job.plan["zero"] == 0
    assert "model.optim.name fused_adam: zero 0" in _lines(job)
    assert "zero 1" not in _lines(job)


def test_megatron_cores_local_layers_attend_unfused(tmp_path):
    # NVIDIA/NeMo megatron_gpt_config.yaml (8cfedd7): mcore_gpt True, transformer_engine False:
    # NeMo builds get_gpt_layer_local_spec's layers, whose DotProductAttention is unfused
    local = dict(transformer_engine=False, ub_tp_comm_overlap=False)
    job = _nemo1(tmp_path, **local, use_flash_attention=False)
    assert job.plan["flash_attention"] is False and job.plan["kernels"] == "fused"
    text = _lines(job)
    assert "model.transformer_engine False: Megatron-Core's local layers" in text
    assert "Transformer Engine's fused or flash attention" not in text
    assert "model.use_flash_attention False: no effect on Megatron-Core's local layers" in text
    _, plan = resolve_plan(job, resolve_model(job, str(_spec(tmp_path)), None),
                           {"flash_attention": False})  # --attention unfused agrees
    assert plan["flash_attention"] is False
    job = _nemo1(tmp_path, ub_tp_comm_overlap=False,
                 drop=("transformer_engine",))  # NeMo's default: false
    assert job.plan["flash_attention"] is False
    assert "model.transformer_engine not given: NeMo's default, false" in _lines(job)
    with pytest.raises(PlanError, match="model.ub_tp_comm_overlap: Transformer Engine's"):
        _nemo1(tmp_path, transformer_engine=False, ub_tp_comm_overlap=True)
    assert _nemo1(tmp_path).plan["flash_attention"] is True  # Transformer Engine's, as before


MOE = dict(num_moe_experts=8, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
           override_vocab_size=256000)


def test_a_padded_expert_capacity_is_the_models_capacity_factor(tmp_path):
    # the NeMo Framework Launcher's mixtral_8x7b and grok1_proxy: moe_expert_capacity_factor
    # 1.0 with moe_pad_expert_input_to_capacity: Megatron-Core pads each expert's input to
    # ceil(c T k / E) rows (moe_utils.py), perfmodel's capacity_factor
    job = _nemo1(tmp_path, **MOE, moe_expert_capacity_factor=1.0,
                 moe_pad_expert_input_to_capacity=True, moe_token_drop_policy="probs")
    assert job.model["capacity_factor"] == 1.0 and not job.unknown
    model, _ = resolve_plan(job, resolve_model(job, None, None), {})
    assert model.capacity_factor == 1.0
    # with --model (the launcher's mixtral_8x7b with --model mixtral-8x7b): the capacity is the
    # run's, over the model's dropless default, not a model that differs
    spec = _spec(tmp_path, experts=8, top_k=2)
    assert resolve_model(job, str(spec), None).capacity_factor == 1.0
    with pytest.raises(PlanError, match="moe_expert_capacity_factor 1.0: dropping the tokens"):
        _nemo1(tmp_path, **MOE, moe_expert_capacity_factor=1.0,
               moe_pad_expert_input_to_capacity=False)
    job = _nemo1(tmp_path, **MOE, moe_expert_capacity_factor=None,
                 moe_pad_expert_input_to_capacity=False)
    assert "capacity_factor" not in job.model and not job.unknown
    # Megatron-Bridge's model fields alike
    text = (ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text().replace(
        "  num_moe_experts: null", "  num_moe_experts: 8\n  moe_router_topk: 2\n"
        "  moe_token_dispatcher_type: alltoall\n  moe_expert_capacity_factor: 1.5\n"
        "  moe_pad_expert_input_to_capacity: true")
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    assert read_config(path).model["capacity_factor"] == 1.5


def _nemo2(tmp_path, plugin: dict[str, Any] | None = None, ddp: dict[str, Any] | None = None,
           callbacks: list[Any] | None = None, **strategy: Any):
    """The NeMo 2 llama3_8b recipe YAML with its precision plugin's, DDP's and strategy's
    fields changed and callbacks added, read."""
    config = yaml.safe_load(NEMO2.read_text())
    trainer = config["trainer"]
    trainer["plugins"].update(plugin or {})
    trainer["strategy"]["ddp"].update(ddp or {})
    trainer["strategy"].update(strategy)
    if callbacks is not None:
        trainer["callbacks"] = callbacks
    return read_config(_write(tmp_path, config))


def test_nemo2_precision_plugin_gives_fp8_its_recipe_weights_and_gradient_dtype(tmp_path):
    # a NeMo 2 llama31_70b recipe with bf16_with_fp8_mixed: MegatronMixedPrecision's fp8,
    # fp8_recipe, fp8_params and grad_reduce_in_fp32 override the model's and the DDP's
    # (MegatronStrategy.connect, update_config_with_dtype_overrides)
    job = _nemo2(tmp_path, plugin={"fp8": "hybrid", "fp8_params": True})
    assert (job.plan["dtype"], job.plan["fp8_recipe"], job.plan["fp8_params"]) == (
        "fp8", "delayed", True)
    text = _lines(job)
    assert text.count("trainer.plugins.precision") == 1 and "False: dtype" not in text
    for recipe, read in (("tensorwise", "current"), ("mxfp8", "mxfp8"), ("delayed", "delayed")):
        job = _nemo2(tmp_path, plugin={"fp8": "e4m3", "fp8_recipe": recipe})
        assert (job.plan["fp8_recipe"], job.plan.get("fp8_params", False)) == (read, False)
    with pytest.raises(PlanError, match="trainer.plugins.fp8_recipe blockwise"):
        _nemo2(tmp_path, plugin={"fp8": "hybrid", "fp8_recipe": "blockwise"})
    # the plugin's grad_reduce_in_fp32 (default true) is the DDP's, whatever the DDP says
    assert _nemo2(tmp_path, plugin={"grad_reduce_in_fp32": False}).plan["grad_dtype"] == "bf16"
    job = _nemo2(tmp_path, ddp={"grad_reduce_in_fp32": False})
    assert job.plan.get("grad_dtype") in (None, "fp32")
    assert "trainer.strategy.ddp.grad_reduce_in_fp32 False: overridden by trainer.plugins" \
        in _lines(job)
    assert _nemo2(tmp_path).plan["dtype"] == "bf16"  # no fp8: bf16, as before


OVERLAP = "nemo.lightning.pytorch.callbacks.megatron_comm_overlap.MegatronCommOverlapCallback"


def test_nemo2_comm_overlap_callback_sets_the_overlaps(tmp_path):
    # NeMo 2's llama31_70b recipe: MegatronCommOverlapCallback(tp_comm_overlap=True) in
    # trainer.callbacks; it sets the model's tp_comm_overlap (with tp > 1 and sequence
    # parallelism) and, with the distributed optimizer and dp > 1, the DDP's overlaps
    # (megatron_comm_overlap.py), over theirs
    timing = {"_target_": "nemo.utils.exp_manager.TimingCallback"}
    tp4 = dict(tensor_model_parallel_size=4, sequence_parallel=True)
    job = _nemo2(tmp_path, callbacks=[timing, {"_target_": OVERLAP, "tp_comm_overlap": True}],
                 ddp={"overlap_grad_reduce": False, "overlap_param_gather": False}, **tp4)
    assert (job.plan["tp_comm_overlap"], job.plan["overlap_grad_sync"],
            job.plan["overlap_param_gather"]) == (True, True, True)  # dp 4 > 1
    text = _lines(job)
    assert "trainer.callbacks TimingCallback: not the step's" in text
    assert "trainer.strategy.ddp.overlap_grad_reduce False: overridden by" in text
    job = _nemo2(tmp_path, callbacks=[{"_target_": OVERLAP, "tp_comm_overlap": True,
                                       "overlap_param_gather": False}])  # tp 1: off
    assert (job.plan["tp_comm_overlap"], job.plan["overlap_param_gather"]) == (False, False)
    assert "the callback turns it off with tp 1" in _lines(job)
    job = _nemo2(tmp_path, callbacks=[{"_target_": OVERLAP}], **tp4)  # its defaults
    assert job.plan["tp_comm_overlap"] is False and job.plan["overlap_grad_sync"] is True
    job = _nemo2(tmp_path, callbacks=[{"_target_": "my.own.Callback"}])
    assert "trainer.callbacks Callback" in "\n".join(s.line() for s in job.unknown)


def test_nemo2_recipe_settings_are_each_read_or_said_why_not(tmp_path):
    # the optimizer's config whole (Megatron-Core's OptimizerConfig: its precision-aware
    # dtypes were dropped unread), the recipe's other sections each said why they do not count
    config = yaml.safe_load(NEMO2.read_text())
    config["optim"]["config"].update(use_precision_aware_optimizer=True,
                                     exp_avg_dtype="torch.bfloat16",
                                     exp_avg_sq_dtype="torch.bfloat16")
    config["optim"]["lr_scheduler"] = {"_target_": "CosineAnnealingScheduler", "min_lr": 3e-5}
    job = read_config(_write(tmp_path, config))
    assert job.plan["optimizer_dtype"] == "bf16"
    ignored = "\n".join(s.line() for s in job.ignored)
    for key in ("optim.config.lr 0.0003", "optim.lr_scheduler", "log.*", "resume.*",
                "data._target_", "model._target_"):
        assert key in ignored, key


# Megatron-Bridge's examples/recipes/llama/conf/llama3_8b_pretrain_override_example.yaml
# (47f330e), which the recipe script merges over llama3_8b_pretrain_config()
BRIDGE_OVERRIDE = {
    "model": {"seq_length": 4096},
    "train": {"train_iters": 20, "global_batch_size": 8, "micro_batch_size": 1, "eval_iters": 0},
    "optimizer": {"lr": 0.00025, "min_lr": 0.000025},
    "scheduler": {"lr_warmup_iters": 10},
    "checkpoint": {"save": None},
    "dist": {"use_megatron_fsdp": False, "use_torch_fsdp2": False},
    "dataset": {"sequence_length": 4096},
    "ddp": {"grad_reduce_in_fp32": True},
}


def test_a_bridge_override_file_states_only_what_it_overrides(tmp_path):
    job = read_config(_write(tmp_path, BRIDGE_OVERRIDE))
    model = resolve_model(job, "llama3-8b", None)  # no unstated default compared with it
    assert (model.gated_mlp, model.seq_len, model.layers) == (True, 4096, 32)
    _, plan = resolve_plan(job, model, {"gpus": 8, "tp": 2, "zero": 1})  # the recipe's, given
    assert (plan["tp"], plan["dp"], plan["global_batch"], plan["zero"]) == (2, 4, 8, 1)
    assert "dtype" not in plan  # perfmodel's default bf16, the recipes' bf16_mixed: not fp32
    assert "the recipe's settings it does not state" in _lines(job)
    with pytest.raises(SpecError, match="override file states only what it overrides.*--model"):
        resolve_model(job, None, None)
    # Moonlight's override (85d11b1): ddp.grad_reduce_in_fp32 false, bf16 gradients over the
    # recipe's bf16, not refused as needing --bf16
    moonlight = copy.deepcopy(BRIDGE_OVERRIDE)
    moonlight["ddp"]["grad_reduce_in_fp32"] = False
    assert read_config(_write(tmp_path, moonlight)).plan["grad_dtype"] == "bf16"
    # qwen3_moe_30b_a3b's (2d06bc3): the parallel sizes it states are pinned
    qwen = copy.deepcopy(BRIDGE_OVERRIDE)
    qwen["model"].update(tensor_model_parallel_size=4, pipeline_model_parallel_size=2,
                         sequence_parallel=True, expert_model_parallel_size=4,
                         expert_tensor_parallel_size=1)
    job = read_config(_write(tmp_path, qwen))
    model = resolve_model(job, "qwen3-30b-a3b", None)
    _, plan = resolve_plan(job, model, {"gpus": 32})
    assert (plan["tp"], plan["pp"], plan["ep"], plan["sequence_parallel"]) == (4, 2, 4, True)
    assert {"tp", "pp", "ep"} <= job.pins


def _bridge(tmp_path, **model: Any):
    """The Megatron-Bridge ConfigContainer dump of llama3_8b with the model's fields changed."""
    config = yaml.safe_load((ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text())
    config["model"].update(model)
    return read_config(_write(tmp_path, config))


def test_a_bridge_sliding_window_is_the_models(tmp_path):
    # Megatron-Bridge's gpt_oss_120b dump: window_size [127, 0] (Transformer Engine's left
    # window: 127 tokens and itself, Hugging Face's sliding_window 128 by the Bridge's own
    # mcore_to_hf_window_size), window_attn_skip_freq 2 (layers 2, 4, ... from 1 attend fully),
    # softmax_type learnable (GPT-OSS's sinks): gpt-oss-120b's spec
    job = _bridge(tmp_path, window_size=[127, 0], window_attn_skip_freq=2,
                  softmax_type="learnable")
    assert (job.model["sliding_window"], job.model["full_attention_every"],
            job.model["attention_sinks"]) == (128, 2, True)
    # over --model gpt-oss-120b (an override of its recipe's model): the same window, accepted
    override = copy.deepcopy(BRIDGE_OVERRIDE)
    override["model"].update(window_size=[127, 0], window_attn_skip_freq=2,
                             softmax_type="learnable")
    oss = resolve_model(read_config(_write(tmp_path, override)), "gpt-oss-120b", None)
    assert (oss.sliding_window, oss.full_attention_every, oss.attention_sinks) == (128, 2, True)
    assert oss.windowed_layers[:3] == (0, 2, 4)  # is_layer_window_attention(k=2): 1, 3, 5 from 1
    override["model"]["window_size"] = [255, 0]
    with pytest.raises(SpecError, match="sliding_window \\(256\\) differs"):
        resolve_model(read_config(_write(tmp_path, override)), "gpt-oss-120b", None)
    job = _bridge(tmp_path, window_size=[127, 0], window_attn_skip_freq=[1, 0] * 16)
    assert job.model["full_attention_every"] == 2
    assert _bridge(tmp_path, window_size=[4095, 0]).model["full_attention_every"] == 0
    assert "sliding_window" not in _bridge(tmp_path, window_size=None).model
    with pytest.raises(SpecError, match="window_size 127 3: perfmodel's attention is causal"):
        _bridge(tmp_path, window_size=[127, 3])


def test_a_bridge_models_vocab_size_wins_over_its_tokenizers(tmp_path):
    # the gpt_oss_120b dump's NullTokenizer (vocab_size 32000) beside model.vocab_size 201088:
    # Megatron-Bridge builds the model's (setup.py _validate_and_set_vocab_size)
    config = yaml.safe_load((ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text())
    config["tokenizer"] = {"tokenizer_type": "NullTokenizer", "vocab_size": 32000}
    assert read_config(_write(tmp_path, config)).model["vocab"] == config["model"]["vocab_size"]
    config["model"]["vocab_size"] = None
    assert read_config(_write(tmp_path, config)).model["vocab"] == 32000


def _toml(tmp_path, name: str, flavor: str, **parallelism: Any):
    lines = ["[model]", f'name = "{name}"', f'flavor = "{flavor}"', "[training]",
             "local_batch_size = 4", "seq_len = 4096", "[parallelism]",
             *(f"{k} = {json.dumps(v)}" for k, v in parallelism.items())]
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return read_config(path)


def test_torchtitan_experts_without_expert_parallelism_are_sharded_over_tp(tmp_path):
    # torchtitan's llama4 17bx16e (238fa99): expert_parallel_degree 1, tensor_parallel_degree 8;
    # apply_moe_ep_tp without an ep mesh shards each expert over tp (TensorParallel)
    spec = _write(tmp_path, dict(kind="transformer", layers=4, hidden=1024, heads=8, kv_heads=8,
                                 ffn_hidden=4096, seq_len=4096, vocab=32000, experts=16,
                                 top_k=1, gated_mlp=True), "moe.yaml")
    job = _toml(tmp_path, "llama4", "17bx16e", tensor_parallel_degree=8,
                expert_parallel_degree=1, expert_tensor_parallel_degree=8)
    _, plan = resolve_plan(job, resolve_model(job, str(spec), None), {"gpus": 64})
    assert (plan["tp"], plan.get("ep", 1), plan["etp"]) == (8, 1, 8)
    assert "(etp 8 with experts)" in _lines(job)
    job = _toml(tmp_path, "qwen3", "30B-A3B", tensor_parallel_degree=2)  # a flavor's experts
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 16})
    assert plan["etp"] == 2
    job = _toml(tmp_path, "qwen3", "30B-A3B", tensor_parallel_degree=2)
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 16, "etp": 1})
    assert plan["etp"] == 1  # the command line's
    job = _toml(tmp_path, "qwen3", "32B", tensor_parallel_degree=2)  # dense: none
    _, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 16})
    assert plan.get("etp", 1) == 1


def test_what_is_off_or_another_is_not_said_to_be_on(tmp_path):
    # the reviewer's outputs: "trainer.precision False: dtype bf16" beside the true line,
    # "moe_grouped_gemm False: the experts' GEMMs grouped", "fast-geglu: gated_mlp (SwiGLU)",
    # "enable_async_tensor_parallel False: tp_comm_overlap (...)", deepseek_v3 16B's
    # "maps llama3 and qwen3 flavors only" where 671B is mapped
    text = _lines(_nemo1(tmp_path, **MOE, moe_grouped_gemm=False, activation="fast-geglu",
                         bias_activation_fusion=True))
    assert text.count("trainer.precision") == 1 and "trainer.precision bf16: dtype bf16" in text
    assert "model.moe_grouped_gemm False: off" in text
    assert "model.activation fast-geglu: gated_mlp (geglu" in text and "(SwiGLU)" not in text
    text = _lines(_nemo1(tmp_path, trainer={"precision": 32}, optim={"grad_sync_dtype": "fp32"}))
    assert text.count("trainer.precision") == 1 and "dtype fp32" in text
    job = _toml(tmp_path, "llama3", "8B", enable_async_tensor_parallel=False)
    assert "parallelism.enable_async_tensor_parallel False: tp_comm_overlap false" in _lines(job)
    job = _toml(tmp_path, "deepseek_v3", "16B")
    assert "deepseek_v3 671B" in job.needs_model and "flavor 16B" in job.needs_model


def test_malformed_fields_are_refused_in_one_line(tmp_path):
    # benchmarks/fuzz_parsers.py: compile.components holding a list, a YAML key of null in a
    # Megatron-Bridge model section were internal errors (TypeError)
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[compile]\nenable = true\n'
                    'components = ["model", ["loss"]]\n')
    with pytest.raises(PlanError, match="compile.components"):
        read_config(path)
    config = yaml.safe_load((ROOT / "tests/data/configs/bridge_llama3_8b.yaml").read_text())
    config["model"][None] = {"x": 1}
    with pytest.raises(SpecError, match="model.None: a setting's name must be text"):
        read_config(_write(tmp_path, config))
