"""Where a column's rows are, read off the schema release's noisy histograms (post-processing
only, no privacy cost): the bins that clear the noise, the span a range or a trimmed shape
covers, and, when rows spread too thin for any one bin, wider windows of the same counts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

# A range (round 1) or a trimmed span (round 2) is the first to the last bin that clears the
# noise, and on the numbers' grid (±2^(j/2)) one false bin stretches it by orders of
# magnitude (latitudes released as 32 … 5.5e7). So a bin counts when it clears the cut of a
# false alarm in FALSE_ALARM of the histograms and has a neighbour that does too (rows
# spread over adjacent bins: amounts), or alone when it clears the cut of FALSE_ALONE (rows
# in one bin: latitudes of a city). Noise alone then stretches about one range in a thousand
# (round 1 shares FALSE_ALONE among a release's numbers: `SchemaReleasePlan.range_cut`).
FALSE_ALARM = 0.05
FALSE_ALONE = 1e-3
# An exact zero is a point mass when its noisy count clears this many deviations (and is kept
# inside a trimmed range); a bin clearly holds values at this many.
SIGNIFICANCE = 3.0
# Round 2 trims an end's fine bins while their noisy mass is below TRIM_Z deviations of its
# noise and TRIM_SHARE of the column's present rows (`schema_edges.trim_ends`), never into the
# bins round 1's range holds grown outward over the fine bins beside it whose noisy mass
# clears TRIM_Z deviations.
TRIM_Z, TRIM_SHARE = 2.0, 0.02
# A thin tail beyond the bins that clear the noise is kept where its mass clears REACH_Z
# deviations of its noise and TRIM_SHARE of the values (`significant_span`).
REACH_Z = 3.0


def supported_bins(counts: np.ndarray, cut: float, alone_cut: float) -> np.ndarray:
    """Indices of noisy `counts` over `cut` beside a neighbour over it, or over `alone_cut`."""
    clears = counts > cut
    neighbour = np.zeros_like(clears)
    neighbour[1:] |= clears[:-1]
    neighbour[:-1] |= clears[1:]
    return np.flatnonzero((clears & neighbour) | (counts > alone_cut))


def grown_span(
    counts: np.ndarray,
    span: tuple[int, int],
    noise_std: float,
    z: float,
    widths: tuple[int, ...],
    bounds: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """`span` grown outward, one bin at a time, while the next 1, 2, … (`widths`) bins beside
    it together hold a noisy count over `z` deviations of that sum's noise (post-processing),
    kept within `bounds` (first and last bin; the whole histogram when None). Read from the
    span outward, a far run of empty bins cannot hide a heavy bin beside the span, as a sum
    read from the far end inward can (its noise grows with every bin it adds)."""
    low, high = bounds if bounds is not None else (0, len(counts) - 1)
    first, last = span

    def holds(window: np.ndarray) -> bool:
        return bool(window.sum() > z * noise_std * math.sqrt(max(len(window), 1)))

    while first > low and any(holds(counts[max(first - w, low) : first]) for w in widths):
        first -= 1
    while last < high and any(holds(counts[last + 1 : min(last + w, high) + 1]) for w in widths):
        last += 1
    return max(first, low), min(last, high)


def trimmed_span(counts: np.ndarray, noise_std: float) -> tuple[int, int] | None:
    """The first and last fine bins whose noisy count clears a false-alarm cut (post-processing).

    Round 1's range is coarse (its public grid steps by √2), so it often runs past the data:
    months released as 1–17, minutes as 0–65. Inside it the fine histogram tells where the
    rows really end (`supported_bins`: noise alone stretches about one span in a thousand).
    None when no bin clears it (the whole range is kept).
    """
    bins = max(len(counts), 1)
    above = supported_bins(
        counts,
        noise_std * float(norm.isf(FALSE_ALARM / bins)),
        noise_std * float(norm.isf(FALSE_ALONE / bins)),
    )
    if len(above) == 0:
        return None
    return int(above[0]), int(above[-1])


_WIDTHS = (2, 4, 8, 16, 32)


def coarse_span(
    released: np.ndarray,
    noise_std: float,
    false_alarm: float = FALSE_ALARM,
    widths: tuple[int, ...] | None = None,
) -> tuple[int, int] | None:
    """The first and last bin covered by any window of 2, 4, …, 32 adjacent noisy counts whose
    sum clears the cut of a false alarm in `false_alarm` of the histograms (shared by the
    widths); None
    when none does. Post-processing of released counts: a column whose rows spread thinly over
    many bins (birth dates over seventy years) keeps a range instead of being written empty.
    The span errs wide (a wide window reaches past the rows), which round 2 trims.
    `widths`: other window widths than 2 … 32."""
    first, last = None, None
    widths = widths or _WIDTHS
    for width in widths:
        if width > len(released):
            break
        sums = np.convolve(released, np.ones(width), mode="valid")
        # `false_alarm` shared by the widths: noise alone makes a span that often at most
        rate = false_alarm / len(widths) / len(sums)
        cut = noise_std * math.sqrt(width) * float(norm.isf(rate))
        above = np.flatnonzero(sums > cut)
        if len(above):
            start, end = int(above[0]), int(above[-1] + width - 1)
            first = start if first is None else min(first, start)
            last = end if last is None else max(last, end)
    return None if first is None or last is None else (first, last)


def combined_reading(
    readings: Sequence[tuple[Any, float]],
) -> tuple[Any, float]:
    """Independent noisy readings (value, noise std) of the same count (or of the same cells,
    as arrays) combined by their variances: the weighted mean and its std (post-processing)."""
    weights = [std**-2 for _, std in readings]
    total = sum(weights)
    value = sum(w * v for w, (v, _) in zip(weights, readings, strict=True)) / total
    return value, float(total**-0.5)


def significant_span(fine: np.ndarray, std: float, present: float) -> tuple[int, int] | None:
    """The bins from the outermost that clear the noise (`trimmed_span`), widened to where the
    noisy mass beyond them is still significant (over REACH_Z deviations of its noise and
    TRIM_SHARE of the values: a thin tail), post-processing. None: no bin clears."""
    span = trimmed_span(fine, std)
    if span is None:
        return None
    first, last = span
    floor = TRIM_SHARE * present

    def reach(tail: np.ndarray) -> int:
        mass = np.cumsum(tail)
        k = np.arange(1, len(tail) + 1)
        significant = np.flatnonzero((mass > REACH_Z * std * np.sqrt(k)) & (mass > floor))
        return int(significant[-1]) + 1 if len(significant) else 0

    return first - reach(fine[:first][::-1]), last + reach(fine[last + 1 :])
