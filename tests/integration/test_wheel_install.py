"""The package as a user installs it: a wheel built from the repository, installed into a fresh venv, run from an
empty folder with a clean environment, finds its own data (planner.resources) and plans, lists and exports.

The venv sees the system site-packages only for the dependencies (pydantic, typer, ...: no network needed); the
test checks that `planner` itself is imported from the venv's wheel, not from an editable install or the source
tree. The wheel is built from a copy of the tracked and unignored files (what a clean clone holds), so a stale
build/ folder cannot leak into it and the repository is left as it was.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.resources import git_commit

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", "runs", ".whl"}


def source_copy(target: Path) -> Path:
    """The repository's tracked and unignored files (git), or its tree less build outputs when git is absent."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        for name in listed.stdout.decode().split("\0"):
            source = ROOT / name
            if name and source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
    else:
        shutil.copytree(ROOT, target, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if n in SKIPPED or n.endswith(".egg-info")])
    return target


def build_isolation_flags() -> list[str]:
    """--no-build-isolation when this environment's setuptools satisfies pyproject's build requirement (fast,
    offline); otherwise pip fetches setuptools into an isolated build environment."""
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return []
    return ["--no-build-isolation"] if major >= 68 else []


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, empty working folder, clean environment) with the freshly built wheel installed."""
    base = tmp_path_factory.mktemp("wheel")
    commit = git_commit(ROOT) or ""
    build_env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "PLANNER_BUILD_COMMIT": commit,
                 "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    source = source_copy(base / "src")
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(base / "dist"),
         *build_isolation_flags()], cwd=base, env=build_env)
    wheels = list((base / "dist").glob("llm_planner-*.whl"))
    assert len(wheels) == 1, wheels
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(base / "venv")], cwd=base, env=build_env)
    venv_python = base / "venv" / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(venv_python), "install", "-q", "--no-deps", "--no-index",
         "--force-reinstall", str(wheels[0])], cwd=base, env=build_env)
    work = base / "work"
    work.mkdir()
    env = {"PATH": f"{base / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(work), "COLUMNS": "120"}
    return base / "venv" / "bin", work, env, commit


def test_the_wheel_carries_its_data_and_runs_without_the_source_tree(installed):
    bin_dir, work, env, commit = installed
    where = run([str(bin_dir / "python"), "-c", "import planner, planner.resources as r; "
                 "print(planner.__file__); print(r.data_dir('topologies'))"], work, env).split()
    assert all(Path(p).is_relative_to(bin_dir.parent) for p in where), f"planner imported from outside the venv: {where}"
    version = run([str(bin_dir / "planner"), "--version"], work, env)
    assert "install: wheel" in version and f"package: {Path(where[0]).parent}" in version
    if commit:
        assert f"git commit: {commit}" in version
    topologies = run([str(bin_dir / "planner"), "topology", "list", "--json"], work, env)
    assert {"dgx-h100", "cpu"} <= {row["name"] for row in json.loads(topologies)}
    frameworks = run([str(bin_dir / "planner"), "framework", "list"], work, env)
    assert "megatron-core" in frameworks and "torchtitan" in frameworks
    run([str(bin_dir / "planner"), "plan", "--model", "llama3-8b", "--gpus", "8", "--framework", "megatron-core",
         "-o", "plan.json"], work, env)
    assert json.loads((work / "plan.json").read_text())["request"]["framework"] == "megatron-core"
    run([str(bin_dir / "planner"), "export", "plan.json", "--to", "megatron", "-o", "args.sh"], work, env)
    assert "--tensor-model-parallel-size" in (work / "args.sh").read_text()
    logs = [str(ROOT / "tests" / "data" / "runlogs" / f"megatron-{name}.log") for name in ("tp2", "tp4-pp2", "dp16")]
    calibrated = run([str(bin_dir / "planner"), "calibrate", *logs, "--topology", "dgx-h100", "-o", "cluster.yaml"], work, env)
    assert "leave-one-run-out error: median" in calibrated
    run([str(bin_dir / "planner"), "plan", "--model", "llama3-8b", "--gpus", "16", "--framework", "megatron-core",
         "--calibration", "cluster.yaml", "-o", "calibrated.json"], work, env)
    assert "calibration" in json.loads((work / "calibrated.json").read_text())["request"]
    assert not (work / "topologies").exists() and not (work / "planner").exists()
