"""The parallel degrees have one home (issue 22): read from the source with ast, as tests/unit/test_layering.py
reads the imports.

- Degrees are declared only in planner.schemas.dims.ParallelDims: no other class body declares two or more int
  fields named after an axis (dp, tp, pp, cp, ep); the records that add choices to the degrees subclass it
  (planner.cost.types.Candidate, planner.frameworks.Config). ALLOWED lists, each with its reason, the classes that
  must keep such fields.
- No hand-written collection of the axis names outside the module that defines Axis: no tuple, list or set literal
  of three or more names that are all axis names, no dict literal keyed by three or more of them and nothing else
  (iterate `Axis`, read `ParallelDims.sizes()` / `layout_sizes()`, or take the stack's order from its profile).
The checkers are tested on small sources at the end, so a silent checker cannot pass for a clean package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from planner.schemas.dims import Axis

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "planner"
HOME = "planner.schemas.dims"
AXIS_NAMES = frozenset(axis.value for axis in Axis)
INT_ANNOTATIONS = frozenset({"int", "int | None", "Optional[int]"})

# class (module.Class) -> why it keeps degree fields of its own
ALLOWED = {
    "planner.schemas.dims.ParallelDims": "the home",
    "planner.schemas.plan.Parallelism": (
        "the LaunchPlan's JSON (schema version 1) names the degrees as fields of `parallelism`; the planner reads "
        "them through Parallelism.dims and the validator runs ParallelDims.check, so the file format stays as it is"),
    "planner.service.schemas.EstimateBody": (
        "the HTTP body of POST /v1/estimate spells the degrees as `planner estimate`'s flags (dp optional); the "
        "worker resolves them with ParallelDims.resolve"),
    "planner.schemas.profile.LayerProfile": (
        "a measured profile file's record of the shape one layer was timed at (tp heads/ffn split, ep experts "
        "split): a slice of a layer, not a plan's layout"),
    "planner.cost.compute.Shape": (
        "the per-GPU slice of one micro-batch the cost formulas read (what tp, cp and ep divide a layer's tensors "
        "by; 1 for a layer costed unsplit), built from a Candidate by CostModel.shape"),
    "planner.executor.checkpoint.ShardKeys": (
        "one rank's place in its tp and ep groups (rank and group size each), to name its checkpoint keys"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, str]:
    return {module_name(path): path.read_text() for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def degree_classes(source: str, module: str) -> dict[str, list[str]]:
    """module.Class -> the int fields named after an axis its body declares, for classes with two or more."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            names = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                     and s.target.id in AXIS_NAMES and ast.unparse(s.annotation) in INT_ANNOTATIONS]
            if len(names) >= 2:
                found[f"{module}.{node.name}"] = names
    return found


def _names(nodes: list[ast.expr | None]) -> list[str] | None:
    """The string constants of `nodes` when every one is an axis name, else None."""
    values = [n.value if isinstance(n, ast.Constant) else None for n in nodes]
    return values if values and all(v in AXIS_NAMES for v in values) else None


def axis_name_literals(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple/list/set of >= 3 axis names and every dict keyed by >= 3 of them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = _names(node.elts)
        elif isinstance(node, ast.Dict):  # a sizes mapping; a record's JSON with more fields (a Parallelism) is not
            names = _names(node.keys)
        else:
            continue
        if names and len(names) >= 3:
            found.append((node.lineno, names))
    return found


def test_degrees_are_declared_only_in_parallel_dims():
    found = {}
    for module, source in sources().items():
        found.update(degree_classes(source, module))
    bad = {name: fields for name, fields in found.items() if name not in ALLOWED}
    assert not bad, (f"declare the parallel degrees once, in {HOME}.ParallelDims (subclass it, or hold one) "
                     f"instead of: {bad}")
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED names classes that no longer declare degrees: drop {stale}"


def test_records_of_degrees_are_parallel_dims():
    from planner.cost.types import Candidate
    from planner.frameworks import Config
    from planner.schemas.dims import ParallelDims

    assert issubclass(Candidate, ParallelDims) and issubclass(Config, ParallelDims)


def test_no_hand_written_axis_names_outside_their_home():
    bad = [f"{module}:{line} {names}" for module, source in sources().items() if module != HOME
           for line, names in axis_name_literals(source)]
    assert not bad, f"iterate planner.schemas.dims.Axis or read ParallelDims.sizes()/layout_sizes() instead of: {bad}"


# ---------------------------------------------------------------------------------------------- the checkers
SOURCE = '''
from dataclasses import dataclass
class Degrees:
    dp: int
    tp: int | None = None
    sp: bool = False
class Links:
    dp: GroupLink
    tp: GroupLink
class One:
    tp: int
ORDER = ("pp", "dp", "cp", "tp")
PAIR = ("dp", "cp")
MIXED = ["dp", "tp", "pp", "vpp"]
SIZES = {"pp": 1, "dp": 2, "cp": 1}
RECORD = {"dp": 1, "tp": 1, "pp": 1, "sp": False}
def f():
    return {"tp": 1, "dp": 2}
'''


def test_checker_finds_degree_classes():
    assert degree_classes(SOURCE, "m") == {"m.Degrees": ["dp", "tp"]}


def test_checker_finds_axis_name_literals():
    lines = [line for line, _ in axis_name_literals(SOURCE)]
    assert lines == [12, 15], axis_name_literals(SOURCE)
