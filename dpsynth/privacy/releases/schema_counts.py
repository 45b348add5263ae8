"""The exact counts a DP schema release noises, made chunk by chunk.

Each round of the release (`dpsynth.privacy.releases.schema_release`) reads one set of
histograms: round 1 the category tallies and each number's [missing | public range grid] counts,
round 2 each number's [missing | zero | fine bins] and decimals and each boolean's [false |
true | missing]. The counts of a table are the sums of its chunks' counts, so every engine (in
memory: one chunk; DuckDB: record batches; Dask: partitions, merged) makes the same counts, and
one secret seed gives the same release. These counts never leave `privacy/` unnoised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpsynth.privacy.mechanisms.histograms import numeric_counts
from dpsynth.privacy.releases.schema_grids import range_grid

MAX_DECIMALS = 6


def category_tally(values: np.ndarray) -> Counter[str]:
    """Each distinct value (as text) and its count."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=str), use_na_sentinel=False)
    counts = np.bincount(codes, minlength=len(uniques))
    return Counter({str(u): int(c) for u, c in zip(uniques, counts, strict=True)})


def range_counts(values: np.ndarray, kind: str) -> np.ndarray:
    """[missing, counts of the present values over the public range grid of `kind`…]
    (NaN: missing)."""
    finite = np.isfinite(values)
    grid = numeric_counts(values[finite], range_grid(kind))
    return np.concatenate([[float((~finite).sum())], grid])


def zero_counted(kind: str, grid: np.ndarray) -> bool:
    """Whether round 2 counts exact zeros apart (numbers whose range holds 0)."""
    return kind in ("numeric", "integer") and grid[0] <= 0.0 <= grid[-1]


def shape_counts(values: np.ndarray, grid: np.ndarray, kind: str) -> np.ndarray:
    """[missing, exactly zero, fine bins over `grid`…] of a column's values (NaN: missing;
    values beyond the grid counted in its end bins; zeros apart only when `zero_counted`)."""
    missing = ~np.isfinite(values)
    present = np.clip(values[~missing], grid[0], grid[-1])
    is_zero = present == 0.0 if zero_counted(kind, grid) else np.zeros(len(present), dtype=bool)
    index = np.searchsorted(grid, present[~is_zero], side="right") - 1
    index = np.clip(index, 0, len(grid) - 2)
    fine = np.bincount(index, minlength=len(grid) - 1).astype(np.float64)
    return np.concatenate([[missing.sum(), is_zero.sum()], fine])


def decimal_counts(texts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How many present values are written with 0 … MAX_DECIMALS digits after the point
    (worked out once per distinct text: a column repeats most of its values)."""
    present = np.asarray(texts, dtype=object)[np.isfinite(values)]
    codes, uniques = pd.factorize(present, use_na_sentinel=False)
    digits = np.zeros(len(uniques), dtype=np.int64)
    for i, text in enumerate(uniques.tolist()):
        mantissa = str(text).lower().split("e")[0]
        if "." in mantissa:
            digits[i] = min(len(mantissa.split(".")[1]), MAX_DECIMALS)
    return np.bincount(digits[codes], minlength=MAX_DECIMALS + 1).astype(np.float64)


def boolean_counts(codes: np.ndarray) -> np.ndarray:
    """[false, true, missing] of a boolean column's codes (0, 1, 2)."""
    return np.bincount(np.asarray(codes, dtype=np.int64), minlength=3)[:3].astype(np.float64)


@dataclass
class RangeCounts:
    """Round 1's exact counts: category tallies, and numbers over their range grids."""

    categories: dict[str, Counter[str]] = field(default_factory=dict)
    numbers: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, other: RangeCounts) -> RangeCounts:
        """This plus another chunk's counts (in place; returns self)."""
        for name, tally in other.categories.items():
            self.categories.setdefault(name, Counter()).update(tally)
        for name, counts in other.numbers.items():
            self.numbers[name] = self.numbers.get(name, 0) + counts
        return self

    def sorted_categories(self, name: str) -> tuple[list[str], np.ndarray]:
        """A column's distinct values, sorted, and their counts."""
        tally = self.categories.get(name, Counter())
        values = sorted(tally)
        return values, np.array([tally[v] for v in values], dtype=np.float64)


@dataclass
class ShapeCounts:
    """Round 2's exact counts: per number [missing, zero, fine…] and decimals, per boolean
    [false, true, missing]."""

    numbers: dict[str, np.ndarray] = field(default_factory=dict)
    decimals: dict[str, np.ndarray] = field(default_factory=dict)
    booleans: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, other: ShapeCounts) -> ShapeCounts:
        """This plus another chunk's counts (in place; returns self)."""
        for mine, theirs in (
            (self.numbers, other.numbers),
            (self.decimals, other.decimals),
            (self.booleans, other.booleans),
        ):
            for name, counts in theirs.items():
                mine[name] = mine.get(name, 0) + counts
        return self


def tallies_of(columns: Mapping[str, np.ndarray]) -> dict[str, Counter[str]]:
    """Category tallies of several columns' values."""
    return {name: category_tally(values) for name, values in columns.items()}
