"""AIM (McKenna et al. 2022): adaptive rounds of selecting the worst-approximated marginal.

After the one-way marginals, each round asks the current model for every candidate pair's
marginal, picks the pairs it gets most wrong with the exponential mechanism (quality: L1
error less the error measurement noise alone would leave, so that large marginals are not
favoured for their noise), measures them with Gaussian noise and re-fits the model
(Private-PGM's estimator, `model.py`). The model may only grow within a size cap that rises
with the rounds: the trainer grows the junction tree the model is fitted on one chosen pair at
a time (`junction.py`), so every candidate's cells are known exactly before each selection
(public structure only), and the estimation, whose every step passes messages over every
cell, stays within the cap (`cost.py` estimates the whole run's time for `--method auto`).

Differences from the paper, for sound PRV accounting and a bounded running time:
- a fixed, data-independent schedule: `selections` measurements at one σ and one ε_s, not
  the paper's budget annealing (a data-dependent noise scale, which needs a zCDP privacy
  filter; see `privacy/accounting/marginal_plan.py`);
- the selections are spread over `rounds` estimation rounds (several per round, without
  replacement, from the same model), since each round re-fits the whole model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import PlanFacts, PrivacyTarget
from dpsynth.methods.marginal.cost import aim_seconds
from dpsynth.methods.marginal.domain import TableDomain, table_domain
from dpsynth.methods.marginal.junction import JunctionTree
from dpsynth.methods.marginal.method import MarginalMethod, pairs_within
from dpsynth.methods.marginal.one_ways import released_one_ways
from dpsynth.methods.marginal.presets import AIM_PRESETS
from dpsynth.methods.marginal.trainer import MarginalTrainer
from dpsynth.privacy.accounting.calibration import default_delta
from dpsynth.privacy.accounting.marginal_plan import gdp_mu
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

# The automatic number of selections: as many as keep a typical pair's measurement noise (its
# expected L1 error) at about this share of N (a TVD of half of it), within [d/4, 3d]. Fewer,
# cleaner measurements win on small tables at small ε; on larger tables the cap 3d binds (the
# shares compared: bench/results/2026-11-23-tuning-logs/tuning-tables.md).
_TARGET_NOISE_SHARE = 0.25
_MIN_PER_COLUMN, _MAX_PER_COLUMN = 0.25, 3.0
# The automatic number of rounds: about this many attribute-rounds in all, within [2, 8].
_ROUND_BUDGET, _MIN_ROUNDS, _MAX_ROUNDS = 120, 2, 8


def auto_selections(
    domain: TableDomain, n: int, epsilon: float, delta: float, share: float, max_cells: int
) -> int:
    """A public rule for the number of selected marginals: from the columns, N and ε only."""
    d = len(domain.attributes)
    cells = sorted(domain.cells(p) for p in pairs_within(domain, max_cells)) or [1]
    typical = cells[len(cells) // 2]
    if not math.isfinite(epsilon):
        return int(_MAX_PER_COLUMN * d)
    mu2 = (1.0 - share) * gdp_mu(epsilon, delta) ** 2
    sigma = _TARGET_NOISE_SHARE * n / (math.sqrt(2.0 / math.pi) * typical)
    wanted = mu2 * sigma**2 - d
    low, high = math.ceil(_MIN_PER_COLUMN * d), math.floor(_MAX_PER_COLUMN * d)
    return int(min(max(round(wanted), low), high, len(cells)))


class AIMMethod(MarginalMethod):
    """AIM on tables: adaptive marginal selection, Private-PGM estimation, fixed PRV
    schedule."""

    name = "aim"
    presets = AIM_PRESETS
    table_presets = AIM_PRESETS
    description = (
        "AIM (adaptive iterative mechanism): rounds of exponential-mechanism selection of "
        "badly fitted marginals, Gaussian measurement and graphical-model estimation; tables only"
    )

    def validate_config(
        self, config: Mapping[str, Any], info: DataInfo, *, rows_in_memory: bool = True
    ) -> None:
        """AIM's own keys, then the shared checks."""
        if int(config["rounds"]) < 0 or int(config["selections"]) < 0:
            raise UsageError("--set rounds and selections must be at least 0 (0: automatic)")
        if float(config["max_model_mb"]) <= 0:
            raise UsageError("--set max_model_mb: must be positive")
        super().validate_config(config, info, rows_in_memory=rows_in_memory)

    def counts(self, domain: TableDomain, facts: PlanFacts) -> tuple[int, int, int]:
        """d one-way measurements (less those the schema release made), then T selections and
        measurements over R rounds."""
        info, target, config, _ = facts.unpacked()
        d = len(domain.attributes)
        selections = selection_count(domain, info, config, target)
        rounds = min(round_count(d, config), selections) if selections else 0
        ones = d - len(released_one_ways(domain, info, config))
        return ones + selections, selections, 1 + rounds

    def estimated_train_seconds(self, info: DataInfo, epsilon: float) -> float | None:
        """The public estimate of `cost.py` for the recommended preset (tables only)."""
        if info.modality != "table":
            return None
        config = self.config(self.recommended_preset(info, epsilon), {}, info)
        domain = table_domain(info, config)
        # δ only moves the selection count: the default δ stands in for the run's.
        target = PrivacyTarget(epsilon, default_delta(info.n))
        _, selections, steps = self.counts(domain, PlanFacts(info, target, config))
        return aim_seconds(
            domain.sizes,
            info.n,
            len(pairs_within(domain, int(config["max_cells"]))),
            selections,
            steps - 1,
            float(config["max_model_mb"]) * 2**20 / 8,
            int(config["iters"]),
            int(config["final_iters"]),
        )


def round_count(d: int, config: Mapping[str, Any]) -> int:
    """The preset's `rounds`, or for 0 a public rule: each round re-fits the whole model and
    scores every candidate pair (about d² of them) against it, so wide tables get fewer."""
    chosen = int(config["rounds"])
    if chosen:
        return chosen
    return int(min(max(round(_ROUND_BUDGET / max(d, 1)), _MIN_ROUNDS), _MAX_ROUNDS))


def selection_count(
    domain: TableDomain, info: DataInfo, config: Mapping[str, Any], target: PrivacyTarget
) -> int:
    """The preset's `selections`, or the public rule when it is 0."""
    chosen = int(config["selections"])
    if chosen:
        return chosen
    return auto_selections(
        domain,
        info.n,
        target.epsilon,
        target.delta,
        float(config["selection_share"]),
        int(config["max_cells"]),
    )


class AIMTrainer(MarginalTrainer):
    """AIM's rounds: one-way marginals first, then batches of selected pairs."""

    def setup(self, randomness: PrivateRandomness) -> None:
        """The shared setup, then the candidate pairs and the selections of each round."""
        super().setup(randomness)
        self.pairs = pairs_within(self.domain, int(self.config["max_cells"]))
        target = PrivacyTarget(self.plan.target_epsilon, self.plan.delta)
        selections = selection_count(self.domain, self.info, self.config, target)
        rounds = self.plan.steps - 1
        # The selections spread evenly over the rounds (a public, fixed split).
        self.per_round = [
            selections // rounds + (1 if r < selections % rounds else 0) for r in range(rounds)
        ]

    def upfront_cliques(self) -> list[tuple[int, ...]]:
        """The one-ways and every candidate pair not measured yet: one pass per run."""
        measured = {m.clique for m in self.measurements}
        return [*super().upfront_cliques(), *(p for p in self.pairs if p not in measured)]

    def run_round(self, step: int) -> None:
        """Round 0 measures every one-way marginal; round r ≥ 1 selects and measures pairs."""
        iters, final = int(self.config["iters"]), int(self.config["final_iters"])
        rounds = len(self.per_round)
        if step == 0:
            self.measure_one_ways()
            self.fit(iters if rounds else final)
            return
        limit_cells = float(self.config["max_model_mb"]) * 2**20 / 8 * step / rounds
        measured = {m.clique for m in self.measurements}
        pool = [p for p in self.pairs if p not in measured]
        estimates = self.tree.pair_marginals(pool)
        # The tree the model will be fitted on, grown as the pairs are chosen: its size with
        # each candidate is exact (public structure only).
        structure = JunctionTree.of(self.sizes, [m.clique for m in self.measurements])
        chosen: list[tuple[int, int]] = []
        for _ in range(self.per_round[step - 1]):
            open_pairs = [p for p in pool if p not in chosen]
            growth = structure.growths(open_pairs)
            base = structure.cells()
            candidates = [p for p in open_pairs if base + growth[p] <= limit_cells]
            if not candidates:
                break  # nothing fits: the unspent selections and measurements cost nothing
            index = self.select(
                candidates,
                [estimates[p] for p in candidates],
                [self.noise_offset(p) for p in candidates],
            )
            chosen.append(candidates[index])
            structure.add(candidates[index])
        if chosen:
            self.measure(chosen)
        self.fit(final if step == rounds else iters)

    def junction(self) -> JunctionTree:
        """The tree the size cap was kept on: the measured cliques added in their order."""
        return JunctionTree.of(self.sizes, [m.clique for m in self.measurements])


AIMMethod.trainer_class = AIMTrainer
