"""Cluster topologies: shipped presets (YAML data under planner/data/topologies/), loading and scaling, rank placement,
and the bandwidth/latency a process group sees (planner.topology.placement, planner.topology.graph).

A topology reference is a preset name (`planner topology list`) or a path to a YAML/JSON file with the
Topology fields. Presets are package data (planner/data/topologies/, planner.resources), or the folder named by $PLANNER_TOPOLOGIES.
"""

import difflib
from pathlib import Path

from planner.errors import BadInputError
from planner.io import is_file, load_file, shipped_names, validate
from planner.resources import ENV_OVERRIDES, data_dir
from planner.schemas.topology import Topology

TOPOLOGIES_ENV = ENV_OVERRIDES["topologies"]
PRESET_SUFFIX = ".yaml"


def topologies_dir() -> Path:
    """The folder of shipped presets: $PLANNER_TOPOLOGIES if set, else planner/data/topologies in the package."""
    return data_dir("topologies")


def list_topologies() -> list[str]:
    """Names of the shipped presets, sorted."""
    return shipped_names(topologies_dir(), PRESET_SUFFIX)


def _unknown_topology_message(ref: str) -> str:
    names = list_topologies()
    close = difflib.get_close_matches(ref.lower(), names, n=3, cutoff=0.5)
    if Path(ref).stem in names:  # an old path, topologies/NAME.yaml: the presets are package data now
        close = [Path(ref).stem]
    hint = f"did you mean {', '.join(close)}? " if close else ""
    shown = ", ".join(names) if names else f"(none found in {topologies_dir()})"
    return (
        f"topology={ref!r} is neither a preset nor an existing file: {hint}"
        f"presets are {shown}; a path to a topology YAML/JSON file also works"
    )


def _resolve(ref: str) -> Topology:
    preset = topologies_dir() / f"{ref}{PRESET_SUFFIX}"
    if "/" not in ref and is_file(preset):
        return load_file(Topology, preset)
    path = Path(ref).expanduser()
    if is_file(path):
        return load_file(Topology, path)
    raise BadInputError(_unknown_topology_message(ref))


def nodes_for(topology: Topology, *, nodes: int | None = None, gpus: int | None = None) -> int:
    """How many nodes a job of `nodes` nodes or `gpus` GPUs uses on this topology (None, None: as written).

    `gpus` must fill whole nodes (a multiple of gpus_per_node) unless it fits in one node: a job never
    leaves a node partly used except when it is the only node.
    """
    gpn = topology.gpus_per_node
    if nodes is not None and nodes < 1:
        raise BadInputError(f"nodes={nodes} must be at least 1: pass --nodes 1 or more")
    if gpus is not None and gpus < 1:
        raise BadInputError(f"gpus={gpus} must be at least 1: pass --gpus 1 or more")
    if gpus is None:
        return nodes if nodes is not None else topology.num_nodes
    if nodes is not None:
        if gpus > nodes * gpn:
            raise BadInputError(
                f"gpus={gpus} is more than nodes={nodes} x gpus_per_node={gpn} = {nodes * gpn} of topology "
                f"{topology.name!r}: pass --nodes {-(-gpus // gpn)} or fewer --gpus"
            )
        return nodes
    if gpus <= gpn:
        return 1
    if gpus % gpn:
        lower, upper = gpus // gpn * gpn, -(-gpus // gpn) * gpn
        raise BadInputError(
            f"gpus={gpus} is not a multiple of gpus_per_node={gpn} of topology {topology.name!r}: "
            f"use --gpus {lower} or {upper} (whole nodes), or --nodes with fewer --gpus"
        )
    return gpus // gpn


def scale(topology: Topology, num_nodes: int) -> Topology:
    """The same cluster with `num_nodes` nodes, re-validated (a multi-node cluster needs NICs)."""
    if num_nodes == topology.num_nodes:
        return topology
    data = topology.model_dump()
    data["num_nodes"] = num_nodes
    return validate(Topology, data, source=f"topology {topology.name!r} with num_nodes={num_nodes}")


def load_topology(ref: str, *, nodes: int | None = None, gpus: int | None = None) -> Topology:
    """Load a preset or a file and scale it to `nodes` nodes, or to enough whole nodes for `gpus` GPUs."""
    topology = _resolve(ref)
    return scale(topology, nodes_for(topology, nodes=nodes, gpus=gpus))


__all__ = ["list_topologies", "load_topology", "nodes_for", "scale", "topologies_dir"]
