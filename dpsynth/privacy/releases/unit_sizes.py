"""How many rows a privacy unit holds, released with DP, so that synthetic people have several
rows as real ones do.

After contribution bounding every unit holds 1 … K rows. The histogram over those K sizes has
L2 sensitivity 1 under the unit-level neighbour relation (adding or removing a unit moves one
bin by 1), so one Gaussian mechanism with noise std σ (the noise multiplier of one `gaussian`
event) releases it. The noisy counts are post-processed to shares: negatives clipped to 0,
normalised, each share raised to at least `SIZE_SHARE_FLOOR`, normalised again. Only the
shares leave this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.events import Gaussian
from dpsynth.privacy.mechanisms.histograms import noisy, proportions_from_counts

# The default share of --epsilon for this release when a privacy unit is given.
UNIT_SIZES_SHARE = 0.05
SIZE_SHARE_FLOOR = 1e-3


@dataclass(frozen=True)
class UnitSizesPlan:
    """The noise of the release of rows per unit (1 … max_rows), fixed before the read."""

    max_rows: int
    noise_multiplier: float
    epsilon: float
    delta: float
    events: tuple[Gaussian, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mechanism": "gaussian noisy histogram of rows per unit (sensitivity 1 per unit)",
            "max_rows_per_unit": self.max_rows,
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.noise_multiplier,
            "floor": SIZE_SHARE_FLOOR,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": [e.to_json() for e in self.events],
        }


def plan_unit_sizes_release(epsilon: float, delta: float, max_rows: int) -> UnitSizesPlan:
    """Calibrate the release so that it alone is (ε, δ)-DP per unit."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"the rows-per-unit release needs a positive ε, got {epsilon}")
    calibration = calibrate_noise(epsilon, delta, 1.0, 1)
    sigma = calibration.noise_multiplier
    return UnitSizesPlan(
        max_rows=int(max_rows),
        noise_multiplier=sigma,
        epsilon=calibration.total_epsilon,
        delta=delta,
        events=(Gaussian(sigma, 1, annotations={"mechanism": "unit_sizes"}),),
    )


def size_counts(sizes: np.ndarray, max_rows: int) -> np.ndarray:
    """Units holding 1, 2, …, max_rows rows (bin k − 1 counts the units with k rows)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) and (sizes.min() < 1 or sizes.max() > max_rows):
        raise ValueError("a unit's size lies outside 1 … max_rows: bound the rows first")
    return np.bincount(sizes - 1, minlength=max_rows).astype(np.float64)


def release_unit_sizes(
    sizes: np.ndarray, plan: UnitSizesPlan, generator: torch.Generator
) -> tuple[float, ...]:
    """The released share of units holding 1 … max_rows rows. `sizes`: each unit's row
    count after bounding. The ONLY code that reads them for this release."""
    released = noisy(size_counts(sizes, plan.max_rows), plan.noise_multiplier, generator)
    # clipped at 0, normalised, floored, normalised again (post-processing), as class weights
    return tuple(float(s) for s in proportions_from_counts(released, SIZE_SHARE_FLOOR))
