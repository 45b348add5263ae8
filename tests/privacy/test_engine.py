"""`PrivacyEngine` (DP-SGD for a user's own model): its bound against dp-accounting's PLD
accountant, its batches and noise measured, and its refusal to step past the plan."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from torch import nn
from torch.func import functional_call

from dpsynth.errors import BudgetExceededError, UsageError
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import PoissonGaussian
from dpsynth.privacy.engine import PrivacyEngine


def _problem(n: int = 1000) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    y = (x @ torch.tensor([1.0, -1.0, 0.5, 2.0]) > 0).long()
    torch.manual_seed(0)
    return nn.Linear(4, 2), x, y


def _loss(model: nn.Module):
    def loss_fn(params, buffers, record, label):
        logits = functional_call(model, (params, buffers), (record.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, label.unsqueeze(0))

    return loss_fn


def _pld_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    accountant.compose(dp_event.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def test_the_calibrated_training_meets_its_target_by_an_independent_accountant() -> None:
    model, x, y = _problem()
    engine = PrivacyEngine(secret=1)
    training = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5), data=(x, y),
        loss_fn=_loss(model), target_epsilon=2.0, target_delta=1e-5, epochs=2,
        expected_batch_size=100, max_grad_norm=1.0,
    )  # fmt: skip
    assert training.sampling_rate == pytest.approx(0.1) and training.steps == 20
    assert engine.get_epsilon(1e-5) == 0.0  # nothing spent before a step
    for batch in training.batches():
        training.step(*batch)
    assert training.steps_taken == 20
    claimed = engine.get_epsilon(1e-5)
    reference = _pld_epsilon(training.noise_multiplier, 0.1, 20, 1e-5)
    # the proven bound covers dp-accounting's PLD estimate and is tight: σ is the smallest
    assert reference <= claimed * 1.001 and claimed <= 2.0
    assert claimed >= 0.95 * 2.0
    assert engine.events() == [PoissonGaussian(training.noise_multiplier, 0.1, 20)]
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.85  # it learns


def test_no_step_past_the_plan_and_earlier_spends_count() -> None:
    model, x, y = _problem(200)
    engine = PrivacyEngine(secret=2)
    prior = [PoissonGaussian(2.0, 0.1, 50)]
    training = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=(x, y),
        loss_fn=_loss(model), target_epsilon=3.0, target_delta=1e-5, epochs=1,
        expected_batch_size=20, max_grad_norm=1.0, prior_events=prior,
    )  # fmt: skip
    for batch in training.batches():
        training.step(*batch)
    spent = engine.get_epsilon(1e-5)
    assert spent <= 3.0
    # a second model without prior_events still counts the earlier spend
    again = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=(x, y),
        loss_fn=_loss(model), noise_multiplier=5.0, max_grad_norm=1.0, expected_batch_size=20,
    )  # fmt: skip
    again.step(x[:2], y[:2])
    assert engine.get_epsilon(1e-5) > spent
    engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=(x, y),
        loss_fn=_loss(model), target_epsilon=10.0, target_delta=1e-5, epochs=1,
        expected_batch_size=20, max_grad_norm=1.0,
    )  # fmt: skip
    # the prior given earlier is kept, counted once
    expected = compose_epsilon([*prior, *engine.events()], 1e-5).epsilon
    assert engine.get_epsilon(1e-5) == pytest.approx(expected)
    with pytest.raises(UsageError):
        training.step(x[:2], y[:2])
    with pytest.raises(BudgetExceededError):  # the prior spend alone passes a tiny target
        engine.make_private_with_epsilon(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=(x, y),
            loss_fn=_loss(model), target_epsilon=0.1, target_delta=1e-5, epochs=1,
            expected_batch_size=20, max_grad_norm=1.0, prior_events=prior,
        )  # fmt: skip


def test_batches_are_poisson_and_the_noise_has_its_scale() -> None:
    n, q, sigma, clip = 400, 0.05, 2.0, 0.5
    model, x, y = _problem(n)
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    training = PrivacyEngine(secret=3).make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0), data=(x, y),
        loss_fn=_loss(model), noise_multiplier=sigma, max_grad_norm=clip,
        expected_batch_size=q * n, epochs=40,
    )  # fmt: skip
    sizes, noise = [], []
    for batch in training.batches():
        sizes.append(len(batch[0]))
        # an empty batch's gradient is the noise alone: std σ·C / (qN) per coordinate
        training.step(x[:0], y[:0])
        noise.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert len(sizes) == 800
    mean = sum(sizes) / len(sizes)
    assert abs(mean - q * n) < 4 * math.sqrt(q * (1 - q) * n / len(sizes))
    measured = torch.stack(noise).std().item()
    expected = sigma * clip / (q * n)
    assert measured == pytest.approx(expected, rel=0.05)


def test_a_known_secret_replays_and_a_fresh_one_does_not() -> None:
    def first_batch(secret: int | None) -> torch.Tensor:
        model, x, y = _problem(300)
        training = PrivacyEngine(secret=secret).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data=(x, y),
            loss_fn=_loss(model), noise_multiplier=1.0, max_grad_norm=1.0,
            expected_batch_size=30,
        )  # fmt: skip
        return next(training.batches())[0]

    assert torch.equal(first_batch(7), first_batch(7))
    assert not torch.equal(first_batch(None), first_batch(None))
