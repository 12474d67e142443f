"""The built documentation site, shared by the docs tests (one build per session)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs.samples import ROOT


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The built site. A proxy that refuses every connection stands in for the network: a build
    that tried to fetch anything (a font, a plugin's data) would fail or leave a trace."""
    out = tmp_path_factory.mktemp("site")
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1",
           "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead}
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return out
