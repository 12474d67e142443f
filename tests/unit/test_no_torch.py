"""perfmodel/ is the analytical core: it must import and predict with torch unavailable. The
processes that launch ranks (validate, calibrate run) import torch only in the ranks: the
launcher and the modules that drive it import without it."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
import perfmodel, perfmodel.cli, perfmodel.explain, perfmodel.batch, perfmodel.collective
r = perfmodel.predict("tiny-gpt", "dgx-a100-80gb", perfmodel.Plan(gpus=2, dp=2, global_batch=4))
assert r.step_time_s > 0
assert "torch" not in sys.modules
print("ok")
"""

LAUNCHERS_WITHOUT_TORCH = BLOCK_TORCH.split("import perfmodel,")[0] + """
import workload, workload.launcher, workload.layouts
import validation.cli, validation.run, validation.dryrun, validation.layouts.cli_hook
import calibration.run
assert "torch" not in sys.modules
print("ok")
"""


def test_perfmodel_imports_and_predicts_without_torch():
    out = subprocess.run([sys.executable, "-c", BLOCK_TORCH], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_launching_processes_import_without_torch():
    out = subprocess.run([sys.executable, "-c", LAUNCHERS_WITHOUT_TORCH], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# A `perfmodel predict` (and `--json`) in a new process, as a user runs it; then the modules it
# imported. The heavy libraries are for building the formulas (sympy), tables (pandas), plots
# (matplotlib) and jobs (torch): none is needed once the compiled formulas are on disk.
WARM_PREDICT = """
import sys
from perfmodel.cli import main
try:
    main([{args}])
finally:
    print("MODULES", " ".join(sorted(sys.modules)), file=sys.stderr)
"""
HEAVY = ("sympy", "pandas", "matplotlib", "torch", "scipy")


def _predict_modules(args: list[str], cache: str) -> set[str]:
    import os

    env = dict(os.environ, PERFMODEL_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    code = WARM_PREDICT.format(args=", ".join(repr(a) for a in args))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stderr.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


def test_a_warm_predict_imports_no_sympy_pandas_matplotlib_or_torch(tmp_path):
    """Once the compiled formulas of a hardware are cached, a predict loads none of the heavy
    libraries: the plan encoder and the cached numpy code are all it needs (issue 15 item 7)."""
    args = ["predict", "--model", "llama2-7b", "--hardware", "dgx-h100", "--gpus", "16", "--dp",
            "2", "--tp", "8", "--micro-batch", "2", "--global-batch", "32",
            "--placement", "dp,tp,pp"]
    cold = _predict_modules([*args, "--json"], str(tmp_path))  # fills the cache
    assert "sympy" in cold  # (the check below can fail: a cold one builds the formulas)
    for extra in (["--json"], []):  # JSON, and the table
        warm = _predict_modules([*args, *extra], str(tmp_path))
        assert [m for m in HEAVY if m in warm] == [], extra


# The command line with torch absent, as after `pip install perfmodel` (no extra): torch set to
# None in sys.modules makes `import torch` raise ModuleNotFoundError(name='torch'), as a missing
# package does, and importlib.util.find_spec('torch') answer None.
CLI_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
from perfmodel.cli import main
main(sys.argv[1:])
"""


def _cli_without_torch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100",
               PERFMODEL_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)


PLAN = ["--model", "gpt-22b", "--hardware", "dgx-a100-80gb", "--gpus", "8"]


def test_predict_and_recommend_run_without_torch(tmp_path):
    """Issue 18 item 7: the core commands need no extra."""
    out = _cli_without_torch(tmp_path, "predict", *PLAN, "--tp", "8", "--micro-batch", "4",
                             "--global-batch", "4", "--recompute", "full", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["schema"].startswith("perfmodel.predict/")
    out = _cli_without_torch(tmp_path, "recommend", *PLAN, "--global-batch", "16", "--top", "2")
    assert out.returncode == 0, out.stderr
    assert "step time" in out.stdout


@pytest.mark.parametrize(("args", "command", "extra"), [
    (["calibrate", "run", "--out", "here.json", "--nprocs", "2", "--quick"], "calibrate run",
     "calibration"),
    (["validate", "--model", "tiny-gpt", "--hardware", "dgx-a100-80gb", "--dp", "2",
      "--global-batch", "8", "--micro-batch", "2", "--nprocs", "2", "--steps", "2"], "validate",
     "validation"),
    (["validate", "--model", "tiny-gpt", "--dp", "2", "--global-batch", "8", "--micro-batch", "2",
      "--dry-run"], "validate", "validation"),
    (["recommend", "--model", "tiny-gpt", "--hardware", "dgx-a100-80gb", "--gpus", "2",
      "--global-batch", "8", "--validate"], "recommend --validate", "validation"),
])
def test_a_command_that_needs_torch_names_the_extra_in_one_line(tmp_path, args, command, extra):
    out = _cli_without_torch(tmp_path, *args)
    assert out.returncode == 2, out.stderr  # usage: the command cannot run as installed
    assert out.stderr.splitlines() == [
        f"error: 'perfmodel {command}' needs torch, which is not installed: pip install "
        f"'perfmodel[{extra}]' (without a GPU, the CPU-only torch: docs/install.md)"]
    assert not list(tmp_path.glob("*.json")), "nothing written before the refusal"


def test_what_needs_no_torch_in_calibrate_and_validate_runs_without_it(tmp_path):
    """Importing nccl-tests logs fits a profile, and --emit writes a job, without torch."""
    log = ROOT / "tests/data/nccl-tests/a100x16-2node-roce-allreduce-oci-bm-gpu4-ocitutorials.txt"
    out = _cli_without_torch(tmp_path, "calibrate", "import-nccl-tests", str(log), "--out",
                             "cluster.json")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cluster.json").is_file()
    out = _cli_without_torch(tmp_path, "validate", "--model", "tiny-gpt", "--hardware",
                             "dgx-a100-80gb", "--dp", "2", "--global-batch", "8",
                             "--micro-batch", "2", "--emit", "job")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "job" / "job.sbatch").is_file()


def test_a_torch_import_no_check_caught_is_still_one_line(capsys):
    """The safety net of perfmodel.cli: a ModuleNotFoundError of torch anywhere under a command
    becomes the same one line (exit 2), never an 'internal error'; another module's stays one."""
    from perfmodel import cli

    def raising(name: str) -> None:
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)

    for name, code in (("torch", 2), ("torch.distributed", 2), ("somethingelse", 1)):
        command = cli.cli.command("needs-a-module-test", hidden=True)(lambda n=name: raising(n))
        try:
            with pytest.raises(SystemExit) as exit_info:
                cli.main(["needs-a-module-test"])
        finally:
            cli.cli.commands.pop(command.name)
        err = capsys.readouterr().err
        assert exit_info.value.code == code, err
        assert len(err.splitlines()) == 1
        if code == 2:
            assert err.startswith("error: 'perfmodel needs-a-module-test' needs torch") and \
                "'perfmodel[validation]'" in err
        else:
            assert err.startswith("internal error: ModuleNotFoundError")
