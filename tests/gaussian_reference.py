"""An exact (ε, δ)-DP Gaussian mechanism for the audit's tests: its strength μ, and canary
scores drawn from it (the reference a tight audit must approach)."""

from __future__ import annotations

import math

import torch
from scipy.optimize import brentq
from scipy.stats import norm


def gaussian_mu(epsilon: float, delta: float) -> float:
    """μ of the Gaussian mechanism that is exactly (ε, δ)-DP (Balle and Wang 2018)."""

    def gap(mu: float) -> float:
        return (
            norm.cdf(-epsilon / mu + mu / 2)
            - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
            - delta
        )

    return brentq(gap, 1e-3, 20.0)


def gaussian_scores(mu: float, m: int, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """An exact Gaussian mechanism of strength μ per canary: N(μ·b, 1), b ~ Bernoulli(1/2)."""
    generator = torch.Generator().manual_seed(seed)
    included = torch.rand(m, generator=generator) < 0.5
    values = torch.randn(m, generator=generator, dtype=torch.float64) + mu * included
    return {"z": values}, included
