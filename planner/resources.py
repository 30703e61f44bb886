"""Where the shipped data is: inside the `planner` package, found through the package's own resources.

Everything a plan reads that is data, not code, ships inside the package (pyproject.toml
[tool.setuptools.package-data]): the topology presets (planner/data/topologies), the framework profiles
(planner/data/frameworks), the model presets (planner/models/presets) and the cost model's calibration
(planner/cost/calibration.yaml). They are located with `importlib.resources.files("planner")`, the same call in a
source checkout, an editable install and a wheel installed anywhere, never by a path relative to a repository
root. $PLANNER_TOPOLOGIES / $PLANNER_FRAMEWORKS still point a folder kind at the user's own files.

`provenance` says which data a run uses (for `planner --version`): the package folder, the folders the
environment overrides, and the git commit the data comes from: the one recorded in planner/data/build.json when
the wheel was built (setup.py writes it), else the commit of the source checkout the package is imported from.
Standard library only: `planner --version` and `planner models list` stay fast.
"""

from __future__ import annotations

import json
import os
import subprocess
from importlib import resources
from pathlib import Path

PACKAGE = "planner"
BUILD_INFO = ("data", "build.json")  # written into the wheel by setup.py (git commit of the tree it was built from)
ENV_OVERRIDES = {"topologies": "PLANNER_TOPOLOGIES", "frameworks": "PLANNER_FRAMEWORKS"}


def package_path(*parts: str) -> Path:
    """A file or folder inside the installed `planner` package (importlib.resources), as a filesystem path.

    pip installs packages unzipped, so the resource root is a real folder; a zipped install cannot serve the
    data as files and is refused with the fix."""
    root = resources.files(PACKAGE)
    if not isinstance(root, Path):
        raise RuntimeError(f"the {PACKAGE} package is not installed as files ({root!r}): install it with pip, unzipped")
    return root.joinpath(*parts)


def data_dir(kind: str) -> Path:
    """A folder of shipped data files: planner/data/<kind>, or the folder its environment variable names
    (ENV_OVERRIDES: $PLANNER_TOPOLOGIES, $PLANNER_FRAMEWORKS) when set."""
    override = os.environ.get(ENV_OVERRIDES.get(kind, ""), "")
    return Path(override).expanduser() if override else package_path("data", kind)


def git_commit(folder: Path) -> str | None:
    """The commit checked out at `folder` (with "+dirty" when tracked files differ from it), or None when the
    folder is not in a git work tree or git is absent."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if status else head or None


def build_info() -> dict:
    """What setup.py recorded when the wheel was built ({} in a source checkout or an unreadable record)."""
    try:
        return json.loads(package_path(*BUILD_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def provenance() -> dict[str, str]:
    """Where this run's data is and what it was built from: package folder, kind of install, git commit, the
    environment's overrides."""
    root = package_path()
    built = build_info()
    if built:
        origin, commit = "wheel", built.get("git_commit") or "unknown (built outside a git work tree)"
    else:
        origin, commit = "source tree", git_commit(root) or "unknown (not a git work tree)"
    found = {"package": str(root), "install": origin, "git_commit": commit}
    for kind, env_var in ENV_OVERRIDES.items():
        if os.environ.get(env_var):
            found[kind] = f"{data_dir(kind)} (${env_var})"
    return found


__all__ = ["BUILD_INFO", "ENV_OVERRIDES", "build_info", "data_dir", "git_commit", "package_path", "provenance"]
