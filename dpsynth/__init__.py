"""dpsynth: differentially private synthetic data release with a privacy ledger.

The Python API (docs/api.md): `train`, `sample`, `evaluate`, `calibrate`, `audit`, the
`Synthesizer` (DataFrame in, DataFrame out), the `Ledger`, the typed results and the errors.
They are imported on first use, so `import dpsynth` (and the CLI's start) does not pay for torch.

`evaluate` and `audit` share their names with subpackages (`dpsynth.evaluate.report`,
`dpsynth.audit.planned_audit`): `dpsynth.evaluate(...)` calls the API function, and attribute access
(`dpsynth.evaluate.report`) reaches the subpackage, so both keep working in any import order.
"""

from __future__ import annotations

import importlib
import sys
import types

from dpsynth import errors
from dpsynth.errors import (
    AnchorError,
    BudgetExceededError,
    DataError,
    DpsynthError,
    LedgerIntegrityError,
    MechanismFailure,
    RunConfigEditedError,
    UsageError,
)

TYPE_CHECKING = False  # `typing` costs more start-up than all of `import dpsynth` else
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.2.0"

# The API's names, resolved from dpsynth.api on first use.
_API = (
    "AuditResult",
    "CalibrationResult",
    "EvaluationReport",
    "Ledger",
    "PrivacySpend",
    "SampleResult",
    "Synthesizer",
    "TrainResult",
    "calibrate",
    "sample",
    "train",
)
# API functions named as a subpackage.
_SHARED = ("audit", "evaluate")

__all__ = [
    *_API,
    *_SHARED,
    "AnchorError",
    "BudgetExceededError",
    "DataError",
    "DpsynthError",
    "LedgerIntegrityError",
    "MechanismFailure",
    "RunConfigEditedError",
    "UsageError",
    "__version__",
    "errors",
]


class _SharedName:
    """The API function `dpsynth.<name>` when called; the subpackage `dpsynth.<name>` for
    attributes (its modules and names)."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def __wrapped__(self) -> Any:  # inspect.signature and help() follow it
        return getattr(importlib.import_module("dpsynth.api"), self._name)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self.__wrapped__.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        package = importlib.import_module(f"dpsynth.{self._name}")
        try:
            return getattr(package, attr)
        except AttributeError:  # a submodule not imported yet
            return importlib.import_module(f"dpsynth.{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<dpsynth.{self._name}: the API function, over the subpackage>"


class _Package(types.ModuleType):
    """The `dpsynth` module: importing the subpackage `dpsynth.evaluate` (or `audit`) does not
    replace the shared name (the subpackage stays in sys.modules and behind the name)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHARED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


audit = _SharedName("audit")
evaluate = _SharedName("evaluate")
sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    """The API's names, imported from `dpsynth.api` when first used."""
    if name not in _API:
        raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")
    value = getattr(importlib.import_module("dpsynth.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
