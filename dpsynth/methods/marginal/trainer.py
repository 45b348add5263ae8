"""What AIM's and MST's trainers share: rounds of measurements and selections on the whole
table (never Poisson batches), with σ and ε_s taken from the plan's events, and mbi fits.

Each loop step is one round (`reads_batch` is false; `release_whole_data` makes the round's
measurements and selections through `dpsynth.privacy.mechanisms.marginal_measure` and
re-fits the model). The trainer refuses to measure or select more than the plan accounts for.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dpsynth.errors import DpsynthError
from dpsynth.methods.base import Trainer
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import codes_from_rows, table_domain
from dpsynth.methods.marginal.generator import MarginalGenerator
from dpsynth.methods.marginal.junction import JunctionTree
from dpsynth.methods.marginal.model import Measurement, Potentials, estimate
from dpsynth.methods.marginal.one_ways import released_one_ways
from dpsynth.methods.marginal.state import pack_cliques, unpack_cliques
from dpsynth.privacy.accounting.events import PureDp
from dpsynth.privacy.mechanisms.marginal_measure import MarginalCounter, MarginalQueries
from dpsynth.privacy.mechanisms.randomness import PrivateRandomness

# The phase annotation of the plan's measurement event (what the trainer spends per round).
MEASURE_PHASE = "marginal-measurements"


class MarginalTrainer(Trainer):
    """Rounds of selections and measurements on the whole table, and mbi fits."""

    released_stats = ("measurements", "selections", "passes")

    def setup(self, randomness: PrivateRandomness) -> None:
        """The table's public domain, σ and ε_s from the plan's events, the secret streams of
        the measurements and selections, and the model before any round."""
        info, config, plan = self.info, self.config, self.plan
        self.domain = table_domain(info, config)
        self.sizes = self.domain.sizes
        self.n = float(info.n)
        # a privacy unit of K rows: the noise std is K·σ (the plan's events are at σ)
        self.unit_rows = int(info.rows_per_unit)
        measure = next((e for e in plan.events if e.annotation("phase") == MEASURE_PHASE), None)
        if measure is None:
            raise DpsynthError("the plan has no marginal-measurement event")
        select = next((e for e in plan.events if isinstance(e, PureDp)), None)
        if plan.private:
            self.sigma = float(measure.noise_multiplier)  # type: ignore[attr-defined]
            self.allowed_measurements = int(measure.times)  # type: ignore[attr-defined]
            self.select_epsilon = float(select.epsilon) if select else 0.0
            self.allowed_selections = int(select.times) if select else 0
        else:
            self.sigma, self.select_epsilon = 0.0, math.inf
            self.allowed_measurements = self.allowed_selections = 10**9
        self.measure_rng = randomness.generator("marginal/measure")
        self.select_rng = randomness.generator("marginal/select")
        self.measurements: list[Measurement] = []
        # the schema release's 1-way histograms among them (made before, cost nothing here)
        self.released = released_one_ways(self.domain, info, config)
        self.free_measurements = 0
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
                self.queries = MarginalQueries(self.counter, sensitivity=self.unit_rows)
            else:
                self.queries = MarginalQueries(
                    codes_from_rows(x, y, self.domain), self.sizes, sensitivity=self.unit_rows
                )
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
        made = len(self.measurements) - self.free_measurements
        if made + len(cliques) > self.allowed_measurements:
            raise DpsynthError("more marginal measurements than the plan accounts for")
        values = self.queries.measure(cliques, self.sigma, self.measure_rng)
        # the noise's std weighs the measurement (equal weights without noise)
        sigma = self.sigma * self.unit_rows if self.sigma > 0 else 1.0
        for clique, value in zip(cliques, values, strict=True):
            self.measurements.append(Measurement(tuple(clique), value, sigma))

    def measure_one_ways(self) -> None:
        """Every 1-way marginal: the DP schema release's noisy histograms where it made them
        (`one_ways`: post-processing, no spend), measured here otherwise."""
        self.measure([(a,) for a in range(len(self.sizes)) if a not in self.released])
        self.measurements.extend(self.released.values())
        self.free_measurements = len(self.released)

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
        noise_std = self.sigma * self.unit_rows
        return math.sqrt(2.0 / math.pi) * noise_std * self.domain.cells(clique)

    # ------------------------------------------------------------------ state

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Measurements, the fitted clique tree and potentials, and the counters (public)."""
        tensors = {
            "counters": torch.tensor([self.rounds_done, self.selections], dtype=torch.int64),
            "sizes": torch.tensor(self.sizes, dtype=torch.int64),
            "sigmas": torch.tensor(
                [float(np.max(m.sigma)) for m in self.measurements], dtype=torch.float64
            ),
        }
        tensors.update(  # σ per cell (the schema release's 1-way measurements differ by cell)
            pack_cliques(
                "cell_sigmas",
                [m.clique for m in self.measurements],
                [
                    np.broadcast_to(np.asarray(m.sigma), np.shape(m.values))
                    for m in self.measurements
                ],
            )
        )
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
        self.free_measurements = len(self.released) if self.rounds_done else 0
        cliques, values = unpack_cliques("measurements", tensors)
        sigmas: list[float | np.ndarray] = [float(s) for s in tensors["sigmas"].tolist()]
        _, cells = unpack_cliques("cell_sigmas", tensors)
        if cells:  # checkpoints before 2026-12-05 hold one σ per measurement
            sigmas = [c if np.ptp(c) > 0 else float(c[0]) for c in cells]
        self.measurements = [
            Measurement(c, v, s) for c, v, s in zip(cliques, values, sigmas, strict=True)
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
