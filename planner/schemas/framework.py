"""Framework profile: what one software stack (and version range) can run, how it runs it, and how it is spelled.

One YAML file per stack under `frameworks/` (megatron-core, torchtitan, deepspeed, planner = our executor). The
search reads `capabilities` (only what the stack runs is explored), the cost model reads `behaviour` (which
communication the stack overlaps, its kernels and memory habits: planner.schemas.framework_behaviour), the exporters
read `export` (flag and key names of that version). Every section carries `source`: the file, flag or document of
that framework the facts come from.
"""

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from planner.schedules import NAMES as SCHEDULE_NAMES
from planner.schemas.base import Schema
from planner.schemas.compression import CompressionMethod
from planner.schemas.dims import LAYOUT_AXES
from planner.schemas.framework_behaviour import Behaviour, Sourced

# MoE token dispatchers by Megatron-Core's --moe-token-dispatcher-type names (flex = DeepEP's per-node deduplicated
# dispatch): a stack's capabilities.expert_parallel.flavours, a plan's Parallelism.moe_dispatcher
MoeDispatcher = Literal["alltoall", "flex", "allgather"]
DISPATCHERS = get_args(MoeDispatcher)

FRAMEWORK_SCHEMA_VERSION = "1"

# our schedule names (planner.schedules.NAMES, as planner.schemas.plan.Schedule): the search proposes
# SEARCHED_BY_DEFAULT; torch's V-shaped and interleaved zero-bubble schedules are run by name where a stack has them
CanonicalSchedule = Literal[SCHEDULE_NAMES]
ConditionField = Literal["dp", "tp", "pp", "cp", "ep", "vpp", "sp", "zero_stage", "schedule", "recompute", "tp_overlap",
                         "is_moe", "precision", "microbatch_size", "dp_replicate"]


class ScheduleEntry(Schema):
    """A pipeline schedule the stack runs: our name (the cost model's) and the stack's own spelling."""

    name: CanonicalSchedule
    native_name: str = Field(min_length=1, description="the stack's own name (flag value, class or function)")
    source: str = Sourced


class InterleavedSplit(Schema):
    """How the interleaved schedule may split decoder layers over pp*vpp model chunks."""

    equal_chunks: bool = Field(description="every chunk holds num_layers/(pp*vpp) layers (the classic rule)")
    embedding_slot: bool = Field(description="the embedding may take one layer slot of the first chunk "
                                             "(Megatron --account-for-embedding-in-pipeline-split)")
    loss_slot: bool = Field(description="the loss may take one layer slot of the last chunk "
                                        "(Megatron --account-for-loss-in-pipeline-split)")
    uneven_first_last: bool = Field(description="first/last pipeline stage may hold a different layer count "
                                                "(Megatron --decoder-first/last-pipeline-num-layers)")
    layout: bool = Field(description="an explicit per-chunk layout string (Megatron --pipeline-model-parallel-layout)")
    empty_chunks: Literal["none", "ends", "any"] = Field(
        default="none", description="which virtual stages may hold no decoder layer: none; the ends (the first only "
        "the embedding, the last only norm, head and loss: torchtitan's module names per model part); any (Megatron's "
        "layout: 'Empty stages are allowed')")
    microbatches_divisible_by_pp: bool = Field(description="num_microbatches must be a multiple of pp")
    source: str = Sourced


class Recompute(Schema):
    modes: tuple[Literal["none", "selective", "full"], ...] = Field(min_length=1)
    partial_full: bool = Field(description="full recompute of only some layers per stage (e.g. --recompute-num-layers)")
    selective_modules: tuple[str, ...] = Field(default=(), description="what `selective` recomputes, in the stack's names")
    module_sets: tuple[tuple[str, ...], ...] = Field(default=(), description=(
        "recompute module sets (of selective_modules) the search tries for MoE models beside the stack's own "
        "selective, each cited in `source`; a set's modules the model lacks are dropped"))
    full_methods: tuple[str, ...] = Field(default=(), description="how `full` picks layers (uniform, block, every-n)")
    source: str = Sourced


class Zero(Schema):
    stages: tuple[Literal[0, 1, 2, 3], ...] = Field(min_length=1, description="ZeRO stages the stack runs without PP")
    stages_with_pp: tuple[Literal[0, 1, 2, 3], ...] = Field(description="ZeRO stages it runs with pp > 1")
    hsdp: bool = Field(description="a replicate x shard data-parallel mesh (hybrid sharding)")
    source: str = Sourced


class Feature(Schema):
    """An on/off capability with the stack's flavours of it."""

    supported: bool
    flavours: tuple[str, ...] = ()
    source: str = Sourced


class ContextParallel(Feature):
    """Context parallelism; `flavours` lists the stack's default first (what a run that names none ran)."""

    with_pp: bool = Field(description="context parallelism combined with pipeline parallelism")


class ExpertParallel(Feature):
    """Expert parallelism; `flavours` are the token dispatchers the stack runs, in Megatron-Core's
    --moe-token-dispatcher-type names (alltoall, allgather, flex = DeepEP's per-node deduplicated dispatch): the
    one list the cost chooses among (planner.cost.stack, moe_comm) and a stated dispatcher is checked against."""

    span: Literal["dp", "dp_cp", "tp_dp_cp"] = Field(
        description="the ranks expert groups are carved from: dp only, dp*cp (Megatron before folding), or "
                    "tp*dp*cp (MoE parallel folding: a separate expert mesh ep x etp over the same ranks)")

    @model_validator(mode="after")
    def _dispatchers(self) -> "ExpertParallel":
        unknown = [name for name in self.flavours if name not in DISPATCHERS]
        if unknown:
            raise ValueError(f"flavours={list(self.flavours)}: {unknown} are not token dispatchers; use "
                             f"{', '.join(DISPATCHERS)}")
        if self.supported and "alltoall" not in self.flavours:
            raise ValueError(f"flavours={list(self.flavours)}: a stack with expert parallelism runs the flat all-to-all "
                             "(alltoall); list it")
        return self


class Exclusion(Schema):
    """A combination the stack refuses: every condition in `when` holds -> refused with `reason`.

    A condition value is a literal (equal), a list (one of) or a string ">N" / "<N" (numeric comparison)."""

    key: str = Field(pattern=r"^[a-z0-9_]+$", description="the `pruned` counter this rule adds to")
    when: dict[ConditionField, bool | int | str | list[int | str]] = Field(min_length=1)
    reason: str = Field(min_length=1, description="why, and what to change (shown to the user); {field} slots take the "
                                                  "configuration's values, e.g. {zero_stage}")
    source: str = Sourced


class CompressionEntry(Schema):
    """A communication compression the stack runs (planner.schemas.compression), where it runs it, and its name."""

    method: CompressionMethod
    zero_stages: tuple[Literal[0, 1, 2, 3], ...] = Field(min_length=1, description="the ZeRO stages it runs with")
    with_pp: bool = Field(description="runs with pipeline parallelism (pp > 1)")
    native: str = Field(min_length=1, description="the stack's flag, config key or hook")
    grad_buffer_bytes: float | None = Field(default=None, gt=0, le=4, description=(
        "bytes per parameter of the gradient buffer under this method where the method sets the buffer's dtype "
        "(Megatron's --grad-reduce-in-bf16: the DDP buffer in the parameter dtype); None: the buffer is unchanged"))
    source: str = Sourced


# model architecture features a stack may lack (predicates: planner.models.features.MODEL_FEATURES)
ModelFeature = Literal["parallel_residual", "chunked_attention", "sliding_window_attention", "attention_sinks",
                       "bias_free_layernorm", "lm_head_bias", "learned_expert_score_bias", "sigmoid_unnormalized_topk",
                       "partial_linear_bias", "four_norms_per_layer", "projection_qk_norm", "geglu", "alibi",
                       "learned_positions", "mla", "moe", "layernorm", "plain_ffn", "shared_expert_gate",
                       "one_norm_per_layer", "embedding_norm", "linear_attention", "mamba_layers",
                       "attention_output_gate", "qk_norm_after_rope", "activation_multipliers", "no_position_encoding",
                       "multi_token_prediction"]


class ModelRule(Schema):
    """A model feature the stack cannot build: a model that has it is refused for this stack (plan, estimate, export)."""

    feature: ModelFeature
    reason: str = Field(min_length=1, description="why the stack cannot build it (shown after the feature's name)")
    source: str = Sourced


class RankOrder(Schema):
    """How the stack lays global ranks over the axes, outermost first (our axes: pp, dp, cp, tp; expert groups are
    carved from the dp x cp ranks, planner.topology.placement)."""

    axes: tuple[Literal[LAYOUT_AXES], ...] = Field(min_length=4, max_length=4, description="outermost first")
    native: str = Field(min_length=1, description="the stack's own spelling of the order")
    source: str = Sourced

    @field_validator("axes")
    @classmethod
    def _permutation(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if sorted(value) != sorted(LAYOUT_AXES):
            raise ValueError(f"rank_order.axes={list(value)} must be a permutation of {list(LAYOUT_AXES)}")
        return value


class Capabilities(Schema):
    precisions: tuple[Literal["bf16", "amp-bf16", "fp32", "fp8"], ...] = Field(min_length=1)
    fp8_recipes: tuple[str, ...] = ()
    schedules: tuple[ScheduleEntry, ...] = Field(min_length=1)
    interleaved_split: InterleavedSplit
    stale_weights: bool = Field(description="runs PipeDream-2BW's one-step-delayed update (opt-in by the user)")
    recompute: Recompute
    zero: Zero
    sequence_parallel: Feature
    tp_overlap: tuple[Literal["none", "domino"], ...] = Field(min_length=1, description="TP overlap the planner can ask of it")
    context_parallel: ContextParallel
    expert_parallel: ExpertParallel
    tied_embeddings_across_stages: Feature
    torch_pipelining: bool = Field(default=False, description=(
        "pipeline schedules are torch.distributed.pipelining's classes, with their constructors' micro-batch rules "
        "(planner.frameworks.torch_schedule_rule)"))
    exclusions: tuple[Exclusion, ...] = ()
    compression: tuple[CompressionEntry, ...] = Field(default=(), description=(
        "communication compression the stack runs (the search explores only these; none is always allowed)"))
    unsupported_models: tuple[ModelRule, ...] = Field(default=(), description="model features the stack cannot build")
    rank_order: RankOrder | None = Field(default=None, description=(
        "the stack's fixed layout of ranks over the parallel axes: a plan for it is placed and priced in this order; "
        "None = the planner chooses (our executor)"))
    source: str = Sourced

    @field_validator("schedules")
    @classmethod
    def _unique(cls, value: tuple[ScheduleEntry, ...]) -> tuple[ScheduleEntry, ...]:
        names = [s.name for s in value]
        if len(set(names)) != len(names):
            raise ValueError(f"schedules name {names}: each schedule once")
        return value


class ExportNaming(Schema):
    """How a plan is spelled for this stack: the exporter and its flag or config-key names."""

    exporter: Literal["megatron", "torchtitan", "deepspeed", "torchrun"]
    names: dict[str, str] = Field(description="our concept -> the stack's flag or key")
    source: str = Sourced


class Practice(Schema):
    """What the stack is known to run well: the subset of its capabilities its own recipes and the published runs
    use. When a plan outside it is predicted faster than the best plan inside it by less than the ranking band
    (planner.cost.calibration), the search prefers the one inside (planner.search.practice). Empty tuples: no
    preference on that field (everything the stack runs is practice)."""

    schedules: tuple[CanonicalSchedule, ...] = ()
    zero_stages: tuple[Literal[0, 1, 2, 3], ...] = ()
    recompute: tuple[Literal["none", "selective", "full"], ...] = ()
    sequence_parallel_with_tp: bool = Field(default=False, description="tp > 1 runs with sequence parallelism")
    min_layers_per_virtual_stage: int = Field(default=1, ge=1, description="interleaved: decoder layers per virtual "
                                              "stage at least (num_layers / (pp * vpp))")
    source: str = Field(default="no stated practice: every configuration the stack runs", min_length=1)


class FrameworkProfile(Schema):
    schema_version: Literal["1"] = FRAMEWORK_SCHEMA_VERSION
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    display_name: str = Field(min_length=1)
    versions: str = Field(min_length=1, description="the version range these facts hold for")
    description: str = ""
    capabilities: Capabilities
    behaviour: Behaviour
    export: ExportNaming
    practice: Practice = Practice()

    def schedule_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.capabilities.schedules)

    def native_schedule(self, name: str) -> str:
        """The stack's own name of one of our schedules (KeyError when it does not run it)."""
        return {s.name: s.native_name for s in self.capabilities.schedules}[name]
