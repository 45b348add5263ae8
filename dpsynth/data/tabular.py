"""Tables: reading a CSV, encoding its rows under a public schema, and decoding back to a CSV.

Encoding (what generators train on, `TableData.x`, float32 [N, D]): the schema's feature
columns (all but the target and ignored ones) in file order; a categorical column becomes a
one-hot block of its category count (0/1), a numeric or integer column one value scaled from
its public [min, max] to [-1, 1] (values outside are clipped: a public, per-row rule). The
target becomes the label `y` (its index in the public class list).

Values are stripped of surrounding blanks (Census-Income writes `, value`), so the category
strings are the stripped ones. Missing values: a categorical column treats a missing-value
token (`?`, or an empty field) as a category like any other, which the schema lists (the
draft lists what it saw); a numeric column must hold a number in every row (exit 4 otherwise;
declare the column categorical or ignored, or clean the file). A categorical value outside the
public list goes to the column's `other` category when it declares one, else it is an error.

Decoding (`TableCodec.decode`) turns generated rows back into the original header and column
order: categories by sampling each one-hot block as a distribution (post-processing with the
public sampling seed), numbers unscaled (integers rounded), the target from the labels, and
ignored columns left empty.

The content digest is the SHA-256 of the canonical parsed table: the header, each used
column's type and its values (stripped strings, or float64 numbers), independent of bounds and
category lists, so releasing a schema does not change which data a ledger entry names. It is
private (a membership test for anyone who knows the other rows) and only ever written keyed
(`DataInfo.fingerprint`, see `dpsynth.ledger.key`).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dpsynth.data.csvtable import MAX_SHOWN, RawTable, read_csv_table
from dpsynth.data.images import DataInfo
from dpsynth.data.limits import over_budget
from dpsynth.data.schema import Column, Schema
from dpsynth.errors import DataError

__all__ = ["RawTable", "TableCodec", "TableData", "encode_table", "read_csv_table"]


def check_header(raw: RawTable, schema: Schema) -> None:
    """DataError unless the CSV's header is the schema's columns in the same order."""
    expected = tuple(c.name for c in schema.columns)
    if raw.header == expected:
        return
    missing = [c for c in expected if c not in raw.header]
    extra = [c for c in raw.header if c not in expected]
    detail = []
    if missing:
        detail.append(f"missing {', '.join(missing[:5])}")
    if extra:
        detail.append(f"not in the schema: {', '.join(extra[:5])}")
    if not detail:
        detail.append("the columns are in another order")
    raise DataError(
        f"{raw.source}: the header does not match the schema ({'; '.join(detail)}); the schema "
        "lists every column of the file in order (type 'ignored' for unused ones)"
    )


def _numbers(raw: RawTable, column: Column) -> np.ndarray:
    values = raw.column(column.name)
    # parsed once per distinct value (a column repeats most of its values)
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    try:
        numbers = np.asarray(uniques, dtype=object).astype(np.float64)[codes]
    except ValueError:
        bad = next(i for i, v in enumerate(values) if not _is_number(v))
        raise DataError(
            f"{raw.source}: column {column.name!r} is {column.type} but row {bad + 2} holds "
            f"{values[bad][:MAX_SHOWN]!r}; declare it categorical (missing values are "
            "categories there) or ignored"
        ) from None
    if not np.isfinite(numbers).all():
        bad = int(np.flatnonzero(~np.isfinite(numbers))[0])
        raise DataError(f"{raw.source}: column {column.name!r} row {bad + 2} is not finite")
    return numbers


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _codes(raw: RawTable, column: Column) -> np.ndarray:
    values = raw.column(column.name)
    lookup = {c: i for i, c in enumerate(column.categories)}
    fallback = lookup.get(column.other, -1) if column.other is not None else -1
    inverse, uniques = pd.factorize(values, use_na_sentinel=False)
    mapped = np.array([lookup.get(u, fallback) for u in uniques.tolist()], dtype=np.int64)
    codes = mapped[inverse]
    if (codes < 0).any():
        bad = int(np.flatnonzero(codes < 0)[0])
        raise DataError(
            f"{raw.source}: column {column.name!r} row {bad + 2} holds "
            f"{values[bad][:MAX_SHOWN]!r}, which is not in the schema's category list (add it, "
            "or declare an 'other' category that absorbs unlisted values)"
        )
    return codes


def check_values(raw: RawTable, schema: Schema, released: Sequence[str] = ()) -> None:
    """DataError (exit 4) for the first value the schema cannot encode: every used column's
    values are parsed (numbers must be finite), and categories checked against their list,
    except for the `released` columns, whose list a DP release is about to replace (a value
    outside it then falls in the released '(other)'). Spends nothing: run before any release
    so that a bad row fails before the ledger is touched."""
    check_header(raw, schema)
    skip = set(released)
    for column in schema.columns:
        if column.type == "ignored":
            continue
        if column.is_numeric:
            _numbers(raw, column)
        elif column.name not in skip:
            _codes(raw, column)


def table_content_digest(raw: RawTable, schema: Schema) -> str:
    """SHA-256 of the canonical parsed table (header, each used column's type and values);
    private, see the module docstring."""
    digest = hashlib.sha256()
    digest.update(("dpsynth-table-v1|" + "\x1f".join(raw.header) + "|").encode())
    digest.update(str(raw.n).encode() + b"|")
    for column in schema.columns:
        if column.type == "ignored":
            continue
        digest.update(f"{column.name}\x1f{column.type}|".encode())
        if column.is_numeric:
            digest.update(np.ascontiguousarray(_numbers(raw, column), dtype="<f8").tobytes())
        else:
            text = "\x1e".join(raw.column(column.name).tolist())
            digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class Block:
    """One feature column's slice of the encoded row: `softmax` (k one-hot) or `tanh` (1)."""

    name: str
    kind: str
    start: int
    size: int


class TableCodec:
    """Encodes parsed rows under a schema and decodes generated rows back to the CSV's form."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        blocks, start = [], 0
        for column in schema.features:
            size = len(column.categories) if column.type == "categorical" else 1
            blocks.append(
                Block(
                    column.name, "softmax" if column.type == "categorical" else "tanh", start, size
                )
            )
            start += size
        self.blocks: tuple[Block, ...] = tuple(blocks)
        self.dim = start

    def encode(self, raw: RawTable) -> tuple[torch.Tensor, torch.Tensor]:
        """Features float32 [N, D] and labels int64 [N] (DataError for unreadable values)."""
        check_header(raw, self.schema)
        problem = over_budget(raw.n * self.dim * 4)
        if problem:
            raise DataError(
                f"{raw.source}: its {raw.n:,} rows encoded as {self.dim} values each {problem}"
            )
        out = np.zeros((raw.n, self.dim), dtype=np.float32)
        for column, block in zip(self.schema.features, self.blocks, strict=True):
            if column.type == "categorical":
                out[np.arange(raw.n), block.start + _codes(raw, column)] = 1.0
            else:
                out[:, block.start] = _scale(_numbers(raw, column), column)
        labels = _codes(raw, self.schema.target_column)
        return torch.from_numpy(out), torch.from_numpy(labels)

    def decode(
        self, rows: np.ndarray, labels: np.ndarray, rng: np.random.Generator
    ) -> pd.DataFrame:
        """Generated rows [b, D] with their labels [b] → a frame in the CSV's header and order.

        Each categorical block is read as a distribution (negative parts clipped, an all-zero
        block uniform) and sampled with `rng`; numbers are unscaled into [min, max].
        """
        rows = np.asarray(rows, dtype=np.float64)
        data: dict[str, object] = {}
        decoded = {}
        for column, block in zip(self.schema.features, self.blocks, strict=True):
            part = rows[:, block.start : block.start + block.size]
            if column.type == "categorical":
                decoded[column.name] = np.asarray(column.categories, dtype=object)[
                    _sample_blocks(part, rng)
                ]
            else:
                decoded[column.name] = _unscale(part[:, 0], column)
        classes = np.asarray(self.schema.classes, dtype=object)
        for column in self.schema.columns:
            if column.name == self.schema.target:
                data[column.name] = classes[np.asarray(labels, dtype=np.int64)]
            elif column.type == "ignored":
                data[column.name] = np.full(len(rows), "", dtype=object)
            else:
                data[column.name] = decoded[column.name]
        return pd.DataFrame(data, columns=[c.name for c in self.schema.columns])

    def csv_text(self, frame: pd.DataFrame, header: bool) -> str:
        """The frame as CSV text (header on request); floats to 7 significant digits (the
        float32 precision of the encoding: more digits would be noise)."""
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False, header=header, lineterminator="\n", float_format="%.7g")
        return buffer.getvalue()


def _scale(values: np.ndarray, column: Column) -> np.ndarray:
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    if high == low:
        return np.zeros_like(values, dtype=np.float32)
    # divided before doubled: 2·(v − min) overflows for ranges near the float maximum
    return ((np.clip(values, low, high) - low) / (high - low) * 2.0 - 1.0).astype(np.float32)


def _unscale(values: np.ndarray, column: Column) -> np.ndarray:
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    out = low + (np.clip(values, -1.0, 1.0) + 1.0) / 2.0 * (high - low)
    if column.type == "integer":
        return np.clip(np.rint(out), np.ceil(low), np.floor(high)).astype(np.int64)
    return out


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
        return DataInfo(
            spec=self.spec,
            kind=self.kind,
            n=self.n,
            shape=self.shape,  # type: ignore[arg-type]
            classes=tuple(self.classes),
            fingerprint=fingerprint,
            dataset_id=self.dataset_id,
            modality="table",
            schema=self.schema.to_json(),
        )

    def as_float(self) -> torch.Tensor:
        """The encoded rows (already floats on the generator's scale)."""
        return self.x


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
    from dpsynth.data.schema import parse_schema

    if info.schema is None:
        raise DataError(f"{info.spec}: the data description carries no schema")
    return TableCodec(parse_schema(info.schema, f"{info.spec} schema"))


def block_layout(info: DataInfo) -> tuple[tuple[str, int], ...]:
    """(kind, size) of each feature block of a table's encoding, for generator output heads."""
    return tuple((b.kind, b.size) for b in codec_for(info).blocks)


def column_values(raw: RawTable, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The named columns' string values."""
    return {name: raw.column(name) for name in names}
