import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

# as the CLI runs: the suite's workers build hundreds of step models in-process, before any test
# has imported sympy (perfmodel.cli imports none)
if "sympy" not in sys.modules:
    from perfmodel.cli import SYMPY_CACHE_SIZE

    os.environ.setdefault("SYMPY_CACHE_SIZE", SYMPY_CACHE_SIZE)

# How long a test waits for an event (a file appearing, a line printed, a process exiting) before
# it calls the wait hung. A bound on a hang, not a speed target: the machine the suite runs on may
# be loaded, and a late event is not a wrong one. Tests wait on events, never on fixed sleeps.
PATIENCE_S = float(os.environ.get("PERFMODEL_TEST_PATIENCE_S", "600"))


def as_from_a_terminal() -> None:
    """preexec_fn of a command a test interrupts as Ctrl-C does: SIGINT's default action, which
    Python turns into KeyboardInterrupt, whatever the test runner's own disposition. A background
    job of a non-interactive shell (`pytest ... &`) ignores SIGINT, and an exec'd child inherits
    that: the command would then never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition: Callable[[], Any], what: str, *, proc: Any = None,
             timeout_s: float = PATIENCE_S, poll_s: float = 0.1) -> Any:
    """Poll condition() until it returns a true value, and return that value.

    AssertionError naming `what` when proc (a Popen) exits before it, or after timeout_s (hung).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        exited = proc is not None and proc.poll() is not None
        value = condition()
        if value:
            return value
        if exited:
            raise AssertionError(f"{what}: the process exited first (exit code {proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s (hung?)")
        time.sleep(poll_s)


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

    def run(*args, input_text=None, timeout=PATIENCE_S):
        env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
        return subprocess.run([sys.executable, "-m", "perfmodel", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, input=input_text,
                              timeout=timeout)

    return run
