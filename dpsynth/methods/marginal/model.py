"""Estimation of the graphical model from noisy marginals (Private-PGM's, in numpy).

The model is a Markov random field whose marginals best match the noisy measurements
(weighted least squares over the marginal polytope; McKenna, Sheldon & Miklau 2019, the
estimator of `mbi`, private-pgm). This module folds our measurements into per-clique targets,
fits the potentials on a junction tree that holds every measured clique (`junction.py`; the
caller's, or one grown from the measured cliques in order) with `estimator.fit` (warm started
from the previous round's potentials), and returns the calibrated marginals of the tree's
nodes as a `CliqueTree` of numpy arrays, which is all that selection, the run's state and
sampling need. Everything here is post-processing of the noisy measurements: no private data
reaches it.

Until 2026-11-28 this called `mbi.estimation.MirrorDescent` (JAX): every fit compiled XLA
programs (121 of them for census's 41 one-way marginals alone, 5–70 s per fit on the shared
2-core CPU, most of a round), and plain mirror descent needed thousands of steps where the
scaled steps of `estimator.py` need a few hundred
(bench/results/2026-11-23-tuning-logs/tuning-tables.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.estimator import Targets, TreeOracle, fit
from dpsynth.methods.marginal.junction import JunctionTree

Clique = tuple[int, ...]


@dataclass(frozen=True)
class Measurement:
    """A noisy marginal: the clique (sorted attribute indices), counts + noise, and σ (a
    number, or one per cell when the cells' noise differs)."""

    clique: Clique
    values: np.ndarray
    sigma: float | np.ndarray


@dataclass(frozen=True)
class Potentials:
    """The log-potentials of a fitted model (for warm starts), as plain arrays."""

    cliques: tuple[Clique, ...]
    tables: tuple[np.ndarray, ...]


def estimate(
    sizes: Sequence[int],
    measurements: Sequence[Measurement],
    total: float,
    iters: int,
    warm_start: Potentials | None = None,
    junction: JunctionTree | None = None,
) -> tuple[CliqueTree, Potentials]:
    """Fit the model to the measurements (at most `iters` steps) and return its junction-tree
    marginals (summing to `total`, the public record count) and potentials.

    `junction`: the tree to pass messages on (it must hold every measured clique); without
    one, the triangulation of the measured cliques (`JunctionTree.triangulated`)."""
    cliques = list(dict.fromkeys(tuple(int(a) for a in m.clique) for m in measurements))
    if junction is None:
        junction = JunctionTree.triangulated(sizes, cliques)
    oracle = TreeOracle(sizes, junction.cliques, junction.edges, cliques)
    targets = Targets.of(cliques, [(m.clique, m.values, m.sigma) for m in measurements])
    fitted = fit(oracle, targets, _start(sizes, cliques, warm_start), float(total), int(iters))
    nodes, tables = list(oracle.nodes), list(fitted.marginals)
    # Attributes in no clique (none once every one-way marginal is measured) stay uniform.
    covered = {a for c in nodes for a in c}
    for a in range(len(sizes)):
        if a not in covered:
            nodes.append((a,))
            tables.append(np.full(int(sizes[a]), float(total) / int(sizes[a])))
    potentials = Potentials(tuple(cliques), tuple(fitted.potentials))
    return CliqueTree(sizes, nodes, tables), potentials


def _start(
    sizes: Sequence[int], cliques: Sequence[Clique], warm_start: Potentials | None
) -> list[np.ndarray]:
    """The starting log-potentials on `cliques`: zeros, plus each warm-start table added to
    the first clique that holds it (the same distribution; zeros when one is held by none)."""
    tables = [np.zeros([int(sizes[a]) for a in c]) for c in cliques]
    if warm_start is None:
        return tables
    for old, table in zip(warm_start.cliques, warm_start.tables, strict=True):
        home = next((i for i, c in enumerate(cliques) if set(old) <= set(c)), None)
        if home is None:  # a checkpoint of another model: start afresh
            return [np.zeros([int(sizes[a]) for a in c]) for c in cliques]
        old_shape = [int(sizes[a]) for a in sorted(old)]
        shape = [int(sizes[a]) if a in old else 1 for a in cliques[home]]
        tables[home] = tables[home] + np.asarray(table, dtype=np.float64).reshape(
            old_shape
        ).reshape(shape)
    return tables
