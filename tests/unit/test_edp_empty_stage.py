"""A pipeline stage that holds no routed experts issues no expert-data-parallel (edp) sync.

Where the experts sync apart (ep > 1: the edp group is not dp x cp), Megatron-LM reduces a
stage's expert gradients over edp only if the stage holds experts; a stage of dense layers only
(moe_first_dense, a short first stage, a pipeline layout) has no expert buffer and issues none,
nor does the validation job. The ledger (rank 0's: the first stage's) used to list a 0-byte edp
all-reduce (ZeRO 1-2: a reduce-scatter and an all-gather) there, and the step charged its launch.

The model: 4 layers, layers 0-1 dense (moe_first_dense 2), 8 routed experts (top 2) and one
shared expert; pp 2 puts layers 0-1 on the first stage, so rank 0 holds no routed expert while
the last stage's two MoE layers still sync theirs.
"""

from __future__ import annotations

import pytest

from perfmodel import Plan, load_hardware, predict
from perfmodel.predict import comm_ledger
from perfmodel.specs.model import TransformerSpec

MOE = TransformerSpec(name="moe-fd2", layers=4, hidden=64, heads=8, kv_heads=4, ffn_hidden=128,
                      seq_len=64, vocab=128, gated_mlp=True, tied_embeddings=False, bias=False,
                      norm="rmsnorm", position_embedding="rotary", experts=8, top_k=2,
                      expert_ffn_hidden=32, shared_experts=1, shared_expert_ffn_hidden=64,
                      moe_first_dense=2, capacity_factor=None, hidden_dropout=0.0,
                      attention_dropout=0.0)
# layer 0 dense only: a first stage of one layer (or the layout E t | t t t L) holds no experts
MOE_ONE_DENSE = MOE.replace(name="moe-drop", moe_first_dense=1)

PP2 = dict(gpus=16, dp=8, pp=2, ep=4, global_batch=16)
# (model, plan) whose first stage holds no routed expert, the experts apart (ep > 1)
EMPTY_FIRST_STAGE = {
    "dense-first-stage": (MOE, PP2),
    "dense-first-stage-zero1": (MOE, {**PP2, "zero": 1}),
    "dense-first-stage-zero2": (MOE, {**PP2, "zero": 2}),
    "dense-first-stage-512": (MOE, dict(gpus=512, dp=32, tp=2, cp=4, pp=2, ep=8,
                                        sequence_parallel=True, global_batch=64, zero=1)),
    "first-stage-layers-1": (MOE_ONE_DENSE, {**PP2, "first_stage_layers": 1}),
    "pipeline-layout": (MOE_ONE_DENSE, {**PP2, "pipeline_layout": "Et|tttL"}),
}


def _edp(model: TransformerSpec, plan: Plan) -> dict[str, dict]:
    return {r["name"]: r for r in comm_ledger(model, plan) if r["axis"] == "edp"}


@pytest.mark.parametrize("name", list(EMPTY_FIRST_STAGE))
def test_a_stage_without_experts_lists_no_edp_sync(name):
    model, plan = EMPTY_FIRST_STAGE[name]
    assert _edp(model, Plan(**plan)) == {}


@pytest.mark.parametrize(("zero", "ops"), [(0, {"edp/all_reduce"}),
                                           (1, {"edp/reduce_scatter", "edp/all_gather"})])
def test_a_first_stage_with_an_moe_layer_still_syncs_its_experts_over_edp(zero, ops):
    """moe_first_dense 1, pp 2: the first stage holds layer 1 (MoE), its E / ep = 2 experts a
    rank (gated: 3 x 64 x 32 weights each) reduced over edp, fp32 (4 B) gradients."""
    rows = _edp(MOE_ONE_DENSE, Plan(**PP2, zero=zero))
    assert set(rows) == ops
    assert all(r["calls"] == 1 for r in rows.values())
    grads = rows["edp/all_reduce" if zero == 0 else "edp/reduce_scatter"]
    assert grads["nbytes"] == 2 * 3 * 64 * 32 * 4


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_the_step_launches_no_edp_collective_for_a_stage_without_experts(zero):
    """The per-step collectives' launches are charged to the optimizer step, one fixed cost
    (collective_overhead_s) each: rank 0's dp sync alone (DDP's all-reduce; ZeRO 1-2 a
    reduce-scatter and an all-gather), not the edp twin it does not issue (before: twice
    as many). The last stage's own edp sync keeps its time in comm/dp, which the launch cost
    does not change."""
    hw = load_hardware("dgx-h100")
    plan = Plan(**PP2, zero=zero)
    extra_s = 1e-3
    base = predict(MOE, hw, plan)
    slow = predict(MOE, hw.replace(collective_overhead_s=hw.collective_overhead_s + extra_s),
                   plan)
    per_step = sum(r["calls"] for r in comm_ledger(MOE, plan) if r["phase"] == "step")
    assert per_step == (1 if zero == 0 else 2)
    launched = slow.breakdown_s["optimizer/step"] - base.breakdown_s["optimizer/step"]
    assert launched == pytest.approx(per_step * extra_s, rel=1e-9)
    assert slow.breakdown_s["comm/dp"] == base.breakdown_s["comm/dp"] > 0


@pytest.mark.parametrize("name", list(EMPTY_FIRST_STAGE))
def test_dry_run_of_a_stage_without_experts_agrees_with_the_ledger(name):
    """The job, counted on a fake process group of the full world, issues no edp collective on
    rank 0; the ledger agrees (before: a 0 B edp all-reduce, or reduce-scatter and all-gather,
    that the job did not issue)."""
    pytest.importorskip("torch")
    from validation import dryrun

    model, plan = EMPTY_FIRST_STAGE[name]
    result = dryrun.dry_run(model, Plan(**plan))
    assert result["ledger_available"]
    assert not [r for r in result["rows"] if r["axis"] == "edp"]
    assert result["agree"], [r for r in result["rows"] if not r["agree"]]
