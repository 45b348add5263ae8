"""DP "central images": noised per-class means of the training images, for a warm start.

DP-FETA (Li et al. 2025) pretrains a generator on a few DP class-mean images before DP-SGD;
this module is that release, usable by any backend through the training loop.

Mechanism (add/remove adjacency). Every record x (flattened, d values) is clipped to L2 norm C:
x̄ = x · min(1, C/‖x‖). For the K public classes the release is the vector

    v = [ S_1/C, …, S_K/C,  w·n_1, …, w·n_K ],   S_k = Σ_{y_i = k} x̄_i,  n_k = #{y_i = k}

plus N(0, s²) noise on every coordinate. Adding or removing one record moves one S_k/C by a
vector of norm ≤ 1 and one w·n_k by w, so the L2 sensitivity is Δ = √(1 + w²) and
s = σ·Δ makes the release one Gaussian mechanism of noise multiplier σ (the ledger's
`gaussian` event, count 1). The class counts are released in the same event (weight w trades
noise on the sums against noise on the counts). The means S_k / n_k (the noisy n_k floored at
1, the pixels clamped to [-1, 1]) are post-processing.

Budget. `plan_dpsgd_with_central_images` gives the release a public share of the run's ε:
σ_c is the Gaussian's σ at share·ε alone, and the DP-SGD σ is then calibrated with the
release's event among the prior events, so the PRV accountant composes both and the run's
printed ε (its plan's bound) covers the release and every DP-SGD step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import gaussian_sigma_for_share
from dpsynth.privacy.accounting.compose import compose_epsilon, poisson_gaussian_event
from dpsynth.privacy.accounting.dpsgd_plan import plan_poisson_gaussian
from dpsynth.privacy.accounting.events import AnyEvent, DpEvent, gaussian_release
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.mechanisms.aggregation import renorm_rows

MECHANISM = "central_images"


@dataclass(frozen=True)
class CentralImagesPlan:
    """The public parameters of one central-images release, fixed before the data is read.

    `noise_multiplier` 0 means not private (exact means, for the `--epsilon inf` baseline).
    """

    noise_multiplier: float
    clip_norm: float
    count_weight: float

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the released vector (sums / C, w · counts)."""
        return math.sqrt(1.0 + self.count_weight**2)

    @property
    def noise_std(self) -> float:
        """The std of the Gaussian noise on each coordinate of the released vector."""
        return self.noise_multiplier * self.sensitivity

    def event(self) -> DpEvent:
        """The event: one Gaussian mechanism, annotated with the release's parameters."""
        return gaussian_release(
            self.noise_multiplier,
            mechanism=MECHANISM,
            clip_norm=float(self.clip_norm),
            count_weight=float(self.count_weight),
        )

    @classmethod
    def from_event(cls, event: DpEvent) -> CentralImagesPlan:
        """Inverse of `event`."""
        stored = event.to_json()
        sigma = float(stored["noise_multiplier"]) if stored["type"] == "gaussian" else 0.0
        return cls(sigma, float(stored["clip_norm"]), float(stored["count_weight"]))


def central_plan_in(events: Sequence[DpEvent]) -> CentralImagesPlan | None:
    """The central-images release among a plan's events (None if it has none)."""
    for event in events:
        if event.annotation("mechanism") == MECHANISM:
            return CentralImagesPlan.from_event(event)
    return None


def plan_dpsgd_with_central_images(
    target: PrivacyTarget,
    n: int,
    expected_batch_size: float,
    steps: int,
    max_grad_norm: float,
    *,
    share: float,
    clip_norm: float,
    count_weight: float = 1.0,
    prior_events: Sequence[AnyEvent] = (),
) -> PrivacyPlan:
    """A DP-SGD plan (as `plan_poisson_gaussian`) preceded by a central-images release.

    The release's σ_c is the Gaussian's at `share` of the ε left after `prior_events`; the
    DP-SGD σ is calibrated so that prior + release + DP-SGD compose (PRV) to at most
    `target.epsilon`. The plan's events are (release, DP-SGD), its `epsilon_bound` their
    composition and `total_epsilon_bound` that with the prior spends.
    """
    if not 0.0 < share < 1.0:
        raise UsageError(f"--set warm_start_share: must be in (0, 1), got {share}")
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise UsageError(f"--set warm_start_clip: must be positive, got {clip_norm}")
    if not (math.isfinite(count_weight) and count_weight > 0):
        raise UsageError(f"count weight must be positive, got {count_weight}")
    if not target.private:
        base = plan_poisson_gaussian(target, n, expected_batch_size, steps, max_grad_norm)
        release = CentralImagesPlan(0.0, clip_norm, count_weight)
        return _with_release(base, release, base.epsilon_bound, base.total_epsilon_bound)
    sigma_c = gaussian_sigma_for_share(target.epsilon, target.delta, share, prior_events)
    release = CentralImagesPlan(sigma_c, clip_norm, count_weight)
    base = plan_poisson_gaussian(
        target,
        n,
        expected_batch_size,
        steps,
        max_grad_norm,
        (*prior_events, release.event()),
    )
    loop = poisson_gaussian_event(base.noise_multiplier, base.sampling_rate, base.steps)
    alone = compose_epsilon([release.event(), loop], target.delta)
    return _with_release(base, release, alone.epsilon, base.total_epsilon_bound)


def _with_release(
    base: PrivacyPlan, release: CentralImagesPlan, epsilon: float, total: float
) -> PrivacyPlan:
    note = (
        f"central images: per-class sums of records clipped to L2 norm {release.clip_norm:g} "
        f"and counts (weight {release.count_weight:g}), one Gaussian release at "
        f"σ = {release.noise_multiplier:.4g} (noise std {release.noise_std:.4g}), composed "
        "with the DP-SGD steps"
        if release.noise_multiplier > 0
        else "central images: exact class means (not private)"
    )
    return replace(
        base,
        events=(release.event(), *base.events),
        epsilon_bound=epsilon,
        total_epsilon_bound=total,
        notes=(note, *base.notes),
    )


def central_statistics(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, plan: CentralImagesPlan
) -> torch.Tensor:
    """The exact vector the mechanism noises: [S_1/C, …, S_K/C, w·n_1, …, w·n_K] (float64).

    Records with a label outside 0..K−1 count nowhere.
    """
    x = renorm_rows(x.to(torch.float64).flatten(1), plan.clip_norm) / plan.clip_norm
    y = y.to(torch.int64)
    inside = (y >= 0) & (y < num_classes)
    sums = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, device=x.device)
    sums.index_add_(0, y[inside], x[inside])
    counts = torch.bincount(y[inside], minlength=num_classes).to(torch.float64)
    return torch.cat([sums.flatten(), plan.count_weight * counts])


@dataclass(frozen=True)
class CentralImages:
    """A release: the noisy class means [K, C, H, W] in [-1, 1] and noisy counts [K] (public).

    `model`, when the release is a frequency model (`dpsynth.privacy.releases.frequency`), draws
    whole images of a class (`model.sample(labels, generator, scale)`); `records` uses it.
    """

    means: torch.Tensor
    counts: torch.Tensor
    model: Any = None

    def records(
        self, labels: torch.Tensor, jitter: float, generator: torch.Generator
    ) -> torch.Tensor:
        """Stand-in records [n, C, H, W] for labels [n] (post-processing, for a warm start):
        samples of the release's model when it has one (`jitter` is then not used), else
        the class means plus `jitter`·N(0, I)."""
        if self.model is not None:
            return self.model.sample(labels, generator).to(self.means.device)
        means = self.means[labels.to(self.means.device)]
        noise = torch.randn(means.shape, generator=generator, device=generator.device)
        return means + jitter * noise.to(means.device)


def noisy_statistics(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    plan: CentralImagesPlan,
    generator: torch.Generator,
) -> torch.Tensor:
    """`central_statistics` plus N(0, (σ·Δ)²) on every coordinate, from the secret `generator`."""
    stats = central_statistics(x, y, num_classes, plan)
    noise = torch.randn(
        stats.shape, generator=generator, dtype=torch.float64, device=generator.device
    )
    return stats + plan.noise_std * noise.to(stats.device)


def release_central_images(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    plan: CentralImagesPlan,
    generator: torch.Generator,
) -> CentralImages:
    """The DP release of the class means of x [N, C, H, W] (in [-1, 1]) by labels y [N].

    The ONLY code that reads the records for this release; noise from the run's secret
    `generator` (σ = 0: exact, for non-private runs). The rest is post-processing.
    """
    released = noisy_statistics(x, y, num_classes, plan, generator)
    k, d = num_classes, x[0].numel()
    sums = released[: k * d].reshape(k, d) * plan.clip_norm
    counts = released[k * d :] / plan.count_weight
    means = (sums / counts.clamp_min(1.0)[:, None]).clamp(-1.0, 1.0)
    return CentralImages(
        means=means.reshape(k, *x.shape[1:]).to(torch.float32), counts=counts.to(torch.float32)
    )
