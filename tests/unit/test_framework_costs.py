"""What the framework adds to a transformer's parts, and the other measured framework terms:
worked examples of perfmodel.costs.framework and of how perfmodel.step charges them."""

import math

import pytest
import sympy as sp

from perfmodel import Plan, load_hardware, load_model, predict
from perfmodel.costs.framework import interpolate_log2
from perfmodel.costs.precision import model_state_bytes_per_param
from perfmodel.errors import SpecError
from perfmodel.predict import part_times
from perfmodel.specs.hardware import LayerCost, hardware_from_dict, load_hardware_dict

# synchronous ranks, as `calibrate run` writes a CPU profile (asynchronous_device false): host
# and device time add, so that each measured cost shows whole in its term (on a GPU preset the
# host's share would hide behind the device: tests/unit/test_execution.py)
HW = load_hardware("dgx-a100-80gb").replace(asynchronous_device=False)
MODEL = load_model("tiny-gpt").replace(tied_embeddings=False)
MS = 1e-3


def cost(part, style, tp, fwd_ms, bwd_ms, scale):
    return LayerCost(
        part=part,
        style=style,
        tp=tp,
        forward_overhead_s=fwd_ms * MS,
        backward_overhead_s=bwd_ms * MS,
        compute_scale=scale,
    )


LAYER_COSTS = (
    cost("layer", "plain", 1, 1.0, 2.0, 1.5),
    cost("layer", "tp", 2, 3.0, 4.0, 2.0),
    cost("layer", "tp", 4, 5.0, 8.0, 3.0),
    cost("embedding", "plain", 1, 0.5, 0.25, 1.0),
    cost("output", "plain", 1, 0.75, 1.25, 1.2),
)
CAL = HW.replace(layer_costs=LAYER_COSTS)


def plan(**kw):
    base = dict(gpus=1, micro_batch=2, global_batch=4, dtype="bf16", flash_attention=True)
    base.update(kw)
    return Plan(**base)


# --- interpolation over the tensor-parallel degrees measured --------------------------------------


def test_interpolation_is_exact_at_the_degrees_and_linear_in_log2_between():
    tp = sp.Symbol("tp", positive=True)
    y = interpolate_log2(tp, [(4, 3.0), (2, 1.0)])  # order does not matter
    at = {d: float(y.subs(tp, d)) for d in (1, 2, 4, 8)}
    assert at == {1: 1.0, 2: 1.0, 4: 3.0, 8: 3.0}  # constant beyond the ends
    # log2(2 sqrt 2) = 1.5: halfway between degree 2 and 4
    assert float(y.subs(tp, 2 * math.sqrt(2))) == pytest.approx(2.0)


def test_one_degree_measured_is_a_constant():
    tp = sp.Symbol("tp", positive=True)
    assert float(interpolate_log2(tp, [(2, 7.0)]).subs(tp, 16)) == 7.0


# --- how the step model charges them --------------------------------------------------------------


def test_without_layer_costs_nothing_changes():
    r = predict(MODEL, HW, plan())
    assert r.breakdown_s["compute/forward/framework"] == 0
    assert r.breakdown_s["compute/backward/framework"] == 0
    assert r.breakdown_s["overhead/kernels"] > 0


def test_a_plain_plan_pays_scale_minus_one_times_compute_plus_the_fixed_costs():
    p = plan()
    raw = part_times(MODEL, HW, p)
    m, L = p.num_micro_batches, MODEL.layers
    r = predict(MODEL, CAL, p)
    # per micro-batch: every layer (1.5 - 1) C + 1 ms, the embedding (1 - 1) C + 0.5 ms, the
    # output (1.2 - 1) C + 0.75 ms; backward the same with 2 C and its own fixed costs
    fwd = (
        L * (0.5 * raw["layer"]["forward_s"] + 1 * MS)
        + 0.5 * MS
        + 0.2 * raw["output"]["forward_s"]
        + 0.75 * MS
    )
    bwd = (
        L * (0.5 * raw["layer"]["backward_s"] + 2 * MS)
        + 0.25 * MS
        + 0.2 * raw["output"]["backward_s"]
        + 1.25 * MS
    )
    assert r.breakdown_s["compute/forward/framework"] == pytest.approx(m * fwd, rel=1e-9)
    assert r.breakdown_s["compute/backward/framework"] == pytest.approx(m * bwd, rel=1e-9)
    # every part measured: no generic per-kernel cost left
    assert r.breakdown_s["overhead/kernels"] == pytest.approx(0, abs=1e-15)
    # the roofline terms themselves are unchanged
    base = predict(MODEL, HW, p)
    assert r.breakdown_s["compute/forward/gemm"] == base.breakdown_s["compute/forward/gemm"]


@pytest.mark.parametrize("tp, fwd_ms, scale", [(2, 3.0, 2.0), (4, 5.0, 3.0), (8, 5.0, 3.0)])
def test_a_tensor_parallel_plan_pays_the_costs_of_its_degree(tp, fwd_ms, scale):
    p = plan(gpus=tp, tp=tp)
    raw = part_times(MODEL, HW, p)["layer"]
    r = predict(MODEL, CAL, p)
    # the layers use the tp entries (8 beyond the largest measured: the values of 4); the
    # embedding and the output layer have no tp entries: their generic kernel cost remains
    layers = r.breakdown_s["compute/forward/framework"] / p.num_micro_batches / MODEL.layers
    assert layers == pytest.approx((scale - 1) * raw["forward_s"] + fwd_ms * MS, rel=1e-9)
    assert r.breakdown_s["overhead/kernels"] == pytest.approx(
        p.num_micro_batches * HW.kernel_overhead_s * (12 + 3), rel=1e-9
    )


def test_a_style_not_measured_keeps_the_generic_kernel_cost():
    sp_plan = plan(gpus=2, tp=2, sequence_parallel=True)  # no tp_sp entries
    r = predict(MODEL, CAL, sp_plan)
    assert r.breakdown_s["compute/forward/framework"] == 0
    assert r.breakdown_s["overhead/kernels"] == pytest.approx(
        predict(MODEL, HW, sp_plan).breakdown_s["overhead/kernels"], rel=1e-12
    )


def test_full_recompute_repeats_the_forward_framework_cost():
    p = plan(recompute="full")
    with_rc = predict(MODEL, CAL, p).breakdown_s["compute/recompute"]
    without = predict(MODEL, HW, p).breakdown_s["compute/recompute"]
    fwd_layer = 0.5 * part_times(MODEL, HW, p)["layer"]["forward_s"] + 1 * MS
    assert with_rc - without == pytest.approx(
        p.num_micro_batches * MODEL.layers * fwd_layer, rel=1e-9
    )


# --- ranks that share a device: the bubble is absorbed --------------------------------------------


@pytest.mark.parametrize("rho, kept", [(1.0, 3.0), (1.25, (8 + 3) / 1.25 - 8), (2.0, 0.0)])
def test_ranks_sharing_a_device_absorb_the_bubble(rho, kept):
    # pp 4, 8 micro-batches: B = 3; the pipeline takes max(m, (m + B) / rho) micro-batch times
    p = plan(gpus=4, pp=4, micro_batch=1, global_batch=8)
    base = predict(MODEL, HW, p).breakdown_s["pipeline/bubble"]
    shared = predict(MODEL, HW.replace(ranks_per_device=rho), p).breakdown_s["pipeline/bubble"]
    assert shared == pytest.approx(base * kept / 3.0, rel=1e-9, abs=1e-15)


def test_ranks_per_device_below_one_is_refused():
    data = {**load_hardware_dict("dgx-a100-80gb"), "ranks_per_device": 0.5}
    with pytest.raises(SpecError, match="ranks_per_device must be >= 1"):
        hardware_from_dict(data, "hw")


# --- the gradient sync's copies and FSDP2's hooks -------------------------------------------------


def test_ddp_copies_the_gradients_three_times():
    p = plan(gpus=2, dp=2, dtype="fp32")
    r = predict(MODEL, HW, p)
    grads = model_state_bytes_per_param("fp32")["gradients"] * r.parameters
    bandwidth = HW.memory_bandwidth_bytes_per_s * HW.memory_bandwidth_efficiency
    # copy into the buckets, scale, copy back: 3 reads and 3 writes of the gradients
    assert r.breakdown_s["comm/dp_framework"] == pytest.approx(6 * grads / bandwidth, rel=1e-9)
    assert predict(MODEL, HW, plan(dtype="fp32")).breakdown_s["comm/dp_framework"] == 0


def test_fsdp_hooks_are_charged_per_unit():
    hw = HW.replace(
        fsdp_forward_overhead_s=1 * MS,
        fsdp_backward_overhead_s=2 * MS,
        fsdp_reduce_overhead_s=4 * MS,
    )
    p = plan(gpus=2, dp=2, zero=3)
    units = MODEL.layers + 1  # one per layer and one for the embedding and output layer
    r, base = predict(MODEL, hw, p), predict(MODEL, HW, p)
    m = p.num_micro_batches
    assert r.breakdown_s["compute/forward/framework"] == pytest.approx(m * units * 1 * MS)
    assert r.breakdown_s["compute/backward/framework"] == pytest.approx(m * units * 2 * MS)
    assert r.breakdown_s["comm/dp_framework"] - base.breakdown_s[
        "comm/dp_framework"
    ] == pytest.approx(units * 4 * MS)
    # no ZeRO: no FSDP unit
    assert predict(MODEL, hw, plan(gpus=2, dp=2)).breakdown_s["compute/forward/framework"] == 0


@pytest.mark.parametrize("zero,reductions", [(1, 1), (2, 1), (3, 4)])
def test_fsdp_reductions_are_charged_per_reduction(zero, reductions):
    """Four micro-batches: ZeRO 3 reduce-scatters in each one's backward (4 reductions a step),
    the distributed optimizer's ZeRO 1-2 once a step."""
    hw = HW.replace(fsdp_reduce_overhead_s=4 * MS)
    p = plan(gpus=2, dp=2, zero=zero, micro_batch=1, global_batch=8)
    assert p.num_micro_batches == 4
    units = MODEL.layers + 1
    extra = predict(MODEL, hw, p).breakdown_s["comm/dp_framework"] \
        - predict(MODEL, HW, p).breakdown_s["comm/dp_framework"]
    assert extra == pytest.approx(reductions * units * 4 * MS)


def test_the_optimizer_has_its_own_bandwidth_efficiency():
    p = plan(dtype="fp32")
    slow = predict(MODEL, HW.replace(optimizer_bandwidth_efficiency=0.25), p)
    fixed = 8 * HW.kernel_overhead_s + HW.optimizer_overhead_s
    base = predict(MODEL, HW, p)
    # 0 (the default) means memory_bandwidth_efficiency
    ratio = (slow.breakdown_s["optimizer/step"] - fixed) / (
        base.breakdown_s["optimizer/step"] - fixed
    )
    assert ratio == pytest.approx(HW.memory_bandwidth_efficiency / 0.25, rel=1e-9)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry, needle",
    [
        (
            {"part": "layr"},
            "part must be one of layer, embedding, output, got 'layr' (did you mean",
        ),
        ({"style": "dp"}, "style must be one of plain, tp, tp_sp"),
        ({"style": "plain", "tp": 2}, "tp must be 1 for style 'plain'"),
        ({"compute_scale": 0}, "compute_scale must be >= 1 and <= 100"),
        # faster than the roofline: accepted before the probe of 2026-12-03 (c)
        ({"compute_scale": 0.5}, "compute_scale must be >= 1 and <= 100"),
        ({"forward_overhead_s": -1}, "forward_overhead_s must be >= 0"),
        ({"tp": 2.5}, "tp must be a whole number"),
    ],
)
def test_bad_layer_costs_name_the_field(entry, needle):
    good = {
        "part": "layer",
        "style": "tp",
        "tp": 2,
        "forward_overhead_s": 0.001,
        "backward_overhead_s": 0.002,
        "compute_scale": 1.2,
    }
    data = {**load_hardware_dict("dgx-a100-80gb"), "layer_costs": [{**good, **entry}]}
    with pytest.raises(SpecError) as err:
        hardware_from_dict(data, "hw")
    assert needle in str(err.value) and "layer_costs[0]" in str(err.value)


def test_layer_costs_twice_for_one_part_style_and_degree_are_refused():
    entry = {
        "part": "layer",
        "style": "tp",
        "tp": 2,
        "forward_overhead_s": 0.001,
        "backward_overhead_s": 0.002,
    }
    data = {**load_hardware_dict("dgx-a100-80gb"), "layer_costs": [entry, entry]}
    with pytest.raises(SpecError, match="given twice"):
        hardware_from_dict(data, "hw")


def test_layer_costs_must_be_a_list_of_mappings():
    data = {**load_hardware_dict("dgx-a100-80gb"), "layer_costs": {"part": "layer"}}
    with pytest.raises(SpecError, match="layer_costs must be a list"):
        hardware_from_dict(data, "hw")
    data["layer_costs"] = [{"part": "layer", "style": "tp"}]
    with pytest.raises(SpecError, match="missing field 'tp'"):
        hardware_from_dict(data, "hw")
