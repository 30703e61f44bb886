"""Rendering for humans: rich tables. The only module that imports rich."""

from rich.console import Console


def console(*, stderr: bool = False) -> Console:
    """A console for CLI output (stderr for errors and progress)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)
