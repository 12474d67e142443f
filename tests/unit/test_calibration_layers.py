"""Framework costs per part recovered from synthetic measurements (calibration.layers).

The synthetic measurements are made from perfmodel's own raw times of each record (what the fit
compares with) and known costs, with multiplicative noise; the fit must give the costs back."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.layers import (
    FSDP_LAYERS,
    LayerCostModel,
    _part_times,
    fit_fsdp_costs,
    fit_layer_costs,
    heads_for,
    layer_sizes,
    raw_times,
    tp_degrees,
)
from perfmodel import Plan, load_model, predict
from perfmodel.errors import DataError
from perfmodel.specs.profile import apply_profile, load_profile

# a CPU measured by calibrate run (documentation's example profile): its layers take milliseconds,
# as the fixed costs do, so both show in the measurements
ROOT = Path(__file__).resolve().parents[2]
HW = apply_profile(None, load_profile(ROOT / "docs/examples/cpu.json")).replace(layer_costs=())
MS = 1e-3


def records(part, style, tp, scale, fwd_s, bwd_s, noise=0.0, seed=0):
    """Layer records of the CPU sizes, measured = scale * compute + fixed + comm (+ noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for size in layer_sizes("cpu", quick=False):
        rows.append(
            {
                "kind": "layer",
                "part": part,
                "style": style,
                "tp": tp,
                "hidden": size.hidden,
                "heads": heads_for(size.hidden, tp),
                "seq_len": size.seq_len,
                "micro_batch": size.micro_batch,
                "vocab": size.vocab,
                "ranks": max(tp, 2),
            }
        )
    df = pd.DataFrame(rows)
    raw = raw_times(df, HW)
    for phase, fixed in (("forward", fwd_s), ("backward", bwd_s)):
        exact = scale * raw[f"compute_{phase}_s"] + fixed + raw[f"comm_{phase}_s"]
        df[f"{phase}_s"] = exact * (1 + noise * rng.standard_normal(len(df)))
    return df


def test_known_costs_are_recovered():
    df = records("layer", "tp", 2, scale=1.4, fwd_s=3 * MS, bwd_s=5 * MS)
    model = LayerCostModel().fit(pd.concat([df, raw_times(df, HW)], axis=1))
    assert model.compute_scale_ == pytest.approx(1.4, rel=1e-3)
    assert model.forward_overhead_s_ == pytest.approx(3 * MS, rel=1e-2)
    assert model.backward_overhead_s_ == pytest.approx(5 * MS, rel=1e-2)
    assert model.residuals_["worst_rel_error"] < 1e-3
    assert model.size_range_ == (128, 512)  # tokens per micro-batch of the CPU sizes


def test_noisy_measurements_still_give_the_costs_within_the_noise():
    df = records("layer", "plain", 1, scale=1.2, fwd_s=0.5 * MS, bwd_s=0.8 * MS, noise=0.03)
    model = LayerCostModel().fit(pd.concat([df, raw_times(df, HW)], axis=1))
    assert model.compute_scale_ == pytest.approx(1.2, rel=0.05)
    assert model.residuals_["median_rel_error"] < 0.05


def test_a_part_with_no_measurable_compute_keeps_scale_one():
    # the embedding: its roofline is microseconds, the fixed cost is all one sees; noise must not
    # drive the scale to its bound (the prior s = 1 decides)
    df = records("embedding", "tp", 2, scale=1.0, fwd_s=1.5 * MS, bwd_s=0.7 * MS, noise=0.1)
    model = LayerCostModel().fit(pd.concat([df, raw_times(df, HW)], axis=1))
    assert model.compute_scale_ == pytest.approx(1.0, abs=0.3)
    assert model.forward_overhead_s_ == pytest.approx(1.5 * MS, rel=0.1)


def test_fit_layer_costs_gives_one_entry_per_part_style_and_degree():
    df = pd.concat(
        [
            records("layer", "plain", 1, 1.1, 0.4 * MS, 0.6 * MS),
            records("layer", "tp", 2, 1.3, 4 * MS, 5 * MS),
            records("output", "tp", 2, 1.2, 3 * MS, 2 * MS),
        ],
        ignore_index=True,
    )
    fits, notes = {}, []
    costs = fit_layer_costs(df, HW, fits, notes)
    assert {(c["part"], c["style"], c["tp"]) for c in costs} == {
        ("layer", "plain", 1),
        ("layer", "tp", 2),
        ("output", "tp", 2),
    }
    assert set(fits) == {"layer/layer/plain/tp1", "layer/layer/tp/tp2", "layer/output/tp/tp2"}
    fit = fits["layer/layer/tp/tp2"]
    assert fit["kind"] == "layer" and fit["params"]["compute_scale"] == pytest.approx(1.3, rel=1e-3)


def test_the_fitted_costs_reproduce_the_measurements_through_predict():
    # the loop closed: fitted entries in a hardware spec, predict's layer forward framework term
    df = records("layer", "tp", 2, scale=1.5, fwd_s=2 * MS, bwd_s=3 * MS)
    costs = fit_layer_costs(df, HW, {}, [])
    from perfmodel.specs.hardware import LayerCost

    hw = HW.replace(layer_costs=tuple(LayerCost(**c) for c in costs))
    model = load_model("tiny-gpt").replace(tied_embeddings=False)
    p = Plan(gpus=2, tp=2, micro_batch=1, global_batch=1, dtype="fp32", flash_attention=True)
    raw = predict(model, HW, p).breakdown_s
    cal = predict(model, hw, p).breakdown_s
    layers = model.layers
    gemm_attn_ew = sum(raw[f"compute/forward/{k}"] for k in ("gemm", "attention", "elementwise"))
    assert cal["compute/forward/framework"] == pytest.approx(
        0.5 * gemm_attn_ew + layers * 2 * MS, rel=1e-3
    )


def test_one_size_is_not_enough():
    df = records("layer", "plain", 1, 1.0, MS, MS).iloc[:1]
    with pytest.raises(DataError, match="at least 2 sizes"):
        LayerCostModel().fit(pd.concat([df, raw_times(df, HW)], axis=1))


def test_degrees_measured_are_the_divisors_of_a_node():
    assert tp_degrees(2, 2) == (2,)
    assert tp_degrees(4, 4) == (2, 4)
    assert tp_degrees(8, 8) == (2, 4, 8)
    assert tp_degrees(16, 8) == (2, 4, 8)  # tensor parallelism stays inside a node
    assert tp_degrees(1, 1) == ()


def test_heads_divide_over_the_degree():
    assert heads_for(128, 1) == 4 and heads_for(384, 4) == 12
    assert heads_for(128, 8) == 8  # rounded up to a multiple of tp, 16 features each


# --- FSDP2 units ----------------------------------------------------------------------------------


def fsdp_records(fwd_s, bwd_s, reduce_s, dp=2):
    rows = []
    for size in layer_sizes("cpu", quick=True):
        base = {
            "kind": "fsdp_unit",
            "units": FSDP_LAYERS,
            "part": "layer",
            "style": "plain",
            "tp": 1,
            "dp": dp,
            "hidden": size.hidden,
            "heads": heads_for(size.hidden, 1),
            "seq_len": size.seq_len,
            "micro_batch": size.micro_batch,
            "vocab": size.vocab,
            "ranks": dp,
        }
        unit = _part_times(pd.Series(base), HW, dp=dp)["fsdp_unit"]
        plain_f, plain_b = 0.01 * size.tokens / 128, 0.02 * size.tokens / 128  # any plain times
        off_f = plain_f + FSDP_LAYERS * (unit["gather_s"] + fwd_s)
        off_b = plain_b + FSDP_LAYERS * (unit["gather_s"] + bwd_s)
        on_b = off_b + FSDP_LAYERS * (unit["reduce_s"] + reduce_s)
        for mode, f, b in (
            ("plain", plain_f, plain_b),
            ("fsdp", off_f, off_b),
            ("fsdp_sync", off_f, on_b),
        ):
            rows.append({**base, "mode": mode, "forward_s": f, "backward_s": b})
    return pd.DataFrame(rows)


def test_fsdp_unit_costs_are_recovered():
    fits, notes = {}, []
    params = fit_fsdp_costs(fsdp_records(2 * MS, 3 * MS, 5 * MS), HW, fits, notes)
    assert params["fsdp_forward_overhead_s"] == pytest.approx(2 * MS, rel=1e-6)
    assert params["fsdp_backward_overhead_s"] == pytest.approx(3 * MS, rel=1e-6)
    assert params["fsdp_reduce_overhead_s"] == pytest.approx(5 * MS, rel=1e-6)
    assert fits["layer/fsdp_unit/plain/tp1"]["worst_rel_error"] < 1e-9


def test_fsdp_needs_every_mode_of_two_sizes():
    df = fsdp_records(MS, MS, MS)
    notes = []
    assert fit_fsdp_costs(df[df["mode"] != "fsdp_sync"], HW, {}, notes) == {}
    assert "at least 2 sizes" in notes[0]


def test_parts_are_fitted_in_the_dtype_they_were_timed_in():
    # a GPU times the parts in bf16 (the job's dtype there), a CPU in fp32: the raw times the fit
    # compares with must be of the same dtype, for rows of itertuples and Series alike
    from calibration.layers import layer_dtype
    from perfmodel import load_hardware

    assert layer_dtype("cuda") == "bf16" and layer_dtype("cpu") == "fp32"
    a100 = load_hardware("dgx-a100-80gb")  # bf16 peak 16x its fp32 peak
    row = {
        "part": "layer",
        "style": "plain",
        "tp": 1,
        "hidden": 1024,
        "heads": 32,
        "seq_len": 1024,
        "micro_batch": 1,
        "vocab": 32768,
    }
    bf16 = _part_times(pd.Series({**row, "dtype": "bf16"}), a100)["layer"]["forward_s"]
    fp32 = _part_times(pd.Series({**row, "dtype": "fp32"}), a100)["layer"]["forward_s"]
    as_tuple = next(pd.DataFrame([{**row, "dtype": "bf16"}]).itertuples())
    assert bf16 < fp32 / 5
    assert _part_times(as_tuple, a100)["layer"]["forward_s"] == bf16
