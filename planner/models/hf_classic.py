"""HuggingFace configs of the GPT lineage (LayerNorm, plain FFN) -> ModelSpec fields: gpt2, gpt_neox, opt, bloom,
falcon. Key names and defaults from transformers 5.x (models/<type>/configuration_<type>.py, modeling_<type>.py).

Each family's `*_EXPECTS` lists config values other than which the module layout changes in ways the schema does
not express (HFConfig.require_values refuses them in one line).
"""

from typing import Any

from planner.models.hf_config import MAX_DEFAULT_SEQ_LEN, HFConfig, activation, seq_len

BLOOM_SEQ_LEN = 2048  # BLOOM pre-training sequence length (BigScience tr11 README); its config has no such field
OPT_POSITION_OFFSET = 2  # modeling_opt.OPTLearnedPositionalEmbedding: num_embeddings + 2
FALCON_DEFAULTS = {"max_position_embeddings": 2048, "tie_word_embeddings": True}  # configuration_falcon.py

GPT2_EXPECTS = {"add_cross_attention": False}  # cross-attention blocks (encoder-decoder use) add parameters
# do_layer_norm_before=False (OPT-350m) drops the final LayerNorm; no affine = norms without parameters.
OPT_EXPECTS = {"do_layer_norm_before": True, "_remove_final_layer_norm": False, "layer_norm_elementwise_affine": True}


def gpt2(cfg: HFConfig) -> dict[str, Any]:
    """GPT-2: LayerNorm, biases everywhere, a learned table of n_positions rows, n_inner None = 4h, tied head."""
    hidden = int(cfg.req("n_embd", "hidden_size"))
    positions = int(cfg.req("n_positions", "max_position_embeddings"))
    return dict(
        num_layers=cfg.req("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=cfg.get("n_inner", default=4 * hidden),
        num_attention_heads=cfg.req("n_head", "num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=min(positions, MAX_DEFAULT_SEQ_LEN),
        num_positions=positions,
        activation="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=cfg.flag("tie_word_embeddings", default=True),
        linear_bias=True,
    )


def gpt_neox(cfg: HFConfig) -> dict[str, Any]:
    """GPT-NeoX/Pythia: LayerNorm, partial rotary (no parameters), untied embed_out by default.

    `attention_bias` (default true) switches the query_key_value and dense biases; the MLP's dense_h_to_4h and
    dense_4h_to_h always have biases (GPTNeoXMLP). use_parallel_residual changes the data flow, not the count.
    """
    biased = cfg.flag("attention_bias", default=True)
    return dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=cfg.req("hidden_size"),
        ffn_hidden_size=cfg.req("intermediate_size"),
        num_attention_heads=cfg.req("num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=seq_len(cfg),
        activation=activation(cfg, ("hidden_act",), gated=False, default="gelu"),
        norm="layernorm",
        position="rope",
        tied_embeddings=cfg.flag("tie_word_embeddings"),
        linear_bias=biased,
        mlp_bias=not biased,
        parallel_residual=cfg.flag("use_parallel_residual", default=True),
    )


def opt(cfg: HFConfig) -> dict[str, Any]:
    """OPT: ReLU FFN of width ffn_dim, LayerNorm, biases (enable_bias), tied head, and a learned position table
    of max_position_embeddings + 2 rows (the 2-row offset of OPTLearnedPositionalEmbedding)."""
    hidden = int(cfg.req("hidden_size"))
    proj = cfg.get("word_embed_proj_dim", default=hidden)
    if int(proj) != hidden:
        raise cfg.refuse("word_embed_proj_dim", proj, f"it differs from hidden_size={hidden} (OPT-350m's project_in/out)")
    positions = int(cfg.req("max_position_embeddings"))
    return dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=cfg.req("ffn_dim"),
        num_attention_heads=cfg.req("num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=min(positions, MAX_DEFAULT_SEQ_LEN),
        num_positions=positions + OPT_POSITION_OFFSET,
        activation=activation(cfg, ("activation_function",), gated=False, default="relu"),
        norm="layernorm",
        position="learned",
        tied_embeddings=cfg.flag("tie_word_embeddings", default=True),
        linear_bias=cfg.flag("enable_bias", default=True),
    )


def bloom(cfg: HFConfig) -> dict[str, Any]:
    """BLOOM: ALiBi (no position parameters), LayerNorm right after the embedding, 4h GeLU FFN, tied head."""
    hidden = int(cfg.req("hidden_size", "n_embed"))
    return dict(
        num_layers=cfg.req("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=cfg.req("n_head", "num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=min(int(cfg.get("seq_length", default=BLOOM_SEQ_LEN)), MAX_DEFAULT_SEQ_LEN),
        activation="gelu",
        norm="layernorm",
        position="alibi",
        tied_embeddings=cfg.flag("tie_word_embeddings", default=True),
        linear_bias=True,
        embedding_norm=True,
    )


def _falcon_layout(cfg: HFConfig, heads: int) -> tuple[int, int]:
    """(kv heads, norms per layer) from FalconAttention and FalconDecoderLayer (modeling_falcon.py).

    K/V heads: new_decoder_architecture -> num_kv_heads (fused qkv of (a + 2kv)*d); else multi_query -> 1
    (a*d + 2d); else a (3h). Norms: sequential attention/MLP -> 2; parallel_attn with num_ln_in_parallel_attn == 2
    (the default for the new architecture: ln_attn, ln_mlp) -> 2; otherwise one input_layernorm shared by both.
    """
    new_arch = cfg.flag("new_decoder_architecture")
    if new_arch:
        kv = int(cfg.get("num_kv_heads", "n_head_kv", default=heads))
    else:
        kv = 1 if cfg.flag("multi_query", default=True) else heads
    norms_in_parallel = cfg.get("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    parallel = cfg.flag("parallel_attn", default=True)
    return kv, 2 if not parallel or norms_in_parallel == 2 else 1


def falcon(cfg: HFConfig) -> dict[str, Any]:
    """Falcon: LayerNorm, plain FFN (ffn_hidden_size, default 4h), MQA/GQA, `bias` on every linear, RoPE or ALiBi,
    tied head. Parallel attention (attention and MLP read the same input) changes norms, not matmuls."""
    hidden = int(cfg.req("hidden_size", "n_embed"))
    heads = int(cfg.req("num_attention_heads", "n_head"))
    kv, norms = _falcon_layout(cfg, heads)
    return dict(
        num_layers=cfg.req("num_hidden_layers", "n_layer"),
        hidden_size=hidden,
        ffn_hidden_size=cfg.get("ffn_hidden_size", default=4 * hidden),
        num_attention_heads=heads,
        num_kv_heads=kv,
        vocab_size=cfg.req("vocab_size"),
        seq_len=seq_len(cfg),
        activation=activation(cfg, ("activation",), gated=False, default="gelu"),
        norm="layernorm",
        position="alibi" if cfg.flag("alibi") else "rope",
        tied_embeddings=cfg.flag("tie_word_embeddings"),
        linear_bias=cfg.flag("bias"),
        norms_per_layer=norms,
        parallel_residual=cfg.flag("parallel_attn", default=True),
    )
