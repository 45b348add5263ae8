"""The public schema of a table: per column its type, public bounds or category list, the target.

A schema is a JSON file (`--schema FILE.json`):

    {"format": "dpsynth-schema-v1", "target": "outcome",
     "columns": [
       {"name": "patient_id", "type": "id"},
       {"name": "admitted", "type": "datetime", "min": "2019-01-01T00:00:00",
        "max": "2024-12-31T23:59:59", "format": "%Y-%m-%d %H:%M", "missing": false},
       {"name": "age", "type": "integer", "min": 0, "max": 110, "missing": true},
       {"name": "dep_time", "type": "integer", "clock": "hhmm", "min": 0, "max": 1440},
       {"name": "bmi", "type": "numeric", "min": 12, "max": 60, "decimals": 1,
        "edges": [12, 19.8, 22.1, 24.0, 26.3, 29.5, 60], "missing": true},
       {"name": "smoker", "type": "boolean", "true": "yes", "false": "no", "missing": true},
       {"name": "ward", "type": "categorical", "categories": ["A", "B", "(other)"],
        "other": "(other)"},
       {"name": "notes", "type": "ignored"},
       {"name": "outcome", "type": "categorical", "categories": ["home", "ward", "died"]}]}

Types:
- `numeric` (float) and `integer`: public `min` ≤ `max`; optional `missing` (empty cells get a
  bin of their own, released like any other value), `decimals` (digits written after the
  point: the source's precision), `edges` (bin edges inside [min, max], ascending, a value
  repeated twice marks a point mass such as 0; declared or released with DP). An `integer`
  column with `"clock": "hhmm"` holds times of day written as HHMM integers (517 is 05:17,
  2400 midnight at the day's end): inside, and in `min`, `max` and `edges`, they are minutes
  since midnight (0–1440), so every value written back is a real time of day.
- `datetime` and `date`: the same on a time axis. `min`/`max` are ISO 8601 in the schema
  (seconds since 1970-01-01 UTC inside), `format` is the strftime format the file uses (it is
  written back in it), `timezone` the UTC offset ("+01:00") when the values carry one.
- `boolean`: two spellings, `true` and `false` (as the file writes them), and `missing`.
- `categorical`: public `categories`, strings as they appear in the file after stripping
  blanks; an empty cell is the category "" (list it to keep it); an optional `other`, one of
  the categories, absorbs values not in the list.
- `id`: an identifier (a key, a patient or account number; it repeats when it names a person
  with several rows). Never read for training; `sample` writes fresh surrogate keys
  `<prefix><n>` (`prefix` default "syn-"), never a real value.
- `ignored`: not read; its column is written empty.
The `target` must be categorical: its categories are the public label set (`classes`); it may
carry `weights`, public class proportions (e.g. from published statistics; normalised to sum 1,
never drafted from the data), which a backend may use to generate labels in those proportions.
Weights marked `"weights_source": "data ..."` are not public: `train` refuses them unless
declared (`--schema-public`) or replaced by a DP release (`--class-weights-epsilon`, which
writes `weights` and its own `weights_source`).

Every bound, edge list, category list or missing flag read off the private data carries
`"source": "data (not private: review or replace)"` (`dpsynth.data.schema_draft` writes it).
Such a column is not public yet: by default `train` releases it through a charged mechanism
(`--schema-epsilon`, see `dpsynth.training.table_schema`), or the user declares it public
(`--schema-public`). This module only reads and checks schemas; it adds no noise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

FORMAT = "dpsynth-schema-v1"
DATA_SOURCE = "data (not private: review or replace)"
TYPES = (
    "numeric",
    "integer",
    "datetime",
    "date",
    "boolean",
    "categorical",
    "id",
    "ignored",
)
NUMERIC_TYPES = ("numeric", "integer", "datetime", "date")
TIME_TYPES = ("datetime", "date")
DEFAULT_ID_PREFIX = "syn-"
# Cells that mean "no value" in a numeric, time or boolean column (compared after stripping).
# In a categorical column they are categories like any other (the file's own spelling).
MISSING_TOKENS = frozenset(
    ("", "NA", "N/A", "n/a", "NaN", "nan", "NULL", "null", "None", "none", "?", "-", "NaT")
)
# The most decimals a numeric column writes (float32 encodes about 7 significant digits).
MAX_DECIMALS = 6
# How an integer column may spell a time of day ("hhmm": 517 is 05:17), and the minutes in a
# day, the most such a column holds inside (2400, the day's end, is 1440).
CLOCK_FORMATS = ("hhmm",)
MINUTES_PER_DAY = 1440


@dataclass(frozen=True)
class Column:
    """One column of a schema (see the module docstring).

    Numeric and time columns hold their bounds and edges as floats (a time column: seconds
    since 1970-01-01 UTC, a date column: midnight of its day); the JSON form writes them back
    as ISO 8601.
    """

    name: str
    type: str
    min: float | None = None
    max: float | None = None
    categories: tuple[str, ...] = ()
    other: str | None = None
    source: str | None = None
    # The target only: public class proportions (e.g. published statistics), never drafted;
    # `weights_source` says where they came from ("data ..." marks them not public).
    weights: tuple[float, ...] | None = None
    weights_source: str | None = None
    missing: bool = False
    decimals: int | None = None
    edges: tuple[float, ...] | None = None
    format: str | None = None
    timezone: str | None = None
    prefix: str = DEFAULT_ID_PREFIX
    # An integer column of times of day as the file spells them (`CLOCK_FORMATS`), or None.
    clock: str | None = None

    @property
    def weights_derived(self) -> bool:
        """True when its class proportions were read off the private data (not public)."""
        return self.weights is not None and (self.weights_source or "").startswith("data")

    @property
    def data_derived(self) -> bool:
        """True when its bounds, edges, categories or missing flag were read off the private
        data (not public)."""
        return self.type not in ("ignored", "id") and (self.source or "").startswith("data")

    @property
    def is_numeric(self) -> bool:
        """numeric, integer, datetime or date: encoded as one number (plus a missing flag)."""
        return self.type in NUMERIC_TYPES

    @property
    def is_time(self) -> bool:
        """datetime or date."""
        return self.type in TIME_TYPES

    @property
    def is_integral(self) -> bool:
        """Values are whole numbers: integer columns, and dates (whole days)."""
        return self.type in ("integer", "date")

    @property
    def is_categorical(self) -> bool:
        """categorical or boolean: encoded as one of its `levels`."""
        return self.type in ("categorical", "boolean")

    @property
    def is_feature(self) -> bool:
        """True for columns a generator learns (not ignored, not an identifier)."""
        return self.type not in ("ignored", "id")

    @property
    def levels(self) -> tuple[str, ...]:
        """A categorical column's categories; a boolean's spellings (false, true) and "" when
        it has missing cells."""
        if self.type == "boolean":
            return (*self.categories, *([""] if self.missing else []))
        return self.categories

    def to_json(self) -> dict[str, Any]:
        """The column as the schema file writes it."""
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.is_numeric:
            out["min"], out["max"] = self._bound_json(self.min), self._bound_json(self.max)
            if self.edges is not None:
                out["edges"] = [self._bound_json(e) for e in self.edges]
            if self.decimals is not None:
                out["decimals"] = self.decimals
            if self.clock is not None:
                out["clock"] = self.clock
            if self.is_time:
                if self.format is not None:
                    out["format"] = self.format
                if self.timezone is not None:
                    out["timezone"] = self.timezone
        if self.type == "boolean":
            out["true"], out["false"] = self.categories[1], self.categories[0]
        if self.is_numeric or self.type == "boolean":
            out["missing"] = self.missing
        if self.type == "id":
            out["prefix"] = self.prefix
        if self.type == "categorical":
            out["categories"] = list(self.categories)
            if self.other is not None:
                out["other"] = self.other
            if self.weights is not None:
                out["weights"] = list(self.weights)
                if self.weights_source is not None:
                    out["weights_source"] = self.weights_source
        if self.source is not None:
            out["source"] = self.source
        return out

    def _bound_json(self, value: float | None) -> float | int | str | None:
        if value is None or not self.is_time:
            return _number_json(value)
        return time_text(value, self.type)


@dataclass(frozen=True)
class Schema:
    """A table's public schema: its columns in file order and the target column's name."""

    columns: tuple[Column, ...]
    target: str
    notes: tuple[str, ...] = field(default=())

    @property
    def target_column(self) -> Column:
        """The target's column."""
        return next(c for c in self.columns if c.name == self.target)

    @property
    def features(self) -> tuple[Column, ...]:
        """The columns a generator learns, in file order: all but the target, ignored and
        identifier columns."""
        return tuple(c for c in self.columns if c.is_feature and c.name != self.target)

    @property
    def classes(self) -> tuple[str, ...]:
        """The public label set: the target's categories."""
        return self.target_column.categories

    def data_derived(self) -> list[str]:
        """Names of columns whose bounds or categories were read off the private data."""
        return [c.name for c in self.columns if c.data_derived]

    def with_source(self, names: Iterable[str], source: str) -> Schema:
        """This schema with the `source` of the named columns replaced."""
        wanted = set(names)
        columns = tuple(replace(c, source=source) if c.name in wanted else c for c in self.columns)
        return replace(self, columns=columns)

    def replace_column(self, column: Column) -> Schema:
        """This schema with the column of the same name replaced."""
        columns = tuple(column if c.name == column.name else c for c in self.columns)
        return replace(self, columns=columns)

    def to_json(self) -> dict[str, Any]:
        """The schema file's content."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "target": self.target,
            "columns": [c.to_json() for c in self.columns],
        }
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def _number_json(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() and abs(value) < 2**53 else float(value)


def time_text(seconds: float, kind: str) -> str:
    """A time bound as ISO 8601: `YYYY-MM-DD` for a date, `YYYY-MM-DDTHH:MM:SS` (UTC)."""
    moment = datetime.fromtimestamp(float(seconds), tz=UTC)
    if kind == "date":
        return moment.strftime("%Y-%m-%d")
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{moment.microsecond:06d}" if moment.microsecond else "")
