"""The independent-trials test (`auditing/trials.py`) against an independent reference, and its
soundness and power on an exact Gaussian mechanism."""

from __future__ import annotations

import math

import pytest
import torch
from gaussian_reference import gaussian_mu, gaussian_scores
from scipy.stats import binomtest

from dpsynth.auditing.guesses import TRIALS_FROM, best_guesses
from dpsynth.auditing.trials import SELECTION_STRIDE, rate_bounds, region_bound, trials_bound
from dpsynth.errors import UsageError


@pytest.mark.parametrize(("hits", "trials"), [(0, 50), (3, 50), (25, 50), (50, 50), (7, 9000)])
def test_rate_bounds_are_scipys_exact_clopper_pearson(hits, trials):
    # a one-sided bound at c is the two-sided exact interval's end at level 2c − 1
    low, high = rate_bounds(hits, trials, 0.975)
    interval = binomtest(hits, trials).proportion_ci(confidence_level=0.95, method="exact")
    assert low == pytest.approx(interval.low, abs=1e-12)
    assert high == pytest.approx(interval.high, abs=1e-12)


def test_region_bound_is_the_log_ratio_of_the_rate_bounds():
    each = 1 - 0.05 / 2
    low, _ = rate_bounds(400, 1000, each)
    _, high = rate_bounds(100, 1000, each)
    expected = math.log((low - 1e-5) / high)
    assert region_bound(400, 1000, 100, 1000, 1e-5, 0.95) == pytest.approx(expected)
    assert region_bound(100, 1000, 400, 1000, 1e-5, 0.95) == 0.0  # the wrong way round
    with pytest.raises(UsageError):
        rate_bounds(5, 4, 0.9)


def test_a_mechanism_at_its_claim_is_never_caught():
    """An exactly (1, 1e-5)-DP Gaussian mechanism: the bound stays under 1 on every seed."""
    mu = gaussian_mu(1.0, 1e-5)
    for seed in range(8):
        scores, included = gaussian_scores(mu, 40_000, seed)
        assert trials_bound(scores, included, 1e-5, 0.95).lower_bound <= 1.0


def test_a_two_fold_noise_error_at_epsilon_one_is_caught():
    """σ/2 (μ doubled: a true ε of about 2.15) is caught with 100,000 canaries; the one-run
    test of the same scores is not (its bound stays well under 1)."""
    mu = 2.0 * gaussian_mu(1.0, 1e-5)
    scores, included = gaussian_scores(mu, 100_000, 0)
    outcome = best_guesses(scores, included, 1e-5, 0.95, independent=True)
    assert outcome.test == "trials" and outcome.trials is not None
    assert outcome.lower_bound == outcome.trials.lower_bound > 1.0
    assert best_guesses(scores, included, 1e-5, 0.95).lower_bound < 1.0


def test_below_trials_from_the_one_run_test_judges():
    scores, included = gaussian_scores(3.0, TRIALS_FROM - 1, 3)
    outcome = best_guesses(scores, included, 1e-5, 0.95, independent=True)
    assert outcome.test == "one-run" and outcome.trials is None and outcome.guesses > 0
    assert outcome.lower_bound == outcome.one_run_bound > 0


def test_the_canaries_that_choose_the_region_do_not_judge_it():
    scores, included = gaussian_scores(1.0, 8_000, 1)
    outcome = trials_bound(scores, included, 1e-5, 0.95)
    judged = 8_000 - 8_000 // SELECTION_STRIDE
    assert outcome.trials_in + outcome.trials_out == judged
    assert outcome.trials_in == int(included[torch.arange(8_000) % SELECTION_STRIDE != 0].sum())


def test_a_trial_mask_keeps_one_canary_of_each_pair():
    scores, included = gaussian_scores(1.0, 2 * TRIALS_FROM, 2)
    mask = torch.arange(2 * TRIALS_FROM) % 2 == 0
    outcome = best_guesses(scores, included, 1e-5, 0.95, independent=True, trial_mask=mask)
    assert outcome.trials is not None
    kept = TRIALS_FROM - TRIALS_FROM // SELECTION_STRIDE
    assert outcome.trials.trials_in + outcome.trials.trials_out == kept
