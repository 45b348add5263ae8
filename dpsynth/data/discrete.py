"""The discrete public domain of a table (for the marginal methods) and the one encoding of raw
cells to its integer codes.

Every used column (the features in file order, then the target) becomes an attribute with a
finite public domain, from the schema and the preset only, never from the data:
- a categorical or boolean column: its levels;
- a numeric, integer, date or time column with `edges` (declared, or released with DP by
  `dpsynth.training.table_schema`): one bin per pair of consecutive edges, left-closed (the last one
  closed); an edge repeated twice is a point mass (a bin holding that value alone, e.g. 0);
- one without `edges`: bins over its public [min, max]. An integer column with at most `bins`
  values gets one bin per value (exact). Otherwise, with `bound_bins`, the bounds themselves
  are bins of their own (a point mass at min or max) and `bins − 2` equal-width bins cover the
  open interval between them; without it, `bins` equal-width bins cover [min, max];
- a column with `missing` cells gets one more value, the last: missing;
- the target: its classes.

`codes_from_raw` maps a chunk of raw cells (a `RawTable` of strings, as a CSV or a Parquet
batch reads) to codes [n, d]. It is the encoding every counting engine uses (in memory,
DuckDB, Dask), and it goes through the same float32 scaling as `TableCodec.encode`, so that
its codes equal `methods.marginal.domain.codes_from_rows` of the encoded rows exactly: one
secret seed gives the same release whatever counted the marginals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpsynth.data.clock import hhmm_to_minutes
from dpsynth.data.column_values import check_header, column_numbers, is_released, level_codes
from dpsynth.data.csvtable import RawTable
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Column, Schema
from dpsynth.data.table_codec import TableCodec, _scale, codec_for
from dpsynth.errors import DataError

# Positions within this fraction of a bin below an edge count as on the edge: the float32
# encoding's rounding (≤ 3e-5 bins for a thousand bins) must not move a value across it.
EDGE = 1e-4


@dataclass(frozen=True)
class Attribute:
    """One attribute of the discrete domain."""

    name: str
    kind: str  # "categorical", "exact" (one bin per integer), "bins", "edges" or "target"
    size: int  # values, the missing one included
    start: int = 0  # the first column of its block in the encoded row (-1: the target)
    low: float = 0.0
    high: float = 0.0
    integer: bool = False
    bound_bins: bool = False
    edges: tuple[float, ...] = ()
    flag_start: int = -1  # the missing flag's block in the encoded row (-1: none)
    magnitude: bool = False  # a number whose distance from 0 means something (not a time)

    @property
    def missing(self) -> bool:
        """True when the last value is "missing"."""
        return self.flag_start >= 0

    @property
    def present_size(self) -> int:
        """The values other than missing."""
        return self.size - int(self.missing)


@dataclass(frozen=True)
class TableDomain:
    """The attributes of a table's discrete domain, in order (the target last)."""

    attributes: tuple[Attribute, ...]
    width: int  # the encoded row width D

    @property
    def sizes(self) -> tuple[int, ...]:
        """The number of values of each attribute."""
        return tuple(a.size for a in self.attributes)

    @property
    def target(self) -> int:
        """The index of the target attribute (the last)."""
        return len(self.attributes) - 1

    def cells(self, clique: tuple[int, ...]) -> int:
        """The number of cells of the marginal on `clique`."""
        return int(math.prod(self.attributes[j].size for j in clique))


def _number_attribute(
    column: Column, start: int, flag_start: int, bins: int, bound_bins: bool
) -> Attribute:
    low, high = float(column.min), float(column.max)  # type: ignore[arg-type]
    integer = column.type == "integer"
    extra = int(flag_start >= 0)
    common = {"low": low, "high": high, "integer": integer, "flag_start": flag_start}
    if column.edges is not None and len(column.edges) >= 2 and high > low:
        size = len(column.edges) - 1 + extra
        magnitude = column.type in ("numeric", "integer")
        return Attribute(
            column.name, "edges", size, start, edges=column.edges, magnitude=magnitude, **common
        )
    values = math.floor(high) - math.ceil(low) + 1 if integer else math.inf
    if high == low:
        return Attribute(column.name, "bins", 1 + extra, start, **common)
    if integer and values <= bins:
        return Attribute(column.name, "exact", int(values) + extra, start, **common)
    use_bounds = bound_bins and bins >= 3
    return Attribute(column.name, "bins", bins + extra, start, bound_bins=use_bounds, **common)


def table_domain(info: DataInfo, config: Mapping[str, Any]) -> TableDomain:
    """The discrete domain of a table's public schema under the preset's binning."""
    return schema_domain(codec_for(info).schema, int(config["bins"]), bool(config["bound_bins"]))


def schema_domain(schema: Schema, bins: int, bound_bins: bool) -> TableDomain:
    """The discrete domain of a public schema under a binning (`bins`, `bound_bins`)."""
    codec = TableCodec(schema)
    attributes = []
    for column in codec.schema.features:
        value, flag = codec.column_blocks(column)
        if column.is_categorical:
            attributes.append(Attribute(column.name, "categorical", value.size, value.start))
            continue
        flag_start = flag.start if flag is not None else -1
        attributes.append(_number_attribute(column, value.start, flag_start, bins, bound_bins))
    attributes.append(Attribute(schema.target, "target", len(schema.classes), -1))
    return TableDomain(tuple(attributes), codec.dim)


def _scaled_edges(attribute: Attribute) -> np.ndarray:
    """The edges on the encoding's scale, in float32 as the encoder rounds a value: a value
    equal to an edge encodes to exactly that edge's position."""
    edges = np.asarray(attribute.edges, dtype=np.float64)
    span = attribute.high - attribute.low
    return ((edges - attribute.low) / span * 2.0 - 1.0).astype(np.float32)


def _edge_codes(scaled: np.ndarray, attribute: Attribute) -> np.ndarray:
    """Bin codes of scaled values under an attribute's edges (point masses first)."""
    edges = _scaled_edges(attribute)
    values = scaled.astype(np.float32)
    bins = len(edges) - 1
    codes = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, bins - 1)
    for i in np.flatnonzero(edges[:-1] == edges[1:]):
        codes = np.where(values == edges[i], i, codes)
    return codes.astype(np.int64)


def number_codes(scaled: np.ndarray, attribute: Attribute) -> np.ndarray:
    """Bin codes of numbers scaled to [-1, 1] from [low, high]."""
    if attribute.kind == "edges":
        return _edge_codes(scaled, attribute)
    size = attribute.present_size
    if size == 1:
        return np.zeros(len(scaled), dtype=np.int64)
    unit = (np.clip(scaled.astype(np.float64), -1.0, 1.0) + 1.0) / 2.0
    if attribute.kind == "exact":
        values = attribute.low + unit * (attribute.high - attribute.low)
        return np.clip(np.rint(values - math.ceil(attribute.low)), 0, size - 1).astype(np.int64)
    if not attribute.bound_bins:
        return np.clip(np.floor(unit * size + EDGE), 0, size - 1).astype(np.int64)
    # The encoding maps min to exactly -1 and max to exactly 1 (clipped values too).
    inner = 1 + np.clip(np.floor(unit * (size - 2) + EDGE), 0, size - 3).astype(np.int64)
    return np.where(scaled <= -1.0, 0, np.where(scaled >= 1.0, size - 1, inner))


@dataclass(frozen=True)
class TypedChunk(RawTable):
    """A chunk whose numeric columns an Arrow reader already holds as float64 (NaN: null):
    `numbers` by column name, the exact values their canonical text would parse to (int64
    and float64 cells: `repr` round-trips a float64, and an integer's text parses to the
    same correctly rounded float). Its text columns for those names are placeholders."""

    numbers: Mapping[str, np.ndarray] = field(default_factory=dict)
    # text columns as Arrow dictionary-encodes them: (indices into `uniques`, uniques) by name
    categories: Mapping[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        """A column's strings (a dictionary-encoded one expanded)."""
        if name in self.categories:
            indices, uniques = self.categories[name]
            return uniques[indices]
        return super().column(name)


def chunk_levels(raw: RawTable, column: Column) -> np.ndarray:
    """`column_values.level_codes` of a chunk's column, looked up once per distinct value
    when the chunk holds it dictionary-encoded (the same codes and the same DataError)."""
    typed = getattr(raw, "categories", {}).get(column.name)
    if typed is None:
        return level_codes(raw, column)
    indices, uniques = typed
    distinct = RawTable((column.name,), (uniques,), raw.source)
    codes = level_codes(distinct, column, strict=False)[indices]
    if (codes < 0).any():
        level_codes(RawTable((column.name,), (uniques[indices],), raw.source), column)
    return codes


def chunk_numbers(raw: RawTable, column: Column, lenient: bool | None = None) -> np.ndarray:
    """A numeric or time column's values as floats (NaN: missing), from the chunk's typed
    numbers when it has them, else parsed from its text (`column_values.column_numbers`);
    the same DataErrors either way (a missing cell where the schema has none, not finite)."""
    typed = getattr(raw, "numbers", {}).get(column.name)
    if typed is None:
        return column_numbers(raw, column, lenient)
    infinite = np.flatnonzero(np.isinf(typed))
    if len(infinite):
        row = int(infinite[0])
        raise DataError(f"{raw.source}: column {column.name!r} row {row + 2} is not finite")
    if not column.missing and not (is_released(column) if lenient is None else lenient):
        absent = np.flatnonzero(np.isnan(typed))
        if len(absent):
            raise DataError(
                f"{raw.source}: column {column.name!r} row {int(absent[0]) + 2} is missing, but "
                'its schema has no missing cells (set "missing": true on the column)'
            )
    return typed if column.clock is None else hhmm_to_minutes(typed, column, raw.source)


def codes_from_raw(raw: RawTable, schema: Schema, domain: TableDomain) -> np.ndarray:
    """Integer codes [n, d] (int64) of a chunk of raw cells under the public schema's domain.

    DataError (exit 4) for a cell the schema cannot encode, as `TableCodec.encode` gives.
    """
    check_header(raw, schema)
    features = schema.features
    if len(features) + 1 != len(domain.attributes):
        raise ValueError("the domain was not built from this schema")
    # column-major: each attribute's codes contiguous, as the counting reads them
    out = np.empty((len(domain.attributes), raw.n), dtype=np.int64).T
    for j, (column, attribute) in enumerate(zip(features, domain.attributes, strict=False)):
        if attribute.kind == "categorical":
            out[:, j] = chunk_levels(raw, column)
            continue
        numbers = chunk_numbers(raw, column)
        absent = np.isnan(numbers)
        # float32 as the encoded rows hold it, so a value on an edge codes as it does there
        scaled = np.where(absent, 0.0, _scale(np.nan_to_num(numbers), column)).astype(np.float32)
        codes = number_codes(scaled, attribute)
        if attribute.missing:
            codes = np.where(absent, attribute.size - 1, codes)
        out[:, j] = codes
    out[:, -1] = chunk_levels(raw, schema.target_column)
    return out


@dataclass(frozen=True)
class ChunkEncoder:
    """What an engine needs to encode chunks (picklable, sent to a cluster's workers)."""

    schema: Schema
    domain: TableDomain

    def __call__(self, raw: RawTable) -> np.ndarray:
        """`codes_from_raw` of one chunk."""
        return codes_from_raw(raw, self.schema, self.domain)
