"""Grid layouts as their implementations run them (a probe of 2026-12-03): what the 3D cube's
linears keep for the backward, the 2.5D norms' weight gradients over the depth, and the
validation job refusing a layout it does not run."""

import functools

import pytest

from perfmodel import Plan, TransformerSpec, comm_ledger
from perfmodel import predict as _predict
from perfmodel.errors import PlanError
from tests.unit.test_bad_input import run_main

predict = functools.partial(_predict, refuse_idle=False)

# one layer, small enough to count by hand: N = b s = 4 x 16 = 64 tokens, hidden 64, MLP 256
TINY = TransformerSpec(name="tiny", layers=1, hidden=64, heads=4, seq_len=16, vocab=128)


def _layers_bytes(plan: Plan, model: object = "gpt-22b", hardware: str = "dgx-a100-80gb") -> float:
    return predict(model, hardware, plan).memory_breakdown_bytes["activations/layers"]


def test_cube_keeps_its_gathered_inputs_and_weights():
    # Colossal-AI's _Linear3D (colossalai/legacy/nn/layer/parallel_3d/_operation.py at
    # b5f9e37c7) all-gathers X (T K / q^2) and W (K M / q^2) and saves both for the backward,
    # as the validation job's workload.layouts.cube3d does. gpt-22b (Korthikanti et al. 2022,
    # Table 1): h 6144, 64 heads, f 4h, 48 layers; micro-batch 16 of 2048 tokens, bf16; q = 4.
    kw = dict(gpus=64, tp=64, micro_batch=16, global_batch=16)
    cube = _layers_bytes(Plan(**kw, tp_layout="3d"))
    split = _layers_bytes(Plan(**kw, sequence_parallel=True))  # every activation over 64 ranks
    h, f, T, q, e, layers = 6144, 4 * 6144, 16 * 2048, 4, 2, 48
    inputs = (q - 1) * e * T * (h + h + h + f) / q**3  # QKV, out, up, down: beyond the local block
    weights = e * (h * 3 * h + h * h + h * f + f * h) / q**2
    assert cube - split == pytest.approx(layers * (inputs + weights), rel=1e-9)


def test_cube_under_full_recompute_keeps_them_only_while_rebuilding():
    kw = dict(gpus=64, tp=64, micro_batch=16, global_batch=16, recompute="full")
    r3 = predict("gpt-22b", "dgx-a100-80gb", Plan(**kw, tp_layout="3d")).memory_breakdown_bytes
    r1 = predict("gpt-22b", "dgx-a100-80gb",
                 Plan(**kw, sequence_parallel=True)).memory_breakdown_bytes
    assert r3["activations/layers"] == pytest.approx(r1["activations/layers"], rel=1e-12)
    h, f, T, q, e = 6144, 4 * 6144, 16 * 2048, 4, 2
    one_layer = (q - 1) * e * T * (3 * h + f) / q**3 + e * (4 * h * h + 2 * h * f) / q**2
    assert r3["activations/recompute_buffer"] - r1["activations/recompute_buffer"] \
        == pytest.approx(one_layer, rel=1e-9)


def test_2_5d_reduces_the_norm_weight_gradients_over_the_depth():
    # 2.5D (Tesseract) splits the tokens over the depth c too, replicating the norms' weights
    # there: their gradients (weight and bias, h / q each) are all-reduced along b and along c
    q, d, E = 2, 2, 4
    plan = Plan(gpus=8, tp=8, tp_layout="2.5d", tp_depth=d, micro_batch=4, global_batch=4,
                dtype="fp32")
    ledger = comm_ledger(TINY, plan)
    norm_grads = E * 2 * 64 / q
    for axis in ("tpb", "tpc"):
        calls = [r["calls"] for r in ledger if r["axis"] == axis and r["op"] == "all_reduce"
                 and r["phase"] == "bwd" and r["nbytes"] == norm_grads]
        assert calls == [2], axis


@pytest.mark.parametrize("layout,extra", [("2d", []), ("3d", []),
                                          ("2.5d", ["--tp-depth", "2"])])
def test_validate_refuses_to_count_a_grid_as_the_1d_job(layout, extra):
    # the dry run counted the Megatron-style 1D job and compared it with the grid's ledger
    # ("differs"); a 2.5D run would have run the 1D job against the 2.5D prediction
    tp = 8 if layout != "2d" else 4
    args = ["validate", "--model", "tiny-gpt", "--gpus", str(tp), "--tp", str(tp),
            "--tp-layout", layout, *extra, "--global-batch", "8", "--micro-batch", "8",
            "--dry-run"]
    code, _, err = run_main(args)
    assert code == 4, err
    assert f"tp_layout {layout}" in err and "1d" in err


def test_the_job_refuses_a_grid_plan():
    from validation.jobspec import as_run

    plan = Plan(gpus=8, tp=8, tp_layout="3d", micro_batch=4, global_batch=4)
    with pytest.raises(PlanError, match="tp_layout 3d"):
        as_run(TINY, plan, "gloo")
