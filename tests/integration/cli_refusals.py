"""The hostile tests' one assertion about a refused command: run the CLI in-process and find exit `code`, exactly one
`error:` line, no exception escaping, within `within_s`."""

from __future__ import annotations

import time

from typer.testing import CliRunner

from planner.cli import app


def refused(args: list[str], code: int = 2, within_s: float = 20.0) -> str:
    """Run the CLI in-process; assert exit `code`, exactly one `error:` line, no exception, in time; the line."""
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    elapsed = time.monotonic() - started
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert elapsed < within_s
    return lines[0]
