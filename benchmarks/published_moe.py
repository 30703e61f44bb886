"""How a published MoE run dispatched its tokens and what hid the dispatch (benchmarks/published_runs.py, rules
`moe_settings_stated` and `megatron_core_version_features`): the CostOptions a run's MoE layers are priced with.

- moe_settings_stated: a run whose text states its token dispatcher (Megatron-Core `--moe-token-dispatcher-type
  alltoall|flex|allgather` or `moe_token_dispatcher_type`, DeepEP = flex) or its overlap
  (`--overlap-moe-expert-parallel-comm` / `overlap_moe_expert_parallel_comm` / NeMo's `moe_a2a_overlap` = batch,
  `--moe-shared-expert-overlap` = shared; negated before, or set false/off/0 after, as in a recipe's
  `moe_a2a_overlap = False`: off) is priced with that one, as planner.cost.pins prices a
  user's statement; unsaid, the planner's choice among what the stack runs (the conversion's rule for unsaid
  settings).
- megatron_core_version_features: a Megatron-Core run cannot have run a feature its release did not have. Each
  feature's first release (the first core_v tag of NVIDIA/Megatron-LM whose code holds its field):
  `moe_shared_expert_overlap` core_v0.10.0 (2025-02-17, transformer_config.py), `moe_enable_deepep` core_v0.12.0
  (2025-05-06), `overlap_moe_expert_parallel_comm` core_v0.14.0 (2025-10-08, model_parallel_config.py). A stated
  version ("Megatron-Core r0.8.0", "core_v0.12", "mcore 0.13") older than the feature's release, else a source
  from a year before it, leaves the feature out; a source of the release year keeps it (the year does not say).
"""

from __future__ import annotations

import dataclasses
import re

from planner.cost.moe_comm import OVERLAPPED_DISPATCHERS, SHARED_OVERLAP_DISPATCHERS
from planner.cost.pins import dispatchers_run
from planner.cost.types import CostOptions

FEATURE_SINCE = {"shared": ((0, 10), 2025), "flex": ((0, 12), 2025), "batch": ((0, 14), 2025)}
CORE_VERSION = re.compile(r"(?:megatron[- ]core|mcore|core_[rv]|megatron-lm core)\s*[rv]?(\d+)\.(\d+)")
DISPATCHER = re.compile(r"(?:--moe-token-dispatcher-type|moe_token_dispatcher_type)\W+(alltoall|flex|allgather)")
NEGATION = r"\b(?:no|not|without|disabled?)\b[\w\s-]{0,25}?"
SET_OFF = r"\s*(?:[:=]\s*|\s)\s*(?:false|off|disabled|0)\b"  # "moe_a2a_overlap false", "--flag=False", "flag: off"
STATED_OVERLAP = {
    "batch": re.compile(r"overlap[-_]moe[-_]expert[-_]parallel[-_]comm|moe_a2a_overlap|ep a2a overlap"),
    "shared": re.compile(r"moe[-_]shared[-_]expert[-_]overlap|shared[- ]expert overlap"),
}


def run_text(run: dict) -> str:
    """The run's training and parallel texts and notes, lower case: where a source names flags."""
    parts = [str(v) for v in (run.get("training") or {}).values()] + [str(v) for v in (run.get("parallel") or {}).values()]
    return " ".join(parts + [run.get("notes") or ""]).lower()


def core_version(text: str) -> tuple[int, int] | None:
    """The Megatron-Core release a text names, (major, minor); None where it names none."""
    found = CORE_VERSION.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def stated(text: str) -> tuple[str | None, dict[str, bool]]:
    """(dispatcher, {overlap: on/off}) a text states; DeepEP named (not negated) is the flex dispatcher."""
    found = DISPATCHER.search(text)
    dispatcher = found.group(1) if found else None
    if dispatcher is None and "deepep" in text and not re.search(NEGATION + "deepep", text):
        dispatcher = "flex"
    overlaps = {}
    for name, pattern in STATED_OVERLAP.items():
        if pattern.search(text):
            overlaps[name] = not re.search(NEGATION + f"(?:{pattern.pattern})|(?:{pattern.pattern}){SET_OFF}", text)
    return dispatcher, overlaps


def moe_options(options: CostOptions, run: dict, *, stack: str, year: int | None,
                off: tuple[str, ...] = ()) -> CostOptions:
    """`options` (the run's stack's) with the MoE dispatchers and overlaps the run could and did run: its release's
    (megatron_core_version_features), then what its text states (moe_settings_stated), within what the stack's
    profile runs at all."""
    text = run_text(run)
    runs = {"batch": options.moe_overlap, "shared": options.moe_shared_overlap}
    dispatchers, overlaps = list(dispatchers_run(options)), dict(runs)
    if stack == "megatron-core" and "megatron_core_version_features" not in off:
        version = core_version(text)
        for feature, (since, since_year) in FEATURE_SINCE.items():
            if version < since if version is not None else (year is not None and year < since_year):
                dispatchers = [d for d in dispatchers if d != feature]  # flex
                overlaps.update({feature: False} if feature in overlaps else {})  # batch, shared
    if "moe_settings_stated" not in off:
        dispatcher, said = stated(text)
        if dispatcher is not None:
            dispatchers = [dispatcher] if dispatcher in dispatchers_run(options) else dispatchers
        for name, on in said.items():
            overlaps[name] = runs[name] and on
            if on:  # one overlap runs at a time (transformer_config.py), each with its own dispatchers
                overlaps["shared" if name == "batch" else "batch"] = False
                keep = OVERLAPPED_DISPATCHERS if name == "batch" else SHARED_OVERLAP_DISPATCHERS
                dispatchers = [d for d in dispatchers if d in keep] or dispatchers
    return dataclasses.replace(options, moe_dispatchers=tuple(dispatchers), moe_overlap=bool(overlaps["batch"]),
                               moe_shared_overlap=bool(overlaps["shared"]))
