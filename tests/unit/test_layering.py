"""The package's layering, read from the source: data flows one way (schemas -> models/topology/frameworks/profiling
-> cost -> search -> plan -> executor/exporters; the CLI and the HTTP service are thin adapters over planner/api.py).

Every planner/**/*.py is parsed with ast and every import counts, function-local ones included (a lazy import that
closes a circle is still a circle); only imports under `if TYPE_CHECKING:` do not (they never run). Checked:
- no import cycle among planner modules;
- planner/cost layered even by type: no circle among its modules when TYPE_CHECKING imports count too (the
  CostModel type aside), nothing in it imports the search's bounds (planner.cost.bounds), and the CostModel has
  no function-local imports and no method forwarding to a bounds function;
- the lower layers import nothing above them (LAYER_RULES, the rules that hold today);
- no private name (leading underscore) is imported from another planner module, nor read off one as an attribute;
- a pipeline schedule's name is spelled only in planner/schedules.py (its Schedule object), which imports nothing
  above planner.errors: every other module asks the object (no string constant equal to a schedule name).
- no function longer than FUNCTION_LINES lines (signature, decorators and docstring counted) outside
  LONG_FUNCTIONS_ALLOWED, each entry with its reason.
The checker lives in tests/unit/layering_checker.py and is tested on small sources in
tests/unit/test_layering_checker.py, so a silent checker cannot pass for a clean package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

import pytest
from layering_checker import (PACKAGE_DIR, cycles, import_graph, is_package, is_private, long_functions, planner_modules,
                              private_uses, schedule_name_constants)

KNOWN_CYCLES: set[frozenset[str]] = set()

ABOVE_COST = ("planner.search", "planner.plan", "planner.api", "planner.cli", "planner.service", "planner.export",
              "planner.executor", "planner.check", "planner.explain", "planner.plot", "planner.report")
ADAPTERS = ("planner.api", "planner.cli", "planner.service")

# (who: module prefix, forbidden: module prefixes it must not import, why)
LAYER_RULES = [
    (prefix, ABOVE_COST + ("planner.cost",), "sits below the cost model")
    for prefix in ("planner.models", "planner.topology", "planner.frameworks", "planner.profiling")
] + [
    ("planner.cost", ABOVE_COST + ("planner.estimate", "planner.nn"),
     "the cost model sits below the search and everything after it (and stays torch-free)"),
    ("planner.search", ADAPTERS + ("planner.export", "planner.executor", "planner.check", "planner.explain",
                                   "planner.plot", "planner.report", "planner.nn"),
     "the search sits below the façade, its adapters and the plan's consumers"),
    ("planner.executor", ADAPTERS, "the executor is called by the façade, never the reverse"),
    ("planner.export", ADAPTERS + ("planner.executor",),
     "the exporters are called by the façade, never the reverse; what they share with the executor (launch command "
     "lines, run options, the runnable rules, schedule class names) lives below both, in planner.launch_spec"),
    ("planner.launch_spec", ABOVE_COST + ("planner.nn",),
     "the home the executor and the exporters share sits below both (and stays torch-free)"),
]
# Only these may import from planner: the schemas are the bottom layer (the schedule registry sits below them: the
# plan schema's Schedule Literal is built from its names).
SCHEMAS_MAY_IMPORT = ("planner.schemas", "planner.units", "planner.errors", "planner.schedules")
SCHEDULES_MODULE = "planner.schedules"
SCHEDULES_MAY_IMPORT = ("planner.errors",)
# Modules allowed to spell a schedule name as a string constant besides planner.schedules, each with its reason.
SCHEDULE_NAME_ALLOWED: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------- the package
@pytest.fixture(scope="module")
def modules() -> dict[str, str]:
    return planner_modules()


@pytest.fixture(scope="module")
def graph(modules) -> dict[str, set[str]]:
    return import_graph(modules)


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_package_is_found(modules, graph):
    assert len(modules) > 100 and "planner.cost.model" in modules and "planner.api" in modules
    assert "planner.search.entry" in graph["planner.api"]  # function-local imports are seen


def test_no_import_cycles(graph):
    unexpected = [sorted(c) for c in cycles(graph) if c not in KNOWN_CYCLES]
    assert not unexpected, f"import circles (break them by moving the shared piece to a lower module): {unexpected}"


# The type the cost model's free functions take it by (`model: "CostModel"`): the one name a lower cost module may
# import from planner.cost.model, and only under TYPE_CHECKING (the runtime graph above has no such edge).
COST_MODEL_TYPE = frozenset({("planner.cost.model", "CostModel")})


def test_cost_is_layered_even_by_type(modules):
    """planner/cost as layers (formulas at the bottom, the per-candidate assembly (arrays, evaluate), the CostModel,
    the search's bounds on top): no circle among its modules even when the imports under TYPE_CHECKING count, the
    CostModel type aside (issue 22 item 3)."""
    graph = import_graph(modules, type_only=True, ignore=COST_MODEL_TYPE)
    cost = {m: {t for t in targets if _within(t, ["planner.cost"])} for m, targets in graph.items()
            if _within(m, ["planner.cost"])}
    found = [sorted(c) for c in cycles(cost)]
    assert not found, f"circles in planner/cost, type-only imports counted: {found}"


def test_the_bounds_sit_on_top_of_cost(modules):
    """planner.cost.bounds is read by the search only: no cost module imports it, even for a type."""
    graph = import_graph(modules, type_only=True)
    bad = sorted(m for m, targets in graph.items() if _within(m, ["planner.cost"]) and "planner.cost.bounds" in targets)
    assert not bad, f"planner.cost.bounds is the top of planner/cost (the search's bounds); imported by {bad}"


def test_the_cost_model_forwards_nothing(modules):
    """No CostModel method imports inside its body (the pattern that hid the last circle: re-import a module to
    forward to a free function that takes the CostModel back), and none shadows a function of planner.cost.bounds."""
    tree = ast.parse(modules["planner.cost.model"])
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CostModel"]
    local = sorted(f"CostModel.{fn.name}:{node.lineno}" for fn in cls.body if isinstance(fn, ast.FunctionDef)
                   for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom)))
    assert not local, f"function-local imports in the CostModel: {local}"
    bounds = {n.name for n in ast.parse(modules["planner.cost.bounds"]).body
              if isinstance(n, ast.FunctionDef) and not is_private(n.name)}
    assert bounds, "planner.cost.bounds defines no public function: the check below would be empty"
    shadows = sorted(bounds & {fn.name for fn in cls.body if isinstance(fn, ast.FunctionDef)})
    assert not shadows, f"CostModel methods named after planner.cost.bounds functions (call those instead): {shadows}"


@pytest.mark.parametrize("who, forbidden, why", LAYER_RULES, ids=[rule[0] for rule in LAYER_RULES])
def test_lower_layers_import_nothing_above(graph, who, forbidden, why):
    bad = sorted(f"{m} imports {t}" for m, targets in graph.items() if _within(m, [who])
                 for t in targets if _within(t, forbidden))
    assert not bad, f"{who} {why}: {bad}"


def test_schemas_are_the_bottom_layer(graph):
    bad = sorted(f"{m} imports {t}" for m, targets in graph.items() if _within(m, ["planner.schemas"])
                 for t in targets if not _within(t, SCHEMAS_MAY_IMPORT))
    assert not bad, f"planner.schemas may import only {SCHEMAS_MAY_IMPORT}: {bad}"


def test_the_schedules_are_the_bottom_layer(graph):
    assert graph[SCHEDULES_MODULE] <= set(SCHEDULES_MAY_IMPORT), graph[SCHEDULES_MODULE]


def test_schedule_names_are_spelled_only_in_their_schedule(modules):
    """Adding a schedule means one Schedule object in planner/schedules.py; nothing else names one."""
    from planner.schedules import ALL

    names = [n for s in ALL for n in (s.name, *s.aliases)]
    bad = [f"{name}:{line}" for name, source in modules.items() if name != SCHEDULES_MODULE
           and name not in SCHEDULE_NAME_ALLOWED for line in schedule_name_constants(source, names)]
    assert not bad, f"ask planner.schedules (schedule(name), its attributes) instead of spelling the name: {bad}"
    assert schedule_name_constants(modules[SCHEDULES_MODULE], names)  # the checker sees the registry's own names


def test_only_the_adapters_import_the_facade(graph):
    """api.py is imported by the CLI and the service only; the service by the CLI only; the CLI by nobody."""
    allowed = {"planner.api": ("planner.cli", "planner.service"), "planner.service": ("planner.cli", "planner.service"),
               "planner.cli": ("planner.cli",)}
    bad = sorted(f"{m} imports {t}" for m, targets in graph.items() for t in targets
                 for top, users in allowed.items() if _within(t, [top]) and not _within(m, users))
    assert not bad, bad


# What the thin adapters may import besides planner.api: themselves, rendering (planner.report: rich tables;
# planner.plot: the `explain --plot` figure), input/output plumbing (planner.io: loading, canonical JSON, atomic
# writes; planner.errors), the file formats they parse and print (planner.schemas) and unit constants
# (planner.units, GiB in the estimate tables). `planner serve` starts the other adapter (planner.service), and
# the service's pool reads `planner.__file__` to put this copy of the package first on its workers' path.
# Everything that does the work (search, cost, check, export, executor, models, topology, profiling,
# frameworks, launch_spec) is reached through planner.api.
# The schedule registry (planner.schedules: names, the default, the choices a flag offers) is a bottom-layer fact
# like the units.
CLI_MAY_IMPORT = ("planner.api", "planner.cli", "planner.report", "planner.plot", "planner.io", "planner.errors",
                  "planner.schemas", "planner.units", "planner.service", "planner.schedules")
SERVICE_MAY_IMPORT = ("planner.api", "planner.service", "planner.io", "planner.errors", "planner.schemas",
                      "planner.schedules")


@pytest.mark.parametrize("adapter, may_import", [("planner.cli", CLI_MAY_IMPORT), ("planner.service", SERVICE_MAY_IMPORT)])
def test_adapters_work_only_through_the_facade(graph, adapter, may_import):
    bad = sorted(f"{m} imports {t}" for m, targets in graph.items() if _within(m, [adapter])
                 for t in targets if t != "planner" and not _within(t, may_import))
    assert not bad, f"{adapter} is a thin adapter over planner/api.py: add a function there instead of {bad}"


def test_the_shared_launch_home_imports_without_torch():
    """planner.launch_spec is what `planner launch` and the torchrun/slurm exporters run on a login node: no torch."""
    import subprocess
    import sys

    code = ("import sys, planner.launch_spec.commands, planner.launch_spec.runnable, planner.schedules, "
            "planner.export.scripts; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE_DIR.parent)


def test_no_private_names_across_modules(modules):
    names = list(modules)
    bad = [use for name, source in modules.items()
           for use in private_uses(source, name, names, is_package=is_package(name, modules))]
    assert not bad, f"private names taken from another module (give them a public name in one home): {bad}"


FUNCTION_LINES = 60  # the developers' guide: functions under ~60 lines
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {  # "module.function": why it may be longer
    "planner.cli.estimate.estimate": "a typer command: 45 lines of option declarations (the CLI's help), a 20-line body",
    "planner.cli.plan.plan_command": "a typer command: 40 lines of option declarations (the CLI's help), a 25-line body",
}


def test_functions_are_short(modules):
    found = {f"{name}.{fn}": length for name, source in modules.items() for fn, _, length in long_functions(source, FUNCTION_LINES)}
    bad = {name: length for name, length in found.items() if name not in LONG_FUNCTIONS_ALLOWED}
    assert not bad, f"functions over {FUNCTION_LINES} lines (split them by concept): {bad}"
    stale = set(LONG_FUNCTIONS_ALLOWED) - set(found)
    assert not stale, f"allowed long functions that are short now (drop them from LONG_FUNCTIONS_ALLOWED): {stale}"
