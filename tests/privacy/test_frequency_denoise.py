"""The frequency model's `spiked` covariance post-processing (`frequency_denoise`)."""

from __future__ import annotations

import math

import pytest
import torch

from dpsynth.data.sources import load_data
from dpsynth.errors import UsageError
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.releases.frequency import (
    FrequencyPlan,
    model_from_release,
    release_frequency_model,
    spiked_eigenvalues,
)


def _wigner(d: int, std: float, seed: int) -> torch.Tensor:
    """A symmetric matrix of independent N(0, std²) entries on and above the diagonal, as
    the release's noise enters the second moments."""
    g = torch.Generator().manual_seed(seed)
    upper = torch.triu(torch.randn(d, d, generator=g, dtype=torch.float64) * std)
    return upper + upper.T - torch.diag(upper.diagonal())


def test_spikes_are_recovered_and_the_noise_bulk_is_dropped() -> None:
    """Three spikes (30, 15, 8) in d = 100 under noise of std 0.5 a entry (s√d = 5): the
    observed eigenvalues are pushed up by s²d/θ (to about 30.8, 16.7, 11.1) and 97 noise
    eigenvalues spread up to 2s√d = 10; the spiked estimate keeps three, each within 12% of θ
    (the one nearest the noise's edge is the roughest)."""
    d, std = 100, 0.5
    truth = torch.zeros(d, dtype=torch.float64)
    truth[:3] = torch.tensor([30.0, 15.0, 8.0], dtype=torch.float64)
    recovered = []
    for seed in range(5):
        values = torch.linalg.eigvalsh(torch.diag(truth) + _wigner(d, std, seed))
        assert int((values > 0).sum()) > 40  # what clipping negatives alone would keep
        shrunk = spiked_eigenvalues(values[None], torch.tensor([std]), d)[0]
        assert int((shrunk > 0).sum()) == 3
        recovered.append(shrunk[-3:].flip(0))
    mean = torch.stack(recovered).mean(0)
    torch.testing.assert_close(mean, truth[:3], rtol=0.12, atol=0.0)


def test_without_noise_spiked_is_the_clipped_model() -> None:
    """σ = 0 (the exact model, ε = inf): the noise's spectrum is a point, nothing is dropped."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, 8, 8, generator=g) * 2 - 1
    y = torch.randint(0, 3, (200,), generator=g)
    plan = FrequencyPlan(0.0, 4, 100.0, 1.0, "class")
    clip = release_frequency_model(x, y, 3, plan, torch.Generator(), "clip")
    spiked = release_frequency_model(x, y, 3, plan, torch.Generator(), "spiked")
    torch.testing.assert_close(spiked.covariances, clip.covariances)
    torch.testing.assert_close(spiked.means, clip.means)


@pytest.mark.parametrize("covariance", ["class", "pooled"])
def test_on_a_noisy_release_spiked_keeps_the_datas_directions(covariance: str) -> None:
    """Records with two directions of variance in a 6×6 band (d = 36), released at a σ whose
    noise covers the rest: `clip` keeps about half of the noise's eigenvalues (a covariance of
    rank ≈ d/2), `spiked` keeps the data's two, with about the data's variances."""
    g = torch.Generator().manual_seed(1)
    n, d = 3000, 36
    basis = torch.linalg.qr(torch.randn(d, 2, generator=g, dtype=torch.float64))[0]
    coefficients = torch.randn(n, 2, generator=g, dtype=torch.float64) * torch.tensor([2.0, 1.5])
    features = (coefficients @ basis.T).clamp(-20, 20)
    labels = torch.randint(0, 2, (n,), generator=g)
    plan = FrequencyPlan(1.0, 6, 10.0, 1.0, covariance)
    # The released vector's layout is the statistic's; build it directly from features.
    k = 2
    pairs = d * (d + 1) // 2
    blocks = 1 if covariance == "pooled" else k
    rows, cols = torch.triu_indices(d, d).unbind(0)
    sums = torch.stack([features[labels == c].sum(0) for c in range(k)]) / plan.clip_norm
    if covariance == "pooled":
        moments = (features.T @ features)[rows, cols][None] / plan.clip_norm**2
    else:
        moments = (
            torch.stack(
                [(features[labels == c].T @ features[labels == c])[rows, cols] for c in range(k)]
            )
            / plan.clip_norm**2
        )
    counts = torch.stack([(labels == c).sum() for c in range(k)]).to(torch.float64)
    exact = torch.cat([sums.flatten(), moments.flatten(), plan.count_weight * counts])
    assert exact.numel() == k * d + blocks * pairs + k
    noise = torch.randn(exact.shape, generator=g, dtype=torch.float64) * plan.noise_std
    released = exact + noise
    shape = (1, 6, 6)
    clipped = model_from_release(released, k, shape, plan, "clip")
    spiked = model_from_release(released, k, shape, plan, "spiked")
    clip_rank = torch.linalg.matrix_rank(clipped.covariances, hermitian=True, atol=1e-9)
    spiked_rank = torch.linalg.matrix_rank(spiked.covariances, hermitian=True, atol=1e-9)
    assert int(clip_rank.min()) > 10
    assert spiked_rank.tolist() == [2] * k
    # the variances are the data's, not inflated by the noise (2² and 1.5²)
    kept = torch.linalg.eigvalsh(spiked.covariances[0])[-2:]
    assert kept.tolist() == pytest.approx([2.25, 4.0], rel=0.2)
    assert math.isfinite(float(spiked.covariances.sum()))


def test_an_unknown_denoiser_is_refused_before_any_budget_is_planned() -> None:
    method = get_method("freq")
    info = load_data("digits").info()
    config = method.config("tiny", {"frequency_denoise": "median"}, info)
    with pytest.raises(UsageError, match="frequency_denoise"):
        method.plan(info, PrivacyTarget(1.0, 1e-5), config)


def _class_release(features: torch.Tensor, labels: torch.Tensor, k: int, plan: FrequencyPlan,
                   seed: int) -> torch.Tensor:  # fmt: skip
    """The released vector of `covariance=class` built from band features directly."""
    d = features.shape[1]
    rows, cols = torch.triu_indices(d, d).unbind(0)
    sums = torch.stack([features[labels == c].sum(0) for c in range(k)]) / plan.clip_norm
    moments = torch.stack(
        [(features[labels == c].T @ features[labels == c])[rows, cols] for c in range(k)]
    ) / plan.clip_norm**2  # fmt: skip
    counts = torch.bincount(labels, minlength=k).to(torch.float64)
    exact = torch.cat([sums.flatten(), moments.flatten(), plan.count_weight * counts])
    g = torch.Generator().manual_seed(seed)
    return exact + torch.randn(exact.shape, generator=g, dtype=torch.float64) * plan.noise_std


def test_spiked_pooled_keeps_what_the_classes_share_below_one_class_noise() -> None:
    """Nine classes of 1,000 records in d = 36: each has its own direction of variance 4 and
    all share one of variance 0.8. At this σ a class's covariance only shows spikes above
    s_k√d ≈ 1.04, the pooled one (3× less noise a entry) above ≈ 0.35. `spiked` keeps each
    class's own direction and loses the shared one; `spiked-pooled` keeps both, at about the
    data's variances, and stays symmetric PSD."""
    g = torch.Generator().manual_seed(3)
    k, n, d = 9, 1000, 36
    basis = torch.linalg.qr(torch.randn(d, k + 1, generator=g, dtype=torch.float64))[0]
    shared, own = basis[:, 0], basis[:, 1:]
    labels = torch.arange(k).repeat_interleave(n)
    features = (
        torch.randn(k * n, 1, generator=g, dtype=torch.float64) * math.sqrt(0.8) * shared
        + torch.randn(k * n, 1, generator=g, dtype=torch.float64) * 2.0 * own.T[labels]
    )
    plan = FrequencyPlan(1.0, 6, 10.0, 1.0, "class")
    released = _class_release(features, labels, k, plan, seed=4)
    spiked = model_from_release(released, k, (1, 6, 6), plan, "spiked")
    pooled = model_from_release(released, k, (1, 6, 6), plan, "spiked-pooled")
    along_shared = torch.einsum("i,kij,j->k", shared, pooled.covariances, shared)
    along_own = torch.einsum("ik,kij,jk->k", own, pooled.covariances, own)
    assert torch.einsum("i,kij,j->k", shared, spiked.covariances, shared).max() < 0.2
    assert along_shared.tolist() == pytest.approx([0.8] * k, rel=0.3)
    assert along_own.tolist() == pytest.approx([4.0] * k, rel=0.2)
    torch.testing.assert_close(pooled.covariances, pooled.covariances.transpose(1, 2))
    assert float(torch.linalg.eigvalsh(pooled.covariances).min()) > -1e-9


def test_spiked_pooled_on_a_pooled_release_is_spiked() -> None:
    """With one pooled covariance there is no class bulk to fill: the same model as `spiked`."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 1, 8, 8, generator=g) * 2 - 1
    y = torch.randint(0, 3, (300,), generator=g)
    plan = FrequencyPlan(0.5, 4, 100.0, 1.0, "pooled")
    spiked = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(1), "spiked")
    both = release_frequency_model(x, y, 3, plan, torch.Generator().manual_seed(1), "spiked-pooled")
    torch.testing.assert_close(both.covariances, spiked.covariances)
