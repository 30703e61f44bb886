"""The layering checker (tests/unit/layering_checker.py) on small sources, so a silent checker cannot pass for a clean
package in tests/unit/test_layering.py."""

from __future__ import annotations

from layering_checker import cycles, import_graph, imports_of, long_functions, private_uses, schedule_name_constants

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


def test_checker_finds_long_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    nested = "".join(f"        y{i} = {i}\n" for i in range(60))
    source = f"@decorated\ndef long():\n{body}\ndef short():\n    pass\nclass C:\n    def method(self):\n{nested}"
    assert long_functions(source, 60) == [("long", 1, 62), ("method", 67, 61)]
    assert long_functions(source, 62) == []
