"""The CostModel facade: candidates in, numbers out (the contract with planner/search).

The search builds `Candidate`s, asks `validity_reasons`, `layer_costs` (per-module arrays it partitions) and
`evaluate` (the step time, breakdown and memory of one partition). Everything is memoised per CostModel
instance; evaluate works on numpy prefix sums and builds pydantic objects only for its result.
Per pipeline rank r: memory = sum(static) + inflight(r) * sum(activations) + stage_other_bytes(r) <= capacity.
The search's bounds (single terms of `evaluate` and floors that no placement, micro-batch size or recompute mode
goes below) are free functions of planner.cost.bounds that take the CostModel; this module does not import them.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses

import numpy as np

from planner.cost import layers as L
from planner.cost.layer_terms import Links
from planner.cost import compression, executor, grad_accumulation, memory, moe_comm, pipelining_memory
from planner.cost.arrays import (build_detail, layer_costs_with, layer_working_bytes, moe_batch_overlap, priced_choices,
                                 zero3_working_bytes)
from planner.cost.calibration import (DeviceCalibration, attention_rate_for, device_calibration,
                                      memory_calibration, step_overhead_s)
from planner.cost.compute import Shape
from planner.cost.evaluate import Evaluation, evaluate_candidate
from planner.cost.links import candidate_links
from planner.cost.overlay import apply_overlay
from planner.cost.pins import dispatch_reasons
from planner.cost.stack import options_for
from planner.cost.types import Candidate, CostOptions, Detail, LayerCosts
from planner.cost.validity import validity_reasons as _validity
from planner.frameworks import load_framework
from planner.io import load_file
from planner.schedules import schedule as schedule_of
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest
from planner.schemas.profile import Profile

__all__ = ["Candidate", "CostModel", "CostOptions", "Evaluation", "LayerCosts"]


class CostModel:
    """Analytic (or profiled) cost of candidates for one PlanRequest."""

    def __init__(self, request: PlanRequest, profile: Profile | None = None, *, framework: FrameworkProfile | None = None,
                 options: CostOptions | None = None, calibration: DeviceCalibration | None = None,
                 step_overhead: float | None = None):
        """`profile`: the measured layer profile (else the one the request names, if any); `framework`: the request's
        stack profile, resolved once by the caller (else read by its name, request.framework, when first needed)."""
        self.request = request
        self._framework = framework
        self.spec = request.model
        self.topology = request.topology
        self.device = request.topology.device
        self.recipe = memory.RECIPES[request.precision]
        if options is None:
            options = options_for(self.framework, request.precision)
        if self.spec.dropout is not None and self.spec.dropout != options.dropout:  # the model says; else the stack's default
            options = dataclasses.replace(options, dropout=self.spec.dropout)
        self.options = options
        fused = options.fused_kernels
        self.fused_kernels = request.precision in ("bf16", "fp8") if fused is None else fused
        self.executor_recipe = None  # the planner's executor, priced from its code (planner.cost.executor)
        if options.executor_code:
            self.executor_recipe = executor.recipe_for(request.precision, bf16_autocast=options.bf16_autocast,
                                                       sdpa_gqa=options.sdpa_gqa)
            self.fused_kernels = self.fused_kernels and self.executor_recipe.compute != 2  # its code is eager
        autocast_run = request.precision == "amp-bf16" or (self.executor_recipe is not None and self.executor_recipe.compute == 2)
        eager = autocast_run and not self.fused_kernels  # planner.cost.eager's (or the executor's) eager recipe
        self.cal = calibration or device_calibration(self.device, request.framework, eager=eager)
        overlay = request.calibration if calibration is None else None  # the user's own runs (planner calibrate)
        if overlay is not None:
            self.cal = apply_overlay(self.cal, overlay, self.device, request.framework)
            step_overhead = overlay.step_overhead_s if step_overhead is None else step_overhead
        fraction, seq_half = attention_rate_for(self.cal, options.attention_kernel, self.spec.dim_per_head)
        self.cal = dataclasses.replace(self.cal, attention_fraction=fraction, attention_seq_half=seq_half)
        if request.precision == "bf16" and not options.main_grads_fp32:
            self.recipe = memory.FP32_MASTER_PARAMS_BF16
        if self.executor_recipe is not None and self.executor_recipe.autocast and options.bf16_autocast:
            self.recipe = executor.AUTOCAST_BYTES  # the executor of c162dfb (bf16 run as fp32 params + autocast)
        elif options.recipe_bytes is not None:  # the stack's own recipe (behaviour.memory.recipes)
            w, g, o, reduce, gather = options.recipe_bytes
            self.recipe = memory.Recipe(weight_bytes=w, grad_bytes=g, optimizer_bytes=o, grad_reduce_bytes=reduce,
                                        gather_bytes=gather)
        # the training loop's per-step work outside the micro-batches (calibration.yaml `loop`)
        self.step_overhead_s = step_overhead_s(request.framework) if step_overhead is None else step_overhead
        self.mem_cal = memory_calibration(options.allocator)  # the stack's allocator setting (behaviour.memory.allocator)
        if options.allocator_fraction is not None:
            self.mem_cal = dataclasses.replace(self.mem_cal, fragmentation_fraction=options.allocator_fraction)
        flash = self.options.flash_attention
        self.flash_attention = (request.precision != "fp32") if flash is None else flash
        if profile is None and request.profile is not None:
            profile = load_file(Profile, request.profile)
        self.profile = profile
        self.profiled_shapes: set[str] = set()
        self.analytic_shapes: set[str] = set()
        self.names = ("tok_embeddings", *(f"layers.{i}" for i in range(self.spec.num_layers)), "output")
        self.moe_mask = np.array([self.spec.is_moe_layer(i) for i in range(self.spec.num_layers)], dtype=bool)
        self._details: dict[tuple, Detail] = {}
        self._validity: dict[Candidate, tuple[str, ...]] = {}
        self._links: dict[tuple, Links] = {}
        self.fixed_cache: dict[Candidate, object] = {}  # evaluate's split-independent terms per candidate
        self.memo: dict = {}  # per-instance memo of shape/layout-level arrays (planner.cost.arrays)

    @property
    def framework(self) -> FrameworkProfile:
        """The request's stack profile (planner.schemas.framework): the one handed in, else read once by its name."""
        if self._framework is None:
            self._framework = load_framework(self.request.framework)
        return self._framework

    @property
    def hbm_rate_Bps(self) -> float:
        """The device's achieved HBM bandwidth (datasheet x calibration hbm_efficiency), bytes per second."""
        return self.device.hbm_bandwidth_GBps * 1e9 * self.cal.hbm_efficiency

    def powersgd_ratio(self, rank: int) -> float:
        """Elements PowerSGD rank `rank` all-reduces per gradient element (planner.cost.compression)."""
        key = ("powersgd", rank)
        if key not in self.memo:
            self.memo[key] = compression.powersgd_ratio(self.spec, rank)
        return self.memo[key]

    def executor_recipe_for(self, cand: Candidate):
        """The executor's recipe for this candidate (its ZeRO stage decides autocast or FSDP2: executor.recipe_for)."""
        if self.executor_recipe is None:
            return None
        return executor.recipe_for(self.request.precision, bf16_autocast=self.options.bf16_autocast,
                                   zero_stage=cand.zero_stage, dp=cand.dp, sdpa_gqa=self.options.sdpa_gqa)

    # --- memory capacity -------------------------------------------------------------------------------

    def device_usable_bytes(self) -> int:
        """Device memory less the CUDA context (DeviceSpec.reserved_memory_bytes)."""
        return self.device.memory_bytes - self.device.reserved_memory_bytes

    def capacity_bytes(self) -> int:
        """Usable bytes for allocations per GPU: (memory - CUDA context - fixed allowance) / (1 + fragmentation
        fraction), so that allocated <= capacity_bytes() exactly when allocated * (1 + f) + fixed fits the
        device (the allowance of the stack's allocator setting, calibration.yaml `memory`)."""
        cal = self.mem_cal
        return int((self.device_usable_bytes() - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction))

    # --- validity --------------------------------------------------------------------------------------

    def validity_reasons(self, cand: Candidate) -> tuple[str, ...]:
        """Why `cand` is not a valid configuration (divisibility, batch, schedule rules); () when valid."""
        cached = self._validity.get(cand)
        if cached is None:
            cached = _validity(self.request, cand, lambda: self.framework)
            if not cached:  # a stated dispatcher the candidate's group cannot run (planner.cost.pins)
                cached = dispatch_reasons(self.options, self.spec, cand, self.shape(cand))
            self._validity[cand] = cached
        return cached

    # --- per-layer arrays ------------------------------------------------------------------------------

    def layout_key(self, cand: Candidate) -> tuple:
        """The candidate fields a Detail depends on (its memo key; the bounds reuse it): pp and vpp through whether
        the stack's MoE overlap runs (arrays.moe_batch_overlap)."""
        sched = schedule_of(cand.schedule)
        return (cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.sp, cand.zero_stage, cand.num_microbatches > 1, cand.dp_replicate, cand.tp_overlap,
                cand.microbatch_size, cand.recompute, cand.recompute_modules, moe_batch_overlap(self, cand), cand.compression.has("fp8-dispatch"),
                cand.axis_order,
                (sched.weight_versions, sched.v_placed))

    def links(self, cand: Candidate) -> Links:
        """The GroupLink of the tp, cp, ep, dp and pp groups under the candidate's layout (planner.topology.placement)."""
        key = (cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.axis_order, cand.dp_replicate)
        found = self._links.get(key)
        if found is None:
            found = candidate_links(self.topology, cand)
            self._links[key] = found
        return found

    def layer_costs(self, cand: Candidate) -> LayerCosts:
        """Per-module arrays for the candidate (memoised on the fields they depend on; without the breakdown
        parts and prefix sums `evaluate` builds, so the search can ask for many cheaply)."""
        key = ("costs", *self.layout_key(cand))
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = layer_costs_with(self, cand, self.links(cand))
        return found

    def detail(self, cand: Candidate) -> Detail:
        key = self.layout_key(cand)
        found = self._details.get(key)
        if found is None:
            found = build_detail(self, cand)
            self._details[key] = found
        return found

    def shape(self, cand: Candidate) -> Shape:
        ep = L.expert_shard_ep(ep=cand.ep, dp=cand.dp, cp=cand.cp)
        o = self.options
        return Shape(microbatch_size=cand.microbatch_size, seq_len=self.request.seq_len, tp=cand.tp, cp=cand.cp,
                     ep=ep, sp=cand.sp, flash_attention=self.flash_attention,
                     dropout=o.dropout, fused_kernels=self.fused_kernels, eager_ops=o.eager_ops,
                     fp8_inputs=self.request.precision == "fp8" and o.fp8_saves_fp8_inputs,
                     softmax_in_place=o.softmax_in_place, expert_tp=max(1, cand.tp * ep // cand.ep),
                     moe_sp_dispatch=o.moe_sp_dispatch, moe_expert_launches=o.moe_expert_launches,
                     moe_expert_sort=o.moe_expert_sort, moe_combine_scores=o.moe_combine_scores)

    # --- schedule-dependent terms -----------------------------------------------------------------------

    def inflight_microbatches(self, cand: Candidate, stage: int) -> float:
        """Micro-batches whose activations pipeline rank `stage` holds at its peak: its schedule's
        (schedule_inflight_microbatches) and one more where the stack's MoE overlap holds it
        (pipelining_memory.ep_overlap_extra_microbatches)."""
        return self.schedule_inflight_microbatches(cand, stage) + self.ep_overlap_extra_microbatches(cand)

    def ep_overlap_extra_microbatches(self, cand: Candidate) -> float:
        """pipelining_memory.ep_overlap_extra_microbatches, memoised per candidate."""
        key = ("ep_overlap_extra", cand)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = pipelining_memory.ep_overlap_extra_microbatches(self, cand)
        return found

    def schedule_inflight_microbatches(self, cand: Candidate, stage: int) -> float:
        """Micro-batches rank `stage` holds at its peak under its schedule alone (planner.schedules): what every
        member of a search group with that schedule holds at least (the search's memory floors read this)."""
        if pipelining_memory.torch_split_backward(self, cand):  # torch's split backward holds more (its module)
            return pipelining_memory.zb_inflight(cand.pp, stage, cand.num_microbatches, cand.vpp)
        return schedule_of(cand.schedule).inflight_microbatches(pp=cand.pp, stage=stage, num_microbatches=cand.num_microbatches, vpp=cand.vpp)

    def stage_other_bytes(self, cand: Candidate, stage: int) -> int:
        """_other_bytes plus the pipeline's receive buffers of every micro-batch (pipelining_memory)."""
        return int(self._other_bytes(cand, stage) + pipelining_memory.recv_buffer_bytes(self, cand)[stage])

    def _other_bytes(self, cand: Candidate, stage: int) -> int:
        """The larger of two phases that do not overlap: the loss's logits buffer on the last pipeline rank (fp32
        T*V/t, freed once the head's backward is done, unless options.logits_live_in_backward) and the transient
        bytes of a layer running its backward (its gradients in flight and, under full recompute, its recomputed
        activations: arrays.layer_working_bytes); plus, with ZeRO-3, what the stack holds gathered
        (arrays.zero3_working_bytes). The allocator allowance is in capacity_bytes()."""
        other = layer_working_bytes(self, cand, recompute=cand.recompute)
        last = schedule_of(cand.schedule).loss_rank(pp=cand.pp, vpp=cand.vpp)  # pp - 1, or rank 0 in a V
        if self.executor_recipe is not None:  # planner.cost.executor: logits held, the loss phase, cuBLAS workspaces
            if stage == last:
                shape, recipe = self.shape(cand), self.executor_recipe_for(cand)
                held = executor.logits_held_bytes(self.spec, shape, recipe)
                other = max(other + held, held + executor.loss_transient_bytes(self.spec, shape, recipe))
            if self.cal.family != "cpu":
                other += executor.CUBLAS_WORKSPACES_BYTES
        elif stage == last:  # the loss's logits exist before the layers' backward starts, unless the loop holds them
            logits = memory.logits_buffer_bytes(self.spec, self.shape(cand))
            other = other + logits if self.options.logits_live_in_backward else max(other, logits)
        if cand.zero_stage >= 3:
            other += zero3_working_bytes(self, cand)
        other += grad_accumulation.held_bytes(self, cand).bucket_bytes  # the ZeRO-1 optimizer's gradient bucket
        return int(other + self.dispatch_buffer_bytes(cand))

    def dispatch_buffer_bytes(self, cand: Candidate) -> float:
        """What the MoE dispatcher holds for the whole run beside the model: DeepEP's NVLink and RDMA buffers where
        the flex dispatcher is DeepEP's (options.moe_deepep) and priced for the candidate (priced_choices), sized
        for its tp x ep group (moe_comm.deepep_buffer_bytes); memoised per candidate."""
        if not self.options.moe_deepep or cand.ep <= 1 or self.spec.moe is None:
            return 0.0
        key = ("dispatch_buffer", cand)
        found = self.memo.get(key)
        if found is None:
            flex = priced_choices(self, cand)[0] == "flex"
            found = self.memo[key] = moe_comm.deepep_buffer_bytes(self.spec.hidden_size, self.shape(cand).tp_ep) if flex else 0.0
        return found

    def inflight_per_rank(self, cand: Candidate) -> np.ndarray:
        """inflight_microbatches of every pipeline rank."""
        extra = self.ep_overlap_extra_microbatches(cand)
        base = self.schedule_inflight_per_rank(cand)
        return base + extra if extra else base

    def schedule_inflight_per_rank(self, cand: Candidate) -> np.ndarray:
        """schedule_inflight_microbatches of every pipeline rank (memoised per schedule, pp, vpp and
        num_microbatches): a floor of inflight_per_rank for every candidate with that schedule."""
        key = ("inflight", cand.schedule, cand.pp, cand.vpp, cand.num_microbatches)
        found = self.memo.get(key)
        if found is None:
            found = np.array([float(self.schedule_inflight_microbatches(cand, r)) for r in range(cand.pp)])
            found.setflags(write=False)
            self.memo[key] = found
        return found

    def other_per_rank(self, cand: Candidate) -> np.ndarray:
        """stage_other_bytes of every pipeline rank (memoised on the fields it reads; only the last rank's
        differs, so the others are copies of rank 0's)."""
        key = ("other", cand.pp, cand.zero_stage, self.executor_recipe_for(cand), cand.tp, cand.ep, cand.dp, cand.cp, cand.sp,
               cand.microbatch_size, cand.recompute, cand.recompute_modules, cand.tp_overlap, schedule_of(cand.schedule).v_placed,
               cand.vpp, cand.num_microbatches)
        found = self.memo.get(key)
        if found is None:
            last = schedule_of(cand.schedule).loss_rank(pp=cand.pp, vpp=cand.vpp)
            found = np.full(cand.pp, float(self._other_bytes(cand, (last + 1) % cand.pp)))
            found[last] = float(self._other_bytes(cand, last))
            found += pipelining_memory.recv_buffer_bytes(self, cand)
            found.setflags(write=False)
            self.memo[key] = found
        return found

    def evaluate(self, cand: Candidate, *, stage_layers: Sequence[int] | None = None,
                 full_recompute_layers: Sequence[int] | None = None) -> Evaluation:
        """Step time, breakdown and per-rank memory of `cand` with the given split (None: balanced) and, per
        virtual stage, how many decoder layers are fully recomputed on top of the base mode."""
        return evaluate_candidate(self, cand, stage_layers=stage_layers, full_recompute_layers=full_recompute_layers)
