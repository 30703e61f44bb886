"""The DeepSpeed judge of a DeepSpeed export (planner.export.judges): `DeepSpeedConfig(config, mpu=...)` in a
fake-backend world of the plan's size, the mpu answering data-parallel size from
`PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`; the PipelineEngine's ZeRO rule and the engine's MoE rule.
"""

from __future__ import annotations

import contextlib
import json

from planner.export.common import Export
from planner.export.verdicts import JudgeUnavailable, Verdict, first_line, quiet
from planner.schemas.plan import LaunchPlan


class TopologyMpu:
    """The mpu DeepSpeedConfig consults: sizes from DeepSpeed's own PipeModelDataParallelTopology."""

    def __init__(self, topology):
        self.topology = topology

    def get_data_parallel_world_size(self) -> int:
        return self.topology.get_dim("data")

    def get_model_parallel_world_size(self) -> int:
        return self.topology.get_dim("model")

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.topology.get_dim("pipe")

@contextlib.contextmanager
def fake_world(world: int):
    """torch.distributed's fake backend with `world` ranks (this process rank 0), wrapped by deepspeed.comm."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if tdist.is_initialized():
        tdist.destroy_process_group()
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        import deepspeed.comm as dist

        if not dist.is_initialized():
            dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
        yield
    finally:
        tdist.destroy_process_group()

def judge_deepspeed(plan: LaunchPlan, export: Export) -> Verdict:
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    except ImportError as exc:
        raise JudgeUnavailable(f"deepspeed is not importable: {exc}") from None
    par = plan.parallelism
    config = json.loads(export.text)
    topology = PipeModelDataParallelTopology(num_pp=par.pp, num_mp=par.tp, num_dp=plan.request.gpus // (par.pp * par.tp))
    if topology.world_size() != plan.request.gpus:
        return Verdict(False, f"topology world {topology.world_size()} != {plan.request.gpus} GPUs")
    try:
        with quiet(), fake_world(plan.request.gpus):
            ds = DeepSpeedConfig(config, mpu=TopologyMpu(topology) if par.tp * par.pp > 1 else None)
        if par.pp > 1:  # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__
            assert ds.zero_optimization_stage < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        if plan.request.model.moe is not None:  # deepspeed/runtime/engine.py DeepSpeedEngine.__init__ (MoE layers)
            assert ds.zero_optimization_stage < 3, ("Native DeepSpeed MoE is not supported with ZeRO Stage 3. Use AutoEP "
                                                    "or choose ZeRO stage 1/2")
    except (AssertionError, ValueError, KeyError) as exc:
        return Verdict(False, f"DeepSpeedConfig: {first_line(exc)}")
    return Verdict(True)
