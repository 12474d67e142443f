"""The dry run against the ledger where a fuzz of random plans (1,257, 8 to 512 ranks,
2026-12-07) found them apart: FSDP2 pads a LayerNorm's weight and bias apart, where the ledger
took them as one tensor of 2 h rows (1 element a rank short wherever dp does not divide h); and
the distributed optimizer at one replica (dp cp 1) with the experts copied over the tp ranks
(edp > 1), where the job synced nothing and the ledger counts the experts' reduce-scatter and
all-gather over edp (the job's gradients were wrong: tests/distributed/
test_parallel_equivalence.py). Each test fails before its fix."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from perfmodel.specs.model import TransformerSpec  # noqa: E402
from perfmodel.strategy import Plan  # noqa: E402
from validation import dryrun  # noqa: E402
from validation.jobspec import JobParallel  # noqa: E402

# LayerNorm with biases, learned positions (the job's GPT): h 64 over up to 512 ranks
GPT = TransformerSpec(name="gpt", layers=1, hidden=64, heads=8, seq_len=64, vocab=128,
                      tied_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0)
MOE = TransformerSpec(name="moe", layers=2, hidden=128, heads=32, kv_heads=8, seq_len=64,
                      vocab=256, gated_mlp=True, bias=False, norm="rmsnorm",
                      tied_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
                      ffn_hidden=128, experts=8, top_k=2, expert_ffn_hidden=128)


def _disagree(result: dict) -> list:
    return [r for r in result["rows"] if not r["agree"]]


@pytest.mark.parametrize("dp", [128, 512])
def test_fsdp_pads_a_layernorms_weight_and_bias_apart(dp):
    result = dryrun.dry_run(GPT, Plan(gpus=dp, dp=dp, zero=3, global_batch=dp, dtype="fp32"),
                            JobParallel())
    assert result["agree"] is True, _disagree(result)


@pytest.mark.parametrize("zero", [1, 2])
def test_the_experts_copied_over_tp_sync_over_edp_at_one_replica(zero):
    plan = Plan(gpus=8, dp=1, tp=8, sequence_parallel=True, global_batch=4, zero=zero,
                dtype="fp32")
    result = dryrun.dry_run(MOE, plan, JobParallel())
    assert result["agree"] is True, _disagree(result)
    edp = {(r["op"], r["job_count"]) for r in result["rows"] if r["axis"] == "edp"}
    assert edp == {("all_gather", 1), ("reduce_scatter", 1)}
