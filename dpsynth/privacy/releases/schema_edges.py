"""Round 2 of the DP schema release (`release_spans_from_counts`: each number's padded range
counted on a finer grid and its empty padding trimmed) and the post-processing of the noisy
histograms: where a fine histogram is trimmed, its quantile edges (snapped to the fine grid),
and the share of a column's values estimated beyond the released range. Nothing here reads
data; the exact counts come from `schema_counts`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from sklearn.isotonic import isotonic_regression

from dpsynth.privacy.mechanisms.histograms import noisy
from dpsynth.privacy.releases.schema_concentration import concentrated_span, fine_concentration
from dpsynth.privacy.releases.schema_counts import ShapeCounts, zero_counted
from dpsynth.privacy.releases.schema_grids import (
    closed_last_bin,
    coarser_than_unit,
    range_grid,
    value_unit,
)
from dpsynth.privacy.releases.schema_plan import NumberSpec, SchemaReleasePlan
from dpsynth.privacy.releases.schema_spans import (
    REACH_Z,
    SIGNIFICANCE,
    TRIM_SHARE,
    TRIM_Z,
    combined_reading,
    grown_span,
    significant_span,
)

# Round 2 trims an end's fine bins while their noisy mass is below TRIM_Z deviations of its
# noise and TRIM_SHARE of the column's present rows, never into the bins round 1's range holds
# grown outward over the fine bins beside it whose noisy mass (one, two or KEEP_WIDTHS[-1]
# bins together) clears TRIM_Z deviations.
KEEP_WIDTHS = (1, 2, 4)
# Round 2 trims inside round 1's range only when the noise over it is below this share of the
# values (a year of 2013 on 20,000 rows: yes; a column 20% present on 8,000: no), and a thin
# tail of TRIM_SHARE of the values over two fine bins clears REACH_Z deviations of their noise
# (`significant_span` keeps a tail only where it does: at loans' noise, 8,000 rows of a
# 40-number table at ε = 1, its counts and amounts lost 2–11% of their values in most releases;
# flights' 20,000 rows of 19 columns pass).
PRECISE_SHARE = 0.05
# Round 1's bins read for the clipped-share estimate beyond each end of a range.
BEYOND_BINS = 8


def trim_ends(
    counts: np.ndarray, std: float, present: float, keep: tuple[int, int] | None = None
) -> tuple[int, int] | None:
    """The first and last fine bins kept: each end's bins are trimmed while their noisy mass
    is below TRIM_Z deviations of its noise and TRIM_SHARE of `present` (the rows there are
    too few to tell from noise, and few enough to clip), never into the bins `keep` spans.
    None: nothing is left."""
    limit = TRIM_SHARE * max(present, 0.0)

    def trimmed(sequence: np.ndarray) -> int:
        mass = np.cumsum(sequence)
        k = np.arange(1, len(sequence) + 1)
        small = (mass < TRIM_Z * std * np.sqrt(k)) & (mass < limit)
        return int(np.argmin(small)) if not small.all() else len(sequence)

    first = trimmed(counts)
    if first >= len(counts) and keep is None:
        return None
    last = len(counts) - 1 - trimmed(counts[::-1])
    if keep is not None:
        first, last = min(first, keep[0]), max(last, keep[1])
    first = min(first, len(counts) - 1)
    return first, max(last, first)


def zeros_in_place(fine: np.ndarray, grid: np.ndarray, zeros: float, kind: str) -> np.ndarray:
    """The fine histogram with its exact zeros (counted apart, `zero_counted`) added back to
    the bin that holds 0, for reading where the values end (post-processing): counted apart,
    a fifth of the rows at 0 (nhefs' `exercise`, 0–2) left the bin [0, 1) empty, and the
    range was trimmed to 1–2."""
    if not zero_counted(kind, grid):
        return fine
    index = int(np.clip(np.searchsorted(grid, 0.0, side="right") - 1, 0, len(fine) - 1))
    out = fine.copy()
    out[index] += zeros
    return out


def monotone_cumulative(counts: np.ndarray) -> np.ndarray:
    """The share of the mass up to each edge of a noisy histogram ([0, …, 1], one more than
    the bins): the running sum of the noisy counts made non-decreasing by isotonic regression.
    Clipping each bin at 0 first would give every empty bin of a wide range a positive mass
    (about 0.4 deviations of noise each) and spread the quantiles over it; the running sum
    is unbiased, and its noise averages out over the bins (post-processing)."""
    running = np.concatenate([[0.0], np.cumsum(counts)])
    fitted = np.clip(isotonic_regression(running), 0.0, None)
    top = fitted[-1]
    if top <= 0:
        mass = np.clip(counts, 0.0, None)
        running = np.concatenate([[0.0], np.cumsum(mass)])
        return running / max(running[-1], 1e-12)
    return np.clip(fitted / top, 0.0, 1.0)


def edges_from_counts(
    counts: np.ndarray, grid: np.ndarray, bins: int, kind: str, span: tuple[int, int] | None
) -> tuple[float, ...] | None:
    """The quantile edges of a noisy histogram over `grid` inside `span` (post-processing),
    snapped to the grid's edges."""
    if span is not None:
        first, last = span
        counts, grid = counts[first : last + 1], grid[first : last + 2]
    mass = np.clip(counts, 0.0, None)
    total = mass.sum()
    if total <= 0:
        return None
    cumulative = monotone_cumulative(counts)
    # the outer edges are the released range (values beyond it are clipped into the end
    # bins and drawn across them: no pile-up on a bound); the inner ones the quantiles,
    # each at the grid edge where the cumulative mass first reaches it
    positions = np.searchsorted(cumulative, np.arange(1, bins) / bins, side="left")
    inner = grid[np.clip(positions, 1, len(grid) - 2)]
    # a fine bin holding a quantile bin's share alone is a bin of the model (a term of 36
    # months among 36 and 60 is not drawn across 32–36)
    heavy = np.flatnonzero(mass >= total / bins)
    edges = np.concatenate([[grid[0]], inner, grid[heavy], grid[heavy + 1], [grid[-1]]])
    if kind != "numeric":  # whole numbers, days, or seconds
        unit = 86400.0 if kind == "date" else 1.0
        edges = np.round(edges / unit) * unit
    edges = np.unique(edges)
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + (86400.0 if kind == "date" else 1.0)])
    if kind in ("integer", "date"):
        edges = closed_last_bin(edges, 86400.0 if kind == "date" else 1.0)
    return tuple(float(e) for e in edges)


@dataclass(frozen=True)
class Beyond:
    """Round 1's noisy mass in the grid bins beyond each end of a padded range, and how many
    bins (each of the range histogram's noise) each sum holds."""

    below: float
    above: float
    below_bins: int
    above_bins: int


def clipped_estimate(
    fine: np.ndarray,
    span: tuple[int, int],
    beyond: Beyond,
    total: float,
    std: float,
    range_std: float,
) -> tuple[float, float]:
    """The share of present values beyond the released range and its noise's deviation, from
    noisy counts (post-processing): the mass of the fine bins trimmed off (values beyond the
    padded range are counted in its end bins), read twice (their sum, and `total` less the
    kept bins: they share no cell, so they are independent, and are combined by their
    variances), plus round 1's mass beyond each end whose end bin is kept. Summed before the
    share is clipped to [0, 1] (clipping each part at 0 would bias it upwards). The single
    sum of sixteen bins of round 1's noise this replaces said 100% of nhefs' incomes where
    13% were clipped."""
    first, last = span
    trimmed_bins = first + len(fine) - 1 - last
    mass, variance = 0.0, 0.0
    if trimmed_bins:
        far = float(fine[:first].sum()) + float(fine[last + 1 :].sum())
        near = total - float(fine[first : last + 1].sum())
        mass, deviation = combined_reading(
            ((far, std * math.sqrt(trimmed_bins)), (near, std * math.sqrt(last - first + 2)))
        )
        variance = deviation**2
    if first == 0:
        mass += beyond.below
        variance += beyond.below_bins * range_std**2
    if last == len(fine) - 1:
        mass += beyond.above
        variance += beyond.above_bins * range_std**2
    rows = max(total, 1.0)
    return float(min(max(mass, 0.0) / rows, 1.0)), float(math.sqrt(variance) / rows)


@dataclass(frozen=True, eq=False)
class ClipReading:
    """The noisy counts a number's clipped share is read from (`clipped_estimate`): its padded
    range's fine histogram over `grid` (zeros in their bin), round 1's mass beyond that range,
    N less the noisy missing count, and the noises (post-processing only)."""

    fine: np.ndarray
    grid: np.ndarray
    beyond: Beyond
    total: float
    std: float
    range_std: float
    unit: float = 0.0  # whole numbers and days: a range's last value ends its bin one unit on

    def share(self, low: float, high: float) -> tuple[float, float]:
        """The share of present values estimated beyond [low, high] and its deviation (a
        fine bin that [low, high] reaches into counts as kept)."""
        last_bin = len(self.grid) - 2
        first = int(np.clip(np.searchsorted(self.grid, low, side="right") - 1, 0, last_bin))
        last = np.searchsorted(self.grid, high + self.unit, side="left") - 1
        span = (first, int(np.clip(last, first, last_bin)))
        return clipped_estimate(self.fine, span, self.beyond, self.total, self.std, self.range_std)


def beyond_range(noisy_range: np.ndarray, kind: str, span: tuple[float, float]) -> Beyond:
    """Round 1's noisy mass in the BEYOND_BINS grid bins beyond each end of `span` (an
    estimate of the values clipped there: far bins are noise only)."""
    edges = range_grid(kind)
    first = int(np.searchsorted(edges, span[0], side="right")) - 1
    last = int(np.searchsorted(edges, span[1], side="left")) - 1
    reach = BEYOND_BINS
    below = noisy_range[max(first - reach, 0) : max(first, 0)]
    above = noisy_range[last + 1 : last + 1 + reach]
    return Beyond(float(below.sum()), float(above.sum()), len(below), len(above))


def kept_fine_bins(
    fine: np.ndarray,
    grid: np.ndarray,
    spec: NumberSpec,
    std: float,
    total: float,
    core: tuple[float, float] | None,
    fine_core: bool = False,
) -> tuple[int, int, bool, bool]:
    """The first and last fine bins a padded range keeps (its empty padding trimmed), read off
    its noisy fine histogram with the zeros in their bin (`zeros_in_place`; post-processing),
    whether its whole numbers were `concentrated` in a bin or two coarser than their unit,
    and whether they are `few` there (round 3 counts them finely; with `fine_core`, a spread
    of decades is not few: `fine_concentration`).
    `total`: N less the noisy missing count; `core`: the range before padding (kept whole only
    when the noise leaves nothing; None: unknown, the ends may be trimmed to any bin);
    `fine_core`: `grid` is round 2's FINE_CORE_BINS even bins (`fine_concentration`)."""
    present = float(max(fine.sum(), 1.0))
    last_bin = len(grid) - 2
    if core is None:
        first, last = trim_ends(fine, std, present) or (0, last_bin)
    else:
        keep = (
            int(np.clip(np.searchsorted(grid, core[0], side="right") - 1, 0, last_bin)),
            int(np.clip(np.searchsorted(grid, core[1], side="left") - 1, 0, last_bin)),
        )
        # inside round 1's range (√2 bins: too wide to keep whole for a year of 2013) only
        # when the noise over it is below PRECISE_SHARE of the values and a thin tail can
        # clear it; else the padding alone (the noise of a sparse column would trim its thin
        # tails)
        quiet = std * math.sqrt(keep[1] - keep[0] + 1) < PRECISE_SHARE * present
        precise = quiet and TRIM_SHARE * present >= REACH_Z * std * math.sqrt(2)
        if precise or spec.kind in ("datetime", "date"):  # a time rarely trails off thinly
            first, last = significant_span(fine, std, present) or keep
            return first, last, False, False
        # read from the kept bins outward: ames' 4 bedrooms (15% of houses, one fine bin
        # beside the 2 and 3 of round 1's core) were trimmed in one release of four by a sum
        # read inward from the range's far end, whose noise over a dozen empty bins
        # outweighed them
        keep = grown_span(fine, keep, std, TRIM_Z, KEEP_WIDTHS)
        first, last = trim_ends(fine, std, present, keep) or keep
    # whole numbers binned coarser than their unit (years on a grid of 122): N less the noisy
    # missing count has one cell's noise, the fine bins' sum all of theirs
    if spec.kind == "integer" and coarser_than_unit(grid):
        if fine_core:
            found = fine_concentration(fine, grid, std, total, core or (grid[0], grid[-1]))
            if found is not None:
                return found[0], found[1], True, found[2]
        else:
            held = concentrated_span(fine, std, total, core or (float(grid[0]), float(grid[-1])))
            if held is not None:
                return held[0], held[1], True, True
    return first, last, False, False


def released_bounds(
    grid: np.ndarray, span: tuple[int, int], spec: NumberSpec, zeros: bool
) -> tuple[float, float]:
    """The range the fine bins `span` cover (whole numbers and days: a bin [a, b) ends at b
    less one unit), with 0 inside when the noisy zero count is significant (`zeros`)."""
    first, last = span
    low, high = float(grid[first]), float(grid[last + 1])
    unit = value_unit(spec.kind)
    if unit:
        high = max(high - unit, low)
    if zero_counted(spec.kind, grid) and zeros:
        low, high = min(low, 0.0), max(high, 0.0)  # zeros stay inside the range
    return low, high


@dataclass(frozen=True)
class ReleasedSpan:
    """Round 2's output for a number: its range with the empty padding trimmed, the share of
    its values estimated beyond that range (rounds 1 and 2, noisy counts), whether its whole
    numbers were found in a bin or two coarser than their unit (`concentrated_span`: round 3
    counts them finer), and the histogram's noisy missing count."""

    span: tuple[float, float]
    clipped: float
    concentrated: bool = False
    clipped_deviation: float = 0.0
    missing: float = 0.0
    # its concentrated whole numbers are few (`kept_fine_bins`): round 3 counts them finely
    few: bool = True
    # the counts its clipped share is read from, for a range round 3 reaches past the span
    reading: ClipReading | None = None


class SpanRequest(NamedTuple):
    """What round 2 counts for a number: its spec, the grid over its padded range
    (`shape_grid`), round 1's estimate of its mass beyond that range, its range before
    padding (`kept_fine_bins`), and whether the grid is FINE_CORE_BINS even bins
    (`fine_concentration`)."""

    spec: NumberSpec
    grid: np.ndarray
    beyond: Beyond
    core: tuple[float, float] | None
    fine_core: bool = False


def release_spans_from_counts(
    counts: ShapeCounts,
    numbers: Mapping[str, SpanRequest],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, ReleasedSpan]:
    """Round 2 from its exact counts: per number (in this order) its `SpanRequest`."""
    std = plan.span_noise_std
    out: dict[str, ReleasedSpan] = {}
    for name, (spec, grid, outside, core, fine_core) in numbers.items():
        released = noisy(counts.numbers[name], std, generator)
        fine = zeros_in_place(released[2:], grid, float(released[1]), spec.kind)
        total = plan.rows - float(released[0])  # N less the noisy missing count
        first, last, concentrated, few = kept_fine_bins(
            fine, grid, spec, std, total, core, fine_core
        )
        zeros = bool(released[1] > SIGNIFICANCE * std)
        share, deviation = clipped_estimate(
            fine, (first, last), outside, total, std, plan.range_noise_std
        )
        out[name] = ReleasedSpan(
            released_bounds(grid, (first, last), spec, zeros),
            share,
            concentrated,
            deviation,
            float(released[0]),
            few,
            ClipReading(
                fine,
                grid,
                outside,
                total,
                std,
                plan.range_noise_std,
                value_unit(spec.kind),
            ),
        )
    return out
