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
release by a vector of norm Δ exactly (the sensitivity is met, not approximated). Canaries are
run in chunks of `_CHUNK` labels; chunks touch disjoint coordinates, so this is the same release
in distribution (parallel composition) with bounded memory. With the pooled second moment
(`covariance=pooled`) the moment coordinate would be shared by every canary of a release, so
each canary gets a release of its own (K = 1, one record or none): a multiple-run audit, whose
canaries are independent trials that see all of Δ.

`break_mode` (`--break`, `auditing/breaks.py`): "noise:F" divides σ by F; "sensitivity:F" makes
`FrequencyPlan.sensitivity` F times too small (as a wrong Δ in the code would).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dpsynth.auditing.breaks import read_break
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.releases.frequency import MECHANISM, FrequencyPlan, frequency_statistics

__all__ = ["FREQUENCY_BREAKS", "MECHANISM", "canary_image", "frequency_scores", "plan_under"]

FREQUENCY_BREAKS = ("noise", "sensitivity")
_CHUNK = 256


@dataclass(frozen=True)
class _UnderstatedSensitivity(FrequencyPlan):
    """A FrequencyPlan whose Δ is `understatement` times too small (the deliberate error)."""

    understatement: float = 1.0

    @property
    def sensitivity(self) -> float:
        """Δ ÷ understatement: the noise std σΔ shrinks with it."""
        return super().sensitivity / self.understatement


def canary_image(shape: Sequence[int]) -> torch.Tensor:
    """The canary record [C, H, W] in [-1, 1]: channel 0 white, the others black."""
    channels, height, width = (int(s) for s in shape)
    image = -torch.ones(channels, height, width)
    image[0] = 1.0
    return image


def plan_under(plan: Any, break_mode: str | None, understated: type, factor: float) -> Any:
    """`plan` as audited: itself, or with the deliberate error of `break_mode` ("noise": σ
    ÷ factor; "sensitivity": the plan as its `understated` subclass, Δ ÷ factor)."""
    if break_mode == "noise":
        return replace(plan, noise_multiplier=plan.noise_multiplier / factor)
    if break_mode == "sensitivity":
        return understated(**plan.__dict__, understatement=factor)
    return plan


def frequency_scores(
    event: DpEvent,
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
    mode, factor = read_break(break_mode, FREQUENCY_BREAKS)
    plan = plan_under(FrequencyPlan.from_event(event), mode, _UnderstatedSensitivity, factor)
    image = canary_image(shape)
    d = _feature_count(shape, nominal.band)
    pairs = d * (d + 1) // 2
    # The nominal contribution of one included canary on its own coordinates: its class sum's
    # DC entry, its moment's (0, 0) entry and its weighted count: a vector of norm Δ.
    # The canary's band features: channel 0's DC term, 2·√(HW) (x + 1 = 2 on H·W pixels,
    # orthonormal DCT), clipped to C_f: ‖f̄‖/C_f is 1 whenever the clip binds (every preset).
    _, height, width = (int(s) for s in shape)
    unit = min(1.0, 2.0 * math.sqrt(height * width) / nominal.clip_norm)
    signal = math.sqrt(unit**2 + unit**4 + nominal.count_weight**2)
    noise_std = nominal.noise_std  # the nominal mechanism's: the scores are fixed in advance
    if nominal.covariance == "pooled":
        projection = _one_release_each(image, included, plan, d, unit, generator) / signal
    else:
        projection = _shared_release(image, included, plan, d, pairs, unit, generator) / signal
    standardised = projection / noise_std  # N(b·signal/noise_std, 1)
    strength = signal / noise_std
    return {"llr": strength * standardised - 0.5 * strength**2, "max": standardised}


def _released(
    records: torch.Tensor, labels: torch.Tensor, classes: int, plan: FrequencyPlan,
    generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """The statistic plus the plan's noise, as `release_frequency_model` adds it."""
    stats = frequency_statistics(records, labels, classes, plan)
    noise = torch.randn(stats.shape, generator=generator, dtype=torch.float64)
    return stats + plan.noise_std * noise


def _one_release_each(
    image: torch.Tensor, included: torch.Tensor, plan: FrequencyPlan, d: int, unit: float,
    generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """Pooled moments: a release per canary (its image if included, else no record) → the
    projection of its sum's DC entry, the moment's (0, 0) entry and its count, [m]."""
    m = int(included.numel())
    weight = plan.count_weight
    values = torch.empty(m, dtype=torch.float64)
    label = torch.zeros(1, dtype=torch.int64)
    for i in range(m):
        present = bool(included[i])
        records = image.unsqueeze(0) if present else image.new_zeros(0, *image.shape)
        released = _released(records, label if present else label[:0], 1, plan, generator)
        values[i] = unit * released[0] + unit**2 * released[d] + weight * released[-1]
    return values


def _shared_release(
    image: torch.Tensor, included: torch.Tensor, plan: FrequencyPlan, d: int, pairs: int,
    unit: float, generator: torch.Generator,
) -> torch.Tensor:  # fmt: skip
    """Class moments: one release per chunk of `_CHUNK` canaries, canary i on label i → the
    projection of its coordinates (sum's DC entry, moment's (0, 0) entry, count), [m]."""
    m = int(included.numel())
    projection = torch.empty(m, dtype=torch.float64)
    for start in range(0, m, _CHUNK):
        size = min(_CHUNK, m - start)
        inside = included[start : start + size]
        labels = torch.nonzero(inside).flatten()
        records = image.expand(int(labels.numel()), *image.shape)
        released = _released(records, labels, size, plan, generator)
        sums = released[: size * d].reshape(size, d)[:, 0]
        moments = released[size * d : size * d + size * pairs].reshape(size, pairs)[:, 0]
        counts = released[-size:]
        value = unit * sums + unit**2 * moments + plan.count_weight * counts
        projection[start : start + size] = value
    return projection


def _feature_count(shape: Sequence[int], band: int) -> int:
    channels, height, width = (int(s) for s in shape)
    return channels * min(band, height) * min(band, width)
