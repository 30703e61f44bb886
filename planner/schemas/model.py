"""Model specification: decoder-only transformers, dense and MoE (schema version 1).

One spec describes the architecture only; training choices (batch, parallelism) live in the request.
Parameter counting and loaders live in `planner.models`.
"""

from typing import Literal

from pydantic import Field, model_validator

from planner.schemas import limits as L
from planner.schemas.base import InputSchema, Schema

MODEL_SCHEMA_VERSION = "1"

Activation = Literal["gelu", "relu", "swiglu", "geglu"]
GATED_ACTIVATIONS = ("swiglu", "geglu")
LayerType = Literal["full", "sliding", "chunked", "linear", "mamba"]
ATTENTION_KINDS = ("full", "sliding", "chunked")  # the softmax-attention layer kinds; "linear" and "mamba" are other mixers
RopeScalingKind = Literal["linear", "dynamic", "yarn", "llama3"]


class MoESpec(InputSchema):
    """Mixture-of-experts FFN. Layers that are MoE: index >= first_k_dense and (index - first_k_dense) % moe_every == 0."""

    num_experts: int = Field(gt=0, le=L.MAX_EXPERTS, description="routed experts per MoE layer")
    top_k: int = Field(gt=0, le=L.MAX_EXPERTS, description="experts each token is routed to")
    expert_ffn_hidden_size: int = Field(gt=0, le=L.MAX_FFN_HIDDEN_SIZE, description="FFN width of one routed expert")
    num_shared_experts: int = Field(default=0, ge=0, le=L.MAX_EXPERTS, description="always-active experts, each expert_ffn_hidden_size wide")
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None, gt=0, le=L.MAX_FFN_HIDDEN_SIZE, description="total width of the shared experts when it differs from num_shared_experts * expert_ffn_hidden_size"
    )
    shared_expert_gate: bool = Field(
        default=False, description="a learned sigmoid gate (h -> 1, no bias) scaling the shared experts' output (Qwen2-MoE)"
    )
    first_k_dense: int = Field(default=0, ge=0, le=L.MAX_LAYERS, description="leading layers that keep a dense FFN")
    moe_every: int = Field(default=1, gt=0, le=L.MAX_LAYERS, description="every n-th layer after first_k_dense is MoE")
    capacity_factor: float | None = Field(default=None, gt=0, le=L.MAX_CAPACITY_FACTOR, description="expert capacity = capacity_factor * tokens * top_k / num_experts; None = dropless")
    score_function: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="router scores: softmax (Mixtral, Qwen-MoE) or sigmoid (DeepSeek-V3, GLM-4.5)"
    )
    normalize_topk: bool = Field(
        default=True, description="the top-k weights are renormalised to sum to 1 (HF norm_topk_prob; Mixtral's softmax over "
        "the top-k logits); false: softmax over all experts, then top-k (Megatron --moe-router-pre-softmax)"
    )
    topk_scaling_factor: float | None = Field(default=None, gt=0, description="routed weights scaled by this (DeepSeek routed_scaling_factor)")
    num_groups: int | None = Field(default=None, gt=0, le=L.MAX_EXPERTS, description="group-limited routing: expert groups (DeepSeek n_group)")
    group_topk: int | None = Field(default=None, gt=0, le=L.MAX_EXPERTS, description="groups each token may use (DeepSeek topk_group)")
    expert_score_bias: Literal["none", "buffer", "parameter"] = Field(
        default="none", description="a per-expert bias added to the scores for choosing experts (aux-loss-free balancing): "
        "a buffer (DeepSeek-V3, GLM-4.5) or a parameter (ERNIE-4.5, counted)"
    )
    router_bias: bool = Field(default=False, description="the router linear has a bias (gpt-oss)")
    expert_bias: bool = Field(default=False, description="biases on the routed experts' linears (gpt-oss)")
    routing_skew: float = Field(default=0.0, ge=0, le=100, description="the slowest expert-parallel rank receives (1 + routing_skew) x the mean routed "
                                "tokens (0 = balanced); with a capacity factor the excess is dropped (planner.cost.moe_comm)")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"moe.top_k={self.top_k} exceeds moe.num_experts={self.num_experts}: choose top_k <= num_experts")
        return self

    @property
    def shared_ffn_hidden_size(self) -> int:
        if self.shared_expert_ffn_hidden_size is not None:
            return self.shared_expert_ffn_hidden_size
        return self.num_shared_experts * self.expert_ffn_hidden_size


class MLASpec(InputSchema):
    """DeepSeek multi-head latent attention (V2/V3): low-rank compressed Q and KV.

    Counted exactly for parameters and FLOPs; activation memory is approximated as standard attention
    with head_dim = qk_nope_head_dim + qk_rope_head_dim for Q/K and v_head_dim for V.
    """

    q_lora_rank: int | None = Field(default=None, gt=0, le=L.MAX_HIDDEN_SIZE, description="None: Q is a full projection")
    kv_lora_rank: int = Field(gt=0, le=L.MAX_HIDDEN_SIZE)
    qk_nope_head_dim: int = Field(gt=0, le=L.MAX_HEAD_DIM)
    qk_rope_head_dim: int = Field(gt=0, le=L.MAX_HEAD_DIM)
    v_head_dim: int = Field(gt=0, le=L.MAX_HEAD_DIM)


class GatedDeltaNetSpec(InputSchema):
    """Gated DeltaNet linear-attention mixer (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks", ICLR 2025), as
    transformers' modeling_qwen3_next.Qwen3NextGatedDeltaNet and Megatron-Core's ssm/gated_delta_net.py build it:
    in_proj_qkvz h -> 2*Hk*dk + 2*Hv*dv, in_proj_ba h -> 2*Hv, a depthwise causal conv1d over q, k, v (no bias),
    dt_bias and A_log per value head, a gated RMSNorm over dv, out_proj Hv*dv -> h."""

    num_key_heads: int = Field(gt=0, le=L.MAX_HEADS, description="query/key heads (HF linear_num_key_heads)")
    num_value_heads: int = Field(gt=0, le=L.MAX_HEADS, description="value/gate heads (HF linear_num_value_heads)")
    key_head_dim: int = Field(gt=0, le=L.MAX_HEAD_DIM, description="HF linear_key_head_dim")
    value_head_dim: int = Field(gt=0, le=L.MAX_HEAD_DIM, description="HF linear_value_head_dim")
    conv_kernel: int = Field(default=4, gt=0, le=64, description="depthwise conv1d width (HF linear_conv_kernel_dim)")
    chunk_size: int = Field(default=64, gt=0, le=4096, description="chunk length of the chunked delta-rule kernel "
                            "(fla chunk_gated_delta_rule: 64)")

    @model_validator(mode="after")
    def _heads(self) -> "GatedDeltaNetSpec":
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"linear_attention.num_value_heads={self.num_value_heads} must be a multiple of "
                             f"num_key_heads={self.num_key_heads}")
        return self


class MambaSpec(InputSchema):
    """Mamba-1 selective-scan mixer (Gu & Dao 2023, "Mamba", Sec. 3), as transformers' modeling_jamba.JambaMambaMixer
    builds it: in_proj h -> 2*d_inner, depthwise conv1d over d_inner, x_proj d_inner -> dt_rank + 2*d_state, dt_proj
    dt_rank -> d_inner (biased), A_log d_inner x d_state, D d_inner, out_proj d_inner -> h; Jamba adds RMSNorms over
    dt (dt_rank), B and C (d_state each)."""

    d_inner: int = Field(gt=0, le=L.MAX_FFN_HIDDEN_SIZE, description="expand * hidden_size (HF mamba_expand)")
    d_state: int = Field(default=16, gt=0, le=1024, description="SSM state per channel (HF mamba_d_state)")
    d_conv: int = Field(default=4, gt=0, le=64, description="depthwise conv1d width (HF mamba_d_conv)")
    dt_rank: int = Field(gt=0, le=L.MAX_HIDDEN_SIZE, description="rank of the dt projection (HF mamba_dt_rank)")
    conv_bias: bool = Field(default=True, description="conv1d has a bias (HF mamba_conv_bias)")
    proj_bias: bool = Field(default=False, description="in_proj and out_proj have biases (HF mamba_proj_bias)")
    inner_norms: bool = Field(default=True, description="RMSNorms over dt, B and C (Jamba's dt/b/c_layernorm)")


class RopeScalingSpec(InputSchema):
    """RoPE frequency scaling (HF rope_scaling / rope_parameters): no parameters, but a job must set it."""

    kind: RopeScalingKind = Field(description="HF rope_type: linear, dynamic (NTK), yarn, llama3")
    factor: float = Field(gt=0)
    original_max_position_embeddings: int | None = Field(default=None, gt=0)
    low_freq_factor: float | None = Field(default=None, gt=0, description="llama3")
    high_freq_factor: float | None = Field(default=None, gt=0, description="llama3")
    beta_fast: float | None = Field(default=None, gt=0, description="yarn")
    beta_slow: float | None = Field(default=None, gt=0, description="yarn")
    mscale: float | None = Field(default=None, gt=0, description="yarn (DeepSeek)")
    mscale_all_dim: float | None = Field(default=None, ge=0, description="yarn (DeepSeek)")
    truncate: bool | None = Field(default=None, description="yarn: floor/ceil the correction range (gpt-oss: false)")


class MultiplierSpec(InputSchema):
    """Granite's activation multipliers (modeling_granite: embeddings * embedding_multiplier, residual branches *
    residual_multiplier, attention scale attention_multiplier instead of 1/sqrt(d), logits / logits_scaling)."""

    embedding: float = Field(default=1.0, gt=0)
    residual: float = Field(default=1.0, gt=0)
    attention: float | None = Field(default=None, gt=0, description="None = 1/sqrt(head_dim)")
    logits_scaling: float = Field(default=1.0, gt=0)


class ModelSpec(InputSchema):
    """A decoder-only transformer. Field names follow Megatron-LM's arguments where one exists."""

    schema_version: Literal["1"] = MODEL_SCHEMA_VERSION
    name: str = Field(min_length=1)
    num_layers: int = Field(gt=0, le=L.MAX_LAYERS)
    hidden_size: int = Field(gt=0, le=L.MAX_HIDDEN_SIZE)
    ffn_hidden_size: int = Field(gt=0, le=L.MAX_FFN_HIDDEN_SIZE, description="dense FFN width (per gated branch for swiglu/geglu)")
    num_attention_heads: int = Field(gt=0, le=L.MAX_HEADS)
    num_kv_heads: int | None = Field(default=None, gt=0, le=L.MAX_HEADS, description="GQA/MQA key-value heads; None = num_attention_heads")
    head_dim: int | None = Field(default=None, gt=0, le=L.MAX_HEAD_DIM, description="None = hidden_size // num_attention_heads")
    vocab_size: int = Field(gt=0, le=L.MAX_VOCAB_SIZE)
    seq_len: int = Field(gt=0, le=L.MAX_SEQ_LEN, description="training sequence length the model was built for (default of requests)")
    activation: Activation = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["rope", "learned", "alibi", "none"] = Field(
        default="rope", description="rope, a learned table, ALiBi, or none (Jamba: the Mamba layers carry position)")
    tied_embeddings: bool = False
    linear_bias: bool = Field(default=False, description="biases on QKV/out/FFN linears (GPT-2, BLOOM, OPT, NeoX)")
    qkv_bias: bool = Field(default=False, description="bias on QKV (Qwen2; Llama-family attention_bias with out_bias)")
    out_bias: bool = Field(default=False, description="bias on the attention output projection (Llama-family attention_bias)")
    mlp_bias: bool = Field(default=False, description="biases on the FFN linears (Llama/Granite mlp_bias)")
    qk_norm: bool = Field(default=False, description="RMSNorm on q and k (Qwen3, Gemma3, OLMo2)")
    qk_norm_scope: Literal["head", "projection"] = Field(
        default="head",
        description="head: one norm over head_dim shared by all heads (Qwen3, Gemma3); projection: one norm over the "
        "whole q (heads*head_dim) and one over the whole k (kv_heads*head_dim) output (OLMo2)",
    )
    norms_per_layer: Literal[1, 2, 4] = Field(
        default=2,
        description="hidden-size norms per decoder layer: 2 pre-norms (Llama) or post-norms (OLMo2); 4 pre+post "
        "(Gemma2/3); 1 shared by parallel attention and FFN (Falcon-7B)",
    )
    num_positions: int | None = Field(
        default=None,
        gt=0,
        description="rows of the learned position table (HF max_position_embeddings, +2 for OPT); None = seq_len",
    )
    embedding_norm: bool = Field(default=False, description="LayerNorm right after the embedding (BLOOM)")
    dropout: bool | None = Field(default=None, description="dropout in training (attention or hidden dropout > 0): "
                                 "masks saved and applied; None = unsaid: the framework's default (behaviour.defaults)")
    rope_theta: float | None = Field(default=None, gt=0, description="RoPE base (HF rope_theta); None = the framework's default")
    rotary_percent: float | None = Field(default=None, gt=0, le=1, description="fraction of each head's dims RoPE rotates "
                                         "(NeoX rotary_pct 0.25, GLM-4.5 0.5); None = all")
    norm_eps: float | None = Field(default=None, gt=0, description="epsilon of the norms (HF rms_norm_eps / layer_norm_eps); None = framework default")
    norm_bias: bool = Field(default=True, description="LayerNorm has a bias (false: Cohere's bias-free LayerNorm); RMSNorm has none")
    parallel_residual: bool = Field(default=False, description="attention and FFN read the same input and add to one "
                                    "residual (GPT-NeoX use_parallel_residual, Falcon parallel_attn, Cohere)")
    lm_head_bias: bool = Field(default=False, description="the LM head has a bias (PhiMoE lm_head_bias)")
    layer_types: tuple[LayerType, ...] | None = Field(
        default=None, description="attention of each decoder layer: full causal, sliding (sliding_window keys back), chunked "
        "(attention_chunk_size blocks, Llama-4); None = every layer full"
    )
    nope_layers: tuple[int, ...] | None = Field(default=None, description="0-based indices of layers without RoPE (NoPE: "
                                               "Llama-4 and SmolLM3 no_rope_layers); None = RoPE on every layer")
    sliding_window: int | None = Field(default=None, gt=0, le=L.MAX_SEQ_LEN, description="keys a 'sliding' layer attends to")
    attention_chunk: int | None = Field(default=None, gt=0, le=L.MAX_SEQ_LEN, description="block length of a 'chunked' layer")
    attention_sinks: bool = Field(default=False, description="a learned per-head sink logit in the softmax (gpt-oss): "
                                  "num_attention_heads parameters per layer")
    attention_output_gate: bool = Field(default=False, description="q_proj also emits a per-channel gate, sigmoid(gate) "
                                         "scales the attention output (Qwen3-Next gated attention)")
    qk_norm_after_rope: bool = Field(default=False, description="the q/k norms run after RoPE (Hunyuan), not before")
    rope_scaling: RopeScalingSpec | None = None
    multipliers: MultiplierSpec | None = None
    linear_attention: GatedDeltaNetSpec | None = Field(default=None, description="the mixer of 'linear' layers")
    mamba: MambaSpec | None = Field(default=None, description="the mixer of 'mamba' layers")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_num_layers: int = Field(default=0, ge=0, le=L.MAX_MTP_LAYERS, description=(
        "multi-token prediction depth (DeepSeek-V3 sec. 2.2): each module normalises the hidden state and the next "
        "token's embedding, projects their concatenation 2h -> h, runs one decoder layer of the last layer's kind and "
        "the shared LM head with its own loss, on the last pipeline stage (Megatron-Core --mtp-num-layers, "
        "multi_token_prediction.py); 0 = none. HF checkpoints build none (num_nextn_predict_layers is not read)"))
    source: str | None = Field(default=None, description="where the numbers come from")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        kv = self.kv_heads
        if self.num_attention_heads % kv:
            raise ValueError(
                f"num_kv_heads={kv} must divide num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}: set head_dim"
            )
        if self.moe is not None and self.moe.first_k_dense > self.num_layers:
            raise ValueError(f"moe.first_k_dense={self.moe.first_k_dense} exceeds num_layers={self.num_layers}")
        if self.nope_layers is not None and any(not 0 <= i < self.num_layers for i in self.nope_layers):
            raise ValueError(f"nope_layers={list(self.nope_layers)} names layers outside 0..{self.num_layers - 1}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for num_layers={self.num_layers}: give one per layer")
            for kind, size in (("sliding", self.sliding_window), ("chunked", self.attention_chunk)):
                if kind in self.layer_types and size is None:
                    field = "sliding_window" if kind == "sliding" else "attention_chunk"
                    raise ValueError(f"layer_types names {kind!r} layers but {field} is not set: set {field}")
            for kind, section in (("linear", self.linear_attention), ("mamba", self.mamba)):
                if kind in self.layer_types and section is None:
                    field = "linear_attention" if kind == "linear" else "mamba"
                    raise ValueError(f"layer_types names {kind!r} layers but {field} is not set: set {field}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def has_qkv_bias(self) -> bool:
        return self.linear_bias or self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        return self.linear_bias or self.out_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.linear_bias or self.mlp_bias

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (position == "learned")."""
        return self.num_positions if self.num_positions is not None else self.seq_len

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    def attended_keys(self, index: int, seq_len: int) -> float:
        """Keys per query of layer `index` at `seq_len`, on the non-causal convention of the FLOP count (full: s, whose
        causal half a flash kernel computes): a window w averages w - w^2/(2s) keys per causal query (w(w+1)/2 over the
        first w queries, w after), counted as 2w - w^2/s; a chunk c averages c/2, counted as c (Llama-4
        attention_chunk_size; Mistral/Gemma sliding_window). Capped at s."""
        kind = "full" if self.layer_types is None else self.layer_types[index]
        s = float(seq_len)
        if kind == "sliding" and self.sliding_window is not None and self.sliding_window < s:
            w = float(self.sliding_window)
            return 2 * w - w * w / s
        if kind == "chunked" and self.attention_chunk is not None and self.attention_chunk < s:
            return float(self.attention_chunk)
        return s

    def attention_fraction(self, seq_len: int) -> float:
        """Mean over the attention layers of attended_keys / s: the share of full causal attention work (and of the
        s x s scores an unfused softmax stores) one attention layer of this model does at `seq_len`; 1 without
        windowed or chunked layers. Linear-attention and Mamba layers are costed by their own mixer."""
        if self.layer_types is None:
            return 1.0
        layers = [i for i in range(self.num_layers) if self.layer_types[i] in ATTENTION_KINDS] or [0]
        return sum(self.attended_keys(i, seq_len) for i in layers) / (len(layers) * seq_len)

    def mixer(self, index: int) -> str:
        """Token mixer of layer `index`: "attention" (full, sliding or chunked), "linear" (Gated DeltaNet) or "mamba"."""
        kind = "full" if self.layer_types is None else self.layer_types[index]
        return "attention" if kind in ATTENTION_KINDS else kind

    @property
    def mixers(self) -> tuple[str, ...]:
        """The distinct token mixers of the model's layers, attention first."""
        kinds = {self.mixer(i) for i in range(self.num_layers)}
        return tuple(k for k in ("attention", "linear", "mamba") if k in kinds)

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` (0-based) has a routed-expert FFN."""
        if self.moe is None or index < self.moe.first_k_dense:
            return False
        return (index - self.moe.first_k_dense) % self.moe.moe_every == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))
