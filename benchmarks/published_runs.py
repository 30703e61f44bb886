"""One general conversion of a published run (validation/published_runs.json) into what the cost model
evaluates: the model, the cluster, the software stack, the published settings, and the measured step time.

No table of per-run settings. What a source leaves unsaid is resolved by stated rules, the same for every run:
- architecture: an unsaid activation is GeLU with ffn = 4h (the GPT-3 convention); an unsaid vocabulary is 51200
  (GPT-2 BPE padded to a multiple of 1024, as GPT-3-style Megatron models); gated activations imply RMSNorm and
  RoPE (Llama convention), others LayerNorm and the run's `position` (else learned); an MoE block's fields under
  their usual spellings (published_model._moe_spec): an unsaid or zero capacity factor is dropless, an unsaid
  MoE frequency every layer, group-limited routing only where both the groups and the groups per token are given;
  multi-token prediction modules where a model field or the text states their depth, not negated
  (published_model.mtp_of; a bare mention of MTP reads as none), on the last stage of the default split; a stated
  head width (head_dim, kv_channels) is read whatever hidden / heads is; the attention of a model the text names
  that the run's fields cannot say (head width, q/k norms, attention biases, sliding-window layers, sinks) is the
  named model's own, its shipped preset's, where the preset has the run's depth, width and heads
  (`named_model_architecture`, published_model.named_architecture);
- cluster: the shipped node preset of the GPU (A100 40/80 GB, H100, H800, H200, B200, MI300X; V100 as the DGX-2
  node; the AWS node of the GPU where the interconnect is EFA) scaled to the run's GPUs, with the published GPUs
  per node, NICs per node and NIC line rate where stated (achieved = 92% of line rate, the preset's ratio); a
  stated node size with unsaid NICs keeps the preset's NICs per GPU;
- stack: `stack_of` maps the run's `training.framework` text to a profile under frameworks/ (first pattern of
  STACK_RULES outside parentheses, else anywhere, else DEFAULT_STACK): Megatron-Core, NeMo and Megatron-Bridge -> megatron-core, Megatron-LM
  -> megatron-lm (2021-22, before Megatron-Core) for sources before 2023 (arXiv id or title year), else
  megatron-core, torchtitan -> torchtitan, Composer/FairScale FSDP or any trainer named with FSDP ->
  pytorch-fsdp, DeepSpeed/GPT-NeoX/Megatron-DeepSpeed (and ZeRO-3 rows naming DeepSpeed) -> deepspeed, HAI-LLM ->
  hai-llm;
- precision (`precision_of`): "fp8" in the text -> fp8 unless negated ("not trained in FP8", "no FP8", "without
  FP8", "non-FP8": NEGATED_FP8); a text naming no precision whose stated throughput exceeds the GPU's bf16 dense
  peak (TFLOP/s per GPU, or 6 x active parameters x tokens/s per GPU) ran fp8 (no bf16 run can); otherwise bf16;
- GPU variants (`device_of`): the preset's device with the source's stated memory (gpu_memory_gib) and bf16 peak
  (peak_tflops_bf16_fp16_dense) where they differ from the preset's (H100 96 GB, H20 on the H100 node); a part
  stated at a power below its preset's board power (H100 at 500 W) whose source states no peak is refused (its
  sustained clock, hence its peak, is stated nowhere), as is an H20 without a stated peak;
- sequence length (`seq_len_of`): the stated one, else the named model's own default (the shipped preset
  planner/models/presets/<name>.yaml whose name the run's model text contains: its seq_len is the model's
  pre-training length), else the run is refused;
- recompute unsaid (`recipe_recompute`): what the stack's own recipe runs for a model of that size: the recipe of
  the profile's behaviour.defaults.recompute_recipes (each cited in its recompute_source) nearest the run's model
  in log total parameters among recipes of the same kind (dense / MoE; any kind where none is), between recipes
  of one size the one made for the nearest device memory, with its recompute modules where it names them, or
  full where that does not fit (a run that ran fitted); a stack that records no recipe: the planner's choice below;
- dropout: no source states it. Gated activations imply none (the Llama convention, as for RMSNorm and RoPE:
  Llama, Mixtral, DeepSeek and Qwen configs set 0); otherwise the model spec leaves it unsaid (ModelSpec.dropout
  None) and the stack's default applies (frameworks/<stack>.yaml behaviour.defaults: 2021-22 Megatron-LM and
  Megatron-DeepSpeed default to 0.1 attention and hidden dropout; Megatron-Core's large-model recipes and the
  other stacks train without);
- pipeline interleaving that a source calls "not stated" (or "no interleaving stated") with 1F1B is plain 1F1B;
- a pipeline split no source states (`split_unstated_is_planned`, accuracy_cases.planned_split): the even split
  where the decoder and MTP layers divide over the pp x vpp stages (every stack's default then); otherwise the run
  chose some uneven split unsaid, read as the planner's split for its settings (the search's stage-partition DP,
  the stack's uneven forms for vpp > 1), as Megatron-Bridge's DeepSeek-V3 layouts give the MTP stage fewer layers;
- context parallelism's flavour, which no source names (`cp_flavour_of`): the stack's default;
- an MoE run's token dispatcher and overlap (`moe_overrides_of`, benchmarks/published_moe.py): those its text
  states (Megatron-Core flag names, DeepEP), within those its Megatron-Core release had (a stated version, else the
  source's year); unsaid, the planner's choice among the rest;
- a run whose text says it used torch.compile (not negated) ran its norms, activations and RoPE fused (inductor),
  whatever eager ops its stack's profile lists (`eager_ops_of`); unsaid, the profile's default (torchtitan: no
  compile);
- a run made with NeMo (its framework text names NeMo or Megatron-Bridge, whose perf_recipes are NeMo's; the stack
  is Megatron-Core) ran NeMo's performance recipe:
  16-bit gradient buffers, and under fp8 fp8 parameters gathered in fp8 (`recipe_bytes_of`);
- a recompute text naming Megatron-Core recompute modules (`recompute_modules_of`: one of core_attn, mla_up_proj,
  moe_act or shared_experts, or the words recompute_modules / recompute-modules, then every module name it
  holds) on a stack whose selective recompute takes those names is selective recompute of exactly those modules
  (transformer_config.py recompute_modules; NeMo's recommended_model_configs CSV column of that name);
- torchtitan's "selective layer" checkpointing is every second layer fully recomputed (`layer_checkpoint_every`:
  selective_ac_option "2", the default of the published runs' code), its "selective op" the profile's per-op policy;
- settings the source leaves unsaid (micro-batch size, recompute, ZeRO stage, sequence parallelism, pipeline
  schedule and interleaving depth, an MoE model's expert parallelism: `expert_choices`, 1 among them, the stacks'
  default --expert-model-parallel-size): the planner's own best choice (the fastest that fits) among the values the
  stack runs, with every published setting fixed (`settings`); an unsaid recompute is none or full (selective
  recomputation, Korthikanti et al. 2022, is named by every source that used it); the measurement is the run's
  step time (`measured_step_s`);
- skipped (`skip_reason`): no node preset for the GPU, no parallel configuration, no throughput, or a throughput
  published only as an upper bound ("up to"), which no step time equals; an unsaid dp is GPUs / (tp pp cp).
The cluster and GPU rules live in benchmarks/published_hardware.py, the architecture, precision, sequence-length
and batch rules in benchmarks/published_model.py; this module re-exports them as the conversion's one interface.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from published_hardware import (  # noqa: F401 - read off this module by accuracy.py and the tests
    device_family, device_of, topology, topology_preset, variant_refusal)
from published_moe import moe_options
from published_model import (  # noqa: F401 - idem
    NEMO_RECIPE_BYTES, activation_of, global_batch, implied_tflops, model_spec, mtp_of, precision_of, recipe_bytes_of,
    runs_nemo_recipe, seq_len_of)

from planner.cost.pins import dispatchers_run
from planner.cost.selective import MODULES
from planner.cost.stack import options_for
from planner.frameworks import load_framework

# Ordered: the first pattern found in training.framework (lower case) names the stack.
STACK_RULES = (
    ("megatron-core", "megatron-core"),
    ("nemo", "megatron-core"),  # NeMo 2.x trains through Megatron-Core (nemo/lightning/megatron_parallel.py)
    ("megatron-bridge", "megatron-core"),  # NeMo's Megatron-Core trainer (src/megatron/bridge/training/)
    ("megatron bridge", "megatron-core"),
    ("hai-llm", "hai-llm"),
    ("torchtitan", "torchtitan"),
    ("composer", "pytorch-fsdp"),
    ("fairscale", "pytorch-fsdp"),
    ("fsdp", "pytorch-fsdp"),  # any trainer over PyTorch FSDP (OLMo, Lightning, Accelerate) runs its collectives
    ("deepspeed", "deepspeed"),
    ("gpt-neox", "deepspeed"),
    ("megatron-lm", "megatron-lm"),
)
DEFAULT_STACK = "megatron-core"  # a stack without a profile: the best-documented optimised stack
MEGATRON_CORE_YEAR = 2023  # Megatron-LM's training loop on Megatron-Core (core_r0.1+, flash attention) from 2023
MICROBATCH_CHOICES = (1, 2, 4, 8, 16)
VPP_CHOICES = (2, 3, 4, 6, 8)


def stack_of(run: dict) -> str:
    """The software stack of a run: the first STACK_RULES pattern in the framework text outside parentheses, else
    in the whole text, else DEFAULT_STACK; a ZeRO-3 row whose text names DeepSpeed ran DeepSpeed's ZeRO-3."""
    text = (run["training"].get("framework") or "").lower()
    if "deepspeed" in text and zero_of(run) == 3:
        return "deepspeed"
    outside = re.sub(r"\(.*?\)", "", text)  # a parenthesised qualifier names a stack only when nothing outside does
    for part in (outside, text):
        found = next((stack for pattern, stack in STACK_RULES if pattern in part), None)
        if found == "megatron-lm" and (source_year(run) or 0) >= MEGATRON_CORE_YEAR:
            return "megatron-core"  # Megatron-LM has run on Megatron-Core (flash attention, overlaps) since 2023
        if found:
            return found
    return DEFAULT_STACK


DEEPSPEED_COALESCED_GATHER_YEAR = 2022  # deepspeedai/DeepSpeed #1188 (2021-10-31, v0.5.6): coalesced ZeRO-3 all-gather
LEGACY_PROFILES = {"deepspeed": ("legacy/deepspeed-2021", DEEPSPEED_COALESCED_GATHER_YEAR)}


def profile_of(run: dict, stack: str) -> str:
    """The profile a run's stack ran as: a source older than a stack's profiled release runs the legacy profile
    of planner/data/frameworks/legacy/ (DeepSpeed sources of 2021 predate v0.5.6: planner/data/frameworks/legacy/deepspeed-2021.yaml),
    else the stack's own. The stack name still names the calibration cell."""
    legacy, year = LEGACY_PROFILES.get(stack, (None, 0))
    return legacy if legacy and (source_year(run) or year) < year else stack


def source_month(run: dict) -> tuple[int, int] | None:
    """(year, month) of an arXiv source from its id's yymm; None for any other source."""
    found = re.search(r"arxiv\.org/(?:abs|pdf)/(\d{2})(\d{2})\.", (run.get("source") or {}).get("url") or "")
    return (2000 + int(found.group(1)), int(found.group(2))) if found else None


def source_year(run: dict) -> int | None:
    """The year of the source: an arXiv id's yymm (source_month), else a 4-digit year in the title; None when
    neither says."""
    month = source_month(run)
    if month:
        return month[0]
    years = re.findall(r"\b(20\d{2})\b", (run.get("source") or {}).get("title") or "")
    return int(years[-1]) if years else None


def source_of(run: dict) -> str:
    return run["source"]["title"].split(" (")[0][:48]


def zero_of(run: dict) -> int | None:
    """The published ZeRO stage; FSDP full sharding is ZeRO-3; None when unsaid."""
    zero = run["training"].get("zero_stage")
    if isinstance(zero, str):
        return 3 if re.search(r"fsdp|zero-3", zero.lower()) else int(re.findall(r"\d", zero)[0])
    return zero


@dataclass(frozen=True)
class Settings:
    """Published settings (None = unsaid) and, per unsaid field, the values the stack runs (choices);
    `full_every`: every n-th decoder layer fully recomputed on top of the base mode (layer_checkpoint_every)."""

    fixed: dict
    choices: dict = field(default_factory=dict)
    full_every: int | None = None


TORCHTITAN_LAYER_AC_EVERY = 2  # torchtitan config_manager.py (613bfd0): --activation_checkpoint.selective_ac_option "2"


def layer_checkpoint_every(run: dict, stack: str) -> int | None:
    """torchtitan's "selective layer" activation checkpointing (selective_ac_option an int, default "2": "checkpoint
    every other layer", torchtitan/config_manager.py at 613bfd0; parallelize_llama.py checkpoint_wrapper wraps every
    x-th block in full checkpointing): every second layer fully recomputed, none on the others; None otherwise."""
    text = (run["training"].get("recompute") or "").lower()
    return TORCHTITAN_LAYER_AC_EVERY if stack == "torchtitan" and "selective layer" in text else None


MODULE_MARKERS = ("core_attn", "mla_up_proj", "moe_act", "shared_experts", "recompute_modules", "recompute-modules")


def recompute_modules_of(run: dict, stack: str, off: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Megatron-Core recompute modules a run's recompute text names, in Megatron's order (planner.cost.selective
    MODULES), where the stack's selective takes them; () otherwise or with the rule `off`."""
    text = (run["training"].get("recompute") or "").lower()
    if "recompute_modules_named" in off or not any(marker in text for marker in MODULE_MARKERS):
        return ()
    if not set(MODULES) <= set(load_framework(stack).capabilities.recompute.selective_modules):
        return ()
    words = set(re.findall(r"[a-z_]+", text))
    return tuple(m for m in MODULES if m in words)


def recompute_of(run: dict) -> str | None:
    text = (run["training"].get("recompute") or "").lower()
    if not text:
        return None
    if text.startswith("none"):
        return "none"
    return "selective" if ("selective" in text or "recompute rmsnorm" in text) else "full"


READING_RULES = ("interleaving_unstated_is_1f1b", "recompute_unstated_is_recipe", "recompute_modules_named",
                 "ep_unstated_is_chosen",
                 "selective_layer_is_every_other_layer", "cp_flavour_unstated_is_default",
                 "nemo_performance_recipe", "compiled_runs_fuse_pointwise_ops", "mtp_depth_stated",
                 "moe_settings_stated", "megatron_core_version_features", "split_unstated_is_planned",
                 "grad_accumulation_stated", "named_model_architecture")  # accuracy.py can switch off

COMPILED = re.compile(r"torch\.compile|\bcompiled?\b")
NOT_COMPILED = re.compile(r"\b(?:no|not|without)\b[\w\s.-]{0,20}?compile|compile\s*[:=]?\s*(?:false|off|disabled)")


def eager_ops_of(run: dict, off: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The components a run ran as eager op sequences where its text says it compiled: none (torch.compile's
    inductor fuses the pointwise ops of norms, activations and RoPE into generated kernels), overriding the
    profile's eager_ops (torchtitan without compile); None (the profile's) where the text does not say, says it
    did not compile, or with the rule `off`."""
    text = " ".join(str(run["training"].get(k) or "") for k in ("framework", "precision", "recompute")).lower()
    text += " " + (run.get("notes") or "").lower()
    if "compiled_runs_fuse_pointwise_ops" in off or not COMPILED.search(text) or NOT_COMPILED.search(text):
        return None
    return ()


def cp_flavour_of(run: dict, stack: str, off: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The context-parallel flavours a run is priced with: the stack's default (the first of its profile's
    capabilities.context_parallel.flavours: Megatron-Core --cp-comm-type default ['p2p'], arguments.py; torchtitan
    0.3 torch's all-gather rotation) where the run has cp > 1, since no source names its flavour; None (the profile's
    choices, the fastest) with cp 1 or the rule `off`."""
    if (run["parallel"].get("cp") or 1) <= 1 or "cp_flavour_unstated_is_default" in off:
        return None
    flavours = load_framework(stack).capabilities.context_parallel.flavours
    return flavours[:1] or None


def moe_overrides_of(run: dict, stack: str, precision: str, off: tuple[str, ...] = ()) -> dict:
    """The CostOptions fields (moe_dispatchers, moe_overlap, moe_shared_overlap) an MoE run's layers are priced
    with where its release or its text narrows what its stack runs (published_moe.moe_options); {} for a dense
    run or where nothing narrows."""
    if model_spec(run, off).moe is None:
        return {}
    options = options_for(profile_of(run, stack), precision)
    found = moe_options(options, run, stack=stack, year=source_year(run), off=off)
    changed = {name: getattr(found, name) for name in ("moe_overlap", "moe_shared_overlap")
               if getattr(found, name) != getattr(options, name)}
    if set(found.moe_dispatchers) != set(dispatchers_run(options)):  # all of them: the profile's own choice
        changed["moe_dispatchers"] = found.moe_dispatchers
    return changed


def recipe_recompute(run: dict, stack: str):
    """The recipe the stack's own recipes run for the run's model (a RecipeRecompute: mode and modules; None: the
    profile records no recipe): the recipe nearest in log total parameters, among those of the run's kind (dense
    or MoE) where the profile has any; between recipes of one size, the one made for the device memory nearest
    the run's (NeMo's per-GPU configuration files differ: DeepSeek-V3 recomputes modules on 80 GB, none on 180 GB)."""
    from planner.models import counting

    recipes = load_framework(stack).behaviour.defaults.recompute_recipes
    if not recipes:
        return None
    spec = model_spec(run)
    same = [r for r in recipes if r.moe == (spec.moe is not None)] or list(recipes)
    params_b = counting.total_params(spec) / 1e9
    memory_gib = device_of(run).memory_bytes / 2**30 if topology_preset(run) else None  # no preset: any recipe

    def distance(r) -> tuple[float, float, float]:
        memory = abs(math.log(memory_gib / r.gpu_memory_gib)) if r.gpu_memory_gib and memory_gib else 0.0
        return round(abs(math.log(params_b / r.params_b)), 6), memory, r.params_b

    return min(same, key=distance)


def schedule_of(run: dict, off: tuple[str, ...] = ()) -> tuple[str | None, int | None]:
    """The published pipeline schedule. Interleaving a source calls "not stated" beside 1F1B is plain 1F1B: the
    stack's default without --num-layers-per-virtual-pipeline-stage (Megatron-LM arguments.py: virtual pipeline
    size None); with that rule `off`, unsaid (the planner's choice)."""
    train, pp = run["training"], run["parallel"].get("pp") or 1
    text = (train.get("pipeline_schedule") or "").lower()
    if pp == 1:
        return "1f1b", 1
    unstated = "not stated" in text or "no interleaving stated" in text  # interleaving unsaid: the rest of the text decides (1F1B)
    if unstated and "interleaving_unstated_is_1f1b" in off:
        return None, None
    if "interleav" in text and not unstated:
        vpp = train.get("virtual_pipeline_stages") or (int(m.group(1)) if (m := re.search(r"(\d+) interleaving", text)) else None)
        return "interleaved", vpp
    if "dualpipe" in text:  # bidirectional, backward split into input and weight parts: the zero-bubble family
        return "zero-bubble", 1
    if re.search(r"1f1b|pipedream-flush", text):
        return "1f1b", 1
    return None, None


def expert_choices(run: dict, dp_cp: int) -> tuple[int, ...]:
    """The expert-parallel degrees an MoE run whose source does not state one may have run: every divisor of its
    routed experts (model_spec's reading) that divides dp*cp (ep carved out of the data-parallel ranks), 1 first;
    () for a dense model."""
    moe = model_spec(run).moe
    if moe is None:
        return ()
    return tuple(d for d in range(1, moe.num_experts + 1) if moe.num_experts % d == 0 and dp_cp % d == 0)


def settings(run: dict, stack: str, off: tuple[str, ...] = ()) -> Settings:
    """Published settings and the choices for the unsaid ones (the stack's capabilities)."""
    par, train = run["parallel"], run["training"]
    caps = load_framework(stack).capabilities
    schedule, vpp = schedule_of(run, off)
    tp, pp, cp = par.get("tp") or 1, par.get("pp") or 1, par.get("cp") or 1
    dp = par.get("dp") or par["num_gpus"] // (tp * pp * cp)
    fixed = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=par.get("ep") or 1,
                 sp=par.get("sp"), microbatch_size=train.get("micro_batch"), recompute=recompute_of(run),
                 zero_stage=zero_of(run), schedule=schedule, vpp=vpp)
    modules = recompute_modules_of(run, stack, off)
    if modules:  # selective recompute of the named modules (recompute_modules_of)
        fixed.update(recompute="selective", recompute_modules=modules)
    every = layer_checkpoint_every(run, stack) if "selective_layer_is_every_other_layer" not in off else None
    if every:  # full recompute of every n-th layer on a base of none (Settings.full_every)
        fixed["recompute"] = "none"
    choices = {}
    experts = expert_choices(run, dp * cp) if par.get("ep") is None and "ep_unstated_is_chosen" not in off else ()
    if len(experts) > 1:  # unsaid expert parallelism: the planner's choice among the degrees the experts allow
        choices["ep"] = experts
    if fixed["sp"] is None:
        choices["sp"] = (False, True) if fixed["tp"] > 1 and caps.sequence_parallel.supported else (False,)
    if fixed["microbatch_size"] is None:
        choices["microbatch_size"] = MICROBATCH_CHOICES
    unsaid = fixed["recompute"] is None
    recipe = recipe_recompute(run, stack) if unsaid and "recompute_unstated_is_recipe" not in off else None
    if unsaid and recipe is not None:  # the recipe's mode (and modules), else full where it does not fit
        choices["recompute"] = tuple(dict.fromkeys(m for m in (recipe.recompute, "full") if m in caps.recompute.modes))
        if recipe.modules:
            fixed["recompute_modules"] = recipe.modules  # for the selective choice only (accuracy_cases)
    elif fixed["recompute"] is None:  # selective recomputation (2022) is named by every source that used it
        choices["recompute"] = tuple(m for m in caps.recompute.modes if m != "selective")
    if fixed["zero_stage"] is None:
        choices["zero_stage"] = caps.zero.stages_with_pp if fixed["pp"] > 1 else caps.zero.stages
    if fixed["schedule"] is None:
        choices["schedule"] = tuple(s for s in ("1f1b", "interleaved") if s in [x.name for x in caps.schedules])
    if fixed["vpp"] is None:
        choices["vpp"] = VPP_CHOICES
    return Settings(fixed=fixed, choices=choices, full_every=every)


def measured_step_s(run: dict, model_flops: float, hardware_flops: float, peak_tflops: float) -> tuple[float, str] | None:
    """The run's step time and what it came from: the published step time, else tokens/s, else TFLOP/s per GPU in
    the source's convention (converted with this model's FLOP count of that convention), else MFU or HFU x peak.
    `model_flops`/`hardware_flops`: FLOPs of one step (all GPUs) without/with the recompute forward passes."""
    res, gpus = run["results"], run["parallel"]["num_gpus"]
    tokens = global_batch(run) * seq_len_of(run)
    if res.get("step_time_s"):
        return float(res["step_time_s"]), "step time"
    if res.get("tokens_per_s_per_gpu"):
        return tokens / (res["tokens_per_s_per_gpu"] * gpus), "tokens/s"
    if res.get("tokens_per_s"):
        return tokens / res["tokens_per_s"], "tokens/s"
    if res.get("tflops_per_gpu"):
        convention = (res.get("tflops_convention") or "").lower()
        model_conv = "model" in convention and "hardware" not in convention or "mfu" in convention
        flops = model_flops if model_conv else hardware_flops
        return flops / (res["tflops_per_gpu"] * 1e12 * gpus), "TFLOP/s (" + ("model" if model_conv else "hardware") + ")"
    if res.get("mfu_pct"):
        return model_flops / (res["mfu_pct"] / 100 * peak_tflops * 1e12 * gpus), "MFU"
    if res.get("hfu_pct"):
        return hardware_flops / (res["hfu_pct"] / 100 * peak_tflops * 1e12 * gpus), "HFU"
    return None


def skip_reason(run: dict) -> str | None:
    """Why a run cannot be evaluated (None: it can): not an NVIDIA GPU, no parallel configuration, no throughput,
    or a throughput published only as an upper bound ("up to"), which no step time equals."""
    if topology_preset(run) is None:
        return "no topology preset for this GPU"
    if variant_refusal(run):
        return variant_refusal(run)
    if seq_len_of(run) is None:
        return "no sequence length published and no shipped preset names the model"
    par = run["parallel"]
    if par.get("num_gpus") is None or (par.get("dp") is None and None in (par.get("tp"), par.get("pp"))):
        return "no parallel configuration published"
    res = run["results"]
    if not any(res.get(k) for k in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "tflops_per_gpu", "mfu_pct", "hfu_pct")):
        return "no throughput published"
    if not any(res.get(k) for k in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s")) and \
            "up to" in (res.get("tflops_convention") or "").lower():
        return "throughput published only as a bound ('up to'), not a measured step"
    return None
