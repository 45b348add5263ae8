"""Releasing a table's schema with DP: category lists, bounds, bin edges, missing flags, precision.

Two rounds of Gaussian noisy histograms, one `gaussian` event of count 2 at one noise multiplier
σ (add/remove adjacency; each row adds exactly 1 to one bin of every histogram of a round, so
a round of k histograms has L2 sensitivity √k and every bin gets N(0, (σ√k)²) noise):

1. **Ranges** (`release_ranges`), as `dpsynth.privacy.mechanisms.histograms` does it: category lists
by a
   thresholded histogram over the data's own values (the `threshold_delta` event: a value in
   one table only is released with probability ≤ its share of δ), and the rough range of each
   number over a public grid (0 and ±2^(j/2); for dates and times the calendar years
   1900–2100): the first and last bins whose noisy count clears a false-alarm cut (on the
   numbers' grid beside a neighbour that clears it too, or a stricter cut alone:
   `supported_bins`).
2. **Shapes** (`release_shapes`), inside those ranges, for each number or time: one histogram
   over [missing | exactly zero (numbers whose range holds 0) | fine bins], a public grid (linear,
   or geometric for a positive range spanning orders of magnitude; whole numbers for integers
   and days for dates), and for a float column a second over its decimals (0…6 digits after the
   point). For a boolean one histogram over [false | true | missing]. From the noisy counts,
   post-processing only:
   - `edges`: the ends of the fine bins that clear the noise (the rough range trimmed to
     where the rows are: months 1–12, not the grid's 1–17) and the quantiles 1/K, …,
     (K−1)/K of the noisy fine histogram (`quantile_bins` K; values beyond the range are
     drawn across the end bins, not piled on a bound); an exact zero holding at least 1/K of
     the rows becomes a point mass (the edge 0 twice);
   - `missing`: the missing bin's noisy count clears `MISSING_SIGNIFICANCE` deviations;
   - `decimals`: the most digits whose noisy count clears a false-alarm cut
     (`released_decimals`).

Only the released summaries leave this module, never a count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import norm

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.events import Gaussian, ThresholdDelta
from dpsynth.privacy.mechanisms.histograms import (
    THRESHOLD_DELTA_SHARE,
    category_counts,
    noisy,
    numeric_counts,
)
from dpsynth.privacy.releases.schema_grids import (
    FINE_BINS,
    closed_last_bin,
    fine_grid,
    range_grid,
    with_atom,
)
from dpsynth.privacy.releases.schema_spans import (
    FALSE_ALARM,
    FALSE_ALONE,
    coarse_span,
    supported_bins,
    trimmed_span,
)

# An exact zero is a point mass when its noisy count clears this many deviations (precision:
# `released_decimals`); a missing bin when it clears MISSING_SIGNIFICANCE (a bin too many only
# costs a value the model learns to be nearly empty; one too few encodes the missing cells at
# mid-range).
SIGNIFICANCE = 3.0
MISSING_SIGNIFICANCE = 1.5
# Fine bins of the shape histogram (the quantiles are read off it): as many as keep about
# FINE_BIN_DEVIATIONS noise deviations of rows in a bin on average, within [8, FINE_BINS].
FINE_BIN_DEVIATIONS = 8.0
MAX_DECIMALS = 6
_GRID_LIMIT = 2.0**40


def quantile_bins(rows: int) -> int:
    """The number of bins K the edges cut a number into: about log2(N), within [6, 16]
    (coarser for small tables, whose 2-way marginals could not resolve finer bins)."""
    return int(min(16, max(6, round(math.log2(max(rows, 2))))))


@dataclass(frozen=True)
class NumberSpec:
    """What the release needs of a number or time column: its kind and whether to release its
    precision."""

    kind: str  # "numeric", "integer", "datetime" or "date"
    decimals: bool = False


@dataclass(frozen=True)
class SchemaReleasePlan:
    """The noise of both rounds, fixed before the data is read.

    One noise multiplier σ for both rounds. Inside a round the histograms get different noise
    (a Gaussian mechanism over the concatenated histograms scaled by their noise: its L2
    sensitivity is √Σ 1/s_i², which the plan keeps at 1/σ): a number's rough range needs far
    less precision than a category list's threshold, so its noise is RANGE_NOISE_FACTOR times
    larger, and the category lists' noise (hence the threshold) is smaller for it.
    """

    noise_multiplier: float
    category_noise_std: float
    category_threshold: float
    range_noise_std: float
    shape_noise_std: float
    threshold_delta: float
    rows: int
    epsilon: float
    delta: float
    events: tuple[dict[str, Any], ...]
    # rows one privacy unit may hold (1: the unit is a row): every noise std is scaled by it
    unit_rows: int = 1
    # the target's label list, when released: less noise than the other lists (see the plan)
    target_noise_std: float | None = None
    target_threshold: float | None = None

    def range_cut(self, kind: str, alone: bool = False) -> float:
        """The noisy count a bin of a number's public range grid must clear (`kind`: the
        column's type; dates and times use the calendar grid) beside a neighbour that clears
        it too, or `alone` (see FALSE_ALARM). Not a privacy threshold (the grid is public)."""
        bins = len(range_grid(kind))
        rate = FALSE_ALONE if alone else FALSE_ALARM
        return 1.0 + self.range_noise_std * float(norm.isf(rate / bins))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mechanism": "gaussian noisy histograms: ranges (thresholded for category lists), "
            "then bin edges, missing flags and precision",
            "noise_multiplier": self.noise_multiplier,
            "category_noise_std": self.category_noise_std,
            "category_threshold": self.category_threshold,
            "target_noise_std": self.target_noise_std,
            "target_threshold": self.target_threshold,
            "range_noise_std": self.range_noise_std,
            "shape_noise_std": self.shape_noise_std,
            "threshold_delta": self.threshold_delta,
            "quantile_bins": quantile_bins(self.rows),
            **({"sensitivity_rows": self.unit_rows} if self.unit_rows > 1 else {}),
            "epsilon": self.epsilon,
            "delta": self.delta,
            "events": [dict(e) for e in self.events],
        }


RANGE_NOISE_FACTOR = 1.5
TARGET_PRECISION_SHARE = 0.5


def plan_schema_release(
    epsilon: float,
    delta: float,
    rows: int,
    categorical: int,
    numbers: Mapping[str, NumberSpec],
    booleans: int,
    unit_rows: int = 1,
    target: bool = False,
) -> SchemaReleasePlan:
    """Calibrate both rounds at one σ so that the release alone is (ε, δ)-DP.

    `unit_rows` K > 1: the guarantee is per privacy unit of at most K rows (bounded before the
    read): one unit moves each histogram by at most K in L2, so every noise std is K times the
    per-row one at the same σ; and a unit brings up to K new values into a category list, each
    held by at most K rows, so the threshold is K plus the noise's quantile at δ_c / K.
    `target`: one of the `categorical` lists is the target's label set, which a run cannot
    lose (it needs two labels): it takes TARGET_PRECISION_SHARE of round 1's precision (the
    other entries' noise grows by about √2), so its labels clear the threshold at fewer rows.
    `rows` is N or the declared public size N': every N-derived setting (bins) reads it."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UsageError(f"--schema-epsilon must be a positive number, got {epsilon}")
    shapes = len(numbers) + sum(spec.decimals for spec in numbers.values()) + booleans
    if categorical + shapes == 0:
        raise UsageError("--schema-epsilon: no schema entry to release")
    rounds = int(categorical + len(numbers) > 0) + int(shapes > 0)
    share = THRESHOLD_DELTA_SHARE * delta if categorical else 0.0
    prior = (ThresholdDelta(share),) if categorical else ()
    calibration = calibrate_noise(epsilon, delta, 1.0, rounds, prior_events=prior)
    sigma = calibration.noise_multiplier
    # Σ over round 1 of 1/s² = categorical/s_c² + numbers/(f·s_c)² = 1/σ²
    weight = categorical + len(numbers) / RANGE_NOISE_FACTOR**2
    # the target's std is category_std / boost; its 1/s² is boost² of a list's
    others = weight - 1.0 if target else weight
    boost2 = max(1.0, others * TARGET_PRECISION_SHARE / (1.0 - TARGET_PRECISION_SHARE))
    if target:
        weight = others + boost2
    k = int(unit_rows)
    category_std = k * sigma * math.sqrt(max(weight, 1e-12))
    target_std = category_std / math.sqrt(boost2) if target else None
    per_value = (share / categorical if categorical else delta) / k
    return SchemaReleasePlan(
        noise_multiplier=sigma,
        category_noise_std=category_std,
        category_threshold=float(k) + category_std * float(norm.isf(per_value)),
        range_noise_std=RANGE_NOISE_FACTOR * category_std,
        shape_noise_std=k * sigma * math.sqrt(max(shapes, 1)),
        threshold_delta=share,
        rows=rows,
        epsilon=calibration.total_epsilon,
        delta=delta,
        events=(*prior, Gaussian(sigma, rounds)),
        unit_rows=k,
        target_noise_std=target_std,
        target_threshold=(
            float(k) + target_std * float(norm.isf(per_value)) if target_std is not None else None
        ),
    )


def release_ranges(
    categorical: Mapping[str, np.ndarray],
    numbers: Mapping[str, tuple[np.ndarray, NumberSpec]],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    target: str | None = None,
) -> tuple[dict[str, list[str]], dict[str, tuple[float, float] | None]]:
    """Round 1: the kept categories per categorical column (values: strings; `target` names
    the label set the plan gave its own noise), and the rough range per number (values:
    floats, NaN for missing cells; None: nothing cleared the threshold)."""
    if (target is not None) != (plan.target_noise_std is not None):
        raise ValueError("the target's list differs from the release plan's")
    categories: dict[str, list[str]] = {}
    for name, values in categorical.items():
        candidates, counts = category_counts(values)
        std, cut = plan.category_noise_std, plan.category_threshold
        if name == target:
            assert plan.target_noise_std is not None and plan.target_threshold is not None
            std, cut = plan.target_noise_std, plan.target_threshold
        kept = noisy(counts, std, generator) > cut
        categories[name] = [c for c, keep in zip(candidates, kept, strict=True) if keep]
    ranges: dict[str, tuple[float, float] | None] = {}
    for name, (values, spec) in numbers.items():
        edges = range_grid(spec.kind)
        present = values[np.isfinite(values)]
        counts = numeric_counts(present, edges)
        released = noisy(counts, plan.range_noise_std, generator)
        cut = plan.range_cut(spec.kind)
        if spec.kind in ("datetime", "date"):
            # bounded grid (a false year stretches to 1900 or 2100 at worst; round 2 trims it)
            # over which a time's rows spread thin: single years clear the cut only here and
            # there, so the span is widened to where wider windows of years clear it too
            above = np.flatnonzero(released > cut)
            coarse = coarse_span(released, plan.range_noise_std)
        else:
            above = supported_bins(released, cut, plan.range_cut(spec.kind, alone=True))
            # rows spread too thin for any one bin: wider windows of the same noisy counts, at
            # the strict rate of a bin alone (a false range on the numbers' grid is far off)
            coarse = (
                None if len(above) else coarse_span(released, plan.range_noise_std, FALSE_ALONE)
            )
        span = (int(above[0]), int(above[-1])) if len(above) else None
        if coarse is not None:
            span = coarse if span is None else (min(span[0], coarse[0]), max(span[1], coarse[1]))
        if span is None:
            ranges[name] = None
            continue
        low = float(np.clip(edges[span[0]], -_GRID_LIMIT, _GRID_LIMIT))
        high = float(np.clip(edges[span[1] + 1], -_GRID_LIMIT, _GRID_LIMIT))
        ranges[name] = (low, high)
    return categories, ranges


def fine_bins(rows: int, noise_std: float) -> int:
    """How many fine bins the shape histogram has (public: N and the noise)."""
    return int(min(FINE_BINS, max(8, rows // max(FINE_BIN_DEVIATIONS * noise_std, 1.0))))


def _decimals(texts: np.ndarray) -> np.ndarray:
    """Digits after the point of each number's text (0…MAX_DECIMALS), worked out once per
    distinct text (a column repeats most of its values)."""
    codes, uniques = pd.factorize(np.asarray(texts, dtype=object), use_na_sentinel=False)
    digits = np.zeros(len(uniques), dtype=np.int64)
    for i, text in enumerate(uniques.tolist()):
        mantissa = str(text).lower().split("e")[0]
        if "." in mantissa:
            digits[i] = min(len(mantissa.split(".")[1]), MAX_DECIMALS)
    return digits[codes]


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
    """What round 2 released for one column."""

    edges: tuple[float, ...] | None
    missing: bool
    decimals: int | None


def _edges_from_counts(
    counts: np.ndarray, grid: np.ndarray, bins: int, kind: str, noise_std: float = 0.0
) -> tuple[float, ...] | None:
    """The quantile edges of a noisy histogram over `grid` (post-processing), inside the span
    of bins that clear the noise (`trimmed_span`)."""
    span = trimmed_span(counts, noise_std) if noise_std > 0 else None
    if span is not None:
        first, last = span
        counts, grid = counts[first : last + 1], grid[first : last + 2]
    mass = np.clip(counts, 0.0, None)
    total = mass.sum()
    if total <= 0:
        return None
    cumulative = np.concatenate([[0.0], np.cumsum(mass)]) / total
    # the outer edges are the released range (values beyond it are clipped into the end
    # bins and drawn across them: no pile-up on a bound); the inner ones the quantiles
    inner = np.interp(np.arange(1, bins) / bins, cumulative, grid)
    edges = np.concatenate([[grid[0]], inner, [grid[-1]]])
    if kind != "numeric":  # whole numbers, days, or seconds
        unit = 86400.0 if kind == "date" else 1.0
        edges = np.round(edges / unit) * unit
    edges = np.unique(edges)
    if len(edges) < 2:
        edges = np.array([edges[0], edges[0] + (86400.0 if kind == "date" else 1.0)])
    if kind in ("integer", "date"):
        edges = closed_last_bin(edges, 86400.0 if kind == "date" else 1.0)
    return tuple(float(e) for e in edges)


def release_shapes(
    numbers: Mapping[str, tuple[np.ndarray, np.ndarray, NumberSpec, tuple[float, float]]],
    booleans: Mapping[str, np.ndarray],
    plan: SchemaReleasePlan,
    generator: torch.Generator,
) -> dict[str, ReleasedShape]:
    """Round 2: per number (values as floats with NaN missing, their texts, spec, released
    range) its edges, missing flag and decimals; per boolean (codes 0 false, 1 true, 2
    missing) its missing flag."""
    std = plan.shape_noise_std
    cut = SIGNIFICANCE * std
    bins = quantile_bins(plan.rows)
    resolution = fine_bins(plan.rows, std)
    out: dict[str, ReleasedShape] = {}
    for name, (values, texts, spec, (low, high)) in numbers.items():
        grid = fine_grid(low, high, spec.kind, resolution)
        missing = ~np.isfinite(values)
        present = np.clip(values[~missing], grid[0], grid[-1])
        zero_bin = spec.kind in ("numeric", "integer") and grid[0] <= 0.0 <= grid[-1]
        is_zero = present == 0.0 if zero_bin else np.zeros(len(present), dtype=bool)
        index = np.searchsorted(grid, present[~is_zero], side="right") - 1
        index = np.clip(index, 0, len(grid) - 2)
        fine = np.bincount(index, minlength=len(grid) - 1).astype(np.float64)
        counts = np.concatenate([[missing.sum(), is_zero.sum()], fine])
        released = noisy(counts, std, generator)
        edges = _edges_from_counts(released[2:], grid, bins, spec.kind, std)
        zero_share = released[1] / max(np.clip(released, 0.0, None).sum(), 1.0)
        if edges is not None and zero_bin and released[1] > cut and zero_share >= 1.0 / bins:
            edges = with_atom(edges, 0.0)
        decimals = None
        if spec.decimals:
            digits = _decimals(np.asarray(texts, dtype=object)[~missing])
            noisy_digits = noisy(
                np.bincount(digits, minlength=MAX_DECIMALS + 1).astype(np.float64), std, generator
            )
            decimals = released_decimals(noisy_digits, std)
        missing_cut = MISSING_SIGNIFICANCE * std
        out[name] = ReleasedShape(edges, bool(released[0] > missing_cut), decimals)
    for name, codes in booleans.items():
        counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=3).astype(np.float64)
        released = noisy(counts[:3], std, generator)
        out[name] = ReleasedShape(None, bool(released[2] > MISSING_SIGNIFICANCE * std), None)
    return out
