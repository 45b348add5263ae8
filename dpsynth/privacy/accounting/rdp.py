"""Rényi DP of the Gaussian and Poisson-subsampled Gaussian at integer orders, and its (ε, δ).

The same closed forms as the `prv-accountant` package's `RDP` accountant (which follows TF
Privacy): for the subsampled Gaussian at integer order α,
A_α = Σ_i C(α, i) q^i (1 − q)^{α−i} e^{(i² − i)/(2σ²)} and RDP = log A_α / (α − 1) (Mironov
et al. 2019); for the Gaussian α/(2σ²); for a pure ε-DP mechanism (the exponential mechanism's
selections) the Rényi divergence of its dominating pair, randomized response
P = (p, 1 − p), Q = (1 − p, p) with p = e^ε/(1 + e^ε):
log(p^α (1 − p)^{1−α} + (1 − p)^α p^{1−α}) / (α − 1), which bounds the RDP of every ε-DP
mechanism (data processing: any ε-DP pair is a post-processing of this one); the package's
`PureDPMechanism.rdp` is not that bound (it is below it), so it is never used. The
conversion to ε at δ is the package's:
ε = min_α RDP(α) − log(δ α)/(α − 1) + log(1 − 1/α) (Balle et al. 2020).

Kept here, without the package, so that the accountant's hot path does not import it: the
package's import pulls in scipy.signal and scipy.stats, over a second of start-up for every
`dpsynth` command. `privacy.accounting` uses these values to size the PRV domain and scale its
ε error; an RDP bound it reports is recomputed by the package (and labelled so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

# Integer orders only: the RDP of the subsampled Gaussian has a closed-form sum there, while
# fractional orders need a slow series. Any set of orders gives a valid (if looser) bound.
INTEGER_ORDERS = tuple(float(a) for a in [*range(2, 65), 80, 96, 128, 192, 256, 512])


def _log_add(log_x: float, log_y: float) -> float:
    low, high = min(log_x, log_y), max(log_x, log_y)
    if low == -math.inf:
        return high
    return math.log1p(math.exp(low - high)) + high


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _psg_rdp(q: float, sigma: float, order: int) -> float:
    """RDP of order `order` (an integer ≥ 2) of the Poisson-subsampled Gaussian."""
    log_a = -math.inf
    for i in range(order + 1):
        log_coef = _log_comb(order, i) + i * math.log(q) + (order - i) * math.log(1 - q)
        log_a = _log_add(log_a, log_coef + (i * i - i) / (2 * sigma**2))
    return log_a / (order - 1)


def pure_dp_rdp(epsilon: float, order: int) -> float:
    """RDP of order `order` of randomized response with log-likelihood ratio ±ε (the tight
    bound for any ε-DP mechanism); computed in log space, at most ε."""
    log_norm = np.logaddexp(0.0, epsilon)  # log(1 + e^ε)
    log_sum = np.logaddexp(order * epsilon, (1 - order) * epsilon) - log_norm
    return min(float(log_sum) / (order - 1), float(epsilon))


@lru_cache(maxsize=512)
def rdp_curve(key: tuple, orders: tuple[float, ...]) -> np.ndarray:
    """RDP of one mechanism per order: `("gaussian", σ, 1.0)`, `("poisson_gaussian", σ, q)` or
    `("pure_dp", ε, 1.0)`."""
    kind, sigma, q = key
    if any(a != int(a) or a < 2 for a in orders):
        raise ValueError("only integer orders ≥ 2 have the closed form")
    if kind == "pure_dp":
        return np.array([pure_dp_rdp(sigma, int(a)) for a in orders])
    if kind == "gaussian" or q >= 1.0:
        return np.array([a / (2.0 * sigma**2) for a in orders])
    return np.array([_psg_rdp(q, sigma, int(a)) for a in orders])


def rdp_epsilon(
    keys: Sequence[tuple], counts: Sequence[int], delta: float, orders: tuple[float, ...]
) -> float:
    """ε at `delta` of `counts[i]` compositions of `keys[i]`, from their RDP at `orders`."""
    total = sum(rdp_curve(k, orders) * n for k, n in zip(keys, counts, strict=True))
    alphas = np.asarray(orders)
    eps = total - np.log(delta * alphas) / (alphas - 1) + np.log1p(-1 / alphas)
    return max(float(eps[np.nanargmin(eps)]), 0.0)
