"""Profile: measured (or analytic) per-operator costs of each distinct layer type at TP-sharded shapes (schema version 1).

Written by `planner profile`, read by the cost model through `estimate --profile` / `plan --profile`.
Times are seconds per micro-batch on one device; bytes are per device (per TP rank).
"""

from typing import Literal

from pydantic import Field

from planner.schemas.base import Schema

PROFILE_SCHEMA_VERSION = "1"

LayerType = Literal["embedding", "decoder", "moe_decoder", "head"]


class OpRecord(Schema):
    """One operator (qkv, attn_core, attn_out, mlp_up, mlp_gate, mlp_down, router, experts, norm_attn, norm_mlp, embedding, lm_head, loss, ...)."""

    name: str
    forward_s: float = Field(ge=0)
    backward_s: float = Field(ge=0)
    forward_flops: float = Field(ge=0)
    backward_flops: float = Field(ge=0)
    params_bytes: int = Field(ge=0)
    saved_bytes: int = Field(ge=0, description="bytes saved for backward (saved_tensors_hooks, storage-deduplicated)")
    output_bytes: int = Field(ge=0)


class LayerProfile(Schema):
    """One layer type at one shape: tp (heads/tp, ffn/tp), ep (experts/ep), microbatch_size, seq_len."""

    layer_type: LayerType
    tp: int = Field(gt=0)
    ep: int = Field(default=1, gt=0)
    microbatch_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    status: Literal["ok", "oom", "error"] = "ok"
    message: str = ""
    forward_s: float = Field(default=0.0, ge=0, description="whole layer, measured (not the sum of ops)")
    backward_s: float = Field(default=0.0, ge=0)
    recompute_selective_s: float = Field(default=0.0, ge=0, description="extra backward time with selective recompute")
    recompute_full_s: float = Field(default=0.0, ge=0, description="extra backward time with full recompute")
    params_bytes: int = Field(default=0, ge=0)
    saved_bytes: int = Field(default=0, ge=0, description="saved for backward without recompute")
    saved_bytes_selective: int = Field(default=0, ge=0)
    saved_bytes_full: int = Field(default=0, ge=0, description="with full recompute: the layer input only")
    ops: tuple[OpRecord, ...] = ()


class Profile(Schema):
    schema_version: Literal["1"] = PROFILE_SCHEMA_VERSION
    kind: Literal["measured", "analytic"]
    model_name: str
    device: str = Field(description="e.g. 'cpu: AMD EPYC ...' or 'NVIDIA H100 80GB HBM3'")
    dtype: Literal["fp32", "bf16", "fp16", "amp-bf16"]
    software: dict[str, str] = Field(default_factory=dict, description="torch, python, cuda versions")
    command: str = Field(default="", description="the exact command that produced this file")
    entries: tuple[LayerProfile, ...] = ()
