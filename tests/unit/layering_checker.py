"""The layering checker read by tests/unit/test_layering.py (the package's rules) and tested on small sources by
tests/unit/test_layering_checker.py: every planner/**/*.py parsed with ast, every import counted, function-local
ones included, only those under `if TYPE_CHECKING:` not (unless asked for); import graphs and their cycles;
private names taken across modules; string constants spelling a schedule name; functions over a length.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "planner"


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


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def import_graph(modules: dict[str, str], *, type_only: bool = False,
                 ignore: frozenset[tuple[str, str]] = frozenset()) -> dict[str, set[str]]:
    """Module -> the planner modules it imports (`from pkg import sub` is an edge to pkg.sub when sub is a module);
    with `type_only`, the imports under `if TYPE_CHECKING:` count too; `ignore`: (module, name) imports left out."""
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        targets = set()
        for imp in imports_of(source, name, is_package=is_package(name, modules), type_only=type_only):
            if (imp.module, imp.name) in ignore:
                continue
            sub = f"{imp.module}.{imp.name}" if imp.name else None
            targets.add(sub if sub in modules else imp.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def is_package(name: str, modules: dict[str, str]) -> bool:
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
             if imp.module != importer and imp.name and is_private(imp.name)]
    found += [f"{importer}:{imp.line}: import {imp.module}" for imp in imports
              if imp.name is None and any(is_private(part) for part in imp.module.split("."))]
    tree = ast.parse(source)
    bound = _module_bindings(tree, importer, known, is_package)
    for node in runtime_nodes(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        dotted = _dotted(node.value)
        if dotted is None or dotted.split(".")[0] not in bound:
            continue
        owner = ".".join([bound[dotted.split(".")[0]], *dotted.split(".")[1:]])
        if owner in known and owner != importer:
            found.append(f"{importer}:{node.lineno}: {owner}.{node.attr}")
    return found


def schedule_name_constants(source: str, names: Iterable[str]) -> list[int]:
    """Lines of the string constants equal to a schedule name (docstrings and prose that mention one do not count:
    only a constant that is exactly the name, as a comparison, a default or a dict key spells it)."""
    wanted = set(names)
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted)


def long_functions(source: str, limit: int) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function (methods and nested ones included) longer than `limit` lines,
    its signature, decorators and docstring counted."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - first + 1 > limit:
                out.append((node.name, first, node.end_lineno - first + 1))
    return out
