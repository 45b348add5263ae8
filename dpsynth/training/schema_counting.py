"""The exact counts of a DP schema release, made from a table's rows (a whole table in memory,
or one chunk of an engine's pass) for `dpsynth.training.schema_entries.apply_release`.

A chunk an engine reads from Parquet may hold its numbers typed and its text
dictionary-encoded (`dpsynth.data.discrete.TypedChunk`): the numbers are read with
`chunk_numbers` and a text column is tallied once per distinct value, which gives the counts
its text would give."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import torch

from dpsynth.data.column_values import missing_mask
from dpsynth.data.csvtable import RawTable
from dpsynth.data.discrete import chunk_numbers
from dpsynth.data.schema import Column, Schema
from dpsynth.privacy.releases.schema_counts import (
    RangeCounts,
    ShapeCounts,
    boolean_counts,
    category_tally,
    decimal_counts,
    range_counts,
    shape_counts,
)
from dpsynth.privacy.releases.schema_plan import SchemaReleasePlan
from dpsynth.training.schema_entries import (
    AppliedRelease,
    ReleaseColumns,
    apply_release,
    number_spec,
)


def boolean_codes(raw: RawTable, column: Column) -> np.ndarray:
    """0 false, 1 true, 2 missing (or anything else) for a boolean column's cells."""
    values = np.char.lower(raw.column(column.name).astype(str))
    false, true = (c.lower() for c in column.categories)
    codes = np.where(values == false, 0, np.where(values == true, 1, 2))
    return np.where(missing_mask(raw.column(column.name)), 2, codes)


def count_ranges(raw: RawTable, columns: ReleaseColumns) -> RangeCounts:
    """Round 1's exact counts of these rows."""
    return RangeCounts(
        {c.name: _tally(raw, c.name) for c in columns.categorical},
        {
            c.name: range_counts(chunk_numbers(raw, c, lenient=True), c.type)
            for c in columns.numbers
        },
    )


def _tally(raw: RawTable, name: str) -> Counter[str]:
    """`category_tally` of a column, counted per distinct value when the chunk holds it
    dictionary-encoded."""
    typed = getattr(raw, "categories", {}).get(name)
    if typed is None:
        return category_tally(raw.column(name))
    indices, uniques = typed
    tally: Counter[str] = Counter()
    counts = np.bincount(indices, minlength=len(uniques))
    for value, count in zip(uniques.tolist(), counts.tolist(), strict=True):
        if count:
            tally[str(value)] += int(count)
    return tally


def count_shapes(
    raw: RawTable, columns: ReleaseColumns, grids: Mapping[str, np.ndarray]
) -> ShapeCounts:
    """Round 2's exact counts of these rows, over the fine grids of the numbers round 1 kept."""
    out = ShapeCounts()
    for column in columns.numbers:
        if column.name not in grids:
            continue
        values = chunk_numbers(raw, column, lenient=True)
        out.numbers[column.name] = shape_counts(values, grids[column.name], column.type)
        if number_spec(column).decimals:
            out.decimals[column.name] = decimal_counts(raw.column(column.name), values)
    for column in columns.booleans:
        out.booleans[column.name] = boolean_counts(boolean_codes(raw, column))
    return out


def release_in_memory(
    raw: RawTable,
    schema: Schema,
    columns: ReleaseColumns,
    plan: SchemaReleasePlan,
    generator: torch.Generator,
    source: str,
) -> AppliedRelease:
    """The release on a table held in memory (each round's counts from its rows)."""
    return apply_release(
        schema,
        columns,
        plan,
        generator,
        source,
        lambda: count_ranges(raw, columns),
        lambda grids: count_shapes(raw, columns, grids),
    )
