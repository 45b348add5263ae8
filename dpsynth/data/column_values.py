"""A table's cells parsed under its schema: numbers and times as floats, categories as codes.

Numbers, integers, dates and times become float64 with NaN for a missing cell (an empty cell
or one of `schema.MISSING_TOKENS`); a column without `missing` refuses one (exit 4) unless its
schema entry was released with DP (`lenient`: the release found too few missing cells to give
them a bin, so they are encoded at the middle of the range: a public, per-row rule). Categorical
and boolean cells become indices into the column's `levels`; a value outside them goes to the
column's `other` category when it declares one, else it is an error. A released boolean without
a missing level encodes its missing cells false, by the same rule.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from dpsynth.data.clock import hhmm_to_minutes
from dpsynth.data.csvtable import MAX_SHOWN, RawTable
from dpsynth.data.schema import MISSING_TOKENS, Column, Schema
from dpsynth.data.timecols import time_seconds
from dpsynth.errors import DataError

RELEASED_PREFIX = "released with DP"


def is_released(column: Column) -> bool:
    """True when the column's entries came out of a DP release (see
    `dpsynth.training.table_schema`)."""
    return (column.source or "").startswith(RELEASED_PREFIX)


def missing_mask(values: np.ndarray) -> np.ndarray:
    """True where a cell is empty or a missing-value token."""
    return np.isin(np.asarray(values, dtype=object), list(MISSING_TOKENS))


def parse_numbers(values: np.ndarray, column: Column, source: str) -> np.ndarray:
    """Float64 values of a numeric or integer column, NaN where a cell is missing; DataError
    (exit 4) for a cell that is not a finite number."""
    strings = np.asarray(values, dtype=object)
    missing = missing_mask(strings)
    # parsed once per distinct value (a column repeats most of its values)
    codes, uniques = pd.factorize(strings, use_na_sentinel=False)
    unique_missing = missing_mask(np.asarray(uniques, dtype=object))
    parsed = np.full(len(uniques), np.nan)
    for i, text in enumerate(uniques.tolist()):
        if unique_missing[i]:
            continue
        try:
            parsed[i] = float(text)
        except ValueError:
            row = int(np.flatnonzero(strings == text)[0])
            raise DataError(
                f"{source}: column {column.name!r} is {column.type} but row {row + 2} holds "
                f"{str(text)[:MAX_SHOWN]!r}; fix the cell, or declare the column categorical "
                "or ignored"
            ) from None
        if not np.isfinite(parsed[i]):
            row = int(np.flatnonzero(strings == text)[0])
            raise DataError(f"{source}: column {column.name!r} row {row + 2} is not finite")
    numbers = parsed[codes]
    numbers[missing] = np.nan
    return numbers


def column_numbers(raw: RawTable, column: Column, lenient: bool | None = None) -> np.ndarray:
    """A numeric or time column's values as floats (NaN: missing), checked against its
    `missing` flag (see the module docstring; `lenient` defaults to `is_released`)."""
    values = raw.column(column.name)
    if column.is_time:
        numbers = time_seconds(values, column, raw.source)
    else:
        numbers = parse_numbers(values, column, raw.source)
        if column.clock is not None:
            numbers = hhmm_to_minutes(numbers, column, raw.source)
    if not column.missing and not (is_released(column) if lenient is None else lenient):
        absent = np.flatnonzero(np.isnan(numbers))
        if len(absent):
            row = int(absent[0])
            raise DataError(
                f"{raw.source}: column {column.name!r} row {row + 2} is missing "
                f"({str(values[row])[:MAX_SHOWN]!r}), but its schema has no missing cells (set "
                '"missing": true on the column)'
            )
    return numbers


def level_codes(raw: RawTable, column: Column, strict: bool = True) -> np.ndarray:
    """Indices of a categorical or boolean column's cells in its `levels` (a boolean matched
    regardless of case, its missing tokens to "", and "false"/"true", the text of a Parquet
    boolean, read as its two spellings); -1 for an unlisted value when not
    `strict`, else DataError (exit 4) naming the row."""
    values = raw.column(column.name)
    levels = column.levels
    if column.type == "boolean":
        lookup = {level.lower(): i for i, level in enumerate(levels)}
        # a Parquet boolean reads as "false"/"true" whatever the schema spells (a release
        # written as Parquet, scored against the CSV it was trained on: 0 and 1)
        lookup.setdefault("false", 0)
        lookup.setdefault("true", 1)
        if is_released(column) and not column.missing:
            # the release found too few missing cells to give them a level: they are encoded
            # false (a public, per-row rule, as a number's are at mid-range)
            lookup.setdefault("", 0)
        keys = np.where(missing_mask(values), "", np.char.lower(values.astype(str)))
    else:
        lookup = {c: i for i, c in enumerate(levels)}
        keys = values
    fallback = lookup.get(column.other, -1) if column.other is not None else -1
    inverse, uniques = pd.factorize(np.asarray(keys, dtype=object), use_na_sentinel=False)
    mapped = np.array([lookup.get(u, fallback) for u in uniques.tolist()], dtype=np.int64)
    codes = mapped[inverse]
    if strict and (codes < 0).any():
        bad = int(np.flatnonzero(codes < 0)[0])
        hint = (
            'set "missing": true on the column'
            if column.type == "boolean" and keys[bad] == ""
            else "add it, or declare an 'other' category that absorbs unlisted values"
        )
        raise DataError(
            f"{raw.source}: column {column.name!r} row {bad + 2} holds "
            f"{str(values[bad])[:MAX_SHOWN]!r}, which is not in the schema's "
            f"{'spellings' if column.type == 'boolean' else 'category list'} ({hint})"
        )
    return codes


def check_header(raw: RawTable, schema: Schema) -> None:
    """DataError unless the table's header is the schema's columns in the same order."""
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


def check_values(raw: RawTable, schema: Schema, released: Sequence[str] = ()) -> None:
    """DataError (exit 4) for the first value the schema cannot encode: every used column's
    values are parsed (numbers must be finite, times must fit their format), and categories
    and missing cells checked against the schema, except for the `released` columns, whose
    lists and missing flags a DP release is about to replace. Spends nothing: run before any
    release so that a bad row fails before the ledger is touched."""
    check_header(raw, schema)
    skip = set(released)
    for column in schema.columns:
        if not column.is_feature and column.name != schema.target:
            continue
        if column.is_numeric:
            numbers = column_numbers(raw, column, lenient=column.name in skip)
            if raw.n and np.isnan(numbers).all():
                raise DataError(
                    f"{raw.source}: column {column.name!r} has no value in any row; set its "
                    "type to 'ignored'"
                )
        elif column.name not in skip:
            level_codes(raw, column)


def table_content_digest(raw: RawTable, schema: Schema) -> str:
    """SHA-256 of the canonical parsed table (header, each used column's type and values);
    private: a membership test for anyone who knows the other rows. Independent of bounds,
    edges and category lists, so releasing a schema does not change which data it names."""
    digest = hashlib.sha256()
    digest.update(("dpsynth-table-v1|" + "\x1f".join(raw.header) + "|").encode())
    digest.update(str(raw.n).encode() + b"|")
    for column in schema.columns:
        if column.type == "ignored":
            continue
        digest.update(f"{column.name}\x1f{column.type}|".encode())
        if column.is_numeric:
            numbers = column_numbers(raw, column, lenient=True)
            digest.update(np.ascontiguousarray(numbers, dtype="<f8").tobytes())
        else:
            text = "\x1e".join(raw.column(column.name).tolist())
            digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()
