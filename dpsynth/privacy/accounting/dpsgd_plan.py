"""The plan of a run whose only mechanism is DP-SGD's loop: σ calibrated for T
Poisson-subsampled Gaussian steps at rate q (the plan most image backends start from)."""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.calibration import calibrate_noise
from dpsynth.privacy.accounting.compose import poisson_gaussian_event
from dpsynth.privacy.accounting.events import AnyEvent
from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan, PrivacyTarget


def plan_poisson_gaussian(
    target: PrivacyTarget,
    n: int,
    expected_batch_size: float,
    steps: int,
    max_grad_norm: float,
    prior_events: Sequence[AnyEvent] = (),
) -> PrivacyPlan:
    """The PrivacyPlan of a DP-SGD-like run: `steps` Poisson-subsampled Gaussian steps.

    `target.epsilon` is the data set's total budget after this run (earlier spends in
    `prior_events` are composed in). A non-private target (ε = inf) gives a plan without
    noise or clipping whose only event is `non_private`.
    """
    if n < 1:
        raise UsageError("the data set is empty")
    if steps < 1:
        raise UsageError(f"steps must be at least 1, got {steps}")
    q = min(1.0, float(expected_batch_size) / n)
    if not target.private:
        return PrivacyPlan.non_private_loop(target.delta, q, steps, n)
    cal = calibrate_noise(target.epsilon, target.delta, q, steps, prior_events)
    return PrivacyPlan(
        private=True,
        target_epsilon=float(target.epsilon),
        delta=target.delta,
        sampling_rate=q,
        steps=steps,
        expected_batch_size=q * n,
        events=(poisson_gaussian_event(cal.noise_multiplier, q, steps),),
        epsilon_bound=cal.epsilon,
        total_epsilon_bound=cal.total_epsilon,
        accountant=cal.accountant,
        gaussian_sum=ClippedGaussianSum(cal.noise_multiplier, float(max_grad_norm)),
        notes=cal.notes,
    )
