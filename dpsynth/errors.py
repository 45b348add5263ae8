"""Error classes of dpsynth and the exit code each maps to on the command line.

A library error that refers to a parameter of the call names it in its message as a
`{name}` placeholder and lists it in `parameters`: `str(error)` reads the Python name
(`epsilon must be positive`), and the CLI renders the same message with its flag
(`--epsilon must be positive`, see `dpsynth.cli.flags`). The library never names a flag.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `import dpsynth` stays cheap: no `typing` at start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


class DpsynthError(Exception):
    """Base class: an expected failure that the CLI reports as one line.

    `parameter` (one name) or `parameters` (several) are the call's parameters the message
    refers to, each written `{name}` in it; `parameter` is the first of them (None: none).
    """

    exit_code: int = 1

    def __init__(
        self,
        message: str = "",
        *args: object,
        parameter: str | None = None,
        parameters: Sequence[str] = (),
    ) -> None:
        names = tuple(parameters) if parameter is None else (parameter, *parameters)
        self.template = message
        self.parameters: tuple[str, ...] = names
        super().__init__(self.render(lambda name: name) if names else message, *args)

    @property
    def parameter(self) -> str | None:
        """The first parameter the message refers to (None when it names none)."""
        return self.parameters[0] if self.parameters else None

    def render(self, name_of: Callable[[str], str]) -> str:
        """The message with each `{name}` of `parameters` written as `name_of(name)`."""
        text = self.template
        for name in self.parameters:
            text = text.replace("{" + name + "}", name_of(name))
        return text


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
