"""What a plan's mechanism events say about the shared training loop, and its checks.

The loop runs with the plan's σ, q and T (`PrivacyPlan`); the ledger knows only the plan's
events. These helpers read the loop's parameters back out of the events (merging the phases a
backend records separately, subtracting the steps that read no data) so that an edited plan is
refused before it runs, and name a run whose claimed ε is not a proven bound.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence

from dpsynth.errors import AnchorError
from dpsynth.privacy.accounting.events import (
    AnyEvent,
    DpEvent,
    NonPrivate,
    PoissonGaussian,
    events_from_json,
)

# The `mechanism` annotations of the one-off stages a backend may put beside its loop
# (`methods.blocks`): the frequency model (`privacy/releases/frequency.py`) and the DP classifier
# of a teacher (`privacy/releases/classifier.py`), whose events take these names from here.
# Their events are accounted like any other, but they are not the loop's steps, so a noise
# schedule is read from the other events.
FREQUENCY_MODEL_MECHANISM = "frequency_model"
DP_CLASSIFIER_MECHANISM = "dp_classifier"
_STAGE_MECHANISMS = (FREQUENCY_MODEL_MECHANISM, DP_CLASSIFIER_MECHANISM)


def _same_events(a: Sequence[DpEvent], b: Sequence[DpEvent]) -> bool:
    """Equal as JSON (the form the events take in config.json and the ledger)."""
    return json.dumps([e.to_json() for e in a], sort_keys=True) == json.dumps(
        [e.to_json() for e in b], sort_keys=True
    )


def loop_events(
    private: bool, noise_multiplier: float, sampling_rate: float, steps: int
) -> DpEvent:
    """The event that the shared training loop's parameters imply (σ, q, T, or non-private)."""
    if not private:
        return NonPrivate(annotations={"sampling_rate": float(sampling_rate), "steps": int(steps)})
    return PoissonGaussian(float(noise_multiplier), float(sampling_rate), int(steps))


# The annotation by which an event declares loop steps that read no data (they cost nothing).
IDLE_STEPS_KEY = "loop_steps_without_reads"


def idle_loop_steps(events: Sequence[DpEvent]) -> int:
    """How many of the loop's steps read no data, as the plan's events declare (a value that
    is not a whole number ≥ 0 is an edited plan: AnchorError)."""
    total = 0
    for event in events:
        value = event.annotation(IDLE_STEPS_KEY, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AnchorError(f"the plan's {IDLE_STEPS_KEY} must be a whole number ≥ 0")
        total += value
    return total


def _merged_loop_events(events: Sequence[DpEvent]) -> list[PoissonGaussian]:
    """The events as the accountant composes them: annotations dropped, and the steps of
    events with the same type, σ and q added up (a backend may record the phases of one loop,
    all at the loop's σ and q, as separate annotated events)."""
    merged: dict[tuple, PoissonGaussian] = {}
    for event in events:
        if not isinstance(event, PoissonGaussian) or not isinstance(event.steps, int):
            continue
        key = (event.noise_multiplier, event.sampling_rate)
        if key in merged:
            merged[key] = dataclasses.replace(merged[key], steps=merged[key].steps + event.steps)
        else:
            merged[key] = dataclasses.replace(event, annotations=())
    return list(merged.values())


def _is_schedule(
    events: Sequence[DpEvent],
    private: bool,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
) -> bool:
    """True for a noise schedule: only `poisson_gaussian` events, all at the loop's q, whose
    steps add up to the loop's T and whose smallest σ is the plan's σ.

    A backend with a σ schedule (rdpgan) takes each step's σ from these events, which the
    ledger holds; the plan's single σ is their minimum, so every ε computed from it alone (the
    loop's progress display) is an upper bound on the schedule's.
    """
    loops = [e for e in events if isinstance(e, PoissonGaussian)]
    if not private or not events or len(loops) != len(events):
        return False
    try:
        rates = {float(e.sampling_rate) for e in loops}
        total = sum(int(e.steps) for e in loops)
        smallest = min(float(e.noise_multiplier) for e in loops)
    except (TypeError, ValueError):
        return False
    return (
        rates == {float(sampling_rate)}
        and total == int(steps)
        and (smallest == float(noise_multiplier))
    )


def check_plan_parameters(
    events: Sequence[AnyEvent],
    *,
    private: bool,
    noise_multiplier: float | None,
    sampling_rate: float,
    steps: int,
    run_name: str,
) -> None:
    """Refuse a plan whose loop parameters (what the trainer uses) are not among its events.

    The loop runs with the plan's σ, q and T; the ledger knows only the events. An edited σ in
    `config.json` that left the events alone would otherwise run at another noise than the one
    accounted for. A plan without a loop Gaussian sum (`noise_multiplier` None: mst, aim) must
    declare every loop step as reading no Poisson batch. `events` may be the dicts of
    config.json; they are read as typed events.
    """
    events = events_from_json(events)
    if noise_multiplier is None:
        if int(steps) - idle_loop_steps(events) != 0:
            raise AnchorError(
                f"{run_name}: the plan in config.json has loop steps that read data but no "
                "noise for them; config.json was edited"
            )
        return
    if private and not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise AnchorError(f"{run_name}: the plan in config.json has no valid noise multiplier")
    # Loop steps that read no data (DPAF's generator steps after its one release) are declared
    # by the event they follow; only the remaining steps are the loop's Poisson reads.
    steps = int(steps) - idle_loop_steps(events)
    if steps == 0:
        # No loop step reads a Poisson batch (a marginal method's rounds read the whole table
        # through its events): there are no loop parameters to check against the events.
        return
    expected = loop_events(private, noise_multiplier, sampling_rate, steps)
    exact = any(_same_events([expected], [event]) for event in events)
    merged = any(_same_events([expected], [e]) for e in _merged_loop_events(events))
    loop_only = [e for e in events if e.annotation("mechanism") not in _STAGE_MECHANISMS]
    if (
        not exact
        and not merged
        and not _is_schedule(loop_only, private, noise_multiplier, sampling_rate, steps)
    ):
        raise AnchorError(
            f"{run_name}: the plan in config.json (σ={noise_multiplier:g}, q={sampling_rate:g}, "
            f"T={steps}) does not match its mechanism events; config.json was edited"
        )


NOT_DP_LABEL = "not a DP guarantee"
"""The label of a `non_private` event whose run added noise under a claimed ε that is not a
proven bound (a paper's own accounting, reproduced behind an explicit flag). Such a run counts
as not private everywhere: its dataset's total ε is inf and its ε never enters a statement."""


def not_dp_label(events: Iterable[AnyEvent]) -> str | None:
    """The label (with its mechanism) of the first labelled `non_private` event, or None.

    `events` may be a ledger line's stored dicts, read as they are (a line of a kind this
    version does not know is no labelled `non_private` event)."""
    for event in events:
        stored = event.to_json() if isinstance(event, DpEvent) else event
        if stored.get("type") == "non_private" and stored.get("label"):
            mechanism = stored.get("mechanism")
            return f"{stored['label']}: {mechanism}" if mechanism else str(stored["label"])
    return None
