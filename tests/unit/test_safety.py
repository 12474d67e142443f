"""Safety (issue 8): spec files are data, never code (safe loaders, no pickle); runs on this machine
and emitted jobs without a cluster address listen on loopback only; nothing is downloaded."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from perfmodel.errors import SpecError
from tests.conftest import ROOT

PACKAGES = ("perfmodel", "workload", "calibration", "validation", "benchmarks")
# exec of the numpy code perfmodel generates itself (sympy's lambdify), cached on disk
OWN_GENERATED_CODE = {"perfmodel/evaluate.py", "perfmodel/staged.py", "perfmodel/explain.py"}
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve",
                  "urllib.request", "requests", "httpx", "http.client", "huggingface_hub"}


def _sources():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text())


def unsafe_calls(rel: str, tree: ast.AST) -> list[str]:
    """yaml.load/unsafe_load/full_load or a yaml Loader other than SafeLoader, pickle-like or
    network modules, torch.load, eval and exec (outside perfmodel's own generated code)."""
    found = []
    safe = {"SafeLoader", "CSafeLoader"}
    safe |= {  # their names as this file imports them (from yaml import CSafeLoader as X)
        a.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        and node.module == "yaml" for a in node.names if a.name in safe and a.asname}
    safe_loaders = safe | {  # and classes of this file derived from them
        c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
        and any(getattr(base, "attr", getattr(base, "id", "")) in safe for base in c.bases)}
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            found += [f"{where} imports {n}" for n in names
                      if n in UNSAFE_MODULES or n.split(".")[0] in UNSAFE_MODULES - {"http"}]
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        def loader(value: ast.expr) -> str:
            return getattr(value, "attr", getattr(value, "id", ""))

        safe_loader = any(kw.arg == "Loader" and loader(kw.value) in safe_loaders
                          for kw in node.keywords)
        if owner == "yaml" and name in ("load", "unsafe_load", "full_load", "load_all",
                                        "unsafe_load_all", "full_load_all") and not (
                name in ("load", "load_all") and safe_loader):
            found.append(f"{where} calls yaml.{name}")
        if owner == "torch" and name == "load":
            found.append(f"{where} calls torch.load")
        if name in ("eval", "exec") and not owner and rel not in OWN_GENERATED_CODE:
            found.append(f"{where} calls {name}")
        for kw in node.keywords:
            if kw.arg == "Loader" and loader(kw.value) not in safe_loaders:
                found.append(f"{where} passes a yaml Loader other than SafeLoader")
    return found


def test_no_unsafe_loader_pickle_eval_or_network_module_in_the_sources():
    assert [f for rel, tree in _sources() for f in unsafe_calls(rel, tree)] == []


@pytest.mark.parametrize("code", [
    "import yaml\nyaml.load(text)\n",
    "import yaml\nyaml.load(text, Loader=yaml.Loader)\n",
    "import pickle\n",
    "from urllib.request import urlopen\n",
    "import torch\ntorch.load(path)\n",
    "eval(text)\n",
])
def test_the_source_check_catches_each_unsafe_call(code):
    assert unsafe_calls("x.py", ast.parse(code))


def test_safe_calls_pass_the_source_check():
    assert unsafe_calls("x.py", ast.parse("import yaml\nyaml.safe_load(t)\n"
                                          "yaml.load(t, Loader=yaml.SafeLoader)\n")) == []
    code = "import yaml\nclass Strict(yaml.SafeLoader):\n    pass\nyaml.load(t, Loader=Strict)\n"
    assert unsafe_calls("x.py", ast.parse(code)) == []
    code = "import yaml\nclass Loose(yaml.FullLoader):\n    pass\nyaml.load(t, Loader=Loose)\n"
    assert unsafe_calls("x.py", ast.parse(code))
    # a safe loader imported under another name (perfmodel.specs.loading: libyaml's, else
    # PyYAML's), and a class derived from it
    code = ("import yaml\nfrom yaml import CSafeLoader as Fast\nclass Strict(Fast):\n    pass\n"
            "yaml.load(t, Loader=Strict)\nyaml.load(t, Loader=Fast)\n")
    assert unsafe_calls("x.py", ast.parse(code)) == []
    code = ("import yaml\nfrom yaml import Loader as Fast\nclass Loose(Fast):\n    pass\n"
            "yaml.load(t, Loader=Loose)\n")
    assert unsafe_calls("x.py", ast.parse(code))


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_spec_that_would_run_code_is_refused_and_runs_nothing(tmp_path, suffix):
    from perfmodel.specs.hardware import load_hardware
    from perfmodel.specs.model import load_model

    marker = tmp_path / "pwned"
    payload = f"!!python/object/apply:os.system ['touch {marker}']"
    for load, text in ((load_model, f"kind: transformer\nlayers: {payload}\n"),
                       (load_hardware, f"base: dgx-h100\nmemory_bytes: {payload}\n")):
        spec = tmp_path / f"spec{suffix}"
        spec.write_text(text)
        with pytest.raises(SpecError):
            load(str(spec))
    assert not marker.exists()


def test_emitted_jobs_use_loopback_unless_a_cluster_address_is_given(tmp_path):
    from tests.unit.test_bad_input import run_main

    out = tmp_path / "job"
    code, _, err = run_main(["validate", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                             "--dp", "2", "--emit", str(out)])
    assert code == 0, err
    run_sh = (out / "run.sh").read_text()
    assert "export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}\n" in run_sh
    for master, nccl, gloo in (("127.0.0.1", "lo", "lo"), ("10.1.2.3", "^lo,docker", "")):
        env = dict(os.environ, MASTER_ADDR=master)
        env.pop("NCCL_SOCKET_IFNAME", None)
        env.pop("GLOO_SOCKET_IFNAME", None)
        script = run_sh.replace('cd "$(dirname "$0")"', "").split("torchrun ")[0]
        show = 'echo "$NCCL_SOCKET_IFNAME|${GLOO_SOCKET_IFNAME:-}"'
        got = subprocess.run(["bash", "-c", script + show], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        assert got == f"{nccl}|{gloo}", master
    # on a cluster, Slurm gives the address: the first node of the allocation
    assert "MASTER_ADDR=$(scontrol show hostnames" in (out / "job.sbatch").read_text()
    # a local run's default
    from validation.run import RunSettings

    assert RunSettings(nprocs=2).master_addr == "127.0.0.1"


def test_a_local_rendezvous_listens_on_loopback_only(monkeypatch):
    """The job's store for a run on this machine: bound to 127.0.0.1 by the job itself (torch's
    TCPStore alone listens on every interface); a cluster address is left to torch."""
    pytest.importorskip("torch")
    import datetime

    from workload.launcher import free_port
    from workload.process import _LISTENING, loopback_rendezvous

    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    kw = loopback_rendezvous(0, 1, datetime.timedelta(seconds=10))
    try:
        assert kw["store"].port == port
        assert _LISTENING[-1].getsockname() == ("127.0.0.1", port)
    finally:
        _LISTENING.pop().close()
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert loopback_rendezvous(0, 2, datetime.timedelta(seconds=10)) == {}


NO_NETWORK = '''
import socket

def _refuse(*args, **kwargs):
    raise RuntimeError("perfmodel tried to reach the network")

_connect = socket.socket.connect

def connect(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if host not in ("127.0.0.1", "::1", "localhost") and not str(host).startswith("/"):
        _refuse()
    return _connect(self, address)

socket.socket.connect = connect
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
'''


def test_nothing_is_downloaded_at_run_time(tmp_path):
    """The commands run with every connection off this machine refused (sitecustomize), and a
    name that looks like a Hugging Face repository is a missing file, not a download."""
    (tmp_path / "sitecustomize.py").write_text(NO_NETWORK)
    hf = tmp_path / "llama"
    hf.mkdir()
    (hf / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, '
        '"num_attention_heads": 8, "intermediate_size": 688, "vocab_size": 1000, '
        '"max_position_embeddings": 512}')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    log = ROOT / "tests/data/nccl-tests/h100x8-allreduce-nccl-tests-cluster-cluster01.txt"
    commands = [
        ["predict", "--model", str(hf), "--hardware", "dgx-h100", "--gpus", "8", "--tp", "8",
         "--seq-len", "512"],
        ["calibrate", "import-nccl-tests", str(log), "--out", str(tmp_path / "p.json")],
        ["validate", "--model", "tiny-gpt", "--dp", "4", "--dry-run"],
    ]
    for args in commands:
        out = subprocess.run([sys.executable, "-m", "perfmodel", *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (args, out.stderr[-2000:])
        assert "reach the network" not in out.stderr
    hub = subprocess.run([sys.executable, "-m", "perfmodel", "predict", "--model",
                          "meta-llama/Llama-2-7b-hf", "--hardware", "dgx-h100"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert hub.returncode == 3 and "model file not found: meta-llama/Llama-2-7b-hf" in hub.stderr
    probe = subprocess.run([sys.executable, "-c", "import socket; socket.getaddrinfo('x', 1)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "reach the network" in probe.stderr  # the guard is in place
