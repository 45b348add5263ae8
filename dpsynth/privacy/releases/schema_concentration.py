"""Whole numbers found in one magnitude (years, codes of four digits): where the DP schema
release's noisy histograms show them concentrated in a few fine bins, and where their values
stop sharply (post-processing only, no privacy cost). Round 2 reads them on its fine grid
(`concentrated_span`), or on its FINE_CORE_BINS even bins where its noise is quiet
(`fine_concentration`, grid chosen by `schema_rounds`); round 3 counts a span of a few
values one a bin and keeps the bins that hold them (`few_values_span`)."""

from __future__ import annotations

import math

import numpy as np

from dpsynth.privacy.releases.schema_spans import (
    REACH_Z,
    SIGNIFICANCE,
    TRIM_Z,
    significant_span,
    trimmed_span,
)

# A range round 1 found within this factor of one magnitude (one or two bins of its grid) may
# be trimmed inside to the fine bins that hold its values (`concentrated_span`).
NARROW_CORE = 2.0
# ... when its values clear the noise in at most this many fine bins (a year, a code).
POINT_BINS = 2
# Where round 2's noise is below QUIET_SHARE of the rows, such whole numbers over at least
# FINE_CORE_VALUES values (years in [1449, 2048)) are counted on FINE_CORE_BINS even bins
# instead (`schema_rounds`), found concentrated when the bins that clear the noise and
# WIDEN_VALUES more each side span at most FINE_SPAN_VALUES values (`fine_concentration`),
# and, where at most POINT_BINS clear it, counted one value a bin in round 3: kept to at most
# FEW_VALUES values that clear it there, with SLACK_VALUES more at an end where they do not
# stop sharply by SHARP_Z deviations (`few_values_span`).
QUIET_SHARE = 0.03
FINE_CORE_VALUES, FINE_CORE_BINS, FINE_SPAN_VALUES, WIDEN_VALUES = 64, 512, 128, 16
FEW_VALUES, SLACK_VALUES, SHARP_Z = 8, 2, 3.0


def _unaccounted(fine: np.ndarray, span: tuple[int, int], present: float) -> float:
    """The present values the fine bins `span` do not hold, from noisy counts."""
    return present - float(fine[span[0] : span[1] + 1].sum())


def narrow_core(core: tuple[float, float] | None) -> bool:
    """Whether round 1 found every value of a number within a factor NARROW_CORE of one
    magnitude away from 0 (a year, a code of four digits): one or two bins of its grid."""
    return core is not None and core[0] > 0 and core[1] <= NARROW_CORE * core[0]


def fine_concentration(
    fine: np.ndarray,
    grid: np.ndarray,
    std: float,
    present: float,
    core: tuple[float, float],
) -> tuple[int, int, bool] | None:
    """The fine bins (of round 2's FINE_CORE_BINS even ones) that clear the noise
    (`significant_span`) and WIDEN_VALUES more each side, when those span at most FINE_SPAN_VALUES
    whole numbers and hold every present value up to TRIM_Z deviations of the difference's
    noise (post-processing), and whether they are few: at most POINT_BINS clear it (round 3
    then counts them one a bin, `few_values_span`; a spread of decades is counted in bins of
    a few years, as the coarse grid's concentrated span was: one bin a year sums the noise
    of a dozen bins into each model bin). The values each side keep a thin tail the noise
    hides (years thinning back from 1971 to 1963). None otherwise."""
    # read inside round 1's range before padding (`core`), where its values are: among the
    # padding's hundreds of bins, noise alone clears the cut too often
    low = int(np.clip(np.searchsorted(grid, core[0], side="right") - 1, 0, len(fine) - 1))
    high = int(np.clip(np.searchsorted(grid, core[1], side="left") - 1, low, len(fine) - 1))
    inside = significant_span(fine[low : high + 1], std, present)
    if inside is None:
        return None
    span = (inside[0] + low, inside[1] + low)
    few = span[1] - span[0] + 1 <= POINT_BINS
    # WIDEN_VALUES more each side (at least a bin), for a thin tail the noise hides
    first = min(
        int(np.searchsorted(grid, grid[span[0]] - WIDEN_VALUES, side="right")) - 1, span[0] - 1
    )
    last = max(
        int(np.searchsorted(grid, grid[span[1] + 1] + WIDEN_VALUES, side="left")) - 1, span[1] + 1
    )
    first, last = max(first, 0), min(last, len(fine) - 1)
    if _unaccounted(fine, (first, last), present) > TRIM_Z * std * math.sqrt(last - first + 2):
        return None
    return (first, last, few) if grid[last + 1] - grid[first] <= FINE_SPAN_VALUES else None


def _stops_sharply(edge: float, beyond: float, std: float) -> bool:
    """Whether values stop sharply between a bin holding `edge` and the next one out: the bin
    clearly holds values (SIGNIFICANCE deviations) and the next holds less than half as many
    by SHARP_Z deviations of the difference's noise (a thin last year beside a full one
    seldom looks sharp by noise)."""
    return edge > SIGNIFICANCE * std and edge / 2 - beyond > SHARP_Z * std * math.sqrt(1.25)


def few_values_span(
    fine: np.ndarray, std: float, present: float, present_std: float
) -> tuple[int, int] | None:
    """The bins of whole numbers counted one a bin (round 3, inside a span round 2 found
    concentrated on its fine bins) that clear the noise (`trimmed_span`), when they are at
    most FEW_VALUES values and hold every value of `present` (of noise `present_std`) up to
    REACH_Z deviations of the difference's noise, with SLACK_VALUES more at an end where the
    values do not stop sharply (`_stops_sharply`), post-processing. A panel's years,
    1992–1998, counted in bins of 6 were released as 1989–2000, and 40% of the synthetic
    years lay outside them. None: more values, or values left unaccounted for (the span is
    kept whole)."""
    span = trimmed_span(fine, std)
    if span is None:
        return None
    first, last = span
    if last - first + 1 > FEW_VALUES:
        return None
    # (round 2 found every value inside this span: the bar is REACH_Z, not TRIM_Z)
    deviation = math.sqrt((last - first + 1) * std**2 + present_std**2)
    if _unaccounted(fine, span, present) > REACH_Z * deviation:
        return None
    end = len(fine) - 1
    if first > 0 and not _stops_sharply(fine[first], fine[first - 1], std):
        first = max(first - SLACK_VALUES, 0)
    if last < end and not _stops_sharply(fine[last], fine[last + 1], std):
        last = min(last + SLACK_VALUES, end)
    return first, last


def concentrated_span(
    fine: np.ndarray, std: float, present: float, core: tuple[float, float]
) -> tuple[int, int] | None:
    """The fine bins that clear the noise (`significant_span`) when round 1 found every value
    within a factor NARROW_CORE of one magnitude away from 0, at most POINT_BINS of them clear
    it, and they hold all the present values up to TRIM_Z deviations of the difference's
    noise (post-processing). Years sold in 2006–2010 lie in the range grid's bin [1449,
    2048), which round 1 pads to [363, 8194] at a wide table's noise; inside it the fine bins
    show where the rows are, and the values drawn no longer spread over 1,449–2,047 (99% of
    them outside 2006–2010). None: not such a column, or values are left unaccounted for."""
    if not narrow_core(core):
        return None
    span = significant_span(fine, std, present)
    if span is None:
        return None
    first, last = span
    if last - first + 1 > POINT_BINS:  # spread over the range: its tails may be real
        return None
    if _unaccounted(fine, span, present) > TRIM_Z * std * math.sqrt(last - first + 2):
        return None
    return span
