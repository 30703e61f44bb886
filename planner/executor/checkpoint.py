"""Checkpoints of an executor run: torch.distributed.checkpoint (DCP) with an all-or-nothing commit.

Layout: `<dir>/step-<NNNNNN>/` holds DCP's shards and metadata plus `planner-step.json`. Every rank writes
into `<dir>/.step-<NNNNNN>.tmp/`; after all ranks finished (barrier) rank 0 renames it to the final
name, so a folder named `step-*` is always complete, and a job that dies mid-save leaves only a `.tmp`
folder that resume ignores (and `planner run` removes).

Model and optimizer state come from `torch.distributed.checkpoint.state_dict` with
`flatten_optimizer_state_dict=True` (required with pipeline stages: each stage's optimizer keys are then
the parameters' FQNs, so the stages' dicts merge into one). FSDP2 and TP parameters are DTensors and
DCP stores each shard once. Tensors that differ between ranks but are plain tensors (EP-sharded experts,
Domino's hand-sharded TP weights) get their shard coordinate in the key (`experts@ep1of2`), or DCP would
keep one rank's copy. ZeRO-1's ZeroRedundancyOptimizer (and planner.executor.zero1 under TP) is not supported by DCP's state-dict helpers:
its local partition's state is saved per rank (`optim-rank<r>.pt`), so resuming needs the same layout.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from planner.errors import BadInputError
from planner.executor import manifest, reshard

if TYPE_CHECKING:  # torch is imported inside the collective functions: run.py uses the file helpers torch-free
    from torch import nn

STEP_FILE = manifest.STEP_FILE
VERIFIED_ENV = "PLANNER_CHECKPOINT_VERIFIED"  # set by `planner run` for its ranks once it verified the checksums
STEP_DIR = re.compile(r"^step-(\d{6,})$")
TP_SHARDED = re.compile(r"\.(attention\.w[qkvo]|feed_forward\.w[123])\.")
EXPERTS = ".moe.experts."


@dataclass(frozen=True, kw_only=True)
class ShardKeys:
    """Key renames for plain tensors that differ across ranks (see module docstring)."""

    ep_rank: int = 0
    ep: int = 1
    tp_rank: int = 0
    tp: int = 1
    manual_tp: bool = False

    def rename(self, key: str) -> str:
        if self.ep > 1 and EXPERTS in key:
            key = key.replace(EXPERTS, f".moe.experts@ep{self.ep_rank}of{self.ep}.")
        if self.manual_tp and self.tp > 1 and TP_SHARDED.search(key):
            key = TP_SHARDED.sub(lambda m: f".{m.group(1)}@tp{self.tp_rank}of{self.tp}.", key, count=1)
        return key

    def restore(self, key: str) -> str:
        return re.sub(r"@(ep|tp)\d+of\d+", "", key)


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def latest_step(root: str | Path) -> int | None:
    """The newest committed checkpoint's step under `root`, or None."""
    folder = Path(root)
    if not folder.is_dir():
        return None
    steps = [int(m.group(1)) for p in folder.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name)) and (p / STEP_FILE).is_file()]
    return max(steps) if steps else None


LAYOUT_FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "zero_stage", "tp_overlap")


def layout_of(plan) -> dict:
    """What a checkpoint's shards depend on: the parallel layout, the GPU count, the precision and the model, whose
    whole spec is kept (`model_spec`) so a resume under another model names the fields that differ (torch-free)."""
    par = plan.parallelism
    return {"gpus": plan.request.gpus, "model": plan.request.model.name, "schedule": plan.schedule,
            "precision": plan.request.precision, "model_spec": plan.request.model.model_dump(mode="json"),
            **{name: getattr(par, name) for name in LAYOUT_FIELDS}}


def _model_changes(before: dict, now: dict) -> list[str]:
    keys = sorted(set(before) | set(now))
    return [f"model.{key}={before.get(key)!r} -> {now.get(key)!r}" for key in keys if before.get(key) != now.get(key)]


def check_resume(root: str | Path, plan, *, verify_files: bool = True) -> int:
    """Before launch (torch-free): the newest committed checkpoint under `root` is whole (every file's size and sha256
    as its manifest says, planner.executor.manifest; `verify_files`), was written by this plan's model, and its layout
    is this plan's or one DCP reshards into it (planner.executor.reshard); returns its step. Damage, another model or
    a layout change that cannot reshard is bad input (exit 2), named file by file or field by field with the reason."""
    step = latest_step(root)
    if step is None:
        raise BadInputError(f"--resume: no committed checkpoint (step-NNNNNN/) under {root}: run without --resume first")
    folder = step_dir(root, step)
    saved = manifest.verify(folder) if verify_files else manifest.read_manifest(folder)
    now, before = layout_of(plan), saved.get("layout", {})
    if not isinstance(before, dict):
        raise BadInputError(f"--resume: {folder / STEP_FILE} has no layout: {manifest.FIX}")
    spec_changes = _model_changes(before.get("model_spec", {}), now["model_spec"]) if "model_spec" in before else []
    if spec_changes:
        raise BadInputError(f"--resume: {folder} was written with another model ({', '.join(spec_changes[:4])}"
                            f"{f' and {len(spec_changes) - 4} more' if len(spec_changes) > 4 else ''}): "
                            f"resume with the plan that wrote it, or start without --resume")
    refused = reshard.refusal(before, now)
    if refused is not None:
        raise BadInputError(f"--resume: {folder} was written with another layout ({refused}): resume with the plan that "
                            f"wrote it, or start without --resume")
    return step


def remove_partial(root: str | Path) -> list[str]:
    """Delete uncommitted `.step-*.tmp` folders (after a failed run); returns what was removed."""
    folder = Path(root)
    removed = []
    if folder.is_dir():
        for p in folder.iterdir():
            if p.is_dir() and p.name.startswith(".step-") and p.name.endswith(".tmp"):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(str(p))
    return removed


def _is_zero1(optimizer) -> bool:
    """Saved per rank (torch.save), not through DCP: ZeRO-1's partitions and the bf16 recipe's fp32 masters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from planner.executor.precision import MasterWeightOptimizer
    from planner.executor.zero1 import ShardedStateOptimizer

    parts = getattr(optimizer, "optimizers", [optimizer])
    return any(isinstance(o, (ZeroRedundancyOptimizer, ShardedStateOptimizer, MasterWeightOptimizer)) for o in parts)


def _local_optimizers(optimizer) -> list:
    """Per-rank optimizers whose state is saved locally (ZeRO-1's inner optimizer, experts' AdamW beside it, the
    bf16 recipe's master-weight optimizer with its masters)."""
    from planner.executor.precision import MasterWeightOptimizer

    parts = getattr(optimizer, "optimizers", [optimizer])
    return [o if isinstance(o, MasterWeightOptimizer) else getattr(o, "optim", o) for o in parts]


def _state(parts: list[nn.Module], optimizers: list, keys: ShardKeys, versions: bool = False) -> dict:
    """`versions`: parts are PipeDream-2BW's two weight versions of one stage; their keys get a `v<i>:` prefix and
    the optimizer state (shared by the two optimizers) is taken once, from version 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = {}, {}
    for index, (part, opt) in enumerate(zip(parts, optimizers)):
        prefix = f"v{index}:" if versions else ""
        model_sd.update({prefix + k: v for k, v in get_model_state_dict(part, options=options).items()})
        if not _is_zero1(opt) and not (versions and index > 0):
            optim_sd.update(get_optimizer_state_dict(part, opt, options=options))
    state = {"model": {keys.rename(k): v for k, v in model_sd.items()}}
    if optim_sd:
        state["optim"] = {keys.rename(k): v for k, v in optim_sd.items()}
    return state


def save(root: str | Path, step: int, parts: list[nn.Module], optimizers: list, *, keys: ShardKeys,
         fail_hook=None, layout: dict | None = None, versions: bool = False) -> Path:
    """Collective: every rank calls it. Writes `.step-N.tmp`, then rank 0 commits it as `step-N`."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    rank = dist.get_rank()
    final, tmp = step_dir(root, step), Path(root) / f".step-{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    try:
        dcp.save(_state(parts, optimizers, keys, versions), checkpoint_id=str(tmp))
        for index, opt in enumerate(optimizers):
            if _is_zero1(opt):
                local = [o.state_dict() for o in _local_optimizers(opt)]
                torch.save(local, tmp / f"optim-rank{rank}-part{index}.pt")
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        raise write_error(exc, tmp) from exc
    if fail_hook is not None:
        fail_hook()
    dist.barrier()
    if rank == 0:
        try:
            manifest.write_manifest(tmp, {"step": step, "world_size": dist.get_world_size(), "layout": layout or {}})
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except OSError as exc:
            raise write_error(exc, tmp) from exc
    dist.barrier()
    return final


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, file-size limit, permissions): names the folder and the cause."""


def write_error(exc: BaseException, folder: Path) -> BaseException:
    """A CheckpointWriteError naming `folder` and the OSError found in `exc` (DCP gathers each rank's exception into
    a CheckpointException's `failures`, or chains it), else `exc` itself."""
    seen, todo = set(), [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError):
            import errno

            name = errno.errorcode.get(item.errno or 0, "")
            hint = {"EFBIG": "raise the file-size limit (ulimit -f)", "ENOSPC": "free disk space",
                    "EDQUOT": "free quota"}.get(name, "check the folder's space and permissions")
            return CheckpointWriteError(f"cannot write checkpoint {folder}: {item.strerror or item} ({name or 'OSError'}): "
                                        f"{hint}, then run again")
        failures = getattr(item, "failures", None)  # DCP: {rank: (exception, traceback)}
        wrapped = [pair[0] if isinstance(pair, tuple) else pair for pair in (failures.values() if isinstance(failures, dict) else [])]
        todo += [item.__cause__, item.__context__, *wrapped]
        todo += [arg for arg in getattr(item, "args", ()) if isinstance(arg, BaseException)]
    return exc


def load(root: str | Path, parts: list[nn.Module], optimizers: list, *, keys: ShardKeys, versions: bool = False) -> int:
    """Collective: load the newest committed checkpoint into the (already parallelised) parts and
    optimizers; returns its step (another world size reshards: check_resume refused what cannot)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    step = latest_step(root)
    if step is None:
        raise BadInputError(f"--resume: no committed checkpoint (step-NNNNNN/) under {root}: run without --resume first")
    folder = step_dir(root, step)
    manifest.read_manifest(folder)  # another world size reshards (check_resume has refused what cannot)
    state = _state(parts, optimizers, keys, versions)
    dcp.load(state, checkpoint_id=str(folder))
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd = {keys.restore(k): v for k, v in state["model"].items()}
    optim_sd = {keys.restore(k): v for k, v in state.get("optim", {}).items()}
    for index, (part, opt) in enumerate(zip(parts, optimizers)):
        prefix = f"v{index}:" if versions else ""
        mine = {k[len(prefix):]: v for k, v in model_sd.items() if k.startswith(prefix)} if versions else model_sd
        set_model_state_dict(part, mine, options=StateDictOptions(strict=False))
        if versions and index > 0:
            continue  # 2BW: one optimizer state, loaded into version 0's optimizer (the caller shares it again)
        if _is_zero1(opt):
            local = torch.load(folder / f"optim-rank{dist.get_rank()}-part{index}.pt", weights_only=False)
            for inner, sd in zip(_local_optimizers(opt), local):
                inner.load_state_dict(sd)
        else:
            set_optimizer_state_dict(part, opt, optim_state_dict=optim_sd, options=options)
    return step
