"""perfmodel/ is the analytical core: it must import and predict with torch unavailable. The
processes that launch ranks (validate, calibrate run) import torch only in the ranks: the
launcher and the modules that drive it import without it."""

import subprocess
import sys

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
