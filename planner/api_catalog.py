"""The façade's catalog: what ships with the package (model presets, topologies, framework profiles) and how a name
or file is read into a spec, with the rows and reports `planner models` and `planner topology` print.

Split from planner/api.py, which imports these and offers them as `api.<name>`; the CLI and the service reach them
only there. Like api.py, the heavy modules (pydantic schemas, the HuggingFace importers) load inside the functions,
so `planner models list` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.schemas.model import ModelSpec
    from planner.schemas.topology import Topology


def load_model(ref: str) -> ModelSpec:
    """A preset name, a HuggingFace config.json, or our own YAML/JSON model spec."""
    from planner.models import load_model as _load

    return _load(ref)


def load_topology(ref: str, *, nodes: int | None = None, gpus: int | None = None) -> Topology:
    """A preset name or a topology file, scaled to `nodes` nodes (or enough nodes for `gpus` GPUs)."""
    from planner.topology import load_topology as _load

    return _load(ref, nodes=nodes, gpus=gpus)


def load_framework(ref: str):
    """A framework profile (planner.schemas.framework.FrameworkProfile) by shipped name or file."""
    from planner.frameworks import load_framework as _load

    return _load(ref)


def list_frameworks() -> list[str]:
    from planner.frameworks import list_frameworks as _list

    return _list()


def list_presets() -> list[str]:
    """The shipped model preset names (planner.models.list_presets)."""
    from planner.models import list_presets as _list

    return _list()


def model_types() -> list[str]:
    """The HuggingFace `model_type`s whose config.json the importers read (planner.models.hf)."""
    from planner.models.hf import supported_model_types

    return supported_model_types()


def model_rows() -> list[dict]:
    """One row per shipped preset: parameters, layers, hidden, heads, experts (planner.models.preset_index)."""
    from planner.models.preset_index import preset_rows

    return preset_rows()


def model_report(ref: str) -> dict:
    """The resolved model spec of `ref` and where its parameters are (planner.models.summary.model_report)."""
    from planner.models.summary import model_report as _report

    return _report(load_model(ref))


def list_topologies() -> list[str]:
    """The shipped topology preset names (planner.topology.list_topologies)."""
    from planner.topology import list_topologies as _list

    return _list()


def topology_rows() -> list[dict]:
    """One row per shipped topology preset: device, memory, peak, fabrics (planner.topology.summary.topology_row)."""
    from planner.topology.summary import topology_row

    return [topology_row(load_topology(name)) for name in list_topologies()]


def topology_report(ref: str, *, nodes: int | None = None) -> dict:
    """A topology and the bandwidth its TP/DP groups see (planner.topology.summary.topology_report)."""
    from planner.topology.summary import topology_report as _report

    return _report(load_topology(ref, nodes=nodes))
