"""Shared empirical checks of released noise (used by the DP-SGD and ghost-clipping tests)."""

from __future__ import annotations

import math

import torch


def assert_gaussian_noise(noise: torch.Tensor, std: float) -> None:
    """`noise` (flat, d draws) looks like N(0, std²): its std within 5 standard errors
    (std/√(2d)), its mean within 5 of std/√d, and Gaussian rather than, say, uniform with the
    same std: excess kurtosis ≈ 0 within 5 of its standard error √(24/d)."""
    d = noise.numel()
    assert abs(float(noise.std()) - std) < 5 * std / math.sqrt(2 * d)
    assert abs(float(noise.mean())) < 5 * std / math.sqrt(d)
    kurt = float(((noise - noise.mean()) ** 4).mean() / noise.var() ** 2) - 3.0
    assert abs(kurt) < 5 * math.sqrt(24 / d)
