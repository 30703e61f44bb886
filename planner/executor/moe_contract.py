"""MoE routing in the memory trace (planner.executor.memtrace): a stated assumption in place of the data.

The executor's MoE layer (planner.nn.moe.MoE) sizes its expert buffers by how many tokens the router sent to each
expert: torch.bincount of the chosen expert ids, read on the host (`counts.tolist()`) and, with a capacity factor, a
boolean mask of the assignments kept. Under fake tensors those values do not exist (data-dependent shapes), so the
trace states them: BALANCED routing, each of the E experts receives tokens x top_k / E assignments (the first
tokens x top_k mod E experts one more), clamped to the expert capacity ceil(capacity_factor x tokens x top_k / E)
where the model sets a capacity factor (GShard sec. 2.2, as MoE.capacity computes it; the clamped assignments are
the dropped ones). Everything else is the executor's own code: the router, the permutation (argsort), the grouped
experts on those counts (GroupedExperts.forward), the un-permutation, the shared experts.

What the assumption leaves out: a skewed router sends more tokens to some experts, and the padded batched layout
(E x the largest count x dim, the CPU/fp32 path the trace runs) grows with the largest count; the plan's note says
routing was assumed balanced. Expert parallelism (ep > 1) exchanges the counts by all-to-all and is not traced
(trace_rank raises; the plan says it was not verified).
"""

from __future__ import annotations

import contextlib

import torch


def balanced_counts(assignments: int, num_experts: int, capacity: int | None) -> list[int]:
    """Assignments per expert under balanced routing, clamped to `capacity` (None: dropless)."""
    base, extra = divmod(assignments, num_experts)
    counts = [base + (1 if expert < extra else 0) for expert in range(num_experts)]
    return counts if capacity is None else [min(count, capacity) for count in counts]


@contextlib.contextmanager
def balanced_routing():
    """While the trace runs: MoE._assign gives balanced counts (a Python list, as the host would read them) and the
    assignments they keep; MoE._run_experts runs the local experts on them; torch.bincount with `minlength` (the
    router's load-balancing statistics: expert ids are below it) has exactly `minlength` entries."""
    from planner.nn.moe import MoE

    saved = MoE._assign, MoE._run_experts, torch.bincount
    real_bincount = torch.bincount

    def assign(self, weights: torch.Tensor, experts: torch.Tensor):
        num_tokens, k = experts.shape
        counts = balanced_counts(num_tokens * k, self.num_experts, self.capacity(num_tokens))
        order = torch.argsort(experts.reshape(-1), stable=True)[:sum(counts)]
        return order // k, weights.reshape(-1)[order], counts

    def run_experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        if self.ep_group is not None:
            raise NotImplementedError("MoE with expert parallelism (ep > 1) is not traced: the all-to-all exchanges "
                                      "the routing's counts")
        return self.experts(x, counts)

    def bincount(input, weights=None, minlength=0):  # noqa: A002 (torch's argument name)
        if minlength <= 0:
            return real_bincount(input, weights, minlength)
        dtype = weights.dtype if weights is not None else torch.int64
        return torch.zeros(minlength, dtype=dtype, device=input.device)

    MoE._assign, MoE._run_experts, torch.bincount = assign, run_experts, bincount
    try:
        yield
    finally:
        MoE._assign, MoE._run_experts, torch.bincount = saved


ROUTING_NOTE = ("MoE routing assumed balanced: each expert gets tokens x top_k / num_experts assignments, clamped to "
                "the capacity factor's bound where set (planner.executor.moe_contract)")
