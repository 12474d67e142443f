"""The code samples of the README and of the pages of mkdocs.yml's nav, with the docs-check
annotations before them.

A fenced block is a sample; an HTML comment `<!-- docs-check: ... -->` on the lines before it
(blank lines allowed) says what to do with it:

- `file KIND NAME`: write the block to NAME in the sandbox and load it with the reader of KIND
  (hardware, model, plans, profile, measurements, report, history, trace); later commands may use
  it.
- `output`: the block is the standard output of the previous block's last command; compared line
  by line, numbers within a tolerance.
- `skip "PREFIX" because REASON`: do not run the commands that start with PREFIX (all commands of
  the block without a PREFIX). A reason is required.
- `add "PREFIX" "ARGS" because REASON`: run the commands that start with PREFIX with ARGS
  appended (click keeps the last value of an option given twice).

Blocks tagged bash/sh are commands; python blocks are executed; `text` or untagged blocks are
output and are not run (unless marked `output`). A line `--8<-- "PATH"` inside a block (mkdocs'
snippets) stands for the file's text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages() -> list[str]:
    """The pages of mkdocs.yml's nav, in its order: a page added to the site is checked too."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [f"docs/{page}" for entry in nav for page in entry.values()]


DOC_FILES = ["README.md", *_nav_pages()]
RUN_LANGUAGES = {"bash", "sh", "shell", "python", "yaml", "json", "csv"}

_FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")
_CHECK = re.compile(r"<!--\s*docs-check:(.*?)-->")
_SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')


@dataclass
class Directive:
    verb: str
    args: list[str]
    reason: str = ""


@dataclass
class Block:
    source: str  # e.g. README.md
    line: int  # line of the opening fence, 1-based
    language: str
    text: str
    directives: list[Directive] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    def directive(self, verb: str) -> list[Directive]:
        return [d for d in self.directives if d.verb == verb]


def parse_directive(text: str, where: str) -> Directive:
    parts = re.split(r"\bbecause\b", text, maxsplit=1)
    words = shlex.split(parts[0])
    reason = " ".join(parts[1].split()) if len(parts) > 1 else ""
    if not words:
        raise ValueError(f"{where}: empty docs-check comment")
    verb, rest = words[0], words[1:]
    if verb in ("skip", "add") and not reason:
        raise ValueError(f"{where}: docs-check '{verb}' needs 'because REASON'")
    if verb == "file" and len(rest) != 2:
        raise ValueError(f"{where}: docs-check 'file' takes KIND NAME")
    if verb == "add" and len(rest) != 2:
        raise ValueError(f"{where}: docs-check 'add' takes \"PREFIX\" \"ARGS\"")
    if verb not in ("file", "output", "skip", "add"):
        raise ValueError(f"{where}: unknown docs-check '{verb}'")
    return Directive(verb, rest, reason)


def _expand_snippets(text: str) -> str:
    out = []
    for line in text.splitlines():
        match = _SNIPPET.match(line)
        out.append((ROOT / match[1]).read_text(encoding="utf-8").rstrip("\n")
                   if match else line)
    return "\n".join(out) + "\n"


def blocks(source: str) -> list[Block]:
    """The fenced blocks of one file, in order, with their directives."""
    lines = (ROOT / source).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    pending: list[Directive] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            ticks, language = fence[1], fence[2].lower()
            j = i + 1
            while j < len(lines) and lines[j].strip() != ticks:
                j += 1
            text = _expand_snippets("\n".join(lines[i + 1:j]))
            out.append(Block(source, i + 1, language, text, pending))
            pending = []
            i = j + 1
            continue
        for match in _CHECK.finditer(line):
            pending.append(parse_directive(match[1], f"{source}:{i + 1}"))
        if line.strip() and not _CHECK.search(line):
            pending = []  # a directive applies to the next block only, across blank lines
        i += 1
    return out


def commands(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blanks dropped."""
    joined, current = [], ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        words = shlex.split(current, comments=True)
        if words:
            joined.append(" ".join(_rejoined(w, current) for w in words))
        current = ""
    return joined


def _rejoined(word: str, line: str) -> str:
    """A word as shlex.join quotes it, but a glob pattern the line leaves unquoted as it is
    (the shell expands it; a quoted one it passes on as written: test_samples._expand)."""
    quoted = f"'{word}'" in line or f'"{word}"' in line
    if any(c in word for c in "*?[") and not quoted and word in line:
        return word
    return shlex.quote(word)


def all_blocks() -> list[Block]:
    return [b for source in DOC_FILES for b in blocks(source)]
