"""Round 2's second look at the numbers round 1 found no range for.

A number whose values are too few, or spread too thin, for round 1's cuts (nhefs' year of
death: 19% of 1,303 rows in two bins of the range grid, against a noise of 73 rows a bin) has
no span for round 2 to count and no shape for round 3, so the precision the plan gave it in
those rounds would go unused, and the column would be written empty. Round 2 counts such a
number over the range grid again instead, at the span histogram's noise ([missing | zero |
range-grid bins…], the zeros then added back to their bin), and each cell's two readings are
combined by their variances: noise of `plan.second_look_noise_std`, 1.3 times less than round
1's at the default needs. The range is read off the combined counts by round 1's own rules
(`range_from_noisy`); round 3 then trims its padding, as round 2 trims the others'
(`kept_fine_bins`), and decides whether the column has values from every reading of its
missing cell.

Privacy: a row adds 1 to one cell of the histogram whichever public grid it is counted on, so
the column's part of round 2's sensitivity is the one the plan charged for its span histogram.
Which grid is counted depends only on round 1's noisy output, and each round's noise is fixed
before the data is read, so the rounds compose as the plan accounts them (adaptive
composition of Gaussian mechanisms). Combining the readings is post-processing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.privacy.mechanisms.histograms import noisy
from dpsynth.privacy.releases.schema_counts import ShapeCounts
from dpsynth.privacy.releases.schema_edges import zeros_in_place
from dpsynth.privacy.releases.schema_grids import range_grid
from dpsynth.privacy.releases.schema_plan import NumberSpec, SchemaReleasePlan
from dpsynth.privacy.releases.schema_ranges import RangeRelease, range_from_noisy
from dpsynth.privacy.releases.schema_spans import combined_reading


@dataclass(frozen=True)
class SecondLook:
    """A number's second look: its padded range and its range before padding (None: still
    nothing cleared), the combined noisy range-grid counts (without the missing cell), the
    combined noisy missing count, their noise std, and whether the range is the last
    resort's guess."""

    range: tuple[float, float] | None
    core: tuple[float, float] | None
    counts: np.ndarray
    missing: float
    noise_std: float
    guessed: bool = False


def second_look_grid(spec: NumberSpec) -> np.ndarray:
    """The public grid round 2 counts a number without a range on: round 1's range grid."""
    return range_grid(spec.kind)


def release_second_looks(
    counts: ShapeCounts,
    numbers: Mapping[str, NumberSpec],
    first: RangeRelease,
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, SecondLook]:
    """Round 2's second look from its exact counts (`counts.numbers[name]`: [missing, zero,
    bins of `second_look_grid`…]) for each number (in this order) that round 1 (`first`)
    found no range for."""
    std = plan.span_noise_std
    out: dict[str, SecondLook] = {}
    for name, spec in numbers.items():
        grid = second_look_grid(spec)
        released = noisy(counts.numbers[name], std, generator)
        # the zeros back in the bin [0, …) that round 1 counted them in (that bin reads two
        # cells' noise: a slightly noisier reading, not a biased one)
        bins = zeros_in_place(released[2:], grid, float(released[1]), spec.kind)
        again = np.concatenate([[released[0]], bins])
        before = np.concatenate([[first.missing[name]], first.range_counts[name]])
        both, _ = combined_reading(((before, plan.range_noise_std), (again, std)))
        combined_std = plan.second_look_noise_std  # the same combination, as the plan states it
        found, core, guessed = range_from_noisy(both, spec, plan, combined_std)
        out[name] = SecondLook(found, core, both[1:], float(both[0]), combined_std, guessed)
    return out
