"""What a prediction assumed (model_notes) and the Candidate of a user's Configuration (candidate_of): the
cost-model side of `planner estimate` (planner.estimate builds its LaunchPlan).

In `planner estimate`, malformed configurations for the model (tp not dividing the heads, ep without experts, degrees that do not
multiply to the GPU count) and configurations that do not divide the batch or the layers are bad input
(BadInputError, exit 2, HTTP 422) naming the numbers: the user's fixed configuration is inconsistent, which
the command line contract answers with 2. Configurations that do not fit in memory come back as a LaunchPlan with
feasible=False and the reasons (which rank, by how much, which part dominates). A configuration the request's
framework cannot run is refused with that framework's reason (bad input: the user asked for something the stack
does not have); an explicit 2BW schedule is the user's opt-in.
"""

from __future__ import annotations

from planner.cost import contention
from planner.cost.model import Candidate, CostModel
from planner.errors import BadInputError
from planner.schemas.plan import Configuration, PlanRequest


def candidate_of(request: PlanRequest, config: Configuration) -> Candidate:
    """The Candidate of a Configuration; num_microbatches = global_batch_size / (dp * microbatch_size)."""
    par = config.parallelism
    per_step = par.dp * config.microbatch_size
    if request.global_batch_size % per_step:
        lower = request.global_batch_size // per_step * per_step
        raise BadInputError(
            f"global_batch_size={request.global_batch_size} is not divisible by dp*microbatch_size={par.dp}*"
            f"{config.microbatch_size}={per_step}: use --global-batch-size {max(lower, per_step)} or {lower + per_step}, "
            f"or another --microbatch-size"
        )
    return Candidate(
        **par.dims.as_dict(), sp=par.sp, vpp=par.vpp, zero_stage=par.zero_stage, tp_overlap=par.tp_overlap,
        microbatch_size=config.microbatch_size, num_microbatches=request.global_batch_size // per_step,
        schedule=config.schedule, recompute=config.recompute, recompute_modules=config.recompute_modules, axis_order=tuple(par.axis_order), compression=par.compression,
    )


def model_notes(model: CostModel) -> list[str]:
    """What the prediction assumed: compute source per layer shape, attention kernel, calibration family."""
    notes = []
    if model.profiled_shapes:
        notes.append("compute measured (profile " + str(model.request.profile) + ") for " + "; ".join(sorted(model.profiled_shapes)))
    if model.analytic_shapes:
        notes.append("compute analytic for " + "; ".join(sorted(model.analytic_shapes)))
    notes.append(
        "attention: " + ("fused flash attention (no s^2 scores kept)" if model.flash_attention else "unfused (s^2 scores kept)")
        + ("; fused norm/activation kernels" if model.fused_kernels else "; eager (unfused) norm/activation/RoPE kernels")
        + ("; dropout on" if model.options.dropout else "; no dropout")
        + ("; data-parallel reduction overlapped with backward" if model.options.dp_overlap else "; data-parallel reduction not overlapped")
    )
    topo = model.topology
    if contention.contended(model.request.gpus, topo):
        ranks = contention.ranks_per_node(model.request.gpus, topo.gpus_per_node)
        notes.append(f"{ranks} ranks share {topo.compute_slots_per_node} compute slots per node: compute stretched "
                     f"{ranks / topo.compute_slots_per_node:.2g}x and no communication overlapped (planner.cost.contention)")
    cal = model.cal
    mixers = [m for m in model.spec.mixers if m != "attention"]
    if mixers:  # no measurement or published run covers them yet: the error band below is attention models'
        notes.append(f"{' and '.join({'linear': 'Gated DeltaNet', 'mamba': 'Mamba'}[m] for m in mixers)} layers priced "
                     "from their FLOPs on the GEMM curve and their bytes at HBM rate (planner.cost.mixers), not measured; "
                     "the error band is that of attention models")
    if model.request.precision == "amp-bf16" and not model.fused_kernels:
        notes.append(f"eager recipe (HF transformers under torch.autocast): each phase of a dense layer takes max(device + "
                     f"kernels x {cal.eager_kernel_s * 1e6:.1f} us, aten operators x {cal.eager_host_op_s * 1e6:.1f} us host) "
                     f"(planner.cost.eager)")
    notes.append(
        f"device calibration {cal.family}" + (f" x {cal.stack}" if cal.stack else "")
        + f": GEMM ceiling {cal.matmul_ceiling_fraction:.3f} of peak, HBM {cal.hbm_efficiency:.3f} ({cal.source})"
    )
    if cal.error_band:
        notes.append(f"expected step-time error within +/-{cal.error_band:.0%} (90th percentile of the leave-one-source-out "
                     f"errors of published {cal.family}" + (f" {cal.stack}" if cal.stack else "") + " runs, benchmarks/accuracy.py)")
    return notes
