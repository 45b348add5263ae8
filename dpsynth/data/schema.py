"""The public schema of a table: per column its type, public bounds or category list, the target.

A schema is a JSON file (`--schema FILE.json`):

    {"format": "dpsynth-schema-v1", "target": "credit_risk",
     "columns": [
       {"name": "age", "type": "integer", "min": 18, "max": 80},
       {"name": "amount", "type": "numeric", "min": 0, "max": 20000},
       {"name": "purpose", "type": "categorical", "categories": ["A40", "A41"]},
       {"name": "id", "type": "ignored"}]}

Types: `numeric` (float, public `min` ≤ `max`), `integer` (the same, written as integers),
`categorical` (public `categories`, strings as they appear in the file after stripping blanks;
an optional `other`, one of the categories, absorbs values not in the list) and `ignored`
(not read; its column is written empty). The `target` must be categorical: its categories are
the public label set (`classes`); it may carry `weights`, public class proportions (e.g. from
published statistics; normalised to sum 1, never drafted from the data), which a backend may
use to generate labels in those proportions. Weights marked `"weights_source": "data ..."` are
not public: `train` refuses them unless declared (`--schema-public`) or replaced by a DP release
(`--class-weights-epsilon`, which writes `weights` and its own `weights_source`).

Every bound or category list read off the private data carries `"source":
"data (not private: review or replace)"` (`draft_schema` writes it). Such a column is not
public yet: `train` refuses it unless the user declares it public (`--schema-public`) or has it
released through a charged mechanism (`--schema-epsilon`). This module only reads, checks and
drafts schemas; it adds no noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dpsynth.errors import DataError, UsageError

FORMAT = "dpsynth-schema-v1"
DATA_SOURCE = "data (not private: review or replace)"
TYPES = ("numeric", "integer", "categorical", "ignored")
# Integer columns with at most this many distinct values are drafted as categorical (codes).
DRAFT_MAX_INTEGER_LEVELS = 10


@dataclass(frozen=True)
class Column:
    """One column of a schema (see the module docstring)."""

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

    @property
    def weights_derived(self) -> bool:
        """True when its class proportions were read off the private data (not public)."""
        return self.weights is not None and (self.weights_source or "").startswith("data")

    @property
    def data_derived(self) -> bool:
        """True when its bounds or categories were read off the private data (not public)."""
        return self.type != "ignored" and (self.source or "").startswith("data")

    @property
    def is_numeric(self) -> bool:
        """numeric or integer."""
        return self.type in ("numeric", "integer")

    def to_json(self) -> dict[str, Any]:
        """The column as the schema file writes it."""
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.is_numeric:
            out["min"], out["max"] = _number_json(self.min), _number_json(self.max)
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
        """The columns a generator learns, in file order: all but the target and ignored ones."""
        return tuple(c for c in self.columns if c.type != "ignored" and c.name != self.target)

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
    if kind in ("numeric", "integer"):
        low, high = _number(obj, "min", where), _number(obj, "max", where)
        if low > high:
            raise UsageError(f"{where}: min {low:g} is above max {high:g}")
        if not math.isfinite(high - low):
            # [min, max] is scaled to [-1, 1]: its width must be a finite number too
            raise UsageError(f"{where}: the range from {low:g} to {high:g} overflows a float")
        return Column(name, kind, low, high, source=source)
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


def _parse_numbers(values: Sequence[str]) -> list[float] | None:
    out = []
    for value in values:
        try:
            number = float(value)
        except ValueError:
            return None
        if not math.isfinite(number):
            return None
        out.append(number)
    return out


def draft_column(name: str, values: Sequence[str]) -> Column:
    """A column drafted from its (stripped) values, every entry marked as read off the data.

    Non-numbers → categorical; integers with at most DRAFT_MAX_INTEGER_LEVELS distinct values
    → categorical (codes); other integers → integer; other numbers → numeric.
    """
    distinct = sorted({str(v) for v in values})
    numbers = _parse_numbers(distinct)
    if numbers is None or (
        all(n.is_integer() for n in numbers) and len(distinct) <= DRAFT_MAX_INTEGER_LEVELS
    ):
        ordered = sorted(distinct, key=lambda v: (float(v), v)) if numbers else distinct
        return Column(name, "categorical", categories=tuple(ordered), source=DATA_SOURCE)
    kind = "integer" if all(n.is_integer() for n in numbers) else "numeric"
    return Column(name, kind, min(numbers), max(numbers), source=DATA_SOURCE)


def draft_schema(header: Sequence[str], columns: Sequence[Sequence[str]], target: str) -> Schema:
    """A schema drafted from a table's columns (strings), for the user to review.

    Every bound and category list comes from the private data and is marked so: the draft is
    a starting point, not a public declaration.
    """
    if target not in header:
        raise UsageError(f"--target {target!r} is not a column (columns: {', '.join(header)})")
    drafted = []
    for name, values in zip(header, columns, strict=True):
        column = draft_column(name, values)
        if name == target and column.type != "categorical":
            column = Column(
                name,
                "categorical",
                categories=tuple(sorted({str(v) for v in values})),
                source=DATA_SOURCE,
            )
        drafted.append(column)
    notes = (
        "Drafted by `dpsynth data schema` from the private data: every entry marked "
        f"'source: {DATA_SOURCE}' is not private. Replace bounds and category lists with public "
        "knowledge (then delete the mark), set unused columns to type 'ignored', or train with "
        "--schema-public (declaring them public) or --schema-epsilon E (releasing them with DP).",
    )
    schema = Schema(tuple(drafted), target, notes)
    if len(schema.classes) < 2:
        raise DataError(f"the target {target!r} has fewer than two distinct values")
    return schema
