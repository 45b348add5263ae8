"""A CSV file read as a table of stripped strings, streamed so that large files fit in memory.

The text comes through `dpsynth.data.csvfile.CheckedText` (decompression, UTF-8, the line cap)
and is parsed in chunks of rows; each column holds one shared `str` per distinct value and a
pointer per row. `dpsynth.data.table_codec` parses and encodes the strings under a schema.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth.data.csvfile import CheckedText
from dpsynth.data.limits import MAX_CSV_COLUMNS, MAX_CSV_FIELD_CHARS, over_budget
from dpsynth.errors import DataError

# How much of a name or value a message quotes.
MAX_SHOWN = 40


@dataclass(frozen=True)
class RawTable:
    """A CSV as read: its header and one array of stripped strings per column."""

    header: tuple[str, ...]
    columns: tuple[np.ndarray, ...]
    source: str

    @property
    def n(self) -> int:
        """Number of rows."""
        return len(self.columns[0]) if self.columns else 0

    def column(self, name: str) -> np.ndarray:
        """The values of one column (strings); DataError when the file has no such column."""
        if name not in self.header:
            raise DataError(
                f"{self.source}: has no column {name[:MAX_SHOWN]!r} (its columns: "
                f"{', '.join(self.header[:10])}{', ...' if len(self.header) > 10 else ''})"
            )
        return self.columns[self.header.index(name)]


def read_csv_table(path: Path | str, source: str | None = None) -> RawTable:
    """Read a CSV (plain or compressed, by file name) as stripped strings (DataError if not).

    The text is streamed through its checks (`dpsynth.data.csvfile.CheckedText`:
    decompression, UTF-8, the line cap) into the parser `_ROWS_PER_CHUNK` rows at a time;
    each column keeps one shared string object per distinct value and a pointer per row, so a
    table costs about `BYTES_PER_FIELD` bytes a field whatever its text's width, and the rows
    read so far are checked against the memory budget after every chunk. The header is read
    as written, so a name that appears twice is an error rather than silently renamed; a field
    longer than the cap is refused.
    """
    path = Path(path)
    name = source or str(path)
    header: tuple[str, ...] | None = None
    columns: list[ColumnBuilder] = []
    rows = 0
    try:
        with CheckedText(path, name) as text:
            chunks = pd.read_csv(
                io.BufferedReader(text, buffer_size=1 << 20),
                header=None,
                dtype=str,
                keep_default_na=False,
                na_filter=False,
                skipinitialspace=True,
                encoding="utf-8",
                chunksize=_ROWS_PER_CHUNK,
            )
            for frame in chunks:
                if frame.shape[1] > MAX_CSV_COLUMNS:
                    raise DataError(
                        f"{name}: {frame.shape[1]} columns, more than the cap of {MAX_CSV_COLUMNS}"
                    )
                if header is None:
                    header = header_names(frame.iloc[0].tolist(), name)
                    columns = [ColumnBuilder() for _ in header]
                    frame = frame.iloc[1:]
                for i, (builder, column_name) in enumerate(zip(columns, header, strict=True)):
                    builder.add(frame.iloc[:, i].to_numpy(dtype=object), column_name, rows, name)
                rows += len(frame)
                needed = rows * len(header) * BYTES_PER_FIELD + sum(b.text_bytes for b in columns)
                problem = over_budget(needed)
                if problem:
                    raise DataError(f"{name}: the table's first {rows:,} rows {problem}")
    except pd.errors.EmptyDataError:
        raise DataError(f"{name}: the table has no rows") from None
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{name}: not a readable CSV file ({first})") from None
    if header is None or rows < 1:
        raise DataError(f"{name}: the table has no rows")
    return RawTable(header, tuple(b.values() for b in columns), name)


# Rows parsed at once: the parser's Python strings for one chunk are the reader's peak beside
# the columns (about 60 bytes a field: 100,000 rows × 50 columns ≈ 300 MB).
_ROWS_PER_CHUNK = 100_000
# A parsed field's cost once read: an 8-byte pointer to its column's shared string, twice while
# the chunks are joined.
BYTES_PER_FIELD = 16


def header_names(cells: list[object], name: str) -> tuple[str, ...]:
    """A table's column names, stripped ("Unnamed: i" for a blank one); DataError naming the
    file when a name appears twice (a schema names each column once)."""
    header = tuple(str(c).strip() or f"Unnamed: {i}" for i, c in enumerate(cells))
    seen: set[str] = set()
    for column_name in header:
        if column_name in seen:
            raise DataError(
                f"{name}: the column name {column_name[:MAX_SHOWN]!r} appears twice in the "
                "header; a schema names each column once (rename one)"
            )
        seen.add(column_name)
    return header


class ColumnBuilder:
    """One column read chunk by chunk: each distinct stripped value is one shared `str`."""

    def __init__(self) -> None:
        self.shared: dict[str, str] = {}
        self.parts: list[np.ndarray] = []
        self.text_bytes = 0

    def add(self, values: np.ndarray, column_name: str, offset: int, name: str) -> None:
        """Append a chunk's raw values (DataError for a field over MAX_CSV_FIELD_CHARS)."""
        codes, uniques = pd.factorize(values, use_na_sentinel=False)
        stripped = np.empty(len(uniques), dtype=object)
        for i, value in enumerate(uniques.tolist()):
            text = str(value)
            if len(text) > MAX_CSV_FIELD_CHARS:
                row = offset + int(np.flatnonzero(codes == i)[0])
                raise DataError(
                    f"{name}: column {column_name[:MAX_SHOWN]!r} row {row + 2} holds a field "
                    f"of {len(text)} characters, more than the cap of {MAX_CSV_FIELD_CHARS}"
                )
            text = text.strip()
            shared = self.shared.get(text)
            if shared is None:
                shared = self.shared[text] = text
                self.text_bytes += len(text) + 64  # the str object and its dict slot
            stripped[i] = shared
        self.parts.append(stripped[codes])

    def values(self) -> np.ndarray:
        """The whole column: an object array of stripped strings."""
        return np.concatenate(self.parts) if self.parts else np.empty(0, dtype=object)
