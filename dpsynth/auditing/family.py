"""The family test: the independent trials judged against the mechanism's own noise family.

The trials test (`trials.py`) assumes nothing about the mechanism but independence, so for a
Gaussian release at ε = 1 it must find a region whose rates differ by e^ε at a tail of about
1e-4: millions of trials. An audit of a Gaussian mechanism is asking a narrower question,
though: is the noise as large as claimed against a record's true influence? The errors that
happen (a σ divided by √2 or 2, a sensitivity off by such a factor, one composition missed)
keep the mechanism in its family and scale the ratio of influence to noise by some factor k.

So the family test takes the plan's own events and scales every release's sensitivity-to-noise
ratio by a common factor k (σ/k for the Gaussian and Poisson-subsampled Gaussian events, k·ε
for pure ε-DP ones; `scaled_events`). The claim is k = 1. The PRV accountant's profile of the
scaled plan (`privacy.accounting.profile`) bounds, for every ε, how far apart the rates of
any region can be: P_in(S) ≤ e^ε·P_out(S) + δ_k(ε). A region's Clopper-Pearson bounds
(P_in(S) ≥ a, P_out(S) ≤ b, each at 1 − β/2) that break this for some ε rule that k out, and
δ_k grows with k, so the smallest k not ruled out (by bisection in log k) is a lower bound on
the mechanism's true factor at confidence 1 − β. Its ε is then a lower bound on the true ε:
the accountant's lower estimate of the scaled plan's ε at the plan's δ.

The test is tight with few trials: it uses the whole trade-off curve, so the best region is a
wide one (a middle quantile for one Gaussian release, where its rates are known to a fraction
of a percent from some ten thousand trials). What it assumes is the family: a sound mechanism
of the claimed family passes at confidence 1 − β whatever the number of trials, and an error
that keeps the family is measured; an error of another shape (noise of the wrong law, noise
reused across records) is the trials test's to find. `audit` reports both.

A "low" region {s ≤ t} (the out-rate over the in-rate) is judged through its complement:
P_in(S^c) ≥ 1 − (the in-rate's upper bound), P_out(S^c) ≤ 1 − (the out-rate's lower bound);
the profile at negative ε carries that direction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import gammaln, logsumexp

from dpsynth.auditing.trials import TrialsOutcome, cautious_counts, choose_region, rate_bounds
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, PoissonGaussian, PureDp
from dpsynth.privacy.accounting.profile import (
    PrivacyProfile,
    ProfileUnavailable,
    privacy_profile,
)

__all__ = [
    "FamilyOutcome",
    "composed_family_bound",
    "family_bound",
    "logistic_factor",
    "region_rates",
    "scaled_events",
    "smallest_factor",
]

# The factors searched: log2 k on a grid of step `_GRID` over [−_SPAN, _SPAN] (k from 1/64
# to 64), whose profiles the regions' searches share; the judged region's bracket is then
# bisected `_REFINE` times (to 0.25/2^10 in log2 k: 0.02%).
_SPAN = 6.0
_GRID = 0.25
_LOG_FACTORS = tuple(-_SPAN + _GRID * i for i in range(round(2 * _SPAN / _GRID) + 1))
_REFINE = 10
# Bisection steps of the selections' log odds ratio.
_ODDS_STEPS = 40
# The profiles' absolute ε discretisation error (their δ upper bounds read ε this much lower).
_EPS_ERROR = 0.002


@dataclass(frozen=True)
class FamilyOutcome(TrialsOutcome):
    """The judged region (as the trials test's), the smallest factor k on every release's
    sensitivity-to-noise ratio its rates allow, and the scaled plan's ε (`lower_bound`)."""

    factor: float


def scaled_events(events: Sequence[DpEvent], factor: float) -> list[DpEvent]:
    """`events` with every sensitivity-to-noise ratio times `factor` (σ/k, k·ε)."""
    scaled: list[DpEvent] = []
    for event in events:
        if isinstance(event, (Gaussian, PoissonGaussian)):
            sigma = float(event.noise_multiplier) / factor
            scaled.append(dataclasses.replace(event, noise_multiplier=sigma))
        elif isinstance(event, PureDp):
            scaled.append(dataclasses.replace(event, epsilon=float(event.epsilon) * factor))
        else:
            scaled.append(event)
    return scaled


class _Profiles:
    """The scaled plan's profile for each factor asked (cached: the bisections share points)."""

    def __init__(self, events: Sequence[DpEvent]) -> None:
        self.events = list(events)
        self.cache: dict[float, PrivacyProfile | None] = {}

    def __call__(self, log_factor: float) -> PrivacyProfile | None:
        if log_factor not in self.cache:
            try:
                found: PrivacyProfile | None = privacy_profile(
                    scaled_events(self.events, 2.0**log_factor), eps_error=_EPS_ERROR
                )
            except ProfileUnavailable:
                found = None
            self.cache[log_factor] = found
        return self.cache[log_factor]


def region_rates(
    counts: tuple[float, float, float, float], direction: str, confidence: float
) -> tuple[float, float]:
    """(lower bound of P_in(S'), upper bound of P_out(S')), each at 1 − β/2, where S' is the
    region itself ("high") or its complement ("low")."""
    hits_in, trials_in, hits_out, trials_out = (round(c) for c in counts)
    each = 1.0 - (1.0 - confidence) / 2.0
    low_in, high_in = rate_bounds(hits_in, trials_in, each)
    low_out, high_out = rate_bounds(hits_out, trials_out, each)
    if direction == "high":
        return low_in, high_out
    return 1.0 - high_in, 1.0 - low_out


def smallest_factor(profiles: _Profiles, rate_in: float, rate_out: float, refine: int = 0) -> float:
    """The smallest factor k whose profile allows the rates: 0 when every k does; 2^_SPAN
    when none does. A factor whose profile cannot be computed counts as allowed (a smaller
    bound: never an unsound one).

    A binary search over the grid of log2 k in steps of `_GRID` brackets it; with `refine` = 0
    the crossing of the violation between the bracket's ends is interpolated (an estimate, to
    rank regions: it may lie above the truth); with `refine` > 0 the bracket is bisected that
    many times and its ruled-out end returned (a bound).
    """
    if rate_in <= rate_out:
        return 0.0

    def violation(log_factor: float) -> float:
        profile = profiles(log_factor)
        return -1.0 if profile is None else profile.violation(rate_in, rate_out)

    low, high = 0, len(_LOG_FACTORS) - 1
    if violation(_LOG_FACTORS[low]) <= 0.0:
        return 0.0
    if violation(_LOG_FACTORS[high]) > 0.0:
        return 2.0 ** _LOG_FACTORS[high]
    while high - low > 1:
        middle = (low + high) // 2
        if violation(_LOG_FACTORS[middle]) > 0.0:
            low = middle
        else:
            high = middle
    left, right = _LOG_FACTORS[low], _LOG_FACTORS[high]
    if refine == 0:
        above, below = violation(left), violation(right)
        return 2.0 ** (left + (right - left) * above / (above - below))
    for _ in range(refine):
        middle = 0.5 * (left + right)
        if violation(middle) > 0.0:
            left = middle
        else:
            right = middle
    # `left` is ruled out; the true factor is above it at the test's confidence
    return 2.0**left


def family_bound(
    scores: Mapping[str, torch.Tensor],
    included: torch.Tensor,
    events: Sequence[DpEvent],
    delta: float,
    confidence: float,
) -> FamilyOutcome | None:
    """The family test on independent trials (as `trials.trials_bound`: the region chosen on the
    public selection split and judged on the rest); None where the plan has no profile."""
    profiles = _Profiles(events)
    if profiles(0.0) is None:
        return None

    def predict(counts: tuple[int, int, int, int], direction: str, scale: float, _: bool) -> float:
        cautious = cautious_counts(counts, direction, scale)
        return smallest_factor(profiles, *region_rates(cautious, direction, confidence))

    chosen = choose_region(scores, included, predict)
    if chosen is None:
        return None
    name, direction, threshold, counts = chosen
    rate_in, rate_out = region_rates(counts, direction, confidence)
    factor = smallest_factor(profiles, rate_in, rate_out, _REFINE)
    bound = 0.0
    if factor > 0.0:
        profile = profiles(math.log2(factor))
        bound = 0.0 if profile is None else profile.epsilon_lower(delta)
    hits_in, trials_in, hits_out, trials_out = counts
    return FamilyOutcome(
        score=name,
        direction=direction,
        threshold=threshold,
        trials_in=trials_in,
        trials_out=trials_out,
        hits_in=hits_in,
        hits_out=hits_out,
        factor=factor,
        lower_bound=bound,
    )


def logistic_factor(
    hits_in: int, trials_in: int, hits_out: int, trials_out: int, epsilon: float,
    confidence: float,
) -> float:  # fmt: skip
    """The smallest factor k on a selection's ε that its rates of choosing one candidate allow,
    at `confidence`, when the selection is the exponential mechanism between two candidates
    whose quality gap the canary moves by twice the sensitivity: then the odds ratio of
    choosing it with and without the canary is exactly e^{k·ε}.

    Fisher's exact conditional test: given the total chosen, the number chosen with the canary
    in follows Fisher's noncentral hypergeometric law with that odds ratio, and its upper tail
    grows with it; k is the smallest odds ratio's log (over ε) that the tail does not reject at
    1 − confidence. One test of the odds ratio itself, so about √2 tighter than bounding the
    two rates apart. 0 when the rates show nothing.
    """
    if epsilon <= 0.0 or min(trials_in, trials_out) == 0:
        return 0.0
    beta = 1.0 - confidence
    total = hits_in + hits_out
    if _upper_tail(hits_in, trials_in, trials_out, total, 0.0) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while _upper_tail(hits_in, trials_in, trials_out, total, high) < beta:
        low, high = high, 2.0 * high
        if high > 1e3:
            return high / epsilon
    for _ in range(_ODDS_STEPS):
        middle = 0.5 * (low + high)
        if _upper_tail(hits_in, trials_in, trials_out, total, middle) < beta:
            low = middle
        else:
            high = middle
    return low / epsilon


def _upper_tail(
    hits_in: int, trials_in: int, trials_out: int, total: int, log_odds: float
) -> float:
    """P[X ≥ hits_in] for X of Fisher's noncentral hypergeometric law: `total` chosen among
    `trials_in` and `trials_out`, odds ratio e^log_odds (log-space sums over the support)."""
    x = np.arange(max(0, total - trials_out), min(trials_in, total) + 1, dtype=np.float64)
    log_weight = (
        x * log_odds
        - gammaln(x + 1.0)
        - gammaln(trials_in - x + 1.0)
        - gammaln(total - x + 1.0)
        - gammaln(trials_out - total + x + 1.0)
    )
    tail = log_weight[x >= hits_in]
    if tail.size == 0:
        return 0.0
    return float(np.exp(logsumexp(tail) - logsumexp(log_weight)))


def composed_family_bound(
    events: Sequence[DpEvent], factors: Sequence[float], delta: float
) -> float:
    """The ε lower bound of a plan whose parts were each measured at their own factor (an
    event at factor 0 showed nothing and is left out): the accountant's lower estimate of the
    composition of each event scaled by its factor, at `delta`."""
    kept = [
        scaled_events([event], factor)[0]
        for event, factor in zip(events, factors, strict=True)
        if factor > 0.0
    ]
    if not kept:
        return 0.0
    try:
        return privacy_profile(kept, eps_error=_EPS_ERROR).epsilon_lower(delta)
    except ProfileUnavailable:
        return 0.0
