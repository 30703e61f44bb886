"""`planner calibrate`: a calibration overlay for the user's cluster and stack from runs they measured.

Inputs (any mix of files, one cluster and one stack): Megatron-LM logs (their arguments block gives the
configuration), torchtitan logs with the TOML config each ran (--config, in the order of the logs), or a JSON file
of MeasuredRun records (planner.schemas.runs). planner.calibrate.logs reads them, planner.calibrate.fit derives the
overlay (planner.schemas.calibration) the way benchmarks/accuracy.py --derive derives calibration.yaml. Sits above
the cost model, beside planner.estimate; the CLI reaches it through planner.api.calibrate.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

from planner.calibrate.fit import overlay_of, priced_case
from planner.calibrate.logs import ANSI, MEGATRON_ITERATION, TITAN_STEP, read_megatron, read_torchtitan
from planner.errors import BadInputError
from planner.io import load_structured, read_text_checked, validate
from planner.models import load_model
from planner.schemas.calibration import CalibrationOverlay
from planner.schemas.runs import MAX_RUNS, MeasuredRun, MeasuredRuns
from planner.topology import load_topology

MAX_INPUT_BYTES = 256 << 20


def measured_runs(paths: list[str], *, configs: list[str] = (), model=None, framework: str | None = None,
                  gpus: int | None = None) -> tuple[list[MeasuredRun], str | None]:
    """(runs, the topology a JSON input names) from the input files, in order."""
    runs, topology, titan_configs = [], None, list(configs)
    for name in paths:
        path = Path(name)
        if path.suffix == ".json":
            data = load_structured(path)
            batch = validate(MeasuredRuns, data if isinstance(data, dict) and "runs" in data else {"runs": [data]}, source=name)
            runs += batch.runs
            topology = topology or batch.topology
            continue
        text = ANSI.sub("", read_text_checked(path, max_bytes=MAX_INPUT_BYTES))
        if not text.strip():
            raise BadInputError(f"{name} is empty: pass the training log of a run (Megatron-LM or torchtitan) or a runs JSON")
        if any(TITAN_STEP.search(line) for line in text.splitlines()):
            if not titan_configs:
                raise BadInputError(f"{name} is a torchtitan log: pass the TOML config it ran with, --config FILE (one per torchtitan log, in order)")
            raw = read_torchtitan(path, Path(titan_configs.pop(0)), model=model, gpus=gpus, framework=framework)
        elif "arguments ----" in text or any(MEGATRON_ITERATION.search(line) for line in text.splitlines()):
            raw = read_megatron(path, model=model, framework=framework)
        else:
            raise BadInputError(f"{name}: neither a Megatron-LM log ('iteration N/ M | ... elapsed time per iteration (ms)') "
                                "nor a torchtitan log ('step: N  loss: ...  tps: T'): pass a training log or a runs JSON")
        runs.append(validate(MeasuredRun, raw, source=name))
    if not runs:
        raise BadInputError("no runs given: pass Megatron-LM or torchtitan logs, or a JSON of measured runs")
    if len(runs) > MAX_RUNS:
        raise BadInputError(f"{len(runs)} runs given, over the limit of {MAX_RUNS}: pass the runs of one cluster and stack, "
                            "a few configurations each")
    return runs, topology


def calibrate(paths: list[str], *, topology: str | None = None, configs: list[str] = (), model: str | None = None,
              framework: str | None = None, gpus: int | None = None) -> CalibrationOverlay:
    """The overlay derived from the runs in `paths` on the cluster `topology` (a preset name or file)."""
    runs, named = measured_runs(paths, configs=configs, model=model, framework=framework, gpus=gpus)
    cluster = topology or named
    if cluster is None:
        raise BadInputError("which cluster ran these? pass --topology (a preset such as dgx-h100, or a topology file)")
    cases = []
    for run in runs:
        spec = run.model if not isinstance(run.model, str) else load_model(run.model)
        cases.append(priced_case(run, spec, load_topology(cluster, gpus=run.gpus)))
    from planner import __version__
    from planner.resources import provenance as data_provenance

    provenance = {"created_by": f"planner calibrate {__version__}", "topology": cluster,
                  "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "planner_git_commit": data_provenance()["git_commit"],
                  "inputs": [f"{p} sha256:{hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16]}" for p in [*paths, *configs]]}
    return overlay_of(cases, provenance)


__all__ = ["calibrate", "measured_runs"]
