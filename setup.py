"""Build hook only (the project's metadata is pyproject.toml): the wheel records the git commit it was built from.

build_py writes planner/data/build.json into the build tree ({"git_commit": ..., "version": ...}), which
`planner --version` prints as the data's provenance (planner.resources.provenance). Outside a git work tree (an
sdist, a copy) the commit is $PLANNER_BUILD_COMMIT when set (the build of a copy names the commit it copied), else
null. The source tree never holds build.json: a checkout reports its own commit.
"""

import json
import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def git_commit() -> str | None:
    """HEAD of the tree being built, "+dirty" when tracked files differ from it; None without git."""
    try:
        run = [["git", "-C", str(ROOT), "rev-parse", "HEAD"], ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]]
        head, status = (subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip() for cmd in run)
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("PLANNER_BUILD_COMMIT") or None
    return f"{head}+dirty" if status else head or None


class BuildPyWithProvenance(build_py):
    """build_py, then planner/data/build.json beside the shipped data."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "planner" / "data" / "build.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"git_commit": git_commit(), "version": self.distribution.get_version()}) + "\n")


setup(cmdclass={"build_py": BuildPyWithProvenance})
