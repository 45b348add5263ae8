"""The public schema of a table: per column its type, public bounds or category list, the target.

A schema is a JSON file (`--schema FILE.json`):

    {"format": "dpsynth-schema-v1", "target": "outcome",
     "columns": [
       {"name": "patient_id", "type": "id"},
       {"name": "admitted", "type": "datetime", "min": "2019-01-01T00:00:00",
        "max": "2024-12-31T23:59:59", "format": "%Y-%m-%d %H:%M", "missing": false},
       {"name": "age", "type": "integer", "min": 0, "max": 110, "missing": true},
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
  repeated twice marks a point mass such as 0; declared or released with DP).
- `datetime` and `date`: the same on a time axis. `min`/`max` are ISO 8601 in the schema
  (seconds since 1970-01-01 UTC inside), `format` is the strftime format the file uses (it is
  written back in it), `timezone` the UTC offset ("+01:00") when the values carry one.
- `boolean`: two spellings, `true` and `false` (as the file writes them), and `missing`.
- `categorical`: public `categories`, strings as they appear in the file after stripping
  blanks; an empty cell is the category "" (list it to keep it); an optional `other`, one of
  the categories, absorbs values not in the list.
- `id`: an identifier (one value per row). Never read for training; `sample` writes fresh
  surrogate keys `<prefix><n>` (`prefix` default "syn-"), never a real value.
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
(`--schema-epsilon`, see `dpsynth.tables`), or the user declares it public
(`--schema-public`). This module only reads and checks schemas; it adds no noise.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpsynth.errors import UsageError

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


def _finite(value: Any) -> float | None:
    """`value` as a finite float, or None (not a number, a bool, infinite, or an integer too
    large for a float: JSON integers have no size limit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(obj: Mapping[str, Any], key: str, where: str) -> float:
    number = _finite(obj.get(key))
    if number is None:
        raise UsageError(f"{where}: {key!r} must be a finite number, got {_shown(obj.get(key))}")
    return number


def time_text(seconds: float, kind: str) -> str:
    """A time bound as ISO 8601: `YYYY-MM-DD` for a date, `YYYY-MM-DDTHH:MM:SS` (UTC)."""
    moment = datetime.fromtimestamp(float(seconds), tz=UTC)
    if kind == "date":
        return moment.strftime("%Y-%m-%d")
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{moment.microsecond:06d}" if moment.microsecond else "")


def _time_bound(obj: Mapping[str, Any], key: str, where: str) -> float:
    """A time column's bound: ISO 8601 text (UTC unless it carries an offset) or seconds."""
    value = obj.get(key)
    number = _finite(value)
    if number is not None:
        return number
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return moment.timestamp()
    raise UsageError(f"{where}: {key!r} must be an ISO 8601 date or time, got {_shown(value)}")


def _flag(obj: Mapping[str, Any], key: str, where: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise UsageError(f"{where}: {key!r} must be true or false, got {_shown(value)}")
    return value


def _optional_text(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise UsageError(f"{where}: {key!r} must be a non-empty string")
    return value


def _numeric_column(obj: Mapping[str, Any], name: str, kind: str, source: Any) -> Column:
    where = f"schema column {name!r}"
    bound = _time_bound if kind in TIME_TYPES else _number
    low, high = bound(obj, "min", where), bound(obj, "max", where)
    if low > high:
        raise UsageError(f"{where}: min {obj.get('min')} is above max {obj.get('max')}")
    if not math.isfinite(high - low):
        # [min, max] is scaled to [-1, 1]: its width must be a finite number too
        raise UsageError(f"{where}: the range from {low:g} to {high:g} overflows a float")
    edges = None
    if obj.get("edges") is not None:
        raw_edges = obj["edges"]
        if not isinstance(raw_edges, list) or len(raw_edges) < 2:
            raise UsageError(f"{where}: 'edges' must be a list of at least two bin edges")
        edges = tuple(bound({"edge": e}, "edge", where) for e in raw_edges)
        if any(b < a for a, b in itertools.pairwise(edges)):
            raise UsageError(f"{where}: 'edges' must be in ascending order")
        if any(a == b == c for a, b, c in zip(edges, edges[1:], edges[2:], strict=False)):
            raise UsageError(f"{where}: 'edges' repeats a value more than twice")
        if edges[0] != low or edges[-1] != high:
            raise UsageError(f"{where}: 'edges' must start at min and end at max")
    decimals = obj.get("decimals")
    if decimals is not None and (
        isinstance(decimals, bool)
        or not isinstance(decimals, int)
        or not 0 <= decimals <= MAX_DECIMALS
        or kind != "numeric"
    ):
        raise UsageError(
            f"{where}: 'decimals' must be a whole number from 0 to {MAX_DECIMALS}, on a "
            "numeric column"
        )
    return Column(
        name,
        kind,
        low,
        high,
        source=source,
        missing=_flag(obj, "missing", where),
        decimals=decimals,
        edges=edges,
        format=_optional_text(obj, "format", where) if kind in TIME_TYPES else None,
        timezone=_optional_text(obj, "timezone", where) if kind in TIME_TYPES else None,
    )


def parse_column(obj: Any, index: int) -> Column:
    """One column from its JSON object (UsageError naming the column for a bad entry)."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"schema column {index}: expected an object, got {obj!r}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"schema column {index}: 'name' must be a non-empty string")
    where = f"schema column {name!r}"
    kind = obj.get("type")
    if kind not in TYPES:
        raise UsageError(f"{where}: 'type' must be one of {', '.join(TYPES)}, got {kind!r}")
    source = obj.get("source")
    if source is not None and not isinstance(source, str):
        raise UsageError(f"{where}: 'source' must be a string")
    if kind in NUMERIC_TYPES:
        return _numeric_column(obj, name, kind, source)
    if kind == "boolean":
        true, false = obj.get("true", "true"), obj.get("false", "false")
        if not (isinstance(true, str) and isinstance(false, str) and true and false):
            raise UsageError(f"{where}: 'true' and 'false' must be non-empty strings")
        if true == false:
            raise UsageError(f"{where}: 'true' and 'false' must differ")
        missing = _flag(obj, "missing", where)
        return Column(name, kind, categories=(false, true), source=source, missing=missing)
    if kind == "id":
        prefix = obj.get("prefix", DEFAULT_ID_PREFIX)
        if not isinstance(prefix, str) or not prefix:
            raise UsageError(f"{where}: 'prefix' must be a non-empty string")
        return Column(name, kind, source=source, prefix=prefix)
    if kind == "categorical":
        categories = obj.get("categories")
        if (
            not isinstance(categories, list)
            or not categories
            or not all(isinstance(c, str) for c in categories)
        ):
            raise UsageError(f"{where}: 'categories' must be a non-empty list of strings")
        if len(set(categories)) != len(categories):
            raise UsageError(f"{where}: 'categories' lists a value twice")
        other = obj.get("other")
        if other is not None and other not in categories:
            raise UsageError(f"{where}: 'other' ({other!r}) must be one of its categories")
        weights = obj.get("weights")
        if weights is not None:
            if (
                not isinstance(weights, list)
                or len(weights) != len(categories)
                or not all((_finite(w) or 0.0) > 0 for w in weights)
                or not math.isfinite(sum(float(w) for w in weights))
            ):
                raise UsageError(f"{where}: 'weights' must be one positive number per category")
            total = float(sum(float(w) for w in weights))
            weights = tuple(float(w) / total for w in weights)
        weights_source = obj.get("weights_source")
        if weights_source is not None and (weights is None or not isinstance(weights_source, str)):
            raise UsageError(f"{where}: 'weights_source' must be a string beside 'weights'")
        return Column(
            name,
            kind,
            categories=tuple(categories),
            other=other,
            source=source,
            weights=weights,
            weights_source=weights_source,
        )
    return Column(name, "ignored", source=source)


def parse_schema(obj: Any, where: str = "schema") -> Schema:
    """A Schema from its JSON object (UsageError, exit 2, for anything malformed)."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"{where}: expected a JSON object")
    if obj.get("format", FORMAT) != FORMAT:
        raise UsageError(f"{where}: unknown format {obj.get('format')!r} (expected {FORMAT})")
    raw_columns = obj.get("columns")
    if not isinstance(raw_columns, list) or not raw_columns:
        raise UsageError(f"{where}: 'columns' must be a non-empty list")
    columns = tuple(parse_column(c, i) for i, c in enumerate(raw_columns))
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise UsageError(f"{where}: a column name appears twice")
    target = obj.get("target")
    if target not in names:
        raise UsageError(f"{where}: 'target' must name one of its columns, got {target!r}")
    notes = obj.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise UsageError(f"{where}: 'notes' must be a list of strings")
    schema = Schema(columns, str(target), tuple(notes))
    if schema.target_column.type != "categorical":
        raise UsageError(f"{where}: the target {target!r} must be categorical (the label set)")
    if len(schema.classes) < 2:
        raise UsageError(f"{where}: the target {target!r} needs at least two categories")
    if any(c.weights is not None for c in schema.columns if c.name != schema.target):
        raise UsageError(f"{where}: only the target may carry 'weights' (class proportions)")
    if not schema.features:
        raise UsageError(f"{where}: no column besides the target is used")
    return schema


# A schema file lists column names, bounds and categories: a few KiB, or a few MiB for a wide
# table with long category lists. Anything larger is not a schema; it is refused unread.
MAX_SCHEMA_BYTES = 16 << 20


def read_schema(path: Path | str) -> Schema:
    """Read and check a schema file (UsageError for a missing or malformed file)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise UsageError(f"--schema {path}: is a folder, not a JSON file")
        size = path.stat().st_size
        if size > MAX_SCHEMA_BYTES:
            raise UsageError(
                f"--schema {path}: {size} bytes, more than the {MAX_SCHEMA_BYTES >> 20} MiB cap "
                "of a schema file"
            )
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--schema {path}: no such file") from None
    except RecursionError:
        raise UsageError(f"--schema {path}: JSON nested too deeply to be a schema") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:160]
        raise UsageError(f"--schema {path}: not a readable JSON file ({reason})") from None
    return parse_schema(obj, f"--schema {path}")
