"""A checkpoint's manifest: every file's size and sha256 in `planner-step.json`, written last and atomically.

Why (issue 24): bytes flipped in a shard (same size) or stale shards copied in resumed silently with other losses;
a truncated or missing shard or a corrupt `.metadata` failed deep inside DCP with torchrun's 40-line dump naming no
file; a corrupt `planner-step.json` was a traceback. Now rank 0 lists the committed folder's files (DCP's shards and
`.metadata`, per-rank ZeRO-1 states) with their sizes and sha256 once every rank has written (a barrier), and writes
`planner-step.json` through a temporary file and rename as the folder's last file; the folder is renamed to `step-N`
after that, so a `step-N` folder without a valid manifest was never committed. `verify` re-reads everything before a
resume and names the first damaged file in one line (BadInputError, exit 2): missing, truncated or grown, changed
bytes, a file the manifest does not list (a stale shard copied in), an unreadable manifest. No torch import here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from planner.errors import BadInputError

STEP_FILE = "planner-step.json"
MANIFEST_VERSION = 1
CHUNK_BYTES = 1 << 20
FIX = "resume from an earlier step (remove this step-NNNNNN folder) or start without --resume"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_table(folder: Path) -> dict[str, dict]:
    """{relative path: {bytes, sha256}} of every file under `folder` except the manifest itself (sorted)."""
    table = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name in (STEP_FILE, f"{STEP_FILE}.tmp"):
            continue
        table[name] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    return table


def write_manifest(folder: Path, meta: dict) -> Path:
    """Write `meta` plus the file table as `folder/planner-step.json`, last and atomically (tmp, fsync, rename)."""
    body = {**meta, "manifest_version": MANIFEST_VERSION, "files": file_table(folder)}
    target, tmp = folder / STEP_FILE, folder / f"{STEP_FILE}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(body, sort_keys=True, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    return target


def read_manifest(folder: Path) -> dict:
    """The manifest of a committed folder, or a one-line BadInputError naming it when it is unreadable."""
    path = folder / STEP_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInputError(f"--resume: {path} is unreadable ({type(exc).__name__}: {str(exc)[:80]}): {FIX}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or not isinstance(data.get("step"), int):
        raise BadInputError(f"--resume: {path} is not a checkpoint manifest (no step or file checksums; written by an "
                            f"older planner or damaged): {FIX}")
    return data


def verify(folder: Path) -> dict:
    """The manifest after every listed file was found whole (size, then sha256) and no unlisted file is present."""
    data = read_manifest(folder)
    listed: dict = data["files"]
    for name, entry in sorted(listed.items()):
        path = folder / name
        if not isinstance(entry, dict) or not path.is_file():
            raise BadInputError(f"--resume: {path} is missing (the manifest lists it): {FIX}")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise BadInputError(f"--resume: {path} is {size} bytes, the manifest says {entry.get('bytes')} (truncated or "
                                f"overwritten): {FIX}")
        if sha256_of(path) != entry.get("sha256"):
            raise BadInputError(f"--resume: {path} does not match its sha256 in the manifest (its bytes changed, or a file "
                                f"from another checkpoint was copied in): {FIX}")
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {STEP_FILE}
    extra = sorted(present - set(listed))
    if extra:
        raise BadInputError(f"--resume: {folder / extra[0]} is not in the checkpoint's manifest (copied in from another "
                            f"checkpoint?): {FIX}")
    return data
