"""A minimal TOML writer for the value types our exports use (str, int, float, bool, lists of them).

The standard library reads TOML (tomllib) but does not write it; the exports need only flat tables, so
a dependency is not worth it. Tests round-trip every export through tomllib.
"""

from __future__ import annotations

import json
from typing import Any


def toml_value(value: Any) -> str:
    """One TOML value. Strings use JSON escaping, which is valid TOML basic-string escaping."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(item, (list, tuple)) for item in value):
            return "[\n" + "".join(f"  {toml_value(item)},\n" for item in value) + "]"
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_document(tables: dict[str, dict[str, Any]], *, header: list[str] | None = None) -> str:
    """Tables in the given order, keys in the given order; `header` lines go first (already commented)."""
    lines = list(header or [])
    for name, entries in tables.items():
        if not entries:
            continue
        lines.append("")
        lines.append(f"[{name}]")
        for key, value in entries.items():
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines).lstrip("\n") + "\n"
