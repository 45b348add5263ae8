"""Releasing a table's schema with DP: category lists, bounds, bin edges, missing flags, precision.

Three rounds of Gaussian noisy histograms, planned by `dpsynth.privacy.releases.schema_plan`
(which shares the precision among the columns by need) and counted by
`dpsynth.privacy.releases.schema_counts` (exact counts, chunk by chunk, on any engine):

1. **Ranges** (`schema_ranges.release_ranges_from_counts`): category lists by a thresholded
   histogram over the data's own values (the `threshold_delta` event: a value in one table only
   is released with probability ≤ its share of δ; the noisy counts of the kept values are
   released too, as the thresholded Gaussian mechanism allows), and the rough range of each
   number over a public grid (0 and ±2^(j/2), whole steps for integers; for dates and times the
   calendar years 1900–2100), which errs wide, since every value beyond it is clipped.
2. **Spans** (`schema_edges.release_spans_from_counts`): each padded range counted on a finer
   grid and trimmed where it is empty; the share of values beyond it estimated from the noisy
   counts of rounds 1 and 2 (`clipped`, no new read). A number round 1 found no range for
   gets a second look instead (`schema_second_look`), and round 3 trims its padding.
3. **Shapes** (`release_shapes_from_counts`), inside those spans, for each number or time: one
   histogram over [missing | exactly zero (numbers whose range holds 0) | fine bins], a public
   grid (linear, or geometric for a positive range spanning orders of magnitude; whole numbers
   for integers and days for dates; a linear grid's bins inside round 1's range before
   padding, `schema_grids.core_weighted`), and for a float column a second over its decimals. For a
   boolean one histogram over [false | true | missing]. From the noisy counts, post-processing:
   - `edges`: the quantiles 1/K, …, (K−1)/K of the noisy fine histogram, snapped to the fine
     grid's edges (so the model's 1-way marginal is a sum of these fine bins,
     `ReleasedShape.counts`), a fine bin holding a quantile bin's share a bin of its own; an
     exact zero holding at least 1/K of the rows becomes a point mass (the edge 0 twice);
   - `empty`: N less the noisy missing count is within the noise (the column is written
     empty);
   - `missing`: the missing bin's noisy counts of every round, combined, clear
     `MISSING_SIGNIFICANCE` deviations;
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
from dpsynth.privacy.releases.schema_concentration import concentrated_span, few_values_span
from dpsynth.privacy.releases.schema_counts import (
    MAX_DECIMALS,
    ShapeCounts,
    boolean_counts,
    decimal_counts,
    shape_counts,
    zero_counted,
)
from dpsynth.privacy.releases.schema_edges import (
    SIGNIFICANCE,
    Beyond,
    ClipReading,
    edges_from_counts,
    kept_fine_bins,
    zeros_in_place,
)
from dpsynth.privacy.releases.schema_grids import (
    FINE_BINS,
    coarser_than_unit,
    fine_grid,
    value_unit,
    whole_core_grid,
    with_atom,
)
from dpsynth.privacy.releases.schema_plan import (
    NumberSpec,
    SchemaReleasePlan,
    plan_schema_release,
    quantile_bins,
)
from dpsynth.privacy.releases.schema_ranges import (
    RANGE_PAD,
    RangeRelease,
    release_ranges,
    release_ranges_from_counts,
)
from dpsynth.privacy.releases.schema_spans import (
    FALSE_ALONE,
    combined_reading,
    supported_bins,
)

__all__ = ["MAX_DECIMALS", "NumberSpec", "ReleasedShape", "SchemaReleasePlan"]
__all__ += ["plan_schema_release", "quantile_bins", "release_ranges", "release_shapes"]
__all__ += ["RANGE_PAD", "RangeRelease", "release_ranges_from_counts", "supported_bins"]
__all__ += ["ShapeRequest", "shape_grid"]

# An exact zero is a point mass when its noisy count clears this many deviations (precision:
# `released_decimals`). A number's missing bin when every round's reading of its missing cell,
# combined by their variances, clears MISSING_SIGNIFICANCE deviations of the combination: a
# bin too many makes the model write empty cells where the rows have none, one too few
# encodes the missing cells at mid-range. On round 3's count alone at 1.5 deviations, eight
# wide tables had 12.5 false flags a release (caravan, no empty cell, 4.2) and 12.8 lost ones
# (columns over 2% empty); combined at 2 deviations, 3.8 and 13.2.
MISSING_SIGNIFICANCE = 2.0
# A boolean's missing bin when it clears BOOLEAN_MISSING_SIGNIFICANCE: the flag is chosen on
# the noisy count the model then measures it by, so a false flag carries at least 1.5
# deviations of phantom empty cells (nhefs, 25 booleans none of which has an empty cell: four
# were flagged in one release, one written empty in 14% of its rows). Over eight real tables
# no boolean had an empty cell; one with a few deviations' worth keeps its flag.
BOOLEAN_MISSING_SIGNIFICANCE = 2.5
# A number's present values (N less its noisy missing count) must clear PRESENT_SIGNIFICANCE
# deviations of the noise.
PRESENT_SIGNIFICANCE = 3.0
# Fine bins of the shape histogram (the quantiles are read off it): as many as keep about
# FINE_BIN_DEVIATIONS noise deviations of rows in a bin on average, within [8, FINE_BINS].
FINE_BIN_DEVIATIONS = 8.0
INTEGER_FINE_BINS = 128
# Whole numbers over at most CODE_VALUES values keep the ends their counts found (codes:
# `reached_edges` would draw a code's end bin as codes no row holds).
CODE_VALUES = 32


def fine_bins(rows: int, noise_std: float) -> int:
    """How many fine bins the shape histogram has (public: N and the noise): about
    FINE_BIN_DEVIATIONS noise deviations of rows each, and at least two per model bin (the
    edges are snapped to the fine grid), within FINE_BINS."""
    wanted = rows // max(FINE_BIN_DEVIATIONS * noise_std, 1.0)
    return int(min(FINE_BINS, max(8, 2 * quantile_bins(rows), wanted)))


def shape_grid(
    spec: NumberSpec,
    span: tuple[float, float],
    plan: SchemaReleasePlan,
    concentrated: bool = False,
    core: tuple[float, float] | None = None,
) -> np.ndarray:
    """The public fine grid of a number's shape histogram inside its released range: whole
    numbers one per bin when the range holds at most INTEGER_FINE_BINS of them (a count or a
    term of 36 or 60 months keeps its values exactly, whatever the padding), and in
    INTEGER_FINE_BINS bins when round 2 found them `concentrated` in a bin or two of its
    coarser grid (years sold 2006–2010 in a span of 390 years: bins of 3 years, not 17); a
    linear grid's bins inside `core`, round 1's range before padding, where the padding is
    most of the span (`core_weighted`; whole numbers one a bin inside it, `whole_core_grid`)."""
    bins = fine_bins(plan.rows, plan.shape_noise_std)
    if spec.kind == "integer":
        values = math.floor(span[1]) - math.ceil(span[0]) + 1
        if values <= INTEGER_FINE_BINS and not concentrated and core is not None:
            weighted = whole_core_grid(span[0], span[1], core)
            if weighted is not None:
                return weighted
        if values <= INTEGER_FINE_BINS or concentrated:
            bins = max(bins, min(values, INTEGER_FINE_BINS))
    return fine_grid(span[0], span[1], spec.kind, bins, core)


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
    std; for a number whose padding round 3 trimmed, the share of its values estimated
    beyond the range and that estimate's deviation."""

    edges: tuple[float, ...] | None
    missing: bool
    decimals: int | None
    grid: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()
    noise_std: float = 0.0
    empty: bool = False  # the values' noisy total is within the noise: nothing to write
    clipped: float | None = None
    clipped_deviation: float = 0.0


@dataclass(frozen=True)
class ShapeRequest:
    """What round 3 counts for a number: its spec and fine grid (`shape_grid`); whether round
    3 trims the grid's empty padding (`trim`: no span came from round 2) from its range
    before padding (`core`), with round 1's (or the second look's) noisy mass beyond the range
    (`beyond`, of noise `beyond_std`) for the clipped share; and the earlier readings of its
    missing cell (value, std), combined with round 3's to tell whether it has values."""

    spec: NumberSpec
    grid: np.ndarray
    trim: bool = False
    core: tuple[float, float] | None = None
    beyond: Beyond | None = None
    beyond_std: float = 0.0
    missing_readings: tuple[tuple[float, float], ...] = ()
    # round 2 found its whole numbers in a bin or two of its coarser grid (`concentrated_span`)
    concentrated: bool = False
    # the padded range the model's end bins reach to (`reached_edges`); None: the span's own
    reach: tuple[float, float] | None = None


def _trimmed(
    released: np.ndarray, request: ShapeRequest, plan: SchemaReleasePlan, std: float
) -> tuple[tuple[int, int], ClipReading | None]:
    """Round 3's own trim of a padded range (as round 2 trims, `kept_fine_bins`), and the
    counts the share of values beyond a range is read from (None without `beyond`)."""
    spec, grid = request.spec, request.grid
    fine = zeros_in_place(released[2:], grid, float(released[1]), spec.kind)
    total = plan.rows - float(released[0])
    first, last, _, _ = kept_fine_bins(fine, grid, spec, std, total, request.core)
    if request.beyond is None:
        return (first, last), None
    reading = ClipReading(
        fine, grid, request.beyond, total, std, request.beyond_std, value_unit(spec.kind)
    )
    return (first, last), reading


def reached_edges(
    edges: tuple[float, ...], reach: tuple[float, float], kind: str
) -> tuple[float, ...]:
    """`edges` whose first and last bins stretch to `reach` (round 1's padded range, public):
    the values trimmed off a range are counted in its end bins anyway, and `sample` draws an
    end bin by a tail falling away from its neighbour, so a wide end bin draws them near the
    rows where a trimmed one piled them on its edge (post-processing). Not across 0, not for a
    point mass, not for times, and not where no other bin has a width (the tail follows the
    density of the nearest bin that has one: without it the wide bin is drawn evenly)."""
    widths = np.diff(np.asarray(edges, dtype=np.float64))
    if kind not in ("numeric", "integer") or int(np.sum(widths > 0)) < 2:
        return edges
    low, high = reach
    if kind == "integer":
        low, high = math.ceil(low), math.floor(high)
    out = list(edges)
    if out[1] > out[0] and low < out[0]:
        out[0] = max(low, 0.0) if out[0] >= 0 else low
    if out[-2] < out[-1] and high > out[-1]:
        out[-1] = min(high, 0.0) if out[-1] <= 0 else high
    return tuple(float(e) for e in out)


def release_shapes_from_counts(
    counts: ShapeCounts,
    numbers: Mapping[str, ShapeRequest],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, ReleasedShape]:
    """Round 3 from its exact counts: per number (in this order) its `ShapeRequest`; then
    each boolean of `counts.booleans`, in order."""
    std = plan.shape_noise_std
    bins = quantile_bins(plan.rows)
    out: dict[str, ReleasedShape] = {}
    for name, request in numbers.items():
        spec, grid = request.spec, request.grid
        released = noisy(counts.numbers[name], std, generator)
        fine = released[2:]
        span, clipped, deviation = None, None, 0.0
        # the missing cell, every reading of it combined by their variances
        missing, missing_std = combined_reading(
            ((float(released[0]), std), *request.missing_readings)
        )
        reading = None
        if request.trim:
            span, reading = _trimmed(released, request, plan, std)
        elif spec.kind == "integer" and coarser_than_unit(grid):
            # years binned coarser than their unit: the bins that hold them, as in round 2
            span = concentrated_span(fine, std, plan.rows - float(released[0]), (grid[0], grid[-1]))
        elif request.concentrated:  # counted one a bin: the few values and their slack
            with_zeros = zeros_in_place(fine, grid, float(released[1]), spec.kind)
            span = few_values_span(with_zeros, std, plan.rows - missing, missing_std)
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
        # a few whole numbers held in bins of their own (years, codes) keep their ends
        held = (not request.trim and span is not None) or (
            spec.kind == "integer" and grid[-1] - grid[0] <= CODE_VALUES + 1
        )
        if edges is not None and request.reach is not None and not held:
            edges = reached_edges(edges, request.reach, spec.kind)
        if edges is not None and reading is not None:
            clipped, deviation = reading.share(edges[0], edges[-1])
        decimals = None
        if spec.decimals:
            noisy_digits = noisy(counts.decimals[name], plan.decimals_noise_std, generator)
            decimals = released_decimals(noisy_digits, plan.decimals_noise_std)
        # N less that missing count within the noise: too few values to write any (a column
        # present in 12% of rows keeps its missing rate even where its values' total, summed
        # over every fine bin's noise, is not above it)
        empty = plan.rows - missing < PRESENT_SIGNIFICANCE * missing_std
        out[name] = ReleasedShape(
            edges,
            bool(missing > MISSING_SIGNIFICANCE * missing_std),
            decimals,
            tuple(float(g) for g in grid),
            tuple(float(c) for c in released),
            std,
            empty,
            clipped,
            deviation,
        )
    boolean_std = plan.boolean_noise_std
    for name, exact in counts.booleans.items():
        released = noisy(exact, boolean_std, generator)
        missing = bool(released[2] > BOOLEAN_MISSING_SIGNIFICANCE * boolean_std)
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
    requests = {
        name: ShapeRequest(spec, grids[name], trim=True)
        for name, (_, _, spec, _) in numbers.items()
    }
    return release_shapes_from_counts(counts, requests, plan, generator)
