"""The 2D layout's collectives against the analytical model's ledger (perfmodel.comm_ledger)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from perfmodel import Plan, PlanError, load_hardware, load_model  # noqa: E402
from validation.layouts import compare  # noqa: E402

pytestmark = pytest.mark.distributed


def _small_model():
    return load_model("tiny-gpt").replace(
        hidden=64, heads=4, kv_heads=4, ffn_hidden=128, seq_len=16, layers=2
    )


def test_2d_block_issues_what_the_model_counts(tmp_path):
    """Every per-layer SUMMA broadcast/reduce, LayerNorm statistic and LayerNorm weight-gradient
    all-reduce (on tpb, 2 x h/q fp32 per norm) agrees in op, axis, bytes and calls."""
    model = _small_model()
    plan = Plan(gpus=4, tp=4, tp_layout="2d", dtype="fp32", micro_batch=2, global_batch=2)
    report = compare.validate_layout(
        model, load_hardware("dgx-a100-80gb"), plan, tmp_path, steps=1, warmup=0
    )
    differs = [
        (r["axis"], r["phase"], r["op"], r["nbytes"], r["job_calls"], r["model_calls"])
        for r in report["ledger"]
        if not r["agree"]
    ]
    assert differs == []
    assert sum(r["job_calls"] for r in report["ledger"]) == 4 * 6 * 2 + 2 * 3
    assert report["measured_block"]["forward_s"] > 0
    assert compare.render(report)[0].startswith("2d layout on 4 ranks")


def test_compare_maps_axes_and_counts_calls():
    measured = [
        {"axis": "col", "op": "broadcast", "phase": "fwd", "nbytes": 8, "calls": 2.0},
        {"axis": "row", "op": "reduce", "phase": "bwd", "nbytes": 4, "calls": 1.0},
    ]
    model = [
        {"axis": "tpa", "op": "broadcast", "phase": "fwd", "nbytes": 8.0, "calls": 2.0},
        {"axis": "tpb", "op": "reduce", "phase": "bwd", "nbytes": 4.0, "calls": 2.0},
    ]
    rows = compare.compare("2d", measured, model)
    assert [(r["axis"], r["agree"]) for r in rows] == [("tpa", True), ("tpb", False)]


def test_models_the_block_cannot_run_are_plan_errors():
    plan = Plan(gpus=4, tp=4, tp_layout="2d", dtype="fp32", micro_batch=2, global_batch=2)
    gqa = _small_model().replace(kv_heads=2)
    with pytest.raises(PlanError, match="kv_heads"):
        compare.block_dims(gqa, plan)


def test_prpc_mlp_layer_graph_is_timed_against_predict_grid(tmp_path):
    from perfmodel.layerwise import GridPlan
    from perfmodel.specs.cnn import mlp

    model = mlp(widths=(32, 16), inputs=24)
    assert compare.mlp_widths(model) == [24, 32, 16]
    plan = GridPlan(pr=2, pc=2, global_batch=8)
    report = compare.validate_grid(
        model, load_hardware("dgx-a100-80gb"), plan, tmp_path, steps=1, warmup=0
    )
    terms = {t["name"]: t for t in report["terms"]}
    assert set(terms) == {
        "compute/forward",
        "compute/backward",
        "comm/model_parallel",
        "comm/data_parallel",
        "optimizer/step",
    }
    assert terms["comm/model_parallel"]["measured_s"] > 0
    assert terms["comm/data_parallel"]["measured_s"] > 0
    assert all(t["predicted_s"] is not None for t in terms.values())
    # per layer: all_gather on pr forward, all_reduce of the weights on pc backward; the input
    # gradient all_reduce on pr for every layer but the first
    ops = sorted((c["tag"], c["phase"], c["op"], c["axis"]) for c in report["collectives"])
    assert ops == [
        ("0:linear", "bwd", "all_reduce", "pc"),
        ("0:linear", "fwd", "all_gather", "pr"),
        ("2:linear", "bwd", "all_reduce", "pc"),
        ("2:linear", "bwd", "all_reduce", "pr"),
        ("2:linear", "fwd", "all_gather", "pr"),
    ]


def test_prpc_layer_narrower_than_pr_runs_as_predict_models_it(tmp_path):
    """fc2 has 1 neuron on Pr = 2: it runs on c = 1 rank, its output and its input gradient reach
    the other rank by one send_recv each (specialised), as predict_grid's layer degrees say."""
    from perfmodel.layerwise import GridPlan
    from perfmodel.specs.cnn import mlp

    model = mlp(widths=(8, 1), inputs=6)
    hardware = load_hardware("dgx-a100-80gb")
    plan = GridPlan(pr=2, pc=1, global_batch=4, contributors="specialised")
    report = compare.validate_grid(model, hardware, plan, tmp_path, steps=1, warmup=0)
    assert report["layer_degrees"] == {"fc1": 2, "fc2": 1}
    assert report["plan"]["contributors"] == "specialised"
    ops = sorted((c["tag"], c["phase"], c["op"], c["nbytes"]) for c in report["collectives"])
    assert ops == [
        ("0:linear", "fwd", "all_gather", 4 * 8 * 4),
        ("2:linear", "bwd", "send_recv", 4 * 8 * 4),  # dX of fc2, from rank 0 to rank 1
        ("2:linear", "fwd", "send_recv", 4 * 1 * 4),  # fc2's output
    ]
    assert {t["name"]: t for t in report["terms"]}["comm/model_parallel"]["measured_s"] > 0
    with pytest.raises(PlanError, match="standard or specialised"):
        compare.validate_grid(
            model, hardware, GridPlan(pr=2, pc=1, global_batch=4, contributors="auto"), tmp_path
        )


def test_a_cnn_layer_graph_is_refused_with_the_way_to_time_it():
    from perfmodel.specs.cnn import alexnet

    with pytest.raises(PlanError, match="--layout prpc"):
        compare.mlp_widths(alexnet())
