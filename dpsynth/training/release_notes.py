"""What a DP schema release kept, merged or dropped, column by column, in words: for `train`'s
output and the table report (`evaluate --report`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dpsynth.data.column_values import RELEASED_PREFIX
from dpsynth.data.schema_draft import OTHER

# What the release says of a number whose range is the last resort's guess (a release
# warning, `schema_entries.apply_release`; `describe_released` reads it back).
GUESSED_RANGE = (
    "no bin of its range grid cleared the noise at this ε and size, so its range is a guess "
    "(where its present count says values lie) and its values may be drawn far from the real "
    "ones"
)

_SHOWN = 6


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _listed(values: list[str]) -> str:
    return ", ".join(values[:_SHOWN]) + (", …" if len(values) > _SHOWN else "")


def describe_released(
    entry: Mapping[str, Any],
    target: str,
    warnings: list[str],
    clipped: float | None = None,
    deviation: float | None = None,
) -> str:
    """What the DP schema release kept of one released column (its entry in the run's
    schema JSON; `warnings`: the release's, which say why a number was dropped; `clipped`:
    the share of a number's values its range is estimated to clip, from the noisy counts,
    and `deviation` that estimate's noise, in the same share)."""
    name, kind = str(entry.get("name")), entry.get("type")
    if kind == "ignored":
        prefix = f"column {name!r}: "
        why = next((w for w in warnings if w.startswith(prefix)), None)
        return "dropped: " + (why[len(prefix) :] if why else "no range cleared the noise")
    if kind == "categorical":
        categories = [str(c) for c in entry.get("categories", [])]
        other = entry.get("other")
        # the release's own catch-all is '(other)'; a kept value may absorb the rest instead
        kept = [c for c in categories if c != other or not str(other).startswith(OTHER)]
        if name == target:
            return f"label set {_listed(kept)}; rows of another label are left out"
        if not kept:
            return f"no category cleared the threshold: every value is {other}"
        rest = f"; the rest becomes {other}" if other is not None else ""
        return f"kept {len(kept)} categor{'y' if len(kept) == 1 else 'ies'} ({_listed(kept)}){rest}"
    missing = "with" if entry.get("missing") else "no"
    if kind == "boolean":
        return f"{missing} missing cells"
    parts = [f"range [{_number(entry.get('min'))}, {_number(entry.get('max'))}]"]
    edges = entry.get("edges")
    if isinstance(edges, list) and len(edges) > 1:
        parts.append(f"{len(edges) - 1} bins")
    parts.append(f"{missing} missing cells")
    if entry.get("decimals") is not None:
        parts.append(f"{entry['decimals']} decimal(s)")
    if clipped is not None:
        spread = f" (± {deviation:.0%})" if deviation is not None else ""
        parts.append(f"about {clipped:.0%}{spread} of values beyond the range (noisy estimate)")
    prefix = f"column {name!r}: "
    if any(w.startswith(prefix) and GUESSED_RANGE in w for w in warnings):
        parts.append("a crude range guessed from the noise (see its warning)")
    return ", ".join(parts)


def release_lines(
    schema: Mapping[str, Any],
    warnings: Sequence[str] = (),
    clipped: Mapping[str, float] | None = None,
    deviations: Mapping[str, float] | None = None,
) -> list[str]:
    """'COLUMN: what was released' for every column of the run's schema JSON that the DP
    release wrote (its `source` says so), in the schema's order (`clipped`: the release's
    estimated clipped share per number, `deviations` the noise of each estimate)."""
    target = str(schema.get("target"))
    lines = []
    for entry in schema.get("columns", []):
        if isinstance(entry, dict) and str(entry.get("source", "")).startswith(RELEASED_PREFIX):
            name = entry.get("name")
            share = (clipped or {}).get(str(name))
            deviation = (deviations or {}).get(str(name))
            text = describe_released(entry, target, list(warnings), share, deviation)
            lines.append(f"{name}: {text}")
    return lines
