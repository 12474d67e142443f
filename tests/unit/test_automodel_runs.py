"""NeMo AutoModel's published benchmark runs (tests/data/automodel-runs: its recipes, the
layouts of its performance summary, NVIDIA-NeMo/Automodel docs/performance-summary.md at 01926a5):
each reads as the table's row says it ran (GPUs, FSDP, pp, virtual stages, ep, batch and
gradient accumulation), so that the predictions docs/accuracy.md reports for them are of those
runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.configs import read_config, resolve_model, resolve_plan

RUNS = Path(__file__).resolve().parents[1] / "data" / "automodel-runs"
HF = Path(__file__).resolve().parents[1] / "data" / "hf"

# the table's columns: (#GPUs, FSDP, PP, VP, EP, GBS, MBS, GA), from
# docs/performance-summary.md at 01926a5 (GPT-OSS's EP "-": its recipes' ep_size)
ROWS = {
    "deepseek_v3_256.yaml": (256, 64, 4, 8, 64, 512, 1, 1, None),
    "deepseek_v3_1024.yaml": (1024, 256, 4, 8, 64, 8192, 1, 4, None),
    "kimi_k2_256.yaml": (256, 32, 8, 4, 32, 512, 1, 2, HF / "kimi-k2-instruct" / "config.json"),
    "gpt_oss_120b_64.yaml": (64, 64, 1, 1, 64, 512, 2, 4, None),
    "gpt_oss_20b_8.yaml": (8, 8, 1, 1, 8, 256, 2, 16, HF / "gpt-oss-20b" / "config.json"),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_run_reads_as_its_published_row(name):
    gpus, fsdp, pp, vp, ep, gbs, mbs, ga, hf = ROWS[name]
    job = read_config(RUNS / name)
    spec = resolve_model(job, None if hf is None else str(hf), None)
    _, plan = resolve_plan(job, spec, {"gpus": gpus})
    assert (plan["gpus"], plan["dp"], plan["pp"], plan.get("virtual_stages", 1), plan["ep"],
            plan["global_batch"], plan["micro_batch"], plan["zero"]) == \
        (gpus, fsdp, pp, vp, ep, gbs, mbs, 3)
    micro = gbs // (fsdp * mbs)  # the step's micro-batches: GA schedules of LBS / MBS each
    assert plan.get("pipeline_micro_batches") in ((micro // ga,) if ga > 1 and pp > 1 else
                                                  (None, 0))
    assert plan.get("cross_entropy") == "no-upcast"  # fp32_upcast false


def test_gpt_oss_runs_reduce_every_micro_batch_and_fit():
    """The GPT-OSS rows ran before the MoE parallelizer wrapped the outer model (8134b0c03,
    2025-11-10; the files say wrap_outer_model false), so FSDP reduced every micro-batch and held
    no unsharded fp32 gradients: the 120B run fits its 80 GB H100s, as it ran (it did not when
    perfmodel deferred the reduction: 83.3 GiB)."""
    from perfmodel import Plan, predict

    job = read_config(RUNS / "gpt_oss_120b_64.yaml")
    spec = resolve_model(job, None, None)
    _, plan = resolve_plan(job, spec, {"gpus": 64})
    assert not plan.get("defer_grad_sync")
    assert predict(spec, "dgx-h100", Plan(**plan)).fits_in_memory
