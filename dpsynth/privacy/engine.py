"""`PrivacyEngine`: DP-SGD for your own torch model, in the style of Opacus.

    engine = PrivacyEngine()
    training = engine.make_private_with_epsilon(
        module=model, optimizer=optimizer, data=(x, y), loss_fn=per_record_loss,
        target_epsilon=3.0, target_delta=1e-5, epochs=5, expected_batch_size=256,
        max_grad_norm=1.0,
    )
    for batch in training.batches():         # Poisson batches, drawn from a secret stream
        training.step(*batch)                # clipped, noised gradient; then optimizer.step()
    print(engine.get_epsilon(1e-5))          # the PRV accountant's proven upper bound

It is the mechanism every dpsynth backend trains with, offered for a model of your own:
- each record joins each batch independently with probability q (`PoissonSampler`), from a
  generator seeded by a fresh OS secret (`PrivateRandomness`), never from a public seed;
- each record's gradient over all trainable parameters is clipped to `max_grad_norm`, ONE
  Gaussian draw of std σ·C is added to their sum, which is divided by the expected batch size
  (`PrivateGradient`: per-record gradients with `torch.func`, or ghost norms);
- `make_private_with_epsilon` calibrates σ so that T = epochs / q steps (and `prior_events`, the
  data set's earlier spends) compose to at most the target ε at δ; `get_epsilon` composes the
  steps actually taken. Every ε is the accountant's proven upper bound, never an estimate.

Unlike Opacus, the loss is given per record, `loss_fn(params, buffers, *record) -> scalar` (see
`dpsynth.privacy.mechanisms.per_record`), so that losses which differentiate with respect to
the input work too. The engine records nothing: `events()` are the typed events to record in
a `dpsynth.Ledger` (`Ledger.reserve`) beside the data set's other spends.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import AnyEvent, PoissonGaussian
from dpsynth.privacy.mechanisms.dpsgd import BatchLossFn, LossFn, PrivateGradient
from dpsynth.privacy.mechanisms.poisson import PoissonSampler
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness


@dataclass
class PrivateTraining:
    """A model made private: `batches()` draws the planned Poisson batches from the data;
    `step(*batch)` writes the DP gradient of one batch into `.grad` and steps the optimizer.

    `noise_multiplier` σ, `max_grad_norm` C, `sampling_rate` q and `steps` T are the plan the
    engine accounts; `steps_taken` counts the steps run so far."""

    module: nn.Module
    optimizer: torch.optim.Optimizer
    data: tuple[Tensor, ...]
    noise_multiplier: float
    max_grad_norm: float
    sampling_rate: float
    steps: int
    gradient: PrivateGradient = field(repr=False)
    sampler: PoissonSampler = field(repr=False)
    steps_taken: int = 0

    def batches(self) -> Iterator[tuple[Tensor, ...]]:
        """The remaining planned batches (T in all): every record joins each one with
        probability q, so sizes vary and a batch may be empty (it is still a step)."""
        while self.steps_taken < self.steps:
            rows = self.sampler.next().to(self.data[0].device)
            yield tuple(t[rows] for t in self.data)

    def step(self, *batch: Tensor) -> dict[str, float]:
        """One DP-SGD step on `batch` (from `batches()`): the private gradient into `.grad`,
        then `optimizer.step()`. Returns the step's monitoring stats, which are NOT private
        (for your eyes; never a decision or a release)."""
        if self.steps_taken >= self.steps:
            raise UsageError(
                f"all {self.steps} planned steps are taken: a further step would spend more "
                "than the plan the engine accounts (make the model private again for more)"
            )
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.gradient.compute(*batch)
        self.optimizer.step()
        self.steps_taken += 1
        return stats


class PrivacyEngine:
    """Makes a torch model's training differentially private and accounts it (see the module).

    `secret` fixes the DP randomness for tests only: a known secret voids the guarantee, so
    leave it None (a fresh OS secret is drawn). One engine accounts the models it made private
    together (their events compose)."""

    def __init__(self, *, secret: int | None = None) -> None:
        self._randomness = (
            PrivateRandomness.fresh() if secret is None else PrivateRandomness(secret)
        )
        self._trainings: list[PrivateTraining] = []
        self._prior: tuple[AnyEvent, ...] = ()

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Sequence[Tensor],
        loss_fn: LossFn,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: float,
        epochs: float = 1.0,
        batch_loss_fn: BatchLossFn | None = None,
    ) -> PrivateTraining:
        """Train `module` on `data` (tensors sharing their first dimension, N records) with σ
        = `noise_multiplier` for `epochs` passes of Poisson batches of `expected_batch_size`
        records on average. `batch_loss_fn(*batch) -> [B]` lets ghost clipping skip the
        per-record gradients where the layers allow (see `PrivateGradient`)."""
        tensors = tuple(data)
        n = _record_count(tensors)
        q = min(1.0, float(expected_batch_size) / n)
        steps = _steps(epochs, q)
        purpose = f"engine/{len(self._trainings)}"
        gradient = PrivateGradient(
            module, loss_fn, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
            expected_batch_size=q * n, batch_loss_fn=batch_loss_fn,
            generator=self._randomness.generator(f"{purpose}/noise", _device(module)),
        )  # fmt: skip
        sampler = PoissonSampler(n, q, self._randomness.generator(f"{purpose}/batches"))
        training = PrivateTraining(
            module, optimizer, tensors, float(noise_multiplier), float(max_grad_norm), q, steps,
            gradient, sampler,
        )  # fmt: skip
        self._trainings.append(training)
        return training

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Sequence[Tensor],
        loss_fn: LossFn,
        target_epsilon: float,
        target_delta: float,
        epochs: float,
        expected_batch_size: float,
        max_grad_norm: float,
        prior_events: Sequence[AnyEvent] = (),
        batch_loss_fn: BatchLossFn | None = None,
    ) -> PrivateTraining:
        """As `make_private`, with σ the smallest (to 0.2%) whose T steps, composed with
        `prior_events` and whatever this engine already made private, are (ε, δ)-DP at
        `target_epsilon`, `target_delta` (BudgetExceededError when nothing is left)."""
        n = _record_count(tuple(data))
        q = min(1.0, float(expected_batch_size) / n)
        self._remember_prior(prior_events)
        earlier = [*self._prior, *self.events()]
        calibration = calibrate_noise(target_epsilon, target_delta, q, _steps(epochs, q), earlier)
        return self.make_private(
            module=module, optimizer=optimizer, data=data, loss_fn=loss_fn,
            noise_multiplier=calibration.noise_multiplier, max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size, epochs=epochs, batch_loss_fn=batch_loss_fn,
        )  # fmt: skip

    def _remember_prior(self, prior_events: Sequence[AnyEvent]) -> None:
        """Keep every earlier spend ever given: a later call that passes fewer (or none) must
        not drop one from `get_epsilon` (two lists are two readings of one ledger: their
        union by count, never their sum)."""
        kept = Counter(self._prior)
        for event, count in Counter(prior_events).items():
            kept[event] = max(kept[event], count)
        self._prior = tuple(kept.elements())

    def events(self) -> list[AnyEvent]:
        """The typed events of the steps taken so far (one `PoissonGaussian` a model)."""
        return [
            PoissonGaussian(t.noise_multiplier, t.sampling_rate, t.steps_taken)
            for t in self._trainings
            if t.steps_taken > 0
        ]

    def get_epsilon(self, delta: float) -> float:
        """The proven upper bound on ε at `delta` of the steps taken so far, composed with the
        `prior_events` given (0 before any step)."""
        events = [*self._prior, *self.events()]
        if not events:
            return 0.0
        return compose_epsilon(events, delta).epsilon


def _record_count(tensors: tuple[Tensor, ...]) -> int:
    if not tensors:
        raise UsageError("{data} must hold at least one tensor", parameter="data")
    n = int(tensors[0].shape[0])
    if n < 1 or any(int(t.shape[0]) != n for t in tensors):
        raise UsageError(
            "{data}: tensors with a common first dimension of at least one record",
            parameter="data",
        )
    return n


def _steps(epochs: float, q: float) -> int:
    if not (math.isfinite(epochs) and epochs > 0):
        raise UsageError(f"{{epochs}} must be a positive number, got {epochs}", parameter="epochs")
    return max(1, round(epochs / q))


def _device(module: nn.Module) -> torch.device:
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")
