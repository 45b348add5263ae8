"""What a planned DP schema release can resolve, from public facts only.

A category value must hold about `category_threshold` rows to be kept, and a number's range
needs about `range_cut` rows in one bin of its public grid at the noise of round 2's second
look, the last chance a number round 1 missed gets (even odds at those counts; see
`dpsynth.privacy.releases.schema_release`). `train` refuses a release whose needs exceed a
share of the rows, and names the ε at which they would not (`epsilon_for_reach`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dpsynth.privacy.releases.schema_plan import (
    NumberSpec,
    SchemaReleasePlan,
    plan_schema_release,
)


@dataclass(frozen=True)
class ReleaseReach:
    """What a planned release can resolve, from public facts: the rows a category value needs
    to clear the threshold and a number's range grid bin needs to clear its cut (about even
    odds at those counts; None: no column of that kind is released)."""

    category_rows: float | None
    range_rows: float | None

    def worst(self) -> float:
        """The larger of the two (0 when nothing is released)."""
        return max((r for r in (self.category_rows, self.range_rows) if r is not None), default=0)


def release_reach(
    plan: SchemaReleasePlan, categorical: int, numbers: Mapping[str, NumberSpec]
) -> ReleaseReach:
    """The counts `plan` needs a category value and a range bin to hold (`ReleaseReach`)."""
    return ReleaseReach(
        plan.category_threshold if categorical else None,
        max(
            (
                plan.range_cut(spec.kind, std=plan.second_look_noise_std)
                for spec in numbers.values()
            ),
            default=None,
        ),
    )


def epsilon_for_reach(
    rows_needed: float,
    delta: float,
    rows: int,
    categorical: int,
    numbers: Mapping[str, NumberSpec],
    booleans: int,
    unit_rows: int = 1,
    target: bool = False,
) -> float:
    """The smallest ε (to 2%) at which the release of these columns needs no more than
    `rows_needed` rows in a category value or a range bin (public facts only; `unit_rows` and
    `target` as in `plan_schema_release`)."""

    def reach(epsilon: float) -> float:
        plan = plan_schema_release(
            epsilon, delta, rows, categorical, numbers, booleans, unit_rows, target
        )
        return release_reach(plan, categorical, numbers).worst()

    low, high = 1e-3, 1e3
    if reach(high) > rows_needed:
        return math.inf
    while high / low > 1.02:  # the reach falls as ε grows
        middle = math.sqrt(low * high)
        low, high = (low, middle) if reach(middle) <= rows_needed else (middle, high)
    return high
