"""The independent-trials audit: canaries whose evidence is independent → an ε lower bound.

The white-box audits design their canaries so that each one's evidence lies on coordinates no
other canary touches, with the mechanism's own independent noise there and its own Poisson
draws: given which canaries are in, their scores are independent. Each canary is then one
trial of the neighbouring pair "this canary in / out", as in a multiple-run audit (Jagielski,
Ullman and Oprea 2020; Nasr et al. 2021 and 2023), with m trials from one run of the mechanism.

For any region S of scores fixed before the trials it is judged on, an (ε, δ)-DP mechanism has
P_in(S) ≤ e^ε·P_out(S) + δ and P_out(S) ≤ e^ε·P_in(S) + δ. With a one-sided Clopper-Pearson
lower bound on the left rate and an upper bound on the right one (each at 1 − β/2), ε ≥
log((rate_lb − δ) / rate_ub) holds at confidence 1 − β.

S is a threshold region of one score, {s ≥ t} ("high": the in-rate over the out-rate) or
{s ≤ t} ("low": the out-rate over the in-rate). It is chosen on every `SELECTION_STRIDE`-th
canary (a public split, independent of the run) and judged on the others, so the choice costs
no confidence. The choice is the bound the judging canaries would give with the selection's
rates, each moved `_CAUTION` standard deviations against the region, over tails log-spaced
down to `_MIN_AGAINST_HITS` selection canaries on the side that counts against it: with
millions of trials (the many-run audit) the best region is a tail of 1e-4 or less, which a
bound at the selection set's own size would never pick. Tuned on an exact Gaussian release at
ε = 1 (4 million trials: 0.80 on average over four seeds, as at the best fixed region) and
Poisson-subsampled DP-SGD (pge `tiny`, 10 million: 0.76 against 0.75); the fixed grid it
replaces, judged at the selection's own size, gave 0.71 and 0.72. The one-run test
(`bound.py`, Steinke, Nasr and Jagielski 2023) needs no independence but cannot tell ε = 1
from ε = 2 in one run; this test can, with enough canaries.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from scipy.stats import beta as beta_distribution

from dpsynth.errors import UsageError

__all__ = [
    "SELECTION_STRIDE",
    "TrialsOutcome",
    "candidate_regions",
    "cautious_counts",
    "choose_region",
    "judged_counts",
    "rate_bounds",
    "region_bound",
    "selection_split",
    "trials_bound",
]

# Every 8th canary chooses the region (a few dozen candidates need few); the others judge it.
SELECTION_STRIDE = 8
# Candidate regions: the top (or bottom) fraction of the selection canaries' scores, from half
# of them down, `_FRACTIONS_PER_DECADE` a decade, while the side against the region keeps
# `_MIN_AGAINST_HITS` selection canaries; each rate is moved `_CAUTION` standard deviations
# against the region when it is chosen (less chased noise in far tails, more left power).
_FRACTIONS_PER_DECADE = 8
_MIN_AGAINST_HITS = 30
_CAUTION = 1.0
_DIRECTIONS = ("high", "low")


@dataclass(frozen=True)
class TrialsOutcome:
    """The judged region and the ε lower bound it gives.

    `score` and `direction` name the region ({score ≥ threshold} for "high", ≤ for "low");
    `hits_in` of `trials_in` included canaries and `hits_out` of `trials_out` excluded ones fell
    in it (judging canaries only).
    """

    score: str
    direction: str
    threshold: float
    trials_in: int
    trials_out: int
    hits_in: int
    hits_out: int
    lower_bound: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def rate_bounds(hits: int, trials: int, confidence: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds on a rate from `hits` of `trials`: (lower, upper),
    each holding at `confidence` on its own."""
    if not 0 <= hits <= trials:
        raise UsageError(f"need 0 ≤ hits ≤ trials, got {hits} and {trials}")
    beta = 1.0 - confidence
    lower = 0.0 if hits == 0 else float(beta_distribution.ppf(beta, hits, trials - hits + 1))
    upper = (
        1.0 if hits == trials else float(beta_distribution.ppf(1 - beta, hits + 1, trials - hits))
    )
    return lower, upper


def region_bound(
    hits_for: int, trials_for: int, hits_against: int, trials_against: int, delta: float,
    confidence: float,
) -> float:  # fmt: skip
    """log((lower bound of the `for` rate − δ) / upper bound of the `against` rate), at least 0,
    holding at `confidence` (each rate bound at 1 − β/2)."""
    if trials_for == 0 or trials_against == 0:
        return 0.0
    each = 1.0 - (1.0 - confidence) / 2.0
    low, _ = rate_bounds(hits_for, trials_for, each)
    _, high = rate_bounds(hits_against, trials_against, each)
    if low - delta <= 0.0 or high <= 0.0:
        return 0.0
    return max(0.0, math.log((low - delta) / high))


def _counts(
    score: torch.Tensor, included: torch.Tensor, direction: str, threshold: float
) -> tuple[int, int, int, int]:
    """(hits_in, trials_in, hits_out, trials_out) of the region on these canaries."""
    inside = score >= threshold if direction == "high" else score <= threshold
    trials_in = int(included.sum())
    return (
        int((inside & included).sum()),
        trials_in,
        int((inside & ~included).sum()),
        int(included.numel()) - trials_in,
    )


def _bound(
    counts: tuple[int, int, int, int], direction: str, delta: float, confidence: float
) -> float:
    hits_in, trials_in, hits_out, trials_out = counts
    if direction == "high":
        return region_bound(hits_in, trials_in, hits_out, trials_out, delta, confidence)
    return region_bound(hits_out, trials_out, hits_in, trials_in, delta, confidence)


def cautious_counts(
    counts: tuple[int, int, int, int], direction: str, scale: float
) -> tuple[float, float, float, float]:
    """The judging canaries' counts (`scale` times the selection's `counts`, in the same order)
    with each rate moved `_CAUTION` standard deviations against the region."""
    hits_in, trials_in, hits_out, trials_out = counts
    toward = -_CAUTION if direction == "high" else _CAUTION
    moved_in = min(max(hits_in + toward * math.sqrt(hits_in), 0.0), trials_in)
    moved_out = min(max(hits_out - toward * math.sqrt(hits_out), 0.0), trials_out)
    return moved_in * scale, trials_in * scale, moved_out * scale, trials_out * scale


def _predicted(
    counts: tuple[int, int, int, int], direction: str, scale: float, delta: float,
    confidence: float, required: int,
) -> float | None:  # fmt: skip
    """The bound the judging canaries would give with the selection's cautious rates
    (`cautious_counts`); None when the side against the region has fewer than `required`
    selection canaries."""
    against = counts[0] if direction == "low" else counts[2]
    if against < required:
        return None
    moved = tuple(round(c) for c in cautious_counts(counts, direction, scale))
    return _bound(moved, direction, delta, confidence)  # type: ignore[arg-type]


def choose_region(
    scores: Mapping[str, torch.Tensor],
    included: torch.Tensor,
    predict: Callable[[tuple[int, int, int, int], str, float, bool], float | None],
) -> tuple[str, str, float, tuple[int, int, int, int]] | None:
    """The candidate region (`candidate_regions`) whose `predict(counts, direction, scale,
    needs)` is largest on the selection canaries, with its counts on the judging canaries
    (None when every prediction is None). `scale` is judging over selection canaries; `needs`
    says whether the region must keep `_MIN_AGAINST_HITS` selection canaries against it."""
    choose = selection_split(int(included.numel()))
    selection = int(choose.sum())
    scale = (int(included.numel()) - selection) / selection
    best: tuple[float, str, str, float] | None = None
    for name, direction, threshold, counts, needs in candidate_regions(scores, included, choose):
        found = predict(counts, direction, scale, needs)
        if found is not None and (best is None or found > best[0]):
            best = (found, name, direction, threshold)
    if best is None:
        return None
    _, name, direction, threshold = best
    return name, direction, threshold, judged_counts(scores[name], included, direction, threshold)


def candidate_regions(
    scores: Mapping[str, torch.Tensor], included: torch.Tensor, choose: torch.Tensor
) -> Iterator[tuple[str, str, float, tuple[int, int, int, int], bool]]:
    """The candidate regions on the selection canaries (`choose`, bool [m]): (score, direction,
    threshold, the selection's counts there, whether the side against the region must keep
    `_MIN_AGAINST_HITS` of them); the widest region (half) never needs them, so a small audit
    still has one."""
    for name, score in scores.items():
        picked = score[choose]
        ordered = torch.sort(picked[torch.isfinite(picked)]).values
        if ordered.numel() == 0:
            continue
        for direction in _DIRECTIONS:
            for step in itertools.count():
                fraction = 0.5 * 10.0 ** (-step / _FRACTIONS_PER_DECADE)
                place = round(fraction * (ordered.numel() - 1))
                threshold = float(ordered[-1 - place if direction == "high" else place])
                counts = _counts(picked, included[choose], direction, threshold)
                yield name, direction, threshold, counts, step > 0
                against = counts[0] if direction == "low" else counts[2]
                if place == 0 or (step > 0 and against < _MIN_AGAINST_HITS):
                    break


def selection_split(m: int) -> torch.Tensor:
    """The public split: every `SELECTION_STRIDE`-th canary chooses the region (bool [m])."""
    if m < 2 * SELECTION_STRIDE:
        raise UsageError(f"the trials test needs at least {2 * SELECTION_STRIDE} canaries")
    return torch.arange(m) % SELECTION_STRIDE == 0


def judged_counts(
    score: torch.Tensor, included: torch.Tensor, direction: str, threshold: float
) -> tuple[int, int, int, int]:
    """(hits_in, trials_in, hits_out, trials_out) of the region on the judging canaries."""
    judge = ~selection_split(int(included.numel()))
    return _counts(score[judge], included[judge], direction, threshold)


def trials_bound(
    scores: Mapping[str, torch.Tensor], included: torch.Tensor, delta: float, confidence: float
) -> TrialsOutcome:
    """The ε lower bound of the region chosen on the selection canaries, judged on the rest.

    Valid when the canaries' scores are independent given `included` (bool [m]); each score is
    float64 [m], larger meaning "more likely in".
    """
    chosen = choose_region(
        scores,
        included,
        lambda counts, direction, scale, needs: _predicted(
            counts, direction, scale, delta, confidence, _MIN_AGAINST_HITS if needs else 0
        ),
    )
    if chosen is None:
        raise UsageError("the trials test got no finite score")
    name, direction, threshold, counts = chosen
    hits_in, trials_in, hits_out, trials_out = counts
    return TrialsOutcome(
        score=name,
        direction=direction,
        threshold=threshold,
        trials_in=trials_in,
        trials_out=trials_out,
        hits_in=hits_in,
        hits_out=hits_out,
        lower_bound=_bound(counts, direction, delta, confidence),
    )
