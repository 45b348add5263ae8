"""What AIM and MST share: the table-only `Method`, its plan, and the round-based `Trainer`.

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
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import DpsynthError, UsageError
from dpsynth.methods.base import Method, PrivacyPlan, PrivacyTarget, Trainer
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import TableDomain, codes_from_rows, table_domain
from dpsynth.methods.marginal.junction import JunctionTree
from dpsynth.methods.marginal.model import Measurement, Potentials, estimate
from dpsynth.methods.marginal.sampler import MarginalGenerator
from dpsynth.methods.marginal.state import pack_cliques, unpack_cliques
from dpsynth.privacy.accounting.events import NonPrivate
from dpsynth.privacy.accounting.marginal_plan import (
    calibrate_marginal_schedule,
    gdp_mu,
    schedule_events,
)
from dpsynth.privacy.accounting.plan_check import IDLE_STEPS_KEY
from dpsynth.privacy.mechanisms.marginal_measure import MarginalCounter, MarginalQueries
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

MEASURE_PHASE = "marginal-measurements"
# A measurement whose noise std is above this share of N carries no information: refused.
_MAX_SIGMA_SHARE = 0.5


def pairs_within(domain: TableDomain, max_cells: int) -> list[tuple[int, int]]:
    """Every pair of attributes whose marginal has at most `max_cells` cells."""
    d = len(domain.attributes)
    return [(a, b) for a in range(d) for b in range(a + 1, d) if domain.cells((a, b)) <= max_cells]


class MarginalMethod(Method):
    """A table-only backend that measures noisy marginals and fits a graphical model."""

    modalities = ("table",)
    audit_mechanism: ClassVar[str] = "marginal"
    trainer_class: ClassVar[type[MarginalTrainer]]

    def recommended_preset(self, info: DataInfo, epsilon: float) -> str:
        """`small`: its round count and bins already follow N, the columns and ε."""
        return "small"

    def validate_config(self, config: Mapping[str, Any], info: DataInfo) -> None:
        """Ranges of the keys, then the memory estimate of the domain (UsageError, exit 2)."""
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
        need = self.memory_mb(domain, config, info.n)
        cap = float(config["max_memory_mb"])
        if need > cap:
            raise UsageError(
                f"--method {self.name}: the discrete domain is too large for its marginals "
                f"(about {need:,.0f} MB needed, cap {cap:,.0f} MB: --set max_memory_mb); use "
                "fewer numeric bins (--set bins) or smaller marginals (--set max_cells)"
            )

    def memory_mb(self, domain: TableDomain, config: Mapping[str, Any], n: int) -> float:
        """The memory the run's marginals need, from the public domain: the exact counts of
        every candidate marginal (kept while training), their model estimates, the codes
        and the model itself."""
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

    @abstractmethod
    def counts(self, domain: TableDomain, info: DataInfo, config: Mapping[str, Any],
               target: PrivacyTarget) -> tuple[int, int, int]:  # fmt: skip
        """(measurements, selections, loop steps) of the schedule, from public facts."""

    def plan(
        self,
        info: DataInfo,
        target: PrivacyTarget,
        config: Mapping[str, Any],
        prior_events: tuple[dict[str, Any], ...] = (),
    ) -> PrivacyPlan:
        """The fixed schedule calibrated under PRV (see the module docstring)."""
        domain = table_domain(info, config)
        measurements, selections, steps = self.counts(domain, info, config, target)
        annotations = {IDLE_STEPS_KEY: steps, "phase": MEASURE_PHASE}
        common = {
            "target_epsilon": float(target.epsilon),
            "delta": target.delta,
            "sampling_rate": 1.0,
            "steps": steps,
            "max_grad_norm": 1.0,  # each marginal's L2 sensitivity
            "expected_batch_size": float(info.n),
        }
        if not target.private:
            event = NonPrivate(annotations={"sampling_rate": 1.0, "steps": steps, **annotations})
            return PrivacyPlan(
                private=False,
                noise_multiplier=0.0,
                events=(event,),
                epsilon_bound=math.inf,
                total_epsilon_bound=math.inf,
                accountant="none (not private)",
                notes=("NOT PRIVATE: exact marginals (--epsilon inf)",),
                **{**common, "target_epsilon": math.inf},
            )
        # Refused before the accountant is asked: even with the whole ε as Gaussian DP, the
        # noise would drown every count.
        rough = math.sqrt(measurements) / gdp_mu(target.epsilon, target.delta)
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
        if sigma > _MAX_SIGMA_SHARE * info.n:
            raise UsageError(self._too_small(target, info, measurements, sigma))
        events = schedule_events(
            sigma, schedule.selection_epsilon, measurements, selections, annotations
        )
        return PrivacyPlan(
            private=True,
            noise_multiplier=sigma,
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

    def trainer(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        device: torch.device,
        seed: int,
        randomness: PrivateRandomness | None = None,
    ) -> Trainer:
        """A trainer whose noise and selections draw from the run's secret streams."""
        return self.trainer_class(info, config, plan, randomness or PrivateRandomness.fresh())

    def generator_from_state(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
    ) -> MarginalGenerator:
        """The sampler of the saved clique tree (uniform when nothing was fitted yet)."""
        domain = table_domain(info, config)
        cliques, tables = unpack_cliques("model", tensors)
        tree = (
            CliqueTree(domain.sizes, cliques, tables)
            if cliques
            else CliqueTree.independent(domain.sizes, float(info.n))
        )
        return MarginalGenerator(info.classes, domain, tree)


class MarginalTrainer(Trainer):
    """Rounds of selections and measurements on the whole table, and mbi fits."""

    released_stats = ("measurements", "selections", "passes")

    def __init__(
        self,
        info: DataInfo,
        config: Mapping[str, Any],
        plan: PrivacyPlan,
        randomness: PrivateRandomness,
    ) -> None:
        self.info, self.config, self.plan = info, config, plan
        self.domain = table_domain(info, config)
        self.sizes = self.domain.sizes
        self.n = float(info.n)
        measure = next((e for e in plan.events if e.get("phase") == MEASURE_PHASE), None)
        if measure is None:
            raise DpsynthError("the plan has no marginal-measurement event")
        select = next((e for e in plan.events if e.get("type") == "pure_dp"), None)
        if plan.private:
            self.sigma = float(measure["noise_multiplier"])
            self.allowed_measurements = int(measure["count"])
            self.select_epsilon = float(select["epsilon"]) if select else 0.0
            self.allowed_selections = int(select["count"]) if select else 0
        else:
            self.sigma, self.select_epsilon = 0.0, math.inf
            self.allowed_measurements = self.allowed_selections = 10**9
        self.measure_rng = randomness.generator("marginal/measure")
        self.select_rng = randomness.generator("marginal/select")
        self.measurements: list[Measurement] = []
        self.selections = 0
        self.rounds_done = 0
        self.tree = CliqueTree.independent(self.sizes, self.n)
        self.potentials: Potentials | None = None
        self.queries: MarginalQueries | None = None
        self.counter: MarginalCounter | None = None

    def attach_counter(self, counter: MarginalCounter) -> None:
        """Count through this marginal oracle (an engine's, over the table out of core)
        instead of the rows the loop hands over; its domain must be this run's."""
        if tuple(counter.sizes) != self.sizes:
            raise DpsynthError("the marginal counter's domain differs from this run's")
        self.counter = counter

    def upfront_cliques(self) -> list[tuple[int, ...]]:
        """Every clique the run may count, counted in the first round's one pass (within the
        memory `MarginalMethod.memory_mb` plans for): the one-way marginals by default."""
        return [(a,) for a in range(len(self.sizes))]

    @property
    def passes(self) -> int:
        """Passes over the data the counting took so far (public: the schedule fixes it)."""
        return self.queries.passes if self.queries is not None else 0

    # ----------------------------------------------------------------- the loop's hooks

    def reads_batch(self, step: int) -> bool:
        """Never: every round reads the whole table through `release_whole_data`."""
        return False

    def release_whole_data(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        """Round `step`: its selections and measurements, then the model's re-fit."""
        if step < self.rounds_done:
            return  # already made (its state was restored)
        if self.queries is None:
            if self.counter is not None:
                self.queries = MarginalQueries(self.counter)
            else:
                self.queries = MarginalQueries(codes_from_rows(x, y, self.domain), self.sizes)
            # one pass for every marginal the run may need (its exact counts stay in privacy/)
            self.queries.prefetch(self.upfront_cliques())
        self.run_round(step)
        self.rounds_done = step + 1

    def step(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """Nothing left to do in the step itself: report the public counts."""
        return {
            "measurements": float(len(self.measurements)),
            "selections": float(self.selections),
            "passes": float(self.passes),
        }

    @abstractmethod
    def run_round(self, step: int) -> None:
        """The mechanism's round `step` (selections, measurements, fit)."""

    # ------------------------------------------------------------------ mechanisms

    def measure(self, cliques: Sequence[tuple[int, ...]]) -> None:
        """Measure these marginals (Gaussian, the plan's σ) and keep them."""
        assert self.queries is not None
        if len(self.measurements) + len(cliques) > self.allowed_measurements:
            raise DpsynthError("more marginal measurements than the plan accounts for")
        values = self.queries.measure(cliques, self.sigma, self.measure_rng)
        sigma = self.sigma if self.sigma > 0 else 1.0  # equal weights without noise
        for clique, value in zip(cliques, values, strict=True):
            self.measurements.append(Measurement(tuple(clique), value, sigma))

    def select(
        self,
        candidates: Sequence[tuple[int, ...]],
        estimates: Sequence[np.ndarray],
        offsets: Sequence[float],
    ) -> int:
        """One exponential-mechanism selection among `candidates` (the plan's ε_s)."""
        assert self.queries is not None
        if self.selections + 1 > self.allowed_selections:
            raise DpsynthError("more selections than the plan accounts for")
        self.selections += 1
        weights = [1.0] * len(candidates)
        return self.queries.select(
            candidates, estimates, offsets, weights, self.select_epsilon, self.select_rng
        )

    def fit(self, iters: int) -> None:
        """Re-fit the model to every measurement so far (warm start from the last fit)."""
        self.tree, self.potentials = estimate(
            self.sizes, self.measurements, self.n, iters, self.potentials, self.junction()
        )

    def junction(self) -> JunctionTree | None:
        """The junction tree to fit on; None: the triangulation of the measured cliques."""
        return None

    def noise_offset(self, clique: tuple[int, ...]) -> float:
        """The L1 error that measurement noise alone would leave: √(2/π)·σ·cells."""
        return math.sqrt(2.0 / math.pi) * self.sigma * self.domain.cells(clique)

    # ------------------------------------------------------------------ state

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Measurements, the fitted clique tree and potentials, and the counters (public)."""
        tensors = {
            "counters": torch.tensor([self.rounds_done, self.selections], dtype=torch.int64),
            "sizes": torch.tensor(self.sizes, dtype=torch.int64),
            "sigmas": torch.tensor([m.sigma for m in self.measurements], dtype=torch.float64),
        }
        tensors.update(
            pack_cliques(
                "measurements",
                [m.clique for m in self.measurements],
                [m.values for m in self.measurements],
            )
        )
        tensors.update(
            pack_cliques("model", self.tree.cliques, [f.values for f in self.tree.factors])
        )
        if self.potentials is not None:
            tensors.update(
                pack_cliques("potentials", self.potentials.cliques, self.potentials.tables)
            )
        return tensors

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` returned."""
        if tuple(int(s) for s in tensors["sizes"].tolist()) != self.sizes:
            raise DpsynthError("the checkpoint's domain differs from this run's")
        self.rounds_done, self.selections = (int(v) for v in tensors["counters"].tolist())
        cliques, values = unpack_cliques("measurements", tensors)
        sigmas = tensors["sigmas"].tolist()
        self.measurements = [
            Measurement(c, v, float(s)) for c, v, s in zip(cliques, values, sigmas, strict=True)
        ]
        cliques, tables = unpack_cliques("model", tensors)
        if cliques:
            self.tree = CliqueTree(self.sizes, cliques, tables)
        cliques, tables = unpack_cliques("potentials", tensors)
        if cliques:
            shaped = [
                t.reshape([self.sizes[a] for a in c]) for c, t in zip(cliques, tables, strict=True)
            ]
            self.potentials = Potentials(tuple(cliques), tuple(shaped))

    def generator(self) -> MarginalGenerator:
        """The sampler of the current model."""
        return MarginalGenerator(self.info.classes, self.domain, self.tree)
