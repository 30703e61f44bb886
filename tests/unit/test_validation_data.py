"""The validation data the tests and benchmarks read lives in the repository (validation/), copied from the
workplace's shared folder, so a clone anywhere passes its tests; where both exist they must be the same bytes."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPY = ROOT / "validation"
SHARED = ROOT.parent / "shared" / "validation"
FILES = ("README.md", "published_runs.json", "h100_hf_tinyllama.jsonl", "h100_executor_runs.json")


@pytest.mark.parametrize("name", FILES)
def test_the_repository_holds_the_validation_file(name: str) -> None:
    assert (COPY / name).is_file(), f"validation/{name} is missing: copy it from ../shared/validation"


@pytest.mark.parametrize("name", FILES)
def test_the_copy_equals_the_shared_file_where_both_exist(name: str) -> None:
    shared = SHARED / name
    if not shared.is_file():
        pytest.skip("no ../shared/validation beside this clone: the repository's copy is the only one")
    assert (COPY / name).read_bytes() == shared.read_bytes(), (
        f"validation/{name} differs from ../shared/validation/{name}: copy the shared file again"
    )
