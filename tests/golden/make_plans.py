"""Regenerate the golden plans (tests/golden/plan_*.json) that tests/unit/test_search_properties.py reproduces.

Run after an intended change of the cost model or the search: python tests/golden/make_plans.py
Review the diff: a golden plan that moves is a behaviour change someone must be able to explain.
"""

from pathlib import Path

from planner.api import build_request, plan
from planner.io import atomic_write_text, canonical_json
from planner.schemas.plan import SearchLimits

HERE = Path(__file__).resolve().parent
LIMITS = SearchLimits(max_microbatch_size=2, top_k=3)
REQUESTS = {
    "plan_tinyllama_8xh100.json": dict(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=2048),
    "plan_llama3-8b_16xa100-40g.json": dict(model="llama3-8b", topology="dgx-a100-40g", gpus=16, global_batch_size=128, seq_len=4096,
                                            framework="megatron-core"),
    "plan_mixtral-8x7b_16xh100.json": dict(model="mixtral-8x7b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                           framework="torchtitan"),
}


def main() -> None:
    for name, fields in REQUESTS.items():
        atomic_write_text(HERE / name, canonical_json(plan(build_request(**fields, search=LIMITS))))
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
