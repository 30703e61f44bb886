"""Domino-style TP overlap (`tp_overlap="domino"`): hide tensor-parallel all-reduces behind compute.

Domino (Wang et al. 2024, "Domino: Eliminating Communication in LLM Training via Generic Tensor Slicing
and Overlapping", sec. 3.2) splits each micro-batch into independent pieces along the batch dimension.
Piece i's row-parallel output all-reduce is launched asynchronously (`async_op=True`) and runs while
piece i+1 computes; the attention all-reduce of piece i is awaited only when its MLP starts.

Weights are sharded by hand (Megatron layout, Shoeybi et al. 2019 sec. 3: wq/wk/wv/w1/w3 split by output
rows, wo/w2 by input columns; no DTensor), with Megatron's conjugate operators: `f` (identity forward,
all-reduce backward) before the column-parallel linears and `g` (all-reduce forward, identity backward)
after the row-parallel ones. Embedding, final norm and LM head stay replicated. The backward pass is not
overlapped (its all-reduces are synchronous). MoE blocks are refused (no expert TP in the executor).
With num_pieces=1 the same code is plain synchronous Megatron TP: the baseline `time_tp_overlap` uses.
A micro-batch of one sequence cannot be split along the batch and runs as one piece (no overlap).
"""

from __future__ import annotations

import statistics
import time
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.errors import BadInputError
from planner.executor.parallelize import add_grad_sync, blocks, unwrap_block
from planner.nn.common import check_divisible
from planner.nn.model import TransformerBlock, init_module
from planner.schemas.model import ModelSpec


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AsyncReduceFromTP(torch.autograd.Function):
    """Megatron's g, asynchronous: starts the all-reduce and returns its (not yet reduced) buffer; the
    caller must wait on the work appended to `works` before reading it. Identity backward."""

    @staticmethod
    def forward(ctx, x, group, works):
        out = x.clone().contiguous()
        works.append(dist.all_reduce(out, group=group, async_op=True))
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def _shard_rows(linear: nn.Linear, rank: int, tp: int) -> None:
    n = linear.weight.shape[0] // tp
    linear.weight = nn.Parameter(linear.weight.detach()[rank * n:(rank + 1) * n].clone())
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[rank * n:(rank + 1) * n].clone())


def _shard_cols(linear: nn.Linear, rank: int, tp: int) -> None:
    n = linear.weight.shape[1] // tp
    linear.weight = nn.Parameter(linear.weight.detach()[:, rank * n:(rank + 1) * n].clone())


def shard_block_manually(block: TransformerBlock, tp_group) -> None:
    """Keep this rank's Megatron shard of the block's attention and MLP weights (plain tensors)."""
    if block.feed_forward is None:
        raise BadInputError(f"tp_overlap='domino' does not support MoE layer {block.index}: use tp_overlap='none'")
    tp, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    att, ffn = block.attention, block.feed_forward
    check_divisible("num_kv_heads", att.wk.weight.shape[0] // att.qk_dim, "tp", tp)
    check_divisible("ffn_hidden_size", ffn.w1.weight.shape[0], "tp", tp)
    for linear in (att.wq, att.wk, att.wv, ffn.w1) + ((ffn.w3,) if ffn.w3 is not None else ()):
        _shard_rows(linear, rank, tp)
    _shard_cols(att.wo, rank, tp)
    _shard_cols(ffn.w2, rank, tp)


def domino_forward(block: TransformerBlock, x: torch.Tensor, rope: torch.Tensor | None = None, *,
                   group, num_pieces: int) -> torch.Tensor:
    """The block's forward with its 4 TP all-reduces per piece overlapped with the next piece's compute."""
    pieces = x.chunk(min(num_pieces, x.shape[0]), dim=0)
    att, ffn = block.attention, block.feed_forward

    def attn_partial(xi):
        a = _CopyToTP.apply(block.attention_norm(xi), group)
        return F.linear(att.attend(a, rope), att.wo.weight)

    def ffn_partial(hi):
        a = _CopyToTP.apply(block.ffn_norm(hi), group)
        return F.linear(ffn.hidden(a), ffn.w2.weight)

    attn_works, ffn_works = [], []
    attn_out = [_AsyncReduceFromTP.apply(attn_partial(p), group, attn_works) for p in pieces]
    hs, ffn_out = [], []
    for i, p in enumerate(pieces):
        attn_works[i].wait()
        h = p + _bias(attn_out[i], att.wo.bias)
        hs.append(h)
        ffn_out.append(_AsyncReduceFromTP.apply(ffn_partial(h), group, ffn_works))
    outs = []
    for i, h in enumerate(hs):
        ffn_works[i].wait()
        outs.append(h + _bias(ffn_out[i], ffn.w2.bias))
    return torch.cat(outs, dim=0)


def _bias(t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return t if bias is None else t + bias


def enable_manual_tp(block: TransformerBlock, tp_group, *, num_pieces: int) -> None:
    """Shard `block` by hand and route its forward through `domino_forward`."""
    shard_block_manually(block, tp_group)

    def forward(self, x, rope=None):
        return domino_forward(self, x, rope, group=tp_group, num_pieces=num_pieces)

    block.forward = types.MethodType(forward, block)


def apply_domino_tp(model: nn.Module, tp_group, *, num_pieces: int = 2) -> None:
    """TP with Domino overlap on every decoder block of `model` (a full model or a pipeline stage).
    Per-head q/k norms see only this rank's heads: their gradients are summed over tp in sync_gradients."""
    head_norm_params = []
    for _, block in blocks(model):
        block = unwrap_block(block)
        enable_manual_tp(block, tp_group, num_pieces=num_pieces)
        if block.attention.q_norm is not None:
            head_norm_params += [*block.attention.q_norm.parameters(), *block.attention.k_norm.parameters()]
    if head_norm_params and dist.get_world_size(tp_group) > 1:
        def sync(_model):
            for p in head_norm_params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=tp_group)
        add_grad_sync(model, sync)


def time_tp_overlap(spec: ModelSpec, tp_group, *, batch_size: int, seq_len: int, iters: int = 5, warmup: int = 2,
                    seed: int = 0, device: str = "cpu") -> dict[str, float]:
    """Median forward+backward time of one dense block under plain TP (1 piece) and Domino (2 pieces) on
    `tp_group`; every rank must call it. Returns none_s, domino_s and gain = none_s / domino_s - 1."""
    index = next((i for i in range(spec.num_layers) if not spec.is_moe_layer(i)), None)
    if index is None:
        raise BadInputError(f"model {spec.name!r} has no dense layer: Domino overlap needs one")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, seq_len, spec.hidden_size, generator=gen).to(device)
    result = {}
    for name, pieces in (("none_s", 1), ("domino_s", 2)):
        block = TransformerBlock(spec, index).to(device)
        init_module(block, seed, num_layers=spec.num_layers, prefix=f"layers.{index}.")
        enable_manual_tp(block, tp_group, num_pieces=pieces)
        times = []
        for _ in range(warmup + iters):
            dist.barrier(group=tp_group)
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            block(x.requires_grad_()).sum().backward()
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result[name] = statistics.median(times[warmup:])
    result["gain"] = result["none_s"] / result["domino_s"] - 1.0
    return result
