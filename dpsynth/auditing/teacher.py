"""White-box one-run audit of the DP classifier (a backend's DP teacher) through its own code.

The teacher is `train_private_classifier(model, x, y, plan, schedule, …)`
(`privacy/releases/classifier.py`): T Poisson(q) batches from `PoissonSampler`, each record's
cross-entropy gradient clipped to C by `PrivateGradient` (whichever of its paths `auto`
picks, as for the real teacher), N(0, (σC)²) on the sum, an Adam step. Its event
(`poisson_gaussian`, annotated `mechanism: dp_classifier` and its C) is read back by
`ClassifierPlan.from_event`, as the backend reads it, and the audit calls the training
function itself on canary records.

Design: a probe classifier with two logits, ⟨w, x⟩ and 0, all records labelled 0, so a
record's gradient is −(1 − softmax₀)·x, and w starts at 0 with a learning rate so small that
it stays there (softmax₀ = 1/2 throughout). Canary i is the "image" [1, 1, m] with
`CANARY_SCALE`·C on pixel i: its gradient has norm far above C and only coordinate i, so the
noisy gradient's coordinate i (read after every step through the `progress` hook, before the
next step zeroes it) is canary i's evidence, scored as `whitebox` does (the mixture
log-likelihood ratio under the nominal σ, q, C, and the largest standardised value).
Augmentation multiplicity is left off: it averages a record's copies before clipping, so the
sensitivity (C) and the mechanism are the same.

`break_mode` (`--break`, `auditing/breaks.py`): "noise:F" divides σ by F; "clip:F" or
"sensitivity:F" lets each record move the sum by F·C while the noise stays σC (a clipping norm too
large for the noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from dpsynth.auditing.breaks import read_break
from dpsynth.auditing.whitebox import mixture_log_ratio
from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.releases.classifier import (
    MECHANISM,
    ClassifierPlan,
    ClassifierSchedule,
    train_private_classifier,
)

__all__ = ["MECHANISM", "TEACHER_BREAKS", "classifier_scores"]

TEACHER_BREAKS = ("noise", "clip", "sensitivity")
# A canary's gradient norm in units of C (the probe halves the pixel: softmax₀ = 1/2).
_CANARY_NORM = 4.0
# Adam moves each weight by about lr per step: w·x stays ~1e-6 over 10⁴ steps.
_PROBE_LR = 1e-12


class _Probe(nn.Module):
    """Logits (⟨w, x⟩, 0) of a flattened record: the gradient of class 0's loss is ∝ x."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: Tensor) -> Tensor:
        score = self.linear(x.flatten(1))
        return torch.cat([score, torch.zeros_like(score)], dim=1)


def _plan_under(plan: ClassifierPlan, break_mode: str | None, factor: float) -> ClassifierPlan:
    """The classifier plan as audited: itself or with its deliberate error."""
    if break_mode == "noise":
        return replace(plan, noise_multiplier=plan.noise_multiplier / factor)
    if break_mode in ("clip", "sensitivity"):
        # C·F clips F times too loosely; σ/F keeps the noise std at the nominal σC.
        return replace(
            plan,
            max_grad_norm=plan.max_grad_norm * factor,
            noise_multiplier=plan.noise_multiplier / factor,
        )
    return plan


def classifier_scores(
    event: DpEvent,
    shape: Sequence[int],
    included: Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, Tensor]:
    """Each canary's {"llr", "max"} (float64 [m]) after one run of the DP classifier's own
    training on the included canaries, its batches and noise drawn from `generator`."""
    m = int(included.numel())
    nominal = ClassifierPlan.from_event(event, m)
    mode, factor = read_break(break_mode, TEACHER_BREAKS)
    plan = _plan_under(nominal, mode, factor)
    clip = nominal.max_grad_norm
    members = torch.nonzero(included).flatten()
    pixel = 2.0 * max(_CANARY_NORM, 2.0 * factor) * clip
    x = torch.zeros(int(members.numel()), 1, 1, m)
    x[torch.arange(int(members.numel())), 0, 0, members] = pixel
    y = torch.zeros(int(members.numel()), dtype=torch.long)
    model = _Probe(m)
    noise_std = nominal.noise_multiplier * clip
    q = nominal.sampling_rate
    scores = torch.zeros(m, dtype=torch.float64)
    peak = torch.full((m,), -math.inf, dtype=torch.float64)

    def read_release(step: int, total: int) -> None:
        # The step's released noisy sum: −grad·(qN), the divisor public (post-processing).
        nonlocal peak
        grad = model.linear.weight.grad
        assert grad is not None
        released = -grad.detach().to(torch.float64).flatten() * plan.expected_batch_size
        shift = (clip * released - 0.5 * clip * clip) / (noise_std * noise_std)
        scores.add_(mixture_log_ratio(shift, q))
        peak = torch.maximum(peak, released / noise_std)

    schedule = ClassifierSchedule(batch_size=1, lr=_PROBE_LR, max_grad_norm=clip)
    train_private_classifier(
        model, x, y, plan, schedule,
        sampling_generator=generator, noise_generator=generator, progress=read_release,
    )  # fmt: skip
    return {"llr": scores, "max": peak}
