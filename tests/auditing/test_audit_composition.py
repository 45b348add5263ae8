"""The parts' audits composed into one bound on the whole plan (`auditing/composition.py`),
against exact Gaussian mechanisms whose composition is known in closed form."""

from __future__ import annotations

import math

import pytest
import torch
from gaussian_reference import gaussian_mu, gaussian_scores
from scipy.optimize import brentq
from scipy.stats import norm

from dpsynth.auditing.composition import PartScores, composed_bound

DELTA = 1e-5


def _epsilon(mu: float, delta: float = DELTA) -> float:
    """The exact ε at δ of a μ-GDP mechanism (the inverse of `gaussian_mu`)."""

    def gap(epsilon: float) -> float:
        return (
            norm.cdf(-epsilon / mu + mu / 2)
            - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
            - delta
        )

    return brentq(gap, 0.0, 50.0)


def _part(name: str, mu: float, m: int, seed: int, times: int = 1) -> PartScores:
    scores, included = gaussian_scores(mu, m, seed)
    return PartScores(name, scores["z"], included, times)


MU_HALF = gaussian_mu(0.5, DELTA)  # each part exactly (0.5, δ)-DP


def test_two_parts_compose_beyond_either_claim_and_below_the_truth():
    """A plan that counted one of two (0.5, δ) parts claims 0.5: the composition shows more,
    while staying below the two parts' true composition (μ√2: ε ≈ 0.73)."""
    truth = _epsilon(MU_HALF * math.sqrt(2))
    parts = [_part("a", MU_HALF, 2_000_000, 1), _part("b", MU_HALF, 2_000_000, 2)]
    result = composed_bound(parts, DELTA, 0.95)
    assert 0.5 < result.lower_bound < truth
    assert result.parts["a"]["copies"] == 1 and result.parts["b"]["copies"] == 1


def test_copies_of_one_part_compose_as_the_plan_runs_it():
    """A part the plan runs 4 times (μ·2 in all: ε ≈ 1.07) enters with up to 4 copies."""
    truth = _epsilon(2 * MU_HALF)
    result = composed_bound([_part("a", MU_HALF, 1_000_000, 3, times=4)], DELTA, 0.95)
    assert result.parts["a"]["copies"] > 1
    assert 0.7 < result.lower_bound < truth


@pytest.mark.parametrize("seed", range(4))
def test_the_composed_bound_never_exceeds_the_true_composition(seed):
    truth = _epsilon(math.sqrt(MU_HALF**2 + (2 * MU_HALF) ** 2 * 3))
    parts = [_part("a", MU_HALF, 200_000, 10 + seed), _part("b", MU_HALF, 200_000, 20 + seed, 3)]
    assert composed_bound(parts, DELTA, 0.95).lower_bound <= truth


def test_a_part_without_evidence_is_left_out():
    """A part whose canaries tell nothing (μ = 0) enters with no copies: the bound is the
    other part's, not lowered by it."""
    alone = composed_bound([_part("a", MU_HALF, 400_000, 5)], DELTA, 0.95)
    both = composed_bound(
        [_part("a", MU_HALF, 400_000, 5), _part("b", 0.0, 400_000, 6)], DELTA, 0.95
    )
    assert both.parts["b"]["copies"] == 0
    assert both.lower_bound == pytest.approx(alone.lower_bound, rel=0.05)


def test_no_parts_give_no_bound():
    assert composed_bound([], DELTA, 0.95).lower_bound == 0.0


def test_a_region_is_judged_on_canaries_that_did_not_choose_it():
    """Scores that are pure noise on the judging canaries but separate the selection ones
    perfectly (every 8th) must not give a bound: the choice is not judged on itself."""
    m = 80_000
    generator = torch.Generator().manual_seed(0)
    included = torch.rand(m, generator=generator) < 0.5
    score = torch.randn(m, generator=generator, dtype=torch.float64)
    choose = torch.arange(m) % 8 == 0
    score[choose] = included[choose].double() * 10.0
    result = composed_bound([PartScores("a", score, included, 4)], DELTA, 0.95)
    assert result.lower_bound < 0.05


def test_a_marginal_plan_reports_its_parts_composed_when_trials_judge_them():
    """mst's measurements and selections compose when both parts are judged by the trials
    test; with a few canaries (the one-run test) they do not, and the parts keep all of β."""
    from dpsynth.auditing.planned_audit import run_audit

    many = run_audit("mst", "small", 1.0, data="german-credit", canaries=20_000, seed=0)
    assert many.composition is not None
    assert set(many.composition["parts"]) == {p["mechanism"] for p in many.parts}
    assert many.lower_bound >= many.composition["lower_bound"]
    assert many.verdict == "pass"
    few = run_audit("mst", "small", 1.0, data="german-credit", canaries=1_000, seed=0)
    assert few.composition is None
