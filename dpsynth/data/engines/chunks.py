"""A large table's files, and its chunks as the raw strings every engine encodes the same way.

A source is `csv:FILE` or `parquet:PATH`, where PATH is a file, a folder (every `*.parquet`
file below it, in path order: a partitioned data set; the partition keys of `key=value`
folder names are not columns) or a glob (`data/part-*.parquet`). The Parquet footers are
checked before any row is read: each column's type (nested and unsupported types refused, as
for one file) and the same column names and types in every file (a partition whose schema
differs is refused, naming it). N is the sum of the footers' row counts, as the in-memory
reader's N is the rows it read.

A chunk (a pandas frame of strings, or an Arrow record batch) becomes a `RawTable` of
stripped strings: Arrow columns through the same canonical text as `dpsynth.data.parquetfile`,
so that `dpsynth.data.discrete.codes_from_raw` gives the codes the in-memory path gives.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpsynth.data.csvtable import RawTable, header_names
from dpsynth.data.discrete import TypedChunk
from dpsynth.data.parquetfile import _check_type, _texts, _TimeColumn
from dpsynth.data.schema import Schema
from dpsynth.errors import DataError, UsageError

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class TableFiles:
    """The files of a table source: `kind` "csv" or "parquet", absolute paths in order."""

    kind: str
    paths: tuple[str, ...]
    name: str  # the spec as given, for messages

    @property
    def size_bytes(self) -> int:
        """The files' size on disk."""
        return sum(Path(p).stat().st_size for p in self.paths)


def table_files(spec: str) -> TableFiles:
    """The files of `csv:FILE` or `parquet:FILE|FOLDER|GLOB` (UsageError when there are none)."""
    kind, sep, given = spec.partition(":")
    if not sep or kind not in ("csv", "parquet") or not given:
        raise UsageError(f"{spec!r}: an engine reads csv:FILE or parquet:FILE|FOLDER|GLOB")
    path = Path(given).expanduser()
    if kind == "parquet" and _GLOB_CHARS & set(given):
        paths = sorted(str(Path(p).resolve()) for p in glob.glob(str(path), recursive=True))
        paths = [p for p in paths if Path(p).is_file()]
    elif kind == "parquet" and path.is_dir():
        paths = sorted(str(p.resolve()) for p in path.rglob("*.parquet") if p.is_file())
    elif path.is_file():
        paths = [str(path.resolve())]
    else:
        raise UsageError(f"no such file or folder: {given}")
    if not paths:
        raise UsageError(f"{spec}: no *.parquet file in this partitioned Parquet folder or glob")
    return TableFiles(kind, tuple(paths), spec)


def footer_rows(path: str) -> int | None:
    """A Parquet file's row count from its footer (None when it cannot be read: the reader
    that reads it then says why, in its own words)."""
    try:
        return int(pq.read_metadata(path).num_rows)
    except (pa.ArrowException, OSError, ValueError):
        return None


def parquet_rows(files: TableFiles) -> tuple[tuple[str, ...], int]:
    """The header and row count from the footers, every file's schema checked first: each
    column's type, and the same names and types in every file (DataError, one line)."""
    first: pa.Schema | None = None
    rows = 0
    for path in files.paths:
        try:
            metadata = pq.read_metadata(path)
            schema = metadata.schema.to_arrow_schema()
        except (pa.ArrowException, OSError, ValueError) as exc:
            line = (
                str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            )
            raise DataError(f"{path}: not a readable Parquet file ({line})") from None
        if first is None:
            first = schema
            header = header_names(list(schema.names), path)
            for field, column in zip(schema, header, strict=True):
                _check_type(field.type, column, path)
        elif not schema.equals(first):
            raise DataError(
                f"{path}: its schema differs from {files.paths[0]}'s ({_diff(first, schema)}); "
                "every partition must have the same columns and types"
            )
        rows += metadata.num_rows
    assert first is not None
    return tuple(first.names), rows


def _diff(first: pa.Schema, other: pa.Schema) -> str:
    if first.names != other.names:
        return f"columns {', '.join(other.names[:6])} against {', '.join(first.names[:6])}"
    for a, b in zip(first, other, strict=True):
        if not a.type.equals(b.type):
            return f"column {a.name!r} is {b.type} there, {a.type} here"
    return "field metadata"


def raw_from_frame(frame: pd.DataFrame, source: str) -> RawTable:
    """A chunk of CSV text cells (None or NaN: an empty cell) as stripped strings."""
    columns = []
    for i in range(frame.shape[1]):
        values = frame.iloc[:, i].to_numpy(dtype=object)
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        texts = np.asarray([str(u).strip() for u in uniques.tolist()] + [""], dtype=object)
        columns.append(texts[np.where(codes < 0, len(texts) - 1, codes)])
    header = tuple(str(c).strip() for c in frame.columns)
    return RawTable(header, tuple(columns), source)


def raw_from_batch(
    batch: pa.RecordBatch,
    source: str,
    schema: Schema | None,
    text: Sequence[str] = (),
    header: Sequence[str] | None = None,
) -> RawTable:
    """An Arrow record batch as the canonical stripped strings of `dpsynth.data.parquetfile`
    (dates and timestamps in the schema's `format` where it gives one), except the integer,
    float64 and decimal columns the schema types as numbers: those stay float64 (a
    `TypedChunk`), the values their text would parse to, without the text (but for those named
    in `text`, whose canonical text is kept beside: a release counts the decimals a number is
    written with); and text columns stay dictionary-encoded (their distinct values converted
    once). `header`: the file's columns, when the batch holds only some of them (the others,
    unused, are empty placeholders)."""
    formats = {c.name: c for c in schema.columns if c.format} if schema is not None else {}
    columns_of = schema.columns if schema is not None else ()
    numeric = {c.name for c in columns_of if c.is_numeric and not c.is_time}
    kept_text = set(text)
    columns: list[np.ndarray] = []
    numbers: dict[str, np.ndarray] = {}
    categories: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    # the placeholder text of the columns held typed (one array shared by all of them)
    blank = np.full(batch.num_rows, "", dtype=object)
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_dictionary(array.type) and _is_text(array.type.value_type):
            # a text column read with its Parquet dictionary (`read_dictionary`): its indices
            # and values as they are, the same pair as `dictionary_encode` of the decoded text
            # gives (a value that appears twice or not at all changes no code and no hash)
            categories[name] = _text_categories(array.dictionary, array.indices)
            columns.append(blank)
            continue
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        kind = array.type
        if name in numeric and (
            pa.types.is_integer(kind) or kind == pa.float64() or pa.types.is_decimal(kind)
        ):
            values = pc.cast(array, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            numbers[name] = np.asarray(values, dtype=np.float64)
            # its canonical text too when asked (no blanks to strip in a number's text)
            columns.append(_texts(array) if name in kept_text else blank)
            continue
        if _is_text(kind):
            # text stays dictionary-encoded: one Python string per distinct value
            encoded = pc.dictionary_encode(array)
            categories[name] = _text_categories(encoded.dictionary, encoded.indices)
            columns.append(blank)
            continue
        if pa.types.is_temporal(kind):
            builder = _TimeColumn(formats.get(name))
            builder.add(array)
            texts = builder.values()
        else:
            texts = _texts(array)
        codes, uniques = pd.factorize(texts, use_na_sentinel=False)
        stripped = np.asarray([str(u).strip() for u in uniques.tolist()], dtype=object)
        columns.append(stripped[codes])
    names = tuple(batch.schema.names)
    if header is not None and tuple(header) != names:  # the unused columns, unread
        by_name = dict(zip(names, columns, strict=True))
        names = tuple(header)
        columns = [by_name.get(name, blank) for name in names]
    if numbers or categories:
        return TypedChunk(names, tuple(columns), source, numbers, categories)
    return RawTable(names, tuple(columns), source)


def _is_text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _text_categories(dictionary: pa.Array, indices: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 indices, stripped distinct values + "" for a null) of a dictionary-encoded text
    column: one Python string per distinct value."""
    uniques = ["" if u is None else str(u).strip() for u in dictionary.to_pylist()] + [""]
    filled = pc.fill_null(indices, pa.scalar(len(uniques) - 1, indices.type))
    index_array = filled.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return index_array, np.asarray(uniques, dtype=object)
