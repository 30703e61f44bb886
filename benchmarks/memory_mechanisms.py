"""The memory model's transient terms against the peaks `benchmarks/gpu_memory.py` measured (no GPU needed).

    python benchmarks/memory_mechanisms.py profiles/memory-h200.json

For every measured case it prints the measured peak above the bytes allocated before the step, and what the
planner's formulas (planner/cost/memory.py) charge for the same step, term by term:
- plain torch (bf16 weights, no optimizer state): the gradients (2 bytes per parameter), the activations every
  layer saves for its recompute mode, the head (final norm and LM-head inputs, the fp32 softmax the loss keeps),
  and the larger of two phases: the fp32 logits buffer of the loss, or a layer's backward, which holds the
  gradients in flight (memory.backward_transient_bytes) and, under full recompute, the working set of the layer
  being recomputed (memory.recompute_working_set_bytes: its activations without recompute less its checkpoint);
- DeepSpeed ZeRO-3: the same activations; the states before the step (16 bytes per parameter: bf16 weight and
  gradient partitions, fp32 master, Adam m and v) plus the contiguous reduce bucket; the live set of gathered
  weights and the unsharded gradient of the module in backward (memory.zero3_working_set_bytes, per module bounded
  by stage3_max_live_parameters); and the step's fp32 gradient copies of up to two sub-groups;
- FSDP2: fp32 master weights and Adam (16 bytes per parameter, the fp32 gradients only from backward on) and the
  gathered bf16 weights of two blocks (memory.zero3_working_set_bytes per block).
The check (tests/unit/test_memory_mechanisms.py): every prediction covers its measurement (the one-sided property),
and the unfused-attention cases are not covered without the two transient terms (the terms are needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cost import memory  # noqa: E402
from planner.cost.compute import Shape  # noqa: E402
from planner.schemas.model import ModelSpec  # noqa: E402

GiB = 2**30
DEFAULT_FILE = Path(__file__).resolve().parents[1] / "profiles" / "memory-h200.json"


def spec_of(size: dict) -> ModelSpec:
    """The decoder gpu_memory.py builds: LayerNorm, GeLU MLP of 4h, biases on every linear, untied head."""
    return ModelSpec(name="gpu-memory-gpt", num_layers=size["layers"], hidden_size=size["hidden"],
                     ffn_hidden_size=4 * size["hidden"], num_attention_heads=size["heads"], vocab_size=size["vocab"],
                     seq_len=size["seq"], activation="gelu", norm="layernorm", position="learned", linear_bias=True)


def activation_terms(case: dict) -> dict:
    """Bytes of the activations a step holds at its peak, by term (Korthikanti et al. 2022 as generalised in
    planner.cost.memory), for the case's recompute mode and attention kernel."""
    spec, size = spec_of(case["size"]), case["size"]
    shape = Shape(microbatch_size=size["microbatch"], seq_len=size["seq"], flash_attention=case["attention"] == "flash")
    layer = memory.decoder_activation_bytes(spec, shape, moe_layer=False)
    saved = layer.full if case["recompute"] == "full" else layer.none
    terms = {"layers": spec.num_layers * saved, "embedding": memory.embedding_activation_bytes(spec, shape),
             "head": memory.head_activation_bytes(spec, shape), "logits": memory.logits_buffer_bytes(spec, shape)}
    terms["backward transient"] = layer.transient
    if case["recompute"] == "full":
        terms["recompute working set"] = memory.recompute_working_set_bytes(layer)
    return terms


def stack_terms(case: dict) -> tuple[dict, float]:
    """(terms of the peak above the bytes allocated before the step, predicted bytes allocated before it)."""
    params = case["params"]
    n = params["total"]
    terms = activation_terms(case)
    if case["stack"] == "torch":
        return {"grads (bf16)": 2 * n, **terms}, 2 * n
    if case["stack"] == "deepspeed":
        ds = case["ds"]
        live = memory.zero3_working_set_bytes(params["largest_linear"], gather_bytes=2, unit="module",
                                              max_live_params=ds["max_live"])
        before = 16 * n + memory.reduce_bucket_bytes(ds["reduce_bucket"])
        return {"zero3 live weights and gradient": live, **terms}, before
    live = memory.zero3_working_set_bytes(params["block"], gather_bytes=2, unit="block", max_live_params=0)
    return {"grads (fp32)": 4 * n, "zero3 gathered blocks": live, **terms}, 12 * n


def rows(path: Path = DEFAULT_FILE) -> list[dict]:
    """One row per measured case: measured and predicted bytes (before the step, and the peak above it)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for case in data["cases"]:
        if "error" in case:
            continue
        terms, before = stack_terms(case)
        working = terms.get("recompute working set", 0.0) + terms["backward transient"]
        phases = max(working, terms["logits"])  # the loss's logits are freed before the layers' backward
        peak = sum(terms.values()) - working - terms["logits"] + phases
        out.append({"case": case["case"], "stack": case["stack"], "recompute": case["recompute"],
                    "measured_before": case["allocated_before_bytes"], "predicted_before": before,
                    "measured_peak_above": case["fwd_bwd_peak_bytes"] - case["allocated_before_bytes"],
                    "predicted_peak_above": peak,
                    "predicted_without_working_set": peak - phases + terms["logits"], "terms": terms})
    return out


def table(path: Path = DEFAULT_FILE) -> str:
    lines = [f"{'case':44s} {'before: measured':>16s} {'predicted':>9s} {'peak above: measured':>20s} "
             f"{'predicted':>9s} {'w/o transients':>15s}"]
    for r in rows(path):
        lines.append(f"{r['case']:44s} {r['measured_before'] / GiB:13.2f} GiB {r['predicted_before'] / GiB:9.2f} "
                     f"{r['measured_peak_above'] / GiB:17.2f} GiB {r['predicted_peak_above'] / GiB:9.2f} "
                     f"{r['predicted_without_working_set'] / GiB:15.2f}")
        lines.append("    " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in r["terms"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, nargs="?", default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    print(table(args.file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
