"""Every code sample of the README and the docs runs.

One sandbox (a temporary directory with `tests/` linked in, as in a clone) serves all the files in
order, README first: a command may use what an earlier one wrote. Commands of the README run as a
user runs them, `python -m perfmodel ...` in a new process; commands of docs/*.md run in this
process through click (the same command tree, without the second and more of start-up), and a
command that the README already ran is not run again. Python blocks are executed; spec examples
are written to files and loaded by perfmodel's readers (see test_specs_examples.py for more);
sample outputs are compared with what the command prints now.

Commands that launch torch jobs (calibrate run, validate, recommend --validate, the emitted job)
are marked slow; so is any command that uses a file one of them writes.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docs.samples import ROOT, RUN_LANGUAGES, Block, all_blocks, commands
from tests.docs.spec_loaders import LOADERS

ENV = {"PYTHONPATH": str(ROOT), "COLUMNS": "200"}
TOLERANCE = 0.02  # numbers of a sample output may drift this much before the sample is stale


@dataclass
class Step:
    block: Block
    kind: str  # perfmodel, bash, pip, suite, mkdocs, python, file, output, skipped
    command: str = ""
    slow: bool = False
    note: str = ""

    @property
    def id(self) -> str:
        what = self.command or self.block.language or "text"
        return f"{self.block.where} {what}"[:110]


def _startswith(command: str, prefix: str) -> bool:
    return command == prefix or command.startswith(prefix + " ")


def _launches_torch(words: list[str]) -> bool:
    if words[:1] == ["bash"]:
        return True  # an emitted job's run script
    if words[:3] == ["perfmodel", "calibrate", "run"]:
        return True
    if words[:2] == ["perfmodel", "validate"] and "--emit" not in words:
        return True  # a local run, a dry run (torch's fake process group), or collect after a run
    return words[:2] == ["perfmodel", "recommend"] and "--validate" in words


def _outputs(words: list[str]) -> set[str]:
    return {words[i + 1].rstrip("/") for i, w in enumerate(words[:-1]) if w in ("--out", "--emit")}


def steps() -> list[Step]:
    out: list[Step] = []
    slow_files: set[str] = set()
    for block in all_blocks():
        skips = block.directive("skip")
        if any(not d.args for d in skips):
            out.append(Step(block, "skipped", note=skips[0].reason))
            continue
        if block.directive("output"):
            out.append(Step(block, "output"))
            continue
        files = block.directive("file")
        if files:
            out.append(Step(block, "file", command=files[0].args[1]))
            continue
        if block.language in ("bash", "sh", "shell"):
            for command in commands(block):
                for d in block.directive("add"):
                    if _startswith(command, d.args[0]):
                        command = f"{command} {d.args[1]}"
                words = shlex.split(command)
                skip = next((d for d in skips if _startswith(command, d.args[0])), None)
                if skip is not None:
                    out.append(Step(block, "skipped", command, note=skip.reason))
                    continue
                kind = {"perfmodel": "perfmodel", "bash": "bash", "pip": "pip",
                        "mkdocs": "mkdocs"}.get(words[0], "unknown")
                if words[:3] == ["python", "-m", "pytest"]:
                    kind = "suite"
                slow = _launches_torch(words) or any(
                    w.rstrip("/") in slow_files or w.split("/")[0] in slow_files for w in words)
                if slow:
                    slow_files |= _outputs(words)
                out.append(Step(block, kind, command, slow=slow))
        elif block.language == "python":
            out.append(Step(block, "python"))
        elif block.language in RUN_LANGUAGES:
            out.append(Step(block, "unchecked"))
    return out


STEPS = steps()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The working directory of every sample, shared in order; `tests/` linked as in a clone."""
    root = tmp_path_factory.mktemp("docs-samples")
    (root / "tests").symlink_to(ROOT / "tests")
    return {"dir": root, "ran": {}, "last": None}


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _expand(words: list[str], cwd: Path, command: str = "") -> list[str]:
    """The words with their glob patterns expanded, as the shell does; a word the command
    quotes ('Et|(tt|)*30mL') is not a pattern."""
    out = []
    for w in words:
        quoted = f"'{w}'" in command or f'"{w}"' in command
        if any(c in w for c in "*?[") and not quoted:
            with _cwd(cwd):
                found = sorted(glob.glob(w))
            assert found, f"the pattern {w} matches no file"
            out += found
        else:
            out.append(w)
    return out


def _run_subprocess(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    res = subprocess.run(argv, cwd=cwd, env={**os.environ, **ENV}, capture_output=True, text=True,
                         timeout=600)
    return res.returncode, res.stdout, res.stderr


def _run_in_process(args: list[str], cwd: Path) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from perfmodel.cli import cli

    with _cwd(cwd):
        res = CliRunner().invoke(cli, args, prog_name="perfmodel", env=ENV, catch_exceptions=True)
    try:
        err = res.stderr
    except ValueError:  # click < 8.2 mixes standard error into the output
        err = ""
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        err += "".join(traceback.format_exception(res.exception))
    return res.exit_code, res.stdout, err


def _numbers(line: str) -> tuple[str, list[float]]:
    pattern = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"
    skeleton = " ".join(re.sub(pattern, "#", line).split())
    return skeleton, [float(n.replace(",", "")) for n in re.findall(pattern, line)]


def _same(sample: str, actual: str) -> bool:
    s_skel, s_nums = _numbers(sample)
    a_skel, a_nums = _numbers(actual)
    if s_skel != a_skel or len(s_nums) != len(a_nums):
        return False
    return all(abs(a - s) <= TOLERANCE * max(abs(a), abs(s)) + 1e-12
               for s, a in zip(s_nums, a_nums, strict=True))


def check_output(sample: str, actual: str) -> None:
    """Every line of the sample appears in the output, in order, numbers within TOLERANCE."""
    lines, pos = actual.splitlines(), 0
    for want in (w for w in sample.splitlines() if w.strip()):
        for i in range(pos, len(lines)):
            if _same(want, lines[i]):
                pos = i + 1
                break
        else:
            pytest.fail(f"sample line not in today's output (stale sample? paste the new output):\n"
                        f"  {want}\noutput:\n{actual}")


def _check_pip(command: str) -> None:
    """`pip install` lines are checked, not run: the requirements parse and the extras exist;
    a byte-compilation after it (`&& python -m compileall -q DIR...`) names this repository's
    package directories."""
    from packaging.requirements import Requirement

    words = shlex.split(command)
    if "&&" in words:
        words, after = words[:words.index("&&")], words[words.index("&&") + 1:]
        assert after[:4] == ["python", "-m", "compileall", "-q"], command
        missing = [d for d in after[4:] if not any((ROOT / d).glob("*.py"))]
        assert after[4:] and not missing, f"no Python package of the repository: {missing}"
    assert words[:2] == ["pip", "install"], command
    extras_defined = _extras()
    words = words[2:]
    while words:
        w = words.pop(0)
        if w in ("-e", "--quiet", "-q", "--upgrade", "-U"):
            continue
        if w == "--index-url":  # the CPU-only torch's index (docs/install.md)
            assert words and words.pop(0) == "https://download.pytorch.org/whl/cpu", command
            continue
        if w.startswith((".", "/")):
            extras = [e for group in re.findall(r"\[([^\]]+)\]", w) for e in group.split(",")]
        else:
            requirement = Requirement(w)  # raises on a malformed requirement
            extras = list(requirement.extras) if requirement.name == "perfmodel" else []
        for name in extras:
            assert name.strip() in extras_defined, f"no extra '{name}' in pyproject.toml"


def _extras() -> set[str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(data["project"].get("optional-dependencies", {}))


def _param(step: Step) -> Any:
    marks = [pytest.mark.slow] if step.slow else []
    return pytest.param(step, id=step.id, marks=marks)


def test_every_sample_is_checked():
    """No runnable block or command goes unchecked: unknown commands need a skip with a reason."""
    unchecked = [s.id for s in STEPS if s.kind in ("unchecked", "unknown")]
    assert not unchecked, f"samples no check can run (add a docs-check comment): {unchecked}"
    skipped = [s for s in STEPS if s.kind == "skipped"]
    assert all(s.note for s in skipped)
    assert len(skipped) <= 4, "skips must stay rare: " + ", ".join(s.id for s in skipped)


@pytest.mark.parametrize("step", [_param(s) for s in STEPS])
def test_sample(step: Step, sandbox: dict[str, Any]) -> None:
    cwd: Path = sandbox["dir"]
    if step.kind == "skipped":
        pytest.skip(f"docs-check skip: {step.note}")
    if step.kind == "unchecked" or step.kind == "unknown":
        pytest.fail(f"{step.id}: no check for this sample")
    if step.kind == "suite":
        return  # `python -m pytest` is this test suite: it is running now
    if step.kind == "mkdocs":
        assert shlex.split(step.command)[:2] == ["mkdocs", "build"], step.command
        return  # built by tests/docs/test_build.py
    if step.kind == "pip":
        _check_pip(step.command)
        return
    if step.kind == "python":
        buf = io.StringIO()
        with _cwd(cwd), contextlib.redirect_stdout(buf):
            exec(compile(step.block.text, step.block.where, "exec"), {"__name__": "__docs__"})
        sandbox["last"] = buf.getvalue()
        return
    if step.kind == "file":
        name = step.command
        kind = step.block.directive("file")[0].args[0]
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(step.block.text, encoding="utf-8")
        assert kind in LOADERS, f"unknown file kind {kind} (known: {', '.join(LOADERS)})"
        with _cwd(cwd):
            LOADERS[kind](path)
        return
    if step.kind == "output":
        assert sandbox["last"] is not None, "an output sample with no command before it"
        check_output(step.block.text, sandbox["last"])
        return
    words = _expand(shlex.split(step.command), cwd, step.command)
    if step.command in sandbox["ran"]:
        sandbox["last"] = sandbox["ran"][step.command]
        return  # the same command ran earlier (README first): not run twice
    if step.kind == "bash":
        code, out, err = _run_subprocess(words, cwd)
    elif step.block.source == "README.md":
        code, out, err = _run_subprocess([sys.executable, "-m", *words], cwd)
    else:
        code, out, err = _run_in_process(words[1:], cwd)
    assert code == 0, f"{step.command}\nexit {code}\n{out[-3000:]}\n{err[-3000:]}"
    sandbox["ran"][step.command] = out
    sandbox["last"] = out
