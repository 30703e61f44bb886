"""The reference model (planner.nn): shapes, deterministic init, stage cutting, MoE routing against a naive
per-token loop, capacity drops, activation checkpointing equivalence (single process, CPU, fp32)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from planner.errors import BadInputError  # noqa: E402
from planner.schemas.model import ModelSpec, MoESpec  # noqa: E402

BASE = dict(num_layers=3, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, vocab_size=50, seq_len=12)
LLAMA = ModelSpec(name="llama", activation="swiglu", norm="rmsnorm", num_kv_heads=2, qk_norm=True, **BASE)
GPT = ModelSpec(name="gpt", activation="gelu", position="learned", linear_bias=True, tied_embeddings=True,
                embedding_norm=True, **BASE)


def moe_spec(capacity_factor=None, shared=1):
    return ModelSpec(name="moe", activation="swiglu", norm="rmsnorm", **BASE,
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=16, num_shared_experts=shared,
                                 capacity_factor=capacity_factor, first_k_dense=1, moe_every=2))


def build(spec, seed=0):
    from planner.nn import Transformer

    model = Transformer(spec)
    model.init_weights(seed)
    return model


def tokens(spec, batch=2, seed=3):
    return torch.randint(0, spec.vocab_size, (batch, spec.seq_len), generator=torch.Generator().manual_seed(seed))


def test_import_planner_does_not_import_torch():
    code = "import sys, planner, planner.executor; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("spec", [LLAMA, GPT, moe_spec(1.0)], ids=["llama", "gpt", "moe"])
def test_forward_shapes_names_and_deterministic_init(spec):
    model, again, other = build(spec), build(spec), build(spec, seed=1)
    x = tokens(spec)
    logits = model(x)
    assert logits.shape == (2, spec.seq_len, spec.vocab_size) and logits.dtype == torch.float32
    assert torch.equal(logits, again(x))
    assert not torch.equal(logits, other(x))
    names = set(dict(model.named_modules()))
    assert {"tok_embeddings", "layers.0.attention.wq", "layers.0.attention.core", "norm", "output"} <= names
    if spec.moe is not None:
        assert {"layers.1.moe.router.gate", "layers.1.moe.experts", "layers.1.moe.shared_experts"} <= names
        assert "layers.0.feed_forward.w3" in names and "layers.2.feed_forward.w1" in names


def test_tied_embeddings_share_one_tensor_and_init_is_gpt2_scaled():
    model = build(GPT)
    assert model.output.weight is model.tok_embeddings.weight
    wo = model.layers["0"].attention.wo.weight
    assert abs(wo.std().item() - 0.02 / math.sqrt(2 * GPT.num_layers)) < 0.004
    assert torch.equal(model.layers["0"].attention_norm.weight, torch.ones(32))
    assert torch.count_nonzero(model.layers["0"].attention.wq.bias) == 0


def test_local_shapes_for_profiling():
    from planner.nn import TransformerBlock

    block = TransformerBlock(LLAMA, 0, tp=2)
    assert block.attention.wq.weight.shape == (2 * 8, 32)  # 4 heads / tp=2, head_dim 8
    assert block.attention.wk.weight.shape == (1 * 8, 32)  # 2 kv heads / tp=2
    assert block.feed_forward.w1.weight.shape == (32, 32)
    moe_block = TransformerBlock(moe_spec(), 1, tp=2, ep=2)
    assert moe_block.moe.experts.w1.shape == (2, 16, 32)
    with pytest.raises(BadInputError, match="tp=3 must divide num_attention_heads=4"):
        TransformerBlock(LLAMA, 0, tp=3)
    with pytest.raises(BadInputError, match="ep=3 must divide moe.num_experts=4"):
        TransformerBlock(moe_spec(), 1, ep=3)


def test_pipeline_stages_chain_to_the_full_model_and_init_alone_identically():
    from planner.nn import Transformer, keep_only

    full = build(LLAMA)
    x = tokens(LLAMA)
    first = keep_only(build(LLAMA), ["tok_embeddings", "layers.0"])
    second = Transformer(LLAMA)
    keep_only(second, ["layers.1", "layers.2", "norm", "output"]).init_weights(0)  # init after cutting
    assert list(second.layers) == ["1", "2"] and second.tok_embeddings is None
    assert torch.allclose(second(first(x)), full(x), atol=1e-6)
    with pytest.raises(BadInputError, match="layers.7"):
        keep_only(build(LLAMA), ["layers.7"])


def test_rope_scores_depend_only_on_relative_position():
    from planner.nn.model import apply_rope, rope_cache

    rope = rope_cache(16, 8)
    q, k = torch.randn(8), torch.randn(8)
    seq_q = apply_rope(q.expand(1, 16, 1, 8), rope)[0, :, 0]
    seq_k = apply_rope(k.expand(1, 16, 1, 8), rope)[0, :, 0]
    assert torch.allclose(seq_q[5] @ seq_k[3], seq_q[9] @ seq_k[7], atol=1e-5)
    with pytest.raises(BadInputError, match="exceeds the RoPE table"):
        apply_rope(torch.randn(1, 20, 1, 8), rope)


def naive_moe(moe, x):
    """Per token: top-k of softmax, renormalised, capacity in token order per expert, plus shared experts."""
    from planner.nn.common import activation_fn

    x2 = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(moe.router.gate(x2), dim=-1)
    cap = moe.capacity(x2.shape[0])
    used = [0] * moe.num_experts
    out, dropped = torch.zeros_like(x2), 0
    e_w = moe.experts
    # assignments are served expert by expert in token order (GShard); count per expert
    weights, experts = torch.topk(probs, moe.top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    for t in range(x2.shape[0]):
        for j in range(moe.top_k):
            e = int(experts[t, j])
            if cap is not None and used[e] >= cap:
                dropped += 1
                continue
            used[e] += 1
            h = activation_fn("swiglu")(x2[t] @ e_w.w1[e].t()) * (x2[t] @ e_w.w3[e].t())
            out[t] += weights[t, j] * (h @ e_w.w2[e].t())
    if moe.shared_experts is not None:
        out = out + moe.shared_experts(x2)
    return out.reshape(x.shape), dropped


@pytest.mark.parametrize("capacity_factor", [None, 1.0, 0.5])
def test_moe_matches_naive_routing_and_counts_drops(capacity_factor):
    model = build(moe_spec(capacity_factor))
    moe = model.layers["1"].moe
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = moe(x)
        want, dropped = naive_moe(moe, x)
    assert torch.allclose(got, want, atol=1e-5)
    assert int(moe.dropped_tokens) == dropped and int(moe.routed_tokens) == 24 * 2
    if capacity_factor is None:
        assert dropped == 0
    else:
        assert moe.capacity(24) == math.ceil(capacity_factor * 24 * 2 / 4)
    if capacity_factor == 0.5:
        assert dropped > 0
    assert moe.router.aux_loss is not None and moe.router.aux_loss.item() >= 1.0 - 1e-5  # E*sum f*P >= 1
    moe.router.keep_aux_loss = True
    moe(x.requires_grad_())
    moe.router.aux_loss.backward()
    assert moe.router.gate.weight.grad is not None and moe.router.gate.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("mode,full_layers", [("full", 0), ("selective", 0), ("selective", 1), ("none", 2)])
def test_activation_checkpointing_gives_the_same_gradients(mode, full_layers):
    from planner.executor.parallelize import apply_ac, dropped_tokens

    spec = moe_spec(1.0)
    x = tokens(spec)
    plain, wrapped = build(spec), build(spec)
    apply_ac(wrapped, mode, full_layers)
    for model in (plain, wrapped):
        model(x).float().pow(2).mean().backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in wrapped.named_parameters()}
    for name, p in plain.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-6), name
    assert dropped_tokens(wrapped) == dropped_tokens(plain)  # recompute does not count twice
    if mode == "full" or full_layers:
        assert type(wrapped.layers["0"]).__name__ == "CheckpointWrapper"
    with pytest.raises(BadInputError, match="recompute mode"):
        apply_ac(build(LLAMA), "most")


def test_train_steps_lowers_the_loss_and_bf16_runs():
    from planner.executor.parallelize import build_optimizer
    from planner.executor.train import synthetic_batches, train_steps
    from planner.nn import Transformer

    model = build(LLAMA)
    batch = synthetic_batches(vocab_size=50, batch_size=4, seq_len=12, steps=1, seed=0)
    losses = train_steps(model, build_optimizer(model, zero_stage=0, lr=1e-2), batch * 6, num_microbatches=2)
    assert losses[-1] < losses[0] - 0.05
    bf16 = Transformer(LLAMA, dtype=torch.bfloat16)
    bf16.init_weights(0)
    assert bf16(tokens(LLAMA)).dtype == torch.bfloat16


def test_mla_runs_as_standard_attention_with_its_head_dims_and_alibi_runs_without_bias():
    from planner.schemas.model import MLASpec

    mla = ModelSpec(name="mla", activation="swiglu", norm="rmsnorm", **BASE,
                    mla=MLASpec(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6))
    model = build(mla)
    att = model.layers["0"].attention
    assert att.wq.weight.shape == (4 * 12, 32) and att.wv.weight.shape == (4 * 6, 32) and att.wo.weight.shape == (32, 24)
    assert model(tokens(mla)).shape == (2, 12, 50)
    alibi = build(ModelSpec(name="bloom", position="alibi", **BASE))
    assert alibi.pos_embeddings is None and alibi.rope.numel() == 0
    assert torch.isfinite(alibi(tokens(GPT))).all()


def test_optimizer_and_precision_choices_are_checked():
    from planner.executor.parallelize import build_optimizer, mp_policy

    model = build(LLAMA)
    assert isinstance(build_optimizer(model, zero_stage=0, optimizer="sgd"), torch.optim.SGD)
    assert isinstance(build_optimizer(model, zero_stage=1), torch.optim.AdamW)  # no dp group: nothing to shard
    with pytest.raises(BadInputError, match="optimizer='lion'"):
        build_optimizer(model, zero_stage=0, optimizer="lion")
    assert mp_policy("fp32") is None and mp_policy("bf16").param_dtype == torch.bfloat16
    assert mp_policy("amp-bf16") is None  # fp32 parameters gathered as they are, autocast computes in bf16
    with pytest.raises(BadInputError, match="precision='fp16'"):
        mp_policy("fp16")


def test_token_log_keeps_dispatch_order_across_chunks():
    from planner.nn.moe import TokenLog

    log = TokenLog()
    log.CHUNK = 4  # instance attribute: the class keeps 1024
    for count in range(10):
        log.append(torch.tensor(count, dtype=torch.int32))
    assert len(log) == 10 and len(log.chunks) == 2 and log.values().tolist() == list(range(10))
    assert log.values().dtype == torch.int64 and TokenLog.CHUNK == 1024
