"""`--set key=value`: a backend's preset with the overrides applied, each value cast to the
type of the preset's own (`Method.config` checks the shared keys after)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.errors import UsageError


def with_overrides(
    preset: Mapping[str, Any], overrides: Mapping[str, Any], method: str
) -> dict[str, Any]:
    """The preset's values with `overrides` applied (a key the preset lacks is a UsageError
    naming the known ones; a value is cast by `cast_like`)."""
    merged = dict(preset)
    for key, value in overrides.items():
        if key not in merged:
            raise UsageError(
                f"unknown setting {key!r} for --method {method}; known: {', '.join(sorted(merged))}"
            )
        merged[key] = cast_like(merged[key], value, key)
    return merged


def cast_like(template: Any, value: Any, key: str) -> Any:
    """Cast a `--set` string to the type of the preset's value."""
    if not isinstance(value, str):
        return value
    try:
        if isinstance(template, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(template, int):
            return int(value)
        if isinstance(template, float):
            return float(value)
        if isinstance(template, (list, tuple)):
            parts = [p for p in value.replace(";", ",").split(",") if p.strip()]
            elem = template[0] if template else value
            return type(template)(cast_like(elem, p.strip(), key) for p in parts)
    except ValueError:
        raise UsageError(f"--set {key}={value}: expected {type(template).__name__}") from None
    return value
