"""Privacy accounting: ε upper bounds for composed mechanisms (noise calibration, which
searches these bounds, is `privacy/accounting/calibration.py`).

Every ε this module returns is an upper bound: the PRV accountant's `eps_upper` (Gopi et al.
2021, error bounds included), or, where the PRV discretisation fails or is not applicable, the
RDP bound (Balle et al. 2020 conversion), which is looser but also proven. Where both exist the
smaller one is reported, since the minimum of two valid upper bounds is a valid upper bound.
The PRV bound is computed by `privacy/accounting/prv.py` (the `prv-accountant` package's algorithm
in float64, with its rounding charged to δ), and by the package itself, in long double, where δ
is too small for float64.

Events are the typed, frozen classes of `events.py` (one per mechanism), or the dicts the
ledger stores, read through `event_from_json`; each event gives its own composition key.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import version
from typing import Any

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting import prv, rdp
from dpsynth.privacy.accounting.events import (
    AnyEvent,
    DpEvent,
    PoissonGaussian,
    ThresholdDelta,
    events_from_json,
)
from dpsynth.privacy.accounting.prv_mesh import (
    fft_friendly_eps_error,
    prv_mesh_size,
    safe_domain_length,
)

PRV_VERSION = version("prv-accountant")

# Relative ε discretisation error of the PRV accountant. The reported bound includes it, so a
# smaller value gives a tighter (smaller) bound at the cost of a finer mesh.
REL_EPS_ERROR = 0.005
_MIN_EPS_ERROR = 1e-3
# The accountant's name records its settings: a ledger line is re-verified against the same
# ones, and lines written under other settings are recognised as such.
ACCOUNTANT_PRV = (
    f"dpsynth PRV upper bound (prv-accountant {PRV_VERSION}'s algorithm in float64, "
    f"eps_error {REL_EPS_ERROR:g}·ε)"
)
ACCOUNTANT_PRV_LONG_DOUBLE = (
    f"prv-accountant {PRV_VERSION} PRV upper bound (eps_error {REL_EPS_ERROR:g}·ε)"
)
ACCOUNTANT_RDP = f"prv-accountant {PRV_VERSION} RDP upper bound (PRV fallback, integer orders)"
ACCOUNTANT_RDP_OWN = "dpsynth RDP upper bound (PRV fallback, integer orders, pure DP as RR)"

# Bounds on what the accountant is asked, so that every call ends in seconds with bounded
# memory. ε above MAX_EPSILON protects nothing (e^1000 likelihood ratios); the PRV mesh grows
# with ε and with √T, and past MAX_PRV_MESH nodes (about 4 s and 400 MB) the RDP bound is
# reported instead. σ below MIN_NOISE_MULTIPLIER is noise-free for every practical purpose.
MAX_EPSILON = 1000.0
MAX_STEPS = 10_000_000
MIN_NOISE_MULTIPLIER = 0.01
MAX_PRV_MESH = 2_000_000


class PrvMeshTooLarge(Exception):
    """The PRV discretisation these settings need would not fit in time and memory."""


@dataclass(frozen=True)
class EpsilonBound:
    """An ε upper bound at a given δ, with the accountant that proved it."""

    epsilon: float
    delta: float
    accountant: str
    notes: tuple[str, ...] = ()
    estimate: float | None = None


@dataclass(frozen=True)
class Calibration:
    """The answer of `calibrate_noise` / `max_steps`: a σ, a length and the bound they give."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    delta: float
    epsilon: float
    total_epsilon: float
    accountant: str
    prior_epsilon: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "epsilon": self.epsilon,
            "total_epsilon": self.total_epsilon,
            "prior_epsilon": self.prior_epsilon,
            "delta": self.delta,
            "sampling_rate": self.sampling_rate,
            "steps": self.steps,
            "accountant": self.accountant,
            "notes": list(self.notes),
        }


def poisson_gaussian_event(
    noise_multiplier: float, sampling_rate: float, steps: int
) -> PoissonGaussian:
    """The event of `steps` Poisson-subsampled Gaussian steps."""
    return PoissonGaussian(float(noise_multiplier), float(sampling_rate), int(steps))


def validate_probability_inputs(
    epsilon: float | None, delta: float, sampling_rate: float, steps: int | None
) -> None:
    """Raise UsageError for values no accountant can take."""
    if epsilon is not None and (math.isnan(epsilon) or epsilon <= 0 or math.isinf(epsilon)):
        raise UsageError(f"--epsilon must be a positive finite number, got {epsilon}")
    if epsilon is not None and epsilon > MAX_EPSILON:
        raise UsageError(
            f"--epsilon must be at most {MAX_EPSILON:g} (larger values protect nothing), "
            f"got {epsilon:g}; use --epsilon inf for a non-private baseline"
        )
    if not (0.0 < delta < 1.0) or math.isnan(delta):
        raise UsageError(f"--delta must be in (0, 1), got {delta}")
    if not (0.0 < sampling_rate <= 1.0) or math.isnan(sampling_rate):
        raise UsageError(f"the sampling rate must be in (0, 1], got {sampling_rate}")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    if steps is not None and steps > MAX_STEPS:
        raise UsageError(f"--steps must be at most {MAX_STEPS:,}, got {steps:,}")


def validate_noise_multiplier(noise_multiplier: float) -> None:
    """Raise UsageError for a σ that is not positive, or so small that it adds no noise."""
    if math.isnan(noise_multiplier) or noise_multiplier <= 0:
        raise UsageError(f"--noise-multiplier must be positive, got {noise_multiplier}")
    if math.isinf(noise_multiplier):
        raise UsageError("--noise-multiplier must be finite")
    if noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise UsageError(
            f"--noise-multiplier must be at least {MIN_NOISE_MULTIPLIER:g}, "
            f"got {noise_multiplier:g}"
        )


def _normalise(events: Iterable[DpEvent]) -> tuple[bool, dict[tuple, int]]:
    """Group events into composition key (kind, σ or ε, q) → compositions; report whether
    any is non-private."""
    groups: dict[tuple, int] = {}
    non_private = False
    for event in events:
        if not event.private:
            non_private = True
            continue
        composition = event.composition()
        if composition is None:
            continue  # nothing ran, or a thresholding step (its δ is taken off in compose)
        key, count = composition
        groups[key] = groups.get(key, 0) + count
    return non_private, groups


def composition_groups(events: Iterable[DpEvent]) -> tuple[bool, dict[tuple, int]]:
    """(whether any event is non-private, composition key → compositions) of `events`."""
    return _normalise(events)


def _prv(key: tuple) -> Any:
    """The prv-accountant package's PRV of a mechanism (imported only where it is used)."""
    from prv_accountant.privacy_random_variables import (
        GaussianMechanism,
        PoissonSubsampledGaussianMechanism,
    )

    kind, sigma, q = key
    if kind == "pure_dp":
        from prv_accountant.privacy_random_variables import PureDPMechanism

        return PureDPMechanism(eps=sigma)
    if kind == "gaussian":
        return GaussianMechanism(noise_multiplier=sigma)
    return PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)


def _rdp_epsilon(keys: Sequence[tuple], counts: Sequence[int], delta: float) -> float:
    """The RDP ε bound (`privacy/accounting/rdp.py`: the package's formulas, without its import
    cost)."""
    return rdp.rdp_epsilon(keys, counts, delta, rdp.INTEGER_ORDERS)


@lru_cache(maxsize=512)
def _rdp_accountant(keys: tuple[tuple, ...]) -> Any:
    """The package's RDP accountant of a set of mechanisms (for an RDP bound that is reported)."""
    from prv_accountant.other_accountants import RDP

    return RDP(prvs=[_prv(k) for k in keys], orders=list(rdp.INTEGER_ORDERS))


def _package_rdp_epsilon(keys: Sequence[tuple], counts: Sequence[int], delta: float) -> float:
    """The prv-accountant package's RDP bound, as `ACCOUNTANT_RDP` names it."""
    accountant = _rdp_accountant(tuple(keys))
    _, _, eps = accountant.compute_epsilon(delta=delta, num_self_compositions=list(counts))
    return max(float(eps), 0.0)


def _prv_epsilon(
    keys: Sequence[tuple], counts: Sequence[int], delta: float, eps_error: float
) -> tuple[float, float, bool]:
    """The PRV accountant's (estimate, upper bound) of ε at `delta`, and whether it was float64.

    The float64 port (`privacy/accounting/prv.py`) answers unless δ is too small for its rounding
    allowance; the package's long-double accountant answers then.
    """
    delta_error = delta / 1000.0
    length = max(safe_domain_length(keys, counts, delta_error), eps_error) + 3.0
    # A pure-DP mechanism's PRV has atoms at ±ε, which the domain must hold.
    length = max([length, *(k[1] + 1.0 for k in keys if k[0] == "pure_dp")])
    nodes = prv_mesh_size(length, counts, delta_error, eps_error)
    if nodes > MAX_PRV_MESH:
        # Estimated before anything is allocated: the accountant's arrays scale with this.
        raise PrvMeshTooLarge(f"PRV mesh of {nodes:.3g} nodes exceeds {MAX_PRV_MESH:.3g}")
    eps_error = fft_friendly_eps_error(length, counts, delta_error, eps_error)
    try:
        estimate, upper = prv.prv_epsilon(keys, counts, delta, eps_error, delta_error, length)
        return estimate, upper, True
    except prv.NeedsLongDouble:
        pass
    from prv_accountant import PRVAccountant  # a second of imports, paid only here

    with warnings.catch_warnings():
        # `eps_max` makes the accountant warn that it trusts the domain; ours is the safe one.
        warnings.simplefilter("ignore")
        accountant = PRVAccountant(
            prvs=[_prv(k) for k in keys],
            max_self_compositions=list(counts),
            eps_error=eps_error,
            delta_error=delta_error,
            eps_max=length,
        )
        _, eps_estimate, eps_upper = accountant.compute_epsilon(
            delta=delta, num_self_compositions=list(counts)
        )
    return float(eps_estimate), float(eps_upper), False


@lru_cache(maxsize=4096)
def _compose_cached(
    groups: tuple[tuple[tuple, int], ...], delta: float, rel_error: float
) -> EpsilonBound:
    keys = [k for k, _ in groups]
    counts = [c for _, c in groups]
    notes: list[str] = []
    rdp_eps = _rdp_epsilon(keys, counts, delta)
    # The PRV error is absolute in ε; scale it with the size of the answer (RDP is an upper bound
    # on it) so that small and large ε alike get a bound within a fraction of a percent.
    eps_error = max(_MIN_EPS_ERROR, rel_error * min(rdp_eps, 50.0))
    prv_eps, estimate, prv_name = math.inf, None, ACCOUNTANT_PRV
    attempts = [eps_error, eps_error * 4, eps_error * 0.25]
    # Above ε = 50 the error stays 0.25 absolute, and at large ε or T that mesh can be too big;
    # the same relative error without that cap (rel_error · RDP ε) is tried next: a looser but
    # still valid PRV bound, usually far tighter than the RDP one.
    relative = max(_MIN_EPS_ERROR, rel_error * rdp_eps)
    if relative > eps_error * 4:
        attempts.insert(1, relative)
    for attempt_error in attempts:
        try:
            candidate_estimate, candidate, float64 = _prv_epsilon(
                keys, counts, delta, attempt_error
            )
        except PrvMeshTooLarge as exc:
            notes.append(f"PRV accountant: {exc}; tried a coarser mesh")
            continue
        except (ValueError, RuntimeError, FloatingPointError, AssertionError, MemoryError) as exc:
            notes.append(f"PRV accountant failed ({exc.__class__.__name__}: {exc}); retried")
            continue
        if math.isfinite(candidate) and candidate >= 0:
            prv_eps, estimate = candidate, candidate_estimate
            prv_name = ACCOUNTANT_PRV if float64 else ACCOUNTANT_PRV_LONG_DOUBLE
            break
        notes.append("PRV accountant returned no finite bound; retried")
    if prv_eps <= rdp_eps:
        return EpsilonBound(prv_eps, delta, prv_name, tuple(notes), estimate)
    if math.isinf(prv_eps):
        notes.append("PRV accountant unusable at these settings; reporting the RDP upper bound")
    if any(k[0] == "pure_dp" for k in keys):
        # The package's pure-DP RDP is not an upper bound: ours (`privacy/accounting/rdp.py`) is
        # reported.
        return EpsilonBound(rdp_eps, delta, ACCOUNTANT_RDP_OWN, tuple(notes), estimate)
    # Reported as the package computes it (the same formulas as `privacy/accounting/rdp.py`).
    rdp_eps = _package_rdp_epsilon(keys, counts, delta)
    return EpsilonBound(rdp_eps, delta, ACCOUNTANT_RDP, tuple(notes), estimate)


def compose_epsilon(
    events: Iterable[AnyEvent], delta: float, rel_error: float = REL_EPS_ERROR
) -> EpsilonBound:
    """The ε upper bound at `delta` of all `events` composed (heterogeneous PRV composition).

    `rel_error` sets the PRV discretisation error relative to ε; the bound includes it.
    """
    if not (0.0 < delta < 1.0):
        raise UsageError(f"delta must be in (0, 1), got {delta}")
    events = events_from_json(events)
    non_private, groups = _normalise(events)
    if non_private:
        return EpsilonBound(math.inf, delta, "none (not private)", ("includes a non-private run",))
    threshold = threshold_delta(events)
    if threshold >= delta:
        return EpsilonBound(
            math.inf,
            delta,
            ACCOUNTANT_PRV,
            (f"δ={delta:g} is not above the thresholding steps' δ={threshold:g}",),
        )
    if not groups:
        return EpsilonBound(0.0, delta, ACCOUNTANT_PRV)
    bound = _compose_cached(
        tuple(sorted(groups.items())), float(delta - threshold), float(rel_error)
    )
    if threshold == 0.0:
        return bound
    # Sound: the Gaussian parts are (ε, δ − δ_t)-DP together, and the thresholding steps fail
    # with total probability δ_t, so the whole is (ε, δ)-DP.
    note = f"ε at δ − {threshold:g} (thresholding steps' δ)"
    return EpsilonBound(
        bound.epsilon, delta, bound.accountant, (*bound.notes, note), bound.estimate
    )


def threshold_delta(events: Iterable[AnyEvent]) -> float:
    """Σ δ_t of the thresholding steps' events (0 when none)."""
    return sum(float(e.delta) for e in events_from_json(events) if isinstance(e, ThresholdDelta))


def epsilon_for(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    prior_events: Sequence[AnyEvent] = (),
    rel_error: float = REL_EPS_ERROR,
) -> EpsilonBound:
    """ε bound of `steps` Poisson-Gaussian steps composed with `prior_events`."""
    event = poisson_gaussian_event(noise_multiplier, sampling_rate, steps)
    return compose_epsilon([*prior_events, event], delta, rel_error)


def epsilon_report(
    noise_multiplier: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    prior_events: Sequence[AnyEvent] = (),
) -> Calibration:
    """ε of a given σ, q, T (alone and composed with `prior_events`), as a Calibration."""
    validate_probability_inputs(None, delta, sampling_rate, steps)
    validate_noise_multiplier(noise_multiplier)
    alone = epsilon_for(noise_multiplier, sampling_rate, steps, delta)
    total = epsilon_for(noise_multiplier, sampling_rate, steps, delta, prior_events)
    prior = compose_epsilon(prior_events, delta).epsilon if prior_events else 0.0
    return Calibration(
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        steps=steps,
        delta=delta,
        epsilon=alone.epsilon,
        total_epsilon=total.epsilon,
        prior_epsilon=prior,
        accountant=total.accountant,
        notes=total.notes,
    )
