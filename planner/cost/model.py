"""The CostModel facade: candidates in, numbers out (the contract with planner/search).

The search builds `Candidate`s, asks `validity_reasons`, `layer_costs` (per-module arrays it partitions) and
`evaluate` (the step time, breakdown and memory of one partition). Everything is memoised per CostModel
instance; evaluate works on numpy prefix sums and builds pydantic objects only for its result.
Per pipeline rank r: memory = sum(static) + inflight(r) * sum(activations) + stage_other_bytes(r) <= capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.cost import layers as L
from planner.cost import memory
from planner.cost.calibration import DeviceCalibration, device_calibration, memory_calibration
from planner.cost.compute import Shape
from planner.cost.evaluate import Evaluation, evaluate_candidate
from planner.cost.validity import validity_reasons as _validity
from planner.schemas.plan import PlanRequest
from planner.schemas.profile import Profile

__all__ = ["Candidate", "CostModel", "CostOptions", "Evaluation", "LayerCosts"]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One point of the plan space (hashable)."""

    dp: int
    tp: int
    pp: int
    ep: int = 1
    cp: int = 1
    sp: bool = False
    vpp: int = 1
    zero_stage: int = 0
    tp_overlap: str = "none"  # "none" | "domino"
    microbatch_size: int
    num_microbatches: int
    schedule: str = "1f1b"  # "gpipe" | "1f1b" | "interleaved" | "2bw" | "zero-bubble"
    recompute: str = "none"  # "none" | "selective" | "full" (stage-wide base mode)
    axis_order: tuple[str, ...] = ("pp", "dp", "cp", "tp")  # outermost -> innermost

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True, kw_only=True)
class CostOptions:
    """Software facts the analytic model cannot see in the request (defaults: a modern Megatron/torchtitan stack).

    flash_attention: fused attention that keeps no s^2 scores; None = on for bf16/amp-bf16/fp8, off for fp32.
    fused_kernels: fused norm/activation/RoPE kernels; None = on for bf16 and fp8 (the Megatron-LM/torchtitan
        recipes with bf16 parameters), off for amp-bf16 and fp32 (plain PyTorch with torch.autocast or none, as
        HuggingFace transformers runs: eager fp32 norms, unfused SwiGLU and RoPE; compute.KernelBytes).
    dropout: dropout layers present (GPT-3-era models); adds masks to activations and memory traffic.
    dp_overlap: gradient reduction overlapped with backward (Megatron --overlap-grad-reduce, FSDP, DeepSpeed
        ZeRO overlap_comm); False = the reduction starts after the last backward (2021-22 Megatron-LM, DeepSpeed
        PipelineEngine).
    bucket_params: gradient bucket size in parameters; with overlap the last bucket stays exposed
        (Megatron-LM's default --ddp-bucket-size, 40M).
    """

    flash_attention: bool | None = None
    fused_kernels: bool | None = None
    dropout: bool = False
    dp_overlap: bool = True
    bucket_params: float = 40e6


@dataclass(frozen=True)
class LayerCosts:
    """Arrays of length L = num_layers + 2 over (tok_embeddings, layers.0..n-1, output); one micro-batch, one GPU."""

    names: tuple[str, ...]
    forward_s: np.ndarray  # TP/EP/CP communication that is not hidden included
    backward_s: np.ndarray  # without recompute
    recompute_s: np.ndarray  # extra time of the candidate's recompute mode
    full_recompute_s: np.ndarray  # extra time if this layer is fully recomputed (= its forward)
    static_bytes: np.ndarray  # params + grads + optimizer states after TP/EP sharding and ZeRO division
    activation_bytes: np.ndarray  # saved per micro-batch under the candidate's recompute mode
    full_recompute_activation_bytes: np.ndarray  # saved per micro-batch if fully recomputed


@dataclass(frozen=True)
class Detail:
    """LayerCosts plus the parts evaluate needs for the breakdown and the data-parallel terms."""

    costs: LayerCosts
    compute_s: np.ndarray  # forward + backward compute (no comm)
    tp_s: np.ndarray
    ep_s: np.ndarray
    cp_s: np.ndarray
    bwd_compute_s: np.ndarray  # the window a gradient reduction can hide behind
    weight_bytes: np.ndarray
    grad_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    dense_params: np.ndarray
    expert_params: np.ndarray
    model_fwd_flops: np.ndarray  # per sequence, whole module, full-attention convention, no capacity padding
    hw_fwd_flops: np.ndarray  # per sequence, with MoE capacity padding
    core_fwd_flops: np.ndarray  # per sequence, attention core (what selective recompute reruns)
    zero3_gather_bytes: float  # bytes of the largest module's weights when gathered (ZeRO-3 working set)
    prefix: np.ndarray | None = None  # prefix sums of every evaluate row (planner.cost.evaluate.prefix_sums)

    @property
    def model_fwd_total(self) -> float:
        return float(self.model_fwd_flops.sum())

    @property
    def hw_fwd_total(self) -> float:
        return float(self.hw_fwd_flops.sum())


@dataclass(frozen=True)
class _DpTerms:
    """(slope, intercept) of the dense and expert gradient reduction time (the fields _dp_exposed reads)."""

    dp_dense: tuple[float, float]
    dp_expert: tuple[float, float]


class CostModel:
    """Analytic (or profiled) cost of candidates for one PlanRequest."""

    def __init__(self, request: PlanRequest, profile: Profile | None = None, *, options: CostOptions | None = None,
                 calibration: DeviceCalibration | None = None):
        self.request = request
        self.spec = request.model
        self.topology = request.topology
        self.device = request.topology.device
        self.cal = calibration or device_calibration(self.device)
        self.mem_cal = memory_calibration()
        self.recipe = memory.RECIPES[request.precision]
        self.options = options or CostOptions()
        flash = self.options.flash_attention
        self.flash_attention = (request.precision != "fp32") if flash is None else flash
        fused = self.options.fused_kernels
        self.fused_kernels = request.precision in ("bf16", "fp8") if fused is None else fused
        if profile is None and request.profile is not None:
            from planner.io import load_file

            profile = load_file(Profile, request.profile)
        self.profile = profile
        self.profiled_shapes: set[str] = set()
        self.analytic_shapes: set[str] = set()
        self.names = ("tok_embeddings", *(f"layers.{i}" for i in range(self.spec.num_layers)), "output")
        self.moe_mask = np.array([self.spec.is_moe_layer(i) for i in range(self.spec.num_layers)], dtype=bool)
        self._details: dict[tuple, Detail] = {}
        self._validity: dict[Candidate, tuple[str, ...]] = {}
        self._links: dict[tuple, L.Links] = {}
        self._fixed_cache: dict[Candidate, object] = {}
        self.memo: dict = {}  # per-instance memo of shape/layout-level arrays (planner.cost.arrays)

    # --- memory capacity -------------------------------------------------------------------------------

    def device_usable_bytes(self) -> int:
        """Device memory less the CUDA context (DeviceSpec.reserved_memory_bytes)."""
        return self.device.memory_bytes - self.device.reserved_memory_bytes

    def capacity_bytes(self) -> int:
        """Usable bytes for allocations per GPU: (memory - CUDA context - fixed allowance) / (1 + fragmentation
        fraction), so that allocated <= capacity_bytes() exactly when allocated * (1 + f) + fixed fits the
        device (allowance derived from the tinyllama H100 measurements, calibration.yaml)."""
        cal = self.mem_cal
        return int((self.device_usable_bytes() - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction))

    # --- validity --------------------------------------------------------------------------------------

    def validity_reasons(self, cand: Candidate) -> tuple[str, ...]:
        """Why `cand` is not a valid configuration (divisibility, batch, schedule rules); () when valid."""
        cached = self._validity.get(cand)
        if cached is None:
            cached = _validity(self.request, cand)
            self._validity[cand] = cached
        return cached

    # --- per-layer arrays ------------------------------------------------------------------------------

    def _key(self, cand: Candidate) -> tuple:
        return (cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.sp, cand.zero_stage, cand.tp_overlap,
                cand.microbatch_size, cand.recompute, cand.axis_order, cand.schedule == "2bw")

    def links(self, cand: Candidate) -> L.Links:
        """The GroupLink of the tp, cp, ep, dp and pp groups under the candidate's layout (planner.topology.placement)."""
        key = (cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.axis_order)
        found = self._links.get(key)
        if found is None:
            from planner.cost.links import candidate_links

            found = candidate_links(self.topology, cand)
            self._links[key] = found
        return found

    def layer_costs(self, cand: Candidate) -> LayerCosts:
        """Per-module arrays for the candidate (memoised on the fields they depend on; without the breakdown
        parts and prefix sums `evaluate` builds, so the search can ask for many cheaply)."""
        key = ("costs", *self._key(cand))
        found = self.memo.get(key)
        if found is None:
            from planner.cost.arrays import layer_costs_with

            found = self.memo[key] = layer_costs_with(self, cand, self.links(cand))
        return found

    def comm_free_links(self, cand: Candidate) -> L.Links:
        """The candidate's tp link, and single-rank links for the cp, ep, dp and pp groups (their communication
        then costs nothing). Only the tp group's placement is computed (cheap)."""
        from planner.topology.groups import GroupLink
        from planner.topology.placement import axis_link

        sizes = {"pp": cand.pp, "dp": cand.dp, "cp": cand.cp, "tp": cand.tp, "ep": cand.ep}
        tp = axis_link(self.topology, sizes, tuple(cand.axis_order), "tp")
        alone = GroupLink(size=1, ranks_per_node=1, num_nodes=1, intra_bandwidth_GBps=tp.intra_bandwidth_GBps,
                          intra_latency_s=tp.intra_latency_s, inter_bandwidth_GBps=tp.inter_bandwidth_GBps,
                          inter_latency_s=tp.inter_latency_s)
        return L.Links(tp=tp, cp=alone, ep=alone, dp=alone, expert_dp=alone, pp=alone)

    def comm_free_costs(self, cand: Candidate) -> LayerCosts:
        """layer_costs with the cp and ep groups' communication taken as free (comm_free_links). Every time is
        at most the candidate's under any placement of those groups: a module's cost reads no other link, and
        exposed communication (planner.cost.layers: TP, max(0, ring - attention) for CP, all-to-all for EP) is
        never negative, nor is its share of a full recompute's forward. Memory arrays are the candidate's. The
        search bounds a whole group of configurations with it before it places the cp, ep, dp and pp groups.
        With tp innermost (every order of the search's space) the tp groups are the same ranks under every order,
        so the result is shared by the orders."""
        order = () if cand.axis_order[-1] == "tp" else cand.axis_order
        key = ("comm_free", *self._key(cand)[:-2], order, cand.schedule == "2bw")
        found = self.memo.get(key)
        if found is None:
            from planner.cost.arrays import layer_costs_with

            found = self.memo[key] = layer_costs_with(self, cand, self.comm_free_links(cand))
        return found

    def detail(self, cand: Candidate) -> Detail:
        key = self._key(cand)
        found = self._details.get(key)
        if found is None:
            from planner.cost.arrays import build_detail

            found = build_detail(self, cand)
            self._details[key] = found
        return found

    def shape(self, cand: Candidate) -> Shape:
        return Shape(microbatch_size=cand.microbatch_size, seq_len=self.request.seq_len, tp=cand.tp, cp=cand.cp,
                     ep=cand.ep, sp=cand.sp, flash_attention=self.flash_attention, dropout=self.options.dropout,
                     fused_kernels=self.fused_kernels)

    # --- schedule-dependent terms -----------------------------------------------------------------------

    def inflight_microbatches(self, cand: Candidate, stage: int) -> float:
        """Micro-batches whose activations pipeline rank `stage` holds at its peak (planner.cost.schedule)."""
        from planner.cost.schedule import inflight_microbatches

        return inflight_microbatches(cand.schedule, pp=cand.pp, stage=stage, num_microbatches=cand.num_microbatches, vpp=cand.vpp)

    def stage_other_bytes(self, cand: Candidate, stage: int) -> int:
        """Logits buffer on the last pipeline rank (fp32 T*V/t) and, with ZeRO-3, the gathered weights of two
        modules (the one running and the one prefetched). The allocator allowance is in capacity_bytes()."""
        other = 0.0
        if stage == cand.pp - 1:
            other += memory.logits_buffer_bytes(self.spec, self.shape(cand))
        if cand.zero_stage >= 3:
            from planner.cost.arrays import zero3_gather_bytes

            other += 2 * zero3_gather_bytes(self, cand)
        return int(other)

    def inflight_per_rank(self, cand: Candidate) -> np.ndarray:
        """inflight_microbatches of every pipeline rank (memoised per schedule, pp, vpp and num_microbatches)."""
        key = ("inflight", cand.schedule, cand.pp, cand.vpp, cand.num_microbatches)
        found = self.memo.get(key)
        if found is None:
            found = np.array([float(self.inflight_microbatches(cand, r)) for r in range(cand.pp)])
            found.setflags(write=False)
            self.memo[key] = found
        return found

    def other_per_rank(self, cand: Candidate) -> np.ndarray:
        """stage_other_bytes of every pipeline rank (memoised on the fields it reads; only the last rank's
        differs, so the others are copies of rank 0's)."""
        key = ("other", cand.pp, cand.zero_stage >= 3, cand.tp, cand.ep, cand.cp, cand.sp, cand.microbatch_size)
        found = self.memo.get(key)
        if found is None:
            found = np.full(cand.pp, float(self.stage_other_bytes(cand, 0)))
            found[-1] = float(self.stage_other_bytes(cand, cand.pp - 1))
            found.setflags(write=False)
            self.memo[key] = found
        return found

    def held_static_bytes(self, cand: Candidate) -> np.ndarray:
        """Per-module static bytes held at the memory peak with the activations: params + grads + optimizer
        states, less the grads where the amp-bf16 peak comes before any exist (planner.cost.autocast); what a
        rank holds at least, besides in-flight activations and other bytes (the search's memory bounds)."""
        key = ("held", cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.zero_stage, cand.num_microbatches == 1,
               cand.schedule == "2bw")
        found = self.memo.get(key)
        if found is None:
            from planner.cost import autocast
            from planner.cost.arrays import _static_parts, module_params_of

            weights, grads, optimizer = _static_parts(self, cand, *module_params_of(self, cand))
            if self.request.precision == autocast.RECIPE and autocast.grads_absent_at_activation_peak(
                    dp=cand.dp, cp=cand.cp, zero_stage=cand.zero_stage, num_microbatches=cand.num_microbatches):
                grads = 0.0 * grads
            found = weights + grads + optimizer
            found.setflags(write=False)
            self.memo[key] = found
        return found

    def pp_comm_floor_s(self, cand: Candidate) -> float:
        """pp_comm_s over the fastest link any group can have on the topology (the higher of the best intra-node
        bandwidth and the NIC share, the lower latency): at most pp_comm_s under every placement, as a
        point-to-point send is bytes / bandwidth + latency (planner.cost.comm.p2p_s)."""
        from planner.cost import schedule

        transfers = schedule.p2p_transfers(cand.schedule, pp=cand.pp, vpp=cand.vpp, num_microbatches=cand.num_microbatches)
        if transfers == 0:
            return 0.0
        key = ("p2p_floor", cand.microbatch_size, cand.tp, cand.cp, cand.sp)
        send = self.memo.get(key)
        if send is None:
            from planner.cost import comm
            from planner.cost.memory import p2p_activation_bytes
            from planner.topology.groups import GroupLink
            from planner.topology.placement import intra_bandwidth_GBps, nic_share_GBps

            topo = self.topology
            fastest = GroupLink(
                size=2, ranks_per_node=2, num_nodes=1,
                intra_bandwidth_GBps=max(intra_bandwidth_GBps(topo, topo.gpus_per_node), nic_share_GBps(topo)),
                intra_latency_s=min(topo.intra_node.latency_s, topo.inter_node.latency_s),
                inter_bandwidth_GBps=nic_share_GBps(topo), inter_latency_s=topo.inter_node.latency_s)
            send = self.memo[key] = comm.p2p_s(p2p_activation_bytes(self.spec, self.shape(cand)), group=fastest)
        return 2 * transfers * send

    def dp_exposed_s(self, cand: Candidate, ranks: np.ndarray, *, fastest: bool = False) -> float:
        """The breakdown's dp_comm_exposed_s with module i on pipeline rank ranks[i] (evaluate's formula). With
        `fastest`, over a flat link of the dp group's size at the highest bandwidth of the topology and no
        latency: at most the time under every placement, as a ring all-reduce, reduce-scatter or all-gather
        moves at least (n-1)/n of the bytes through each rank ((rpn-1)/rpn + (nodes-1)/(nodes rpn) >= (n-1)/n
        for the hierarchical form, nodes * rpn >= n) and the exposure is increasing in the communication."""
        from planner.cost.arrays import module_params_of
        from planner.cost.evaluate import _dp_comm_s, _dp_exposed, _linear

        links = self.fastest_links(cand) if fastest else self.links(cand)
        dense, expert = module_params_of(self, cand)
        table = self.compute_rows(cand)
        pp = cand.pp
        row = {"dense": np.bincount(ranks, weights=dense, minlength=pp),
               "expert": np.bincount(ranks, weights=expert, minlength=pp),
               "bwd_compute": np.bincount(ranks, weights=table[1], minlength=pp),
               "compute": np.bincount(ranks, weights=table[0] + table[1], minlength=pp)}
        terms = _DpTerms(_linear(lambda x: _dp_comm_s(self, cand, x, 0.0, links)),
                         _linear(lambda x: _dp_comm_s(self, cand, 0.0, x, links)))
        return float(_dp_exposed(self, cand, terms, row))

    def compute_rows(self, cand: Candidate) -> np.ndarray:
        """(forward, backward) compute seconds per module (no communication): the same under every layout."""
        from planner.cost.arrays import MODULE_FIELDS, _module_table

        table = _module_table(self, cand, self.comm_free_links(cand))
        return table[[MODULE_FIELDS.index("compute_fwd_s"), MODULE_FIELDS.index("compute_bwd_s")]]

    def fastest_links(self, cand: Candidate) -> L.Links:
        """Flat links of each group's size at the highest bandwidth of the topology, no latency (dp_exposed_s)."""
        from planner.topology.groups import GroupLink
        from planner.topology.placement import intra_bandwidth_GBps, nic_share_GBps

        topo = self.topology
        best = max(intra_bandwidth_GBps(topo, topo.gpus_per_node), nic_share_GBps(topo))

        def flat(size: int) -> GroupLink:
            return GroupLink(size=size, ranks_per_node=size, num_nodes=1, intra_bandwidth_GBps=best, intra_latency_s=0.0,
                             inter_bandwidth_GBps=best, inter_latency_s=0.0)

        # the dp x cp reduction runs on the dp axis's node footprint (planner.cost.links): across nodes it is a
        # ring over nodes * rpn >= dp ranks, on one node a ring over all dp * cp ranks
        edp = max(1, cand.dp * cand.cp // cand.ep)
        ring = cand.dp if cand.dp > 1 else cand.dp * cand.cp
        return L.Links(tp=flat(cand.tp), cp=flat(cand.cp), ep=flat(cand.ep), dp=flat(min(ring, cand.dp * cand.cp)),
                       expert_dp=flat(min(ring, edp)), pp=flat(cand.pp))

    def pp_comm_s(self, cand: Candidate) -> float:
        """Pipeline point-to-point time of one step (the breakdown's pp_comm_s): 2 directions x the sequential
        boundary transfers of the schedule (planner.cost.schedule.p2p_transfers) x one activation send."""
        from planner.cost import comm, schedule
        from planner.cost.memory import p2p_activation_bytes

        transfers = schedule.p2p_transfers(cand.schedule, pp=cand.pp, vpp=cand.vpp, num_microbatches=cand.num_microbatches)
        if transfers == 0:
            return 0.0
        return 2 * transfers * comm.p2p_s(p2p_activation_bytes(self.spec, self.shape(cand)), group=self.links(cand).pp)

    def evaluate(self, cand: Candidate, *, stage_layers: Sequence[int] | None = None,
                 full_recompute_layers: Sequence[int] | None = None) -> Evaluation:
        """Step time, breakdown and per-rank memory of `cand` with the given split (None: balanced) and, per
        virtual stage, how many decoder layers are fully recomputed on top of the base mode."""
        return evaluate_candidate(self, cand, stage_layers=stage_layers, full_recompute_layers=full_recompute_layers)
