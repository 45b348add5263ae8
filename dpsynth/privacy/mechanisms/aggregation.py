"""DPAF's private aggregation (DPAGG), its private gradient sum, and its window accounting.

DPAF (spec `dpaf.md` §10.3) reads private records in windows of μ discriminator steps. Each
step s draws a Poisson batch S_s (rate q) and releases the noisy sum of the records' feature
vectors, every vector renormalised to L2 norm ≤ Δ (`noisy_feature_sum`): add/remove one
record moves the sum by at most Δ, and the noise std is σ_agg·Δ. At the end of the window the
middle layers take one DP-SGD step on the union of the μ batches (`private_gradient_sum`:
per-record top-k compression, clipping to C, one Gaussian draw of std σ_conv2·C). A record's
gradient there depends only on the record and on released values, so its sensitivity is C.

Accounting. Conditional on a record taking part in k ≥ 1 of the window's steps, the window is
an adaptive composition of Gaussian mechanisms: μ-GDP with shift s_k = √(k/σ_agg² + 1/σ_conv2²)
≤ √(μ/σ_agg² + 1/σ_conv2²) = 1/σ_w. The record takes part at all with probability
q_w = 1 − (1 − q)^μ. The exact event is a mixture of Gaussians (weights Binomial(μ, q)), which
prv-accountant cannot express; a Poisson(q_w)-subsampled Gaussian with multiplier σ_w dominates
it (the mixture is a post-processing of it: given participation, draw k and shrink the shift
from 1/σ_w to s_k with independent Gaussian noise), so each window is accounted as that
event: the conservative fallback of spec §10.3.6.

Only this module (with `dpsgd`) adds DPAF's noise; the caller passes the secret generators.

Data-parallel (`across_ranks=True`, see `dpsynth.privacy.mechanisms.distributed`): the caller passes
its rank's share of the records; the sums are all-reduced with one noise draw in all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from dpsynth.errors import UsageError
from dpsynth.privacy.mechanisms.dpsgd import add_noise, clip_per_sample, noisy_global_sum

__all__ = [
    "WINDOW_ACCOUNTING_NOTE",
    "compress_per_sample",
    "noisy_feature_sum",
    "noisy_group_sums",
    "private_gradient_sum",
    "renorm_rows",
    "split_window_noise",
    "window_noise_multiplier",
    "window_patterns",
    "window_sampling_rate",
]

WINDOW_ACCOUNTING_NOTE = (
    "conservative fallback for the mixture-of-Gaussians window event (prv-accountant cannot "
    "account mixtures): one Poisson-subsampled Gaussian per window with "
    "sigma_w = (mu/sigma_agg^2 + 1/sigma_conv2^2)^(-1/2), q_w = 1 - (1 - q)^mu"
)


def renorm_rows(features: Tensor, bound: float) -> Tensor:
    """Scale each row of `features` [b, d] to L2 norm ≤ `bound` (rows already inside unchanged).

    SIN makes every row's norm ≤ √(m·p²) in exact arithmetic; this enforces the sensitivity
    whatever the floating-point or the network does.
    """
    norms = features.norm(dim=1, keepdim=True)
    return features * (bound / norms.clamp_min(1e-12)).clamp(max=1.0)


def noisy_feature_sum(
    features: Tensor,
    bound: float,
    noise_multiplier: float,
    generator: torch.Generator,
    *,
    across_ranks: bool = False,
) -> Tensor:
    """DPAGG: Σ of the rows of `features` [b, d] (each renormed to ≤ `bound`) + N(0, (σΔ)² I).

    b may be 0 (the sum is then 0 and only noise is released). One Gaussian draw from
    `generator` per call; the result has `features`' dtype and device. `across_ranks`: the
    rows are this rank's share and the sum runs over every rank's (one draw in all).
    """
    if not (math.isfinite(bound) and bound > 0):
        raise UsageError(f"the aggregation bound must be finite and > 0, got {bound}")
    total = {"sum": renorm_rows(features, bound).sum(0)}
    std = noise_multiplier * bound
    if across_ranks:
        return noisy_global_sum(total, std, generator)["sum"]
    return add_noise(total, std, generator)["sum"]


def noisy_group_sums(
    rows: Tensor,
    groups: Tensor,
    num_groups: int,
    bound: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> Tensor:
    """Per-group sums [num_groups, d] of `rows` [b, d] (each renormed to ≤ `bound`) + noise.

    Row i goes to group `groups[i]` only, so adding or removing one record moves one group's
    sum by at most `bound` (L2): the whole [num_groups, d] release is one Gaussian mechanism of
    sensitivity `bound`, and every entry gets N(0, (σ·bound)²) from one draw of `generator`.
    """
    if not (math.isfinite(bound) and bound > 0):
        raise UsageError(f"the aggregation bound must be finite and > 0, got {bound}")
    sums = rows.new_zeros(num_groups, rows.shape[1])
    sums.index_add_(0, groups.to(device=rows.device, dtype=torch.int64), renorm_rows(rows, bound))
    return add_noise({"sums": sums}, noise_multiplier * bound, generator)["sums"]


def compress_per_sample(grads: Mapping[str, Tensor], keep_fraction: float) -> dict[str, Tensor]:
    """Keep each record's largest-magnitude `keep_fraction` of entries (over all parameters).

    The paper's gradient compression: a per-record function, so it changes no sensitivity.
    Ties at the threshold are kept, so slightly more than the fraction may survive.
    """
    if not 0.0 < keep_fraction <= 1.0:
        raise UsageError(f"keep fraction must be in (0, 1], got {keep_fraction}")
    tensors = list(grads.values())
    if keep_fraction >= 1.0 or not tensors or tensors[0].shape[0] == 0:
        return dict(grads)
    flat = torch.cat([g.flatten(1) for g in tensors], dim=1).abs()
    drop = math.floor((1.0 - keep_fraction) * flat.shape[1] + 1e-9)  # 0.1·100 is 9.99…
    if drop < 1:
        return dict(grads)
    threshold = torch.kthvalue(flat, drop, dim=1).values  # the largest dropped magnitude
    out = {}
    for name, g in grads.items():
        limit = threshold.view(-1, *([1] * (g.dim() - 1)))
        out[name] = torch.where(g.abs() > limit, g, torch.zeros_like(g))
    return out


def private_gradient_sum(
    grads: Mapping[str, Tensor],
    *,
    keep_fraction: float,
    max_norm: float,
    noise_multiplier: float,
    generator: torch.Generator,
    across_ranks: bool = False,
) -> dict[str, Tensor]:
    """Σ_x clip(top-k(g_x)) + N(0, (σC)² I) over per-record gradients {name: [b, *shape]}.

    b may be 0 (noise only). `max_norm` = inf with `noise_multiplier` = 0 is the non-private
    baseline (compression still applies, no clipping, no noise). `across_ranks`: the records
    are this rank's share and the sum runs over every rank's (one noise draw in all).
    """
    compressed = compress_per_sample(grads, keep_fraction)
    if math.isfinite(max_norm):
        compressed, _ = clip_per_sample(compressed, max_norm)
    summed = {name: g.sum(0) for name, g in compressed.items()}
    std = noise_multiplier * max_norm if noise_multiplier > 0 else 0.0
    if across_ranks:
        return noisy_global_sum(summed, std, generator)
    return add_noise(summed, std, generator)


def window_sampling_rate(sampling_rate: float, window: int) -> float:
    """q_w = 1 − (1 − q)^μ: the probability that a record joins any of μ Poisson(q) batches."""
    if window < 1:
        raise UsageError(f"the window must be at least 1 step, got {window}")
    return float(-math.expm1(window * math.log1p(-sampling_rate))) if sampling_rate < 1 else 1.0


def window_noise_multiplier(agg_sigma: float, conv2_sigma: float, window: int) -> float:
    """σ_w = (μ/σ_agg² + 1/σ_conv2²)^(−1/2): the worst-case window as one Gaussian."""
    return float((window / agg_sigma**2 + 1.0 / conv2_sigma**2) ** -0.5)


def split_window_noise(window_sigma: float, window: int, ratio: float) -> tuple[float, float]:
    """(σ_agg, σ_conv2) with σ_agg/σ_conv2 = `ratio` whose window multiplier is `window_sigma`.

    1/σ_w² = μ/σ_agg² + ratio²/σ_agg², so σ_agg = σ_w·√(μ + ratio²) and σ_conv2 = σ_agg/ratio.
    `ratio` = 0 means no conv2* step at all (σ_conv2 = inf): the window is μ DPAGG steps only,
    σ_agg = σ_w·√μ.
    """
    if not (math.isfinite(ratio) and ratio >= 0):
        raise UsageError(f"the noise ratio must be finite and ≥ 0, got {ratio}")
    agg = window_sigma * math.sqrt(window + ratio**2)
    return agg, (agg / ratio if ratio > 0 else math.inf)


def window_patterns(
    count: int, window: int, sampling_rate: float, generator: torch.Generator
) -> Tensor:
    """Which of the μ steps each of `count` records joins, given that it joins at least one.

    The training loop draws the window's union as one Poisson(q_w) batch; drawing each
    member's pattern from Binomial(μ, q) conditioned on ≥ 1 (a count k, then a uniform
    k-subset) makes the μ batches exactly μ independent Poisson(q) batches. Returns bool
    [count, μ] on the generator's device.
    """
    device = generator.device
    if count == 0:
        return torch.zeros(0, window, dtype=torch.bool, device=device)
    k = torch.arange(1, window + 1, dtype=torch.float64)
    log_binom = (
        torch.lgamma(torch.tensor(window + 1.0))
        - torch.lgamma(k + 1)
        - torch.lgamma(window - k + 1)
    )
    q = torch.tensor(float(sampling_rate), dtype=torch.float64)
    log_p = log_binom + k * torch.log(q) + (window - k) * torch.log1p(-q)
    probs = torch.softmax(log_p, 0).to(device)
    counts = torch.multinomial(probs, count, replacement=True, generator=generator) + 1
    ranks = torch.rand(count, window, generator=generator, device=device).argsort(1).argsort(1)
    return ranks < counts[:, None]
