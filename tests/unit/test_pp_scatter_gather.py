"""Pipeline sends as the stacks make them (perfmodel.step.pipeline.p2p_collectives):
Megatron-Core sends a stage's output as it is, 1/tp of it with sequence parallelism (its
get_tensor_shapes); Megatron-LM of 2021-22 (Plan.pp_scatter_gather, its
--no-scatter-gather-tensors-in-pipeline on by default) sent 1/tp without it too, and each rank
all-gathered what it received over tp (p2p_communication: split_tensor_into_1d_equal_chunks,
gather_split_1d_tensor)."""

from __future__ import annotations

import pytest

from perfmodel.errors import PlanError
from perfmodel.predict import comm_ledger, predict
from perfmodel.specs.model import TransformerSpec
from perfmodel.strategy import Plan

MODEL = TransformerSpec(name="gpt", layers=8, hidden=1024, heads=16, seq_len=2048, vocab=32000,
                        source="test model")
WHOLE = 2 * 2048 * 1024  # bf16 bytes of one sample's activation, e T h


def _pipe(plan):
    return {(r["name"], r["stage"]): r for r in comm_ledger(MODEL, plan)
            if r["name"].startswith("pp/")}


def _plan(**kw):
    return Plan(gpus=16, tp=4, pp=4, global_batch=8, **kw)


def test_a_stage_sends_its_output_as_it_is():
    whole = _pipe(_plan())
    assert whole["pp/send_recv", "first"]["nbytes"] == WHOLE
    split = _pipe(_plan(sequence_parallel=True))
    assert split["pp/send_recv", "first"]["nbytes"] == WHOLE / 4
    assert not [k for k in whole if k[0] == "pp/gather/all_gather"]


def test_scatter_gather_sends_a_quarter_and_gathers_each_receive():
    plain, sg = _pipe(_plan()), _pipe(_plan(pp_scatter_gather=True))
    send = sg["pp/send_recv", "first"]
    assert send["nbytes"] == WHOLE / 4
    assert send["calls"] == plain["pp/send_recv", "first"]["calls"]
    gather = sg["pp/gather/all_gather", "first"]
    assert gather["axis"] == "tp" and gather["nbytes"] == WHOLE
    # rank 0 sends each activation and receives its gradient: one gather per micro-batch
    assert gather["calls"] == send["calls"] / 2 == 8
    # the pipeline's time: a quarter over the inter-stage link, the rest gathered over tp
    t_plain = predict(MODEL, "dgx-a100-80gb", _plan()).breakdown_s["pipeline/p2p"]
    t_sg = predict(MODEL, "dgx-a100-80gb", _plan(pp_scatter_gather=True)
                   ).breakdown_s["pipeline/p2p"]
    assert 0 < t_sg < t_plain


@pytest.mark.parametrize("kw", [dict(sequence_parallel=True), dict(tp=1, gpus=4),
                                dict(pp=1, gpus=4)])
def test_scatter_gather_needs_what_megatron_split(kw):
    base = dict(gpus=16, tp=4, pp=4, global_batch=8, pp_scatter_gather=True)
    with pytest.raises(PlanError, match="pp_scatter_gather splits pipeline sends over tp"):
        Plan(**{**base, **kw})
