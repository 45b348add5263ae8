"""The budget of a marginal-based synthesizer (AIM, MST): a fixed schedule, calibrated by PRV.

Such a mechanism makes `m` Gaussian measurements of marginals (sensitivity 1 each,
`privacy/mechanisms/marginal_measure.py`) and `k` exponential-mechanism selections (ε-DP each,
`privacy/mechanisms/selection.py`). The schedule is fixed before any record is read, from public
facts only (the number of columns, the preset's round count, the target ε and δ): every
measurement has the same noise multiplier σ and every selection the same ε_s. What the
mechanism *chooses* to measure may depend on earlier releases (adaptive selection), which
PRV composition of dominating pairs allows; the noise *scale* never does, so the ledger's
events are exactly what the run spends and the PRV accountant's bound is valid.

(AIM's published budget annealing halves σ when a round's measurement changed the model
little: a data-dependent noise scale, which PRV composition does not cover; it would need a
privacy filter under zCDP/RDP. The fixed schedule trades that adaptivity for the tighter PRV
accounting of the Gaussian measurements.)

The split: with a scale t, the measurements together get (1 − f)·t² and the selections f·t²
of a Gaussian-DP-like budget μ² = m/σ² + k·ε_s² (randomized response with small ε is close
to Gaussian DP with μ = ε), so σ = √(m / (1 − f)) / t and ε_s = t·√(f / k); t is the largest
scale whose PRV bound, composed with the data set's earlier spends, is at most the target ε.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy.stats import norm

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import AnyEvent, DpEvent, Gaussian, PureDp

# Relative precision of the scale t (the answer is always on the valid side).
_SCALE_RTOL = 0.003
_COARSE_REL_ERROR = 0.05


@dataclass(frozen=True)
class MarginalSchedule:
    """A calibrated schedule: σ of each measurement, ε of each selection, and the bound."""

    noise_multiplier: float
    selection_epsilon: float
    measurements: int
    selections: int
    epsilon: float
    total_epsilon: float
    accountant: str
    notes: tuple[str, ...] = ()


def accounted_events(
    noise_multiplier: float, selection_epsilon: float, measurements: int, selections: int
) -> list[DpEvent]:
    """What the accountant composes of a schedule: `measurements` Gaussian mechanisms at σ and
    (if any) `selections` pure ε_s-DP ones. The ledger's events
    (`privacy/mechanisms/marginal_measure.schedule_events`) are these with annotations, which
    have no effect on ε."""
    events: list[DpEvent] = [Gaussian(float(noise_multiplier), int(measurements))]
    if selections:
        events.append(PureDp(float(selection_epsilon), int(selections)))
    return events


def _parameters(scale: float, measurements: int, selections: int, share: float) -> tuple:
    share = share if selections else 0.0
    sigma = math.sqrt(measurements / (1.0 - share)) / scale
    epsilon = scale * math.sqrt(share / selections) if selections else 0.0
    return sigma, epsilon


def gdp_mu(epsilon: float, delta: float) -> float:
    """μ of the Gaussian-DP mechanism that is exactly (ε, δ)-DP (a starting point only)."""

    def gap(mu: float) -> float:
        return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(
            -epsilon / mu - mu / 2
        )

    lo, hi = 1e-6, 1.0
    while gap(hi) < delta and hi < 1e4:
        hi *= 2
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if gap(mid) < delta else (lo, mid)
    return lo


def calibrate_marginal_schedule(
    epsilon: float,
    delta: float,
    measurements: int,
    selections: int,
    selection_share: float,
    prior_events: Sequence[AnyEvent] = (),
) -> MarginalSchedule:
    """The schedule with the least noise whose composed ε bound is at most `epsilon`.

    `epsilon` is the data set's total budget: `prior_events` (earlier spends on the same
    data) are composed in. BudgetExceededError when they leave nothing; UsageError for
    counts or a share that make no schedule.
    """
    if measurements < 1:
        raise UsageError("a marginal schedule needs at least one measurement")
    if selections < 0:
        raise UsageError("the number of selections cannot be negative")
    if selections and not 0.0 < selection_share < 1.0:
        raise UsageError(f"the selection share must be in (0, 1), got {selection_share}")
    prior = compose_epsilon(prior_events, delta).epsilon if prior_events else 0.0
    if prior >= epsilon:
        raise BudgetExceededError(
            f"the dataset has already spent ε ≤ {prior:.4g} at δ={delta:g}, which leaves "
            f"nothing under the target ε={epsilon:g}"
        )

    def bound(scale: float, rel_error: float | None = None) -> Any:
        sigma, eps_s = _parameters(scale, measurements, selections, selection_share)
        events = accounted_events(sigma, eps_s, measurements, selections)
        if rel_error is None:
            return compose_epsilon([*prior_events, *events], delta)
        return compose_epsilon([*prior_events, *events], delta, rel_error)

    def coarse(scale: float) -> float:
        result = bound(scale, _COARSE_REL_ERROR)
        return result.estimate if result.estimate is not None else result.epsilon

    aim = epsilon * 0.994
    lo = hi = gdp_mu(epsilon - prior, delta)
    while coarse(hi) <= aim:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise UsageError("the marginal schedule's noise would be below any useful level")
    while coarse(lo) > aim:
        hi, lo = lo, lo / 2.0
        if lo < 1e-9:
            raise UsageError("no noise level reaches this ε; check the inputs")
    while (hi - lo) / hi > _SCALE_RTOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if coarse(mid) <= aim else (lo, mid)
    # Certify on the fine mesh: only a scale whose upper bound is at most ε is returned.
    scale = lo
    for attempt in range(200):
        total = bound(scale)
        if total.epsilon <= epsilon:
            break
        # Small steps first (the coarse search lands close); larger ones where the fine
        # bound's absolute error floor is large against a tiny ε.
        scale /= 1.005 if attempt < 20 else 1.1
    else:  # pragma: no cover - 180 steps of 10% cover any gap
        raise UsageError(f"could not certify a marginal schedule for ε = {epsilon:g}")
    sigma, eps_s = _parameters(scale, measurements, selections, selection_share)
    events = accounted_events(sigma, eps_s, measurements, selections)
    alone = compose_epsilon(events, delta) if prior_events else total
    return MarginalSchedule(
        noise_multiplier=sigma,
        selection_epsilon=eps_s,
        measurements=measurements,
        selections=selections,
        epsilon=alone.epsilon,
        total_epsilon=total.epsilon,
        accountant=total.accountant,
        notes=total.notes,
    )
