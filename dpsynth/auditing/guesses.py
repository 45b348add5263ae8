"""The audit's judgement of one or more runs' canary scores, and the runs themselves.

`best_guesses` turns each canary's scores into an ε lower bound: the one-run test (`bound.py`:
top scores guessed "in", bottom ones "out") and, where the canaries' evidence is independent,
the trials test (`trials.py`), each at half of β. `pooled_runs` runs a mechanism's scorer
several times on fresh canaries of the audit's seeded stream and pools them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dpsynth.auditing.bound import epsilon_lower_bound
from dpsynth.auditing.family import FamilyOutcome, family_bound
from dpsynth.auditing.trials import TrialsOutcome, trials_bound
from dpsynth.errors import UsageError
from dpsynth.privacy.accounting.events import DpEvent

__all__ = [
    "TRIALS_FROM",
    "GuessOutcome",
    "PartOutcome",
    "ScoreRun",
    "best_guesses",
    "draw_canaries",
    "pooled_runs",
]

# Guess counts tried, as fractions of m: each (k_in, k_out) is one test, and the confidence of
# each is raised (Bonferroni) so that the best of them still holds at the stated confidence.
_GUESS_FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25)


# From this many independent trials on, the trials test judges (it then has the power to tell
# ε = 1 from ε = 2); below it, the one-run test (stronger on a few thousand canaries). The
# choice is fixed before any run, so each holds at the full confidence.
TRIALS_FROM = 10_000


@dataclass(frozen=True)
class GuessOutcome:
    """The audit's result: the one-run test's best guessing rule (guesses made, correct ones,
    its bound), or the trials test's region where that test judged (`trials`), and the family
    test's beside it where the mechanism's family was given (`family`)."""

    guesses_in: int = 0
    guesses_out: int = 0
    correct: int = 0
    one_run_bound: float = 0.0
    trials: TrialsOutcome | None = None
    family: FamilyOutcome | None = None

    @property
    def guesses(self) -> int:
        """All guesses made (abstentions excluded)."""
        return self.guesses_in + self.guesses_out

    @property
    def lower_bound(self) -> float:
        """The judging tests' ε lower bound (the larger of the trials and family tests')."""
        if self.trials is None:
            return self.one_run_bound
        return max(self.trials.lower_bound, self.family_bound)

    @property
    def family_bound(self) -> float:
        """The family test's ε lower bound (0 where it did not run)."""
        return 0.0 if self.family is None else self.family.lower_bound

    @property
    def test(self) -> str:
        """The test whose bound is reported: "family", "trials" or "one-run"."""
        if self.trials is None:
            return "one-run"
        return "family" if self.family_bound > self.trials.lower_bound else "trials"


@dataclass(frozen=True)
class PartOutcome:
    """One event's audit: its own claimed ε beside the lower bound, and the guesses."""

    mechanism: str
    claimed_epsilon: float
    outcome: GuessOutcome
    canaries: int

    @property
    def leaks(self) -> bool:
        """True when the lower bound exceeds this event's own claim."""
        return self.outcome.lower_bound > self.claimed_epsilon

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "mechanism": self.mechanism,
            "claimed_epsilon": self.claimed_epsilon,
            "lower_bound": self.outcome.lower_bound,
            "canaries": self.canaries,
            "guesses_in": self.outcome.guesses_in,
            "guesses_out": self.outcome.guesses_out,
            "correct": self.outcome.correct,
            "test": self.outcome.test,
            "trials": None if self.outcome.trials is None else self.outcome.trials.to_json(),
            "family": None if self.outcome.family is None else self.outcome.family.to_json(),
            "verdict": "FAIL" if self.leaks else "pass",
        }


def best_guesses(
    scores: Mapping[str, Tensor],
    included: Tensor,
    delta: float,
    confidence: float,
    independent: bool = False,
    trial_mask: Tensor | None = None,
    family: Sequence[DpEvent] | None = None,
) -> GuessOutcome:
    """Guess "in" for the top scores and "out" for the bottom ones; the best bound over a fixed
    grid of (score, guess counts) rules, each tested at 1 − (1 − confidence)/(number of rules)
    (a union bound, so the best of them holds at `confidence`).

    `independent`: the canaries' scores are independent given `included` (each canary's
    evidence on coordinates of its own: every white-box design). With at least `TRIALS_FROM`
    such trials the trials test (`auditing/trials.py`) judges instead. `trial_mask` (bool [m])
    keeps the canaries that are independent trials where only some are (one of each pair that
    competes in one selection). `family`: the events whose noise family the trials are of;
    the family test (`auditing/family.py`) then judges beside the trials test, each at half
    of β.
    """
    keep = torch.ones_like(included) if trial_mask is None else trial_mask
    if independent and int(keep.sum()) >= TRIALS_FROM:
        kept = {name: score[keep] for name, score in scores.items()}
        if not family:
            return GuessOutcome(trials=trials_bound(kept, included[keep], delta, confidence))
        each = 1.0 - (1.0 - confidence) / 2.0
        return GuessOutcome(
            trials=trials_bound(kept, included[keep], delta, each),
            family=family_bound(kept, included[keep], family, delta, each),
        )
    m = int(included.numel())
    counts = sorted({max(1, round(f * m)) for f in _GUESS_FRACTIONS})
    rules = [(k, 0) for k in counts] + [(k, k) for k in counts if 2 * k <= m]
    per_test = 1.0 - (1.0 - confidence) / (len(rules) * len(scores))
    best: GuessOutcome | None = None
    for score in scores.values():
        outcome = _best_rule(score, included, rules, delta, per_test)
        if best is None or outcome.lower_bound > best.lower_bound:
            best = outcome
    assert best is not None
    return best


def _best_rule(
    score: Tensor,
    included: Tensor,
    rules: Sequence[tuple[int, int]],
    delta: float,
    per_test: float,
) -> GuessOutcome:
    """The best (k_in, k_out) rule for one score, each at confidence `per_test`."""
    m = int(score.numel())
    ranked_in = included[torch.argsort(score, descending=True, stable=True)]
    best: GuessOutcome | None = None
    for k_in, k_out in rules:
        correct = int(ranked_in[:k_in].sum())
        if k_out:
            correct += int((~ranked_in[m - k_out :]).sum())
        bound = epsilon_lower_bound(m, k_in + k_out, correct, delta, per_test)
        outcome = GuessOutcome(k_in, k_out, correct, bound)
        if best is None or outcome.lower_bound > best.lower_bound:
            best = outcome
    assert best is not None
    return best


def draw_canaries(canaries: int, seed: int | None) -> tuple[torch.Generator, Tensor]:
    """The audit's generator (seeded, or fresh from the OS) and which canaries are in (p = 1/2)."""
    if canaries < 2:
        raise UsageError(f"--canaries must be at least 2, got {canaries}")
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    included = torch.rand(canaries, generator=generator) < 0.5
    return generator, included


# One run's scores of its canaries: (included [m], the audit's generator) → {name: [m]}.
ScoreRun = Callable[[Tensor, torch.Generator], dict[str, Tensor]]


def pooled_runs(
    canaries: int, runs: int, seed: int | None, score_run: ScoreRun
) -> tuple[dict[str, Tensor], Tensor]:
    """`runs` independent runs of the mechanism, each on `canaries` canaries of its own (each in
    with probability 1/2), on one seeded stream → (every score over all runs' canaries
    [runs·m], which were in [runs·m]).

    A canary takes part in one run only, so the runs together are one mechanism over runs·m
    canaries: the one-run test holds for it, and the trials test gets runs·m trials (the
    multiple-run audit) with each run's memory that of m canaries.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError(f"--runs must be a positive integer, got {runs!r}")
    generator, included = draw_canaries(canaries, seed)
    scores: list[dict[str, Tensor]] = []
    inclusions: list[Tensor] = []
    for run in range(runs):
        if run:
            included = torch.rand(canaries, generator=generator) < 0.5
        scores.append(score_run(included, generator))
        inclusions.append(included)
    pooled = {name: torch.cat([s[name] for s in scores]) for name in scores[0]}
    return pooled, torch.cat(inclusions)
