"""validate's comparison where a probe found it wrong (2026-12-02, third round): zero 3 under
sequence parallelism reduced each norm gradient apart where the ledger counts one call; the
report left context- and expert-parallel communication and the launch cost of collectives in
"other" while the job times them inside forward and backward; the zero-3 refusal named what it
accepts; validate said nothing of the profile's extrapolated fits. Each test fails before its
fix. (The distributed optimizer's memory and the zero-3 gradients' numbers on gloo ranks:
tests/distributed/test_validate_probe3.py.)"""

from __future__ import annotations

import io
import math

import pytest

from perfmodel import Plan, load_model
from perfmodel.errors import DataError
from validation import report as rep

H, L = 256, 4  # tiny-gpt
NORM_VECTORS = (2 * L + 1) * 2  # LayerNorm weight and bias, two norms a layer and the final one


# --- 1. zero 3 with sequence parallelism: one flat all-reduce of the norms' shards -------------


def test_zero3_sequence_parallel_dry_run_agrees_with_one_flat_norm_all_reduce():
    pytest.importorskip("torch")
    from validation import dryrun

    plan = Plan(gpus=64, dp=32, tp=2, zero=3, sequence_parallel=True, global_batch=32,
                dtype="bf16")
    result = dryrun.dry_run(load_model("tiny-gpt"), plan)
    assert result["agree"] is True, [r for r in result["rows"] if not r["agree"]]
    # each rank's FSDP shard of every norm vector (256 / 32 = 8 bf16 values), in one call;
    # before: 18 all-reduces of whole 512-byte vectors in the backward, the model's 9 KiB none
    norms = [r for r in result["rows"] if r["axis"] == "tp" and r["op"] == "all_reduce"
             and r["bytes"] == NORM_VECTORS * (H // 32) * 2]
    assert len(norms) == 1 and norms[0]["job_count"] == norms[0]["model_count"] == 1
    assert "grad" in norms[0]["job_phases"]


def test_the_ledger_counts_rank_0s_fsdp_shard_of_the_norms_under_zero_3():
    from validation.ledger import model_ledger

    model = load_model("tiny-gpt")

    def norm_bytes(**plan: object) -> float:
        ledger = model_ledger(model, Plan(dtype="fp32", sequence_parallel=True, **plan))
        assert ledger is not None
        return next(r["bytes"] for r in ledger if r["name"] == "tp/norm_grads/all_reduce")

    assert norm_bytes(gpus=8, dp=4, tp=2, global_batch=4) == NORM_VECTORS * H * 4
    assert norm_bytes(gpus=8, dp=4, tp=2, global_batch=4, zero=3) == NORM_VECTORS * H // 4 * 4
    # FSDP2 splits a vector's rows as torch.chunk does: rank 0 holds ceil(h / dp) of them
    assert norm_bytes(gpus=6, dp=3, tp=2, global_batch=3, zero=3) == \
        NORM_VECTORS * math.ceil(H / 3) * 4


def test_the_zero3_refusal_names_what_it_refuses():
    from validation.jobspec import model_keys
    from workload.settings import check_parallel

    m = model_keys(load_model("tiny-gpt"))
    dense = Plan(gpus=4, dp=2, tp=2, zero=3, sequence_parallel=True, global_batch=2,
                 dtype="fp32")
    assert check_parallel(m, dense.to_dict()) is None  # dense tp: accepted
    cp = Plan(gpus=4, dp=2, cp=2, zero=3, global_batch=2, dtype="fp32")
    said = check_parallel(m, cp.to_dict())
    assert said is not None and said.startswith("zero 3 with cp (2)")
    assert "without cp or tensor parallelism" not in said  # what it accepts is not refused
    assert "beside dense tensor parallelism" in said


# --- 2. the report's rows: cp and ep communication, the launch cost of collectives ------------


def _record(fwd_comm: dict[str, float], bwd_comm: dict[str, float]) -> dict:
    comm = [{"axis": a, "phase": "fwd", "seconds": s} for a, s in fwd_comm.items()] + \
        [{"axis": a, "phase": "bwd", "seconds": s} for a, s in bwd_comm.items()]
    return {"rank": 0, "steps": [{"step": 1.0, "forward": 0.3, "backward": 0.5,
                                  "grad_sync": 0.05, "optimizer": 0.1, "pipeline_wait": 0.0}],
            "probe": {"comm_seconds": comm}}


def test_context_and_expert_parallel_time_is_taken_out_of_forward_and_backward():
    # forward 0.3 s: 0.1 of it cp, 0.05 ep (and etp); backward 0.5 s: 0.2 cp, 0.02 etp_ep
    r = _record({"cp": 0.1, "ep": 0.04, "etp": 0.01}, {"cp": 0.2, "etp_ep": 0.02})
    step, terms, _ = rep.measured_terms([r])
    assert terms["forward"] == pytest.approx(0.15)
    assert terms["backward"] == pytest.approx(0.28)
    assert terms["cp_comm"] == pytest.approx(0.3)
    assert terms["ep_comm"] == pytest.approx(0.07)
    assert sum(terms.values()) == pytest.approx(step)


def test_predicted_cp_ep_and_launch_costs_go_to_the_rows_that_measure_them():
    breakdown = {"compute/forward/gemm": 1.0, "compute/backward/gemm": 2.0, "comm/tp": 0.1,
                 "comm/cp": 0.4, "comm/ep": 0.2, "overhead/collectives": 0.3,
                 "overhead/kernels": 0.07, "comm/dp": 0.5}
    # the model's micro-batch launches per axis: 2 tp, 6 cp, 1 ep + 1 etp (per step)
    launches = {"tp": 2.0, "cp": 6.0, "ep": 1.0, "etp": 1.0}
    grouped = rep.group_predicted(breakdown, launches)
    assert grouped["tp_comm"] == pytest.approx(0.1 + 0.3 * 2 / 10)
    assert grouped["cp_comm"] == pytest.approx(0.4 + 0.3 * 6 / 10)
    assert grouped["ep_comm"] == pytest.approx(0.2 + 0.3 * 2 / 10)
    assert grouped["other"] == pytest.approx(0.07)  # no longer comm/cp, comm/ep, the launches
    assert sum(grouped.values()) == pytest.approx(sum(breakdown.values()))
    # without the model's launches: in proportion to the rows' communication
    plain = rep.group_predicted(breakdown)
    assert plain["cp_comm"] == pytest.approx(0.4 + 0.3 * 0.4 / 0.7)
    assert sum(plain.values()) == pytest.approx(sum(breakdown.values()))


def test_the_report_json_and_its_table_carry_the_new_rows_and_the_split():
    from rich.console import Console

    prediction = {"step_time_s": 1.0, "memory_per_gpu_bytes": 1e6,
                  "breakdown_s": {"compute/forward/gemm": 0.2, "comm/cp": 0.4,
                                  "overhead/collectives": 0.1}}
    report = rep.build_report(meta={"collective_launches": {"cp": 4.0}},
                              prediction=prediction, launch={},
                              records=[_record({"cp": 0.1}, {"cp": 0.2})])
    rows = {r["name"]: r for r in report["terms"]}
    assert rows["cp_comm"]["predicted_s"] == pytest.approx(0.5)
    assert rows["cp_comm"]["measured_s"] == pytest.approx(0.3)
    assert rows["other"]["predicted_s"] == pytest.approx(0.0)
    assert report["launch_overhead"]["rows"] == {"cp_comm": pytest.approx(0.1)}
    report["extrapolations"] = ["gemm x is outside the sizes the profile measured: extrapolated"]
    out = io.StringIO()
    rep.render(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "cp_comm" in text and "ep_comm" in text
    assert "overhead/collectives" in text and "launches per axis" in text
    assert "note: gemm x is outside the sizes the profile measured: extrapolated" in text


def test_the_model_launches_of_a_cp_plan_are_its_context_parallel_calls():
    from validation.run import collective_launches

    plan = Plan(gpus=2, cp=2, global_batch=2, dtype="fp32")
    launches = collective_launches(load_model("tiny-gpt"), plan, {"bottleneck_stage": "first"})
    assert launches is not None and launches.get("cp", 0) > 0
    assert "dp_cp" not in launches and "dp" not in launches  # the gradient sync: once a step
    assert collective_launches(load_model("tiny-gpt"), plan, None) is None


def test_collect_refuses_a_malformed_launch_split(tmp_path):
    from validation.run import _check_meta

    meta = {"model": "m", "plan": {}, "backend": "gloo", "ranks": 1}
    _check_meta({**meta, "collective_launches": {"cp": 2.0}}, "meta.json")
    with pytest.raises(DataError, match="collective_launches"):
        _check_meta({**meta, "collective_launches": ["cp"]}, "meta.json")
    with pytest.raises(DataError, match="collective_launches.cp"):
        _check_meta({**meta, "collective_launches": {"cp": -1}}, "meta.json")
    with pytest.raises(DataError, match="extrapolations"):
        _check_meta({**meta, "extrapolations": "x"}, "meta.json")


# --- 4. the profile's extrapolated fits: said by validate as predict says them ----------------


def test_validate_reads_the_notes_of_the_profile_the_hardware_came_from(monkeypatch):
    import perfmodel.cli
    from validation.run import extrapolations

    seen = []

    def fake(profile, model, hardware, plan):
        seen.append(profile)
        return ["gemm g is outside the sizes the profile measured: extrapolated"]

    monkeypatch.setattr(perfmodel.cli, "profile_extrapolations", fake)

    class Calibrated:
        source = "calibrated: /some/where/p.json (incomplete run)"

    model, plan = load_model("tiny-gpt"), Plan(gpus=1, global_batch=1, dtype="fp32")
    assert extrapolations(model, Calibrated(), plan) == [
        "gemm g is outside the sizes the profile measured: extrapolated"]
    assert seen == ["/some/where/p.json"]
    assert extrapolations(model, None, plan) == []

    class OnAPreset:  # a profile applied to a preset: its note follows the preset's source
        source = "NVIDIA DGX H100 datasheet; calibrated: /runs/h100.json"

    extrapolations(model, OnAPreset(), plan)
    assert seen[-1] == "/runs/h100.json"
