"""The hardware a command runs on, from a hardware preset or file and/or a calibration profile.

Every command that takes --hardware/--profile (predict, its --batch, recommend, explain, sweep,
collective) resolves them here, once. The profile module (sympy for its fits) is imported only
when a profile is given: a plain `predict --hardware` stays fast to start.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perfmodel.errors import PerfmodelError
from perfmodel.specs.hardware import HardwareSpec, load_hardware


def resolve_hardware(hardware: str | None, profile: str | Path | None,
                     algorithm: str | None = None) -> HardwareSpec:
    """A HardwareSpec from a preset or file and/or a profile (the profile's fields win), its
    collective_algorithm replaced by `algorithm` where given (--collective-algorithm).

    An incomplete profile is said once on standard error, by every command that reads it; so is
    a profile beside --hardware that names no GPU (its GPU is not checked: check_machine).
    """
    if profile:
        from perfmodel.specs import profile as profiles  # start-up: sympy only with a profile

        prof = profiles.load_profile(Path(profile))
        base = load_hardware(hardware) if hardware else None
        spec = profiles.apply_profile(base, prof)  # refuses a profile of another machine
        unchecked = profiles.check_machine(base, prof) if base is not None else None
        for note in (profiles.incomplete_note(prof), unchecked):
            if note:
                print(f"note: {note}", file=sys.stderr)
    elif not hardware:
        raise PerfmodelError("give --hardware (a preset or file) or --profile")
    else:
        spec = load_hardware(hardware)
    return spec.replace(collective_algorithm=algorithm) if algorithm else spec
