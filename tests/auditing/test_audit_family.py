"""The family test (`auditing/family.py`): sound on the claimed family, tight with few trials,
and it measures the factor of a noise or sensitivity error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import nchypergeom_fisher

from dpsynth.auditing.family import (
    _upper_tail,
    composed_family_bound,
    family_bound,
    logistic_factor,
    scaled_events,
)
from dpsynth.auditing.trials import trials_bound
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import Gaussian, PoissonGaussian, PureDp, ThresholdDelta

SIGMA, DELTA = 4.0, 1e-5  # one Gaussian release at ε ≈ 0.93
CLAIM = compose_epsilon([Gaussian(SIGMA, 1)], DELTA).epsilon


def _gaussian_trials(m: int, seed: int, factor: float = 1.0) -> tuple[dict, torch.Tensor]:
    """m canaries of one Gaussian release whose influence is `factor` times the claimed."""
    generator = torch.Generator().manual_seed(seed)
    included = torch.rand(m, generator=generator) < 0.5
    noise = torch.randn(m, generator=generator, dtype=torch.float64)
    return {"llr": noise + included.double() * factor / SIGMA}, included


def test_a_sound_gaussian_release_never_exceeds_its_claim_and_nears_it():
    bounds = []
    for seed in range(12):
        scores, included = _gaussian_trials(100_000, seed)
        bounds.append(family_bound(scores, included, [Gaussian(SIGMA, 1)], DELTA, 0.95).lower_bound)
    assert max(bounds) <= CLAIM
    # 100,000 trials: about 0.8 of the claim on average (the trials test needs ~4 million)
    assert np.mean(bounds) > 0.75 * CLAIM


def test_a_root_two_error_is_measured_where_the_trials_test_sees_nothing():
    scores, included = _gaussian_trials(50_000, 1, factor=math.sqrt(2.0))
    family = family_bound(scores, included, [Gaussian(SIGMA, 1)], DELTA, 0.95)
    assert family.lower_bound > CLAIM and 1.0 < family.factor < math.sqrt(2.0)
    assert trials_bound(scores, included, DELTA, 0.95).lower_bound < CLAIM


def test_subsampled_gaussian_steps_reach_most_of_their_claim_from_two_million_trials():
    sigma, q, steps = 1.0, 0.022, 20
    events = [PoissonGaussian(sigma, q, steps)]
    claim = compose_epsilon(events, DELTA).epsilon
    generator = torch.Generator().manual_seed(0)
    m = 2_000_000
    included = torch.rand(m, generator=generator) < 0.5
    sampled = (torch.rand(m, steps, generator=generator) < q) & included[:, None]
    released = torch.randn(m, steps, generator=generator, dtype=torch.float64) * sigma
    released += sampled.double()
    log_ratio = (released - 0.5) / sigma**2
    llr = torch.logaddexp(torch.full_like(released, math.log1p(-q)), log_ratio + math.log(q))
    outcome = family_bound({"llr": llr.sum(1)}, included, events, DELTA, 0.95)
    assert 0.8 * claim < outcome.lower_bound <= claim


def test_no_family_bound_where_the_plan_has_no_profile():
    scores, included = _gaussian_trials(20_000, 0)
    plan = [Gaussian(SIGMA, 1), ThresholdDelta(1e-9)]
    assert family_bound(scores, included, plan, DELTA, 0.95) is None


def test_scaled_events_scale_the_ratio_of_influence_to_noise():
    steps = PoissonGaussian(2.0, 0.1, 5)
    scaled = scaled_events([Gaussian(4.0, 3), steps, PureDp(0.5, 2), ThresholdDelta(1e-9)], 2.0)
    assert scaled[0] == Gaussian(2.0, 3) and scaled[2] == PureDp(1.0, 2)
    assert scaled[1] == PoissonGaussian(1.0, 0.1, 5) and scaled[3] == ThresholdDelta(1e-9)


def test_the_odds_ratio_tail_is_fishers_noncentral_hypergeometric():
    for hits, log_odds in ((30, 0.3), (10, -0.5), (45, 1.2)):
        expected = nchypergeom_fisher.sf(hits - 1, 220, 100, 50, math.exp(log_odds))
        assert _upper_tail(hits, 100, 120, 50, log_odds) == pytest.approx(expected, rel=1e-9)


def test_the_selection_factor_is_exact_at_its_confidence_and_sees_a_two_fold_error():
    """Two candidates at log-odds −1 without the canary: the odds move by e^{k·ε} with it."""
    rng = np.random.default_rng(0)
    epsilon, n = 0.2, 20_000

    def factor(k: float) -> float:
        p_in = 1.0 / (1.0 + math.exp(1.0 - k * epsilon))
        p_out = 1.0 / (1.0 + math.exp(1.0))
        return logistic_factor(
            int(rng.binomial(n, p_in)), n, int(rng.binomial(n, p_out)), n, epsilon, 0.9
        )

    sound = [factor(1.0) for _ in range(120)]
    assert np.mean(np.array(sound) > 1.0) <= 0.1 + 0.08  # at most β, up to sampling error
    assert 0.5 < np.mean(sound) < 1.0
    assert np.mean([factor(2.0) > 1.0 for _ in range(20)]) > 0.85
    assert logistic_factor(100, 1000, 100, 1000, epsilon, 0.95) == 0.0


def test_parts_measured_at_their_own_factors_compose_below_the_claim_when_sound():
    measured, selected = Gaussian(24.8, 40), PureDp(0.0414, 19)
    claim = compose_epsilon([measured, selected], 1e-4).epsilon
    alone = composed_family_bound([measured, selected], [1.0, 0.0], 1e-4)
    both = composed_family_bound([measured, selected], [1.0, 0.5], 1e-4)
    assert alone < both < claim
    assert composed_family_bound([measured, selected], [0.0, 0.0], 1e-4) == 0.0
    assert composed_family_bound([measured, selected], [2.0, 1.0], 1e-4) > claim


def test_the_cli_shows_both_tests_and_the_parts_families_composed():
    from typer.testing import CliRunner

    from dpsynth.cli import app

    runner = CliRunner()
    pge = runner.invoke(
        app,
        ["audit", "--method", "pge", "--preset", "tiny", "--epsilon", "1", "--canaries", "5000",
         "--runs", "3", "--seed", "0"],
        terminal_width=200,
    )  # fmt: skip
    assert pge.exit_code == 0, pge.output
    assert "trials test (assumes independence only)" in pge.output
    assert "family test (the plan's noise, its scale unknown)" in pge.output
    mst = runner.invoke(
        app,
        ["audit", "--method", "mst", "--preset", "small", "--data", "german-credit",
         "--epsilon", "1", "--canaries", "20000", "--seed", "0", "--json"],
    )  # fmt: skip
    assert mst.exit_code == 0, mst.output
    out = json.loads(mst.stdout)
    composed = out["composition"]
    assert 0.0 < composed["family_lower_bound"] <= out["claimed_epsilon"]
    assert set(composed["family_factors"]) == {p["mechanism"] for p in out["parts"]}
    assert out["lower_bound"] >= composed["family_lower_bound"]
