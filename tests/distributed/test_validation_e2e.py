"""validate end to end: real gloo jobs of 2 and 4 ranks on tiny-gpt, and the faults a run can meet.

Each test is one launch (4-15 s here); steps are few because only the loop is checked, not accuracy.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from perfmodel import Plan, load_hardware, load_model  # noqa: E402
from tests.conftest import PATIENCE_S, as_from_a_terminal, wait_for  # noqa: E402
from tests.unit.test_validation_emit import foreign_imports  # noqa: E402
from validation import dryrun, run  # noqa: E402
from validation.cli import validate  # noqa: E402

pytestmark = pytest.mark.distributed

MODEL = "tiny-gpt"
HARDWARE = "dgx-a100-80gb"  # the loop, not the accuracy, is under test here


def _leftovers(run_dir: Path) -> list[int]:
    """Processes still running the job of run_dir (read from /proc)."""
    pids = []
    needle = str(run_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _steps(run_dir: Path, rank: int) -> int:
    """Steps rank has measured so far (0 before its first record)."""
    try:
        return len(json.loads((run_dir / f"rank{rank}.json").read_text())["steps"])
    except (OSError, ValueError, KeyError):
        return 0


def _run(tmp_path: Path, settings: run.RunSettings, **plan: object) -> dict:
    model = load_model(MODEL)
    plan_obj = Plan(dtype="fp32", **plan).check(model)
    run_dir = tmp_path / "run"
    report = run.validate(model, load_hardware(HARDWARE), plan_obj, settings, run_dir)
    assert _leftovers(run_dir) == []
    return report


def _assert_measured(report: dict, ranks: int) -> None:
    assert report["status"] == "ok", report["launch"]
    assert report["ranks"] == ranks
    assert report["steps"] == 2
    assert report["measured_step_time_s"] > 0
    terms = {t["name"]: t for t in report["terms"]}
    assert terms["forward"]["measured_s"] > 0 and terms["backward"]["measured_s"] > 0
    # Terms add up to the step time.
    assert sum(t["measured_s"] for t in report["terms"]) == pytest.approx(
        report["measured_step_time_s"], rel=1e-6
    )
    memory = report["memory"]
    assert memory["measured_peak_per_rank_bytes"] > 0
    # on CPU: the tensors' peak (compared) and the process's resident set (shown, not compared):
    # the resident set also holds the torch runtime, measured before the model
    assert memory["measured_process_peak_per_rank_bytes"] > memory["measured_peak_per_rank_bytes"]
    assert 0 < memory["measured_baseline_per_rank_bytes"] < memory[
        "measured_process_peak_per_rank_bytes"]
    assert memory["relative_error"] == pytest.approx(
        memory["measured_peak_per_rank_bytes"] / memory["predicted_tensor_per_rank_bytes"] - 1)


def test_data_parallel_two_ranks_through_the_cli(tmp_path):
    out = tmp_path / "report.json"
    history = tmp_path / "history.csv"
    result = CliRunner().invoke(
        validate,
        [
            "--model",
            MODEL,
            "--hardware",
            HARDWARE,
            "--dp",
            "2",
            "--micro-batch",
            "2",
            "--global-batch",
            "8",
            "--nprocs",
            "2",
            "--backend",
            "gloo",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
            "--history",
            str(history),
            "--run-dir",
            str(tmp_path / "run"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # a CPU run against a GPU preset: said first, on stderr and in the JSON
    assert report["caveats"][0].startswith("CPU run, GPU prediction: ")
    assert result.stderr.startswith("warning: CPU run, GPU prediction: this compares 2 CPU ranks")
    for key in (
        "predicted_step_time_s",
        "measured_step_time_s",
        "relative_error",
        "steps",
        "ranks",
        "backend",
    ):
        assert report[key] is not None, key
    assert report["backend"] == "gloo" and report["ranks"] == 2
    # bf16 (the default) has no fast path on this CPU: run and prediction both in fp32, and it
    # says so.
    assert report["dtype_used"] == "fp32" and "fp32" in report["dtype_note"]
    assert report["plan"]["dtype"] == "fp32"
    assert all("predicted_s" in t and "measured_s" in t for t in report["terms"])
    assert json.loads(out.read_text())["measured_step_time_s"] == report["measured_step_time_s"]
    assert out.with_suffix(".png").exists()
    assert len(history.read_text().splitlines()) == 2
    # The probe counted the one flat gradient all-reduce of the 2 replicas on rank 0.
    dp_ops = [c for c in report["collectives_rank0"] if c["axis"] == "dp"]
    assert [c["op"] for c in dp_ops] == ["all_reduce"] and dp_ops[0]["count"] == 1
    assert _leftovers(tmp_path / "run") == []


def test_tensor_and_sequence_parallel_two_ranks(tmp_path):
    report = _run(
        tmp_path,
        run.RunSettings(nprocs=2, steps=2, warmup=1),
        gpus=2,
        tp=2,
        sequence_parallel=True,
        micro_batch=2,
        global_batch=4,
    )
    _assert_measured(report, 2)
    terms = {t["name"]: t for t in report["terms"]}
    assert terms["tp_comm"]["measured_s"] > 0
    ops = {c["op"] for c in report["collectives_rank0"] if c["axis"] == "tp"}
    assert {"all_gather", "reduce_scatter"} <= ops


def test_per_op_recompute_with_tensor_and_sequence_parallel(tmp_path):
    """torchtitan's per-op recompute in the job: the recompute re-issues the forward's
    all-gathers but not its reduce-scatters (their outputs are kept), as the model's ledger
    says; the run is measured like any other."""
    report = _run(tmp_path, run.RunSettings(nprocs=2, steps=2, warmup=1), gpus=2, tp=2,
                  sequence_parallel=True, micro_batch=2, global_batch=4, recompute="op")
    _assert_measured(report, 2)
    assert report["collectives_vs_ledger"]["agree"], report["collectives_vs_ledger"]
    tp = {r["op"]: r for r in report["collectives_vs_ledger"]["rows"]
          if r["axis"] == "tp" and r["bytes"] == max(x["bytes"] for x in
                                                      report["collectives_vs_ledger"]["rows"])}
    # tiny-gpt: 4 layers x 2 per layer, forward + backward (+ recompute for the all-gathers)
    assert tp["all_gather"]["job_count"] > tp["reduce_scatter"]["job_count"]


def test_selective_recompute_of_the_mlp_with_tensor_and_sequence_parallel(tmp_path):
    """Megatron's recompute_modules core_attn,mlp in the job: each MLP runs under a checkpoint,
    its all-gather and reduce-scatter issued again before the backward, as the ledger says."""
    kw = dict(gpus=2, tp=2, sequence_parallel=True, micro_batch=2, global_batch=4,
              recompute="selective")
    # the core-only plan's collectives as its job issues them, counted on a fake process group
    # (validate --dry-run) rather than by a second launch
    model = load_model(MODEL)
    plain = dryrun.dry_run(model, Plan(dtype="fp32", **kw).check(model))
    report = _run(tmp_path / "mlp", run.RunSettings(nprocs=2, steps=2, warmup=1), **kw,
                  recompute_modules="core_attn,mlp")
    _assert_measured(report, 2)
    assert report["collectives_vs_ledger"]["agree"], report["collectives_vs_ledger"]

    def gathers(rows: list[dict]) -> float:
        return sum(x["job_count"] for x in rows if x["axis"] == "tp" and x["op"] == "all_gather")

    # tiny-gpt's 4 MLPs in each of the step's 2 micro-batches
    assert gathers(report["collectives_vs_ledger"]["rows"]) == gathers(plain["rows"]) + 4 * 2


def test_every_second_layer_recomputed_in_a_pipeline(tmp_path):
    """recompute full on one layer in two (torchtitan's selective layer AC) on 2 stages."""
    report = _run(tmp_path, run.RunSettings(nprocs=2, steps=2, warmup=1), gpus=2, pp=2,
                  micro_batch=1, global_batch=2, recompute="full", recompute_every=2)
    _assert_measured(report, 2)
    assert report["prediction"]["breakdown_s"]["compute/recompute"] > 0


def test_pipeline_two_ranks_1f1b_on_a_busy_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = run.RunSettings(nprocs=2, steps=2, warmup=1, port=port)
        report = _run(
            tmp_path, settings, gpus=2, pp=2, micro_batch=1, global_batch=4, schedule="1f1b"
        )
    _assert_measured(report, 2)
    assert any(f"port {port} is in use" in n for n in report["launch"]["notes"])
    assert report["launch"]["port"] != port
    assert {t["name"]: t for t in report["terms"]}["pipeline"]["measured_s"] > 0
    assert any(c["op"] == "send_recv" and c["axis"] == "pp" for c in report["collectives_rank0"])
    # 4 micro-batches: rank 0 sends 4 activations and receives 4 gradients of 1 x 128 x 256 fp32,
    # counted in the probe step and in the model's ledger alike.
    pp_rows = [r for r in report["collectives_vs_ledger"]["rows"] if r["axis"] == "pp"]
    assert [(r["op"], r["bytes"], r["job_count"]) for r in pp_rows] == [
        ("send_recv", 128 * 256 * 4, 8)
    ]
    assert pp_rows[0]["agree"]


def test_mixed_data_and_pipeline_four_ranks_gpipe(tmp_path):
    report = _run(
        tmp_path,
        run.RunSettings(nprocs=4, steps=2, warmup=1),
        gpus=4,
        dp=2,
        pp=2,
        micro_batch=1,
        global_batch=4,
        schedule="gpipe",
    )
    _assert_measured(report, 4)
    assert {c["axis"] for c in report["collectives_rank0"]} == {"dp", "pp"}


def test_fsdp_in_a_pipeline_gathers_each_unit_once_a_step(tmp_path):
    """ZeRO 3 (FSDP2) on 2 stages x 2 replicas, 2 micro-batches, as torchtitan runs it: the
    schedule leaves each stage's units gathered and its gradients unsharded until the stage's
    last backward, so every unit is gathered once and reduce-scattered once a step, as the
    model's ledger counts them (perfmodel.step.data_parallel, stage_resident)."""
    report = _run(tmp_path, run.RunSettings(nprocs=4, steps=2, warmup=1), gpus=4, dp=2, pp=2,
                  zero=3, micro_batch=1, global_batch=4, schedule="1f1b")
    _assert_measured(report, 4)
    rows = report["collectives_vs_ledger"]["rows"]
    assert report["collectives_vs_ledger"]["agree"], rows
    dp = {(r["op"], r["bytes"]): r["job_count"] for r in rows if r["axis"] == "dp"}
    gathers = [n for (op, _), n in dp.items() if op == "all_gather"]
    scatters = [n for (op, _), n in dp.items() if op == "reduce_scatter"]
    # rank 0's units: its 2 layers (one size, 2 calls) and its root (embedding, positions)
    assert sorted(gathers) == [1, 2] and sorted(scatters) == [1, 2]


def test_fsdp_over_4_stages_a_rank_gathers_them_again_as_predicted(tmp_path):
    """ZeRO 3 on 2 ranks of 4 stages each (an 8-layer mixture of experts whose first layer is
    dense), 2 replicas, 4 micro-batches in 2 rounds of interleaved 1F1B: torch's pipelining keeps
    3 of a rank's stages gathered and gathers the others again, rank 0's 4 stages 11 times (4,
    3, 3, 1): its first stage, with the embedding and the dense layer, 4 times, its 3 MoE
    layers' units 7 (perfmodel.step.data_parallel.schedule_gathers, regathers)."""
    model = replace(load_model(MODEL), layers=8, experts=4, top_k=2, expert_ffn_hidden=128,
                    moe_first_dense=1)
    plan = Plan(dtype="fp32", gpus=4, dp=2, pp=2, zero=3, micro_batch=1, global_batch=8,
                schedule="interleaved", virtual_stages=4).check(model)
    report = run.validate(model, load_hardware(HARDWARE), plan,
                          run.RunSettings(nprocs=4, steps=2, warmup=1), tmp_path / "run")
    _assert_measured(report, 4)
    rows = report["collectives_vs_ledger"]["rows"]
    assert report["collectives_vs_ledger"]["agree"], rows
    gathers = sorted(r["job_count"] for r in rows if r["axis"] == "dp" and r["op"] == "all_gather")
    assert gathers == [4, 4, 7]  # the root, the dense layer, the MoE layers (one a stage)


def test_an_uneven_pipeline_split_runs_as_predicted(tmp_path):
    """first_stage_layers / last_stage_layers reach the job: tiny-gpt's 4 layers as 1 + 3 over
    two stages (Megatron --decoder-first/last-pipeline-num-layers), every send in the ledger."""
    report = _run(
        tmp_path,
        run.RunSettings(nprocs=2, steps=2, warmup=1),
        gpus=2,
        pp=2,
        micro_batch=1,
        global_batch=2,
        schedule="1f1b",
        first_stage_layers=1,
        last_stage_layers=3,
    )
    _assert_measured(report, 2)
    assert report["plan"]["first_stage_layers"] == 1 and report["plan"]["last_stage_layers"] == 3
    assert report["collectives_vs_ledger"]["rows"] and all(
        r["agree"] for r in report["collectives_vs_ledger"]["rows"])
    assert report["prediction"]["bottleneck_stage"] == "last"  # 3 layers and the output layer
    # its terms are compared with the last stage's rank alone, not the mean of both stages
    assert report["terms_stage"] == "last" and report["terms_ranks"] == [1]


def test_a_pipeline_layout_runs_as_predicted(tmp_path):
    """pipeline_layout reaches the job: tiny-gpt's 4 layers in Megatron's layout syntax as
    chunks of 2, 1, 1 and 0 layers over two ranks with two virtual stages each (rank 0 holds 3
    layers, rank 1 one and the output layer), every send in the ledger."""
    report = _run(
        tmp_path,
        run.RunSettings(nprocs=2, steps=2, warmup=1),
        gpus=2,
        pp=2,
        micro_batch=1,
        global_batch=2,
        schedule="interleaved",
        virtual_stages=2,
        pipeline_layout="Ett|t|t|L",
    )
    _assert_measured(report, 2)
    assert report["plan"]["pipeline_layout"] == "Ett|t|t|L"
    assert report["collectives_vs_ledger"]["rows"] and all(
        r["agree"] for r in report["collectives_vs_ledger"]["rows"])
    assert report["prediction"]["bottleneck_stage"] == "first"  # 3 layers and the embedding


def _failed(report: dict) -> dict:
    assert report["status"] == "failed"
    return report["launch"]["failure"]


def test_a_crashing_rank_is_named_and_earlier_steps_kept(tmp_path):
    settings = run.RunSettings(
        nprocs=2, steps=3, warmup=0, timeout_s=120, fault={"kind": "crash", "rank": 1, "step": 1}
    )
    report = _run(tmp_path, settings, gpus=2, dp=2, global_batch=2)
    failure = _failed(report)
    assert failure["rank"] == 1 and "injected crash" in failure["error"]
    assert report["steps"] == 1  # the step both ranks finished before the crash


def test_a_hung_rank_is_stopped_after_the_timeout(tmp_path):
    settings = run.RunSettings(
        nprocs=2, steps=3, warmup=0, timeout_s=6, fault={"kind": "hang", "rank": 1, "step": 1}
    )
    report = _run(tmp_path, settings, gpus=2, dp=2, global_batch=2)
    failure = _failed(report)
    assert failure["rank"] == 1 and failure["state"] == "killed"
    states = {r["rank"]: r["state"] for r in report["launch"]["rank_status"]}
    assert states[0] == "failed"  # rank 0 gave up on the collective after the timeout
    # ... and that ended the run, not the launcher's own deadline (timeout_s + 60 s)
    assert report["launch"]["reason"] == "a rank failed; the others were stopped"


def test_a_rank_killed_mid_run(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"

    def kill_rank_1_after_a_step(pids: list[int]) -> None:
        def target() -> None:
            wait_for(lambda: _steps(run_dir, 1), "rank 1 measures a step", poll_s=0.05)
            os.kill(pids[1], signal.SIGKILL)

        threading.Thread(target=target, daemon=True).start()

    real_launch = run.launch
    monkeypatch.setattr(run, "launch", lambda *args, **kwargs: real_launch(
        *args, **kwargs, on_start=kill_rank_1_after_a_step))
    settings = run.RunSettings(nprocs=2, steps=50, warmup=0, timeout_s=30)
    report = _run(tmp_path, settings, gpus=2, dp=2, global_batch=2)
    failure = _failed(report)
    assert failure["rank"] == 1 and "SIGKILL" in failure["error"]
    assert report["steps"] >= 1


def test_a_plan_the_machine_cannot_hold_is_refused_before_launch(tmp_path):
    result = CliRunner().invoke(
        validate,
        [
            "--model",
            MODEL,
            "--hardware",
            HARDWARE,
            "--hidden",
            "16384",
            "--heads",
            "32",
            "--layers",
            "64",
            "--dp",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            "--history",
            str(tmp_path / "h.csv"),
        ],
    )
    assert result.exit_code != 0
    assert "cannot hold" in str(result.exception)
    assert not (tmp_path / "run").exists()


BLOCK_OURS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("perfmodel", "calibration", "validation"):
            raise ImportError(f"{name} is not on the cluster")
sys.meta_path.insert(0, Block())
"""


def test_the_emitted_job_runs_where_only_torch_is_installed(tmp_path):
    """The emitted directory, run as run.sh runs it (python job.py config.json from the directory),
    with perfmodel, calibration and validation unimportable: one gloo rank of a 1-GPU plan."""
    emit_dir = tmp_path / "emit"
    result = CliRunner().invoke(validate, ["--model", MODEL, "--hardware", HARDWARE,
                                           "--emit", str(emit_dir), "--gpus-per-node", "1"])
    assert result.exit_code == 0, result.output
    cfg = json.loads((emit_dir / "config.json").read_text())
    # this machine has no GPU: the same job on gloo, fp32, one step
    cfg.update(backend="gloo", steps=1, warmup=0, probe_steps=1, tensor_memory=False)
    cfg["plan"]["dtype"] = "fp32"
    (emit_dir / "config.json").write_text(json.dumps(cfg))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_OURS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(site), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    env.pop("PERFMODEL_PARENT_PID", None)
    ran = subprocess.run([sys.executable, "job.py", "config.json"], cwd=emit_dir, env=env,
                         capture_output=True, text=True, timeout=PATIENCE_S)
    assert ran.returncode == 0, ran.stderr[-3000:]
    results = json.loads((emit_dir / "results" / "results.json").read_text())
    (record,) = results["ranks"]
    assert record["status"] == "ok" and len(record["steps"]) == 1
    assert record["probe"]["collectives"] == []  # one rank: nothing to communicate


def test_emit_writes_a_cluster_job_and_collect_reads_it_back(tmp_path):
    emit_dir = tmp_path / "emit"
    result = CliRunner().invoke(
        validate,
        [
            "--model",
            MODEL,
            "--hardware",
            HARDWARE,
            "--tp",
            "8",
            "--dp",
            "2",
            "--dtype",
            "bf16",
            "--backend",
            "nccl",
            "--emit",
            str(emit_dir),
            "--gpus-per-node",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    sbatch = (emit_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "--nproc-per-node 8" in sbatch and "NCCL_" in sbatch
    cfg = json.loads((emit_dir / "config.json").read_text())
    assert cfg["backend"] == "nccl" and cfg["plan"]["dtype"] == "bf16"
    assert foreign_imports(emit_dir) == []  # only torch and the standard library
    # Results as a cluster run leaves them: one record per rank.
    (emit_dir / "results").mkdir()
    for rank in range(16):
        rec = {
            "rank": rank,
            "status": "ok",
            "peak_memory_bytes": 10,
            "steps": [
                {"step": 0.5, "forward": 0.1, "backward": 0.2, "grad_sync": 0.1, "optimizer": 0.05}
            ],
        }
        (emit_dir / "results" / f"rank{rank}.json").write_text(json.dumps(rec))
    result = CliRunner().invoke(
        validate, ["collect", str(emit_dir), "--json", "--history", str(tmp_path / "h.csv")]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["measured_step_time_s"] == pytest.approx(0.5)
    assert report["predicted_step_time_s"] > 0 and report["ranks"] == 16


@pytest.mark.gpu
def test_data_and_tensor_parallel_on_gpus_with_nccl(tmp_path):
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs 2 GPUs")
    model = load_model(MODEL)
    plan = Plan(gpus=2, tp=2, micro_batch=2, global_batch=4, dtype="bf16").check(model)
    settings = run.RunSettings(nprocs=2, backend="nccl", steps=2, warmup=1)
    report = run.validate(model, load_hardware(HARDWARE), plan, settings, tmp_path / "run")
    _assert_measured(report, 2)
    assert report["dtype_used"] == "bf16"


def test_too_big_a_plan_is_one_line_and_an_exit_code_from_the_command_line(run_cli):
    result = run_cli(
        "validate",
        "--model",
        MODEL,
        "--hardware",
        HARDWARE,
        "--hidden",
        "16384",
        "--heads",
        "32",
        "--layers",
        "64",
        "--dp",
        "2",
    )
    assert result.returncode == 4  # PlanError
    assert "cannot hold" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_every_rank(tmp_path, sig):
    """SIGINT to `perfmodel validate` (what Ctrl-C sends), or SIGTERM (kill, a scheduler), while
    the job runs: nothing is left running, and the steps measured before are kept and said so."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "perfmodel",
        "validate",
        "--model",
        MODEL,
        "--hardware",
        HARDWARE,
        "--dp",
        "2",
        "--steps",
        "1000",
        "--warmup",
        "0",
        "--run-dir",
        str(run_dir),
        "--history",
        str(tmp_path / "h.csv"),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        wait_for(lambda: _steps(run_dir, 1), "rank 1 measures a step", proc=proc)
        assert _leftovers(run_dir), "the job should be running"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=PATIENCE_S)  # waits for its exit; the bound is for a hang
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("interrupted: every rank was stopped; ")
    assert "Traceback" not in err
    wait_for(lambda: _leftovers(run_dir) == [], "every rank exits")
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "interrupted" and report["steps"] >= 1
    assert report["measured_step_time_s"] > 0
    assert f"{report['steps']} timed steps measured before the stop are kept" in err
    history = (tmp_path / "h.csv").read_text().splitlines()
    assert len(history) == 2 and ",interrupted," in history[1]
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name]


def test_nccl_without_enough_gpus_is_refused_before_launch(tmp_path):
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    model = load_model(MODEL)
    plan = Plan(gpus=2, dp=2, global_batch=2).check(model)
    settings = run.RunSettings(nprocs=2, backend="nccl")
    from perfmodel.errors import PlanError

    with pytest.raises(PlanError, match="CUDA devices"):
        run.validate(model, load_hardware(HARDWARE), plan, settings, tmp_path / "run")
    assert not (tmp_path / "run").exists()
