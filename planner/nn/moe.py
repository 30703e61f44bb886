"""Mixture-of-experts FFN with optional expert parallelism (EP): router, stacked experts, shared experts.

Routing: softmax over experts, top-k, the k weights renormalised to sum to 1 (Mixtral, Jiang et al. 2024,
sec. 2.1). Capacity (GShard, Lepikhin et al. 2020, sec. 2.2 / Switch, Fedus et al. 2021, eq. 3):
capacity = ceil(capacity_factor * tokens * top_k / num_experts) per expert and per forward call on one rank
(the "group" is the rank's local tokens); assignments past capacity, in token order, are dropped and
COUNTED (`dropped_tokens`, `routed_tokens`). capacity_factor None = dropless.

EP: experts are split contiguously over the ep group (rank r holds experts [r*E/ep, (r+1)*E/ep)); each
rank routes its own tokens, sends each assignment to the rank owning its expert with
`all_to_all_single` (uneven splits; the autograd version, so gradients flow back the same way), runs its
local experts, and sends the results back (combine). Tokens counts are exchanged first with a plain
all_to_all_single of the per-expert counts.

Experts run as grouped GEMMs (`GroupedExperts.forward`): torch's grouped matmul on CUDA in bf16, a padded batched
matmul elsewhere; token permutation (argsort by expert) and un-permutation (index_add) are vectorised.
Not done: expert tensor parallelism (experts are replicated over tp ranks in the executor; profiling
shapes use the full expert width).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.nn.common import FeedForward, activation_fn, check_divisible
from planner.schemas.model import ModelSpec


class Router(nn.Module):
    """Linear gate -> softmax (fp32) -> top-k, renormalised. Also computes the Switch load-balancing loss
    (Fedus et al. 2021, eq. 4: E * sum_e f_e * P_e) into `aux_loss`: detached (for reports) unless
    `keep_aux_loss` is set, in which case it keeps its graph so a training loop can add it to the loss."""

    def __init__(self, dim: int, num_experts: int, top_k: int, *, dtype: torch.dtype | None = None):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, num_experts, bias=False, dtype=dtype)
        self.aux_loss: torch.Tensor | None = None
        self.keep_aux_loss = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (tokens, dim) -> (weights (tokens, k) in x.dtype, expert ids (tokens, k))."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        num_experts = probs.shape[-1]
        fraction = torch.bincount(experts.reshape(-1), minlength=num_experts).float() / max(experts.numel(), 1)
        aux_loss = num_experts * (fraction * probs.mean(dim=0)).sum()
        self.aux_loss = aux_loss if self.keep_aux_loss else aux_loss.detach()
        return weights.to(x.dtype), experts


class GroupedExperts(nn.Module):
    """Routed experts as stacked weights: w1/w3 (E, hidden, dim), w2 (E, dim, hidden); E = local experts."""

    def __init__(self, dim: int, hidden: int, num_experts: int, *, activation: str, dtype: torch.dtype | None = None):
        super().__init__()
        self.activation = activation
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden, dtype=dtype))
        gated = activation in ("swiglu", "geglu")
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim, dtype=dtype)) if gated else None
        for p in self.parameters():
            nn.init.normal_(p, std=0.02)

    @property
    def num_local_experts(self) -> int:
        return self.w1.shape[0]

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: tokens grouped by local expert, `counts[e]` rows for expert e -> same shape, dim wide. Every expert's
        GEMMs run in one call, with no Python loop over experts: the rows are scattered once into a zero-padded
        layout, the MLP runs there, the rows are gathered back. torch's grouped GEMM where the device has it
        (`grouped_gemm_available`: groups padded to GROUP_ALIGN rows, as torchtitan's indices_padding_wrapper in
        torchtitan/models/moe/moe.py does for torch._grouped_mm), else one batched matmul over an
        (experts, max count, dim) buffer. Padding rows are zeros and are never gathered back, so each row's result
        is its expert's GEMM on that row alone. No rows still runs the (empty) GEMMs: the expert weights then get
        zero gradients, not None, so every rank joins the same gradient reductions."""
        device, sizes = x.device, torch.tensor(counts, device=x.device)
        expert_of_row = torch.repeat_interleave(torch.arange(len(counts), device=device), sizes, output_size=x.shape[0])
        slot = torch.arange(x.shape[0], device=device) - (sizes.cumsum(0) - sizes)[expert_of_row]
        if grouped_gemm_available(x):
            padded = [max(1, -(-c // GROUP_ALIGN)) * GROUP_ALIGN for c in counts]
            ends = torch.tensor(padded, device=device).cumsum(0)
            index = (ends - torch.tensor(padded, device=device))[expert_of_row] + slot
            buffer = x.new_zeros(sum(padded), x.shape[1]).index_copy(0, index, x)
            return self._mlp(buffer, lambda a, w: grouped_mm(a, w, ends))[index]
        buffer = x.new_zeros(len(counts), max(counts), x.shape[1]).index_put((expert_of_row, slot), x)
        return self._mlp(buffer, lambda a, w: torch.bmm(a, w.transpose(-2, -1)))[expert_of_row, slot]

    def _mlp(self, x: torch.Tensor, mm) -> torch.Tensor:
        """w2(act(w1 x) [* w3 x]) with `mm(rows, stacked weight)` the per-expert GEMM of a padded layout."""
        h = activation_fn(self.activation)(mm(x, self.w1))
        if self.w3 is not None:
            h = h * mm(x, self.w3)
        return mm(h, self.w2)

    def forward_loop(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The reference: one GEMM per expert in a Python loop (what `forward` replaced; tests compare the two)."""
        act = activation_fn(self.activation)
        outs = []
        for e, chunk in enumerate(torch.split(x, counts, dim=0)):
            h = act(chunk @ self.w1[e].t())
            if self.w3 is not None:
                h = h * (chunk @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
        return torch.cat(outs, dim=0) if outs else x.new_zeros(0, self.w2.shape[1])


GROUP_ALIGN = 8
"""Rows per expert group a multiple of 8 for torch's bf16 grouped GEMM (torchtitan TOKEN_GROUP_ALIGN_SIZE_M = 8,
torchtitan/distributed/expert_parallel.py: the weight-gradient GEMM slices the token dimension at the offsets)."""


def grouped_gemm_available(x: torch.Tensor) -> bool:
    """torch's grouped GEMM (torch.nn.functional.grouped_mm, torch._grouped_mm before 2.10) runs bf16 on CUDA
    devices of compute capability >= 8.0 (its docstring: "expected to be torch.bfloat16 values on CUDA devices with
    SM >= 80"). On CPU, torch 2.13 runs its forward but its backward fails ("Invalid strides/sizes", measured), so
    CPU and fp32 runs take the batched fallback (torch.bmm over the padded experts)."""
    if x.device.type != "cuda" or _grouped_mm_fn() is None:
        return False
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
    return dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device) >= (8, 0)


def _grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows ends[e-1]:ends[e] of x times w[e].t() for every expert e, one grouped GEMM in bf16 (the operands are
    cast as autocast casts a matmul's; torchtitan's _run_experts_grouped_mm casts the same way)."""
    return _grouped_mm_fn()(x.to(torch.bfloat16), w.to(torch.bfloat16).transpose(-2, -1), offs=ends.to(torch.int32))


class MoE(nn.Module):
    """Routed + shared experts for one decoder layer. Set `ep_group` (see `shard_experts`) for EP."""

    def __init__(self, spec: ModelSpec, *, tp: int = 1, ep: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        moe = spec.moe
        check_divisible("moe.num_experts", moe.num_experts, "ep", ep)
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.capacity_factor = moe.capacity_factor
        self.router = Router(spec.hidden_size, moe.num_experts, moe.top_k, dtype=dtype)
        self.experts = GroupedExperts(
            spec.hidden_size, moe.expert_ffn_hidden_size, moe.num_experts // ep, activation=spec.activation, dtype=dtype
        )
        self.shared_experts = None
        if moe.shared_ffn_hidden_size:
            self.shared_experts = FeedForward(
                spec.hidden_size, moe.shared_ffn_hidden_size, activation=spec.activation, bias=False, dtype=dtype
            )
        self.ep_group: dist.ProcessGroup | None = None
        # plain tensor attributes, not buffers: DDP would broadcast buffers from rank 0 every forward
        self.dropped_tokens = torch.zeros((), dtype=torch.int64)
        self.routed_tokens = torch.zeros((), dtype=torch.int64)
        self.received_tokens = TokenLog()  # per counted EP call: tokens this rank's experts received

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        weights, experts = self.router(x2)
        token_idx, w, counts = self._assign(weights, experts)
        y = self._run_experts(x2[token_idx], counts)
        out = torch.zeros_like(x2).index_add(0, token_idx, y * w[:, None])
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2)
        return out.reshape(shape)

    def capacity(self, num_tokens: int) -> int | None:
        """Per-expert capacity for `num_tokens` local tokens (GShard sec. 2.2); None = dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    def _assign(self, weights: torch.Tensor, experts: torch.Tensor):
        """Sort (token, expert) assignments by expert, drop those past capacity (in token order) and count them.
        Returns token indices, their combine weights and per-expert counts (global expert ids)."""
        num_tokens, k = experts.shape
        flat_expert = experts.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)
        sorted_expert = flat_expert[order]
        counts = torch.bincount(sorted_expert, minlength=self.num_experts)
        cap = self.capacity(num_tokens)
        dropped = counts.new_zeros(())
        if cap is not None:
            starts = torch.cumsum(counts, 0) - counts
            keep = torch.arange(order.numel(), device=order.device) - starts[sorted_expert] < cap
            dropped = (~keep).sum()
            order = order[keep]
            counts = counts.clamp(max=cap)
        if _counting():
            if self.dropped_tokens.device != dropped.device:
                self.reset_counters(device=dropped.device)
            self.dropped_tokens += dropped
            self.routed_tokens += flat_expert.numel()
        return order // k, weights.reshape(-1)[order], counts

    def _run_experts(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.ep_group is None:
            return self.experts(x, counts.tolist())
        return _ep_dispatch_run_combine(self.experts, x, counts, self.ep_group,
                                        self.received_tokens if _counting() else None)

    def reset_counters(self, device: torch.device | None = None) -> None:
        """Zero the dropped/routed counters (on `device` if given; they follow the tokens' device)."""
        device = device or self.dropped_tokens.device
        self.dropped_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.routed_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.received_tokens = TokenLog()


class TokenLog:
    """Tokens received per counted EP dispatch, held on the tokens' device as int64 chunks: 8 bytes a dispatch (a
    long GPU run makes ~10^6 of them; one tensor object each would hold ~0.5 GB), no host sync while training."""

    CHUNK = 1024

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []
        self.pending: list[torch.Tensor] = []

    def append(self, count: torch.Tensor) -> None:
        self.pending.append(count.to(torch.int64))
        if len(self.pending) >= self.CHUNK:
            self.chunks.append(torch.stack(self.pending))
            self.pending = []

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self.chunks) + len(self.pending)

    def values(self) -> torch.Tensor:
        """Every count in dispatch order, one int64 tensor."""
        return torch.cat(self.chunks + ([torch.stack(self.pending)] if self.pending else []))


def _counting() -> bool:
    """False while autograd recomputes a checkpointed forward inside backward, so drops count once."""
    return torch._C._current_graph_task_id() == -1


def _ep_dispatch_run_combine(experts: GroupedExperts, x: torch.Tensor, counts: torch.Tensor, group,
                             received: "TokenLog | None" = None) -> torch.Tensor:
    """All-to-all dispatch of expert-sorted tokens, local experts, all-to-all combine (same order back); appends
    the tokens this rank's experts receive to `received` when given (routing_skew)."""
    ep = dist.get_world_size(group)
    local = experts.num_local_experts
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_splits = counts.view(ep, local).sum(1).tolist()
    recv_matrix = recv_counts.view(ep, local)  # [source rank, local expert]
    recv_splits = recv_matrix.sum(1).tolist()
    if received is not None:
        received.append(recv_counts.sum())
    recv = _all_to_all(x, recv_splits, send_splits, group)
    labels = torch.arange(local, device=x.device).repeat(ep).repeat_interleave(recv_matrix.reshape(-1))
    perm = torch.argsort(labels, stable=True)
    y = experts(recv[perm], recv_matrix.sum(0).tolist())
    y = y[torch.argsort(perm)]
    return _all_to_all(y, send_splits, recv_splits, group)


def _all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    """Differentiable all_to_all_single with uneven splits (the backward sends gradients back the same way)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), output_splits, input_splits, group))


def shard_experts(moe: MoE, ep_group) -> None:
    """Keep only this rank's slice of the (fully initialised) stacked expert weights and enable EP dispatch."""
    ep, rank = dist.get_world_size(ep_group), dist.get_rank(ep_group)
    check_divisible("moe.num_experts", moe.num_experts, "ep", ep)
    local = moe.num_experts // ep
    for name in ("w1", "w2", "w3"):
        param = getattr(moe.experts, name)
        if param is not None:
            setattr(moe.experts, name, nn.Parameter(param.detach()[rank * local:(rank + 1) * local].clone()))
    moe.ep_group = ep_group
