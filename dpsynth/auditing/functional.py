"""White-box one-run audit of DP-Kernel's functional mechanism (the released gradient field).

The privacy layer's `privatize_embedding_gradient` releases ∇_w f_S(w_j) + σΔ·η_j at generated
points w_j, η a derivative field of one GP(0, k*) path. The audit runs that function itself,
with the plan's σ (its `poisson_gaussian` event), Δ (the plan's `max_grad_norm`, the kernel's
RKHS sensitivity), the public normaliser B and the backend's bandwidths, for the plan's T steps
at its q (the real `PoissonSampler`).

Design: canary i has its own release of the field at one block of generated points (the
mechanism's batch form: an independent GP draw per canary, the law of one label per canary);
points and canaries live in one dimension, each canary where its field's Mahalanobis norm is
largest, so it meets nearly all of the sensitivity (0.98 of √n_L with one bandwidth, 0.96 with
three). A canary's score is the log-likelihood ratio of "in" vs "out" of its released values
under the nominal mechanism summed over steps, and its largest standardised whitened
projection over the steps (as in `whitebox`). `break_mode` (`--break`, `auditing/breaks.py`):
"noise:F" divides σ by F; "clip:F" lets a canary's field be F× what the sensitivity allows
(a clipping F times too loose).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from dpsynth.auditing.breaks import check_break, read_break
from dpsynth.auditing.guesses import GuessOutcome, best_guesses, pooled_runs
from dpsynth.auditing.whitebox import (
    BREAK_MODES,
    MechanismStep,
    mechanism_steps,
    mixture_log_ratio,
)
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.mechanisms.functional import (
    derivative_kernel_covariance,
    privatize_embedding_gradient,
)
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

__all__ = ["FIELD_POINTS", "audit_field", "canary_block", "field_canary_scores"]

FIELD_POINTS = 64
_SPACING = 1.0


def _field(record: float, points: torch.Tensor, bandwidths: Sequence[float]) -> torch.Tensor:
    """∇_w Σ_ℓ exp(−(x − w)²/(2ℓ²)) at each 1-D point w for a record at x, float64 [n]."""
    offset = record - points.to(torch.float64)
    return sum(torch.exp(-(offset**2) / (2 * b * b)) * offset / (b * b) for b in bandwidths)


def canary_block(bandwidths: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One canary's geometry: its points [n, 1], its field there [n] and C⁻¹·field [n].

    `FIELD_POINTS` points on a line, `_SPACING`·(smallest bandwidth) apart (well conditioned), the
    canary where its field's Mahalanobis norm under the derivative-GP covariance C is largest
    (grid search), so the audit sees as much of the sensitivity as it can. Computed once per
    set of bandwidths (the many-run audit asks for it every run); the tensors are copies.
    """
    points, field, whitened = _canary_block(tuple(float(b) for b in bandwidths))
    return points.clone(), field.clone(), whitened.clone()


@functools.lru_cache(maxsize=8)
def _canary_block(bandwidths: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`canary_block`'s grid search, cached."""
    spacing = _SPACING * min(bandwidths)
    positions = torch.arange(FIELD_POINTS, dtype=torch.float64) - (FIELD_POINTS - 1) / 2
    positions = positions * spacing
    points = positions[:, None]
    cov = derivative_kernel_covariance(points, None, bandwidths)
    best: tuple[float, torch.Tensor, torch.Tensor] | None = None
    for k in range(0, 201):
        record = float(k) * spacing / 100.0
        field = _field(record, positions, bandwidths)
        whitened = torch.linalg.solve(cov, field)
        strength = float(field @ whitened)
        if best is None or strength > best[0]:
            best = (strength, field, whitened)
    assert best is not None
    return points, best[1], best[2]


def field_canary_scores(
    steps: Sequence[MechanismStep],
    sensitivity: float,
    normalizer: float,
    bandwidths: Sequence[float],
    included: torch.Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
    jitter: float = 1e-8,
) -> dict[str, torch.Tensor]:
    """Each canary's scores after one run of `steps`: {"llr": summed log-likelihood ratio,
    "max": the largest standardised whitened projection over the steps}, float64 [m] each."""
    check_break(break_mode, BREAK_MODES)
    mode, factor = read_break(break_mode, BREAK_MODES)
    m = int(included.numel())
    members = torch.nonzero(included).flatten()
    points, field, whitened = canary_block(bandwidths)
    n = int(points.shape[0])
    contribution = field * (factor if mode in ("clip", "sensitivity") else 1.0)
    scores = torch.zeros(m, dtype=torch.float64)
    peak = torch.full((m,), -math.inf, dtype=torch.float64)
    strength = float(field @ whitened)  # fieldᵀ C⁻¹ field
    for step in steps:
        sigma = step.noise_multiplier / (factor if mode == "noise" else 1.0)
        sampler = PoissonSampler(int(members.numel()), step.sampling_rate, generator)
        # Nominal mechanism: released·B = field (if sampled) + N(0, (σΔ)² C); the score is
        # the log-likelihood ratio of the mixture (1 − q)·N(0) + q·N(field) against N(0).
        scale = (step.noise_multiplier * sensitivity) ** 2
        shift = strength / (2.0 * scale)
        for _ in range(step.steps):
            gradient = torch.zeros(m, n, 1, dtype=torch.float64)
            gradient[members[sampler.next()]] = (contribution / normalizer)[:, None]
            # m independent releases at the block's points: the mechanism's batch form, one
            # GP draw each (the same law as m label blocks in one release, at one
            # factorisation's cost).
            released = privatize_embedding_gradient(
                gradient,
                points,
                None,
                bandwidths,
                noise_multiplier=sigma,
                sum_sensitivity=sensitivity,
                normalizer=normalizer,
                generator=generator,
                jitter=jitter,
            )
            evidence = released[:, :, 0] * normalizer
            projection = evidence @ whitened
            peak = torch.maximum(peak, projection / math.sqrt(scale * strength))
            log_ratio = projection / scale - shift
            scores += mixture_log_ratio(log_ratio, step.sampling_rate)
    return {"llr": scores, "max": peak}


def audit_field(
    events: Sequence[DpEvent],
    sensitivity: float,
    normalizer: float,
    bandwidths: Sequence[float],
    delta: float,
    canaries: int,
    confidence: float,
    seed: int | None = None,
    break_mode: str | None = None,
    jitter: float = 1e-8,
    runs: int = 1,
) -> GuessOutcome:
    """`runs` white-box runs of the functional mechanism for the plan's events → the best
    guess."""
    steps = mechanism_steps(events)

    def score_run(inside: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        return field_canary_scores(
            steps, sensitivity, normalizer, bandwidths, inside, generator, break_mode, jitter
        )

    scores, included = pooled_runs(canaries, runs, seed, score_run)
    return best_guesses(scores, included, delta, confidence, independent=True, family=events)
