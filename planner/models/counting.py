"""Parameter counts of a ModelSpec: pure functions, exact for the architectures the schema describes.

For a GPT-2/GPT-3 style model (LayerNorm, biases, 4h GeLU FFN, learned positions, tied embeddings) the
total reduces to the closed form of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Section 5.1, parameter count P):

    P = 12*l*h^2 * (1 + 13/(12h) + (V + s)/(12*l*h))  =  12*l*h^2 + 13*l*h + (V + s)*h

plus the final LayerNorm (2h), which the paper leaves out. Everything else (GQA/MQA, gated FFNs, RMSNorm,
MoE, DeepSeek MLA, untied heads) is counted module by module, matching the HuggingFace implementations
(modeling_llama, modeling_mixtral, modeling_deepseek_v3, modeling_gpt2, ...).
"""

from dataclasses import dataclass

from planner.schemas.model import ModelSpec


def norm_width_params(spec: ModelSpec, width: int) -> int:
    """One normalisation over `width` features: RMSNorm has a scale (width), LayerNorm a scale and a bias (2*width),
    Cohere's bias-free LayerNorm (norm_bias false, modeling_cohere2.Cohere2LayerNorm) a scale only."""
    return width if spec.norm == "rmsnorm" or not spec.norm_bias else 2 * width


def norm_params(spec: ModelSpec) -> int:
    """One norm over the hidden size: h for RMSNorm, 2h for LayerNorm."""
    return norm_width_params(spec, spec.hidden_size)


def layer_norm_params(spec: ModelSpec) -> int:
    """The hidden-size norms of one decoder layer: norms_per_layer of them (2 Llama/OLMo2, 4 Gemma2/3, 1 Falcon-7B)."""
    return spec.norms_per_layer * norm_params(spec)


def embedding_params(spec: ModelSpec) -> int:
    """Token embedding V*h, plus a learned position table rows*h (GPT-2/3, OPT), plus BLOOM's embedding LayerNorm.

    RoPE and ALiBi have no parameters. The learned table has spec.position_rows rows: num_positions when set
    (HF max_position_embeddings; OPT adds 2 offset rows, modeling_opt.OPTLearnedPositionalEmbedding), else seq_len.
    """
    h = spec.hidden_size
    params = spec.vocab_size * h
    if spec.position == "learned":
        params += spec.position_rows * h
    if spec.embedding_norm:
        params += norm_params(spec)
    return params


def _mla_params(spec: ModelSpec) -> int:
    """DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V2 paper, Section 2.1.2, eqs. 9-19).

    Q: h -> q_lora (W_DQ), RMSNorm(q_lora), q_lora -> a*(d_nope + d_rope) (W_UQ and W_QR), or a full h -> a*(d_nope+d_rope).
    KV: h -> kv_lora + d_rope (W_DKV and the shared W_KR), RMSNorm(kv_lora), kv_lora -> a*(d_nope + d_v) (W_UK, W_UV).
    Out: a*d_v -> h. Biases only when linear_bias (DeepSeek has none).
    """
    mla = spec.mla
    assert mla is not None
    h, a = spec.hidden_size, spec.num_attention_heads
    q_out = a * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    kv_a_out = mla.kv_lora_rank + mla.qk_rope_head_dim
    kv_b_out = a * (mla.qk_nope_head_dim + mla.v_head_dim)
    o_in = a * mla.v_head_dim
    if mla.q_lora_rank is None:
        params = h * q_out
        bias = q_out
    else:
        params = h * mla.q_lora_rank + norm_width_params(spec, mla.q_lora_rank) + mla.q_lora_rank * q_out
        bias = mla.q_lora_rank + q_out
    params += h * kv_a_out + norm_width_params(spec, mla.kv_lora_rank) + mla.kv_lora_rank * kv_b_out
    params += o_in * h
    if spec.linear_bias:
        params += bias + kv_a_out + kv_b_out + h
    return params


def attention_params(spec: ModelSpec) -> int:
    """Self-attention of one layer.

    Standard: Q h*(a*d), K and V h*(kv*d) each (GQA/MQA when kv < a), O (a*d)*h. Biases: a*d + 2*kv*d on QKV
    (has_qkv_bias), h on O (has_out_bias); a fused QKV projection (Phi-3, Falcon, NeoX) has the same count.
    qk_norm adds a norm over d for q and one for k (scope "head": Qwen3, Gemma3, shared across heads) or over the
    whole projections a*d and kv*d (scope "projection": OLMo2, modeling_olmo2.Olmo2Attention).
    With spec.mla set, DeepSeek MLA is counted instead (see _mla_params).
    """
    if spec.mla is not None:
        return _mla_params(spec)
    h, d = spec.hidden_size, spec.dim_per_head
    q_width, kv_width = spec.num_attention_heads * d, spec.kv_heads * d
    gate = 2 if spec.attention_output_gate else 1  # Qwen3-Next: q_proj emits query and gate (a*d*2 outputs)
    params = gate * h * q_width + 2 * h * kv_width + q_width * h
    if spec.has_qkv_bias:
        params += gate * q_width + 2 * kv_width
    if spec.has_out_bias:
        params += h
    if spec.attention_sinks:  # modeling_gpt_oss.GptOssAttention.sinks: one learned logit per head
        params += spec.num_attention_heads
    if spec.qk_norm:
        if spec.qk_norm_scope == "projection":
            params += norm_width_params(spec, q_width) + norm_width_params(spec, kv_width)
        else:
            params += 2 * norm_width_params(spec, d)
    return params


def gated_deltanet_params(spec: ModelSpec) -> int:
    """One Gated DeltaNet mixer (modeling_qwen3_next.Qwen3NextGatedDeltaNet; Megatron-Core ssm/gated_delta_net.py):
    in_proj_qkvz h*(2*Hk*dk + 2*Hv*dv), in_proj_ba h*2*Hv, depthwise conv1d (2*Hk*dk + Hv*dv)*kernel without bias,
    dt_bias and A_log Hv each, the gated RMSNorm over dv (shared by heads), out_proj Hv*dv*h; no linear biases."""
    gdn, h = spec.linear_attention, spec.hidden_size
    assert gdn is not None
    key, value = gdn.num_key_heads * gdn.key_head_dim, gdn.num_value_heads * gdn.value_head_dim
    return (h * (2 * key + 2 * value) + h * 2 * gdn.num_value_heads + (2 * key + value) * gdn.conv_kernel
            + 2 * gdn.num_value_heads + gdn.value_head_dim + value * h)


def mamba_params(spec: ModelSpec) -> int:
    """One Mamba-1 mixer (modeling_jamba.JambaMambaMixer; Gu & Dao 2023 Sec. 3.4): in_proj h*2*di (+2*di bias),
    conv1d di*d_conv (+di bias), x_proj di*(dt_rank + 2*N), dt_proj dt_rank*di + di, A_log di*N, D di, out_proj
    di*h (+h bias), and Jamba's RMSNorms over dt_rank, N and N."""
    m, h = spec.mamba, spec.hidden_size
    assert m is not None
    di, n = m.d_inner, m.d_state
    params = h * 2 * di + di * m.d_conv + di * (m.dt_rank + 2 * n) + m.dt_rank * di + di + di * n + di + di * h
    if m.proj_bias:
        params += 2 * di + h
    if m.conv_bias:
        params += di
    if m.inner_norms:
        params += m.dt_rank + 2 * n
    return params


def mixer_params(spec: ModelSpec, mixer: str) -> int:
    """The token mixer of a layer of kind `mixer` (ModelSpec.mixer): attention, Gated DeltaNet or Mamba."""
    if mixer == "linear":
        return gated_deltanet_params(spec)
    if mixer == "mamba":
        return mamba_params(spec)
    return attention_params(spec)


def mlp_params(spec: ModelSpec, ffn_hidden_size: int, *, bias: bool | None = None) -> int:
    """One FFN of width f: gated (SwiGLU/GeGLU) has gate, up and down, 3*h*f; otherwise up and down, 2*h*f.

    A fused gate_up projection (Phi-3) has the same count. Biases (`bias`, default has_mlp_bias): 2f + h gated,
    f + h otherwise.
    """
    h, f = spec.hidden_size, ffn_hidden_size
    biased = spec.has_mlp_bias if bias is None else bias
    if spec.gated:
        return 3 * h * f + ((2 * f + h) if biased else 0)
    return 2 * h * f + ((f + h) if biased else 0)


@dataclass(frozen=True, kw_only=True)
class MoEParams:
    """Parameters of one MoE layer's FFN block: router (h*E, plus h for a shared-expert gate), one routed expert,
    all shared experts together."""

    router: int
    per_expert: int
    shared: int
    num_experts: int
    top_k: int

    @property
    def total(self) -> int:
        """Router + every routed expert + shared experts."""
        return self.router + self.num_experts * self.per_expert + self.shared

    @property
    def active(self) -> int:
        """What one token touches: router + top_k routed experts + shared experts."""
        return self.router + self.top_k * self.per_expert + self.shared


def moe_params(spec: ModelSpec) -> MoEParams:
    """Router h*E (no bias, as Mixtral/DeepSeek/Qwen-MoE), routed experts and shared experts as gated/plain FFNs.

    Qwen2-MoE's shared_expert_gate (Linear(h, 1, bias=False), modeling_qwen2_moe.Qwen2MoeSparseMoeBlock) is counted
    with the router: both are small, replicated over tp and seen by every token. DeepSeek-V3's per-expert
    score-correction bias (E values, a buffer in HF) is not counted; ERNIE-4.5's (expert_score_bias "parameter",
    modeling_ernie4_5_moe.Ernie4_5_MoeStatics) is, with the router. gpt-oss: router bias E and expert biases
    (router_bias, expert_bias; modeling_gpt_oss.GptOssTopKRouter, GptOssExperts gate_up_proj_bias/down_proj_bias).
    """
    moe = spec.moe
    if moe is None:
        raise ValueError(f"model {spec.name!r} has no moe section")
    shared_width = moe.shared_ffn_hidden_size
    return MoEParams(
        router=spec.hidden_size * (moe.num_experts + int(moe.shared_expert_gate))
        + moe.num_experts * (int(moe.router_bias) + int(moe.expert_score_bias == "parameter")),
        per_expert=mlp_params(spec, moe.expert_ffn_hidden_size, bias=spec.has_mlp_bias or moe.expert_bias),
        shared=mlp_params(spec, shared_width) if shared_width else 0,
        num_experts=moe.num_experts,
        top_k=moe.top_k,
    )


def decoder_layer_params(spec: ModelSpec, index: int) -> int:
    """Decoder layer `index` (0-based): norms_per_layer norms, its token mixer (attention, Gated DeltaNet or Mamba),
    and a dense FFN or an MoE block (all experts)."""
    if not 0 <= index < spec.num_layers:
        raise ValueError(f"layer index {index} out of range for num_layers={spec.num_layers}")
    ffn = moe_params(spec).total if spec.is_moe_layer(index) else mlp_params(spec, spec.ffn_hidden_size)
    return layer_norm_params(spec) + mixer_params(spec, spec.mixer(index)) + ffn


def head_params(spec: ModelSpec) -> int:
    """Final norm, plus the LM head V*h when it is not tied to the token embedding, plus its bias V (PhiMoE)."""
    params = norm_params(spec)
    if not spec.tied_embeddings:
        params += spec.vocab_size * spec.hidden_size
    if spec.lm_head_bias:
        params += spec.vocab_size
    return params


def total_params(spec: ModelSpec) -> int:
    """Every trainable parameter: embedding + all decoder layers + head (tied weights counted once)."""
    layers = sum(decoder_layer_params(spec, index) for index in range(spec.num_layers))
    return embedding_params(spec) + layers + head_params(spec)


MTP_NORMS = 3  # enorm, hnorm and the module's final layernorm (Megatron-Core MultiTokenPredictionLayer)


def mtp_layer_index(spec: ModelSpec) -> int:
    """The decoder layer whose kind each MTP layer repeats: DeepSeek-V3's MTP layer is an MoE layer like the main
    model's last (Megatron builds it from the decoder's layer spec)."""
    return spec.num_layers - 1


def mtp_params(spec: ModelSpec) -> int:
    """The multi-token prediction modules (ModelSpec.mtp_num_layers), which total_params leaves out as DeepSeek's
    671B does (+14B): per module its MTP_NORMS norms, the 2h x h eh_proj and one decoder layer like the last; the
    embedding and LM head are the main model's (Megatron-Core MultiTokenPredictionLayer)."""
    h = spec.hidden_size
    module = MTP_NORMS * norm_params(spec) + 2 * h * h + decoder_layer_params(spec, mtp_layer_index(spec))
    return spec.mtp_num_layers * module


def active_params(spec: ModelSpec) -> int:
    """Parameters one token uses: the total minus the (num_experts - top_k) routed experts it skips per MoE layer.

    Equals total_params for a dense model. Mixtral-8x7B: 12.9B of 46.7B; DeepSeek-V3: 37B of 671B.
    """
    if spec.moe is None:
        return total_params(spec)
    moe = moe_params(spec)
    skipped = (moe.num_experts - moe.top_k) * moe.per_expert
    return total_params(spec) - spec.num_moe_layers * skipped


def largest_linear_params(spec: ModelSpec) -> int:
    """Parameters of the largest single weight-holding sub-module (what a per-module ZeRO-3 such as DeepSpeed's
    gathers at once): the fused QKV projection, the output projection, the FFN input projection (fused gate and
    up for gated units, as Megatron-LM builds it), one expert's or the shared experts' input projection, or the
    embedding / LM head table. MLA attention is bounded by its whole attention block."""
    h, d = spec.hidden_size, spec.dim_per_head
    gate = 2 if spec.gated else 1
    if spec.mla is not None:
        attention = attention_params(spec)
    else:
        attention = max(h * (spec.num_attention_heads + 2 * spec.kv_heads) * d, spec.num_attention_heads * d * h)
    ffn = gate * h * spec.ffn_hidden_size
    if spec.moe is not None:
        ffn = max(ffn, gate * h * spec.moe.expert_ffn_hidden_size, gate * h * spec.moe.shared_ffn_hidden_size)
    return max(attention, ffn, spec.vocab_size * h)
