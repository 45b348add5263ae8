"""Drafting a schema from a table for the user to review (`dpsynth data schema`).

Every entry read off the data is marked `"source": "data (not private: review or replace)"`:
the draft is a starting point, not a public declaration. Per column, in this order:
- no value at all → `ignored`;
- numbers: identifiers (below) → `id`; other whole numbers → `integer`, however few their
  values (a count's rare values then merge into the nearest bin, never '(other)', and one row
  does not flip the type); other numbers → `numeric` with the
  precision (`decimals`) the file writes; integers that are all HHMM times of day, some past
  01:00, in a column named for a time (`dep_time`) → `integer` with `"clock": "hhmm"`
  (minutes since midnight inside, `dpsynth.data.clock`). Empty cells (and the usual
  missing-value tokens, `schema.MISSING_TOKENS`) give `missing: true`, never a categorical;
- yes/no, true/false, t/f, y/n in any case → `boolean`; so is a column of exactly 0 and 1 (an
  indicator, written back as the file spells them: 0 and 1, or 0.0 and 1.0);
- dates and times of one format (ISO 8601 and what pandas recognises) → `date` or `datetime`,
  with their `format` and UTC offset;
- text: long or mostly unique free text → `ignored`; identifiers (below) → `id`; a category
  list longer than N / 20 → the values held by at least RARE_ROWS rows (at most N / 20 of
  them) and an `other` category for the rest; otherwise `categorical`.
An identifier (`dpsynth.data.units.identifier_reason`) holds nearly one value per row (whole
numbers only when named like one or a dense run too, so that amounts stay numbers), or is
named like one (`patient_id`, `case_no`, `PatientID`, `ssn`, ...) with more values than a
category list may hold, or is a dense run of whole numbers spread evenly over its range and
not named for a measurement (`age`, `year`, `days`, `amount`, ...), or holds repeated codes:
at least 30 whole numbers of one width (3 digits or more) on 3 rows each or more on average,
scattered over a range far wider than their count (a school's number on its pupils' rows),
where a measurement that repeats piles up on side-by-side typical values; not named for a
measurement either. The last three include identifiers that repeat, a subject's number on
each of its rows: such a column looks like a privacy unit, and the draft says so with its
rows per unit (`dpsynth.data.units`). The draft never lists a value held by a single row as a
category unless the column has few values.
`draft_table` also returns one remark per column it typed as an identifier (and one more when
it repeats), free text, a shortened category list, a clock, a code list kept whole numbers
(`code_list_remark`), a share in [0, 1] (`share_remark`) or an empty column, for the CLI to
print (the schema never holds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.data.clock import looks_like_clock, minutes_or_nan
from dpsynth.data.schema import (
    DATA_SOURCE,
    MAX_DECIMALS,
    MISSING_TOKENS,
    Column,
    Schema,
)
from dpsynth.data.timecols import guess_time_format, is_date_format, time_seconds
from dpsynth.data.units import UnitSummary, identifier_reason, summarise_sizes, unit_remark
from dpsynth.errors import DataError, UsageError

# A category list may hold at most max(N / LONG_LIST_DIVISOR, SHORT_LIST) values before the
# draft shortens it (and `train --schema-public` refuses a longer one read off the data).
LONG_LIST_DIVISOR = 20
SHORT_LIST = 20
# A shortened list keeps the values held by at least this many rows.
RARE_ROWS = 10
# Whole numbers look like a code list (`code_list_remark`) when they are at most CODE_VALUES
# values on a common step of at least CODE_STEP, spread over CODE_SPREAD × their count or more.
CODE_VALUES, CODE_STEP, CODE_SPREAD = 40, 5, 5.0
# Floats in [0, 1] spread over at least SHARE_SPREAD of it look like a share (`share_remark`).
SHARE_SPREAD = 0.5
# Text this long on average, or with spaces and mostly unique, is free text.
FREE_TEXT_CHARS = 40
_BOOLEANS = (("true", "false"), ("yes", "no"), ("t", "f"), ("y", "n"))
OTHER = "(other)"


def long_list_cap(rows: int) -> int:
    """The longest category list read off the data that the draft writes and `--schema-public`
    accepts: N / 20, and never below SHORT_LIST (a short list is what categories are)."""
    return max(rows // LONG_LIST_DIVISOR, SHORT_LIST)


@dataclass(frozen=True)
class DraftedColumn:
    """A drafted column and, for the columns a user must look at, one remark."""

    column: Column
    remark: str | None = None
    # an identifier that repeats: its rows per unit, for one more remark (never the schema)
    units: UnitSummary | None = None


def _spanning(name: str, kind: str, values: np.ndarray, missing: bool, **more: Any) -> Column:
    """A drafted column of `kind` whose public range is the data's own [min, max] of `values`
    (marked as read off the data, `source`)."""
    return Column(
        name,
        kind,
        float(values.min()),
        float(values.max()),
        source=DATA_SOURCE,
        missing=missing,
        **more,
    )


def code_list_remark(name: str, numbers: np.ndarray) -> str | None:
    """A remark on whole numbers that look like a code list (ames' `MS.SubClass`: 16 values
    on a step of 5 over 20–190), which the draft keeps `integer`: a synthetic row may then
    hold a number between two codes (37), which is no code. None for counts, years and
    amounts: a run of side-by-side values, a step below CODE_STEP, or too many values."""
    values = np.unique(numbers)
    if not 3 <= len(values) <= CODE_VALUES:
        return None
    step = int(np.gcd.reduce((values[1:] - values[0]).astype(np.int64)))
    span = float(values[-1] - values[0])
    if step < CODE_STEP or span < CODE_SPREAD * len(values):
        return None
    return (
        f"{name}: {len(values)} whole numbers on a step of {step} over "
        f"{values[0]:g}–{values[-1]:g} → integer (a synthetic value may fall between them); "
        "if they are codes, retype it categorical with the codes as its categories"
    )


def share_remark(name: str, numbers: np.ndarray) -> str | None:
    """A remark on a float column whose values all lie in [0, 1], spread over most of it
    (labor-market's `frac_black`): if it is a share by definition, bounds declared public
    cost the DP release nothing and clip nothing, where a range read from the noise errs wide
    (0.0–0.99 released as −2 … 843 at ε = 1). None for anything else."""
    low, high = float(numbers.min()), float(numbers.max())
    if low < 0.0 or high > 1.0 or high - low < SHARE_SPREAD:
        return None
    return (
        f"{name}: every value lies in [0, 1] (here {low:g}–{high:g}) → numeric; if it is a "
        "share by definition, write min 0 and max 1 (and missing as you know it) and delete "
        "its 'source' mark: the DP release then spends nothing on it and clips none of it"
    )


def _decimals(texts: Sequence[str]) -> int:
    """The most digits after the point among number texts (at most MAX_DECIMALS)."""
    most = 0
    for text in texts:
        mantissa = text.lower().split("e")[0]
        if "." in mantissa:
            most = max(most, len(mantissa.split(".")[1]))
    return min(most, MAX_DECIMALS)


def _numbers(texts: Sequence[str]) -> np.ndarray | None:
    try:
        numbers = np.asarray(texts, dtype=object).astype(np.float64)
    except (ValueError, OverflowError):
        return None
    return numbers if np.isfinite(numbers).all() else None


def _spell(word: str, seen: dict[str, str], upper: bool, title: bool) -> str:
    """A boolean word as the file spells it (or in its case style when it never appears)."""
    if word in seen:
        return seen[word]
    return word.upper() if upper else word.title() if title else word


def _boolean(name: str, distinct: Sequence[str], missing: bool) -> Column | None:
    lowered = {v.lower() for v in distinct}
    for true, false in _BOOLEANS:
        if lowered and lowered <= {true, false}:
            seen = {v.lower(): v for v in distinct}
            upper = all(v.isupper() for v in distinct)
            title = all(v[:1].isupper() and v[1:].islower() for v in distinct)
            return Column(
                name,
                "boolean",
                categories=(_spell(false, seen, upper, title), _spell(true, seen, upper, title)),
                missing=missing,
                source=DATA_SOURCE,
            )
    return None


def _identifier(name: str, reason: str, sizes: np.ndarray) -> DraftedColumn:
    """An `id` column, the remark saying why, and its rows per unit when a value repeats."""
    units = summarise_sizes(name, sizes)
    return DraftedColumn(
        Column(name, "id"),
        f"{name}: {reason} → id (sample writes fresh keys 'syn-1', 'syn-2', …, never a real one)",
        units if units.repeats else None,
    )


def draft_column(name: str, values: np.ndarray, rows: int) -> DraftedColumn:
    """One column drafted from its stripped values (see the module docstring)."""
    strings = np.asarray(values, dtype=object)
    missing_mask = np.isin(strings, list(MISSING_TOKENS))
    present = strings[~missing_mask]
    missing = bool(missing_mask.any())
    if len(present) == 0:
        return DraftedColumn(
            Column(name, "ignored"), f"{name}: every cell is empty → ignored (written empty)"
        )
    counts = pd.Series(present).value_counts()
    distinct = [str(v) for v in counts.index]
    numbers = _numbers(distinct)
    if numbers is not None and len(distinct) == 2 and set(numbers.tolist()) == {0.0, 1.0}:
        # an indicator (0 and 1, or 0.0 and 1.0 as a float column writes them): a boolean
        # written back as the file spells it (a number column still), whose DP release needs
        # one small histogram where a number's needs a range and a shape
        false, true = sorted(distinct, key=lambda v: float(v))
        flag = Column(
            name, "boolean", categories=(false, true), missing=missing, source=DATA_SOURCE
        )
        return DraftedColumn(
            flag, f"{name}: only {false} and {true} → boolean (written as {false} and {true})"
        )
    if numbers is not None:
        integral = bool(np.all(numbers == np.round(numbers)))
        # Whole numbers stay numbers, however few their values: as a category list, a count's
        # rare values became '(other)' text in a number column, and one row with an eleventh
        # value flipped the type. A code list the owner wants as categories is retyped.
        if integral:
            sizes = counts.to_numpy(np.int64)
            reason = identifier_reason(name, sizes, numbers, rows, long_list_cap(rows))
            if reason is not None:
                return _identifier(name, reason, sizes)
        if integral and looks_like_clock(name, numbers):
            minutes = minutes_or_nan(numbers)  # every value is a time: looks_like_clock
            clock = Column(
                name,
                "integer",
                float(minutes.min()),
                float(minutes.max()),
                source=DATA_SOURCE,
                missing=missing,
                clock="hhmm",
            )
            remark = (
                f"{name}: times of day written as HHMM → a clock: minutes since midnight "
                'inside, written back as HHMM (remove "clock" if it counts something else)'
            )
            return DraftedColumn(clock, remark)
        kind = "integer" if integral else "numeric"
        decimals = None if integral else _decimals(distinct)
        drafted = _spanning(name, kind, numbers, missing, decimals=decimals)
        remark = code_list_remark(name, numbers) if integral else share_remark(name, numbers)
        return DraftedColumn(drafted, remark)
    boolean = _boolean(name, distinct, missing)
    if boolean is not None:
        return DraftedColumn(boolean)
    guessed = guess_time_format(distinct)
    if guessed is not None:
        fmt, zone = guessed
        kind = "date" if is_date_format(fmt) else "datetime"
        probe = Column(name, kind, format=fmt, timezone=zone)
        seconds = time_seconds(np.asarray(distinct, dtype=object), probe, name)
        column = _spanning(name, kind, seconds, missing, format=fmt, timezone=zone)
        return DraftedColumn(column)
    mean_length = float(np.mean([len(v) for v in present]))
    unique_share = len(distinct) / len(present)
    spaced = np.mean([" " in v for v in distinct]) > 0.5
    if mean_length > FREE_TEXT_CHARS or (spaced and unique_share > 0.5 and len(distinct) > 20):
        return DraftedColumn(
            Column(name, "ignored"), f"{name}: free text → ignored (written empty)"
        )
    sizes = counts.to_numpy(np.int64)
    reason = identifier_reason(name, sizes, None, rows, long_list_cap(rows))
    if reason is not None:
        return _identifier(name, reason, sizes)
    # a categorical keeps its missing tokens as categories, as the file spells them
    tokens = sorted({str(v) for v in strings[missing_mask]})
    cap = long_list_cap(rows)
    if len(distinct) + len(tokens) > cap:
        kept = [str(v) for v, c in counts.items() if c >= RARE_ROWS][: max(cap - 1, 1)]
        if len(kept) < 2:
            return DraftedColumn(
                Column(name, "ignored"),
                f"{name}: {len(distinct):,} values, hardly any held by {RARE_ROWS} rows or more "
                "→ ignored (too rare to release at this size; group the values, e.g. codes by "
                "their prefix, to keep the column)",
            )
        other = OTHER
        while other in kept:
            other += "*"
        categories = (*sorted(kept), *tokens, other)
        remark = (
            f"{name}: {len(distinct):,} values, most held by few rows → categorical of the "
            f"{len(kept)} held by ≥ {RARE_ROWS} rows, the rest → {other!r}"
        )
        return DraftedColumn(
            Column(name, "categorical", categories=categories, other=other, source=DATA_SOURCE),
            remark,
        )
    ordered = sorted([*distinct, *tokens])
    return DraftedColumn(Column(name, "categorical", categories=tuple(ordered), source=DATA_SOURCE))


NOTES = (
    "Drafted by `dpsynth data schema` from the private data: every entry marked "
    f"'source: {DATA_SOURCE}' is not private. By default `train` releases those entries "
    "with DP (--schema-epsilon, a share of --epsilon); or replace them with public knowledge "
    "(then delete the mark), or train with --schema-public to declare them public. Columns "
    "of type 'id' are never read: sample writes fresh surrogate keys.",
)


def draft_table(
    header: Sequence[str], columns: Sequence[np.ndarray], target: str
) -> tuple[Schema, list[str]]:
    """A schema drafted from a table's columns (strings) and the remarks to show the user."""
    if target not in header:
        raise UsageError(
            f"{{target}} {target!r} is not a column (columns: {', '.join(header)})",
            parameter="target",
        )
    rows = len(columns[0]) if columns else 0
    drafted: list[Column] = []
    remarks: list[str] = []
    for name, values in zip(header, columns, strict=True):
        if name == target:
            labels = sorted({str(v) for v in values})
            drafted.append(
                Column(name, "categorical", categories=tuple(labels), source=DATA_SOURCE)
            )
            continue
        result = draft_column(name, values, rows)
        drafted.append(result.column)
        if result.remark:
            remarks.append(result.remark)
        if result.units is not None:
            remarks.append(unit_remark(result.units, rows - result.units.rows))
    schema = Schema(tuple(drafted), target, NOTES)
    if len(schema.classes) < 2:
        raise DataError(f"the target {target!r} has fewer than two distinct values")
    if len(schema.classes) > long_list_cap(rows) and len(schema.classes) > 100:
        raise UsageError(
            f"{{target}} {target!r} has {len(schema.classes):,} distinct values in {rows:,} "
            "rows: a label set is a short list of classes (pick another column)",
            parameter="target",
        )
    if not schema.features:
        raise UsageError(f"no column besides the target {target!r} can be used")
    return schema, remarks


def draft_schema(header: Sequence[str], columns: Sequence[np.ndarray], target: str) -> Schema:
    """A schema drafted from a table's columns, for the user to review (see `draft_table`)."""
    return draft_table(header, columns, target)[0]


def long_category_lists(schema: Schema, rows: int) -> list[Column]:
    """Categorical columns read off the data whose list is longer than rows / 20: most of
    their values are held by a few rows each, so declaring them public publishes them."""
    cap = long_list_cap(rows)
    return [
        c
        for c in schema.columns
        if c.type == "categorical"
        and c.data_derived
        and c.name != schema.target
        and len(c.categories) > cap
    ]
