"""Model presets and importers producing a ModelSpec; parameter counting in planner.models.counting.

A model reference is one of:
- a preset name (`planner models list`): a YAML file under planner/models/presets/, data not code;
- a HuggingFace `config.json` (a file named config.json, a folder holding one, or any JSON/YAML with a
  `model_type` key);
- our own model spec as YAML/JSON (the ModelSpec fields).

Importing this package imports neither the YAML parser nor the pydantic schemas (they are imported by the
functions that load a model), so `planner models list` can list the presets from planner.models.preset_index
without them.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import BadInputError
from planner.resources import package_path

if TYPE_CHECKING:
    from planner.schemas.model import ModelSpec

PRESET_DIR = package_path("models", "presets")
PRESET_SUFFIX = ".yaml"


def list_presets(preset_dir: Path = PRESET_DIR) -> list[str]:
    """Names of the shipped presets (the YAML files of `preset_dir`), sorted."""
    return sorted(path.stem for path in preset_dir.glob(f"*{PRESET_SUFFIX}"))


def load_preset(name: str) -> ModelSpec:
    """Load a shipped preset by name; an unknown name raises BadInputError with the closest names."""
    from planner.io import is_file, load_file
    from planner.schemas.model import ModelSpec

    path = PRESET_DIR / f"{name}{PRESET_SUFFIX}"
    if "/" in name or not is_file(path):
        raise BadInputError(_unknown_model_message(name))
    return load_file(ModelSpec, path)


def _unknown_model_message(ref: str) -> str:
    names = list_presets()
    close = difflib.get_close_matches(ref.lower(), names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return (
        f"model={ref!r} is neither a preset nor an existing file: {hint}"
        f"presets are {', '.join(names)}; a path to a HuggingFace config.json or a model spec YAML/JSON also works"
    )


def _is_hf_config(path: Path, data: object) -> bool:
    return path.name == "config.json" or (isinstance(data, dict) and "model_type" in data)


def load_model(ref: str) -> ModelSpec:
    """Resolve a model reference: preset name first, else a path (HF config.json or our spec)."""
    from planner.io import is_file, load_structured, validate
    from planner.schemas.model import ModelSpec

    if "/" not in ref and is_file(PRESET_DIR / f"{ref}{PRESET_SUFFIX}"):
        return load_preset(ref)
    path = Path(ref).expanduser()
    if is_file(path / "config.json"):
        path = path / "config.json"  # a HuggingFace checkpoint folder
    if not is_file(path):
        raise BadInputError(_unknown_model_message(ref))
    data = load_structured(path)
    if _is_hf_config(path, data):
        from planner.models.hf import spec_from_hf_config

        return spec_from_hf_config(path)
    return validate(ModelSpec, data, source=str(path))


__all__ = ["PRESET_DIR", "list_presets", "load_model", "load_preset"]
