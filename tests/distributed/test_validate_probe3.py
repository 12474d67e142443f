"""On gloo ranks, where a probe found the job wrong (2026-12-02, third round): zero 3 under
sequence parallelism reduced each norm gradient over tp apart, in the backward, where Megatron
(and the ledger) reduce them in one call; and the distributed optimizer (zero 1, 2) held a
whole copy of the gradients beside its flat buffer and two of the weights at the all-gather,
so that its peak was zero 0's, 36-57% over the prediction. Each test fails before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from perfmodel.specs.hardware import load_hardware  # noqa: E402
from perfmodel.specs.model import TransformerSpec, load_model  # noqa: E402
from perfmodel.strategy import Plan  # noqa: E402
from validation import run  # noqa: E402
from validation.jobspec import JobParallel, RunSettings  # noqa: E402
from validation.parallel import check_equivalence  # noqa: E402

pytestmark = pytest.mark.distributed
F32, B, S, H = 4, 2, 16, 32
DENSE = TransformerSpec(name="tiny-dense", layers=2, hidden=H, heads=4, kv_heads=2, seq_len=S,
                        vocab=64, ffn_hidden=64, gated_mlp=True, bias=False, norm="rmsnorm",
                        tied_embeddings=False)


def test_fsdp_under_sequence_parallelism_reduces_the_norms_shards_in_one_call(tmp_path):
    # dp 2 x tp 2, zero 3, two micro-batches: FSDP2 reduce-scatters each norm's partial sums over
    # dp, then one flat all-reduce over tp of each rank's shards of the 2 L + 1 RMSNorm weights
    # (h / dp = 16 values each); the loss and every gradient as on one process
    plan = Plan(gpus=4, dp=2, tp=2, micro_batch=B, global_batch=2 * B * 2, dtype="fp32",
                zero=3, sequence_parallel=True)
    result = check_equivalence(DENSE, plan, JobParallel(), tmp_path)
    for rank in result["ranks"]:
        bad = [r for r in rank["results"] if not r["ok"]]
        assert not bad, f"rank {rank['rank']}: {bad}"
        tp_reduce = [c for c in rank["collectives"] if c["axis"] == "tp"
                     and c["op"] == "all_reduce" and c["phase"] in ("grad", "bwd")]
        # before: 5 all-reduces of whole 128-byte vectors per micro-batch in the backward
        assert tp_reduce == [{"axis": "tp", "op": "all_reduce", "phase": "grad",
                              "bytes": (2 * 2 + 1) * H // 2 * F32, "count": 1.0}]
    assert result["ok"]


@pytest.mark.parametrize(("zero", "most"), [(1, 0.15), (2, 0.28)])
def test_the_distributed_optimizers_peak_agrees_with_the_prediction(tmp_path, zero, most):
    # tiny-gpt, dp 2 (P = 14.2 MiB of fp32 weights): predicted 52.3 MiB at zero 1 (weights,
    # gradients, half the Adam states, activations), 45.2 at zero 2 (half the gradients); the
    # job read 70.9 MiB at both, zero 0's. Now 56.7: the weights, half the states, and at the
    # step the buffer the weights are gathered into and gloo's copy of it (docs/validation.md)
    model = load_model("tiny-gpt")
    plan = Plan(gpus=2, dp=2, micro_batch=1, global_batch=2, zero=zero, dtype="fp32").check(model)
    report = run.validate(model, load_hardware("dgx-a100-80gb"), plan,
                          RunSettings(nprocs=2, steps=1, warmup=1), Path(tmp_path / "run"))
    assert report["status"] == "ok", report["launch"]
    assert report["collectives_vs_ledger"]["agree"]
    memory = report["memory"]
    assert -0.1 < memory["relative_error"] <= most, memory
