"""recommend --validate scales the best plan down to this machine, keeping the kind of layout."""

import pytest

pytest.importorskip("torch")

from perfmodel import Plan, load_model  # noqa: E402
from validation.api import scale_down  # noqa: E402


def test_a_large_plan_keeps_its_axes_schedule_and_options_on_four_ranks():
    plan = Plan(gpus=1024, dp=64, tp=2, pp=8, global_batch=1536, schedule="interleaved",
                virtual_stages=12, sequence_parallel=True, recompute="selective", zero=2)
    model, local = scale_down(load_model("gpt3-175b"), plan)
    assert (local.tp, local.pp, local.dp) == (2, 2, 1) and local.gpus <= 4
    assert local.schedule.value == "interleaved" and local.virtual_stages == 2
    assert local.sequence_parallel and local.recompute.value == "selective"
    assert model.layers % (local.pp * local.virtual_stages) == 0 and model.hidden == 256


def test_grouped_query_attention_and_gating_survive():
    model, local = scale_down(load_model("llama3-70b"), Plan(gpus=64, dp=8, tp=8, global_batch=64))
    assert model.gated_mlp and model.kv_heads < model.heads and model.heads % model.kv_heads == 0
    assert (local.dp, local.tp) == (2, 2)
