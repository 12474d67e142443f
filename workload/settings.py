"""The job's context- and expert-parallel settings and the rules a plan with them obeys.

Standard library only: validation checks a plan before it starts torch. Plan keys (the job's JSON
config): ``cp`` (context-parallel degree), ``cp_comm`` (how attention communicates across the cp
ranks: CPComm), ``ep`` (expert-parallel degree), ``etp`` (expert tensor parallelism: each routed
expert split over etp of the tp ranks) and ``moe_routing`` (MoERouting). The model keys of a
mixture of experts: workload.model.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class CPComm(StrEnum):
    """Attention across the cp ranks (Megatron-Core's cp_comm_type): workload.context_parallel."""

    P2P = "p2p"  # ring attention: K/V passed round the ring by send/recv
    ALLGATHER = "allgather"  # K/V all-gathered, dK/dV reduce-scattered
    A2A = "a2a"  # Ulysses: all-to-alls swap sequence shards for head shards


class MoERouting(StrEnum):
    """How tokens choose experts: workload.moe."""

    LEARNED = "learned"  # the router's top-k
    BALANCED = "balanced"  # assignment n to expert n mod E (exchange sizes known from shapes)


def _options(enum: type[StrEnum]) -> str:
    return ", ".join(e.value for e in enum)


# the modules of selective recompute the job builds (perfmodel.strategy.RECOMPUTE_MODULES'
# names; workload.model.build_chunk)
JOB_RECOMPUTE_MODULES = ("core_attn", "mlp", "shared_experts")


def check_parallel(m: dict[str, Any], plan: dict[str, Any]) -> str | None:
    """The first rule a cp / ep setting breaks, as one line naming the field; None if none."""
    cp, ep, tp = plan.get("cp", 1), plan.get("ep", 1), plan.get("tp", 1)
    experts = m.get("experts", 0)
    comm, routing = plan.get("cp_comm", "p2p"), plan.get("moe_routing", "learned")
    if not isinstance(cp, int) or cp < 1:
        return f"cp must be a positive integer, got {cp!r}"
    if not isinstance(ep, int) or ep < 1:
        return f"ep must be a positive integer, got {ep!r}"
    if comm not in {e.value for e in CPComm}:
        return f"cp_comm must be one of {_options(CPComm)}, got {comm!r}"
    if routing not in {e.value for e in MoERouting}:
        return f"moe_routing must be one of {_options(MoERouting)}, got {routing!r}"
    if cp > 1 and m["seq_len"] % (2 * cp):
        return (f"seq_len ({m['seq_len']}) must be divisible by 2 cp ({2 * cp}): each cp rank "
                "holds two load-balanced chunks of every sequence")
    if tp > 1 and (m["heads"] % tp or m["kv_heads"] % tp):
        return (f"the job splits the attention heads over tp: heads ({m['heads']}) and kv_heads "
                f"({m['kv_heads']}) must be multiples of tp ({tp}) (it does not replicate "
                "key/value heads, as perfmodel's model allows for tp a multiple of kv_heads)")
    heads, kv_heads = m["heads"] // tp, m["kv_heads"] // tp
    if cp > 1 and comm == CPComm.A2A and (heads % cp or kv_heads % cp):
        return (f"cp_comm a2a (Ulysses) needs heads / tp ({heads}) and kv_heads / tp "
                f"({kv_heads}) divisible by cp ({cp})")
    if ep > 1 and not experts:
        return "ep applies to a mixture-of-experts model: the model has no experts"
    if experts and experts % ep:
        return f"ep ({ep}) must divide the experts ({experts})"
    etp = plan.get("etp", 1)
    if not isinstance(etp, int) or etp < 1:
        return f"etp must be a positive integer, got {etp!r}"
    if etp > 1 and not experts:
        return "etp applies to a mixture-of-experts model: the model has no experts"
    if tp % etp:
        return (f"etp ({etp}) must divide tp ({tp}): each expert is split over etp of the tp "
                "ranks")
    width = m.get("expert_ffn_hidden") or m.get("ffn_hidden", 0)
    if etp > 1 and width % etp:
        return (f"etp ({etp}) must divide expert_ffn_hidden ({width}): each expert's FFN is "
                "split over the etp ranks")
    if etp > 1 and m.get("bias"):
        return (f"etp ({etp}) with a model with biases (bias true): the job, as Megatron-Core "
                "(TransformerConfig: 'Bias in Moe is only supported when ETP==1'), gives its "
                "experts biases only with etp 1")
    if (ep > 1 or etp > 1) and (tp * plan["dp"] * cp) % (ep * etp):
        degree = f"ep ({ep})" if etp == 1 else f"ep x etp ({ep} x {etp} = {ep * etp})"
        return (f"{degree} must divide tp x dp x cp ({tp * plan['dp'] * cp}): the experts are "
                "sharded over a stage's ranks, tp innermost (Megatron-Core's expert rank order)")
    if experts and tp > 1 and not plan.get("sequence_parallel", False):
        return (f"a mixture of experts with tp > 1 ({tp}) needs sequence_parallel (Megatron-Core "
                "requires it: each tp rank routes its own share of the sequence)")
    if plan.get("zero", 0) == 3 and (cp > 1 or (experts and tp > 1)):
        refused = f"cp ({cp})" if cp > 1 else f"a mixture of experts under tp ({tp})"
        return (f"zero 3 with {refused}: the job's FSDP2 shards parameters over dp (a mixture of "
                "experts' routed experts over edp) beside dense tensor parallelism, but not "
                "beside context parallelism nor a mixture of experts under tp; use zero 0, 1 "
                "or 2 there")
    return None


def adamw_kind(device_type: str) -> str:
    """The AdamW kernels the validation job steps on a device type, as perfmodel names them
    (Plan.optimizer_kernels): fused on a GPU ("cuda"), foreach on a CPU (adamw_kernels)."""
    return "fused" if device_type == "cuda" else "foreach"


def adamw_kernels(device_type: str) -> dict[str, Any]:
    """How AdamW runs on a device type: on a GPU ("cuda") fused, one kernel over the parameters'
    chunks (torchtitan's default optimizer implementation, as Megatron's Apex/Transformer Engine
    FusedAdam runs it: perfmodel's optimizer term reads and writes each state once); on a CPU
    foreach. The validation job (workload.trainer) and `calibrate run`'s optimizer stage
    (calibration.framework) both run it so."""
    return {adamw_kind(device_type): True}
