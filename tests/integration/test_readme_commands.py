"""Every command the README prints runs as printed, in order, and the plans they write pass the follow-ups shown.

The ```bash blocks of README.md are split into commands (backslash continuations joined, trailing `# ...` comments
dropped) and run with the installed `planner` script in a scratch folder that sees the repository's `profiles/`
and `examples/` (the README's relative paths). The install steps of the quick start (`pip install ... &&`) are
the CI's own set-up and are not repeated; the test command (`python -m pytest`) is this suite itself.
`planner serve` runs until stopped: it must answer /healthz on its printed port, then it is terminated.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANNER = shutil.which("planner")


def readme_commands(text: str) -> list[str]:
    """Commands of the ```bash blocks, continuations joined, comments and install prefixes removed."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", command).strip()
            if not command or command.startswith("#"):
                continue
            parts = [p.strip() for p in command.split("&&")]
            kept = [p for p in parts if not p.startswith("pip install")]
            commands += [p for p in kept if not p.startswith("python -m pytest")]
    return commands


def test_readme_commands_are_extracted():
    commands = readme_commands((ROOT / "README.md").read_text())
    assert commands[0] == "planner plan"
    assert any(c.startswith("planner run small.json") for c in commands)
    assert not any("..." in c for c in commands), "a README command must be runnable as printed"


def _serve(command: str, cwd: Path, env: dict) -> None:
    """Start `planner serve`, wait for /healthz on its port, stop it."""
    import httpx

    port = int(shlex.split(command)[shlex.split(command).index("--port") + 1])
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            pytest.skip(f"port {port} is taken on this machine: cannot run `{command}` as printed")
    proc = subprocess.Popen(shlex.split(command), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
            if proc.poll() is not None:
                raise AssertionError(f"`{command}` exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")
        raise AssertionError(f"`{command}` did not answer /healthz on port {port} within 60 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(PLANNER is None, reason="the `planner` script is not installed (pip install -e .)")
def test_every_readme_command_runs_as_printed(tmp_path):
    for folder in ("profiles", "examples"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in readme_commands((ROOT / "README.md").read_text()):
        if command.startswith("planner serve"):
            _serve(command, tmp_path, env)
            continue
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"`{command}` exited {result.returncode}:\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
        assert "Traceback" not in result.stderr, f"`{command}` printed a traceback:\n{result.stderr[-1500:]}"
    assert (tmp_path / "plan-megatron.json").is_file() and (tmp_path / "args.sh").is_file()
    assert (tmp_path / "run.json").is_file() and (tmp_path / "plan.png").stat().st_size > 0
