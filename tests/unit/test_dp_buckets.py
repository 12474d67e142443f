"""The data-parallel sync in buckets (Plan.dp_bucket_size, dp_bucketing; perfmodel.step.
data_parallel.sync_buckets): with overlap_grad_sync each bucket is reduced (and gathered) by a
collective of its own, as the stacks issue them: Megatron-Core's DDP buckets its first model
chunk's parameters in buckets of --ddp-bucket-size (default max(4e7, 1e6 dp cp); megatron/core/
distributed/distributed_data_parallel.py), each later chunk of an interleaved pipeline one bucket
(megatron/training/training.py: disable_bucketing for model_chunk_idx > 0); Apex's
DistributedFusedAdam (NeMo 1) and PyTorch DDP bucket every parameter. The bytes are the sync's;
the calls, each with the collective's start-up and per-step latency, grow with the buckets."""

from __future__ import annotations

import math

import pytest

from perfmodel import Plan, load_model, predict
from perfmodel.errors import PlanError
from perfmodel.predict import comm_ledger

MODEL = "gpt3-175b"
# 512 GPUs: tp 8 x pp 8 x dp 8, one micro-batch a rank in each of 8 micro-batches
BASE = dict(gpus=512, tp=8, pp=8, dp=8, micro_batch=1, global_batch=64, zero=1,
            sequence_parallel=True, overlap_grad_sync=True, overlap_param_gather=True)


def _sync(plan: Plan) -> dict[str, dict]:
    rows = comm_ledger(MODEL, plan, "dgx-h100")
    return {r["name"]: r for r in rows if r["name"] in ("dp/reduce_scatter", "dp/all_gather")}


def _first_stage_params(plan: Plan) -> float:
    """Rank 0's parameters (the ledger's): the one-bucket sync's elements."""
    unbucketed = _sync(plan.replace(overlap_grad_sync=False, overlap_param_gather=False,
                                    dp_bucket_size=None, dp_bucketing="megatron"))
    return unbucketed["dp/all_gather"]["nbytes"] / 2  # bf16 weights


@pytest.mark.parametrize("bucketing,v,size", [("all", 1, 50_000_000), ("all", 4, 50_000_000),
                                               ("megatron", 1, 50_000_000),
                                               ("megatron", 4, 50_000_000),
                                               ("megatron", 4, 3_000_000_000)])
def test_each_bucket_is_a_call_of_its_share_of_the_bytes(bucketing, v, size):
    extra = dict(schedule="interleaved", virtual_stages=v) if v > 1 else {}
    plan = Plan(**BASE, **extra, dp_bucket_size=size, dp_bucketing=bucketing)
    params = _first_stage_params(plan)
    whole = _sync(plan.replace(overlap_grad_sync=False, overlap_param_gather=False,
                               dp_bucket_size=None, dp_bucketing="megatron"))
    buckets = (math.ceil(params / size) if bucketing == "all"
               else max(1, math.ceil(params / (v * size)) + v - 1))
    assert buckets > 1
    for name, row in _sync(plan).items():
        assert row["calls"] == buckets
        assert row["calls"] * row["nbytes"] == pytest.approx(whole[name]["nbytes"], rel=1e-9)


def test_without_overlap_the_sync_is_one_bucket_whatever_its_size():
    plan = Plan(**{**BASE, "overlap_grad_sync": False, "overlap_param_gather": False},
                dp_bucket_size=1_000_000, dp_bucketing="all")
    assert all(row["calls"] == 1 for row in _sync(plan).values())


def test_megatron_cores_default_bucket_grows_with_the_data_parallel_ranks():
    # max(4e7, 1e6 dp cp) parameters: 4e7 at dp 8, 5.12e8 at dp 512
    for dp, size in ((8, 40_000_000), (512, 512_000_000)):
        plan = Plan(**{**BASE, "gpus": 64 * dp, "dp": dp, "global_batch": 8 * dp})
        params = _first_stage_params(plan)
        assert _sync(plan)["dp/reduce_scatter"]["calls"] == math.ceil(params / size)


def test_more_buckets_cost_more_where_the_ring_is_long_and_not_where_it_is_short():
    """The same bytes in more calls: each call's latency again. Over 512 ranks (a ring of 511
    steps, 64 of them across nodes with tp 8) that is milliseconds a call; over 2 ranks, about
    nothing."""
    def sync_s(dp: int, size: int) -> float:
        plan = Plan(**{**BASE, "gpus": 64 * dp, "dp": dp, "global_batch": 8 * dp,
                       "overlap_param_gather": False}, dp_bucket_size=size, dp_bucketing="all")
        p = predict(MODEL, "dgx-h100", plan)
        return p.breakdown_s["comm/dp"] + p.hidden_s.get("comm/dp", 0.0)

    wide = sync_s(512, 10_000_000) - sync_s(512, 1_000_000_000)
    narrow = sync_s(2, 10_000_000) - sync_s(2, 1_000_000_000)
    assert wide > 0.05 and narrow < wide / 20


def test_a_bucket_larger_than_a_layer_is_exposed_whole():
    """Overlapped, a sync hides behind the last micro-batch's backward but for its last chunk:
    one layer's (NeMo: "exposes only one DP communication chunk"), or the last bucket's where a
    bucket holds more than a layer's parameters."""
    model = load_model("llama3-8b")
    plan = Plan(gpus=64, dp=64, micro_batch=1, global_batch=64, zero=1,
                overlap_grad_sync=True, overlap_param_gather=True)
    layer_sized = predict(model, "dgx-h100", plan.replace(dp_bucket_size=100_000_000))
    whole = predict(model, "dgx-h100", plan.replace(dp_bucket_size=10_000_000_000))
    assert whole.breakdown_s["comm/dp"] > 5 * layer_sized.breakdown_s["comm/dp"]


@pytest.mark.parametrize("change,needle", [
    (dict(dp_bucket_size=0), "dp_bucket_size must be between 1"),
    (dict(dp_bucket_size=2.5), "whole number"),
    (dict(dp_bucket_size=True), "whole number"),
    (dict(dp_bucketing="every"), "dp_bucketing"),
    (dict(zero=3, dp_bucket_size=1000), "ZeRO 3"),
    (dict(zero=3, dp_bucketing="all"), "ZeRO 3"),
])
def test_bad_buckets_are_refused_naming_the_field(change, needle):
    with pytest.raises(PlanError, match=needle):
        Plan(**{**BASE, **change})


def test_the_plan_writes_its_buckets_only_where_given():
    assert "dp_bucket_size" not in Plan(**BASE).to_dict()
    assert "dp_bucketing" not in Plan(**BASE).to_dict()
    given = Plan(**BASE, dp_bucket_size=123, dp_bucketing="all").to_dict()
    assert given["dp_bucket_size"] == 123 and given["dp_bucketing"] == "all"
    assert Plan(**given).dp_bucket_size == 123


# --- the buckets as the stacks' configs give them ------------------------------------------------

def test_megatron_lms_ddp_bucket_size_is_read_with_the_overlap_and_written_back(tmp_path):
    from perfmodel.configs import read_config
    from perfmodel.configs.megatron import megatron_arguments
    from tests.conftest import ROOT

    base = (ROOT / "tests/data/configs/megatron_llama3_8b.txt").read_text()
    path = tmp_path / "args.txt"
    path.write_text(base + "\n--ddp-bucket-size 60000000\n")
    job = read_config(path)
    assert job.plan["dp_bucket_size"] == 60_000_000 and job.plan["overlap_grad_sync"]
    model = load_model("llama3-8b")
    plan = Plan(gpus=64, dp=64, micro_batch=1, global_batch=64, zero=1, overlap_grad_sync=True,
                dp_bucket_size=60_000_000)
    args = [a for group in megatron_arguments(model, plan) for a in group]
    assert args[args.index("--ddp-bucket-size") + 1] == "60000000"
    # without --overlap-grad-reduce Megatron-Core builds one bucket: read, no effect
    path.write_text(base.replace("--overlap-grad-reduce\n", "").replace(
        "--overlap-param-gather\n", "") + "\n--ddp-bucket-size 6\n")
    job = read_config(path)
    assert "dp_bucket_size" not in job.plan
    assert "--ddp-bucket-size 6: no effect" in "\n".join(job.report())


def test_nemo1_apex_optimizer_buckets_every_parameter_in_bucket_cap_mb(tmp_path):
    import yaml

    from perfmodel.configs import read_config
    from tests.conftest import ROOT

    config = yaml.safe_load((ROOT / "tests/data/configs/nemo1_nemotron4_15b.yaml").read_text())
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    job = read_config(path)  # bucket_cap_mb 100, grad_sync_dtype bf16: 100 MiB / 2 bytes
    assert (job.plan["dp_bucket_size"], job.plan["dp_bucketing"]) == (52_428_800, "all")
    del config["model"]["optim"]["bucket_cap_mb"], config["model"]["optim"]["grad_sync_dtype"]
    path.write_text(yaml.safe_dump(config))
    job = read_config(path)  # Apex's default, 100 MiB of fp32 gradients
    assert job.plan["dp_bucket_size"] == 26_214_400
    assert "bucket_cap_mb not given: Apex's default" in "\n".join(job.report())


def test_nemo2s_comm_overlap_callback_buckets_128_mi_parameters(tmp_path):
    import yaml

    from perfmodel.configs import read_config
    from tests.conftest import ROOT

    overlap = "nemo.lightning.pytorch.callbacks.megatron_comm_overlap.MegatronCommOverlapCallback"
    config = yaml.safe_load((ROOT / "tests/data/configs/nemo2_llama3_8b.yaml").read_text())
    config["trainer"]["callbacks"] = [{"_target_": overlap}]
    config["trainer"]["strategy"]["ddp"]["bucket_size"] = 1000
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    job = read_config(path)  # dp 16 > 1: the callback's 128 x 1024 x 1024 over the DDP's
    assert job.plan["dp_bucket_size"] == 128 * 1024 * 1024
    assert "trainer.strategy.ddp.bucket_size 1000: overridden by" in "\n".join(job.report())
    config["trainer"]["callbacks"] = [{"_target_": overlap, "bucket_size": 5_000_000}]
    path.write_text(yaml.safe_dump(config))
    assert read_config(path).plan["dp_bucket_size"] == 5_000_000


def test_deepspeeds_reduce_bucket_size_buckets_an_overlapped_zero_1_2_reduction(tmp_path):
    import json

    from perfmodel.configs import read_config

    zero = {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 2e8}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "bf16": {"enabled": True}, "zero_optimization": zero}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    job = read_config(path)
    assert (job.plan["dp_bucket_size"], job.plan["dp_bucketing"]) == (200_000_000, "all")
    zero.pop("reduce_bucket_size")
    path.write_text(json.dumps(config))
    assert read_config(path).plan["dp_bucket_size"] == 500_000_000  # DeepSpeed's default
    zero.update(reduce_bucket_size=-3)
    path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="reduce_bucket_size must be a whole number"):
        read_config(path)


def test_the_command_line_refuses_buckets_that_would_change_nothing(run_cli):
    args = ["predict", "--model", "gpt2-small", "--hardware", "dgx-h100", "--gpus", "8",
            "--global-batch", "8", "--zero", "1"]
    for flags, needle in ((["--dp-bucket-size", "1000"], "--dp-bucket-size buckets a gradient "
                                                         "sync overlapped"),
                          (["--dp-bucketing", "all", "--overlap-grad-sync", "--zero", "3"],
                           "ZeRO 3"),
                          (["--dp-bucket-size", "0", "--overlap-grad-sync"],
                           "dp_bucket_size must be between 1")):
        result = run_cli(*args, *flags)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert needle in result.stderr, result.stderr
    ok = run_cli(*args, "--overlap-grad-sync", "--dp-bucket-size", "1000000",
                 "--dp-bucketing", "all")
    assert ok.returncode == 0, ok.stderr
    assert "gradient sync in buckets of 1,000,000 parameters" in ok.stdout
