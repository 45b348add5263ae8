"""Annealed Hamiltonian Monte Carlo driven by a learned score (PGE's sampler, spec section 3.3).

Each round m refreshes the momentum, takes N leapfrog steps with the score as the force
(potential U = −log p, so −∇U = s), reflects positions at a box (flipping the momentum of the
crossing coordinates, which keeps leapfrog volume-preserving and reversible), and then
accepts or rejects each chain. A learned score has no energy, so `mh="path"` estimates
ΔU = −∫ s·dx along the trajectory with the trapezoid rule, reusing the scores already
computed. The sampler only ever sees the score function: it never touches data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

MH_MODES = ("path", "none", "paper-literal")


@dataclass
class HMCStats:
    """Per-round acceptance rates and step sizes (for logs)."""

    acceptance: list[float] = field(default_factory=list)
    step_sizes: list[float] = field(default_factory=list)


def reflect(x: torch.Tensor, c: torch.Tensor, box: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Reflect positions into [−box, box], flipping the momentum of the coordinates that crossed.

    A coordinate that overshoots by more than the box width is clamped (only on absurd steps).
    """
    above = x > box
    below = x < -box
    x = torch.where(above, 2 * box - x, torch.where(below, -2 * box - x, x))
    c = torch.where(above | below, -c, c)
    return x.clamp(-box, box), c


def _randn_like(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Standard normal draws shaped like x, from `generator` (which may live on another device)."""
    return torch.randn(x.shape, generator=generator, device=generator.device).to(x)


def _batch_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).flatten(1).sum(dim=1)


def leapfrog(
    score: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    c: torch.Tensor,
    g: torch.Tensor,
    step: float,
    n_steps: int,
    box: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """N leapfrog steps from (x, c) with force g = score(x); returns (x, c, g, W).

    W [B] is the trapezoid estimate of log p(x_end) − log p(x_start) along the path.
    """
    work = torch.zeros(x.shape[0], device=x.device, dtype=x.dtype)
    for _ in range(n_steps):
        c = c + 0.5 * step * g
        x_new = x + step * c
        if box is not None:
            x_new, c = reflect(x_new, c, box)
        g_new = score(x_new)
        c = c + 0.5 * step * g_new
        work = work + 0.5 * _batch_dot(g + g_new, x_new - x)
        x, g = x_new, g_new
    return x, c, g, work


def hmc_round(
    score: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    step: float,
    n_steps: int,
    mh: str,
    generator: torch.Generator,
    box: float | None = 1.0,
) -> tuple[torch.Tensor, float]:
    """One round: fresh Gaussian momentum, N leapfrog steps, per-chain accept/reject.

    Returns the new positions and the fraction of chains accepted.
    """
    if mh not in MH_MODES:
        raise ValueError(f"unknown mh mode {mh!r}; choose from {MH_MODES}")
    c0 = _randn_like(x, generator)
    g0 = score(x)
    x_end, c_end, g_end, work = leapfrog(score, x, c0, g0, step, n_steps, box)
    if mh == "none":
        return x_end, 1.0
    if mh == "path":
        delta_h = -work + 0.5 * _batch_dot(c_end, c_end) - 0.5 * _batch_dot(c0, c0)
        log_ratio = -delta_h
    else:  # paper-literal: the ratio of score norms (ill-posed; ablation only)
        log_ratio = torch.log(g_end.flatten(1).norm(dim=1)) - torch.log(
            g0.flatten(1).norm(dim=1).clamp_min(1e-12)
        )
    u = torch.rand(x.shape[0], generator=generator, device=generator.device).to(x)
    accept = torch.log(u.clamp_min(1e-38)) < log_ratio.nan_to_num(nan=-torch.inf)
    mask = accept.reshape(-1, *([1] * (x.dim() - 1)))
    return torch.where(mask, x_end, x), float(accept.float().mean())


def annealed_hmc(
    score_at_round: Callable[[int], Callable[[torch.Tensor], torch.Tensor]],
    x: torch.Tensor,
    step_sizes: Sequence[float],
    n_steps: int,
    mh: str,
    generator: torch.Generator,
    box: float | None = 1.0,
) -> tuple[torch.Tensor, HMCStats]:
    """Rounds m = 0..M−1 of `hmc_round`, round m using the force `score_at_round(m)`."""
    stats = HMCStats()
    for m, step in enumerate(step_sizes):
        x, rate = hmc_round(score_at_round(m), x, step, n_steps, mh, generator, box)
        stats.acceptance.append(rate)
        stats.step_sizes.append(float(step))
    return x, stats


def step_schedule(schedule: str, lambda0: float, sigmas: Sequence[float]) -> list[float]:
    """Leapfrog step per round: "sigma" λ0·σ_m/σ_M (Langevin-consistent), "paper" λ0·(M/m)²."""
    rounds = len(sigmas)
    if schedule == "sigma":
        return [lambda0 * s / sigmas[-1] for s in sigmas]
    if schedule == "paper":
        return [lambda0 * (rounds / (m + 1)) ** 2 for m in range(rounds)]
    raise ValueError(f"unknown step schedule {schedule!r}")
