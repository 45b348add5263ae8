"""Synthetic rows as Parquet: the Arrow types of the public schema, and the file's writer.

The Arrow schema is built from the dpsynth schema's column types alone, never from a batch's
values, so every batch of a release has the same one (and an empty batch would too):

| schema type   | Arrow type                                   | missing cell |
|---------------|----------------------------------------------|--------------|
| `numeric`     | float64                                      | null (NaN)   |
| `integer`     | int64                                        | null         |
| `datetime`    | timestamp[us], in the column's `timezone`    | null (NaT)   |
|               | (whole seconds when its `format` has no %f)  |              |
| `date`        | date32                                       | null (NaT)   |
| `boolean`     | bool                                         | null         |
| `categorical` | string (the category as the file spells it)  | null for ""  |
| `id`          | string                                       |              |
| `ignored`     | string, every cell null                      | null         |

A type this table does not know is written as strings. `ParquetRows` streams a release's
record batches (`sampling.arrow_rows`, whose categorical columns are dictionary-encoded: the
writer stores their indices and dictionary pages as they are, with no string hashed per cell)
into one file (`pyarrow.parquet.ParquetWriter`), in row groups of `ROWS_PER_GROUP` rows; the
file declares the release's Arrow schema above (`ARROW:schema`), so readers get the
categories as strings. `sampling.rows_out` opens it for `sample --out FILE.parquet`.
`frame_to_arrow` converts a decoded frame (`TableCodec.decode`) to the same types.
"""

from __future__ import annotations

import base64
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsynth.data.schema import Column, Schema

# Rows per Parquet row group: sampling batches are gathered into groups of this many rows.
ROWS_PER_GROUP = 65_536
_STRING_TYPES = ("categorical", "id", "ignored")
# The key of the file metadata where Arrow readers find a Parquet file's Arrow schema.
ARROW_SCHEMA = "ARROW:schema"


def arrow_type(column: Column) -> pa.DataType:
    """The Arrow type of a schema column (see the module docstring)."""
    kind = str(column.type)
    if kind == "numeric":
        return pa.float64()
    if kind == "integer":
        return pa.int64()
    if kind == "datetime":
        return pa.timestamp("us", tz=getattr(column, "timezone", None) or None)
    if kind == "date":
        return pa.date32()
    if kind == "boolean":
        return pa.bool_()
    return pa.string()


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of a release: the columns in file order, typed by `arrow_type`."""
    return pa.schema([pa.field(c.name, arrow_type(c), nullable=True) for c in schema.columns])


def frame_to_arrow(frame: pd.DataFrame, schema: Schema) -> pa.Table:
    """A decoded frame (`TableCodec.decode`) as an Arrow table of `arrow_schema(schema)`."""
    target = arrow_schema(schema)
    arrays = [
        column_array(frame[column.name], column, target.field(column.name).type)
        for column in schema.columns
    ]
    return pa.Table.from_arrays(arrays, schema=target)


def column_array(values: pd.Series, column: Column, kind: pa.DataType) -> pa.Array:
    """A decoded frame's column (or a series of the same cells) as an Arrow array of `kind`."""
    name = str(column.type)
    n = len(values)
    if name == "ignored":
        return pa.nulls(n, pa.string())
    if name == "numeric":
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        return pa.array(numbers, type=kind, from_pandas=True)
    if name == "integer":
        whole = pd.array(pd.to_numeric(values, errors="coerce"), dtype="Float64").astype("Int64")
        return pa.array(whole, type=kind, from_pandas=True)
    if name == "boolean":
        return pa.array(_truth(values, column), type=kind, from_pandas=True)
    if name in ("datetime", "date"):
        stamps = pd.Series(values)
        if not isinstance(stamps.dtype, pd.DatetimeTZDtype) and stamps.dtype.kind != "M":
            stamps = pd.to_datetime(stamps, errors="coerce")
        if name == "date":
            if isinstance(stamps.dtype, pd.DatetimeTZDtype):
                stamps = stamps.dt.tz_localize(None)  # the wall date of the column's zone
            stamps = stamps.dt.normalize()
        elif "%f" not in (getattr(column, "format", None) or ""):
            stamps = stamps.dt.floor("s")  # the precision the column's format writes
        return pa.array(stamps, from_pandas=True).cast(kind, safe=False)
    texts = np.asarray(values, dtype=object)
    empty_is_null = name == "categorical" or name not in _STRING_TYPES
    try:  # decoded cells are str (or missing): converted in C, a 10× faster path at scale
        strings = pa.array(texts, type=pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # another Python type: str() of each cell
        return pa.array(_strings(texts, empty_is_null), type=kind)
    if empty_is_null:
        strings = pc.if_else(pc.equal(strings, ""), pa.scalar(None, pa.string()), strings)
    return strings.cast(kind)


def _strings(values: np.ndarray, empty_is_null: bool) -> list[Any]:
    """Cells as str; None for a missing one (NaN, None, and "" when `empty_is_null`)."""
    out: list[Any] = []
    for value in values.tolist():
        if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
            out.append(None)
        else:
            text = str(value)
            out.append(None if empty_is_null and text == "" else text)
    return out


def _truth(values: pd.Series, column: Column) -> pd.arrays.BooleanArray:
    """A boolean column as pandas booleans: as decoded, or from the file's two spellings."""
    if pd.api.types.is_bool_dtype(values.dtype):
        return pd.array(values, dtype="boolean")
    texts = pd.Series(values, dtype=object)
    spellings = tuple(getattr(column, "categories", ()) or ("false", "true"))
    truth = pd.array(texts == spellings[-1], dtype="boolean")
    truth[~texts.isin(spellings[-2:]).to_numpy()] = pd.NA
    return truth


class ParquetRows:
    """Record batches of schema `arrow` (`ArrowRows.batch`) streamed into one Parquet file
    through an open binary handle (which stays open), declared as the release's schema
    `public`, with the writer's `options` (`ArrowRows.writer_options`): a context manager that
    always closes its writer."""

    def __init__(
        self, handle: IO[bytes], arrow: pa.Schema, public: pa.Schema, **options: Any
    ) -> None:
        self.arrow, self.public = arrow, public
        # The file's own Arrow schema is the release's (`public`), added when it closes: the
        # writer would otherwise store the batches' dictionary types, and readers would get
        # categorical columns as dictionaries where the release promises strings.
        self._writer = pq.ParquetWriter(handle, arrow, store_schema=False, **options)
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append a batch; every full row group of ROWS_PER_GROUP rows is written at once."""
        self._pending.append(batch)
        self._rows += batch.num_rows
        while self._rows >= ROWS_PER_GROUP:
            table = pa.Table.from_batches(self._pending, schema=self.arrow)
            self._writer.write_table(table.slice(0, ROWS_PER_GROUP), ROWS_PER_GROUP)
            rest = table.slice(ROWS_PER_GROUP)
            self._pending, self._rows = rest.to_batches(), rest.num_rows

    def __enter__(self) -> ParquetRows:
        return self

    def __exit__(self, *exc: object) -> None:
        # Closed on an error too: an unclosed writer would write its footer when collected,
        # to a handle closed by then ("Exception ignored" on stderr).
        try:
            if exc[0] is None:
                if self._pending:
                    table = pa.Table.from_batches(self._pending, schema=self.arrow)
                    self._writer.write_table(table, ROWS_PER_GROUP)
                self._writer.add_key_value_metadata({ARROW_SCHEMA: _schema_text(self.public)})
        finally:
            self._writer.close()


def _schema_text(schema: pa.Schema) -> str:
    """An Arrow schema as Parquet files carry it under `ARROW:schema`: its IPC serialisation,
    base64-encoded (what `ParquetWriter` writes with `store_schema`)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")
