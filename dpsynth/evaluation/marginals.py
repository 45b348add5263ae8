"""Marginal fidelity of a synthetic table: total variation distance (TVD) between the 1-, 2-
and 3-way marginals of synthetic rows and of real held-out rows (`--metrics marginals`).

Every used column of the schema (the features and the target; ignored and identifier columns
are skipped) is
discretised by a public rule that reads nothing off either table:

- a numeric, integer, date or time column into `bins` (default 10) equal-width bins over the
  schema's public [min, max] (a value equal to max falls in the last bin), a bucket for
  missing cells, and an explicit `other` bucket for a value outside the bounds or a field that
  is not a number (or a time in the column's format);
- a categorical or boolean column into its schema levels; a value not listed goes to the column's
  declared `other` category when the schema names one (the rule the codec trains with), else
  to an explicit `other` bucket.

The TVD of a marginal over a set of columns S is ½ Σ_cells |p_synthetic(cell) − p_real(cell)|
over the joint cells of S (0: identical distributions, 1: disjoint supports). Reported: the
mean TVD of the 1-way marginals (and each column's), of all 2-way marginals (all pairs of
used columns), and of the 3-way marginals on a fixed public random set of column triples:
`TRIPLES` (100) distinct triples drawn with `numpy.random.default_rng(TRIPLES_SEED)` (seed 0)
from the column count alone, or all triples when there are fewer; the chosen triples are
listed by name in the result. The same schema therefore scores every tool on the same
triples. The share of each table's values in an `other` bucket is reported per column (only
the non-zero ones).

Counting is vectorised (one `numpy.bincount` per marginal and table, or `numpy.unique` on the
occupied cells when a joint domain is too large for a dense count), on int32 codes of shape
[rows, columns], so memory stays at a few arrays of one int64 per row beside the codes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.data.clock import minutes_or_nan
from dpsynth.data.column_values import column_numbers, level_codes, missing_mask
from dpsynth.data.schema import Column, Schema
from dpsynth.data.table_codec import RawTable
from dpsynth.errors import DataError

BINS = 10
TRIPLES = 100
TRIPLES_SEED = 0
# Joint domains up to this many cells are counted densely (two float64 vectors of this size).
_DENSE_CELLS = 1 << 22
_WORST = 5
_EPOCH = pd.Timestamp(0, tz="UTC")


@dataclass(frozen=True)
class Discretised:
    """A table's used columns as bucket codes: `codes[:, j]` in [0, sizes[j])."""

    names: tuple[str, ...]
    codes: np.ndarray  # int32 [rows, columns]
    sizes: tuple[int, ...]
    other_share: dict[str, float]  # columns with values in the explicit `other` bucket

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.codes.shape[0])


def marginal_columns(schema: Schema) -> tuple[Column, ...]:
    """The columns the marginals cover: every feature and the target, in order."""
    return tuple(c for c in schema.columns if c.is_feature)


def bucket_count(column: Column, bins: int = BINS) -> int:
    """Buckets of a column: its bins (and a missing bucket) or levels, plus `other`."""
    return (bins + 1 if column.is_numeric else len(column.levels)) + 1


def lenient_numbers(values: np.ndarray, column: Column) -> tuple[np.ndarray, np.ndarray]:
    """A numeric or time column's cells as numbers (NaN where a cell is missing or unreadable;
    times in seconds since 1970-01-01 UTC, HHMM clocks in minutes, as the schema's bounds
    are) and the missing cells."""
    missing = missing_mask(values)
    if column.is_time:
        probe = RawTable((column.name,), (values,), "evaluate")
        try:
            return column_numbers(probe, column, lenient=True), missing
        except DataError:
            stamps = pd.to_datetime(pd.Series(values), errors="coerce", utc=True)
            return ((stamps - _EPOCH) / pd.Timedelta(seconds=1)).to_numpy(np.float64), missing
    numbers = pd.to_numeric(pd.Series(values, copy=False), errors="coerce").to_numpy(np.float64)
    if column.clock is not None:  # HHMM as written: minutes, as the schema's bounds are
        numbers = minutes_or_nan(numbers)
    return numbers, missing


def numeric_codes(
    values: np.ndarray, low: float, high: float, bins: int = BINS, column: Column | None = None
) -> np.ndarray:
    """Equal-width bin of each value (strings or numbers) over the public [low, high]; `bins`
    for a missing cell, `bins + 1` (the `other` bucket) for a value outside the bounds or not a
    number. A zero-width range has one bin."""
    if column is not None:
        numbers, missing = lenient_numbers(values, column)
    else:
        numbers = pd.to_numeric(pd.Series(values, copy=False), errors="coerce").to_numpy(np.float64)
        missing = missing_mask(values)
    inside = (numbers >= low) & (numbers <= high)  # False for NaN
    if high > low:
        scaled = np.floor((numbers - low) / ((high - low) / bins))
        codes = np.clip(np.nan_to_num(scaled, nan=0.0), 0, bins - 1).astype(np.int32)
    else:
        codes = np.zeros(len(numbers), dtype=np.int32)
    codes[~inside] = bins + 1
    codes[missing] = bins
    return codes


def category_codes(values: np.ndarray, column: Column) -> np.ndarray:
    """Index of each value in the schema's levels; unlisted values go to the declared `other`
    category when there is one, else to the explicit bucket len(levels)."""
    if column.type == "boolean":
        probe = RawTable((column.name,), (values,), "evaluate")
        codes = level_codes(probe, column, strict=False).astype(np.int32)
    else:
        codes = pd.Index(column.levels).get_indexer(values).astype(np.int32)  # −1: unlisted
    fallback = column.levels.index(column.other) if column.other is not None else len(column.levels)
    codes[codes < 0] = fallback
    return codes


def discretise(raw: RawTable, schema: Schema, bins: int = BINS) -> Discretised:
    """The used columns of `raw` as public bucket codes (see the module docstring). The caller
    checks that the columns exist (`KeyError` otherwise)."""
    columns = marginal_columns(schema)
    codes = np.empty((raw.n, len(columns)), dtype=np.int32)
    other: dict[str, float] = {}
    for j, column in enumerate(columns):
        if column.name not in raw.header:
            raise KeyError(column.name)
        values = raw.column(column.name)
        if column.is_numeric:
            assert column.min is not None and column.max is not None
            codes[:, j] = numeric_codes(values, column.min, column.max, bins, column)
            extra = bins + 1
        else:
            codes[:, j] = category_codes(values, column)
            extra = len(column.levels)
        share = float(np.count_nonzero(codes[:, j] == extra)) / max(raw.n, 1)
        if share > 0:
            other[column.name] = share
    sizes = tuple(bucket_count(c, bins) for c in columns)
    return Discretised(tuple(c.name for c in columns), codes, sizes, other)


def _joint(codes: np.ndarray, subset: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """One int64 cell index per row for the columns `subset` (mixed radix)."""
    index = codes[:, subset[0]].astype(np.int64)
    for j in subset[1:]:
        index *= sizes[j]
        index += codes[:, j]
    return index


def marginal_tvd(a: Discretised, b: Discretised, subset: Sequence[int]) -> float:
    """TVD between the marginals of `a` and `b` over the columns `subset` (indices)."""
    sizes = a.sizes
    cells = math.prod(sizes[j] for j in subset)
    if cells >= 2**62:  # beyond a mixed-radix int64 index: count the occupied rows directly
        keys = np.concatenate([a.codes[:, subset], b.codes[:, subset]])
        _, inverse = np.unique(keys, axis=0, return_inverse=True)
        return _tvd_from_inverse(inverse.reshape(-1), a.n, b.n)
    index_a, index_b = _joint(a.codes, subset, sizes), _joint(b.codes, subset, sizes)
    if cells <= _DENSE_CELLS:
        p = np.bincount(index_a, minlength=cells) / a.n
        q = np.bincount(index_b, minlength=cells) / b.n
        return float(0.5 * np.abs(p - q).sum())
    _, inverse = np.unique(np.concatenate([index_a, index_b]), return_inverse=True)
    return _tvd_from_inverse(inverse, a.n, b.n)


def _tvd_from_inverse(inverse: np.ndarray, n_a: int, n_b: int) -> float:
    cells = int(inverse.max()) + 1
    p = np.bincount(inverse[:n_a], minlength=cells) / n_a
    q = np.bincount(inverse[n_a:], minlength=cells) / n_b
    return float(0.5 * np.abs(p - q).sum())


def three_way_subsets(
    n_columns: int, count: int = TRIPLES, seed: int = TRIPLES_SEED
) -> list[tuple[int, int, int]]:
    """`count` distinct column triples (sorted indices) drawn from the column count and the
    seed alone (public), or every triple when there are at most `count`."""
    if math.comb(n_columns, 3) <= count:
        return list(itertools.combinations(range(n_columns), 3))
    rng = np.random.default_rng(seed)
    chosen: set[tuple[int, int, int]] = set()
    while len(chosen) < count:
        a, b, c = sorted(int(i) for i in rng.choice(n_columns, size=3, replace=False))
        chosen.add((a, b, c))
    return sorted(chosen)


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "max": None, "count": 0}
    return {"mean": float(np.mean(values)), "max": float(np.max(values)), "count": len(values)}


def marginal_fidelity(
    synthetic: RawTable,
    real: RawTable,
    schema: Schema,
    bins: int = BINS,
    triples: int = TRIPLES,
    seed: int = TRIPLES_SEED,
) -> dict[str, Any]:
    """1-, 2- and 3-way marginal TVDs of `synthetic` against `real` (see the module docstring).

    Returns a JSON-ready dict: `one_way` (mean, max, count, per_column), `two_way` (mean, max,
    count, the `worst` pairs), `three_way` (mean, max, count, seed, the `subsets` by name),
    `other_share` per table, and the binning rule."""
    syn, ref = discretise(synthetic, schema, bins), discretise(real, schema, bins)
    names = syn.names
    per_column = {names[j]: marginal_tvd(syn, ref, (j,)) for j in range(len(names))}
    pairs = list(itertools.combinations(range(len(names)), 2))
    pair_tvd = [marginal_tvd(syn, ref, pair) for pair in pairs]
    worst = sorted(zip(pair_tvd, pairs, strict=True), reverse=True)[:_WORST]
    subsets = three_way_subsets(len(names), triples, seed)
    triple_tvd = [marginal_tvd(syn, ref, subset) for subset in subsets]
    return {
        "bins": bins,
        "binning": (
            f"numbers: {bins} equal-width bins over the schema's public [min, max]; categories: "
            "the schema's list; values outside either: an explicit 'other' bucket (or the "
            "schema's declared 'other' category)"
        ),
        "columns": len(names),
        "one_way": _summary(list(per_column.values())) | {"per_column": per_column},
        "two_way": _summary(pair_tvd)
        | {"worst": [{"columns": [names[i] for i in p], "tvd": v} for v, p in worst]},
        "three_way": _summary(triple_tvd)
        | {"seed": seed, "requested": triples, "subsets": [[names[i] for i in s] for s in subsets]},
        "other_share": {"synthetic": syn.other_share, "real": ref.other_share},
    }
