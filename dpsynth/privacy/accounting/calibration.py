"""Noise calibration: the σ, step count or schedule whose composed ε bound fits a target.

Every search here only locates a candidate; the answer returned is certified by
`accounting.epsilon_for` (a proven upper bound), so calibration can be loose but never
reports a σ whose ε is above the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting.compose import (
    MIN_NOISE_MULTIPLIER,
    REL_EPS_ERROR,
    Calibration,
    EpsilonBound,
    compose_epsilon,
    epsilon_for,
    epsilon_report,
    poisson_gaussian_event,
    validate_noise_multiplier,
    validate_probability_inputs,
)
from dpsynth.privacy.accounting.events import AnyEvent, DpEvent

# Relative tolerance on σ when calibrating (the answer is always on the valid side).
_SIGMA_RTOL = 0.004
# The coarse mesh used only to locate σ before the fine bound certifies it.
_COARSE_REL_ERROR = 0.05
# The one budget rule (see `_located_and_certified`): a run needs a headroom of at least this
# share of its target ε above the earlier spends. Below it the run's own share would be lost
# in the accountant's error bound, and whether a σ certifies there depends on the mesh.
_MIN_HEADROOM = REL_EPS_ERROR
_MAX_NOISE_MULTIPLIER = 1e6


def _check_prior(prior_events: Sequence[AnyEvent], epsilon: float, delta: float) -> float:
    prior = compose_epsilon(prior_events, delta).epsilon if prior_events else 0.0
    if prior >= epsilon:
        raise BudgetExceededError(
            f"the dataset has already spent ε ≤ {prior:.4g} at δ={delta:g}, "
            f"which leaves nothing under the target ε={epsilon:g}"
        )
    if epsilon - prior < _MIN_HEADROOM * epsilon:
        raise _headroom_error(prior, epsilon, delta)
    return prior


def _headroom_error(prior: float, epsilon: float, delta: float) -> BudgetExceededError:
    """The one message for earlier spends that leave too little under the target ε."""
    return BudgetExceededError(
        f"the dataset has already spent ε ≤ {prior:.6g} at δ={delta:g}, leaving a headroom of "
        f"{epsilon - prior:.3g} under the target ε={epsilon:g}; a run needs at least "
        f"{_MIN_HEADROOM:.1%} of ε (the accountant's error bound) and a noise multiplier up to "
        f"{_MAX_NOISE_MULTIPLIER:g} that fits: raise --epsilon or use other data"
    )


class _NoNoiseMultiplier(UsageError):
    """No σ up to `_MAX_NOISE_MULTIPLIER` brings the bound under the target ε."""


def _located_and_certified(
    coarse_estimate: Callable[[float], float],
    bound: Callable[[float], float],
    epsilon: float,
    delta: float,
    prior: float,
    guess: float,
) -> float:
    """σ located on the coarse estimate and certified by the fine upper bound (which alone
    decides what is returned), under the one budget rule: a run fits when the earlier spends
    leave at least `_MIN_HEADROOM`·ε (checked by `_check_prior`) and the accountant certifies
    that they and the run compose to at most ε for some σ up to 1e6; otherwise
    BudgetExceededError (exit 3) names what was spent and the headroom left.

    The fine bound sits about its ε error above the estimate, so the search aims just under
    ε (one fine evaluation instead of two), but never below the middle of the headroom: with
    earlier spends within that error of ε, a lower aim is out of reach for any σ although
    the fine bound may still certify one.
    """
    aim = max(epsilon * (1.0 - 1.2 * REL_EPS_ERROR), prior + 0.5 * (epsilon - prior))
    try:
        located = _solve_sigma(coarse_estimate, aim, guess)
        return _certify_sigma(bound, epsilon, located)
    except _NoNoiseMultiplier:
        if prior <= 0:
            raise
        raise _headroom_error(prior, epsilon, delta) from None


def calibrate_noise(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    prior_events: Sequence[AnyEvent] = (),
) -> Calibration:
    """The smallest noise multiplier (to 0.2%) whose composed ε bound is at most `epsilon`.

    `prior_events` are earlier spends on the same data set; the returned σ makes the total
    (prior + this run) fit under `epsilon`. Raises BudgetExceededError if nothing is left.
    """
    validate_probability_inputs(epsilon, delta, sampling_rate, steps)
    prior = _check_prior(prior_events, epsilon, delta)

    def bound(sigma: float) -> float:
        return epsilon_for(sigma, sampling_rate, steps, delta, prior_events).epsilon

    def coarse_estimate(sigma: float) -> float:
        result = epsilon_for(sigma, sampling_rate, steps, delta, prior_events, _COARSE_REL_ERROR)
        return result.estimate if result.estimate is not None else result.epsilon

    # Locate σ on a coarse mesh (cheap), then certify it with the fine upper bound: only the
    # fine bound decides what is returned, the coarse search only saves accountant calls.
    guess = _closed_form_sigma_guess(epsilon - prior, delta, sampling_rate, steps)
    sigma = _located_and_certified(coarse_estimate, bound, epsilon, delta, prior, guess)
    return epsilon_report(sigma, delta, sampling_rate, steps, prior_events)


def gaussian_sigma_for_share(
    epsilon: float,
    delta: float,
    share: float,
    prior_events: Sequence[AnyEvent] = (),
) -> float:
    """σ of one Gaussian release (sensitivity 1) at `share` of the ε left after `prior_events`.

    For a plan that gives a one-off release part of the budget and calibrates its loop after
    it (which composes prior + release + loop to at most ε). BudgetExceededError when the
    prior spends leave nothing.
    """
    prior = _check_prior(prior_events, epsilon, delta)
    try:
        return calibrate_noise(share * (epsilon - prior), delta, 1.0, 1).noise_multiplier
    except _NoNoiseMultiplier:
        if prior <= 0:
            raise
        raise _headroom_error(prior, epsilon, delta) from None


def _solve_sigma(bound: Callable[[float], float], epsilon: float, guess: float) -> float:
    """The smallest σ (to `_SIGMA_RTOL`) with bound(σ) ≤ ε, for a bound decreasing in σ.

    Illinois-safeguarded regula falsi on log ε against log σ, where the curve is close to a
    straight line, so a handful of accountant calls suffice. The answer is always a σ that
    was checked to satisfy the bound.
    """
    target = math.log(epsilon)

    def gap(sigma: float) -> float:
        value = bound(sigma)
        return math.log(value) - target if value > 0 else -math.inf

    hi, g_hi = guess, gap(guess)
    lo, g_lo = guess, g_hi
    while g_hi > 0:
        lo, g_lo = hi, g_hi
        hi *= 2.0
        if hi > _MAX_NOISE_MULTIPLIER:
            raise _NoNoiseMultiplier(
                "no noise multiplier below 1e6 reaches this ε; check the inputs"
            )
        g_hi = gap(hi)
    while g_lo <= 0:
        hi, g_hi = lo, g_lo
        lo /= 2.0
        if lo < MIN_NOISE_MULTIPLIER:
            # Even (about) the smallest σ allowed fits: its bound is below ε, which is valid.
            return hi
        g_lo = gap(lo)
    side = 0
    while (hi - lo) / hi > _SIGMA_RTOL:
        x_lo, x_hi = math.log(lo), math.log(hi)
        if math.isinf(g_hi):
            mid = math.sqrt(lo * hi)
        else:
            mid = math.exp(x_lo + (x_hi - x_lo) * g_lo / (g_lo - g_hi))
            # Keep each try strictly inside the bracket, at least a little away from its ends.
            width = hi - lo
            mid = min(max(mid, lo + 0.02 * width), hi - 0.02 * width)
        g_mid = gap(mid)
        if g_mid <= 0:
            hi, g_hi = mid, g_mid
            if side == -1:
                g_lo /= 2.0
            side = -1
        else:
            lo, g_lo = mid, g_mid
            if side == 1:
                g_hi /= 2.0
            side = 1
    return hi


def _certify_sigma(bound: Callable[[float], float], epsilon: float, located: float) -> float:
    """The first σ on a 0.5% grid upward from `located` whose fine bound is at most ε.

    `located` comes from the coarse estimate, so the first grid point almost always passes; a
    σ that fails is never returned.
    """
    step = 1.0025
    sigma = located
    for _ in range(12):
        if bound(sigma) <= epsilon:
            return sigma
        sigma *= step * step
    return _solve_sigma(bound, epsilon, sigma)


def _closed_form_sigma_guess(epsilon: float, delta: float, q: float, steps: int) -> float:
    """A σ near the answer from a closed-form approximation (only a starting point)."""
    log_term = math.log(1.0 / delta)
    eps = max(epsilon, 1e-6)
    if q >= 1.0:
        return max(0.3, min(math.sqrt(2.0 * log_term * steps) / eps, 1e5))
    return max(0.3, min(q * math.sqrt(steps * log_term) * 2.0 / eps, 1e5))


def max_steps(
    noise_multiplier: float,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    prior_events: Sequence[AnyEvent] = (),
    limit: int = 10_000_000,
) -> Calibration:
    """The largest number of steps whose composed ε bound is at most `epsilon`.

    Raises BudgetExceededError when not even one step fits.
    """
    validate_probability_inputs(epsilon, delta, sampling_rate, None)
    validate_noise_multiplier(noise_multiplier)
    _check_prior(prior_events, epsilon, delta)

    def gap(steps: int) -> float:
        """log ε(steps) − log ε: ≤ 0 exactly when `steps` fits."""
        value = epsilon_for(noise_multiplier, sampling_rate, steps, delta, prior_events).epsilon
        return math.log(value) - math.log(epsilon) if value > 0 else -math.inf

    g_lo = gap(1)
    if g_lo > 0:
        raise BudgetExceededError(
            f"not even one step at σ={noise_multiplier:g}, q={sampling_rate:g} "
            f"fits under ε={epsilon:g}"
        )
    lo, hi = 1, 4
    g_hi = gap(hi)
    while g_hi <= 0:
        if hi >= limit:
            return epsilon_report(noise_multiplier, delta, sampling_rate, limit, prior_events)
        lo, g_lo = hi, g_hi
        hi = min(hi * 4, limit)
        g_hi = gap(hi)
    lo = _largest_fitting_integer(gap, lo, g_lo, hi, g_hi)
    return epsilon_report(noise_multiplier, delta, sampling_rate, lo, prior_events)


def _largest_fitting_integer(
    gap: Callable[[int], float], lo: int, g_lo: float, hi: int, g_hi: float
) -> int:
    """The largest integer t in [lo, hi) with gap(t) ≤ 0, given gap(lo) ≤ 0 < gap(hi).

    Illinois-safeguarded regula falsi on log t, where log ε is close to a straight line: a
    handful of accountant calls instead of a bisection's twenty. Exact: it ends only when
    gap(t) ≤ 0 < gap(t + 1) was checked, as a bisection would.
    """
    side = 0
    while hi - lo > 1:
        if math.isinf(g_lo) or math.isinf(g_hi):
            mid = int(math.sqrt(lo * hi))
        else:
            x_lo, x_hi = math.log(lo), math.log(hi)
            mid = round(math.exp(x_lo + (x_hi - x_lo) * g_lo / (g_lo - g_hi)))
        mid = min(max(mid, lo + 1), hi - 1)
        g_mid = gap(mid)
        if g_mid <= 0:
            lo, g_lo = mid, g_mid
            if side == 1:
                g_hi /= 2.0
            side = 1
        else:
            hi, g_hi = mid, g_mid
            if side == -1:
                g_lo /= 2.0
            side = -1
    return lo


def schedule_events(
    scale: float, sampling_rate: float, segments: Sequence[tuple[float, int]]
) -> list[DpEvent]:
    """One `poisson_gaussian` event per segment (factor f, steps n): σ = scale·f, in order."""
    return [
        poisson_gaussian_event(scale * float(factor), sampling_rate, int(steps))
        for factor, steps in segments
    ]


def calibrate_schedule(
    epsilon: float,
    delta: float,
    sampling_rate: float,
    segments: Sequence[tuple[float, int]],
    prior_events: Sequence[AnyEvent] = (),
) -> Calibration:
    """The smallest scale z₀ (to 0.2%) such that the schedule σ_i = z₀·f_i meets `epsilon`.

    `segments` is a data-independent noise schedule as (factor f_i > 0, steps n_i) pairs, each
    a run of n_i Poisson(q)-subsampled Gaussian steps at multiplier z₀·f_i; all of them are
    composed heterogeneously (PRV, RDP fallback) with `prior_events`. The returned
    Calibration's `noise_multiplier` is z₀ and `steps` the total Σ n_i; its ε is that of
    `schedule_events(z₀, q, segments)`. A single segment (1.0, T) is `calibrate_noise`.
    """
    segments = [(float(f), int(n)) for f, n in segments if int(n) > 0]
    if not segments:
        raise UsageError("a noise schedule needs at least one step")
    if any(not (math.isfinite(f) and f > 0) for f, _ in segments):
        raise UsageError("noise schedule factors must be positive and finite")
    steps = sum(n for _, n in segments)
    validate_probability_inputs(epsilon, delta, sampling_rate, steps)
    if len(segments) == 1 and segments[0][0] == 1.0:
        return calibrate_noise(epsilon, delta, sampling_rate, steps, prior_events)
    prior = _check_prior(prior_events, epsilon, delta)

    def bound_at(scale: float, rel_error: float) -> EpsilonBound:
        events = schedule_events(scale, sampling_rate, segments)
        return compose_epsilon([*prior_events, *events], delta, rel_error)

    def coarse_estimate(scale: float) -> float:
        result = bound_at(scale, _COARSE_REL_ERROR)
        return result.estimate if result.estimate is not None else result.epsilon

    smallest = min(f for f, _ in segments)
    guess = _closed_form_sigma_guess(epsilon - prior, delta, sampling_rate, steps) / math.sqrt(
        sum(n * f**-2 for f, n in segments) / steps
    )
    scale = _located_and_certified(
        coarse_estimate,
        lambda s: bound_at(s, REL_EPS_ERROR).epsilon,
        epsilon,
        delta,
        prior,
        guess,
    )
    validate_noise_multiplier(scale * smallest)
    events = schedule_events(scale, sampling_rate, segments)
    alone = compose_epsilon(events, delta)
    total = compose_epsilon([*prior_events, *events], delta)
    return Calibration(
        noise_multiplier=scale,
        sampling_rate=sampling_rate,
        steps=steps,
        delta=delta,
        epsilon=alone.epsilon,
        total_epsilon=total.epsilon,
        prior_epsilon=prior,
        accountant=total.accountant,
        notes=total.notes,
    )


def default_delta(n: int) -> float:
    """A δ safely below 1/N: the largest power of ten ≤ 1/(10 N)."""
    return 10.0 ** math.floor(math.log10(1.0 / (10.0 * max(n, 1))))
