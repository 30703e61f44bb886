"""Pipeline stage splits each stack can run, and how it spells them: uneven first/last pipeline stages, the
embedding and the loss counted as layers, explicit per-chunk layouts.

Counts are decoder layers per virtual stage s = v * pp + r (chunk v of pipeline rank r): the order of a
LaunchPlan's stages and of Megatron's layout string. The embedding rides on stage 0, the final norm, head and
loss on the last stage; either end stage may hold no decoder layer where the stack allows it (Llama 3, Dubey et
al. 2024 sec. 3.3.2, takes one layer each off the first and last pipeline stages of 405B's 126 at pp 16, so that the
first chunk holds only the embedding and the last only the output projection and loss).

The stacks' own rules, re-implemented from their code (each function names where):
- Megatron-Core (core_v0.16 .. core_v0.19): `megatron_split` is TransformerConfig.__post_init__'s uneven-PP
  checks plus transformer_block.py get_num_layers_to_build; `megatron_flags` picks the plainest spelling.
- torchtitan: `torchtitan_split` is torchtitan/distributed/pipeline_parallel.py _generate_llm_fqn_per_model_part;
  any other split is spelled as parallelism.module_fqns_per_model_part (the exporter writes it).
- `split_refusal` judges a split against a profile's `interleaved_split` facts (frameworks/*.yaml), one line
  naming the rule; `balanced_split` is the split the cost model prices when none is given.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schemas.framework import FrameworkProfile

MEGATRON_CONFIG = "megatron/core/transformer/transformer_config.py TransformerConfig.__post_init__ (uneven PP)"
MEGATRON_BUILD = "megatron/core/transformer/transformer_block.py get_num_layers_to_build"


class SplitError(ValueError):
    """A split a stack's rule refuses; the message is one line naming the rule and where it lives."""


def compact(counts: Sequence[int]) -> str:
    """Counts as the --stage-layers option reads them: runs written n*k ("1,2*62,1")."""
    out: list[str] = []
    for count in counts:
        if out and out[-1].split("*")[0] == str(count):
            head, _, times = out[-1].partition("*")
            out[-1] = f"{head}*{int(times or 1) + 1}"
        else:
            out.append(str(count))
    return ",".join(out)


def balanced_split(num_layers: int, stages: int, *, last_slots: int = 0) -> tuple[int, ...]:
    """As even as possible; the remainder goes to the middle stages first (the first carries the embedding, the
    last the head and logits), then the first, then the last. With num_layers + 2 = k * stages this is exactly
    Megatron's --account-for-embedding/loss-in-pipeline-split (ends k - 1, e.g. 0 for 126 layers on 128 chunks).

    `last_slots`: MTP layers the last stage runs besides its decoder layers (ModelSpec.mtp_num_layers), counted as
    layers of the split and taken off the last stage, as Megatron-Core's MTP design places them (DeepSeek-V3 "61
    layers plus 1 MTP layer structured as [[embedding], [dense]*3, [moe]*58, [mtp, loss]]": MR2795's flexible
    pipeline layout, whose layout strings end "...|mL", a last stage of MTP and loss only); the plain split where the
    last stage would get fewer slots than MTP layers."""
    if last_slots and stages > 1:
        counts = list(balanced_split(num_layers + last_slots, stages))
        if counts[-1] >= last_slots:
            counts[-1] -= last_slots
            return tuple(counts)
    base, extra = divmod(num_layers, stages)
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 1 else [0]
    counts = [base] * stages
    for index in order[:extra]:
        counts[index] += 1
    return tuple(counts)


def megatron_split(num_layers: int, pp: int, vpp: int = 1, *, first: int | None = None, last: int | None = None,
                   embedding: bool = False, loss: bool = False) -> tuple[int, ...]:
    """Decoder layers per virtual stage that Megatron-Core builds from --decoder-first/last-pipeline-num-layers
    (`first`/`last`: layers of the first/last pipeline rank over all its vpp chunks) or
    --account-for-embedding/loss-in-pipeline-split; SplitError with Megatron's rule when it refuses them."""
    if (first is not None or last is not None) and (embedding or loss):
        raise SplitError("--decoder-first/last-pipeline-num-layers cannot be set with --account-for-embedding/loss-in-"
                         f"pipeline-split ({MEGATRON_CONFIG})")
    if first is not None or last is not None:
        per_rank = _first_last_ranks(num_layers, pp, vpp, first, last)
    else:
        total = num_layers + int(embedding) + int(loss)
        if total % pp:
            raise SplitError(f"num_layers={num_layers}{' + embedding' * embedding}{' + loss' * loss} = {total} must be "
                             f"divisible by pp={pp} ({MEGATRON_CONFIG}): set first/last stage layers or a layout")
        per_rank = [total // pp] * pp
    if any(count % vpp for count in per_rank):
        raise SplitError(f"layers per pipeline rank {sorted(set(per_rank))} must be divisible by vpp={vpp} "
                         f"({MEGATRON_CONFIG}, {MEGATRON_BUILD}): choose counts that are multiples of {vpp}")
    counts = [per_rank[s % pp] // vpp for s in range(pp * vpp)]
    counts[0] -= int(embedding)
    counts[-1] -= int(loss)
    if min(counts) < 0:
        raise SplitError(f"Not enough layers in the first/last virtual pipeline stage for the embedding/loss ({MEGATRON_BUILD})")
    return tuple(counts)


def _first_last_ranks(num_layers: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """Layers per pipeline rank under --decoder-first/last-pipeline-num-layers (TransformerConfig's checks)."""
    middle_layers, middle_ranks = num_layers, pp
    for name, value in (("first", first), ("last", last)):
        if value is None:
            continue
        if value <= 0:
            raise SplitError(f"num_layers_in_{name}_pipeline_stage={value} must be larger than 0 ({MEGATRON_CONFIG})")
        if value % vpp:
            raise SplitError(f"number of layers at {name} stage: {value} must be divisible by virtual pipeline parallel "
                             f"degree {vpp} ({MEGATRON_CONFIG})")
        middle_layers -= value
        middle_ranks -= 1
    if middle_layers < 0 or bool(middle_layers) != bool(middle_ranks):
        raise SplitError(f"Mismatch: {middle_layers} middle layers remaining but {middle_ranks} middle PP stages "
                         f"available ({MEGATRON_CONFIG})")
    if middle_ranks and middle_layers % middle_ranks:
        raise SplitError(f"number of layers at middle stage: {middle_layers} must be divisible by the middle pipeline "
                         f"model parallel size {middle_ranks} ({MEGATRON_CONFIG})")
    middle = middle_layers // middle_ranks if middle_ranks else 0
    ranks = [middle] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    return ranks


def megatron_flags(num_layers: int, pp: int, vpp: int, counts: Sequence[int], mtp: int = 0) -> list[str]:
    """The plainest Megatron-Core spelling of `counts`: nothing for equal chunks, the embedding/loss accounting,
    first/last pipeline-rank counts, else --pipeline-model-parallel-layout (any split, empty stages allowed:
    pipeline_parallel_layer_layout.py; vpp is then the layout's length / pp, so no vpp flag goes with it)."""
    counts = tuple(int(c) for c in counts)
    vpp_flag = ["--num-virtual-stages-per-pipeline-rank", str(vpp)] if vpp > 1 else []
    for args in _megatron_forms(num_layers, pp, vpp, counts):
        return args + vpp_flag
    return ["--pipeline-model-parallel-layout", megatron_layout(counts, mtp)]


def _megatron_forms(num_layers: int, pp: int, vpp: int, counts: tuple[int, ...]):
    """Flag sets (without the vpp flag) whose megatron_split equals `counts`, plainest first."""
    tries: list[tuple[list[str], dict]] = [([], {})]
    for embedding, loss in ((True, True), (True, False), (False, True)):
        flags = ["--account-for-embedding-in-pipeline-split"] * embedding + ["--account-for-loss-in-pipeline-split"] * loss
        tries.append((flags, dict(embedding=embedding, loss=loss)))
    first = sum(counts[0::pp])
    last = sum(counts[pp - 1::pp])
    for use_first, use_last in ((True, True), (True, False), (False, True)):
        kwargs = dict(first=first if use_first else None, last=last if use_last else None)
        flags = (["--decoder-first-pipeline-num-layers", str(first)] * use_first
                 + ["--decoder-last-pipeline-num-layers", str(last)] * use_last)
        tries.append((flags, kwargs))
    for flags, kwargs in tries:
        try:
            if megatron_split(num_layers, pp, vpp, **kwargs) == counts:
                yield flags
        except SplitError:
            continue


def megatron_layout(counts: Sequence[int], mtp: int = 0) -> str:
    """--pipeline-model-parallel-layout of `counts`: "E" embedding, "t" decoder layer, "m" MTP layer, "L" loss,
    stages by "|" in virtual-stage order (pipeline_parallel_layer_layout.py parse_str_to_list; "t*3" repeats). The
    `mtp` layers go on the last stage, before the loss: with a layout Megatron builds MTP layers only where "m"
    stands (multi_token_prediction.py get_mtp_num_layers_to_build), so a layout without them trains no MTP."""
    stages = []
    for index, count in enumerate(counts):
        body = f"t*{count}" if count > 1 else "t" * count
        last = index == len(counts) - 1
        stages.append(("E" if index == 0 else "") + body + ("m" * mtp + "L" if last else ""))
    return "|".join(stages)


def torchtitan_split(num_layers: int, stages: int, first_less: int = 1, last_less: int = 1) -> tuple[int, ...]:
    """Decoder layers per stage of torchtitan's default split (pipeline_parallel.py _generate_llm_fqn_per_model_part
    with parallelism.pipeline_parallel_first/last_stage_less_layers as input/output weights): the remainder goes
    to the first stages; SplitError with torchtitan's message where it raises."""
    if stages == 1:
        return (num_layers,)
    effective = num_layers + first_less + last_less
    if stages > effective:
        raise SplitError(f"Number of stages ({stages}) cannot be greater than effective layers ({effective}) "
                         "(torchtitan pipeline_parallel.py _generate_llm_fqn_per_model_part)")
    per, extra = divmod(effective, stages)
    if first_less > per or last_less > per:
        raise SplitError(f"input_weight ({first_less}) / output_weight ({last_less}) exceeds minimum layers per stage "
                         f"({per}) (torchtitan pipeline_parallel.py _generate_llm_fqn_per_model_part)")
    counts, left = [], num_layers
    for s in range(stages):
        want = per + (1 if s < extra else 0) - (first_less if s == 0 else 0) - (last_less if s == stages - 1 else 0)
        take = min(max(want, 0), left)
        counts.append(take)
        left -= take
    return tuple(counts)


def split_refusal(profile: FrameworkProfile, *, num_layers: int, pp: int, vpp: int, counts: Sequence[int]) -> str | None:
    """Why `profile`'s stack cannot run `counts` decoder layers per virtual stage (one line), or None.

    Every stack: pp*vpp entries, none negative, summing to num_layers. A stage with no decoder layer needs the
    profile's interleaved_split.empty_chunks ("ends": the first and last only; "any"). With vpp = 1 every stack takes any other split (Megatron's layout,
    torchtitan's module names per part, our executor's layer lists; DeepSpeed's partition_method decides its own,
    which its exporter says). With vpp > 1: any split with a layout; otherwise only the forms the profile lists."""
    counts = tuple(int(c) for c in counts)
    split, name, chunks = profile.capabilities.interleaved_split, profile.name, pp * vpp
    if len(counts) != chunks or sum(counts) != num_layers or min(counts, default=0) < 0:
        return (f"stage_layers={compact(counts)} must have pp*vpp={chunks} entries, none negative, summing to "
                f"num_layers={num_layers}")
    empty = [s for s, count in enumerate(counts) if count == 0]
    ends = (0, chunks - 1)
    if empty and (split.empty_chunks == "none" or (split.empty_chunks == "ends" and set(empty) - set(ends))):
        where = "an end stage" if split.empty_chunks == "none" else "a middle stage"
        return (f"stage_layers={compact(counts)}: framework {name!r} cannot run {where} without decoder layers "
                f"(interleaved_split.empty_chunks={split.empty_chunks!r}: {split.source}): give it at least one layer")
    if len(empty) == chunks:
        return f"stage_layers={compact(counts)}: no stage holds a decoder layer"
    if vpp == 1 or split.layout or len(set(counts)) == 1:
        return None
    forms = interleaved_forms(profile, num_layers=num_layers, pp=pp, vpp=vpp)
    if counts in forms.values():
        return None
    named = ", ".join(forms) or "none for this layer count"
    return (f"stage_layers={compact(counts)} over pp={pp} x vpp={vpp}: framework {name!r} has no layout for interleaved "
            f"chunks, only {named} ({split.source}): use one of those or another framework")


def interleaved_forms(profile: FrameworkProfile, *, num_layers: int, pp: int, vpp: int) -> dict[str, tuple[int, ...]]:
    """The splits a stack without a layout string spells for pp x vpp chunks, by name: equal chunks, the embedding
    and/or loss counted as a layer (Megatron's rule), first/last pipeline ranks with fewer layers each (every first
    and last count at or below the middle ranks' that Megatron's rule accepts; with pp = 2 every pair)."""
    split, chunks = profile.capabilities.interleaved_split, pp * vpp
    out: dict[str, tuple[int, ...]] = {}
    if num_layers % chunks == 0:
        out["equal chunks"] = (num_layers // chunks,) * chunks
    slots = [(e, lo) for e, lo in ((True, True), (True, False), (False, True))
             if (split.embedding_slot or not e) and (split.loss_slot or not lo)]
    for embedding, loss in slots:
        try:
            name = ("embedding+loss" if loss else "embedding") if embedding else "loss"
            out[f"{name} as layers"] = megatron_split(num_layers, pp, vpp, embedding=embedding, loss=loss)
        except SplitError:
            continue
    if split.uneven_first_last and pp > 1:
        for first in range(vpp, num_layers + 1, vpp):
            for last in range(vpp, num_layers - first + 1, vpp):
                try:
                    counts = megatron_split(num_layers, pp, vpp, first=first, last=last)
                except SplitError:
                    continue
                if pp == 2 or (first <= counts[1] * vpp and last <= counts[1] * vpp):
                    out[f"first {first} / last {last} layers"] = counts
    return out


def deepspeed_type_split(num_layers: int, pp: int, *, before: int = 1, after: int = 2) -> tuple[int, ...]:
    """Decoder layers per stage that DeepSpeed's PipelineModule(partition_method='type:<decoder class>') builds:
    deepspeed/runtime/pipe/module.py _partition_layers weighs the decoder layers 1 and every other LayerSpec 0
    (`before` of them ahead, e.g. the embedding; `after` behind, e.g. the final norm and the head) and splits with
    deepspeed/runtime/utils.py partition_balanced, a linear-partition DP minimising max - min of the parts'
    weights, ties to the last split point (`>=`); re-implemented here, loop for loop (v0.19)."""
    weights = [0] * before + [1] * num_layers + [0] * after
    n, m = len(weights), pp
    if n <= m:  # partition_uniform's trivial case
        parts = [min(p, n) for p in range(m + 1)]
    else:
        parts = _linear_partition(weights, m)
    return tuple(sum(weights[parts[s]:parts[s + 1]]) for s in range(m))


def _linear_partition(weights: list[int], m: int) -> list[int]:
    inf = float("inf")
    n = len(weights)
    prefix = [0] * (n + 1)
    for i, w in enumerate(weights):
        prefix[i + 1] = prefix[i] + w
    top = [[inf] * (m + 1) for _ in range(n + 1)]
    low = [[inf] * (m + 1) for _ in range(n + 1)]
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    top[0][0] = cost[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                hi, lo = max(top[k][j - 1], part), min(low[k][j - 1], part)
                if cost[i][j] >= hi - lo:
                    cost[i][j], top[i][j], low[i][j], position[i][j] = hi - lo, hi, lo, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]
