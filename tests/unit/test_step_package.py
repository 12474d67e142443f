"""The step model as a package of phases (perfmodel.step): the composition `explain` prints is the
one predict evaluates, every collective's ledger entry and time come from one declaration, and a
phase refuses what does not belong to it."""

import pytest
import sympy as sp

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel import symbols as S
from perfmodel.codegen import xreplace_shared
from perfmodel.collective import predict_collective
from perfmodel.evaluate import axis_per_node, family_of, values_of
from perfmodel.explain import explain_text
from perfmodel.predict import comm_ledger
from perfmodel.step import Collective, Family, Overlap, Phase, build
from perfmodel.step.compose import exposed

PLANS = [
    dict(gpus=32, tp=8, pp=4, global_batch=64, schedule="interleaved", virtual_stages=2),
    dict(gpus=32, tp=4, pp=4, dp=2, global_batch=64, schedule="zbv", virtual_stages=2,
         sequence_parallel=True, recompute="selective"),
    dict(gpus=16, tp=2, pp=2, dp=4, global_batch=64, schedule="zb", zero=3,
         overlap_grad_sync=True, recompute="full"),
    dict(gpus=16, dp=16, global_batch=32, zero=1, overlap_grad_sync=True),
]


def _numbers(model, hardware, plan):
    values = values_of(model, hardware, plan)
    return {sym: values[name] for name, (sym, _) in S.table().items() if name in values}


@pytest.mark.parametrize("kwargs", PLANS)
def test_the_printed_composition_with_the_terms_values_gives_predicts_step_time(kwargs):
    """explain prints build's composition (T_step = m t_mb + T_bubble + ..., t_mb, T_bubble) in
    its terms' symbols; those symbols' values put into it give predict's step time."""
    model, hw, plan = load_model("llama3-8b"), load_hardware("dgx-h100"), Plan(**kwargs)
    built = build(family_of(model, hw, plan, specialise=True))
    numbers = _numbers(model, hw, plan)
    known = {sym: float(xreplace_shared(expr, numbers)) for sym, expr in built.term_values.items()}
    pending = dict(built.composition)  # T_step, t_mb, T_bubble: each once its symbols are known
    while pending:
        ready = [s for s, e in pending.items()
                 if xreplace_shared(e, numbers).free_symbols <= set(known)]
        assert ready, f"the composition refers to symbols without a value: {pending}"
        for sym in ready:
            known[sym] = float(xreplace_shared(xreplace_shared(pending.pop(sym), numbers), known))
    assert known[sp.Symbol("T_step")] == pytest.approx(predict(model, hw, plan).step_time_s,
                                                       rel=1e-9)
    text = explain_text(model, hw, plan)
    for sym, expr in built.composition.items():
        assert f"  {sym} = {sp.sstr(expr, order='none')}" in text


@pytest.mark.parametrize("kwargs", [dict(gpus=32, tp=8, dp=4, global_batch=64),
                                    dict(gpus=32, tp=8, dp=4, global_batch=64, zero=1,
                                         sequence_parallel=True),
                                    dict(gpus=16, tp=4, dp=4, global_batch=32, zero=3)])
def test_the_ledger_times_the_collective_command_gives_the_communication_terms(kwargs):
    """Each collective is declared once: its ledger entry (calls per step, bytes per call), priced
    by `perfmodel collective` on the group's links, sums to the comm terms of the breakdown, what
    shows and what hides (pp = 1: one stage issues every collective; no overlap but the inputs
    a sequence-parallel plan gathers again, behind the input-gradient GEMMs)."""
    model, hw, plan = load_model("llama3-8b"), load_hardware("dgx-h100"), Plan(**kwargs)
    per_node = axis_per_node(plan, hw.gpus_per_node)
    degree = {"tp": plan.tp, "dp": plan.dp}
    totals = {"tp": 0.0, "dp": 0.0}
    grads = 0.0
    for record in comm_ledger(model, plan, hw):
        call = predict_collective(record["op"], record["nbytes"], degree[record["axis"]], hw,
                                  per_node[record["axis"]][0])["time_s"]
        if record["name"] == "tp/norm_grads/all_reduce":
            grads += record["calls"] * call
        else:
            totals[record["axis"]] += record["calls"] * call
    r = predict(model, hw, plan)
    assert totals["tp"] == pytest.approx(
        r.breakdown_s["comm/tp"] + r.hidden_s.get("comm/tp", 0.0), rel=1e-9)
    assert totals["dp"] == pytest.approx(r.breakdown_s["comm/dp"], rel=1e-9)
    assert grads == pytest.approx(r.breakdown_s["comm/tp_grads"], rel=1e-9, abs=1e-300)


def test_a_collective_is_one_declaration_in_one_phase():
    """The ledger holds one entry per declared collective, in declaration order, and each phase's
    collectives are those that name it."""
    built = build(Family(free_head_dim=True))
    declared = [x for st in ("first", "last", "step") for p in built.phases[st] for x in p.comms]
    for p in (*built.phases["first"], *built.phases["step"]):
        assert all(x.in_phase == p.name for x in p.comms)
    names = {x.name for x in declared} | {"pp/send_recv"}
    assert {op.name for op in built.ledger} == names
    # every option open: 1D, grids, cp, embedding, output, pp, dp (FSDP's units gathered per
    # micro-batch, or once per step under a pipeline and again with more than 3 stages a rank:
    # the layer's and the root's all_gather_again; a sequence-parallel input gathered again for
    # its weight gradient: the layer's and the output layer's; 2.5D's norm weight gradients
    # over the depth as well as along b, since 2026-12-03)
    assert len(built.ledger) == 134


def test_a_phase_refuses_a_term_or_a_collective_not_its_own():
    fam = Family()
    with pytest.raises(ValueError, match="'comm/dp' is not a term of a stage"):
        Phase(name="layers/forward", device={"comm/dp": sp.Integer(1)})
    other = Collective(name="tp/layer/all_reduce", op="all_reduce", axis="tp", nbytes=S.h,
                       calls=sp.Integer(1), phase="fwd", in_phase="layers/backward",
                       term="comm/tp", fam=fam)
    with pytest.raises(ValueError, match="belong to another phase"):
        Phase(name="layers/forward", comms=(other,))
    with pytest.raises(ValueError, match="axis must be one of"):
        Collective(name="x", op="all_reduce", axis="xp", nbytes=S.h, calls=sp.Integer(1),
                   phase="fwd", in_phase="layers/forward", term="comm/tp", fam=fam)


def test_overlap_hides_communication_up_to_its_window():
    """The composition rule: without an Overlap all communication is exposed; with one, what
    exceeds the window (when enabled), the window stretched by the contention k (1 + k: 0 here;
    tests/unit/test_overlap_contention.py for k > 0)."""
    comm, window, k = sp.Integer(5), sp.Integer(3), sp.Integer(0)
    assert exposed(comm, None) == 5
    assert exposed(comm, Overlap("backward", window, sp.Integer(1), contention=k)).doit() == 2
    assert exposed(comm, Overlap("backward", sp.Integer(9), sp.Integer(1),
                                 contention=k)).doit() == 0
    assert exposed(comm, Overlap("backward", window, sp.Integer(0), contention=k)).doit() == 5


def test_two_fits_of_one_collective_were_mixed_and_are_refused():
    """Regression (issue 15): a hardware with a ring and a tree fit of the intra-node all-reduce
    predicted comm/tp with the tree's alpha and bandwidth and the ring's step count (21 s on
    llama2-7b, tp 8, where ring alone gives 0.76 s and tree alone 12.5 s). perfmodel holds one fit
    per op and scope: the second is refused, naming both."""
    from perfmodel.errors import SpecError
    from perfmodel.specs.hardware import CollectiveFit

    hw = load_hardware("dgx-h100")
    ring = CollectiveFit(op="all_reduce", scope="intra", algorithm="ring", alpha_s=1e-5,
                         bus_bandwidth_bytes_per_s=1e11)
    tree = CollectiveFit(op="all_reduce", scope="intra", algorithm="tree", alpha_s=1e-3,
                         bus_bandwidth_bytes_per_s=1e10)
    with pytest.raises(SpecError, match=r"collectives: all_reduce intra has 2 fits \(ring, "
                                        "tree\\): perfmodel uses one fit per op and scope"):
        hw.replace(collectives=(ring, tree))
    inter = CollectiveFit(op="all_reduce", scope="inter", algorithm="tree", alpha_s=1e-3,
                          bus_bandwidth_bytes_per_s=1e10)
    assert len(hw.replace(collectives=(ring, inter)).collectives) == 2  # one per scope is fine
