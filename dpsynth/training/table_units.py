"""A table's privacy unit (`train --privacy-unit COLUMN --max-rows-per-unit K`): its checks
before anything is spent, the bounding of each unit to K rows, and the run's statement.

The unit column names a person (a patient, a customer). It is never a feature: the schema
types it `id`, so `sample` writes fresh keys in it, grouped into synthetic units whose sizes
follow a DP release of the rows-per-unit histogram (`privacy.releases.unit_sizes`). Bounding
keeps at most K rows of each unit, chosen by `privacy.mechanisms.contribution` from the run's
secret stream and replayed identically whenever the run reads its data again. The number of
rows left, like N everywhere in dpsynth, is treated as public (`--public-size` replaces it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from dpsynth.data.column_values import missing_mask, table_content_digest
from dpsynth.data.csvtable import RawTable
from dpsynth.data.images import DataInfo
from dpsynth.data.schema import Column, Schema
from dpsynth.data.sources import read_table
from dpsynth.data.table_codec import TableData, encode_table
from dpsynth.data.units import named_like_row_index
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.ledger import Ledger
from dpsynth.methods.base import Method
from dpsynth.privacy.mechanisms.contribution import (
    UnitBound,
    bound_contributions,
    rows_per_unit,
)
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness
from dpsynth.training.table_input import unit_codes

# The replayable stream that picks each unit's rows (`PrivateRandomness.replayable`).
BOUNDING_STREAM = "table/contribution-bound"


def unit_bound(column: str | None, max_rows: int | None) -> UnitBound | None:
    """The request's unit, checked for shape (UsageError, exit 2): both or neither given."""
    if column is None and max_rows is None:
        return None
    if column is None:
        raise UsageError(
            "{max_rows_per_unit} needs {privacy_unit} (the column naming a person)",
            parameters=("max_rows_per_unit", "privacy_unit"),
        )
    if max_rows is None:
        raise UsageError(
            f"{{privacy_unit}} {column}: give {{max_rows_per_unit}} K too, the most rows one "
            f"{column} keeps (public; `dpsynth data schema` suggests one)",
            parameters=("privacy_unit", "max_rows_per_unit"),
        )
    if not column.strip():
        raise UsageError("{privacy_unit} must name a column", parameter="privacy_unit")
    return UnitBound(column, int(max_rows))


def check_unit_column(raw: RawTable, schema: Schema, unit: UnitBound, builtin: bool) -> Schema:
    """UsageError (exit 2) for a unit column that is missing, the target, or has empty cells;
    the schema with the unit column typed `id` (never read as a feature; `sample` writes fresh
    keys in it). Reads only the column's emptiness, on the owner's machine, before any spend."""
    if unit.column not in raw.header:
        if builtin:
            raise UsageError(
                f"{{privacy_unit}} {unit.column}: the built-in table {raw.source} has one row per "
                "person and no unit column; drop {privacy_unit}",
                parameter="privacy_unit",
            )
        shown = ", ".join(raw.header[:12]) + (", …" if len(raw.header) > 12 else "")
        raise UsageError(
            f"{{privacy_unit}} {unit.column!r} is not a column of {raw.source} (its columns: "
            f"{shown})",
            parameter="privacy_unit",
        )
    if unit.column == schema.target:
        raise UsageError(
            f"{{privacy_unit}} {unit.column!r} is the target; name the column that identifies "
            "a person",
            parameter="privacy_unit",
        )
    empty = int(missing_mask(raw.column(unit.column)).sum())
    if empty:
        raise UsageError(
            f"{{privacy_unit}} {unit.column!r} has {empty:,} empty cell(s): every row must name "
            "its person (fill them with a key of their own, or drop those rows); nothing was "
            "spent",
            parameter="privacy_unit",
        )
    current = next((c for c in schema.columns if c.name == unit.column), None)
    if current is not None and current.type != "id":
        schema = schema.replace_column(Column(unit.column, "id", prefix=current.prefix))
    return schema


def bounded_rows(raw: RawTable, unit: UnitBound) -> int:
    """How many rows remain after bounding (Σ over units of min(rows, K)): no randomness."""
    return int(np.minimum(rows_per_unit(raw.column(unit.column)), unit.max_rows).sum())


def bound_table(raw: RawTable, unit: UnitBound, randomness: PrivateRandomness) -> RawTable:
    """The table with at most K rows per unit, drawn from the run's secret stream (the same
    rows every time this run reads the table)."""
    generator = randomness.replayable(BOUNDING_STREAM)
    kept = bound_contributions(raw.column(unit.column), unit.max_rows, generator)
    return RawTable(raw.header, tuple(c[kept] for c in raw.columns), raw.source)


def unit_sizes(raw: RawTable, unit: UnitBound) -> np.ndarray:
    """Each unit's row count in a bounded table (the rows-per-unit release reads these)."""
    return rows_per_unit(raw.column(unit.column))


def rows_with_labels(raw: RawTable, target: str, labels: tuple[str, ...]) -> RawTable:
    """The rows whose target is one of `labels` (a DP-released label set: a row whose label
    did not survive the release is left out, never relabelled)."""
    keep = np.isin(np.asarray(raw.column(target), dtype=object), list(labels))
    if keep.all():
        return raw
    return RawTable(raw.header, tuple(c[keep] for c in raw.columns), raw.source)


def id_columns_advice(schema: Schema) -> str | None:
    """For a run without a unit, a note naming the schema's `id` columns (public: the schema's
    types): the guarantee is per row, and a person with several rows is protected per row only."""
    ids = [c.name for c in schema.columns if c.type == "id"]
    if not ids:
        return None
    # a row index (`rownames`, `Unnamed: 0`) holds one row each: named only when no other id
    # column is there to suggest
    named = [name for name in ids if not named_like_row_index(name)] or ids
    return (
        "the guarantee is per row: if one person may hold several rows, give "
        f"--privacy-unit {named[0]} --max-rows-per-unit K (id column(s): {', '.join(ids)})"
    )


def check_unit_method(backend: Method, unit: UnitBound) -> None:
    """UsageError (exit 2), before anything is spent, for a backend whose reads are not yet
    scaled for K > 1 rows a unit (DP-SGD clips one row's gradient, not a unit's sum)."""
    if unit.max_rows > 1 and not getattr(backend, "supports_privacy_unit", False):
        raise UsageError(
            f"--method {backend.name} bounds one row's contribution (DP-SGD clips per row), "
            f"not {unit.max_rows} rows of one {unit.column}: use --method mst or aim with "
            "{privacy_unit}, or {max_rows_per_unit} 1",
            parameters=("privacy_unit", "max_rows_per_unit"),
        )


def check_unit_composition(
    ledger: Ledger, dataset_id: str, fingerprint: str | None, unit: UnitBound | None
) -> None:
    """UsageError (exit 2), before anything is spent, when the data set's earlier spends
    protect another unit (or rows while this run protects a unit, or the reverse): their
    composed total would bound neither, so the ledger keeps one unit per data set."""
    earlier = ledger.units_for(dataset_id, fingerprint)
    this = f"{unit.column}:{unit.max_rows}" if unit is not None else "row"
    others = sorted(earlier - {this})
    if not others:
        return
    shown = ", ".join(
        "per row" if u == "row" else f"per {u.replace(':', ' ≤ ')} rows" for u in others
    )
    wanted = "per row" if unit is None else f"per {unit.column} ≤ {unit.max_rows} rows"
    raise UsageError(
        f"the ledger's spends on {dataset_id!r} protect {shown}; this run would protect "
        f"{wanted}, and a total over both would bound neither. Keep one privacy unit (and K) "
        "per data set; nothing was spent",
        parameters=("privacy_unit", "max_rows_per_unit"),
    )


def unit_record(info: DataInfo, records: str | None = None) -> dict[str, object] | None:
    """The unit as the ledger and config.json record it (None: per row); `records` "images"
    for an image folder's unit (the statement then says images, not rows)."""
    if info.unit is None:
        return None
    out = UnitBound(info.unit, info.rows_per_unit).to_json()
    return {**out, "records": records} if records else out


def load_bounded_table(
    spec: str,
    schema: Schema,
    dataset_id: str,
    unit: Mapping[str, Any] | None,
    randomness: PrivateRandomness | None,
) -> TableData:
    """A run's table read again under its public schema (resume, other ranks): each unit
    bounded to the same rows as when the run began (its secret stream replayed), the rows
    whose label a DP release dropped left out, the digest that of the whole table as read."""
    raw, parsed, _ = read_table(spec)
    digest = table_content_digest(raw, schema)
    bound = None
    if unit:
        if randomness is None:
            raise DpsynthError("a table with a privacy unit is read again with its run's secret")
        bound = UnitBound(str(unit["column"]), int(unit["max_rows_per_unit"]))
        raw = bound_table(raw, bound, randomness)
    raw = rows_with_labels(raw, schema.target, schema.classes)
    table = encode_table(raw, schema, parsed.canonical, parsed.kind, dataset_id)
    return replace(
        table,
        content_digest=digest,
        unit=bound.column if bound else None,
        rows_per_unit=bound.max_rows if bound else 1,
        unit_codes=unit_codes(raw, bound),
    )
