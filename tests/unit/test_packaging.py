"""The distribution (issue 18 item 7): `python -m build` makes an sdist and a wheel that hold every
module and data file of the four packages; the wheel's metadata asks for torch only under the
extras `calibration` and `validation`; installed alone (no extra, no torch), it predicts and
recommends, and the commands that need torch name the extra to install.

The build runs on a copy of the sources (the tree's own egg-info is what the tests import the
entry points from) without build isolation: the suite runs offline, with the setuptools it has
(pyproject.toml's build-system.requires is checked; .ci/run also builds in isolation). As
`python -m build` does by default, the wheel is built from the unpacked sdist, so a file missing
from the sdist is missing from the wheel too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from packaging.requirements import Requirement

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

PACKAGES = ("perfmodel", "workload", "calibration", "validation")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_files() -> set[str]:
    """Every file of the four packages in this tree, as paths relative to its root."""
    out = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.add(path.relative_to(ROOT).as_posix())
    return out


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel of a copy of this tree, built by `python -m build`."""
    work = tmp_path_factory.mktemp("build")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                          str(work / "dist"), str(src)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return work / "dist"


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_the_wheel_holds_every_module_and_data_file(dist):
    """Presets (YAML), py.typed markers and every module: what the tree's packages hold, the wheel
    holds (the code reads nothing outside its packages: docs/schemas is published, not read)."""
    names = set(zipfile.ZipFile(_one(dist, "perfmodel-*.whl")).namelist())
    missing = sorted(_package_files() - names)
    assert missing == []
    assert {n.split("/")[0] for n in names if not n.startswith("perfmodel-")} == set(PACKAGES)
    assert sum(n.endswith(".yaml") and "/presets/" in n for n in names) >= 30


def test_the_sdist_holds_the_sources_and_the_project_files(dist):
    with tarfile.open(_one(dist, "perfmodel-*.tar.gz")) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "PKG-INFO"} <= names
    assert sorted(_package_files() - names) == []


def _metadata(dist: Path) -> tuple[Any, str]:
    wheel = zipfile.ZipFile(_one(dist, "perfmodel-*.whl"))
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    points = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    return Parser().parsestr(wheel.read(info).decode()), wheel.read(points).decode()


def test_torch_is_asked_for_only_by_the_calibration_and_validation_extras(dist):
    meta, _ = _metadata(dist)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    unconditional = {r.name for r in requires if r.marker is None}
    assert "torch" not in unconditional
    assert {"numpy", "sympy", "click"} <= unconditional
    torch_extras = {str(r.marker) for r in requires if r.name == "torch"}
    assert torch_extras == {'extra == "calibration"', 'extra == "validation"'}
    assert {"calibration", "validation"} <= set(meta.get_all("Provides-Extra"))
    assert meta["License-Expression"] == PYPROJECT["project"]["license"]


def test_the_wheel_declares_the_console_script_and_the_command_entry_points(dist):
    _, points = _metadata(dist)
    project = PYPROJECT["project"]
    wanted = [f"{name} = {target}" for name, target in project["scripts"].items()]
    for group in ("perfmodel.commands", "perfmodel.hooks"):
        wanted += [f"{name} = {target}"
                   for name, target in project["entry-points"][group].items()]
    assert [w for w in wanted if w not in points.splitlines()] == []
    assert "[console_scripts]" in points


# The installed wheel, alone on sys.path (pip install --target), run from an empty directory with
# torch absent: as after `pip install perfmodel` on a machine without torch.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
import perfmodel
assert perfmodel.__file__.startswith(sys.argv[1]), perfmodel.__file__
from perfmodel.cli import main
main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--no-index", "--target", str(target),
                          str(_one(dist, "perfmodel-*.whl"))],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return target


def _run_installed(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(installed), COLUMNS="100", PERFMODEL_CACHE_DIR=str(cwd / "cache"))
    return subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(installed), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def test_the_installed_wheel_predicts_and_recommends_without_torch(installed, tmp_path):
    plan = ["--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8"]
    out = _run_installed(installed, tmp_path, "predict", *plan, "--tp", "8", "--global-batch",
                         "8", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    schema = json.loads((ROOT / "docs" / "schemas" / "predict.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(doc)) == []
    out = _run_installed(installed, tmp_path, "recommend", *plan, "--global-batch", "64",
                         "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "step time" in out.stdout
    out = _run_installed(installed, tmp_path, "presets")  # the preset YAMLs, from the wheel
    assert out.returncode == 0 and "gb200-nvl72" in out.stdout, out.stderr


def test_the_installed_wheel_names_the_extra_for_calibrate_run(installed, tmp_path):
    out = _run_installed(installed, tmp_path, "calibrate", "run", "--out", "here.json")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and "'perfmodel[calibration]'" in out.stderr
