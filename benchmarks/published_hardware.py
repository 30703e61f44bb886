"""What a published run ran on (benchmarks/published_runs.py, its rules `cluster` and `GPU variants`): the
calibration family of its GPU, the shipped node preset scaled to its GPUs with the stated NICs and line rate, and
the preset's device with the source's stated memory and bf16 peak, or why a variant cannot be expressed.
"""

from __future__ import annotations

import math
import re

from planner.schemas.topology import Topology
from planner.topology import load_topology

ACHIEVED_NIC_FRACTION = 23.0 / 25.0  # dgx-a100-80g preset: 23 GB/s achieved of HDR 25 GB/s line rate


def device_family(run: dict) -> str:
    """The calibration family (planner/cost/calibration.yaml `match`) of the run's GPU."""
    gpu = run["hardware"]["gpu_model"]
    for family, pattern in (("hopper", r"H100|H800|H200"), ("ampere", r"A100|A800"), ("blackwell", r"B200|B100"),
                            ("cdna3", r"MI300|MI325")):
        if re.search(pattern, gpu):
            return family
    return "other"


# The shipped node preset of a GPU, first match of the (lower-case) gpu_model text; None: no preset describes it.
# H20: the Hopper die in an H100 node, at its own stated memory and peak (device_of), refused without them.
TOPOLOGY_RULES = (("gb200", "gb200-nvl72"), ("b200", "dgx-b200"), ("h200", "hgx-h200"), ("h800", "hgx-h800"),
                  ("h100", "dgx-h100"), ("h20", "dgx-h100"), ("a100", "dgx-a100-80g"), ("a800", "dgx-a100-80g"),
                  ("mi300", "mi300x-8"), ("v100", "dgx2-v100"))


# AWS instances reach other nodes over EFA (the instance pages: p4d 4 x 100 Gb/s, p5 32 x 100 Gb/s), not the DGX's
# InfiniBand: a run whose interconnect text names EFA runs on the AWS preset of its GPU.
EFA_PRESETS = {"dgx-a100-40g": "aws-p4d", "dgx-a100-80g": "aws-p4d", "dgx-h100": "aws-p5"}


def topology_preset(run: dict) -> str | None:
    hw = run["hardware"]
    gpu = hw["gpu_model"].lower()
    preset = next((p for key, p in TOPOLOGY_RULES if re.search(rf"\b{key}\b", gpu) or key in gpu and key != "h20"), None)
    if re.search(r"\befa\b|elastic fabric", (hw.get("inter_node") or "").lower()) and preset in EFA_PRESETS:
        return EFA_PRESETS[preset]
    if preset == "dgx-a100-80g" and (hw.get("gpu_memory_gib") == 40 or "40gb" in gpu.replace(" ", "")):
        preset = "dgx-a100-40g"
    return preset


PRESET_BOARD_POWER_W = {"dgx-h100": 700, "hgx-h800": 700, "hgx-h200": 700, "dgx-a100-80g": 400, "dgx-a100-40g": 400}


def stated_power_w(run: dict) -> int | None:
    found = re.search(r"(\d{3,4})\s*w\b", run["hardware"]["gpu_model"].lower())
    return int(found.group(1)) if found else None


def variant_refusal(run: dict) -> str | None:
    """Why a GPU variant cannot be expressed: a power cap below the preset's board power, or an H20, without a
    stated peak (None: expressible)."""
    hw, preset = run["hardware"], topology_preset(run)
    if hw.get("peak_tflops_bf16_fp16_dense"):
        return None
    power = stated_power_w(run)
    if power and power < PRESET_BOARD_POWER_W.get(preset, 0):
        return f"GPU at {power} W (below the {PRESET_BOARD_POWER_W[preset]} W part): no source states its peak"
    if re.search(r"\bh20\b", hw["gpu_model"].lower()):
        return "H20: its peak differs from every preset's and the source states none"
    return None


def device_of(run: dict):
    """The preset's device with the run's stated memory and bf16 peak where they differ (device_of rule)."""
    hw = run["hardware"]
    device = load_topology(topology_preset(run)).device
    update = {}
    gib = hw.get("gpu_memory_gib")
    if gib and abs(gib * 2**30 - device.memory_bytes) > 2 * 2**30:
        update["memory_bytes"] = int(gib * 2**30)
    peak = hw.get("peak_tflops_bf16_fp16_dense")
    if peak and abs(peak / device.peak_bf16_tflops - 1) > 0.02:
        ratio = peak / device.peak_bf16_tflops
        update.update(peak_bf16_tflops=float(peak), peak_fp16_tflops=float(peak),
                      peak_fp8_tflops=float(hw.get("peak_tflops_fp8_dense") or (device.peak_fp8_tflops or 0) * ratio) or None)
    if update:
        update["name"] = f"{device.name} as {hw['gpu_model']}"[:80]
    return device.model_copy(update=update) if update else device


def topology(run: dict) -> Topology:
    hw = run["hardware"]
    gpus = run["parallel"]["num_gpus"]
    preset = load_topology(topology_preset(run))
    per_node = hw.get("gpus_per_node") or preset.gpus_per_node
    topo = load_topology(topology_preset(run), nodes=max(1, math.ceil(gpus / per_node)))
    topo = topo.model_copy(update={"device": device_of(run), "gpus_per_node": per_node})
    inter = topo.inter_node.model_dump()
    if hw.get("inter_node_nics_per_node"):
        inter["nics_per_node"] = hw["inter_node_nics_per_node"]
    elif per_node != preset.gpus_per_node:  # unsaid NICs: the preset's NICs per GPU on the stated node size
        inter["nics_per_node"] = max(1, round(preset.inter_node.nics_per_node * per_node / preset.gpus_per_node))
    if hw.get("inter_node_nic_Gbps"):
        inter["nic_bandwidth_GBps"] = hw["inter_node_nic_Gbps"] / 8 * ACHIEVED_NIC_FRACTION
    return topo.model_copy(update={"inter_node": type(topo.inter_node)(**inter)})
