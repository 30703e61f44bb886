"""LaunchPlans for the executor tests, built directly from the schema (no cost model involved): the
tests check that the executor trains what a plan says, whatever its predictions are."""

from __future__ import annotations

from pathlib import Path

from planner.io import atomic_write_text, canonical_json
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import (
    Batch, Breakdown, LaunchPlan, MemoryReport, Parallelism, PlanRequest, Prediction, RankEntry, Recompute, Stage,
)
from planner.schemas.topology import DeviceSpec, InterNodeFabric, IntraNodeFabric, Topology

SEQ = 16
TINY = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                 num_kv_heads=2, vocab_size=64, seq_len=SEQ, activation="swiglu", norm="rmsnorm")
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                     vocab_size=64, seq_len=SEQ, activation="swiglu", norm="rmsnorm",
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, first_k_dense=1, capacity_factor=1.0))
TINY_GPT = ModelSpec(name="tiny-gpt", num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                     vocab_size=64, seq_len=SEQ, activation="gelu", norm="layernorm", position="learned",
                     linear_bias=True, tied_embeddings=True)
TINY_TIED = ModelSpec(name="tiny-llama-tied", num_layers=4, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                      num_kv_heads=2, vocab_size=64, seq_len=SEQ, activation="swiglu", norm="rmsnorm", tied_embeddings=True)
CPU = Topology(
    name="cpu-test", device=DeviceSpec(name="cpu", memory_bytes=2**31, peak_bf16_tflops=0.05, peak_fp32_tflops=0.05,
                                       hbm_bandwidth_GBps=10.0),
    gpus_per_node=8, num_nodes=1, intra_node=IntraNodeFabric(kind="loopback", bandwidth_GBps=3.0, latency_s=5e-5),
    inter_node=InterNodeFabric(kind="none", nics_per_node=0, nic_bandwidth_GBps=0.0, latency_s=0.0, topology="none"),
)


def stage_names(num_layers: int, num_stages: int, counts=None) -> list[tuple[str, ...]]:
    """Contiguous split, balanced unless `counts` (decoder layers per stage) is given; embedding on the first stage,
    norm + head on the last."""
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        count = counts[s] if counts is not None else base + (1 if s < extra else 0)
        names = [f"layers.{i}" for i in range(start, start + count)]
        if s == 0:
            names.insert(0, "tok_embeddings")
        if s == num_stages - 1:
            names += ["norm", "output"]
        out.append(tuple(names))
        start += count
    return out


def make_plan(spec: ModelSpec = TINY, *, dp=1, tp=1, pp=1, vpp=1, ep=1, sp=False, zero_stage=0, schedule="1f1b",
              microbatch_size=1, num_microbatches=2, recompute="none", tp_overlap="none",
              axis_order=("pp", "dp", "cp", "tp"), step_time_s=1.0, dp_replicate=1, compression=None,
              stage_layers=None) -> LaunchPlan:
    par = Parallelism(dp=dp, tp=tp, pp=pp, vpp=vpp, ep=ep, sp=sp, zero_stage=zero_stage, tp_overlap=tp_overlap,
                      axis_order=axis_order, dp_replicate=dp_replicate, **({"compression": compression} if compression else {}))
    gbs = microbatch_size * num_microbatches * dp
    sizes = {"pp": pp, "dp": dp, "cp": 1, "tp": tp}
    ranks, world = [], par.world_size
    for rank in range(world):
        coords, rest = {}, rank
        for axis in reversed(axis_order):
            coords[axis], rest = rest % sizes[axis], rest // sizes[axis]
        ranks.append(RankEntry(rank=rank, node=0, local_rank=rank, coords=coords))
    stages = [Stage(stage=i, layers=names, recompute=Recompute(mode=recompute))
              for i, names in enumerate(stage_names(spec.num_layers, pp * vpp, stage_layers))]
    request = PlanRequest(model=spec, topology=CPU, gpus=world, global_batch_size=gbs, seq_len=SEQ, precision="fp32")
    tokens = gbs * SEQ
    return LaunchPlan(
        kind="estimate", request=request, parallelism=par,
        batch=Batch(global_batch_size=gbs, microbatch_size=microbatch_size, num_microbatches=num_microbatches, seq_len=SEQ),
        schedule=schedule, stages=tuple(stages), ranks=tuple(ranks),
        prediction=Prediction(step_time_s=step_time_s, tokens_per_s=tokens / step_time_s, model_tflops_per_gpu=0.0,
                              hardware_tflops_per_gpu=0.0, mfu=0.0, hfu=0.0, breakdown=Breakdown()),
        memory=MemoryReport(peak_bytes=2**28, capacity_bytes=2**31, fits=True, per_stage=()),
    )


def honest(plan: LaunchPlan) -> LaunchPlan:
    """The plan with the numbers its own request gives (planner.plan_verify re-derives them when a plan is
    loaded and refuses one that disagrees); a plan whose configuration the cost model refuses is left as built,
    so the tests of the executor's own refusals still reach them."""
    from planner.errors import BadInputError
    from planner.plan_verify import DERIVED, rederived, unverified_reason

    if unverified_reason(plan) is not None:
        return plan
    try:
        derived = rederived(plan)
    except BadInputError:
        return plan
    return plan.model_copy(update={name: getattr(derived, name) for name in DERIVED})  # parallelism kept (dp_replicate)


def write_plan(plan: LaunchPlan, path: Path) -> Path:
    """Write `plan` made honest (see honest) as the LaunchPlan JSON file a run loads."""
    atomic_write_text(path, canonical_json(honest(plan)))
    return path
