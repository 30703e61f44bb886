"""The search: the plan space, the stage-partition DP, the ILPs (pulp), brute-force references and the driver.

`planner.search.entry.plan(request)` is the entry point (called by `planner.api.plan`). The solvers are pure
functions of numpy arrays; only `planner.search.ilp` imports pulp, and only when it is used.
"""
