"""The ranks of `planner run` die with it, however it ends (issue 24).

Why: torchrun's agent starts each rank in its own session (torch/distributed/elastic/multiprocessing/
subprocess_handler/subprocess_handler.py: `start_new_session=True`), so a signal to the launcher's process group
never reaches a rank, and a killed agent leaves its ranks running: after SIGKILL or SIGTERM of `planner run`, or its
own --timeout-s (which killed the agent only), ranks trained on for up to 22 minutes.

Three pieces, Linux's PR_SET_PDEATHSIG (prctl(2): a signal delivered when the parent exits; kept across execve):
- the launcher starts torchrun through `python -m planner.executor.lifetime LAUNCHER_PID -- ARGV...`, which sets
  SIGKILL as its parent-death signal, checks the launcher is still its parent (it may have died before prctl took
  effect), and execs torchrun in its own process group: the agent dies with the launcher;
- each rank sets the same at its entry point (`die_with_agent`, from planner.executor.runtime), and checks that
  its parent is still torchrun's agent: a rank dies with its agent;
- the launcher's own timeout, an exception or SIGTERM kills the agent's whole process group (`kill_group`).
Elsewhere (no prctl) the ranks fall back to torchrun's own handling. No torch import here.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

PR_SET_PDEATHSIG = 1
AGENT_WORDS = ("torch", "planner")  # torchrun, torch.distributed.run/launch, or a planner wrapper: not init or a shell
ELASTIC_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent for every rank it starts


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent exits; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def wrapped_argv(argv: list[str]) -> list[str]:
    """`argv` started through this module: it dies with the calling process (the launcher)."""
    return [sys.executable, "-m", "planner.executor.lifetime", str(os.getpid()), "--", *argv]


def _parent_command(ppid: int) -> str:
    try:
        return Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def die_with_agent() -> None:
    """At a rank's entry point under torchrun: die (SIGKILL) when the agent dies; exit at once if it already has
    (the rank was re-parented to init or a subreaper, whose command line names neither torch nor planner, before
    prctl took effect). No-op outside torchrun."""
    if ELASTIC_ENV not in os.environ:
        return
    ppid = os.getppid()
    if not set_parent_death_signal():
        return
    parent = _parent_command(os.getppid())
    if os.getppid() != ppid or ppid == 1 or (parent and not any(word in parent for word in AGENT_WORDS)):
        sys.stderr.write("rank: torchrun's agent is gone before this rank started: exiting\n")
        os._exit(1)


def exit_now(code: int) -> NoReturn:
    """End a rank with `code` once its results are written and its process groups destroyed, skipping the
    interpreter's finalization (std streams and logging are flushed first; every file we write is atomic already).

    Why: a rank that returns normally could die of SIGABRT after a run that succeeded. torch 2.13 keeps a gloo
    ProcessGroup alive after destroy_process_group once DDP or a DTensor used it (measured on CPU: its two
    pt_gloo_runloop threads survive destroy and gc.collect; a plain collective's group does not). A runloop thread
    drops each finished Work after the caller's wait() has returned; dropping the Work's tensors takes the GIL, and
    during finalization take_gil ends a foreign thread with pthread_exit, whose forced unwind through the Work's
    noexcept destructor calls std::terminate (core dump: ProcessGroupGloo::runLoop -> ~AsyncAllreduceWork ->
    TensorImpl::decref_pyobject -> PyThread_exit_thread -> std::terminate). Seen as 1 failing launch in about 10 of
    tests/integration/test_parallelize.py's two-rank workers, and in CI."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing left to save
            pass
    os._exit(code)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid` (the agent, started in its own group); its ranks, in sessions of
    their own, then die by their parent-death signal."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> None:
    """`python -m planner.executor.lifetime LAUNCHER_PID -- ARGV...`: die with the launcher, then exec ARGV."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        sys.stderr.write("usage: python -m planner.executor.lifetime LAUNCHER_PID -- COMMAND...\n")
        os._exit(2)
    set_parent_death_signal()
    if os.getppid() != int(argv[0]):  # the launcher died before prctl took effect
        os._exit(1)
    os.execv(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
