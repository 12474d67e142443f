import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def run_cli(tmp_path):
    """Run `python -m perfmodel ARGS` in a subprocess, as a user would; returns CompletedProcess."""

    def run(*args, input_text=None, timeout=120):
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
        return subprocess.run([sys.executable, "-m", "perfmodel", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, input=input_text,
                              timeout=timeout)

    return run
