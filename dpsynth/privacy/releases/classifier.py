"""DP-SGD training of a classifier on all the records, on a schedule fixed in advance.

Two users: the leaderboard's reference row "DP-SGD classifier on the real records" (what a
data owner who only needs a classifier would do instead of releasing data), and a backend's
DP "teacher" (a classifier whose only use is post-processing the backend's own samples).

Mechanism: `steps` Poisson(q)-subsampled steps of `dpsgd.PrivateGradient` (every record's
gradient, over all trainable parameters, clipped to L2 norm C; one Gaussian draw of std σ·C
on the clipped sum; divided by the public q·N), then an Adam step. One `poisson_gaussian`
event (σ, q, T) for the accountant, annotated `mechanism: dp_classifier`; the planned σ is
calibrated from public facts only (N, the schedule, the target ε, δ and earlier events).

Augmentation multiplicity (De et al. 2022): with `augment_copies` = K > 0 each record's loss
is the mean over K randomly shifted copies of it (shifts of at most `augment_shift` pixels,
from a secret stream), computed before the record's gradient is clipped, so one record still
moves the clipped sum by at most C: the same mechanism, a better gradient estimate.
An exponential moving average of the weights (`ema` > 0) is post-processing of the released
updates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import (
    AnyEvent,
    DpEvent,
    NonPrivate,
    PoissonGaussian,
    events_from_json,
)
from dpsynth.privacy.accounting.plan import PrivacyPlan, PrivacyTarget
from dpsynth.privacy.accounting.plan_check import DP_CLASSIFIER_MECHANISM as MECHANISM
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ClassifierSchedule:
    """The public hyper-parameters of a DP-SGD classifier, fixed before any record is read.

    `epochs` sets the number of steps T = round(epochs · N / B) (B the expected batch size).
    """

    batch_size: int = 256
    epochs: float = 15.0
    lr: float = 5e-3
    max_grad_norm: float = 1.0
    augment_copies: int = 0
    augment_shift: int = 2
    ema: float = 0.0

    def steps(self, n: int) -> int:
        """T for N records (at least 1)."""
        return max(1, round(self.epochs * n / min(self.batch_size, n)))

    def check(self) -> None:
        """UsageError for a value no run could use."""
        if self.batch_size < 1:
            raise UsageError(f"classifier batch size must be ≥ 1, got {self.batch_size}")
        if not (math.isfinite(self.epochs) and self.epochs > 0):
            raise UsageError(f"classifier epochs must be positive, got {self.epochs}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"classifier lr must be positive, got {self.lr}")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise UsageError(f"classifier clip must be positive, got {self.max_grad_norm}")
        if self.augment_copies < 0 or self.augment_shift < 0:
            raise UsageError("augmentation copies and shift must be ≥ 0")
        if not 0.0 <= self.ema < 1.0:
            raise UsageError(f"classifier ema must be in [0, 1), got {self.ema}")


@dataclass(frozen=True)
class ClassifierPlan:
    """The accounted parameters of one DP-SGD classifier (σ = 0: not private)."""

    noise_multiplier: float
    sampling_rate: float
    steps: int
    max_grad_norm: float
    expected_batch_size: float

    @property
    def private(self) -> bool:
        """False for the non-private baseline (no clipping, no noise)."""
        return self.noise_multiplier > 0

    def event(self) -> DpEvent:
        """The event: Poisson-subsampled Gaussian steps, annotated as this mechanism."""
        about = {"mechanism": MECHANISM, "max_grad_norm": float(self.max_grad_norm)}
        if self.private:
            return PoissonGaussian(
                float(self.noise_multiplier), float(self.sampling_rate), int(self.steps),
                annotations=about,
            )  # fmt: skip
        return NonPrivate(
            annotations={"sampling_rate": self.sampling_rate, "steps": self.steps, **about}
        )

    @classmethod
    def from_event(cls, event: DpEvent, n: int) -> ClassifierPlan:
        """Inverse of `event` for N records."""
        stored = event.to_json()
        sigma = float(stored["noise_multiplier"]) if stored["type"] == "poisson_gaussian" else 0.0
        q = float(stored["sampling_rate"])
        return cls(sigma, q, int(stored["steps"]), float(stored["max_grad_norm"]), q * n)


def classifier_plan_in(events: Sequence[DpEvent], n: int) -> ClassifierPlan | None:
    """The DP classifier among a plan's events (None if it has none)."""
    for event in events:
        if event.annotation("mechanism") == MECHANISM:
            return ClassifierPlan.from_event(event, n)
    return None


def plan_classifier(
    epsilon: float,
    delta: float,
    n: int,
    schedule: ClassifierSchedule,
    prior_events: Sequence[AnyEvent] = (),
) -> ClassifierPlan:
    """σ for the schedule's T Poisson steps so that prior + this compose to at most ε.

    ε = inf gives the non-private plan (σ = 0). Public facts only: N, the schedule, ε, δ.
    """
    schedule.check()
    if n < 1:
        raise UsageError("the data set is empty")
    q = min(1.0, schedule.batch_size / n)
    steps = schedule.steps(n)
    if not math.isfinite(epsilon):
        return ClassifierPlan(0.0, q, steps, schedule.max_grad_norm, q * n)
    sigma = calibrate_noise(epsilon, delta, q, steps, prior_events).noise_multiplier
    return ClassifierPlan(sigma, q, steps, schedule.max_grad_norm, q * n)


def random_shifts(copies: int, shift: int, size: int, generator: torch.Generator) -> Tensor:
    """Integer pixel shifts [size, copies, 2] in [-shift, shift], from `generator`."""
    return torch.randint(
        -shift, shift + 1, (size, copies, 2), generator=generator, device=generator.device
    )


def shifted_copies(x: Tensor, shifts: Tensor) -> Tensor:
    """Each image of x [B, C, H, W] translated by its shifts [B, K, 2] (rows dy, dx), the
    uncovered border filled with the background value -1: [B, K, C, H, W]."""
    size, copies = shifts.shape[:2]
    pad = int(shifts.abs().max()) if shifts.numel() else 0
    height, width = x.shape[-2:]
    padded = F.pad(x, (pad, pad, pad, pad), value=-1.0)
    out = x.new_empty(size, copies, *x.shape[1:])
    for k in range(copies):
        for dy in range(-pad, pad + 1):
            for dx in range(-pad, pad + 1):
                rows = (shifts[:, k, 0] == dy) & (shifts[:, k, 1] == dx)
                if rows.any():
                    out[rows, k] = padded[
                        rows, :, pad + dy : pad + dy + height, pad + dx : pad + dx + width
                    ]
    return out


def _record_loss(model: nn.Module) -> Callable[..., Tensor]:
    """The loss of ONE record for `PrivateGradient` (vmap path): cross-entropy of the image
    [C, H, W], or the mean over its copies [K, C, H, W] (augmentation multiplicity)."""

    def loss(params: dict, buffers: dict, x: Tensor, y: Tensor) -> Tensor:
        batch = x.unsqueeze(0) if x.dim() == 3 else x
        logits = functional_call(model, (params, buffers), (batch,))
        return F.cross_entropy(logits, y.expand(len(batch)))

    return loss


def _batch_loss(model: nn.Module) -> Callable[..., Tensor]:
    """Per-record losses [B] of a plain forward pass (the ghost-clipping path)."""

    def loss(x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(model(x), y, reduction="none")

    return loss


def train_private_classifier(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    plan: ClassifierPlan,
    schedule: ClassifierSchedule,
    *,
    sampling_generator: torch.Generator,
    noise_generator: torch.Generator,
    augment_generator: torch.Generator | None = None,
    progress: Progress | None = None,
) -> nn.Module:
    """Train `model` (logits of images in [-1, 1]) on ALL records x [N, C, H, W], y [N] with
    the plan's DP-SGD; returns the model in eval mode (EMA weights when `schedule.ema` > 0).

    The ONLY code that reads the records for this mechanism. Batches come from a
    `PoissonSampler` on `sampling_generator`, noise from `noise_generator`, shifts from
    `augment_generator` (all secret streams of the run's `PrivateRandomness`).
    """
    if len(x) != len(y):
        raise UsageError("images and labels disagree on the record count")
    copies = schedule.augment_copies
    if copies and augment_generator is None:
        raise UsageError("augmentation needs a generator for its shifts")
    sampler = PoissonSampler(len(x), plan.sampling_rate, sampling_generator)
    gradient = PrivateGradient(
        model,
        _record_loss(model),
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=plan.max_grad_norm if plan.private else 1.0,
        expected_batch_size=plan.expected_batch_size,
        generator=noise_generator,
        private=plan.private,
        batch_loss_fn=None if copies else _batch_loss(model),
        grad_mode="vmap" if copies else "auto",
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=schedule.lr)
    average = _Ema(model, schedule.ema)
    model.train()
    for step in range(plan.steps):
        index = sampler.next().to(x.device)
        batch: tuple[Tensor, ...] = (x[index], y[index])
        if copies:
            assert augment_generator is not None
            shifts = random_shifts(copies, schedule.augment_shift, len(index), augment_generator)
            batch = (shifted_copies(batch[0], shifts.to(x.device)), batch[1])
        optimizer.zero_grad(set_to_none=True)
        gradient.compute(*batch)
        optimizer.step()
        average.update(model)
        if progress is not None:
            progress(step + 1, plan.steps)
    average.copy_to(model)
    return model.eval()


class _Ema:
    """An exponential moving average of a model's parameters (decay 0: none)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = float(decay)
        self.shadow = (
            {k: p.detach().clone() for k, p in model.named_parameters()} if self.decay else {}
        )

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(p.detach(), 1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        for name, p in model.named_parameters():
            if name in self.shadow:
                p.copy_(self.shadow[name])


def plan_with_classifier(
    target: PrivacyTarget,
    n: int,
    schedule: ClassifierSchedule,
    share: float,
    plan_rest: Callable[[PrivacyTarget, tuple[DpEvent, ...]], PrivacyPlan],
    prior_events: Sequence[AnyEvent] = (),
) -> PrivacyPlan:
    """A run's plan with a DP classifier (a backend's teacher) beside its own mechanisms.

    The backend's own plan comes first: `plan_rest(t, prior)` at the target
    t = ε − share·(ε − ε_prior) (so alone it spends 1 − `share` of the ε left after
    `prior_events`); the classifier's σ is then the smallest that keeps prior + the backend +
    the classifier composed (PRV) under `target.epsilon`, so the classifier gets `share` of
    what is left plus what composition saves over adding. The result is the backend's plan
    with the classifier's event first, `epsilon_bound` the composition of all the run's
    events and `total_epsilon_bound` that with the prior spends. ε = inf: a non-private
    classifier beside a non-private plan.
    """
    if not 0.0 < share < 1.0:
        raise UsageError(f"--set teacher_share: must be in (0, 1), got {share}")
    prior = events_from_json(prior_events)
    if not target.private:
        teacher = plan_classifier(math.inf, target.delta, n, schedule)
        rest = plan_rest(target, prior)
        return replace(rest, events=(teacher.event(), *rest.events))
    spent = compose_epsilon(prior, target.delta).epsilon if prior else 0.0
    left = target.epsilon - spent
    if left <= 0:
        raise BudgetExceededError(
            f"the dataset's earlier spends leave nothing under the target ε={target.epsilon:g}"
        )
    rest = plan_rest(replace(target, epsilon=target.epsilon - share * left), prior)
    teacher = plan_classifier(target.epsilon, target.delta, n, schedule, (*prior, *rest.events))
    events = (teacher.event(), *rest.events)
    alone = compose_epsilon(list(events), target.delta)
    total = compose_epsilon([*prior, *events], target.delta) if prior else alone
    note = (
        f"DP teacher: {teacher.steps} DP-SGD steps at σ = {teacher.noise_multiplier:.4g}, "
        f"q = {teacher.sampling_rate:.4g} (a classifier used only to select samples, "
        "post-processing), composed with the rest of the run"
    )
    return replace(
        rest,
        target_epsilon=float(target.epsilon),
        events=events,
        epsilon_bound=alone.epsilon,
        total_epsilon_bound=total.epsilon,
        notes=(note, *rest.notes),
    )
