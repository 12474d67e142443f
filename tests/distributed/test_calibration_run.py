"""`perfmodel calibrate run` end to end: 2 gloo ranks on CPU, a tiny sweep, in seconds."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from perfmodel.specs.profile import apply_profile, load_profile
from tests.conftest import PATIENCE_S, ROOT, as_from_a_terminal, wait_for

pytestmark = pytest.mark.distributed


def children(pid: int) -> list[int]:
    """The live processes whose parent is pid (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


def alive(pids: list[int], wait_s: float = PATIENCE_S) -> list[int]:
    """The pids still running after up to wait_s (zombies count as gone): returns as soon as all
    are gone, so the bound only ends a hang."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        left.append(pid)
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def calibrate(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    return [sys.executable, "-m", "calibration.cli", *map(str, args)], env


def test_quick_run_on_two_ranks_writes_a_standalone_profile(tmp_path):
    out = tmp_path / "cpu.json"
    cmd, env = calibrate(
        "run", "--quick", "--nprocs", "2", "--backend", "gloo", "--max-bytes", "65536", "--out", out
    )
    # (its speed is benchmarks/bench_calibrate.py's: a timed test would fail on a loaded machine)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert res.returncode == 0, res.stderr[-2000:]
    profile = load_profile(out)
    assert profile.complete
    assert profile.provenance["device_count"] == 2 and profile.provenance["gloo"] is True
    kinds = {f["kind"] for f in profile.fits.values()}
    assert kinds == {"gemm", "memory_bandwidth", "collective", "layer"}
    ops = {f["op"] for f in profile.fits.values() if f["kind"] == "collective"}
    assert ops == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "send_recv",
    }
    hw = apply_profile(None, profile)  # stands alone: every required field was measured
    assert hw.gpus_per_node == 2 and hw.peak("fp32") > 1e8
    assert hw.memory_bandwidth_bytes_per_s > 1e8
    assert hw.collectives and hw.intra_node.latency_s > 0
    data = profile.measurements.read_text()
    assert data.startswith("kind,") and "all_to_all" in data
    # framework stage: fixed cost per kernel and per collective call, optimizer bandwidth
    assert "memory/adamw_foreach" in profile.fits
    assert 0 < hw.memory_bandwidth_efficiency <= 1 and 0 < hw.optimizer_bandwidth_efficiency <= 1
    assert 1e-7 < hw.kernel_overhead_s < 1e-2 and hw.collective_overhead_s >= 0
    framework = profile.provenance.get("framework_fits", {}) | profile.fits
    assert {"kernel_overhead/plain", "kernel_overhead/dtensor", "collective_dispatch"} <= set(
        framework
    )
    # layers stage: every part in every style the two ranks can run, and FSDP2's unit costs
    assert {(c.part, c.style, c.tp) for c in hw.layer_costs} == {
        (part, style, tp) for part in ("layer", "embedding", "output")
        for style, tp in (("plain", 1), ("tp", 2), ("tp_sp", 2))}
    assert all(c.compute_scale > 0 and c.forward_overhead_s >= 0 for c in hw.layer_costs)
    assert "layer/fsdp_unit/plain/tp1" in profile.fits
    assert hw.ranks_per_device == 1  # 2 ranks on 2 cores (more cores here: still 1)
    # host stage: the host time per framework op (a CPU's: recorded; CPU ranks stay synchronous)
    assert "host_ops" in framework and 1e-8 < hw.host_op_overhead_s < 1e-3
    # the forward's ops and the backward's timed apart (0 where the two did not both fit)
    assert hw.host_op_backward_overhead_s == 0 or 1e-8 < hw.host_op_backward_overhead_s < 1e-3
    assert hw.asynchronous_device is False
    # overlap stage: GEMMs beside an async all-reduce (gloo's threads on the same cores)
    assert "overlap" in framework, profile.provenance["notes"]
    assert hw.overlap_compute_slowdown == pytest.approx(
        min(1.0, framework["overlap"]["measured"]))
    assert 0 <= hw.overlap_compute_slowdown <= 1


def _interrupt(out, sig=signal.SIGINT, gemms=3):
    """Start `calibrate run --out out`, send sig once it measured `gemms` GEMMs; returns
    (exit code, stdout, stderr, the ranks' pids)."""
    records = out.parent / f".{out.name}.records.jsonl"
    cmd, env = calibrate("run", "--quick", "--nprocs", "2", "--backend", "gloo", "--out", out)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    try:
        wait_for(lambda: records.exists() and records.read_text().count('"kind": "gemm"') >= gemms,
                 f"{gemms} GEMMs measured", proc=proc, poll_s=0.2)
        ranks = children(proc.pid)
        assert len(ranks) >= 2  # the two ranks (and multiprocessing's resource tracker)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=PATIENCE_S)  # its exit; the bound is for a hang
    finally:
        proc.kill()
    assert not records.exists()
    return proc.returncode, stdout, stderr, ranks


def test_ctrl_c_keeps_what_was_measured(tmp_path):
    out = tmp_path / "cut.json"
    code, stdout, stderr, ranks = _interrupt(out)
    assert code == 130, stderr[-2000:]
    assert "INCOMPLETE (interrupted; missing stages: " in stdout
    assert "interrupted: keeping what was measured" in stderr
    assert alive(ranks) == []  # no orphan
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".cut.json.lock", "cut.json", "cut.measurements.csv"]  # no temp or partial file
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    # the stage it was stopped in and every later one (at least the last, layers)
    stages = ["gemm", "memory", "collectives", "framework", "host", "overlap", "layers"]
    missing = doc["missing_stages"]
    assert missing and stages[-len(missing):] == missing
    assert ", ".join(missing) in stdout
    measured = (tmp_path / doc["measurements"]).read_text()
    assert measured.count("gemm,") >= 3  # what was measured before Ctrl-C is kept
    assert "peak_flops_per_s" in doc["hardware"]
    assert any("incomplete" in note for note in doc["provenance"]["notes"])


def test_sigterm_never_replaces_a_complete_profile(tmp_path):
    """An interrupted run over a complete profile keeps it and writes the partial one beside it."""
    from calibration.profile_io import provenance, write_profile

    out = tmp_path / "here.json"
    write_profile(out, hardware={"base": "dgx-h100"}, fits={}, measurements=None,
                  provenance=provenance(device="an earlier, complete run"))
    before = out.read_bytes()
    code, stdout, stderr, ranks = _interrupt(out, signal.SIGTERM, gemms=1)
    assert code == 130, stderr[-2000:]
    assert out.read_bytes() == before  # kept, byte for byte
    partial = tmp_path / "here.partial.json"
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: {out} holds a complete profile and is kept; the partial one is {partial}")
    assert f"wrote {partial} (INCOMPLETE" in stdout
    doc = load_profile(partial)
    assert not doc.complete and doc.missing_stages[-1] == "layers"
    assert doc.measurements == tmp_path / "here.partial.measurements.csv"
    assert alive(ranks) == []


@pytest.mark.gpu
def test_a_gpu_run_measures_its_flash_attention_and_host_link(tmp_path):
    """On a GPU the gemm stage times PyTorch SDPA's causal attention (the profile's default flash
    kernel, named sdpa) and the memory stage the copies to and from pinned host memory."""
    out = tmp_path / "gpu.json"
    cmd, env = calibrate("run", "--quick", "--nprocs", "1", "--backend", "nccl", "--stages",
                         "gemm,memory", "--out", out)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert res.returncode == 0, res.stderr[-2000:]
    hardware = json.loads(out.read_text())["hardware"]
    kernel = hardware["flash_attention"]
    assert kernel["name"] == "sdpa" and [p["head_dim"] for p in kernel["by_head_dim"]] == [128]
    assert 0 < kernel["by_head_dim"][0]["forward_max_fraction"] <= 1
    assert 1e9 < hardware["host_link_bytes_per_s"] < 1e12
    profile = load_profile(out)
    assert apply_profile(None, profile).flash_attention.name == "sdpa"
