"""Data-independent noise schedules (spec §3.3) and their grouping into ledger events.

The schedule gives a factor f(t) ≤ 1 per generator iteration t = 0 … n_g−1; the noise
multiplier of each of that iteration's n_d discriminator steps is z₀·f(t). Nothing here
depends on the data, so the whole sequence, and the ε it costs, is fixed before training
(spec §4.3.3).

To keep the heterogeneous PRV composition cheap, equal factors are grouped into one segment
each; when a schedule has more than `MAX_SEGMENTS` distinct factors (a smooth decay), each
factor is first rounded DOWN onto a geometric grid 1, r⁻¹, r⁻², … (r ≥ 1.01 chosen so that
at most `MAX_SEGMENTS` values remain). Rounding down means less noise than the formula asks
for, never more privacy than is accounted: the trainer uses exactly the rounded σ that the
ledger events record.
"""

from __future__ import annotations

import math

MAX_SEGMENTS = 24
MIN_GRID_RATIO = 1.01


def factors(kind: str, n_g: int, decay: float, step_every: int) -> list[float]:
    """f(t) for t = 0 … n_g−1 (Eqs. 19–21 of the paper; `constant` is 1 throughout)."""
    ts = range(n_g)
    if kind == "constant":
        return [1.0 for _ in ts]
    if kind == "time":
        return [1.0 / (1.0 + decay * t) for t in ts]
    if kind == "exp":
        return [math.exp(-decay * t) for t in ts]
    if kind == "step":
        return [decay ** (t // step_every) for t in ts]
    raise ValueError(f"unknown schedule {kind!r}")


def _round_down(value: float, ratio: float) -> float:
    """The largest r^(−j) (j ≥ 0 integer) that is ≤ value (value in (0, 1])."""
    j = math.ceil(-math.log(value) / math.log(ratio) - 1e-12)
    rounded = ratio ** (-j)
    while rounded > value:  # floating-point safety: never round up
        j += 1
        rounded = ratio ** (-j)
    return rounded


def rounded_factors(raw: list[float]) -> tuple[list[float], float | None]:
    """The factors the run uses: `raw` if it has few distinct values, else rounded down on a
    geometric grid; also the grid ratio (None when no rounding was needed)."""
    if len(set(raw)) <= MAX_SEGMENTS:
        return list(raw), None
    span = math.log(max(raw) / min(raw))
    ratio = max(MIN_GRID_RATIO, math.exp(span / (MAX_SEGMENTS - 1)) * (1.0 + 1e-9))
    out = [_round_down(f, ratio) for f in raw]
    while len(set(out)) > MAX_SEGMENTS:  # the top/bottom ends can add one value each
        ratio *= 1.05
        out = [_round_down(f, ratio) for f in raw]
    return out, ratio


def segments(per_iteration: list[float], n_d: int) -> list[tuple[float, int]]:
    """Runs of equal consecutive factors as (factor, D steps) pairs, in training order."""
    out: list[tuple[float, int]] = []
    for factor in per_iteration:
        if out and out[-1][0] == factor:
            out[-1] = (factor, out[-1][1] + n_d)
        else:
            out.append((factor, n_d))
    return out
