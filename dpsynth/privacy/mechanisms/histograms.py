"""Releasing a table's schema entries (category lists, numeric bounds) with DP: noisy histograms.

One Gaussian mechanism covers every column to release. Each row adds exactly 1 to one bin of
each column's histogram, so the concatenated histograms have L2 sensitivity √k for k columns
(add/remove adjacency); every bin gets N(0, s²) noise with s = σ·√k, σ the noise multiplier
of the ledger's `gaussian` event (sensitivity 1).

- Category lists (the candidate set is the data's own values, which are private): a value is
  released when its noisy count exceeds τ (the sparse-histogram / thresholding mechanism). A
  value present in only one of two neighbouring tables has count 1 there and is released with
  probability P(1 + N(0, s²) > τ) ≤ δ_c; the threshold τ = 1 + s·Φ⁻¹(1 − δ_c) is set so that
  the union over the categorical columns is δ_t = Σ δ_c, recorded as a `threshold_delta`
  event: the whole release is (ε, δ)-DP with ε computed at δ − δ_t (see
  `accounting.compose_epsilon`).
- Numeric bounds: a histogram over a public, data-independent grid of bins (0 and ±2^(j/2) for
  j = −20…80, with two overflow bins), every bin noised (no threshold δ: the domain is public).
  The lower bound is the lower edge of the first bin whose noisy count exceeds τ, the upper
  bound the upper edge of the last one: values in thinner tails are clipped later (a public
  rule). A column with no bin above τ gets no bounds (the caller decides and says so).

The counts are never released; only the selected categories and bin edges leave this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.stats import norm

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, ThresholdDelta

# Share of the run's δ given to the thresholding steps of the category release.
THRESHOLD_DELTA_SHARE = 0.1
_GRID_LIMIT_EXP = 80  # ±2^40


def numeric_bin_edges() -> np.ndarray:
    """The public bin edges for numeric bounds: −inf, −2^40 … −2^−10, 0, 2^−10 … 2^40, +inf."""
    positive = 2.0 ** (np.arange(-20, _GRID_LIMIT_EXP + 1) / 2.0)
    return np.concatenate([[-np.inf], -positive[::-1], [0.0], positive, [np.inf]])


def numeric_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of `values` in the bins [edges[i], edges[i+1]) (each value in exactly one bin)."""
    index = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)
    return np.bincount(index, minlength=len(edges) - 1).astype(np.float64)


def category_counts(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct values (sorted) and their counts (each row counted once)."""
    uniques, counts = np.unique(np.asarray(values, dtype=str), return_counts=True)
    return [str(u) for u in uniques], counts.astype(np.float64)


@dataclass(frozen=True)
class HistogramReleasePlan:
    """The noise and thresholds of one schema release, fixed before the data is read."""

    noise_multiplier: float
    noise_std: float
    threshold: float
    threshold_delta: float
    columns: int
    categorical_columns: int
    epsilon: float
    delta: float
    events: tuple[DpEvent, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mechanism": "gaussian noisy histograms (thresholded for category lists)",
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.noise_std,
            "threshold": self.threshold,
            "threshold_delta": self.threshold_delta,
            "columns": self.columns,
            "categorical_columns": self.categorical_columns,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": [e.to_json() for e in self.events],
        }


def plan_histogram_release(
    epsilon: float, delta: float, columns: int, categorical_columns: int, rounds: int = 1
) -> HistogramReleasePlan:
    """Calibrate the release of `columns` histograms (`categorical_columns` of them thresholded)
    so that it alone is (ε, δ)-DP; its events compose with everything else in the ledger.
    `rounds` > 1: as many rounds of histograms at the same noise multiplier (one `gaussian`
    event of that count; `dpsynth.privacy.releases.schema_release` uses the second)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"--schema-epsilon must be a positive number, got {epsilon}")
    if columns < 1:
        raise UsageError("--schema-epsilon: no schema entry to release")
    share = THRESHOLD_DELTA_SHARE * delta if categorical_columns else 0.0
    prior = (ThresholdDelta(share),) if categorical_columns else ()
    calibration = calibrate_noise(epsilon, delta, 1.0, rounds, prior_events=prior)
    sigma = calibration.noise_multiplier
    noise_std = sigma * math.sqrt(columns)
    per_column = share / categorical_columns if categorical_columns else delta
    threshold = 1.0 + noise_std * float(norm.isf(per_column))
    events = (*prior, Gaussian(sigma, rounds))
    return HistogramReleasePlan(
        noise_multiplier=sigma,
        noise_std=noise_std,
        threshold=threshold,
        threshold_delta=share,
        columns=columns,
        categorical_columns=categorical_columns,
        epsilon=calibration.total_epsilon,
        delta=delta,
        events=events,
    )


def noisy(counts: np.ndarray, noise_std: float, generator: torch.Generator) -> np.ndarray:
    """counts + N(0, noise_std²) per bin, from the run's secret generator."""
    noise = torch.randn(len(counts), generator=generator, dtype=torch.float64)
    return np.asarray(counts, dtype=np.float64) + noise_std * noise.numpy()


def release_schema_statistics(
    categorical: Mapping[str, np.ndarray],
    numeric: Mapping[str, np.ndarray],
    plan: HistogramReleasePlan,
    generator: torch.Generator,
) -> tuple[dict[str, list[str]], dict[str, tuple[float, float] | None]]:
    """The released category lists and numeric bounds (None: no bin cleared the threshold).

    `categorical` maps a column to its values (strings), `numeric` to its values (floats);
    together they must be the plan's columns. The ONLY code that reads the rows for a release.
    """
    if len(categorical) + len(numeric) != plan.columns or len(categorical) != (
        plan.categorical_columns
    ):
        raise ValueError("the columns differ from the release plan's")
    categories: dict[str, list[str]] = {}
    for name, values in categorical.items():
        candidates, counts = category_counts(values)
        kept = noisy(counts, plan.noise_std, generator) > plan.threshold
        categories[name] = [c for c, keep in zip(candidates, kept, strict=True) if keep]
    edges = numeric_bin_edges()
    bounds: dict[str, tuple[float, float] | None] = {}
    for name, values in numeric.items():
        above = np.flatnonzero(
            noisy(numeric_counts(np.asarray(values, np.float64), edges), plan.noise_std, generator)
            > plan.threshold
        )
        if len(above) == 0:
            bounds[name] = None
            continue
        limit = 2.0 ** (_GRID_LIMIT_EXP / 2.0)
        low = float(np.clip(edges[above[0]], -limit, limit))
        high = float(np.clip(edges[above[-1] + 1], -limit, limit))
        bounds[name] = (low, high)
    return categories, bounds


def released_columns(plan: HistogramReleasePlan, names: Sequence[str]) -> dict[str, Any]:
    """The ledger details of a release: which columns, and the plan's public parameters."""
    return {"columns": list(names), **plan.to_json()}


# --- Class proportions of the target, released with DP -----------------------------------
#
# The target's category list (the label set) is public, so its histogram needs no threshold:
# every class gets a bin, each row adds 1 to exactly one bin (L2 sensitivity 1, add/remove),
# and every bin gets N(0, σ²) noise, σ the noise multiplier of one `gaussian` event. The noisy
# counts are post-processed to proportions: negatives clipped to 0, normalised, each share
# raised to at least CLASS_WEIGHT_FLOOR (a class is never dropped), normalised again.

CLASS_WEIGHT_FLOOR = 1e-3


@dataclass(frozen=True)
class ClassWeightsPlan:
    """The noise of one release of the target's class proportions, fixed before the read."""

    noise_multiplier: float
    noise_std: float
    epsilon: float
    delta: float
    events: tuple[DpEvent, ...]
    # rows one privacy unit may hold: the histogram's L2 sensitivity (1: the unit is a row)
    sensitivity: float = 1.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mechanism": "gaussian noisy histogram of the target over its public classes",
            "sensitivity": self.sensitivity,
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.noise_std,
            "floor": CLASS_WEIGHT_FLOOR,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": [e.to_json() for e in self.events],
        }


def plan_class_weights_release(
    epsilon: float, delta: float, unit_rows: int = 1
) -> ClassWeightsPlan:
    """Calibrate the class-proportion release so that it alone is (ε, δ)-DP (sensitivity 1,
    or `unit_rows` K for a privacy unit of at most K rows: all of them may share one class);
    its `gaussian` event composes with everything else in the ledger."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"--class-weights-epsilon must be a positive number, got {epsilon}")
    calibration = calibrate_noise(epsilon, delta, 1.0, 1)
    sigma = calibration.noise_multiplier
    return ClassWeightsPlan(
        noise_multiplier=sigma,
        noise_std=sigma * unit_rows,  # one row (unit) moves one bin by 1 (by K)
        epsilon=calibration.total_epsilon,
        delta=delta,
        events=(Gaussian(sigma, 1),),
        sensitivity=float(unit_rows),
    )


def class_counts(labels: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    """Rows per public class (rows outside the list count nowhere), one bin per class."""
    values = np.asarray(labels, dtype=str)
    return np.array([np.count_nonzero(values == c) for c in classes], dtype=np.float64)


def proportions_from_counts(counts: np.ndarray, floor: float = CLASS_WEIGHT_FLOOR) -> np.ndarray:
    """Noisy counts → proportions (post-processing): clip at 0, normalise (uniform when nothing
    is left), raise every share to `floor`, normalise again."""
    clipped = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
    total = clipped.sum()
    shares = clipped / total if total > 0 else np.full(len(clipped), 1.0 / len(clipped))
    shares = np.maximum(shares, floor)
    return shares / shares.sum()


def release_class_weights(
    labels: np.ndarray,
    classes: Sequence[str],
    plan: ClassWeightsPlan,
    generator: torch.Generator,
) -> tuple[float, ...]:
    """The released class proportions (one per class, positive, summing to 1).

    The ONLY code that reads the target's rows for this release; the noisy counts never leave.
    """
    released = noisy(class_counts(labels, classes), plan.noise_std, generator)
    return tuple(float(w) for w in proportions_from_counts(released))
