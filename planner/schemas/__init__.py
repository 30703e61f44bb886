"""Strict, versioned pydantic schemas for every file format: model spec, topology, profile, launch plan."""

from planner.schemas.model import MLASpec, ModelSpec, MoESpec
from planner.schemas.plan import LaunchPlan, Parallelism, PlanRequest
from planner.schemas.topology import DeviceSpec, Topology

__all__ = ["DeviceSpec", "LaunchPlan", "MLASpec", "ModelSpec", "MoESpec", "Parallelism", "PlanRequest", "Topology"]
