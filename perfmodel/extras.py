"""The optional dependencies: which extra of the perfmodel distribution brings which command.

`pip install perfmodel` (no extra) predicts, explains, recommends and imports calibration data
without torch; measuring this machine (`calibrate run`) and running a validation job (`validate`,
`recommend --validate`) need torch, which the extras `calibration` and `validation` bring
(pyproject.toml). A command that needs torch where it is missing refuses in one line naming the
extra, before it starts anything; perfmodel itself never imports torch (it only looks for it).
"""

from __future__ import annotations

import importlib.util

__all__ = ["command_of", "extra_for", "missing_torch_message", "require_torch",
           "torch_installed"]


def command_of(args: list[str]) -> str:
    """The command a command line runs: its first word that is not an option (the group's
    --debug), and for `calibrate` its subcommand: 'predict', 'calibrate run'."""
    words = [a for a in args if not a.startswith("-")]
    return " ".join(words[:2] if words[:1] == ["calibrate"] else words[:1]) or "?"


def extra_for(command: str) -> str:
    """The extra that brings what `command` (e.g. 'calibrate run', 'validate') needs."""
    return "calibration" if command.split()[:1] == ["calibrate"] else "validation"


def missing_torch_message(command: str) -> str:
    """One line: the command needs torch, and how to install it."""
    return (f"'perfmodel {command}' needs torch, which is not installed: pip install "
            f"'perfmodel[{extra_for(command)}]' (without a GPU, the CPU-only torch: "
            "docs/install.md)")


def torch_installed() -> bool:
    """Whether torch can be imported, found without importing it (2.3 s)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or blocked torch
        return False


def require_torch(command: str) -> None:
    """Refuse (MissingExtraError, exit 2) when torch is not installed."""
    if not torch_installed():
        from perfmodel.errors import MissingExtraError

        raise MissingExtraError(missing_torch_message(command))
