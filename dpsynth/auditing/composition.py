"""One lower bound for a whole plan from its parts' audits, composed soundly.

A marginal plan's parts (its Gaussian measurements, its exponential-mechanism selections) are
audited by independent runs, each with canaries of its own and its own R. For a threshold
region S_i of each part's scores, one-sided Clopper-Pearson bounds a_i ≤ P_for,i(S_i) (the
rate the region is for) and P_against,i(S_i) ≤ b_i give, for an (ε, δ)-DP composition of the
parts on the product region S_1 × … × S_k (the parts' noise is independent, so the rates
multiply):

    ∏ a_i ≤ ∏ P_for,i(S_i) ≤ e^ε · ∏ P_against,i(S_i) + δ ≤ e^ε · ∏ b_i + δ,

so ε ≥ log((∏ a_i − δ) / ∏ b_i). A part that the plan runs `times` times (mst's T selections
of one ε_s each, audited one selection a canary) enters with up to that many independent
copies of its region (a_i^k, b_i^k), as the accountant composes T copies; a part whose
evidence does not help enters with none (the whole space: both rates 1).

The regions and copies are chosen on every `SELECTION_STRIDE`-th canary of each part (the
trials test's public split) for the bound the judging canaries would give with those rates
moved one standard deviation against the choice, and judged once on the other canaries: the
product of a part's deep tail (its own best region) with another's falls below δ, so the
composition takes wider regions than each part alone.

What it bounds: the composition of each part's own worst-case neighbouring pair, which the
plan's accountant must cover (it composes each event's worst case). A lower bound above the
plan's claim is a composition the accountant missed or undercounted, or a part wrong by more
than its own audit can show. Each part's dominating pair here is symmetric (a Gaussian;
randomized response for pure DP), so each part's region may favour either side ("high": the
canary in; "low": out).

Confidence: the bound reads 2 rates of each of the k parts, each bounded at 1 − β/(2k) of the
`confidence` it is given, so it holds at that confidence (`auditing/marginal.py` gives it half
of the audit's β and the parts' own tests the other half).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpsynth.auditing.trials import SELECTION_STRIDE, rate_bounds

__all__ = ["ComposedBound", "PartScores", "composed_bound"]

# Copies of one part tried: every count up to this many, then a log-spaced grid to `times`.
_EVERY_COPY_UP_TO = 32
_GRID_POINTS = 24
# Candidate regions of a part: the top (or bottom) fraction of its selection canaries' scores,
# from half down, this many a decade, while the side against it keeps _MIN_AGAINST_HITS.
_FRACTIONS_PER_DECADE = 6
_MIN_AGAINST_HITS = 30


@dataclass(frozen=True)
class PartScores:
    """One part's canaries: its score (float64 [m], larger meaning "more likely in"), which
    canaries were in (bool [m]), and how many times the plan runs what one canary's trial
    audits (`times` copies may compose)."""

    name: str
    score: torch.Tensor
    included: torch.Tensor
    times: int = 1


@dataclass(frozen=True)
class _Region:
    direction: str  # "high": {score ≥ threshold}, for the canary in; "low": ≤, for out
    threshold: float


@dataclass(frozen=True)
class ComposedBound:
    """The composed lower bound, and per part the copies of its region it used with the
    region and its judged counts (hits for the region's side, trials, hits against, trials)."""

    lower_bound: float
    parts: dict[str, dict[str, Any]]
    # The family tests' factors composed (`auditing/family.py`): each part's factor on its
    # sensitivity-to-noise ratio, and the accountant's ε of the plan at those factors.
    family_lower_bound: float = 0.0
    family_factors: dict[str, float] | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "lower_bound": self.lower_bound,
            "parts": self.parts,
            "family_lower_bound": self.family_lower_bound,
            "family_factors": self.family_factors,
        }


def _copy_counts(times: int) -> list[int]:
    """The numbers of copies tried for a part that runs `times` times (0 included)."""
    if times <= _EVERY_COPY_UP_TO:
        return list(range(times + 1))
    grid = {round(times ** (i / (_GRID_POINTS - 1))) for i in range(_GRID_POINTS)}
    return sorted({*range(_EVERY_COPY_UP_TO + 1), *grid, times})


def _counts(
    score: torch.Tensor, included: torch.Tensor, region: _Region
) -> tuple[int, int, int, int]:
    """(hits for, trials for, hits against, trials against) of the region on these canaries."""
    if region.direction == "high":
        inside, side = score >= region.threshold, included
    else:
        inside, side = score <= region.threshold, ~included
    return (
        int((inside & side).sum()), int(side.sum()),
        int((inside & ~side).sum()), int((~side).sum()),
    )  # fmt: skip


def _rates(counts: tuple[float, float, float, float], each: float) -> tuple[float, float]:
    """(a, b): the for-rate's lower bound and the against-rate's upper bound at `each`."""
    hits_for, trials_for, hits_against, trials_against = (round(c) for c in counts)
    if trials_for == 0 or trials_against == 0:
        return 0.0, 1.0
    low, _ = rate_bounds(hits_for, trials_for, each)
    _, high = rate_bounds(hits_against, trials_against, each)
    return low, high


def _candidates(
    part: PartScores, choose: torch.Tensor, each: float
) -> list[tuple[_Region, float, float]]:
    """The part's candidate regions on its selection canaries, each with the (a, b) the
    judging canaries would give, its rates moved one standard deviation against it."""
    score, included = part.score[choose], part.included[choose]
    judging = int((~choose).sum())
    scale = judging / max(int(choose.sum()), 1)
    ordered = torch.sort(score[torch.isfinite(score)]).values
    out: list[tuple[_Region, float, float]] = []
    if ordered.numel() == 0:
        return out
    for direction in ("high", "low"):
        for step in itertools.count():
            fraction = 0.5 * 10.0 ** (-step / _FRACTIONS_PER_DECADE)
            place = round(fraction * (ordered.numel() - 1))
            threshold = float(ordered[-1 - place if direction == "high" else place])
            region = _Region(direction, threshold)
            hits_for, trials_for, hits_against, trials_against = _counts(score, included, region)
            if step and hits_against < _MIN_AGAINST_HITS:
                break
            worse_for = max(0.0, hits_for - math.sqrt(hits_for))
            worse_against = min(float(trials_against), hits_against + math.sqrt(hits_against))
            counts = (worse_for, trials_for, worse_against, trials_against)
            a, b = _rates(tuple(c * scale for c in counts), each)  # type: ignore[arg-type]
            if a > b > 0.0:
                out.append((region, a, b))
            if place == 0:
                break
    return out


def _best_choice(
    options: Sequence[list[tuple[int, float, float]]], delta: float
) -> tuple[float, tuple[int, ...]]:
    """The options (one per part: (index, k·log a, k·log b), index −1 for none) maximising
    log(exp(Σ k·log a) − δ) − Σ k·log b, and that value."""
    best, best_pick = 0.0, tuple(-1 for _ in options)
    *heads, last = options
    last_a = np.array([o[1] for o in last])
    last_b = np.array([o[2] for o in last])
    for pick in itertools.product(*(range(len(h)) for h in heads)):
        log_a = sum(heads[i][j][1] for i, j in enumerate(pick)) + last_a
        log_b = sum(heads[i][j][2] for i, j in enumerate(pick)) + last_b
        numerator = np.exp(log_a) - delta
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(numerator > 0, np.log(np.maximum(numerator, 1e-300)) - log_b, 0.0)
        top = int(np.argmax(value))
        if value[top] > best:
            best = float(value[top])
            best_pick = (*pick, top)
    return best, best_pick


def composed_bound(parts: Sequence[PartScores], delta: float, confidence: float) -> ComposedBound:
    """The composed lower bound of the parts at `confidence` (see the module)."""
    if not parts:
        return ComposedBound(0.0, {})
    each = 1.0 - (1.0 - confidence) / (2 * len(parts))
    chooses, regions, options = [], [], []
    for part in parts:
        choose = torch.arange(int(part.included.numel())) % SELECTION_STRIDE == 0
        found = _candidates(part, choose, each)
        # (region index, copies) per option; option 0 is "none" (the whole space)
        menu = [(-1, 0, 0.0, 0.0)]
        for index, (_, a, b) in enumerate(found):
            for k in _copy_counts(part.times)[1:]:
                menu.append((index, k, k * math.log(a), k * math.log(b)))
        chooses.append(choose)
        regions.append(found)
        options.append(menu)
    _, pick = _best_choice([[(i, la, lb) for i, _, la, lb in m] for m in options], delta)
    log_a = log_b = 0.0
    judged: dict[str, dict[str, Any]] = {}
    for part, choose, found, menu, chosen in zip(
        parts, chooses, regions, options, pick, strict=True
    ):
        index, k, _, _ = menu[max(chosen, 0)]
        if index < 0:
            judged[part.name] = {"copies": 0}
            continue
        region = found[index][0]
        judge = ~choose
        counts = _counts(part.score[judge], part.included[judge], region)
        a, b = _rates(counts, each)  # type: ignore[arg-type]
        judged[part.name] = {
            "copies": k, "direction": region.direction, "threshold": region.threshold,
            "counts": list(counts), "rates": [a, b],
        }  # fmt: skip
        if a <= 0.0:
            return ComposedBound(0.0, judged)
        log_a += k * math.log(a)
        log_b += k * math.log(b)
    numerator = math.exp(log_a) - delta
    bound = max(0.0, math.log(numerator) - log_b) if numerator > 0 else 0.0
    return ComposedBound(bound, judged)
