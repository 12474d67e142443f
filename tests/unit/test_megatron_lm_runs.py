"""Megatron-LM's H100 weak-scaling runs without a pipeline (tests/data/megatron-lm-runs: the
README's model table at NVIDIA/Megatron-LM f2e5db402c, images/model_table.png): each argument list
reads as the table's row (heads, hidden, layers, tp, dp 48, batch 192, the overlaps the README
names), and each run fits its 80 GB H100s, as it ran; docs/accuracy.md reports their times."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel import Plan, predict
from perfmodel.configs import read_config, resolve_model, resolve_plan

RUNS = Path(__file__).resolve().parents[1] / "data" / "megatron-lm-runs"

# the table's row: heads, hidden, layers, tp, GPUs (pp 1, dp 48, batch 192 in every row)
ROWS = {
    "gpt_1.7b_48.txt": (16, 2048, 24, 1, 48),
    "gpt_7.1b_96.txt": (32, 4096, 30, 2, 96),
    "gpt_16b_192.txt": (48, 6144, 32, 4, 192),
    "gpt_32b_384.txt": (56, 7168, 48, 8, 384),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_run_reads_as_its_row_and_fits(name):
    heads, hidden, layers, tp, gpus = ROWS[name]
    job = read_config(RUNS / name)
    spec = resolve_model(job, None, None)
    _, plan = resolve_plan(job, spec, {"gpus": gpus})
    assert (spec.heads, spec.hidden, spec.layers, spec.seq_len, spec.vocab) == \
        (heads, hidden, layers, 4096, 131072)
    assert (plan["tp"], plan.get("pp", 1), plan["dp"], plan["global_batch"]) == \
        (tp, 1, 48, 192)
    assert plan["overlap_grad_sync"] and plan["overlap_param_gather"] and plan["zero"] == 1
    assert bool(plan.get("tp_comm_overlap")) == (tp > 1)
    assert predict(spec, "dgx-h100", Plan(**plan)).fits_in_memory
