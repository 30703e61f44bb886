"""Shipped data is found through planner.resources (importlib.resources), never by a path next to a repository root.

The installed-wheel behaviour itself is tests/integration/test_wheel_install.py; these are the fast checks that keep
the package honest in a checkout: the data folders are inside the package and listed for the wheel, the loaders
resolve there, no module locates files by its own __file__ (the one exception puts the package's own code on a
worker's PYTHONPATH), and `planner --version` says where the data came from.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from typer.testing import CliRunner

import planner
from planner.cli import app
from planner.frameworks import frameworks_dir, list_frameworks
from planner.models import PRESET_DIR
from planner.resources import data_dir, package_path, provenance
from planner.topology import list_topologies, topologies_dir

ROOT = Path(__file__).resolve().parents[2]
CODE_LOCATION_ONLY = {"planner/service/pool.py"}  # puts this package's code first on a worker's PYTHONPATH


def test_the_data_lives_inside_the_package(monkeypatch):
    for variable in ("PLANNER_TOPOLOGIES", "PLANNER_FRAMEWORKS"):
        monkeypatch.delenv(variable, raising=False)
    package = Path(planner.__file__).resolve().parent
    assert package_path() == package
    assert topologies_dir() == data_dir("topologies") == package / "data" / "topologies"
    assert frameworks_dir() == package / "data" / "frameworks" and PRESET_DIR == package / "models" / "presets"
    assert {"dgx-h100", "cpu"} <= set(list_topologies()) and {"megatron-core", "torchtitan", "planner"} <= set(list_frameworks())
    assert not (ROOT / "topologies").exists() and not (ROOT / "frameworks").exists()


def test_every_shipped_data_file_is_listed_for_the_wheel():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["planner"]
    package = Path(planner.__file__).resolve().parent
    data = [p for p in package.rglob("*") if p.is_file() and p.suffix in (".yaml", ".json") and "__pycache__" not in p.parts]
    unlisted = [str(p.relative_to(package)) for p in data if not any(p.relative_to(package).match(g) for g in patterns)]
    assert data and not unlisted, f"data files the wheel would leave out: {unlisted}"


def test_no_module_locates_files_by_its_own_path():
    found = []
    for path in sorted((ROOT / "planner").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name not in CODE_LOCATION_ONLY and re.search(r"__file__|parents\[", path.read_text()):
            found.append(name)
    assert not found, f"use planner.resources.package_path/data_dir instead: {found}"


def test_version_names_the_data_and_its_commit(monkeypatch, tmp_path):
    monkeypatch.setenv("PLANNER_TOPOLOGIES", str(tmp_path))
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith(f"planner {planner.__version__}\n")
    assert f"package: {package_path()}" in result.output and "git commit: " in result.output
    assert f"topologies: {tmp_path} ($PLANNER_TOPOLOGIES)" in result.output
    assert provenance()["install"] == "source tree"


def test_an_old_top_level_path_points_at_the_preset():
    runner = CliRunner()
    topo = runner.invoke(app, ["plan", "--topology", "topologies/dgx-h100.yaml"])
    assert topo.exit_code == 2 and "did you mean dgx-h100?" in topo.output
    stack = runner.invoke(app, ["plan", "--framework", "frameworks/megatron-core.yaml"])
    assert stack.exit_code == 2 and "did you mean megatron-core?" in stack.output
