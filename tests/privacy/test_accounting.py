"""Accounting against an independent reference: Google's dp-accounting PLD accountant."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting import compose as accounting
from dpsynth.privacy.accounting.calibration import calibrate_noise, max_steps
from dpsynth.privacy.accounting.compose import (
    compose_epsilon,
    epsilon_report,
    poisson_gaussian_event,
)
from dpsynth.privacy.accounting.events import events_to_json

ADD_REMOVE = NeighboringRelation.ADD_OR_REMOVE_ONE


def pld_epsilon(events: list[dict], delta: float) -> float:
    """ε of `events` under dp-accounting's PLD accountant (add/remove adjacency)."""
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=ADD_REMOVE, value_discretization_interval=1e-4
    )
    for event in events_to_json(events):
        gaussian = dp_event.GaussianDpEvent(event["noise_multiplier"])
        if event["type"] == "poisson_gaussian":
            accountant.compose(
                dp_event.PoissonSampledDpEvent(event["sampling_rate"], gaussian), event["steps"]
            )
        else:
            accountant.compose(gaussian, event["count"])
    return accountant.get_epsilon(delta)


SETTINGS = [
    # (epsilon, delta, q, steps)
    (1.0, 1e-5, 0.01, 300),
    (8.0, 1e-5, 0.05, 200),
    (3.0, 1e-6, 0.1, 50),
]


@pytest.mark.parametrize(("epsilon", "delta", "q", "steps"), SETTINGS)
def test_calibrated_sigma_is_valid_and_tight_against_pld(epsilon, delta, q, steps):
    result = calibrate_noise(epsilon, delta, q, steps)
    sigma = result.noise_multiplier
    assert result.epsilon <= epsilon
    # Valid: the independent accountant agrees σ meets the target (PLD is itself an upper
    # bound, so allow only its own discretisation slack).
    assert pld_epsilon([poisson_gaussian_event(sigma, q, steps)], delta) <= epsilon * 1.002
    # Tight: 2% less noise already fails under PLD, so the smallest σ that PLD accepts is
    # above σ/1.02, i.e. ours is within 2% of it.
    assert pld_epsilon([poisson_gaussian_event(sigma / 1.02, q, steps)], delta) > epsilon


def test_heterogeneous_composition_matches_pld():
    events = [
        poisson_gaussian_event(1.2, 0.02, 300),
        poisson_gaussian_event(2.5, 0.1, 40),
        {"type": "gaussian", "noise_multiplier": 8.0, "count": 2},
    ]
    ours = compose_epsilon(events, 1e-5)
    reference = pld_epsilon(events, 1e-5)
    assert ours.epsilon == pytest.approx(reference, rel=0.03)
    # Composition is not addition: the total is well below the sum of the parts.
    parts = sum(compose_epsilon([e], 1e-5).epsilon for e in events)
    assert ours.epsilon < 0.9 * parts


def test_bound_is_never_below_the_pld_estimate_minus_its_error():
    event = poisson_gaussian_event(0.9, 0.05, 500)
    ours = compose_epsilon([event], 1e-5)
    assert ours.epsilon >= pld_epsilon([event], 1e-5) * 0.99
    assert ours.estimate is not None and ours.estimate <= ours.epsilon


def test_rdp_fallback_when_prv_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("Discrete mean differs from continuous mean significantly.")

    monkeypatch.setattr(accounting, "_prv_epsilon", broken)
    accounting._compose_cached.cache_clear()
    event = poisson_gaussian_event(1.1, 0.01, 400)
    result = compose_epsilon([event], 1e-5)
    accounting._compose_cached.cache_clear()
    # The fallback is dp-accounting's RDP bound up to the choice of orders: never below it
    # by more than rounding, and it says what it is.
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1)), 400)
    assert "RDP" in result.accountant
    assert result.epsilon >= rdp.get_epsilon(1e-5) * 0.999
    assert result.epsilon >= pld_epsilon([event], 1e-5)
    assert any("failed" in note for note in result.notes)


def test_tiny_delta_gives_a_finite_valid_bound():
    event = poisson_gaussian_event(1.0, 0.01, 1000)
    result = compose_epsilon([event], 1e-12)
    assert math.isfinite(result.epsilon)
    assert result.epsilon >= pld_epsilon([event], 1e-12) * 0.99


def test_epsilon_report_and_max_steps_are_consistent():
    sigma, q, delta = 1.0, 0.02, 1e-5
    found = max_steps(sigma, 2.0, delta, q)
    assert found.epsilon <= 2.0
    over = epsilon_report(sigma, delta, q, found.steps + 1)
    assert over.epsilon > 2.0


def test_prior_spends_are_composed_into_calibration():
    prior = (poisson_gaussian_event(1.0, 0.02, 200),)
    alone = calibrate_noise(4.0, 1e-5, 0.02, 200)
    after = calibrate_noise(4.0, 1e-5, 0.02, 200, prior)
    assert after.noise_multiplier > alone.noise_multiplier
    assert after.total_epsilon <= 4.0
    assert after.prior_epsilon > 0
    with pytest.raises(BudgetExceededError):
        calibrate_noise(after.prior_epsilon * 0.5, 1e-5, 0.02, 200, prior)


def test_one_rule_for_a_small_headroom_at_least_half_a_percent_of_epsilon():
    # Under 0.5% of ε left (the accountant's error bound) is exit 3 naming the spent ε and the
    # headroom, whatever q and T; with 0.6% left a σ is certified and the total stays ≤ ε.
    prior_alone = calibrate_noise(4.99, 1e-5, 0.01, 1000)
    prior = (poisson_gaussian_event(prior_alone.noise_multiplier, 0.01, 1000),)
    spent = prior_alone.epsilon
    assert 4.97 < spent <= 4.99
    for q, steps in ((0.01, 1000), (1.0, 1), (0.05, 300)):
        with pytest.raises(BudgetExceededError, match=r"leaving a headroom of .* at least 0\.5%"):
            calibrate_noise(spent * 1.004, 1e-5, q, steps, prior)
        fits = calibrate_noise(spent * 1.006, 1e-5, q, steps, prior)
        assert fits.total_epsilon <= spent * 1.006


def test_non_private_events_compose_to_infinity():
    result = compose_epsilon([{"type": "non_private", "steps": 3}], 1e-5)
    assert math.isinf(result.epsilon)


@pytest.mark.parametrize(
    ("epsilon", "delta", "q", "steps"),
    [
        (0.0, 1e-5, 0.1, 10),
        (-1.0, 1e-5, 0.1, 10),
        (math.nan, 1e-5, 0.1, 10),
        (math.inf, 1e-5, 0.1, 10),
        (1.0, 0.0, 0.1, 10),
        (1.0, 1.0, 0.1, 10),
        (1.0, 1e-5, 0.0, 10),
        (1.0, 1e-5, 1.5, 10),
        (1.0, 1e-5, 0.1, 0),
    ],
)
def test_invalid_inputs_are_usage_errors(epsilon, delta, q, steps):
    with pytest.raises(UsageError):
        calibrate_noise(epsilon, delta, q, steps)
