"""The public Python API of dpsynth: what a researcher imports (also as `from dpsynth import ...`).

- `train`, `sample`, `evaluate`, `calibrate`, `audit`: the commands' engines with keyword
  arguments named as their options, returning `TrainResult`, `SampleResult`,
  `EvaluationReport`, `CalibrationResult` and `AuditResult` (frozen dataclasses with
  `to_json()`).
- `Synthesizer`: DataFrame in, DataFrame out for tables (`Synthesizer.create("mst",
  epsilon=1.0).fit(frame, schema=...).sample(n)`), a data spec or path in and an `ImageBatch` out
  for images.
- `PrivacyEngine`: DP-SGD for a torch model of your own, Opacus-style (`make_private_with_epsilon`,
  `get_epsilon`), with the mechanisms and accountant every backend uses.
- `Ledger`: the privacy ledger (spends, budgets, verification).
- Errors are `dpsynth.errors` classes; one that refers to a parameter names it in
  `parameter` / `parameters`.

See docs/api.md. The modules import the engines (and torch) only when a function is called.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name → the module that defines it (imported on first use)
_WHERE = {
    "train": "dpsynth.api.pipeline",
    "train_request": "dpsynth.api.pipeline",
    "sample": "dpsynth.api.pipeline",
    "evaluate": "dpsynth.api.pipeline",
    "audit": "dpsynth.api.pipeline",
    "calibrate": "dpsynth.api.calibrate",
    "Synthesizer": "dpsynth.api.synthesizer",
    "PrivacySpend": "dpsynth.api.synthesizer",
    "ImageBatch": "dpsynth.api.results",
    "PrivacyEngine": "dpsynth.privacy.engine",
    "TrainResult": "dpsynth.api.results",
    "SampleResult": "dpsynth.api.results",
    "EvaluationReport": "dpsynth.api.results",
    "CalibrationResult": "dpsynth.api.results",
    "AuditResult": "dpsynth.auditing.planned_audit",
    "Ledger": "dpsynth.ledger",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (`import dpsynth` stays cheap)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
