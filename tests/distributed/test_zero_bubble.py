"""The zero-bubble schedules run in the real job (torch.distributed.pipelining) and are measured
and compared like the others."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from perfmodel import Plan, load_hardware, load_model  # noqa: E402
from validation import run  # noqa: E402

pytestmark = pytest.mark.distributed


def test_zbv_runs_on_two_ranks_and_its_messages_match_the_ledger(tmp_path):
    model = load_model("tiny-gpt")
    plan = Plan(gpus=2, pp=2, global_batch=4, micro_batch=1, schedule="zbv", virtual_stages=2,
                dtype="fp32").check(model)
    settings = run.RunSettings(nprocs=2, steps=2, warmup=1, timeout_s=120)
    report = run.validate(model, load_hardware("dgx-a100-80gb"), plan, settings, tmp_path / "run")
    assert report["status"] == "ok", report["launch"]
    terms = {t["name"]: t for t in report["terms"]}
    assert terms["forward"]["measured_s"] > 0 and terms["backward"]["measured_s"] > 0
    assert report["predicted_step_time_s"] > 0
    assert report["collectives_vs_ledger"]["agree"], report["collectives_vs_ledger"]
