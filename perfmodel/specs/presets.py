"""Finding presets (data files shipped in presets/) and user spec files."""

from __future__ import annotations

import os
from pathlib import Path

from perfmodel.errors import SpecError
from perfmodel.specs.loading import suggest

PRESETS_DIR = Path(__file__).parent / "presets"
HARDWARE_DIR = PRESETS_DIR / "hardware"
MODELS_DIR = PRESETS_DIR / "models"


def preset_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def list_presets() -> dict[str, list[str]]:
    """{'hardware': [...], 'models': [...]} (models: transformers, then layer graphs)"""
    from perfmodel.specs.cnn import BUILDERS

    return {"hardware": preset_names(HARDWARE_DIR),
            "models": preset_names(MODELS_DIR) + sorted(BUILDERS)}


def looks_like_path(value: str) -> bool:
    return any(sep in value for sep in ("/", "\\")) or value.endswith(
        (".yaml", ".yml", ".json", ".toml")
    )


def resolve(name_or_path: str | Path, directory: Path, what: str,
            relative_to: Path | None = None) -> Path:
    """A preset's file, or the user's file; a clear error naming the closest preset otherwise."""
    if not isinstance(name_or_path, (str, os.PathLike)):  # a spec of the other kind, a Plan
        spec = "TransformerSpec" if what == "model" else "HardwareSpec"
        raise SpecError(f"{what} must be a preset name, a spec file's path or a {spec}, got "
                        f"{type(name_or_path).__name__}")
    text = str(name_or_path)
    if not text.strip():
        raise SpecError(f"{what}: an empty name is not a preset or a file")
    preset = directory / f"{text}.yaml"
    try:
        if not looks_like_path(text) and preset.is_file():
            return preset
        path = Path(text).expanduser()
        if relative_to is not None and not path.is_absolute():  # a spec's base: beside it
            path = relative_to / path
        if path.exists():
            return path
    except (OSError, ValueError) as exc:  # a name too long, or with a NUL byte, for the system
        raise SpecError(
            f"{what}: '{text[:60]}' is not a preset or a readable path ({exc})") from None
    names = preset_names(directory)
    if directory == MODELS_DIR:
        from perfmodel.specs.cnn import BUILDERS

        names = sorted(names + list(BUILDERS))
    if looks_like_path(text):
        raise SpecError(f"{what} file not found: {text}")
    raise SpecError(
        f"unknown {what} preset '{text}'{suggest(text, names)}; presets: {', '.join(names)} "
        f"(or give a path to a YAML/JSON file)"
    )
