"""`loop_plan`: the `PrivacyPlan` of a backend's private training loop once its events are
calibrated (dpaf's strict and once plans, rdpgan's σ schedule)."""

from __future__ import annotations

from collections.abc import Sequence

from dpsynth.privacy.accounting.events import DpEvent
from dpsynth.privacy.accounting.plan import ClippedGaussianSum, PrivacyPlan, PrivacyTarget


def loop_plan(
    target: PrivacyTarget,
    loop: tuple[float, int, int],
    events: Sequence[DpEvent],
    bounds: tuple[float, float, str],
    gaussian_sum: ClippedGaussianSum,
    notes: Sequence[str],
) -> PrivacyPlan:
    """The private plan of a loop of T steps, each reading a Poisson(q) batch of the N records
    (`loop` = (q, T, N)), whose `events` the accountant bounds by `bounds` = (ε of this run
    alone, ε with the data set's earlier spends, the accountant's name)."""
    rate, steps, n = loop
    alone, total, accountant = bounds
    return PrivacyPlan(
        steps=steps,
        sampling_rate=rate,
        expected_batch_size=rate * n,
        events=tuple(events),
        epsilon_bound=alone,
        total_epsilon_bound=total,
        private=True,
        target_epsilon=float(target.epsilon),
        delta=target.delta,
        accountant=accountant,
        gaussian_sum=gaussian_sum,
        notes=tuple(notes),
    )
