"""The one-run audit's statistics: correct guesses → an ε lower bound at a confidence.

Steinke, Nasr and Jagielski, "Privacy auditing with one (1) training run" (NeurIPS 2023):
m canaries are each included independently with probability 1/2; after one run the auditor
guesses "in" or "out" for some of them (`guesses` in all) and `correct` of those are right.

- Pure ε-DP: the number of correct guesses is stochastically dominated by
  Binomial(guesses, e^ε / (1 + e^ε)) (their Theorem 3.1).
- (ε, δ)-DP: P[correct ≥ v] ≤ P[Binomial(r, p) ≥ v] + 2·m·δ·α, with
  α = max_{1 ≤ i ≤ v} P[v − i ≤ Binomial(r, p) < v] / i (their Theorem 5.2; `p_value` is their
  Algorithm's `p_value_DP_audit` line for line).

ε is rejected at confidence 1 − β when that p-value is below β; the lower bound is the largest
ε still rejected, found by bisection (the p-value increases with ε).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from dpsynth.errors import UsageError

__all__ = ["epsilon_lower_bound", "p_value"]

_BISECTION_ROUNDS = 40
_EPSILON_CEILING = 200.0


def _check_counts(canaries: int, guesses: int, correct: int) -> None:
    if not 0 <= correct <= guesses <= canaries:
        raise UsageError(
            f"need 0 ≤ correct ≤ guesses ≤ canaries, got {correct}, {guesses}, {canaries}"
        )


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """An upper bound on P[≥ `correct` right of `guesses`] under (ε, δ)-DP (Theorem 5.2)."""
    _check_counts(canaries, guesses, correct)
    if epsilon < 0 or not 0.0 <= delta <= 1.0:
        raise UsageError(f"need ε ≥ 0 and δ in [0, 1], got {epsilon}, {delta}")
    accuracy = 1.0 / (1.0 + math.exp(-epsilon))  # randomized response's accuracy at ε
    tail = float(binom.sf(correct - 1, guesses, accuracy))  # P[Binomial ≥ correct]
    alpha = 0.0
    if correct > 0:
        # window[i − 1] = P[correct − i ≤ Binomial < correct] for i = 1..correct
        window = np.cumsum(binom.pmf(np.arange(correct - 1, -1, -1), guesses, accuracy))
        alpha = float(np.max(window / np.arange(1, correct + 1)))
    return min(1.0, tail + 2.0 * canaries * delta * alpha)


def epsilon_lower_bound(
    canaries: int, guesses: int, correct: int, delta: float, confidence: float
) -> float:
    """The largest ε rejected at `confidence` by `correct` right of `guesses` (0 if none).

    With probability ≥ `confidence` over the run's randomness, an (ε, δ)-DP mechanism does not
    produce a bound above its ε.
    """
    if not 0.0 < confidence < 1.0:
        raise UsageError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence
    if p_value(canaries, guesses, correct, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(canaries, guesses, correct, high, delta) < beta:
        low, high = high, 2.0 * high
        if high > _EPSILON_CEILING:
            return _EPSILON_CEILING
    for _ in range(_BISECTION_ROUNDS):
        mid = 0.5 * (low + high)
        if p_value(canaries, guesses, correct, mid, delta) < beta:
            low = mid
        else:
            high = mid
    return low
