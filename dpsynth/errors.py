"""Error classes of dpsynth and the exit code each maps to on the command line."""

from __future__ import annotations


class DpsynthError(Exception):
    """Base class: an expected failure that the CLI reports as one line."""

    exit_code: int = 1


class UsageError(DpsynthError):
    """Invalid flags or values given by the user (exit 2)."""

    exit_code = 2


class AnchorError(UsageError):
    """A run's anchor does not match the ledger, or its plan its events (exit 2): the wrong
    ledger, or an edited run."""


class BudgetExceededError(DpsynthError):
    """The privacy budget cap for a dataset would be exceeded (exit 3)."""

    exit_code = 3


class DataError(DpsynthError):
    """Unreadable or malformed data (exit 4)."""

    exit_code = 4


class MechanismFailure(DpsynthError):
    """A DP mechanism cannot go on with the run's values (e.g. a noise covariance that no
    jitter makes positive definite). The failure is deterministic, a resume would meet it
    again, so the training loop closes the run's spend as aborted (exit 1)."""


class LedgerIntegrityError(DpsynthError):
    """The ledger file was edited, truncated or reordered (exit 1)."""

    exit_code = 1


class RunConfigEditedError(DataError):
    """config.json no longer matches the configuration its spend was reserved for (exit 4)."""
