"""dpsynth: differentially private synthetic data release with a privacy ledger.

The Python API (docs/api.md): `train`, `sample`, `evaluate`, `calibrate`, `audit`, the
`Synthesizer` (DataFrame in, DataFrame out), the `PrivacyEngine` (DP-SGD for your own model), the
`Ledger`, the typed results and the errors.
They are the names of `dpsynth.api`, imported on first use (a PEP 562 module `__getattr__`), so
`import dpsynth` (and the CLI's start) does not pay for torch. The code behind `evaluate` and
`audit` is in the subpackages `dpsynth.evaluation` and `dpsynth.auditing`.
"""

from __future__ import annotations

import importlib

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
    "ImageBatch",
    "Ledger",
    "PrivacyEngine",
    "PrivacySpend",
    "SampleResult",
    "Synthesizer",
    "TrainResult",
    "audit",
    "calibrate",
    "evaluate",
    "sample",
    "train",
)

__all__ = [
    *_API,
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


def __getattr__(name: str) -> Any:
    """The API's names, imported from `dpsynth.api` when first used."""
    if name not in _API:
        raise AttributeError(f"module 'dpsynth' has no attribute {name!r}")
    value = getattr(importlib.import_module("dpsynth.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
