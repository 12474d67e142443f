"""recommend --emit-config deepspeed writes the buckets its ZeRO 1-2 plan was costed with.

A probe of emitted configs read back (2026-12-07) found ZeRO 1-2 DeepSpeed configs slower read
back than recommend had said: `recommend --model gpt2-small --hardware h100-pcie --gpus 8
--global-batch 32 --zero 2 --emit-config deepspeed DIR` promised 0.0349 s, and `predict
--from-config DIR/ds_config.json` gave 0.0396 s (+13%). The search costs Megatron-Core's default
bucket, max(4e7, 1e6 dp cp) parameters; the config wrote no reduce_bucket_size, and the reader
takes DeepSpeed's default, 5e8 (deepspeed/runtime/zero/config.py), as DeepSpeed would. The
config now states the plan's bucket.
"""

from __future__ import annotations

import json

import pytest

from perfmodel.strategy import BUCKET_MIN_PARAMS


@pytest.mark.parametrize("model, zero", [("gpt2-small", "2"), ("gpt2-small", "1"),
                                         ("llama2-7b", "2")])
def test_a_zero_1_2_config_reads_back_at_the_step_it_was_chosen_for(run_cli, tmp_path, model,
                                                                     zero):
    out = tmp_path / "ds"
    res = run_cli("recommend", "--model", model, "--hardware", "h100-pcie", "--gpus", "8",
                  "--global-batch", "32", "--zero", zero, "--overlap-grad-sync", "--json",
                  "--emit-config", "deepspeed", out)
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    chosen = rec["plans"][rec["emitted"]["plan_rank"] - 1]
    config = json.loads((out / "ds_config.json").read_text())["zero_optimization"]
    assert config["overlap_comm"] is True
    assert config["reduce_bucket_size"] == max(BUCKET_MIN_PARAMS, 1_000_000 * 8)
    back = run_cli("predict", "--from-config", out / "ds_config.json", "--model", model,
                   "--hardware", "h100-pcie", "--gpus", "8", "--json")
    assert back.returncode == 0, back.stderr
    again = json.loads(back.stdout)
    assert again["step_time_s"] == pytest.approx(chosen["step_time_s"], rel=1e-9)
    assert again["memory_per_gpu_bytes"] == pytest.approx(chosen["memory_per_gpu_bytes"],
                                                          rel=1e-9)
    # the same plan, its bucket stated (DeepSpeed buckets every parameter: with pp 1,
    # Megatron-Core's buckets of the one model chunk are the same)
    stated = {"dp_bucket_size": config["reduce_bucket_size"], "dp_bucketing": "all"}
    assert again["plan"] == {**chosen["plan"], **stated}
