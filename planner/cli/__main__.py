"""`python -m planner.cli ...`: the `planner` command without the console script (tests, benchmarks)."""

from planner.cli import main

main()
