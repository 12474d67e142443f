"""When FSDP without a pipeline frees a unit's gathered weights (Plan.fsdp_reshard): after each
forward (two gathers a micro-batch), each backward (one; every unit gathered at the forward's
end), or the step's last backward (one gather and, deferred, one reduction a step; the weights
and the fp32 gradients whole). The validation job's dry run checks the ledger's counts against
FSDP2's own (tests/unit/test_validation_dryrun.py); these check what the model makes of them."""

from __future__ import annotations

import pytest

from perfmodel import Plan, predict
from perfmodel.errors import PlanError
from perfmodel.predict import comm_ledger
from perfmodel.specs.hardware import load_hardware
from perfmodel.specs.model import load_model

MODEL = load_model("llama3-8b")
HW = load_hardware("dgx-h100")
GiB = 2**30


def _plan(mode: str, **changes) -> Plan:
    return Plan(**{"gpus": 8, "dp": 8, "zero": 3, "micro_batch": 1, "global_batch": 32,
                   "recompute": "full", "fsdp_reshard": mode, **changes})


def _calls(mode: str) -> dict[str, float]:
    ledger = comm_ledger(MODEL, _plan(mode), HW)
    out: dict[str, float] = {}
    for row in ledger:
        if "/fsdp_layer/" in row["name"]:
            op = row["name"].rsplit("/", 1)[1]
            out[op] = out.get(op, 0) + row["calls"]
    return out


def test_gathers_and_reductions_per_step():
    """4 micro-batches, 32 layer units: 2 gathers each a micro-batch, 1 kept for the backward,
    1 a step kept through it; reductions 4 a step, 1 where deferred."""
    units = MODEL.layers
    forward, backward, step = (_calls(m) for m in ("forward", "backward", "step"))
    gathers = {m: c.get("all_gather", 0) + c.get("all_gather_once", 0)
               for m, c in (("forward", forward), ("backward", backward), ("step", step))}
    assert gathers == {"forward": 2 * 4 * units, "backward": 4 * units, "step": units}
    assert (forward["reduce_scatter"], backward["reduce_scatter"], step["reduce_scatter"]) == \
        (4 * units, 4 * units, units)


def test_memory_holds_every_unit_gathered_where_kept():
    """Llama 3 8B over 8 GPUs: two layers and the root gathered at a time (2.8 GiB) where each
    unit is freed after its forward; the whole model's bf16 weights (15 GiB) where kept; and with
    the step's units kept the gradients whole in fp32 too (8.03B x 4 B = 29.9 GiB)."""
    parts = {m: predict(MODEL, HW, _plan(m)).memory_breakdown_bytes
             for m in ("forward", "backward", "step")}
    whole = predict(MODEL, HW, _plan("forward")).parameters
    assert parts["forward"]["buffers/zero3_gather"] < 3 * GiB
    for mode in ("backward", "step"):
        assert parts[mode]["buffers/zero3_gather"] == pytest.approx(2 * whole, rel=1e-3)
    assert parts["backward"]["gradients"] == parts["forward"]["gradients"]
    assert parts["step"]["gradients"] == pytest.approx(4 * whole, rel=1e-3)


def test_less_communication_less_time_where_kept():
    times = [predict(MODEL, HW, _plan(m)).breakdown_s["comm/dp"]
             for m in ("forward", "backward", "step")]
    assert times[0] > times[1] > times[2]


@pytest.mark.parametrize("changes, why", [
    (dict(zero=1), "needs zero 3 and pp 1"),
    (dict(gpus=16, pp=2), "needs zero 3 and pp 1"),
    (dict(fsdp_reshard="sometimes"), "fsdp_reshard"),
])
def test_refused_where_fsdp_does_not_run_the_micro_batches(changes, why):
    changes = dict(changes)  # (the parametrized dict is shared)
    with pytest.raises(PlanError, match=why):
        _plan(changes.pop("fsdp_reshard", "step"), **changes)


def test_the_cli_takes_it(run_cli):
    import json

    args = ("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8",
            "--zero", "3", "--global-batch", "32", "--json")
    plain, kept = run_cli(*args), run_cli(*args, "--fsdp-reshard", "step")
    assert plain.returncode == kept.returncode == 0, kept.stderr
    plain_out, kept_out = json.loads(plain.stdout), json.loads(kept.stdout)
    assert kept_out["plan"]["fsdp_reshard"] == "step" and "fsdp_reshard" not in plain_out["plan"]
    assert kept_out["memory_per_gpu_bytes"] > plain_out["memory_per_gpu_bytes"]
    bad = run_cli(*args, "--fsdp-reshard", "never")
    assert bad.returncode == 2 and "fsdp-reshard" in bad.stderr and "Traceback" not in bad.stderr
