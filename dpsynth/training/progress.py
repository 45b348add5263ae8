"""Progress reports of the loop, the notice of a stop request, and the ε upper bound it
shows after t steps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dpsynth.data.engines import PassCallback
from dpsynth.privacy.accounting.compose import epsilon_for
from dpsynth.privacy.accounting.plan import PrivacyPlan

# ε shown while training is a valid upper bound computed on a coarser accountant mesh (cheap).
_PROGRESS_REL_ERROR = 0.05


_PROGRESS_EPSILON_POINTS = 20


@dataclass(frozen=True)
class TrainProgress:
    """One progress report from the loop to whoever renders it."""

    step: int
    total_steps: int
    # The mean loss of the step's private batch, computed without noise: None unless the
    # data owner asked for it (--log-private-loss), so that no default display shows it.
    loss: float | None
    epsilon: float


ProgressCallback = Callable[[TrainProgress], None]


@dataclass(frozen=True)
class StopNotice:
    """A first SIGINT or SIGTERM arrived: the loop stops at the next step boundary, after
    the step in progress, with a checkpoint (a second signal stops at once, without one)."""

    signal: str  # "SIGINT" or "SIGTERM"
    steps_done: int
    total_steps: int


StopCallback = Callable[[StopNotice], None]


def stop_callback(progress: ProgressCallback | None) -> StopCallback | None:
    """The progress callback's `on_stop_request` method, when it has one: how the renderer
    hears of a stop request as soon as it arrives (a step may take minutes), without another
    argument through `train`. Called from the signal handler, so it must be quick."""
    hook = getattr(progress, "on_stop_request", None)
    return hook if callable(hook) else None


def pass_callback(progress: ProgressCallback | None) -> PassCallback | None:
    """The progress callback's `on_pass` method, when it has one: how the renderer hears of
    each pass an out-of-core engine makes over a table (`dpsynth.data.engines.PassProgress`:
    rows read out of N, public facts only)."""
    hook = getattr(progress, "on_pass", None)
    return hook if callable(hook) else None


class EpsilonCurve:
    """ε upper bounds of this run after t steps, computed at a few points and reused."""

    def __init__(self, plan: PrivacyPlan) -> None:
        self.plan = plan
        points = max(1, min(_PROGRESS_EPSILON_POINTS, plan.steps))
        self.marks = sorted({max(1, round(plan.steps * (k + 1) / points)) for k in range(points)})
        self.cache: dict[int, float] = {}
        self.one_off_events = tuple(
            e
            for e in plan.events
            if e.kind not in ("poisson_gaussian", "non_private")
            or e.annotation("mechanism") == "dp_classifier"  # a DP teacher's steps: not the loop's
        )

    def at(self, step: int) -> float:
        """Upper bound on ε after `step` steps, taken at the next mark (never an under-count)."""
        if not self.plan.private:
            return math.inf
        if step <= 0:
            return 0.0
        mark = next((m for m in self.marks if m >= step), self.plan.steps)
        if mark >= self.plan.steps or self.plan.gaussian_sum is None:
            # The plan's certified (fine-mesh) bound for the whole run; a plan without a loop
            # Gaussian sum (mst, aim) counts all its events from the first step on.
            return self.plan.epsilon_bound
        if mark not in self.cache:
            # ε grows with the number of steps, so the whole run's bound caps every prefix.
            # The plan's one-off releases (a warm start's central images, DPAF's once
            # release) are counted from the first step on, wherever the loop makes them.
            self.cache[mark] = min(
                self.plan.epsilon_bound,
                epsilon_for(
                    self.plan.noise_multiplier,
                    self.plan.sampling_rate,
                    mark,
                    self.plan.delta,
                    self.one_off_events,
                    rel_error=_PROGRESS_REL_ERROR,
                ).epsilon,
            )
        return self.cache[mark]
