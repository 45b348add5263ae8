"""Generated rows (`CodedRows`) as Arrow record batches, built column by column with numpy and
pyarrow (no pandas, no Python object per cell), for the Parquet writer and the in-memory frame.

Every cell is the one `coded_rows.coded_frame` (and so a CSV sample) holds, typed as
`parquet_out.arrow_schema` says; only the batches' physical types differ from it:

- categorical columns and the target are dictionary arrays: their level indices over the
  column's levels (a "" level a null), which the Parquet writer stores as its dictionary pages
  without hashing a string per cell; `public` casts them to strings (what the file declares);
- booleans and integers are looked up and cast from the codes and numbers, with a null mask;
- numbers are float64 (NaN: null), surrogate keys `<prefix><n>` are made by Arrow's kernels,
  ignored columns are all null;
- dates and times go through the frame's pandas datetimes (`timecols.time_series`) and
  `parquet_out`'s conversion, exactly as before.

`writer_options` says how the Parquet writer stores the columns: dictionary encoding except
for cells that are unique to their row (surrogate keys, numbers without `decimals`, date-times:
a dictionary of them only grows the file and costs time), and column statistics except for the
categorical columns (min and max of a row group of a sample in random order span the
categories, so they would prune nothing; they cost a quarter of the writing).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsynth.data.coded_rows import CodedRows, decoded_numbers
from dpsynth.data.schema import Column, Schema
from dpsynth.data.timecols import time_series
from dpsynth.sampling.parquet_out import arrow_schema, column_array

# The index type of a dictionary-encoded column: Parquet's own (its dictionary pages index
# with 32-bit integers), and room for any public category list.
_INDEX = pa.int32()


class _Levels:
    """A categorical column's (or the target's) levels as an Arrow dictionary, and which of
    them are the empty string (written as null)."""

    def __init__(self, levels: tuple[str, ...]) -> None:
        self.dictionary = pa.array(levels, pa.string())
        empty = np.asarray([level == "" for level in levels], dtype=bool)
        self.empty = empty if empty.any() else None

    def array(self, indices: np.ndarray) -> pa.DictionaryArray:
        indices = np.asarray(indices, dtype=np.int32)
        mask = None if self.empty is None else self.empty[indices]
        return pa.DictionaryArray.from_arrays(indices, self.dictionary, mask=mask)


class ArrowRows:
    """Builds a release's record batches from `CodedRows` (see the module docstring).

    `public` is the release's Arrow schema (`arrow_schema`), `arrow` the batches' own (the
    same with dictionary-encoded categorical columns)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.public = arrow_schema(schema)
        self._levels: dict[str, _Levels] = {}
        self._truth: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        fields = []
        for column, public in zip(schema.columns, self.public, strict=True):
            kind = public.type
            if column.name == schema.target or column.type == "categorical":
                self._levels[column.name] = _Levels(column.levels)
                kind = pa.dictionary(_INDEX, pa.string())
            elif column.type == "boolean":
                levels = np.asarray(column.levels, dtype=object)
                missing = levels == ""
                self._truth[column.name] = (
                    levels == column.categories[1],
                    missing if missing.any() else None,
                )
            fields.append(pa.field(column.name, kind, nullable=True))
        self.arrow = pa.schema(fields)
        unique = [
            c.name
            for c in schema.columns
            if c.type in ("id", "datetime") or (c.type == "numeric" and c.decimals is None)
        ]
        self.writer_options = {
            "use_dictionary": [c.name for c in schema.columns if c.name not in unique],
            "write_statistics": [c.name for c in schema.columns if c.name not in self._levels],
        }

    def batch(self, coded: CodedRows) -> pa.RecordBatch:
        """The rows as a record batch of schema `arrow`."""
        arrays = [self._array(column, coded) for column in self.schema.columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)

    def public_table(self, batches: list[pa.RecordBatch]) -> pa.Table:
        """Batches of `batch` as one table of the release's schema (categories as strings)."""
        return pa.Table.from_batches(batches, schema=self.arrow).cast(self.public)

    def _array(self, column: Column, coded: CodedRows) -> pa.Array:
        name, b = column.name, len(coded)
        if name == self.schema.target:
            return self._levels[name].array(coded.labels)
        if column.type == "ignored":
            return pa.nulls(b, pa.string())
        if column.type == "id":
            given = coded.keys.get(name)
            if given is not None:
                return pa.array(given, pa.string())
            numbers = pa.array(np.arange(coded.start + 1, coded.start + b + 1, dtype=np.int64))
            return pc.binary_join_element_wise(column.prefix, numbers.cast(pa.string()), "")
        if column.type == "categorical":
            return self._levels[name].array(coded.levels[name])
        if column.type == "boolean":
            truth, missing = self._truth[name]
            indices = np.asarray(coded.levels[name], dtype=np.intp)
            mask = None if missing is None else missing[indices]
            return pa.array(truth[indices], pa.bool_(), mask=mask)
        numbers = decoded_numbers(column, coded)
        if column.is_time:
            kind = self.arrow.field(name).type
            return column_array(time_series(numbers, column), column, kind)
        if column.type == "integer":
            absent = np.isnan(numbers)
            whole = np.where(absent, 0.0, numbers).astype(np.int64)
            return pa.array(whole, pa.int64(), mask=absent if absent.any() else None)
        return pa.array(numbers, pa.float64(), from_pandas=True)
