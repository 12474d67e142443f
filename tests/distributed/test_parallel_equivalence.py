"""Context and expert parallelism on gloo ranks against one process (issue 17 items 2 and 3).

Each case launches the job's equivalence check (validation.parallel.check_equivalence, which runs
workload.equivalence on 2 or 4 forked ranks): one step of the job (forward, backward, gradient
sync) and, in every rank, the whole model on one process from the same weights over the same
batches; the loss and every gradient a rank holds must agree to fp32 tolerance (rtol 1e-4, atol
1e-5). The collectives the ranks issued are checked against the counts written below from the
algorithms (workload.context_parallel, workload.moe), which is also what proves the sharded path
ran (a cp plan whose attention did not cross ranks would issue no cp call).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from perfmodel.specs.model import TransformerSpec  # noqa: E402
from perfmodel.strategy import Plan  # noqa: E402
from validation.jobspec import JobParallel  # noqa: E402
from validation.parallel import check_equivalence  # noqa: E402

pytestmark = pytest.mark.distributed
F32 = 4
B, S, H, HEADS, KV, HD = 2, 16, 32, 4, 2, 8  # micro-batch, sequence, hidden, heads, kv heads
DENSE = TransformerSpec(name="tiny-dense", layers=2, hidden=H, heads=HEADS, kv_heads=KV,
                        seq_len=S, vocab=64, ffn_hidden=64, gated_mlp=True, bias=False,
                        norm="rmsnorm", tied_embeddings=False)
# layer 0 dense, layer 1 a mixture of 4 experts (top 2) and one shared expert
MOE = DENSE.replace(name="tiny-moe", experts=4, top_k=2, expert_ffn_hidden=32, shared_experts=1,
                    shared_expert_ffn_hidden=16, moe_first_dense=1)


def _plan(dp: int = 1, tp: int = 1, cp: int = 1, ep: int = 1, cp_comm: str = "p2p",
          sequence_parallel: bool = False, etp: int = 1) -> Plan:
    """The plan holds cp, cp_comm, ep and etp (the job reads them from it: validation.jobspec)."""
    return Plan(gpus=dp * tp * cp, dp=dp, tp=tp, cp=cp, ep=ep, etp=etp, cp_comm=cp_comm,
                micro_batch=B, global_batch=dp * B, dtype="fp32",
                sequence_parallel=sequence_parallel)


def _calls(rank: dict, axis: str, op: str, phase: str | None = None) -> dict[int, float]:
    """bytes per call -> calls, of one rank's collectives on axis/op (and phase)."""
    out: dict[int, float] = {}
    for c in rank["collectives"]:
        if c["axis"] == axis and c["op"] == op and phase in (None, c["phase"]):
            out[c["bytes"]] = out.get(c["bytes"], 0) + c["count"]
    return out


def _equivalent(result: dict) -> None:
    for rank in result["ranks"]:
        bad = [r for r in rank["results"] if not r["ok"]]
        assert not bad, f"rank {rank['rank']} {rank['coords']}: {bad}"
        assert len(rank["results"]) > 10  # the loss and every parameter's gradient
    assert result["ok"]


# --- context parallelism ------------------------------------------------------------------------


def _ring(cp: int, tp: int = 1) -> dict[str, dict[int, float]]:
    """Ring attention per rank per step, one micro-batch, L = 2 layers. C = b (s/cp) (kv/tp) hd
    elements (K or V of the local chunk); every exchange is one send and one recv record.
    Forward: (cp - 1) exchanges of 2C per layer. Backward: one of 2C (K, V), cp - 2 of 4C (K, V,
    dK, dV), one of 2C (dK, dV) per layer."""
    c = B * (S // cp) * (KV // tp) * HD
    fwd = {2 * c * F32: 2 * 2 * (cp - 1)}
    bwd = {2 * c * F32: 2 * 2 * 2}
    if cp > 2:
        bwd[4 * c * F32] = 2 * 2 * (cp - 2)
    return {"fwd": fwd, "bwd": bwd}


@pytest.mark.parametrize(("cp", "tp"), [(2, 1), (4, 1), (2, 2)], ids=["cp2", "cp4", "cp2-tp2"])
def test_ring_attention_matches_one_process(tmp_path, cp, tp):
    result = check_equivalence(DENSE, _plan(tp=tp, cp=cp), JobParallel(), tmp_path)
    _equivalent(result)
    want = _ring(cp, tp)
    for rank in result["ranks"]:
        assert _calls(rank, "cp", "send_recv", "fwd") == want["fwd"]
        assert _calls(rank, "cp", "send_recv", "bwd") == want["bwd"]
        assert len(_calls(rank, "dp_cp", "all_reduce", "grad")) == 1  # one flat gradient call


def test_allgather_and_ulysses_attention_match_one_process(tmp_path):
    c = B * (S // 2) * KV * HD  # K or V of the local chunk, cp = 2
    q = B * (S // 2) * HEADS * HD  # Q or the output of the local chunk
    ag = check_equivalence(DENSE, _plan(cp=2, cp_comm="allgather"), JobParallel(), tmp_path / "ag")
    _equivalent(ag)
    for rank in ag["ranks"]:
        # per layer: forward all-gathers K and V (cp C gathered each); backward gathers them
        # again and reduce-scatters dK and dV
        assert _calls(rank, "cp", "all_gather", "fwd") == {2 * c * F32: 2 * 2}
        assert _calls(rank, "cp", "all_gather", "bwd") == {2 * c * F32: 2 * 2}
        assert _calls(rank, "cp", "reduce_scatter", "bwd") == {2 * c * F32: 2 * 2}
    a2a = check_equivalence(DENSE, _plan(cp=2, cp_comm="a2a"), JobParallel(), tmp_path / "a2a")
    _equivalent(a2a)
    for rank in a2a["ranks"]:
        # per layer: Q, K, V to head shards and the output back; the backward the same four
        for phase in ("fwd", "bwd"):
            assert _calls(rank, "cp", "all_to_all", phase) == {q * F32: 2 * 2, c * F32: 2 * 2}


# --- mixture of experts ---------------------------------------------------------------------------


def test_expert_parallel_dropless_matches_one_process(tmp_path):
    result = check_equivalence(MOE, _plan(dp=2, ep=2), JobParallel(), tmp_path)
    _equivalent(result)
    for rank in result["ranks"]:
        # one MoE layer: the E token counts all-gathered over ep (int64), then dispatch and
        # combine forward and both back; the rows a rank sends depend on the learned routing
        assert _calls(rank, "ep", "all_gather", "fwd") == {2 * 4 * 8: 1}
        assert sum(_calls(rank, "ep", "all_to_all", "fwd").values()) == 2
        assert sum(_calls(rank, "ep", "all_to_all", "bwd").values()) == 2
        assert "edp" not in {c["axis"] for c in rank["collectives"]}  # dp cp / ep = 1


def test_expert_parallel_with_capacity_drops_and_matches_one_process(tmp_path):
    # capacity factor 0.5: C = ceil(0.5 T k / E) = 8 of the T k = 64 assignments' 16 per expert
    # on average, so tokens are dropped whatever the routing
    tokens, k, experts = B * S, 2, 4
    cap = math.ceil(0.5 * tokens * k / experts)
    assert cap * experts < tokens * k
    result = check_equivalence(MOE.replace(capacity_factor=0.5), _plan(dp=2, ep=2), JobParallel(),
                               tmp_path)
    _equivalent(result)
    for rank in result["ranks"]:
        # fixed-size buffers: E C rows of h, no count exchange
        for phase in ("fwd", "bwd"):
            assert _calls(rank, "ep", "all_to_all", phase) == {experts * cap * H * F32: 2}
        assert not _calls(rank, "ep", "all_gather")


def test_expert_and_context_parallel_together_match_one_process(tmp_path):
    # dp 2 x cp 2 = 4 ranks, ep 2 inside them: expert gradients over edp (dp cp / ep = 2 ranks)
    result = check_equivalence(MOE, _plan(dp=2, cp=2, ep=2), JobParallel(), tmp_path)
    _equivalent(result)
    for rank in result["ranks"]:
        assert _calls(rank, "cp", "send_recv", "fwd") == _ring(2)["fwd"]
        assert len(_calls(rank, "edp", "all_reduce", "grad")) == 1
        # the experts of one MoE layer a rank keeps: 2 of 4, each gated (3 h x 32 weights)
        assert _calls(rank, "edp", "all_reduce", "grad") == {2 * 3 * H * 32 * F32: 1}


@pytest.mark.parametrize("ep", [2, 4], ids=["tp2-dp2-ep2", "tp2-dp2-ep4"])
def test_experts_under_tensor_parallelism_match_one_process(tmp_path, ep):
    # tp 2 x dp 2 = 4 ranks with sequence parallelism: each tp rank routes its own half of the
    # sequence; the experts whole on every rank (expert tp 1), the ep group its tp ranks first
    # (Megatron-Core's expert rank order): ep 2, the tp group (the experts' gradients over the
    # 2 dp ranks holding the same ones); ep 4, every rank (no other rank holds a rank's experts)
    result = check_equivalence(MOE, _plan(dp=2, tp=2, ep=ep, sequence_parallel=True),
                               JobParallel(), tmp_path)
    _equivalent(result)
    for rank in result["ranks"]:
        # the E counts all-gathered over ep, then dispatch and combine each way
        assert _calls(rank, "ep", "all_gather", "fwd") == {ep * 4 * 8: 1}
        assert sum(_calls(rank, "ep", "all_to_all", "fwd").values()) == 2
        assert sum(_calls(rank, "ep", "all_to_all", "bwd").values()) == 2
        # no tp collective around the routed experts: the attentions' (2 layers), the dense
        # MLP's and the shared expert's (one tensor-parallel MLP) all-gathers, and the output
        # layer's, forward
        assert _calls(rank, "tp", "all_gather", "fwd") == {B * S * H * F32: 2 + 1 + 1 + 1}
        # the routers' gradients (whole on each tp rank, each over its own tokens) with the
        # norms': 2 norms a layer and the final one, h each, and one router of h x 4
        assert _calls(rank, "tp", "all_reduce", "grad") == {((2 * 2 + 1) * H + H * 4) * F32: 1}
        # a rank's experts (4 / ep, gated: 3 h x 32 weights each) over the ranks holding them
        edp = 4 // ep
        assert _calls(rank, "edp", "all_reduce", "grad") == (
            {(4 // ep) * 3 * H * 32 * F32: 1} if edp > 1 else {})


@pytest.mark.parametrize(("ep", "routing"), [(2, "learned"), (1, "balanced")],
                         ids=["tp2-dp2-ep2-etp2", "tp2-dp2-ep1-etp2-balanced"])
def test_expert_tensor_parallel_experts_match_one_process(tmp_path, ep, routing):
    # tp 2 x dp 2 = 4 ranks, sequence parallel, etp 2: each routed expert split over the tp pair
    # (up and gate projections column-, down row-parallel: Megatron-Core's TEGroupedMLP with
    # expert_tensor_parallel_size 2); ep 2 over the dp ranks of one tp index (Megatron-Core's
    # expert rank order, etp innermost), edp 1; ep 1: every expert on the tp pair, its slices'
    # gradients with the rest over dp
    etp, experts, k = 2, 4, 2
    result = check_equivalence(MOE, _plan(dp=2, tp=2, ep=ep, etp=etp, sequence_parallel=True),
                               JobParallel(moe_routing=routing), tmp_path)
    _equivalent(result)
    rows = B * S // 2 * k  # the rank's own half of the sequence, k assignments each
    for rank in result["ranks"]:
        # the E counts of the etp x ep ranks all-gathered (Megatron's tp_ep group), int64
        assert _calls(rank, "etp_ep", "all_gather", "fwd") == {etp * ep * experts * 8: 1}
        assert not _calls(rank, "ep", "all_gather")
        a2a = {p: sum(_calls(rank, "ep", "all_to_all", p).values()) for p in ("fwd", "bwd")}
        assert a2a == ({"fwd": 2, "bwd": 2} if ep > 1 else {"fwd": 0, "bwd": 0})
        # the received rows gathered over etp, the outputs reduce-scattered back; backward the
        # adjoints (the gather's a reduce-scatter, the scatter's a gather)
        gathered = {(op, p): _calls(rank, "etp", op, p) for op in ("all_gather", "reduce_scatter")
                    for p in ("fwd", "bwd")}
        assert all(sum(c.values()) == 1 for c in gathered.values())
        if routing == "balanced":  # every rank receives its own count back: etp rows h gathered
            assert all(c == {etp * rows * H * F32: 1} for c in gathered.values())
        # no tp collective around the routed experts (the same as with whole experts)
        assert _calls(rank, "tp", "all_gather", "fwd") == {B * S * H * F32: 2 + 1 + 1 + 1}
        assert _calls(rank, "tp", "all_reduce", "grad") == {((2 * 2 + 1) * H + H * 4) * F32: 1}
        # edp: tp dp / (ep etp) = 1 rank with ep 2; with ep 1 and etp = tp the experts' slices
        # sync with the other parameters over dp
        assert not _calls(rank, "edp", "all_reduce")
        assert len(_calls(rank, "dp", "all_reduce", "grad")) == 1
    if routing == "learned":
        # the learned routing gave the tp pair unequal rows (this seed): gloo's all-gather needs
        # equal sizes, so the job pads them (bytes etp x the largest) and reduce-scatters the
        # unequal sizes; the padded path ran and still matched one process
        uneven = [r for r in result["ranks"]
                  if _calls(r, "etp", "all_gather", "fwd") != _calls(r, "etp", "reduce_scatter",
                                                                      "fwd")]
        assert uneven


# --- ZeRO 1 and 2: Megatron's distributed optimizer -----------------------------------------------


def _zero_plan(zero: int, dp: int, tp: int = 1, cp: int = 1, ep: int = 1,
               micro_batches: int = 2, **options) -> Plan:
    return Plan(gpus=dp * tp * cp, dp=dp, tp=tp, cp=cp, ep=ep, micro_batch=B,
                global_batch=dp * B * micro_batches, dtype="fp32", zero=zero,
                sequence_parallel=tp > 1, **options)


def _stepped(result: dict) -> None:
    """Every parameter after the sharded AdamW step and the all-gather equals AdamW on the whole
    parameters (workload.equivalence: step:<name>)."""
    for rank in result["ranks"]:
        steps = [r for r in rank["results"] if r["name"].startswith("step:")]
        grads = [r for r in rank["results"] if not r["name"].startswith("step:")]
        assert len(steps) == len(grads) - 1  # every parameter, and the loss compared once


@pytest.mark.parametrize("zero", [1, 2])
def test_distributed_optimizer_matches_one_process(tmp_path, zero):
    # dp 2, two micro-batches: the gradients accumulated, scaled by 1/2 and reduce-scattered once
    # (one flat fp32 buffer of every parameter), AdamW on each rank's half, the weights gathered
    result = check_equivalence(DENSE, _zero_plan(zero, dp=2), JobParallel(), tmp_path)
    _equivalent(result)
    _stepped(result)
    layer = 2 * H * H + 2 * H * KV * HD + 3 * H * 64 + 2 * H  # attention, gated MLP, 2 norms
    params = 2 * layer + 2 * 64 * H + S * H + H  # embedding, head, positions, final norm
    for rank in result["ranks"]:
        assert _calls(rank, "dp", "reduce_scatter", "grad") == {params * F32: 1}
        assert not _calls(rank, "dp", "all_reduce")


def test_distributed_optimizer_under_tensor_parallelism_matches_one_process(tmp_path):
    # tp 2 x dp 2, sequence parallel: each rank's buffer holds its tp shards (the norms and the
    # position table whole); the norms' gradients all-reduced over tp first, as with zero 0
    result = check_equivalence(DENSE, _zero_plan(1, dp=2, tp=2), JobParallel(), tmp_path)
    _equivalent(result)
    _stepped(result)
    layer = (2 * H * H + 2 * H * KV * HD + 3 * H * 64) // 2 + 2 * H
    local = 2 * layer + 2 * 64 * H // 2 + S * H + H
    for rank in result["ranks"]:
        assert _calls(rank, "dp", "reduce_scatter", "grad") == {local * F32: 1}
        assert _calls(rank, "tp", "all_reduce", "grad") == {(2 * 2 + 1) * H * F32: 1}


def test_distributed_optimizer_with_experts_and_cp_matches_one_process(tmp_path):
    # dp 2 x cp 2, ep 2: the dense buffer over dp x cp (4 ranks), the experts' over edp (2)
    result = check_equivalence(MOE, _zero_plan(1, dp=2, cp=2, ep=2, micro_batches=1),
                               JobParallel(), tmp_path)
    _equivalent(result)
    _stepped(result)
    for rank in result["ranks"]:
        # the experts of one MoE layer a rank keeps: 2 of 4, each gated (3 h x 32 weights)
        assert _calls(rank, "edp", "reduce_scatter", "grad") == {2 * 3 * H * 32 * F32: 1}
        assert sum(_calls(rank, "dp_cp", "reduce_scatter", "grad").values()) == 1
        assert not _calls(rank, "edp", "all_reduce") and not _calls(rank, "dp_cp", "all_reduce")


def test_distributed_optimizer_with_experts_copied_over_tp_at_one_replica_matches_one_process(
        tmp_path):
    # dp 1 x tp 2, ep 1, sequence parallel: one replica, but each tp rank holds every expert and
    # routes its own tokens: the experts' buffer syncs over edp (the tp pair), the dense buffer
    # nowhere. Before 2026-12-07 the job ran no distributed optimizer at one replica and left
    # the experts' gradients unsynced (found by a fuzz of --dry-run, whose ledger counts the sync)
    result = check_equivalence(MOE, _zero_plan(1, dp=1, tp=2), JobParallel(), tmp_path)
    _equivalent(result)
    _stepped(result)
    for rank in result["ranks"]:
        assert sum(_calls(rank, "edp", "reduce_scatter", "grad").values()) == 1
        assert not _calls(rank, "dp", "reduce_scatter") and not _calls(rank, "edp", "all_reduce")


# --- ZeRO 3 (FSDP2) with expert parallelism ------------------------------------------------------


@pytest.mark.parametrize("dp", [2, 4], ids=["dp2-ep2-edp1", "dp4-ep2-edp2"])
def test_fsdp_with_expert_parallelism_matches_one_process(tmp_path, dp):
    # FSDP2 beside ep 2 (torchtitan's and NeMo AutoModel's layout): the blocks' units over dp; the
    # routed experts of the MoE layer a unit of their own over edp (dp / ep ranks), or, with one
    # rank there (dp 2), left whole; two micro-batches: each unit gathered for every forward and
    # backward, its gradients reduce-scattered in each micro-batch's backward, as perfmodel's
    # ledger counts them
    result = check_equivalence(MOE, _zero_plan(3, dp=dp, ep=2), JobParallel(), tmp_path)
    _equivalent(result)  # the loss and every gradient (the sharded ones gathered whole)
    edp = dp // 2
    # the experts of the MoE layer a rank keeps: 2 of 4, each gated (w1, w3: 32 x h; w2: h x 32)
    experts = 2 * 3 * H * 32
    for rank in result["ranks"]:
        gathers = _calls(rank, "edp", "all_gather")
        scatters = _calls(rank, "edp", "reduce_scatter")
        if edp == 1:
            assert not gathers and not scatters and not _calls(rank, "edp", "all_reduce")
        else:  # each unit's shard padded to whole rows per rank: none here (32, h divide by 2)
            assert gathers == {experts * F32: 2 * 2}
            assert scatters == {experts * F32: 2}
        # every unit over dp: the dense layer, the MoE layer without its routed experts, the
        # root; gathered twice per micro-batch
        assert sum(_calls(rank, "dp", "all_gather").values()) == 3 * 2 * 2
        assert sum(_calls(rank, "dp", "reduce_scatter").values()) == 3 * 2
        assert not _calls(rank, "dp", "all_reduce")


@pytest.mark.parametrize("reshard", ["backward", "step"])
def test_fsdp_kept_gathered_matches_one_process(tmp_path, reshard):
    # FSDP2 with each unit kept gathered from its forward to its backward (reshard_after_forward
    # false), or through the step's two micro-batches and its reduction deferred to the last
    # (NeMo AutoModel's enable_fsdp_optimizations): the same loss and gradients, with one gather a
    # micro-batch, or one gather and one reduce-scatter a step, as perfmodel's ledger counts them
    result = check_equivalence(MOE, _zero_plan(3, dp=4, ep=2, fsdp_reshard=reshard),
                               JobParallel(), tmp_path)
    _equivalent(result)
    per_step = 1 if reshard == "step" else 2  # gathers: one a step, or one a micro-batch (2)
    for rank in result["ranks"]:
        assert sum(_calls(rank, "dp", "all_gather").values()) == 3 * per_step
        assert sum(_calls(rank, "edp", "all_gather").values()) == per_step
        assert sum(_calls(rank, "dp", "reduce_scatter").values()) == 3 * (1 if reshard == "step"
                                                                          else 2)
