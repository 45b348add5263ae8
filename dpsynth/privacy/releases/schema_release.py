"""Releasing a table's schema with DP: category lists, bounds, bin edges, missing flags, precision.

Three rounds of Gaussian noisy histograms, planned by `dpsynth.privacy.releases.schema_plan`
(which shares the precision among the columns by need) and counted by
`dpsynth.privacy.releases.schema_counts` (exact counts, chunk by chunk, on any engine):

1. **Ranges** (`release_ranges_from_counts`): category lists by a thresholded histogram over the
   data's own values (the `threshold_delta` event: a value in one table only is released with
   probability ≤ its share of δ; the noisy counts of the kept values are released too, as the
   thresholded Gaussian mechanism allows), and the rough range of each number over a public grid
   (0 and ±2^(j/2); for dates and times the calendar years 1900–2100): the bins whose noisy count
   clears a false-alarm cut (`supported_bins`), joined with wider windows that clear it
   (`coarse_span`), extended outward while the next RANGE_WINDOW bins together hold a
   significant count, then padded by RANGE_PAD bins each side: a range errs wide (round 2 trims
   what is empty), since every value beyond it is clipped; a column no window shows but whose
   noisy present count (N less its missing cell) is large gets its fullest wide window.
2. **Spans** (`schema_edges.release_spans_from_counts`): each padded range counted on a finer
   grid and trimmed where it is empty; the share of values beyond it estimated from the noisy
   counts of rounds 1 and 2 (`clipped`, no new read).
3. **Shapes** (`release_shapes_from_counts`), inside those spans, for each number or time: one
   histogram over [missing | exactly zero (numbers whose range holds 0) | fine bins], a public
   grid (linear, or geometric for a positive range spanning orders of magnitude; whole numbers
   for integers and days for dates), and for a float column a second over its decimals. For a
   boolean one histogram over [false | true | missing]. From the noisy counts, post-processing:
   - `edges`: the quantiles 1/K, …, (K−1)/K of the noisy fine histogram, snapped to the fine
     grid's edges (so the model's 1-way marginal is a sum of these fine bins,
     `ReleasedShape.counts`), a fine bin holding a quantile bin's share a bin of its own; an
     exact zero holding at least 1/K of the rows becomes a point mass (the edge 0 twice);
   - `empty`: the values' noisy count is within the noise (the column is written empty);
   - `missing`: the missing bin's noisy count clears `MISSING_SIGNIFICANCE` deviations;
   - `decimals`: the most digits whose noisy count clears a false-alarm cut
     (`released_decimals`).

What leaves this module is the released entries and noisy counts, never an exact count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

from dpsynth.privacy.mechanisms.histograms import noisy
from dpsynth.privacy.releases.schema_counts import (
    MAX_DECIMALS,
    RangeCounts,
    ShapeCounts,
    boolean_counts,
    decimal_counts,
    range_counts,
    shape_counts,
    tallies_of,
    zero_counted,
)
from dpsynth.privacy.releases.schema_edges import (
    SIGNIFICANCE,
    edges_from_counts,
    trim_ends,
)
from dpsynth.privacy.releases.schema_grids import (
    FINE_BINS,
    fine_grid,
    range_grid,
    with_atom,
)
from dpsynth.privacy.releases.schema_plan import (
    NumberSpec,
    SchemaReleasePlan,
    plan_schema_release,
    quantile_bins,
)
from dpsynth.privacy.releases.schema_spans import (
    FALSE_ALARM,
    FALSE_ALONE,
    coarse_span,
    supported_bins,
)

__all__ = ["MAX_DECIMALS", "NumberSpec", "ReleasedShape", "SchemaReleasePlan"]
__all__ += ["plan_schema_release", "quantile_bins", "release_ranges", "release_shapes"]

# An exact zero is a point mass when its noisy count clears this many deviations (precision:
# `released_decimals`); a missing bin when it clears MISSING_SIGNIFICANCE (a bin too many only
# costs a value the model learns to be nearly empty; one too few encodes the missing cells at
# mid-range).
MISSING_SIGNIFICANCE = 1.5
# A number's present values (N less its noisy missing count) must clear PRESENT_SIGNIFICANCE
# deviations of the noise.
PRESENT_SIGNIFICANCE = 3.0
# Fine bins of the shape histogram (the quantiles are read off it): as many as keep about
# FINE_BIN_DEVIATIONS noise deviations of rows in a bin on average, within [8, FINE_BINS].
FINE_BIN_DEVIATIONS = 8.0
INTEGER_FINE_BINS = 128
_GRID_LIMIT = 2.0**40
# Round 1 extends a range while the next RANGE_WINDOW bins' noisy sum clears RANGE_Z
# deviations of that sum, then pads RANGE_PAD bins each side (a factor of 2 on the numbers'
# grid, a year on the calendar's).
RANGE_WINDOW, RANGE_Z, RANGE_PAD = 4, 3.0, 2
# A non-negative range whose high end is WIDE_RANGE times its low end reaches down to 0.
WIDE_RANGE = 16.0
# Window widths that look for a tail apart from a range already found (narrow: a window's
# span reaches past its rows by up to its width).
_TAIL_WIDTHS = (2, 4, 8)
# The last resort of a column no window shows: its noisy present count (N less the missing
# cell) clears LAST_RESORT_Z deviations; the fullest window of _LAST_WIDTH bins is taken.
LAST_RESORT_Z, _LAST_WIDTH = 5.0, 16


@dataclass(frozen=True)
class RangeRelease:
    """Round 1's output: kept categories with their noisy counts, each number's rough range
    (None: nothing cleared) and its noisy range-grid counts (for the clipped-share estimate)."""

    categories: dict[str, list[str]]
    category_counts: dict[str, list[float]]
    ranges: dict[str, tuple[float, float] | None]
    range_counts: dict[str, np.ndarray]
    cores: dict[str, tuple[float, float] | None]


def _extended(released: np.ndarray, span: tuple[int, int], std: float) -> tuple[int, int]:
    """`span` grown outward while the next RANGE_WINDOW noisy counts hold a significant sum
    (kept off the overflow bins)."""
    first, last = span
    cut = RANGE_Z * std * math.sqrt(RANGE_WINDOW)
    while first > 1 and released[max(first - RANGE_WINDOW, 0) : first].sum() > cut:
        first -= 1
    while last < len(released) - 2 and released[last + 1 : last + 1 + RANGE_WINDOW].sum() > cut:
        last += 1
    return max(first, 1), min(last, len(released) - 2)


def _number_range(
    counts: np.ndarray, spec: NumberSpec, plan: SchemaReleasePlan, generator: torch.Generator
) -> tuple[tuple[float, float] | None, np.ndarray, tuple[float, float] | None]:
    """One number's rough range from its exact counts ([missing, range-grid bins…], padded),
    the noisy range-grid counts, and the range before the padding."""
    edges = range_grid(spec.kind)
    std = plan.range_noise_std
    with_missing = noisy(counts, std, generator)
    released, present = with_missing[1:], plan.rows - with_missing[0]
    if spec.kind in ("datetime", "date"):
        # bounded grid (a false year stretches to 1900 or 2100 at worst; round 2 trims it)
        # over which a time's rows spread thin: wider windows of years widen the span
        above = np.flatnonzero(released > plan.range_cut(spec.kind))
        coarse = coarse_span(released, std)
    else:
        above = supported_bins(
            released, plan.range_cut(spec.kind), plan.range_cut(spec.kind, alone=True)
        )
        # rows spread too thin for one bin: wider windows at the strict rate of a bin alone
        # (a false range on the numbers' grid is orders of magnitude off); with a span found,
        # windows away from it find a tail of its own (the few non-zero amounts of a column
        # of zeros), counted without the span's rows
        rest = released.copy()
        if len(above):
            rest[max(int(above[0]) - 1, 0) : int(above[-1]) + 2] = 0.0
        widths = _TAIL_WIDTHS if len(above) else None
        coarse = coarse_span(rest, std, FALSE_ALONE, widths=widths)
    # the bins that clear are the core; windows reach past their rows (by up to their width):
    # they widen the range only where round 2 may trim
    core = (int(above[0]), int(above[-1])) if len(above) else None
    span = core
    if coarse is not None:
        span = coarse if span is None else (min(span[0], coarse[0]), max(span[1], coarse[1]))
    if span is None:
        # a sparse column (values in a tenth of the rows, spread thin) is not written empty
        # for want of a strict cut: windows at the false-alarm rate of a time's range (a false
        # range then holds few values: round 2 releases the column's missing share)
        span = coarse_span(released, std, FALSE_ALARM)
    if span is None and present > LAST_RESORT_Z * std:
        # N less the noisy missing count says the column has values, spread too thin for any
        # window: the widest window's fullest place, which padding and round 2 make a range
        sums = np.convolve(released, np.ones(_LAST_WIDTH), mode="valid")
        start = int(np.argmax(sums))
        span = (start, start + _LAST_WIDTH - 1)
    if span is None:
        return None, released, None
    first, last = _extended(released, span, std)
    core_first, core_last = _extended(released, core, std) if core is not None else (first, last)
    padded = max(first - RANGE_PAD, 1), min(last + RANGE_PAD, len(released) - 2)
    zero = np.flatnonzero(edges == 0.0)
    if len(zero):  # the padding never crosses 0: a column of non-negative rows stays so
        z = int(zero[0])  # the bin [0, …)
        if first >= z:
            # rows over orders of magnitude (counts, amounts): their thin low tail reaches
            # down to 0 (a geometric fine grid spends no bins on it)
            wide = edges[first] <= edges[last + 1] / WIDE_RANGE
            padded = (z if wide else max(padded[0], z), padded[1])
        elif last < z:
            wide = -edges[last + 1] <= -edges[first] / WIDE_RANGE
            padded = (padded[0], z - 1 if wide else min(padded[1], z - 1))
    return _bounds(edges, padded), released, _bounds(edges, (core_first, core_last))


def _bounds(edges: np.ndarray, span: tuple[int, int]) -> tuple[float, float]:
    return (
        float(np.clip(edges[span[0]], -_GRID_LIMIT, _GRID_LIMIT)),
        float(np.clip(edges[span[1] + 1], -_GRID_LIMIT, _GRID_LIMIT)),
    )


def release_ranges_from_counts(
    counts: RangeCounts,
    numbers: Mapping[str, NumberSpec],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    target: str | None = None,
) -> RangeRelease:
    """Round 1 from its exact counts (`counts.categories`: the category lists to release, in
    this order; `numbers`: the numbers', in this order). `target` names the label set the
    plan gave its own noise."""
    if (target is not None) != (plan.target_noise_std is not None):
        raise ValueError("the target's list differs from the release plan's")
    categories: dict[str, list[str]] = {}
    kept_counts: dict[str, list[float]] = {}
    for name in counts.categories:
        candidates, exact = counts.sorted_categories(name)
        std, cut = plan.category_noise_std, plan.category_threshold
        if name == target:
            assert plan.target_noise_std is not None and plan.target_threshold is not None
            std, cut = plan.target_noise_std, plan.target_threshold
        released = noisy(exact, std, generator)
        keep = released > cut
        categories[name] = [c for c, k in zip(candidates, keep, strict=True) if k]
        kept_counts[name] = [float(r) for r, k in zip(released, keep, strict=True) if k]
    ranges: dict[str, tuple[float, float] | None] = {}
    noisy_ranges: dict[str, np.ndarray] = {}
    cores: dict[str, tuple[float, float] | None] = {}
    for name, spec in numbers.items():
        ranges[name], noisy_ranges[name], cores[name] = _number_range(
            counts.numbers[name], spec, plan, generator
        )
    return RangeRelease(categories, kept_counts, ranges, noisy_ranges, cores)


def release_ranges(
    categorical: Mapping[str, np.ndarray],
    numbers: Mapping[str, tuple[np.ndarray, NumberSpec]],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    target: str | None = None,
) -> tuple[dict[str, list[str]], dict[str, tuple[float, float] | None]]:
    """Round 1 on columns in memory: the kept categories per categorical column (values:
    strings), and the rough range per number (values: floats, NaN for missing cells; None:
    nothing cleared)."""
    counts = RangeCounts(
        tallies_of(categorical),
        {name: range_counts(values, spec.kind) for name, (values, spec) in numbers.items()},
    )
    specs = {name: spec for name, (_, spec) in numbers.items()}
    out = release_ranges_from_counts(counts, specs, plan, generator, target)
    return out.categories, out.ranges


def fine_bins(rows: int, noise_std: float) -> int:
    """How many fine bins the shape histogram has (public: N and the noise): about
    FINE_BIN_DEVIATIONS noise deviations of rows each, and at least two per model bin (the
    edges are snapped to the fine grid), within FINE_BINS."""
    wanted = rows // max(FINE_BIN_DEVIATIONS * noise_std, 1.0)
    return int(min(FINE_BINS, max(8, 2 * quantile_bins(rows), wanted)))


def shape_grid(spec: NumberSpec, span: tuple[float, float], plan: SchemaReleasePlan) -> np.ndarray:
    """The public fine grid of a number's shape histogram inside its released range: whole
    numbers one per bin when the range holds at most INTEGER_FINE_BINS of them (a count or a
    term of 36 or 60 months keeps its values exactly, whatever the padding)."""
    bins = fine_bins(plan.rows, plan.shape_noise_std)
    if spec.kind == "integer":
        values = math.floor(span[1]) - math.ceil(span[0]) + 1
        bins = max(bins, values) if values <= INTEGER_FINE_BINS else bins
    return fine_grid(span[0], span[1], spec.kind, bins)


def released_decimals(noisy_digits: np.ndarray, std: float) -> int | None:
    """The precision written for a float column: the most digits after the point whose noisy
    count (`noisy_digits[k]`: values written with k digits) clears the cut a bin of noise
    alone clears with probability FALSE_ALONE over the MAX_DECIMALS + 1 bins; None when none
    does. A column written to one decimal then gets more with probability about 1e-3, not the
    0.7% that a 3-deviation cut on each of its five empty bins gave (post-processing)."""
    cut = std * float(norm.isf(FALSE_ALONE / (MAX_DECIMALS + 1)))
    significant = np.flatnonzero(np.asarray(noisy_digits) > cut)
    return int(significant[-1]) if len(significant) else None


@dataclass(frozen=True)
class ReleasedShape:
    """What round 3 released for one column: its entries and its noisy histogram (numbers:
    [missing, zero, fine…] over `grid`; booleans: [false, true, missing]) with the noise's
    std."""

    edges: tuple[float, ...] | None
    missing: bool
    decimals: int | None
    grid: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()
    noise_std: float = 0.0
    empty: bool = False  # the values' noisy total is within the noise: nothing to write


def release_shapes_from_counts(
    counts: ShapeCounts,
    numbers: Mapping[str, tuple[NumberSpec, np.ndarray, bool]],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, ReleasedShape]:
    """Round 3 from its exact counts. `numbers`: per number (in this order) its spec, fine
    grid (`shape_grid`) and whether its empty ends are trimmed here (false after round 2
    trimmed them); then each boolean of `counts.booleans`, in order."""
    std = plan.shape_noise_std
    bins = quantile_bins(plan.rows)
    out: dict[str, ReleasedShape] = {}
    for name, (spec, grid, trim) in numbers.items():
        released = noisy(counts.numbers[name], std, generator)
        fine = released[2:]
        present = float(max(released[1] + fine.sum(), 1.0))
        span = trim_ends(fine, std, present) if trim else None
        edges = edges_from_counts(fine, grid, bins, spec.kind, span)
        zero_share = released[1] / max(np.clip(released, 0.0, None).sum(), 1.0)
        zero_bin = zero_counted(spec.kind, grid)
        if edges is not None and zero_bin and released[1] > SIGNIFICANCE * std:
            # zeros counted apart: a point mass when they hold a bin's share, and inside the
            # range in any case (a range of the other values alone would clip them)
            if zero_share >= 1.0 / bins:
                edges = with_atom(edges, 0.0)
            elif edges[0] > 0.0:
                edges = (0.0, *edges[1:]) if len(edges) > 2 else (0.0, edges[-1])
            elif edges[-1] < 0.0:
                edges = (*edges[:-1], 0.0) if len(edges) > 2 else (edges[0], 0.0)
        decimals = None
        if spec.decimals:
            noisy_digits = noisy(counts.decimals[name], plan.decimals_noise_std, generator)
            decimals = released_decimals(noisy_digits, plan.decimals_noise_std)
        # the values' noisy total (zeros and fine bins) not above the noise: a range found in
        # noise (a sparse column's last-resort windows), or too few values to write any
        # (N less the noisy missing count has the noise of one cell; the values' own total, of
        # every cell: both must be above it)
        total_noise = std * math.sqrt(len(fine) + 1)
        empty = (plan.rows - released[0] < PRESENT_SIGNIFICANCE * std) or (
            released[1] + fine.sum() < total_noise
        )
        out[name] = ReleasedShape(
            edges,
            bool(released[0] > MISSING_SIGNIFICANCE * std),
            decimals,
            tuple(float(g) for g in grid),
            tuple(float(c) for c in released),
            std,
            empty,
        )
    boolean_std = plan.boolean_noise_std
    for name, exact in counts.booleans.items():
        released = noisy(exact, boolean_std, generator)
        missing = bool(released[2] > MISSING_SIGNIFICANCE * boolean_std)
        out[name] = ReleasedShape(
            None, missing, None, counts=tuple(float(c) for c in released), noise_std=boolean_std
        )
    return out


def release_shapes(
    numbers: Mapping[str, tuple[np.ndarray, np.ndarray, NumberSpec, tuple[float, float]]],
    booleans: Mapping[str, np.ndarray],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, ReleasedShape]:
    """Round 2 on columns in memory: per number (values as floats with NaN missing, their
    texts, spec, released range) its edges, missing flag and decimals; per boolean (codes 0
    false, 1 true, 2 missing) its missing flag."""
    grids = {name: shape_grid(spec, span, plan) for name, (_, _, spec, span) in numbers.items()}
    counts = ShapeCounts(
        {
            name: shape_counts(values, grids[name], spec.kind)
            for name, (values, _, spec, _) in numbers.items()
        },
        {
            name: decimal_counts(texts, values)
            for name, (values, texts, spec, _) in numbers.items()
            if spec.decimals
        },
        {name: boolean_counts(codes) for name, codes in booleans.items()},
    )
    specs = {name: (spec, grids[name], True) for name, (_, _, spec, _) in numbers.items()}
    return release_shapes_from_counts(counts, specs, plan, generator)
