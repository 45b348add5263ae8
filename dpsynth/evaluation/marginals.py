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

Counting is exact and additive (`MarginalCounts`): a table is discretised chunk by chunk
(int32 codes [rows, columns]) and each marginal's int64 cell counts are summed over the chunks,
one `numpy.bincount` per marginal and chunk into a dense vector while the marginals' dense
cells fit `_DENSE_BUDGET`, else `numpy.unique` counts of the occupied cells. The figures are
therefore the same however the rows are split (one table in memory, or a partitioned Parquet
release read batch by batch), and memory holds one chunk's codes and the counts, never the
table. A chunk read from Parquet (`dpsynth.data.engines.chunks.raw_from_batch`) brings its
numbers as float64 and its text dictionary-encoded; both are binned as their text would be.
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
# A joint domain up to this many cells is counted densely (an int64 vector), while the dense
# vectors of one table's marginals stay within _DENSE_BUDGET cells; the others count the
# occupied cells only.
_DENSE_CELLS = 1 << 22
_DENSE_BUDGET = 1 << 23
# Occupied cells of a sparse marginal waiting to be merged, at least (amortises the merge).
_MERGE_ROWS = 1 << 16
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
    return _binned(numbers, missing, low, high, bins)


def _binned(
    numbers: np.ndarray, missing: np.ndarray, low: float, high: float, bins: int
) -> np.ndarray:
    inside = (numbers >= low) & (numbers <= high)  # False for NaN
    if high > low:
        scaled = np.floor((numbers - low) / ((high - low) / bins))
        codes = np.clip(np.nan_to_num(scaled, nan=0.0), 0, bins - 1).astype(np.int32)
    else:
        codes = np.zeros(len(numbers), dtype=np.int32)
    codes[~inside] = bins + 1
    codes[missing] = bins
    return codes


def _typed_codes(raw: RawTable, column: Column, bins: int) -> np.ndarray | None:
    """A Parquet chunk's codes of a column it holds typed (`TypedChunk`), else None: float64
    numbers (NaN: a null, a missing cell) binned, or dictionary-encoded text looked up once per
    distinct value; the codes its canonical text would get."""
    numbers = getattr(raw, "numbers", {}).get(column.name)
    if numbers is not None and column.is_numeric:
        assert column.min is not None and column.max is not None
        missing = np.isnan(numbers)
        if column.clock is not None:  # HHMM: minutes, as the schema's bounds are
            numbers = minutes_or_nan(numbers)
        return _binned(numbers, missing, column.min, column.max, bins)
    typed = getattr(raw, "categories", {}).get(column.name)
    if typed is not None and not column.is_numeric:
        indices, uniques = typed
        return category_codes(uniques, column)[indices]
    return None


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
        typed = _typed_codes(raw, column, bins)
        if typed is not None:
            codes[:, j] = typed
        elif column.is_numeric:
            assert column.min is not None and column.max is not None
            values = raw.column(column.name)
            codes[:, j] = numeric_codes(values, column.min, column.max, bins, column)
        else:
            codes[:, j] = category_codes(raw.column(column.name), column)
        extra = bucket_count(column, bins) - 1
        share = float(np.count_nonzero(codes[:, j] == extra)) / max(raw.n, 1)
        if share > 0:
            other[column.name] = share
    sizes = tuple(bucket_count(c, bins) for c in columns)
    return Discretised(tuple(c.name for c in columns), codes, sizes, other)


def _keys(codes: np.ndarray, subset: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Each row's cell of the columns `subset`: one int64 (mixed radix), or its codes as a row
    [rows, len(subset)] when the joint domain is beyond an int64 index."""
    if math.prod(sizes[j] for j in subset) >= 2**62:
        return np.ascontiguousarray(codes[:, subset])
    index = codes[:, subset[0]].astype(np.int64)
    for j in subset[1:]:
        index *= sizes[j]
        index += codes[:, j]
    return index


def _unique(keys: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (sorted; rows when 2-D) and their summed int64 weights (1 each)."""
    axis = 0 if keys.ndim == 2 else None
    distinct, inverse = np.unique(keys, axis=axis, return_inverse=True)
    inverse = inverse.reshape(-1)
    if weights is None:
        return distinct, np.bincount(inverse, minlength=len(distinct)).astype(np.int64)
    summed = np.bincount(inverse, weights=weights, minlength=len(distinct))
    return distinct, np.rint(summed).astype(np.int64)


class SubsetCounts:
    """Exact int64 counts of one marginal's cells, summed chunk by chunk: a dense vector over
    the joint domain, or the occupied cells (sorted keys, counts) when `dense` is false."""

    def __init__(self, subset: Sequence[int], sizes: Sequence[int], dense: bool) -> None:
        self.subset = tuple(subset)
        self.sizes = tuple(sizes)
        self.cells = math.prod(self.sizes[j] for j in self.subset)
        self.dense = np.zeros(self.cells, dtype=np.int64) if dense else None
        self._keys: np.ndarray | None = None
        self._counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, codes: np.ndarray) -> None:
        """Add one chunk's codes [rows, columns]."""
        keys = _keys(codes, self.subset, self.sizes)
        if self.dense is not None:
            self.dense += np.bincount(keys, minlength=self.cells)
            return
        self._pending.append(_unique(keys))
        waiting = sum(len(k) for k, _ in self._pending)
        if waiting > max(_MERGE_ROWS, 0 if self._keys is None else len(self._keys)):
            self._merge()

    def _merge(self) -> None:
        parts = self._pending if self._keys is None else [(self._keys, self._counts)]
        if self._keys is not None:
            parts += self._pending
        self._pending = []
        if parts:
            keys = np.concatenate([k for k, _ in parts])
            self._keys, self._counts = _unique(keys, np.concatenate([c for _, c in parts]))

    def occupied(self) -> tuple[np.ndarray, np.ndarray]:
        """The occupied cells (sorted keys) and their counts."""
        if self.dense is not None:
            cells = np.flatnonzero(self.dense)
            return cells, self.dense[cells]
        self._merge()
        if self._keys is None:
            return np.zeros(0, dtype=np.int64), self._counts
        return self._keys, self._counts

    def count_of_last(self) -> int:
        """The count of a 1-way marginal's last bucket (its column's `other`)."""
        last = self.cells - 1
        if self.dense is not None:
            return int(self.dense[last])
        keys, counts = self.occupied()
        return int(counts[keys.reshape(len(keys), -1)[:, 0] == last].sum())


def subset_tvd(a: SubsetCounts, b: SubsetCounts, rows_a: int, rows_b: int) -> float:
    """TVD between two tables' counts of the same marginal (their rows: `rows_a`, `rows_b`)."""
    n_a, n_b = max(rows_a, 1), max(rows_b, 1)
    if a.dense is not None and b.dense is not None:
        return float(0.5 * np.abs(a.dense / n_a - b.dense / n_b).sum())
    keys_a, counts_a = a.occupied()
    keys_b, counts_b = b.occupied()
    axis = 0 if keys_a.ndim == 2 else None
    _, inverse = np.unique(np.concatenate([keys_a, keys_b]), axis=axis, return_inverse=True)
    inverse = inverse.reshape(-1)
    cells = int(inverse.max()) + 1 if len(inverse) else 0
    p = np.bincount(inverse[: len(keys_a)], weights=counts_a, minlength=cells) / n_a
    q = np.bincount(inverse[len(keys_a) :], weights=counts_b, minlength=cells) / n_b
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


class MarginalCounts:
    """One table's marginal counts (every 1-way and 2-way marginal, the public 3-way triples),
    summed chunk by chunk (`add`): exact, whatever the chunks."""

    def __init__(
        self, schema: Schema, bins: int = BINS, triples: int = TRIPLES, seed: int = TRIPLES_SEED
    ) -> None:
        columns = marginal_columns(schema)
        self.schema, self.bins, self.seed, self.requested = schema, bins, seed, triples
        self.names = tuple(c.name for c in columns)
        self.sizes = tuple(bucket_count(c, bins) for c in columns)
        self.pairs = list(itertools.combinations(range(len(columns)), 2))
        self.triples = three_way_subsets(len(columns), triples, seed)
        self.rows = 0
        self.counts: dict[tuple[int, ...], SubsetCounts] = {}
        dense_left = _DENSE_BUDGET
        for subset in [(j,) for j in range(len(columns))] + self.pairs + self.triples:
            cells = math.prod(self.sizes[j] for j in subset)
            dense = cells <= _DENSE_CELLS and (cells <= dense_left or len(subset) == 1)
            dense_left -= cells if dense else 0
            self.counts[tuple(subset)] = SubsetCounts(subset, self.sizes, dense)

    def add(self, raw: RawTable) -> None:
        """Add one chunk of rows (`discretise`: KeyError for a column it lacks)."""
        codes = discretise(raw, self.schema, self.bins).codes
        for counts in self.counts.values():
            counts.add(codes)
        self.rows += raw.n

    def other_share(self) -> dict[str, float]:
        """The share of each column's cells in its `other` bucket (the non-zero ones)."""
        shares = {}
        for j, name in enumerate(self.names):
            count = self.counts[(j,)].count_of_last()
            if count:
                shares[name] = count / max(self.rows, 1)
        return shares


def compare_counts(synthetic: MarginalCounts, real: MarginalCounts) -> dict[str, Any]:
    """The marginal fidelity of two tables' counts (made with the same schema and settings):
    the dict `marginal_fidelity` returns."""
    names, bins, seed = synthetic.names, synthetic.bins, synthetic.seed

    def tvd(subset: tuple[int, ...]) -> float:
        a, b = synthetic.counts[subset], real.counts[subset]
        return subset_tvd(a, b, synthetic.rows, real.rows)

    per_column = {names[j]: tvd((j,)) for j in range(len(names))}
    pairs = synthetic.pairs
    pair_tvd = [tvd(pair) for pair in pairs]
    worst = sorted(zip(pair_tvd, pairs, strict=True), reverse=True)[:_WORST]
    subsets = synthetic.triples
    triple_tvd = [tvd(tuple(subset)) for subset in subsets]
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
        | {
            "seed": seed,
            "requested": synthetic.requested,
            "subsets": [[names[i] for i in s] for s in subsets],
        },
        "other_share": {"synthetic": synthetic.other_share(), "real": real.other_share()},
    }


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
    counts = [MarginalCounts(schema, bins, triples, seed) for _ in range(2)]
    counts[0].add(synthetic)
    counts[1].add(real)
    return compare_counts(counts[0], counts[1])
