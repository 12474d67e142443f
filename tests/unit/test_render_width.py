"""Terminal output people can read (issue 18 item 5): in a pipe without COLUMNS, predict and
recommend fit 100 columns; recommend labels each plan's GPUs, time to train, GPU-hours and cost
when given --tokens and --gpu-hour-price; sizes print in KiB/MiB/GiB, never as '3.277e+04 B'."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

WIDTH = 100


def _run(tmp_path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=str(ROOT), PERFMODEL_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "perfmodel", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("args", [
    ["predict", "--model", "gpt3-175b", "--hardware", "dgx-a100-80gb", "--gpus", "64", "--tp",
     "8", "--pp", "8", "--global-batch", "64", "--schedule", "interleaved", "--virtual-stages",
     "3", "--recompute", "selective", "--sequence-parallel"],
    ["recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64",
     "--global-batch", "512", "--tokens", "1e12", "--gpu-hour-price", "2.5", "--top", "3"],
])
def test_the_output_fits_100_columns_and_names_sizes_in_binary_units(tmp_path, args):
    text = _run(tmp_path, *args)
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert wide == []
    assert not re.search(r"\de[+-]\d+ B\b", text), "a size in bytes as a float"
    assert re.search(r"\d GiB", text)
    if args[0] == "recommend":
        for label in ("GPUs", "time to train", "GPU-hours", "cost"):
            assert label in text, label
    else:
        assert "tensor layout 1d" in text and "sequence length 2048" in text
