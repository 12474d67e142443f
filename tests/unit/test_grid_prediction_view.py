"""A layer graph's prediction (perfmodel.layerwise.GridPrediction) shows itself in a REPL and a
notebook as a transformer's Prediction does: one summary line, the breakdown's table, frames."""

import pytest

from perfmodel.layerwise import predict_grid


@pytest.fixture(scope="module")
def grid():
    return predict_grid("resnet50", "dgx-a100-80gb", dict(pr=2, pc=4, global_batch=256))


def test_summary_and_repr_name_the_grid_and_the_numbers(grid):
    line = grid.summary()
    assert line.startswith("resnet50 on 8 x dgx-a100-80gb (Pr 2 x Pc 4, batch 256, fp32")
    assert f"step {grid.step_time_s:.4g} s" in line and line.endswith("per GPU: fits")
    assert repr(grid) == f"<GridPrediction {line}>"
    assert len(repr(grid)) < 300  # not every field, the layers and the hardware with them


def test_notebook_view_and_frames_hold_every_term(grid):
    html = grid._repr_html_()
    assert all(f"<td>{term}</td>" in html for term in grid.breakdown_s)
    frame = grid.breakdown_frame()
    assert list(frame.index) == list(grid.breakdown_s)
    assert frame["share"].sum() == pytest.approx(1.0)
    memory = grid.memory_frame()
    assert memory["bytes"].sum() == pytest.approx(grid.memory_per_gpu_bytes)
