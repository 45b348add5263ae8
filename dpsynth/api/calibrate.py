"""`calibrate(...)`: the noise for a target (ε, δ), the ε of a given noise, or the most steps.

The sampling rate is `sampling_rate`, or `batch_size / dataset_size`; the length is `steps`, or
`epochs / q` rounded up. With `dataset`, the data set's earlier spends in the ledger are
composed in, and its budget cap (if any) gives the default δ and target ε.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpsynth.api.results import CalibrationResult
from dpsynth.errors import UsageError

DEFAULT_DELTA = 1e-5


def calibrate(
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    sampling_rate: float | None = None,
    batch_size: int | None = None,
    dataset_size: int | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    noise_multiplier: float | None = None,
    dataset: str | None = None,
    ledger: Path | str | None = None,
) -> CalibrationResult:
    """σ for a target ε (given `epsilon` and a length), the ε of a σ (given `noise_multiplier`
    and a length), or the most steps σ allows under ε (given both, no length).

    `ledger` is read only with `dataset` (default: $DPSYNTH_LEDGER, else
    ./dpsynth-ledger.jsonl); δ defaults to the data set's budget δ, else 1e-5. Every ε
    returned is the accountant's proven bound.
    """
    from dpsynth.privacy.accounting import calibration
    from dpsynth.privacy.accounting import compose as accounting

    q, n = _sampling_rate(sampling_rate, batch_size, dataset_size)
    length = _length(steps, epochs, q)
    prior: tuple[dict, ...] = ()
    budget_info: dict[str, Any] | None = None
    if dataset is not None:
        from dpsynth.ledger import Ledger, default_ledger_path

        book = Ledger(ledger if ledger is not None else default_ledger_path())
        prior = book.events_for(dataset)
        budget = book.budget_for(dataset)
        if budget is not None:
            if delta is None:
                delta = float(budget["delta"])
            if epsilon is None and noise_multiplier is None:
                epsilon = float(budget["epsilon"])
            spent = accounting.compose_epsilon(prior, float(budget["delta"])).epsilon
            budget_info = {
                "epsilon": float(budget["epsilon"]),
                "delta": float(budget["delta"]),
                "spent": spent,
                # Composition is not additive: the σ reported is what fits; this is a guide.
                "headroom": float(budget["epsilon"]) - spent,
            }
    delta = DEFAULT_DELTA if delta is None else delta
    warnings: list[str] = []
    if n is not None and delta >= 1.0 / n:
        # The text the command has always printed (it is part of its --json document).
        warnings.append(f"δ={delta:g} is not below 1/N = {1.0 / n:.3g}; use a smaller --delta")
    if epsilon is not None and noise_multiplier is not None:
        if length is not None:
            raise UsageError(
                "give at most two of {epsilon}, {noise_multiplier} and {steps}/{epochs}",
                parameters=("epsilon", "noise_multiplier", "steps", "epochs"),
            )
        result = calibration.max_steps(noise_multiplier, epsilon, delta, q, prior)
        mode = "max_steps"
    elif noise_multiplier is not None:
        if length is None:
            raise UsageError(
                "{noise_multiplier} needs {steps} or {epochs} (or {epsilon})",
                parameters=("noise_multiplier", "steps", "epochs", "epsilon"),
            )
        result = accounting.epsilon_report(noise_multiplier, delta, q, length, prior)
        mode = "epsilon"
    elif epsilon is not None:
        if length is None:
            raise UsageError(
                "{epsilon} needs {steps} or {epochs} (or {noise_multiplier})",
                parameters=("epsilon", "steps", "epochs", "noise_multiplier"),
            )
        result = calibration.calibrate_noise(epsilon, delta, q, length, prior)
        mode = "noise_multiplier"
    else:
        raise UsageError(
            "give {epsilon} (to find the noise) or {noise_multiplier} (to find ε)",
            parameters=("epsilon", "noise_multiplier"),
        )
    out = {"mode": mode, **result.to_json(), "dataset": dataset, "warnings": warnings}
    if budget_info is not None:
        out["budget"] = budget_info
    return CalibrationResult.from_summary(out, prior_events=len(prior))


def _sampling_rate(
    sampling_rate: float | None, batch_size: int | None, dataset_size: int | None
) -> tuple[float, int | None]:
    if sampling_rate is not None:
        if batch_size is not None:
            raise UsageError(
                "give either {sampling_rate} or {batch_size} with {dataset_size}",
                parameters=("sampling_rate", "batch_size", "dataset_size"),
            )
        return sampling_rate, dataset_size
    if batch_size is None or dataset_size is None:
        raise UsageError(
            "give {sampling_rate}, or {batch_size} together with {dataset_size}",
            parameters=("sampling_rate", "batch_size", "dataset_size"),
        )
    if dataset_size < 1 or batch_size < 1:
        raise UsageError(
            "{batch_size} and {dataset_size} must be positive",
            parameters=("batch_size", "dataset_size"),
        )
    if batch_size > dataset_size:
        raise UsageError(
            f"{{batch_size}} {batch_size} exceeds {{dataset_size}} {dataset_size} (q would be > 1)",
            parameters=("batch_size", "dataset_size"),
        )
    return batch_size / dataset_size, dataset_size


def _length(steps: int | None, epochs: float | None, q: float) -> int | None:
    if steps is not None and epochs is not None:
        raise UsageError(
            "give either {steps} or {epochs}, not both", parameters=("steps", "epochs")
        )
    if epochs is not None:
        if not (epochs > 0 and math.isfinite(epochs)):
            raise UsageError(f"{{epochs}} must be positive, got {epochs}", parameter="epochs")
        if not (0 < q <= 1):
            raise UsageError(f"the sampling rate must be in (0, 1], got {q}")
        return max(1, math.ceil(epochs / q - 1e-9))
    if steps is not None and steps < 1:
        raise UsageError(f"{{steps}} must be at least 1, got {steps}", parameter="steps")
    return steps
