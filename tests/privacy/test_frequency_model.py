"""`dpsynth.privacy.releases.frequency`: the DP low-frequency model's sensitivity, noise, accounting
and
post-processing."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
from dpsynth.privacy.accounting.events import events_to_json
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.releases.frequency import (
    FrequencyPlan,
    band_features,
    band_images,
    dct_matrix,
    frequency_plan_in,
    frequency_statistics,
    model_from_release,
    plan_with_frequency,
    release_frequency_model,
)


def _images(n: int, seed: int = 0, shape=(1, 8, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *shape, generator=g) * 2 - 1
    return x, torch.randint(0, 3, (n,), generator=g)


def test_the_dct_is_orthonormal_and_the_full_band_round_trips():
    d = dct_matrix(8)
    assert torch.allclose(d @ d.T, torch.eye(8, dtype=torch.float64), atol=1e-12)
    x, _ = _images(5, shape=(2, 8, 8))
    features = band_features(x, 8)
    assert features.shape == (5, 2 * 64)
    # orthonormal: the norm of the features is that of x + 1
    assert torch.allclose(features.norm(dim=1), (x.double() + 1).flatten(1).norm(dim=1))
    assert torch.allclose(band_images(features, (2, 8, 8), 8), x.double(), atol=1e-9)
    low = band_images(band_features(x, 3), (2, 8, 8), 3)
    assert low.shape == x.shape and not torch.allclose(low, x.double(), atol=1e-3)


@pytest.mark.parametrize("covariance", ["pooled", "class"])
def test_one_record_moves_the_released_vector_by_at_most_the_sensitivity(covariance):
    plan = FrequencyPlan(1.0, 4, 2.5, 0.5, covariance)
    assert plan.sensitivity == pytest.approx(math.sqrt(2.25))
    x, y = _images(40, 1)
    base = frequency_statistics(x[1:], y[1:], 3, plan)
    worst = 0.0
    # the added record may carry any label: it moves its own class's sums (and, with
    # per-class moments, its own class's block) and count, never more than Δ in all
    for label in range(3):
        labels = torch.cat([torch.tensor([label]), y[1:]])
        for candidate in (x[0], torch.ones_like(x[0]), -torch.ones_like(x[0]), 0.3 * x[0]):
            added = torch.cat([candidate.unsqueeze(0), x[1:]])
            change = (frequency_statistics(added, labels, 3, plan) - base).norm().item()
            assert change <= plan.sensitivity + 1e-9
            worst = max(worst, change)
    # an all-ones image (norm far above the clip) uses most of the bound: sums 1, moments
    # close to 1 (the upper triangle of f fᵀ keeps most of its Frobenius norm), count w
    assert worst > math.sqrt(1 + 0.5**2 + 0.25)
    # labels outside the classes count nowhere
    outside = frequency_statistics(x[:1], torch.tensor([7]), 3, plan)
    assert torch.count_nonzero(outside) == 0


def test_the_noise_has_the_planned_std_and_comes_from_the_given_stream():
    plan = FrequencyPlan(0.7, 3, 2.0, 1.0, "pooled")
    x, y = _images(30, 2)
    exact = frequency_statistics(x, y, 3, plan)
    draws = []
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(exact.shape, generator=g, dtype=torch.float64)
        draws.append(noise * plan.noise_std)
    std = torch.stack(draws).std().item()
    assert std == pytest.approx(plan.noise_multiplier * math.sqrt(3.0), rel=0.05)
    # the release draws exactly one such vector from the stream it is given
    a = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(9))
    b = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(9))
    c = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(10))
    assert torch.equal(a.means, b.means) and not torch.equal(a.means, c.means)
    g = torch.Generator().manual_seed(9)
    expected = exact + plan.noise_std * torch.randn(exact.shape, generator=g, dtype=torch.float64)
    assert torch.allclose(a.means, model_from_release(expected, 3, (1, 8, 8), plan).means)


@pytest.mark.parametrize("covariance", ["pooled", "class"])
def test_the_released_sums_and_counts_carry_noise_of_the_planned_std(covariance):
    # Empirically, through the whole release path: over many releases of the same records
    # from different streams, the released class sums (recovered from the means and counts)
    # and the counts deviate from the exact ones by N(0, (σΔ)²) on every coordinate.
    plan = FrequencyPlan(0.6, 3, 2.0, 0.5, covariance)
    x, y = _images(90, 4)
    exact = frequency_statistics(x, y, 3, plan)
    d, w = 9, plan.count_weight
    exact_sums, exact_counts = exact[: 3 * d], exact[-3:]
    deviations = []
    for seed in range(300):
        model = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(100 + seed))
        assert model.counts.min() > 1  # about 30 a class: the means are not floored
        sums = (model.means * model.counts[:, None] / plan.clip_norm).flatten()
        deviations.append(torch.cat([sums - exact_sums, w * model.counts - exact_counts]))
    deviations = torch.stack(deviations)
    assert deviations.mean().item() == pytest.approx(0.0, abs=0.03)
    assert deviations.std().item() == pytest.approx(plan.noise_std, rel=0.05)
    assert plan.noise_std == pytest.approx(0.6 * math.sqrt(2.25))


def test_without_noise_the_model_is_the_classes_mean_and_covariance():
    x, y = _images(300, 3)
    plan = FrequencyPlan(0.0, 3, 100.0, 1.0, "class")  # a clip no record reaches
    model = release_frequency_model(x, y, 3, plan, torch.Generator())
    features = band_features(x, 3)
    for k in range(3):
        f = features[y == k]
        assert torch.allclose(model.means[k], f.mean(0), atol=1e-9)
        covariance = torch.cov(f.T, correction=0)
        assert torch.allclose(model.covariances[k], covariance, atol=1e-9)
        assert model.counts[k] == (y == k).sum()
    pooled = release_frequency_model(
        x, y, 3, FrequencyPlan(0.0, 3, 100.0, 1.0, "pooled"), torch.Generator()
    )
    within = sum(
        torch.cov(features[y == k].T, correction=0) * (y == k).sum() for k in range(3)
    ) / len(y)
    assert torch.allclose(pooled.covariances[0], within, atol=1e-9)
    # samples: the right shape and range, and their class means near the model's
    labels = torch.arange(3).repeat_interleave(4000)
    images = model.sample(labels, torch.Generator().manual_seed(0))
    assert images.shape == (12000, 1, 8, 8) and images.min() >= -1 and images.max() <= 1
    means = band_features(images[:4000], 3).mean(0)
    assert means[0] == pytest.approx(float(model.means[0][0]), rel=0.05)


def _pld(events: list[dict], delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    )
    for e in events_to_json(events):
        gaussian = dp_event.GaussianDpEvent(e["noise_multiplier"])
        if e["type"] == "gaussian":
            accountant.compose(gaussian, e["count"])
        else:
            accountant.compose(
                dp_event.PoissonSampledDpEvent(e["sampling_rate"], gaussian), e["steps"]
            )
    return accountant.get_epsilon(delta)


def test_the_release_takes_its_share_and_composes_with_the_run_under_the_target():
    target = PrivacyTarget(1.0, 1e-5)

    def rest(prior):
        return plan_poisson_gaussian(target, 4000, 256, 50, 1.0, prior)

    plan = plan_with_frequency(target, FrequencyPlan(0.0, 10, 16.8, 0.5, "pooled"), 0.9, rest)
    release, loop = plan.events
    assert frequency_plan_in(plan.events).band == 10
    assert compose_epsilon([release], 1e-5).epsilon == pytest.approx(0.9, rel=0.01)
    assert plan.epsilon_bound <= 1.0
    assert _pld([release, loop], 1e-5) <= 1.0 * 1.002
    with pytest.raises(UsageError):
        plan_with_frequency(target, FrequencyPlan(0.0, 10, 16.8, 0.5, "pooled"), 1.0, rest)
    with pytest.raises(UsageError):
        FrequencyPlan(0.0, 10, 16.8, 0.5, "diagonal")
    free = plan_with_frequency(
        PrivacyTarget(math.inf, 1e-5), FrequencyPlan(1.0, 4, 2.0, 0.5, "class"), 0.5,
        lambda prior: plan_poisson_gaussian(PrivacyTarget(math.inf, 1e-5), 100, 10, 5, 1.0),
    )  # fmt: skip
    assert free.events[0].kind == "non_private"
