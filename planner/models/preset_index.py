"""The rows of `planner models list` for the shipped presets, precomputed in presets/index.json.

Why: listing 13 presets by loading each through the YAML parser and the pydantic ModelSpec costs more in
imports (PyYAML, the schema classes) than in work, about a fifth of the command's start-up on a quiet box
(benchmarks/cli_startup.py). The index file holds the rows (planner.models.summary.model_row of each preset)
and a fingerprint: the sha256 over every preset file and over the source of the code a row is computed by
(ROW_SOURCES). When the fingerprint of the files on disk differs (a preset added, edited or removed, the
counting changed), `preset_rows` computes the rows from the presets instead: a stale index costs time, never
a wrong row. tests/unit/test_models_presets.py fails until the index is regenerated with

    python -m planner.models.preset_index

This module imports only the standard library; the fallback imports the loaders when it runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from planner.models import PRESET_DIR, PRESET_SUFFIX, list_presets
from planner.resources import package_path

INDEX_PATH = PRESET_DIR / "index.json"
PACKAGE_DIR = package_path()
# The code a row depends on, beside the preset files: the counting, the row itself and the spec's defaults.
ROW_SOURCES = ("models/counting.py", "models/summary.py", "schemas/model.py", "schemas/base.py", "schemas/limits.py")


def fingerprint(preset_dir: Path = PRESET_DIR) -> str:
    """sha256 over the preset files (name and bytes, in name order) and the sources in ROW_SOURCES."""
    digest = hashlib.sha256()
    paths = [preset_dir / f"{name}{PRESET_SUFFIX}" for name in list_presets(preset_dir)]
    for path in [*paths, *(PACKAGE_DIR / source for source in ROW_SOURCES)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def computed_rows(preset_dir: Path = PRESET_DIR) -> list[dict[str, Any]]:
    """Each preset loaded and validated as a ModelSpec, then summarised: what the index must equal."""
    from planner.io import load_file
    from planner.models.summary import model_row
    from planner.schemas.model import ModelSpec

    return [model_row(load_file(ModelSpec, preset_dir / f"{name}{PRESET_SUFFIX}")) for name in list_presets(preset_dir)]


def preset_rows(preset_dir: Path = PRESET_DIR, index_path: Path = INDEX_PATH) -> list[dict[str, Any]]:
    """The rows of `planner models list`, in name order: from the index when its fingerprint matches the
    files, else computed from the presets."""
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        fresh = isinstance(index, dict) and isinstance(index.get("rows"), list) and index.get("fingerprint") == fingerprint(preset_dir)
    except (OSError, ValueError):  # no index, a broken one, or no sources to fingerprint (an install without .py)
        fresh = False
    return index["rows"] if fresh else computed_rows(preset_dir)


def index_text(preset_dir: Path = PRESET_DIR) -> str:
    """The index file's content for the presets on disk now: fingerprint and rows, canonical JSON."""
    from planner.io import canonical_json

    return canonical_json({"fingerprint": fingerprint(preset_dir), "rows": computed_rows(preset_dir)})


if __name__ == "__main__":
    from planner.io import atomic_write_text

    print(f"wrote {atomic_write_text(INDEX_PATH, index_text())}")
