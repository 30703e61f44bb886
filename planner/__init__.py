"""Auto-parallel planner for LLM training.

Data flows one way: schemas -> profiling/topology -> cost -> search -> plan -> executor/exporters.
`import planner` never imports torch; only `planner.profiling.measure` and `planner.executor` do.
"""

__version__ = "0.1.0"
