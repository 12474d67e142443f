"""The Megatron-LM reader refuses what Megatron-LM refuses at start-up, and what perfmodel does
not model, in one line; and accepts what Megatron runs with no effect (perfmodel.configs.megatron,
job.capacity for the YAML readers). Sources: NVIDIA/Megatron-LM at d98e8a64dd,
megatron/core/transformer/transformer_config.py (its fields are Megatron-LM's options through
ArgumentGroupFactory; their checks in __post_init__), megatron/core/fp8_utils.py and
megatron/training/arguments.py (validate_args)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfmodel.configs import read_config
from perfmodel.errors import PlanError
from tests.unit.test_megatron_moe_flags import keys, read

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"
MOE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
       "--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 "
       "--global-batch-size 8 --bf16 --swiglu --position-embedding-type rope "
       "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 "
       "--moe-token-dispatcher-type alltoall --moe-grouped-gemm "
       "--expert-model-parallel-size 8 ")
FP8 = "--fp8-format hybrid --fp8-recipe tensorwise "
CAPACITY = {"num_moe_experts": 8, "moe_router_topk": 2, "moe_token_dispatcher_type": "alltoall",
            "moe_grouped_gemm": True, "moe_router_load_balancing_type": "sinkhorn",
            "moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True}




# --- FP8 layers kept in bf16 ---------------------------------------------------------------------


@pytest.mark.parametrize("extra, match", [
    # fp8_utils.py is_first_last_bf16_layer: the first and last layers' GEMMs in bf16; the
    # NeMo reader refuses the same setting (nemo.py)
    (FP8 + "--first-last-layers-bf16 --num-layers-at-start-in-bf16 2 "
           "--num-layers-at-end-in-bf16 2",
     "--first-last-layers-bf16: FP8 layers kept in bf16 are not modelled"),
    (FP8 + "--first-last-layers-bf16", "the first 1 and the last 1"),  # TransformerConfig's 1
    # transformer_config.py __post_init__ raises with delayed scaling
    ("--fp8-format hybrid --fp8-recipe delayed --first-last-layers-bf16",
     "Megatron-Core raises 'Delayed scaling does not support first / last layer in BF16'"),
    ("--fp8-format hybrid --first-last-layers-bf16 --num-layers-at-start-in-bf16 0 "
     "--num-layers-at-end-in-bf16 0", "Delayed scaling"),  # delayed: the default recipe
])
def test_fp8_layers_kept_in_bf16_are_refused(tmp_path, extra, match):
    with pytest.raises(PlanError, match=match):
        read(tmp_path, MOE + extra)


def test_layers_in_bf16_without_fp8_or_without_the_flag_have_no_effect(tmp_path):
    options = {"--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
               "--num-layers-at-end-in-bf16"}
    job = read(tmp_path, MOE + "--first-last-layers-bf16 --num-layers-at-start-in-bf16 2 "
                               "--num-layers-at-end-in-bf16 2")
    assert job.plan["dtype"] == "bf16" and options <= keys(job.read) and not job.unknown
    assert all("no effect without FP8" in s.note for s in job.read if s.key in options)
    job = read(tmp_path, MOE + FP8 + "--num-layers-at-start-in-bf16 2")
    assert job.plan["dtype"] == "fp8" and not job.unknown
    job = read(tmp_path, MOE + FP8 + "--first-last-layers-bf16 --num-layers-at-start-in-bf16 0 "
                                     "--num-layers-at-end-in-bf16 0")
    assert job.plan["dtype"] == "fp8" and not job.unknown


# --- an expert capacity beside sinkhorn load balancing, in the YAML readers --------------------


def test_bridge_capacity_beside_sinkhorn_is_refused(tmp_path):
    # transformer_config.py __post_init__: 'moe_expert_capacity_factor only works with
    # aux_loss, seq_aux_loss, global_aux_loss or none load balancing'
    data = yaml.safe_load((DATA / "bridge_llama3_8b.yaml").read_text())
    data["model"].update(CAPACITY, expert_model_parallel_size=8)
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError, match="model.moe_expert_capacity_factor 1.0: Megatron-Core "
                       "raises .*\\(model.moe_router_load_balancing_type sinkhorn\\)"):
        read_config(path)
    data["model"]["moe_router_load_balancing_type"] = ["seq_aux_loss", "global_aux_loss"]
    path.write_text(yaml.safe_dump(data))
    assert read_config(path).model["capacity_factor"] == 1.0


def test_nemo1_capacity_beside_sinkhorn_is_refused(tmp_path):
    data = yaml.safe_load((DATA / "nemo1_nemotron4_15b.yaml").read_text())
    data["model"].update(CAPACITY, expert_model_parallel_size=2)
    path = tmp_path / "nemo1.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError, match="\\(model.moe_router_load_balancing_type sinkhorn\\)"):
        read_config(path)


def test_megatron_capacity_beside_sinkhorn_is_refused_whatever_the_factors_sign(tmp_path):
    # Megatron-Core checks the load balancing before it sets a negative factor to None
    with pytest.raises(PlanError, match="--moe-expert-capacity-factor -1: Megatron-Core raises"):
        read(tmp_path, MOE + "--moe-expert-capacity-factor -1 "
                             "--moe-router-load-balancing-type sinkhorn")


# --- the token dispatcher and the flex dispatcher's backend ------------------------------------


@pytest.mark.parametrize("extra, match", [
    # argparse choices (TransformerConfig's Literal): all2all was read as alltoall
    ("--moe-token-dispatcher-type all2all",
     "--moe-token-dispatcher-type all2all: one of allgather, alltoall, flex"),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend bogus",
     "--moe-flex-dispatcher-backend bogus: one of deepep, hybridep, ncclep"),
    # token_dispatcher.py _NCCLEPManager: NCCL EP's dispatch, not DeepEP's
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep",
     "--moe-flex-dispatcher-backend ncclep: NCCL EP's dispatch is not modelled"),
    # transformer_config.py __post_init__ raises on each of these
    ("--moe-flex-dispatcher-backend ncclep", "requires moe_token_dispatcher_type='flex'"),
    ("--moe-enable-deepep", "'DeepEP backend is only supported with flex token dispatcher'"),
    ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep "
     "--moe-enable-deepep", "'Only one backend is supported for flex token dispatcher'"),
])
def test_dispatchers_megatron_refuses_or_perfmodel_does_not_model_are_refused(
        tmp_path, extra, match):
    with pytest.raises(PlanError, match=match):
        read(tmp_path, MOE.replace("--moe-token-dispatcher-type alltoall ", "") + extra)


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_a_flex_backend_beside_alltoall_has_no_effect(tmp_path, backend):
    job = read(tmp_path, MOE + f"--moe-flex-dispatcher-backend {backend}")
    setting = next(s for s in job.read if s.key == "--moe-flex-dispatcher-backend")
    assert "no effect with the alltoall dispatcher" in setting.note
    assert "ep_dispatcher" not in job.plan
    flex = read(tmp_path, MOE.replace("alltoall", "flex")
                + f"--moe-flex-dispatcher-backend {backend}")
    assert flex.plan["ep_dispatcher"] == "deepep"


# --- hierarchical context parallelism at cp 1 --------------------------------------------------


def test_a2a_p2p_at_cp_1_has_no_effect(tmp_path):
    # Transformer Engine takes cp_comm_type only with cp > 1 (extensions/transformer_engine.py);
    # Megatron-LM asserts the hierarchical sizes beside a2a+p2p and their product is cp
    job = read(tmp_path, MOE + "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 1")
    notes = {s.key: s.note for s in job.read}
    assert notes["--cp-comm-type"] == "no effect with cp 1" and not job.unknown
    assert job.plan["cp"] == 1 and "cp" in job.pins
    with pytest.raises(PlanError, match="Megatron-LM asserts '--hierarchical-context-parallel"):
        read(tmp_path, MOE + "--cp-comm-type a2a+p2p")
    with pytest.raises(PlanError, match="--hierarchical-context-parallel-sizes 2 2: Megatron-LM "
                                        "asserts their product"):
        read(tmp_path, MOE + "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2")


# --- selective recompute's modules that Megatron-Core raises on --------------------------------


@pytest.mark.parametrize("text, match", [
    (MOE.replace("--moe-grouped-gemm ", "") + "--recompute-granularity selective "
     "--recompute-modules moe_act", "'moe_act in recompute_modules is only supported with "
     "moe_grouped_gemm'"),
    (MOE + "--recompute-granularity selective --recompute-modules moe_act layernorm "
     "--fp8-format hybrid --fp8-recipe delayed",
     "'Delayed scaling does not support moe_act and layernorm recompute for fp8'"),
    (MOE + "--recompute-granularity selective --recompute-modules layernorm --fp8-format e4m3",
     "Delayed scaling does not support"),  # delayed: the default recipe
])
def test_recompute_modules_megatron_core_raises_on_are_refused(tmp_path, text, match):
    with pytest.raises(PlanError, match=match):
        read(tmp_path, text)


def test_moe_act_recompute_with_grouped_gemm_and_current_scaling_is_read(tmp_path):
    job = read(tmp_path, MOE + FP8 + "--recompute-granularity selective "
                                     "--recompute-modules moe_act layernorm")
    assert job.plan["recompute_modules"] == "moe_act,layernorm"


# --- an FP8 format Megatron-LM does not take ----------------------------------------------------


def test_e5m2_is_refused_naming_megatrons_choices(tmp_path):
    # --fp8-format's argparse choices are e4m3 and hybrid (hybrid's gradients are E5M2); an
    # invalid choice of a plan option is a PlanError, as --fp8-format hybird, --DDP-impl and
    # --cuda-graph-impl are (exit 4)
    with pytest.raises(PlanError, match="--fp8-format e5m2: e4m3 or hybrid \\(Megatron-Core's "
                                        "choices; hybrid takes E5M2 for the gradients\\)"):
        read(tmp_path, MOE + "--fp8-format e5m2")
