"""The public grids of the DP schema release: where a number's or a time's rough range is read
(round 1) and the fine bins its span and shape are counted in (rounds 2 and 3). Public: they
depend on the column's type and the released range (and round 1's range before padding, a
function of its noisy counts) only, never on the rows."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np

from dpsynth.privacy.mechanisms.histograms import numeric_bin_edges

FINE_BINS = 64
# A number's linear fine bins go inside its range before padding when the padding is more
# than this share of the range (`core_weighted`).
PADDING_SHARE = 0.5
# ... and steps over the padding on at most this many of the range grid's edges each side.
PADDING_EDGES = 4


def year_edges() -> np.ndarray:
    """The public grid of time ranges: 1 January of 1900 … 2101 (seconds), with overflow bins."""
    years = [datetime(y, 1, 1, tzinfo=UTC).timestamp() for y in range(1900, 2102)]
    return np.concatenate([[-np.inf], years, [np.inf]])


def integer_edges() -> np.ndarray:
    """The public grid of whole numbers' ranges: 0 and ±ceil(2^(j/2)) from 1 (−inf, …, −2, −1,
    0, 1, 2, 3, 4, 6, 8, 12, …, +inf): a bin per value up to 4, then √2 steps, with no bin that
    no whole number can fall in (a count's 0 and 1 are neighbours, not 40 bins apart)."""
    grid = numeric_bin_edges()
    steps = np.unique(np.ceil(grid[np.isfinite(grid) & (grid >= 1.0)]))
    return np.concatenate([[-np.inf], -steps[::-1], [0.0], steps, [np.inf]])


def range_grid(kind: str) -> np.ndarray:
    """The public grid a number's rough range is read on: calendar years for dates and times,
    whole steps for integers (`integer_edges`), 0 and ±2^(j/2) otherwise."""
    if kind in ("datetime", "date"):
        return year_edges()
    return integer_edges() if kind == "integer" else numeric_bin_edges()


def _skewed(low: float, high: float) -> bool:
    """A positive range over orders of magnitude (incomes, amounts): binned geometrically."""
    return low >= 0 and high > 0 and high / max(low, high * 1e-6) > 100


def fine_grid(
    low: float,
    high: float,
    kind: str,
    bins: int = FINE_BINS,
    core: tuple[float, float] | None = None,
) -> np.ndarray:
    """The public edges of the shape histogram inside [low, high] (see the module docstring);
    for a linear grid with `core` (round 1's range before padding, public), its bins where
    the values are (`core_weighted`)."""
    if kind in ("numeric", "integer") and core is not None and not _skewed(low, high):
        weighted = core_weighted(low, high, core, bins, kind)
        if weighted is not None:
            return weighted
    if kind == "integer" and _skewed(low, high) and high - low + 1 > bins:
        first, last = math.ceil(low), math.floor(high)
        geometric = np.round(np.geomspace(max(first, 1), last + 1, bins))
        return np.unique(np.concatenate([[first], geometric])).astype(np.float64)
    if kind == "integer" or kind == "date":
        unit = 86400.0 if kind == "date" else 1.0
        first, last = math.ceil(low / unit), math.floor(high / unit)
        last = max(last, first)
        step = max(1, math.ceil((last - first + 1) / bins))
        return np.arange(first, last + step + 1, step, dtype=np.float64) * unit
    if high <= low:
        return np.array([low, low + 1.0])
    if _skewed(low, high):
        floor = max(low, high * 1e-4)
        geometric = np.geomspace(floor, high, bins)
        return np.unique(np.concatenate([[low], geometric]))
    return np.linspace(low, high, bins + 1)


def _padding_edges(
    low: float, high: float, first: float, last: float, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """The range grid's edges in the padding [low, first) and (last, high], at most
    PADDING_EDGES a side, those nearest to the core (padding crossing 0 would add dozens)."""
    grid = range_grid(kind)
    apart = 1e-9 * max(abs(low), abs(high))  # edges a rounding apart are one edge
    below = grid[(grid > low + apart) & (grid < first - apart)][-PADDING_EDGES:]
    above = grid[(grid > last + apart) & (grid < high - apart)][:PADDING_EDGES]
    return below, above


def value_unit(kind: str) -> float:
    """The step between a column's values: 1 for whole numbers, a day for dates, 0 (none)
    for floats and times."""
    return {"integer": 1.0, "date": 86400.0}.get(kind, 0.0)


def core_weighted(
    low: float, high: float, core: tuple[float, float], bins: int, kind: str = "numeric"
) -> np.ndarray | None:
    """Linear edges over [low, high] that put their bins inside `core` and step over the
    padding beyond it on the range grid's own edges (a factor of √2 a bin), when the padding
    is most of the range (None otherwise; whole numbers: also when they fit one a bin). Round
    1 pads a range by a factor of 2–4 each side where its noise can hide a tail, and round 2
    keeps that padding where its noise outweighs 2% of the values: a log income of 8.8–11.1
    kept as 7.4–43 was cut into bins of 1.5, and the model drew its values over two of them;
    alcohol codes 0–5 kept as −12–1027 were drawn up to 40 (post-processing: `core` is a
    function of round 1's noisy counts)."""
    if kind == "integer":  # whole-number edges, the last one past the last value
        low, high = math.ceil(low), math.floor(high) + 1
        if high - low <= bins:
            return None
    first, last = max(core[0], low), min(core[1], high)
    if not last > first or last - first > PADDING_SHARE * (high - low):
        return None
    below, above = _padding_edges(low, high, first, last, kind)
    padding = (len(below) + 1) * (first > low) + (len(above) + 1) * (high > last)
    inside = np.linspace(first, last, max(bins - padding, bins // 2) + 1)
    if kind == "integer":
        inside = np.round(inside)
    return np.unique(np.concatenate([[low], below, inside, above, [high]])).astype(np.float64)


def whole_core_grid(low: float, high: float, core: tuple[float, float]) -> np.ndarray | None:
    """Whole-number edges a value a bin inside `core` (round 1's range before padding,
    public) and on the range grid's own edges over the padding beyond it (at most
    PADDING_EDGES a side), when the padding is most of [low, high]; None otherwise. Years of
    schooling, 2–18, padded to 2–91, were counted a value a bin up to 91: a model bin over the
    padding summed 70 cells of noise (its 1-way measurement ± 23% of 1,110 rows)."""
    low, high = math.ceil(low), math.floor(high) + 1
    first, last = max(math.floor(core[0]), low), min(math.ceil(core[1]), high)
    if not last > first or last - first > PADDING_SHARE * (high - low):
        return None
    below, above = _padding_edges(low, high, first, last, "integer")
    inside = np.arange(first, last + 1, dtype=np.float64)
    return np.unique(np.concatenate([[low], below, inside, above, [high]])).astype(np.float64)


def coarser_than_unit(grid: np.ndarray) -> bool:
    """Whether a whole number's even fine grid bins several of its values together (years
    on a grid of 327: round 2 then looks for the bins that hold them)."""
    return float(np.min(np.diff(grid))) > 1.0


def closed_last_bin(edges: np.ndarray, unit: float) -> np.ndarray:
    """Whole-number edges whose last bin is closed, as the schema reads them.

    The fine grid's bins are [a, a + step) and its last edge lies one unit past the last
    value; a schema's last bin is closed ([a, b], `max` = b). So the last edge moves back one
    unit; a last bin of one value becomes a point mass (the edge twice).
    """
    last = edges[-1] - unit
    if len(edges) < 3 or last > edges[-2]:
        return np.concatenate([edges[:-1], [max(last, edges[0])]])
    if edges[-3] == edges[-2]:  # already a point mass there
        return edges[:-1]
    return np.concatenate([edges[:-1], [edges[-2]]])


def with_atom(edges: tuple[float, ...], atom: float) -> tuple[float, ...]:
    """Edges with a point mass at `atom` (inside or at the end of their range)."""
    inner = [e for e in edges if e != atom]
    out = sorted([*inner, atom, atom])
    return tuple(out)
