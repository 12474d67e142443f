"""Errors the user can cause. The CLI turns each into one line and an exit code of its class."""

from __future__ import annotations


class PerfmodelError(Exception):
    """Base class: a problem with the user's input that the CLI reports without a traceback."""

    exit_code = 2


class UsageError(PerfmodelError, ValueError):
    """A value of the wrong form for its option, where perfmodel reads the option itself rather
    than click (`collective --bytes lots`, `nan`): a usage error, as click's own are."""

    exit_code = 2


class SpecError(PerfmodelError, ValueError):
    """A hardware, model or profile spec is missing a field, has a wrong value or cannot be read."""

    exit_code = 3


class PlanError(PerfmodelError, ValueError):
    """A parallel plan breaks a rule (divisibility, degrees, options)."""

    exit_code = 4


class DataError(PerfmodelError, ValueError):
    """An input data file (CSV of plans, log, table) is malformed."""

    exit_code = 5


class OutputError(PerfmodelError):
    """An output cannot be written: its directory is missing or read-only, the disk is full, or the
    path is a directory, device, FIFO or socket (perfmodel.files.write_atomic refuses those)."""

    exit_code = 7


class MissingExtraError(PerfmodelError):
    """A command needs an optional dependency that is not installed (torch, for `calibrate run`,
    `validate` and `recommend --validate`): the message names the extra that brings it. A usage
    error: the command cannot be used as installed."""

    exit_code = 2


class InternalError(PerfmodelError):
    """perfmodel computed what it must not print (a NaN or an infinity): a bug, not the user's."""

    exit_code = 1
