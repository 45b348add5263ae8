"""Privacy profiles of composed events: δ(ε) bounded above at every ε, ε(δ) bounded below.

`compose_epsilon` answers one question, the ε upper bound at one δ. An audit that fits a
mechanism's family needs the whole curve: an (ε, δ(ε))-DP mechanism has, for every region S
of its outputs and every ε (negative ones too), P(S) ≤ e^ε·Q(S) + δ(ε), where P is the
output's law with the record and Q without it. Rates that break this for some ε cannot come
from a mechanism with that profile (`PrivacyProfile.violation`).

The curve comes from the same PRV discretisation as the accountant's bound (Gopi et al. 2021,
`privacy/accounting/prv.py`): their coupling of the PRV Y with its discretisation Ŷ gives
δ_Y(ε) ≤ δ_Ŷ(ε − ε_error) + δ_error and δ_Y(ε) ≥ δ_Ŷ(ε + ε_error) − δ_error at every ε, and
float64's rounding is charged on top, as for the accountant's bound. So `deltas` are upper
bounds on the true profile, and `epsilon_lower` a lower bound on the true ε at a δ. The
Poisson-subsampled Gaussian's PRV is that of P = the mixture (the record in the batch with
probability q) against Q = the Gaussian without it: P is "with the record".
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting import prv
from dpsynth.privacy.accounting.compose import MAX_PRV_MESH, composition_groups
from dpsynth.privacy.accounting.events import AnyEvent, ThresholdDelta, events_from_json
from dpsynth.privacy.accounting.prv_mesh import (
    fft_friendly_eps_error,
    prv_mesh_size,
    safe_domain_length,
)

__all__ = ["PrivacyProfile", "ProfileUnavailable", "privacy_profile"]

# The discretisation's δ error: far below any rate an audit can observe.
PROFILE_DELTA_ERROR = 1e-10


class ProfileUnavailable(UsageError):
    """No profile for these events: a non-private or thresholding step, or a PRV mesh too
    large for float64 or for time and memory."""


@dataclass(frozen=True)
class PrivacyProfile:
    """δ(ε) upper bounds at the mesh's ε values (ascending), and the composed PRV behind them."""

    epsilons: np.ndarray
    deltas: np.ndarray
    composed: prv.ComposedPrv = field(repr=False)

    def violation(self, rate_with: float, rate_without: float) -> float:
        """max over ε of rate_with − e^ε·rate_without − δ(ε): above 0, no mechanism with this
        profile has a region whose probability is at least `rate_with` with the record and at
        most `rate_without` without it."""
        return float(np.max(rate_with - np.exp(self.epsilons) * rate_without - self.deltas))

    def epsilon_lower(self, delta: float) -> float:
        """A lower bound on the true ε at `delta` (at least 0)."""
        prv_ = self.composed
        target = delta + prv_.delta_error
        ndelta = -prv_.estimate_deltas
        read = min(int(np.searchsorted(ndelta, -target)), prv_.t.size - 1)
        target += float(prv_.rounding_at(read))
        try:
            return max(0.0, prv_.epsilon_at(target) - prv_.eps_error)
        except RuntimeError:
            return 0.0  # δ̂ is below the target on the whole mesh: no ε above its start


def privacy_profile(
    events: Iterable[AnyEvent], eps_error: float = 0.005, delta_error: float = PROFILE_DELTA_ERROR
) -> PrivacyProfile:
    """The privacy profile of `events` composed (Gaussian, Poisson-subsampled Gaussian and pure
    ε-DP events); `eps_error` is the discretisation's absolute ε error (smaller: tighter and
    slower). ProfileUnavailable where it cannot be computed in float64 within the mesh cap."""
    events = events_from_json(events)
    if any(isinstance(e, ThresholdDelta) for e in events):
        raise ProfileUnavailable("a thresholding step has no privacy profile here")
    non_private, groups = composition_groups(events)
    if non_private:
        raise ProfileUnavailable("a non-private step has no privacy profile")
    if not groups:
        raise ProfileUnavailable("no private mechanism to profile")
    keys = sorted(groups)
    counts = [groups[k] for k in keys]
    length = max(safe_domain_length(keys, counts, delta_error), eps_error) + 3.0
    length = max([length, *(k[1] + 1.0 for k in keys if k[0] == "pure_dp")])
    if prv_mesh_size(length, counts, delta_error, eps_error) > MAX_PRV_MESH:
        raise ProfileUnavailable("the PRV mesh would exceed its cap")
    eps_error = fft_friendly_eps_error(length, counts, delta_error, eps_error)
    try:
        composed = prv.compose_prv(keys, counts, eps_error, delta_error, length)
    except (prv.NeedsLongDouble, RuntimeError) as exc:
        raise ProfileUnavailable(str(exc)) from exc
    deltas = (
        composed.estimate_deltas + delta_error + composed.rounding_at(np.arange(composed.t.size))
    )
    epsilons = composed.t + eps_error
    if not (np.isfinite(deltas).all() and math.isfinite(float(epsilons[-1]))):
        raise ProfileUnavailable("the profile left float64's range")
    return PrivacyProfile(epsilons, np.clip(deltas, 0.0, 1.0), composed)
