"""Cluster topology: one device type, nodes of identical GPUs, an intra-node fabric and an inter-node fabric.

Bandwidths are *achieved* per-GPU, per-direction bus bandwidths in GB/s (1e9 B/s) where a measurement is
known (nccl-tests busbw, vendor application notes), with the source in `source`; latencies in seconds.
A node is the domain of the intra-node fabric (for GB200 NVL72: the 72-GPU NVLink domain).
"""

from typing import Literal

from pydantic import Field, model_validator

from planner.schemas import limits as L
from planner.schemas.base import InputSchema, Schema

TOPOLOGY_SCHEMA_VERSION = "1"


class DeviceSpec(InputSchema):
    """One accelerator type. Peak rates are dense (no sparsity)."""

    name: str
    memory_bytes: int = Field(gt=0)
    peak_bf16_tflops: float = Field(gt=0)
    peak_fp16_tflops: float | None = Field(default=None, gt=0, description="None = peak_bf16_tflops")
    peak_fp8_tflops: float | None = Field(default=None, gt=0, description="None = no fp8 tensor cores")
    peak_fp32_tflops: float = Field(gt=0, description="non-tensor-core fp32 (or tf32 where frameworks use it)")
    hbm_bandwidth_GBps: float = Field(gt=0)
    reserved_memory_bytes: int = Field(default=0, ge=0, description="taken by the CUDA context/driver, unusable by tensors")


class CollectiveRate(InputSchema):
    """Measured alpha-beta rates of one collective inside a node (planner.profiling.calibration)."""

    bandwidth_GBps: float = Field(gt=0, description="fitted bus bandwidth (nccl-tests convention)")
    latency_s: float = Field(ge=0, le=L.MAX_LATENCY_S, description="fitted fixed time per ring step")


class IntraNodeFabric(InputSchema):
    kind: Literal["nvswitch", "nvlink_mesh", "pcie", "infinity_fabric", "loopback"]
    bandwidth_GBps: float = Field(gt=0, description="achieved per-GPU per-direction bus bandwidth inside a node")
    latency_s: float = Field(ge=0, le=L.MAX_LATENCY_S)
    collectives: dict[Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"], CollectiveRate] = Field(
        default_factory=dict,
        description="measured per-collective rates (`planner profile comm`; a topology's comm_calibration fills them); "
                    "a collective not listed uses bandwidth_GBps and latency_s")


class InterNodeFabric(InputSchema):
    kind: Literal["infiniband", "roce", "efa", "ethernet", "omnipath", "none"]
    nics_per_node: int = Field(ge=0, le=L.MAX_GPUS_PER_NODE)
    nic_bandwidth_GBps: float = Field(ge=0, description="achieved per-NIC per-direction bandwidth")
    latency_s: float = Field(ge=0, le=L.MAX_LATENCY_S)
    topology: Literal["fat_tree", "rail_optimized", "none"] = "fat_tree"
    oversubscription: float = Field(default=1.0, ge=1.0, description="core-to-edge oversubscription ratio; 1 = non-blocking")


class Topology(InputSchema):
    """A cluster of `num_nodes` identical nodes with `gpus_per_node` devices each."""

    schema_version: Literal["1"] = TOPOLOGY_SCHEMA_VERSION
    name: str
    description: str = ""
    source: str = Field(default="", description="where the bandwidth/latency numbers come from")
    device: DeviceSpec
    gpus_per_node: int = Field(gt=0, le=L.MAX_GPUS_PER_NODE)
    num_nodes: int = Field(gt=0, le=L.MAX_NODES)
    intra_node: IntraNodeFabric
    inter_node: InterNodeFabric
    comm_calibration: str | None = Field(default=None, description="path of a `planner profile comm` calibration file")
    compute_slots_per_node: int | None = Field(
        default=None, gt=0,
        description="ranks a node can compute at once (CPU cores when ranks are processes sharing a CPU); "
                    "None = every rank has its own device (GPUs). Fewer slots than ranks on a node bound the step "
                    "time below by the node's total compute / slots (planner.cost.contention)")

    @model_validator(mode="after")
    def _check(self) -> "Topology":
        if self.num_nodes > 1 and (self.inter_node.nics_per_node == 0 or self.inter_node.nic_bandwidth_GBps == 0):
            raise ValueError(
                f"topology {self.name!r} has num_nodes={self.num_nodes} but no inter-node NICs: set inter_node.nics_per_node and nic_bandwidth_GBps"
            )
        return self

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes
