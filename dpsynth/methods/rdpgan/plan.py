"""RDP-GAN's privacy plan: the data-independent σ schedule, calibrated before any data read,
one ledger event per distinct σ, and each loop step's σ read back from those events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.methods.base import ClippedGaussianSum, PlanFacts, PrivacyPlan
from dpsynth.methods.blocks import loop_plan
from dpsynth.methods.rdpgan import schedule as sched
from dpsynth.privacy.accounting.calibration import calibrate_schedule
from dpsynth.privacy.accounting.events import PoissonGaussian

MECHANISM = "rdpgan D step: DP-SGD on the real-loss term (clip C, noise σ·C, divide by qN)"


def noise_segments(config: Mapping[str, Any]) -> tuple[list[tuple[float, int]], float | None]:
    """The schedule as (factor, D steps) runs in order, and the rounding grid's ratio."""
    raw = sched.factors(
        str(config["schedule"]),
        int(config["n_g"]),
        float(config["decay"]),
        int(config["step_every"]),
    )
    rounded, ratio = sched.rounded_factors(raw)
    return sched.segments(rounded, int(config["n_d"])), ratio


def step_sigmas(plan: PrivacyPlan) -> tuple[list[int], list[float]]:
    """Cumulative step ends and σ of the plan's events, in order (σ of step s: first end > s)."""
    ends, sigmas, total = [], [], 0
    for event in plan.events:
        stored = event.to_json()  # steps: a field, or a non-private event's annotation
        if stored.get("mechanism") in ("dp_classifier", "frequency_model"):
            continue  # the shared stages' releases (methods.blocks), not the loop's steps
        total += int(stored["steps"])
        ends.append(total)
        sigmas.append(float(stored.get("noise_multiplier", 0.0)))
    return ends, sigmas


def plan_rdpgan(facts: PlanFacts) -> PrivacyPlan:
    """The whole σ schedule, calibrated before any data access; one event per distinct σ.

    z₀ (the schedule's first σ) is the smallest value whose composed ε over all
    n_g·n_d D steps meets the target: the run always has the preset's length, and the
    decay shifts noise from late to early steps rather than shortening the run.
    """
    info, target, config, prior_events = facts.unpacked()
    batch = int(config["batch_size"])
    steps = int(config["n_g"]) * int(config["n_d"])
    q = min(1.0, batch / info.n)
    if not target.private:
        return PrivacyPlan.non_private_loop(target.delta, q, steps, info.n)
    segments, ratio = noise_segments(config)
    cal = calibrate_schedule(target.epsilon, target.delta, q, segments, prior_events)
    clip = float(config["max_grad_norm"])
    events, start = [], 0
    for factor, count in segments:
        about = {
            "mechanism": MECHANISM,
            "max_grad_norm": clip,
            "schedule": str(config["schedule"]),
            "first_step": start,
        }
        events.append(PoissonGaussian(cal.noise_multiplier * factor, q, count, annotations=about))
        start += count
    sigmas = [e.noise_multiplier for e in events]
    notes = [
        f"schedule {config['schedule']}: z₀ = {cal.noise_multiplier:.4g}, σ from "
        f"{max(sigmas):.4g} down to {min(sigmas):.4g} in {len(events)} ledger event(s)",
        "adjacency add/remove one record; each D step is one Poisson-subsampled Gaussian",
    ]
    if ratio is not None:
        notes.append(
            f"schedule factors rounded down on a geometric grid of ratio {ratio:.4g} "
            "(less noise than the formula, exactly as accounted)"
        )
    bounds = (cal.epsilon, cal.total_epsilon, cal.accountant)
    clipped = ClippedGaussianSum(min(sigmas), clip)
    return loop_plan(target, (q, steps, info.n), events, bounds, clipped, (*notes, *cal.notes))
