"""Multi-token prediction (MTP) modules: what they add to the last pipeline stage.

DeepSeek-V3 (DeepSeek-AI 2024, sec. 2.2) trains with MTP depth 1; Megatron-Core builds it with --mtp-num-layers
(megatron/core/transformer/multi_token_prediction.py, read at megatron-core 0.16.1). Each module k, per micro-batch,
after the main model: RMSNorm of the hidden state (hnorm) and of the embedding of the tokens shifted by k (enorm,
through the shared embedding table), a linear projection of their concatenation 2h -> h (eh_proj, column-parallel),
one transformer layer of the main model's layer kind (transformer_layer), a final norm, and the shared output head
with its own cross-entropy loss. Without a custom pipeline layout every MTP layer sits on the last pipeline stage
(get_mtp_num_layers_to_build), and a last stage that is not the first builds its own embedding table, tied to the
first stage's (gpt_model.py: `if self.pre_process or self.mtp_process: self.embedding = ...`).

Priced as the head's column of the module table carrying those costs: the decoder ModuleCost of the kind of
planner.models.counting.mtp_layer_index (what the MTP layer is), the head's ModuleCost once more, and the projection
GEMM; its parameters in planner.cost.layers.module_params, the module's structure in counting (MTP_NORMS). The MTP logits are transient like the main head's (the logits buffer is not
doubled: left out).
"""

from __future__ import annotations

import dataclasses

from planner.cost import compute
from planner.cost.layer_terms import Env, ModuleCost, gemm_times
from planner.schemas.model import ModelSpec

SUMMED = ("compute_fwd_s", "compute_bwd_s", "tp_fwd_s", "tp_bwd_s", "ep_fwd_s", "ep_bwd_s", "cp_fwd_s", "cp_bwd_s",
          "selective_s", "act_none", "act_selective", "act_full")


def projection_gemms(spec: ModelSpec, shape: compute.Shape, *, full: bool = False) -> list[compute.Gemm]:
    """eh_proj: [norm(h); norm(emb)] (2h) -> h, output columns split by tp; one per MTP module."""
    tp, cp = (1, 1) if full else (shape.tp, shape.cp)
    tokens = shape.microbatch_size * shape.seq_len / cp
    h = spec.hidden_size
    return [compute.Gemm("mtp_eh_proj", 2 * tokens * 2 * h * h / tp, io_elements=(tokens * 2 * h, tokens * h / tp))]


def with_mtp(head: ModuleCost, layer: ModuleCost, env: Env) -> ModuleCost:
    """The head's column with the spec's MTP modules: per module the layer, the projection (its input saved for
    the weight gradient) and the head once more; gradients in flight: the larger of head and layer."""
    n = env.spec.mtp_num_layers
    if not n:
        return head
    proj = projection_gemms(env.spec, env.shape)
    proj_fwd, proj_bwd, _ = gemm_times(env, proj)
    proj_act = 2 * proj[0].io_elements[0]  # the bf16 [norm(h); norm(emb)] input eh_proj saves
    summed = {f: getattr(head, f) * (1 + n) + n * getattr(layer, f) for f in SUMMED}
    summed["compute_fwd_s"] += n * proj_fwd
    summed["compute_bwd_s"] += n * proj_bwd
    for f in ("act_none", "act_selective", "act_full"):
        summed[f] += n * proj_act
    return dataclasses.replace(head, **summed, act_transient=max(head.act_transient, layer.act_transient),
                               recompute_compute_s=None)


def recompute_s(spec: ModelSpec, layer: ModuleCost) -> float:
    """A full recompute of the MTP layers (Megatron checkpoints each under --recompute-granularity full with the
    uniform method, MultiTokenPredictionBlock._checkpointed_forward); 0 without MTP. The head is never recomputed."""
    return spec.mtp_num_layers * layer.full_recompute_s
