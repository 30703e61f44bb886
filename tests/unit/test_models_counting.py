"""planner.models.counting against independent closed forms (no torch, no transformers)."""

import pytest

from planner.models import counting
from planner.schemas.model import MLASpec, MoESpec, ModelSpec


def _gpt(l: int, h: int, a: int, v: int, s: int, **extra) -> ModelSpec:
    fields = dict(
        name="gpt", num_layers=l, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=a, vocab_size=v,
        seq_len=s, activation="gelu", norm="layernorm", position="learned", tied_embeddings=True, linear_bias=True,
    )
    fields.update(extra)
    return ModelSpec(**fields)


@pytest.mark.parametrize(
    "l,h,a,v,s",
    [(12, 768, 12, 50257, 1024), (24, 1024, 16, 50257, 1024), (2, 64, 4, 100, 32), (96, 12288, 96, 50257, 2048)],
)
def test_gpt_style_matches_megatron_closed_form(l, h, a, v, s):
    # Narayanan et al. 2021, Sec. 5.1: P = 12 l h^2 + 13 l h + (V + s) h, plus the final LayerNorm (2h).
    expected = 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h
    assert counting.total_params(_gpt(l, h, a, v, s)) == expected


def test_gpt2_small_is_124m():
    # HF gpt2: 124,439,808 parameters (sum of p.numel() over GPT2LMHeadModel, tied head counted once).
    assert counting.total_params(_gpt(12, 768, 12, 50257, 1024)) == 124_439_808


def test_llama_style_closed_form_with_gqa():
    l, h, f, a, kv, v = 3, 256, 688, 8, 2, 1000
    d = h // a
    spec = ModelSpec(
        name="llama", num_layers=l, hidden_size=h, ffn_hidden_size=f, num_attention_heads=a, num_kv_heads=kv,
        vocab_size=v, seq_len=128, activation="swiglu", norm="rmsnorm",
    )
    per_layer = (2 * h * h + 2 * h * kv * d) + 3 * h * f + 2 * h
    assert counting.attention_params(spec) == 2 * h * h + 2 * h * kv * d
    assert counting.total_params(spec) == 2 * v * h + l * per_layer + h
    assert counting.active_params(spec) == counting.total_params(spec)


def test_tinyllama_exact_measured_count():
    # h100_hf_tinyllama.jsonl: HF LlamaForCausalLM TinyLlama-1.1B shape has params=1,100,048,384.
    spec = ModelSpec(
        name="tinyllama", num_layers=22, hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=32,
        num_kv_heads=4, vocab_size=32000, seq_len=2048, activation="swiglu", norm="rmsnorm",
    )
    assert counting.total_params(spec) == 1_100_048_384


def test_biases_qk_norm_and_embedding_norm():
    base = dict(name="m", num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=2,
                vocab_size=10, seq_len=16, activation="swiglu", norm="rmsnorm")
    plain = ModelSpec(**base)
    qkv = ModelSpec(**base, qkv_bias=True)
    assert counting.attention_params(qkv) - counting.attention_params(plain) == 64 + 2 * 32
    qk = ModelSpec(**base, qk_norm=True)
    assert counting.attention_params(qk) - counting.attention_params(plain) == 2 * 16
    biased = ModelSpec(**base, linear_bias=True)
    assert counting.mlp_params(biased, 128) - counting.mlp_params(plain, 128) == 2 * 128 + 64
    embn = ModelSpec(**{**base, "norm": "layernorm"}, embedding_norm=True)
    assert counting.embedding_params(embn) == 10 * 64 + 2 * 64


def test_imported_layout_fields_closed_forms():
    """Fields the HF importer sets for OLMo2, Gemma, Falcon, Llama attention_bias/mlp_bias and OPT/GPT-2 tables."""
    base = dict(name="m", num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_kv_heads=2,
                vocab_size=10, seq_len=16, activation="swiglu", norm="rmsnorm")
    plain = ModelSpec(**base)
    attn_bias = ModelSpec(**base, qkv_bias=True, out_bias=True)
    assert counting.attention_params(attn_bias) - counting.attention_params(plain) == 64 + 2 * 32 + 64
    mlp_bias = ModelSpec(**base, mlp_bias=True)
    assert counting.mlp_params(mlp_bias, 128) - counting.mlp_params(plain, 128) == 2 * 128 + 64
    assert counting.attention_params(mlp_bias) == counting.attention_params(plain)
    olmo = ModelSpec(**base, qk_norm=True, qk_norm_scope="projection")  # norms over a*d = 64 and kv*d = 32
    assert counting.attention_params(olmo) - counting.attention_params(plain) == 64 + 32
    for norms in (1, 2, 4):
        layer = ModelSpec(**base, norms_per_layer=norms)
        assert counting.decoder_layer_params(layer, 0) - counting.decoder_layer_params(plain, 0) == (norms - 2) * 64
    opt = ModelSpec(**{**base, "position": "learned"}, num_positions=16 + 2)
    assert counting.embedding_params(opt) == 10 * 64 + 18 * 64
    assert counting.embedding_params(ModelSpec(**{**base, "position": "learned"})) == 10 * 64 + 16 * 64


def test_shared_expert_gate_counts_with_the_router():
    h, e = 64, 4
    moe = dict(num_experts=e, top_k=2, expert_ffn_hidden_size=24, num_shared_experts=1, shared_expert_ffn_hidden_size=40)
    fields = dict(name="q2moe", num_layers=2, hidden_size=h, ffn_hidden_size=96, num_attention_heads=4, vocab_size=10,
                  seq_len=16, activation="swiglu", norm="rmsnorm")
    plain = ModelSpec(**fields, moe=MoESpec(**moe))
    gated = ModelSpec(**fields, moe=MoESpec(**moe, shared_expert_gate=True))
    assert counting.moe_params(gated).router == counting.moe_params(plain).router + h == h * (e + 1)
    assert counting.moe_params(gated).shared == 3 * h * 40
    assert counting.total_params(gated) - counting.total_params(plain) == 2 * h
    assert counting.active_params(gated) - counting.active_params(plain) == 2 * h


def test_moe_counts_all_experts_and_active_topk():
    h, f, e, k, l = 64, 96, 8, 2, 4
    spec = ModelSpec(
        name="moe", num_layers=l, hidden_size=h, ffn_hidden_size=256, num_attention_heads=4, vocab_size=50,
        seq_len=32, activation="swiglu", norm="rmsnorm",
        moe=MoESpec(num_experts=e, top_k=k, expert_ffn_hidden_size=f, num_shared_experts=1, first_k_dense=1),
    )
    moe = counting.moe_params(spec)
    assert (moe.router, moe.per_expert, moe.shared) == (h * e, 3 * h * f, 3 * h * f)
    attn, norms = 4 * h * h, 2 * h
    dense_layer = attn + norms + 3 * h * 256
    moe_layer = attn + norms + h * e + e * 3 * h * f + 3 * h * f
    assert counting.decoder_layer_params(spec, 0) == dense_layer
    assert counting.decoder_layer_params(spec, 1) == moe_layer
    total = 2 * 50 * h + dense_layer + 3 * moe_layer + h
    assert counting.total_params(spec) == total
    assert counting.active_params(spec) == total - 3 * (e - k) * 3 * h * f


def test_mla_closed_form():
    h, a = 128, 4
    mla = MLASpec(q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    spec = ModelSpec(name="mla", num_layers=1, hidden_size=h, ffn_hidden_size=256, num_attention_heads=a,
                     vocab_size=10, seq_len=16, activation="swiglu", norm="rmsnorm", mla=mla)
    q = h * 48 + 48 + 48 * a * 24
    kv = h * (32 + 8) + 32 + 32 * a * (16 + 16)
    o = a * 16 * h
    assert counting.attention_params(spec) == q + kv + o
    no_qlora = spec.model_copy(update={"mla": mla.model_copy(update={"q_lora_rank": None})})
    assert counting.attention_params(no_qlora) == h * a * 24 + kv + o


def test_layer_index_out_of_range():
    spec = _gpt(2, 64, 4, 100, 32)
    with pytest.raises(ValueError, match="out of range"):
        counting.decoder_layer_params(spec, 2)


@pytest.mark.parametrize(
    "extra",
    [
        dict(activation="swiglu", norm="rmsnorm", num_kv_heads=2),
        dict(activation="gelu", position="learned", tied_embeddings=True, linear_bias=True),
        dict(activation="gelu", position="learned", num_positions=34, out_bias=True, mlp_bias=True),
        dict(activation="gelu", position="alibi", tied_embeddings=True, linear_bias=True, embedding_norm=True),
        dict(activation="swiglu", norm="rmsnorm", num_kv_heads=2, qkv_bias=True, qk_norm=True,
             moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, num_shared_experts=1, first_k_dense=1)),
    ],
)
def test_matches_the_torch_reference_decoder(extra):
    """Independent count: sum of numel over planner.nn.Transformer, the model the executor trains (MLA aside:
    the reference decoder runs MLA as standard attention with the MLA head dims)."""
    pytest.importorskip("torch")
    from planner.nn import Transformer

    fields = dict(name="x", num_layers=3, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  vocab_size=100, seq_len=32, norm="layernorm")
    spec = ModelSpec(**{**fields, **extra})
    model = Transformer(spec)
    assert sum(p.numel() for p in model.parameters()) == counting.total_params(spec)


@pytest.mark.parametrize(
    "extra, named",
    [
        (dict(norms_per_layer=4), "norms_per_layer=4"),
        (dict(qk_norm=True, qk_norm_scope="projection"), "qk_norm_scope"),
        (dict(moe=MoESpec(num_experts=2, top_k=1, expert_ffn_hidden_size=32, num_shared_experts=1, shared_expert_gate=True)),
         "shared_expert_gate"),
    ],
)
def test_reference_decoder_refuses_layouts_it_does_not_build(extra, named):
    pytest.importorskip("torch")
    from planner.errors import BadInputError
    from planner.nn import Transformer

    spec = ModelSpec(name="x", num_layers=1, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, vocab_size=100,
                     seq_len=32, activation="swiglu", norm="rmsnorm", **extra)
    with pytest.raises(BadInputError, match=named):
        Transformer(spec)
