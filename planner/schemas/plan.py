"""The LaunchPlan: the one file that `estimate` and `plan` write, `run`/`launch` execute, `export`
translates, `check` recomputes and the service returns (schema version 1).

Self-contained (the resolved model and topology are inside), deterministic (no wall-clock values;
dicts serialised with sorted keys), explains itself (alternatives, pruned counts), executable (stages
name the executor model's module FQNs: `tok_embeddings`, `layers.<i>`, `norm`, `output`).
"""

from typing import Annotated, Literal

from pydantic import Field, model_serializer, model_validator

from planner.errors import BadInputError
from planner.schedules import DEFAULT as DEFAULT_SCHEDULE
from planner.schedules import NAMES as SCHEDULE_NAMES
from planner.schedules import SEARCHED_BY_DEFAULT
from planner.schemas import limits as L
from planner.schemas.base import InputSchema, Schema, without
from planner.schemas.calibration import CalibrationOverlay
from planner.schemas.compression import NONE, Compression
from planner.schemas.dims import LAYOUT_AXES, ParallelDims
from planner.schemas.framework import MoeDispatcher
from planner.schemas.model import ModelSpec
from planner.schemas.topology import Topology

PLAN_SCHEMA_VERSION = "1"

Precision = Literal["bf16", "amp-bf16", "fp32", "fp8"]
# planner.schedules owns the names; the search proposes SEARCHED_BY_DEFAULT unless asked for torch's names
# (interleaved-zero-bubble = zero-bubble; zbv and dualpipev place 2 stages per rank in a V)
Schedule = Literal[SCHEDULE_NAMES]
RecomputeMode = Literal["none", "selective", "full"]
# Megatron-Core --recompute-modules (transformer_config.py recompute_modules) the cost prices (planner.cost.selective)
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
TpOverlap = Literal["none", "domino"]
# The MoE overlaps (planner.cost.moe_comm): batch = --overlap-moe-expert-parallel-comm / DualPipe, shared =
# --moe-shared-expert-overlap; the dispatchers' names are planner.schemas.framework.MoeDispatcher
MoeOverlap = Literal["batch", "shared", "none"]
AXES = LAYOUT_AXES  # the default rank layout, outermost first (planner.schemas.dims)

# What a user states the job runs, in one spelling for `planner plan` (SearchLimits) and the service's bodies
# (planner.service.schemas); None = the best the framework runs. Priced as stated by planner.cost.pins.
StatedDispatcher = Annotated[MoeDispatcher | None, Field(description=(
    "the MoE token dispatcher the job runs (Megatron-Core --moe-token-dispatcher-type; Parallelism.moe_dispatcher); "
    "None = the fastest the framework runs"))]
StatedMoeOverlap = Annotated[MoeOverlap | None, Field(description=(
    "the MoE overlap the job runs: batch (--overlap-moe-expert-parallel-comm, DualPipe; where the layout allows it), "
    "shared (--moe-shared-expert-overlap), none (Parallelism.moe_overlap); None = the best the framework runs"))]
StatedCpCommType = Annotated[str | None, Field(max_length=40, pattern=r"^[a-z0-9_+]+$", description=(
    "the context-parallel flavour the job runs, in the framework's spelling (Parallelism.cp_comm_type); None = the "
    "fastest it runs"))]


class SearchLimits(InputSchema):
    """What the search may choose and how long it may take. Fixed fields narrow the space."""

    time_limit_s: float = Field(default=60.0, gt=0, le=L.MAX_TIME_LIMIT_S)
    top_k: int = Field(default=3, ge=0, le=L.MAX_TOP_K, description="alternatives to keep in the plan")
    runnable: bool = Field(default=False, description="deprecated alias of framework='planner' (what the executor runs)")
    allow_stale_weights: bool = Field(
        default=False, description="let the search choose PipeDream-2BW (one-step-stale weights) where the framework runs it")
    prefer_practice: bool = Field(default=True, description=(
        "between plans within the ranking band of the fastest, prefer one inside the framework's practice "
        "(planner.search.practice); false: the fastest predicted"))
    max_microbatch_size: int = Field(default=16, gt=0, le=L.MAX_GLOBAL_BATCH_SIZE)
    schedules: tuple[Schedule, ...] = SEARCHED_BY_DEFAULT
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[RecomputeMode, ...] = ("none", "selective", "full")
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=(), description=(
        "what the searched `selective` reruns, Megatron-Core --recompute-modules names; () = the framework's own. "
        "Written only when set"))
    tp_overlap: tuple[TpOverlap, ...] = ("none", "domino")
    fixed: dict[str, int] = Field(
        default_factory=dict, description="parallel degrees fixed by the user (dp, tp, pp, cp, ep); the rest is searched"
    )
    sp: bool | None = Field(default=None, description="sequence parallelism fixed on or off; None = searched")
    vpp: int | None = Field(default=None, gt=0, le=L.MAX_LAYERS, description="virtual stages per pipeline rank fixed; None = searched")
    microbatch_size: int | None = Field(default=None, gt=0, le=L.MAX_GLOBAL_BATCH_SIZE, description="micro-batch size fixed; None = searched")
    compression: Compression | Literal["auto"] = Field(default=NONE, description=(
        "communication compression fixed (none by default), or 'auto': each configuration with the compression "
        "the framework runs that makes it fastest (planner.search.compression_space; lossy methods are opt-in)"))
    dp_replicate: int = Field(default=1, gt=0, le=L.MAX_GPUS, description=(
        "HSDP replicas fixed for every configuration (Parallelism.dp_replicate; ZeRO-2/3 only, dp a multiple of it); "
        "not searched. Written only when > 1"))
    moe_dispatcher: StatedDispatcher = None  # these three written only when set
    moe_overlap: StatedMoeOverlap = None
    cp_comm_type: StatedCpCommType = None

    @model_serializer(mode="wrap")
    def _omit_no_compression(self, handler):
        """Leave compression out when it is none, dp_replicate when it is 1, recompute_modules when empty and the
        stated MoE and CP settings when unset, so requests without them serialise byte-identically to before."""
        return without(handler(self), compression=self.compression == NONE, dp_replicate=self.dp_replicate == 1,
                       recompute_modules=not self.recompute_modules, moe_dispatcher=self.moe_dispatcher is None,
                       moe_overlap=self.moe_overlap is None, cp_comm_type=self.cp_comm_type is None)


class PlanRequest(InputSchema):
    """What the user asked: a model on a cluster with a global batch. `estimate` adds a fixed configuration."""

    model: ModelSpec
    topology: Topology = Field(description="resolved and scaled: num_nodes is what the job uses")
    gpus: int = Field(gt=0, le=L.MAX_GPUS)
    global_batch_size: int = Field(gt=0, le=L.MAX_GLOBAL_BATCH_SIZE, description="sequences per optimizer step")
    seq_len: int = Field(gt=0, le=L.MAX_SEQ_LEN)
    precision: Precision = "bf16"
    profile: str | None = Field(default=None, description="measured profile file used for compute costs; None = analytic")
    search: SearchLimits | None = None
    framework: str = Field(default="planner", min_length=1,
                           description="the software stack that runs the plan (`planner framework list`, or a profile file)")
    calibration: CalibrationOverlay | None = Field(default=None, description=(
        "constants re-derived from the user's own runs (`planner calibrate`) for this device family and stack; "
        "None = the shipped calibration"))

    @model_serializer(mode="wrap")
    def _omit_shipped_calibration(self, handler):
        """Leave calibration out when None, so plans priced with the shipped constants serialise as before."""
        return without(handler(self), calibration=self.calibration is None)


class Parallelism(Schema):
    dp: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    ep: int = Field(default=1, gt=0, description="expert parallel degree, carved out of dp*cp (MoE only)")
    cp: int = Field(default=1, gt=0)
    sp: bool = False
    vpp: int = Field(default=1, gt=0, description="virtual stages per pipeline rank (interleaved schedule)")
    zero_stage: Literal[0, 1, 2, 3] = 0
    tp_overlap: TpOverlap = "none"
    axis_order: tuple[str, ...] = Field(default=AXES, description="outermost to innermost; tp innermost keeps TP inside a node")
    dp_replicate: int = Field(default=1, gt=0, description=(
        "HSDP (zero_stage 2/3): the dp axis as dp_replicate x dp_shard, FSDP sharding over the inner dp/dp_replicate "
        "ranks and replicating over dp_replicate; 1 = plain FSDP/DDP. Written only when > 1"))
    compression: Compression = Field(default=NONE, description=(
        "communication compression (planner.schemas.compression): ZeRO++ qwZ/hpZ/qgZ, PowerSGD, 16-bit gradient "
        "all-reduce, fp8 MoE dispatch. Written only when some method is used"))
    moe_dispatcher: MoeDispatcher | None = Field(default=None, description=(
        "the MoE token dispatcher the cost priced (planner.cost.moe_comm.choose; Megatron-Core's "
        "--moe-token-dispatcher-type names, flex = DeepEP's per-node deduplicated dispatch); written only with ep > 1. "
        "Given to an estimate, that dispatcher is priced (planner.cost.pins); None: the fastest the stack runs"))
    moe_overlap: MoeOverlap | None = Field(default=None, description=(
        "the MoE communication overlap the cost priced: batch = another micro-batch's compute hides the dispatch "
        "(Megatron-Core --overlap-moe-expert-parallel-comm, DualPipe), shared = the shared experts compute during "
        "it (--moe-shared-expert-overlap), none = exposed; written only with ep > 1. Given to an estimate, that "
        "overlap is priced (planner.cost.pins); None: the best the stack runs for the layout"))
    cp_comm_type: str | None = Field(default=None, max_length=40, description=(
        "the context-parallel flavour the cost priced (planner.cost.context_parallel.choose), in the profile's "
        "spelling (Megatron-Core --cp-comm-type p2p / all_gather / a2a; torchtitan allgather); written only with "
        "cp > 1. Given to an estimate, that flavour is priced (planner.cost.pins); None: the fastest the stack runs"))

    @model_validator(mode="after")
    def _check(self) -> "Parallelism":
        if sorted(self.axis_order) != sorted(AXES):
            raise ValueError(f"axis_order={list(self.axis_order)} must be a permutation of {list(AXES)}")
        try:
            self.dims.check()
        except BadInputError as exc:  # pydantic reports a ValueError under the field path
            raise ValueError(str(exc)) from None
        return self

    @model_serializer(mode="wrap")
    def _omit_plain_dp(self, handler):
        """Leave dp_replicate out when it is 1 and compression when it is none, so plans without HSDP or
        compression serialise byte-identically to before."""
        return without(handler(self), dp_replicate=self.dp_replicate == 1, compression=not self.compression.methods,
                       moe_dispatcher=self.moe_dispatcher is None, moe_overlap=self.moe_overlap is None,
                       cp_comm_type=self.cp_comm_type is None)

    @property
    def dims(self) -> ParallelDims:
        """The plan's degrees as the one record the planner reads them through (planner.schemas.dims)."""
        return ParallelDims(dp=self.dp, tp=self.tp, pp=self.pp, ep=self.ep, cp=self.cp, dp_replicate=self.dp_replicate)

    @property
    def world_size(self) -> int:
        return self.dims.world_size


class Batch(Schema):
    global_batch_size: int = Field(gt=0)
    microbatch_size: int = Field(gt=0)
    num_microbatches: int = Field(gt=0, description="per pipeline per step (gradient accumulation steps)")
    seq_len: int = Field(gt=0)


def check_recompute_modules(mode: str, modules: tuple[str, ...]) -> None:
    """Modules name what `selective` reruns: only with recompute selective, each once (Megatron-Core takes a list)."""
    if modules and mode != "selective":
        raise ValueError(f"recompute_modules={list(modules)} needs recompute='selective' (got {mode!r}): "
                         "pass --recompute selective, or no modules")
    if len(set(modules)) != len(modules):
        raise ValueError(f"recompute_modules={list(modules)} names a module twice: name each once")


class Recompute(Schema):
    mode: RecomputeMode = "none"
    full_layers: int = Field(default=0, ge=0, description="decoder layers of this stage fully recomputed on top of `mode`")
    modules: tuple[RecomputeModule, ...] = Field(default=(), description=(
        "what `selective` reruns, in Megatron-Core's --recompute-modules names; () = the framework's own selective "
        "(its profile's behaviour.memory.selective_recompute). Written only when set"))

    @model_serializer(mode="wrap")
    def _omit_default_modules(self, handler):
        """Leave modules out when empty, so plans without them serialise byte-identically to before."""
        return without(handler(self), modules=not self.modules)

    @model_validator(mode="after")
    def _check_modules(self) -> "Recompute":
        check_recompute_modules(self.mode, self.modules)
        return self


class StageMemory(Schema):
    stage: int = Field(ge=0)
    params_bytes: int = Field(ge=0)
    grads_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0)
    other_bytes: int = Field(ge=0, description="logits buffer, communication buffers, workspace and fragmentation allowance")
    peak_bytes: int = Field(ge=0)


class StageTime(Schema):
    forward_s: float = Field(ge=0, description="one micro-batch")
    backward_s: float = Field(ge=0, description="one micro-batch, recompute included")
    recompute_s: float = Field(default=0.0, ge=0)
    tp_comm_s: float = Field(default=0.0, ge=0)


class Stage(Schema):
    stage: int = Field(ge=0, description="virtual stage index; pipeline rank = stage % pp (zbv/dualpipev: V, stage or 2*pp-1-stage)")
    layers: tuple[str, ...] = Field(description="module FQNs of the executor model, in order")
    recompute: Recompute = Recompute()
    memory: StageMemory | None = None
    time: StageTime | None = None


class RankEntry(Schema):
    rank: int = Field(ge=0)
    node: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    coords: dict[str, int]


class Breakdown(Schema):
    compute_s: float = 0.0
    recompute_s: float = 0.0
    bubble_s: float = 0.0
    tp_comm_exposed_s: float = 0.0
    pp_comm_s: float = 0.0
    dp_comm_exposed_s: float = 0.0
    ep_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    optimizer_s: float = 0.0
    step_overhead_s: float = 0.0
    grad_accum_s: float = Field(default=0.0, description="gradients summed over micro-batches outside the GEMMs "
                                "(planner.cost.grad_accumulation), on the slowest pipeline rank")


class Prediction(Schema):
    step_time_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    model_tflops_per_gpu: float = Field(ge=0, description="6*N*T convention plus attention (Megatron/PaLM MFU), no recompute")
    hardware_tflops_per_gpu: float = Field(ge=0, description="counts recomputed FLOPs (HFU convention)")
    mfu: float = Field(ge=0)
    hfu: float = Field(ge=0)
    breakdown: Breakdown
    error_band: float | None = Field(default=None, ge=0, description=(
        "90th percentile of |step-time error| of the device family x stack's published runs predicted "
        "leave-one-source-out (benchmarks/accuracy.py): 9 in 10 measured steps fell within step_time_s x (1 +/- "
        "error_band); null where the family has no published runs"))


class TracedRank(Schema):
    """One rank's training step traced under fake tensors (planner.executor.memtrace): its peak and, at the peak,
    the bytes of each part (workspace in other_bytes)."""

    rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    peak_bytes: int = Field(ge=0)
    params_bytes: int = Field(ge=0)
    grads_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0)
    transient_bytes: int = Field(ge=0)
    other_bytes: int = Field(ge=0)


class TracedMemory(Schema):
    """The plan's memory counted from the executor's own step (the `planner` stack), or why it was not."""

    peak_bytes: int | None = Field(default=None, ge=0, description="the largest traced rank peak; null: not traced")
    fits: bool | None = None
    ranks: tuple[TracedRank, ...] = ()
    note: str = ""


class MemoryReport(Schema):
    peak_bytes: int = Field(ge=0)
    capacity_bytes: int = Field(ge=0)
    fits: bool
    per_stage: tuple[StageMemory, ...]
    traced: TracedMemory | None = Field(default=None, description=(
        "the peak traced from the executor's step (planner.executor.memtrace); written only when asked for"))

    @model_serializer(mode="wrap")
    def _omit_untraced(self, handler):
        """Leave `traced` out when absent, so plans made without the trace serialise byte-identically to before."""
        return without(handler(self), traced=self.traced is None)


class Alternative(Schema):
    parallelism: Parallelism
    batch: Batch
    schedule: Schedule
    recompute: RecomputeMode
    step_time_s: float
    peak_bytes: int
    why_not: str
    traced_peak_bytes: int | None = Field(default=None, description="its traced peak (planner.executor.memtrace); written only when traced")
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=(), description="what its selective reruns (written only when set)")

    @model_serializer(mode="wrap")
    def _omit_untraced(self, handler):
        return without(handler(self), traced_peak_bytes=self.traced_peak_bytes is None,
                       recompute_modules=not self.recompute_modules)


class SolverStats(Schema):
    """No wall-clock values here: the same request must give a byte-identical plan."""

    configurations_considered: int = Field(default=0, ge=0)
    configurations_evaluated: int = Field(default=0, ge=0)
    ilp_calls: int = Field(default=0, ge=0)
    dp_calls: int = Field(default=0, ge=0)
    version: str = ""


class ProcessGroup(Schema):
    axis: str
    size: int = Field(gt=0)
    spans_nodes: bool
    bandwidth_GBps: float = Field(ge=0)
    latency_s: float = Field(ge=0)


class LaunchPlan(Schema):
    schema_version: Literal["1"] = PLAN_SCHEMA_VERSION
    kind: Literal["estimate", "plan"]
    request: PlanRequest
    parallelism: Parallelism
    batch: Batch
    schedule: Schedule
    stages: tuple[Stage, ...]
    ranks: tuple[RankEntry, ...]
    process_groups: tuple[ProcessGroup, ...] = ()
    prediction: Prediction
    memory: MemoryReport
    feasible: bool = True
    infeasible_reasons: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    pruned: dict[str, int] = Field(default_factory=dict)
    solver: SolverStats = SolverStats()
    notes: tuple[str, ...] = ()


class Configuration(Schema):
    """One fully given configuration, as `planner estimate` takes it (Megatron-style flags)."""

    parallelism: Parallelism
    microbatch_size: int = Field(default=1, gt=0)
    schedule: Schedule = DEFAULT_SCHEDULE.name
    recompute: RecomputeMode = "none"
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=(), description=(
        "with recompute selective: the modules rerun, Megatron-Core --recompute-modules names; () = the framework's own"))
    stage_layers: tuple[int, ...] | None = Field(
        default=None, description="decoder layers per virtual stage (pp*vpp entries); None = balanced split"
    )

    @model_validator(mode="after")
    def _check_modules(self) -> "Configuration":
        check_recompute_modules(self.recompute, self.recompute_modules)
        return self

