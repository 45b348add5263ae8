"""Noisy marginal counts of a discretised table, and private selection among marginals.

The table reaches this module as integer codes [N, d] over a public domain (column j takes
values 0 … sizes[j] − 1: categories from the schema, numbers in bins over their public
bounds). A marginal on a set of columns (a clique) is the vector of counts of every
combination of their values. Adding or removing one record changes exactly one cell of every
marginal by 1, so each marginal's L2 (and L1) sensitivity is 1 under add/remove adjacency,
and k marginals measured separately are k Gaussian mechanisms of sensitivity 1: the ledger's
`gaussian` event with noise multiplier σ (the noise's standard deviation, since the
sensitivity is 1) and count k.

`MarginalQueries` answers only through mechanisms: `measure` (counts plus N(0, σ²) per cell,
from the run's secret stream) and `select` (the exponential mechanism over the L1 error of
public estimates, `privacy/mechanisms/selection.py`). The exact counts it caches never leave it.

Where the counts come from is a `MarginalCounter` (the marginal oracle): `sizes`,
`record_count` and `counts(cliques)`, the exact counts of several cliques in one pass over
the data. `CodesCounter` is the in-memory one (a bincount over codes [N, d]); the engines of
`dpsynth.data.engines` count a file or a cluster's partitions out of core. `prefetch` asks the
counter for every clique a round will need at once, so a round costs at most one pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from dpsynth.errors import DpsynthError
from dpsynth.privacy.accounting.events import DpEvent, Gaussian
from dpsynth.privacy.mechanisms.selection import exponential_mechanism, selection_event

MEASUREMENT_MECHANISM = "Gaussian marginal counts (L2 sensitivity 1 per marginal, add/remove)"

Clique = tuple[int, ...]


def measurement_event(noise_multiplier: float, count: int, **annotations: Any) -> Gaussian:
    """The event of `count` marginals measured with Gaussian noise of std σ each."""
    return Gaussian(
        float(noise_multiplier),
        int(count),
        annotations={"mechanism": MEASUREMENT_MECHANISM, **annotations},
    )


def schedule_events(
    noise_multiplier: float,
    selection_epsilon: float,
    measurements: int,
    selections: int,
    annotations: Mapping[str, Any] | None = None,
) -> list[DpEvent]:
    """The ledger events of a marginal schedule (`privacy/accounting/marginal_plan.py`): one
    `gaussian` and (if any) one `pure_dp` event. `annotations` (e.g. the loop steps that read
    no Poisson batch) go on the first event."""
    events: list[DpEvent] = [
        measurement_event(noise_multiplier, measurements, **dict(annotations or {}))
    ]
    if selections:
        events.append(selection_event(selection_epsilon, selections))
    return events


def cells(sizes: Sequence[int], clique: Clique) -> int:
    """The number of cells of the marginal on `clique`."""
    return int(math.prod(int(sizes[j]) for j in clique))


def marginal_counts(codes: np.ndarray, sizes: Sequence[int], clique: Clique) -> np.ndarray:
    """Exact counts (float64, C order over the clique's columns) of the codes on `clique`.

    A pure function of the private data: only this module's mechanisms call it before noise.
    """
    if not clique:
        return np.array([float(len(codes))])
    shape = tuple(int(sizes[j]) for j in clique)
    flat = np.ravel_multi_index(tuple(codes[:, j].astype(np.int64) for j in clique), shape)
    return np.bincount(flat, minlength=math.prod(shape)).astype(np.float64)


@runtime_checkable
class MarginalCounter(Protocol):
    """The marginal oracle: exact counts of a private table's marginals (never released as
    they are: only `MarginalQueries` reads them, and only its mechanisms answer)."""

    @property
    def sizes(self) -> tuple[int, ...]:
        """The public domain size of each attribute."""
        ...

    @property
    def record_count(self) -> int:
        """N, the number of records (public in this package's model, as `DataInfo.n`)."""
        ...

    def counts(self, cliques: Sequence[Clique]) -> list[np.ndarray]:
        """Exact counts (float64, C order, as `marginal_counts`) of each clique, in ONE pass."""
        ...


class CodesCounter:
    """The in-memory counter: a bincount per clique over codes [N, d]."""

    def __init__(self, codes: np.ndarray, sizes: Sequence[int]) -> None:
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != len(sizes):
            raise DpsynthError("codes must be [N, d] with one domain size per column")
        if codes.size and (codes.min() < 0 or (codes >= np.asarray(sizes)).any()):
            raise DpsynthError("a code lies outside its column's public domain")
        self._codes = codes
        self.sizes = tuple(int(s) for s in sizes)
        self.record_count = len(codes)

    def counts(self, cliques: Sequence[Clique]) -> list[np.ndarray]:
        """Each clique's exact counts (the codes are in memory: a pass costs one bincount)."""
        return [marginal_counts(self._codes, self.sizes, tuple(c)) for c in cliques]


class MarginalQueries:
    """A discretised private table that answers marginal queries only through mechanisms.

    `source` is a `MarginalCounter`, or codes [N, d] with their `sizes` (a `CodesCounter`).
    `sensitivity` K > 1: the guarantee is per privacy unit of at most K rows (bounded before
    this read), so one unit moves a marginal by at most K (L1 and L2: its rows may share a
    cell); the measurements' noise std is K·σ, and a selection's quality sensitivity is K
    times its weight. The plan's events stay those of sensitivity 1 at σ.
    """

    def __init__(
        self,
        source: np.ndarray | MarginalCounter,
        sizes: Sequence[int] | None = None,
        sensitivity: int = 1,
    ):
        if not (isinstance(sensitivity, int) and sensitivity >= 1):
            raise DpsynthError(
                f"the rows a unit holds must be a whole number ≥ 1, got {sensitivity}"
            )
        self.sensitivity = sensitivity
        if isinstance(source, MarginalCounter):
            counter: MarginalCounter = source
            if sizes is not None and tuple(int(s) for s in sizes) != tuple(counter.sizes):
                raise DpsynthError("the counter's domain differs from the sizes given")
        else:
            if sizes is None:
                raise DpsynthError("codes need their domain sizes")
            counter = CodesCounter(source, sizes)
        self._counter = counter
        self.sizes = tuple(int(s) for s in counter.sizes)
        self._cache: dict[Clique, np.ndarray] = {}
        self.passes = 0  # the passes over the data so far (one per `prefetch` that counted)

    def prefetch(self, cliques: Sequence[Clique]) -> None:
        """Count every clique not yet cached in one pass over the data (none when all are)."""
        wanted: list[Clique] = []
        for clique in cliques:
            key = tuple(int(j) for j in clique)
            if key not in self._cache and key not in wanted:
                wanted.append(key)
        if not wanted:
            return
        values = self._counter.counts(wanted)
        if len(values) != len(wanted):
            raise DpsynthError("the marginal counter answered the wrong number of cliques")
        for clique, counts in zip(wanted, values, strict=True):
            counts = np.asarray(counts, dtype=np.float64).reshape(-1)
            if counts.size != cells(self.sizes, clique):
                raise DpsynthError(f"the marginal counter's counts of {clique} have the wrong size")
            self._cache[clique] = counts
        self.passes += 1

    def _counts(self, clique: Clique) -> np.ndarray:
        clique = tuple(int(j) for j in clique)
        if clique not in self._cache:
            self.prefetch([clique])
        return self._cache[clique]

    def measure(
        self, cliques: Sequence[Clique], noise_multiplier: float, generator: torch.Generator
    ) -> list[np.ndarray]:
        """Each clique's counts plus N(0, (Kσ)²) per cell (σ = `noise_multiplier`, K the
        `sensitivity`): `len(cliques)` Gaussian mechanisms, which the plan must have accounted.

        σ = 0 returns the exact counts: only the `--epsilon inf` baseline (a `non_private`
        plan) asks for that.
        """
        if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
            raise DpsynthError(f"a measurement needs a σ ≥ 0, got {noise_multiplier}")
        self.prefetch(cliques)
        out = []
        for clique in cliques:
            counts = self._counts(clique)
            if noise_multiplier == 0:
                out.append(counts.copy())
                continue
            noise = torch.randn(
                counts.size, generator=generator, dtype=torch.float64, device=generator.device
            )
            out.append(counts + (noise_multiplier * self.sensitivity) * noise.cpu().numpy())
        return out

    def select(
        self,
        candidates: Sequence[Clique],
        estimates: Sequence[np.ndarray],
        offsets: Sequence[float],
        weights: Sequence[float],
        epsilon: float,
        generator: torch.Generator,
    ) -> int:
        """The index of the candidate chosen by the exponential mechanism (ε-DP).

        Candidate r's quality is w_r · (‖counts_r − estimates_r‖₁ − offsets_r): how badly the
        public estimate (the current model's marginal) misses the data, less a public offset
        (the error expected from measurement noise alone). Adding or removing a record moves
        one cell of counts_r by 1, so the L1 term moves by at most 1 and the quality by at
        most |w_r|: the sensitivity is max |w_r|.
        """
        if not (len(candidates) == len(estimates) == len(offsets) == len(weights)):
            raise DpsynthError("one estimate, offset and weight per candidate")
        self.prefetch(candidates)
        scores = np.empty(len(candidates))
        for r, (clique, estimate) in enumerate(zip(candidates, estimates, strict=True)):
            counts = self._counts(clique)
            estimate = np.asarray(estimate, dtype=np.float64).reshape(-1)
            if estimate.shape != counts.shape:
                raise DpsynthError(f"the estimate of clique {clique} has the wrong size")
            scores[r] = float(weights[r]) * (np.abs(counts - estimate).sum() - float(offsets[r]))
        sensitivity = self.sensitivity * float(
            np.max(np.abs(np.asarray(weights, dtype=np.float64)))
        )
        return exponential_mechanism(scores, sensitivity, epsilon, generator)
