"""One pass over a table for its evaluation: exact marginal counts, a seeded row sample for the
classifiers and the figures, the rows whose target is not a class, and (for a table read out
of core) the content digest, chunk by chunk, so that memory holds one chunk and what is kept.

The row sample is uniform without replacement and reproducible: every row, in file order,
draws a key from `numpy.random.default_rng((SAMPLE_SEED, stream))` (one draw a row, so the
keys do not depend on how the rows are split into chunks), and the `max_rows` rows of the
smallest keys are kept, in file order. A table of at most `max_rows` rows is kept whole, in
its own order: the classifiers then see exactly the rows the in-memory evaluation gave them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpsynth.data.csvtable import RawTable
from dpsynth.data.engines.counting import row_hash_sums, rows_digest
from dpsynth.data.schema import Schema
from dpsynth.data.table_codec import table_content_digest
from dpsynth.evaluation.marginals import MarginalCounts
from dpsynth.evaluation.table_input import TableInput

ML_ROWS = 100_000  # rows the classifiers train on (synthetic) and are tested on (real), at most
SAMPLE_SEED = 0
SAMPLE_RULE = (
    "uniform without replacement: each row a seeded uniform key, the rows of the smallest keys "
    "kept in file order; every row when the table has no more"
)


def number_texts(values: np.ndarray) -> np.ndarray:
    """float64 values as text that parses back to them ("" for NaN: a missing cell); a whole
    number as an integer (an `integer` or HHMM column's text), once per distinct value."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    texts = [
        str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))
        for v in uniques.tolist()
    ]
    return np.asarray([*texts, ""], dtype=object)[codes]


def take_rows(chunk: RawTable, rows: np.ndarray) -> RawTable:
    """Some rows of a chunk as a plain table of text (a Parquet chunk's typed numbers and
    dictionary-encoded text written out, `rows` only)."""
    numbers = getattr(chunk, "numbers", {})
    categories = getattr(chunk, "categories", {})
    columns = []
    for name, column in zip(chunk.header, chunk.columns, strict=True):
        if name in categories:
            indices, uniques = categories[name]
            columns.append(uniques[indices[rows]])
        elif name in numbers:
            columns.append(number_texts(numbers[name][rows]))
        else:
            columns.append(np.asarray(column, dtype=object)[rows])
    return RawTable(chunk.header, tuple(columns), chunk.source)


class RowSample:
    """At most `capacity` rows of the chunks added, uniform and seeded (see the module)."""

    def __init__(self, capacity: int, stream: int) -> None:
        self.capacity = capacity
        self.rng = np.random.default_rng((SAMPLE_SEED, stream))
        self.seen = 0
        self.header: tuple[str, ...] = ()
        self.source = ""
        # kept rows: their keys, their row numbers and their cells, in pieces
        self._pieces: list[tuple[np.ndarray, np.ndarray, RawTable]] = []
        self._held = 0
        self._threshold = np.inf

    def add(self, chunk: RawTable) -> None:
        """Offer a chunk's rows (the next ones in file order)."""
        keys = self.rng.random(chunk.n)
        self.header, self.source = chunk.header, chunk.source
        if self.capacity < 1:
            self.seen += chunk.n
            return
        picked = np.flatnonzero(keys < self._threshold)
        if len(picked) > self.capacity:  # the others cannot be among the smallest keys
            smallest = np.argpartition(keys[picked], self.capacity - 1)[: self.capacity]
            picked = np.sort(picked[smallest])
        if len(picked):
            piece = take_rows(chunk, picked)
            self._pieces.append((keys[picked], self.seen + picked, piece))
            self._held += len(picked)
        self.seen += chunk.n
        if self._held > 2 * self.capacity:
            self._compact()

    def _compact(self) -> None:
        keys = np.concatenate([k for k, _, _ in self._pieces])
        order = np.concatenate([o for _, o, _ in self._pieces])
        joined = _concat([t for _, _, t in self._pieces], self.header, self.source)
        if len(keys) <= self.capacity:
            keep = np.arange(len(keys))
        else:
            keep = np.sort(np.argpartition(keys, self.capacity - 1)[: self.capacity])
        kept = take_rows(joined, keep)
        self._pieces = [(keys[keep], order[keep], kept)]
        self._held = len(keep)
        if self._held >= self.capacity:
            self._threshold = float(keys[keep].max())

    def rows(self) -> RawTable:
        """The sample, in file order."""
        if self._held > self.capacity:
            self._compact()
        keys = [k for k, _, _ in self._pieces]
        order = np.concatenate([o for _, o, _ in self._pieces]) if keys else np.zeros(0, int)
        joined = _concat([t for _, _, t in self._pieces], self.header, self.source)
        return take_rows(joined, np.argsort(order, kind="stable"))


def _concat(tables: list[RawTable], header: tuple[str, ...], source: str) -> RawTable:
    if len(tables) == 1:
        return tables[0]
    if not tables:
        return RawTable(header, tuple(np.empty(0, dtype=object) for _ in header), source)
    columns = tuple(np.concatenate([t.columns[i] for t in tables]) for i in range(len(header)))
    return RawTable(header, columns, source)


@dataclass(frozen=True)
class TablePass:
    """What one pass over a table gave."""

    rows: int
    outside: int  # rows whose target is not one of the schema's classes
    counts: MarginalCounts | None
    sample: RawTable
    digest: str | None


def read_pass(
    table: TableInput,
    schema: Schema,
    *,
    marginals: bool,
    max_rows: int,
    stream: int,
    digest: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> TablePass:
    """Read `table` once (see the module docstring): the marginal counts when `marginals`,
    a sample of at most `max_rows` rows (`stream` tells the tables' seeds apart) and, when
    `digest`, its content digest (the in-memory one, or the engines' for Parquet read out of
    core, as `train` names such a table)."""
    counts = MarginalCounts(schema) if marginals else None
    sample = RowSample(max_rows, stream)
    classes = pd.Index(schema.classes)
    hashes = np.zeros(2, dtype=np.uint64)
    rows = outside = 0
    for chunk in table.chunks():
        if counts is not None:
            counts.add(chunk)
        sample.add(chunk)
        target = chunk.column(schema.target)
        outside += int(np.count_nonzero(classes.get_indexer(target) < 0))
        if digest and table.streamed:
            with np.errstate(over="ignore"):
                hashes += row_hash_sums(chunk, schema)
        rows += chunk.n
        if progress is not None:
            progress(rows, table.n)
    found = None
    if digest:
        if table.raw is not None:
            found = table_content_digest(table.raw, schema)
        else:
            found = rows_digest(schema, rows, hashes)
    return TablePass(rows, outside, counts, sample.rows(), found)
