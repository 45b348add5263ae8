"""Privacy profiles δ(ε) of composed events, against exact formulas and dp-accounting's PLD."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy.stats import norm

from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import (
    Gaussian,
    NonPrivate,
    PoissonGaussian,
    PureDp,
    ThresholdDelta,
)
from dpsynth.privacy.accounting.profile import ProfileUnavailable, privacy_profile


def _gaussian_delta(epsilon: np.ndarray, mu: float) -> np.ndarray:
    """The exact profile of a Gaussian mechanism with sensitivity/σ = μ."""
    return norm.cdf(-epsilon / mu + mu / 2) - np.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


@pytest.mark.parametrize("sigma", [0.8, 4.0, 20.0])
def test_a_gaussian_profile_bounds_the_exact_one_from_above_and_closely(sigma):
    profile = privacy_profile([Gaussian(sigma, 1)], eps_error=0.002)
    mu = 1.0 / sigma
    exact = _gaussian_delta(profile.epsilons, mu)
    inside = np.abs(profile.epsilons) < 3.0 * max(mu, mu * mu)
    assert np.all(profile.deltas[inside] >= exact[inside])
    # within the discretisation's ε error (a δ slope below 1) and δ error
    assert np.max(profile.deltas[inside] - exact[inside]) < 0.003


def test_count_gaussians_compose_to_one_of_sqrt_count_mu():
    profile = privacy_profile([Gaussian(10.0, 25)], eps_error=0.002)
    exact = _gaussian_delta(profile.epsilons, math.sqrt(25) / 10.0)
    inside = np.abs(profile.epsilons) < 2.0
    assert np.all(profile.deltas[inside] >= exact[inside])
    assert np.max(profile.deltas[inside] - exact[inside]) < 0.003


@pytest.mark.parametrize(("sigma", "q", "steps"), [(1.0, 0.022, 20), (2.9, 0.022, 1100)])
def test_a_subsampled_profile_agrees_with_dp_accounting(sigma, q, steps):
    """dp-accounting's PLD (both directions of add/remove, a pessimistic estimate) is within
    5% of ours (the ε error's shift on a steep tail), and ours (the record-in direction, an
    upper bound) is not below it."""
    reference = privacy_loss_distribution.from_gaussian_mechanism(
        sigma, sampling_prob=q, neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE
    ).self_compose(steps)
    profile = privacy_profile([PoissonGaussian(sigma, q, steps)], eps_error=0.002)
    for epsilon in (0.0, 0.25, 0.5, 1.0):
        i = int(np.searchsorted(profile.epsilons, epsilon))
        ours = float(profile.deltas[i])  # at an ε just above `epsilon`: δ there is smaller
        theirs = reference.get_delta_for_epsilon(float(profile.epsilons[i]))
        assert theirs * 0.999 <= ours <= theirs * 1.05 + 1e-9


def test_epsilon_lower_sits_below_the_accountants_upper_bound_and_near_it():
    for events, delta in (
        ([Gaussian(4.0, 1)], 1e-5),
        ([PoissonGaussian(1.0, 0.022, 20)], 1e-5),
        ([Gaussian(24.8, 40), PureDp(0.0414, 19)], 1e-4),
    ):
        lower = privacy_profile(events, eps_error=0.002).epsilon_lower(delta)
        bound = compose_epsilon(events, delta)
        assert lower <= bound.estimate <= bound.epsilon
        assert lower > 0.97 * bound.epsilon


def test_the_exact_gaussian_epsilon_lies_between_the_profiles_bounds():
    sigma, delta = 4.0, 1e-5
    lower = privacy_profile([Gaussian(sigma, 1)], eps_error=0.002).epsilon_lower(delta)
    grid = np.linspace(lower - 0.05, lower + 0.05, 2001)
    exact = grid[np.argmax(_gaussian_delta(grid, 1.0 / sigma) <= delta)]
    assert lower <= exact <= compose_epsilon([Gaussian(sigma, 1)], delta).epsilon


def test_violation_rules_out_rates_only_a_leakier_mechanism_has():
    """The likelihood-ratio test's exact rates at a threshold of N(μ, 1) against N(0, 1) lie
    on the trade-off curve: allowed at μ, ruled out by the profile of μ/1.2."""
    mu = 0.25
    rate_in, rate_out = norm.sf(0.1 - mu), norm.sf(0.1)
    assert privacy_profile([Gaussian(1.0 / mu, 1)]).violation(rate_in, rate_out) <= 0.0
    assert privacy_profile([Gaussian(1.2 / mu, 1)]).violation(rate_in, rate_out) > 0.0


@pytest.mark.parametrize(
    "events",
    [[NonPrivate()], [Gaussian(1.0, 1), ThresholdDelta(1e-9)], []],
    ids=["non-private", "threshold", "empty"],
)
def test_no_profile_where_none_can_be_computed(events):
    with pytest.raises(ProfileUnavailable):
        privacy_profile(events)
