"""Reading and writing our files: YAML/JSON in, canonical JSON out, atomic writes, readable errors."""

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import BadInputError

T = TypeVar("T", bound=BaseModel)

FLOAT_SIGNIFICANT_DIGITS = 10


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder and os.replace: all or nothing."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_structured(path: str | Path) -> Any:
    """Parse a YAML or JSON file; a missing file or a syntax error becomes a BadInputError naming file and line."""
    source = Path(path)
    if not source.is_file():
        raise BadInputError(f"file not found: {source}: check the path")
    text = source.read_text(encoding="utf-8")
    try:
        if source.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{source}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise BadInputError(f"{source}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: `source: field.path: message (got value)`."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
        lines.append(f"{source}: {where}: {err['msg']}{shown}")
    return "; ".join(lines)


def validate(schema: type[T], data: Any, *, source: str) -> T:
    """Validate `data` against `schema`; errors name the field, the value and the schema's message."""
    if not isinstance(data, dict):
        raise BadInputError(f"{source}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, source)) from None


def load_file(schema: type[T], path: str | Path) -> T:
    """Load and validate a YAML/JSON file against a schema."""
    return validate(schema, load_structured(path), source=str(path))


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{FLOAT_SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value


def canonical_json(obj: BaseModel | Any) -> str:
    """Deterministic JSON: sorted keys, floats rounded to 10 significant digits, 2-space indent, trailing newline."""
    data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
    return json.dumps(_canonical(data), sort_keys=True, indent=2) + "\n"
