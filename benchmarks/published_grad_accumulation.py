"""How a published run summed its gradients over micro-batches (benchmarks/published_runs.py, rule
`grad_accumulation_stated`): the CostOptions.grad_accum_paths a run is priced with where its text or its release
says which of its stack's paths (behaviour.grad_accumulation, planner.cost.grad_accumulation) it ran.

- A run whose precision text says fp16 (float16, half) runs its stack's fp16 paths: the planner has one 16-bit
  recipe (bf16, at the same tensor-core rate), but DeepSpeed's and Megatron-LM's accumulation differ by dtype.
- A run whose text names one of its stack's paths (BigScience's "BF16_Optimizer") ran that path at every ZeRO
  stage up to 1: BF16_Optimizer shards the optimizer states itself, the "ZeRO-1 equivalent" the text says.
- A Megatron-LM source from February 2022 on ran bf16 with gradient accumulation fusion (NVIDIA/Megatron-LM
  83b1e42f30, 2022-02-13, "gradient accumulation fusion": fp32 accumulation, which bf16 forces), nothing outside the
  GEMM; fp16 only from 07916bf245 (2022-09-27). The month is the arXiv id's yymm; a source without one keeps the
  profile's paths. Korthikanti et al. 2022 (arXiv 2205) ran sequence parallelism and selective recompute, whose
  commits (cfd2e21607 2022-04-28, bbab79f869 2022-05-16) descend from the fusion commit.
Unsaid precision stays bf16 (published_model.precision_of).
"""

from __future__ import annotations

import re

from published_runs import profile_of, source_month

from planner.cost.stack import grad_accumulation_paths, path_entry
from planner.frameworks import load_framework

FP16 = re.compile(r"\bfp16\b|float16|\bhalf\b")
MEGATRON_LM_FUSION = (2022, 2)  # NVIDIA/Megatron-LM 83b1e42f30 (2022-02-13): bf16 (fp32) accumulation fused


def grad_accumulation_of(run: dict, stack: str, off: tuple[str, ...] = ()) -> dict:
    """{"grad_accum_paths": paths} where the run's text or release narrows its stack's paths (see the module
    docstring); {} where the profile's bf16 paths stand, the profile records none, or with the rule `off`."""
    found = load_framework(profile_of(run, stack)).behaviour.grad_accumulation
    if found is None or "grad_accumulation_stated" in off:
        return {}
    train = run["training"]
    dtype = "fp16" if FP16.search((train.get("precision") or "").lower()) else "bf16"
    text = " ".join(str(train.get(k) or "") for k in ("framework", "precision")).lower()
    named = [p for p in found.paths if p.dtype == dtype and p.name in text]
    if named:
        path = named[0]
        paths = (path_entry(path, (0, 1), None),)
    elif stack == "megatron-lm" and dtype == "bf16" and (source_month(run) or (0, 0)) >= MEGATRON_LM_FUSION:
        paths = ()
    else:
        paths = grad_accumulation_paths(found, dtype)
    return {} if paths == grad_accumulation_paths(found) else {"grad_accum_paths": paths}
