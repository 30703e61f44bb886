"""A device family nothing has measured takes its constants from the family its calibration.yaml entry names
(`prior`): Blackwell from Hopper, the in-step ceilings per stack included, as fractions of its own peaks."""

import dataclasses

import pytest

from planner.cost import calibration
from planner.topology import load_topology


@pytest.mark.parametrize("topology", ["dgx-b200", "gb200-nvl72"])
@pytest.mark.parametrize("stack", [None, "megatron-core", "torchtitan", "pytorch-fsdp", "planner"])
def test_blackwell_takes_hoppers_constants(topology, stack):
    blackwell = calibration.device_calibration(load_topology(topology).device, stack)
    hopper = calibration.device_calibration(load_topology("dgx-h100").device, stack)
    assert blackwell.family == "blackwell" and hopper.family == "hopper"
    ours, theirs = dataclasses.asdict(blackwell), dataclasses.asdict(hopper)
    for key in ("family", "source"):
        ours.pop(key), theirs.pop(key)
    assert ours == theirs
    assert blackwell.matmul_ceiling_fraction < 0.75  # an in-step ceiling, not the GEMM microbenchmark's 0.793


def test_a_prior_must_name_a_measured_family():
    families = {"hopper": {"family": "hopper", "match": ["H100"], "matmul_ceiling_fraction": 0.6},
                "x": {"family": "x", "match": ["X"], "prior": "y"}}
    with pytest.raises(ValueError, match="prior='y' must name a measured family"):
        calibration.with_prior(families["x"], families)
    merged = calibration.with_prior({"family": "z", "match": ["Z"], "prior": "hopper", "gemm_fixed_s": 1e-6}, families)
    assert merged["matmul_ceiling_fraction"] == 0.6 and merged["gemm_fixed_s"] == 1e-6 and merged["match"] == ["Z"]
