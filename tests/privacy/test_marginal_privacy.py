"""The privacy layer of the marginal methods: sensitivity, noise, selection and accounting.

- Marginal counts change by exactly one cell by 1 between tables that differ by one row.
- Measurements are counts plus N(0, σ²) per cell from the secret stream (mean, std and a
  normality test over many draws).
- The exponential mechanism samples its softmax (frequencies against the exact
  probabilities), its quality moves by at most Δ between neighbours, and the resulting
  probabilities of every outcome differ by at most e^ε.
- `pure_dp` events compose as randomized response: against dp-accounting's PLD of
  randomized response (independent reference), alone and with Gaussian measurements; the
  RDP fallback against dp-accounting's RDP of randomized response.
- The calibrated schedule is valid and tight under that reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from dpsynth.errors import BudgetExceededError
from dpsynth.privacy.accounting import compose as accounting
from dpsynth.privacy.accounting import rdp
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.marginal_plan import calibrate_marginal_schedule
from dpsynth.privacy.mechanisms.marginal_measure import (
    MarginalQueries,
    marginal_counts,
    schedule_events,
)
from dpsynth.privacy.mechanisms.selection import exponential_mechanism

SIZES = (3, 4, 2, 5)


def _table(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, s, n) for s in SIZES], axis=1)


def reference_epsilon(events: list[dict], delta: float) -> float:
    """dp-accounting's PLD ε: Gaussian measurements and randomized-response selections."""
    composed = None
    for event in events_to_json(events):
        if event["type"] == "gaussian":
            one = pld.from_gaussian_mechanism(
                event["noise_multiplier"], value_discretization_interval=1e-4
            )
        else:  # pure_dp: binary randomized response with log-likelihood ratio ±ε
            noise = 2.0 / (1.0 + math.exp(event["epsilon"]))
            one = pld.from_randomized_response(noise, 2, value_discretization_interval=1e-4)
        one = one.self_compose(event["count"])
        composed = one if composed is None else composed.compose(one)
    return composed.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("clique", [(0,), (1, 3), (0, 2, 3), ()])
def test_neighbouring_tables_move_one_cell_by_one(clique):
    data = _table(300, 0)
    for row in range(0, 300, 37):
        removed = np.delete(data, row, axis=0)
        diff = marginal_counts(data, SIZES, clique) - marginal_counts(removed, SIZES, clique)
        assert np.abs(diff).sum() == 1.0 and np.linalg.norm(diff) == 1.0
    added = np.vstack([data, data[:1]])
    diff = marginal_counts(added, SIZES, clique) - marginal_counts(data, SIZES, clique)
    assert np.linalg.norm(diff) == 1.0


def test_measurements_are_counts_plus_gaussian_noise_of_std_sigma():
    data = _table(500, 1)
    queries = MarginalQueries(data, SIZES)
    generator = torch.Generator().manual_seed(5)
    sigma = 3.5
    draws = np.stack([queries.measure([(1, 3)], sigma, generator)[0] for _ in range(4000)])
    noise = draws - marginal_counts(data, SIZES, (1, 3))
    assert abs(noise.mean()) < 0.05 * sigma
    assert noise.std() == pytest.approx(sigma, rel=0.02)
    # Independent cells, Gaussian: a KS test on the standardised noise, and no correlation.
    assert stats.kstest(noise.reshape(-1) / sigma, "norm").pvalue > 1e-3
    assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 0.05
    # σ = 0 is the exact count (only the non-private baseline asks for it).
    exact = queries.measure([(0,)], 0.0, generator)[0]
    np.testing.assert_array_equal(exact, marginal_counts(data, SIZES, (0,)))


def test_the_secret_stream_alone_decides_the_noise():
    data = _table(100, 2)
    a = MarginalQueries(data, SIZES).measure([(0, 1)], 2.0, torch.Generator().manual_seed(9))
    b = MarginalQueries(data, SIZES).measure([(0, 1)], 2.0, torch.Generator().manual_seed(9))
    np.testing.assert_array_equal(a[0], b[0])


def test_exponential_mechanism_samples_its_softmax():
    scores = np.array([0.0, 1.0, 2.0, 4.0])
    epsilon, sensitivity = 1.0, 1.0
    generator = torch.Generator().manual_seed(11)
    draws = [exponential_mechanism(scores, sensitivity, epsilon, generator) for _ in range(20000)]
    counts = np.bincount(draws, minlength=4)
    expected = np.exp(epsilon * scores / (2 * sensitivity))
    expected = expected / expected.sum() * len(draws)
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    assert exponential_mechanism(scores, 1.0, math.inf, generator) == 3


def _selection_probabilities(data: np.ndarray, estimates, epsilon: float) -> np.ndarray:
    cliques = [(0, 1), (2, 3), (1, 2)]
    scores = np.array(
        [
            np.abs(marginal_counts(data, SIZES, c) - e).sum()
            for c, e in zip(cliques, estimates, strict=True)
        ]
    )
    logits = epsilon * scores / 2.0
    return np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()


def test_selection_quality_has_sensitivity_one_and_ratios_within_e_to_the_eps():
    data = _table(200, 3)
    rng = np.random.default_rng(4)
    cliques = [(0, 1), (2, 3), (1, 2)]
    estimates = [rng.uniform(0, 30, math.prod(SIZES[j] for j in c)) for c in cliques]
    epsilon = 0.7
    base = _selection_probabilities(data, estimates, epsilon)
    for row in range(0, 200, 13):
        for neighbour in (np.delete(data, row, axis=0), np.vstack([data, data[row : row + 1]])):
            for c, e in zip(cliques, estimates, strict=True):
                moved = (
                    np.abs(marginal_counts(neighbour, SIZES, c) - e).sum()
                    - np.abs(marginal_counts(data, SIZES, c) - e).sum()
                )
                assert abs(moved) <= 1.0 + 1e-9
            other = _selection_probabilities(neighbour, estimates, epsilon)
            assert np.all(np.abs(np.log(base / other)) <= epsilon + 1e-9)
    # The queries object selects from the same scores (a draw from the same generator state).
    queries = MarginalQueries(data, SIZES)
    zero, one = [0.0] * 3, [1.0] * 3
    picks = [
        queries.select(cliques, estimates, zero, one, epsilon, torch.Generator().manual_seed(s))
        for s in range(3000)
    ]
    frequencies = np.bincount(picks, minlength=3) / len(picks)
    np.testing.assert_allclose(frequencies, base, atol=0.03)


@pytest.mark.parametrize(
    "events",
    [
        [{"type": "pure_dp", "epsilon": 0.1, "count": 60}],
        [{"type": "pure_dp", "epsilon": 0.8, "count": 1}],
        [
            {"type": "pure_dp", "epsilon": 0.05, "count": 40},
            {"type": "gaussian", "noise_multiplier": 20.0, "count": 80},
        ],
        [
            {"type": "pure_dp", "epsilon": 0.6, "count": 15},
            {"type": "gaussian", "noise_multiplier": 4.0, "count": 30},
        ],
    ],
)
def test_pure_dp_composes_as_randomized_response_under_pld(events):
    for delta in (1e-4, 1e-5):
        ours = compose_epsilon(events, delta)
        # One pure-DP mechanism alone can be tighter under RDP than PRV's ε error allows.
        assert ours.accountant in (accounting.ACCOUNTANT_PRV, accounting.ACCOUNTANT_RDP_OWN)
        reference = reference_epsilon(events, delta)
        # Both are upper bounds of the same ε (ours includes its 0.5% ε error).
        assert reference * (1 - 2e-3) <= ours.epsilon <= reference * 1.02


def test_pure_dp_rdp_matches_dp_accounting():
    orders = tuple(float(a) for a in range(2, 40))
    for epsilon in (0.05, 0.5, 2.0):
        ours = rdp.rdp_curve(("pure_dp", epsilon, 1.0), orders)
        noise = 2.0 / (1.0 + math.exp(epsilon))
        reference = [
            rdp_privacy_accountant._randomized_response_rdp_replace_one(noise, 2, a) for a in orders
        ]
        np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-12)
    # The RDP fallback for pure DP reports our own (valid) curve, never the package's.
    keys, counts = [("pure_dp", 0.3, 1.0)], [10]
    assert (
        accounting._rdp_epsilon(keys, counts, 1e-5)
        >= compose_epsilon([{"type": "pure_dp", "epsilon": 0.3, "count": 10}], 1e-5).epsilon * 0.99
    )


@pytest.mark.parametrize(
    ("epsilon", "delta", "measurements", "selections", "share"),
    [(1.0, 1e-4, 51, 30, 0.1), (10.0, 1e-5, 81, 40, 1 / 3)],
)
def test_calibrated_schedule_is_valid_and_tight(epsilon, delta, measurements, selections, share):
    schedule = calibrate_marginal_schedule(epsilon, delta, measurements, selections, share)
    events = schedule_events(
        schedule.noise_multiplier, schedule.selection_epsilon, measurements, selections
    )
    assert schedule.epsilon <= epsilon
    # the ledger's events (annotated) compose to the ε the schedule was calibrated to
    assert compose_epsilon(events, delta).epsilon == schedule.epsilon
    assert reference_epsilon(events, delta) <= epsilon * 1.002
    # 2% less noise everywhere already exceeds ε under the reference.
    louder = schedule_events(
        schedule.noise_multiplier / 1.02, schedule.selection_epsilon * 1.02, measurements,
        selections,
    )  # fmt: skip
    assert reference_epsilon(louder, delta) > epsilon
    # The split: selections get `share` of the Gaussian-DP-like budget.
    mu2_measure = measurements / schedule.noise_multiplier**2
    mu2_select = selections * schedule.selection_epsilon**2
    assert mu2_select / (mu2_measure + mu2_select) == pytest.approx(share, rel=1e-6)


def test_schedule_composes_prior_spends_and_refuses_when_nothing_is_left():
    prior = [{"type": "gaussian", "noise_multiplier": 3.0, "count": 1}]
    alone = calibrate_marginal_schedule(2.0, 1e-5, 20, 10, 0.1)
    after = calibrate_marginal_schedule(2.0, 1e-5, 20, 10, 0.1, prior)
    assert after.noise_multiplier > alone.noise_multiplier
    assert after.total_epsilon <= 2.0 and after.epsilon < after.total_epsilon
    with pytest.raises(BudgetExceededError):
        calibrate_marginal_schedule(0.5, 1e-5, 20, 10, 0.1, [*prior] * 40)
