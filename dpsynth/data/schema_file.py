"""Reading a schema file: JSON checked field by field into a `Schema` (`dpsynth.data.schema`),
every error naming the column and the field."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpsynth.data.schema import (
    CLOCK_FORMATS,
    DEFAULT_ID_PREFIX,
    FORMAT,
    MAX_DECIMALS,
    MINUTES_PER_DAY,
    NUMERIC_TYPES,
    TIME_TYPES,
    TYPES,
    Column,
    Schema,
)
from dpsynth.errors import UsageError


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
    clock = obj.get("clock")
    if clock is not None and (kind != "integer" or clock not in CLOCK_FORMATS):
        raise UsageError(
            f"{where}: 'clock' must be one of {', '.join(CLOCK_FORMATS)}, on an integer column"
        )
    if clock is not None and not 0 <= low <= high <= MINUTES_PER_DAY:
        raise UsageError(
            f"{where}: a clock column's min and max are minutes since midnight, from 0 to "
            f"{MINUTES_PER_DAY}"
        )
    return Column(
        name,
        kind,
        low,
        high,
        source=source,
        missing=_flag(obj, "missing", where),
        decimals=decimals,
        clock=clock,
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


SchemaInput = Path | str | Schema | Mapping[str, Any]
"""A schema as the API takes it: a JSON file, a `Schema`, or its JSON as a dict."""


def as_schema(given: SchemaInput) -> Schema:
    """A `Schema` from a file (`read_schema`), a dict of its JSON (checked the same way), or a
    `Schema` as it is."""
    if isinstance(given, Schema):
        return given
    if isinstance(given, Mapping):
        return parse_schema(given, "schema")
    if isinstance(given, str | Path):
        return read_schema(given)
    raise UsageError(
        "{schema} must be a schema file, a Schema or its JSON as a dict", parameter="schema"
    )


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
