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
The checker itself is tested on small sources at the end, so a silent checker cannot pass for a clean package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "planner"

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


@dataclass(frozen=True)
class Import:
    """One import statement's reference to a planner module: which module, which name (None: the module itself)."""

    module: str
    name: str | None
    line: int


def module_name(path: Path, package_dir: Path = PACKAGE_DIR) -> str:
    """planner/cost/model.py -> planner.cost.model; a package's __init__.py -> the package."""
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def planner_modules(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """Every module of the package by dotted name, with its source."""
    return {module_name(path, package_dir): path.read_text() for path in sorted(package_dir.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute module of `from <.level><module> import ...` written in `importer`."""
    if not level:
        return module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: the whole tree except the bodies of `if TYPE_CHECKING:` (their else branch runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend([node.test, *node.orelse])
        else:
            stack.extend(ast.iter_child_nodes(node))


def imports_of(source: str, importer: str, *, is_package: bool = False, type_only: bool = False) -> list[Import]:
    """The planner imports of one module's source, function-local ones included, TYPE_CHECKING ones left out
    (with `type_only`, those too)."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree) if type_only else runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, None, node.lineno) for alias in node.names if _in_planner(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, importer, is_package)
            if _in_planner(module):
                found += [Import(module, alias.name, node.lineno) for alias in node.names]
    return found


def _in_planner(module: str) -> bool:
    return module == "planner" or module.startswith("planner.")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def import_graph(modules: dict[str, str], *, type_only: bool = False,
                 ignore: frozenset[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
    """Module -> the planner modules it imports (`from pkg import sub` is an edge to pkg.sub when sub is a module);
    with `type_only`, the imports under `if TYPE_CHECKING:` count too; `ignore`: (module, name) imports left out."""
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        targets = set()
        for imp in imports_of(source, name, is_package=_is_package(name, modules), type_only=type_only):
            if (imp.module, imp.name) in ignore:
                continue
            sub = f"{imp.module}.{imp.name}" if imp.name else None
            targets.add(sub if sub in modules else imp.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _is_package(name: str, modules: dict[str, str]) -> bool:
    return any(other.startswith(name + ".") for other in modules)


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm): each is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _module_bindings(tree: ast.AST, importer: str, modules: Iterable[str], is_package: bool) -> dict[str, str]:
    """Local names bound to planner modules by imports (`from planner.x import y` with y a module, `import a.b as c`,
    and `import a.b`, which binds `a`)."""
    known = set(modules)
    bound = {}
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _in_planner(alias.name):
                    top = alias.name.split(".")[0]
                    bound[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, importer, is_package)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
    return bound


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def private_uses(source: str, importer: str, modules: Iterable[str], *, is_package: bool = False) -> list[str]:
    """Private names of other planner modules used here: imported by name, imported as a module, or read as an
    attribute of an imported planner module (`parallelize._plan(...)`)."""
    known = set(modules)
    imports = imports_of(source, importer, is_package=is_package)
    found = [f"{importer}:{imp.line}: from {imp.module} import {imp.name}" for imp in imports
             if imp.module != importer and imp.name and _is_private(imp.name)]
    found += [f"{importer}:{imp.line}: import {imp.module}" for imp in imports
              if imp.name is None and any(_is_private(part) for part in imp.module.split("."))]
    tree = ast.parse(source)
    bound = _module_bindings(tree, importer, known, is_package)
    for node in runtime_nodes(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        dotted = _dotted(node.value)
        if dotted is None or dotted.split(".")[0] not in bound:
            continue
        owner = ".".join([bound[dotted.split(".")[0]], *dotted.split(".")[1:]])
        if owner in known and owner != importer:
            found.append(f"{importer}:{node.lineno}: {owner}.{node.attr}")
    return found


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
    assert "planner.search.driver" in graph["planner.api"]  # function-local imports are seen


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
              if isinstance(n, ast.FunctionDef) and not _is_private(n.name)}
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


def schedule_name_constants(source: str, names: Iterable[str]) -> list[int]:
    """Lines of the string constants equal to a schedule name (docstrings and prose that mention one do not count:
    only a constant that is exactly the name, as a comparison, a default or a dict key spells it)."""
    wanted = set(names)
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted)


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
           for use in private_uses(source, name, names, is_package=_is_package(name, modules))]
    assert not bad, f"private names taken from another module (give them a public name in one home): {bad}"


# ---------------------------------------------------------------------------------------------- the checker
SOURCE = '''
from typing import TYPE_CHECKING
import planner.cost.model
from planner.search import driver
from . import sibling
if TYPE_CHECKING:
    from planner.api import plan
else:
    from planner.units import GiB
def late():
    from planner.export.scripts import _hidden, visible
    return driver._internal, driver.__name__
'''


def test_checker_sees_local_imports_and_skips_type_checking():
    found = {(i.module, i.name) for i in imports_of(SOURCE, "planner.cost.layers")}
    assert ("planner.cost.model", None) in found and ("planner.search", "driver") in found
    assert ("planner.cost", "sibling") in found and ("planner.units", "GiB") in found
    assert ("planner.export.scripts", "_hidden") in found  # inside a function
    assert not any(module == "planner.api" for module, _ in found)
    typed = {(i.module, i.name) for i in imports_of(SOURCE, "planner.cost.layers", type_only=True)}
    assert ("planner.api", "plan") in typed and found < typed


def test_checker_sees_type_only_circles():
    sources = {"planner.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planner.b import B\n",
               "planner.b": "def f():\n    from planner.a import g\n", "planner": ""}
    assert cycles(import_graph(sources)) == []
    assert cycles(import_graph(sources, type_only=True)) == [frozenset({"planner.a", "planner.b"})]
    assert cycles(import_graph(sources, type_only=True, ignore=frozenset({("planner.b", "B")}))) == []


def test_checker_finds_private_names():
    known = ["planner.cost.layers", "planner.search.driver", "planner.export.scripts", "planner.search"]
    uses = private_uses(SOURCE, "planner.cost.layers", known)
    assert any("import _hidden" in u for u in uses) and any("planner.search.driver._internal" in u for u in uses)
    assert not any("__name__" in u or "visible" in u for u in uses)


def test_checker_finds_schedule_names():
    source = 'X = "1f1b"\n"""the 1f1b schedule"""\ndef f(s="2bw"):\n    return f"{s} 1f1b" if s == "zbv" else s\n'
    assert schedule_name_constants(source, ("1f1b", "2bw", "zbv")) == [1, 3, 4]


def test_checker_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
