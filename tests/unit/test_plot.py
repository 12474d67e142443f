"""perfmodel.plot: each chart draws the numbers it was given (bar lengths, curves, points)."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from perfmodel import DataError, OutputError, Plan, predict
from perfmodel import plot as P
from perfmodel.layerwise import GridPlan, predict_grid
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model
from tests.conftest import ROOT

GiB = 2**30


@pytest.fixture(scope="module")
def prediction():
    return predict("gpt-22b", "dgx-a100-80gb",
                   Plan(gpus=8, tp=8, micro_batch=4, global_batch=4, recompute="full"))


def bars(ax):
    """(label, length) of the horizontal bars of an Axes, top to bottom."""
    labels = [t.get_text() for t in ax.get_yticklabels()]
    return list(zip(labels, [p.get_width() for p in ax.patches], strict=True))


def test_breakdown_bars_are_the_predictions_terms(prediction):
    ax = P.breakdown_axes(prediction)
    expected = [(k, v) for k, v in prediction.breakdown_s.items() if v > 0]
    assert [k for k, _ in bars(ax)] == [k for k, _ in expected]
    assert [w for _, w in bars(ax)] == pytest.approx([v for _, v in expected], rel=1e-12)
    assert sum(w for _, w in bars(ax)) == pytest.approx(prediction.step_time_s, rel=1e-9)
    assert "compute/recompute" in dict(bars(ax))  # full recompute: a bar of its own
    assert f"{prediction.step_time_s:.4g} s" in ax.get_title()


def test_memory_bars_in_gib_with_the_capacity_line(prediction):
    ax = P.memory_axes(prediction)
    expected = {k: v / GiB for k, v in prediction.memory_breakdown_bytes.items() if v > 0}
    assert dict(bars(ax)) == pytest.approx(expected, rel=1e-12)
    (capacity,) = [line for line in ax.get_lines() if line.get_label() == "capacity"]
    assert capacity.get_xdata()[0] == pytest.approx(prediction.memory_capacity_bytes / GiB)


def test_prediction_figure_draws_both_breakdowns_on_a_given_figure(prediction):
    fig = P.prediction_figure(prediction)
    left, right = fig.axes
    assert dict(bars(left)) == dict(bars(P.breakdown_axes(prediction)))
    assert dict(bars(right)) == dict(bars(P.memory_axes(prediction)))
    ax = P.new_figure().add_subplot()
    assert P.breakdown_axes(prediction, ax) is ax  # draws where it is told


def test_a_layer_graph_prediction_plots_too():
    hw = load_hardware("dgx-v100")
    r = predict_grid(load_model("alexnet"), hw, GridPlan(pr=2, pc=8, global_batch=256))
    ax = P.breakdown_axes(r)
    assert dict(bars(ax)) == pytest.approx({k: v for k, v in r.breakdown_s.items() if v > 0})
    mem = P.memory_axes(r)  # a grid prediction has no memory_capacity_bytes: the hardware's
    (capacity,) = [line for line in mem.get_lines() if line.get_label() == "capacity"]
    assert capacity.get_xdata()[0] == pytest.approx(hw.memory_bytes / GiB)


def test_pareto_front_by_hand():
    times = np.array([1.0, 2.0, 3.0, 4.0, 2.0])
    memory = np.array([4.0, 3.0, 5.0, 1.0, 3.5])
    # (3, 5) is beaten by (2, 3); (2, 3.5) by (2, 3); the rest trade time for memory
    assert P.pareto_front(times, memory).tolist() == [0, 1, 3]
    with pytest.raises(DataError, match="3 times but 2"):
        P.pareto_front(times[:3], memory[:2])


def test_pareto_axes_marks_the_front_and_the_recommended_plan():
    from perfmodel.search import SearchRequest, search

    result = search(load_model("gpt-22b"), load_hardware("dgx-a100-80gb"),
                    SearchRequest(gpus=(8,), global_batch=8, tp_layout="1d", schedule="1f1b",
                                  zero=0))
    ax = P.pareto_axes(result)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert len(result.sample) == result.evaluated  # a small search: the sample is every plan
    t, mem = result.sample.step_time_s, result.sample.memory_bytes / GiB
    front = P.pareto_front(t, mem)
    assert lines["Pareto front"].get_xdata() == pytest.approx(t[front])
    assert lines["Pareto front"].get_ydata() == pytest.approx(mem[front])
    best = result.best
    assert lines["recommended"].get_xdata()[0] == pytest.approx(best.step_time_s[0])
    assert lines["memory limit"].get_ydata()[0] == pytest.approx(result.capacity_bytes / GiB)
    # the recommended plan fits, so it lies on or right of the front below the limit
    assert best.memory_bytes[0] <= result.capacity_bytes


ALL_REDUCE_FIT = {
    "kind": "collective", "op": "all_reduce", "scope": "intra", "algorithm": "ring",
    "params": {"alpha_s": 10e-6, "bus_bandwidth_bytes_per_s": 100e9},
    "median_rel_error": 0.03, "worst_rel_error": 0.1, "size_range": [1e3, 1e9], "n_points": 4,
    "ranks": [8],
}


def test_collective_fit_curve_is_the_alpha_beta_formula_and_points_are_the_measurements():
    measured = pd.DataFrame({"op": "all_reduce", "scope": "intra", "ranks": 8,
                             "nbytes": [1e3, 1e6, 1e9], "time_s": [1.5e-4, 1.6e-4, 1.8e-2]})
    other = measured.assign(op="all_gather")  # not this fit's
    ax = P.collective_fit_axes(ALL_REDUCE_FIT, pd.concat([measured, other]))
    lines = {line.get_label(): line for line in ax.get_lines()}
    x, y = lines["fit n=8"].get_xdata(), lines["fit n=8"].get_ydata()
    # ring all-reduce on 8 ranks: 2 (n - 1) alpha + 2 (n - 1)/n bytes / busbw... with the busbw
    # convention the bytes term is bus_factor x bytes / busbw = 2 (7/8) x / 100e9
    by_hand = (14 * 10e-6 + 2 * 7 / 8 * x / 100e9) * 1e6
    assert y == pytest.approx(by_hand, rel=1e-9)
    assert x[0] == pytest.approx(1e3) and x[-1] == pytest.approx(1e9)
    assert lines["measured n=8"].get_xdata().tolist() == [1e3, 1e6, 1e9]
    assert lines["measured n=8"].get_ydata() == pytest.approx([150, 160, 18000])


GEMM_FIT = {
    "kind": "gemm", "dtype": "bf16", "device": "sm_90", "peak_flops_per_s": 1e15,
    "memory_bandwidth_bytes_per_s": 3e12, "bytes_per_element": 2,
    "params": {"max_fraction": 0.8, "m_half_dim": 64.0, "n_half_dim": 64.0, "k_half_dim": 32.0,
               "batch_half": 0.0, "min_time_s": 5e-6, "half_dim": 0.0},
    "median_rel_error": 0.05, "worst_rel_error": 0.2, "size_range": [2 * 256**3, 2 * 8192**3],
    "n_points": 3,
}


def test_fitted_gemm_time_by_hand():
    # 1024^3: eff = 0.8 (1024/1088)^2 (1024/1056); compute-bound (intensity 341 > 1e15/3e12)
    eff = 0.8 * (1024 / 1088) ** 2 * (1024 / 1056)
    by_hand = 5e-6 + 2 * 1024**3 / (1e15 * eff)
    assert P.fitted_gemm_time(GEMM_FIT, 1, 1024, 1024, 1024) == pytest.approx(by_hand, rel=1e-12)
    # a skinny GEMM is memory-bound: 2 bytes x (16 k + k n + 16 n) / 3e12
    m, n, k = 16, 8192, 8192
    mem = 2 * (m * k + k * n + m * n) / 3e12
    assert P.fitted_gemm_time(GEMM_FIT, 1, m, n, k) == pytest.approx(5e-6 + mem, rel=1e-12)


def test_gemm_fit_axes_points_and_curve():
    rows = pd.DataFrame({"device": "sm_90", "dtype": "bf16", "b": 1, "m": [256, 1024, 8192],
                         "n": [256, 1024, 8192], "k": [256, 1024, 8192],
                         "time_s": [1e-5, 4e-5, 1.6e-3]})
    ax = P.gemm_fit_axes(GEMM_FIT, pd.concat([rows, rows.assign(dtype="fp8")]))
    lines = {line.get_label(): line for line in ax.get_lines()}
    flops = 2 * rows["m"].to_numpy(float) ** 3
    assert lines["measured"].get_xdata() == pytest.approx(flops)
    assert lines["measured"].get_ydata() == pytest.approx(flops / rows["time_s"])
    fitted = flops / P.fitted_gemm_time(GEMM_FIT, 1, rows["m"], rows["n"], rows["k"])
    assert lines["fit, same shapes"].get_ydata() == pytest.approx(fitted)
    curve = lines["fit, square m = n = k"].get_ydata()
    assert np.all(np.diff(curve) > 0) and curve.max() < 0.8e15  # saturates below max_fraction
    assert lines["peak"].get_ydata()[0] == 1e15


def test_bad_fits_are_refused_clearly():
    with pytest.raises(DataError, match="kind 'gemm'"):
        P.gemm_fit_axes(ALL_REDUCE_FIT)
    with pytest.raises(DataError, match="kind 'collective'"):
        P.collective_fit_axes({"op": "all_reduce"})
    with pytest.raises(DataError, match="peak_flops_per_s"):
        P.fitted_gemm_time({**GEMM_FIT, "peak_flops_per_s": None}, 1, 2, 2, 2)


def test_calibration_figure_of_an_imported_nccl_tests_profile(tmp_path):
    from calibration.importers import import_nccl_tests, save
    from perfmodel.specs.profile import load_profile

    logs = sorted((ROOT / "tests/data/nccl-tests").glob("h100x8-*cluster01.txt"))[:2]
    result = import_nccl_tests(logs)
    profile = load_profile(save(result, tmp_path / "p.json", base="dgx-h100"))
    fig = P.calibration_figure(profile)
    drawn = [ax for ax in fig.axes if ax.axison]
    assert len(drawn) == len(profile.fits) == 2
    data = pd.read_csv(profile.measurements)
    for ax, fit in zip(drawn, profile.fits.values(), strict=True):
        (measured,) = [line for line in ax.get_lines() if line.get_label().startswith("measured")]
        rows = data[(data["op"] == fit["op"]) & (data["nbytes"] > 0)]
        assert sorted(measured.get_xdata()) == sorted(rows["nbytes"])
    out = P.calibration_plot(profile, tmp_path / "fits.svg")
    assert out.read_text().lstrip().startswith("<?xml")  # the suffix chooses the format
    with pytest.raises(DataError, match="no gemm fits"):
        P.calibration_figure(profile, kinds=("gemm",))
    with pytest.raises(DataError, match="unknown fit kind 'gemms'"):
        P.calibration_figure(profile, kinds=("gemms",))


REPORT = {
    "model": "tiny-gpt", "plan_label": "dp2",
    "terms": [{"name": "forward", "predicted_s": 0.1, "measured_s": 0.12},
              {"name": "backward", "predicted_s": 0.2, "measured_s": 0.15},
              {"name": "pipeline", "predicted_s": 0.0, "measured_s": None}],
    "predicted_step_time_s": 0.3, "measured_step_time_s": 0.27,
}


def test_validation_bars_are_the_reports_numbers_in_ms():
    ax = P.validation_axes(REPORT)
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([100, 200, 0, 300, 120, 150, 0, 270])  # predicted, measured
    assert [t.get_text() for t in ax.get_xticklabels()] == ["forward", "backward", "pipeline",
                                                            "step"]
    with pytest.raises(DataError, match="validation report"):
        P.validation_axes({"model": "m"})


def test_predicted_against_measured_from_reports_and_from_the_history_csv(tmp_path):
    reports = [REPORT, {**REPORT, "plan_label": "tp2", "measured_step_time_s": 0.6},
               {**REPORT, "plan_label": "failed", "measured_step_time_s": None}]
    runs = P.runs_frame(reports)
    assert runs["plan"].tolist() == ["dp2", "tp2"]  # a run that did not measure is dropped
    assert runs["relative_error"].tolist() == pytest.approx([-0.1, 1.0])
    history = tmp_path / "history.csv"
    runs.drop(columns="relative_error").to_csv(history, index=False)
    ax = P.predicted_vs_measured_axes(history)
    (points,) = [line for line in ax.get_lines() if line.get_label() == "runs"]
    assert points.get_xdata() == pytest.approx([300, 300])
    assert points.get_ydata() == pytest.approx([270, 600])
    assert "median |error| 55%, worst 100%" in ax.get_title()
    path = P.history_plot(history, tmp_path / "h.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_bad_run_data_is_refused_clearly(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        P.runs_frame(tmp_path / "missing.csv")
    (tmp_path / "bad.csv").write_text("plan,step\nx,1\n")
    with pytest.raises(DataError, match="no column 'predicted_step_time_s'"):
        P.runs_frame(tmp_path / "bad.csv")
    with pytest.raises(DataError, match="no run with both"):
        P.predicted_vs_measured_axes([{**REPORT, "measured_step_time_s": None}])
    with pytest.raises(DataError, match="expected validation reports"):
        P.runs_frame([1.0])


def test_sweep_figure_lines_are_the_tables_rows():
    frame = pd.DataFrame({"peak_flops_per_s": [1e13, 1e14, 1e13, 1e14],
                          "inter_node.bandwidth_bytes_per_s": [1e10, 1e10, 5e10, 5e10],
                          "step_time_s": [2.0, 1.0, 1.5, 0.5],
                          "communication_share": [0.1, 0.4, 0.05, 0.2]})
    fig = P.sweep_figure(frame, ["peak_flops_per_s", "inter_node.bandwidth_bytes_per_s"])
    top, bottom = fig.axes
    assert [line.get_ydata().tolist() for line in top.get_lines()] == [[2.0, 1.0], [1.5, 0.5]]
    assert bottom.get_lines()[0].get_ydata() == pytest.approx([10, 40])
    with pytest.raises(DataError, match="no column 'gpus'"):
        P.sweep_figure(frame, ["gpus"])


def test_writes_are_atomic_and_refuse_a_missing_directory(tmp_path, prediction):
    out = P.prediction_plot(prediction, tmp_path / "p.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert P.breakdown_plot(prediction, tmp_path / "b.pdf").read_bytes()[:4] == b"%PDF"
    assert P.memory_plot(prediction, tmp_path / "m.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pdf", "m.png", "p.png"]  # no temp
    with pytest.raises(OutputError, match="output directory does not exist"):
        P.prediction_plot(prediction, tmp_path / "nowhere" / "p.png")


def test_bad_objects_are_named():
    with pytest.raises(TypeError, match="needs an object with breakdown_s"):
        P.breakdown_axes({"breakdown_s": {}})
    with pytest.raises(TypeError, match="SearchResult"):
        P.pareto_axes(object())


def test_plotting_leaves_pyplot_alone():
    # figures are plain Figure objects: no pyplot state (and no backend switch in a notebook)
    code = ("import sys; from perfmodel import plot as P; from perfmodel.plot import pareto_front;"
            "ax = P.validation_axes(" + repr(REPORT) + "); P.figure_bytes(ax.get_figure());"
            "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr


def test_cli_plots_a_layer_graph_prediction_and_a_gemm_only_profile(run_cli, tmp_path):
    res = run_cli("predict", "--model", "alexnet", "--hardware", "dgx-v100", "--pr", "2", "--pc",
                  "8", "--global-batch", "256", "--plot", tmp_path / "grid.png")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    from calibration.profile_io import provenance, write_profile

    rows = pd.DataFrame({"kind": "gemm", "device": "sm_90", "dtype": "bf16", "b": 1,
                         "m": [256, 1024, 8192], "n": [256, 1024, 8192], "k": [256, 1024, 8192],
                         "time_s": [1e-5, 4e-5, 1.6e-3]})
    path = write_profile(tmp_path / "g.json", hardware={"base": "dgx-h100"},
                         fits={"gemm/sm_90/bf16": GEMM_FIT}, measurements=rows,
                         provenance=provenance(), complete=True)
    res = run_cli("calibrate", "report", path, "--plot", tmp_path / "g.png")
    assert res.returncode == 0, res.stderr  # GEMM fits plot too (collectives only, before)
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
