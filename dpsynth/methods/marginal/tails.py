"""Where a value is drawn inside a number's end bins: a tail that falls away from the rows.

A DP range errs wide (every value beyond it is clipped), so a number's first and last bins
often stretch far past its rows: nhefs' ages (25–74) were released as 21–202, and a value
drawn uniformly inside the last bin, [71, 202], lies beyond 74 nineteen times in twenty. Where
an end bin is less dense than its neighbour inward, its values are drawn from a truncated
exponential density instead, continuous with the neighbour's density at the shared edge and
falling outward; its mass is the model's. In a number's end bin moving away from zero
(positive values upward, negative ones downward) the density falls exponentially in the
logarithm of the value (a Pareto tail: amounts and incomes), otherwise (a time, or towards
zero) in the value itself.

Post-processing only: the densities come from the fitted model's public one-way marginal
(or, for the release checks, from the released noisy counts), never from data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsynth.data.discrete import Attribute

# Newton steps for the decay rate (from a start within a factor of 2, ample for 1e-12).
_NEWTON_STEPS = 60


@dataclass(frozen=True)
class EndTail:
    """How one end bin of an edges attribute is drawn: `rate` is the decay over the whole bin
    (t = λ·width in the bin's coordinate, > 0), falling towards the bin's `outer` edge;
    `log`: the coordinate is log|value| (the bin's edges share a sign, and it moves away
    from zero)."""

    code: int
    rate: float
    outer_is_high: bool
    log: bool


def decay_rate(ratio: float) -> float:
    """The t > 0 with t / (1 − e^(−t)) = `ratio` (> 1): the decay over a bin whose density at
    its inner edge is `ratio` times its mean density."""
    if ratio <= 1.0:
        return 0.0
    t = ratio if ratio > 2.0 else 2.0 * (ratio - 1.0)
    for _ in range(_NEWTON_STEPS):
        e = math.exp(-t)
        value = t / (1.0 - e) - ratio
        slope = (1.0 - e - t * e) / (1.0 - e) ** 2
        step = value / slope
        t = max(t - step, t / 2.0)
        if abs(step) < 1e-12 * max(t, 1.0):
            break
    return t


def _coordinate(
    low: float, high: float, outer_is_high: bool, magnitude: bool
) -> tuple[bool, float]:
    """Whether the bin [low, high] is read in log|value| (a number, not a time, whose edges
    share a sign and whose outer edge is the farther from zero), and its width there."""
    away = magnitude and ((low > 0 and outer_is_high) or (high < 0 and not outer_is_high))
    if away:
        return True, abs(math.log(abs(high)) - math.log(abs(low)))
    return False, high - low


def _tail(
    edges: np.ndarray,
    mass: np.ndarray,
    end: int,
    inner: int,
    outer_is_high: bool,
    magnitude: bool,
) -> EndTail | None:
    low, high = float(edges[end]), float(edges[end + 1])
    log, width = _coordinate(low, high, outer_is_high, magnitude)
    n_low, n_high = float(edges[inner]), float(edges[inner + 1])
    neighbour = n_high - n_low
    if log:  # the neighbour's width in log|value| (none where it reaches or crosses zero)
        shares_sign = n_low * n_high > 0 and (n_low > 0) == (low > 0)
        neighbour = abs(math.log(abs(n_high) / abs(n_low))) if shares_sign else 0.0
    if width <= 0 or neighbour <= 0 or mass[end] <= 0 or mass[inner] <= 0:
        return None
    with np.errstate(over="ignore"):
        ratio = float((mass[inner] / neighbour) * width / mass[end])
    if not math.isfinite(ratio):  # an end bin of next to no mass: drawn too rarely to shape
        return None
    rate = decay_rate(ratio)
    return EndTail(end, rate, outer_is_high, log) if rate > 0 else None


def end_tails(attribute: Attribute, mass: np.ndarray) -> tuple[EndTail, ...]:
    """The tails of an edges attribute's first and last bins under the one-way `mass` of its
    present bins (counts or shares, negative values read as 0); none for a point mass, a bin
    as dense as its neighbour, or an attribute without edges."""
    if attribute.kind != "edges" or len(attribute.edges) < 3:
        return ()
    edges = np.asarray(attribute.edges, dtype=np.float64)
    bins = len(edges) - 1
    mass = np.clip(np.asarray(mass, dtype=np.float64)[:bins], 0.0, None)
    if len(mass) < bins:
        return ()
    spans = np.flatnonzero(edges[1:] > edges[:-1])  # bins that are not point masses
    tails: list[EndTail] = []
    if len(spans) >= 2 and spans[0] == 0:
        tail = _tail(edges, mass, 0, int(spans[1]), False, attribute.magnitude)
        tails += [tail] if tail else []
    if len(spans) >= 2 and spans[-1] == bins - 1:
        tail = _tail(edges, mass, bins - 1, int(spans[-2]), True, attribute.magnitude)
        tails += [tail] if tail else []
    return tuple(tails)


def tail_positions(
    codes: np.ndarray, uniform: np.ndarray, attribute: Attribute, tails: tuple[EndTail, ...]
) -> np.ndarray:
    """`uniform` (the positions inside the bins, as `bin_values` reads them: the fraction of
    the bin's width from its low edge) with those in an end bin with a tail moved to where
    the tail's density puts them (inverse CDF)."""
    if not tails:
        return uniform
    out = np.array(uniform, dtype=np.float64, copy=True)
    edges = np.asarray(attribute.edges, dtype=np.float64)
    for tail in tails:
        rows = np.flatnonzero(codes == tail.code)
        if not len(rows):
            continue
        u = out[rows]
        # the share of the bin's width from its inner edge, on the tail's density
        z = -np.log1p(-u * -math.expm1(-tail.rate)) / tail.rate
        z = np.clip(z, 0.0, 1.0)
        low, high = edges[tail.code], edges[tail.code + 1]
        inner, outer = (low, high) if tail.outer_is_high else (high, low)
        if tail.log:
            value = np.sign(inner) * np.exp(
                math.log(abs(inner)) + z * (math.log(abs(outer)) - math.log(abs(inner)))
            )
        else:
            value = inner + z * (outer - inner)
        out[rows] = np.clip((value - low) / (high - low), 0.0, 1.0)
    return out
