"""White-box one-run audit of the DP-SGD step every backend's plan describes.

Each backend's plan lists its mechanisms as ledger events; a `poisson_gaussian` event (σ, q,
T, with the plan's clipping norm C) is what the accountant's ε is a proof about. The audit
runs that event through the privacy layer's own code: the real `PoissonSampler` at q and a
`PrivateGradient` with σ and C, for T steps, on a stand-in model whose per-record gradient is
the record itself. The records are m Dirac canaries (the coordinate directions e_i scaled to
norm `CANARY_NORM_FACTOR`·C, so clipping has work to do), each in the audited data set with
probability 1/2. After each step the released noisy sum's coordinate i is canary i's evidence;
it has two scores, both fixed before the run: the log-likelihood ratio of "in" against "out"
under the plan's nominal (σ, q, C) summed over the steps (best when a canary is sampled often),
and the largest standardised value over the steps (best when it is sampled once or twice, or
when the mechanism is not the nominal one). Top scores are guessed "in", bottom scores "out"
(the rest abstain), and `bound.epsilon_lower_bound` turns the correct guesses into an ε lower
bound; the confidence is split over every (score, guess count) rule tried (a union bound).

No other record shares the sum: that is the worst case for privacy (the most an auditor can
see), and it involves no user data at all. `break_mode` is a test-only switch that breaks the
mechanism inside the audit's own run ("clip": no clipping; "noise": σ/4) to show the audit's
power; it never touches a real train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dpsynth.audit.bound import epsilon_lower_bound
from dpsynth.errors import UsageError
from dpsynth.privacy.mechanisms.dpsgd import PrivateGradient
from dpsynth.privacy.mechanisms.poisson import PoissonSampler

__all__ = [
    "BREAK_MODES",
    "CANARY_NORM_FACTOR",
    "GuessOutcome",
    "MechanismStep",
    "PartOutcome",
    "audit_events",
    "best_guesses",
    "canary_scores",
    "draw_canaries",
    "mechanism_steps",
]

BREAK_MODES = ("clip", "noise")
# A canary's gradient norm in units of C: above 1 so that clipping is exercised; 4 makes
# "no clipping" as strong a break as σ/4.
CANARY_NORM_FACTOR = 4.0
_NOISE_BREAK_DIVISOR = 4.0
# Guess counts tried, as fractions of m: each (k_in, k_out) is one test, and the confidence of
# each is raised (Bonferroni) so that the best of them still holds at the stated confidence.
_GUESS_FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25)


@dataclass(frozen=True)
class MechanismStep:
    """One `poisson_gaussian` event of a plan: T steps at rate q with noise multiplier σ."""

    noise_multiplier: float
    sampling_rate: float
    steps: int


@dataclass(frozen=True)
class GuessOutcome:
    """The best guessing rule's result: guesses made, correct ones and the ε lower bound."""

    guesses_in: int
    guesses_out: int
    correct: int
    lower_bound: float

    @property
    def guesses(self) -> int:
        """All guesses made (abstentions excluded)."""
        return self.guesses_in + self.guesses_out


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
            "verdict": "FAIL" if self.leaks else "pass",
        }


def mechanism_steps(events: Sequence[dict[str, Any]]) -> list[MechanismStep]:
    """The plan's events as DP-SGD steps; UsageError naming any event this audit cannot run."""
    steps: list[MechanismStep] = []
    for event in events:
        if event.get("type") == "gaussian":
            # A Gaussian release of noise multiplier σ (e.g. the central images, normalised to
            # sensitivity 1) is, for a canary, a full-batch step: q = 1, `count` times.
            steps.append(MechanismStep(float(event["noise_multiplier"]), 1.0, int(event["count"])))
            continue
        if event.get("type") != "poisson_gaussian":
            raise UsageError(
                f"the white-box audit runs poisson_gaussian and gaussian events only; this "
                f"plan has a {event.get('type')!r} event"
            )
        steps.append(
            MechanismStep(
                float(event["noise_multiplier"]),
                float(event["sampling_rate"]),
                int(event["steps"]),
            )
        )
    if not steps:
        raise UsageError("the plan has no mechanism events to audit")
    return steps


def _linear_loss(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor) -> Tensor:
    """⟨w, x⟩: its gradient w.r.t. w is the record x itself."""
    return (params["w"] * x).sum()


def canary_scores(
    steps: Sequence[MechanismStep],
    max_grad_norm: float,
    included: Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, Tensor]:
    """Each canary's scores after one run of `steps`: {"llr": summed log-likelihood ratio,
    "max": the largest standardised projection over the steps}, float64 [m] each.

    `included` (bool [m]) says which canaries are in the audited data set. The run draws its
    Poisson batches and noise from `generator`.
    """
    if break_mode is not None and break_mode not in BREAK_MODES:
        raise UsageError(f"--break must be one of {', '.join(BREAK_MODES)}, got {break_mode!r}")
    m = int(included.numel())
    members = torch.nonzero(included).flatten()
    clip = float(max_grad_norm)
    canary_norm = CANARY_NORM_FACTOR * clip
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(m, dtype=torch.float64))
    scores = torch.zeros(m, dtype=torch.float64)
    peak = torch.full((m,), -math.inf, dtype=torch.float64)
    for step in steps:
        gradient = _private_gradient(
            model, step.noise_multiplier, clip, canary_norm, generator, break_mode
        )
        sampler = PoissonSampler(int(members.numel()), step.sampling_rate, generator)
        # What the nominal mechanism would show: +C on an included canary's coordinate, noise
        # of std σC on every coordinate; the score is the mixture's log-likelihood ratio.
        noise_std = step.noise_multiplier * clip
        for _ in range(step.steps):
            batch = members[sampler.next()]
            records = torch.zeros(int(batch.numel()), m, dtype=torch.float64)
            records[torch.arange(int(batch.numel())), batch] = canary_norm
            gradient.compute(records)
            released = model.w.grad * gradient.expected_batch_size
            scores += _log_likelihood_ratio(released, clip, noise_std, step.sampling_rate)
            peak = torch.maximum(peak, released / noise_std)
    return {"llr": scores, "max": peak}


def _private_gradient(
    model: nn.Module,
    sigma: float,
    clip: float,
    canary_norm: float,
    generator: torch.Generator,
    break_mode: str | None,
) -> PrivateGradient:
    """The privacy layer's DP-SGD gradient, or its test-only broken variant.

    The expected batch size is 1: dividing the noisy sum by the public qN is post-processing,
    so the audit reads the sum itself.
    """
    if break_mode == "noise":
        sigma = sigma / _NOISE_BREAK_DIVISOR
    if break_mode == "clip":
        # A clipping norm far above every canary's norm clips nothing; the noise std σ·C stays.
        loose = 10.0 * canary_norm
        return PrivateGradient(
            model,
            _linear_loss,
            noise_multiplier=sigma * clip / loose,
            max_grad_norm=loose,
            expected_batch_size=1.0,
            generator=generator,
        )
    return PrivateGradient(
        model,
        _linear_loss,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        expected_batch_size=1.0,
        # The audit's own stream: a fresh `torch.Generator()` here had the same default seed
        # for every step and every `--seed`, so the audits were not independent (issue 48).
        generator=generator,
    )


def _log_likelihood_ratio(released: Tensor, clip: float, noise_std: float, q: float) -> Tensor:
    """log[(1 − q)·N(x; 0, s²) + q·N(x; C, s²)] − log N(x; 0, s²), per coordinate x."""
    shift = (clip * released - 0.5 * clip * clip) / (noise_std * noise_std)
    return mixture_log_ratio(shift, q)


def mixture_log_ratio(log_ratio: Tensor, q: float) -> Tensor:
    """log[(1 − q) + q·exp(log_ratio)]: a Poisson-sampled record's log-likelihood ratio from
    the ratio it would have if always included. q = 1 (a full-batch release, such as the
    frequency model's) is the ratio itself: log1p(−1) is −∞, not a number math can give."""
    if q >= 1:
        return log_ratio.clone()
    return torch.logaddexp(torch.full_like(log_ratio, math.log1p(-q)), log_ratio + math.log(q))


def best_guesses(
    scores: Mapping[str, Tensor], included: Tensor, delta: float, confidence: float
) -> GuessOutcome:
    """Guess "in" for the top scores and "out" for the bottom ones; the best bound over a fixed
    grid of (score, guess counts) rules, each tested at 1 − (1 − confidence)/(number of rules)
    (a union bound, so the best of them holds at `confidence`)."""
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


def audit_events(
    events: Sequence[dict[str, Any]],
    max_grad_norm: float,
    delta: float,
    canaries: int,
    confidence: float,
    seed: int | None = None,
    break_mode: str | None = None,
) -> GuessOutcome:
    """One white-box run of the plan's events with `canaries` Dirac canaries → the best guess."""
    steps = mechanism_steps(events)
    generator, included = draw_canaries(canaries, seed)
    scores = canary_scores(steps, max_grad_norm, included, generator, break_mode)
    return best_guesses(scores, included, delta, confidence)
