"""The generated pages: every command and option in the CLI reference, every preset and its
numbers on the presets page, the exit codes as the code defines them."""

from __future__ import annotations

import importlib.util
import os
import re

import click
import pytest
import yaml

from tests.docs.samples import ROOT
from tests.docs.test_build import page_text


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def _tree():
    """(command path, command, context) of every command, walked with click's own API."""
    from perfmodel.cli import cli

    out = []

    def visit(command, ctx):
        out.append((ctx.command_path, command, ctx))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                visit(sub, click.Context(sub, info_name=name, parent=ctx))

    visit(cli, click.Context(cli, info_name="perfmodel"))
    return out


def _sections(markdown: str) -> dict[str, str]:
    """The reference split by command heading: {'perfmodel predict': '...', ...}."""
    parts = re.split(r"^#+ `([^`]+)` \{#[^}]+\}$", markdown, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_entry_point_groups_are_in_the_tree():
    paths = {path for path, _, _ in _tree()}
    assert {"perfmodel calibrate run", "perfmodel calibrate import-nccl-tests",
            "perfmodel calibrate import-gemm", "perfmodel calibrate report",
            "perfmodel validate", "perfmodel validate collect"} <= paths


def test_every_command_and_option_is_in_the_reference():
    sections = _sections(hooks.cli_reference())
    for path, command, ctx in _tree():
        assert path in sections, f"no section for {path}"
        text = sections[path]
        if command.help:
            first = command.help.strip().splitlines()[0]
            assert first.split(":")[0][:40] in text.replace("\n", " "), (path, first)
        for param in command.get_params(ctx):
            if isinstance(param, click.Argument):
                assert param.make_metavar(ctx) in text, (path, param.name)
                continue
            for opt in param.opts + param.secondary_opts:
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), (path, opt)


def test_every_option_says_what_it_does():
    """The reference is only as good as the help texts: every visible option has one."""
    bare = [(path, param.opts[0]) for path, command, ctx in _tree()
            for param in command.get_params(ctx)
            if isinstance(param, click.Option) and not param.hidden and not param.help]
    assert not bare, f"options without help text: {bare}"


def test_the_built_reference_has_every_command(site):
    text = page_text(site, "cli")
    for path, _, _ in _tree():
        assert path in text


def _exit_code(argv, monkeypatch=None, raise_=None):
    from perfmodel import cli

    if raise_ is not None:
        def boom(*args, **kwargs):
            raise raise_

        monkeypatch.setattr(cli.cli, "main", boom)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code


def test_exit_codes_table_matches_the_code(monkeypatch, tmp_path):
    """Each code of the table is what `perfmodel` exits with for an error of that class."""
    text = (ROOT / "docs" / "cli.md").read_text()
    rows = {int(code): what for code, what in re.findall(r"^\| (\d+) \|([^|]*)\|", text, re.M)}
    assert set(rows) == {0, 1, 2, 3, 4, 5, 6, 7, 130, 141}
    bad_csv = tmp_path / "plans.csv"
    bad_csv.write_text("gpus,tp\n8,3\n")
    assert _exit_code(["presets", "--no-such-flag"]) == 2 and rows[2].strip() == "usage"
    assert _exit_code(["collective", "--op", "all_reduce", "--bytes", "1MiB", "--ranks", "8",
                       "--hardware", "no-such-preset"]) == 3 and "SpecError" in rows[3]
    assert _exit_code(["predict", "--model", "gpt3-175b", "--hardware", "dgx-h100",
                       "--tp", "7"]) == 4 and "PlanError" in rows[4]
    assert _exit_code(["predict", "--model", "tiny-gpt", "--hardware", "dgx-h100",
                       "--batch", str(bad_csv)]) == 5 and "DataError" in rows[5]
    assert _exit_code(["predict", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--plot",
                       str(tmp_path)]) == 7  # a directory for an output: the output's class
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _exit_code(["predict", "--model", "tiny-gpt", "--hardware", "dgx-h100", "--plot",
                       str(fifo)]) == 7 and "OutputError" in rows[7]
    assert "job failed" in rows[6]
    assert _exit_code([], monkeypatch, RuntimeError("a bug")) == 1
    assert rows[1].strip() == "internal error"
    assert _exit_code([], monkeypatch, KeyboardInterrupt()) == 130
    assert "interrupted" in rows[130]
    assert "output closed" in rows[141]  # tests/unit/test_cli.py closes the pipe for it
    readme = (ROOT / "README.md").read_text()
    assert "0 success, 1 internal error" in readme and "130 interrupted" in readme
    assert "141 output closed" in readme


def _numbers(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _numbers(value, f"{prefix}{key}.")
    elif isinstance(data, list):  # a list of entries (a fabric's levels)
        for i, item in enumerate(data):
            yield from _numbers(item, f"{prefix}{i}.")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield prefix.rstrip(".")


def test_presets_page_shows_every_preset_and_number():
    from perfmodel.specs.cnn import BUILDERS
    from perfmodel.specs.presets import HARDWARE_DIR, MODELS_DIR

    page = hooks.presets_page()
    files = sorted(HARDWARE_DIR.glob("*.yaml")) + sorted(MODELS_DIR.glob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        assert text.rstrip("\n") in page, f"{path.name} is not shown as it ships"
        data = yaml.safe_load(text)
        assert data.get("source"), f"{path.name} has no source"
        assert list(_numbers(data)), path.name
    for name in BUILDERS:
        assert f"| `{name}` |" in page


def test_numbers_without_a_comment_are_found():
    text = ("a: 1  # datasheet\nb:  # parent says\n  c: 2\nd:\n  e: 3\n  f: 4  # own\ng: 5\n"
            "h:\n  # block comment\n  i:\n    j: 6\n")
    assert hooks.numbers_without_comment(text) == ["d.e", "g"]


@pytest.mark.parametrize("name", ["perfmodel calibrate run"])
def test_hidden_options_are_marked(name):
    sections = _sections(hooks.cli_reference())
    assert "(hidden, for tests)" in sections[name]


def test_no_internal_jargon_in_help_or_pages():
    """The papers perfmodel reproduces are named by their authors, never by the project's internal
    numbers ("seed 003" means nothing to a user)."""
    from tests.docs.samples import DOC_FILES

    jargon = re.compile(r"\bseed[\s_]*0\d\d\b", re.I)
    texts = {"--help": hooks.cli_reference(),
             **{page: (ROOT / page).read_text(encoding="utf-8") for page in DOC_FILES},
             **{p.name: p.name + p.read_text(encoding="utf-8")
                for p in (ROOT / "notebooks").glob("*.ipynb")}}
    found = {where: jargon.findall(text) for where, text in texts.items() if jargon.search(text)}
    assert not found, found
