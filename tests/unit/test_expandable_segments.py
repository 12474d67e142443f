"""PyTorch's caching allocator with expandable segments (Plan.expandable_segments,
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): under memory pressure the allocator unmaps the
free blocks' pages and maps what a request needs at a segment's end (c10/cuda/
CUDACachingAllocator.cpp: release_cached_blocks, unmap_block; pytorch/pytorch#96995), so the
step's transient tensors leave no fragmentation margin to count. Megatron-Bridge sets it for the
runs it would otherwise lose to fragmentation (scripts/performance/perf_plugins.py at v0.4.0:
DeepSeek-V3 on H100 and GB200; Llama 3.1 405B FP8 on GB200 at r0.2.0), torchtitan's
run_llama_train.sh since a5e57e4a9 (2024-10-22)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from perfmodel import Plan, SpecError, predict
from perfmodel.configs import read_config
from perfmodel.predict import FRAGMENTATION
from perfmodel.search import SearchRequest, search
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model

ROOT = Path(__file__).resolve().parents[2]
# over the memory by the allocator's margin alone (tests/unit/test_memory_verdict.py)
TIGHT = dict(gpus=8, dp=4, tp=2, sequence_parallel=True, micro_batch=2, global_batch=32, zero=1)


def test_no_fragmentation_margin_and_the_rest_unchanged():
    caching = predict("llama3-8b", "dgx-h100", Plan(**TIGHT))
    expandable = predict("llama3-8b", "dgx-h100", Plan(**TIGHT, expandable_segments=True))
    assert caching.memory_verdict == "tight" and not caching.fits_in_memory
    assert caching.memory_breakdown_bytes[FRAGMENTATION] > 2**30
    assert expandable.memory_breakdown_bytes[FRAGMENTATION] == 0
    assert expandable.memory_verdict == "fits" and expandable.fits_in_memory
    assert expandable.memory_per_gpu_bytes == pytest.approx(caching.memory_without_margin_bytes)
    for key, value in caching.memory_breakdown_bytes.items():
        if key != FRAGMENTATION:
            assert expandable.memory_breakdown_bytes[key] == pytest.approx(value)
    assert expandable.step_time_s == caching.step_time_s


def test_the_plan_says_it_only_when_on():
    assert "expandable_segments" not in Plan(**TIGHT).to_dict()
    assert Plan(**TIGHT, expandable_segments=True).to_dict()["expandable_segments"] is True
    with pytest.raises(Exception, match="expandable_segments"):
        Plan(**TIGHT, expandable_segments="sometimes")


def test_the_search_counts_memory_as_predict_does():
    """recommend's search (its own encoding of the request's values) finds the tight plan only
    with expandable segments, and its memory is predict's for the same plan."""
    model, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    found = {}
    for on in (False, True):
        req = SearchRequest(gpus=(8,), global_batch=32, dtype="bf16", dp=4, tp=2, pp=1, cp=1,
                            micro_batch=2, zero=1, sequence_parallel=True, recompute="none",
                            memory_margin=0.0, expandable_segments=on)
        found[on] = search(model, hw, req)
    assert not len(found[False].best) and len(found[True].best)
    best = found[True]
    plan = best.best_plans()[0]
    assert plan.expandable_segments
    again = predict(model, hw, plan)
    assert again.memory_per_gpu_bytes == pytest.approx(float(best.best.memory_bytes[0]))
    assert again.step_time_s == pytest.approx(float(best.best.step_time_s[0]))


SCRIPT = """#!/bin/bash
{env}
torchrun --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \\
  --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 \\
  --vocab-size 32000
"""


@pytest.mark.parametrize(("env", "on"), [
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", True),
    ("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True\n"
     "export PYTORCH_CUDA_ALLOC_CONF", True),
    ("declare -x PYTORCH_CUDA_ALLOC_CONF='expandable_segments : True'", True),
    # set but not exported: the ranks never see it
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", None),
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nunset PYTORCH_CUDA_ALLOC_CONF",
     None),
    ("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False", False),
    # the newer name first, as c10's allocator config reads them
    ("export PYTORCH_ALLOC_CONF=expandable_segments:False\n"
     "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", False),
    ("export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128", None),
    ("", None)])
def test_a_launch_script_states_the_allocator(tmp_path, env, on):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(env=env))
    job = read_config(path)
    assert job.plan.get("expandable_segments") is on


def test_a_value_pytorch_refuses_is_refused(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(env="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:yes"))
    with pytest.raises(SpecError, match="expandable_segments:yes: PyTorch takes True or False"):
        read_config(path)


def test_cli_emit_and_read_back(run_cli, tmp_path):
    """predict --expandable-segments says so; recommend --emit-config writes the export into the
    launch script, which --from-config reads back."""
    out = run_cli("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--tp", "2", "--sequence-parallel", "--micro-batch", "2", "--global-batch",
                  "32", "--zero", "1", "--expandable-segments", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["plan"]["expandable_segments"] is True
    assert data["memory_verdict"] == "fits"
    out = run_cli("recommend", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
                  "--global-batch", "32", "--expandable-segments", "--emit-config", "megatron",
                  tmp_path / "job")
    assert out.returncode == 0, out.stderr
    script = (tmp_path / "job" / "launch.sh").read_text()
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in script
    out = run_cli("predict", "--from-config", tmp_path / "job" / "launch.sh", "--hardware",
                  "dgx-h100", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["expandable_segments"] is True


def test_the_benchmark_reads_the_feature():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_accuracy as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench.generic_feature("expandable segments") == {"expandable_segments": True}
    assert bench.generic_feature("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") == {
        "expandable_segments": True}


def test_a_variable_set_and_not_exported_is_said_and_not_read(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(env="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    job = read_config(path)
    assert "expandable_segments" not in job.plan
    assert any("set but not exported" in note for note in job.notes)


def test_recommend_from_config_refuses_a_flag_the_config_contradicts(run_cli, tmp_path):
    path = tmp_path / "train.sh"
    path.write_text(SCRIPT.format(env="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"))
    out = run_cli("recommend", "--from-config", path, "--hardware", "dgx-h100",
                  "--expandable-segments")
    assert out.returncode == 4
    assert "contradicts the config's expandable_segments False" in out.stderr


def test_a_layer_graph_refuses_it(run_cli):
    out = run_cli("predict", "--model", "resnet50", "--hardware", "dgx-h100", "--gpus", "8",
                  "--expandable-segments")
    assert out.returncode == 2 and "--expandable-segments" in out.stderr


def test_the_validation_job_runs_with_the_allocator(monkeypatch, tmp_path):
    """The local run's ranks get PYTORCH_CUDA_ALLOC_CONF; --emit's run.sh and job.sbatch export
    it."""
    from validation import run as validation_run

    seen = {}

    def fake_launch(module, args, nprocs, run_dir, **kwargs):
        seen.update(kwargs.get("env") or {})
        raise RuntimeError("stop")

    monkeypatch.setattr(validation_run, "launch", fake_launch)
    settings = validation_run.RunSettings(nprocs=1)
    with pytest.raises(RuntimeError, match="stop"):
        validation_run.run_job({"plan": {"expandable_segments": True}}, tmp_path, settings)
    assert seen == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert validation_run.allocator_env({}) == {}
