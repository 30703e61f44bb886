"""Reading and writing our files: YAML/JSON in, canonical JSON out, atomic writes, readable errors."""

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import BadInputError

T = TypeVar("T", bound=BaseModel)

FLOAT_SIGNIFICANT_DIGITS = 10


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same folder and os.replace: all or nothing.

    The file gets the mode a plain open() would give it (0666 less the umask; an existing file keeps its
    mode), not mkstemp's 0600. An unwritable place is a BadInputError naming the path, not a traceback.
    Only a regular file is ever replaced: a name that ends in a separator, or that exists as a folder, device
    node, FIFO or socket (`-o /dev/null` as root would otherwise become a regular file) is refused before any
    write, and again just before the rename. A symbolic link is followed: the file it names is replaced."""
    problem = special_output_problem(path)
    if problem:
        raise BadInputError(f"cannot write {_shown(path)}: {problem}: name a regular file")
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise BadInputError(_unwritable(target, exc)) from None
    try:
        os.fchmod(fd, _file_mode(target))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        late = special_output_problem(target)  # it changed since the check above: leave it alone
        if late:
            raise BadInputError(f"cannot write {_shown(target)}: {late}: name a regular file")
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BadInputError(_unwritable(target, exc)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _file_mode(target: Path) -> int:
    """An existing file's permission bits, else 0666 less the process umask (read without changing it)."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        pass
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic read-and-restore (not thread-safe, hence the fallback only)
    os.umask(mask)
    return 0o666 & ~mask


def special_output_problem(path: str | Path) -> str | None:
    """Why `path` must not be written by replacing it, or None: a name ending in a path separator (a folder
    meant, `-o newdir/`), or an existing entry that is not a regular file once links are followed."""
    text = os.fspath(path)
    if text.endswith(os.sep) or (os.altsep and text.endswith(os.altsep)):
        return "the name ends in a path separator, so it names a folder"
    try:
        mode = os.stat(text).st_mode
    except (OSError, ValueError):
        return None  # absent (or unnameable: check_writable and the write itself say why)
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"it exists and is {kind}, which a planner output never replaces"


def _unwritable(target: Path, exc: OSError) -> str:
    return f"cannot write {_shown(target)}: {exc.strerror or exc}: choose a writable file path"


def _shown(path: str | Path) -> str:
    """A path for a one-line message (as given: a trailing '/' kept): very long names are shortened in the middle."""
    text = os.fspath(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text)} characters)"


def check_writable(path: str | Path | None, *, flag: str = "--output") -> None:
    """Fail before the work starts when `path` cannot be written: a folder, a parent that is a file, an
    over-long name, no permission, a read-only file system. Probes by creating and removing a temporary
    file in the nearest existing folder (permission bits alone mislead root and read-only mounts)."""
    if path is None:
        return
    target = Path(path)
    problem = special_output_problem(path)  # a folder, a name ending in '/', a device node, FIFO or socket
    if problem is None and len(target.name.encode()) > 255:
        problem = f"the file name is {len(target.name.encode())} bytes, over the 255-byte limit of most file systems"
    elif problem is None:
        parent = _existing_parent(target)
        if not parent.is_dir():
            problem = f"{_shown(parent)} is not a folder"
        elif target.exists() and not os.access(target, os.W_OK):
            problem = "permission denied"
        else:
            problem = _probe(parent)
    if problem:
        raise BadInputError(f"{flag}={_shown(path)} cannot be written: {problem}: choose a writable file path")


def _probe(folder: Path) -> str | None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=".planner-probe.", dir=folder)
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return None


def _existing_parent(target: Path) -> Path:
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


MAX_JSON_BYTES = 64 << 20  # a LaunchPlan of 16384 GPUs is ~5 MB
MAX_YAML_BYTES = 4 << 20  # model, topology and profile files are a few KB; PyYAML parses ~1 MB/s


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when built with it
    """SafeLoader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]`: a list or mapping as a key (unhashable)
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain name, not a list or mapping", key_node.start_mark)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}: keep one of them", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def no_duplicate_pairs(pairs: list) -> dict:
    """json object_pairs_hook refusing a key given twice (json keeps the last one silently): ValueError naming it."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"duplicate key {dup!r}: keep one of them")
    return dict(pairs)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows: write a finite number")


def is_file(path: str | Path) -> bool:
    """Path.is_file that says False, not OSError, for a name the OS refuses (over 255 bytes, a NUL byte)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_text_checked(path: str | Path, *, max_bytes: int) -> str:
    """A text file's contents, or a BadInputError naming the file and the fix: missing, unreadable, a
    folder, over `max_bytes` (checked before reading), or not UTF-8 text (a binary file)."""
    source = Path(path)
    try:
        if not source.is_file():
            raise BadInputError(f"file not found: {_shown(source)}: check the path")
        size = source.stat().st_size
        if size > max_bytes:
            raise BadInputError(f"{_shown(source)} is {size / 2**20:.1f} MiB, over the {max_bytes >> 20} MiB limit for this kind of file: check the path")
        with source.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise BadInputError(f"cannot read {_shown(source)}: {exc.strerror or exc}: check the path and its permissions") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{_shown(source)} is not UTF-8 text (byte {exc.start}): pass a YAML or JSON file") from None


def shipped_names(folder: Path, suffix: str = ".yaml") -> list[str]:
    """The names (file stems) of the data files in a shipped folder, sorted; none when the folder is missing."""
    return sorted(path.stem for path in folder.glob(f"*{suffix}")) if folder.is_dir() else []


def load_structured(path: str | Path) -> Any:
    """Parse a YAML or JSON file; a missing, unreadable, binary or oversized file, a syntax error, a duplicate
    key or NaN/Infinity in JSON becomes a BadInputError naming file and line."""
    source = Path(path)
    is_json = source.suffix == ".json"
    text = read_text_checked(source, max_bytes=MAX_JSON_BYTES if is_json else MAX_YAML_BYTES)
    try:
        if is_json:
            return json.loads(text, object_pairs_hook=no_duplicate_pairs, parse_constant=_reject_constant)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{_shown(source)}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # NaN / Infinity, a duplicate key
        raise BadInputError(f"{_shown(source)}: {exc}") from None
    except RecursionError:
        raise BadInputError(f"{_shown(source)}: nested too deeply to be a planner file: check the file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise BadInputError(f"{_shown(source)}: malformed YAML{where}: {getattr(exc, 'problem', exc)}") from None


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
