"""calibration.yaml `memory` entries from a GPU run of benchmarks/gpu_memory_allocator.py (no GPU needed here).

The rule is today's (planner/cost/calibration.yaml `memory`, tests/unit/test_cost_memory_bounds.py): the fixed part
stays the default entry's (1 GiB), and an allocator setting's fraction is the one-sided envelope of its rows,
max over the rows of (peak_reserved - fixed) / peak_allocated - 1, rounded up to 3 places (0 where reserved never
passes allocated + fixed), so allocated * (1 + fraction) + fixed covers every measured reserved peak. Here the
denominator is the measured allocated peak (the allocator's own overhead; the cost model's allocated prediction is
checked against measurements elsewhere). Rows that did not run ("oom", "error") are left out and listed.

`--write` writes the expandable_segments entry from its rows and raises (never lowers) the default entry's fraction
to its rows' envelope: the default's other evidence (validation/h100_hf_tinyllama.jsonl) stays covered. Refused in
one line (exit 2): a file without CUDA statistics (a --device cpu run), a setting without rows, or expandable rows
whose allocator snapshot shows no expandable segment (the variable did not take effect).

    python benchmarks/allocator_constants.py profiles/memory-allocator-h100.json [--write]
    (the same as python benchmarks/gpu_memory_allocator.py --derive FILE [--write])
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "planner" / "cost" / "calibration.yaml"
GiB = 2**30


class Refused(Exception):
    """Bad input: one line naming the field, the value and the fix."""


def needed_fraction(row: dict, fixed_bytes: int) -> float:
    """The fraction this row needs: (peak_reserved - fixed) / peak_allocated - 1, at least 0."""
    return max(0.0, (row["peak_reserved_bytes"] - fixed_bytes) / row["peak_allocated_bytes"] - 1)


def envelope(rows: list[dict], fixed_bytes: int) -> float:
    """The smallest 3-place fraction at or above every row's need."""
    return math.ceil(max(needed_fraction(r, fixed_bytes) for r in rows) * 1000 - 1e-9) / 1000


def derive(results: dict, fixed_bytes: int) -> dict[str, dict]:
    """Per allocator setting: its fraction, the rows it came from, the row that set it; Refused on bad input."""
    rows = results.get("rows")
    if not isinstance(rows, list) or not rows:
        raise Refused("rows: missing or empty: pass the JSON that benchmarks/gpu_memory_allocator.py -o wrote")
    ok = [r for r in rows if r.get("status") == "ok"]
    cpu = [r for r in ok if r.get("peak_allocated_bytes") is None or r.get("quick")]
    if cpu:
        raise Refused(f"rows[case={cpu[0].get('case')!r}]: no CUDA statistics (a --device cpu or --quick run): "
                      "run benchmarks/gpu_memory_allocator.py on a GPU")
    out = {}
    for setting in sorted({r.get("allocator") for r in rows}):
        mine = [r for r in ok if r["allocator"] == setting]
        left = [f"{r.get('case')}: {r.get('status')}" for r in rows if r.get("allocator") == setting and r not in mine]
        if not mine:
            raise Refused(f"allocator={setting!r}: no row ran ({'; '.join(left)}): rerun the GPU script")
        if setting == "expandable_segments" and not all(r.get("expandable_segments_seen") for r in mine):
            raise Refused("expandable_segments_seen: false or unknown in a row of allocator='expandable_segments': "
                          "the variable did not take effect before CUDA initialised; fix the launch and rerun")
        worst = max(mine, key=lambda r: needed_fraction(r, fixed_bytes))
        out[setting] = {"fraction": envelope(mine, fixed_bytes), "rows": len(mine), "left_out": left,
                        "worst": worst["case"], "needs": {r["case"]: needed_fraction(r, fixed_bytes) for r in mine}}
    return out


def entries_to_write(derived: dict, current: dict, source_file: str, device: str) -> dict[str, dict]:
    """The calibration.yaml memory entries --write sets: expandable_segments from its rows; default raised only."""
    fixed = int(current["default"]["fragmentation_fixed_bytes"])
    out = {}
    if "expandable_segments" in derived:
        d = derived["expandable_segments"]
        out["expandable_segments"] = {
            "fragmentation_fixed_bytes": fixed, "fragmentation_fraction": d["fraction"],
            "source": f"measured: envelope of {d['rows']} rows of {source_file} ({device}; benchmarks/allocator_constants.py)"}
    if "default" in derived and derived["default"]["fraction"] > float(current["default"]["fragmentation_fraction"]):
        d = derived["default"]
        out["default"] = {"fragmentation_fixed_bytes": fixed, "fragmentation_fraction": d["fraction"],
                          "source": f"measured: envelope of validation/h100_hf_tinyllama.jsonl and {source_file} ({device})"}
    return out


def rewrite(text: str, name: str, entry: dict) -> str:
    """calibration.yaml's text with memory.<name>'s three values replaced (comments and order kept)."""
    start = text.index("\nmemory:\n")
    block = re.search(rf"\n  {re.escape(name)}:\n((?:    .*\n|\s*#.*\n)+)", text[start:])
    if block is None:
        raise Refused(f"memory.{name}: no such entry in {CALIBRATION.name}: add it by hand first")
    body = block.group(1)
    body = re.sub(r"(    fragmentation_fixed_bytes: ).*", rf"\g<1>{entry['fragmentation_fixed_bytes']}", body, count=1)
    body = re.sub(r"(    fragmentation_fraction: ).*", rf"\g<1>{entry['fragmentation_fraction']}", body, count=1)
    body = re.sub(r"(    source: ).*", lambda m: m.group(1) + json.dumps(entry["source"]), body, count=1)
    a, b = start + block.start(1), start + block.end(1)
    return text[:a] + body + text[b:]


def report(derived: dict, fixed_bytes: int, current: dict) -> list[str]:
    lines = [f"allocator allowance: fraction = max over rows of (peak_reserved - {fixed_bytes / GiB:g} GiB) / "
             "peak_allocated - 1, rounded up"]
    for setting, d in derived.items():
        needs = ", ".join(f"{case} {value:.4f}" for case, value in d["needs"].items())
        now = current.get(setting, {}).get("fragmentation_fraction")
        lines.append(f"  {setting}: {d['fraction']:.3f} over {d['rows']} rows (worst {d['worst']}; now {now}): {needs}"
                     + (f"; left out: {'; '.join(d['left_out'])}" if d["left_out"] else ""))
    if "default" in derived and derived["default"]["fraction"] < float(current["default"]["fragmentation_fraction"]) / 2:
        lines.append("  note: this workload fragments the default allocator less than half as much as the tinyllama "
                     "rows do: its expandable_segments figure may not carry over to such workloads")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--write", action="store_true", help="write the entries into calibration.yaml")
    parser.add_argument("--calibration", type=Path, default=CALIBRATION, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        try:
            results = json.loads(args.results.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise Refused(f"{args.results}: not a readable JSON results file ({exc.__class__.__name__}): "
                          "pass the file benchmarks/gpu_memory_allocator.py -o wrote") from None
        text = args.calibration.read_text(encoding="utf-8")
        current = yaml.safe_load(text)["memory"]
        fixed = int(current["default"]["fragmentation_fixed_bytes"])
        derived = derive(results, fixed)
        print("\n".join(report(derived, fixed, current)))
        updates = entries_to_write(derived, current, repo_relative(args.results), str(results.get("device", "?")))
        for name, entry in updates.items():
            print(f"memory.{name}: fragmentation_fraction {entry['fragmentation_fraction']} "
                  f"({'written' if args.write else 'pass --write to write it'})")
            text = rewrite(text, name, entry)
    except Refused as exc:
        print(f"allocator_constants: {exc}", file=sys.stderr)
        return 2
    if args.write and updates:
        from planner.io import atomic_write_text

        atomic_write_text(args.calibration, text)
    return 0


def repo_relative(path: Path) -> str:
    """The results file as the repository names it (no machine path in calibration.yaml)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


if __name__ == "__main__":
    sys.exit(main())
