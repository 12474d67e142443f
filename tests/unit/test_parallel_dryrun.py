"""--dry-run of context- and expert-parallel plans on a fake process group of 64 and 512 ranks.

Every count is written from the algorithms (workload.context_parallel, workload.moe), for rank 0,
one step, fp32 (4 bytes). Ring attention and all-to-all calls are per layer and micro-batch; a
send/recv exchange is one send and one recv record (as the pipeline's p2p). The model is the
job's (untied embeddings, learned positions); perfmodel's ledger for the same plans is compared
with the job's entry by entry in tests/unit/test_parallel_ledger.py.
"""

from __future__ import annotations

import math
import re

import pytest

pytest.importorskip("torch")

from perfmodel.errors import PlanError  # noqa: E402
from perfmodel.specs.model import TransformerSpec  # noqa: E402
from perfmodel.strategy import Plan  # noqa: E402
from validation import dryrun  # noqa: E402
from validation.jobspec import JobParallel  # noqa: E402

F32 = 4
L, H, HEADS, KV, S, V = 4, 256, 8, 4, 1024, 1024
HD = H // HEADS
DENSE = TransformerSpec(name="dense", layers=L, hidden=H, heads=HEADS, kv_heads=KV, seq_len=S,
                        vocab=V, gated_mlp=True, bias=False, norm="rmsnorm",
                        tied_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0)
# 64 routed experts (top 4, 128 wide), one shared expert, layer 0 dense: 3 MoE layers
E, K, EF = 64, 4, 128
MOE = DENSE.replace(name="moe", experts=E, top_k=K, expert_ffn_hidden=EF, shared_experts=1,
                    moe_first_dense=1)
MOE_LAYERS = L - 1


def _counts(model: TransformerSpec, plan: Plan, par: JobParallel) -> dict[tuple, float]:
    """(axis, op, bytes per call) -> calls per step, on rank 0."""
    counted = dryrun.count_collectives(model, plan, par)
    out: dict[tuple, float] = {}
    for r in counted["records"]:
        key = (r["axis"], r["op"], r["bytes"])
        out[key] = out.get(key, 0) + r["count"]
    # torch's CommDebugMode sees exactly as many collectives as the job's counter (it does not
    # count point-to-point calls: the ring's are counted apart)
    p2p = sum(v for k, v in out.items() if k[0] == "cp" and k[1] == "send_recv")
    assert counted["p2p_total"] == p2p
    assert counted["comm_debug_mode_total"] + counted["derived_total"] + p2p == sum(out.values())
    return out


def _axis(counts: dict[tuple, float], axis: str) -> dict[tuple, float]:
    return {k: v for k, v in counts.items() if k[0] == axis}


def _plan(dp: int, tp: int = 1, pp: int = 1, mb: int = 1, n_mb: int = 1, **parallel) -> Plan:
    """A plan of dp x cp x tp x pp ranks; parallel: cp, ep, cp_comm (perfmodel's Plan holds them,
    validation.jobspec.job_parallel takes them from it)."""
    cp = parallel.get("cp", 1)
    return Plan(gpus=dp * cp * tp * pp, dp=dp, tp=tp, pp=pp, micro_batch=mb,
                global_batch=dp * mb * n_mb, dtype="fp32", **parallel)


# --- context parallelism ------------------------------------------------------------------------


@pytest.mark.parametrize(("dp", "cp", "tp"), [(4, 8, 2), (16, 32, 1)], ids=["64", "512"])
def test_ring_attention_sends_kv_round_the_ring(dp, cp, tp):
    mb, n_mb = 2, 2
    counts = _counts(DENSE, _plan(dp, tp, mb=mb, n_mb=n_mb, cp=cp), JobParallel())
    # C = b (s/cp) (kv/tp) hd elements: K or V of the local chunk
    c = mb * (S // cp) * (KV // tp) * HD
    calls = L * n_mb * 2  # per layer and micro-batch; one send and one recv record each
    # forward: cp - 1 exchanges of 2C; backward: one of 2C (K, V), cp - 2 of 4C (K, V, dK, dV),
    # one of 2C (dK, dV)
    assert _axis(counts, "cp") == {
        ("cp", "send_recv", 2 * c * F32): calls * (cp - 1 + 2),
        ("cp", "send_recv", 4 * c * F32): calls * (cp - 2),
    }
    # the gradients of a replica's dp x cp ranks in one flat all-reduce; nothing on dp alone
    assert sum(_axis(counts, "dp_cp").values()) == 1
    assert not _axis(counts, "dp")


def test_allgather_attention_gathers_kv_twice_and_reduce_scatters_their_gradients():
    dp, cp, tp = 4, 8, 2  # 64 ranks
    counts = _counts(DENSE, _plan(dp, tp, cp=cp, cp_comm="allgather"), JobParallel())
    gathered = cp * 1 * (S // cp) * (KV // tp) * HD * F32  # cp C elements per call
    # forward: K and V gathered; backward: gathered again, dK and dV reduce-scattered
    assert _axis(counts, "cp") == {
        ("cp", "all_gather", gathered): L * (2 + 2),
        ("cp", "reduce_scatter", gathered): L * 2,
    }


def test_ulysses_swaps_sequence_for_heads_four_times_each_way():
    dp, cp, tp = 128, 4, 1  # 512 ranks; heads 8 and kv heads 4 divisible by cp
    counts = _counts(DENSE, _plan(dp, tp, cp=cp, cp_comm="a2a"), JobParallel())
    q = (S // cp) * HEADS * HD * F32  # Q or the output of the local chunk (micro-batch 1)
    kv = (S // cp) * KV * HD * F32  # K or V
    # forward Q, K, V to head shards and the output back; backward the four gradients
    assert _axis(counts, "cp") == {
        ("cp", "all_to_all", q): L * 2 * 2,
        ("cp", "all_to_all", kv): L * 2 * 2,
    }


def test_context_parallel_pipeline_sends_the_local_chunk():
    dp, cp, tp, pp = 2, 4, 2, 4  # 64 ranks
    counts = _counts(DENSE, _plan(dp, tp, pp, n_mb=4, cp=cp), JobParallel())
    # rank 0 holds the first stage: it sends each micro-batch's activation of its s/cp tokens and
    # receives its gradient
    assert _axis(counts, "pp") == {("pp", "send_recv", (S // cp) * H * F32): 4 * 2}
    c = (S // cp) * (KV // tp) * HD
    per_layer = {("cp", "send_recv", 2 * c * F32): (cp - 1 + 2) * 2,
                 ("cp", "send_recv", 4 * c * F32): (cp - 2) * 2}
    assert _axis(counts, "cp") == {k: v * (L // pp) * 4 for k, v in per_layer.items()}


# --- expert parallelism ---------------------------------------------------------------------------


@pytest.mark.parametrize(("dp", "cp", "ep"), [(8, 8, 16), (64, 8, 64)], ids=["64", "512"])
def test_dropless_experts_exchange_their_tokens_by_all_to_all(dp, cp, ep):
    mb = 2
    counts = _counts(MOE, _plan(dp, mb=mb, cp=cp, ep=ep), JobParallel())
    tokens = mb * S // cp  # T: the rank's tokens of a micro-batch
    # per MoE layer: the E counts all-gathered over ep (int64), dispatch and combine forward and
    # backward, each T k rows of h sent (and, routed in balance, received)
    assert _axis(counts, "ep") == {
        ("ep", "all_gather", ep * E * 8): MOE_LAYERS,
        ("ep", "all_to_all", tokens * K * H * F32): MOE_LAYERS * 4,
    }
    # the experts a rank keeps (E / ep per MoE layer, gated: 3 h f weights) reduced over the
    # dp cp / ep ranks holding the same ones; everything else over dp x cp
    edp = dp * cp // ep
    expert_bytes = MOE_LAYERS * (E // ep) * 3 * H * EF * F32
    assert _axis(counts, "edp") == ({("edp", "all_reduce", expert_bytes): 1} if edp > 1 else {})
    assert sum(_axis(counts, "dp_cp").values()) == 1


@pytest.mark.parametrize(("dp", "cp", "ep"), [(32, 1, 2), (8, 2, 4), (256, 1, 4)],
                         ids=["64-ep2", "64-ep4-cp2", "512-ep4"])
def test_experts_under_tensor_parallelism_route_each_ranks_sequence_share(dp, cp, ep):
    # tp 2 with sequence parallelism (Megatron-Core requires it for MoE with tp): each tp rank
    # routes its own s / (cp tp) tokens; the experts whole (expert tp 1), so the dispatcher issues
    # no tp collective around them (token_dispatcher.py, MoEAlltoAllTokenDispatcher: the
    # all-gather / reduce-scatter of dispatch_postprocess / combine_preprocess only when the
    # expert tp group has more than one rank)
    tp, mb = 2, 2
    plan = _plan(dp, tp=tp, mb=mb, cp=cp, ep=ep, sequence_parallel=True)
    counts = _counts(MOE, plan, JobParallel())
    tokens = mb * S // (cp * tp)
    assert _axis(counts, "ep") == {
        ("ep", "all_gather", ep * E * 8): MOE_LAYERS,
        ("ep", "all_to_all", tokens * K * H * F32): MOE_LAYERS * 4,
    }
    # the experts' gradients over the tp dp cp / ep ranks holding the same ones
    assert _axis(counts, "edp") == {
        ("edp", "all_reduce", MOE_LAYERS * (E // ep) * 3 * H * EF * F32): 1
    }
    # tp: per layer the attention's all-gather and reduce-scatter and the MLP's (the dense
    # layer's; the MoE layers' shared expert, one tensor-parallel MLP), each way, plus the
    # output layer's; one all-reduce of the norms' and the routers' gradients (2 norms a layer
    # and the final one, h each; a router h x E per MoE layer)
    act = mb * S // cp * H * F32
    assert counts[("tp", "all_gather", act)] == 2 * L * 2 + 2
    assert counts[("tp", "reduce_scatter", act)] == 2 * L * 2 + 1
    assert counts[("tp", "all_reduce", ((2 * L + 1) * H + MOE_LAYERS * H * E) * F32)] == 1


def test_expert_groups_are_formed_as_megatron_core_forms_them():
    # Megatron-Core parallel_state.initialize_model_parallel: the expert RankGenerator(tp=1
    # (expert_tensor_parallel_size), ep, dp=world / (ep pp), order "tp-cp-ep-dp-pp") numbers a
    # stage's ranks with ep innermost; the attention's ranks are r = t + tp (c + cp d), so an ep
    # group takes tp ranks first, then cp, then dp. 8 ranks, tp 2, dp 4, ep 4:
    import torch

    from workload.parallelize import group_layouts

    ranks = torch.arange(8).reshape(1, 4, 1, 2)  # (pp, dp, cp, tp), tp fastest
    got = group_layouts(ranks, ep=4, experts=True)
    assert got["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert got["edp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # tp 2, cp 2, dp 2, ep 2: the ep groups are the tp groups; the experts' replicas the rest
    ranks = torch.arange(8).reshape(1, 2, 2, 2)
    got = group_layouts(ranks, ep=2, experts=True)
    assert got["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert got["edp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert got["dp_cp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # tp = 1: ep consecutive of the dp x cp ranks, cp inner, as before
    got = group_layouts(torch.arange(8).reshape(1, 4, 2, 1), ep=4, experts=True)
    assert got["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # a dense model, or experts with ep = tp = 1: no expert groups
    assert group_layouts(torch.arange(8).reshape(1, 4, 1, 2), ep=1, experts=False) == {}
    assert group_layouts(torch.arange(8).reshape(1, 8, 1, 1), ep=1, experts=True) == {}


def _megatron_expert_groups(tp: int, cp: int, dp: int, etp: int,
                            ep: int) -> dict[str, list[list[int]]]:
    """Every expert group of one stage as Megatron-Core forms them (parallel_state.py at
    d98e8a64dd, initialize_model_parallel: RankGenerator(tp=etp, ep=ep, dp=world / (etp ep),
    cp=1, order "tp-cp-ep-dp-pp") numbers rank = t + etp (e + ep d), the first name fastest;
    get_ranks("tp") are the expert-tensor groups, "ep", "tp-ep" (the counts' group) and "dp" the
    expert-data-parallel ones), over the dense numbering r = t + tp (c + cp d) of the same ranks.
    Groups of one rank are not formed by the job (none is issued on them)."""
    edp = tp * cp * dp // (etp * ep)

    def rank(t: int, e: int, d: int) -> int:
        return t + etp * (e + ep * d)

    groups = {
        "etp": [[rank(t, e, d) for t in range(etp)] for d in range(edp) for e in range(ep)],
        "etp_ep": [[rank(t, e, d) for e in range(ep) for t in range(etp)] for d in range(edp)],
        "ep": [[rank(t, e, d) for e in range(ep)] for d in range(edp) for t in range(etp)],
        "edp": [[rank(t, e, d) for d in range(edp)] for e in range(ep) for t in range(etp)],
    }
    keep = {"etp": etp > 1, "etp_ep": etp > 1, "ep": ep > 1,
            "edp": edp > 1 and (ep > 1 or tp // etp > 1)}  # where the experts sync apart
    return {axis: sorted(lists) for axis, lists in groups.items() if keep[axis]}


def test_expert_tensor_groups_are_formed_as_megatron_core_forms_them():
    import torch

    from workload.parallelize import group_layouts

    seen = 0
    for tp in (1, 2, 4, 8):
        for cp in (1, 2):
            for dp in (1, 2, 4):
                for etp in (e for e in (1, 2, 4, 8) if tp % e == 0):
                    for ep in (1, 2, 4, 8):
                        world = tp * cp * dp
                        if world % (etp * ep) or (ep == 1 and tp == 1):
                            continue
                        ranks = torch.arange(world).reshape(1, dp, cp, tp)  # tp fastest
                        got = group_layouts(ranks, ep=ep, experts=True, etp=etp)
                        got.pop("dp_cp", None)
                        want = _megatron_expert_groups(tp, cp, dp, etp, ep)
                        assert {a: sorted(r) for a, r in got.items()} == want, \
                            (tp, cp, dp, etp, ep)
                        seen += etp > 1
    assert seen > 40
    # docs/moe.md's example: dp 4 x tp 4, etp 2, ep 4 on 16 ranks; rank 0's etp group (0, 1),
    # ep group (0, 2, 4, 6) (one of each etp group, 2 dp ranks), edp group every 8th rank
    got = group_layouts(torch.arange(16).reshape(1, 4, 1, 4), ep=4, experts=True, etp=2)
    assert got["etp"][0] == [0, 1] and got["ep"][0] == [0, 2, 4, 6]
    assert got["etp_ep"][0] == list(range(8)) and got["edp"][0] == [0, 8]


# (dp, cp, tp, ep, etp, capacity factor) of 64 and 512 ranks
ETP_PLANS = {
    "64: tp 4, etp 2, ep 4 (edp 8)": (16, 1, 4, 4, 2, None),
    "64: tp 4, etp 4, ep 2, cp 2 (edp 8)": (8, 2, 4, 2, 4, None),
    "64: tp 2, etp 2, ep 1 (the experts sync with the rest)": (32, 1, 2, 1, 2, None),
    "512: tp 4, etp 2, ep 16, cp 2 (edp 16)": (64, 2, 4, 16, 2, None),
    "512: tp 4, etp 4, ep 4, capacity 1.25 (edp 32)": (128, 1, 4, 4, 4, 1.25),
}


@pytest.mark.parametrize("name", list(ETP_PLANS))
def test_expert_tensor_parallel_experts_gather_and_scatter_their_rows_over_etp(name):
    # Megatron-Core's MoEAlltoAllTokenDispatcher with expert_tensor_parallel_size etp
    # (token_dispatcher.py at d98e8a64dd): per MoE layer and micro-batch, the counts all-gathered
    # over tp_ep (etp ep E int64: preprocess), dispatch by all-to-all over ep (the rank's own
    # T k rows), the received rows all-gathered over etp (dispatch_postprocess), the experts'
    # partial outputs reduce-scattered back (combine_preprocess), combine by all-to-all; backward
    # the all-to-alls back and the adjoints (a reduce-scatter, an all-gather). Each rank holds
    # E / ep experts, each 1 / etp of it (TEGroupedMLP: fc1 column-, fc2 row-parallel).
    dp, cp, tp, ep, etp, cf = ETP_PLANS[name]
    mb = 2
    model = MOE if cf is None else MOE.replace(capacity_factor=cf)
    plan = _plan(dp, tp=tp, mb=mb, cp=cp, ep=ep, etp=etp, sequence_parallel=True)
    assert plan.gpus in (64, 512)
    counts = _counts(model, plan, JobParallel())
    tokens = mb * S // (cp * tp)  # the rank's own share (sequence parallel)
    rows = tokens * K if cf is None else E * math.ceil(cf * tokens * K / E)  # sent by all-to-all
    assert _axis(counts, "ep") == ({("ep", "all_to_all", rows * H * F32): MOE_LAYERS * 4}
                                   if ep > 1 else {})
    assert _axis(counts, "etp") == {
        ("etp", "all_gather", etp * rows * H * F32): MOE_LAYERS * 2,
        ("etp", "reduce_scatter", etp * rows * H * F32): MOE_LAYERS * 2,
    }
    assert _axis(counts, "etp_ep") == (
        {("etp_ep", "all_gather", etp * ep * E * 8): MOE_LAYERS} if cf is None else {})
    # the experts' slices (E / ep a layer, 3 h f / etp each) over the tp dp cp / (ep etp) ranks
    # holding the same ones; with ep 1 and etp = tp over dp x cp with everything else
    experts = MOE_LAYERS * (E // ep) * 3 * H * (EF // etp) * F32
    if ep > 1 or tp // etp > 1:
        assert _axis(counts, "edp") == {("edp", "all_reduce", experts): 1}
    else:
        # no edp call: the slices join the flat all-reduce of the rest, which is the same plan's
        # with whole experts (etp 1, synced apart over edp) but for the experts' 1 / etp
        assert not _axis(counts, "edp") and cp == 1
        whole = _counts(model, plan.replace(etp=1), JobParallel())
        (with_slices,) = [b for (a, _, b) in counts if a == "dp"]
        (without,) = [b for (a, _, b) in whole if a == "dp"]
        (whole_experts,) = [b for (a, _, b) in whole if a == "edp"]
        assert whole_experts == experts * etp
        assert with_slices == without + experts


def test_experts_with_a_capacity_exchange_fixed_buffers():
    dp, ep, mb = 64, 8, 4  # 64 ranks, no cp
    model = MOE.replace(capacity_factor=1.25)
    counts = _counts(model, _plan(dp, mb=mb, ep=ep), JobParallel())
    cap = math.ceil(1.25 * mb * S * K / E)  # C = ceil(cf T k / E)
    # dispatch and combine forward and backward, E C rows of h each; no count exchange
    assert _axis(counts, "ep") == {("ep", "all_to_all", E * cap * H * F32): MOE_LAYERS * 4}
    assert _axis(counts, "edp") == {
        ("edp", "all_reduce", MOE_LAYERS * (E // ep) * 3 * H * EF * F32): 1
    }
    assert sum(_axis(counts, "dp").values()) == 1  # cp = 1: the others over dp, as before


def test_the_dry_run_compares_cp_and_ep_plans_with_perfmodels_ledger():
    # perfmodel's Plan holds cp and ep and its step model costs a mixture of experts: the dry run
    # checks their collectives against its ledger (tests/unit/test_parallel_ledger.py, entry by
    # entry at 64 and 512 ranks)
    result = dryrun.dry_run(DENSE, _plan(8, cp=8), JobParallel())
    assert result["world_size"] == 64
    assert result["ledger_available"] is True and result["agree"] is True
    assert {r["axis"] for r in result["rows"]} >= {"cp", "dp_cp"}
    moe = dryrun.dry_run(MOE, _plan(64, ep=8), JobParallel())
    assert moe["agree"] is True and not moe["notes"]


@pytest.mark.parametrize(
    ("model", "plan", "field"),
    [
        (DENSE, dict(dp=8, cp=3), "seq_len"),
        (DENSE, dict(dp=8, cp=8, cp_comm="a2a"), "heads"),
        (DENSE, dict(dp=8, ep=2), "ep applies"),
        (MOE, dict(dp=6, ep=3), "ep (3) must divide the experts"),
        (MOE, dict(dp=1, tp=2, ep=4), "tp x dp x cp"),  # perfmodel's Plan refuses it already
        (MOE, dict(dp=4, tp=2), "needs sequence_parallel"),
        # Megatron-Core refuses biases in MoE with etp > 1 (TransformerConfig), so does the job
        (MOE.replace(bias=True), dict(dp=2, tp=2, ep=2, etp=2, sequence_parallel=True),
         "etp (2) with a model with biases"),
        # 4 key/value heads over tp 8: Megatron-Core, perfmodel and the job refuse them
        (DENSE, dict(dp=8, tp=8), "kv_heads (4) must be multiples of tp (8)"),
    ],
)
def test_plans_the_job_cannot_run_are_refused_in_one_line(model, plan, field):
    with pytest.raises(PlanError, match=re.escape(field)) as err:
        dryrun.count_collectives(model, _plan(**plan), JobParallel())
    assert "\n" not in str(err.value)


def test_a_second_dry_run_in_one_process_counts_on_its_own_groups():
    # Regression: DTensor caches sharding decisions by specs whose meshes compare equal across
    # runs (same ranks, same dim names), so the second run's embedding all-reduce went to the
    # first run's tp group and was counted on axis "world".
    _counts(DENSE, _plan(4, tp=2, cp=8), JobParallel())
    counts = _counts(DENSE, Plan(gpus=64, pp=2, tp=2, dp=16, global_batch=64, dtype="fp32"),
                     JobParallel())
    assert not _axis(counts, "world")
    # 2 layers of rank 0's stage, 2 all-reduces forward and 2 backward each, the embedding's
    # forward one, per micro-batch (4)
    assert counts[("tp", "all_reduce", S * H * F32)] == 4 * (2 * 2 + 2 * 2 + 1)


def test_the_dry_run_document_of_a_cp_ep_plan_keeps_the_published_schema():
    import json

    from jsonschema import Draft202012Validator

    from perfmodel.output import json_text
    from tests.unit.test_json_schemas import published

    result = dryrun.dry_run(MOE, _plan(8, cp=4, ep=8), JobParallel())
    doc = json.loads(json_text(result, default=str))
    Draft202012Validator(published("validate.dry-run")).validate(doc)
    assert doc["plan"]["cp"] == 4 and doc["plan"]["ep"] == 8
    assert doc["plan"]["moe_routing"] == "balanced"  # what the dry run routed by


def test_a_capacity_under_tp_is_not_checked_against_one_process(tmp_path):
    # each tp rank drops by its own share of the sequence (C = ceil(cf T_r k / E)), one process
    # by the whole: no equivalence to check, refused in one line before any rank starts
    from validation.parallel import check_equivalence

    plan = _plan(2, tp=2, ep=2, sequence_parallel=True)
    with pytest.raises(PlanError, match="capacity_factor with tp or cp > 1") as err:
        check_equivalence(MOE.replace(capacity_factor=1.0), plan, JobParallel(), tmp_path)
    assert "\n" not in str(err.value) and not list(tmp_path.iterdir())


def test_nprocs_counts_the_cp_ranks(run_cli):
    """validate --cp 2 --nprocs 2: the plan's dp x cp x tp x pp is 2 already (it was taken for
    pure data parallelism, dp 2, and then refused as 4 ranks)."""
    import json

    out = run_cli("validate", "--model", "tiny-gpt",
                  "--dp", "1", "--cp", "2", "--global-batch", "2", "--nprocs", "2",
                  "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["plan"]["dp"], doc["plan"]["cp"], doc["plan"]["gpus"]) == (1, 2, 2)
    # without --dp, the ranks tp x pp x cp leaves are data-parallel
    out = run_cli("validate", "--model", "tiny-gpt", "--cp", "2", "--global-batch", "4",
                  "--nprocs", "4", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["plan"]["dp"], doc["plan"]["cp"], doc["plan"]["gpus"]) == (2, 2, 4)


def test_dropless_experts_the_round_robin_cannot_balance_are_refused():
    """Balanced routing (assignment n of every rank to expert n mod E, from 0) receives on each
    rank what it sends only where E divides T_r k; otherwise rank 0's experts take one more row
    from each source and the count differs from the ledger's (a probe, 2026-12-02: mixtral at
    seq 18, 36 assignments over 8 experts, 5 KiB received against 4.5 sent: 'agree: no').
    Such a plan is refused in one line; a divisible one is counted."""
    short = MOE.replace(seq_len=24)  # 24 x 4 = 96 assignments over 64 experts
    with pytest.raises(PlanError, match="96 assignments round robin over the 64 experts"):
        dryrun.count_collectives(short, _plan(8, ep=8), JobParallel())
    with pytest.raises(PlanError, match="makes 96 a multiple of 64"):
        dryrun.dry_run(short, _plan(8, ep=8))
    assert dryrun.count_collectives(MOE.replace(seq_len=32), _plan(8, ep=8),
                                    JobParallel())["records"]


def test_the_table_prints_each_messages_bytes_digit_for_digit():
    """The dry run's check is exact; its table rounded the bytes to three figures (7.16 MiB),
    which hid the few bytes two counts may differ by."""
    from validation.dryrun import exact_bytes

    assert exact_bytes(7_512_064) == "7,512,064 (7.16 MiB)"
    assert exact_bytes(7_512_068.0) == "7,512,068 (7.16 MiB)"
    assert exact_bytes(512) == "512"
    assert exact_bytes(1536.5) == "1,536.5 (1.50 KiB)"
