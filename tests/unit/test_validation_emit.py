"""Emitted jobs are for the target cluster, collected results are checked, and a local comparison
of unlike machines says so first (issue 14, items 7 and 8). No job runs here: the emitted Slurm
script runs under bash with stand-ins for scontrol and srun that record what they were given."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.specs.hardware import load_hardware
from tests.conftest import ROOT
from tests.unit.test_bad_input import run_main
from validation import report as rep
from validation.jobspec import TP_BACKWARD_NOTE
from validation.run import RunSettings, caveats

EMIT = ["validate", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--tp", "8", "--dp", "2",
        "--gpus-per-node", "8"]


def test_emit_for_a_gpu_preset_writes_nccl_and_the_plans_dtype_from_any_host(tmp_path):
    """Written on this CPU host: the job is NCCL in bf16 (the plan's), not the host's gloo, fp32."""
    out = tmp_path / "emit"
    code, stdout, err = run_main([*EMIT, "--emit", str(out)])
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    assert config["backend"] == "nccl" and config["plan"]["dtype"] == "bf16"
    # (the run's notes: at zero 0 the job's bf16 states, predicted so; its element-wise ops
    # eager, not the plan's default fused kernels; and tp 8's backward predicted as the job's
    # DTensor runs it, not Megatron's)
    assert meta["backend"] == "nccl" and meta["dtype_used"] == "bf16"
    assert meta["dtype_note"] == ("at zero 0 the job keeps its parameters, gradients and AdamW "
                                  "states in bf16 (no fp32 master copy; zero 1 and 2 keep fp32 "
                                  "main shards): predicted so; the job runs its element-wise ops "
                                  "op by op (PyTorch modules), not fused kernels: predicted with "
                                  f"eager kernels; {TP_BACKWARD_NOTE}")
    assert meta["prediction"]["plan"]["kernels"] == "eager"
    assert meta["prediction"]["plan"]["optimizer_dtype"] == "bf16"
    assert meta["prediction"]["step_time_s"] > 0
    lines = stdout.strip().splitlines()
    assert lines[-2:] == ["the job: nccl, bf16, 2 x 8 ranks",
                          f"submit: cd {out} && sbatch job.sbatch; then: perfmodel validate "
                          f"collect {out}"]


def foreign_imports(directory: Path) -> list[str]:
    """Every import in the emitted Python files (module level and inside functions) of something
    other than the standard library, torch, and the workload modules emitted beside them."""
    emitted = {str(p.relative_to(directory).with_suffix("")).replace(os.sep, ".")
               for p in directory.rglob("*.py")}
    found = []
    for path in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:  # relative imports are within workload/: checked by the run
                continue
            for name in names:
                top = name.split(".")[0]
                own = top == "workload" and (name in emitted or f"{name}.__init__" in emitted)
                if not (own or top == "torch" or top in sys.stdlib_module_names):
                    found.append(f"{path.relative_to(directory)}:{node.lineno} imports {name}")
    return found


def test_the_emitted_job_is_the_workload_job_with_only_torch_and_the_standard_library(tmp_path):
    out = tmp_path / "emit"
    code, stdout, err = run_main([*EMIT, "--emit", str(out)])
    assert code == 0, err
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["config.json", "job.py", "job.sbatch", "meta.json", "run.sh",
                     "workload/__init__.py", "workload/context_parallel.py", "workload/distopt.py",
                     "workload/job.py",
                     "workload/model.py", "workload/moe.py", "workload/parallelize.py",
                     "workload/process.py", "workload/settings.py", "workload/timers.py",
                     "workload/trainer.py"]
    assert foreign_imports(out) == []
    assert (out / "workload/trainer.py").read_bytes() == (ROOT / "workload/trainer.py").read_bytes()
    assert f"wrote {out / 'workload' / 'model.py'}" in stdout.splitlines()


def test_the_import_check_finds_a_foreign_import(tmp_path):
    (tmp_path / "workload").mkdir()
    (tmp_path / "workload" / "x.py").write_text(
        "import os\nimport torch.nn\nfrom workload.x import y\n"
        "def f():\n    from perfmodel.files import write_atomic\n    import numpy\n"
        "    from workload.launcher import launch\n")
    assert foreign_imports(tmp_path) == [
        "workload/x.py:5 imports perfmodel.files", "workload/x.py:6 imports numpy",
        "workload/x.py:7 imports workload.launcher"]


def test_emit_refuses_a_backend_the_target_does_not_run(tmp_path):
    code, _, err = run_main([*EMIT, "--backend", "gloo", "--emit", str(tmp_path / "emit")])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "'gloo' does not run on dgx-h100 (GPUs): the emitted job uses nccl" in err
    assert not (tmp_path / "emit").exists()


def _fake_slurm(bin_dir: Path) -> None:
    """scontrol and srun that print what they were asked (srun: its directory and arguments)."""
    bin_dir.mkdir()
    for name, body in (("scontrol", 'echo node001'), ("srun", 'echo "srun in $PWD: $*"')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)


def test_the_slurm_script_finds_the_job_when_submitted_as_the_tool_says(tmp_path):
    """sbatch runs a copy of the script from its spool directory, in the directory it was submitted
    from: `cd DIR && sbatch job.sbatch` finds job.py; submitted from elsewhere, it says why."""
    out = tmp_path / "emit"
    code, _, err = run_main([*EMIT, "--emit", str(out)])
    assert code == 0, err
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(out / "job.sbatch", spool / "slurm_script")  # as slurmd runs it
    _fake_slurm(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}",
               SLURM_JOB_NODELIST="node[001-002]", SLURM_JOB_ID="42")
    ran = subprocess.run(["bash", str(spool / "slurm_script")], cwd=out, capture_output=True,
                         text=True, env=dict(env, SLURM_SUBMIT_DIR=str(out)))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"srun in {out}: torchrun --nnodes 2 --nproc-per-node 8 ")
    assert ran.stdout.rstrip().endswith("job.py config.json")
    elsewhere = subprocess.run(["bash", str(spool / "slurm_script")], cwd=tmp_path,
                               capture_output=True, text=True,
                               env=dict(env, SLURM_SUBMIT_DIR=str(tmp_path)))
    assert elsewhere.returncode == 2 and elsewhere.stdout == ""
    assert elsewhere.stderr.strip() == (
        f"job.sbatch: no job.py and config.json in {tmp_path}: submit from their directory "
        "(cd <dir> && sbatch job.sbatch)")


def _emitted(tmp_path: Path, steps: list[dict] | str) -> Path:
    out = tmp_path / "emit"
    code, _, err = run_main([*EMIT[:5], "--dp", "2", "--emit", str(out)])
    assert code == 0, err
    (out / "results").mkdir()
    for rank in range(2):
        text = steps if isinstance(steps, str) else json.dumps(
            {"rank": rank, "status": "ok", "device": "cuda:0", "steps": steps})
        (out / "results" / f"rank{rank}.json").write_text(text)
    return out


GOOD = {"step": 0.5, "forward": 0.1, "backward": 0.2, "grad_sync": 0.1, "optimizer": 0.05,
        "pipeline_wait": -1e-6}
BAD_RESULTS = {
    "negative step": ([{**GOOD, "step": -1.0}], "steps[0].step is -1.0: it must be a positive"),
    "zero step": ([GOOD, {**GOOD, "step": 0}], "steps[1].step is 0: it must be a positive number"),
    "NaN step": ('{"rank": 0, "status": "ok", "steps": [{"step": NaN}]}',
                 "not valid JSON (NaN is not a number)"),
    "negative forward": ([{**GOOD, "forward": -0.1}], "steps[0].forward is -0.1: it must be a "
                                                      "number >= 0"),
    "no step time": ([{"forward": 0.1}], "steps[0] must be an object with the step time 'step'"),
    # the report picks the predicted stage's ranks by their coordinates (an internal error
    # before: a list has no .get, "last" no int)
    "coords not a mapping": ('{"rank": 0, "status": "ok", "coords": ["pp"], "steps": '
                             '[{"step": 0.5}]}', "field 'coords' must map mesh axes to whole"),
    "coords not numbers": ('{"rank": 0, "status": "ok", "coords": {"pp": "last"}, "steps": '
                           '[{"step": 0.5}]}', "field 'coords' must map mesh axes to whole"),
}


@pytest.mark.parametrize("case", BAD_RESULTS, ids=list(BAD_RESULTS))
def test_collect_refuses_impossible_measurements_in_one_line(tmp_path, case):
    steps, message = BAD_RESULTS[case]
    out = _emitted(tmp_path, steps)
    history = tmp_path / "h.csv"
    code, stdout, err = run_main(["validate", "collect", str(out), "--history", str(history)])
    assert code == 5 and stdout == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {out / 'results' / 'rank0.json'}: ") and message in err
    assert not history.exists() and not (out / "report.json").exists()  # no row, no report


BAD_META = {
    "not an object": ("[1, 2]", "must be a JSON object (as --emit writes it)"),
    "ranks not a number": ({"ranks": "two"}, "field 'ranks' must be a whole number >= 1"),
    "negative predicted step": ({"prediction": {"step_time_s": -1, "memory_per_gpu_bytes": 1}},
                                "prediction.step_time_s is -1: it must be a positive number"),
    "truncated": ('{"model": "tiny-gpt", ', "not valid JSON"),
}


@pytest.mark.parametrize("case", BAD_META, ids=list(BAD_META))
def test_collect_refuses_a_malformed_meta_json_in_one_line(tmp_path, case):
    change, message = BAD_META[case]
    out = _emitted(tmp_path, [GOOD])
    meta = out / "meta.json"
    if isinstance(change, str):
        meta.write_text(change)
    else:
        meta.write_text(json.dumps({**json.loads(meta.read_text()), **change}))
    code, _, err = run_main(["validate", "collect", str(out), "--history", str(tmp_path / "h")])
    assert code == 5 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {meta}") and message in err


def test_collect_reads_good_results(tmp_path):
    out = _emitted(tmp_path, [GOOD, {**GOOD, "step": 0.7}])
    code, stdout, err = run_main(["validate", "collect", str(out), "--json", "--history",
                                  str(tmp_path / "h.csv")])
    assert code == 0, err
    report = json.loads(stdout)
    assert report["measured_step_time_s"] == pytest.approx(0.6) and report["caveats"] == []


def test_a_cpu_run_against_a_gpu_preset_is_said_first():
    h100 = load_hardware("dgx-h100")
    assert caveats(h100, RunSettings(nprocs=2, backend="gloo"))[0].startswith(
        "CPU run, GPU prediction: this compares 2 CPU ranks (gloo) with dgx-h100 (NVIDIA H100 80GB "
        "HBM3), so the error is the gap between the machines")
    assert caveats(h100, RunSettings(nprocs=8, backend="nccl")) == []


def test_a_profile_of_another_rank_count_is_said_first():
    """The README's quick start calibrates 4 ranks and validates 2: -44 to -50% on this machine
    (2 CPUs), +3% with a 2-rank profile. The rates of 4 ranks time-sharing 2 CPUs are not
    rescaled to 2."""
    cpu4 = load_hardware("dgx-h100").replace(gpu_name="CPU Test (2 cores)", gpus_per_node=4,
                                             ranks_per_device=2.0, name="calibrated-test")
    (line,) = caveats(cpu4, RunSettings(nprocs=2, backend="gloo"))
    assert line.startswith("profile of 4 ranks, run of 2: calibrated-test was measured with 4 "
                           "ranks sharing this machine's CPUs (ranks_per_device 2)")
    assert caveats(cpu4.replace(gpus_per_node=2), RunSettings(nprocs=2, backend="gloo")) == []
    assert caveats(cpu4, RunSettings(nprocs=2, backend="nccl"))[0].startswith(
        "GPU run, CPU prediction")


def test_the_report_prints_caveats_first_and_compares_memory(capsys):
    from rich.console import Console

    records = [{"rank": r, "device": "cpu", "steps": [GOOD], "peak_memory_bytes": 400 * 2**20,
                "baseline_memory_bytes": 220 * 2**20,
                "tensor_peak_memory_bytes": (80 + r) * 2**20} for r in range(2)]
    prediction = {"step_time_s": 0.4, "breakdown_s": {"compute/forward": 0.4},
                  "memory_per_gpu_bytes": 75 * 2**20,
                  "memory_breakdown_bytes": {"weights": 75 * 2**20}}
    report = rep.build_report(meta={"model": "m", "ranks": 2, "backend": "gloo"},
                              prediction=prediction, launch={"status": "ok"}, records=records)
    memory = report["memory"]
    assert memory["measured_peak_per_rank_bytes"] == 81 * 2**20  # the larger rank's
    assert memory["relative_error"] == pytest.approx(81 / 75 - 1)
    assert memory["measured_process_peak_per_rank_bytes"] == 400 * 2**20
    report["caveats"] = ["CPU run, GPU prediction: because"]
    rep.render(report, Console(width=200))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "warning: CPU run, GPU prediction: because"
    row = next(line for line in lines if "peak memory / rank" in line)
    assert "75.00 MiB" in row and "81.00 MiB" in row and "+8.0%" in row  # fmt_bytes
    assert any(line.startswith("process peak (RSS) per rank: 400.00 MiB, 220.00 MiB of it before "
                               "the model") for line in lines)


def test_gpu_memory_is_compared_without_what_the_prediction_reserves():
    records = [{"rank": 0, "device": "cuda:0", "steps": [GOOD], "peak_memory_bytes": 60 * 2**30}]
    prediction = {"step_time_s": 0.4, "breakdown_s": {}, "memory_per_gpu_bytes": 62 * 2**30,
                  "memory_breakdown_bytes": {"weights": 60 * 2**30, "reserved": 2 * 2**30}}
    memory = rep.memory_comparison(prediction, records)
    assert memory["predicted_tensor_per_rank_bytes"] == 60 * 2**30
    assert memory["relative_error"] == 0 and memory["measured_process_peak_per_rank_bytes"] is None
    assert memory["measured_by"] == "torch.cuda.max_memory_allocated"


def test_collect_accepts_a_negative_framework_term(tmp_path):
    """Regression: a calibrated compute scale below 1 makes compute/forward/framework negative
    (the kernels beat the roofline); collect refused the prediction as 'must be >= 0'."""
    out = _emitted(tmp_path, [GOOD])
    meta = out / "meta.json"
    doc = json.loads(meta.read_text())
    doc["prediction"]["breakdown_s"]["compute/forward/framework"] = -0.002
    meta.write_text(json.dumps(doc))
    code, _, err = run_main(["validate", "collect", str(out), "--history", str(tmp_path / "h")])
    assert code == 0, err
    doc["prediction"]["breakdown_s"]["compute/forward/framework"] = float("nan")
    meta.write_text(json.dumps(doc))
    code, _, err = run_main(["validate", "collect", str(out), "--history", str(tmp_path / "h")])
    assert code == 5 and "not valid JSON" in err
