"""The executor's reference decoder: plain torch, GPT/Llama style, dense and MoE, no parallelism inside.

Module names follow torchtitan so that a LaunchPlan's stage lists (`tok_embeddings`, `layers.<i>`, `norm`,
`output`) name real submodules:

    Transformer
      tok_embeddings   nn.Embedding (learned positions live in the sibling `pos_embeddings`, and BLOOM's
                       embedding LayerNorm in `embedding_norm`; both travel with tok_embeddings)
      layers           nn.ModuleDict "0".."n-1" of TransformerBlock (a pipeline stage drops entries, FQNs stay)
        attention_norm, attention (wq wk wv wo, q_norm/k_norm, core), ffn_norm,
        feed_forward (w1 w2 [w3]) or moe (router.gate, experts, [shared_experts])
      norm, output     final norm and LM head (tied to tok_embeddings when spec.tied_embeddings)

A stage module whose `tok_embeddings`/`norm`/`output` were set to None passes hidden states through
(torchtitan's pipeline pattern). Local head counts are read from the activations' shapes (`view(..., -1,
head_dim)`), so a tensor-parallel shard of wq/wk/wv runs unchanged, as in torchtitan.

Approximations (said here so nobody is surprised):
- ALiBi (BLOOM) runs without the linear position bias: same FLOPs and shapes, no position signal.
- MLA (DeepSeek V2/V3) runs as standard multi-head attention with the spec's head dims
  (q/k head_dim = qk_nope_head_dim + qk_rope_head_dim, v head_dim = v_head_dim); no low-rank compression.
- RoPE uses theta = 10000 and the rotate-half convention (Su et al. 2021, RoFormer eq. 34; Llama layout).
- Parallel attention/FFN residuals (NeoX, Cohere) run sequentially, partial RoPE rotates every dim, NoPE layers
  (nope_layers) rotate too, and the spec's
  RoPE base, norm epsilon, attention sinks (gpt-oss: one logit per head), bias-free LayerNorms, LM-head, router and
  expert biases are left out: each holds at most O(h + V + E) parameters and O(tokens) work per layer.
Not built (BadInputError from check_reference_supports): norms_per_layer other than 2, whole-projection qk norms,
a shared-expert gate, and sliding-window or chunked attention layers (its core is full causal attention, which would
time other work than the model's). OLMo2's post-norm order is built as pre-norm (same shapes and FLOPs).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import BadInputError
from planner.models.support import reference_refusal
from planner.nn.common import FeedForward, check_divisible
from planner.nn.moe import MoE
from planner.schemas.model import ModelSpec

ROPE_THETA = 10000.0
INIT_STD = 0.02


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, dtype: torch.dtype | None = None) -> nn.Module:
    """LayerNorm or RMSNorm (Zhang & Sennrich 2019) with a learned scale (and bias for LayerNorm)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps, dtype=dtype)
    return nn.LayerNorm(dim, eps=eps, dtype=dtype)


def qk_head_dim(spec: ModelSpec) -> int:
    """Per-head dim of queries and keys (MLA: nope + rope dims)."""
    if spec.mla is not None:
        return spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim
    return spec.dim_per_head


def v_head_dim(spec: ModelSpec) -> int:
    return spec.mla.v_head_dim if spec.mla is not None else spec.dim_per_head


def rope_cache(seq_len: int, head_dim: int, *, theta: float = ROPE_THETA, dtype=torch.float32) -> torch.Tensor:
    """cos/sin table, shape (2, seq_len, head_dim): angle(p, i) = p * theta^(-2i/d) (RoFormer eq. 15)."""
    if head_dim % 2:
        raise BadInputError(f"head_dim={head_dim} is odd: RoPE needs an even head_dim; use position='learned'")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.stack([angles.cos(), angles.sin()]).to(dtype)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, seq, heads, head_dim) by the cached angles of the first `seq` positions."""
    seq_len = x.shape[1]
    if seq_len > rope.shape[1]:
        raise BadInputError(f"seq_len={seq_len} exceeds the RoPE table ({rope.shape[1]}): build the model with max_seq_len >= {seq_len}")
    cos = rope[0, :seq_len].to(x.dtype)[None, :, None, :]
    sin = rope[1, :seq_len].to(x.dtype)[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class AttentionCore(nn.Module):
    """Causal scaled-dot-product attention on (batch, heads, seq, dim), a module of its own so that hooks
    can time it and selective activation checkpointing can recompute exactly this part. k and v carry the kv heads
    (GQA): SDPA's enable_gqa shares them across the query heads inside the kernel (torch >= 2.5: the flash and math
    backends), so neither a repeated copy nor its saved-for-backward bytes exist, as the cost model prices attention.
    Where no backend that takes GQA runs (fp32 on CUDA: the memory-efficient kernel does not), k and v are repeated
    first (repeat_interleave), as before."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        repeats = q.shape[1] // k.shape[1]
        if repeats == 1:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if q.device.type == "cpu" or q.dtype in (torch.float16, torch.bfloat16):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Multi-head attention with GQA (kv heads shared inside SDPA: AttentionCore), optional qk-norm and RoPE."""

    def __init__(self, spec: ModelSpec, *, tp: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        check_divisible("num_attention_heads", spec.num_attention_heads, "tp", tp)
        check_divisible("num_kv_heads", spec.kv_heads, "tp", tp)
        self.qk_dim, self.v_dim = qk_head_dim(spec), v_head_dim(spec)
        heads, kv_heads = spec.num_attention_heads // tp, spec.kv_heads // tp
        bias = spec.has_qkv_bias
        dim = spec.hidden_size
        self.wq = nn.Linear(dim, heads * self.qk_dim, bias=bias, dtype=dtype)
        self.wk = nn.Linear(dim, kv_heads * self.qk_dim, bias=bias, dtype=dtype)
        self.wv = nn.Linear(dim, kv_heads * self.v_dim, bias=bias, dtype=dtype)
        self.wo = nn.Linear(heads * self.v_dim, dim, bias=spec.has_out_bias, dtype=dtype)
        self.q_norm = nn.RMSNorm(self.qk_dim, eps=1e-6, dtype=dtype) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(self.qk_dim, eps=1e-6, dtype=dtype) if spec.qk_norm else None
        self.use_rope = spec.position == "rope"
        self.core = AttentionCore()

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        return self.wo(self.attend(x, rope))

    def attend(self, x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
        """Everything up to (not including) the output projection; returns (batch, seq, local heads * v_dim)."""
        batch, seq_len, _ = x.shape
        q = self.wq(x).view(batch, seq_len, -1, self.qk_dim)
        k = self.wk(x).view(batch, seq_len, -1, self.qk_dim)
        v = self.wv(x).view(batch, seq_len, -1, self.v_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            if rope is None:
                rope = rope_cache(seq_len, self.qk_dim).to(x.device)
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2).reshape(batch, seq_len, -1)


def check_reference_supports(spec: ModelSpec) -> None:
    """BadInputError naming the first spec feature this reference decoder does not build (parameter counts and the
    analytic cost model cover them; the executor and the layer profiler do not): planner.models.support."""
    refused = reference_refusal(spec)
    if refused is not None:
        raise BadInputError(refused)


class TransformerBlock(nn.Module):
    """Pre-norm decoder block. `tp`/`ep` build the local (per-rank) shapes used for profiling:
    heads/tp, kv_heads/tp, ffn/tp, experts/ep."""

    def __init__(self, spec: ModelSpec, index: int, *, tp: int = 1, ep: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        check_reference_supports(spec)
        self.index = index
        self.attention_norm = make_norm(spec.norm, spec.hidden_size, dtype=dtype)
        self.attention = Attention(spec, tp=tp, dtype=dtype)
        self.ffn_norm = make_norm(spec.norm, spec.hidden_size, dtype=dtype)
        self.feed_forward: FeedForward | None = None
        self.moe: MoE | None = None
        if spec.is_moe_layer(index):
            self.moe = MoE(spec, tp=tp, ep=ep, dtype=dtype)
        else:
            check_divisible("ffn_hidden_size", spec.ffn_hidden_size, "tp", tp)
            self.feed_forward = FeedForward(
                spec.hidden_size, spec.ffn_hidden_size // tp, activation=spec.activation, bias=spec.has_mlp_bias, dtype=dtype
            )

    def forward(self, x: torch.Tensor, rope: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        ffn = self.moe if self.moe is not None else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    """The full decoder (or, with parts set to None / layers deleted, one pipeline stage of it)."""

    def __init__(self, spec: ModelSpec, *, max_seq_len: int | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.spec = spec
        self.max_seq_len = max(max_seq_len or spec.seq_len, spec.seq_len)
        dim = spec.hidden_size
        self.tok_embeddings = nn.Embedding(spec.vocab_size, dim, dtype=dtype)
        rows = spec.num_positions or self.max_seq_len  # a fixed learned table (HF import) keeps its size
        self.pos_embeddings = nn.Embedding(rows, dim, dtype=dtype) if spec.position == "learned" else None
        self.embedding_norm = make_norm("layernorm", dim, dtype=dtype) if spec.embedding_norm else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i, dtype=dtype) for i in range(spec.num_layers)})
        self.norm = make_norm(spec.norm, dim, dtype=dtype)
        self.output = nn.Linear(dim, spec.vocab_size, bias=False, dtype=dtype)
        self.tie_weights()
        rope = rope_cache(self.max_seq_len, qk_head_dim(spec)) if spec.position == "rope" else torch.zeros(0)
        self.register_buffer("rope", rope, persistent=False)

    def tie_weights(self) -> None:
        """With spec.tied_embeddings, make the LM head's weight the embedding's Parameter (GPT-2 / tied Llama).
        Call again after `to_empty`/`_apply` conversions: they replace each module's Parameter separately
        (meta -> device creates new tensors), which silently unties the two."""
        if self.spec.tied_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def is_tied(self) -> bool:
        """True when the head and the embedding share one Parameter (and so one storage)."""
        return self.output is not None and self.tok_embeddings is not None and self.output.weight is self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) int64 -> logits (batch, seq, vocab); a stage without the embedding takes and
        returns hidden states (batch, seq, hidden)."""
        h = tokens
        if self.tok_embeddings is not None:
            h = self.embed(tokens)
        rope = self.rope if self.spec.position == "rope" else None
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
            h = h + self.pos_embeddings(positions)
        if self.embedding_norm is not None:
            h = self.embedding_norm(h)
        return h

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic init, the same for any layout: each parameter draws from its own generator seeded
        by (seed, its FQN), so a pipeline stage initialised alone gets the same weights as the full model.
        Call it on the full (unsharded) module, before TP/FSDP/EP wrap it. Scheme: GPT-2 (Radford et al.
        2019, sec. 2.3): N(0, 0.02), residual output projections (wo, w2, experts.w2) scaled by
        1/sqrt(2 * num_layers); biases 0; norm scales 1."""
        if self.spec.position == "rope":
            self.rope = rope_cache(self.max_seq_len, qk_head_dim(self.spec)).to(self.rope.device)
        init_module(self, seed, num_layers=self.spec.num_layers)


def keep_only(model: Transformer, names: list[str] | tuple[str, ...]) -> Transformer:
    """Cut `model` in place down to one pipeline stage: keep the listed top-level parts (`tok_embeddings`,
    `layers.<i>`, `norm`, `output`) and drop the rest, FQNs unchanged. `pos_embeddings`/`embedding_norm`
    travel with `tok_embeddings`. A tied LM head on a stage without the embedding keeps its own copy of the
    weight (gradients are then not shared across stages: sync them as Megatron does, or untie)."""
    wanted = set(names)
    known = {"tok_embeddings", "norm", "output"} | {f"layers.{i}" for i in model.layers}
    if unknown := sorted(wanted - known):
        raise BadInputError(f"stage names {unknown} are not modules of {model.spec.name!r}: use tok_embeddings, layers.<i>, norm, output")
    if "tok_embeddings" not in wanted:
        model.tok_embeddings = model.pos_embeddings = model.embedding_norm = None
    for i in list(model.layers):
        if f"layers.{i}" not in wanted:
            del model.layers[i]
    if "norm" not in wanted:
        model.norm = None
    if "output" not in wanted:
        model.output = None
    return model


def init_module(module: nn.Module, seed: int, *, num_layers: int, prefix: str = "") -> None:
    """Initialise every parameter of `module` (FQNs relative to the full Transformer via `prefix`)."""
    residual_std = INIT_STD / math.sqrt(2 * num_layers)
    with torch.no_grad():
        for name, param in module.named_parameters():
            fqn = prefix + name
            leaf = fqn.rsplit(".", 1)[-1]
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % 2**63)
            if leaf == "bias":
                param.zero_()
            elif _is_norm_scale(module, name):
                param.fill_(1.0)
            else:
                std = residual_std if (".wo." in f".{fqn}" or ".w2" in fqn) else INIT_STD
                full = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
                param.copy_(full.to(param.dtype))


def _is_norm_scale(module: nn.Module, name: str) -> bool:
    owner_name = name.rsplit(".", 1)[0] if "." in name else ""
    owner = module.get_submodule(owner_name)
    return isinstance(owner, (nn.LayerNorm, nn.RMSNorm))


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
