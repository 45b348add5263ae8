"""White-box one-run audits of AIM's and MST's mechanisms through `MarginalQueries` itself.

A marginal-based plan has two events: a `gaussian` one (`count` marginals measured at noise
std σ, sensitivity 1 each) and a `pure_dp` one (`count` exponential-mechanism selections at ε_s
each). The audit runs each through the privacy layer's `MarginalQueries` (`measure`, `select`)
on canary *records*: rows encoded as the training loop hands them to the trainer, coded back to
the public domain by the trainer's own `codes_from_rows` (checked to land where designed).

- Measurements. One table of m canaries (each in with probability 1/2) whose codes hit m
  distinct cells of one clique (the fewest largest attributes with at least m cells). The
  plan's `count` measurements are all of that clique (which cliques a run measures is its own,
  adaptive choice; the plan fixes only σ and the count), so canary i's evidence is the sum of
  its cell's noisy counts: N(count·b_i, count·σ²), a Gaussian of exactly the composed
  sensitivity.
- Selections. One selection per canary, each canary its own table (itself or nothing: the
  mechanism run on a neighbouring pair, fresh randomness each time), through the event's
  per-selection ε_s, between two candidates of one clique: candidate 0's public estimate puts
  `_ESTIMATE` rows on an empty cell and a public offset lowers its quality by G, candidate 1's
  estimate sits on the canary's cell. The qualities are b + 8 − G and 8 − b, so adding the
  canary moves each by 1 (the sensitivity) and their difference by 2, and the log-odds of
  choosing candidate 0 is ε_s·(b − G/2). With G = 2R/ε_s candidate 0 is rare, where the
  ratio P_in / P_out of choosing it nears e^ε_s: the exponential mechanism's ε is tight there.
  Each canary draws its rarity R from `_RARITIES` (i.i.d., public): R = 1 suits an error near
  2×, R = 1/8 (a fifth of the canaries) a much larger one, which would make the R = 1
  candidate vanish. A canary's score is 0, or 1 + the index of its R when candidate 0 was
  chosen, so that a region can keep one kind. The part is judged against ε_s
  with the pure-DP test (δ = 0): the event composes `count` such selections by basic
  composition, a bound no audit of the composed event could approach (its all-k tail is too
  rare to observe), so the audit checks the selection the composition is made of.

Each part is an audit of its own event against that event's own proven bound, at confidence
1 − β/2 so that both hold together at 1 − β: the measurements' (ε, δ) from the accountant at
the plan's δ, the selection's pure ε_s with the pure-DP test (δ = 0).
A table's δ is large (1e-4 for N = 800) and the one-run p-value adds 2·m·δ, so the one-run
test is weak on a table; `TABLE_CANARIES` is enough for the trials test to judge.
`break_mode` (`--break`, `auditing/breaks.py`): "noise:F" divides σ by F and multiplies ε_s by F;
"sensitivity:F" counts every record F times (a counter that overcounts, as a wrong
`MarginalCounter` would), so a record moves a count, and a quality, by that much.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from dpsynth.auditing.breaks import check_break, read_break
from dpsynth.auditing.composition import ComposedBound, PartScores, composed_bound
from dpsynth.auditing.family import FamilyOutcome, composed_family_bound, logistic_factor
from dpsynth.auditing.guesses import TRIALS_FROM, PartOutcome, best_guesses, pooled_runs
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.methods.marginal.domain import TableDomain, codes_from_rows, rows_from_codes
from dpsynth.privacy.accounting.compose import compose_epsilon
from dpsynth.privacy.accounting.events import DpEvent, Gaussian, PureDp
from dpsynth.privacy.mechanisms.marginal_measure import CodesCounter, MarginalQueries

__all__ = [
    "TABLE_BREAKS",
    "TABLE_CANARIES",
    "audit_marginal_plan",
    "canary_capacity",
    "canary_codes",
]

TABLE_CANARIES = 20_000
# The selection part's canaries per run at most: each is one `select` call (about 0.1 ms), so
# `--canaries` in the millions (cheap for the measurements: one cell each) stays minutes there.
SELECTION_CANARIES = 20_000
TABLE_BREAKS = ("noise", "sensitivity")
# The public estimates' rows: at least what an overcounting break makes of one record (its
# factor), so that |count − estimate| moves by the whole count.
_ESTIMATE = 8.0
# Candidate 0's log-odds without the canary, −R at the nominal ε_s: rare enough that the ratio
# of its rates nears e^ε_s, common enough to be counted (R = 1 for an error near 2×).
_RARITIES = (0.125, 1.0)
_COMMON_SHARE = 0.2  # the share of canaries with the first rarity (R = 1/8, less rare)
_KIND = "kind"  # the selection scorer's public record of each canary's rarity (not a score)
# The largest clique the measurement audit counts (cells): 16 M float64 is 128 MiB.
_MAX_CELLS = 1 << 24


class _Overcounting:
    """A `MarginalCounter` that counts every record `factor` times (the sensitivity break: a
    record then moves a cell by that much, not by 1)."""

    def __init__(self, codes: np.ndarray, sizes: Sequence[int], factor: float) -> None:
        self._inner = CodesCounter(codes, sizes)
        self.factor = factor
        self.sizes = self._inner.sizes
        self.record_count = self._inner.record_count

    def counts(self, cliques: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        """The true counts times the factor."""
        return [self.factor * c for c in self._inner.counts(cliques)]


def _queries(codes: np.ndarray, sizes: Sequence[int], break_mode: str | None) -> MarginalQueries:
    mode, factor = read_break(break_mode, TABLE_BREAKS)
    if mode == "sensitivity":
        return MarginalQueries(_Overcounting(codes, sizes, factor))
    return MarginalQueries(codes, sizes)


def canary_capacity(domain: TableDomain) -> int:
    """The most canaries this table's domain gives distinct cells of one marginal."""
    cells = 1
    for size in domain.sizes:
        cells *= int(size)
        if cells >= _MAX_CELLS:
            return _MAX_CELLS
    return cells


def canary_clique(domain: TableDomain, canaries: int) -> tuple[int, ...]:
    """The fewest attributes, largest first, whose marginal has at least `canaries` cells."""
    order = sorted(range(len(domain.sizes)), key=lambda j: (-domain.sizes[j], j))
    clique: list[int] = []
    cells = 1
    for j in order:
        if cells >= canaries:
            break
        clique.append(j)
        cells *= domain.sizes[j]
    if cells < canaries or cells > _MAX_CELLS:
        raise UsageError(
            f"--canaries {canaries}: this table's domain cannot give that many canaries distinct "
            f"cells of one marginal (at most {_MAX_CELLS:,} cells); use fewer canaries"
        )
    return tuple(sorted(clique))


def canary_codes(domain: TableDomain, clique: tuple[int, ...], canaries: int) -> np.ndarray:
    """Codes [m, d] of canary records in distinct cells of `clique`, each made a record (its
    encoded row) and coded back by the trainer's `codes_from_rows`; DpsynthError if a canary
    does not land where designed."""
    shape = tuple(domain.sizes[j] for j in clique)
    codes = np.zeros((canaries, len(domain.sizes)), dtype=np.int64)
    codes[:, list(clique)] = np.stack(np.unravel_index(np.arange(canaries), shape), axis=1)
    # The middle of each numeric bin (public, no randomness): far from either edge.
    rows, labels = rows_from_codes(codes, domain, np.full(codes.shape, 0.5))
    back = codes_from_rows(rows, labels, domain).astype(np.int64)
    if not np.array_equal(back, codes):
        raise DpsynthError("the audit's canary records do not code back to their cells")
    return back


def measurement_scores(
    domain: TableDomain,
    event: Gaussian,
    included: torch.Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, torch.Tensor]:
    """Each canary's log-likelihood ratio after the event's `count` measurements of one clique
    through `MarginalQueries.measure` (float64 [m])."""
    m = int(included.numel())
    clique = canary_clique(domain, m)
    codes = canary_codes(domain, clique, m)
    queries = _queries(codes[included.numpy()], domain.sizes, break_mode)
    sigma = float(event.noise_multiplier)
    count = event.times
    mode, factor = read_break(break_mode, TABLE_BREAKS)
    used = sigma / factor if mode == "noise" else sigma
    cell = np.ravel_multi_index(
        tuple(codes[:, j] for j in clique), [domain.sizes[j] for j in clique]
    )
    evidence = np.zeros(m)
    for _ in range(count):
        evidence += queries.measure([clique], used, generator)[0][cell]
    # Nominal: evidence ~ N(count·b, count·σ²); standardised z, strength a = √count / σ.
    strength = math.sqrt(count) / sigma
    z = torch.from_numpy(evidence / (sigma * math.sqrt(count)))
    return {"llr": strength * z - 0.5 * strength**2}


def selection_scores(
    domain: TableDomain,
    event: PureDp,
    included: torch.Tensor,
    generator: torch.Generator,
    break_mode: str | None = None,
) -> dict[str, torch.Tensor]:
    """Each canary's one selection through `MarginalQueries.select` at the event's ε_s, on a
    table of itself or of nothing: 1.0 where the rare candidate was chosen (float64 [m])."""
    clique = canary_clique(domain, 2)
    codes = canary_codes(domain, clique, 2)
    cells = domain.cells(clique)
    mode, factor = read_break(break_mode, TABLE_BREAKS)
    nominal = float(event.epsilon)
    epsilon = nominal * (factor if mode == "noise" else 1.0)
    rare, common = np.zeros(cells), np.zeros(cells)
    rare[1] = max(_ESTIMATE, factor)  # rows on an empty cell (the second canary's, never in)
    common[0] = max(_ESTIMATE, factor)  # rows on the canary's cell
    draws = torch.rand(int(included.numel()), generator=generator, dtype=torch.float64)
    kinds = (draws >= _COMMON_SHARE).to(torch.int64)
    tables = {
        True: _queries(codes[:1], domain.sizes, break_mode),
        False: _queries(codes[:0], domain.sizes, break_mode),
    }
    chosen = torch.zeros(int(included.numel()), dtype=torch.float64)
    for i, (inside, kind) in enumerate(zip(included.tolist(), kinds.tolist(), strict=True)):
        offsets = [2.0 * _RARITIES[kind] / nominal, 0.0]  # public: G lowers candidate 0
        pick = tables[bool(inside)].select(
            [clique, clique], [rare, common], offsets, [1.0, 1.0], epsilon, generator
        )
        chosen[i] = 1.0 + kind if pick == 0 else 0.0
    # the kinds are public (drawn independently of who is in); the family test reads them
    return {"chosen": chosen, _KIND: kinds.to(torch.float64)}


def audit_marginal_plan(
    domain: TableDomain,
    events: Sequence[DpEvent],
    delta: float,
    canaries: int,
    confidence: float,
    seed: int | None = None,
    break_mode: str | None = None,
    runs: int = 1,
) -> tuple[list[PartOutcome], ComposedBound | None]:
    """The measurement and selection audits of a marginal plan's events (`runs` runs each, of
    `canaries` canaries for the measurements and at most `SELECTION_CANARIES` for the
    selections), and their bounds composed against the plan (`auditing/composition.py`; None
    where a part is judged by the one-run test, whose bound does not compose)."""
    check_break(break_mode, TABLE_BREAKS)
    # The parts compose when every part is judged by the trials test (its trials known before
    # any run) and there is more than one trial's mechanism to compose: half of β then goes
    # to the k parts' own tests and half to their composition, so that all hold together.
    sizes = [_part_canaries(e, canaries) * runs for e in events]
    compose = all(m >= TRIALS_FROM for m in sizes) and (
        len(events) > 1 or any(isinstance(e, PureDp) and e.times > 1 for e in events)
    )
    # a selection's family test (`_selection_family`) takes one more share of β
    selections = sum(isinstance(e, PureDp) for e in events)
    shares = (2 * len(events) if compose else max(len(events), 1)) + selections
    part_confidence = 1.0 - (1.0 - confidence) / shares
    parts: list[PartOutcome] = []
    evidence: list[PartScores] = []
    factors: list[float] = []
    for event in events:
        if isinstance(event, Gaussian):
            claim, part_delta = compose_epsilon([event], delta).epsilon, delta
            scorer = measurement_scores
            copies = 1  # a canary's trial sees every one of the event's measurements
            name = "marginal measurements (Gaussian)"
        elif isinstance(event, PureDp):
            scorer = selection_scores
            copies = event.times  # a canary's trial is one of the plan's selections
            name = "marginal selection (exponential mechanism, pure DP, per selection)"
            # The pure-DP test (δ = 0) against one selection's ε_s: the event is `count` of
            # them, composed by basic composition (proven).
            claim, part_delta = float(event.epsilon), 0.0
        else:
            raise UsageError(f"the marginal audit cannot run a {event.kind!r} event")
        scores, included = pooled_runs(
            _part_canaries(event, canaries),
            runs,
            seed,
            lambda inside, generator, scorer=scorer, event=event: scorer(
                domain, event, inside, generator, break_mode
            ),
        )
        kinds = scores.pop(_KIND, None)
        # Independent trials: the measurements' canaries have distinct cells and independent
        # noise; each selection is its own run.
        # The measurements' family is their Gaussian event; a selection's is judged as pure DP.
        family = [event] if isinstance(event, Gaussian) else None
        outcome = best_guesses(
            scores, included, part_delta, part_confidence, independent=True, family=family
        )
        if kinds is not None:
            family_outcome = _selection_family(
                scores["chosen"], kinds, included, claim, part_confidence
            )
            outcome = dataclasses.replace(outcome, family=family_outcome)
        parts.append(PartOutcome(name, claim, outcome, int(included.numel())))
        factors.append(0.0 if outcome.family is None else outcome.family.factor)
        # the score the part's test chose (on its public selection split), else its first
        chosen = outcome.trials.score if outcome.trials is not None else next(iter(scores))
        evidence.append(PartScores(name, scores[chosen], included, copies))
    if not compose:
        return parts, None
    composed = composed_bound(evidence, delta, 1.0 - (1.0 - confidence) * len(events) / shares)
    names = [p.mechanism for p in parts]
    return parts, dataclasses.replace(
        composed,
        family_lower_bound=composed_family_bound(events, factors, delta),
        family_factors=dict(zip(names, factors, strict=True)),
    )


def _selection_family(
    chosen: torch.Tensor,
    kinds: torch.Tensor,
    included: torch.Tensor,
    epsilon: float,
    confidence: float,
) -> FamilyOutcome:
    """The selection's family test: its factor k on ε_s (`family.logistic_factor`) from the
    canaries of rarity R = 1 (their odds of choosing the rare candidate move by exactly
    e^{k·ε_s} when the canary is in), and k·ε_s as its bound. All of them judge: the region
    (the rare candidate chosen) is fixed before any run."""
    kind = float(_RARITIES.index(1.0))
    rarity_one = kinds == kind
    picked = (chosen == 1.0 + kind) & rarity_one
    counts = (
        int((picked & included).sum()), int((rarity_one & included).sum()),
        int((picked & ~included).sum()), int((rarity_one & ~included).sum()),
    )  # fmt: skip
    factor = logistic_factor(*counts, epsilon, confidence)
    return FamilyOutcome(
        score="chosen",
        direction="high",
        threshold=1.0 + kind,
        trials_in=counts[1],
        trials_out=counts[3],
        hits_in=counts[0],
        hits_out=counts[2],
        factor=factor,
        lower_bound=factor * epsilon,
    )


def _part_canaries(event: DpEvent, canaries: int) -> int:
    """A part's canaries a run: every one for the measurements, at most SELECTION_CANARIES
    selections."""
    return min(canaries, SELECTION_CANARIES) if isinstance(event, PureDp) else canaries
