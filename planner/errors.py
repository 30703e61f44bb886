"""User-facing errors. The CLI and the service map them to exit codes / HTTP statuses.

Every message names the field, the value and the fix, e.g.
`tp=3 must divide num_attention_heads=32: choose tp in {1, 2, 4, 8, 16, 32}`.
"""


class PlannerError(Exception):
    """Base class of every error we show a user without a traceback."""

    exit_code = 2


class BadInputError(PlannerError):
    """Input is malformed, unknown or inconsistent (exit code 2, HTTP 422)."""

    exit_code = 2


class InfeasibleError(PlannerError):
    """Input is valid but no configuration fits (exit code 1, HTTP 409).

    `closest` carries the best infeasible candidate's description and `shortfall_bytes` how far it is
    from fitting, so that callers can say what would make it fit.
    """

    exit_code = 1

    def __init__(self, message: str, *, closest: str | None = None, shortfall_bytes: int | None = None):
        super().__init__(message)
        self.closest = closest
        self.shortfall_bytes = shortfall_bytes


class SolverTimeoutError(PlannerError):
    """The search ran past its time limit without any feasible solution (exit code 1)."""

    exit_code = 1


class RegressionError(PlannerError):
    """`planner check` found a regression (exit code 1)."""

    exit_code = 1
