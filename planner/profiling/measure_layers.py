"""The layers we profile, one per distinct layer type, built from a ModelSpec at one TP/EP rank's shape.

Layer types (the cost model's names): `embedding` (token + learned position embeddings, BLOOM's embedding
norm), `decoder` (a dense decoder block), `moe_decoder` (a block whose FFN is routed experts), `head`
(final norm + LM head + cross-entropy loss). Each is built from `planner.nn` (the executor's reference
model) at the per-rank shape of Megatron-style TP (Shoeybi et al. 2019, sec. 3): heads/tp, kv_heads/tp,
ffn/tp, vocab/tp for the embedding and LM head; EP keeps experts/ep on a rank.

Operators (OpRecord names): norm_attn, qkv, qk_norm, attn_core, attn_out, norm_mlp, mlp_up (gate and up
GEMMs), mlp_down, router, experts, shared_experts, embedding, embedding_norm, final_norm, lm_head, loss.
What is not inside an operator module (RoPE, residual adds, the MLP's elementwise activation, reshapes,
MoE permutation) is the layer total minus the operators, recorded as `other`.

EP on one process: a rank with E/ep local experts receives, with balanced routing, as many (token, expert)
assignments as its own tokens times top_k (Lepikhin et al. 2020, sec. 2.2), so the layer is built with
num_experts = E/ep and top_k = min(top_k, E/ep); the all-to-all itself is a communication cost, measured by
`planner profile comm`. The router therefore has E/ep outputs instead of E (a negligible GEMM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import BadInputError
from planner.nn.common import check_divisible
from planner.nn.model import TransformerBlock, make_norm, qk_head_dim, rope_cache
from planner.schemas.model import ModelSpec


@dataclass(frozen=True)
class OpSpec:
    """One operator: the submodules (paths relative to the layer module) whose calls it is made of."""

    name: str
    modules: tuple[str, ...]


@dataclass
class LayerCase:
    """One layer to measure: its module, fresh inputs, and the forward that returns what to backpropagate."""

    layer_type: str
    module: nn.Module
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    apply: Callable[[tuple[torch.Tensor, ...]], Sequence[torch.Tensor]]
    ops: tuple[OpSpec, ...]
    constants: tuple[torch.Tensor, ...] = ()
    selective_module: str | None = None  # recomputed under selective recompute (Korthikanti et al. 2022, sec. 4.2)
    note: str = ""  # what this build approximates, recorded in the entry's message


class EmbeddingLayer(nn.Module):
    """Vocab-parallel token embedding (vocab/tp rows), learned positions and BLOOM's embedding norm."""

    def __init__(self, spec: ModelSpec, *, tp: int, seq_len: int, dtype: torch.dtype):
        super().__init__()
        self.tok_embeddings = nn.Embedding(-(-spec.vocab_size // tp), spec.hidden_size, dtype=dtype)
        self.pos_embeddings = nn.Embedding(seq_len, spec.hidden_size, dtype=dtype) if spec.position == "learned" else None
        self.embedding_norm = make_norm("layernorm", spec.hidden_size, dtype=dtype) if spec.embedding_norm else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        return self.embedding_norm(h) if self.embedding_norm is not None else h


class CrossEntropy(nn.Module):
    """Mean token cross-entropy, a module so that it can be timed as an operator."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


class HeadLayer(nn.Module):
    """Final norm, vocab-parallel LM head (vocab/tp columns) and the loss (on the local vocabulary shard)."""

    def __init__(self, spec: ModelSpec, *, tp: int, dtype: torch.dtype):
        super().__init__()
        self.norm = make_norm(spec.norm, spec.hidden_size, dtype=dtype)
        self.output = nn.Linear(spec.hidden_size, -(-spec.vocab_size // tp), bias=False, dtype=dtype)
        self.loss = CrossEntropy()

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.output(self.norm(h)), targets)


def layer_types(spec: ModelSpec) -> tuple[str, ...]:
    """The distinct layer types of a model, in model order."""
    kinds = ["embedding"]
    if any(not spec.is_moe_layer(i) for i in range(spec.num_layers)):
        kinds.append("decoder")
    if spec.num_moe_layers:
        kinds.append("moe_decoder")
    return (*kinds, "head")


def _decoder_index(spec: ModelSpec, moe: bool) -> int:
    return next(i for i in range(spec.num_layers) if spec.is_moe_layer(i) == moe)


def _ep_spec(spec: ModelSpec, ep: int) -> ModelSpec:
    """The spec one EP rank computes with: E/ep experts, top_k capped at E/ep (see the module docstring)."""
    check_divisible("moe.num_experts", spec.moe.num_experts, "ep", ep)
    local = spec.moe.num_experts // ep
    moe = spec.moe.model_copy(update={"num_experts": local, "top_k": min(spec.moe.top_k, local)})
    return spec.model_copy(update={"moe": moe})


def _decoder_ops(block: TransformerBlock) -> tuple[OpSpec, ...]:
    ops = [OpSpec("norm_attn", ("attention_norm",)), OpSpec("qkv", ("attention.wq", "attention.wk", "attention.wv"))]
    if block.attention.q_norm is not None:
        ops.append(OpSpec("qk_norm", ("attention.q_norm", "attention.k_norm")))
    ops += [OpSpec("attn_core", ("attention.core",)), OpSpec("attn_out", ("attention.wo",)), OpSpec("norm_mlp", ("ffn_norm",))]
    if block.moe is not None:
        ops += [OpSpec("router", ("moe.router",)), OpSpec("experts", ("moe.experts",))]
        if block.moe.shared_experts is not None:
            ops.append(OpSpec("shared_experts", ("moe.shared_experts",)))
    else:
        up = ("feed_forward.w1",) + (("feed_forward.w3",) if block.feed_forward.w3 is not None else ())
        ops += [OpSpec("mlp_up", up), OpSpec("mlp_down", ("feed_forward.w2",))]
    return tuple(ops)


def build_case(spec: ModelSpec, layer_type: str, *, tp: int, ep: int, microbatch_size: int, seq_len: int,
               device: torch.device, param_dtype: torch.dtype) -> LayerCase:
    """Build one layer of `layer_type` on `device` (the meta device for counts) at one rank's shape."""
    check_divisible("num_attention_heads", spec.num_attention_heads, "tp", tp)
    shape = (microbatch_size, seq_len)
    hidden = (microbatch_size, seq_len, spec.hidden_size)
    float_dtype = param_dtype
    with torch.device(device):
        if layer_type == "embedding":
            module = EmbeddingLayer(spec, tp=tp, seq_len=seq_len, dtype=param_dtype)
            vocab = module.tok_embeddings.num_embeddings
            ops = [OpSpec("embedding", ("tok_embeddings",) + (("pos_embeddings",) if module.pos_embeddings else ()))]
            if module.embedding_norm is not None:
                ops.append(OpSpec("embedding_norm", ("embedding_norm",)))
            return LayerCase(layer_type, module, lambda: (torch.randint(0, vocab, shape, device=device),),
                             lambda inputs: (module(*inputs),), tuple(ops))
        if layer_type == "head":
            module = HeadLayer(spec, tp=tp, dtype=param_dtype)
            vocab = module.output.out_features
            ops = (OpSpec("final_norm", ("norm",)), OpSpec("lm_head", ("output",)), OpSpec("loss", ("loss",)))
            return LayerCase(layer_type, module,
                             lambda: (torch.randn(hidden, device=device, dtype=float_dtype, requires_grad=True),
                                      torch.randint(0, vocab, shape, device=device)),
                             lambda inputs: (module(*inputs),), ops)
        if layer_type not in ("decoder", "moe_decoder"):
            raise BadInputError(f"layer_type={layer_type!r} is unknown: choose embedding, decoder, moe_decoder or head")
        moe = layer_type == "moe_decoder"
        if moe and spec.moe is None:
            raise BadInputError(f"layer_type='moe_decoder' but model {spec.name!r} has no moe section")
        layer_spec = _ep_spec(spec, ep) if moe else spec
        note = ""
        if moe and ep > 1:
            note = f"ep={ep}: built with {layer_spec.moe.num_experts} local experts, top_k={layer_spec.moe.top_k}; all-to-all not included"
        module = TransformerBlock(layer_spec, _decoder_index(spec, moe), tp=tp, dtype=param_dtype)
        rope = rope_cache(seq_len, qk_head_dim(spec), dtype=torch.float32).to(device)
        uses_rope = spec.position == "rope"
        return LayerCase(
            layer_type, module,
            lambda: (torch.randn(hidden, device=device, dtype=float_dtype, requires_grad=True),),
            lambda inputs: (module(inputs[0], rope if uses_rope else None),),
            _decoder_ops(module), constants=(rope,), selective_module="attention.core", note=note,
        )
