"""White-box one-run audit of the frequency model through its own code (`frequency_statistics`).

The frequency model (`privacy/releases/frequency.py`) releases one vector, the statistic
`frequency_statistics(x, y, K, plan)` plus N(0, (σΔ)²) per coordinate, Δ = `plan.sensitivity`
= √(2 + w²) (a ledger `gaussian` event annotated `mechanism: frequency_model`, q = 1). The audit
runs that statistic on canary *records*: images in [-1, 1] that the training code clips and
transforms as it would any record, and adds the noise the plan's `noise_std` says (the line
`release_frequency_model` runs before its post-processing, which cannot add information).

Design: every canary is the same image (channel 0 white, the others black), so its band
features are one DCT coordinate (channel 0's DC term, far above the clip C_f) and, clipped, a
unit vector u. Canary i has its own label i (the audit's K is the number of canaries: Δ does
not depend on K), so its class sum S_i/C_f = u, its count w and, for `covariance=class`, its
second moment U(uuᵀ) lie on coordinates no other canary touches: an included canary moves the
release by a vector of norm Δ exactly (the sensitivity is met, not approximated). With the
pooled second moment (`covariance=pooled`) the moment coordinate is shared by every canary and
moves all their scores alike, so it cannot rank them: the audit sees √(1 + w²) of Δ there.
Canaries are run in chunks of `_CHUNK` labels; chunks touch disjoint coordinates, so this is
the same release in distribution (parallel composition) with bounded memory.

`break_mode` (test only): "noise" divides σ by `BREAK_FACTOR`; "sensitivity" makes
`FrequencyPlan.sensitivity` that many times too small (as a wrong Δ in the code would).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dpsynth.privacy.releases.frequency import MECHANISM, FrequencyPlan, frequency_statistics

__all__ = ["BREAK_FACTOR", "FREQUENCY_BREAKS", "MECHANISM", "canary_image", "frequency_scores"]

# 8: caught wherever the release sits in a plan at ε = 1 (rdpgan small-freq gives it a share
# of ε, so σ = 7.1 and its pooled moments leave the audit √(1 + w²) of Δ). `freq` alone, where
# the release holds all of ε, catches 4× (lower bounds 1.5-1.7 with 5,000 canaries); a 2×
# error is beyond one run of one Gaussian release at ε = 1 (0.55-0.83 with 10,000 canaries).
BREAK_FACTOR = 8.0
FREQUENCY_BREAKS = ("noise", "sensitivity")
_CHUNK = 256


@dataclass(frozen=True)
class _UnderstatedSensitivity(FrequencyPlan):
    """A FrequencyPlan whose Δ is `BREAK_FACTOR` too small (the deliberate error)."""

    @property
    def sensitivity(self) -> float:
        """Δ ÷ BREAK_FACTOR: the noise std σΔ shrinks with it."""
        return super().sensitivity / BREAK_FACTOR


def canary_image(shape: Sequence[int]) -> torch.Tensor:
    """The canary record [C, H, W] in [-1, 1]: channel 0 white, the others black."""
    channels, height, width = (int(s) for s in shape)
    image = -torch.ones(channels, height, width)
    image[0] = 1.0
    return image


def plan_under(plan: Any, break_mode: str | None, understated: type) -> Any:
    """`plan` as audited: itself, or with the deliberate error of `break_mode` ("noise": σ
    ÷ BREAK_FACTOR; "sensitivity": the plan as its `understated` subclass, Δ ÷ BREAK_FACTOR)."""
    if break_mode == "noise":
        return replace(plan, noise_multiplier=plan.noise_multiplier / BREAK_FACTOR)
    if break_mode == "sensitivity":
        return understated(**plan.__dict__)
    return plan


def frequency_scores(
    event: Mapping[str, Any],
    shape: Sequence[int],
    included: torch.Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, torch.Tensor]:
    """Each canary's scores after one release: {"llr": the log-likelihood ratio of "in" against
    "out" under the nominal mechanism, "max": the standardised projection}, float64 [m] each.

    The release is `frequency_statistics` of the included canaries (each with its own label)
    plus the plan's noise, drawn from `generator` (the audit's seeded stream).
    """
    nominal = FrequencyPlan.from_event(event)
    mode = break_mode if break_mode in FREQUENCY_BREAKS else None
    plan = plan_under(FrequencyPlan.from_event(event), mode, _UnderstatedSensitivity)
    image = canary_image(shape)
    m = int(included.numel())
    d = _feature_count(shape, nominal.band)
    pairs = d * (d + 1) // 2
    # The nominal contribution of one included canary on its own coordinates: its class sum's
    # DC entry, its moment's (0, 0) entry (class covariance only) and its weighted count.
    # The canary's band features: channel 0's DC term, 2·√(HW) (x + 1 = 2 on H·W pixels,
    # orthonormal DCT), clipped to C_f: ‖f̄‖/C_f is 1 whenever the clip binds (every preset).
    _, height, width = (int(s) for s in shape)
    unit = min(1.0, 2.0 * math.sqrt(height * width) / nominal.clip_norm)
    own_moment = nominal.covariance == "class"
    signal_sq = unit**2 + (unit**4 if own_moment else 0.0) + nominal.count_weight**2
    signal = math.sqrt(signal_sq)
    noise_std = nominal.noise_std  # the nominal mechanism's: the scores are fixed in advance
    projection = torch.empty(m, dtype=torch.float64)
    for start in range(0, m, _CHUNK):
        size = min(_CHUNK, m - start)
        inside = included[start : start + size]
        labels = torch.nonzero(inside).flatten()
        records = image.expand(int(labels.numel()), *image.shape)
        stats = frequency_statistics(records, labels, size, plan)
        noise = torch.randn(stats.shape, generator=generator, dtype=torch.float64)
        released = stats + plan.noise_std * noise  # as release_frequency_model adds it
        sums = released[: size * d].reshape(size, d)[:, 0]
        counts = released[-size:]
        value = unit * sums + nominal.count_weight * counts
        if own_moment:
            moments = released[size * d : size * d + size * pairs].reshape(size, pairs)[:, 0]
            value = value + unit**2 * moments
        projection[start : start + size] = value / signal  # N(b·signal, noise_std²)
    standardised = projection / noise_std
    strength = signal / noise_std
    return {"llr": strength * standardised - 0.5 * strength**2, "max": standardised}


def _feature_count(shape: Sequence[int], band: int) -> int:
    channels, height, width = (int(s) for s in shape)
    return channels * min(band, height) * min(band, width)
