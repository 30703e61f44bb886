"""The options of an executor run, defined once: `planner run`/`planner launch` turn them into the
runtime's command line (`to_argv`), the runtime parses them back (`from_argv`). No torch here."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, fields

from planner.errors import BadInputError
MAX_RUN_TIMEOUT_S = 30 * 24 * 3600.0  # a month: far above any run `planner run` starts on one machine
MAX_LR = 10.0  # far above any AdamW rate (1e-5 .. 1e-2); a larger one is a typo (e.g. 3e4 for 3e-4)
MAX_SEED = 2**63 - 1

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What a run does besides the plan. Steps are numbered from 1; `steps` is the last one run."""

    steps: int = 10
    seed: int = 0
    lr: float = 3e-4
    data: str | None = None
    data_dtype: str = "uint16"
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    results_dir: str = "planner-run"
    device: str = "auto"
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise BadInputError(f"--steps {self.steps}: run at least 1 step")
        if self.checkpoint_every < 0:
            raise BadInputError(f"--checkpoint-every {self.checkpoint_every}: use 0 (never) or a positive step count")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise BadInputError("--checkpoint-every/--resume need --checkpoint-dir DIR")
        if self.device not in DEVICES:
            raise BadInputError(f"--device {self.device!r}: choose one of {list(DEVICES)}")
        if not (math.isfinite(self.timeout_s) and 0 < self.timeout_s <= MAX_RUN_TIMEOUT_S):
            raise BadInputError(f"--timeout-s {self.timeout_s}: give a positive number of seconds up to {MAX_RUN_TIMEOUT_S:.0f}")
        if not (math.isfinite(self.lr) and 0 < self.lr <= MAX_LR):
            raise BadInputError(f"--lr {self.lr}: give a positive, finite learning rate up to {MAX_LR:g}, e.g. 3e-4")
        if not 0 <= self.seed <= MAX_SEED:
            raise BadInputError(f"--seed {self.seed}: give a seed from 0 to 2**63 - 1 (torch and numpy take a 64-bit seed)")

    def to_argv(self) -> list[str]:
        """Flags for `python -m planner.executor.runtime PLAN ...` (defaults left out)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag)
            else:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> tuple[str, RunOptions]:
        """(plan path, options) from the runtime's command line."""
        parser = argparse.ArgumentParser(prog="python -m planner.executor.runtime", description="Run a LaunchPlan (started by torchrun).")
        parser.add_argument("plan")
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action="store_true")
            else:
                kind = {"int": int, "float": float}.get(str(f.type), str)
                parser.add_argument(flag, type=kind, default=f.default)
        ns = vars(parser.parse_args(argv))
        plan = ns.pop("plan")
        return plan, cls(**ns)

    def replace(self, **changes) -> RunOptions:
        return dataclasses.replace(self, **changes)
