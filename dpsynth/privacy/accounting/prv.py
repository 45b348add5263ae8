"""The PRV accountant's ε upper bound (Gopi et al. 2021), computed in float64.

The same algorithm as the `prv-accountant` package's `PRVAccountant`, step by step: the same
aligned mesh (`Domain.create_aligned`), truncation of each privacy random variable (PRV) to the
mesh, the cell-centred discretisation shifted so that its mean equals the truncated PRV's
mean (computed here by a finer quadrature than the package's), self-composition by FFT,
pairwise convolution of the self-composed PRVs, and the bound
ε_upper = ε̂(δ − δ_error) + ε_error of the paper's Theorem 5.5. Only the number format
differs: the package evaluates the mesh, the CDF differences, the FFT and the final sums in
long double, which on x86 makes each call 5–10x slower than float64 (pocketfft and numpy's
exp have no fast long-double path). The CDFs themselves are float64 in the package too (its
erfc is called on doubles), so the discretised probabilities carry float64 accuracy either way.

What float64 adds is rounding in the CDF differences, the FFT, the power and the tail sums.
That is charged explicitly: the δ at which ε̂ is read is lowered by a first-order bound on
that rounding (`rounding_allowance`, some 1e-10 on a mesh of 10^6 nodes, where the observed
difference from the long-double package is some 1e-11) on top of the paper's δ_error, and a δ
too small for that raises `NeedsLongDouble`, so that the caller falls back to the package;
so does a domain wider than float64's exp can take (ε in the hundreds).

The mechanisms dpsynth accounts are supported: the Gaussian mechanism and the
Poisson-subsampled Gaussian (add/remove adjacency, sensitivity 1), and pure ε-DP mechanisms
(the exponential mechanism's selections) through their dominating pair, randomized response,
whose PRV is ±ε with probabilities e^ε/(1 + e^ε) and 1/(1 + e^ε) (the package's
`PureDPMechanism`). Its two atoms fall in the mesh cells that contain them and the mean shift
moves them back by less than half a cell, which the paper's error bound (a coupling that
holds for any distribution) covers as for the continuous PRVs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.fft import irfft, next_fast_len, rfft
from scipy.special import erfc, ndtr

_MACHINE_EPS = float(np.finfo(np.float64).eps)
# Simpson panels per Gaussian component for the truncated mean (an even number).
_SIMPSON_PANELS = 1 << 16


class NeedsLongDouble(ValueError):
    """float64 cannot answer (δ too small for its rounding, or e^t out of its range)."""


# Beyond |t| ≈ 709 e^t overflows float64; the tail sums need headroom above that.
_MAX_LENGTH = 600.0


@dataclass(frozen=True)
class Mesh:
    """The package's aligned `Domain`: `size` nodes `t_min + i·dt` (size even)."""

    t_min: float
    size: int
    dt: float

    @property
    def t_max(self) -> float:
        """The last node."""
        return self.t_min + (self.size - 1) * self.dt


def aligned_mesh(t_min: float, t_max: float, dt: float) -> Mesh:
    """`prv_accountant.domain.Domain.create_aligned`: nodes on multiples of `dt`, even count."""
    t_min = math.floor(t_min / dt) * dt
    t_max = math.ceil(t_max / dt) * dt
    size = round((t_max - t_min) / dt) + 1
    if size % 2 == 1:
        size += 1
        t_max += dt
    return Mesh(t_min, size, (t_max - t_min) / (size - 1))


def aligned_size(t_min: float, t_max: float, dt: float) -> int:
    """The number of nodes of `aligned_mesh(t_min, t_max, dt)`."""
    return aligned_mesh(t_min, t_max, dt).size


def _gaussian_threshold(t: np.ndarray, q: float) -> np.ndarray:
    """z = log((q − 1)/q + e^t/q) for t > log(1 − q): the Gaussian value whose PRV value is t.

    log1p(expm1(t)/q) has no cancellation near 0; above t = 1 the same value is written as
    t − log q + log1p(−(1 − q) e^{−t}), which does not overflow for large t.
    """
    t = np.asarray(t, dtype=np.float64)
    small = t <= 1.0
    out = np.empty_like(t)
    out[small] = np.log1p(np.expm1(t[small]) / q)
    large = t[~small]
    out[~small] = large - math.log(q) + np.log1p(-(1.0 - q) * np.exp(-large))
    return out


def _psg_cdf(t: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """CDF of the Poisson-subsampled Gaussian's PRV (the package's formula, in float64)."""
    t = np.asarray(t, dtype=np.float64)
    out = np.zeros_like(t)
    if q >= 1.0:
        return _gaussian_cdf(t, sigma)
    valid = t > math.log1p(-q)
    tv = t[valid]
    z = _gaussian_threshold(tv, q)
    a = math.sqrt(2.0) / 4.0 / sigma
    s2 = 2.0 * sigma * sigma
    out[valid] = (
        0.5 * q * -erfc(a * (s2 * z - 1.0)) - 0.5 * (q - 1.0) * -erfc(a * (s2 * z + 1.0)) + 1.0
    )
    return out


def _gaussian_cdf(t: np.ndarray, sigma: float) -> np.ndarray:
    """CDF of the Gaussian mechanism's PRV: N(μ²/2, μ²) with μ = 1/σ."""
    mu = 1.0 / sigma
    return ndtr(np.asarray(t, dtype=np.float64) / mu - mu / 2.0)


def _pure_dp_cdf(t: np.ndarray, epsilon: float) -> np.ndarray:
    """CDF of randomized response's PRV: atoms at −ε and +ε (right-continuous)."""
    t = np.asarray(t, dtype=np.float64)
    low = 1.0 / (1.0 + math.exp(epsilon)) if epsilon < 700 else 0.0
    return np.where(t < -epsilon, 0.0, np.where(t < epsilon, low, 1.0))


def _cdf(key: tuple, t: np.ndarray) -> np.ndarray:
    kind, sigma, q = key
    if kind == "pure_dp":
        return _pure_dp_cdf(t, sigma)
    if kind == "gaussian":
        return _gaussian_cdf(t, sigma)
    return _psg_cdf(t, q, sigma)


def _truncated_mean(key: tuple, t_min: float, t_max: float, mass: float) -> float:
    """Mean of the PRV truncated to [t_min, t_max], by Simpson's rule in the Gaussian variable.

    Both PRVs are monotone images of Gaussians: the Gaussian mechanism's is V ~ N(μ²/2, μ²)
    itself (μ = 1/σ), the subsampled Gaussian's is Y = log(1 − q + q e^V) with V the mixture
    q N(1/(2σ²), 1/σ²) + (1 − q) N(−1/(2σ²), 1/σ²) (its CDF is the package's formula). So
    E[Y; t_min < Y ≤ t_max] is a smooth integral against Gaussian densities; Simpson's rule
    on 2^16 panels over ±40 standard deviations of each component leaves an error some 1e-12
    relative, far below what matters after T compositions (the package integrates the CDF
    with quad to 1.5e-8, which is slower and needs scipy.integrate's second of imports).
    """
    kind, sigma, q = key
    if kind == "pure_dp":
        # Two atoms, both inside the domain (the caller makes it wider than ε): exact.
        if not t_min < -sigma and sigma < t_max:
            raise RuntimeError("the pure-DP atoms fall outside the PRV domain")
        return sigma * math.tanh(sigma / 2.0) / mass
    scale = 1.0 / sigma
    if kind == "gaussian" or q >= 1.0:
        components = [(1.0, scale * scale / 2.0)]
        v_low, v_high = t_min, t_max

        def image(v: np.ndarray) -> np.ndarray:
            return v
    else:
        half = 1.0 / (2.0 * sigma * sigma)
        components = [(q, half), (1.0 - q, -half)]
        inside = t_min > math.log1p(-q)
        v_low = float(_gaussian_threshold(np.array([t_min]), q)[0]) if inside else -math.inf
        v_high = float(_gaussian_threshold(np.array([t_max]), q)[0])

        def image(v: np.ndarray) -> np.ndarray:
            return np.log1p(q * np.expm1(v))

    total = 0.0
    for weight, centre in components:
        low = max(v_low, centre - 40.0 * scale)
        high = min(v_high, centre + 40.0 * scale)
        if not high > low:
            continue
        v = np.linspace(low, high, _SIMPSON_PANELS + 1)
        density = np.exp(-0.5 * ((v - centre) / scale) ** 2) / (scale * math.sqrt(2.0 * math.pi))
        values = image(v) * density
        step = (high - low) / _SIMPSON_PANELS
        total += (
            weight
            * step
            / 3.0
            * (values[0] + values[-1] + 4.0 * values[1:-1:2].sum() + 2.0 * values[2:-1:2].sum())
        )
    return total / mass


def _discretise(key: tuple, domain: Mesh) -> tuple[np.ndarray, float]:
    """Cell-centred probabilities of the truncated PRV on `domain`, and the mean shift."""
    size, dt, t_min, t_max = domain.size, domain.dt, domain.t_min, domain.t_max
    # Cell edges t_i ± dt/2, clipped to the truncation interval as the package does.
    edges = t_min + (np.arange(size + 1, dtype=np.float64) - 0.5) * dt
    edges = np.clip(edges, t_min, t_max)
    cdf = _cdf(key, edges)
    mass = float(cdf[-1] - cdf[0])
    pmf = np.diff(cdf) / mass
    centres = t_min + np.arange(size, dtype=np.float64) * dt
    shift = _truncated_mean(key, t_min, t_max, mass) - float(np.dot(centres, pmf))
    if not abs(shift) < dt / 2.0:
        raise RuntimeError("Discrete mean differs from continuous mean significantly.")
    return pmf, shift


def _self_compose(pmf: np.ndarray, count: int) -> np.ndarray:
    """`count`-fold circular self-convolution, rolled as the package's Fourier composer."""
    f_n = irfft(rfft(pmf) ** count, n=len(pmf))
    roll = count - 1
    if count % 2 == 0:
        roll += len(f_n) // 2
    return np.roll(f_n, roll)


def _convolve_same(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """`scipy.signal.convolve(left, right, mode="same")` by FFT (the package's pairwise step)."""
    full = len(left) + len(right) - 1
    size = next_fast_len(full, real=True)
    out = irfft(rfft(left, size) * rfft(right, size), size)[:full]
    start = (full - len(left)) // 2
    return out[start : start + len(left)]


@dataclass(frozen=True)
class ComposedPrv:
    """The composed PRV's tail sums on its mesh: δ̂(t_i) = d1[i] − e^{t_i}·d2[i].

    `rounding` is the float64 rounding bound before the tail sums' share (`rounding_allowance`);
    `eps_error` and `delta_error` are the paper's discretisation errors (Theorem 5.5).
    """

    t: np.ndarray
    d1: np.ndarray
    d2: np.ndarray
    rounding: float
    eps_error: float
    delta_error: float

    @property
    def estimate_deltas(self) -> np.ndarray:
        """δ̂ at every node t_i (the discretised PRV's privacy profile)."""
        return self.d1 - np.exp(self.t) * self.d2

    def rounding_at(self, index: np.ndarray | int) -> np.ndarray | float:
        """The whole float64 rounding bound where the tail sums are read at `index`."""
        return self.rounding + 4.0 * self.t.size * _MACHINE_EPS * np.maximum(self.d1[index], 0.0)

    def epsilon_at(self, delta_target: float) -> float:
        """ε̂ at which the discretised PRV's δ̂ equals `delta_target`."""
        ndelta = -self.estimate_deltas
        i = int(np.searchsorted(ndelta, -delta_target, side="left"))
        if i <= 0 or i >= self.t.size:
            raise RuntimeError("Cannot compute epsilon")
        return float(np.log((self.d1[i] - delta_target) / self.d2[i]))


def compose_prv(
    keys: Sequence[tuple],
    counts: Sequence[int],
    eps_error: float,
    delta_error: float,
    length: float,
) -> ComposedPrv:
    """The PRV of `counts[i]` compositions of `keys[i]`, discretised on the aligned mesh of
    half-width `length` (the package's `eps_max`, which the caller sizes safely).

    `keys` are `("gaussian", σ, 1.0)`, `("poisson_gaussian", σ, q)` or `("pure_dp", ε, 1.0)`.
    """
    if length > _MAX_LENGTH:
        raise NeedsLongDouble(f"a PRV domain of ±{length:.4g} overflows float64's exp")
    total = sum(counts)
    mesh = eps_error / math.sqrt(total / 2.0 * math.log(12.0 / delta_error))
    domain = aligned_mesh(-length, length, mesh)
    size = domain.size
    parts: list[np.ndarray] = []
    shift_total = 0.0
    for key, count in zip(keys, counts, strict=True):
        pmf, shift = _discretise(key, domain)
        parts.append(_self_compose(pmf, count))
        # The discretised PRV sits `shift` right of the mesh, and its self-composition moves by
        # (count − 1) times that again (the package's `shift_right(shifts · (n − 1))`).
        shift_total += shift * count
    # Pairwise convolution in the package's tree order; each step keeps the left operand's
    # domain moved by the right one's shifts, so the shifts simply add up.
    while len(parts) > 1:
        paired = [parts.pop(0)] if len(parts) % 2 == 1 else []
        paired += [_convolve_same(a, b) for a, b in zip(parts[:-1:2], parts[1::2], strict=True)]
        parts = paired
    composed = parts[0]
    # The package's pairwise convolution keeps the left domain shifted by the right's shifts:
    # the node coordinates are the mesh plus every shift applied along the way.
    t = domain.t_min + np.arange(size, dtype=np.float64) * domain.dt + shift_total
    # Tail sums from the right: δ(ε) = Σ_{t>ε} p(t) − e^ε Σ_{t>ε} p(t) e^{−t}.
    d1 = np.cumsum(composed[::-1])[::-1]
    d2 = np.cumsum((composed * np.exp(-t))[::-1])[::-1]
    if not (np.isfinite(np.exp(t) * d2 - d1).all() and np.isfinite(d2).all()):
        raise NeedsLongDouble("the tail sums left float64's range")
    rounding = rounding_allowance(size, total, float(np.max(np.abs(composed))))
    return ComposedPrv(t, d1, d2, rounding, eps_error, delta_error)


def prv_epsilon(
    keys: Sequence[tuple],
    counts: Sequence[int],
    delta: float,
    eps_error: float,
    delta_error: float,
    length: float,
) -> tuple[float, float]:
    """(estimate, upper bound) of ε at `delta` for `counts[i]` compositions of `keys[i]`
    (`compose_prv`'s arguments)."""
    prv_ = compose_prv(keys, counts, eps_error, delta_error, length)
    size = prv_.t.size
    # The δ at which the upper bound is read is lowered by the float64 rounding (see
    # `rounding_allowance`); the sums' share of it scales with the tail sum where ε is read.
    ndelta = -prv_.estimate_deltas
    read = min(int(np.searchsorted(ndelta, -(delta - delta_error - prv_.rounding))), size - 1)
    rounding = float(prv_.rounding_at(read))
    if rounding > 0.01 * delta or delta - delta_error - rounding <= 0:
        raise NeedsLongDouble(
            f"float64 rounding ({rounding:.2g}) is too large for δ={delta:g}; "
            "use the long-double accountant"
        )
    estimate = prv_.epsilon_at(delta)
    upper = prv_.epsilon_at(delta - delta_error - rounding) + eps_error
    return estimate, upper


def rounding_allowance(size: int, compositions: int, peak: float) -> float:
    """A first-order bound on the float64 error of δ(ε) before the tail sums' share.

    - CDF values: each carries an absolute error of a few machine ε and the cell
      probabilities are their differences, so every tail sum of one discretised PRV is off by
      at most 2u; that Kolmogorov distance adds up over the compositions and bounds the change
      of δ(ε) = E[(1 − e^{ε−Y})₊] (a monotone function with values in [0, 1]): 4u·T.
    - FFT and power: F^T through exp(T·log F) has relative error ≤ (πT + 700)u on every
      coefficient that is not below e^{-700}, and the transforms add O(log n)u; by Parseval the
      ℓ2 error of the composed PMF is that times its ℓ2 norm ≤ √peak, and its ℓ1 error √n times
      more.
    The cumulative tail sums add a relative n·u, charged by the caller where ε is read.
    """
    u = _MACHINE_EPS
    cdf = 4.0 * u * compositions
    fft = math.sqrt(size) * ((math.pi + 1.0) * compositions + 40.0 * math.log2(size) + 1000.0)
    return cdf + fft * u * math.sqrt(max(peak, 0.0))
