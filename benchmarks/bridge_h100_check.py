"""A check outside the accuracy figure: the DGX-H100 rows of Megatron-Bridge's performance summary through the
published-run conversion, with the shipped calibration (no constant is derived from them).

Source: NVIDIA-NeMo/Megatron-Bridge docs/fern/versions/0.4.2/pages/performance-summary.mdx (26.04.01 NeMo
container, commit 067f987d): model, GPUs, precision, global and micro batch, sequence length, TP/PP/CP/VP/EP and
tokens/s/GPU as the table states them. What each row's recipe sets beyond the table (recompute, token dispatcher,
MoE overlap) is written into the row's training text, as a source's text would state it, from the recipe that made
it: src/megatron/bridge/perf_recipes/{llama/h100/llama3.py, llama/h100/llama31.py, gpt_oss/h100/gpt_oss.py,
gpt_oss/common.py, qwen/h100/qwen3_moe.py} at the same commit. Every row ran (the table lists throughputs), so a row
predicted not to fit is a false OOM.

    python benchmarks/bridge_h100_check.py

Prints per row the predicted and published tokens/s per GPU, the error of the predicted throughput (positive:
predicted faster than published; accuracy.py's step-time error has the opposite sign), whether it fits, and the breakdown's largest
parts. The rows are not in validation/published_runs.json and nothing is fitted to them: a large error here names a
gap to find a mechanism for (a measurement or the stack's code), not a constant to tune.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_cases as C  # noqa: E402

SOURCE = {"title": "Megatron-Bridge performance summary, 26.04.01 NeMo container (docs/fern/versions/0.4.2)",
          "url": "https://github.com/NVIDIA-NeMo/Megatron-Bridge (docs/fern/versions/0.4.2/pages/performance-summary.mdx)",
          "locator": "Pre-Training Performance, DGX-H100 rows"}
HARDWARE = {"gpu_model": "NVIDIA H100 80GB (DGX-H100)", "gpu_memory_gib": 80, "gpus_per_node": 8}
FRAMEWORK = "Megatron-Bridge (NeMo 26.04.01 container)"
SWIGLU = {"type": "dense", "activation": "SwiGLU", "moe": None}
LLAMA3_70B = dict(SWIGLU, family="Llama 3 70B", params_b=70.6, num_layers=80, hidden=8192, ffn_hidden=28672,
                  num_heads=64, num_kv_heads=8, vocab=128256)
LLAMA31_405B = dict(SWIGLU, family="Llama 3.1 405B", params_b=405.9, num_layers=126, hidden=16384, ffn_hidden=53248,
                    num_heads=128, num_kv_heads=8, vocab=128256)
GPT_OSS_120B = dict(SWIGLU, type="moe", family="GPT-OSS 120B", params_b=116.8, num_layers=36, hidden=2880,
                    ffn_hidden=None, num_heads=64, num_kv_heads=8, vocab=201088,
                    moe={"num_experts": 128, "top_k": 4, "expert_ffn_hidden": 2880})
QWEN3_30B = dict(SWIGLU, type="moe", family="Qwen3 30B-A3B", params_b=30.5, num_layers=48, hidden=2048,
                 ffn_hidden=None, num_heads=32, num_kv_heads=4, vocab=151936,
                 moe={"num_experts": 128, "top_k": 8, "expert_ffn_hidden": 768})
QWEN3_235B = dict(QWEN3_30B, family="Qwen3 235B-A22B", params_b=235.1, num_layers=94, hidden=4096, num_heads=64,
                  moe={"num_experts": 128, "top_k": 8, "expert_ffn_hidden": 1536})
# (id, model, GPUs, precision, global batch, micro-batch, seq, tp, pp, cp, vp, ep, tokens/s/GPU, recipe text)
ROWS = (
    ("bridge_h100_llama3_70b_fp8", LLAMA3_70B, 64, "FP8 (current scaling)", 256, 1, 8192, 4, 8, 1, 5, 1, 1664,
     "recompute: none"),
    ("bridge_h100_llama31_405b_fp8", LLAMA31_405B, 1024, "FP8 (current scaling)", 1536, 1, 8192, 8, 8, 2, 8, 1, 328,
     "recompute: none"),
    ("bridge_h100_gpt_oss_120b_bf16", GPT_OSS_120B, 64, "BF16", 1280, 1, 4096, 1, 4, 1, None, 8, 5824,
     "selective: recompute_modules layernorm, moe_act; --moe-token-dispatcher-type flex (hybridep)"),
    ("bridge_h100_qwen3_30b_a3b_fp8", QWEN3_30B, 16, "FP8 (current scaling)", 1024, 1, 4096, 1, 1, 1, None, 16, 8960,
     "recompute: none; --moe-token-dispatcher-type flex (hybridep); moe_a2a_overlap false"),
    ("bridge_h100_qwen3_235b_a22b_fp8", QWEN3_235B, 256, "FP8 (current scaling)", 8192, 1, 4096, 2, 8, 1, 4, 32,
     1712, "recompute: none; --moe-token-dispatcher-type alltoall; moe_a2a_overlap true"),
)


def run_of(row: tuple) -> dict:
    """A row in validation/published_runs.json's format."""
    run_id, model, gpus, precision, gbs, mbs, seq, tp, pp, cp, vp, ep, tokens, text = row
    recompute, _, flags = text.partition("; ")
    return {
        "id": run_id, "name": run_id, "source": SOURCE, "hardware": dict(HARDWARE),
        "model": dict(copy.deepcopy(model), seq_len=seq),
        "training": {"global_batch_seqs": gbs, "micro_batch": mbs, "precision": precision,
                     "recompute": recompute.removeprefix("recompute: "), "notes": flags,
                     "pipeline_schedule": "interleaved" if vp else "1F1B", "virtual_pipeline_stages": vp,
                     "framework": FRAMEWORK},
        "parallel": {"num_gpus": gpus, "dp": gpus // (tp * pp * cp), "tp": tp, "pp": pp, "ep": ep, "cp": cp,
                     "sp": tp > 1},
        "results": {"tokens_per_s_per_gpu": tokens, "status": "ok"},
    }


def check(row: tuple) -> str:
    run = run_of(row)
    case = C.build_case(run)
    cand, ev = C.choose(case)
    if cand is None:
        return f"{run['id']:34s} no valid candidate"
    gpus = run["parallel"]["num_gpus"]
    predicted = case.request.global_batch_size * case.request.seq_len / ev.step_time_s / gpus
    published = run["results"]["tokens_per_s_per_gpu"]
    parts = sorted(((v, k) for k, v in ev.raw_breakdown.items() if v > 0), reverse=True)[:3]
    shares = ", ".join(f"{k.removesuffix('_s')} {v / ev.step_time_s:.0%}" for v, k in parts)
    return (f"{run['id']:34s} {predicted:8.0f} {published:8d} {predicted / published - 1:+7.1%}  "
            f"{'yes' if ev.fits else 'NO ':3s} {ev.peak_bytes / 2**30:5.1f}  {cand.recompute:9s} ep{cand.ep} "
            f"vpp{cand.vpp}  {shares}")


def main() -> int:
    print(f"{'row (tokens/s per GPU)':34s} {'pred':>8s} {'publ':>8s} {'error':>7s}  fits GiB    recompute settings  "
          "largest parts of the predicted step")
    for row in ROWS:
        print(check(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
