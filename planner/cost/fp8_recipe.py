"""What an fp8 training recipe changes in the price of the matmuls: which of them stay in 16 bits, and the HBM
bytes of the casts around the rest (planner.cost.layer_terms.gemm_times, planner.cost.layers).

Every stack keeps the LM head and the MoE router out of fp8, so they run at the bf16 rate (their compute.Gemm has
fp8 False; CostOptions.fp8_16bit_gemms False prices them at the fp8 rate, an ablation). Megatron-Core: gpt_model.py
`output_layer` is a tensor_parallel.ColumnParallelLinear and moe/router.py computes the logits with
`router_gating_linear`, neither a Transformer Engine module, so no fp8 autocast reaches them (core_v0.16.1);
torchtitan: the float8 converter's `filter_fqns` leaves out "output" and "router.gate" in its documented configs
(torchtitan/components/quantization/float8.md) and "lm_head", "router.gate" in models/deepseek_v3/config_registry.py;
DeepSeek-V3 (sec. 3.3.1) keeps "the embedding module, the output head, MoE gating modules" in BF16/FP32; our executor
skips `output` (planner/executor/fp8.py convertible). The chunked delta rule (fla chunk_gated_delta_rule) is a 16-bit
Triton kernel, whatever the linears around it run, so it has fp8 False too."""

from __future__ import annotations

from planner.cost.compute import Gemm

FP8_CAST_BYTES_PER_ELEMENT = 4
"""HBM bytes an fp8 recipe moves per element it casts: read the 16-bit tensor (2), write it in fp8 (1) and its fp8
transpose (1), one fused kernel. Transformer Engine's Linear does this to each matmul's input in forward
(transformer_engine/pytorch/module/linear.py, _Linear.forward: `fp8_cast_transpose_fused(inputmat, ...)`, the
transpose kept for the weight-gradient GEMM) and to each output gradient in backward
(TransformerEngineBaseModule.grad_output_preprocess: fp8 cast-transpose of grad_output); torchao's float8 linear
(torchtitan) casts the same tensors with a separate amax read, so at least these bytes. The weights are cast once
per step (is_first_microbatch), not priced."""


def cast_bytes(gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the fp8 casts of these matmuls: their inputs in forward, their output
    gradients in backward (FP8_CAST_BYTES_PER_ELEMENT each)."""
    inputs = sum(g.io_elements[0] for g in gemms)
    outputs = sum(g.io_elements[1] for g in gemms)
    return FP8_CAST_BYTES_PER_ELEMENT * inputs, FP8_CAST_BYTES_PER_ELEMENT * outputs
