"""The white-box audit's limits, checked before any work: the counts it can use and the memory
it would hold (`dpsynth.data.limits.over_budget` judges the latter)."""

from __future__ import annotations

from dpsynth.auditing.functional import FIELD_POINTS
from dpsynth.auditing.releases import split_releases
from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.events import PoissonGaussian
from dpsynth.privacy.accounting.plan import PrivacyPlan

__all__ = ["audit_memory", "check_audit_values"]

_MARGINAL_WORDS = 96.0  # 8-byte words a table canary holds: d ≤ 64 codes, counts, noise


def check_audit_values(canaries: int, confidence: float, runs: int = 1) -> None:
    """UsageError, before any work, for a canary or run count or confidence it cannot use."""
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 2:
        raise UsageError(f"--canaries must be an integer of at least 2, got {canaries!r}")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError(f"--runs must be a positive integer, got {runs!r}")
    if not 0.0 < confidence < 1.0:
        raise UsageError(
            f"--confidence must be strictly between 0 and 1 (e.g. 0.95), got {confidence:g}"
        )


def audit_memory(mechanism: str, plan: PrivacyPlan, canaries: int) -> float:
    """Bytes the white-box audit of `canaries` canaries holds at its peak (an upper estimate).

    DP-SGD: a few float64 vectors of length m, and per step the batch's records and their
    per-record gradients, [b, m] each, b the largest Poisson batch expected (q·m/2 plus six
    standard deviations). Functional: per step, the canaries' m releases of the field at one
    block of points and the draws behind their noise, about a dozen float64 arrays [m, points].
    Marginal: the canaries' codes and the measured clique's counts, `_MARGINAL_WORDS` a canary.
    """
    m = float(canaries)
    if mechanism == "functional":
        return 8.0 * 12.0 * m * FIELD_POINTS
    if mechanism == "marginal":  # codes [m, d] and a few vectors of the clique's ≤ 2m cells
        return 8.0 * m * _MARGINAL_WORDS
    releases, steps = split_releases(plan.events)
    # A one-shot release is scored in chunks of a few hundred labels (a few vectors of m);
    # the DP classifier holds its included canaries as [m/2, m] float32 records.
    extra = 2.0 * m * m if "dp_classifier" in {e.annotation("mechanism") for e in releases} else 0.0
    loops = (*steps, *(r for r in releases if isinstance(r, PoissonGaussian)))
    rates = [float(e.to_json().get("sampling_rate", 1.0)) for e in loops] or [0.0]
    mean = max(rates) * m / 2.0
    batch = min(m, mean + 6.0 * mean**0.5 + 1.0)
    return 8.0 * m * (16.0 + 4.0 * batch) + extra
