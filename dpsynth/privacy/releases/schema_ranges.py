"""Round 1 of the DP schema release (`release_ranges_from_counts`): each category list by a
thresholded histogram, and each number's rough range over a public grid (`schema_grids`),
read off its noisy counts. See `dpsynth.privacy.releases.schema_release` for the three rounds.

A range errs wide, since every value beyond it is clipped: the bins whose noisy count clears
a false-alarm cut (`supported_bins`), joined with wider windows that clear it (`coarse_span`)
and with the fullest window beside them when the noisy present count says values lie
elsewhere (`_with_unseen_values`), extended outward while the next RANGE_WINDOW bins together
hold a significant count, then padded (more where one bin can hide a tail). A column no
window shows but whose noisy present count is large gets its fullest wide window, looked for
among non-negative bins first (`_weak_span`). Nothing here reads data: the exact counts come
from `schema_counts`, and what leaves is noisy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from dpsynth.privacy.mechanisms.histograms import noisy
from dpsynth.privacy.releases.schema_counts import RangeCounts, range_counts, tallies_of
from dpsynth.privacy.releases.schema_grids import range_grid
from dpsynth.privacy.releases.schema_plan import NumberSpec, SchemaReleasePlan
from dpsynth.privacy.releases.schema_spans import (
    FALSE_ALARM,
    FALSE_ALONE,
    coarse_span,
    grown_span,
    supported_bins,
)

_GRID_LIMIT = 2.0**40
# Round 1 extends a range while the next bin's (or the next 2 or RANGE_WINDOW bins') noisy
# sum clears RANGE_Z deviations of that sum, then pads RANGE_PAD bins each side (a factor of
# 2 on the numbers' grid, a year on the calendar's).
RANGE_WINDOW, RANGE_Z, RANGE_PAD = 4, 3.0, 2
# Where one bin can hide more than HIDDEN_SHARE of a number's values (RANGE_Z deviations of
# its noise), its range pads NOISY_PAD bins each side (a factor of 4): tails are unseen there.
HIDDEN_SHARE, NOISY_PAD = 0.02, 4
# A non-negative range whose high end is WIDE_RANGE times its low end reaches down to 0.
WIDE_RANGE = 4.0
# Window widths that look for a tail apart from a range already found (narrow: a window's
# span reaches past its rows by up to its width).
_TAIL_WIDTHS = (2, 4, 8)
# The last resort of a column no window shows: its noisy present count (N less the missing
# cell) clears LAST_RESORT_Z deviations; the fullest window of _LAST_WIDTH bins is taken.
# Round 3 checks the present count again (PRESENT_SIGNIFICANCE, every round's reading
# combined).
LAST_RESORT_Z, _LAST_WIDTH = 3.0, 16
# Both the last resort and the looser windows before it need the present count to hold
# LAST_RESORT_SHARE of the rows too (`last_resort_rows`): a weak span places few values well,
# and a column of a dozen values in 2,000 rows (significant at a small table's noise, and read
# again by round 2's second look) was drawn over 0–1e12 in half of the releases.
LAST_RESORT_SHARE = 0.05


def last_resort_rows(rows: int, std: float) -> float:
    """The present count (N less the noisy missing count) above which a number that no bin or
    strict window shows gets a weak span (`_weak_span`; public: N and the noise)."""
    return max(LAST_RESORT_Z * std, LAST_RESORT_SHARE * rows)


# A found span leaves values unseen when the noisy present count less the span's noisy mass
# clears UNSEEN_Z deviations of its noise (a column of zeros whose amounts spread too thin
# for any window: 40% of a column written 0): the window nearest to the span whose noisy sum
# holds UNSEEN_SHARE of those values joins it (`_nearest_holding`).
UNSEEN_Z = 4.0
UNSEEN_SHARE = 0.5


@dataclass(frozen=True)
class RangeRelease:
    """Round 1's output: kept categories with their noisy counts, each number's rough range
    (None: nothing cleared), its noisy range-grid counts (for the clipped-share estimate and
    round 2's second look), its range before padding and its noisy missing count."""

    categories: dict[str, list[str]]
    category_counts: dict[str, list[float]]
    ranges: dict[str, tuple[float, float] | None]
    range_counts: dict[str, np.ndarray]
    cores: dict[str, tuple[float, float] | None]
    # each number's noisy missing count (the range histogram's first cell)
    missing: dict[str, float] = field(default_factory=dict)
    # the numbers whose range is the last resort's guess
    guessed: frozenset[str] = frozenset()


def _extended(
    released: np.ndarray, span: tuple[int, int], std: float, widths: tuple[int, ...]
) -> tuple[int, int]:
    """`span` grown outward while the next `widths` bins together hold a noisy count over
    RANGE_Z deviations of its noise (kept off the overflow bins). A number's tail bin of a
    fifth of the rows beside the span is kept whole, not trimmed as padding; a time's year
    bins grow by RANGE_WINDOW only (a year is wide: one just past the span is padding)."""
    return grown_span(released, span, std, RANGE_Z, widths, (1, len(released) - 2))


def _fullest_window(counts: np.ndarray) -> tuple[int, int]:
    """The first and last bin of the _LAST_WIDTH adjacent noisy counts with the largest sum."""
    start = int(np.argmax(np.convolve(counts, np.ones(_LAST_WIDTH), mode="valid")))
    return start, start + _LAST_WIDTH - 1


def _nearest_holding(counts: np.ndarray, span: tuple[int, int], rows: float) -> tuple[int, int]:
    """The window of _LAST_WIDTH adjacent noisy counts nearest to `span` whose sum reaches
    `rows`; the fullest window when none does (post-processing). Among some sixty windows of
    noise alone one is fuller than the window that holds a column's thin amounts as often as
    not (ames' veneer areas, 0-1,378 beside 60% zeros, were released up to 1e12 in half of the
    releases), while the nearest window holding half of the values missed is theirs unless
    noise alone reaches half of them nearer to the span."""
    sums = np.convolve(counts, np.ones(_LAST_WIDTH), mode="valid")
    starts = np.arange(len(sums))
    ends = starts + _LAST_WIDTH - 1
    # windows clear of the span (one reaching into it holds only its near end of the values)
    holding = (sums >= rows) & ((starts > span[1]) | (ends < span[0]))
    if not holding.any():
        return _fullest_window(counts)
    distance = np.maximum(starts - span[1], 0) + np.maximum(span[0] - ends, 0)
    start = int(np.flatnonzero(holding)[np.argmin(distance[holding])])
    return start, start + _LAST_WIDTH - 1


def _with_unseen_values(
    released: np.ndarray, span: tuple[int, int], present: float, std: float, zero: int
) -> tuple[int, int]:
    """`span`, joined by a window of _LAST_WIDTH bins outside it (`_nearest_holding`) when the
    values it holds fall short of the present count by UNSEEN_Z deviations (post-processing).
    Where the window is looked for (`zero`: the bin [0, …)): a span of non-negative bins looks among
    non-negative bins only (amounts and counts: a window of noise among the negative ones would
    win as often as not), and only between 0 and itself unless it starts at 0 (the values a
    range of scores from 1.4 to 32 misses are its small ones: above it, `_extended` already
    took every bin that clears, and the fullest window of noise sent one release in eight to
    1e5–1e10); a span starting at 0 looks above (a column of zeros whose amounts spread too
    thin for any window). Negative spans alike, mirrored."""
    first, last = span
    unseen = present - float(released[first : last + 1].sum())
    if unseen <= UNSEEN_Z * std * math.sqrt(last - first + 2):
        return span
    low, high = 0, len(released) - 1  # the bins the window may cover
    if first >= zero:
        low = zero
        high = first - 1 if first > zero else high  # between 0 and the span
    elif last < zero:
        high = zero - 1
        low = last + 1 if last < zero - 1 else low
    rest = released.copy()
    rest[first : last + 1] = 0.0
    rest[:low], rest[high + 1 :] = 0.0, 0.0
    start, end = _nearest_holding(rest, span, UNSEEN_SHARE * unseen)
    if high >= low:  # kept inside those bins (a window wider than them reaches past)
        start, end = max(start, low), min(end, high)
    return min(first, start), max(last, end)


def _weak_span(
    released: np.ndarray, std: float, present: float, zero: int | None, rows: int
) -> tuple[tuple[int, int] | None, bool]:
    """The span of a column no bin or strict window shows (post-processing), and whether it is
    a guess (the last resort below: no window cleared any cut). A sparse column
    (values in a tenth of the rows, spread thin) is not written empty for want of a strict
    cut: windows at the false-alarm rate of a time's range, then, when N less the noisy
    missing count says the column has values (`last_resort_rows`), the fullest window of
    _LAST_WIDTH bins (which
    padding and round 2 make a range). Numbers look among non-negative bins only (amounts
    and counts; with the negative ones too, a window of noise there wins as often as not: a
    column of positive sales released as −4.9e10 … 0). Negative values too sparse for the
    strict cuts are then not found; positive ones are far more common."""
    if present <= LAST_RESORT_SHARE * rows:
        return None, False
    if zero is not None:
        released = released.copy()
        released[:zero] = 0.0
    span = coarse_span(released, std, FALSE_ALARM)
    if span is not None:
        return span, False
    if present <= last_resort_rows(rows, std):
        return None, False
    return _fullest_window(released), True


def range_from_noisy(
    with_missing: np.ndarray, spec: NumberSpec, plan: SchemaReleasePlan, std: float
) -> tuple[tuple[float, float] | None, tuple[float, float] | None, bool]:
    """One number's rough range (padded; None: nothing cleared), its range before the
    padding, and whether the range is the last resort's guess (no bin or window cleared a
    cut), from its noisy [missing, range-grid bins…] counts of noise `std` (post-processing:
    round 1's counts, or round 2's second look combined with them)."""
    edges = range_grid(spec.kind)
    released, present = with_missing[1:], plan.rows - with_missing[0]
    if spec.kind in ("datetime", "date"):
        # bounded grid (a false year stretches to 1900 or 2100 at worst; round 2 trims it)
        # over which a time's rows spread thin: wider windows of years widen the span
        above = np.flatnonzero(released > plan.range_cut(spec.kind, std=std))
        coarse = coarse_span(released, std)
    else:
        above = supported_bins(
            released,
            plan.range_cut(spec.kind, std=std),
            plan.range_cut(spec.kind, alone=True, std=std),
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
    zero = np.flatnonzero(edges == 0.0)
    # a number's bin [0, …) (a time's grid has 1970 there, no boundary of its values)
    number_zero = int(zero[0]) if len(zero) and spec.kind not in ("datetime", "date") else None
    guessed = False
    if span is None:
        span, guessed = _weak_span(released, std, present, number_zero, plan.rows)
    if span is None:
        return None, None, False
    if number_zero is not None:
        joined = _with_unseen_values(released, span, present, std, number_zero)
        if joined != span:  # values shown by the present count: round 2 keeps them
            span = joined
            core = (min(core[0], span[0]), max(core[1], span[1])) if core else span
    widths = (RANGE_WINDOW,) if spec.kind in ("datetime", "date") else (1, 2, RANGE_WINDOW)
    first, last = _extended(released, span, std, widths)
    core_first, core_last = (
        _extended(released, core, std, widths) if core is not None else (first, last)
    )
    pad = RANGE_PAD
    if number_zero is not None and RANGE_Z * std > HIDDEN_SHARE * max(present, 1.0):
        pad = NOISY_PAD
    padded = max(first - pad, 1), min(last + pad, len(released) - 2)
    if number_zero is not None:  # the padding never crosses 0: non-negative rows stay so
        z = number_zero
        if first >= z:
            # rows over orders of magnitude (counts, amounts): their thin low tail reaches
            # down to 0 (a geometric fine grid spends no bins on it)
            wide = edges[first] <= edges[last + 1] / WIDE_RANGE
            padded = (z if wide else max(padded[0], z), padded[1])
        elif last < z:
            wide = -edges[last + 1] <= -edges[first] / WIDE_RANGE
            padded = (padded[0], z - 1 if wide else min(padded[1], z - 1))
    return _bounds(edges, padded), _bounds(edges, (core_first, core_last)), guessed


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
    missing: dict[str, float] = {}
    guessed: set[str] = set()
    for name, spec in numbers.items():
        with_missing = noisy(counts.numbers[name], plan.range_noise_std, generator)
        ranges[name], cores[name], guess = range_from_noisy(
            with_missing, spec, plan, plan.range_noise_std
        )
        noisy_ranges[name], missing[name] = with_missing[1:], float(with_missing[0])
        if guess:
            guessed.add(name)
    return RangeRelease(
        categories, kept_counts, ranges, noisy_ranges, cores, missing, frozenset(guessed)
    )


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
