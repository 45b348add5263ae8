"""One white-box run of a plan whose releases and subsampled mechanisms run through their code.

A plan may put one-shot releases in front of its steps: the frequency model
(`auditing/frequency.py`, through `frequency_statistics`) and the central images
(`auditing/central.py`, through `noisy_statistics`); and it may have subsampled mechanisms with
code of their own: the DP classifier of a backend's teacher (`auditing/teacher.py`, through
`train_private_classifier`) and DPAF's windows (`auditing/dpaf.py`, through `noisy_feature_sum`
and `private_gradient_sum`). Each is found by its event's annotations and audited by its own
scorer (called "releases" below); the plan's other events (DP-SGD steps, the
functional mechanism) by `rest_scores`, all on the same canaries and the audit's one stream.
A canary's evidence from independent mechanisms adds up: the log-likelihood ratios sum
("llr"), the standardised peaks take the largest ("max"), and each release's own ratio is a
score of its own, so that a wrong release is not drowned by many quiet steps. Each release
is also a part judged against its own event's claim (the accountant's ε of that event alone),
as a release that holds a small share of ε can be wrong by a large factor without the whole
plan's claim being exceeded by what one run shows. The headline and the parts are each tested
at 1 − β/(1 + releases), so that all hold together at 1 − β.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dpsynth.auditing import central, dpaf, frequency, teacher
from dpsynth.auditing.guesses import GuessOutcome, PartOutcome, best_guesses, pooled_runs
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, PoissonGaussian

__all__ = ["RELEASE_BREAKS", "audit_with_releases", "release_name", "split_releases"]

# The scorer of each release, by its event's `mechanism`.
_SCORERS = {
    frequency.MECHANISM: frequency.frequency_scores,
    central.MECHANISM: central.central_scores,
}
# Poisson-subsampled mechanisms with code of their own: the DP classifier (a backend's
# teacher) and DPAF's windows.
_STEP_SCORERS = {teacher.MECHANISM: teacher.classifier_scores}
RELEASE_BREAKS = ("noise", "sensitivity")

# The other events' scores for the same canaries and stream: (events, included, generator).
RestScores = Callable[[list[DpEvent], torch.Tensor, torch.Generator], dict[str, torch.Tensor]]


def split_releases(events: Sequence[DpEvent]) -> tuple[list[DpEvent], list[DpEvent]]:
    """(the private one-shot releases this module audits by their own code, the others)."""
    releases: list[DpEvent] = []
    rest: list[DpEvent] = []
    for event in events:
        (releases if _scorer(event) is not None else rest).append(event)
    return releases, rest


def _scorer(event: DpEvent) -> Callable[..., dict[str, torch.Tensor]] | None:
    """The scorer that runs `event` through its own code (None: the generic step audit)."""
    if isinstance(event, Gaussian):
        if event.annotation("phase") == dpaf.ONCE_PHASE:
            return dpaf.once_scores
        return _SCORERS.get(event.annotation("mechanism"))
    if dpaf.is_window_event(event):
        return dpaf.window_scores
    if isinstance(event, PoissonGaussian):
        return _STEP_SCORERS.get(event.annotation("mechanism"))
    return None


def release_name(event: DpEvent) -> str:
    """A part's short name: the mechanism annotation, DPAF's windows as such."""
    if dpaf.is_window_event(event):
        return "dpaf windows"
    if event.annotation("phase") == dpaf.ONCE_PHASE:
        return "dpaf release"
    return str(event.annotation("mechanism")).replace("_", " ")


def audit_with_releases(
    events: Sequence[DpEvent],
    shape: Sequence[int],
    rest_scores: RestScores,
    delta: float,
    canaries: int,
    confidence: float,
    seed: int | None = None,
    break_mode: str | None = None,
    runs: int = 1,
) -> tuple[GuessOutcome, list[PartOutcome]]:
    """`runs` runs: each release through its scorer, the other events through `rest_scores`;
    the headline guess over the whole plan and one part per release."""
    releases, rest = split_releases(events)
    if not releases:
        raise ValueError("the plan has no release this audit runs by its own code")

    def score_run(included: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        # each scorer applies the break modes it knows and ignores the others
        parts = [
            _scorer(event)(event, shape, included, generator, break_mode)  # type: ignore[misc]
            for event in releases
        ]
        if rest:
            parts.append(rest_scores(rest, included, generator))
        scores = {
            "llr": torch.stack([p["llr"] for p in parts]).sum(0),
            "max": torch.stack([p["max"] for p in parts]).max(0).values,
        }
        for index, part in enumerate(parts[: len(releases)]):
            scores[f"{index}:llr"], scores[f"{index}:max"] = part["llr"], part["max"]
        return scores

    pooled, included = pooled_runs(canaries, runs, seed, score_run)
    headline = {"llr": pooled["llr"], "max": pooled["max"]}
    if len(releases) > 1 or rest:
        for index, event in enumerate(releases):
            headline[release_name(event)] = pooled[f"{index}:llr"]
    split = 1.0 - (1.0 - confidence) / (1 + len(releases))
    own = [
        PartOutcome(
            f"{release_name(event)} (its own event)",
            compose_epsilon([event], delta).epsilon,
            best_guesses(
                {"llr": pooled[f"{index}:llr"], "max": pooled[f"{index}:max"]},
                included,
                delta,
                split,
                independent=True,
                family=[event],
            ),
            int(included.numel()),
        )
        for index, event in enumerate(releases)
    ]
    headline_outcome = best_guesses(
        headline, included, delta, split, independent=True, family=list(events)
    )
    return headline_outcome, own
