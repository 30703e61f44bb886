"""The summaries benchmarks/accuracy.py prints beside the per-run table: the error with each source weighted once,
ranking within a source, and the ablation table (each stack-specific mechanism switched off, full
leave-one-source-out each).

Weighting: a source with n evaluated runs gives each of them weight 1/n, so every source weighs the same (one
MosaicML table of 77 runs counts as much as one DeepSeek-V3 report row); the weighted median is the smallest
|error| whose cumulative weight reaches half the total.

Ranking: within one source, the runs of one model (the same architecture, any sequence length or GPU count) on
one device are configurations a planner chooses among. Their measured and predicted (leave-one-source-out)
seconds per token per GPU are compared by Spearman's rank correlation, and the top-1 gap is how much slower (as
measured) the configuration the model ranks first is than the measured best.

Ablations: a mechanism is a CostOptions field a stack's profile sets (planner.cost.stack.options_for); switching it
off replaces the profile's value by the generic reading (CostOptions' default) for every run of every stack that
sets it, through accuracy.build_case(overrides=...), the same code path as the shipped model. A mechanism every
stack shares (an NCCL collective's cost) has no profile value: its row sets the field for every stack, or, for the
collective formula itself, swaps it for the earlier one while the runs are evaluated (ring_latency_per_node). The
default split's MTP slot is swapped for the plain split the same way (mtp_on_top).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
from collections import defaultdict

from planner.cost import comm, evaluate
from planner.cost.stack import options_for
from planner.cost.types import CostOptions

RING_LATENCY = "ring_latency_per_node"  # not a CostOptions field: the collective formula itself (ring_latency_per_node)
MTP_SLOT = "mtp_layers_on_top_of_the_last_stage"  # not a CostOptions field: the default split's MTP slot (mtp_on_top)


@contextlib.contextmanager
def ring_latency_per_node():
    """The ablation of comm.half_ring_latency_s: an all-gather or reduce-scatter across nodes charged the latency
    count in use before NCCL's (ranks_per_node-1 NVLink steps and nodes-1 network steps, as if hierarchical), for
    every stack; restored on exit."""
    original = comm.half_ring_latency_s

    def per_node(group, collective: str = "all_gather") -> float:
        if group.size <= 1 or not group.spans_nodes:
            return original(group, collective)
        _, latency = group.intra(collective)
        return (group.ranks_per_node - 1) * latency + (group.num_nodes - 1) * group.inter_latency_s

    comm.half_ring_latency_s = per_node
    try:
        yield
    finally:
        comm.half_ring_latency_s = original


@contextlib.contextmanager
def mtp_on_top():
    """The ablation of the default split's MTP slot (frameworks_split.balanced_split last_slots, as the cost model
    prices a split nobody gave): the plain balanced split, the MTP layers on top of the last stage's share; restored
    on exit."""
    original = evaluate.balanced_split

    def plain(num_layers: int, stages: int, *, last_slots: int = 0) -> tuple[int, ...]:
        return original(num_layers, stages)

    evaluate.balanced_split = plain
    try:
        yield
    finally:
        evaluate.balanced_split = original


SWAPS = {RING_LATENCY: ring_latency_per_node, MTP_SLOT: mtp_on_top}  # ablations that swap shared code, not a field


STACKS = ("megatron-core", "megatron-lm", "deepspeed", "torchtitan", "pytorch-fsdp", "hai-llm")
LEGACY = {"deepspeed": ("legacy/deepspeed-2021",)}  # profiles a stack's older sources run (published_runs.profile_of)
# (label, CostOptions field, the value it is switched to; None: CostOptions' default, applied to every stack whose
# profile sets another value). Each row names where the mechanism's evidence lives (frameworks/<stack>.yaml).
ABLATIONS = (
    ("TP comm overlapped with GEMMs (megatron-core --tp-comm-overlap)", "tp_overlap", None),
    ("pipeline sends overlapped (megatron-core --overlap-p2p-comm, DualPipe)", "pp_overlap", None),
    ("gradient reduction after the last backward (2021 Megatron-LM)", "dp_overlap", None),
    ("ZeRO-1 weight gather not overlapped", "dp_gather_overlap", None),
    ("pipeline sends split over TP ranks (2021 Megatron-LM scatter/gather)", "pp_scatter_gather", None),
    ("dropout by default (Megatron-LM / Megatron-DeepSpeed arguments.py)", "dropout", None),
    ("in-place fused softmax backward (Megatron fused kernels)", "softmax_in_place", None),
    ("attention kernel per stack (cuDNN on megatron-core, FlashAttention v1 in llm-foundry)", "attention_kernel", None),
    ("selective recompute per stack (torchtitan SAC, DeepSeek-V3 norm/up-proj)", "selective_mode", None),
    ("torchtitan selective as half the forward (the reading before planner/cost/sac.py's per-op policy)", "selective_mode",
     "half_forward"),
    ("ZeRO-3 re-gathers for the recompute forward (DeepSpeed)", "zero3_regather_for_recompute", None),
    ("ZeRO-3 prefetch depth per stack", "zero3_prefetch_layers", None),
    ("16-bit gradient reduction (DeepSpeed communication_data_type)", "grad_reduce_fp32", None),
    ("MoE all-to-all overlapped (DualPipe)", "moe_overlap", None),
    ("MoE dispatch once per node (DeepEP / DeepSeek-V3)", "moe_hierarchical", None),
    ("allocator allowance 0.05 (the removed hand-set value; 0.094 measured)", "allocator_fraction", 0.05),
    ("ZeRO-3 gathers as flat rings (the removed DeepSpeed reading)", "zero3_hierarchical", False),
    ("DeepSpeed 2021 per-tensor synchronous ZeRO-3 gathers (v0.4 code)", "zero3_sync_per_tensor", None),
    ("'interleaving not stated' read as the stack default 1F1B (reading rule)", "interleaving_unstated_is_1f1b", None),
    ("'recompute not stated' read as the stack's recipe for that size (reading rule)", "recompute_unstated_is_recipe", None),
    ("Megatron-Core recompute modules named in the text run as those modules (reading rule)", "recompute_modules_named", None),
    ("an MoE run's unstated expert parallelism as the planner's choice, 1 among it (reading rule)", "ep_unstated_is_chosen", None),
    ("torchtitan 'selective layer' as every other layer fully recomputed (reading rule)", "selective_layer_is_every_other_layer",
     None),
    ("context-parallel flavour not stated read as the stack's default (reading rule)", "cp_flavour_unstated_is_default", None),
    ("NeMo runs as NeMo's performance recipe: 16-bit gradients, fp8 parameters (reading rule)", "nemo_performance_recipe", None),
    ("MoE shared-expert overlap (megatron-core --moe-shared-expert-overlap)", "moe_shared_overlap", None),
    ("MoE all-gather dispatcher among the choices (megatron-core default)", "moe_allgather", None),
    ("MoE overlap's extra micro-batch in flight (megatron-core combined 1F1B)", "moe_overlap_extra_microbatch", None),
    ("eager SwiGLU and complex RoPE (torchtitan without compile: feed_forward.py, rope.py)", "eager_ops", None),
    ("a run that says it compiled runs its pointwise ops fused (reading rule)", "compiled_runs_fuse_pointwise_ops", None),
    ("ZeRO-3 collectives layer by layer, each with its latency (FSDP2 / DeepSpeed per-module fetch)",
     "zero3_layer_collectives", False),
    ("fp8 casts of linear inputs and output gradients (Transformer Engine cast-transpose)", "fp8_casts", False),
    ("all-gather / reduce-scatter latency per rank of the ring (NCCL tuning.cc), not per node", RING_LATENCY, None),
    ("MoE tokens dispatched per sequence-parallel shard, expert-TP all-gather/reduce-scatter (megatron-core "
     "token_dispatcher.py MoEAlltoAllTokenDispatcher)", "moe_sp_dispatch", None),
    ("MoE expert GEMM launches per stack (torchtitan one torch._grouped_mm per weight; TE GroupedLinear one per "
     "expert)", "moe_expert_launches", None),
    ("MoE tokens sorted again by local expert (megatron-core sort_chunks_by_idxs, torchtitan _permute)",
     "moe_expert_sort", None),
    ("MoE tokens-per-expert exchange before each dispatch (megatron-core all-gather, torchtitan all_to_all_single)",
     "moe_count_exchange", None),
    ("MoE routing scores applied by an eager fp32 multiply of the combined rows (torchtitan token_dispatcher.py "
     "combine)", "moe_combine_scores", None),
    ("multi-token prediction modules where the source states their depth (reading rule; DeepSeek-V3 sec. 2.2, "
     "Megatron-Core multi_token_prediction.py)", "mtp_depth_stated", None),
    ("MTP layer counted as a last-stage slot of the default split (Megatron MR2795; off: on top of the last stage)",
     MTP_SLOT, None),
    ("LM head, MoE router and delta rule at the bf16 rate under fp8 (Megatron-Core output_layer/router_gating_linear, "
     "torchtitan filter_fqns)", "fp8_16bit_gemms", False),
    ("an unsaid pipeline split as the planner's split (reading rule; stage-partition DP, the stack's uneven forms)",
     "split_unstated_is_planned", None),
    ("an MoE run's stated token dispatcher and overlap priced as stated (reading rule; Megatron-Core flag names, "
     "DeepEP)", "moe_settings_stated", None),
    ("a Megatron-Core run without the MoE features its release lacked (reading rule; core_v0.10/0.12/0.14 tags)",
     "megatron_core_version_features", None),
    ("gradient accumulation outside the GEMMs (DeepSpeed BF16_Optimizer update_hp_grads, Megatron-LM v2.5 fp32 "
     "main_grad hook, autograd .grad)", "grad_accum_paths", None),
    ("a run's stated fp16, named BF16_Optimizer or Megatron-LM release on its accumulation path (reading rule)",
     "grad_accumulation_stated", None),
    ("a named model's attention (head width, q/k norms, biases, sliding windows, sinks) as its preset's (reading rule)",
     "named_model_architecture", None),
    ("gradient copies each accumulation path's optimizer holds (DeepSpeed BF16_Optimizer 4 + 2, ZeRO/FP16 optimizers "
     "2 and the ZeRO-1 bucket; off: the recipe's 4)", "grad_accum_memory", False),
)


def ablation_overrides(field: str, value=None) -> dict[str, dict]:
    """{stack: {field: value}}: the default (or `value`) for every stack whose profile sets another value."""
    default = getattr(CostOptions(), field) if value is None else value
    out = {}
    for stack in STACKS:
        if value is not None and field == "zero3_hierarchical" and stack != "deepspeed":
            continue  # the removed reading applied to DeepSpeed only, as it was
        if value is not None and field == "selective_mode" and stack != "torchtitan":
            continue  # the removed reading applied to torchtitan only, as it was
        profiles = (stack, *LEGACY.get(stack, ()))
        if any(getattr(options_for(profile, "bf16"), field) != default for profile in profiles):
            out[stack] = {field: default}
            if field == "zero3_hierarchical":  # the removed reading had no per-tensor gathers either
                out[stack]["zero3_sync_per_tensor"] = False
    return out


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The smallest value whose cumulative weight reaches half the total weight."""
    pairs = sorted(zip(values, weights))
    total, acc = sum(weights), 0.0
    for value, weight in pairs:
        acc += weight
        if acc >= total / 2:
            return value
    return float("nan")


def per_source_weighted(rows: list[dict], key: str = "loso_error") -> tuple[float, float]:
    """(weighted median |error|, median of the sources' median |error|) with each source weighted once."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r[key] == r[key]:
            by_source[r["source"]].append(abs(r[key]))
    values = [v for errs in by_source.values() for v in errs]
    weights = [1 / len(errs) for errs in by_source.values() for _ in errs]
    return weighted_median(values, weights), statistics.median(statistics.median(e) for e in by_source.values())


def headline(rows: list[dict], key: str = "loso_error") -> dict:
    """Median and max |error| over runs, the per-source-weighted median, and the MoE runs' median."""
    a = [abs(r[key]) for r in rows if r[key] == r[key]]
    moe = [abs(r[key]) for r in rows if r[key] == r[key] and r.get("moe")]
    weighted, of_medians = per_source_weighted(rows, key)
    return dict(n=len(a), median=statistics.median(a) if a else float("nan"), max=max(a) if a else float("nan"),
                weighted=weighted, of_medians=of_medians, moe=statistics.median(moe) if moe else float("nan"),
                n_moe=len(moe), false_oom=sum(1 for r in rows if not r["fits"]))


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")


def ranking_groups(rows: list[dict], key: str = "loso_error") -> list[dict]:
    """Per (source, model architecture, device) with >= 3 runs: Spearman of predicted vs measured seconds per token
    per GPU, and the top-1 gap (measured time of the predicted best over the measured best, minus 1)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r[key] == r[key]:
            groups[(r["source"], r["arch"], r["device"])].append(r)
    out = []
    for (source, arch, device), runs in sorted(groups.items()):
        if len(runs) < 3:
            continue
        measured = [r["measured_s"] * r["gpus"] / r["tokens"] for r in runs]
        predicted = [m * (1 + r[key]) for m, r in zip(measured, runs)]
        best = min(range(len(runs)), key=lambda i: predicted[i])
        out.append(dict(source=source, model=json.loads(arch).get("hidden_size"), device=device, n=len(runs),
                        spearman=spearman(predicted, measured), top1_gap=measured[best] / min(measured) - 1,
                        name=runs[0]["run"]))
    return out


def render_ranking(rows: list[dict]) -> list[str]:
    groups = ranking_groups(rows)
    lines = ["ranking within a source (one model on one device, >= 3 configurations; seconds per token per GPU, "
             "leave-one-source-out): Spearman, top-1 gap (measured time of the predicted best / measured best - 1)"]
    for g in groups:
        lines.append(f"  {g['source'][:40]:40} {g['device'][:14]:14} h={g['model']:<6} n={g['n']:3d} "
                     f"Spearman {g['spearman']:+.2f} top-1 gap {g['top1_gap']:6.1%}")
    if groups:
        lines.append(f"  median over {len(groups)} groups: Spearman {statistics.median(g['spearman'] for g in groups):+.2f}, "
                     f"top-1 gap {statistics.median(g['top1_gap'] for g in groups):.1%}")
    return lines


def fmt_headline(h: dict) -> str:
    return (f"n={h['n']:3d} median {h['median']:6.1%} weighted {h['weighted']:6.1%} max {h['max']:6.1%} "
            f"MoE {h['moe']:6.1%} (n={h['n_moe']}) false OOM {h['false_oom']}")


def render_ablations(base: dict, table: list[tuple[str, dict, dict]]) -> list[str]:
    """One line per ablation: the stacks it touches and the leave-one-source-out figures with it switched off."""
    lines = ["ablations (each mechanism switched off for every run of the stacks whose profile sets it; full "
             "leave-one-source-out each; 'weighted': each source weighted once):",
             f"  {'shipped':72} {fmt_headline(base)}"]
    for label, overrides, h in table:
        stacks = ",".join(sorted(overrides)) or "no stack sets it"
        lines.append(f"  {(label + ' [' + stacks + ']')[:72]:72} {fmt_headline(h)}")
    return lines


def field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(CostOptions)}
