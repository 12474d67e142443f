"""A layer fit held at a bound is not used as is, and no profile makes a time term negative.

The defect: a quick calibration on a loaded machine fitted layer/tp_sp/tp2 at its then lower bound
(compute_scale 0.2, fixed costs ~1e-24 s: its collectives' fits over-priced the layer), and the
step model's framework term (s - 1) x the rooflines came out negative (compute/backward/framework,
predict tiny-gpt --tp 2 --sequence-parallel). calibration.layers now fits s >= 1 and drops a fit
held at a bound that still misses its data; perfmodel.specs.profile reads a layer cost's s < 1 as
1, with a note.
"""

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.layers import (
    MIN_SCALE,
    LayerCostModel,
    fit_layer_costs,
    heads_for,
    layer_sizes,
    raw_times,
)
from perfmodel import Plan, load_model, predict
from perfmodel.specs.profile import apply_profile, load_profile, profile_from_dict

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = ROOT / "docs/examples/cpu.json"
HW = apply_profile(None, load_profile(CPU_PROFILE)).replace(layer_costs=())
MS = 1e-3


def records(part, style, tp, scale, fwd_s, bwd_s, comm=1.0, noise=0.0, seed=0):
    """Layer records of the CPU sizes: measured = scale x compute + fixed + comm x the collectives'
    fitted time (comm < 1: they ran faster than the profile's fits price them)."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame([
        {"kind": "layer", "part": part, "style": style, "tp": tp, "hidden": s.hidden,
         "heads": heads_for(s.hidden, tp), "seq_len": s.seq_len, "micro_batch": s.micro_batch,
         "vocab": s.vocab, "ranks": max(tp, 2)}
        for s in layer_sizes("cpu", quick=False)
    ])
    raw = raw_times(df, HW)
    for phase, fixed in (("forward", fwd_s), ("backward", bwd_s)):
        exact = scale * raw[f"compute_{phase}_s"] + fixed + comm * raw[f"comm_{phase}_s"]
        df[f"{phase}_s"] = exact * (1 + noise * rng.standard_normal(len(df)))
    return df


def fitted(df):
    return LayerCostModel().fit(pd.concat([df, raw_times(df, HW)], axis=1))


# --- calibration: the fit's bounds ---------------------------------------------------------------


def test_the_compute_scale_is_bounded_by_the_rooflines():
    # a layer slightly faster than its kernels' rooflines, with real fixed costs: the fit holds the
    # scale at 1 (the framework adds no negative time) and keeps the fixed costs; it still explains
    # the data within the tolerance, so it is used
    assert MIN_SCALE == 1.0
    model = fitted(records("layer", "tp", 2, scale=0.95, fwd_s=3 * MS, bwd_s=5 * MS))
    assert model.compute_scale_ == pytest.approx(1.0, abs=1e-6)
    assert model.forward_overhead_s_ > 2 * MS and model.backward_overhead_s_ > 3 * MS
    assert model.pinned_ == ()
    assert model.residuals_["median_rel_error"] < 0.1


def test_a_fit_the_bounds_hold_away_from_its_data_is_flagged():
    # the loaded machine: everything ran 3x faster than the profile's rooflines and collectives'
    # fits price it; no scale >= 1 and fixed costs >= 0 reach the measurements
    model = fitted(records("layer", "tp_sp", 2, scale=0.3, fwd_s=0.0, bwd_s=0.0, comm=0.3))
    assert model.compute_scale_ >= 1.0
    assert any(p.startswith("compute scale 1 ") for p in model.pinned_)
    assert any(p.startswith("forward fixed cost 0 s") for p in model.pinned_)
    assert model.bias_["forward"] > 0.1 and model.bias_["backward"] > 0.1


def test_a_pinned_fit_is_kept_at_its_bound_and_a_note_names_it():
    # (a profile keeps every part it measured: a quick calibration on a loaded machine, as the
    # suite's tests/distributed/test_calibration_run.py runs one, pins these fits)
    df = pd.concat([
        records("layer", "tp", 2, 1.3, 4 * MS, 5 * MS),
        records("layer", "tp_sp", 2, scale=0.3, fwd_s=0.0, bwd_s=0.0, comm=0.3),
    ], ignore_index=True)
    fits, notes = {}, []
    costs = fit_layer_costs(df, HW, fits, notes)
    assert [(c["part"], c["style"], c["tp"]) for c in costs] == [("layer", "tp", 2),
                                                                 ("layer", "tp_sp", 2)]
    assert set(fits) == {"layer/layer/tp/tp2", "layer/layer/tp_sp/tp2"}
    assert all(c["compute_scale"] >= 1 for c in costs)
    (note,) = notes
    assert note.startswith("layer costs (layer, tp_sp, tp 2): held at compute scale 1")
    assert "re-run `perfmodel calibrate run` on a quiet machine" in note


def test_a_part_without_compute_at_scale_one_is_kept():
    # the embedding: no compute to speak of, its fixed costs are the fit; s = 1 is the prior's
    # value and the lower bound, and that is no reason to drop it
    df = records("embedding", "tp_sp", 2, scale=1.0, fwd_s=1.5 * MS, bwd_s=0.7 * MS)
    fits, notes = {}, []
    costs = fit_layer_costs(df, HW, fits, notes)
    assert notes == [] and len(costs) == 1
    assert costs[0]["compute_scale"] == pytest.approx(1.0, abs=1e-3)
    assert costs[0]["forward_overhead_s"] == pytest.approx(1.5 * MS, rel=0.1)


# --- perfmodel: a profile's scale below 1 --------------------------------------------------------


def pinned_profile():
    """docs/examples/cpu.json with the defect's layer costs: layer and output under sequence
    parallelism held at the old lower bound 0.2, fixed costs ~0."""
    data = json.loads(CPU_PROFILE.read_text())
    data = copy.deepcopy(data)
    data["hardware"]["layer_costs"] = [
        {"part": "layer", "style": "tp_sp", "tp": 2, "forward_overhead_s": 1.15e-24,
         "backward_overhead_s": 8.4e-23, "compute_scale": 0.20000022156198444},
        {"part": "output", "style": "tp_sp", "tp": 2, "forward_overhead_s": 5.9e-3,
         "backward_overhead_s": 1.8e-27, "compute_scale": 0.2000000000230349},
        {"part": "embedding", "style": "tp_sp", "tp": 2, "forward_overhead_s": 1.6e-3,
         "backward_overhead_s": 2.5e-4, "compute_scale": 0.978},
        {"part": "layer", "style": "tp", "tp": 2, "forward_overhead_s": 5.2e-3,
         "backward_overhead_s": 5.8e-3, "compute_scale": 1.72},
    ]
    return data


def test_a_profile_reads_a_scale_below_one_as_one_with_a_note(capsys):
    prof = profile_from_dict(pinned_profile(), "profile here.json")
    scales = {(c["part"], c["style"]): c["compute_scale"] for c in prof.hardware["layer_costs"]}
    assert scales == {("layer", "tp_sp"): 1.0, ("output", "tp_sp"): 1.0,
                      ("embedding", "tp_sp"): 1.0, ("layer", "tp"): 1.72}
    assert len(prof.notes) == 3
    assert prof.notes[0].startswith("profile here.json: layer cost (layer, tp_sp, tp 2) has "
                                    "compute_scale 0.2")
    hw = apply_profile(None, prof)
    assert min(c.compute_scale for c in hw.layer_costs) == 1.0
    err = capsys.readouterr().err
    assert err.count("note: profile here.json: layer cost") == 3 and "read as 1" in err


def test_the_defects_plan_has_no_negative_term():
    # predict --model tiny-gpt --profile here.json --tp 2 --sequence-parallel --global-batch 2
    hw = apply_profile(None, profile_from_dict(pinned_profile(), "profile here.json"))
    plan = Plan(gpus=2, tp=2, sequence_parallel=True, micro_batch=1, global_batch=2)
    result = predict(load_model("tiny-gpt"), hw, plan)
    negative = {k: v for k, v in result.breakdown_s.items() if v < 0}
    assert negative == {}
    assert result.breakdown_s["compute/backward/framework"] >= 0
    assert np.isfinite(result.step_time_s) and result.step_time_s > 0


def test_a_profile_with_scales_at_or_above_one_is_read_unchanged():
    data = pinned_profile()
    for c in data["hardware"]["layer_costs"]:
        c["compute_scale"] = max(c["compute_scale"], 1.0)
    prof = profile_from_dict(data, "profile fine.json")
    assert prof.notes == ()
    assert prof.hardware["layer_costs"] == data["hardware"]["layer_costs"]
