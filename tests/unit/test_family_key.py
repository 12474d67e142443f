"""The disk cache of compiled formulas is keyed by the family as text: that text must be the same in
every process, whatever PYTHONHASHSEED orders a frozenset's strings by (a warm predict that
rebuilt its formulas in each process is how this showed)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

PRINT_KEY = (
    "from perfmodel import load_hardware, load_model\n"
    "from perfmodel.evaluate import family_key, family_of\n"
    "from perfmodel.strategy import Plan\n"
    "hw = load_hardware('dgx-h100')\n"
    "plan = Plan(gpus=16, dp=2, tp=8, global_batch=8, micro_batch=1)\n"
    "print(family_key(family_of(load_model('llama3-8b'), hw, plan)))\n"
)


def _key(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", PRINT_KEY], env=env, capture_output=True,
                          text=True, check=True, cwd=ROOT).stdout


def test_the_family_key_does_not_depend_on_the_hash_seed():
    keys = {_key(seed) for seed in ("1", "2", "3", "4")}
    assert len(keys) == 1
    assert "link_features" in keys.pop()  # a frozenset field, the one whose order moved
