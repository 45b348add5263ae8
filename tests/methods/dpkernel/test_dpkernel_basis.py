"""dpkernel's `kernel_frequencies`: the kernel on the lowest 2-D DCT frequencies of an image."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.fft
import torch

from dpsynth.data.sources import load_data
from dpsynth.errors import UsageError
from dpsynth.methods.dpkernel import trainer as trainer_module
from dpsynth.methods.dpkernel.basis import KernelView, low_frequency_basis
from dpsynth.methods.dpkernel.kernel import raw_embedding_gradient
from dpsynth.methods.registry import get_method
from dpsynth.privacy.accounting.plan import PrivacyTarget
from dpsynth.privacy.releases.frequency import dct_matrix
from tests.methods.dpkernel.test_dpkernel import _digits


def test_dct_matrix_is_scipys_orthonormal_dct() -> None:
    """Row u is the u-th DCT-II cosine: the same matrix as scipy's orthonormal DCT."""
    for size in (1, 8, 28):
        reference = scipy.fft.dct(np.eye(size), norm="ortho", axis=0)
        np.testing.assert_allclose(dct_matrix(size).numpy(), reference, atol=1e-12)


def test_basis_rows_are_orthonormal_and_ordered_from_the_constant_image() -> None:
    basis = low_frequency_basis((2, 6, 5), 7)
    assert basis.shape == (14, 60)
    torch.testing.assert_close(basis @ basis.T, torch.eye(14, dtype=torch.float64))
    # the first row of each channel is the constant image of that channel, zero elsewhere
    np.testing.assert_allclose(basis[0, :30].numpy(), np.full(30, 1 / np.sqrt(30)), atol=1e-12)
    assert float(basis[0, 30:].abs().max()) == 0.0
    full = low_frequency_basis((1, 6, 5), 30)
    torch.testing.assert_close(full.T @ full, torch.eye(30, dtype=torch.float64))
    with pytest.raises(ValueError):
        low_frequency_basis((1, 6, 5), 31)


def test_low_frequencies_keep_a_smooth_image_and_drop_most_white_noise() -> None:
    """The reason for the view: on 28×28, 196 frequencies keep > 99% of a blurred stroke's
    energy but about a quarter of white noise's (196/784)."""
    basis = low_frequency_basis((1, 28, 28), 196)
    grid = torch.arange(28, dtype=torch.float64)
    stroke = torch.exp(-((grid[:, None] - 14.0) ** 2 + (grid[None, :] - 10.0) ** 2) / 18.0)
    kept = float((basis @ stroke.flatten()).pow(2).sum() / stroke.pow(2).sum())
    assert kept > 0.99
    noise = torch.randn(200, 784, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    noise_kept = float((noise @ basis.T).pow(2).sum() / noise.pow(2).sum())
    assert 0.22 < noise_kept < 0.28


def test_the_embedding_gradient_in_the_view_is_the_projected_pixel_gradient() -> None:
    """With every frequency kept (an orthonormal rotation P) the kernel is the pixels' kernel,
    and ∇_u f_S at u = Pw is P·∇_w f_S: the view changes coordinates, not the function."""
    gen = torch.Generator().manual_seed(3)
    records = torch.rand(40, 1, 6, 5, generator=gen) * 2 - 1
    labels = torch.randint(0, 3, (40,), generator=gen)
    points = torch.rand(9, 30, generator=gen, dtype=torch.float64) * 2 - 1
    point_labels = torch.arange(9) % 3
    view = KernelView(low_frequency_basis((1, 6, 5), 30))
    pixel = raw_embedding_gradient(records, labels, points, point_labels, (2.0, 4.0), 40.0)
    seen = raw_embedding_gradient(
        records, labels, view(points), point_labels, (2.0, 4.0), 40.0, view
    )
    torch.testing.assert_close(seen, view(pixel))


def _digits_trainer(frequencies: int, **overrides):
    """dpkernel's `tiny` trainer on digits at ε = 5 with these settings: (method, config,
    plan, trainer)."""
    method = get_method("dpkernel")
    info = load_data("digits").info()
    config = method.config("tiny", {"kernel_frequencies": frequencies, **overrides}, info)
    method.validate_config(config, info)
    plan = method.plan(info, PrivacyTarget(5.0, 1e-5), config)
    return method, config, plan, method.trainer(info, config, plan, torch.device("cpu"), seed=0)


def test_a_step_releases_the_gradient_in_the_view_with_the_kernels_sensitivity(
    monkeypatch,
) -> None:
    """The privatiser gets K-dimensional points and gradients (the noise is drawn in the K
    kept frequencies), with the same RKHS sensitivity and σ as the pixel kernel."""
    seen: dict = {}
    real = trainer_module.privatize_embedding_gradient

    def spy(gradient, points, labels, bandwidths, **kwargs):
        seen.update(gradient=gradient.shape, points=points.shape, kwargs=kwargs)
        return real(gradient, points, labels, bandwidths, **kwargs)

    monkeypatch.setattr(trainer_module, "privatize_embedding_gradient", spy)
    _, config, plan, trainer = _digits_trainer(10)
    _, _, pixel_plan, _ = _digits_trainer(0)
    x, y = _digits(64)
    trainer.step(x, y)
    generated = int(config["generated_points"])
    assert seen["gradient"] == (generated, 10) and seen["points"] == (generated, 10)
    assert seen["kwargs"]["sum_sensitivity"] == pixel_plan.max_grad_norm == plan.max_grad_norm
    assert seen["kwargs"]["noise_multiplier"] == plan.noise_multiplier


def test_kernel_frequencies_is_checked_against_the_image() -> None:
    method = get_method("dpkernel")
    info = load_data("digits").info()
    method.validate_config(method.config("tiny", {"kernel_frequencies": 64}, info), info)
    with pytest.raises(UsageError, match="kernel_frequencies"):
        method.validate_config(method.config("tiny", {"kernel_frequencies": 65}, info), info)
    with pytest.raises(UsageError, match="kernel_frequencies"):
        method.validate_config(method.config("tiny", {"kernel_frequencies": -1}, info), info)
