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
