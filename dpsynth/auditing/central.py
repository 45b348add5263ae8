"""White-box one-run audit of the central-images release through its own code.

The release (`privacy/releases/central.py`) is `noisy_statistics(x, y, K, plan)`: the class sums of
the clipped records over C and w · the class counts, plus N(0, (σΔ)²) per coordinate, Δ =
`plan.sensitivity` = √(1 + w²) (a ledger `gaussian` event annotated `mechanism:
central_images`). The audit calls that function itself (statistic and noise) on canary images.

Design (as `auditing/frequency.py`): every canary is the all-white image, whose clipped and scaled
record is the unit vector u = (1, …, 1)/√d when its norm √d exceeds C; canary i has its own
label i (Δ does not depend on K), so its class sum u and its count w lie on coordinates of its
own: an included canary moves the release by exactly Δ. Chunks of `_CHUNK` labels touch
disjoint coordinates (the same release in distribution). `break_mode` (`--break`): "noise"
divides σ by F ("noise:F", `auditing/breaks.py`), "sensitivity:F" makes
`CentralImagesPlan.sensitivity` F times too small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dpsynth.auditing.breaks import read_break
from dpsynth.auditing.frequency import plan_under
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.releases.central import MECHANISM, CentralImagesPlan, noisy_statistics

__all__ = ["CENTRAL_BREAKS", "MECHANISM", "central_scores"]

CENTRAL_BREAKS = ("noise", "sensitivity")
_CHUNK = 256


@dataclass(frozen=True)
class _UnderstatedSensitivity(CentralImagesPlan):
    """A CentralImagesPlan whose Δ is `understatement` times too small (the deliberate error)."""

    understatement: float = 1.0

    @property
    def sensitivity(self) -> float:
        """Δ ÷ understatement: the noise std σΔ shrinks with it."""
        return super().sensitivity / self.understatement


def central_scores(
    event: DpEvent,
    shape: Sequence[int],
    included: torch.Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, torch.Tensor]:
    """Each canary's {"llr", "max"} (float64 [m]) after one release through
    `noisy_statistics`, its noise drawn from `generator` (the audit's seeded stream)."""
    nominal = CentralImagesPlan.from_event(event)
    mode, factor = read_break(break_mode, CENTRAL_BREAKS)
    plan = plan_under(CentralImagesPlan.from_event(event), mode, _UnderstatedSensitivity, factor)
    d = int(math.prod(int(s) for s in shape))
    image = torch.ones(*(int(s) for s in shape))
    unit = min(1.0, math.sqrt(d) / nominal.clip_norm)  # ‖x̄‖/C: 1 when the clip binds
    signal = math.sqrt(unit**2 + nominal.count_weight**2)
    m = int(included.numel())
    projection = torch.empty(m, dtype=torch.float64)
    for start in range(0, m, _CHUNK):
        size = min(_CHUNK, m - start)
        labels = torch.nonzero(included[start : start + size]).flatten()
        records = image.expand(int(labels.numel()), *image.shape)
        released = noisy_statistics(records, labels, size, plan, generator)
        sums = released[: size * d].reshape(size, d).sum(1) / math.sqrt(d)  # ⟨row, u⟩
        value = unit * sums + nominal.count_weight * released[size * d :]
        projection[start : start + size] = value / signal
    standardised = projection / nominal.noise_std
    strength = signal / nominal.noise_std
    return {"llr": strength * standardised - 0.5 * strength**2, "max": standardised}
