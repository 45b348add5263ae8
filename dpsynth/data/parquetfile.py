"""A Parquet file read as a table of stripped strings: the same `RawTable` a CSV gives.

The file is read with pyarrow in record batches (`ParquetFile.iter_batches`); each Arrow column
becomes canonical text, once per distinct value of a batch, so that the schema, the encoding
and the content digest treat a Parquet file exactly like a CSV holding that text:

- null → "" (a missing cell); integers → decimal text; floats → the shortest text that reads
  back as the same float (`repr`; float32 at its own precision), NaN → ""; decimals as
  floats; booleans → "true" / "false"; strings and dictionaries as they are, stripped;
- dates → `YYYY-MM-DD`; timestamps → `YYYY-MM-DD HH:MM:SS`, with as many fractional digits
  (3, 6 or 9) as the column's finest value needs and none when it has none, and the value's
  UTC offset (`+HH:MM`) when the column has a time zone. Given a `schema` (to read a file
  under a schema drafted elsewhere, e.g. `sample --out FILE.parquet` of a run trained on a
  CSV), a date or timestamp column that the schema types `date` or `datetime` with a `format`
  is written in that format instead (in the column's `timezone` when it has one).

Nested columns (list, struct, map, union) and types without a table cell's meaning (binary,
durations, times of day, intervals) are refused before any row is read, naming the column and
its type. The column cap and the memory budget are checked as for a CSV (the rows the footer
declares, then the rows read so far after every batch). Every problem is a `DataError` (exit
4) in one line naming the file. A folder of partitioned Parquet is not read here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsynth.data.csvtable import (
    BYTES_PER_FIELD,
    MAX_SHOWN,
    ColumnBuilder,
    RawTable,
    header_names,
)
from dpsynth.data.limits import MAX_CSV_COLUMNS, over_budget
from dpsynth.data.schema import TIME_TYPES, Column, Schema
from dpsynth.data.timecols import format_time_series
from dpsynth.errors import DataError

# Rows converted at once: a batch's Arrow buffers and its distinct values' strings are the
# reader's peak beside the columns.
ROWS_PER_BATCH = 65_536
_TIMESPEC = {0: "seconds", 3: "milliseconds", 6: "microseconds", 9: "nanoseconds"}
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_UNREADABLE = "not a readable Parquet file, truncated or corrupt"


def read_parquet_table(
    path: Path | str, source: str | None = None, schema: Schema | None = None
) -> RawTable:
    """Read a Parquet file as stripped strings (see the module docstring; DataError if not).
    `schema`: optional; its time columns' formats are used for date and timestamp columns."""
    path = Path(path)
    name = source or str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except OSError as exc:
        raise DataError(f"{name}: cannot read it ({exc.strerror})") from None
    if path.is_dir():
        raise DataError(f"{name}: a folder; a Parquet table is one file")
    if size == 0:
        raise DataError(f"{name}: the file is empty (0 bytes), not a Parquet file")
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataError(f"{name}: {_UNREADABLE} ({_first_line(exc)})") from None
    try:
        return _read(parquet, name, schema)
    except DataError:
        raise
    except (pa.ArrowException, OSError, ValueError, OverflowError) as exc:
        raise DataError(f"{name}: {_UNREADABLE} ({_first_line(exc)})") from None
    finally:
        parquet.close()


def _read(parquet: pq.ParquetFile, name: str, described: Schema | None) -> RawTable:
    batches = parquet.iter_batches(batch_size=ROWS_PER_BATCH, use_threads=False)
    return read_arrow_batches(
        parquet.schema_arrow, batches, parquet.metadata.num_rows, name, described
    )


def read_arrow_batches(
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    declared: int,
    name: str,
    described: Schema | None = None,
) -> RawTable:
    """Arrow record batches of `schema` (`declared` rows in all) as a `RawTable` of stripped
    strings, converted as a Parquet file's are (see the module docstring): a Parquet file and
    a pandas DataFrame in memory (`dpsynth.data.frames`) share this reader."""
    if len(schema) > MAX_CSV_COLUMNS:
        raise DataError(f"{name}: {len(schema)} columns, more than the cap of {MAX_CSV_COLUMNS}")
    if len(schema) == 0:
        raise DataError(f"{name}: the table has no columns")
    header = header_names(list(schema.names), name)
    for field, column_name in zip(schema, header, strict=True):
        _check_type(field.type, column_name, name)
    problem = over_budget(declared * len(header) * BYTES_PER_FIELD)
    if problem:
        raise DataError(f"{name}: its {declared:,} rows {problem}")
    formats = {c.name: c for c in (described.columns if described else ()) if _formatted(c)}
    columns: list[ColumnBuilder | _TimeColumn] = [
        _TimeColumn(formats.get(column_name)) if pa.types.is_temporal(_value_type(f.type))
        else ColumnBuilder()
        for f, column_name in zip(schema, header, strict=True)
    ]  # fmt: skip
    rows = 0
    for batch in batches:
        for builder, column_name, array in zip(columns, header, batch.columns, strict=True):
            if isinstance(builder, _TimeColumn):
                builder.add(array)
            else:
                builder.add(_texts(array), column_name, rows, name)
        rows += batch.num_rows
        text_bytes = sum(b.text_bytes for b in columns)
        problem = over_budget(rows * len(header) * BYTES_PER_FIELD + text_bytes)
        if problem:
            raise DataError(f"{name}: the table's first {rows:,} rows {problem}")
    if rows < 1:
        raise DataError(f"{name}: the table has no rows")
    return RawTable(header, tuple(b.values() for b in columns), name)


def _formatted(column: Column) -> bool:
    return column.type in TIME_TYPES and bool(column.format)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split())[:160] if text else type(exc).__name__


def _value_type(kind: pa.DataType) -> pa.DataType:
    """A dictionary's value type; any other type itself."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _check_type(kind: pa.DataType, column_name: str, name: str) -> None:
    """DataError for a column whose Arrow type has no table cell's meaning."""
    value = _value_type(kind)
    shown = str(kind) if len(str(kind)) <= 60 else str(kind)[:57] + "..."
    where = f"{name}: column {column_name[:MAX_SHOWN]!r} has the"
    if pa.types.is_nested(value):
        raise DataError(
            f"{where} nested type {shown}; a table holds one value per cell (flatten the column "
            "into columns of its own, or drop it)"
        )
    readable = (
        pa.types.is_null(value)
        or pa.types.is_boolean(value)
        or pa.types.is_integer(value)
        or pa.types.is_floating(value)
        or pa.types.is_decimal(value)
        or pa.types.is_string(value)
        or pa.types.is_large_string(value)
        or str(value) == "string_view"  # pa.types.is_string_view: pyarrow 16 and later
        or pa.types.is_date(value)
        or pa.types.is_timestamp(value)
    )
    if not readable:
        raise DataError(
            f"{where} type {shown}, which is not a table cell dpsynth reads (numbers, text, "
            "booleans, dates and timestamps are; cast the column to one of them, or drop it)"
        )


def _texts(array: pa.Array) -> np.ndarray:
    """A batch's column as canonical strings ("" for null), converted once per distinct value."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_null(array.type):
        return np.full(len(array), "", dtype=object)
    if pa.types.is_decimal(array.type):
        array = pc.cast(array, pa.float64())
    encoded = pc.dictionary_encode(array)
    uniques = _unique_texts(encoded.dictionary)
    codes = pc.fill_null(encoded.indices, len(uniques)).to_numpy(zero_copy_only=False)
    return np.asarray([*uniques, ""], dtype=object)[codes]


def _unique_texts(values: pa.Array) -> list[str]:
    """Canonical text of non-null values (not timestamps: see `_TimestampColumn`)."""
    kind = values.type
    if pa.types.is_boolean(kind):
        return ["true" if v else "false" for v in values.to_pylist()]
    if pa.types.is_integer(kind):
        return [str(v) for v in values.to_pylist()]
    if pa.types.is_floating(kind):
        numbers = values.to_numpy(zero_copy_only=False)
        if kind == pa.float64():
            return ["" if np.isnan(v) else repr(float(v)) for v in numbers]
        return ["" if np.isnan(v) else str(v) for v in numbers]  # shortest at its precision
    return [str(v) for v in values.to_pylist()]


class _TimeColumn:
    """A date or timestamp column kept as Arrow chunks until the whole column is read, then
    written in one format for every row: the schema column's when given, else the canonical
    text (a timestamp with the fractional digits its finest value needs)."""

    def __init__(self, column: Column | None) -> None:
        self.column = column
        self.chunks: list[pa.Array] = []
        self.digits = 0
        self.text_bytes = 0  # the Arrow values kept: 8 bytes a row

    def add(self, array: pa.Array) -> None:
        """Append a batch's values; note the fractional digits its timestamps need."""
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        self.chunks.append(array)
        self.text_bytes += len(array) * 8
        if not pa.types.is_timestamp(array.type):
            return
        unit_digits = _UNIT_DIGITS[array.type.unit]
        if self.digits == unit_digits:
            return
        ticks = pc.drop_null(array.cast(pa.int64())).to_numpy(zero_copy_only=False)
        for digits in range(self.digits, unit_digits + 1, 3):
            if not np.any(ticks % 10 ** (unit_digits - digits)):
                self.digits = digits
                return

    def values(self) -> np.ndarray:
        """The whole column as strings ("" for null)."""
        if not self.chunks:
            return np.empty(0, dtype=object)
        encoded = pc.dictionary_encode(pa.chunked_array(self.chunks)).combine_chunks()
        uniques = self._texts(encoded.dictionary)
        codes = pc.fill_null(encoded.indices, len(uniques)).to_numpy(zero_copy_only=False)
        return np.asarray([*uniques, ""], dtype=object)[codes]

    def _texts(self, values: pa.Array) -> list[str]:
        if self.column is not None:
            zone = values.type.tz if pa.types.is_timestamp(values.type) else None
            micros = pc.cast(values, pa.timestamp("us", zone), safe=False)
            stamps = pd.Series(micros.to_pandas())
            if self.column.timezone and isinstance(stamps.dtype, pd.DatetimeTZDtype):
                stamps = stamps.dt.tz_convert(self.column.timezone)
            return [str(t) for t in format_time_series(stamps, self.column)]
        if pa.types.is_date(values.type):
            return [v.isoformat() for v in values.to_pylist()]
        spec = _TIMESPEC[self.digits]
        return [pd.Timestamp(t).isoformat(sep=" ", timespec=spec) for t in values.to_pandas()]
