"""recommend's plans read back by predict (its --json plan as flags, its --csv rows through
`predict --batch`) predict the same step and memory, and are never refused: a fuzz of the round
trip (2026-12-07) found options every plan of a search shares written into plans that have no
use for them, which predict refuses as changing nothing (perfmodel.idle): the buckets and a
pinned overlap of a gradient sync on dp-1 plans, a tensor-parallel backward on tp-1 rows, an
experts' dispatcher on ep-1 rows. Each case failed before its fix."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.unit.test_bad_input import run_main

SEARCH = ["--hardware", "dgx-b200", "--gpus", "8", "--seq-len", "4096"]
# CSV columns that are the search's results, not the plan's
RESULTS = ("evaluated", "step_time_s", "memory_per_gpu_bytes", "fits_in_memory", "objective")


def _flags(plan: dict) -> list[str]:
    """predict's flags for a plan of recommend --json: its fields that are not a plan's
    defaults (a flag at its default is not given), enums by name."""
    from perfmodel import Plan

    defaults = Plan(gpus=1).to_dict()
    out = ["--gpus", str(plan["gpus"])]
    for key, value in plan.items():
        if key == "gpus" or value == defaults.get(key) or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):
            value = ",".join(map(str, value))
        out += [flag] if value is True else [flag, str(value)]
    return out


@pytest.mark.parametrize("model, extra", [
    # dp 1 (tp 8): no overlapped sync for the buckets, no sync for the pinned overlap
    ("llama3.1-8b", ["--global-batch", "8", "--tp", "8", "--dp-bucketing", "all"]),
    ("llama3.1-8b", ["--global-batch", "8", "--tp", "8", "--dp-bucket-size", "10000000"]),
    ("llama3.1-8b", ["--global-batch", "8", "--tp", "8", "--overlap-grad-sync"]),
    # rows of tp 1 with --tp-backward; of ep 1 with --ep-dispatcher
    ("llama3.1-8b", ["--global-batch", "64", "--tp-backward", "dtensor"]),
    ("qwen3-30b-a3b", ["--global-batch", "32", "--pp", "8", "--ep-dispatcher", "deepep"]),
])
def test_recommends_plans_read_back_as_they_are(model: str, extra: list[str], tmp_path: Path):
    table = tmp_path / "plans.csv"
    code, out, err = run_main(["recommend", "--model", model, *SEARCH, *extra, "--top", "1",
                               "--json", "--csv", str(table)])
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    plan = dict(best["plan"])
    plan.pop("gpus_per_node", None)
    code, out, err = run_main(["predict", "--model", model, *SEARCH[:2], "--seq-len", "4096",
                               *_flags(plan), "--json"])
    assert code == 0, err
    predicted = json.loads(out)
    assert predicted["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)
    assert predicted["memory_per_gpu_bytes"] == pytest.approx(best["memory_per_gpu_bytes"],
                                                              rel=1e-9)
    # every row the search evaluated, through predict --batch: none refused, the same numbers
    with table.open() as f:
        rows = [r for r in csv.DictReader(f) if r["evaluated"] == "True"]
    assert rows
    batch = tmp_path / "batch.csv"
    columns = ["model", "hardware", "seq_len"] + [k for k in rows[0] if k not in RESULTS]
    with batch.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in rows[:200]:
            writer.writerow([model, "dgx-b200", "4096", *(r[k] for k in columns[3:])])
    code, out, err = run_main(["predict", "--batch", str(batch), "--json"])
    assert code == 0, err
    for r, got in zip(rows, json.loads(out)["rows"], strict=False):
        assert not got["error"], got["error"]
        assert got["step_time_s"] == pytest.approx(float(r["step_time_s"]), rel=1e-9)
