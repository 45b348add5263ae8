"""`dpsynth.privacy.releases.classifier`: the DP-SGD classifier's plan, batches, noise and
shifts."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from torch import nn

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import DpEvent, Gaussian
from dpsynth.privacy.releases import classifier
from dpsynth.privacy.releases.classifier import (
    ClassifierPlan,
    ClassifierSchedule,
    classifier_plan_in,
    plan_classifier,
    random_shifts,
    shifted_copies,
    train_private_classifier,
)


def _pld_epsilon(typed: DpEvent, delta: float) -> float:
    event = typed.to_json()
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    )
    gaussian = dp_event.GaussianDpEvent(event["noise_multiplier"])
    accountant.compose(
        dp_event.PoissonSampledDpEvent(event["sampling_rate"], gaussian), event["steps"]
    )
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_the_reference_schedules_plan_meets_its_target_under_an_independent_accountant(epsilon):
    # The leaderboard's reference setting on mnist-5k: B 256, 15 epochs of 4,000 records.
    schedule = ClassifierSchedule(batch_size=256, epochs=15, lr=5e-3, max_grad_norm=1.0)
    plan = plan_classifier(epsilon, 1e-5, 4000, schedule)
    event = plan.event()
    assert event.kind == "poisson_gaussian" and event.annotation("mechanism") == "dp_classifier"
    assert plan.sampling_rate == pytest.approx(256 / 4000)
    assert plan.steps == round(15 * 4000 / 256)
    ours = compose_epsilon([event], 1e-5).epsilon
    assert epsilon * 0.99 <= ours <= epsilon  # spends (nearly) all of it, never more
    assert _pld_epsilon(event, 1e-5) <= epsilon * 1.002
    assert classifier_plan_in([Gaussian(1.0), event], 4000) == plan


def test_a_prior_spend_leaves_less_and_inf_is_not_private():
    schedule = ClassifierSchedule(batch_size=100, epochs=2)
    alone = plan_classifier(2.0, 1e-5, 1000, schedule)
    prior = [{"type": "gaussian", "noise_multiplier": 3.0, "count": 1}]
    after = plan_classifier(2.0, 1e-5, 1000, schedule, prior)
    assert after.noise_multiplier > alone.noise_multiplier
    assert compose_epsilon([*prior, after.event()], 1e-5).epsilon <= 2.0
    free = plan_classifier(math.inf, 1e-5, 1000, schedule)
    assert not free.private and free.event().kind == "non_private"
    with pytest.raises(UsageError):
        plan_classifier(1.0, 1e-5, 1000, ClassifierSchedule(lr=0.0))


class _Recorder(classifier.PoissonSampler):
    sizes: ClassVar[list[int]] = []

    def next(self):
        index = super().next()
        type(self).sizes.append(len(index))
        return index


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def _data(n: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(n, 1, 4, 4, generator=generator) * 2 - 1
    return x, torch.randint(0, 3, (n,), generator=generator)


def test_training_draws_one_poisson_batch_per_planned_step(monkeypatch):
    monkeypatch.setattr(classifier, "PoissonSampler", _Recorder)
    _Recorder.sizes = []
    x, y = _data()
    schedule = ClassifierSchedule(batch_size=30, epochs=40)  # q = 0.1, T = 400
    plan = plan_classifier(5.0, 1e-5, len(x), schedule)
    train_private_classifier(
        _tiny_model(),
        x,
        y,
        plan,
        schedule,
        sampling_generator=torch.Generator().manual_seed(2),
        noise_generator=torch.Generator().manual_seed(3),
    )
    sizes = torch.tensor(_Recorder.sizes, dtype=torch.float64)
    assert len(sizes) == plan.steps == 400
    # Binomial(300, 0.1) sizes: mean 30, variance 27 (a fixed-size batch would have none).
    assert sizes.mean().item() == pytest.approx(30, abs=1.0)
    assert sizes.var().item() == pytest.approx(27, rel=0.25)


def test_the_update_carries_the_planned_noise():
    # The noise itself is PrivateGradient's (tested in test_dpsgd.py); the classifier must
    # hand it the plan's σ, C and q·N, privately.
    x, y = _data(50)
    plan = ClassifierPlan(2.0, 0.2, 1, 0.5, 10.0)
    captured = {}

    class Spy(classifier.PrivateGradient):
        def __init__(self, *args, **kwargs):
            captured.update(kwargs)
            super().__init__(*args, **kwargs)

    original = classifier.PrivateGradient
    classifier.PrivateGradient = Spy
    try:
        train_private_classifier(
            _tiny_model(),
            x,
            y,
            plan,
            ClassifierSchedule(batch_size=10, epochs=0.2, max_grad_norm=0.5),
            sampling_generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator().manual_seed(0),
        )
    finally:
        classifier.PrivateGradient = original
    assert captured["noise_multiplier"] == 2.0
    assert captured["max_grad_norm"] == 0.5
    assert captured["expected_batch_size"] == 10.0
    assert captured["private"] is True


def test_shifted_copies_translate_with_background_fill():
    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).reshape(2, 1, 5, 5) / 50.0
    shifts = torch.tensor([[[0, 0], [1, -2]], [[-1, 1], [2, 2]]])
    out = shifted_copies(x, shifts)
    assert out.shape == (2, 2, 1, 5, 5)
    assert torch.equal(out[0, 0], x[0])
    # copy (dy=1, dx=-2): out[i, j] = x[i + 1, j - 2], -1 where that falls outside
    expected = torch.full((5, 5), -1.0)
    expected[:4, 2:] = x[0, 0, 1:, :3]
    assert torch.equal(out[0, 1, 0], expected)
    expected = torch.full((5, 5), -1.0)
    expected[1:, :4] = x[1, 0, :4, 1:]
    assert torch.equal(out[1, 0, 0], expected)
    shifts = random_shifts(3, 2, 100, torch.Generator().manual_seed(0))
    assert shifts.shape == (100, 3, 2) and shifts.abs().max() == 2 and shifts.min() == -2


def test_one_record_with_its_augmented_copies_moves_the_update_by_at_most_c():
    # Sensitivity: with K copies averaged INSIDE the record's loss, adding a record changes
    # the clipped sum by at most C (σ = 0 here, so the difference is the record's share).
    x, y = _data(20)
    model = _tiny_model()
    loss = classifier._record_loss(model)
    kwargs = dict(noise_multiplier=0.0, max_grad_norm=0.3, expected_batch_size=1.0)
    shifts = random_shifts(4, 1, 20, torch.Generator().manual_seed(5))
    copies = shifted_copies(x, shifts)
    gradient = classifier.PrivateGradient(
        model, loss, generator=torch.Generator(), grad_mode="vmap", **kwargs
    )
    gradient.compute(copies[:19], y[:19])
    without = [p.grad.clone() for p in model.parameters()]
    gradient.compute(copies, y)
    with_it = [p.grad.clone() for p in model.parameters()]
    change = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(with_it, without, strict=True)))
    assert 0 < change.item() <= 0.3 + 1e-6


def test_augmented_training_runs_and_ema_keeps_the_average():
    x, y = _data(60)
    schedule = ClassifierSchedule(batch_size=20, epochs=1, augment_copies=2, ema=0.5)
    plan = plan_classifier(3.0, 1e-5, len(x), schedule)
    model = _tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UsageError):
        train_private_classifier(
            model,
            x,
            y,
            plan,
            schedule,
            sampling_generator=torch.Generator(),
            noise_generator=torch.Generator(),
        )
    train_private_classifier(
        model,
        x,
        y,
        plan,
        schedule,
        sampling_generator=torch.Generator().manual_seed(0),
        noise_generator=torch.Generator().manual_seed(1),
        augment_generator=torch.Generator().manual_seed(2),
    )
    assert not model.training
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
