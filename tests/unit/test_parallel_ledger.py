"""perfmodel's communication ledger of context- and expert-parallel plans against the validation
job's dry run (validation.dryrun: rank 0's collectives counted on a fake process group), entry by
entry (axis, op, bytes per call, calls per step) at 64 and 512 ranks.

The job's counts are written from its algorithms in tests/unit/test_parallel_dryrun.py; here the
step model's ledger (perfmodel.step.context_parallel, perfmodel.step.moe, the gradient syncs of
perfmodel.step.data_parallel) must give every one of them and nothing else.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from perfmodel.specs.model import TransformerSpec  # noqa: E402
from perfmodel.strategy import Plan  # noqa: E402
from validation import dryrun  # noqa: E402

L, H, HEADS, KV, S, V = 4, 256, 8, 4, 1024, 1024
DENSE = TransformerSpec(name="dense", layers=L, hidden=H, heads=HEADS, kv_heads=KV, seq_len=S,
                        vocab=V, gated_mlp=True, bias=False, norm="rmsnorm",
                        tied_embeddings=False)
# 64 routed experts (top 4, 128 wide), one shared expert, layer 0 dense: 3 MoE layers
MOE = DENSE.replace(name="moe", experts=64, top_k=4, expert_ffn_hidden=128, shared_experts=1,
                    moe_first_dense=1)
# every layer MoE, no shared expert (Mixtral's shape)
MIXTRAL_LIKE = DENSE.replace(name="mixtral-like", experts=16, top_k=2)


def _plan(dp: int, cp: int = 1, tp: int = 1, pp: int = 1, mb: int = 1, n_mb: int = 1,
          **kw: object) -> Plan:
    return Plan(gpus=dp * cp * tp * pp, dp=dp, cp=cp, tp=tp, pp=pp, micro_batch=mb,
                global_batch=dp * mb * n_mb, dtype="fp32", **kw)


CASES = {
    # 64 ranks
    "ring cp 8 x tp 2": (DENSE, _plan(4, 8, 2, mb=2, n_mb=2)),
    "all-gather cp 8 x tp 2": (DENSE, _plan(4, 8, 2, cp_comm="allgather")),
    "Ulysses cp 4 x dp 16": (DENSE, _plan(16, 4, cp_comm="a2a")),
    "ring cp 8, selective recompute": (DENSE, _plan(8, 8, recompute="selective")),
    "ring cp 4 x pp 2": (DENSE, _plan(8, 4, pp=2, n_mb=2)),
    "dropless ep 16 over dp 8 x cp 8": (MOE, _plan(8, 8, mb=2, ep=16)),
    "capacity 1.25, ep 8 over dp 64": (MOE.replace(capacity_factor=1.25), _plan(64, mb=4, ep=8)),
    "ep 8 over dp 16 x cp 4 (edp 8)": (MIXTRAL_LIKE, _plan(16, 4, ep=8, n_mb=2)),
    "ep 4, cp 2, full recompute": (MIXTRAL_LIKE, _plan(32, 2, ep=4, recompute="full")),
    "ep 8 x pp 2": (MOE, _plan(16, 2, pp=2, ep=8, n_mb=2)),
    # tp 2 (sequence parallel: each tp rank routes its own tokens), the experts whole, ep groups
    # over the tp ranks first (Megatron-Core's expert rank order)
    "tp 2 x ep 2 over dp 32": (MOE, _plan(32, tp=2, mb=2, ep=2, sequence_parallel=True)),
    "tp 2 x ep 4 over dp 16 x cp 2": (MIXTRAL_LIKE, _plan(16, 2, tp=2, ep=4, n_mb=2,
                                                          sequence_parallel=True)),
    # expert tensor parallelism (Megatron-Core's expert_tensor_parallel_size): each expert split
    # over etp of the tp ranks; the received rows all-gathered and the outputs reduce-scattered
    # over etp, the counts over etp x ep (axes etp, etp_ep)
    "tp 4, etp 2 x ep 4 over dp 16 (edp 8)": (MOE, _plan(16, tp=4, mb=2, ep=4, etp=2,
                                                        sequence_parallel=True)),
    "tp 4, etp 4 x ep 2 over dp 8 x cp 2, full recompute": (
        MIXTRAL_LIKE, _plan(8, 2, tp=4, ep=2, etp=4, recompute="full", sequence_parallel=True)),
    "tp 2, etp 2, ep 1 over dp 32 (experts sync with the rest)": (
        MOE, _plan(32, tp=2, ep=1, etp=2, n_mb=2, sequence_parallel=True)),
    # tp with pipeline stages: rank 0's norm and router gradients over tp are its own stage's
    # (the MoE model's dense layer 0 and no final norm on the first of two stages)
    "tp 2 x ep 4 x pp 2 over dp 16": (MOE, _plan(16, tp=2, pp=2, ep=4, n_mb=2,
                                                sequence_parallel=True)),
    "tp 2, etp 2 x ep 2 x pp 2 over dp 16": (MIXTRAL_LIKE, _plan(16, tp=2, pp=2, ep=2, etp=2,
                                                                n_mb=2, sequence_parallel=True)),
    # the data-parallel sync of rank 0's stage (its own parameters, not the largest stage's):
    # the experts with the rest (ep 1), the distributed optimizer, two stages
    "ep 1, cp 4 x pp 2, zero 1": (MOE, _plan(8, 4, pp=2, n_mb=2, zero=1)),
    "dense pp 4 x dp 16, zero 0": (DENSE, _plan(16, pp=4, n_mb=4)),
    # 512 ranks
    "ring cp 32 x dp 16": (DENSE, _plan(16, 32, mb=2, n_mb=2)),
    "Ulysses cp 4 x dp 128": (DENSE, _plan(128, 4, cp_comm="a2a")),
    "dropless ep 64 over dp 64 x cp 8": (MOE, _plan(64, 8, mb=2, ep=64)),
    "ep 16 over dp 256 x cp 2 (edp 32)": (MIXTRAL_LIKE, _plan(256, 2, ep=16)),
    "tp 2 x ep 4 over dp 256": (MOE, _plan(256, tp=2, ep=4, sequence_parallel=True)),
    "tp 2 x ep 2, capacity 1.25, over dp 128 x cp 2": (
        MOE.replace(capacity_factor=1.25), _plan(128, 2, tp=2, mb=2, ep=2, sequence_parallel=True)),
    "tp 4, etp 4 x ep 8 over dp 128 (edp 16)": (MOE, _plan(128, tp=4, ep=8, etp=4,
                                                         sequence_parallel=True)),
    "tp 4, etp 2 x ep 16 over dp 64 x cp 2 (edp 16)": (
        MIXTRAL_LIKE, _plan(64, 2, tp=4, mb=2, ep=16, etp=2, sequence_parallel=True)),
    "tp 4 x ep 8 x pp 4 over dp 32": (MOE.replace(layers=8), _plan(32, tp=4, pp=4, ep=8, n_mb=4,
                                                                 sequence_parallel=True)),
    "tp 2, etp 2 x ep 4, capacity 1.25, over dp 256 (edp 32)": (
        MOE.replace(capacity_factor=1.25), _plan(256, tp=2, mb=2, ep=4, etp=2,
                                                 sequence_parallel=True)),
    # ZeRO 1 and 2 (Megatron's distributed optimizer): the dense parameters' buffer
    # reduce-scattered and all-gathered over dp_cp, the routed experts' over edp
    "zero 1, ep 8 over dp 16 x cp 4 (edp 8)": (MIXTRAL_LIKE, _plan(16, 4, ep=8, n_mb=2, zero=1)),
    "zero 2, tp 2 x ep 4 x pp 2 over dp 16": (MOE, _plan(16, tp=2, pp=2, ep=4, n_mb=2, zero=2,
                                                        sequence_parallel=True)),
    "zero 1, tp 2, etp 2, ep 1 over dp 32 (experts with the rest)": (
        MOE, _plan(32, tp=2, ep=1, etp=2, n_mb=2, zero=1, sequence_parallel=True)),
    "zero 1, tp 4, etp 2 x ep 16 over dp 64 x cp 2 (edp 16)": (
        MIXTRAL_LIKE, _plan(64, 2, tp=4, mb=2, ep=16, etp=2, zero=1, sequence_parallel=True)),
    # ZeRO 3 (FSDP2) beside expert parallelism, as torchtitan and NeMo AutoModel run it: every
    # block a unit over dp, the MoE layers' routed experts a unit of their own over edp (dp / ep
    # ranks), whole where that is one rank; two micro-batches (each unit gathered for every
    # forward and backward, its gradients reduce-scattered in each micro-batch's backward)
    "zero 3, ep 8 over dp 64 (edp 8)": (MOE, _plan(64, ep=8, n_mb=2, zero=3)),
    "zero 3, ep 64 over dp 64 (experts whole)": (MOE, _plan(64, ep=64, n_mb=2, zero=3)),
    "zero 3, ep 1 over dp 64 (experts in the MoE layer's unit)": (
        MOE, _plan(64, mb=2, zero=3)),
    "zero 3, ep 4 over dp 512 (edp 128)": (MIXTRAL_LIKE, _plan(512, ep=4, zero=3)),
    # experts 120 wide over edp 16: each of an expert's tensors padded to 128 rows (FSDP2 pads
    # each parameter's rows to the group, the up and gate projections apart)
    "zero 3, experts 120 wide, ep 4 over dp 64 (edp 16)": (
        MOE.replace(expert_ffn_hidden=120), _plan(64, ep=4, zero=3)),
    # selective recompute's mlp and shared_experts modules (Megatron-Core recompute_modules):
    # the MLP under a checkpoint, its tensor-parallel collectives recomputed before the backward
    "selective mlp, tp 2 (sp) over dp 32": (DENSE, _plan(32, tp=2, n_mb=2, sequence_parallel=True,
                                                         recompute="selective",
                                                         recompute_modules="mlp")),
    "selective core_attn and mlp, tp 4 over dp 16": (
        DENSE, _plan(16, tp=4, recompute="selective", recompute_modules="core_attn,mlp")),
    "selective mlp and shared experts, tp 2 x ep 4 x pp 2 over dp 16": (
        MOE, _plan(16, tp=2, pp=2, ep=4, n_mb=2, sequence_parallel=True, recompute="selective",
                   recompute_modules="mlp,shared_experts")),
    # a pipeline layout (Megatron's --pipeline-model-parallel-layout): chunks of unequal layers
    # under virtual stages, rank 0 holding 2 of 7 and the last rank 1 (the stages' layers no
    # multiple of the 2 chunks, which --decoder-first/last-pipeline-num-layers cannot give)
    "layout Et|tt|tt|t|t|t|t|L, ep 8 x pp 4 over dp 16": (
        MOE.replace(layers=9), _plan(16, pp=4, ep=8, n_mb=4, schedule="interleaved",
                                     virtual_stages=2, pipeline_layout="Et|tt|tt|t|t|t|t|L")),
    "layout Ettt|t|tt|tL, pp 2 over dp 256, zero 1": (
        DENSE.replace(layers=7), _plan(256, pp=2, n_mb=2, zero=1, schedule="interleaved",
                                       virtual_stages=2, pipeline_layout="Ettt|t|tt|tL")),
    # without sequence parallelism a stage sends its whole output (Megatron-Core's
    # get_tensor_shapes splits the sequence over tp only with it)
    "tp 2 x pp 2 over dp 16, no sequence parallelism": (DENSE, _plan(16, tp=2, pp=2, n_mb=2)),
    # zbv's V shape: rank 0 holds the model's first and last chunks, the output layer and the
    # loss's all-reduces over tp with them
    "zbv, tp 2 x pp 2 over dp 16": (DENSE, _plan(16, tp=2, pp=2, n_mb=4, schedule="zbv",
                                                virtual_stages=2, sequence_parallel=True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_ledger_gives_every_collective_the_job_issues(name):
    model, plan = CASES[name]
    result = dryrun.dry_run(model, plan)
    assert result["ledger_available"] is True
    assert result["world_size"] == plan.gpus in (64, 512)
    wrong = [(r["axis"], r["op"], r["bytes"], r["job_count"], r["model_count"])
             for r in result["rows"] if not r["agree"]]
    assert wrong == []
    axes = {r["axis"] for r in result["rows"]}
    if plan.cp > 1:
        assert {"cp", "dp_cp"} <= axes and "dp" not in axes
    if plan.ep > 1:
        assert "ep" in axes
    if plan.zero in (1, 2):  # the distributed optimizer's one reduce-scatter and one all-gather
        # per buffer
        for axis in {"dp_cp" if plan.cp > 1 else "dp"} | ({"edp"} & axes):
            assert [r["job_count"] for r in result["rows"]
                    if r["axis"] == axis and r["op"] != "all_reduce"] == [1, 1]
    if plan.zero == 3:  # FSDP2: no all-reduce; the experts' units over edp where it has ranks
        assert not [r for r in result["rows"] if r["op"] == "all_reduce"]
        edp = plan.dp // plan.ep
        assert ("edp" in axes) is (plan.ep > 1 and edp > 1)
        for axis in {"dp"} | ({"edp"} & axes):  # gathered in the forward and the backward
            gathers = [r for r in result["rows"] if r["axis"] == axis and r["op"] == "all_gather"]
            assert gathers and all(r["job_phases"] == "bwd,fwd" for r in gathers)
    if plan.etp > 1:  # the expert-tensor exchanges were issued and counted, not both absent
        assert "etp" in axes
        assert ("etp_ep" in axes) is (model.capacity_factor is None)  # dropless: the counts


def test_the_dry_run_refuses_experts_with_biases_under_etp_in_one_line():
    """Megatron-Core refuses biases in MoE with etp > 1 (TransformerConfig: 'Bias in Moe is only
    supported when ETP==1'): so does the job, before it counts anything, rather than compare a
    ledger no Megatron run issues."""
    from perfmodel.errors import PlanError

    plan = _plan(4, tp=2, ep=4, etp=2, sequence_parallel=True)
    with pytest.raises(PlanError, match=r"etp \(2\) with a model with biases") as err:
        dryrun.dry_run(MIXTRAL_LIKE.replace(bias=True), plan)
    assert "\n" not in str(err.value)


def test_the_distributed_optimizer_pads_its_buffer_to_the_group_size():
    """Megatron pads the distributed optimizer's buffer to whole shards (param_and_grad_buffer.py,
    _pad_end_of_bucket_if_needed); the job pads to its group's ranks and so does the ledger
    (perfmodel.step.data_parallel.padded): here rank 0's 2,705,664 dense parameters over dp x cp
    = 512 ranks (5,284.5 each) are padded by 256 to 2,705,920, in both collectives of that
    buffer; the experts' (1,179,648 B over edp 8) divide evenly."""
    result = dryrun.dry_run(MOE, _plan(64, 8, mb=2, ep=64, zero=2))
    attention = 2 * H * H + 2 * H * (KV * H // HEADS) + 2 * H  # wq wo, wk wv, two RMSNorms
    moe_dense = 64 * H + 3 * H * 128  # router, the shared expert (128 wide, gated)
    dense = (L * attention + 3 * H * 4 * H + (L - 1) * moe_dense  # layer 0's MLP: 4h, gated
             + 2 * V * H + S * H + H)  # embedding, head, position table, final norm
    assert dense == 2_705_664
    padded = -(-dense // 512) * 512
    assert padded - dense == 256
    rows = {(r["axis"], r["op"]): r for r in result["rows"]}
    for op in ("all_gather", "reduce_scatter"):
        row = rows["dp_cp", op]
        assert row["bytes"] == 4 * padded and row["agree"], row
    assert result["agree"]
