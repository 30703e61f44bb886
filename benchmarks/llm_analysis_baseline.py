"""llm-analysis (Cheng Li, https://github.com/cli99/llm-analysis, 0.2.2) as a second baseline beside the naive
6PT estimate in benchmarks/accuracy.py: the same run, the same parallel configuration (the one accuracy.py's
rule chose), llm-analysis's training latency at 0.5 FLOP efficiency (the issue's setting).

Optional: llm-analysis pins transformers < 5 and huggingface-hub < 0.15, which the planner's `hf` extra does not
allow, so it is not an extra; install it beside them without its pins (it imports neither at run time):

    pip install --no-deps llm-analysis==0.2.2 "fire>=0.5,<0.6" termcolor six

Absent, `available()` is False and accuracy.py prints no llm-analysis column. A configuration llm-analysis cannot
express (it asserts on it) counts as not evaluated, as the issue counted "runs every estimator could express".
"""

from __future__ import annotations

import contextlib
import io
import logging

FLOPS_EFFICIENCY = 0.5
HBM_EFFICIENCY = 0.9


def available() -> bool:
    try:
        import llm_analysis.analysis  # noqa: F401
    except ImportError:
        return False
    return True


def step_s(request, cand) -> float | None:
    """llm-analysis's latency per iteration for `request` (a PlanRequest) run as `cand`, or None when it refuses."""
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import GPUConfig, ModelConfig, ParallelismConfig
    from llm_analysis.logger import logger

    logger.setLevel(logging.ERROR)  # its per-run advice (ZeRO disabled, activations too large) is not our output

    spec, topo = request.model, request.topology
    moe = spec.moe
    ffn = moe.expert_ffn_hidden_size if moe else spec.ffn_hidden_size
    model = ModelConfig(name=spec.name or "model", num_layers=spec.num_layers, n_head=spec.num_attention_heads,
                        hidden_dim=spec.hidden_size, vocab_size=spec.vocab_size, max_seq_len=request.seq_len,
                        num_key_value_heads=spec.kv_heads, ffn_embed_dim=ffn, expansion_ratio=ffn / spec.hidden_size,
                        moe_num_experts=moe.num_experts if moe else 1, moe_top_k=moe.top_k if moe else 1)
    device = topo.device
    gpu = GPUConfig(name=device.name, mem_per_GPU_in_GB=device.memory_bytes / 1e9,
                    hbm_bandwidth_in_GB_per_sec=device.hbm_bandwidth_GBps,
                    intra_node_bandwidth_in_GB_per_sec=topo.intra_node.bandwidth_GBps,
                    intra_node_min_message_latency=topo.intra_node.latency_s, peak_fp16_TFLOPS=device.peak_bf16_tflops,
                    inter_node_bandwidth_in_GB_per_sec=topo.inter_node.nics_per_node * topo.inter_node.nic_bandwidth_GBps)
    parallel = ParallelismConfig(tp_size=cand.tp, pp_size=cand.pp, dp_size=cand.dp, ep_size=cand.ep,
                                 sp_size=cand.tp if cand.sp else 1)
    recompute = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE,
                 "full": ActivationRecomputation.FULL}[cand.recompute]
    zero = (DSZeRO.NONE, DSZeRO.STAGE_1, DSZeRO.STAGE_2, DSZeRO.STAGE_3)[cand.zero_stage]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            analysis = LLMAnalysis(model, gpu, parallelism_config=parallel, flops_efficiency=FLOPS_EFFICIENCY,
                                   hbm_memory_efficiency=HBM_EFFICIENCY)
            result = analysis.training(batch_size_per_gpu=cand.microbatch_size, global_batch_size=request.global_batch_size,
                                       seq_len=request.seq_len, activation_recomputation=recompute, ds_zero=zero,
                                       flash_attn=True, mlp_gated_linear_units=spec.gated)
    except (AssertionError, ValueError, ZeroDivisionError, TypeError, KeyError):
        return None
    latency = result.get("latency_per_iter")
    return float(latency) if latency and latency > 0 else None
