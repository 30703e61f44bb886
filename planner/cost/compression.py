"""Communication compression priced as it runs (planner.schemas.compression): bytes on the wire per collective
after compression, the (de)compression kernels on the communication path, and the memory compression adds.

Formulas, per data-parallel group of n ranks (rpn on each of N nodes), for P parameters of one pipeline rank:
- qwZ (ZeRO++ Sec. 3.1; DeepSpeed partition_parameters.py CUDAQuantizer: int8 with one fp32 scale per group of at
  most `target_group_size` = 8000 elements, "the optimal size is 4k"): every ZeRO-3 all-gather moves
  P * (1 + 4 / QWZ_GROUP) bytes instead of P * 2; quantize + dequantize read and write each element once more.
- hpZ (ZeRO++ Sec. 3.2): the forward all-gather spans the dp group, the backward all-gathers (and the recompute's)
  gather the secondary partition over `hpz_partition_size` ranks of one node; the secondary copy costs
  P * 2 / hpz_partition_size bytes on each rank.
- qgZ (ZeRO++ Sec. 3.3; DeepSpeed coalesced_collectives.all_to_all_quant_reduce, quantization_bits=4): the
  reduce-scatter of 16-bit gradients becomes an int4 all-to-all inside the node (P / 2 bytes per rank), a local
  reduction, and an int4 all-to-all across nodes of the node's 1/rpn share (P / (2 rpn) bytes); every element is
  quantized and dequantized twice.
- PowerSGD (Vogels et al. 2019, Algorithm 1; torch powerSGD_hook): each gradient matrix n x m with
  n*m > min_compression_rate * (n+m)*r (torch's _should_compress, min_compression_rate 2) is all-reduced as P
  (n x r) and Q (m x r), the rest (vectors, small matrices) uncompressed; compression_ratio() counts both from the
  model's weight shapes. The hook's kernels touch every gradient element POWERSGD_PASSES times (error feedback
  add, P = M Q, Q = M^T P, decompress P Q^T, new error), memory-bound at the device's achieved HBM rate; the
  error-feedback buffer holds one more copy of the gradients.
- bf16/fp16 gradient hooks (torch default_hooks.bf16_compress_hook): the all-reduce moves 2 bytes per element
  instead of the stack's reduce dtype; the casts read and write each element once each way (CAST_PASS_BYTES).
- fp8 dispatch (DeepSeek-V3 Sec. 3.3.2): of the MoE layer's all-to-alls each way, the dispatch-direction one moves
  fp8 values with one fp32 scale per 128 (FP8_DISPATCH_BYTES per element); the other stays bf16.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost import comm
from planner.cost.types import Candidate, CostOptions
from planner.models import counting
from planner.schemas.compression import Compression
from planner.schemas.model import ModelSpec
from planner.topology.groups import GroupLink

QWZ_GROUP = 4000  # elements per fp32 scale (DeepSpeed CUDAQuantizer: groups of at most 8000, about 4k)
QWZ_BYTES = 1 + 4 / QWZ_GROUP  # int8 value + its share of the scale
QGZ_BYTES = 0.5 + 4 / QWZ_GROUP  # int4 value + its share of the scale
FP8_DISPATCH_BYTES = 1 + 4 / 128  # DeepSeek-V3: fp8 values, one fp32 scale per 1 x 128 tile
POWERSGD_MIN_RATE = 2.0  # torch PowerSGDState(min_compression_rate=2)
POWERSGD_PASSES = 9  # gradient-sized reads and writes: M += e (3), P = MQ (1), Q = M^T P (1), M = PQ^T (1), e = M - PQ^T (3)
QUANT_PASS_BYTES = 2 + 1 + 1 + 2  # qwZ: read 16-bit + write int8 on the sender; read int8 + write 16-bit on the receiver
QGZ_PASS_BYTES = 2 * (2 + 0.5 + 0.5 + 2)  # qgZ: quantize and dequantize twice (intra-node, then across nodes)
CAST_PASS_BYTES = 4 + 2 + 2 + 4  # fp32 -> 16-bit before the all-reduce and back after it


def weight_matrices(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the gradient matrices of the `planner` executor's model (planner/nn: separate wq, wk,
    wv, wo; w1 [w3] w2; stacked experts [E, f, h] that torch's powerSGD_hook views as E x f*h; the router; the
    embeddings and an untied head), each as DDP hands it to the hook: tensor.view(shape[0], -1). MLA models list
    no attention matrices here (their projections count as uncompressed: an under-estimate of the saving)."""
    h, d = spec.hidden_size, spec.dim_per_head
    q, kv = spec.num_attention_heads * d, spec.kv_heads * d
    gated = 2 if spec.gated else 1
    attention = [] if spec.mla is not None else [(q, h, 1), (kv, h, 2), (h, q, 1)]
    dense = [(spec.ffn_hidden_size, h, gated), (h, spec.ffn_hidden_size, 1)]
    out = [(spec.vocab_size, h, 1 if spec.tied_embeddings else 2)]
    if spec.position == "learned":
        out.append((spec.position_rows, h, 1))
    moe_layers = spec.num_moe_layers
    # attention matrices on attention layers only: Gated DeltaNet / Mamba mixers are left uncompressed (as MLA)
    attention_moe = sum(spec.is_moe_layer(i) for i in range(spec.num_layers) if spec.mixer(i) == "attention")
    attention_dense = sum(spec.mixer(i) == "attention" for i in range(spec.num_layers)) - attention_moe
    out += [(r, c, n * attention_dense) for r, c, n in attention]
    out += [(r, c, n * (spec.num_layers - moe_layers)) for r, c, n in dense]
    if spec.moe is not None and moe_layers:
        moe, f = spec.moe, spec.moe.expert_ffn_hidden_size
        per_layer = [(moe.num_experts, f * h, gated), (moe.num_experts, h * f, 1), (moe.num_experts, h, 1)]
        if moe.shared_ffn_hidden_size:
            per_layer += [(moe.shared_ffn_hidden_size, h, gated), (h, moe.shared_ffn_hidden_size, 1)]
        out += [(r, c, n * attention_moe) for r, c, n in attention]
        out += [(r, c, n * moe_layers) for r, c, n in per_layer]
    return out


def powersgd_ratio(spec: ModelSpec, rank: int) -> float:
    """Elements all-reduced per gradient element under PowerSGD rank `rank`, over the whole model: torch's
    powerSGD_hook sends P (n x r) and Q (m x r) for a matrix with n*m > min_compression_rate * (n+m)*r and the
    matrix itself otherwise; everything weight_matrices does not list (norms, biases) goes uncompressed."""
    total = float(counting.total_params(spec))
    sent = total
    for rows, cols, count in weight_matrices(spec):
        r = min(rows, cols, rank)
        dense, low = rows * cols, (rows + cols) * r
        if dense > POWERSGD_MIN_RATE * low:
            sent -= count * (dense - low)
    return sent / total


def node_local(link: GroupLink, size: int) -> GroupLink:
    """The sub-group of `size` ranks of `link` that share one node (hpZ's secondary partition, qgZ's first hop)."""
    size = max(1, min(size, link.ranks_per_node, link.size))
    return replace(link, size=size, ranks_per_node=size, num_nodes=1)


def across_nodes(link: GroupLink) -> GroupLink:
    """The ranks of `link` with one local rank on each node (qgZ's second hop): one rank per node, its NIC share."""
    return replace(link, size=link.num_nodes, ranks_per_node=1, num_nodes=link.num_nodes)


def hbm_pass_s(num_bytes: float, hbm_rate_Bps: float) -> float:
    """A memory-bound kernel moving `num_bytes` at the device's achieved HBM rate."""
    return num_bytes / hbm_rate_Bps if num_bytes > 0 else 0.0


def gather_bytes_per_param(comp: Compression, base: float) -> float:
    """Bytes per parameter of a ZeRO-3 all-gather: qwZ's int8 blocks, else the stack's gather dtype."""
    return min(base, QWZ_BYTES) if comp.has("qwz") else base


def reduce_bytes_per_param(comp: Compression, base: float) -> float:
    """Bytes per gradient element of the all-reduce under a 16-bit gradient hook (no larger than the stack's)."""
    if comp.has("bf16-grads") or comp.has("fp16-grads"):
        return min(base, 2.0)
    return base


def compute_s(comp: Compression, spec: ModelSpec, params: float, *, gathers: int, reductions: int,
              reduce_bytes: float, hbm_rate_Bps: float) -> float:
    """The compression kernels on one rank's communication path for `params` parameters: qwZ per all-gather,
    qgZ per reduction, PowerSGD's passes over fp32-or-reduce-dtype gradients, the 16-bit hooks' casts."""
    total = 0.0
    if comp.has("qwz"):
        total += gathers * hbm_pass_s(params * QUANT_PASS_BYTES, hbm_rate_Bps)
    if comp.has("qgz"):
        total += reductions * hbm_pass_s(params * QGZ_PASS_BYTES, hbm_rate_Bps)
    if comp.has("powersgd"):
        total += reductions * hbm_pass_s(params * reduce_bytes * POWERSGD_PASSES, hbm_rate_Bps)
    if (comp.has("bf16-grads") or comp.has("fp16-grads")) and reduce_bytes > 2:
        total += reductions * hbm_pass_s(params * CAST_PASS_BYTES, hbm_rate_Bps)
    return total


def hpz_ranks(comp: Compression, dp_link: GroupLink) -> int:
    """The ranks hpZ's secondary partition spans: hpz_partition_size, at most the dp group's ranks on one node."""
    return max(1, min(comp.hpz_partition_size, dp_link.ranks_per_node, dp_link.size))


def memory_bytes(recipe, cand: Candidate, row: dict, dp_link: GroupLink):
    """extra_bytes for every pipeline rank of an evaluation row (`dense` and `expert` parameters per rank)."""
    if not cand.compression.methods:
        return 0.0
    return extra_bytes(cand.compression, params=row["dense"] + row["expert"], gather_bytes=recipe.gather_bytes,
                       grad_bytes=recipe.grad_reduce_bytes, hpz_ranks=hpz_ranks(cand.compression, dp_link))


def extra_bytes(comp: Compression, *, params, gather_bytes: float, grad_bytes: float, hpz_ranks: int):
    """Device memory compression adds on one rank holding `params` parameters (unsharded count): hpZ's secondary
    16-bit partition over `hpz_ranks` ranks (hpz_ranks()); PowerSGD's error-feedback copy of the gradients."""
    total = 0.0
    if comp.has("hpz"):
        total += params * gather_bytes / hpz_ranks
    if comp.has("powersgd"):
        total += params * grad_bytes
    return total


def zero3_gathers(options: CostOptions, cand: Candidate) -> int:
    """ZeRO-3 all-gathers per micro-batch: forward and backward, and the recompute forward's where the stack
    re-gathers for it (options.zero3_regather_for_recompute: DeepSpeed's checkpointed forward re-runs the fetch)."""
    return 3 if (options.zero3_regather_for_recompute and cand.recompute == "full") else 2


def zero3_microbatch_s(options: CostOptions, cand: Candidate, params: float, grads: float, weights: float,
                       link: GroupLink, units: int = 1) -> float:
    """One micro-batch's ZeRO-3 collectives for `params` parameters (`grads`, `weights`: their bytes on the wire):
    the gathers (hpZ: only the forward one spans the dp group, the others gather the node-local secondary
    partition) and the gradient reduce-scatter (qgZ: the int4 hierarchical all-to-all above). Hierarchical, or flat
    rings per rank where the stack runs them so (options.zero3_hierarchical); a stack that gathers tensor by tensor
    synchronously (options.zero3_sync_per_tensor, DeepSpeed 2021) pays its gathers in planner.cost.zero3_legacy.
    `units`: the sharded modules the rank's weights are gathered in, each its own collective with its own fixed
    latency (zero3_unit_latency_s)."""
    comp = cand.compression
    ring = comm.all_gather_s if options.zero3_hierarchical else comm.flat_ring_s
    (passes, _), *local = zero3_gather_groups(options, cand, link)
    gather_s = passes * ring(weights, group=link) + sum(n * comm.all_gather_s(weights, group=g) for n, g in local)
    if options.zero3_sync_per_tensor:  # the gathers are exposed on their own (planner.cost.zero3_legacy)
        gather_s = 0.0
    if comp.has("qgz"):
        quantized = params * QGZ_BYTES
        reduce_s = (comm.all_to_all_s(quantized, group=node_local(link, link.ranks_per_node))
                    + comm.all_to_all_s(quantized / link.ranks_per_node, group=across_nodes(link)))
    elif options.zero3_hierarchical:
        reduce_s = comm.reduce_scatter_s(grads, group=link)
    else:
        reduce_s = comm.flat_ring_s(grads, group=link)
    return gather_s + reduce_s + (units - 1) * zero3_unit_latency_s(options, cand, link)


def zero3_unit_latency_s(options: CostOptions, cand: Candidate, link: GroupLink) -> float:
    """The fixed latency one more sharded module adds to a micro-batch: its own all-gathers and gradient
    reduce-scatter (comm.half_ring_latency_s each). ZeRO-3 stacks gather module by module: FSDP2 issues one
    all-gather and one reduce-scatter per fully_shard group and pass (torch/distributed/fsdp/_fully_shard/
    _fsdp_param_group.py: unshard -> foreach_all_gather, post_backward -> foreach_reduce), torchtitan applies
    fully_shard to every transformer block (models/llama3/infra/parallelize.py, apply_fsdp), llm-foundry wraps
    every block (its fsdp_wrap_fn), DeepSpeed fetches per sub-module (PartitionedParameterCoordinator.
    fetch_sub_module), at least one per block. So the count taken is the rank's decoder layers."""
    latency = 0.0 if options.zero3_sync_per_tensor else sum(
        n * comm.half_ring_latency_s(group) for n, group in zero3_gather_groups(options, cand, link))
    if not cand.compression.has("qgz"):
        latency += comm.half_ring_latency_s(link, "reduce_scatter")
    return latency


def zero3_gather_groups(options: CostOptions, cand: Candidate, link: GroupLink) -> list[tuple[int, GroupLink]]:
    """(passes, group) of one micro-batch's ZeRO-3 gathers: over the dp group, except that under hpZ only the
    forward one does and the others gather the node-local secondary partition."""
    comp, gathers = cand.compression, zero3_gathers(options, cand)
    local = gathers - 1 if comp.has("hpz") else 0
    groups = [(gathers - local, link)]
    if local:
        groups.append((local, node_local(link, hpz_ranks(comp, link))))
    return groups
