"""The derivative-Gaussian-process mechanism of DP-Kernel (spec dpkernel §3.6).

References are independent of the sampler: the dense covariance is checked against mixed
second derivatives of the kernel taken by autograd, and the sampler against that covariance.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import jacrev

from dpsynth.errors import UsageError
from dpsynth.methods.dpkernel.kernel import raw_embedding_gradient
from dpsynth.privacy.mechanisms.functional import (
    _block_noise,
    derivative_kernel_covariance,
    functional_sensitivity,
    noise_scale,
    privatize_embedding_gradient,
    sample_derivative_noise,
)

BANDWIDTHS = (1.0, 2.0, 4.0)


def _kernel(u: torch.Tensor, v: torch.Tensor, bandwidths=BANDWIDTHS) -> torch.Tensor:
    sq = (u - v).pow(2).sum()
    return sum(torch.exp(-sq / (2 * b**2)) for b in bandwidths)


def _autograd_covariance(points: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """C[j·d + a, l·d + b] = ∂²k(u, v)/∂u_a ∂v_b at (w_j, w_l), by autograd."""
    m, d = points.shape
    mixed = jacrev(jacrev(_kernel, argnums=0), argnums=1)
    out = torch.zeros(m, d, m, d, dtype=torch.float64)
    for j in range(m):
        for k in range(m):
            if labels is None or labels[j] == labels[k]:
                out[j, :, k, :] = mixed(points[j], points[k])
    return out.reshape(m * d, m * d)


def test_dense_covariance_is_the_kernels_mixed_second_derivative():
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(4, 3, generator=gen, dtype=torch.float64) * 1.5
    labels = torch.tensor([0, 1, 0, 0])
    for lab in (None, labels):
        expected = _autograd_covariance(points, lab)
        got = derivative_kernel_covariance(points, lab, BANDWIDTHS)
        assert torch.allclose(got, expected, atol=1e-12)


@pytest.mark.parametrize(("m", "d"), [(5, 7), (6, 3), (1, 4), (3, 3)])
def test_structured_sampler_is_exact_for_the_dense_covariance(m: int, d: int):
    # The sampler is linear in its standard normals: feeding the unit vectors reads off its
    # factor T, and TᵀT must be the dense covariance (including the case m - 1 >= d).
    gen = torch.Generator().manual_seed(m * 10 + d)
    points = torch.randn(m, d, generator=gen, dtype=torch.float64) * 2.0
    r = min(d, m - 1)
    eye = torch.eye(m * r + d * m, dtype=torch.float64)
    span, perp = eye[:, : m * r], eye[:, m * r :].reshape(-1, d, m)
    factor = _block_noise(points, BANDWIDTHS, span, perp, jitter=1e-15).reshape(-1, m * d)
    dense = derivative_kernel_covariance(points, None, BANDWIDTHS)
    assert torch.allclose(factor.T @ factor, dense, atol=1e-10)


def test_monte_carlo_covariance_matches_dense_with_label_blocks():
    gen = torch.Generator().manual_seed(1)
    points = torch.randn(5, 4, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 0, 1])
    n = 40_000
    draws = sample_derivative_noise(points, labels, (1.0, 2.0), gen, num_samples=n)
    flat = draws.reshape(n, -1)
    empirical = flat.T @ flat / n
    dense = derivative_kernel_covariance(points, labels, (1.0, 2.0))
    # Standard error of a covariance entry is ≤ √(2/n)·max variance.
    tol = 5 * math.sqrt(2.0 / n) * float(dense.diagonal().max())
    assert (empirical - dense).abs().max() < tol
    # Different labels are independent, same labels are not.
    assert dense.reshape(5, 4, 5, 4)[0, :, 1, :].abs().max() == 0
    assert dense.reshape(5, 4, 5, 4)[0, :, 2, :].abs().max() > 1e-3


def test_duplicate_points_still_get_noise():
    # A collapsed generator gives identical points; the covariance is singular and the
    # jitter must keep the noise (never release the gradient without it).
    points = torch.zeros(4, 6, dtype=torch.float64)
    draws = sample_derivative_noise(points, None, BANDWIDTHS, torch.Generator().manual_seed(0))
    assert torch.isfinite(draws).all()
    assert draws.abs().sum() > 0


def test_sensitivity_constants():
    assert functional_sensitivity(5, "paper") == pytest.approx(math.sqrt(10))
    assert functional_sensitivity(3, "add_remove") == pytest.approx(math.sqrt(3))
    assert noise_scale(2.0, math.sqrt(10), 60) == pytest.approx(2 * math.sqrt(10) / 60)
    with pytest.raises(UsageError):
        functional_sensitivity(2, "replace")


@pytest.mark.parametrize("conditional", [False, True])
def test_mahalanobis_sensitivity_on_neighbouring_batches(conditional: bool):
    # Adding one record changes the released vector v by v(h) with h = φ*(x, y)/B;
    # v(h)ᵀ C⁻¹ v(h) ≤ ‖h‖² = n_L/B² (add/remove), the bound the accountant's σ relies on.
    gen = torch.Generator().manual_seed(2)
    d, m, batch, normalizer = 5, 4, 7, 6.0
    bound = functional_sensitivity(len(BANDWIDTHS), "add_remove") ** 2 / normalizer**2
    worst = 0.0
    for _ in range(200):
        points = torch.randn(m, d, generator=gen, dtype=torch.float64) * 1.5
        x = torch.randn(batch + 1, d, generator=gen, dtype=torch.float64) * 1.5
        y = torch.randint(0, 2, (batch + 1,), generator=gen)
        gen_labels = torch.tensor([0, 1, 0, 1]) if conditional else None
        if not conditional:
            y = None
        small = raw_embedding_gradient(
            x[:batch], None if y is None else y[:batch], points, gen_labels, BANDWIDTHS, normalizer
        )
        large = raw_embedding_gradient(x, y, points, gen_labels, BANDWIDTHS, normalizer)
        diff = (large - small).reshape(-1)
        cov = derivative_kernel_covariance(points, gen_labels, BANDWIDTHS)
        ratio = float(diff @ torch.linalg.solve(cov, diff)) / bound
        worst = max(worst, ratio)
        assert ratio <= 1.0 + 1e-9
    assert worst > 0.01  # the check is not vacuous


def test_privatize_adds_exactly_scaled_derivative_noise():
    gen = torch.Generator().manual_seed(3)
    points = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    gradient = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    state = gen.get_state()
    released = privatize_embedding_gradient(
        gradient,
        points,
        labels,
        BANDWIDTHS,
        noise_multiplier=1.7,
        sum_sensitivity=math.sqrt(6),
        normalizer=12.0,
        generator=gen,
    )
    gen.set_state(state)
    eta = sample_derivative_noise(points, labels, BANDWIDTHS, gen)[0]
    assert torch.allclose(released, gradient + 1.7 * math.sqrt(6) / 12.0 * eta)
    with pytest.raises(UsageError):
        privatize_embedding_gradient(
            gradient,
            points,
            labels,
            BANDWIDTHS,
            noise_multiplier=0.0,
            sum_sensitivity=1.0,
            normalizer=1.0,
            generator=gen,
        )


def test_a_batch_of_releases_draws_one_independent_path_each():
    gen = torch.Generator().manual_seed(4)
    points = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    batch = torch.randn(7, 5, 3, generator=gen, dtype=torch.float64)
    state = gen.get_state()
    released = privatize_embedding_gradient(
        batch, points, None, BANDWIDTHS, noise_multiplier=0.9, sum_sensitivity=2.0,
        normalizer=4.0, generator=gen,
    )  # fmt: skip
    gen.set_state(state)
    eta = sample_derivative_noise(points, None, BANDWIDTHS, gen, num_samples=7)
    assert torch.allclose(released, batch + 0.9 * 2.0 / 4.0 * eta)
    # Each release has its own draw: the noises differ across the batch.
    noise = released - batch
    assert (noise[0] - noise[1]).abs().min() > 0
    # Law: S releases of one block have the dense covariance per release, none across.
    n = 30_000
    draws = privatize_embedding_gradient(
        torch.zeros(n, 5, 3, dtype=torch.float64), points, None, (1.0, 2.0),
        noise_multiplier=1.0, sum_sensitivity=1.0, normalizer=1.0, generator=gen,
    ).reshape(n, -1)  # fmt: skip
    dense = derivative_kernel_covariance(points, None, (1.0, 2.0))
    tol = 5 * math.sqrt(2.0 / n) * float(dense.diagonal().max())
    assert (draws.T @ draws / n - dense).abs().max() < tol
    across = draws[0::2].T @ draws[1::2] / (n // 2)
    assert across.abs().max() < 2 * tol
    with pytest.raises(UsageError):
        privatize_embedding_gradient(
            batch, points, None, BANDWIDTHS, noise_multiplier=0.9, sum_sensitivity=2.0,
            normalizer=4.0, generator=gen, across_ranks=True,
        )  # fmt: skip
