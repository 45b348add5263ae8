"""What AIM and MST share: the table-only `Method` and its plan (the round-based trainer is
`trainer.py`, the sampler `generator.py`).

A marginal-based synthesizer reads the whole table in rounds, not Poisson batches: each loop
step is one round (`reads_batch` is false; `release_whole_data` makes the round's
measurements and selections through `dpsynth.privacy.mechanisms.marginal_measure` and re-fits the
model with mbi). The plan is a fixed schedule from public facts
(`privacy/accounting/marginal_plan.py`): m Gaussian measurements at one σ and k
exponential-mechanism selections at one ε_s, recorded as a `gaussian` and a `pure_dp` event; the
first declares the loop's steps as reading no Poisson batch (`loop_steps_without_reads`). The
trainer takes σ and ε_s from those events and refuses to measure or select more than they account
for.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import Method, PlanFacts, PrivacyPlan, PrivacyTarget
from dpsynth.methods.marginal.domain import TableDomain, table_domain
from dpsynth.methods.marginal.generator import MarginalGenerator
from dpsynth.methods.marginal.trainer import MEASURE_PHASE, MarginalTrainer
from dpsynth.privacy.accounting.events import NonPrivate
from dpsynth.privacy.accounting.marginal_plan import calibrate_marginal_schedule, gdp_mu
from dpsynth.privacy.accounting.plan_check import IDLE_STEPS_KEY
from dpsynth.privacy.mechanisms.marginal_measure import schedule_events

# A measurement whose noise std is above this share of N carries no information: refused.
_MAX_SIGMA_SHARE = 0.5


def pairs_within(domain: TableDomain, max_cells: int) -> list[tuple[int, int]]:
    """Every pair of attributes whose marginal has at most `max_cells` cells."""
    d = len(domain.attributes)
    return [(a, b) for a in range(d) for b in range(a + 1, d) if domain.cells((a, b)) <= max_cells]


class MarginalMethod(Method):
    """A table-only backend that measures noisy marginals and fits a graphical model."""

    reuses_one_ways = True
    draws_end_tails = True

    modalities = ("table",)
    audit_mechanism: ClassVar[str] = "marginal"
    # every read is a marginal count or a selection, whose sensitivity scales by a unit's K rows
    supports_privacy_unit: ClassVar[bool] = True
    trainer_class: ClassVar[type[MarginalTrainer]]
    generator_class = MarginalGenerator

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small`: its round count and bins already follow N, the columns and ε."""
        return "small"

    def validate_config(
        self, config: Mapping[str, Any], info: DataInfo, *, rows_in_memory: bool = True
    ) -> None:
        """Ranges of the keys, then the memory estimate of the domain (UsageError, exit 2);
        `rows_in_memory` false when an engine counts the rows (`--engine`), which this
        process then never holds."""
        super().validate_config(config, info)
        for key in ("bins", "max_cells", "iters", "final_iters"):
            if int(config[key]) < (2 if key == "bins" else 1):
                raise UsageError(f"--set {key}: must be at least {2 if key == 'bins' else 1}")
        share = float(config["selection_share"])
        if not 0.0 < share < 1.0:
            raise UsageError(f"--set selection_share: must be in (0, 1), got {share}")
        if info.modality != "table":
            return  # the training loop refuses images before this matters
        domain = table_domain(info, config)
        need = self.memory_mb(domain, config, info.n if rows_in_memory else 0)
        cap = float(config["max_memory_mb"])
        if need > cap:
            raise UsageError(
                f"--method {self.name}: the discrete domain is too large for its marginals "
                f"(about {need:,.0f} MB needed, cap {cap:,.0f} MB: --set max_memory_mb); use "
                "fewer numeric bins (--set bins) or smaller marginals (--set max_cells)"
            )

    def memory_mb(self, domain: TableDomain, config: Mapping[str, Any], n: int) -> float:
        """The memory the run's marginals need, from the public domain: the exact counts of
        every candidate marginal (kept while training), their model estimates, the codes of
        the `n` rows held in memory (0 when an engine counts them) and the model itself."""
        candidates = self.candidate_cliques(domain, config)
        cells = sum(domain.cells(p) for p in candidates) + sum(domain.sizes)
        model = float(config.get("max_model_mb", 0.0))
        codes = n * len(domain.attributes) * 4
        return 3 * cells * 8 / 2**20 + codes / 2**20 + 4 * model

    def candidate_cliques(
        self, domain: TableDomain, config: Mapping[str, Any]
    ) -> list[tuple[int, ...]]:
        """The cliques whose exact counts a run may compute (every pair within the cap)."""
        return list(pairs_within(domain, int(config["max_cells"])))

    def first_cliques(
        self, domain: TableDomain, config: Mapping[str, Any]
    ) -> list[tuple[int, ...]]:
        """The cliques a new run's trainer asks to count first (its one pass: the one-ways and
        every candidate), from public facts: an out-of-core engine's check pass counts them
        too (`training.table_source`)."""
        ones: list[tuple[int, ...]] = [(a,) for a in range(len(domain.attributes))]
        return [*ones, *self.candidate_cliques(domain, config)]

    @abstractmethod
    def counts(self, domain: TableDomain, facts: PlanFacts) -> tuple[int, int, int]:
        """(measurements, selections, loop steps) of the schedule, from public facts."""

    def plan_from(self, facts: PlanFacts) -> PrivacyPlan:
        """The fixed schedule calibrated under PRV (see the module docstring)."""
        info, target, config, prior_events = facts.unpacked()
        domain = table_domain(info, config)
        measurements, selections, steps = self.counts(domain, facts)
        annotations = {IDLE_STEPS_KEY: steps, "phase": MEASURE_PHASE}
        common = {
            "target_epsilon": float(target.epsilon),
            "delta": target.delta,
            "sampling_rate": 1.0,
            "steps": steps,
            "expected_batch_size": float(info.n),
        }
        if not target.private:
            event = NonPrivate(annotations={"sampling_rate": 1.0, "steps": steps, **annotations})
            return PrivacyPlan(
                private=False,
                gaussian_sum=None,
                events=(event,),
                epsilon_bound=math.inf,
                total_epsilon_bound=math.inf,
                accountant="none (not private)",
                notes=("NOT PRIVATE: exact marginals (--epsilon inf)",),
                **{**common, "target_epsilon": math.inf},
            )
        # Refused before the accountant is asked: even with the whole ε as Gaussian DP, the
        # noise would drown every count.
        # a privacy unit of K rows multiplies the noise's std by K
        rough = info.rows_per_unit * math.sqrt(measurements) / gdp_mu(target.epsilon, target.delta)
        if rough > _MAX_SIGMA_SHARE * info.n:
            raise UsageError(self._too_small(target, info, measurements, rough))
        schedule = calibrate_marginal_schedule(
            target.epsilon,
            target.delta,
            measurements,
            selections,
            float(config["selection_share"]),
            prior_events,
        )
        sigma = schedule.noise_multiplier
        if sigma * info.rows_per_unit > _MAX_SIGMA_SHARE * info.n:
            raise UsageError(
                self._too_small(target, info, measurements, sigma * info.rows_per_unit)
            )
        events = schedule_events(
            sigma, schedule.selection_epsilon, measurements, selections, annotations
        )
        return PrivacyPlan(
            private=True,
            gaussian_sum=None,  # the noise is in the marginal and selection events
            events=tuple(events),
            epsilon_bound=schedule.epsilon,
            total_epsilon_bound=schedule.total_epsilon,
            accountant=schedule.accountant,
            notes=(
                f"{measurements} Gaussian marginal measurements at σ = {sigma:.4g} and "
                f"{selections} exponential-mechanism selections at ε = "
                f"{schedule.selection_epsilon:.4g} each, over {steps} rounds (PRV)",
                *schedule.notes,
            ),
            **common,
        )

    def _too_small(
        self, target: PrivacyTarget, info: DataInfo, measurements: int, sigma: float
    ) -> str:
        return (
            f"--epsilon {target.epsilon:g} is too small for --method {self.name} on {info.n} "
            f"records: each of its {measurements} marginals would get noise of std "
            f"{sigma:.3g} or more, above N/2 (nothing could be learned); raise ε"
        )
