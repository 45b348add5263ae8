"""Tables: encoding rows under a public schema for the generators, and decoding them back.

Encoding (what generators train on, `TableData.x`, float32 [N, D]): the schema's feature
columns (all but the target, ignored and identifier columns) in file order; a categorical or
boolean column becomes a one-hot block of its levels (0/1), a numeric, integer, date or time
column one value scaled from its public [min, max] to [-1, 1] (values outside are clipped: a
public, per-row rule) and, when it has `missing` cells, a second block of two (present,
missing) in which a missing cell is (0, 1) and its value 0. The target becomes the label `y`
(its index in the public class list). How cells are parsed is `dpsynth.data.column_values`.

Decoding (`TableCodec.decode`) turns generated rows back into a typed frame in the original
header and column order: categories by sampling each one-hot block as a distribution
(post-processing with the public sampling seed), numbers unscaled (integers rounded, decimals
to the column's precision), missing cells where the missing block says so, dates and times as
pandas datetimes in the column's zone, identifiers as fresh surrogate keys `<prefix><n>`
(numbered across the whole release, never a real value), the target from the labels, ignored
columns empty. It goes through `TableCodec.coded` (the sampled blocks and the numbers as
`coded_rows.CodedRows`) and `coded_rows.coded_frame`, the decoding every output shares.
`csv_text` writes that frame in the file's own spelling (formats, decimals, boolean words,
empty cells).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import pandas as pd
import torch

from dpsynth.data.coded_rows import CodedRows, coded_frame
from dpsynth.data.column_values import (
    check_header,
    check_values,
    column_numbers,
    level_codes,
    table_content_digest,
)
from dpsynth.data.csvtable import RawTable, read_csv_table
from dpsynth.data.images import DataInfo
from dpsynth.data.limits import over_budget
from dpsynth.data.records import MEMORY_ENGINE
from dpsynth.data.schema import Column, Schema
from dpsynth.data.timecols import format_time_series
from dpsynth.errors import DataError

__all__ = [
    "RawTable",
    "TableCodec",
    "TableData",
    "check_header",
    "check_values",
    "encode_table",
    "read_csv_table",
    "table_content_digest",
]


@dataclass(frozen=True)
class Block:
    """One slice of the encoded row: `softmax` (k one-hot) or `tanh` (1). A column with
    missing cells has two: its value (`tanh`) and its `missing` flag (`softmax` of 2)."""

    name: str
    kind: str
    start: int
    size: int
    role: str = "value"  # "value" or "missing"


class TableCodec:
    """Encodes parsed rows under a schema and decodes generated rows back to the file's form."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        blocks: list[Block] = []
        self._blocks_of: dict[str, tuple[Block, Block | None]] = {}
        start = 0
        for column in schema.features:
            if column.is_categorical:
                value = Block(column.name, "softmax", start, len(column.levels))
            else:
                value = Block(column.name, "tanh", start, 1)
            start += value.size
            flag = None
            if column.is_numeric and column.missing:
                flag = Block(column.name, "softmax", start, 2, "missing")
                start += 2
            blocks.extend(b for b in (value, flag) if b is not None)
            self._blocks_of[column.name] = (value, flag)
        self.blocks: tuple[Block, ...] = tuple(blocks)
        self.dim = start

    def column_blocks(self, column: Column) -> tuple[Block, Block | None]:
        """A feature column's value block and its missing-flag block (None without one)."""
        return self._blocks_of[column.name]

    def encode(self, raw: RawTable) -> tuple[torch.Tensor, torch.Tensor]:
        """Features float32 [N, D] and labels int64 [N] (DataError for unreadable values)."""
        check_header(raw, self.schema)
        problem = over_budget(raw.n * self.dim * 4)
        if problem:
            raise DataError(
                f"{raw.source}: its {raw.n:,} rows encoded as {self.dim} values each {problem}"
            )
        out = np.zeros((raw.n, self.dim), dtype=np.float32)
        rows = np.arange(raw.n)
        for column in self.schema.features:
            value, flag = self.column_blocks(column)
            if column.is_categorical:
                out[rows, value.start + level_codes(raw, column)] = 1.0
                continue
            numbers = column_numbers(raw, column)
            absent = np.isnan(numbers)
            out[:, value.start] = np.where(absent, 0.0, _scale(np.nan_to_num(numbers), column))
            if flag is not None:
                out[rows, flag.start + absent.astype(np.int64)] = 1.0
        labels = level_codes(raw, self.schema.target_column)
        return torch.from_numpy(out), torch.from_numpy(labels)

    def decode(
        self, rows: np.ndarray, labels: np.ndarray, rng: np.random.Generator, start: int = 0
    ) -> pd.DataFrame:
        """Generated rows [b, D] with their labels [b] → a typed frame in the file's header and
        order (`start`: the release's row number of the first row, for surrogate keys).

        Each one-hot block is read as a distribution (negative parts clipped, an all-zero block
        uniform) and sampled with `rng`; numbers are unscaled into [min, max] (`coded`, then
        `coded_rows.coded_frame`).
        """
        return coded_frame(self.schema, self.coded(rows, labels, rng, start))

    def coded(
        self, rows: np.ndarray, labels: np.ndarray, rng: np.random.Generator, start: int = 0
    ) -> CodedRows:
        """Generated rows [b, D] with their labels [b] as `CodedRows`: each one-hot block (a
        category, a missing flag) sampled with `rng`, one draw per block in file order, and
        each number's value on the encoding's scale."""
        rows = np.asarray(rows, dtype=np.float64)
        levels: dict[str, np.ndarray] = {}
        scaled: dict[str, np.ndarray] = {}
        absent: dict[str, np.ndarray] = {}
        for column in self.schema.features:
            value, flag = self.column_blocks(column)
            part = rows[:, value.start : value.start + value.size]
            if column.is_categorical:
                levels[column.name] = _sample_blocks(part, rng)
                continue
            scaled[column.name] = part[:, 0]
            if flag is not None:
                absent[column.name] = _sample_blocks(rows[:, flag.start : flag.start + 2], rng) == 1
        return CodedRows(np.asarray(labels, dtype=np.int64), levels, scaled, absent, start)

    def text_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A decoded frame as the file's text: formats, decimals, boolean words, "" missing."""
        out = {}
        for column in self.schema.columns:
            values = frame[column.name]
            if column.is_time:
                out[column.name] = format_time_series(values, column)
            elif column.type == "boolean":
                words = np.where(values.fillna(False).to_numpy(bool), *column.categories[::-1])
                out[column.name] = np.where(values.isna().to_numpy(), "", words)
            elif column.type == "integer":
                out[column.name] = values.astype("string").fillna("").to_numpy(object)
            elif column.type == "numeric":
                fmt = f"%.{column.decimals}f" if column.decimals is not None else "%.7g"
                numbers = values.to_numpy(np.float64)
                texts = np.char.mod(fmt, np.nan_to_num(numbers)).astype(object)
                out[column.name] = np.where(np.isnan(numbers), "", texts)
            else:
                out[column.name] = values.to_numpy(object)
        return pd.DataFrame(out, columns=[c.name for c in self.schema.columns])

    def csv_text(self, frame: pd.DataFrame, header: bool) -> str:
        """The decoded frame as CSV text (header on request), in the file's own spelling;
        floats without declared decimals to 7 significant digits (the float32 precision of the
        encoding: more digits would be noise)."""
        buffer = io.StringIO()
        self.text_frame(frame).to_csv(buffer, index=False, header=header, lineterminator="\n")
        return buffer.getvalue()


def _scale(values: np.ndarray, column: Column) -> np.ndarray:
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    if high == low:
        return np.zeros_like(values, dtype=np.float32)
    # divided before doubled: 2·(v − min) overflows for ranges near the float maximum
    return ((np.clip(values, low, high) - low) / (high - low) * 2.0 - 1.0).astype(np.float32)


def _sample_blocks(part: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    weights = np.clip(part, 0.0, None)
    totals = weights.sum(1, keepdims=True)
    weights = np.where(totals > 0, weights / np.where(totals > 0, totals, 1.0), 1.0 / part.shape[1])
    cumulative = np.cumsum(weights, 1)
    draws = rng.random((len(part), 1)) * cumulative[:, -1:]
    return np.minimum((cumulative < draws).sum(1), part.shape[1] - 1)


@dataclass
class TableData:
    """A table encoded under its public schema, held in memory (the table twin of ImageData).

    x: float32 [N, D] (see the module docstring); y: int64 [N] indices into `classes`.
    """

    x: torch.Tensor
    y: torch.Tensor
    schema: Schema
    spec: str
    kind: str
    content_digest: str = field(repr=False)
    dataset_id: str = ""
    codec: TableCodec | None = field(default=None, repr=False)
    # a privacy unit: its column and the most rows a unit kept (the rows here are bounded)
    unit: str | None = None
    rows_per_unit: int = 1
    unit_codes: torch.Tensor | None = field(default=None, repr=False)  # each row's unit index

    def __post_init__(self) -> None:
        if not self.dataset_id:
            self.dataset_id = self.spec

    @property
    def classes(self) -> tuple[str, ...]:
        """The public label set (the target's categories)."""
        return self.schema.classes

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.x.shape[0])

    @property
    def shape(self) -> tuple[int]:
        """Per-record shape (D,): the encoded width."""
        return (int(self.x.shape[1]),)

    def info(self, fingerprint: str = "") -> DataInfo:
        """The public description: N, (D,), classes, identity (`fingerprint`: the ledger's
        keyed one) and the public schema."""
        return table_info(self, fingerprint)

    def as_float(self) -> torch.Tensor:
        """The encoded rows (already floats on the generator's scale)."""
        return self.x

    # the `Records` interface (`dpsynth.data.records`): the memory engine holds its rows
    engine: ClassVar[str] = MEMORY_ENGINE
    rows_in_memory: ClassVar[bool] = True

    @property
    def sampling_units(self) -> torch.Tensor | None:
        """Each row's unit index when a unit keeps more than one row (the loop then samples
        units), else None."""
        return self.unit_codes if self.rows_per_unit > 1 else None

    def attach_to(self, trainer: object, method: str) -> None:
        """Nothing: the loop hands the trainer the rows, and a marginal trainer counts them."""

    def close(self) -> None:
        """Nothing to release: the rows are held."""


class DescribedTable(Protocol):
    """What a table's public description is made of (`TableData`, an engine's `TableSource`)."""

    spec: str
    kind: str
    dataset_id: str
    schema: Schema

    @property
    def n(self) -> int: ...

    @property
    def shape(self) -> tuple[int]: ...

    @property
    def classes(self) -> Sequence[str]: ...


def table_info(table: DescribedTable, fingerprint: str = "") -> DataInfo:
    """A table's public description: N, (D,), classes, identity (`fingerprint`: the ledger's
    keyed one) and the public schema; the same for rows in memory and rows an engine counts."""
    return DataInfo(
        spec=table.spec,
        kind=table.kind,
        n=table.n,
        shape=table.shape,  # type: ignore[arg-type]
        classes=tuple(table.classes),
        fingerprint=fingerprint,
        dataset_id=table.dataset_id,
        modality="table",
        schema=table.schema.to_json(),
        unit=getattr(table, "unit", None),
        rows_per_unit=int(getattr(table, "rows_per_unit", 1)),
    )


def encode_table(
    raw: RawTable, schema: Schema, spec: str, kind: str, dataset_id: str | None = None
) -> TableData:
    """Parse and encode a raw table under a schema whose entries are all public."""
    codec = TableCodec(schema)
    x, y = codec.encode(raw)
    digest = table_content_digest(raw, schema)
    return TableData(x, y, schema, spec, kind, digest, dataset_id or spec, codec)


def codec_for(info: DataInfo) -> TableCodec:
    """The codec of a table's public description (from the schema it carries)."""
    from dpsynth.data.schema_file import parse_schema

    if info.schema is None:
        raise DataError(f"{info.spec}: the data description carries no schema")
    return TableCodec(parse_schema(info.schema, f"{info.spec} schema"))


def block_layout(info: DataInfo) -> tuple[tuple[str, int], ...]:
    """(kind, size) of each feature block of a table's encoding, for generator output heads."""
    return tuple((b.kind, b.size) for b in codec_for(info).blocks)


def column_values(raw: RawTable, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The named columns' string values."""
    return {name: raw.column(name) for name in names}
