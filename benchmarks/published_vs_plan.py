"""The plan found vs the published configuration, under the same cost model, for every published run on NVIDIA GPUs
in validation/published_runs.json (codegeex13b ran on Ascend 910: no topology of ours describes it).

For each run: the request (model preset, the closest topology preset scaled to the run's nodes, global batch and
sequence length), the published configuration as a Candidate (assumptions where the source publishes nothing are
printed in the `assumed` column), its predicted step time, and the plan `planner plan` finds for the same request.
The search covers the published configuration's point of the space, so the plan is never predicted slower than it
when it fits; the script exits 1 if that ever fails.

Run: python benchmarks/published_vs_plan.py [--runs PATH] [--only ID ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_RUNS = Path(__file__).resolve().parents[1] / "validation" / "published_runs.json"
TOPOLOGY_BY_GPU = (("A100-SXM4-40GB", "dgx-a100-40g"), ("A100 40GB", "dgx-a100-40g"), ("A100", "dgx-a100-80g"),
                   ("H100", "dgx-h100"), ("H800", "hgx-h800"))
PRESET_BY_FAMILY = {"bloom": "bloom-176b", "glm": "glm-130b", "opt": "opt-175b", "mt-nlg": "mt-nlg-530b",
                    "megatron-turing": "mt-nlg-530b", "gpt-neox": "gpt-neox-20b"}
# Megatron-DeepSpeed-era defaults where a source is silent (each use is printed):
ASSUMED = dict(microbatch_size=1, recompute="full", zero_stage=1)


def topology_for(run: dict) -> str | None:
    gpu = run["hardware"]["gpu_model"]
    if "NVIDIA" not in gpu:
        return None
    memory = run["hardware"].get("gpu_memory_gib")
    if "A100" in gpu:
        return "dgx-a100-40g" if memory == 40 or "40GB" in gpu else "dgx-a100-80g"
    return next((preset for key, preset in TOPOLOGY_BY_GPU if key in gpu), None)


def preset_for(run: dict) -> str | None:
    name = (run["model"]["family"] + " " + run["name"]).lower()
    return next((preset for key, preset in PRESET_BY_FAMILY.items() if key in name), None)


def published_config(run: dict) -> tuple[dict, list[str]]:
    """Candidate fields of the published configuration, and the assumptions made."""
    par, train, assumed = run["parallel"], run["training"], []
    mbs = train.get("micro_batch")
    if mbs is None:
        mbs = ASSUMED["microbatch_size"]
        assumed.append(f"mbs={mbs}")
    recompute_text = (train.get("recompute") or "").lower()
    if "fsdp" in recompute_text or "zero-3" in recompute_text:
        recompute, zero = "full", 3
        assumed.append("recompute=full")
    else:
        recompute = "full" if recompute_text else ASSUMED["recompute"]
        if not recompute_text:
            assumed.append(f"recompute={recompute}")
        zero = train.get("zero_stage")
        if zero is None:
            zero = ASSUMED["zero_stage"]
            assumed.append(f"zero={zero}")
        elif isinstance(zero, str):  # e.g. "FSDP (fully sharded, ZeRO-3-like) over 124 ranks": FSDP full shard = ZeRO-3
            zero = 3 if ("fsdp" in zero.lower() or "zero-3" in zero.lower()) else int(zero)
    return dict(dp=par["dp"], tp=par["tp"], pp=par["pp"], cp=par.get("cp") or 1, ep=par.get("ep") or 1,
                sp=bool(par.get("sp")), microbatch_size=mbs, recompute=recompute, zero_stage=zero, schedule="1f1b"), assumed


def global_batch(run: dict, dp: int, mbs: int) -> tuple[int, list[str]]:
    gbs = run["training"].get("global_batch_seqs")
    if gbs is not None:
        return gbs, []
    tokens = 2 * 2**20  # OPT-175B: "2M tokens" per batch; rounded to a multiple of dp * mbs
    seqs = max(dp * mbs, round(tokens / run["model"]["seq_len"] / (dp * mbs)) * dp * mbs)
    return seqs, [f"global_batch={seqs}"]


def compare(run: dict) -> dict | None:
    from planner.api import build_request
    from planner.cost.model import Candidate
    from planner.search.driver import make_cost_model, search

    topology, preset = topology_for(run), preset_for(run)
    if topology is None or preset is None:
        return None
    fields, assumed = published_config(run)
    gbs, more = global_batch(run, fields["dp"], fields["microbatch_size"])
    request = build_request(model=preset, topology=topology, nodes=run["parallel"]["num_gpus"] // 8,
                            gpus=run["parallel"]["num_gpus"], global_batch_size=gbs, seq_len=run["model"]["seq_len"])
    cand = Candidate(**fields, num_microbatches=gbs // (fields["dp"] * fields["microbatch_size"]))
    cost = make_cost_model(request)
    reasons = cost.validity_reasons(cand)
    published = None if reasons else cost.evaluate(cand)
    start = time.perf_counter()
    result = search(request)
    wall_s = time.perf_counter() - start
    best = result.ranked[0] if result.ranked else None
    return dict(
        id=run["id"], gpus=request.gpus, assumed=", ".join(assumed + more) or "-",
        published=_describe(cand), published_s=published.step_time_s if published else None,
        published_fits=bool(published and published.fits), published_why=(reasons or (published.reasons if published else ())),
        plan=_describe(best.cand) if best else "(nothing fits)", plan_s=best.ev.step_time_s if best else None,
        considered=result.considered, wall_s=wall_s,
    )


def _describe(c) -> str:
    return (f"dp{c.dp} tp{c.tp} pp{c.pp}" + (f" cp{c.cp}" if c.cp > 1 else "") + (f" vpp{c.vpp}" if c.vpp > 1 else "")
            + f" z{c.zero_stage} mbs{c.microbatch_size} {c.schedule} {c.recompute}" + (" sp" if c.sp else ""))


def never_slower(row: dict) -> bool:
    """The claim: when the published configuration fits, the plan is predicted no slower."""
    if not row["published_fits"]:
        return True
    return row["plan_s"] is not None and row["plan_s"] <= row["published_s"] * (1 + 1e-9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    parser.add_argument("--only", action="append")
    args = parser.parse_args(argv)
    runs = json.loads(args.runs.read_text())
    rows, skipped = [], []
    for run in runs:
        if args.only and run["id"] not in args.only:
            continue
        row = compare(run)
        (rows.append(row) if row else skipped.append(run["id"]))
    print(f"{'run':<22}{'gpus':>6}  {'published (predicted s)':<48}{'plan (predicted s)':<52}{'gain':>7}  assumed")
    for r in rows:
        pub = f"{r['published']} ({r['published_s']:.2f})" if r["published_s"] is not None else f"{r['published']} (invalid)"
        if r["published_s"] is not None and not r["published_fits"]:
            pub += " OOM"
        plan = f"{r['plan']} ({r['plan_s']:.2f})" if r["plan_s"] is not None else r["plan"]
        gain = f"{r['published_s'] / r['plan_s']:.2f}x" if r["plan_s"] and r["published_s"] else "-"
        print(f"{r['id']:<22}{r['gpus']:>6}  {pub:<48}{plan:<52}{gain:>7}  {r['assumed']}")
    for r in rows:
        if not r["published_fits"]:
            print(f"note: {r['id']}: the published configuration does not fit under the cost model: {'; '.join(r['published_why'])[:300]}")
    if skipped:
        print(f"skipped (not an NVIDIA GPU or no matching preset): {', '.join(skipped)}")
    bad = [r["id"] for r in rows if not never_slower(r)]
    print("plan never predicted slower than the published configuration: " + ("yes" if not bad else f"NO ({', '.join(bad)})"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
