"""Megatron-LM's MoE options that change the step: read as Megatron-Core reads them, or refused
in one line (perfmodel.configs.megatron). Sources: NVIDIA/Megatron-LM at d98e8a64dd,
megatron/core/transformer/transformer_config.py (the moe_* fields, which
megatron/training/arguments.py turns into --moe-* options through ArgumentGroupFactory, and
their checks in __post_init__) and megatron/core/transformer/moe/ (router.py, token_dispatcher.py,
shared_experts.py, experts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan
from perfmodel.configs.megatron import megatron_arguments
from perfmodel.errors import PlanError, SpecError
from perfmodel.strategy import plan_from_dict

MOE = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 "
       "--global-batch-size 8 --bf16 --swiglu --position-embedding-type rope "
       "--num-experts 8 --moe-router-topk 2 "
       "--moe-ffn-hidden-size 512 --moe-token-dispatcher-type alltoall "
       "--expert-model-parallel-size 8 ")
CAPACITY = "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity "


def read(tmp_path: Path, text: str):
    path = tmp_path / "a.txt"
    path.write_text(text)
    return read_config(path)


def keys(settings) -> set[str]:
    return {s.key for s in settings}


def test_a_padded_expert_capacity_is_the_models_capacity_factor(tmp_path):
    # transformer_config.py moe_expert_capacity_factor / moe_pad_expert_input_to_capacity /
    # moe_token_drop_policy (d98e8a64dd); router.py topk_softmax_with_capacity and
    # token_dispatcher.py MoEAlltoAllTokenDispatcher pad each expert's input to get_capacity
    # (moe_utils.py): read as the NeMo reader reads the same fields (job.capacity)
    job = read(tmp_path, MOE + CAPACITY + "--moe-token-drop-policy position")
    assert job.model["capacity_factor"] == 1.25 and not job.unknown
    assert {"--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity"} \
        <= keys(job.read)
    assert "--moe-token-drop-policy" in keys(job.ignored)
    spec, plan = resolve_plan(job, resolve_model(job, None, None), {"gpus": 8})
    assert spec.capacity_factor == 1.25
    # written back as read (megatron_arguments)
    args = [a for group in megatron_arguments(spec, plan_from_dict(plan).check(spec))
            for a in group]
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.25"
    assert "--moe-pad-expert-input-to-capacity" in args


def test_a_negative_capacity_factor_is_dropless(tmp_path):
    # transformer_config.py __post_init__ (d98e8a64dd): a factor < 0 is set to None
    job = read(tmp_path, MOE + "--moe-expert-capacity-factor -1")
    assert "capacity_factor" not in job.model and not job.unknown


@pytest.mark.parametrize("extra, match", [
    # a factor without the padding drops the tokens over it (moe_utils.py
    # topk_softmax_with_capacity, pad_to_capacity False): not modelled, as the NeMo reader says
    ("--moe-expert-capacity-factor 1.0", "--moe-expert-capacity-factor 1.0: dropping the tokens"),
    # transformer_config.py __post_init__ (d98e8a64dd) raises on each of these
    ("--moe-pad-expert-input-to-capacity",
     "--moe-pad-expert-input-to-capacity: Megatron-Core raises 'moe_expert_capacity_factor must"),
    (CAPACITY + "--moe-router-load-balancing-type sinkhorn",
     "--moe-expert-capacity-factor 1.25: Megatron-Core raises 'moe_expert_capacity_factor only "
     "works with aux_loss"),
])
def test_what_megatron_core_raises_on_or_drops_is_refused(tmp_path, extra, match):
    with pytest.raises(PlanError, match=match):
        read(tmp_path, MOE + extra)


@pytest.mark.parametrize("backend, match", [
    # transformer_config.py (d98e8a64dd): "Flex token dispatcher with deepep backend does not
    # support moe_pad_expert_input_to_capacity"
    ("deepep", "Megatron-Core raises: the flex dispatcher's deepep backend does not pad"),
    # token_dispatcher.py _HybridEPManager pads (drop_and_pad); perfmodel's flex is dropless
    ("hybridep", "perfmodel models the flex dispatcher .* dropless"),
])
def test_a_capacity_with_the_flex_dispatcher_is_refused(tmp_path, backend, match):
    text = MOE.replace("alltoall", "flex") + f"--moe-flex-dispatcher-backend {backend} "
    with pytest.raises(PlanError, match=match):
        read(tmp_path, text + CAPACITY)


def test_moe_layer_recompute_is_refused_as_recompute_modules_moe(tmp_path):
    # transformer_config.py __post_init__ (d98e8a64dd): --moe-layer-recompute is selective
    # recompute with "moe" among the modules, and raises beside full granularity
    with pytest.raises(PlanError, match="--moe-layer-recompute: recomputing a whole MoE layer"):
        read(tmp_path, MOE + "--moe-layer-recompute")
    with pytest.raises(PlanError, match="--recompute-modules moe: recomputing a whole MoE layer"):
        read(tmp_path, MOE + "--recompute-granularity selective --recompute-modules moe")
    with pytest.raises(PlanError, match="Megatron-Core raises 'Do not set --moe-layer-recompute"):
        read(tmp_path, MOE + "--moe-layer-recompute --recompute-granularity full "
                             "--recompute-method uniform")


def test_the_shared_experts_overlap_is_refused_with_a_shared_expert(tmp_path):
    # shared_experts.py (d98e8a64dd): with --moe-shared-expert-overlap the shared expert runs
    # on a side stream behind the dispatch; "only effective when
    # moe-shared-expert-intermediate-size is set" (transformer_config.py)
    with pytest.raises(PlanError, match="--moe-shared-expert-overlap: the shared expert"):
        read(tmp_path, MOE + "--moe-shared-expert-intermediate-size 512 "
                             "--moe-shared-expert-overlap")
    job = read(tmp_path, MOE + "--moe-shared-expert-overlap")
    assert "--moe-shared-expert-overlap" in keys(job.read) and not job.unknown


@pytest.mark.parametrize("extra, error, match", [
    # experts.py (d98e8a64dd): moe_apply_probs_on_input weights the experts' input
    ("--moe-apply-probs-on-input", PlanError, "routing weights applied to the experts' input"),
    # transformer_config.py moe_latent_size: latent projections around the experts
    ("--moe-latent-size 256", SpecError, "latent projections are not modelled"),
    # transformer_config.py moe_expert_rank_capacity_factor: HybridEP's per-rank token budget
    ("--moe-expert-rank-capacity-factor 1.5", PlanError, "a per-rank token budget"),
])
def test_moe_options_perfmodel_does_not_model_are_refused(tmp_path, extra, error, match):
    with pytest.raises(error, match=match):
        read(tmp_path, MOE + extra)


def test_the_other_moe_options_are_said_not_unknown(tmp_path):
    # router.py apply_input_jitter, shared_experts.py gate, and options of the same cost
    # (transformer_config.py at d98e8a64dd)
    job = read(tmp_path, MOE + "--moe-input-jitter-eps 0.01 --moe-per-layer-logging "
                               "--moe-use-grouped-tensor --moe-grouped-gemm "
                               "--moe-pad-experts-for-cuda-graph-inference")
    assert not job.unknown
    assert any(n.startswith("--moe-input-jitter-eps 0.01: ") for n in job.notes)
    assert {"--moe-per-layer-logging", "--moe-use-grouped-tensor",
            "--moe-pad-experts-for-cuda-graph-inference"} <= keys(job.ignored)
